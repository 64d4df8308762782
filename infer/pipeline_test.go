package infer

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/gotron/gotron/comm"
	"github.com/gotron/gotron/comm/inproc"
	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/parallel"
	"github.com/gotron/gotron/tensor"
)

// ppTestModel is tpTestModel with four layers, so two and four pipeline
// stages divide it.
func ppTestModel(t testing.TB, kind string) *gpt.Model {
	t.Helper()
	c := tpTestModel(t, kind).Config
	c.NumLayers = 4
	m, err := gpt.New(c, tensor.NewRNG(11))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// ppRequests are tpRequests with a sampled request (the stages' samplers
// must advance alike) and one asking for the prompt's top tokens.
func ppRequests() []Request {
	reqs := tpRequests()
	reqs = append(reqs,
		Request{Prompt: testPrompt(9, 7, 64), MaxTokens: 10, Sampling: Sampling{Temperature: 0.9, Seed: 3}, Logprobs: true},
		Request{Prompt: testPrompt(6, 8, 64), MaxTokens: 4, Sampling: Sampling{TopK: 1}, TopLogprobs: 2, PromptLogprobs: true, PromptTopLogprobs: true})
	return reqs
}

// runPP runs reqs on tpSize×ppSize ranks in one process (an inproc world,
// Megatron's rank order: tensor-parallel ranks fastest): each rank holds
// its tensor-parallel slice of its pipeline stage, and rank 0 leads the
// lockstep. It returns the leader's events.
func runPP(t *testing.T, m *gpt.Model, tpSize, ppSize int, cfg EngineConfig, reqs []Request) (tpRun, error) {
	t.Helper()
	var got tpRun
	err := inproc.Run(context.Background(), tpSize*ppSize, func(ctx context.Context, world comm.ProcessGroup) error {
		g, err := parallel.NewGroups(world, parallel.Config{TP: tpSize, PP: ppSize})
		if err != nil {
			return err
		}
		model := m
		if tpSize > 1 {
			if model, err = sliceForDecoding(m, g.TP); err != nil {
				return err
			}
		}
		stages, err := gpt.SplitStages(model, gpt.PipelineSplit{PP: ppSize}, g.Coords.PP)
		if err != nil {
			return err
		}
		eng, err := NewPipelineEngine(PipelineStage{Stage: stages[0], Group: g.PP, Ctx: ctx}, cfg)
		if err != nil {
			return err
		}
		return leadOrFollow(ctx, t, eng, world, reqs, &got)
	})
	return got, err
}

// TestPipelineParallelEngineMatchesOneRank: a model cut into 2 and 4
// pipeline stages (and 2 tensor-parallel ranks × 2 stages), each stage
// caching its own layers, gives one process's tokens — greedy and sampled,
// prefill chunks and decodes mixed in steps — and its log-probabilities,
// prompt ones included: the same bits with pipeline stages alone, within
// TP's 1e-5 with tensor-parallel stages; also when a small KV pool preempts
// sequences (the stages preempt alike, from their replicated state).
func TestPipelineParallelEngineMatchesOneRank(t *testing.T) {
	for _, kind := range []string{"gpt2", "llama"} {
		m := ppTestModel(t, kind)
		for _, cfg := range []EngineConfig{
			{MaxNumBatchedTokens: 24, BlockTokens: 4},
			// 14 blocks of 4 tokens: the requests preempt each other
			{MaxNumBatchedTokens: 24, BlockTokens: 4, KVCacheBytes: 14 * 4 * int64(2*4*m.QueryGroupsHere()*m.Config.KVChannels*4)},
		} {
			eng, err := NewEngine(m, cfg)
			if err != nil {
				t.Fatal(err)
			}
			want, err := runRequests(t, eng, ppRequests())
			if err != nil {
				t.Fatal(err)
			}
			preempted := eng.Stats().Preemptions
			for _, l := range [][2]int{{1, 2}, {1, 4}, {2, 2}} {
				t.Run(fmt.Sprintf("%s/tp%d_pp%d/kv%d", kind, l[0], l[1], cfg.KVCacheBytes), func(t *testing.T) {
					c := cfg
					// Each rank's pool holds its own layers and heads:
					// the same bytes per layer and head give the same
					// blocks.
					c.KVCacheBytes = cfg.KVCacheBytes / int64(l[0]*l[1])
					if cfg.KVCacheBytes > 0 && preempted == 0 {
						t.Fatalf("the small pool preempted nothing on one rank")
					}
					got, err := runPP(t, m, l[0], l[1], c, ppRequests())
					if err != nil {
						t.Fatal(err)
					}
					// The stages run one process's ops in its order: the
					// same bits. Tensor parallelism inside the stages
					// reorders sums, as at TP alone (1e-5 there).
					tol := 0.0
					if l[0] > 1 {
						tol = 1e-5
					}
					compareRuns(t, got, want, tol)
				})
			}
		}
	}
}

// TestPipelineParallelRefusals: what does not decode is refused by name.
func TestPipelineParallelRefusals(t *testing.T) {
	m := ppTestModel(t, "gpt2")
	err := inproc.Run(context.Background(), 2, func(ctx context.Context, pg comm.ProcessGroup) error {
		stages, err := gpt.SplitStages(m, gpt.PipelineSplit{PP: 2, VPP: 2}, pg.Rank())
		if err != nil {
			return err
		}
		if _, err := NewPipelineEngine(PipelineStage{Stage: stages[1], Group: pg}, EngineConfig{}); err == nil || !strings.Contains(err.Error(), "interleaved virtual pipeline stages do not decode") {
			return fmt.Errorf("a second model chunk: %v", err)
		}
		other, err := gpt.SplitStages(m, gpt.PipelineSplit{PP: 2}, 1-pg.Rank())
		if err != nil {
			return err
		}
		if _, err := NewPipelineEngine(PipelineStage{Stage: other[0], Group: pg}, EngineConfig{}); err == nil || !strings.Contains(err.Error(), "want the stage's own rank") {
			return fmt.Errorf("another rank's stage: %v", err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestPipelineParallelMLA: multi-latent attention models, caching per-head
// keys and values or the latents (--cache-mla-latents), give one process's
// tokens and log-probabilities at PP=2, each stage caching its layers the
// way the whole model does.
func TestPipelineParallelMLA(t *testing.T) {
	for _, kind := range mlaKinds {
		t.Run(kind, func(t *testing.T) {
			m := mlaTestModel(t, kind)
			stages, err := gpt.SplitStages(m, gpt.PipelineSplit{PP: 2}, 1)
			if err != nil {
				t.Fatal(err)
			}
			if got, want := stages[0].DecodeModel().KVBytesPerToken(), m.KVBytesPerToken()/2; got != want {
				t.Fatalf("a stage of one of two layers caches %d bytes a position, want half the model's %d", got, want)
			}
			cfg := EngineConfig{MaxNumBatchedTokens: 24, BlockTokens: 4}
			eng, err := NewEngine(m, cfg)
			if err != nil {
				t.Fatal(err)
			}
			want, err := runRequests(t, eng, ppRequests())
			if err != nil {
				t.Fatal(err)
			}
			got, err := runPP(t, m, 1, 2, cfg, ppRequests())
			if err != nil {
				t.Fatal(err)
			}
			compareRuns(t, got, want, 0)
		})
	}
}

// TestPipelineParallelMoEAndGDN: MoE models (routing per token, on the
// stage holding the layer) and a hybrid gated delta net model (each
// stage keeping its own layers' per-sequence states in its engine's state
// slots) give one process's tokens and log-probabilities at PP=2 (and
// the hybrid at PP=4) — the same bits, as dense models — and within TP's
// 1e-5 at TP=2×PP=2.
func TestPipelineParallelMoEAndGDN(t *testing.T) {
	for _, c := range []struct {
		name string
		m    *gpt.Model
	}{{"mixtral", moeTestModel(t, "mixtral")}, {"qwen-moe", moeTestModel(t, "qwen-moe")}, {"gdn", gdnTestModel(t)}} {
		cfg := EngineConfig{MaxNumBatchedTokens: 24, BlockTokens: 4, MaxNumSeqs: 8}
		eng, err := NewEngine(c.m, cfg)
		if err != nil {
			t.Fatal(err)
		}
		want, err := runRequests(t, eng, ppRequests())
		if err != nil {
			t.Fatal(err)
		}
		layouts := [][2]int{{1, 2}, {2, 2}}
		if c.name == "gdn" {
			// four stages of one layer: two hold gated delta net layers
			// alone and cache no keys (the stages agree on the blocks)
			layouts = append(layouts, [2]int{1, 4})
		}
		for _, l := range layouts {
			t.Run(fmt.Sprintf("%s/tp%d_pp%d", c.name, l[0], l[1]), func(t *testing.T) {
				got, err := runPP(t, c.m, l[0], l[1], cfg, ppRequests())
				if err != nil {
					t.Fatal(err)
				}
				tol := 0.0
				if l[0] > 1 {
					tol = 1e-5
				}
				compareRuns(t, got, want, tol)
			})
		}
	}
}
