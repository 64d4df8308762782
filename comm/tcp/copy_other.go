//go:build !amd64

package tcp

// copyNT copies src into dst; only amd64 has a non-temporal version.
func copyNT(dst, src []byte) { copy(dst, src) }
