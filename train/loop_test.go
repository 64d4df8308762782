package train

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/optim"
	"github.com/gotron/gotron/tensor"
)

func tinyConfig(testing.TB) Config {
	sf := optim.DefaultSchedulerFlags()
	sf.LR, sf.MinLR, sf.LRDecayStyle, sf.LRWarmupIters = 3e-3, 3e-4, optim.DecayCosine, 2
	sf.WeightDecay = 0.1
	return Config{
		Model: gpt.Config{NumLayers: 2, HiddenSize: 32, NumAttentionHeads: 4, VocabSize: 64, MaxPositionEmbeddings: 16,
			Activation: gpt.GELUTanh, HiddenDropout: 0.1, AttentionDropout: 0.1},
		SeqLength: 16, MicroBatchSize: 2, GlobalBatchSize: 4, TrainIters: 8, Seed: 1234,
		Schedule: sf, ClipGrad: 1.0, LogInterval: 1, EvalInterval: 4, EvalIters: 1,
	}
}

func runTrainer(t *testing.T, cfg Config) Result {
	t.Helper()
	src := MockSource{SeqLength: cfg.SeqLength, VocabSize: cfg.Model.VocabSize}
	tr, err := New(cfg, src, MockSource{SeqLength: cfg.SeqLength, VocabSize: cfg.Model.VocabSize, Samples: 64})
	if err != nil {
		t.Fatal(err)
	}
	res, err := tr.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// TestResumeIsBitIdentical: 2N iterations straight equal N, save, resume, N
// more — the same losses to the last bit (Megatron's *_resume_* functional
// tests in deterministic mode).
func TestResumeIsBitIdentical(t *testing.T) {
	cfg := tinyConfig(t)
	straight := runTrainer(t, cfg)

	dir := t.TempDir()
	first := cfg
	first.Save, first.ExitInterval = dir, 4
	a := runTrainer(t, first)
	if a.Iteration != 4 || len(a.SavedAt) != 1 {
		t.Fatalf("first half stopped at %d, saved at %v", a.Iteration, a.SavedAt)
	}
	second := cfg
	second.Load = dir
	b := runTrainer(t, second)
	got := append(a.Losses, b.Losses...)
	if len(got) != len(straight.Losses) {
		t.Fatalf("%d losses after resume, %d straight", len(got), len(straight.Losses))
	}
	for i := range got {
		if got[i] != straight.Losses[i] {
			t.Fatalf("iteration %d: loss %v after resume, %v straight (must be bit-identical)", i+1, got[i], straight.Losses[i])
		}
	}
	if b.ValidLoss != straight.ValidLoss {
		t.Fatalf("validation loss after resume %v, straight %v", b.ValidLoss, straight.ValidLoss)
	}
}

func TestLossFalls(t *testing.T) {
	cfg := tinyConfig(t)
	cfg.TrainIters = 40
	cfg.Model.HiddenDropout, cfg.Model.AttentionDropout = 0, 0
	res := runTrainer(t, cfg)
	first, last := res.Losses[0], res.Losses[len(res.Losses)-1]
	if !(last < first-0.5) {
		t.Fatalf("loss went from %.3f to %.3f in 40 iterations; expected a clear fall", first, last)
	}
}

// A NaN weight makes every forward NaN: each iteration must be skipped
// (weights untouched) and the run stopped after MaxSkipsInARow.
func TestNaNIterationsAreSkippedThenDiagnosed(t *testing.T) {
	cfg := tinyConfig(t)
	cfg.MaxSkipsInARow = 3
	src := MockSource{SeqLength: cfg.SeqLength, VocabSize: cfg.Model.VocabSize}
	tr, err := New(cfg, src, nil)
	if err != nil {
		t.Fatal(err)
	}
	tr.Model.Layers[0].FC1.Float32s()[0] = float32(math.NaN())
	before := append([]float32(nil), tr.Model.Layers[1].FC2.Float32s()...)
	_, err = tr.Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), "NaN/Inf") {
		t.Fatalf("want a divergence error, got %v", err)
	}
	if tr.Skipped != 3 || tr.Iteration != 3 {
		t.Fatalf("skipped %d at iteration %d, want 3 and 3", tr.Skipped, tr.Iteration)
	}
	for i, v := range tr.Model.Layers[1].FC2.Float32s() {
		if v != before[i] {
			t.Fatal("a skipped iteration changed the weights")
		}
	}
}

func TestLogLineAndMetrics(t *testing.T) {
	cfg := tinyConfig(t)
	cfg.TrainIters = 2
	cfg.Schedule.LRWarmupIters = 0
	var out bytes.Buffer
	cfg.Out = &out
	cfg.MetricsFile = filepath.Join(t.TempDir(), "m.jsonl")
	runTrainer(t, cfg)
	for _, want := range []string{"iteration        1/       2 | consumed samples:            4 |", "learning rate:", "lm loss:", "grad norm:", "number of skipped iterations:   0", "tokens/s:", "MFU:"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("log lacks %q:\n%s", want, out.String())
		}
	}
	b, err := os.ReadFile(cfg.MetricsFile)
	if err != nil {
		t.Fatal(err)
	}
	// Two iteration records (each with a timestamp; the second carries the
	// evaluation at iteration 2) and the final validation record.
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) != 3 || !strings.Contains(lines[0], `"lm_loss":`) || !strings.Contains(lines[0], `"timestamp":`) ||
		!strings.Contains(lines[2], `"final_valid_loss":`) {
		t.Fatalf("metrics file:\n%s", b)
	}
}

// TestMegatronLogLearningRateAndEvaluation: the logged learning rate is the
// one after the scheduler step (Megatron logs the next iteration's rate);
// evaluation prints Megatron's dashed block, during training ("at iteration
// N") and at the end ("on validation set", "on test set"); the metrics
// record of an evaluated iteration carries that evaluation.
func TestMegatronLogLearningRateAndEvaluation(t *testing.T) {
	cfg := tinyConfig(t)
	cfg.TrainIters, cfg.EvalInterval, cfg.EvalIters = 4, 2, 1
	cfg.Schedule.LRWarmupIters = 0 // cosine from 3e-3 to 3e-4 over 4 iterations
	var out bytes.Buffer
	cfg.Out = &out
	cfg.MetricsFile = filepath.Join(t.TempDir(), "m.jsonl")
	src := MockSource{SeqLength: cfg.SeqLength, VocabSize: cfg.Model.VocabSize}
	tr, err := New(cfg, src, MockSource{SeqLength: cfg.SeqLength, VocabSize: cfg.Model.VocabSize, Samples: 64})
	if err != nil {
		t.Fatal(err)
	}
	tr.SetTest(MockSource{SeqLength: cfg.SeqLength, VocabSize: cfg.Model.VocabSize, Samples: 32})
	res, err := tr.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	log := out.String()
	// Megatron's cosine: lr(step) = min + (max-min)·0.5·(1+cos(π·step/4)),
	// logged after step s+1: iteration 1 logs lr(1) = 2.6045...E-03.
	for it, lr := range map[int]float64{1: 3e-4 + 2.7e-3*0.5*(1+math.Cos(math.Pi/4)), 2: 3e-4 + 2.7e-3*0.5, 4: 3e-4} {
		want := fmt.Sprintf("iteration %8d/%8d | consumed samples: %12d | ", it, 4, 4*it)
		i := strings.Index(log, want)
		if i < 0 {
			t.Fatalf("no log line for iteration %d:\n%s", it, log)
		}
		if got := fmt.Sprintf("learning rate: %.6E", lr); !strings.Contains(log[i:i+400], got) {
			t.Errorf("iteration %d: want %q in %q", it, got, log[i:i+300])
		}
	}
	for _, want := range []string{
		"\n validation loss at iteration 2 | lm loss value: ",
		"\n validation loss at iteration 4 on validation set | lm loss value: ",
		"\n validation loss at iteration 4 on test set | lm loss value: ",
	} {
		i := strings.Index(log, want)
		if i < 0 {
			t.Fatalf("log lacks %q:\n%s", want, log)
		}
		line := log[i+1 : i+1+strings.Index(log[i+1:], "\n")]
		dashes := strings.Repeat("-", len(line)+1)
		if !strings.Contains(log, dashes+"\n"+line+"\n"+dashes+"\n") {
			t.Errorf("%q is not framed by %d dashes as Megatron prints it:\n%s", line, len(line)+1, log)
		}
	}
	if math.IsNaN(res.TestLoss) {
		t.Error("no test loss in the result")
	}
	if want := fmt.Sprintf("lm loss: %.6E", res.LoggedLoss); res.LoggedLoss != res.Losses[3] || !strings.Contains(log, want) {
		t.Errorf("Result.LoggedLoss %v: want the last log line's %v (%q)", res.LoggedLoss, res.Losses[3], want)
	}
	b, err := os.ReadFile(cfg.MetricsFile)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if !strings.Contains(lines[1], `"iteration":2`) || !strings.Contains(lines[1], `"valid_loss":`) || strings.Contains(lines[0], `"valid_loss"`) {
		t.Fatalf("the record of iteration 2 should carry its evaluation, iteration 1 none:\n%s", b)
	}
}

func TestLoadRejectsMismatchedModel(t *testing.T) {
	cfg := tinyConfig(t)
	cfg.TrainIters, cfg.Save = 1, t.TempDir()
	cfg.Schedule.LRWarmupIters = 0
	runTrainer(t, cfg)
	other := tinyConfig(t)
	other.Model.HiddenSize = 48
	other.Schedule.LRWarmupIters = 0
	other.Load = cfg.Save
	_, err := New(other, MockSource{SeqLength: 16, VocabSize: 64}, nil)
	if err == nil || !strings.Contains(err.Error(), "--hidden-size: checkpoint 32, this run 48") {
		t.Fatalf("want the architecture difference naming the flag, got %v", err)
	}
}

func TestConfigErrorsNameFlags(t *testing.T) {
	cases := map[string]func(*Config){
		"--hidden-size=30 is not divisible by --num-attention-heads=4":    func(c *Config) { c.Model.HiddenSize = 30 },
		"--global-batch-size=5 is not a multiple of --micro-batch-size=2": func(c *Config) { c.GlobalBatchSize = 5 },
		"set --train-iters or --train-samples":                            func(c *Config) { c.TrainIters = 0 },
		"--seq-length=32 exceeds --max-position-embeddings=16":            func(c *Config) { c.SeqLength = 32 },
	}
	for want, mutate := range cases {
		cfg := tinyConfig(t)
		mutate(&cfg)
		_, err := New(cfg, MockSource{SeqLength: 16, VocabSize: 64}, nil)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("want error containing %q, got %v", want, err)
		}
	}
}

func TestLoadWeightsOnlyCheckpoint(t *testing.T) {
	cfg := tinyConfig(t)
	cfg.TrainIters, cfg.Schedule.LRWarmupIters = 2, 0
	tr, err := New(cfg, MockSource{SeqLength: 16, VocabSize: 64}, nil)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := SaveModel(context.Background(), dir, 0, tr.Model, cfg.SeqLength, nil); err != nil {
		t.Fatal(err)
	}
	m, ra, err := LoadModel(dir)
	if err != nil || ra.SeqLength != 16 {
		t.Fatalf("LoadModel: %v (seq %d)", err, ra.SeqLength)
	}
	if m.Layers[1].FC2.Float32s()[3] != tr.Model.Layers[1].FC2.Float32s()[3] {
		t.Fatal("weights differ after SaveModel/LoadModel")
	}
	cfg.Load = dir
	res := runTrainer(t, cfg)
	if res.Iteration != 2 {
		t.Fatalf("resumed run ended at %d", res.Iteration)
	}
}

// TestBF16TracksFP32: --bf16 changes the arithmetic of the matrix products
// (the losses differ from fp32's) but not the run: the loss curve follows
// the fp32 one closely and still falls, and resume stays bit-identical.
func TestBF16TracksFP32(t *testing.T) {
	cfg := tinyConfig(t)
	cfg.TrainIters = 40
	cfg.Model.HiddenDropout, cfg.Model.AttentionDropout = 0, 0
	fp32 := runTrainer(t, cfg)
	cfg.BF16 = true
	bf16 := runTrainer(t, cfg)
	same := 0
	for i, l := range bf16.Losses {
		if l == fp32.Losses[i] {
			same++
		}
		if d := math.Abs(l - fp32.Losses[i]); d > 0.05*math.Abs(fp32.Losses[i]) {
			t.Errorf("iteration %d: bf16 loss %.5f, fp32 %.5f: more than 5%% apart", i+1, l, fp32.Losses[i])
		}
	}
	if same == len(bf16.Losses) {
		t.Fatal("bf16 losses equal fp32's bit for bit: the matmuls were not rounded")
	}
	if first, last := bf16.Losses[0], bf16.Losses[len(bf16.Losses)-1]; !(last < first-0.5) {
		t.Errorf("bf16 loss went from %.3f to %.3f in 40 iterations; expected a clear fall", first, last)
	}

	cfg.TrainIters = 8
	straight := runTrainer(t, cfg)
	dir := t.TempDir()
	first := cfg
	first.Save, first.ExitInterval = dir, 4
	a := runTrainer(t, first)
	second := cfg
	second.Load = dir
	b := runTrainer(t, second)
	for i, l := range append(a.Losses, b.Losses...) {
		if l != straight.Losses[i] {
			t.Fatalf("bf16 iteration %d: loss %v after resume, %v straight (must be bit-identical)", i+1, l, straight.Losses[i])
		}
	}
}

// TestTensorBoardScalars: --tensorboard-dir writes one event file with
// Megatron's scalars (training, timers, throughput, validation, memory);
// with --log-timers-to-tensorboard each --timing-log-level timer gotron
// measures as NAME-time (Megatron's timers.write), not the ones it does
// not have.
func TestTensorBoardScalars(t *testing.T) {
	cfg := tinyConfig(t)
	cfg.TrainIters, cfg.EvalInterval, cfg.TimingLogLevel = 4, 2, 2
	cfg.TensorBoard = TensorBoard{Dir: t.TempDir(), LogTimers: true, LogThroughput: true, LogValidationPPL: true, LogMemory: true}
	runTrainer(t, cfg)
	files, err := filepath.Glob(filepath.Join(cfg.TensorBoard.Dir, "events.out.tfevents.*"))
	if err != nil || len(files) != 1 {
		t.Fatalf("event files %v (%v); want one", files, err)
	}
	b, err := os.ReadFile(files[0])
	if err != nil {
		t.Fatal(err)
	}
	for _, tag := range []string{"lm loss", "lm loss vs samples", "learning-rate", "grad-norm", "batch-size", "loss-scale",
		"iteration-time", "throughput", "lm loss validation", "lm loss validation ppl", "mem-allocated-bytes",
		"forward-backward-time", "all-grads-sync-time", "optimizer-inner-step-time", "optimizer-time", "batch-generator-time",
		"forward-compute-time", "backward-compute-time"} {
		if !bytes.Contains(b, []byte(tag)) {
			t.Errorf("no %q scalar in %s", tag, files[0])
		}
	}
	for _, tag := range []string{"embedding-grads-all-reduce-time", "params-all-gather-time", "forward-recv-time", "evaluate-time"} {
		if bytes.Contains(b, []byte(tag)) {
			t.Errorf("%q scalar in %s: gotron's single-process run has no such phase (or Megatron writes none)", tag, files[0])
		}
	}
}

// TestDecoupledLR: with --decoupled-lr the word embedding (and output
// layer) are scheduled at their own rate; other parameters at --lr.
func TestDecoupledLR(t *testing.T) {
	cfg := tinyConfig(t)
	cfg.TrainIters, cfg.DecoupledLR, cfg.Schedule.LRWarmupIters = 1, 0.5, 0
	src := MockSource{SeqLength: cfg.SeqLength, VocabSize: cfg.Model.VocabSize}
	tr, err := New(cfg, src, nil)
	if err != nil {
		t.Fatal(err)
	}
	tr.stepper.sched.Apply(tr.stepper.opt.Groups())
	found := 0
	for _, g := range tr.stepper.opt.Groups() {
		for _, p := range g.Params {
			switch {
			case p.Name == "embedding.word_embeddings.weight":
				found++
				if g.LR != 0.5 {
					t.Errorf("word embedding scheduled at %v, want --decoupled-lr 0.5", g.LR)
				}
			case g.LR != cfg.Schedule.LR:
				t.Errorf("%s scheduled at %v, want --lr %v", p.Name, g.LR, cfg.Schedule.LR)
			}
		}
	}
	if found != 1 {
		t.Fatalf("word embedding in %d groups", found)
	}
}

// TestRecomputeIsBitIdentical: selective and full (uniform, block)
// recomputation give the same losses and weights as keeping every
// activation, dropout on.
func TestRecomputeIsBitIdentical(t *testing.T) {
	cfg := tinyConfig(t)
	cfg.TrainIters = 3
	ref := runTrainer(t, cfg)
	for _, r := range []gpt.Recompute{{Selective: true}, {Full: true, Method: "uniform", NumLayers: 2},
		{Full: true, Method: "uniform", NumLayers: 1}, {Full: true, Method: "block", NumLayers: 1}} {
		c := cfg
		c.Recompute = r
		got := runTrainer(t, c)
		for i := range ref.Losses {
			if got.Losses[i] != ref.Losses[i] {
				t.Fatalf("%+v: iteration %d loss %v, without recompute %v", r, i+1, got.Losses[i], ref.Losses[i])
			}
		}
	}
	bad := cfg
	bad.Recompute = gpt.Recompute{Full: true, Method: "uniform", NumLayers: 5}
	if _, err := New(bad, MockSource{SeqLength: 16, VocabSize: 64}, nil); err == nil || !strings.Contains(err.Error(), "--recompute-num-layers=5") {
		t.Fatalf("5 recompute layers of 2: %v", err)
	}
}

// TestRecomputeKeepsFewerActivations: after forward, the tape holds fewer
// activation floats with selective recomputation (the attention core's
// saved statistics are dropped; little, since the fused kernel keeps only
// its output and row statistics) and far fewer with full recomputation
// (only each chunk's input and output); full recomputation also records
// one step per chunk instead of every op of its layers.
func TestRecomputeKeepsFewerActivations(t *testing.T) {
	cfg := tinyConfig(t)
	m, err := gpt.New(cfg.Model, tensor.NewRNG(1))
	if err != nil {
		t.Fatal(err)
	}
	bt, err := makeBatch(MockSource{SeqLength: 16, VocabSize: 64}, 0, 2, 16, 64)
	if err != nil {
		t.Fatal(err)
	}
	live := func(r gpt.Recompute) (steps, floats int) {
		m.Recompute = r
		tp := tensor.NewTape()
		m.Loss(tp, m.Forward(tp, bt, tensor.NewRNG(2), true), bt)
		return tp.Len(), tp.LiveFloats()
	}
	noneSteps, none := live(gpt.Recompute{})
	selSteps, sel := live(gpt.Recompute{Selective: true})
	fullSteps, full := live(gpt.Recompute{Full: true, Method: "uniform", NumLayers: 2})
	t.Logf("activation floats held after forward: none %d, selective %d, full %d", none, sel, full)
	if !(full < sel && sel < none) {
		t.Fatalf("activation floats held after forward: none %d, selective %d, full %d; want full < selective < none", none, sel, full)
	}
	if !(fullSteps < selSteps && selSteps <= noneSteps) {
		t.Fatalf("recorded steps: none %d, selective %d, full %d; want full < selective <= none", noneSteps, selSteps, fullSteps)
	}
}

// TestFP16LossScaling: --fp16 with Megatron's dynamic loss scaler. From the
// default initial scale 2^32 the fp16-rounded gradients overflow; those
// iterations are skipped (not NaN iterations), the scale backs off after
// --hysteresis overflows, training proceeds once it fits, grows again after
// --loss-scale-window clean iterations, and the loss falls. The scaler's
// state is checkpointed: resume is bit-identical.
func TestFP16LossScaling(t *testing.T) {
	cfg := tinyConfig(t)
	cfg.TrainIters = 30
	cfg.Model.HiddenDropout, cfg.Model.AttentionDropout = 0, 0
	cfg.FP16 = true
	cfg.LossScale = optim.LossScalerConfig{Window: 4, Hysteresis: 2}
	res := runTrainer(t, cfg)
	t.Logf("loss scales: %v", res.LossScales)
	t.Logf("losses: %.4f", res.Losses)
	if res.LossScales[0] != 1<<32 || res.LossScales[1] != 1<<31 {
		t.Errorf("scales after iterations 1, 2: %v, %v; want 2^32 (hysteresis 2) then 2^31", res.LossScales[0], res.LossScales[1])
	}
	low, lowAt := math.Inf(1), 0
	for i, s := range res.LossScales {
		if s < low {
			low, lowAt = s, i
		}
	}
	grew := false
	for _, s := range res.LossScales[lowAt:] {
		grew = grew || s > low
	}
	if !grew {
		t.Errorf("the loss scale never grew back after falling to %v at iteration %d", low, lowAt+1)
	}
	if res.Skipped < 2 || res.Skipped > 20 {
		t.Errorf("%d skipped iterations; want the overflows of the first iterations (at least 2) and fewer than 20", res.Skipped)
	}
	// About half the iterations are skipped while the scale settles.
	if first, last := res.Losses[0], res.Losses[len(res.Losses)-1]; !(last < first-0.15) {
		t.Errorf("fp16 loss went from %.3f to %.3f in 30 iterations; expected a fall", first, last)
	}

	// A constant scale (--loss-scale) never changes and, small enough, never
	// skips; the fp16 run tracks the fp32 one.
	cfg.TrainIters = 10
	cfg.LossScale = optim.LossScalerConfig{Constant: 1024}
	constant := runTrainer(t, cfg)
	cfg.FP16 = false
	fp32 := runTrainer(t, cfg)
	for i, l := range constant.Losses {
		if constant.LossScales[i] != 1024 {
			t.Fatalf("iteration %d: constant loss scale is %v", i+1, constant.LossScales[i])
		}
		if d := math.Abs(l - fp32.Losses[i]); d > 0.05*math.Abs(fp32.Losses[i]) || (i > 0 && l == fp32.Losses[i]) {
			t.Errorf("iteration %d: fp16 loss %.6f, fp32 %.6f: want within 5%% and not equal", i+1, l, fp32.Losses[i])
		}
	}
	if constant.Skipped != 0 {
		t.Errorf("constant scale 1024: %d skipped iterations", constant.Skipped)
	}

	cfg.FP16 = true
	cfg.LossScale = optim.LossScalerConfig{Window: 4, Hysteresis: 2}
	cfg.TrainIters = 20
	straight := runTrainer(t, cfg)
	dir := t.TempDir()
	first := cfg
	first.Save, first.ExitInterval = dir, 13
	a := runTrainer(t, first)
	second := cfg
	second.Load = dir
	b := runTrainer(t, second)
	losses, scales := append(a.Losses, b.Losses...), append(a.LossScales, b.LossScales...)
	for i, l := range losses {
		if l != straight.Losses[i] || scales[i] != straight.LossScales[i] {
			t.Fatalf("fp16 iteration %d: loss %v scale %v after resume, %v and %v straight (must be bit-identical)",
				i+1, l, scales[i], straight.Losses[i], straight.LossScales[i])
		}
	}
}

// TestSaveDirCheckedAtStart: a --save that cannot be created (a path
// through a regular file: refused even to root) is refused when the trainer
// is built, naming the flag, not at the first checkpoint.
func TestSaveDirCheckedAtStart(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(file, "ck")
	cfg := tinyConfig(t)
	cfg.Save = dir
	_, err := New(cfg, MockSource{SeqLength: cfg.SeqLength, VocabSize: cfg.Model.VocabSize}, nil)
	if err == nil || !strings.Contains(err.Error(), "--save "+dir) {
		t.Errorf("--save %s: err %v; want a refusal naming --save", dir, err)
	}
}
