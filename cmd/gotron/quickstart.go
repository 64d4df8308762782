package main

import (
	"bytes"
	"context"
	"fmt"
	"hash/fnv"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strings"
	"time"

	datagpt "github.com/gotron/gotron/data/gpt"
	"github.com/gotron/gotron/data/indexed"
	"github.com/gotron/gotron/infer"
	"github.com/gotron/gotron/internal/assets/gpt2"
	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/optim"
	"github.com/gotron/gotron/tokenizer"
	"github.com/gotron/gotron/train"
)

// Quickstart settings: a ~16M-parameter GPT (most of it GPT-2's 50k-token
// embedding) trained for a few minutes on 2 cores.
const (
	quickstartCorpusBytes = 24 << 20 // Go source to tokenize
	quickstartIters       = 300
	quickstartSeq         = 128
	quickstartBatch       = 8
	quickstartPrompt      = "func main() {\n"
)

// quickstart is `gotron train` with no flags: build a corpus from Go's own
// source tree, tokenize it with GPT-2 BPE into Megatron .bin/.idx files,
// train a small GPT with a progress bar, save a checkpoint and print a sample.
func quickstart(ctx context.Context, env *cli, f *trainFlags) error {
	dir := f.quickstartDir
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	tok, err := gpt2.Tokenizer()
	if err != nil {
		return err
	}
	prefix := filepath.Join(dir, "gosrc_text_document")
	if _, err := os.Stat(prefix + ".idx"); err != nil {
		fmt.Fprintf(env.stdout, "gotron quickstart: building a corpus from %s (one document per .go file)\n", goSourceRoot())
		start := time.Now()
		docs, tokens, err := buildGoCorpus(ctx, goSourceRoot(), prefix, tok, quickstartCorpusBytes)
		if err != nil {
			return err
		}
		fmt.Fprintf(env.stdout, "gotron quickstart: %d documents, %d GPT-2 tokens in %s → %s.{bin,idx}\n", docs, tokens, time.Since(start).Round(time.Millisecond), prefix)
	}
	model, _ := gpt.Preset("tiny")
	model.VocabSize = tokenizer.PaddedVocabSize(tok.VocabSize(), 128, 1)
	model.MaxPositionEmbeddings = quickstartSeq
	sf := optim.DefaultSchedulerFlags()
	sf.LR, sf.MinLR, sf.LRDecayStyle, sf.LRWarmupIters, sf.WeightDecay = 2e-3, 2e-4, optim.DecayCosine, 30, 0.1
	cfg := train.Config{Model: model, SeqLength: quickstartSeq, MicroBatchSize: quickstartBatch, GlobalBatchSize: quickstartBatch,
		TrainIters: quickstartIters, Seed: 1234, Schedule: sf, ClipGrad: 1.0, Adam: optim.AdamWConfig{Beta1: 0.9, Beta2: 0.95},
		EvalInterval: 100, EvalIters: 4, LogInterval: 50, Save: filepath.Join(dir, "checkpoints"), Out: env.stdout,
		Args: map[string]any{"quickstart": true}}
	if isTerminal(env.stdout) {
		cfg.Progress = env.stdout
	}
	ds, err := datagpt.Build(ctx, datagpt.Config{SeqLength: quickstartSeq, Seed: 1234, Split: "98,2,0",
		Blend: datagpt.Blend{Prefixes: []string{prefix}}, EOD: int32(tok.EOD()),
		NumSamples: [3]int64{quickstartIters * quickstartBatch, 4 * 4 * quickstartBatch, 0}})
	if err != nil {
		return err
	}
	defer ds.Close()
	tr, err := train.New(cfg, ds.Train, ds.Valid)
	if err != nil {
		return err
	}
	fmt.Fprintf(env.stdout, "gotron quickstart: training a %.1fM-parameter GPT (%d layers, hidden %d) for %d iterations of %d×%d tokens; Ctrl-C saves and stops\n",
		float64(tr.Model.NumParams())/1e6, model.NumLayers, model.HiddenSize, quickstartIters, quickstartBatch, quickstartSeq)
	start := time.Now()
	res, err := tr.Run(ctx)
	if err != nil {
		return err
	}
	if len(res.Losses) > 0 {
		fmt.Fprintf(env.stdout, "gotron quickstart: lm loss %.3f at the first iteration → %.3f in the last log line, validation %.3f, in %s; checkpoint in %s\n",
			res.Losses[0], res.LoggedLoss, res.ValidLoss, time.Since(start).Round(time.Second), cfg.Save)
	}
	if res.Interrupted {
		return nil
	}
	fmt.Fprintf(env.stdout, "\nSample (gotron generate --load %s --prompt ...):\n", cfg.Save)
	return printSample(env, tr.Model, tok, quickstartPrompt, 120, 1234)
}

// printSample streams a continuation of prompt (top-k 40, temperature 0.8).
func printSample(env *cli, m *gpt.Model, tok tokenizer.Tokenizer, prompt string, n int, seed int64) error {
	ids := tok.Encode(prompt)
	p := make([]int32, len(ids))
	for i, id := range ids {
		p[i] = int32(id)
	}
	s, err := infer.NewSampler(infer.Sampling{Temperature: 0.8, TopK: 40, Seed: uint64(seed)})
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
	return filepath.Join(runtime.GOROOT(), "src")
}

// buildGoCorpus tokenizes hand-written .go files under root (up to
// maxBytes of source) into prefix.{bin,idx}, one document each with an
// end-of-document token, as `gotron preprocess --append-eod` would. Files
// are taken in a fixed pseudo-random order (a hash of the path) rather
// than by path, so the corpus samples the whole tree and the validation
// split (the last documents) looks like the training split; generated
// files (the compiler's rewrite rules, tables) and testdata are left out,
// since a small model would mostly learn their repetitive patterns.
func buildGoCorpus(ctx context.Context, root, prefix string, tok tokenizer.Tokenizer, maxBytes int) (docs, tokens int, err error) {
	var files []string
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
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
		return 0, 0, fmt.Errorf("quickstart: reading Go's source tree at %s: %w (is Go installed?)", root, err)
	}
	if len(files) == 0 {
		return 0, 0, fmt.Errorf("quickstart: no .go files under %s", root)
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
	b, err := indexed.NewBuilder(prefix+".tmp", indexed.BuilderConfig{DType: indexed.OptimalDType(tok.VocabSize())})
	if err != nil {
		return 0, 0, err
	}
	total := 0
	for _, path := range files {
		if ctx.Err() != nil {
			return 0, 0, ctx.Err()
		}
		text, err := os.ReadFile(path)
		if err != nil {
			return 0, 0, err
		}
		if isGenerated(text) {
			continue
		}
		ids := tok.Encode(string(text))
		doc := make([]int32, 0, len(ids)+1)
		for _, id := range ids {
			doc = append(doc, int32(id))
		}
		doc = append(doc, int32(tok.EOD()))
		if err := b.AddDocument(doc, []int{len(doc)}, nil); err != nil {
			return 0, 0, err
		}
		docs++
		tokens += len(doc)
		if total += len(text); total >= maxBytes {
			break
		}
	}
	if err := b.Finalize(); err != nil {
		return 0, 0, err
	}
	for _, ext := range []string{".bin", ".idx"} {
		if err := os.Rename(prefix+".tmp"+ext, prefix+ext); err != nil {
			return 0, 0, err
		}
	}
	return docs, tokens, nil
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
