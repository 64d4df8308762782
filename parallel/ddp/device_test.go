package ddp

import (
	"context"
	"fmt"
	"testing"

	"github.com/gotron/gotron/comm"
	"github.com/gotron/gotron/comm/inproc"
	"github.com/gotron/gotron/tensor"
)

// reduceOnce runs one step's reduction on the simulated device: gradients
// and (with the distributed optimizer) the parameter gather, and returns
// every gradient view this rank holds and the flat parameters.
func reduceOnce(ctx context.Context, pg comm.ProcessGroup, cfg Config) ([]float32, []float32, error) {
	me := pg.Rank()
	shapes := [][]int{{3, 5}, {7}, {2, 9}}
	var params []*tensor.Tensor
	for k, sh := range shapes {
		h := tensor.New(tensor.Float32, sh...)
		for i := range h.Float32s() {
			h.Float32s()[i] = float32(k*100+i) / 7
		}
		p := h.ToDevice(tensor.Sim)
		p.Name = fmt.Sprintf("p%d", k)
		params = append(params, p)
	}
	d, err := New(params, pg, cfg, nil)
	if err != nil {
		return nil, nil, err
	}
	for k, p := range params {
		h := tensor.New(tensor.Float32, p.Shape()...)
		for i := range h.Float32s() {
			h.Float32s()[i] = float32((me+1)*(k+3)*(i%11)) / 3
		}
		tensor.Copy(p.Grad, h)
	}
	d.StartLastMicrobatch(ctx)
	if err := d.Finish(ctx); err != nil {
		return nil, nil, err
	}
	var grads []float32
	for _, v := range d.GradViews(func(*tensor.Tensor) bool { return true }) {
		grads = append(grads, v.ToDevice(tensor.CPU).Contiguous().Float32s()...)
	}
	var flat []float32
	if d.param != nil {
		// "update" this rank's shard, then gather
		for _, sp := range d.ShardParams() {
			tensor.ScaleList(mustList(sp.Data), float32(me+2))
		}
		if err := d.GatherParams(ctx); err != nil {
			return nil, nil, err
		}
		flat = d.param.ToDevice(tensor.CPU).Float32s()
	}
	if (d.dc != nil) != (pg.Size() > 1 && isSim(pg)) {
		return nil, nil, fmt.Errorf("rank %d: in-place device path %v with group %T", me, d.dc != nil, pg)
	}
	return grads, flat, nil
}

func isSim(pg comm.ProcessGroup) bool { _, ok := pg.(*comm.SimDevice); return ok }

func mustList(t *tensor.Tensor) *tensor.TensorList {
	l, err := tensor.NewTensorList(t)
	if err != nil {
		panic(err)
	}
	return l
}

// The in-place device path (comm.SimDevice on the simulated device, as
// comm/nccl on CUDA) gives the same bits as staging through the host, for
// every reduction mode.
func TestDeviceCollectivesMatchStaging(t *testing.T) {
	for _, cfg := range []Config{{}, {AverageInCollective: true}, {DistributedOptimizer: true}, {DistributedOptimizer: true, AverageInCollective: true, BucketSize: 16}} {
		t.Run(fmt.Sprintf("%+v", cfg), func(t *testing.T) {
			const n = 2
			got := make([][2][]float32, n)
			want := make([][2][]float32, n)
			sims := make([]*comm.SimDevice, n)
			err := inproc.Run(t.Context(), n, func(ctx context.Context, pg comm.ProcessGroup) error {
				g, f, err := reduceOnce(ctx, pg, cfg)
				if err != nil {
					return err
				}
				want[pg.Rank()] = [2][]float32{g, f}
				sims[pg.Rank()] = comm.NewSimDevice(pg)
				g, f, err = reduceOnce(ctx, sims[pg.Rank()], cfg)
				got[pg.Rank()] = [2][]float32{g, f}
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			if sims[0].Calls() == 0 || sims[1].Calls() == 0 {
				t.Fatal("the device collectives were never called")
			}
			for r := range n {
				for k, what := range []string{"gradients", "parameters"} {
					g, w := got[r][k], want[r][k]
					if len(g) != len(w) {
						t.Fatalf("rank %d %s: %d values, staged %d", r, what, len(g), len(w))
					}
					for i := range g {
						if g[i] != w[i] {
							t.Fatalf("rank %d %s[%d] = %v in place, %v staged", r, what, i, g[i], w[i])
						}
					}
				}
			}
		})
	}
}
