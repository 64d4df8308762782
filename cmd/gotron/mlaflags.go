package main

import (
	"flag"
	"fmt"

	"github.com/gotron/gotron/model/gpt"
)

// mlaFlags are Megatron's multi-latent attention arguments (arguments.py's
// _add_mla_args, --multi-latent-attention and --rope-type). addMLAFlags
// registers them with Megatron's defaults; apply sets gpt.Config.MLA.
type mlaFlags struct {
	on                                   bool
	qLoraRank, kvLoraRank                int
	qkHeadDim, qkPosEmbHeadDim, vHeadDim int
	ropeType                             string
	scalingFactor, mscale, mscaleAllDim  float64
	cacheLatents                         bool // decoding only: --sample-prompt, inference
}

// mlaOnlyFlags are the flags that mean something only with
// --multi-latent-attention in gotron (Megatron reads --rotary-scaling-factor
// and the mscales also for --position-embedding-type yarn, which gotron
// does not build).
var mlaOnlyFlags = []string{"q-lora-rank", "kv-lora-rank", "qk-head-dim", "qk-pos-emb-head-dim", "v-head-dim",
	"rope-type", "rotary-scaling-factor", "mscale", "mscale-all-dim", "cache-mla-latents"}

func addMLAFlags(fs *flag.FlagSet, f *mlaFlags) {
	d := gpt.DefaultMLA()
	fs.BoolVar(&f.on, "multi-latent-attention", false, "MLA: DeepSeek-V2/V3's multi-latent attention (Megatron's MLASelfAttention) in place of fused-QKV attention")
	fs.BoolVar(&f.cacheLatents, "cache-mla-latents", false, cacheMLALatentsUsage)
	fs.IntVar(&f.qLoraRank, "q-lora-rank", 0, "MLA: rank of the query's low-rank projection (0 or unset: one plain query projection, Megatron's None)")
	fs.IntVar(&f.kvLoraRank, "kv-lora-rank", d.KVLoraRank, "MLA: rank of the keys' and values' shared latent")
	fs.IntVar(&f.qkHeadDim, "qk-head-dim", d.QKHeadDim, "MLA: per-head query/key channels without position")
	fs.IntVar(&f.qkPosEmbHeadDim, "qk-pos-emb-head-dim", d.QKPosEmbHeadDim, "MLA: rotary channels of each query and of the key shared by the heads")
	fs.IntVar(&f.vHeadDim, "v-head-dim", d.VHeadDim, "MLA: per-head value channels")
	fs.StringVar(&f.ropeType, "rope-type", "", "MLA: yarn (MLA's default) or rope")
	fs.Float64Var(&f.scalingFactor, "rotary-scaling-factor", d.ScalingFactor, "MLA: YaRN's rotary scaling factor")
	fs.Float64Var(&f.mscale, "mscale", d.Mscale, "MLA: YaRN's mscale (on the rotary cos and sin)")
	fs.Float64Var(&f.mscaleAllDim, "mscale-all-dim", d.MscaleAllDim, "MLA: YaRN's mscale_all_dim (in the softmax scale)")
}

// apply sets m.MLA from the flags (given: the flags on the command line).
func (f *mlaFlags) apply(m *gpt.Config, given map[string]bool) error {
	if !f.on {
		for _, name := range mlaOnlyFlags {
			if given[name] {
				return fmt.Errorf("--%s needs --multi-latent-attention (gotron's other attention has one rotary embedding, --position-embedding-type rope; Megatron's --position-embedding-type yarn is not built)", name)
			}
		}
		return nil
	}
	mla := gpt.DefaultMLA()
	mla.QLoraRank, mla.KVLoraRank = f.qLoraRank, f.kvLoraRank
	mla.QKHeadDim, mla.QKPosEmbHeadDim, mla.VHeadDim = f.qkHeadDim, f.qkPosEmbHeadDim, f.vHeadDim
	mla.ScalingFactor, mla.Mscale, mla.MscaleAllDim = f.scalingFactor, f.mscale, f.mscaleAllDim
	if f.ropeType != "" {
		r, err := gpt.ParseRopeType(f.ropeType)
		if err != nil {
			return err
		}
		mla.Rope = r
	}
	m.MLA = mla
	return nil
}

// cacheMLALatentsUsage is --cache-mla-latents' help, the same in every command.
const cacheMLALatentsUsage = "MLA decoding: cache each position's key-value latent and rotary key (kv_lora_rank + qk_pos_emb_head_dim values a layer) instead of every head's key and value, the up-projection absorbed (Megatron's --cache-mla-latents)"

// applyCacheMLALatents sets m's decoding to cache MLA latents
// (--cache-mla-latents), refusing a model without multi-latent attention.
func applyCacheMLALatents(m *gpt.Model, on bool, load string) error {
	if on && !m.Config.MLA.Enabled {
		return fmt.Errorf("--cache-mla-latents: the model %s has no multi-latent attention (--multi-latent-attention) whose latents could be cached", load)
	}
	m.CacheMLALatents = on
	return nil
}
