package preprocess

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gotron/gotron/data/indexed"
	"github.com/gotron/gotron/tokenizer"
)

// byteTokenizer is testdata/stub's ByteStub: ids are the UTF-8 bytes.
type byteTokenizer struct{}

func (byteTokenizer) Encode(s string) []int {
	out := make([]int, len(s))
	for i := range len(s) {
		out[i] = int(s[i])
	}
	return out
}
func (byteTokenizer) Decode(ids []int) string {
	b := make([]byte, len(ids))
	for i, v := range ids {
		b[i] = byte(v)
	}
	return string(b)
}
func (byteTokenizer) VocabSize() int { return 257 }
func (byteTokenizer) EOD() int       { return 256 }

var _ tokenizer.Tokenizer = byteTokenizer{}

func sameFiles(t *testing.T, got, want string) {
	t.Helper()
	for _, ext := range []string{".bin", ".idx"} {
		g, err := os.ReadFile(got + ext)
		if err != nil {
			t.Fatal(err)
		}
		w, err := os.ReadFile(want + ext)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(g, w) {
			t.Errorf("%s%s differs from Megatron's %s%s:\n got %x\nwant %x", got, ext, want, ext, g, w)
		}
	}
}

// TestMegatronGoldens runs the same commands as testdata/megatron_ref.sh,
// which ran Megatron's own tools/preprocess_data.py, and compares bytes.
func TestMegatronGoldens(t *testing.T) {
	cases := []struct {
		name string
		cfg  Config
		keys []string
	}{
		{"mg_plain", Config{Workers: 2}, []string{"text"}},
		{"mg_eod", Config{Workers: 3, JSONKeys: []string{"text", "title"}, AppendEOD: true}, []string{"text", "title"}},
		{"mg_part", Config{Workers: 2, Partitions: 2, AppendEOD: true}, []string{"text"}},
		{"mg_seq", Config{Workers: 2, Partitions: 2, KeepSequentialSamples: true, AppendEOD: true}, []string{"text"}},
	}
	dir := t.TempDir()
	for _, c := range cases {
		cfg := c.cfg
		cfg.Input = filepath.Join("testdata", "input.jsonl")
		cfg.OutputPrefix = filepath.Join(dir, c.name)
		cfg.Tokenizer = byteTokenizer{}
		st, err := Run(context.Background(), cfg)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if st.Documents != 8 || len(st.Outputs) != len(c.keys) {
			t.Errorf("%s: %+v", c.name, st)
		}
		for _, k := range c.keys {
			sameFiles(t, fmt.Sprintf("%s_%s_document", cfg.OutputPrefix, k), filepath.Join("testdata", fmt.Sprintf("%s_%s_document", c.name, k)))
		}
	}
	if m, _ := filepath.Glob(filepath.Join(dir, "mg_part_0_*")); len(m) != 0 {
		t.Errorf("partition files left behind: %v", m)
	}
}

// Output does not depend on the number of workers, across many batches.
func TestWorkersPreserveOrder(t *testing.T) {
	dir := t.TempDir()
	var in strings.Builder
	for i := range 1000 {
		fmt.Fprintf(&in, "{\"text\": \"document %d %s\"}\n", i, strings.Repeat("x", i%37))
	}
	input := filepath.Join(dir, "in.jsonl")
	if err := os.WriteFile(input, []byte(in.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	var prefixes []string
	for _, w := range []int{1, 4} {
		p := filepath.Join(dir, fmt.Sprintf("w%d", w))
		if _, err := Run(context.Background(), Config{Input: input, OutputPrefix: p, Workers: w, Tokenizer: byteTokenizer{}, AppendEOD: true}); err != nil {
			t.Fatal(err)
		}
		prefixes = append(prefixes, p+"_text_document")
	}
	sameFiles(t, prefixes[1], prefixes[0])
	ds, err := indexed.Open(prefixes[1])
	if err != nil {
		t.Fatal(err)
	}
	defer ds.Close()
	got := ds.AppendTokens(nil, 999, 0, int(ds.SequenceLength(999)))
	want := []int32{}
	for _, c := range []byte("document 999 " + strings.Repeat("x", 999%37)) {
		want = append(want, int32(c))
	}
	want = append(want, 256)
	if !slices.Equal(got, want) {
		t.Errorf("document 999 = %v", got)
	}
}

func TestBadLines(t *testing.T) {
	dir := t.TempDir()
	input := filepath.Join(dir, "bad.jsonl")
	lines := "{\"text\": \"ok\"}\n{\"text\": \"ok\"}\n{not json}\n{\"other\": 1}\n{\"text\": 5}\n\n{\"text\": \"fine\"}\n"
	if err := os.WriteFile(input, []byte(lines), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := Run(context.Background(), Config{Input: input, OutputPrefix: filepath.Join(dir, "o"), Tokenizer: byteTokenizer{}})
	var le *LineError
	if !errors.As(err, &le) || le.File != input || le.Line != 3 || !strings.Contains(err.Error(), "--skip-bad-lines") {
		t.Fatalf("err = %v, want a LineError at %s:3", err, input)
	}
	if _, err := os.Stat(filepath.Join(dir, "o_text_document.idx")); err == nil {
		t.Error("a failed run left an .idx behind")
	}
	st, err := Run(context.Background(), Config{Input: input, OutputPrefix: filepath.Join(dir, "o"), Tokenizer: byteTokenizer{}, SkipBadLines: true})
	if err != nil {
		t.Fatal(err)
	}
	if st.BadLines != 4 || st.Documents != 3 {
		t.Errorf("stats %+v, want 4 bad lines and 3 documents", st)
	}
}

func TestConfigErrors(t *testing.T) {
	dir := t.TempDir()
	cases := []struct {
		cfg  Config
		want string
	}{
		{Config{OutputPrefix: "x", Tokenizer: byteTokenizer{}}, "--input"},
		{Config{Input: "x", Tokenizer: byteTokenizer{}}, "--output-prefix"},
		{Config{Input: "x", OutputPrefix: "y"}, "tokenizer"},
		{Config{Input: filepath.Join(dir, "none*.jsonl"), OutputPrefix: "y", Tokenizer: byteTokenizer{}}, "no such file"},
		{Config{Input: "x", OutputPrefix: "y", Tokenizer: byteTokenizer{}, Workers: -1}, "--workers"},
	}
	for _, c := range cases {
		if _, err := Run(context.Background(), c.cfg); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("err = %v, want mention of %q", err, c.want)
		}
	}
}

func TestSplitSentencesAndProgress(t *testing.T) {
	dir := t.TempDir()
	input := filepath.Join(dir, "s.jsonl")
	if err := os.WriteFile(input, []byte(`{"text": "Dr. Smith went home. It rained! Did it?  Yes."}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var prog bytes.Buffer
	clock := time.Unix(0, 0)
	now := func() time.Time { clock = clock.Add(time.Second); return clock }
	st, err := Run(context.Background(), Config{Input: input, OutputPrefix: filepath.Join(dir, "s"), Tokenizer: byteTokenizer{},
		SplitSentences: true, AppendEOD: true, Progress: &prog, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	ds, err := indexed.Open(st.Outputs[0])
	if err != nil {
		t.Fatal(err)
	}
	defer ds.Close()
	if !strings.HasSuffix(st.Outputs[0], "_text_sentence") || ds.NumSequences() != 4 || ds.NumDocuments() != 1 {
		t.Fatalf("%s: %d sequences %d documents", st.Outputs[0], ds.NumSequences(), ds.NumDocuments())
	}
	// The EOD counts in the last sentence: "Yes." + EOD.
	if ds.SequenceLength(3) != 5 || ds.SequenceLength(0) != int32(len("Dr. Smith went home.")) {
		t.Errorf("sentence lengths %v", ds.SequenceLengths())
	}
	if !strings.Contains(prog.String(), "Processed 1 documents") || !strings.Contains(prog.String(), "docs/s") {
		t.Errorf("progress %q", prog.String())
	}
}

func TestSentenceSplitter(t *testing.T) {
	cases := []struct {
		in   string
		keep bool
		want []string
	}{
		{"One. Two.", false, []string{"One.", "Two."}},
		{"Dr. Who and Mr. X met e.g. Bob. Then left.", false, []string{"Dr. Who and Mr. X met e.g. Bob.", "Then left."}},
		{"J. R. R. Tolkien wrote. Books sold.", false, []string{"J. R. R. Tolkien wrote.", "Books sold."}},
		{"He said \"Stop.\" Then ran.", false, []string{"He said \"Stop.\"", "Then ran."}},
		{"3.14 is pi. 2 is even.", false, []string{"3.14 is pi.", "2 is even."}},
		{"lower. case next", false, []string{"lower. case next"}},
		{"A line.\n\nNext para.", true, []string{"A line.\n\n", "Next para."}},
		{"   ", false, nil},
		{"Ünï. Ö. Çé!", false, []string{"Ünï.", "Ö. Çé!"}}, // Ö. is an initial
	}
	for _, c := range cases {
		if got := SplitSentences(c.in, c.keep); !slices.Equal(got, c.want) {
			t.Errorf("SplitSentences(%q, %v) = %q, want %q", c.in, c.keep, got, c.want)
		}
	}
}

func TestProgressBarOnTerminal(t *testing.T) {
	dir := t.TempDir()
	input := filepath.Join(dir, "in.jsonl")
	if err := os.WriteFile(input, []byte("{\"text\": \"ab\"}\n{\"text\": \"cd\"}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var prog bytes.Buffer
	clock := time.Unix(0, 0)
	now := func() time.Time { clock = clock.Add(time.Second); return clock }
	if _, err := Run(context.Background(), Config{Input: input, OutputPrefix: filepath.Join(dir, "o"), Tokenizer: byteTokenizer{},
		Progress: &prog, ProgressTerminal: true, Now: now}); err != nil {
		t.Fatal(err)
	}
	out := prog.String()
	if !strings.HasPrefix(out, "\r[") || !strings.Contains(out, "100% Processed 2 documents") || !strings.HasSuffix(out, "\n") {
		t.Errorf("terminal progress %q", out)
	}
	if bar(0, 0) != "" || bar(5, 10) != "[###############---------------]  50% " {
		t.Errorf("bar = %q, %q", bar(0, 0), bar(5, 10))
	}
}
