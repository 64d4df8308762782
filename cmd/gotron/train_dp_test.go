package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// dpTrain is a small data-parallel-divisible run: global batch 8.
var dpTrain = []string{"train", "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
	"--seq-length", "16", "--micro-batch-size", "1", "--global-batch-size", "8", "--lr", "1e-3", "--mock-data",
	"--vocab-size", "100", "--make-vocab-size-divisible-by", "64", "--log-interval", "1", "--eval-interval", "5", "--eval-iters", "1",
	"--hidden-dropout", "0", "--attention-dropout", "0", "--train-iters", "10"}

func with(base []string, extra ...string) []string {
	return append(append([]string{}, base...), extra...)
}

// metricsLosses reads the lm loss and consumed samples of every line of a
// --metrics-file.
func metricsLosses(t *testing.T, path string) (losses []float64, consumed []int64) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var m struct {
			Loss     float64 `json:"lm_loss"`
			Consumed int64   `json:"consumed_samples"`
		}
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatal(err)
		}
		if m.Consumed == 0 {
			continue // a final evaluation record
		}
		losses, consumed = append(losses, m.Loss), append(consumed, m.Consumed)
	}
	return losses, consumed
}

func sameLosses(t *testing.T, what string, got, want []float64) {
	t.Helper()
	if len(got) != len(want) || len(want) == 0 {
		t.Fatalf("%s: %d logged iterations, single process %d", what, len(got), len(want))
	}
	for i := range want {
		if math.Abs(got[i]-want[i]) > 1e-5*math.Abs(want[i]) {
			t.Fatalf("%s: iteration %d lm loss %.9g, single process %.9g", what, i+1, got[i], want[i])
		}
	}
}

func freeTCPPort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
}

// TestLaunchInprocTrainDataParallel: "gotron launch --inproc
// --nproc-per-node 4 -- train ..." logs the single-process losses; the last
// rank alone logs.
func TestLaunchInprocTrainDataParallel(t *testing.T) {
	dir := t.TempDir()
	ref := filepath.Join(dir, "one.jsonl")
	if _, errs, code := runCLI(t, with(dpTrain, "--metrics-file", ref)...); code != 0 {
		t.Fatalf("single process: exit %d: %s", code, errs)
	}
	want, _ := metricsLosses(t, ref)
	for _, extra := range [][]string{nil, {"--use-distributed-optimizer", "--overlap-grad-reduce", "--ddp-bucket-size", "4000"},
		{"--overlap-grad-reduce", "--ddp-bucket-size", "4000", "--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"}} {
		got := filepath.Join(dir, fmt.Sprintf("dp4-%d.jsonl", len(extra)))
		out, errs, code := runCLI(t, append([]string{"launch", "--inproc", "--nproc-per-node", "4", "--"}, with(dpTrain, append(extra, "--metrics-file", got)...)...)...)
		if code != 0 {
			t.Fatalf("launch --inproc 4 %v: exit %d: %s", extra, code, errs)
		}
		losses, consumed := metricsLosses(t, got)
		sameLosses(t, fmt.Sprintf("inproc DP=4 %v", extra), losses, want)
		if consumed[len(consumed)-1] != 80 {
			t.Fatalf("consumed %d samples after 10 iterations of 8", consumed[len(consumed)-1])
		}
		if n := strings.Count(out, "lm loss:"); n != 10 {
			t.Fatalf("%d log lines for 10 iterations (only the last rank logs):\n%s", n, out)
		}
		if !strings.Contains(out, "[rank3]:  [") || regexp.MustCompile(`\[rank[0-2]\]: +\[20`).MatchString(out) {
			t.Fatalf("the log should come from rank 3 only:\n%s", out)
		}
	}
}

// TestLaunchTrainDataParallelProcesses: two worker processes over tcp
// (gotron launch) with the distributed optimizer and overlapped reduction
// log the single-process losses.
func TestLaunchTrainDataParallelProcesses(t *testing.T) {
	bin, err := buildGotron()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	ref := filepath.Join(dir, "one.jsonl")
	if _, errs, code := runCLI(t, with(dpTrain, "--metrics-file", ref)...); code != 0 {
		t.Fatalf("single process: exit %d: %s", code, errs)
	}
	want, _ := metricsLosses(t, ref)
	got := filepath.Join(dir, "dp2.jsonl")
	cmd := exec.Command(bin, append([]string{"launch", "--nproc-per-node", "2", "--master-port", freeTCPPort(t), "--"},
		with(dpTrain, "--metrics-file", got, "--use-distributed-optimizer", "--overlap-grad-reduce", "--ddp-bucket-size", "4000")...)...)
	cmd.Env = append(os.Environ(), "GOTRON_NUM_THREADS=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("gotron launch --nproc-per-node 2: %v\n%s", err, out)
	}
	losses, _ := metricsLosses(t, got)
	sameLosses(t, "tcp DP=2", losses, want)
	if !bytes.Contains(out, []byte("data-parallel size 2")) {
		t.Fatalf("no data-parallel size in the output:\n%s", out)
	}

	// Tensor parallelism over processes: TP=2 with sequence parallelism.
	got = filepath.Join(dir, "tp2.jsonl")
	cmd = exec.Command(bin, append([]string{"launch", "--nproc-per-node", "2", "--master-port", freeTCPPort(t), "--"},
		with(dpTrain, "--metrics-file", got, "--tensor-model-parallel-size", "2", "--sequence-parallel")...)...)
	cmd.Env = append(os.Environ(), "GOTRON_NUM_THREADS=1")
	if out, err = cmd.CombinedOutput(); err != nil {
		t.Fatalf("gotron launch --nproc-per-node 2 -- train --tensor-model-parallel-size 2: %v\n%s", err, out)
	}
	losses, _ = metricsLosses(t, got)
	sameLosses(t, "tcp TP=2 SP", losses, want)
}

// TestTrainDataParallelBadInput: refused before training, naming what is
// wrong: a global batch that does not divide by micro-batch × DP, and ranks
// started with different arguments.
func TestTrainDataParallelBadInput(t *testing.T) {
	_, errs, code := runCLI(t, append([]string{"launch", "--inproc", "--nproc-per-node", "3", "--"}, dpTrain...)...)
	if code == 0 || !strings.Contains(errs, "--global-batch-size=8 is not a multiple of --micro-batch-size=1 × data-parallel size 3") {
		t.Fatalf("global batch 8 at DP=3: exit %d, stderr %q", code, errs)
	}

	bin, err := buildGotron()
	if err != nil {
		t.Fatal(err)
	}
	port := freeTCPPort(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var outs [2]bytes.Buffer
	var cmds [2]*exec.Cmd
	for r := range 2 {
		args := dpTrain
		if r == 1 {
			args = with(dpTrain, "--seed", "7")
		}
		cmds[r] = exec.CommandContext(ctx, bin, args...)
		cmds[r].Env = append(os.Environ(), "RANK="+strconv.Itoa(r), "WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1", "MASTER_PORT="+port)
		cmds[r].Stdout, cmds[r].Stderr = &outs[r], &outs[r]
		if err := cmds[r].Start(); err != nil {
			t.Fatal(err)
		}
	}
	for r := range 2 {
		if err := cmds[r].Wait(); err == nil {
			t.Fatalf("rank %d with different arguments exited 0:\n%s", r, outs[r].String())
		}
		if out := outs[r].String(); !strings.Contains(out, "flags differ: rank 1") || !strings.Contains(out, "start every rank with the same flags") {
			t.Fatalf("rank %d: want an error naming rank 1:\n%s", r, outs[r].String())
		}
	}
}

// workerPID finds the worker process of rank whose environment carries tag.
func workerPID(tag string, rank int) int {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		env, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if err != nil {
			continue
		}
		vars := strings.Split(string(env), "\x00")
		hasTag, hasRank := false, false
		for _, v := range vars {
			hasTag = hasTag || v == "GOTRON_TEST_TAG="+tag
			hasRank = hasRank || v == "RANK="+strconv.Itoa(rank)
		}
		if hasTag && hasRank {
			return pid
		}
	}
	return 0
}

// lineWaiter collects output and signals when a line containing want appears.
type lineWaiter struct {
	mu   chan struct{}
	buf  bytes.Buffer
	want string
	seen chan struct{}
	done bool
}

func newLineWaiter(want string) *lineWaiter {
	w := &lineWaiter{mu: make(chan struct{}, 1), want: want, seen: make(chan struct{})}
	return w
}

func (w *lineWaiter) Write(p []byte) (int, error) {
	w.mu <- struct{}{}
	defer func() { <-w.mu }()
	w.buf.Write(p)
	if !w.done && strings.Contains(w.buf.String(), w.want) {
		w.done = true
		close(w.seen)
	}
	return len(p), nil
}

func (w *lineWaiter) String() string {
	w.mu <- struct{}{}
	defer func() { <-w.mu }()
	return w.buf.String()
}

// TestTrainRankKilled: SIGKILL of one worker mid-training ends the job
// within 60 s naming the rank; with --max-restarts 1 the launcher restarts
// the group, which resumes from the last checkpoint and finishes.
func TestTrainRankKilled(t *testing.T) {
	if _, err := os.Stat("/proc/self/environ"); err != nil {
		t.Skip("needs /proc to find the worker process")
	}
	bin, err := buildGotron()
	if err != nil {
		t.Fatal(err)
	}
	for _, restarts := range []int{0, 1} {
		dir := t.TempDir()
		tag := fmt.Sprintf("%d-%d", os.Getpid(), restarts)
		args := []string{"launch", "--nproc-per-node", "2", "--master-port", freeTCPPort(t), "--max-restarts", strconv.Itoa(restarts), "--"}
		args = append(args, with(dpTrain, "--train-iters", "600", "--log-interval", "100", "--eval-iters", "0",
			"--save", dir, "--load", dir, "--save-interval", "50")...)
		cmd := exec.Command(bin, args...)
		cmd.Env = append(os.Environ(), "GOTRON_NUM_THREADS=1", "GOTRON_TEST_TAG="+tag)
		out := newLineWaiter("saved checkpoint from iteration     100")
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		select {
		case <-out.seen:
		case <-time.After(2 * time.Minute):
			cmd.Process.Kill()
			t.Fatalf("no checkpoint at iteration 100 within 2 minutes:\n%s", out.String())
		}
		pid := workerPID(tag, 1)
		if pid == 0 {
			cmd.Process.Kill()
			t.Fatal("rank 1's process not found")
		}
		killed := time.Now()
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		waited := make(chan error, 1)
		go func() { waited <- cmd.Wait() }()
		limit := 60 * time.Second
		if restarts > 0 {
			limit = 5 * time.Minute
		}
		select {
		case err = <-waited:
		case <-time.After(limit):
			cmd.Process.Kill()
			t.Fatalf("restarts=%d: the job still runs %v after rank 1 was killed:\n%s", restarts, limit, out.String())
		}
		text := out.String()
		if restarts == 0 {
			if err == nil {
				t.Fatalf("the job exited 0 after rank 1 was killed:\n%s", text)
			}
			if !regexp.MustCompile(`\[rank0\]: gotron train: .*rank 1: peer lost`).MatchString(text) {
				t.Fatalf("the survivor (rank 0) did not name rank 1:\n%s", text)
			}
			t.Logf("job ended %v after SIGKILL of rank 1", time.Since(killed).Round(time.Millisecond))
			continue
		}
		if err != nil {
			t.Fatalf("with --max-restarts 1: %v\n%s", err, text)
		}
		if !strings.Contains(text, "loaded checkpoint from") || !strings.Contains(text, "iteration      600/     600") {
			t.Fatalf("the restarted group did not resume from the checkpoint and finish:\n%s", text)
		}
	}
}

// TestTrainRankHangs: a stopped (SIGSTOP) rank is detected when the
// survivors' wait passes --distributed-timeout-minutes (6 s here), and the
// survivor names the rank that stopped answering.
func TestTrainRankHangs(t *testing.T) {
	if _, err := os.Stat("/proc/self/environ"); err != nil {
		t.Skip("needs /proc to find the worker process")
	}
	bin, err := buildGotron()
	if err != nil {
		t.Fatal(err)
	}
	tag := fmt.Sprintf("%d-hang", os.Getpid())
	args := []string{"launch", "--nproc-per-node", "2", "--master-port", freeTCPPort(t), "--grace-period", "2s", "--"}
	args = append(args, with(dpTrain, "--train-iters", "100000", "--log-interval", "100", "--eval-iters", "0",
		"--distributed-timeout-minutes", "0.1")...)
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "GOTRON_NUM_THREADS=1", "GOTRON_TEST_TAG="+tag)
	out := newLineWaiter("iteration      100/")
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	select {
	case <-out.seen:
	case <-time.After(2 * time.Minute):
		t.Fatalf("no iteration 100 within 2 minutes:\n%s", out.String())
	}
	pid := workerPID(tag, 1)
	if pid == 0 {
		t.Fatal("rank 1's process not found")
	}
	stopped := time.Now()
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	select {
	case err = <-waited:
	case <-time.After(60 * time.Second):
		syscall.Kill(pid, syscall.SIGKILL)
		t.Fatalf("the job still runs 60 s after rank 1 stopped:\n%s", out.String())
	}
	text := out.String()
	if err == nil || !regexp.MustCompile(`\[rank0\]: gotron train: .*rank 1`).MatchString(text) {
		t.Fatalf("exit %v; the survivor did not name rank 1:\n%s", err, text)
	}
	t.Logf("job ended %v after SIGSTOP of rank 1 (timeout 6 s)", time.Since(stopped).Round(time.Millisecond))
}

// TestTrainTensorParallel: gotron launch --inproc trains TP=2 × DP=2 with
// sequence parallelism and logs the single-process losses; a TP=2
// checkpoint holds whole tensors, so generate reads it and its Hugging Face
// export equals the export of the TP=1 checkpoint it was resharded from.
func TestTrainTensorParallel(t *testing.T) {
	dir := t.TempDir()
	ref := filepath.Join(dir, "one.jsonl")
	one := filepath.Join(dir, "tp1")
	if _, errs, code := runCLI(t, with(dpTrain, "--metrics-file", ref, "--save", one)...); code != 0 {
		t.Fatalf("single process: exit %d: %s", code, errs)
	}
	want, _ := metricsLosses(t, ref)
	got := filepath.Join(dir, "tp2dp2.jsonl")
	_, errs, code := runCLI(t, append([]string{"launch", "--inproc", "--nproc-per-node", "4", "--"},
		with(dpTrain, "--metrics-file", got, "--tensor-model-parallel-size", "2", "--sequence-parallel", "--use-distributed-optimizer")...)...)
	if code != 0 {
		t.Fatalf("TP=2 DP=2: exit %d: %s", code, errs)
	}
	losses, _ := metricsLosses(t, got)
	sameLosses(t, "inproc TP=2 SP DP=2", losses, want)

	// Reshard the TP=1 checkpoint to TP=2 (no further iterations) and export both.
	two := filepath.Join(dir, "tp2")
	if _, errs, code := runCLI(t, append([]string{"launch", "--inproc", "--nproc-per-node", "2", "--"},
		with(dpTrain, "--tensor-model-parallel-size", "2", "--load", one, "--save", two)...)...); code != 0 {
		t.Fatalf("resume at TP=2: exit %d: %s", code, errs)
	}
	for _, d := range []string{one, two} {
		if _, errs, code := runCLI(t, "convert", "--to", "hf", "--load", d, "--save", d+"-hf"); code != 0 {
			t.Fatalf("convert --to hf %s: exit %d: %s", d, code, errs)
		}
	}
	a, err := os.ReadFile(filepath.Join(one+"-hf", "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(two+"-hf", "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a, b) {
		t.Fatal("the HF export of the TP=2 checkpoint differs from the TP=1 export it was resharded from")
	}
	if _, errs, code := runCLI(t, "generate", "--load", two, "--prompt", "1 2 3", "--tokenizer-type", "NullTokenizer",
		"--vocab-size", "100", "--max-new-tokens", "3", "--top-k", "1"); code != 0 {
		t.Fatalf("generate from the TP=2 checkpoint: exit %d: %s", code, errs)
	}
}

// TestTrainTensorParallelBadInput: layouts that cannot hold the model are
// refused before training, naming the flags and values.
func TestTrainTensorParallelBadInput(t *testing.T) {
	launch := func(n int, extra ...string) []string {
		return append([]string{"launch", "--inproc", "--nproc-per-node", strconv.Itoa(n), "--"}, with(dpTrain, extra...)...)
	}
	cases := []struct {
		args []string
		want string
	}{
		{launch(3, "--tensor-model-parallel-size", "3"), "--num-attention-heads=4 is not divisible by --tensor-model-parallel-size=3"},
		{launch(2, "--tensor-model-parallel-size", "2", "--ffn-hidden-size", "33"), "--ffn-hidden-size=33 is not divisible by --tensor-model-parallel-size=2"},
		{launch(4, "--tensor-model-parallel-size", "4", "--group-query-attention", "--num-query-groups", "2"), "--num-query-groups=2 is not divisible by --tensor-model-parallel-size=4"},
		{launch(2, "--tensor-model-parallel-size", "2", "--sequence-parallel", "--seq-length", "15", "--max-position-embeddings", "16"), "--seq-length=15 is not divisible by --tensor-model-parallel-size=2"},
		{launch(3, "--tensor-model-parallel-size", "2"), "world size 3 is not divisible by TP·CP·PP"},
		{with(dpTrain, "--tensor-model-parallel-size", "2"), "needs 2 ranks"},
	}
	for _, c := range cases {
		_, errs, code := runCLI(t, c.args...)
		if code == 0 || !strings.Contains(errs, c.want) {
			t.Errorf("%v: exit %d, stderr %q; want %q", c.args, code, errs, c.want)
		}
	}
}
