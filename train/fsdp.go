package train

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/gotron/gotron/comm"
	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/optim"
	"github.com/gotron/gotron/parallel/fsdp"
	"github.com/gotron/gotron/tensor"
)

// Sharding is what fully sharded data parallelism shards over the
// data-parallel ranks (--use-megatron-fsdp with
// --data-parallel-sharding-strategy, or --use-torch-fsdp2). Megatron's
// other two strategies are the older switches: no_shard is plain data
// parallelism, optim is --use-distributed-optimizer.
type Sharding string

const (
	// NoFSDP: parameters and gradients are whole on every rank.
	NoFSDP Sharding = ""
	// ShardOptimGrads (optim_grads, ZeRO-2) shards the optimizer state and
	// the gradients; the parameters stay whole.
	ShardOptimGrads Sharding = "optim_grads"
	// ShardOptimGradsParams (optim_grads_params, ZeRO-3, Megatron's
	// default) also shards the parameters: each layer's are all-gathered
	// before its forward and again before its backward, and dropped after.
	ShardOptimGradsParams Sharding = "optim_grads_params"
)

// checkFSDP refuses what fully sharded data parallelism is not built for
// and switches the distributed optimizer on (Megatron-FSDP does: the
// optimizer steps on the shards).
func (c *Config) checkFSDP() error {
	if c.FSDP == NoFSDP {
		return nil
	}
	if c.FSDP != ShardOptimGrads && c.FSDP != ShardOptimGradsParams {
		return fmt.Errorf("train: sharding %q: want %s or %s", c.FSDP, ShardOptimGrads, ShardOptimGradsParams)
	}
	l := c.Parallel.Layout.Config
	switch {
	case l.PP > 1:
		return fmt.Errorf("train: --use-megatron-fsdp/--use-torch-fsdp2 with --pipeline-model-parallel-size=%d: not built in gotron (FSDP composes with data, tensor and context parallelism)", l.PP)
	case c.Model.MoE.Enabled():
		return errors.New("train: --use-megatron-fsdp/--use-torch-fsdp2 with --num-experts: not built in gotron (FSDP shards dense models)")
	case c.Parallel.InterDistOpt != nil:
		return errors.New("train: --use-megatron-fsdp/--use-torch-fsdp2 with --num-distributed-optimizer-instances > 1: not built in gotron")
	case c.Device != tensor.CPU:
		return fmt.Errorf("train: --use-megatron-fsdp/--use-torch-fsdp2 with --device %v: not built yet (FSDP runs on --device cpu)", c.Device)
	case c.DDP.OverlapParamGather:
		return errors.New("train: --overlap-param-gather with --use-megatron-fsdp/--use-torch-fsdp2: not built in gotron (each layer's parameters are gathered when it runs)")
	}
	c.DDP.DistributedOptimizer = true
	return nil
}

// setupFSDP shards the model's parameters (made equal on every
// data-parallel rank first) over the data × context parallel group and
// returns the optimizer's shard parameters.
func (st *stepper) setupFSDP(ctx context.Context) ([]*optim.Param, error) {
	gm, ok := st.model.(*gpt.Model)
	if !ok {
		return nil, fmt.Errorf("train: --use-megatron-fsdp needs a GPT model, not %T", st.model)
	}
	p := st.par
	for _, w := range gm.Params() {
		if err := staged(w, func(v []float32) error { return p.DP.Broadcast(ctx, comm.Float32s(v), 0) }); err != nil {
			return nil, fmt.Errorf("train: broadcast parameter %s from data-parallel rank 0: %w", w.Name, err)
		}
	}
	units := fsdp.Units{Layers: map[int][]*tensor.Tensor{}}
	inLayer := map[*tensor.Tensor]bool{}
	for i := range gm.Layers {
		ps := gm.Layers[i].Params()
		units.Layers[i] = ps
		for _, w := range ps {
			inLayer[w] = true
		}
	}
	for _, w := range gm.Params() {
		if !inLayer[w] {
			units.Outer = append(units.Outer, w)
		}
	}
	fc := fsdp.Config{KeepParams: st.cfg.FSDP == ShardOptimGrads, AverageInCollective: st.cfg.DDP.AverageInCollective}
	if st.cfg.CalculatePerTokenLoss {
		fc.GradientScale = 1 // plain sums over DP × CP, divided by the global token count in reduceGrads
	}
	f, err := fsdp.New(units, p.IntraDistOpt, fc)
	if err != nil {
		return nil, fmt.Errorf("train: %w", err)
	}
	gm.ParamGather = f
	st.fsdp = f
	st.reducer = fsdpGrads{f}
	return f.ShardParams(), nil
}

// beginMicrobatch gathers the parameters outside the layers before a
// forward pass (with FSDP; nothing otherwise).
func (st *stepper) beginMicrobatch(training bool) error {
	if st.fsdp == nil {
		return nil
	}
	if err := st.fsdp.BeginMicrobatch(st.cctx, training); err != nil {
		return fmt.Errorf("train: iteration %d: %w", st.Iteration+1, err)
	}
	return nil
}

// endMicrobatch reduces their gradients (after backward) and releases
// them.
func (st *stepper) endMicrobatch() error {
	if st.fsdp == nil {
		return nil
	}
	if err := st.fsdp.EndMicrobatch(st.cctx); err != nil {
		return fmt.Errorf("train: iteration %d: %w", st.Iteration+1, err)
	}
	return nil
}

// FSDPSizes reports the float32 values this rank holds under fully
// sharded data parallelism (false without it), measured on its buffers.
func (t *Trainer) FSDPSizes() (fsdp.Sizes, bool) {
	if t.stepper.fsdp == nil {
		return fsdp.Sizes{}, false
	}
	return t.stepper.fsdp.Sizes(), true
}

// fsdpGrads is gradReducer over package fsdp: the gradients are reduced
// layer by layer during backward, so Finish has nothing left to do; the
// parameters follow the optimizer step in AfterStep.
type fsdpGrads struct{ *fsdp.FSDP }

func (fsdpGrads) readyHook() func([]*tensor.Tensor)   { return nil }
func (fsdpGrads) StartLastMicrobatch(context.Context) {}
func (fsdpGrads) EndMicrobatch()                      {}
func (fsdpGrads) Finish(context.Context) error        { return nil }
func (f fsdpGrads) GatherParams(ctx context.Context) error {
	return f.AfterStep(ctx)
}

// WaitParams starts a step: the units a checkpoint or the end of the last
// run made whole are dropped again.
func (f fsdpGrads) WaitParams(context.Context) error {
	f.ReleaseAll()
	return nil
}
func (fsdpGrads) syncWait() (time.Duration, bool) { return 0, false }
