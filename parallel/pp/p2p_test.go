package pp

import (
	"slices"
	"strings"
	"testing"
)

// Megatron's p2p calls, in its unbatched even/odd order, complete with
// blocking sends; so do batched calls, with one in-order channel per pair
// of ranks or one per direction and kind. The simulator also checks that
// every pass runs once, backward after forward, and each pass's input
// arrived from the neighbouring virtual stage first.
func TestP2PCompletesWithBlockingInOrderSends(t *testing.T) {
	n := 0
	for _, cfg := range validConfigs(6, 4, 12) {
		lists, err := Schedule(cfg)
		if err != nil {
			t.Fatal(err)
		}
		for _, mode := range simModes {
			if _, err := simulate(cfg, lists, mode); err != nil {
				t.Errorf("%+v %v: %v", cfg, mode, err)
			}
		}
		n++
	}
	if n < 500 {
		t.Errorf("only %d configurations", n)
	}
}

// max_outstanding_backprops = warmup + 1: no rank ever holds more
// activations than that, and each reaches it.
func TestInFlightIsAtMostMaxOutstandingBackprops(t *testing.T) {
	for _, cfg := range validConfigs(6, 4, 12) {
		lists, _ := Schedule(cfg)
		res, err := simulate(cfg, lists, simModes[0])
		if err != nil {
			t.Fatal(err)
		}
		for r, got := range res.maxInFlight {
			want, _ := MaxInFlight(cfg, r)
			if got != want {
				t.Errorf("%+v rank %d: %d in flight, want %d", cfg, r, got, want)
			}
		}
	}
}

// theoretical_memory_usage.py: 1F1B keeps min(M, PP) micro-batches in
// flight on the first rank; the default interleaved schedule
// PP·(1 + (PP−1)/(PP·VP)) = PP + (PP−1)/VP, counting a chunk as 1/VP of a
// micro-batch.
func TestMaxInFlightMatchesTheoreticalMemory(t *testing.T) {
	for _, cfg := range validConfigs(8, 4, 16) {
		c := cfg.withDefaults()
		got, _ := MaxInFlight(cfg, 0)
		ph, _ := RankPhases(cfg, 0)
		switch {
		case c.Kind() == OneFOneB:
			if got != min(c.Microbatches, c.PP) {
				t.Errorf("%+v: %d, want min(M, PP)", cfg, got)
			}
		case c.Kind() == Interleaved && c.GroupSize == c.PP && !ph.AllWarmup():
			// got/VP = PP + (PP−1)/VP
			if got != c.PP*c.VPP+c.PP-1 {
				t.Errorf("%+v: %d chunks, want PP·VP + PP − 1 = %d", cfg, got, c.PP*c.VPP+c.PP-1)
			}
		case c.Kind() == NoPipelining:
			if got != 1 {
				t.Errorf("%+v: %d, want 1", cfg, got)
			}
		}
	}
}

// The bubble of Narayanan et al. (2021): with backward twice as long as
// forward, every schedule takes (M·VP + PP − 1)·3 units, idle
// (PP − 1)/(VP·M) of its compute time, both when passes start as soon as
// their inputs exist (Timeline) and when sends block (the simulator).
func TestBubbleIsPPMinusOneOverVPTimesM(t *testing.T) {
	for _, cfg := range validConfigs(6, 4, 12) {
		c := cfg.withDefaults()
		want := (c.Microbatches*c.VPP + c.PP - 1) * 3
		spans, err := Timeline(cfg, 1, 2)
		if err != nil {
			t.Fatal(err)
		}
		makespan := 0
		for _, row := range spans {
			makespan = max(makespan, row[len(row)-1].End)
		}
		lists, _ := Schedule(cfg)
		res, err := simulate(cfg, lists, simModes[0])
		if err != nil {
			t.Fatal(err)
		}
		if makespan != want || res.makespan != want {
			t.Errorf("%+v: makespan %d (timeline), %d (blocking sends); want %d", cfg, makespan, res.makespan, want)
		}
		bf, _ := BubbleFraction(cfg)
		idle, busy := c.PP*(want-c.Microbatches*c.VPP*3), c.PP*c.Microbatches*c.VPP*3
		if bf != float64(idle)/float64(busy) {
			t.Errorf("%+v: bubble %v, measured %d/%d", cfg, bf, idle, busy)
		}
	}
	if bf, _ := BubbleFraction(Config{PP: 4, VPP: 2, Microbatches: 8}); bf != 3.0/16 {
		t.Errorf("PP=4 VP=2 M=8: bubble %v, want 3/16", bf)
	}
	if _, err := Timeline(Config{Microbatches: 1}, 0, 2); err == nil {
		t.Error("Timeline accepted 0 forward units")
	}
}

// The simulator itself must catch what it claims to check: each broken
// list below fails with the given message.
func TestSimulatorCatchesBrokenLists(t *testing.T) {
	find := func(list []Action, op Op) int {
		return slices.IndexFunc(list, func(a Action) bool { return a.Op == op })
	}
	for _, c := range []struct {
		name string
		cfg  Config
		edit func(lists [][]Action)
		mode simMode
		want string
	}{
		{"odd rank sends its gradient before receiving", Config{PP: 3, Microbatches: 3}, func(l [][]Action) {
			i := find(l[1], SendGrad) // preceded by the receive of the next activation
			l[1][i-1], l[1][i] = l[1][i], l[1][i-1]
		}, simModes[0], "deadlock"},
		{"dropped receive", Config{PP: 3, VPP: 2, Microbatches: 3}, func(l [][]Action) {
			i := find(l[2], RecvGrad)
			l[2] = slices.Delete(l[2], i, i+1)
		}, simModes[1], "before its output gradient arrived"},
		{"dropped last send", Config{PP: 3, VPP: 2, Microbatches: 3}, func(l [][]Action) {
			i := len(l[2]) - 1 // rank 2's last gradient, which rank 1 waits for
			for l[2][i].Op != SendGrad {
				i--
			}
			l[2] = slices.Delete(l[2], i, i+1)
		}, simModes[1], "deadlock"},
		{"backward before forward", Config{PP: 2, Microbatches: 2}, func(l [][]Action) {
			i, j := find(l[1], Forward), find(l[1], Backward)
			l[1][i], l[1][j] = l[1][j], l[1][i]
		}, simModes[0], "before its forward"},
		{"forward before its input", Config{PP: 2, Microbatches: 2}, func(l [][]Action) {
			i := find(l[1], RecvActivation)
			l[1][i], l[1][i+1] = l[1][i+1], l[1][i]
		}, simModes[0], "before its input activation arrived"},
		{"forward twice", Config{PP: 2, VPP: 2, Microbatches: 2}, func(l [][]Action) {
			i := find(l[0], Forward)
			l[0] = slices.Insert(l[0], i, l[0][i])
		}, simModes[1], "twice"},
		{"wrong micro-batch", Config{PP: 2, Microbatches: 2}, func(l [][]Action) {
			l[1][find(l[1], RecvActivation)].Microbatch = 1
		}, simModes[0], "not the neighbouring stage's tensor"},
		{"kinds crossed on one channel", Config{PP: 2, VPP: 2, Microbatches: 4}, func(l [][]Action) {
			i := find(l[0], SendGrad) // in a steady call, after the activation send
			k := i - 1
			for l[0][k].Op != SendActivation {
				k--
			}
			l[0][k], l[0][i] = l[0][i], l[0][k]
		}, simMode{batched: true, oneChannel: true}, "kinds differ"},
	} {
		lists, _ := Schedule(c.cfg)
		c.edit(lists)
		_, err := simulate(c.cfg, lists, c.mode)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error saying %q", c.name, err, c.want)
		}
	}
}
