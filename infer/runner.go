package infer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"
)

// ErrClosed is returned by Submit after the runner stopped, and by a
// stream's Next when the runner stopped before the sequence finished.
var ErrClosed = errors.New("infer: runner closed")

// Runner drives an Engine on one goroutine (Run): the goroutine wrapper
// around the synchronous core, as raft's node wraps its RawNode. Between
// steps it takes new requests and cancellations; after each step it hands
// every event to its request's Stream. Submit, Stats and the streams are
// safe for concurrent use; nothing they do waits for a step.
type Runner struct {
	eng *Engine
	// drive is what Run adds, cancels and steps through: eng, or the
	// Lockstep over the tensor-parallel group's engines (ls).
	drive interface {
		Add(Request) (SeqID, error)
		Cancel(SeqID) bool
		Step() ([]Event, error)
		HasWork() bool
	}
	ls        *Lockstep
	keepAlive time.Duration // with ls: the idle leader's keep-alive period
	wake      chan struct{} // capacity 1: work arrived

	mu      sync.Mutex // protects the fields below
	inbox   []*Stream  // submitted, not yet added to the engine
	cancels []*Stream  // cancelled by their callers
	closed  bool
	stats   Stats
}

// NewRunner wraps e, which only the runner's Run may touch from now on.
func NewRunner(e *Engine) *Runner {
	return &Runner{eng: e, drive: e, wake: make(chan struct{}, 1), stats: e.Stats()}
}

// NewLockstepRunner is NewRunner for rank 0 of a tensor-parallel group:
// its steps go through ls, so every rank's engine runs them (the others
// run Follow). While idle it sends a keep-alive every keepAlive (0:
// LockstepKeepAlive), since the followers wait inside a collective, which
// times out; a failed step or keep-alive ends Run with the error, every
// request aborted with it (the group can no longer step), and Run's end
// closes ls.
func NewLockstepRunner(ls *Lockstep, keepAlive time.Duration) *Runner {
	r := NewRunner(ls.eng)
	r.drive, r.ls, r.keepAlive = ls, ls, keepAlive
	if r.keepAlive <= 0 {
		r.keepAlive = LockstepKeepAlive
	}
	return r
}

// LockstepKeepAlive is how often an idle NewLockstepRunner tells the
// followers it is alive: well inside any collective timeout (gotron
// launch --inproc's 60 s, tcp's minutes).
const LockstepKeepAlive = 5 * time.Second

// Engine returns the wrapped engine, for its configuration (Config,
// MaxTokens and Validate are safe while Run runs; nothing else is).
func (r *Runner) Engine() *Engine { return r.eng }

// Stream is one request's events, in order; the last one has Finish set.
type Stream struct {
	r   *Runner
	req Request
	id  SeqID // set when added (under r.mu)

	added, cancelled bool // under r.mu

	mu     sync.Mutex // protects the fields below
	events []Event
	done   bool  // the final event is queued
	err    error // why the stream ended early (ErrClosed, a step error)
	notify chan struct{}
}

// Submit validates req (Engine.Validate's errors) and queues it. Its events
// arrive on the returned stream; Cancel, or ctx ending, cancels it.
func (r *Runner) Submit(ctx context.Context, req Request) (*Stream, error) {
	if err := r.eng.Validate(req); err != nil { // reads only the fixed configuration
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s := &Stream{r: r, req: req, notify: make(chan struct{}, 1)}
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil, ErrClosed
	}
	r.inbox = append(r.inbox, s)
	r.mu.Unlock()
	r.poke()
	context.AfterFunc(ctx, s.Cancel)
	return s, nil
}

func (r *Runner) poke() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// Cancel ends the request: its blocks are freed before the next step and
// the stream ends with a FinishAbort event unless it already finished.
func (s *Stream) Cancel() {
	r := s.r
	r.mu.Lock()
	if !s.cancelled {
		s.cancelled = true
		r.cancels = append(r.cancels, s)
	}
	r.mu.Unlock()
	r.poke()
}

// Next returns the next event, waiting for it; after the final event it
// returns io.EOF. It returns ctx's error when ctx ends first (the request
// goes on: Cancel stops it) and ErrClosed when the runner stopped.
func (s *Stream) Next(ctx context.Context) (Event, error) {
	for {
		s.mu.Lock()
		if len(s.events) > 0 {
			ev := s.events[0]
			s.events = s.events[1:]
			s.mu.Unlock()
			return ev, nil
		}
		done, err := s.done, s.err
		s.mu.Unlock()
		if err != nil {
			return Event{}, err
		}
		if done {
			return Event{}, io.EOF
		}
		select {
		case <-s.notify:
		case <-ctx.Done():
			return Event{}, ctx.Err()
		}
	}
}

// push queues ev (the runner's goroutine only).
func (s *Stream) push(ev Event) {
	s.mu.Lock()
	if !s.done {
		s.events = append(s.events, ev)
		s.done = ev.Finish != ""
	}
	s.mu.Unlock()
	select {
	case s.notify <- struct{}{}:
	default:
	}
}

// end finishes the stream with an abort event and err (nil: a plain
// cancellation).
func (s *Stream) end(err error) {
	s.mu.Lock()
	if !s.done {
		s.events = append(s.events, Event{Seq: s.id, Token: -1, Finish: FinishAbort})
		s.done = true
		s.err = err
	}
	s.mu.Unlock()
	select {
	case s.notify <- struct{}{}:
	default:
	}
}

// Stats returns the engine's counters as of the last step. They are taken
// before the step's events are delivered, so once a stream has its final
// event, Stats no longer counts its sequence or its blocks.
func (r *Runner) Stats() Stats {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stats
}

// Run steps the engine until ctx ends, then aborts every request still
// queued or running (their streams end with ErrClosed) and returns ctx's
// error. A failed step aborts the sequences it held and Run goes on. Call
// Run once.
func (r *Runner) Run(ctx context.Context) error {
	live := map[SeqID]*Stream{}
	defer r.shutdown(live)
	var keepAlive <-chan time.Time
	if r.ls != nil {
		t := time.NewTicker(r.keepAlive)
		defer t.Stop()
		keepAlive = t.C
	}
	for {
		r.admit(live)
		if !r.drive.HasWork() {
			select {
			case <-r.wake:
				continue
			case <-keepAlive:
				if err := r.ls.KeepAlive(); err != nil {
					return r.fail(live, err)
				}
				continue
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		evs, err := r.step()
		if err != nil && r.ls != nil {
			return r.fail(live, err) // the group is out of step: nothing more can run
		}
		var failed []*Stream
		if err != nil && evs == nil { // a panic: abort everything in flight
			for id, s := range live {
				r.eng.Cancel(id)
				failed = append(failed, s)
				delete(live, id)
			}
		}
		// The counters before the events: a caller holding a request's
		// final event sees its blocks freed in Stats.
		r.mu.Lock()
		r.stats = r.eng.Stats()
		r.mu.Unlock()
		for _, s := range failed {
			s.end(err)
		}
		// After a step error the step's sequences get abort events; the
		// engine goes on.
		for _, ev := range evs {
			s := live[ev.Seq]
			if s == nil {
				continue
			}
			s.push(ev)
			if ev.Finish != "" {
				delete(live, ev.Seq)
			}
		}
	}
}

// step runs one engine step, turning a panic (a bug, or a model that does
// not fit its own configuration) into an error with no events, so one bad
// step cannot take the server down.
func (r *Runner) step() (evs []Event, err error) {
	defer func() {
		if p := recover(); p != nil {
			evs, err = nil, fmt.Errorf("infer: step panicked: %v", p)
		}
	}()
	return r.drive.Step()
}

// fail ends every live request with err and returns err (a tensor-parallel
// group that failed: Run ends).
func (r *Runner) fail(live map[SeqID]*Stream, err error) error {
	for id, s := range live {
		r.drive.Cancel(id)
		s.end(err)
		delete(live, id)
	}
	return err
}

// admit applies cancellations and adds submitted requests to the engine.
func (r *Runner) admit(live map[SeqID]*Stream) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range r.cancels {
		if s.added {
			if r.drive.Cancel(s.id) {
				delete(live, s.id)
			}
		}
		s.end(nil)
	}
	r.cancels = r.cancels[:0]
	for _, s := range r.inbox {
		if s.cancelled {
			continue
		}
		id, err := r.drive.Add(s.req)
		if err != nil { // Validate passed, so this is not expected
			s.end(err)
			continue
		}
		s.id, s.added = id, true
		live[id] = s
	}
	r.inbox = r.inbox[:0]
	r.stats = r.eng.Stats()
}

// shutdown aborts everything left when Run returns.
func (r *Runner) shutdown(live map[SeqID]*Stream) {
	r.mu.Lock()
	r.closed = true
	pending := append(r.inbox, r.cancels...)
	r.inbox, r.cancels = nil, nil
	r.mu.Unlock()
	for id := range live {
		r.drive.Cancel(id)
	}
	if r.ls != nil {
		r.ls.Close() // the followers end (after a failure it sends nothing)
	}
	r.mu.Lock()
	r.stats = r.eng.Stats()
	r.mu.Unlock()
	for _, s := range pending {
		s.end(ErrClosed)
	}
	for _, s := range live {
		s.end(ErrClosed)
	}
}
