package train

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/gotron/gotron/ckpt"
	"github.com/gotron/gotron/ckpt/megatron"
	"github.com/gotron/gotron/ckpt/safetensors"
	"github.com/gotron/gotron/comm"
	"github.com/gotron/gotron/internal/checked"
	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/optim"
	"github.com/gotron/gotron/parallel"
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
	// CalculatePerTokenLoss is --calculate-per-token-loss, as Megatron's
	// args record it (absent: off, as every checkpoint before the flag).
	CalculatePerTokenLoss bool `json:"calculate_per_token_loss,omitempty"`
	// Rerun is the rerun state machine's state (with --rerun-mode other
	// than disabled), as Megatron's checkpoint "rerun_state_machine".
	Rerun *RerunCheckpoint `json:"rerun_state_machine,omitempty"`
}

// checkpointer saves and resumes a run: the stepper's parameters and
// optimizer state in the sharded format (shardckpt.go: which rank writes
// and reads which blocks), the position, the RNG, scheduler and loss-scaler
// state, and the asynchronous save in flight (--async-save).
type checkpointer struct {
	*position
	cfg     *Config
	par     *parallel.Groups
	stepper *stepper // what is saved and restored
	printf  func(format string, args ...any)
	rawf    func(format string, args ...any) // a line without the reporter's timestamp (Megatron's print_rank_0)

	pending     *pendingSave         // the --async-save in flight
	progress    *progressLog         // --log-progress's job log (world rank 0 with --save); nil otherwise
	snapshot    []float32            // its copy of this rank's shards, reused by the next
	tpOffsets   []uint64             // every TP rank's rankRNG offset, for the checkpoint being written
	rankOffsets [][2]uint64          // every rank's dropout stream offsets under pipelining, for the checkpoint
	rerun       *RerunCheckpoint     // the rerun state machine's state, all ranks', for the checkpoint
	fp8Carried  map[string][]float32 // a loaded checkpoint's FP8 delayed state, rewritten as is (Config.carryFP8)

	// shownRoot and shownFormat, when set, are what the save and load
	// messages name instead of the directory and format written or read:
	// --ckpt-format torch's staging (torchckpt.go).
	shownRoot, shownFormat string
}

// save writes a sharded checkpoint of the current iteration under root:
// every rank writes the shards it owns (see shardckpt.go) in parallel, then
// world rank 0 merges their reports into checkpoint.json, renames the
// directory into place and moves the tracker. Every rank takes part and
// learns whether it succeeded. With async (--async-save) the shards are
// copied and written in the background; pollSave finalises the save at a
// later iteration.
func (ck *checkpointer) save(root string, async bool) error {
	// Megatron's save_checkpoint_and_time: the save-checkpoint timer (the
	// blocking part of an asynchronous save), logged after it.
	tm := ck.stepper.tm
	tm.start(timerSaveCheckpoint, 0)
	save := ck.saveUntimed
	if ck.cfg.CkptFormat == CkptFormatTorch {
		save = func(root string, _ bool) error { return ck.saveTorch(root) }
	}
	if err := save(root, async); err != nil {
		tm.stop(timerSaveCheckpoint)
		return err
	}
	tm.stop(timerSaveCheckpoint)
	block, err := tm.log(ck.stepper.cctx, ck.par, []string{timerSaveCheckpoint}, 1, true)
	if err == nil && block != "" {
		ck.rawf("%s", block)
	}
	return err
}

func (ck *checkpointer) saveUntimed(root string, async bool) error {
	if err := ck.waitSave(); err != nil { // at most one save in flight
		return err
	}
	if err := ck.stepper.syncParams(); err != nil {
		return err
	}
	var err error
	if ck.tpOffsets, err = ck.stepper.gatherDropoutOffsets(); err != nil {
		return err
	}
	if ck.rankOffsets, err = ck.stepper.pipelineDropoutOffsets(); err != nil {
		return err
	}
	if ck.rerun, err = ck.stepper.rerunCheckpointState(); err != nil {
		return err
	}
	it := int(ck.Iteration)
	ck.rawf("[%s] saving checkpoint at iteration %7d to %s in %s format", ck.timestamp(), it, ck.shown(root), ck.shownFmt())
	if isWriter(ck.par) {
		err = checkTrackerForward(root, ck.Iteration)
		if err == nil {
			err = ckpt.BeginSharded(root, it)
		}
	}
	if err = ck.agreeSave(err, "prepare"); err != nil {
		return err
	}
	var st *optim.State
	var ost optim.State
	if v, ok := ck.stepper.opt.(optim.StateViewer); ok {
		ost = v.StateView() // copied below when the save is asynchronous
	} else {
		ost = ck.stepper.opt.State()
	}
	if !ck.cfg.NoSaveOptim {
		st = &ost
	}
	meta, err := ck.checkpointMeta(ost)
	ps := &pendingSave{root: root, iteration: it, meta: meta, started: ck.cfg.Now(), async: async}
	if err == nil {
		var pieces []ckpt.Piece
		pieces, err = ck.checkpointPieces(st)
		for _, p := range pieces {
			ps.bytes += 4 * int64(len(p.Data))
		}
		write := func() error {
			var err error
			if async {
				err = ckpt.WriteShardsInBackground(context.Background(), root, it, ck.worldRank(), pieces, ck.cfg.AsyncSaveRate*1e6)
			} else {
				err = ckpt.WriteShards(context.Background(), root, it, ck.worldRank(), pieces)
			}
			ps.wrote = ck.cfg.Now().Sub(ps.started)
			return err
		}
		if err == nil && async {
			// The parameters and optimizer state stay as they are until
			// the next optimizer step: the copy overlaps the next forward
			// and backward, and only that step waits for it (waitSnapshot).
			ps.done, ps.snap = make(chan error, 1), ck.newSnapshot(pieces)
			release := addWriterProc()
			go func() {
				// The copy and the write at the lowest priority, on a
				// processor of their own: they run while training leaves
				// a core idle, and the optimizer step finishes the copy.
				lowerWriterPriority()
				ps.snap.copyInBackground()
				err := write()
				release()
				ps.done <- err
			}()
			ck.pending = ps
			if err := ck.progress.saved("Saving async checkpoint", ck.Iteration, ck.FLOPsSoFar, ck.Consumed, ck.cfg.SeqLength); err != nil {
				return err
			}
			ck.printf("--async-save: iteration %d's checkpoint is written in the background (%.1f MB of this rank's shards copied during the next iteration)", it, float64(ps.bytes)/1e6)
			return nil
		}
		if err == nil {
			err = write()
		}
	}
	return ck.finishSave(ps, err)
}

// finishSave completes a save whose shards this rank wrote (or failed to
// write, err): every rank agrees, then rank 0 finalises it.
func (ck *checkpointer) finishSave(ps *pendingSave, err error) error {
	if err = ck.agreeSave(err, "write"); err != nil {
		if isWriter(ck.par) {
			ckpt.AbortSharded(ps.root, ps.iteration)
		}
		return err
	}
	var prev int
	if isWriter(ck.par) {
		// The latest checkpoint before this one: --save-retain-interval's
		// candidate for deletion once this one is in place.
		prev, _ = ckpt.Latest(ps.root)
		err = ckpt.FinishSharded(ps.root, ps.iteration, ps.meta, ck.checkpointLayout())
	}
	if err = ck.agreeSave(err, "finalise"); err != nil {
		return err
	}
	if isWriter(ck.par) {
		if ps.async {
			err = ck.progress.append(fmt.Sprintf("Saved async checkpoint\tIteration: %d", ps.iteration))
		} else {
			err = ck.progress.saved("Saved checkpoint", int64(ps.iteration), ck.FLOPsSoFar, ck.Consumed, ck.cfg.SeqLength)
		}
		if err != nil {
			return err
		}
		deleted, err := retainCheckpoints(ps.root, int64(prev), int64(ps.iteration), ck.cfg.SaveRetainInterval, ck.rawf)
		if err != nil {
			return err
		}
		if deleted > 0 {
			if err := ck.progress.append(fmt.Sprintf("Deleted checkpoint\tIteration: %d", deleted)); err != nil {
				return err
			}
		}
	}
	// Megatron's line, then gotron's numbers.
	mb := float64(ps.bytes) / 1e6
	saved := fmt.Sprintf("  [%s] successfully saved checkpoint from iteration %7d to %s %s", ck.timestamp(), ps.iteration, ck.shown(ps.root), ck.rankTag())
	if ps.async {
		ck.rawf("%s (in the background: this rank's %.1f MB copied in %.3f s, written in %.3f s, %.0f MB/s; finalised after iteration %d; %.0f%% of the copy left to the optimizer step)",
			saved, mb, ps.snap.took.Seconds(), ps.wrote.Seconds(), mb/ps.wrote.Seconds(), ck.Iteration, 100*ps.snap.stepShare())
	} else {
		took := ck.cfg.Now().Sub(ps.started)
		ck.rawf("%s (in %.3f s: this rank wrote %.1f MB, %.0f MB/s)", saved, took.Seconds(), mb, mb/took.Seconds())
	}
	return nil
}

// shown is the directory the save and load messages name.
func (ck *checkpointer) shown(root string) string {
	if ck.shownRoot != "" {
		return ck.shownRoot
	}
	return root
}

// shownFmt is the format the save message names.
func (ck *checkpointer) shownFmt() string {
	if ck.shownFormat != "" {
		return ck.shownFormat
	}
	return ckpt.FormatName
}

// timestamp is the time as Megatron's checkpoint messages print it.
func (ck *checkpointer) timestamp() string {
	return ck.cfg.Now().Format("2006-01-02 15:04:05.000000")
}

// rankTag is the "[ t 1/TP, gtp_remat 1/1, p 1/PP ]" of Megatron's save and
// load messages: the coordinates of rank 0, which prints them (1-based),
// and the layout's sizes; gotron has no GTP weight rematerialisation.
func (ck *checkpointer) rankTag() string {
	tp, pp := 1, 1
	if ck.par != nil && ck.par.Layout != nil {
		tp, pp = ck.par.Layout.Config.TP, ck.par.Layout.Config.PP
	}
	return fmt.Sprintf("[ t 1/%d, gtp_remat 1/1, p 1/%d ]", tp, pp)
}

// pendingSave is a save this rank is writing; an asynchronous one stays in
// flight (checkpointer.pending) until pollSave finalises it.
type pendingSave struct {
	root      string
	iteration int
	meta      ckpt.Meta
	bytes     int64 // of this rank's shards
	started   time.Time
	async     bool
	wrote     time.Duration // from the start until this rank's shards were written
	snap      *snapshot     // their copy (async)
	done      chan error    // this rank's WriteShards result (async)
}

// waitSnapshot waits until the save in flight has copied this rank's
// shards: the optimizer step is about to change them.
func (ck *checkpointer) waitSnapshot() {
	if ck.pending != nil {
		ck.pending.snap.finish()
	}
}

// pollSave finalises the save in flight once every rank has written its
// shards; with wait it waits for them. Every rank calls it at the same
// points (the start of every iteration, before a save, at the end).
func (ck *checkpointer) pollSave(wait bool) error {
	ps := ck.pending
	if ps == nil {
		return nil
	}
	var werr error
	written := false
	if wait {
		werr, written = <-ps.done, true
	} else {
		select {
		case werr = <-ps.done:
			written = true
		default:
		}
	}
	if written {
		// Read once: keep the result for the next poll if others lag.
		ps.done <- werr
	}
	if ck.par.World.Size() > 1 {
		v := []float32{0}
		if written {
			v[0] = 1
		}
		if err := ck.par.World.AllReduce(ck.stepper.cctx, comm.Float32s(v), comm.Sum); err != nil {
			return fmt.Errorf("train: asynchronous save of iteration %d: %w", ps.iteration, err)
		}
		written = int(v[0]) == ck.par.World.Size()
	}
	if !written {
		return nil
	}
	werr = <-ps.done
	ck.pending = nil
	return ck.finishSave(ps, werr)
}

// waitSave waits for the save in flight, if any, and finalises it.
func (ck *checkpointer) waitSave() error { return ck.pollSave(true) }

// agreeSave tells every rank whether step of a save failed on any rank: it
// returns this rank's error, or one naming the step if another rank failed.
func (ck *checkpointer) agreeSave(err error, step string) error {
	if ck.par.World.Size() == 1 {
		if err != nil {
			return fmt.Errorf("train: --save at iteration %d: %w", ck.Iteration, err)
		}
		return nil
	}
	failed := []float32{0}
	if err != nil {
		failed[0] = 1
	}
	if cerr := ck.par.World.AllReduce(ck.stepper.cctx, comm.Float32s(failed), comm.Sum); cerr != nil {
		return fmt.Errorf("train: --save at iteration %d: %w", ck.Iteration, cerr)
	}
	switch {
	case err != nil:
		return fmt.Errorf("train: --save at iteration %d (rank %d): %w", ck.Iteration, ck.worldRank(), err)
	case failed[0] > 0:
		return fmt.Errorf("train: --save at iteration %d failed to %s on %d rank(s): see their log", ck.Iteration, step, int(failed[0]))
	}
	return nil
}

func (ck *checkpointer) worldRank() int { return ck.par.World.Rank() }

// checkpointLayout is this run's parallel layout, recorded in the
// checkpoint for inspection.
func (ck *checkpointer) checkpointLayout() ckpt.Layout {
	l := ckpt.Layout{WorldSize: ck.par.World.Size(), TensorParallel: ck.par.TP.Size(), PipelineParallel: ck.par.PP.Size(),
		DataParallel: ck.par.DP.Size(), DistributedOptimizer: ck.cfg.DDP.DistributedOptimizer}
	if ck.stepper.pipelined() {
		l.VirtualStages = len(ck.stepper.stages)
	}
	return l
}

// checkpointMeta is the checkpoint's metadata beside the tensors: samples,
// arguments, RNG and scheduler state, the optimizer's kind and steps (ost).
func (ck *checkpointer) checkpointMeta(ost optim.State) (ckpt.Meta, error) {
	ra := RunArgs{Model: ck.cfg.Model, SeqLength: ck.cfg.SeqLength, OptimizerKind: ost.Kind,
		OptimizerSteps: ost.Steps, NaNIterations: ck.NaNIterations, CLI: ck.cfg.Args, TPDropoutOffsets: ck.tpOffsets, LossScaler: ck.scalerState(),
		CalculatePerTokenLoss: ck.cfg.CalculatePerTokenLoss, Rerun: ck.rerun}
	if ck.stepper.pipelined() {
		ra.RankDropoutOffsets, ra.PipelineSize, ra.TensorSize = ck.rankOffsets, ck.par.PP.Size(), ck.par.TP.Size()
	}
	args, err := json.Marshal(ra)
	if err != nil {
		return ckpt.Meta{}, err
	}
	rng, _ := json.Marshal(ck.stepper.rng.State())
	sched, _ := json.Marshal(ck.stepper.sched.State())
	return ckpt.Meta{Iteration: int(ck.Iteration), ConsumedTrainSamples: ck.Consumed, SkippedTrainSamples: ck.Skipped, ConsumedValidSamples: ck.ConsumedValid,
		FloatingPointOperationsSoFar: ck.FLOPsSoFar, Args: args, RNGState: rng, Scheduler: sched}, nil
}

// LoadModel opens the latest checkpoint under dir and returns its model and
// arguments (for generate, score and convert).
func LoadModel(dir string) (*gpt.Model, RunArgs, error) {
	r, err := ckpt.Open(dir, -1)
	if err != nil {
		return nil, RunArgs{}, err
	}
	defer r.Close()
	var ra RunArgs
	if err := json.Unmarshal(r.Meta.Args, &ra); err != nil {
		return nil, RunArgs{}, fmt.Errorf("train: %s: args: %w", dir, err)
	}
	m, err := gpt.New(ra.Model, tensor.NewRNG(0))
	if err != nil {
		return nil, RunArgs{}, fmt.Errorf("train: %s: %w", dir, err)
	}
	if err := loadWeights(m, r); err != nil {
		return nil, RunArgs{}, err
	}
	return m, ra, nil
}

// LoadModelPart is LoadModel for one decoding rank: it builds only part's
// tensors (gpt.NewPart: a pipeline stage's, sliced for a tensor-parallel
// rank, its experts those of an expert-parallel rank) and reads from the checkpoint only the blocks they hold, so the
// rank never holds the whole model. The values are LoadModel's (the
// same bits Parallelize and SplitStages would cut from it). It also
// returns how many values it read. partOf says the part for the
// checkpoint's model configuration (its error is returned as is).
func LoadModelPart(dir string, partOf func(gpt.Config) (gpt.Part, error)) (*gpt.Model, RunArgs, int64, error) {
	r, err := ckpt.Open(dir, -1)
	if err != nil {
		return nil, RunArgs{}, 0, err
	}
	defer r.Close()
	var ra RunArgs
	if err := json.Unmarshal(r.Meta.Args, &ra); err != nil {
		return nil, RunArgs{}, 0, fmt.Errorf("train: %s: args: %w", dir, err)
	}
	if ra.Model.MLA.Enabled && !ra.Model.QKLayerNorm && hasMLALatentNorms(r) {
		// saved before gotron's MLA built its latent norms only with
		// --qk-layernorm (as Megatron): the norms are in the checkpoint and
		// the model had them
		ra.Model.QKLayerNorm = true
	}
	part, err := partOf(ra.Model)
	if err != nil {
		return nil, RunArgs{}, 0, err
	}
	m, err := gpt.NewPart(ra.Model, tensor.NewRNG(0), part)
	if err != nil {
		return nil, RunArgs{}, 0, fmt.Errorf("train: %s: %w", dir, err)
	}
	ps := append(m.Params(), m.Buffers()...)
	want := map[string]ckpt.Spec{}
	for _, p := range ps {
		style, rank, size := part.SliceOf(&m.Config, p.Name)
		full, _ := sliceBlocks(style, p.Shape(), rank, size)
		want[p.Name] = ckpt.Spec{DType: safetensors.F32, Shape: full}
	}
	// The other ranks' tensors are theirs to check.
	if err := r.Expect(ckpt.GroupModel, want, true); err != nil {
		return nil, RunArgs{}, 0, err
	}
	for _, p := range ps {
		style, rank, size := part.SliceOf(&m.Config, p.Name)
		full, blocks := sliceBlocks(style, p.Shape(), rank, size)
		if err := staged(p, func(v []float32) error {
			for _, b := range blocks {
				if err := r.Read(ckpt.GroupModel, p.Name, full, b.Block, v[b.start:b.start+b.Len()]); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			return nil, RunArgs{}, 0, fmt.Errorf("train: %w", err)
		}
	}
	return m, ra, r.ValuesRead(), nil
}

// loadWeights checks every parameter's (and buffer's: an MoE router's
// expert bias) name and shape and reads it whole into m (the model group
// only: the optimizer state is not read).
func loadWeights(m *gpt.Model, r *ckpt.Reader) error {
	ps := append(m.Params(), m.Buffers()...)
	want := map[string]ckpt.Spec{}
	for _, p := range ps {
		want[p.Name] = ckpt.Spec{DType: safetensors.F32, Shape: p.Shape()}
	}
	if err := r.Expect(ckpt.GroupModel, want, false); err != nil {
		return err
	}
	for _, p := range ps {
		if err := staged(p, func(v []float32) error {
			return r.Read(ckpt.GroupModel, p.Name, p.Shape(), ckpt.Whole(p.Shape()), v)
		}); err != nil {
			return fmt.Errorf("train: %w", err)
		}
	}
	return nil
}

// load resumes from the latest checkpoint under root: gotron's format,
// or Megatron's legacy one with --ckpt-format torch (torchckpt.go).
func (ck *checkpointer) load(root string) error {
	if ck.cfg.CkptFormat == CkptFormatTorch {
		return ck.loadTorch(root)
	}
	return ck.loadGotron(root)
}

// loadGotron resumes from the latest checkpoint under root, written by any
// parallel layout (or by SaveModel, or format 1): each rank reads the
// blocks of the parameters and optimizer buffers it holds.
func (ck *checkpointer) loadGotron(root string) error {
	start := ck.cfg.Now()
	r, err := ckpt.Open(root, -1)
	if errors.Is(err, ckpt.ErrNoCheckpoint) && ck.cfg.CkptConvertFormat != "" {
		return fmt.Errorf("train: --ckpt-convert-format: --load %s holds no checkpoint (%s)", root, ckpt.TrackerFile) // Megatron's exit_on_missing_checkpoint
	}
	if errors.Is(err, ckpt.ErrNoCheckpoint) {
		// Megatron's load_checkpoint: no tracker file, start from random
		// (what a first run with --save DIR --load DIR, or a restarted job
		// that never saved, sees).
		ck.rawf("WARNING: could not find the metadata file %s", filepath.Join(root, ckpt.TrackerFile))
		ck.rawf("    will not load any checkpoints and will start from random")
		return nil
	}
	if err != nil {
		if megatron.IsMegatronDir(root) {
			return fmt.Errorf("train: --load %s is a Megatron-LM (torch format) checkpoint: resume from it with --ckpt-format torch (in the TP/PP layout that saved it), or convert it first with 'gotron convert --from megatron --load %s --save DIR', then --load DIR", root, root)
		}
		return fmt.Errorf("train: --load: %w", err)
	}
	defer r.Close()
	if ck.cfg.VerifyIntegrity {
		if err := ck.verifyIntegrity(root, r); err != nil {
			return err
		}
	}
	if ck.shownFormat == CkptFormatTorch {
		ck.rawf(" loading checkpoint from %s at iteration %d", ck.shown(root), r.Meta.Iteration) // Megatron's words for the torch format
	} else {
		ck.rawf(" loading distributed checkpoint from %s at iteration %d", root, r.Meta.Iteration)
	}
	if err := checkCheckpointArgs(root, ck.cfg.Model, r.Meta.Args); err != nil {
		if !ck.cfg.Finetune {
			return err
		}
		// Megatron's load_checkpoint skips check_checkpoint_args under
		// --finetune; the shapes are still checked below.
		ck.printf("WARNING: --finetune loads the weights anyway: %v", err)
	}
	weightsOnly := !r.Has(ckpt.GroupOptimizer) && len(r.Meta.Scheduler) == 0
	loadOptim := !ck.cfg.Finetune && !weightsOnly && !ck.cfg.NoLoadOptim
	var st optim.State
	if loadOptim {
		// The keys and lengths this rank's optimizer keeps (SGD without
		// momentum keeps none, and its checkpoints have no optimizer group).
		st = ck.stepper.opt.State()
		if len(st.Buffers) > 0 && !r.Has(ckpt.GroupOptimizer) {
			return fmt.Errorf("train: --load %s has no optimizer state (saved with --no-save-optim?): add --no-load-optim", root)
		}
	}
	var want *optim.State
	if loadOptim {
		want = &st
	}
	if err := ck.expectTensors(r, want); err != nil {
		return err
	}
	if err := ck.stepper.syncParams(); err != nil { // FSDP: whole parameters to read into
		return err
	}
	if err := ck.readParams(r); err != nil {
		return err
	}
	if err := ck.readFP8State(root, r); err != nil {
		return err
	}
	// the bfloat16 copies are rebuilt from the loaded float32 parameters
	// (a checkpoint holds no copy of its own, as Megatron's holds its
	// model parameters once)
	ck.stepper.bf16w.Invalidate()
	if f := ck.stepper.fsdp; f != nil {
		if err := f.TakeShards(); err != nil {
			return fmt.Errorf("train: --load: %w", err)
		}
	}
	if ck.cfg.Finetune {
		ck.rawf("  successfully loaded checkpoint from %s %s at iteration 0 (--finetune: weights only; iteration, optimizer and scheduler start fresh)", ck.shown(root), ck.rankTag())
		return nil
	}
	if weightsOnly {
		// A weights-only checkpoint (gotron convert, SaveModel): nothing to
		// resume but the weights.
		ck.rawf("  successfully loaded checkpoint from %s %s at iteration 0 (a weights-only checkpoint: training starts at iteration 0)", ck.shown(root), ck.rankTag())
		return nil
	}
	var ra RunArgs
	if err := json.Unmarshal(r.Meta.Args, &ra); err != nil {
		return fmt.Errorf("train: --load %s: args: %w", root, err)
	}
	var rng tensor.RNGState
	var sched optim.SchedulerState
	if err := json.Unmarshal(r.Meta.RNGState, &rng); err != nil {
		return fmt.Errorf("train: --load %s: rng state: %w", root, err)
	}
	if err := json.Unmarshal(r.Meta.Scheduler, &sched); err != nil {
		return fmt.Errorf("train: --load %s: scheduler state: %w", root, err)
	}
	if err := checkResumePosition(root, r.Meta, ra, ck.cfg, ck.trainIters); err != nil {
		return err
	}
	if ra.CalculatePerTokenLoss != ck.cfg.CalculatePerTokenLoss {
		// Not refused (Megatron does not compare it either): both objectives
		// are token means of the same scale, so the optimizer state carries
		// over; only the weighting of micro-batches changes.
		ck.printf("the checkpoint %s was trained %s --calculate-per-token-loss, this run %s it (the loss was and is a token mean; only how micro-batches with different token counts weigh changes)",
			root, withOrWithout(ra.CalculatePerTokenLoss), withOrWithout(ck.cfg.CalculatePerTokenLoss))
	}
	ck.Iteration, ck.Consumed, ck.ConsumedValid = int64(r.Meta.Iteration), r.Meta.ConsumedTrainSamples, r.Meta.ConsumedValidSamples
	ck.Skipped, ck.NaNIterations, ck.FLOPsSoFar = r.Meta.SkippedTrainSamples, ra.NaNIterations, r.Meta.FloatingPointOperationsSoFar
	if ck.stepper.scaler != nil && ra.LossScaler != nil {
		if err := ck.stepper.scaler.LoadState(*ra.LossScaler); err != nil {
			return fmt.Errorf("train: --load %s: %w", root, err)
		}
	}
	if !ck.cfg.NoLoadRNG {
		ck.stepper.restoreDropout(ra, rng)
	}
	ck.stepper.rerun.iter = ck.Iteration - 1
	if err := ck.stepper.loadRerunState(root, ra.Rerun); err != nil {
		return err
	}
	if err := ck.stepper.sched.LoadState(sched); err != nil {
		return fmt.Errorf("train: --load %s: %w", root, err)
	}
	if loadOptim {
		if ra.OptimizerKind != st.Kind {
			return fmt.Errorf("train: --load %s: the checkpoint's optimizer state is %q, this run's optimizer is %q", root, ra.OptimizerKind, st.Kind)
		}
		if err := ck.readOptimizerState(r, &st); err != nil {
			return err
		}
		st.Steps = ra.OptimizerSteps
		if err := ck.stepper.opt.LoadState(st); err != nil {
			return fmt.Errorf("train: --load %s: %w", root, err)
		}
	}
	ck.rawf("  successfully loaded checkpoint from %s %s at iteration %d (consumed samples %d, in %.3f s)", ck.shown(root), ck.rankTag(), ck.Iteration, ck.Consumed, ck.cfg.Now().Sub(start).Seconds())
	return nil
}

// SaveModel writes m alone (no optimizer state) as a checkpoint at the given
// iteration under dir: what conversion tools produce. train --load resumes
// from it with --no-load-optim (or --finetune). The model's buffers (an MoE
// router's expert bias) are saved with its parameters, as training saves
// them.
func SaveModel(ctx context.Context, dir string, iteration int, m *gpt.Model, seqLength int, cli map[string]any) error {
	model := map[string]safetensors.Tensor{}
	for _, p := range append(m.Params(), m.Buffers()...) {
		model[p.Name] = safetensors.Tensor{DType: safetensors.F32, Shape: p.Shape(), Data: safetensors.Float32Bytes(hostValues(p))}
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
// dir (the architecture for --use-checkpoint-args): gotron's, or the model
// of a Megatron legacy checkpoint's args.
func ReadRunArgs(dir string) (RunArgs, error) {
	c, err := ckpt.Open(dir, -1)
	if err != nil && megatron.IsMegatronDir(dir) {
		// Megatron's legacy layout (--ckpt-format torch): its args.
		mc, merr := megatron.Open(dir)
		if merr != nil {
			return RunArgs{}, merr
		}
		defer mc.Close()
		m, info, merr := mc.Model(megatron.Options{})
		if merr != nil {
			return RunArgs{}, merr
		}
		return RunArgs{Model: m.Config, SeqLength: info.SeqLength}, nil
	}
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

func (ck *checkpointer) scalerState() *optim.LossScalerState {
	if ck.stepper.scaler == nil {
		return nil
	}
	st := ck.stepper.scaler.State()
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

// checkTrackerForward refuses to save iteration it (or later) into dir when
// dir's tracker names a later iteration: the save would replace that job's
// checkpoints of the same iterations and move the tracker backwards, so
// that a later --load resumes from the wrong run. A run that resumed from
// dir starts at its tracker's iteration and never meets this; a run that
// starts over (from scratch, --finetune, another --load) needs a directory
// of its own, as it would with Megatron's --save.
func checkTrackerForward(dir string, it int64) error {
	latest, err := ckpt.Latest(dir)
	switch {
	case errors.Is(err, ckpt.ErrNoCheckpoint):
		return nil
	case err != nil:
		return fmt.Errorf("train: --save %s: %w", dir, err)
	case int64(latest) > it:
		return fmt.Errorf("train: --save %s holds checkpoints up to iteration %d (%s) and this run is at iteration %d: "+
			"its saves would replace them and move %s backwards; resume from it with --load %s, or choose another --save directory",
			dir, latest, ckpt.TrackerFile, it, ckpt.TrackerFile, dir)
	}
	return nil
}

// checkResumePosition checks the counters a checkpoint resumes from before
// the run does arithmetic with them: none negative, and the consumed
// samples no more than this run trains in all (--train-samples, or
// --train-iters global batches at the largest batch size): more means the
// file is corrupt or belongs to a longer run.
func checkResumePosition(root string, m ckpt.Meta, ra RunArgs, cfg *Config, trainIters int64) error {
	where := fmt.Sprintf("train: --load %s: %s", root, ckpt.MetaFile)
	total, why := cfg.TrainSamples, fmt.Sprintf("this run trains --train-samples %d; a checkpoint past that belongs to a longer run", cfg.TrainSamples)
	if total <= 0 {
		batch := cfg.GlobalBatchSize
		if cfg.StepBatchSizeSchedule != "" {
			steps, err := optim.ParseBatchSchedule(cfg.StepBatchSizeSchedule, cfg.SeqLength)
			if err != nil {
				return err
			}
			for _, s := range steps {
				batch = max(batch, s.Size)
			}
		}
		var ok bool
		if total, ok = checked.Mul(trainIters, int64(max(batch, cfg.MicroBatchSize))); !ok {
			total = math.MaxInt64
		}
		why = fmt.Sprintf("this run trains %d iterations of at most %d samples; a checkpoint past that belongs to a longer run", trainIters, max(batch, cfg.MicroBatchSize))
	}
	errs := []error{
		checked.NonNegative(where+": iteration", int64(m.Iteration)),
		checked.RangeWhy(where+": consumed_train_samples", m.ConsumedTrainSamples, 0, total, why),
		checked.RangeWhy(where+": skipped_train_samples", m.SkippedTrainSamples, 0, max(m.ConsumedTrainSamples, 0), "at most the consumed samples"),
		checked.NonNegative(where+": consumed_valid_samples", m.ConsumedValidSamples),
		checked.NonNegative(where+": args.optimizer_steps", ra.OptimizerSteps),
		checked.NonNegative(where+": args.nan_iterations", ra.NaNIterations),
	}
	if f := m.FloatingPointOperationsSoFar; f < 0 || math.IsNaN(f) || math.IsInf(f, 0) {
		errs = append(errs, fmt.Errorf("%s: num_floating_point_operations_so_far: %v, want a finite number >= 0", where, f))
	}
	return errors.Join(errs...)
}

// withOrWithout names a flag's state in a sentence.
func withOrWithout(on bool) string {
	if on {
		return "with"
	}
	return "without"
}

// hasMLALatentNorms reports whether r's model holds multi-latent
// attention's latent norms (q_layernorm or kv_layernorm of an MLA layer).
func hasMLALatentNorms(r *ckpt.Reader) bool {
	for name := range r.Tensors(ckpt.GroupModel) {
		if strings.Contains(name, "self_attention.kv_layernorm.") || strings.Contains(name, "self_attention.q_layernorm.") {
			return true
		}
	}
	return false
}
