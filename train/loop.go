package train

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/gotron/gotron/ckpt"
	datagpt "github.com/gotron/gotron/data/gpt"
	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/tensor"
)

// Trainer runs one training run: Megatron's pretraining loop over a
// stepper (the model, the optimizer and the parallelism: one training
// step), a checkpointer (save, resume, the asynchronous save in flight)
// and a reporter (log line, metrics file, TensorBoard, progress bar), which
// share the run's position: the promoted fields Iteration, Consumed,
// ConsumedValid, Skipped, NaNIterations and FLOPsSoFar, saved in
// checkpoints.
type Trainer struct {
	position
	cfg Config
	// Model is the model trained, when it is a GPT model (the default
	// architecture), for callers that sample from it afterwards; nil
	// otherwise.
	Model *gpt.Model

	stepper      *stepper
	checkpointer *checkpointer
	reporter     *reporter
	valid, test  datagpt.Source // evaluated every --eval-interval and at the end; the test split at the end only (SetTest)
	saveLock     *ckpt.DirLock  // --save's lock, held by world rank 0 from New until Run returns (or Close)
}

// Result summarises a run for callers and tests.
type Result struct {
	// Losses is the lm loss of every iteration run (NaN for skipped ones;
	// the finite loss of an iteration skipped for an fp16 gradient overflow).
	Losses []float64
	// LossScales is the loss scale after every iteration run (1 without
	// --fp16), as the log line prints it.
	LossScales []float64
	// GradNorms is the gradient norm of every iteration (NaN for skipped
	// ones), as the log line prints it.
	GradNorms []float64
	// MoELosses is an MoE model's logged losses of every iteration
	// (load_balancing_loss, ..., z_loss: averaged over micro-batches, MoE
	// layers and data-parallel ranks, as Megatron logs them).
	MoELosses []map[string]float64
	// Skipped counts the iterations whose update was skipped (NaN/Inf
	// loss or gradients, or an fp16 overflow), over the whole run.
	Skipped int64
	// LoggedLoss is the lm loss the last log line printed (the mean over
	// its --log-interval); NaN if none was printed.
	LoggedLoss  float64
	Iteration   int64
	Consumed    int64
	ValidLoss   float64 // last evaluation's loss; NaN if none ran
	TestLoss    float64 // the final test-set evaluation's loss; NaN if none ran
	SavedAt     []int64 // iterations checkpointed
	Interrupted bool    // stopped by the context (a signal) after saving
}

// New builds the model (or loads it with cfg.Load), the optimizer, the
// schedule and the data position.
//
// With --save, world rank 0 takes the directory's lock (ckpt.LockDir: one
// job per checkpoint directory) here and releases it when Run returns;
// a Trainer that is never run must be closed.
func New(cfg Config, train, valid datagpt.Source) (_ *Trainer, err error) {
	launched := cfg.Parallel != nil // else one process: validate gives it the groups of a world of one
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.RL != nil {
		train = cfg.RL // the RL step's rollouts are the training data
	}
	if train == nil {
		return nil, errors.New("train: no training data (set --data-path or --mock-data)")
	}
	t := &Trainer{cfg: cfg, valid: valid}
	t.reporter = &reporter{position: &t.position, cfg: &t.cfg, par: cfg.Parallel}
	var tm *timers
	if cfg.TimingLogLevel >= 0 {
		tm = newTimers(cfg.TimingLogLevel, cfg.TimingLogOption, t.cfg.Now)
	}
	tm.start(timerModelSetup, 0)
	if cfg.Save != "" && isWriter(cfg.Parallel) {
		if err := checkSaveDir(cfg.Save); err != nil {
			return nil, err
		}
		if t.saveLock, err = ckpt.LockDir(cfg.Save, strings.Join(os.Args, " "), t.reporter.printf); err != nil {
			return nil, fmt.Errorf("train: --save: %w", err)
		}
		defer func() {
			if err != nil {
				t.Close()
			}
		}()
	}
	s, err := newStepper(&t.cfg, &t.position, train, launched, t.reporter.printf)
	if err != nil {
		return nil, err
	}
	t.stepper, t.reporter.stepper = s, s
	s.tm = tm
	t.Model, _ = s.model.(*gpt.Model)
	t.checkpointer = &checkpointer{position: &t.position, cfg: &t.cfg, par: cfg.Parallel, stepper: s, printf: t.reporter.printf, rawf: t.reporter.rawf}
	s.waitSnapshot = t.checkpointer.waitSnapshot
	if cfg.Load != "" {
		tm.start(timerLoadCheckpoint, 0)
		if err := t.checkpointer.load(cfg.Load); err != nil {
			return nil, err
		}
		tm.stop(timerLoadCheckpoint)
		if err := t.logTimers(timerLoadCheckpoint); err != nil {
			return nil, err
		}
	}
	if cfg.LogProgress && cfg.Save != "" && isWriter(t.cfg.Parallel) {
		now := t.cfg.Now
		t.checkpointer.progress = &progressLog{path: filepath.Join(cfg.Save, ProgressFile), jobID: cfg.JobID,
			world: t.cfg.Parallel.World.Size(), now: now, started: now(), startFLOPs: t.FLOPsSoFar}
		if err := t.checkpointer.progress.append("Starting job"); err != nil {
			return nil, err
		}
	}
	if cfg.Save != "" && isWriter(cfg.Parallel) {
		if err := checkTrackerForward(cfg.Save, t.Iteration); err != nil {
			return nil, err
		}
	}
	if err := s.checkSchedule(); err != nil {
		return nil, err
	}
	if cfg.AsyncSave {
		if err := t.checkpointer.allocateSnapshot(); err != nil {
			return nil, err
		}
	}
	tm.stop(timerModelSetup)
	tm.set(timerDataSetup, 0, cfg.DataSetupTime)
	if err := t.logTimers(timerModelSetup, timerDataSetup); err != nil {
		return nil, err
	}
	return t, nil
}

// logTimers is Megatron's timers.log(names) for the level-0 timers (set-up,
// checkpoint load and save, evaluation): every rank gathers, the logging
// rank prints the block.
func (t *Trainer) logTimers(names ...string) error {
	block, err := t.stepper.tm.log(t.stepper.cctx, t.cfg.Parallel, names, 1, true)
	if err == nil && block != "" {
		t.reporter.rawf("%s", block)
	}
	return err
}

// evaluate runs an evaluation on src under Megatron's evaluate timer,
// printed after it.
func (t *Trainer) evaluate(src datagpt.Source, consumed *int64) (float64, error) {
	t.stepper.tm.start(timerEvaluate, 0)
	loss, err := t.stepper.evaluate(src, consumed)
	t.stepper.tm.stop(timerEvaluate)
	if err != nil {
		return loss, err
	}
	return loss, t.logTimers(timerEvaluate)
}

// Close releases what New took and Run did not release: the --save
// directory's lock. Run closes the Trainer when it returns; Close may be
// called more than once.
func (t *Trainer) Close() error {
	err := t.saveLock.Release()
	t.saveLock = nil
	if err != nil {
		return fmt.Errorf("train: --save: %w", err)
	}
	return nil
}

// TrainIters is the number of iterations the run ends at.
func (t *Trainer) TrainIters() int64 { return t.trainIters }

// Run trains until the last iteration, an exit condition, or ctx is done (a
// signal): then it finishes the iteration in flight, saves (with --save) and
// returns with Result.Interrupted set and a nil error.
func (t *Trainer) Run(ctx context.Context) (_ Result, err error) {
	defer func() {
		if cerr := t.Close(); err == nil {
			err = cerr
		}
	}()
	res := Result{ValidLoss: math.NaN(), TestLoss: math.NaN(), LoggedLoss: math.NaN()}
	t.stepper.cctx = context.WithoutCancel(ctx)
	t.stepper.startTime = t.cfg.Now()
	var stepCopies tensor.Transfers // host copies made by training steps (--device sim or cuda)
	if count := transferCounter(t.cfg.Device); count != nil {
		since, ltSince := count(), tensor.CUDALtCounts()
		defer func() {
			t.reporter.printf("%s", transfers(t.cfg.Device, count(), since, stepCopies, t.Iteration-t.reporter.startIter))
			if t.cfg.BF16 {
				t.reporter.printf("%s", bf16OperandsLine(t.cfg.Device, t.stepper.bf16Steps, t.Iteration-t.reporter.startIter))
			}
			if t.cfg.Device == tensor.CUDA && tensor.CUDALt() {
				// GOTRON_CUDA_UNVERIFIED=cublaslt: how many products ran
				// through cuBLASLt and how many fell back to cuBLAS
				t.reporter.printf("%v device, %v", t.cfg.Device, tensor.CUDALtCounts().Sub(ltSince))
			}
		}()
	}
	closeReports, err := t.reporter.open()
	defer closeReports()
	if err != nil {
		return res, err
	}
	if t.cfg.CkptConvertFormat != "" {
		res.Iteration = t.Iteration
		return res, t.convertCheckpoint()
	}
	if t.cfg.Device == tensor.CUDA {
		defer func() {
			if p := tensor.CUDAProfile(); p != "" {
				t.reporter.printf("%s", p)
			}
		}()
	}
	if t.cfg.PeakFLOPs == 0 && t.cfg.Device == tensor.CUDA {
		if t.cfg.PeakFLOPs = tensor.CUDAPeakFLOPs(t.cfg.BF16 || t.cfg.FP16); t.cfg.PeakFLOPs == 0 {
			t.reporter.printf("this GPU is not in gotron's table of peaks: MFU is against this CPU's; give the GPU's with --peak-flops")
		}
	}
	if t.cfg.PeakFLOPs == 0 {
		t.cfg.PeakFLOPs = measuredPeak(t.cfg.BF16)
	}
	if t.cfg.SkipTrain {
		t.reporter.rawf("skipping training (--skip-train is on) ...")
	}
	prof := &stepProfiler{cfg: t.cfg.Profile, printf: t.reporter.printf}
	if w := t.cfg.Profile.Log; w != nil {
		prof.printf = func(format string, args ...any) { fmt.Fprintf(w, "gotron train: "+format+"\n", args...) }
	}
	defer func() { prof.stop(t.Iteration) }() // a run that fails before --profile-step-end
	if t.cfg.CheckWeightHashInterval > 0 && !t.cfg.SkipTrain {
		// Megatron checks once before training too.
		if err := t.checkWeightHashes(); err != nil {
			return res, err
		}
	}
	exited := false
	for !exited && t.Iteration < t.trainIters && !t.cfg.SkipTrain {
		if err := prof.beforeIteration(t.Iteration); err != nil {
			return res, err
		}
		if exited, err = t.iterate(ctx, &res, &stepCopies); err != nil {
			return res, err
		}
		if err := prof.afterIteration(t.Iteration); err != nil {
			return res, err
		}
	}
	if err := prof.stop(t.Iteration); err != nil {
		return res, err
	}
	if err := t.finish(&res); err != nil {
		return res, err
	}
	// Megatron's end of pretrain evaluates, unless the run exited early
	// (--exit-interval, --exit-duration-in-mins, a signal).
	if !exited {
		if err := t.evaluateAtEnd(&res); err != nil {
			return res, err
		}
	}
	res.Iteration, res.Consumed, res.Skipped = t.Iteration, t.Consumed, t.Skipped
	return res, nil
}

// iterate runs one training iteration and what follows it (the log line,
// an evaluation, a save), adding the step's host copies to copies, and
// reports whether the run exits after it.
func (t *Trainer) iterate(ctx context.Context, res *Result, copies *tensor.Transfers) (exit bool, err error) {
	cfg := &t.cfg
	if err := t.checkpointer.pollSave(false); err != nil {
		return false, err
	}
	count := transferCounter(cfg.Device)
	var before tensor.Transfers
	if count != nil {
		before = count()
	}
	loss, err := t.stepper.step(ctx)
	var rx *RerunExit
	if errors.As(err, &rx) {
		// Megatron's train loop: the checkpoint the rerun state machine
		// asks for, then sys.exit(exit_code).
		if rx.Checkpoint {
			if cfg.Save == "" {
				return true, fmt.Errorf("%w; no --save: no checkpoint to resume the rerun from", err)
			}
			if serr := t.checkpointer.save(cfg.Save, false); serr != nil {
				return true, serr
			}
			res.SavedAt = append(res.SavedAt, t.Iteration)
		}
		return true, err
	}
	if err != nil {
		return false, err
	}
	if count != nil {
		*copies = copies.Add(count().Sub(before))
	}
	res.Losses = append(res.Losses, loss)
	res.GradNorms = append(res.GradNorms, t.stepper.lastGradNorm)
	if m := t.stepper.moeMetrics; m != nil {
		res.MoELosses = append(res.MoELosses, m)
	}
	res.LossScales = append(res.LossScales, float64(t.stepper.lossScale()))
	t.reporter.tbIteration(loss)
	record := t.reporter.logIteration(loss)
	if t.reporter.lastLogIter == t.Iteration {
		res.LoggedLoss = t.reporter.lastLoggedLoss
	}
	if cfg.EvalInterval > 0 && t.doValid() && t.Iteration%cfg.EvalInterval == 0 {
		valid, err := t.evaluate(t.valid, &t.ConsumedValid)
		if err != nil {
			return false, err
		}
		res.ValidLoss = valid
		t.reporter.printEval(fmt.Sprintf("iteration %d", t.Iteration), valid)
		t.reporter.tbValidation(valid)
		if record != nil {
			record["valid_loss"] = jsonFloat(valid)
		}
	}
	t.reporter.writeMetrics(record)
	// Megatron's post_training_step_callbacks: after the log and the
	// evaluation, before the checkpoint.
	if n := cfg.CheckWeightHashInterval; n > 0 && t.Iteration%n == 0 {
		if err := t.checkWeightHashes(); err != nil {
			return false, err
		}
	}
	save := cfg.SaveInterval > 0 && t.Iteration%cfg.SaveInterval == 0
	exit = cfg.ExitInterval > 0 && t.Iteration%cfg.ExitInterval == 0
	if t.stepper.stop.timeUp {
		exit = true
		t.reporter.printf("exiting program after %v (--exit-duration-in-mins)", cfg.Now().Sub(t.stepper.startTime).Round(time.Second))
	}
	if t.stepper.stop.stopped {
		exit = true
		res.Interrupted = true
		if cfg.Save != "" {
			t.reporter.printf("received signal: saving and exiting at iteration %d", t.Iteration)
		} else {
			t.reporter.printf("received signal: exiting at iteration %d (no --save: nothing is saved)", t.Iteration)
		}
	}
	if (save || exit) && cfg.Save != "" {
		// A save before exiting is synchronous: nothing is left to finish.
		if err := t.checkpointer.save(cfg.Save, cfg.AsyncSave && !exit && t.Iteration < t.trainIters); err != nil {
			return exit, err
		}
		res.SavedAt = append(res.SavedAt, t.Iteration)
	}
	return exit, nil
}

// finish completes the save in flight, brings the parameters whole, and
// saves the last iteration unless it was just saved.
func (t *Trainer) finish(res *Result) error {
	if err := t.checkpointer.waitSave(); err != nil {
		return err
	}
	if err := t.stepper.syncParams(); err != nil {
		return err
	}
	saved := len(res.SavedAt) > 0 && res.SavedAt[len(res.SavedAt)-1] == t.Iteration
	if t.cfg.Save != "" && !saved && t.Iteration > 0 {
		if err := t.checkpointer.save(t.cfg.Save, false); err != nil {
			return err
		}
		res.SavedAt = append(res.SavedAt, t.Iteration)
	}
	return nil
}

// evaluateAtEnd is Megatron's end of pretrain: evaluation on the validation
// set (its iterator continues) and on the test set (from its start).
func (t *Trainer) evaluateAtEnd(res *Result) error {
	if t.doValid() {
		loss, err := t.evaluate(t.valid, &t.ConsumedValid)
		if err != nil {
			return err
		}
		res.ValidLoss = loss
		t.reporter.finalEvaluation("validation set", "final_valid_loss", loss)
	}
	if t.test != nil && t.cfg.EvalIters > 0 {
		var consumed int64
		loss, err := t.evaluate(t.test, &consumed)
		if err != nil {
			return err
		}
		res.TestLoss = loss
		t.reporter.finalEvaluation("test set", "test_loss", loss) // Megatron writes the test loss under the validation tags
	}
	return nil
}

// SetTest gives the run a test split, evaluated once after training as
// Megatron's do_test (with --eval-iters > 0).
func (t *Trainer) SetTest(src datagpt.Source) { t.test = src }

// doValid is Megatron's do_valid: a validation split and --eval-iters > 0.
func (t *Trainer) doValid() bool { return t.valid != nil && t.cfg.EvalIters > 0 }

// measuredPeak is this process's fp32 FMA peak (tensor.CPUPeakFLOPs over
// the kernel threads, 50 ms), doubled with bf16 (VDPBF16PS does two products
// per fp32 lane): the denominator of MFU when --peak-flops is not given.
func measuredPeak(bf16 bool) float64 {
	p := tensor.CPUPeakFLOPs(tensor.CPUThreads(), 50*time.Millisecond)
	if bf16 {
		p *= 2
	}
	return p
}

// checkWeightHashes is Megatron's weight-hash check across the
// data-parallel replicas with its message.
func (t *Trainer) checkWeightHashes() error {
	if err := t.stepper.checkWeightHashes(); err != nil {
		return err
	}
	t.reporter.rawf(">>> Weight hashes match after %d iterations...", t.Iteration)
	return nil
}
