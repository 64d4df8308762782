package main

import (
	"bytes"
	"context"
	"github.com/gotron/gotron/tensor"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

func runCLI(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	var out, errb bytes.Buffer
	env := &cli{stdout: &out, stderr: &errb, stdin: strings.NewReader(""), getenv: func(string) string { return "" }}
	code := run(context.Background(), env, args)
	return out.String(), errb.String(), code
}

var tinyTrain = []string{"train", "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
	"--seq-length", "16", "--micro-batch-size", "2", "--global-batch-size", "4", "--lr", "1e-3", "--mock-data",
	"--vocab-size", "100", "--make-vocab-size-divisible-by", "64", "--log-interval", "1", "--eval-interval", "2", "--eval-iters", "1"}

func TestTrainThenGenerate(t *testing.T) {
	dir := t.TempDir()
	out, errs, code := runCLI(t, append(append([]string{}, tinyTrain...), "--train-iters", "3", "--save", filepath.Join(dir, "ck"))...)
	if code != 0 {
		t.Fatalf("train exit %d: %s", code, errs)
	}
	for _, want := range []string{"iteration        3/       3", "validation loss at iteration 2", "saved checkpoint from iteration       3"} {
		if !strings.Contains(out, want) {
			t.Errorf("train output lacks %q:\n%s", want, out)
		}
	}
	// The model's vocabulary (128) is not GPT-2's: generate must ask for the tokenizer.
	_, errs, code = runCLI(t, "generate", "--load", filepath.Join(dir, "ck"), "--prompt", "1 2 3")
	if code == 0 || !strings.Contains(errs, "--tokenizer-type") {
		t.Fatalf("generate without a tokenizer: exit %d: %s", code, errs)
	}
	out, errs, code = runCLI(t, "generate", "--load", filepath.Join(dir, "ck"), "--prompt", "1 2 3",
		"--tokenizer-type", "NullTokenizer", "--vocab-size", "100", "--max-new-tokens", "5", "--top-k", "1")
	if code != 0 {
		t.Fatalf("generate exit %d: %s", code, errs)
	}
	if fields := strings.Fields(out); len(fields) < 4 {
		t.Fatalf("generate printed %q", out)
	}
}

func TestTrainFlagErrors(t *testing.T) {
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"train", "--num-layer", "2"}, "unknown flag --num-layer (did you mean --num-layers?)"},
		{append(append([]string{}, tinyTrain...), "--train-iters", "1", "--hidden-size", "30"), "--hidden-size=30 is not divisible by --num-attention-heads=4"},
		{append(append([]string{}, tinyTrain...), "--train-iters", "1", "--global-batch-size", "3"), "--global-batch-size=3 is not a multiple of --micro-batch-size=2"},
		{append(append([]string{}, tinyTrain...), "--train-iters", "1", "--tensor-model-parallel-size", "2"), "--tensor-model-parallel-size=2 needs 2 ranks"},
		{append(append([]string{}, tinyTrain...), "--train-iters", "1", "--swiglu", "--openai-gelu"), "exclude each other"},
		{[]string{"train", "--seq-length", "16", "--micro-batch-size", "1", "--lr", "1", "--train-iters", "1", "--num-layers", "1", "--hidden-size", "8", "--num-attention-heads", "2"}, "missing required flags: --data-path (or --train-data-path ...) or --mock-data"},
	}
	for _, c := range cases {
		_, errs, code := runCLI(t, c.args...)
		if code == 0 || !strings.Contains(errs, c.want) {
			t.Errorf("%v: exit %d, stderr %q; want %q", c.args, code, errs, c.want)
		}
	}
}

func TestTrainYAMLConfig(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "run.yaml")
	os.WriteFile(cfg, []byte("num_layers: 2\nhidden_size: 32\nnum_attention_heads: 4\nseq_length: 16\nmicro_batch_size: 2\nlr: 0.001\nmock_data: true\nvocab_size: 100\ntrain_iters: 2\nlog_interval: 1\neval_iters: 0\n"), 0o644)
	out, errs, code := runCLI(t, "train", "--config", cfg, "--train-iters", "1")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	if !strings.Contains(out, "iteration        1/       1") {
		t.Fatalf("the command-line --train-iters did not override the file:\n%s", out)
	}
	os.WriteFile(cfg, []byte("num_layer: 2\n"), 0o644)
	if _, errs, _ := runCLI(t, "train", "--config", cfg); !strings.Contains(errs, `unknown key "num_layer" (did you mean "num-layers"?)`) {
		t.Fatalf("bad key: %s", errs)
	}
}

func TestTrainAndGenerateFromHFDir(t *testing.T) {
	hfDir := filepath.Join("..", "..", "ckpt", "hf", "testdata", "llama_gqa_untied_f32")
	out, errs, code := runCLI(t, "train", "--load", hfDir, "--mock-data", "--vocab-size", "100", "--seq-length", "16",
		"--micro-batch-size", "2", "--train-iters", "2", "--lr", "1e-3", "--log-interval", "1", "--eval-iters", "0")
	if code != 0 {
		t.Fatalf("train --load HF_DIR: exit %d: %s", code, errs)
	}
	if !strings.Contains(out, "Hugging Face llama checkpoint") || !strings.Contains(out, "iteration        2/       2") {
		t.Fatalf("train output:\n%s", out)
	}
	gptDir := filepath.Join("..", "..", "ckpt", "hf", "testdata", "gpt2_tied_f32")
	out, errs, code = runCLI(t, "generate", "--load", gptDir, "--prompt", "ab", "--max-new-tokens", "4", "--top-k", "1")
	if code != 0 || !strings.HasPrefix(out, "ab") {
		t.Fatalf("generate --load HF_DIR: exit %d: %s%s", code, out, errs)
	}
}

// TestTrainPrecisionFlags: --bf16 trains (no fallback warning on a CPU with
// AVX512_BF16) and reports MFU against the bf16 peak; --fp16 scales the
// loss dynamically, skipping overflowing iterations, and bad combinations
// are refused.
func TestTrainPrecisionFlags(t *testing.T) {
	out, errs, code := runCLI(t, append(append([]string{}, tinyTrain...), "--train-iters", "2", "--bf16")...)
	if code != 0 {
		t.Fatalf("--bf16: exit %d: %s", code, errs)
	}
	if !strings.Contains(out, "iteration        2/       2") {
		t.Errorf("--bf16 did not train:\n%s", out)
	}
	if warned := strings.Contains(errs, "no AVX512_BF16"); warned == tensor.HasBF16Matmul() {
		t.Errorf("--bf16 warning %q with HasBF16GEMM() = %v", errs, tensor.HasBF16Matmul())
	}
	// --fp16 from Megatron's initial scale 2^32: the first iterations
	// overflow and are skipped, the log shows the scale backing off.
	out, errs, code = runCLI(t, with(tinyTrain, "--train-iters", "4", "--fp16", "--hysteresis", "1", "--loss-scale-window", "100")...)
	if code != 0 {
		t.Fatalf("--fp16: exit %d: %s", code, errs)
	}
	for _, want := range []string{"loss scale: 2147483648.0 |", "number of skipped iterations:   1 |", "loss scale: 1073741824.0 |"} {
		if !strings.Contains(out, want) {
			t.Errorf("--fp16 log lacks %q:\n%s", want, out)
		}
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--fp16", "--bf16"}, "exclude each other"},
		{[]string{"--hysteresis", "3"}, "--hysteresis: dynamic loss scaling runs only with --fp16"},
		{[]string{"--loss-scale", "128"}, "--loss-scale: loss scaling runs only with --fp16 or --bf16"},
		{[]string{"--fp16", "--min-loss-scale", "8", "--initial-loss-scale", "4"}, "--min-loss-scale 8"},
		{[]string{"--distributed-backend", "mpi"}, `--distributed-backend "mpi": want nccl, gloo or tcp`},
	} {
		_, errs, code := runCLI(t, with(tinyTrain, append([]string{"--train-iters", "1"}, c.args...)...)...)
		if code == 0 || !strings.Contains(errs, c.want) {
			t.Errorf("%v: exit %d, stderr %q; want %q", c.args, code, errs, c.want)
		}
	}
}

// TestTrainNoSilentFlags: every accepted Megatron flag acts, or is named in
// one warning, or is refused with the reason.
func TestTrainNoSilentFlags(t *testing.T) {
	_, errs, code := runCLI(t, with(tinyTrain, "--train-iters", "1", "--use-flash-attn", "--no-masked-softmax-fusion", "--no-rope-fusion")...)
	if code != 0 || !strings.Contains(errs, "--use-flash-attn, --no-masked-softmax-fusion, --no-rope-fusion: no effect on the CPU backend") {
		t.Errorf("GPU fusion flags: exit %d, stderr %q; want one warning naming them", code, errs)
	}
	_, errs, code = runCLI(t, with(tinyTrain, "--train-iters", "1", "--split", "'99,1,0'")...)
	if code != 0 || !strings.Contains(errs, "--split has no effect with --mock-data") {
		t.Errorf("--mock-data --split: exit %d, stderr %q; want one warning naming it", code, errs)
	}
	for flag, want := range map[string]string{
		"--wandb-project=x":           "Weights & Biases cannot be reached",
		"--grad-reduce-in-bf16":       "--grad-reduce-in-bf16 needs --bf16",
		"--split=1,x,1":               `"x" is not a proportion`, // checked with --mock-data too
		"--tokenizer-model=/nonexist": "need --tokenizer-type",
	} {
		_, errs, code := runCLI(t, with(tinyTrain, "--train-iters", "1", flag)...)
		if code == 0 || !strings.Contains(errs, want) {
			t.Errorf("%s: exit %d, stderr %q; want %q", flag, code, errs, want)
		}
	}
}

// TestTrainMegatronFlagsThatAct: --use-checkpoint-args takes the
// architecture from the checkpoint, --no-load-rng, --log-params-norm,
// --rampup-batch-size, --ckpt-format and --use-cpu-initialization.
func TestTrainMegatronFlagsThatAct(t *testing.T) {
	dir := t.TempDir()
	ck := filepath.Join(dir, "ck")
	if _, errs, code := runCLI(t, with(tinyTrain, "--train-iters", "2", "--save", ck, "--use-cpu-initialization")...); code != 0 {
		t.Fatalf("train: exit %d: %s", code, errs)
	}
	// A different --hidden-size on the command line: the checkpoint's wins.
	out, errs, code := runCLI(t, with(tinyTrain, "--train-iters", "3", "--load", ck, "--use-checkpoint-args", "--hidden-size", "48",
		"--no-load-rng", "--log-params-norm", "--ckpt-format", "gotron-checkpoint", "--override-opt_param-scheduler")...)
	if code != 0 || !strings.Contains(out, "hidden 32") || !strings.Contains(out, "params norm: ") || !strings.Contains(out, "iteration        3/       3") {
		t.Fatalf("--use-checkpoint-args: exit %d:\n%s%s", code, out, errs)
	}
	_, errs, code = runCLI(t, with(tinyTrain, "--train-iters", "1", "--ckpt-format", "zarr")...)
	if code == 0 || !strings.Contains(errs, `--ckpt-format=zarr: want gotron-checkpoint`) {
		t.Fatalf("--ckpt-format zarr: exit %d: %s", code, errs)
	}
	// Megatron's ramp-up: 2 → 4 samples over the first 8 samples.
	args := []string{"train", "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
		"--micro-batch-size", "2", "--global-batch-size", "4", "--lr", "1e-3", "--mock-data", "--vocab-size", "100",
		"--log-interval", "1", "--eval-iters", "0", "--train-samples", "16", "--rampup-batch-size", "2", "2", "8"}
	out, errs, code = runCLI(t, args...)
	if code != 0 || !strings.Contains(out, "global batch size:     2") || !strings.Contains(out, "global batch size:     4") {
		t.Fatalf("--rampup-batch-size: exit %d:\n%s%s", code, out, errs)
	}
}

// TestTrainMFUIsAFraction: the log line's MFU divides by this CPU's
// measured peak in FLOP/s (tensor.CPUPeakFLOPs): a tiny model's
// MFU is a few percent at most, never above 100%.
func TestTrainMFUIsAFraction(t *testing.T) {
	out, errs, code := runCLI(t, with(tinyTrain, "--train-iters", "2")...)
	if code != 0 {
		t.Fatalf("train: exit %d: %s", code, errs)
	}
	m := regexp.MustCompile(`MFU: ([0-9.]+)%`).FindAllStringSubmatch(out, -1)
	if len(m) == 0 {
		t.Fatalf("no MFU on the log lines:\n%s", out)
	}
	for _, s := range m {
		v, err := strconv.ParseFloat(s[1], 64)
		if err != nil || !(v > 0 && v <= 100) {
			t.Errorf("MFU %s%%: want a percentage in (0, 100]", s[1])
		}
	}
}

func TestCPUProfilePath(t *testing.T) {
	for _, tc := range []struct {
		path   string
		inproc bool
		rank   int
		want   string
	}{
		{"", false, 0, ""},
		{"", true, 1, ""},
		{"p.prof", false, 0, "p.prof"},
		{"p.prof", true, 0, "p.prof"}, // covers every rank of the process
		{"p.prof", true, 1, ""},
		{"p.prof", false, 3, "p.prof.rank3"},
	} {
		if got := cpuProfilePath(tc.path, tc.inproc, tc.rank); got != tc.want {
			t.Errorf("cpuProfilePath(%q, inproc=%v, rank %d) = %q, want %q", tc.path, tc.inproc, tc.rank, got, tc.want)
		}
	}
}
