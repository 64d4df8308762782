package tensor

import (
	"math"
	"slices"
	"testing"
)

// bf16Run is a small training graph (embedding, two linear layers, the
// tied output layer, cross-entropy) under MatmulBF16 for steps steps on
// dev, each followed by an update of every parameter made on the host and
// copied back; copies registers the parameters for bfloat16 copies, and
// invalidate says whether the update is followed by Invalidate. It returns
// each step's loss and the last step's gradients.
func bf16Run(t *testing.T, dev Device, steps int, copies, invalidate bool) (losses []float32, grads [][]float32) {
	t.Helper()
	rng := NewRNG(11)
	const b, tt, h, vocab = 2, 5, 16, 13
	emb, w1, b1, w2 := Param("emb", vocab, h), Param("w1", 2*h, h), Param("b1", 2*h), Param("w2", h, 2*h)
	rng.Fork("emb").Normal(emb.Float32s(), 0, 1)
	rng.Fork("w1").Normal(w1.Float32s(), 0, 0.3)
	rng.Fork("b1").Normal(b1.Float32s(), 0, 0.1)
	rng.Fork("w2").Normal(w2.Float32s(), 0, 0.3)
	params := []*Tensor{emb, w1, b1, w2}
	MoveParams(dev, params...)
	var bw *BF16Weights
	if copies {
		bw = NewBF16Weights(params)
	}
	tokens := FromInt32([]int32{1, 4, 2, 9, 10, 3, 3, 0, 5, 7}, b, tt).ToDevice(dev)
	labels := FromInt32([]int32{4, 2, 9, 10, 3, 3, 0, 5, 7, 12}, b*tt).ToDevice(dev)
	tp := NewTape()
	tp.SetMatmulPrecision(MatmulBF16)
	for s := range steps {
		for _, p := range params {
			p.Grad = nil
		}
		x := tp.Embedding(tokens, emb)
		y := tp.GELU(tp.Linear(x, w1, b1), GELUTanh)
		x = tp.Add(x, tp.Linear(y, w2, nil))
		logits := tp.Linear(x, emb, nil)
		l := tp.CrossEntropy(tp.Reshape(logits, b*tt, vocab), labels, CrossEntropyOptions{})
		losses = append(losses, ToHost(l).Float32s()[0])
		if err := tp.Backward(l); err != nil {
			t.Fatal(err)
		}
		grads = grads[:0]
		for _, p := range params {
			g := ToHost(p.Grad).Float32s()
			grads = append(grads, g)
			v := ToHost(p).Float32s()
			for i := range v {
				v[i] -= 0.5 * g[i] * float32(s+1)
			}
			Copy(p, FromFloat32(v, p.Shape()...).ToDevice(dev))
		}
		tp.Reset()
		if invalidate {
			bw.Invalidate()
		}
	}
	return losses, grads
}

// TestSimBF16OperandsBitIdentical: the simulated device's products on
// bfloat16 operands (weights' copies, activations and gradients cast once)
// give the CPU's MatmulBF16 losses and gradients bit for bit over three
// steps whose updates change every parameter; without Invalidate after an
// update the stale copies change the losses (so the test sees the copies).
func TestSimBF16OperandsBitIdentical(t *testing.T) {
	cpuLoss, cpuGrads := bf16Run(t, CPU, 3, false, false)
	before := BF16GemmOperandCounts()
	simLoss, simGrads := bf16Run(t, Sim, 3, true, true)
	d := BF16GemmOperandCounts().Sub(before)
	for i := range cpuLoss {
		if math.Float32bits(cpuLoss[i]) != math.Float32bits(simLoss[i]) {
			t.Errorf("step %d loss: cpu %v, sim %v", i, cpuLoss[i], simLoss[i])
		}
	}
	for i := range cpuGrads {
		for j := range cpuGrads[i] {
			if math.Float32bits(cpuGrads[i][j]) != math.Float32bits(simGrads[i][j]) {
				t.Fatalf("gradient %d element %d: cpu %v, sim %v", i, j, cpuGrads[i][j], simGrads[i][j])
			}
		}
	}
	// per step: 3 linear layers, 3 forward + 3 dX + 3 dW products on
	// bfloat16 operands; the three weights cast once a step (b1 is no
	// product's operand), three inputs and three output gradients cast.
	want := BF16OperandCounts{BF16OperandProducts: 27, WeightCasts: 9, ActCasts: 18}
	if d.BF16OperandProducts != want.BF16OperandProducts || d.FP32OperandProducts != 0 || d.WeightCasts != want.WeightCasts || d.ActCasts != want.ActCasts {
		t.Errorf("counts: %v, want 27 products on bfloat16 operands, none on float32, 9 weight casts, 18 activation casts", d)
	}

	stale, _ := bf16Run(t, Sim, 3, true, false)
	if math.Float32bits(stale[0]) != math.Float32bits(cpuLoss[0]) || stale[2] == cpuLoss[2] {
		t.Errorf("without Invalidate: losses %v, want the first %v and later ones off %v (stale copies)", stale, cpuLoss[0], cpuLoss)
	}

	defer SetSimBF16GemmOperands(SetSimBF16GemmOperands(false))
	before = BF16GemmOperandCounts()
	offLoss, _ := bf16Run(t, Sim, 1, true, true)
	d = BF16GemmOperandCounts().Sub(before)
	if math.Float32bits(offLoss[0]) != math.Float32bits(cpuLoss[0]) || d.BF16OperandProducts != 0 || d.FP32OperandProducts != 9 || d.WeightCasts+d.ActCasts != 0 {
		t.Errorf("switched off: loss %v (cpu %v), counts %v: want 9 products on float32 operands and no casts", offLoss[0], cpuLoss[0], d)
	}
}

// TestBF16WeightsRecastWhenStorageMoves: a copy is kept while its
// parameter's storage stays where it was; a parameter moved into other
// storage (MoveInto, as fully sharded data parallelism re-gathers) is cast
// again even without Invalidate.
func TestBF16WeightsRecastWhenStorageMoves(t *testing.T) {
	w := FromFloat32([]float32{1, 2.0039062, 3, 4}, 2, 2).ToDevice(Sim)
	w.SetRequiresGrad(true)
	NewBF16Weights([]*Tensor{w})
	var tp *Tape
	be := SimBackend()
	before := BF16GemmOperandCounts()
	c1 := tp.bf16Weight(be, w)
	if tp.bf16Weight(be, w) != c1 {
		t.Fatal("a valid copy was not reused")
	}
	flat := ZerosOn(Sim, 8)
	if err := w.MoveInto(flat.view([]int{4}, []int{1}, 4)); err != nil {
		t.Fatal(err)
	}
	tp.bf16Weight(be, w)
	if n := BF16GemmOperandCounts().Sub(before).WeightCasts; n != 2 {
		t.Errorf("%d weight casts, want 2 (first use, storage moved)", n)
	}
	got := ToHost(c1).To(Float32).Float32s()
	if got[1] != 2 { // 2.0039062 rounds to 2 in bfloat16
		t.Errorf("copy %v, want the bfloat16 rounding [1 2 3 4]", got)
	}
}

// forwardDoneRun is a norm, a GELU and a square read by linear layers
// (and the square also by a product that keeps it) under MatmulBF16 on
// dev, ForwardDone called on each once read. It returns the tape's float32
// slots after the forward and what each ForwardDone returned, the loss
// and the parameters' gradients.
func forwardDoneRun(t *testing.T, dev Device) (live int, freed []int, loss float32, grads [][]float32) {
	t.Helper()
	const rows, h, f = 6, 8, 16
	rng := NewRNG(5)
	x, nw, nb, w1, w2, w3 := Param("x", rows, h), Param("nw", h), Param("nb", h), Param("w1", f, h), Param("w2", h, f), Param("w3", h, h)
	for _, p := range []*Tensor{x, nw, nb, w1, w2, w3} {
		rng.Fork(p.Name).Normal(p.Float32s(), 0.2, 0.5)
	}
	params := []*Tensor{x, nw, nb, w1, w2, w3}
	MoveParams(dev, params...)
	NewBF16Weights(params[1:])
	tp := NewTape()
	tp.SetMatmulPrecision(MatmulBF16)
	done := func(t *Tensor) {
		n := tp.LiveFloats()
		tp.ForwardDone(t)
		freed = append(freed, n-tp.LiveFloats())
	}
	n := tp.LayerNorm(x, nw, nb, 1e-5)
	a := tp.GELU(tp.Linear(n, w1, nil), GELUTanh)
	done(n)
	y := tp.Linear(a, w2, nil)
	done(a)
	s := tp.SquaredReLU(y)
	z := tp.Mul(tp.Linear(s, w3, nil), s) // Mul's backward reads s: it stays
	done(s)
	l := tp.Sum(z)
	live = tp.LiveFloats()
	loss = ToHost(l).Float32s()[0]
	if err := tp.Backward(l); err != nil {
		t.Fatal(err)
	}
	for _, p := range params {
		grads = append(grads, ToHost(p.Grad).Float32s())
	}
	return live, freed, loss, grads
}

// TestForwardDoneReturnsLinearOnlyOutputs: on the simulated device with
// bfloat16 operands, ForwardDone returns the float32 output of a norm and
// of an activation that only linear layers read (their backward keeps the
// bfloat16 cast) and keeps one that another op's backward reads; the
// loss and gradients stay the CPU's bit for bit. On the CPU, and with the
// operands off, it returns nothing.
func TestForwardDoneReturnsLinearOnlyOutputs(t *testing.T) {
	const rows, h, f = 6, 8, 16
	cpuLive, cpuFreed, cpuLoss, cpuGrads := forwardDoneRun(t, CPU)
	before := BF16GemmOperandCounts()
	simLive, simFreed, simLoss, simGrads := forwardDoneRun(t, Sim)
	// the norm's kernel wrote w1's operand; GELU's and the square's
	// outputs and the three output gradients are cast
	if d := BF16GemmOperandCounts().Sub(before); d.FusedCasts != 1 || d.FusedCastElems != rows*h || d.ActCasts != 5 {
		t.Errorf("sim counts %v: want 1 operand written by the norm (%d elements), 5 casts", d, rows*h)
	}
	if want := []int{0, 0, 0}; !slices.Equal(cpuFreed, want) {
		t.Errorf("CPU: ForwardDone returned %v float32 slots, want %v", cpuFreed, want)
	}
	if want := []int{rows * h, rows * f, 0}; !slices.Equal(simFreed, want) {
		t.Errorf("sim: ForwardDone returned %v float32 slots, want %v (the norm's and the GELU's outputs, not the square read by Mul)", simFreed, want)
	}
	if math.Float32bits(cpuLoss) != math.Float32bits(simLoss) {
		t.Errorf("loss: cpu %v, sim %v", cpuLoss, simLoss)
	}
	for i := range cpuGrads {
		if !slices.Equal(cpuGrads[i], simGrads[i]) {
			t.Errorf("gradient %d: cpu %v, sim %v", i, cpuGrads[i], simGrads[i])
		}
	}
	// the sim's tape: the CPU's, less the two outputs, plus the three
	// linear layers' bfloat16 inputs (half a slot an element)
	if want := cpuLive - rows*(h+f) + rows*(h+f+h)/2; simLive != want {
		t.Errorf("float32 slots after the forward: sim %d, cpu %d: want %d", simLive, cpuLive, want)
	}
	prev := SetSimBF16GemmOperands(false)
	offLive, offFreed, offLoss, _ := forwardDoneRun(t, Sim)
	SetSimBF16GemmOperands(prev)
	if !slices.Equal(offFreed, []int{0, 0, 0}) || offLive != cpuLive || offLoss != cpuLoss {
		t.Errorf("sim on float32 operands: returned %v, %d slots, loss %v: want nothing returned, the CPU's %d and %v", offFreed, offLive, offLoss, cpuLive, cpuLoss)
	}
}

// TestForwardDoneReadAfterFails: a returned output cannot be read by
// mistake (its buffer may hold another tensor's values by then).
func TestForwardDoneReadAfterFails(t *testing.T) {
	x, w, w1 := Param("x", 2, 4), Param("w", 4), Param("w1", 3, 4)
	MoveParams(Sim, x, w, w1)
	NewBF16Weights([]*Tensor{w1})
	tp := NewTape()
	tp.SetMatmulPrecision(MatmulBF16)
	n := tp.RMSNorm(x, w, 1e-5)
	tp.Linear(n, w1, nil)
	tp.ForwardDone(n)
	defer func() {
		if recover() == nil {
			t.Error("reading a returned output did not fail")
		}
	}()
	ToHost(n).Float32s()
}

// TestNormOperandDroppedWhenReadFirst: a norm's bfloat16 operand that
// another op reads before any linear layer (a query/key norm's RoPE, a
// collective) goes back at once, and a linear layer reading the output
// after casts it as before.
func TestNormOperandDroppedWhenReadFirst(t *testing.T) {
	const rows, h = 4, 6
	x, w, w1 := Param("x", rows, h), Param("w", h), Param("w1", 3, h)
	MoveParams(Sim, x, w, w1)
	NewBF16Weights([]*Tensor{w1})
	tp := NewTape()
	tp.SetMatmulPrecision(MatmulBF16)
	n := tp.RMSNorm(x, w, 1e-5)
	live := tp.LiveFloats()
	tp.Mul(n, n)
	if got, want := tp.LiveFloats(), live+rows*h-rows*h/2; got != want {
		t.Errorf("after Mul: %d float32 slots, want %d (Mul's output, the norm's bfloat16 operand returned)", got, want)
	}
	before := BF16GemmOperandCounts()
	tp.Linear(n, w1, nil)
	if d := BF16GemmOperandCounts().Sub(before); d.FusedCasts != 0 || d.ActCasts != 1 {
		t.Errorf("Linear after: counts %v, want its input cast", d)
	}
}
