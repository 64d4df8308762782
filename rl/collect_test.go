package rl

import (
	"context"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/gotron/gotron/comm/inproc"
	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/tensor"
	"github.com/gotron/gotron/tokenizer"
)

// testCollector is a Collector over two countdown tasks with a byte-level
// BPE tokenizer learnt from their prompts, and a tiny model.
func testCollector(t *testing.T, loss LossConfig, opts ...func(*Config)) (*Collector, *gpt.Model) {
	t.Helper()
	tasks := []Countdown{{Target: 24, Nums: []int64{3, 8, 1}}, {Target: 10, Nums: []int64{2, 5}}}
	var texts []string
	for _, task := range tasks {
		texts = append(texts, task.Prompt()+" <answer> (1 + 2) * 3 </answer>")
	}
	files, err := tokenizer.TrainGPT2BPE(context.Background(), texts, 400)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := files.Tokenizer()
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Env: &Env{Tasks: tasks}, Tokenizer: tok, PromptsPerStep: 2, GroupSize: 3, Iterations: 2,
		GlobalBatchSize: 3, MicroBatchSize: 3, SeqLength: 128, Loss: loss, Temperature: 1, Seed: 5}
	for _, o := range opts {
		o(&cfg)
	}
	// The model's vocabulary is the tokenizer's (no padding): the engine's
	// log-probabilities are over the tokenizer's vocabulary.
	m, err := gpt.New(gpt.Config{NumLayers: 2, HiddenSize: 32, NumAttentionHeads: 4, VocabSize: tok.VocabSize(), MaxPositionEmbeddings: max(128, cfg.SeqLength),
		PositionEmbeddingType: gpt.RoPE, Normalization: gpt.RMSNorm, Activation: gpt.SwiGLU, FFNHiddenSize: 64,
		DisableBiasLinear: true, InitMethodStd: 0.3}, tensor.NewRNG(3))
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewCollector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c, m
}

// TestCollectorRollouts checks a collection against what it must hold: the
// rewards are the countdown scores of the decoded responses, the
// advantages Advantages of them, the loss mask the generated tokens, the
// training forward's log-probabilities of the generated tokens those the
// inference engine sampled them with, the reference model the starting
// weights (swapped in and out), and the samples the collection's rollouts
// for --grpo-iterations passes.
func TestCollectorRollouts(t *testing.T) {
	c, m := testCollector(t, LossConfig{ClampEpsLower: 0.2, ClampEpsUpper: 0.2, KLBeta: 0.1})
	if c.IterationsPerCollection() != 4 {
		t.Fatalf("iterations per collection %d, want 2 passes × 6 rollouts / 3", c.IterationsPerCollection())
	}
	eval := tensor.NewNoGradTape(nil)
	// A cancelled context (a signal) lets the collection finish: it is part
	// of the iteration in flight, which train finishes before saving.
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	if err := c.Prepare(cancelled, m, eval, 0, 0); err != nil {
		t.Fatal(err)
	}
	col := c.Last
	if len(col.Rewards) != 6 || len(c.rows) != 6 {
		t.Fatalf("%d rewards, %d rows; want 6", len(col.Rewards), len(c.rows))
	}
	var rewards [][]float64
	var turns [][]int
	tokens := 0
	for j, r := range c.rows {
		if j%3 == 0 {
			rewards, turns = append(rewards, nil), append(turns, nil)
		}
		rewards[j/3] = append(rewards[j/3], col.Rewards[j])
		turns[j/3] = append(turns[j/3], 1)
		for _, task := range c.cfg.Env.Tasks {
			if strings.Contains(c.cfg.Tokenizer.Decode(toInts(r.tokens)), task.Prompt()) {
				if got := task.Score(col.Responses[j]); got != col.Rewards[j] {
					t.Errorf("rollout %d: reward %g, Score of its response %g", j, col.Rewards[j], got)
				}
			}
		}
		for pos, mk := range r.mask {
			if mk == 0 {
				continue
			}
			tokens++
			if d := math.Abs(r.old[pos] - r.inference[pos]); d > 1e-4 {
				t.Errorf("rollout %d position %d: training forward log-probability %g, the engine's %g", j, pos, r.old[pos], r.inference[pos])
			}
			if r.ref[pos] != r.old[pos] {
				t.Fatalf("rollout %d position %d: reference %g, old %g: the reference is the starting weights", j, pos, r.ref[pos], r.old[pos])
			}
		}
	}
	adv, _ := Advantages(rewards, turns)
	for j, r := range c.rows {
		if r.advantage != adv[j] {
			t.Errorf("rollout %d advantage %g, want %g", j, r.advantage, adv[j])
		}
	}
	if tokens != col.Tokens || tokens == 0 {
		t.Fatalf("%d masked tokens, the collection counts %d", tokens, col.Tokens)
	}
	// Samples 0..11 are the 6 rollouts twice; 12 is the next collection's.
	for i := range 12 {
		s, err := c.Sample(i)
		if err != nil {
			t.Fatal(err)
		}
		if &s.Tokens[0] != &c.rows[i%6].tokens[0] || s.Labels[5] != s.Tokens[6] {
			t.Fatalf("sample %d is not rollout %d", i, i%6)
		}
	}
	if _, err := c.Sample(12); err == nil {
		t.Fatal("sample 12 (the next collection's) read before it was collected")
	}
	// The next collection, after the weights moved: the reference stays
	// the starting weights, and the model keeps its own.
	w := m.Params()[0].Float32s()
	for i := range w {
		w[i] += 0.05
	}
	before := append([]float32(nil), w...)
	if err := c.Prepare(context.Background(), m, eval, 5, 15); err == nil {
		t.Fatal("a collection started mid-way (at iteration 6 of 4 per collection) was accepted")
	}
	if err := c.Prepare(context.Background(), m, eval, 4, 12); err != nil {
		t.Fatal(err)
	}
	for i, v := range m.Params()[0].Float32s() {
		if v != before[i] {
			t.Fatalf("the reference forward left parameter 0 element %d at %g, was %g", i, v, before[i])
		}
	}
	differ := false
	for _, r := range c.rows {
		for pos, mk := range r.mask {
			differ = differ || (mk != 0 && r.ref[pos] != r.old[pos])
		}
	}
	if !differ {
		t.Error("after the weights moved, the reference log-probabilities equal the policy's")
	}
}

func toInts(ids []int32) []int {
	out := make([]int, len(ids))
	for i, id := range ids {
		out[i] = int(id)
	}
	return out
}

func TestNewCollectorErrors(t *testing.T) {
	null, err := tokenizer.NewNull(10)
	if err != nil {
		t.Fatal(err)
	}
	groups, err := inproc.NewWorld(2)
	if err != nil {
		t.Fatal(err)
	}
	base := Config{Env: &Env{Tasks: []Countdown{{Target: 1, Nums: []int64{1}}}}, Tokenizer: null,
		PromptsPerStep: 2, GroupSize: 2, Iterations: 1, GlobalBatchSize: 4, MicroBatchSize: 2, SeqLength: 16, Temperature: 1}
	for _, c := range []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"group of one", func(c *Config) { c.GroupSize = 1; c.GlobalBatchSize = 2 }, "--grpo-group-size=1: want >= 2"},
		{"no tasks", func(c *Config) { c.Env = &Env{} }, "no environment tasks"},
		{"batch", func(c *Config) { c.GlobalBatchSize = 3 }, "--global-batch-size=3 must divide"},
		{"micro-batch", func(c *Config) { c.GlobalBatchSize = 1; c.MicroBatchSize = 3 }, "--micro-batch-size=3 must divide"},
		{"iterations", func(c *Config) { c.Iterations = 0 }, "--grpo-iterations"},
		{"huge", func(c *Config) { c.PromptsPerStep = 1 << 40 }, "rollouts per collection"},
		{"top-k and top-p", func(c *Config) { c.TopK = 5; c.TopP = 0.5 }, "--top-k and --top-p cannot both be set"},
		{"nan", func(c *Config) { c.Loss.KLBeta = math.NaN() }, "--grpo-kl-beta=NaN"},
		{"packing micro-batch", func(c *Config) { c.Packing, c.MaxSequencesPerBin = true, 50 }, "--rl-use-sequence-packing needs --micro-batch-size 1, not 2"},
		{"packing bin", func(c *Config) { c.Packing, c.MicroBatchSize = true, 1 }, "--rl-sequence-packing-max-sequences-per-bin"},
		{"packing algorithm", func(c *Config) {
			c.Packing, c.MicroBatchSize, c.MaxSequencesPerBin, c.PackingAlgo = true, 1, 50, "sorted"
		},
			`--rl-sequence-packing-algo "sorted": want fifo or round-robin`},
		{"packing over ranks", func(c *Config) {
			c.Packing, c.MicroBatchSize, c.MaxSequencesPerBin, c.DP = true, 1, 50, groups[0]
			c.PromptsPerStep, c.GroupSize, c.GlobalBatchSize = 3, 3, 3
		},
			"the 9 rollouts per collection must be a multiple of 2 data-parallel ranks"},
	} {
		cfg := base
		c.edit(&cfg)
		if _, err := NewCollector(cfg); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error containing %q", c.name, err, c.want)
		}
	}
}

// TestCollectorPackedPlan: with packing each iteration runs ⌈(global batch
// / rollouts per collection) × bins⌉ bins, cycling through the
// collection's bins from where its previous iteration stopped, and counts
// the sequences in them; a resume is checked against the iteration alone.
func TestCollectorPackedPlan(t *testing.T) {
	loss := LossConfig{ClampEpsLower: 0.2, ClampEpsUpper: 0.2}
	c, m := testCollector(t, loss, func(c *Config) {
		c.GlobalBatchSize, c.MicroBatchSize, c.SeqLength, c.Packing, c.MaxSequencesPerBin = 3, 1, 512, true, 2
	})
	eval := tensor.NewNoGradTape(nil)
	if c.IterationsPerCollection() != 4 {
		t.Fatalf("%d iterations per collection, want 2 passes × 6/3", c.IterationsPerCollection())
	}
	var cycled []int
	for it := range int64(4) {
		if err := c.Prepare(context.Background(), m, eval, it, 0); err != nil {
			t.Fatal(err)
		}
		nb := len(c.bins)
		if nb < 3 {
			t.Fatalf("%d bins of at most 2 of 6 rollouts", nb)
		}
		micro, first, seqs, packed := c.Plan()
		if want := (3*nb + 5) / 6; !packed || micro != want || first != it*int64(want) {
			t.Fatalf("iteration %d: plan %d micro-batches from %d (packed %v), want %d from %d", it, micro, first, packed, want, it*int64(want))
		}
		var got int64
		for i := range int64(micro) {
			b := c.bins[(first+i)%int64(nb)]
			got += int64(len(b.seqs))
			s, err := c.Sample(int(first + i))
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(s.Tokens, b.tokens) || !slices.Equal(s.DocIDs, b.docIDs) || !slices.Equal(s.PositionIDs, b.positions) {
				t.Fatalf("iteration %d sample %d is not bin %d", it, first+i, (first+i)%int64(nb))
			}
			cycled = append(cycled, int((first+i)%int64(nb)))
		}
		if seqs != got {
			t.Errorf("iteration %d: %d sequences, its bins hold %d", it, seqs, got)
		}
	}
	t.Logf("bins run: %v", cycled)
	if _, err := c.Sample(int(4 * c.binsPerIter)); err == nil {
		t.Error("a sample past the collection's iterations was served")
	}
	if err := c.Prepare(context.Background(), m, eval, 5, 0); err == nil || !strings.Contains(err.Error(), "is not the start of a collection of 4 iterations") {
		t.Errorf("resume at iteration 6: %v", err)
	}
	if err := c.Prepare(context.Background(), m, eval, 8, 12345); err != nil {
		t.Errorf("resume at iteration 9 (any consumed count: sequences): %v", err)
	}
}

// TestCollectorLossGradient checks Loss as the tape runs it (a micro-batch
// of the collection's samples, a scale before backward, as the stepper's)
// against MicroBatchLoss and TokenLogProbs' gradient from its host
// gradients.
func TestCollectorLossGradient(t *testing.T) {
	c, m := testCollector(t, LossConfig{ClampEpsLower: 0.2, ClampEpsUpper: 0.28, KLBeta: 0.1, EntropyWeight: 0.05,
		ISCorrection: true, ISTruncation: 1.5})
	if err := c.Prepare(context.Background(), m, tensor.NewNoGradTape(nil), 0, 0); err != nil {
		t.Fatal(err)
	}
	const b, first = 3, 3 // samples 3..5: the second group
	seq, V := c.cfg.SeqLength, m.Config.VocabSize
	var toks, labels []int32
	for i := range b {
		s, err := c.Sample(first + i)
		if err != nil {
			t.Fatal(err)
		}
		toks, labels = append(toks, s.Tokens...), append(labels, s.Labels...)
	}
	bt := gpt.Batch{Tokens: tensor.FromInt32(toks, b, seq), Labels: tensor.FromInt32(labels, b, seq)}
	rng := tensor.NewRNG(11)
	vals := make([]float32, b*seq*V)
	rng.Normal(vals, 0, 2)
	run := func(viaLoss bool) ([]float32, float64) {
		logits := tensor.FromFloat32(append([]float32(nil), vals...), b, seq, V)
		logits.SetRequiresGrad(true)
		tp := tensor.NewTape()
		var value float64
		if viaLoss {
			loss := c.Loss(tp, logits, bt, first)
			value = float64(loss.Float32s()[0])
			if err := tp.Backward(tp.Scale(loss, 7)); err != nil {
				t.Fatal(err)
			}
		} else {
			lp := tp.TokenLogProbs(tp.Reshape(logits, b*seq, V), tensor.FromInt32(labels, b*seq))
			var tks []Token
			var mask []float64
			for i, v := range lp.Float32s() {
				r := c.rows[first+i/seq]
				p := i % seq
				tks = append(tks, Token{Current: float64(v), Old: r.old[p], Ref: r.ref[p], Inference: r.inference[p], Advantage: r.advantage})
				mask = append(mask, float64(r.mask[p]))
			}
			grads := make([]float64, len(tks))
			s, err := c.cfg.Loss.MicroBatchLoss(tks, mask, grads)
			if err != nil {
				t.Fatal(err)
			}
			value = s.Loss / s.Tokens
			g := make([]float32, len(grads))
			for i, v := range grads {
				g[i] = float32(7 * v / s.Tokens)
			}
			if err := tp.BackwardFrom([]*tensor.Tensor{lp}, []*tensor.Tensor{tensor.FromFloat32(g, b*seq)}); err != nil {
				t.Fatal(err)
			}
		}
		return logits.Grad.Float32s(), value
	}
	got, gotLoss := run(true)
	want, wantLoss := run(false)
	if math.Abs(gotLoss-wantLoss) > 1e-6*math.Max(1, math.Abs(wantLoss)) {
		t.Fatalf("Loss %g, MicroBatchLoss %g", gotLoss, wantLoss)
	}
	nonzero := 0
	for i := range want {
		if math.Abs(float64(got[i]-want[i])) > 1e-6*math.Max(1, math.Abs(float64(want[i]))) {
			t.Fatalf("d loss / d logits element %d: %g through Loss, %g from the host gradients", i, got[i], want[i])
		}
		if want[i] != 0 {
			nonzero++
		}
	}
	if nonzero == 0 {
		t.Fatal("no gradient reached the logits")
	}
}

// TestCollectorDataParallel: two data-parallel ranks (in-process) each
// generate only the rollouts of their micro-batch slots (with
// --micro-batch-size 1 a group's rollouts are split between the ranks) and
// share the rewards; every row a rank owns is one process's, bit for bit
// (tokens, mask, advantage, engine and training log-probabilities), and a
// rank refuses the samples of the other.
func TestCollectorDataParallel(t *testing.T) {
	loss := LossConfig{ClampEpsLower: 0.2, ClampEpsUpper: 0.2, KLBeta: 0.1}
	one := func(c *Config) { c.GlobalBatchSize, c.MicroBatchSize = 6, 1 }
	whole, m := testCollector(t, loss, one)
	if err := whole.Prepare(context.Background(), m, tensor.NewNoGradTape(nil), 0, 0); err != nil {
		t.Fatal(err)
	}
	groups, err := inproc.NewWorld(2)
	if err != nil {
		t.Fatal(err)
	}
	ranks := make([]*Collector, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for r := range ranks {
		c, m := testCollector(t, loss, one, func(c *Config) { c.DP = groups[r] })
		ranks[r] = c
		wg.Add(1)
		go func() {
			defer wg.Done()
			// cancelled, as by a signal: the ranks still exchange the rewards
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			errs[r] = c.Prepare(ctx, m, tensor.NewNoGradTape(nil), 0, 0)
		}()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	distinct := map[float64]bool{}
	for j, want := range whole.rows {
		distinct[want.advantage] = true
		for r, c := range ranks {
			if c.Last.Rewards[j] != whole.Last.Rewards[j] {
				t.Errorf("rank %d: rollout %d reward %g, one process %g", r, j, c.Last.Rewards[j], whole.Last.Rewards[j])
			}
			if c.Last.Tokens != whole.Last.Tokens {
				t.Errorf("rank %d: %d loss tokens, one process %d", r, c.Last.Tokens, whole.Last.Tokens)
			}
			_, err := c.Sample(j)
			if !c.owns(j) {
				if err == nil || !strings.Contains(err.Error(), "belongs to another data-parallel rank") {
					t.Errorf("rank %d: sample %d of rank %d: error %v", r, j, 1-r, err)
				}
				continue
			}
			if j%2 != r {
				t.Fatalf("rank %d owns rollout %d: want slots r, r+2, …", r, j)
			}
			if err != nil {
				t.Fatal(err)
			}
			got := c.rows[j]
			if !slices.Equal(got.tokens, want.tokens) || !slices.Equal(got.mask, want.mask) || got.advantage != want.advantage ||
				!slices.Equal(got.old, want.old) || !slices.Equal(got.ref, want.ref) || !slices.Equal(got.inference, want.inference) {
				t.Errorf("rank %d: rollout %d differs from one process's", r, j)
			}
		}
	}
	if len(distinct) < 2 {
		t.Logf("advantages %v: all equal, the sharing of rewards is not exercised", distinct)
	}
}

// TestShareRewards: every rank ends with every rollout's reward bit for bit
// (negative, fractional and zero rewards; slots r, r+2, … scored by rank r).
func TestShareRewards(t *testing.T) {
	want := []float64{-1.5, 0.1, 1, 0, 1e-300, -0.3, 2.0 / 3, 7}
	groups, err := inproc.NewWorld(2)
	if err != nil {
		t.Fatal(err)
	}
	got := make([][]float64, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for r := range 2 {
		c := &Collector{cfg: Config{DP: groups[r], MicroBatchSize: 1}}
		got[r] = make([]float64, len(want))
		for j := range want {
			if c.owns(j) {
				got[r][j] = want[j]
			}
		}
		wg.Add(1)
		go func() { defer wg.Done(); errs[r] = c.shareRewards(context.Background(), got[r]) }()
	}
	wg.Wait()
	for r := range 2 {
		if errs[r] != nil {
			t.Fatal(errs[r])
		}
		if !slices.Equal(got[r], want) {
			t.Errorf("rank %d: rewards %v, want %v", r, got[r], want)
		}
	}
}

// TestCollectorPackedDataParallel: with packing over two in-process
// data-parallel ranks, every rank packs all the rollouts (gathered bit for
// bit) into one process's bins, keeps those Megatron's
// distribute_packed_bins deals it (fifo and round-robin; RankBins is
// checked against Megatron in TestPackingMatchesMegatron), padded with
// empty bins to the same number, and plans the same micro-batches with the
// sequences of both ranks' bins.
func TestCollectorPackedDataParallel(t *testing.T) {
	loss := LossConfig{ClampEpsLower: 0.2, ClampEpsUpper: 0.2, KLBeta: 0.1}
	packed := func(c *Config) {
		c.GlobalBatchSize, c.MicroBatchSize, c.SeqLength, c.Packing, c.MaxSequencesPerBin = 3, 1, 256, true, 2
		c.MaxSequenceLength = 100 // rollouts of at most 100 tokens: two share a bin
	}
	// One process's bins (one rank gets them all, whatever the algorithm).
	whole, m := testCollector(t, loss, packed)
	if err := whole.Prepare(context.Background(), m, tensor.NewNoGradTape(nil), 0, 0); err != nil {
		t.Fatal(err)
	}
	for _, algo := range []string{PackFIFO, PackRoundRobin} {
		groups, err := inproc.NewWorld(2)
		if err != nil {
			t.Fatal(err)
		}
		ranks := make([]*Collector, 2)
		errs := make([]error, 2)
		var wg sync.WaitGroup
		for r := range ranks {
			c, m := testCollector(t, loss, packed, func(c *Config) { c.DP, c.PackingAlgo = groups[r], algo })
			ranks[r] = c
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[r] = c.Prepare(context.Background(), m, tensor.NewNoGradTape(nil), 0, 0)
			}()
		}
		wg.Wait()
		for r, err := range errs {
			if err != nil {
				t.Fatalf("%s: rank %d: %v", algo, r, err)
			}
		}
		nb := len(whole.bins)
		// seqs[r][i]: the sequences in rank r's bin i, by Megatron's split of one process's bins.
		var seqs [2][]int64
		for r, c := range ranks {
			idx, per, err := RankBins(algo, nb, 2, r)
			if err != nil {
				t.Fatal(err)
			}
			if len(c.bins) != per {
				t.Fatalf("%s: rank %d runs %d bins, want %d of %d", algo, r, len(c.bins), per, nb)
			}
			seqs[r] = make([]int64, per)
			for i, b := range idx {
				seqs[r][i] = int64(len(whole.bins[b].seqs))
			}
			for i, b := range c.bins {
				if i >= len(idx) {
					if len(b.seqs) != 0 || slices.ContainsFunc(b.mask, func(v float32) bool { return v != 0 }) || b.tokens[0] != c.pad {
						t.Fatalf("%s: rank %d bin %d: want an empty bin", algo, r, i)
					}
					continue
				}
				w := whole.bins[idx[i]]
				if !slices.Equal(b.seqs, w.seqs) || !slices.Equal(b.tokens, w.tokens) || !slices.Equal(b.mask, w.mask) || !slices.Equal(b.old, w.old) ||
					!slices.Equal(b.ref, w.ref) || !slices.Equal(b.inference, w.inference) || !slices.Equal(b.advantages, w.advantages) ||
					!slices.Equal(b.positions, w.positions) || !slices.Equal(b.docIDs, w.docIDs) {
					t.Fatalf("%s: rank %d bin %d is not one process's bin %d", algo, r, i, idx[i])
				}
			}
			if want := int64(BinsPerStep(3, 6, per)); c.binsPerIter != want {
				t.Errorf("%s: rank %d: %d bins per iteration, want %d", algo, r, c.binsPerIter, want)
			}
		}
		// Both ranks plan the same iterations: this rank's bins from where
		// the last iteration stopped, cycling, and all ranks' sequences.
		per, step := int64(len(ranks[0].bins)), ranks[0].binsPerIter
		for it := range ranks[0].IterationsPerCollection() {
			var want int64
			for r := range ranks {
				for i := range step {
					want += seqs[r][(it*step+i)%per]
				}
			}
			for r, c := range ranks {
				if err := c.Prepare(context.Background(), nil, nil, it, 0); err != nil {
					t.Fatal(err)
				}
				micro, first, got, ok := c.Plan()
				if !ok || int64(micro) != step || first != it*step || got != want {
					t.Fatalf("%s: rank %d iteration %d: plan %d bins from %d, %d sequences (packed %v); want %d from %d, %d", algo, r, it, micro, first, got, ok, step, it*step, want)
				}
			}
		}
		t.Logf("%s: %d bins %v, %d per rank, %d per iteration", algo, nb, seqs, per, step)
	}
}

// TestCollectorMaxSequenceLength: --inference-max-seq-length caps a
// rollout's prompt and generated tokens below --seq-length (Megatron's
// engine stops a request at its max sequence length); the rows stay
// --seq-length long, padded.
func TestCollectorMaxSequenceLength(t *testing.T) {
	loss := LossConfig{ClampEpsLower: 0.2, ClampEpsUpper: 0.2}
	whole, m := testCollector(t, loss)
	if err := whole.Prepare(context.Background(), m, tensor.NewNoGradTape(nil), 0, 0); err != nil {
		t.Fatal(err)
	}
	prompt := slices.Index(whole.rows[0].mask, 1) + 1
	limit := prompt + 7
	c, m := testCollector(t, loss, func(c *Config) { c.MaxSequenceLength = limit })
	if err := c.Prepare(context.Background(), m, tensor.NewNoGradTape(nil), 0, 0); err != nil {
		t.Fatal(err)
	}
	capped := 0
	for j, r := range c.rows {
		n := rolloutLength(r.tokens, c.pad)
		if n > limit || len(r.tokens) != c.cfg.SeqLength {
			t.Fatalf("rollout %d: %d tokens of a %d-token row, want at most %d", j, n, len(r.tokens), limit)
		}
		if n == limit {
			capped++
		}
	}
	if capped == 0 {
		t.Errorf("no rollout reached the cap of %d tokens (prompt %d): the fixture does not exercise it", limit, prompt)
	}
	if _, err := NewCollector(Config{Env: c.cfg.Env, Tokenizer: c.cfg.Tokenizer, PromptsPerStep: 2, GroupSize: 3, Iterations: 1, GlobalBatchSize: 3,
		MicroBatchSize: 3, SeqLength: 128, MaxSequenceLength: 129}); err == nil || !strings.Contains(err.Error(), "--inference-max-seq-length") {
		t.Errorf("a cap above --seq-length: %v", err)
	}
}
