package megatron

import (
	"fmt"
	"math"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/gotron/gotron/ckpt/torchpt"
	"github.com/gotron/gotron/internal/meminfo"
	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/tensor"
)

// Info describes an import: where the weights came from and what was not
// converted.
type Info struct {
	Dir            string // the iteration directory read
	Iteration      int64
	Release        bool
	TP, PP, VP     int
	DType          string // element type of the word embeddings as stored (F32, BF16, F16)
	SeqLength      int    // args.seq_length (bounded by max_position_embeddings)
	Optimizer      bool   // the files hold optimizer state (not converted)
	TokenizerType  string // args.tokenizer_type and its files, as recorded (paths of the training machine)
	VocabFile      string
	MergeFile      string
	TokenizerModel string
	// Warnings are facts the caller should print: settings not imported
	// (dropout), tied copies that disagree.
	Warnings []string
}

// Options configures Load.
type Options struct {
	// machine reports the machine's memory (tests replace it); nil means
	// meminfo.Read.
	machine func() (meminfo.Info, bool)
}

// Load opens the Megatron checkpoint under dir (see Open) and converts it
// into a gotron model: the configuration from args, the weights merged
// over tensor- and pipeline-parallel ranks and virtual stages.
func Load(dir string, opts Options) (*gpt.Model, Info, error) {
	c, err := Open(dir)
	if err != nil {
		return nil, Info{}, err
	}
	defer c.Close()
	return c.Model(opts)
}

// merge says how the tensor-parallel slices of a parameter form it.
type merge int

const (
	replicated merge = iota // every rank holds all of it: take rank 0's
	rows                    // column-parallel: concatenate along dim 0
	cols                    // row-parallel weight: concatenate along dim 1
	glu                     // SwiGLU fc1: each rank's [gate_r; up_r] → [gate; up]
)

// source is one gotron parameter: its slices, one per TP rank, and how
// they merge.
type source struct {
	name   string // gotron's (Megatron's global) name
	from   string // the key in the files, for messages
	file   string // rank 0's file, for messages
	slices []*torchpt.Tensor
	how    merge
	addOne bool // zero-centred gamma norm weight: store 1 + w
	// chunk and key locate the parameter in the files: the index of its
	// chunk in chunks() and its key in the chunk's state dict.
	chunk int
	key   string
}

// chunk is one model chunk: the state dicts of a (pipeline rank, virtual
// stage) on every tensor-parallel rank.
type chunk struct {
	key   string // "model" or "model<v>"
	files []*torchpt.File
	dicts []*torchpt.Dict
	// experts are the expert-parallel ranks' files and dicts, [ep][tp],
	// when EP > 1 (ep 0 is files, dicts).
	expertFiles [][]*torchpt.File
	expertDicts [][]*torchpt.Dict
}

var layerRE = regexp.MustCompile(`^decoder\.layers\.(\d+)\.(.+)$`)

// layerNames maps a layer's Megatron-core parameter names (local spec and
// TransformerEngine's fused norms) to gotron's and the merge.
var layerNames = map[string]struct {
	name string
	how  merge
}{
	"input_layernorm.weight":                      {"input_layernorm.weight", replicated},
	"input_layernorm.bias":                        {"input_layernorm.bias", replicated},
	"self_attention.linear_qkv.layer_norm_weight": {"input_layernorm.weight", replicated},
	"self_attention.linear_qkv.layer_norm_bias":   {"input_layernorm.bias", replicated},
	"self_attention.linear_qkv.weight":            {"self_attention.linear_qkv.weight", rows},
	"self_attention.linear_qkv.bias":              {"self_attention.linear_qkv.bias", rows},
	"self_attention.linear_proj.weight":           {"self_attention.linear_proj.weight", cols},
	"self_attention.linear_proj.bias":             {"self_attention.linear_proj.bias", replicated},
	"pre_mlp_layernorm.weight":                    {"pre_mlp_layernorm.weight", replicated},
	"pre_mlp_layernorm.bias":                      {"pre_mlp_layernorm.bias", replicated},
	"mlp.linear_fc1.layer_norm_weight":            {"pre_mlp_layernorm.weight", replicated},
	"mlp.linear_fc1.layer_norm_bias":              {"pre_mlp_layernorm.bias", replicated},
	"mlp.linear_fc1.weight":                       {"mlp.linear_fc1.weight", rows}, // glu with SwiGLU
	"mlp.linear_fc1.bias":                         {"mlp.linear_fc1.bias", rows},
	"mlp.linear_fc2.weight":                       {"mlp.linear_fc2.weight", cols},
	"mlp.linear_fc2.bias":                         {"mlp.linear_fc2.bias", replicated},
	// multi-latent attention (MLASelfAttention): the up-projections are
	// column-parallel, each rank's rows whole heads ([nope; rope] queries,
	// [nope; v] key-values); the down-projections are replicated with
	// TransformerEngine (TELinear, parallel_mode "duplicated") and
	// column-parallel with the local spec (plan decides by their shape);
	// q_layernorm and kv_layernorm are fused into the up-projections with
	// --qk-layernorm under TransformerEngine.
	"self_attention.linear_q_proj.weight":                {"self_attention.linear_q_proj.weight", rows},
	"self_attention.linear_q_down_proj.weight":           {"self_attention.linear_q_down_proj.weight", replicated},
	"self_attention.linear_q_up_proj.weight":             {"self_attention.linear_q_up_proj.weight", rows},
	"self_attention.linear_q_up_proj.layer_norm_weight":  {"self_attention.q_layernorm.weight", replicated},
	"self_attention.linear_q_up_proj.layer_norm_bias":    {"self_attention.q_layernorm.bias", replicated},
	"self_attention.q_layernorm.weight":                  {"self_attention.q_layernorm.weight", replicated},
	"self_attention.q_layernorm.bias":                    {"self_attention.q_layernorm.bias", replicated},
	"self_attention.linear_kv_down_proj.weight":          {"self_attention.linear_kv_down_proj.weight", replicated},
	"self_attention.linear_kv_up_proj.weight":            {"self_attention.linear_kv_up_proj.weight", rows},
	"self_attention.linear_kv_up_proj.layer_norm_weight": {"self_attention.kv_layernorm.weight", replicated},
	"self_attention.linear_kv_up_proj.layer_norm_bias":   {"self_attention.kv_layernorm.bias", replicated},
	"self_attention.kv_layernorm.weight":                 {"self_attention.kv_layernorm.weight", replicated},
	"self_attention.kv_layernorm.bias":                   {"self_attention.kv_layernorm.bias", replicated},
}

// downProjRows is the full row count of an MLA down-projection (0 for any
// other parameter): a tensor-parallel slice of 1/TP of it is the local
// spec's column-parallel split, a whole one TransformerEngine's replica.
func downProjRows(cfg gpt.Config, name string) int {
	switch {
	case !cfg.MLA.Enabled:
		return 0
	case name == "self_attention.linear_q_down_proj.weight":
		return cfg.MLA.QLoraRank
	case name == "self_attention.linear_kv_down_proj.weight":
		return cfg.MLA.KVLoraRank + cfg.MLA.QKPosEmbHeadDim
	}
	return 0
}

// Model converts the checkpoint. Every name and shape is checked against
// the configuration the args describe before the model is allocated.
func (c *Checkpoint) Model(opts Options) (*gpt.Model, Info, error) {
	m, info, _, err := c.model(opts, 1)
	return m, info, err
}

// converted is what model leaves for the optimizer import: the plan the
// weights were merged by and the tied output layer's copy.
type converted struct {
	plan []*source
	tied *source
}

// model converts the weights; copies is how many float32 copies of the
// model the whole import holds (the memory check).
func (c *Checkpoint) model(opts Options, copies int) (*gpt.Model, Info, converted, error) {
	cfg, dv, err := c.args.config()
	if err != nil {
		return nil, Info{}, converted{}, fmt.Errorf("megatron: %w", err)
	}
	info := Info{Dir: c.Dir, Iteration: c.Iteration, Release: c.Release, TP: c.TP, PP: c.PP, VP: c.VP,
		SeqLength: dv.SeqLength, Optimizer: c.Optimizer, TokenizerType: dv.TokenizerType, VocabFile: dv.VocabFile,
		MergeFile: dv.MergeFile, TokenizerModel: dv.TokenizerModel}
	if dv.HiddenDropout != 0 || dv.AttentionDropout != 0 {
		info.Warnings = append(info.Warnings, fmt.Sprintf("dropout not imported (args: hidden_dropout=%g, attention_dropout=%g); set --hidden-dropout/--attention-dropout when training", dv.HiddenDropout, dv.AttentionDropout))
	}
	if g := cfg.NumQueryGroups; g%c.TP != 0 {
		return nil, Info{}, converted{}, fmt.Errorf("megatron: %s: %d query groups over tensor_model_parallel_size=%d: groups split across ranks are not supported", c.files[0][0].Path, g, c.TP)
	}
	plan, tiedCopy, err := c.plan(cfg, dv)
	if err != nil {
		return nil, Info{}, converted{}, fmt.Errorf("megatron: %w", err)
	}
	if err := checkMemory(c.Dir, cfg, plan, copies, opts.machine); err != nil {
		return nil, Info{}, converted{}, err
	}
	m, err := gpt.New(cfg, tensor.NewRNG(0))
	if err != nil {
		return nil, Info{}, converted{}, fmt.Errorf("megatron: %s: %w", c.Dir, err)
	}
	params := map[string]*tensor.Tensor{}
	for _, p := range m.Params() {
		params[p.Name] = p
	}
	if err := checkPlan(plan, params, cfg, c.files[0][0].Path); err != nil {
		return nil, Info{}, converted{}, fmt.Errorf("megatron: %w", err)
	}
	for _, s := range plan {
		if err := s.fill(params[s.name]); err != nil {
			return nil, Info{}, converted{}, fmt.Errorf("megatron: %w", err)
		}
		if s.name == "embedding.word_embeddings.weight" {
			info.DType = s.slices[0].DType().String()
		}
	}
	if tiedCopy != nil { // tied weights: the last stage's copy should equal the embeddings
		diff, err := maxDiff(tiedCopy, m.WordEmb.Float32s())
		if err != nil {
			return nil, Info{}, converted{}, fmt.Errorf("megatron: %w", err)
		}
		if diff != 0 {
			info.Warnings = append(info.Warnings, fmt.Sprintf("tied embeddings: the last pipeline stage's output_layer.weight differs from the word embeddings by up to %g; using the word embeddings", diff))
		}
	}
	return m, info, converted{plan: plan, tied: tiedCopy}, nil
}

// chunks lists the model chunks in layer order: virtual stage by virtual
// stage, pipeline rank by pipeline rank (Megatron's layer offsets), each
// with its TP ranks' state dicts.
func (c *Checkpoint) chunks() ([]chunk, error) {
	var out []chunk
	for v := range c.VP {
		for p := range c.PP {
			key := "model"
			if c.VP > 1 {
				key = "model" + strconv.Itoa(v)
			}
			ch := chunk{key: key}
			modelDict := func(f *torchpt.File) (*torchpt.Dict, error) {
				sd, _ := stateDict(f)
				x, ok := sd.Get(key)
				if !ok && c.VP == 1 {
					if x, ok = sd.Get("model0"); ok {
						ch.key = "model0"
					}
				}
				if !ok {
					return nil, fmt.Errorf("%s has no %s state dict (keys %s)", f.Path, key, strings.Join(sd.StringKeys(), ", "))
				}
				d, ok := x.(*torchpt.Dict)
				if !ok {
					return nil, fmt.Errorf("%s: %s is a %T, not a state dict", f.Path, key, x)
				}
				return d, nil
			}
			for t := range c.TP {
				f := c.files[t][p]
				d, err := modelDict(f)
				if err != nil {
					return nil, err
				}
				ch.files = append(ch.files, f)
				ch.dicts = append(ch.dicts, d)
			}
			for e := range c.EP {
				if c.EP == 1 {
					break
				}
				var fs []*torchpt.File
				var ds []*torchpt.Dict
				for t := range c.TP {
					f := c.experts[t][p][e]
					d, err := modelDict(f)
					if err != nil {
						return nil, err
					}
					fs, ds = append(fs, f), append(ds, d)
				}
				ch.expertFiles, ch.expertDicts = append(ch.expertFiles, fs), append(ch.expertDicts, ds)
			}
			out = append(out, ch)
		}
	}
	return out, nil
}

// plan maps every tensor of every chunk to a gotron parameter. It returns
// the sources in model order and, for tied weights, the last stage's
// output_layer copy (merged, to compare with the embeddings) if present.
func (c *Checkpoint) plan(cfg gpt.Config, dv derived) ([]*source, *source, error) {
	chunks, err := c.chunks()
	if err != nil {
		return nil, nil, err
	}
	var plan []*source
	var tied *source
	seen := map[string]string{} // gotron name → where it came from
	layerBase := 0
	for ci, ch := range chunks {
		f0, d0 := ch.files[0], ch.dicts[0]
		// Every TP rank holds the same keys.
		var keys []string
		for i, k := range d0.Keys() {
			s, ok := k.(string)
			if !ok {
				return nil, nil, fmt.Errorf("%s: %s has a key of type %T", f0.Path, ch.key, k)
			}
			if isExtraState(s) {
				continue
			}
			if _, ok := d0.Values()[i].(*torchpt.Tensor); !ok {
				return nil, nil, fmt.Errorf("%s: %s[%q] is a %T, not a tensor", f0.Path, ch.key, s, d0.Values()[i])
			}
			keys = append(keys, s)
		}
		for t := 1; t < len(ch.dicts); t++ {
			n := 0
			for _, k := range ch.dicts[t].StringKeys() {
				if isExtraState(k) {
					continue
				}
				n++
				if _, ok := d0.Get(k); !ok {
					return nil, nil, fmt.Errorf("%s: %s has %s, which %s lacks", ch.files[t].Path, ch.key, k, f0.Path)
				}
			}
			if n != len(keys) {
				return nil, nil, fmt.Errorf("%s: %s holds %d tensors, %s holds %d", ch.files[t].Path, ch.key, n, f0.Path, len(keys))
			}
		}
		layers := 0
		for _, k := range keys {
			if m := layerRE.FindStringSubmatch(k); m != nil {
				n, err := strconv.Atoi(m[1])
				if err != nil || n > 1<<20 {
					return nil, nil, fmt.Errorf("%s: %s: bad layer number in %s", f0.Path, ch.key, k)
				}
				layers = max(layers, n+1)
			}
		}
		last := ci == len(chunks)-1
		for _, k := range keys {
			slices := make([]*torchpt.Tensor, len(ch.dicts))
			for t, d := range ch.dicts {
				v, _ := d.Get(k)
				tt, ok := v.(*torchpt.Tensor)
				if !ok {
					return nil, nil, fmt.Errorf("%s: %s[%q] is a %T, not a tensor", ch.files[t].Path, ch.key, k, v)
				}
				slices[t] = tt
			}
			s := &source{from: ch.key + "." + k, file: f0.Path, slices: slices, chunk: ci, key: k}
			if m := layerRE.FindStringSubmatch(k); m != nil && c.EP > 1 && expertKeyRE.MatchString(m[2]) {
				// one source per expert-parallel rank, named by global expert
				srcs, err := c.expertSources(ch, ci, k, layerBase, cfg)
				if err != nil {
					return nil, nil, err
				}
				for _, s := range srcs {
					if prev, dup := seen[s.name]; dup {
						return nil, nil, fmt.Errorf("%s: %s: %s gives %s, which %s already gave", s.file, ch.key, k, s.name, prev)
					}
					seen[s.name] = s.file + " " + s.from
					plan = append(plan, s)
				}
				continue
			}
			switch m := layerRE.FindStringSubmatch(k); {
			case m != nil:
				local, _ := strconv.Atoi(m[1])
				ln, ok := layerNames[m[2]]
				if name, how, moe := moeLayerName(m[2], cfg.Activation == gpt.SwiGLU); moe {
					ln.name, ln.how, ok = name, how, true
				}
				if !ok {
					return nil, nil, fmt.Errorf("%s: %s: parameter %s is not supported by gotron (%s)", f0.Path, ch.key, k, unsupportedHint(m[2]))
				}
				s.name, s.how = fmt.Sprintf("decoder.layers.%d.%s", layerBase+local, ln.name), ln.how
				if full := downProjRows(cfg, ln.name); c.TP > 1 && len(slices[0].Shape) == 2 && int(slices[0].Shape[0])*c.TP == full {
					s.how = rows
				}
				if ln.name == "mlp.linear_fc1.weight" || ln.name == "mlp.linear_fc1.bias" {
					if cfg.Activation == gpt.SwiGLU {
						s.how = glu
					}
				}
				s.addOne = dv.ZeroCenteredGamma && strings.HasSuffix(ln.name, "layernorm.weight")
			case k == "embedding.word_embeddings.weight":
				s.name, s.how = k, rows
			case k == "embedding.position_embeddings.weight":
				s.name, s.how = k, replicated
			case k == "decoder.final_layernorm.weight":
				s.name, s.how, s.addOne = k, replicated, dv.ZeroCenteredGamma
			case k == "decoder.final_layernorm.bias":
				s.name, s.how = k, replicated
			case k == "output_layer.weight":
				s.name, s.how = k, rows
				if !cfg.UntieEmbeddingsAndOutputWeights {
					if !last {
						return nil, nil, fmt.Errorf("%s: %s: output_layer.weight outside the last pipeline stage", f0.Path, ch.key)
					}
					tied = s // a synchronised copy of the embeddings (pipeline parallelism)
					continue
				}
			case strings.HasPrefix(k, "language_model.") || strings.HasPrefix(k, "module."):
				return nil, nil, fmt.Errorf("%s: %s: parameter %s: a checkpoint of Megatron's legacy (non-core) GPT model is not supported; re-save it with Megatron core models (--use-mcore-models) or convert it with Megatron's tools/checkpoint", f0.Path, ch.key, k)
			default:
				return nil, nil, fmt.Errorf("%s: %s: parameter %s is not supported by gotron (%s)", f0.Path, ch.key, k, unsupportedHint(k))
			}
			if prev, dup := seen[s.name]; dup {
				return nil, nil, fmt.Errorf("%s: %s: %s gives %s, which %s already gave", f0.Path, ch.key, k, s.name, prev)
			}
			seen[s.name] = f0.Path + " " + s.from
			plan = append(plan, s)
		}
		layerBase += layers
	}
	if layerBase != cfg.NumLayers {
		return nil, nil, fmt.Errorf("%s: args.num_layers=%d, but the rank files hold %d layers", c.files[0][0].Path, cfg.NumLayers, layerBase)
	}
	return plan, tied, nil
}

func isExtraState(k string) bool {
	return k == "_extra_state" || strings.HasSuffix(k, "._extra_state") || extraStateNRE.MatchString(k)
}

// extraStateNRE matches TEGroupedMLP's per-expert _extra_state{l}.
var extraStateNRE = regexp.MustCompile(`\._extra_state\d+$`)

// unsupportedHint names what an unknown parameter usually belongs to.
func unsupportedHint(k string) string {
	switch {
	case strings.Contains(k, "experts.weight1") || strings.Contains(k, "experts.weight2"):
		return "the GroupedMLP expert layout Megatron removed in core_v0.17: re-save with --moe-grouped-gemm (TEGroupedMLP) or without (SequentialMLP)"
	case strings.Contains(k, "expert_bias"):
		return "the router's expert bias is not imported yet"
	case strings.Contains(k, "experts") || strings.Contains(k, "router"):
		return "a mixture-of-experts parameter gotron does not have"
	case strings.Contains(k, "q_layernorm") || strings.Contains(k, "k_layernorm"):
		return "QK layer norm"
	case strings.Contains(k, "linear_qkv_down_proj"):
		return "FusedMLASelfAttention's fused query/key-value down-projection (--mla-down-proj-fusion) is not imported; re-save without it"
	case strings.Contains(k, "linear_q_") || strings.Contains(k, "linear_kv_"):
		return "multi-latent attention"
	case strings.HasPrefix(k, "mtp"):
		return "multi-token prediction"
	}
	return "not a parameter of gotron's GPT model"
}

// checkPlan compares the planned parameters with the model's: the same
// names, and slices that merge to each parameter's shape.
func checkPlan(plan []*source, params map[string]*tensor.Tensor, cfg gpt.Config, argsFile string) error {
	got := map[string]bool{}
	for _, s := range plan {
		p, ok := params[s.name]
		if !ok {
			return fmt.Errorf("%s: %s is not part of the model the args describe (%s)", s.file, s.from, describe(cfg))
		}
		got[s.name] = true
		if err := s.check(p.Shape()); err != nil {
			return err
		}
	}
	var missing []string
	for n := range params {
		if !got[n] {
			missing = append(missing, n)
		}
	}
	if len(missing) > 0 {
		sort.Strings(missing)
		n := len(missing)
		if n > 4 {
			missing = append(missing[:4], fmt.Sprintf("... (%d tensors)", n))
		}
		return fmt.Errorf("%s: the model its args describe (%s) needs %s, which no rank file holds", argsFile, describe(cfg), strings.Join(missing, ", "))
	}
	return nil
}

func describe(c gpt.Config) string {
	moe := "no experts"
	if m := c.MoE; m.Enabled() {
		moe = fmt.Sprintf("%d experts in %d of %d layers", m.NumExperts, m.NumMoELayers(c.NumLayers), c.NumLayers)
		if m.SharedExpertFFN > 0 {
			moe += ", a shared expert"
		}
	}
	if m := c.MLA; m.Enabled {
		moe += fmt.Sprintf(", multi-latent attention (q_lora_rank %d, kv_lora_rank %d)", m.QLoraRank, m.KVLoraRank)
	}
	return fmt.Sprintf("%s, %s, %s positions, biases %v, tied output %v, %s", c.Normalization, c.Activation, c.PositionEmbeddingType, !c.DisableBiasLinear, !c.UntieEmbeddingsAndOutputWeights, moe)
}

// check verifies that the slices merge into a tensor of shape want.
func (s *source) check(want []int) error {
	bad := func(why string) error {
		shapes := make([]string, len(s.slices))
		for i, t := range s.slices {
			shapes[i] = fmt.Sprint(t.Shape)
		}
		return fmt.Errorf("%s: %s: tensor-parallel slices %s do not form %s %v: %s", s.file, s.from, strings.Join(shapes, ", "), s.name, want, why)
	}
	sh := func(t *torchpt.Tensor) []int { return t.IntShape() }
	switch s.how {
	case replicated:
		for _, t := range s.slices {
			if !equalInts(sh(t), want) {
				return bad("each rank holds the whole tensor")
			}
		}
	case rows, glu:
		n := 0
		for _, t := range s.slices {
			x := sh(t)
			if len(x) != len(want) || len(x) == 0 || !equalInts(x[1:], want[1:]) {
				return bad("ranks split dim 0")
			}
			if s.how == glu && x[0]%2 != 0 {
				return bad("each rank's SwiGLU rows are [gate; up] halves")
			}
			n += x[0]
		}
		if n != want[0] {
			return bad("ranks split dim 0")
		}
	case cols:
		n := 0
		for _, t := range s.slices {
			x := sh(t)
			if len(x) != 2 || len(want) != 2 || x[0] != want[0] {
				return bad("ranks split dim 1")
			}
			n += x[1]
		}
		if n != want[1] {
			return bad("ranks split dim 1")
		}
	}
	return nil
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// read returns the merged tensor's values into dst (row-major, the shape
// check passed).
func (s *source) merge(dst []float32, shape []int) error {
	inner := 1
	for _, d := range shape[1:] {
		inner *= d
	}
	switch s.how {
	case replicated:
		x, err := s.slices[0].Float32s()
		if err != nil {
			return err
		}
		copy(dst, x)
	case rows:
		off := 0
		for _, t := range s.slices {
			x, err := t.Float32s()
			if err != nil {
				return err
			}
			off += copy(dst[off:], x)
		}
	case glu: // rank r holds [gate_r; up_r]: gates first, then ups
		half := 0
		for _, t := range s.slices {
			half += int(t.Shape[0]) / 2 * inner
		}
		g, u := 0, half
		for _, t := range s.slices {
			x, err := t.Float32s()
			if err != nil {
				return err
			}
			h := len(x) / 2
			g += copy(dst[g:], x[:h])
			u += copy(dst[u:], x[h:])
		}
	case cols:
		rowsN, off := shape[0], 0
		for _, t := range s.slices {
			x, err := t.Float32s()
			if err != nil {
				return err
			}
			w := int(t.Shape[1])
			for r := range rowsN {
				copy(dst[r*shape[1]+off:r*shape[1]+off+w], x[r*w:(r+1)*w])
			}
			off += w
		}
	}
	if s.addOne {
		for i := range dst {
			dst[i]++
		}
	}
	return nil
}

func (s *source) fill(p *tensor.Tensor) error {
	return s.merge(p.Float32s(), p.Shape())
}

// maxDiff merges s and returns its largest absolute difference from ref.
func maxDiff(s *source, ref []float32) (float64, error) {
	got := make([]float32, len(ref))
	shape := []int{0, 0}
	for _, t := range s.slices {
		if len(t.Shape) != 2 {
			return 0, fmt.Errorf("%s: %s has shape %v, want a matrix", s.file, s.from, t.Shape)
		}
		shape[0] += int(t.Shape[0])
		shape[1] = int(t.Shape[1])
	}
	if shape[0]*shape[1] != len(ref) {
		return 0, fmt.Errorf("%s: %s (tied output layer) is %v, the word embeddings hold %d values", s.file, s.from, shape, len(ref))
	}
	if err := s.merge(got, shape); err != nil {
		return 0, err
	}
	d := 0.0
	for i := range got {
		d = math.Max(d, math.Abs(float64(got[i])-float64(ref[i])))
	}
	return d, nil
}

// checkMemory refuses an import whose float32 model (copies of it: the
// optimizer state's buffers) plus the largest source tensor being converted
// does not fit in the memory available.
func checkMemory(dir string, cfg gpt.Config, plan []*source, copies int, machine func() (meminfo.Info, bool)) error {
	largest := 0.0
	for _, s := range plan {
		for _, t := range s.slices {
			largest = max(largest, float64(t.Numel()))
		}
	}
	what := "the float32 model the args describe"
	if copies > 1 {
		what += fmt.Sprintf(" and its optimizer state (%d float32 copies in all)", copies)
	}
	if err := meminfo.CheckFloat32Import(machine, float64(copies)*cfg.ParamCount(), largest, what); err != nil {
		return fmt.Errorf("megatron: %s: %w", dir, err)
	}
	return nil
}
