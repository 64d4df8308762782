package infer

import (
	"context"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/gotron/gotron/comm"
	"github.com/gotron/gotron/comm/inproc"
	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/parallel/tp"
	"github.com/gotron/gotron/tensor"
)

// gdnTestModel is a small random hybrid model (Qwen3-Next style): gated
// delta nets at layers 0 and 2 (two key heads, four value heads), gated
// full attention at 1 and 3; tensor parallelism of 2 divides its heads.
func gdnTestModel(t testing.TB) *gpt.Model {
	t.Helper()
	cfg := gpt.Config{NumLayers: 4, HiddenSize: 32, NumAttentionHeads: 4, NumQueryGroups: 2, KVChannels: 8, FFNHiddenSize: 48,
		VocabSize: 64, MaxPositionEmbeddings: 64, PositionEmbeddingType: gpt.RoPE, Normalization: gpt.RMSNorm,
		Activation: gpt.SwiGLU, DisableBiasLinear: true, UntieEmbeddingsAndOutputWeights: true, InitMethodStd: 0.3,
		AttentionOutputGate: true,
		GDN: gpt.GDNConfig{Enabled: true, LinearAttentionFreq: "2", ConvKernel: 4, KeyHeadDim: 4, ValueHeadDim: 6,
			NumKeyHeads: 2, NumValueHeads: 4}}
	m, err := gpt.New(cfg, tensor.NewRNG(13))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestEngineGDNGreedyMatchesForward: the hybrid model decodes in the
// engine, requests of different lengths joining two per step so steps mix
// prefill chunks (split by the token budget) and decode tokens, each
// sequence's gated delta net state beside its KV blocks. Every greedy
// token is the argmax of a full forward over the prompt and the tokens so
// far (the training path, no state), and its log-probability within 1e-4
// of that forward's — with the model's and with packed weights. The state
// slots all come back.
func TestEngineGDNGreedyMatchesForward(t *testing.T) {
	m := gdnTestModel(t)
	V := m.Config.VocabSize
	for _, layout := range []WeightLayout{WeightsModel, WeightsPacked} {
		t.Run(layout.String(), func(t *testing.T) {
			e := mustEngine(t, m, EngineConfig{Weights: layout, MaxNumBatchedTokens: 16, BlockTokens: 4, MaxNumSeqs: 8})
			if !e.Config().DisablePrefixCaching {
				t.Error("prefix caching on for a model with gated delta net layers")
			}
			var reqs []Request
			for i, n := range []int{3, 19, 1, 8, 30, 5} {
				reqs = append(reqs, Request{Prompt: testPrompt(n, 300+i, V), MaxTokens: 6 + i, Sampling: Sampling{TopK: 1}, Logprobs: true})
			}
			got, err := runRequests(t, e, reqs)
			if err != nil {
				t.Fatal(err)
			}
			worst := 0.0
			for i, r := range reqs {
				seq := slices.Clone(r.Prompt)
				if len(got[i]) != r.MaxTokens {
					t.Fatalf("request %d: %d events, want %d", i, len(got[i]), r.MaxTokens)
				}
				for j, ev := range got[i] {
					logits := m.Forward(nil, gpt.Batch{Tokens: tensor.FromInt32(slices.Clone(seq), 1, len(seq))}, nil, false).Float32s()
					row := logits[(len(seq)-1)*V:]
					if want := argmax(row); ev.Token != want {
						t.Fatalf("request %d token %d: engine %d, full-forward argmax %d", i, j, ev.Token, want)
					}
					lp := logSoftmaxAt(row, ev.Token)
					d := math.Abs(float64(ev.Logprob)-lp) / max(1, math.Abs(lp))
					worst = max(worst, d)
					if d > 1e-4 {
						t.Errorf("request %d token %d: log-probability %v, full forward %v", i, j, ev.Logprob, lp)
					}
					seq = append(seq, int32(ev.Token))
				}
			}
			t.Logf("largest log-probability difference %.3g", worst)
			if st := e.Stats(); st.Steps >= st.BatchedTokens {
				t.Errorf("%d steps for %d tokens: no batching", st.Steps, st.BatchedTokens)
			}
			checkNoLeak(t, e)
		})
	}
}

// logSoftmaxAt is log softmax(row)[i] in float64.
func logSoftmaxAt(row []float32, i int) float64 {
	mx := math.Inf(-1)
	for _, v := range row {
		mx = math.Max(mx, float64(v))
	}
	var z float64
	for _, v := range row {
		z += math.Exp(float64(v) - mx)
	}
	return float64(row[i]) - mx - math.Log(z)
}

// TestEngineGDNBatchedEqualsAlone: batched with others (joining
// mid-flight, different lengths), each request generates what it does
// alone through Generate (gotron generate's contiguous cache and state).
func TestEngineGDNBatchedEqualsAlone(t *testing.T) {
	testBatchedEqualsAlone(t, gdnTestModel(t), EngineConfig{Weights: WeightsModel, MaxNumSeqs: 16})
}

// TestEngineGDNPreemption: a pool too small for every request preempts the
// youngest; its state slot is freed with its blocks, and its recompute
// from position 0 starts from a zero state, so every output equals its
// output alone. The states are counted in KVCacheBytes: the pool is what
// remains after MaxNumSeqs of them.
func TestEngineGDNPreemption(t *testing.T) {
	m := gdnTestModel(t)
	bytesPerBlock := 4 * 2 * 2 * 2 * 8 * 4 // tokens · K,V · attention layers · groups · dim · float32
	states := 8 * m.GDNStateBytes()
	e := mustEngine(t, m, EngineConfig{BlockTokens: 4, MaxNumSeqs: 8, KVCacheBytes: int64(12*bytesPerBlock) + states})
	if e.pool.numBlocks != 12 {
		t.Fatalf("pool of %d blocks, want 12", e.pool.numBlocks)
	}
	if e.pool.k[0] != nil || e.pool.k[1] == nil {
		t.Fatal("the pool keeps keys for gated delta net layer 0 or none for attention layer 1")
	}
	want := map[SeqID][]int{}
	for i := range 6 {
		prompt := testPrompt(6+i, 200+i, 64)
		id, err := e.Add(Request{Prompt: prompt, MaxTokens: 14, Sampling: Sampling{TopK: 1}})
		if err != nil {
			t.Fatal(err)
		}
		want[id] = generateAlone(t, m, prompt, 14, Sampling{TopK: 1})
	}
	got, _ := drain(t, e)
	for id, w := range want {
		if !slices.Equal(got[id], w) {
			t.Errorf("request %d: %v, alone %v", id, got[id], w)
		}
	}
	if e.Stats().Preemptions == 0 {
		t.Error("no preemption with 12 blocks for 6 sequences of up to 6 blocks")
	}
	checkNoLeak(t, e)
	_, err := NewEngine(m, EngineConfig{BlockTokens: 4, MaxNumSeqs: 8, KVCacheBytes: states})
	if err == nil || !strings.Contains(err.Error(), "gated delta net states of --max-num-seqs=8 sequences") {
		t.Fatalf("a budget of the states alone: %v", err)
	}
}

// TestEngineGDNTensorParallel: the hybrid model split over 2 tensor-
// parallel ranks (each rank's gated delta net heads and their state, its
// attention heads' KV cache) generates one process's tokens, in the engine
// and through Generate, with log-probabilities within 1e-5.
func TestEngineGDNTensorParallel(t *testing.T) {
	m := gdnTestModel(t)
	cfg := EngineConfig{MaxNumBatchedTokens: 24, BlockTokens: 4, MaxNumSeqs: 8}
	eng, err := NewEngine(m, cfg)
	if err != nil {
		t.Fatal(err)
	}
	want, err := runRequests(t, eng, tpRequests())
	if err != nil {
		t.Fatal(err)
	}
	compareRuns(t, runTP(t, m, 2, cfg, tpRequests()), want, 1e-5)

	prompt := testPrompt(7, 3, 64)
	alone := generateAlone(t, m, prompt, 20, Sampling{TopK: 1})
	got := make([][]int, 2)
	err = inproc.Run(context.Background(), 2, func(ctx context.Context, pg comm.ProcessGroup) error {
		sliced, err := gpt.Parallelize(m, &tp.Region{Group: pg}, nil)
		if err != nil {
			return err
		}
		if c, r := sliced.GDNStateSize(); 2*c != 3*(2*8+24) || 2*r != 4*4*6 {
			t.Errorf("rank %d keeps states of %d and %d floats, want half of one process's", pg.Rank(), c, r)
		}
		sm, err := NewSampler(Sampling{TopK: 1})
		if err != nil {
			return err
		}
		return Generate(ctx, sliced, prompt, 20, 0, -1, sm, func(id int) error { got[pg.Rank()] = append(got[pg.Rank()], id); return nil })
	})
	if err != nil {
		t.Fatal(err)
	}
	for r := range got {
		if !slices.Equal(got[r], alone) {
			t.Errorf("Generate on rank %d: %v, one process %v", r, got[r], alone)
		}
	}
}

// TestEngineGDNOnSimMatchesCPU: the hybrid model on the simulated device
// (its kernels reach the host-memory buffers the gated delta net ops run
// on; the sequences' states are device tensors, advanced in place) serves
// every event the CPU does, bit for bit: with a slot for every request,
// and with two slots, which later requests reuse (a reused state must
// start from zero).
func TestEngineGDNOnSimMatchesCPU(t *testing.T) {
	for _, slots := range []int{8, 2} {
		serve := func(sim bool) tpRun {
			m := gdnTestModel(t)
			if sim {
				m.ToDevice(tensor.Sim)
			}
			e := mustEngine(t, m, EngineConfig{BlockTokens: 4, MaxNumBatchedTokens: 16, MaxNumSeqs: slots})
			if sim && len(e.freeStates) > 0 && e.freeStates[0].ConvDev == nil {
				t.Fatal("the engine's state slots are in host memory for a model on the simulated device")
			}
			got, err := runRequests(t, e, tpRequests())
			if err != nil {
				t.Fatal(err)
			}
			checkNoLeak(t, e)
			return got
		}
		compareRuns(t, serve(true), serve(false), 0)
	}
}
