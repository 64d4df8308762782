package train

import (
	"os"
	"testing"

	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/parallel"
)

// TestMoEContextParallelMatchesOneProcess: MoE with context parallelism —
// each rank routes its two chunks of every sequence; the aux and seq-aux
// counts and the z-loss's mean are summed over tp_cp, global_aux_loss's
// over tp_cp × dp, the expert-bias counts over tp × dp × cp; the losses'
// backward scale is loss_scale·CP/M (Megatron's MoEAuxLossAutoScaler), the
// expert gradients reduced over expert DP with the dense 1/(DP·CP) — gives
// one process's lm, load-balancing and z losses and grad norm at each of 10
// iterations within 1e-5 and its parameters at the end, on a real .bin/.idx
// dataset: CP=2 (aux_loss), CP=2×EP=2 (alltoall, the expert ranks folded
// over the CP ranks). GOTRON_MOE_CP_FULL=1 adds CP=4, CP=2×EP=2 with
// seq_aux_loss, with global_aux_loss, with a sigmoid router's expert bias,
// CP=2×TP=2 with sequence parallelism and EP=2 (allgather), and
// CP=2×DP=2×EP=4.
func TestMoEContextParallelMatchesOneProcess(t *testing.T) {
	full := os.Getenv("GOTRON_MOE_CP_FULL") == "1"
	cfg := moeTrainConfig()
	src, _ := dpDataset(t, cfg.SeqLength)
	type variant int
	const (
		aux variant = iota
		seqAux
		global
		bias
	)
	refs := map[variant]dpRun{}
	for i, c := range []struct {
		name string
		l    moeTPLayout
		v    variant
	}{
		{"CP=2", moeTPLayout{world: 2, pc: parallel.Config{CP: 2}}, aux},
		{"CP=2×EP=2 alltoall", moeTPLayout{world: 2, pc: parallel.Config{CP: 2, EP: 2}, alltoall: true}, aux},
		{"CP=4", moeTPLayout{world: 4, pc: parallel.Config{CP: 4}}, aux},
		{"CP=2×EP=2 seq_aux_loss", moeTPLayout{world: 2, pc: parallel.Config{CP: 2, EP: 2}, alltoall: true}, seqAux},
		{"CP=2×EP=2 global_aux_loss", moeTPLayout{world: 2, pc: parallel.Config{CP: 2, EP: 2}, alltoall: true}, global},
		{"CP=2×EP=2 expert bias", moeTPLayout{world: 2, pc: parallel.Config{CP: 2, EP: 2}, alltoall: true}, bias},
		{"CP=2×TP=2 SP×EP=2 allgather", moeTPLayout{world: 4, pc: parallel.Config{CP: 2, TP: 2, EP: 2, ETP: 1}}, aux},
		{"CP=2×DP=2×EP=4 alltoall", moeTPLayout{world: 4, pc: parallel.Config{CP: 2, EP: 4}, alltoall: true}, aux},
	} {
		if !full && i >= 2 {
			continue
		}
		cf := cfg
		lb := "load_balancing_loss"
		switch c.v {
		case seqAux:
			cf.Model.MoE.AuxLossCoeff, cf.Model.MoE.SeqAuxLossCoeff = 0, 1e-2
			lb = "seq_load_balancing_loss"
		case global:
			cf.Model.MoE.AuxLossCoeff, cf.Model.MoE.GlobalAuxLossCoeff = 0, 2e-2
			lb = "global_load_balancing_loss"
		case bias:
			cf.Model.MoE.Score, cf.Model.MoE.ExpertBias, cf.Model.MoE.ExpertBiasUpdateRate = gpt.ScoreSigmoid, true, 0.05
		}
		ref, ok := refs[c.v]
		if !ok {
			ref = runMoETP(t, cf, moeTPLayout{}, src)[0]
			refs[c.v] = ref
		}
		checkSameMoERun(t, "MoE "+c.name, ref, runMoETP(t, cf, c.l, src), lb)
	}
}
