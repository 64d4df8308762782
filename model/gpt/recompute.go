package gpt

import (
	"fmt"

	"github.com/gotron/gotron/tensor"
)

// Recompute is Megatron's activation recomputation: activations inside the
// recomputed parts are not kept for backward but computed again from their
// inputs (Tape.Checkpoint, under the same dropout streams, so the results
// are bit-identical). The zero value keeps every activation.
type Recompute struct {
	// Selective (--recompute-activations, --recompute-granularity
	// selective) recomputes the attention core (scores, softmax, dropout:
	// one fused kernel, whose masks replay from the restored stream).
	Selective bool
	// Full (--recompute-granularity full) recomputes whole layers, per Method.
	Full bool
	// Method (--recompute-method) is "uniform": consecutive chunks of
	// NumLayers layers are recomputed as one unit; or "block": the first
	// NumLayers layers are recomputed, each on its own, the rest kept.
	Method string
	// NumLayers is --recompute-num-layers (≥ 1 with Full).
	NumLayers int
}

// Validate checks the flags against the model's layer count.
func (r Recompute) Validate(numLayers int) error {
	if !r.Full {
		if r.Method != "" || r.NumLayers != 0 {
			return fmt.Errorf("gpt: --recompute-method/--recompute-num-layers need --recompute-granularity full")
		}
		return nil
	}
	switch {
	case r.Selective:
		return fmt.Errorf("gpt: --recompute-granularity is either full or selective")
	case r.Method != "uniform" && r.Method != "block":
		return fmt.Errorf("gpt: --recompute-method=%q: want uniform or block (needed with --recompute-granularity full)", r.Method)
	case r.NumLayers < 1 || r.NumLayers > numLayers:
		return fmt.Errorf("gpt: --recompute-num-layers=%d: want 1..%d (--num-layers)", r.NumLayers, numLayers)
	}
	return nil
}

// chunk returns how many layers starting at layer i form one recomputed
// unit (0: layer i is not recomputed).
func (r Recompute) chunk(i, layers int) int {
	switch {
	case !r.Full:
		return 0
	case r.Method == "uniform":
		if i%r.NumLayers == 0 {
			return min(r.NumLayers, layers-i)
		}
		return 0 // inside a unit started earlier
	case i < r.NumLayers: // block
		return 1
	}
	return 0
}

// causalAttention is the AttentionCore of training: the fused causal
// kernel, its scores, softmax and dropout recomputed in backward under
// selective recomputation. Attention dropout acts on the probabilities,
// inside the kernel, as Megatron's (its core_attention drops
// attention_probs). Megatron draws it from the per-TP-rank stream; here
// each call draws one block of the shared stream rng, the same on every TP
// rank, and the kernel keys the masks by global head (Sharding.FirstHead):
// the masks do not depend on the TP size.
type causalAttention struct {
	m         *Model
	docIDs    *tensor.Tensor // non-nil masks attention across documents
	rng       *tensor.RNG    // nil: no dropout
	selective bool
}

func (a *causalAttention) Attend(tp *tensor.Tape, _ int, q, k, v *tensor.Tensor) *tensor.Tensor {
	opt := tensor.AttentionOptions{Causal: true, DocIDs: a.docIDs, FirstHead: a.m.region().FirstHead()}
	if mla := &a.m.Config.MLA; mla.Enabled {
		opt.Scale = mla.SoftmaxScale() // its heads are padded: the scale is MLA's, not the width's
	} else {
		opt.Scale = a.m.Config.SoftmaxScale() // muP's; 0 otherwise: 1/sqrt(head dim)
	}
	if a.rng != nil {
		opt.Dropout, opt.RNG = a.m.Config.AttentionDropout, a.rng
	}
	core := func(tp *tensor.Tape, in []*tensor.Tensor) []*tensor.Tensor {
		if cp := a.m.ContextParallel; cp != nil {
			return []*tensor.Tensor{cp.Attention(tp, in[0], in[1], in[2], opt)}
		}
		return []*tensor.Tensor{tp.Attention(in[0], in[1], in[2], opt)} // (b, t, a, d)
	}
	if !a.selective {
		return core(tp, []*tensor.Tensor{q, k, v})[0]
	}
	return tp.Checkpoint(core, []*tensor.Tensor{q, k, v}, a.m.dropoutStreams(a.rng)...)[0]
}

// dropoutStreams are the RNGs a recomputed part draws from (restored before
// recomputing so the masks repeat).
func (m *Model) dropoutStreams(rng *tensor.RNG) []*tensor.RNG {
	if rng == nil {
		return nil
	}
	out := []*tensor.RNG{rng}
	if r := m.region().DropoutRNG(rng, true); r != rng {
		out = append(out, r)
	}
	return out
}
