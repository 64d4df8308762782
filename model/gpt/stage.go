package gpt

import (
	"fmt"

	"github.com/gotron/gotron/tensor"
)

// Flag names of the pipeline split, as users type them.
const (
	flagPPSize      = "--pipeline-model-parallel-size"
	flagVPStages    = "--num-virtual-stages-per-pipeline-rank"
	flagVPLayers    = "--num-layers-per-virtual-pipeline-stage"
	flagFirstLayers = "--decoder-first-pipeline-num-layers"
	flagLastLayers  = "--decoder-last-pipeline-num-layers"
	flagAccountEmb  = "--account-for-embedding-in-pipeline-split"
	flagAccountLoss = "--account-for-loss-in-pipeline-split"
)

// PipelineSplit is how --num-layers is cut into pipeline stages (Megatron's
// get_transformer_layer_offset and get_num_layers_to_build). The model is
// cut into PP·VPP virtual stages; pipeline rank r holds chunks c = 0..VPP−1,
// virtual stage c·PP + r, so the layers go round the ranks VPP times. The
// zero value is one stage holding every layer.
type PipelineSplit struct {
	// PP is --pipeline-model-parallel-size; 0 means 1.
	PP int
	// VPP is the number of model chunks per pipeline rank
	// (--num-virtual-stages-per-pipeline-rank, formerly
	// --virtual-pipeline-model-parallel-size); 0 and 1 mean one chunk, or
	// the count LayersPerVirtualStage gives.
	VPP int
	// LayersPerVirtualStage is --num-layers-per-virtual-pipeline-stage, the
	// other way of asking for chunks: VPP = (layers per rank) / this. 0 means
	// unset; it cannot be combined with VPP or an uneven split.
	LayersPerVirtualStage int
	// FirstLayers is --decoder-first-pipeline-num-layers: the layers of
	// pipeline rank 0 over all its chunks. 0 means unset.
	FirstLayers int
	// LastLayers is --decoder-last-pipeline-num-layers: the layers of the
	// last pipeline rank. 0 means unset. The layers neither takes are split
	// evenly over the middle ranks.
	LastLayers int
	// AccountForEmbedding (--account-for-embedding-in-pipeline-split) and
	// AccountForLoss (--account-for-loss-in-pipeline-split) count the
	// embedding and the loss as one layer each when the layers are split
	// evenly: --num-layers plus those is cut into PP·VPP equal virtual
	// stages, and the first (last) virtual stage builds one transformer
	// layer fewer, as Megatron's get_num_layers_to_build. Not with an
	// uneven split (Megatron refuses the combination).
	AccountForEmbedding, AccountForLoss bool
}

// accounted is the number of layers the even split divides: numLayers plus
// one for each of the embedding and the loss counted as a layer.
func (s PipelineSplit) accounted(numLayers int) int {
	n := numLayers
	if s.AccountForEmbedding {
		n++
	}
	if s.AccountForLoss {
		n++
	}
	return n
}

// accountFlags names the account-for flags set, for errors.
func (s PipelineSplit) accountFlags() string {
	switch {
	case s.AccountForEmbedding && s.AccountForLoss:
		return flagAccountEmb + " and " + flagAccountLoss
	case s.AccountForEmbedding:
		return flagAccountEmb
	}
	return flagAccountLoss
}

// Chunks returns the number of model chunks per pipeline rank (VPP, with
// LayersPerVirtualStage resolved) after checking the split of numLayers
// layers as Megatron's validate_args and TransformerConfig do, naming the
// flags in the error.
func (s PipelineSplit) Chunks(numLayers int) (int, error) {
	_, vpp, err := s.resolve(numLayers)
	return vpp, err
}

// resolve validates s for numLayers and returns PP and VPP with defaults.
func (s PipelineSplit) resolve(numLayers int) (pp, vpp int, err error) {
	for _, f := range []struct {
		flag string
		v    int
	}{{flagPPSize, s.PP}, {flagVPStages, s.VPP}, {flagVPLayers, s.LayersPerVirtualStage},
		{flagFirstLayers, s.FirstLayers}, {flagLastLayers, s.LastLayers}} {
		if f.v < 0 {
			return 0, 0, fmt.Errorf("gpt: %s=%d: want a positive number (or 0 for unset)", f.flag, f.v)
		}
	}
	if numLayers <= 0 {
		return 0, 0, fmt.Errorf("gpt: --num-layers=%d: want > 0", numLayers)
	}
	pp, vpp = max(s.PP, 1), max(s.VPP, 1)
	uneven := s.FirstLayers > 0 || s.LastLayers > 0
	if s.AccountForEmbedding || s.AccountForLoss {
		return s.resolveAccounted(numLayers, pp, vpp)
	}
	if s.LayersPerVirtualStage > 0 {
		switch {
		case s.VPP > 0:
			return 0, 0, fmt.Errorf("gpt: %s and %s both set: give only one of them", flagVPLayers, flagVPStages)
		case uneven:
			return 0, 0, fmt.Errorf("gpt: %s with %s or %s: use %s to set the virtual stages of an uneven split (as Megatron)",
				flagVPLayers, flagFirstLayers, flagLastLayers, flagVPStages)
		case numLayers%pp != 0:
			return 0, 0, fmt.Errorf("gpt: --num-layers=%d is not divisible by %s=%d", numLayers, flagPPSize, pp)
		case (numLayers/pp)%s.LayersPerVirtualStage != 0:
			return 0, 0, fmt.Errorf("gpt: %d layers per pipeline rank (--num-layers=%d / %s=%d) are not divisible by %s=%d",
				numLayers/pp, numLayers, flagPPSize, pp, flagVPLayers, s.LayersPerVirtualStage)
		}
		vpp = numLayers / pp / s.LayersPerVirtualStage
	}
	if vpp > 1 && pp == 1 {
		return 0, 0, fmt.Errorf("gpt: %d virtual stages per pipeline rank need %s > 1 (got 1)", vpp, flagPPSize)
	}
	if !uneven {
		switch {
		case numLayers%pp != 0:
			return 0, 0, fmt.Errorf("gpt: --num-layers=%d is not divisible by %s=%d (or set %s / %s)",
				numLayers, flagPPSize, pp, flagFirstLayers, flagLastLayers)
		case (numLayers/pp)%vpp != 0:
			return 0, 0, fmt.Errorf("gpt: %d layers per pipeline rank (--num-layers=%d / %s=%d) are not divisible by %d virtual stages per rank (%s)",
				numLayers/pp, numLayers, flagPPSize, pp, vpp, flagVPStages)
		}
		return pp, vpp, nil
	}
	if pp == 1 {
		return 0, 0, fmt.Errorf("gpt: %s / %s need %s > 1", flagFirstLayers, flagLastLayers, flagPPSize)
	}
	middle, stages := numLayers, pp
	for _, f := range []struct {
		flag string
		v    int
	}{{flagFirstLayers, s.FirstLayers}, {flagLastLayers, s.LastLayers}} {
		if f.v == 0 {
			continue
		}
		if f.v%vpp != 0 {
			return 0, 0, fmt.Errorf("gpt: %s=%d is not divisible by %d virtual stages per rank (%s)", f.flag, f.v, vpp, flagVPStages)
		}
		middle -= f.v
		stages--
	}
	switch {
	case middle < 0 || (stages == 0 && middle != 0):
		return 0, 0, fmt.Errorf("gpt: %s=%d and %s=%d do not add up to --num-layers=%d over %s=%d",
			flagFirstLayers, s.FirstLayers, flagLastLayers, s.LastLayers, numLayers, flagPPSize, pp)
	case stages > 0 && middle%stages != 0:
		return 0, 0, fmt.Errorf("gpt: the %d layers left by %s=%d and %s=%d are not divisible by the %d middle pipeline stages of %s=%d",
			middle, flagFirstLayers, s.FirstLayers, flagLastLayers, s.LastLayers, stages, flagPPSize, pp)
	case stages > 0 && (middle/stages)%vpp != 0:
		return 0, 0, fmt.Errorf("gpt: %d layers per middle pipeline rank are not divisible by %d virtual stages per rank (%s)",
			middle/stages, vpp, flagVPStages)
	}
	return pp, vpp, nil
}

// resolveAccounted is resolve with the embedding and/or the loss counted as
// a layer: Megatron's validate_args and TransformerConfig checks, with the
// flags named.
func (s PipelineSplit) resolveAccounted(numLayers, pp, vpp int) (int, int, error) {
	if s.FirstLayers > 0 || s.LastLayers > 0 {
		return 0, 0, fmt.Errorf("gpt: %s cannot be combined with %s or %s (as Megatron)", s.accountFlags(), flagFirstLayers, flagLastLayers)
	}
	n := s.accounted(numLayers)
	if n%pp != 0 {
		return 0, 0, fmt.Errorf("gpt: --num-layers=%d plus the layer(s) %s counts (%d) is not divisible by %s=%d",
			numLayers, s.accountFlags(), n, flagPPSize, pp)
	}
	if s.LayersPerVirtualStage > 0 {
		if s.VPP > 0 {
			return 0, 0, fmt.Errorf("gpt: %s and %s both set: give only one of them", flagVPLayers, flagVPStages)
		}
		if (n/pp)%s.LayersPerVirtualStage != 0 {
			return 0, 0, fmt.Errorf("gpt: %d layers per pipeline rank (--num-layers=%d with %s, / %s=%d) are not divisible by %s=%d",
				n/pp, numLayers, s.accountFlags(), flagPPSize, pp, flagVPLayers, s.LayersPerVirtualStage)
		}
		vpp = n / pp / s.LayersPerVirtualStage
	}
	if vpp > 1 && pp == 1 {
		return 0, 0, fmt.Errorf("gpt: %d virtual stages per pipeline rank need %s > 1 (got 1)", vpp, flagPPSize)
	}
	if (n/pp)%vpp != 0 {
		return 0, 0, fmt.Errorf("gpt: %d layers per pipeline rank (--num-layers=%d with %s, / %s=%d) are not divisible by %d virtual stages per rank (%s)",
			n/pp, numLayers, s.accountFlags(), flagPPSize, pp, vpp, flagVPStages)
	}
	return pp, vpp, nil
}

// rankLayers is the number of layers pipeline rank r holds over all its
// chunks, for a resolved split.
func (s PipelineSplit) rankLayers(numLayers, pp, r int) int {
	switch {
	case r == 0 && s.FirstLayers > 0:
		return s.FirstLayers
	case r == pp-1 && s.LastLayers > 0:
		return s.LastLayers
	}
	middle, stages := numLayers, pp
	if s.FirstLayers > 0 {
		middle, stages = middle-s.FirstLayers, stages-1
	}
	if s.LastLayers > 0 {
		middle, stages = middle-s.LastLayers, stages-1
	}
	return middle / stages
}

// LayerRanges returns, for each chunk c of pipeline rank rank, the global
// layer indices [lo, hi) it holds: virtual stage c·PP + rank starts after
// every layer of the virtual stages before it (Megatron's layer offset:
// chunk c begins at c·numLayers/VPP).
func (s PipelineSplit) LayerRanges(numLayers, rank int) ([][2]int, error) {
	pp, vpp, err := s.resolve(numLayers)
	if err != nil {
		return nil, err
	}
	if rank < 0 || rank >= pp {
		return nil, fmt.Errorf("gpt: pipeline rank %d: want 0..%d (%s=%d)", rank, pp-1, flagPPSize, pp)
	}
	out := make([][2]int, vpp)
	if s.AccountForEmbedding || s.AccountForLoss {
		// Megatron's get_transformer_layer_offset and
		// get_num_layers_to_build: virtual stage v = c·PP + rank holds
		// slots [v·per, (v+1)·per) of the accounted layers, the embedding
		// being slot 0 and the loss the last slot.
		per := s.accounted(numLayers) / (pp * vpp)
		for c := range vpp {
			v := c*pp + rank
			lo, hi := v*per, (v+1)*per
			if s.AccountForEmbedding {
				lo, hi = max(lo-1, 0), hi-1
			}
			hi = min(hi, numLayers)
			out[c] = [2]int{lo, hi}
		}
		return out, nil
	}
	for c := range vpp {
		lo := c * numLayers / vpp
		for r := range rank {
			lo += s.rankLayers(numLayers, pp, r) / vpp
		}
		out[c] = [2]int{lo, lo + s.rankLayers(numLayers, pp, rank)/vpp}
	}
	return out, nil
}

// Stage is one pipeline rank's part of the model for one model chunk
// (virtual stage): the embedding on the model's first stage, a contiguous
// range of layers, and the final norm, output layer and loss on the last
// stage. Its tensors are the full model's (SplitStages slices, it does not
// copy), keeping their global names (decoder.layers.<global index>...), so
// checkpoints merge and split by name.
type Stage struct {
	Config Config
	// Rank is the pipeline rank and Chunk the model chunk on it; the virtual
	// stage is Chunk·PP + Rank.
	Rank, Chunk int
	// FirstLayer is the global index of Layers[0].
	FirstLayer int
	// WordEmb and PosEmb are set on the first stage only (PosEmb with
	// learned absolute positions).
	WordEmb, PosEmb *tensor.Tensor
	// Layers are the stage's transformer layers, in order.
	Layers []Layer
	// FinalNorm, FinalNormB and OutputLayer are set on the last stage only.
	// With tied embeddings OutputLayer is the word embedding: the same
	// tensor when one stage is both first and last, otherwise the last
	// stage's own copy (named embedding.word_embeddings.weight, initialised
	// equal), whose gradient a trainer sums with the first stage's over the
	// embedding group (SharedEmbedding).
	FinalNorm, FinalNormB, OutputLayer *tensor.Tensor
	// Sharding is the full model's tensor-parallel entry points (nil on one
	// rank).
	Sharding Sharding

	first, last bool
	model       *Model // the full model's rope table and config, for the layer code
}

// IsFirst reports whether the stage holds the embedding (virtual stage 0).
func (s *Stage) IsFirst() bool { return s.first }

// IsLast reports whether the stage holds the final norm, output layer and
// loss (the last virtual stage).
func (s *Stage) IsLast() bool { return s.last }

// SplitStages returns pipeline rank rank's stages, one per model chunk, of
// full (built whole from the seed, and tensor-parallel sliced if TP is on,
// so every layout starts from the same values). The last stage of a tied
// model on another rank than the first gets a copy of the word embedding.
// full's tensors are shared, not copied.
func SplitStages(full *Model, split PipelineSplit, rank int) ([]*Stage, error) {
	c := full.Config
	ranges, err := split.LayerRanges(c.NumLayers, rank)
	if err != nil {
		return nil, err
	}
	pp, vpp := max(split.PP, 1), len(ranges)
	tied := full.OutputLayer == nil
	var out []*Stage
	for ch, r := range ranges {
		s := &Stage{Config: c, Rank: rank, Chunk: ch, FirstLayer: r[0], Layers: full.Layers[r[0]:r[1]:r[1]],
			Sharding: full.Sharding, model: full, first: rank == 0 && ch == 0, last: rank == pp-1 && ch == vpp-1}
		if s.first {
			s.WordEmb, s.PosEmb = full.WordEmb, full.PosEmb
		}
		if s.last {
			s.FinalNorm, s.FinalNormB, s.OutputLayer = full.FinalNorm, full.FinalNormB, full.OutputLayer
			switch {
			case tied && s.first:
				s.OutputLayer = full.WordEmb
			case tied:
				s.OutputLayer = tensor.Param(full.WordEmb.Name, full.WordEmb.Shape()...)
				tensor.MoveParams(full.Device(), s.OutputLayer)
				tensor.Copy(s.OutputLayer, full.WordEmb)
			}
		}
		out = append(out, s)
	}
	return out, nil
}

// Params returns the stage's parameters in the model's checkpoint order
// (the tied output weight once when it is the embedding itself).
func (s *Stage) Params() []*tensor.Tensor {
	ps := []*tensor.Tensor{s.WordEmb, s.PosEmb}
	for i := range s.Layers {
		ps = append(ps, s.Layers[i].Params()...)
	}
	ps = append(ps, s.FinalNorm, s.FinalNormB)
	if s.OutputLayer != s.WordEmb {
		ps = append(ps, s.OutputLayer)
	}
	out := ps[:0]
	for _, p := range ps {
		if p != nil {
			out = append(out, p)
		}
	}
	return out
}

// Buffers returns the checkpointed state of the stage's layers outside
// their parameters (Model.Buffers for the stage's layers only): each MoE
// router's expert bias under its whole-model name, sharing its values.
func (s *Stage) Buffers() []*tensor.Tensor {
	var out []*tensor.Tensor
	for i := range s.Layers {
		if l := s.Layers[i].MoE; l != nil && l.ExpertBias != nil {
			b := tensor.FromFloat32(l.ExpertBias, len(l.ExpertBias))
			b.Name = fmt.Sprintf("decoder.layers.%d.mlp.router.expert_bias", s.FirstLayer+i)
			out = append(out, b)
		}
	}
	return out
}

// SharedEmbedding returns the tensor whose gradient is summed over the
// embedding group with tied embeddings: the first stage's word embedding or
// the last stage's copy. It is nil on other stages, on untied models, and on
// a stage that is both first and last (nothing to sum). A trainer passes it
// to data parallelism as the shared embedding (its own bucket) and, on the
// last stage, leaves it out of the gradient norm (Megatron marks the copy
// shared, so the norm counts it once).
func (s *Stage) SharedEmbedding() *tensor.Tensor {
	if s.model.OutputLayer != nil || (s.first && s.last) {
		return nil
	}
	switch {
	case s.first:
		return s.WordEmb
	case s.last:
		return s.OutputLayer
	}
	return nil
}

// IsEmbeddingCopy reports whether p is the last stage's copy of the tied
// word embedding (to be counted once in the gradient norm, as Megatron's
// shared parameters).
func (s *Stage) IsEmbeddingCopy(p *tensor.Tensor) bool {
	return s.last && !s.first && p != nil && p == s.SharedEmbedding()
}

// Forward runs the stage's part of Model.Forward on micro-batch bt and
// returns the hidden states (b, t, h) for the next stage, or on the last
// stage the logits (b, t, V) (this rank's V/TP with tensor parallelism). x is
// the previous stage's output (b, t, h) ((b, t/TP, h) with sequence
// parallelism); the first stage ignores it and embeds bt.Tokens. The ops are
// Model.Forward's, in its order, so the pipeline reproduces one process.
func (s *Stage) Forward(tp *tensor.Tape, x *tensor.Tensor, bt Batch, rng *tensor.RNG, training bool) *tensor.Tensor {
	m := s.view()
	p := m.trainingPass(bt, rng, training)
	if s.first {
		x = m.embed(tp, bt.Tokens, bt.Positions, p)
	}
	x = m.block(tp, x, s.Layers, s.FirstLayer, p)
	if !s.last {
		return x
	}
	return m.head(tp, x, s.OutputLayer, p) // (b, t, V), or this rank's V/TP
}

// Loss is Model.Loss on the last stage's logits.
func (s *Stage) Loss(tp *tensor.Tape, logits *tensor.Tensor, bt Batch) *tensor.Tensor {
	return s.view().Loss(tp, logits, bt)
}

// view is a Model holding the stage's parameters, so the stage runs the
// model file's own layer code (with the full model's recompute setting,
// applied per stage as Megatron's --recompute-num-layers is, and its MoE
// state and expert-parallel group: the stage's routers record their losses
// in the full model's per-layer tracker).
func (s *Stage) view() *Model {
	return &Model{Config: s.Config, WordEmb: s.WordEmb, PosEmb: s.PosEmb, Layers: s.Layers,
		FinalNorm: s.FinalNorm, FinalNormB: s.FinalNormB, OutputLayer: s.OutputLayer,
		rope: s.model.rope, dsaRope: s.model.dsaRope, dsa: s.model.dsa, Sharding: s.Sharding, Recompute: s.model.Recompute, Fusions: s.model.Fusions, FP8: s.model.FP8, ContextParallel: s.model.ContextParallel,
		MoE: s.model.MoE, Experts: s.model.Experts, TokenGroup: s.model.TokenGroup, BatchGroup: s.model.BatchGroup,
		CacheMLALatents: s.model.CacheMLALatents, expertsOverTP: s.model.expertsOverTP, expertSum: s.model.expertSum}
}

// ActivationShape is the shape of the hidden states between stages for a
// micro-batch of b sequences of t tokens: (b, t, h), or (b, t/TP, h) with
// sequence parallelism.
func (s *Stage) ActivationShape(b, t int) []int {
	if ts, ok := s.Sharding.(*tpSharding); ok && ts.r.SequenceParallel {
		t /= ts.r.Size()
	}
	return []int{b, t, s.Config.HiddenSize}
}

// StageRunner runs a Stage over one step's micro-batches for the pipeline
// executor: it has the method set of parallel/pp.Stage. The failures of the
// tensor-parallel collectives its stage runs are recorded on the tape, which
// the executor checks.
// The caller sets Batches before each step; every pipeline rank needs them
// (tokens on the first stage, labels and loss mask on the last, positions
// and document ids on all).
type StageRunner struct {
	Stage *Stage
	// Batches are the step's micro-batches, indexed by micro-batch.
	Batches []Batch
	// RNG draws dropout masks; nil with zero dropout.
	RNG *tensor.RNG
	// Training turns dropout on.
	Training bool
}

// Forward runs micro-batch mb from in (nil on the first stage) and returns
// the hidden states, or on the last stage the micro-batch's mean loss.
func (r *StageRunner) Forward(tp *tensor.Tape, mb int, in *tensor.Tensor) (*tensor.Tensor, error) {
	if mb < 0 || mb >= len(r.Batches) {
		return nil, fmt.Errorf("gpt: stage %d: micro-batch %d of %d", r.Stage.Chunk, mb, len(r.Batches))
	}
	bt := r.Batches[mb]
	out := r.Stage.Forward(tp, in, bt, r.RNG, r.Training)
	if r.Stage.IsLast() {
		out = r.Stage.Loss(tp, out, bt)
	}
	return out, nil
}

// InputShape is the activation shape of micro-batch mb (see
// Stage.ActivationShape).
func (r *StageRunner) InputShape(mb int) []int {
	if mb < 0 || mb >= len(r.Batches) {
		return nil
	}
	tok := r.Batches[mb].Tokens
	return r.Stage.ActivationShape(tok.Dim(0), tok.Dim(1))
}
