package tensor

// cudaMissing gives cudaBackend every Backend method not yet written for the
// GPU: each panics naming itself, so a program that reaches one on --device
// cuda stops with a clear message instead of computing wrong. A method
// written on cudaBackend (tensor/cuda_backend_*.go) shadows the one here.
type cudaMissing struct{}

func (cudaMissing) Gemm(_ MatmulPrecision, _ Transpose, _ Transpose, _ float32, _ *Tensor, _ *Tensor, _ float32, _ *Tensor) {
	panic(cudaNotWritten("Gemm"))
}

func (cudaMissing) LayerNormForward(_ *Tensor, _ *Tensor, _ *Tensor, _ *Tensor, _ *Tensor, _ *Tensor, _ float32) {
	panic(cudaNotWritten("LayerNormForward"))
}

func (cudaMissing) LayerNormBackward(_ *Tensor, _ *Tensor, _ *Tensor, _ *Tensor, _ *Tensor, _ *Tensor, _ *Tensor, _ *Tensor) {
	panic(cudaNotWritten("LayerNormBackward"))
}

func (cudaMissing) RMSNormForward(_ *Tensor, _ *Tensor, _ *Tensor, _ *Tensor, _ float32) {
	panic(cudaNotWritten("RMSNormForward"))
}

func (cudaMissing) RMSNormBackward(_ *Tensor, _ *Tensor, _ *Tensor, _ *Tensor, _ *Tensor, _ *Tensor) {
	panic(cudaNotWritten("RMSNormBackward"))
}

func (cudaMissing) GELUForward(_ *Tensor, _ *Tensor, _ bool) {
	panic(cudaNotWritten("GELUForward"))
}

func (cudaMissing) GELUBackward(_ *Tensor, _ *Tensor, _ *Tensor, _ bool) {
	panic(cudaNotWritten("GELUBackward"))
}

func (cudaMissing) SiLUForward(_ *Tensor, _ *Tensor) {
	panic(cudaNotWritten("SiLUForward"))
}

func (cudaMissing) SiLUBackward(_ *Tensor, _ *Tensor, _ *Tensor) {
	panic(cudaNotWritten("SiLUBackward"))
}

func (cudaMissing) SwiGLUForward(_ *Tensor, _ *Tensor) {
	panic(cudaNotWritten("SwiGLUForward"))
}

func (cudaMissing) SwiGLUBackward(_ *Tensor, _ *Tensor, _ *Tensor) {
	panic(cudaNotWritten("SwiGLUBackward"))
}

func (cudaMissing) SoftmaxForward(_ *Tensor, _ *Tensor) {
	panic(cudaNotWritten("SoftmaxForward"))
}

func (cudaMissing) SoftmaxBackward(_ *Tensor, _ *Tensor, _ *Tensor) {
	panic(cudaNotWritten("SoftmaxBackward"))
}

func (cudaMissing) RoPEForward(_ *RoPE, _ *Tensor, _ *Tensor, _ *Tensor) {
	panic(cudaNotWritten("RoPEForward"))
}

func (cudaMissing) RoPEBackward(_ *RoPE, _ *Tensor, _ *Tensor, _ *Tensor) {
	panic(cudaNotWritten("RoPEBackward"))
}

func (cudaMissing) AttentionForward(_ *Tensor, _ *Tensor, _ *Tensor, _ *Tensor, _ *Tensor, _ AttentionConfig) {
	panic(cudaNotWritten("AttentionForward"))
}

func (cudaMissing) AttentionBackward(_ *Tensor, _ *Tensor, _ *Tensor, _ *Tensor, _ *Tensor, _ *Tensor, _ *Tensor, _ *Tensor, _ *Tensor, _ AttentionConfig) {
	panic(cudaNotWritten("AttentionBackward"))
}

func (cudaMissing) CrossEntropyForward(_ *Tensor, _ *Tensor, _ *Tensor, _ *Tensor, _ CrossEntropyConfig) {
	panic(cudaNotWritten("CrossEntropyForward"))
}

func (cudaMissing) CrossEntropyBackward(_ *Tensor, _ *Tensor, _ *Tensor, _ *Tensor, _ *Tensor, _ CrossEntropyConfig) {
	panic(cudaNotWritten("CrossEntropyBackward"))
}

func (cudaMissing) EmbeddingForward(_ *Tensor, _ *Tensor, _ *Tensor) {
	panic(cudaNotWritten("EmbeddingForward"))
}

func (cudaMissing) EmbeddingBackward(_ *Tensor, _ *Tensor, _ *Tensor) {
	panic(cudaNotWritten("EmbeddingBackward"))
}

func (cudaMissing) Add(_ *Tensor, _ *Tensor, _ *Tensor) {
	panic(cudaNotWritten("Add"))
}

func (cudaMissing) Mul(_ *Tensor, _ *Tensor, _ *Tensor) {
	panic(cudaNotWritten("Mul"))
}

func (cudaMissing) Axpy(_ *Tensor, _ float32, _ *Tensor) {
	panic(cudaNotWritten("Axpy"))
}

func (cudaMissing) Scale(_ *Tensor, _ float32, _ *Tensor) {
	panic(cudaNotWritten("Scale"))
}

func (cudaMissing) SumRows(_ *Tensor, _ *Tensor) {
	panic(cudaNotWritten("SumRows"))
}

func (cudaMissing) AllocCommitted(_ DType, _ []int) *Tensor {
	panic(cudaNotWritten("AllocCommitted"))
}

func (cudaMissing) PagedKVWrite(_ *Tensor, _ *Tensor, _ *Tensor, _ *Tensor, _ *Tensor) {
	panic(cudaNotWritten("PagedKVWrite"))
}

func (cudaMissing) PagedAttention(_ *Tensor, _ *Tensor, _ *Tensor, _ *Tensor, _ PagedAttentionConfig) {
	panic(cudaNotWritten("PagedAttention"))
}

func (cudaMissing) PackWeight(_ *Tensor, _ DType) *PackedWeight {
	panic(cudaNotWritten("PackWeight"))
}

func (cudaMissing) PackedLinear(_ *Tensor, _ *Tensor, _ *PackedWeight, _ *Tensor) {
	panic(cudaNotWritten("PackedLinear"))
}

func (cudaMissing) SampleTokens(_ SampledTokens, _ *Tensor, _ int, _ []TokenSampling) {
	panic(cudaNotWritten("SampleTokens"))
}

func (cudaMissing) TokenLogprobs(_ *Tensor, _ *Tensor, _ *Tensor, _ int) {
	panic(cudaNotWritten("TokenLogprobs"))
}

func (cudaMissing) AdamW(_ *TensorList, _ *TensorList, _ *TensorList, _ *TensorList, _ []AdamWCoeffs) {
	panic(cudaNotWritten("AdamW"))
}

func (cudaMissing) SGD(_ *TensorList, _ *TensorList, _ *TensorList, _ []SGDCoeffs) {
	panic(cudaNotWritten("SGD"))
}

func (cudaMissing) ScaleList(_ *TensorList, _ float32) {
	panic(cudaNotWritten("ScaleList"))
}

func (cudaMissing) SumSquares(_ *TensorList) float64 {
	panic(cudaNotWritten("SumSquares"))
}

func (cudaMissing) MaxAbs(_ *TensorList) float64 {
	panic(cudaNotWritten("MaxAbs"))
}

func (cudaMissing) NonFinite(_ *TensorList) bool {
	panic(cudaNotWritten("NonFinite"))
}

func (cudaMissing) VocabEmbeddingForward(_ *Tensor, _ *Tensor, _ *Tensor, _ int) {
	panic(cudaNotWritten("VocabEmbeddingForward"))
}

func (cudaMissing) VocabEmbeddingBackward(_ *Tensor, _ *Tensor, _ *Tensor, _ int) {
	panic(cudaNotWritten("VocabEmbeddingBackward"))
}

func (cudaMissing) RowMax(_ *Tensor, _ *Tensor) {
	panic(cudaNotWritten("RowMax"))
}

func (cudaMissing) VocabCrossEntropyPartials(_ *Tensor, _ *Tensor, _ *Tensor, _ *Tensor, _ int) {
	panic(cudaNotWritten("VocabCrossEntropyPartials"))
}

func (cudaMissing) VocabCrossEntropyLoss(_ *Tensor, _ *Tensor, _ *Tensor, _ *Tensor, _ *Tensor) float64 {
	panic(cudaNotWritten("VocabCrossEntropyLoss"))
}

func (cudaMissing) VocabCrossEntropyBackward(_ *Tensor, _ *Tensor, _ *Tensor, _ *Tensor, _ *Tensor, _ *Tensor, _ float64, _ int) {
	panic(cudaNotWritten("VocabCrossEntropyBackward"))
}

func (cudaMissing) Fill(_ *Tensor, _ float32) {
	panic(cudaNotWritten("Fill"))
}

func (cudaMissing) CopyStrided(_ *Tensor, _ *Tensor) {
	panic(cudaNotWritten("CopyStrided"))
}

func (cudaMissing) ScatterAddStrided(_ *Tensor, _ *Tensor, _ *Tensor) {
	panic(cudaNotWritten("ScatterAddStrided"))
}

func (cudaMissing) SumAll(_ *Tensor, _ *Tensor) {
	panic(cudaNotWritten("SumAll"))
}

func (cudaMissing) RowSum(_ *Tensor, _ *Tensor) {
	panic(cudaNotWritten("RowSum"))
}

func (cudaMissing) RowArgMax(_ *Tensor, _ *Tensor, _ *Tensor) {
	panic(cudaNotWritten("RowArgMax"))
}

func (cudaMissing) AddRowBroadcast(_ *Tensor, _ *Tensor) {
	panic(cudaNotWritten("AddRowBroadcast"))
}

func (cudaMissing) AddAtRowIndex(_ *Tensor, _ *Tensor, _ *Tensor) {
	panic(cudaNotWritten("AddAtRowIndex"))
}

func (cudaMissing) DropoutMask(_ *Tensor, _ float32, _ RNGState) {
	panic(cudaNotWritten("DropoutMask"))
}

func (cudaMissing) LossMaskMean(_ *Tensor, _ *Tensor, _ *Tensor, _ *Tensor) float64 {
	panic(cudaNotWritten("LossMaskMean"))
}

func (cudaMissing) LossMaskScale(_ *Tensor, _ *Tensor, _ float64) {
	panic(cudaNotWritten("LossMaskScale"))
}

func (cudaMissing) Convert(_ *Tensor, _ *Tensor) {
	panic(cudaNotWritten("Convert"))
}
