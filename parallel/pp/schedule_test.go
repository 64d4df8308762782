package pp

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
)

// validConfigs lists every valid configuration with PP ≤ maxPP, VPP ≤ maxV,
// M ≤ maxM and every group size (0 for the default, then 1..M).
func validConfigs(maxPP, maxV, maxM int) []Config {
	var out []Config
	for p := 1; p <= maxPP; p++ {
		for v := 0; v <= maxV; v++ {
			for m := 1; m <= maxM; m++ {
				for g := 0; g <= m; g++ {
					c := Config{PP: p, VPP: v, Microbatches: m, GroupSize: g}
					if c.Validate() == nil && (g == 0 || c.Kind() == Interleaved) {
						out = append(out, c)
					}
				}
			}
		}
	}
	return out
}

// compute returns the forward and backward passes of a list, in order.
func compute(list []Action) []Action {
	var out []Action
	for _, a := range list {
		if a.Op.Compute() {
			out = append(out, a)
		}
	}
	return out
}

// countPhases reads warm-up, steady and cool-down lengths off a list's
// passes: forwards only, then strictly alternating forward-backward pairs,
// then backwards only. A list whose forwards all precede its backwards is
// read as all warm-up; a warm-up of Total−1 followed by one steady pair
// looks the same, so want is normalised the same way.
func countPhases(t *testing.T, passes []Action, want Phases) (got, norm Phases) {
	t.Helper()
	total := len(passes) / 2
	lead := 0
	for lead < len(passes) && passes[lead].Op == Forward {
		lead++
	}
	w := lead - 1
	if lead == total {
		w = total
	}
	i, s := w, 0
	for i+1 < len(passes) && passes[i].Op == Forward && passes[i+1].Op == Backward {
		s++
		i += 2
	}
	for j := i; j < len(passes); j++ {
		if passes[j].Op != Backward {
			t.Fatalf("pass %d is %v after the steady phase: %v", j, passes[j], passes)
		}
	}
	if want.Steady == 1 && want.Warmup == want.Total-1 {
		want = Phases{Total: want.Total, Warmup: want.Total, Cooldown: want.Total}
	}
	return Phases{Total: total, Warmup: w, Steady: s, Cooldown: len(passes) - i}, want
}

// Megatron's get_forward_backward_func: PP=1 → no pipelining; PP>1 with a
// virtual size → interleaved; otherwise 1F1B. A virtual size of 1 is
// Megatron's "None".
func TestGetForwardBackwardFuncPicksTheSchedule(t *testing.T) {
	for _, c := range []struct {
		cfg  Config
		want Kind
	}{
		{Config{Microbatches: 4}, NoPipelining},
		{Config{PP: 1, VPP: 1, Microbatches: 4}, NoPipelining},
		{Config{PP: 2, Microbatches: 4}, OneFOneB},
		{Config{PP: 2, VPP: 1, Microbatches: 4}, OneFOneB},
		{Config{PP: 2, VPP: 2, Microbatches: 4}, Interleaved},
	} {
		if got := c.cfg.Kind(); got != c.want {
			t.Errorf("%+v: %v, want %v", c.cfg, got, c.want)
		}
	}
}

// forward_backward_no_pipelining runs forward then backward per
// micro-batch, with nothing to send.
func TestNoPipeliningIsGradientAccumulation(t *testing.T) {
	got, err := Actions(Config{Microbatches: 3}, 0)
	if err != nil {
		t.Fatal(err)
	}
	want := []Action{{Forward, 0, 0, 0}, {Backward, 0, 0, 0}, {Forward, 0, 1, 0}, {Backward, 0, 1, 0},
		{Forward, 0, 2, 0}, {Backward, 0, 2, 0}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %v\nwant %v", got, want)
	}
}

// 1F1B: warmup = min(PP − rank − 1, M), steady = M − warmup, cooldown =
// warmup; backwards run oldest micro-batch first.
func TestOneFOneBWarmupIsPPMinusRankMinusOneCappedAtM(t *testing.T) {
	for _, c := range []struct {
		pp, m  int
		warmup []int // by rank
	}{
		{2, 1, []int{1, 0}},
		{2, 3, []int{1, 0}},
		{4, 1, []int{1, 1, 1, 0}},
		{4, 3, []int{3, 2, 1, 0}},
		{4, 2, []int{2, 2, 1, 0}},
		{4, 8, []int{3, 2, 1, 0}},
	} {
		cfg := Config{PP: c.pp, Microbatches: c.m}
		for r, w := range c.warmup {
			ph, err := RankPhases(cfg, r)
			if err != nil {
				t.Fatal(err)
			}
			want := Phases{Total: c.m, Warmup: w, Steady: c.m - w, Cooldown: w}
			if ph != want {
				t.Errorf("PP=%d M=%d rank %d: %+v, want %+v", c.pp, c.m, r, ph, want)
			}
		}
	}
	for _, cfg := range validConfigs(6, 1, 10) {
		c := cfg.withDefaults()
		for r := range c.PP {
			list, _ := Actions(cfg, r)
			passes := compute(list)
			want, _ := RankPhases(cfg, r)
			if c.Kind() == OneFOneB && want.Warmup != min(c.PP-r-1, c.Microbatches) {
				t.Errorf("%+v rank %d: warmup %d", cfg, r, want.Warmup)
			}
			if got, want := countPhases(t, passes, want); got != want {
				t.Errorf("%+v rank %d: list has phases %+v, RankPhases says %+v", cfg, r, got, want)
			}
			var f, b int
			for _, a := range passes {
				n := &f
				if a.Op == Backward {
					n = &b
				}
				if a.Chunk != 0 || a.Microbatch != *n {
					t.Fatalf("%+v rank %d: %v out of micro-batch order", cfg, r, a)
				}
				*n++
			}
		}
	}
}

// Megatron's 1F1B steady step (forward_backward_pipelining_without_interleaving
// in megatron/core/pipeline_parallel/schedules.py): forward,
// send-forward-recv-backward, backward,
// send-backward-recv-forward (the last step only sends backward). Within a
// call, Megatron's unbatched order: even ranks send the activation before
// receiving one, odd ranks receive it first; both receive an activation
// before sending a gradient back.
func TestOneFOneBStepOrderFollowsMegatron(t *testing.T) {
	got, _ := Schedule(Config{PP: 3, Microbatches: 3})
	f := func(mb int) Action { return Action{Op: Forward, Microbatch: mb} }
	b := func(mb int) Action { return Action{Op: Backward, Microbatch: mb} }
	sa := func(mb, to int) Action { return Action{Op: SendActivation, Microbatch: mb, Peer: to} }
	ra := func(mb, from int) Action { return Action{Op: RecvActivation, Microbatch: mb, Peer: from} }
	sg := func(mb, to int) Action { return Action{Op: SendGrad, Microbatch: mb, Peer: to} }
	rg := func(mb, from int) Action { return Action{Op: RecvGrad, Microbatch: mb, Peer: from} }
	want := [][]Action{
		// rank 0: warmup 2, steady 1, cooldown 2; nothing to receive from or send back to a previous rank.
		{f(0), sa(0, 1), f(1), sa(1, 1), f(2), sa(2, 1), rg(0, 1), b(0), rg(1, 1), b(1), rg(2, 1), b(2)},
		// rank 1 (odd): warmup 1, steady 2, cooldown 1.
		{ra(0, 0), f(0), sa(0, 2), ra(1, 0), f(1), sa(1, 2), rg(0, 2), b(0), ra(2, 0), sg(0, 0),
			f(2), sa(2, 2), rg(1, 2), b(1), sg(1, 0), rg(2, 2), b(2), sg(2, 0)},
		// rank 2 (last, even): no warmup; sends gradients, receives activations.
		{ra(0, 1), f(0), b(0), ra(1, 1), sg(0, 1), f(1), b(1), ra(2, 1), sg(1, 1), f(2), b(2), sg(2, 1)},
	}
	for r := range want {
		if !reflect.DeepEqual(got[r], want[r]) {
			t.Errorf("rank %d:\n got %v\nwant %v", r, got[r], want[r])
		}
	}
}

// get_schedule_table (megatron/core/pipeline_parallel/schedules.py) on
// Megatron's reference example (PP=2, M=5, VP=2, G=3) and
// ModelParallelConfig's (PP=2, VP=2, G=2, M=4).
func TestScheduleTableMatchesMegatronExamples(t *testing.T) {
	for _, c := range []struct {
		cfg       Config
		mb, chunk string
	}{
		{Config{PP: 2, VPP: 2, Microbatches: 5, GroupSize: 3}, "0 1 2 0 1 2 3 4 3 4", "0 0 0 1 1 1 0 0 1 1"},
		{Config{PP: 2, VPP: 2, Microbatches: 4, GroupSize: 2}, "0 1 0 1 2 3 2 3", "0 0 1 1 0 0 1 1"},
		{Config{PP: 4, VPP: 2, Microbatches: 8}, "0 1 2 3 0 1 2 3 4 5 6 7 4 5 6 7", "0 0 0 0 1 1 1 1 0 0 0 0 1 1 1 1"},
		{Config{PP: 2, VPP: 2, Microbatches: 4, GroupSize: 4}, "0 1 2 3 0 1 2 3", "0 0 0 0 1 1 1 1"},
		{Config{PP: 2, VPP: 3, Microbatches: 5, GroupSize: 3}, "0 1 2 0 1 2 0 1 2 3 4 3 4 3 4", "0 0 0 1 1 1 2 2 2 0 0 1 1 2 2"},
	} {
		tab, err := Table(c.cfg)
		if err != nil {
			t.Fatal(err)
		}
		var mb, ch []string
		for _, s := range tab {
			mb = append(mb, fmt.Sprint(s.Microbatch))
			ch = append(ch, fmt.Sprint(s.Chunk))
		}
		if got := strings.Join(mb, " "); got != c.mb {
			t.Errorf("%+v: micro-batches %s, want %s", c.cfg, got, c.mb)
		}
		if got := strings.Join(ch, " "); got != c.chunk {
			t.Errorf("%+v: chunks %s, want %s", c.cfg, got, c.chunk)
		}
	}
}

// Interleaved: warmup = min(M·VP, 2·(PP − r − 1) + (VP − 1)·G); forward k
// runs Table[k]; backward k runs chunk VP−1−Table[k].Chunk.
func TestInterleavedWarmupIsTwicePPMinusRankMinusOnePlusGroups(t *testing.T) {
	for _, c := range []struct {
		cfg    Config
		warmup []int
	}{
		{Config{PP: 2, VPP: 2, Microbatches: 4}, []int{4, 2}},
		{Config{PP: 2, VPP: 2, Microbatches: 6}, []int{4, 2}},
		{Config{PP: 4, VPP: 2, Microbatches: 8}, []int{10, 8, 6, 4}},
		{Config{PP: 4, VPP: 2, Microbatches: 8, GroupSize: 8}, []int{14, 12, 10, 8}},
		{Config{PP: 4, VPP: 2, Microbatches: 4}, []int{8, 8, 6, 4}},    // rank 0 and 1: every forward in the warm-up
		{Config{PP: 4, VPP: 3, Microbatches: 4}, []int{12, 12, 10, 8}}, // 2·3+2·4 = 14 > 12
	} {
		for r, w := range c.warmup {
			ph, err := RankPhases(c.cfg, r)
			if err != nil {
				t.Fatal(err)
			}
			if ph.Warmup != w || ph.Cooldown != w || ph.Steady != ph.Total-w || ph.Total != c.cfg.Microbatches*c.cfg.VPP {
				t.Errorf("%+v rank %d: %+v, want warmup %d", c.cfg, r, ph, w)
			}
		}
	}
	for _, cfg := range validConfigs(6, 4, 12) {
		c := cfg.withDefaults()
		if c.Kind() != Interleaved {
			continue
		}
		tab := table(c)
		for r := range c.PP {
			list, _ := Actions(cfg, r)
			passes := compute(list)
			want, _ := RankPhases(cfg, r)
			if w := min(c.Microbatches*c.VPP, 2*(c.PP-r-1)+(c.VPP-1)*c.GroupSize); want.Warmup != w {
				t.Errorf("%+v rank %d: warmup %d, want %d", cfg, r, want.Warmup, w)
			}
			if got, want := countPhases(t, passes, want); got != want {
				t.Errorf("%+v rank %d: list has phases %+v, RankPhases says %+v", cfg, r, got, want)
			}
			var f, b int
			for _, a := range passes {
				if a.Op == Forward {
					if s := tab[f]; a.Chunk != s.Chunk || a.Microbatch != s.Microbatch {
						t.Fatalf("%+v rank %d: forward %d is %v, table says %+v", cfg, r, f, a, s)
					}
					f++
					continue
				}
				if s := tab[b]; a.Chunk != c.VPP-1-s.Chunk || a.Microbatch != s.Microbatch {
					t.Fatalf("%+v rank %d: backward %d is %v, table says chunk %d", cfg, r, b, a, c.VPP-1-s.Chunk)
				}
				b++
			}
		}
	}
}

// Megatron refuses a virtual size without pipelining (parallel_state), a
// group size outside [PP, M] and a short last group
// (forward_backward_pipelining_with_interleaving).
func TestValidateRejectsWhatMegatronRejects(t *testing.T) {
	for _, c := range []struct {
		cfg  Config
		want []string
	}{
		{Config{}, []string{"--num-microbatches 0"}},
		{Config{PP: -1, Microbatches: 1}, []string{"--pipeline-model-parallel-size -1"}},
		{Config{VPP: -2, Microbatches: 1}, []string{"--virtual-pipeline-model-parallel-size -2"}},
		{Config{Microbatches: -3}, []string{"--num-microbatches -3"}},
		{Config{PP: 2, VPP: 2, Microbatches: 4, GroupSize: -1}, []string{"--microbatch-group-size-per-virtual-pipeline-stage -1"}},
		{Config{PP: 1, VPP: 2, Microbatches: 4}, []string{"--virtual-pipeline-model-parallel-size 2", "--pipeline-model-parallel-size > 1"}},
		{Config{VPP: 4, Microbatches: 4}, []string{"--virtual-pipeline-model-parallel-size 4"}},
		{Config{PP: 4, VPP: 2, Microbatches: 8, GroupSize: 2}, []string{"--microbatch-group-size-per-virtual-pipeline-stage 2 is outside [--pipeline-model-parallel-size 4, --num-microbatches 8]"}},
		{Config{PP: 4, VPP: 2, Microbatches: 8, GroupSize: 9}, []string{"group-size-per-virtual-pipeline-stage 9 is outside"}},
		{Config{PP: 4, VPP: 2, Microbatches: 3}, []string{"stage 4 (default: --pipeline-model-parallel-size) is outside", "--num-microbatches 3]"}},
		{Config{PP: 4, VPP: 2, Microbatches: 9}, []string{"--num-microbatches 9", "last group of 1 micro-batches", "--pipeline-model-parallel-size 4"}},
		{Config{PP: 3, VPP: 2, Microbatches: 8, GroupSize: 3}, []string{"last group of 2", "stage 3 leaves"}},
	} {
		err := c.cfg.Validate()
		if err == nil {
			t.Errorf("%+v: accepted", c.cfg)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) || !strings.HasPrefix(err.Error(), "pp: ") {
				t.Errorf("%+v: %q does not say %q", c.cfg, err, w)
			}
		}
		if _, err2 := Schedule(c.cfg); err2 == nil || err2.Error() != err.Error() {
			t.Errorf("%+v: Schedule error %v, Validate %v", c.cfg, err2, err)
		}
	}
	for _, ok := range []Config{
		{Microbatches: 1},
		{PP: 1, VPP: 1, Microbatches: 1},
		{PP: 4, Microbatches: 1},
		{PP: 4, VPP: 1, Microbatches: 3, GroupSize: 99}, // G is ignored without interleaving, as in Megatron
		{PP: 4, VPP: 2, Microbatches: 4},
		{PP: 4, VPP: 2, Microbatches: 9, GroupSize: 5}, // last group 4 = PP
		{PP: 4, VPP: 2, Microbatches: 9, GroupSize: 9},
	} {
		if err := ok.Validate(); err != nil {
			t.Errorf("%+v: %v", ok, err)
		}
	}
	if _, err := Actions(Config{PP: 4, Microbatches: 2}, 4); err == nil || !strings.Contains(err.Error(), "rank 4: want a pipeline rank in 0..3") {
		t.Errorf("rank 4 of 4: %v", err)
	}
	if _, err := Actions(Config{PP: 4, Microbatches: 2}, -1); err == nil {
		t.Error("rank -1 accepted")
	}
}

// A virtual size of 1 is no interleaving (Megatron sets it to None), and
// the group size only matters to the interleaved schedule.
func TestVirtualSizeOneIsOneFOneB(t *testing.T) {
	a, _ := Schedule(Config{PP: 3, Microbatches: 5})
	b, _ := Schedule(Config{PP: 3, VPP: 1, Microbatches: 5, GroupSize: 4})
	if !reflect.DeepEqual(a, b) {
		t.Errorf("VPP=1 differs from VPP=0:\n%v\n%v", a, b)
	}
}
