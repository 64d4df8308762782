package main

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
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

// TestPreprocessCleansAfterAKilledRun: a gotron preprocess killed with
// SIGKILL (reading a FIFO that never ends, so its builders are open) leaves
// its temporary files; the next run removes them and says so (they used
// to stay for good, up to ~90 MB each).
func TestPreprocessCleansAfterAKilledRun(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns a process")
	}
	bin, err := buildGotron()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	fifo := filepath.Join(dir, "in.jsonl")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Skipf("no FIFOs here: %v", err)
	}
	prefix := filepath.Join(dir, "out")
	cmd := exec.Command(bin, "preprocess", "--input", fifo, "--output-prefix", prefix,
		"--tokenizer-type", "NullTokenizer", "--vocab-size", "100", "--partitions", "2")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	// Opening the FIFO for writing waits for preprocess to open it for
	// reading; should preprocess fail first, a reader of our own ends the wait.
	opened := make(chan *os.File, 1)
	go func() {
		w, err := os.OpenFile(fifo, os.O_WRONLY, 0)
		if err != nil {
			w = nil
		}
		opened <- w
	}()
	var w *os.File
	select {
	case w = <-opened:
	case err := <-exited:
		if r, rerr := os.OpenFile(fifo, os.O_RDONLY|syscall.O_NONBLOCK, 0); rerr == nil {
			defer r.Close()
		}
		t.Fatalf("preprocess exited before reading its input: %v\n%s", err, out.String())
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		t.Fatalf("preprocess never opened its input:\n%s", out.String())
	}
	if w == nil {
		cmd.Process.Kill()
		t.Fatal("open the FIFO for writing failed")
	}
	defer w.Close()
	fmt.Fprintln(w, `{"text": "1 2 3 4"}`)
	temps := func() []string {
		m, _ := filepath.Glob(prefix + "_*.tmp-*")
		return m
	}
	deadline := time.Now().Add(30 * time.Second)
	for len(temps()) == 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-exited
	left := temps()
	if len(left) == 0 {
		t.Fatalf("the killed run left no temporary files to clean (test broken?):\n%s", out.String())
	}
	// The next run, into the same prefix, removes them.
	in := specJSONL(t, dir)
	code, stdout, errs := runGotronLocal(t, "preprocess", "--input", in, "--output-prefix", prefix,
		"--tokenizer-type", "NullTokenizer", "--vocab-size", "100")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	if got := temps(); len(got) != 0 {
		t.Fatalf("temporary files still there: %v", got)
	}
	want := fmt.Sprintf("removed %d temporary files that a killed run left: ", len(left))
	if !strings.Contains(errs, want) || !strings.Contains(errs, left[0]) || !strings.Contains(stdout, "wrote "+prefix+"_text_document.bin") {
		t.Fatalf("stdout %q, stderr %q, want %q", stdout, errs, want)
	}
}
