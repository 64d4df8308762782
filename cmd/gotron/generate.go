package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math"
	"time"

	"github.com/gotron/gotron/infer"
	"github.com/gotron/gotron/internal/checked"
	"github.com/gotron/gotron/tensor"
	"github.com/gotron/gotron/tokenizer"
)

const generateSynopsis = "generate --load DIR --prompt TEXT [--max-new-tokens N --temperature T --top-k K | --top-p P --seed S --bf16 --device cpu|sim --tensor-model-parallel-size N --pipeline-model-parallel-size P --expert-model-parallel-size E]"

func cmdGenerate(ctx context.Context, env *cli, args []string) error {
	fs := newFlags("generate", generateSynopsis)
	load := fs.String("load", "", "checkpoint directory (gotron train --save)")
	prompt := fs.String("prompt", "", "text to continue")
	maxNew := fs.Int("max-new-tokens", 100, "tokens to generate (Megatron's tokens_to_generate)")
	var s infer.Sampling
	fs.Float64Var(&s.Temperature, "temperature", 1.0, "divide logits by this")
	fs.IntVar(&s.TopK, "top-k", 0, "sample from the k most likely tokens (1: greedy)")
	fs.Float64Var(&s.TopP, "top-p", 0, "nucleus sampling mass (excludes --top-k > 1)")
	seed := fs.Int64("seed", 1234, "sampling seed")
	cacheLatents := fs.Bool("cache-mla-latents", false, cacheMLALatentsUsage)
	bf16 := fs.Bool("bf16", false, "decode with bfloat16 weights: every weight rounded to bf16 (to nearest even; exact for bf16 checkpoints), activations and sums in float32 (as gotron serve --bf16)")
	tpSize := fs.Int("tensor-model-parallel-size", 1, "split the model over this many ranks started by gotron launch (or torchrun, srun, mpirun), as training splits it; rank 0 reads the prompt and prints")
	ppSize := fs.Int("pipeline-model-parallel-size", 1, "split the layers evenly into this many pipeline stages, one rank each (times --tensor-model-parallel-size ranks in all); the last stage draws the tokens for all")
	epSize, etpSize := expertParallelFlags(fs)
	device := deviceFlag(fs)
	memFraction := memFractionFlag(fs)
	var tc tokenizer.Config
	addTokenizerFlags(fs, &tc)
	var f8 fp8Flags
	f8.add(fs)
	if err := parseFlags(fs, args, env.stdout, generateSynopsis); err != nil {
		return err
	}
	given := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { given[fl.Name] = true })
	if _, err := f8.decodeConfig(given, math.MaxInt32, 1); err != nil {
		return err // checked again with the checkpoint's layers
	}
	dev, err := parseDevice(*device, *memFraction)
	if err != nil {
		return err
	}
	if *load == "" {
		return fmt.Errorf("--load is required")
	}
	if *prompt == "" {
		return fmt.Errorf("--prompt is required")
	}
	if err := checked.Positive("--max-new-tokens", int64(*maxNew)); err != nil {
		return err
	}
	s.Seed = uint64(*seed)
	sampler, err := infer.NewSampler(s)
	if err != nil {
		return err
	}
	group, closeGroup, err := joinDecodeGroup(ctx, env, decodeLayout{tp: *tpSize, pp: *ppSize, ep: *epSize, etp: *etpSize}, 0, args)
	if err != nil {
		return err
	}
	defer closeGroup()
	m, tokDir, err := loadForDecoding(*load, group) // a gotron checkpoint or a Hugging Face directory
	if err != nil {
		return err
	}
	tok, err := checkpointTokenizer(tc, tokDir, m.Config.VocabSize, *load, env.stderr)
	if err != nil {
		return err
	}
	if *bf16 {
		m.RoundToBF16()
	}
	if err := m.Config.CheckDevice(dev); err != nil {
		return err
	}
	if err := m.Config.CheckDecode(); err != nil {
		return err
	}
	// before the split: the tensor-parallel slices and the pipeline
	// stages share the model's FP8 state
	if err := applyDecodeFP8(m, &f8, given, *bf16, *ppSize, dev, env.getenv); err != nil {
		return err
	}
	dm, err := shardForDecoding(m, group)
	if err != nil {
		return err
	}
	m = dm.m
	if err := applyCacheMLALatents(m, *cacheLatents, *load); err != nil {
		return err
	}
	since := tensor.SimTransfers()
	m.ToDevice(dev)
	ids := tok.Encode(*prompt)
	p := make([]int32, len(ids))
	for i, id := range ids {
		p[i] = int32(id)
	}
	if group != nil {
		// Every rank decodes rank 0's prompt; the ranks then draw the same
		// tokens from the same gathered logits, and rank 0 prints them.
		if p, err = broadcastPrompt(ctx, group.world, p); err != nil {
			return err
		}
		if !group.leader() {
			env.stdout = io.Discard
		}
	}
	fmt.Fprint(env.stdout, *prompt)
	stream := infer.NewTextStream(tok, ids)
	start := time.Now()
	n, last := 0, -1
	emit := func(id int) error {
		n, last = n+1, id
		if id != tok.EOD() {
			_, err := fmt.Fprint(env.stdout, stream.Add(id))
			return err
		}
		return nil
	}
	if dm.stage != nil {
		err = generateOnStages(ctx, group, dm, p, *maxNew, tok.VocabSize(), tok.EOD(), s, emit)
	} else {
		err = infer.Generate(ctx, m, p, *maxNew, tok.VocabSize(), tok.EOD(), sampler, emit)
	}
	fmt.Fprintln(env.stdout)
	if dm.stage != nil && !group.leader() {
		// the tokens reached rank 0's emit alone: no count, no stop reason
		if err == nil {
			fmt.Fprintf(env.stderr, "gotron generate: %s rank %d of %d: followed rank 0, which prints the text\n", group.kind(), group.world.Rank(), group.world.Size())
		}
		return err
	}
	secs := time.Since(start).Seconds()
	fmt.Fprintf(env.stderr, "gotron generate: %d tokens in %.2f s: %.1f tokens/s (the %d-token prompt's prefill included)\n",
		n, secs, float64(n)/max(secs, 1e-9), len(p))
	reportTransfers(env.stderr, "generate", dev, since)
	if err == nil && n < *maxNew && last != tok.EOD() {
		fmt.Fprintf(env.stderr, "gotron generate: stopped after %d of --max-new-tokens %d: the model's context of %d positions (--max-position-embeddings) is full\n",
			n, *maxNew, m.Config.MaxPositionEmbeddings)
	}
	return err
}

// generateOnStages is infer.Generate over pipeline stages: one request
// through the stages' engines in lockstep, with the model's weights (a lone
// sequence then decodes with Generate's arithmetic) and the whole prompt in
// one step. Every rank runs it; the leader's emit sees the tokens. The
// engine holds the last token drawn in its cache too, so where Generate
// stops at a full context one token later, this stops one token earlier.
func generateOnStages(ctx context.Context, g *decodeGroup, dm decodeModel, prompt []int32, maxNew, vocab, stop int, s infer.Sampling, emit func(id int) error) error {
	ec := infer.EngineConfig{Weights: infer.WeightsModel, VocabSize: vocab, MaxNumSeqs: 1, DisablePrefixCaching: true,
		MaxNumBatchedTokens: max(512, len(prompt))}
	eng, err := dm.newEngine(ctx, ec)
	if err != nil {
		return err
	}
	room := eng.MaxTokens() - len(prompt)
	if room < 1 {
		return fmt.Errorf("infer: prompt of %d tokens leaves no room in the model's %d positions", len(prompt), eng.MaxTokens())
	}
	req := infer.Request{Prompt: prompt, MaxTokens: min(maxNew, room), Sampling: s}
	if stop >= 0 {
		req.StopTokens = []int{stop}
	}
	_, err = leadOrFollow(ctx, g, eng, func(eng decodeEngine) error {
		if _, err := eng.Add(req); err != nil {
			return err
		}
		for eng.HasWork() {
			if err := ctx.Err(); err != nil {
				return err
			}
			evs, err := eng.Step()
			if err != nil {
				return err
			}
			for _, ev := range evs {
				if ev.Token >= 0 {
					if err := emit(ev.Token); err != nil {
						return err
					}
				}
			}
		}
		return nil
	})
	return err
}
