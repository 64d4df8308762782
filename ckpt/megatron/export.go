package megatron

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"

	"github.com/gotron/gotron/ckpt/torchpt"
	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/optim"
)

// ResumeKey is the extra entry of the rank files Save writes: gotron's own
// checkpoint metadata (JSON), with which gotron resumes exactly what it
// saved (RNG streams, counters Megatron does not keep). Megatron ignores
// entries it does not know.
const ResumeKey = "gotron_resume"

// Export is a whole (unsharded) gotron model and optimizer state to write
// in Megatron's legacy torch layout for a TP×PP (×VP) run.
type Export struct {
	Model     gpt.Config
	SeqLength int
	// TP, PP, VP are the parallel layout the files are split for (0 means 1).
	TP, PP, VP int
	// LayerRanges, when set, gives pipeline rank p's chunks' global layer
	// ranges [lo, hi) (an uneven split: gpt.PipelineSplit.LayerRanges);
	// nil splits the layers evenly over the PP·VP virtual stages.
	LayerRanges func(p int) ([][2]int, error)
	// Param returns a parameter's whole value, row-major in its shape.
	Param func(name string, shape []int) ([]float32, error)
	// Optimizer is the optimizer state; nil writes no optimizer section
	// (--no-save-optim). Its Buffers are whole tensors keyed
	// "<kind>/<param>"; Scheduler, LossScaler and the counters are written
	// where Megatron keeps them.
	Optimizer *OptimizerState
	// Iteration is the checkpoint's iteration.
	Iteration int64
	// Hyperparameters of the param groups, for Megatron's reading.
	LR, DecoupledLR, WeightDecay, Beta1, Beta2, Eps float64
	// Args are further entries of the args Namespace (Megatron names).
	Args map[string]any
	// Resume is gotron's own metadata, stored under ResumeKey.
	Resume []byte
}

// chunkLayers returns pipeline rank p's chunks' layers [lo, hi):
// LayerRanges, or Megatron's even split in (v, p) order, checked to cover
// the model's layers in that order.
func (e *Export) chunkLayers(p int) ([][2]int, error) {
	if e.LayerRanges == nil {
		per := e.Model.NumLayers / (e.PP * e.VP)
		out := make([][2]int, e.VP)
		for v := range e.VP {
			lo := (v*e.PP + p) * per
			out[v] = [2]int{lo, lo + per}
		}
		return out, nil
	}
	r, err := e.LayerRanges(p)
	if err != nil {
		return nil, err
	}
	if len(r) != e.VP {
		return nil, fmt.Errorf("pipeline rank %d has %d chunks, want %d virtual stages", p, len(r), e.VP)
	}
	return r, nil
}

// checkLayerRanges checks that the chunks hold every layer once, in
// Megatron's order (virtual stage v·PP + p).
func (e *Export) checkLayerRanges() error {
	next := 0
	for v := range e.VP {
		for p := range e.PP {
			r, err := e.chunkLayers(p)
			if err != nil {
				return err
			}
			if r[v][0] != next || r[v][1] < r[v][0] {
				return fmt.Errorf("pipeline rank %d chunk %d holds layers [%d, %d), want them to start at %d", p, v, r[v][0], r[v][1], next)
			}
			next = r[v][1]
		}
	}
	if next != e.Model.NumLayers {
		return fmt.Errorf("the pipeline chunks hold %d layers, the model %d", next, e.Model.NumLayers)
	}
	return nil
}

// Save writes e under dir as Megatron's save_checkpoint does for the torch
// format: dir/iter_NNNNNNN/mp_rank_TT[_PPP]/model_optim_rng.pt per rank,
// then the tracker. A crash leaves the previous tracker in place.
func Save(dir string, e Export) error {
	e.TP, e.PP, e.VP = max(e.TP, 1), max(e.PP, 1), max(e.VP, 1)
	cfg := e.Model
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("megatron: save: %w", err)
	}
	if err := e.check(cfg); err != nil {
		return fmt.Errorf("megatron: save %s: %w", dir, err)
	}
	e.Model = cfg
	iterDir := filepath.Join(dir, fmt.Sprintf("iter_%07d", e.Iteration))
	if err := os.MkdirAll(iterDir, 0o755); err != nil {
		return fmt.Errorf("megatron: save: %w", err)
	}
	whole := map[string][]float32{}
	for _, p := range gptParams(cfg) {
		v, err := e.Param(p.name, p.shape)
		if err != nil {
			return fmt.Errorf("megatron: save %s: %s: %w", dir, p.name, err)
		}
		if len(v) != numel(p.shape) {
			return fmt.Errorf("megatron: save %s: %s has %d values, its shape %v holds %d", dir, p.name, len(v), p.shape, numel(p.shape))
		}
		whole[p.name] = v
	}
	for t := range e.TP {
		for p := range e.PP {
			sd, err := e.rankState(whole, t, p)
			if err != nil {
				return fmt.Errorf("megatron: save %s: %w", dir, err)
			}
			rd := filepath.Join(iterDir, rankDir(t, p, e.PP))
			if err := os.MkdirAll(rd, 0o755); err != nil {
				return fmt.Errorf("megatron: save: %w", err)
			}
			if err := torchpt.Save(filepath.Join(rd, FileName), sd); err != nil {
				return fmt.Errorf("megatron: %w", err)
			}
		}
	}
	tmp := filepath.Join(dir, "."+TrackerFile+".tmp")
	if err := os.WriteFile(tmp, []byte(strconv.FormatInt(e.Iteration, 10)), 0o644); err != nil {
		return fmt.Errorf("megatron: save: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, TrackerFile)); err != nil {
		return fmt.Errorf("megatron: save: %w", err)
	}
	return nil
}

// check refuses what the legacy layout (or its importer) cannot hold.
func (e *Export) check(cfg gpt.Config) error {
	switch {
	case cfg.MoE.NumExperts > 0:
		return errors.New("mixture-of-experts models are not written in the torch format yet (use --ckpt-format gotron-checkpoint)")
	case cfg.LayerNorm1P:
		return errors.New("--apply-layernorm-1p models are not written in the torch format yet (use --ckpt-format gotron-checkpoint)")
	case cfg.QKLayerNorm && !cfg.MLA.Enabled:
		return errors.New("--qk-layernorm models are not written in the torch format yet (use --ckpt-format gotron-checkpoint)")
	case cfg.MLA.Enabled && (cfg.DSA.Enabled || cfg.MLA.BetaFast != 32 || cfg.MLA.BetaSlow != 1):
		return errors.New("--multi-latent-attention models with DeepSeek sparse attention or YaRN betas other than Megatron's 32 and 1 are not written in the torch format yet (use --ckpt-format gotron-checkpoint)")
	case cfg.MuP.Enabled:
		return errors.New("--use-mup models are not written in the torch format yet: its args would not record muP (use --ckpt-format gotron-checkpoint)")
	case cfg.GDN.Enabled || cfg.AttentionOutputGate:
		return errors.New("gated delta net (--experimental-attention-variant) and --attention-output-gate models are not written in the torch format yet (use --ckpt-format gotron-checkpoint)")
	case cfg.MLA.Enabled && (cfg.MLA.QLoraRank%e.TP != 0 || (cfg.MLA.KVLoraRank+cfg.MLA.QKPosEmbHeadDim)%e.TP != 0):
		return fmt.Errorf("--q-lora-rank %d and --kv-lora-rank + --qk-pos-emb-head-dim (%d) must be multiples of the tensor-parallel size %d: Megatron's local spec splits the MLA down-projections' rows", cfg.MLA.QLoraRank, cfg.MLA.KVLoraRank+cfg.MLA.QKPosEmbHeadDim, e.TP)
	case e.LayerRanges == nil && cfg.NumLayers%(e.PP*e.VP) != 0:
		return fmt.Errorf("--num-layers %d is not a multiple of pipeline × virtual stages (%d×%d): Megatron's legacy layout splits layers evenly", cfg.NumLayers, e.PP, e.VP)
	case cfg.VocabSize%e.TP != 0:
		return fmt.Errorf("the padded vocabulary (%d) is not a multiple of the tensor-parallel size %d", cfg.VocabSize, e.TP)
	case cfg.NumQueryGroups%e.TP != 0 || cfg.NumAttentionHeads%e.TP != 0:
		return fmt.Errorf("%d attention heads and %d query groups do not split over %d tensor-parallel ranks", cfg.NumAttentionHeads, cfg.NumQueryGroups, e.TP)
	case cfg.FFNHiddenSize%e.TP != 0:
		return fmt.Errorf("--ffn-hidden-size %d is not a multiple of the tensor-parallel size %d", cfg.FFNHiddenSize, e.TP)
	}
	return e.checkLayerRanges()
}

type paramSpec struct {
	name  string
	shape []int
	how   merge
}

func numel(shape []int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return n
}

// layerParams is one layer's parameters (Megatron core's local spec, in
// its named_parameters order), with gotron's shapes and Megatron's split.
func layerParams(cfg gpt.Config, i int) []paramSpec {
	h, kv := cfg.HiddenSize, cfg.KVChannels
	qkv := (cfg.NumAttentionHeads + 2*cfg.NumQueryGroups) * kv
	ffn := cfg.FFNHiddenSize
	fc1 := ffn
	fc1how := rows
	if cfg.Activation == gpt.SwiGLU {
		fc1, fc1how = 2*ffn, glu
	}
	bias := !cfg.DisableBiasLinear
	ln := cfg.Normalization == gpt.LayerNorm
	pre := fmt.Sprintf("decoder.layers.%d.", i)
	var out []paramSpec
	add := func(ok bool, name string, shape []int, how merge) {
		if ok {
			out = append(out, paramSpec{pre + name, shape, how})
		}
	}
	add(true, "input_layernorm.weight", []int{h}, replicated)
	add(ln, "input_layernorm.bias", []int{h}, replicated)
	proj := cfg.NumAttentionHeads * kv
	if cfg.MLA.Enabled {
		proj = cfg.NumAttentionHeads * cfg.MLA.VHeadDim
	}
	add(true, "self_attention.linear_proj.weight", []int{h, proj}, cols)
	add(bias, "self_attention.linear_proj.bias", []int{h}, replicated)
	if m := cfg.MLA; m.Enabled { // MLASelfAttention's parameters in its order, the local spec's splits (every projection ColumnParallelLinear but linear_proj)
		a := cfg.NumAttentionHeads
		add(m.QLoraRank == 0, "self_attention.linear_q_proj.weight", []int{a * m.QHeadDim(), h}, rows)
		add(m.QLoraRank > 0, "self_attention.linear_q_down_proj.weight", []int{m.QLoraRank, h}, rows)
		add(m.QLoraRank > 0, "self_attention.linear_q_up_proj.weight", []int{a * m.QHeadDim(), m.QLoraRank}, rows)
		add(true, "self_attention.linear_kv_down_proj.weight", []int{m.KVLoraRank + m.QKPosEmbHeadDim, h}, rows)
		add(true, "self_attention.linear_kv_up_proj.weight", []int{a * (m.QKHeadDim + m.VHeadDim), m.KVLoraRank}, rows)
		qk := cfg.QKLayerNorm // the latents' norms: Megatron builds them with --qk-layernorm only
		add(qk && m.QLoraRank > 0, "self_attention.q_layernorm.weight", []int{m.QLoraRank}, replicated)
		add(qk && m.QLoraRank > 0 && ln, "self_attention.q_layernorm.bias", []int{m.QLoraRank}, replicated)
		add(qk, "self_attention.kv_layernorm.weight", []int{m.KVLoraRank}, replicated)
		add(qk && ln, "self_attention.kv_layernorm.bias", []int{m.KVLoraRank}, replicated)
	} else {
		add(true, "self_attention.linear_qkv.weight", []int{qkv, h}, rows)
		add(bias || cfg.AddQKVBias, "self_attention.linear_qkv.bias", []int{qkv}, rows)
	}
	add(true, "pre_mlp_layernorm.weight", []int{h}, replicated)
	add(ln, "pre_mlp_layernorm.bias", []int{h}, replicated)
	add(true, "mlp.linear_fc1.weight", []int{fc1, h}, fc1how)
	add(bias, "mlp.linear_fc1.bias", []int{fc1}, fc1how)
	add(true, "mlp.linear_fc2.weight", []int{h, ffn}, cols)
	add(bias, "mlp.linear_fc2.bias", []int{h}, replicated)
	return out
}

// gptParams is every gotron parameter with its shape.
func gptParams(cfg gpt.Config) []paramSpec {
	h := cfg.HiddenSize
	out := []paramSpec{{"embedding.word_embeddings.weight", []int{cfg.VocabSize, h}, rows}}
	if cfg.PositionEmbeddingType == gpt.LearnedAbsolute {
		out = append(out, paramSpec{"embedding.position_embeddings.weight", []int{cfg.MaxPositionEmbeddings, h}, replicated})
	}
	for i := range cfg.NumLayers {
		out = append(out, layerParams(cfg, i)...)
	}
	out = append(out, paramSpec{"decoder.final_layernorm.weight", []int{h}, replicated})
	if cfg.Normalization == gpt.LayerNorm {
		out = append(out, paramSpec{"decoder.final_layernorm.bias", []int{h}, replicated})
	}
	if cfg.UntieEmbeddingsAndOutputWeights {
		out = append(out, paramSpec{"output_layer.weight", []int{cfg.VocabSize, h}, rows})
	}
	return out
}

// slice returns tensor-parallel rank t's part of a whole parameter, as
// Megatron splits it (the inverse of source.merge), and its shape.
func slice(x []float32, shape []int, how merge, t, tp int) ([]float32, []int64) {
	sh := make([]int64, len(shape))
	for i, d := range shape {
		sh[i] = int64(d)
	}
	inner := numel(shape[1:])
	switch how {
	case rows:
		n := shape[0] / tp
		sh[0] = int64(n)
		return x[t*n*inner : (t+1)*n*inner], sh
	case glu: // [gate; up] → [gate_t; up_t]
		half := shape[0] / 2
		n := half / tp
		sh[0] = int64(2 * n)
		out := make([]float32, 0, 2*n*inner)
		out = append(out, x[t*n*inner:(t+1)*n*inner]...)
		return append(out, x[(half+t*n)*inner:(half+(t+1)*n)*inner]...), sh
	case cols:
		w := shape[1] / tp
		sh[1] = int64(w)
		out := make([]float32, 0, shape[0]*w)
		for r := range shape[0] {
			out = append(out, x[r*shape[1]+t*w:r*shape[1]+(t+1)*w]...)
		}
		return out, sh
	}
	return x, sh
}

// rankParam is one parameter in a rank file: its key in its chunk's state
// dict, the gotron parameter it is a part of, and its optimizer group.
type rankParam struct {
	chunk     int
	key, name string
	spec      paramSpec
}

// rankParams lists pipeline rank p's parameters chunk by chunk (the layer
// ranges were checked by check).
func (e *Export) rankParams(p int) [][]rankParam {
	cfg := e.Model
	byName := map[string]paramSpec{}
	for _, s := range gptParams(cfg) {
		byName[s.name] = s
	}
	ranges, _ := e.chunkLayers(p)
	out := make([][]rankParam, e.VP)
	for v := range e.VP {
		first, n := ranges[v][0], ranges[v][1]-ranges[v][0]
		firstStage, lastStage := v == 0 && p == 0, v == e.VP-1 && p == e.PP-1
		add := func(key, name string) {
			out[v] = append(out[v], rankParam{chunk: v, key: key, name: name, spec: byName[name]})
		}
		if firstStage {
			add("embedding.word_embeddings.weight", "embedding.word_embeddings.weight")
			if cfg.PositionEmbeddingType == gpt.LearnedAbsolute {
				add("embedding.position_embeddings.weight", "embedding.position_embeddings.weight")
			}
		}
		for l := range n {
			for _, s := range layerParams(cfg, first+l) {
				local := fmt.Sprintf("decoder.layers.%d.%s", l, s.name[len(fmt.Sprintf("decoder.layers.%d.", first+l)):])
				add(local, s.name)
			}
		}
		if lastStage {
			add("decoder.final_layernorm.weight", "decoder.final_layernorm.weight")
			if cfg.Normalization == gpt.LayerNorm {
				add("decoder.final_layernorm.bias", "decoder.final_layernorm.bias")
			}
			switch {
			case cfg.UntieEmbeddingsAndOutputWeights:
				add("output_layer.weight", "output_layer.weight")
			case !firstStage:
				// Megatron's last stage keeps a copy of the tied embeddings.
				add("output_layer.weight", "embedding.word_embeddings.weight")
			}
		}
	}
	return out
}

// rankState is rank (t, p)'s state dict.
func (e *Export) rankState(whole map[string][]float32, t, p int) (*torchpt.Dict, error) {
	sd := torchpt.NewDict()
	set := func(k string, v any) { _ = sd.Set(k, v) } // string keys: cannot fail
	args, err := e.args()
	if err != nil {
		return nil, err
	}
	set("args", args)
	set("checkpoint_version", 3.0)
	set("iteration", e.Iteration)
	chunks := e.rankParams(p)
	for v, ps := range chunks {
		md := torchpt.NewDict()
		for i := range ps {
			rp := &ps[i]
			x, sh := slice(whole[rp.name], rp.spec.shape, rp.spec.how, t, e.TP)
			tt, err := torchpt.NewTensor(sh, x)
			if err != nil {
				return nil, err
			}
			_ = md.Set(rp.key, tt)
		}
		key := "model"
		if e.VP > 1 {
			key = "model" + strconv.Itoa(v)
		}
		set(key, md)
	}
	if o := e.Optimizer; o != nil {
		opt, err := e.optimizerSection(whole, chunks, t)
		if err != nil {
			return nil, err
		}
		set("optimizer", opt)
		set("opt_param_scheduler", schedulerDict(o.Scheduler))
	}
	if e.Optimizer != nil {
		set("num_floating_point_operations_so_far", e.Optimizer.FLOPs)
	}
	if e.Resume != nil {
		set(ResumeKey, string(e.Resume))
	}
	return sd, nil
}

func schedulerDict(s optim.SchedulerState) *torchpt.Dict {
	d := torchpt.NewDict()
	for _, kv := range []struct {
		k string
		v any
	}{{"max_lr", s.MaxLR}, {"lr_warmup_steps", s.LRWarmupSteps}, {"num_steps", s.NumSteps}, {"lr_decay_style", string(s.LRDecayStyle)},
		{"lr_decay_steps", s.LRDecaySteps}, {"min_lr", s.MinLR}, {"start_wd", s.StartWD}, {"end_wd", s.EndWD},
		{"wd_incr_style", string(s.WDIncrStyle)}, {"wd_incr_steps", s.WDIncrSteps}} {
		_ = d.Set(kv.k, kv.v)
	}
	return d
}

// optimizerSection is FP32Optimizer's state dict, torch's own: state by
// index and param groups, the indices numbered group by group over the
// rank's parameters in named_parameters() order (Megatron's
// _get_param_groups: no weight decay for biases and 1-D parameters, the
// embedding and output layer apart with --decoupled-lr).
func (e *Export) optimizerSection(whole map[string][]float32, chunks [][]rankParam, t int) (*torchpt.Dict, error) {
	o := e.Optimizer
	var kinds []string
	switch o.Kind {
	case "adamw":
		kinds = []string{"exp_avg", "exp_avg_sq"}
	case "sgd":
		if len(o.Buffers) > 0 {
			kinds = []string{"momentum_buffer"}
		}
	default:
		return nil, fmt.Errorf("optimizer %q has no Megatron counterpart", o.Kind)
	}
	decoupled := e.DecoupledLR != 0
	type sig struct{ noWD, dec bool }
	groups := map[sig][]rankParam{}
	order := []sig{{false, false}, {true, false}, {false, true}, {true, true}}
	for _, ps := range chunks {
		for _, rp := range ps {
			s := sig{noWD: len(rp.spec.shape) == 1 || filepath.Ext(rp.key) == ".bias",
				dec: decoupled && (rp.key == "embedding.word_embeddings.weight" || rp.key == "output_layer.weight")}
			groups[s] = append(groups[s], rp)
		}
	}
	state := torchpt.NewDict()
	pgs := &torchpt.List{}
	idx := int64(0)
	for _, s := range order {
		members := groups[s]
		if len(members) == 0 {
			continue
		}
		params := &torchpt.List{}
		for _, rp := range members {
			ps := torchpt.NewDict()
			for _, k := range kinds {
				buf, ok := o.Buffers[k+"/"+rp.name]
				if !ok || len(buf) != numel(rp.spec.shape) {
					return nil, fmt.Errorf("optimizer state %s/%s is missing or of the wrong size", k, rp.name)
				}
				x, sh := slice(buf, rp.spec.shape, rp.spec.how, t, e.TP)
				tt, err := torchpt.NewTensor(sh, x)
				if err != nil {
					return nil, err
				}
				_ = ps.Set(k, tt)
			}
			_ = state.Set(idx, ps)
			params.Items = append(params.Items, idx)
			idx++
		}
		g := torchpt.NewDict()
		lr := e.LR
		if s.dec {
			lr = e.DecoupledLR
		}
		wd, wdMult := e.WeightDecay, 1.0
		if s.noWD {
			wd, wdMult = 0, 0
		}
		for _, kv := range []struct {
			k string
			v any
		}{{"wd_mult", wdMult}, {"lr_mult", 1.0}, {"is_expert_parallel", false}, {"is_decoupled_lr", s.dec},
			{"lr", lr}, {"weight_decay", wd}, {"params", params}} {
			_ = g.Set(kv.k, kv.v)
		}
		if o.Kind == "adamw" {
			_ = g.Set("betas", torchpt.Tuple{e.Beta1, e.Beta2})
			_ = g.Set("eps", e.Eps)
			_ = g.Set("amsgrad", false)
			_ = g.Set("step", o.Steps)
		}
		pgs.Items = append(pgs.Items, g)
	}
	d := torchpt.NewDict()
	_ = d.Set("state", state)
	_ = d.Set("param_groups", pgs)
	return d, nil
}

// args is the argparse.Namespace: the model's flags under Megatron's
// names (what the importer, and Megatron's check_checkpoint_args, read),
// the layout, the sample counters, then e.Args.
func (e *Export) args() (*torchpt.Object, error) {
	cfg := e.Model
	ns := torchpt.NewDict()
	vp := any(nil)
	if e.VP > 1 {
		vp = int64(e.VP)
	}
	kind := "adam"
	if e.Optimizer != nil && e.Optimizer.Kind == "sgd" {
		kind = "sgd"
	}
	kv := []struct {
		k string
		v any
	}{
		{"num_layers", int64(cfg.NumLayers)}, {"hidden_size", int64(cfg.HiddenSize)}, {"ffn_hidden_size", int64(cfg.FFNHiddenSize)},
		{"num_attention_heads", int64(cfg.NumAttentionHeads)}, {"kv_channels", int64(cfg.KVChannels)},
		{"group_query_attention", cfg.NumQueryGroups != cfg.NumAttentionHeads}, {"num_query_groups", int64(cfg.NumQueryGroups)},
		{"padded_vocab_size", int64(cfg.VocabSize)}, {"max_position_embeddings", int64(cfg.MaxPositionEmbeddings)},
		{"seq_length", int64(e.SeqLength)}, {"position_embedding_type", cfg.PositionEmbeddingType.String()},
		{"rotary_base", cfg.RotaryBase}, {"rotary_percent", cfg.RotaryPercent}, {"rotary_interleaved", cfg.RotaryInterleaved},
		{"normalization", cfg.Normalization.String()}, {"norm_epsilon", float64(cfg.NormEpsilon)}, {"apply_layernorm_1p", false},
		{"swiglu", cfg.Activation == gpt.SwiGLU}, {"openai_gelu", cfg.Activation == gpt.GELUTanh}, {"squared_relu", cfg.Activation == gpt.SquaredReLU},
		{"add_bias_linear", !cfg.DisableBiasLinear}, {"add_qkv_bias", cfg.AddQKVBias},
		{"untie_embeddings_and_output_weights", cfg.UntieEmbeddingsAndOutputWeights}, {"init_method_std", float64(cfg.InitMethodStd)},
		{"hidden_dropout", float64(cfg.HiddenDropout)}, {"attention_dropout", float64(cfg.AttentionDropout)},
		{"tensor_model_parallel_size", int64(e.TP)}, {"pipeline_model_parallel_size", int64(e.PP)},
		{"virtual_pipeline_model_parallel_size", vp}, {"use_mcore_models", true}, {"transformer_impl", "local"},
		{"optimizer", kind}, {"use_distributed_optimizer", false}, {"decoupled_weight_decay", true},
		{"ckpt_format", "torch"}, {"iteration", e.Iteration},
	}
	if m := cfg.MLA; m.Enabled {
		qLora := any(nil) // Megatron's None: one plain query projection
		if m.QLoraRank > 0 {
			qLora = int64(m.QLoraRank)
		}
		kv = append(kv, []struct {
			k string
			v any
		}{{"multi_latent_attention", true}, {"qk_layernorm", cfg.QKLayerNorm}, {"q_lora_rank", qLora}, {"kv_lora_rank", int64(m.KVLoraRank)},
			{"qk_head_dim", int64(m.QKHeadDim)}, {"qk_pos_emb_head_dim", int64(m.QKPosEmbHeadDim)}, {"v_head_dim", int64(m.VHeadDim)},
			{"rope_type", m.Rope.String()}, {"rotary_scaling_factor", m.ScalingFactor}, {"mscale", m.Mscale},
			{"mscale_all_dim", m.MscaleAllDim}, {"original_max_position_embeddings", int64(m.OriginalMaxPositions)}}...)
	}
	for _, x := range kv {
		_ = ns.Set(x.k, x.v)
	}
	if o := e.Optimizer; o != nil {
		_ = ns.Set("consumed_train_samples", o.ConsumedTrainSamples)
		_ = ns.Set("skipped_train_samples", o.SkippedTrainSamples)
		_ = ns.Set("consumed_valid_samples", o.ConsumedValidSamples)
		_ = ns.Set("seed", o.Seed)
	}
	keys := make([]string, 0, len(e.Args))
	for k := range e.Args {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if _, taken := ns.Get(k); taken {
			continue
		}
		if err := ns.Set(k, e.Args[k]); err != nil {
			return nil, err
		}
	}
	return &torchpt.Object{Class: &torchpt.Global{Module: "argparse", Name: "Namespace"}, Args: torchpt.Tuple{}, State: ns}, nil
}

// Resume returns the gotron metadata a checkpoint written by Save carries
// (ResumeKey in the first rank's file), or nil when it has none (a
// checkpoint Megatron wrote).
func (c *Checkpoint) Resume() ([]byte, error) {
	f := c.files[0][0]
	sd, err := stateDict(f)
	if err != nil {
		return nil, err
	}
	v, ok := sd.Get(ResumeKey)
	if !ok || v == nil {
		return nil, nil
	}
	s, ok := v.(string)
	if !ok {
		return nil, fmt.Errorf("%s: %s is a %T, not a string", f.Path, ResumeKey, v)
	}
	return []byte(s), nil
}
