package train

import (
	"context"
	"fmt"
	"testing"

	"github.com/gotron/gotron/comm"
	"github.com/gotron/gotron/comm/inproc"
	datagpt "github.com/gotron/gotron/data/gpt"
	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/parallel"
	"github.com/gotron/gotron/parallel/ddp"
)

// ppLayout is one parallel layout of a pipeline test.
type ppLayout struct {
	tp, pp, dp int
	split      gpt.PipelineSplit // its PP is set from pp
	sp         bool
	dc         ddp.Config
}

func (l ppLayout) String() string {
	return fmt.Sprintf("TP=%d PP=%d %+v DP=%d SP=%v %+v", l.tp, l.pp, l.split, l.dp, l.sp, l.dc)
}

// runPP trains cfg on TP·PP·DP inproc ranks. Every rank's result carries
// the whole parameters (gathered from the stages to pipeline rank 0 and
// over tensor parallelism), so checkSameRun compares them on every rank.
func runPP(t *testing.T, cfg Config, l ppLayout, train, valid datagpt.Source) []dpRun {
	t.Helper()
	n := l.tp * l.pp * l.dp
	runs := make([]dpRun, n)
	err := inproc.Run(context.Background(), n, func(ctx context.Context, pg comm.ProcessGroup) error {
		g, err := parallel.NewGroups(pg, parallel.Config{TP: l.tp, PP: l.pp})
		if err != nil {
			return err
		}
		c := cfg
		c.Parallel, c.DDP, c.SequenceParallel, c.Pipeline = g, l.dc, l.sp, l.split
		tr, err := New(c, train, valid)
		if err != nil {
			return fmt.Errorf("rank %d: %w", pg.Rank(), err)
		}
		res, err := tr.Run(ctx)
		if err != nil {
			return fmt.Errorf("rank %d: %w", pg.Rank(), err)
		}
		runs[pg.Rank()], err = pipelineRankRun(tr, g, res)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	shareGatheredParams(runs)
	return runs
}

// pipelineRankRun is a rank's dpRun after tr ran to res: the parameters
// synced and, pipelined, gathered from the stages to pipeline rank 0,
// which (as every rank without pipeline parallelism) carries them whole
// (shareGatheredParams gives them to the others); the device, and the
// buckets reduced during the last backward.
func pipelineRankRun(tr *Trainer, g *parallel.Groups, res Result) (dpRun, error) {
	if err := tr.stepper.syncParams(); err != nil {
		return dpRun{}, err
	}
	if tr.stepper.pipelined() {
		if err := tr.gatherPipeline(); err != nil {
			return dpRun{}, err
		}
	}
	run := dpRun{res: res, device: tr.stepper.localParams()[0].Device()}
	if d, ok := tr.stepper.reducer.(ddpGrads); ok {
		run.early = d.EarlyBuckets()
	}
	if !tr.stepper.pipelined() || g.PP.Rank() == 0 {
		ps, err := wholeFloat32s(tr)
		if err != nil {
			return dpRun{}, err
		}
		run.params = ps
	}
	return run, nil
}

// shareGatheredParams gives the ranks without the whole parameters those
// of rank 0 (pipeline rank 0 of the first replica gathered them).
func shareGatheredParams(runs []dpRun) {
	for r := range runs {
		if runs[r].params == nil {
			runs[r].params = runs[0].params
		}
	}
}

// TestPipelineParallelMatchesSingleProcess: Megatron's pipeline schedules
// (1F1B; interleaved with virtual stages) in gotron train, alone and
// composed with tensor (± sequence) and data parallelism (with the
// distributed optimizer and overlapped reduction), reproduce the
// single-process run at dropout 0: the same lm loss at each of 10
// iterations, the same validation loss and the same final parameters
// within 1e-5, for the tied GPT-2-style and the untied Llama-style model.
func TestPipelineParallelMatchesSingleProcess(t *testing.T) {
	train, valid := dpDataset(t, 16)
	for name, m := range dpModels() {
		m.NumLayers = 4
		cfg := dpConfig(m)
		cfg.MicroBatchSize = 2 // 4 micro-batches per iteration at DP=1, 2 at DP=2
		ref := runDP(t, cfg, 0, ddp.Config{}, train, valid)[0]
		for _, l := range []ppLayout{
			{tp: 1, pp: 2, dp: 1},
			{tp: 1, pp: 4, dp: 1},
			{tp: 1, pp: 2, dp: 1, split: gpt.PipelineSplit{VPP: 2}},
			{tp: 1, pp: 2, dp: 1, split: gpt.PipelineSplit{FirstLayers: 1, LastLayers: 3}},
			{tp: 2, pp: 2, dp: 1, sp: true},
			{tp: 1, pp: 2, dp: 2, dc: ddp.Config{OverlapGradReduce: true, BucketSize: 500}},
			{tp: 2, pp: 2, dp: 2, dc: ddp.Config{DistributedOptimizer: true, OverlapGradReduce: true, BucketSize: 500}},
		} {
			if testing.Short() && l.tp*l.pp*l.dp > 4 {
				continue
			}
			l.split.PP = l.pp
			got := runPP(t, cfg, l, train, valid)
			checkSameRun(t, name+" "+l.String(), ref, got)
			if l.dc.OverlapGradReduce {
				for r, g := range got {
					if g.early < 1 {
						t.Errorf("%s %v rank %d: no bucket reduced during the last micro-batch's backward", name, l, r)
					}
				}
			}
		}
	}
}

// TestPipelineParallelCheckpointReshards: a PP=2 checkpoint (whole tensors,
// gathered from the stages) resumes at PP=1, 2 and 4, and PP=2 with virtual
// stages, with the losses of the uninterrupted run within 1e-5; with
// dropout on, PP=2 resumes bit-identically (each stage's streams continue).
func TestPipelineParallelCheckpointReshards(t *testing.T) {
	train, valid := dpDataset(t, 16)
	m := dpModels()["gpt2"]
	m.NumLayers = 4
	cfg := dpConfig(m)
	cfg.MicroBatchSize = 2
	pp2 := ppLayout{tp: 1, pp: 2, dp: 1, split: gpt.PipelineSplit{PP: 2}}
	straight := runPP(t, cfg, pp2, train, valid)[0]
	dir := t.TempDir()
	first := cfg
	first.Save, first.ExitInterval = dir, 5
	a := runPP(t, first, pp2, train, valid)[0]
	for _, l := range []ppLayout{
		{tp: 1, pp: 1, dp: 1}, pp2, {tp: 1, pp: 4, dp: 1, split: gpt.PipelineSplit{PP: 4}},
		{tp: 1, pp: 2, dp: 1, split: gpt.PipelineSplit{PP: 2, VPP: 2}},
	} {
		second := cfg
		second.Load = dir
		b := runPP(t, second, l, train, valid)[0]
		got := append(append([]float64(nil), a.res.Losses...), b.res.Losses...)
		for i := range straight.res.Losses {
			if !relClose(got[i], straight.res.Losses[i], 1e-5) {
				t.Fatalf("PP=2 checkpoint resumed at %v: iteration %d loss %.9g, straight %.9g", l, i+1, got[i], straight.res.Losses[i])
			}
		}
	}

	cfg.Model.HiddenDropout, cfg.Model.AttentionDropout = 0.1, 0.1
	straight = runPP(t, cfg, pp2, train, valid)[0]
	first.Model = cfg.Model
	first.Save = t.TempDir()
	a = runPP(t, first, pp2, train, valid)[0]
	second := cfg
	second.Load = first.Save
	b := runPP(t, second, pp2, train, valid)[0]
	got := append(append([]float64(nil), a.res.Losses...), b.res.Losses...)
	for i := range straight.res.Losses {
		if got[i] != straight.res.Losses[i] {
			t.Fatalf("dropout on: iteration %d: loss %v after resume, %v straight (must be bit-identical)", i+1, got[i], straight.res.Losses[i])
		}
	}
}
