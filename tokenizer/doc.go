// Package tokenizer turns text into token ids and back with the tokenizers
// Megatron-LM users bring, selected by Megatron's --tokenizer-type names:
//
//	tok, err := tokenizer.New(tokenizer.Config{
//		Type:      tokenizer.TypeGPT2BPE, // --tokenizer-type GPT2BPETokenizer
//		VocabFile: "vocab.json",          // --vocab-file
//		MergeFile: "merges.txt",          // --merge-file
//	})
//	ids := tokenizer.Tokenize(tok, text) // what preprocess_data.py writes
//	ids = append(ids, tok.EOD())         // --append-eod
//	padded := tokenizer.PaddedVocabSize(tok.VocabSize(), 128, tp)
//
// Every tokenizer implements Tokenizer (Encode, Decode, VocabSize, EOD);
// most also implement Specials (BOS, EOS, Pad). Encode never adds special
// tokens; Tokenize adds the ones Megatron's tokenize adds (Llama2Tokenizer's
// BOS; HuggingFaceTokenizer's post-processor tokens). All are safe for
// concurrent use; BPE tokenizers memoise words in a bounded cache.
//
// # What is exact against what
//
// Checked by the tests on a 200 KB multilingual corpus (English, code,
// Chinese, Japanese, Korean, Russian, Arabic, Hindi, Greek, Thai,
// Vietnamese, decomposed and compatibility characters, emoji, whitespace
// runs, numbers, contractions) whose reference ids are committed
// in testdata (tools/tokfixtures/generate.sh regenerates them):
//
//   - GPT2BPETokenizer (GPT2): byte-level BPE over the user's vocab.json and
//     merges.txt with a hand-written GPT-2 pre-tokenizer (no regexp). Ids equal
//     the reference JS gpt-3-encoder (OpenAI's encoder.py port) on 112,040
//     tokens and tiktoken's r50k_base on edge cases. "<|endoftext|>" in the
//     text encodes to EOD, as Hugging Face's GPT2Tokenizer that Megatron wraps.
//   - SentencePieceTokenizer, GPTSentencePieceTokenizer, Llama2Tokenizer
//     (SentencePiece, MegatronSentencePiece, Llama2): a .model file parsed
//     with protowire; BPE and unigram; the precompiled normalisation map
//     (nmt_nfkc, nfkc, ...) or identity; add_dummy_prefix,
//     remove_extra_whitespaces, escape_whitespaces,
//     treat_whitespace_as_suffix; user-defined symbols; byte fallback; unknown
//     runs merged into one <unk>. Ids equal spm_encode (sentencepiece
//     0.1.97) line by line on 4 models (Llama-2-like BPE with byte fallback,
//     nmt_nfkc unigram, nmt_nfkc BPE with <unk>, unigram with byte fallback):
//     65k–95k tokens each. The Megatron wrappers follow
//     megatron/training/tokenizer: SentencePieceTokenizer appends <CLS>,
//     <SEP>, <EOD>, <MASK>, <PAD> (and --vocab-extra-ids) and uses <EOD>;
//     GPTSentencePieceTokenizer and Llama2Tokenizer use the model's eos.
//   - HuggingFaceTokenizer (HuggingFace): tokenizer.json with byte-level BPE
//     (GPT-2 and Llama-3 split patterns hand-written, other Split patterns
//     through regexp2), ignore_merges, character BPE with byte fallback and
//     fuse_unk (Llama-2 conversions), WordPiece (BERT), NFC/NFD/NFKC/NFKD
//     and BERT normalizers. Ids equal Hugging Face's tokenizers.js on six
//     tokenizer.json fixtures (GPT-2; Llama-3 style, plain and after NFKC;
//     Llama-2 style; BERT cased and uncased), 40k–114k tokens each. Unigram
//     models are rejected with an error; added tokens' lstrip/rstrip flags
//     are not applied.
//   - Unicode normalization (used by the above): tables generated from
//     Python's unicodedata (Unicode 14.0); NFC/NFD/NFKC/NFKD equal it on
//     every decomposable code point.
//   - TikTokenizer (TikToken): Megatron's JSON vocabulary, ids shifted by
//     --tiktoken-num-special-tokens, EOD "</s>". The BPE equals tiktoken's
//     (via tiktoken-go's cl100k_base ranks) on the corpus; patterns v1 and
//     v2 are hand-written.
//   - NullTokenizer (Null): whitespace-separated ids, EOD = --vocab-size − 1
//     (Megatron HEAD).
//
// TrainGPT2BPE fits a byte-level BPE vocabulary to a corpus (GPT-2's
// pre-tokenizer, the most frequent pair merged first) and writes it as a
// GPT2BPETokenizer's vocab.json and merges.txt: the quickstart's 4096-token
// vocabulary for Go source is made this way.
//
// The hand-written pre-tokenizers equal their reference regular expressions
// run by regexp2's interpreter on the corpus and under fuzzing. Character
// classes follow Go's unicode tables (\s is White_Space, as Python's regex
// module; the JS reference's \s also holds U+FEFF, so the two differ there).
//
// Decode is lossless for byte-level tokenizers (it returns the raw bytes,
// which may be invalid UTF-8 when ids cut a character) and for SentencePiece
// models with an identity normaliser, byte fallback and no whitespace
// removal (Llama-2's settings), except that "▁" in the input decodes to a
// space.
package tokenizer
