package gpt

import (
	"fmt"
	"math"

	"github.com/gotron/gotron/internal/nprand"
)

// AllSamples as a requested sample count means Megatron's num_samples=None:
// one epoch, as many samples as it holds.
const AllSamples int64 = -1

// IndexParams are the inputs of one GPTDataset's index construction
// (Megatron's megatron/core/datasets/gpt_dataset.py,
// _build_document_sample_shuffle_indices). The zero value is not usable:
// set SeqLength.
type IndexParams struct {
	// NumSamples is the requested sample count, or AllSamples.
	NumSamples int64
	// SeqLength is L, --seq-length (> 1).
	SeqLength int
	// ExtraToken is x, 1 when add_extra_token_to_sequence (Megatron's
	// default) else 0.
	ExtraToken int
	// Seed seeds numpy's RandomState (--seed).
	Seed uint32
	// DropLast drops the final partial sample (always true for train and
	// test; for valid unless drop_last_partial_validation_sequence=False).
	DropLast bool
}

// Indices are the three index arrays of a GPTDataset.
type Indices struct {
	// DocumentIndex lists sequence ids, epoch after epoch, shuffled.
	DocumentIndex []int32
	// SampleIndex has S+1 rows (position in DocumentIndex, token offset),
	// flattened: row j is SampleIndex[2j], SampleIndex[2j+1]. Megatron stores
	// it as int32 unless a value exceeds 2³¹−1 (then int64); we keep int64.
	SampleIndex []int64
	// ShuffleIndex is a permutation of [0, S) (two when the final epoch is
	// separate).
	ShuffleIndex []int64
	// Epochs is E (_get_num_epochs) and SeparateFinalEpoch the
	// separate_final_epoch decision of _build_document_sample_shuffle_indices.
	Epochs             int
	SeparateFinalEpoch bool
}

// NumSamples returns S, the dataset length.
func (x *Indices) NumSamples() int { return len(x.SampleIndex)/2 - 1 }

// NumEpochs returns the smallest E ≥ 1 with E·tpe ≥ n·L + x (1 for AllSamples).
func NumEpochs(tokensPerEpoch, n int64, seqLength, extra int) int {
	if n == AllSamples {
		return 1
	}
	need := n*int64(seqLength) + int64(extra)
	if tokensPerEpoch <= 0 || need <= tokensPerEpoch {
		return 1
	}
	return int((need + tokensPerEpoch - 1) / tokensPerEpoch) // Megatron's loop, in closed form
}

// maxDocumentIndex bounds E·|indices|, the document index length, so an
// absurd request is an error rather than an out-of-memory crash.
const maxDocumentIndex = 1 << 34

// BuildIndices builds the document, sample and shuffle indices exactly as
// Megatron's _build_document_sample_shuffle_indices and helpers.cpp
// build_sample_idx. sizes are the global sequence lengths, indices the
// split's sequence ids.
func BuildIndices(sizes []int32, indices []int32, p IndexParams) (*Indices, error) {
	if p.SeqLength < 2 {
		return nil, fmt.Errorf("gpt: --seq-length must be > 1, got %d", p.SeqLength)
	}
	if p.ExtraToken != 0 && p.ExtraToken != 1 {
		return nil, fmt.Errorf("gpt: extra token must be 0 or 1, got %d", p.ExtraToken)
	}
	if p.NumSamples < 0 && p.NumSamples != AllSamples {
		return nil, fmt.Errorf("gpt: requested %d samples", p.NumSamples)
	}
	var tpe int64
	for _, i := range indices {
		if int(i) < 0 || int(i) >= len(sizes) {
			return nil, fmt.Errorf("gpt: sequence id %d outside the dataset's %d sequences", i, len(sizes))
		}
		tpe += int64(sizes[i])
	}
	if tpe <= 1 {
		return nil, fmt.Errorf("gpt: the split has %d tokens in %d sequences; need at least 2", tpe, len(indices))
	}
	if p.NumSamples != AllSamples && p.NumSamples > (math.MaxInt64-1)/int64(p.SeqLength) {
		return nil, fmt.Errorf("gpt: %d samples of %d tokens overflow a token count", p.NumSamples, p.SeqLength)
	}
	if e := NumEpochs(tpe, p.NumSamples, p.SeqLength, p.ExtraToken); int64(e)*int64(len(indices)) > maxDocumentIndex {
		return nil, fmt.Errorf("gpt: %d samples of %d tokens need %d epochs of a %d-token split (%d sequences): the document index would have %d entries",
			p.NumSamples, p.SeqLength, e, tpe, len(indices), int64(e)*int64(len(indices)))
	}
	out := &Indices{}
	var err error
	var sans int64
	if out.Epochs, out.SeparateFinalEpoch, sans, err = epochPlan(tpe, p); err != nil {
		return nil, err
	}
	rng := nprand.New(p.Seed)
	if out.SeparateFinalEpoch {
		first := tileShuffle(indices, out.Epochs-1, rng)
		out.DocumentIndex = append(first, tileShuffle(indices, 1, rng)...)
	} else {
		out.DocumentIndex = tileShuffle(indices, out.Epochs, rng)
	}
	if out.SampleIndex, err = buildSampleIndex(sizes, out.DocumentIndex, p, int64(out.Epochs)*tpe); err != nil {
		return nil, err
	}
	s := int64(out.NumSamples())
	if out.SeparateFinalEpoch {
		out.ShuffleIndex = shuffledRange(0, sans, rng)
		out.ShuffleIndex = append(out.ShuffleIndex, shuffledRange(sans, s, rng)...)
	} else {
		out.ShuffleIndex = shuffledRange(0, s, rng)
	}
	return out, nil
}

// epochPlan is gpt_dataset.py's _get_num_epochs and separate_final_epoch
// decision: the number of epochs, whether the final
// epoch is shuffled separately, and the sample count without it.
func epochPlan(tpe int64, p IndexParams) (epochs int, separate bool, sans int64, err error) {
	L, x := int64(p.SeqLength), int64(p.ExtraToken)
	epochs = NumEpochs(tpe, p.NumSamples, p.SeqLength, p.ExtraToken)
	if epochs == 1 {
		return epochs, false, 0, nil
	}
	E := int64(epochs)
	sans = ((E-1)*tpe - x) / L
	fromFinal := p.NumSamples - sans
	perEpoch := (tpe - x) / L
	if fromFinal < 0 || fromFinal > perEpoch+1 {
		return 0, false, 0, fmt.Errorf("gpt: internal: %d samples from the final epoch, want 0..%d", fromFinal, perEpoch+1)
	}
	// int(0.80 * per_epoch): float multiply, truncate toward zero.
	return epochs, fromFinal < int64(0.80*float64(perEpoch)), sans, nil
}

// tileShuffle is _build_document_index without a separate final epoch:
// epochs copies of indices, then one shuffle of the whole array.
func tileShuffle(indices []int32, epochs int, rng *nprand.MT19937) []int32 {
	out := make([]int32, 0, epochs*len(indices))
	for range epochs {
		out = append(out, indices...)
	}
	nprand.Shuffle(rng, out)
	return out
}

// shuffledRange is numpy.arange(lo, hi) shuffled.
func shuffledRange(lo, hi int64, rng *nprand.MT19937) []int64 {
	out := make([]int64, 0, max(hi-lo, 0))
	for v := lo; v < hi; v++ {
		out = append(out, v)
	}
	nprand.Shuffle(rng, out)
	return out
}

// buildSampleIndex is Megatron's build_sample_idx
// (megatron/core/datasets/helpers.cpp).
func buildSampleIndex(sizes []int32, docIndex []int32, p IndexParams, totalTokens int64) ([]int64, error) {
	L, x := int64(p.SeqLength), int64(p.ExtraToken)
	var n int64
	if p.DropLast {
		n = (totalTokens - x) / L
	} else {
		// Single precision, like the C++ ceil(float(...) / seq_length).
		n = int64(math.Ceil(float64(float32(totalTokens-x) / float32(L))))
	}
	out := make([]int64, 2, 2*(n+1))
	di, off := int64(0), int64(0)
	last := int64(len(docIndex) - 1)
	for j := int64(1); j <= n; j++ {
		need := L + x
		for need != 0 {
			l := int64(sizes[docIndex[di]]) - off
			need -= l
			if need <= 0 {
				off += need + l - x
				need = 0
			} else if di == last {
				if j != n {
					return nil, fmt.Errorf("gpt: internal: document index exhausted at sample %d of %d", j, n)
				}
				off = int64(sizes[docIndex[di]]) - x
				break
			} else {
				di++
				off = 0
			}
		}
		out = append(out, di, off)
	}
	return out, nil
}
