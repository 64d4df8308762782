package main

import (
	"flag"
	"fmt"

	"github.com/gotron/gotron/model/gpt"
)

// dsaFlags are Megatron's flags of DeepSeek sparse attention
// (--experimental-attention-variant dsa with --multi-latent-attention:
// megatron/core/transformer/experimental_attention_variant/dsa.py). They
// register with the gated delta net's flags (addGDNFlags), which own
// --experimental-attention-variant; apply sets gpt.Config.DSA.
type dsaFlags struct {
	heads, headDim, topk, topkFreq, skipOffset int
	lossCoeff, kNormEps                        float64
	sparseLoss, ropeInterleaved, kNormFP32     bool
	noRotate, noReLU                           bool
	kernelBackend                              string
}

// dsaOnlyFlags need --experimental-attention-variant dsa.
var dsaOnlyFlags = []string{"dsa-indexer-n-heads", "dsa-indexer-head-dim", "dsa-indexer-topk", "dsa-indexer-topk-freq",
	"dsa-indexer-skip-topk-offset", "dsa-indexer-loss-coeff", "dsa-indexer-use-sparse-loss", "dsa-kernel-backend",
	"dsa-indexer-rope-interleaved", "no-dsa-indexer-rotate-activation", "disable-dsa-indexer-rotate-activation",
	"no-dsa-indexer-scoring-relu", "disable-dsa-indexer-scoring-relu", "dsa-indexer-k-norm-epsilon", "dsa-indexer-k-norm-fp32"}

func addDSAFlags(fs *flag.FlagSet, f *dsaFlags) {
	fs.IntVar(&f.heads, "dsa-indexer-n-heads", 0, "DSA: the lightning indexer's heads (needed)")
	fs.IntVar(&f.headDim, "dsa-indexer-head-dim", 0, "DSA: the indexer's head dimension (needed; a power of two with the Hadamard rotation)")
	fs.IntVar(&f.topk, "dsa-indexer-topk", 0, "DSA: keys each query attends to, the indexer's highest-scoring causal ones (needed)")
	fs.IntVar(&f.topkFreq, "dsa-indexer-topk-freq", 1, "DSA: compute the top-k every N layers and share it in between (only 1 is built)")
	fs.IntVar(&f.skipOffset, "dsa-indexer-skip-topk-offset", 0, "DSA: the top-k sharing's layer offset (only 0 is built)")
	fs.Float64Var(&f.lossCoeff, "dsa-indexer-loss-coeff", 0, "DSA: weight of the indexer's KL loss against the main attention; 0: no indexer loss (the indexer is then not trained)")
	fs.BoolVar(&f.sparseLoss, "dsa-indexer-use-sparse-loss", false, "DSA: the indexer loss over each query's selected keys only")
	fs.StringVar(&f.kernelBackend, "dsa-kernel-backend", "none", "DSA: Megatron's fused GPU kernels (tilelang, cudnn); only none (the reference path) is built")
	fs.BoolVar(&f.ropeInterleaved, "dsa-indexer-rope-interleaved", false, "DSA: the indexer's rotary embedding MLA-style (de-interleaved) instead of rotating halves")
	fs.BoolVar(&f.noRotate, "no-dsa-indexer-rotate-activation", false, "DSA: no Hadamard rotation of the indexer's queries and keys")
	fs.BoolVar(&f.noRotate, "disable-dsa-indexer-rotate-activation", false, "DSA: the same as --no-dsa-indexer-rotate-activation")
	fs.BoolVar(&f.noReLU, "no-dsa-indexer-scoring-relu", false, "DSA: the indexer's scores without the ReLU of each head's product")
	fs.BoolVar(&f.noReLU, "disable-dsa-indexer-scoring-relu", false, "DSA: the same as --no-dsa-indexer-scoring-relu")
	fs.Float64Var(&f.kNormEps, "dsa-indexer-k-norm-epsilon", 0, "DSA: the indexer's key LayerNorm epsilon; 0: --norm-epsilon")
	fs.BoolVar(&f.kNormFP32, "dsa-indexer-k-norm-fp32", false, "DSA: the indexer's key LayerNorm on float32 inputs (not built)")
}

// apply sets m.DSA from the flags when variant is dsa; other variants
// refuse the DSA flags given on the command line.
func (f *dsaFlags) apply(m *gpt.Config, variant string, given map[string]bool) error {
	if variant != "dsa" {
		for _, name := range dsaOnlyFlags {
			if given[name] {
				return fmt.Errorf("--%s needs --experimental-attention-variant dsa", name)
			}
		}
		return nil
	}
	switch {
	case !given["dsa-indexer-n-heads"] || !given["dsa-indexer-head-dim"] || !given["dsa-indexer-topk"]:
		return fmt.Errorf("--experimental-attention-variant dsa needs --dsa-indexer-n-heads, --dsa-indexer-head-dim and --dsa-indexer-topk")
	case f.topkFreq != 1:
		return fmt.Errorf("--dsa-indexer-topk-freq %d: sharing the top-k across layers is not built in gotron (1 is)", f.topkFreq)
	case f.skipOffset != 0:
		return fmt.Errorf("--dsa-indexer-skip-topk-offset %d: sharing the top-k across layers is not built in gotron (0 is)", f.skipOffset)
	case f.kernelBackend == "tilelang" || f.kernelBackend == "cudnn":
		return fmt.Errorf("--dsa-kernel-backend %s: Megatron's fused DSA GPU kernels are not built in gotron (none, the reference path, is)", f.kernelBackend)
	case f.kernelBackend != "none":
		return fmt.Errorf("--dsa-kernel-backend %q: want none, tilelang or cudnn", f.kernelBackend)
	case f.kNormFP32:
		return fmt.Errorf("--dsa-indexer-k-norm-fp32: the indexer key LayerNorm's float32 cast is not built in gotron")
	}
	m.DSA = gpt.DSAConfig{Enabled: true, IndexerHeads: f.heads, IndexerHeadDim: f.headDim, TopK: f.topk, LossCoeff: f.lossCoeff,
		SparseLoss: f.sparseLoss, RopeInterleaved: f.ropeInterleaved, NoRotateActivation: f.noRotate, NoScoringReLU: f.noReLU,
		KNormEpsilon: f.kNormEps}
	return nil
}
