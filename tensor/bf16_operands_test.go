package tensor

import (
	"math"
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
