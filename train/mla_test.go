package train

import (
	"fmt"
	"os"
	"testing"

	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/parallel/cp"
	"github.com/gotron/gotron/parallel/ddp"
)

// mlaModels are two tiny multi-latent attention models: with --q-lora-rank
// (LayerNorm, learned positions, biases, tied; YaRN factor 40, v narrower
// than the q/k heads) and without (RMSNorm, rope positions, no biases,
// untied; YaRN factor 4 with both mscales, v wider); the first with the
// latents' norms (--qk-layernorm), the second without.
func mlaModels() map[string]gpt.Config {
	qlora := gpt.DefaultMLA()
	qlora.QLoraRank, qlora.KVLoraRank, qlora.QKHeadDim, qlora.QKPosEmbHeadDim, qlora.VHeadDim = 12, 10, 6, 4, 5
	qlora.ScalingFactor, qlora.Mscale, qlora.MscaleAllDim = 40, 0.707, 0.707
	plain := gpt.DefaultMLA()
	plain.KVLoraRank, plain.QKHeadDim, plain.QKPosEmbHeadDim, plain.VHeadDim = 12, 2, 4, 8
	plain.ScalingFactor, plain.Mscale, plain.MscaleAllDim, plain.OriginalMaxPositions = 4, 1, 0.5, 8
	return map[string]gpt.Config{
		"mla-qlora": {NumLayers: 4, HiddenSize: 32, NumAttentionHeads: 4, VocabSize: 64, MaxPositionEmbeddings: 16,
			Activation: gpt.GELUTanh, MLA: qlora, QKLayerNorm: true}, // the latent norms (mla-plain-q has none)
		"mla-plain-q": {NumLayers: 4, HiddenSize: 32, NumAttentionHeads: 4, VocabSize: 64, MaxPositionEmbeddings: 16,
			Normalization: gpt.RMSNorm, Activation: gpt.SwiGLU, PositionEmbeddingType: gpt.RoPE, DisableBiasLinear: true,
			UntieEmbeddingsAndOutputWeights: true, FFNHiddenSize: 64, MLA: plain},
	}
}

// TestMLAParallelMatchesSingleProcess: multi-latent attention under tensor
// parallelism (heads split over the up-projections and linear_proj, the
// down-projections and latent norms replicated), with and without sequence
// parallelism, under pipeline parallelism, and the MLA configs' layout
// (TP=2 PP=2 SP), reproduces the single-process run: the lm loss at each
// of 10 iterations, the validation loss and the gathered parameters within
// 1e-5. Without SP the shared rotary key's gradient is all-reduced over
// the TP ranks (each holds half the heads): TP=2 without SP fails without
// it.
func TestMLAParallelMatchesSingleProcess(t *testing.T) {
	train, valid := dpDataset(t, 16)
	for name, m := range mlaModels() {
		cfg := dpConfig(m)
		cfg.MicroBatchSize = 2
		ref := runDP(t, cfg, 0, ddp.Config{}, train, valid)[0]
		// (the second model runs the layouts that differ most: TP without
		// SP and the configs' TP×PP×SP)
		for _, c := range []struct{ sp bool }{{false}, {true}} {
			if name != "mla-qlora" && c.sp {
				continue
			}
			label := fmt.Sprintf("%s TP=2 SP=%v", name, c.sp)
			checkSameRun(t, label, ref, runTP(t, cfg, 2, 1, c.sp, ddp.Config{}, train, valid))
		}
		for _, l := range []ppLayout{{tp: 1, pp: 2, dp: 1}, {tp: 2, pp: 2, dp: 1, sp: true}} {
			if name != "mla-qlora" && l.tp == 1 {
				continue
			}
			l.split.PP = l.pp
			checkSameRun(t, name+" "+l.String(), ref, runPP(t, cfg, l, train, valid))
		}
	}
}

// TestMLACheckpointResume: an MLA run saved at iteration 5 under TP=2 with
// SP resumes at TP=2 with SP and at one process with the losses of the
// uninterrupted run.
func TestMLACheckpointResume(t *testing.T) {
	cfg := dpConfig(mlaModels()["mla-qlora"])
	cfg.MicroBatchSize = 2
	checkTPSPResume(t, "MLA", cfg)
}

// TestMLAContextParallelMatchesSingleProcess: MLA's attention over a
// context-parallel ring (its padded heads and softmax scale through the
// ring's block attention, the rotary parts at the tokens' sequence
// positions) reproduces the single-process run; with GOTRON_CP_FULL=1 also
// composed with TP=2+SP (seconds more).
func TestMLAContextParallelMatchesSingleProcess(t *testing.T) {
	train, valid := dpDataset(t, 32)
	m := mlaModels()["mla-qlora"]
	m.MaxPositionEmbeddings = 32
	cfg := dpConfig(m)
	cfg.SeqLength, cfg.MicroBatchSize = 32, 2
	ref := runDP(t, cfg, 0, ddp.Config{}, train, valid)[0]
	for i, l := range []cpLayout{{tp: 1, pp: 1, cp: 2, dp: 1, comm: cp.P2P}, {tp: 2, pp: 1, cp: 2, dp: 1, comm: cp.P2P, sp: true}} {
		if i > 0 && os.Getenv("GOTRON_CP_FULL") != "1" {
			continue
		}
		checkSameRun(t, "mla "+l.String(), ref, runCPLayout(t, cfg, l, train, valid))
	}
}

// checkTPSPResume saves cfg's run at iteration 5 under TP=2 with SP and
// resumes it at TP=2 with SP and in one process: both must continue with
// the losses of the uninterrupted TP=2 run.
func checkTPSPResume(t *testing.T, label string, cfg Config) {
	t.Helper()
	train, valid := dpDataset(t, 16)
	straight := runTP(t, cfg, 2, 1, true, ddp.Config{}, train, valid)[0]
	dir := t.TempDir()
	first := cfg
	first.Save, first.ExitInterval = dir, 5
	a := runTP(t, first, 2, 1, true, ddp.Config{}, train, valid)[0]
	for _, size := range []int{2, 1} {
		second := cfg
		second.Load = dir
		var b dpRun
		if size == 1 {
			b = runDP(t, second, 0, ddp.Config{}, train, valid)[0]
		} else {
			b = runTP(t, second, size, 1, true, ddp.Config{}, train, valid)[0]
		}
		got := append(append([]float64(nil), a.res.Losses...), b.res.Losses...)
		if len(got) != len(straight.res.Losses) {
			t.Fatalf("%s: resumed at TP=%d: %d iterations in all, want %d", label, size, len(got), len(straight.res.Losses))
		}
		for i := range straight.res.Losses {
			if !relClose(got[i], straight.res.Losses[i], 1e-5) {
				t.Fatalf("%s TP=2 SP checkpoint resumed at TP=%d: iteration %d loss %.9g, straight %.9g", label, size, i+1, got[i], straight.res.Losses[i])
			}
		}
	}
}
