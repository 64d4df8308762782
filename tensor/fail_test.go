package tensor

import (
	"context"
	"errors"
	"testing"
)

// failing is a function that checks the context it is given and records a
// failure in its forward or backward pass, as a tensor-parallel collective
// does.
type failing struct {
	fwd, bwd error
	ctx      context.Context // the context both passes must see
	calls    *int            // backward calls
}

func (f failing) Forward(tp *Tape, in []*Tensor) []*Tensor {
	if tp.Context() != f.ctx {
		tp.Fail(errors.New("forward: not the tape's context"))
	}
	tp.Fail(f.fwd)
	return []*Tensor{tp.Scale(in[0], 2)}
}

func (f failing) Backward(tp *Tape, g []*Tensor) []*Tensor {
	*f.calls++
	if tp.Context() != f.ctx {
		tp.Fail(errors.New("backward: not the tape's context"))
	}
	tp.Fail(f.bwd)
	return []*Tensor{tp.Scale(g[0], 2)}
}

// TestTapeFailureReturnedByBackward: a failure a function records in forward
// makes Backward return it without running a step; one recorded in backward
// is returned, the first one kept, and the steps after it are skipped.
// Functions see the tape's context, in Apply and in both runs of Checkpoint;
// Reset forgets the failure and keeps the context.
func TestTapeFailureReturnedByBackward(t *testing.T) {
	type key struct{}
	ctx := context.WithValue(context.Background(), key{}, 1)
	errA, errB := errors.New("a failed"), errors.New("b failed")
	for _, checkpoint := range []bool{false, true} {
		for _, c := range []struct {
			name                   string
			fwd1, bwd1, fwd2, bwd2 error
			want                   error
			calls                  int // backward calls of the two functions
		}{
			{name: "none", calls: 2},
			{name: "forward", fwd2: errA, want: errA},
			{name: "forward, first kept", fwd1: errA, fwd2: errB, want: errA},
			{name: "backward", bwd2: errA, want: errA, calls: 1}, // the first function's backward is skipped
			{name: "backward, first kept", bwd2: errA, bwd1: errB, want: errA, calls: 1},
		} {
			x := Param("x", 3)
			copy(x.Float32s(), []float32{1, 2, 3})
			tp := NewTape()
			tp.SetContext(ctx)
			calls := 0
			f1 := failing{fwd: c.fwd1, bwd: c.bwd1, ctx: ctx, calls: &calls}
			f2 := failing{fwd: c.fwd2, bwd: c.bwd2, ctx: ctx, calls: &calls}
			body := func(tp *Tape, in []*Tensor) []*Tensor {
				return tp.Apply(f2, tp.Apply(f1, in[0])[0])
			}
			var y *Tensor
			if checkpoint {
				y = tp.Checkpoint(body, []*Tensor{x})[0]
			} else {
				y = body(tp, []*Tensor{x})[0]
			}
			err := tp.Backward(tp.Sum(y))
			if checkpoint && c.want == nil {
				c.calls = 2 // recomputed, then backward once
			}
			if !errors.Is(err, c.want) || (c.want == nil) != (err == nil) {
				t.Errorf("checkpoint=%v %s: Backward returned %v, want %v", checkpoint, c.name, err, c.want)
			}
			if calls != c.calls {
				t.Errorf("checkpoint=%v %s: %d backward calls, want %d", checkpoint, c.name, calls, c.calls)
			}
			if c.want == nil {
				for i, v := range x.Grad.Float32s() {
					if v != 4 {
						t.Errorf("checkpoint=%v: grad[%d] = %v, want 4", checkpoint, i, v)
					}
				}
			}
			tp.Reset()
			if tp.Err() != nil || tp.Context() != ctx {
				t.Errorf("checkpoint=%v %s: after Reset: Err %v, context kept %v", checkpoint, c.name, tp.Err(), tp.Context() == ctx)
			}
		}
	}
}

// TestNilTapeContextAndFailure: a nil tape's context is Background and it
// has no error; recording a failure on it panics, as there is nowhere to
// keep it, while a no-grad tape keeps it.
func TestNilTapeContextAndFailure(t *testing.T) {
	var tp *Tape
	if tp.Context() != context.Background() || tp.Err() != nil {
		t.Fatal("nil tape: want context.Background() and no error")
	}
	tp.Fail(nil) // ignored
	func() {
		defer func() {
			if recover() == nil {
				t.Error("Fail on a nil tape did not panic")
			}
		}()
		tp.Fail(errors.New("lost"))
	}()
	ng := NewNoGradTape(nil)
	if ng.Context() != context.Background() {
		t.Error("a new no-grad tape's context is not Background")
	}
	err := errors.New("lost")
	ng.Apply(failing{fwd: err, ctx: context.Background()}, Zeros(2))
	if ng.Err() != err {
		t.Errorf("no-grad tape: Err %v, want %v", ng.Err(), err)
	}
}
