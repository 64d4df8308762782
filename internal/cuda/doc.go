// Package cuda drives NVIDIA GPUs without cgo: it loads the driver
// (libcuda.so.1), cuBLAS and NCCL at run time through purego, so a binary
// built with CGO_ENABLED=0 runs on machines with and without a GPU; on the
// latter Open returns an error naming the library and where it was looked
// for.
//
// A Device (Open) holds the GPU's primary context, one non-blocking stream on
// which every copy, memset, kernel launch, GEMM and collective is queued in
// order, a caching allocator (Alloc, Free, MemStats) and a cuBLAS handle
// bound to the stream. Nothing uses CUDA's legacy default stream.
//
// Thread discipline: a CUDA context is current per OS thread, and the Go
// scheduler moves goroutines between threads. Every Device method that calls
// the driver locks its goroutine to the OS thread, makes the Device's context
// current on it, makes its calls and unlocks, so callers need not care which
// goroutine they are on. Submissions to the stream are serialized by a
// mutex, so the methods are safe for concurrent use. Free never calls the
// driver (it returns the block to the cache), so finalizers may call it.
package cuda
