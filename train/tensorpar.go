package train

import (
	"context"
	"fmt"
	"strings"

	"github.com/gotron/gotron/comm"
	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/optim"
	"github.com/gotron/gotron/parallel/tp"
	"github.com/gotron/gotron/tensor"
)

// This file wires tensor (and sequence) parallelism into the stepper: the
// model is built whole from the seed and sliced by the architecture's plan
// (Architecture.Parallelize), so every TP size starts from the same values;
// checkpoints hold whole tensors, gathered over the TP group when saving
// and sliced when loading, so a checkpoint written at TP=N loads at any TP.

// shardModel keeps this tensor-parallel rank's slices of the whole model:
// the whole model itself with TP = 1, where a region of one rank is the
// identity and the model runs without one (no collectives to skip).
func (st *stepper) shardModel(full Model, root *tensor.RNG) (Model, error) {
	p := st.par
	st.region = &tp.Region{Group: p.TP, SequenceParallel: st.cfg.SequenceParallel}
	st.plan = st.arch.TPStyle
	if moe := st.cfg.Model.MoE; moe.Enabled() {
		// the routed experts: whole, or split over expert TP (= TP)
		st.plan = expertPlan(st.plan, st.cfg.Model.Activation == gpt.SwiGLU, p.Layout.Config.ETP)
	}
	// Megatron's model-parallel RNG: a stream per tensor-parallel rank, for
	// dropout on sequence shards. Attention dropout draws from the shared
	// stream and keys its masks by global head (gpt.Model.coreAttention),
	// so that every TP size drops the same attention probabilities.
	name := fmt.Sprintf("dropout-tp-rank-%d", p.TP.Rank())
	if p.Layout.Config.PP > 1 {
		name = fmt.Sprintf("dropout-pp-rank-%d-tp-rank-%d", p.PP.Rank(), p.TP.Rank())
	}
	st.rankRNG = root.Fork(name)
	if st.region.Size() == 1 {
		return full, nil
	}
	return st.arch.Parallelize(full, st.region, st.rankRNG)
}

// gatherDropoutOffsets collects every TP rank's dropout stream position for
// the checkpoint (nil with TP = 1, whose model draws from the shared
// stream only).
func (st *stepper) gatherDropoutOffsets() ([]uint64, error) {
	if st.region.Size() == 1 {
		return nil, nil
	}
	all := make([]int64, st.region.Size())
	mine := []int64{int64(st.rankRNG.State().Offset)}
	if err := st.par.TP.AllGather(st.cctx, comm.Int64s(all), comm.Int64s(mine), nil); err != nil {
		return nil, fmt.Errorf("train: gather dropout stream positions over the tensor-parallel group: %w", err)
	}
	out := make([]uint64, len(all))
	for i, v := range all {
		out[i] = uint64(v)
	}
	return out, nil
}

// restoreDropout resumes the dropout streams where a checkpoint left
// them: the shared stream from its state and the per-rank streams from
// their offsets (by world rank under pipelining, where each stage has its
// own streams, forked by pipeline rank).
func (st *stepper) restoreDropout(ra RunArgs, shared tensor.RNGState) {
	if st.pipelined() {
		st.restorePipelineDropout(ra)
		return
	}
	st.rng.SetState(shared)
	st.restoreDropoutOffset(ra.TPDropoutOffsets)
}

// restoreDropoutOffset resumes this rank's dropout stream where the
// checkpoint left it; a checkpoint from another TP size starts the streams
// afresh (masks of sequence shards cannot be resharded), and says so when
// they are used (hidden dropout with sequence parallelism).
func (st *stepper) restoreDropoutOffset(offsets []uint64) {
	if len(offsets) != st.region.Size() {
		if st.cfg.SequenceParallel && st.cfg.Model.HiddenDropout > 0 {
			st.printf("WARNING: the checkpoint's per-rank dropout streams are for %d tensor-parallel ranks, not %d: they start afresh", len(offsets), st.region.Size())
		}
		return
	}
	state := st.rankRNG.State()
	state.Offset = offsets[st.region.Rank()]
	st.rankRNG.SetState(state)
}

// replicated reports whether parameter name is whole on every
// tensor-parallel rank.
func (st *stepper) replicated(name string) bool {
	return st.plan(name) == tp.Replicated
}

// normParams are the optimizer parameters whose gradients this rank counts
// in the global norm: all of them, except that parameters replicated across
// tensor-parallel ranks count on TP rank 0 only (Megatron counts each
// parameter once).
func (st *stepper) normParams(ps []*optim.Param) []*optim.Param {
	copyName := ""
	if e := st.embeddingCopy(); e != nil {
		// The last stage's copy of the tied embedding: counted on the first.
		copyName = e.Name
	}
	if st.region.Rank() == 0 && copyName == "" {
		return ps
	}
	var out []*optim.Param
	for _, p := range ps {
		name, _, _ := strings.Cut(p.Name, "[") // distributed-optimizer pieces are "name[a:b]"
		// (routed experts differ between the TP ranks, or are split: each
		// expert-DP group counts its own, moe.go's splitNormParams)
		if name == copyName || (st.region.Rank() != 0 && st.replicated(name) && !gpt.IsRoutedExpert(name)) {
			continue
		}
		out = append(out, p)
	}
	return out
}

// reduceSequenceParallelGrads all-reduces over the TP group the gradients
// of replicated parameters that each rank computed from its sequence shard
// only (norms, row-parallel biases), or from its heads only (--qk-layernorm):
// Megatron's finalize_model_grads for --sequence-parallel and qk_layernorm.
func (st *stepper) reduceSequenceParallelGrads(ctx context.Context) error {
	// (a gated delta net's out_norm normalises this rank's value heads: a
	// partial sum too)
	// (MLA's latent norms, --qk-layernorm with MLA, normalise the whole
	// latents, whose gradients the column-parallel up-projections reduce:
	// no partial sums without SP)
	qkHeads := st.cfg.Model.QKLayerNorm && !st.cfg.Model.MLA.Enabled
	sp, qk := st.cfg.SequenceParallel, (qkHeads || st.cfg.Model.GDN.Enabled) && st.region != nil && st.region.Size() > 1
	if !sp && !qk { // (SP needs TP > 1)
		return nil
	}
	// The position table is added before the activations are split into
	// sequence shards: its gradient is whole on every rank already. The
	// query/key norms see this rank's heads only: their gradients are
	// partial sums with or without SP (Megatron's finalize_model_grads
	// all-reduces q_layernorm and k_layernorm too).
	views := st.reducer.GradViews(func(p *tensor.Tensor) bool {
		if !st.replicated(p.Name) || gpt.IsRoutedExpert(p.Name) { // experts: reduced over expert DP
			return false
		}
		if gpt.IsDSAIndexer(p.Name) {
			// every rank runs the indexer on the whole (gathered) sequence
			// with the same all-reduced target: its gradients are whole and
			// equal on every rank (Megatron averages them over TP,
			// average_gradients_across_tp_domain)
			return false
		}
		if sp {
			return p.Name != "embedding.position_embeddings.weight"
		}
		return strings.Contains(p.Name, "self_attention.q_layernorm.") || strings.Contains(p.Name, "self_attention.k_layernorm.") ||
			strings.Contains(p.Name, "self_attention.out_norm.")
	})
	n := 0
	for _, v := range views {
		n += v.Numel()
	}
	// One all-reduce of the views packed in one buffer: on the device, in
	// place, when the group has DeviceCollectives for them (comm/nccl on
	// CUDA, comm.SimDevice on sim); else in host memory (device views are
	// copied out and back).
	if packed, dc, ok := packOnDevice(st.par.TP, views); ok {
		if err := dc.AllReduceTensor(ctx, packed, comm.Sum); err != nil {
			return fmt.Errorf("train: iteration %d: sequence-parallel gradient all-reduce: %w", st.Iteration+1, err)
		}
		unpack(views, packed)
		return nil
	}
	buf := make([]float32, 0, n)
	for _, v := range views {
		buf = append(buf, hostValues(v)...)
	}
	if err := st.par.TP.AllReduce(ctx, comm.Float32s(buf), comm.Sum); err != nil {
		return fmt.Errorf("train: iteration %d: sequence-parallel gradient all-reduce: %w", st.Iteration+1, err)
	}
	for _, v := range views {
		setValues(v, buf[:v.Numel()])
		buf = buf[v.Numel():]
	}
	return nil
}

// fullShape is the whole shape of a parameter whose TP slice has shape.
func (st *stepper) fullShape(name string, shape []int) []int {
	out := append([]int(nil), shape...)
	switch st.plan(name) {
	case tp.Column, tp.ColumnGLU:
		out[0] *= st.region.Size()
	case tp.Row:
		out[len(out)-1] *= st.region.Size()
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
func (rp *reporter) tpCommSinceLog(iters int64) any {
	if rp.stepper.region.Size() == 1 {
		return nil
	}
	c := rp.stepper.region.CommTime()
	ms := float64(c-rp.lastTPComm) / 1e6 / float64(iters)
	rp.lastTPComm = c
	return ms
}

// packOnDevice concatenates the contiguous device tensors views into one
// device tensor (a device copy) for an in-place collective over pg, and
// returns pg's DeviceCollectives; ok is false (stage through the host) on
// the CPU, for a strided view, or when pg has no DeviceCollectives for
// them.
func packOnDevice(pg comm.ProcessGroup, views []*tensor.Tensor) (*tensor.Tensor, comm.DeviceCollectives, bool) {
	if len(views) == 0 || views[0].Device() == tensor.CPU {
		return nil, nil, false
	}
	if _, ok := comm.DeviceOf(pg, views...); !ok {
		return nil, nil, false
	}
	var nt *tensor.Tape
	flat := make([]*tensor.Tensor, len(views))
	for i, v := range views {
		flat[i] = v.Reshape(-1)
	}
	packed := flat[0].Contiguous()
	if len(flat) > 1 {
		packed = nt.Concat(0, flat...)
	}
	dc, ok := comm.DeviceOf(pg, packed)
	return packed, dc, ok
}

// unpack copies packed's consecutive blocks back into views (on the
// device).
func unpack(views []*tensor.Tensor, packed *tensor.Tensor) {
	var nt *tensor.Tape
	off := 0
	for _, v := range views {
		tensor.Copy(v, nt.Narrow(packed, 0, off, v.Numel()))
		off += v.Numel()
	}
}
