package main

import (
	"bytes"
	"fmt"
)

// vdpbf16ps returns the machine code of VDPBF16PS zmm(dst), zmm(src1),
// zmm(src2) (Intel operand order; registers 0..31): for each of the 16
// fp32 lanes, dst += src1.bf16[2i]·src2.bf16[2i] + src1.bf16[2i+1]·src2.bf16[2i+1].
// Go's assembler has no mnemonic for it, so the kernels emit these bytes.
//
// Encoding EVEX.512.F3.0F38.W0 52 /r: 62, P0, P1, P2, 52, ModRM with
//
//	P0 = R̄ X̄ B̄ R̄' 0 0 m1 m0   (mm = 10: 0F38; R, R' = bits 3, 4 of dst;
//	                            B, X = bits 3, 4 of src2, the ModRM.rm register)
//	P1 = W v̄3 v̄2 v̄1 v̄0 1 p1 p0 (W = 0; vvvv = bits 0..3 of src1; pp = 10: F3)
//	P2 = z L' L b V̄' a a a     (L'L = 10: 512 bits; V' = bit 4 of src1; no mask)
//	ModRM = 11 dst[2:0] src2[2:0]
//
// where a bar means the bit is stored inverted.
func vdpbf16ps(dst, src1, src2 int) []byte {
	inv := func(reg, bit int, mask byte) byte {
		if reg&(1<<bit) == 0 {
			return mask
		}
		return 0
	}
	p0 := 0x02 | inv(dst, 3, 0x80) | inv(src2, 4, 0x40) | inv(src2, 3, 0x20) | inv(dst, 4, 0x10)
	p1 := byte(^src1&15)<<3 | 0x04 | 0x02
	p2 := 0x40 | inv(src1, 4, 0x08)
	modrm := 0xC0 | byte(dst&7)<<3 | byte(src2&7)
	return []byte{0x62, p0, p1, p2, 0x52, modrm}
}

// emitVDPBF16PS writes VDPBF16PS as a line of BYTE directives, with the
// instruction in Go operand order (sources first) as a comment.
func emitVDPBF16PS(w *bytes.Buffer, dst, src1, src2 int) {
	w.WriteString("\t")
	for i, b := range vdpbf16ps(dst, src1, src2) {
		if i > 0 {
			w.WriteString("; ")
		}
		fmt.Fprintf(w, "BYTE $0x%02x", b)
	}
	fmt.Fprintf(w, " // VDPBF16PS Z%d, Z%d, Z%d\n", src2, src1, dst)
}

// bf16Kernels writes the AVX512_BF16 kernels (one per row count) into asm
// and their declarations into decl. They compute the same tile as the fp32
// kernels, from panels of bf16 pairs: the A panel holds, per pair step q,
// mr uint32 words (op(A)[i,2q] in the low half, op(A)[i,2q+1] in the high
// half); the B panel rows (ldb bytes apart) hold NR such words, one per
// column. kc is the number of k steps; an odd kc has a zero high half in
// the last pair.
func bf16Kernels(asm, decl *bytes.Buffer, s isa) {
	nr := s.nv * s.lanes
	fmt.Fprintf(decl, "// kernsBF16%s[mr-1] is the %s bf16-pair kernel (VDPBF16PS) for mr rows\n// (see internal/cpu/gen).\nvar kernsBF16%s = [%d]kernFunc{\n", s.name, s.name, s.name, s.mr)
	for mr := 1; mr <= s.mr; mr++ {
		fmt.Fprintf(decl, "\tkernBF16%s_%dx%d,\n", s.name, mr, nr)
	}
	decl.WriteString("}\n\n")
	for mr := 1; mr <= s.mr; mr++ {
		name := fmt.Sprintf("kernBF16%s_%dx%d", s.name, mr, nr)
		s.kernelBF16(asm, name, mr)
		fmt.Fprintf(decl, "//go:noescape\nfunc %s(kc int, a, b *float32, ldb int, c *float32, ldc int, alpha, beta float32, load int)\n\n", name)
	}
}

// kernelBF16 writes one bf16-pair kernel for mr rows. Registers as in
// kernel; Z registers: mr*nv accumulators, nv B vectors, two broadcast
// A pairs (alternating, so consecutive rows do not wait on each other).
func (s isa) kernelBF16(w *bytes.Buffer, name string, mr int) {
	nacc := mr * s.nv
	if nacc+s.nv+2 > s.nregs {
		panic(fmt.Sprintf("gen: bf16 tile %d×%d needs %d registers", mr, s.nv*s.lanes, nacc+s.nv+2))
	}
	bReg := func(v int) int { return nacc + v }
	bc := func(i int) int { return nacc + s.nv + i%2 }
	vbytes := s.lanes * 4
	fmt.Fprintf(w, "\n// func %s(kc int, a, b *float32, ldb int, c *float32, ldc int, alpha, beta float32, load int)\n", name)
	fmt.Fprintf(w, "TEXT ·%s(SB), NOSPLIT, $0-64\n", name)
	w.WriteString("\tMOVQ kc+0(FP), CX\n\tMOVQ a+8(FP), SI\n\tMOVQ b+16(FP), DX\n\tMOVQ ldb+24(FP), R8\n\tMOVQ c+32(FP), DI\n\tMOVQ ldc+40(FP), R9\n")
	w.WriteString("\tINCQ CX\n\tSHRQ $1, CX\n") // pair steps: ceil(kc/2)
	for i := 0; i < nacc; i++ {
		fmt.Fprintf(w, "\tVPXORD Z%d, Z%d, Z%d\n", i, i, i)
	}
	w.WriteString("\tMOVQ DI, R10\n")
	for i := 0; i < mr; i++ {
		for off := 0; off < s.nv*vbytes; off += 64 {
			fmt.Fprintf(w, "\tPREFETCHT0 %d(R10)\n", off)
		}
		if i < mr-1 {
			w.WriteString("\tADDQ R9, R10\n")
		}
	}
	// One pair step: load the B pair row, then per A row broadcast its
	// pair and one VDPBF16PS per accumulator.
	step := func(bAddr string, aOff int) {
		for v := 0; v < s.nv; v++ {
			fmt.Fprintf(w, "\tVMOVUPS %d%s, Z%d\n", v*vbytes, bAddr, bReg(v))
		}
		for i := 0; i < mr; i++ {
			fmt.Fprintf(w, "\tVPBROADCASTD %d(SI), Z%d\n", aOff+4*i, bc(i))
			for v := 0; v < s.nv; v++ {
				emitVDPBF16PS(w, i*s.nv+v, bReg(v), bc(i))
			}
		}
	}
	w.WriteString("\tMOVQ CX, BX\n\tSHRQ $1, BX\n\tJZ tail\nloop:\n")
	step("(DX)", 0)
	step("(DX)(R8*1)", 4*mr)
	fmt.Fprintf(w, "\tLEAQ (DX)(R8*2), DX\n\tADDQ $%d, SI\n\tPREFETCHT0 %d(SI)\n\tDECQ BX\n\tJNZ loop\n", 8*mr, 512)
	w.WriteString("tail:\n\tANDQ $1, CX\n\tJZ done\n")
	step("(DX)", 0)
	w.WriteString("done:\n")
	fmt.Fprintf(w, "\tVBROADCASTSS alpha+48(FP), Z%d\n", bReg(0))
	for i := 0; i < nacc; i++ {
		fmt.Fprintf(w, "\tVMULPS Z%d, Z%d, Z%d\n", bReg(0), i, i)
	}
	w.WriteString("\tMOVQ load+56(FP), AX\n\tMOVQ DI, R10\n\tTESTQ AX, AX\n\tJNZ accum\n")
	for i := 0; i < mr; i++ {
		for v := 0; v < s.nv; v++ {
			fmt.Fprintf(w, "\tVMOVUPS Z%d, %d(R10)\n", i*s.nv+v, v*vbytes)
		}
		if i < mr-1 {
			w.WriteString("\tADDQ R9, R10\n")
		}
	}
	w.WriteString("\tVZEROUPPER\n\tRET\naccum:\n")
	fmt.Fprintf(w, "\tVBROADCASTSS beta+52(FP), Z%d\n", bReg(0))
	for i := 0; i < mr; i++ {
		for v := 0; v < s.nv; v++ {
			fmt.Fprintf(w, "\tVFMADD231PS %d(R10), Z%d, Z%d\n", v*vbytes, bReg(0), i*s.nv+v)
			fmt.Fprintf(w, "\tVMOVUPS Z%d, %d(R10)\n", i*s.nv+v, v*vbytes)
		}
		if i < mr-1 {
			w.WriteString("\tADDQ R9, R10\n")
		}
	}
	w.WriteString("\tVZEROUPPER\n\tRET\n")
}

// bf16Packers writes the AVX-512F helpers that round fp32 to bf16 pairs
// when packing for the bf16 kernels, bit for bit like the Go packers
// (round to nearest even in integer arithmetic; NaN: truncated, quiet bit
// set) and their declarations.
func bf16Packers(asm, decl *bytes.Buffer) {
	// round rounds the fp32 bits in Z(x) to bf16 in the high half (low half
	// garbage). Z28 = 0x7fff, Z29 = 1, Z30 = quiet bit; uses Z2, K2, K3.
	round := func(x int) {
		fmt.Fprintf(asm, "\tVPSRLD $16, Z%d, Z2\n\tVPANDD Z29, Z2, Z2\n\tVPADDD Z28, Z2, Z2\n", x)
		fmt.Fprintf(asm, "\tVCMPPS $3, Z%d, Z%d, K2\n\tKNOTW K2, K3\n", x, x)
		fmt.Fprintf(asm, "\tVPADDD Z2, Z%d, K3, Z%d\n\tVPORD Z30, Z%d, K2, Z%d\n", x, x, x, x)
	}
	consts := "\tMOVL $0x7fff, AX\n\tVPBROADCASTD AX, Z28\n\tMOVL $1, AX\n\tVPBROADCASTD AX, Z29\n\tMOVL $0x00400000, AX\n\tVPBROADCASTD AX, Z30\n"

	asm.WriteString("\n// func bf16PairRowsAVX512(r0, r1 *float32, dst *uint32, n int)\n")
	asm.WriteString("TEXT ·bf16PairRowsAVX512(SB), NOSPLIT, $0-32\n")
	asm.WriteString("\tMOVQ r0+0(FP), SI\n\tMOVQ r1+8(FP), DX\n\tMOVQ dst+16(FP), DI\n\tMOVQ n+24(FP), CX\n")
	asm.WriteString(consts)
	asm.WriteString("\tMOVL $0xffff0000, AX\n\tVPBROADCASTD AX, Z31\n")
	combine := func() {
		round(0)
		round(1)
		asm.WriteString("\tVPSRLD $16, Z0, Z0\n\tVPANDD Z31, Z1, Z1\n\tVPORD Z1, Z0, Z0\n")
	}
	asm.WriteString("rows16:\n\tCMPQ CX, $16\n\tJLT rowstail\n\tVMOVDQU32 (SI), Z0\n\tVMOVDQU32 (DX), Z1\n")
	combine()
	asm.WriteString("\tVMOVDQU32 Z0, (DI)\n\tADDQ $64, SI\n\tADDQ $64, DX\n\tADDQ $64, DI\n\tSUBQ $16, CX\n\tJMP rows16\n")
	asm.WriteString("rowstail:\n\tTESTQ CX, CX\n\tJZ rowsdone\n\tMOVL $1, AX\n\tSHLL CX, AX\n\tDECL AX\n\tKMOVW AX, K1\n")
	asm.WriteString("\tVMOVDQU32.Z (SI), K1, Z0\n\tVMOVDQU32.Z (DX), K1, Z1\n")
	combine()
	asm.WriteString("\tVMOVDQU32 Z0, K1, (DI)\nrowsdone:\n\tVZEROUPPER\n\tRET\n")

	// Odd 16-bit words 1, 3, ..., 63: the bf16 halves of 32 floats.
	asm.WriteString("\nDATA bf16OddWords<>+0(SB)/8, $0x0007000500030001\n")
	for i := 1; i < 8; i++ {
		w := uint64(0)
		for x := 3; x >= 0; x-- {
			w = w<<16 | uint64(8*i+2*x+1)
		}
		fmt.Fprintf(asm, "DATA bf16OddWords<>+%d(SB)/8, $0x%016x\n", 8*i, w)
	}
	asm.WriteString("GLOBL bf16OddWords<>(SB), RODATA|NOPTR, $64\n")
	asm.WriteString("\n// func bf16PairsAVX512(src *float32, dst *uint32, n int)\n")
	asm.WriteString("TEXT ·bf16PairsAVX512(SB), NOSPLIT, $0-24\n")
	asm.WriteString("\tMOVQ src+0(FP), SI\n\tMOVQ dst+8(FP), DI\n\tMOVQ n+16(FP), CX\n\tSHRQ $4, CX\n\tJZ pairsdone\n")
	asm.WriteString(consts)
	asm.WriteString("\tVMOVDQU64 bf16OddWords<>(SB), Z27\npairs16:\n\tVMOVDQU32 (SI), Z0\n\tVMOVDQU32 64(SI), Z1\n")
	round(0)
	round(1)
	asm.WriteString("\tVMOVDQA64 Z27, Z3\n\tVPERMI2W Z1, Z0, Z3\n\tVMOVDQU32 Z3, (DI)\n")
	asm.WriteString("\tADDQ $128, SI\n\tADDQ $64, DI\n\tDECQ CX\n\tJNZ pairs16\npairsdone:\n\tVZEROUPPER\n\tRET\n")

	decl.WriteString("// bf16PairRowsAVX512 sets dst[j] = bf16(r0[j]) | bf16(r1[j])<<16 for j < n.\n//\n//go:noescape\nfunc bf16PairRowsAVX512(r0, r1 *float32, dst *uint32, n int)\n\n")
	decl.WriteString("// bf16PairsAVX512 sets dst[q] = bf16(src[2q]) | bf16(src[2q+1])<<16 for\n// q < n rounded down to a multiple of 16.\n//\n//go:noescape\nfunc bf16PairsAVX512(src *float32, dst *uint32, n int)\n\n")
}
