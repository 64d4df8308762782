// Command gotron trains and serves transformer language models: Megatron-LM's
// algorithms and flags in one static Go binary.
//
// Usage:
//
//	gotron <command> [flags]
//
// Run "gotron help" for the list of commands and "gotron <command> --help" for
// a command's flags. Flags keep Megatron-LM's names (--num-layers,
// --tensor-model-parallel-size, --data-path, ...).
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/gotron/gotron/comm"
	"github.com/gotron/gotron/tensor"
	"github.com/gotron/gotron/train"
)

// command is one gotron subcommand.
type command struct {
	name    string
	summary string
	run     func(ctx context.Context, env *cli, args []string) error
}

// cli carries the process's standard streams so commands can be run from tests.
type cli struct {
	stdout io.Writer
	stderr io.Writer
	stdin  io.Reader
	// getenv reads the environment; tests replace it.
	getenv func(string) string
	// world is this rank's world group when "gotron launch --inproc" runs
	// the command as one of several goroutine ranks; nil otherwise (a
	// multi-process job joins over tcp from the launcher's environment).
	world comm.ProcessGroup
}

func commands() []command {
	return []command{
		{"train", "train a GPT/Llama model (Megatron's pretrain_gpt.py flags)", cmdTrain},
		{"generate", "generate text from a checkpoint with a KV cache", cmdGenerate},
		{"inference", "run Megatron's inference scripts' arguments (gpt_dynamic_inference.py, gpt_static_inference.py, offline_inference.py): prompts, output JSON", cmdInference},
		{"serve", "serve a model over HTTP: OpenAI-compatible API, continuous batching, paged KV cache", cmdServe},
		{"score", "write per-position logits and print log-probabilities and perplexity", cmdScore},
		{"convert", "convert checkpoints: Hugging Face in and out, Megatron-LM (legacy torch format) in", cmdConvert},
		{"ckpt", "inspect a checkpoint: 'ckpt inspect DIR' (iteration, arguments, layout, every tensor)", cmdCkpt},
		{"preprocess", "tokenize JSONL into Megatron .bin/.idx files (tools/preprocess_data.py)", cmdPreprocess},
		{"tokenizer", "write the embedded GPT-2 tokenizer files: 'tokenizer export-gpt2 DIR'", cmdTokenizer},
		{"data", "inspect datasets: 'data samples', 'data inspect'", cmdData},
		{"parallel", "Megatron's rank groups and pipeline schedules: 'parallel groups', 'parallel schedule'", cmdParallel},
		{"memory", "Megatron's theoretical memory report for train flags and --world-size", cmdMemory},
		{"launch", "start N worker processes, torchrun-compatible", cmdLaunch},
		{"bench", "benchmarks: 'bench gemm', 'bench attention', 'bench comm', 'bench serve', 'bench moe'", cmdBench},
		{"version", "print gotron's version: module version, VCS revision and Go version", cmdVersion},
	}
}

func main() {
	env := &cli{stdout: os.Stdout, stderr: os.Stderr, stdin: os.Stdin, getenv: os.Getenv}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	os.Exit(run(ctx, env, os.Args[1:]))
}

// run dispatches to a subcommand and turns its error into an exit status
// (and a device failure, which tensor ops panic with, into an error).
func run(ctx context.Context, env *cli, args []string) (code int) {
	defer func() {
		if p := recover(); p != nil {
			de, ok := p.(*tensor.DeviceError)
			if !ok {
				panic(p)
			}
			fmt.Fprintf(env.stderr, "gotron %s: %v\n", args[0], de)
			code = 1
		}
	}()
	switch {
	case len(args) == 0 || args[0] == "-h" || args[0] == "--help" || (args[0] == "help" && len(args) == 1):
		usage(env.stdout)
		return 0
	case args[0] == "help":
		// gotron help <command> [subcommand]: the command's --help.
		return run(ctx, env, append(args[1:], "--help"))
	case args[0] == "--version":
		args = []string{"version"}
	}
	for _, c := range commands() {
		if c.name != args[0] {
			continue
		}
		rep := startReporter(env)
		err := c.run(ctx, env, args[1:])
		var rerunExit *train.RerunExit
		rep.finish(err)
		switch {
		case err == nil:
			return 0
		case errors.Is(err, errHelp):
			return 0
		case errors.As(err, &rerunExit):
			// the rerun state machine's exit statuses (16, 17), as Megatron's
			fmt.Fprintf(env.stderr, "gotron %s: %v\n", c.name, err)
			return rerunExit.ExitCode()
		default:
			fmt.Fprintf(env.stderr, "gotron %s: %v\n", c.name, err)
			return 1
		}
	}
	names := make([]string, 0, len(commands()))
	for _, c := range commands() {
		names = append(names, c.name)
	}
	msg := fmt.Sprintf("gotron: unknown command %q", args[0])
	if s := nearest(args[0], names); s != "" {
		msg += fmt.Sprintf(" (did you mean %q?)", s)
	}
	fmt.Fprintln(env.stderr, msg)
	usage(env.stderr)
	return 2
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "gotron: Megatron-LM's training and serving, in Go.")
	fmt.Fprintln(w, "\nUsage: gotron <command> [flags]\n\nCommands:")
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-11s %s\n", c.name, c.summary)
	}
	fmt.Fprintln(w, "\nRun 'gotron help <command>' or 'gotron <command> --help' for the flags of a command.")
	fmt.Fprintln(w, "Flags may come before or after a command's arguments: --name value, --name=value, --bool.")
}
