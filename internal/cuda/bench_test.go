package cuda

import "testing"

// BenchmarkAllocatorCacheHit is the host cost of an Alloc/Free pair served
// from the cache (no driver).
func BenchmarkAllocatorCacheHit(b *testing.B) {
	a := newCachingAllocator(newFakeMemory(1<<40), 0, 1<<40, nil)
	p, _ := a.Alloc(4096)
	a.Free(p)
	b.ReportAllocs()
	for b.Loop() {
		p, _ := a.Alloc(4096)
		a.Free(p)
	}
}

// BenchmarkGPULaunch is the host cost of one kernel launch (a one-block
// vadd), including the per-call thread lock and context switch.
func BenchmarkGPULaunch(b *testing.B) {
	d := gpu(b)
	mod, err := d.LoadModule([]byte(vaddPTX))
	if err != nil {
		b.Fatal(err)
	}
	f, _ := mod.Function("vadd")
	p, _ := d.Alloc(1024)
	defer d.Free(p)
	b.ReportAllocs()
	for b.Loop() {
		if err := d.Launch(f, Dim3{X: 1}, Dim3{X: 256}, 0, p, p, p, uint32(256)); err != nil {
			b.Fatal(err)
		}
	}
	if err := d.Synchronize(); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkGPUGemmSmall is the host-plus-GPU cost of a small GEMM (64³ fp32).
func BenchmarkGPUGemmSmall(b *testing.B) {
	d := gpu(b)
	p, _ := d.Alloc(3 * 4 * 64 * 64)
	defer d.Free(p)
	if err := d.Memset(p, 3*4*64*64); err != nil {
		b.Fatal(err)
	}
	g := GemmParams{M: 64, N: 64, K: 64, Alpha: 1, A: p, B: p + 4*64*64, C: p + 8*64*64, LDA: 64, LDB: 64, LDC: 64}
	b.ReportAllocs()
	for b.Loop() {
		if err := d.GemmStridedBatched(g); err != nil {
			b.Fatal(err)
		}
	}
	if err := d.Synchronize(); err != nil {
		b.Fatal(err)
	}
}
