// Package gpt is Megatron's GPTModel in one file: word (and optional learned
// position) embeddings, pre-norm transformer layers with fused-QKV attention
// and an MLP, a final norm and a tied or untied output layer. Llama is not a
// copy: RoPE, GQA, SwiGLU and RMSNorm are Config fields. Parameter names are
// Megatron core's (decoder.layers.N.self_attention.linear_qkv.weight, ...),
// and their layouts are Megatron's: QKV rows grouped per query group, SwiGLU
// fc1 rows [gate; up].
//
// The transformer layer is written once (layer, attention, mlp below) and
// every run goes through it: training, pipeline stages, KV-cache decoding
// and a server's batched decoding. What differs between them sits behind
// small interfaces with plain defaults: the attention core
// (AttentionCore), the product kernel of the linear layers (Linears), the
// tensor-parallel region around them (Sharding: its identity when nil) and
// activation recomputation (Recompute). The model file calls those and
// holds no communication of its own.
package gpt

import (
	"fmt"
	"math"
	"os"

	"github.com/gotron/gotron/tensor"
)

// Layer is one transformer layer's parameters.
type Layer struct {
	InputNorm, InputNormBias *tensor.Tensor // input_layernorm (bias nil for RMSNorm)
	QKV, QKVBias             *tensor.Tensor // self_attention.linear_qkv: (G·(r+2)·d, h)
	// QNorm and KNorm (--qk-layernorm) normalise each query and key head
	// over its d channels before RoPE: self_attention.q_layernorm and
	// k_layernorm, (d), the model's normalisation (biases for LayerNorm).
	QNorm, QNormBias, KNorm, KNormBias *tensor.Tensor
	Proj, ProjBias                     *tensor.Tensor // self_attention.linear_proj: (h, a·d), (h, a·v) with MLA
	// Multi-latent attention (Config.MLA; QKV nil): linear_q_proj
	// (a·(nope+rope), h) without --q-lora-rank, else linear_q_down_proj
	// (q_lora_rank, h), q_layernorm (QNorm, QNormBias: q_lora_rank; with
	// --qk-layernorm only, as kv_layernorm) and
	// linear_q_up_proj (a·(nope+rope), q_lora_rank); linear_kv_down_proj
	// (kv_lora_rank+rope, h), kv_layernorm (kv_lora_rank) and
	// linear_kv_up_proj (a·(nope+v), kv_lora_rank). Rows are per head.
	QProj, QDown, QUp, KVDown, KVUp *tensor.Tensor
	KVNorm, KVNormBias              *tensor.Tensor
	MLPNorm, MLPNormBias            *tensor.Tensor // pre_mlp_layernorm
	FC1, FC1Bias                    *tensor.Tensor // mlp.linear_fc1: (ffn or 2·ffn, h)
	FC2, FC2Bias                    *tensor.Tensor // mlp.linear_fc2: (h, ffn)
	// MoE replaces the dense MLP (FC1, FC2 nil) in an MoE layer (moe.go).
	MoE *MoELayer
	// GDN replaces self-attention (QKV, QNorm, KNorm, Proj and their
	// biases nil) in a gated delta net layer (gdn.go).
	GDN *GDNLayer
	// DSA is an MLA layer's lightning indexer under DeepSeek sparse
	// attention (dsa.go); nil otherwise.
	DSA *DSAIndexer
}

// Model is a GPT-family language model.
type Model struct {
	Config      Config
	WordEmb     *tensor.Tensor // embedding.word_embeddings.weight (V, h)
	PosEmb      *tensor.Tensor // embedding.position_embeddings.weight (P, h), learned_absolute only
	Layers      []Layer
	FinalNorm   *tensor.Tensor // decoder.final_layernorm.weight
	FinalNormB  *tensor.Tensor // decoder.final_layernorm.bias (LayerNorm only)
	OutputLayer *tensor.Tensor // output_layer.weight (V, h); nil when tied
	rope        *tensor.RoPE
	dsaRope     *tensor.RoPE // the DSA indexer's rotary embedding (dsa.go)
	dsa         *DSAState    // DSA's loss scale and logged losses; nil without DSA

	// CacheMLALatents (Megatron's --cache-mla-latents) makes decoding of a
	// multi-latent attention model cache each position's normalised key-value
	// latent and rotated rotary key (kv_lora_rank + qk_pos_emb_head_dim
	// values a layer) instead of every head's key and value, the key-value
	// up-projection absorbed into the queries and the outputs
	// (mla_latent.go). It changes only decoding.
	CacheMLALatents bool

	// Sharding is set by a parallelism plan (Parallelize) on a model whose
	// parameters are one tensor-parallel rank's slices; nil is one rank
	// (see region).
	Sharding Sharding
	// Recompute is activation recomputation (recompute.go); zero keeps all.
	Recompute Recompute
	// Fusions turns off fused elementwise ops (fusion.go); zero fuses all.
	Fusions Fusions
	// FP8, when set, runs the layers' QKV, projection, fc1 and fc2 on FP8
	// operands (fp8.go); nil multiplies as the tape's precision says.
	FP8 *FP8
	// ParamGather, when set, gathers each unit of layers' parameters
	// before the unit runs in a training or evaluation forward and releases
	// them after (a recomputed chunk is one unit); nil: the parameters are
	// whole.
	ParamGather ParamGather
	// ContextParallel, when set, computes training attention over a
	// context-parallel group (the batch holds this rank's chunks of each
	// sequence); nil is the whole sequence on this rank.
	ContextParallel ContextParallel
	// MoE holds the MoE layers' state between micro-batches (moe.go); nil
	// for a dense model.
	MoE *MoEState
	// Experts is the expert-parallel layout (SliceExperts); nil holds every
	// expert here, whole.
	Experts ExpertParallel
	// TokenGroup is the group of ranks sharing this rank's sequences (with
	// sequence parallelism): the routers sum their load-balancing counts
	// over it; nil is this rank alone.
	TokenGroup TokenGroup
	// BatchGroup is the group of ranks whose tokens make up the global
	// batch at this rank's layers (Megatron's tp_dp_cp group: the tensor-,
	// data- and context-parallel ranks of its pipeline stage):
	// global_aux_loss sums its counts over it; nil is this rank alone.
	BatchGroup   TokenGroup
	otherExperts map[string][]int // the experts other EP ranks hold
	// expertsOverTP: every routed expert is split over the tensor-parallel
	// ranks (SplitExpertsOverTP): the experts' outputs are partial sums.
	expertsOverTP bool
	// expertSum, set by DecodeExperts, sums the partial outputs of the
	// ranks that hold the same tokens and their own experts (decoding's
	// expert parallelism).
	expertSum func(*tensor.Tape, *tensor.Tensor) *tensor.Tensor
}

// New builds a model with Megatron's initialisation drawn from rng: weights
// normal(0, std), output projections normal(0, std/sqrt(2L)), biases zero,
// norm weights one. Each parameter draws from its own stream forked by name,
// so the values do not depend on creation order.
func New(cfg Config, rng *tensor.RNG) (*Model, error) {
	return newModel(cfg, rng, nil)
}

// newModel is New, building only part's tensors when part is set.
func newModel(cfg Config, rng *tensor.RNG, part *Part) (*Model, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	m := &Model{Config: cfg}
	if err := part.check(&cfg); err != nil {
		return nil, err
	}
	h, d, a, g := cfg.HiddenSize, cfg.KVChannels, cfg.NumAttentionHeads, cfg.NumQueryGroups
	std := cfg.InitMethodStd
	outStd := std / float32(math.Sqrt(2*float64(cfg.NumLayers)))
	embStd, outLayerStd := std, std
	if cfg.MuP.Enabled { // width-scaled hidden matrices; embeddings keep std
		s := cfg.InitStds()
		std, outStd, embStd, outLayerStd = float32(s.Hidden), float32(s.Output), float32(s.Embedding), float32(s.OutputLayer)
	}
	normal := func(name string, s float32, shape ...int) *tensor.Tensor {
		p := tensor.Param(name, shape...)
		rng.Fork(name).Normal(p.Float32s(), 0, s)
		return p
	}
	ones := func(name string, n int) *tensor.Tensor {
		p := tensor.Param(name, n)
		if cfg.LayerNorm1P {
			return p // γ = 0: the scale 1 + γ starts at one
		}
		for i := range p.Float32s() {
			p.Float32s()[i] = 1
		}
		return p
	}
	bias := func(name string, n int, on bool) *tensor.Tensor {
		if !on {
			return nil
		}
		return tensor.Param(name, n)
	}
	ln := cfg.Normalization == LayerNorm
	qkNorm := func(name string) *tensor.Tensor {
		if !cfg.QKLayerNorm {
			return nil
		}
		return ones(name, d)
	}
	hasBias := !cfg.DisableBiasLinear
	fc1Rows := cfg.FFNHiddenSize
	if cfg.Activation == SwiGLU {
		fc1Rows *= 2
	}
	qkvRows := g * (a/g + 2) * d // per query group: [q (r·d); k (d); v (d)]
	if cfg.AttentionOutputGate {
		qkvRows = g * (2*(a/g) + 2) * d // [q (r·d); gate (r·d); k (d); v (d)]
	}
	if part.wordEmbedding(&cfg) {
		m.WordEmb = part.shard(normal("embedding.word_embeddings.weight", embStd, cfg.VocabSize, h))
	}
	if cfg.PositionEmbeddingType == LearnedAbsolute && part.embedding() {
		m.PosEmb = part.shard(normal("embedding.position_embeddings.weight", embStd, cfg.MaxPositionEmbeddings, h))
	}
	for i := range cfg.NumLayers {
		if !part.holdsLayer(i) {
			m.Layers = append(m.Layers, Layer{}) // another rank's
			continue
		}
		p := fmt.Sprintf("decoder.layers.%d.", i)
		// the parts every layer has; then a dense MLP or an MoE one
		l := Layer{
			InputNorm:     ones(p+"input_layernorm.weight", h),
			InputNormBias: bias(p+"input_layernorm.bias", h, ln),
		}
		projIn := a * d
		switch {
		case cfg.MLA.Enabled:
			newMLA(&cfg, &l, p, normal, ones, bias)
			projIn = a * cfg.MLA.VHeadDim
			if cfg.DSA.Enabled {
				l.DSA = newDSAIndexer(&cfg, p, normal, ones)
			}
		case cfg.IsGDNLayer(i):
			l.GDN = newGDNLayer(&cfg, p, rng, normal, ones, std, outStd)
		default:
			l.QKV = normal(p+"self_attention.linear_qkv.weight", std, qkvRows, h)
			l.QKVBias = bias(p+"self_attention.linear_qkv.bias", qkvRows, hasBias || cfg.AddQKVBias)
			l.QNorm = qkNorm(p + "self_attention.q_layernorm.weight")
			l.QNormBias = bias(p+"self_attention.q_layernorm.bias", d, ln && cfg.QKLayerNorm)
			l.KNorm = qkNorm(p + "self_attention.k_layernorm.weight")
			l.KNormBias = bias(p+"self_attention.k_layernorm.bias", d, ln && cfg.QKLayerNorm)
		}
		if l.GDN == nil {
			l.Proj = normal(p+"self_attention.linear_proj.weight", outStd, h, projIn)
			l.ProjBias = bias(p+"self_attention.linear_proj.bias", h, hasBias)
		}
		l.MLPNorm = ones(p+"pre_mlp_layernorm.weight", h)
		l.MLPNormBias = bias(p+"pre_mlp_layernorm.bias", h, ln)
		if cfg.MoE.IsMoELayer(i, cfg.NumLayers) {
			l.MoE = newMoELayer(&cfg, p, normal, std, outStd)
			if part != nil && part.Experts != nil && part.err == nil {
				// the other experts are garbage now: one layer at a time
				part.err = keepExperts(&cfg, i, l.MoE, part.Experts, nil)
			}
			if part != nil && part.ExpertsOverTP && part.err == nil {
				part.err = splitExpertsOverTP(&cfg, i, l.MoE, part.TP.Rank(), part.TP.Size())
			}
		} else {
			l.FC1 = normal(p+"mlp.linear_fc1.weight", std, fc1Rows, h)
			l.FC1Bias = bias(p+"mlp.linear_fc1.bias", fc1Rows, hasBias)
			l.FC2 = normal(p+"mlp.linear_fc2.weight", outStd, h, cfg.FFNHiddenSize)
			l.FC2Bias = bias(p+"mlp.linear_fc2.bias", h, hasBias)
		}
		if part != nil && part.TP != nil {
			l = shardLayer(&l, part.shard) // the whole layer is garbage now: one at a time
		}
		m.Layers = append(m.Layers, l)
	}
	if cfg.MoE.Enabled() {
		m.MoE = newMoEState()
	}
	if part.head() {
		m.FinalNorm = part.shard(ones("decoder.final_layernorm.weight", h))
		m.FinalNormB = part.shard(bias("decoder.final_layernorm.bias", h, ln))
		if cfg.UntieEmbeddingsAndOutputWeights {
			m.OutputLayer = part.shard(normal("output_layer.weight", outLayerStd, cfg.VocabSize, h))
		}
	}
	if cfg.MLA.Enabled { // MLA's own rotary embedding, whatever the position embedding type
		r, err := cfg.mlaRoPE()
		if err != nil {
			return nil, err
		}
		m.rope = r
		if cfg.DSA.Enabled {
			if m.dsaRope, err = cfg.dsaRoPE(); err != nil {
				return nil, err
			}
			m.dsa = &DSAState{LossScale: 1}
		}
	} else if cfg.PositionEmbeddingType == RoPE {
		style := tensor.RotateHalf
		if cfg.RotaryInterleaved {
			style = tensor.Interleaved
		}
		r, err := tensor.NewRoPE(tensor.RoPEConfig{Dim: cfg.RotaryDim(), Base: cfg.RotaryBase, MaxPositions: cfg.MaxPositionEmbeddings, Style: style})
		if err != nil {
			return nil, err
		}
		m.rope = r
	}
	if part != nil && part.err != nil {
		return nil, part.err
	}
	if part != nil && part.TP != nil {
		m.expertsOverTP = part.ExpertsOverTP && cfg.MoE.Enabled()
		size, rank := part.TP.Size(), part.TP.Rank()
		m.Sharding = &tpSharding{r: part.TP, vocabStart: rank * (cfg.VocabSize / size), headStart: rank * (cfg.NumAttentionHeads / size)}
	}
	return m, nil
}

// Params returns every parameter in a fixed order (the checkpoint order).
func (m *Model) Params() []*tensor.Tensor {
	ps := nonNil(m.WordEmb, m.PosEmb)
	for i := range m.Layers {
		ps = append(ps, m.Layers[i].Params()...)
	}
	return append(ps, nonNil(m.FinalNorm, m.FinalNormB, m.OutputLayer)...)
}

// Params returns the layer's parameters in the checkpoint order.
func (l *Layer) Params() []*tensor.Tensor {
	ps := nonNil(l.InputNorm, l.InputNormBias, l.QKV, l.QKVBias, l.QNorm, l.QNormBias, l.KNorm, l.KNormBias,
		l.QProj, l.QDown, l.QUp, l.KVDown, l.KVUp, l.KVNorm, l.KVNormBias)
	ps = append(ps, nonNil(l.DSA.params()...)...)
	ps = append(ps, nonNil(l.Proj, l.ProjBias)...)
	if l.GDN != nil {
		ps = append(ps, nonNil(l.GDN.params()...)...)
	}
	ps = append(ps, nonNil(l.MLPNorm, l.MLPNormBias, l.FC1, l.FC1Bias, l.FC2, l.FC2Bias)...)
	if l.MoE != nil {
		ps = append(ps, nonNil(l.MoE.params()...)...)
	}
	return ps
}

func nonNil(ps ...*tensor.Tensor) []*tensor.Tensor {
	out := make([]*tensor.Tensor, 0, len(ps))
	for _, p := range ps {
		if p != nil {
			out = append(out, p)
		}
	}
	return out
}

// ParamGather makes the parameters of a unit of layers whole around their
// use in a training or evaluation forward pass (fully sharded data
// parallelism, parallel/fsdp): Gather runs before layers [first,
// first+n) and Release after them. Both return x unchanged; recorded on a
// tape as identity ops, their backward runs in the other order (Release's
// before the layers' backward, Gather's after it), so the backward pass
// gathers the parameters again and releases them, reducing their
// gradients, when the layers' backward is done.
type ParamGather interface {
	Gather(tp *tensor.Tape, x *tensor.Tensor, first, n int) *tensor.Tensor
	Release(tp *tensor.Tape, x *tensor.Tensor, first, n int) *tensor.Tensor
}

// Device returns the device holding the model's parameters.
func (m *Model) Device() tensor.Device {
	if m.WordEmb == nil { // a later pipeline stage's (Stage.DecodeModel)
		for _, p := range m.Params() {
			return p.Device()
		}
	}
	return m.WordEmb.Device()
}

// ToDevice moves every parameter to dev, in place (a model is built on the
// CPU, from the seed or a checkpoint, then moved): tensor.MoveParams.
func (m *Model) ToDevice(dev tensor.Device) { tensor.MoveParams(dev, m.Params()...) }

// CheckDevice refuses a model the device has no kernels for, or whose
// CUDA kernels have not yet run on a GPU unless GOTRON_CUDA_UNVERIFIED (in
// the process's environment) names them: CheckDeviceEnv with os.Getenv.
func (c *Config) CheckDevice(dev tensor.Device) error { return c.CheckDeviceEnv(dev, os.Getenv) }

// CheckDeviceEnv is CheckDevice reading GOTRON_CUDA_UNVERIFIED through
// getenv. On --device cuda the squared ReLU (sqrelu), the attention output
// gate (output-gate), multi-latent attention (mla), the gated delta net
// (gdn) and DeepSeek sparse attention (dsa, with mla) are built but have
// not run on a GPU, and run only when the variable names them
// (tensor.CUDAUnverified). The CPU and the simulated device run them all.
func (c *Config) CheckDeviceEnv(dev tensor.Device, getenv func(string) string) error {
	if dev != tensor.CUDA {
		return nil
	}
	unverified := func(flag, what, feature string) error {
		if tensor.CUDAUnverified(getenv, feature) {
			return nil
		}
		return fmt.Errorf("gpt: %s with --device cuda: %s built but not run on a GPU in this release; set GOTRON_CUDA_UNVERIFIED=%s to run it anyway, or use --device cpu or sim", flag, what, feature)
	}
	if c.DSA.Enabled {
		if err := unverified("--experimental-attention-variant dsa", "DeepSeek sparse attention's CUDA kernels (the indexer, its top-k, the attention over the selected keys, the indexer loss) are", "dsa"); err != nil {
			return err
		}
	}
	if c.MLA.Enabled {
		if err := unverified("--multi-latent-attention", "multi-latent attention on the GPU (its ops' kernels, head dimensions above 128 by chunks of heads) is", "mla"); err != nil {
			return err
		}
	}
	if c.Activation == SquaredReLU {
		if err := unverified("--squared-relu", "the squared-ReLU activation's CUDA kernels are", "sqrelu"); err != nil {
			return err
		}
	}
	if c.GDN.Enabled {
		if err := unverified("--experimental-attention-variant gated_delta_net", "the gated delta net's CUDA kernels (convolution, L2Norm, gates, the delta rule by its recurrence, the decoding runs) are", "gdn"); err != nil {
			return err
		}
	}
	if c.AttentionOutputGate {
		if err := unverified("--attention-output-gate", "the attention output gate's CUDA kernels are", "output-gate"); err != nil {
			return err
		}
	}
	return nil
}

// CheckDecode refuses a model that incremental decoding (KV caches:
// generate, serve, inference) cannot run.
func (c *Config) CheckDecode() error {
	if c.DSA.Enabled {
		return fmt.Errorf("gpt: decoding a --experimental-attention-variant dsa model (generate, serve, inference) is not built: DSA has no indexer key cache in this release; train, evaluate and score it instead")
	}
	if c.MuP.Enabled {
		// the paged decode kernels scale by 1/sqrt(head dim), not muP's
		return fmt.Errorf("gpt: decoding a --use-mup model (generate, serve, inference) is not built: the decode attention has no muP softmax scale; train, evaluate and score it instead")
	}
	return nil
}

// NumParams counts parameters (tied weights once).
func (m *Model) NumParams() int {
	n := 0
	for _, p := range m.Params() {
		n += p.Numel()
	}
	return n
}

// Batch is one micro-batch: tokens (b, t) and optional per-token data.
type Batch struct {
	Tokens    *tensor.Tensor // int32 (b, t)
	Positions *tensor.Tensor // int32 (b, t); nil means 0..t-1 (--reset-position-ids gives others)
	DocIDs    *tensor.Tensor // int32 (b, t); non-nil masks attention across documents (--reset-attention-mask)
	Labels    *tensor.Tensor // int32 (b, t), for Loss
	LossMask  *tensor.Tensor // float32 (b, t), for Loss; nil weighs every token 1
}

// Forward returns logits (b, t, V). rng draws dropout masks (nil when both
// dropouts are zero, or in evaluation with training=false).
func (m *Model) Forward(tp *tensor.Tape, bt Batch, rng *tensor.RNG, training bool) *tensor.Tensor {
	p := m.trainingPass(bt, rng, training)
	x := m.embed(tp, bt.Tokens, bt.Positions, p)
	x = m.block(tp, x, m.Layers, 0, p)
	return m.head(tp, x, m.outputWeight(), p) // (b, t, V), or this rank's V/TP
}

// pass is what differs between the runs of the one layer implementation
// below: training (Forward, a pipeline Stage) and decoding (Decode,
// DecodeBatch). Each part has a plain default, so a new kind of run (ring
// attention for context parallelism, an MoE MLP's grouped experts) plugs in
// at one place instead of copying the layer.
type pass struct {
	// positions (1, n) or (b, t) of the tokens; nil means 0..t-1.
	positions *tensor.Tensor
	// core is the attention of a layer's queries over its keys and values.
	core AttentionCore
	// lin computes x·wᵀ + b for a weight (tensor.Tape.Linear by default;
	// a server's packed weights). The TP region around it is m.region()'s.
	lin Linears
	// rng draws dropout masks; nil means no dropout (evaluation, decoding).
	rng     *tensor.RNG
	dropout float32 // hidden dropout probability while rng is set
	recomp  Recompute
	// layerTape, when set, holds one layer's activations: each layer runs
	// on it and its output is copied into a buffer of the run's tape before
	// the layer tape is reset (decoding: a step keeps one layer's buffers).
	layerTape *tensor.Tape
	// gdn, when set (decoding a model with gated delta net layers), keeps
	// each sequence's recurrent state; gdnStart[i] is true when run i of
	// the step starts its sequence (position 0), whose state is zeroed at
	// each layer before use.
	gdn      GDNStates
	gdnStart []bool
	// mlaLatents: decoding an MLA model with its latents cached
	// (Model.CacheMLALatents, mla_latent.go).
	mlaLatents bool
}

// trainingPass is the pass of Forward and Stage.Forward: the fused causal
// attention core (documents masked by bt.DocIDs, selective recomputation),
// the model's own linear layers, dropout and recomputation as configured.
func (m *Model) trainingPass(bt Batch, rng *tensor.RNG, training bool) *pass {
	if !training {
		rng = nil
	}
	core := &causalAttention{m: m, docIDs: bt.DocIDs, rng: rng, selective: m.Recompute.Selective}
	return &pass{positions: bt.Positions, core: core, lin: tapeLinear{}, rng: rng,
		dropout: m.Config.HiddenDropout, recomp: m.Recompute}
}

// embed is the first part of the forward pass: word (and position)
// embeddings, then dropout.
func (m *Model) embed(tp *tensor.Tape, tokens, positions *tensor.Tensor, p *pass) *tensor.Tensor {
	b, t := tokens.Dim(0), tokens.Dim(1)
	sh := m.region()
	// vocab-parallel with TP; sequence shards (b, t/TP, h) with SP and no position table
	x := sh.WordEmbedding(tp, tokens, m.WordEmb, m.PosEmb == nil) // (b, t, h)
	if m.PosEmb != nil {
		if positions == nil {
			positions = defaultPositions(m.Device(), b, t)
		}
		x = sh.ScatterSequence(tp, tp.Add(x, tp.Embedding(positions, m.PosEmb))) // identity without SP
	}
	if e := m.Config.EmbeddingMult(); e != 1 { // muP's mup_embedding_mult, before dropout
		x = tp.Scale(x, float32(e))
	}
	return m.dropout(tp, x, p)
}

// block runs layers (global indices first, first+1, ...), recomputing as
// p.recomp says: Megatron's --recompute-num-layers counts the layers of
// each pipeline stage, so the units start at layers[0].
func (m *Model) block(tp *tensor.Tape, x *tensor.Tensor, layers []Layer, first int, p *pass) *tensor.Tensor {
	g := m.ParamGather
	if p.layerTape != nil {
		g = nil // decoding: a server's model is whole
	}
	for i := 0; i < len(layers); {
		if p.layerTape != nil && m.Sharding != nil && tp.Err() != nil {
			return x // decoding: a collective failed, the step is abandoned
		}
		n := p.recomp.chunk(i, len(layers))
		if n == 0 {
			if g != nil {
				x = g.Gather(tp, x, first+i, 1)
			}
			x = m.layerOn(tp, x, &layers[i], first+i, p)
			if g != nil {
				x = g.Release(tp, x, first+i, 1)
			}
			i++
			continue
		}
		lo := i
		if g != nil {
			x = g.Gather(tp, x, first+i, n)
		}
		x = tp.Checkpoint(func(tp *tensor.Tape, in []*tensor.Tensor) []*tensor.Tensor {
			h := in[0]
			for j := lo; j < lo+n; j++ {
				h = m.layer(tp, h, &layers[j], first+j, p)
			}
			return []*tensor.Tensor{h}
		}, []*tensor.Tensor{x}, m.dropoutStreams(p.rng)...)[0]
		if g != nil {
			x = g.Release(tp, x, first+i, n)
		}
		i += n
	}
	return x
}

// layerOn runs layer on the run's tape, or on p.layerTape and copies the
// output into x's buffer (x lives on the run's tape; the layer's buffers go
// back to the layer tape's arena).
func (m *Model) layerOn(tp *tensor.Tape, x *tensor.Tensor, l *Layer, index int, p *pass) *tensor.Tensor {
	lt := p.layerTape
	if lt == nil {
		return m.layer(tp, x, l, index, p)
	}
	y := m.layer(lt, x, l, index, p)
	tensor.Copy(x, y)
	if m.Sharding != nil {
		// a collective's failure outlives the layer tape's reset
		tp.Fail(lt.Err())
	}
	lt.Reset()
	return x
}

// layer is x + drop(attn(norm1(x))), then + drop(mlp(norm2(x))); each
// half ends in bias-dropout-add, which takes the output projection's bias
// when fused, and the first half's also computes norm2 (fusion.go). The
// next layer's norm1 stays apart: a layer's boundary carries the residual
// stream alone (recompute checkpoints, the layer tape, parameter gathers,
// pipeline stages).
func (m *Model) layer(tp *tensor.Tape, x *tensor.Tensor, l *Layer, index int, p *pass) *tensor.Tensor {
	p = m.layerPass(p, index)
	var a, ab *tensor.Tensor
	n := m.norm(tp, x, l.InputNorm, l.InputNormBias)
	if l.GDN != nil {
		a = m.gatedDeltaNet(tp, l.GDN, index, n, p)
	} else {
		a, ab = m.attention(tp, l, index, n, p)
	}
	tp.ForwardDone(n) // the norms' outputs go once read (tensor keeps what backward needs)
	x, h := m.biasDropoutAddNorm(tp, x, a, ab, p, l.MLPNorm, l.MLPNormBias)
	f, fb := m.mlp(tp, l, index, h, p)
	tp.ForwardDone(h)
	return m.biasDropoutAdd(tp, x, f, fb, p)
}

// attention: fused QKV in Megatron's per-query-group layout, RoPE, the
// pass's attention core, output projection; it returns the projection's
// bias apart when bias-dropout-add takes it (else nil).
func (m *Model) attention(tp *tensor.Tape, l *Layer, index int, x *tensor.Tensor, p *pass) (out, bias *tensor.Tensor) {
	c := &m.Config
	if c.MLA.Enabled {
		return m.mlaAttention(tp, l, index, x, p), nil // its projection adds its bias
	}
	sh := m.region()
	qkv := sh.ColumnLinear(tp, p.lin, x, l.QKV, l.QKVBias) // (b, t, G·(r+2)·d), this rank's groups
	b, t := qkv.Dim(0), qkv.Dim(1)
	// Query groups held here (all of them, or this TP rank's): from the
	// weight, so a tensor-parallel slice needs no other config.
	r, d := c.NumAttentionHeads/c.NumQueryGroups, c.KVChannels
	var gate *tensor.Tensor
	var q, k, v *tensor.Tensor
	if c.AttentionOutputGate { // per group [q; gate; k; v], as get_query_key_value_tensors(output_gate=True)
		g := l.QKV.Dim(0) / ((2*r + 2) * d)
		parts := tp.Split(tp.Reshape(qkv, b, t, g, (2*r+2)*d), 3, r*d, r*d, d, d)
		q, gate = tp.Reshape(parts[0], b, t, g*r, d), parts[1]
		k, v = tp.Reshape(parts[2], b, t, g, d), tp.Reshape(parts[3], b, t, g, d)
	} else {
		g := l.QKV.Dim(0) / ((r + 2) * d)
		parts := tp.Split(tp.Reshape(qkv, b, t, g, (r+2)*d), 3, r*d, d, d)
		q = tp.Reshape(parts[0], b, t, g*r, d) // head h = j·r + i uses kv head j
		k = tp.Reshape(parts[1], b, t, g, d)
		v = tp.Reshape(parts[2], b, t, g, d)
	}
	heads := q.Dim(2)
	if l.QNorm != nil { // --qk-layernorm: per head, before RoPE, as Megatron's get_query_key_value_tensors
		q = m.norm(tp, q, l.QNorm, l.QNormBias)
		k = m.norm(tp, k, l.KNorm, l.KNormBias)
	}
	if m.rope != nil {
		q = tp.RoPE(q, m.rope, p.positions)
		k = tp.RoPE(k, m.rope, p.positions)
	}
	o := p.core.Attend(tp, index, q, k, v) // (b, t, a, d)
	if gate != nil {
		// before the output projection, computed in float32 as Megatron's gate.float()
		o = tp.SigmoidGate(o, tp.Reshape(tp.Contiguous(gate), b, t, heads, d))
	}
	projBias, bias := skipBias(l.ProjBias, m.fuseBiasDropout(p))
	return sh.RowLinear(tp, p.lin, tp.Reshape(o, b, t, heads*d), l.Proj, projBias), bias
}

// mlp is fc2(act(fc1(x))), or an MoE layer's router and experts (moe.go);
// the fused activation takes fc1's bias, and fc2's comes back apart when
// bias-dropout-add takes it (else nil).
func (m *Model) mlp(tp *tensor.Tape, l *Layer, index int, x *tensor.Tensor, p *pass) (out, bias *tensor.Tensor) {
	if l.MoE != nil {
		return m.moe(tp, l.MoE, index, x, p), nil
	}
	sh := m.region()
	fc1Bias, actBias := skipBias(l.FC1Bias, m.fuseBiasActivation())
	fc2Bias, bias := skipBias(l.FC2Bias, m.fuseBiasDropout(p))
	var a *tensor.Tensor
	if _, tape := p.lin.(tapeLinear); tape && actBias != nil && m.Config.Activation == GELUTanh {
		// fc1, its bias and the tanh GELU as one op: on a device with
		// cuBLASLt's epilogues one product (tensor.Tape.LinearGELU), else
		// the same ops as below
		a = sh.ColumnLinear(tp, linearGELU{actBias}, x, l.FC1, nil)
	} else {
		h := sh.ColumnLinear(tp, p.lin, x, l.FC1, fc1Bias)
		a = m.activate(tp, h, actBias)
	}
	out = sh.RowLinear(tp, p.lin, a, l.FC2, fc2Bias)
	tp.ForwardDone(a)
	return out, bias
}

// linearGELU is the Linears of fc1 under the bias-GELU fusion with the
// tanh GELU: tanh-GELU(x·wᵀ + bias), the bias its own (the sharding
// passes none: fc1's bias is this rank's shard, as for the fused op).
type linearGELU struct{ bias *tensor.Tensor }

func (l linearGELU) Linear(tp *tensor.Tape, x, w, _ *tensor.Tensor) *tensor.Tensor {
	return tp.LinearGELU(x, w, l.bias, tensor.GELUTanh)
}

// head is the final norm and the output layer: logits (b, t, V), or this
// TP rank's V/TP.
func (m *Model) head(tp *tensor.Tape, x, out *tensor.Tensor, p *pass) *tensor.Tensor {
	x = m.norm(tp, x, m.FinalNorm, m.FinalNormB)
	logits := m.region().ColumnLinear(tp, p.lin, x, out, nil)
	tp.ForwardDone(x)
	if s := m.Config.LogitMult(); s != 1 { // muP's mup_output_mult, as GPTModel._scale_logits
		logits = tp.Scale(logits, float32(s))
	}
	return logits
}

// outputWeight is the output layer's weight: its own, or the word
// embedding when tied.
func (m *Model) outputWeight() *tensor.Tensor {
	if m.OutputLayer != nil {
		return m.OutputLayer
	}
	return m.WordEmb
}

func (m *Model) norm(tp *tensor.Tape, x, w, b *tensor.Tensor) *tensor.Tensor {
	n := m.normOf(tp, w, b)
	if n.RMS {
		return tp.RMSNorm(x, n.Weight, n.Eps)
	}
	return tp.LayerNorm(x, n.Weight, n.Bias, n.Eps)
}

// normOf is the model's normalization with weight w and bias b (RMSNorm
// has none).
func (m *Model) normOf(tp *tensor.Tape, w, b *tensor.Tensor) tensor.Norm {
	if m.Config.LayerNorm1P {
		w = tp.Add(w, onesLike(w)) // Megatron's zero-centred gamma: scale by 1 + γ
	}
	if m.Config.Normalization == RMSNorm {
		return tensor.Norm{RMS: true, Weight: w, Eps: m.Config.NormEpsilon}
	}
	return tensor.Norm{Weight: w, Bias: b, Eps: m.Config.NormEpsilon}
}

// onesLike is a constant tensor of ones with w's shape on w's device.
func onesLike(w *tensor.Tensor) *tensor.Tensor {
	one := tensor.New(tensor.Float32, w.Shape()...)
	for i := range one.Float32s() {
		one.Float32s()[i] = 1
	}
	return one.ToDevice(w.Device())
}

// dropout is the hidden dropout of replicated activations, drawn from
// Megatron's default stream; with SP the activations are sequence shards
// and draw from the per-rank stream, as Megatron's model-parallel RNG
// tracker.
func (m *Model) dropout(tp *tensor.Tape, x *tensor.Tensor, p *pass) *tensor.Tensor {
	if p.rng == nil || p.dropout == 0 {
		return x
	}
	sh := m.region()
	rng := sh.DropoutRNG(p.rng, sh.SequenceParallel())
	if cp := m.ContextParallel; cp != nil && !sh.SequenceParallel() {
		// the whole sequence's mask, as one rank would draw it (sequence
		// shards draw their own, per rank, with or without CP)
		return cp.Dropout(tp, x, p.dropout, rng)
	}
	return tp.Dropout(x, p.dropout, rng)
}

// defaultPositions is 0..t-1 in every row, on dev.
func defaultPositions(dev tensor.Device, b, t int) *tensor.Tensor {
	p := make([]int32, b*t)
	for i := range p {
		p[i] = int32(i % t)
	}
	return tensor.FromInt32(p, b, t).ToDevice(dev)
}

// Loss is the token-weighted cross-entropy Σ loss·mask / Σ mask of logits
// (b, t, V) against bt.Labels, as pretrain_gpt.py's loss_func.
func (m *Model) Loss(tp *tensor.Tape, logits *tensor.Tensor, bt Batch) *tensor.Tensor {
	n := bt.Labels.Numel()
	var mask *tensor.Tensor
	if bt.LossMask != nil {
		mask = tp.Reshape(bt.LossMask, n)
	}
	// With TP the logits hold this rank's vocabulary slice.
	return m.region().CrossEntropy(tp, tp.Reshape(logits, n, logits.Dim(-1)), bt.Labels.Contiguous().Reshape(n), mask)
}
