package train

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/pprof"
)

// Profile is Megatron's --profile with --profile-step-start and
// --profile-step-end, as a Go CPU profile: Megatron starts its profiler
// (the nsys capture range, or PyTorch's) at the top of the iteration that
// follows StepStart completed iterations and stops it once StepEnd are
// complete, so iterations StepStart+1 to StepEnd are profiled. gotron
// writes the CPU profile of those iterations (runtime/pprof's gzipped
// protobuf, for go tool pprof) to Path.
type Profile struct {
	// Path is the file this process writes; "" profiles nothing (no
	// --profile, or a rank of a launch --inproc job other than rank 0:
	// the CPU profile is the process's).
	Path               string
	StepStart, StepEnd int64
	// Log receives the line saying where the profile went (every
	// profiling process's, e.g. its stderr); nil: the run's log.
	Log io.Writer
}

// stepProfiler runs one Profile over a Run.
type stepProfiler struct {
	cfg     Profile
	out     *os.File
	from    int64 // the first iteration profiled
	printf  func(string, ...any)
	running bool
}

// beforeIteration starts the profile when done iterations are complete
// and done is StepStart.
func (p *stepProfiler) beforeIteration(done int64) error {
	if p == nil || p.cfg.Path == "" || p.running || done != p.cfg.StepStart {
		return nil
	}
	if dir := filepath.Dir(p.cfg.Path); dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("train: --profile: %w", err)
		}
	}
	out, err := os.Create(p.cfg.Path)
	if err != nil {
		return fmt.Errorf("train: --profile: %w", err)
	}
	if err := pprof.StartCPUProfile(out); err != nil {
		out.Close()
		return fmt.Errorf("train: --profile %s: %w", p.cfg.Path, err)
	}
	p.out, p.from, p.running = out, done+1, true
	return nil
}

// afterIteration stops the profile once done iterations are complete and
// done is StepEnd.
func (p *stepProfiler) afterIteration(done int64) error {
	if p == nil || !p.running || done != p.cfg.StepEnd {
		return nil
	}
	return p.stop(done)
}

// stop ends a running profile after iteration last (the end of the run when
// it comes before StepEnd) and says where it is.
func (p *stepProfiler) stop(last int64) error {
	if p == nil || !p.running {
		return nil
	}
	pprof.StopCPUProfile()
	p.running = false
	if err := p.out.Close(); err != nil {
		return fmt.Errorf("train: --profile %s: %w", p.cfg.Path, err)
	}
	short := ""
	if last < p.cfg.StepEnd {
		short = fmt.Sprintf(" (the run ended before --profile-step-end %d)", p.cfg.StepEnd)
	}
	p.printf("--profile: Go CPU profile of iterations %d to %d%s written to %s (go tool pprof %s)", p.from, last, short, p.cfg.Path, p.cfg.Path)
	return nil
}
