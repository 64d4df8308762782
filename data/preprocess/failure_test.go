package preprocess

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// readDataset returns the bytes of prefix.bin and prefix.idx.
func readDataset(t *testing.T, prefix string) [2][]byte {
	t.Helper()
	var out [2][]byte
	for i, ext := range []string{".bin", ".idx"} {
		b, err := os.ReadFile(prefix + ext)
		if err != nil {
			t.Fatal(err)
		}
		out[i] = b
	}
	return out
}

// TestFailedRunKeepsExistingDataset: a run that fails on a bad line leaves
// the dataset of an earlier run at the same --output-prefix byte for byte,
// and no temporary files, for one and several partitions and keys.
func TestFailedRunKeepsExistingDataset(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
	}{
		{"one partition", Config{Workers: 2}},
		{"partitions", Config{Workers: 2, Partitions: 2}},
		{"two keys", Config{Workers: 1, JSONKeys: []string{"text", "title"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			good := filepath.Join(dir, "good.jsonl")
			bad := filepath.Join(dir, "bad.jsonl")
			os.WriteFile(good, []byte("{\"text\": \"hello\", \"title\": \"a\"}\n{\"text\": \"world\", \"title\": \"b\"}\n"), 0o644)
			var lines strings.Builder
			for range 200 { // several batches: the bad line comes after output was written
				lines.WriteString("{\"text\": \"other text\", \"title\": \"c\"}\n")
			}
			lines.WriteString("not json\n")
			os.WriteFile(bad, []byte(lines.String()), 0o644)

			cfg := tc.cfg
			cfg.Tokenizer, cfg.OutputPrefix, cfg.Input = byteTokenizer{}, filepath.Join(dir, "out"), good
			st, err := Run(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			want := make([][2][]byte, len(st.Outputs))
			for i, p := range st.Outputs {
				want[i] = readDataset(t, p)
			}
			cfg.Input = bad
			_, err = Run(context.Background(), cfg)
			var le *LineError
			if !errors.As(err, &le) || le.Line != 201 {
				t.Fatalf("err = %v, want a LineError at line 201", err)
			}
			for i, p := range st.Outputs {
				got := readDataset(t, p)
				if !bytes.Equal(got[0], want[i][0]) || !bytes.Equal(got[1], want[i][1]) {
					t.Errorf("%s changed by the failed run", p)
				}
			}
			ents, _ := os.ReadDir(dir)
			for _, e := range ents {
				if strings.Contains(e.Name(), ".tmp") {
					t.Errorf("temporary file %s left behind", e.Name())
				}
			}
		})
	}
}

// TestInvalidUTF8: invalid UTF-8 is a LineError naming file:line and the
// column by default; ReplaceInvalidUTF8 writes U+FFFD instead.
func TestInvalidUTF8(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "in.jsonl")
	os.WriteFile(in, []byte("{\"text\": \"ok\"}\n{\"text\": \"caf\xe9\"}\n"), 0o644)
	cfg := Config{Input: in, OutputPrefix: filepath.Join(dir, "out"), Tokenizer: byteTokenizer{}}
	_, err := Run(context.Background(), cfg)
	if err == nil || !strings.Contains(err.Error(), in+":2: invalid UTF-8 byte 0xe9 at column 14") {
		t.Fatalf("err = %v", err)
	}
	cfg.ReplaceInvalidUTF8 = true
	st, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	got := readDataset(t, st.Outputs[0])
	if !bytes.Contains(got[0], []byte("f\x00\xef\x00\xbf\x00\xbd\x00")) { // uint16 tokens: 'f', then U+FFFD's bytes
		t.Fatalf(".bin lacks the replacement character: %q", got[0])
	}
}
