package train

import (
	"context"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/gotron/gotron/optim"
	"github.com/gotron/gotron/tensor"
)

// TestSimStepReadsBackOnce: a training step on the simulated device (which
// counts the copies a GPU's step makes, the backend's own included) copies
// in each micro-batch's four tensors and the optimizer's coefficients, and
// reads back exactly once — the found-inf flag, Σg² and the micro-batches'
// losses together, as Megatron reads the gradient norm once — with fp16
// loss scaling, per-token loss and NaN-skipped iterations too; only
// --rerun-mode validate_results reads each micro-batch's loss as well (as
// Megatron's validate_result does). The losses, gradient norms, skips and
// loss scales are the CPU's bit for bit, and a run's transfer line says 1.0
// out per iteration with a log line every iteration.
func TestSimStepReadsBackOnce(t *testing.T) {
	const n = 3 // micro-batches per iteration
	for _, c := range []struct {
		name    string
		set     func(*Config)
		nanW    bool // a NaN weight: every iteration skipped
		perMB   int  // read-backs per micro-batch
		skipped int64
	}{
		{name: "adam clip"},
		{name: "sgd no clip", set: func(c *Config) { c.Optimizer, c.SGDMomentum, c.ClipGrad = SGD, 0.9, 0 }},
		// 2^32 overflows the first iterations, halving each time, then 2^28 does not
		{name: "fp16", set: func(c *Config) { c.FP16, c.LossScale = true, optim.LossScalerConfig{Window: 2, Hysteresis: 1} }, skipped: 4},
		{name: "fp16 clean", set: func(c *Config) {
			c.FP16, c.LossScale = true, optim.LossScalerConfig{InitialScale: 1 << 10, Window: 2, Hysteresis: 1}
		}},
		{name: "per-token loss", set: func(c *Config) { c.CalculatePerTokenLoss = true }},
		{name: "nan skipped", set: func(c *Config) { c.MaxSkipsInARow = 10 }, nanW: true, skipped: 4},
		{name: "rerun validate_results", set: func(c *Config) { c.Rerun.Mode = RerunValidateResults }, perMB: 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := tinyConfig(t)
			cfg.GlobalBatchSize, cfg.TrainIters = n*cfg.MicroBatchSize, 4
			if c.set != nil {
				c.set(&cfg)
			}
			type stepOut struct {
				loss, norm, scale float64
				skipped           bool
				copies            tensor.Transfers
			}
			steps := func(dev tensor.Device) ([]stepOut, int64) {
				cfg := cfg
				cfg.Device, cfg.Out = dev, &strings.Builder{}
				tr, err := New(cfg, MockSource{SeqLength: cfg.SeqLength, VocabSize: cfg.Model.VocabSize}, nil)
				if err != nil {
					t.Fatal(err)
				}
				if c.nanW {
					tensor.MoveParams(tensor.CPU, tr.Model.Layers[0].FC1)
					tr.Model.Layers[0].FC1.Float32s()[0] = float32(math.NaN())
					tensor.MoveParams(dev, tr.Model.Layers[0].FC1)
				}
				var out []stepOut
				for range cfg.TrainIters {
					before, skipped := tensor.SimTransfers(), tr.Skipped
					loss, err := tr.stepper.step(context.Background())
					if err != nil {
						t.Fatal(err)
					}
					out = append(out, stepOut{loss, tr.stepper.lastGradNorm, float64(tr.stepper.lossScale()), tr.Skipped > skipped,
						tensor.SimTransfers().Sub(before)})
				}
				return out, tr.Skipped
			}
			want, wantSkipped := steps(tensor.CPU)
			got, gotSkipped := steps(tensor.Sim)
			if gotSkipped != c.skipped || wantSkipped != c.skipped {
				t.Errorf("skipped %d on sim, %d on the CPU; want %d", gotSkipped, wantSkipped, c.skipped)
			}
			for i, g := range got {
				w := want[i]
				if math.Float64bits(g.loss) != math.Float64bits(w.loss) || math.Float64bits(g.norm) != math.Float64bits(w.norm) ||
					g.scale != w.scale || g.skipped != w.skipped {
					t.Errorf("iteration %d: loss %v, grad norm %v, loss scale %v on sim; the CPU's %v, %v, %v (must be bit for bit)",
						i+1, g.loss, g.norm, g.scale, w.loss, w.norm, w.scale)
				}
				d := g.copies
				in := map[string]int64{"train.batchTo": 4 * n}
				coeffs := "AdamW coefficients"
				if cfg.Optimizer == SGD {
					coeffs = "SGD coefficients"
				}
				if !g.skipped { // a skipped iteration does not update
					in[coeffs] = 1
				}
				out := map[string]int64{"train.(*stepper).reduceGrads": 1}
				if c.perMB > 0 {
					out["train.scalar"] = int64(c.perMB * n)
				}
				var wantIn, wantOut int64
				for site, k := range in {
					wantIn += k
					if d.Sites[site].In != k {
						t.Errorf("iteration %d: %d copies in from %s, want %d (all: %v)", i+1, d.Sites[site].In, site, k, d.Sites)
					}
				}
				for site, k := range out {
					wantOut += k
					if d.Sites[site].Out != k {
						t.Errorf("iteration %d: %d read-backs from %s, want %d (all: %v)", i+1, d.Sites[site].Out, site, k, d.Sites)
					}
				}
				if i > 0 && d.FromHost != wantIn { // the first iteration also builds the tensor lists' tables
					t.Errorf("iteration %d: %d copies in, want %d (%v)", i+1, d.FromHost, wantIn, d.Sites)
				}
				if d.ToHost != wantOut {
					t.Errorf("iteration %d: %d read-backs, want %d (%v)", i+1, d.ToHost, wantOut, d.Sites)
				}
			}
		})
	}
	// Evaluation: 3 iterations of 3 forwards, one read-back, the CPU's loss.
	evalLoss := func(dev tensor.Device) (float64, tensor.Transfers) {
		cfg := tinyConfig(t)
		cfg.GlobalBatchSize, cfg.EvalIters, cfg.Device, cfg.Out = n*cfg.MicroBatchSize, 3, dev, &strings.Builder{}
		valid := MockSource{SeqLength: cfg.SeqLength, VocabSize: cfg.Model.VocabSize, Samples: 64}
		tr, err := New(cfg, MockSource{SeqLength: cfg.SeqLength, VocabSize: cfg.Model.VocabSize}, valid)
		if err != nil {
			t.Fatal(err)
		}
		var consumed int64
		before := tensor.SimTransfers()
		loss, err := tr.stepper.evaluate(valid, &consumed)
		if err != nil {
			t.Fatal(err)
		}
		return loss, tensor.SimTransfers().Sub(before)
	}
	want, _ := evalLoss(tensor.CPU)
	got, d := evalLoss(tensor.Sim)
	if math.Float64bits(got) != math.Float64bits(want) || d.ToHost != 1 || d.FromHost != 4*3*n {
		t.Errorf("evaluation: loss %v on sim, the CPU's %v; %d read-backs (want 1), %d copies in (want %d): %v", got, want, d.ToHost, d.FromHost, 4*3*n, d.Sites)
	}

	// A whole run logging every iteration (and evaluating): still one
	// read-back per training iteration.
	cfg := tinyConfig(t)
	cfg.TrainIters = 4
	res := runOn(t, cfg, tensor.Sim)
	if !strings.Contains(res.log, fmt.Sprintf("per training iteration %.1f in, 1.0 out", 4.0*2+1+18.0/4)) {
		t.Errorf("the transfer line does not say 1.0 out per iteration:\n%s", res.log[strings.LastIndex(res.log, "sim device"):])
	}
}
