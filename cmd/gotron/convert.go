package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/gotron/gotron/ckpt/hf"
	"github.com/gotron/gotron/ckpt/megatron"
	"github.com/gotron/gotron/internal/assets/gpt2"
	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/tokenizer"
	"github.com/gotron/gotron/train"
)

const convertSynopsis = `convert --from hf --load HF_DIR --save DIR   (Hugging Face → gotron)
       gotron convert --from megatron --load MEGATRON_DIR --save DIR   (Megatron-LM, --ckpt-format torch → gotron)
       gotron convert --to hf --load DIR --save HF_DIR     (gotron → Hugging Face)`

// convertFlags are gotron convert's flags.
type convertFlags struct {
	from, to, load, save string
	divisibleBy          int
	seqLength            int
	dtype                string
	maxShardSize         string
	vocabSize            int
	noLoadOptim          bool
}

func newConvertFlags() (*flag.FlagSet, *convertFlags) {
	fs := newFlags("convert", convertSynopsis)
	f := &convertFlags{}
	fs.StringVar(&f.from, "from", "", "source format: hf (import a Hugging Face directory) or megatron (import a Megatron-LM checkpoint saved with --ckpt-format torch)")
	fs.StringVar(&f.to, "to", "", "target format: hf (export a gotron checkpoint)")
	fs.StringVar(&f.load, "load", "", "directory to read: a Hugging Face model (--from hf), Megatron's --save directory or one of its iter_* directories (--from megatron), or a gotron checkpoint (--to hf)")
	fs.StringVar(&f.save, "save", "", "directory to write")
	fs.IntVar(&f.divisibleBy, "make-vocab-size-divisible-by", 128, "--from hf: pad the vocabulary to a multiple of this (zero rows; a Megatron checkpoint keeps its padded vocabulary)")
	fs.IntVar(&f.seqLength, "seq-length", 0, "import: sequence length recorded in the checkpoint (default max_position_embeddings; Megatron: its --seq-length)")
	fs.StringVar(&f.dtype, "dtype", "", "export: float32, bfloat16 or float16 (default the dtype recorded at import, else float32)")
	fs.StringVar(&f.maxShardSize, "max-shard-size", "5GB", "export: largest shard (e.g. 5GB, 500MB, 2GiB, or bytes)")
	fs.IntVar(&f.vocabSize, "vocab-size", 0, "export: vocab_size to write, stripping the padding (default the size recorded at import)")
	fs.BoolVar(&f.noLoadOptim, "no-load-optim", false, "--from megatron: convert the weights alone (a weights-only checkpoint at iteration 0), not the optimizer state, iteration and schedule")
	return fs, f
}

func cmdConvert(ctx context.Context, env *cli, args []string) error {
	fs, f := newConvertFlags()
	if err := parseFlags(fs, args, env.stdout, convertSynopsis); err != nil {
		return err
	}
	switch {
	case f.load == "" || f.save == "":
		return errors.New("--load and --save are required")
	case filepath.Clean(f.load) == filepath.Clean(f.save):
		return fmt.Errorf("--load and --save are the same directory %s", f.load)
	case f.from == "hf" && f.to == "":
		return convertFromHF(ctx, env, f)
	case f.from == "megatron" && f.to == "":
		return convertFromMegatron(ctx, env, f)
	case f.to == "hf" && f.from == "":
		return convertToHF(ctx, env, f)
	case f.from != "" && f.from != "hf" && f.from != "megatron":
		return fmt.Errorf("--from=%q: want hf or megatron", f.from)
	case f.to != "" && f.to != "hf":
		return fmt.Errorf("--to=%q: want hf", f.to)
	}
	return errors.New("set exactly one of --from (hf or megatron) and --to hf")
}

// convertFromMegatron imports a Megatron-LM checkpoint in the legacy torch
// format (every tensor- and pipeline-parallel rank's model_optim_rng.pt),
// with the tokenizer files its args name when they are on this machine.
// With optimizer state gotron can take (non-distributed Adam or SGD), the
// result resumes: Megatron's iteration, the Adam moments (or momentum), the
// fp32 main params as weights, the schedule and sample counts. Otherwise,
// or with --no-load-optim, it is a weights-only checkpoint at iteration 0.
func convertFromMegatron(ctx context.Context, env *cli, f *convertFlags) error {
	var m *gpt.Model
	var st *megatron.OptimizerState
	var info megatron.Info
	var err error
	if f.noLoadOptim {
		m, info, err = megatron.Load(f.load, megatron.Options{})
	} else {
		m, st, info, err = megatron.Import(f.load, megatron.Options{})
		if oe := (*megatron.OptimizerError)(nil); errors.As(err, &oe) {
			err = fmt.Errorf("%w\n(the weights alone convert with --no-load-optim)", err)
		}
	}
	if err != nil {
		return err
	}
	for _, w := range info.Warnings {
		fmt.Fprintf(env.stderr, "warning: %s\n", w)
	}
	warnNonFinite(env.stderr, f.load, m)
	seq, err := convertSeqLength(f.seqLength, info.SeqLength, m.Config)
	if err != nil {
		return err
	}
	iter := fmt.Sprint(info.Iteration)
	if info.Release {
		iter = "release"
	}
	cliArgs := map[string]any{"convert": "--from megatron", "load": f.load, "megatron_iteration": iter,
		"megatron_tensor_model_parallel_size": info.TP, "megatron_pipeline_model_parallel_size": info.PP}
	if info.VP > 1 {
		cliArgs["megatron_virtual_pipeline_model_parallel_size"] = info.VP
	}
	if info.TokenizerType != "" {
		cliArgs["tokenizer_type"] = info.TokenizerType
	}
	if st != nil {
		err = train.SaveMegatronImport(ctx, f.save, int(info.Iteration), m, st, seq, cliArgs)
	} else {
		err = train.SaveModel(ctx, f.save, 0, m, seq, cliArgs)
	}
	if err != nil {
		return err
	}
	layout := fmt.Sprintf("TP=%d PP=%d", info.TP, info.PP)
	if info.VP > 1 {
		layout += fmt.Sprintf(" VP=%d", info.VP)
	}
	weights := info.DType + " weights"
	if st != nil && st.MainParams {
		weights = "fp32 main params as weights"
	}
	fmt.Fprintf(env.stdout, "imported %s (Megatron iteration %s, %s, %s: %d layers, hidden %d, %d parameters, padded vocab %d) into %s\n",
		info.Dir, iter, layout, weights, m.Config.NumLayers, m.Config.HiddenSize, m.NumParams(), m.Config.VocabSize, f.save)
	switch {
	case st != nil:
		fmt.Fprintf(env.stdout, "optimizer: %s; gotron train --load %s resumes at iteration %d (consumed samples %d) with it and the learning-rate schedule (--no-load-optim: fresh optimizer state; --finetune: weights only)\n",
			st.Source, f.save, info.Iteration, st.ConsumedTrainSamples)
	default:
		state := "the checkpoint holds no optimizer state"
		switch {
		case f.noLoadOptim && info.Optimizer:
			state = "--no-load-optim: the optimizer state in the checkpoint is not converted"
		case info.Optimizer:
			state = "the optimizer state in the checkpoint is not converted (see the warning)"
		}
		fmt.Fprintf(env.stdout, "weights only: %s; gotron train --load %s starts at iteration 0 with a fresh optimizer and schedule\n", state, f.save)
	}
	copied, missing, err := megatron.CopyTokenizer(info, filepath.Join(f.save, hf.TokenizerDir))
	if err != nil {
		return err
	}
	switch {
	case len(copied) > 0:
		fmt.Fprintf(env.stdout, "tokenizer files: %s\n", strings.Join(copied, ", "))
	case len(missing) > 0:
		fmt.Fprintf(env.stdout, "tokenizer (%s) not carried: %s not found on this machine; pass --tokenizer-type and its files to generate/score --text\n", info.TokenizerType, strings.Join(missing, ", "))
	}
	return nil
}

// convertFromHF imports a Hugging Face directory as a weights-only gotron
// checkpoint (iteration 0) with hf_import.json and tokenizer/ beside it.
func convertFromHF(ctx context.Context, env *cli, f *convertFlags) error {
	if f.divisibleBy < 1 {
		return fmt.Errorf("--make-vocab-size-divisible-by=%d: want >= 1", f.divisibleBy)
	}
	if !hf.IsHFDir(f.load) {
		return fmt.Errorf("--load %s is not a Hugging Face model directory (want config.json and safetensors, no latest_checkpointed_iteration.txt)", f.load)
	}
	m, info, err := hf.Import(f.load, hf.ImportOptions{MakeVocabSizeDivisibleBy: f.divisibleBy})
	if err != nil {
		return err
	}
	for _, w := range info.Warnings {
		fmt.Fprintf(env.stderr, "warning: %s\n", w)
	}
	warnNonFinite(env.stderr, f.load, m)
	seq, err := convertSeqLength(f.seqLength, m.Config.MaxPositionEmbeddings, m.Config)
	if err != nil {
		return err
	}
	cliArgs := map[string]any{"convert": "--from hf", "load": f.load, "make_vocab_size_divisible_by": f.divisibleBy}
	if err := train.SaveModel(ctx, f.save, 0, m, seq, cliArgs); err != nil {
		return err
	}
	if err := hf.WriteInfo(f.save, info); err != nil {
		return err
	}
	copied, err := hf.CopyTokenizerFiles(f.load, filepath.Join(f.save, hf.TokenizerDir))
	if err != nil {
		return err
	}
	fmt.Fprintf(env.stdout, "imported %s (%s, %s, %d parameters, vocab %d padded to %d) into %s\n",
		f.load, info.Arch, info.DType, m.NumParams(), info.VocabSize, m.Config.VocabSize, f.save)
	if len(copied) > 0 {
		fmt.Fprintf(env.stdout, "tokenizer files: %s\n", strings.Join(copied, ", "))
	}
	return nil
}

// loadAny loads a gotron checkpoint (with its hf_import.json, if any), a
// Hugging Face directory or a Megatron-LM checkpoint (converted in memory),
// and returns where its tokenizer files live.
func loadAny(dir string) (m *gpt.Model, info hf.Info, tokDir string, err error) {
	if hf.IsHFDir(dir) {
		m, info, err = hf.LoadModel(dir)
		return m, info, dir, err
	}
	if megatron.IsMegatronDir(dir) { // its tokenizer files are elsewhere (convert --from megatron copies them)
		m, _, err = megatron.Load(dir, megatron.Options{})
		return m, hf.Info{}, filepath.Join(dir, hf.TokenizerDir), err
	}
	m, _, err = train.LoadModel(dir)
	if err != nil {
		return nil, hf.Info{}, "", err
	}
	info, _, err = hf.ReadInfo(dir)
	return m, info, filepath.Join(dir, hf.TokenizerDir), err
}

// convertToHF exports a gotron checkpoint (or re-exports an HF directory).
func convertToHF(ctx context.Context, env *cli, f *convertFlags) error {
	var opts hf.ExportOptions
	if f.dtype != "" {
		dt, err := hf.ParseDType(f.dtype)
		if err != nil {
			return fmt.Errorf("--dtype: %w", err)
		}
		opts.DType = dt
	}
	shard, err := parseByteSize(f.maxShardSize)
	if err != nil {
		return fmt.Errorf("--max-shard-size: %w", err)
	}
	opts.MaxShardBytes = shard
	m, info, tokDir, err := loadAny(f.load)
	if err != nil {
		return err
	}
	warnNonFinite(env.stderr, f.load, m)
	if f.vocabSize != 0 {
		if f.vocabSize < 0 || f.vocabSize > m.Config.VocabSize {
			return fmt.Errorf("--vocab-size=%d: want 1..%d (the checkpoint's padded vocabulary)", f.vocabSize, m.Config.VocabSize)
		}
		info.VocabSize = f.vocabSize
	}
	// The checkpoint's tokenizer, found as generate finds it: the files
	// carried in the checkpoint, else GPT-2's for a GPT-2-sized vocabulary.
	tok, tokErr := checkpointTokenizer(tokenizer.Config{}, tokDir, m.Config.VocabSize, f.load, env.stderr)
	if info.VocabSize == 0 && tokErr == nil && tok.VocabSize() <= m.Config.VocabSize {
		info.VocabSize = tok.VocabSize() // the unpadded vocabulary: padding rows are not exported
	}
	if info.VocabSize == 0 {
		fmt.Fprintf(env.stderr, "warning: %s records no unpadded vocabulary size and carries no tokenizer: exporting all %d rows (set --vocab-size)\n", f.load, m.Config.VocabSize)
	}
	if err := hf.Export(ctx, f.save, m, info, opts); err != nil {
		return err
	}
	copied, err := exportTokenizer(f.save, tokDir, m, tok, tokErr)
	if err != nil {
		return err
	}
	fmt.Fprintf(env.stdout, "exported %s to %s (vocab_size %d)\n", f.load, f.save, info.VocabSize)
	if len(copied) > 0 {
		fmt.Fprintf(env.stdout, "tokenizer files: %s\n", strings.Join(copied, ", "))
	}
	return nil
}

// exportTokenizer writes the tokenizer files of an export into dir: those
// carried in tokDir, else GPT-2's embedded files when tok is GPT-2's, and a
// generation_config.json with the tokenizer's special ids when none was
// carried. It returns the names written.
func exportTokenizer(dir, tokDir string, m *gpt.Model, tok tokenizer.Tokenizer, tokErr error) ([]string, error) {
	copied, err := hf.CopyTokenizerFiles(tokDir, dir)
	if err != nil {
		return copied, err
	}
	has := map[string]bool{}
	for _, n := range copied {
		has[n] = true
	}
	carried := has["tokenizer.json"] || has["vocab.json"] || has["tokenizer.model"]
	if !carried && tokErr == nil { // checkpointTokenizer fell back to the embedded GPT-2 BPE
		names, err := gpt2.WriteFiles(dir, m.Config.MaxPositionEmbeddings)
		if err != nil {
			return copied, err
		}
		copied = append(copied, names...)
	}
	if !has[hf.GenerationConfigFile] {
		// As transformers' GenerationConfig.from_model_config: the ids of
		// config.json, else the tokenizer's.
		bos, eos := -1, -1
		if tokErr == nil {
			eos = tok.EOD()
			if sp, ok := tok.(tokenizer.Specials); ok {
				if id, ok := sp.BOS(); ok {
					bos = id
				}
			}
		}
		var ids struct {
			BOS *int `json:"bos_token_id"`
			EOS *int `json:"eos_token_id"`
		}
		if b, err := os.ReadFile(filepath.Join(dir, "config.json")); err == nil && json.Unmarshal(b, &ids) == nil {
			if ids.BOS != nil {
				bos = *ids.BOS
			}
			if ids.EOS != nil {
				eos = *ids.EOS
			}
		}
		if err := hf.WriteGenerationConfig(dir, bos, eos); err != nil {
			return copied, err
		}
		copied = append(copied, hf.GenerationConfigFile)
	}
	return copied, nil
}

// parseByteSize reads sizes as huggingface_hub does: "5GB" (10^9), "500MB",
// "2GiB" (2^30), "100KB", or a plain number of bytes.
func parseByteSize(s string) (int64, error) {
	units := []struct {
		suffix string
		mult   int64
	}{{"GIB", 1 << 30}, {"MIB", 1 << 20}, {"KIB", 1 << 10}, {"GB", 1e9}, {"MB", 1e6}, {"KB", 1e3}, {"B", 1}}
	u := strings.ToUpper(strings.TrimSpace(s))
	mult := int64(1)
	for _, x := range units {
		if strings.HasSuffix(u, x.suffix) {
			u, mult = strings.TrimSpace(strings.TrimSuffix(u, x.suffix)), x.mult
			break
		}
	}
	n, err := strconv.ParseFloat(u, 64)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("%q: want a positive size like 5GB, 500MB or 2GiB", s)
	}
	return int64(n * float64(mult)), nil
}

// convertSeqLength is the training sequence length a converted checkpoint
// records: --seq-length, or def when the flag is 0, within the model's
// position range.
func convertSeqLength(flag, def int, c gpt.Config) (int, error) {
	seq := flag
	if seq == 0 {
		seq = def
	}
	if seq < 1 || seq > c.MaxPositionEmbeddings {
		return 0, fmt.Errorf("--seq-length=%d: want 1..%d (max_position_embeddings)", seq, c.MaxPositionEmbeddings)
	}
	return seq, nil
}
