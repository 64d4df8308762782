package gpt

import "github.com/gotron/gotron/tensor"

// Fusions turns off Megatron's elementwise fusions in the layer; the zero
// value fuses, as Megatron's defaults do. The fused ops (tensor's
// BiasGELU, BiasSwiGLU, BiasDropoutAdd) give their chains' numbers bit for
// bit on the CPU, so this changes the speed and the tape's memory, not the
// training (docs/design/compute.md, "Fusions").
type Fusions struct {
	// NoBiasGELU (--no-bias-gelu-fusion) adds fc1's bias in the linear
	// layer and runs the GELU apart; NoBiasSwiGLU (--no-bias-swiglu-fusion)
	// does so for SwiGLU. Each applies to its activation only, as
	// Megatron's bias_activation_fusion takes one or the other.
	NoBiasGELU, NoBiasSwiGLU bool
	// NoBiasDropout adds the output projections' biases in the linear
	// layers, then drops out and adds the residual as two ops
	// (--no-bias-dropout-fusion).
	NoBiasDropout bool
	// NoAddNorm runs the residual add that feeds the MLP's norm and the
	// norm as two ops (bias-dropout-add or Add, then LayerNorm or RMSNorm)
	// instead of tensor's BiasDropoutAddNorm. Megatron has no flag for it
	// (its norms are Transformer Engine's or Apex's modules); the two give
	// the same numbers bit for bit on the CPU, so only tests and
	// BenchmarkFusions set it.
	NoAddNorm bool
}

// skipBias is Megatron's skip_bias_add: when a fused op follows the linear
// layer it takes the bias (linear nil, later b); otherwise the linear layer
// adds it (linear b, later nil).
func skipBias(b *tensor.Tensor, fused bool) (linear, later *tensor.Tensor) {
	if fused {
		return nil, b
	}
	return b, nil
}

// fuseBiasActivation reports whether fc1's bias goes to the activation: the
// GELUs and SwiGLU have fused forms, the squared ReLU has none.
func (m *Model) fuseBiasActivation() bool {
	switch m.Config.Activation {
	case GELU, GELUTanh:
		return !m.Fusions.NoBiasGELU
	case SwiGLU:
		return !m.Fusions.NoBiasSwiGLU
	}
	return false
}

// fuseBiasDropout reports whether the halves of the layer end in the fused
// bias-dropout-add: not under context parallelism's dropout of the whole
// sequence (ContextParallel.Dropout), which draws its own mask.
func (m *Model) fuseBiasDropout(p *pass) bool {
	if m.Fusions.NoBiasDropout {
		return false
	}
	dropping := p.rng != nil && p.dropout != 0
	return !(dropping && m.ContextParallel != nil && !m.region().SequenceParallel())
}

// biasDropoutAdd is residual + drop(y + b), b the projection's bias when
// fused (nil unfused: the linear layer added it), from the stream
// m.dropout draws from.
func (m *Model) biasDropoutAdd(tp *tensor.Tape, residual, y, b *tensor.Tensor, p *pass) *tensor.Tensor {
	if !m.fuseBiasDropout(p) {
		return tp.Add(residual, m.dropout(tp, y, p))
	}
	if p.rng == nil || p.dropout == 0 {
		return tp.BiasDropoutAdd(residual, y, b, 0, nil)
	}
	sh := m.region()
	return tp.BiasDropoutAdd(residual, y, b, p.dropout, sh.DropoutRNG(p.rng, sh.SequenceParallel()))
}

// biasDropoutAddNorm is biasDropoutAdd's residual + drop(y + b) and its
// norm with weight w and bias nb (m.norm's) in one op, tensor's
// BiasDropoutAddNorm: the dropout drawn there when bias-dropout-add is
// fused, else first (and b is nil: the linear layer added it).
func (m *Model) biasDropoutAddNorm(tp *tensor.Tape, residual, y, b *tensor.Tensor, p *pass, w, nb *tensor.Tensor) (sum, normed *tensor.Tensor) {
	if m.Fusions.NoAddNorm {
		sum = m.biasDropoutAdd(tp, residual, y, b, p)
		return sum, m.norm(tp, sum, w, nb)
	}
	var drop float32
	var rng *tensor.RNG
	switch {
	case !m.fuseBiasDropout(p):
		y = m.dropout(tp, y, p)
	case p.rng != nil && p.dropout != 0:
		sh := m.region()
		drop, rng = p.dropout, sh.DropoutRNG(p.rng, sh.SequenceParallel())
	}
	return tp.BiasDropoutAddNorm(residual, y, b, drop, rng, m.normOf(tp, w, nb))
}
