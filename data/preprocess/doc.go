// Package preprocess turns JSONL text into Megatron .bin/.idx datasets, as
// Megatron-LM's tools/preprocess_data.py: one document per JSON line and
// key, token ids from a tokenizer.Tokenizer, uint16 tokens when the
// vocabulary has fewer than 65500 ids (else int32), an optional EOD per
// document, optional sentence splitting (one sequence per sentence) and
// partitions merged with add_index. The output is byte-identical to
// Megatron's for the same input and tokenizer.
//
// Workers goroutines tokenize batches of lines in parallel; a single writer
// appends documents in input order, so the result does not depend on the
// number of workers.
package preprocess
