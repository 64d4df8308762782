package pp

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/gotron/gotron/comm"
	"github.com/gotron/gotron/tensor"
)

// Stage is one model chunk as the executor runs it: a small seam, so that
// any model (GPT's gpt.StageRunner, or a test's toy) can be pipelined.
type Stage interface {
	// Forward records the chunk's forward pass of micro-batch mb on tp and
	// returns its output: the activation for the next virtual stage or, on
	// the model's last stage, the micro-batch's loss as a one-element tensor
	// (not yet divided by the number of micro-batches; the executor does
	// that). in is the activation received from the previous virtual stage,
	// a leaf that requires its gradient; it is nil on the model's first
	// stage. tp carries Step's context, and a failure of the tape
	// functions (tensor-parallel collectives) recorded on tp ends the step
	// as a returned error does: the executor checks tp.Err after each
	// forward pass, and the backward pass returns it.
	Forward(tp *tensor.Tape, mb int, in *tensor.Tensor) (*tensor.Tensor, error)
	// InputShape is the shape of the activation micro-batch mb receives
	// (Megatron's tensor_shape; (b, t, h) for a transformer). The model's
	// first stage is never asked.
	InputShape(mb int) []int
}

// ExecConfig configures an Executor for one pipeline rank.
type ExecConfig struct {
	// Schedule is the pipeline's schedule configuration (PP, VPP, M, G).
	Schedule Config
	// Group is the pipeline group: its rank is the pipeline rank and its
	// size Schedule.PP. It may be nil when PP is 1.
	Group comm.ProcessGroup
	// Stages are this rank's model chunks, Stages[c] for chunk c (VPP of
	// them).
	Stages []Stage
	// Actions is the list the executor follows each step; nil means
	// Actions(Schedule, rank). Any list that keeps the package contract
	// (every forward and backward once, sends matching the neighbours'
	// receives) runs; the benchmark passes an all-forward-then-backward one.
	Actions []Action
	// NewTape makes the tape for one in-flight micro-batch of chunk (the
	// caller sets matmul precision and gradient-ready hooks there); nil
	// means tensor.NewTape. A tape is only ever reused for the same chunk,
	// so its gradient-ready plan sees the same graph every time.
	NewTape func(chunk int) *tensor.Tape
	// LastBackward, if set, is called just before the backward pass of a
	// chunk's last micro-batch in the step (Megatron enables the chunk's
	// gradient reduction there, so buckets reduce while it runs).
	LastBackward func(chunk int)
	// AfterBackward, if set, is called after each backward pass of a
	// chunk's micro-batch; an error ends the step (the delayed FP8
	// recipe's scale update, train/pipeline.go).
	AfterBackward func(chunk int) error
	// Unbatched posts each send and receive alone, in list order (Megatron's
	// even/odd p2p order), instead of each run of consecutive ones as one
	// comm.BatchSendRecv call. Groups without BatchSendRecv are always
	// unbatched.
	Unbatched bool
	// LossScale, if set, is read at every forward of the model's last stage:
	// backward is seeded by loss·LossScale()·w (fp16 loss scaling), while
	// Step still returns the unscaled objective.
	LossScale func() float32
	// LossWeight, if set, is micro-batch mb's weight w in the step's
	// objective Σ w·loss; nil means 1/M, the mean over the micro-batches
	// (Megatron divides each loss by num_microbatches in forward_step).
	// Megatron's --calculate-per-token-loss weighs each micro-batch's mean
	// loss by its number of unmasked tokens instead, making the objective
	// the sum of the token losses.
	LossWeight func(mb int) float32
	// Now is the clock of Stats; nil means time.Now.
	Now func() time.Time
	// Device is where the stages compute: their inputs, outputs and
	// gradients live there. The zero value is the CPU, where sends and
	// receives use the tensors' own storage. On another device they move
	// in place when Group offers comm.DeviceCollectives for them
	// (comm/nccl on CUDA, comm.SimDevice on sim); otherwise they are
	// staged through host buffers with the tensor package's explicit
	// copies (copy out and send; receive and copy in).
	Device tensor.Device
}

// Stats are one step's measurements on this rank. The zero value is a
// step that did nothing.
type Stats struct {
	// Step is the wall time of the whole Step.
	Step time.Duration
	// Forward and Backward are the time spent in the passes; Comm the time
	// spent in sends and receives (waiting for neighbours included).
	Forward, Backward, Comm time.Duration
	// P2P splits Comm by the kind of exchange, under the names of
	// Megatron's p2p_communication timers (P2PTimerName).
	P2P map[string]time.Duration
	// PeakInFlight is the most (chunk, micro-batch) pairs held at once with
	// the forward done and the backward not: live tapes, each holding one
	// micro-batch's activations.
	PeakInFlight int
	// Tapes is the number of tapes made so far (over all steps). A tape is
	// reset after its micro-batch's backward and reused by the same chunk,
	// so this is, summed over chunks, the most micro-batches each chunk had
	// in flight at once.
	Tapes int
}

// P2PTimerName names an exchange (a run of send and receive actions done
// together) as Megatron's p2p_communication times the call that does the
// same: "forward-recv" (recv_forward), "forward-send", "backward-recv",
// "backward-send", "forward-send-backward-recv"
// (send_forward_recv_backward), "backward-send-forward-recv",
// "forward-send-forward-recv", "backward-send-backward-recv" and
// "forward-backward-send-forward-backward-recv". A combination Megatron
// has no call for gets a name in the same pattern (e.g.
// "forward-backward-send"), which its training_log does not list.
func P2PTimerName(run []Action) string {
	var sendF, sendB, recvF, recvB bool
	for _, a := range run {
		switch a.Op {
		case SendActivation:
			sendF = true
		case SendGrad:
			sendB = true
		case RecvActivation:
			recvF = true
		case RecvGrad:
			recvB = true
		}
	}
	dirs := func(f, b bool) string {
		switch {
		case f && b:
			return "forward-backward"
		case f:
			return "forward"
		case b:
			return "backward"
		}
		return ""
	}
	var parts []string
	if s := dirs(sendF, sendB); s != "" {
		parts = append(parts, s+"-send")
	}
	if r := dirs(recvF, recvB); r != "" {
		parts = append(parts, r+"-recv")
	}
	return strings.Join(parts, "-")
}

// Executor runs one pipeline rank's action list for a training step: the
// synchronous core of pipelining, one goroutine, one rank. Not safe for
// concurrent use.
type Executor struct {
	cfg     ExecConfig
	c       Config // defaulted
	rank    int
	actions []Action
	lastB   []int // per chunk: index of its last Backward in actions
	now     func() time.Time

	free    [][]*tensor.Tape // per chunk: tapes reset and ready
	tapes   int
	pool    map[int][][]float32 // receive buffers by length
	slots   map[Slot]*slot
	headers map[link]bool // channels whose first message carried a shape header
	stats   Stats
	losses  []float64 // the last step's loss of each micro-batch (last stage)
}

// slot is the state of one (chunk, micro-batch) during a step.
type slot struct {
	tape *tensor.Tape
	in   *tensor.Tensor // received activation (a leaf requiring grad); its Grad is sent back
	out  *tensor.Tensor // forward output: activation, or the loss divided by M
	grad *tensor.Tensor // received gradient of out
	fwd  bool           // forward done

	// Off the CPU: the host buffers a receive of in or grad lands in
	// before it is copied to the device (nil once copied).
	inHost, gradHost []float32
}

// link is one direction of one kind of message to or from a peer.
type link struct {
	peer       int
	grad, send bool
}

// NewExecutor checks cfg and prepares the rank's list.
func NewExecutor(cfg ExecConfig) (*Executor, error) {
	c := cfg.Schedule.withDefaults()
	rank := 0
	if cfg.Group != nil {
		rank = cfg.Group.Rank()
		if cfg.Group.Size() != c.PP {
			return nil, fmt.Errorf(errPrefix+"executor: pipeline group of %d ranks for %s %d", cfg.Group.Size(), flagPP, c.PP)
		}
	} else if c.PP > 1 {
		return nil, fmt.Errorf(errPrefix+"executor: %s %d needs a pipeline group", flagPP, c.PP)
	}
	if err := cfg.Schedule.checkRank(rank); err != nil {
		return nil, err
	}
	if len(cfg.Stages) != c.VPP {
		return nil, fmt.Errorf(errPrefix+"executor: %d stages for %d model chunks per rank (%s)", len(cfg.Stages), c.VPP, flagVPP)
	}
	acts := cfg.Actions
	if acts == nil {
		var err error
		if acts, err = Actions(cfg.Schedule, rank); err != nil {
			return nil, err
		}
	}
	e := &Executor{cfg: cfg, c: c, rank: rank, actions: acts, now: cfg.Now, lastB: make([]int, c.VPP),
		free: make([][]*tensor.Tape, c.VPP), pool: map[int][][]float32{}, slots: map[Slot]*slot{}, headers: map[link]bool{}}
	if e.now == nil {
		e.now = time.Now
	}
	for i := range e.lastB {
		e.lastB[i] = -1
	}
	for i, a := range acts {
		if a.Chunk < 0 || a.Chunk >= c.VPP || a.Microbatch < 0 || a.Microbatch >= c.Microbatches {
			return nil, fmt.Errorf(errPrefix+"executor: action %d (%v) outside %d chunks and %d micro-batches", i, a, c.VPP, c.Microbatches)
		}
		if a.Op == Backward {
			e.lastB[a.Chunk] = i
		}
	}
	return e, nil
}

// firstStage and lastStage report whether chunk holds the model's first
// or last virtual stage.
func (e *Executor) firstStage(chunk int) bool { return e.rank == 0 && chunk == 0 }
func (e *Executor) lastStage(chunk int) bool  { return e.rank == e.c.PP-1 && chunk == e.c.VPP-1 }

// Stats returns the measurements of the last Step.
func (e *Executor) Stats() Stats { return e.stats }

// HasLoss reports whether this rank computes the loss (holds the model's
// last stage), so that Step's loss means something.
func (e *Executor) HasLoss() bool { return e.rank == e.c.PP-1 }

// MicrobatchLosses returns the last Step's loss of each micro-batch, as the
// model's last stage returned it, on the rank that holds it (HasLoss); nil
// elsewhere. The slice is reused by the next Step.
func (e *Executor) MicrobatchLosses() []float64 {
	if !e.HasLoss() {
		return nil
	}
	return e.losses
}

// Step runs the rank's list once: every forward and backward of the step's
// micro-batches, with the sends and receives between them. Parameter
// gradients accumulate (+=) into the stages' parameters; the caller zeroes
// them before and reduces them after (data parallelism, the tied
// embedding). On the last pipeline rank it returns the step's objective
// Σ w·loss over the micro-batches (each backward is seeded by w·loss): the
// mean of their losses with the default weight 1/M; elsewhere 0. Errors
// from stages, shapes and collectives are returned naming the action;
// after one, the step is abandoned (the peers' pending exchanges fail when
// their wait times out or ctx ends).
func (e *Executor) Step(ctx context.Context) (float64, error) {
	start := e.now()
	e.stats = Stats{Tapes: e.tapes}
	if cap(e.losses) < e.c.Microbatches {
		e.losses = make([]float64, e.c.Microbatches)
	}
	e.losses = e.losses[:e.c.Microbatches]
	clear(e.losses)
	var objective float64
	inFlight := 0
	defer e.cleanup()
	for i := 0; i < len(e.actions); {
		a := e.actions[i]
		if !a.Op.Compute() {
			j := i
			for j < len(e.actions) && !e.actions[j].Op.Compute() {
				j++
			}
			t := e.now()
			err := e.exchange(ctx, e.actions[i:j])
			d := e.now().Sub(t)
			e.stats.Comm += d
			if e.stats.P2P == nil {
				e.stats.P2P = map[string]time.Duration{}
			}
			e.stats.P2P[P2PTimerName(e.actions[i:j])] += d
			if err != nil {
				return 0, err
			}
			i = j
			continue
		}
		t := e.now()
		var err error
		if a.Op == Forward {
			var loss float64
			loss, err = e.forward(ctx, a)
			if e.lastStage(a.Chunk) {
				e.losses[a.Microbatch] = loss
				if e.cfg.LossWeight != nil {
					objective += float64(e.cfg.LossWeight(a.Microbatch)) * loss
				} else {
					objective += loss // divided by M below
				}
			}
			e.stats.Forward += e.now().Sub(t)
			inFlight++
			e.stats.PeakInFlight = max(e.stats.PeakInFlight, inFlight)
		} else {
			if i == e.lastB[a.Chunk] && e.cfg.LastBackward != nil {
				e.cfg.LastBackward(a.Chunk)
			}
			err = e.backward(a)
			if err == nil && e.cfg.AfterBackward != nil {
				err = e.cfg.AfterBackward(a.Chunk)
			}
			e.stats.Backward += e.now().Sub(t)
			inFlight--
		}
		if err != nil {
			return 0, fmt.Errorf(errPrefix+"rank %d: %v: %w", e.rank, a, err)
		}
		i++
	}
	e.stats.Step = e.now().Sub(start)
	e.stats.Tapes = e.tapes
	if !e.HasLoss() {
		return 0, nil
	}
	if e.cfg.LossWeight == nil {
		objective /= float64(e.c.Microbatches)
	}
	return objective, nil
}

// slot returns the state of (chunk, mb), creating it.
func (e *Executor) slot(chunk, mb int) *slot {
	k := Slot{Chunk: chunk, Microbatch: mb}
	s := e.slots[k]
	if s == nil {
		s = &slot{}
		e.slots[k] = s
	}
	return s
}

// tape returns an idle tape of chunk, making one when none is free.
func (e *Executor) tape(chunk int) *tensor.Tape {
	if f := e.free[chunk]; len(f) > 0 {
		tp := f[len(f)-1]
		e.free[chunk] = f[:len(f)-1]
		return tp
	}
	e.tapes++
	tp := tensor.NewTape()
	if e.cfg.NewTape != nil {
		tp = e.cfg.NewTape(chunk)
	}
	// Nothing of a micro-batch's forward pass is read after its backward
	// (the loss is read in forward; the output was sent): its buffers go
	// back to the arena as the backward pass leaves them behind.
	tp.SetReleaseInBackward(true)
	return tp
}

// forward runs a Forward action on a tape carrying ctx; on the model's last
// stage it returns the micro-batch's (undivided) loss.
func (e *Executor) forward(ctx context.Context, a Action) (float64, error) {
	s := e.slot(a.Chunk, a.Microbatch)
	if s.fwd {
		return 0, errors.New("forward twice")
	}
	if !e.firstStage(a.Chunk) && s.in == nil {
		return 0, errors.New("no activation received for it")
	}
	s.fwd = true
	s.tape = e.tape(a.Chunk)
	s.tape.SetContext(ctx)
	out, err := e.cfg.Stages[a.Chunk].Forward(s.tape, a.Microbatch, s.in)
	if err == nil {
		err = s.tape.Err()
	}
	switch {
	case err != nil:
		return 0, err
	case out == nil:
		return 0, errors.New("the stage returned no output")
	case !out.RequiresGrad():
		return 0, errors.New("the stage's output does not depend on its parameters or input (nothing to backpropagate)")
	}
	if !e.lastStage(a.Chunk) {
		s.out = out
		return 0, nil
	}
	if out.Numel() != 1 {
		return 0, fmt.Errorf("the model's last stage returned shape %v, want the loss (one element)", out.Shape())
	}
	loss := float64(tensor.ToHost(out).Float32s()[0]) // the step's one readback on this rank
	// Each micro-batch's loss counts w of the step's: 1/M by default
	// (Megatron divides it by num_microbatches in forward_step).
	scale := float32(1)
	if e.cfg.LossScale != nil {
		scale = e.cfg.LossScale()
	}
	if e.cfg.LossWeight != nil {
		s.out = s.tape.Scale(out, scale*e.cfg.LossWeight(a.Microbatch))
	} else {
		s.out = s.tape.Scale(out, scale/float32(e.c.Microbatches))
	}
	return loss, nil
}

// backward runs a Backward action, then frees its tape for reuse.
func (e *Executor) backward(a Action) error {
	k := Slot{Chunk: a.Chunk, Microbatch: a.Microbatch}
	s := e.slots[k]
	if s == nil || !s.fwd {
		return errors.New("backward before its forward")
	}
	if s.tape == nil {
		return errors.New("backward twice")
	}
	var err error
	if e.lastStage(a.Chunk) {
		err = s.tape.Backward(s.out)
	} else if s.grad == nil {
		return errors.New("no output gradient received for it")
	} else {
		err = s.tape.BackwardFrom([]*tensor.Tensor{s.out}, []*tensor.Tensor{s.grad})
	}
	// err includes a failure recorded on the tape in either pass.
	s.tape.Reset()
	e.free[a.Chunk] = append(e.free[a.Chunk], s.tape)
	s.tape, s.out = nil, nil
	if s.grad != nil {
		e.release(s.grad)
		s.grad = nil
	}
	if s.in == nil { // the model's first stage: nothing to send back
		delete(e.slots, k)
	}
	return err
}

// get returns a zeroed buffer of n elements from the pool.
func (e *Executor) get(n int) []float32 {
	if l := e.pool[n]; len(l) > 0 {
		b := l[len(l)-1]
		e.pool[n] = l[:len(l)-1]
		clear(b)
		return b
	}
	return make([]float32, n)
}

func (e *Executor) put(b []float32) { e.pool[len(b)] = append(e.pool[len(b)], b) }

// release returns a received tensor's storage to the pool: on the CPU it is
// a pool buffer; on a device it is the device's (its host staging buffer
// went back when the receive finished).
func (e *Executor) release(t *tensor.Tensor) {
	if e.cfg.Device == tensor.CPU {
		e.put(t.Float32s())
	}
}

// hostValues returns the values of the contiguous tensor t for a send: its
// own storage on the CPU, else a host copy (comm staging).
func hostValues(t *tensor.Tensor) []float32 {
	if t.Device() == tensor.CPU {
		return t.Float32s()
	}
	return tensor.ToHost(t).Float32s()
}

// recvTensor returns a zeroed tensor of shape on the executor's device for
// a receive, and the host buffer the receive writes: the tensor's own
// storage on the CPU, else a staging buffer that finish copies in.
func (e *Executor) recvTensor(shape []int) (t *tensor.Tensor, host []float32) {
	n := numel(shape)
	if e.cfg.Device == tensor.CPU {
		b := e.get(n)
		return tensor.FromFloat32(b, shape...), b
	}
	return tensor.ZerosOn(e.cfg.Device, shape...), e.get(n)
}

// cleanup returns what a finished or abandoned step still holds: tapes of
// micro-batches whose backward did not run, receive buffers.
func (e *Executor) cleanup() {
	for k, s := range e.slots {
		if s.tape != nil {
			s.tape.Reset()
			e.free[k.Chunk] = append(e.free[k.Chunk], s.tape)
		}
		if s.grad != nil {
			e.release(s.grad)
		}
		if s.in != nil {
			e.release(s.in)
			e.release(s.in.Grad)
		}
		for _, b := range [][]float32{s.inHost, s.gradHost} {
			if b != nil {
				e.put(b)
			}
		}
		delete(e.slots, k)
	}
}
