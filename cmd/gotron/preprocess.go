package main

import (
	"context"
	"fmt"
	"runtime"
	"strings"

	"github.com/gotron/gotron/data/preprocess"
	"github.com/gotron/gotron/tokenizer"
)

const preprocessSynopsis = "preprocess --input FILE|GLOB --output-prefix PREFIX --tokenizer-type TYPE [--vocab-file F --merge-file F | --tokenizer-model F] [--json-keys text ...] [--append-eod] [--workers N] [--partitions P] [--split-sentences]"

// cmdPreprocess is Megatron's tools/preprocess_data.py: JSONL in,
// <prefix>_<key>_document.{bin,idx} out.
func cmdPreprocess(ctx context.Context, env *cli, args []string) error {
	fs := newFlags("preprocess", preprocessSynopsis)
	var cfg preprocess.Config
	var tok tokenizer.Config
	var keys listFlag
	fs.StringVar(&cfg.Input, "input", "", "JSONL file, or a glob of them (.gz is read compressed)")
	fs.Var(&keys, "json-keys", "keys to extract from each JSON line (default text)")
	fs.BoolVar(&cfg.SplitSentences, "split-sentences", false, "one sequence per sentence (rule-based English splitter, not NLTK punkt)")
	fs.BoolVar(&cfg.KeepNewlines, "keep-newlines", false, "keep the whitespace after each sentence when splitting")
	lang := fs.String("lang", "english", "sentence-splitting language (only english)")
	fs.BoolVar(&cfg.AppendEOD, "append-eod", false, "append the end-of-document token to every document")
	fs.StringVar(&cfg.OutputPrefix, "output-prefix", "", "output path prefix: PREFIX_<key>_document.{bin,idx}")
	fs.IntVar(&cfg.Workers, "workers", runtime.GOMAXPROCS(0), "tokenizing goroutines")
	fs.IntVar(&cfg.Partitions, "partitions", 1, "deal lines round-robin into this many partitions, merged in partition order")
	fs.BoolVar(&cfg.KeepSequentialSamples, "keep-sequential-samples", false, "partitions take contiguous blocks of lines")
	fs.IntVar(&cfg.LogInterval, "log-interval", 1000, "documents between progress lines (when stderr is not a terminal)")
	fs.BoolVar(&cfg.SkipBadLines, "skip-bad-lines", false, "skip (and count) lines that are not JSON objects with the keys")
	fs.BoolVar(&cfg.ReplaceInvalidUTF8, "replace-invalid-utf8", false, "replace invalid UTF-8 in the input with U+FFFD (default: stop at FILE:LINE)")
	addTokenizerFlags(fs, &tok)
	if err := parseFlags(fs, args, env.stdout, preprocessSynopsis); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q (see --help)", fs.Arg(0))
	}
	if *lang != "english" {
		return fmt.Errorf("--lang %q: the sentence splitter only knows english", *lang)
	}
	if err := checkNumbers(preprocessNumberRules, flagText(fs)); err != nil {
		return err
	}
	if cfg.Input == "" || cfg.OutputPrefix == "" {
		return fmt.Errorf("--input and --output-prefix are required (see --help)")
	}
	if tok.Type == "" {
		return fmt.Errorf("--tokenizer-type is required (e.g. GPT2BPETokenizer with --vocab-file and --merge-file)")
	}
	t, err := tokenizer.New(tok)
	if err != nil {
		return err
	}
	cfg.Tokenizer = t
	cfg.JSONKeys = keys.values
	cfg.Progress, cfg.ProgressTerminal = env.stderr, isTerminal(env.stderr)
	st, err := preprocess.Run(ctx, cfg)
	if len(st.RemovedTemps) > 0 {
		fmt.Fprintf(env.stderr, "gotron preprocess: removed %d temporary files that a killed run left: %s\n", len(st.RemovedTemps), strings.Join(st.RemovedTemps, ", "))
	}
	if err != nil {
		return err
	}
	for i, out := range st.Outputs {
		key := "text"
		if len(cfg.JSONKeys) > i {
			key = cfg.JSONKeys[i]
		}
		fmt.Fprintf(env.stdout, "wrote %s.bin and %s.idx: %d documents, %d tokens\n", out, out, st.Documents, st.Tokens[key])
	}
	if st.BadLines > 0 {
		fmt.Fprintf(env.stdout, "skipped %d bad lines\n", st.BadLines)
	}
	return nil
}
