package main

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/gotron/gotron/ckpt/hf/hftest"
)

// readNPY parses a .npy v1.0 file of float32 (rows, cols), checking the
// header the way numpy.load does.
func readNPY(t *testing.T, path string) (x []float32, rows, cols int) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) < 10 || string(b[:8]) != "\x93NUMPY\x01\x00" {
		t.Fatalf("%s: bad magic/version % x", path, b[:min(len(b), 8)])
	}
	n := int(binary.LittleEndian.Uint16(b[8:]))
	if (10+n)%64 != 0 || b[10+n-1] != '\n' {
		t.Fatalf("%s: header length %d: data not 64-byte aligned or no newline", path, n)
	}
	hdr := string(b[10 : 10+n])
	m := regexp.MustCompile(`^\{'descr': '<f4', 'fortran_order': False, 'shape': \((\d+), (\d+)\), \} *\n$`).FindStringSubmatch(hdr)
	if m == nil {
		t.Fatalf("%s: header %q", path, hdr)
	}
	rows, _ = strconv.Atoi(m[1])
	cols, _ = strconv.Atoi(m[2])
	data := b[10+n:]
	if len(data) != 4*rows*cols {
		t.Fatalf("%s: %d data bytes for shape (%d, %d)", path, len(data), rows, cols)
	}
	x = make([]float32, rows*cols)
	binary.Read(bytes.NewReader(data), binary.LittleEndian, x)
	return x, rows, cols
}

var pplRE = regexp.MustCompile(`tokens (\d+) scored (\d+) mean_logprob (\S+) perplexity (\S+)`)

// TestScoreMatchesPyTorch: gotron score on an HF directory and on its
// gotron conversion writes the PyTorch reference's logits (within 1e-4
// relative for fp32 weights, 2e-2 for bf16/fp16) and the reference
// log-probabilities and perplexity.
func TestScoreMatchesPyTorch(t *testing.T) {
	for _, fx := range hftest.Fixtures() {
		t.Run(fx.Name, func(t *testing.T) {
			src, tmp := hfFixture(fx.Name), t.TempDir()
			g := filepath.Join(tmp, "gotron")
			mustGotron(t, "convert", "--from", "hf", "--load", src, "--save", g)
			ids, want := hftest.Golden(t, src)
			V := len(want) / len(ids)
			tokens := filepath.Join(tmp, "tokens.json")
			js := make([]string, len(ids))
			for i, id := range ids {
				js[i] = fmt.Sprint(id)
			}
			os.WriteFile(tokens, []byte("["+strings.Join(js, ", ")+"]"), 0o644)
			wantLP := logProbs(ids, want, V)
			var sum float64
			for _, x := range wantLP {
				sum += x
			}
			wantPPL := math.Exp(-sum / float64(len(wantLP)))
			for _, load := range []string{src, g} {
				npy := filepath.Join(tmp, "logits.npy")
				out := mustGotron(t, "score", "--load", load, "--tokens-file", tokens, "--out", npy)
				got, rows, cols := readNPY(t, npy)
				if rows != len(ids) || cols != V {
					t.Fatalf("%s: logits (%d, %d), want (%d, %d) (vocabulary without padding)", load, rows, cols, len(ids), V)
				}
				worst := 0.0
				for i := range got {
					e := math.Abs(float64(got[i])-float64(want[i])) / math.Max(1, math.Abs(float64(want[i])))
					worst = math.Max(worst, e)
					if e > fx.Tol {
						t.Fatalf("%s: logit %d = %g, want %g", load, i, got[i], want[i])
					}
				}
				m := pplRE.FindStringSubmatch(out)
				if m == nil {
					t.Fatalf("no perplexity line in:\n%s", out)
				}
				ppl, _ := strconv.ParseFloat(m[4], 64)
				if m[1] != fmt.Sprint(len(ids)) || m[2] != fmt.Sprint(len(ids)-1) || math.Abs(ppl-wantPPL) > 1e-4*wantPPL {
					t.Fatalf("%s: %q, want tokens %d scored %d perplexity %g", load, m[0], len(ids), len(ids)-1, wantPPL)
				}
				for i, lp := range wantLP {
					line := fmt.Sprintf("%8d %8d ", i+1, ids[i+1])
					j := strings.Index(out, line)
					if j < 0 {
						t.Fatalf("no line %q in:\n%s", line, out)
					}
					f := strings.Fields(out[j:])
					got, _ := strconv.ParseFloat(f[2], 64)
					if math.Abs(got-lp) > 1e-4*math.Max(1, math.Abs(lp)) {
						t.Fatalf("%s: position %d logprob %g, want %g", load, i+1, got, lp)
					}
				}
				t.Logf("%s: max relative logit error %.3g, perplexity %s (reference %.6f)", load, worst, m[4], wantPPL)
			}
		})
	}
}

// TestScoreText: --text uses the tokenizer carried in the checkpoint (the
// HF directory's vocab.json/merges.txt, or the converted dir's tokenizer/)
// and scores the same ids as --tokens-file.
func TestScoreText(t *testing.T) {
	src, tmp := hfFixture("gpt2_tied_f32"), t.TempDir()
	g := filepath.Join(tmp, "gotron")
	mustGotron(t, "convert", "--from", "hf", "--load", src, "--save", g)
	// "the the": t, he, Ġthe (merges Ġ+t, h+e, Ġt+he).
	a := mustGotron(t, "score", "--load", src, "--text", "the the", "--out", filepath.Join(tmp, "a.npy"))
	b := mustGotron(t, "score", "--load", g, "--text", "the the")
	os.WriteFile(filepath.Join(tmp, "ids.json"), []byte("[116, 257, 258]"), 0o644)
	c := mustGotron(t, "score", "--load", g, "--tokens-file", filepath.Join(tmp, "ids.json"))
	if a != b || !strings.Contains(a, `"he"`) || !strings.Contains(a, `" the"`) {
		t.Fatalf("HF dir:\n%s\ngotron dir:\n%s", a, b)
	}
	if pa, pc := pplRE.FindString(a), pplRE.FindString(c); pa == "" || pa != pc {
		t.Fatalf("--text %q vs --tokens-file %q", pa, pc)
	}
	if _, rows, _ := readNPY(t, filepath.Join(tmp, "a.npy")); rows != 3 {
		t.Fatalf("%d rows, want 3 tokens", rows)
	}
	// On the simulated device (whose storage host code cannot read) the
	// scores are the CPU's, bit for bit.
	if d := mustGotron(t, "score", "--load", src, "--text", "the the", "--device", "sim"); d != a {
		t.Fatalf("--device sim:\n%s\ncpu:\n%s", d, a)
	}
}

// TestScoreErrors: bad input is an error naming the flag or file.
func TestScoreErrors(t *testing.T) {
	tmp := t.TempDir()
	write := func(name, s string) string {
		p := filepath.Join(tmp, name)
		os.WriteFile(p, []byte(s), 0o644)
		return p
	}
	llama, gpt2 := hfFixture("llama_gqa_untied_f32"), hfFixture("gpt2_tied_f32")
	long := "[" + strings.Repeat("1, ", 16) + "1]"
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"--tokens-file", "x"}, "--load is required"},
		{[]string{"--load", llama, "--text", "y", "--device-memory-fraction", "1.5"}, "--device-memory-fraction 1.5: want a fraction in (0, 1]"},
		{[]string{"--load", llama, "--text", "y", "--device", "gpu"}, "--device: tensor: device \"gpu\": want cpu, cuda, cuda:N or sim"},
		{[]string{"--load", llama}, "exactly one of --tokens-file and --text"},
		{[]string{"--load", llama, "--tokens-file", "x", "--text", "y"}, "exactly one of --tokens-file and --text"},
		{[]string{"--load", llama, "--tokens-file", write("range.json", "[1, 100]")}, "token 100 at index 1 is outside the vocabulary [0, 100)"},
		{[]string{"--load", llama, "--tokens-file", write("neg.json", "[-1]")}, "token -1 at index 0"},
		{[]string{"--load", llama, "--tokens-file", write("obj.json", `{"ids": [1]}`)}, "want a JSON list of token ids"},
		{[]string{"--load", llama, "--tokens-file", write("empty.json", "[]")}, "no tokens"},
		{[]string{"--load", gpt2, "--tokens-file", write("long.json", long)}, "17 tokens exceed the model's max_position_embeddings 16"},
		{[]string{"--load", llama, "--tokens-file", filepath.Join(tmp, "missing.json")}, "--tokens-file"},
		{[]string{"--load", llama, "--text", "hello"}, "carries no tokenizer"},
		{[]string{"--load", filepath.Join(tmp, "nothing"), "--text", "hello"}, "no checkpoint"},
		{[]string{"--load", gpt2, "--tokens-file", write("ok.json", "[1, 2]"), "--out", filepath.Join(tmp, "no", "dir", "x.npy")}, "--out"},
	}
	for _, c := range cases {
		_, errs, code := gotronHF(t, append([]string{"score"}, c.args...)...)
		if code == 0 || !strings.Contains(errs, c.want) {
			t.Errorf("score %v: exit %d, stderr %q, want it to mention %q", c.args, code, errs, c.want)
		}
	}
}

// TestWriteNPYHeader pins the header bytes: numpy's layout for (2, 3).
func TestWriteNPYHeader(t *testing.T) {
	p := filepath.Join(t.TempDir(), "x.npy")
	if err := writeNPY(p, []float32{1, 2, 3, 4, 5, 6}, 2, 3); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(p)
	want := "\x93NUMPY\x01\x00\x76\x00{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }" + strings.Repeat(" ", 58) + "\n"
	if string(b[:128]) != want || len(b) != 128+24 {
		t.Fatalf("header %q (len %d), want %q", b[:min(len(b), 128)], len(b), want)
	}
	x, _, _ := readNPY(t, p)
	if x[5] != 6 {
		t.Fatalf("data %v", x)
	}
}
