package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// epModelArgs is the expert-parallel tests' model: the tensor-parallel
// tests' MoE one (4 experts top-2, grouped GEMM, a shared expert) without
// sequence parallelism, trained at EP=2.
func epModelArgs() []string {
	var args []string
	for _, a := range tpModelArgs["moe"] {
		if a != "--sequence-parallel" {
			args = append(args, a)
		}
	}
	return args
}

// trainEPCheckpoint trains the MoE model for 2 iterations on two
// expert-parallel ranks (alltoall dispatcher; each rank saves its experts)
// and returns the checkpoint.
func trainEPCheckpoint(t *testing.T, dir, data, vocab, merges string) string {
	t.Helper()
	ck := filepath.Join(dir, "moe-ep2")
	args := append([]string{"launch", "--inproc", "--nproc-per-node", "2", "--", "train", "--data-path", data, "--vocab-file", vocab,
		"--merge-file", merges, "--tokenizer-type", "GPT2BPETokenizer", "--seq-length", "32", "--max-position-embeddings", "64",
		"--micro-batch-size", "1", "--global-batch-size", "2", "--train-iters", "2", "--lr", "1e-3", "--eval-iters", "0", "--split", "100,0,0",
		"--save", ck, "--save-interval", "2", "--log-interval", "1", "--expert-model-parallel-size", "2",
		"--moe-token-dispatcher-type", "alltoall"}, epModelArgs()...)
	if _, errs, code := runCLI(t, args...); code != 0 {
		t.Fatalf("train the MoE model at EP=2: %s", errs)
	}
	return ck
}

// TestInferenceExpertParallel: an MoE checkpoint trained at EP=2 runs
// gotron inference over expert-parallel layouts (gotron launch --inproc,
// and TP=2×EP=2 as real processes over tcp), each rank reading its experts
// alone, with one process's
// tokens, and log-probabilities within 2e-6 (the tensor- and
// pipeline-parallel tests' bound), prompts in chunks and decode steps of
// one token per request alike: EP=2; EP=2 over two pipeline stages; TP=2
// with EP=2 and the experts whole, folded over the tensor-parallel ranks
// (--expert-tensor-parallel-size 1); TP=2 with EP=2 at the default
// expert-tensor-parallel size 2 (4 ranks: two data-parallel replicas of the
// dense layers decoding the same requests); each expert split over two
// ranks (EP=1, ETP=2). A token's top-2 expert outputs sum in one process's
// order (the rank without the other expert adds zero): what differs is the
// kernels' thread split (each rank has fewer threads; seen 0 to 1.8e-7 at
// EP=2 and EP=2×PP=2) and the tensor-parallel sums (row-parallel layers and
// fc2 halves apart: 4.2e-7). gotron generate at EP=2 prints one process's
// text, greedy and sampled.
func TestInferenceExpertParallel(t *testing.T) {
	dir := t.TempDir()
	data, vocab, merges := gpt2Corpus(t, dir, 24)
	tok := []string{"--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", vocab, "--merge-file", merges}
	ck := trainEPCheckpoint(t, dir, data, vocab, merges)
	infer := func(out string, extra ...string) []string {
		return append(append([]string{"inference", "--load", ck, "--num-tokens-to-generate", "10", "--top_k", "1", "--return-log-probs",
			"--termination-id", "-1", "--output-path", out, "--inference-dynamic-batching-max-requests", "2",
			"--prompts", "the quick brown fox", "Document 3: func main() {", "jumps over"}, tok...), extra...)
	}
	one := filepath.Join(dir, "one.json")
	if _, errs, code := runCLI(t, infer(one)...); code != 0 {
		t.Fatalf("moe on one process: %s", errs)
	}
	want := readTPResults(t, one)
	for _, c := range []struct {
		ranks int
		flags []string
	}{
		{2, []string{"--expert-model-parallel-size", "2"}},
		{2, []string{"--tensor-model-parallel-size", "2", "--expert-model-parallel-size", "2", "--expert-tensor-parallel-size", "1"}},
		{4, []string{"--tensor-model-parallel-size", "2", "--expert-model-parallel-size", "2"}},
		{4, []string{"--pipeline-model-parallel-size", "2", "--expert-model-parallel-size", "2"}},
		{2, []string{"--expert-tensor-parallel-size", "2"}},
	} {
		layout := strings.Join(c.flags, " ")
		out := filepath.Join(dir, fmt.Sprintf("ep-%d-%s.json", c.ranks, strings.ReplaceAll(layout, " ", "")))
		_, errs, code := runCLI(t, append([]string{"launch", "--inproc", "--nproc-per-node", fmt.Sprint(c.ranks), "--"}, infer(out, c.flags...)...)...)
		if code != 0 {
			t.Fatalf("moe at %s: %s", layout, errs)
		}
		compareTPResults(t, "moe (trained at EP=2) at "+layout, readTPResults(t, out), want, 2e-6)
	}
	// Real processes over tcp: gotron launch starts 2 gotron inference
	// processes, the experts folded over the tensor-parallel ranks.
	bin, err := buildGotron()
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "ep-tcp.json")
	cmd := exec.Command(bin, append([]string{"launch", "--nproc-per-node", "2", "--master-port", freeTCPPort(t), "--"},
		infer(out, "--tensor-model-parallel-size", "2", "--expert-model-parallel-size", "2", "--expert-tensor-parallel-size", "1")...)...)
	cmd.Env = append(os.Environ(), "GOTRON_NUM_THREADS=1")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("gotron launch --nproc-per-node 2 -- inference at TP=2×EP=2: %v\n%s", err, b)
	}
	compareTPResults(t, "moe at TP=2×EP=2, processes over tcp", readTPResults(t, out), want, 2e-6)
	checkGenerateOverTwoRanks(t, ck, vocab, merges, "--expert-model-parallel-size", "EP=2")
	// layouts that do not split the model, or lack their ranks, are
	// refused naming the flag
	base := append([]string{"inference", "--load", ck, "--prompts", "hi", "--num-tokens-to-generate", "1"}, tok...)
	checkInferenceRefusals(t, base, []inferenceRefusal{
		{1, []string{"--expert-model-parallel-size", "2"}, "--expert-model-parallel-size 2 needs 2 ranks: start them with gotron launch"},
		{3, []string{"--expert-model-parallel-size", "3"}, "--num-experts=4 is not divisible by --expert-model-parallel-size=3"},
		{3, []string{"--expert-tensor-parallel-size", "3"}, "--moe-ffn-hidden-size=16 is not divisible by --expert-tensor-parallel-size=3"},
		{2, []string{"--expert-model-parallel-size", "2", "--expert-tensor-parallel-size", "2"}, "a world of 2 ranks with --expert-model-parallel-size 2 with --expert-tensor-parallel-size 2: needs data-parallel inference replicas (Megatron's coordinator over ZMQ), not built in gotron: launch the layout's 4 ranks"},
		{1, []string{"--expert-model-parallel-size", "0"}, "--expert-model-parallel-size"},
	})
	dense, tokFlags := inferenceCheckpoint(t)
	checkInferenceRefusals(t, append([]string{"inference", "--load", dense, "--prompts", "hi"}, tokFlags...), []inferenceRefusal{
		{2, []string{"--expert-model-parallel-size", "2"}, "--expert-model-parallel-size 2: the model has no experts (--num-experts)"},
	})
}
