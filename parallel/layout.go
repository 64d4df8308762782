// Package parallel lays out ranks for Megatron-style parallelism.
//
// Layout reproduces Megatron-LM's RankGenerator and initialize_model_parallel
// (megatron/core/parallel_state.py) exactly: the same order strings (default
// "tp-cp-ep-dp-pp", leftmost axis varying fastest), the same groups in the
// same enumeration order, and the same rejections of impossible layouts. It is
// pure integer math: a Layout is a value computed from a Config, with no
// process groups and no globals. Communication packages build their process
// groups from the rank lists it returns.
package parallel

import (
	"fmt"
	"slices"
	"strings"
)

// DefaultOrder is Megatron's default rank order: tensor parallel ranks are
// adjacent, pipeline stages are farthest apart.
const DefaultOrder = "tp-cp-ep-dp-pp"

// TPPPDPOrder is the order Megatron's --use-tp-pp-dp-mapping selects
// (megatron/training/initialize.py): data-parallel replicas farthest apart,
// the pipeline stages of one replica adjacent.
const TPPPDPOrder = "tp-cp-ep-pp-dp"

// Kind names one family of rank groups. The values are the keys printed by
// "gotron parallel groups".
type Kind string

// The group kinds of initialize_model_parallel. Decoder groups come from the
// generator over (tp, cp, dp, pp); expert groups from the generator over
// (expert tp, ep, expert dp, pp).
const (
	TP                Kind = "tp"                 // tensor parallel
	PP                Kind = "pp"                 // pipeline parallel
	DP                Kind = "dp"                 // data parallel, without CP
	CP                Kind = "cp"                 // context parallel
	DPCP              Kind = "dp-cp"              // data + context parallel (gradient all-reduce)
	TPPP              Kind = "tp-pp"              // model parallel
	TPDP              Kind = "tp-dp"              // tensor + data parallel
	TPDPCP            Kind = "tp-dp-cp"           // tensor + data + context parallel (FP8 amax)
	TPCP              Kind = "tp-cp"              // tensor + context parallel
	EP                Kind = "ep"                 // expert model parallel
	ExpertTP          Kind = "expert-tp"          // expert tensor parallel
	ExpertDP          Kind = "expert-dp"          // expert data parallel
	TPEP              Kind = "tp-ep"              // expert tensor + expert model parallel
	TPEPPP            Kind = "tp-ep-pp"           // expert tensor + expert model + pipeline parallel
	Embedding         Kind = "embedding"          // first and last stage of each pipeline
	PositionEmbedding Kind = "position-embedding" // first stage of each pipeline
)

// Kinds returns every group kind in a fixed order (the order of
// "gotron parallel groups" output).
func Kinds() []Kind {
	return []Kind{TP, PP, DP, CP, DPCP, TPPP, TPDP, TPDPCP, TPCP,
		EP, ExpertTP, ExpertDP, TPEP, TPEPPP, Embedding, PositionEmbedding}
}

// Config gives the parallel degrees. Zero values of the degrees mean 1, so
// Config{WorldSize: 8} is plain data parallelism over 8 ranks.
type Config struct {
	// WorldSize is the number of ranks; it must be positive.
	WorldSize int
	// TP is the tensor-model-parallel size (0 means 1).
	TP int
	// PP is the pipeline-model-parallel size (0 means 1).
	PP int
	// VPP is the virtual-pipeline (interleaving) size; 0 means no interleaving.
	// Any value ≥ 1 requires PP > 1, as in Megatron.
	VPP int
	// CP is the context-parallel size (0 means 1).
	CP int
	// EP is the expert-model-parallel size (0 means 1).
	EP int
	// ETP is the expert-tensor-parallel size (0 means TP).
	ETP int
	// Order is the rank order, axes joined by '-', leftmost varying fastest
	// ("" means DefaultOrder). Axes are tp, cp, ep, dp, pp; an axis of size 1
	// may be left out.
	Order string
	// DistOptInstances is --num-distributed-optimizer-instances (0 means
	// 1): the data × context parallel group is cut into this many
	// instances of consecutive ranks, each sharding the optimizer state
	// over its own ranks (DistOptInstanceGroups). DP·CP must divide by it.
	DistOptInstances int
}

// Coords are one rank's coordinates: its index in each of its groups.
type Coords struct {
	Rank              int
	TP, CP, DP, PP    int // decoder generator
	ExpertTP, EP, EDP int // expert generator
	// FirstStage and LastStage tell whether the rank holds the first or the
	// last pipeline stage (both when PP=1).
	FirstStage, LastStage bool
}

// Layout is the complete rank layout of one Config. It is immutable and safe
// for concurrent use.
type Layout struct {
	// Config is the configuration with defaults filled in (degrees ≥ 1,
	// ETP set, Order normalised to the axes actually used).
	Config Config
	// DP is the data-parallel size WorldSize/(TP·CP·PP).
	DP int
	// ExpertDP is the expert-data-parallel size WorldSize/(ETP·EP·PP).
	ExpertDP int

	dec, exp generator
	groups   map[Kind][][]int
	index    map[Kind][]int32 // rank → index into groups[kind], -1 when in none
}

// NewLayout validates cfg and computes every group. Errors name each degree
// involved.
func NewLayout(cfg Config) (*Layout, error) {
	c, err := normalise(cfg)
	if err != nil {
		return nil, err
	}
	l := &Layout{Config: c, DP: c.WorldSize / (c.TP * c.CP * c.PP), ExpertDP: c.WorldSize / (c.ETP * c.EP * c.PP)}
	tokens, err := parseOrder(c.Order)
	if err != nil {
		return nil, err
	}
	l.dec, err = newGenerator(tokens, map[string]int{"tp": c.TP, "cp": c.CP, "ep": 1, "dp": l.DP, "pp": c.PP})
	if err != nil {
		return nil, fmt.Errorf("parallel: order %q: %w", c.Order, err)
	}
	l.exp, err = newGenerator(tokens, map[string]int{"tp": c.ETP, "cp": 1, "ep": c.EP, "dp": l.ExpertDP, "pp": c.PP})
	if err != nil {
		return nil, fmt.Errorf("parallel: order %q: %w", c.Order, err)
	}
	if !strings.HasSuffix(c.Order, "pp") && c.PP != 1 && l.ExpertDP != l.DP {
		return nil, fmt.Errorf("parallel: order %q does not end in pp, so the data-parallel size of the attention "+
			"layers (DP=%d) and of the expert layers (expert DP=%d) must be equal (TP=%d, CP=%d, PP=%d, EP=%d, ETP=%d)",
			c.Order, l.DP, l.ExpertDP, c.TP, c.CP, c.PP, c.EP, c.ETP)
	}
	pp := l.dec.ranks("pp")
	if !slices.EqualFunc(pp, l.exp.ranks("pp"), slices.Equal) {
		return nil, fmt.Errorf("parallel: order %q gives different pipeline groups for the decoder (TP=%d, CP=%d, DP=%d, PP=%d) "+
			"and the experts (ETP=%d, EP=%d, expert DP=%d, PP=%d)", c.Order, c.TP, c.CP, l.DP, c.PP, c.ETP, c.EP, l.ExpertDP, c.PP)
	}
	if dpcp := l.DP * c.CP; dpcp%c.DistOptInstances != 0 || l.ExpertDP%c.DistOptInstances != 0 { // Megatron's initialize_model_parallel
		return nil, fmt.Errorf("parallel: the data × context parallel size %d (DP=%d, CP=%d) and the expert-data-parallel size %d must divide by %d distributed-optimizer instances",
			dpcp, l.DP, c.CP, l.ExpertDP, c.DistOptInstances)
	}
	l.build(pp)
	if c.DistOptInstances > 1 {
		for r := range c.WorldSize {
			if intra, inter := l.DistOptInstanceGroups(r); !sameShardPosition(l.GroupOf(DPCP, r), intra, inter) {
				return nil, fmt.Errorf("parallel: order %q with %d distributed-optimizer instances: rank %d's instance %v and its group across instances %v "+
					"(from the expert-data-parallel group, as Megatron) do not tile its data × context parallel group %v (TP=%d, CP=%d, PP=%d, EP=%d, ETP=%d)",
					c.Order, c.DistOptInstances, r, intra, inter, l.GroupOf(DPCP, r), c.TP, c.CP, c.PP, c.EP, c.ETP)
			}
		}
	}
	return l, nil
}

// sameShardPosition reports whether inter holds, for each instance of
// dpcp's consecutive runs of len(intra) ranks, the rank at intra's position:
// then a reduce-scatter over intra followed by an all-reduce over inter sums
// over the whole of dpcp.
func sameShardPosition(dpcp, intra, inter []int) bool {
	size := len(intra)
	if size == 0 || len(dpcp) != size*len(inter) {
		return false
	}
	at := slices.Index(dpcp, inter[0])
	for i, r := range inter {
		if at < 0 || at >= size || dpcp[i*size+at] != r {
			return false
		}
	}
	return true
}

// DistOptInstanceGroups returns rank's groups of Config.DistOptInstances
// distributed-optimizer instances, as Megatron's initialize_model_parallel
// builds them: intra, the ranks of rank's instance (a run of consecutive
// ranks of its data × context parallel group), over which the optimizer
// state is sharded; and inter, the ranks holding the same shard in every
// instance (Megatron's inter-instance group, the second level of its
// hierarchical expert-data-parallel groups: every (expert DP / instances)-th
// rank of the expert-data-parallel group), over which the reduced shards
// are summed. With one instance intra is the DPCP group and inter is rank
// alone.
func (l *Layout) DistOptInstanceGroups(rank int) (intra, inter []int) {
	dpcp, edp := l.GroupOf(DPCP, rank), l.GroupOf(ExpertDP, rank)
	if dpcp == nil || edp == nil {
		return nil, nil
	}
	n := l.Config.DistOptInstances
	size := len(dpcp) / n
	at := slices.Index(dpcp, rank)
	first := at / size * size
	intra = slices.Clone(dpcp[first : first+size])
	esize := len(edp) / n
	for i := slices.Index(edp, rank) % esize; i < len(edp); i += esize {
		inter = append(inter, edp[i])
	}
	return intra, inter
}

// DistOptExpertInstance returns rank's distributed-optimizer instance for
// an MoE model's routed experts: a run of consecutive ranks of its
// expert-data-parallel group (Megatron's intra-partial expert-data-parallel
// group, the first level of the hierarchical groups whose second level is
// DistOptInstanceGroups' inter).
func (l *Layout) DistOptExpertInstance(rank int) []int {
	edp := l.GroupOf(ExpertDP, rank)
	if edp == nil {
		return nil
	}
	size := len(edp) / l.Config.DistOptInstances
	first := slices.Index(edp, rank) / size * size
	return slices.Clone(edp[first : first+size])
}

func (l *Layout) build(pp [][]int) {
	l.groups = map[Kind][][]int{
		TP: l.dec.ranks("tp"), PP: pp, DP: l.dec.ranks("dp"), CP: l.dec.ranks("cp"),
		DPCP: l.dec.ranks("dp-cp"), TPPP: l.dec.ranks("tp-pp"), TPDP: l.dec.ranks("tp-dp"),
		TPDPCP: l.dec.ranks("tp-dp-cp"), TPCP: l.dec.ranks("tp-cp"),
		EP: l.exp.ranks("ep"), ExpertTP: l.exp.ranks("tp"), ExpertDP: l.exp.ranks("dp"),
		TPEP: l.exp.ranks("tp-ep"), TPEPPP: l.exp.ranks("tp-ep-pp"),
	}
	var emb, pos [][]int
	for _, g := range pp {
		if len(g) == 1 {
			emb = append(emb, []int{g[0]})
		} else {
			emb = append(emb, []int{g[0], g[len(g)-1]})
		}
		pos = append(pos, []int{g[0]})
	}
	l.groups[Embedding], l.groups[PositionEmbedding] = emb, pos
	l.index = make(map[Kind][]int32, len(l.groups))
	for k, gs := range l.groups {
		idx := make([]int32, l.Config.WorldSize)
		for i := range idx {
			idx[i] = -1
		}
		for gi, g := range gs {
			for _, r := range g {
				idx[r] = int32(gi)
			}
		}
		l.index[k] = idx
	}
}

// normalise fills zero-value defaults and checks that the degrees fit the
// world size.
func normalise(c Config) (Config, error) {
	for _, f := range []struct {
		name string
		v    int
	}{{"WorldSize", c.WorldSize}, {"TP", c.TP}, {"PP", c.PP}, {"VPP", c.VPP}, {"CP", c.CP}, {"EP", c.EP}, {"ETP", c.ETP},
		{"DistOptInstances", c.DistOptInstances}} {
		if f.v < 0 {
			return c, fmt.Errorf("parallel: %s=%d: must not be negative", f.name, f.v)
		}
	}
	if c.WorldSize == 0 {
		return c, fmt.Errorf("parallel: WorldSize=0: must be positive")
	}
	one := func(v *int) {
		if *v == 0 {
			*v = 1
		}
	}
	one(&c.TP)
	one(&c.PP)
	one(&c.CP)
	one(&c.EP)
	one(&c.DistOptInstances)
	if c.ETP == 0 {
		c.ETP = c.TP
	}
	if c.Order == "" {
		c.Order = DefaultOrder
	}
	c.Order = strings.ToLower(c.Order)
	if c.VPP > 0 && c.PP <= 1 {
		return c, fmt.Errorf("parallel: virtual pipeline size VPP=%d needs pipeline size PP > 1 (PP=%d)", c.VPP, c.PP)
	}
	if m := c.TP * c.CP * c.PP; c.WorldSize%m != 0 {
		return c, fmt.Errorf("parallel: world size %d is not divisible by TP·CP·PP = %d·%d·%d = %d "+
			"(TP=%d, CP=%d, PP=%d; DP = world/(TP·CP·PP) must be a whole number)",
			c.WorldSize, c.TP, c.CP, c.PP, m, c.TP, c.CP, c.PP)
	}
	if m := c.ETP * c.EP * c.PP; c.WorldSize%m != 0 {
		return c, fmt.Errorf("parallel: world size %d is not divisible by ETP·EP·PP = %d·%d·%d = %d "+
			"(ETP=%d, EP=%d, PP=%d; expert DP = world/(ETP·EP·PP) must be a whole number)",
			c.WorldSize, c.ETP, c.EP, c.PP, m, c.ETP, c.EP, c.PP)
	}
	return c, nil
}

// parseOrder splits an order string into axis names, rejecting unknown and
// repeated axes.
func parseOrder(order string) ([]string, error) {
	toks := strings.Split(order, "-")
	seen := map[string]bool{}
	for _, t := range toks {
		switch t {
		case "tp", "cp", "ep", "dp", "pp":
		default:
			return nil, fmt.Errorf("parallel: order %q: unknown axis %q (want axes among tp, cp, ep, dp, pp joined by '-')", order, t)
		}
		if seen[t] {
			return nil, fmt.Errorf("parallel: order %q: axis %q appears twice", order, t)
		}
		seen[t] = true
	}
	return toks, nil
}

// Groups returns every group of kind k, in Megatron's enumeration order, or
// nil for an unknown kind. The result is a copy.
func (l *Layout) Groups(k Kind) [][]int {
	gs, ok := l.groups[k]
	if !ok {
		return nil
	}
	out := make([][]int, len(gs))
	for i, g := range gs {
		out[i] = slices.Clone(g)
	}
	return out
}

// GroupOf returns the group of kind k that contains rank, or nil when rank is
// in none (a middle pipeline stage has no embedding group), is out of range,
// or k is unknown. The result is a copy.
func (l *Layout) GroupOf(k Kind, rank int) []int {
	idx, ok := l.index[k]
	if !ok || rank < 0 || rank >= len(idx) || idx[rank] < 0 {
		return nil
	}
	return slices.Clone(l.groups[k][idx[rank]])
}

// Coords returns rank's coordinates. It reports an error if rank is outside
// [0, WorldSize).
func (l *Layout) Coords(rank int) (Coords, error) {
	if rank < 0 || rank >= l.Config.WorldSize {
		return Coords{}, fmt.Errorf("parallel: rank %d outside world size %d", rank, l.Config.WorldSize)
	}
	d, e := l.dec.coords(rank), l.exp.coords(rank)
	return Coords{
		Rank: rank, TP: d["tp"], CP: d["cp"], DP: d["dp"], PP: d["pp"],
		ExpertTP: e["tp"], EP: e["ep"], EDP: e["dp"],
		FirstStage: d["pp"] == 0, LastStage: d["pp"] == l.Config.PP-1,
	}, nil
}
