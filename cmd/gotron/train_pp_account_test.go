package main

import (
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
)

// TestTrainPipelineAccountForEmbeddingLoss: with
// --account-for-embedding-in-pipeline-split and
// --account-for-loss-in-pipeline-split, 6 layers over 4 pipeline ranks of 2
// virtual stages (Megatron's functional test
// gpt3_mcore_te_tp1_pp4_vp2_account_for_embedding_loss_in_pipeline_split)
// count as 8: the first virtual stage holds only the embedding, the last
// only the loss, so pipeline rank 0 holds the embedding and 1 layer, ranks 1
// and 2 hold 2 layers each, rank 3 holds 1 layer and the output layer; and
// the losses are one process's.
func TestTrainPipelineAccountForEmbeddingLoss(t *testing.T) {
	dir := t.TempDir()
	base := with(ppTrain, "--num-layers", "6")
	ref := filepath.Join(dir, "one.jsonl")
	if _, errs, code := runCLI(t, with(base, "--metrics-file", ref)...); code != 0 {
		t.Fatalf("single process: exit %d: %s", code, errs)
	}
	want, _ := metricsLosses(t, ref)
	got := filepath.Join(dir, "pp.jsonl")
	out, errs, code := runCLI(t, append([]string{"launch", "--inproc", "--nproc-per-node", "4", "--"},
		with(base, "--metrics-file", got, "--pipeline-model-parallel-size", "4", "--num-virtual-stages-per-pipeline-rank", "2",
			"--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split")...)...)
	if code != 0 {
		t.Fatalf("PP=4 VPP=2 with both accounted: exit %d: %s", code, errs)
	}
	losses, _ := metricsLosses(t, got)
	sameLosses(t, "PP=4 VPP=2, embedding and loss accounted", losses, want)

	params := map[int]int{}
	for _, m := range regexp.MustCompile(`model parallel rank \(0, (\d)\): (\d+)`).FindAllStringSubmatch(out, -1) {
		r, _ := strconv.Atoi(m[1])
		params[r], _ = strconv.Atoi(m[2])
	}
	if len(params) != 4 {
		t.Fatalf("parameter counts of %d pipeline ranks, want 4:\n%s", len(params), out)
	}
	layer := params[1] / 2
	// Word embedding (vocabulary 100 padded to 128) and learned positions
	// (16) of 32 channels.
	emb := 128*32 + 16*32
	if params[2] != params[1] || params[0] != emb+layer {
		t.Fatalf("parameters per pipeline rank %v: want rank 0 = embedding (%d) + 1 layer (%d), ranks 1 and 2 = 2 layers", params, emb, layer)
	}
	if params[3] <= layer || params[3] >= params[1]+emb {
		t.Fatalf("parameters per pipeline rank %v: want rank 3 = 1 layer (%d) + final norm + output layer", params, layer)
	}

	// gotron memory checks the same split.
	if _, errs, code := runCLI(t, "memory", "--num-layers", "6", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
		"--micro-batch-size", "1", "--vocab-size", "100", "--world-size", "4", "--pipeline-model-parallel-size", "4",
		"--num-virtual-stages-per-pipeline-rank", "2", "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"); code != 0 {
		t.Fatalf("gotron memory with both accounted: exit %d: %s", code, errs)
	}

	// Megatron's divisibility rule counts the accounted layers.
	_, errs, code = runCLI(t, append([]string{"launch", "--inproc", "--nproc-per-node", "4", "--"},
		with(ppTrain, "--pipeline-model-parallel-size", "4", "--account-for-embedding-in-pipeline-split")...)...)
	if code == 0 || !regexp.MustCompile(`--num-layers=4 plus the layer\(s\) --account-for-embedding-in-pipeline-split counts \(5\) is not divisible by --pipeline-model-parallel-size=4`).MatchString(errs) {
		t.Fatalf("4 layers + embedding over 4 stages: exit %d, %s", code, errs)
	}
}
