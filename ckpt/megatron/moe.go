package megatron

import (
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"

	"github.com/gotron/gotron/ckpt/torchpt"
	"github.com/gotron/gotron/model/gpt"
)

// Mixture-of-Experts checkpoints (spec megatron-moe-cp.md §5.3): Megatron
// core's MoE layer keys are gotron's parameter names — the router
// (mlp.router.weight), the experts as TEGroupedMLP
// (mlp.experts.linear_fc1.weightE, with --moe-grouped-gemm) or
// SequentialMLP (mlp.experts.local_experts.E.linear_fc1.weight), the shared
// expert (mlp.shared_experts.linear_fc1/fc2.weight, gate_weight). The
// experts are tensor-parallel over expert TP, which defaults to TP: fc1
// split by rows (GLU halves per rank, as the dense fc1), fc2 by columns.
// Expert-parallel rank files (mp_rank_TT[_PPP]_EEE) hold each rank's local
// experts, numbered from 0 on every rank: expert l of rank e is global
// expert e·E/EP + l.

// moeKeyRE matches a layer's MoE parameter names (after decoder.layers.N.).
var moeKeyRE = regexp.MustCompile(`^mlp\.(router\.weight|experts\.linear_fc[12]\.weight\d+|experts\.local_experts\.\d+\.linear_fc[12]\.weight|shared_experts\.(linear_fc[12]\.weight|gate_weight))$`)

// moeLayerName maps an MoE parameter key to gotron's name (the same) and
// its tensor-parallel merge.
func moeLayerName(rest string, swiglu bool) (name string, how merge, ok bool) {
	if !moeKeyRE.MatchString(rest) {
		return "", 0, false
	}
	switch {
	case rest == "mlp.router.weight" || rest == "mlp.shared_experts.gate_weight":
		return rest, replicated, true
	case strings.Contains(rest, "linear_fc1"):
		if swiglu {
			return rest, glu, true
		}
		return rest, rows, true
	}
	return rest, cols, true
}

// moeConfig reads the MoE arguments into cfg.MoE, refusing those gotron
// cannot represent (named).
func (a argset) moeConfig(cfg *gpt.Config) error {
	ep, err := a.intOr("expert_model_parallel_size", 1)
	if err != nil {
		return err
	}
	n, err := a.intOr("num_experts", 0)
	switch {
	case err != nil:
		return err
	case n == 0 && ep != 1:
		return fmt.Errorf("%s: args.expert_model_parallel_size=%d without num_experts", a.file, ep)
	case n == 0:
		return nil
	case n < 0 || n > 1<<16:
		return fmt.Errorf("%s: args.num_experts=%d: want 1..65536", a.file, n)
	case ep < 1 || n%ep != 0:
		return fmt.Errorf("%s: args.num_experts=%d over expert_model_parallel_size=%d: want a multiple", a.file, n, ep)
	}
	if etp, ok := a.get("expert_tensor_parallel_size"); ok {
		tp, _ := a.intOr("tensor_model_parallel_size", 1)
		if etp != tp {
			return fmt.Errorf("%s: args.expert_tensor_parallel_size=%v differs from tensor_model_parallel_size=%d: not read yet", a.file, etp, tp)
		}
	}
	m := &cfg.MoE
	m.NumExperts = int(n)
	ints := []struct {
		name string
		dst  *int
	}{{"moe_router_topk", &m.TopK}, {"moe_ffn_hidden_size", &m.FFNHiddenSize}, {"moe_router_num_groups", &m.NumGroups},
		{"moe_router_group_topk", &m.GroupTopK}, {"moe_shared_expert_intermediate_size", &m.SharedExpertFFN}}
	for _, f := range ints {
		v, err := a.intOr(f.name, 0)
		if err != nil {
			return err
		}
		if v < 0 || v > math.MaxInt32 {
			return fmt.Errorf("%s: args.%s=%d: want a size >= 0", a.file, f.name, v)
		}
		*f.dst = int(v)
	}
	bools := []struct {
		name string
		dst  *bool
	}{{"moe_router_pre_softmax", &m.PreSoftmax}, {"moe_grouped_gemm", &m.GroupedGEMM},
		{"moe_shared_expert_gate", &m.SharedExpertGate}, {"moe_pad_expert_input_to_capacity", &m.PadToCapacity}}
	for _, f := range bools {
		if *f.dst, err = a.boolOr(f.name, false); err != nil {
			return err
		}
	}
	if b, err := a.boolOr("moe_router_enable_expert_bias", false); err != nil {
		return err
	} else if b {
		return fmt.Errorf("%s: args.moe_router_enable_expert_bias=True: the router's expert_bias buffer is not imported yet", a.file)
	}
	floats := []struct {
		name string
		dst  *float64
	}{{"moe_router_topk_scaling_factor", &m.TopKScalingFactor}, {"moe_z_loss_coeff", &m.ZLossCoeff},
		{"moe_expert_capacity_factor", &m.CapacityFactor}, {"moe_input_jitter_eps", &m.InputJitterEps}}
	for _, f := range floats {
		if *f.dst, err = a.floatOr(f.name, 0); err != nil {
			return err
		}
	}
	score, err := a.strOr("moe_router_score_function", "softmax")
	if err != nil {
		return err
	}
	if m.Score, err = gpt.ParseRouterScore(score); err != nil {
		return fmt.Errorf("%s: args.moe_router_score_function: %w", a.file, err)
	}
	switch rd, err := a.strOr("moe_router_dtype", ""); {
	case err != nil:
		return err
	case rd == "fp64":
		m.RouterFP64 = true
	case rd != "" && rd != "fp32":
		return fmt.Errorf("%s: args.moe_router_dtype=%s: want fp32 or fp64", a.file, rd)
	}
	if p, err := a.strOr("moe_token_drop_policy", "probs"); err != nil {
		return err
	} else {
		m.DropByPosition = p == "position"
	}
	if err := a.moeBalancing(m); err != nil {
		return err
	}
	return a.moeLayerFreq(m, cfg.NumLayers)
}

// moeBalancing reads moe_router_load_balancing_type and moe_aux_loss_coeff
// (a value each, or lists of equal length).
func (a argset) moeBalancing(m *gpt.MoEConfig) error {
	list := func(name string) []any {
		v, ok := a.get(name)
		if !ok {
			return nil
		}
		if l, ok := v.(*torchpt.List); ok {
			return l.Items
		}
		return []any{v}
	}
	types, coeffs := list("moe_router_load_balancing_type"), list("moe_aux_loss_coeff")
	if len(types) == 0 {
		types = []any{"aux_loss"}
	}
	if len(coeffs) != len(types) && len(coeffs) != 0 {
		return fmt.Errorf("%s: args.moe_router_load_balancing_type has %d entries, moe_aux_loss_coeff %d", a.file, len(types), len(coeffs))
	}
	for i, t := range types {
		s, ok := t.(string)
		if !ok {
			return a.typeErr("moe_router_load_balancing_type", t, "a str")
		}
		lb, err := gpt.ParseLoadBalancingType(s)
		if err != nil {
			return fmt.Errorf("%s: args.%w", a.file, err)
		}
		c := 0.0
		if len(coeffs) > 0 {
			switch x := coeffs[i].(type) {
			case float64:
				c = x
			case int64:
				c = float64(x)
			default:
				return a.typeErr("moe_aux_loss_coeff", coeffs[i], "a number")
			}
		}
		switch lb {
		case gpt.AuxLoss:
			m.AuxLossCoeff = c
		case gpt.SeqAuxLoss:
			m.SeqAuxLossCoeff = c
		case gpt.GlobalAuxLoss:
			m.GlobalAuxLossCoeff = c
		}
	}
	return nil
}

// moeLayerFreq reads moe_layer_freq: an int, or the list Megatron parsed
// from "([0]*1+[1]*3)".
func (a argset) moeLayerFreq(m *gpt.MoEConfig, layers int) error {
	v, ok := a.get("moe_layer_freq")
	if !ok {
		return nil
	}
	switch x := v.(type) {
	case int64:
		if x < 1 || x > math.MaxInt32 {
			return fmt.Errorf("%s: args.moe_layer_freq=%d: want >= 1", a.file, x)
		}
		m.LayerFreq = fmt.Sprint(x)
		return nil
	case *torchpt.List:
		if len(x.Items) != layers {
			return fmt.Errorf("%s: args.moe_layer_freq has %d entries for num_layers=%d", a.file, len(x.Items), layers)
		}
		s := make([]string, len(x.Items))
		for i, it := range x.Items {
			b, ok := it.(int64)
			if !ok || (b != 0 && b != 1) {
				return fmt.Errorf("%s: args.moe_layer_freq[%d]=%v: want 0 or 1", a.file, i, it)
			}
			s[i] = fmt.Sprint(b)
		}
		m.LayerFreq = "[" + strings.Join(s, ",") + "]"
		return nil
	}
	return a.typeErr("moe_layer_freq", v, "an int or a list")
}

// expertKeyRE matches an expert's parameter (local index in group 1 or 2).
var expertKeyRE = regexp.MustCompile(`^mlp\.experts\.(?:linear_fc[12]\.weight(\d+)|local_experts\.(\d+)\.linear_fc[12]\.weight)$`)

// expertSources plans an expert parameter key k of chunk ch from every
// expert-parallel rank: rank e's local expert l becomes global expert
// e·E/EP + l.
func (c *Checkpoint) expertSources(ch chunk, ci int, k string, layerBase int, cfg gpt.Config) ([]*source, error) {
	m := layerRE.FindStringSubmatch(k)
	em := expertKeyRE.FindStringSubmatch(m[2])
	ls := em[1] + em[2]
	l, err := strconv.Atoi(ls)
	per := cfg.MoE.NumExperts / c.EP
	if err != nil || l >= per {
		return nil, fmt.Errorf("%s: %s: %s: local expert %s of %d per expert-parallel rank", ch.files[0].Path, ch.key, k, ls, per)
	}
	local, _ := strconv.Atoi(m[1])
	name, how, _ := moeLayerName(m[2], cfg.Activation == gpt.SwiGLU)
	var out []*source
	for e := range c.EP {
		slices := make([]*torchpt.Tensor, c.TP)
		for t, d := range ch.expertDicts[e] {
			v, ok := d.Get(k)
			tt, isT := v.(*torchpt.Tensor)
			if !ok || !isT {
				return nil, fmt.Errorf("%s: %s has no tensor %s (expert-parallel rank %d of %d)", ch.expertFiles[e][t].Path, ch.key, k, e, c.EP)
			}
			slices[t] = tt
		}
		g := strconv.Itoa(e*per + l)
		global := name[:len(name)-len(ls)] + g // linear_fcN.weight{l}
		if em[2] != "" {
			global = strings.Replace(name, "local_experts."+ls+".", "local_experts."+g+".", 1)
		}
		out = append(out, &source{from: ch.key + "." + k, file: ch.expertFiles[e][0].Path, slices: slices, chunk: ci, key: k,
			name: fmt.Sprintf("decoder.layers.%d.%s", layerBase+local, global), how: how})
	}
	return out, nil
}
