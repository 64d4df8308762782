package parallel

import (
	"fmt"

	"github.com/gotron/gotron/comm"
)

// Groups is one rank's process groups for a Layout: what the model plan, the
// data iterator, the gradient reduction, the optimizer and the checkpointer
// are handed (Megatron's ProcessGroupCollection, without module globals).
// Every group exists, of size 1 where the degree is 1, so callers never
// branch on nil. A Groups is built once per run by NewGroups and is safe for
// concurrent use as far as its groups are.
type Groups struct {
	// Layout is the layout the groups were built from.
	Layout *Layout
	// Coords are this rank's coordinates in Layout.
	Coords Coords

	World comm.ProcessGroup // every rank
	TP    comm.ProcessGroup // tensor-parallel group
	PP    comm.ProcessGroup // pipeline stages of this rank's pipeline
	DP    comm.ProcessGroup // data-parallel group (without CP)
	CP    comm.ProcessGroup // context-parallel group
	DPCP  comm.ProcessGroup // data + context parallel: gradient reduction
	MP    comm.ProcessGroup // model parallel (tensor + pipeline): found-inf, grad norm
	// Embedding is the first and last stage of this rank's pipeline (tied
	// word-embedding gradients); nil on middle stages.
	Embedding comm.ProcessGroup
	// EP is the expert-model-parallel group (the ranks holding disjoint
	// experts of the MoE layers) and ExpertDP the expert-data-parallel
	// group (the ranks holding the same experts), from the expert
	// generator.
	EP, ExpertDP comm.ProcessGroup
	// ExpertTP is the expert-tensor-parallel group (the ranks holding
	// slices of the same experts) and ExpertTPEP the expert tensor × model
	// parallel group (Megatron's tp_ep, expert-TP ranks fastest): the
	// MoE dispatchers' groups. TPCP is tensor × context parallel: the ranks
	// sharing a sequence's tokens (the routers' load-balancing counts).
	ExpertTP, ExpertTPEP, TPCP comm.ProcessGroup
	// IntraDistOpt and InterDistOpt are this rank's
	// distributed-optimizer instance and the group of the same shard
	// across instances (Layout.DistOptInstanceGroups), with
	// Config.DistOptInstances > 1; with one instance IntraDistOpt is DPCP
	// and InterDistOpt is nil. IntraExpertDistOpt is the routed experts'
	// instance (Layout.DistOptExpertInstance; ExpertDP with one instance).
	IntraDistOpt, InterDistOpt, IntraExpertDistOpt comm.ProcessGroup
	// AmaxReduction is tensor × data × context parallel (TPDPCP): the
	// ranks over which the delayed FP8 recipe reduces its amaxes
	// (Megatron's get_amax_reduction_group(with_context_parallel=True)).
	AmaxReduction comm.ProcessGroup
}

// NewGroups builds this rank's groups of the layout cfg (cfg.WorldSize 0
// means world.Size()) from world. Every rank of world must call it with the
// same cfg; it does not communicate. Errors name the degrees.
func NewGroups(world comm.ProcessGroup, cfg Config) (*Groups, error) {
	if cfg.WorldSize == 0 {
		cfg.WorldSize = world.Size()
	}
	if cfg.WorldSize != world.Size() {
		return nil, fmt.Errorf("parallel: layout for %d ranks, but the world has %d", cfg.WorldSize, world.Size())
	}
	l, err := NewLayout(cfg)
	if err != nil {
		return nil, err
	}
	rank := world.Rank()
	c, err := l.Coords(rank)
	if err != nil {
		return nil, err
	}
	g := &Groups{Layout: l, Coords: c, World: world}
	for _, k := range []struct {
		kind Kind
		dst  *comm.ProcessGroup
	}{{TP, &g.TP}, {PP, &g.PP}, {DP, &g.DP}, {CP, &g.CP}, {DPCP, &g.DPCP}, {TPPP, &g.MP}, {Embedding, &g.Embedding}, {EP, &g.EP}, {ExpertDP, &g.ExpertDP},
		{ExpertTP, &g.ExpertTP}, {TPEP, &g.ExpertTPEP}, {TPCP, &g.TPCP}, {TPDPCP, &g.AmaxReduction}} {
		ranks := l.GroupOf(k.kind, rank)
		if ranks == nil {
			continue // middle pipeline stages have no embedding group
		}
		pg, err := world.NewGroup(ranks)
		if err != nil {
			return nil, fmt.Errorf("parallel: rank %d: %s group %v: %w", rank, k.kind, ranks, err)
		}
		*k.dst = pg
	}
	g.IntraDistOpt, g.IntraExpertDistOpt = g.DPCP, g.ExpertDP
	if l.Config.DistOptInstances > 1 {
		experts := l.DistOptExpertInstance(rank)
		if g.IntraExpertDistOpt, err = world.NewGroup(experts); err != nil {
			return nil, fmt.Errorf("parallel: rank %d: experts' distributed-optimizer instance %v: %w", rank, experts, err)
		}
		intra, inter := l.DistOptInstanceGroups(rank)
		if g.IntraDistOpt, err = world.NewGroup(intra); err != nil {
			return nil, fmt.Errorf("parallel: rank %d: distributed-optimizer instance %v: %w", rank, intra, err)
		}
		if g.InterDistOpt, err = world.NewGroup(inter); err != nil {
			return nil, fmt.Errorf("parallel: rank %d: distributed-optimizer group across instances %v: %w", rank, inter, err)
		}
	}
	return g, nil
}

// DPSize is the data-parallel size (without context parallelism).
func (g *Groups) DPSize() int { return g.Layout.DP }
