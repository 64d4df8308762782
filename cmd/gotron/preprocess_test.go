package main

import (
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// specJSONL writes the toy dataset of Megatron's reference values (10
// documents of lengths 5,3,8,2,6,4,7,1,9,5) as JSONL for NullTokenizer
// (vocab 100, EOD 99): document k is [(t+i) mod 99 for i < len−1] + [99].
func specJSONL(t *testing.T, dir string) string {
	t.Helper()
	var b strings.Builder
	tok := 0
	for _, l := range []int{5, 3, 8, 2, 6, 4, 7, 1, 9, 5} {
		var ids []string
		for i := 0; i < l-1; i++ {
			ids = append(ids, fmt.Sprint((tok+i)%99))
		}
		ids = append(ids, "99")
		tok += l
		fmt.Fprintf(&b, "{\"text\": %q}\n", strings.Join(ids, " "))
	}
	p := filepath.Join(dir, "toy.jsonl")
	if err := os.WriteFile(p, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestPreprocessSpecExample writes that toy dataset through the CLI and
// compares the .idx with the bytes Megatron's IndexedDatasetBuilder wrote.
func TestPreprocessSpecExample(t *testing.T) {
	dir := t.TempDir()
	in := specJSONL(t, dir)
	code, out, errs := runGotronLocal(t, "preprocess", "--input", in, "--output-prefix", filepath.Join(dir, "toy"),
		"--tokenizer-type", "NullTokenizer", "--vocab-size", "100", "--workers", "2")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	if !strings.Contains(out, "10 documents, 50 tokens") || !strings.Contains(errs, "Processed 10 documents") {
		t.Errorf("stdout %q stderr %q", out, errs)
	}
	idx, err := os.ReadFile(filepath.Join(dir, "toy_text_document.idx"))
	if err != nil {
		t.Fatal(err)
	}
	want := "4d4d494449445800000100000000000000080a000000000000000b00000000000000" +
		"05000000030000000800000002000000060000000400000007000000010000000900000005000000" +
		"00000000000000000a000000000000001000000000000000200000000000000024000000000000003000000000000000" +
		"3800000000000000460000000000000048000000000000005a00000000000000"
	for k := 0; k <= 10; k++ {
		want += fmt.Sprintf("%02x00000000000000", k)
	}
	if got := hex.EncodeToString(idx); got != want {
		t.Errorf(".idx\n got %s\nwant %s", got, want)
	}
}

func TestPreprocessErrors(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.jsonl")
	if err := os.WriteFile(bad, []byte("{\"text\": \"1 2\"}\n{oops\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"--input", bad, "--output-prefix", filepath.Join(dir, "o")}, "--tokenizer-type"},
		{[]string{"--input", bad, "--output-prefix", filepath.Join(dir, "o"), "--tokenizer-type", "NullTokenizer", "--vocab-size", "10"}, "bad.jsonl:2"},
		{[]string{"--inptu", bad}, "did you mean --input"},
		{[]string{"--input", filepath.Join(dir, "missing*.jsonl"), "--output-prefix", "o", "--tokenizer-type", "NullTokenizer", "--vocab-size", "10"}, "no such file"},
		{[]string{"--input", bad, "--output-prefix", "o", "--lang", "german", "--tokenizer-type", "NullTokenizer"}, "--lang"},
	}
	for _, c := range cases {
		code, _, errs := runGotronLocal(t, append([]string{"preprocess"}, c.args...)...)
		if code == 0 || !strings.Contains(errs, c.want) {
			t.Errorf("%v: exit %d, stderr %q; want mention of %q", c.args, code, errs, c.want)
		}
	}
	code, out, errs := runGotronLocal(t, "preprocess", "--input", bad, "--output-prefix", filepath.Join(dir, "o"),
		"--tokenizer-type", "NullTokenizer", "--vocab-size", "10", "--skip-bad-lines")
	if code != 0 || !strings.Contains(out, "skipped 1 bad lines") {
		t.Errorf("--skip-bad-lines: exit %d, %q %q", code, out, errs)
	}
}
