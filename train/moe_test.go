package train

import (
	"math"
	"testing"

	"github.com/gotron/gotron/model/gpt"
)

// TestMoEFLOPsAndMemoryMegatronValues: num_floating_point_operations and
// compute_weight_and_optimizer_memory with MoE terms, against the values
// Megatron's own functions give (../shared/spec/megatron-moe-cp.md §6).
func TestMoEFLOPsAndMemoryMegatronValues(t *testing.T) {
	mixtral := gpt.Config{NumLayers: 32, HiddenSize: 4096, NumAttentionHeads: 32, NumQueryGroups: 8, FFNHiddenSize: 14336,
		Activation: gpt.SwiGLU, VocabSize: 32000, MaxPositionEmbeddings: 4096, Normalization: gpt.RMSNorm,
		DisableBiasLinear: true, UntieEmbeddingsAndOutputWeights: true,
		MoE: gpt.MoEConfig{NumExperts: 8, TopK: 2}}
	qwen := gpt.Config{NumLayers: 24, HiddenSize: 2048, NumAttentionHeads: 16, FFNHiddenSize: 5632,
		Activation: gpt.SwiGLU, VocabSize: 151936, MaxPositionEmbeddings: 4096, DisableBiasLinear: true,
		MoE: gpt.MoEConfig{NumExperts: 64, TopK: 4, FFNHiddenSize: 1408, SharedExpertFFN: 2816, LayerFreq: "2"}}
	for _, c := range []struct {
		name string
		cfg  gpt.Config
		want float64
	}{{"mixtral", mixtral, 3.264776e14}, {"qwen-moe, every other layer", qwen, 4.800270e13}} {
		if err := c.cfg.Validate(); err != nil {
			t.Fatal(err)
		}
		if got := FLOPsPerIteration(c.cfg, 1, 4096); math.Abs(got-c.want) > 5e-7*c.want {
			t.Errorf("%s: FLOPs %.6e, Megatron %.6e", c.name, got, c.want)
		}
	}
	r, err := TheoreticalMemory(MemoryConfig{Model: mixtral, SeqLength: 4096, MicroBatchSize: 1, WorldSize: 64,
		TensorParallel: 2, ExpertParallel: 8, ExpertTensorParallel: 1, DistributedOptimizer: true})
	if err != nil {
		t.Fatal(err)
	}
	if math.Abs(r.TotalParams/1e9-46.70) > 0.005 || math.Abs(r.MostLoadedShardParams/1e9-6.4406) > 5e-5 {
		t.Errorf("params %.4f B, most loaded shard %.4f B; Megatron 46.70 B, 6.4406 B", r.TotalParams/1e9, r.MostLoadedShardParams/1e9)
	}
	if active := (r.ActiveBlockParams + r.EmbeddingParams) / 1e9; math.Abs(active-12.88) > 0.005 {
		t.Errorf("active params %.4f B, Megatron 12.88 B", active)
	}
	if want := 4.740074e10; math.Abs(r.WeightAndOptimizerBytes-want) > 5e-7*want {
		t.Errorf("weight and optimizer %.6e bytes, Megatron %.6e", r.WeightAndOptimizerBytes, want)
	}
}
