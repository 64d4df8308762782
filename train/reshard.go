package train

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"

	"github.com/gotron/gotron/ckpt"
	"github.com/gotron/gotron/comm"
	"github.com/gotron/gotron/comm/inproc"
	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/optim"
	"github.com/gotron/gotron/parallel"
	"github.com/gotron/gotron/parallel/ddp"
)

// ReshardLayout is the parallel layout Reshard writes a checkpoint for.
type ReshardLayout struct {
	TP, PP, DP int // 0 means 1
	// Pipeline holds virtual stages and an uneven first/last split (its PP
	// is set from PP).
	Pipeline             gpt.PipelineSplit
	DistributedOptimizer bool
}

// Reshard rewrites the latest checkpoint under src (any layout, either
// format) under dst as the given layout saves it: TP·PP·DP in-process ranks
// each load what they hold and write their own shards. The result is what a
// run at that layout would have saved: same iteration, samples, optimizer,
// scheduler and RNG state. (Any layout loads any checkpoint; resharding
// offline gives each rank of the new layout its own file to read.) It
// returns the iteration written.
func Reshard(ctx context.Context, src, dst string, l ReshardLayout) (int, error) {
	if a, b := filepath.Clean(src), filepath.Clean(dst); a == b {
		return 0, fmt.Errorf("train: reshard: the output directory is the input %s: write to another directory", src)
	}
	r, err := ckpt.Open(src, -1)
	if err != nil {
		return 0, err
	}
	var ra RunArgs
	err = json.Unmarshal(r.Meta.Args, &ra)
	it, hasOptim, hasSched := r.Meta.Iteration, r.Has(ckpt.GroupOptimizer), len(r.Meta.Scheduler) > 0
	consumed := r.Meta.ConsumedTrainSamples
	r.Close()
	if err != nil {
		return 0, fmt.Errorf("train: reshard %s: args: %w", src, err)
	}
	l.TP, l.PP, l.DP = max(l.TP, 1), max(l.PP, 1), max(l.DP, 1)
	sf := optim.DefaultSchedulerFlags()
	sf.LR, sf.UseCheckpointOptParamScheduler = 1, true // the checkpoint's schedule
	cfg := Config{Model: ra.Model, SeqLength: ra.SeqLength, MicroBatchSize: 1, GlobalBatchSize: l.DP * l.PP,
		TrainSamples: max(consumed, 1), Schedule: sf, Load: src, Args: ra.CLI, FP16: ra.LossScaler != nil,
		NoLoadOptim: !hasOptim, NoSaveOptim: !hasOptim, EvalIters: 0, carryFP8: true}
	if ra.OptimizerKind == "sgd" {
		cfg.Optimizer = SGD
	}
	if !hasSched {
		cfg.Finetune = true // weights only: nothing else to carry
	}
	world := l.TP * l.PP * l.DP
	rankErrs := make([]error, world) // a bad layout fails every rank alike: report the first
	err = inproc.Run(ctx, world, func(ctx context.Context, pg comm.ProcessGroup) (err error) {
		defer func() { rankErrs[pg.Rank()] = err }()
		g, err := parallel.NewGroups(pg, parallel.Config{TP: l.TP, PP: l.PP})
		if err != nil {
			return err
		}
		c := cfg
		c.Parallel, c.DDP, c.Pipeline = g, ddp.Config{DistributedOptimizer: l.DistributedOptimizer}, l.Pipeline
		c.Pipeline.PP = l.PP
		tr, err := New(c, MockSource{SeqLength: c.SeqLength, VocabSize: c.Model.VocabSize}, nil)
		if err != nil {
			return err
		}
		tr.stepper.cctx = ctx
		return tr.checkpointer.save(dst, false)
	})
	for _, e := range rankErrs {
		if e != nil {
			err = e
			break
		}
	}
	if err != nil {
		return 0, fmt.Errorf("train: reshard %s → %s at TP=%d PP=%d DP=%d: %w", src, dst, l.TP, l.PP, l.DP, err)
	}
	return it, nil
}
