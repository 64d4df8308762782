package ddp

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/gotron/gotron/comm"
	"github.com/gotron/gotron/comm/inproc"
	"github.com/gotron/gotron/tensor"
)

// simCollectives gives an inproc group comm.DeviceCollectives on the
// simulated device, through host copies, so the in-place device path of
// DDP (what comm/nccl serves on CUDA) runs without a GPU.
type simCollectives struct {
	comm.ProcessGroup
	calls *atomic.Int64
}

func (s simCollectives) DeviceTensor(t *tensor.Tensor) bool {
	return t.Device() == tensor.Sim && t.IsContiguous() && t.DType() == tensor.Float32
}

// through runs f on host copies of ts and copies them back.
func (s simCollectives) through(f func(hs []comm.Buffer) error, ts ...*tensor.Tensor) error {
	s.calls.Add(1)
	hs := make([]*tensor.Tensor, len(ts))
	bs := make([]comm.Buffer, len(ts))
	for i, t := range ts {
		if !s.DeviceTensor(t) {
			return fmt.Errorf("not a device tensor: %v on %v", t, t.Device())
		}
		hs[i] = t.ToDevice(tensor.CPU)
		bs[i] = comm.Float32s(hs[i].Float32s())
	}
	if err := f(bs); err != nil {
		return err
	}
	for i, t := range ts {
		tensor.Copy(t, hs[i])
	}
	return nil
}

func (s simCollectives) AllReduceTensor(ctx context.Context, t *tensor.Tensor, op comm.ReduceOp) error {
	return s.through(func(b []comm.Buffer) error { return s.AllReduce(ctx, b[0], op) }, t)
}

func (s simCollectives) ReduceScatterTensor(ctx context.Context, out, in *tensor.Tensor, op comm.ReduceOp) error {
	return s.through(func(b []comm.Buffer) error { return s.ReduceScatter(ctx, b[0], b[1], op, nil) }, out, in)
}

func (s simCollectives) AllGatherTensor(ctx context.Context, out, in *tensor.Tensor) error {
	return s.through(func(b []comm.Buffer) error { return s.AllGather(ctx, b[0], b[1], nil) }, out, in)
}

func (s simCollectives) BroadcastTensor(ctx context.Context, t *tensor.Tensor, root int) error {
	return s.through(func(b []comm.Buffer) error { return s.Broadcast(ctx, b[0], root) }, t)
}

func (s simCollectives) SendTensor(ctx context.Context, t *tensor.Tensor, peer int) error {
	return s.through(func(b []comm.Buffer) error { return s.Send(ctx, b[0], peer) }, t)
}

func (s simCollectives) RecvTensor(ctx context.Context, t *tensor.Tensor, peer int) error {
	return s.through(func(b []comm.Buffer) error { return s.Recv(ctx, b[0], peer) }, t)
}

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

func isSim(pg comm.ProcessGroup) bool { _, ok := pg.(simCollectives); return ok }

func mustList(t *tensor.Tensor) *tensor.TensorList {
	l, err := tensor.NewTensorList(t)
	if err != nil {
		panic(err)
	}
	return l
}

// The in-place device path gives the same bits as staging through the
// host, for every reduction mode.
func TestDeviceCollectivesMatchStaging(t *testing.T) {
	for _, cfg := range []Config{{}, {AverageInCollective: true}, {DistributedOptimizer: true}, {DistributedOptimizer: true, AverageInCollective: true, BucketSize: 16}} {
		t.Run(fmt.Sprintf("%+v", cfg), func(t *testing.T) {
			const n = 2
			got := make([][2][]float32, n)
			want := make([][2][]float32, n)
			var calls atomic.Int64
			err := inproc.Run(t.Context(), n, func(ctx context.Context, pg comm.ProcessGroup) error {
				g, f, err := reduceOnce(ctx, pg, cfg)
				if err != nil {
					return err
				}
				want[pg.Rank()] = [2][]float32{g, f}
				g, f, err = reduceOnce(ctx, simCollectives{pg, &calls}, cfg)
				got[pg.Rank()] = [2][]float32{g, f}
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			if calls.Load() == 0 {
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
