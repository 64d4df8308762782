package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"io/fs"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strings"
	"time"

	"github.com/gotron/gotron/ckpt"
	"github.com/gotron/gotron/ckpt/hf"
	datagpt "github.com/gotron/gotron/data/gpt"
	"github.com/gotron/gotron/data/indexed"
	"github.com/gotron/gotron/infer"
	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/optim"
	"github.com/gotron/gotron/tokenizer"
	"github.com/gotron/gotron/train"
)

// quickstartPlan is what the quickstart builds and trains.
// quickstartDefault is the plan `gotron train` runs with no flags (picked by
// the measurements in docs/training.md); tests swap in a tiny one.
type quickstartPlan struct {
	SourceRoot     string     // Go source tree; "" means $(go env GOROOT)/src
	CorpusBytes    int        // Go source read into the corpus
	TokenizerBytes int        // the corpus's first bytes the BPE is fitted to; 0 means all
	VocabSize      int        // BPE vocabulary with "<|endoftext|>" (257: one token per byte)
	Model          gpt.Config // architecture; its VocabSize and MaxPositionEmbeddings are set from the plan
	Seq, Batch     int        // tokens per sample, samples per iteration
	Iters          int64      // training iterations
	LR, MinLR      float64    // cosine schedule from LR to MinLR after WarmupIters
	WarmupIters    int64
	EvalInterval   int64 // iterations between validation runs
	EvalIters      int64 // batches per validation run
	LogInterval    int64
	Prompt         string // the sample's prompt
	SampleTokens   int    // tokens sampled after the prompt
}

var quickstartDefault = quickstartPlan{
	CorpusBytes: 24 << 20, TokenizerBytes: 8 << 20, VocabSize: 4096,
	Model: gpt.Config{NumLayers: 2, HiddenSize: 128, NumAttentionHeads: 4, Activation: gpt.GELUTanh},
	Seq:   128, Batch: 16, Iters: 700, LR: 5e-3, MinLR: 5e-4, WarmupIters: 20,
	EvalInterval: 200, EvalIters: 8, LogInterval: 100,
	Prompt: "func main() {", SampleTokens: 120,
}

// The sample's sampling settings (gotron generate's flags): below 0.8 the
// small model wanders less often from code into comment prose.
const (
	quickstartTemperature = 0.6
	quickstartTopK        = 40
	quickstartSeed        = 1234
)

// quickstart is `gotron train` with no flags: build a corpus from Go's own
// source tree, fit a byte-level BPE vocabulary to it, tokenize it into
// Megatron .bin/.idx files, train a small GPT with a progress bar, save a
// checkpoint carrying the tokenizer and print a sample. A re-run resumes
// from the checkpoint, or only samples when it is complete.
func quickstart(ctx context.Context, env *cli, f *trainFlags) error {
	return runQuickstart(ctx, env, f.quickstartDir, quickstartDefault)
}

func runQuickstart(ctx context.Context, env *cli, dir string, plan quickstartPlan) error {
	save := filepath.Join(dir, "checkpoints")
	latest, err := ckpt.Latest(save)
	switch {
	case errors.Is(err, ckpt.ErrNoCheckpoint):
		latest = 0
	case err != nil:
		return err
	case int64(latest) >= plan.Iters:
		fmt.Fprintf(env.stdout, "gotron quickstart: %s already holds iteration %d of %d: not training again (remove it, or pass --quickstart-dir DIR, to start over)\n",
			save, latest, plan.Iters)
		return sampleCheckpoint(env, save, plan)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	prefix := filepath.Join(dir, "gosrc_text_document")
	tok, files, err := quickstartCorpus(ctx, env, dir, prefix, plan)
	if err != nil {
		return err
	}
	if err := carryTokenizer(save, files); err != nil {
		return err
	}
	cfg := plan.trainConfig(tok.VocabSize(), save, env.stdout)
	model := cfg.Model
	if latest > 0 {
		cfg.Load = save
	}
	if isTerminal(env.stdout) {
		cfg.Progress = env.stdout
	}
	ds, err := datagpt.Build(ctx, plan.dataConfig(prefix, tok.EOD()))
	if err != nil {
		return err
	}
	defer ds.Close()
	tr, err := train.New(cfg, ds.Train, ds.Valid)
	if err != nil {
		if latest > 0 {
			return fmt.Errorf("quickstart: resuming from %s: %w\n(remove %s to start over)", save, err, save)
		}
		return err
	}
	defer tr.Close() // the --save lock, if Run is not reached
	if latest > 0 {
		fmt.Fprintf(env.stdout, "gotron quickstart: resuming from iteration %d of %d in %s\n", latest, plan.Iters, save)
	}
	fmt.Fprintf(env.stdout, "gotron quickstart: training a %.1fM-parameter GPT (%d layers, hidden %d, vocabulary %d) for %d iterations of %d×%d tokens; Ctrl-C saves and stops\n",
		float64(tr.Model.NumParams())/1e6, model.NumLayers, model.HiddenSize, tok.VocabSize(), plan.Iters, plan.Batch, plan.Seq)
	start := time.Now()
	res, err := tr.Run(ctx)
	if err != nil {
		return err
	}
	if s := quickstartSummary(res, int64(latest), plan.Iters, time.Since(start), save); s != "" {
		fmt.Fprintln(env.stdout, s)
	}
	if res.Interrupted {
		return nil
	}
	return printQuickstartSample(env, tr.Model, tok, save, plan)
}

// trainConfig is the training run of the plan for a tokenizer of vocab ids
// (padded as Megatron pads, to a multiple of 128).
func (plan quickstartPlan) trainConfig(vocab int, save string, out io.Writer) train.Config {
	model := plan.Model
	model.VocabSize = tokenizer.PaddedVocabSize(vocab, 128, 1)
	model.MaxPositionEmbeddings = plan.Seq
	sf := optim.DefaultSchedulerFlags()
	sf.LR, sf.MinLR, sf.LRDecayStyle, sf.LRWarmupIters, sf.WeightDecay = plan.LR, plan.MinLR, optim.DecayCosine, plan.WarmupIters, 0.1
	return train.Config{Model: model, SeqLength: plan.Seq, MicroBatchSize: plan.Batch, GlobalBatchSize: plan.Batch,
		TrainIters: plan.Iters, Seed: 1234, Schedule: sf, ClipGrad: 1.0, Adam: optim.AdamWConfig{Beta1: 0.9, Beta2: 0.95},
		EvalInterval: plan.EvalInterval, EvalIters: plan.EvalIters, LogInterval: plan.LogInterval, Save: save, Out: out,
		Args: map[string]any{"quickstart": true}, TimingLogLevel: -1} // the quickstart prints no Megatron timers
}

// dataConfig is the plan's dataset: a 98/2 train/validation split of the
// corpus at prefix, as many samples as training and evaluation read.
func (plan quickstartPlan) dataConfig(prefix string, eod int) datagpt.Config {
	evals := plan.Iters/max(plan.EvalInterval, 1) + 1 // the evaluations during training and the final one
	return datagpt.Config{SeqLength: plan.Seq, Seed: 1234, Split: "98,2,0",
		Blend: datagpt.Blend{Prefixes: []string{prefix}}, EOD: int32(eod),
		NumSamples: [3]int64{plan.Iters * int64(plan.Batch), evals * plan.EvalIters * int64(plan.Batch), 0}}
}

// quickstartCorpus returns the quickstart's tokenizer and its files, and
// makes sure prefix.{bin,idx} holds the corpus tokenized with it: a corpus
// and tokenizer of an earlier run are reused when the tokenizer has the
// plan's size; otherwise both are built from the Go source tree.
func quickstartCorpus(ctx context.Context, env *cli, dir, prefix string, plan quickstartPlan) (*tokenizer.GPT2, tokenizer.GPT2Files, error) {
	tokDir := filepath.Join(dir, "tokenizer")
	files, err := readGPT2Files(tokDir)
	if err == nil {
		tok, err := files.Tokenizer()
		if _, statErr := os.Stat(prefix + ".idx"); err == nil && statErr == nil && tok.VocabSize() == plan.VocabSize {
			return tok, files, nil
		}
	}
	root := plan.SourceRoot
	if root == "" {
		root = goSourceRoot()
	}
	fmt.Fprintf(env.stdout, "gotron quickstart: building a corpus from %s (one document per .go file)\n", root)
	start := time.Now()
	texts, err := readGoSources(ctx, root, plan.CorpusBytes)
	if err != nil {
		return nil, files, err
	}
	fit, n := texts, 0
	for i, text := range texts {
		if n += len(text); plan.TokenizerBytes > 0 && n >= plan.TokenizerBytes {
			fit = texts[:i+1]
			break
		}
	}
	if files, err = tokenizer.TrainGPT2BPE(ctx, fit, plan.VocabSize); err != nil {
		return nil, files, err
	}
	tok, err := files.Tokenizer()
	if err != nil {
		return nil, files, err
	}
	fitTime := time.Since(start)
	tokens, err := writeCorpus(ctx, texts, prefix, tok)
	if err != nil {
		return nil, files, err
	}
	if err := files.Write(tokDir); err != nil { // last: its presence marks a finished corpus
		return nil, files, err
	}
	size := 0
	for _, text := range texts {
		size += len(text)
	}
	fmt.Fprintf(env.stdout, "gotron quickstart: %d documents (%.1f MB); a %d-token BPE vocabulary fitted to the first %.1f MB in %s → %s; %d tokens (%.2f bytes per token) in %s → %s.{bin,idx}\n",
		len(texts), float64(size)/1e6, tok.VocabSize(), float64(n)/1e6, fitTime.Round(time.Millisecond), tokDir,
		tokens, float64(size)/float64(tokens-len(texts)), time.Since(start).Round(time.Millisecond), prefix)
	return tok, files, nil
}

// printQuickstartSample prints the sample and the generate command that
// prints it again from the checkpoint.
func printQuickstartSample(env *cli, m *gpt.Model, tok tokenizer.Tokenizer, save string, plan quickstartPlan) error {
	fmt.Fprintf(env.stdout, "\nSample (gotron generate --load %s --prompt %q --max-new-tokens %d --temperature %g --top-k %d --seed %d):\n",
		save, plan.Prompt, plan.SampleTokens, quickstartTemperature, quickstartTopK, quickstartSeed)
	return printSample(env, m, tok, plan.Prompt, plan.SampleTokens, quickstartSeed)
}

// sampleCheckpoint samples from a finished quickstart checkpoint, loading
// the model and its tokenizer as gotron generate does.
func sampleCheckpoint(env *cli, save string, plan quickstartPlan) error {
	m, _, tokDir, err := loadAny(save)
	if err != nil {
		return err
	}
	tok, err := checkpointTokenizer(tokenizer.Config{}, tokDir, m.Config.VocabSize, save, env.stderr)
	if err != nil {
		return err
	}
	return printQuickstartSample(env, m, tok, save, plan)
}

// readGPT2Files reads vocab.json and merges.txt from dir.
func readGPT2Files(dir string) (tokenizer.GPT2Files, error) {
	var f tokenizer.GPT2Files
	var err error
	if f.VocabJSON, err = os.ReadFile(filepath.Join(dir, "vocab.json")); err != nil {
		return f, err
	}
	f.MergesTxt, err = os.ReadFile(filepath.Join(dir, "merges.txt"))
	return f, err
}

// carryTokenizer writes the tokenizer files into the checkpoint directory
// (where generate, score and serve look for them) before training, so that
// even an interrupted run's checkpoint carries them. An existing checkpoint
// must already carry the same files: one without them (an earlier gotron's
// GPT-2 quickstart) or with others (Go's source tree changed since) is
// refused rather than paired with the wrong vocabulary.
func carryTokenizer(save string, files tokenizer.GPT2Files) error {
	dir := filepath.Join(save, hf.TokenizerDir)
	if _, err := ckpt.Latest(save); err == nil {
		have, err := readGPT2Files(dir)
		switch {
		case err != nil:
			return fmt.Errorf("quickstart: %s holds a checkpoint without the quickstart's tokenizer files (an earlier gotron's?): remove it to start over", save)
		case !bytes.Equal(have.VocabJSON, files.VocabJSON) || !bytes.Equal(have.MergesTxt, files.MergesTxt):
			return fmt.Errorf("quickstart: %s carries another tokenizer than the one fitted to this corpus (Go's source tree changed?): remove it to start over", save)
		}
		return nil
	}
	return files.Write(dir)
}

// printSample streams a continuation of prompt (quickstartTemperature,
// quickstartTopK).
func printSample(env *cli, m *gpt.Model, tok tokenizer.Tokenizer, prompt string, n int, seed int64) error {
	ids := tok.Encode(prompt)
	p := make([]int32, len(ids))
	for i, id := range ids {
		p[i] = int32(id)
	}
	s, err := infer.NewSampler(infer.Sampling{Temperature: quickstartTemperature, TopK: quickstartTopK, Seed: uint64(seed)})
	if err != nil {
		return err
	}
	fmt.Fprint(env.stdout, prompt)
	stream := infer.NewTextStream(tok, ids)
	err = infer.Generate(context.Background(), m, p, n, tok.VocabSize(), tok.EOD(), s, func(id int) error {
		if id != tok.EOD() {
			fmt.Fprint(env.stdout, stream.Add(id))
		}
		return nil
	})
	fmt.Fprintln(env.stdout)
	return err
}

// goSourceRoot is $(go env GOROOT)/src, falling back to the toolchain that
// built this binary.
func goSourceRoot() string {
	if out, err := exec.Command("go", "env", "GOROOT").Output(); err == nil {
		if root := strings.TrimSpace(string(out)); root != "" {
			return filepath.Join(root, "src")
		}
	}
	// Without a go command on PATH, the build machine's root is the best
	// remaining guess (quickstart binaries usually run where they were
	// built); readGoSources reports a missing directory.
	//lint:ignore SA1019 the fallback is used only after go env GOROOT failed
	return filepath.Join(runtime.GOROOT(), "src")
}

// readGoSources returns hand-written .go files under root (up to maxBytes
// of source), one text each. Files are taken in a fixed pseudo-random order
// (a hash of the path) rather than by path, so the corpus samples the whole
// tree and the validation split (the last documents) looks like the
// training split; generated files (the compiler's rewrite rules, tables)
// and testdata are left out, since a small model would mostly learn their
// repetitive patterns.
func readGoSources(ctx context.Context, root string, maxBytes int) ([]string, error) {
	var files []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "testdata" || d.Name() == "vendor") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(path, ".go") {
			files = append(files, path)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("quickstart: reading Go's source tree at %s: %w (is Go installed?)", root, err)
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("quickstart: no .go files under %s", root)
	}
	key := func(path string) uint64 {
		h := fnv.New64a()
		rel, _ := filepath.Rel(root, path)
		h.Write([]byte(filepath.ToSlash(rel)))
		return h.Sum64()
	}
	sort.Slice(files, func(i, j int) bool {
		ki, kj := key(files[i]), key(files[j])
		return ki < kj || ki == kj && files[i] < files[j]
	})
	var texts []string
	total := 0
	for _, path := range files {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		text, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		if isGenerated(text) {
			continue
		}
		texts = append(texts, string(text))
		if total += len(text); total >= maxBytes {
			break
		}
	}
	return texts, nil
}

// writeCorpus tokenizes texts into prefix.{bin,idx}, one document each with
// an end-of-document token, as `gotron preprocess --append-eod` would, and
// returns the number of tokens written.
func writeCorpus(ctx context.Context, texts []string, prefix string, tok tokenizer.Tokenizer) (tokens int, err error) {
	b, err := indexed.NewBuilder(prefix+".tmp", indexed.BuilderConfig{DType: indexed.OptimalDType(tok.VocabSize())})
	if err != nil {
		return 0, err
	}
	for _, text := range texts {
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
		ids := tok.Encode(text)
		doc := make([]int32, 0, len(ids)+1)
		for _, id := range ids {
			doc = append(doc, int32(id))
		}
		doc = append(doc, int32(tok.EOD()))
		if err := b.AddDocument(doc, []int{len(doc)}, nil); err != nil {
			return 0, err
		}
		tokens += len(doc)
	}
	if err := b.Finalize(); err != nil {
		return 0, err
	}
	for _, ext := range []string{".bin", ".idx"} {
		if err := os.Rename(prefix+".tmp"+ext, prefix+ext); err != nil {
			return 0, err
		}
	}
	return tokens, nil
}

// generatedRE is Go's convention for marking generated files
// (https://go.dev/s/generatedcode), which must appear before the package
// clause.
var generatedRE = regexp.MustCompile(`(?m)^// Code generated .* DO NOT EDIT\.$`)

// isGenerated reports whether a Go file says it was generated.
func isGenerated(src []byte) bool {
	if bytes.HasPrefix(src, []byte("package ")) {
		return false
	}
	if i := bytes.Index(src, []byte("\npackage ")); i >= 0 {
		src = src[:i]
	}
	return generatedRE.Match(src)
}

// quickstartSummary is the line after training: the loss at the first
// iteration of this run and in the last log line, the last validation loss
// and where the checkpoint is. Only numbers the run produced are printed:
// a run stopped by Ctrl-C before a log line or an evaluation has none
// (it used to print "validation NaN"), and it says how to resume.
func quickstartSummary(res train.Result, resumedFrom, iters int64, took time.Duration, save string) string {
	if len(res.Losses) == 0 {
		return ""
	}
	finite := func(x float64) bool { return !math.IsNaN(x) && !math.IsInf(x, 0) }
	var b strings.Builder
	b.WriteString("gotron quickstart: ")
	if res.Interrupted {
		fmt.Fprintf(&b, "stopped at iteration %d of %d; ", resumedFrom+int64(len(res.Losses)), iters)
	}
	fmt.Fprintf(&b, "lm loss %.3f at iteration %d", res.Losses[0], resumedFrom+1)
	if finite(res.LoggedLoss) {
		fmt.Fprintf(&b, " → %.3f in the last log line", res.LoggedLoss)
	}
	if finite(res.ValidLoss) {
		fmt.Fprintf(&b, ", validation %.3f", res.ValidLoss)
	}
	fmt.Fprintf(&b, ", in %s; checkpoint in %s", took.Round(time.Second), save)
	if res.Interrupted {
		b.WriteString(" (run the same command to resume)")
	}
	return b.String()
}
