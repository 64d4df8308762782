package train

import (
	"strings"
	"sync"
	"testing"

	"github.com/gotron/gotron/comm/inproc"
	"github.com/gotron/gotron/parallel"
	"github.com/gotron/gotron/tensor"
)

// TestValidateRLParallel: the RL step runs data- and tensor-parallel and
// refuses pipeline and context parallelism, and sequence parallelism,
// naming the sizes.
func TestValidateRLParallel(t *testing.T) {
	for _, c := range []struct {
		layout parallel.Config
		sp     bool
		want   string // "" accepted
	}{
		{parallel.Config{}, false, ""},
		{parallel.Config{TP: 2}, false, ""},
		{parallel.Config{TP: 2}, true, "--sequence-parallel (TP=2)"},
		{parallel.Config{PP: 2}, false, "(PP=2, CP=1)"},
		{parallel.Config{CP: 2}, false, "(PP=1, CP=2)"},
	} {
		pgs, err := inproc.NewWorld(2)
		if err != nil {
			t.Fatal(err)
		}
		errs := make([]error, len(pgs))
		var wg sync.WaitGroup
		for r, pg := range pgs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				g, err := parallel.NewGroups(pg, c.layout)
				if err != nil {
					errs[r] = err
					return
				}
				cfg := Config{Parallel: g, Device: tensor.CPU, SequenceParallel: c.sp}
				errs[r] = cfg.validateRL()
			}()
		}
		wg.Wait()
		for r, err := range errs {
			switch {
			case c.want == "" && err != nil:
				t.Errorf("%+v rank %d: %v", c.layout, r, err)
			case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
				t.Errorf("%+v rank %d: error %v, want one naming %q", c.layout, r, err, c.want)
			}
		}
	}
}
