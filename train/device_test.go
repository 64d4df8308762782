package train

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/gotron/gotron/optim"
	"github.com/gotron/gotron/tensor"
)

// deviceRun is what a device test compares: the loss of every iteration, the
// final validation loss and the final parameters (read back to the host).
type deviceRun struct {
	res    Result
	params map[string][]float32
	log    string
}

func runOn(t *testing.T, cfg Config, dev tensor.Device) deviceRun {
	t.Helper()
	var log bytes.Buffer
	cfg.Device, cfg.Out = dev, &log
	src := MockSource{SeqLength: cfg.SeqLength, VocabSize: cfg.Model.VocabSize}
	tr, err := New(cfg, src, MockSource{SeqLength: cfg.SeqLength, VocabSize: cfg.Model.VocabSize, Samples: 64})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range tr.stepper.localParams() {
		if p.Device() != dev || p.Grad == nil || p.Grad.Device() != dev {
			t.Fatalf("%s: parameter or gradient not on the %v device", p.Name, dev)
		}
	}
	res, err := tr.Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	out := deviceRun{res: res, params: map[string][]float32{}, log: log.String()}
	for _, p := range tr.stepper.localParams() {
		out.params[p.Name] = append([]float32(nil), tensor.ToHost(p).Float32s()...)
	}
	return out
}

func sameDeviceRun(t *testing.T, what string, got, want deviceRun) {
	t.Helper()
	if len(got.res.Losses) != len(want.res.Losses) {
		t.Fatalf("%s: %d iterations, want %d", what, len(got.res.Losses), len(want.res.Losses))
	}
	for i := range want.res.Losses {
		if math.Float64bits(got.res.Losses[i]) != math.Float64bits(want.res.Losses[i]) {
			t.Fatalf("%s: iteration %d: loss %v, the CPU's %v (must be bit for bit)", what, i+1, got.res.Losses[i], want.res.Losses[i])
		}
	}
	if math.Float64bits(got.res.ValidLoss) != math.Float64bits(want.res.ValidLoss) {
		t.Errorf("%s: validation loss %v, the CPU's %v", what, got.res.ValidLoss, want.res.ValidLoss)
	}
	if len(got.params) != len(want.params) {
		t.Fatalf("%s: %d parameters, want %d", what, len(got.params), len(want.params))
	}
	for name, w := range want.params {
		g := got.params[name]
		if len(g) != len(w) {
			t.Fatalf("%s: %s has %d values, want %d", what, name, len(g), len(w))
		}
		for i := range w {
			if math.Float32bits(g[i]) != math.Float32bits(w[i]) {
				t.Fatalf("%s: final %s[%d] = %v, the CPU's %v (must be bit for bit)", what, name, i, g[i], w[i])
			}
		}
	}
}

// TestSimDeviceTrainingMatchesCPU: single-process training on the simulated
// device (whose storage host code cannot read) — dropout, clipping, AdamW or
// SGD with momentum, evaluation — gives the CPU's loss at every iteration and
// its final parameters bit for bit; it copies to and from the host (counted,
// and reported on the last log line); and a run resumed from a checkpoint
// the sim run saved, on sim or on the CPU, matches the uninterrupted run.
func TestSimDeviceTrainingMatchesCPU(t *testing.T) {
	for _, o := range []Optimizer{Adam, SGD} {
		opt := o.String()
		cfg := tinyConfig(t)
		cfg.TrainIters = 6
		cfg.Optimizer, cfg.SGDMomentum = o, 0.9
		cfg.Recompute.Selective = true
		want := runOn(t, cfg, tensor.CPU)
		before := tensor.SimTransfers()
		got := runOn(t, cfg, tensor.Sim)
		sameDeviceRun(t, opt+" on sim", got, want)
		d := tensor.SimTransfers()
		if d.FromHost == before.FromHost || d.ToHost == before.ToHost {
			t.Errorf("%s: no host transfers counted (%+v before, %+v after)", opt, before, d)
		}
		if i := strings.Index(got.log, "sim device: "); i < 0 || !strings.Contains(got.log[i:], "device-to-host copies") {
			t.Errorf("%s: the sim run's log has no transfer line:\n%s", opt, got.log)
		} else {
			t.Logf("%s: %s", opt, strings.TrimSpace(got.log[i:]))
		}
		if strings.Contains(want.log, "sim device: ") {
			t.Errorf("%s: a CPU run reports sim transfers", opt)
		}

		// Save at iteration 3 on sim; resume on sim and on the CPU.
		dir := t.TempDir()
		first := cfg
		first.Save, first.ExitInterval = dir, 3
		a := runOn(t, first, tensor.Sim)
		for _, dev := range []tensor.Device{tensor.Sim, tensor.CPU} {
			second := cfg
			second.Load = dir
			b := runOn(t, second, dev)
			b.res.Losses = append(append([]float64(nil), a.res.Losses...), b.res.Losses...)
			sameDeviceRun(t, opt+" resumed on "+dev.String()+" from a sim checkpoint", b, want)
		}
	}
}

// TestSimDevicePrecisionsMatchCPU: --fp16 (dynamic loss scaling, whose
// unscale and overflow check are backend ops on the device's gradients) and
// --bf16 training with --log-params-norm give the CPU's losses, loss scales
// and final parameters bit for bit on the simulated device.
func TestSimDevicePrecisionsMatchCPU(t *testing.T) {
	for _, fp16 := range []bool{true, false} {
		cfg := tinyConfig(t)
		cfg.TrainIters, cfg.LogParamsNorm = 5, true
		if fp16 {
			cfg.FP16 = true
			cfg.LossScale = optim.LossScalerConfig{Window: 2, Hysteresis: 1}
		} else {
			cfg.BF16 = true
		}
		want := runOn(t, cfg, tensor.CPU)
		got := runOn(t, cfg, tensor.Sim)
		what := fmt.Sprintf("fp16=%v bf16=%v", cfg.FP16, cfg.BF16)
		sameDeviceRun(t, what, got, want)
		for i := range want.res.LossScales {
			if got.res.LossScales[i] != want.res.LossScales[i] {
				t.Fatalf("%s: iteration %d: loss scale %v on sim, %v on the CPU", what, i+1, got.res.LossScales[i], want.res.LossScales[i])
			}
		}
		if !strings.Contains(got.log, "params norm") {
			t.Errorf("%s: no params norm logged:\n%s", what, got.log)
		}
	}
}
