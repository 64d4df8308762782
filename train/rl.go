package train

import (
	"context"
	"fmt"

	datagpt "github.com/gotron/gotron/data/gpt"
	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/tensor"
)

// RLStep is Megatron's RL training step (--perform-rl-step; package rl's
// Collector). Before every iteration the stepper calls Prepare, which
// collects new rollouts with the current weights when the iteration starts
// a collection; the iteration's micro-batches are then read from it as a
// Source (sample i of the run: the consumed count's frame), and Loss
// replaces the model's language-model loss.
type RLStep interface {
	datagpt.Source
	// Prepare readies the rollouts iteration+1 trains on. m is the model
	// (its current weights); eval is a tape without gradients in the
	// run's matmul precision, which Prepare resets after each forward.
	Prepare(ctx context.Context, m Model, eval *tensor.Tape, iteration, consumed int64) error
	// Loss is the mean over bt's loss tokens of the RL loss of logits (b,
	// t, V), bt holding samples first … first+b−1. With no loss tokens the
	// mean is over one (train_rl.loss_func's guard): lossTokens counts 1.
	Loss(tp *tensor.Tape, logits *tensor.Tensor, bt gpt.Batch, first int64) *tensor.Tensor
}

// RLPlanner is an RLStep whose iterations may run a number of
// micro-batches that changes per collection (Megatron's RL sequence
// packing, update_microbatch_calculator). When Plan says packed, the
// iteration Prepare readied runs microBatches micro-batches on every
// data-parallel rank, each rank reading samples first, first+mbs, … of its
// own (the RL step deals each rank its bins), the scheduler advances by
// the micro-batches' samples of all ranks (bins) and the consumed count by
// sequences, the rollouts in all ranks' bins.
type RLPlanner interface {
	Plan() (microBatches int, first, sequences int64, packed bool)
}

// validateRL refuses what the RL step is not built for.
func (c *Config) validateRL() error {
	if p := c.Parallel; p != nil {
		l := p.Layout.Config
		if max(l.PP, 1) > 1 || max(l.CP, 1) > 1 {
			return fmt.Errorf("train: --perform-rl-step with pipeline/context parallelism (PP=%d, CP=%d): needs Megatron's pipeline/context-parallel RL step, not built in gotron (GRPO runs data- and tensor-parallel)", l.PP, l.CP)
		}
		if max(l.TP, 1) > 1 && c.SequenceParallel {
			return fmt.Errorf("train: --perform-rl-step with --sequence-parallel (TP=%d): the rollouts are generated on the training shards, and gotron's decoding does not run a sequence-parallel shard; drop --sequence-parallel", l.TP)
		}
	}
	if len(c.RampupBatchSize) > 0 || c.StepBatchSizeSchedule != "" {
		return fmt.Errorf("train: --perform-rl-step with a batch-size ramp or schedule: Megatron's RL step sets the global batch itself; give --global-batch-size")
	}
	if c.Model.MoE.Enabled() {
		return fmt.Errorf("train: --perform-rl-step with --num-experts: needs an MoE RL step, not built in gotron (a dense model is)")
	}
	if c.Device != tensor.CPU {
		return fmt.Errorf("train: --perform-rl-step on --device %v: the GRPO loss reads the log-probabilities on the host: --device cpu only (not built for a GPU yet)", c.Device)
	}
	return nil
}
