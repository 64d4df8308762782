package infer

import (
	"context"
	"errors"
	"io"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gotron/gotron/tensor"
)

// collect reads a stream to its end.
func collect(ctx context.Context, s *Stream) ([]int, FinishReason, error) {
	var toks []int
	for {
		ev, err := s.Next(ctx)
		if err == io.EOF {
			return toks, "", errors.New("stream ended without a final event")
		}
		if err != nil {
			return toks, "", err
		}
		if ev.Token >= 0 {
			toks = append(toks, ev.Token)
		}
		if ev.Finish != "" {
			switch _, err := s.Next(ctx); {
			case err == io.EOF:
				return toks, ev.Finish, nil
			case err != nil && ev.Finish == FinishAbort: // ErrClosed, a step's error
				return toks, ev.Finish, err
			}
			return toks, ev.Finish, errors.New("events after the final one")
		}
	}
}

// waitGoroutines waits for the goroutine count to fall to n. Goroutines
// end asynchronously after their work is done, so it polls, failing
// shortly before the test's deadline (go test -timeout) rather than after
// a fixed time a loaded machine may exceed.
func waitGoroutines(t *testing.T, n int) {
	t.Helper()
	deadline, ok := t.Deadline()
	if !ok {
		deadline = time.Now().Add(10 * time.Minute)
	}
	for runtime.NumGoroutine() > n {
		if time.Until(deadline) < 5*time.Second {
			t.Fatalf("%d goroutines, want %d", runtime.NumGoroutine(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestRunnerConcurrent: concurrent submitters each get their alone-output;
// cancelled requests free their blocks; stopping the runner ends what is
// left with ErrClosed; no goroutine outlives it.
func TestRunnerConcurrent(t *testing.T) {
	m := testModel(t, "llama-long")
	generateAlone(t, m, testPrompt(40, 1, 64), 2, Sampling{TopK: 1}) // starts the kernels' workers
	base := runtime.NumGoroutine()
	e := mustEngine(t, m, EngineConfig{BlockTokens: 4, MaxNumBatchedTokens: 32})
	r := NewRunner(e)
	ctx, stop := context.WithCancel(context.Background())
	runDone := make(chan error)
	go func() { runDone <- r.Run(ctx) }()

	var wg sync.WaitGroup
	errs := make(chan error, 40)
	for i := range 24 {
		wg.Go(func() {
			prompt := testPrompt(2+i%17, 300+i, 64)
			want := generateAlone(t, m, prompt, 10, Sampling{TopK: 1})
			s, err := r.Submit(context.Background(), Request{Prompt: prompt, MaxTokens: 10, Sampling: Sampling{TopK: 1}})
			if err != nil {
				errs <- err
				return
			}
			got, fin, err := collect(context.Background(), s)
			if err != nil || fin != FinishLength || !slices.Equal(got, want) {
				errs <- errors.New("request " + string(rune('a'+i)) + ": wrong output")
			}
		})
	}
	// Cancelled mid-flight through the context.
	for range 4 {
		wg.Go(func() {
			cctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			s, err := r.Submit(cctx, Request{Prompt: testPrompt(40, 9, 64), MaxTokens: 2000, Sampling: Sampling{TopK: 1}})
			if err != nil {
				errs <- err
				return
			}
			if _, err := s.Next(context.Background()); err != nil {
				errs <- err
			}
			cancel()
			if _, fin, err := collect(context.Background(), s); err != nil || fin != FinishAbort {
				errs <- errors.New("cancelled request did not abort")
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	// Every stream has its final event, so Stats shows every block back.
	if st := r.Stats(); st.KVBlocksUsed != 0 || st.Running+st.Waiting != 0 {
		t.Fatalf("blocks still used: %+v", st)
	}
	if _, err := r.Submit(context.Background(), Request{MaxTokens: 1}); !errors.Is(err, ErrBadRequest) {
		t.Fatalf("empty prompt: %v", err)
	}
	// A request left running when the runner stops ends with ErrClosed.
	s, err := r.Submit(context.Background(), Request{Prompt: testPrompt(40, 9, 64), MaxTokens: 2000, Sampling: Sampling{TopK: 1}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Next(context.Background()); err != nil {
		t.Fatal(err)
	}
	stop()
	if err := <-runDone; !errors.Is(err, context.Canceled) {
		t.Fatalf("Run returned %v", err)
	}
	if _, _, err := collect(context.Background(), s); !errors.Is(err, ErrClosed) {
		t.Fatalf("stream after stop: %v", err)
	}
	if _, err := r.Submit(context.Background(), Request{Prompt: []int32{1}, MaxTokens: 1}); !errors.Is(err, ErrClosed) {
		t.Fatalf("submit after stop: %v", err)
	}
	if st := r.Stats(); st.KVBlocksUsed != 0 {
		t.Fatalf("after stop: %+v", st)
	}
	waitGoroutines(t, base)
}

// TestRunnerSurvivesPanic: a step that panics (here a weight of the wrong
// shape) ends the requests in flight with an error and frees their blocks;
// the runner keeps running.
func TestRunnerSurvivesPanic(t *testing.T) {
	m := testModel(t, "gpt2")
	e := mustEngine(t, m, EngineConfig{Weights: WeightsModel})
	good := m.Layers[1].FC2
	m.Layers[1].FC2 = tensor.Zeros(3, 3)
	r := NewRunner(e)
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- r.Run(ctx) }()
	s, err := r.Submit(context.Background(), Request{Prompt: []int32{1, 2, 3}, MaxTokens: 4, Sampling: Sampling{TopK: 1}})
	if err != nil {
		t.Fatal(err)
	}
	if _, fin, err := collect(context.Background(), s); fin != FinishAbort || err == nil || !strings.Contains(err.Error(), "panicked") {
		t.Fatalf("finish %q, error %v", fin, err)
	}
	m.Layers[1].FC2 = good
	s, _ = r.Submit(context.Background(), Request{Prompt: []int32{1, 2, 3}, MaxTokens: 4, Sampling: Sampling{TopK: 1}})
	if toks, fin, err := collect(context.Background(), s); err != nil || fin != FinishLength || len(toks) != 4 {
		t.Fatalf("after the panic: %v %q %v", toks, fin, err)
	}
	if st := r.Stats(); st.KVBlocksUsed != 0 {
		t.Fatalf("blocks leaked: %+v", st)
	}
	stop()
	<-done
}

// TestRunnerStatsBeforeFinalEvent: once a caller has a request's final
// event, Stats already counts the step that finished it (blocks freed, the
// sequence gone), so a server answering /metrics right after a response
// never shows the finished request as running.
func TestRunnerStatsBeforeFinalEvent(t *testing.T) {
	m := testModel(t, "gpt2")
	r := NewRunner(mustEngine(t, m, EngineConfig{Weights: WeightsModel}))
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- r.Run(ctx) }()
	defer func() { stop(); <-done }()
	for i := range 200 {
		s, err := r.Submit(context.Background(), Request{Prompt: testPrompt(3, i, 64), MaxTokens: 1, Sampling: Sampling{TopK: 1}})
		if err != nil {
			t.Fatal(err)
		}
		if _, fin, err := collect(context.Background(), s); err != nil || fin != FinishLength {
			t.Fatalf("request %d: %q %v", i, fin, err)
		}
		if st := r.Stats(); st.KVBlocksUsed != 0 || st.Running+st.Waiting != 0 {
			t.Fatalf("request %d finished, but Stats still shows it: %+v", i, st)
		}
	}
}
