package train

import (
	"math"
	"strings"
	"testing"

	"github.com/gotron/gotron/comm/commtest"
	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/parallel/ddp"
	"github.com/gotron/gotron/tensor"
)

// TestDataParallelBF16GradReduce: --bf16 --grad-reduce-in-bf16 over DP=2
// (4 micro-batches a rank): the plain all-reduce, the distributed
// optimizer's reduce-scatter and the same with several overlapped buckets
// give the same losses and parameters bit for bit on every rank (a
// reduction in float32 of the bfloat16 values, rounded once, whoever
// reduces); a second run repeats them bit for bit; and the curve tracks the
// float32 reduction's within bfloat16's precision while differing from it
// (the flag acts). A process alone rounds its gradients the same way.
func TestDataParallelBF16GradReduce(t *testing.T) {
	train, valid := dpDataset(t, 16)
	cfg := dpConfig(dpModels()["llama"])
	cfg.BF16 = true
	fp32 := runDP(t, cfg, 2, ddp.Config{}, train, valid)[0]
	var ref dpRun
	for i, dc := range []ddp.Config{
		{ReduceInBF16: true},
		{ReduceInBF16: true},
		{ReduceInBF16: true, DistributedOptimizer: true},
		{ReduceInBF16: true, DistributedOptimizer: true, OverlapGradReduce: true, BucketSize: 1000},
	} {
		for r, got := range runDP(t, cfg, 2, dc, train, valid) {
			if i == 0 && r == 0 {
				ref = got
				continue
			}
			for it, l := range got.res.Losses {
				if l != ref.res.Losses[it] {
					t.Fatalf("%+v rank %d iteration %d: lm loss %.9g, the all-reduce run's %.9g", dc, r, it+1, l, ref.res.Losses[it])
				}
			}
			for pn, want := range ref.params {
				for k, v := range got.params[pn] {
					if v != want[k] {
						t.Fatalf("%+v rank %d: %s[%d] = %.9g, the all-reduce run's %.9g", dc, r, pn, k, v, want[k])
					}
				}
			}
		}
	}
	differ := false
	for it, l := range ref.res.Losses {
		if !relClose(l, fp32.res.Losses[it], 2e-2) {
			t.Errorf("iteration %d: lm loss %.7g with bfloat16 gradients, %.7g with float32", it+1, l, fp32.res.Losses[it])
		}
		differ = differ || l != fp32.res.Losses[it]
	}
	if !differ {
		t.Errorf("bfloat16 gradient reduction gave the float32 reduction's losses exactly: the flag had no effect")
	}
	// The gradients the optimizer saw are bfloat16 values: so are the
	// parameters' changes only approximately, but the losses above are
	// the evidence; here the single process's reducer rounds too.
	alone := runDP(t, cfg, 0, ddp.Config{ReduceInBF16: true}, train, valid)[0]
	plain := runDP(t, cfg, 0, ddp.Config{}, train, valid)[0]
	same := true
	for it, l := range alone.res.Losses {
		if !relClose(l, plain.res.Losses[it], 2e-2) || math.IsNaN(l) {
			t.Errorf("one process, iteration %d: lm loss %.7g with bfloat16 gradients, %.7g with float32", it+1, l, plain.res.Losses[it])
		}
		same = same && l == plain.res.Losses[it]
	}
	if same {
		t.Errorf("one process: bfloat16 gradients gave float32's losses exactly: the flag had no effect")
	}
	// Pipelined, the rounding follows each stage's micro-batches: PP=2,
	// with and without virtual stages, is the process alone's run.
	m := dpModels()["llama"]
	m.NumLayers = 4
	cfg = dpConfig(m)
	cfg.BF16, cfg.MicroBatchSize = true, 2
	alone = runDP(t, cfg, 0, ddp.Config{ReduceInBF16: true}, train, valid)[0]
	for _, l := range []ppLayout{
		{tp: 1, pp: 2, dp: 1, dc: ddp.Config{ReduceInBF16: true}},
		{tp: 1, pp: 2, dp: 1, split: gpt.PipelineSplit{VPP: 2}, dc: ddp.Config{ReduceInBF16: true, OverlapGradReduce: true, BucketSize: 500}},
	} {
		l.split.PP = l.pp
		checkSameRun(t, l.String(), alone, runPP(t, cfg, l, train, valid))
	}
}

// TestSimBF16GradReduce: --grad-reduce-in-bf16 with the gradient buffer on
// the simulated device (the device path: rounding, pre-scale and widening
// by the device's conversions; the bfloat16 buckets reduced in place by
// comm.SimDevice's device collectives, or staged through the host) gives
// the CPU run's losses and parameters bit for bit over DP=2, for the
// all-reduce, the distributed optimizer and overlapped buckets.
func TestSimBF16GradReduce(t *testing.T) {
	train, valid := dpDataset(t, 16)
	cfg := dpConfig(dpModels()["llama"])
	cfg.BF16, cfg.TrainIters, cfg.EvalInterval = true, 4, 4
	for _, dc := range []ddp.Config{
		{ReduceInBF16: true},
		{ReduceInBF16: true, DistributedOptimizer: true},
		{ReduceInBF16: true, DistributedOptimizer: true, OverlapGradReduce: true, BucketSize: 1000},
	} {
		want := runDP(t, cfg, 2, dc, train, valid)
		sim := cfg
		sim.Device = tensor.Sim
		for _, inPlace := range []bool{false, true} {
			l := cpLayout{tp: 1, pp: 1, cp: 1, dp: 2, dc: dc}
			sims := &commtest.SimDevices{}
			if inPlace {
				l.simCollectives = sims.Wrap
			}
			got := runCPLayout(t, sim, l, train, valid)
			if inPlace && sims.Calls() == 0 {
				t.Errorf("%+v: the device collectives were never called", dc)
			}
			for r := range want {
				for it, v := range want[r].res.Losses {
					if math.Float64bits(got[r].res.Losses[it]) != math.Float64bits(v) {
						t.Fatalf("%+v in place %v rank %d iteration %d: lm loss %v on sim, %v on the CPU", dc, inPlace, r, it+1, got[r].res.Losses[it], v)
					}
				}
				for pn, wv := range want[r].params {
					for k, v := range wv {
						if math.Float32bits(got[r].params[pn][k]) != math.Float32bits(v) {
							t.Fatalf("%+v in place %v rank %d: %s[%d] = %v on sim, %v on the CPU", dc, inPlace, r, pn, k, got[r].params[pn][k], v)
						}
					}
				}
			}
		}
	}
}

// TestSimBF16GradReduceAlone: a process alone on the simulated device
// rounds its gradients to bfloat16 after every micro-batch as the CPU's
// does: the same losses and parameters bit for bit.
func TestSimBF16GradReduceAlone(t *testing.T) {
	cfg := tinyConfig(t)
	cfg.BF16, cfg.DDP.ReduceInBF16 = true, true
	cfg.GlobalBatchSize = 4 * cfg.MicroBatchSize // several micro-batches
	want, got := runOn(t, cfg, tensor.CPU), runOn(t, cfg, tensor.Sim)
	for it, v := range want.res.Losses {
		if math.Float64bits(got.res.Losses[it]) != math.Float64bits(v) {
			t.Fatalf("iteration %d: lm loss %v on sim, %v on the CPU", it+1, got.res.Losses[it], v)
		}
	}
	for pn, wv := range want.params {
		for k, v := range wv {
			if math.Float32bits(got.params[pn][k]) != math.Float32bits(v) {
				t.Fatalf("%s[%d] = %v on sim, %v on the CPU", pn, k, got.params[pn][k], v)
			}
		}
	}
	plain := cfg
	plain.DDP.ReduceInBF16 = false
	if p := runOn(t, plain, tensor.Sim); p.res.Losses[len(p.res.Losses)-1] == got.res.Losses[len(got.res.Losses)-1] {
		t.Error("on sim, bfloat16 gradients gave float32's last loss exactly: the flag had no effect")
	}
}

// TestBF16GradReduceRefusals: Megatron's flag means bfloat16 parameters;
// without --bf16 or with FSDP it is refused by name.
func TestBF16GradReduceRefusals(t *testing.T) {
	for _, c := range []struct {
		edit func(*Config)
		want string
	}{
		{func(c *Config) {}, "--grad-reduce-in-bf16 needs --bf16"},
	} {
		cfg := tinyConfig(nil)
		cfg.DDP.ReduceInBF16 = true
		c.edit(&cfg)
		train, valid := dpDataset(t, 16)
		_, err := New(cfg, train, valid)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("got %v, want %q", err, c.want)
		}
	}
}
