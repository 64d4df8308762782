package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"

	"github.com/gotron/gotron/tokenizer"
	"github.com/gotron/gotron/train"
)

const memorySynopsis = "memory [train flags] --world-size N   (Megatron's theoretical memory report; nothing is allocated)"

// memoryHelp lists the flags the report reads; the other gotron train
// flags are accepted (a launch script's flags work unchanged) but not
// listed.
func memoryHelp() helpText {
	read := map[string]bool{}
	for _, n := range []string{"config", "model", "num-layers", "hidden-size", "ffn-hidden-size", "num-attention-heads",
		"kv-channels", "group-query-attention", "num-query-groups", "max-position-embeddings", "position-embedding-type",
		"normalization", "swiglu", "openai-gelu", "disable-bias-linear", "add-qkv-bias", "untie-embeddings-and-output-weights",
		"make-vocab-size-divisible-by", "tensor-model-parallel-size", "pipeline-model-parallel-size", "context-parallel-size",
		"num-layers-per-virtual-pipeline-stage", "num-virtual-stages-per-pipeline-rank",
		"account-for-embedding-in-pipeline-split", "account-for-loss-in-pipeline-split",
		"seq-length", "micro-batch-size", "global-batch-size", "tokenizer-type", "vocab-file", "merge-file", "tokenizer-model",
		"vocab-size", "vocab-extra-ids", "tiktoken-pattern", "tiktoken-num-special-tokens",
		"world-size", "recompute-activations", "recompute-granularity", "sequence-parallel", "use-distributed-optimizer",
		"use-megatron-fsdp", "data-parallel-sharding-strategy", "use-torch-fsdp2"} {
		read[n] = true
	}
	return helpText{synopsis: memorySynopsis, show: func(name string) bool { return read[name] },
		note: "Every other 'gotron train' flag is accepted and does not change the report."}
}

// cmdMemory prints Megatron's theoretical memory report
// (report_theoretical_memory) for the model and layout that gotron train's
// flags describe. It builds no model and reads no data.
func cmdMemory(_ context.Context, env *cli, args []string) error {
	fs, f := newTrainFlags()
	world := fs.Int("world-size", 0, "number of ranks the layout runs on (required)")
	if err := parseFlagsHelp(fs, args, env.stdout, memoryHelp()); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q (flags start with --)", fs.Arg(0))
	}
	if err := checkNumbers(trainNumberRules, flagText(fs)); err != nil {
		return err
	}
	f.finish()
	given := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { given[fl.Name] = true })
	cfg, err := memoryConfig(f, *world, given)
	if err != nil {
		return err
	}
	if f.swiglu && !given["ffn-hidden-size"] && f.preset == "" {
		h := cfg.Model.HiddenSize
		fmt.Fprintf(env.stderr, "gotron memory: --swiglu without --ffn-hidden-size: gotron's model uses 4×hidden = %d; Megatron's would use %d\n",
			4*h, (4*h*2/3)/64*64)
	}
	r, err := train.TheoreticalMemory(cfg)
	if err != nil {
		return errors.New(strings.TrimPrefix(err.Error(), "train: memory: "))
	}
	micro := "microbatches unknown (no --global-batch-size)"
	if cfg.NumMicrobatches > 0 {
		micro = fmt.Sprintf("%d microbatches", cfg.NumMicrobatches)
	}
	fmt.Fprintf(env.stdout, "gotron memory: %d layers, hidden %d, padded vocab %d, seq %d × micro batch %d on %d ranks: TP %d, PP %d, CP %d, DP %d; %s\n",
		cfg.Model.NumLayers, cfg.Model.HiddenSize, cfg.Model.VocabSize, cfg.SeqLength, cfg.MicroBatchSize,
		cfg.WorldSize, cfg.TensorParallel, cfg.PipelineParallel, cfg.ContextParallel, cfg.DataParallel(), micro)
	if _, err = r.WriteTo(env.stdout); err != nil {
		return err
	}
	if cfg.FSDP != train.NoFSDP {
		fmt.Fprintf(env.stdout, "gotron's fully sharded data parallelism (%s) keeps weight and optimizer=%.2f MB per rank (float32 parameters, gradients and Adam moments, sharded over DP %d; Megatron's formula above has no FSDP term)\n",
			cfg.FSDP, r.FSDPWeightAndOptimizerBytes/(1<<20), cfg.DataParallel())
	}
	return nil
}

// memoryConfig turns the parsed flags into the report's input: the model as
// gotron train builds it (preset, flags, padded vocabulary) and the layout.
func memoryConfig(f *trainFlags, world int, given map[string]bool) (train.MemoryConfig, error) {
	var c train.MemoryConfig
	m, err := f.modelConfig(given)
	if err != nil {
		return c, err
	}
	if !given["world-size"] {
		return c, fmt.Errorf("--world-size is required: the number of ranks the layout runs on")
	}
	vocab, err := memoryVocab(&f.data.tok)
	if err != nil {
		return c, err
	}
	if f.divisibleBy <= 0 || f.tpSize <= 0 {
		return c, fmt.Errorf("--make-vocab-size-divisible-by=%d --tensor-model-parallel-size=%d: want positive sizes", f.divisibleBy, f.tpSize)
	}
	m.VocabSize = tokenizer.PaddedVocabSize(vocab, f.divisibleBy*f.tpSize, 1)
	c = train.MemoryConfig{Model: m, SeqLength: f.cfg.SeqLength, MicroBatchSize: f.cfg.MicroBatchSize, WorldSize: world,
		TensorParallel: f.tpSize, PipelineParallel: f.ppSize, ContextParallel: f.cpSize, GlobalBatchSize: f.cfg.GlobalBatchSize,
		ExpertParallel: max(f.moe.ep, 1), ExpertTensorParallel: f.moe.etp}
	c.SequenceParallel, c.DistributedOptimizer = f.cfg.SequenceParallel, f.cfg.DDP.DistributedOptimizer
	fc := train.Config{DDP: f.cfg.DDP}
	if err := f.fsdp.apply(&fc, given, "", true); err != nil { // (the tied-embedding rule of FSDP2 is not the report's)
		return c, err
	}
	if f.fsdp.megatron {
		c.DistributedOptimizer = true // Megatron-FSDP v1 switches it on (arguments.py)
	}
	c.FSDP = fc.FSDP
	c.RecomputeGranularity = f.recomputeGranularity
	if f.cfg.Recompute.Selective { // --recompute-activations, as Megatron's arguments.py
		c.RecomputeGranularity = train.RecomputeSelective
	}
	split := f.cfg.Pipeline // --num-virtual-stages-per-pipeline-rank or --num-layers-per-virtual-pipeline-stage
	split.PP = f.ppSize
	c.AccountForEmbedding, c.AccountForLoss = split.AccountForEmbedding, split.AccountForLoss
	if c.VirtualPipeline, err = split.Chunks(m.NumLayers); err != nil {
		return c, errors.New(strings.TrimPrefix(err.Error(), "gpt: "))
	}
	if err := c.Validate(); err != nil {
		return c, errors.New(strings.TrimPrefix(strings.TrimPrefix(err.Error(), "train: memory: "), "gpt: "))
	}
	return c, nil
}

// memoryVocab is the unpadded vocabulary: the tokenizer's, else
// --vocab-size, else GPT-2's 50257 (as gotron train --mock-data).
func memoryVocab(t *tokenizer.Config) (int, error) {
	switch {
	case t.Type != "":
		tok, err := tokenizer.New(*t)
		if err != nil {
			return 0, err
		}
		return tok.VocabSize(), nil
	case t.VocabSize > 0:
		return t.VocabSize, nil
	case t.VocabSize < 0:
		return 0, fmt.Errorf("--vocab-size=%d: want > 0", t.VocabSize)
	}
	return 50257, nil
}
