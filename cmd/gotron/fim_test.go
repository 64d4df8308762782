package main

import (
	"encoding/json"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gotron/gotron/internal/assets/gpt2"
)

// TestFIMDataCommands runs --fim-data through data samples and train on a
// GPT-2 corpus, naming tokens GPT-2 has as the sentinels, and checks the
// refusals.
func TestFIMDataCommands(t *testing.T) {
	dir := t.TempDir()
	data, vocab, merges := gpt2Corpus(t, dir, 40)
	tok, err := gpt2.Tokenizer()
	if err != nil {
		t.Fatal(err)
	}
	var sentinels []int32
	for _, s := range []string{"@@", "##", "$$"} {
		id, ok := tok.TokenID(s)
		if !ok {
			t.Fatalf("GPT-2 has no %q", s)
		}
		sentinels = append(sentinels, int32(id))
	}
	tokFlags := []string{"--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", vocab, "--merge-file", merges}
	fim := []string{"--fim-data", "--fim-rate", "1", "--fim-spm-rate", "0.5", "--fim-prefix-token", "@@", "--fim-middle-token", "##",
		"--fim-suffix-token", "$$", "--fim-pad-token", "~~"}
	samples := func(extra ...string) []sampleJSON {
		t.Helper()
		args := append([]string{"data", "samples", "--data-path", data, "--split", "100,0,0", "--seq-length", "32",
			"--num-samples", "8,0,0", "--first", "8", "--data-cache-path", filepath.Join(dir, "cache")}, tokFlags...)
		out, errs, code := runCLI(t, append(args, extra...)...)
		if code != 0 {
			t.Fatalf("data samples %v: exit %d: %s", extra, code, errs)
		}
		var got []sampleJSON
		for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
			var s sampleJSON
			if err := json.Unmarshal([]byte(l), &s); err != nil {
				t.Fatalf("%q: %v", l, err)
			}
			got = append(got, s)
		}
		return got
	}
	plain, withFIM := samples(), samples(fim...)
	if len(plain) != 8 || len(withFIM) != 8 {
		t.Fatalf("%d and %d samples, want 8", len(plain), len(withFIM))
	}
	for i := range plain {
		for _, id := range sentinels {
			if slices.Contains(plain[i].Tokens, id) {
				t.Errorf("plain sample %d holds sentinel %d", i, id)
			}
			// --fim-rate 1: every segment of every sample is permuted.
			if !slices.Contains(withFIM[i].Tokens, id) && !slices.Contains(withFIM[i].Labels, id) {
				t.Errorf("FIM sample %d %v lacks sentinel %d", i, withFIM[i].Tokens, id)
			}
		}
	}

	out, errs, code := runCLI(t, append(append([]string{"train", "--data-path", data, "--split", "100,0,0",
		"--num-layers", "1", "--hidden-size", "16", "--num-attention-heads", "2", "--seq-length", "32",
		"--micro-batch-size", "2", "--train-iters", "2", "--lr", "1e-3", "--log-interval", "1", "--eval-iters", "0", "--no-progress"},
		tokFlags...), fim...)...)
	if code != 0 {
		t.Fatalf("train --fim-data: exit %d: %s", code, errs)
	}
	if strings.Count(out, "lm loss:") != 2 {
		t.Errorf("want 2 log lines with a loss:\n%s", out)
	}

	// --num-workers: micro-batch k is read as worker k mod N, each worker
	// with its own FIM stream. One micro-batch per iteration: iteration 1
	// is worker 0's first batch for any N; later ones differ between N = 2
	// and one stream, and N = 1 is one stream.
	losses := func(workers string) []float64 {
		t.Helper()
		m := filepath.Join(dir, "m"+workers+".jsonl")
		_, errs, code := runCLI(t, append(append([]string{"train", "--data-path", data, "--split", "100,0,0",
			"--num-layers", "1", "--hidden-size", "16", "--num-attention-heads", "2", "--seq-length", "32",
			"--micro-batch-size", "2", "--train-iters", "3", "--lr", "1e-3", "--log-interval", "1", "--eval-iters", "0", "--no-progress",
			"--num-workers", workers, "--metrics-file", m}, tokFlags...), fim...)...)
		if code != 0 {
			t.Fatalf("train --num-workers %s: exit %d: %s", workers, code, errs)
		}
		l, _ := metricsLosses(t, m)
		if len(l) != 3 {
			t.Fatalf("--num-workers %s: %d losses", workers, len(l))
		}
		return l
	}
	l0, l1, l2 := losses("0"), losses("1"), losses("2")
	if !slices.Equal(l0, l1) {
		t.Errorf("--num-workers 1 losses %v, 0 %v: want one stream both", l1, l0)
	}
	if l2[0] != l0[0] || slices.Equal(l2, l0) {
		t.Errorf("--num-workers 2 losses %v, 0 %v: want the first equal, a later one different", l2, l0)
	}

	base := append([]string{"data", "samples", "--data-path", data, "--split", "100,0,0", "--seq-length", "32", "--num-samples", "8,0,0"}, tokFlags...)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--fim-rate", "0.3"}, "--fim-rate has no effect without --fim-data"},
		{append(slices.Clone(fim), "--fim-rate", "0"), "--fim-rate 0: want a probability in (0, 1]"},
		{append(slices.Clone(fim), "--fim-spm-rate", "1.5"), "--fim-spm-rate"},
		{append(slices.Clone(fim), "--fim-split-sample", "ĊĊ"), `--fim-split-sample "ĊĊ" needs --fim-fragment-rate`},
		{append(slices.Clone(fim), "--fim-fragment-rate", "0.5"), "--fim-fragment-rate has no effect without --fim-split-sample"},
	} {
		_, errs, code := runCLI(t, append(slices.Clone(base), c.args...)...)
		if code == 0 || !strings.Contains(errs, c.want) {
			t.Errorf("%v: exit %d, stderr %q; want an error with %q", c.args, code, errs, c.want)
		}
	}
	// GPT-2's vocabulary has no FIM sentinels: as Megatron, each is the
	// unknown token (GPT-2's <|endoftext|>), with one line saying so.
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--fim-data"}, `has no --fim-prefix-token "<fim_prefix>", --fim-middle-token "<fim_middle>", --fim-suffix-token "<fim_suffix>", --fim-pad-token "<fim_pad>": each is its unknown token`},
		{append(slices.Clone(fim), "--fim-split-sample", "no-such-token", "--fim-fragment-rate", "0.5"), `has no --fim-split-sample "no-such-token": each is its unknown token`},
	} {
		_, errs, code := runCLI(t, append(slices.Clone(base), c.args...)...)
		if code != 0 || !strings.Contains(errs, c.want) {
			t.Errorf("%v: exit %d, stderr %q; want a run with the line %q", c.args, code, errs, c.want)
		}
	}
	_, errs, code = runCLI(t, "train", "--model", "tiny", "--mock-data", "--seq-length", "16", "--micro-batch-size", "1", "--train-iters", "1", "--lr", "1e-3", "--fim-data")
	if code == 0 || !strings.Contains(errs, "mock data is not supported with FIM data") {
		t.Errorf("--mock-data --fim-data: exit %d, %q", code, errs)
	}
}
