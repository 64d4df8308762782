package main

import (
	"compress/gzip"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/train"
	"google.golang.org/protobuf/encoding/protowire"
)

// trainCLI runs gotron train with tinyTrain and extra, failing the test on
// a non-zero exit; it returns stdout and stderr.
func trainCLI(t *testing.T, extra ...string) (string, string) {
	t.Helper()
	out, errs, code := runCLI(t, append(append([]string{}, tinyTrain...), extra...)...)
	if code != 0 {
		t.Fatalf("gotron train %s: exit %d: %s", strings.Join(extra, " "), code, errs)
	}
	return out, errs
}

// TestTrainApplyWDToQKLayerNorm: --apply-wd-to-qk-layernorm reaches the
// optimizer (the q/k norm weights of the checkpoint differ from a run
// without it, every other parameter is the same), and without
// --qk-layernorm one line says it has no effect.
func TestTrainApplyWDToQKLayerNorm(t *testing.T) {
	dir := t.TempDir()
	args := []string{"--train-iters", "1", "--qk-layernorm", "--weight-decay", "0.5", "--attention-dropout", "0", "--hidden-dropout", "0", "--eval-iters", "0"}
	trainCLI(t, append(args, "--save", filepath.Join(dir, "plain"))...)
	trainCLI(t, append(args, "--save", filepath.Join(dir, "wd"), "--apply-wd-to-qk-layernorm")...)
	plain, _, err := train.LoadModel(filepath.Join(dir, "plain"))
	if err != nil {
		t.Fatal(err)
	}
	wd, _, err := train.LoadModel(filepath.Join(dir, "wd"))
	if err != nil {
		t.Fatal(err)
	}
	wp := map[string][]float32{}
	for _, p := range wd.Params() {
		wp[p.Name] = p.Float32s()
	}
	decayed := 0
	for _, p := range plain.Params() {
		qkWeight := strings.HasSuffix(p.Name, "q_layernorm.weight") || strings.HasSuffix(p.Name, "k_layernorm.weight")
		a, b := p.Float32s(), wp[p.Name]
		for i := range a {
			if qkWeight && !(b[i] < a[i]) {
				t.Fatalf("%s[%d]: %g with --apply-wd-to-qk-layernorm, %g without: want it decayed (smaller)", p.Name, i, b[i], a[i])
			}
			if !qkWeight && a[i] != b[i] {
				t.Fatalf("%s[%d]: %g with the flag, %g without: only the q/k norms may change", p.Name, i, b[i], a[i])
			}
		}
		if qkWeight {
			decayed++
		}
	}
	if decayed != 4 {
		t.Fatalf("%d q/k norm weights, want 4 (2 layers)", decayed)
	}
	// Megatron's deprecated spelling sets the flag: the same weights.
	trainCLI(t, append(args, "--save", filepath.Join(dir, "cond"), "--no-weight-decay-cond-type", "apply_wd_to_qk_layernorm")...)
	cond, _, err := train.LoadModel(filepath.Join(dir, "cond"))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range cond.Params() {
		for i, v := range p.Float32s() {
			if v != wp[p.Name][i] {
				t.Fatalf("%s[%d]: %g with --no-weight-decay-cond-type apply_wd_to_qk_layernorm, %g with --apply-wd-to-qk-layernorm", p.Name, i, v, wp[p.Name][i])
			}
		}
	}
	_, errs := trainCLI(t, "--train-iters", "1", "--eval-iters", "0", "--apply-wd-to-qk-layernorm")
	if !strings.Contains(errs, "--apply-wd-to-qk-layernorm: no effect without --qk-layernorm") {
		t.Fatalf("stderr without --qk-layernorm: %q", errs)
	}
	// multi-latent attention's q_layernorm matches Megatron's name rule:
	// decayed, and the line says so (kv_layernorm does not match)
	mla := []string{"--train-iters", "1", "--eval-iters", "0", "--weight-decay", "0.5", "--attention-dropout", "0", "--hidden-dropout", "0",
		"--multi-latent-attention", "--q-lora-rank", "8", "--kv-lora-rank", "8", "--qk-head-dim", "4", "--qk-pos-emb-head-dim", "4", "--v-head-dim", "4", "--qk-layernorm"}
	trainCLI(t, append(mla, "--save", filepath.Join(dir, "mla"))...)
	_, errs = trainCLI(t, append(mla, "--save", filepath.Join(dir, "mla-wd"), "--apply-wd-to-qk-layernorm")...)
	if !strings.Contains(errs, "--apply-wd-to-qk-layernorm: decays multi-latent attention's q_layernorm") {
		t.Fatalf("stderr with MLA: %q", errs)
	}
	plain, _, err = train.LoadModel(filepath.Join(dir, "mla"))
	if err != nil {
		t.Fatal(err)
	}
	wd, _, err = train.LoadModel(filepath.Join(dir, "mla-wd"))
	if err != nil {
		t.Fatal(err)
	}
	for i, p := range plain.Params() {
		changed := !slices.Equal(p.Float32s(), wd.Params()[i].Float32s())
		if want := strings.HasSuffix(p.Name, "self_attention.q_layernorm.weight"); changed != want {
			t.Errorf("MLA %s: changed by --apply-wd-to-qk-layernorm = %v, want %v", p.Name, changed, want)
		}
	}
}

// TestTrainTimersLaunch: Megatron's timers over a real two-process launch
// (data parallelism with the distributed optimizer, collectives over tcp):
// with --timing-log-option all the last rank prints every rank's time of
// each phase, rank 0's gathered from the other process; with minmax each
// line is (min, max) over both, min <= max; params-all-gather (the
// distributed optimizer's) is among them at level 1.
func TestTrainTimersLaunch(t *testing.T) {
	bin, err := buildGotron()
	if err != nil {
		t.Fatal(err)
	}
	launch := func(option string) string {
		args := append([]string{"launch", "--nproc-per-node", "2", "--master-port", freeTCPPort(t), "--"}, tinyTrain...)
		args = append(args, "--train-iters", "2", "--log-interval", "2", "--eval-iters", "0", "--no-progress",
			"--use-distributed-optimizer", "--timing-log-level", "1", "--timing-log-option", option)
		cmd := exec.Command(bin, args...)
		cmd.Env = append(os.Environ(), "GOTRON_NUM_THREADS=1")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("launch with --timing-log-option %s: %v\n%s", option, err, out)
		}
		// launch prefixes each rank's lines with "[rankN]: "; only the
		// last rank prints the log.
		return regexp.MustCompile(`(?m)^\[rank\d+\]: `).ReplaceAllString(string(out), "")
	}
	out := launch("all")
	all := regexp.MustCompile(`times across ranks \(ms\):\n  forward-backward:\n     rank  0: \d+\.\d\d\n     rank  1: \d+\.\d\d\n`)
	if n := len(all.FindAllString(out, -1)); n != 2 { // iterations 1 (the first) and 2
		t.Fatalf("--timing-log-option all: %d blocks with both ranks' forward-backward, want 2:\n%s", n, out)
	}
	if !strings.Contains(out, "  params-all-gather:\n     rank  0: ") {
		t.Fatalf("no params-all-gather of both ranks:\n%s", out)
	}
	out = launch("minmax")
	line := regexp.MustCompile(`(?m)^    ([a-z/-]+) \.*: \((\d+\.\d\d), (\d+\.\d\d)\)$`)
	seen := map[string]bool{}
	for _, m := range line.FindAllStringSubmatch(out, -1) {
		lo, _ := strconv.ParseFloat(m[2], 64)
		hi, _ := strconv.ParseFloat(m[3], 64)
		if lo > hi {
			t.Errorf("%s: min %g > max %g", m[1], lo, hi)
		}
		seen[m[1]] = true
	}
	for _, name := range []string{"model-and-optimizer-setup", "train/valid/test-data-iterators-setup", "forward-backward", "all-grads-sync", "params-all-gather", "optimizer-inner-step", "optimizer"} {
		if !seen[name] {
			t.Errorf("--timing-log-option minmax: no %s line in\n%s", name, out)
		}
	}
	if strings.Contains(out, "batch-generator") {
		t.Errorf("level 1 printed the level-2 batch-generator timer:\n%s", out)
	}
}

// TestTrainSquaredReLU: --squared-relu trains (the checkpoint records the
// activation), gives other losses than the default GELU from the same
// seed, and is refused with --swiglu, naming the flags (--device cuda:
// train.TestSquaredReLURefusedOnCUDA).
func TestTrainSquaredReLU(t *testing.T) {
	dir := t.TempDir()
	ck := filepath.Join(dir, "ck")
	args := []string{"--train-iters", "2", "--eval-iters", "0", "--log-interval", "1"}
	sq, _ := trainCLI(t, append(args, "--squared-relu", "--save", ck)...)
	gelu, _ := trainCLI(t, args...)
	m, ra, err := train.LoadModel(ck)
	if err != nil {
		t.Fatal(err)
	}
	if m.Config.Activation != gpt.SquaredReLU || ra.Model.Activation != gpt.SquaredReLU {
		t.Fatalf("checkpoint's activation %v (args %v), want squared_relu", m.Config.Activation, ra.Model.Activation)
	}
	loss := regexp.MustCompile(`lm loss: (\S+)`)
	a, b := loss.FindAllStringSubmatch(sq, -1), loss.FindAllStringSubmatch(gelu, -1)
	if len(a) != 2 || len(b) != 2 || a[1][1] == b[1][1] {
		t.Fatalf("iteration 2's loss with --squared-relu %v, with GELU %v: want two different losses", a, b)
	}
	for _, c := range []struct {
		extra []string
		want  string
	}{
		{[]string{"--squared-relu", "--swiglu"}, "--squared-relu excludes --swiglu"},
	} {
		_, errs, code := runCLI(t, append(append(append([]string{}, tinyTrain...), args...), c.extra...)...)
		if code == 0 || !strings.Contains(errs, c.want) {
			t.Errorf("%v: exit %d, stderr %q; want %q", c.extra, code, errs, c.want)
		}
	}
}

// TestTrainProfile: --profile --profile-step-start 1 --profile-step-end 3
// writes a Go CPU profile of iterations 2 to 3 into the TensorBoard
// directory (or --cpu-profile's file) and says where in one line; the file
// is runtime/pprof's gzipped profile.proto (its sample types, cpu and
// nanoseconds, read back with protowire). Without a destination, or
// --profile-step-* without --profile, or the PyTorch profiler, the run is
// refused, naming the flag.
func TestTrainProfile(t *testing.T) {
	dir := t.TempDir()
	tb := filepath.Join(dir, "tb")
	_, errs := trainCLI(t, "--train-iters", "4", "--eval-iters", "0", "--profile", "--profile-step-start", "1", "--profile-step-end", "3", "--tensorboard-dir", tb)
	path := filepath.Join(tb, "cpu-profile.pb.gz")
	if want := "--profile: Go CPU profile of iterations 2 to 3 written to " + path + " (go tool pprof " + path + ")"; !strings.Contains(errs, want) {
		t.Fatalf("stderr %q: want %q", errs, want)
	}
	checkPprof(t, path)

	file := filepath.Join(dir, "steps.pprof")
	_, errs = trainCLI(t, "--train-iters", "3", "--eval-iters", "0", "--profile", "--profile-step-start", "0", "--profile-step-end", "5", "--cpu-profile", file)
	if !strings.Contains(errs, "Go CPU profile of iterations 1 to 3 (the run ended before --profile-step-end 5) written to "+file) {
		t.Fatalf("stderr %q", errs)
	}
	checkPprof(t, file)

	for _, c := range []struct {
		extra []string
		want  string
	}{
		{[]string{"--profile"}, "--profile writes a Go CPU profile of iterations 11 to 12: give --cpu-profile FILE or --tensorboard-dir DIR"},
		{[]string{"--profile-step-start", "3"}, "--profile-step-start needs --profile"},
		{[]string{"--profile", "--cpu-profile", file, "--profile-step-start", "3", "--profile-step-end", "3"}, "want 0 <= start < end"},
		{[]string{"--use-pytorch-profiler"}, "--use-pytorch-profiler: needs the PyTorch profiler"},
	} {
		_, errs, code := runCLI(t, append(append(append([]string{}, tinyTrain...), "--train-iters", "2"), c.extra...)...)
		if code == 0 || !strings.Contains(errs, c.want) {
			t.Errorf("%v: exit %d, stderr %q; want %q", c.extra, code, errs, c.want)
		}
	}
}

// checkPprof reads path as runtime/pprof writes a profile: gzip around a
// profile.proto message whose string table (field 6) holds the CPU
// profile's sample types "samples", "count", "cpu" and "nanoseconds", and
// whose duration (field 10) is positive.
func checkPprof(t *testing.T, path string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatalf("%s: not gzip: %v", path, err)
	}
	raw, err := io.ReadAll(zr)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	strs := map[string]bool{}
	var duration uint64
	for b := raw; len(b) > 0; {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			t.Fatalf("%s: bad protobuf tag at byte %d", path, len(raw)-len(b))
		}
		b = b[n:]
		if num == 6 && typ == protowire.BytesType {
			s, m := protowire.ConsumeBytes(b)
			if m < 0 {
				t.Fatalf("%s: bad string", path)
			}
			strs[string(s)] = true
		}
		if num == 10 && typ == protowire.VarintType {
			duration, _ = protowire.ConsumeVarint(b)
		}
		m := protowire.ConsumeFieldValue(num, typ, b)
		if m < 0 {
			t.Fatalf("%s: bad protobuf field %d", path, num)
		}
		b = b[m:]
	}
	for _, s := range []string{"samples", "count", "cpu", "nanoseconds"} {
		if !strs[s] {
			t.Errorf("%s: string table lacks %q (has %d strings)", path, s, len(strs))
		}
	}
	if duration == 0 {
		t.Errorf("%s: duration 0", path)
	}
}

// TestMLALatentNormsFollowQKLayerNorm: multi-latent attention has its
// latents' norms (q_layernorm, kv_layernorm) iff --qk-layernorm, as
// Megatron's layer specs build them; a run resuming a checkpoint that holds
// them without --qk-layernorm is refused naming the flag (dropping them
// would change the model, whatever --dist-ckpt-strictness allows).
func TestMLALatentNormsFollowQKLayerNorm(t *testing.T) {
	dir := t.TempDir()
	mla := []string{"--train-iters", "1", "--eval-iters", "0", "--multi-latent-attention", "--q-lora-rank", "8", "--kv-lora-rank", "8",
		"--qk-head-dim", "4", "--qk-pos-emb-head-dim", "4", "--v-head-dim", "4"}
	trainCLI(t, append(mla, "--save", filepath.Join(dir, "plain"))...)
	trainCLI(t, append(mla, "--save", filepath.Join(dir, "qk"), "--qk-layernorm")...)
	for name, want := range map[string]bool{"plain": false, "qk": true} {
		m, _, err := train.LoadModel(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		norms := 0
		for _, p := range m.Params() {
			if strings.Contains(p.Name, "self_attention.q_layernorm.") || strings.Contains(p.Name, "self_attention.kv_layernorm.") {
				norms++
			}
		}
		if (norms > 0) != want || m.Config.QKLayerNorm != want {
			t.Errorf("%s: %d latent norm tensors, QKLayerNorm %v; want norms %v", name, norms, m.Config.QKLayerNorm, want)
		}
	}
	args := append(append([]string{}, tinyTrain...), append(mla, "--load", filepath.Join(dir, "qk"), "--train-iters", "2")...)
	_, errs, code := runCLI(t, args...)
	if code == 0 || !strings.Contains(errs, "--qk-layernorm: checkpoint true, this run false") {
		t.Fatalf("resuming a checkpoint with latent norms without --qk-layernorm: exit %d, %s", code, errs)
	}
}
