//go:build amd64

#include "textflag.h"

// func nonFiniteAVX512(x *float32, n int) bool
// Lane sums of x·0 are ±0 unless some x is NaN or ±Inf, which makes the
// lane NaN; the answer is whether any lane is unordered.
TEXT ·nonFiniteAVX512(SB), NOSPLIT, $0-17
	MOVQ x+0(FP), SI
	MOVQ n+8(FP), CX
	VPXORD Z0, Z0, Z0 // acc
	VPXORD Z1, Z1, Z1 // zero
	SHRQ $4, CX
	JZ done
loop:
	VMULPS (SI), Z1, Z2
	VADDPS Z2, Z0, Z0
	ADDQ $64, SI
	DECQ CX
	JNZ loop
done:
	VCMPPS $3, Z0, Z0, K1 // unordered: NaN lanes
	KORTESTW K1, K1
	SETNE AX
	MOVB AX, ret+16(FP)
	VZEROUPPER
	RET

// func nonFiniteAVX2(x *float32, n int) bool
TEXT ·nonFiniteAVX2(SB), NOSPLIT, $0-17
	MOVQ x+0(FP), SI
	MOVQ n+8(FP), CX
	VXORPS Y0, Y0, Y0 // acc
	VXORPS Y1, Y1, Y1 // zero
	SHRQ $3, CX
	JZ done2
loop2:
	VMULPS (SI), Y1, Y2
	VADDPS Y2, Y0, Y0
	ADDQ $32, SI
	DECQ CX
	JNZ loop2
done2:
	VCMPPS $3, Y0, Y0, Y0 // unordered: NaN lanes all ones
	VMOVMSKPS Y0, AX
	TESTL AX, AX
	SETNE AX
	MOVB AX, ret+16(FP)
	VZEROUPPER
	RET
