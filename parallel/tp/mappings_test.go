package tp

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gotron/gotron/comm"
	"github.com/gotron/gotron/comm/inproc"
	"github.com/gotron/gotron/tensor"
)

// globalLoss is Σ over ranks of <c_r, y_r>: every rank returns the same value.
func globalLoss(ctx context.Context, pg comm.ProcessGroup, c, y []float32) float64 {
	var s float32
	for i := range y {
		s += c[i] * y[i]
	}
	v := []float32{s}
	if err := pg.AllReduce(ctx, comm.Float32s(v), comm.Sum); err != nil {
		panic(err)
	}
	return float64(v[0])
}

// TestMappingsGradientFiniteDifferences checks every mapping's backward
// against central differences of the global loss Σ_r <c_r, f(x)_r>, with real
// ranks: each rank perturbs its own input in turn while all ranks recompute.
func TestMappingsGradientFiniteDifferences(t *testing.T) {
	const b, s, h = 2, 4, 6
	maps := map[string]func(r *Region, tp *tensor.Tape, x *tensor.Tensor) *tensor.Tensor{
		"copy_to":                 (*Region).CopyTo,
		"reduce_from":             (*Region).ReduceFrom,
		"gather_from (last dim)":  (*Region).GatherLast,
		"scatter_to (last dim)":   (*Region).ScatterLast,
		"gather_from_sequence":    (*Region).GatherSeq,
		"reduce_scatter_sequence": (*Region).ReduceScatterSeq,
		"scatter_to_sequence":     (*Region).ScatterSeq,
	}
	// The input of these is one tensor replicated on every rank (the same
	// values everywhere): a perturbation moves every copy.
	replicated := map[string]bool{"copy_to": true, "scatter_to (last dim)": true, "scatter_to_sequence": true}
	// The output of these is replicated (equal on every rank, consumed by
	// replicated computation): the loss counts it once, with the same
	// output gradient on every rank. Other outputs feed rank-local
	// computation and the loss sums over ranks.
	outReplicated := map[string]bool{"reduce_from": true, "gather_from (last dim)": true}
	for _, size := range []int{2, 3} {
		for name, f := range maps {
			err := inproc.Run(context.Background(), size, func(ctx context.Context, pg comm.ProcessGroup) error {
				r := &Region{Group: pg}
				seed := uint64(100 + pg.Rank())
				if replicated[name] {
					seed = 100
				}
				rng := tensor.NewRNG(seed)
				shape := []int{b, s * size, h * size}
				if name == "gather_from_sequence" {
					shape[1] = s
				}
				if name == "gather_from (last dim)" {
					shape[2] = h
				}
				x := tensor.Param("x", shape...)
				rng.Normal(x.Float32s(), 0, 1)
				y := f(r, nil, x)
				c := make([]float32, y.Numel())
				cseed := uint64(200 + pg.Rank())
				if outReplicated[name] {
					cseed = 200
				}
				tensor.NewRNG(cseed).Normal(c, 0, 1)
				loss := func(y []float32) float64 {
					if outReplicated[name] {
						var s float64
						for i := range y {
							s += float64(c[i] * y[i])
						}
						return s
					}
					return globalLoss(ctx, pg, c, y)
				}
				// Analytic: backward from y with gradient c.
				tp := tensor.NewTape()
				tp.SetContext(ctx)
				y = f(r, tp, x)
				if err := tp.BackwardFrom([]*tensor.Tensor{y}, []*tensor.Tensor{tensor.FromFloat32(c, y.Shape()...)}); err != nil {
					return err
				}
				grad := x.Grad.Float32s()
				const eps = 0.01
				var bad error // reported after the loop: every rank must run every forward
				for owner := range size {
					for i := 0; i < x.Numel(); i += 5 {
						xs := x.Float32s()
						old := xs[i]
						mine := pg.Rank() == owner || replicated[name]
						if mine {
							xs[i] = old + eps
						}
						lp := loss(f(r, nil, x).Float32s())
						if mine {
							xs[i] = old - eps
						}
						lm := loss(f(r, nil, x).Float32s())
						xs[i] = old
						if pg.Rank() != owner {
							continue
						}
						fd := (lp - lm) / (2 * eps)
						if math.Abs(fd-float64(grad[i])) > 2e-3*math.Max(1, math.Abs(fd)) && bad == nil {
							bad = fmt.Errorf("rank %d: d/dx[%d] = %v by finite differences, backward gives %v", owner, i, fd, grad[i])
						}
					}
				}
				return bad
			})
			if err != nil {
				t.Fatalf("%s at TP=%d: %v", name, size, err)
			}
		}
	}
}

// TestVocabParallelCrossEntropyMatchesSingleRank: the loss and the logits'
// gradient of the vocab-parallel cross-entropy over TP ranks equal the
// single-rank fused cross-entropy on the whole logits, with a loss mask.
func TestVocabParallelCrossEntropyMatchesSingleRank(t *testing.T) {
	const n, v = 10, 24
	rng := tensor.NewRNG(9)
	full := tensor.Param("logits", n, v)
	rng.Normal(full.Float32s(), 0, 2)
	targets := tensor.FromInt32([]int32{0, 5, 23, 12, 7, 7, 19, 1, 11, 16}, n)
	mask := tensor.FromFloat32([]float32{1, 1, 0, 1, 1, 0.5, 1, 1, 0, 1}, n)
	tp := tensor.NewTape()
	ref := tp.CrossEntropy(full, targets, tensor.CrossEntropyOptions{LossMask: mask})
	if err := tp.Backward(ref); err != nil {
		t.Fatal(err)
	}
	want, wantGrad := float64(ref.Float32s()[0]), full.Grad.Float32s()
	for _, size := range []int{2, 3, 4} {
		vl := v / size
		err := inproc.Run(context.Background(), size, func(ctx context.Context, pg comm.ProcessGroup) error {
			r := &Region{Group: pg}
			local := tensor.Param("local", n, vl)
			for i := range n {
				copy(local.Float32s()[i*vl:(i+1)*vl], full.Float32s()[i*v+pg.Rank()*vl:i*v+(pg.Rank()+1)*vl])
			}
			tp := tensor.NewTape()
			tp.SetContext(ctx)
			loss := r.VocabCrossEntropy(tp, local, targets, mask, pg.Rank()*vl)
			if got := float64(loss.Float32s()[0]); math.Abs(got-want) > 1e-5*math.Abs(want) {
				return fmt.Errorf("rank %d: loss %v, single rank %v", pg.Rank(), got, want)
			}
			if err := tp.Backward(loss); err != nil {
				return err
			}
			for i := range n {
				for j := range vl {
					g, w := local.Grad.Float32s()[i*vl+j], wantGrad[i*v+pg.Rank()*vl+j]
					if math.Abs(float64(g-w)) > 1e-6 {
						return fmt.Errorf("rank %d: d loss/d logit[%d][%d] = %v, single rank %v", pg.Rank(), i, pg.Rank()*vl+j, g, w)
					}
				}
			}
			return nil
		})
		if err != nil {
			t.Fatalf("TP=%d: %v", size, err)
		}
	}
}

// TestVocabEmbeddingMatchesLookup: the reduced vocab-parallel lookup equals
// the full table's, and each rank's table gradient is its rows of the full
// gradient.
func TestVocabEmbeddingMatchesLookup(t *testing.T) {
	const v, h = 12, 5
	rng := tensor.NewRNG(3)
	table := tensor.Param("w", v, h)
	rng.Normal(table.Float32s(), 0, 1)
	tokens := tensor.FromInt32([]int32{0, 11, 4, 4, 7, 3}, 2, 3)
	ref := tensor.NewTape()
	out := ref.Embedding(tokens, table)
	g := make([]float32, out.Numel())
	rng.Normal(g, 0, 1)
	if err := ref.BackwardFrom([]*tensor.Tensor{out}, []*tensor.Tensor{tensor.FromFloat32(g, out.Shape()...)}); err != nil {
		t.Fatal(err)
	}
	err := inproc.Run(context.Background(), 3, func(ctx context.Context, pg comm.ProcessGroup) error {
		r := &Region{Group: pg}
		vl := v / 3
		local := tensor.Param("local", vl, h)
		copy(local.Float32s(), table.Float32s()[pg.Rank()*vl*h:(pg.Rank()+1)*vl*h])
		tp := tensor.NewTape()
		tp.SetContext(ctx)
		y := r.ReduceFrom(tp, r.VocabEmbedding(tp, tokens, local, pg.Rank()*vl))
		for i, x := range y.Float32s() {
			if x != out.Float32s()[i] {
				return fmt.Errorf("rank %d: lookup[%d] = %v, want %v", pg.Rank(), i, x, out.Float32s()[i])
			}
		}
		if err := tp.BackwardFrom([]*tensor.Tensor{y}, []*tensor.Tensor{tensor.FromFloat32(g, y.Shape()...)}); err != nil {
			return err
		}
		for i, x := range local.Grad.Float32s() {
			if w := table.Grad.Float32s()[pg.Rank()*vl*h+i]; math.Abs(float64(x-w)) > 1e-6 {
				return fmt.Errorf("rank %d: table grad[%d] = %v, want %v", pg.Rank(), i, x, w)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestCollectiveFailureReturnedByBackward: a collective failing inside a
// forward or a backward pass — its peer gone, or the tape's context canceled
// — makes Backward return that error, naming the op and the rank; the
// region's later collectives on the tape are skipped (the first failure is
// the one returned).
func TestCollectiveFailureReturnedByBackward(t *testing.T) {
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	for _, c := range []struct {
		name    string
		ctx     context.Context
		kill    bool // the peer is gone
		forward bool // the failing collective is in the forward pass
		op      string
		want    error
	}{
		{name: "peer gone in forward", ctx: context.Background(), kill: true, forward: true,
			op: "tp: rank 0: reduce_from all_reduce", want: comm.ErrPeerLost},
		{name: "peer gone in backward", ctx: context.Background(), kill: true,
			op: "tp: rank 0: copy_to backward all_reduce", want: comm.ErrPeerLost},
		{name: "context canceled in forward", ctx: canceled, forward: true,
			op: "tp: rank 0: reduce_from all_reduce", want: context.Canceled},
		{name: "context canceled in backward", ctx: canceled,
			op: "tp: rank 0: copy_to backward all_reduce", want: context.Canceled},
	} {
		w, err := inproc.New(inproc.Config{Size: 2, Timeout: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		if c.kill {
			w.Kill(1)
		}
		r := &Region{Group: w.Group(0)}
		tp := tensor.NewTape()
		tp.SetContext(c.ctx)
		x := tensor.Param("x", 2, 4)
		var y *tensor.Tensor
		if c.forward {
			y = r.ReduceFrom(tp, x)
			if err := tp.Err(); err == nil || !strings.Contains(err.Error(), c.op) {
				t.Errorf("%s: after forward Err() = %v, want the %q failure", c.name, err, c.op)
			}
			y = r.GatherLast(tp, y) // skipped: the tape has failed
		} else {
			y = r.CopyTo(tp, x)
		}
		err = tp.Backward(tp.Sum(y))
		if err == nil || !strings.Contains(err.Error(), c.op) || !errors.Is(err, c.want) {
			t.Errorf("%s: Backward returned %v, want %q wrapping %v", c.name, err, c.op, c.want)
		}
		var re *comm.RankError
		if !errors.As(err, &re) {
			t.Errorf("%s: %v does not wrap a comm.RankError", c.name, err)
		}
		if c.forward && x.Grad != nil {
			t.Errorf("%s: backward ran after a failed forward", c.name)
		}
		tp.Reset()
		if tp.Err() != nil {
			t.Errorf("%s: Reset kept the failure", c.name)
		}
		_ = w.Close()
	}
}

// TestCanceledContextStopsTPStep: canceling the tape's context while the
// ranks of a TP=2 step wait in a collective stops the step: every rank's
// Backward returns an error wrapping the context's.
func TestCanceledContextStopsTPStep(t *testing.T) {
	w, err := inproc.New(inproc.Config{Size: 2, Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	ctx, cancel := context.WithCancel(context.Background())
	var errs [2]error
	var wg sync.WaitGroup
	for rank := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := &Region{Group: w.Group(rank)}
			tp := tensor.NewTape()
			tp.SetContext(ctx)
			x := tensor.Param("x", 2, 4)
			y := r.ReduceFrom(tp, r.CopyTo(tp, x)) // a full step's collectives, forward and backward
			if rank == 1 {
				// Rank 1 is late for backward: rank 0 waits in the
				// backward all-reduce until the context ends.
				<-ctx.Done()
			}
			errs[rank] = tp.Backward(tp.Sum(y))
		}()
	}
	time.Sleep(10 * time.Millisecond)
	cancel()
	wg.Wait()
	// The backward all-reduce, or the forward one on a slow machine.
	if want := "tp: rank 0: "; errs[0] == nil || !strings.Contains(errs[0].Error(), want) || !errors.Is(errs[0], context.Canceled) {
		t.Errorf("rank 0: Backward returned %v, want %q wrapping context.Canceled", errs[0], want)
	}
	if !errors.Is(errs[1], context.Canceled) && !errors.Is(errs[1], comm.ErrPeerLost) {
		t.Errorf("rank 1: Backward returned %v, want the context's error (or rank 0's abandonment)", errs[1])
	}
}
