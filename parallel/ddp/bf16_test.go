package ddp

import (
	"context"
	"encoding/json"
	"os"
	"testing"

	"github.com/gotron/gotron/comm"
	"github.com/gotron/gotron/comm/inproc"
	"github.com/gotron/gotron/tensor"
)

// TestReduceInBF16Golden: --grad-reduce-in-bf16's gradient buffer against
// torch's bfloat16 rounding (tools/golden/ddp_bf16.py): two micro-batches
// accumulated with a bfloat16 rounding after each, the 1/DP pre-scale in
// bfloat16, a bfloat16 reduction summed in float32 and rounded once. The
// all-reduce and the distributed optimizer's reduce-scatter (several
// buckets, overlap on) give every element the golden value, bit for bit.
func TestReduceInBF16Golden(t *testing.T) {
	raw, err := os.ReadFile("testdata/bf16_reduce.json")
	if err != nil {
		t.Fatal(err)
	}
	var g struct {
		DP      int           `json:"dp"`
		Grads   [][][]float64 `json:"grads"` // [rank][micro-batch][element]
		Reduced []float64     `json:"reduced"`
	}
	if err := json.Unmarshal(raw, &g); err != nil {
		t.Fatal(err)
	}
	n := len(g.Reduced)
	for _, cfg := range []Config{
		{ReduceInBF16: true},
		{ReduceInBF16: true, DistributedOptimizer: true, OverlapGradReduce: true, BucketSize: 40},
	} {
		got, held := make([][]float32, g.DP), make([][]bool, g.DP)
		err := inproc.Run(context.Background(), g.DP, func(ctx context.Context, pg comm.ProcessGroup) error {
			me := pg.Rank()
			// two parameters splitting the n elements
			a, b := tensor.Param("a", n/3), tensor.Param("b", n-n/3)
			d, err := New([]*tensor.Tensor{a, b}, pg, cfg, nil)
			if err != nil {
				return err
			}
			add := func(mb int) {
				for i, v := range g.Grads[me][mb] {
					if i < n/3 {
						a.Grad.Float32s()[i] += float32(v)
					} else {
						b.Grad.Float32s()[i-n/3] += float32(v)
					}
				}
			}
			d.ZeroGrad()
			add(0)
			d.EndMicrobatch()
			d.StartLastMicrobatch(ctx)
			add(1)
			d.EndMicrobatch() // armed: the buckets round as they are issued
			if err := d.Finish(ctx); err != nil {
				return err
			}
			views := d.GradViews(func(*tensor.Tensor) bool { return true })
			if !cfg.DistributedOptimizer {
				got[me] = append(views[0].Float32s(), views[1].Float32s()...)
				return nil
			}
			// the shards: scatter them back to global positions
			full, mine := make([]float32, n), make([]bool, n)
			for _, pc := range d.pieces {
				r := d.Layout.Range[pc.Param]
				lo, _ := d.Layout.Buckets[pc.Bucket].Shard(me, pg.Size())
				off := map[int]int{0: 0, 1: n / 3}[pc.Param]
				copy(full[off+pc.Lo:off+pc.Hi], d.gradShard[pc.Bucket].Float32s()[r[0]+pc.Lo-lo:r[0]+pc.Hi-lo])
				for i := off + pc.Lo; i < off+pc.Hi; i++ {
					mine[i] = true
				}
			}
			got[me], held[me] = full, mine
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		covered := make([]bool, n)
		for r, vs := range got {
			for i, v := range vs {
				if held[r] != nil && !held[r][i] {
					continue
				}
				covered[i] = true
				if want := float32(g.Reduced[i]); v != want {
					t.Fatalf("%+v rank %d element %d: %g, golden %g (inputs %v)", cfg, r, i, v, want, [][]float64{g.Grads[0][0][i : i+1], g.Grads[0][1][i : i+1], g.Grads[1][0][i : i+1], g.Grads[1][1][i : i+1]})
				}
			}
		}
		for i, c := range covered {
			if !c {
				t.Fatalf("%+v: element %d held by no rank", cfg, i)
			}
		}
	}
}
