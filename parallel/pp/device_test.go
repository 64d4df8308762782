package pp

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/gotron/gotron/comm"
	"github.com/gotron/gotron/comm/commtest"
	"github.com/gotron/gotron/tensor"
)

// simToy is newToy with its inputs and the returned weights on the
// simulated device.
func simToy(stages, m int) (*toyModel, []*tensor.Tensor) {
	tm := newToy(stages, m)
	for i, x := range tm.xs {
		tm.xs[i] = x.ToDevice(tensor.Sim)
	}
	ws := tm.weights()
	tensor.MoveParams(tensor.Sim, ws...)
	return tm, ws
}

// TestExecutorDeviceCollectives: on the simulated device with
// comm.SimDevice the executor sends and receives activations and
// gradients in place (batched and unbatched, 1F1B and interleaved) with
// the CPU's loss and gradients bit for bit and no staging copies; a group
// refusing the tensors stages them; a shape mismatch is still named.
func TestExecutorDeviceCollectives(t *testing.T) {
	for _, cfg := range []Config{{PP: 2, Microbatches: 4}, {PP: 2, VPP: 2, Microbatches: 4}, {PP: 3, Microbatches: 5}} {
		c := cfg.withDefaults()
		cpuToy := newToy(c.PP*c.VPP, c.Microbatches)
		wantLoss, wantWs, _, err := pipelineToy(t, cpuToy, cfg, false)
		if err != nil {
			t.Fatal(err)
		}
		for _, mode := range []string{"batched", "unbatched", "refused"} {
			what := fmt.Sprintf("%+v %s", cfg, mode)
			tm, ws := simToy(c.PP*c.VPP, c.Microbatches)
			sims := &commtest.SimDevices{Refuse: mode == "refused"}
			var loss float64
			before := tensor.SimTransfers()
			errs := runRanks(t, c.PP, func(ctx context.Context, pg comm.ProcessGroup) error {
				g := sims.Wrap(pg)
				stages, _ := rankStages(tm, cfg, pg.Rank(), ws)
				e, err := NewExecutor(ExecConfig{Schedule: cfg, Group: g, Stages: stages, Unbatched: mode == "unbatched", Device: tensor.Sim})
				if err != nil {
					return err
				}
				l, err := e.Step(ctx)
				if e.HasLoss() {
					loss = l
				}
				return err
			})
			if err := errors.Join(errs...); err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			sites := tensor.SimTransfers().Sub(before).Sites
			calls := sims.Calls()
			if loss != wantLoss {
				t.Errorf("%s: loss %v, CPU %v", what, loss, wantLoss)
			}
			for i, w := range ws {
				got, want := tensor.ToHost(w.Grad).Float32s(), wantWs[i].Grad.Float32s()
				for j := range want {
					if math.Float32bits(got[j]) != math.Float32bits(want[j]) {
						t.Fatalf("%s: %s grad[%d] = %v, CPU %v", what, w.Name, j, got[j], want[j])
					}
				}
			}
			staged := sites["pp.hostValues"].Out + sites["pp.(*Executor).runStaged"].Out
			if mode == "refused" {
				if calls != 0 || staged == 0 {
					t.Errorf("%s: %d device collectives, %d staged sends", what, calls, staged)
				}
			} else if calls == 0 || staged != 0 {
				t.Errorf("%s: %d device collectives, %d staged sends (%v)", what, calls, staged, sites)
			}
		}
	}
	// a stage expecting another shape is named, in place too
	cfg := Config{PP: 2, Microbatches: 2}
	tm, ws := simToy(2, 2)
	errs := runRanks(t, 2, func(ctx context.Context, pg comm.ProcessGroup) error {
		stages, toys := rankStages(tm, cfg, pg.Rank(), ws)
		if pg.Rank() == 1 {
			toys[0].shape = []int{4, 4}
		}
		e, err := NewExecutor(ExecConfig{Schedule: cfg, Group: comm.NewSimDevice(pg), Stages: stages, Device: tensor.Sim})
		if err != nil {
			return err
		}
		_, err = e.Step(ctx)
		return err
	})
	want := "recv-act c0 m0 from 0: the activation has shape [2 8] but chunk 0 expects [4 4]"
	if errs[1] == nil || !strings.Contains(errs[1].Error(), want) {
		t.Errorf("in place: rank 1: %v, want an error saying %q", errs[1], want)
	}
}
