package train

import (
	"context"
	"fmt"
	"strings"

	"github.com/gotron/gotron/ckpt"
	"github.com/gotron/gotron/ckpt/safetensors"
	"github.com/gotron/gotron/comm"
	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/optim"
	"github.com/gotron/gotron/parallel/tp"
	"github.com/gotron/gotron/tensor"
)

// This file wires tensor (and sequence) parallelism into the Trainer: the
// model is built whole from the seed and sliced by GPT's plan
// (gpt.Parallelize), so every TP size starts from the same values;
// checkpoints hold whole tensors, gathered over the TP group when saving
// and sliced when loading, so a checkpoint written at TP=N loads at any TP.

// shardModel keeps this tensor-parallel rank's slices of the whole model.
func (t *Trainer) shardModel(full *gpt.Model, root *tensor.RNG) (*gpt.Model, error) {
	p := t.par
	t.region = &tp.Region{Group: p.TP, SequenceParallel: t.cfg.SequenceParallel, Ctx: t.cctx}
	t.plan = gpt.TPPlan(full.Config)
	// Megatron's model-parallel RNG: a stream per tensor-parallel rank, for
	// dropout on sequence shards. Attention dropout draws from the shared
	// stream and keys its masks by global head (gpt.Model.coreAttention),
	// so that every TP size drops the same attention probabilities.
	name := fmt.Sprintf("dropout-tp-rank-%d", p.TP.Rank())
	if p.Layout.Config.PP > 1 {
		name = fmt.Sprintf("dropout-pp-rank-%d-tp-rank-%d", p.PP.Rank(), p.TP.Rank())
	}
	t.rankRNG = root.Fork(name)
	return gpt.Parallelize(full, t.region, t.rankRNG)
}

// gatherDropoutOffsets collects every TP rank's dropout stream position for
// the checkpoint (nil with TP = 1).
func (t *Trainer) gatherDropoutOffsets() ([]uint64, error) {
	if t.region == nil {
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
	if t.region == nil {
		return
	}
	if len(offsets) != t.region.Size() {
		if t.cfg.SequenceParallel && t.Model.Config.HiddenDropout > 0 {
			t.printf("WARNING: the checkpoint's per-rank dropout streams are for %d tensor-parallel ranks, not %d: they start afresh", len(offsets), t.region.Size())
		}
		return
	}
	st := t.rankRNG.State()
	st.Offset = offsets[t.region.Rank()]
	t.rankRNG.SetState(st)
}

// regionErr is the tensor-parallel collectives' first failure, if any.
func (t *Trainer) regionErr() error {
	if t.region == nil {
		return nil
	}
	if err := t.region.Err(); err != nil {
		return fmt.Errorf("train: iteration %d: %w", t.Iteration+1, err)
	}
	return nil
}

// replicated reports whether parameter name is whole on every
// tensor-parallel rank.
func (t *Trainer) replicated(name string) bool {
	return t.plan != nil && t.plan(name) == tp.Replicated
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
	if (t.region == nil || t.region.Rank() == 0) && copyName == "" {
		return ps
	}
	var out []*optim.Param
	for _, p := range ps {
		name, _, _ := strings.Cut(p.Name, "[") // distributed-optimizer pieces are "name[a:b]"
		if name == copyName || (t.region != nil && t.region.Rank() != 0 && t.replicated(name)) {
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
	if t.region == nil || !t.cfg.SequenceParallel {
		return nil
	}
	// The position table is added before the activations are split into
	// sequence shards: its gradient is whole on every rank already.
	views := t.ddp.GradViews(func(p *tensor.Tensor) bool {
		return t.replicated(p.Name) && p.Name != "embedding.position_embeddings.weight"
	})
	n := 0
	for _, v := range views {
		n += len(v)
	}
	buf := make([]float32, 0, n)
	for _, v := range views {
		buf = append(buf, v...)
	}
	if err := t.par.TP.AllReduce(ctx, comm.Float32s(buf), comm.Sum); err != nil {
		return fmt.Errorf("train: iteration %d: sequence-parallel gradient all-reduce: %w", t.Iteration+1, err)
	}
	for _, v := range views {
		copy(v, buf[:len(v)])
		buf = buf[len(v):]
	}
	return nil
}

// fullShape is the whole shape of a parameter whose TP slice has shape.
func (t *Trainer) fullShape(name string, shape []int) []int {
	out := append([]int(nil), shape...)
	if t.region == nil {
		return out
	}
	switch t.plan(name) {
	case tp.Column, tp.ColumnGLU:
		out[0] *= t.region.Size()
	case tp.Row:
		out[len(out)-1] *= t.region.Size()
	}
	return out
}

// gatherWhole all-gathers a parameter-shaped buffer (the parameter, or one
// of its optimizer buffers) over the TP group and returns the whole tensor.
func (t *Trainer) gatherWhole(name string, shape []int, local []float32) ([]float32, error) {
	if t.region == nil || t.replicated(name) {
		return local, nil
	}
	size := t.region.Size()
	all := make([]float32, size*len(local))
	if err := t.par.TP.AllGather(t.cctx, comm.Float32s(all), comm.Float32s(local), nil); err != nil {
		return nil, fmt.Errorf("train: gather %s over the tensor-parallel group: %w", name, err)
	}
	full := t.fullShape(name, shape)
	whole := make([]float32, len(all))
	for r := range size {
		tp.Merge(whole, all[r*len(local):(r+1)*len(local)], full, t.plan(name), r, size)
	}
	return whole, nil
}

// sliceWhole is gatherWhole's inverse for loading: this rank's slice of a
// whole tensor of the parameter's full shape.
func (t *Trainer) sliceWhole(name string, shape []int, whole []float32) []float32 {
	if t.region == nil || t.replicated(name) {
		return whole
	}
	local := make([]float32, len(whole)/t.region.Size())
	full := t.fullShape(name, shape)
	x := tensor.FromFloat32(whole, full...)
	x.Name = name
	s, err := tp.Shard(x, t.plan(name), t.region.Rank(), t.region.Size())
	if err != nil { // shapes come from the model itself: cannot fail
		panic(err)
	}
	copy(local, s.Float32s())
	return local
}

// wholeParams returns every parameter as a whole-shape safetensors tensor
// (gathered over TP).
func (t *Trainer) wholeParams() (map[string]safetensors.Tensor, error) {
	out := map[string]safetensors.Tensor{}
	for _, p := range t.Model.Params() {
		w, err := t.gatherWhole(p.Name, p.Shape(), p.Float32s())
		if err != nil {
			return nil, err
		}
		st, err := safetensors.FromFloat32(safetensors.F32, t.fullShape(p.Name, p.Shape()), w)
		if err != nil {
			return nil, err
		}
		out[p.Name] = st
	}
	return out, nil
}

// wholeOptimizerState gathers every per-parameter optimizer buffer
// ("<kind>/<param>") over TP.
func (t *Trainer) wholeOptimizerState(st optim.State) (optim.State, error) {
	if t.region == nil {
		return st, nil
	}
	shapes := map[string][]int{}
	for _, p := range t.Model.Params() {
		shapes[p.Name] = p.Shape()
	}
	out := optim.State{Kind: st.Kind, Steps: st.Steps, Buffers: map[string][]float32{}}
	for _, k := range st.BufferNames() {
		_, name, _ := strings.Cut(k, "/")
		shape, ok := shapes[name]
		if !ok {
			return out, fmt.Errorf("train: optimizer buffer %s names no parameter", k)
		}
		w, err := t.gatherWhole(name, shape, st.Buffers[k])
		if err != nil {
			return out, err
		}
		out.Buffers[k] = w
	}
	return out, nil
}

// loadSlices copies this rank's slice of every whole checkpoint tensor into
// the model, checking names and whole shapes.
func (t *Trainer) loadSlices(c *ckpt.Checkpoint) error {
	want := map[string]ckpt.Spec{}
	for _, p := range t.Model.Params() {
		want[p.Name] = ckpt.Spec{DType: safetensors.F32, Shape: t.fullShape(p.Name, p.Shape())}
	}
	if err := c.Expect("model", want); err != nil {
		return err
	}
	for _, p := range t.Model.Params() {
		whole := make([]float32, c.Groups["model"][p.Name].NumElements())
		if err := c.Groups["model"][p.Name].DecodeFloat32(whole); err != nil {
			return fmt.Errorf("train: checkpoint tensor %s: %w", p.Name, err)
		}
		copy(p.Float32s(), t.sliceWhole(p.Name, p.Shape(), whole))
	}
	return nil
}

// sliceOptimizerState keeps this rank's slice of every whole optimizer buffer.
func (t *Trainer) sliceOptimizerState(st optim.State) optim.State {
	if t.region == nil {
		return st
	}
	shapes := map[string][]int{}
	for _, p := range t.Model.Params() {
		shapes[p.Name] = p.Shape()
	}
	for k, buf := range st.Buffers {
		_, name, _ := strings.Cut(k, "/")
		if shape, ok := shapes[name]; ok && len(buf) == numel(t.fullShape(name, shape)) {
			st.Buffers[k] = t.sliceWhole(name, shape, buf)
		}
	}
	return st
}

func numel(shape []int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return n
}

// tpCommSinceLog is the mean time per iteration, in ms, of the last iters
// iterations' tensor-parallel collectives (nil with TP = 1).
func (t *Trainer) tpCommSinceLog(iters int64) any {
	if t.region == nil {
		return nil
	}
	c := t.region.CommTime()
	ms := float64(c-t.lastTPComm) / 1e6 / float64(iters)
	t.lastTPComm = c
	return ms
}
