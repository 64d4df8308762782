package train

import (
	"testing"

	"github.com/gotron/gotron/parallel"
)

// TestGlobalAuxLossAcrossRanks: global_aux_loss with its counts summed over
// the tensor × data-parallel ranks (Megatron's tp_dp_cp group) gives one
// process's run of the same global batch at each of 10 iterations within
// 1e-5 — lm loss, global_load_balancing_loss (the global batch's loss),
// z-loss, grad norm — and its parameters at the end:
//
//   - TP=2 with sequence parallelism: each rank routes its half of the
//     tokens, a micro-batch's counts and tokens are the whole one's, and the
//     router's gradient is summed over TP: one process as it is.
//   - DP=2, EP=2×DP=2 (alltoall, also with PP=2: each stage's ranks sum
//     their layers' counts) and EP=2×DP=4: a micro-batch's counts are all
//     ranks' micro-batches' — one process's micro-batch of DP times the size,
//     which holds the same sequences (Megatron's sampler gives rank r the
//     r-th slice of each step's samples). Each rank's loss is its part of
//     that micro-batch's, and the data-parallel mean of the gradients
//     divides it by DP, as Megatron's does: the one process's coefficient
//     is the DP ranks' divided by DP.
func TestGlobalAuxLossAcrossRanks(t *testing.T) {
	cfg := moeTrainConfig()
	cfg.Model.MoE.AuxLossCoeff, cfg.Model.MoE.GlobalAuxLossCoeff = 0, 2e-2
	src, _ := dpDataset(t, cfg.SeqLength)
	const lb = "global_load_balancing_loss"

	tp := moeTPLayout{world: 2, pc: parallel.Config{TP: 2, ETP: 1}, alltoall: true}
	checkSameMoERun(t, "global_aux_loss "+tp.String(), runMoETP(t, cfg, moeTPLayout{}, src)[0], runMoETP(t, cfg, tp, src), lb)

	one := cfg
	one.MicroBatchSize *= 2
	one.Model.MoE.GlobalAuxLossCoeff /= 2
	ref := runMoETP(t, one, moeTPLayout{}, src)[0]
	for _, c := range []struct {
		name string
		l    moeTPLayout
	}{
		{"DP=2", moeTPLayout{world: 2, pc: parallel.Config{}}},
		{"EP=2×DP=2 alltoall", moeTPLayout{world: 2, pc: parallel.Config{EP: 2}, alltoall: true}},
		{"EP=2×DP=2×PP=2 alltoall", moeTPLayout{world: 4, pc: parallel.Config{EP: 2, PP: 2}, alltoall: true, pp: 2}},
	} {
		checkSameMoERun(t, "global_aux_loss "+c.name, ref, runMoETP(t, cfg, c.l, src), lb)
	}

	// DP=4 with EP=2 (expert DP 2): one micro-batch of 2 on each rank, one
	// of 8 in one process, the coefficient divided by 4
	one.MicroBatchSize, one.Model.MoE.GlobalAuxLossCoeff = 4*cfg.MicroBatchSize, cfg.Model.MoE.GlobalAuxLossCoeff/4
	checkSameMoERun(t, "global_aux_loss EP=2×DP=4 alltoall", runMoETP(t, one, moeTPLayout{}, src)[0],
		runMoETP(t, cfg, moeTPLayout{world: 4, pc: parallel.Config{EP: 2}, alltoall: true}, src), lb)
}
