package train

import (
	"context"
	"errors"
	"testing"

	"github.com/gotron/gotron/comm"
	"github.com/gotron/gotron/comm/commtest"
)

// TestSoloConformance: the process group of a single process passes the
// conformance suite every backend passes, as a world of one rank.
func TestSoloConformance(t *testing.T) {
	if err := commtest.Conformance(context.Background(), solo{}); err != nil {
		t.Fatal(err)
	}
}

// TestSoloGroups: a process alone has every group, each of size 1, and
// collectives over them leave the data as it is.
func TestSoloGroups(t *testing.T) {
	g := soloGroups()
	for name, pg := range map[string]comm.ProcessGroup{"world": g.World, "tp": g.TP, "pp": g.PP, "dp": g.DP,
		"cp": g.CP, "dpcp": g.DPCP, "mp": g.MP, "embedding": g.Embedding} {
		if pg == nil || pg.Size() != 1 || pg.Rank() != 0 {
			t.Fatalf("%s group: %v, want rank 0 of 1", name, pg)
		}
	}
	v := []float32{1.5, -2}
	if err := g.DP.AllReduce(context.Background(), comm.Float32s(v), comm.Sum); err != nil || v[0] != 1.5 || v[1] != -2 {
		t.Fatalf("all-reduce over one rank: %v, %v", v, err)
	}
	if err := g.PP.Send(context.Background(), comm.Float32s(v), 0); err == nil {
		t.Fatal("a send in a world of one succeeded")
	}
	if _, err := g.World.NewGroup([]int{1}); !errors.Is(err, comm.ErrNotMember) {
		t.Fatalf("NewGroup([1]) in a world of one: %v, want ErrNotMember", err)
	}
}

// TestLoneProcessReducesNothing: a process started alone keeps its
// gradients in the parameters (no ddp buckets, no gradient-ready hook on
// the tape), and its groups' collectives cost no allocation.
func TestLoneProcessReducesNothing(t *testing.T) {
	cfg := tinyConfig(t)
	tr, err := New(cfg, MockSource{SeqLength: cfg.SeqLength, VocabSize: cfg.Model.VocabSize}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := tr.stepper.reducer.(localGrads); !ok {
		t.Fatalf("a lone process reduces its gradients with a %T", tr.stepper.reducer)
	}
	if tr.stepper.reducer.readyHook() != nil {
		t.Fatal("a lone process's tape has a gradient-ready hook")
	}
	v := []float32{1, 2, 3}
	ctx := context.Background()
	allocs := testing.AllocsPerRun(100, func() {
		if err := tr.stepper.par.World.AllReduce(ctx, comm.Float32s(v), comm.Sum); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("an all-reduce over one rank allocates %v times", allocs)
	}
}
