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
