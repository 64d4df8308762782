package launch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
)

// Worker is one in-process rank. It should return when ctx is cancelled.
// Output written to stdout and stderr is prefixed with the rank, line by line.
type Worker func(ctx context.Context, e Env, stdout, stderr io.Writer) error

// RunInProcess runs cfg.NProcPerNode ranks of this node as goroutines of the
// calling process, each calling w with its Env (the same values Run gives a
// worker process). When one returns an error (or panics) the others' context
// is cancelled; the group is restarted up to cfg.MaxRestarts times, and
// otherwise the first failure is returned as a *WorkerError. A signal from
// cfg.Signals or a cancelled ctx cancels every rank and returns an error
// wrapping ErrInterrupted. cfg.Command and cfg.Environ are ignored.
func RunInProcess(ctx context.Context, cfg Config, w Worker) error {
	c, err := cfg.validate()
	if err != nil {
		return err
	}
	return c.rounds(func(restart int) (bool, error) { return c.inprocGroup(ctx, restart, w) })
}

func (c Config) inprocGroup(parent context.Context, restart int, w Worker) (retry bool, err error) {
	ctx, cancel := context.WithCancelCause(parent)
	defer cancel(nil)
	stdout, stderr := &LockedWriter{W: c.Stdout}, &LockedWriter{W: c.Stderr}
	var (
		mu     sync.Mutex // protects first
		first  *WorkerError
		wg     sync.WaitGroup
		signal = make(chan error, 1)
	)
	for i := range c.NProcPerNode {
		e := c.workerEnv(i, restart)
		prefix := fmt.Sprintf("[rank%d]: ", e.Rank)
		out, errw := NewPrefixWriter(stdout, prefix), NewPrefixWriter(stderr, prefix)
		wg.Go(func() {
			err := runWorker(ctx, w, e, out, errw)
			out.Flush()
			errw.Flush()
			if err == nil {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if first == nil && ctx.Err() == nil {
				first = &WorkerError{Rank: e.Rank, LocalRank: e.LocalRank, Err: err}
				cancel(first)
			}
		})
	}
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	for {
		select {
		case <-finished:
			select {
			case err := <-signal:
				return false, err
			default:
			}
			if parent.Err() != nil && first == nil {
				return false, fmt.Errorf("%w (%v)", ErrInterrupted, context.Cause(parent))
			}
			if first != nil {
				return true, first
			}
			return false, nil
		case sig := <-c.Signals:
			select {
			case signal <- fmt.Errorf("%w by signal %v", ErrInterrupted, sig):
			default:
			}
			cancel(errors.New("launch: signal " + sig.String()))
		}
	}
}

// runWorker calls w, turning a panic into an error.
func runWorker(ctx context.Context, w Worker, e Env, stdout, stderr io.Writer) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic: %v", r)
		}
	}()
	return w(ctx, e, stdout, stderr)
}
