package hf

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"

	"github.com/gotron/gotron/ckpt/safetensors"
	"github.com/gotron/gotron/internal/checked"
	"github.com/gotron/gotron/internal/meminfo"
	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/tensor"
)

// Architectures: the name-map tables.
const (
	ArchGPT2  = "gpt2"  // GPT2LMHeadModel
	ArchLlama = "llama" // LlamaForCausalLM, MistralForCausalLM
	// ArchMixtral, ArchQwen2MoE and ArchQwen3MoE: moe.go.
)

// Files in a gotron checkpoint directory made by an import.
const (
	// InfoFile (in the checkpoint's --save directory) records the import:
	// architecture, dtype, unpadded vocabulary and the original config.json.
	InfoFile = "hf_import.json"
	// TokenizerDir (in the --save directory) holds the carried tokenizer files.
	TokenizerDir = "tokenizer"
)

// infoFormat and infoVersion tag InfoFile.
const (
	infoFormat  = "gotron-hf-import"
	infoVersion = 1
)

// TokenizerFileNames are the files carried along with a checkpoint, both
// ways, when present.
func TokenizerFileNames() []string {
	return []string{"tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "tokenizer.model",
		"special_tokens_map.json", "added_tokens.json", "generation_config.json"}
}

// Info describes a Hugging Face checkpoint beyond the gotron model config.
// The zero value means "unknown": Export then infers the architecture from
// the model, writes float32 and keeps the padded vocabulary.
type Info struct {
	// Arch is ArchGPT2, ArchLlama, ArchMixtral, ArchQwen2MoE, ArchQwen3MoE,
	// ArchDeepSeekV2, ArchDeepSeekV3 or ArchQwen3Next: which name map applies.
	Arch string `json:"arch"`
	// DType is the safetensors dtype of the weights ("F32", "BF16", "F16";
	// that of the word embeddings when files mix them).
	DType string `json:"dtype"`
	// VocabSize is config.json's vocab_size, before gotron's padding.
	VocabSize int `json:"vocab_size"`
	// Config is config.json as imported (kept verbatim for export).
	Config json.RawMessage `json:"config,omitempty"`
	// Warnings lists config settings gotron ignores (not saved).
	Warnings []string `json:"-"`
}

// ImportOptions configures Import. The zero value pads the vocabulary to a
// multiple of 128, like Megatron's default.
type ImportOptions struct {
	// MakeVocabSizeDivisibleBy is --make-vocab-size-divisible-by; 0 means 128.
	MakeVocabSizeDivisibleBy int
	// Part, when set, says the part of the model to import for the
	// config.json's model (gpt.NewPart: a decoding rank's pipeline
	// stage): only its tensors are built and decoded from the files.
	// With Part's TP (and Experts) each tensor is its rank's slice, as
	// gpt.Parallelize (and SliceExperts) cut it from the whole import, and
	// only the slice's elements are read from the files: a
	// tensor-parallel rank reads about 1/TP of the tensors it holds.
	Part func(gpt.Config) (gpt.Part, error)

	// machine reports the machine's memory (tests replace it); nil means
	// meminfo.Read.
	machine func() (meminfo.Info, bool)
	// bytesRead, when set, receives the number of bytes of tensor data
	// decoded from the files (tests).
	bytesRead *int64
}

// IsHFDir reports whether dir looks like a Hugging Face model directory:
// a config.json and no gotron/Megatron tracker file.
func IsHFDir(dir string) bool {
	if _, err := os.Stat(filepath.Join(dir, "config.json")); err != nil {
		return false
	}
	_, err := os.Stat(filepath.Join(dir, "latest_checkpointed_iteration.txt"))
	return errors.Is(err, fs.ErrNotExist)
}

// LoadModel is Import with default options: what train --load and generate
// --load call when IsHFDir(dir).
func LoadModel(dir string) (*gpt.Model, Info, error) {
	return Import(dir, ImportOptions{})
}

// Import reads a Hugging Face GPT-2, Llama/Mistral, Mixtral, Qwen2-MoE, Qwen3-MoE, DeepSeek-V2/V3 or Qwen3-Next checkpoint (config.json
// plus model.safetensors or a sharded index) into a float32 gotron model.
// Errors name the directory and the tensor or config key at fault.
func Import(dir string, opts ImportOptions) (*gpt.Model, Info, error) {
	div := opts.MakeVocabSizeDivisibleBy
	if div == 0 {
		div = 128
	}
	raw, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		return nil, Info{}, fmt.Errorf("hf: %w", err)
	}
	arch, cfg, vocab, warns, err := parseConfig(raw, div)
	if err != nil {
		return nil, Info{}, fmt.Errorf("hf: %s: %w", filepath.Join(dir, "config.json"), err)
	}
	if !hasSafetensors(dir) {
		return nil, Info{}, fmt.Errorf("hf: %s has no model.safetensors or model.safetensors.index.json (PyTorch .bin checkpoints are not supported: save with safe_serialization=True)", dir)
	}
	set, err := safetensors.OpenDir(dir)
	if err != nil {
		return nil, Info{}, fmt.Errorf("hf: %w", err)
	}
	defer set.Close()
	// Every name, shape and dtype is checked from the file headers before
	// the model is allocated: a config.json that disagrees with the weights
	// fails at once, not after allocating what it describes.
	plan, err := planImport(set, arch, cfg, vocab, dir)
	if err != nil {
		return nil, Info{}, err
	}
	var m *gpt.Model
	var part *gpt.Part
	if opts.Part == nil {
		if err := checkMemory(dir, cfg, plan, opts.machine); err != nil {
			return nil, Info{}, err
		}
		if m, err = gpt.New(cfg, tensor.NewRNG(0)); err != nil {
			return nil, Info{}, fmt.Errorf("hf: %s: %w", dir, err)
		}
	} else {
		p, err := opts.Part(cfg)
		if err != nil {
			return nil, Info{}, err
		}
		if err := checkPartMemory(dir, cfg, plan, p, opts.machine); err != nil {
			return nil, Info{}, err
		}
		part = &p
		if m, err = gpt.NewPart(cfg, tensor.NewRNG(0), p); err != nil {
			return nil, Info{}, fmt.Errorf("hf: %s: %w", dir, err)
		}
	}
	info := Info{Arch: arch, VocabSize: vocab, Config: json.RawMessage(raw), Warnings: warns}
	var read int64
	if err := fill(m, plan, dir, &info, part, &read); err != nil {
		return nil, Info{}, err
	}
	if opts.bytesRead != nil {
		*opts.bytesRead = read
	}
	return m, info, nil
}

// checkMemory refuses an import whose float32 model (plus the largest
// source tensor being converted) does not fit in the memory available
// (meminfo; no check where it is unknown).
func checkMemory(dir string, cfg gpt.Config, plan []planned, machine func() (meminfo.Info, bool)) error {
	largest := 0.0
	for _, p := range plan {
		for _, t := range p.src {
			largest = max(largest, float64(t.NumElements()))
		}
	}
	if err := meminfo.CheckFloat32Import(machine, cfg.ParamCount(), largest, "the float32 model of config.json"); err != nil {
		return fmt.Errorf("hf: %s: %w", dir, err)
	}
	return nil
}

func hasSafetensors(dir string) bool {
	for _, f := range []string{safetensors.SingleFile, "model.safetensors.index.json"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err == nil {
			return true
		}
	}
	return false
}

// planned is one table entry with its Hugging Face tensors (file views,
// not decoded yet).
type planned struct {
	entry
	names []string             // resolved HF names, in entry.HF's order
	src   []safetensors.Tensor // the tensors under those names
}

// planImport matches every table entry with the set's tensors and rejects
// missing, misshapen, unexpected and non-float tensors. It reads only the
// file headers.
func planImport(set *safetensors.Set, arch string, c gpt.Config, vocab int, dir string) ([]planned, error) {
	tab, err := table(arch, c, vocab)
	if err != nil {
		return nil, err
	}
	names := map[string]bool{}
	for _, n := range set.Names() {
		names[n] = true
	}
	// The original "gpt2" checkpoints were saved from GPT2Model: no
	// "transformer." prefix.
	resolve := func(n string) string { return n }
	if arch == ArchGPT2 && !names["transformer.wte.weight"] && names["wte.weight"] {
		resolve = func(n string) string { return strings.TrimPrefix(n, "transformer.") }
	}
	used := map[string]bool{}
	plan := make([]planned, 0, len(tab))
	for _, e := range tab {
		p := planned{entry: e}
		for _, ht := range e.HF {
			name := resolve(ht.Name)
			t, err := set.Tensor(name)
			if err != nil {
				return nil, fmt.Errorf("hf: %s: missing tensor %s (config.json says %s)", dir, name, describe(arch, c, vocab))
			}
			if !reflect.DeepEqual(t.Shape, ht.Shape) {
				return nil, fmt.Errorf("hf: %s: tensor %s has shape %v, config.json implies %v", dir, name, t.Shape, ht.Shape)
			}
			switch t.DType {
			case safetensors.F32, safetensors.BF16, safetensors.F16, safetensors.F64:
			default:
				return nil, fmt.Errorf("hf: %s: tensor %s has dtype %s: want F32, BF16, F16 or F64", dir, name, t.DType)
			}
			p.names = append(p.names, name)
			p.src = append(p.src, t)
			used[name] = true
		}
		plan = append(plan, p)
	}
	tied := !c.UntieEmbeddingsAndOutputWeights
	for _, n := range set.Names() {
		if !used[n] && !ignored(arch, n, tied) {
			return nil, fmt.Errorf("hf: %s: unexpected tensor %s (not part of a %s model with %s)", dir, n, arch, describe(arch, c, vocab))
		}
	}
	return plan, nil
}

// fill decodes every planned tensor into m's parameters: those of part
// (nil: the whole model), of each only its slice (part's TP and Experts).
// read counts the bytes decoded from the files.
func fill(m *gpt.Model, plan []planned, dir string, info *Info, part *gpt.Part, read *int64) error {
	c := m.Config
	params := paramsByName(m)
	dm := dimsOf(c)
	for _, e := range plan {
		if part != nil && params[e.Gotron] == nil {
			continue // another rank's (ImportOptions.Part)
		}
		if e.Gotron == "embedding.word_embeddings.weight" {
			info.DType = e.src[0].DType.String()
		}
		if part != nil {
			ps, err := slicesOf(*part, &c, params, e.entry)
			if err != nil {
				return fmt.Errorf("hf: internal: %w", err)
			}
			if ps != nil {
				if err := fillSlices(dm, e, ps, dir, read); err != nil {
					return err
				}
				continue
			}
		}
		p, scatter, err := gotronValues(params, e.entry)
		if err != nil {
			return fmt.Errorf("hf: internal: %w", err)
		}
		src := make([][]float32, len(e.src))
		shapes := make([][]int, len(e.src))
		for i, t := range e.src {
			*read += int64(len(t.Data))
			src[i] = make([]float32, t.NumElements())
			if err := t.DecodeFloat32(src[i]); err != nil {
				return fmt.Errorf("hf: %s: tensor %s: %w", dir, e.names[i], err)
			}
			shapes[i] = e.HF[i].Shape
		}
		e.Op.toGotron(dm, p, src, shapes)
		scatter()
	}
	return nil
}

// gotronValues is the values e's op reads and writes: its parameter's, or
// with e.More a concatenation of the parameters' rows, which scatter (a
// no-op otherwise) copies back into them.
func gotronValues(params map[string]*tensor.Tensor, e entry) (vals []float32, scatter func(), err error) {
	ps := make([]*tensor.Tensor, 0, 1+len(e.More))
	for _, n := range append([]string{e.Gotron}, e.More...) {
		p := params[n]
		if p == nil {
			return nil, nil, fmt.Errorf("no gotron parameter %s", n)
		}
		ps = append(ps, p)
	}
	if len(ps) == 1 {
		return ps[0].Float32s(), func() {}, nil
	}
	for _, p := range ps {
		vals = append(vals, p.Float32s()...)
	}
	return vals, func() {
		o := 0
		for _, p := range ps {
			o += copy(p.Float32s(), vals[o:])
		}
	}, nil
}

// paramsByName maps m's parameters and buffers (the routers' expert biases,
// host tensors aliasing them) by name.
func paramsByName(m *gpt.Model) map[string]*tensor.Tensor {
	params := map[string]*tensor.Tensor{}
	for _, p := range append(m.Params(), m.Buffers()...) {
		params[p.Name] = p
	}
	return params
}

// describe summarises a config for error messages.
func describe(arch string, c gpt.Config, vocab int) string {
	tie := "tied"
	if c.UntieEmbeddingsAndOutputWeights {
		tie = "untied"
	}
	moe := ""
	if m := c.MoE; m.Enabled() {
		moe = fmt.Sprintf(", %d experts (top-%d, ffn %d) in %d of %d layers", m.NumExperts, m.TopK, m.FFNHiddenSize, m.NumMoELayers(c.NumLayers), c.NumLayers)
		if m.SharedExpertFFN > 0 {
			moe += fmt.Sprintf(", shared expert %d", m.SharedExpertFFN)
		}
	}
	return fmt.Sprintf("%d layers, hidden %d, %d heads, %d kv heads, ffn %d, vocab %d, %s embeddings%s",
		c.NumLayers, c.HiddenSize, c.NumAttentionHeads, c.NumQueryGroups, c.FFNHiddenSize, vocab, tie, moe)
}

// ArchOf infers the Hugging Face architecture a gotron model config can be
// exported as, naming the first setting that fits neither.
func ArchOf(c gpt.Config) (string, error) {
	if err := c.Validate(); err != nil {
		return "", err
	}
	if c.MLA.Enabled {
		return deepseekArchOf(c, "")
	}
	if c.GDN.Enabled || c.AttentionOutputGate {
		return qwen3NextArchOf(c)
	}
	if c.MuP.Enabled {
		// Hugging Face's GPT-2 and Llama have no muP attention or logit scale
		return "", fmt.Errorf("hf: the model uses --use-mup, whose attention and logit scales neither GPT-2 nor Llama has in Hugging Face's format; export is not built for it")
	}
	if c.LayerNorm1P {
		// Hugging Face's GPT-2 and Llama norms scale by their weight, not by
		// 1 + weight; exporting γ as it is would silently change the model.
		return "", fmt.Errorf("hf: the model's norms use --apply-layernorm-1p (weight 1 + γ), which neither GPT-2 nor Llama has in Hugging Face's format; export is not built for it")
	}
	if c.MoE.Enabled() {
		return moeArchOf(c)
	}
	if c.QKLayerNorm {
		return "", fmt.Errorf("hf: the model uses --qk-layernorm, which neither GPT-2 nor Llama has in Hugging Face's format (of the MoE models, Qwen3-MoE has it); export is not built for a dense model with it")
	}
	gpt2 := c.PositionEmbeddingType == gpt.LearnedAbsolute && c.Normalization == gpt.LayerNorm &&
		(c.Activation == gpt.GELU || c.Activation == gpt.GELUTanh) && !c.DisableBiasLinear &&
		c.NumQueryGroups == c.NumAttentionHeads && c.KVChannels*c.NumAttentionHeads == c.HiddenSize
	if gpt2 {
		return ArchGPT2, nil
	}
	llama := c.PositionEmbeddingType == gpt.RoPE && c.Normalization == gpt.RMSNorm && c.Activation == gpt.SwiGLU &&
		c.DisableBiasLinear && !c.AddQKVBias && c.RotaryPercent == 1 && !c.RotaryInterleaved
	if llama {
		return ArchLlama, nil
	}
	return "", fmt.Errorf("hf: model (position embedding %s, %s, activation %s, disable bias %v, kv heads %d/%d, rotary percent %g, interleaved %v) is neither GPT-2 (learned_absolute, LayerNorm, gelu, biases, no GQA) nor Llama (rope, RMSNorm, swiglu, no biases, full rotate-half RoPE)",
		c.PositionEmbeddingType, c.Normalization, c.Activation, c.DisableBiasLinear, c.NumQueryGroups, c.NumAttentionHeads, c.RotaryPercent, c.RotaryInterleaved)
}

// ExportOptions configures Export. The zero value writes the dtype recorded
// at import (float32 without one) in one file up to 5 GB per shard.
type ExportOptions struct {
	// DType is the safetensors dtype to write: "F32", "BF16" or "F16"; ""
	// means Info.DType, or F32.
	DType string
	// MaxShardBytes is --max-shard-size; 0 means 5 GB (huggingface_hub's).
	MaxShardBytes int64
}

// ParseDType accepts --dtype spellings: float32/bfloat16/float16 (torch's),
// fp32/bf16/fp16 or F32/BF16/F16, and returns the safetensors name.
func ParseDType(s string) (string, error) {
	switch strings.ToLower(s) {
	case "float32", "fp32", "f32":
		return "F32", nil
	case "bfloat16", "bf16":
		return "BF16", nil
	case "float16", "fp16", "f16", "half":
		return "F16", nil
	}
	return "", fmt.Errorf("dtype %q: want float32, bfloat16 or float16", s)
}

// Export writes m as a Hugging Face checkpoint in dir: config.json and
// model.safetensors (or shards and model.safetensors.index.json). The
// vocabulary is cut back to info.VocabSize (the padded size when zero): the
// padding rows are dropped, whatever training put in them. Config keys of info.Config that the
// model does not determine are kept verbatim.
func Export(ctx context.Context, dir string, m *gpt.Model, info Info, opts ExportOptions) error {
	c := m.Config
	arch := info.Arch
	if c.MLA.Enabled {
		if err := c.Validate(); err != nil {
			return err
		}
		a, err := deepseekArchOf(c, arch)
		if err != nil {
			return err
		}
		arch = a
	} else if arch == "" || arch == ArchDeepSeekV2 || arch == ArchDeepSeekV3 || c.LayerNorm1P || c.QKLayerNorm || c.GDN.Enabled || c.AttentionOutputGate || c.MuP.Enabled {
		a, err := ArchOf(c)
		if err != nil {
			return err
		}
		arch = a
	}
	dtype := opts.DType
	if dtype == "" {
		dtype = info.DType
		if dtype != "BF16" && dtype != "F16" {
			dtype = "F32" // also for F64 imports
		}
	}
	dt, err := safetensors.ParseDType(dtype)
	if err != nil || (dt != safetensors.F32 && dt != safetensors.BF16 && dt != safetensors.F16) {
		return fmt.Errorf("hf: export dtype %q: want F32, BF16 or F16", dtype)
	}
	vocab := info.VocabSize
	if vocab == 0 {
		vocab = c.VocabSize
	}
	if err := checked.RangeWhy("hf: vocab_size", int64(vocab), 1, int64(c.VocabSize), "the model's embedding rows"); err != nil {
		return err
	}
	tab, err := table(arch, c, vocab)
	if err != nil {
		return err
	}
	cfgJSON, err := exportConfigJSON(arch, c, vocab, dtype, info.Config)
	if err != nil {
		return err
	}
	params := paramsByName(m)
	dm := dimsOf(c)
	var out []safetensors.Named
	for _, e := range tab {
		if err := ctx.Err(); err != nil {
			return err
		}
		p, _, err := gotronValues(params, e)
		if err != nil {
			return fmt.Errorf("hf: model: %w", err)
		}
		dst := make([][]float32, len(e.HF))
		shapes := make([][]int, len(e.HF))
		for i, ht := range e.HF {
			dst[i] = make([]float32, numel(ht.Shape))
			shapes[i] = ht.Shape
		}
		e.Op.toHF(dm, dst, p, shapes)
		for i, ht := range e.HF {
			st, err := safetensors.FromFloat32(dt, ht.Shape, dst[i])
			if err != nil {
				return fmt.Errorf("hf: %s: %w", ht.Name, err)
			}
			out = append(out, safetensors.Named{Name: ht.Name, Tensor: st})
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("hf: %w", err)
	}
	if _, err := safetensors.WriteSharded(dir, out, safetensors.ShardOptions{MaxShardBytes: opts.MaxShardBytes,
		Metadata: map[string]string{"format": "pt"}}); err != nil {
		return fmt.Errorf("hf: write %s: %w", dir, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), cfgJSON, 0o644); err != nil {
		return fmt.Errorf("hf: %w", err)
	}
	return nil
}

func numel(shape []int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return n
}

// exportConfigJSON builds config.json and checks that reading it back gives
// the model's config.
func exportConfigJSON(arch string, c gpt.Config, vocab int, dtype string, origRaw json.RawMessage) ([]byte, error) {
	owned, template, nullMeans, err := exportConfig(arch, c, vocab, dtype)
	if err != nil {
		return nil, err
	}
	var orig map[string]any
	if len(origRaw) > 0 {
		if orig, err = decodeJSONObject(origRaw); err != nil {
			return nil, fmt.Errorf("hf: imported config.json: %w", err)
		}
	}
	merged := mergeConfig(orig, owned, template, nullMeans)
	if arch == ArchQwen2MoE || arch == ArchQwen3MoE || arch == ArchQwen3Next && c.MoE.Enabled() {
		keepQwenPattern(orig, merged, origRaw, c)
	}
	if arch == ArchQwen3Next {
		keepQwen3NextForm(orig, merged, origRaw, c)
	}
	if arch == ArchDeepSeekV2 || arch == ArchDeepSeekV3 {
		keepDeepSeekRope(orig, merged, origRaw, arch, c)
	} else {
		keepRopeParameters(orig, merged, c)
	}
	b, err := json.MarshalIndent(merged, "", "  ")
	if err != nil {
		return nil, err
	}
	b = append(b, '\n')
	_, back, backVocab, _, err := parseConfig(b, 1)
	if err != nil {
		return nil, fmt.Errorf("hf: exported config.json does not parse: %w", err)
	}
	want := c
	want.VocabSize = vocab
	back.VocabSize = backVocab
	if !sameArch(want, back) || (arch == ArchDeepSeekV2 || arch == ArchDeepSeekV3) && !sameDeepSeek(want, back) ||
		arch == ArchQwen3Next && !sameQwen3Next(want, back) {
		return nil, fmt.Errorf("hf: exported config.json describes %s, want %s", describe(arch, back, vocab), describe(arch, want, vocab))
	}
	return b, nil
}

// sameArch compares the fields config.json carries.
func sameArch(a, b gpt.Config) bool {
	return a.NumLayers == b.NumLayers && a.HiddenSize == b.HiddenSize && a.NumAttentionHeads == b.NumAttentionHeads &&
		a.NumQueryGroups == b.NumQueryGroups && a.KVChannels == b.KVChannels && denseFFN(a) == denseFFN(b) &&
		a.AddQKVBias == b.AddQKVBias && a.QKLayerNorm == b.QKLayerNorm && sameMoE(a, b) &&
		a.VocabSize == b.VocabSize && a.MaxPositionEmbeddings == b.MaxPositionEmbeddings &&
		a.PositionEmbeddingType == b.PositionEmbeddingType && a.Normalization == b.Normalization &&
		a.NormEpsilon == b.NormEpsilon && a.Activation == b.Activation && a.RotaryBase == b.RotaryBase &&
		a.UntieEmbeddingsAndOutputWeights == b.UntieEmbeddingsAndOutputWeights && a.DisableBiasLinear == b.DisableBiasLinear
}

// infoFile is InfoFile's content.
type infoFile struct {
	Format  string `json:"format"`
	Version int    `json:"version"`
	Info
}

// WriteInfo records info in dir (a gotron checkpoint's --save directory) as
// InfoFile.
func WriteInfo(dir string, info Info) error {
	b, err := json.MarshalIndent(infoFile{Format: infoFormat, Version: infoVersion, Info: info}, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, InfoFile), append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("hf: %w", err)
	}
	return nil
}

// ReadInfo reads dir's InfoFile; ok is false when there is none.
func ReadInfo(dir string) (info Info, ok bool, err error) {
	path := filepath.Join(dir, InfoFile)
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return Info{}, false, nil
	}
	if err != nil {
		return Info{}, false, fmt.Errorf("hf: %w", err)
	}
	var f infoFile
	if err := json.Unmarshal(b, &f); err != nil {
		return Info{}, false, fmt.Errorf("hf: %s: %w", path, err)
	}
	if f.Format != infoFormat || f.Version != infoVersion {
		return Info{}, false, fmt.Errorf("hf: %s: format %q version %d, want %q version %d", path, f.Format, f.Version, infoFormat, infoVersion)
	}
	if err := checked.Range("vocab_size", int64(f.VocabSize), 0, maxDim); err != nil {
		return Info{}, false, fmt.Errorf("hf: %s: %w", path, err)
	}
	switch f.Arch {
	case "", ArchGPT2, ArchLlama, ArchMixtral, ArchQwen2MoE, ArchQwen3MoE, ArchDeepSeekV2, ArchDeepSeekV3, ArchQwen3Next:
	default:
		return Info{}, false, fmt.Errorf("hf: %s: arch %q: want %q, %q, %q, %q, %q, %q, %q or %q", path, f.Arch, ArchGPT2, ArchLlama, ArchMixtral, ArchQwen2MoE, ArchQwen3MoE, ArchDeepSeekV2, ArchDeepSeekV3, ArchQwen3Next)
	}
	return f.Info, true, nil
}

// CopyTokenizerFiles copies the TokenizerFileNames present in src to dst
// (created if needed) and returns the names copied.
func CopyTokenizerFiles(src, dst string) ([]string, error) {
	var copied []string
	for _, name := range TokenizerFileNames() {
		in, err := os.Open(filepath.Join(src, name))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return copied, fmt.Errorf("hf: %w", err)
		}
		err = copyFile(in, filepath.Join(dst, name))
		in.Close()
		if err != nil {
			return copied, err
		}
		copied = append(copied, name)
	}
	return copied, nil
}

func copyFile(in io.Reader, path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("hf: %w", err)
	}
	out, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("hf: %w", err)
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return fmt.Errorf("hf: copy to %s: %w", path, err)
	}
	if err := out.Close(); err != nil {
		return fmt.Errorf("hf: %w", err)
	}
	return nil
}
