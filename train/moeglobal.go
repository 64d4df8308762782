package train

import (
	"fmt"

	"github.com/gotron/gotron/comm"
	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/tensor"
)

// global_aux_loss across ranks (Megatron's TopKRouter._apply_global_aux_loss):
// each micro-batch's aux-loss counts are summed over every rank whose tokens
// make up the global batch at this pipeline stage — tensor × data × context
// parallel, Megatron's tp_dp_cp group — before they join the running mean,
// and the loss counts T_loc·n(tp_dp_cp) tokens. Each rank's loss is then its
// tokens' part of the global batch's loss: the logged value is their sum
// (needs_dp_avg=False), and its gradient, scaled like any micro-batch loss
// (loss_scale·CP/M, then the data-parallel mean of the gradients), carries
// Megatron's 1/DP.

// globalLoadBalancingName is the logged name of global_aux_loss.
const globalLoadBalancingName = "global_load_balancing_loss"

// batchGroup is gpt.TokenGroup over tp_cp × dp, as successive integer sums
// (tp_cp and dp partition tp_dp_cp: a sum over one, then the other, is the
// sum over all).
type batchGroup struct {
	pgs   []comm.ProcessGroup
	names []string
}

// batchGroupOf is the routers' batch group of this rank: nil when it is
// this rank alone or no global_aux_loss is on.
func (st *stepper) batchGroupOf(m *gpt.Model) gpt.TokenGroup {
	if m.Config.MoE.GlobalAuxLossCoeff <= 0 {
		return nil
	}
	var g batchGroup
	if tg := st.tokenPG(); tg != nil && tg.Size() > 1 {
		g.pgs, g.names = append(g.pgs, tg), append(g.names, "tensor×context-parallel")
	}
	if st.par.DP != nil && st.par.DP.Size() > 1 {
		g.pgs, g.names = append(g.pgs, st.par.DP), append(g.names, "data-parallel")
	}
	if len(g.pgs) == 0 {
		return nil
	}
	return g
}

func (g batchGroup) Size() int {
	n := 1
	for _, pg := range g.pgs {
		n *= pg.Size()
	}
	return n
}

func (g batchGroup) SumFloat64s(tp *tensor.Tape, v []float64) {
	if tp.Err() != nil {
		return
	}
	n := make([]int64, len(v))
	for i, x := range v {
		n[i] = int64(x)
	}
	for i, pg := range g.pgs {
		if err := pg.AllReduce(tp.Context(), comm.Int64s(n), comm.Sum); err != nil {
			tp.Fail(fmt.Errorf("train: sum global_aux_loss's counts over the %s group: %w", g.names[i], err))
			return
		}
	}
	for i, x := range n {
		v[i] = float64(x)
	}
}
