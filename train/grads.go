package train

import (
	"context"
	"time"

	"github.com/gotron/gotron/parallel/ddp"
	"github.com/gotron/gotron/tensor"
)

// gradReducer keeps a step's gradients and reduces them over the
// data-parallel group. A launched run uses ddp's flat buckets (ddpGrads,
// at any data-parallel size); a process started alone keeps its gradients
// in the parameters and has nothing to reduce (localGrads), so that its
// step costs what it did before data parallelism existed.
type gradReducer interface {
	// ZeroGrad clears the gradients before a step.
	ZeroGrad()
	// readyHook is the tape's gradient-ready hook, or nil for none.
	readyHook() func(ready []*tensor.Tensor)
	// StartLastMicrobatch arms the reduction of the step's last backward.
	StartLastMicrobatch(ctx context.Context)
	// EndMicrobatch follows each micro-batch's backward (under
	// --grad-reduce-in-bf16 it rounds the accumulated gradients to
	// bfloat16).
	EndMicrobatch()
	// Finish completes the step's gradient reduction.
	Finish(ctx context.Context) error
	// GatherParams and WaitParams bring every rank's updated parameters
	// back after the optimizer step (the distributed optimizer's
	// all-gather, maybe left in flight until WaitParams).
	GatherParams(ctx context.Context) error
	WaitParams(ctx context.Context) error
	// GradViews are views of the gradients of the parameters want
	// selects, as the reduction keeps them.
	GradViews(want func(*tensor.Tensor) bool) []*tensor.Tensor
	// syncWait is the time spent waiting for reductions since the start,
	// and whether there are reductions to wait for.
	syncWait() (time.Duration, bool)
}

// ddpGrads is gradReducer over package ddp.
type ddpGrads struct{ *ddp.DDP }

func (d ddpGrads) readyHook() func([]*tensor.Tensor) { return d.Hook }
func (d ddpGrads) syncWait() (time.Duration, bool)   { return d.SyncWait(), true }

// localGrads is gradReducer for a process alone: the parameters' own
// gradients, nothing to reduce or gather. bf16 (--grad-reduce-in-bf16)
// keeps their values in bfloat16 as ddp does: rounded after every
// micro-batch.
type localGrads struct {
	params []*tensor.Tensor
	bf16   bool
}

func (l localGrads) ZeroGrad()                         { tensor.ZeroGrad(l.params) }
func (localGrads) readyHook() func([]*tensor.Tensor)   { return nil }
func (localGrads) StartLastMicrobatch(context.Context) {}
func (l localGrads) EndMicrobatch() {
	if !l.bf16 {
		return
	}
	for _, p := range l.params {
		if p.Grad != nil {
			ddp.RoundBF16Tensor(p.Grad)
		}
	}
}
func (localGrads) Finish(context.Context) error       { return nil }
func (localGrads) GatherParams(context.Context) error { return nil }
func (localGrads) WaitParams(context.Context) error   { return nil }
func (localGrads) syncWait() (time.Duration, bool)    { return 0, false }
func (l localGrads) GradViews(want func(*tensor.Tensor) bool) []*tensor.Tensor {
	var out []*tensor.Tensor
	for _, p := range l.params {
		if want(p) {
			out = append(out, p.Grad)
		}
	}
	return out
}
