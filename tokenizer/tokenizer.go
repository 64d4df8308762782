// Package tokenizer turns text into token ids and back, with the tokenizers
// Megatron-LM users bring: GPT-2 BPE (vocab.json + merges.txt), SentencePiece
// and Llama-2 (.model), Hugging Face tokenizer.json, TikToken JSON vocabularies
// and the null tokenizer.
package tokenizer

// Tokenizer encodes text to ids and decodes ids to text.
type Tokenizer interface {
	// Encode returns the ids of text, without special tokens (no BOS/EOD).
	Encode(text string) []int
	// Decode returns the text of ids.
	Decode(ids []int) string
	// VocabSize is the number of ids the tokenizer can produce (before
	// Megatron's padding, see PaddedVocabSize).
	VocabSize() int
	// EOD is the end-of-document id appended by preprocessing (--append-eod).
	EOD() int
}
