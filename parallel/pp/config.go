package pp

import "fmt"

// Config describes one pipeline-parallel iteration: how many ranks the model
// is split over, how many chunks each rank holds and how many micro-batches
// flow through. The zero value is invalid only because Microbatches is 0;
// Config{Microbatches: M} is plain gradient accumulation over M micro-batches
// on one rank.
type Config struct {
	// PP is --pipeline-model-parallel-size, the number of pipeline ranks.
	// 0 means 1 (no pipelining).
	PP int
	// VPP is --virtual-pipeline-model-parallel-size, the number of model
	// chunks (virtual stages) each rank holds. 0 and 1 both mean one chunk:
	// Megatron turns a virtual size of 1 into "no interleaving".
	VPP int
	// Microbatches is --num-microbatches, the micro-batches per iteration
	// (M). It must be at least 1.
	Microbatches int
	// GroupSize is --microbatch-group-size-per-virtual-pipeline-stage (G),
	// the number of contiguous micro-batches each chunk runs before the next
	// chunk takes over. 0 means PP, Megatron's default (a depth-first
	// schedule). It is used only by the interleaved schedule and ignored
	// otherwise, as in Megatron.
	GroupSize int
}

// Kind names the schedule Megatron's get_forward_backward_func picks for a
// Config. The zero value is NoPipelining.
type Kind int

const (
	// NoPipelining is forward_backward_no_pipelining (PP = 1): forward then
	// backward of each micro-batch in turn, i.e. gradient accumulation.
	NoPipelining Kind = iota
	// OneFOneB is forward_backward_pipelining_without_interleaving (PP > 1,
	// one chunk per rank): warm-up forwards, steady one-forward-one-backward,
	// cool-down backwards.
	OneFOneB
	// Interleaved is forward_backward_pipelining_with_interleaving (PP > 1,
	// VPP ≥ 2 chunks per rank).
	Interleaved
)

// String returns the schedule's short name: "no-pipelining", "1f1b" or
// "interleaved-1f1b".
func (k Kind) String() string {
	switch k {
	case NoPipelining:
		return "no-pipelining"
	case OneFOneB:
		return "1f1b"
	case Interleaved:
		return "interleaved-1f1b"
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Flag names, as users type them; every validation error names one.
const (
	flagPP     = "--pipeline-model-parallel-size"
	flagVPP    = "--virtual-pipeline-model-parallel-size"
	flagM      = "--num-microbatches"
	flagG      = "--microbatch-group-size-per-virtual-pipeline-stage"
	errPrefix  = "pp: "
	defaultTag = " (default: " + flagPP + ")"
)

// withDefaults returns c with zero values replaced by their meaning: PP and
// VPP at least 1, GroupSize = PP when 0.
func (c Config) withDefaults() Config {
	if c.PP == 0 {
		c.PP = 1
	}
	if c.VPP == 0 {
		c.VPP = 1
	}
	if c.GroupSize == 0 {
		c.GroupSize = c.PP
	}
	return c
}

// Kind returns the schedule Megatron runs for c (c need not be valid).
func (c Config) Kind() Kind {
	c = c.withDefaults()
	switch {
	case c.PP <= 1:
		return NoPipelining
	case c.VPP <= 1:
		return OneFOneB
	}
	return Interleaved
}

// Validate reports the first setting Megatron would refuse, naming its flag.
// The interleaved rules are those of Megatron's parallel_state (a virtual
// size needs more than one pipeline rank) and of
// forward_backward_pipelining_with_interleaving (PP ≤ G ≤ M, and the last
// micro-batch group, M mod G, is either empty or at least PP long).
func (c Config) Validate() error {
	for _, f := range []struct {
		flag string
		v    int
	}{{flagPP, c.PP}, {flagVPP, c.VPP}, {flagM, c.Microbatches}, {flagG, c.GroupSize}} {
		if f.v < 0 {
			return fmt.Errorf(errPrefix+"%s %d: must not be negative", f.flag, f.v)
		}
	}
	if c.Microbatches == 0 {
		return fmt.Errorf(errPrefix+"%s 0: want at least one micro-batch per iteration", flagM)
	}
	explicitG := c.GroupSize != 0
	c = c.withDefaults()
	if c.VPP > 1 && c.PP == 1 {
		return fmt.Errorf(errPrefix+"%s %d needs %s > 1 (got 1): the interleaved schedule splits "+
			"the model over several pipeline ranks, so Megatron refuses virtual stages without pipelining",
			flagVPP, c.VPP, flagPP)
	}
	if c.Kind() != Interleaved {
		return nil
	}
	g := fmt.Sprintf("%s %d", flagG, c.GroupSize)
	if !explicitG {
		g += defaultTag
	}
	if c.GroupSize < c.PP || c.GroupSize > c.Microbatches {
		return fmt.Errorf(errPrefix+"%s is outside [%s %d, %s %d]: the interleaved schedule runs each "+
			"virtual stage on groups of at least PP and at most M contiguous micro-batches",
			g, flagPP, c.PP, flagM, c.Microbatches)
	}
	if rem := c.Microbatches % c.GroupSize; rem > 0 && rem < c.PP {
		return fmt.Errorf(errPrefix+"%s %d with %s leaves a last group of %d micro-batches; Megatron wants "+
			"the remainder M mod G to be 0 or at least %s %d, since a shorter last group stalls the "+
			"pipeline on its own dependencies", flagM, c.Microbatches, g, rem, flagPP, c.PP)
	}
	return nil
}

// checkRank validates c and rank together.
func (c Config) checkRank(rank int) error {
	if err := c.Validate(); err != nil {
		return err
	}
	if p := c.withDefaults().PP; rank < 0 || rank >= p {
		return fmt.Errorf(errPrefix+"rank %d: want a pipeline rank in 0..%d (%s %d)", rank, p-1, flagPP, p)
	}
	return nil
}

// Phases are the counts of Megatron's get_pp_rank_microbatches for one rank,
// in units of (chunk, micro-batch) passes. The zero value is an empty
// schedule.
type Phases struct {
	// Total is the number of forward passes (and of backward passes) the
	// rank runs: M·VPP.
	Total int
	// Warmup is the number of forwards before the first backward:
	// 0 without pipelining; min(PP − rank − 1, M) for 1F1B;
	// min(M·VPP, 2·(PP − rank − 1) + (VPP − 1)·G) interleaved.
	Warmup int
	// Steady is the number of one-forward-one-backward steps: Total − Warmup.
	Steady int
	// Cooldown is the number of backwards after the last forward; it equals
	// Warmup.
	Cooldown int
}

// AllWarmup reports whether every forward runs before the first backward
// (Megatron's are_all_microbatches_in_warmup).
func (p Phases) AllWarmup() bool { return p.Warmup == p.Total }

// RankPhases returns the warm-up, steady and cool-down counts of rank.
func RankPhases(cfg Config, rank int) (Phases, error) {
	if err := cfg.checkRank(rank); err != nil {
		return Phases{}, err
	}
	return phases(cfg.withDefaults(), rank), nil
}

// phases assumes a valid, defaulted c.
func phases(c Config, rank int) Phases {
	total := c.Microbatches * c.VPP
	var w int
	switch c.Kind() {
	case OneFOneB:
		w = c.PP - rank - 1
	case Interleaved:
		w = 2*(c.PP-rank-1) + (c.VPP-1)*c.GroupSize
	}
	w = min(w, total)
	return Phases{Total: total, Warmup: w, Steady: total - w, Cooldown: w}
}

// MaxInFlight is Megatron's bound on the (chunk, micro-batch) pairs a rank
// holds activations for at once (forward done, backward not yet):
// Warmup + 1 (its max_outstanding_backprops), or Total when every forward is
// in the warm-up. Divided by VPP it is the "in-flight micro-batches" of
// Megatron's theoretical memory estimate: min(M, PP) for 1F1B on rank 0 and
// PP·(1 + (PP−1)/(PP·VPP)) for the default interleaved schedule on rank 0.
func MaxInFlight(cfg Config, rank int) (int, error) {
	p, err := RankPhases(cfg, rank)
	if err != nil {
		return 0, err
	}
	return min(p.Warmup+1, p.Total), nil
}

// BubbleFraction is the idle share of the pipeline predicted by Narayanan et
// al. (2021) for equal forward and backward times per stage:
// (PP − 1)/(VPP·M), the bubble time divided by the ideal compute time.
// Megatron does not compute it; it is here for comparison with measured
// schedules. It is 0 without pipelining.
func BubbleFraction(cfg Config) (float64, error) {
	if err := cfg.Validate(); err != nil {
		return 0, err
	}
	c := cfg.withDefaults()
	return float64(c.PP-1) / float64(c.VPP*c.Microbatches), nil
}

// Slot is one entry of the interleaved schedule table: the chunk and
// micro-batch a rank runs forward at one virtual micro-batch index. The zero
// value is chunk 0, micro-batch 0.
type Slot struct {
	Chunk      int // model chunk on the rank, 0..VPP−1
	Microbatch int // micro-batch, 0..M−1
}

// Table returns Megatron's schedule table (get_schedule_table): entry k is
// the (chunk, micro-batch) of the rank's k-th forward, for k in 0..M·VPP−1.
// Micro-batches are taken in groups of G: for each group, chunk 0 runs all
// of the group's micro-batches, then chunk 1, and so on. The last group,
// which starts at the first multiple of G whose group reaches M, holds the
// remaining M mod G micro-batches (or G when that is 0). Backward k runs
// chunk VPP−1−Table[k].Chunk on micro-batch Table[k].Microbatch. Without
// interleaving the table is simply micro-batches 0..M−1 of chunk 0.
func Table(cfg Config) ([]Slot, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return table(cfg.withDefaults()), nil
}

// table assumes a valid, defaulted c.
func table(c Config) []Slot {
	g := c.GroupSize
	if c.Kind() != Interleaved {
		g = c.Microbatches
	}
	out := make([]Slot, 0, c.Microbatches*c.VPP)
	for lo := 0; lo < c.Microbatches; lo += g {
		hi := lo + g
		if hi >= c.Microbatches {
			hi = c.Microbatches
		}
		for ch := range c.VPP {
			for mb := lo; mb < hi; mb++ {
				out = append(out, Slot{Chunk: ch, Microbatch: mb})
			}
		}
	}
	return out
}
