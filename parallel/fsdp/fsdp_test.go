package fsdp

import (
	"context"
	"strings"
	"testing"

	"github.com/gotron/gotron/comm"
	"github.com/gotron/gotron/comm/inproc"
	"github.com/gotron/gotron/tensor"
)

// params returns two parameters of 5 and 3 values holding 1..8.
func params() []*tensor.Tensor {
	a, b := tensor.Param("a", 5), tensor.Param("b", 3)
	for i := range 5 {
		a.Float32s()[i] = float32(i + 1)
	}
	for i := range 3 {
		b.Float32s()[i] = float32(i + 6)
	}
	return []*tensor.Tensor{a, b}
}

// TestShardsGatherAndReduce: over 3 ranks a unit of 8 values is padded to
// 9; each rank keeps 3, the optimizer pieces cover every value once,
// Gather brings the whole values back, and a gradient reduce-scatter sums
// the ranks' gradients pre-scaled by 1/3 into the owning shard.
func TestShardsGatherAndReduce(t *testing.T) {
	err := inproc.Run(context.Background(), 3, func(ctx context.Context, pg comm.ProcessGroup) error {
		ps := params()
		f, err := New(Units{Layers: map[int][]*tensor.Tensor{0: ps}}, pg, Config{})
		if err != nil {
			return err
		}
		if !ps[0].Released() || !ps[1].Released() {
			t.Errorf("rank %d: parameters whole after New", pg.Rank())
		}
		if s := f.Sizes(); s.ParamShards != 3 || s.Unsharded != 8 {
			t.Errorf("rank %d: sizes %+v, want 3 of 8 values in the shard", pg.Rank(), s)
		}
		n := 0
		for _, p := range f.ShardParams() {
			n += p.Data.Numel()
		}
		if want := []int{3, 3, 2}[pg.Rank()]; n != want {
			t.Errorf("rank %d: optimizer pieces hold %d values, want %d", pg.Rank(), n, want)
		}
		tp := tensor.NewTape()
		tp.SetContext(ctx)
		x := tensor.Param("x", 2)
		tp.Apply(boundary{f: f, units: f.layers(0, 1), gather: true}, x)
		if err := tp.Err(); err != nil {
			return err
		}
		if got := ps[1].Float32s(); got[0] != 6 || got[2] != 8 {
			t.Errorf("rank %d: gathered b = %v, want [6 7 8]", pg.Rank(), got)
		}
		u := f.layer[0]
		f.startGrad(u)
		for i := range ps[0].Grad.Float32s() {
			ps[0].Grad.Float32s()[i] = float32(3 * (pg.Rank() + 1)) // the mean over ranks is 6
		}
		if err := f.reduceGrad(ctx, u); err != nil {
			return err
		}
		if pg.Rank() == 0 {
			if got := u.gshard.Float32s(); got[0] != 6 || got[2] != 6 {
				t.Errorf("rank 0: reduced gradient shard %v, want 6s", got)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestNewRefusesAParameterInTwoUnits names the parameter and both units.
func TestNewRefusesAParameterInTwoUnits(t *testing.T) {
	err := inproc.Run(context.Background(), 1, func(ctx context.Context, pg comm.ProcessGroup) error {
		ps := params()
		_, err := New(Units{Outer: ps[:1], Layers: map[int][]*tensor.Tensor{0: ps}}, pg, Config{})
		if err == nil || !strings.Contains(err.Error(), "parameter a is in the embeddings and output layer and in layer 0") {
			t.Errorf("a parameter in two units: %v", err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
