// Package fsdp is fully sharded data parallelism (Megatron-FSDP's
// optim_grads_params and optim_grads strategies, ZeRO-3 and ZeRO-2): the
// parameters are cut into units (one per transformer layer, one for
// everything else: embeddings, final norm, output layer), each unit laid out
// in one flat buffer padded to a multiple of the data-parallel size, and
// data-parallel rank r of D keeps only the r-th 1/D of every unit: the
// parameters (the optimizer's main parameters), their gradients and the
// optimizer state.
//
// A unit's parameters are whole only while they are used: Gather
// all-gathers the unit's shards into a fresh buffer the parameter tensors
// adopt (tensor.Tensor.Adopt), Release drops it. Around a layer the model
// calls both (gpt.ParamGather); recorded on the tape as identity ops, their
// backward runs in the other order, so the layer's backward finds its
// parameters gathered again and a fresh gradient buffer, and after it the
// unit's gradient is reduce-scattered (pre-scaled by 1/D and summed, as
// Megatron) and added to this rank's gradient shard, and both buffers are
// dropped. With several micro-batches each one's gradient is
// reduce-scattered and accumulated in the shard.
//
// Not safe for concurrent use: one training loop drives it.
package fsdp

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/gotron/gotron/comm"
	"github.com/gotron/gotron/optim"
	"github.com/gotron/gotron/tensor"
)

// Config is one run's sharding. The zero value is ZeRO-3 (Megatron's
// default --data-parallel-sharding-strategy optim_grads_params), with
// gradients pre-scaled by 1/D and summed.
type Config struct {
	// KeepParams (optim_grads, ZeRO-2) keeps every unit's parameters
	// whole: they are all-gathered once after each optimizer step and never
	// released; only gradients and optimizer state are sharded.
	KeepParams bool
	// AverageInCollective (--ddp-average-in-collective) reduces with Avg
	// instead of pre-scaling by 1/D and summing.
	AverageInCollective bool
	// GradientScale, when not 0, replaces the pre-scale 1/D (Megatron's
	// gradient_scaling_factor: 1 with --calculate-per-token-loss, whose
	// sums the trainer divides by the global token count). It excludes
	// AverageInCollective.
	GradientScale float32
}

// Units groups parameters: Layers[i] are the parameters of the model's
// layer i (global index), Outer everything else. Every parameter must be a
// contiguous float32 leaf on the CPU, in at most one unit.
type Units struct {
	Outer  []*tensor.Tensor
	Layers map[int][]*tensor.Tensor
}

// FSDP holds this rank's shards and gathers and reduces units over the
// data-parallel group.
type FSDP struct {
	cfg   Config
	group comm.ProcessGroup
	units []*unit
	layer map[int]*unit // global layer index → its unit
	outer *unit
	// gathered counts the all-gathers of units since New (for tests: a
	// unit is gathered once before its forward and once before its
	// backward).
	gathered int
	// peak is the most values of whole units (parameters and gradients)
	// held at once in forward and backward passes since New.
	peak         int64
	gatheringAll bool // in GatherAll: not a forward or backward pass
}

// unit is one flat buffer of parameters and this rank's shard of it.
type unit struct {
	name   string
	params []*tensor.Tensor
	off    []int // each parameter's offset in the flat buffer
	padded int   // flat size, a multiple of the group size
	lo, hi int   // this rank's shard [lo, hi) of the flat buffer
	shard  *tensor.Tensor
	gshard *tensor.Tensor // the reduced gradient shard, accumulated over micro-batches
	full   *tensor.Tensor // the gathered parameters; nil while released
	grad   *tensor.Tensor // the unit's whole gradient during its backward; nil otherwise
	uses   int            // open Gathers (a unit may be gathered while already whole)
	pinned bool           // made whole by GatherAll: kept until ReleaseAll
}

// New lays out the units, copies this rank's shard of every parameter's
// current value (the caller has made them equal on every rank) and, unless
// cfg.KeepParams, releases the parameters: from here on they are whole only
// between Gather and Release.
func New(units Units, group comm.ProcessGroup, cfg Config) (*FSDP, error) {
	if group == nil || group.Size() < 1 {
		return nil, errors.New("fsdp: no data-parallel group")
	}
	if cfg.GradientScale != 0 && cfg.AverageInCollective {
		return nil, errors.New("fsdp: a gradient scale excludes --ddp-average-in-collective")
	}
	f := &FSDP{cfg: cfg, group: group, layer: map[int]*unit{}}
	seen := map[*tensor.Tensor]string{}
	add := func(name string, ps []*tensor.Tensor) (*unit, error) {
		u := &unit{name: name}
		n := 0
		for _, p := range ps {
			if p == nil {
				continue
			}
			if prev, dup := seen[p]; dup {
				return nil, fmt.Errorf("fsdp: parameter %s is in %s and in %s", p.Name, prev, name)
			}
			seen[p] = name
			if p.DType() != tensor.Float32 || !p.IsContiguous() || p.Device() != tensor.CPU {
				return nil, fmt.Errorf("fsdp: parameter %s of %s: want a contiguous float32 tensor on the CPU (fully sharded data parallelism runs on --device cpu)", p.Name, name)
			}
			u.params = append(u.params, p)
			u.off = append(u.off, n)
			n += p.Numel()
		}
		d := group.Size()
		u.padded = (n + d - 1) / d * d
		per := u.padded / d
		u.lo, u.hi = group.Rank()*per, (group.Rank()+1)*per
		full := tensor.Zeros(u.padded)
		for i, p := range u.params {
			copy(full.Float32s()[u.off[i]:], p.Contiguous().Float32s())
		}
		u.shard = tensor.Zeros(per)
		copy(u.shard.Float32s(), full.Float32s()[u.lo:u.hi])
		u.gshard = tensor.Zeros(per)
		if err := u.adopt(full); err != nil {
			return nil, err
		}
		f.units = append(f.units, u)
		return u, nil
	}
	var err error
	if f.outer, err = add("the embeddings and output layer", units.Outer); err != nil {
		return nil, err
	}
	// in layer order: the units (and the optimizer's pieces) line up on
	// every rank
	for _, i := range slices.Sorted(maps.Keys(units.Layers)) {
		if f.layer[i], err = add(fmt.Sprintf("layer %d", i), units.Layers[i]); err != nil {
			return nil, err
		}
	}
	if !cfg.KeepParams {
		for _, u := range f.units {
			u.release()
		}
	}
	return f, nil
}

// adopt points the unit's parameters at full, the whole flat buffer.
func (u *unit) adopt(full *tensor.Tensor) error {
	var noGrad *tensor.Tape
	for i, p := range u.params {
		if err := p.Adopt(noGrad.Narrow(full, 0, u.off[i], p.Numel())); err != nil {
			return fmt.Errorf("fsdp: %s: %w", u.name, err)
		}
	}
	u.full = full
	return nil
}

// release drops the unit's whole parameters (their memory goes back to
// the Go heap once the tape's views of them are gone).
func (u *unit) release() {
	for _, p := range u.params {
		p.Release()
	}
	u.full = nil
}

// gather all-gathers the unit's shards into a fresh whole buffer its
// parameters adopt; nothing when it is whole already.
func (f *FSDP) gather(ctx context.Context, u *unit) error {
	if u.full != nil {
		return nil
	}
	full := tensor.Zeros(u.padded)
	send := tensor.Zeros(u.hi - u.lo) // the all-gather writes the buffer its own shard lands in
	copy(send.Float32s(), u.shard.Float32s())
	if f.group.Size() == 1 {
		copy(full.Float32s(), send.Float32s())
	} else if err := f.group.AllGather(ctx, comm.Float32s(full.Float32s()), comm.Float32s(send.Float32s()), nil); err != nil {
		return fmt.Errorf("fsdp: all-gather of %s's parameters (%d values): %w", u.name, u.padded, err)
	}
	f.gathered++
	if err := u.adopt(full); err != nil {
		return err
	}
	if !f.gatheringAll {
		f.notePeak()
	}
	return nil
}

// startGrad gives the unit's parameters a fresh zero gradient buffer.
func (f *FSDP) startGrad(u *unit) {
	if u.grad != nil {
		return
	}
	u.grad = tensor.Zeros(u.padded)
	defer f.notePeak()
	var noGrad *tensor.Tape
	for i, p := range u.params {
		p.Grad = noGrad.Narrow(u.grad, 0, u.off[i], p.Numel()).Reshape(p.Shape()...)
		p.Grad.Name = p.Name + ".grad"
	}
}

// reduceGrad reduce-scatters the unit's whole gradient, adds this rank's
// part to its gradient shard and drops the whole gradient.
func (f *FSDP) reduceGrad(ctx context.Context, u *unit) error {
	if u.grad == nil {
		return nil
	}
	g := u.grad
	u.grad = nil
	for _, p := range u.params {
		p.Grad = nil
	}
	d := f.group.Size()
	op := comm.Sum
	scale := f.cfg.GradientScale // Megatron's gradient_scaling_factor
	if scale == 0 && d > 1 {
		scale = 1 / float32(d)
	}
	if f.cfg.AverageInCollective {
		op = comm.Avg
	} else if scale != 0 && scale != 1 {
		for i, v := range g.Float32s() {
			g.Float32s()[i] = v * scale
		}
	}
	part := g.Float32s()[u.lo:u.hi]
	if d > 1 {
		out := make([]float32, u.hi-u.lo)
		if err := f.group.ReduceScatter(ctx, comm.Float32s(out), comm.Float32s(g.Float32s()), op, nil); err != nil {
			return fmt.Errorf("fsdp: reduce-scatter of %s's gradients (%d values): %w", u.name, u.padded, err)
		}
		part = out
	}
	acc := u.gshard.Float32s()
	for i, v := range part {
		acc[i] += v
	}
	return nil
}

// Gather is gpt.ParamGather's: before layers [first, first+n) run, their
// units are gathered; in backward (after the layers' backward) their
// gradients are reduced and the units released.
func (f *FSDP) Gather(tp *tensor.Tape, x *tensor.Tensor, first, n int) *tensor.Tensor {
	return tp.Apply(boundary{f: f, units: f.layers(first, n), gather: true}, x)[0]
}

// Release is gpt.ParamGather's: after layers [first, first+n) their units
// are released; in backward (before the layers' backward) they are
// gathered again with fresh gradient buffers.
func (f *FSDP) Release(tp *tensor.Tape, x *tensor.Tensor, first, n int) *tensor.Tensor {
	return tp.Apply(boundary{f: f, units: f.layers(first, n)}, x)[0]
}

func (f *FSDP) layers(first, n int) []*unit {
	var us []*unit
	for i := first; i < first+n; i++ {
		if u := f.layer[i]; u != nil {
			us = append(us, u)
		}
	}
	return us
}

// boundary is the identity op Gather (gather) and Release record.
type boundary struct {
	f      *FSDP
	units  []*unit
	gather bool
}

func (b boundary) Forward(tp *tensor.Tape, in []*tensor.Tensor) []*tensor.Tensor {
	if b.gather {
		b.f.open(tp, b.units)
	} else {
		b.f.close(b.units)
	}
	// A tensor of its own (the tape keeps one gradient per tensor), a copy
	// of x's values.
	out := tp.EmptyLike(in[0], in[0].Shape()...)
	tensor.Copy(out, in[0])
	return []*tensor.Tensor{out}
}

func (b boundary) Backward(tp *tensor.Tape, g []*tensor.Tensor) []*tensor.Tensor {
	if b.gather { // after the layers' backward
		for _, u := range b.units {
			if err := b.f.reduceGrad(tp.Context(), u); err != nil {
				tp.Fail(err)
			}
		}
		b.f.close(b.units)
	} else { // before it
		b.f.open(tp, b.units)
		for _, u := range b.units {
			b.f.startGrad(u)
		}
	}
	return g
}

func (f *FSDP) open(tp *tensor.Tape, us []*unit) {
	for _, u := range us {
		u.uses++
		if err := f.gather(tp.Context(), u); err != nil {
			tp.Fail(err)
		}
	}
}

func (f *FSDP) close(us []*unit) {
	for _, u := range us {
		if u.uses > 0 {
			u.uses--
		}
		if u.uses == 0 && !u.pinned && !f.cfg.KeepParams {
			u.release()
		}
	}
}

// BeginMicrobatch gathers the outer unit (embeddings, final norm, output
// layer) for a forward pass, with a fresh gradient buffer when training.
func (f *FSDP) BeginMicrobatch(ctx context.Context, training bool) error {
	f.outer.uses++
	if err := f.gather(ctx, f.outer); err != nil {
		return err
	}
	if training {
		f.startGrad(f.outer)
	}
	return nil
}

// EndMicrobatch reduces the outer unit's gradient (after backward, when
// training) and releases it.
func (f *FSDP) EndMicrobatch(ctx context.Context) error {
	err := f.reduceGrad(ctx, f.outer)
	f.close([]*unit{f.outer})
	return err
}

// ZeroGrad clears every gradient shard before a step.
func (f *FSDP) ZeroGrad() {
	for _, u := range f.units {
		tensor.Zero(u.gshard)
	}
}

// GatherAll makes every unit whole (for a checkpoint, an evaluation, the
// end of a run) until ReleaseAll.
func (f *FSDP) GatherAll(ctx context.Context) error {
	f.gatheringAll = true
	defer func() { f.gatheringAll = false }()
	for _, u := range f.units {
		if err := f.gather(ctx, u); err != nil {
			return err
		}
		u.pinned = true
	}
	return nil
}

// ReleaseAll releases the units GatherAll made whole (none with
// KeepParams); units in use stay.
func (f *FSDP) ReleaseAll() {
	for _, u := range f.units {
		u.pinned = false
		if u.uses == 0 && !f.cfg.KeepParams {
			u.release()
		}
	}
}

// TakeShards copies this rank's shard of every unit from its whole
// parameters (after a checkpoint was read into them, GatherAll first).
func (f *FSDP) TakeShards() error {
	for _, u := range f.units {
		if u.full == nil {
			return fmt.Errorf("fsdp: %s is not whole", u.name)
		}
		copy(u.shard.Float32s(), u.full.Float32s()[u.lo:u.hi])
	}
	return nil
}

// AfterStep makes the parameters follow the optimizer step: with
// KeepParams every unit is all-gathered again; otherwise the units are
// dropped (the next use gathers the new values).
func (f *FSDP) AfterStep(ctx context.Context) error {
	for _, u := range f.units {
		u.release()
		u.pinned = false
	}
	if f.cfg.KeepParams {
		return f.GatherAll(ctx)
	}
	return nil
}

// piece is the part [Lo, Hi) of unit parameter Param in this rank's shard.
type piece struct {
	u          *unit
	param      int
	lo, hi     int // indices in the parameter
	shardStart int // where the piece starts in the shard
}

func (f *FSDP) pieces() []piece {
	var out []piece
	for _, u := range f.units {
		for i, p := range u.params {
			a, z := max(u.lo, u.off[i]), min(u.hi, u.off[i]+p.Numel())
			if a < z {
				out = append(out, piece{u: u, param: i, lo: a - u.off[i], hi: z - u.off[i], shardStart: a - u.lo})
			}
		}
	}
	return out
}

// ShardParams returns this rank's pieces of every parameter as optimizer
// parameters, named "<param>[lo:hi]" as the distributed optimizer's (so
// checkpoints reshard them the same way): Data is a view of the parameter
// shard, Grad of the gradient shard.
func (f *FSDP) ShardParams() []*optim.Param {
	var out []*optim.Param
	var noGrad *tensor.Tape
	for _, pc := range f.pieces() {
		p := pc.u.params[pc.param]
		n := pc.hi - pc.lo
		out = append(out, &optim.Param{Name: fmt.Sprintf("%s[%d:%d]", p.Name, pc.lo, pc.hi),
			Data: noGrad.Narrow(pc.u.shard, 0, pc.shardStart, n), Grad: noGrad.Narrow(pc.u.gshard, 0, pc.shardStart, n),
			NoWeightDecay: optim.DefaultNoWeightDecay(p.Name, p.Shape()), Dims: len(p.Shape())})
	}
	return out
}

// GradViews returns this rank's gradient-shard pieces of the parameters
// want selects (in unit order; the same pieces on every rank whose units
// have the same sizes, such as the tensor-parallel ranks of one replica).
func (f *FSDP) GradViews(want func(*tensor.Tensor) bool) []*tensor.Tensor {
	var out []*tensor.Tensor
	var noGrad *tensor.Tape
	for _, pc := range f.pieces() {
		if want(pc.u.params[pc.param]) {
			out = append(out, noGrad.Narrow(pc.u.gshard, 0, pc.shardStart, pc.hi-pc.lo))
		}
	}
	return out
}

// Sizes are the float32 values a rank holds, by kind.
type Sizes struct {
	// ParamShards and GradShards are the persistent shards (the same
	// count: every unit's padded size over the group size).
	ParamShards, GradShards int64
	// Whole is the values of the units whole right now (gathered
	// parameters and gradient buffers in use).
	Whole int64
	// Unsharded is every unit's parameter count (what one rank would hold
	// without sharding).
	Unsharded int64
	// LargestUnit is the most values one gathered unit takes.
	LargestUnit int64
	// PeakWhole is the most values of whole units (gathered parameters
	// and gradient buffers) held at once during forward and backward
	// passes since New (not counting GatherAll's).
	PeakWhole int64
}

// Sizes reports what this rank holds now, from the buffers themselves.
func (f *FSDP) Sizes() Sizes {
	s := Sizes{PeakWhole: f.peak}
	for _, u := range f.units {
		s.ParamShards += int64(u.shard.Numel())
		s.GradShards += int64(u.gshard.Numel())
		if u.full != nil {
			s.Whole += int64(u.full.Numel())
		}
		if u.grad != nil {
			s.Whole += int64(u.grad.Numel())
		}
		n := int64(0)
		for _, p := range u.params {
			n += int64(p.Numel())
		}
		s.Unsharded += n
		s.LargestUnit = max(s.LargestUnit, int64(u.padded))
	}
	return s
}

// notePeak records the values of the units whole now if they are the most
// so far.
func (f *FSDP) notePeak() {
	f.peak = max(f.peak, f.Sizes().Whole)
}

// Gathers is the number of unit all-gathers since New.
func (f *FSDP) Gathers() int { return f.gathered }
