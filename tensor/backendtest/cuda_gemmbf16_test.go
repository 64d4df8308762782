package backendtest

import (
	"fmt"
	"math"
	"testing"

	"github.com/gotron/gotron/tensor"
)

// cudaTolGemmBF16 bounds the products on bfloat16 operands (gemm-bf16)
// against the CPU's MatmulBF16 in the first step, per element relative to
// max(1, |cpu|): both multiply the same bfloat16 operands (cast with
// round to nearest even, as the CPU rounds them) exactly, so only the
// order of the float32 sums (cuBLAS's tiles, the tensor cores'
// accumulation) differs — the float32 tolerance cudaTol's order, five
// times it for the tensor cores' accumulation, which need not round each
// addition to nearest. Once an update has moved the parameters by those
// differences, an operand can round to the other neighbouring bfloat16,
// so the later steps are held to cudaTolBF16.
const cudaTolGemmBF16 = 1e-3

// gemmBF16Run trains a small graph (embedding, two linear layers, the
// tied output layer, cross-entropy) under MatmulBF16 on dev for steps
// steps, its parameters registered for bfloat16 copies and each step
// followed by an update made on the host and Invalidate; it returns each
// step's loss and every step's gradients.
func gemmBF16Run(dev tensor.Device, steps int) (losses []float32, grads [][][]float32, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%v", r)
		}
	}()
	rng := tensor.NewRNG(11)
	const b, tt, h, vocab = 2, 24, 64, 50
	emb, w1, b1, w2 := tensor.Param("emb", vocab, h), tensor.Param("w1", 4*h, h), tensor.Param("b1", 4*h), tensor.Param("w2", h, 4*h)
	rng.Fork("emb").Normal(emb.Float32s(), 0, 1)
	rng.Fork("w1").Normal(w1.Float32s(), 0, 0.2)
	rng.Fork("b1").Normal(b1.Float32s(), 0, 0.1)
	rng.Fork("w2").Normal(w2.Float32s(), 0, 0.2)
	params := []*tensor.Tensor{emb, w1, b1, w2}
	tensor.MoveParams(dev, params...)
	bw := tensor.NewBF16Weights(params)
	ids, labels := make([]int32, b*tt), make([]int32, b*tt)
	for i := range ids {
		ids[i], labels[i] = int32((7*i+3)%vocab), int32((5*i+1)%vocab)
	}
	tokens := tensor.FromInt32(ids, b, tt).ToDevice(dev)
	targets := tensor.FromInt32(labels, b*tt).ToDevice(dev)
	tp := tensor.NewTape()
	tp.SetMatmulPrecision(tensor.MatmulBF16)
	for range steps {
		for _, p := range params {
			p.Grad = nil
		}
		x := tp.Embedding(tokens, emb)
		y := tp.GELU(tp.Linear(x, w1, b1), tensor.GELUTanh)
		x = tp.Add(x, tp.Linear(y, w2, nil))
		logits := tp.Linear(x, emb, nil)
		l := tp.CrossEntropy(tp.Reshape(logits, b*tt, vocab), targets, tensor.CrossEntropyOptions{})
		losses = append(losses, tensor.ToHost(l).Float32s()[0])
		if err := tp.Backward(l); err != nil {
			return nil, nil, err
		}
		var gs [][]float32
		for _, p := range params {
			g := append([]float32(nil), tensor.ToHost(p.Grad).Float32s()...)
			gs = append(gs, g)
			v := tensor.ToHost(p).Float32s()
			for i := range v {
				v[i] -= 0.1 * g[i]
			}
			tensor.Copy(p, tensor.FromFloat32(v, p.Shape()...).ToDevice(dev))
		}
		grads = append(grads, gs)
		tp.Reset()
		bw.Invalidate()
	}
	return losses, grads, nil
}

// TestCUDABF16GemmOperandsMatchCPU runs products on bfloat16 operands on
// the GPU (gemm-bf16: the weights' bfloat16 copies, activations and
// output gradients cast by elem_convert, cuBLAS with CUDA_R_16BF A and B,
// float32 C, CUBLAS_COMPUTE_32F) against the CPU's MatmulBF16 over three
// steps: the first step's loss and gradients within cudaTolGemmBF16, the
// later losses and gradients within cudaTolBF16; every product read
// bfloat16 operands and each weight was cast once a step.
func TestCUDABF16GemmOperandsMatchCPU(t *testing.T) {
	cudaBackend(t)
	defer tensor.SetCUDABF16GemmOperands(tensor.SetCUDABF16GemmOperands(true))
	const steps = 3
	wantLoss, wantGrads, err := gemmBF16Run(tensor.CPU, steps)
	if err != nil {
		t.Fatalf("cpu: %v", err)
	}
	before := tensor.BF16GemmOperandCounts()
	gotLoss, gotGrads, err := gemmBF16Run(tensor.CUDA, steps)
	if err != nil {
		t.Fatalf("cuda: %v", err)
	}
	d := tensor.BF16GemmOperandCounts().Sub(before)
	for s := range steps {
		tol := cudaTolGemmBF16
		if s > 0 {
			tol = cudaTolBF16
		}
		if err := closeAll(fmt.Sprintf("step %d loss", s+1), [][]float32{{gotLoss[s]}}, [][]float32{{wantLoss[s]}}, tol); err != nil {
			t.Error(err)
		}
		if err := closeAll(fmt.Sprintf("step %d gradient", s+1), gotGrads[s], wantGrads[s], tol); err != nil {
			t.Error(err)
		}
	}
	t.Logf("losses: cuda %v, cpu %v; %v", gotLoss, wantLoss, d)
	if d.FP32OperandProducts != 0 || d.BF16OperandProducts != 9*steps || d.WeightCasts != 3*steps {
		t.Errorf("counts %v: want %d products on bfloat16 operands, none on float32, %d weight casts", d, 9*steps, 3*steps)
	}
	if math.IsNaN(float64(gotLoss[steps-1])) {
		t.Error("the last loss is NaN")
	}
}

// TestSimGemmBF16RunMatchesCPU runs TestCUDABF16GemmOperandsMatchCPU's
// graph on the simulated device, whose products read bfloat16 operands
// the same way: every step's loss and gradients are the CPU's bit for bit
// (so the GPU test's harness is checked without a GPU).
func TestSimGemmBF16RunMatchesCPU(t *testing.T) {
	const steps = 3
	wantLoss, wantGrads, err := gemmBF16Run(tensor.CPU, steps)
	if err != nil {
		t.Fatalf("cpu: %v", err)
	}
	before := tensor.BF16GemmOperandCounts()
	gotLoss, gotGrads, err := gemmBF16Run(tensor.Sim, steps)
	if err != nil {
		t.Fatalf("sim: %v", err)
	}
	d := tensor.BF16GemmOperandCounts().Sub(before)
	for s := range steps {
		if err := closeAll(fmt.Sprintf("step %d loss", s+1), [][]float32{{gotLoss[s]}}, [][]float32{{wantLoss[s]}}, 0); err != nil {
			t.Error(err)
		}
		if err := closeAll(fmt.Sprintf("step %d gradient", s+1), gotGrads[s], wantGrads[s], 0); err != nil {
			t.Error(err)
		}
	}
	if d.FP32OperandProducts != 0 || d.BF16OperandProducts != 9*steps || d.WeightCasts != 3*steps {
		t.Errorf("counts %v: want %d products on bfloat16 operands, none on float32, %d weight casts", d, 9*steps, 3*steps)
	}
}

// normBF16Forward is the backends' norm forward that also writes the
// output rounded to bfloat16 (gemm-bf16's operand of the next linear
// layer).
type normBF16Forward interface {
	LayerNormForwardBF16(out, out16, mean, rstd, x, w, b *tensor.Tensor, eps float32)
	RMSNormForwardBF16(out, out16, rstd, x, w *tensor.Tensor, eps float32)
	BiasDropoutAddNormForwardBF16(sum, out, out16, keep, mean, rstd, residual, y, b, w, nb *tensor.Tensor, p float32, rng tensor.RNGState, eps float32)
}

// normBF16Outputs runs LayerNorm (with and without a bias) and RMSNorm of
// rows × c inputs on be, then the residual add with each (without
// dropout), writing bfloat16 operands unless be is the CPU's
// (whose norms write none: the reference), and returns each float32
// output and its bfloat16 one, read back.
func normBF16Outputs(t *testing.T, be tensor.Backend, rows, c int) (outs [][]float32, outs16 [][]uint16) {
	t.Helper()
	dev := be.Device()
	nb, ok := be.(normBF16Forward)
	if !ok && dev != tensor.CPU {
		t.Fatalf("%s backend has no norm forward writing bfloat16", be.Name())
	}
	rng := tensor.NewRNG(21)
	host := func(name string, std float32, shape ...int) *tensor.Tensor {
		n := 1
		for _, d := range shape {
			n *= d
		}
		v := make([]float32, n)
		rng.Fork(name).Normal(v, 0.3, std)
		return tensor.FromFloat32(v, shape...).ToDevice(dev)
	}
	x, res := host("x", 2, rows, c), host("res", 1, rows, c)
	w, b := host("w", 1, c), host("b", 0.5, c)
	for i, bias := range []*tensor.Tensor{b, nil, nil, b, nil, nil} {
		out, out16 := tensor.NewOn(dev, tensor.Float32, rows, c), tensor.NewOn(dev, tensor.BFloat16, rows, c)
		mean, rstd := tensor.NewOn(dev, tensor.Float32, rows), tensor.NewOn(dev, tensor.Float32, rows)
		sum := tensor.NewOn(dev, tensor.Float32, rows, c)
		if i%3 == 2 {
			mean = nil // RMSNorm
		}
		switch {
		case i >= 3 && !ok:
			be.BiasDropoutAddNormForward(sum, out, nil, mean, rstd, res, x, nil, w, bias, 0, tensor.RNGState{}, 1e-5)
		case i >= 3:
			nb.BiasDropoutAddNormForwardBF16(sum, out, out16, nil, mean, rstd, res, x, nil, w, bias, 0, tensor.RNGState{}, 1e-5)
		case !ok && mean != nil:
			be.LayerNormForward(out, mean, rstd, x, w, bias, 1e-5)
		case !ok:
			be.RMSNormForward(out, rstd, x, w, 1e-5)
		case mean != nil:
			nb.LayerNormForwardBF16(out, out16, mean, rstd, x, w, bias, 1e-5)
		default:
			nb.RMSNormForwardBF16(out, out16, rstd, x, w, 1e-5)
		}
		outs = append(outs, tensor.ToHost(out).Float32s())
		outs16 = append(outs16, tensor.ToHost(out16).Uint16s())
	}
	return outs, outs16
}

// checkNormBF16 checks normBF16Outputs on be against the CPU's norms
// (within tol) and each bfloat16 output against the rounding of the same
// backend's float32 one, bit for bit.
func checkNormBF16(t *testing.T, be tensor.Backend, tol float64) {
	const rows, c = 37, 300 // rows over several blocks, c not a multiple of the block
	outs, outs16 := normBF16Outputs(t, be, rows, c)
	cpu, _ := normBF16Outputs(t, tensor.CPUBackend(), rows, c)
	if err := closeAll(be.Name()+" norm output", outs, cpu, tol); err != nil {
		t.Error(err)
	}
	for i := range outs {
		for j, v := range outs[i] {
			if want := tensor.Float32ToBFloat16(v); outs16[i][j] != want {
				t.Fatalf("%s norm %d element %d: bfloat16 output %#04x, the rounding of its float32 output %v is %#04x", be.Name(), i, j, outs16[i][j], v, want)
			}
		}
	}
}

// TestCUDANormBF16OperandsMatchCPU: norm.cu's LayerNorm and RMSNorm
// kernels that also write their output rounded to bfloat16 (gemm-bf16):
// the float32 output within cudaTol of the CPU's, the bfloat16 one its
// rounding bit for bit.
func TestCUDANormBF16OperandsMatchCPU(t *testing.T) {
	checkNormBF16(t, cudaBackend(t), cudaTol)
}

// TestSimNormBF16Operands runs TestCUDANormBF16OperandsMatchCPU's check on
// the simulated device (bit for bit), so its harness is checked without a
// GPU.
func TestSimNormBF16Operands(t *testing.T) {
	checkNormBF16(t, tensor.SimBackend(), 0)
}
