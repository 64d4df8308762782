package train

import (
	"fmt"
	"math"
	"strings"
	"testing"
)

// machineRun drives a machine as the stepper does for one iteration whose
// loss is results[k] on the k-th forward pass, and returns the machine's
// decision.
func machineRun(t *testing.T, m *rerunMachine, results ...float64) (passes int, save, exit bool, code int) {
	t.Helper()
	for {
		again, err := m.shouldRunForwardBackward()
		if err != nil {
			t.Fatal(err)
		}
		if !again {
			break
		}
		m.validateLoss(results[min(passes, len(results)-1)])
		passes++
	}
	save, exit, code = m.checkpointAndExit()
	return
}

func TestRerunMachineVerdicts(t *testing.T) {
	for _, tc := range []struct {
		name     string
		cfg      RerunConfig
		losses   []float64 // the failing iteration's passes
		passes   int
		save     bool
		code     int
		wantLogs []string
	}{
		{"transient injected", RerunConfig{Mode: RerunValidateResults, ErrorInjectionRate: 1, ErrorInjectionType: InjectTransientError},
			[]float64{2.5}, 2, false, ExitFailedOnResultValidation,
			[]string{"Injecting error type Transient error", "Unexpected result 2.5 on rank 0 at iteration #2 invocation #1 (message='found NaN in local forward loss calculation')",
				"First rerun: unexpected result is not reproducible within the tolerance", "Possible transient error!", "Exiting now. The job can be resumed from a previous checkpoint"}},
		{"persistent injected", RerunConfig{Mode: RerunValidateResults, ErrorInjectionRate: 1, ErrorInjectionType: InjectPersistentError},
			[]float64{2.5}, 2, true, ExitResumeToDisambiguate,
			[]string{"Injecting error type Persistent error", "First rerun: unexpected result is reproducible within the tolerance (2.5 = 2.5)", "Saving a checkpoint and exiting now"}},
		{"real NaN, reproducible", RerunConfig{Mode: RerunValidateResults},
			[]float64{math.NaN()}, 2, true, ExitResumeToDisambiguate, []string{"Unexpected result NaN", "reproducible within the tolerance (NaN = NaN)"}},
		{"real Inf, then finite", RerunConfig{Mode: RerunValidateResults},
			[]float64{math.Inf(1), 2.5}, 2, false, ExitFailedOnResultValidation, []string{"(message='found Inf in local forward loss calculation')", "Possible transient error!"}},
		{"no error", RerunConfig{Mode: RerunValidateResults}, []float64{2.5}, 1, false, 0, nil},
		{"disabled", RerunConfig{}, []float64{math.NaN()}, 1, false, 0, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var log strings.Builder
			m := newRerunMachine(tc.cfg, 0, "nodeA", 0, 1, func(f string, a ...any) { fmt.Fprintf(&log, f+"\n", a...) })
			saves, restores := 0, 0
			m.saveState, m.restoreState = func() { saves++ }, func() { restores++ }
			// The first iteration is never validated (nor injected into).
			if p, _, exit, _ := machineRun(t, m, math.NaN()); p != 1 || exit {
				t.Fatalf("first iteration: %d passes, exit %v", p, exit)
			}
			passes, save, exit, code := machineRun(t, m, tc.losses...)
			if passes != tc.passes || save != tc.save || code != tc.code || exit != (tc.code != 0) {
				t.Fatalf("passes %d save %v exit %v code %d, want %d %v %d\n%s", passes, save, exit, code, tc.passes, tc.save, tc.code, log.String())
			}
			if tc.cfg.enabled() && (saves != 2 || restores != 2*(passes-1)) {
				t.Errorf("state saved %d times, restored %d", saves, restores)
			}
			for _, w := range tc.wantLogs {
				if !strings.Contains(log.String(), w) {
					t.Errorf("log lacks %q:\n%s", w, log.String())
				}
			}
		})
	}
}
