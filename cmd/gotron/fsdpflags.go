package main

import (
	"flag"
	"fmt"
	"io"

	"github.com/gotron/gotron/train"
)

// fsdpFlags are Megatron's fully sharded data parallelism switches
// (megatron/training/arguments.py): --use-megatron-fsdp with
// --data-parallel-sharding-strategy, --use-torch-fsdp2, and Megatron-FSDP's
// buffer data types.
type fsdpFlags struct {
	megatron, torch                 bool
	strategy                        string
	mainParams, mainGrads, gradComm string
}

// Megatron's --data-parallel-sharding-strategy values.
var shardingStrategies = []string{"no_shard", "optim", "optim_grads", "optim_grads_params"}

func (f *fsdpFlags) add(fs *flag.FlagSet) {
	fs.BoolVar(&f.megatron, "use-megatron-fsdp", false, "fully sharded data parallelism (Megatron-FSDP): what --data-parallel-sharding-strategy says is sharded over the data × context parallel ranks; with optim_grads_params each layer's parameters are all-gathered before its forward and backward and dropped after (CPU; composes with tensor and context parallelism, not pipeline or expert parallelism)")
	fs.StringVar(&f.strategy, "data-parallel-sharding-strategy", "optim_grads_params", "with --use-megatron-fsdp: no_shard (plain data parallelism), optim (the optimizer state: --use-distributed-optimizer), optim_grads (and the gradients, ZeRO-2) or optim_grads_params (and the parameters, ZeRO-3)")
	fs.BoolVar(&f.torch, "use-torch-fsdp2", false, "fully sharded data parallelism as PyTorch FSDP2 shards (parameters, gradients and optimizer state: --use-megatron-fsdp's optim_grads_params); Megatron's conditions apply (--untie-embeddings-and-output-weights, no --fp16, no --use-distributed-optimizer)")
	fs.StringVar(&f.mainParams, "megatron-fsdp-main-params-dtype", "fp32", "with --use-megatron-fsdp: the main (optimizer) parameters' type: fp32 or auto (gotron's parameters are float32)")
	fs.StringVar(&f.mainGrads, "megatron-fsdp-main-grads-dtype", "auto", "with --use-megatron-fsdp: the gradient shards' type: fp32 or auto (float32)")
	fs.StringVar(&f.gradComm, "megatron-fsdp-grad-comm-dtype", "auto", "with --use-megatron-fsdp: the type gradients are reduce-scattered in: fp32 or auto (float32)")
}

// apply sets cfg's sharding from the flags, refusing what Megatron refuses
// and what gotron does not build. ckptFormat is --ckpt-format.
// untied is --untie-embeddings-and-output-weights (of the model as built).
func (f *fsdpFlags) apply(cfg *train.Config, given map[string]bool, ckptFormat string, untied bool) error {
	for name, v := range map[string]string{"megatron-fsdp-main-params-dtype": f.mainParams,
		"megatron-fsdp-main-grads-dtype": f.mainGrads, "megatron-fsdp-grad-comm-dtype": f.gradComm} {
		switch v {
		case "fp32", "auto":
		case "bf16", "fp16":
			return fmt.Errorf("--%s=%s: Megatron-FSDP's %s buffers are not built in gotron (its FSDP keeps parameters, gradients and their reductions in float32: fp32 or auto)", name, v, v)
		default:
			return fmt.Errorf("--%s=%s: want fp32, bf16, fp16 or auto", name, v)
		}
		if given[name] && !f.megatron {
			return fmt.Errorf("--%s needs --use-megatron-fsdp", name)
		}
	}
	known := false
	for _, s := range shardingStrategies {
		known = known || s == f.strategy
	}
	switch {
	case !known:
		return fmt.Errorf("--data-parallel-sharding-strategy=%s: want one of %v", f.strategy, shardingStrategies)
	case given["data-parallel-sharding-strategy"] && !f.megatron:
		return fmt.Errorf("--data-parallel-sharding-strategy=%s needs --use-megatron-fsdp (Megatron reads it only there; --use-distributed-optimizer alone shards the optimizer state)", f.strategy)
	case f.megatron && f.torch:
		return fmt.Errorf("--use-megatron-fsdp and --use-torch-fsdp2 exclude each other")
	case ckptFormat == "fsdp_dtensor" && !f.megatron:
		return fmt.Errorf("--ckpt-format fsdp_dtensor needs --use-megatron-fsdp (as Megatron)")
	}
	if f.torch {
		// Megatron's own conditions (arguments.py, validate_args)
		switch {
		case given["use-distributed-optimizer"]:
			return fmt.Errorf("--use-torch-fsdp2 is not supported with --use-distributed-optimizer (as Megatron: FSDP2 shards the optimizer state itself)")
		case !untied:
			return fmt.Errorf("--use-torch-fsdp2 requires --untie-embeddings-and-output-weights (as Megatron)")
		case cfg.FP16:
			return fmt.Errorf("--use-torch-fsdp2 is not supported with --fp16 (as Megatron)")
		}
		cfg.FSDP = train.ShardOptimGradsParams
		return nil
	}
	if !f.megatron {
		return nil
	}
	switch f.strategy {
	case "no_shard":
		cfg.DDP.DistributedOptimizer = false // gradients all-reduced, optimizer state whole on every rank
	case "optim":
		cfg.DDP.DistributedOptimizer = true
	case "optim_grads":
		cfg.FSDP = train.ShardOptimGrads
	default:
		cfg.FSDP = train.ShardOptimGradsParams
	}
	return nil
}

// printFSDP prints what a fully sharded run keeps on this rank, measured
// on its buffers (nothing without FSDP).
func printFSDP(w io.Writer, tr *train.Trainer) {
	s, ok := tr.FSDPSizes()
	if !ok {
		return
	}
	fmt.Fprintf(w, "gotron train: fully sharded data parallelism: this rank keeps %d of the %d parameters it would hold unsharded, and their gradients (%.2f MB of shards); the largest unit gathered at once has %d values\n",
		s.ParamShards, s.Unsharded, float64(4*(s.ParamShards+s.GradShards))/1e6, s.LargestUnit)
}
