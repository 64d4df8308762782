package train

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/gotron/gotron/comm"
	"github.com/gotron/gotron/comm/inproc"
	"github.com/gotron/gotron/parallel"
	"github.com/gotron/gotron/parallel/ddp"
	"github.com/gotron/gotron/tensor"
)

// TestWeightHashAcrossDPReplicas: in a DP=2 run (with the distributed
// optimizer and the overlapped parameter gather) the replicas' hashes
// match before training and every 2 iterations; a replica whose parameter
// is changed (the test hook) stops every rank at the next check, naming
// the rank and the parameter.
func TestWeightHashAcrossDPReplicas(t *testing.T) {
	tr, va := dpDataset(t, 16)
	run := func(corrupt func(int64, int, []*tensor.Tensor)) ([]string, []error) {
		logs, errs := make([]string, 2), make([]error, 2)
		err := inproc.Run(context.Background(), 2, func(ctx context.Context, pg comm.ProcessGroup) error {
			g, err := parallel.NewGroups(pg, parallel.Config{})
			if err != nil {
				return err
			}
			c := dpConfig(dpModels()["llama"])
			c.TrainIters, c.EvalIters, c.CheckWeightHashInterval = 4, 0, 2
			c.DDP = ddp.Config{DistributedOptimizer: true, OverlapParamGather: true, OverlapGradReduce: true}
			c.Parallel = g
			var out strings.Builder
			c.Out = &out
			trn, err := New(c, tr, va)
			if err != nil {
				return err
			}
			trn.stepper.corruptReplica = corrupt
			_, errs[pg.Rank()] = trn.Run(ctx)
			logs[pg.Rank()] = out.String()
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return logs, errs
	}
	logs, errs := run(nil)
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	for _, w := range []string{">>> Weight hashes match after 0 iterations...", ">>> Weight hashes match after 2 iterations...", ">>> Weight hashes match after 4 iterations..."} {
		if !strings.Contains(logs[1], w) {
			t.Errorf("log lacks %q:\n%s", w, logs[1])
		}
	}
	_, errs = run(func(it int64, rank int, ps []*tensor.Tensor) {
		if it == 2 && rank == 1 {
			for _, p := range ps {
				if p.Name == "decoder.final_layernorm.weight" {
					v := p.Float32s()
					v[0] += 1e-3
				}
			}
		}
	})
	for r, err := range errs {
		want := "train: iteration 2: parameter hashes do not match across data-parallel replicas: world rank 1 (data-parallel rank 1) differ from world rank 0 (data-parallel rank 0) in decoder.final_layernorm.weight"
		if err == nil || err.Error() != want {
			t.Errorf("rank %d: %v, want %q", r, err, want)
		}
	}
}

// TestTestModeQKLayerNorm: --test-mode with --qk-layernorm checks the
// query/key layer norms across the data-parallel ranks before every
// iteration: a DP=2 run passes; a replica whose q_layernorm is changed
// before iteration 3 stops both ranks naming the parameter and the ranks.
func TestTestModeQKLayerNorm(t *testing.T) {
	tr, va := dpDataset(t, 16)
	run := func(corrupt func(int64, int, []*tensor.Tensor)) []error {
		errs := make([]error, 2)
		err := inproc.Run(context.Background(), 2, func(ctx context.Context, pg comm.ProcessGroup) error {
			g, err := parallel.NewGroups(pg, parallel.Config{})
			if err != nil {
				return err
			}
			m := dpModels()["llama"]
			m.QKLayerNorm = true
			c := dpConfig(m)
			c.TrainIters, c.EvalIters, c.TestMode = 4, 0, true
			c.Parallel = g
			trn, err := New(c, tr, va)
			if err != nil {
				return err
			}
			trn.stepper.corruptReplica = corrupt
			_, errs[pg.Rank()] = trn.Run(ctx)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return errs
	}
	for r, err := range run(nil) {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	const name = "decoder.layers.0.self_attention.q_layernorm.weight"
	errs := run(func(it int64, rank int, ps []*tensor.Tensor) {
		if it == 2 && rank == 1 {
			for _, p := range ps {
				if p.Name == name {
					p.Float32s()[0] += 0.5
				}
			}
		}
	})
	for r, err := range errs {
		want := fmt.Sprintf("train: iteration 3: --test-mode: Discrepancy between %s in DP ranks %d and %d. Diff: 0.5", name, 1-r, r)
		if err == nil || err.Error() != want {
			t.Errorf("rank %d: %v, want %q", r, err, want)
		}
	}
}
