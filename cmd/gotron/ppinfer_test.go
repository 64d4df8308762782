package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// trainPPCheckpoint trains kind's model (tpModelArgs with layers layers) for
// 2 iterations on tp×pp ranks (gotron launch --inproc when more than one)
// and returns the checkpoint.
func trainPPCheckpoint(t *testing.T, dir, kind string, layers, tp, pp int, data, vocab, merges string) string {
	t.Helper()
	ck := filepath.Join(dir, fmt.Sprintf("%s-tp%d-pp%d", kind, tp, pp))
	model := append([]string{}, tpModelArgs[kind]...)
	model[1] = fmt.Sprint(layers) // tpModelArgs start with --num-layers
	args := append([]string{"train", "--data-path", data, "--vocab-file", vocab, "--merge-file", merges, "--tokenizer-type", "GPT2BPETokenizer",
		"--seq-length", "32", "--max-position-embeddings", "64", "--micro-batch-size", "1", "--global-batch-size", "2",
		"--train-iters", "2", "--lr", "1e-3", "--eval-iters", "0", "--split", "100,0,0", "--save", ck, "--save-interval", "2", "--log-interval", "1",
		"--tensor-model-parallel-size", fmt.Sprint(tp), "--pipeline-model-parallel-size", fmt.Sprint(pp)}, model...)
	if tp*pp > 1 {
		args = append([]string{"launch", "--inproc", "--nproc-per-node", fmt.Sprint(tp * pp), "--"}, args...)
	}
	if _, errs, code := runCLI(t, args...); code != 0 {
		t.Fatalf("train %s at TP=%d PP=%d: %s", kind, tp, pp, errs)
	}
	return ck
}

// TestInferencePipelineParallel: Megatron's inference arguments with
// --pipeline-model-parallel-size 2 and 4, and 2 with
// --tensor-model-parallel-size 2 (gotron launch --inproc), give one
// process's tokens and log-probabilities within 2e-6 (the same bits with
// pipeline stages alone: they run one process's ops; tensor-parallel
// stages reorder sums) for a GPT-2-style checkpoint trained on one rank
// and a Llama-style one trained at TP=2×PP=2 (checkpoints hold whole
// tensors: any layout loads them); as real processes over tcp under gotron
// launch; and gotron generate prints one process's text, sampled included.
func TestInferencePipelineParallel(t *testing.T) {
	dir := t.TempDir()
	data, vocab, merges := gpt2Corpus(t, dir, 24)
	prompts := []string{"--prompts", "the quick brown fox", "Document 3: func main() {", "jumps over"}
	infer := func(ck, out string, tp, pp int) []string {
		return append([]string{"inference", "--load", ck, "--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", vocab, "--merge-file", merges,
			"--num-tokens-to-generate", "10", "--top_k", "1", "--return-log-probs", "--termination-id", "-1",
			"--tensor-model-parallel-size", fmt.Sprint(tp), "--pipeline-model-parallel-size", fmt.Sprint(pp), "--output-path", out}, prompts...)
	}
	for _, c := range []struct {
		kind             string
		trainTP, trainPP int
	}{{"gpt2", 1, 1}, {"llama", 2, 2}} {
		ck := trainPPCheckpoint(t, dir, c.kind, 4, c.trainTP, c.trainPP, data, vocab, merges)
		one := filepath.Join(dir, c.kind+"-one.json")
		if _, errs, code := runCLI(t, infer(ck, one, 1, 1)...); code != 0 {
			t.Fatalf("%s on one process: %s", c.kind, errs)
		}
		want := readTPResults(t, one)
		layouts := [][2]int{{1, 2}, {1, 4}} // and PP=2 over tcp below
		if c.kind == "llama" {
			layouts = [][2]int{{1, 4}, {2, 2}}
		}
		for _, l := range layouts {
			out := filepath.Join(dir, fmt.Sprintf("%s-tp%d-pp%d.json", c.kind, l[0], l[1]))
			so, errs, code := runCLI(t, append([]string{"launch", "--inproc", "--nproc-per-node", fmt.Sprint(l[0] * l[1]), "--"}, infer(ck, out, l[0], l[1])...)...)
			if code != 0 {
				t.Fatalf("%s at TP=%d PP=%d: %s", c.kind, l[0], l[1], errs)
			}
			compareTPResults(t, fmt.Sprintf("%s (trained at TP=%d PP=%d) at TP=%d PP=%d, inproc", c.kind, c.trainTP, c.trainPP, l[0], l[1]), readTPResults(t, out), want, 2e-6)
			if strings.Contains(so, "[rank1]: 0 [") {
				t.Errorf("a follower printed results:\n%s", so)
			}
			if !strings.Contains(errs, "pipeline-parallel rank 1 of") {
				t.Errorf("followers do not say they followed rank 0:\n%s", errs)
			}
		}
		if c.kind != "llama" {
			continue
		}
		// Real processes over tcp: gotron launch starts 2 gotron inference
		// processes (torchrun's environment), one stage each.
		bin, err := buildGotron()
		if err != nil {
			t.Fatal(err)
		}
		out := filepath.Join(dir, "llama-tcp.json")
		cmd := exec.Command(bin, append([]string{"launch", "--nproc-per-node", "2", "--master-port", freeTCPPort(t), "--"}, infer(ck, out, 1, 2)...)...)
		cmd.Env = append(os.Environ(), "GOTRON_NUM_THREADS=1")
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("gotron launch --nproc-per-node 2 -- inference --pipeline-model-parallel-size 2: %v\n%s", err, b)
		}
		compareTPResults(t, "llama at PP=2, processes over tcp", readTPResults(t, out), want, 2e-6)

		// gotron generate: rank 0 prints what one process prints, sampled
		// tokens included (the last stage draws them with the request's
		// seeded stream and sends them to the others).
		checkGenerateOverTwoRanks(t, ck, vocab, merges, "--pipeline-model-parallel-size", "PP=2")
	}
}

// TestInferencePipelineParallelRefusals: layouts that do not split the
// model, and pipeline splits decoding does not take, are refused naming the
// flag.
func TestInferencePipelineParallelRefusals(t *testing.T) {
	dir, tokFlags := inferenceCheckpoint(t) // 2 layers
	base := append([]string{"inference", "--load", dir, "--prompts", "hi"}, tokFlags...)
	checkInferenceRefusals(t, base, []inferenceRefusal{
		{1, []string{"--pipeline-model-parallel-size", "2"}, "--pipeline-model-parallel-size 2 needs 2 ranks: start them with gotron launch"},
		{4, []string{"--pipeline-model-parallel-size", "4"}, "--pipeline-model-parallel-size 4: more stages than the model's 2 layers"},
		{2, []string{"--pipeline-model-parallel-size", "2", "--tensor-model-parallel-size", "2"}, "a world of 2 ranks with --tensor-model-parallel-size 2 with --pipeline-model-parallel-size 2: needs data-parallel inference replicas"},
		{1, []string{"--pipeline-model-parallel-size", "0"}, "--pipeline-model-parallel-size"},
		{2, []string{"--pipeline-model-parallel-size", "2", "--num-virtual-stages-per-pipeline-rank", "2"}, "--num-virtual-stages-per-pipeline-rank 2: needs an uneven or interleaved pipeline split at inference, not built"},
		{2, []string{"--pipeline-model-parallel-size", "2", "--decoder-first-pipeline-num-layers", "1"}, "--decoder-first-pipeline-num-layers 1: needs an uneven or interleaved pipeline split"},
	})
	// Three layers do not split into two stages.
	ck := serveCheckpointSized(t, 64, 3, 32)
	_, errs, code := runCLI(t, "launch", "--inproc", "--nproc-per-node", "2", "--", "generate", "--load", ck, "--prompt", "hi", "--pipeline-model-parallel-size", "2")
	if want := "--pipeline-model-parallel-size 2: the model's 3 layers (--num-layers) are not divisible into 2 stages"; code == 0 || !strings.Contains(errs, want) {
		t.Errorf("3 layers over 2 stages: exit %d, stderr %q; want %q", code, errs, want)
	}
}

// TestInferencePipelineParallelRankKilled: SIGKILL of the last stage's
// rank of a PP=2 inference job mid-generation ends the job in seconds,
// naming rank 1, instead of leaving rank 0 waiting.
func TestInferencePipelineParallelRankKilled(t *testing.T) {
	checkInferenceRankKilled(t, "--pipeline-model-parallel-size", "pipeline-parallel")
}

// TestServePipelineParallel: gotron serve --pipeline-model-parallel-size 2
// on two ranks (gotron launch --inproc): rank 0 serves HTTP and answers what
// one process's generate prints; on shutdown the other stage ends with
// rank 0.
func TestServePipelineParallel(t *testing.T) {
	ck := serveCheckpoint(t) // 2 layers
	prompt := "The capital of France is"
	want := generateText(t, ck, prompt, 10)
	base, stop := serveOverTwoRanks(t, ck, "--pipeline-model-parallel-size")
	code, body := postJSON(t, base+"/v1/completions", `{"prompt":"`+prompt+`","max_tokens":10,"temperature":0}`)
	var c struct{ Choices []struct{ Text string } }
	if code != 200 || json.Unmarshal(body, &c) != nil || len(c.Choices) != 1 || c.Choices[0].Text != want {
		t.Errorf("completion of %q at PP=2: %d %s; one process's generate: %q", prompt, code, body, want)
	}
	if errs := stop(); !strings.Contains(errs, "pipeline-parallel rank 1: rank 0 stopped") {
		t.Errorf("the other stage did not end with rank 0:\n%s", errs)
	}
}
