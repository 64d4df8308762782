package train

import (
	"strings"
	"testing"

	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/parallel/ddp"
)

// gdnModel is a tiny hybrid model in the gpt3_mcore_te_tp2_pp1_gdn
// configs' shape: gated delta nets at layers 0 and 1, output-gated GQA
// attention with half-rotary RoPE at layer 2, LayerNorm 1p, and MoE with a
// gated shared expert in every layer.
func gdnModel() gpt.Config {
	return gpt.Config{NumLayers: 3, HiddenSize: 32, NumAttentionHeads: 4, NumQueryGroups: 2, FFNHiddenSize: 48,
		VocabSize: 64, MaxPositionEmbeddings: 16, PositionEmbeddingType: gpt.RoPE, RotaryPercent: 0.5,
		LayerNorm1P: true, Activation: gpt.SwiGLU, DisableBiasLinear: true, UntieEmbeddingsAndOutputWeights: true,
		AttentionOutputGate: true,
		GDN: gpt.GDNConfig{Enabled: true, LinearAttentionFreq: "3", ConvKernel: 4, KeyHeadDim: 4, ValueHeadDim: 6,
			NumKeyHeads: 2, NumValueHeads: 4},
		MoE: gpt.MoEConfig{NumExperts: 4, TopK: 2, FFNHiddenSize: 16, SharedExpertFFN: 16, SharedExpertGate: true, AuxLossCoeff: 0.01}}
}

// TestGDNTensorParallelMatchesSingleProcess: the hybrid model under tensor
// parallelism (every section of in_proj and conv1d, dt_bias and A_log
// split by heads, out_proj by its input, out_norm replicated with its
// gradient all-reduced), with and without sequence parallelism, reproduces
// the single-process run over 10 iterations: the lm loss of each, the
// validation loss and the gathered parameters within 1e-5. (Without SP
// the model is dense: MoE under TP needs SP, as Megatron.) Without the
// all-reduce of out_norm's gradient the dense TP run's parameters drift.
func TestGDNTensorParallelMatchesSingleProcess(t *testing.T) {
	train, valid := dpDataset(t, 16)
	for _, sp := range []bool{false, true} {
		m := gdnModel()
		label := "gdn TP=2 SP=true (MoE)"
		if !sp {
			m.MoE, label = gpt.MoEConfig{}, "gdn TP=2 SP=false (dense)"
		}
		cfg := dpConfig(m)
		cfg.MicroBatchSize = 2
		ref := runDP(t, cfg, 0, ddp.Config{}, train, valid)[0]
		checkSameRun(t, label, ref, runTP(t, cfg, 2, 1, sp, ddp.Config{}, train, valid))
	}
}

// TestGDNCheckpointResume: a hybrid run saved at iteration 5 under TP=2
// with SP resumes at TP=2 with SP and at one process with the losses of
// the uninterrupted run.
func TestGDNCheckpointResume(t *testing.T) {
	cfg := dpConfig(gdnModel())
	cfg.MicroBatchSize = 2
	checkTPSPResume(t, "gated delta net", cfg)
}

// TestGDNRefusesContextParallel: gated delta nets over context-parallel
// chunks would miss the earlier chunks' state; the run is refused naming
// both flags.
func TestGDNRefusesContextParallel(t *testing.T) {
	cfg := dpConfig(gdnModel())
	if err := cfg.Model.Validate(); err != nil {
		t.Fatal(err)
	}
	err := cfg.checkContextParallel(2, 1)
	if err == nil || !strings.Contains(err.Error(), "--context-parallel-size=2 with --experimental-attention-variant gated_delta_net") {
		t.Fatalf("checkContextParallel(2): %v", err)
	}
	if err := cfg.checkContextParallel(1, 1); err != nil {
		t.Fatalf("checkContextParallel(1): %v", err)
	}
}
