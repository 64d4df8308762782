//go:build !amd64

package cpu

// detectISA reports the pure-Go path: assembly kernels exist only on amd64.
func detectISA() ISA { return ISAGeneric }
