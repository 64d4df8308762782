package gpt

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gotron/gotron/comm"
	"github.com/gotron/gotron/comm/inproc"
	"github.com/gotron/gotron/comm/tcp"
	"github.com/gotron/gotron/optim"
	"github.com/gotron/gotron/parallel"
	"github.com/gotron/gotron/parallel/pp"
	"github.com/gotron/gotron/parallel/tp"
	"github.com/gotron/gotron/tensor"
)

// Megatron's layer offsets: even, interleaved (rank r holds chunks r,
// r+P, ...), uneven first/last, and uneven with virtual stages.
func TestPipelineSplitLayerRanges(t *testing.T) {
	for _, c := range []struct {
		layers int
		split  PipelineSplit
		want   [][][2]int // [rank][chunk]
	}{
		{4, PipelineSplit{}, [][][2]int{{{0, 4}}}},
		{8, PipelineSplit{PP: 4}, [][][2]int{{{0, 2}}, {{2, 4}}, {{4, 6}}, {{6, 8}}}},
		{8, PipelineSplit{PP: 2, VPP: 2}, [][][2]int{{{0, 2}, {4, 6}}, {{2, 4}, {6, 8}}}},
		{8, PipelineSplit{PP: 2, LayersPerVirtualStage: 1}, [][][2]int{{{0, 1}, {2, 3}, {4, 5}, {6, 7}}, {{1, 2}, {3, 4}, {5, 6}, {7, 8}}}},
		{4, PipelineSplit{PP: 2, FirstLayers: 1, LastLayers: 3}, [][][2]int{{{0, 1}}, {{1, 4}}}},
		{10, PipelineSplit{PP: 4, FirstLayers: 1, LastLayers: 3}, [][][2]int{{{0, 1}}, {{1, 4}}, {{4, 7}}, {{7, 10}}}},
		{7, PipelineSplit{PP: 3, LastLayers: 1}, [][][2]int{{{0, 3}}, {{3, 6}}, {{6, 7}}}},
		{7, PipelineSplit{PP: 3, FirstLayers: 1}, [][][2]int{{{0, 1}}, {{1, 4}}, {{4, 7}}}},
		// Virtual stage c·P + r; chunks of 1 (first), 2 (middle), 1 (last)
		// layers: a chunk holds L/VPP = 4 layers per round of the ring.
		{8, PipelineSplit{PP: 3, VPP: 2, FirstLayers: 2, LastLayers: 2}, [][][2]int{{{0, 1}, {4, 5}}, {{1, 3}, {5, 7}}, {{3, 4}, {7, 8}}}},
	} {
		for r, want := range c.want {
			got, err := c.split.LayerRanges(c.layers, r)
			if err != nil || !slices.Equal(got, want) {
				t.Errorf("%d layers %+v rank %d: %v %v, want %v", c.layers, c.split, r, got, err, want)
			}
		}
	}
}

// What Megatron refuses is refused before any model is built, naming the
// flags.
func TestPipelineSplitRefuses(t *testing.T) {
	for _, c := range []struct {
		layers int
		split  PipelineSplit
		want   string
	}{
		{6, PipelineSplit{PP: 4}, "--num-layers=6 is not divisible by --pipeline-model-parallel-size=4"},
		{8, PipelineSplit{PP: 2, VPP: 3}, "4 layers per pipeline rank (--num-layers=8 / --pipeline-model-parallel-size=2) are not divisible by 3 virtual stages per rank (--num-virtual-stages-per-pipeline-rank)"},
		{4, PipelineSplit{VPP: 2}, "2 virtual stages per pipeline rank need --pipeline-model-parallel-size > 1"},
		{8, PipelineSplit{PP: 2, LayersPerVirtualStage: 3}, "not divisible by --num-layers-per-virtual-pipeline-stage=3"},
		{8, PipelineSplit{PP: 2, VPP: 2, LayersPerVirtualStage: 2}, "--num-layers-per-virtual-pipeline-stage and --num-virtual-stages-per-pipeline-rank both set"},
		{8, PipelineSplit{PP: 2, FirstLayers: 2, LayersPerVirtualStage: 2}, "use --num-virtual-stages-per-pipeline-rank to set the virtual stages of an uneven split"},
		{4, PipelineSplit{FirstLayers: 1}, "--decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers need --pipeline-model-parallel-size > 1"},
		{4, PipelineSplit{PP: 2, FirstLayers: 1, LastLayers: 2}, "--decoder-first-pipeline-num-layers=1 and --decoder-last-pipeline-num-layers=2 do not add up to --num-layers=4"},
		{4, PipelineSplit{PP: 2, FirstLayers: 5}, "do not add up to --num-layers=4"},
		{8, PipelineSplit{PP: 4, FirstLayers: 1, LastLayers: 2}, "the 5 layers left by --decoder-first-pipeline-num-layers=1 and --decoder-last-pipeline-num-layers=2 are not divisible by the 2 middle pipeline stages"},
		{8, PipelineSplit{PP: 2, VPP: 2, FirstLayers: 3, LastLayers: 5}, "--decoder-first-pipeline-num-layers=3 is not divisible by 2 virtual stages per rank"},
		{9, PipelineSplit{PP: 3, VPP: 2, FirstLayers: 2, LastLayers: 2}, "5 layers per middle pipeline rank are not divisible by 2 virtual stages"},
		{12, PipelineSplit{PP: 4, VPP: 2, FirstLayers: 2, LastLayers: 4}, "3 layers per middle pipeline rank are not divisible by 2 virtual stages"},
		{4, PipelineSplit{PP: -1}, "--pipeline-model-parallel-size=-1"},
		{4, PipelineSplit{PP: 2, LastLayers: -2}, "--decoder-last-pipeline-num-layers=-2"},
	} {
		_, err := c.split.Chunks(c.layers)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%d layers %+v: %v, want an error saying %q", c.layers, c.split, err, c.want)
		}
	}
	m := stageModel(t, gpt2Tiny())
	if _, err := SplitStages(m, PipelineSplit{PP: 2}, 2); err == nil || !strings.Contains(err.Error(), "pipeline rank 2: want 0..1") {
		t.Errorf("rank 2 of 2: %v", err)
	}
}

// gpt2Tiny is GPT-2-style (tied, LayerNorm, GELU, biases, learned
// positions); llamaTiny Llama-style (untied, RMSNorm, SwiGLU, RoPE, GQA).
func gpt2Tiny() Config {
	return Config{NumLayers: 4, HiddenSize: 16, NumAttentionHeads: 2, VocabSize: 40, MaxPositionEmbeddings: 8, Activation: GELUTanh}
}

func llamaTiny() Config {
	return Config{NumLayers: 4, HiddenSize: 16, NumAttentionHeads: 4, NumQueryGroups: 2, FFNHiddenSize: 24, VocabSize: 40,
		MaxPositionEmbeddings: 8, PositionEmbeddingType: RoPE, Normalization: RMSNorm, Activation: SwiGLU,
		DisableBiasLinear: true, UntieEmbeddingsAndOutputWeights: true}
}

func stageModel(t testing.TB, c Config) *Model {
	t.Helper()
	m, err := New(c, tensor.NewRNG(42).Fork("init"))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// batches returns step's m micro-batches of 2 sequences of 8 tokens, with a
// loss mask on the last one. Steps alternate between two sets, so that a
// few iterations lower the loss.
func batches(c Config, step, m int) []Batch {
	rng := tensor.NewRNG(uint64(1000 + step%2))
	var out []Batch
	for i := range m {
		tok, lab := make([]int32, 16), make([]int32, 16)
		r := rng.Fork(fmt.Sprint(i))
		u := make([]float32, 32)
		r.Uniform(u, 0, float32(c.VocabSize))
		for j := range tok {
			tok[j], lab[j] = int32(u[j])%int32(c.VocabSize), int32(u[16+j])%int32(c.VocabSize)
		}
		bt := Batch{Tokens: tensor.FromInt32(tok, 2, 8), Labels: tensor.FromInt32(lab, 2, 8)}
		if i == m-1 {
			mask := make([]float32, 16)
			for j := range mask {
				mask[j] = float32((j + 1) % 3 % 2)
			}
			bt.LossMask = tensor.FromFloat32(mask, 2, 8)
		}
		out = append(out, bt)
	}
	return out
}

// oneProcess is the reference: Forward, Loss, backward of loss/M per
// micro-batch; it returns the mean loss.
func oneProcess(m *Model, bts []Batch) float64 {
	tp := tensor.NewTape()
	var sum float64
	for _, bt := range bts {
		loss := m.Loss(tp, m.Forward(tp, bt, nil, true), bt)
		sum += float64(loss.Float32s()[0])
		if err := tp.Backward(tp.Scale(loss, 1/float32(len(bts)))); err != nil {
			panic(err)
		}
		tp.Reset()
	}
	return sum / float64(len(bts))
}

// stageParams exposes a rank's stage parameters to package optim (and
// gives every parameter a gradient buffer).
func stageParams(stages []*Stage) []*optim.Param {
	var ps []*optim.Param
	for _, s := range stages {
		for _, p := range s.Params() {
			if p.Grad == nil {
				p.Grad = tensor.Zeros(p.Shape()...)
				p.Grad.Name = p.Name + ".grad"
			}
			ps = append(ps, &optim.Param{Name: p.Name, Data: p, Grad: p.Grad,
				NoWeightDecay: optim.DefaultNoWeightDecay(p.Name, p.Shape())})
		}
	}
	return ps
}

func newAdam(t testing.TB, ps []*optim.Param) *optim.AdamW {
	groups := optim.DefaultGroups(ps)
	for i := range groups {
		groups[i].LR, groups[i].WD = 1e-2, 0.01*groups[i].WDMult
	}
	o, err := optim.NewAdamW(groups, optim.AdamWConfig{})
	if err != nil {
		t.Fatal(err)
	}
	return o
}

// pipeRun is the result of a pipelined run: the loss of every step (from
// the last stage) and every rank's parameters at the end, by name (the
// tied embedding appears twice: the first stage's table and the last
// stage's copy).
type pipeRun struct {
	losses []float64
	params map[string][]*tensor.Tensor
}

// runRanks runs fn on n goroutine ranks over inproc or loopback tcp; the
// first error cancels the others' context.
func runRanks(t *testing.T, n int, transport string, fn func(ctx context.Context, world comm.ProcessGroup) error) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	worlds := make([]comm.ProcessGroup, n)
	switch transport {
	case "inproc":
		w, err := inproc.New(inproc.Config{Size: n, Timeout: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		for r := range n {
			worlds[r] = w.Group(r)
		}
	case "tcp":
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		var wg sync.WaitGroup
		errs := make([]error, n)
		for r := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				g, err := tcp.Join(ctx, tcp.Config{Rank: r, WorldSize: n, MasterPort: port, Timeout: time.Minute})
				worlds[r], errs[r] = g, err
			}()
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
		defer func() {
			for _, g := range worlds {
				g.(*tcp.Group).Close()
			}
		}()
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if errs[r] = fn(ctx, worlds[r]); errs[r] != nil {
				errs[r] = fmt.Errorf("rank %d: %w", r, errs[r])
				cancel()
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// pipeline trains c for steps steps (M micro-batches each; AdamW when
// steps > 1, gradients only when 1) split by split over real ranks.
func pipeline(t *testing.T, c Config, split PipelineSplit, m, steps int, transport string) pipeRun {
	t.Helper()
	vpp, err := split.Chunks(c.NumLayers)
	if err != nil {
		t.Fatal(err)
	}
	nRanks := max(split.PP, 1)
	run := pipeRun{params: map[string][]*tensor.Tensor{}}
	var mu sync.Mutex
	err = runRanks(t, nRanks, transport, func(ctx context.Context, world comm.ProcessGroup) error {
		lay := parallel.Config{PP: nRanks}
		if vpp > 1 {
			lay.VPP = vpp
		}
		groups, err := parallel.NewGroups(world, lay)
		if err != nil {
			return err
		}
		rank := groups.PP.Rank()
		stages, err := SplitStages(stageModel(t, c), split, rank) // every rank builds the whole model and slices
		if err != nil {
			return err
		}
		runners := make([]pp.Stage, len(stages))
		for i, s := range stages {
			runners[i] = &StageRunner{Stage: s, Training: true}
		}
		e, err := pp.NewExecutor(pp.ExecConfig{Schedule: pp.Config{PP: nRanks, VPP: vpp, Microbatches: m}, Group: groups.PP, Stages: runners})
		if err != nil {
			return err
		}
		ps := stageParams(stages)
		var opt *optim.AdamW
		if steps > 1 {
			opt = newAdam(t, ps)
		}
		for step := range steps {
			for _, p := range ps {
				tensor.Zero(p.Grad)
			}
			bts := batches(c, step, m)
			for _, r := range runners {
				r.(*StageRunner).Batches = bts
			}
			loss, err := e.Step(ctx)
			if err != nil {
				return err
			}
			if err := AllReduceEmbeddingGrads(ctx, groups.Embedding, stages); err != nil {
				return err
			}
			if e.HasLoss() {
				run.losses = append(run.losses, loss)
			}
			if opt != nil {
				for _, s := range stages {
					zeroKeyBiasGrads(s.view())
				}
				opt.Step()
			}
		}
		mu.Lock()
		defer mu.Unlock()
		for _, s := range stages {
			for _, p := range s.Params() {
				run.params[p.Name] = append(run.params[p.Name], p)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return run
}

var pipelineLayouts = []struct {
	name  string
	split PipelineSplit
}{
	{"PP2", PipelineSplit{PP: 2}},
	{"PP4", PipelineSplit{PP: 4}},
	{"PP2xV2", PipelineSplit{PP: 2, VPP: 2}},
	{"PP2-first1-last3", PipelineSplit{PP: 2, FirstLayers: 1, LastLayers: 3}},
	{"PP3-first1-last1", PipelineSplit{PP: 3, FirstLayers: 1, LastLayers: 1}},
}

// One step's loss and every parameter's gradient, gathered by name from
// the stages (the tied embedding after the embedding-group all-reduce, on
// both of its stages), equal the single-process model's over the same
// micro-batches within 1e-5.
func TestPipelineStepMatchesOneProcess(t *testing.T) {
	const m = 4
	for _, model := range []struct {
		name string
		cfg  Config
	}{{"gpt2", gpt2Tiny()}, {"llama", llamaTiny()}} {
		ref := stageModel(t, model.cfg)
		want := oneProcess(ref, batches(model.cfg, 0, m))
		for _, lay := range pipelineLayouts {
			t.Run(model.name+"/"+lay.name, func(t *testing.T) {
				run := pipeline(t, model.cfg, lay.split, m, 1, "inproc")
				if len(run.losses) != 1 || math.Abs(run.losses[0]-want) > 1e-5*math.Abs(want) {
					t.Errorf("loss %v, one process %v", run.losses, want)
				}
				checkParams(t, ref, run, true)
			})
		}
	}
}

// checkParams compares every parameter (grads or values) of a pipelined
// run with the one-process model's, by name.
func checkParams(t *testing.T, ref *Model, run pipeRun, grads bool) {
	t.Helper()
	for _, p := range ref.Params() {
		got := run.params[p.Name]
		copies := 1
		if p == ref.WordEmb && ref.OutputLayer == nil {
			copies = 2 // the first stage's table and the last stage's copy
		}
		if len(got) != copies {
			t.Errorf("%s: held by %d stages, want %d", p.Name, len(got), copies)
			continue
		}
		for i, g := range got {
			what := fmt.Sprintf("%s (copy %d)", p.Name, i)
			if grads {
				closeTo(t, what+" grad", g.Grad.Float32s(), p.Grad.Float32s(), 1e-5)
			} else {
				closeTo(t, what, g.Float32s(), p.Float32s(), 1e-5)
			}
		}
	}
	if n := len(run.params); n != len(ref.Params()) {
		t.Errorf("the stages hold %d parameter names, the model %d", n, len(ref.Params()))
	}
}

// Ten AdamW iterations: the pipelined losses equal one process's within
// 1e-5, and so do the parameters at the end (both copies of the tied
// embedding stay equal). The key rows of the QKV bias gradients are
// cleared in both runs: their true value is 0, and Adam would amplify the
// rounding noise there into lr-sized steps.
func TestPipelineTrainingMatchesOneProcess(t *testing.T) {
	const m, steps = 4, 10
	for _, c := range []struct {
		model, transport string
		cfg              Config
		split            PipelineSplit
	}{
		{"gpt2", "inproc", gpt2Tiny(), PipelineSplit{PP: 2, VPP: 2}},
		{"llama", "inproc", llamaTiny(), PipelineSplit{PP: 4}},
		{"gpt2", "tcp", gpt2Tiny(), PipelineSplit{PP: 2, FirstLayers: 1, LastLayers: 3}},
	} {
		t.Run(fmt.Sprintf("%s/%s/%+v", c.model, c.transport, c.split), func(t *testing.T) {
			ref := stageModel(t, c.cfg)
			ps := stageParams([]*Stage{mustSingleStage(t, ref)})
			opt := newAdam(t, ps)
			var want []float64
			for step := range steps {
				for _, p := range ps {
					tensor.Zero(p.Grad)
				}
				want = append(want, oneProcess(ref, batches(c.cfg, step, m)))
				zeroKeyBiasGrads(ref)
				opt.Step()
			}
			run := pipeline(t, c.cfg, c.split, m, steps, c.transport)
			if len(run.losses) != steps {
				t.Fatalf("%d losses", len(run.losses))
			}
			for i := range want {
				if math.Abs(run.losses[i]-want[i]) > 1e-5*math.Abs(want[i]) {
					t.Errorf("iteration %d: loss %.7f, one process %.7f", i+1, run.losses[i], want[i])
				}
			}
			if want[steps-1] >= want[0] {
				t.Errorf("losses did not fall: %v", want)
			}
			checkParams(t, ref, run, false)
		})
	}
}

// mustSingleStage is the whole model as one stage (PP = 1): its Params
// are the model's.
func mustSingleStage(t *testing.T, m *Model) *Stage {
	t.Helper()
	s, err := SplitStages(m, PipelineSplit{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := len(s[0].Params()), len(m.Params()); got != want {
		t.Fatalf("one stage holds %d parameters, the model %d", got, want)
	}
	return s[0]
}

// Names stay global, the stages of all ranks hold every parameter once
// (the tied copy aside), and only the tied model's last stage has a copy,
// equal to the table, marked for the embedding group.
func TestSplitStagesNamesAndTiedCopy(t *testing.T) {
	m := stageModel(t, gpt2Tiny())
	split := PipelineSplit{PP: 2, VPP: 2}
	seen := map[string]int{}
	for r := range 2 {
		stages, err := SplitStages(m, split, r)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range stages {
			for _, p := range s.Params() {
				seen[p.Name]++
			}
			wantLayer := fmt.Sprintf("decoder.layers.%d.input_layernorm.weight", s.FirstLayer)
			if s.Layers[0].InputNorm.Name != wantLayer {
				t.Errorf("rank %d chunk %d: first layer %s, want %s", r, s.Chunk, s.Layers[0].InputNorm.Name, wantLayer)
			}
			switch {
			case s.IsFirst():
				if s.SharedEmbedding() != m.WordEmb || s.IsEmbeddingCopy(m.WordEmb) {
					t.Error("first stage: the shared embedding is not the table")
				}
			case s.IsLast():
				cp := s.SharedEmbedding()
				if cp == nil || cp == m.WordEmb || cp != s.OutputLayer || !s.IsEmbeddingCopy(cp) || !slices.Equal(cp.Float32s(), m.WordEmb.Float32s()) {
					t.Error("last stage: want its own copy of the word embedding, equal to the table")
				}
			default:
				if s.SharedEmbedding() != nil {
					t.Errorf("rank %d chunk %d: a middle stage shares the embedding", r, s.Chunk)
				}
			}
		}
	}
	for _, p := range m.Params() {
		want := 1
		if p == m.WordEmb {
			want = 2
		}
		if seen[p.Name] != want {
			t.Errorf("%s held %d times, want %d", p.Name, seen[p.Name], want)
		}
	}
	untied := stageModel(t, llamaTiny())
	stages, _ := SplitStages(untied, PipelineSplit{PP: 2}, 1)
	if stages[0].SharedEmbedding() != nil || stages[0].OutputLayer != untied.OutputLayer {
		t.Error("untied model: the last stage must hold output_layer.weight and share nothing")
	}
}

// Pipeline × tensor parallelism (PP=2 × TP=2, with and without sequence
// parallelism, 4 inproc ranks): each rank slices the whole model for its
// TP rank, then keeps its pipeline stage; activations cross stages as
// (b, t/TP, h) shards with SP. The loss, and the gradient of every
// TP-sliced parameter (the tied embedding after the embedding-group
// all-reduce, which runs per TP rank), equal one process's slices.
// Replicated parameters are compared without SP only: with SP their
// gradients are partial until the trainer's sequence-parallel all-reduce.
func TestPipelineWithTensorParallel(t *testing.T) {
	const m = 4
	c := gpt2Tiny()
	ref := stageModel(t, c)
	want := oneProcess(ref, batches(c, 0, m))
	refGrad := map[string]*tensor.Tensor{}
	for _, p := range ref.Params() {
		g := p.Grad.Clone()
		g.Name = p.Name
		refGrad[p.Name] = g
	}
	plan := TPPlan(ref.Config)
	for _, sp := range []bool{false, true} {
		var loss float64
		err := runRanks(t, 4, "inproc", func(ctx context.Context, world comm.ProcessGroup) error {
			groups, err := parallel.NewGroups(world, parallel.Config{TP: 2, PP: 2})
			if err != nil {
				return err
			}
			region := &tp.Region{Group: groups.TP, SequenceParallel: sp}
			sliced, err := Parallelize(stageModel(t, c), region, nil)
			if err != nil {
				return err
			}
			stages, err := SplitStages(sliced, PipelineSplit{PP: 2}, groups.PP.Rank())
			if err != nil {
				return err
			}
			bts := batches(c, 0, m)
			e, err := pp.NewExecutor(pp.ExecConfig{Schedule: pp.Config{PP: 2, Microbatches: m}, Group: groups.PP,
				Stages: []pp.Stage{&StageRunner{Stage: stages[0], Batches: bts, Training: true}}})
			if err != nil {
				return err
			}
			l, err := e.Step(ctx)
			if err != nil {
				return err
			}
			if err := AllReduceEmbeddingGrads(ctx, groups.Embedding, stages); err != nil {
				return err
			}
			if e.HasLoss() && groups.TP.Rank() == 0 {
				loss = l
			}
			for _, p := range stages[0].Params() {
				style := plan(p.Name)
				if sp && style == tp.Replicated {
					continue
				}
				w, err := tp.Shard(refGrad[p.Name], style, groups.TP.Rank(), 2)
				if err != nil {
					return err
				}
				closeTo(t, fmt.Sprintf("SP=%v TP rank %d: %s grad", sp, groups.TP.Rank(), p.Name), p.Grad.Float32s(), w.Float32s(), 1e-5)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if math.Abs(loss-want) > 1e-5*math.Abs(want) {
			t.Errorf("SP=%v: loss %v, one process %v", sp, loss, want)
		}
	}
}

// TestPipelineWithTensorParallelCanceled: a PP=2 × TP=2 step whose context
// is canceled stops with the context's error: the first stage's
// tensor-parallel collectives run under the stage tape's context, which the
// executor sets from Step's, and their failure ends the step naming the
// action and the op.
func TestPipelineWithTensorParallelCanceled(t *testing.T) {
	c := gpt2Tiny()
	var mu sync.Mutex
	errs := map[int]error{}
	err := runRanks(t, 4, "inproc", func(ctx context.Context, world comm.ProcessGroup) error {
		groups, err := parallel.NewGroups(world, parallel.Config{TP: 2, PP: 2})
		if err != nil {
			return err
		}
		region := &tp.Region{Group: groups.TP}
		sliced, err := Parallelize(stageModel(t, c), region, nil)
		if err != nil {
			return err
		}
		stages, err := SplitStages(sliced, PipelineSplit{PP: 2}, groups.PP.Rank())
		if err != nil {
			return err
		}
		e, err := pp.NewExecutor(pp.ExecConfig{Schedule: pp.Config{PP: 2, Microbatches: 2}, Group: groups.PP,
			Stages: []pp.Stage{&StageRunner{Stage: stages[0], Batches: batches(c, 0, 2), Training: true}}})
		if err != nil {
			return err
		}
		canceled, cancel := context.WithCancel(ctx)
		cancel()
		_, err = e.Step(canceled)
		mu.Lock()
		errs[world.Rank()] = err
		mu.Unlock()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for rank, err := range errs {
		if !errors.Is(err, context.Canceled) && !errors.Is(err, comm.ErrPeerLost) {
			t.Errorf("world rank %d: Step returned %v, want the context's error (or a peer's abandonment)", rank, err)
		}
	}
	// World ranks 0 and 1 are the first stage (TP ranks 0 and 1): their
	// first forward's collective fails.
	for rank := range 2 {
		if want := "pp: rank 0: F c0 m0: tp: rank "; errs[rank] == nil || !strings.Contains(errs[rank].Error(), want) {
			t.Errorf("world rank %d: Step returned %v, want %q", rank, errs[rank], want)
		}
	}
}

// TestPipelineRecomputeHoldsOneProcessActivations: a pipeline stage
// recomputes as the whole model does (Megatron's --recompute-num-layers
// counts each stage's layers), so the stages of a PP=2 split hold together
// exactly the activations one process holds, with and without full
// recomputation — and full recomputation holds less. (Stages once ran their
// layers without it: --recompute-granularity full did nothing under PP.)
func TestPipelineRecomputeHoldsOneProcessActivations(t *testing.T) {
	for _, c := range []Config{gpt2Tiny(), llamaTiny()} {
		for _, rc := range []Recompute{{}, {Full: true, Method: "uniform", NumLayers: 1}, {Full: true, Method: "uniform", NumLayers: 2},
			{Selective: true}} {
			m := stageModel(t, c)
			m.Recompute = rc
			bt := batches(c, 0, 1)[0]
			live := func(run func(tp *tensor.Tape)) int {
				tp := tensor.NewTape()
				run(tp)
				return tp.LiveFloats()
			}
			one := live(func(tp *tensor.Tape) { m.Forward(tp, bt, nil, true) })
			stages, err := SplitStages(m, PipelineSplit{PP: 2}, 0)
			if err != nil {
				t.Fatal(err)
			}
			last, err := SplitStages(m, PipelineSplit{PP: 2}, 1)
			if err != nil {
				t.Fatal(err)
			}
			var mid *tensor.Tensor
			pp := live(func(tp *tensor.Tape) { mid = stages[0].Forward(tp, nil, bt, nil, true) })
			in := mid.Clone().SetRequiresGrad(true) // the activation the next stage receives
			pp += live(func(tp *tensor.Tape) { last[0].Forward(tp, in, bt, nil, true) })
			if pp != one {
				t.Errorf("%+v %+v: the PP=2 stages hold %d floats of activations, one process %d", c.Activation, rc, pp, one)
			}
			if rc.Full {
				m.Recompute = Recompute{}
				if all := live(func(tp *tensor.Tape) { m.Forward(tp, bt, nil, true) }); one >= all {
					t.Errorf("%+v %+v: full recomputation holds %d floats, none %d", c.Activation, rc, one, all)
				}
			}
		}
	}
}

// AllReduceEmbeddingGrads (train's reduceEmbeddingGrads for these tests)
// sums the gradients of the tied word embedding's
// two copies, the first stage's table and the last stage's output weight,
// over group: Megatron's embedding group (parallel.Groups.Embedding, the
// first and last pipeline rank; nil on middle ranks). It does nothing for a
// nil or one-rank group or an untied model. Call it on both ranks after
// backward and the data-parallel reduction, before the gradient norm and the
// optimizer step (Megatron's finalize_model_grads order). With the
// distributed optimizer the embedding has a bucket of its own, so each
// data-parallel rank's shard covers the same elements on both stages and
// the sum is right on the shard it owns.
func AllReduceEmbeddingGrads(ctx context.Context, group comm.ProcessGroup, stages []*Stage) error {
	if group == nil || group.Size() == 1 || len(stages) == 0 || stages[0].model.OutputLayer != nil {
		return nil
	}
	var p *tensor.Tensor
	for _, s := range stages {
		if e := s.SharedEmbedding(); e != nil {
			p = e
		}
	}
	switch {
	case p == nil:
		return errors.New("gpt: embedding group: this rank holds neither the first nor the last pipeline stage")
	case p.Grad == nil:
		return fmt.Errorf("gpt: embedding group: %s has no gradient (run backward first)", p.Name)
	}
	if err := group.AllReduce(ctx, comm.Float32s(p.Grad.Float32s()), comm.Sum); err != nil {
		return fmt.Errorf("gpt: all-reduce of the tied word embedding's gradient over the embedding group: %w", err)
	}
	return nil
}
