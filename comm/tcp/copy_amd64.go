package tcp

import (
	"unsafe"

	"golang.org/x/sys/cpu"
)

//go:noescape
func copyNTAVX(dst, src *byte, n int)

// hasAVX is fixed at start-up by the CPU; it is not configuration.
var hasAVX = cpu.X86.HasAVX

// ntPiece is the most one copyNTAVX call moves: an assembly loop cannot be
// preempted, so a long copy returns to Go every 64 KiB.
const ntPiece = 64 << 10

// copyNT copies src into dst (len(dst) ≥ len(src)) with non-temporal
// stores: the destination is written without being read first and without
// evicting the cache. For copies out of a group region into the caller's
// buffer, which is not read again soon.
func copyNT(dst, src []byte) {
	n := len(src)
	if !hasAVX || n < 4096 {
		copy(dst, src)
		return
	}
	head := int((32 - uintptr(unsafe.Pointer(&dst[0]))%32) % 32)
	copy(dst[:head], src[:head])
	body := head + (n-head)/128*128
	for lo := head; lo < body; lo += ntPiece {
		m := min(ntPiece, body-lo)
		copyNTAVX(&dst[lo], &src[lo], m)
	}
	copy(dst[body:n], src[body:n])
}
