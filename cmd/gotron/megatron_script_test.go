package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// megatronScript is Megatron's examples/gpt3/train_gpt3_175b_distributed.sh
// scaled down to one process, with the one change a user makes: the
// program. "torchrun ${DISTRIBUTED_ARGS[@]} pretrain_gpt.py" becomes
// "gotron train" (distributed runs use "gotron launch ... -- train"). The
// model, training, data, evaluation and logging arrays keep every flag of
// the original, with smaller values. Megatron HEAD's copy also passes
// --step-batch-size-schedule beside --global-batch-size, which its own
// argument check refuses ("Cannot specify both"): the script here is the
// runnable form, and TestMegatronScriptPorts checks gotron refuses the pair
// too.
const megatronScript = `#!/bin/bash
set -e
CHECKPOINT_PATH=$1
TENSORBOARD_LOGS_PATH=$2
VOCAB_FILE=$3
MERGE_FILE=$4
DATA_PATH=$5

GPT_MODEL_ARGS=(
    --num-layers 2
    --hidden-size 64
    --num-attention-heads 4
    --seq-length 64
    --max-position-embeddings 64
    --attention-backend auto # Can use (flash/fused/unfused/local)
)

TRAINING_ARGS=(
    --micro-batch-size 1
    --global-batch-size 4
    --train-iters 6
    --weight-decay 0.1
    --adam-beta1 0.9
    --adam-beta2 0.95
    --init-method-std 0.006
    --clip-grad 1.0
    --fp16
    --lr 6.0e-5
    --lr-decay-style cosine
    --min-lr 6.0e-6
    --lr-warmup-fraction .001
    --lr-decay-iters 5
)

MODEL_PARALLEL_ARGS=(
	--tensor-model-parallel-size 1
	--pipeline-model-parallel-size 1
)

DATA_ARGS=(
    --data-path $DATA_PATH
    --vocab-file $VOCAB_FILE
    --merge-file $MERGE_FILE
    --split 949,50,1
)

EVAL_AND_LOGGING_ARGS=(
    --log-interval 2
    --save-interval 3
    --eval-interval 3
    --save $CHECKPOINT_PATH
    --load $CHECKPOINT_PATH
    --eval-iters 2
    --tensorboard-dir $TENSORBOARD_LOGS_PATH
)

gotron train \
    ${GPT_MODEL_ARGS[@]} \
    ${TRAINING_ARGS[@]} \
    ${MODEL_PARALLEL_ARGS[@]} \
    ${DATA_ARGS[@]} \
    ${EVAL_AND_LOGGING_ARGS[@]}
`

// TestMegatronScriptPorts: Megatron's GPT-3 launch script, scaled down,
// runs under gotron train with only the program name changed, on a real
// GPT-2-tokenized .bin/.idx dataset; every flag acts (checked by its
// effect) or is named in the one warning (--attention-backend, a GPU
// kernel choice).
func TestMegatronScriptPorts(t *testing.T) {
	dir := t.TempDir()
	path := gotronOnPath(t, dir)
	data, vocab, merges := gpt2Corpus(t, dir, 2000)
	script := filepath.Join(dir, "train_gpt3.sh")
	if err := os.WriteFile(script, []byte(megatronScript), 0o755); err != nil {
		t.Fatal(err)
	}
	ck, tb := filepath.Join(dir, "ck"), filepath.Join(dir, "tb")
	cmd := exec.Command("bash", script, ck, tb, vocab, merges, data)
	cmd.Env = append(os.Environ(), path)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("the ported script: %v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	out, errs := stdout.String(), stderr.String()
	if want := "gotron train: --attention-backend auto: no effect on the CPU backend"; strings.Count(errs, "\n") != 1 || !strings.Contains(errs, want) {
		t.Errorf("stderr should be the one warning %q, got:\n%s", want, errs)
	}
	for _, want := range []string{
		"iteration        6/       6",             // --train-iters
		"global batch size:     4",                // --global-batch-size
		"loss scale: ",                            // --fp16: Megatron's dynamic scaler
		"validation loss at iteration 3",          // --eval-interval
		"saved checkpoint from iteration       3", // --save-interval
		"on test set",                             // --split 949,50,1
		"vocab 50304",                             // GPT-2 vocabulary padded by 128
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if !strings.Contains(out, "loss scale: 4294967296.0") && !strings.Contains(out, "loss scale: 2147483648.0") {
		t.Errorf("--fp16 should start from Megatron's 2^32 loss scale:\n%s", out)
	}
	if n := strings.Count(out, "] iteration "); n != 4 { // 1 (a run's first, as Megatron), 2, 4, 6; skipped fp16 iterations print no lm loss
		t.Errorf("%d log lines for 6 iterations at --log-interval 2", n)
	}
	if ev, _ := filepath.Glob(filepath.Join(tb, "events.out.tfevents.*")); len(ev) != 1 {
		t.Errorf("--tensorboard-dir: %d event files", len(ev))
	}
	if b, err := os.ReadFile(filepath.Join(ck, "latest_checkpointed_iteration.txt")); err != nil || strings.TrimSpace(string(b)) != "6" {
		t.Errorf("--save: latest iteration %q (%v), want 6", b, err)
	}
	// Run again: --load resumes at iteration 6, which is the end.
	cmd = exec.Command("bash", script, ck, tb, vocab, merges, data)
	cmd.Env = append(os.Environ(), path)
	b, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(b), "successfully loaded checkpoint from "+ck+" [ t 1/1, gtp_remat 1/1, p 1/1 ] at iteration 6") {
		t.Errorf("second run (--load): %v\n%s", err, b)
	}

	// Megatron HEAD's copy adds --step-batch-size-schedule to
	// --global-batch-size; both Megatron and gotron refuse the pair.
	_, errs, code := runCLI(t, "train", "--mock-data", "--vocab-size", "64", "--num-layers", "1", "--hidden-size", "32",
		"--num-attention-heads", "4", "--seq-length", "16", "--micro-batch-size", "1", "--lr", "1e-3", "--train-iters", "1",
		"--global-batch-size", "4", "--step-batch-size-schedule", "0:16 2.4B:320")
	if code == 0 || !strings.Contains(errs, "--step-batch-size-schedule and --global-batch-size exclude each other") {
		t.Errorf("--step-batch-size-schedule with --global-batch-size: exit %d, stderr %q", code, errs)
	}
}
