package main

import (
	"flag"
	"fmt"

	"github.com/gotron/gotron/model/gpt"
)

// gdnFlags are Megatron's flags of the hybrid gated-delta-net model
// (--experimental-attention-variant gated_delta_net, Qwen3-Next style) and
// of the attention output gate (gotron train and gotron memory).
// addGDNFlags registers them; apply sets gpt.Config.GDN and
// AttentionOutputGate.
type gdnFlags struct {
	variant, freq                    string
	conv, keyDim, valueDim, keyHeads int
	valueHeads                       int
	outputGate                       bool
	dsa                              dsaFlags // dsaflags.go: the dsa variant's
}

// gdnSizeFlags are the gated delta net's size flags, which need the variant.
var gdnSizeFlags = []string{"linear-attention-freq", "linear-conv-kernel-dim", "linear-key-head-dim",
	"linear-value-head-dim", "linear-num-key-heads", "linear-num-value-heads"}

func addGDNFlags(fs *flag.FlagSet, f *gdnFlags) {
	fs.StringVar(&f.variant, "experimental-attention-variant", "", "gated_delta_net (or gdn): a hybrid model whose --linear-attention-freq layers are gated delta nets (linear attention with a recurrent state; --device cpu and sim: training, evaluation and decoding); dsa: DeepSeek sparse attention in every --multi-latent-attention layer (--dsa-indexer-*; --device cpu and sim: training and evaluation)")
	addDSAFlags(fs, &f.dsa)
	fs.StringVar(&f.freq, "linear-attention-freq", "", "gated delta net: N (every Nth layer, from layer N-1, is full attention; the others gated delta nets) or a 0/1 list per layer like \"([1]*3+[0]*1)\" (1: gated delta net)")
	fs.IntVar(&f.conv, "linear-conv-kernel-dim", 4, "gated delta net: the short causal convolution's kernel size")
	fs.IntVar(&f.keyDim, "linear-key-head-dim", 128, "gated delta net: query/key head dimension")
	fs.IntVar(&f.valueDim, "linear-value-head-dim", 128, "gated delta net: value head dimension")
	fs.IntVar(&f.keyHeads, "linear-num-key-heads", 16, "gated delta net: query/key heads")
	fs.IntVar(&f.valueHeads, "linear-num-value-heads", 32, "gated delta net: value heads (a multiple of the key heads)")
	fs.BoolVar(&f.outputGate, "attention-output-gate", false, "gate each attention head's output by sigmoid of a projection of the input, before the output projection (QKV rows per group [q; gate; k; v]; --device cpu and sim)")
}

// apply sets m.GDN and m.AttentionOutputGate from the flags (given: the
// flags on the command line).
func (f *gdnFlags) apply(m *gpt.Config, given map[string]bool) error {
	m.AttentionOutputGate = f.outputGate
	if err := f.dsa.apply(m, f.variant, given); err != nil {
		return err
	}
	switch f.variant {
	case "dsa":
		for _, name := range gdnSizeFlags {
			if given[name] {
				return fmt.Errorf("--%s needs --experimental-attention-variant gated_delta_net", name)
			}
		}
		return nil
	case "":
		for _, name := range gdnSizeFlags {
			if given[name] {
				return fmt.Errorf("--%s needs --experimental-attention-variant gated_delta_net", name)
			}
		}
		return nil
	case "gated_delta_net", "gdn":
	case "gdn2":
		return fmt.Errorf("--experimental-attention-variant %s: not built in gotron (gated_delta_net and dsa are)", f.variant)
	default:
		return fmt.Errorf("--experimental-attention-variant %q: want gated_delta_net (or gdn) or dsa (gdn2 is not built)", f.variant)
	}
	m.GDN = gpt.GDNConfig{Enabled: true, LinearAttentionFreq: f.freq, ConvKernel: f.conv, KeyHeadDim: f.keyDim,
		ValueHeadDim: f.valueDim, NumKeyHeads: f.keyHeads, NumValueHeads: f.valueHeads}
	return nil
}
