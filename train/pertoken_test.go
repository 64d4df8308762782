package train

import (
	"context"
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/gotron/gotron/comm"
	"github.com/gotron/gotron/comm/inproc"
	"github.com/gotron/gotron/parallel"

	datagpt "github.com/gotron/gotron/data/gpt"
	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/parallel/cp"
	"github.com/gotron/gotron/parallel/ddp"
	"github.com/gotron/gotron/tensor"
)

// perTokenReference is the float64 reference of one training step's loss
// and gradients on the stepper's current parameters, computed from the
// model's logits without the trainer's loss code: each token's
// cross-entropy log Σ exp(z) − z_label in float64, weighted by the loss
// mask. With perToken the objective is Σ_mb Σ_t mask·ce / N over the
// global batch's N unmasked tokens (Megatron's --calculate-per-token-loss);
// otherwise the mean over the M micro-batches of each one's token mean
// (Megatron's default). The gradient of the objective with respect to the
// logits, (softmax − onehot)·mask·weight, is pulled back through the model
// by its backward pass and summed over the micro-batches in float64.
// tokens are the micro-batches' unmasked tokens; loss is Σ mask·ce / N in
// both modes (what Megatron logs).
func perTokenReference(t *testing.T, st *stepper, perToken bool) (loss float64, grads map[string][]float64, tokens []int64) {
	t.Helper()
	n, mbs := st.mb.Num(), st.mb.MicroBatchSize()
	type mb struct {
		labels []int32
		mask   []float32
	}
	var N float64
	var sum float64
	bts := make([]mb, n)
	for i := range n {
		bt, nt, err := st.trainBatch(i, mbs, 1, 0)
		if err != nil {
			t.Fatal(err)
		}
		var count float64
		for _, m := range bt.LossMask.Float32s() {
			count += float64(m)
		}
		tokens = append(tokens, nt)
		if int64(count) != nt {
			t.Fatalf("micro-batch %d: the trainer counts %d unmasked tokens, the mask sums to %g", i, nt, count)
		}
		N += count
		bts[i] = mb{labels: bt.Labels.Int32s(), mask: bt.LossMask.Float32s()}
	}
	grads = map[string][]float64{}
	params := st.model.Params()
	for i := range n {
		bt, _, err := st.trainBatch(i, mbs, 1, 0)
		if err != nil {
			t.Fatal(err)
		}
		tp := tensor.NewTape()
		logits := st.model.Forward(tp, bt, nil, false)
		z := logits.Float32s()
		V := logits.Dim(-1)
		rows := len(z) / V
		var count float64
		for _, m := range bts[i].mask {
			count += float64(m)
		}
		dz := make([]float32, len(z))
		for r := range rows {
			row := z[r*V : (r+1)*V]
			mx := math.Inf(-1)
			for _, v := range row {
				mx = math.Max(mx, float64(v))
			}
			var se float64
			for _, v := range row {
				se += math.Exp(float64(v) - mx)
			}
			lse := mx + math.Log(se)
			label := int(bts[i].labels[r])
			m := float64(bts[i].mask[r])
			sum += m * (lse - float64(row[label]))
			w := m / N // per-token: every token weighs 1/N
			if !perToken {
				w = m / count / float64(n) // the micro-batch's token mean, over n
			}
			for v := range V {
				g := math.Exp(float64(row[v]) - lse)
				if v == label {
					g--
				}
				dz[r*V+v] = float32(g * w)
			}
		}
		tensor.ZeroGrad(params)
		if err := tp.BackwardFrom([]*tensor.Tensor{logits}, []*tensor.Tensor{tensor.FromFloat32(dz, logits.Shape()...)}); err != nil {
			t.Fatal(err)
		}
		for _, p := range params {
			acc := grads[p.Name]
			if acc == nil {
				acc = make([]float64, p.Numel())
				grads[p.Name] = acc
			}
			for j, g := range p.Grad.Float32s() {
				acc[j] += float64(g)
			}
		}
		tp.Reset()
	}
	tensor.ZeroGrad(params)
	return sum / N, grads, tokens
}

// tokenLosses returns Σ mask·ce and Σ mask of bt under the stepper's
// model, in float64 from its logits.
func tokenLosses(t *testing.T, st *stepper, bt gpt.Batch) (sum, count float64) {
	t.Helper()
	tp := tensor.NewNoGradTape(nil)
	defer tp.Reset()
	z := st.model.Forward(tp, bt, nil, false)
	logits := z.Float32s()
	V := z.Dim(-1)
	labels, mask := bt.Labels.Int32s(), bt.LossMask.Float32s()
	for r := range len(logits) / V {
		row := logits[r*V : (r+1)*V]
		mx := math.Inf(-1)
		for _, v := range row {
			mx = math.Max(mx, float64(v))
		}
		var se float64
		for _, v := range row {
			se += math.Exp(float64(v) - mx)
		}
		sum += float64(mask[r]) * (mx + math.Log(se) - float64(row[labels[r]]))
		count += float64(mask[r])
	}
	return sum, count
}

// gradDistance is max |got − want| over every gradient element, relative
// to the largest |want|.
func gradDistance(t *testing.T, st *stepper, want map[string][]float64) float64 {
	t.Helper()
	var diff, scale float64
	for _, p := range st.model.Params() {
		w := want[p.Name]
		for j, g := range p.Grad.Float32s() {
			diff = math.Max(diff, math.Abs(float64(g)-w[j]))
			scale = math.Max(scale, math.Abs(w[j]))
		}
	}
	return diff / scale
}

// TestPerTokenLossGolden: --calculate-per-token-loss on a real .bin/.idx
// dataset with --eod-mask-loss, where the iteration's four micro-batches
// hold different numbers of unmasked tokens. One step's gradients (clipping
// off, read after the step) equal the float64 reference of Σ token losses
// / Σ unmasked tokens, and differ from the reference of Megatron's default
// (the mean over micro-batches of each one's token mean), which the
// default run's gradients equal; both runs log Σ token losses / Σ tokens,
// as Megatron's train_step, and the reference's grad norm; the validation
// loss is Σ token losses / Σ tokens too; --clip-grad clips the divided
// gradients.
func TestPerTokenLossGolden(t *testing.T) {
	train, valid := dpDatasetMasks(t, 16, datagpt.MaskOptions{EODMaskLoss: true})
	cfg := dpConfig(dpModels()["gpt2"])
	cfg.MicroBatchSize, cfg.GlobalBatchSize, cfg.TrainIters, cfg.EvalIters, cfg.ClipGrad = 2, 8, 4, 1, 0
	refs := map[bool]map[string][]float64{}
	for _, perToken := range []bool{true, false} {
		c := cfg
		c.CalculatePerTokenLoss = perToken
		tr, err := New(c, train, valid)
		if err != nil {
			t.Fatal(err)
		}
		defer tr.Close()
		st := tr.stepper
		if err := st.mb.UpdateChecked(0); err != nil {
			t.Fatal(err)
		}
		var refLoss float64
		var tokens []int64
		for _, mode := range []bool{true, false} {
			l, g, tk := perTokenReference(t, st, mode)
			refs[mode], refLoss, tokens = g, l, tk
		}
		if perToken {
			distinct := map[int64]bool{}
			for _, n := range tokens {
				distinct[n] = true
			}
			if len(tokens) != 4 || len(distinct) < 2 {
				t.Fatalf("micro-batches' unmasked tokens %v: the test needs 4 micro-batches with different counts", tokens)
			}
			t.Logf("unmasked tokens per micro-batch: %v", tokens)
		}
		if perToken {
			// Evaluation (either mode): Σ token losses / Σ tokens over the
			// evaluated micro-batches, not the mean of their token means.
			var sum, count, meanOfMeans float64
			mbs := c.MicroBatchSize
			n := c.GlobalBatchSize / mbs
			for i := range n {
				bt, err := makeBatch(valid, int64(i*mbs)%int64(valid.Len()), mbs, c.SeqLength, c.Model.VocabSize)
				if err != nil {
					t.Fatal(err)
				}
				s, k := tokenLosses(t, st, bt)
				sum, count, meanOfMeans = sum+s, count+k, meanOfMeans+s/k/float64(n)
			}
			var consumed int64
			got, err := st.evaluate(valid, &consumed)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("validation loss %.9g: Σ/Σ %.9g, mean of means %.9g", got, sum/count, meanOfMeans)
			if !relClose(got, sum/count, 1e-6) || relClose(got, meanOfMeans, 1e-6) {
				t.Errorf("validation loss %.9g: want Σ losses / Σ tokens %.9g (not the mean of the micro-batches' means %.9g)", got, sum/count, meanOfMeans)
			}
		}
		loss, err := st.step(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if !relClose(loss, refLoss, 1e-6) {
			t.Errorf("per-token %v: logged lm loss %.9g, reference Σ losses / Σ tokens %.9g", perToken, loss, refLoss)
		}
		own, other := gradDistance(t, st, refs[perToken]), gradDistance(t, st, refs[!perToken])
		t.Logf("per-token %v: gradients within %.2g of their reference, %.2g from the other mode's", perToken, own, other)
		if own > 1e-5 {
			t.Errorf("per-token %v: gradients differ from the float64 reference by %.3g (relative to the largest), want ≤ 1e-5", perToken, own)
		}
		if other < 1e-3 {
			t.Errorf("per-token %v: gradients within %.3g of the other mode's reference: the modes should differ on these micro-batches", perToken, other)
		}
		if norm := refNorm(refs[perToken]); !relClose(st.lastGradNorm, norm, 1e-5) {
			t.Errorf("per-token %v: grad norm %.9g, reference %.9g", perToken, st.lastGradNorm, norm)
		}
	}

	// --clip-grad clips the divided gradients: at half the reference norm
	// they come out as the reference times clip/(norm+1e-6).
	c := cfg
	c.CalculatePerTokenLoss = true
	tr, err := New(c, train, valid)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	st := tr.stepper
	if err := st.mb.UpdateChecked(0); err != nil {
		t.Fatal(err)
	}
	_, ref, _ := perTokenReference(t, st, true)
	norm := refNorm(ref)
	st.cfg.ClipGrad = norm / 2
	if _, err := st.step(context.Background()); err != nil {
		t.Fatal(err)
	}
	coef := (norm / 2) / (norm + 1e-6)
	for _, g := range ref {
		for j := range g {
			g[j] *= coef
		}
	}
	if d := gradDistance(t, st, ref); d > 1e-5 || !relClose(st.lastGradNorm, norm, 1e-5) {
		t.Errorf("clipped at %.6g: grad norm %.9g (reference %.9g), gradients %.3g from the clipped reference", norm/2, st.lastGradNorm, norm, d)
	}
}

// refNorm is the L2 norm of reference gradients.
func refNorm(grads map[string][]float64) float64 {
	var s float64
	for _, g := range grads {
		for _, v := range g {
			s += v * v
		}
	}
	return math.Sqrt(s)
}

// TestPerTokenLossParallelMatchesSingleProcess: with --eod-mask-loss (so
// micro-batches and ranks count different tokens) and
// --calculate-per-token-loss, data parallelism (with and without the
// distributed optimizer), tensor parallelism with sequence parallelism,
// pipeline parallelism (1F1B and interleaved), context parallelism and
// Megatron's TP=2 PP=2 CP=2 functional-test layout reproduce the single
// process (two distributed-optimizer instances of DP=2: its loss and
// grad-norm curve): the same lm loss at each iteration, validation loss and final
// parameters within 1e-5; and the per-token run differs from the default
// one, so the comparison is of the per-token objective.
func TestPerTokenLossParallelMatchesSingleProcess(t *testing.T) {
	train, valid := dpDatasetMasks(t, 16, datagpt.MaskOptions{EODMaskLoss: true})
	m := dpModels()["llama"]
	m.NumLayers = 4 // two virtual stages on each of two pipeline ranks
	cfg := dpConfig(m)
	cfg.MicroBatchSize, cfg.GlobalBatchSize, cfg.TrainIters, cfg.EvalInterval, cfg.EvalIters = 1, 8, 4, 2, 1
	def := runDP(t, cfg, 0, ddp.Config{}, train, valid)[0]
	cfg.CalculatePerTokenLoss = true
	ref := runDP(t, cfg, 0, ddp.Config{}, train, valid)[0]
	differ := false
	for i := range ref.res.Losses {
		differ = differ || !relClose(ref.res.Losses[i], def.res.Losses[i], 1e-5)
	}
	if !differ {
		t.Fatalf("per-token losses %v equal the default run's %v: the test data does not tell the modes apart", ref.res.Losses, def.res.Losses)
	}
	for _, l := range []cpLayout{
		{tp: 1, pp: 1, cp: 1, dp: 2},
		{tp: 1, pp: 1, cp: 1, dp: 2, dc: ddp.Config{DistributedOptimizer: true, OverlapGradReduce: true, BucketSize: 500}},
		{tp: 2, pp: 1, cp: 1, dp: 1, sp: true},
		{tp: 1, pp: 2, cp: 1, dp: 1},
		{tp: 1, pp: 2, cp: 1, dp: 2, vpp: 2, dc: ddp.Config{DistributedOptimizer: true}},
		{tp: 1, pp: 1, cp: 2, dp: 1, comm: cp.P2P},
		{tp: 2, pp: 2, cp: 2, dp: 1, comm: cp.P2P},
	} {
		checkSameRun(t, "per-token "+l.String(), ref, runCPLayout(t, cfg, l, train, valid))
	}
	// two distributed-optimizer instances of DP=2 (the gradients summed
	// within and across them)
	inst := cfg
	inst.EvalIters = 0
	inst.DDP = ddp.Config{DistributedOptimizer: true}
	one := runMoEOn(t, cfg, train, 0, parallel.Config{})[0]
	for r, g := range runMoEOn(t, inst, train, 4, parallel.Config{DistOptInstances: 2}) {
		for i := range one.res.Losses {
			if !relClose(g.res.Losses[i], one.res.Losses[i], 1e-5) || !relClose(g.res.GradNorms[i], one.res.GradNorms[i], 1e-5) {
				t.Fatalf("per-token, 2 distributed-optimizer instances, rank %d iteration %d: lm loss %.9g grad norm %.9g, single process %.9g and %.9g",
					r, i+1, g.res.Losses[i], g.res.GradNorms[i], one.res.Losses[i], one.res.GradNorms[i])
			}
		}
	}
}

// runMoEOn is runMoE on the samples of src (cfg.SequenceParallel as set).
// Each rank's result holds the parameters it trains.
func runMoEOn(t *testing.T, cfg Config, src datagpt.Source, world int, pc parallel.Config) []dpRun {
	t.Helper()
	runs := make([]dpRun, max(world, 1))
	body := func(ctx context.Context, pg comm.ProcessGroup) error {
		c := cfg
		rank := 0
		if pg != nil {
			g, err := parallel.NewGroups(pg, pc)
			if err != nil {
				return err
			}
			c.Parallel, rank = g, pg.Rank()
		}
		tr, err := New(c, src, nil)
		if err != nil {
			return fmt.Errorf("rank %d: %w", rank, err)
		}
		res, err := tr.Run(ctx)
		if err != nil {
			return fmt.Errorf("rank %d: %w", rank, err)
		}
		ps := map[string][]float32{}
		for _, p := range tr.stepper.localParams() {
			ps[p.Name] = slices.Clone(tensor.ToHost(p).Float32s())
		}
		runs[rank] = dpRun{res: res, params: ps}
		return nil
	}
	var err error
	if world == 0 {
		err = body(context.Background(), nil)
	} else {
		err = inproc.Run(context.Background(), world, body)
	}
	if err != nil {
		t.Fatal(err)
	}
	return runs
}

// TestPerTokenLossMoE: the routers' aux and z losses under
// --calculate-per-token-loss are pre-multiplied by their tokens × TP·CP,
// as Megatron's router, so that the division of the gradients by the
// global batch's tokens leaves them their default weight: on data where
// every micro-batch counts the same tokens, the per-token run of an MoE
// model (aux and z losses, SGD, whose update shows any gradient scale)
// follows the default run within 1e-5. On --eod-mask-loss data, the
// per-token run over EP=2, EP=2 with expert-data-parallel size 2 and the
// distributed optimizer, TP=2 with sequence parallelism (the routers on
// sequence shards) and CP=2 (the routers on each rank's two chunks) follows
// the single process.
func TestPerTokenLossMoE(t *testing.T) {
	cfg := moeTrainConfig()
	cfg.TrainIters = 6
	pt := cfg
	pt.CalculatePerTokenLoss = true
	sameMoECurve(t, "per-token vs default, equal token counts", runEP(t, cfg, 0, 1)[0], runEP(t, pt, 0, 1), true)

	train, _ := dpDatasetMasks(t, 16, datagpt.MaskOptions{EODMaskLoss: true})
	ref := runMoEOn(t, pt, train, 0, parallel.Config{})[0]
	dist := pt
	dist.DDP = ddp.Config{DistributedOptimizer: true, OverlapGradReduce: true, BucketSize: 1000}
	sp := pt
	sp.SequenceParallel = true
	for _, c := range []struct {
		name  string
		cfg   Config
		world int
		pc    parallel.Config
	}{
		{"EP=2", pt, 2, parallel.Config{EP: 2}},
		{"EP=2 on 4 ranks, distributed optimizer", dist, 4, parallel.Config{EP: 2}},
		{"TP=2 SP", sp, 2, parallel.Config{TP: 2}},
		{"CP=2", pt, 2, parallel.Config{CP: 2}},
	} {
		// tensor- and context-parallel runs: compared by their losses (the
		// ranks hold slices, or experts folded over CP)
		sameMoECurve(t, "per-token "+c.name, ref, runMoEOn(t, c.cfg, train, c.world, c.pc), c.pc.TP < 2 && c.pc.CP < 2)
	}
}

// TestPerTokenLossWithLossScale: the loss scale and the per-token weights
// compose as Megatron's (backward seeded by loss_scale × tokens, the
// gradients divided by the tokens, then unscaled): a constant loss scale of
// 1024 with --bf16, a power of two, changes no number of a per-token run,
// in one process and through the pipeline executor (PP=2).
func TestPerTokenLossWithLossScale(t *testing.T) {
	train, valid := dpDatasetMasks(t, 16, datagpt.MaskOptions{EODMaskLoss: true})
	m := dpModels()["gpt2"]
	cfg := dpConfig(m)
	cfg.MicroBatchSize, cfg.GlobalBatchSize, cfg.TrainIters, cfg.EvalInterval, cfg.EvalIters = 1, 4, 3, 0, 0
	cfg.CalculatePerTokenLoss, cfg.BF16 = true, true
	scaled := cfg
	scaled.LossScale.Constant = 1024
	for _, l := range []cpLayout{{tp: 1, pp: 1, cp: 1, dp: 1}, {tp: 1, pp: 2, cp: 1, dp: 1}} {
		ref := runCPLayout(t, cfg, l, train, valid)[0]
		got := runCPLayout(t, scaled, l, train, valid)
		for r, g := range got {
			if !slices.Equal(g.res.Losses, ref.res.Losses) || !slices.Equal(g.res.GradNorms, ref.res.GradNorms) {
				t.Fatalf("%v rank %d: losses %v grad norms %v with loss scale 1024, %v and %v without", l, r, g.res.Losses, g.res.GradNorms, ref.res.Losses, ref.res.GradNorms)
			}
			for pn, w := range ref.params {
				if !slices.Equal(g.params[pn], w) {
					t.Fatalf("%v rank %d: %s differs with loss scale 1024", l, r, pn)
				}
			}
		}
	}
}
