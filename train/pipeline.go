package train

import (
	"context"
	"errors"
	"fmt"

	"github.com/gotron/gotron/comm"
	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/parallel/pp"
	"github.com/gotron/gotron/tensor"
)

// This file wires pipeline parallelism into the stepper
// (docs/design/parallel.md): every rank builds the whole model from the seed
// (tensor-parallel sliced), keeps its pipeline stages (gpt.SplitStages: the
// layers of its virtual stages, the embedding on the first, the final norm,
// output layer and loss on the last, a copy of a tied word embedding there),
// and runs each iteration's micro-batches through parallel/pp's executor,
// which follows Megatron's schedule (1F1B, or interleaved with virtual
// stages). The data-parallel buffers, the optimizer and the gradient norm
// see only the rank's own parameters. Checkpoints stay whole: the stages'
// parameters and optimizer state are sent to pipeline rank 0, whose
// tensor-parallel ranks gather them as without pipelining, so a checkpoint
// loads at any pipeline size.

// pipelined reports whether this run splits the model over pipeline ranks
// (and runs its steps through the pipeline executor).
func (st *stepper) pipelined() bool { return st.par.PP.Size() > 1 }

// pipelineSplit is the layer split with the pipeline size of the layout.
func (c *Config) pipelineSplit() gpt.PipelineSplit {
	s := c.Pipeline
	s.PP = max(c.groups().Layout.Config.PP, 1)
	return s
}

// splitStages keeps this pipeline rank's stages of the whole model m.
func (st *stepper) splitStages(m Model) error {
	stages, err := st.arch.SplitStages(m, st.cfg.pipelineSplit(), st.par.PP.Rank())
	if err != nil {
		return fmt.Errorf("train: %w", err)
	}
	st.stages = stages
	for i, s := range stages {
		st.runners = append(st.runners, &stageRunner{stage: s, chunk: i, rng: st.rng, endForward: st.fp8EndForward})
	}
	return nil
}

// stageRunner runs one of the rank's stages over a step's micro-batches
// for the pipeline executor (parallel/pp.Stage): the failures of the
// tensor-parallel collectives its stage runs are recorded on the tape,
// which the executor checks. The trainer sets batches before each step;
// every pipeline rank reads them (tokens on the first stage, labels and
// loss mask on the last, positions and document ids on all).
type stageRunner struct {
	stage   Stage
	chunk   int         // the stage's model chunk on this rank
	rng     *tensor.RNG // dropout masks
	batches []gpt.Batch // the step's micro-batches
	// endForward ends each forward pass (the delayed FP8 recipe's scale
	// update)
	endForward func() error
}

// Forward runs micro-batch mb from in (nil on the first stage) and returns
// the activation, or on the last stage the micro-batch's mean loss.
func (r *stageRunner) Forward(tp *tensor.Tape, mb int, in *tensor.Tensor) (*tensor.Tensor, error) {
	if mb < 0 || mb >= len(r.batches) {
		return nil, fmt.Errorf("train: stage %d: micro-batch %d of %d", r.chunk, mb, len(r.batches))
	}
	bt := r.batches[mb]
	out := r.stage.Forward(tp, in, bt, r.rng, true)
	if r.stage.IsLast() {
		out = r.stage.Loss(tp, out, bt)
	}
	if r.endForward != nil {
		if err := r.endForward(); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// InputShape is the activation shape of micro-batch mb.
func (r *stageRunner) InputShape(mb int) []int {
	if mb < 0 || mb >= len(r.batches) {
		return nil
	}
	tok := r.batches[mb].Tokens
	return r.stage.ActivationShape(tok.Dim(0), tok.Dim(1))
}

// localParams are the parameters this rank trains: its stages' (the tied
// embedding's copy included on the last stage), or the whole model's.
func (st *stepper) localParams() []*tensor.Tensor {
	if !st.pipelined() {
		return st.model.Params()
	}
	var ps []*tensor.Tensor
	for _, s := range st.stages {
		ps = append(ps, s.Params()...)
	}
	return ps
}

// NumLocalParams is the number of parameters this rank holds (what
// Megatron prints per (tensor, pipeline) rank).
func (t *Trainer) NumLocalParams() int64 {
	var n int64
	for _, p := range t.stepper.localParams() {
		n += int64(p.Numel())
	}
	return n
}

// sharedEmbedding is the word embedding tied to the output layer on this
// rank, which data parallelism gives a bucket of its own: the first or the
// last stage's copy under pipelining, the model's table otherwise (nil when
// untied or on a middle stage).
func (st *stepper) sharedEmbedding() *tensor.Tensor {
	if !st.pipelined() {
		return st.arch.TiedEmbedding(st.model)
	}
	for _, s := range st.stages {
		if e := s.SharedEmbedding(); e != nil {
			return e
		}
	}
	return nil
}

// embeddingCopy is the last stage's copy of the tied word embedding on this
// rank, or nil: counted once in the gradient norm (on the first stage) and
// not written to checkpoints.
func (st *stepper) embeddingCopy() *tensor.Tensor {
	for _, s := range st.stages {
		if e := s.SharedEmbedding(); e != nil && s.IsEmbeddingCopy(e) {
			return e
		}
	}
	return nil
}

// executor returns the pipeline executor for m micro-batches per
// iteration (one per m: a batch-size ramp changes m).
func (st *stepper) executor(m int) (*pp.Executor, error) {
	if e := st.execs[m]; e != nil {
		return e, nil
	}
	sc := pp.Config{PP: st.par.PP.Size(), VPP: len(st.stages), Microbatches: m, GroupSize: st.cfg.MicrobatchGroupSize}
	acts, err := pp.Actions(sc, st.par.PP.Rank())
	if err != nil {
		return nil, fmt.Errorf("train: %d micro-batches per iteration (--global-batch-size / (--micro-batch-size × data-parallel size)): %w", m, err)
	}
	// The data-parallel hook is armed for the step's last backward on this
	// rank. With one chunk that is the chunk's last micro-batch, so its
	// buckets reduce during it; with virtual stages the other chunks'
	// buckets reduce after the schedule (one DDP over all chunks).
	lastChunk := 0
	for _, a := range acts {
		if a.Op == pp.Backward {
			lastChunk = a.Chunk
		}
	}
	stages := make([]pp.Stage, len(st.runners))
	for i, r := range st.runners {
		stages[i] = r
	}
	ec := pp.ExecConfig{
		Schedule: sc, Group: st.par.PP, Stages: stages, Actions: acts,
		NewTape: func(int) *tensor.Tape {
			tp := tensor.NewTape()
			tp.SetMatmulPrecision(st.tape.MatmulPrecision())
			tp.SetGradReadyHook(st.reducer.readyHook())
			return tp
		},
		LastBackward: func(chunk int) {
			if chunk == lastChunk {
				st.reducer.StartLastMicrobatch(st.cctx)
			}
		},
		AfterBackward: func(int) error {
			st.reducer.EndMicrobatch()
			return st.fp8().EndBackward(st.amaxReduce())
		},
		LossScale: st.lossScale,
		Device:    st.cfg.Device,
	}
	if st.cfg.CalculatePerTokenLoss {
		// each micro-batch's mean loss times its unmasked tokens: the sum
		// of its token losses (not divided by M)
		ec.LossWeight = func(mb int) float32 { return float32(st.mbTokens[mb]) }
	}
	e, err := pp.NewExecutor(ec)
	if err != nil {
		return nil, fmt.Errorf("train: %w", err)
	}
	if st.execs == nil {
		st.execs = map[int]*pp.Executor{}
	}
	st.execs[m] = e
	return e, nil
}

// pipelineStep runs one iteration's forward and backward passes through
// the pipeline and returns the sum of the micro-batches' token losses (0
// off the last stage) and their unmasked tokens (counted on every stage:
// each reads the batches, so none waits for Megatron's broadcast of the
// count from the last stage).
func (st *stepper) pipelineStep(n, mbs, dp, r int) (lossSum float64, tokens int64, err error) {
	e, err := st.executor(n)
	if err != nil {
		return 0, 0, err
	}
	bts := make([]gpt.Batch, n)
	st.mbTokens = st.mbTokens[:0]
	for i := range n {
		// Every stage reads the micro-batches (tokens on the first, labels
		// on the last, positions on all), from the same sample stream.
		var nt int64
		if bts[i], nt, err = st.trainBatch(i, mbs, dp, r); err != nil {
			return 0, 0, err
		}
		st.mbTokens = append(st.mbTokens, nt)
		tokens += nt
	}
	for _, rn := range st.runners {
		rn.batches = bts
	}
	if _, err := e.Step(st.cctx); err != nil {
		return 0, 0, fmt.Errorf("train: iteration %d: %w", st.Iteration+1, err)
	}
	// Megatron's level-2 timers of the pipeline schedule, from the
	// executor's own measurements of this step.
	s := e.Stats()
	st.tm.add(timerForwardCompute, 2, s.Forward)
	st.tm.add(timerBackwardCompute, 2, s.Backward)
	for name, d := range s.P2P {
		st.tm.add(name, 2, d)
	}
	for i, loss := range e.MicrobatchLosses() { // the last stage's
		lossSum += loss * float64(st.mbTokens[i])
	}
	return lossSum, tokens, nil
}

// pipelineEval runs micro-batch bt forward through the pipeline without
// gradients and returns its loss on the last stage (0 elsewhere). The
// activation travels the virtual stages in order, one message at a time,
// so any pipeline size and virtual stage count forms a chain that cannot
// deadlock.
func (st *stepper) pipelineEval(bt gpt.Batch) (float64, error) {
	g := st.par.PP
	p, rank := g.Size(), g.Rank()
	bt = batchTo(bt, st.cfg.Device)
	var loss float64
	for chunk, s := range st.stages {
		var x *tensor.Tensor
		if !s.IsFirst() {
			// Received into host memory, then copied to the device.
			x = tensor.Zeros(s.ActivationShape(bt.Tokens.Dim(0), bt.Tokens.Dim(1))...)
			if err := g.Recv(st.cctx, comm.Float32s(x.Float32s()), (rank+p-1)%p); err != nil {
				return 0, fmt.Errorf("train: evaluation: receive the activation of stage %d: %w", chunk*p+rank, err)
			}
			x = x.ToDevice(st.cfg.Device)
		}
		tp := st.noGradTape()
		out := s.Forward(tp, x, bt, nil, false)
		if s.IsLast() {
			loss = scalar(s.Loss(tp, out, bt))
		}
		if err := errors.Join(tp.Err(), st.fp8EndForward()); err != nil {
			tp.Reset()
			return 0, fmt.Errorf("train: evaluation: stage %d: %w", chunk*p+rank, err)
		}
		if s.IsLast() {
			tp.Reset()
			continue
		}
		err := g.Send(st.cctx, comm.Float32s(hostValues(out.Contiguous())), (rank+1)%p)
		tp.Reset()
		if err != nil {
			return 0, fmt.Errorf("train: evaluation: send the activation of stage %d: %w", chunk*p+rank, err)
		}
	}
	return loss, nil
}

// reduceEmbeddingGrads sums the gradients of the tied word embedding's two
// copies (first and last stage) over the embedding group, after the
// data-parallel reduction: on the pieces this rank holds, which are the
// same elements on both stages (the embedding has a bucket of its own).
func (st *stepper) reduceEmbeddingGrads(ctx context.Context) error {
	e := st.sharedEmbedding()
	if e == nil || st.par.Embedding.Size() == 1 { // no tied embedding here, or both uses on this rank
		return nil
	}
	views := st.reducer.GradViews(func(p *tensor.Tensor) bool { return p == e })
	if packed, dc, ok := packOnDevice(st.par.Embedding, views); ok { // in place on the device
		if err := dc.AllReduceTensor(ctx, packed, comm.Sum); err != nil {
			return fmt.Errorf("train: iteration %d: all-reduce of the tied word embedding's gradient over the embedding group: %w", st.Iteration+1, err)
		}
		unpack(views, packed)
		return nil
	}
	for _, v := range views {
		if err := staged(v, func(h []float32) error {
			return st.par.Embedding.AllReduce(ctx, comm.Float32s(h), comm.Sum)
		}); err != nil {
			return fmt.Errorf("train: iteration %d: all-reduce of the tied word embedding's gradient over the embedding group: %w", st.Iteration+1, err)
		}
	}
	return nil
}

// ownedParams are the parameters of stages written to checkpoints: all but
// the tied embedding's copy, in stage order.
func ownedParams(stages []Stage) []*tensor.Tensor {
	var out []*tensor.Tensor
	for _, s := range stages {
		for _, p := range s.Params() {
			if !s.IsEmbeddingCopy(p) {
				out = append(out, p)
			}
		}
	}
	return out
}

// pipelineDropoutOffsets gathers every rank's dropout stream positions
// (the stage's shared stream and, with tensor parallelism, the per-rank
// one) by world rank, for the checkpoint: under pipelining each stage draws
// from its own streams.
func (st *stepper) pipelineDropoutOffsets() ([][2]uint64, error) {
	if !st.pipelined() {
		return nil, nil
	}
	mine := []int64{int64(st.rng.State().Offset), int64(st.rankRNG.State().Offset)}
	all := make([]int64, 2*st.par.World.Size())
	if err := st.par.World.AllGather(st.cctx, comm.Int64s(all), comm.Int64s(mine), nil); err != nil {
		return nil, fmt.Errorf("train: --save: gather the dropout stream positions: %w", err)
	}
	out := make([][2]uint64, st.par.World.Size())
	for r := range out {
		out[r] = [2]uint64{uint64(all[2*r]), uint64(all[2*r+1])}
	}
	return out, nil
}

// restorePipelineDropout resumes this rank's dropout streams from a
// checkpoint written by the same layout (same world size and pipeline and
// tensor-parallel sizes); otherwise they start afresh, and it says so when
// dropout is on.
func (st *stepper) restorePipelineDropout(ra RunArgs) {
	if !st.pipelined() {
		return
	}
	l := st.par.Layout.Config
	same := len(ra.RankDropoutOffsets) == st.par.World.Size() && ra.PipelineSize == l.PP && ra.TensorSize == max(l.TP, 1)
	if !same {
		if st.cfg.Model.HiddenDropout > 0 || st.cfg.Model.AttentionDropout > 0 {
			st.printf("WARNING: the checkpoint's dropout streams were saved by another parallel layout: they start afresh")
		}
		return
	}
	o := ra.RankDropoutOffsets[st.par.World.Rank()]
	state := st.rng.State()
	state.Offset = o[0]
	st.rng.SetState(state)
	state = st.rankRNG.State()
	state.Offset = o[1]
	st.rankRNG.SetState(state)
}

// broadcastFromLastStage gives every pipeline rank the value the last
// stage computed (the evaluation loss).
func (st *stepper) broadcastFromLastStage(v []float32) error {
	if !st.pipelined() {
		return nil
	}
	if err := st.par.PP.Broadcast(st.cctx, comm.Float32s(v), st.par.PP.Size()-1); err != nil {
		return fmt.Errorf("train: evaluation at iteration %d: broadcast the loss from the last pipeline stage: %w", st.Iteration, err)
	}
	return nil
}
