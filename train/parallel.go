package train

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"io"

	"github.com/gotron/gotron/comm"
	"github.com/gotron/gotron/optim"
	"github.com/gotron/gotron/parallel"
	"github.com/gotron/gotron/parallel/ddp"
	"github.com/gotron/gotron/tensor"
)

// This file wires data parallelism into the stepper (docs/design/parallel.md):
// the model stays the plain single-process model; ddp owns its gradients
// (and, with the distributed optimizer, its parameters) in flat buckets
// reduced over the data-parallel group; the trainer shards the sample
// stream, agrees on loss, NaN skips, the grad norm and stopping through one
// small all-reduce per iteration, and lets one rank log and write.

// dpSize and dpRank are this rank's data-parallel coordinates.
func (st *stepper) dpSize() int { return st.par.DPSize() }
func (st *stepper) dpRank() int { return st.par.DP.Rank() }

// isLogger reports whether this rank prints the log and progress bar:
// Megatron's last rank (the last pipeline stage of the last data-parallel
// replica).
func isLogger(p *parallel.Groups) bool { return p.World.Rank() == p.World.Size()-1 }

// isWriter reports whether this rank writes checkpoints: data-parallel
// rank 0 (global rank 0 without model parallelism).
func isWriter(p *parallel.Groups) bool { return p.World.Rank() == 0 }

// setupParallel checks the run's arguments agree on every rank, makes every
// replica start from data-parallel rank 0's parameters, and builds the
// gradient buffers (ddp's, when launched, at any size: a launched run keeps
// its layout of buffers whatever its world size) and the optimizer's
// parameters.
func (st *stepper) setupParallel(ctx context.Context, launched bool) ([]*optim.Param, error) {
	p := st.par
	if err := checkSameArgs(ctx, p.World, st.cfg.Args); err != nil {
		return nil, err
	}
	if !isLogger(st.par) {
		st.cfg.Out, st.cfg.Progress, st.cfg.MetricsFile = io.Discard, nil, ""
	}
	if st.cfg.FSDP != NoFSDP {
		return st.setupFSDP(ctx)
	}
	if !launched {
		ps := optimParams(st.localParams())
		st.reducer = localGrads{params: st.localParams(), bf16: st.cfg.DDP.ReduceInBF16}
		return ps, nil
	}
	// The routed experts of an MoE model are reduced and broadcast over
	// the expert-data-parallel group instead (moe.go).
	dense, experts := st.splitExperts(st.localParams())
	dc := st.cfg.DDP
	if p.InterDistOpt != nil { // --num-distributed-optimizer-instances: shard over this rank's instance
		dc.Instances = p.InterDistOpt
	}
	if st.cfg.CalculatePerTokenLoss {
		// Megatron's gradient_scaling_factor 1: plain sums over DP × CP,
		// divided by the global token count in reduceGrads.
		dc.GradientScale = 1
	}
	d, err := ddp.New(dense, p.IntraDistOpt, dc, st.sharedEmbedding())
	if err != nil {
		return nil, err
	}
	st.reducer = ddpGrads{d}
	var de *ddp.DDP
	if len(experts) > 0 {
		ec := dc // with instances, the same group across them (Megatron's shared inter-instance group)
		ec.GradientScale, ec.AverageInCollective = 1/float32(p.DPCP.Size()), false
		if st.cfg.CalculatePerTokenLoss {
			ec.GradientScale = 1 // expert_gradient_scaling_factor 1
		}
		if de, err = ddp.New(experts, p.IntraExpertDistOpt, ec, nil); err != nil {
			return nil, err
		}
		st.reducer = moeGrads{dense: d, experts: de}
	}
	for _, w := range dense {
		if err := staged(w, func(v []float32) error { return p.DP.Broadcast(ctx, comm.Float32s(v), 0) }); err != nil {
			return nil, fmt.Errorf("train: broadcast parameter %s from data-parallel rank 0: %w", w.Name, err)
		}
	}
	for _, w := range experts {
		if err := staged(w, func(v []float32) error { return p.ExpertDP.Broadcast(ctx, comm.Float32s(v), 0) }); err != nil {
			return nil, fmt.Errorf("train: broadcast expert %s from expert-data-parallel rank 0: %w", w.Name, err)
		}
	}
	if st.cfg.DDP.DistributedOptimizer {
		if de != nil {
			return append(d.ShardParams(), de.ShardParams()...), nil
		}
		return d.ShardParams(), nil
	}
	return optimParams(st.localParams()), nil
}

// checkSameArgs compares a hash of every rank's arguments and names the ranks
// whose command line differs from rank 0's.
func checkSameArgs(ctx context.Context, world comm.ProcessGroup, args map[string]any) error {
	b, err := json.Marshal(args)
	if err != nil {
		return err
	}
	h := fnv.New64a()
	h.Write(b)
	mine := []int64{int64(binary.LittleEndian.Uint64(h.Sum(nil)))}
	all := make([]int64, world.Size())
	if err := world.AllGather(ctx, comm.Int64s(all), comm.Int64s(mine), nil); err != nil {
		return fmt.Errorf("train: compare arguments across ranks: %w", err)
	}
	var differ []int
	for r, v := range all {
		if v != all[0] {
			differ = append(differ, r)
		}
	}
	if len(differ) > 0 {
		return fmt.Errorf("train: rank(s) %v were started with different arguments from rank 0 (every rank must run the same command line): this is rank %d", differ, world.Rank())
	}
	return nil
}

// agreement is what the ranks settle each iteration in one all-reduce.
type agreement struct {
	loss    float64 // Σ of the token losses over the global batch
	tokens  float64 // Σ of the unmasked tokens over the global batch
	nonFin  bool    // some rank's gradient shard holds NaN/Inf
	sumSq   float64 // Σ g² over every shard (distributed optimizer)
	stopped bool    // some rank was asked to stop (a signal)
	timeUp  bool    // some rank passed --exit-duration-in-mins
}

// agree all-reduces the iteration's scalars over the data-parallel group
// (the world, while data parallelism is the only degree).
func (st *stepper) agree(ctx context.Context, a agreement) (agreement, error) {
	if st.par.World.Size() == 1 {
		return a, nil // one rank agrees with itself: no float32 round trip
	}
	b2f := func(b bool) float32 {
		if b {
			return 1
		}
		return 0
	}
	v := []float32{float32(a.loss), b2f(a.nonFin), float32(a.sumSq), b2f(a.stopped), b2f(a.timeUp), float32(a.tokens)}
	if err := st.par.World.AllReduce(ctx, comm.Float32s(v), comm.Sum); err != nil {
		return a, fmt.Errorf("train: iteration %d: %w", st.Iteration+1, err)
	}
	return agreement{loss: float64(v[0]), nonFin: v[1] > 0, sumSq: float64(v[2]), stopped: v[3] > 0, timeUp: v[4] > 0, tokens: float64(v[5])}, nil
}

// reduceGrads finishes this step's gradient reduction (with per-token
// loss, the division by the global batch's unmasked tokens, of which this
// rank's micro-batches hold tokens) and returns whether a gradient is
// NaN/Inf, the squared global norm (computed where the shard lives), and
// the all-reduced loss and stop request.
func (st *stepper) reduceGrads(ctx context.Context, a agreement, tokens int64, pending pendingLosses) (agreement, error) {
	st.tm.start(timerAllGradsSync, 1)
	err := st.reducer.Finish(ctx)
	st.tm.stop(timerAllGradsSync)
	if err != nil {
		return a, fmt.Errorf("train: iteration %d: %w", st.Iteration+1, err)
	}
	// Megatron HEAD times this reduction as
	// non-tensor-parallel-grads-all-reduce, a name training_log does not
	// list (it lists the older layernorm-grads-all-reduce): never printed.
	st.tm.start(timerNonTPGrads, 1)
	err = st.reduceSequenceParallelGrads(ctx)
	st.tm.stop(timerNonTPGrads)
	if err != nil {
		return a, err
	}
	if st.pipelined() {
		st.tm.start(timerEmbeddingGrads, 1)
	}
	err = st.reduceEmbeddingGrads(ctx)
	st.tm.stop(timerEmbeddingGrads)
	if err != nil {
		return a, err
	}
	if st.cfg.CalculatePerTokenLoss {
		if err := st.divideByTokens(ctx, tokens); err != nil {
			return a, err
		}
	}
	st.tm.stop(timerForwardBackward)
	st.tm.start(timerOptimizer, 1)
	// Every rank adds what it alone contributes, so one sum over the world
	// gives the global values: the loss from tensor-parallel rank 0 of each
	// replica, Σg² from the gradients this rank counts (normParams: its
	// shard, replicated parameters on TP rank 0 only) on the ranks that hold
	// distinct gradients (every rank with the distributed optimizer, DP rank
	// 0 otherwise).
	//
	// The found-inf flag, Σg² and the micro-batches' losses stay on the
	// device until one read-back here: the step's one synchronization
	// with the host (Megatron's is the gradient norm's .item()).
	dev := st.cfg.Device
	nonFin := tensor.NewOn(dev, tensor.Int32, 1)
	if st.scaler != nil {
		st.tm.start(timerUnscale, 1)
		st.grads.UnscaleTo(st.scaler.InvScale(), nonFin) // Megatron: unscale, then check for overflow
	} else {
		st.grads.FoundInfTo(nonFin)
	}
	// The norm (Megatron's get_grad_norm inside optimizer-clip-main-grad)
	// and the found-inf check share one all-reduce here: the clip timer
	// covers both, and the unscale timer (fp16) ends with it.
	st.tm.start(timerClipMainGrad, 1)
	var sumSq, sumSqExperts *tensor.Tensor
	// (without the distributed optimizer the gradients are replicated over
	// data × context parallelism: one rank of it counts them)
	if st.countsGrads() {
		sumSq = tensor.NewOn(dev, tensor.Int64, 1)
		st.normG.SumSquaresTo(sumSq)
	}
	if st.normExperts != nil && st.countsExpertGrads() {
		// each expert once: its shards, or on expert-data-parallel rank 0
		sumSqExperts = tensor.NewOn(dev, tensor.Int64, 1)
		st.normExperts.SumSquaresTo(sumSqExperts)
	}
	host := tensor.ReadBack(append([]*tensor.Tensor{nonFin, sumSq, sumSqExperts}, pending.chunks...)...)
	a.nonFin = host[0].Int32s()[0] != 0
	a.sumSq = 0
	if sumSq != nil {
		a.sumSq = tensor.Float64Bits(host[1])
	}
	if sumSqExperts != nil {
		a.sumSq += tensor.Float64Bits(host[2])
	}
	a.loss += pending.sum(host[3:])
	if st.par.TP.Rank() != 0 || (st.pipelined() && st.par.PP.Rank() != st.par.PP.Size()-1) {
		// the loss and its tokens once per replica: from tensor-parallel
		// rank 0 of the last stage (the others' loss sums are 0 or copies)
		a.loss, a.tokens = 0, 0
	}
	g, err := st.agree(ctx, a)
	st.tm.stop(timerClipMainGrad)
	st.tm.stop(timerUnscale)
	if err != nil {
		return g, err
	}
	if st.cfg.LogNumZerosInGrad {
		st.tm.start(timerCountZeros, 1)
	}
	err = st.countZeros(ctx)
	st.tm.stop(timerCountZeros)
	if err != nil {
		return g, err
	}
	// Megatron's train_step logs Σ token losses / Σ unmasked tokens over
	// the global batch, with or without per-token loss (0/0, NaN, when
	// every token is masked)
	g.loss /= g.tokens
	return g, nil
}

// countsGrads reports whether this rank counts its (dense) gradients in the
// global norm and zero count: every rank's shard with the distributed
// optimizer (those of the first instance with several: the other instances
// hold the same shards, as Megatron computes the norm within an instance),
// else data × context parallel rank 0 (the gradients are replicated).
func (st *stepper) countsGrads() bool {
	if st.cfg.DDP.DistributedOptimizer {
		return st.par.InterDistOpt == nil || st.par.InterDistOpt.Rank() == 0
	}
	return st.par.DPCP.Rank() == 0
}

// countsExpertGrads is countsGrads for the routed experts, replicated over
// the expert-data-parallel group.
func (st *stepper) countsExpertGrads() bool {
	if st.cfg.DDP.DistributedOptimizer {
		return st.par.InterDistOpt == nil || st.par.InterDistOpt.Rank() == 0
	}
	return st.par.ExpertDP.Rank() == 0
}

// divideByTokens is finalize_model_grads' per-token normalisation: the
// unmasked tokens of the global batch, N (this rank's micro-batches'
// tokens summed over data × context parallelism, in integers), divide
// every gradient this rank keeps, summed over the data-parallel ranks, so
// they become the gradient of Σ token losses / N. N = 0 divides by 1, as
// Megatron's clamp. Every pipeline and tensor-parallel rank counts the
// same tokens (each reads the micro-batches), so no broadcast from the last
// stage is needed.
func (st *stepper) divideByTokens(ctx context.Context, tokens int64) error {
	v := []int64{tokens}
	if st.par.DPCP.Size() > 1 {
		if err := st.par.DPCP.AllReduce(ctx, comm.Int64s(v), comm.Sum); err != nil {
			return fmt.Errorf("train: iteration %d: all-reduce of the unmasked tokens (--calculate-per-token-loss) over the data × context-parallel group: %w", st.Iteration+1, err)
		}
	}
	n := max(v[0], 1)
	// 1/N in float32, as Megatron's 1.0 / num_tokens tensor
	st.grads.Scale(1 / float32(n))
	return nil
}

// countZeros sets lastNumZeros for --log-num-zeros-in-grad: the zero
// gradient elements over the ranks that count gradients in the norm (the
// same parameters, so each gradient element is counted once), summed over
// the world in int64 as Megatron's count_zeros_fp32.
func (st *stepper) countZeros(ctx context.Context) error {
	st.lastNumZeros = -1
	if !st.cfg.LogNumZerosInGrad {
		return nil
	}
	n := int64(0)
	if st.countsGrads() {
		n = st.normG.CountZeros()
	}
	if st.par.World.Size() > 1 {
		v := []int64{n}
		if err := st.par.World.AllReduce(ctx, comm.Int64s(v), comm.Sum); err != nil {
			return fmt.Errorf("train: iteration %d: counting zero gradients: %w", st.Iteration+1, err)
		}
		n = v[0]
	}
	st.lastNumZeros = n
	return nil
}

// OptimizerStateBytes is the optimizer state this rank holds (Adam's two
// moments, SGD's momentum), in bytes.
func (t *Trainer) OptimizerStateBytes() int64 {
	n := int64(0)
	for _, g := range t.stepper.opt.Groups() {
		for _, p := range g.Params {
			n += int64(p.Data.Numel())
		}
	}
	kinds := int64(2) // exp_avg, exp_avg_sq
	if t.cfg.Optimizer == SGD {
		kinds = 1 // momentum_buffer
	}
	return 4 * kinds * n
}

// syncParams completes the parameter all-gathers of the last step
// (--overlap-param-gather leaves them in flight until the next forward):
// evaluation, checkpoints and the caller need whole parameters.
func (st *stepper) syncParams() error {
	if err := st.reducer.WaitParams(st.cctx); err != nil {
		return fmt.Errorf("train: iteration %d: %w", st.Iteration, err)
	}
	if st.fsdp != nil { // until the next step begins
		if err := st.fsdp.GatherAll(st.cctx); err != nil {
			return fmt.Errorf("train: iteration %d: %w", st.Iteration, err)
		}
	}
	// an evaluation after a step, or a load, reads new values
	st.bf16w.Invalidate()
	return nil
}

// syncWaitSinceLog is the mean time per iteration, in ms, that the last
// iters iterations spent waiting for the gradient reduction after backward
// (nil without data parallelism).
func (rp *reporter) syncWaitSinceLog(iters int64) any {
	w, ok := rp.stepper.reducer.syncWait()
	if !ok {
		return nil
	}
	ms := float64(w-rp.lastSyncWait) / 1e6 / float64(iters)
	rp.lastSyncWait = w
	return ms
}

// sumOver sums x over group g: x itself over one rank (exact, no float32
// round trip), else a float32 all-reduce.
func sumOver(ctx context.Context, g comm.ProcessGroup, x *float64) error {
	if g.Size() == 1 {
		return nil
	}
	v := []float32{float32(*x)}
	if err := g.AllReduce(ctx, comm.Float32s(v), comm.Sum); err != nil {
		return err
	}
	*x = float64(v[0])
	return nil
}
