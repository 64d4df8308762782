package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The harness for Megatron-LM's own GPT configs (issue 30): every argument
// list of Megatron's GPT example scripts and GPT functional-test configs
// (testdata/megatron/configs, collected by tools/megatroncompat/
// collect_configs.py), scaled down to a tiny model by scaleDown, runs
// through 'gotron launch --inproc' for 2 iterations on a real .bin/.idx
// dataset, and each gets one of three outcomes:
//
//	runs unchanged   every argument accepted, 2 iterations trained
//	needs FEATURE    an argument asks for a feature gotron does not have
//	fails: REASON    anything else (a bug to fix)
//
// docs/megatron-compat.md holds the table. TestMegatronConfigsTable (every
// go test run) checks its counts and each config's parse-level outcome;
// TestMegatronConfigsRun (GOTRON_MEGATRON_COMPAT=1, minutes) runs them all
// and checks every row; GOTRON_MEGATRON_COMPAT=update rewrites the table.

const compatDoc = "../../docs/megatron-compat.md"

// megatronConfig is one collected argument list.
type megatronConfig struct {
	name, source, mode string
	args               [][]string // each: --name [values...]
}

func loadMegatronConfigs(t *testing.T) []megatronConfig {
	t.Helper()
	files, err := filepath.Glob("testdata/megatron/configs/*.args")
	if err != nil || len(files) == 0 {
		t.Fatalf("no configs in testdata/megatron/configs: %v", err)
	}
	var out []megatronConfig
	header := regexp.MustCompile(`^# (\S+) \(MODE (\w+)\)$`)
	for _, f := range files {
		c := megatronConfig{name: strings.TrimSuffix(filepath.Base(f), ".args")}
		fh, err := os.Open(f)
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(fh)
		for sc.Scan() {
			line := sc.Text()
			if m := header.FindStringSubmatch(line); m != nil {
				c.source, c.mode = m[1], m[2]
				continue
			}
			line = strings.TrimSpace(line)
			if line == "" {
				continue
			}
			// A value with spaces is several values only for an argument
			// Megatron declares with nargs (--data-path 30 a 70 b); else
			// one ("--step-batch-size-schedule '0:16 2.4B:320'").
			name, value, ok := strings.Cut(line, " ")
			switch {
			case !ok:
				c.args = append(c.args, []string{name})
			case megatronArgs()[strings.TrimPrefix(name, "--")].nargs != "":
				c.args = append(c.args, append([]string{name}, strings.Fields(value)...))
			default:
				c.args = append(c.args, []string{name, value})
			}
		}
		fh.Close()
		if c.source == "" {
			t.Fatalf("%s: no '# SOURCE (MODE m)' header", f)
		}
		out = append(out, c)
	}
	return out
}

// compatPaths are the harness's files that stand in for a config's paths.
type compatPaths struct {
	dir, data, vocab, merges string
	prompts                  string // a JSONL prompt file for inference configs
}

// scaleDown returns the config's arguments for a tiny run, and the world
// size to launch. The transformation (documented in docs/megatron-compat.md):
// parallel sizes are kept; the model becomes 1 layer per pipeline stage and
// virtual stage (the embedding and the loss taking one each where the config
// counts them in the pipeline split), 4×TP heads of 8 channels (GQA: 2×TP
// groups), FFN 2×hidden, MoE expert FFNs of the hidden size; 64-token
// sequences, micro-batch 1, global (and evaluation) batch 2 micro-batches
// per pipeline stage and data-parallel rank (rounded up to a multiple of
// the interleaved schedule's micro-batch group; data-parallel size = EP,
// raised to a multiple of the distributed-optimizer instances);
// 2 iterations, at most 1 evaluation batch, a log line each iteration; every
// path points at the harness's GPT-2-tokenized dataset, tokenizer files and
// temporary directories. Every other argument is Megatron's, unchanged.
func scaleDown(c megatronConfig, p compatPaths) ([]string, int) {
	val := func(name string) int {
		for _, a := range c.args {
			if a[0] == "--"+name && len(a) == 2 {
				if n, err := strconv.Atoi(a[1]); err == nil {
					return n
				}
			}
		}
		return 0
	}
	has := func(name string) bool {
		for _, a := range c.args {
			if a[0] == "--"+name {
				return true
			}
		}
		return false
	}
	tp, pp, cp, ep := max(val("tensor-model-parallel-size"), 1), max(val("pipeline-model-parallel-size"), 1), max(val("context-parallel-size"), 1), max(val("expert-model-parallel-size"), 1)
	v := max(val("virtual-pipeline-model-parallel-size"), val("num-virtual-stages-per-pipeline-rank"), 1)
	if has("num-layers-per-virtual-pipeline-stage") {
		v = 2
	}
	dp := ep
	for n := max(val("num-distributed-optimizer-instances"), 1); dp%n != 0; {
		dp += ep // each distributed-optimizer instance gets data-parallel ranks
	}
	world := tp * pp * cp * dp
	heads := 4 * tp
	hidden := 8 * heads
	layers := pp * v
	// The embedding and the loss, where the config counts them as layers
	// of the pipeline split, take one layer's place each.
	for _, name := range []string{"account-for-embedding-in-pipeline-split", "account-for-loss-in-pipeline-split"} {
		if has(name) {
			layers--
		}
	}
	// Two micro-batches per pipeline stage, or a multiple of the
	// interleaved schedule's micro-batch group where the config sets one.
	micro := 2 * pp
	if k := val("microbatch-group-size-per-virtual-pipeline-stage"); k > 0 {
		for micro%k != 0 {
			micro += 2 * pp
		}
	}
	gbs := micro * dp
	set := map[string]string{
		"num-layers": strconv.Itoa(layers), "hidden-size": strconv.Itoa(hidden), "num-attention-heads": strconv.Itoa(heads),
		"num-query-groups": strconv.Itoa(2 * tp), "kv-channels": "8", "ffn-hidden-size": strconv.Itoa(2 * hidden),
		"moe-ffn-hidden-size": strconv.Itoa(hidden), "moe-shared-expert-intermediate-size": strconv.Itoa(hidden),
		"seq-length": "64", "max-position-embeddings": "64", "micro-batch-size": "1", "global-batch-size": strconv.Itoa(gbs),
		"eval-micro-batch-size": "1", "eval-global-batch-size": strconv.Itoa(gbs),
		"train-iters": "2", "train-samples": strconv.Itoa(2 * gbs), "log-interval": "1",
		"num-layers-per-virtual-pipeline-stage": "1", "decoder-first-pipeline-num-layers": strconv.Itoa(v),
		"decoder-last-pipeline-num-layers": strconv.Itoa(v),
		"data-path":                        p.data, "vocab-file": p.vocab, "merge-file": p.merges,
		"save": filepath.Join(p.dir, "ck"), "load": filepath.Join(p.dir, "ck"),
		"data-cache-path": filepath.Join(p.dir, "cache"), "tensorboard-dir": filepath.Join(p.dir, "tb"),
	}
	if val("eval-iters") > 1 {
		set["eval-iters"] = "1"
	}
	// Inference configs: the checkpoint is the harness's (trainInferenceCheckpoint),
	// the prompt file its own; GPT-2's tokenizer files stand in for the
	// configs' TikTokenizer vocabulary (Nemotron's, not available here).
	drop := map[string]bool{}
	if c.mode == "inference" {
		set["prompt-file"], set["output-path"] = p.prompts, filepath.Join(p.dir, "out.json")
		set["tokenizer-type"] = "GPT2BPETokenizer"
		drop["tokenizer-model"], drop["tiktoken-pattern"] = true, true
	}
	var out []string
	if c.mode == "inference" && has("tokenizer-model") {
		out = append(out, "--vocab-file", p.vocab, "--merge-file", p.merges)
	}
	for _, a := range c.args {
		name := strings.TrimPrefix(a[0], "--")
		if drop[name] {
			continue
		}
		if s, ok := set[name]; ok && len(a) > 1 {
			out = append(out, a[0], s)
			continue
		}
		for _, tok := range a {
			if c.mode == "inference" && len(tok) >= 2 && (tok[0] == '"' || tok[0] == '\'') && tok[len(tok)-1] == tok[0] {
				// Megatron's launcher evals the argument list: a
				// YAML value '"the"' reaches the script as the.
				tok = tok[1 : len(tok)-1]
			}
			if strings.Contains(tok, "$") {
				// A value from the CI's environment: Megatron's default
				// where the argument has one (--seed ${REPEAT}), else a
				// path, for which a fresh directory stands in.
				if d := megatronArgs()[name].def; d != "" && d != "None" {
					tok = pythonDefault(d)
				} else {
					tok = filepath.Join(p.dir, "path-"+name)
				}
			}
			out = append(out, tok)
		}
	}
	return out, world
}

// compatOutcome classifies a run's error.
func compatOutcome(c megatronConfig, err string) string {
	switch {
	case err == "":
		return "runs unchanged"
	}
	if _, after, ok := strings.Cut(err, ": needs "); ok {
		return "needs " + firstLine(after)
	}
	return "fails: " + firstLine(err)
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	return strings.TrimPrefix(s, "gotron launch: ")
}

// parseOutcome is the outcome the flags alone decide: a refused argument,
// or "" when gotron train accepts every argument.
func parseOutcome(c megatronConfig, args []string) string {
	if c.mode == "inference" {
		if _, _, _, err := parseInference(&cli{stdout: discard{}, stderr: discard{}}, args); err != nil {
			return compatOutcome(c, "inference: "+err.Error())
		}
		return ""
	}
	if c.mode != "pretraining" && c.mode != "rl" {
		return compatOutcome(c, "")
	}
	fs, f := newTrainFlags()
	if err := parseFlags(fs, args, discard{}, trainSynopsis); err != nil {
		return compatOutcome(c, "train: "+err.Error())
	}
	f.finish()
	given := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { given[fl.Name] = true })
	if err := f.megatronCompat(&cli{stderr: discard{}}, fs, given); err != nil {
		return compatOutcome(c, "train: "+err.Error())
	}
	return ""
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

// compatTable reads the per-config rows of docs/megatron-compat.md.
func compatTable(t *testing.T) map[string]string {
	t.Helper()
	raw, err := os.ReadFile(compatDoc)
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]string{}
	re := regexp.MustCompile("^\\| `([A-Za-z0-9_.-]+)` \\| [^|]+ \\| (.+) \\|$")
	for _, line := range strings.Split(string(raw), "\n") {
		if m := re.FindStringSubmatch(line); m != nil {
			rows[m[1]] = strings.ReplaceAll(m[2], `\|`, "|")
		}
	}
	return rows
}

// TestMegatronConfigsTable: every collected config has a row in
// docs/megatron-compat.md; a config whose flags gotron refuses has the
// refusal as its outcome; one whose flags it accepts says it runs or why it
// fails (the run itself is TestMegatronConfigsRun's); the counts and the
// number of Megatron arguments accepted are the doc's.
func TestMegatronConfigsTable(t *testing.T) {
	rows := compatTable(t)
	configs := loadMegatronConfigs(t)
	if len(rows) != len(configs) {
		t.Errorf("docs/megatron-compat.md has %d config rows, testdata has %d configs", len(rows), len(configs))
	}
	p := compatPaths{dir: "/nonexistent", data: "/nonexistent/d", vocab: "/nonexistent/v", merges: "/nonexistent/m", prompts: "/nonexistent/p.jsonl"}
	for _, c := range configs {
		args, _ := scaleDown(c, p)
		got, row := parseOutcome(c, args), rows[c.name]
		switch {
		case got != "" && got != row:
			t.Errorf("%s: the flags give %q, the doc says %q", c.name, got, row)
		case got == "" && row != "runs unchanged" && !strings.HasPrefix(row, "fails: ") && !strings.HasPrefix(row, "needs "):
			t.Errorf("%s: the flags are accepted, the doc says %q", c.name, row)
		}
	}
	raw, _ := os.ReadFile(compatDoc)
	summary := compatSummary(rows)
	if !strings.Contains(string(raw), summary) {
		t.Errorf("docs/megatron-compat.md lacks the summary of its own rows:\n%s", summary)
	}
	if want := fmt.Sprintf("gotron train accepts %d of Megatron-LM's %d training arguments", acceptedMegatronArgs(), loadMegatronTable().count); !strings.Contains(string(raw), want) {
		t.Errorf("docs/megatron-compat.md lacks %q: a Megatron flag was added or removed; write the new number there (GOTRON_MEGATRON_COMPAT=update go test -run TestMegatronConfigsRun rewrites the whole table)", want)
	}
}

// acceptedMegatronArgs counts Megatron's arguments that gotron train takes
// (with an effect, accepted with a line, or at its default), not those it
// refuses.
func acceptedMegatronArgs() int {
	fs, _ := newTrainFlags()
	seen := map[megatronArg]bool{}
	n := 0
	for name, a := range megatronArgs() {
		f := fs.Lookup(name)
		if f == nil || seen[a] || strings.HasPrefix(f.Usage, "refused") {
			continue
		}
		seen[a] = true
		n++
	}
	return n
}

// compatSummary is the doc's count lines for rows.
func compatSummary(rows map[string]string) string {
	runs, fails := 0, 0
	needs := map[string]int{}
	for _, r := range rows {
		switch {
		case r == "runs unchanged":
			runs++
		case strings.HasPrefix(r, "needs "):
			needs[strings.TrimPrefix(r, "needs ")]++
		default:
			fails++
		}
	}
	total := 0
	for _, n := range needs {
		total += n
	}
	var b strings.Builder
	fmt.Fprintf(&b, "| runs unchanged | %d |\n| needs a feature gotron does not have | %d |\n| fails | %d |\n| all | %d |\n", runs, total, fails, len(rows))
	type kv struct {
		k string
		n int
	}
	var list []kv
	for k, n := range needs {
		list = append(list, kv{k, n})
	}
	sort.Slice(list, func(i, j int) bool { return list[i].n > list[j].n || list[i].n == list[j].n && list[i].k < list[j].k })
	b.WriteString("\n| configs | need |\n| ---: | --- |\n")
	for _, e := range list {
		fmt.Fprintf(&b, "| %d | %s |\n", e.n, strings.ReplaceAll(e.k, "|", `\|`))
	}
	return b.String()
}

// TestMegatronConfigsRun runs every config (GOTRON_MEGATRON_COMPAT=1; with
// =update it rewrites docs/megatron-compat.md's table instead of checking it).
// GOTRON_MEGATRON_COMPAT_ONLY=REGEXP runs (and rewrites) only the configs
// whose names match; the other rows stay as the doc has them.
func TestMegatronConfigsRun(t *testing.T) {
	mode := os.Getenv("GOTRON_MEGATRON_COMPAT")
	if mode == "" {
		t.Skip("set GOTRON_MEGATRON_COMPAT=1 to run Megatron's configs (minutes)")
	}
	dir := t.TempDir()
	data, vocab, merges := gpt2Corpus(t, dir, 3000)
	prompts := compatPrompts(t, dir)
	ckpts := map[string]string{} // inference checkpoints by model shape
	rows := map[string]string{}
	sources := map[string]string{}
	var only *regexp.Regexp
	if o := os.Getenv("GOTRON_MEGATRON_COMPAT_ONLY"); o != "" {
		var err error
		if only, err = regexp.Compile(o); err != nil {
			t.Fatalf("GOTRON_MEGATRON_COMPAT_ONLY: %v", err)
		}
	}
	docRows := compatTable(t)
	for _, c := range loadMegatronConfigs(t) {
		sources[c.name] = c.source
		if only != nil && !only.MatchString(c.name) {
			// Not selected: keep the doc's row (update rewrites only the
			// selected configs' rows).
			rows[c.name] = docRows[c.name]
			continue
		}
		p := compatPaths{dir: filepath.Join(dir, c.name), data: data, vocab: vocab, merges: merges, prompts: prompts}
		args, world := scaleDown(c, p)
		if c.mode == "inference" {
			rows[c.name] = runInferenceConfig(t, c, p, args, ckpts, world)
			t.Logf("%s: %s", c.name, rows[c.name])
			continue
		}
		if c.mode != "pretraining" && c.mode != "rl" {
			rows[c.name] = compatOutcome(c, "")
			continue
		}
		if got := parseOutcome(c, args); got != "" {
			rows[c.name] = got
			continue
		}
		if c.mode == "rl" {
			// Every flag accepted: the run would need the config's countdown
			// task file and checkpoint, which this harness does not make.
			rows[c.name] = "fails: needs its env_config.yaml's countdown task file and --load checkpoint (not made by this harness)"
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		launch := append([]string{"launch", "--inproc", "--nproc-per-node", strconv.Itoa(world), "--"}, append([]string{"train"}, args...)...)
		_, errs, code := runCLIContext(ctx, launch...)
		cancel()
		e := ""
		if code != 0 {
			e = lastErrorLine(errs)
		}
		rows[c.name] = compatOutcome(c, e)
		t.Logf("%s (world %d): %s", c.name, world, rows[c.name])
	}
	if mode == "update" {
		writeCompatTable(t, rows, sources)
		return
	}
	for name, got := range rows {
		if docRows[name] != got {
			t.Errorf("%s: runs as %q, the doc says %q", name, got, docRows[name])
		}
	}
}

// lastErrorLine is the error a failed run printed (launch's own summary only
// names the rank): the rank's refusal (": needs ...") if there is one, else
// the last "gotron train:" line that is not a note on an accepted argument
// or a performance warning.
func lastErrorLine(errs string) string {
	lines := strings.Split(strings.TrimSpace(errs), "\n")
	for _, l := range lines {
		if _, after, ok := strings.Cut(l, "gotron train: "); ok && strings.Contains(after, ": needs ") {
			return "train: " + after
		}
	}
	for i := len(lines) - 1; i >= 0; i-- {
		_, after, ok := strings.Cut(lines[i], "gotron train: ")
		if !ok || strings.Contains(after, ": accepted") || strings.Contains(after, ": no effect") ||
			strings.Contains(after, "Megatron's default") || strings.Contains(after, "as Megatron does") ||
			strings.Contains(after, "NCCL moves GPU memory, and this run") || strings.Contains(after, "this CPU has no AVX512_BF16") {
			continue
		}
		return "train: " + after
	}
	return firstLine(lines[len(lines)-1])
}

func runCLIContext(ctx context.Context, args ...string) (string, string, int) {
	var out, errb strings.Builder
	env := &cli{stdout: &out, stderr: &errb, stdin: strings.NewReader(""), getenv: func(string) string { return "" }}
	code := run(ctx, env, args)
	return out.String(), errb.String(), code
}

// writeCompatTable rewrites the generated part of docs/megatron-compat.md.
func writeCompatTable(t *testing.T, rows, sources map[string]string) {
	raw, err := os.ReadFile(compatDoc)
	if err != nil {
		t.Fatal(err)
	}
	const begin, end = "<!-- begin generated table -->\n", "<!-- end generated table -->\n"
	s := string(raw)
	i, j := strings.Index(s, begin), strings.Index(s, end)
	if i < 0 || j < i {
		t.Fatalf("%s: no generated-table markers", compatDoc)
	}
	names := make([]string, 0, len(rows))
	for n := range rows {
		names = append(names, n)
	}
	sort.Strings(names)
	var b strings.Builder
	b.WriteString(begin)
	fmt.Fprintf(&b, "gotron train accepts %d of Megatron-LM's %d training arguments (with their effect, with one line saying\nwhy there is none, or at Megatron's default); the others are refused naming what they need.\n\n",
		acceptedMegatronArgs(), loadMegatronTable().count)
	b.WriteString("| outcome | configs |\n| --- | ---: |\n")
	b.WriteString(compatSummary(rows))
	b.WriteString("\n| config | source | outcome |\n| --- | --- | --- |\n")
	for _, n := range names {
		fmt.Fprintf(&b, "| `%s` | %s | %s |\n", n, sources[n], strings.ReplaceAll(rows[n], "|", `\|`))
	}
	b.WriteString(end)
	s = s[:i] + b.String() + s[j+len(end):]
	if err := os.WriteFile(compatDoc, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

// compatPrompts writes the harness's prompt file for inference configs
// (--prompt-file; Megatron's sharegpt file is not available here).
func compatPrompts(t *testing.T, dir string) string {
	t.Helper()
	var b strings.Builder
	for i := range 40 {
		line, _ := json.Marshal(map[string]any{"text": fmt.Sprintf("Question %d: why is the sky blue on day %d?", i, i*7), "chatgpt_output_token_length": 8})
		b.Write(line)
		b.WriteByte('\n')
	}
	path := filepath.Join(dir, "prompts.jsonl")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// inferenceShapeArgs are the model arguments of an inference config that
// its checkpoint's shape takes (Megatron's --use-checkpoint-args set).
var inferenceShapeArgs = map[string]bool{
	"num-layers": true, "hidden-size": true, "ffn-hidden-size": true, "num-attention-heads": true, "kv-channels": true,
	"num-query-groups": true, "group-query-attention": true, "position-embedding-type": true, "rotary-base": true,
	"rotary-percent": true, "normalization": true, "swiglu": true, "squared-relu": true, "disable-bias-linear": true,
	"untie-embeddings-and-output-weights": true, "init-method-std": true, "qk-layernorm": true, "apply-layernorm-1p": true,
	"num-experts": true, "moe-router-topk": true, "moe-ffn-hidden-size": true, "moe-shared-expert-intermediate-size": true,
	"moe-router-score-function": true, "moe-router-load-balancing-type": true, "moe-aux-loss-coeff": true, "moe-grouped-gemm": true,
	"moe-token-dispatcher-type": true, "moe-z-loss-coeff": true,
}

// runInferenceConfig runs an inference config's scaled-down arguments with
// gotron inference (under gotron launch --inproc on its world's ranks when
// it is tensor-parallel) against a tiny checkpoint of the config's model shape
// (trained once per shape: 1 iteration on the harness's corpus, 512
// positions) and checks the output JSON it writes.
func runInferenceConfig(t *testing.T, c megatronConfig, p compatPaths, args []string, ckpts map[string]string, world int) string {
	if got := parseOutcome(c, args); got != "" {
		return got
	}
	var shape []string
	for i := 0; i < len(args); i++ {
		name := strings.TrimPrefix(args[i], "--")
		if !strings.HasPrefix(args[i], "--") || !inferenceShapeArgs[name] {
			continue
		}
		shape = append(shape, args[i])
		for i+1 < len(args) && !strings.HasPrefix(args[i+1], "--") {
			i++
			shape = append(shape, args[i])
		}
	}
	key := strings.Join(shape, " ")
	ck, ok := ckpts[key]
	if !ok {
		ck = filepath.Join(filepath.Dir(p.dir), fmt.Sprintf("inference-ckpt-%d", len(ckpts)))
		trainArgs := append([]string{"train", "--data-path", p.data, "--vocab-file", p.vocab, "--merge-file", p.merges,
			"--tokenizer-type", "GPT2BPETokenizer", "--seq-length", "64", "--max-position-embeddings", "512",
			"--micro-batch-size", "1", "--global-batch-size", "1", "--train-iters", "1", "--lr", "1e-4", "--eval-iters", "0",
			"--save", ck, "--save-interval", "1", "--log-interval", "1"}, shape...)
		if _, errs, code := runCLIContext(context.Background(), trainArgs...); code != 0 {
			return "fails: training the checkpoint: " + lastErrorLine(errs)
		}
		ckpts[key] = ck
	}
	for i := range args {
		if args[i] == "--load" && i+1 < len(args) {
			args[i+1] = ck
		}
	}
	if err := os.MkdirAll(p.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := append([]string{"inference"}, args...)
	if world > 1 { // tensor-parallel inference: its ranks, as torchrun starts them
		cmd = append([]string{"launch", "--inproc", "--nproc-per-node", strconv.Itoa(world), "--"}, cmd...)
	}
	_, errs, code := runCLIContext(ctx, cmd...)
	if code != 0 {
		lines := strings.Split(strings.TrimSpace(errs), "\n")
		return compatOutcome(c, firstLine(strings.TrimPrefix(lines[len(lines)-1], "gotron ")))
	}
	raw, err := os.ReadFile(filepath.Join(p.dir, "out.json"))
	var doc map[string]json.RawMessage
	if err == nil {
		err = json.Unmarshal(raw, &doc)
	}
	if err != nil || doc["0"] == nil {
		return fmt.Sprintf("fails: no output JSON with request 0 (%v)", err)
	}
	return compatOutcome(c, "")
}
