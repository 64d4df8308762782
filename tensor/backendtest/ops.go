package backendtest

import (
	"fmt"
	"math"
	"os"

	"github.com/gotron/gotron/tensor"
)

// OpCase is one op (or a short composition) run forward and backward on
// fixed inputs: the whole path through the tape, the backend's kernels
// included, as models use it.
type OpCase struct {
	Name string
	// Inputs returns fresh host inputs. Those that require gradients are
	// parameters (their gradients are compared); the others are data (ids,
	// positions, masks).
	Inputs func() []*tensor.Tensor
	// Run computes the op's output from the inputs, which are on the
	// device under test.
	Run func(tp *tensor.Tape, in []*tensor.Tensor) *tensor.Tensor
	// BF16 runs the case's products with bfloat16 operands
	// (tensor.MatmulBF16).
	BF16 bool
	// NoCUDA says why the case does not run on the CUDA backend (an op
	// with no CUDA kernel yet, refused before a model reaches it); empty
	// for the cases every backend runs.
	NoCUDA string
	// Unverified names the GOTRON_CUDA_UNVERIFIED feature whose kernels,
	// built but not yet run on a GPU, the case runs on the CUDA backend:
	// there it runs only while the variable names the feature (or is 1 or
	// all), as gpt.Config.CheckDevice lets a model use them.
	Unverified string
}

// skipOnCUDA says why c does not run on the CUDA backend now (NoCUDA, or an
// Unverified feature GOTRON_CUDA_UNVERIFIED does not name), or "".
func (c OpCase) skipOnCUDA() string {
	if c.NoCUDA != "" {
		return c.NoCUDA
	}
	if c.Unverified != "" && !tensor.CUDAUnverified(os.Getenv, c.Unverified) {
		return fmt.Sprintf("built, not yet run on a GPU: set GOTRON_CUDA_UNVERIFIED=%s to run it", c.Unverified)
	}
	return ""
}

// normal returns a host parameter of the given shape drawn from N(0, std²).
func normal(name string, std float32, shape ...int) *tensor.Tensor {
	p := tensor.Param(name, shape...)
	tensor.NewRNG(uint64(len(name))*7919+uint64(len(shape))).Fork(name).Normal(p.Float32s(), 0, std)
	return p
}

func ids(vals []int32, shape ...int) *tensor.Tensor { return tensor.FromInt32(vals, shape...) }

// OpCases covers every core Backend method through the ops that reach it:
// Gemm (both transpositions, batched, bf16), the bias add and its row sum,
// broadcast Add and Mul, Scale and Axpy, LayerNorm, RMSNorm, both GELUs,
// SiLU, the squared ReLU, the attention output gate, the gated delta net's causal convolution, SwiGLU, the fused bias-GELU, bias-SwiGLU and
// bias-dropout-add, bias-dropout-add with LayerNorm and RMSNorm, Softmax, RoPE with positions, attention (causal,
// grouped-query, document masks, dropout), cross-entropy (mask, label
// smoothing), embedding, dropout and the shape ops.
func OpCases() []OpCase {
	rope, err := tensor.NewRoPE(tensor.RoPEConfig{Dim: 6, MaxPositions: 16})
	if err != nil {
		panic(err)
	}
	return []OpCase{
		{Name: "matmul", Inputs: func() []*tensor.Tensor { return []*tensor.Tensor{normal("a", 1, 2, 5, 7), normal("b", 1, 2, 9, 7)} },
			Run: func(tp *tensor.Tape, in []*tensor.Tensor) *tensor.Tensor {
				return tp.MatMul(in[0], in[1], tensor.NoTrans, tensor.Trans)
			}},
		{Name: "matmul-transA", Inputs: func() []*tensor.Tensor { return []*tensor.Tensor{normal("a", 1, 7, 5), normal("b", 1, 7, 3)} },
			Run: func(tp *tensor.Tape, in []*tensor.Tensor) *tensor.Tensor {
				return tp.MatMul(in[0], in[1], tensor.Trans, tensor.NoTrans)
			}},
		{Name: "linear-bias", Inputs: func() []*tensor.Tensor {
			return []*tensor.Tensor{normal("x", 1, 3, 4, 33), normal("w", 0.2, 17, 33), normal("b", 1, 17)}
		}, Run: func(tp *tensor.Tape, in []*tensor.Tensor) *tensor.Tensor { return tp.Linear(in[0], in[1], in[2]) }},
		{Name: "linear-bf16", BF16: true, Inputs: func() []*tensor.Tensor { return []*tensor.Tensor{normal("x", 1, 6, 40), normal("w", 0.2, 19, 40)} },
			Run: func(tp *tensor.Tape, in []*tensor.Tensor) *tensor.Tensor { return tp.Linear(in[0], in[1], nil) }},
		{Name: "add-mul-scale", Inputs: func() []*tensor.Tensor { return []*tensor.Tensor{normal("a", 1, 3, 8), normal("b", 1, 8)} },
			Run: func(tp *tensor.Tape, in []*tensor.Tensor) *tensor.Tensor {
				return tp.Scale(tp.Mul(tp.Add(in[0], in[1]), in[1]), 0.5)
			}},
		{Name: "layernorm", Inputs: func() []*tensor.Tensor {
			return []*tensor.Tensor{normal("x", 2, 5, 24), normal("w", 1, 24), normal("b", 1, 24)}
		},
			Run: func(tp *tensor.Tape, in []*tensor.Tensor) *tensor.Tensor {
				return tp.LayerNorm(in[0], in[1], in[2], 1e-5)
			}},
		{Name: "rmsnorm", Inputs: func() []*tensor.Tensor { return []*tensor.Tensor{normal("x", 2, 5, 24), normal("w", 1, 24)} },
			Run: func(tp *tensor.Tape, in []*tensor.Tensor) *tensor.Tensor { return tp.RMSNorm(in[0], in[1], 1e-6) }},
		{Name: "gelu-silu", Inputs: func() []*tensor.Tensor { return []*tensor.Tensor{normal("x", 2, 4, 37)} },
			Run: func(tp *tensor.Tape, in []*tensor.Tensor) *tensor.Tensor {
				return tp.Add(tp.Add(tp.GELU(in[0], tensor.GELUErf), tp.GELU(in[0], tensor.GELUTanh)), tp.SiLU(in[0]))
			}},
		{Name: "squared-relu", Inputs: func() []*tensor.Tensor { return []*tensor.Tensor{normal("x", 2, 4, 37)} },
			Run:        func(tp *tensor.Tape, in []*tensor.Tensor) *tensor.Tensor { return tp.SquaredReLU(in[0]) },
			Unverified: "sqrelu"},
		{Name: "sigmoid-gate", Inputs: func() []*tensor.Tensor {
			return []*tensor.Tensor{normal("o", 1, 2, 5, 3, 7), normal("gate", 3, 2, 5, 3, 7)}
		},
			Run: func(tp *tensor.Tape, in []*tensor.Tensor) *tensor.Tensor {
				// a strided gate, as the attention's split of [q; gate; k; v] gives
				g := tp.Transpose(in[1], 2, 3)
				return tp.SigmoidGate(tp.Reshape(in[0], 2, 5, 7, 3), g)
			},
			Unverified: "output-gate"},
		{Name: "causal-conv-silu", Inputs: func() []*tensor.Tensor { return []*tensor.Tensor{normal("x", 1, 2, 9, 5), normal("w", 0.5, 5, 1, 4)} },
			Run: func(tp *tensor.Tape, in []*tensor.Tensor) *tensor.Tensor {
				// a strided input, as the projection's split gives
				x := tp.Narrow(tp.Concat(2, in[0], in[0]), 2, 3, 5)
				return tp.CausalConvSiLU(x, in[1])
			},
			Unverified: "gdn"},
		{Name: "l2norm", Inputs: func() []*tensor.Tensor { return []*tensor.Tensor{normal("x", 1.5, 2, 5, 3, 8)} },
			Run: func(tp *tensor.Tape, in []*tensor.Tensor) *tensor.Tensor {
				x := tp.Narrow(tp.Concat(2, in[0], in[0]), 2, 2, 3) // strided, as the split of q|k
				return tp.L2Norm(x, 1e-6)
			},
			Unverified: "gdn"},
		{Name: "gdn-gates", Inputs: func() []*tensor.Tensor {
			return []*tensor.Tensor{normal("alpha", 3, 2, 5, 4), normal("b", 2, 2, 5, 4), normal("A_log", 0.5, 4), normal("dt_bias", 1, 4)}
		}, Run: func(tp *tensor.Tape, in []*tensor.Tensor) *tensor.Tensor {
			alpha := tp.Narrow(tp.Concat(2, in[1], in[0]), 2, 4, 4) // strided
			g, beta := tp.GDNGates(alpha, in[1], in[2], in[3])
			return tp.Concat(2, g, beta)
		}, Unverified: "gdn"},
		{Name: "gated-delta-rule", Inputs: gatedDeltaRuleInputs,
			Run: func(tp *tensor.Tape, in []*tensor.Tensor) *tensor.Tensor {
				// the gated delta net's path: normalised q, k of 2 key heads
				// for 4 value heads, gates, chunks of 4 steps over 9, in
				// the chunked form and by the recurrence (the GPU runs the
				// recurrence for both)
				q, k, v, g, beta := gatedDeltaRuleOperands(tp, in)
				o := tp.GatedDeltaRule(q, k, v, g, beta, 0.5, 4)
				return tp.Add(o, tp.Scale(tp.GatedDeltaRuleRecurrent(q, k, v, g, beta, 0.5, 3), 0.5))
			},
			Unverified: "gdn"},
		{Name: "swiglu-softmax", Inputs: func() []*tensor.Tensor { return []*tensor.Tensor{normal("x", 2, 3, 2*21)} },
			Run: func(tp *tensor.Tape, in []*tensor.Tensor) *tensor.Tensor { return tp.Softmax(tp.SwiGLU(in[0])) }},
		{Name: "bias-gelu", Inputs: func() []*tensor.Tensor { return []*tensor.Tensor{normal("y", 2, 3, 5, 37), normal("b", 1, 37)} },
			Run: func(tp *tensor.Tape, in []*tensor.Tensor) *tensor.Tensor {
				return tp.Add(tp.BiasGELU(in[0], in[1], tensor.GELUTanh), tp.BiasGELU(in[0], in[1], tensor.GELUErf))
			}},
		{Name: "bias-swiglu", Inputs: func() []*tensor.Tensor { return []*tensor.Tensor{normal("y", 2, 4, 2*19), normal("b", 1, 2*19)} },
			Run: func(tp *tensor.Tape, in []*tensor.Tensor) *tensor.Tensor { return tp.BiasSwiGLU(in[0], in[1]) }},
		{Name: "bias-dropout-add", Inputs: func() []*tensor.Tensor {
			return []*tensor.Tensor{normal("residual", 1, 3, 7, 33), normal("y", 1, 3, 7, 33), normal("b", 1, 33)}
		}, Run: func(tp *tensor.Tape, in []*tensor.Tensor) *tensor.Tensor {
			x := tp.BiasDropoutAdd(in[0], in[1], in[2], 0.3, tensor.NewRNG(8))
			x = tp.BiasDropoutAdd(x, in[1], nil, 0.5, tensor.NewRNG(9)) // no bias
			return tp.BiasDropoutAdd(x, in[1], in[2], 0, nil)           // no dropout
		}},
		{Name: "bias-dropout-add-layernorm", Inputs: func() []*tensor.Tensor {
			return []*tensor.Tensor{normal("residual", 1, 3, 7, 33), normal("y", 1, 3, 7, 33), normal("b", 1, 33), normal("w", 1, 33), normal("nb", 1, 33)}
		}, Run: func(tp *tensor.Tape, in []*tensor.Tensor) *tensor.Tensor {
			n := tensor.Norm{Weight: in[3], Bias: in[4], Eps: 1e-5}
			s, o := tp.BiasDropoutAddNorm(in[0], in[1], in[2], 0.3, tensor.NewRNG(8), n)
			n.Bias = nil
			s2, o2 := tp.BiasDropoutAddNorm(s, in[1], nil, 0, nil, n) // no bias, no dropout, no norm bias
			return tp.Add(tp.Add(o, tp.Scale(s2, 0.5)), o2)
		}},
		{Name: "bias-dropout-add-rmsnorm", Inputs: func() []*tensor.Tensor {
			return []*tensor.Tensor{normal("residual", 1, 3, 7, 33), normal("y", 1, 3, 7, 33), normal("b", 1, 33), normal("w", 1, 33)}
		}, Run: func(tp *tensor.Tape, in []*tensor.Tensor) *tensor.Tensor {
			s, o := tp.BiasDropoutAddNorm(in[0], in[1], in[2], 0.5, tensor.NewRNG(9), tensor.Norm{RMS: true, Weight: in[3], Eps: 1e-6})
			return tp.Add(o, tp.Scale(s, 0.5))
		}},
		{Name: "rope", Inputs: func() []*tensor.Tensor {
			return []*tensor.Tensor{normal("x", 1, 2, 4, 3, 8), ids([]int32{0, 1, 2, 3, 7, 9, 11, 15}, 2, 4)}
		}, Run: func(tp *tensor.Tape, in []*tensor.Tensor) *tensor.Tensor { return tp.RoPE(in[0], rope, in[1]) }},
		{Name: "attention", Inputs: func() []*tensor.Tensor {
			return []*tensor.Tensor{normal("q", 1, 2, 9, 4, 8), normal("k", 1, 2, 9, 2, 8), normal("v", 1, 2, 9, 2, 8),
				ids([]int32{0, 0, 0, 0, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 2, 2, 2}, 2, 9)}
		}, Run: func(tp *tensor.Tape, in []*tensor.Tensor) *tensor.Tensor {
			return tp.Attention(in[0], in[1], in[2], tensor.AttentionOptions{Causal: true, DocIDs: in[3], Dropout: 0.2, RNG: tensor.NewRNG(5), FirstHead: 4})
		}},
		{Name: "cross-entropy", Inputs: func() []*tensor.Tensor {
			return []*tensor.Tensor{normal("logits", 3, 6, 50), ids([]int32{3, 49, 0, 17, 17, 8}, 6), tensor.FromFloat32([]float32{1, 0, 1, 1, 0.5, 1}, 6)}
		}, Run: func(tp *tensor.Tape, in []*tensor.Tensor) *tensor.Tensor {
			return tp.CrossEntropy(in[0], in[1], tensor.CrossEntropyOptions{LossMask: in[2], LabelSmoothing: 0.1})
		}},
		{Name: "embedding-dropout", Inputs: func() []*tensor.Tensor {
			return []*tensor.Tensor{normal("table", 1, 11, 16), ids([]int32{4, 0, 10, 4, 7, 7}, 2, 3)}
		}, Run: func(tp *tensor.Tape, in []*tensor.Tensor) *tensor.Tensor {
			return tp.Dropout(tp.Embedding(in[1], in[0]), 0.3, tensor.NewRNG(9))
		}},
		{Name: "shape-ops", Inputs: func() []*tensor.Tensor { return []*tensor.Tensor{normal("x", 1, 3, 4, 5)} },
			Run: func(tp *tensor.Tape, in []*tensor.Tensor) *tensor.Tensor {
				t := tp.Transpose(in[0], 0, 2)
				parts := tp.Split(t, 0, 2, 3)
				return tp.Add(tp.Concat(0, parts[1], parts[0]), tp.Contiguous(t))
			}},
		{Name: "reductions", Inputs: func() []*tensor.Tensor { return []*tensor.Tensor{normal("x", 1, 4, 13)} },
			Run: func(tp *tensor.Tape, in []*tensor.Tensor) *tensor.Tensor {
				return tp.Add(tp.SumLast(in[0]), tp.MaxLast(in[0]))
			}},
	}
}

// opResult is a case's output and input gradients, on the host.
type opResult struct{ out, grads [][]float32 }

// runOp runs c on dev: forward, then backward from Σ out ⊙ r for a fixed
// random r.
func runOp(c OpCase, dev tensor.Device) (res opResult, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic: %v", r)
		}
	}()
	in := c.Inputs()
	var params []*tensor.Tensor
	for i, t := range in {
		if t.RequiresGrad() {
			tensor.MoveParams(dev, t)
			params = append(params, t)
		} else {
			in[i] = t.ToDevice(dev)
		}
	}
	tp := tensor.NewTape()
	if c.BF16 {
		tp.SetMatmulPrecision(tensor.MatmulBF16)
	}
	out := c.Run(tp, in)
	if out.Device() != dev {
		return res, fmt.Errorf("output on %v, want %v", out.Device(), dev)
	}
	r := tensor.Zeros(out.Shape()...)
	tensor.NewRNG(77).Normal(r.Float32s(), 0, 1)
	if err := tp.Backward(tp.Sum(tp.Mul(out, r.ToDevice(dev)))); err != nil {
		return res, err
	}
	res.out = append(res.out, tensor.ToHost(out.Contiguous()).Float32s())
	for _, p := range params {
		if p.Grad == nil {
			return res, fmt.Errorf("input %s got no gradient", p.Name)
		}
		res.grads = append(res.grads, tensor.ToHost(p.Grad).Float32s())
	}
	return res, nil
}

// CheckOps runs every case of OpCases on dev and on the CPU, the
// reference, and compares outputs and input gradients: bit for bit when
// tol is 0, else within tol·max(1, |cpu|) per element. A device backend
// states its tolerance per precision (fp32, bf16) beside its call.
func CheckOps(dev tensor.Device, tol float64) error {
	for _, c := range OpCases() {
		if dev == tensor.CUDA && c.skipOnCUDA() != "" {
			continue
		}
		want, err := runOp(c, tensor.CPU)
		if err != nil {
			return fmt.Errorf("%s on the cpu: %w", c.Name, err)
		}
		got, err := runOp(c, dev)
		if err != nil {
			return fmt.Errorf("%s on %v: %w", c.Name, dev, err)
		}
		if err := closeAll(c.Name+" output", got.out, want.out, tol); err != nil {
			return err
		}
		if err := closeAll(c.Name+" gradient", got.grads, want.grads, tol); err != nil {
			return err
		}
	}
	return nil
}

func closeAll(what string, got, want [][]float32, tol float64) error {
	for i := range want {
		if len(got[i]) != len(want[i]) {
			return fmt.Errorf("%s %d: %d values, want %d", what, i, len(got[i]), len(want[i]))
		}
		for j, w := range want[i] {
			g := got[i][j]
			if tol == 0 {
				if math.Float32bits(g) != math.Float32bits(w) {
					return fmt.Errorf("%s %d element %d: %v, want %v bit for bit", what, i, j, g, w)
				}
				continue
			}
			if d := math.Abs(float64(g) - float64(w)); !(d <= tol*math.Max(1, math.Abs(float64(w)))) {
				return fmt.Errorf("%s %d element %d: %v, want %v within %g", what, i, j, g, w, tol)
			}
		}
	}
	return nil
}

// gatedDeltaRuleInputs are the gated-delta-rule case's inputs: q|k (2
// sequences of 9 steps, 2 key heads each of 4), v (4 heads of 3), the
// gates' alpha and b, A_log and dt_bias.
func gatedDeltaRuleInputs() []*tensor.Tensor {
	return []*tensor.Tensor{normal("qk", 1, 2, 9, 4, 4), normal("v", 1, 2, 9, 4, 3), normal("alpha", 1, 2, 9, 4), normal("beta_in", 1.5, 2, 9, 4),
		normal("A_log", 0.3, 4), normal("dt_bias", 0.5, 4)}
}

// gatedDeltaRuleOperands is model/gpt's path to the delta rule's operands.
func gatedDeltaRuleOperands(tp *tensor.Tape, in []*tensor.Tensor) (q, k, v, g, beta *tensor.Tensor) {
	qk := tp.L2Norm(in[0], 1e-6)
	heads := tp.Split(qk, 2, 2, 2)
	g, beta = tp.GDNGates(in[2], in[3], in[4], in[5])
	return heads[0], heads[1], in[1], g, beta
}
