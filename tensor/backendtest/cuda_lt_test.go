package backendtest

import (
	"fmt"
	"testing"

	"github.com/gotron/gotron/tensor"
)

// ltRun trains a small graph whose two linear layers have biases
// (embedding, LinearGELU — Linear+bias and tanh GELU —, Linear+bias,
// residual add, the tied output layer, cross-entropy) under prec on dev for steps steps, each
// followed by an update made on the host; it returns each step's loss and
// gradients, and the cuBLASLt counts of the run.
func ltRun(dev tensor.Device, prec tensor.MatmulPrecision, steps int) (losses []float32, grads [][][]float32, counts tensor.LtCounts, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%v", r)
		}
	}()
	before := tensor.CUDALtCounts()
	rng := tensor.NewRNG(12)
	const b, tt, h, vocab = 2, 24, 64, 50
	emb, w1, b1, w2, b2 := tensor.Param("emb", vocab, h), tensor.Param("w1", 4*h, h), tensor.Param("b1", 4*h), tensor.Param("w2", h, 4*h), tensor.Param("b2", h)
	for name, p := range map[string]*tensor.Tensor{"emb": emb, "w1": w1, "b1": b1, "w2": w2, "b2": b2} {
		rng.Fork(name).Normal(p.Float32s(), 0, 0.2)
	}
	params := []*tensor.Tensor{emb, w1, b1, w2, b2}
	tensor.MoveParams(dev, params...)
	bw := tensor.NewBF16Weights(params)
	ids, labels := make([]int32, b*tt), make([]int32, b*tt)
	for i := range ids {
		ids[i], labels[i] = int32((7*i+3)%vocab), int32((5*i+1)%vocab)
	}
	tokens := tensor.FromInt32(ids, b, tt).ToDevice(dev)
	targets := tensor.FromInt32(labels, b*tt).ToDevice(dev)
	tp := tensor.NewTape()
	tp.SetMatmulPrecision(prec)
	for range steps {
		for _, p := range params {
			p.Grad = nil
		}
		x := tp.Embedding(tokens, emb)
		y := tp.LinearGELU(x, w1, b1, tensor.GELUTanh)
		x = tp.Add(x, tp.Linear(y, w2, b2))
		logits := tp.Linear(x, emb, nil)
		l := tp.CrossEntropy(tp.Reshape(logits, b*tt, vocab), targets, tensor.CrossEntropyOptions{})
		losses = append(losses, tensor.ToHost(l).Float32s()[0])
		if err := tp.Backward(l); err != nil {
			return nil, nil, counts, err
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
	return losses, grads, tensor.CUDALtCounts().Sub(before), nil
}

// checkLtCounts: in every step the first linear layer took the bias and
// GELU branch, the second the bias branch, and in float32 both the
// bias-gradient branch.
func checkLtCounts(t *testing.T, what string, prec tensor.MatmulPrecision, steps int, d tensor.LtCounts) {
	t.Helper()
	wantBGrad := int64(0)
	if prec == tensor.MatmulFP32 {
		wantBGrad = int64(2 * steps)
	}
	if d.Bias != int64(steps) || d.GELU != int64(steps) || d.BGrad != wantBGrad || d.Fallbacks != 0 {
		t.Errorf("%s %v: %v, want %d bias, %d bias and GELU and %d bias-gradient epilogues, no fallback", what, prec, d, steps, steps, wantBGrad)
	}
}

// TestCUDALtMatchesCPU runs ltRun's graph on the GPU with its products
// through cuBLASLt (cublaslt: every Gemm a cublasLtMatmul, the first
// linear layer's bias and tanh GELU by the GELU_AUX_BIAS epilogue, the
// second's bias by BIAS and, in float32, their bias gradients summed by
// the dW products' BGRADB epilogue) against the CPU
// over three steps: float32 within cudaTol every step; --bf16 on float32
// operands (cuBLAS's _FAST_16BF) and on bfloat16 operands (gemm-bf16)
// within cudaTolGemmBF16 in the first step and cudaTolBF16 after (as
// TestCUDABF16GemmOperandsMatchCPU). Every product ran through cuBLASLt:
// no fallback to cuBLAS.
func TestCUDALtMatchesCPU(t *testing.T) {
	cudaBackend(t)
	defer tensor.SetCUDALt(tensor.SetCUDALt(true))
	const steps = 3
	for _, c := range []struct {
		prec         tensor.MatmulPrecision
		bf16Operands bool
	}{{tensor.MatmulFP32, false}, {tensor.MatmulBF16, false}, {tensor.MatmulBF16, true}} {
		name := fmt.Sprintf("%v (bf16 operands %v)", c.prec, c.bf16Operands)
		prev := tensor.SetCUDABF16GemmOperands(c.bf16Operands)
		wantLoss, wantGrads, _, err := ltRun(tensor.CPU, c.prec, steps)
		if err != nil {
			t.Fatalf("cpu: %v", err)
		}
		gotLoss, gotGrads, d, err := ltRun(tensor.CUDA, c.prec, steps)
		tensor.SetCUDABF16GemmOperands(prev)
		if err != nil {
			t.Fatalf("%s on cuda: %v", name, err)
		}
		for s := range steps {
			tol := cudaTol
			if c.prec == tensor.MatmulBF16 {
				tol = cudaTolGemmBF16
				if s > 0 {
					tol = cudaTolBF16
				}
			}
			if err := closeAll(fmt.Sprintf("%s step %d loss", name, s+1), [][]float32{{gotLoss[s]}}, [][]float32{{wantLoss[s]}}, tol); err != nil {
				t.Error(err)
			}
			if err := closeAll(fmt.Sprintf("%s step %d gradient", name, s+1), gotGrads[s], wantGrads[s], tol); err != nil {
				t.Error(err)
			}
		}
		t.Logf("%s: losses cuda %v, cpu %v; %v", name, gotLoss, wantLoss, d)
		checkLtCounts(t, name, c.prec, steps, d)
		if d.Products == 0 {
			t.Errorf("%s: no cuBLASLt product", name)
		}
	}
}

// TestSimLtRunMatchesCPU runs TestCUDALtMatchesCPU's graph on the
// simulated device, which takes the same epilogue branches: every step's
// loss and gradients are the CPU's bit for bit, and the counts are those
// the GPU test wants (so its harness is checked without a GPU).
func TestSimLtRunMatchesCPU(t *testing.T) {
	defer tensor.SetSimLtEpilogues(tensor.SetSimLtEpilogues(true))
	const steps = 3
	for _, prec := range []tensor.MatmulPrecision{tensor.MatmulFP32, tensor.MatmulBF16} {
		wantLoss, wantGrads, _, err := ltRun(tensor.CPU, prec, steps)
		if err != nil {
			t.Fatalf("cpu: %v", err)
		}
		gotLoss, gotGrads, d, err := ltRun(tensor.Sim, prec, steps)
		if err != nil {
			t.Fatalf("sim: %v", err)
		}
		for s := range steps {
			if err := closeAll(fmt.Sprintf("%v step %d loss", prec, s+1), [][]float32{{gotLoss[s]}}, [][]float32{{wantLoss[s]}}, 0); err != nil {
				t.Error(err)
			}
			if err := closeAll(fmt.Sprintf("%v step %d gradient", prec, s+1), gotGrads[s], wantGrads[s], 0); err != nil {
				t.Error(err)
			}
		}
		checkLtCounts(t, "sim", prec, steps, d)
	}
}
