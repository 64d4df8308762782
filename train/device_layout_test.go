package train

import (
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/gotron/gotron/comm/commtest"
	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/parallel/cp"
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

// TestSimDeviceCollectivesInPlace: with comm.SimDevice (what gotron train
// --device sim joins its ranks with) every parallel plan moves its tensors
// in place on the simulated device — tensor parallelism's mappings and
// vocab-parallel cross-entropy (with sequence parallelism), the pipeline's
// activations and gradients (1F1B and interleaved), context parallelism's
// exchanges (p2p ring, all-gather, a2a, a2a+p2p), and a TP×PP×CP layout — giving
// bit for bit the losses and parameters of the same run staging through
// the host, and those of one process within the equivalence tests' 1e-5;
// the device collectives are called, and the host copies drop. A group
// whose DeviceTensor refuses the tensors gets the staged run's copies and
// bits.
func TestSimDeviceCollectivesInPlace(t *testing.T) {
	const seq = 32
	train, valid := dpDataset(t, seq)
	cfg := dpConfig(cpModels()["gpt2"])
	cfg.Model.NumLayers = 4
	cfg.SeqLength, cfg.MicroBatchSize, cfg.TrainIters, cfg.EvalInterval = seq, 2, 3, 3
	ref := runDP(t, cfg, 0, ddp.Config{}, train, valid)[0]
	cfg.Device = tensor.Sim
	for _, l := range []cpLayout{
		{tp: 2, pp: 1, cp: 1, dp: 1, sp: true},
		{tp: 1, pp: 2, cp: 1, dp: 1},
		{tp: 1, pp: 2, cp: 1, dp: 1, vpp: 2},
		{tp: 1, pp: 1, cp: 2, dp: 1, comm: cp.P2P},
		{tp: 1, pp: 1, cp: 2, dp: 1, comm: cp.AllGather},
		{tp: 1, pp: 1, cp: 2, dp: 1, comm: cp.A2A},
		{tp: 1, pp: 1, cp: 4, dp: 1, comm: cp.A2AP2P, hier: []int{2, 2}},
		{tp: 2, pp: 2, cp: 2, dp: 1, sp: true, comm: cp.P2P},
	} {
		label := fmt.Sprintf("TP=%d SP=%v PP=%d VPP=%d CP=%d (%v)", l.tp, l.sp, l.pp, l.vpp, l.cp, l.comm)
		refuse := l.tp*l.pp*l.cp == 8
		before := tensor.SimTransfers()
		staged := runCPLayout(t, cfg, l, train, valid)
		mid := tensor.SimTransfers()
		sims := &commtest.SimDevices{}
		l.simCollectives = sims.Wrap
		inPlace := runCPLayout(t, cfg, l, train, valid)
		after := tensor.SimTransfers()
		calls := sims.Calls()
		sc, ic := mid.Sub(before), after.Sub(mid)
		t.Logf("%s: host copies in %d iterations and the evaluation, all ranks: staged %d in + %d out, in place %d in + %d out; %d device collectives",
			label, cfg.TrainIters, sc.FromHost, sc.ToHost, ic.FromHost, ic.ToHost, calls)
		if calls == 0 {
			t.Errorf("%s: the device collectives were never called", label)
		}
		// no plan stages a collective through the host any more
		for site := range ic.Sites {
			for _, staging := range []string{"tp.stage", "cp.stage", "pp.hostValues", "pp.(*Executor).finish", "ddp.", "train.setValues"} {
				if strings.HasPrefix(site, staging) {
					t.Errorf("%s: host copies at %s in place (%+v)", label, site, ic.Sites[site])
				}
			}
		}
		if ic.FromHost+ic.ToHost >= sc.FromHost+sc.ToHost {
			t.Errorf("%s: %d host copies in place, %d staged", label, ic.FromHost+ic.ToHost, sc.FromHost+sc.ToHost)
		}
		for r := range staged {
			s, g := staged[r], inPlace[r]
			for i := range s.res.Losses {
				if math.Float64bits(g.res.Losses[i]) != math.Float64bits(s.res.Losses[i]) {
					t.Fatalf("%s rank %d iteration %d: lm loss %v in place, %v staged", label, r, i+1, g.res.Losses[i], s.res.Losses[i])
				}
			}
			for pn, sv := range s.params {
				for i := range sv {
					if math.Float32bits(g.params[pn][i]) != math.Float32bits(sv[i]) {
						t.Fatalf("%s rank %d: final %s[%d] = %v in place, %v staged", label, r, pn, i, g.params[pn][i], sv[i])
					}
				}
			}
		}
		checkSameRun(t, label+" in place", ref, inPlace)
		if !refuse {
			continue
		}
		// a group whose DeviceTensor refuses every tensor: every plan
		// stages through the host, with the staged run's copies and bits
		refusers := &commtest.SimDevices{Refuse: true}
		l.simCollectives = refusers.Wrap
		before = tensor.SimTransfers()
		refused := runCPLayout(t, cfg, l, train, valid)
		rc := tensor.SimTransfers().Sub(before)
		if calls := refusers.Calls(); calls != 0 {
			t.Errorf("%s: %d device collectives on a refusing group", label, calls)
		}
		if rc.FromHost+rc.ToHost != sc.FromHost+sc.ToHost {
			t.Errorf("%s: %d host copies with a refusing group, %d staged", label, rc.FromHost+rc.ToHost, sc.FromHost+sc.ToHost)
		}
		for r := range staged {
			for i, want := range staged[r].res.Losses {
				if got := refused[r].res.Losses[i]; math.Float64bits(got) != math.Float64bits(want) {
					t.Fatalf("%s rank %d iteration %d: lm loss %v with a refusing group, %v staged", label, r, i+1, got, want)
				}
			}
		}
	}
}
