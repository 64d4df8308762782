package train

import (
	"strings"
	"testing"

	"github.com/gotron/gotron/model/gpt"
)

// Architectures of the reference layouts (VocabSize is the padded vocabulary).
var (
	memGPT3175B = gpt.Config{NumLayers: 96, HiddenSize: 12288, NumAttentionHeads: 96, VocabSize: 51200}
	memGPT2124M = gpt.Config{NumLayers: 12, HiddenSize: 768, NumAttentionHeads: 12, VocabSize: 50304}
	memLlama38B = gpt.Config{NumLayers: 32, HiddenSize: 4096, NumAttentionHeads: 32, NumQueryGroups: 8, FFNHiddenSize: 14336,
		VocabSize: 128256, Activation: gpt.SwiGLU, Normalization: gpt.RMSNorm, UntieEmbeddingsAndOutputWeights: true}
	memLlama27B = gpt.Config{NumLayers: 32, HiddenSize: 4096, NumAttentionHeads: 32, FFNHiddenSize: 11008,
		VocabSize: 32000, Activation: gpt.SwiGLU, Normalization: gpt.RMSNorm, UntieEmbeddingsAndOutputWeights: true}
	memTiny = gpt.Config{NumLayers: 4, HiddenSize: 256, NumAttentionHeads: 4, VocabSize: 50304}
)

// memoryReferences are layouts with the bytes and the verbose report of
// Megatron's report_theoretical_memory (megatron/training/
// theoretical_memory_usage.py at d98e8a6) for the same args; the bytes are
// also derived by hand in the comments (MB = 2^20 bytes).
var memoryReferences = []struct {
	name                         string
	cfg                          MemoryConfig
	weightBytes, activationBytes float64
	report                       string
}{
	{
		// GPT-3 175B as examples/gpt3/train_gpt3_175b_distributed.sh (TP8 PP16), on 1024 GPUs (DP8), SP,
		// distributed optimizer, selective recompute, GBS 1536 → M = 1536/(1·8) = 192 microbatches.
		// Per layer: attention 2h²(1+1)·1 = 4h² = 603979776, MLP 2h·4h = 1207959552, norms 2h·2 = 49152.
		// Block 96·(12h²+4h) + 2h = 173950918656; embedding hV = 629145600; total 174580064256.
		// Most loaded: (96·12h²/16 + hV)/8 + (96·4h + 2h)/16 = 1437597696 + 296448 = 1437894144.
		// Other stages: 96·12h²/(16·8) + 296448 = 1358954496 + 296448 = 1359250944.
		// Weights: 1437894144 · (6 + 12/8) = 10784206080 B = 10284.62 MB.
		// Activations (SP formula): sbh(18 + 4·4) = 2048·12288·34 = 855638016 per layer (816/8 = 102.0 MB);
		// ·96 + 8·s·b·16 + s·b·h·16 = 82141249536 + 262144 + 402653184 = 82544164864; ·min(1, 192/16) = 1;
		// /TP = 10318020608 B = 9840.03 MB.
		name: "gpt3-175b TP8 PP16 DP8 SP selective distopt",
		cfg: MemoryConfig{Model: memGPT3175B, SeqLength: 2048, MicroBatchSize: 1, WorldSize: 1024, TensorParallel: 8, PipelineParallel: 16,
			SequenceParallel: true, RecomputeGranularity: RecomputeSelective, DistributedOptimizer: true, NumMicrobatches: 192},
		weightBytes: 10784206080, activationBytes: 10318020608,
		report: `Number of parameters in transformer block in billions:  173.95
Number of active parameters in transformer block in billions:  173.95
Number of parameters in embedding layers in billions: 0.63
Total number of parameters in billions: 174.58
Total number of active parameters in billions: 174.58
Number of parameters in most loaded shard in billions: 1.4379
Number of parameters in other shards in billions: 1.3593
compute_activation_memory with SP
Activation memory footprint per transformer layer: 102.0 MB
Number of in-flight microbatches: 16
Theoretical memory footprints: weight and optimizer=10284.62 MB, activation=9840.03 MB, total=20124.65 MB

`,
	},
	{
		// GPT-3 175B, TP8 PP8 with 3 virtual stages per rank (4 layers each), 512 GPUs (DP8).
		// Most loaded: (96·12h²/8 + hV)/8 + 4743168/8 = 2796552192 + 592896 = 2797145088; other 2717908992 + 592896.
		// Weights: 2797145088 · 7.5 = 20978588160 B = 20006.74 MB.
		// Activations: 82141249536 + 8·2048·8 + 2048·12288·8 = 82342707200; penalty 1 + 7/(8·3) = 1.2917
		// (in flight ⌈1.2917·8⌉ = 11); ·penalty/8 = 13294916266.67 B = 12679.02 MB. M is ignored when interleaved.
		name: "gpt3-175b TP8 PP8 VP3 DP8 SP selective distopt",
		cfg: MemoryConfig{Model: memGPT3175B, SeqLength: 2048, MicroBatchSize: 1, WorldSize: 512, TensorParallel: 8, PipelineParallel: 8,
			VirtualPipeline: 3, SequenceParallel: true, RecomputeGranularity: RecomputeSelective, DistributedOptimizer: true, NumMicrobatches: 192},
		weightBytes: 20978588160, activationBytes: 13294916266.666668,
		report: `Number of parameters in transformer block in billions:  173.95
Number of active parameters in transformer block in billions:  173.95
Number of parameters in embedding layers in billions: 0.63
Total number of parameters in billions: 174.58
Total number of active parameters in billions: 174.58
Number of parameters in most loaded shard in billions: 2.7971
Number of parameters in other shards in billions: 2.7185
compute_activation_memory with SP
Activation memory footprint per transformer layer: 102.0 MB
Memory penalty from interleaved schedule: 1.29
Number of in-flight microbatches: 11
Theoretical memory footprints: weight and optimizer=20006.74 MB, activation=12679.02 MB, total=32685.76 MB

`,
	},
	{
		// GPT-2 124M on one process, micro batch 4, no recompute: 18 bytes per parameter, the without-SP formula.
		// Per layer 12h² + 4h = 7080960; block 12·7080960 + 2h = 84973056; embedding hV = 38633472.
		// Shard (TP=PP=1): 12·12h² + hV + 12·4h + 2h = 123606528; ·18 = 2224917504 B = 2121.85 MB.
		// Activations: sbh(10 + 24/1) = 1024·4·768·34 = 106954752 (102.0 MB) per layer; ·12 + 8sb + sbh =
		// 1286635520; + 2(sbV/1 + sbh) = 418381824 → 1705017344; ·1.05 = 1790268211.2 B = 1707.33 MB.
		name:        "gpt2-124m single process",
		cfg:         MemoryConfig{Model: memGPT2124M, SeqLength: 1024, MicroBatchSize: 4, WorldSize: 1},
		weightBytes: 2224917504, activationBytes: 1790268211.2,
		report: `Number of parameters in transformer block in billions:  0.08
Number of active parameters in transformer block in billions:  0.08
Number of parameters in embedding layers in billions: 0.04
Total number of parameters in billions: 0.12
Total number of active parameters in billions: 0.12
Number of parameters in most loaded shard in billions: 0.1236
compute_activation_memory_without_sp
Activation memory footprint per transformer layer (precise, without SP): 102.0 MB
Theoretical memory footprints: weight and optimizer=2121.85 MB, activation=1707.33 MB, total=3829.18 MB

`,
	},
	{
		// Llama-3 8B (GQA g=8, SwiGLU f=14336, RMSNorm, untied), TP2 CP2 on 16 GPUs (DP4), SP, selective, distopt.
		// Attention 2h²(1 + 8/32) = 41943040; MLP 2·h·f·3/2 = 176160768; norms 2h = 8192; final norm h.
		// Block 32·218112000 + 4096 = 6979588096; embedding 2·hV = 1050673152 (untied).
		// Shard: (32·218103808 + hV)/2 + 32·8192 + 4096 = 3752329216 + 266240, + hV/2 = 262668288 (untied, PP=1)
		// = 4015263744; ·(6 + 12/4) = 36137373696 B = 34463.29 MB.
		// Activations: sbh(18 + 4·3.5) = 8192·4096·32 = 1073741824 (1024/2 = 512.0 MB) per layer; ·32 + 8s + sh
		// = 34393358336; + 4sh(1 + V/h) = 4336910336 → 38730268672; /2 = 19365134336 B = 18468.03 MB
		// (CP does not shorten s in Megatron's formula).
		name: "llama3-8b TP2 CP2 DP4 GQA SwiGLU untied SP selective distopt",
		cfg: MemoryConfig{Model: memLlama38B, SeqLength: 8192, MicroBatchSize: 1, WorldSize: 16, TensorParallel: 2, ContextParallel: 2,
			SequenceParallel: true, RecomputeGranularity: RecomputeSelective, DistributedOptimizer: true},
		weightBytes: 36137373696, activationBytes: 19365134336,
		report: `Number of parameters in transformer block in billions:  6.98
Number of active parameters in transformer block in billions:  6.98
Number of parameters in embedding layers in billions: 1.05
Total number of parameters in billions: 8.03
Total number of active parameters in billions: 8.03
Number of parameters in most loaded shard in billions: 4.0153
compute_activation_memory with SP
Activation memory footprint per transformer layer: 512.0 MB
Theoretical memory footprints: weight and optimizer=34463.29 MB, activation=18468.03 MB, total=52931.32 MB

`,
	},
	{
		// Llama-2 7B (SwiGLU f=11008, RMSNorm, untied), TP4 PP2 on 32 GPUs (DP4), micro batch 2, M = 2, no SP,
		// Adam without distributed optimizer. Attention 4h² = 67108864; MLP 2·h·f·1.5 = 135266304.
		// Shard: (32·202375168/2 + hV)/4 + (32·8192 + 4096)/2 = 842268672 + 133120 = 842401792 (untied
		// output not added: PP > 1); ·18 = 15163232256 B = 14460.79 MB.
		// Activations: sbh(10 + 24/4) = 4096·2·4096·16 = 536870912 (512.0 MB) per layer; ·32 + 8sb·2 + sbh·2
		// = 17247109120; ·min(1, 2/2); ·1.05 = 18109464576 B = 17270.53 MB.
		name: "llama2-7b TP4 PP2 DP4 no SP",
		cfg: MemoryConfig{Model: memLlama27B, SeqLength: 4096, MicroBatchSize: 2, WorldSize: 32, TensorParallel: 4, PipelineParallel: 2,
			NumMicrobatches: 2},
		weightBytes: 15163232256, activationBytes: 18109464576,
		report: `Number of parameters in transformer block in billions:  6.48
Number of active parameters in transformer block in billions:  6.48
Number of parameters in embedding layers in billions: 0.26
Total number of parameters in billions: 6.74
Total number of active parameters in billions: 6.74
Number of parameters in most loaded shard in billions: 0.8424
Number of parameters in other shards in billions: 0.8096
compute_activation_memory_without_sp
Activation memory footprint per transformer layer (precise, without SP): 512.0 MB
Number of in-flight microbatches: 2
Theoretical memory footprints: weight and optimizer=14460.79 MB, activation=17270.53 MB, total=31731.32 MB

`,
	},
	{
		// The MLA configs' model (test_gpt3_mcore_te_tp2_pp2_mla: GPT-2's vocabulary padded to
		// 50432 at TP 2, untied, LayerNorm) at TP2 PP2 SP without selective recompute, and a
		// plain-query RMSNorm one: Megatron's multi_latent_attention self_attn_term, from its
		// report_theoretical_memory run out of tree on the same args.
		name: "mla config TP2 PP2 SP",
		cfg: MemoryConfig{Model: gpt.Config{NumLayers: 4, HiddenSize: 512, NumAttentionHeads: 8, VocabSize: 50432,
			UntieEmbeddingsAndOutputWeights: true, MLA: mlaDims(192, 64, 16, 8, 16)},
			SeqLength: 1024, MicroBatchSize: 4, WorldSize: 8, TensorParallel: 2, PipelineParallel: 2, SequenceParallel: true, NumMicrobatches: 4},
		weightBytes: 274802688, activationBytes: 198249676.8,
		report: `Number of parameters in transformer block in billions:  0.01
Number of active parameters in transformer block in billions:  0.01
Number of parameters in embedding layers in billions: 0.05
Total number of parameters in billions: 0.06
Total number of active parameters in billions: 0.06
Number of parameters in most loaded shard in billions: 0.0153
Number of parameters in other shards in billions: 0.0024
compute_activation_memory_without_sp
Activation memory footprint per transformer layer (precise, without SP): 44.0 MB
Number of in-flight microbatches: 2
Theoretical memory footprints: weight and optimizer=262.07 MB, activation=189.07 MB, total=451.14 MB

`,
	},
	{
		name: "mla plain q RMSNorm",
		cfg: MemoryConfig{Model: gpt.Config{NumLayers: 2, HiddenSize: 256, NumAttentionHeads: 4, VocabSize: 1024,
			Normalization: gpt.RMSNorm, MLA: mlaDims(0, 32, 32, 16, 48)},
			SeqLength: 128, MicroBatchSize: 2, WorldSize: 1, NumMicrobatches: 1},
		weightBytes: 27967104, activationBytes: 5438361.600000001,
		report: `Number of parameters in transformer block in billions:  0.00
Number of active parameters in transformer block in billions:  0.00
Number of parameters in embedding layers in billions: 0.00
Total number of parameters in billions: 0.00
Total number of active parameters in billions: 0.00
Number of parameters in most loaded shard in billions: 0.0016
compute_activation_memory_without_sp
Activation memory footprint per transformer layer (precise, without SP): 2.1 MB
Theoretical memory footprints: weight and optimizer=26.67 MB, activation=5.19 MB, total=31.86 MB

`,
	},
	{
		// The tiny preset on 4 data-parallel ranks asking for SP + selective: SP is off at TP=1 (Megatron
		// disables it), so the without-SP formula applies. Shard 4·(12h² + 4h) + 2h + hV = 16028160;
		// ·(6 + 12/4) = 144253440 B = 137.57 MB. Activations: 256·8·256·34 = 17825792 per layer;
		// ·4 + 8sb + sbh = 71843840; + 2(sbV + sbh) = 207093760; ·1.05 = 292884480 B = 279.32 MB.
		name: "tiny DP4 SP requested at TP1",
		cfg: MemoryConfig{Model: memTiny, SeqLength: 256, MicroBatchSize: 8, WorldSize: 4,
			SequenceParallel: true, RecomputeGranularity: RecomputeSelective, DistributedOptimizer: true},
		weightBytes: 144253440, activationBytes: 292884480,
		report: `Number of parameters in transformer block in billions:  0.00
Number of active parameters in transformer block in billions:  0.00
Number of parameters in embedding layers in billions: 0.01
Total number of parameters in billions: 0.02
Total number of active parameters in billions: 0.02
Number of parameters in most loaded shard in billions: 0.0160
compute_activation_memory_without_sp
Activation memory footprint per transformer layer (precise, without SP): 17.0 MB
Theoretical memory footprints: weight and optimizer=137.57 MB, activation=279.32 MB, total=416.89 MB

`,
	},
}

// TestMemoryMatchesMegatronReport checks report_theoretical_memory: the
// bytes bit for bit (same floating-point operations in the same order) and
// the verbose report line for line.
func TestMemoryMatchesMegatronReport(t *testing.T) {
	for _, ref := range memoryReferences {
		t.Run(ref.name, func(t *testing.T) {
			r, err := TheoreticalMemory(ref.cfg)
			if err != nil {
				t.Fatal(err)
			}
			if r.WeightAndOptimizerBytes != ref.weightBytes {
				t.Errorf("weight and optimizer: %.17g bytes, want %.17g", r.WeightAndOptimizerBytes, ref.weightBytes)
			}
			if r.ActivationBytes != ref.activationBytes {
				t.Errorf("activation: %.17g bytes, want %.17g", r.ActivationBytes, ref.activationBytes)
			}
			var b strings.Builder
			if _, err := r.WriteTo(&b); err != nil {
				t.Fatal(err)
			}
			if b.String() != ref.report {
				t.Errorf("report:\n%s\nwant (Megatron's):\n%s", b.String(), ref.report)
			}
		})
	}
}

// TestMemoryGPT3ParameterCounts checks the 175B counts derived by hand in
// memoryReferences' first comment.
func TestMemoryGPT3ParameterCounts(t *testing.T) {
	r, err := TheoreticalMemory(memoryReferences[0].cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name      string
		got, want float64
	}{
		{"transformer block", r.TransformerBlockParams, 173950918656},
		{"embedding", r.EmbeddingParams, 629145600},
		{"total", r.TotalParams, 174580064256},
		{"most loaded shard", r.MostLoadedShardParams, 1437894144},
		{"other shards", r.OtherShardParams, 1359250944},
		{"bytes per parameter", r.BytesPerParam, 7.5},
	} {
		if c.got != c.want {
			t.Errorf("%s: %.17g, want %.17g", c.name, c.got, c.want)
		}
	}
}

// TestMemoryMegatronRules checks the rules of theoretical_memory_usage.py
// one at a time, each as a relation between two layouts.
func TestMemoryMegatronRules(t *testing.T) {
	base := MemoryConfig{Model: memGPT3175B, SeqLength: 2048, MicroBatchSize: 1, WorldSize: 1024, TensorParallel: 8, PipelineParallel: 16,
		SequenceParallel: true, RecomputeGranularity: RecomputeSelective, DistributedOptimizer: true, NumMicrobatches: 192}
	with := func(f func(c *MemoryConfig)) MemoryReport {
		t.Helper()
		c := base
		f(&c)
		r, err := TheoreticalMemory(c)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	b := with(func(*MemoryConfig) {})
	cases := []struct {
		rule      string
		got, want float64
	}{
		{"18 bytes per parameter without the distributed optimizer",
			with(func(c *MemoryConfig) { c.DistributedOptimizer = false }).BytesPerParam, 18},
		{"6 + 12/DP bytes per parameter with it (DP = 1024/(8·16) = 8)", b.BytesPerParam, 6 + 12.0/8},
		{"context parallelism only shrinks DP (CP2: DP4, 6 + 12/4 bytes)",
			with(func(c *MemoryConfig) { c.ContextParallel = 2 }).BytesPerParam, 9},
		{"context parallelism leaves activations alone",
			with(func(c *MemoryConfig) { c.ContextParallel = 2 }).ActivationBytes, b.ActivationBytes},
		{"non-interleaved PP scales activations by min(1, M/PP): M=4 of PP16",
			with(func(c *MemoryConfig) { c.NumMicrobatches = 4 }).ActivationBytes, b.ActivationBytes * 4 / 16},
		{"unknown M (tools/report_theoretical_memory.py) counts PP in flight",
			with(func(c *MemoryConfig) { c.NumMicrobatches = 0 }).ActivationBytes, b.ActivationBytes},
		{"full recompute is costed as no recompute",
			with(func(c *MemoryConfig) { c.RecomputeGranularity = RecomputeFull }).ActivationBytes,
			with(func(c *MemoryConfig) { c.RecomputeGranularity = RecomputeNone }).ActivationBytes},
		{"SP without selective recompute uses the without-SP formula",
			with(func(c *MemoryConfig) { c.RecomputeGranularity = RecomputeNone }).ActivationBytes,
			with(func(c *MemoryConfig) { c.SequenceParallel, c.RecomputeGranularity = false, RecomputeNone }).ActivationBytes},
		{"one virtual stage is no interleaving",
			with(func(c *MemoryConfig) { c.VirtualPipeline = 1 }).ActivationBytes, b.ActivationBytes},
		{"untied output weight not on the first stage when PP > 1",
			with(func(c *MemoryConfig) { c.Model.UntieEmbeddingsAndOutputWeights = true }).MostLoadedShardParams, b.MostLoadedShardParams},
		{"untied output weight doubles the embedding count",
			with(func(c *MemoryConfig) { c.Model.UntieEmbeddingsAndOutputWeights = true }).EmbeddingParams, 2 * b.EmbeddingParams},
		{"weights do not depend on the micro batch",
			with(func(c *MemoryConfig) { c.MicroBatchSize = 4 }).WeightAndOptimizerBytes, b.WeightAndOptimizerBytes},
	}
	for _, c := range cases {
		if c.got != c.want {
			t.Errorf("%s: got %.17g, want %.17g", c.rule, c.got, c.want)
		}
	}
}

// TestMemoryValidateNamesFlags checks that impossible layouts are refused
// with the flags named, as Megatron's arguments.py asserts.
func TestMemoryValidateNamesFlags(t *testing.T) {
	ok := MemoryConfig{Model: memTiny, SeqLength: 256, MicroBatchSize: 1, WorldSize: 8}
	cases := []struct {
		name  string
		edit  func(c *MemoryConfig)
		wants []string
	}{
		{"world size not divisible by TP·PP·CP", func(c *MemoryConfig) { c.TensorParallel, c.PipelineParallel, c.ContextParallel = 2, 2, 3 },
			[]string{"--world-size=8", "--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--context-parallel-size", "2×2×3 = 12"}},
		{"no world size", func(c *MemoryConfig) { c.WorldSize = 0 }, []string{"--world-size=0"}},
		{"no sequence length", func(c *MemoryConfig) { c.SeqLength = 0 }, []string{"--seq-length=0"}},
		{"no micro batch", func(c *MemoryConfig) { c.MicroBatchSize = -1 }, []string{"--micro-batch-size=-1"}},
		{"negative TP", func(c *MemoryConfig) { c.TensorParallel = -2 }, []string{"--tensor-model-parallel-size=-2"}},
		{"interleaving without PP", func(c *MemoryConfig) { c.VirtualPipeline = 2 }, []string{"--pipeline-model-parallel-size > 1"}},
		{"unknown recompute granularity", func(c *MemoryConfig) { c.RecomputeGranularity = 7 }, []string{"--recompute-granularity=RecomputeGranularity(7)"}},
		{"layers not dividing into stages", func(c *MemoryConfig) { c.PipelineParallel = 8 }, []string{"--num-layers=4", "--pipeline-model-parallel-size=8"}},
		{"heads not dividing hidden", func(c *MemoryConfig) { c.Model.NumAttentionHeads = 3 }, []string{"--num-attention-heads=3"}},
	}
	for _, c := range cases {
		cfg := ok
		c.edit(&cfg)
		_, err := TheoreticalMemory(cfg)
		if err == nil {
			t.Errorf("%s: no error", c.name)
			continue
		}
		for _, w := range c.wants {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %q does not name %q", c.name, err, w)
			}
		}
	}
	if _, err := TheoreticalMemory(ok); err != nil {
		t.Errorf("valid layout refused: %v", err)
	}
}
