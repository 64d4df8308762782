package tensor

import (
	"math"
	"runtime"
	"testing"
)

// block is a small residual MLP with dropout, used to compare recomputation
// with plain backward.
func block(tp *Tape, in []*Tensor, w1, w2 *Tensor, rng *RNG) []*Tensor {
	h := tp.GELU(tp.Linear(in[0], w1, nil), GELUTanh)
	h = tp.Dropout(h, 0.3, rng)
	return []*Tensor{tp.Add(in[0], tp.Linear(h, w2, nil))}
}

func TestCheckpointMatchesPlainBackward(t *testing.T) {
	init := NewRNG(7)
	x := randParam(init, "x", 1, 4, 6)
	w1 := randParam(init, "w1", 0.5, 8, 6)
	w2 := randParam(init, "w2", 0.5, 6, 8)
	run := func(recompute bool) (loss float32, gx, g1, g2 []float32) {
		ZeroGrad([]*Tensor{x, w1, w2})
		rng := NewRNG(11)
		tp := NewTape()
		var out []*Tensor
		f := func(tp *Tape, in []*Tensor) []*Tensor { return block(tp, in, w1, w2, rng) }
		if recompute {
			out = tp.Checkpoint(f, []*Tensor{x}, rng)
		} else {
			out = f(tp, []*Tensor{x})
		}
		l := tp.Sum(tp.Mul(out[0], out[0]))
		if err := tp.Backward(l); err != nil {
			t.Fatal(err)
		}
		return l.Float32s()[0], x.Grad.Clone().Float32s(), w1.Grad.Clone().Float32s(), w2.Grad.Clone().Float32s()
	}
	l0, gx0, g10, g20 := run(false)
	l1, gx1, g11, g21 := run(true)
	if l0 != l1 {
		t.Fatalf("loss differs: plain %v, recomputed %v", l0, l1)
	}
	for name, pair := range map[string][2][]float32{"x": {gx0, gx1}, "w1": {g10, g11}, "w2": {g20, g21}} {
		for i := range pair[0] {
			if pair[0][i] != pair[1][i] {
				t.Fatalf("grad %s[%d]: plain %v, recomputed %v (recomputation must replay the same dropout mask)", name, i, pair[0][i], pair[1][i])
			}
		}
	}
}

func TestBackwardFromOutputGradient(t *testing.T) {
	// A pipeline stage gets dL/dout from the next stage: backward from
	// (out, g) must equal backward of Σ out⊙g.
	rng := NewRNG(3)
	x := randParam(rng, "x", 1, 3, 4)
	w := randParam(rng, "w", 1, 5, 4)
	g := Zeros(3, 5)
	rng.Normal(g.Float32s(), 0, 1)

	tp := NewTape()
	out := tp.Linear(x, w, nil)
	if err := tp.BackwardFrom([]*Tensor{out}, []*Tensor{g}); err != nil {
		t.Fatal(err)
	}
	want := w.Grad.Clone()
	ZeroGrad([]*Tensor{x, w})
	tp.Reset()
	l := tp.Sum(tp.Mul(tp.Linear(x, w, nil), g))
	if err := tp.Backward(l); err != nil {
		t.Fatal(err)
	}
	for i, v := range want.Float32s() {
		if math.Abs(float64(v-w.Grad.Float32s()[i])) > 1e-5 {
			t.Fatalf("dW[%d]: %v vs %v", i, v, w.Grad.Float32s()[i])
		}
	}
	if err := tp.BackwardFrom([]*Tensor{out}, []*Tensor{Zeros(2, 5)}); err == nil {
		t.Fatal("BackwardFrom accepted a gradient of the wrong shape")
	}
	if err := tp.Backward(Zeros(2)); err == nil {
		t.Fatal("Backward accepted a non-scalar loss")
	}
}

// double is a user-defined function with a hand-written backward.
type double struct{}

func (double) Forward(tp *Tape, in []*Tensor) []*Tensor { return []*Tensor{tp.Scale(in[0], 2)} }
func (double) Backward(tp *Tape, g []*Tensor) []*Tensor { return []*Tensor{tp.Scale(g[0], 2)} }

func TestCustomFunction(t *testing.T) {
	x := Param("x", 3)
	copy(x.Float32s(), []float32{1, 2, 3})
	tp := NewTape()
	y := tp.Apply(double{}, x)[0]
	if err := tp.Backward(tp.Sum(tp.Mul(y, y))); err != nil {
		t.Fatal(err)
	}
	// d/dx Σ(2x)² = 8x
	for i, v := range x.Grad.Float32s() {
		if v != 8*float32(i+1) {
			t.Fatalf("grad[%d] = %v, want %v", i, v, 8*float32(i+1))
		}
	}
}

// TestCustomFunctionOfAView: a strided view (a Split piece) given to
// Apply takes its gradient back into the viewed tensor; before Apply made
// such inputs contiguous the gradient was lost (a view records no step of
// its own: ops route its gradient through their Contiguous).
func TestCustomFunctionOfAView(t *testing.T) {
	x := Param("x", 2, 3)
	copy(x.Float32s(), []float32{1, 2, 3, 4, 5, 6})
	tp := NewTape()
	parts := tp.Split(x, 1, 1, 2) // columns [0] and [1, 2]: strided
	y := tp.Apply(double{}, parts[1])[0]
	if err := tp.Backward(tp.Sum(tp.Mul(y, y))); err != nil {
		t.Fatal(err)
	}
	want := []float32{0, 16, 24, 0, 40, 48} // 8x on the piece, 0 elsewhere
	for i, v := range x.Grad.Float32s() {
		if v != want[i] {
			t.Fatalf("grad = %v, want %v", x.Grad.Float32s(), want)
		}
	}
}

func TestNoGradTapeRecordsNothing(t *testing.T) {
	w := Param("w", 2, 2)
	var tp *Tape
	y := tp.Linear(Zeros(1, 2), w, nil)
	if y.RequiresGrad() || tp.Len() != 0 {
		t.Fatal("nil tape recorded a step")
	}
}

// TestTapeReuseAllocatesNothing: after a warm-up step, a step on the same
// shapes takes every float32 buffer from the tape's arena. What a step
// still allocates (tensor headers, the step list) is measured with
// testing.AllocsPerRun and runtime.MemStats, and must stay below one
// activation buffer (64 KiB here), so a single buffer not reused fails.
func TestTapeReuseAllocatesNothing(t *testing.T) {
	rng := NewRNG(5)
	x := randParam(rng, "x", 1, 64, 256)
	w := randParam(rng, "w", 1, 256, 256)
	b := randParam(rng, "b", 1, 256)
	tp := NewTape()
	step := func() {
		h := tp.LayerNorm(tp.Linear(x, w, nil), b, b, 1e-5) // (1, 64, 256): 64 KiB
		l := tp.Sum(h)
		if err := tp.Backward(l); err != nil {
			t.Fatal(err)
		}
		tp.Reset()
	}
	step()
	const runs = 20
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	allocs := testing.AllocsPerRun(runs, step) // one warm-up call, then runs
	runtime.ReadMemStats(&after)
	perStep := float64(after.TotalAlloc-before.TotalAlloc) / (runs + 1)
	const buffer = 64 * 256 * 4
	if perStep >= buffer/4 {
		t.Fatalf("a step allocates %.0f bytes in %.0f allocations: float32 buffers (%d bytes) are not reused", perStep, allocs, buffer)
	}
}

func TestHalfConversions(t *testing.T) {
	cases := []struct {
		f    float32
		bf16 uint16
		f16  uint16
	}{
		{1, 0x3f80, 0x3c00},
		{-2, 0xc000, 0xc000},
		{65504, 0x4780, 0x7bff},
		{65520, 0x4780, 0x7c00},                 // rounds up to inf in half
		{5.960464477539063e-08, 0x3380, 0x0001}, // smallest half subnormal
		{float32(math.Inf(1)), 0x7f80, 0x7c00},
		{1.00390625, 0x3f80, 0x3c04}, // bf16 tie → even (down)
		{1.01171875, 0x3f82, 0x3c0c}, // bf16 tie → even (up)
	}
	for _, c := range cases {
		if got := Float32ToBFloat16(c.f); got != c.bf16 {
			t.Errorf("bf16(%g) = %#04x, want %#04x", c.f, got, c.bf16)
		}
		if got := Float32ToFloat16(c.f); got != c.f16 {
			t.Errorf("f16(%g) = %#04x, want %#04x", c.f, got, c.f16)
		}
	}
	for h := range 1 << 16 { // every half survives a round trip
		f := Float16ToFloat32(uint16(h))
		if math.IsNaN(float64(f)) {
			continue
		}
		if back := Float32ToFloat16(f); back != uint16(h) {
			t.Fatalf("f16 %#04x -> %g -> %#04x", h, f, back)
		}
		if back := Float32ToBFloat16(BFloat16ToFloat32(uint16(h))); back != uint16(h) && !math.IsNaN(float64(BFloat16ToFloat32(uint16(h)))) {
			t.Fatalf("bf16 %#04x round trip gave %#04x", h, back)
		}
	}
	x := FromFloat32([]float32{1.5, -3.25}, 2)
	if y := x.To(BFloat16).To(Float32).Float32s(); y[0] != 1.5 || y[1] != -3.25 {
		t.Fatalf("To round trip: %v", y)
	}
}

func TestRNGStreams(t *testing.T) {
	a, b := make([]float32, 1000), make([]float32, 1000)
	NewRNG(1).Normal(a, 0, 1)
	NewRNG(1).Normal(b, 0, 1)
	for i := range a {
		if a[i] != b[i] {
			t.Fatal("same seed gave different streams")
		}
	}
	r := NewRNG(1)
	tp0 := r.Fork("model-parallel-0")
	tp1 := r.Fork("model-parallel-1")
	x, y := make([]float32, 8), make([]float32, 8)
	tp0.Uniform(x, 0, 1)
	tp1.Uniform(y, 0, 1)
	if x[0] == y[0] && x[1] == y[1] {
		t.Fatal("forked streams are equal")
	}
	// Mean and variance of the normal stream.
	var s, s2 float64
	for _, v := range a {
		s += float64(v)
		s2 += float64(v) * float64(v)
	}
	mean, vr := s/1000, s2/1000-(s/1000)*(s/1000)
	if math.Abs(mean) > 0.1 || math.Abs(vr-1) > 0.15 {
		t.Fatalf("normal stream mean %v var %v", mean, vr)
	}
	// State/SetState replays.
	st := r.State()
	r.Uniform(x, 0, 1)
	r.SetState(st)
	r.Uniform(y, 0, 1)
	for i := range x {
		if x[i] != y[i] {
			t.Fatal("SetState did not replay")
		}
	}
	m := make([]float32, 10000)
	NewRNG(2).DropoutMask(m, 0.25)
	kept := 0
	for _, v := range m {
		if v != 0 {
			kept++
			if v != 1/(1-float32(0.25)) {
				t.Fatalf("kept value %v", v)
			}
		}
	}
	if kept < 7200 || kept > 7800 {
		t.Fatalf("dropout kept %d of 10000 at p=0.25", kept)
	}
}

// TestCheckpointReleasesIntermediates: a checkpointed block keeps only its
// outputs' buffers on the tape after forward; its intermediates go back to
// the arena at once (the memory recomputation exists to save), so the next
// block reuses them, while the tape without checkpointing holds them all.
func TestCheckpointReleasesIntermediates(t *testing.T) {
	init := NewRNG(7)
	x := randParam(init, "x", 1, 4, 6)
	w1 := randParam(init, "w1", 0.5, 8, 6)
	w2 := randParam(init, "w2", 0.5, 6, 8)
	liveFloats := func(recompute bool) int {
		rng := NewRNG(11)
		tp := NewTape()
		f := func(tp *Tape, in []*Tensor) []*Tensor { return block(tp, in, w1, w2, rng) }
		h := []*Tensor{x}
		for range 4 {
			if recompute {
				h = tp.Checkpoint(f, h, rng)
			} else {
				h = f(tp, h)
			}
		}
		n := 0
		for _, b := range tp.live {
			n += b.floats()
		}
		if err := tp.Backward(tp.Sum(h[0])); err != nil {
			t.Fatal(err)
		}
		return n
	}
	plain, ckpt := liveFloats(false), liveFloats(true)
	// Each block's output is (4, 6): four of them stay with the tape.
	if ckpt != 4*4*6 {
		t.Errorf("checkpointed blocks hold %d floats on the tape after forward, want the 4 outputs' %d", ckpt, 4*4*6)
	}
	if plain <= 3*ckpt {
		t.Errorf("plain blocks hold %d floats, checkpointed %d: the intermediates should dominate without recomputation", plain, ckpt)
	}
}

// passBack is a function whose backward returns the output's gradient
// itself (an identity backward, like reduce-from-TP's).
type passBack struct{}

func (passBack) Forward(tp *Tape, in []*Tensor) []*Tensor {
	out := tp.Empty(in[0].Shape()...)
	copy(out.Float32s(), in[0].Float32s())
	return []*Tensor{out}
}
func (passBack) Backward(tp *Tape, g []*Tensor) []*Tensor { return []*Tensor{g[0]} }

// heapDouble is double with its backward's result on the heap (as a
// communication buffer would be), which the tape must copy.
type heapDouble struct{}

func (heapDouble) Forward(tp *Tape, in []*Tensor) []*Tensor { return []*Tensor{tp.Scale(in[0], 2)} }
func (heapDouble) Backward(tp *Tape, g []*Tensor) []*Tensor {
	d := make([]float32, g[0].Numel())
	for i, v := range g[0].Float32s() {
		d[i] = 2 * v
	}
	return []*Tensor{FromFloat32(d, g[0].Shape()...)}
}

// TestCustomFunctionGradientOwnership: Apply shares an identity backward's
// gradient and adopts a fresh one instead of copying, and the sums come out
// as if it had copied, whatever the order in which an intermediate's uses
// deliver their gradients.
func TestCustomFunctionGradientOwnership(t *testing.T) {
	rng := NewRNG(9)
	x := randParam(rng, "x", 1, 4, 6)
	c := make([]*Tensor, 4)
	for i := range c {
		c[i] = Zeros(4, 6)
		rng.Normal(c[i].Float32s(), 0, 1)
	}
	for _, order := range [][]int{{0, 1, 2, 3}, {3, 2, 1, 0}, {1, 3, 0, 2}, {0, 2, 3, 1}} {
		ZeroGrad([]*Tensor{x})
		tp := NewTape()
		h := tp.Scale(x, 1) // an intermediate: its gradient is the tape's
		var ys [4]*Tensor
		for _, k := range order {
			switch k {
			case 0:
				ys[k] = tp.Apply(passBack{}, h)[0]
			case 1:
				ys[k] = tp.Apply(double{}, h)[0]
			case 2:
				ys[k] = tp.Apply(heapDouble{}, h)[0]
			case 3:
				ys[k] = tp.Apply(passBack{}, h)[0]
			}
		}
		var loss *Tensor
		for _, k := range order {
			l := tp.Sum(tp.Mul(ys[k], c[k]))
			if loss == nil {
				loss = l
			} else {
				loss = tp.Add(loss, l)
			}
		}
		if err := tp.Backward(loss); err != nil {
			t.Fatal(err)
		}
		// dx = c0 + 2 c1 + 2 c2 + c3
		for i, v := range x.Grad.Float32s() {
			want := c[0].f32[i] + 2*c[1].f32[i] + 2*c[2].f32[i] + c[3].f32[i]
			if math.Abs(float64(v-want)) > 1e-5 {
				t.Fatalf("order %v: dx[%d] = %v, want %v", order, i, v, want)
			}
		}
		tp.Reset()
	}
}

// TestSizeClassArena: a size-class arena hands out buffers of the asked
// length whose capacity is the class (at least the length, less than a
// quarter unused above 64), takes them back whole, serves every length of a
// class from one buffer, and a length whose class has none free from a
// larger class up to two powers of two above; a no-grad tape on it records nothing and
// reuses its buffers across steps whose shapes change.
func TestSizeClassArena(t *testing.T) {
	prev := 0
	for n := 1; n < 1<<20; n += 1 + n/7 {
		c := sizeClass(n)
		if c < n || c < prev || (n > 64 && float64(c-n) >= 0.25*float64(c)) {
			t.Fatalf("sizeClass(%d) = %d (previous class %d)", n, c, prev)
		}
		prev = c
	}
	a := NewSizeClassArena()
	b := a.get(1000)
	if len(b) != 1000 || cap(b) != sizeClass(1000) {
		t.Fatalf("get(1000): len %d cap %d, want 1000 and %d", len(b), cap(b), sizeClass(1000))
	}
	b[0] = 7
	a.put(b)
	if c := a.get(sizeClass(1000)); &c[0] != &b[0] || len(c) != sizeClass(1000) {
		t.Fatal("a length of the same class did not get the returned buffer")
	}
	if c := a.get(1000); &c[0] == &b[0] {
		t.Fatal("a buffer was handed out twice")
	}
	big := a.get(4000) // class 4096, two powers of two above 1000's
	a.put(big)
	if c := a.get(100); &c[0] == &big[0] {
		t.Fatal("a buffer six powers of two too big was handed out")
	}
	if c := a.get(1000); &c[0] != &big[0] || cap(c) != sizeClass(4000) {
		t.Fatal("with its class empty, a length did not get a free buffer of a larger class")
	}
	if e := NewArena().get(1000); cap(e) != 1000 {
		t.Fatalf("exact arena: cap %d, want 1000", cap(e))
	}

	rng := NewRNG(3)
	w := randParam(rng, "w", 1, 128, 128)
	tp := NewNoGradTape(NewSizeClassArena())
	step := func(rows int) {
		x := tp.Empty(1, rows, 128)
		clear(x.Float32s())
		y := tp.GELU(tp.Linear(x, w, nil), GELUTanh)
		if y.RequiresGrad() || tp.Len() != 0 {
			t.Fatal("no-grad tape recorded a step")
		}
		tp.Reset()
	}
	for rows := 30; rows <= 32; rows++ { // one size class: 30·128 … 32·128
		step(rows)
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for rows := 30; rows <= 32; rows++ {
		step(rows)
	}
	runtime.ReadMemStats(&after)
	if got := after.TotalAlloc - before.TotalAlloc; got >= 30*128*4 {
		t.Fatalf("steps of 30–32 rows allocated %d bytes after warm-up: buffers are not reused across lengths of a class", got)
	}
}

// TestReleaseInBackward: a tape that releases its forward buffers during
// backward (SetReleaseInBackward) computes the same gradients bit for bit,
// with and without checkpointed blocks, and needs fewer buffers in all: the
// backward's gradients reuse what the forward's later steps held.
func TestReleaseInBackward(t *testing.T) {
	init := NewRNG(7)
	x := randParam(init, "x", 1, 4, 6)
	w1 := randParam(init, "w1", 0.5, 8, 6)
	w2 := randParam(init, "w2", 0.5, 6, 8)
	run := func(recompute, release bool) (grads [][]float32, made int) {
		for _, p := range []*Tensor{x, w1, w2} {
			p.Grad = nil
		}
		rng := NewRNG(11)
		tp := NewTape()
		tp.SetReleaseInBackward(release)
		f := func(tp *Tape, in []*Tensor) []*Tensor { return block(tp, in, w1, w2, rng) }
		for range 2 { // the second iteration reuses the first's buffers
			tp.Reset()
			h := []*Tensor{x}
			for range 4 {
				if recompute {
					h = tp.Checkpoint(f, h, rng)
				} else {
					h = f(tp, h)
				}
			}
			if err := tp.Backward(tp.Sum(h[0])); err != nil {
				t.Fatal(err)
			}
		}
		for _, p := range []*Tensor{x, w1, w2} {
			grads = append(grads, append([]float32(nil), p.Grad.Float32s()...))
		}
		tp.Reset()
		for _, l := range tp.arena.free {
			for _, b := range l {
				made += cap(b)
			}
		}
		return grads, made
	}
	for _, recompute := range []bool{false, true} {
		want, keep := run(recompute, false)
		got, rel := run(recompute, true)
		for i := range want {
			for j := range want[i] {
				if math.Float32bits(got[i][j]) != math.Float32bits(want[i][j]) {
					t.Fatalf("recompute=%v: gradient %d[%d] = %v with release, %v without", recompute, i, j, got[i][j], want[i][j])
				}
			}
		}
		// Checkpointed blocks' recomputations release either way; the
		// plain blocks' forward buffers go back only with release.
		if rel > keep || !recompute && rel >= keep {
			t.Errorf("recompute=%v: %d floats of buffers with release, %d without: want fewer", recompute, rel, keep)
		}
		t.Logf("recompute=%v: %d floats of buffers with release, %d without", recompute, rel, keep)
	}
}

// TestArenaBestFit: a length with no free buffer takes the shortest free
// one up to twice as long, which goes back under its own length.
func TestArenaBestFit(t *testing.T) {
	a := NewArena()
	b15, b18, b100 := a.get(15), a.get(18), a.get(100)
	a.put(b15)
	a.put(b18)
	a.put(b100)
	b := a.get(10)
	if len(b) != 10 || cap(b) != 15 || &b[:1][0] != &b15[0] {
		t.Fatalf("get(10) = len %d cap %d: want the free buffer of 15", len(b), cap(b))
	}
	a.put(b)
	if l := a.free[15]; len(l) != 1 || len(l[0]) != 15 {
		t.Fatalf("the buffer of 15 went back as %v", a.free)
	}
	if b := a.get(40); cap(b) != 40 {
		t.Errorf("get(40) took a buffer of %d: want new memory (100 is over twice as long)", cap(b))
	}
	if b := a.get(18); &b[0] != &b18[0] {
		t.Errorf("get(18) did not take its own length's buffer")
	}
}
