package infer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gotron/gotron/comm"
	"github.com/gotron/gotron/comm/inproc"
	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/parallel/tp"
	"github.com/gotron/gotron/tensor"
)

// tpTestModel is a small random model every TP size up to 4 divides:
// GPT-2-style (learned positions, LayerNorm, GELU, biases, tied) or
// Llama-style (RoPE, GQA with two heads a group, RMSNorm, SwiGLU, untied),
// or multi-latent attention's (mlaTestModel: each rank caches its heads'
// keys, the shared rotary key in each).
func tpTestModel(t testing.TB, kind string) *gpt.Model {
	t.Helper()
	if strings.HasPrefix(kind, "mla") {
		return mlaTestModel(t, kind)
	}
	cfg := gpt.Config{NumLayers: 2, HiddenSize: 32, NumAttentionHeads: 4, VocabSize: 64, MaxPositionEmbeddings: 64,
		Activation: gpt.GELUTanh, InitMethodStd: 0.3}
	if kind == "llama" {
		cfg = gpt.Config{NumLayers: 2, HiddenSize: 64, NumAttentionHeads: 8, NumQueryGroups: 4, FFNHiddenSize: 96,
			VocabSize: 64, MaxPositionEmbeddings: 64, PositionEmbeddingType: gpt.RoPE, Normalization: gpt.RMSNorm,
			Activation: gpt.SwiGLU, DisableBiasLinear: true, UntieEmbeddingsAndOutputWeights: true, InitMethodStd: 0.3}
	}
	m, err := gpt.New(cfg, tensor.NewRNG(11))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// tpRequests are greedy requests of several lengths, with log-probabilities
// (and one with the prompt's), so a step mixes prefill chunks and decodes.
func tpRequests() []Request {
	var reqs []Request
	for i, n := range []int{5, 17, 3, 30} {
		reqs = append(reqs, Request{Prompt: testPrompt(n, i, 64), MaxTokens: 12, Sampling: Sampling{TopK: 1},
			Logprobs: true, TopLogprobs: 3, PromptLogprobs: i == 1})
	}
	return reqs
}

// tpRun is one rank's run of reqs: every event of each sequence, by
// request index (the leader's; followers return nil).
type tpRun map[int][]Event

// runRequests adds reqs to the engine (a lone Engine or a Lockstep), two
// before each step, and steps until every request finished.
func runRequests(t testing.TB, eng interface {
	Add(Request) (SeqID, error)
	Step() ([]Event, error)
	HasWork() bool
}, reqs []Request) (tpRun, error) {
	out := tpRun{}
	idx := map[SeqID]int{}
	next := 0
	for steps := 0; next < len(reqs) || eng.HasWork(); steps++ {
		if steps > 1000 {
			return nil, errors.New("the engine does not finish")
		}
		for range 2 {
			if next < len(reqs) {
				id, err := eng.Add(reqs[next])
				if err != nil {
					return nil, err
				}
				idx[id] = next
				next++
			}
		}
		evs, err := eng.Step()
		if err != nil {
			return nil, err
		}
		for _, ev := range evs {
			ev.TopLogprobs = append([]TokenLogprob(nil), ev.TopLogprobs...)
			out[idx[ev.Seq]] = append(out[idx[ev.Seq]], ev)
		}
	}
	return out, nil
}

// runTP runs reqs on a tensor-parallel group of size ranks in one process
// (an inproc world), each rank holding its slice of m, and returns the
// leader's events.
func runTP(t *testing.T, m *gpt.Model, size int, cfg EngineConfig, reqs []Request) tpRun {
	t.Helper()
	var got tpRun
	err := inproc.Run(context.Background(), size, func(ctx context.Context, pg comm.ProcessGroup) error {
		sliced, err := sliceForDecoding(m, pg)
		if err != nil {
			return err
		}
		eng, err := NewEngine(sliced, cfg)
		if err != nil {
			return err
		}
		return leadOrFollow(ctx, t, eng, pg, reqs, &got)
	})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// leadOrFollow is a rank's part in running reqs over pg: rank 0 leads a
// Lockstep on eng through them (runRequests), keeps its events in *got and
// closes it; the others Follow.
func leadOrFollow(ctx context.Context, t testing.TB, eng *Engine, pg comm.ProcessGroup, reqs []Request, got *tpRun) error {
	if pg.Rank() != 0 {
		return Follow(ctx, eng, pg)
	}
	ls, err := NewLockstep(ctx, eng, pg)
	if err != nil {
		return err
	}
	if *got, err = runRequests(t, ls, reqs); err != nil {
		return err
	}
	return ls.Close()
}

// sliceForDecoding is rank pg's tensor-parallel slice of m as gotron
// inference splits it: gpt.Parallelize, and an MoE model's routed experts
// split over the ranks too.
func sliceForDecoding(m *gpt.Model, pg comm.ProcessGroup) (*gpt.Model, error) {
	sliced, err := gpt.Parallelize(m, &tp.Region{Group: pg}, nil)
	if err != nil || !m.Config.MoE.Enabled() {
		return sliced, err
	}
	return sliced, sliced.SplitExpertsOverTP()
}

// TestTensorParallelEngineMatchesOneRank: a model split over 2 and 4
// tensor-parallel ranks (column- and row-parallel linears, vocabulary-
// parallel embedding and output layer, each rank caching its query groups)
// generates the tokens one process does, with log-probabilities within
// float32 rounding of the reordered sums.
func TestTensorParallelEngineMatchesOneRank(t *testing.T) {
	for _, kind := range []string{"gpt2", "llama", "mla", "mla-latents"} {
		m := tpTestModel(t, kind)
		cfg := EngineConfig{MaxNumBatchedTokens: 24, BlockTokens: 4}
		eng, err := NewEngine(m, cfg)
		if err != nil {
			t.Fatal(err)
		}
		want, err := runRequests(t, eng, tpRequests())
		if err != nil {
			t.Fatal(err)
		}
		for _, size := range []int{2, 4} {
			t.Run(fmt.Sprintf("%s/tp%d", kind, size), func(t *testing.T) {
				got := runTP(t, m, size, cfg, tpRequests())
				compareRuns(t, got, want, 1e-5)
			})
		}
	}
}

// compareRuns checks that got has want's tokens and finish reasons, and
// log-probabilities within tol (relative to 1).
func compareRuns(t *testing.T, got, want tpRun, tol float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%d requests ran, want %d", len(got), len(want))
	}
	worst := 0.0
	near := func(what string, a, b float32) {
		d := math.Abs(float64(a)-float64(b)) / max(1, math.Abs(float64(b)))
		worst = max(worst, d)
		if !(d <= tol) {
			t.Errorf("%s: %g, one rank %g (difference %.3g > %g)", what, a, b, d, tol)
		}
	}
	for i, w := range want {
		g := got[i]
		if len(g) != len(w) {
			t.Fatalf("request %d: %d events, want %d", i, len(g), len(w))
		}
		for j := range w {
			if g[j].Token != w[j].Token || g[j].Finish != w[j].Finish {
				t.Fatalf("request %d event %d: token %d (%q), one rank %d (%q)", i, j, g[j].Token, g[j].Finish, w[j].Token, w[j].Finish)
			}
			near(fmt.Sprintf("request %d token %d logprob", i, j), g[j].Logprob, w[j].Logprob)
			for k := range w[j].TopLogprobs {
				if g[j].TopLogprobs[k].Token != w[j].TopLogprobs[k].Token {
					t.Errorf("request %d event %d top %d: token %d, one rank %d", i, j, k, g[j].TopLogprobs[k].Token, w[j].TopLogprobs[k].Token)
				}
				near(fmt.Sprintf("request %d event %d top %d", i, j, k), g[j].TopLogprobs[k].Logprob, w[j].TopLogprobs[k].Logprob)
			}
			if len(g[j].PromptLogprobs) != len(w[j].PromptLogprobs) {
				t.Fatalf("request %d: %d prompt logprobs, want %d", i, len(g[j].PromptLogprobs), len(w[j].PromptLogprobs))
			}
			for k := range w[j].PromptLogprobs {
				near(fmt.Sprintf("request %d prompt logprob %d", i, k), g[j].PromptLogprobs[k], w[j].PromptLogprobs[k])
			}
		}
	}
	t.Logf("largest log-probability difference %.3g", worst)
}

// TestTensorParallelLogitsMatchOneRank compares the logits of one batched
// step over every position of two prompts: the TP ranks' gathered logits
// are the same bytes on every rank and within 1e-5 of one process's.
func TestTensorParallelLogitsMatchOneRank(t *testing.T) {
	for _, kind := range []string{"gpt2", "llama", "mla", "mla-plain-q", "mla-latents", "mla-plain-q-latents"} {
		m := tpTestModel(t, kind)
		tokens := append(testPrompt(9, 1, 64), testPrompt(6, 2, 64)...)
		positions := make([]int32, len(tokens))
		for i := range positions {
			positions[i] = int32(i % 9)
		}
		rows := make([]int, len(tokens))
		for i := range rows {
			rows[i] = i
		}
		logitsOf := func(m *gpt.Model) ([]float32, error) {
			pool := newKVPool(tensor.CPU, slices.Repeat([]bool{true}, m.Config.NumLayers), m.QueryGroupsHere(), m.KVHeadDim(), 16, 2, m.SharedKV())
			att := newPagedAttention(pool)
			att.reset([]span{{row: 0, n: 9, pos: 0, table: []int32{0}}, {row: 9, n: 6, pos: 0, table: []int32{1}}})
			l, err := m.DecodeBatch(nil, tokens, positions, att, rows, nil)
			if err != nil {
				return nil, err
			}
			return append([]float32(nil), l.Float32s()...), nil
		}
		want, err := logitsOf(m)
		if err != nil {
			t.Fatal(err)
		}
		for _, size := range []int{2, 4} {
			got := make([][]float32, size)
			err := inproc.Run(context.Background(), size, func(ctx context.Context, pg comm.ProcessGroup) error {
				sliced, err := gpt.Parallelize(m, &tp.Region{Group: pg}, nil)
				if err != nil {
					return err
				}
				got[pg.Rank()], err = logitsOf(sliced)
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			worst := 0.0
			for i, w := range want {
				d := math.Abs(float64(got[0][i]-w)) / max(1, math.Abs(float64(w)))
				worst = max(worst, d)
				for r := 1; r < size; r++ {
					if got[r][i] != got[0][i] {
						t.Fatalf("%s TP=%d: logit %d is %g on rank %d, %g on rank 0", kind, size, i, got[r][i], r, got[0][i])
					}
				}
			}
			if worst > 1e-5 {
				t.Errorf("%s TP=%d: logits differ from one rank's by up to %.3g (relative), want <= 1e-5", kind, size, worst)
			}
			t.Logf("%s TP=%d: %d logits, largest difference %.3g", kind, size, len(want), worst)
		}
	}
}

// TestTensorParallelGenerate: gotron generate's loop (Generate, the
// contiguous KV cache) on TP ranks gives one process's tokens, sampled
// ones included: the ranks draw from the same gathered logits.
func TestTensorParallelGenerate(t *testing.T) {
	m := tpTestModel(t, "llama")
	prompt := testPrompt(7, 3, 64)
	for _, s := range []Sampling{{TopK: 1}, {Temperature: 0.8, Seed: 5}} {
		want := generateAlone(t, m, prompt, 20, s)
		got := make([][]int, 2)
		err := inproc.Run(context.Background(), 2, func(ctx context.Context, pg comm.ProcessGroup) error {
			sliced, err := gpt.Parallelize(m, &tp.Region{Group: pg}, nil)
			if err != nil {
				return err
			}
			sm, err := NewSampler(s)
			if err != nil {
				return err
			}
			return Generate(ctx, sliced, prompt, 20, 0, -1, sm, func(id int) error { got[pg.Rank()] = append(got[pg.Rank()], id); return nil })
		})
		if err != nil {
			t.Fatal(err)
		}
		for r := range got {
			if fmt.Sprint(got[r]) != fmt.Sprint(want) {
				t.Errorf("sampling %+v: rank %d generated %v, one process %v", s, r, got[r], want)
			}
		}
	}
}

// TestTensorParallelRankLost: a rank that dies mid-generation ends the
// leader's step with an error naming it, and the other followers' too;
// nobody hangs.
func TestTensorParallelRankLost(t *testing.T) {
	w, err := inproc.New(inproc.Config{Size: 4, Timeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	errs := make([]error, 4)
	var wg sync.WaitGroup
	for r := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[r] = func() error {
				pg := w.Group(r)
				ctx := context.Background()
				sliced, err := gpt.Parallelize(tpTestModel(t, "gpt2"), &tp.Region{Group: pg}, nil)
				if err != nil {
					return err
				}
				eng, err := NewEngine(sliced, EngineConfig{MaxNumBatchedTokens: 16})
				if err != nil {
					return err
				}
				if r != 0 {
					return Follow(ctx, eng, pg)
				}
				ls, err := NewLockstep(ctx, eng, pg)
				if err != nil {
					return err
				}
				if _, err := ls.Add(Request{Prompt: testPrompt(5, 1, 64), MaxTokens: 40, Sampling: Sampling{TopK: 1}}); err != nil {
					return err
				}
				for step := 0; ls.HasWork(); step++ {
					if step == 5 {
						w.Kill(2) // rank 2 dies between steps 5 and 6
					}
					if _, err := ls.Step(); err != nil {
						if _, err2 := ls.Step(); !errors.Is(err2, err) && err2.Error() != err.Error() {
							return fmt.Errorf("a step after the failure: %v, want the failure again", err2)
						}
						return err
					}
				}
				return errors.New("generation finished although rank 2 died")
			}()
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("ranks still running 60 s after rank 2 died")
	}
	for _, r := range []int{0, 1, 3} {
		if errs[r] == nil || !strings.Contains(errs[r].Error(), "rank 2") || !errors.Is(errs[r], comm.ErrPeerLost) {
			t.Errorf("rank %d: %v, want an error naming rank 2 (peer lost)", r, errs[r])
		}
	}
	t.Logf("leader: %v", errs[0])
	t.Logf("rank 1: %v", errs[1])
	t.Logf("rank 2 (killed): %v", errs[2])
}

// TestTensorParallelEnginesMustAgree: a rank whose engine is configured
// differently is named by the leader's NewLockstep, and refuses itself.
func TestTensorParallelEnginesMustAgree(t *testing.T) {
	m := tpTestModel(t, "gpt2")
	errs := make([]error, 2)
	err := inproc.Run(context.Background(), 2, func(ctx context.Context, pg comm.ProcessGroup) error {
		sliced, err := gpt.Parallelize(m, &tp.Region{Group: pg}, nil)
		if err != nil {
			return err
		}
		cfg := EngineConfig{MaxNumSeqs: 8}
		if pg.Rank() == 1 {
			cfg.MaxNumSeqs = 9
		}
		eng, err := NewEngine(sliced, cfg)
		if err != nil {
			return err
		}
		if pg.Rank() == 1 {
			errs[1] = Follow(ctx, eng, pg)
		} else {
			_, errs[0] = NewLockstep(ctx, eng, pg)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if errs[0] == nil || !strings.Contains(errs[0].Error(), "rank 1's engine configuration") {
		t.Errorf("leader: %v, want rank 1 named", errs[0])
	}
	if errs[1] == nil || !strings.Contains(errs[1].Error(), "9 seqs") {
		t.Errorf("rank 1: %v, want its configuration against rank 0's", errs[1])
	}
}

// TestTensorParallelRunner: a Runner over rank 0's Lockstep serves
// concurrent requests with one process's tokens, stays in step through an
// idle spell longer than the group's timeout (keep-alives), and its end
// lets the followers return.
func TestTensorParallelRunner(t *testing.T) {
	m := tpTestModel(t, "llama")
	cfg := EngineConfig{MaxNumBatchedTokens: 24, BlockTokens: 4}
	eng, err := NewEngine(m, cfg)
	if err != nil {
		t.Fatal(err)
	}
	want, err := runRequests(t, eng, tpRequests())
	if err != nil {
		t.Fatal(err)
	}
	w, err := inproc.New(inproc.Config{Size: 2, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	followed := make(chan error, 1)
	go func() {
		pg := w.Group(1)
		sliced, err := gpt.Parallelize(m, &tp.Region{Group: pg}, nil)
		if err == nil {
			var e *Engine
			if e, err = NewEngine(sliced, cfg); err == nil {
				err = Follow(context.Background(), e, pg)
			}
		}
		followed <- err
	}()
	pg := w.Group(0)
	sliced, err := gpt.Parallelize(m, &tp.Region{Group: pg}, nil)
	if err != nil {
		t.Fatal(err)
	}
	e, err := NewEngine(sliced, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ls, err := NewLockstep(context.Background(), e, pg)
	if err != nil {
		t.Fatal(err)
	}
	r := NewLockstepRunner(ls, 200*time.Millisecond)
	ctx, stop := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- r.Run(ctx) }()
	submitAll := func() tpRun {
		got := tpRun{}
		var mu sync.Mutex
		var wg sync.WaitGroup
		for i, req := range tpRequests() {
			wg.Add(1)
			go func() {
				defer wg.Done()
				s, err := r.Submit(context.Background(), req)
				if err != nil {
					t.Error(err)
					return
				}
				for {
					ev, err := s.Next(context.Background())
					if err != nil {
						return
					}
					mu.Lock()
					got[i] = append(got[i], ev)
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		return got
	}
	compareRuns(t, submitAll(), want, 1e-5)
	time.Sleep(1500 * time.Millisecond) // idle past the group's 1 s timeout
	compareRuns(t, submitAll(), want, 1e-5)
	stop()
	if err := <-ran; !errors.Is(err, context.Canceled) {
		t.Errorf("Run: %v, want context.Canceled", err)
	}
	if err := <-followed; err != nil {
		t.Errorf("follower: %v, want nil after the leader's runner ended", err)
	}
}

// TestTensorParallelRunnerRankLost: when a follower dies mid-stream, the
// request in flight ends with an error naming it, Run returns it, and later
// submissions are refused: the group cannot step any more.
func TestTensorParallelRunnerRankLost(t *testing.T) {
	m := tpTestModel(t, "gpt2")
	w, err := inproc.New(inproc.Config{Size: 2, Timeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	cfg := EngineConfig{MaxNumBatchedTokens: 16}
	go func() {
		pg := w.Group(1)
		sliced, err := gpt.Parallelize(m, &tp.Region{Group: pg}, nil)
		if err != nil {
			return
		}
		if e, err := NewEngine(sliced, cfg); err == nil {
			Follow(context.Background(), e, pg)
		}
	}()
	pg := w.Group(0)
	sliced, err := gpt.Parallelize(m, &tp.Region{Group: pg}, nil)
	if err != nil {
		t.Fatal(err)
	}
	e, err := NewEngine(sliced, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ls, err := NewLockstep(context.Background(), e, pg)
	if err != nil {
		t.Fatal(err)
	}
	r := NewLockstepRunner(ls, 0)
	ran := make(chan error, 1)
	go func() { ran <- r.Run(context.Background()) }()
	s, err := r.Submit(context.Background(), Request{Prompt: testPrompt(5, 1, 64), MaxTokens: 50, Sampling: Sampling{TopK: 1}})
	if err != nil {
		t.Fatal(err)
	}
	var streamErr error
	for n := 0; ; n++ {
		if n == 3 {
			w.Kill(1)
		}
		_, err := s.Next(context.Background())
		if err == io.EOF {
			t.Fatal("the request finished although rank 1 died")
		}
		if err != nil {
			streamErr = err
			break
		}
	}
	select {
	case err := <-ran:
		if err == nil || !strings.Contains(err.Error(), "rank 1") || !errors.Is(err, comm.ErrPeerLost) {
			t.Errorf("Run: %v, want an error naming rank 1 (peer lost)", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run still running 30 s after rank 1 died")
	}
	if !strings.Contains(streamErr.Error(), "rank 1") {
		t.Errorf("stream: %v, want an error naming rank 1", streamErr)
	}
	if _, err := r.Submit(context.Background(), Request{Prompt: testPrompt(5, 1, 64), MaxTokens: 5}); !errors.Is(err, ErrClosed) {
		t.Errorf("Submit after the group failed: %v, want ErrClosed", err)
	}
}
