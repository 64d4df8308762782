package rl

import (
	"context"
	"encoding/json"
	"math"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/tensor"
)

// packingGolden is rl/testdata/packing_golden.json: Megatron's own
// SequencePacker.pack_sequences and distribute_packed_bins on small
// fixtures (tools/golden/rl_packing.py).
type packingGolden struct {
	Name            string               `json:"name"`
	SeqLength       int                  `json:"seq_length"`
	MaxPerBin       int                  `json:"max_per_bin"`
	Tokens          [][]int32            `json:"tokens"`
	GenerationMasks [][]float32          `json:"generation_masks"`
	Bins            [][]int              `json:"bins"`
	SeqLengths      []int                `json:"seq_lengths"`
	PackedTokens    [][]int32            `json:"packed_tokens"`
	PositionIDs     [][]int32            `json:"position_ids"`
	LossMask        [][]float32          `json:"loss_mask"`
	FIFO            map[string][][][]int `json:"fifo"`
	RoundRobin      map[string][][][]int `json:"round_robin"`
	CuSeqlens       [][]int32            `json:"cu_seqlens"`
	EmptyCuSeqlens  []int32              `json:"empty_cu_seqlens"`
}

// cuSeqlens is the cumulative document lengths of a bin's document ids,
// padded to n entries by repeating the last (Megatron's cu_seqlens for
// the attention kernel, fixed-size for CUDA graphs).
func cuSeqlens(docIDs []int32, n int) []int32 {
	cu := []int32{0}
	for t := 1; t < len(docIDs); t++ {
		if docIDs[t] != docIDs[t-1] {
			cu = append(cu, int32(t))
		}
	}
	cu = append(cu, int32(len(docIDs)))
	for len(cu) < n {
		cu = append(cu, cu[len(cu)-1])
	}
	return cu
}

// TestPackingMatchesMegatron: the bins, the packed tokens, positions and
// loss masks, the documents attention keeps apart (Megatron's cu_seqlens,
// an empty bin's too), and the fifo and round-robin splits over 1–3
// data-parallel ranks are Megatron's.
func TestPackingMatchesMegatron(t *testing.T) {
	raw, err := os.ReadFile("testdata/packing_golden.json")
	if err != nil {
		t.Fatal(err)
	}
	var cases []packingGolden
	if err := json.Unmarshal(raw, &cases); err != nil {
		t.Fatal(err)
	}
	for _, c := range cases {
		seq := c.SeqLength
		rows := make([]row, len(c.Tokens))
		for i, toks := range c.Tokens {
			if got := rolloutLength(toks, 0); got != c.SeqLengths[i] {
				t.Fatalf("%s: rollout %d: length %d, Megatron %d", c.Name, i, got, c.SeqLengths[i])
			}
			r := row{tokens: toks, mask: make([]float32, seq), old: make([]float64, seq), ref: make([]float64, seq),
				inference: make([]float64, seq), advantage: float64(i + 1)}
			for p := range seq - 1 {
				r.mask[p] = c.GenerationMasks[i][p+1] // position p predicts token p+1
				r.old[p] = float64(100*i + p)
			}
			rows[i] = r
		}
		bins, err := packRows(rows, seq, c.MaxPerBin, 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(bins) != len(c.Bins) {
			t.Fatalf("%s: %d bins, Megatron %d", c.Name, len(bins), len(c.Bins))
		}
		for b, pb := range bins {
			if !slices.Equal(pb.seqs, c.Bins[b]) {
				t.Fatalf("%s: bin %d holds %v, Megatron %v", c.Name, b, pb.seqs, c.Bins[b])
			}
			if !slices.Equal(pb.tokens, c.PackedTokens[b]) || !slices.Equal(pb.positions, c.PositionIDs[b]) {
				t.Fatalf("%s: bin %d: tokens %v positions %v, Megatron %v %v", c.Name, b, pb.tokens, pb.positions, c.PackedTokens[b], c.PositionIDs[b])
			}
			// Megatron's loss mask is per token, read shifted (loss_mask[:, 1:]).
			if !slices.Equal(pb.mask[:seq-1], c.LossMask[b][1:]) || pb.mask[seq-1] != 0 {
				t.Fatalf("%s: bin %d: loss mask %v, Megatron's shifted %v", c.Name, b, pb.mask, c.LossMask[b][1:])
			}
			if got := cuSeqlens(pb.docIDs, len(c.CuSeqlens[b])); !slices.Equal(got, c.CuSeqlens[b]) {
				t.Fatalf("%s: bin %d: documents %v, Megatron's cu_seqlens %v", c.Name, b, got, c.CuSeqlens[b])
			}
			at := 0
			for d, i := range pb.seqs {
				n := c.SeqLengths[i]
				for p := range n {
					if pb.docIDs[at+p] != int32(d) || pb.advantages[at+p] != rows[i].advantage || pb.old[at+p] != rows[i].old[p] {
						t.Fatalf("%s: bin %d position %d: document %d, advantage %g, old %g; want rollout %d's (%d, %g, %g)",
							c.Name, b, at+p, pb.docIDs[at+p], pb.advantages[at+p], pb.old[at+p], i, d, rows[i].advantage, rows[i].old[p])
					}
				}
				at += n
			}
		}
		if e := emptyBin(seq, 0); !slices.Equal(cuSeqlens(e.docIDs, len(c.EmptyCuSeqlens)), c.EmptyCuSeqlens) ||
			slices.ContainsFunc(e.positions, func(p int32) bool { return p != 0 }) {
			t.Fatalf("%s: an empty bin's documents %v and positions, Megatron's cu_seqlens %v and zeros", c.Name, cuSeqlens(e.docIDs, len(c.EmptyCuSeqlens)), c.EmptyCuSeqlens)
		}
		if len(c.FIFO) != 3 || len(c.RoundRobin) != 3 {
			t.Fatalf("%s: %d fifo and %d round-robin splits in the golden, want 3 each", c.Name, len(c.FIFO), len(c.RoundRobin))
		}
		for algo, splits := range map[string]map[string][][][]int{PackFIFO: c.FIFO, PackRoundRobin: c.RoundRobin} {
			for size, ranks := range splits {
				dp := int(size[0] - '0')
				for r, want := range ranks {
					idx, per, err := RankBins(algo, len(bins), dp, r)
					if err != nil {
						t.Fatal(err)
					}
					var got [][]int
					for _, b := range idx {
						got = append(got, bins[b].seqs)
					}
					for len(got) < per {
						got = append(got, []int{})
					}
					if !slices.EqualFunc(got, want, slices.Equal) {
						t.Fatalf("%s: %s over %d ranks, rank %d: %v, Megatron %v", c.Name, algo, dp, r, got, want)
					}
					if algo == PackFIFO {
						lo, hi, per2, err := FIFOBins(len(bins), dp, r)
						if err != nil || per2 != per || hi-lo != len(idx) || (len(idx) > 0 && idx[0] != lo) {
							t.Fatalf("%s: FIFOBins(%d, %d, %d) = [%d, %d) of %d, RankBins %v of %d (%v)", c.Name, len(bins), dp, r, lo, hi, per2, idx, per, err)
						}
					}
				}
			}
		}
	}
}

// TestBinsPerStepMatchesMegatron: the bins each rank runs per iteration
// are update_microbatch_calculator's (rl/testdata/packing_steps_golden.json,
// tools/golden/rl_packing.py), its float rounding included.
func TestBinsPerStepMatchesMegatron(t *testing.T) {
	raw, err := os.ReadFile("testdata/packing_steps_golden.json")
	if err != nil {
		t.Fatal(err)
	}
	var cases []struct {
		GlobalBatch int `json:"global_batch"`
		Rollouts    int `json:"rollouts"`
		BinsPerRank int `json:"bins_per_rank"`
		DP          int `json:"dp"`
		BinsPerStep int `json:"bins_per_step"`
	}
	if err := json.Unmarshal(raw, &cases); err != nil {
		t.Fatal(err)
	}
	if len(cases) == 0 {
		t.Fatal("no cases")
	}
	for _, c := range cases {
		if got := BinsPerStep(c.GlobalBatch, c.Rollouts, c.BinsPerRank); got != c.BinsPerStep {
			t.Errorf("BinsPerStep(%d, %d, %d) = %d, Megatron %d (dp %d)", c.GlobalBatch, c.Rollouts, c.BinsPerRank, got, c.BinsPerStep, c.DP)
		}
	}
}

func TestPackBinsErrors(t *testing.T) {
	for _, c := range []struct {
		lengths        []int
		bin, maxPerBin int
	}{{[]int{3}, 0, 1}, {[]int{3}, 4, 0}, {[]int{5}, 4, 2}, {[]int{-1}, 4, 2}} {
		if _, err := PackBins(c.lengths, c.bin, c.maxPerBin); err == nil {
			t.Errorf("PackBins(%v, %d, %d): no error", c.lengths, c.bin, c.maxPerBin)
		}
	}
	if _, _, _, err := FIFOBins(3, 2, 2); err == nil {
		t.Error("FIFOBins rank 2 of 2: no error")
	}
	if _, _, err := RankBins("sorted", 3, 2, 0); err == nil || !strings.Contains(err.Error(), "want fifo or round-robin") {
		t.Errorf("RankBins with an unknown algorithm: %v", err)
	}
	if _, _, err := RankBins(PackRoundRobin, 3, 2, -1); err == nil {
		t.Error("RankBins rank -1: no error")
	}
}

// TestPackedLossMatchesUnpacked: one collection's rollouts trained as
// packed bins (documents masked from each other, positions restarting)
// give the unpacked rows' GRPO loss and the same gradient of every
// weight, when both run the whole collection as one micro-batch (the loss
// is a mean over the micro-batch's loss tokens, so the same tokens in one
// micro-batch must give the same number).
func TestPackedLossMatchesUnpacked(t *testing.T) {
	c, m := testCollector(t, LossConfig{ClampEpsLower: 0.2, ClampEpsUpper: 0.28, KLBeta: 0.1, EntropyWeight: 0.05,
		ISCorrection: true, ISTruncation: 1.5}, func(cfg *Config) { cfg.GlobalBatchSize, cfg.MicroBatchSize, cfg.SeqLength = 6, 6, 256 })
	if err := c.Prepare(context.Background(), m, tensor.NewNoGradTape(nil), 0, 0); err != nil {
		t.Fatal(err)
	}
	seq := c.cfg.SeqLength
	// The tiny model's rollouts run to --seq-length; cut each a few
	// tokens into its response (as an EOD would end it) so they pack.
	for i := range c.rows {
		r := &c.rows[i]
		first := slices.Index(r.mask, 1)
		if first < 0 {
			t.Fatalf("rollout %d has no loss tokens", i)
		}
		n := min(first+5+3*i, seq)
		for p := n; p < seq; p++ {
			r.tokens[p] = c.pad
		}
		for p := n - 1; p < seq; p++ {
			r.mask[p] = 0
		}
	}
	bins, err := packRows(c.rows, seq, 50, c.pad)
	if err != nil {
		t.Fatal(err)
	}
	if len(bins) >= len(c.rows) {
		t.Fatalf("%d rollouts packed into %d bins: the fixture packs nothing", len(c.rows), len(bins))
	}
	run := func(rows []*row, positions, docIDs []int32) (float64, [][]float32) {
		b := len(rows)
		var toks, labels []int32
		for _, r := range rows {
			toks = append(toks, r.tokens...)
			labels = append(labels, r.tokens[1:]...)
			labels = append(labels, c.pad)
		}
		bt := gpt.Batch{Tokens: tensor.FromInt32(toks, b, seq), Labels: tensor.FromInt32(labels, b, seq)}
		if positions != nil {
			bt.Positions, bt.DocIDs = tensor.FromInt32(positions, b, seq), tensor.FromInt32(docIDs, b, seq)
		}
		for _, p := range m.Params() {
			p.Grad = nil
		}
		tp := tensor.NewTape()
		lp := tp.TokenLogProbs(tp.Reshape(m.Forward(tp, bt, nil, true), b*seq, m.Config.VocabSize), tp.Reshape(bt.Labels, b*seq))
		loss := tp.Apply(&grpoLoss{cfg: c.cfg.Loss, rows: rows, seq: seq}, lp)[0]
		if err := tp.Backward(loss); err != nil {
			t.Fatal(err)
		}
		var grads [][]float32
		for _, p := range m.Params() {
			grads = append(grads, slices.Clone(p.Grad.Float32s()))
		}
		return float64(loss.Float32s()[0]), grads
	}
	var unpacked []*row
	for i := range c.rows {
		unpacked = append(unpacked, &c.rows[i])
	}
	wantLoss, want := run(unpacked, nil, nil)
	var packed []*row
	var positions, docIDs []int32
	for i := range bins {
		packed = append(packed, &bins[i].row)
		positions, docIDs = append(positions, bins[i].positions...), append(docIDs, bins[i].docIDs...)
	}
	gotLoss, got := run(packed, positions, docIDs)
	if math.Abs(gotLoss-wantLoss) > 1e-5*math.Max(1, math.Abs(wantLoss)) {
		t.Fatalf("packed loss %g, unpacked %g", gotLoss, wantLoss)
	}
	for i := range want {
		for j := range want[i] {
			if d := math.Abs(float64(got[i][j] - want[i][j])); d > 1e-4*math.Max(1e-2, math.Abs(float64(want[i][j]))) {
				t.Fatalf("parameter %d element %d: packed gradient %g, unpacked %g", i, j, got[i][j], want[i][j])
			}
		}
	}
	t.Logf("%d rollouts in %d bins: loss %g (unpacked %g)", len(c.rows), len(bins), gotLoss, wantLoss)
}
