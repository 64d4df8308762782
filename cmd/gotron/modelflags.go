package main

import (
	"fmt"

	"github.com/gotron/gotron/model/gpt"
)

// modelConfig is the model the flags describe (gotron train and gotron
// memory): the --model preset with the model flags given on the command
// line over it, or the flags alone; then --group-query-attention and the
// activation flags. Sizes are checked by gpt.Config.Validate.
func (f *trainFlags) modelConfig(given map[string]bool) (gpt.Config, error) {
	m := f.model
	if f.preset != "" {
		p, err := gpt.Preset(f.preset)
		if err != nil {
			return gpt.Config{}, fmt.Errorf("--model: %w", err)
		}
		overlayModelFlags(&p, &m, given)
		m = p
	}
	switch {
	case f.gqa && m.NumQueryGroups == 0:
		return gpt.Config{}, fmt.Errorf("--group-query-attention needs --num-query-groups")
	case !f.gqa && given["num-query-groups"]:
		return gpt.Config{}, fmt.Errorf("--num-query-groups needs --group-query-attention")
	case f.swiglu && f.openaiGELU:
		return gpt.Config{}, fmt.Errorf("--swiglu and --openai-gelu exclude each other")
	case f.squaredReLU && (f.swiglu || f.openaiGELU):
		return gpt.Config{}, fmt.Errorf("--squared-relu excludes --swiglu and --openai-gelu (Megatron asserts not swiglu)")
	case f.squaredReLU:
		m.Activation = gpt.SquaredReLU
	case f.swiglu:
		m.Activation = gpt.SwiGLU
	case f.openaiGELU:
		m.Activation = gpt.GELUTanh
	}
	if given["no-position-embedding"] && m.PositionEmbeddingType != gpt.RoPE {
		return gpt.Config{}, fmt.Errorf("--no-position-embedding is deprecated, use --position-embedding-type (Megatron accepts it only with rope)")
	}
	if err := f.moe.apply(&m, given); err != nil {
		return gpt.Config{}, err
	}
	if err := f.mla.apply(&m, given); err != nil {
		return gpt.Config{}, err
	}
	if err := f.gdn.apply(&m, given); err != nil {
		return gpt.Config{}, err
	}
	return m, nil
}
