// Package cpu holds gotron's CPU kernels: packed SGEMM with AVX-512/AVX2
// assembly micro-kernels and a pure-Go fallback, fused attention, norms,
// activations, softmax and cross-entropy. Every fast kernel has a plain Go
// reference beside it that tests hold it against.
//
// Kernels work on float32 slices in row-major order and never allocate in
// steady state. Multi-core work goes through [Parallel], whose width is
// GOTRON_NUM_THREADS (default GOMAXPROCS).
package cpu
