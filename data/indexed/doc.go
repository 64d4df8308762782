// Package indexed reads and writes Megatron-LM's IndexedDataset: a .bin file
// of raw token ids and an .idx file describing sequences and documents
// (megatron/core/datasets/indexed_dataset.py).
//
// Open memory-maps both files (golang.org/x/sys/unix) and validates them;
// reads decode tokens straight from the mapping. Builder writes files
// byte-identical to Megatron's IndexedDatasetBuilder, including multi-sequence
// documents (one sequence per sentence), empty documents, multimodal sequence
// modes and AddIndex (add_index) to append a finished dataset. A corrupt or
// truncated file is reported as a *FormatError naming the file, the byte
// offset and what was expected there.
package indexed
