package main

import (
	"flag"
	"fmt"
	"strconv"

	"github.com/gotron/gotron/model/gpt"
)

// moeFlags are Megatron's Mixture-of-Experts flags (gotron train and gotron
// memory). addMoEFlags registers them; apply sets gpt.Config.MoE, refusing
// the options this release does not build.
type moeFlags struct {
	numExperts, ffn, topk       int
	layerFreq                   string
	score                       string
	preSoftmax                  bool
	numGroups, groupTopK        int
	scaling                     float64
	expertBias                  bool
	biasRate                    float64
	jitter                      float64
	balancing, auxCoeff         listFlag
	zCoeff                      float64
	capacity                    float64
	dropPolicy                  string
	pad, grouped                bool
	sharedFFN                   int
	sharedGate, sharedOverlap   bool
	routerDType, dispatcher     string
	ep, etp                     int
	routerFusion, permuteFusion bool
}

func addMoEFlags(fs *flag.FlagSet, f *moeFlags) {
	fs.IntVar(&f.numExperts, "num-experts", 0, "MoE: routed experts per MoE layer (0: a dense model)")
	fs.IntVar(&f.ffn, "moe-ffn-hidden-size", 0, "MoE: each expert's MLP hidden size (default --ffn-hidden-size)")
	fs.IntVar(&f.topk, "moe-router-topk", 2, "MoE: experts per token")
	fs.StringVar(&f.layerFreq, "moe-layer-freq", "1", "MoE: which layers are MoE: N (every Nth, from layer 0) or a 0/1 list like \"([0]*1+[1]*3)\"")
	fs.StringVar(&f.score, "moe-router-score-function", "softmax", "MoE: router score function: softmax, sigmoid or sqrtsoftplus")
	fs.BoolVar(&f.preSoftmax, "moe-router-pre-softmax", false, "MoE: softmax over all experts before the top-k (not renormalised)")
	fs.IntVar(&f.numGroups, "moe-router-num-groups", 0, "MoE: expert groups for group-limited routing")
	fs.IntVar(&f.groupTopK, "moe-router-group-topk", 0, "MoE: groups each token may route to")
	fs.Float64Var(&f.scaling, "moe-router-topk-scaling-factor", 0, "MoE: multiply the top-k probabilities by this (0: none)")
	fs.BoolVar(&f.expertBias, "moe-router-enable-expert-bias", false, "MoE: aux-loss-free balancing: a per-expert bias on the selection scores, updated every iteration")
	fs.Float64Var(&f.biasRate, "moe-router-bias-update-rate", 1e-3, "MoE: the expert bias's update rate")
	fs.Float64Var(&f.jitter, "moe-input-jitter-eps", 0, "MoE: multiply the router's input by Uniform(1-eps, 1+eps) noise in training (0: none)")
	fs.Var(&f.balancing, "moe-router-load-balancing-type", "MoE: aux_loss (default), seq_aux_loss, global_aux_loss or none; several with one --moe-aux-loss-coeff each")
	fs.Var(&f.auxCoeff, "moe-aux-loss-coeff", "MoE: load-balancing loss coefficient(s) (default 0)")
	fs.Float64Var(&f.zCoeff, "moe-z-loss-coeff", 0, "MoE: router z-loss coefficient (0: none)")
	fs.Float64Var(&f.capacity, "moe-expert-capacity-factor", -1, "MoE: drop tokens beyond ceil(tokens·topk/experts·factor) per expert (unset or negative: dropless)")
	fs.StringVar(&f.dropPolicy, "moe-token-drop-policy", "probs", "MoE: which tokens stay within capacity: probs (highest probability) or position (earliest)")
	fs.BoolVar(&f.pad, "moe-pad-expert-input-to-capacity", false, "MoE: fill every expert to its capacity")
	fs.BoolVar(&f.grouped, "moe-grouped-gemm", false, "MoE: run all experts' GEMMs as one grouped GEMM (same results as the per-expert loop)")
	fs.IntVar(&f.sharedFFN, "moe-shared-expert-intermediate-size", 0, "MoE: hidden size of the shared expert (0: none)")
	fs.BoolVar(&f.sharedGate, "moe-shared-expert-gate", false, "MoE: gate the shared expert's output with sigmoid(x·g) per token")
	fs.BoolVar(&f.sharedOverlap, "moe-shared-expert-overlap", false, "MoE: overlap the shared expert with the dispatch (the same results; no effect in one process)")
	fs.StringVar(&f.routerDType, "moe-router-dtype", "", "MoE: router logits' precision: fp32 (gotron's default) or fp64 (the gating GEMM and top-k in float64)")
	fs.StringVar(&f.dispatcher, "moe-token-dispatcher-type", "allgather", "MoE: how expert-parallel ranks exchange tokens: allgather or alltoall (flex is not built)")
	fs.IntVar(&f.ep, "expert-model-parallel-size", 1, "MoE: expert-parallel size: each rank holds num-experts/EP experts (with data parallelism over the same ranks; gotron launch)")
	fs.IntVar(&f.etp, "expert-tensor-parallel-size", 0, "MoE: expert tensor-parallel size: each expert's fc1 rows and fc2 columns split over this many ranks (1, or the tensor-parallel size; 0: the tensor-parallel size)")
	fs.BoolVar(&f.routerFusion, "moe-router-fusion", false, "accepted: a GPU fusion; no effect on CPU")
	fs.BoolVar(&f.permuteFusion, "moe-permute-fusion", false, "accepted: a GPU fusion; no effect on CPU")
}

// noOps names the given MoE flags that change nothing here: GPU fusions
// and overlap, and the dispatcher without expert parallelism.
func (f *moeFlags) noOps(given map[string]bool) []string {
	var out []string
	for _, name := range []string{"moe-router-fusion", "moe-permute-fusion", "moe-shared-expert-overlap"} {
		if given[name] {
			out = append(out, "--"+name)
		}
	}
	if given["moe-token-dispatcher-type"] && f.ep <= 1 {
		out = append(out, "--moe-token-dispatcher-type (one expert-parallel rank)")
	}
	return out
}

// apply sets m.MoE from the flags (given: the flags on the command line).
func (f *moeFlags) apply(m *gpt.Config, given map[string]bool) error {
	if f.numExperts == 0 {
		for _, name := range []string{"moe-ffn-hidden-size", "moe-router-topk", "moe-layer-freq", "moe-router-load-balancing-type",
			"moe-aux-loss-coeff", "moe-z-loss-coeff", "moe-expert-capacity-factor", "moe-grouped-gemm",
			"moe-shared-expert-intermediate-size", "moe-router-score-function", "moe-router-enable-expert-bias"} {
			if given[name] {
				return fmt.Errorf("--%s needs --num-experts", name)
			}
		}
		if f.ep > 1 {
			return fmt.Errorf("--expert-model-parallel-size=%d needs --num-experts", f.ep)
		}
		// --expert-tensor-parallel-size without experts is not refused:
		// Megatron still builds (and checks against the world size) its
		// expert rank generator, and so does parallelConfig; a Megatron
		// functional test (tp2_pp2_cp2_etp4_dp_last) relies on it.
		return nil
	}
	if f.numExperts < 0 {
		return fmt.Errorf("--num-experts=%d: want > 0", f.numExperts)
	}
	switch {
	case f.ep < 1:
		return fmt.Errorf("--expert-model-parallel-size=%d: want >= 1", f.ep)
	case f.numExperts%f.ep != 0:
		return fmt.Errorf("--num-experts=%d is not divisible by --expert-model-parallel-size=%d", f.numExperts, f.ep)
	case f.etp < 0:
		return fmt.Errorf("--expert-tensor-parallel-size=%d: want >= 1", f.etp)
	case f.routerDType != "" && f.routerDType != "fp32":
		return fmt.Errorf("--moe-router-dtype %q: want fp32 or fp64", f.routerDType)
	case f.dispatcher == "flex":
		return fmt.Errorf("--moe-token-dispatcher-type flex: not built yet (allgather and alltoall are)")
	case f.dispatcher != "allgather" && f.dispatcher != "alltoall":
		return fmt.Errorf("--moe-token-dispatcher-type %q: want allgather or alltoall", f.dispatcher)
	case f.dropPolicy != "probs" && f.dropPolicy != "position":
		return fmt.Errorf("--moe-token-drop-policy %q: want probs or position", f.dropPolicy)
	case given["moe-expert-capacity-factor"] && f.capacity == 0:
		return fmt.Errorf("--moe-expert-capacity-factor=0: want > 0 (negative or unset for dropless)")
	}
	c := gpt.MoEConfig{NumExperts: f.numExperts, FFNHiddenSize: f.ffn, TopK: f.topk, PreSoftmax: f.preSoftmax,
		NumGroups: f.numGroups, GroupTopK: f.groupTopK, TopKScalingFactor: f.scaling, ExpertBias: f.expertBias,
		ExpertBiasUpdateRate: f.biasRate, InputJitterEps: f.jitter, ZLossCoeff: f.zCoeff,
		DropByPosition: f.dropPolicy == "position", PadToCapacity: f.pad, GroupedGEMM: f.grouped,
		SharedExpertFFN: f.sharedFFN, SharedExpertGate: f.sharedGate, RouterFP64: f.routerDType == "fp64"}
	if f.topk == 0 {
		return fmt.Errorf("--moe-router-topk=0: want 1..%d", f.numExperts)
	}
	if f.layerFreq != "1" {
		c.LayerFreq = f.layerFreq
	}
	if f.capacity > 0 {
		c.CapacityFactor = f.capacity
	}
	var err error
	if c.Score, err = gpt.ParseRouterScore(f.score); err != nil {
		return err
	}
	types := f.balancing.values
	if len(types) == 0 {
		types = []string{"aux_loss"}
	}
	coeffs := f.auxCoeff.values
	if len(coeffs) == 0 {
		coeffs = []string{"0"}
	}
	if len(coeffs) != len(types) {
		return fmt.Errorf("--moe-aux-loss-coeff has %d values for %d --moe-router-load-balancing-type values: want one each", len(coeffs), len(types))
	}
	for i, s := range types {
		t, err := gpt.ParseLoadBalancingType(s)
		if err != nil {
			return err
		}
		v, err := strconv.ParseFloat(coeffs[i], 64)
		if err != nil {
			return fmt.Errorf("--moe-aux-loss-coeff %q: %v", coeffs[i], err)
		}
		switch t {
		case gpt.AuxLoss:
			c.AuxLossCoeff = v
		case gpt.SeqAuxLoss:
			c.SeqAuxLossCoeff = v
		case gpt.GlobalAuxLoss:
			c.GlobalAuxLossCoeff = v
		}
	}
	m.MoE = c
	return nil
}
