package preprocess

import (
	"bufio"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/gotron/gotron/tokenizer"
)

// Config configures Run, with tools/preprocess_data.py's flag names.
type Config struct {
	// Input is --input: a JSONL file, or a glob of them (sorted; Megatron's
	// glob order is the file system's). Files ending in .gz are gunzipped.
	Input string
	// JSONKeys is --json-keys; nil means ["text"].
	JSONKeys []string
	// SplitSentences is --split-sentences (see SplitSentences for how the
	// splitter differs from NLTK punkt); KeepNewlines is --keep-newlines.
	SplitSentences, KeepNewlines bool
	// AppendEOD is --append-eod: the tokenizer's EOD id ends every non-empty
	// document.
	AppendEOD bool
	// OutputPrefix is --output-prefix; outputs are
	// <prefix>_<key>_document.{bin,idx} (or _sentence).
	OutputPrefix string
	// Workers is --workers, tokenizing goroutines; 0 means 1.
	Workers int
	// Partitions is --partitions; 0 means 1. With P > 1, line i goes to
	// partition i mod P (or contiguous blocks of ceil(lines/P) with
	// KeepSequentialSamples, --keep-sequential-samples) and the output holds
	// partition 0's documents, then partition 1's, ... as Megatron's merge.
	Partitions            int
	KeepSequentialSamples bool
	// SkipBadLines counts and skips lines that are not a JSON object with
	// string (or list of strings) values for every key, instead of failing.
	SkipBadLines bool
	// ReplaceInvalidUTF8 (--replace-invalid-utf8) replaces each invalid
	// UTF-8 byte of the input with U+FFFD. The zero value reports such a
	// line as a LineError (Megatron's Python fails to decode the file).
	ReplaceInvalidUTF8 bool
	// Tokenizer encodes the text (tokenizer.Tokenize semantics). Required.
	Tokenizer tokenizer.Tokenizer
	// Progress receives progress lines; nil means none. With
	// ProgressTerminal, one line is redrawn in place; otherwise a line is
	// printed every LogInterval documents (0 means 1000, Megatron's default).
	Progress         io.Writer
	ProgressTerminal bool
	LogInterval      int
	// Now is the clock for progress rates; nil means time.Now.
	Now func() time.Time
}

// Stats summarises a run.
type Stats struct {
	// Documents written (one per JSON line and key set); Bytes of input
	// read; BadLines skipped with SkipBadLines.
	Documents, Bytes, BadLines int64
	// Tokens written per key.
	Tokens map[string]int64
	// Outputs are the written path prefixes, one per key.
	Outputs []string
	// RemovedTemps are temporary files of killed earlier runs that this
	// run removed before starting.
	RemovedTemps []string
}

// LineError reports an input line that could not be used.
type LineError struct {
	File string
	Line int64 // 1-based
	Err  error
}

func (e *LineError) Error() string {
	return fmt.Sprintf("preprocess: %s:%d: %v (use --skip-bad-lines to skip such lines)", e.File, e.Line, e.Err)
}

func (e *LineError) Unwrap() error { return e.Err }

// doc is one encoded input line: per key, the token ids and sequence lengths.
type doc struct {
	ids  [][]int32
	lens [][]int
	bad  error
}

// batch is a run of consecutive input lines, the unit of work.
type batch struct {
	seq   int64
	file  string
	first int64 // line number of lines[0]
	lines [][]byte
	docs  []doc
	bytes int64
}

const batchLines = 64

func (c *Config) validate() error {
	switch {
	case c.Input == "":
		return errors.New("preprocess: --input is required")
	case c.OutputPrefix == "":
		return errors.New("preprocess: --output-prefix is required")
	case c.Tokenizer == nil:
		return errors.New("preprocess: a tokenizer is required (--tokenizer-type ...)")
	case c.Workers < 0:
		return fmt.Errorf("preprocess: --workers must be ≥ 1, got %d", c.Workers)
	case c.Partitions < 0:
		return fmt.Errorf("preprocess: --partitions must be ≥ 1, got %d", c.Partitions)
	}
	for _, k := range c.JSONKeys {
		if k == "" {
			return errors.New("preprocess: --json-keys: empty key")
		}
	}
	return nil
}

// Run tokenizes the input JSONL into Megatron .bin/.idx files: Megatron's
// tools/preprocess_data.py, with Workers goroutines tokenizing in parallel
// and documents written in input order.
func Run(ctx context.Context, cfg Config) (Stats, error) {
	if err := cfg.validate(); err != nil {
		return Stats{}, err
	}
	if cfg.JSONKeys == nil {
		cfg.JSONKeys = []string{"text"}
	}
	cfg.Workers, cfg.Partitions = max(cfg.Workers, 1), max(cfg.Partitions, 1)
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.LogInterval <= 0 {
		cfg.LogInterval = 1000
	}
	files, err := inputFiles(cfg.Input)
	if err != nil {
		return Stats{}, err
	}
	assign, err := partitioner(files, cfg)
	if err != nil {
		return Stats{}, err
	}
	stale, err := removeStaleTemps(cfg.OutputPrefix)
	if err != nil {
		return Stats{RemovedTemps: stale}, err
	}
	out, err := newOutputs(cfg)
	if err != nil {
		return Stats{RemovedTemps: stale}, err
	}
	st, err := pipeline(ctx, cfg, files, assign, out)
	st.RemovedTemps = stale
	if err != nil {
		out.abort()
		return st, err
	}
	st.Outputs, err = out.finish()
	return st, err
}

// inputFiles expands --input: a file, or a glob matching at least one.
func inputFiles(input string) ([]string, error) {
	if _, err := os.Stat(input); err == nil {
		return []string{input}, nil
	}
	m, err := filepath.Glob(input)
	if err != nil {
		return nil, fmt.Errorf("preprocess: --input %q: %w", input, err)
	}
	if len(m) == 0 {
		return nil, fmt.Errorf("preprocess: --input %q: no such file", input)
	}
	sort.Strings(m)
	return m, nil
}

// partitioner returns the partition of global line i.
func partitioner(files []string, cfg Config) (func(line int64) int, error) {
	p := int64(cfg.Partitions)
	if p == 1 {
		return func(int64) int { return 0 }, nil
	}
	if !cfg.KeepSequentialSamples {
		return func(i int64) int { return int(i % p) }, nil
	}
	var total int64
	for _, f := range files {
		n, err := countLines(f)
		if err != nil {
			return nil, err
		}
		total += n
	}
	size := int64(math.Ceil(float64(total) / float64(p)))
	if size == 0 {
		size = 1
	}
	return func(i int64) int { return int(min(i/size, p-1)) }, nil
}

func openInput(path string) (io.ReadCloser, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("preprocess: --input: %w", err)
	}
	if !strings.HasSuffix(path, ".gz") {
		return f, nil
	}
	z, err := gzip.NewReader(f)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("preprocess: --input %s: %w", path, err)
	}
	return struct {
		io.Reader
		io.Closer
	}{z, f}, nil
}

// countLines counts lines as Python's file iteration does: every '\n', plus
// a last line without one.
func countLines(path string) (int64, error) {
	r, err := openInput(path)
	if err != nil {
		return 0, err
	}
	defer r.Close()
	buf := make([]byte, 1<<20)
	var n int64
	last := byte('\n')
	for {
		k, err := r.Read(buf)
		if k > 0 {
			for _, c := range buf[:k] {
				if c == '\n' {
					n++
				}
			}
			last = buf[k-1]
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return 0, fmt.Errorf("preprocess: read %s: %w", path, err)
		}
	}
	if last != '\n' {
		n++
	}
	return n, nil
}

// pipeline reads, encodes (Workers goroutines) and writes in order.
func pipeline(ctx context.Context, cfg Config, files []string, assign func(int64) int, out *outputs) (Stats, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st := Stats{Tokens: map[string]int64{}}
	todo := make(chan *batch, 2*cfg.Workers)
	done := make(chan *batch, 2*cfg.Workers)
	// inflight bounds the batches between reader and writer, so a slow
	// writer cannot make memory grow without bound.
	inflight := make(chan struct{}, 8*cfg.Workers)
	var readErr error
	go func() {
		defer close(todo)
		readErr = readBatches(ctx, files, todo, inflight)
	}()
	var wg sync.WaitGroup
	for range cfg.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for b := range todo {
				encodeBatch(b, cfg)
				select {
				case done <- b:
				case <-ctx.Done():
					return
				}
			}
		}()
	}
	go func() { wg.Wait(); close(done) }()

	prog := newProgress(cfg, inputBytes(files))
	pending := map[int64]*batch{}
	var next, line int64
	var err error
	for b := range done {
		if err != nil {
			<-inflight
			continue // drain
		}
		pending[b.seq] = b
		for pb, ok := pending[next]; ok; pb, ok = pending[next] {
			delete(pending, next)
			next++
			<-inflight
			if err = writeBatch(pb, cfg, out, assign, &line, &st); err != nil {
				cancel()
				break
			}
			prog.update(st.Documents, st.Bytes, false)
		}
	}
	if err == nil {
		err = readErr
	}
	if err == nil {
		err = ctx.Err()
	}
	prog.update(st.Documents, st.Bytes, true)
	return st, err
}

// inputBytes is the total size of the input files, or 0 when unknown (a
// compressed or unreadable file).
func inputBytes(files []string) int64 {
	var total int64
	for _, f := range files {
		st, err := os.Stat(f)
		if err != nil || strings.HasSuffix(f, ".gz") {
			return 0
		}
		total += st.Size()
	}
	return total
}

// readBatches splits the input files into batches of lines.
func readBatches(ctx context.Context, files []string, todo chan<- *batch, inflight chan struct{}) error {
	var seq int64
	for _, f := range files {
		r, err := openInput(f)
		if err != nil {
			return err
		}
		br := bufio.NewReaderSize(r, 1<<20)
		b := &batch{seq: seq, file: f, first: 1}
		lineNo := int64(0)
		send := func() bool {
			select {
			case inflight <- struct{}{}:
			case <-ctx.Done():
				return false
			}
			select {
			case todo <- b:
			case <-ctx.Done():
				return false
			}
			seq++
			b = &batch{seq: seq, file: f, first: lineNo + 1}
			return true
		}
		for {
			line, err := br.ReadBytes('\n')
			if len(line) > 0 {
				lineNo++
				b.bytes += int64(len(line))
				line = []byte(strings.TrimRight(string(line), "\r\n"))
				b.lines = append(b.lines, line)
				if len(b.lines) == batchLines && !send() {
					r.Close()
					return ctx.Err()
				}
			}
			if err == io.EOF {
				break
			}
			if err != nil {
				r.Close()
				return fmt.Errorf("preprocess: read %s: %w", f, err)
			}
		}
		r.Close()
		if len(b.lines) > 0 && !send() {
			return ctx.Err()
		}
	}
	return nil
}

// encodeBatch parses and tokenizes every line of b (Encoder.encode).
func encodeBatch(b *batch, cfg Config) {
	b.docs = make([]doc, len(b.lines))
	for i, line := range b.lines {
		b.docs[i] = encodeLine(line, cfg)
	}
	b.lines = nil
}

func encodeLine(line []byte, cfg Config) doc {
	if !cfg.ReplaceInvalidUTF8 && !utf8.Valid(line) {
		at := invalidUTF8At(line)
		return doc{bad: fmt.Errorf("invalid UTF-8 byte 0x%02x at column %d (--replace-invalid-utf8 replaces such bytes with U+FFFD)", line[at], at+1)}
	}
	// One decoding pass over the whole line, like Python's json.loads.
	// encoding/json replaces invalid UTF-8 with U+FFFD.
	var obj map[string]any
	if err := json.Unmarshal(line, &obj); err != nil || obj == nil {
		if err == nil {
			err = errors.New("null is not an object")
		}
		return doc{bad: fmt.Errorf("invalid JSON object: %v", err)}
	}
	d := doc{ids: make([][]int32, len(cfg.JSONKeys)), lens: make([][]int, len(cfg.JSONKeys))}
	for k, key := range cfg.JSONKeys {
		v, ok := obj[key]
		if !ok {
			return doc{bad: fmt.Errorf("no key %q (--json-keys)", key)}
		}
		var sentences []string
		switch v := v.(type) {
		case string:
			if cfg.SplitSentences {
				sentences = SplitSentences(v, cfg.KeepNewlines)
			} else {
				sentences = []string{v}
			}
		case []any:
			for _, e := range v {
				s, ok := e.(string)
				if !ok {
					return doc{bad: fmt.Errorf("key %q: want a string or a list of strings", key)}
				}
				sentences = append(sentences, s)
			}
		default:
			return doc{bad: fmt.Errorf("key %q: want a string or a list of strings", key)}
		}
		var ids []int32
		var lens []int
		for _, s := range sentences {
			t := tokenizer.Tokenize(cfg.Tokenizer, s)
			if len(t) == 0 {
				continue // empty sentences are skipped
			}
			for _, v := range t {
				ids = append(ids, int32(v))
			}
			lens = append(lens, len(t))
		}
		if len(ids) > 0 && cfg.AppendEOD {
			ids = append(ids, int32(cfg.Tokenizer.EOD()))
			lens[len(lens)-1]++
		}
		d.ids[k], d.lens[k] = ids, lens
	}
	return d
}

// invalidUTF8At is the offset of the first invalid UTF-8 byte of b, or -1.
func invalidUTF8At(b []byte) int {
	for i := 0; i < len(b); {
		r, n := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && n == 1 {
			return i
		}
		i += n
	}
	return -1
}

// writeBatch appends b's documents to their partitions' builders.
func writeBatch(b *batch, cfg Config, out *outputs, assign func(int64) int, line *int64, st *Stats) error {
	st.Bytes += b.bytes
	for i, d := range b.docs {
		global := *line
		*line++
		if d.bad != nil {
			if cfg.SkipBadLines {
				st.BadLines++
				continue
			}
			return &LineError{File: b.file, Line: b.first + int64(i), Err: d.bad}
		}
		p := assign(global)
		for k := range cfg.JSONKeys {
			if err := out.builders[p][k].AddDocument(d.ids[k], d.lens[k], nil); err != nil {
				return err
			}
			st.Tokens[cfg.JSONKeys[k]] += int64(len(d.ids[k]))
		}
		st.Documents++
	}
	return nil
}
