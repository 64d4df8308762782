package train

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/gotron/gotron/comm"
	datagpt "github.com/gotron/gotron/data/gpt"
	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/optim"
	"github.com/gotron/gotron/parallel"
	"github.com/gotron/gotron/parallel/pp"
	"github.com/gotron/gotron/parallel/tp"
	"github.com/gotron/gotron/tensor"
)

// Trainer holds one run's model, optimizer and position in the data.
type Trainer struct {
	cfg Config
	// Model is the model trained, when it is a GPT model (the default
	// architecture), for callers that sample from it afterwards; nil
	// otherwise. It is model's concrete value.
	Model *gpt.Model
	model Model        // this rank's model (its tensor-parallel slices)
	arch  Architecture // how model was built and is laid out
	opt   optim.Optimizer
	sched *optim.Scheduler
	mb    *optim.Microbatches
	grads *optim.Grads
	train datagpt.Source
	valid datagpt.Source
	test  datagpt.Source // the test split, evaluated once at the end (SetTest)
	rng   *tensor.RNG    // dropout stream (Megatron's default CUDA RNG)
	tape  *tensor.Tape
	// evalTape runs evaluation's forward passes: no gradients, but the
	// step's context and the failures of tensor-parallel collectives.
	evalTape *tensor.Tape

	// Data, tensor and pipeline parallelism (parallel.go, tensorpar.go,
	// pipeline.go); a process alone has the groups of a world of one.
	par         *parallel.Groups
	reducer     gradReducer           // the step's gradients, reduced over the data-parallel group
	region      *tp.Region            // tensor-parallel region (of size 1 with TP = 1)
	plan        func(string) tp.Style // the architecture's tensor-parallel plan
	normG       *optim.Grads          // the gradients this rank counts in the global norm
	rankRNG     *tensor.RNG           // per-TP-rank dropout stream (unused with TP = 1)
	tpOffsets   []uint64              // every TP rank's rankRNG offset, for the checkpoint being written
	rankOffsets [][2]uint64           // every rank's dropout stream offsets under pipelining, for the checkpoint
	pending     *pendingSave          // the --async-save in flight
	snapshot    []float32             // its copy of this rank's shards, reused by the next
	scaler      *optim.LossScaler     // --fp16's loss scaler; nil otherwise
	overflow    bool                  // the last step was skipped for an fp16 gradient overflow
	stages      []Stage               // this pipeline rank's model chunks; nil without pipelining
	runners     []*stageRunner        // the stages as the executor runs them
	execs       map[int]*pp.Executor  // pipeline executors by micro-batches per iteration
	cctx        context.Context       // collectives' context: not cancelled by a signal, so every rank stops at the same iteration
	stop        agreement             // the last iteration's agreed stop requests

	lastSyncWait time.Duration // ddp.SyncWait at the last log line
	lastTPComm   time.Duration // region.CommTime at the last log line

	// Position, saved in checkpoints.
	Iteration      int64
	Consumed       int64 // consumed_train_samples
	ConsumedValid  int64 // consumed_valid_samples
	Skipped        int64 // iterations skipped (NaN/Inf, fp16 overflow), over the run
	NaNIterations  int64
	FLOPsSoFar     float64
	trainIters     int64
	skippedInARow  int
	startTime      time.Time
	lastLog        time.Time
	lastLogIter    int64
	lossSinceLog   float64
	skippedAtLog   int64 // Skipped and NaNIterations at the last log line
	nanAtLog       int64
	itersSinceLog  int64
	lastGradNorm   float64
	lastLR         float64
	lastValidLoss  float64
	lastLoggedLoss float64 // the lm loss of the last log line
	startIter      int64   // the iteration this Run started at
	metrics        *metricsWriter
	progress       *progressBar
}

// Result summarises a run for callers and tests.
type Result struct {
	// Losses is the lm loss of every iteration run (NaN for skipped ones;
	// the finite loss of an iteration skipped for an fp16 gradient overflow).
	Losses []float64
	// LossScales is the loss scale after every iteration run (1 without
	// --fp16), as the log line prints it.
	LossScales []float64
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
func New(cfg Config, train, valid datagpt.Source) (*Trainer, error) {
	launched := cfg.Parallel != nil // else one process: the groups of a world of one (validate)
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if train == nil {
		return nil, errors.New("train: no training data (set --data-path or --mock-data)")
	}
	t := &Trainer{cfg: cfg, train: train, valid: valid, tape: tensor.NewTape(), lastValidLoss: math.NaN(),
		par: cfg.Parallel, cctx: context.Background()}
	if cfg.Save != "" && t.isWriter() {
		if err := checkSaveDir(cfg.Save); err != nil {
			return nil, err
		}
	}
	if cfg.BF16 {
		t.tape.SetMatmulPrecision(tensor.MatmulBF16)
	}
	if cfg.FP16 {
		t.tape.SetMatmulPrecision(tensor.MatmulFP16)
	}
	// Megatron scales the loss with --fp16 (dynamically unless --loss-scale)
	// and, with --bf16, only when --loss-scale asks for a constant scale.
	if cfg.FP16 || (cfg.BF16 && cfg.LossScale.Constant > 0) {
		var err error
		if t.scaler, err = optim.NewLossScaler(cfg.LossScale); err != nil {
			return nil, err
		}
	}
	root := tensor.NewRNG(uint64(cfg.Seed))
	t.arch = cfg.architecture()
	m, err := t.arch.Build(root.Fork("init"))
	if err != nil {
		return nil, err
	}
	if m, err = t.shardModel(m, root); err != nil {
		return nil, err
	}
	t.model = m
	t.Model, _ = m.(*gpt.Model)
	t.rng = root.Fork("dropout")
	if t.pipelined() {
		// Each pipeline stage draws its dropout masks from its own stream.
		t.rng = root.Fork(fmt.Sprintf("dropout-pp-rank-%d", t.par.PP.Rank()))
		if err := t.splitStages(m); err != nil {
			return nil, err
		}
	}
	t.moveToDevice()
	ps, err := t.setupParallel(t.cctx, launched)
	if err != nil {
		return nil, err
	}
	t.tape.SetGradReadyHook(t.reducer.readyHook())
	groups := decoupledGroups(optim.DefaultGroups(ps), cfg.DecoupledLR, cfg.DecoupledMinLR, cfg.Schedule.MinLR)
	if cfg.Optimizer == SGD {
		t.opt, err = optim.NewSGD(groups, optim.SGDConfig{Momentum: cfg.SGDMomentum})
	} else {
		t.opt, err = optim.NewAdamW(groups, cfg.Adam)
	}
	if err != nil {
		return nil, err
	}
	if t.grads, err = optim.NewGrads(ps); err != nil {
		return nil, err
	}
	if t.normG, err = optim.NewGrads(t.normParams(ps)); err != nil {
		return nil, err
	}
	if t.mb, err = optim.NewMicrobatches(optim.MicrobatchConfig{GlobalBatchSize: cfg.GlobalBatchSize, RampupBatchSize: cfg.RampupBatchSize,
		StepBatchSizeSchedule: cfg.StepBatchSizeSchedule, SeqLength: cfg.SeqLength,
		MicroBatchSize: cfg.MicroBatchSize, DataParallelSize: t.dpSize()}); err != nil {
		return nil, err
	}
	t.trainIters = cfg.TrainIters
	if cfg.TrainSamples > 0 {
		t.trainIters = t.mb.TrainIters(cfg.TrainSamples)
	}
	sf := cfg.Schedule
	sf.TrainIters, sf.TrainSamples, sf.GlobalBatchSize = cfg.TrainIters, cfg.TrainSamples, int64(cfg.GlobalBatchSize)
	sc, err := sf.Config()
	if err != nil {
		return nil, err
	}
	if t.sched, err = optim.NewScheduler(sc); err != nil {
		return nil, err
	}
	if cfg.Load != "" {
		if err := t.load(cfg.Load); err != nil {
			return nil, err
		}
	}
	if t.pipelined() {
		// Refuse a micro-batch count the schedule cannot run before any work.
		if err := t.mb.UpdateChecked(t.Consumed); err != nil {
			return nil, err
		}
		if _, err := t.executor(t.mb.Num()); err != nil {
			return nil, err
		}
	}
	if cfg.AsyncSave {
		if err := t.allocateSnapshot(); err != nil {
			return nil, err
		}
	}
	return t, nil
}

func optimParams(params []*tensor.Tensor) []*optim.Param {
	var ps []*optim.Param
	for _, p := range params {
		if p.Grad == nil {
			p.Grad = tensor.ZerosLike(p) // on the parameter's device
		}
		ps = append(ps, &optim.Param{Name: p.Name, Data: p, Grad: p.Grad,
			NoWeightDecay: optim.DefaultNoWeightDecay(p.Name, p.Shape())})
	}
	return ps
}

// TrainIters is the number of iterations the run ends at.
func (t *Trainer) TrainIters() int64 { return t.trainIters }

// Run trains until the last iteration, an exit condition, or ctx is done (a
// signal): then it finishes the iteration in flight, saves (with --save) and
// returns with Result.Interrupted set and a nil error.
func (t *Trainer) Run(ctx context.Context) (Result, error) {
	cfg := &t.cfg
	res := Result{ValidLoss: math.NaN(), TestLoss: math.NaN(), LoggedLoss: math.NaN()}
	t.cctx = context.WithoutCancel(ctx)
	t.startTime = cfg.Now()
	t.lastLog, t.lastLogIter, t.startIter = t.startTime, t.Iteration, t.Iteration
	var stepCopies tensor.Transfers // host copies made by training steps (--device sim)
	if cfg.Device == tensor.Sim {
		since := tensor.SimTransfers()
		defer func() { t.printf("%s", transfers(since, stepCopies, t.Iteration-t.startIter)) }()
	}
	if cfg.MetricsFile != "" {
		mw, err := openMetrics(cfg.MetricsFile)
		if err != nil {
			return res, err
		}
		defer mw.Close()
		t.metrics = mw
	}
	if cfg.Progress != nil {
		t.progress = newProgressBar(cfg.Progress, t.Iteration, t.trainIters, cfg.Now)
		defer t.progress.finish()
	}
	if err := t.openTensorBoard(); err != nil {
		return res, err
	}
	defer t.closeTensorBoard()
	if cfg.PeakFLOPs == 0 {
		cfg.PeakFLOPs = measuredPeak(cfg.BF16)
	}
	savedLast := int64(-1)
	exited := false
	if cfg.SkipTrain {
		t.rawf("skipping training (--skip-train is on) ...")
	}
	for t.Iteration < t.trainIters && !cfg.SkipTrain {
		if err := t.pollSave(false); err != nil {
			return res, err
		}
		before := tensor.SimTransfers()
		loss, err := t.step(ctx)
		if err != nil {
			return res, err
		}
		stepCopies = add(stepCopies, sub(tensor.SimTransfers(), before))
		res.Losses = append(res.Losses, loss)
		res.LossScales = append(res.LossScales, float64(t.lossScale()))
		t.tbIteration(loss)
		record := t.logIteration(loss)
		if t.lastLogIter == t.Iteration {
			res.LoggedLoss = t.lastLoggedLoss
		}
		if cfg.EvalInterval > 0 && t.doValid() && t.Iteration%cfg.EvalInterval == 0 {
			if t.lastValidLoss, err = t.evaluate(t.valid, &t.ConsumedValid); err != nil {
				return res, err
			}
			res.ValidLoss = t.lastValidLoss
			t.printEval(fmt.Sprintf("iteration %d", t.Iteration), t.lastValidLoss)
			t.tbValidation(t.lastValidLoss)
			if record != nil {
				record["valid_loss"] = jsonFloat(t.lastValidLoss)
			}
		}
		t.writeMetrics(record)
		save := cfg.SaveInterval > 0 && t.Iteration%cfg.SaveInterval == 0
		exit := cfg.ExitInterval > 0 && t.Iteration%cfg.ExitInterval == 0
		if t.stop.timeUp {
			exit = true
			t.printf("exiting program after %v (--exit-duration-in-mins)", cfg.Now().Sub(t.startTime).Round(time.Second))
		}
		if t.stop.stopped {
			exit = true
			res.Interrupted = true
			if cfg.Save != "" {
				t.printf("received signal: saving and exiting at iteration %d", t.Iteration)
			} else {
				t.printf("received signal: exiting at iteration %d (no --save: nothing is saved)", t.Iteration)
			}
		}
		if (save || exit) && cfg.Save != "" {
			// A save before exiting is synchronous: nothing is left to finish.
			if err := t.save(cfg.Save, cfg.AsyncSave && !exit && t.Iteration < t.trainIters); err != nil {
				return res, err
			}
			savedLast = t.Iteration
			res.SavedAt = append(res.SavedAt, t.Iteration)
		}
		if exit {
			exited = true
			break
		}
	}
	if err := t.waitSave(); err != nil {
		return res, err
	}
	if err := t.syncParams(); err != nil {
		return res, err
	}
	if cfg.Save != "" && savedLast != t.Iteration && t.Iteration > 0 {
		if err := t.save(cfg.Save, false); err != nil {
			return res, err
		}
		res.SavedAt = append(res.SavedAt, t.Iteration)
	}
	// Megatron's end of pretrain: evaluation on the validation set (its
	// iterator continues) and on the test set (from its start), unless the
	// run exited early (--exit-interval, --exit-duration-in-mins, a signal).
	if !exited {
		if t.doValid() {
			loss, err := t.evaluate(t.valid, &t.ConsumedValid)
			if err != nil {
				return res, err
			}
			res.ValidLoss, t.lastValidLoss = loss, loss
			t.printEval(fmt.Sprintf("iteration %d on validation set", t.Iteration), loss)
			if !cfg.SkipTrain {
				t.tbValidation(loss)
			}
			t.writeMetrics(map[string]any{"iteration": t.Iteration, "timestamp": t.cfg.Now().Format(time.RFC3339Nano), "final_valid_loss": jsonFloat(loss)})
		}
		if t.test != nil && t.cfg.EvalIters > 0 {
			var consumed int64
			loss, err := t.evaluate(t.test, &consumed)
			if err != nil {
				return res, err
			}
			res.TestLoss = loss
			t.printEval(fmt.Sprintf("iteration %d on test set", t.Iteration), loss)
			if !cfg.SkipTrain { // Megatron writes the test loss under the validation tags
				t.tbValidation(loss)
			}
			t.writeMetrics(map[string]any{"iteration": t.Iteration, "timestamp": t.cfg.Now().Format(time.RFC3339Nano), "test_loss": jsonFloat(loss)})
		}
	}
	res.Iteration, res.Consumed, res.Skipped = t.Iteration, t.Consumed, t.Skipped
	return res, nil
}

// step runs one iteration: forward/backward over the microbatches of one
// global batch, then clip, optimizer and scheduler steps (skipped on NaN/Inf
// as Megatron's found_inf). It returns the iteration's lm loss.
func (t *Trainer) step(ctx context.Context) (float64, error) {
	if err := t.mb.UpdateChecked(t.Consumed); err != nil {
		return 0, err
	}
	n, mbs := t.mb.Num(), t.mb.MicroBatchSize()
	dp, r := t.dpSize(), t.dpRank()
	if err := t.reducer.WaitParams(t.cctx); err != nil {
		return 0, fmt.Errorf("train: iteration %d: %w", t.Iteration+1, err)
	}
	t.reducer.ZeroGrad()
	var lossSum float64
	if t.pipelined() {
		loss, err := t.pipelineStep(n, mbs, dp, r)
		if err != nil {
			return 0, err
		}
		lossSum = loss * float64(n)
	}
	for i := 0; i < n && !t.pipelined(); i++ {
		if i == n-1 {
			t.reducer.StartLastMicrobatch(t.cctx)
		}
		bt, err := t.trainBatch(i, mbs, dp, r)
		if err != nil {
			return 0, err
		}
		// The tape carries the collectives' context; Backward returns the
		// first failure of those run in forward or backward.
		t.tape.SetContext(t.cctx)
		logits := t.model.Forward(t.tape, bt, t.rng, true)
		loss := t.model.Loss(t.tape, logits, bt)
		if err := t.tape.Err(); err != nil {
			return 0, fmt.Errorf("train: iteration %d: %w", t.Iteration+1, err)
		}
		lossSum += scalar(loss)
		// Each microbatch's mean loss counts 1/n of the iteration's loss
		// (times the loss scale with --fp16).
		if err := t.tape.Backward(t.tape.Scale(loss, t.lossScale()/float32(n))); err != nil {
			return 0, fmt.Errorf("train: iteration %d: %w", t.Iteration+1, err)
		}
		t.tape.Reset()
	}
	timeUp := t.cfg.ExitDuration > 0 && t.cfg.Now().Sub(t.startTime) >= t.cfg.ExitDuration
	g, err := t.reduceGrads(t.cctx, agreement{loss: lossSum / float64(n), stopped: ctx.Err() != nil, timeUp: timeUp})
	if err != nil {
		return 0, err
	}
	t.stop = g
	loss := g.loss
	gbs := int64(t.mb.CurrentRunningGlobalBatchSize())
	t.FLOPsSoFar += FLOPsPerIteration(t.cfg.Model, int(gbs), t.cfg.SeqLength)
	t.Iteration++
	t.Consumed += gbs
	t.lastLR = t.sched.LR()
	if t.scaler != nil {
		t.scaler.Update(g.nonFin)
	}
	if g.nonFin && t.scaler != nil && !math.IsNaN(loss) && !math.IsInf(loss, 0) {
		// An fp16 gradient overflow: the loss scale backs off and the
		// step is skipped, as Megatron's DynamicGradScaler; not a NaN
		// iteration.
		t.Skipped++
		t.overflow = true
		t.lastGradNorm = math.NaN()
		return loss, nil
	}
	t.overflow = false
	if g.nonFin || math.IsNaN(loss) || math.IsInf(loss, 0) {
		t.Skipped++
		t.NaNIterations++
		t.skippedInARow++
		if t.skippedInARow >= t.cfg.MaxSkipsInARow {
			return loss, fmt.Errorf("train: %d iterations in a row (up to %d) had a NaN/Inf loss or gradient: the run diverged; lower --lr, raise --lr-warmup-iters, or set --clip-grad", t.skippedInARow, t.Iteration)
		}
		t.lastGradNorm = math.NaN()
		return loss, nil
	}
	t.skippedInARow = 0
	t.lastGradNorm = optim.L2Norm(g.sumSq)
	if t.cfg.ClipGrad > 0 {
		t.grads.ClipByNorm(t.cfg.ClipGrad, t.lastGradNorm)
	}
	t.sched.Apply(t.opt.Groups())
	t.waitSnapshot()
	t.opt.Step()
	t.sched.Step(gbs)
	// Megatron logs the rate after the scheduler step: the next iteration's.
	t.lastLR = t.sched.LR()
	if err := t.reducer.GatherParams(t.cctx); err != nil {
		return loss, fmt.Errorf("train: iteration %d: %w", t.Iteration, err)
	}
	return loss, nil
}

// noGradTape returns the evaluation tape, carrying the collectives'
// context: forward passes without gradients whose tensor-parallel
// collectives' failures it records (Err).
func (t *Trainer) noGradTape() *tensor.Tape {
	if t.evalTape == nil {
		t.evalTape = tensor.NewNoGradTape(nil)
	}
	t.evalTape.SetContext(t.cctx)
	return t.evalTape
}

// evaluate runs --eval-iters global batches of the validation set without
// gradients, continuing where the last evaluation stopped (Megatron keeps one
// validation iterator), and returns the mean loss. Data-parallel ranks each
// evaluate their micro-batch of every mbs·DP samples; the mean is over all.
func (t *Trainer) evaluate(src datagpt.Source, consumed *int64) (float64, error) {
	gbs, mbs := t.cfg.GlobalBatchSize, t.cfg.MicroBatchSize
	dp, r := t.dpSize(), t.dpRank()
	if err := t.syncParams(); err != nil {
		return math.NaN(), err
	}
	var sum float64
	var count int
	failed := false
	for range t.cfg.EvalIters {
		for i := 0; i < gbs/(mbs*dp) && !failed; i++ {
			start := (*consumed + int64(r*mbs)) % int64(max(src.Len(), 1))
			bt, err := makeBatch(src, start, mbs, t.cfg.SeqLength, t.cfg.Model.VocabSize)
			if err != nil {
				t.printf("evaluation stopped: %v", err)
				failed = true
				break
			}
			var loss float64
			if t.pipelined() {
				if loss, err = t.pipelineEval(bt); err != nil {
					return math.NaN(), err
				}
			} else {
				dbt := batchTo(bt, t.cfg.Device)
				tp := t.noGradTape()
				loss = scalar(t.model.Loss(tp, t.model.Forward(tp, dbt, nil, false), dbt))
				err := tp.Err()
				tp.Reset()
				if err != nil {
					return math.NaN(), fmt.Errorf("train: evaluation at iteration %d: %w", t.Iteration, err)
				}
			}
			sum += loss
			count++
			*consumed += int64(mbs * dp)
		}
	}
	if t.par.World.Size() > 1 { // one rank's sums are exact as they are
		v := []float32{float32(sum), float32(count), 0}
		if failed {
			v[2] = 1
		}
		if err := t.par.DP.AllReduce(t.cctx, comm.Float32s(v), comm.Sum); err != nil {
			return math.NaN(), fmt.Errorf("train: evaluation at iteration %d: %w", t.Iteration, err)
		}
		if err := t.broadcastFromLastStage(v); err != nil {
			return math.NaN(), err
		}
		sum, count, failed = float64(v[0]), int(v[1]), v[2] > 0
	}
	if failed || count == 0 {
		return math.NaN(), nil
	}
	return sum / float64(count), nil
}

// trainBatch is micro-step i's batch of data-parallel rank r of dp, mbs
// samples, on the run's device, in MegatronPretrainingSampler's order: each
// micro-step takes mbs·DP consecutive samples from the consumed count, and
// rank r reads the r-th mbs of them.
func (t *Trainer) trainBatch(i, mbs, dp, r int) (gpt.Batch, error) {
	start := t.Consumed + int64((i*dp+r)*mbs)
	bt, err := makeBatch(t.train, start, mbs, t.cfg.SeqLength, t.cfg.Model.VocabSize)
	if err != nil {
		return gpt.Batch{}, fmt.Errorf("train: iteration %d: %w", t.Iteration+1, err)
	}
	return batchTo(bt, t.cfg.Device), nil
}

// makeBatch stacks samples [start, start+mbs) of src (wrapping around its
// length, as a multi-epoch index would) into a batch.
func makeBatch(src datagpt.Source, start int64, mbs, seq, vocab int) (gpt.Batch, error) {
	n := int64(src.Len())
	if n == 0 {
		return gpt.Batch{}, errors.New("dataset has no samples")
	}
	tokens := make([]int32, mbs*seq)
	labels := make([]int32, mbs*seq)
	mask := make([]float32, mbs*seq)
	pos := make([]int32, mbs*seq)
	var docs []int32
	for i := range mbs {
		idx := (start + int64(i)) % n
		s, err := src.Sample(int(idx))
		if err != nil {
			return gpt.Batch{}, fmt.Errorf("sample %d: %w", idx, err)
		}
		if len(s.Tokens) != seq || len(s.Labels) != seq {
			return gpt.Batch{}, fmt.Errorf("sample %d has %d tokens, want --seq-length=%d", idx, len(s.Tokens), seq)
		}
		for j, id := range s.Tokens {
			if id < 0 || int(id) >= vocab {
				return gpt.Batch{}, fmt.Errorf("sample %d token %d is id %d, outside the model's vocabulary of %d (check --vocab-size / the tokenizer used to preprocess)", idx, j, id, vocab)
			}
		}
		copy(tokens[i*seq:], s.Tokens)
		copy(labels[i*seq:], s.Labels)
		copy(mask[i*seq:], s.LossMask)
		copy(pos[i*seq:], s.PositionIDs)
		if s.DocIDs != nil {
			if docs == nil {
				docs = make([]int32, mbs*seq)
			}
			copy(docs[i*seq:], s.DocIDs)
		}
	}
	for i, l := range labels {
		if l < 0 { // padding (data/gpt.PadID): no loss, any valid id
			labels[i] = 0
			mask[i] = 0
		}
	}
	bt := gpt.Batch{Tokens: tensor.FromInt32(tokens, mbs, seq), Labels: tensor.FromInt32(labels, mbs, seq),
		LossMask: tensor.FromFloat32(mask, mbs, seq), Positions: tensor.FromInt32(pos, mbs, seq)}
	if docs != nil {
		bt.DocIDs = tensor.FromInt32(docs, mbs, seq)
	}
	return bt, nil
}

func (t *Trainer) printf(format string, args ...any) {
	if t.progress != nil {
		t.progress.clear()
	}
	fmt.Fprintf(t.cfg.Out, "[%s] "+format+"\n", append([]any{t.cfg.Now().Format("2006-01-02 15:04:05")}, args...)...)
}

// SetTest gives the run a test split, evaluated once after training as
// Megatron's do_test (with --eval-iters > 0).
func (t *Trainer) SetTest(src datagpt.Source) { t.test = src }

// doValid is Megatron's do_valid: a validation split and --eval-iters > 0.
func (t *Trainer) doValid() bool { return t.valid != nil && t.cfg.EvalIters > 0 }

// printEval prints Megatron's evaluation result block (evaluate_and_print_results).
func (t *Trainer) printEval(prefix string, loss float64) {
	s := fmt.Sprintf(" validation loss at %s | lm loss value: %.6E | lm loss PPL: %.6E | ", prefix, loss, math.Exp(math.Min(20, loss)))
	dashes := strings.Repeat("-", len(s)+1)
	t.rawf("%s", dashes)
	t.rawf("%s", s)
	t.rawf("%s", dashes)
}

// rawf prints a line without the timestamp (Megatron's print_rank_last).
func (t *Trainer) rawf(format string, args ...any) {
	if t.progress != nil {
		t.progress.clear()
	}
	fmt.Fprintf(t.cfg.Out, format+"\n", args...)
}

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

// decoupledGroups moves the word embedding and the output layer (Megatron's
// is_embedding_or_output_parameter) of every group into a group of their own
// scheduled between lr and minLR (--decoupled-lr, --decoupled-min-lr; the
// latter defaults to --min-lr). lr 0 leaves the groups as they are.
func decoupledGroups(groups []optim.Group, lr, minLR, defaultMin float64) []optim.Group {
	if lr <= 0 {
		return groups
	}
	if minLR <= 0 {
		minLR = defaultMin
	}
	var out, extra []optim.Group
	for _, g := range groups {
		dec := optim.Group{Name: g.Name + "_decoupled_lr", WDMult: g.WDMult, OverrideLR: true, MaxLR: lr, MinLR: minLR}
		kept := g
		kept.Params = nil
		for _, p := range g.Params {
			name, _, _ := strings.Cut(p.Name, "[") // distributed-optimizer pieces
			if name == "embedding.word_embeddings.weight" || name == "output_layer.weight" {
				dec.Params = append(dec.Params, p)
			} else {
				kept.Params = append(kept.Params, p)
			}
		}
		out = append(out, kept)
		extra = append(extra, dec)
	}
	return append(out, extra...)
}

// lossScale is the factor the loss is multiplied by before backward: the
// --fp16 loss scaler's scale, else 1.
func (t *Trainer) lossScale() float32 {
	if t.scaler == nil {
		return 1
	}
	return t.scaler.Scale()
}
