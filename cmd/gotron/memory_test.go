package main

import (
	"strings"
	"testing"
)

// gpt3Args are the model, batch and parallel flags of Megatron's
// examples/gpt3/train_gpt3_175b_distributed.sh plus SP, the distributed
// optimizer and selective recompute, on 1024 ranks (DP 8).
var gpt3Args = []string{"memory", "--num-layers", "96", "--hidden-size", "12288", "--num-attention-heads", "96",
	"--seq-length", "2048", "--max-position-embeddings", "2048", "--micro-batch-size", "1", "--global-batch-size", "1536",
	"--lr", "6.0e-5", "--fp16", "--tensor-model-parallel-size", "8", "--sequence-parallel", "--use-distributed-optimizer",
	"--recompute-activations", "--vocab-size", "50257"}

// TestMemoryGPT3MatchesMegatron runs the 175B layouts of
// train/memory_test.go through the flags: GPT-2's 50257 tokens padded to a
// multiple of 128·TP = 1024 give 51200, and 1536/(1·8) = 192 microbatches.
// The report is Megatron's report_theoretical_memory output for the same args.
func TestMemoryGPT3MatchesMegatron(t *testing.T) {
	cases := []struct {
		name  string
		extra []string
		want  string
	}{
		{"TP8 PP16", []string{"--pipeline-model-parallel-size", "16", "--world-size", "1024"},
			"gotron memory: 96 layers, hidden 12288, padded vocab 51200, seq 2048 × micro batch 1 on 1024 ranks: TP 8, PP 16, CP 1, DP 8; 192 microbatches\n" +
				`Number of parameters in transformer block in billions:  173.95
Number of active parameters in transformer block in billions:  173.95
Number of parameters in embedding layers in billions: 0.63
Total number of parameters in billions: 174.58
Total number of active parameters in billions: 174.58
Number of parameters in most loaded shard in billions: 1.4379
Number of parameters in other shards in billions: 1.3593
compute_activation_memory with SP
Activation memory footprint per transformer layer: 102.0 MB
Number of in-flight microbatches: 16
Theoretical memory footprints: weight and optimizer=10284.62 MB, activation=9840.03 MB, total=20124.65 MB

`},
		{"TP8 PP8 VP3", []string{"--pipeline-model-parallel-size", "8", "--num-layers-per-virtual-pipeline-stage", "4", "--world-size", "512"},
			"gotron memory: 96 layers, hidden 12288, padded vocab 51200, seq 2048 × micro batch 1 on 512 ranks: TP 8, PP 8, CP 1, DP 8; 192 microbatches\n" +
				`Number of parameters in transformer block in billions:  173.95
Number of active parameters in transformer block in billions:  173.95
Number of parameters in embedding layers in billions: 0.63
Total number of parameters in billions: 174.58
Total number of active parameters in billions: 174.58
Number of parameters in most loaded shard in billions: 2.7971
Number of parameters in other shards in billions: 2.7185
compute_activation_memory with SP
Activation memory footprint per transformer layer: 102.0 MB
Memory penalty from interleaved schedule: 1.29
Number of in-flight microbatches: 11
Theoretical memory footprints: weight and optimizer=20006.74 MB, activation=12679.02 MB, total=32685.76 MB

`},
	}
	for _, c := range cases {
		args := append(append([]string{}, gpt3Args...), c.extra...)
		code, out, errs := runGotronLocal(t, args...)
		if code != 0 {
			t.Fatalf("%s: exit %d: %s", c.name, code, errs)
		}
		if out != c.want {
			t.Errorf("%s: got\n%s\nwant\n%s", c.name, out, c.want)
		}
	}
}

// TestMemoryLlamaFlags checks GQA, SwiGLU, RMSNorm, untied embeddings and CP
// through the flags (train/memory_test.go's Llama-3 8B layout, Megatron's
// numbers), with no --global-batch-size: microbatches unknown, as
// tools/report_theoretical_memory.py.
func TestMemoryLlamaFlags(t *testing.T) {
	code, out, errs := runGotronLocal(t, "memory", "--num-layers", "32", "--hidden-size", "4096", "--num-attention-heads", "32",
		"--group-query-attention", "--num-query-groups", "8", "--ffn-hidden-size", "14336", "--swiglu", "--normalization", "RMSNorm",
		"--untie-embeddings-and-output-weights", "--seq-length", "8192", "--micro-batch-size", "1", "--vocab-size", "128256",
		"--tensor-model-parallel-size", "2", "--context-parallel-size", "2", "--sequence-parallel", "--use-distributed-optimizer",
		"--recompute-granularity", "selective", "--world-size", "16")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	for _, want := range []string{
		"padded vocab 128256", "TP 2, PP 1, CP 2, DP 4; microbatches unknown",
		"Number of parameters in most loaded shard in billions: 4.0153\n",
		"Theoretical memory footprints: weight and optimizer=34463.29 MB, activation=18468.03 MB, total=52931.32 MB\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if errs != "" {
		t.Errorf("unexpected stderr: %s", errs)
	}
}

// TestMemoryBadInput checks that impossible layouts are refused before
// anything is computed, naming the flags.
func TestMemoryBadInput(t *testing.T) {
	base := []string{"memory", "--num-layers", "4", "--hidden-size", "256", "--num-attention-heads", "4", "--seq-length", "256",
		"--micro-batch-size", "2"}
	cases := []struct {
		name  string
		args  []string
		wants []string
	}{
		{"world size not divisible by TP·PP·CP", []string{"--world-size", "12", "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "4"},
			[]string{"--world-size=12 is not divisible by", "--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--context-parallel-size", "2×4×1 = 8"}},
		{"no world size", nil, []string{"--world-size is required"}},
		{"no sequence length", []string{"--world-size", "1", "--seq-length", "0"}, []string{"--seq-length"}},
		{"global batch not a multiple of micro batch × DP", []string{"--world-size", "4", "--global-batch-size", "6"},
			[]string{"--global-batch-size=6", "--micro-batch-size=2 × data-parallel size 4"}},
		{"virtual stages not dividing a stage", []string{"--world-size", "2", "--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "3"},
			[]string{"--num-layers-per-virtual-pipeline-stage=3", "2 layers"}},
		{"both virtual pipeline flags", []string{"--world-size", "2", "--pipeline-model-parallel-size", "2",
			"--num-layers-per-virtual-pipeline-stage", "1", "--num-virtual-stages-per-pipeline-rank", "2"}, []string{"give only one of them"}},
		{"bad recompute granularity", []string{"--world-size", "1", "--recompute-granularity", "block"}, []string{"--recompute-granularity", "block"}},
		{"bad normalization", []string{"--world-size", "1", "--normalization", "rmsnorm"}, []string{`"rmsnorm" for flag --normalization: want LayerNorm or RMSNorm`}},
		{"bad position embedding", []string{"--world-size", "1", "--position-embedding-type", "yarn"},
			[]string{`"yarn" for flag --position-embedding-type: want learned_absolute, rope or none`}},
		{"bad optimizer", []string{"--world-size", "1", "--optimizer", "lion"}, []string{`"lion" for flag --optimizer: want adam or sgd`}},
		{"unknown flag", []string{"--world-size", "1", "--world-sise", "2"}, []string{"did you mean --world-size"}},
		{"GQA without groups", []string{"--world-size", "1", "--group-query-attention"}, []string{"--num-query-groups"}},
	}
	for _, c := range cases {
		code, out, errs := runGotronLocal(t, append(append([]string{}, base...), c.args...)...)
		if code != 1 {
			t.Errorf("%s: exit %d, want 1 (stdout %q)", c.name, code, out)
			continue
		}
		if !strings.HasPrefix(errs, "gotron memory: ") {
			t.Errorf("%s: stderr %q lacks the command prefix", c.name, errs)
		}
		for _, w := range c.wants {
			if !strings.Contains(errs, w) {
				t.Errorf("%s: stderr %q does not name %q", c.name, errs, w)
			}
		}
	}
}

// TestMemorySwiGLUDefaultWarns checks the warning for --swiglu without
// --ffn-hidden-size, where gotron's model (4·h) and Megatron's default
// (int(8h/3/64)·64) differ.
func TestMemorySwiGLUDefaultWarns(t *testing.T) {
	code, _, errs := runGotronLocal(t, "memory", "--num-layers", "2", "--hidden-size", "4096", "--num-attention-heads", "32",
		"--swiglu", "--seq-length", "128", "--micro-batch-size", "1", "--world-size", "1")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	if !strings.Contains(errs, "4×hidden = 16384; Megatron's would use 10880") {
		t.Errorf("stderr %q lacks the SwiGLU default warning", errs)
	}
}

// TestMemoryHelpListsItsFlags checks that --help shows the train flags and
// the report's own.
func TestMemoryHelpListsItsFlags(t *testing.T) {
	code, out, _ := runGotronLocal(t, "memory", "--help")
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	for _, want := range []string{"Usage: gotron memory", "--world-size", "--num-layers", "--recompute-granularity",
		"--num-layers-per-virtual-pipeline-stage", "--use-distributed-optimizer"} {
		if !strings.Contains(out, want) {
			t.Errorf("--help lacks %s", want)
		}
	}
}
