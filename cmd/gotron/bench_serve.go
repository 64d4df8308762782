package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/gotron/gotron/infer"
	"github.com/gotron/gotron/internal/cpu"
	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/tensor"
	"github.com/gotron/gotron/tokenizer"
)

const benchServeSynopsis = "bench serve [--load DIR | --preset tiny] [--clients 20] [--prompt-tokens 32] [--max-tokens 32] " +
	"[--shared-prefix-tokens 0] [--verify=true] [--timeout 2m] [engine flags of gotron serve]"

// benchServeFlags are gotron bench serve's own flags.
type benchServeFlags struct {
	serve                         serveFlags
	preset                        string
	initStd                       float64
	seed                          uint64
	clients, promptTokens, maxNew int
	sharedPrefix, warmup          int
	verify, bound                 bool
	timeout                       time.Duration
	cpuProfile                    string
}

// benchServe is a load test of gotron serve on 127.0.0.1: N concurrent
// streaming clients, each one greedy completion of its own prompt. It checks
// that every request completes with the output it gets alone (infer.Generate,
// gotron generate's loop), that the KV blocks and the goroutine count are
// back to their idle values after, and reports time to first token,
// inter-token latency (p50/p99, as the clients see them) and total tokens/s.
func benchServe(ctx context.Context, env *cli, args []string) error {
	var f benchServeFlags
	fs := newFlags("bench serve", benchServeSynopsis)
	addServeFlags(fs, &f.serve)
	fs.StringVar(&f.preset, "preset", "tiny", "without --load: a randomly initialised model preset (tiny, gpt2-small, gpt2-medium, llama-tiny)")
	fs.Float64Var(&f.initStd, "init-method-std", 0.5, "with --preset: init std (large values spread the logits, so greedy outputs are not decided by rounding)")
	fs.Uint64Var(&f.seed, "seed", 1234, "model init and prompt seed")
	fs.IntVar(&f.clients, "clients", 20, "concurrent streaming clients (1..1000), one request each")
	fs.IntVar(&f.promptTokens, "prompt-tokens", 32, "tokens per prompt")
	fs.IntVar(&f.maxNew, "max-tokens", 32, "tokens generated per request (end of document ignored)")
	fs.IntVar(&f.sharedPrefix, "shared-prefix-tokens", 0, "tokens every prompt starts with (exercises prefix caching)")
	fs.IntVar(&f.warmup, "warmup", 1, "requests sent one by one before the timed run")
	fs.BoolVar(&f.verify, "verify", true, "check each output against the request decoded alone")
	fs.BoolVar(&f.bound, "bandwidth-bound", false, "after the run, also measure memcpy bandwidth and the FMA peak and print the decode bounds: weight bytes read per token / bandwidth, FLOPs per token / peak")
	fs.DurationVar(&f.timeout, "timeout", 2*time.Minute, "bound on the timed run")
	fs.StringVar(&f.cpuProfile, "cpuprofile", "", "write a CPU profile of the timed run to this file")
	if err := parseFlags(fs, args, env.stdout, benchServeSynopsis); err != nil {
		return err
	}
	switch {
	case f.clients < 1 || f.clients > 1000:
		return fmt.Errorf("--clients %d: want 1..1000", f.clients)
	case f.promptTokens < 1 || f.maxNew < 1:
		return fmt.Errorf("--prompt-tokens and --max-tokens: want >= 1")
	case f.sharedPrefix < 0 || f.sharedPrefix > f.promptTokens:
		return fmt.Errorf("--shared-prefix-tokens %d: want 0..--prompt-tokens", f.sharedPrefix)
	}
	m, tok, err := benchServeModel(&f)
	if err != nil {
		return err
	}
	if f.serve.modelName == "" {
		f.serve.modelName = "bench"
	}
	srv, runner, err := buildServer(&f.serve, m, tok, nil)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	base := "http://" + ln.Addr().String()
	runCtx, stopRunner := context.WithCancel(context.Background())
	runDone := make(chan struct{})
	go func() { runner.Run(runCtx); close(runDone) }()
	hs, ln := httpServer(&f.serve, srv, ln)
	go hs.Serve(ln)
	defer func() { hs.Close(); stopRunner(); <-runDone }()

	prompts := benchPrompts(&f, tok.VocabSize())
	c := m.Config
	fmt.Fprintf(env.stdout, "bench serve: %d layers, hidden %d, heads %d (kv %d), vocab %d, %d params; %d clients × (%d prompt + %d new tokens); %d threads; decode weights: %s; GOGC %d\n",
		c.NumLayers, c.HiddenSize, c.NumAttentionHeads, c.NumQueryGroups, c.VocabSize, m.NumParams(), f.clients, f.promptTokens, f.maxNew, runtime.GOMAXPROCS(0), weightsDescription(runner.Engine()), gcPercent())
	var want []string
	if f.verify {
		if want, err = benchAloneOutputs(ctx, m, tok, prompts, f.maxNew); err != nil {
			return err
		}
	}
	tr := &http.Transport{MaxIdleConnsPerHost: f.clients, MaxConnsPerHost: 0, DisableCompression: true}
	client := &http.Client{Transport: tr}
	for i := range f.warmup {
		if _, err := benchRequest(ctx, client, base, prompts[i%len(prompts)], f.maxNew, time.Now); err != nil {
			return fmt.Errorf("warm-up: %w", err)
		}
	}
	tr.CloseIdleConnections()
	idleGoroutines := settledGoroutines()
	st0 := runner.Stats()

	runCtx2, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	results := make([]benchResult, f.clients)
	var wg sync.WaitGroup
	if f.cpuProfile != "" {
		pf, err := os.Create(f.cpuProfile)
		if err != nil {
			return fmt.Errorf("--cpuprofile: %w", err)
		}
		defer pf.Close()
		if err := pprof.StartCPUProfile(pf); err != nil {
			return fmt.Errorf("--cpuprofile: %w", err)
		}
	}
	start := time.Now()
	for i := range f.clients {
		wg.Go(func() {
			results[i], results[i].err = benchRequest(runCtx2, client, base, prompts[i], f.maxNew, time.Now)
		})
	}
	wg.Wait()
	wall := time.Since(start)
	if f.cpuProfile != "" {
		pprof.StopCPUProfile()
	}
	tr.CloseIdleConnections()

	// Idle again. The runner takes its Stats before it delivers a step's
	// events, so once every stream has ended the blocks are back: no wait.
	// A request that failed (--timeout) is cancelled asynchronously, so
	// then the blocks get a bounded wait. Goroutines (the server's side of
	// each connection) end asynchronously after the clients close theirs;
	// the bound is only reached when some leaked.
	st := runner.Stats()
	failed := slices.ContainsFunc(results, func(r benchResult) bool { return r.err != nil })
	for deadline := time.Now().Add(idleWait); failed && !idle(st) && time.Now().Before(deadline); st = runner.Stats() {
		time.Sleep(10 * time.Millisecond)
	}
	after := waitForGoroutines(idleGoroutines, idleWait)
	err = benchServeReport(env, &f, results, want, wall, st0, st, idleGoroutines, after)
	if f.bound {
		printDecodeBounds(env, m, f.serve.bf16)
	}
	return err
}

// printDecodeBounds measures and prints the decode bounds of m on this
// machine. It runs after the timed run, which its gigabyte of copied memory
// (garbage the runtime then returns to the OS) and its seconds of FMA loops
// would disturb.
func printDecodeBounds(env *cli, m *gpt.Model, bf16 bool) {
	bw := memcpyBandwidth()
	wb := weightBytesPerToken(m, bf16)
	fmt.Fprintf(env.stdout, "bandwidth bound: %.1f MB of weights per token / memcpy %.1f GB/s (bytes copied per second, %d threads) = %.1f tokens/s\n",
		float64(wb)/1e6, bw/1e9, runtime.GOMAXPROCS(0), bw/float64(wb))
	// The batched steps are compute-bound: their ceiling is the FMA peak
	// over 2 FLOP per weight per token, and its ratio to the bandwidth
	// bound caps what many clients can gain over one.
	peak := cpu.FMAPeak(cpu.Threads(), time.Second)
	flops := 2 * float64(weightBytesPerToken(m, false)/4)
	fmt.Fprintf(env.stdout, "compute bound: FMA peak %.1f GFLOP/s (cpu.FMAPeak, %d threads) / %.1f MFLOP per token = %.1f tokens/s, %.1f× the bandwidth bound\n",
		peak, cpu.Threads(), flops/1e6, peak*1e9/flops, peak*1e9/flops/(bw/float64(wb)))
}

// idleWait bounds the waits for the server to be idle after the run.
const idleWait = 30 * time.Second

// idle reports whether the engine holds no sequence and no block.
func idle(st infer.Stats) bool { return st.KVBlocksUsed == 0 && st.Running == 0 && st.Waiting == 0 }

// weightBytesPerToken is what one decode step of one sequence must read:
// every float32 weight except the embedding tables, of which only a row is
// read, plus the output layer (the word embeddings when tied).
func weightBytesPerToken(m *gpt.Model, bf16 bool) int64 {
	n := int64(m.NumParams()) - int64(m.WordEmb.Numel())
	if m.PosEmb != nil {
		n -= int64(m.PosEmb.Numel())
	}
	if m.OutputLayer == nil {
		n += int64(m.WordEmb.Numel())
	}
	if bf16 {
		return 2 * n
	}
	return 4 * n
}

// memcpyBandwidth copies 512 MB with GOMAXPROCS goroutines, best of five,
// and returns bytes copied per second.
func memcpyBandwidth() float64 {
	const n = 128 << 20 // float32s
	src, dst := make([]float32, n), make([]float32, n)
	for i := range src {
		src[i], dst[i] = float32(i), 1
	}
	th := runtime.GOMAXPROCS(0)
	best := time.Duration(1 << 62)
	for range 5 {
		t := time.Now()
		var wg sync.WaitGroup
		for p := range th {
			lo, hi := p*n/th, (p+1)*n/th
			wg.Go(func() { copy(dst[lo:hi], src[lo:hi]) })
		}
		wg.Wait()
		best = min(best, time.Since(t))
	}
	return 4 * n / best.Seconds()
}

// benchServeModel loads --load, or builds a random --preset model with the
// embedded GPT-2 tokenizer (GPT-2-sized vocabularies) or a NullTokenizer.
func benchServeModel(f *benchServeFlags) (*gpt.Model, tokenizer.Tokenizer, error) {
	if f.serve.load != "" {
		m, _, tokDir, err := loadAny(f.serve.load)
		if err != nil {
			return nil, nil, err
		}
		tok, err := checkpointTokenizer(f.serve.tok, tokDir, m.Config.VocabSize, f.serve.load, io.Discard)
		if err != nil {
			tok, err = tokenizer.New(tokenizer.Config{Type: tokenizer.TypeNull, VocabSize: m.Config.VocabSize})
		}
		return m, tok, err
	}
	cfg, err := gpt.Preset(f.preset)
	if err != nil {
		return nil, nil, fmt.Errorf("--preset: %w", err)
	}
	cfg.InitMethodStd = float32(f.initStd)
	m, err := gpt.New(cfg, tensor.NewRNG(f.seed))
	if err != nil {
		return nil, nil, err
	}
	tok, err := checkpointTokenizer(f.serve.tok, "", cfg.VocabSize, "--preset "+f.preset, io.Discard)
	if err != nil {
		tok, err = tokenizer.New(tokenizer.Config{Type: tokenizer.TypeNull, VocabSize: cfg.VocabSize})
	}
	return m, tok, err
}

// benchPrompts draws one prompt of token ids per client (sharing the first
// --shared-prefix-tokens).
func benchPrompts(f *benchServeFlags, vocab int) [][]int32 {
	rng := rand.New(rand.NewPCG(f.seed, 7))
	shared := make([]int32, f.sharedPrefix)
	for i := range shared {
		shared[i] = int32(rng.IntN(vocab - 1))
	}
	out := make([][]int32, max(f.clients, f.warmup))
	for i := range out {
		p := append([]int32(nil), shared...)
		for len(p) < f.promptTokens {
			p = append(p, int32(rng.IntN(vocab-1))) // never the last id (often the end of document)
		}
		out[i] = p
	}
	return out
}

// benchAloneOutputs decodes each prompt alone with infer.Generate (gotron
// generate's loop, greedy) and returns the texts the server must stream.
func benchAloneOutputs(ctx context.Context, m *gpt.Model, tok tokenizer.Tokenizer, prompts [][]int32, maxNew int) ([]string, error) {
	out := make([]string, len(prompts))
	for i, p := range prompts {
		sm, _ := infer.NewSampler(infer.Sampling{TopK: 1})
		ids := make([]int, len(p))
		for j, id := range p {
			ids[j] = int(id)
		}
		stream := infer.NewTextStream(tok, ids)
		var b strings.Builder
		err := infer.Generate(ctx, m, p, maxNew, tok.VocabSize(), -1, sm, func(id int) error {
			b.WriteString(stream.Add(id))
			return nil
		})
		if err != nil {
			return nil, err
		}
		out[i] = b.String()
	}
	return out, nil
}

// benchResult is one client's view of its request.
type benchResult struct {
	text   string
	finish string
	tokens int
	ttft   time.Duration
	gaps   []time.Duration // between consecutive chunks
	err    error
}

// benchRequest sends one streaming greedy completion and times its chunks.
func benchRequest(ctx context.Context, client *http.Client, base string, prompt []int32, maxNew int, now func() time.Time) (benchResult, error) {
	var r benchResult
	body, _ := json.Marshal(map[string]any{"prompt": prompt, "max_tokens": maxNew, "temperature": 0, "ignore_eos": true,
		"stream": true, "stream_options": map[string]bool{"include_usage": true}})
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/completions", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	t0 := now()
	resp, err := client.Do(req)
	if err != nil {
		return r, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return r, fmt.Errorf("status %s", resp.Status)
	}
	sc := bufio.NewScanner(resp.Body)
	last, done := t0, false
	var text strings.Builder
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if line == "[DONE]" {
			done = true
			break
		}
		var ch struct {
			Choices []struct {
				Text         string
				FinishReason *string `json:"finish_reason"`
			}
			Usage *struct {
				CompletionTokens int `json:"completion_tokens"`
			}
			Error *struct{ Message string }
		}
		if err := json.Unmarshal([]byte(line), &ch); err != nil {
			return r, fmt.Errorf("bad chunk %q: %v", line, err)
		}
		if ch.Error != nil {
			return r, errors.New(ch.Error.Message)
		}
		if ch.Usage != nil {
			r.tokens = ch.Usage.CompletionTokens
		}
		if len(ch.Choices) == 0 {
			continue
		}
		t := now()
		if r.ttft == 0 {
			r.ttft = t.Sub(t0)
		} else {
			r.gaps = append(r.gaps, t.Sub(last))
		}
		last = t
		text.WriteString(ch.Choices[0].Text)
		if ch.Choices[0].FinishReason != nil {
			r.finish = *ch.Choices[0].FinishReason
		}
	}
	r.text = text.String()
	if err := sc.Err(); err != nil {
		return r, err
	}
	if !done {
		return r, errors.New("stream ended without [DONE]")
	}
	return r, nil
}

// settledGoroutines returns the goroutine count once it stops changing
// (connections closing), waiting at most a second.
func settledGoroutines() int {
	n, same := runtime.NumGoroutine(), 0
	for i := 0; i < 100 && same < 5; i++ {
		time.Sleep(10 * time.Millisecond)
		if m := runtime.NumGoroutine(); m == n {
			same++
		} else {
			n, same = m, 0
		}
	}
	return n
}

// waitForGoroutines waits up to d for the count to fall to n and returns it.
func waitForGoroutines(n int, d time.Duration) int {
	deadline := time.Now().Add(d)
	for runtime.NumGoroutine() > n && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	return runtime.NumGoroutine()
}

func percentile(xs []time.Duration, p float64) time.Duration {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	i := int(p*float64(len(s))+0.5) - 1
	return s[min(max(i, 0), len(s)-1)]
}

func fmtMs(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000) }

// benchServeReport prints the run and returns an error when a check failed.
func benchServeReport(env *cli, f *benchServeFlags, res []benchResult, want []string, wall time.Duration, st0, st infer.Stats, idle, after int) error {
	var ttft, gaps []time.Duration
	tokens, failed, mismatched := 0, 0, 0
	var firstErr error
	for i, r := range res {
		switch {
		case r.err != nil:
			failed++
			if firstErr == nil {
				firstErr = fmt.Errorf("request %d: %w", i, r.err)
			}
			continue
		case r.finish != "length" || r.tokens != f.maxNew:
			failed++
			if firstErr == nil {
				firstErr = fmt.Errorf("request %d: finish %q after %d tokens, want length after %d", i, r.finish, r.tokens, f.maxNew)
			}
		case want != nil && r.text != want[i]:
			mismatched++
			if firstErr == nil {
				firstErr = fmt.Errorf("request %d: output %q, alone %q", i, r.text, want[i])
			}
		}
		tokens += r.tokens
		ttft = append(ttft, r.ttft)
		gaps = append(gaps, r.gaps...)
	}
	w := env.stdout
	verified := "not checked (--verify=false)"
	if want != nil {
		verified = fmt.Sprintf("%d of %d equal their alone output", len(res)-failed-mismatched, len(res))
	}
	fmt.Fprintf(w, "requests: %d completed, %d failed; outputs: %s\n", len(res)-failed, failed, verified)
	fmt.Fprintf(w, "throughput: %d tokens in %.2f s = %.1f tokens/s (%.1f per client)\n", tokens, wall.Seconds(), float64(tokens)/wall.Seconds(), float64(tokens)/wall.Seconds()/float64(len(res)))
	fmt.Fprintf(w, "time to first token: p50 %s, p99 %s; inter-token: p50 %s, p99 %s\n", fmtMs(percentile(ttft, 0.5)), fmtMs(percentile(ttft, 0.99)), fmtMs(percentile(gaps, 0.5)), fmtMs(percentile(gaps, 0.99)))
	var rates []time.Duration // per request: mean gap, as a duration
	for _, r := range res {
		if len(r.gaps) > 0 {
			var sum time.Duration
			for _, g := range r.gaps {
				sum += g
			}
			rates = append(rates, sum/time.Duration(len(r.gaps)))
		}
	}
	if med := percentile(rates, 0.5); med > 0 {
		fmt.Fprintf(w, "decode: %.1f tokens/s per sequence (median over requests of 1 / mean inter-token time)\n", 1/med.Seconds())
	}
	steps := st.Steps - st0.Steps
	fmt.Fprintf(w, "engine: %d steps, %.1f tokens per step, %d preemptions, %d prompt tokens from the prefix cache\n",
		steps, float64(st.BatchedTokens-st0.BatchedTokens)/float64(max(steps, 1)), st.Preemptions-st0.Preemptions, st.PrefixCacheHitTokens-st0.PrefixCacheHitTokens)
	fmt.Fprintf(w, "after: %d KV blocks used (of %d), %d running, %d waiting; goroutines %d (idle before: %d)\n", st.KVBlocksUsed, st.KVBlocksTotal, st.Running, st.Waiting, after, idle)
	switch {
	case firstErr != nil:
		return fmt.Errorf("bench serve: %d failed, %d mismatched; first: %w", failed, mismatched, firstErr)
	case st.KVBlocksUsed != 0 || st.Running != 0 || st.Waiting != 0:
		return fmt.Errorf("bench serve: %d KV blocks still used after all requests", st.KVBlocksUsed)
	case after > idle:
		return fmt.Errorf("bench serve: %d goroutines after the run, %d before", after, idle)
	}
	return nil
}
