// Package safetensors reads and writes the Hugging Face safetensors format
// and its sharded form (model.safetensors.index.json).
//
// A file is an 8-byte little-endian header length N, N bytes of JSON, then
// the data section:
//
//	{"__metadata__":{"format":"pt"},
//	 "w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}, ...}
//
// data_offsets are relative to the data section; tensors are row-major and
// little-endian. Open maps a file read-only (zero-copy tensor views);
// ReadFile and Parse work on bytes in memory. Every header is validated
// before use: bad JSON, duplicate names, unknown dtypes, sizes that do not
// match dtype × shape, offsets that overlap, leave gaps or run past the end
// are all a *FormatError naming the file and the tensor.
//
// Encode and WriteFile produce the same bytes as the upstream library; see
// Encode for the ordering rules. WriteSharded splits a state dict into
// model-00001-of-0000N.safetensors shards with huggingface_hub's algorithm
// and writes the index; OpenDir opens either layout.
package safetensors
