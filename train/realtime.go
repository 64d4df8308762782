package train

import (
	"fmt"
	"math"
	"strings"

	"github.com/gotron/gotron/comm"
	"github.com/gotron/gotron/tensor"
)

// runRealtimeTests is Megatron's --test-mode (Attention.run_realtime_tests,
// called in every attention forward with --qk-layernorm): the query and
// key layer norms' parameters must be the same on every data-parallel and
// every tensor-parallel rank, else the run stops naming the parameter and
// the two ranks. The parameters do not change between the forwards of one
// iteration, so gotron checks once before each iteration's forwards and
// before each evaluation.
func (st *stepper) runRealtimeTests() error {
	if !st.cfg.TestMode || !st.cfg.Model.QKLayerNorm {
		return nil
	}
	if err := st.syncParams(); err != nil {
		return err
	}
	if st.corruptReplica != nil {
		st.corruptReplica(st.Iteration, st.par.World.Rank(), st.localParams())
	}
	var ps []*tensor.Tensor
	for _, p := range st.localParams() {
		if strings.Contains(p.Name, ".q_layernorm.") || strings.Contains(p.Name, ".k_layernorm.") {
			ps = append(ps, p)
		}
	}
	var mine []float32
	for _, p := range ps {
		mine = append(mine, hostValues(p)...)
	}
	for _, g := range []struct {
		group comm.ProcessGroup
		name  string
	}{{st.par.DP, "DP"}, {st.par.TP, "TP"}} {
		size := g.group.Size()
		if size == 1 || len(mine) == 0 {
			continue
		}
		all := make([]float32, len(mine)*size)
		if err := g.group.AllGather(st.cctx, comm.Float32s(all), comm.Float32s(mine), nil); err != nil {
			return fmt.Errorf("train: iteration %d: --test-mode: %w", st.Iteration+1, err)
		}
		rank := g.group.Rank()
		for i := range size {
			off := i * len(mine)
			for _, p := range ps {
				n := p.Numel()
				src, tgt := all[off:off+n], hostValues(p)
				var diff float64
				for j := range src {
					d := float64(src[j]) - float64(tgt[j])
					diff += d * d
				}
				if diff != 0 {
					return fmt.Errorf("train: iteration %d: --test-mode: Discrepancy between %s in %s ranks %d and %d. Diff: %g", st.Iteration+1, p.Name, g.name, i, rank, math.Sqrt(diff))
				}
				off += n
			}
		}
	}
	return nil
}
