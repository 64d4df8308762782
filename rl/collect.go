package rl

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"

	"github.com/gotron/gotron/comm"
	datagpt "github.com/gotron/gotron/data/gpt"
	"github.com/gotron/gotron/infer"
	"github.com/gotron/gotron/internal/checked"
	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/parallel/tp"
	"github.com/gotron/gotron/tensor"
	"github.com/gotron/gotron/tokenizer"
	"github.com/gotron/gotron/train"
)

// Config configures a Collector: Megatron's --grpo-* and --rl-* options
// and what the run gives it.
type Config struct {
	Env       *Env
	Tokenizer tokenizer.Tokenizer
	// Render turns a task's prompt into the text the model continues:
	// Megatron sends it as one user message of a chat completion (the
	// tokenizer's chat template). Nil uses the prompt as it is.
	Render func(prompt string) (string, error)

	PromptsPerStep int // --grpo-prompts-per-step
	GroupSize      int // --grpo-group-size
	Iterations     int // --grpo-iterations
	// GlobalBatchSize, MicroBatchSize and SeqLength are the run's.
	GlobalBatchSize, MicroBatchSize, SeqLength int
	Loss                                       LossConfig
	// Temperature, TopP and TopK are --rl-default-temperature, -top-p and
	// -top-k (TopK <= 0 and TopP 0 are off).
	Temperature, TopP float64
	TopK              int
	// SkipBOS is --rl-skip-bos-token: no BOS before the prompt.
	SkipBOS bool
	// Seed seeds the prompt draws and the sampling (--seed).
	Seed int64
	// BF16 rounds the old and reference log-probabilities to bfloat16, as
	// Megatron's bf16 model returns them (--bf16).
	BF16 bool
	// Reference are the reference model's weights (--pretrained-checkpoint's,
	// in the model's Params order); nil takes the weights the run starts
	// from, as Megatron does without --pretrained-checkpoint.
	Reference []*tensor.Tensor
	// Printf logs a line (the run's log).
	Printf func(format string, args ...any)
	// DP is the run's data-parallel group; nil is one process. Each rank
	// generates, scores and computes the log-probabilities of the rollouts
	// it trains on (owns), and the ranks all-reduce the rewards so that
	// every rank computes the whole groups' advantages.
	DP comm.ProcessGroup
	// TP is the run's tensor-parallel group (nil: none). The model each
	// rank gets is its shard; the ranks generate together (infer.Lockstep)
	// and compute the log-probabilities over the gathered vocabulary.
	TP comm.ProcessGroup
	// InferenceTP is the tensor-parallel group of a separate inference
	// layout (--rl-inference-tensor-model-parallel-size), nil to generate
	// on the training layout. Built from a training layout without
	// tensor parallelism (every rank holds the whole model): before each
	// collection the group's ranks slice the current weights into their
	// shards (gpt.Parallelize, Megatron's refit) and generate, in
	// lockstep, the rollouts every data-parallel rank of the group trains
	// on; the group then shares them. Its ranks are consecutive
	// data-parallel ranks.
	InferenceTP comm.ProcessGroup
	// Packing is --rl-use-sequence-packing: each collection's rollouts are
	// packed into bins of SeqLength tokens (packRows), at most
	// MaxSequencesPerBin each, the bins are dealt to the data-parallel
	// ranks by PackingAlgo (RankBins; "" is fifo), and the iterations run
	// bins (Plan).
	Packing            bool
	MaxSequencesPerBin int    // --rl-sequence-packing-max-sequences-per-bin
	PackingAlgo        string // --rl-sequence-packing-algo

	// The rollout engine's settings (Megatron's inference arguments).
	// KVCacheGB caps its KV cache in GiB (--inference-dynamic-batching-
	// buffer-size-gb; 0: the engine's default): rollouts that do not fit
	// wait, the same tokens. MaxSequenceLength caps a rollout's prompt and
	// generated tokens (--inference-max-seq-length, at most SeqLength; 0:
	// SeqLength). EngineLogInterval logs the engine's state every that
	// many steps (--inference-logging-step-interval; 0: never).
	KVCacheGB         float64
	MaxSequenceLength int
	EngineLogInterval int
}

// Collection summarises one rollout collection.
type Collection struct {
	Index     int64     // collections since the run began (iteration / iterations per collection)
	Rewards   []float64 // per rollout, group-major
	Responses []string  // the generated texts, group-major ("" for a rollout another data-parallel rank generated)
	Tokens    int       // loss tokens over all rollouts
}

// Collector is Megatron's RL data path for one process (train.RLStep):
// every --grpo-iterations × (P·G / global batch) iterations it draws
// --grpo-prompts-per-step tasks, generates --grpo-group-size rollouts of
// each with gotron's inference engine on the current weights (an engine
// built from them: the refit is a copy), scores them with the countdown
// reward, computes the group advantages and the old (and, with a KL term,
// the reference) log-probabilities, and serves the rollouts as training
// samples; Loss is the GRPO loss over them.
type Collector struct {
	cfg         Config
	pad, eod    int32
	bos         int
	itersPerCol int64
	rows        []row // the current collection's, group-major
	current     int64 // its index; -1 before the first
	// With packing: this data-parallel rank's bins of the current
	// collection (empty ones last), how many each iteration runs, the
	// sequences in every rank's bins (for the consumed count), and the
	// iteration Prepare readied.
	bins        []packedBin
	binsPerIter int64
	rankSeqs    [][]int
	iteration   int64
	// sharding is the model's tensor-parallel plan (nil: whole): its
	// logits hold this rank's vocabulary slice, gathered for the
	// log-probabilities.
	sharding gpt.Sharding
	ref      []*tensor.Tensor
	// Last is the latest collection (only it: a long run's responses are
	// not kept).
	Last Collection
}

// row is one rollout as a training sample: Megatron's trajectory padded to
// the sequence length, with its per-position data (position t predicts
// token t+1; the last position predicts nothing).
type row struct {
	tokens              []int32
	mask                []float32 // 1 where token t+1 was generated and is not padding
	old, ref, inference []float64
	advantage           float64
	// advantages, when set, is the advantage per position (a packed bin's
	// documents have their own).
	advantages []float64
}

// advantageAt is the advantage of the token position t predicts.
func (r *row) advantageAt(t int) float64 {
	if r.advantages != nil {
		return r.advantages[t]
	}
	return r.advantage
}

var _ train.RLStep = (*Collector)(nil)

// NewCollector checks cfg against Megatron's rules and gotron's limits.
func NewCollector(cfg Config) (*Collector, error) {
	if cfg.Env == nil || len(cfg.Env.Tasks) == 0 {
		return nil, errors.New("rl: no environment tasks")
	}
	if cfg.Tokenizer == nil {
		return nil, errors.New("rl: --perform-rl-step needs a tokenizer (--tokenizer-type and its files): prompts are text")
	}
	for _, c := range []struct {
		name string
		v    int
	}{{"--grpo-prompts-per-step", cfg.PromptsPerStep}, {"--grpo-iterations", cfg.Iterations},
		{"--global-batch-size", cfg.GlobalBatchSize}, {"--micro-batch-size", cfg.MicroBatchSize}, {"--seq-length", cfg.SeqLength}} {
		if err := checked.Positive(c.name, int64(c.v)); err != nil {
			return nil, fmt.Errorf("rl: %w", err)
		}
	}
	if cfg.GroupSize < 2 {
		return nil, fmt.Errorf("rl: --grpo-group-size=%d: want >= 2 (GRPO's advantage is a rollout's reward against its group's: a group of one has advantage 0, and nothing would be learnt from the reward)", cfg.GroupSize)
	}
	perCol, ok := checked.MulInt(cfg.PromptsPerStep, cfg.GroupSize)
	if !ok || perCol > 1<<20 {
		return nil, fmt.Errorf("rl: --grpo-prompts-per-step=%d × --grpo-group-size=%d rollouts per collection: want at most %d", cfg.PromptsPerStep, cfg.GroupSize, 1<<20)
	}
	if perCol%cfg.GlobalBatchSize != 0 {
		return nil, fmt.Errorf("rl: --global-batch-size=%d must divide --grpo-prompts-per-step × --grpo-group-size = %d (Megatron's RL step trains on global batches of one collection's rollouts; it asserts the product with --grpo-iterations is divisible and counts whole batches per collection)", cfg.GlobalBatchSize, perCol)
	}
	if perCol%cfg.MicroBatchSize != 0 {
		return nil, fmt.Errorf("rl: --micro-batch-size=%d must divide the %d rollouts per collection (Megatron pads them with empty rows otherwise, not built in gotron)", cfg.MicroBatchSize, perCol)
	}
	if dp := dpSize(cfg.DP); perCol%(dp*cfg.MicroBatchSize) != 0 {
		return nil, fmt.Errorf("rl: the %d rollouts per collection must be a multiple of %d data-parallel ranks × --micro-batch-size=%d (each rank trains on whole micro-batches of every collection)", perCol, dp, cfg.MicroBatchSize)
	}
	if cfg.Packing {
		if cfg.MicroBatchSize != 1 {
			return nil, fmt.Errorf("rl: --rl-use-sequence-packing needs --micro-batch-size 1, not %d (a micro-batch is one bin; Megatron asserts it)", cfg.MicroBatchSize)
		}
		if cfg.PackingAlgo == "" {
			cfg.PackingAlgo = PackFIFO
		}
		if _, _, err := RankBins(cfg.PackingAlgo, 0, 1, 0); err != nil {
			return nil, err
		}
		if err := checked.Positive("--rl-sequence-packing-max-sequences-per-bin", int64(cfg.MaxSequencesPerBin)); err != nil {
			return nil, fmt.Errorf("rl: %w", err)
		}
	}
	if math.IsNaN(cfg.KVCacheGB) || cfg.KVCacheGB < 0 || cfg.KVCacheGB > 1<<20 {
		return nil, fmt.Errorf("rl: --inference-dynamic-batching-buffer-size-gb=%g: want a size in GiB > 0", cfg.KVCacheGB)
	}
	if err := checked.RangeWhy("--inference-max-seq-length", int64(cfg.MaxSequenceLength), 0, int64(cfg.SeqLength),
		"the rollouts are trained at --seq-length; longer ones would not fit"); err != nil {
		return nil, fmt.Errorf("rl: %w", err)
	}
	if cfg.MaxSequenceLength == 0 {
		cfg.MaxSequenceLength = cfg.SeqLength
	}
	if err := checked.Range("--inference-logging-step-interval", int64(cfg.EngineLogInterval), 0, 1<<30); err != nil {
		return nil, fmt.Errorf("rl: %w", err)
	}
	if err := cfg.Loss.Validate(); err != nil {
		return nil, err
	}
	s := infer.Sampling{Temperature: cfg.Temperature, TopP: cfg.TopP, TopK: max(cfg.TopK, 0)}
	if err := s.Validate(); err != nil {
		return nil, fmt.Errorf("rl: --rl-default-temperature/--rl-default-top-p/--rl-default-top-k: %w", err)
	}
	c := &Collector{cfg: cfg, current: -1, bos: -1, ref: cfg.Reference}
	c.itersPerCol = int64(cfg.Iterations) * int64(perCol/cfg.GlobalBatchSize)
	c.eod = int32(cfg.Tokenizer.EOD())
	c.pad = c.eod
	if sp, ok := cfg.Tokenizer.(tokenizer.Specials); ok {
		if id, ok := sp.Pad(); ok {
			c.pad = int32(id)
		}
		if id, ok := sp.BOS(); ok && !cfg.SkipBOS {
			c.bos = id
		}
	}
	return c, nil
}

func dpSize(g comm.ProcessGroup) int {
	if g == nil {
		return 1
	}
	return g.Size()
}

// owns reports whether this data-parallel rank trains on rollout j of a
// collection, and so generates it. Sample i of the run is rollout i mod
// P·G, and gotron's data order gives rank r micro-batch slots r, r+DP,
// r+2·DP, … of every global batch (train's Consumed + (i·DP + r)·mbs):
// rollout j is in slot j/mbs, and a global batch is a multiple of DP·mbs
// rollouts. A global batch is the same rollouts at any DP size, so the
// run's numbers are one process's. (Megatron's prepare_data_for_update
// gives rank r the r-th contiguous slice of the rollouts instead, which
// mixes slices into a global batch when a collection spans several.)
func (c *Collector) owns(j int) bool {
	if c.cfg.DP == nil {
		return true
	}
	return (j/c.cfg.MicroBatchSize)%c.cfg.DP.Size() == c.cfg.DP.Rank()
}

// generates reports whether this rank's generation group makes rollout j:
// the rollouts it owns, or with a separate inference layout those of every
// data-parallel rank of its inference tensor-parallel group (consecutive
// data-parallel ranks).
func (c *Collector) generates(j int) bool {
	g := c.cfg.InferenceTP
	if g == nil || c.cfg.DP == nil {
		return c.owns(j)
	}
	owner := (j / c.cfg.MicroBatchSize) % c.cfg.DP.Size()
	return owner/g.Size() == c.cfg.DP.Rank()/g.Size()
}

// genGroup is the group whose ranks generate together: the inference
// layout's tensor-parallel group, else the training's (nil: none).
func (c *Collector) genGroup() comm.ProcessGroup {
	if c.cfg.InferenceTP != nil {
		return c.cfg.InferenceTP
	}
	return c.cfg.TP
}

// IterationsPerCollection is how many iterations train on one collection:
// --grpo-iterations passes over its P·G rollouts in global batches. Saves
// and exits must fall on its multiples (Megatron's assertion: the rollouts
// are not checkpointed).
func (c *Collector) IterationsPerCollection() int64 { return c.itersPerCol }

// samplesPerCollection is the samples the iterations of one collection read.
func (c *Collector) samplesPerCollection() int64 {
	return c.itersPerCol * int64(c.cfg.GlobalBatchSize)
}

// Len is the run's samples: unbounded (each collection's are its own).
func (c *Collector) Len() int { return 1 << 62 }

// Sample is the run's sample i: a rollout of the current collection, the
// collection's P·G rollouts read in order and again for each GRPO iteration
// (Megatron's cycled loader).
func (c *Collector) Sample(i int) (datagpt.Sample, error) {
	if c.cfg.Packing {
		return c.binSample(int64(i))
	}
	r, err := c.rowOf(int64(i))
	if err != nil {
		return datagpt.Sample{}, err
	}
	seq := c.cfg.SeqLength
	s := datagpt.Sample{Tokens: r.tokens, Labels: make([]int32, seq), LossMask: r.mask, PositionIDs: make([]int32, seq)}
	copy(s.Labels, r.tokens[1:])
	s.Labels[seq-1] = c.pad
	for t := range s.PositionIDs {
		s.PositionIDs[t] = int32(t)
	}
	return s, nil
}

func (c *Collector) rowOf(i int64) (*row, error) {
	if c.cfg.Packing {
		b, err := c.binOf(i)
		if err != nil {
			return nil, err
		}
		return &b.row, nil
	}
	base := c.current * c.samplesPerCollection()
	if c.current < 0 || i < base || i >= base+c.samplesPerCollection() {
		return nil, fmt.Errorf("rl: sample %d is not in collection %d's samples [%d, %d)", i, c.current, base, base+c.samplesPerCollection())
	}
	j := (i - base) % int64(len(c.rows))
	if !c.owns(int(j)) {
		return nil, fmt.Errorf("rl: sample %d (rollout %d of collection %d) belongs to another data-parallel rank than %d", i, j, c.current, c.cfg.DP.Rank())
	}
	return &c.rows[j], nil
}

// Plan is the iteration Prepare readied, with packing: this rank's
// micro-batches (bins), the sample index of its first (Sample's and
// Loss's frame: this rank's bins of the current collection, cycled as
// Megatron's loader is, from where the collection's previous iteration
// stopped) and the sequences the bins of all data-parallel ranks hold
// (Megatron's consumed samples, get_iteration_sequence_count: a bin run
// again counts again, an empty bin nothing).
func (c *Collector) Plan() (microBatches int, first, sequences int64, packed bool) {
	if !c.cfg.Packing {
		return 0, 0, 0, false
	}
	first = (c.iteration % c.itersPerCol) * c.binsPerIter
	for _, seqs := range c.rankSeqs {
		for i := range c.binsPerIter {
			sequences += int64(seqs[(first+i)%int64(len(seqs))])
		}
	}
	return int(c.binsPerIter), first, sequences, true
}

// binOf is sample i of the current collection's packed iterations: bin i
// mod bins.
func (c *Collector) binOf(i int64) (*packedBin, error) {
	if n := c.itersPerCol * c.binsPerIter; c.current < 0 || len(c.bins) == 0 || i < 0 || i >= n {
		return nil, fmt.Errorf("rl: packed sample %d is not in collection %d's %d bin samples", i, c.current, n)
	}
	return &c.bins[i%int64(len(c.bins))], nil
}

// binSample is a bin as a training sample: its documents' positions each
// from 0 and attention within a document (DocIDs).
func (c *Collector) binSample(i int64) (datagpt.Sample, error) {
	b, err := c.binOf(i)
	if err != nil {
		return datagpt.Sample{}, err
	}
	seq := c.cfg.SeqLength
	s := datagpt.Sample{Tokens: b.tokens, Labels: make([]int32, seq), LossMask: b.mask, PositionIDs: b.positions, DocIDs: b.docIDs}
	copy(s.Labels, b.tokens[1:])
	s.Labels[seq-1] = c.pad
	return s, nil
}

// Prepare collects the rollouts of iteration+1's collection unless they
// are the current ones (a resumed run collects at its first iteration, as
// Megatron's, whose rollouts are not in the checkpoint).
func (c *Collector) Prepare(ctx context.Context, m train.Model, eval *tensor.Tape, iteration, consumed int64) error {
	k := iteration / c.itersPerCol
	c.iteration = iteration
	if k == c.current {
		return nil
	}
	if c.cfg.Packing && iteration%c.itersPerCol != 0 {
		// The consumed count is in sequences, which depend on the packing.
		return fmt.Errorf("rl: iteration %d is not the start of a collection of %d iterations: resume from a checkpoint saved at a multiple of %d iterations with the same --global-batch-size and --grpo-* flags",
			iteration+1, c.itersPerCol, c.itersPerCol)
	}
	if !c.cfg.Packing && (consumed != k*c.samplesPerCollection() || iteration%c.itersPerCol != 0) {
		return fmt.Errorf("rl: iteration %d (%d samples consumed) is not the start of a collection of %d iterations of %d samples: resume from a checkpoint saved at a multiple of %d iterations with the same --global-batch-size and --grpo-* flags",
			iteration+1, consumed, c.itersPerCol, c.cfg.GlobalBatchSize, c.itersPerCol)
	}
	gm, ok := m.(*gpt.Model)
	if !ok {
		return fmt.Errorf("rl: the RL step generates with a GPT model, not %T", m)
	}
	if c.ref == nil && c.cfg.Loss.KLBeta != 0 {
		// The weights the run starts from (Megatron: load_checkpoint with
		// --load unset loads nothing, and the state dict is the model's).
		for _, p := range gm.Params() {
			c.ref = append(c.ref, p.Clone())
		}
	}
	if c.ref != nil && len(c.ref) != len(gm.Params()) {
		return fmt.Errorf("rl: the reference model has %d parameters, the model %d", len(c.ref), len(gm.Params()))
	}
	c.sharding = gm.Sharding
	if (c.sharding != nil) != (c.cfg.TP != nil && c.cfg.TP.Size() > 1) {
		return fmt.Errorf("rl: the model is split over tensor-parallel ranks (%v) but the collector's tensor-parallel group is %v", c.sharding != nil, c.cfg.TP)
	}
	gen := gm
	if c.cfg.InferenceTP != nil {
		// Megatron's refit: the inference layout's shards of the
		// current weights, made afresh for every collection.
		if c.sharding != nil {
			return fmt.Errorf("rl: --rl-inference-tensor-model-parallel-size: the separate inference layout is built from a training layout without tensor parallelism")
		}
		var err error
		if gen, err = gpt.Parallelize(gm, &tp.Region{Group: c.cfg.InferenceTP}, nil); err != nil {
			return fmt.Errorf("rl: the inference layout's model (--rl-inference-tensor-model-parallel-size=%d): %w", c.cfg.InferenceTP.Size(), err)
		}
		if c.cfg.Printf != nil {
			c.cfg.Printf("rl: refit for collection %d: this rank's inference shards hold %d of the model's %d parameters (TP=%d)",
				k, numel(gen.Params()), numel(gm.Params()), c.cfg.InferenceTP.Size())
		}
	}
	col, rows, err := c.collect(ctx, gen, k)
	if err != nil {
		return err
	}
	if err := c.logprobs(gm, eval, rows, false); err != nil {
		return err
	}
	if c.cfg.Loss.KLBeta != 0 {
		if err := c.logprobs(gm, eval, rows, true); err != nil {
			return err
		}
	} else {
		// β = 0: the KL term is multiplied by 0 whatever the reference
		// says; Megatron computes it anyway, gotron skips the forwards.
		for i := range rows {
			rows[i].ref = rows[i].old
		}
	}
	if c.cfg.Packing {
		if err := c.pack(ctx, k, rows); err != nil {
			return err
		}
	}
	c.rows, c.current = rows, k
	c.Last = col
	if c.cfg.Printf != nil {
		var mean, lo, hi float64 = 0, math.Inf(1), math.Inf(-1)
		for _, r := range col.Rewards {
			mean += r
			lo, hi = math.Min(lo, r), math.Max(hi, r)
		}
		mean /= float64(len(col.Rewards))
		c.cfg.Printf("rl: collection %d: %d prompts × %d rollouts, reward mean %.4f (min %.4g, max %.4g), %d generated loss tokens",
			k, c.cfg.PromptsPerStep, c.cfg.GroupSize, mean, lo, hi, col.Tokens)
	}
	return nil
}

// pack packs collection k's rows and keeps this data-parallel rank's
// bins, as Megatron's pack_all_trajectories: every rank gathers all the
// rollouts (each rank computed its own rows' log-probabilities; Megatron
// gathers the trajectories and computes them on its bins), packs them all
// the same way, and takes its bins by the packing algorithm, padded with
// empty bins to the most any rank has (distribute_packed_bins). Each
// iteration then runs update_microbatch_calculator's bins per rank.
func (c *Collector) pack(ctx context.Context, k int64, rows []row) error {
	dp, rank := dpSize(c.cfg.DP), 0
	if c.cfg.DP != nil {
		rank = c.cfg.DP.Rank()
		if err := c.gatherRows(ctx, rows); err != nil {
			return fmt.Errorf("rl: collection %d: %w", k, err)
		}
	}
	all, err := packRows(rows, c.cfg.SeqLength, c.cfg.MaxSequencesPerBin, c.pad)
	if err != nil {
		return err
	}
	c.rankSeqs = make([][]int, dp)
	var mine []int
	var perRank int
	for r := range dp {
		idx, per, err := RankBins(c.cfg.PackingAlgo, len(all), dp, r)
		if err != nil {
			return err
		}
		perRank = per
		c.rankSeqs[r] = make([]int, per)
		for i, b := range idx {
			c.rankSeqs[r][i] = len(all[b].seqs)
		}
		if r == rank {
			mine = idx
		}
	}
	c.bins = make([]packedBin, 0, perRank)
	for _, b := range mine {
		c.bins = append(c.bins, all[b])
	}
	for len(c.bins) < perRank {
		c.bins = append(c.bins, emptyBin(c.cfg.SeqLength, c.pad))
	}
	c.binsPerIter = int64(BinsPerStep(c.cfg.GlobalBatchSize, c.cfg.PromptsPerStep*c.cfg.GroupSize, perRank))
	if c.cfg.Printf != nil {
		line := fmt.Sprintf("rl: collection %d: %d rollouts packed into %d bins, %d bins per iteration", k, len(rows), len(all), c.binsPerIter)
		if dp > 1 {
			line += fmt.Sprintf(" on each of %d data-parallel ranks (%s: %d bins per rank, %d empty in all)", dp, c.cfg.PackingAlgo, perRank, dp*perRank-len(all))
		}
		c.cfg.Printf("%s", line)
	}
	return nil
}

// gatherRows gives every data-parallel rank every rollout's row (each
// rank holds those it owns; Megatron's _gather of the trajectories): one
// sum over the ranks of the rows' tokens and of the bits of their loss
// masks and log-probabilities as integers, where exactly one rank adds a
// row's values and the rest add 0, so the rows arrive bit for bit.
func (c *Collector) gatherRows(ctx context.Context, rows []row) error {
	ctx = context.WithoutCancel(ctx) // the ranks finish the collection together
	seq := c.cfg.SeqLength
	const fields = 5 // tokens, mask, old, ref, inference
	buf := make([]int64, len(rows)*fields*seq)
	for j, r := range rows {
		if !c.owns(j) {
			continue
		}
		at := buf[j*fields*seq:]
		for t := range seq {
			at[t] = int64(r.tokens[t])
			at[seq+t] = int64(math.Float32bits(r.mask[t]))
			at[2*seq+t] = int64(math.Float64bits(r.old[t]))
			at[3*seq+t] = int64(math.Float64bits(r.ref[t]))
			at[4*seq+t] = int64(math.Float64bits(r.inference[t]))
		}
	}
	if err := c.cfg.DP.AllReduce(ctx, comm.Int64s(buf), comm.Sum); err != nil {
		return fmt.Errorf("gather the rollouts over the data-parallel ranks for packing: %w", err)
	}
	for j := range rows {
		if c.owns(j) {
			continue
		}
		at := buf[j*fields*seq:]
		r := &rows[j]
		r.tokens, r.mask = make([]int32, seq), make([]float32, seq)
		r.old, r.ref, r.inference = make([]float64, seq), make([]float64, seq), make([]float64, seq)
		for t := range seq {
			r.tokens[t] = int32(at[t])
			r.mask[t] = math.Float32frombits(uint32(at[seq+t]))
			r.old[t] = math.Float64frombits(uint64(at[2*seq+t]))
			r.ref[t] = math.Float64frombits(uint64(at[3*seq+t]))
			r.inference[t] = math.Float64frombits(uint64(at[4*seq+t]))
		}
	}
	return nil
}

// seedOf derives a stream's seed from the run's seed, the collection and a
// salt: a resumed run draws what an uninterrupted one would.
func (c *Collector) seedOf(k int64, salt string) uint64 {
	h := fnv.New64a()
	fmt.Fprintf(h, "%d/%d/%s", c.cfg.Seed, k, salt)
	return h.Sum64()
}

// rollout is one generation of a collection.
type rollout struct {
	task     Countdown
	prompt   []int32
	gen      []int32
	logprobs []float64
	done     bool
}

// generate runs requests reqs (rollouts byID) on eng and fills their
// rollouts. Under tensor parallelism every rank of the group holds its
// shard's engine and they step together (infer.Lockstep, infer.Follow):
// rank 0 leads and sends the generated tokens and log-probabilities to the
// others after, so every rank trains on the same rollouts. A signal (ctx)
// does not stop the generation: the collection is part of the iteration in
// flight, which gotron train finishes before it saves and exits.
func (c *Collector) generate(ctx context.Context, eng *infer.Engine, reqs []infer.Request, outs []rollout, byID []int) error {
	ctx = context.WithoutCancel(ctx)
	tpg := c.genGroup()
	if tpg != nil && tpg.Size() > 1 && tpg.Rank() != 0 {
		if err := infer.Follow(ctx, eng, tpg); err != nil {
			return fmt.Errorf("rl: tensor-parallel generation: %w", err)
		}
		return c.receiveRollouts(ctx, outs, byID)
	}
	type driver interface {
		Add(infer.Request) (infer.SeqID, error)
		Step() ([]infer.Event, error)
		HasWork() bool
	}
	var drv driver = eng
	var ls *infer.Lockstep
	if tpg != nil && tpg.Size() > 1 {
		var err error
		if ls, err = infer.NewLockstep(ctx, eng, tpg); err != nil {
			return fmt.Errorf("rl: tensor-parallel generation: %w", err)
		}
		drv = ls
	}
	// The first failure; a leader goes on to close the lockstep and tell
	// the others, who would otherwise wait for it.
	var first error
	seqs := map[infer.SeqID]int{}
	for i, r := range reqs {
		id, err := drv.Add(r)
		if err != nil {
			first = fmt.Errorf("rl: rollout %d: %w", byID[i], err)
			break
		}
		seqs[id] = byID[i]
	}
	finished := 0
	for step := int64(1); first == nil && drv.HasWork(); step++ {
		evs, err := drv.Step()
		if err != nil {
			return fmt.Errorf("rl: generation: %w", err) // a failed lockstep sends nothing more
		}
		for _, ev := range evs {
			o := &outs[seqs[ev.Seq]]
			if ev.Token >= 0 {
				o.gen = append(o.gen, int32(ev.Token))
				o.logprobs = append(o.logprobs, float64(ev.Logprob))
			}
			if ev.Finish != "" {
				if ev.Finish == infer.FinishAbort && first == nil {
					first = fmt.Errorf("rl: rollout %d was aborted by the inference engine", seqs[ev.Seq])
				}
				o.done = true
				finished++
			}
		}
		if iv := int64(c.cfg.EngineLogInterval); iv > 0 && step%iv == 0 && c.cfg.Printf != nil {
			// gotron inference's line for --inference-logging-step-interval
			st := eng.Stats()
			c.cfg.Printf("rl: engine step %d: %d running, %d waiting, %d finished of %d, KV blocks %d/%d used (%d cached)",
				step, st.Running, st.Waiting, finished, len(reqs), st.KVBlocksUsed, st.KVBlocksTotal, st.KVBlocksCached)
		}
	}
	if ls == nil {
		return first
	}
	if err := ls.Close(); err != nil {
		return fmt.Errorf("rl: tensor-parallel generation: %w", err)
	}
	return c.sendRollouts(ctx, outs, byID, first)
}

// sendRollouts broadcasts, from tensor-parallel rank 0, the owned
// rollouts' generated tokens and log-probabilities (or that the generation
// failed, with failed).
func (c *Collector) sendRollouts(ctx context.Context, outs []rollout, byID []int, failed error) error {
	hdr := []int64{0, 0}
	if failed != nil {
		hdr[0] = 1
	}
	lens := make([]int64, len(byID))
	var toks []int32
	var lps []float32
	for i, j := range byID {
		lens[i] = int64(len(outs[j].gen))
		toks = append(toks, outs[j].gen...)
		for _, v := range outs[j].logprobs {
			lps = append(lps, float32(v)) // the engine's float32
		}
	}
	hdr[1] = int64(len(toks))
	if err := c.broadcastRollouts(ctx, hdr, lens, toks, lps); err != nil {
		return err
	}
	return failed
}

// receiveRollouts is sendRollouts' other end.
func (c *Collector) receiveRollouts(ctx context.Context, outs []rollout, byID []int) error {
	hdr := make([]int64, 2)
	if err := c.genGroup().Broadcast(ctx, comm.Int64s(hdr), 0); err != nil {
		return fmt.Errorf("rl: receive the rollouts from tensor-parallel rank 0: %w", err)
	}
	if hdr[0] != 0 {
		return fmt.Errorf("rl: tensor-parallel rank 0's generation failed (its log says why)")
	}
	if hdr[1] < 0 || hdr[1] > int64(len(byID))*int64(c.cfg.SeqLength) {
		return fmt.Errorf("rl: tensor-parallel rank 0 sent %d generated tokens for %d rollouts of at most %d", hdr[1], len(byID), c.cfg.SeqLength)
	}
	lens := make([]int64, len(byID))
	toks := make([]int32, hdr[1])
	lps := make([]float32, hdr[1])
	if err := c.broadcastRollouts(ctx, nil, lens, toks, lps); err != nil {
		return err
	}
	at := int64(0)
	for i, j := range byID {
		n := lens[i]
		if n < 0 || at+n > hdr[1] {
			return fmt.Errorf("rl: tensor-parallel rank 0 sent rollout %d with %d tokens: want 0..%d", j, n, hdr[1]-at)
		}
		o := &outs[j]
		o.gen = toks[at : at+n]
		for _, v := range lps[at : at+n] {
			o.logprobs = append(o.logprobs, float64(v))
		}
		o.done = true
		at += n
	}
	return nil
}

// broadcastRollouts broadcasts the header (unless nil), the lengths, tokens
// and log-probabilities from tensor-parallel rank 0.
func (c *Collector) broadcastRollouts(ctx context.Context, hdr, lens []int64, toks []int32, lps []float32) error {
	bufs := []comm.Buffer{comm.Int64s(lens), comm.Int32s(toks), comm.Float32s(lps)}
	if hdr != nil {
		bufs = append([]comm.Buffer{comm.Int64s(hdr)}, bufs...)
	}
	for _, b := range bufs {
		if b.Len() == 0 {
			continue
		}
		if err := c.genGroup().Broadcast(ctx, b, 0); err != nil {
			return fmt.Errorf("rl: send the rollouts over the tensor-parallel group: %w", err)
		}
	}
	return nil
}

// collect draws the prompts of collection k and generates their rollouts.
// Every rank draws all P prompts (one stream, the same on every rank) and
// generates, with gen (the model, or its inference layout's shards), the
// rollouts it owns (generates); each rollout samples from its own stream,
// seeded by the collection and the rollout's index, so its tokens do not
// depend on which rank generates it nor on what else is in the batch.
func (c *Collector) collect(ctx context.Context, gen *gpt.Model, k int64) (Collection, []row, error) {
	// A signal does not stop the collection (generate), nor the ranks'
	// exchange of its rewards: every rank finishes the iteration.
	ctx = context.WithoutCancel(ctx)
	P, G, seq := c.cfg.PromptsPerStep, c.cfg.GroupSize, c.cfg.SeqLength
	rng := rand.New(rand.NewPCG(c.seedOf(k, "prompts"), 0))
	tok := c.cfg.Tokenizer
	owned := 0
	for j := range P * G {
		if c.generates(j) {
			owned++
		}
	}
	ec := infer.EngineConfig{MaxNumSeqs: owned, VocabSize: tok.VocabSize()}
	maxLen := c.cfg.MaxSequenceLength
	if c.cfg.KVCacheGB > 0 {
		// As gotron inference sizes it: the smaller of the buffer and what
		// the rollouts can use (float64: no integer overflow).
		need := float64(owned) * float64(maxLen+16) * float64(gen.KVBytesPerToken())
		need += float64(owned) * float64(gen.GDNStateBytes())
		ec.KVCacheBytes = int64(max(1, min(need, c.cfg.KVCacheGB*(1<<30))))
	}
	eng, err := infer.NewEngine(gen, ec)
	if err != nil {
		return Collection{}, nil, fmt.Errorf("rl: inference engine: %w", err)
	}
	outs := make([]rollout, P*G)
	var ops []infer.Request // the owned rollouts' requests
	var byID []int          // their rollouts
	for p := range P {
		task := c.cfg.Env.Tasks[rng.IntN(len(c.cfg.Env.Tasks))]
		text := task.Prompt()
		if c.cfg.Render != nil {
			if text, err = c.cfg.Render(text); err != nil {
				return Collection{}, nil, fmt.Errorf("rl: chat template: %w", err)
			}
		}
		var ids []int32
		if c.bos >= 0 {
			ids = append(ids, int32(c.bos))
		}
		for _, id := range tok.Encode(text) {
			ids = append(ids, int32(id))
		}
		if len(ids) >= maxLen {
			return Collection{}, nil, fmt.Errorf("rl: a prompt of %d tokens leaves no room to generate within %d tokens (--seq-length=%d, --inference-max-seq-length)", len(ids), maxLen, seq)
		}
		for g := range G {
			j := p*G + g
			outs[j] = rollout{task: task, prompt: ids}
			if !c.generates(j) {
				continue
			}
			ops = append(ops, infer.Request{Prompt: ids, MaxTokens: maxLen - len(ids), StopTokens: []int{int(c.eod)}, Logprobs: true,
				Sampling: infer.Sampling{Temperature: c.cfg.Temperature, TopP: c.cfg.TopP, TopK: max(c.cfg.TopK, 0), Seed: c.seedOf(k, fmt.Sprint("rollout/", j))}})
			byID = append(byID, j)
		}
	}
	if err := c.generate(ctx, eng, ops, outs, byID); err != nil {
		return Collection{}, nil, err
	}
	col := Collection{Index: k, Rewards: make([]float64, len(outs)), Responses: make([]string, len(outs))}
	for j, o := range outs {
		if !c.owns(j) {
			continue
		}
		if !o.done {
			return Collection{}, nil, fmt.Errorf("rl: rollout %d did not finish", j)
		}
		text := o.gen
		if len(text) > 0 && text[len(text)-1] == c.eod {
			text = text[:len(text)-1] // the response's content: without its end
		}
		ids := make([]int, len(text))
		for i, id := range text {
			ids[i] = int(id)
		}
		col.Responses[j] = tok.Decode(ids)
		col.Rewards[j] = o.task.Score(col.Responses[j])
	}
	if err := c.shareRewards(ctx, col.Rewards); err != nil {
		return Collection{}, nil, err
	}
	rewards := make([][]float64, P)
	turns := make([][]int, P)
	for j, reward := range col.Rewards {
		rewards[j/G] = append(rewards[j/G], reward)
		turns[j/G] = append(turns[j/G], 1)
	}
	adv, err := Advantages(rewards, turns)
	if err != nil {
		return Collection{}, nil, err
	}
	rows := make([]row, len(outs))
	for j, o := range outs {
		if !c.owns(j) {
			rows[j].advantage = adv[j] // another rank's: no tokens
			continue
		}
		r := row{tokens: make([]int32, seq), mask: make([]float32, seq), inference: make([]float64, seq), advantage: adv[j]}
		n := copy(r.tokens, o.prompt)
		n += copy(r.tokens[n:], o.gen)
		for t := n; t < seq; t++ {
			r.tokens[t] = c.pad
		}
		// prepare_data_for_update: the loss mask is the generation mask less
		// padding tokens (pad_mask_loss), shifted to the predicting position.
		for t := len(o.prompt) - 1; t < n-1; t++ {
			if r.tokens[t+1] != c.pad {
				r.mask[t] = 1
				col.Tokens++
			}
			r.inference[t] = o.logprobs[t+1-len(o.prompt)]
		}
		rows[j] = r
	}
	if c.cfg.DP != nil {
		n := []int64{int64(col.Tokens)}
		if err := c.cfg.DP.AllReduce(ctx, comm.Int64s(n), comm.Sum); err != nil {
			return Collection{}, nil, fmt.Errorf("rl: collection %d: sum the loss tokens over the data-parallel ranks: %w", k, err)
		}
		col.Tokens = int(n[0])
	}
	return col, rows, nil
}

// shareRewards gives every data-parallel rank every rollout's reward (each
// rank scored those it owns, the others are 0): a sum over the ranks of the
// rewards' float64 bits as integers, where exactly one rank adds a
// rollout's bits and the rest add 0, so the rewards arrive bit for bit.
func (c *Collector) shareRewards(ctx context.Context, rewards []float64) error {
	if c.cfg.DP == nil {
		return nil
	}
	bits := make([]int64, len(rewards))
	for j, r := range rewards {
		if c.owns(j) {
			bits[j] = int64(math.Float64bits(r))
		}
	}
	if err := c.cfg.DP.AllReduce(ctx, comm.Int64s(bits), comm.Sum); err != nil {
		return fmt.Errorf("rl: gather the rewards from the data-parallel ranks: %w", err)
	}
	for j, b := range bits {
		rewards[j] = math.Float64frombits(uint64(b))
	}
	return nil
}

// logprobs fills the rows' old (or, with ref, reference) log-probabilities:
// forwards of --micro-batch-size rollouts without gradients (Megatron's
// compute_logprobs_batch in eval mode), with the reference weights swapped
// in for ref (as Megatron loads the reference state dict and back).
func (c *Collector) logprobs(m *gpt.Model, tp *tensor.Tape, rows []row, ref bool) (err error) {
	if ref {
		params := m.Params()
		saved := make([]*tensor.Tensor, len(params))
		for i, p := range params {
			saved[i] = p.Clone()
			tensor.Copy(p, c.ref[i])
		}
		defer func() {
			for i, p := range params {
				tensor.Copy(p, saved[i])
			}
		}()
	}
	mbs, seq := c.cfg.MicroBatchSize, c.cfg.SeqLength
	for lo := 0; lo < len(rows); lo += mbs {
		if !c.owns(lo) {
			continue // another data-parallel rank's micro-batch
		}
		toks := make([]int32, 0, mbs*seq)
		labels := make([]int32, 0, mbs*seq)
		for _, r := range rows[lo : lo+mbs] {
			toks = append(toks, r.tokens...)
			labels = append(labels, r.tokens[1:]...)
			labels = append(labels, c.pad)
		}
		bt := gpt.Batch{Tokens: tensor.FromInt32(toks, mbs, seq)}
		logits := c.fullVocab(tp, m.Forward(tp, bt, nil, false))
		lp := tp.TokenLogProbs(tp.Reshape(logits, mbs*seq, logits.Dim(-1)), tensor.FromInt32(labels, mbs*seq))
		if err := tp.Err(); err != nil {
			tp.Reset()
			return fmt.Errorf("rl: log-probabilities: %w", err)
		}
		vals := lp.Float32s()
		for b := range mbs {
			out := make([]float64, seq)
			for t := range seq {
				v := vals[b*seq+t]
				if c.cfg.BF16 {
					v = tensor.BFloat16ToFloat32(tensor.Float32ToBFloat16(v))
				}
				out[t] = float64(v)
			}
			if ref {
				rows[lo+b].ref = out
			} else {
				rows[lo+b].old = out
			}
		}
		tp.Reset()
	}
	return nil
}

// fullVocab all-gathers a tensor-parallel rank's vocabulary slice of the
// logits (backward: this rank's slice of the gradient), so that every rank
// computes the log-probabilities, and so the loss, of one process.
func (c *Collector) fullVocab(tp *tensor.Tape, logits *tensor.Tensor) *tensor.Tensor {
	if c.sharding == nil {
		return logits
	}
	return c.sharding.GatherVocab(tp, logits)
}

// Loss is the GRPO loss of logits (b, t, V) over samples first…first+b−1:
// the mean over their loss tokens of calculate_grpo_loss, as
// train_rl.loss_func reduces it (Σ mask·loss over max(Σ mask, 1)).
func (c *Collector) Loss(tp *tensor.Tape, logits *tensor.Tensor, bt gpt.Batch, first int64) *tensor.Tensor {
	b, seq := bt.Tokens.Dim(0), bt.Tokens.Dim(1)
	rows := make([]*row, b)
	for i := range rows {
		r, err := c.rowOf(first + int64(i))
		if err != nil {
			tp.Fail(err)
			return tp.Scale(tp.Sum(logits), 0)
		}
		rows[i] = r
	}
	logits = c.fullVocab(tp, logits)
	lp := tp.TokenLogProbs(tp.Reshape(logits, b*seq, logits.Dim(-1)), tp.Reshape(bt.Labels, b*seq))
	return tp.Apply(&grpoLoss{cfg: c.cfg.Loss, rows: rows, seq: seq}, lp)[0]
}

// grpoLoss is the GRPO loss of a micro-batch's current log-probabilities
// (n) as a tape function: the loss and its gradient are computed on the
// host in float64 (MicroBatchLoss).
type grpoLoss struct {
	cfg    LossConfig
	rows   []*row
	seq    int
	grads  []float64
	tokens float64
}

func (f *grpoLoss) Forward(tp *tensor.Tape, in []*tensor.Tensor) []*tensor.Tensor {
	lp := in[0].Float32s()
	toks := make([]Token, len(lp))
	mask := make([]float64, len(lp))
	for i, v := range lp {
		r := f.rows[i/f.seq]
		t := i % f.seq
		toks[i] = Token{Current: float64(v), Old: r.old[t], Ref: r.ref[t], Inference: r.inference[t], Advantage: r.advantageAt(t)}
		mask[i] = float64(r.mask[t])
	}
	f.grads = make([]float64, len(lp))
	s, err := f.cfg.MicroBatchLoss(toks, mask, f.grads)
	out := tp.Empty(1)
	if err != nil {
		tp.Fail(err)
		return []*tensor.Tensor{out}
	}
	f.tokens = s.Tokens
	out.Float32s()[0] = float32(s.Loss / s.Tokens)
	return []*tensor.Tensor{out}
}

func (f *grpoLoss) Backward(tp *tensor.Tape, gradOut []*tensor.Tensor) []*tensor.Tensor {
	g := float64(gradOut[0].Float32s()[0]) / f.tokens
	d := tp.Empty(len(f.grads))
	dv := d.Float32s()
	for i, v := range f.grads {
		dv[i] = float32(g * v)
	}
	return []*tensor.Tensor{d}
}

// numel is the number of values in ps.
func numel(ps []*tensor.Tensor) int {
	n := 0
	for _, p := range ps {
		n += p.Numel()
	}
	return n
}
