package train

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/gotron/gotron/comm"
	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/optim"
	"github.com/gotron/gotron/parallel/ddp"
	"github.com/gotron/gotron/parallel/ep"
	"github.com/gotron/gotron/parallel/tp"
	"github.com/gotron/gotron/tensor"
)

// Mixture of Experts in training: the expert-parallel layout (a rank keeps
// E/EP experts of every MoE layer), the experts' gradient reduction over
// the expert-data-parallel group, and the MoE losses' data-parallel mean.

// expertModel is a model that knows its routed experts' weights.
type expertModel interface {
	SliceExperts(ep gpt.ExpertParallel) error
	IsExpertParam(p *tensor.Tensor) bool
}

// sliceExperts keeps this rank's experts (and their expert-tensor slices)
// when the layout is expert (tensor) parallel, and gives the routers the
// ranks sharing this rank's sequences (sequence parallelism) to sum their
// load-balancing counts over, and those whose tokens make up the global
// batch (global_aux_loss's counts: moeglobal.go).
func (st *stepper) sliceExperts(m Model) error {
	em, ok := m.(expertModel)
	if !ok {
		return nil
	}
	if gm, ok := m.(*gpt.Model); ok {
		if st.tokenPG().Size() > 1 {
			gm.TokenGroup = tokenGroup{st.tokenPG()}
		}
		gm.BatchGroup = st.batchGroupOf(gm)
		if !gm.Config.MoE.Enabled() {
			// A dense model has no experts to lay out; an (empty) expert
			// layout would read as expert parallelism to the inference
			// engine (RL's rollouts decode the training shard).
			return nil
		}
	}
	if st.par.EP.Size() == 1 && st.par.ExpertTP.Size() == 1 {
		return nil
	}
	st.expertGroup = &ep.Group{PG: st.par.EP, TPEP: st.par.ExpertTPEP, UseAllToAll: st.cfg.MoEAllToAll}
	if st.par.ExpertTP.Size() > 1 {
		st.expertGroup.TP = st.par.ExpertTP
	}
	return em.SliceExperts(st.expertGroup)
}

// tokenPG is the group of ranks sharing this rank's sequences: tensor ×
// context parallel (Megatron's tp_cp), over which the routers' counts and
// logged losses are summed.
func (st *stepper) tokenPG() comm.ProcessGroup {
	if st.par.TPCP != nil {
		return st.par.TPCP
	}
	return st.par.TP
}

// tokenGroup is gpt.TokenGroup over a process group: the routers' counts,
// summed in float64 (they are integers).
type tokenGroup struct{ pg comm.ProcessGroup }

func (g tokenGroup) Size() int { return g.pg.Size() }

func (g tokenGroup) SumFloat64s(tp *tensor.Tape, v []float64) {
	if tp.Err() != nil {
		return
	}
	n := make([]int64, len(v))
	for i, x := range v {
		n[i] = int64(x)
	}
	if err := g.pg.AllReduce(tp.Context(), comm.Int64s(n), comm.Sum); err != nil {
		tp.Fail(fmt.Errorf("train: sum the routers' load-balancing counts over the tensor×context-parallel group: %w", err))
		return
	}
	for i, x := range n {
		v[i] = float64(x)
	}
}

// expertPlan is the tensor-parallel style of parameter name with the routed
// experts' split over expert tensor parallelism (etp ranks, the
// tensor-parallel group's when > 1): as the dense MLP's, or whole.
func expertPlan(plan func(string) tp.Style, swiglu bool, etp int) func(string) tp.Style {
	return func(name string) tp.Style {
		if !gpt.IsRoutedExpert(name) {
			return plan(name)
		}
		switch {
		case etp == 1:
			return tp.Replicated
		case strings.Contains(name, "linear_fc2."):
			return tp.Row
		case swiglu:
			return tp.ColumnGLU
		}
		return tp.Column
	}
}

// otherExperts returns the experts other expert-parallel ranks hold
// (names and shapes), which a checkpoint has beyond this rank's parameters.
func (st *stepper) otherExperts() map[string][]int {
	if m, ok := st.model.(interface{ OtherExperts() map[string][]int }); ok {
		return m.OtherExperts()
	}
	return nil
}

// buffers returns the model's checkpointed state outside its parameters
// (an MoE router's expert bias), replicated on every rank of a pipeline
// stage; under pipelining only this rank's stages' (the others' are never
// updated here).
func (st *stepper) buffers() []*tensor.Tensor {
	if st.pipelined() {
		var out []*tensor.Tensor
		for _, s := range st.stages {
			if b, ok := s.(interface{ Buffers() []*tensor.Tensor }); ok {
				out = append(out, b.Buffers()...)
			}
		}
		return out
	}
	if m, ok := st.model.(interface{ Buffers() []*tensor.Tensor }); ok {
		return m.Buffers()
	}
	return nil
}

// splitExperts separates the routed experts' weights from the others.
func (st *stepper) splitExperts(ps []*tensor.Tensor) (dense, experts []*tensor.Tensor) {
	em, ok := st.model.(expertModel)
	for _, p := range ps {
		if ok && em.IsExpertParam(p) {
			experts = append(experts, p)
		} else {
			dense = append(dense, p)
		}
	}
	return dense, experts
}

// moeGrads is the gradient reduction of an MoE run: the dense parameters
// over the data-parallel group, the routed experts in buffers of their own
// over the expert-data-parallel group, pre-scaled by 1/(DP·CP) of the
// dense groups (Megatron's expert_parallel_buffers: an expert's gradient
// already holds the tokens of every expert-parallel peer). With the
// distributed optimizer each is sharded over its own group.
type moeGrads struct{ dense, experts *ddp.DDP }

func (m moeGrads) ZeroGrad() { m.dense.ZeroGrad(); m.experts.ZeroGrad() }
func (m moeGrads) readyHook() func([]*tensor.Tensor) {
	return func(ready []*tensor.Tensor) { m.dense.Hook(ready); m.experts.Hook(ready) }
}
func (m moeGrads) StartLastMicrobatch(ctx context.Context) {
	m.dense.StartLastMicrobatch(ctx)
	m.experts.StartLastMicrobatch(ctx)
}
func (m moeGrads) EndMicrobatch() { m.dense.EndMicrobatch(); m.experts.EndMicrobatch() }
func (m moeGrads) Finish(ctx context.Context) error {
	if err := m.dense.Finish(ctx); err != nil {
		return err
	}
	if err := m.experts.Finish(ctx); err != nil {
		return fmt.Errorf("expert gradients over the expert-data-parallel group: %w", err)
	}
	return nil
}
func (m moeGrads) GatherParams(ctx context.Context) error {
	if err := m.dense.GatherParams(ctx); err != nil {
		return err
	}
	return m.experts.GatherParams(ctx)
}
func (m moeGrads) WaitParams(ctx context.Context) error {
	if err := m.dense.WaitParams(ctx); err != nil {
		return err
	}
	return m.experts.WaitParams(ctx)
}
func (m moeGrads) GradViews(want func(*tensor.Tensor) bool) []*tensor.Tensor {
	return append(m.dense.GradViews(want), m.experts.GradViews(want)...)
}
func (m moeGrads) syncWait() (time.Duration, bool) {
	return m.dense.SyncWait() + m.experts.SyncWait(), true
}

// sumMoEMetricsOverStages sums the iteration's logged MoE losses over the
// pipeline ranks: each stage records only its own layers' losses, each
// already divided by the model's number of MoE layers (Megatron's tracker
// all-reduces the per-layer values over the pipeline group before its
// mean over layers).
func (st *stepper) sumMoEMetricsOverStages(ctx context.Context, m map[string]float64) error {
	if len(m) == 0 || !st.pipelined() {
		return nil
	}
	names := make([]string, 0, len(m))
	for name := range m {
		names = append(names, name)
	}
	sort.Strings(names)
	v := make([]float32, len(names)) // float32, as the data-parallel mean's
	for i, name := range names {
		v[i] = float32(m[name])
	}
	if err := st.par.PP.AllReduce(ctx, comm.Float32s(v), comm.Sum); err != nil {
		return fmt.Errorf("train: sum the MoE losses over the pipeline stages: %w", err)
	}
	for i, name := range names {
		m[name] = float64(v[i])
	}
	return nil
}

// averageMoEMetrics sums the iteration's logged MoE losses over the
// tensor(×context)-parallel ranks (with sequence parallelism each routed its
// shard of the sequences: Megatron's tracker sums over tp_cp) and averages them over
// the data-parallel group (each rank's value is its own micro-batches';
// needs_dp_avg), except global_load_balancing_loss, summed over it (each
// rank's value is its part of the global batch's loss).
func (st *stepper) averageMoEMetrics(ctx context.Context, m map[string]float64) error {
	tg := st.tokenPG()
	if len(m) == 0 || (st.par.DP.Size() == 1 && tg.Size() == 1) {
		return nil
	}
	names := make([]string, 0, len(m))
	for name := range m {
		names = append(names, name)
	}
	sort.Strings(names)
	v := make([]float64, len(names))
	for i, name := range names {
		v[i] = m[name]
	}
	f := make([]float32, len(v)) // float32, as the lm loss's agreement
	for i, x := range v {
		f[i] = float32(x)
	}
	if tg.Size() > 1 {
		if err := tg.AllReduce(ctx, comm.Float32s(f), comm.Sum); err != nil {
			return fmt.Errorf("train: sum the MoE losses over the tensor×context-parallel group: %w", err)
		}
	}
	if err := st.par.DP.AllReduce(ctx, comm.Float32s(f), comm.Sum); err != nil {
		return fmt.Errorf("train: average the MoE losses over the data-parallel group: %w", err)
	}
	for i, name := range names {
		m[name] = float64(f[i]) / float64(st.par.DP.Size())
		if name == globalLoadBalancingName {
			m[name] = float64(f[i])
		}
		if name == gpt.IndexerLossName {
			// every TP rank's is the whole loss (its target is summed over
			// the ranks' heads): Megatron reduces it over PP and DP only
			m[name] = float64(f[i]) / float64(st.par.DP.Size()*tg.Size())
		}
	}
	return nil
}

// splitNormParams separates the routed experts from the other parameters
// the global norm counts (whole parameters, or the distributed optimizer's
// pieces "name[lo:hi]").
func (st *stepper) splitNormParams(ps []*optim.Param) (dense, experts []*optim.Param) {
	_, ex := st.splitExperts(st.localParams())
	isExpert := map[string]bool{}
	for _, p := range ex {
		isExpert[p.Name] = true
	}
	for _, p := range ps {
		name, _, _ := strings.Cut(p.Name, "[")
		if isExpert[name] {
			experts = append(experts, p)
		} else {
			dense = append(dense, p)
		}
	}
	return dense, experts
}

// sumExpertBiasCounts sums the routers' token counts over the
// tensor(×context)- and data-parallel groups (every rank of this pipeline
// stage: Megatron's TP×DP×CP), in place, as integers.
func (st *stepper) sumExpertBiasCounts(ctx context.Context, counts [][]float64) error {
	tg := st.tokenPG()
	if len(counts) == 0 || (st.par.DP.Size() == 1 && tg.Size() == 1) {
		return nil
	}
	var flat []int64
	for _, c := range counts {
		for _, v := range c {
			flat = append(flat, int64(v))
		}
	}
	if tg.Size() > 1 {
		if err := tg.AllReduce(ctx, comm.Int64s(flat), comm.Sum); err != nil {
			return fmt.Errorf("train: sum the expert-bias token counts over the tensor×context-parallel group: %w", err)
		}
	}
	if err := st.par.DP.AllReduce(ctx, comm.Int64s(flat), comm.Sum); err != nil {
		return fmt.Errorf("train: sum the expert-bias token counts over the data-parallel group: %w", err)
	}
	i := 0
	for _, c := range counts {
		for j := range c {
			c[j] = float64(flat[i])
			i++
		}
	}
	return nil
}
