package ep

import (
	"context"
	"math"
	"testing"

	"github.com/gotron/gotron/comm"
	"github.com/gotron/gotron/comm/commtest"
	"github.com/gotron/gotron/comm/inproc"
	"github.com/gotron/gotron/tensor"
)

// a2aRun runs AllToAll forward and backward of uneven row blocks (empty
// ones included) on 3 ranks on dev, over the group wrap makes, and returns
// each rank's output and input gradient on the host.
func a2aRun(t *testing.T, dev tensor.Device, wrap func(comm.ProcessGroup) comm.ProcessGroup) [][]float32 {
	t.Helper()
	const n, c = 3, 4
	// rows[i][j]: rows rank i sends rank j
	rows := [n][n]int{{2, 0, 3}, {1, 1, 0}, {0, 4, 2}}
	out := make([][]float32, n)
	err := inproc.Run(t.Context(), n, func(ctx context.Context, pg comm.ProcessGroup) error {
		me := pg.Rank()
		send, recv := make([]int, n), make([]int, n)
		total := 0
		for j := range n {
			send[j], recv[j] = rows[me][j], rows[j][me]
			total += send[j]
		}
		g := &Group{PG: wrap(pg), UseAllToAll: true}
		x := tensor.New(tensor.Float32, total, c)
		tensor.NewRNG(uint64(10+me)).Normal(x.Float32s(), 0, 1)
		xd := x.ToDevice(dev)
		xd.SetRequiresGrad(true)
		tp := tensor.NewTape()
		tp.SetContext(ctx)
		y := g.AllToAll(tp, xd, send, recv)
		dy := tensor.New(tensor.Float32, y.Shape()...)
		tensor.NewRNG(uint64(20+me)).Normal(dy.Float32s(), 0, 1)
		if err := tp.BackwardFrom([]*tensor.Tensor{y}, []*tensor.Tensor{dy.ToDevice(dev)}); err != nil {
			return err
		}
		out[me] = append(tensor.ToHost(y).Float32s(), tensor.ToHost(xd.Grad).Float32s()...)
		return nil
	})
	if err != nil {
		t.Fatalf("%v: %v", dev, err)
	}
	return out
}

// TestAllToAllDeviceCollectives: expert parallelism's token all-to-all
// runs in place on the simulated device with comm.SimDevice (grouped sends
// and receives of row blocks, uneven and empty blocks included) and gives
// the CPU's bits with fewer host copies; a group refusing the tensors
// stages through the host.
func TestAllToAllDeviceCollectives(t *testing.T) {
	want := a2aRun(t, tensor.CPU, func(pg comm.ProcessGroup) comm.ProcessGroup { return pg })
	check := func(what string, wrap func(comm.ProcessGroup) comm.ProcessGroup) int64 {
		before := tensor.SimTransfers()
		got := a2aRun(t, tensor.Sim, wrap)
		d := tensor.SimTransfers().Sub(before)
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
		return d.ToHost + d.FromHost
	}
	staged := check("staged", func(pg comm.ProcessGroup) comm.ProcessGroup { return pg })
	sims := &commtest.SimDevices{}
	inPlace := check("in place", sims.Wrap)
	// forward and backward on 3 ranks: one batch each
	if calls := sims.Calls(); calls != 6 {
		t.Errorf("%d device collectives, want 6", calls)
	}
	refusers := &commtest.SimDevices{Refuse: true}
	refused := check("refused", refusers.Wrap)
	if calls := refusers.Calls(); calls != 0 {
		t.Errorf("a refusing group ran %d device collectives", calls)
	}
	// staging copies each exchange's input out and its output in
	if inPlace+2*6 != staged || refused != staged {
		t.Errorf("host copies: staged %d, in place %d (want 12 fewer), refused %d (want the staged count)", staged, inPlace, refused)
	}
	t.Logf("host copies: staged %d, in place %d, refused %d", staged, inPlace, refused)
}
