package gpt

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/gotron/gotron/parallel/tp"
	"github.com/gotron/gotron/tensor"
)

// Mixture of Experts: Megatron core's MoELayer (router, token permutation,
// experts, shared experts) in place of the dense MLP of the layers
// MoEConfig.LayerPattern marks. The layer loop (layer in model.go) is the
// same; only mlp branches to moe.

// RouterScore is --moe-router-score-function.
type RouterScore uint8

const (
	ScoreSoftmax      RouterScore = iota // Megatron's default
	ScoreSigmoid                         // DeepSeek-V3's
	ScoreSqrtSoftplus                    // sqrt(softplus(x))
)

var routerScoreNames = []string{ScoreSoftmax: "softmax", ScoreSigmoid: "sigmoid", ScoreSqrtSoftplus: "sqrtsoftplus"}

// ParseRouterScore parses "softmax", "sigmoid" or "sqrtsoftplus".
func ParseRouterScore(s string) (RouterScore, error) {
	i, err := parseEnum(routerScoreNames, s)
	if err != nil {
		return 0, fmt.Errorf("--moe-router-score-function=%q: %v", s, err)
	}
	return RouterScore(i), nil
}

func (s RouterScore) String() string { return enumString("RouterScore", routerScoreNames, s) }
func (s RouterScore) MarshalText() ([]byte, error) {
	return marshalEnum("--moe-router-score-function", routerScoreNames, s)
}
func (s *RouterScore) UnmarshalText(b []byte) error { return unmarshalEnum(s, b, ParseRouterScore) }

// LoadBalancingType is one --moe-router-load-balancing-type.
type LoadBalancingType uint8

const (
	AuxLoss       LoadBalancingType = iota // aux_loss, Megatron's default
	SeqAuxLoss                             // seq_aux_loss
	GlobalAuxLoss                          // global_aux_loss
	NoBalancing                            // none
)

var loadBalancingNames = []string{AuxLoss: "aux_loss", SeqAuxLoss: "seq_aux_loss", GlobalAuxLoss: "global_aux_loss", NoBalancing: "none"}

// ParseLoadBalancingType parses aux_loss, seq_aux_loss, global_aux_loss or
// none (sinkhorn and quantile_balancing are not built).
func ParseLoadBalancingType(s string) (LoadBalancingType, error) {
	if s == "sinkhorn" || s == "quantile_balancing" {
		return 0, fmt.Errorf("--moe-router-load-balancing-type=%s: not built yet (aux_loss, seq_aux_loss, global_aux_loss and none are)", s)
	}
	i, err := parseEnum(loadBalancingNames, s)
	if err != nil {
		return 0, fmt.Errorf("--moe-router-load-balancing-type=%q: %v", s, err)
	}
	return LoadBalancingType(i), nil
}

func (t LoadBalancingType) String() string {
	return enumString("LoadBalancingType", loadBalancingNames, t)
}

// metricName is the name Megatron logs a load-balancing loss under.
func metricName(lb tensor.LoadBalancing) string {
	switch {
	case lb.Seq:
		return "seq_load_balancing_loss"
	case lb.Global:
		return "global_load_balancing_loss"
	}
	return "load_balancing_loss"
}

// MoEConfig is the Mixture-of-Experts part of Config; NumExperts 0 is a
// dense model. Every field names its flag; zero values are Megatron's
// defaults where it has one. (Config stays comparable: no slices here.)
type MoEConfig struct {
	NumExperts    int // --num-experts
	FFNHiddenSize int // --moe-ffn-hidden-size; 0 means Config.FFNHiddenSize
	TopK          int // --moe-router-topk; 0 means 2
	// LayerFreq (--moe-layer-freq) marks the MoE layers in Megatron's
	// spelling: an integer N (layer i is MoE iff i%N == 0) or a list of 0/1
	// per layer such as "[1,0,1,0]" or "([0]*3+[1]*9)"; "" means every layer.
	LayerFreq  string
	Score      RouterScore // --moe-router-score-function
	PreSoftmax bool        // --moe-router-pre-softmax
	NumGroups  int         // --moe-router-num-groups
	GroupTopK  int         // --moe-router-group-topk
	// TopKScalingFactor (--moe-router-topk-scaling-factor); 0 means none.
	TopKScalingFactor float64
	// ExpertBias (--moe-router-enable-expert-bias) and its update rate
	// (--moe-router-bias-update-rate; 0 means 1e-3).
	ExpertBias           bool
	ExpertBiasUpdateRate float64
	// InputJitterEps (--moe-input-jitter-eps): the router's input is
	// multiplied by Uniform(1−eps, 1+eps) noise; 0 means none.
	InputJitterEps float64
	// The coefficient of each load-balancing loss
	// (--moe-router-load-balancing-type with --moe-aux-loss-coeff; Megatron
	// takes lists of equal length): aux_loss, seq_aux_loss and
	// global_aux_loss. 0 turns a loss off (Megatron's "none").
	AuxLossCoeff, SeqAuxLossCoeff, GlobalAuxLossCoeff float64
	ZLossCoeff                                        float64 // --moe-z-loss-coeff; 0 means none
	// CapacityFactor (--moe-expert-capacity-factor); 0 means dropless.
	CapacityFactor float64
	DropByPosition bool // --moe-token-drop-policy position (default probs)
	PadToCapacity  bool // --moe-pad-expert-input-to-capacity
	GroupedGEMM    bool // --moe-grouped-gemm
	// RouterFP64 (--moe-router-dtype fp64) computes the router's logits in
	// float64 (on the host); otherwise they are float32.
	RouterFP64 bool
	// SharedExpertFFN (--moe-shared-expert-intermediate-size) adds a dense
	// shared expert of that size; SharedExpertGate (--moe-shared-expert-gate)
	// gates it per token.
	SharedExpertFFN  int
	SharedExpertGate bool
}

// balancing lists the load-balancing losses that are on, with their
// coefficients.
func (c *MoEConfig) balancing() []tensor.LoadBalancing {
	var out []tensor.LoadBalancing
	if c.AuxLossCoeff > 0 {
		out = append(out, tensor.LoadBalancing{Coeff: c.AuxLossCoeff})
	}
	if c.SeqAuxLossCoeff > 0 {
		out = append(out, tensor.LoadBalancing{Seq: true, Coeff: c.SeqAuxLossCoeff})
	}
	if c.GlobalAuxLossCoeff > 0 {
		out = append(out, tensor.LoadBalancing{Global: true, Coeff: c.GlobalAuxLossCoeff})
	}
	return out
}

// Enabled reports whether the model has MoE layers.
func (c *MoEConfig) Enabled() bool { return c.NumExperts > 0 }

// IsMoELayer reports whether layer i (0-based) of numLayers is an MoE
// layer (for a validated config).
func (c *MoEConfig) IsMoELayer(i, numLayers int) bool {
	if !c.Enabled() {
		return false
	}
	p, err := ParseMoELayerFreq(c.LayerFreq, numLayers)
	return err == nil && (p == nil || p[i])
}

// NumMoELayers counts the MoE layers of numLayers.
func (c *MoEConfig) NumMoELayers(numLayers int) int {
	p, err := ParseMoELayerFreq(c.LayerFreq, numLayers)
	switch {
	case !c.Enabled() || err != nil:
		return 0
	case p == nil:
		return numLayers
	}
	n := 0
	for _, on := range p {
		if on {
			n++
		}
	}
	return n
}

// ParseMoELayerFreq parses --moe-layer-freq for numLayers layers: an integer
// N (layer i is MoE iff i%N == 0) or a list such as "[1,0,1,0]" or
// "([0]*3+[1]*9)". nil is every layer.
func ParseMoELayerFreq(s string, numLayers int) ([]bool, error) {
	s = strings.TrimSpace(s)
	if s == "" || s == "1" {
		return nil, nil
	}
	if n, err := strconv.Atoi(s); err == nil {
		if n <= 0 {
			return nil, fmt.Errorf("--moe-layer-freq=%s: want a positive integer or a list of 0/1 per layer", s)
		}
		p := make([]bool, numLayers)
		for i := range p {
			p[i] = i%n == 0
		}
		return p, nil
	}
	return parseLayerList("--moe-layer-freq", s, numLayers)
}

// parseLayerList parses a per-layer 0/1 list given to flag (Megatron
// evaluates it as Python): sums of [a,b,...] and [x]*n terms, optionally
// in parentheses, numLayers entries in all.
func parseLayerList(flag, s string, numLayers int) ([]bool, error) {
	var p []bool
	// a Python list expression: sums of [a,b,...] and [x]*n terms
	expr := strings.TrimSuffix(strings.TrimPrefix(strings.ReplaceAll(s, " ", ""), "("), ")")
	for _, term := range strings.Split(expr, "+") {
		rep := 1
		if i := strings.LastIndex(term, "]*"); i >= 0 {
			n, err := strconv.Atoi(term[i+2:])
			if err != nil || n < 0 {
				return nil, fmt.Errorf("%s=%s: bad repeat in %q", flag, s, term)
			}
			rep, term = n, term[:i+1]
		}
		if !strings.HasPrefix(term, "[") || !strings.HasSuffix(term, "]") {
			return nil, fmt.Errorf("%s=%s: want an integer or a list like [1,0,1,0] or ([0]*3+[1]*9)", flag, s)
		}
		var items []bool
		for _, v := range strings.Split(term[1:len(term)-1], ",") {
			switch v {
			case "0":
				items = append(items, false)
			case "1":
				items = append(items, true)
			default:
				return nil, fmt.Errorf("%s=%s: entry %q: want 0 or 1", flag, s, v)
			}
		}
		for range rep {
			p = append(p, items...)
		}
	}
	if len(p) != numLayers {
		return nil, fmt.Errorf("%s=%s: %d entries for --num-layers=%d", flag, s, len(p), numLayers)
	}
	return p, nil
}

// validate fills defaults and checks c for a model of cfg's shape, naming
// the flags (Megatron's checks, before anything is built).
func (c *MoEConfig) validate(cfg *Config) error {
	if c.NumExperts < 0 {
		return fmt.Errorf("gpt: --num-experts=%d: want > 0 (or 0 for a dense model)", c.NumExperts)
	}
	if !c.Enabled() {
		return nil
	}
	if c.TopK == 0 {
		c.TopK = 2
	}
	if c.FFNHiddenSize == 0 {
		c.FFNHiddenSize = cfg.FFNHiddenSize
	}
	if c.ExpertBiasUpdateRate == 0 {
		c.ExpertBiasUpdateRate = 1e-3
	}
	if _, err := ParseMoELayerFreq(c.LayerFreq, cfg.NumLayers); err != nil {
		return fmt.Errorf("gpt: %w", err)
	}
	finite := func(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }
	switch {
	case c.TopK < 0 || c.TopK > c.NumExperts:
		return fmt.Errorf("gpt: --moe-router-topk=%d: want 1..%d (--num-experts)", c.TopK, c.NumExperts)
	case c.FFNHiddenSize < 0:
		return fmt.Errorf("gpt: --moe-ffn-hidden-size=%d: want > 0", c.FFNHiddenSize)
	case c.CapacityFactor < 0 || !finite(c.CapacityFactor):
		return fmt.Errorf("gpt: --moe-expert-capacity-factor=%g: want > 0 (unset for dropless)", c.CapacityFactor)
	case (c.DropByPosition || c.PadToCapacity) && c.CapacityFactor == 0:
		return fmt.Errorf("gpt: --moe-token-drop-policy/--moe-pad-expert-input-to-capacity need --moe-expert-capacity-factor")
	case !(c.ZLossCoeff >= 0) || !finite(c.ZLossCoeff):
		return fmt.Errorf("gpt: --moe-z-loss-coeff=%g: want >= 0", c.ZLossCoeff)
	case !(c.InputJitterEps >= 0 && c.InputJitterEps < 1):
		return fmt.Errorf("gpt: --moe-input-jitter-eps=%g: want in [0, 1)", c.InputJitterEps)
	case !(c.TopKScalingFactor >= 0) || !finite(c.TopKScalingFactor):
		return fmt.Errorf("gpt: --moe-router-topk-scaling-factor=%g: want > 0", c.TopKScalingFactor)
	case c.ExpertBias && c.Score == ScoreSoftmax:
		return fmt.Errorf("gpt: --moe-router-enable-expert-bias needs --moe-router-score-function sigmoid or sqrtsoftplus (Megatron's rule)")
	case !(c.ExpertBiasUpdateRate > 0) || !finite(c.ExpertBiasUpdateRate):
		return fmt.Errorf("gpt: --moe-router-bias-update-rate=%g: want > 0", c.ExpertBiasUpdateRate)
	case c.SharedExpertFFN < 0:
		return fmt.Errorf("gpt: --moe-shared-expert-intermediate-size=%d: want > 0", c.SharedExpertFFN)
	case c.SharedExpertGate && c.SharedExpertFFN == 0:
		return fmt.Errorf("gpt: --moe-shared-expert-gate needs --moe-shared-expert-intermediate-size")
	case !cfg.DisableBiasLinear:
		return fmt.Errorf("gpt: MoE layers with linear biases are not built yet: set --disable-bias-linear (Mixtral, Qwen-MoE and DeepSeek have none)")
	}
	if c.GroupTopK > 0 || c.NumGroups > 0 {
		if c.NumGroups <= 0 || c.GroupTopK <= 0 || c.NumExperts%c.NumGroups != 0 || c.GroupTopK > c.NumGroups || c.TopK%c.GroupTopK != 0 || c.TopK/c.GroupTopK > c.NumExperts/c.NumGroups {
			return fmt.Errorf("gpt: --moe-router-num-groups=%d --moe-router-group-topk=%d with %d experts and top-%d: want groups dividing the experts, group top-k <= groups and dividing top-k", c.NumGroups, c.GroupTopK, c.NumExperts, c.TopK)
		}
	}
	for _, a := range []float64{c.AuxLossCoeff, c.SeqAuxLossCoeff, c.GlobalAuxLossCoeff} {
		if !(a >= 0) || !finite(a) {
			return fmt.Errorf("gpt: --moe-aux-loss-coeff=%g: want >= 0", a)
		}
	}
	if c.NumMoELayers(cfg.NumLayers) == 0 {
		return fmt.Errorf("gpt: --moe-layer-freq marks no layer as MoE")
	}
	return nil
}

// ExpertParallel is the expert-parallel layout of a model whose MoE layers
// hold E/Size() experts each (Megatron's EP), each expert's fc1 rows and
// fc2 columns split over TensorSize() ranks (expert tensor parallelism,
// ETP); parallel/ep implements it over process groups. nil is one rank
// holding every expert whole. The row exchanges are autograd ops: their
// backward is the reverse exchange.
type ExpertParallel interface {
	Size() int // EP
	Rank() int
	TensorSize() int // ETP
	TensorRank() int
	// AllToAllDispatch (Megatron's alltoall dispatcher) reports whether
	// tokens are exchanged by all-to-all; else by all-gather and
	// reduce-scatter (the allgather dispatcher).
	AllToAllDispatch() bool
	// GatherInts returns every rank's v (equal lengths) of the expert
	// tensor × model parallel group (ETP·EP ranks), in its rank order
	// ep·ETP + etp.
	GatherInts(tp *tensor.Tape, v []int32) []int32
	// AllToAll sends send[j] consecutive rows of x (n, c) to expert-parallel
	// rank j and returns the rows received, recv[j] from rank j, in rank
	// order.
	AllToAll(tp *tensor.Tape, x *tensor.Tensor, send, recv []int) *tensor.Tensor
	// AllGatherRows concatenates every expert tensor × model parallel
	// rank's x (n, c) along the rows; its backward sums the gradients and
	// keeps this rank's rows.
	AllGatherRows(tp *tensor.Tape, x *tensor.Tensor) *tensor.Tensor
	// ReduceScatterRows sums every expert tensor × model parallel rank's x
	// (ETP·EP·n, c) and keeps this rank's n rows; its backward all-gathers.
	ReduceScatterRows(tp *tensor.Tape, x *tensor.Tensor) *tensor.Tensor
	// GatherTensorRows concatenates the expert-tensor-parallel ranks' x,
	// rows[r] rows from rank r; ReduceScatterTensorRows sums them and keeps
	// rows[rank]. Each is the other's backward (identities with ETP 1).
	GatherTensorRows(tp *tensor.Tape, x *tensor.Tensor, rows []int) *tensor.Tensor
	ReduceScatterTensorRows(tp *tensor.Tape, x *tensor.Tensor, rows []int) *tensor.Tensor
}

// TokenGroup is the group of ranks that hold parts of the same sequences
// (Megatron's tp_cp group: with sequence parallelism each tensor-parallel
// rank routes its shard of the tokens): the routers' load-balancing counts
// are summed over it. nil is this rank alone.
type TokenGroup interface {
	Size() int
	// SumFloat64s sums v over the group in place (a failure is recorded
	// on the tape).
	SumFloat64s(tp *tensor.Tape, v []float64)
}

// MoELayer is the MLP of an MoE layer: router, experts, optional shared
// expert. Parameter names are Megatron core's.
type MoELayer struct {
	Router *tensor.Tensor   // mlp.router.weight (E, h)
	FC1    []*tensor.Tensor // each local expert's linear_fc1 (F or 2F, h)
	FC2    []*tensor.Tensor // each local expert's linear_fc2 (h, F)
	// FirstExpert is the global index of FC1[0]: the experts of
	// expert-parallel rank r are [r·L, (r+1)·L) (SliceExperts).
	FirstExpert int
	// ExpertBias (E) is the aux-loss-free balancing bias (mlp.router.expert_bias,
	// a buffer: no gradient); nil without --moe-router-enable-expert-bias.
	ExpertBias                 []float32
	SharedFC1, SharedFC2, Gate *tensor.Tensor // mlp.shared_experts.*
}

func (l *MoELayer) params() []*tensor.Tensor {
	ps := append([]*tensor.Tensor{l.Router}, l.FC1...)
	return append(append(ps, l.FC2...), l.SharedFC1, l.SharedFC2, l.Gate)
}

// newMoELayer creates layer i's MoE MLP. Expert weight names follow the
// experts' implementation (--moe-grouped-gemm: TEGroupedMLP's
// experts.linear_fc1.weight{l}; otherwise SequentialMLP's
// experts.local_experts.{l}.linear_fc1.weight).
func newMoELayer(cfg *Config, prefix string, normal func(name string, s float32, shape ...int) *tensor.Tensor, std, outStd float32) *MoELayer {
	c := &cfg.MoE
	h, f := cfg.HiddenSize, c.FFNHiddenSize
	glu := 1
	if cfg.Activation == SwiGLU {
		glu = 2
	}
	l := &MoELayer{Router: normal(prefix+"mlp.router.weight", std, c.NumExperts, h)}
	for e := range c.NumExperts {
		fc1, fc2 := fmt.Sprintf("%smlp.experts.local_experts.%d.linear_fc1.weight", prefix, e), fmt.Sprintf("%smlp.experts.local_experts.%d.linear_fc2.weight", prefix, e)
		if c.GroupedGEMM {
			fc1, fc2 = fmt.Sprintf("%smlp.experts.linear_fc1.weight%d", prefix, e), fmt.Sprintf("%smlp.experts.linear_fc2.weight%d", prefix, e)
		}
		l.FC1 = append(l.FC1, normal(fc1, std, glu*f, h))
		l.FC2 = append(l.FC2, normal(fc2, outStd, h, f))
	}
	if c.ExpertBias {
		l.ExpertBias = make([]float32, c.NumExperts)
	}
	if s := c.SharedExpertFFN; s > 0 {
		l.SharedFC1 = normal(prefix+"mlp.shared_experts.linear_fc1.weight", std, glu*s, h)
		l.SharedFC2 = normal(prefix+"mlp.shared_experts.linear_fc2.weight", outStd, h, s)
		if c.SharedExpertGate {
			l.Gate = normal(prefix+"mlp.shared_experts.gate_weight", std, 1, h)
		}
	}
	return l
}

// MoEState is what the MoE layers keep between micro-batches of an
// iteration: the losses' logged values, the expert-bias counts and
// global_aux_loss's running counts (Megatron's MoEMetricsTracker and router
// buffers). Training sets AuxLossScale before each micro-batch.
type MoEState struct {
	// AuxLossScale is the gradient every attached loss receives (Megatron's
	// MoEAuxLossAutoScaler.main_loss_backward_scale, loss_scale/M): the
	// losses count like the micro-batch's lm loss.
	AuxLossScale float64
	// PerTokenLoss is --calculate-per-token-loss: every attached loss is
	// pre-multiplied by the router's tokens times the token group's size
	// (TP×CP), as Megatron's router does, so that the trainer's division
	// of the gradients by the global batch's tokens leaves it the weight
	// 1/(M·DP) of the default; AuxLossScale is then the loss scale alone.
	PerTokenLoss bool
	metrics      map[string][]float64 // name → per layer, summed over micro-batches
	biasCounts   map[int][]float64    // layer → tokens per expert this iteration
	globalCounts map[int][]float64    // layer → global_aux_loss's running counts
	globalSteps  map[int]int
}

func newMoEState() *MoEState {
	return &MoEState{AuxLossScale: 1, metrics: map[string][]float64{}, biasCounts: map[int][]float64{},
		globalCounts: map[int][]float64{}, globalSteps: map[int]int{}}
}

// record adds a layer's logged value (Megatron's tracker.record).
func (s *MoEState) record(name string, layer, numLayers int, v float64) {
	vs := s.metrics[name]
	if vs == nil {
		vs = make([]float64, numLayers)
		s.metrics[name] = vs
	}
	vs[layer] += v
}

// SetAuxLossScale sets the gradient each MoE loss receives in the coming
// micro-batches' backward (MoEState.AuxLossScale); nothing for a dense
// model.
func (m *Model) SetAuxLossScale(s float64) {
	if m.MoE != nil {
		m.MoE.AuxLossScale = s
	}
	if m.dsa != nil { // DSA's indexer loss takes the same scale (schedules.py)
		m.dsa.LossScale = s
	}
}

// SetPerTokenLoss sets MoEState.PerTokenLoss (--calculate-per-token-loss);
// nothing for a dense model.
func (m *Model) SetPerTokenLoss(on bool) {
	if m.MoE != nil {
		m.MoE.PerTokenLoss = on
	}
	if m.dsa != nil {
		m.dsa.PerTokenLoss = on
	}
}

// MoEMetrics returns the iteration's logged MoE losses as Megatron's
// MoEMetricsTracker.report computes them (per name, the sum over layers of
// value/microBatches, divided by the number of MoE layers) and resets them.
// Names are Megatron's: load_balancing_loss (always present, as Megatron's
// substring test forces it), seq_load_balancing_loss,
// global_load_balancing_loss, z_loss; and with DSA's indexer loss
// IndexerLossName (dsa.go's IndexerLoss).
func (m *Model) MoEMetrics(microBatches int) map[string]float64 {
	out := m.moeMetrics(microBatches)
	if l, ok := m.IndexerLoss(microBatches); ok {
		if out == nil {
			out = map[string]float64{}
		}
		out[IndexerLossName] = l
	}
	return out
}

func (m *Model) moeMetrics(microBatches int) map[string]float64 {
	if m.MoE == nil {
		return nil
	}
	c := &m.Config.MoE
	n := float64(c.NumMoELayers(m.Config.NumLayers))
	out := map[string]float64{"load_balancing_loss": 0}
	for name, vs := range m.MoE.metrics {
		var s float64
		for i, v := range vs {
			s += v / float64(microBatches)
			vs[i] = 0
		}
		out[name] = s / n
	}
	for _, lb := range c.balancing() {
		if _, ok := out[metricName(lb)]; !ok {
			out[metricName(lb)] = 0 // logged even when not recorded yet
		}
	}
	return out
}

// Buffers returns the model's state that is not trained by gradients but
// belongs in checkpoints: every router's expert bias, as
// decoder.layers.N.mlp.router.expert_bias (Megatron's persistent buffer),
// host tensors aliasing the biases.
func (m *Model) Buffers() []*tensor.Tensor {
	var out []*tensor.Tensor
	for i := range m.Layers {
		if l := m.Layers[i].MoE; l != nil && l.ExpertBias != nil {
			b := tensor.FromFloat32(l.ExpertBias, len(l.ExpertBias))
			b.Name = fmt.Sprintf("decoder.layers.%d.mlp.router.expert_bias", i)
			out = append(out, b)
		}
	}
	return out
}

// ExpertBiasCounts returns the iteration's tokens per expert of every
// router with an expert bias, in layer order, for the trainer to sum over
// the data-parallel ranks in place before FinishMoEIteration (Megatron's
// all-reduce over TP×DP×CP); nil without expert bias.
func (m *Model) ExpertBiasCounts() [][]float64 {
	if m.MoE == nil || !m.Config.MoE.ExpertBias {
		return nil
	}
	var out [][]float64
	for i := range m.Layers {
		if m.Layers[i].MoE == nil {
			continue
		}
		c := m.MoE.biasCounts[i]
		if c == nil {
			c = make([]float64, m.Config.MoE.NumExperts)
			m.MoE.biasCounts[i] = c
		}
		out = append(out, c)
	}
	return out
}

// FinishMoEIteration is finalize_model_grads' MoE part, once per iteration
// after the gradients are reduced and before the optimizer step (also when
// that step is skipped): each router's expert bias moves by the update rate
// against its load (the counts of ExpertBiasCounts, which the trainer has
// summed over the data-parallel ranks), and global_aux_loss's running
// counts restart.
func (m *Model) FinishMoEIteration() {
	if m.MoE == nil {
		return
	}
	c := &m.Config.MoE
	for i := range m.Layers {
		l := m.Layers[i].MoE
		if l == nil {
			continue
		}
		if counts := m.MoE.biasCounts[i]; l.ExpertBias != nil && counts != nil {
			tensor.UpdateExpertBias(l.ExpertBias, counts, c.ExpertBiasUpdateRate)
			clear(counts)
		}
	}
	clear(m.MoE.globalCounts)
	clear(m.MoE.globalSteps)
}

// routerConfig is layer's TopKRouter for tokens (b, t).
func (m *Model) routerConfig(l *MoELayer, b, t int, losses bool) *tensor.RouterConfig {
	c := &m.Config.MoE
	rc := &tensor.RouterConfig{Experts: c.NumExperts, TopK: c.TopK, Score: tensor.ScoreFunction(c.Score),
		PreSoftmax: c.PreSoftmax, NumGroups: c.NumGroups, GroupTopK: c.GroupTopK, ScalingFactor: c.TopKScalingFactor,
		ExpertBias: l.ExpertBias, CapacityFactor: c.CapacityFactor, DropByPosition: c.DropByPosition,
		PadToCapacity: c.PadToCapacity, Batch: b, SeqLen: t}
	if !losses {
		return rc
	}
	rc.Balancing = c.balancing()
	// z = (c_z/n(TP×CP))·mean over this rank's tokens: summed over the
	// token group, the mean over all of them (Megatron's z_loss_func)
	rc.ZLossCoeff = c.ZLossCoeff / float64(m.tokenGroupSize())
	rc.Losses = len(rc.Balancing) > 0 || rc.ZLossCoeff > 0
	return rc
}

// tokenGroupSize is the number of ranks sharing this rank's sequences.
func (m *Model) tokenGroupSize() int {
	if m.TokenGroup == nil {
		return 1
	}
	return m.TokenGroup.Size()
}

// moe is MoELayer.forward for x (b, t, h), this rank's sequence shard with
// sequence parallelism: route this rank's tokens, permute them by expert,
// run the experts (the probability multiplies the activation before fc2,
// as Megatron's experts do; over expert-parallel ranks through the
// dispatcher), sum each token's outputs back, and add the shared expert (a
// dense MLP, tensor-parallel as the dense one).
func (m *Model) moe(tp *tensor.Tape, l *MoELayer, index int, x *tensor.Tensor, p *pass) *tensor.Tensor {
	c := &m.Config.MoE
	b, t, h := x.Dim(0), x.Dim(1), x.Dim(2)
	T := b * t
	xs := tp.Reshape(x, T, h)
	rin := xs
	if c.InputJitterEps > 0 && p.rng != nil {
		// Megatron draws the noise from the device RNG; here from the
		// dropout stream, so recomputation repeats it.
		u := make([]float32, T*h)
		p.rng.Uniform(u, float32(1-c.InputJitterEps), float32(1+c.InputJitterEps))
		rin = tp.Mul(xs, tensor.FromFloat32(u, T, h).ToDevice(x.Device()))
	}
	// Losses and counts only where Megatron computes them: training with
	// gradients (a checkpointed block's recomputation, not its first pass).
	recording := tp.Recording() && p.rng != nil // p.rng is set in training only
	rc := m.routerConfig(l, b, t, recording)
	var probs *tensor.Tensor
	var r *tensor.Routing
	if c.RouterFP64 {
		probs, r = tp.RouteFP64(rin, l.Router, rc)
	} else {
		probs, r = tp.Route(p.lin.Linear(tp, rin, l.Router, nil), rc) // logits (T, E)
	}
	if recording && m.MoE != nil {
		m.recordRouting(tp, r, rc, index, T)
	}
	var out *tensor.Tensor
	switch ep := m.Experts; {
	case m.expertSum != nil:
		out = m.decodeExperts(tp, l, xs, probs, r)
	case ep == nil || (ep.Size() == 1 && ep.TensorSize() == 1):
		rowsT, flatT, counts := r.PermutationOn(x.Device())
		xp := tp.Embedding(rowsT, xs) // (N, h), expert-major
		pp := tp.Embedding(flatT, tp.Reshape(probs, T*c.NumExperts, 1))
		out = tp.IndexAddRows(T, rowsT, m.experts(tp, l, xp, pp, counts))
		if m.expertsOverTP {
			// each rank ran its slice of every expert on the same tokens:
			// the partial outputs sum over the ranks, as the row-parallel
			// fc2 of the dense MLP. Forward only: the input's gradient
			// would lack the other ranks' parts.
			if tp.Recording() {
				tp.Fail(errors.New("gpt: experts split over the tensor-parallel ranks (SplitExpertsOverTP) are for decoding: training splits them with SliceExperts"))
			}
			out = m.region().SumOverRanks(tp, out)
		}
	case ep.AllToAllDispatch():
		out = m.dispatchAllToAll(tp, ep, l, xs, probs, r)
	default:
		out = m.dispatchAllGather(tp, ep, l, xs, probs, r)
	}
	dev := x.Device()
	if l.SharedFC1 != nil {
		// with SP the shared expert gathers the sequence and
		// reduce-scatters its output, as the dense MLP
		sh := m.region()
		s := sh.RowLinear(tp, p.lin, m.activate(tp, sh.ColumnLinear(tp, p.lin, x, l.SharedFC1, nil), nil), l.SharedFC2, nil)
		s = tp.Reshape(s, T, h)
		if l.Gate != nil {
			// sigmoid(g) as the first column of softmax([g, 0]), per
			// token of this rank
			g := p.lin.Linear(tp, xs, l.Gate, nil) // (T, 1)
			sg := tp.Narrow(tp.Softmax(tp.Concat(1, g, tensor.ZerosOn(dev, T, 1))), 1, 0, 1)
			s = tp.ScaleRows(s, sg)
		}
		out = tp.Add(out, s)
	}
	return tp.Reshape(out, b, t, h)
}

// experts runs the local experts on their consecutive row groups of xp
// (counts rows each), the probabilities pp (rows, 1) multiplying the
// activation before fc2 as in Megatron's experts. With expert tensor
// parallelism the output is this rank's partial sum (fc2 is row-parallel
// and does not reduce: the dispatcher's reduce-scatter does).
func (m *Model) experts(tp *tensor.Tape, l *MoELayer, xp, pp *tensor.Tensor, counts []int) *tensor.Tensor {
	grouped := m.Config.MoE.GroupedGEMM
	a := m.activate(tp, tp.GroupedLinear(xp, l.FC1, counts, grouped), nil)
	return tp.GroupedLinear(tp.ScaleRows(a, pp), l.FC2, counts, grouped)
}

// decodeExperts is the MoE layer of decoding's expert parallelism
// (DecodeExperts): every rank holds the same tokens and routed them alike,
// so no token travels; each runs its experts (slices) on the rows routed to
// them, in one-process order (expert-major, ascending tokens), sums each
// token's rows, and the ranks' partial outputs are summed.
func (m *Model) decodeExperts(tp *tensor.Tape, l *MoELayer, xs, probs *tensor.Tensor, r *tensor.Routing) *tensor.Tensor {
	E, T := m.Config.MoE.NumExperts, xs.Dim(0)
	rows, flat, counts := r.Permutation()
	first, L := l.FirstExpert, len(l.FC1)
	lo, n := 0, 0
	for e := range E {
		switch {
		case e < first:
			lo += counts[e]
		case e < first+L:
			n += counts[e]
		}
	}
	dev := xs.Device()
	out := tensor.ZerosOn(dev, T, xs.Dim(1))
	if n > 0 {
		rowsT := tensor.FromInt32(rows[lo:lo+n], n).ToDevice(dev)
		flatT := tensor.FromInt32(flat[lo:lo+n], n).ToDevice(dev)
		xp := tp.Embedding(rowsT, xs)
		pp := tp.Embedding(flatT, tp.Reshape(probs, T*E, 1))
		out = tp.IndexAddRows(T, rowsT, m.experts(tp, l, xp, pp, counts[first:first+L]))
	}
	return m.expertSum(tp, out)
}

// DecodeExperts splits m's experts for decoding over ep, whose ranks all
// hold the same tokens (one lockstep engine's: no data-parallel replicas
// with requests of their own): this rank keeps the experts of its
// expert-parallel rank, sliced for its expert-tensor rank (SliceExperts;
// a model built by NewPart with Part.Experts holds them already), runs them
// on the tokens routed to them, and sum all-reduces the partial outputs
// over the expert tensor × model parallel group (ETP·EP ranks). Forward
// only, for decoding: training's dispatchers exchange each rank's own
// tokens instead.
func (m *Model) DecodeExperts(ep ExpertParallel, sum func(*tensor.Tape, *tensor.Tensor) *tensor.Tensor) error {
	E, P := m.Config.MoE.NumExperts, ep.Size()
	switch {
	case !m.Config.MoE.Enabled():
		return errors.New("gpt: DecodeExperts: the model has no experts")
	case m.Experts != nil || m.expertsOverTP || m.expertSum != nil:
		return errors.New("gpt: DecodeExperts: the experts are split already")
	case m.region().SequenceParallel():
		return errors.New("gpt: DecodeExperts: the model is sequence-parallel: its ranks hold different tokens")
	}
	if err := m.Config.CheckExpertSplit(P, ep.TensorSize()); err != nil {
		return err
	}
	F := m.Config.MoE.FFNHiddenSize
	whole := true // every expert whole (New, Parallelize), else a Part's
	for i := range m.Layers {
		if l := m.Layers[i].MoE; l != nil {
			whole = len(l.FC1) == E && l.FC2[0].Dim(1) == F
			break
		}
	}
	if whole {
		if err := m.SliceExperts(ep); err != nil {
			return err
		}
	}
	L, f := E/P, F/ep.TensorSize()
	for i := range m.Layers {
		if l := m.Layers[i].MoE; l != nil && (len(l.FC1) != L || l.FirstExpert != ep.Rank()*L || l.FC2[0].Dim(1) != f) {
			return fmt.Errorf("gpt: DecodeExperts: layer %d holds %d experts from %d of %d columns, not expert-parallel rank %d's %d from %d of %d", i, len(l.FC1), l.FirstExpert, l.FC2[0].Dim(1), ep.Rank(), L, ep.Rank()*L, f)
		}
	}
	m.Experts, m.expertSum = ep, sum
	return nil
}

// DecodesExperts reports whether the experts are split for decoding
// (DecodeExperts).
func (m *Model) DecodesExperts() bool { return m.expertSum != nil }

// CheckExpertSplit refuses experts that do not split over P
// expert-parallel and Q expert-tensor-parallel ranks, naming the flags.
func (c *Config) CheckExpertSplit(P, Q int) error {
	switch {
	case P < 1 || Q < 1:
		return fmt.Errorf("gpt: --expert-model-parallel-size=%d and --expert-tensor-parallel-size=%d: want ≥ 1", P, Q)
	case c.MoE.NumExperts%P != 0:
		return fmt.Errorf("gpt: --num-experts=%d is not divisible by --expert-model-parallel-size=%d", c.MoE.NumExperts, P)
	case c.MoE.FFNHiddenSize%Q != 0:
		return fmt.Errorf("gpt: --moe-ffn-hidden-size=%d is not divisible by --expert-tensor-parallel-size=%d", c.MoE.FFNHiddenSize, Q)
	}
	return nil
}

// dispatchAllToAll is Megatron's alltoall dispatcher: the tokens, permuted
// by global expert, go to the experts' expert-parallel ranks by
// all-to-all; with expert tensor parallelism the expert-tensor ranks then
// all-gather what each received; each rank sorts the rows by local expert
// (then expert-tensor source, then expert-parallel source), runs its
// experts (slices), and the outputs go back the same way: unsort,
// reduce-scatter over expert TP (summing the slices' partial outputs),
// all-to-all, summed per token.
func (m *Model) dispatchAllToAll(tp *tensor.Tape, ep ExpertParallel, l *MoELayer, xs, probs *tensor.Tensor, r *tensor.Routing) *tensor.Tensor {
	E, T := m.Config.MoE.NumExperts, xs.Dim(0)
	P, me := ep.Size(), ep.Rank()
	Q, myT := ep.TensorSize(), ep.TensorRank()
	L := E / P
	dev := xs.Device()
	rowsT, flatT, counts := r.PermutationOn(dev)
	c32 := make([]int32, E)
	for e, n := range counts {
		c32[e] = int32(n)
	}
	all := ep.GatherInts(tp, c32) // (P·Q, E), row j·Q + t
	// n(t, j, k): rows expert-tensor rank t of expert-parallel rank j
	// routes to this rank's local expert k
	n := func(t, j, k int) int { return int(all[(j*Q+t)*E+me*L+k]) }
	send, recv := make([]int, P), make([]int, P)
	tpRows := make([]int, Q) // rows each expert-tensor rank received
	for j := range P {
		for e := j * L; e < (j+1)*L; e++ {
			send[j] += counts[e]
		}
		for k := range L {
			recv[j] += n(myT, j, k)
			for t := range Q {
				tpRows[t] += n(t, j, k)
			}
		}
	}
	xp := tp.Embedding(rowsT, xs)
	pp := tp.Embedding(flatT, tp.Reshape(probs, T*E, 1))
	xr := ep.GatherTensorRows(tp, ep.AllToAll(tp, xp, send, recv), tpRows)
	pr := ep.GatherTensorRows(tp, ep.AllToAll(tp, pp, send, recv), tpRows)
	// sort_chunks_by_idxs: chunks [t][j][k] into k-major, then t, then j
	var sortIdx []int32
	local := make([]int, L)
	for k := range L {
		for t := range Q {
			for j := range P {
				start := 0
				for tt := range t {
					start += tpRows[tt]
				}
				for jj := range j {
					for kk := range L {
						start += n(t, jj, kk)
					}
				}
				for kk := range k {
					start += n(t, j, kk)
				}
				for i := range n(t, j, k) {
					sortIdx = append(sortIdx, int32(start+i))
				}
				local[k] += n(t, j, k)
			}
		}
	}
	total := len(sortIdx)
	sortT := tensor.FromInt32(sortIdx, total).ToDevice(dev)
	y := m.experts(tp, l, tp.Embedding(sortT, xr), tp.Embedding(sortT, pr), local)
	y = ep.ReduceScatterTensorRows(tp, tp.IndexAddRows(total, sortT, y), tpRows)
	back := ep.AllToAll(tp, y, recv, send)
	return tp.IndexAddRows(T, rowsT, back)
}

// dispatchAllGather is Megatron's allgather dispatcher: every rank of the
// expert tensor × model parallel group gathers all its ranks' tokens,
// probabilities and routing maps, runs its local experts (slices) on the
// rows routed to them, and a reduce-scatter sums each token's outputs from
// every rank's experts (and the expert-tensor slices' partial outputs) back
// to the token's rank.
func (m *Model) dispatchAllGather(tp *tensor.Tape, ep ExpertParallel, l *MoELayer, xs, probs *tensor.Tensor, r *tensor.Routing) *tensor.Tensor {
	E, T := m.Config.MoE.NumExperts, xs.Dim(0)
	P, me := ep.Size(), ep.Rank()
	G := P * ep.TensorSize() // ranks gathered
	L := E / P
	dev := xs.Device()
	mine := make([]int32, T*E)
	for t := range T {
		for e := range E {
			if r.Map(t, e) {
				mine[t*E+e] = 1
			}
		}
	}
	gmap := ep.GatherInts(tp, mine) // (G·T, E)
	xg := ep.AllGatherRows(tp, xs)
	pg := ep.AllGatherRows(tp, probs)
	var rows, flat []int32
	counts := make([]int, L)
	for k := range L {
		e := me*L + k
		for t := range G * T {
			if gmap[t*E+e] != 0 {
				rows = append(rows, int32(t))
				flat = append(flat, int32(t*E+e))
				counts[k]++
			}
		}
	}
	rowsT := tensor.FromInt32(rows, len(rows)).ToDevice(dev)
	xp := tp.Embedding(rowsT, xg)
	pp := tp.Embedding(tensor.FromInt32(flat, len(flat)).ToDevice(dev), tp.Reshape(pg, G*T*E, 1))
	y := tp.IndexAddRows(G*T, rowsT, m.experts(tp, l, xp, pp, counts))
	return ep.ReduceScatterRows(tp, y)
}

// SliceExperts keeps this rank's experts of every MoE layer: those of
// expert-parallel rank ep.Rank(), [rank·L, (rank+1)·L) with L = E/EP, and
// with expert tensor parallelism this expert-tensor rank's slice of each:
// rows of fc1 (of each of SwiGLU's halves) and columns of fc2, as the dense
// MLP's tensor-parallel split. The model's experts are whole (New, or
// Parallelize, which leaves them to this), as the trainer builds the model
// on every rank from the seed.
func (m *Model) SliceExperts(ep ExpertParallel) error {
	if err := m.Config.CheckExpertSplit(ep.Size(), ep.TensorSize()); err != nil {
		return err
	}
	m.otherExperts = map[string][]int{}
	for i := range m.Layers {
		if l := m.Layers[i].MoE; l != nil {
			if err := keepExperts(&m.Config, i, l, ep, m.otherExperts); err != nil {
				return err
			}
		}
	}
	m.Experts = ep
	return nil
}

// keepExperts keeps in l, layer i's MoE layer with every expert whole, the
// experts of expert-parallel rank ep.Rank(), sliced for its expert-tensor
// rank (SliceExperts), recording the others' names and shapes in others
// (when not nil).
func keepExperts(c *Config, i int, l *MoELayer, ep ExpertParallel, others map[string][]int) error {
	E, P, Q := c.MoE.NumExperts, ep.Size(), ep.TensorSize()
	if len(l.FC1) != E || l.FC2[0].Dim(1) != c.MoE.FFNHiddenSize {
		return fmt.Errorf("gpt: layer %d holds %d experts of %d, not all %d whole: sliced already", i, len(l.FC1), l.FC2[0].Dim(1), E)
	}
	fc1Style := tp.Column
	if c.Activation == SwiGLU {
		fc1Style = tp.ColumnGLU
	}
	L := E / P
	r := ep.Rank()
	if others != nil {
		for e := range E {
			if e/L != r {
				others[l.FC1[e].Name] = l.FC1[e].Shape()
				others[l.FC2[e].Name] = l.FC2[e].Shape()
			}
		}
	}
	fc1, fc2 := slices.Clone(l.FC1[r*L:(r+1)*L]), slices.Clone(l.FC2[r*L:(r+1)*L])
	if Q > 1 {
		for k := range fc1 {
			var err error
			if fc1[k], err = tp.Shard(fc1[k], fc1Style, ep.TensorRank(), Q); err != nil {
				return fmt.Errorf("gpt: expert tensor parallelism: %w", err)
			}
			if fc2[k], err = tp.Shard(fc2[k], tp.Row, ep.TensorRank(), Q); err != nil {
				return fmt.Errorf("gpt: expert tensor parallelism: %w", err)
			}
		}
	}
	l.FC1, l.FC2, l.FirstExpert = fc1, fc2, r*L
	return nil
}

// ExpertStyle is the split of routed expert weight name over the
// expert-tensor-parallel ranks (SliceExperts): fc1's rows (of each of
// SwiGLU's halves), fc2's columns; tp.Replicated for any other name.
func (c *Config) ExpertStyle(name string) tp.Style {
	switch {
	case !IsRoutedExpert(name):
		return tp.Replicated
	case strings.Contains(name, "linear_fc1"):
		if c.Activation == SwiGLU {
			return tp.ColumnGLU
		}
		return tp.Column
	case strings.Contains(name, "linear_fc2"):
		return tp.Row
	}
	return tp.Replicated
}

// SplitExpertsOverTP splits every routed expert of m, one tensor-parallel
// rank's model (Parallelize, without sequence parallelism), over its
// tensor-parallel ranks: this rank's rows of fc1 (of each of SwiGLU's
// halves) and columns of fc2, the split of Megatron's expert tensor
// parallelism with --expert-tensor-parallel-size equal to the
// tensor-parallel size and no expert parallelism. Every rank holds the
// same tokens and routes them alike (the router is replicated), runs its
// slice of each chosen expert, and the partial outputs are all-reduced
// (moe). Decoding splits a model so; training uses SliceExperts, whose
// dispatchers exchange sequence shards. The whole model's experts are
// left unchanged.
func (m *Model) SplitExpertsOverTP() error {
	s, ok := m.Sharding.(*tpSharding)
	switch {
	case !ok:
		return errors.New("gpt: SplitExpertsOverTP: the model is not split over tensor-parallel ranks (Parallelize)")
	case s.r.SequenceParallel:
		return errors.New("gpt: SplitExpertsOverTP: the model is sequence-parallel: each rank holds a shard of the tokens, which expert tensor parallelism over the tensor-parallel ranks alone cannot route")
	case m.Experts != nil || m.expertsOverTP:
		return errors.New("gpt: SplitExpertsOverTP: the experts are split already")
	}
	Q, rank := s.r.Size(), s.r.Rank()
	if f := m.Config.MoE.FFNHiddenSize; f%Q != 0 {
		return fmt.Errorf("gpt: --moe-ffn-hidden-size=%d is not divisible by --tensor-model-parallel-size=%d (each expert is split over the tensor-parallel ranks)", f, Q)
	}
	for i := range m.Layers {
		if l := m.Layers[i].MoE; l != nil {
			if err := splitExpertsOverTP(&m.Config, i, l, rank, Q); err != nil {
				return err
			}
		}
	}
	m.expertsOverTP = true
	return nil
}

// splitExpertsOverTP replaces the whole routed experts of l, layer i's MoE
// layer, with tensor-parallel rank's slices of size (SplitExpertsOverTP).
func splitExpertsOverTP(c *Config, i int, l *MoELayer, rank, Q int) error {
	fc1Style := tp.Column
	if c.Activation == SwiGLU {
		fc1Style = tp.ColumnGLU
	}
	E := c.MoE.NumExperts
	if len(l.FC1) != E || l.FC2[0].Dim(1) != c.MoE.FFNHiddenSize {
		return fmt.Errorf("gpt: layer %d holds %d experts of %d, not all %d whole: sliced already", i, len(l.FC1), l.FC2[0].Dim(1), E)
	}
	// new slices: Parallelize's MoE layer shares the whole model's
	fc1, fc2 := make([]*tensor.Tensor, E), make([]*tensor.Tensor, E)
	for k := range E {
		var err error
		if fc1[k], err = tp.Shard(l.FC1[k], fc1Style, rank, Q); err != nil {
			return fmt.Errorf("gpt: layer %d expert %d over the tensor-parallel ranks: %w", i, k, err)
		}
		if fc2[k], err = tp.Shard(l.FC2[k], tp.Row, rank, Q); err != nil {
			return fmt.Errorf("gpt: layer %d expert %d over the tensor-parallel ranks: %w", i, k, err)
		}
	}
	l.FC1, l.FC2 = fc1, fc2
	return nil
}

// ExpertsOverTP reports whether the routed experts are split over the
// tensor-parallel ranks (SplitExpertsOverTP).
func (m *Model) ExpertsOverTP() bool { return m.expertsOverTP }

// OtherExperts returns the names and shapes of the experts other
// expert-parallel ranks hold (nil when this rank holds all): what a
// checkpoint of the whole model has beyond this rank's parameters. Names
// carry the global expert index, so a checkpoint loads at any EP size.
func (m *Model) OtherExperts() map[string][]int { return m.otherExperts }

// IsExpertParam reports whether p is one of the routed experts' weights
// (Megatron's allreduce=False parameters: reduced over expert-DP).
func (m *Model) IsExpertParam(p *tensor.Tensor) bool {
	for i := range m.Layers {
		if l := m.Layers[i].MoE; l != nil {
			for k := range l.FC1 {
				if p == l.FC1[k] || p == l.FC2[k] {
					return true
				}
			}
		}
	}
	return false
}

// activate is the MLP's activation of h + bias: bias nil when h has it
// already, else the fused bias-activation op adds it (fusion.go).
func (m *Model) activate(tp *tensor.Tape, h, bias *tensor.Tensor) *tensor.Tensor {
	switch m.Config.Activation {
	case SwiGLU:
		return tp.BiasSwiGLU(h, bias)
	case GELUTanh:
		return tp.BiasGELU(h, bias, tensor.GELUTanh)
	case SquaredReLU:
		return tp.SquaredReLU(h) // no fused form: fc1 added its bias (fuseBiasActivation)
	}
	return tp.BiasGELU(h, bias, tensor.GELUErf)
}

// recordRouting keeps a training micro-batch's routing statistics: the
// logged losses (Megatron records loss/coeff per layer), global_aux_loss's
// running counts (summed over the batch group first, over T·n(batch group)
// tokens: each rank's loss is its tokens' part of the global batch's), the
// expert-bias counts; and sets the backward's scale.
// With a token group (sequence parallelism) the aux losses' counts are
// summed over it first, so that each rank's loss is its tokens' part of the
// loss of the whole sequences (Megatron's tp_cp reduction); the logged
// values are what the trainer's sum over the token group makes the
// sequences' loss (aux) and mean (z).
func (m *Model) recordRouting(tp *tensor.Tape, r *tensor.Routing, rc *tensor.RouterConfig, layer, T int) {
	s, c := m.MoE, &m.Config.MoE
	n := m.tokenGroupSize()
	r.AuxScale = s.AuxLossScale
	if s.PerTokenLoss {
		// Megatron's attach_and_log_load_balancing_loss and apply_z_loss:
		// loss · num_local_tokens · tp_cp_group.size() (no padding mask
		// here: every routed row is a valid token)
		r.AuxScale *= float64(T) * float64(n)
	}
	if n > 1 {
		for i, lb := range rc.Balancing {
			switch {
			case lb.Seq:
				counts := r.SeqAuxCounts()
				m.TokenGroup.SumFloat64s(tp, counts)
				r.SetSeqCounts(i, counts, rc.SeqLen*n)
			case !lb.Global: // global_aux_loss sums over the batch group below
				counts := r.AuxCounts()
				m.TokenGroup.SumFloat64s(tp, counts)
				r.SetGlobalCounts(i, counts, float64(T*n))
			}
		}
	}
	aux, z := r.Aux()
	for i, lb := range rc.Balancing {
		name := metricName(lb)
		if lb.Global {
			counts := s.globalCounts[layer]
			if counts == nil {
				counts = make([]float64, c.NumExperts)
				s.globalCounts[layer] = counts
			}
			s.globalSteps[layer]++
			local, ranks := r.AuxCounts(), 1
			if m.BatchGroup != nil {
				m.BatchGroup.SumFloat64s(tp, local)
				ranks = m.BatchGroup.Size()
			}
			mean := make([]float64, c.NumExperts)
			for e, n := range local {
				counts[e] += n
				mean[e] = counts[e] / float64(s.globalSteps[layer])
			}
			r.SetGlobalCounts(i, mean, float64(T*ranks))
			aux, _ = r.Aux()
		}
		s.record(name, layer, m.Config.NumLayers, aux[i]/lb.Coeff)
	}
	if rc.ZLossCoeff > 0 {
		// this rank's mean, over n: summed over the group, the mean
		s.record("z_loss", layer, m.Config.NumLayers, z/rc.ZLossCoeff/float64(n))
	}
	if c.ExpertBias {
		counts := s.biasCounts[layer]
		if counts == nil {
			counts = make([]float64, c.NumExperts)
			s.biasCounts[layer] = counts
		}
		for e, n := range r.TokensPerExpert() {
			counts[e] += n
		}
	}
}
