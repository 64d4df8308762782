package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// tpModelArgs are the two model families of the tensor-parallel tests, with
// every size 2 and 4 divide: GPT-2-style (learned positions, LayerNorm,
// GELU, biases, tied) and Llama-style (RoPE, GQA with two heads a group,
// RMSNorm, SwiGLU, no biases, untied). A large init std spreads the logits,
// so greedy choices are not decided by rounding.
var tpModelArgs = map[string][]string{
	"gpt2": {"--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--init-method-std", "0.3"},
	"llama": {"--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "8", "--group-query-attention", "--num-query-groups", "4",
		"--ffn-hidden-size", "96", "--position-embedding-type", "rope", "--normalization", "RMSNorm", "--swiglu",
		"--disable-bias-linear", "--untie-embeddings-and-output-weights", "--init-method-std", "0.3"},
	"mla": {"--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--multi-latent-attention", "--q-lora-rank", "12",
		"--kv-lora-rank", "10", "--qk-head-dim", "6", "--qk-pos-emb-head-dim", "4", "--v-head-dim", "5", "--rotary-scaling-factor", "40",
		"--mscale", "0.707", "--mscale-all-dim", "0.707", "--normalization", "RMSNorm", "--swiglu", "--disable-bias-linear",
		"--position-embedding-type", "none", "--init-method-std", "0.3"},
	// Qwen-MoE-style: 4 experts top-2, grouped GEMM, a shared expert;
	// training MoE over TP ranks needs sequence parallelism (Megatron's)
	"moe": {"--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--position-embedding-type", "rope",
		"--normalization", "RMSNorm", "--swiglu", "--disable-bias-linear", "--num-experts", "4", "--moe-router-topk", "2",
		"--moe-ffn-hidden-size", "16", "--moe-grouped-gemm", "--moe-shared-expert-intermediate-size", "24", "--moe-aux-loss-coeff", "1e-2",
		"--sequence-parallel", "--init-method-std", "0.3"},
}

// trainTPCheckpoint trains kind's model for 2 iterations on tp ranks (gotron
// launch --inproc when tp > 1) and returns the checkpoint.
func trainTPCheckpoint(t *testing.T, dir, kind string, tp int, data, vocab, merges string) string {
	t.Helper()
	ck := filepath.Join(dir, fmt.Sprintf("%s-tp%d", kind, tp))
	args := append([]string{"train", "--data-path", data, "--vocab-file", vocab, "--merge-file", merges, "--tokenizer-type", "GPT2BPETokenizer",
		"--seq-length", "32", "--max-position-embeddings", "64", "--micro-batch-size", "1", "--global-batch-size", "2",
		"--train-iters", "2", "--lr", "1e-3", "--eval-iters", "0", "--split", "100,0,0", "--save", ck, "--save-interval", "2", "--log-interval", "1",
		"--tensor-model-parallel-size", fmt.Sprint(tp)}, tpModelArgs[kind]...)
	if tp > 1 {
		args = append([]string{"launch", "--inproc", "--nproc-per-node", fmt.Sprint(tp), "--"}, args...)
	}
	if _, errs, code := runCLI(t, args...); code != 0 {
		t.Fatalf("train %s at TP=%d: %s", kind, tp, errs)
	}
	return ck
}

// tpResult is what the tests compare of an inference run's output JSON.
type tpResult struct {
	Tokens   []int     `json:"generated_tokens"`
	Text     string    `json:"generated_text"`
	Logprobs []float64 `json:"logprobs"`
}

func readTPResults(t *testing.T, path string) map[string]tpResult {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	out := map[string]tpResult{}
	for k, v := range doc {
		var r tpResult
		if json.Unmarshal(v, &r) == nil && r.Tokens != nil {
			out[k] = r
		}
	}
	if len(out) == 0 {
		t.Fatalf("%s: no results", path)
	}
	return out
}

// compareTPResults checks equal tokens and text, and log-probabilities
// (prompt and generated) within tol of the one-process run's.
func compareTPResults(t *testing.T, what string, got, want map[string]tpResult, tol float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d results, one process %d", what, len(got), len(want))
	}
	worst := 0.0
	for k, w := range want {
		g := got[k]
		if fmt.Sprint(g.Tokens) != fmt.Sprint(w.Tokens) || g.Text != w.Text {
			t.Errorf("%s: request %s generated %v %q, one process %v %q", what, k, g.Tokens, g.Text, w.Tokens, w.Text)
			continue
		}
		if len(g.Logprobs) != len(w.Logprobs) || len(w.Logprobs) == 0 {
			t.Fatalf("%s: request %s: %d log-probabilities, one process %d", what, k, len(g.Logprobs), len(w.Logprobs))
		}
		for i := range w.Logprobs {
			worst = max(worst, math.Abs(g.Logprobs[i]-w.Logprobs[i])/max(1, math.Abs(w.Logprobs[i])))
		}
	}
	if worst > tol {
		t.Errorf("%s: log-probabilities differ from one process's by up to %.3g, want <= %g", what, worst, tol)
	}
	t.Logf("%s: same tokens; log-probabilities within %.3g", what, worst)
}

// TestInferenceTensorParallel: Megatron's inference arguments with
// --tensor-model-parallel-size 2 and 4 (gotron launch --inproc) give one
// process's tokens, and log-probabilities within 1e-5, for a GPT-2-style
// checkpoint trained on one rank, and a Llama-style one and a multi-latent
// attention one (YaRN, --q-lora-rank; also with --cache-mla-latents)
// trained with TP=2 (checkpoints hold whole tensors: any TP size loads
// them); and as real processes over tcp under gotron launch.
func TestInferenceTensorParallel(t *testing.T) {
	dir := t.TempDir()
	data, vocab, merges := gpt2Corpus(t, dir, 24)
	prompts := []string{"--prompts", "the quick brown fox", "Document 3: func main() {", "jumps over"}
	infer := func(ck, out string, tp int) []string {
		return append([]string{"inference", "--load", ck, "--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", vocab, "--merge-file", merges,
			"--num-tokens-to-generate", "10", "--top_k", "1", "--return-log-probs", "--termination-id", "-1",
			"--tensor-model-parallel-size", fmt.Sprint(tp), "--output-path", out}, prompts...)
	}
	for _, c := range []struct {
		kind    string
		trainTP int
	}{{"gpt2", 1}, {"llama", 2}, {"mla", 2}} {
		ck := trainTPCheckpoint(t, dir, c.kind, c.trainTP, data, vocab, merges)
		one := filepath.Join(dir, c.kind+"-one.json")
		if _, errs, code := runCLI(t, infer(ck, one, 1)...); code != 0 {
			t.Fatalf("%s on one process: %s", c.kind, errs)
		}
		want := readTPResults(t, one)
		for _, tp := range []int{2, 4} {
			out := filepath.Join(dir, fmt.Sprintf("%s-tp%d.json", c.kind, tp))
			so, errs, code := runCLI(t, append([]string{"launch", "--inproc", "--nproc-per-node", fmt.Sprint(tp), "--"}, infer(ck, out, tp)...)...)
			if code != 0 {
				t.Fatalf("%s at TP=%d: %s", c.kind, tp, errs)
			}
			compareTPResults(t, fmt.Sprintf("%s (trained at TP=%d) at TP=%d, inproc", c.kind, c.trainTP, tp), readTPResults(t, out), want, 1e-5)
			if strings.Count(so, "[1 prompt tokens") > 0 || strings.Contains(so, "[rank1]: 0 [") {
				t.Errorf("a follower printed results:\n%s", so)
			}
			if !strings.Contains(errs, "tensor-parallel rank 1 of") {
				t.Errorf("followers do not say they followed rank 0:\n%s", errs)
			}
		}
		if c.kind == "mla" { // the latents cached: each rank keeps the whole latent
			out := filepath.Join(dir, "mla-latents-tp2.json")
			if _, errs, code := runCLI(t, append([]string{"launch", "--inproc", "--nproc-per-node", "2", "--"}, append(infer(ck, out, 2), "--cache-mla-latents")...)...); code != 0 {
				t.Fatalf("mla --cache-mla-latents at TP=2: %s", errs)
			}
			compareTPResults(t, "mla with --cache-mla-latents at TP=2, inproc", readTPResults(t, out), want, 1e-5)
		}
		if c.kind != "llama" {
			continue
		}
		// Real processes over tcp: gotron launch starts 2 gotron inference
		// processes (torchrun's environment) that join over sockets.
		bin, err := buildGotron()
		if err != nil {
			t.Fatal(err)
		}
		out := filepath.Join(dir, "llama-tcp.json")
		cmd := exec.Command(bin, append([]string{"launch", "--nproc-per-node", "2", "--master-port", freeTCPPort(t), "--"}, infer(ck, out, 2)...)...)
		cmd.Env = append(os.Environ(), "GOTRON_NUM_THREADS=1")
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("gotron launch --nproc-per-node 2 -- inference: %v\n%s", err, b)
		}
		compareTPResults(t, "llama (trained at TP=2) at TP=2, processes over tcp", readTPResults(t, out), want, 1e-5)

		// gotron generate: rank 0 prints what one process prints, sampled
		// tokens included (the ranks draw from the same gathered logits).
		checkGenerateOverTwoRanks(t, ck, vocab, merges, "--tensor-model-parallel-size", "TP=2")
	}
}

// TestInferenceTensorParallelMoE: an MoE checkpoint trained at TP=2 (expert
// tensor parallelism at the TP size, sequence parallelism) runs gotron
// inference at TP=2 and 4 (each expert split over the ranks) with one
// process's tokens and log-probabilities within 2e-6, and gotron generate
// at TP=2 prints one process's text.
func TestInferenceTensorParallelMoE(t *testing.T) {
	dir := t.TempDir()
	data, vocab, merges := gpt2Corpus(t, dir, 24)
	tok := []string{"--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", vocab, "--merge-file", merges}
	ck := trainTPCheckpoint(t, dir, "moe", 2, data, vocab, merges)
	infer := func(out string, tp int) []string {
		return append([]string{"inference", "--load", ck, "--num-tokens-to-generate", "10", "--top_k", "1", "--return-log-probs",
			"--termination-id", "-1", "--tensor-model-parallel-size", fmt.Sprint(tp), "--output-path", out,
			"--prompts", "the quick brown fox", "Document 3: func main() {", "jumps over"}, tok...)
	}
	one := filepath.Join(dir, "moe-one.json")
	if _, errs, code := runCLI(t, infer(one, 1)...); code != 0 {
		t.Fatalf("moe on one process: %s", errs)
	}
	want := readTPResults(t, one)
	for _, tp := range []int{2, 4} {
		out := filepath.Join(dir, fmt.Sprintf("moe-tp%d.json", tp))
		if _, errs, code := runCLI(t, append([]string{"launch", "--inproc", "--nproc-per-node", fmt.Sprint(tp), "--"}, infer(out, tp)...)...); code != 0 {
			t.Fatalf("moe at TP=%d: %s", tp, errs)
		}
		compareTPResults(t, fmt.Sprintf("moe (trained at TP=2) at TP=%d, inproc", tp), readTPResults(t, out), want, 2e-6)
	}
	// over two pipeline stages, each rank reading its stage's layers: the
	// routing is per token, on the stage holding the layer (within the
	// dense PP test's 2e-6, as TestInferencePipelineParallel: the ranks'
	// kernels split their threads otherwise; infer's
	// TestPipelineParallelMoEAndGDN shows the same bits in one process)
	pp := filepath.Join(dir, "moe-pp2.json")
	if _, errs, code := runCLI(t, append([]string{"launch", "--inproc", "--nproc-per-node", "2", "--"}, append(infer(pp, 1), "--pipeline-model-parallel-size", "2")...)...); code != 0 {
		t.Fatalf("moe at PP=2: %s", errs)
	}
	compareTPResults(t, "moe (trained at TP=2) at PP=2, inproc", readTPResults(t, pp), want, 2e-6)
	gen := append([]string{"generate", "--load", ck, "--prompt", "the quick brown", "--max-new-tokens", "12", "--top-k", "1"}, tok...)
	oneText, errs, code := runCLI(t, gen...)
	if code != 0 {
		t.Fatalf("generate: %s", errs)
	}
	got, errs, code := runCLI(t, append([]string{"launch", "--inproc", "--nproc-per-node", "2", "--"}, append(gen, "--tensor-model-parallel-size", "2")...)...)
	if code != 0 {
		t.Fatalf("generate at TP=2: %s", errs)
	}
	if got != "[rank0]: "+oneText {
		t.Errorf("generate at TP=2 printed %q, one process %q", got, oneText)
	}
}

// TestInferenceTensorParallelRefusals: sizes that do not divide the model,
// and a TP size without its ranks, are refused naming the flag.
func TestInferenceTensorParallelRefusals(t *testing.T) {
	dir, tokFlags := inferenceCheckpoint(t) // 4 heads, hidden 32, vocabulary 50304
	base := append([]string{"inference", "--load", dir, "--prompts", "hi"}, tokFlags...)
	checkInferenceRefusals(t, base, []inferenceRefusal{
		{1, []string{"--tensor-model-parallel-size", "2"}, "--tensor-model-parallel-size 2 needs 2 ranks: start them with gotron launch"},
		{3, []string{"--tensor-model-parallel-size", "3"}, "--num-attention-heads=4 is not divisible by --tensor-model-parallel-size=3"},
		{2, nil, "a world of 2 ranks with --tensor-model-parallel-size 1: needs data-parallel inference replicas"},
		{1, []string{"--tensor-model-parallel-size", "0"}, "--tensor-model-parallel-size"},
		{1, []string{"--distributed-timeout-minutes", "-1"}, "--distributed-timeout-minutes -1: want minutes >= 0"},
	})
}

// inferenceRefusal is a gotron inference command line that must fail:
// extra flags, over launch ranks (1: no launch), and what stderr must say.
type inferenceRefusal struct {
	launch int
	args   []string
	want   string
}

// checkInferenceRefusals runs base plus each refusal's flags (under gotron
// launch --inproc where it asks for more than one rank) and wants a
// failure whose stderr says what the refusal wants.
func checkInferenceRefusals(t *testing.T, base []string, refusals []inferenceRefusal) {
	t.Helper()
	for _, c := range refusals {
		args := append(append([]string{}, base...), c.args...)
		if c.launch > 1 {
			args = append([]string{"launch", "--inproc", "--nproc-per-node", fmt.Sprint(c.launch), "--"}, args...)
		}
		_, errs, code := runCLI(t, args...)
		if code == 0 || !strings.Contains(errs, c.want) {
			t.Errorf("%v (%d ranks): exit %d, stderr %q; want %q", c.args, c.launch, code, errs, c.want)
		}
	}
}

// TestInferenceTensorParallelRankKilled: SIGKILL of rank 1 of a TP=2
// inference job mid-generation ends the job, naming rank 1, instead of
// leaving rank 0 waiting.
func TestInferenceTensorParallelRankKilled(t *testing.T) {
	checkInferenceRankKilled(t, "--tensor-model-parallel-size", "tensor-parallel")
}

// checkInferenceRankKilled runs gotron inference over two ranks (launch,
// real processes) with sizeFlag 2, SIGKILLs rank 1 once rank 0 has logged
// step 3, and wants the job to end within 60 s with rank 0's error naming
// rank 1 and, for the parallelism, "infer: "+what.
func checkInferenceRankKilled(t *testing.T, sizeFlag, what string) {
	t.Helper()
	if _, err := os.Stat("/proc/self/environ"); err != nil {
		t.Skip("needs /proc to find the worker process")
	}
	bin, err := buildGotron()
	if err != nil {
		t.Fatal(err)
	}
	dir, tokFlags := inferenceCheckpoint(t)
	tag := fmt.Sprintf("%d-%s", os.Getpid(), what)
	cmd := exec.Command(bin, append([]string{"launch", "--nproc-per-node", "2", "--master-port", freeTCPPort(t), "--",
		"inference", "--load", dir, sizeFlag, "2", "--prompts", "hello", "--num-tokens-to-generate", "120",
		"--termination-id", "-1", "--inference-logging-step-interval", "1"}, tokFlags...)...)
	cmd.Env = append(os.Environ(), "GOTRON_NUM_THREADS=1", "GOTRON_TEST_TAG="+tag)
	w := newLineWaiter("step 3:")
	cmd.Stdout, cmd.Stderr = w, w
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	select {
	case <-w.seen:
	case <-time.After(2 * time.Minute):
		t.Fatalf("no step 3 in 2 minutes:\n%s", w.String())
	}
	pid := workerPID(tag, 1)
	if pid == 0 {
		t.Fatalf("no rank 1 process:\n%s", w.String())
	}
	killed := time.Now()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	select {
	case <-exited:
	case <-time.After(60 * time.Second):
		t.Fatalf("the job still runs 60 s after rank 1 was killed:\n%s", w.String())
	}
	out := w.String()
	if cmd.ProcessState.ExitCode() == 0 || !strings.Contains(out, "worker rank 1") {
		t.Errorf("exit %d; want a failure naming rank 1:\n%s", cmd.ProcessState.ExitCode(), out)
	}
	if !strings.Contains(out, "[rank0]: gotron inference: infer: "+what) || !strings.Contains(out, "rank 1: peer lost") {
		t.Errorf("rank 0's error does not name rank 1 (peer lost):\n%s", out)
	}
	t.Logf("the job ended %.1f s after the kill:\n%s", time.Since(killed).Seconds(), out[max(0, len(out)-1500):])
}

// TestServeTensorParallel: gotron serve --tensor-model-parallel-size 2 on
// two ranks (gotron launch --inproc): rank 0 serves HTTP and answers what
// one process's generate prints, concurrent requests included, through an
// idle spell; on shutdown the follower ends with rank 0.
func TestServeTensorParallel(t *testing.T) {
	ck := serveCheckpoint(t)
	prompts := []string{"The capital of France is", "Once upon a time"}
	var want []string
	for _, p := range prompts {
		want = append(want, generateText(t, ck, p, 10))
	}
	base, stop := serveOverTwoRanks(t, ck, "--tensor-model-parallel-size")
	ask := func() {
		var wg sync.WaitGroup
		for i, p := range prompts {
			wg.Add(1)
			go func() {
				defer wg.Done()
				code, body := postJSON(t, base+"/v1/completions", `{"prompt":"`+p+`","max_tokens":10,"temperature":0}`)
				var c struct{ Choices []struct{ Text string } }
				if code != 200 || json.Unmarshal(body, &c) != nil || len(c.Choices) != 1 || c.Choices[0].Text != want[i] {
					t.Errorf("completion of %q at TP=2: %d %s; one process's generate: %q", p, code, body, want[i])
				}
			}()
		}
		wg.Wait()
	}
	ask()
	time.Sleep(6 * time.Second) // idle: the leader's keep-alives hold the follower
	ask()
	if errs := stop(); !strings.Contains(errs, "tensor-parallel rank 1: rank 0 stopped") {
		t.Errorf("the follower did not end with rank 0:\n%s", errs)
	}
}

// serveOverTwoRanks starts gotron serve on checkpoint ck with sizeFlag 2
// over two ranks (gotron launch --inproc, port 0) and returns rank 0's
// address once it listens. stop cancels the launcher (as SIGTERM: it
// reports the interruption, its ranks shut down), waits for it, fails the
// test unless rank 0 stopped cleanly, and returns the ranks' stderr.
func serveOverTwoRanks(t *testing.T, ck, sizeFlag string) (base string, stop func() string) {
	t.Helper()
	addr := make(chan string, 1)
	out := &serveLog{addr: addr}
	var errb bytes.Buffer
	env := &cli{stdout: out, stderr: &errb, stdin: strings.NewReader(""), getenv: func(string) string { return "" }}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, env, []string{"launch", "--inproc", "--nproc-per-node", "2", "--",
			"serve", "--load", ck, "--host", "127.0.0.1", "--port", "0", sizeFlag, "2"})
	}()
	stop = func() string {
		t.Helper()
		cancel()
		<-done
		if !strings.Contains(out.String(), "[rank0]: gotron serve: stopped") || strings.Contains(out.String(), "group failed") {
			t.Errorf("rank 0 did not stop cleanly:\n%s%s", out, errb.String())
		}
		return errb.String()
	}
	t.Cleanup(func() { cancel() })
	select {
	case base = <-addr:
	case code := <-done:
		t.Fatalf("serve exited %d: %s%s", code, out, errb.String())
	case <-time.After(2 * time.Minute):
		t.Fatalf("serve did not start: %s%s", out, errb.String())
	}
	return base, stop
}

// checkGenerateOverTwoRanks: gotron generate with sizeFlag 2 over two ranks
// (launch --inproc) prints on rank 0 what one process prints, greedy and
// sampled (seeded), for checkpoint ck, and no rank reports a stop short of
// --max-new-tokens (a pipeline stage's follower, whose emit sees no
// tokens, once did).
func checkGenerateOverTwoRanks(t *testing.T, ck, vocab, merges, sizeFlag, layout string) {
	t.Helper()
	for _, sampling := range [][]string{{"--top-k", "1"}, {"--temperature", "0.7", "--seed", "9"}} {
		gen := append([]string{"generate", "--load", ck, "--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", vocab, "--merge-file", merges,
			"--prompt", "the quick brown", "--max-new-tokens", "12"}, sampling...)
		one, errs, code := runCLI(t, gen...)
		if code != 0 {
			t.Fatalf("generate: %s", errs)
		}
		got, errs, code := runCLI(t, append([]string{"launch", "--inproc", "--nproc-per-node", "2", "--"}, append(gen, sizeFlag, "2")...)...)
		if code != 0 {
			t.Fatalf("generate at %s: %s", layout, errs)
		}
		if got != "[rank0]: "+one {
			t.Errorf("generate %v at %s printed %q, one process %q", sampling, layout, got, one)
		}
		if strings.Contains(errs, "stopped after") {
			t.Errorf("generate %v at %s: a rank reports a stop short of --max-new-tokens:\n%s", sampling, layout, errs)
		}
	}
}
