package train

import (
	"fmt"

	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/parallel"
	"github.com/gotron/gotron/parallel/cp"
	"github.com/gotron/gotron/tensor"
)

// This file wires context parallelism into the stepper (Megatron's, see
// docs/distributed.md "Context parallelism"): every rank of a CP group
// reads the same micro-batches, keeps its two of the 2·CP chunks of each
// sequence (cp.Positions: chunks r and 2CP−1−r) with their sequence
// positions, and runs the model on them; attention, the only part that
// mixes tokens, runs over the CP group (parallel/cp). Each rank's loss is
// the mean over its own tokens; gradients are averaged over the
// data×context-parallel group (ddp over Groups.DPCP), so the objective is
// Megatron's mean over CP ranks of per-rank token means, and the logged
// loss is that mean over DP×CP.

// checkContextParallel checks the CP flags against the run.
func (c *Config) checkContextParallel(size, tpSize int) error {
	if err := cp.CheckHierarchical(c.HierarchicalCPSizes, size, c.CPCommType, c.Model.NumAttentionHeads, c.Model.NumQueryGroups, tpSize); err != nil {
		return fmt.Errorf("train: %w", err)
	}
	if size == 1 {
		return nil
	}
	if c.Model.GDN.Enabled {
		// Megatron's gated delta net exchanges heads for sequence chunks
		// (its own all-to-alls); gotron's CP splits attention only, and a
		// gated delta net over a chunk would miss the earlier chunks' state
		return fmt.Errorf("train: --context-parallel-size=%d with --experimental-attention-variant gated_delta_net: the gated delta net layers are not built for context parallelism in this release", size)
	}
	if c.Model.DSA.Enabled {
		// Megatron's DSAttention all-gathers the keys and the indexer's
		// keys over the CP ranks (cp_comm_type allgather); not built here
		return fmt.Errorf("train: --context-parallel-size=%d with --experimental-attention-variant dsa: DeepSeek sparse attention is not built for context parallelism in this release", size)
	}
	if err := cp.Check(size, c.CPCommType, c.SeqLength, c.Model.NumAttentionHeads, c.Model.NumQueryGroups, tpSize); err != nil {
		return fmt.Errorf("train: %w", err)
	}
	if c.Device == tensor.CUDA && !c.CUDAUnverified {
		// The CUDA backend's block attention (QPos, KPos, Accumulate) is
		// built and checked against the CPU by TestCUDABlockAttention, which
		// has not run on a GPU yet.
		return fmt.Errorf("train: --context-parallel-size=%d with --device cuda: the GPU's block attention is built but not yet verified on a GPU (tools/gpu/check.sh conformance); set GOTRON_CUDA_UNVERIFIED=1 (or cp) to run it anyway, or train context-parallel on the CPU", size)
	}
	return nil
}

// setupContextParallel gives the model its context-parallel attention
// (before pipeline stages are split from it, which share it).
func (st *stepper) setupContextParallel(m Model) error {
	if st.par.CP.Size() == 1 {
		return nil
	}
	gm, ok := m.(*gpt.Model)
	if !ok {
		return fmt.Errorf("train: --context-parallel-size=%d: the %T model has no context-parallel attention", st.par.CP.Size(), m)
	}
	a := &cp.Attention{Group: st.par.CP, Comm: st.cfg.CPCommType}
	if a.Comm == cp.A2AP2P {
		// the two levels, as sub-groups of the world
		sizes, world := st.cfg.HierarchicalCPSizes, st.par.World
		inner, ring, err := cp.HierarchicalRanks(st.par.Layout.GroupOf(parallel.CP, world.Rank()), st.par.CP.Rank(), sizes[0], sizes[1])
		if err != nil {
			return fmt.Errorf("train: %w", err)
		}
		if a.A2AGroup, err = world.NewGroup(inner); err != nil {
			return fmt.Errorf("train: a2a+p2p: a2a group %v: %w", inner, err)
		}
		if a.RingGroup, err = world.NewGroup(ring); err != nil {
			return fmt.Errorf("train: a2a+p2p: p2p group %v: %w", ring, err)
		}
	}
	gm.ContextParallel = a
	return nil
}

// cpSize is the context-parallel size.
func (st *stepper) cpSize() int { return st.par.CP.Size() }

// localTokens keeps this context-parallel rank's tokens of bt (host
// tensors (b, seq)): cp.Positions of every row of tokens, labels, loss
// mask and positions. The identity at CP = 1.
func (st *stepper) localTokens(bt gpt.Batch) (gpt.Batch, error) {
	size := st.cpSize()
	if size == 1 {
		return bt, nil
	}
	if bt.DocIDs != nil {
		return bt, fmt.Errorf("--reset-attention-mask with --context-parallel-size=%d: document masks under context parallelism are not supported", size)
	}
	b, seq := bt.Tokens.Dim(0), bt.Tokens.Dim(1)
	pos, err := cp.Positions(seq, size, st.par.CP.Rank())
	if err != nil {
		return bt, err
	}
	n := len(pos)
	ints := func(x *tensor.Tensor) *tensor.Tensor {
		src, out := x.Int32s(), make([]int32, b*n)
		for r := range b {
			for i, p := range pos {
				out[r*n+i] = src[r*seq+p]
			}
		}
		return tensor.FromInt32(out, b, n)
	}
	out := gpt.Batch{Tokens: ints(bt.Tokens), Labels: ints(bt.Labels), Positions: ints(bt.Positions)}
	if bt.LossMask != nil {
		src, m := bt.LossMask.Float32s(), make([]float32, b*n)
		for r := range b {
			for i, p := range pos {
				m[r*n+i] = src[r*seq+p]
			}
		}
		out.LossMask = tensor.FromFloat32(m, b, n)
	}
	return out, nil
}
