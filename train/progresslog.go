package train

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/gotron/gotron/ckpt"
)

// ProgressFile is the job log --log-progress appends to, in --save:
// Megatron's progress.txt.
const ProgressFile = "progress.txt"

// progressLog is Megatron's --log-progress job log (append_to_progress_log
// in megatron/training/utils/log_utils.py): world rank 0 appends one
// tab-separated line per event to SAVE/progress.txt,
//
//	2026-11-28 09:12:03\tJob ID: 1234\t# GPUs: 8\tStarting job
//	...\tSaved checkpoint\tIteration: 100\tJob throughput: 1.2 TFLOP/s/GPU\tCumulative throughput: ...
//
// with the time as datetime.now() prints it, SLURM_JOB_ID (empty outside
// Slurm) and the world size. A job that resumes appends to the same file,
// and the cumulative throughput counts from the first "Starting job" of the
// same world size (get_start_time_from_progress_log).
type progressLog struct {
	path  string
	jobID string
	world int
	now   func() time.Time
	// started and startFLOPs are the job's start (New) and the
	// floating-point operations done by then (the loaded checkpoint's):
	// the job throughput counts from them.
	started    time.Time
	startFLOPs float64
}

// append writes one line, as append_to_progress_log does.
func (p *progressLog) append(msg string) error {
	if p == nil {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(p.path), 0o755); err != nil {
		return fmt.Errorf("train: --log-progress: %w", err)
	}
	f, err := os.OpenFile(p.path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("train: --log-progress: %w", err)
	}
	_, err = fmt.Fprintf(f, "%s\tJob ID: %s\t# GPUs: %d\t%s\n", p.now().Format("2006-01-02 15:04:05"), p.jobID, p.world, msg)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("train: --log-progress: %s: %w", p.path, err)
	}
	return nil
}

// saved appends Megatron's line for a checkpoint of iteration it
// (compute_throughputs_and_append_to_progress_log): the job's and the
// cumulative throughput per rank, the floating-point operations so far and
// the tokens trained. prefix is "Saved checkpoint", or "Saving async
// checkpoint" when the save goes on in the background.
func (p *progressLog) saved(prefix string, it int64, flopsSoFar float64, consumed int64, seqLength int) error {
	if p == nil {
		return nil
	}
	now := p.now()
	job := (flopsSoFar - p.startFLOPs) / (now.Sub(p.started).Seconds() * 1e12 * float64(p.world))
	start, startFLOPs, err := p.firstStart()
	if err != nil {
		return err
	}
	cumulative := (flopsSoFar - startFLOPs) / (now.Sub(start).Seconds() * 1e12 * float64(p.world))
	tokens := float64(consumed) * float64(seqLength)
	return p.append(fmt.Sprintf("%s\tIteration: %d\tJob throughput: %s TFLOP/s/GPU\tCumulative throughput: %s TFLOP/s/GPU\tFloating-point operations: %s\tTokens (in billions): %s",
		prefix, it, pyFixed(job, 1), pyFixed(cumulative, 1), pyExp2(flopsSoFar), pyFixed(tokens/1e9, 2)))
}

// firstStart reads the log back as Megatron's get_start_time_from_progress_log:
// the time of the earliest "Starting job" of a run of the same world size
// (a line of another world size restarts the search) and the
// floating-point operations of the checkpoint saved before it.
func (p *progressLog) firstStart() (time.Time, float64, error) {
	f, err := os.Open(p.path)
	if err != nil {
		return time.Time{}, 0, fmt.Errorf("train: --log-progress: %w", err)
	}
	defer f.Close()
	var (
		start           time.Time
		found           bool
		startFLOPs      float64
		latestFLOPs     float64
		uncommitted     float64
		haveUncommitted bool
	)
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		tok := strings.Split(strings.TrimSpace(sc.Text()), "\t")
		bad := func(what string) error {
			return fmt.Errorf("train: --log-progress: %s line %d: %s", p.path, n, what)
		}
		if len(tok) < 4 {
			return time.Time{}, 0, bad("want at least 4 tab-separated fields (time, Job ID, # GPUs, event)")
		}
		world, err := strconv.Atoi(progressField(tok[2]))
		if err != nil {
			return time.Time{}, 0, bad(fmt.Sprintf("%q is not '# GPUs: N'", tok[2]))
		}
		flopsAt := func() (float64, error) {
			if len(tok) < 8 {
				return 0, bad("a checkpoint line needs 8 fields")
			}
			v, err := strconv.ParseFloat(progressField(tok[7]), 64)
			if err != nil {
				return 0, bad(fmt.Sprintf("%q is not 'Floating-point operations: X'", tok[7]))
			}
			return v, nil
		}
		switch tok[3] {
		case "Saved checkpoint":
			if latestFLOPs, err = flopsAt(); err != nil {
				return time.Time{}, 0, err
			}
		case "Saving async checkpoint":
			if uncommitted, err = flopsAt(); err != nil {
				return time.Time{}, 0, err
			}
			haveUncommitted = true
		case "Saved async checkpoint":
			if haveUncommitted {
				latestFLOPs, haveUncommitted = uncommitted, false
			}
		}
		if world != p.world {
			found = false // a job of another size restarts the search
			continue
		}
		if tok[3] == "Starting job" && !found {
			t, err := time.ParseInLocation("2006-01-02 15:04:05", tok[0], time.Local)
			if err != nil {
				return time.Time{}, 0, bad(fmt.Sprintf("%q is not a time", tok[0]))
			}
			start, startFLOPs, found = t, latestFLOPs, true
		}
	}
	if err := sc.Err(); err != nil {
		return time.Time{}, 0, fmt.Errorf("train: --log-progress: %s: %w", p.path, err)
	}
	if !found {
		return time.Time{}, 0, fmt.Errorf("train: --log-progress: %s has no 'Starting job' line of a %d-rank job", p.path, p.world)
	}
	return start, startFLOPs, nil
}

// progressField is the value of a "Name: value" field.
func progressField(s string) string {
	_, v, _ := strings.Cut(s, ": ")
	return v
}

// pyExp2 is Python's format(x, '.2e').
func pyExp2(x float64) string {
	if s, ok := pyNonFinite(x); ok {
		return s
	}
	return strconv.FormatFloat(x, 'e', 2, 64)
}

// retainCheckpoints is Megatron's --save-retain-interval (iter_finalize_fn
// in megatron/training/checkpointing.py): once the checkpoint of iteration
// it is the latest, the previous latest, prev, is deleted unless it is a
// multiple of interval (or iteration 0, or it itself). The checkpoint just
// written and one being written (a temporary directory) are never touched;
// a symbolic link is left alone, as Megatron does. It returns the
// iteration deleted (0 if none).
func retainCheckpoints(root string, prev, it, interval int64, printf func(string, ...any)) (int64, error) {
	if interval <= 0 || prev <= 0 || prev == it || prev%interval == 0 {
		return 0, nil
	}
	dir := filepath.Join(root, ckpt.IterDirName(int(prev)))
	fi, err := os.Lstat(dir)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("train: --save-retain-interval: %w", err)
	}
	if fi.Mode()&os.ModeSymlink != 0 {
		printf("  skipping deleting checkpoint from iteration %7d at %s since it is a symbolic link", prev, root)
		return 0, nil
	}
	if err := os.RemoveAll(dir); err != nil {
		// Megatron ignores a failed deletion; gotron says so and trains on.
		printf("  encountered exception \"%v\" when trying to delete checkpoint from iteration %7d at %s", err, prev, root)
		return 0, nil
	}
	printf("  successfully deleted checkpoint from iteration %7d at %s", prev, root)
	return prev, nil
}
