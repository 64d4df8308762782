// Package docs_test checks the documentation as a user meets it: every
// shell example in README.md and docs/ runs as written and prints what the
// page shows, unless it is in the reviewed list of examples not run (with
// the reason for each); every relative link leads to a file, and heading,
// of the repository; no link leads out of it.
//
// The examples of one page run in order in one fresh directory (a page's
// later commands use what its earlier ones wrote), with `gotron` a binary
// built once from this checkout. A page that needs data it does not make
// itself (a checkpoint to serve) gets a small one first: pageSetups.
package docs_test

import (
	"bufio"
	"bytes"
	"context"
	"debug/elf"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unicode"
)

// notRun lists the shell examples the test does not run, each with the
// reason. An entry matches the commands of its page that start with its
// prefix (whitespace and line continuations normalised to one space); an
// entry that matches nothing fails the test, so the list follows the docs.
var notRun = []struct{ page, prefix, why string }{
	{"README.md", "CGO_ENABLED=0 go install ./cmd/gotron", "installs the binary this test builds once itself (buildGotron)"},
	{"README.md", "go run ./cmd/gotron train", "the quickstart: ~385 CPU-seconds; cmd/gotron's TestQuickstart* tests run its plan small"},
	{"README.md", "go test ./...", "the test suite this test is part of"},
	{"docs/training.md", "go run ./cmd/gotron train", "the quickstart, as in README.md"},
	{"docs/training.md", "gotron train --num-layers 12 --hidden-size 768", "GPT-2 124M for 10,000 iterations on a corpus the page does not build"},
	{"docs/training.md", "gotron train --device cuda --bf16", "needs an NVIDIA GPU (tools/gpu/check.sh runs this model on one)"},
	{"docs/data.md", "python3 - <<'EOF' > go.jsonl", "reads all of GOROOT/src (about 100 MB; tens of seconds of I/O); the test writes the first 50 documents it would write (dataSetup)"},
	{"docs/distributed.md", "gotron launch --nproc-per-node 4 -- train --tensor-model-parallel-size 2 --use-distributed-optimizer --data-path ...", "a shape, not a command: the training flags are elided (...)"},
	{"docs/distributed.md", "gotron launch --inproc --nproc-per-node 4 -- train ...", "the flags are elided (...): the command before it, run here, with ranks as goroutines"},
	{"docs/distributed.md", "srun gotron train", "needs a Slurm cluster"},
	{"docs/distributed.md", "export MASTER_ADDR=$(scontrol show hostnames", "needs a Slurm cluster"},
	{"docs/distributed.md", "srun bash -c 'gotron launch", "needs a Slurm cluster"},
	{"docs/distributed.md", "gotron launch --nnodes 2 --node-rank 0", "two machines, one command on each"},
	{"docs/distributed.md", "gotron bench comm --backend tcp --nproc 4 --ops all_reduce,all_gather --min-bytes 8 --max-bytes 256M", "a benchmark sweep to 256 MiB per rank over 4 processes (GiBs of memory, minutes); cmd/gotron's TestBenchComm* run it small"},
	{"docs/distributed.md", "gotron bench comm --backend tcp --nproc N", "a synopsis: N and [...] are placeholders"},
	{"docs/distributed.md", "gotron bench comm --backend inproc --nproc N", "a synopsis: N is a placeholder"},
	{"docs/moe.md", "gotron bench moe", "the MoE step-time benchmark: three rounds of three training runs, minutes on 2 cores; cmd/gotron's TestBenchMoE runs it small"},
	{"docs/moe.md", "go test ./internal/cpu -run XXX -bench GroupedMoE", "a benchmark: about a minute on 2 cores (go test -bench runs it)"},
	{"docs/serving.md", "gotron bench serve --clients 200", "the load test: 200 clients and 200 alone decodings, over a minute on two cores; cmd/gotron's TestBenchServe runs it with 20 clients"},
	{"docs/serving.md", "gotron bench serve --preset llama-tiny --clients 200", "the load test on the Llama-style preset, as above"},
	{"docs/design/gemm.md", "cd internal/cpu && go generate", "rewrites the repository's assembly (a developer's step, checked by the internal/cpu tests)"},
	{"docs/design/gemm.md", "go test", "package tests and benchmarks, run by go test ./..."},
	{"docs/design/gemm.md", "GOTRON_NUM_THREADS=2 go test", "benchmarks: minutes"},
	{"docs/design/gemm.md", "go build -o gotron ./cmd/gotron && ./gotron bench gemm --threads 2 --reps 5", "the full GEMM benchmark sweep: minutes; cmd/gotron's TestBenchGemm* run it small"},
	{"docs/design/gemm.md", "OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS=2", "PyTorch's side of the benchmark: needs PyTorch and the benchmark scripts kept beside the repository"},
	{"docs/design/gemm.md", "./gotron bench gemm --isa avx2", "a timing (~6 s of one core; AVX2 only); cmd/gotron's TestBenchGemm* run bench gemm small"},
	{"docs/design/gemm.md", "./gotron bench gemm --threads 1 --precision bf16", "a timing (~27 s of one core); cmd/gotron's TestBenchGemmBF16 runs it small"},
}

// looseNumbers are the examples whose shown output holds counts of the
// page's own data: run on the test's smaller data, their numbers may
// differ (the words must not).
var looseNumbers = []struct{ page, prefix string }{
	{"docs/data.md", "gotron preprocess --input go.jsonl"},
	{"docs/data.md", "gotron data inspect"},
}

// pageSetups prepare a page's directory with what its examples use and do
// not make themselves.
var pageSetups = map[string]func(t *testing.T, bin, dir string){
	// README serves, and training.md generates from, the quickstart's
	// checkpoint.
	"README.md":        quickstartCheckpoint,
	"docs/training.md": quickstartCheckpoint,
	"docs/serving.md":  func(t *testing.T, bin, dir string) { tinyCheckpoint(t, bin, filepath.Join(dir, "ckpt")) },
	"docs/data.md":     dataSetup,
}

// externalLinks are the links allowed to leave the repository: none.
// Everything a page needs is in the repository; an outside project is
// named by its module path or by its name, not linked.
var externalLinks = map[string]bool{}

// root is the repository root (this package is docs/).
const root = ".."

// TestDocLinks: relative links resolve to files inside the repository (and
// their #anchors to headings); absolute links fail unless externalLinks
// allows them.
func TestDocLinks(t *testing.T) {
	for _, page := range pages(t) {
		src := readPage(t, page)
		for _, l := range links(src) {
			if err := checkLink(page, l.target); err != nil {
				t.Errorf("%s:%d: link %q: %v", page, l.line, l.target, err)
			}
		}
	}
}

// TestDocExamples runs the pages' shell examples (see the package comment).
func TestDocExamples(t *testing.T) {
	if testing.Short() {
		t.Skip("runs gotron commands for about a minute")
	}
	bin := buildGotron(t)
	used := make([]bool, len(notRun))
	for _, page := range pages(t) {
		cmds := examples(page, readPage(t, page))
		var run []example
		for _, c := range cmds {
			if i := notRunEntry(c); i >= 0 {
				used[i] = true
				t.Logf("%s:%d: not run (%s): %.80s", c.page, c.line, notRun[i].why, oneLine(c.text))
				continue
			}
			run = append(run, c)
		}
		if len(run) == 0 {
			continue
		}
		t.Run(strings.ReplaceAll(page, "/", "_"), func(t *testing.T) { runPage(t, bin, page, run) })
	}
	for i, e := range notRun {
		if !used[i] {
			t.Errorf("notRun entry %s %q matches no example: update the list", e.page, e.prefix)
		}
	}
}

// pages returns README.md and every docs/**/*.md, relative to the root.
func pages(t *testing.T) []string {
	t.Helper()
	out := []string{"README.md"}
	err := filepath.WalkDir(filepath.Join(root, "docs"), func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".md") {
			rel, _ := filepath.Rel(root, p)
			out = append(out, filepath.ToSlash(rel))
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func readPage(t *testing.T, page string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, page))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// block is a fenced code block.
type block struct {
	line    int // of its first content line (1-based)
	endLine int // of its closing fence
	lang    string
	lines   []string
}

var fenceRE = regexp.MustCompile("^\\s{0,3}(```+|~~~+)\\s*([\\w+-]*)")

// closes reports whether line closes a block opened by fence.
func closes(line, fence string) bool {
	l := strings.TrimSpace(line)
	return len(l) >= len(fence) && strings.Trim(l, fence[:1]) == ""
}

// blocks returns src's fenced code blocks.
func blocks(src string) []block {
	var out []block
	var cur *block
	var fence string
	for i, l := range strings.Split(src, "\n") {
		switch {
		case cur != nil && closes(l, fence):
			cur.endLine = i + 1
			out = append(out, *cur)
			cur = nil
		case cur != nil:
			cur.lines = append(cur.lines, l)
		default:
			if m := fenceRE.FindStringSubmatch(l); m != nil {
				cur, fence = &block{line: i + 2, lang: m[2]}, m[1]
			}
		}
	}
	return out
}

// example is one shell command of a page and the output the page shows
// for it (a "# ..." line after it, the lines after a "$ " prompt, or a
// plain block right after its block).
type example struct {
	page, text string
	line       int
	output     []string
}

var heredocRE = regexp.MustCompile(`<<-?\s*'?"?(\w+)`)

// examples returns the commands of src's sh, bash, shell and console blocks.
func examples(page, src string) []example {
	bs := blocks(src)
	var out []example
	for bi, b := range bs {
		switch b.lang {
		case "sh", "bash", "shell", "console":
		default:
			continue
		}
		prompt := false
		for _, l := range b.lines {
			prompt = prompt || strings.HasPrefix(l, "$ ")
		}
		first := len(out)
		for i := 0; i < len(b.lines); i++ {
			l := b.lines[i]
			trimmed := strings.TrimSpace(l)
			switch {
			case trimmed == "":
				continue
			case prompt && !strings.HasPrefix(l, "$ "), !prompt && strings.HasPrefix(trimmed, "#"):
				if len(out) > first { // output of the command before; else a comment
					out[len(out)-1].output = append(out[len(out)-1].output, strings.TrimPrefix(strings.TrimPrefix(trimmed, "#"), " "))
				}
				continue
			}
			ex := example{page: page, line: b.line + i}
			text := strings.TrimPrefix(l, "$ ")
			for strings.HasSuffix(text, "\\") && i+1 < len(b.lines) { // continued
				i++
				text += "\n" + b.lines[i]
			}
			if m := heredocRE.FindStringSubmatch(text); m != nil {
				for i+1 < len(b.lines) {
					i++
					text += "\n" + b.lines[i]
					if strings.TrimSpace(b.lines[i]) == m[1] {
						break
					}
				}
			}
			ex.text = text
			out = append(out, ex)
		}
		// A plain block right after this one is the last command's output.
		if bi+1 < len(bs) && len(out) > first {
			next := bs[bi+1]
			if (next.lang == "" || next.lang == "text") && next.line == b.endLine+2 {
				out[len(out)-1].output = append(out[len(out)-1].output, next.lines...)
			}
		}
	}
	return out
}

var spaceRE = regexp.MustCompile(`\s+`)

// oneLine joins continuation lines and collapses whitespace.
func oneLine(s string) string {
	return strings.TrimSpace(spaceRE.ReplaceAllString(strings.ReplaceAll(s, "\\\n", " "), " "))
}

func notRunEntry(c example) int {
	for i, e := range notRun {
		if e.page == c.page && strings.HasPrefix(oneLine(c.text), e.prefix) {
			return i
		}
	}
	return -1
}

func isLoose(c example) bool {
	for _, e := range looseNumbers {
		if e.page == c.page && strings.HasPrefix(oneLine(c.text), e.prefix) {
			return true
		}
	}
	return false
}

// buildGotron builds ./cmd/gotron into the test's temporary directory, as
// README.md says to: with CGO_ENABLED=0.
func buildGotron(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "gotron")
	cmd := exec.Command("go", "build", "-o", bin, "../cmd/gotron")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("CGO_ENABLED=0 go build ./cmd/gotron: %v\n%s", err, out)
	}
	return bin
}

// TestBinaryLinksOnlyLibc: README.md's claim about the binary. Built with
// CGO_ENABLED=0 it links no shared library but the C library's (purego
// needs dlopen to open the CUDA libraries at run time).
func TestBinaryLinksOnlyLibc(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the claim is about Linux ELF binaries")
	}
	bin := buildGotron(t)
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	libs, err := f.ImportedLibraries()
	if err != nil {
		t.Fatal(err)
	}
	allowed := map[string]bool{"libc.so.6": true, "libdl.so.2": true, "libpthread.so.0": true}
	for _, l := range libs {
		if !allowed[l] {
			t.Errorf("the binary links %s; README.md says it needs only the C library (%v)", l, libs)
		}
	}
	if out, err := exec.Command(bin, "version").CombinedOutput(); err != nil || !strings.HasPrefix(string(out), "gotron ") {
		t.Errorf("gotron version: %v: %s", err, out)
	}
}

// rewrite maps a command as written to what the test runs: `go run
// ./cmd/gotron` and `./gotron` are the built binary (on PATH as gotron);
// localhost:8000 is the port the page's gotron serve got.
func rewrite(cmd string, port int) string {
	cmd = strings.ReplaceAll(cmd, "go run ./cmd/gotron", "gotron")
	cmd = regexp.MustCompile(`(^|[\s;&|(])\./gotron\b`).ReplaceAllString(cmd, "${1}gotron")
	if port != 0 {
		p := strconv.Itoa(port)
		cmd = strings.ReplaceAll(cmd, "localhost:8000", "localhost:"+p)
		cmd = strings.ReplaceAll(cmd, "127.0.0.1:8000", "127.0.0.1:"+p)
	}
	return cmd
}

var serveRE = regexp.MustCompile(`^gotron serve\b`)

// runPage runs a page's examples in order in one directory. `gotron serve`
// runs in the background (on a free port, as if in another terminal) until
// the page is done, then gets SIGTERM and must exit 0.
func runPage(t *testing.T, bin, page string, cmds []example) {
	dir := t.TempDir()
	binDir := filepath.Dir(bin)
	if setup := pageSetups[page]; setup != nil {
		setup(t, bin, dir)
	}
	env := append(os.Environ(), "PATH="+binDir+string(os.PathListSeparator)+os.Getenv("PATH"))
	ctx, cancel := testContext(t)
	t.Cleanup(cancel) // after startServe's cleanup, which stops the server gently
	port := 0
	for _, c := range cmds {
		text := oneLine(c.text)
		if serveRE.MatchString(text) {
			if port != 0 {
				t.Fatalf("%s:%d: a second gotron serve on the page", page, c.line)
			}
			port = startServe(t, ctx, dir, env, c)
			continue
		}
		cmd := exec.CommandContext(ctx, "bash", "-e", "-o", "pipefail", "-c", rewrite(c.text, port))
		cmd.Dir, cmd.Env = dir, env
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
		err := cmd.Run()
		got := out.String()
		switch {
		case err != nil:
			t.Errorf("%s:%d: %s\nfailed: %v\n%s", page, c.line, c.text, err, tail(got))
		case strings.Contains(got, `{"error":`):
			t.Errorf("%s:%d: %s\nanswered an error:\n%s", page, c.line, c.text, tail(got))
		default:
			if missing := unmatched(got, c.output, isLoose(c)); missing != "" {
				t.Errorf("%s:%d: %s\nthe page shows %q, which the output lacks:\n%s", page, c.line, c.text, missing, tail(got))
			}
		}
	}
}

// testContext ends shortly before the test's deadline (go test -timeout),
// so a hung example fails the test with its name instead of a panic.
func testContext(t *testing.T) (context.Context, context.CancelFunc) {
	if d, ok := t.Deadline(); ok {
		return context.WithDeadline(context.Background(), d.Add(-10*time.Second))
	}
	return context.WithCancel(context.Background())
}

// startServe starts a gotron serve example in the background on a free
// port and waits for its "listening on" line; cleanup sends SIGTERM and
// checks that it exits 0.
func startServe(t *testing.T, ctx context.Context, dir string, env []string, c example) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	text := strings.TrimSuffix(strings.TrimSpace(oneLine(c.text)), "&")
	if i := strings.Index(text, " #"); i >= 0 { // a trailing comment
		text = text[:i]
	}
	cmd := exec.CommandContext(ctx, "bash", "-c", "exec "+rewrite(text, 0)+" --port "+strconv.Itoa(port))
	cmd.Dir, cmd.Env = dir, env
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var errb syncBuffer
	cmd.Stderr = &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var log syncBuffer
	listening, eof := make(chan bool, 1), make(chan struct{})
	go func() { // reads stdout to its end: the process has exited
		defer close(eof)
		sc := bufio.NewScanner(stdout)
		said := false
		for sc.Scan() {
			fmt.Fprintln(&log, sc.Text())
			if !said && strings.Contains(sc.Text(), "listening on") {
				said = true
				listening <- true
			}
		}
		if !said {
			listening <- false
		}
	}()
	if !<-listening {
		<-eof
		cmd.Wait()
		t.Fatalf("%s:%d: %s\ndid not start:\n%s%s", c.page, c.line, c.text, log.String(), errb.String())
	}
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		<-eof
		if err := cmd.Wait(); err != nil || !strings.Contains(log.String(), "gotron serve: stopped") {
			t.Errorf("%s:%d: gotron serve after SIGTERM: %v\n%s%s", c.page, c.line, err, log.String(), errb.String())
		}
	})
	return port
}

// syncBuffer is a bytes.Buffer safe for one writer and one reader.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// unmatched returns the first shown output line that the output lacks
// (shown lines must appear in order; "..." or "…" stands for anything;
// whitespace runs compare equal; with loose, so do numbers), or "".
func unmatched(got string, want []string, loose bool) string {
	lines := strings.Split(got, "\n")
	for i := range lines {
		lines[i] = strings.TrimSpace(spaceRE.ReplaceAllString(lines[i], " "))
	}
	at := 0
	for _, w := range want {
		re := linePattern(w, loose)
		if re == nil {
			continue
		}
		for at < len(lines) && !re.MatchString(lines[at]) {
			at++
		}
		if at == len(lines) {
			return w
		}
		at++
	}
	return ""
}

var numberRE = regexp.MustCompile(`[0-9]+(\\\.[0-9]+)?`)

// linePattern is the regular expression a shown output line stands for
// (nil for a blank line).
func linePattern(w string, loose bool) *regexp.Regexp {
	w = strings.TrimSpace(spaceRE.ReplaceAllString(w, " "))
	if w == "" {
		return nil
	}
	w = strings.ReplaceAll(w, "…", "...")
	parts := strings.Split(w, "...")
	for i, p := range parts {
		p = regexp.QuoteMeta(strings.TrimSpace(p))
		if loose {
			p = numberRE.ReplaceAllString(p, `[0-9]+(\.[0-9]+)?`)
		}
		parts[i] = p
	}
	return regexp.MustCompile(`^` + strings.Join(parts, `\s*.*?\s*`) + `$`)
}

// tail is the end of a long output.
func tail(s string) string {
	if len(s) > 3000 {
		return "..." + s[len(s)-3000:]
	}
	return s
}

// tinyCheckpoint trains a 2-layer model with GPT-2's vocabulary for one
// iteration into dir (gotron serve and generate then use the embedded
// GPT-2 tokenizer).
func tinyCheckpoint(t *testing.T, bin, dir string) {
	t.Helper()
	cmd := exec.Command(bin, "train", "--mock-data", "--num-layers", "2", "--hidden-size", "32",
		"--num-attention-heads", "4", "--seq-length", "16", "--max-position-embeddings", "256",
		"--micro-batch-size", "2", "--global-batch-size", "2", "--lr", "1e-3", "--vocab-size", "50257",
		"--train-iters", "1", "--eval-iters", "0", "--save", dir)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("a checkpoint for the page: %v\n%s", err, tail(string(out)))
	}
}

func quickstartCheckpoint(t *testing.T, bin, dir string) {
	tinyCheckpoint(t, bin, filepath.Join(dir, "gotron-quickstart", "checkpoints"))
}

// dataSetup writes go.jsonl as data.md's Python example would, cut to its
// first 50 documents: one {"text": ...} line per .go file of GOROOT/src, in
// walk order.
func dataSetup(t *testing.T, _, dir string) {
	t.Helper()
	goroot, err := exec.Command("go", "env", "GOROOT").Output()
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	n := 0
	src := filepath.Join(strings.TrimSpace(string(goroot)), "src")
	err = filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".go") {
			return err
		}
		text, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		line, _ := json.Marshal(map[string]string{"text": strings.ToValidUTF8(string(text), "\uFFFD")})
		b.Write(append(line, '\n'))
		if n++; n == 50 {
			return io.EOF
		}
		return nil
	})
	if err != nil && err != io.EOF {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "go.jsonl"), b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

// link is a link of a page, outside code.
type link struct {
	target string
	line   int
}

var (
	inlineLinkRE = regexp.MustCompile(`\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)`)
	refDefRE     = regexp.MustCompile(`^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(\s|$)`)
	autoLinkRE   = regexp.MustCompile(`<((?:https?|ftp|mailto):[^>\s]+)>`)
	bareURLRE    = regexp.MustCompile(`(?:^|[\s(])((?:https?://|www\.)[^\s)<>]+)`)
	codeSpanRE   = regexp.MustCompile("``.*?``|`[^`]*`")
)

// links returns the link targets of src outside fenced blocks and code
// spans: inline links and images, reference definitions, autolinks and
// bare URLs (which GitHub links).
func links(src string) []link {
	var out []link
	fence := ""
	for i, l := range strings.Split(src, "\n") {
		switch {
		case fence != "":
			if closes(l, fence) {
				fence = ""
			}
			continue
		case fenceRE.MatchString(l):
			fence = fenceRE.FindStringSubmatch(l)[1]
			continue
		}
		l = codeSpanRE.ReplaceAllString(l, "")
		seen := map[string]bool{} // a URL both linked and bare is one link
		for _, re := range []*regexp.Regexp{inlineLinkRE, refDefRE, autoLinkRE, bareURLRE} {
			for _, m := range re.FindAllStringSubmatch(l, -1) {
				target := m[1]
				if re == bareURLRE { // GitHub leaves trailing punctuation out
					target = strings.TrimRight(target, ".,;:!?")
				}
				if !seen[target] {
					seen[target] = true
					out = append(out, link{target, i + 1})
				}
			}
		}
	}
	return out
}

var schemeRE = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9+.-]*:|^//|^www\.`)

// checkLink checks one target of page.
func checkLink(page, target string) error {
	if schemeRE.MatchString(target) {
		if externalLinks[target] {
			return nil
		}
		return fmt.Errorf("points outside the repository (name the project or module instead, or justify it in externalLinks)")
	}
	path, anchor, _ := strings.Cut(target, "#")
	file := page
	if path != "" {
		if strings.HasPrefix(path, "/") {
			return fmt.Errorf("an absolute path: use one relative to the page")
		}
		file = filepath.ToSlash(filepath.Clean(filepath.Join(filepath.Dir(page), path)))
		if file == ".." || strings.HasPrefix(file, "../") {
			return fmt.Errorf("leaves the repository")
		}
	}
	st, err := os.Stat(filepath.Join(root, file))
	if err != nil {
		return fmt.Errorf("no such file %s", file)
	}
	if anchor == "" {
		return nil
	}
	if st.IsDir() || !strings.HasSuffix(file, ".md") {
		return fmt.Errorf("an anchor into %s, which is not a page", file)
	}
	b, err := os.ReadFile(filepath.Join(root, file))
	if err != nil {
		return err
	}
	for _, a := range anchors(string(b)) {
		if a == anchor {
			return nil
		}
	}
	return fmt.Errorf("%s has no heading #%s", file, anchor)
}

var headingRE = regexp.MustCompile(`^#{1,6}\s+(.*?)\s*#*\s*$`)

// anchors returns the anchors GitHub gives src's headings: lower case,
// spaces as hyphens, everything but letters, digits, hyphens and
// underscores dropped (so `code` is its text), and -1, -2, ... after
// repeats.
func anchors(src string) []string {
	seen := map[string]int{}
	var out []string
	fence := ""
	for _, l := range strings.Split(src, "\n") {
		switch {
		case fence != "":
			if closes(l, fence) {
				fence = ""
			}
			continue
		case fenceRE.MatchString(l):
			fence = fenceRE.FindStringSubmatch(l)[1]
			continue
		}
		m := headingRE.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		var b strings.Builder
		for _, r := range strings.ToLower(m[1]) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.IsMark(r):
				b.WriteRune(r)
			}
		}
		a := b.String()
		if n := seen[a]; n > 0 {
			out = append(out, a+"-"+strconv.Itoa(n))
		} else {
			out = append(out, a)
		}
		seen[a]++
	}
	return out
}

// TestDocParsing: the extraction the two tests rely on, on a made-up page:
// commands (continued, heredocs, "$ " prompts), the output shown for them,
// links outside code, and GitHub's heading anchors.
func TestDocParsing(t *testing.T) {
	page := strings.Join([]string{
		"# Top `code` — here",
		"See [a](other.md#top-code--here), <https://x.example>, `[b](c.md)` and",
		"https://y.example.",
		"```sh",
		"# a comment",
		"gotron a \\",
		"  --b 1   # trailing",
		"# out 1",
		"cat <<'EOF' > f",
		"# inside",
		"EOF",
		"```",
		"```",
		"shown 2",
		"```",
		"```console",
		"$ gotron c",
		"out 3 ...",
		"```",
		"## Top `code` — here",
	}, "\n")
	ex := examples("p.md", page)
	want := []example{
		{page: "p.md", line: 6, text: "gotron a \\\n  --b 1   # trailing", output: []string{"out 1"}},
		{page: "p.md", line: 9, text: "cat <<'EOF' > f\n# inside\nEOF", output: []string{"shown 2"}},
		{page: "p.md", line: 17, text: "gotron c", output: []string{"out 3 ..."}},
	}
	if !reflect.DeepEqual(ex, want) {
		t.Errorf("examples:\n got %+v\nwant %+v", ex, want)
	}
	var targets []string
	for _, l := range links(page) {
		targets = append(targets, l.target)
	}
	if got := strings.Join(targets, " "); got != "other.md#top-code--here https://x.example https://y.example" {
		t.Errorf("links: %s", got)
	}
	if got := strings.Join(anchors(page), " "); got != "top-code--here top-code--here-1" {
		t.Errorf("anchors: %s", got)
	}
	for _, c := range []struct {
		got   string
		want  []string
		loose bool
		miss  string
	}{
		{"a  1\nb 2\nc 3", []string{"a 1", "c 3"}, false, ""},
		{"a 1\nb 2", []string{"b 2", "a 1"}, false, "a 1"},
		{"x: 12 (3.5)", []string{"x: 7 (1.25)"}, true, ""},
		{"x: 12", []string{"x: 7"}, false, "x: 7"},
		{`{"a":1,"b":2}`, []string{`{"a":1,...}`}, false, ""},
		{"histogram:", []string{"histogram: ..."}, false, ""},
	} {
		if miss := unmatched(c.got, c.want, c.loose); miss != c.miss {
			t.Errorf("unmatched(%q, %q, %v) = %q, want %q", c.got, c.want, c.loose, miss, c.miss)
		}
	}
}
