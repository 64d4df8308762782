package train

import (
	"context"
	"fmt"
	"strings"

	"github.com/gotron/gotron/comm"
	"github.com/gotron/gotron/optim"
	"github.com/gotron/gotron/parallel/tp"
	"github.com/gotron/gotron/tensor"
)

// This file wires tensor (and sequence) parallelism into the Trainer: the
// model is built whole from the seed and sliced by GPT's plan
// (gpt.Parallelize), so every TP size starts from the same values;
// checkpoints hold whole tensors, gathered over the TP group when saving
// and sliced when loading, so a checkpoint written at TP=N loads at any TP.

// shardModel keeps this tensor-parallel rank's slices of the whole model:
// the whole model itself with TP = 1, where a region of one rank is the
// identity and the model runs without one (no collectives to skip).
func (t *Trainer) shardModel(full Model, root *tensor.RNG) (Model, error) {
	p := t.par
	t.region = &tp.Region{Group: p.TP, SequenceParallel: t.cfg.SequenceParallel}
	t.plan = t.arch.TPStyle
	// Megatron's model-parallel RNG: a stream per tensor-parallel rank, for
	// dropout on sequence shards. Attention dropout draws from the shared
	// stream and keys its masks by global head (gpt.Model.coreAttention),
	// so that every TP size drops the same attention probabilities.
	name := fmt.Sprintf("dropout-tp-rank-%d", p.TP.Rank())
	if p.Layout.Config.PP > 1 {
		name = fmt.Sprintf("dropout-pp-rank-%d-tp-rank-%d", p.PP.Rank(), p.TP.Rank())
	}
	t.rankRNG = root.Fork(name)
	if t.region.Size() == 1 {
		return full, nil
	}
	return t.arch.Parallelize(full, t.region, t.rankRNG)
}

// gatherDropoutOffsets collects every TP rank's dropout stream position for
// the checkpoint (nil with TP = 1, whose model draws from the shared
// stream only).
func (t *Trainer) gatherDropoutOffsets() ([]uint64, error) {
	if t.region.Size() == 1 {
		return nil, nil
	}
	all := make([]int64, t.region.Size())
	mine := []int64{int64(t.rankRNG.State().Offset)}
	if err := t.par.TP.AllGather(t.cctx, comm.Int64s(all), comm.Int64s(mine), nil); err != nil {
		return nil, fmt.Errorf("train: gather dropout stream positions over the tensor-parallel group: %w", err)
	}
	out := make([]uint64, len(all))
	for i, v := range all {
		out[i] = uint64(v)
	}
	return out, nil
}

// restoreDropoutOffset resumes this rank's dropout stream where the
// checkpoint left it; a checkpoint from another TP size starts the streams
// afresh (masks of sequence shards cannot be resharded), and says so when
// they are used (hidden dropout with sequence parallelism).
func (t *Trainer) restoreDropoutOffset(offsets []uint64) {
	if len(offsets) != t.region.Size() {
		if t.cfg.SequenceParallel && t.cfg.Model.HiddenDropout > 0 {
			t.printf("WARNING: the checkpoint's per-rank dropout streams are for %d tensor-parallel ranks, not %d: they start afresh", len(offsets), t.region.Size())
		}
		return
	}
	st := t.rankRNG.State()
	st.Offset = offsets[t.region.Rank()]
	t.rankRNG.SetState(st)
}

// replicated reports whether parameter name is whole on every
// tensor-parallel rank.
func (t *Trainer) replicated(name string) bool {
	return t.plan(name) == tp.Replicated
}

// normParams are the optimizer parameters whose gradients this rank counts
// in the global norm: all of them, except that parameters replicated across
// tensor-parallel ranks count on TP rank 0 only (Megatron counts each
// parameter once).
func (t *Trainer) normParams(ps []*optim.Param) []*optim.Param {
	copyName := ""
	if e := t.embeddingCopy(); e != nil {
		// The last stage's copy of the tied embedding: counted on the first.
		copyName = e.Name
	}
	if t.region.Rank() == 0 && copyName == "" {
		return ps
	}
	var out []*optim.Param
	for _, p := range ps {
		name, _, _ := strings.Cut(p.Name, "[") // distributed-optimizer pieces are "name[a:b]"
		if name == copyName || (t.region.Rank() != 0 && t.replicated(name)) {
			continue
		}
		out = append(out, p)
	}
	return out
}

// reduceSequenceParallelGrads all-reduces over the TP group the gradients
// of replicated parameters that each rank computed from its sequence shard
// only (norms, row-parallel biases): Megatron's
// finalize_model_grads for --sequence-parallel.
func (t *Trainer) reduceSequenceParallelGrads(ctx context.Context) error {
	if !t.cfg.SequenceParallel { // (which needs TP > 1)
		return nil
	}
	// The position table is added before the activations are split into
	// sequence shards: its gradient is whole on every rank already.
	views := t.reducer.GradViews(func(p *tensor.Tensor) bool {
		return t.replicated(p.Name) && p.Name != "embedding.position_embeddings.weight"
	})
	n := 0
	for _, v := range views {
		n += v.Numel()
	}
	// One all-reduce of the views packed in a host buffer (device views are
	// copied out and back).
	buf := make([]float32, 0, n)
	for _, v := range views {
		buf = append(buf, hostValues(v)...)
	}
	if err := t.par.TP.AllReduce(ctx, comm.Float32s(buf), comm.Sum); err != nil {
		return fmt.Errorf("train: iteration %d: sequence-parallel gradient all-reduce: %w", t.Iteration+1, err)
	}
	for _, v := range views {
		setValues(v, buf[:v.Numel()])
		buf = buf[v.Numel():]
	}
	return nil
}

// fullShape is the whole shape of a parameter whose TP slice has shape.
func (t *Trainer) fullShape(name string, shape []int) []int {
	out := append([]int(nil), shape...)
	switch t.plan(name) {
	case tp.Column, tp.ColumnGLU:
		out[0] *= t.region.Size()
	case tp.Row:
		out[len(out)-1] *= t.region.Size()
	}
	return out
}

func numel(shape []int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return n
}

// tpCommSinceLog is the mean time per iteration, in ms, of the last iters
// iterations' tensor-parallel collectives (nil with TP = 1, which has none).
func (t *Trainer) tpCommSinceLog(iters int64) any {
	if t.region.Size() == 1 {
		return nil
	}
	c := t.region.CommTime()
	ms := float64(c-t.lastTPComm) / 1e6 / float64(iters)
	t.lastTPComm = c
	return ms
}
