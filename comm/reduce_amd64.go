package comm

import (
	"unsafe"

	"golang.org/x/sys/cpu"
)

//go:noescape
func addF32AVX2(d, s *float32, n int)

//go:noescape
func sumF32NT(dsts, srcs **float32, ndst, nsrc, n int, div float32)

// hasAVX2 is fixed at start-up by the CPU; it is not configuration.
var hasAVX2 = cpu.X86.HasAVX2

// addF32 sets d[i] += s[i] for i < len(d) (len(s) ≥ len(d)).
func addF32(d, s []float32) {
	if len(d) == 0 {
		return
	}
	s = s[:len(d)]
	if hasAVX2 {
		addF32AVX2(&d[0], &s[0], len(d))
		return
	}
	addF32Ref(d, s)
}

const (
	// ntMaxBuffers bounds the sources and destinations sumToNT takes (its
	// pointer tables live on the stack).
	ntMaxBuffers = 64
	// ntBlock is the elements per sumF32NT call: an assembly loop cannot
	// be preempted, so a long reduction returns to Go every 64 KiB of each
	// source.
	ntBlock = 16 << 10
)

// sumToNT is ReduceNTo for float32 Sum (avg: Avg) with non-temporal stores:
// the destinations are written without being read first (an ordinary store
// to a line not in cache reads it from memory, a third of the traffic of a
// one-pass reduction) and without evicting the sources from cache. It
// returns false, having done nothing, when it cannot run: no AVX2, too many
// buffers, or destinations that are not equally aligned modulo 32 bytes.
func sumToNT(dsts, srcs []Buffer, avg bool) bool {
	if !hasAVX2 || len(dsts) > ntMaxBuffers || len(srcs) > ntMaxBuffers {
		return false
	}
	n := dsts[0].Len()
	var dp, sp [ntMaxBuffers]*float32
	misalign := uintptr(unsafe.Pointer(unsafe.SliceData(dsts[0].Data))) % 32
	for k, d := range dsts {
		f := d.Float32()
		dp[k] = unsafe.SliceData(f)
		if uintptr(unsafe.Pointer(dp[k]))%32 != misalign {
			return false
		}
	}
	for k, s := range srcs {
		sp[k] = unsafe.SliceData(s.Float32())
	}
	var div float32
	if avg {
		div = float32(len(srcs))
	}
	// head: elements before the first 32-byte boundary of the destinations
	head := min(n, int((32-misalign)%32/4))
	sumF32Ref(dsts, srcs, 0, head, div)
	body := head + (n-head)/32*32
	for lo := head; lo < body; lo += ntBlock {
		m := min(ntBlock, body-lo)
		var dq, sq [ntMaxBuffers]*float32
		for k := range dsts {
			dq[k] = (*float32)(unsafe.Add(unsafe.Pointer(dp[k]), 4*lo))
		}
		for k := range srcs {
			sq[k] = (*float32)(unsafe.Add(unsafe.Pointer(sp[k]), 4*lo))
		}
		sumF32NT(&dq[0], &sq[0], len(dsts), len(srcs), m, div)
	}
	sumF32Ref(dsts, srcs, body, n, div)
	return true
}
