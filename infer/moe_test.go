package infer

import (
	"context"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gotron/gotron/ckpt/hf"
	"github.com/gotron/gotron/comm"
	"github.com/gotron/gotron/comm/inproc"
	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/parallel/tp"
	"github.com/gotron/gotron/tensor"
)

// moeTestModel is a small random MoE model: Mixtral-style (8 experts, top-2,
// every layer MoE, grouped GEMM) or Qwen-MoE-style (pre-softmax top-2 of 6,
// a gated shared expert, the first layer dense, one GEMM per expert).
func moeTestModel(t testing.TB, kind string) *gpt.Model {
	t.Helper()
	cfg := gpt.Config{NumLayers: 2, HiddenSize: 32, NumAttentionHeads: 4, NumQueryGroups: 2, FFNHiddenSize: 48,
		VocabSize: 64, MaxPositionEmbeddings: 128, PositionEmbeddingType: gpt.RoPE, Normalization: gpt.RMSNorm,
		Activation: gpt.SwiGLU, DisableBiasLinear: true, UntieEmbeddingsAndOutputWeights: true, InitMethodStd: 0.3,
		MoE: gpt.MoEConfig{NumExperts: 8, TopK: 2, FFNHiddenSize: 24, GroupedGEMM: true}}
	if kind == "qwen-moe" {
		cfg.AddQKVBias = true
		cfg.MoE = gpt.MoEConfig{NumExperts: 6, TopK: 2, FFNHiddenSize: 16, PreSoftmax: true, LayerFreq: "[0,1]",
			SharedExpertFFN: 24, SharedExpertGate: true}
	}
	m, err := gpt.New(cfg, tensor.NewRNG(11))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestEngineMoEGreedyMatchesForward: MoE models decode in the engine, many
// requests batched in each step (every layer's experts run once per step
// over all the step's tokens, grouped by expert), and each request's greedy
// tokens equal the argmax of the full forward pass (the training code path,
// no cache) over its prompt and the tokens so far — with the model's and
// with packed weights.
func TestEngineMoEGreedyMatchesForward(t *testing.T) {
	for _, kind := range []string{"mixtral", "qwen-moe"} {
		for _, layout := range []WeightLayout{WeightsModel, WeightsPacked} {
			t.Run(kind+"/"+layout.String(), func(t *testing.T) {
				m := moeTestModel(t, kind)
				e := mustEngine(t, m, EngineConfig{Weights: layout, MaxNumBatchedTokens: 24, BlockTokens: 4})
				prompts := map[SeqID][]int32{}
				n := 8
				for i := range 6 {
					p := testPrompt(3+5*i, 200+i, 64)
					id, err := e.Add(Request{Prompt: p, MaxTokens: n, Sampling: Sampling{TopK: 1}})
					if err != nil {
						t.Fatal(err)
					}
					prompts[id] = p
				}
				got, _ := drain(t, e)
				if st := e.Stats(); st.Steps >= st.BatchedTokens {
					t.Errorf("%d steps for %d tokens: no batching", st.Steps, st.BatchedTokens)
				}
				checkNoLeak(t, e)
				for id, p := range prompts {
					if len(got[id]) != n {
						t.Fatalf("request %d: %d tokens, want %d", id, len(got[id]), n)
					}
					seq := slices.Clone(p)
					for j, tok := range got[id] {
						logits := m.Forward(nil, gpt.Batch{Tokens: tensor.FromInt32(slices.Clone(seq), 1, len(seq))}, nil, false).Float32s()
						V := m.Config.VocabSize
						if want := argmax(logits[(len(seq)-1)*V:]); tok != want {
							t.Fatalf("request %d token %d: engine %d, full-forward argmax %d", id, j, tok, want)
						}
						seq = append(seq, int32(tok))
					}
				}
			})
		}
	}
}

// TestEngineMoEMatchesGenerate: a lone request decodes in the engine as
// Generate (gotron generate) does, greedy and sampled.
func TestEngineMoEMatchesGenerate(t *testing.T) {
	for _, kind := range []string{"mixtral", "qwen-moe"} {
		t.Run(kind, func(t *testing.T) {
			testGreedyMatchesGenerate(t, moeTestModel(t, kind), EngineConfig{Weights: WeightsModel})
		})
	}
}

// TestEngineMoEConvertedCheckpoints: imported Mixtral, Qwen2-MoE and
// Qwen3-MoE checkpoints decode in the engine as Generate does.
func TestEngineMoEConvertedCheckpoints(t *testing.T) {
	for _, dir := range []string{"mixtral_gqa_untied_f32", "qwen2_moe_untied_f32", "qwen3_moe_untied_f32"} {
		t.Run(dir, func(t *testing.T) {
			m, _, err := hf.LoadModel(filepath.Join("..", "ckpt", "hf", "testdata", dir))
			if err != nil {
				t.Fatal(err)
			}
			e := mustEngine(t, m, EngineConfig{BlockTokens: 4, Weights: WeightsModel})
			want := map[SeqID][]int{}
			for i := range 4 {
				prompt := testPrompt(2+i, 40+i, 100)
				id, err := e.Add(Request{Prompt: prompt, MaxTokens: 6, Sampling: Sampling{TopK: 1}})
				if err != nil {
					t.Fatal(err)
				}
				want[id] = generateAlone(t, m, prompt, 6, Sampling{TopK: 1})
			}
			got, _ := drain(t, e)
			for id, w := range want {
				if !slices.Equal(got[id], w) {
					t.Errorf("request %d: engine %v, generate %v", id, got[id], w)
				}
			}
			checkNoLeak(t, e)
		})
	}
}

// TestEngineMoECapacityRefused: a model that drops tokens by capacity is
// refused (its outputs would depend on the batch).
func TestEngineMoECapacityRefused(t *testing.T) {
	m := moeTestModel(t, "mixtral")
	m.Config.MoE.CapacityFactor = 1
	if _, err := NewEngine(m, EngineConfig{}); err == nil || !strings.Contains(err.Error(), "--moe-expert-capacity-factor 1") {
		t.Fatalf("err = %v, want the capacity factor named", err)
	}
}

// TestPackedBytesMoE: the packed-weight estimate of an MoE model counts
// the weights PackLinears packs (attention, dense MLPs, routers, shared
// experts and gates, the output layer), not the experts' (used in place).
func TestPackedBytesMoE(t *testing.T) {
	m := moeTestModel(t, "qwen-moe")
	var n int
	for _, l := range m.Layers {
		n += l.QKV.Numel() + l.Proj.Numel()
		if l.MoE == nil {
			n += l.FC1.Numel() + l.FC2.Numel()
			continue
		}
		n += l.MoE.Router.Numel() + l.MoE.SharedFC1.Numel() + l.MoE.SharedFC2.Numel() + l.MoE.Gate.Numel()
	}
	n += m.OutputLayer.Numel()
	if got := PackedBytes(m, EngineConfig{}); got != int64(4*n) {
		t.Fatalf("PackedBytes = %d, want %d", got, 4*n)
	}
	if got := PackedBytes(m, EngineConfig{BF16: true}); got != int64(2*n) {
		t.Fatalf("PackedBytes bf16 = %d, want %d", got, 2*n)
	}
}

// TestTensorParallelMoEMatchesOneRank: MoE models split over 2
// tensor-parallel ranks (attention as the dense models'; each routed
// expert's fc1 rows and fc2 columns over the ranks, Megatron's expert
// tensor parallelism with its size the TP size; the shared expert as the
// dense MLP; the router replicated, so every rank picks the same experts;
// the partial outputs all-reduced) generate one process's tokens, with
// log-probabilities within 1e-5: gotron's Mixtral- and Qwen-MoE-style
// models and the imported Mixtral, Qwen2-MoE (gated shared expert),
// Qwen3-MoE (both also with dense layers between the MoE ones, tied),
// DeepSeek-V2 (multi-latent attention, two shared experts, the first layer
// dense) and DeepSeek-V3 (grouped sigmoid routing with expert bias)
// fixtures.
func TestTensorParallelMoEMatchesOneRank(t *testing.T) {
	models := map[string]func(t *testing.T) *gpt.Model{
		"mixtral":  func(t *testing.T) *gpt.Model { return moeTestModel(t, "mixtral") },
		"qwen-moe": func(t *testing.T) *gpt.Model { return moeTestModel(t, "qwen-moe") },
	}
	for _, dir := range []string{"mixtral_gqa_untied_f32", "qwen2_moe_untied_f32", "qwen2_moe_step2_tied_f32", "qwen3_moe_untied_f32",
		"qwen3_moe_step2_tied_f32", "deepseek_v2_tied_f32", "deepseek_v3_untied_f32"} {
		models[dir] = func(t *testing.T) *gpt.Model {
			m, _, err := hf.LoadModel(filepath.Join("..", "ckpt", "hf", "testdata", dir))
			if err != nil {
				t.Fatal(err)
			}
			return m
		}
	}
	for _, name := range slices.Sorted(maps.Keys(models)) {
		t.Run(name, func(t *testing.T) {
			m := models[name](t)
			cfg := EngineConfig{MaxNumBatchedTokens: 24, BlockTokens: 4}
			eng, err := NewEngine(m, cfg)
			if err != nil {
				t.Fatal(err)
			}
			// tpRequests, the prompts cut to the fixtures' 32 positions
			reqs := tpRequests()
			for i := range reqs {
				if n := m.Config.MaxPositionEmbeddings - reqs[i].MaxTokens; len(reqs[i].Prompt) > n {
					reqs[i].Prompt = reqs[i].Prompt[:n]
				}
			}
			want, err := runRequests(t, eng, reqs)
			if err != nil {
				t.Fatal(err)
			}
			compareRuns(t, runTP(t, m, 2, cfg, reqs), want, 1e-5)
		})
	}
}

// TestTensorParallelMoERefused: an MoE model's tensor-parallel slice is
// served only with its experts split over the ranks, once; an expert size
// the ranks do not divide is refused naming the flag.
func TestTensorParallelMoERefused(t *testing.T) {
	m := moeTestModel(t, "mixtral")
	err := inproc.Run(context.Background(), 2, func(ctx context.Context, pg comm.ProcessGroup) error {
		sliced, err := gpt.Parallelize(m, &tp.Region{Group: pg}, nil)
		if err != nil {
			return err
		}
		if _, err := NewEngine(sliced, EngineConfig{}); err == nil || !strings.Contains(err.Error(), "experts whole") {
			return fmt.Errorf("experts whole: NewEngine error %v", err)
		}
		if err := sliced.SplitExpertsOverTP(); err != nil {
			return err
		}
		if err := sliced.SplitExpertsOverTP(); err == nil || !strings.Contains(err.Error(), "split already") {
			return fmt.Errorf("split twice: error %v", err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.SplitExpertsOverTP(); err == nil || !strings.Contains(err.Error(), "not split over tensor-parallel ranks") {
		t.Errorf("one rank's model: error %v", err)
	}
	cfg := m.Config
	cfg.MoE.FFNHiddenSize = 9
	odd, err := gpt.New(cfg, tensor.NewRNG(1))
	if err != nil {
		t.Fatal(err)
	}
	err = inproc.Run(context.Background(), 2, func(ctx context.Context, pg comm.ProcessGroup) error {
		sliced, err := gpt.Parallelize(odd, &tp.Region{Group: pg}, nil)
		if err != nil {
			return err
		}
		return sliced.SplitExpertsOverTP()
	})
	if err == nil || !strings.Contains(err.Error(), "--moe-ffn-hidden-size=9 is not divisible by --tensor-model-parallel-size=2") {
		t.Errorf("moe ffn 9 over 2 ranks: error %v", err)
	}
}
