#include "textflag.h"

// func copyNTAVX(dst, src *byte, n int)
// Copies n bytes (a multiple of 128) with non-temporal stores; dst must be
// 32-byte aligned. Pure moves: any bit pattern is copied unchanged.
TEXT ·copyNTAVX(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX

loop:
	TESTQ CX, CX
	JZ    done
	VMOVDQU (SI), Y0
	VMOVDQU 32(SI), Y1
	VMOVDQU 64(SI), Y2
	VMOVDQU 96(SI), Y3
	VMOVNTDQ Y0, (DI)
	VMOVNTDQ Y1, 32(DI)
	VMOVNTDQ Y2, 64(DI)
	VMOVNTDQ Y3, 96(DI)
	ADDQ $128, SI
	ADDQ $128, DI
	SUBQ $128, CX
	JMP  loop

done:
	SFENCE
	VZEROUPPER
	RET
