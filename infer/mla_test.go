package infer

import (
	"slices"
	"strings"
	"testing"

	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/tensor"
)

// mlaTestModel is a small random multi-latent attention model: with
// --q-lora-rank (LayerNorm, learned positions, YaRN factor 40 with
// DeepSeek-V2's mscales, v narrower than the q/k heads) or without
// ("mla-plain-q": RMSNorm, SwiGLU, no position table, untied, YaRN factor
// 4, v wider, so q and k are padded in the cache); a "-latents" suffix
// caches the latents (CacheMLALatents).
func mlaTestModel(t testing.TB, kind string) *gpt.Model {
	t.Helper()
	cfg := gpt.Config{NumLayers: 2, HiddenSize: 32, NumAttentionHeads: 4, VocabSize: 64, MaxPositionEmbeddings: 128,
		Activation: gpt.GELUTanh, InitMethodStd: 0.3, MLA: gpt.DefaultMLA(), QKLayerNorm: true} // the latents' norms (mla-plain-q has none)
	mla := &cfg.MLA
	mla.QLoraRank, mla.KVLoraRank, mla.QKHeadDim, mla.QKPosEmbHeadDim, mla.VHeadDim = 12, 10, 6, 4, 5
	mla.ScalingFactor, mla.Mscale, mla.MscaleAllDim = 40, 0.707, 0.707
	if kind == "mla-plain-q" || kind == "mla-plain-q-latents" {
		cfg = gpt.Config{NumLayers: 2, HiddenSize: 32, NumAttentionHeads: 4, FFNHiddenSize: 48, VocabSize: 64,
			MaxPositionEmbeddings: 128, PositionEmbeddingType: gpt.NoPositionEmbedding, Normalization: gpt.RMSNorm,
			Activation: gpt.SwiGLU, DisableBiasLinear: true, UntieEmbeddingsAndOutputWeights: true, InitMethodStd: 0.3,
			MLA: gpt.DefaultMLA()}
		mla = &cfg.MLA
		mla.KVLoraRank, mla.QKHeadDim, mla.QKPosEmbHeadDim, mla.VHeadDim = 12, 2, 4, 8
		mla.ScalingFactor, mla.Mscale, mla.MscaleAllDim, mla.OriginalMaxPositions = 4, 1, 0.5, 64
	}
	m, err := gpt.New(cfg, tensor.NewRNG(13))
	if err != nil {
		t.Fatal(err)
	}
	m.CacheMLALatents = strings.HasSuffix(kind, "-latents")
	return m
}

// mlaKinds: per-head keys and values cached, or the latents
// (CacheMLALatents).
var mlaKinds = []string{"mla", "mla-plain-q", "mla-latents", "mla-plain-q-latents"}

// TestEngineMLAGreedyMatchesForward: MLA models decode in the engine, six
// requests batched step after step over a paged cache of 4-token blocks,
// and each request's greedy tokens equal the argmax of the full forward
// pass (the training code path, no cache) over its prompt and the tokens so
// far; each token's log-probability equals the full forward's log-softmax
// within float32 rounding. With the model's and packed weights.
func TestEngineMLAGreedyMatchesForward(t *testing.T) {
	for _, kind := range mlaKinds {
		for _, layout := range []WeightLayout{WeightsModel, WeightsPacked} {
			t.Run(kind+"/"+layout.String(), func(t *testing.T) {
				m := mlaTestModel(t, kind)
				e := mustEngine(t, m, EngineConfig{Weights: layout, MaxNumBatchedTokens: 24, BlockTokens: 4})
				prompts := map[SeqID][]int32{}
				n := 8
				for i := range 6 {
					p := testPrompt(3+5*i, 300+i, 64)
					id, err := e.Add(Request{Prompt: p, MaxTokens: n, Sampling: Sampling{TopK: 1}, Logprobs: true})
					if err != nil {
						t.Fatal(err)
					}
					prompts[id] = p
				}
				got := map[SeqID][]Event{}
				for e.HasWork() {
					evs, err := e.Step()
					if err != nil {
						t.Fatal(err)
					}
					for _, ev := range evs {
						if ev.Token >= 0 {
							got[ev.Seq] = append(got[ev.Seq], ev)
						}
					}
				}
				if st := e.Stats(); st.Steps >= st.BatchedTokens {
					t.Errorf("%d steps for %d tokens: no batching", st.Steps, st.BatchedTokens)
				}
				checkNoLeak(t, e)
				V := m.Config.VocabSize
				for id, p := range prompts {
					if len(got[id]) != n {
						t.Fatalf("request %d: %d tokens, want %d", id, len(got[id]), n)
					}
					seq := slices.Clone(p)
					for j, ev := range got[id] {
						logits := m.Forward(nil, gpt.Batch{Tokens: tensor.FromInt32(slices.Clone(seq), 1, len(seq))}, nil, false).Float32s()
						row := logits[(len(seq)-1)*V:]
						if want := argmax(row); ev.Token != want {
							t.Fatalf("request %d token %d: engine %d, full-forward argmax %d", id, j, ev.Token, want)
						}
						want := float64(row[ev.Token]) - logSumExp(row)
						if d := float64(ev.Logprob) - want; d > 1e-4 || d < -1e-4 {
							t.Fatalf("request %d token %d: logprob %v, full forward %v", id, j, ev.Logprob, want)
						}
						seq = append(seq, int32(ev.Token))
					}
				}
			})
		}
	}
}

// TestEngineMLAMatchesGenerate: an MLA request alone in the engine decodes
// as gotron generate's loop does (greedy and sampled), and requests batched
// continuously (joining mid-flight, prefills chunked) decode as each alone.
func TestEngineMLAMatchesGenerate(t *testing.T) {
	for _, kind := range mlaKinds {
		t.Run(kind, func(t *testing.T) {
			m := mlaTestModel(t, kind)
			testGreedyMatchesGenerate(t, m, EngineConfig{})
			testBatchedEqualsAlone(t, m, EngineConfig{Weights: WeightsPacked})
		})
	}
}

// TestPackedBytesMLA: PackLinears packs an MLA model's down- and
// up-projections, and with cached latents not the key-value up-projection,
// whose halves multiply the queries and the outputs on the model's weight;
// PackedBytes counts that much less.
func TestPackedBytesMLA(t *testing.T) {
	for _, kind := range mlaKinds {
		m := mlaTestModel(t, kind)
		pl := PackLinears(m, tensor.Float32)
		for i, l := range m.Layers {
			if packed := pl.w[l.KVUp] != nil; packed == m.CacheMLALatents {
				t.Errorf("%s layer %d: linear_kv_up_proj packed %v with CacheMLALatents %v", kind, i, packed, m.CacheMLALatents)
			}
			if pl.w[l.KVDown] == nil || pl.w[l.Proj] == nil {
				t.Errorf("%s layer %d: linear_kv_down_proj or linear_proj not packed", kind, i)
			}
		}
		full := mlaTestModel(t, strings.TrimSuffix(kind, "-latents"))
		diff := PackedBytes(full, EngineConfig{}) - PackedBytes(m, EngineConfig{})
		if want := int64(0); m.CacheMLALatents {
			want = int64(4 * m.Config.NumLayers * m.Layers[0].KVUp.Numel())
			if diff != want {
				t.Errorf("%s: packs %d bytes fewer than the per-head layout, want %d (the up-projections)", kind, diff, want)
			}
		} else if diff != want {
			t.Errorf("%s: %d", kind, diff)
		}
	}
}
