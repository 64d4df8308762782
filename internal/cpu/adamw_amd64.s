//go:build amd64

#include "textflag.h"

// AdamWCoeffs field offsets.
#define B1 0
#define B2 4
#define OMB1 8
#define OMB2 12
#define EPS 16
#define BC1 20
#define BC2 24
#define LR 28
#define WD 32

// func adamwAVX512(p, gr, m, v *float32, n int, c *AdamWCoeffs)
// Same operations in the same order as adamwGo, each rounded separately:
// no FMA. In Go assembly "VOP a, b, d" computes d = b OP a, and when both
// a and b are NaN the result is b's NaN (quieted). Operands are placed so
// that b is the operand the Go compiler (1.26) puts first in adamwGo's
// scalar MULSS/ADDSS, so even NaN payloads match when two NaNs meet; the
// test checks this on every path.
TEXT ·adamwAVX512(SB), NOSPLIT, $0-48
	MOVQ p+0(FP), DI
	MOVQ gr+8(FP), SI
	MOVQ m+16(FP), R8
	MOVQ v+24(FP), R9
	MOVQ n+32(FP), CX
	MOVQ c+40(FP), AX
	VBROADCASTSS B1(AX), Z16
	VBROADCASTSS B2(AX), Z17
	VBROADCASTSS OMB1(AX), Z18
	VBROADCASTSS OMB2(AX), Z19
	VBROADCASTSS EPS(AX), Z20
	VBROADCASTSS BC1(AX), Z21
	VBROADCASTSS BC2(AX), Z22
	VBROADCASTSS LR(AX), Z23
	VBROADCASTSS WD(AX), Z24
	SHRQ $4, CX
	JZ done
loop:
	VMOVUPS (SI), Z0       // g
	VMOVUPS (R8), Z1       // m
	VMOVUPS (R9), Z2       // v
	VMULPS Z16, Z1, Z1     // m*b1
	VMULPS Z0, Z18, Z3     // omb1*g
	VADDPS Z1, Z3, Z1      // m' = omb1*g + m*b1
	VMULPS Z17, Z2, Z2     // v*b2
	VMULPS Z0, Z19, Z4     // omb2*g
	VMULPS Z4, Z0, Z4      // g*(omb2*g)
	VADDPS Z2, Z4, Z2      // v' = g*(omb2*g) + v*b2
	VMOVUPS Z1, (R8)
	VMOVUPS Z2, (R9)
	VDIVPS Z22, Z2, Z5     // v'/bc2
	VSQRTPS Z5, Z5         // correctly rounded
	VADDPS Z20, Z5, Z5     // denom = sqrt + eps
	VDIVPS Z21, Z1, Z6     // m'/bc1
	VDIVPS Z5, Z6, Z6      // m'/bc1/denom
	VMOVUPS (DI), Z7       // p
	VMULPS Z7, Z24, Z8     // wd*p
	VADDPS Z8, Z6, Z6      // m'/bc1/denom + wd*p
	VMULPS Z23, Z6, Z6     // (...)*lr
	VSUBPS Z6, Z7, Z7      // p - lr*(...)
	VMOVUPS Z7, (DI)
	ADDQ $64, DI
	ADDQ $64, SI
	ADDQ $64, R8
	ADDQ $64, R9
	DECQ CX
	JNZ loop
done:
	VZEROUPPER
	RET

// func adamwAVX2(p, gr, m, v *float32, n int, c *AdamWCoeffs)
// adamwAVX512 on 8-lane Y registers.
TEXT ·adamwAVX2(SB), NOSPLIT, $0-48
	MOVQ p+0(FP), DI
	MOVQ gr+8(FP), SI
	MOVQ m+16(FP), R8
	MOVQ v+24(FP), R9
	MOVQ n+32(FP), CX
	MOVQ c+40(FP), AX
	VBROADCASTSS B1(AX), Y7
	VBROADCASTSS B2(AX), Y8
	VBROADCASTSS OMB1(AX), Y9
	VBROADCASTSS OMB2(AX), Y10
	VBROADCASTSS EPS(AX), Y11
	VBROADCASTSS BC1(AX), Y12
	VBROADCASTSS BC2(AX), Y13
	VBROADCASTSS LR(AX), Y14
	VBROADCASTSS WD(AX), Y15
	SHRQ $3, CX
	JZ done2
loop2:
	VMOVUPS (SI), Y0       // g
	VMOVUPS (R8), Y1       // m
	VMOVUPS (R9), Y2       // v
	VMULPS Y7, Y1, Y1      // m*b1
	VMULPS Y0, Y9, Y3      // omb1*g
	VADDPS Y1, Y3, Y1      // m'
	VMULPS Y8, Y2, Y2      // v*b2
	VMULPS Y0, Y10, Y4     // omb2*g
	VMULPS Y4, Y0, Y4      // g*(omb2*g)
	VADDPS Y2, Y4, Y2      // v'
	VMOVUPS Y1, (R8)
	VMOVUPS Y2, (R9)
	VDIVPS Y13, Y2, Y5     // v'/bc2
	VSQRTPS Y5, Y5
	VADDPS Y11, Y5, Y5     // denom
	VDIVPS Y12, Y1, Y6     // m'/bc1
	VDIVPS Y5, Y6, Y6      // m'/bc1/denom
	VMOVUPS (DI), Y0       // p
	VMULPS Y0, Y15, Y3     // wd*p
	VADDPS Y3, Y6, Y6
	VMULPS Y14, Y6, Y6     // (...)*lr
	VSUBPS Y6, Y0, Y0      // p - lr*(...)
	VMOVUPS Y0, (DI)
	ADDQ $32, DI
	ADDQ $32, SI
	ADDQ $32, R8
	ADDQ $32, R9
	DECQ CX
	JNZ loop2
done2:
	VZEROUPPER
	RET
