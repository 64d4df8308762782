// Package gpt builds Megatron-LM's GPT training data from .bin/.idx
// datasets: GPTDataset (document, sample and shuffle indices) and
// BlendedDataset (weighted, unweighted and exhaustive blends), bit-exact with
// Megatron (megatron/core/datasets/gpt_dataset.py, blended_dataset.py,
// blended_megatron_dataset_builder.py and helpers.cpp).
//
// Build takes a Config (the --data-path/--split/--seq-length/--seed/... flags
// as typed fields) and returns the train, valid and test datasets. Each is a
// Source: Len and Sample(i), where a Sample holds SeqLength tokens, labels,
// loss mask, position ids and, with --reset-attention-mask, per-token
// document ids for the attention kernel's document mask. Which samples a
// data-parallel rank reads (Megatron's 'single' MegatronPretrainingSampler)
// is package train's: micro-step i of a step from consumed samples c takes
// the mbs·DP ids from c + i·mbs·DP, rank r the r-th mbs of them.
//
// The indices equal Megatron's element for element: the split book-ends
// round half to even, numpy's RandomState(seed).shuffle is reproduced by
// internal/nprand, the final epoch is shuffled separately when it is less
// than 80% full, and helpers.cpp's sample and blending indices are ported
// line by line. They are cached under --data-cache-path (default
// <prefix>/cache/GPTDataset_indices) in Megatron's .npy files and file names,
// <md5 of the description>-GPTDataset-<split>-{description.txt,
// document_index.npy, sample_index.npy, shuffle_index.npy}. A cache entry is
// used only if its description matches byte for byte and its arrays are
// consistent with the dataset (shape, epochs and bounds); otherwise it is
// rebuilt and overwritten, so a rewritten dataset never reads a stale cache.
//
// Building the indices of 10⁹ tokens takes well under a second and ~80 MB
// (BenchmarkBuildIndices).
package gpt
