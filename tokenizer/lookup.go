package tokenizer

// TokenLookup is implemented by tokenizers that can look a token up by its
// string and decode without their special tokens, which Megatron's FIM data
// (GPTFIMDataset) needs: convert_tokens_to_ids for the FIM sentinels and
// ids_to_text(ids, remove_special_tokens=True). GPT2 and HuggingFace
// implement it.
type TokenLookup interface {
	// TokenID is the id of the vocabulary entry token (a token string, not
	// text to encode); ok is false when the vocabulary has no such entry.
	TokenID(token string) (id int, ok bool)
	// DecodeSkippingSpecials is Decode without the special tokens' ids
	// (Hugging Face's all_special_tokens): GPT-2's "<|endoftext|>", the
	// added tokens a tokenizer.json marks special.
	DecodeSkippingSpecials(ids []int) string
}

var (
	_ TokenLookup = (*GPT2)(nil)
	_ TokenLookup = (*HuggingFace)(nil)
)

// TokenID looks token up in vocab.json.
func (t *GPT2) TokenID(token string) (int, bool) {
	id, ok := t.vocab[token]
	return id, ok
}

// UnknownID is the id convert_tokens_to_ids gives a token the vocabulary
// lacks: GPT-2's unk_token, "<|endoftext|>".
func (t *GPT2) UnknownID() (int, bool) { return t.eod, true }

// DecodeSkippingSpecials decodes ids without "<|endoftext|>", GPT-2's only
// special token.
func (t *GPT2) DecodeSkippingSpecials(ids []int) string {
	kept := make([]int, 0, len(ids))
	for _, id := range ids {
		if id != t.eod {
			kept = append(kept, id)
		}
	}
	return t.Decode(kept)
}

// TokenID looks token up among the model's vocabulary and the added tokens.
func (t *HuggingFace) TokenID(token string) (int, bool) {
	for id, s := range t.idToTok {
		if s == token {
			return id, true
		}
	}
	return -1, false
}

// DecodeSkippingSpecials decodes ids without the added tokens marked
// special in tokenizer.json.
func (t *HuggingFace) DecodeSkippingSpecials(ids []int) string {
	kept := make([]int, 0, len(ids))
	for _, id := range ids {
		if !t.special[id] {
			kept = append(kept, id)
		}
	}
	return t.Decode(kept)
}
