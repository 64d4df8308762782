package main

import (
	"bufio"
	"encoding/json"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestTrainMoEOnIndexedDataset trains a tiny Mixtral-style model (8
// experts, top-2, aux and z losses, grouped GEMM) on a .bin/.idx dataset
// made by gotron preprocess, and finds the MoE losses on every log line and
// in every metrics record, as Megatron names them.
func TestTrainMoEOnIndexedDataset(t *testing.T) {
	dir := t.TempDir()
	var docs strings.Builder
	for i := range 40 {
		b, _ := json.Marshal(map[string]string{"text": strings.Repeat("the quick brown fox jumps over the lazy dog number "+string(rune('a'+i%26))+". ", 20)})
		docs.Write(append(b, '\n'))
	}
	if err := os.WriteFile(filepath.Join(dir, "docs.jsonl"), []byte(docs.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, errs, code := runCLI(t, "tokenizer", "export-gpt2", dir); code != 0 {
		t.Fatal(errs)
	}
	vocab, merges := filepath.Join(dir, "vocab.json"), filepath.Join(dir, "merges.txt")
	if _, errs, code := runCLI(t, "preprocess", "--input", filepath.Join(dir, "docs.jsonl"), "--output-prefix", filepath.Join(dir, "corpus"),
		"--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", vocab, "--merge-file", merges, "--append-eod", "--workers", "1"); code != 0 {
		t.Fatal(errs)
	}
	metrics := filepath.Join(dir, "m.jsonl")
	out, errs, code := runCLI(t, "train", "--data-path", filepath.Join(dir, "corpus_text_document"), "--split", "100,0,0",
		"--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", vocab, "--merge-file", merges,
		"--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--ffn-hidden-size", "48",
		"--seq-length", "32", "--micro-batch-size", "2", "--global-batch-size", "4", "--train-iters", "3",
		"--lr", "1e-3", "--log-interval", "1", "--eval-iters", "0", "--no-progress", "--metrics-file", metrics,
		"--position-embedding-type", "rope", "--normalization", "RMSNorm", "--swiglu", "--disable-bias-linear",
		"--num-experts", "8", "--moe-router-topk", "2", "--moe-router-load-balancing-type", "aux_loss",
		"--moe-aux-loss-coeff", "1e-2", "--moe-z-loss-coeff", "1e-3", "--moe-grouped-gemm", "--moe-token-dispatcher-type", "alltoall")
	if code != 0 {
		t.Fatalf("train exit %d: %s", code, errs)
	}
	if !strings.Contains(errs, "--moe-token-dispatcher-type (one expert-parallel rank): no effect") {
		t.Errorf("stderr %q: want the dispatcher named as having no effect in one process", errs)
	}
	lines := 0
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, " iteration ") {
			lines++
			if !strings.Contains(l, "| lm loss: ") || !strings.Contains(l, "| load_balancing_loss: ") || !strings.Contains(l, "| z_loss: ") {
				t.Errorf("log line without the MoE losses: %s", l)
			}
		}
	}
	if lines != 3 {
		t.Fatalf("%d log lines, want 3:\n%s", lines, out)
	}
	f, err := os.Open(metrics)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	records := 0
	for sc.Scan() {
		var rec map[string]any
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			t.Fatal(err)
		}
		lb, ok1 := rec["load_balancing_loss"].(float64)
		z, ok2 := rec["z_loss"].(float64)
		if !ok1 || !ok2 || lb < 0.5 || lb > 2 || z <= 0 {
			t.Errorf("metrics record %v: want load_balancing_loss near 1 and a positive z_loss", rec)
		}
		records++
	}
	if records != 3 {
		t.Fatalf("%d metrics records, want 3", records)
	}
}

// TestTrainMoEBadInput: each a clear error before training.
func TestTrainMoEBadInput(t *testing.T) {
	moe := with(tinyTrain, "--train-iters", "1", "--swiglu", "--disable-bias-linear", "--num-experts", "8")
	for _, c := range []struct {
		args []string
		want string
	}{
		{with(moe, "--moe-router-topk", "9"), "--moe-router-topk=9: want 1..8"},
		{with(moe, "--expert-model-parallel-size", "3"), "--num-experts=8 is not divisible by --expert-model-parallel-size=3"},
		{with(moe, "--expert-model-parallel-size", "2"), "--expert-model-parallel-size=2 needs 2 ranks"},
		{with(moe, "--expert-tensor-parallel-size", "2"), "--expert-tensor-parallel-size=2 needs 2 ranks"},
		{with(moe, "--moe-expert-capacity-factor", "0"), "--moe-expert-capacity-factor=0: want > 0"},
		{with(moe, "--moe-router-dtype", "bf16"), `--moe-router-dtype "bf16": want fp32 or fp64`},
		{with(moe, "--moe-token-dispatcher-type", "flex"), "flex: not built yet"},
		{with(moe, "--moe-router-load-balancing-type", "sinkhorn"), "sinkhorn: not built yet"},
		{with(moe, "--moe-router-load-balancing-type", "aux_loss", "seq_aux_loss", "--moe-aux-loss-coeff", "0.1"), "2 --moe-router-load-balancing-type values"},
		{with(moe, "--moe-router-enable-expert-bias"), "needs --moe-router-score-function sigmoid"},
		{with(tinyTrain, "--train-iters", "1", "--num-experts", "4"), "--disable-bias-linear"},
		{with(tinyTrain, "--train-iters", "1", "--moe-router-topk", "1"), "--moe-router-topk needs --num-experts"},
	} {
		_, errs, code := runCLI(t, c.args...)
		if code == 0 || !strings.Contains(errs, c.want) {
			t.Errorf("want %q: exit %d, stderr %q", c.want, code, errs)
		}
	}
}

// moeTrain is a tiny Mixtral-style run (8 experts, top-2, aux and z losses,
// no dropping) of 10 iterations of 8 samples.
var moeTrain = []string{"train", "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
	"--ffn-hidden-size", "48", "--seq-length", "16", "--micro-batch-size", "2", "--global-batch-size", "8",
	"--train-iters", "10", "--lr", "1e-2", "--mock-data", "--vocab-size", "100", "--make-vocab-size-divisible-by", "64",
	"--log-interval", "1", "--eval-iters", "0", "--hidden-dropout", "0", "--attention-dropout", "0", "--no-progress",
	"--position-embedding-type", "rope", "--normalization", "RMSNorm", "--swiglu", "--disable-bias-linear",
	"--num-experts", "8", "--moe-router-topk", "2", "--moe-aux-loss-coeff", "1e-2", "--moe-z-loss-coeff", "1e-3",
	"--moe-grouped-gemm"}

// moeMetrics reads every record's lm loss and load_balancing_loss.
func moeMetrics(t *testing.T, path string) (lm, aux []float64) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var m struct {
			LM  float64 `json:"lm_loss"`
			Aux float64 `json:"load_balancing_loss"`
		}
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatal(err)
		}
		lm, aux = append(lm, m.LM), append(aux, m.Aux)
	}
	return lm, aux
}

// TestLaunchExpertParallel: EP=2 over tcp processes with the alltoall
// dispatcher, EP=4 over inproc ranks with the allgather dispatcher, and
// EP=2×TP=2×ETP=2 with sequence parallelism over inproc ranks log the lm
// loss and aux loss of one process at each of 10 iterations within 1e-5
// (the ranks are data-parallel for the dense weights); EP×ETP that does not
// divide the world is refused before training.
func TestLaunchExpertParallel(t *testing.T) {
	bin, err := buildGotron()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	ref := filepath.Join(dir, "one.jsonl")
	if _, errs, code := runCLI(t, with(moeTrain, "--metrics-file", ref)...); code != 0 {
		t.Fatalf("single process: exit %d: %s", code, errs)
	}
	wantLM, wantAux := moeMetrics(t, ref)
	check := func(what, path string) {
		t.Helper()
		lm, aux := moeMetrics(t, path)
		sameLosses(t, what, lm, wantLM)
		for i := range wantAux {
			if math.Abs(aux[i]-wantAux[i]) > 1e-5*math.Abs(wantAux[i]) {
				t.Fatalf("%s: iteration %d load_balancing_loss %.9g, single process %.9g", what, i+1, aux[i], wantAux[i])
			}
		}
	}
	got := filepath.Join(dir, "ep2.jsonl")
	cmd := exec.Command(bin, append([]string{"launch", "--nproc-per-node", "2", "--master-port", freeTCPPort(t), "--"},
		with(moeTrain, "--metrics-file", got, "--expert-model-parallel-size", "2", "--moe-token-dispatcher-type", "alltoall")...)...)
	cmd.Env = append(os.Environ(), "GOTRON_NUM_THREADS=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("gotron launch --nproc-per-node 2 -- train --expert-model-parallel-size 2: %v\n%s", err, out)
	}
	check("tcp EP=2 alltoall", got)
	got = filepath.Join(dir, "ep4.jsonl")
	if _, errs, code := runCLI(t, append([]string{"launch", "--inproc", "--nproc-per-node", "4", "--"},
		with(moeTrain, "--metrics-file", got, "--expert-model-parallel-size", "4", "--moe-token-dispatcher-type", "allgather")...)...); code != 0 {
		t.Fatalf("launch --inproc 4 EP=4: exit %d: %s", code, errs)
	}
	check("inproc EP=4 allgather", got)
	// EP×TP×ETP: tensor and sequence parallel attention, expert-parallel
	// experts split over expert TP
	got = filepath.Join(dir, "ep2tp2etp2.jsonl")
	if _, errs, code := runCLI(t, append([]string{"launch", "--inproc", "--nproc-per-node", "4", "--"},
		with(moeTrain, "--metrics-file", got, "--expert-model-parallel-size", "2", "--tensor-model-parallel-size", "2",
			"--expert-tensor-parallel-size", "2", "--sequence-parallel", "--moe-token-dispatcher-type", "alltoall")...)...); code != 0 {
		t.Fatalf("launch --inproc 4 EP=2 TP=2 ETP=2: exit %d: %s", code, errs)
	}
	check("inproc EP=2×TP=2×ETP=2 SP alltoall", got)
	// EP×ETP must fit the world: 3 ranks cannot hold EP=2, 2 ranks not
	// EP=2×ETP=2.
	if _, errs, code := runCLI(t, append([]string{"launch", "--inproc", "--nproc-per-node", "3", "--"},
		with(moeTrain, "--expert-model-parallel-size", "2")...)...); code == 0 || !strings.Contains(errs, "expert") {
		t.Fatalf("EP=2 on 3 ranks: exit %d, stderr %q", code, errs)
	}
	if _, errs, code := runCLI(t, append([]string{"launch", "--inproc", "--nproc-per-node", "2", "--"},
		with(moeTrain, "--expert-model-parallel-size", "2", "--tensor-model-parallel-size", "2", "--expert-tensor-parallel-size", "2",
			"--sequence-parallel")...)...); code == 0 || !strings.Contains(errs, "ETP·EP·PP") || !strings.Contains(errs, "--expert-tensor-parallel-size") {
		t.Fatalf("EP=2×ETP=2 on 2 ranks: exit %d, stderr %q", code, errs)
	}
}

// TestMemoryMoE: gotron memory with the MoE flags prints Megatron's numbers
// for a Mixtral-like layout (TP 2, EP 8, ETP 1, 64 ranks, distributed
// optimizer: compute_weight_and_optimizer_memory gives 4.740074e10 bytes)
// and refuses an expert layout the world cannot hold.
func TestMemoryMoE(t *testing.T) {
	mixtral := []string{"memory", "--world-size", "64", "--tensor-model-parallel-size", "2", "--expert-model-parallel-size", "8",
		"--expert-tensor-parallel-size", "1", "--use-distributed-optimizer", "--num-layers", "32", "--hidden-size", "4096",
		"--num-attention-heads", "32", "--group-query-attention", "--num-query-groups", "8", "--ffn-hidden-size", "14336",
		"--swiglu", "--normalization", "RMSNorm", "--disable-bias-linear", "--untie-embeddings-and-output-weights",
		"--vocab-size", "32000", "--seq-length", "4096", "--micro-batch-size", "1", "--num-experts", "8", "--moe-router-topk", "2"}
	out, errs, code := runCLI(t, mixtral...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	for _, want := range []string{"Total number of parameters in billions: 46.70", "Total number of active parameters in billions: 12.88",
		"most loaded shard in billions: 6.4406", "weight and optimizer=45204.87 MB"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	_, errs, code = runCLI(t, with(mixtral[:len(mixtral)-4], "--num-experts", "8", "--world-size", "60")...)
	if code == 0 || !strings.Contains(errs, "not divisible by ETP·EP·PP") {
		t.Errorf("EP 8 on 60 ranks: exit %d, stderr %q", code, errs)
	}
}

// mixtralScript is Megatron's examples/mixtral/train_mixtral_8x7b_distributed.sh
// scaled down to two processes on a CPU, with the one change a user makes:
// "torchrun ${DISTRIBUTED_ARGS[@]} pretrain_gpt.py" becomes "gotron launch
// ${DISTRIBUTED_ARGS[@]} -- train" (torchrun's own flags unchanged). Every
// array keeps every flag of the original, with smaller values (2 ranks,
// expert parallelism 2, pipeline size 1, a d64 model, 6 iterations).
const mixtralScript = `#!/bin/bash

# Runs Mixtral 8x7B model

export CUDA_DEVICE_MAX_CONNECTIONS=1

GPUS_PER_NODE=2
MASTER_ADDR=${MASTER_ADDR:-"localhost"}
MASTER_PORT=${MASTER_PORT:-"29500"}
NNODES=${SLURM_NNODES:-"1"}
NODE_RANK=${RANK:-"0"}
WORLD_SIZE=$(($GPUS_PER_NODE*$NNODES))
CHECKPOINT_PATH=$1
TOKENIZER_MODEL=$2
DATA_PATH=$3
DISTRIBUTED_ARGS=(
    --nproc_per_node $GPUS_PER_NODE
    --nnodes $NNODES
    --node_rank $NODE_RANK
    --master_addr $MASTER_ADDR
    --master_port $MASTER_PORT
)
MODEL_ARGS=(
    --use-mcore-models
    --disable-bias-linear
    --seq-length 64
    --max-position-embeddings 256
    --num-layers 2
    --hidden-size 64
    --ffn-hidden-size 112
    --num-attention-heads 4
    --init-method-std 0.01
    --attention-dropout 0.0
    --hidden-dropout 0.0
    --normalization RMSNorm
    --position-embedding-type rope
    --swiglu
    --untie-embeddings-and-output-weights
    --group-query-attention
    --num-query-groups 2
    --no-masked-softmax-fusion
    --no-position-embedding
    --rotary-base 1000000
)
MOE_ARGS=(
    --num-experts 8
    --moe-router-topk 2
    --moe-router-load-balancing-type aux_loss
    --moe-aux-loss-coeff 1e-2
    --moe-grouped-gemm
    --moe-token-dispatcher-type alltoall
    --overlap-param-gather
    --overlap-grad-reduce
)
DATA_ARGS=(
    --tokenizer-type Llama2Tokenizer
    --tokenizer-model ${TOKENIZER_MODEL}
    --data-path $DATA_PATH
    --split 99990,8,2
)
TRAINING_ARGS=(
    --micro-batch-size 1
    --global-batch-size 4
    --lr 1e-4
    --train-iters 6
    --lr-decay-iters 5
    --lr-decay-style cosine
    --min-lr 1.0e-5
    --weight-decay 0.1
    --lr-warmup-iters 1
    --clip-grad 1.0
    --bf16
)
MODEL_PARALLEL_ARGS=(
    --tensor-model-parallel-size 1
    --pipeline-model-parallel-size 1
    --expert-model-parallel-size 2
    --use-distributed-optimizer
    --sequence-parallel
)
LOGGING_ARGS=(
    --log-interval 1 \
    --save-interval 3 \
    --eval-interval 3 \
    --eval-iters 1 \
    --save $CHECKPOINT_PATH \
    --load $CHECKPOINT_PATH \
    --tensorboard-dir "${CHECKPOINT_PATH}/tensorboard" \
    --no-load-optim \
    --no-load-rng
)
if [ -n "${WANDB_API_KEY}" ]; then
    LOGGING_ARGS+=(
        --wandb-project ${WANDB_PROJECT:-"Mixtral"}
        --wandb-exp-name ${WANDB_NAME:-"Mixtral_8x7B"}
    )
fi


gotron launch ${DISTRIBUTED_ARGS[@]} -- train \
    ${MODEL_ARGS[@]} \
    ${MOE_ARGS[@]} \
    ${DATA_ARGS[@]} \
    ${TRAINING_ARGS[@]} \
    ${MODEL_PARALLEL_ARGS[@]} \
    ${LOGGING_ARGS[@]}
`

// TestMegatronMixtralScriptPorts: the scaled-down examples/mixtral script
// trains an 8-expert top-2 model over two tcp processes with expert
// parallelism, the alltoall dispatcher, grouped GEMM, the distributed
// optimizer with overlapped reductions, bf16, Llama-2's tokenizer on a
// .bin/.idx dataset, evaluation, TensorBoard and a checkpoint.
func TestMegatronMixtralScriptPorts(t *testing.T) {
	dir := t.TempDir()
	path := gotronOnPath(t, dir)
	// --split 99990,8,2 needs 50000 documents for a non-empty test split.
	var corpus strings.Builder
	words := strings.Fields("the quick brown fox jumps over the lazy dog while experts route tokens to gates")
	for i := range 50000 {
		line, _ := json.Marshal(map[string]string{"text": strings.Join(words[i%len(words):], " ")})
		corpus.Write(line)
		corpus.WriteByte('\n')
	}
	in := filepath.Join(dir, "corpus.jsonl")
	if err := os.WriteFile(in, []byte(corpus.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	model, err := filepath.Abs("../../tokenizer/testdata/spm/llama2_bpe.model")
	if err != nil {
		t.Fatal(err)
	}
	if _, errs, code := runCLI(t, "preprocess", "--input", in, "--output-prefix", filepath.Join(dir, "corpus"),
		"--tokenizer-type", "Llama2Tokenizer", "--tokenizer-model", model, "--append-eod"); code != 0 {
		t.Fatalf("preprocess: %s", errs)
	}
	script := filepath.Join(dir, "train_mixtral.sh")
	if err := os.WriteFile(script, []byte(mixtralScript), 0o755); err != nil {
		t.Fatal(err)
	}
	ck := filepath.Join(dir, "ck")
	cmd := exec.Command("bash", script, ck, model, filepath.Join(dir, "corpus_text_document"))
	cmd.Env = append(os.Environ(), path, "MASTER_PORT="+freeTCPPort(t), "WANDB_API_KEY=")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the ported script: %v\n%s", err, out)
	}
	for _, want := range []string{
		"iteration        6/       6",
		"| load_balancing_loss: ",
		"validation loss at iteration 3",
		"successfully saved checkpoint from iteration       6",
		"on test set",
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if ents, err := os.ReadDir(filepath.Join(ck, "tensorboard")); err != nil || len(ents) == 0 {
		t.Errorf("no TensorBoard events under %s: %v", filepath.Join(ck, "tensorboard"), err)
	}
}
