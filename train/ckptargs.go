package train

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/gotron/gotron/model/gpt"
)

// archField is one architecture field of gpt.Config: its JSON key in a
// checkpoint's RunArgs.Model, the flag that sets it, and its value.
type archField struct {
	key  string // Go field name, the JSON key encoding/json writes
	flag string
	get  func(*gpt.Config) any
}

// archFields returns the gpt.Config fields that decide what the weights
// mean. Dropout and the init standard deviation are training settings and
// may change between runs.
func archFields() []archField {
	return []archField{
		{"NumLayers", "--num-layers", func(c *gpt.Config) any { return c.NumLayers }},
		{"HiddenSize", "--hidden-size", func(c *gpt.Config) any { return c.HiddenSize }},
		{"NumAttentionHeads", "--num-attention-heads", func(c *gpt.Config) any { return c.NumAttentionHeads }},
		{"NumQueryGroups", "--num-query-groups", func(c *gpt.Config) any { return c.NumQueryGroups }},
		{"KVChannels", "--kv-channels", func(c *gpt.Config) any { return c.KVChannels }},
		{"FFNHiddenSize", "--ffn-hidden-size", func(c *gpt.Config) any { return c.FFNHiddenSize }},
		{"VocabSize", "padded vocab size", func(c *gpt.Config) any { return c.VocabSize }},
		{"MaxPositionEmbeddings", "--max-position-embeddings", func(c *gpt.Config) any { return c.MaxPositionEmbeddings }},
		{"PositionEmbeddingType", "--position-embedding-type", func(c *gpt.Config) any { return c.PositionEmbeddingType }},
		{"RotaryBase", "--rotary-base", func(c *gpt.Config) any { return c.RotaryBase }},
		{"RotaryPercent", "--rotary-percent", func(c *gpt.Config) any { return c.RotaryPercent }},
		{"RotaryInterleaved", "--rotary-interleaved", func(c *gpt.Config) any { return c.RotaryInterleaved }},
		{"Normalization", "--normalization", func(c *gpt.Config) any { return c.Normalization }},
		{"NormEpsilon", "--norm-epsilon", func(c *gpt.Config) any { return c.NormEpsilon }},
		{"LayerNorm1P", "--apply-layernorm-1p", func(c *gpt.Config) any { return c.LayerNorm1P }},
		{"QKLayerNorm", "--qk-layernorm", func(c *gpt.Config) any { return c.QKLayerNorm }},
		{"Activation", "--swiglu/--openai-gelu", func(c *gpt.Config) any { return c.Activation }},
		{"DisableBiasLinear", "--disable-bias-linear", func(c *gpt.Config) any { return c.DisableBiasLinear }},
		{"AddQKVBias", "--add-qkv-bias", func(c *gpt.Config) any { return c.AddQKVBias }},
		{"UntieEmbeddingsAndOutputWeights", "--untie-embeddings-and-output-weights", func(c *gpt.Config) any { return c.UntieEmbeddingsAndOutputWeights }},
		// muP changes what the weights mean (attention and logit scales)
		// and the optimizer's groups: a resume keeps them.
		{"MuP", "--use-mup/--mup-*", func(c *gpt.Config) any {
			if !c.MuP.Enabled {
				// unset fields and Megatron's defaults (1) mean the same
				// without muP (a --load HF_DIR import records the flags')
				return gpt.MuPConfig{}
			}
			return c.MuP
		}},
	}
}

// checkCheckpointArgs compares every architecture field recorded in a
// checkpoint's args (RunArgs.Model) with the model being trained, as
// Megatron's check_checkpoint_args does, and refuses the load listing every
// difference. Tensor shapes alone do not catch all of them: a different
// --num-attention-heads keeps the fused QKV's shape and silently
// reinterprets it. Fields the checkpoint does not record (older
// checkpoints) are not compared; empty args skip the check.
func checkCheckpointArgs(root string, have gpt.Config, args json.RawMessage) error {
	if len(args) == 0 {
		return nil
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(args, &top); err != nil {
		return fmt.Errorf("train: --load %s: args: %w", root, err)
	}
	rawModel, ok := top["model"]
	if !ok {
		return nil
	}
	var recorded map[string]json.RawMessage
	if err := json.Unmarshal(rawModel, &recorded); err != nil {
		return fmt.Errorf("train: --load %s: args.model: %w", root, err)
	}
	var saved gpt.Config
	if err := json.Unmarshal(rawModel, &saved); err != nil {
		return fmt.Errorf("train: --load %s: args.model: %w", root, err)
	}
	var diffs []string
	for _, f := range archFields() {
		if _, ok := recorded[f.key]; !ok {
			continue
		}
		if s, h := f.get(&saved), f.get(&have); s != h {
			diffs = append(diffs, fmt.Sprintf("%s: checkpoint %v, this run %v", f.flag, s, h))
		}
	}
	if len(diffs) > 0 {
		return fmt.Errorf("train: --load %s: the checkpoint's architecture differs from this run's (set the flags as when it was saved):\n  %s",
			root, strings.Join(diffs, "\n  "))
	}
	return nil
}
