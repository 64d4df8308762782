package train

import (
	"fmt"
	"math"
	"testing"

	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/parallel/ddp"
	"github.com/gotron/gotron/tensor"
)

// sameRunBits compares every rank of got (a run on the simulated device)
// with the same rank of want (the same layout on the CPU): the lm loss of
// every iteration, the validation loss and the final parameters, bit for bit.
func sameRunBits(t *testing.T, name string, want, got []dpRun) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d ranks, want %d", name, len(got), len(want))
	}
	for r := range want {
		w, g := want[r], got[r]
		if w.device != tensor.CPU || g.device != tensor.Sim {
			t.Fatalf("%s rank %d: ran on %v and %v, want cpu and sim", name, r, w.device, g.device)
		}
		if len(g.res.Losses) != len(w.res.Losses) || len(w.res.Losses) == 0 {
			t.Fatalf("%s rank %d: %d iterations, the CPU %d", name, r, len(g.res.Losses), len(w.res.Losses))
		}
		for i := range w.res.Losses {
			if math.Float64bits(g.res.Losses[i]) != math.Float64bits(w.res.Losses[i]) {
				t.Fatalf("%s rank %d iteration %d: lm loss %v on sim, %v on the CPU (must be bit for bit)", name, r, i+1, g.res.Losses[i], w.res.Losses[i])
			}
		}
		if math.Float64bits(g.res.ValidLoss) != math.Float64bits(w.res.ValidLoss) {
			t.Fatalf("%s rank %d: validation loss %v on sim, %v on the CPU", name, r, g.res.ValidLoss, w.res.ValidLoss)
		}
		if len(g.params) != len(w.params) || len(w.params) == 0 {
			t.Fatalf("%s rank %d: %d parameters on sim, %d on the CPU", name, r, len(g.params), len(w.params))
		}
		for pn, wv := range w.params {
			gv := g.params[pn]
			if len(gv) != len(wv) {
				t.Fatalf("%s rank %d: %s has %d values on sim, %d on the CPU", name, r, pn, len(gv), len(wv))
			}
			for i := range wv {
				if math.Float32bits(gv[i]) != math.Float32bits(wv[i]) {
					t.Fatalf("%s rank %d: final %s[%d] = %v on sim, %v on the CPU (must be bit for bit)", name, r, pn, i, gv[i], wv[i])
				}
			}
		}
	}
}

// TestSimDeviceDataParallelMatchesCPU: DP=2 on the simulated device —
// gradient buckets and, with the distributed optimizer, parameter buckets
// and optimizer shards living on the device, every collective staged
// through host buffers — gives each rank the losses and final parameters
// of the same layout on the CPU bit for bit: plain DDP, the distributed
// optimizer, and both overlapped with several buckets; and the buckets'
// staging is counted.
func TestSimDeviceDataParallelMatchesCPU(t *testing.T) {
	train, valid := dpDataset(t, 16)
	for name, m := range dpModels() {
		cfg := dpConfig(m)
		cfg.MicroBatchSize, cfg.TrainIters = 1, 4
		for _, dc := range []ddp.Config{
			{},
			{DistributedOptimizer: true},
			{DistributedOptimizer: true, OverlapGradReduce: true, BucketSize: 1000, OverlapParamGather: true},
		} {
			label := fmt.Sprintf("%s DP=2 %+v", name, dc)
			want := runDP(t, cfg, 2, dc, train, valid)
			sim := cfg
			sim.Device = tensor.Sim
			before := tensor.SimTransfers()
			got := runDP(t, sim, 2, dc, train, valid)
			sameRunBits(t, label, want, got)
			if after := tensor.SimTransfers(); after.ToHost-before.ToHost < int64(2*cfg.TrainIters) {
				t.Errorf("%s: %d device-to-host copies in %d iterations on 2 ranks: the buckets were not staged", label, after.ToHost-before.ToHost, cfg.TrainIters)
			}
		}
	}
}

// TestSimDeviceTensorParallelMatchesCPU: TP=2 on the simulated device, with
// and without sequence parallelism and composed with DP=2 and the
// distributed optimizer — the tensor-parallel mappings, vocab-parallel
// embedding and cross-entropy and the sequence-parallel gradient reduction
// staging their collectives through the host — gives each rank the losses
// and (gathered) parameters of the same layout on the CPU bit for bit, with
// dropout on.
func TestSimDeviceTensorParallelMatchesCPU(t *testing.T) {
	train, valid := dpDataset(t, 16)
	for name, m := range dpModels() {
		m.HiddenDropout, m.AttentionDropout = 0.1, 0.1
		cfg := dpConfig(m)
		cfg.MicroBatchSize, cfg.TrainIters = 1, 4
		for _, l := range []struct {
			dp int
			sp bool
			dc ddp.Config
		}{
			{1, true, ddp.Config{}},
			{1, false, ddp.Config{}},
			{2, true, ddp.Config{DistributedOptimizer: true}},
		} {
			label := fmt.Sprintf("%s TP=2 DP=%d SP=%v %+v", name, l.dp, l.sp, l.dc)
			want := runTP(t, cfg, 2, l.dp, l.sp, l.dc, train, valid)
			sim := cfg
			sim.Device = tensor.Sim
			got := runTP(t, sim, 2, l.dp, l.sp, l.dc, train, valid)
			sameRunBits(t, label, want, got)
		}
	}
}

// TestSimDevicePipelineMatchesCPU: PP=2 on the simulated device — the
// pipeline executor's activations and gradients sent and received through
// host staging buffers, micro-batches copied to each stage's device,
// evaluation's chain likewise — gives every rank the losses and final
// parameters of the same layout on the CPU bit for bit: 1F1B alone (tied
// embeddings: the embedding group's gradient reduction is staged too),
// interleaved virtual stages, and PP=2 composed with TP=2 (sequence
// parallel) and with DP=2 and the distributed optimizer.
func TestSimDevicePipelineMatchesCPU(t *testing.T) {
	train, valid := dpDataset(t, 16)
	for name, m := range dpModels() {
		m.NumLayers = 4
		m.HiddenDropout, m.AttentionDropout = 0.1, 0.1
		cfg := dpConfig(m)
		cfg.MicroBatchSize, cfg.TrainIters = 2, 3
		for _, l := range []ppLayout{
			{tp: 1, pp: 2, dp: 1},
			{tp: 1, pp: 2, dp: 1, split: gpt.PipelineSplit{VPP: 2}},
			{tp: 2, pp: 2, dp: 1, sp: true},
			{tp: 1, pp: 2, dp: 2, dc: ddp.Config{DistributedOptimizer: true, OverlapGradReduce: true, BucketSize: 1000}},
		} {
			l.split.PP = l.pp
			label := fmt.Sprintf("%s %v", name, l)
			want := runPP(t, cfg, l, train, valid)
			sim := cfg
			sim.Device = tensor.Sim
			got := runPP(t, sim, l, train, valid)
			sameRunBits(t, label, want, got)
		}
	}
}
