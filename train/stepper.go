package train

import (
	"context"
	"errors"
	"fmt"
	"github.com/gotron/gotron/parallel/ep"
	"math"
	"strings"
	"time"

	"github.com/gotron/gotron/comm"
	datagpt "github.com/gotron/gotron/data/gpt"
	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/optim"
	"github.com/gotron/gotron/parallel"
	"github.com/gotron/gotron/parallel/fsdp"
	"github.com/gotron/gotron/parallel/pp"
	"github.com/gotron/gotron/parallel/tp"
	"github.com/gotron/gotron/tensor"
)

// position is where a run is in its data and schedule: advanced by the
// stepper, saved and restored by the checkpointer, reported by the
// reporter. The Trainer holds it; its parts share it.
type position struct {
	Iteration     int64
	Consumed      int64 // consumed_train_samples
	ConsumedValid int64 // consumed_valid_samples
	Skipped       int64 // iterations skipped (NaN/Inf, fp16 overflow), over the run
	NaNIterations int64
	FLOPsSoFar    float64
	trainIters    int64 // the iteration the run ends at
}

// stepper runs training steps: the model laid out over the parallel
// groups (parallel.go, tensorpar.go, pipeline.go), the optimizer and its
// schedule, and the gradient reduction. One step is one global batch.
type stepper struct {
	*position
	cfg   *Config
	train datagpt.Source
	// rlPlan is the iteration's plan from a packed RL step (RLPlanner);
	// zero otherwise.
	rlPlan rlPlan
	// With RL packing: the bins the last iteration ran over all ranks
	// (Megatron's logged global batch size, mbs × DP × micro-batches; 0
	// unpacked) and the bins this run has run (consumed_train_bins, which
	// Megatron does not checkpoint: it counts from 0 in each run).
	packedBatch  int
	consumedBins int64
	// loaderBatches counts the micro-batches this run has read from each
	// split: their data-loader worker (Config.NumWorkers).
	loaderBatches map[datagpt.Source]int64

	arch  Architecture // how model was built and is laid out
	model Model        // this rank's model (its tensor-parallel slices)
	opt   optim.Optimizer
	sched *optim.Scheduler
	mb    *optim.Microbatches
	grads *optim.Grads
	normG *optim.Grads // the gradients this rank counts in the global norm
	// normExperts is the routed experts' part of the norm (counted on
	// expert-data-parallel rank 0; nil without experts), expertGroup the
	// expert-parallel group of an expert-parallel run.
	normExperts *optim.Grads
	expertGroup *ep.Group
	scaler      *optim.LossScaler // --fp16's loss scaler; nil otherwise
	rng         *tensor.RNG       // dropout stream (Megatron's default CUDA RNG)
	tape        *tensor.Tape
	// evalTape runs evaluation's forward passes: no gradients, but the
	// step's context and the failures of tensor-parallel collectives.
	evalTape *tensor.Tape

	// Data, tensor and pipeline parallelism; a process alone has the
	// groups of a world of one.
	par     *parallel.Groups
	cctx    context.Context       // collectives' context: not cancelled by a signal, so every rank stops at the same iteration
	reducer gradReducer           // the step's gradients, reduced over the data-parallel group
	fsdp    *fsdp.FSDP            // fully sharded data parallelism's shards; nil without it
	region  *tp.Region            // tensor-parallel region (of size 1 with TP = 1)
	plan    func(string) tp.Style // the architecture's tensor-parallel plan
	rankRNG *tensor.RNG           // per-TP-rank dropout stream (unused with TP = 1)
	stages  []Stage               // this pipeline rank's model chunks; nil without pipelining
	runners []*stageRunner        // the stages as the executor runs them
	execs   map[int]*pp.Executor  // pipeline executors by micro-batches per iteration
	// mbTokens are the unmasked tokens of this step's micro-batches under
	// pipelining (the executors' per-token loss weights).
	mbTokens []int64

	// rerun is Megatron's rerun state machine (rerun.go).
	rerun *rerunMachine
	// corruptReplica, set by tests only, changes a replica's parameters
	// before the weight-hash check (weighthash.go) hashes them.
	corruptReplica func(iteration int64, worldRank int, params []*tensor.Tensor)

	// The last step's outcome.
	stop          agreement // the agreed stop requests
	overflow      bool      // skipped for an fp16 gradient overflow
	skippedInARow int
	lastGradNorm  float64
	// lastNumZeros is the logged iteration's count of zero gradient
	// elements with Config.LogNumZerosInGrad; -1 (off, or the iteration
	// was skipped: Megatron's optimizer returns None) leaves it out.
	lastNumZeros int64
	moeMetrics   map[string]float64 // the last iteration's logged MoE losses; nil for a dense model
	lastLR       float64            // the next iteration's rate, as Megatron logs it

	startTime time.Time // of Run: --exit-duration-in-mins counts from it
	// tm are Megatron's timers (timers.go); nil with TimingLogLevel -1.
	tm *timers
	// printf prints a line of the run's log (the reporter's).
	printf func(format string, args ...any)
	// waitSnapshot waits, before the optimizer step changes the
	// parameters, until a save in flight has copied them (the
	// checkpointer's).
	waitSnapshot func()
	// bf16w are the parameters' bfloat16 copies under --bf16 (nil
	// otherwise; tensor.NewBF16Weights): invalidated whenever the
	// parameters may have changed.
	bf16w *tensor.BF16Weights
	// bf16Steps are the bfloat16 conversions and operand elements of the
	// products under --bf16 made inside training steps (the run's last
	// line on a device: bf16OperandsLine).
	bf16Steps tensor.BF16OperandCounts
}

// newStepper builds the model (whole from the seed, then this rank's
// slices and stages), moves it to the run's device, and builds the
// gradient buffers, the optimizer, the micro-batch calculator and the
// schedule. launched is whether the run was given its groups (else one
// process, cfg.Parallel the groups of a world of one).
func newStepper(cfg *Config, pos *position, train datagpt.Source, launched bool, printf func(string, ...any)) (*stepper, error) {
	st := &stepper{position: pos, cfg: cfg, train: train, tape: tensor.NewTape(), par: cfg.Parallel, cctx: context.Background(),
		printf: printf, waitSnapshot: func() {}}
	if cfg.BF16 {
		st.tape.SetMatmulPrecision(tensor.MatmulBF16)
	}
	if cfg.FP16 {
		st.tape.SetMatmulPrecision(tensor.MatmulFP16)
	}
	// Megatron scales the loss with --fp16 (dynamically unless --loss-scale)
	// and, with --bf16, only when --loss-scale asks for a constant scale.
	if cfg.FP16 || (cfg.BF16 && cfg.LossScale.Constant > 0) {
		var err error
		if st.scaler, err = optim.NewLossScaler(cfg.LossScale); err != nil {
			return nil, err
		}
	}
	root := tensor.NewRNG(uint64(cfg.Seed))
	st.arch = cfg.architecture()
	m, err := st.arch.Build(root.Fork("init"))
	if err != nil {
		return nil, err
	}
	if m, err = st.shardModel(m, root); err != nil {
		return nil, err
	}
	if err := st.sliceExperts(m); err != nil {
		return nil, err
	}
	st.model = m
	if err := st.setupContextParallel(m); err != nil {
		return nil, err
	}
	st.rng = root.Fork("dropout")
	if st.pipelined() {
		// Each pipeline stage draws its dropout masks from its own stream.
		st.rng = root.Fork(fmt.Sprintf("dropout-pp-rank-%d", st.par.PP.Rank()))
		if err := st.splitStages(m); err != nil {
			return nil, err
		}
	}
	st.moveToDevice()
	ps, err := st.setupParallel(st.cctx, launched)
	if err != nil {
		return nil, err
	}
	if err := st.setupRerun(); err != nil {
		return nil, err
	}
	if cfg.BF16 {
		// Megatron's bf16 model parameters: on a device whose products read
		// bfloat16 operands (--device sim; cuda under gemm-bf16) each
		// weight a product reads gets a bfloat16 copy, cast once a step
		// (invalidated when a step starts and when the parameters are
		// synchronized for evaluation, a checkpoint or a load).
		st.bf16w = tensor.NewBF16Weights(append(st.model.Params(), st.localParams()...))
	}
	st.tape.SetGradReadyHook(st.reducer.readyHook())
	// The loss is read before Backward, nothing of the forward after: the
	// forward's buffers go back to the arena as the backward leaves them.
	st.tape.SetReleaseInBackward(true)
	if cfg.ApplyWDToQKLayerNorm {
		optim.ApplyWDToQKLayerNorm(ps)
	}
	groups := decoupledGroups(optim.DefaultGroups(ps), cfg.DecoupledLR, cfg.DecoupledMinLR, cfg.Schedule.MinLR)
	groups = muPGroups(groups, cfg.Model.WidthMult(), cfg.Optimizer, cfg.Schedule.LR, cfg.Schedule.MinLR, cfg.Adam.Eps)
	if cfg.Optimizer == SGD {
		st.opt, err = optim.NewSGD(groups, optim.SGDConfig{Momentum: cfg.SGDMomentum})
	} else {
		st.opt, err = optim.NewAdamW(groups, cfg.Adam)
	}
	if err != nil {
		return nil, err
	}
	if st.grads, err = optim.NewGrads(ps); err != nil {
		return nil, err
	}
	normDense, normExperts := st.splitNormParams(st.normParams(ps))
	if st.normG, err = optim.NewGrads(normDense); err != nil {
		return nil, err
	}
	if len(normExperts) > 0 {
		if st.normExperts, err = optim.NewGrads(normExperts); err != nil {
			return nil, err
		}
	}
	if st.mb, err = optim.NewMicrobatches(optim.MicrobatchConfig{GlobalBatchSize: cfg.GlobalBatchSize, RampupBatchSize: cfg.RampupBatchSize,
		StepBatchSizeSchedule: cfg.StepBatchSizeSchedule, SeqLength: cfg.SeqLength,
		MicroBatchSize: cfg.MicroBatchSize, DataParallelSize: st.dpSize()}); err != nil {
		return nil, err
	}
	st.trainIters = cfg.TrainIters
	if cfg.TrainSamples > 0 {
		st.trainIters = st.mb.TrainIters(cfg.TrainSamples)
	}
	sf := cfg.Schedule
	sf.TrainIters, sf.TrainSamples, sf.GlobalBatchSize = cfg.TrainIters, cfg.TrainSamples, int64(cfg.GlobalBatchSize)
	sc, err := sf.Config()
	if err != nil {
		return nil, err
	}
	if st.sched, err = optim.NewScheduler(sc); err != nil {
		return nil, err
	}
	return st, nil
}

// checkSchedule refuses, before any work, a micro-batch count the
// pipeline schedule cannot run at the current position.
func (st *stepper) checkSchedule() error {
	if !st.pipelined() {
		return nil
	}
	if err := st.mb.UpdateChecked(st.Consumed); err != nil {
		return err
	}
	_, err := st.executor(st.mb.Num())
	return err
}

// step runs one iteration: forward/backward over the microbatches of one
// global batch, then clip, optimizer and scheduler steps (skipped on NaN/Inf
// as Megatron's found_inf). It returns the iteration's lm loss.
func (st *stepper) step(ctx context.Context) (float64, error) {
	if err := st.mb.UpdateChecked(st.Consumed); err != nil {
		return 0, err
	}
	// the bfloat16 copies are cast again from the parameters the last
	// step (or a load) changed, by the first product reading each: the
	// rollouts' here, and again after the parameter gather below
	st.bf16w.Invalidate()
	if rl := st.cfg.RL; rl != nil {
		// get_grpo_data_iterator: the rollouts of a new collection, from the
		// current weights, before train_step.
		err := rl.Prepare(ctx, st.model, st.noGradTape(), st.Iteration, st.Consumed)
		if err != nil {
			return 0, fmt.Errorf("train: iteration %d: %w", st.Iteration+1, err)
		}
	}
	n, mbs := st.mb.Num(), st.mb.MicroBatchSize()
	dp, r := st.dpSize(), st.dpRank()
	st.rlPlan = rlPlan{}
	if p, ok := st.cfg.RL.(RLPlanner); ok {
		micro, first, seqs, packed := p.Plan()
		if packed {
			if micro <= 0 || first < 0 || seqs < 0 {
				return 0, fmt.Errorf("train: iteration %d: the RL step's packed plan of %d micro-batches from sample %d (%d sequences): want micro-batches > 0 and the rest >= 0", st.Iteration+1, micro, first, seqs)
			}
			st.rlPlan = rlPlan{packed: true, first: first, sequences: seqs}
			n = micro
		}
	}
	if err := st.reducer.WaitParams(st.cctx); err != nil {
		return 0, fmt.Errorf("train: iteration %d: %w", st.Iteration+1, err)
	}
	st.bf16w.Invalidate() // an overlapped parameter gather changed them now
	if st.cfg.BF16 {
		before := tensor.BF16GemmOperandCounts()
		defer func() { st.bf16Steps = st.bf16Steps.Add(tensor.BF16GemmOperandCounts().Sub(before)) }()
	}
	moe, _ := st.model.(moeModel)
	perToken := st.cfg.CalculatePerTokenLoss
	if moe != nil {
		// Megatron's MoEAuxLossAutoScaler scale: the loss scale over the
		// micro-batches, as each micro-batch's lm loss below, times CP
		// (loss_scale·CP/M, core ≥ 0.16): each context-parallel rank's
		// losses are its part of the whole sequences' (summed over tp_cp),
		// and the gradients' mean over DP×CP would divide them by CP. With
		// per-token loss the loss scale alone: the routers multiply each
		// loss by their tokens × TP·CP (SetPerTokenLoss), and the division
		// by the global batch's tokens leaves it the same weight.
		moe.SetPerTokenLoss(perToken)
		if perToken {
			moe.SetAuxLossScale(float64(st.lossScale()))
		} else {
			moe.SetAuxLossScale(float64(st.lossScale()) * float64(st.cpSize()) / float64(n))
		}
	}
	// Megatron's forward-backward includes finalize_model_grads (the
	// gradient reductions, stopped in reduceGrads); the optimizer timer
	// starts there and ends with the parameter gather.
	st.tm.start(timerForwardBackward, 1)
	defer st.tm.stop(timerForwardBackward)
	defer st.tm.stop(timerOptimizer)
	// Megatron's train_step: the forward and backward passes run again
	// while the rerun state machine asks (rerun.go); the optimizer has not
	// stepped and the data position has not moved, so a rerun sees the
	// same batches, and the machine restores the dropout streams.
	if err := st.runRealtimeTests(); err != nil {
		return 0, err
	}
	var g agreement
	for {
		again, err := st.rerun.shouldRunForwardBackward()
		if err != nil {
			return 0, err
		}
		if !again {
			break
		}
		if g, err = st.forwardBackward(ctx, n, mbs, dp, r, perToken); err != nil {
			return 0, err
		}
	}
	if save, exit, code := st.rerun.checkpointAndExit(); exit {
		return math.NaN(), &RerunExit{Code: code, Checkpoint: save, Iteration: st.Iteration}
	}
	st.stop = g
	loss := g.loss
	if moe != nil {
		// finalize_model_grads: the logged MoE losses, then the expert-bias
		// update (before the optimizer step, also when it is skipped).
		st.moeMetrics = moe.MoEMetrics(n)
		if err := st.sumMoEMetricsOverStages(st.cctx, st.moeMetrics); err != nil {
			return 0, err
		}
		if err := st.averageMoEMetrics(st.cctx, st.moeMetrics); err != nil {
			return 0, err
		}
		if err := st.sumExpertBiasCounts(st.cctx, moe.ExpertBiasCounts()); err != nil {
			return 0, err
		}
		if len(st.buffers()) > 0 {
			st.waitSnapshot() // an --async-save copies the expert bias before it moves
		}
		moe.FinishMoEIteration()
	}
	gbs := int64(st.mb.CurrentRunningGlobalBatchSize())
	// Megatron's scheduler increment is the micro-batches' samples; with
	// RL packing the consumed count (and the FLOPs' batch) is sequences.
	sequences := gbs
	st.packedBatch = 0
	if st.rlPlan.packed {
		gbs, sequences = int64(n*mbs*dp), st.rlPlan.sequences
		st.packedBatch = n * mbs * dp
		st.consumedBins += gbs
	}
	st.FLOPsSoFar += FLOPsPerIteration(st.cfg.Model, int(sequences), st.cfg.SeqLength)
	st.Iteration++
	st.Consumed += sequences
	st.lastLR = st.sched.LR()
	if st.scaler != nil {
		st.scaler.Update(g.nonFin)
	}
	if g.nonFin && st.scaler != nil && !math.IsNaN(loss) && !math.IsInf(loss, 0) {
		// An fp16 gradient overflow: the loss scale backs off and the
		// step is skipped, as Megatron's DynamicGradScaler; not a NaN
		// iteration.
		st.Skipped++
		st.overflow = true
		st.lastGradNorm = math.NaN()
		st.lastNumZeros = -1
		return loss, nil
	}
	st.overflow = false
	if g.nonFin || math.IsNaN(loss) || math.IsInf(loss, 0) {
		st.Skipped++
		st.NaNIterations++
		st.skippedInARow++
		if st.skippedInARow >= st.cfg.MaxSkipsInARow {
			return loss, fmt.Errorf("train: %d iterations in a row (up to %d) had a NaN/Inf loss or gradient: the run diverged; lower --lr, raise --lr-warmup-iters, or set --clip-grad", st.skippedInARow, st.Iteration)
		}
		st.lastGradNorm = math.NaN()
		st.lastNumZeros = -1
		return loss, nil
	}
	st.skippedInARow = 0
	st.lastGradNorm = optim.L2Norm(g.sumSq)
	if st.cfg.ClipGrad > 0 {
		st.tm.start(timerClipMainGrad, 1)
		st.grads.ClipByNorm(st.cfg.ClipGrad, st.lastGradNorm)
		st.tm.stop(timerClipMainGrad)
	}
	st.sched.Apply(st.opt.Groups())
	st.waitSnapshot()
	st.tm.start(timerInnerStep, 1)
	st.opt.Step()
	st.tm.stop(timerInnerStep)
	st.sched.Step(gbs)
	// Megatron logs the rate after the scheduler step: the next iteration's.
	st.lastLR = st.sched.LR()
	if st.cfg.DDP.DistributedOptimizer && st.dpSize() > 1 {
		st.tm.start(timerParamsGather, 1)
		defer st.tm.stop(timerParamsGather)
	}
	if err := st.reducer.GatherParams(st.cctx); err != nil {
		return loss, fmt.Errorf("train: iteration %d: %w", st.Iteration, err)
	}
	return loss, nil
}

// forwardBackward runs one iteration's forward and backward passes over
// its n micro-batches and reduces the gradients (Megatron's
// forward_backward_func with finalize_model_grads), checking each
// micro-batch's loss with the rerun state machine.
func (st *stepper) forwardBackward(ctx context.Context, n, mbs, dp, r int, perToken bool) (agreement, error) {
	st.reducer.ZeroGrad()
	// The rank's sum of token losses (each micro-batch's token mean times
	// its unmasked tokens, pretrain_gpt.loss_func's loss sum) and its
	// unmasked tokens: the logged lm loss is their ratio over the global
	// batch, as Megatron's train_step reports it.
	var lossSum float64
	var tokens int64
	// Without pipelining each micro-batch's mean token loss stays on the
	// device until reduceGrads reads it back with the gradient statistics,
	// once per iteration (Megatron reads its losses at the log interval
	// and the gradient norm once, clip_grad_norm's .item()).
	pending := pendingLosses{dev: st.cfg.Device}
	if st.pipelined() {
		var err error
		if lossSum, tokens, err = st.pipelineStep(n, mbs, dp, r); err != nil {
			return agreement{}, err
		}
		if st.isLastStage() {
			// gotron's pipeline executor gives the micro-batches' sum.
			st.rerun.validateLoss(lossSum)
		}
	}
	for i := 0; i < n && !st.pipelined(); i++ {
		if i == n-1 {
			st.reducer.StartLastMicrobatch(st.cctx)
		}
		bt, nt, err := st.trainBatch(i, mbs, dp, r)
		if err != nil {
			return agreement{}, err
		}
		// The tape carries the collectives' context; Backward returns the
		// first failure of those run in forward or backward.
		st.tape.SetContext(st.cctx)
		if err := st.beginMicrobatch(true); err != nil {
			return agreement{}, err
		}
		st.tm.start(timerForwardCompute, 2)
		logits := st.model.Forward(st.tape, bt, st.rng, true)
		var loss *tensor.Tensor
		if st.cfg.RL != nil {
			loss = st.cfg.RL.Loss(st.tape, logits, bt, st.sampleStart(i, mbs, dp, r))
			nt = max(nt, 1) // train_rl.loss_func counts an empty micro-batch as one token
		} else {
			loss = st.model.Loss(st.tape, logits, bt)
		}
		st.tm.stop(timerForwardCompute)
		if err := st.fp8().EndForward(st.amaxReduce()); err != nil {
			return agreement{}, fmt.Errorf("train: iteration %d: %w", st.Iteration+1, err)
		}
		if err := st.tape.Err(); err != nil {
			return agreement{}, fmt.Errorf("train: iteration %d: %w", st.Iteration+1, err)
		}
		if st.rerun.cfg.enabled() {
			// pretrain_gpt.loss_func validates the micro-batch's loss sum
			// (Megatron's validate_result reads it back too).
			st.rerun.validateLoss(scalar(loss) * float64(nt))
		}
		pending.add(loss, nt) // the tape's loss is released in backward: a copy
		tokens += nt
		st.tm.start(timerBackwardCompute, 2)
		err = st.tape.Backward(st.tape.Scale(loss, backwardScale(st.lossScale(), perToken, n, nt)))
		st.tm.stop(timerBackwardCompute)
		if err == nil {
			err = st.fp8().EndBackward(st.amaxReduce())
		}
		if err != nil {
			return agreement{}, fmt.Errorf("train: iteration %d: %w", st.Iteration+1, err)
		}
		if err := st.endMicrobatch(); err != nil {
			return agreement{}, err
		}
		st.reducer.EndMicrobatch()
		st.tape.Reset()
	}
	timeUp := st.cfg.ExitDuration > 0 && st.cfg.Now().Sub(st.startTime) >= st.cfg.ExitDuration
	return st.reduceGrads(st.cctx, agreement{loss: lossSum, tokens: float64(tokens), stopped: ctx.Err() != nil, timeUp: timeUp}, tokens, pending)
}

// pendingLosses are forward passes' mean token losses not yet read back:
// copies on the run's device, in chunks of pendingChunk, and each one's
// unmasked tokens. Under pipelining a training step has none (the
// executor returns the loss sum).
type pendingLosses struct {
	dev    tensor.Device
	chunks []*tensor.Tensor
	tokens []int64
}

// pendingChunk is the number of losses one device chunk holds: a step's
// micro-batches, an evaluation's forwards, usually fit one.
const pendingChunk = 1024

// add keeps a device copy of loss (a one-element tensor, the tape's, which
// it may release) with its tokens.
func (p *pendingLosses) add(loss *tensor.Tensor, tokens int64) {
	k := len(p.tokens)
	if k%pendingChunk == 0 {
		p.chunks = append(p.chunks, tensor.NewOn(p.dev, tensor.Float32, pendingChunk))
	}
	tensor.Copy((*tensor.Tape)(nil).Narrow(p.chunks[k/pendingChunk], 0, k%pendingChunk, 1), loss)
	p.tokens = append(p.tokens, tokens)
}

// sum is Σ loss·tokens over the losses in the order they were added, from
// the chunks read back (host): the rank's sum of token losses, as
// pretrain_gpt.loss_func's loss sums add up.
func (p *pendingLosses) sum(host []*tensor.Tensor) float64 {
	var s float64
	for i, nt := range p.tokens {
		s += float64(host[i/pendingChunk].Float32s()[i%pendingChunk]) * float64(nt)
	}
	return s
}

// isLastStage reports whether this rank runs the pipeline's last stage
// (where the loss is).
func (st *stepper) isLastStage() bool {
	for _, s := range st.stages {
		if s.IsLast() {
			return true
		}
	}
	return false
}

// backwardScale is the factor a micro-batch's mean token loss is
// multiplied by before backward: its weight in the step's objective times
// the loss scale (--fp16). The weight is 1/n of n micro-batches (Megatron's
// default) or, with --calculate-per-token-loss, its tokens unmasked
// tokens, which makes it the micro-batch's sum of token losses (the
// gradients are divided by the global batch's tokens after the
// data-parallel reduction).
func backwardScale(lossScale float32, perToken bool, n int, tokens int64) float32 {
	if perToken {
		return lossScale * float32(tokens)
	}
	return lossScale / float32(n)
}

// noGradTape returns the evaluation tape, carrying the collectives'
// context: forward passes without gradients whose tensor-parallel
// collectives' failures it records (Err). Its products run in the
// training's precision (--bf16, --fp16), as Megatron evaluates its bf16 or
// fp16 model.
func (st *stepper) noGradTape() *tensor.Tape {
	if st.evalTape == nil {
		st.evalTape = tensor.NewNoGradTape(nil)
		st.evalTape.SetMatmulPrecision(st.tape.MatmulPrecision())
	}
	st.evalTape.SetContext(st.cctx)
	return st.evalTape
}

// evaluate runs --eval-iters global batches of the validation set without
// gradients, continuing where the last evaluation stopped (Megatron keeps one
// validation iterator), and returns the mean loss. A batch is
// --eval-global-batch-size samples in forwards of --eval-micro-batch-size
// (Megatron's evaluate: eval_num_microbatches); data-parallel ranks each
// evaluate their micro-batch of every mbs·DP samples; the mean is over all.
func (st *stepper) evaluate(src datagpt.Source, consumed *int64) (float64, error) {
	gbs, mbs := st.cfg.EvalGlobalBatchSize, st.cfg.EvalMicroBatchSize
	if gbs == 0 || mbs == 0 { // a config that did not go through New's defaults
		gbs, mbs = st.cfg.GlobalBatchSize, st.cfg.MicroBatchSize
	}
	dp, r := st.dpSize(), st.dpRank()
	if err := st.syncParams(); err != nil {
		return math.NaN(), err
	}
	if err := st.runRealtimeTests(); err != nil {
		return math.NaN(), err
	}
	// Σ of the token losses and of the unmasked tokens: the loss is their
	// ratio over the evaluated batches and the data × context-parallel
	// ranks, as Megatron's evaluate (with or without per-token loss).
	var sum, count float64
	failed := false
	// Without pipelining each forward's mean token loss stays on the device
	// until one read-back after the loop (Megatron's evaluate reads its
	// accumulated losses once too); the sums are then taken in order.
	pending := pendingLosses{dev: st.cfg.Device}
	for range st.cfg.EvalIters {
		for i := 0; i < gbs/(mbs*dp) && !failed; i++ {
			start := (*consumed + int64(r*mbs)) % int64(max(src.Len(), 1))
			bt, err := makeWorkerBatch(src, start, mbs, st.cfg.SeqLength, st.cfg.Model.VocabSize, st.loaderWorker(src))
			if err == nil {
				bt, err = st.localTokens(bt)
			}
			if err != nil {
				st.printf("evaluation stopped: %v", err)
				failed = true
				break
			}
			var loss float64
			tokens := lossTokens(bt)
			if st.pipelined() {
				if loss, err = st.pipelineEval(bt); err != nil {
					return math.NaN(), err
				}
			} else {
				dbt := batchTo(bt, st.cfg.Device)
				tp := st.noGradTape()
				if err := st.beginMicrobatch(false); err != nil {
					return math.NaN(), err
				}
				// the loss is the tape's, released at its Reset: keep a copy
				pending.add(st.model.Loss(tp, st.model.Forward(tp, dbt, nil, false), dbt), tokens)
				// TE updates delayed scales after evaluation forwards too
				err := errors.Join(tp.Err(), st.fp8().EndForward(st.amaxReduce()), st.endMicrobatch())
				tp.Reset()
				if err != nil {
					return math.NaN(), fmt.Errorf("train: evaluation at iteration %d: %w", st.Iteration, err)
				}
			}
			if st.pipelined() {
				sum += loss * float64(tokens)
			}
			count += float64(tokens)
			*consumed += int64(mbs * dp)
		}
	}
	if len(pending.tokens) > 0 {
		sum = pending.sum(tensor.ReadBack(pending.chunks...))
	}
	if st.par.World.Size() > 1 { // one rank's sums are exact as they are
		v := []float32{float32(sum), float32(count), 0}
		if failed {
			v[2] = 1
		}
		// over data × context parallelism: each CP rank sums its own tokens
		if err := st.par.DPCP.AllReduce(st.cctx, comm.Float32s(v), comm.Sum); err != nil {
			return math.NaN(), fmt.Errorf("train: evaluation at iteration %d: %w", st.Iteration, err)
		}
		if err := st.broadcastFromLastStage(v); err != nil {
			return math.NaN(), err
		}
		sum, count, failed = float64(v[0]), float64(v[1]), v[2] > 0
	}
	if failed || count == 0 {
		return math.NaN(), nil
	}
	return sum / count, nil
}

// trainBatch is micro-step i's batch of data-parallel rank r of dp, mbs
// samples, on the run's device, in MegatronPretrainingSampler's order: each
// micro-step takes mbs·DP consecutive samples from the consumed count, and
// rank r reads the r-th mbs of them. tokens is the number of its tokens
// this rank computes a loss for (lossTokens).
func (st *stepper) trainBatch(i, mbs, dp, r int) (bt gpt.Batch, tokens int64, err error) {
	st.tm.start(timerBatchGenerator, 2)
	defer st.tm.stop(timerBatchGenerator)
	start := st.sampleStart(i, mbs, dp, r)
	bt, err = makeWorkerBatch(st.train, start, mbs, st.cfg.SeqLength, st.cfg.Model.VocabSize, st.loaderWorker(st.train))
	if err == nil {
		bt, err = st.localTokens(bt) // this CP rank's chunks
	}
	if err != nil {
		return gpt.Batch{}, 0, fmt.Errorf("train: iteration %d: %w", st.Iteration+1, err)
	}
	return batchTo(bt, st.cfg.Device), lossTokens(bt), nil
}

// rlPlan is a packed RL iteration's: its first sample and the sequences
// its micro-batches hold.
type rlPlan struct {
	packed           bool
	first, sequences int64
}

// sampleStart is the training source's index of rank r's micro-batch i
// of the iteration: in the consumed count's frame, or from a packed RL
// step's plan.
func (st *stepper) sampleStart(i, mbs, dp, r int) int64 {
	if st.rlPlan.packed {
		return st.rlPlan.first + int64(i*mbs)
	}
	return st.Consumed + int64((i*dp+r)*mbs)
}

// lossTokens is the number of tokens of host batch bt that count in the
// loss: Σ of its loss mask (pretrain_gpt.loss_func's num_tokens, the
// mask's sum truncated to an integer), every token without one. With
// context parallelism bt holds this rank's chunks, so each CP rank counts
// its own, as Megatron's.
func lossTokens(bt gpt.Batch) int64 {
	if bt.LossMask == nil {
		return int64(bt.Labels.Numel())
	}
	var n float64
	for _, m := range bt.LossMask.Float32s() {
		n += float64(m)
	}
	return int64(n)
}

// makeBatch stacks samples [start, start+mbs) of src (wrapping around its
// length, as a multi-epoch index would) into a batch.
func makeBatch(src datagpt.Source, start int64, mbs, seq, vocab int) (gpt.Batch, error) {
	return makeWorkerBatch(src, start, mbs, seq, vocab, 0)
}

// loaderWorker is the data-loader worker of the next micro-batch read from
// src: PyTorch's DataLoader deals batches to its workers in turn.
func (st *stepper) loaderWorker(src datagpt.Source) int {
	if st.cfg.NumWorkers <= 1 {
		return 0
	}
	if st.loaderBatches == nil {
		st.loaderBatches = map[datagpt.Source]int64{}
	}
	k := st.loaderBatches[src]
	st.loaderBatches[src] = k + 1
	return int(k % int64(st.cfg.NumWorkers))
}

// makeWorkerBatch is makeBatch read by data-loader worker worker
// (datagpt.WorkerSource; other sources do not depend on it).
func makeWorkerBatch(src datagpt.Source, start int64, mbs, seq, vocab, worker int) (gpt.Batch, error) {
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
		var s datagpt.Sample
		var err error
		if ws, ok := src.(datagpt.WorkerSource); ok && worker > 0 {
			s, err = ws.SampleForWorker(int(idx), worker)
		} else {
			s, err = src.Sample(int(idx))
		}
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

// lossScale is the factor the loss is multiplied by before backward: the
// --fp16 loss scaler's scale, else 1.
func (st *stepper) lossScale() float32 {
	if st.scaler == nil {
		return 1
	}
	return st.scaler.Scale()
}

func optimParams(params []*tensor.Tensor) []*optim.Param {
	var ps []*optim.Param
	for _, p := range params {
		if p.Grad == nil {
			p.Grad = tensor.ZerosLike(p) // on the parameter's device
		}
		ps = append(ps, &optim.Param{Name: p.Name, Data: p, Grad: p.Grad,
			NoWeightDecay: optim.DefaultNoWeightDecay(p.Name, p.Shape()), Dims: len(p.Shape())})
	}
	return ps
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

// muPGroups is Megatron's get_mup_config_overrides for width multiplier m
// (1: the groups as they are). Adam: every hidden matrix (two or more
// dimensions, not an embedding table nor the output layer, muP's
// "embedding-class") moves into a group of its own with peak lr·(1/m),
// floor minLR·(1/m) and ε eps·(1/m). SGD: every vector-like parameter (one
// dimension, or embedding-class) moves into one with lr·m and minLR·m.
// Parameters of --decoupled-lr groups keep their rates, as Megatron's.
func muPGroups(groups []optim.Group, m float64, opt Optimizer, lr, minLR, eps float64) []optim.Group {
	if m == 1 {
		return groups
	}
	if eps == 0 {
		eps = 1e-8 // AdamWConfig's default
	}
	embeddingClass := func(p *optim.Param) bool {
		name, _, _ := strings.Cut(p.Name, "[") // distributed-optimizer pieces
		return strings.HasPrefix(name, "embedding.") || name == "output_layer.weight"
	}
	var out, extra []optim.Group
	for _, g := range groups {
		if g.OverrideLR { // --decoupled-lr: MuP leaves those rates alone
			out = append(out, g)
			continue
		}
		var moved optim.Group
		if opt == SGD {
			moved = optim.Group{Name: g.Name + "_mup_vector_like", WDMult: g.WDMult, OverrideLR: true, MaxLR: lr * m, MinLR: minLR * m}
		} else {
			h := 1.0 / m // Megatron's hidden_lr_mult
			moved = optim.Group{Name: g.Name + "_mup_hidden", WDMult: g.WDMult, OverrideLR: true, MaxLR: lr * h, MinLR: minLR * h, Eps: eps * h}
		}
		kept := g
		kept.Params = nil
		for _, p := range g.Params {
			vectorLike := embeddingClass(p) || p.Dims <= 1
			if vectorLike == (opt == SGD) {
				moved.Params = append(moved.Params, p)
			} else {
				kept.Params = append(kept.Params, p)
			}
		}
		out = append(out, kept)
		extra = append(extra, moved)
	}
	return append(out, extra...)
}

// amaxReduce returns the delayed FP8 recipe's amax reduction over the
// tensor × data × context-parallel group (nil on one rank).
func (st *stepper) amaxReduce() func([]float32) error {
	g := st.par.AmaxReduction
	if g == nil || g.Size() < 2 {
		return nil
	}
	return func(amax []float32) error { return g.AllReduce(st.cctx, comm.Float32s(amax), comm.Max) }
}

// fp8EndForward ends a forward pass for the FP8 state (the delayed
// recipe's reduction and update; nothing otherwise).
func (st *stepper) fp8EndForward() error { return st.fp8().EndForward(st.amaxReduce()) }

// fp8 is the run's FP8 state (nil without FP8; its methods take nil).
func (st *stepper) fp8() *gpt.FP8 {
	if g, ok := st.arch.(GPT); ok {
		return g.FP8
	}
	return nil
}
