package infer

import (
	"context"
	"errors"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gotron/gotron/ckpt/hf"
	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/tensor"
)

// testModel is a small random model: GPT-2-style (learned positions,
// LayerNorm, GELU, tied) or Llama-style (RoPE, GQA, RMSNorm, SwiGLU,
// untied). A large init std spreads the logits so greedy decoding is not
// decided by rounding.
func testModel(t testing.TB, kind string) *gpt.Model {
	t.Helper()
	cfg := gpt.Config{NumLayers: 2, HiddenSize: 32, NumAttentionHeads: 4, VocabSize: 64, MaxPositionEmbeddings: 128,
		Activation: gpt.GELUTanh, InitMethodStd: 0.3}
	if kind == "llama" || kind == "llama-long" {
		cfg = gpt.Config{NumLayers: 2, HiddenSize: 32, NumAttentionHeads: 4, NumQueryGroups: 2, FFNHiddenSize: 48,
			VocabSize: 64, MaxPositionEmbeddings: 128, PositionEmbeddingType: gpt.RoPE, Normalization: gpt.RMSNorm,
			Activation: gpt.SwiGLU, DisableBiasLinear: true, UntieEmbeddingsAndOutputWeights: true, InitMethodStd: 0.3}
	}
	if kind == "llama-long" {
		cfg.MaxPositionEmbeddings = 2048
	}
	m, err := gpt.New(cfg, tensor.NewRNG(7))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// testPrompt returns n pseudo-random ids below vocab, varied by seed.
func testPrompt(n, seed, vocab int) []int32 {
	p := make([]int32, n)
	x := uint32(seed*2654435761 + 12345)
	for i := range p {
		x = x*1664525 + 1013904223
		p[i] = int32(x>>16) % int32(vocab)
	}
	return p
}

// generateAlone runs infer.Generate (gotron generate's loop).
func generateAlone(t testing.TB, m *gpt.Model, prompt []int32, maxNew int, s Sampling) []int {
	t.Helper()
	sm, err := NewSampler(s)
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	if err := Generate(context.Background(), m, prompt, maxNew, 0, -1, sm, func(id int) error { out = append(out, id); return nil }); err != nil {
		t.Fatal(err)
	}
	return out
}

// drain steps e until it is idle and returns each sequence's tokens and
// finish reason.
func drain(t testing.TB, e *Engine) (map[SeqID][]int, map[SeqID]FinishReason) {
	t.Helper()
	toks, fin := map[SeqID][]int{}, map[SeqID]FinishReason{}
	for steps := 0; e.HasWork(); steps++ {
		if steps > 10000 {
			t.Fatal("engine does not finish")
		}
		evs, err := e.Step()
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range evs {
			if _, done := fin[ev.Seq]; done {
				t.Fatalf("event for finished sequence %d", ev.Seq)
			}
			if ev.Token >= 0 {
				toks[ev.Seq] = append(toks[ev.Seq], ev.Token)
			}
			if ev.Finish != "" {
				fin[ev.Seq] = ev.Finish
			}
		}
	}
	return toks, fin
}

func mustEngine(t testing.TB, m *gpt.Model, cfg EngineConfig) *Engine {
	t.Helper()
	e, err := NewEngine(m, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func checkNoLeak(t testing.TB, e *Engine) {
	t.Helper()
	st := e.Stats()
	if st.KVBlocksUsed != 0 || st.Waiting != 0 || st.Running != 0 {
		t.Fatalf("after all requests: %d KV blocks used, %d waiting, %d running; want 0", st.KVBlocksUsed, st.Waiting, st.Running)
	}
	if got := len(e.pool.free) + e.pool.lruLen; got != e.pool.numBlocks {
		t.Fatalf("free %d + cached %d blocks != pool %d", len(e.pool.free), e.pool.lruLen, e.pool.numBlocks)
	}
	if e.m.GDNStateBytes() > 0 && len(e.freeStates) != e.cfg.MaxNumSeqs {
		t.Fatalf("%d gated delta net state slots free after all requests, want all %d", len(e.freeStates), e.cfg.MaxNumSeqs)
	}
}

// weightCases are the ways an engine reads its weights: the model's, packed
// float32, and packed bfloat16 on a model rounded to bf16.
var weightCases = []struct {
	name   string
	layout WeightLayout
	bf16   bool
}{{"model", WeightsModel, false}, {"packed", WeightsPacked, false}, {"packed-bf16", WeightsPacked, true}}

// weightCaseModel returns the test model, rounded to bf16 when bf16 is set.
func weightCaseModel(t *testing.T, kind string, bf16 bool) *gpt.Model {
	m := testModel(t, kind)
	if bf16 {
		m.RoundToBF16()
	}
	return m
}

// TestEngineGreedyMatchesGenerate: one request alone in the engine decodes
// token for token as Generate (gotron generate) does, greedy and seeded
// sampling, GPT-2- and Llama-style, with the model's weights (the same
// arithmetic) and with packed weights, float32 and bfloat16 (the same
// tokens; generate runs on the same bf16-rounded model, as
// `gotron generate --bf16` does).
func TestEngineGreedyMatchesGenerate(t *testing.T) {
	for _, kind := range []string{"gpt2", "llama"} {
		for _, wc := range weightCases {
			t.Run(kind+"/"+wc.name, func(t *testing.T) {
				testGreedyMatchesGenerate(t, weightCaseModel(t, kind, wc.bf16), EngineConfig{Weights: wc.layout, BF16: wc.bf16})
			})
		}
	}
}

func testGreedyMatchesGenerate(t *testing.T, m *gpt.Model, cfg EngineConfig) {
	for i, s := range []Sampling{{TopK: 1}, {Seed: 5}, {TopP: 0.9, Temperature: 0.7, Seed: 3}} {
		prompt := testPrompt(5+7*i, i, 64)
		want := generateAlone(t, m, prompt, 20, s)
		e := mustEngine(t, m, cfg)
		id, err := e.Add(Request{Prompt: prompt, MaxTokens: 20, Sampling: s})
		if err != nil {
			t.Fatal(err)
		}
		toks, fin := drain(t, e)
		if !slices.Equal(toks[id], want) || fin[id] != FinishLength {
			t.Fatalf("sampling %+v: engine %v (%s), generate %v", s, toks[id], fin[id], want)
		}
		checkNoLeak(t, e)
	}
}

// promptLogprobs returns the log-probabilities of the whole vocabulary (64)
// after prompt, from a fresh engine on m with cfg.
func promptLogprobs(t *testing.T, m *gpt.Model, cfg EngineConfig, prompt []int32) []float32 {
	e := mustEngine(t, m, cfg)
	e.Add(Request{Prompt: prompt, MaxTokens: 1, Logprobs: true, TopLogprobs: 64})
	evs, _ := e.Step()
	out := make([]float32, 64)
	for _, tl := range evs[0].TopLogprobs {
		out[tl.Token] = tl.Logprob
	}
	return out
}

// TestPackedLogits: logits through packed weights equal the model's
// within float32 rounding — in float32, and in bfloat16 on a bf16-rounded
// model — at decode-sized and prefill-sized steps. (Bit for bit wherever
// the GEMM packs B for one row too, every ISA but AVX-512:
// tensor.TestLinearPackedMatchesLinear checks that on every ISA path.)
func TestPackedLogits(t *testing.T) {
	for _, bf16 := range []bool{false, true} {
		m := weightCaseModel(t, "llama", bf16)
		for _, n := range []int{1, 5, 40} { // decode-sized and prefill-sized steps
			prompt := testPrompt(n, 1, 64)
			a := promptLogprobs(t, m, EngineConfig{Weights: WeightsModel}, prompt)
			b := promptLogprobs(t, m, EngineConfig{Weights: WeightsPacked, BF16: bf16}, prompt)
			for i := range a {
				if d := a[i] - b[i]; d > 1e-4 || d < -1e-4 {
					t.Fatalf("bf16 %v, %d-token prompt: logprob %d: %v (model layout), %v (packed)", bf16, n, i, a[i], b[i])
				}
			}
		}
	}
}

// TestEngineBF16Checked: BF16 on a model whose weights are not bf16
// values is refused, naming the parameter, instead of decoding with
// weights silently different from the model's.
func TestEngineBF16Checked(t *testing.T) {
	m := testModel(t, "gpt2")
	_, err := NewEngine(m, EngineConfig{BF16: true})
	if err == nil || !strings.Contains(err.Error(), "not a bfloat16 value") {
		t.Fatalf("NewEngine(BF16) on a float32 model: %v", err)
	}
	if _, err := ParseWeightLayout("transposed"); err == nil || !strings.Contains(err.Error(), "packed") {
		t.Fatalf("ParseWeightLayout(transposed): %v", err)
	}
}

// TestEngineBatchedEqualsAlone: many requests of different lengths at once,
// with chunked prefill (a small token budget) and decoders and prefills in
// the same steps, each get the tokens they get alone (greedy).
func TestEngineBatchedEqualsAlone(t *testing.T) {
	for _, kind := range []string{"gpt2", "llama"} {
		for _, wc := range weightCases {
			t.Run(kind+"/"+wc.name, func(t *testing.T) {
				testBatchedEqualsAlone(t, weightCaseModel(t, kind, wc.bf16), EngineConfig{Weights: wc.layout, BF16: wc.bf16})
			})
		}
	}
}

func testBatchedEqualsAlone(t *testing.T, m *gpt.Model, cfg EngineConfig) {
	cfg.MaxNumBatchedTokens, cfg.BlockTokens = 24, 4
	e := mustEngine(t, m, cfg)
	want := map[SeqID][]int{}
	add := func(i int) {
		prompt := testPrompt(3+(i*5)%40, 100+i, 64)
		n := 4 + i%9
		id, err := e.Add(Request{Prompt: prompt, MaxTokens: n, Sampling: Sampling{TopK: 1}})
		if err != nil {
			t.Fatal(err)
		}
		want[id] = generateAlone(t, m, prompt, n, Sampling{TopK: 1})
	}
	for i := range 10 {
		add(i)
	}
	// Requests join mid-flight too.
	got := map[SeqID][]int{}
	for step := 0; e.HasWork() || step < 3; step++ {
		if step < 3 {
			add(10 + step)
		}
		evs, err := e.Step()
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range evs {
			if ev.Token >= 0 {
				got[ev.Seq] = append(got[ev.Seq], ev.Token)
			}
		}
	}
	for id, w := range want {
		if !slices.Equal(got[id], w) {
			t.Errorf("request %d: batched %v, alone %v", id, got[id], w)
		}
	}
	if st := e.Stats(); st.Steps >= st.BatchedTokens {
		t.Errorf("%d steps for %d tokens: no batching", st.Steps, st.BatchedTokens)
	}
	checkNoLeak(t, e)
}

// TestEnginePreemption: a pool too small for all requests at once preempts
// the youngest, recomputes it later, and every output still equals its
// output alone; nothing leaks.
func TestEnginePreemption(t *testing.T) {
	m := testModel(t, "llama")
	bytesPerBlock := 4 * 2 * 2 * 2 * 8 * 4 // tokens · K,V · layers · groups · dim · float32
	for _, prefix := range []bool{false, true} {
		e := mustEngine(t, m, EngineConfig{BlockTokens: 4, KVCacheBytes: int64(12 * bytesPerBlock), DisablePrefixCaching: !prefix})
		if e.pool.numBlocks != 12 {
			t.Fatalf("pool of %d blocks, want 12", e.pool.numBlocks)
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
				t.Errorf("prefix caching %v: request %d: %v, alone %v", prefix, id, got[id], w)
			}
		}
		if e.Stats().Preemptions == 0 {
			t.Errorf("prefix caching %v: no preemption with 12 blocks for 6 sequences of up to 6 blocks", prefix)
		}
		checkNoLeak(t, e)
	}
}

// TestEnginePrefixCaching: a second request sharing a prompt prefix reuses
// its full blocks (and only full ones) and decodes the same tokens as
// without caching.
func TestEnginePrefixCaching(t *testing.T) {
	m := testModel(t, "gpt2")
	shared := testPrompt(21, 1, 64) // 5 full blocks of 4, then 1 token
	e := mustEngine(t, m, EngineConfig{BlockTokens: 4})
	id1, _ := e.Add(Request{Prompt: shared, MaxTokens: 3, Sampling: Sampling{TopK: 1}})
	got1, _ := drain(t, e)
	if st := e.Stats(); st.PrefixCacheHitTokens != 0 || st.KVBlocksCached == 0 {
		t.Fatalf("first request: %d hit tokens, %d cached blocks", st.PrefixCacheHitTokens, st.KVBlocksCached)
	}
	p2 := append(append([]int32(nil), shared[:18]...), 5, 6, 7) // shares 4 full blocks and 2 tokens
	id2, _ := e.Add(Request{Prompt: p2, MaxTokens: 6, Sampling: Sampling{TopK: 1}})
	got2, _ := drain(t, e)
	if hit := e.Stats().PrefixCacheHitTokens; hit != 16 {
		t.Fatalf("second request reused %d tokens, want 16 (4 full blocks)", hit)
	}
	// Same prompt again: all full blocks but never the last token.
	id3, _ := e.Add(Request{Prompt: shared[:20], MaxTokens: 2, Sampling: Sampling{TopK: 1}})
	got3, _ := drain(t, e)
	if hit := e.Stats().PrefixCacheHitTokens; hit != 16+16 {
		t.Fatalf("a 20-token prompt reused %d tokens, want 16 (the last block holds the last token)", hit-16)
	}
	for _, c := range []struct {
		got    []int
		prompt []int32
		n      int
	}{{got1[id1], shared, 3}, {got2[id2], p2, 6}, {got3[id3], shared[:20], 2}} {
		if want := generateAlone(t, m, c.prompt, c.n, Sampling{TopK: 1}); !slices.Equal(c.got, want) {
			t.Errorf("with prefix cache %v, alone %v", c.got, want)
		}
	}
	checkNoLeak(t, e)
}

func TestEngineStopAndLogprobs(t *testing.T) {
	m := testModel(t, "gpt2")
	prompt := testPrompt(6, 3, 64)
	want := generateAlone(t, m, prompt, 12, Sampling{TopK: 1})
	e := mustEngine(t, m, EngineConfig{Decoder: spaceDecoder{}, VocabSize: 10})
	if _, err := e.Add(Request{Prompt: prompt, MaxTokens: 3}); !errors.Is(err, ErrBadRequest) {
		t.Fatalf("prompt ids beyond the vocabulary: %v", err)
	}
	// Stop token: the third greedy token.
	e = mustEngine(t, m, EngineConfig{})
	id, _ := e.Add(Request{Prompt: prompt, MaxTokens: 12, Sampling: Sampling{TopK: 1}, StopTokens: []int{want[2]}, Logprobs: true, TopLogprobs: 3})
	var evs []Event
	for e.HasWork() {
		s, _ := e.Step()
		evs = append(evs, s...)
	}
	if len(evs) != 3 || evs[2].Finish != FinishStop || evs[2].Seq != id {
		t.Fatalf("stop token: events %+v", evs)
	}
	for _, ev := range evs {
		if len(ev.TopLogprobs) != 3 || ev.TopLogprobs[0].Token != ev.Token || ev.TopLogprobs[0].Logprob != ev.Logprob || ev.Logprob > 0 {
			t.Fatalf("greedy logprobs: %+v", ev)
		}
	}
	// Prompt logprobs equal log-softmax of a full forward.
	e = mustEngine(t, m, EngineConfig{MaxNumBatchedTokens: 4})
	e.Add(Request{Prompt: prompt, PromptLogprobs: true})
	evs = evs[:0]
	for e.HasWork() {
		s, _ := e.Step()
		evs = append(evs, s...)
	}
	if len(evs) != 1 || evs[0].Finish != FinishLength || len(evs[0].PromptLogprobs) != len(prompt)-1 {
		t.Fatalf("scoring: %+v", evs)
	}
	full := m.Forward(nil, gpt.Batch{Tokens: tensor.FromInt32(append([]int32(nil), prompt...), 1, len(prompt))}, nil, false).Float32s()
	V := m.Config.VocabSize
	for i, lp := range evs[0].PromptLogprobs {
		row := full[i*V : (i+1)*V]
		want := float64(row[prompt[i+1]]) - logSumExp(row)
		if d := float64(lp) - want; d > 1e-4 || d < -1e-4 {
			t.Fatalf("prompt logprob %d: %v, full forward %v", i, lp, want)
		}
	}
	checkNoLeak(t, e)
}

// TestStopStrings: the text ends before the first stop string, which may
// span tokens; text that could begin one is held back, never lost.
func TestStopStrings(t *testing.T) {
	s := &sequence{req: Request{Stop: []string{"34", "9 9"}}}
	var out []string
	stopped := false
	for _, piece := range []string{"1", " 2", " 3", " 5", " 3", "4", " 6"} {
		var o string
		o, stopped = s.addText(piece)
		out = append(out, o)
		if stopped {
			break
		}
	}
	if got := strings.Join(out, ""); got != "1 2 3 5 " || !stopped || out[2] != " " {
		t.Fatalf("emitted %q (stopped %v)", out, stopped)
	}
	s = &sequence{req: Request{Stop: []string{"abc"}}}
	a, _ := s.addText("xab")
	if a != "x" || s.flush() != "ab" {
		t.Fatalf("held-back text lost: %q", a)
	}
}

func TestEngineCancelAndErrors(t *testing.T) {
	m := testModel(t, "gpt2")
	e := mustEngine(t, m, EngineConfig{BlockTokens: 4})
	id, _ := e.Add(Request{Prompt: testPrompt(30, 1, 64), MaxTokens: 50, Sampling: Sampling{TopK: 1}})
	e.Step()
	if e.Stats().KVBlocksUsed == 0 || !e.Cancel(id) || e.Cancel(id) {
		t.Fatal("cancel of a running sequence")
	}
	checkNoLeak(t, e)
	for _, c := range []struct {
		r    Request
		want error
	}{
		{Request{MaxTokens: 1}, ErrBadRequest},
		{Request{Prompt: []int32{1}, MaxTokens: 0}, ErrBadRequest},
		{Request{Prompt: []int32{64}, MaxTokens: 1}, ErrBadRequest},
		{Request{Prompt: []int32{1}, MaxTokens: 1, Stop: []string{"x"}}, ErrBadRequest},
		{Request{Prompt: []int32{1}, MaxTokens: 1, Sampling: Sampling{TopK: 3, TopP: 0.5}}, ErrBadRequest},
		{Request{Prompt: testPrompt(100, 1, 64), MaxTokens: 29}, ErrContextLength},
	} {
		if _, err := e.Add(c.r); !errors.Is(err, c.want) {
			t.Errorf("%+v: error %v, want %v", c.r, err, c.want)
		}
	}
	if _, err := e.Add(Request{Prompt: testPrompt(100, 1, 64), MaxTokens: 28}); err != nil {
		t.Errorf("a request filling the context: %v", err)
	}
}

// TestEngineConvertedCheckpoints: checkpoints converted from Hugging Face
// (GPT-2 tied fp32, Llama GQA untied fp32, Llama GQA tied bf16) decode in
// the engine, batched with each other's prompts, as Generate decodes them
// alone.
func TestEngineConvertedCheckpoints(t *testing.T) {
	for _, dir := range []string{"gpt2_tied_f32", "llama_gqa_untied_f32", "llama_gqa_tied_bf16"} {
		t.Run(dir, func(t *testing.T) {
			m, _, err := hf.LoadModel(filepath.Join("..", "ckpt", "hf", "testdata", dir))
			if err != nil {
				t.Fatal(err)
			}
			V := m.Config.VocabSize
			e := mustEngine(t, m, EngineConfig{BlockTokens: 4})
			want := map[SeqID][]int{}
			for i := range 4 {
				prompt := testPrompt(2+i, 40+i, V)
				n := min(6, m.Config.MaxPositionEmbeddings-len(prompt))
				id, err := e.Add(Request{Prompt: prompt, MaxTokens: n, Sampling: Sampling{TopK: 1}})
				if err != nil {
					t.Fatal(err)
				}
				want[id] = generateAlone(t, m, prompt, n, Sampling{TopK: 1})
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

// logSumExp is log Σ exp(x) in float64: the reference of the prompt
// log-probabilities.
func logSumExp(x []float32) float64 {
	mx := math.Inf(-1)
	for _, v := range x {
		mx = math.Max(mx, float64(v))
	}
	var sum float64
	for _, v := range x {
		sum += math.Exp(float64(v) - mx)
	}
	return mx + math.Log(sum)
}
