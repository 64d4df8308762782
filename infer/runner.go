package infer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
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
	eng  *Engine
	wake chan struct{} // capacity 1: work arrived

	mu      sync.Mutex // protects the fields below
	inbox   []*Stream  // submitted, not yet added to the engine
	cancels []*Stream  // cancelled by their callers
	closed  bool
	stats   Stats
}

// NewRunner wraps e, which only the runner's Run may touch from now on.
func NewRunner(e *Engine) *Runner {
	return &Runner{eng: e, wake: make(chan struct{}, 1), stats: e.Stats()}
}

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
	if err := r.eng.Validate(req); err != nil {
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
	for {
		r.admit(live)
		if !r.eng.HasWork() {
			select {
			case <-r.wake:
				continue
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		evs, err := r.step()
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
	return r.eng.Step()
}

// admit applies cancellations and adds submitted requests to the engine.
func (r *Runner) admit(live map[SeqID]*Stream) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range r.cancels {
		if s.added {
			if r.eng.Cancel(s.id) {
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
		id, err := r.eng.Add(s.req)
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
		r.eng.Cancel(id)
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
