package tp

import (
	"context"
	"math"
	"testing"

	"github.com/gotron/gotron/comm"
	"github.com/gotron/gotron/comm/commtest"
	"github.com/gotron/gotron/comm/inproc"
	"github.com/gotron/gotron/tensor"
)

// mapRun runs every mapping and the vocab-parallel cross-entropy forward
// and backward on dev over the group wrap makes of each rank's, and returns
// per rank the outputs and input gradients on the host.
func mapRun(t *testing.T, dev tensor.Device, wrap func(comm.ProcessGroup) comm.ProcessGroup) [][]float32 {
	t.Helper()
	const size, b, s, h = 2, 2, 4, 6
	maps := []func(r *Region, tp *tensor.Tape, x *tensor.Tensor) *tensor.Tensor{
		(*Region).CopyTo, (*Region).ReduceFrom, (*Region).GatherLast, (*Region).ScatterLast,
		(*Region).GatherSeq, (*Region).ReduceScatterSeq, (*Region).ScatterSeq,
	}
	out := make([][]float32, size)
	err := inproc.Run(t.Context(), size, func(ctx context.Context, pg comm.ProcessGroup) error {
		r := &Region{Group: wrap(pg), SequenceParallel: true}
		var vals []float32
		for k, f := range maps {
			x := tensor.Param("x", b, s*size, h*size)
			tensor.NewRNG(uint64(100*k+pg.Rank())).Normal(x.Float32s(), 0, 1)
			xd := x.ToDevice(dev)
			xd.SetRequiresGrad(true)
			tp := tensor.NewTape()
			tp.SetContext(ctx)
			y := f(r, tp, xd)
			c := tensor.New(tensor.Float32, y.Shape()...)
			tensor.NewRNG(uint64(200*k+pg.Rank())).Normal(c.Float32s(), 0, 1)
			if err := tp.BackwardFrom([]*tensor.Tensor{y}, []*tensor.Tensor{c.ToDevice(dev)}); err != nil {
				return err
			}
			vals = append(append(vals, tensor.ToHost(y.Contiguous()).Float32s()...), tensor.ToHost(xd.Grad).Float32s()...)
		}
		const n, vl = 10, 12
		logits := tensor.Param("logits", n, vl)
		tensor.NewRNG(uint64(7+pg.Rank())).Normal(logits.Float32s(), 0, 2)
		ld := logits.ToDevice(dev)
		ld.SetRequiresGrad(true)
		targets := tensor.FromInt32([]int32{0, 5, 23, 12, 7, 7, 19, 1, 11, 16}, n).ToDevice(dev)
		tp := tensor.NewTape()
		tp.SetContext(ctx)
		loss := r.VocabCrossEntropy(tp, ld, targets, nil, pg.Rank()*vl)
		if err := tp.Backward(loss); err != nil {
			return err
		}
		out[pg.Rank()] = append(append(vals, tensor.ToHost(loss).Float32s()...), tensor.ToHost(ld.Grad).Float32s()...)
		return nil
	})
	if err != nil {
		t.Fatalf("%v: %v", dev, err)
	}
	return out
}

// TestMappingsDeviceCollectives: on the simulated device with
// comm.SimDevice every mapping (all-reduce, the all-gathers and
// reduce-scatters of the last and sequence dimensions) and the
// vocab-parallel cross-entropy's reductions run in place on the device —
// the same bits as the CPU, the device collectives called, and fewer host
// copies than staging; a group whose DeviceTensor refuses the tensors
// stages through the host and gives the same bits.
func TestMappingsDeviceCollectives(t *testing.T) {
	want := mapRun(t, tensor.CPU, func(pg comm.ProcessGroup) comm.ProcessGroup { return pg })
	run := func(what string, wrap func(comm.ProcessGroup) comm.ProcessGroup) tensor.Transfers {
		before := tensor.SimTransfers()
		got := mapRun(t, tensor.Sim, wrap)
		used := tensor.SimTransfers().Sub(before)
		for r := range want {
			if len(got[r]) != len(want[r]) {
				t.Fatalf("%s rank %d: %d values, CPU %d", what, r, len(got[r]), len(want[r]))
			}
			for i := range want[r] {
				if math.Float32bits(got[r][i]) != math.Float32bits(want[r][i]) {
					t.Fatalf("%s rank %d: value %d = %v, CPU %v", what, r, i, got[r][i], want[r][i])
				}
			}
		}
		return used
	}
	staged := run("staged", func(pg comm.ProcessGroup) comm.ProcessGroup { return pg })
	sims, refusers := &commtest.SimDevices{}, &commtest.SimDevices{Refuse: true}
	inPlace := run("in place", sims.Wrap)
	refused := run("refused", refusers.Wrap)
	calls := [2]int64{sims.Calls(), refusers.Calls()}
	t.Logf("host copies for the 7 mappings and the cross-entropy, forward and backward, on 2 ranks: staged %d, in place %d, refused %d; device collectives %d",
		staged.ToHost+staged.FromHost, inPlace.ToHost+inPlace.FromHost, refused.ToHost+refused.FromHost, calls[0])
	// the mappings' 9 collectives forward and backward (copy_to,
	// reduce_from, gather_from, scatter_to and scatter_to_sequence have
	// one each, the sequence gather and reduce-scatter two) and the
	// cross-entropy's 2, on each of 2 ranks
	const wantCalls = 2 * (9 + 2)
	if calls[0] != wantCalls {
		t.Errorf("%d device collectives in place, want %d", calls[0], wantCalls)
	}
	if calls[1] != 0 {
		t.Errorf("a refusing group ran %d device collectives", calls[1])
	}
	// staging copies each collective's input out and its result back
	if c, s := inPlace.ToHost+inPlace.FromHost, staged.ToHost+staged.FromHost; c+2*wantCalls != s {
		t.Errorf("%d host copies in place, %d staged, want %d fewer (the staging of %d collectives)", c, s, 2*wantCalls, wantCalls)
	}
	if r, s := refused.ToHost+refused.FromHost, staged.ToHost+staged.FromHost; r != s {
		t.Errorf("%d host copies with a refusing group, %d staged", r, s)
	}
}
