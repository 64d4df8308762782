#include "textflag.h"

// func addF32AVX2(d, s *float32, n int)
// d[i] += s[i] for i < n: 32 floats per iteration in four ymm registers,
// then 8 at a time, then one at a time. Addition is commutative in IEEE 754,
// so the result is bit-identical to the Go loop.
TEXT ·addF32AVX2(SB), NOSPLIT, $0-24
	MOVQ d+0(FP), DI
	MOVQ s+8(FP), SI
	MOVQ n+16(FP), CX

loop32:
	CMPQ CX, $32
	JL   loop8
	VMOVUPS (DI), Y0
	VMOVUPS 32(DI), Y1
	VMOVUPS 64(DI), Y2
	VMOVUPS 96(DI), Y3
	VADDPS  (SI), Y0, Y0
	VADDPS  32(SI), Y1, Y1
	VADDPS  64(SI), Y2, Y2
	VADDPS  96(SI), Y3, Y3
	VMOVUPS Y0, (DI)
	VMOVUPS Y1, 32(DI)
	VMOVUPS Y2, 64(DI)
	VMOVUPS Y3, 96(DI)
	ADDQ    $128, DI
	ADDQ    $128, SI
	SUBQ    $32, CX
	JMP     loop32

loop8:
	CMPQ CX, $8
	JL   loop1
	VMOVUPS (DI), Y0
	VADDPS  (SI), Y0, Y0
	VMOVUPS Y0, (DI)
	ADDQ    $32, DI
	ADDQ    $32, SI
	SUBQ    $8, CX
	JMP     loop8

loop1:
	TESTQ CX, CX
	JZ    done
	MOVSS (DI), X0
	ADDSS (SI), X0
	MOVSS X0, (DI)
	ADDQ  $4, DI
	ADDQ  $4, SI
	DECQ  CX
	JMP   loop1

done:
	VZEROUPPER
	RET

// func sumF32NT(dsts, srcs **float32, ndst, nsrc, n int, div float32)
// For i < n: v = srcs[0][i] + srcs[1][i] + ... (in that order), divided by
// div when div != 0, stored into dsts[k][i] for every k with non-temporal
// stores. n must be a multiple of 32 and every dsts[k] 32-byte aligned.
// A 128-byte tile of every source is loaded before any destination is
// written, so a destination may alias a source exactly.
TEXT ·sumF32NT(SB), NOSPLIT, $0-44
	MOVQ  dsts+0(FP), R8
	MOVQ  srcs+8(FP), R10
	MOVQ  ndst+16(FP), R9
	MOVQ  nsrc+24(FP), R11
	MOVQ  n+32(FP), CX
	MOVSS div+40(FP), X4
	XORQ  AX, AX
	VBROADCASTSS X4, Y4
	VXORPS X5, X5, X5
	UCOMISS X5, X4
	SETNE DX              // DX = div != 0 (or NaN, never passed)

tile:
	TESTQ CX, CX
	JZ    done
	MOVQ    (R10), SI
	VMOVUPS (SI)(AX*1), Y0
	VMOVUPS 32(SI)(AX*1), Y1
	VMOVUPS 64(SI)(AX*1), Y2
	VMOVUPS 96(SI)(AX*1), Y3
	MOVQ    $1, BX

src:
	CMPQ    BX, R11
	JGE     scale
	MOVQ    (R10)(BX*8), SI
	VADDPS  (SI)(AX*1), Y0, Y0
	VADDPS  32(SI)(AX*1), Y1, Y1
	VADDPS  64(SI)(AX*1), Y2, Y2
	VADDPS  96(SI)(AX*1), Y3, Y3
	INCQ    BX
	JMP     src

scale:
	TESTB   DL, DL
	JZ      store
	VDIVPS  Y4, Y0, Y0
	VDIVPS  Y4, Y1, Y1
	VDIVPS  Y4, Y2, Y2
	VDIVPS  Y4, Y3, Y3

store:
	XORQ    BX, BX

dst:
	CMPQ     BX, R9
	JGE      next
	MOVQ     (R8)(BX*8), DI
	VMOVNTPS Y0, (DI)(AX*1)
	VMOVNTPS Y1, 32(DI)(AX*1)
	VMOVNTPS Y2, 64(DI)(AX*1)
	VMOVNTPS Y3, 96(DI)(AX*1)
	INCQ     BX
	JMP      dst

next:
	ADDQ $128, AX
	SUBQ $32, CX
	JMP  tile

done:
	SFENCE
	VZEROUPPER
	RET
