package main

import (
	"context"
	"fmt"
)

// cmdBench dispatches "gotron bench <what>".
func cmdBench(ctx context.Context, env *cli, args []string) error {
	subs := map[string]func(context.Context, *cli, []string) error{
		"gemm":      benchGemm,
		"attention": benchAttention,
		"comm":      benchComm,
		"serve":     benchServe,
		"moe":       benchMoE,
	}
	if len(args) == 0 || args[0] == "--help" || args[0] == "-h" {
		fmt.Fprintln(env.stdout, "Usage: gotron bench gemm|attention|comm|serve|moe [flags]")
		return errHelp
	}
	f, ok := subs[args[0]]
	if !ok {
		return fmt.Errorf("unknown benchmark %q (want gemm, attention, comm, serve or moe)", args[0])
	}
	return f(ctx, env, args[1:])
}
