package train

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"

	"github.com/gotron/gotron/ckpt"
	"github.com/gotron/gotron/ckpt/safetensors"
	"github.com/gotron/gotron/comm"
	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/optim"
	"github.com/gotron/gotron/tensor"
)

// Checkpoints use package ckpt's Megatron layout (<save>/iter_0000100/,
// latest_checkpointed_iteration.txt; crash-safe, verified on load) with two
// tensor groups, "model" (parameters by Megatron name, F32) and "optimizer"
// (buffers keyed "<kind>/<param>"), and RunArgs as the checkpoint's args.

// RunArgs is what a checkpoint records beyond ckpt.Meta.
type RunArgs struct {
	Model          gpt.Config     `json:"model"`
	SeqLength      int            `json:"seq_length"`
	OptimizerKind  string         `json:"optimizer_kind,omitempty"`
	OptimizerSteps int64          `json:"optimizer_steps"`
	NaNIterations  int64          `json:"nan_iterations"`
	CLI            map[string]any `json:"cli,omitempty"`
	// TPDropoutOffsets are the positions of the per-tensor-parallel-rank
	// dropout streams (Megatron's model-parallel RNG), by TP rank.
	TPDropoutOffsets []uint64 `json:"tp_dropout_offsets,omitempty"`
	// RankDropoutOffsets are, by world rank, the positions of the dropout
	// streams (the stage's shared one, the per-TP-rank one) under pipeline
	// parallelism, where every stage draws from its own; restored when
	// PipelineSize and TensorSize (and the world size) match.
	RankDropoutOffsets [][2]uint64 `json:"rank_dropout_offsets,omitempty"`
	PipelineSize       int         `json:"pipeline_model_parallel_size,omitempty"`
	TensorSize         int         `json:"tensor_model_parallel_size,omitempty"`
	// LossScaler is --fp16's dynamic loss scaler state.
	LossScaler *optim.LossScalerState `json:"loss_scaler,omitempty"`
}

// save writes a checkpoint. Under data parallelism every rank takes part
// (the distributed optimizer's state is gathered whole, so the checkpoint
// does not depend on the data-parallel size), the writer rank writes, and
// every rank learns whether it succeeded.
func (t *Trainer) save(root string) error {
	if err := t.syncParams(); err != nil {
		return err
	}
	os := t.opt.State()
	if t.ddp != nil && !t.cfg.NoSaveOptim {
		full, err := t.ddp.FullState(t.cctx, os)
		if err != nil {
			return fmt.Errorf("train: --save: %w", err)
		}
		os = full
	}
	// Whole tensors: the pipeline stages sent to pipeline rank 0, then
	// gathered over the tensor-parallel group (collectives: every rank takes
	// part).
	var model map[string]safetensors.Tensor
	var err error
	if t.pipelined() {
		if err := t.gatherPipeline(&os, !t.cfg.NoSaveOptim); err != nil {
			return err
		}
	}
	if !t.pipelined() || t.par.PP.Rank() == 0 {
		if os, err = t.wholeOptimizerState(os); err != nil {
			return err
		}
		if model, err = t.wholeParams(); err != nil {
			return err
		}
	}
	if t.tpOffsets, err = t.gatherDropoutOffsets(); err != nil {
		return err
	}
	if t.rankOffsets, err = t.pipelineDropoutOffsets(); err != nil {
		return err
	}
	if t.isWriter() {
		err = t.write(root, model, os)
	}
	if t.par != nil {
		failed := []float32{0}
		if err != nil {
			failed[0] = 1
		}
		if cerr := t.par.World.AllReduce(t.cctx, comm.Float32s(failed), comm.Sum); cerr != nil {
			return fmt.Errorf("train: --save at iteration %d: %w", t.Iteration, cerr)
		}
		if err == nil && failed[0] > 0 {
			err = fmt.Errorf("train: --save at iteration %d failed on the writing rank (rank 0; see its log)", t.Iteration)
		}
	}
	if err != nil {
		return err
	}
	t.printf("saved checkpoint at iteration %7d to %s", t.Iteration, root)
	return nil
}

// write writes the (whole) model and optimizer state os under root.
func (t *Trainer) write(root string, model map[string]safetensors.Tensor, os optim.State) error {
	c := &ckpt.Checkpoint{Groups: map[string]map[string]safetensors.Tensor{"model": model}}
	if !t.cfg.NoSaveOptim {
		opt := map[string]safetensors.Tensor{}
		for name, buf := range os.Buffers {
			st, err := safetensors.FromFloat32(safetensors.F32, []int{len(buf)}, buf)
			if err != nil {
				return err
			}
			opt[name] = st
		}
		c.Groups["optimizer"] = opt
	}
	ra := RunArgs{Model: t.Model.Config, SeqLength: t.cfg.SeqLength, OptimizerKind: os.Kind,
		OptimizerSteps: os.Steps, NaNIterations: t.NaNIterations, CLI: t.cfg.Args, TPDropoutOffsets: t.tpOffsets, LossScaler: t.scalerState()}
	if t.pipelined() {
		ra.RankDropoutOffsets, ra.PipelineSize, ra.TensorSize = t.rankOffsets, t.ppSize(), max(t.par.Layout.Config.TP, 1)
	}
	args, err := json.Marshal(ra)
	if err != nil {
		return err
	}
	rng, _ := json.Marshal(t.rng.State())
	sched, _ := json.Marshal(t.sched.State())
	c.Meta = ckpt.Meta{ConsumedTrainSamples: t.Consumed, SkippedTrainSamples: t.Skipped, ConsumedValidSamples: t.ConsumedValid,
		FloatingPointOperationsSoFar: t.FLOPsSoFar, Args: args, RNGState: rng, Scheduler: sched}
	if err := ckpt.Save(context.Background(), root, int(t.Iteration), c); err != nil {
		return fmt.Errorf("train: --save: %w", err)
	}
	return nil
}

// LoadModel opens the latest checkpoint under dir and returns its model and
// arguments (for generate, score and convert).
func LoadModel(dir string) (*gpt.Model, RunArgs, error) {
	c, err := ckpt.Load(dir, -1)
	if err != nil {
		return nil, RunArgs{}, err
	}
	defer c.Close()
	var ra RunArgs
	if err := json.Unmarshal(c.Meta.Args, &ra); err != nil {
		return nil, RunArgs{}, fmt.Errorf("train: %s: args: %w", dir, err)
	}
	m, err := gpt.New(ra.Model, tensor.NewRNG(0))
	if err != nil {
		return nil, RunArgs{}, fmt.Errorf("train: %s: %w", dir, err)
	}
	if err := loadWeights(m, c); err != nil {
		return nil, RunArgs{}, err
	}
	return m, ra, nil
}

// loadWeights checks every parameter's name and shape and copies it into m.
func loadWeights(m *gpt.Model, c *ckpt.Checkpoint) error {
	want := map[string]ckpt.Spec{}
	for _, p := range m.Params() {
		want[p.Name] = ckpt.Spec{DType: safetensors.F32, Shape: p.Shape()}
	}
	if err := c.Expect("model", want); err != nil {
		return err
	}
	for _, p := range m.Params() {
		if err := c.Groups["model"][p.Name].DecodeFloat32(p.Float32s()); err != nil {
			return fmt.Errorf("train: checkpoint tensor %s: %w", p.Name, err)
		}
	}
	return nil
}

func (t *Trainer) load(root string) error {
	c, err := ckpt.Load(root, -1)
	if errors.Is(err, ckpt.ErrNoCheckpoint) {
		// Megatron's load_checkpoint: no tracker file, start from random
		// (what a first run with --save DIR --load DIR, or a restarted job
		// that never saved, sees).
		t.printf("WARNING: --load %s holds no checkpoint (no %s): training starts from scratch", root, ckpt.TrackerFile)
		return nil
	}
	if err != nil {
		return fmt.Errorf("train: --load: %w", err)
	}
	defer c.Close()
	if err := checkCheckpointArgs(root, t.Model.Config, c.Meta.Args); err != nil {
		return err
	}
	if t.region != nil {
		err = t.loadSlices(c)
	} else {
		err = loadWeights(t.Model, c)
	}
	if err != nil {
		return err
	}
	if t.pipelined() {
		t.loadedIntoStages(nil)
	}
	if t.cfg.Finetune {
		t.printf("loaded weights from %s (--finetune: iteration, optimizer and scheduler start fresh)", root)
		return nil
	}
	if _, hasOpt := c.Groups["optimizer"]; !hasOpt && len(c.Meta.Scheduler) == 0 {
		// A weights-only checkpoint (gotron convert, SaveModel): nothing to
		// resume but the weights.
		t.printf("loaded weights-only checkpoint from %s: training starts at iteration 0", root)
		return nil
	}
	var ra RunArgs
	if err := json.Unmarshal(c.Meta.Args, &ra); err != nil {
		return fmt.Errorf("train: --load %s: args: %w", root, err)
	}
	var rng tensor.RNGState
	var sched optim.SchedulerState
	if err := json.Unmarshal(c.Meta.RNGState, &rng); err != nil {
		return fmt.Errorf("train: --load %s: rng state: %w", root, err)
	}
	if err := json.Unmarshal(c.Meta.Scheduler, &sched); err != nil {
		return fmt.Errorf("train: --load %s: scheduler state: %w", root, err)
	}
	t.Iteration, t.Consumed, t.ConsumedValid = int64(c.Meta.Iteration), c.Meta.ConsumedTrainSamples, c.Meta.ConsumedValidSamples
	t.Skipped, t.NaNIterations, t.FLOPsSoFar = c.Meta.SkippedTrainSamples, ra.NaNIterations, c.Meta.FloatingPointOperationsSoFar
	t.skippedAtLog, t.nanAtLog = t.Skipped, t.NaNIterations
	if t.scaler != nil && ra.LossScaler != nil {
		if err := t.scaler.LoadState(*ra.LossScaler); err != nil {
			return fmt.Errorf("train: --load %s: %w", root, err)
		}
	}
	if !t.cfg.NoLoadRNG {
		if t.pipelined() {
			// Each stage has its own streams (forked by pipeline rank).
			t.restorePipelineDropout(ra)
		} else {
			t.rng.SetState(rng)
			t.restoreDropoutOffset(ra.TPDropoutOffsets)
		}
	}
	if err := t.sched.LoadState(sched); err != nil {
		return fmt.Errorf("train: --load %s: %w", root, err)
	}
	if !t.cfg.NoLoadOptim {
		group, ok := c.Groups["optimizer"]
		if !ok {
			return fmt.Errorf("train: --load %s has no optimizer state (saved with --no-save-optim?): add --no-load-optim", root)
		}
		st := optim.State{Kind: ra.OptimizerKind, Steps: ra.OptimizerSteps, Buffers: map[string][]float32{}}
		for name, x := range group {
			buf := make([]float32, x.NumElements())
			if err := x.DecodeFloat32(buf); err != nil {
				return fmt.Errorf("train: --load %s: optimizer %s: %w", root, name, err)
			}
			st.Buffers[name] = buf
		}
		st = t.sliceOptimizerState(st)
		if t.pipelined() {
			t.loadedIntoStages(&st)
		}
		if t.ddp != nil {
			if st, err = t.ddp.ShardState(st); err != nil {
				return fmt.Errorf("train: --load %s: %w", root, err)
			}
		}
		if err := t.opt.LoadState(st); err != nil {
			return fmt.Errorf("train: --load %s: %w", root, err)
		}
	}
	t.printf("loaded checkpoint from %s at iteration %d (consumed samples %d)", root, t.Iteration, t.Consumed)
	return nil
}

// SaveModel writes m alone (no optimizer state) as a checkpoint at the given
// iteration under dir: what conversion tools produce. train --load resumes
// from it with --no-load-optim (or --finetune).
func SaveModel(ctx context.Context, dir string, iteration int, m *gpt.Model, seqLength int, cli map[string]any) error {
	model := map[string]safetensors.Tensor{}
	for _, p := range m.Params() {
		model[p.Name] = safetensors.Tensor{DType: safetensors.F32, Shape: p.Shape(), Data: safetensors.Float32Bytes(p.Float32s())}
	}
	args, err := json.Marshal(RunArgs{Model: m.Config, SeqLength: seqLength, CLI: cli})
	if err != nil {
		return err
	}
	c := &ckpt.Checkpoint{Groups: map[string]map[string]safetensors.Tensor{"model": model}, Meta: ckpt.Meta{Args: args}}
	if err := ckpt.Save(ctx, dir, iteration, c); err != nil {
		return fmt.Errorf("train: save model: %w", err)
	}
	return nil
}

// ReadRunArgs returns the arguments recorded in the latest checkpoint under
// dir (the architecture for --use-checkpoint-args).
func ReadRunArgs(dir string) (RunArgs, error) {
	c, err := ckpt.Load(dir, -1)
	if err != nil {
		return RunArgs{}, err
	}
	defer c.Close()
	var ra RunArgs
	if err := json.Unmarshal(c.Meta.Args, &ra); err != nil {
		return RunArgs{}, fmt.Errorf("train: %s: args: %w", dir, err)
	}
	return ra, nil
}

func (t *Trainer) scalerState() *optim.LossScalerState {
	if t.scaler == nil {
		return nil
	}
	st := t.scaler.State()
	return &st
}

// checkSaveDir makes sure --save can be written before training starts (not
// at the first save, an interval of work later): it creates the directory
// and a probe file, and removes the probe.
func checkSaveDir(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("train: --save %s: cannot create the checkpoint directory: %w", dir, err)
	}
	f, err := os.CreateTemp(dir, ".gotron-write-check-*")
	if err != nil {
		return fmt.Errorf("train: --save %s: the checkpoint directory is not writable: %w", dir, err)
	}
	name := f.Name()
	f.Close()
	return os.Remove(name)
}
