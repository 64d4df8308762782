package gpt

import (
	"fmt"
	"slices"
	"strings"

	"github.com/gotron/gotron/parallel/tp"
	"github.com/gotron/gotron/tensor"
)

// Sharding is what tensor (and sequence) parallelism changes in the forward
// pass: Megatron's entry and exit points of the tensor-parallel regions. A
// model built by Parallelize holds one; the model file calls it and nothing
// else of the plan. One rank's is the identity (unsharded), so the model
// never asks whether it is parallel.
type Sharding interface {
	// WordEmbedding is the vocab-parallel lookup, reduced over the TP
	// ranks; scatter reduce-scatters it straight to sequence shards (SP with
	// no position table).
	WordEmbedding(tp *tensor.Tape, tokens, table *tensor.Tensor, scatter bool) *tensor.Tensor
	// EnterRegion is a column-parallel linear's input side alone: x is
	// all-gathered from sequence shards with SP, else copied to the ranks
	// (its gradient all-reduced). MLA's shared rotary key enters so.
	EnterRegion(tp *tensor.Tape, x *tensor.Tensor) *tensor.Tensor
	// ScatterSequence keeps this rank's sequence shard (identity without SP).
	ScatterSequence(tp *tensor.Tape, x *tensor.Tensor) *tensor.Tensor
	// ColumnLinear is a column-parallel linear (QKV, fc1, the output
	// layer) computed by lin: x enters the region (copied to the TP ranks,
	// or all-gathered from sequence shards with SP), and each rank computes
	// its slice of the outputs.
	ColumnLinear(tp *tensor.Tape, lin Linears, x, w, b *tensor.Tensor) *tensor.Tensor
	// RowLinear is a row-parallel linear (proj, fc2) computed by lin: the
	// ranks' partial products are reduced (reduce-scattered to sequence
	// shards with SP) before the bias is added.
	RowLinear(tp *tensor.Tape, lin Linears, x, w, b *tensor.Tensor) *tensor.Tensor
	// CrossEntropy is the vocab-parallel loss of this rank's logits (n, V/TP).
	CrossEntropy(tp *tensor.Tape, logits, labels, mask *tensor.Tensor) *tensor.Tensor
	// SequenceParallel reports whether activations outside the TP regions
	// are sequence shards.
	SequenceParallel() bool
	// DropoutRNG returns the per-TP-rank stream when perRank, else shared.
	DropoutRNG(shared *tensor.RNG, perRank bool) *tensor.RNG
	// FirstHead is the global index of this rank's first query head (the
	// ranks hold contiguous query groups): attention dropout is keyed by
	// global head, so every TP size drops the same probabilities.
	FirstHead() int
	// SumOverRanks all-reduces x over the TP ranks, forward only: x must
	// carry no gradient (the DSA indexer loss's target sums each rank's
	// heads' probabilities).
	SumOverRanks(tp *tensor.Tape, x *tensor.Tensor) *tensor.Tensor
	// GatherVocab all-gathers the output layer's vocab-parallel logits
	// (…, V/TP) into the whole vocabulary (…, V) on every rank: decoding
	// samples from them (training's loss stays vocab-parallel).
	GatherVocab(tp *tensor.Tape, logits *tensor.Tensor) *tensor.Tensor
}

// TPPlan is GPT's tensor-parallel plan (Megatron's layer specs): the style
// of every parameter, by name. QKV rows are grouped per query group, so a
// contiguous row slice is whole groups; SwiGLU's fc1 is [gate; up].
func TPPlan(c Config) func(name string) tp.Style {
	return c.TPStyle
}

// TPStyle is the style of parameter name in GPT's tensor-parallel plan
// (TPPlan).
func (c *Config) TPStyle(name string) tp.Style {
	switch {
	case name == "embedding.word_embeddings.weight", name == "output_layer.weight":
		return tp.Column // vocab-parallel rows
	case strings.HasSuffix(name, "self_attention.linear_qkv.weight"), strings.HasSuffix(name, "self_attention.linear_qkv.bias"):
		return tp.Column
	case strings.HasSuffix(name, "self_attention.linear_q_proj.weight"), strings.HasSuffix(name, "self_attention.linear_q_up_proj.weight"),
		strings.HasSuffix(name, "self_attention.linear_kv_up_proj.weight"):
		return tp.Column // MLA's up-projections: rows per head (its down-projections are replicated)
	case strings.HasSuffix(name, "mlp.linear_fc1.weight"), strings.HasSuffix(name, "mlp.linear_fc1.bias"):
		if c.Activation == SwiGLU {
			return tp.ColumnGLU
		}
		return tp.Column
	case strings.HasSuffix(name, "mlp.shared_experts.linear_fc1.weight"): // the shared expert is a dense MLP
		if c.Activation == SwiGLU {
			return tp.ColumnGLU
		}
		return tp.Column
	case strings.Contains(name, "self_attention.in_proj.weight."), strings.Contains(name, "self_attention.conv1d.weight."),
		strings.HasSuffix(name, "self_attention.dt_bias"), strings.HasSuffix(name, "self_attention.A_log"):
		return tp.Column // a gated delta net's heads (its out_norm is replicated)
	case strings.HasSuffix(name, "self_attention.out_proj.weight"):
		return tp.Row
	case strings.HasSuffix(name, "self_attention.linear_proj.weight"), strings.HasSuffix(name, "mlp.linear_fc2.weight"),
		strings.HasSuffix(name, "mlp.shared_experts.linear_fc2.weight"):
		return tp.Row
	}
	// norms, row-parallel biases, position embeddings, the router and the
	// shared expert's gate; and the routed experts, which tensor
	// parallelism leaves whole (their split is expert tensor parallelism's:
	// gpt.Model.SliceExperts)
	return tp.Replicated
}

// IsRoutedExpert reports whether parameter name is a routed expert's
// weight (mlp.experts.*).
func IsRoutedExpert(name string) bool { return strings.Contains(name, "mlp.experts.") }

// CheckTP reports a configuration that cannot be split over size
// tensor-parallel ranks, naming the flags.
func (c *Config) CheckTP(size int, sequenceParallel bool, seqLength int) error {
	switch {
	case size < 1:
		return fmt.Errorf("gpt: --tensor-model-parallel-size=%d: want ≥ 1", size)
	case sequenceParallel && size == 1:
		return fmt.Errorf("gpt: --sequence-parallel needs --tensor-model-parallel-size > 1")
	case c.GDN.Enabled && c.GDN.NumKeyHeads%size != 0:
		return fmt.Errorf("gpt: --linear-num-key-heads=%d is not divisible by --tensor-model-parallel-size=%d", c.GDN.NumKeyHeads, size)
	case c.GDN.Enabled && c.GDN.NumValueHeads%size != 0:
		return fmt.Errorf("gpt: --linear-num-value-heads=%d is not divisible by --tensor-model-parallel-size=%d", c.GDN.NumValueHeads, size)
	case c.NumAttentionHeads%size != 0:
		return fmt.Errorf("gpt: --num-attention-heads=%d is not divisible by --tensor-model-parallel-size=%d", c.NumAttentionHeads, size)
	case c.NumQueryGroups%size != 0:
		return fmt.Errorf("gpt: --num-query-groups=%d is not divisible by --tensor-model-parallel-size=%d", c.NumQueryGroups, size)
	case c.FFNHiddenSize%size != 0:
		return fmt.Errorf("gpt: --ffn-hidden-size=%d is not divisible by --tensor-model-parallel-size=%d", c.FFNHiddenSize, size)
	case c.VocabSize%size != 0:
		return fmt.Errorf("gpt: padded vocabulary %d is not divisible by --tensor-model-parallel-size=%d (pad with --make-vocab-size-divisible-by)", c.VocabSize, size)
	case c.MoE.SharedExpertFFN%size != 0:
		return fmt.Errorf("gpt: --moe-shared-expert-intermediate-size=%d is not divisible by --tensor-model-parallel-size=%d", c.MoE.SharedExpertFFN, size)
	case sequenceParallel && seqLength%size != 0:
		return fmt.Errorf("gpt: --seq-length=%d is not divisible by --tensor-model-parallel-size=%d (needed by --sequence-parallel)", seqLength, size)
	}
	return nil
}

// Parallelize returns this tensor-parallel rank's model: every parameter of
// full (built with the whole shapes, so every TP size starts from the same
// values: Megatron's --use-cpu-initialization) sliced by TPPlan, and the
// Sharding that inserts region's communication. rankRNG is the per-rank
// dropout stream (Megatron's model-parallel RNG). full is left unchanged.
func Parallelize(full *Model, region *tp.Region, rankRNG *tensor.RNG) (*Model, error) {
	c := full.Config
	size, rank := region.Size(), region.Rank()
	if err := c.CheckTP(size, region.SequenceParallel, 0); err != nil {
		return nil, err
	}
	plan := TPPlan(c)
	m := &Model{Config: c, rope: full.rope, dsaRope: full.dsaRope, dsa: full.dsa, MoE: full.MoE, Fusions: full.Fusions, CacheMLALatents: full.CacheMLALatents, FP8: full.FP8}
	var err error
	shard := func(x *tensor.Tensor) *tensor.Tensor {
		if x == nil || err != nil {
			return nil
		}
		var s *tensor.Tensor
		s, err = tp.Shard(x, plan(x.Name), rank, size)
		return s
	}
	m.WordEmb, m.PosEmb = shard(full.WordEmb), shard(full.PosEmb)
	for i := range full.Layers {
		m.Layers = append(m.Layers, shardLayer(&full.Layers[i], shard))
	}
	m.FinalNorm, m.FinalNormB, m.OutputLayer = shard(full.FinalNorm), shard(full.FinalNormB), shard(full.OutputLayer)
	if err != nil {
		return nil, err
	}
	m.Sharding = &tpSharding{r: region, vocabStart: rank * (c.VocabSize / size), headStart: rank * (c.NumAttentionHeads / size), rankRNG: rankRNG}
	return m, nil
}

// shardLayer is a layer's tensor-parallel part: each tensor through shard.
func shardLayer(l *Layer, shard func(*tensor.Tensor) *tensor.Tensor) Layer {
	return Layer{
		InputNorm: shard(l.InputNorm), InputNormBias: shard(l.InputNormBias),
		QKV: shard(l.QKV), QKVBias: shard(l.QKVBias),
		QNorm: shard(l.QNorm), QNormBias: shard(l.QNormBias), KNorm: shard(l.KNorm), KNormBias: shard(l.KNormBias),
		Proj: shard(l.Proj), ProjBias: shard(l.ProjBias),
		QProj: shard(l.QProj), QDown: shard(l.QDown), QUp: shard(l.QUp), KVDown: shard(l.KVDown), KVUp: shard(l.KVUp),
		KVNorm: shard(l.KVNorm), KVNormBias: shard(l.KVNormBias),
		MLPNorm: shard(l.MLPNorm), MLPNormBias: shard(l.MLPNormBias),
		FC1: shard(l.FC1), FC1Bias: shard(l.FC1Bias), FC2: shard(l.FC2), FC2Bias: shard(l.FC2Bias),
		MoE: shardMoE(l.MoE, shard), GDN: shardGDN(l.GDN, shard), DSA: shardDSA(l.DSA, shard),
	}
}

// shardMoE is an MoE layer's tensor-parallel part: the shared expert split
// as the dense MLP, the router and gate replicated, and the routed experts
// whole (the same tensors: SliceExperts splits them over expert TP).
func shardMoE(l *MoELayer, shard func(*tensor.Tensor) *tensor.Tensor) *MoELayer {
	if l == nil {
		return nil
	}
	return &MoELayer{Router: shard(l.Router), FC1: l.FC1, FC2: l.FC2, FirstExpert: l.FirstExpert,
		ExpertBias: slices.Clone(l.ExpertBias), SharedFC1: shard(l.SharedFC1), SharedFC2: shard(l.SharedFC2), Gate: shard(l.Gate)}
}

// shardGDN is a gated delta net layer's tensor-parallel part: every
// section of in_proj and conv1d, dt_bias and A_log split by heads, out_proj
// by its input, out_norm replicated (TPStyle).
func shardGDN(l *GDNLayer, shard func(*tensor.Tensor) *tensor.Tensor) *GDNLayer {
	if l == nil {
		return nil
	}
	return &GDNLayer{InQ: shard(l.InQ), InK: shard(l.InK), InV: shard(l.InV), InZ: shard(l.InZ),
		InBeta: shard(l.InBeta), InAlpha: shard(l.InAlpha), ConvQ: shard(l.ConvQ), ConvK: shard(l.ConvK), ConvV: shard(l.ConvV),
		DtBias: shard(l.DtBias), ALog: shard(l.ALog), OutNorm: shard(l.OutNorm), OutNormBias: shard(l.OutNormBias),
		OutProj: shard(l.OutProj)}
}

// shardDSA is a DSA indexer's tensor-parallel part: all of it, on every
// rank (Megatron's "duplicated" linears; TPStyle replicates them).
func shardDSA(l *DSAIndexer, shard func(*tensor.Tensor) *tensor.Tensor) *DSAIndexer {
	if l == nil {
		return nil
	}
	return &DSAIndexer{WqB: shard(l.WqB), Wk: shard(l.Wk), KNorm: shard(l.KNorm), KNormBias: shard(l.KNormBias), WeightsProj: shard(l.WeightsProj)}
}

// tpSharding is Sharding over one tp.Region.
type tpSharding struct {
	r          *tp.Region
	vocabStart int
	headStart  int
	rankRNG    *tensor.RNG
}

func (s *tpSharding) WordEmbedding(t *tensor.Tape, tokens, table *tensor.Tensor, scatter bool) *tensor.Tensor {
	x := s.r.VocabEmbedding(t, tokens, table, s.vocabStart)
	if scatter && s.r.SequenceParallel {
		return s.r.ReduceScatterSeq(t, x)
	}
	return s.r.ReduceFrom(t, x)
}

func (s *tpSharding) EnterRegion(t *tensor.Tape, x *tensor.Tensor) *tensor.Tensor {
	if s.r.SequenceParallel {
		return s.r.GatherSeq(t, x)
	}
	return s.r.CopyTo(t, x)
}

func (s *tpSharding) ScatterSequence(t *tensor.Tape, x *tensor.Tensor) *tensor.Tensor {
	if !s.r.SequenceParallel {
		return x
	}
	return s.r.ScatterSeq(t, x)
}

func (s *tpSharding) ColumnLinear(t *tensor.Tape, lin Linears, x, w, b *tensor.Tensor) *tensor.Tensor {
	if s.r.SequenceParallel {
		x = s.r.GatherSeq(t, x)
	} else {
		x = s.r.CopyTo(t, x)
	}
	return lin.Linear(t, x, w, b)
}

func (s *tpSharding) RowLinear(t *tensor.Tape, lin Linears, x, w, b *tensor.Tensor) *tensor.Tensor {
	y := lin.Linear(t, x, w, nil)
	if s.r.SequenceParallel {
		y = s.r.ReduceScatterSeq(t, y)
	} else {
		y = s.r.ReduceFrom(t, y)
	}
	if b != nil {
		y = t.Add(y, b)
	}
	return y
}

func (s *tpSharding) CrossEntropy(t *tensor.Tape, logits, labels, mask *tensor.Tensor) *tensor.Tensor {
	return s.r.VocabCrossEntropy(t, logits, labels, mask, s.vocabStart)
}

func (s *tpSharding) SequenceParallel() bool { return s.r.SequenceParallel }

func (s *tpSharding) DropoutRNG(shared *tensor.RNG, perRank bool) *tensor.RNG {
	if perRank && s.rankRNG != nil {
		return s.rankRNG
	}
	return shared
}

func (s *tpSharding) FirstHead() int { return s.headStart }

func (s *tpSharding) SumOverRanks(t *tensor.Tape, x *tensor.Tensor) *tensor.Tensor {
	return s.r.ReduceFrom(t, x)
}

func (s *tpSharding) GatherVocab(t *tensor.Tape, logits *tensor.Tensor) *tensor.Tensor {
	return s.r.GatherLast(t, logits)
}

// unsharded is one rank's Sharding: no region to enter or leave.
type unsharded struct{}

func (unsharded) WordEmbedding(t *tensor.Tape, tokens, table *tensor.Tensor, _ bool) *tensor.Tensor {
	return t.Embedding(tokens, table)
}

func (unsharded) EnterRegion(_ *tensor.Tape, x *tensor.Tensor) *tensor.Tensor { return x }

func (unsharded) ScatterSequence(_ *tensor.Tape, x *tensor.Tensor) *tensor.Tensor { return x }

func (unsharded) ColumnLinear(t *tensor.Tape, lin Linears, x, w, b *tensor.Tensor) *tensor.Tensor {
	return lin.Linear(t, x, w, b)
}

func (unsharded) RowLinear(t *tensor.Tape, lin Linears, x, w, b *tensor.Tensor) *tensor.Tensor {
	return lin.Linear(t, x, w, b)
}

func (unsharded) CrossEntropy(t *tensor.Tape, logits, labels, mask *tensor.Tensor) *tensor.Tensor {
	return t.CrossEntropy(logits, labels, tensor.CrossEntropyOptions{LossMask: mask})
}

func (unsharded) SequenceParallel() bool { return false }

func (unsharded) DropoutRNG(shared *tensor.RNG, _ bool) *tensor.RNG { return shared }

func (unsharded) FirstHead() int { return 0 }

func (unsharded) SumOverRanks(_ *tensor.Tape, x *tensor.Tensor) *tensor.Tensor { return x }

func (unsharded) GatherVocab(_ *tensor.Tape, logits *tensor.Tensor) *tensor.Tensor { return logits }

// region is the model's Sharding: its plan's, or one rank's identity.
func (m *Model) region() Sharding {
	if m.Sharding == nil {
		return unsharded{}
	}
	return m.Sharding
}
