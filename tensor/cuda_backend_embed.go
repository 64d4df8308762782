package tensor

// The CUDA backend's embedding lookups: internal/cuda/kernels' embed.cu.
// The backward kernels add with atomics (ids repeat), so a repeated row's
// gradient matches the CPU's serial sum within rounding, not bit for bit.

// EmbeddingForward gathers table (rows, c) rows by the int32 ids into out.
func (be cudaBackend) EmbeddingForward(out, table, ids *Tensor) {
	be.embedding("embed_fwd_f32", out, table, ids, table, 0)
}

// EmbeddingBackward adds dout's rows into dtable at the ids.
func (be cudaBackend) EmbeddingBackward(dtable, dout, ids *Tensor) {
	be.embedding("embed_bwd_f32", dtable, dout, ids, dtable, 0)
}

// VocabEmbeddingForward overwrites out: a row of table for ids in
// [start, start+rows), zeros for the others.
func (be cudaBackend) VocabEmbeddingForward(out, table, ids *Tensor, start int) {
	be.embedding("embed_fwd_f32", out, table, ids, table, start)
}

// VocabEmbeddingBackward overwrites dtable (as the CPU, which clears it
// first) with the sums of dout's rows whose ids fall in its range.
func (be cudaBackend) VocabEmbeddingBackward(dtable, dout, ids *Tensor, start int) {
	be.Fill(dtable, 0)
	be.embedding("embed_bwd_f32", dtable, dout, ids, dtable, start)
}

// embedding launches embed.cu's kernel (dst, src, ids, ...) over
// len(ids)·c elements, c the width of table (rows, c): src for the
// forward kernels, dst for the backward ones.
func (be cudaBackend) embedding(kernel string, dst, src, ids, table *Tensor, start int) {
	c := table.Dim(-1)
	rows := 0
	if c > 0 {
		rows = table.Numel() / c
	}
	total := ids.Numel() * c
	be.launch1D(kernel, total, be.ptr(dst), be.ptr(src), be.ptr(ids), int64(total), int64(c), int64(start), int64(rows))
}
