package tensor

import (
	"context"
	"fmt"
	"math/bits"
	"sync"
	"unsafe"

	"github.com/gotron/gotron/internal/cpu"
)

// Tape records the backward steps of the ops run through it and replays them
// in reverse. A nil *Tape computes without recording (no-grad mode). A Tape
// also owns the buffers of the activations and gradients it produced: Reset
// returns them to its arena for the next iteration, so steady-state training
// allocates nothing. Not safe for concurrent use.
//
// A Tape also carries the context of the step it records and the step's
// first failure. Ops have no error result, so functions that block or can
// fail (the collectives of parallel/tp, run inside tape functions) take
// their context from the tape (Context) and record a failure on it (Fail):
// the first is kept, later ones are ignored, and Backward and BackwardFrom
// return it. Storing a context in a struct is against Go's general rule;
// a Tape is the exception http.Request is: a per-step object (one forward
// and one backward, then Reset) whose context is that step's, set with
// SetContext.
type Tape struct {
	steps    []step
	arena    *Arena
	live     []liveBuf // buffers handed out since the last Reset
	grads    map[*Tensor]gradRef
	disabled bool  // computes through the arena without recording (recomputation)
	parent   *Tape // for a non-recording child: the tape whose Reset frees its buffers
	matmul   MatmulPrecision
	ready    *readyTracker // gradient-ready reporting (SetGradReadyHook); shared with child tapes
	nested   bool          // a recomputation tape whose backward runs inside a step of its parent's
	run      *tapeRun      // context and first failure; shared with child tapes
	child    bool          // shares its parent's run: Reset leaves the failure to the parent
	// replayed: a checkpoint's first forward, which its backward runs
	// again on a nested tape (LinearFP8 keeps its delayed scales for it)
	replayed bool
	// release: Backward returns each forward buffer to the arena as soon
	// as the steps that can read it have run (SetReleaseInBackward).
	release bool
	// operands: the float32 outputs that only feed products on bfloat16
	// operands so far, by storage (forwardOnly, ForwardDone).
	operands map[unsafe.Pointer]*fwdOperand
}

// tapeRun is what a tape and its child tapes (Apply's, Checkpoint's) share
// for one step: its context and its first failure.
type tapeRun struct {
	ctx context.Context
	mu  sync.Mutex // protects err
	err error
}

func newRun() *tapeRun { return &tapeRun{ctx: context.Background()} }

// SetContext sets the context of the step the tape records: the context of
// the blocking work its functions do (tensor-parallel collectives). A new
// tape's is context.Background(); Reset keeps it. It panics on a nil ctx or
// a nil tape.
func (tp *Tape) SetContext(ctx context.Context) {
	if ctx == nil {
		panic("tensor: SetContext with a nil context")
	}
	tp.run.ctx = ctx
}

// Context returns the tape's context (context.Background() for a nil
// tape). Tape functions that block use it.
func (tp *Tape) Context() context.Context {
	if tp == nil {
		return context.Background()
	}
	return tp.run.ctx
}

// Fail records err as the step's failure unless one is recorded already
// (the first is kept); Err, Backward and BackwardFrom return it. A tape
// function that fails records its error so and returns outputs of the right
// shapes. A nil err is ignored. A nil tape has nowhere to keep the error and
// panics with it: forward-only code whose functions can fail runs on a tape
// from NewNoGradTape.
func (tp *Tape) Fail(err error) {
	if err == nil {
		return
	}
	if tp == nil {
		panic(fmt.Sprintf("tensor: failure on a nil (no-grad) tape: %v", err))
	}
	tp.run.mu.Lock()
	defer tp.run.mu.Unlock()
	if tp.run.err == nil {
		tp.run.err = err
	}
}

// Err returns the failure recorded since the last Reset, or nil (always nil
// for a nil tape).
func (tp *Tape) Err() error {
	if tp == nil {
		return nil
	}
	tp.run.mu.Lock()
	defer tp.run.mu.Unlock()
	return tp.run.err
}

type step struct {
	name string
	// live is len(tp.live) when the step was recorded: the buffers at or
	// after the previous step's live were handed out for this step's
	// forward computation (or later), so only this step and the later
	// ones can read them.
	live int
	outs []*Tensor
	// backward reads the outputs' gradients with tp.grad and adds into the
	// inputs' gradients with tp.addGrad / tp.gradFor.
	backward func(tp *Tape)
}

// gradBuf is a gradient buffer, possibly shared (zero-copy) by a tensor and
// its views or by the inputs of an add; refs counts the tensors sharing it.
type gradBuf struct {
	data  []float32 // host storage (CPU, sim), from data[0]
	dev   *devBuf   // or device storage (CUDA), from element offset
	off   int
	refs  int
	owned bool // taken from the arena by the tape: returned when refs drops to 0
}

// view returns a contiguous float32 tensor of shape on dev over b.
func (b *gradBuf) view(dev Device, shape []int) *Tensor {
	t := &Tensor{shape: append([]int(nil), shape...), strides: contiguousStrides(shape), dtype: Float32, dev: dev, leaf: true}
	if b.dev != nil {
		t.dbuf, t.offset = b.dev, b.off
	} else {
		t.f32 = b.data
	}
	return t
}

// gradBufOf returns an unowned gradBuf over contiguous float32 g's storage.
func gradBufOf(g *Tensor) *gradBuf {
	if g.dbuf != nil {
		return &gradBuf{dev: g.dbuf, off: g.offset, refs: 1}
	}
	return &gradBuf{data: g.f32s(), refs: 1}
}

// liveBuf is a buffer the tape handed out: host memory from its arena, or
// device memory (CUDA) from the device's caching allocator.
type liveBuf struct {
	host []float32
	dev  *devBuf
}

// floats returns b's size in float32 elements.
func (b liveBuf) floats() int {
	if b.dev != nil {
		return int(b.dev.bytes / 4)
	}
	return len(b.host)
}

// release gives b back: to the arena, or to the device's allocator.
func (b liveBuf) release(a *Arena) {
	if b.dev != nil {
		b.dev.free()
		return
	}
	a.put(b.host)
}

// gradRef is one tensor's gradient: a view of a shared buffer.
type gradRef struct {
	view *Tensor
	buf  *gradBuf
}

// NewTape returns an empty tape with its own arena.
// Its context is context.Background() until SetContext.
func NewTape() *Tape { return &Tape{arena: NewArena(), grads: map[*Tensor]gradRef{}, run: newRun()} }

// SetReleaseInBackward makes Backward and BackwardFrom return the buffers
// of the forward pass to the arena while they run, each as soon as no step
// left to run can read it, instead of at Reset: a buffer handed out after
// step i was recorded can only be read by the steps recorded after it, so
// it goes back once the backward pass has run those. The peak of a tape's
// memory is then the forward's activations or the backward's working set,
// no longer both (the last layers' gradients and recomputations beside
// the whole forward's buffers). Tensors the forward pass produced, the
// loss included, must then not be read after Backward: the caller reads
// them before (buffers handed out after the last recorded step, such as a
// scaled loss made for the seed, stay until Reset). Checkpoint's
// recomputation tapes always release so.
func (tp *Tape) SetReleaseInBackward(on bool) { tp.release = on }

// releaseLive returns live[lo:hi] to the arena (backward, SetReleaseInBackward).
func (tp *Tape) releaseLive(lo, hi int) {
	for j := lo; j < hi; j++ {
		if b := tp.live[j]; b.host != nil || b.dev != nil {
			b.release(tp.arena)
			tp.live[j] = liveBuf{}
		}
	}
}

// SetMatmulPrecision sets the arithmetic of the matrix products (MatMul,
// Linear, forward and backward) recorded from now on; the zero value is
// MatmulFP32. Tapes made for recomputation inherit it.
func (tp *Tape) SetMatmulPrecision(p MatmulPrecision) { tp.matmul = p }

// MatmulPrecision returns the tape's matmul arithmetic (MatmulFP32 for a
// nil tape).
func (tp *Tape) MatmulPrecision() MatmulPrecision {
	if tp == nil {
		return MatmulFP32
	}
	return tp.matmul
}

// Reset forgets the recorded steps and the recorded failure, and returns
// every buffer the tape handed out to its arena: the tape is ready for the
// next step (under the same context until SetContext). Tensors produced
// through the tape must not be used after.
func (tp *Tape) Reset() {
	if !tp.child {
		tp.run.mu.Lock()
		tp.run.err = nil
		tp.run.mu.Unlock()
	}
	for _, b := range tp.live {
		if b.host != nil || b.dev != nil { // nil: released in backward
			b.release(tp.arena)
		}
	}
	clear(tp.live)
	tp.live = tp.live[:0]
	clear(tp.steps)
	tp.steps = tp.steps[:0]
	clear(tp.operands)
	for t, g := range tp.grads {
		delete(tp.grads, t)
		tp.dropRef(g)
	}
}

// LiveFloats returns the number of float32 elements the tape holds from its
// arena since the last Reset: the activations a backward pass will read
// (and the outputs of recomputed blocks), what activation recomputation
// reduces.
func (tp *Tape) LiveFloats() int {
	if tp == nil {
		return 0
	}
	n := 0
	for _, b := range tp.live {
		n += b.floats()
	}
	return n
}

// StepNames returns the names of the recorded steps in order ("linear",
// "bias_gelu", ...): which ops a forward pass ran (tests, profiles).
func (tp *Tape) StepNames() []string {
	if tp == nil {
		return nil
	}
	names := make([]string, len(tp.steps))
	for i, s := range tp.steps {
		names[i] = s.name
	}
	return names
}

// Len returns the number of recorded steps.
func (tp *Tape) Len() int {
	if tp == nil {
		return 0
	}
	return len(tp.steps)
}

// recording reports whether an op on in records a backward step; one
// that does may read any of in then, so their storage stays (pinOperands).
func (tp *Tape) recording(in ...*Tensor) bool {
	if !tp.wantsGrad(in...) {
		return false
	}
	tp.pinOperands(in...)
	return true
}

// wantsGrad is recording without the promise to read in in backward:
// Linear on bfloat16 operands keeps its own bfloat16 input instead.
func (tp *Tape) wantsGrad(in ...*Tensor) bool {
	if tp == nil || tp.disabled {
		return false
	}
	for _, t := range in {
		if t != nil && t.requiresGrad {
			return true
		}
	}
	return false
}

// record adds a backward step producing outs; outs are marked as requiring
// gradients.
func (tp *Tape) record(name string, backward func(tp *Tape), outs ...*Tensor) {
	for _, o := range outs {
		o.requiresGrad = true
		o.leaf = false
	}
	tp.steps = append(tp.steps, step{name: name, live: len(tp.live), outs: outs, backward: backward})
}

// empty returns an uninitialised float32 tensor on dev from the tape's
// arena (or the heap when tp is nil).
func (tp *Tape) empty(dev Device, shape ...int) *Tensor {
	if dev == CUDA {
		t := newCUDA(Float32, shape, false)
		if tp != nil {
			owner := tp
			if tp.parent != nil {
				owner = tp.parent
			}
			owner.live = append(owner.live, liveBuf{dev: t.dbuf})
		}
		return t
	}
	n := numel(shape)
	var buf []float32
	if tp == nil {
		buf = make([]float32, n)
	} else {
		buf = tp.arena.get(n)
		owner := tp
		if tp.parent != nil {
			owner = tp.parent
		}
		owner.live = append(owner.live, liveBuf{host: buf})
	}
	return &Tensor{shape: append([]int(nil), shape...), strides: contiguousStrides(shape), dtype: Float32, dev: dev, f32: buf, leaf: true}
}

// zeros returns a zeroed float32 tensor on dev from the arena.
func (tp *Tape) zeros(dev Device, shape ...int) *Tensor {
	t := tp.empty(dev, shape...)
	if tp != nil {
		backendFor(t).Fill(t, 0)
	}
	return t
}

// Empty returns an uninitialised float32 tensor on the CPU owned by the tape
// (or the heap for a nil tape). Custom functions allocate their outputs with
// EmptyLike, on their inputs' device.
func (tp *Tape) Empty(shape ...int) *Tensor { return tp.empty(CPU, shape...) }

// EmptyLike returns an uninitialised float32 tensor of the given shape on
// like's device, owned by the tape (or the heap for a nil tape).
func (tp *Tape) EmptyLike(like *Tensor, shape ...int) *Tensor { return tp.empty(like.dev, shape...) }

// grad returns the gradient accumulated so far for t, or nil.
func (tp *Tape) grad(t *Tensor) *Tensor {
	if g, ok := tp.grads[t]; ok {
		return g.view
	}
	return nil
}

func (tp *Tape) newGradBuf(t *Tensor) gradRef {
	if t.dev == CUDA {
		z := newCUDA(Float32, t.shape, true)
		return gradRef{view: z, buf: &gradBuf{dev: z.dbuf, refs: 1, owned: true}}
	}
	buf := tp.arena.get(t.Numel())
	view := onDevice(FromFloat32(buf, t.shape...), t.dev)
	backendFor(view).Fill(view, 0)
	return gradRef{view: view, buf: &gradBuf{data: buf, refs: 1, owned: true}}
}

// gradFor returns t's gradient buffer for a kernel to accumulate (+=) into:
// the parameter's Grad for a leaf parameter, a zeroed buffer for an
// intermediate the first time. It returns nil when t needs no gradient.
func (tp *Tape) gradFor(t *Tensor) *Tensor {
	if t == nil || !t.requiresGrad {
		return nil
	}
	if t.leaf {
		if t.Grad == nil {
			t.Grad = ZerosLike(t)
			t.Grad.Name = t.Name + ".grad"
		}
		if tp.ready != nil {
			tp.ready.note(t)
		}
		return t.Grad
	}
	g, ok := tp.grads[t]
	switch {
	case !ok:
		g = tp.newGradBuf(t)
		tp.grads[t] = g
	case g.buf.refs > 1: // shared: copy before writing
		c := tp.newGradBuf(t)
		backendFor(c.view).CopyStrided(c.view, g.view)
		tp.dropRef(g)
		g = c
		tp.grads[t] = g
	}
	return g.view
}

func (tp *Tape) dropRef(g gradRef) {
	g.buf.refs--
	if g.buf.refs == 0 && g.buf.owned {
		if g.buf.dev != nil {
			g.buf.dev.free()
		} else {
			tp.arena.put(g.buf.data)
		}
	}
}

// forget drops t's gradient entry.
func (tp *Tape) forget(t *Tensor) {
	if g, ok := tp.grads[t]; ok {
		delete(tp.grads, t)
		tp.dropRef(g)
	}
}

// passGrad adds from's gradient into t's (same number of elements). When t
// has no gradient yet it shares from's buffer instead of copying: reshapes,
// adds and residual connections cost nothing in backward.
func (tp *Tape) passGrad(t, from *Tensor) {
	g, ok := tp.grads[from]
	if !ok || t == nil || !t.requiresGrad {
		return
	}
	if _, has := tp.grads[t]; !has && !t.leaf {
		g.buf.refs++
		tp.grads[t] = gradRef{view: g.buf.view(t.dev, t.shape), buf: g.buf}
		return
	}
	d := tp.gradFor(t)
	backendFor(d).Axpy(d, 1, g.view)
}

// addGrad adds g (contiguous, t's number of elements) into t's gradient.
func (tp *Tape) addGrad(t, g *Tensor) {
	if t == nil || !t.requiresGrad || g == nil {
		return
	}
	if _, has := tp.grads[t]; !has && !t.leaf {
		buf := gradBufOf(g)
		tp.grads[t] = gradRef{view: buf.view(t.dev, t.shape), buf: buf}
		return
	}
	d := tp.gradFor(t)
	backendFor(d, g).Axpy(d, 1, g)
}

// Backward runs the recorded steps in reverse from a scalar loss, seeding its
// gradient with 1. Parameter gradients accumulate into their Grad tensors.
// It returns the failure recorded on the tape (Fail) during the forward
// pass, without running, or during the backward pass, whose remaining steps
// it then skips.
func (tp *Tape) Backward(loss *Tensor) error {
	if err := tp.Err(); err != nil {
		return err
	}
	if loss.Numel() != 1 {
		return fmt.Errorf("tensor: Backward from %v: want a scalar (use BackwardFrom with an output gradient)", loss.shape)
	}
	one := tp.empty(loss.dev, loss.shape...)
	backendFor(one).Fill(one, 1)
	return tp.BackwardFrom([]*Tensor{loss}, []*Tensor{one})
}

// BackwardFrom runs the recorded steps in reverse, seeding each output with
// the given gradient (a pipeline stage receives its output gradient from the
// next stage). Gradients must be contiguous float32 of the outputs' shapes.
// Failures are returned as Backward's are.
func (tp *Tape) BackwardFrom(outs, grads []*Tensor) error {
	if tp == nil {
		return fmt.Errorf("tensor: Backward on a nil (no-grad) tape")
	}
	if err := tp.Err(); err != nil {
		return err
	}
	if len(outs) != len(grads) {
		return fmt.Errorf("tensor: BackwardFrom with %d outputs and %d gradients", len(outs), len(grads))
	}
	for i, o := range outs {
		if !SameShape(o.shape, grads[i].shape) {
			return fmt.Errorf("tensor: output %d has shape %v but its gradient has shape %v", i, o.shape, grads[i].shape)
		}
		if !o.requiresGrad {
			return fmt.Errorf("tensor: output %d (%v) does not require grad: no recorded op reaches a parameter", i, o)
		}
		tp.addGrad(o, grads[i].Contiguous())
	}
	rt := tp.ready
	if tp.parent != nil || tp.nested || rt == nil || rt.hook == nil {
		rt = nil // child tapes report through their parent's pass
	} else {
		rt.begin(tp.steps)
	}
	failed := false // a step recorded a failure: the rest are skipped
	// With release, live[free:] below the last step's mark has been
	// returned; buffers after the last recorded step stay until Reset.
	free := 0
	if n := len(tp.steps); tp.release && n > 0 {
		free = tp.steps[n-1].live
	}
	for i := len(tp.steps) - 1; i >= 0; i-- {
		s := &tp.steps[i]
		if rt != nil {
			rt.cur = i
		}
		has := !failed
		if has {
			has = false
			for _, o := range s.outs {
				if tp.grad(o) != nil {
					has = true
				}
			}
		}
		if has {
			s.backward(tp)
			failed = tp.Err() != nil
		}
		for _, o := range s.outs {
			tp.forget(o)
		}
		s.backward = nil
		if tp.release {
			// Every step from i on has run: what was handed out after
			// step i-1 was recorded is no longer read.
			lo := 0
			if i > 0 {
				lo = tp.steps[i-1].live
			}
			tp.releaseLive(lo, free)
			free = min(free, lo)
		}
		if rt != nil {
			rt.after(i)
		}
	}
	tp.steps = tp.steps[:0]
	if failed {
		if rt != nil {
			rt.planAt = nil // the pass was cut short: learn nothing from it
		}
		return tp.Err()
	}
	if rt != nil {
		return rt.end()
	}
	return nil
}

// axpy computes y += a*x.
func axpy(y, x []float32, a float32) { cpu.Axpy(y, x, a) }

// Arena hands out float32 buffers by exact length and takes them back; a
// training loop with fixed shapes reuses the same buffers every iteration.
// A length with no free buffer takes the shortest free one up to twice as
// long before new memory: buffers of one length (a last pipeline stage's
// logits) then serve another (a recomputed layer's) while they are idle,
// instead of the arena holding the most ever in use of each length.
// An arena made by NewSizeClassArena rounds lengths up to size classes
// instead, for shapes that change from call to call.
type Arena struct {
	free    map[int][][]float32 // by length, or by class (capacity)
	classes bool
}

// NewArena returns an empty arena.
func NewArena() *Arena { return &Arena{free: map[int][][]float32{}} }

// NewSizeClassArena returns an empty arena whose buffers serve any length of
// their size class (four classes per power of two, so at most a quarter of
// a buffer is unused), or of a class up to two powers of two below when
// their own has none free: a server's decode steps, whose token counts
// change as sequences join and leave, reuse the same few buffers.
func NewSizeClassArena() *Arena { return &Arena{free: map[int][][]float32{}, classes: true} }

// sizeClass is the capacity of the class holding length n: n rounded up to
// a multiple of an eighth of the power of two at or above it (64 at least).
func sizeClass(n int) int {
	if n <= 64 {
		return 64
	}
	step := 1 << (bits.Len(uint(n-1)) - 3)
	return (n + step - 1) &^ (step - 1)
}

func (a *Arena) get(n int) []float32 {

	key, c := n, n
	if a.classes {
		c = sizeClass(n)
		key = c
	}
	if l := a.free[key]; len(l) > 0 {
		b := l[len(l)-1]
		a.free[key] = l[:len(l)-1]
		return b[:n]
	}
	if a.classes {
		// A free buffer of a larger class, up to two powers of two
		// above: buffers allocated for the largest step (a server's
		// warm-up) then serve the smaller ones too, rather than new
		// memory being faulted in for each class a step first needs.
		for range 8 {
			c = sizeClass(c + 1)
			if l := a.free[c]; len(l) > 0 {
				b := l[len(l)-1]
				a.free[c] = l[:len(l)-1]
				return b[:n]
			}
		}
		return make([]float32, n, sizeClass(n))
	}
	best := 0 // the shortest free buffer in (n, 2n]
	for k, l := range a.free {
		if len(l) > 0 && k > n && k <= 2*n && (best == 0 || k < best) {
			best = k
		}
	}
	if best > 0 {
		l := a.free[best]
		b := l[len(l)-1]
		a.free[best] = l[:len(l)-1]
		return b[:n]
	}
	return make([]float32, n, c)
}

func (a *Arena) put(b []float32) {
	b = b[:cap(b)]
	a.free[len(b)] = append(a.free[len(b)], b)
}

// NewNoGradTape returns a tape that records nothing and takes its outputs
// from a (a fresh arena when a is nil): forward-only computation, such as
// decoding, whose buffers go back to the arena at every Reset instead of to
// the garbage collector. Unlike a nil tape it carries a context and records
// failures (SetContext, Fail, Err), so forward-only code whose functions can
// fail (tensor-parallel collectives) runs on one.
func NewNoGradTape(a *Arena) *Tape {
	if a == nil {
		a = NewArena()
	}
	return &Tape{arena: a, disabled: true, grads: map[*Tensor]gradRef{}, run: newRun()}
}

// Param returns a new float32 leaf tensor that requires gradients.
func Param(name string, shape ...int) *Tensor {
	t := Zeros(shape...)
	t.Name = name
	t.requiresGrad = true
	return t
}

// ZeroGrad clears the gradients of params.
func ZeroGrad(params []*Tensor) {
	for _, p := range params {
		if p.Grad != nil {
			backendFor(p.Grad).Fill(p.Grad, 0)
		}
	}
}
