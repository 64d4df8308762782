package train

import (
	"errors"
	"fmt"
	"io"
	"math"
	"strings"

	"github.com/gotron/gotron/model/gpt"
)

// bytesPerMB is Megatron's NUM_BYTES_IN_MEGABYTE: its "MB" are MiB.
const bytesPerMB = 1024 * 1024

// RecomputeGranularity is --recompute-granularity.
type RecomputeGranularity uint8

// The granularities; the zero value recomputes nothing.
const (
	RecomputeNone      RecomputeGranularity = iota // no activation recomputation
	RecomputeSelective                             // "selective" (also --recompute-activations): the attention core
	RecomputeFull                                  // "full": whole transformer layers
)

// ParseRecomputeGranularity parses --recompute-granularity: "full" or
// "selective".
func ParseRecomputeGranularity(s string) (RecomputeGranularity, error) {
	switch s {
	case "selective":
		return RecomputeSelective, nil
	case "full":
		return RecomputeFull, nil
	}
	return 0, fmt.Errorf("--recompute-granularity=%q: want full or selective", s)
}

// String returns the flag's spelling ("" for RecomputeNone).
func (g RecomputeGranularity) String() string {
	switch g {
	case RecomputeNone:
		return ""
	case RecomputeSelective:
		return "selective"
	case RecomputeFull:
		return "full"
	}
	return fmt.Sprintf("RecomputeGranularity(%d)", uint8(g))
}

// Set makes *RecomputeGranularity a flag.Value (--recompute-granularity).
func (g *RecomputeGranularity) Set(s string) error {
	v, err := ParseRecomputeGranularity(s)
	if err != nil {
		return errors.New("want full or selective")
	}
	*g = v
	return nil
}

// MemoryConfig is the input of Megatron's theoretical memory report
// (megatron/training/theoretical_memory_usage.py): an
// architecture and a parallel layout. Nothing is allocated from it, so any
// size works (GPT-3 175B on a laptop). Field comments name the flag.
type MemoryConfig struct {
	// Model is the architecture. Its VocabSize is the padded vocabulary;
	// Validate fills its defaults (KVChannels, NumQueryGroups,
	// FFNHiddenSize, Normalization) as gpt.Config.Validate does, and a zero
	// MaxPositionEmbeddings means SeqLength.
	Model gpt.Config

	SeqLength      int // --seq-length; must be positive
	MicroBatchSize int // --micro-batch-size; must be positive

	WorldSize        int // --world-size (the launcher's WORLD_SIZE); must be positive
	TensorParallel   int // --tensor-model-parallel-size; 0 means 1
	PipelineParallel int // --pipeline-model-parallel-size; 0 means 1
	ContextParallel  int // --context-parallel-size; 0 means 1 (only the data-parallel size sees it)
	// VirtualPipeline is the number of virtual stages per pipeline rank
	// (Megatron's virtual_pipeline_model_parallel_size, from
	// --num-layers-per-virtual-pipeline-stage or
	// --num-virtual-stages-per-pipeline-rank). 0 and 1 mean no interleaving
	// (Megatron turns 1 into None); more needs PipelineParallel > 1.
	VirtualPipeline int
	// AccountForEmbedding and AccountForLoss are
	// --account-for-embedding-in-pipeline-split and
	// --account-for-loss-in-pipeline-split: checked with the layer split
	// (Megatron's report divides the layers by PP either way).
	AccountForEmbedding, AccountForLoss bool
	// ExpertParallel (--expert-model-parallel-size, 0 means 1) and
	// ExpertTensorParallel (--expert-tensor-parallel-size, 0 means
	// TensorParallel, Megatron's default) shard an MoE model's routed
	// experts.
	ExpertParallel, ExpertTensorParallel int

	// SequenceParallel is --sequence-parallel. As Megatron, it is switched
	// off when TensorParallel is 1.
	SequenceParallel bool
	// RecomputeGranularity is --recompute-granularity: RecomputeNone (the
	// zero value), RecomputeSelective (also --recompute-activations) or
	// RecomputeFull.
	RecomputeGranularity RecomputeGranularity
	// DistributedOptimizer is --use-distributed-optimizer: 6 + 12/DP bytes
	// per parameter instead of 18. Megatron-FSDP switches it on, so
	// Megatron's formula counts --use-megatron-fsdp as the distributed
	// optimizer; it has no term of its own for FSDP.
	DistributedOptimizer bool
	// FSDP is gotron's fully sharded data parallelism (NoFSDP: off): the
	// report adds FSDPWeightAndOptimizerBytes, what gotron keeps.
	FSDP Sharding
	// NumMicrobatches is the number of microbatches per iteration,
	// --global-batch-size / (--micro-batch-size × DP). Zero means unknown, as
	// tools/report_theoretical_memory.py passes it: the pipeline is then
	// taken to hold PipelineParallel microbatches.
	NumMicrobatches int
	// GlobalBatchSize is --global-batch-size; when set, Validate checks it
	// and derives NumMicrobatches from it.
	GlobalBatchSize int
}

// Validate fills the zero-value defaults and rejects impossible layouts,
// naming the flags.
func (c *MemoryConfig) Validate() error {
	for _, f := range []struct {
		name string
		v    *int
	}{{"--tensor-model-parallel-size", &c.TensorParallel}, {"--pipeline-model-parallel-size", &c.PipelineParallel},
		{"--context-parallel-size", &c.ContextParallel}} {
		if *f.v < 0 {
			return fmt.Errorf("train: memory: %s=%d: want >= 1", f.name, *f.v)
		}
		if *f.v == 0 {
			*f.v = 1
		}
	}
	switch {
	case c.SeqLength <= 0:
		return fmt.Errorf("train: memory: --seq-length=%d: want > 0", c.SeqLength)
	case c.MicroBatchSize <= 0:
		return fmt.Errorf("train: memory: --micro-batch-size=%d: want > 0", c.MicroBatchSize)
	case c.WorldSize <= 0:
		return fmt.Errorf("train: memory: --world-size=%d: want > 0", c.WorldSize)
	case c.NumMicrobatches < 0:
		return fmt.Errorf("train: memory: %d microbatches: want >= 0", c.NumMicrobatches)
	}
	if ep := max(c.ExpertParallel, 1); ep > 1 {
		etp := c.ExpertTensorParallel
		if etp == 0 {
			etp = max(c.TensorParallel, 1)
		}
		switch m := etp * ep * max(c.PipelineParallel, 1); {
		case c.ExpertParallel < 0 || c.ExpertTensorParallel < 0:
			return fmt.Errorf("train: memory: --expert-model-parallel-size=%d --expert-tensor-parallel-size=%d: want >= 1", c.ExpertParallel, c.ExpertTensorParallel)
		case !c.Model.MoE.Enabled():
			return fmt.Errorf("train: memory: --expert-model-parallel-size=%d needs --num-experts", ep)
		case c.Model.MoE.NumExperts%ep != 0:
			return fmt.Errorf("train: memory: --num-experts=%d is not divisible by --expert-model-parallel-size=%d", c.Model.MoE.NumExperts, ep)
		case c.WorldSize%m != 0:
			return fmt.Errorf("train: memory: --world-size=%d is not divisible by ETP·EP·PP = %d", c.WorldSize, m)
		}
	}
	if m := c.TensorParallel * c.PipelineParallel * c.ContextParallel; c.WorldSize%m != 0 {
		return fmt.Errorf("train: memory: --world-size=%d is not divisible by --tensor-model-parallel-size × --pipeline-model-parallel-size × --context-parallel-size = %d×%d×%d = %d",
			c.WorldSize, c.TensorParallel, c.PipelineParallel, c.ContextParallel, m)
	}
	if c.RecomputeGranularity > RecomputeFull {
		return fmt.Errorf("train: memory: --recompute-granularity=%v: want full or selective", c.RecomputeGranularity)
	}
	if c.VirtualPipeline == 1 {
		c.VirtualPipeline = 0
	}
	if c.TensorParallel == 1 {
		c.SequenceParallel = false
	}
	if c.Model.MaxPositionEmbeddings == 0 {
		c.Model.MaxPositionEmbeddings = c.SeqLength
	}
	if err := c.Model.Validate(); err != nil {
		return fmt.Errorf("train: memory: %w", err)
	}
	split := gpt.PipelineSplit{PP: c.PipelineParallel, VPP: c.VirtualPipeline,
		AccountForEmbedding: c.AccountForEmbedding, AccountForLoss: c.AccountForLoss}
	if _, err := split.Chunks(c.Model.NumLayers); err != nil {
		return fmt.Errorf("train: memory: %w", err)
	}
	if c.GlobalBatchSize > 0 {
		if err := checkGlobalBatch(c.GlobalBatchSize, c.MicroBatchSize, c.DataParallel()); err != nil {
			return fmt.Errorf("train: memory: %w", err)
		}
		c.NumMicrobatches = c.GlobalBatchSize / (c.MicroBatchSize * c.DataParallel())
	}
	return nil
}

// DataParallel is WorldSize / (TP·PP·CP), Megatron's data_parallel_size.
// It assumes a validated config.
func (c *MemoryConfig) DataParallel() int {
	return c.WorldSize / (c.TensorParallel * c.PipelineParallel * c.ContextParallel)
}

// MemoryReport is Megatron's theoretical memory footprint of the most loaded
// rank, with the numbers its report prints. Parameter counts are float64:
// Megatron divides them by PP and TP without rounding.
type MemoryReport struct {
	TransformerBlockParams float64 // all layers plus the final norm
	EmbeddingParams        float64 // h·V, twice when untied
	TotalParams            float64 // block + embedding
	// ActiveBlockParams is TransformerBlockParams with each MoE layer's
	// top-k experts instead of all (the block, for a dense model).
	ActiveBlockParams     float64
	MostLoadedShardParams float64 // first pipeline stage: 1/PP of the block plus the embedding, over TP
	// OtherShardParams is the count on the other pipeline stages; 0 when
	// PipelineParallel is 1 (Megatron prints it only for PP > 1).
	OtherShardParams float64
	PipelineParallel int // copied from the config: which lines are printed

	// BytesPerParam is 18 (bf16 weight, fp32 gradient, fp32 master weight,
	// two fp32 Adam moments), or 6 + 12/DP with the distributed optimizer.
	BytesPerParam float64

	// SequenceParallelFormula tells which activation formula applies:
	// Megatron's compute_activation_memory (Korthikanti et al. Table 2) only
	// with sequence parallelism and selective recompute, its
	// compute_activation_memory_without_sp otherwise.
	SequenceParallelFormula bool
	// LayerActivationMB is the per-layer activation footprint Megatron
	// prints (already divided by TP).
	LayerActivationMB float64
	// InterleavePenalty is 1 + (PP−1)/(PP·VP) with an interleaved schedule,
	// 0 without.
	InterleavePenalty float64
	// InFlightMicrobatches is Megatron's count of microbatches held by the
	// first stage; 0 when PP is 1 (Megatron prints none).
	InFlightMicrobatches int

	WeightAndOptimizerBytes float64
	ActivationBytes         float64
	// FSDPWeightAndOptimizerBytes is what gotron's fully sharded data
	// parallelism keeps per rank between steps for the most loaded
	// shard's parameters (MemoryConfig.FSDP set, else 0): float32
	// parameters and gradients and Adam's two float32 moments, 16 bytes a
	// parameter, of which optim_grads_params shards all over DP and
	// optim_grads all but the parameters. Layers gathered during a step
	// come on top.
	FSDPWeightAndOptimizerBytes float64
}

// WeightAndOptimizerMB is the weight and optimizer footprint in MiB.
func (r MemoryReport) WeightAndOptimizerMB() float64 { return r.WeightAndOptimizerBytes / bytesPerMB }

// ActivationMB is the activation footprint in MiB.
func (r MemoryReport) ActivationMB() float64 { return r.ActivationBytes / bytesPerMB }

// TotalMB is Megatron's total: the sum of the two MiB figures.
func (r MemoryReport) TotalMB() float64 { return r.WeightAndOptimizerMB() + r.ActivationMB() }

// TheoreticalMemory is Megatron's report_theoretical_memory for a GPT
// (no MTP terms; MoE and multi-latent attention as Megatron counts them). It
// follows Megatron's formula and its order of floating-point operations,
// quirks included: only the first pipeline stage is counted; context
// parallelism changes only the data-parallel size (the sequence is not
// split); full recompute is costed as no recompute; biases and the
// position embedding are not counted; the activation formula ignores
// KVChannels·heads ≠ hidden and GQA.
func TheoreticalMemory(c MemoryConfig) (MemoryReport, error) {
	if err := c.Validate(); err != nil {
		return MemoryReport{}, err
	}
	r := weightAndOptimizerMemory(c)
	if c.SequenceParallel && c.RecomputeGranularity == RecomputeSelective {
		activationMemorySP(c, &r)
	} else {
		activationMemoryNoSP(c, &r)
	}
	return r, nil
}

// weightAndOptimizerMemory is compute_weight_and_optimizer_memory.
func weightAndOptimizerMemory(c MemoryConfig) MemoryReport {
	m := c.Model
	h, L := float64(m.HiddenSize), float64(m.NumLayers)
	tp, pp := float64(c.TensorParallel), float64(c.PipelineParallel)
	qRatio := float64(m.KVChannels*m.NumAttentionHeads) / h
	gated := 1.0
	if m.Activation == gpt.SwiGLU {
		gated = 1.5
	}
	norm := 2.0 // LayerNorm has a bias
	if m.Normalization == gpt.RMSNorm {
		norm = 1
	}
	attention := 2 * h * h * ((1 + float64(m.NumQueryGroups)/float64(m.NumAttentionHeads)) * qRatio)
	if mla := m.MLA; mla.Enabled { // Megatron's multi_latent_attention self_attn_term
		n := float64(m.NumAttentionHeads)
		qk, pe, v := float64(mla.QKHeadDim), float64(mla.QKPosEmbHeadDim), float64(mla.VHeadDim)
		qTerm := h * n * (qk + pe)
		if mla.QLoraRank > 0 {
			qTerm = float64(mla.QLoraRank) * (h + n*(qk+pe) + norm)
		}
		attention = qTerm + float64(mla.KVLoraRank)*(h+n*(qk+v)+norm) + h*pe + n*v*h
	}
	mlp := 2 * h * float64(m.FFNHiddenSize) * gated
	layerNorms := 2 * h * norm
	finalNorm := norm * h
	embedding := h * float64(m.VocabSize)
	// MoE layers (Megatron's routed, shared, router and gate terms; no
	// latent projections or MTP here). Routed experts are sharded over
	// ETP·EP and their optimizer over the expert-data-parallel ranks.
	nDense, nMoE := L, 0.0
	var shared, routed, router, gate float64
	if moe := m.MoE; moe.Enabled() {
		nMoE = float64(moe.NumMoELayers(m.NumLayers))
		nDense = L - nMoE
		shared = 2 * h * float64(moe.SharedExpertFFN) * gated
		routed = 2 * h * float64(moe.FFNHiddenSize) * float64(moe.NumExperts) * gated
		router = h * float64(moe.NumExperts)
		if moe.SharedExpertGate && moe.SharedExpertFFN > 0 {
			gate = h
		}
	}

	var r MemoryReport
	r.PipelineParallel = c.PipelineParallel
	r.EmbeddingParams = embedding
	if m.UntieEmbeddingsAndOutputWeights {
		r.EmbeddingParams = 2 * embedding
	}
	r.TransformerBlockParams = (attention+mlp+layerNorms)*nDense + (attention+shared+routed+layerNorms+router+gate)*nMoE + finalNorm
	r.TotalParams = r.TransformerBlockParams + r.EmbeddingParams
	r.ActiveBlockParams = r.TransformerBlockParams
	if moe := m.MoE; moe.Enabled() {
		r.ActiveBlockParams = (attention+mlp+layerNorms)*nDense + (attention+shared+routed/float64(moe.NumExperts)*float64(moe.TopK)+layerNorms+router+gate)*nMoE + finalNorm
	}

	tpSharded := (attention+mlp)*nDense + (attention+shared)*nMoE
	replicated := layerNorms*nDense + (layerNorms+router+gate)*nMoE + finalNorm
	etp, ep := c.ExpertTensorParallel, max(c.ExpertParallel, 1)
	if etp == 0 {
		etp = c.TensorParallel
	}
	etpEP := float64(etp * ep)
	shardExpert := routed * nMoE / pp / etpEP
	shardTP := (tpSharded/pp + embedding) / tp
	shardReplicated := replicated / pp
	r.MostLoadedShardParams = shardTP + shardReplicated + shardExpert
	if m.UntieEmbeddingsAndOutputWeights && c.PipelineParallel == 1 {
		shardTP += embedding / tp
		r.MostLoadedShardParams += embedding / tp
	}
	if c.PipelineParallel > 1 {
		r.OtherShardParams = tpSharded/(pp*tp) + replicated/pp + routed*nMoE/(pp*etpEP)
	}
	bytes := func(dp int) float64 {
		if c.DistributedOptimizer {
			return 6 + 12/float64(dp)
		}
		return 18
	}
	r.BytesPerParam = bytes(c.DataParallel())
	edp := c.WorldSize / (etp * ep * c.PipelineParallel)
	r.WeightAndOptimizerBytes = (shardTP+shardReplicated)*r.BytesPerParam + shardExpert*bytes(max(edp, 1))
	switch dp := float64(c.DataParallel()); c.FSDP {
	case ShardOptimGradsParams:
		r.FSDPWeightAndOptimizerBytes = (shardTP + shardReplicated) * 16 / dp
	case ShardOptimGrads:
		r.FSDPWeightAndOptimizerBytes = (shardTP + shardReplicated) * (4 + 12/dp)
	}
	return r
}

// activationMemorySP is compute_activation_memory: sequence parallelism
// with selective recompute, first pipeline stage.
func activationMemorySP(c MemoryConfig, r *MemoryReport) {
	m := c.Model
	s, b, h := float64(c.SeqLength), float64(c.MicroBatchSize), float64(m.HiddenSize)
	tp, pp := float64(c.TensorParallel), float64(c.PipelineParallel)
	r.SequenceParallelFormula = true
	act := s * b * h * (18 + 4*(float64(m.FFNHiddenSize)/h))
	r.LayerActivationMB = act / bytesPerMB / tp
	act *= float64(m.NumLayers)
	act += 8 * s * b * pp // embedding input, PP microbatches in flight
	act += s * b * h * pp // embedding dropout
	act = pipelineFactor(c, r, act)
	if c.PipelineParallel == 1 {
		act += s * b * h * 4 * (1 + float64(m.VocabSize)/h) // output layer input and cross entropy
	}
	r.ActivationBytes = act / tp
}

// activationMemoryNoSP is compute_activation_memory_without_sp, which
// Megatron uses for every layout but SP + selective recompute.
func activationMemoryNoSP(c MemoryConfig, r *MemoryReport) {
	m := c.Model
	s, b, h := float64(c.SeqLength), float64(c.MicroBatchSize), float64(m.HiddenSize)
	tp, pp := float64(c.TensorParallel), float64(c.PipelineParallel)
	perLayer := s * b * h * (10 + 24/tp)
	r.LayerActivationMB = perLayer / bytesPerMB
	act := perLayer * float64(m.NumLayers)
	act += 8 * s * b * pp
	act += s * b * h * pp
	act = pipelineFactor(c, r, act)
	if c.PipelineParallel == 1 {
		logits := s * b * float64(m.VocabSize)
		logits /= tp
		finalNorm := s * b * h
		act += (logits + finalNorm) * 2
	}
	r.ActivationBytes = act * 1.05 // Megatron's 5% for temporaries
}

// pipelineFactor applies Megatron's pipeline terms to the activation bytes:
// the interleaved-schedule penalty, or min(1, M/PP) for the plain 1F1B
// schedule when the number of microbatches M is known.
func pipelineFactor(c MemoryConfig, r *MemoryReport, act float64) float64 {
	pp := float64(c.PipelineParallel)
	switch {
	case c.VirtualPipeline > 0:
		r.InterleavePenalty = 1 + (pp-1)/(pp*float64(c.VirtualPipeline))
		r.InFlightMicrobatches = int(math.Ceil(r.InterleavePenalty * pp))
		act *= r.InterleavePenalty
	case c.PipelineParallel > 1:
		r.InFlightMicrobatches = c.PipelineParallel
		if c.NumMicrobatches > 0 {
			act *= min(1, float64(c.NumMicrobatches)/pp)
			r.InFlightMicrobatches = min(c.NumMicrobatches, c.PipelineParallel)
		}
	}
	return act
}

// WriteTo writes Megatron's verbose report, line for line as
// report_theoretical_memory(args, verbose=True) prints it (the "active"
// lines equal the others for a dense model), ending with
// "Theoretical memory footprints: weight and optimizer=X MB, activation=Y
// MB, total=Z MB" and the blank line Megatron's print leaves after it.
func (r MemoryReport) WriteTo(w io.Writer) (int64, error) {
	var b strings.Builder
	line := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	line("Number of parameters in transformer block in billions: % .2f", r.TransformerBlockParams/1e9)
	line("Number of active parameters in transformer block in billions: % .2f", r.ActiveBlockParams/1e9)
	line("Number of parameters in embedding layers in billions: %.2f", r.EmbeddingParams/1e9)
	line("Total number of parameters in billions: %.2f", r.TotalParams/1e9)
	line("Total number of active parameters in billions: %.2f", (r.ActiveBlockParams+r.EmbeddingParams)/1e9)
	line("Number of parameters in most loaded shard in billions: %.4f", r.MostLoadedShardParams/1e9)
	if r.PipelineParallel > 1 {
		line("Number of parameters in other shards in billions: %.4f", r.OtherShardParams/1e9)
	}
	if r.SequenceParallelFormula {
		line("compute_activation_memory with SP")
		line("Activation memory footprint per transformer layer: %.1f MB", r.LayerActivationMB)
	} else {
		line("compute_activation_memory_without_sp")
		line("Activation memory footprint per transformer layer (precise, without SP): %.1f MB", r.LayerActivationMB)
	}
	if r.InterleavePenalty != 0 {
		line("Memory penalty from interleaved schedule: %.2f", r.InterleavePenalty)
	}
	if r.InFlightMicrobatches != 0 {
		line("Number of in-flight microbatches: %d", r.InFlightMicrobatches)
	}
	line("Theoretical memory footprints: weight and optimizer=%.2f MB, activation=%.2f MB, total=%.2f MB\n",
		r.WeightAndOptimizerMB(), r.ActivationMB(), r.TotalMB())
	n, err := io.WriteString(w, b.String())
	return int64(n), err
}
