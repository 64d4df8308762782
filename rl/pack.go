package rl

import (
	"errors"
	"fmt"
	"math"
	"slices"
)

// Sequence packing (--rl-use-sequence-packing) as Megatron's
// megatron/rl/sequence_packing_utils.py does it: the rollouts, trimmed of
// their trailing padding, are sorted longest first and laid one after the
// other into bins of --seq-length tokens (SequencePacker.pack_sequences);
// each document's positions restart at 0 and attention does not cross
// documents (its cu_seqlens; gotron's Batch.DocIDs). The bins are then
// dealt to the data-parallel ranks (distribute_packed_bins: contiguous
// runs with --rl-sequence-packing-algo fifo, every dp-th bin with
// round-robin), every rank running as many bins as the one with most.

// PackBins is SequencePacker.pack_sequences' bin assignment: the indices
// of the sequences of each bin. Sequences are taken longest first (a
// stable sort: equal lengths keep their order) and go into the current bin
// while it has room for them and holds fewer than maxPerBin; otherwise a
// new bin starts (next fit: an earlier bin is not revisited).
func PackBins(lengths []int, binSize, maxPerBin int) ([][]int, error) {
	if binSize <= 0 || maxPerBin <= 0 {
		return nil, fmt.Errorf("rl: sequence packing into bins of %d tokens, at most %d sequences each: want both > 0", binSize, maxPerBin)
	}
	order := make([]int, len(lengths))
	for i, n := range lengths {
		if n < 0 || n > binSize {
			return nil, fmt.Errorf("rl: sequence %d has %d tokens: a bin holds 0…%d (--seq-length)", i, n, binSize)
		}
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return lengths[b] - lengths[a] })
	var bins [][]int
	var cur []int
	used := 0
	for _, i := range order {
		if used+lengths[i] <= binSize && len(cur) < maxPerBin {
			cur = append(cur, i)
			used += lengths[i]
			continue
		}
		if len(cur) > 0 {
			bins = append(bins, cur)
		}
		cur, used = []int{i}, lengths[i]
	}
	if len(cur) > 0 {
		bins = append(bins, cur)
	}
	return bins, nil
}

// FIFOBins is distribute_packed_bins' "fifo" split of numBins bins over
// dp ranks: rank gets bins [lo, hi), the first numBins mod dp ranks one
// more than the rest, and every rank runs perRank bins (⌈numBins/dp⌉),
// the short ones padding with empty bins.
func FIFOBins(numBins, dp, rank int) (lo, hi, perRank int, err error) {
	if numBins < 0 || dp <= 0 || rank < 0 || rank >= dp {
		return 0, 0, 0, fmt.Errorf("rl: %d bins over %d data-parallel ranks, rank %d: want bins >= 0 and 0 <= rank < ranks", numBins, dp, rank)
	}
	per, extra := numBins/dp, numBins%dp
	if rank < extra {
		lo = rank * (per + 1)
		hi = lo + per + 1
	} else {
		lo = rank*per + extra
		hi = lo + per
	}
	return lo, hi, (numBins + dp - 1) / dp, nil
}

// Packing algorithms (--rl-sequence-packing-algo): how distribute_packed_bins
// deals the bins to the data-parallel ranks.
const (
	PackFIFO       = "fifo"        // contiguous runs (FIFOBins)
	PackRoundRobin = "round-robin" // rank r gets bins r, r+dp, r+2·dp, …
)

// RankBins is distribute_packed_bins: the bins (indices into the packer's,
// in order) data-parallel rank gets of numBins by algo, and perRank, the
// bins every rank runs (⌈numBins/dp⌉ for both algorithms), a rank with
// fewer padding with empty bins after its own.
func RankBins(algo string, numBins, dp, rank int) (bins []int, perRank int, err error) {
	lo, hi, perRank, err := FIFOBins(numBins, dp, rank)
	if err != nil {
		return nil, 0, err
	}
	switch algo {
	case PackFIFO:
		for b := lo; b < hi; b++ {
			bins = append(bins, b)
		}
	case PackRoundRobin:
		for b := rank; b < numBins; b += dp {
			bins = append(bins, b)
		}
	default:
		return nil, 0, fmt.Errorf("rl: --rl-sequence-packing-algo %q: want %s or %s", algo, PackFIFO, PackRoundRobin)
	}
	return bins, perRank, nil
}

// BinsPerStep is update_microbatch_calculator's bins per rank per
// iteration: ⌈(globalBatch / rolloutsPerCollection) × binsPerRank⌉,
// computed in float64 as Megatron's Python does (its ratio is a float:
// 9/11 × 77 is 63.00000000000001, and so 64 bins).
func BinsPerStep(globalBatch, rolloutsPerCollection, binsPerRank int) int {
	ratio := float64(globalBatch) / float64(rolloutsPerCollection)
	return int(math.Ceil(ratio * float64(binsPerRank)))
}

// packedBin is one bin as a training sample: its rows' per-position data
// laid out as the unpacked rows hold them, with each document's positions
// from 0 and its document number (attention stays within a document).
type packedBin struct {
	row
	positions, docIDs []int32
	// seqs are the rollouts in the bin, in order.
	seqs []int
}

// rolloutLength is get_actual_sequence_lengths: the position after the
// last token that is not padding (0 for a row of padding).
func rolloutLength(tokens []int32, pad int32) int {
	for t := len(tokens) - 1; t >= 0; t-- {
		if tokens[t] != pad {
			return t + 1
		}
	}
	return 0
}

// packRows packs rows (one collection's, padded to seq) into bins of seq
// tokens. Within a document a position holds what the unpacked row holds
// there (the token, the loss mask of the next token, the old, reference
// and inference log-probabilities of the next token, the rollout's
// advantage): the last position of a document predicts the next
// document's first token, a prompt token, whose loss mask is 0 as
// Megatron's packed loss mask (the generation mask) is. The bin's tail is
// padding at position 0, one more document (Megatron's trailing
// cu_seqlens slot).
func packRows(rows []row, seq, maxPerBin int, pad int32) ([]packedBin, error) {
	lengths := make([]int, len(rows))
	for i, r := range rows {
		if len(r.tokens) != seq || len(r.mask) != seq || len(r.old) != seq || len(r.ref) != seq || len(r.inference) != seq {
			return nil, errors.New("rl: packing: a rollout's rows are not --seq-length long (another data-parallel rank's rollout?)")
		}
		lengths[i] = rolloutLength(r.tokens, pad)
	}
	assign, err := PackBins(lengths, seq, maxPerBin)
	if err != nil {
		return nil, err
	}
	bins := make([]packedBin, len(assign))
	for b, seqs := range assign {
		pb := packedBin{seqs: seqs, positions: make([]int32, seq), docIDs: make([]int32, seq),
			row: row{tokens: make([]int32, seq), mask: make([]float32, seq), old: make([]float64, seq), ref: make([]float64, seq),
				inference: make([]float64, seq), advantages: make([]float64, seq)}}
		at := 0
		for d, i := range seqs {
			r, n := rows[i], lengths[i]
			copy(pb.tokens[at:], r.tokens[:n])
			copy(pb.mask[at:], r.mask[:n])
			copy(pb.old[at:], r.old[:n])
			copy(pb.ref[at:], r.ref[:n])
			copy(pb.inference[at:], r.inference[:n])
			for t := range n {
				pb.advantages[at+t] = r.advantage
				pb.positions[at+t] = int32(t)
				pb.docIDs[at+t] = int32(d)
			}
			if n > 0 {
				pb.mask[at+n-1] = 0 // predicts the next document's first token
			}
			at += n
		}
		for t := at; t < seq; t++ {
			pb.tokens[t] = pad
			pb.docIDs[t] = int32(len(seqs))
		}
		bins[b] = pb
	}
	return bins, nil
}

// emptyBin is create_empty_bins' bin: padding at position 0 with no loss
// token, which a rank with fewer bins runs so that every rank runs as many
// micro-batches (its loss is 0 over train_rl.loss_func's one token).
func emptyBin(seq int, pad int32) packedBin {
	b := packedBin{positions: make([]int32, seq), docIDs: make([]int32, seq),
		row: row{tokens: make([]int32, seq), mask: make([]float32, seq), old: make([]float64, seq), ref: make([]float64, seq),
			inference: make([]float64, seq), advantages: make([]float64, seq)}}
	for t := range b.tokens {
		b.tokens[t] = pad
	}
	return b
}
