package commtest

import (
	"context"
	"testing"

	"github.com/gotron/gotron/comm"
	"github.com/gotron/gotron/comm/inproc"
	"github.com/gotron/gotron/tensor"
)

// TestSimDevices: Wrap gives SimDevices whose collectives Calls counts
// over every rank and sub-group; with Refuse the groups, and the
// sub-groups made from them, accept no tensor and run none.
func TestSimDevices(t *testing.T) {
	for _, refuse := range []bool{false, true} {
		sims := &SimDevices{Refuse: refuse}
		err := inproc.Run(t.Context(), 2, func(ctx context.Context, pg comm.ProcessGroup) error {
			g := sims.Wrap(pg)
			sub, err := g.NewGroup([]int{0, 1})
			if err != nil {
				return err
			}
			x := tensor.FromFloat32([]float32{1, 2}, 2).ToDevice(tensor.Sim)
			for _, grp := range []comm.ProcessGroup{g, sub} {
				dc := grp.(comm.DeviceCollectives)
				if dc.DeviceTensor(x) == refuse {
					t.Errorf("refuse %v: DeviceTensor(sim tensor) = %v", refuse, !refuse)
				}
				if !refuse {
					if err := dc.AllReduceTensor(ctx, x, comm.Sum); err != nil {
						return err
					}
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		want := int64(4) // two collectives on each of 2 ranks
		if refuse {
			want = 0
		}
		if got := sims.Calls(); got != want {
			t.Errorf("refuse %v: %d device collectives counted, want %d", refuse, got, want)
		}
	}
}
