package gpt

// PadID is the token id GPTDataset pads a short sample with. gotron's
// tokenizers expose no pad token, so it is Megatron's fallback _PAD_TOKEN_ID,
// −1, which never collides with a real id. Padded positions get token and
// label 0 and loss mask 0.
const PadID = -1

// Sample is one training example of SeqLength tokens.
type Sample struct {
	// Tokens are the input ids, Labels the ids to predict (Tokens shifted by
	// one). Both have SeqLength entries.
	Tokens, Labels []int32
	// LossMask is 1 where the label counts toward the loss: 0 at EOD tokens
	// with --eod-mask-loss and at padding.
	LossMask []float32
	// PositionIDs are 0…L−1, restarted after every EOD token with
	// --reset-position-ids.
	PositionIDs []int32
	// DocIDs is set only with --reset-attention-mask: DocIDs[t] is the number
	// of EOD tokens before position t, so query q may attend to key k iff
	// k ≤ q and DocIDs[k] == DocIDs[q] — exactly Megatron's attention mask
	// blocked across EOD boundaries. Nil means a plain causal mask.
	DocIDs []int32
	// DatasetID is the blended dataset the sample came from (0 without
	// blending).
	DatasetID int
}

// MaskOptions are the per-sample flags of _get_ltor_masks_and_position_ids.
// The zero value is Megatron's default (all off).
type MaskOptions struct {
	ResetPositionIDs   bool // --reset-position-ids
	ResetAttentionMask bool // --reset-attention-mask
	EODMaskLoss        bool // --eod-mask-loss
}

// makeSample turns the L+x token ids of text (already padded with PadID)
// into a Sample, as GPTDataset.__getitem__ does.
func makeSample(text []int32, seqLength, extra int, eod int32, opt MaskOptions) Sample {
	L := seqLength
	s := Sample{
		Tokens:      make([]int32, L),
		Labels:      make([]int32, L),
		LossMask:    make([]float32, L),
		PositionIDs: make([]int32, L),
	}
	copy(s.Tokens, text[:L])
	if extra == 1 {
		copy(s.Labels, text[1:L+1])
	} else {
		copy(s.Labels, text[1:L])
		s.Labels[L-1] = PadID
	}
	if opt.ResetAttentionMask {
		s.DocIDs = make([]int32, L)
	}
	pos, doc := int32(0), int32(0)
	for t, tok := range s.Tokens {
		s.LossMask[t] = 1
		if opt.EODMaskLoss && tok == eod {
			s.LossMask[t] = 0
		}
		s.PositionIDs[t] = pos
		pos++
		if s.DocIDs != nil {
			s.DocIDs[t] = doc
		}
		if tok == eod {
			if opt.ResetPositionIDs {
				pos = 0
			}
			doc++
		}
	}
	for t := range s.Tokens {
		if s.Labels[t] == PadID {
			s.LossMask[t] = 0
			s.Labels[t] = 0
		}
		if s.Tokens[t] == PadID {
			s.Tokens[t] = 0
		}
	}
	return s
}
