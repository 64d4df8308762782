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

// layers runs the transformer layers, recomputing as m.Recompute says.
func (m *Model) layers(tp *tensor.Tape, x *tensor.Tensor, bt Batch, rng *tensor.RNG, training bool) *tensor.Tensor {
	for i := 0; i < len(m.Layers); {
		n := m.Recompute.chunk(i, len(m.Layers))
		if n == 0 {
			x = m.layer(tp, &m.Layers[i], x, bt, rng, training)
			i++
			continue
		}
		first := i
		x = tp.Checkpoint(func(tp *tensor.Tape, in []*tensor.Tensor) []*tensor.Tensor {
			h := in[0]
			for j := first; j < first+n; j++ {
				h = m.layer(tp, &m.Layers[j], h, bt, rng, training)
			}
			return []*tensor.Tensor{h}
		}, []*tensor.Tensor{x}, m.dropoutStreams(rng, training)...)[0]
		i += n
	}
	return x
}

// coreAttention is the attention core (b, t, a, d), recomputed in backward
// under selective recomputation. Attention dropout acts on the
// probabilities, inside the fused kernel, as Megatron's (its core_attention
// drops attention_probs). Megatron draws it from the per-TP-rank stream;
// here each call draws one block of the shared stream rng, the same on
// every TP rank, and the kernel keys the masks by global head
// (Sharding.FirstHead): the masks do not depend on the TP size.
func (m *Model) coreAttention(tp *tensor.Tape, q, k, v *tensor.Tensor, bt Batch, rng *tensor.RNG, training bool) *tensor.Tensor {
	opt := tensor.AttentionOptions{Causal: true, DocIDs: bt.DocIDs}
	if training && rng != nil {
		opt.Dropout, opt.RNG = m.Config.AttentionDropout, rng
	}
	if m.Sharding != nil {
		opt.FirstHead = m.Sharding.FirstHead()
	}
	core := func(tp *tensor.Tape, in []*tensor.Tensor) []*tensor.Tensor {
		return []*tensor.Tensor{tp.Attention(in[0], in[1], in[2], opt)} // (b, t, a, d)
	}
	if !m.Recompute.Selective {
		return core(tp, []*tensor.Tensor{q, k, v})[0]
	}
	return tp.Checkpoint(core, []*tensor.Tensor{q, k, v}, m.dropoutStreams(rng, training)...)[0]
}

// dropoutStreams are the RNGs a recomputed part draws from (restored before
// recomputing so the masks repeat).
func (m *Model) dropoutStreams(rng *tensor.RNG, training bool) []*tensor.RNG {
	if rng == nil || !training {
		return nil
	}
	out := []*tensor.RNG{rng}
	if m.Sharding != nil {
		if r := m.Sharding.DropoutRNG(rng, true); r != rng {
			out = append(out, r)
		}
	}
	return out
}
