//go:build amd64

#include "textflag.h"

#include "exp_amd64.h"

#define BCASTY(bits, Y) MOVL $bits, AX; MOVD AX, X0; VPBROADCASTD X0, Y

// func expSubAVX512(x *float32, n int, sub float32) float32
// x[i] = exp(x[i]-sub) for i < n (n a multiple of 16); returns the sum.
// Same algorithm and constants as expF32 (Cephes expf); lanes below
// -87.33654 (including -Inf) become exactly 0.
TEXT ·expSubAVX512(SB), NOSPLIT, $0-28
	MOVQ x+0(FP), SI
	MOVQ n+8(FP), CX
	VBROADCASTSS sub+16(FP), Z31
	EXP_CONSTS
	VPXORD Z18, Z18, Z18   // sum
	SHRQ $4, CX
	JZ reduce
loop:
	VMOVUPS (SI), Z0
	VSUBPS Z31, Z0, Z0
	EXP                         // Z2 = exp(Z0) (exp_amd64.h)
	VMOVUPS Z2, (SI)
	VADDPS Z2, Z18, Z18
	ADDQ $64, SI
	DECQ CX
	JNZ loop
reduce:
	VEXTRACTF32X8 $1, Z18, Y1
	VADDPS Y1, Y18, Y0
	VEXTRACTF128 $1, Y0, X1
	VADDPS X1, X0, X0
	VHADDPS X0, X0, X0
	VHADDPS X0, X0, X0
	VZEROUPPER
	MOVSS X0, ret+24(FP)
	RET

// func expSumAVX512(x *float32, n int, sub float32) float32
// returns Σ exp(x[i]-sub) for i < n (n a multiple of 16); x is not written.
// Same algorithm and constants as expF32 (Cephes expf); lanes below
// -87.33654 (including -Inf) become exactly 0.
TEXT ·expSumAVX512(SB), NOSPLIT, $0-28
	MOVQ x+0(FP), SI
	MOVQ n+8(FP), CX
	VBROADCASTSS sub+16(FP), Z31
	EXP_CONSTS
	VPXORD Z18, Z18, Z18   // sum
	SHRQ $4, CX
	JZ reduce
loop:
	VMOVUPS (SI), Z0
	VSUBPS Z31, Z0, Z0
	EXP                         // Z2 = exp(Z0) (exp_amd64.h)
	VADDPS Z2, Z18, Z18
	ADDQ $64, SI
	DECQ CX
	JNZ loop
reduce:
	VEXTRACTF32X8 $1, Z18, Y1
	VADDPS Y1, Y18, Y0
	VEXTRACTF128 $1, Y0, X1
	VADDPS X1, X0, X0
	VHADDPS X0, X0, X0
	VHADDPS X0, X0, X0
	VZEROUPPER
	MOVSS X0, ret+24(FP)
	RET

// func maxAVX512(x *float32, n int, init float32) float32
// returns max(init, x[0:n]) for n a multiple of 16 (NaN handling as VMAXPS).
TEXT ·maxAVX512(SB), NOSPLIT, $0-28
	MOVQ x+0(FP), SI
	MOVQ n+8(FP), CX
	VBROADCASTSS init+16(FP), Z0
	VMOVAPS Z0, Z1
	SHRQ $4, CX
	MOVQ CX, BX
	SHRQ $1, BX
	JZ one
pair:
	VMAXPS (SI), Z0, Z0
	VMAXPS 64(SI), Z1, Z1
	ADDQ $128, SI
	DECQ BX
	JNZ pair
one:
	ANDQ $1, CX
	JZ reduce
	VMAXPS (SI), Z0, Z0
reduce:
	VMAXPS Z1, Z0, Z0
	VEXTRACTF32X8 $1, Z0, Y1
	VMAXPS Y1, Y0, Y0
	VEXTRACTF128 $1, Y0, X1
	VMAXPS X1, X0, X0
	VPERMILPS $0x4e, X0, X1
	VMAXPS X1, X0, X0
	VPERMILPS $0xb1, X0, X1
	VMAXPS X1, X0, X0
	VZEROUPPER
	MOVSS X0, ret+24(FP)
	RET

DATA expc2<>+0(SB)/4, $0x39506967
DATA expc2<>+4(SB)/4, $0x39506967
DATA expc2<>+8(SB)/4, $0x39506967
DATA expc2<>+12(SB)/4, $0x39506967
DATA expc2<>+16(SB)/4, $0x39506967
DATA expc2<>+20(SB)/4, $0x39506967
DATA expc2<>+24(SB)/4, $0x39506967
DATA expc2<>+28(SB)/4, $0x39506967
DATA expc2<>+32(SB)/4, $0x3ab743ce
DATA expc2<>+36(SB)/4, $0x3ab743ce
DATA expc2<>+40(SB)/4, $0x3ab743ce
DATA expc2<>+44(SB)/4, $0x3ab743ce
DATA expc2<>+48(SB)/4, $0x3ab743ce
DATA expc2<>+52(SB)/4, $0x3ab743ce
DATA expc2<>+56(SB)/4, $0x3ab743ce
DATA expc2<>+60(SB)/4, $0x3ab743ce
DATA expc2<>+64(SB)/4, $0x3c088908
DATA expc2<>+68(SB)/4, $0x3c088908
DATA expc2<>+72(SB)/4, $0x3c088908
DATA expc2<>+76(SB)/4, $0x3c088908
DATA expc2<>+80(SB)/4, $0x3c088908
DATA expc2<>+84(SB)/4, $0x3c088908
DATA expc2<>+88(SB)/4, $0x3c088908
DATA expc2<>+92(SB)/4, $0x3c088908
DATA expc2<>+96(SB)/4, $0x3d2aa9c1
DATA expc2<>+100(SB)/4, $0x3d2aa9c1
DATA expc2<>+104(SB)/4, $0x3d2aa9c1
DATA expc2<>+108(SB)/4, $0x3d2aa9c1
DATA expc2<>+112(SB)/4, $0x3d2aa9c1
DATA expc2<>+116(SB)/4, $0x3d2aa9c1
DATA expc2<>+120(SB)/4, $0x3d2aa9c1
DATA expc2<>+124(SB)/4, $0x3d2aa9c1
GLOBL expc2<>(SB), RODATA|NOPTR, $128

// func expSubAVX2(x *float32, n int, sub float32) float32
// x[i] = exp(x[i]-sub) for i < n; returns the sum.
// AVX2+FMA3 version of the AVX-512 kernel above: 8 lanes, n a multiple of 8.
TEXT ·expSubAVX2(SB), NOSPLIT, $0-28
	MOVQ x+0(FP), SI
	MOVQ n+8(FP), CX
	VBROADCASTSS sub+16(FP), Y15
	BCASTY(0x3fb8aa3b, Y14) // log2e
	BCASTY(0x3f318000, Y13) // c1
	BCASTY(0xb95e8083, Y12) // c2
	BCASTY(0x3f800000, Y11) // 1
	BCASTY(0xc2aeac4f, Y10) // lo
	BCASTY(0x42b17217, Y9)  // hi
	BCASTY(127, Y7)         // exponent bias
	BCASTY(0x3e2aaaaa, Y6)  // p4
	BCASTY(0x3f000000, Y5)  // p5
	VXORPS Y8, Y8, Y8       // sum
	SHRQ $3, CX
	JZ reduce2
loop2:
	VMOVUPS (SI), Y0
	VSUBPS Y15, Y0, Y0
	VMINPS Y9, Y0, Y0
	VCMPPS $0x1d, Y10, Y0, Y4   // Y4 = x >= lo (all ones)
	VMULPS Y14, Y0, Y1
	VROUNDPS $0, Y1, Y1         // fx = round(x*log2e)
	VFNMADD231PS Y13, Y1, Y0    // r = x - fx*c1
	VFNMADD231PS Y12, Y1, Y0    // r -= fx*c2
	VMOVUPS expc2<>+0(SB), Y2   // p0
	VFMADD213PS expc2<>+32(SB), Y0, Y2
	VFMADD213PS expc2<>+64(SB), Y0, Y2
	VFMADD213PS expc2<>+96(SB), Y0, Y2
	VFMADD213PS Y6, Y0, Y2
	VFMADD213PS Y5, Y0, Y2
	VMULPS Y0, Y0, Y3           // r²
	VFMADD213PS Y0, Y3, Y2      // y = y*r² + r
	VADDPS Y11, Y2, Y2          // y += 1
	VCVTPS2DQ Y1, Y1
	VPADDD Y7, Y1, Y1
	VPSLLD $23, Y1, Y1          // 2^fx
	VMULPS Y1, Y2, Y2
	VANDPS Y4, Y2, Y2           // lanes below lo -> 0
	VMOVUPS Y2, (SI)
	VADDPS Y2, Y8, Y8
	ADDQ $32, SI
	DECQ CX
	JNZ loop2
reduce2:
	VEXTRACTF128 $1, Y8, X1
	VADDPS X1, X8, X0
	VHADDPS X0, X0, X0
	VHADDPS X0, X0, X0
	VZEROUPPER
	MOVSS X0, ret+24(FP)
	RET

// func expSumAVX2(x *float32, n int, sub float32) float32
// returns Σ exp(x[i]-sub) for i < n; x is not written.
// AVX2+FMA3 version of the AVX-512 kernel above: 8 lanes, n a multiple of 8.
TEXT ·expSumAVX2(SB), NOSPLIT, $0-28
	MOVQ x+0(FP), SI
	MOVQ n+8(FP), CX
	VBROADCASTSS sub+16(FP), Y15
	BCASTY(0x3fb8aa3b, Y14) // log2e
	BCASTY(0x3f318000, Y13) // c1
	BCASTY(0xb95e8083, Y12) // c2
	BCASTY(0x3f800000, Y11) // 1
	BCASTY(0xc2aeac4f, Y10) // lo
	BCASTY(0x42b17217, Y9)  // hi
	BCASTY(127, Y7)         // exponent bias
	BCASTY(0x3e2aaaaa, Y6)  // p4
	BCASTY(0x3f000000, Y5)  // p5
	VXORPS Y8, Y8, Y8       // sum
	SHRQ $3, CX
	JZ reduce2
loop2:
	VMOVUPS (SI), Y0
	VSUBPS Y15, Y0, Y0
	VMINPS Y9, Y0, Y0
	VCMPPS $0x1d, Y10, Y0, Y4   // Y4 = x >= lo (all ones)
	VMULPS Y14, Y0, Y1
	VROUNDPS $0, Y1, Y1         // fx = round(x*log2e)
	VFNMADD231PS Y13, Y1, Y0    // r = x - fx*c1
	VFNMADD231PS Y12, Y1, Y0    // r -= fx*c2
	VMOVUPS expc2<>+0(SB), Y2   // p0
	VFMADD213PS expc2<>+32(SB), Y0, Y2
	VFMADD213PS expc2<>+64(SB), Y0, Y2
	VFMADD213PS expc2<>+96(SB), Y0, Y2
	VFMADD213PS Y6, Y0, Y2
	VFMADD213PS Y5, Y0, Y2
	VMULPS Y0, Y0, Y3           // r²
	VFMADD213PS Y0, Y3, Y2      // y = y*r² + r
	VADDPS Y11, Y2, Y2          // y += 1
	VCVTPS2DQ Y1, Y1
	VPADDD Y7, Y1, Y1
	VPSLLD $23, Y1, Y1          // 2^fx
	VMULPS Y1, Y2, Y2
	VANDPS Y4, Y2, Y2           // lanes below lo -> 0
	VADDPS Y2, Y8, Y8
	ADDQ $32, SI
	DECQ CX
	JNZ loop2
reduce2:
	VEXTRACTF128 $1, Y8, X1
	VADDPS X1, X8, X0
	VHADDPS X0, X0, X0
	VHADDPS X0, X0, X0
	VZEROUPPER
	MOVSS X0, ret+24(FP)
	RET

// func maxAVX2(x *float32, n int, init float32) float32
// returns max(init, x[0:n]) for n a multiple of 8.
TEXT ·maxAVX2(SB), NOSPLIT, $0-28
	MOVQ x+0(FP), SI
	MOVQ n+8(FP), CX
	VBROADCASTSS init+16(FP), Y0
	VMOVAPS Y0, Y1
	SHRQ $3, CX
	MOVQ CX, BX
	SHRQ $1, BX
	JZ one2
pair2:
	VMAXPS (SI), Y0, Y0
	VMAXPS 32(SI), Y1, Y1
	ADDQ $64, SI
	DECQ BX
	JNZ pair2
one2:
	ANDQ $1, CX
	JZ reducem2
	VMAXPS (SI), Y0, Y0
reducem2:
	VMAXPS Y1, Y0, Y0
	VEXTRACTF128 $1, Y0, X1
	VMAXPS X1, X0, X0
	VPERMILPS $0x4e, X0, X1
	VMAXPS X1, X0, X0
	VPERMILPS $0xb1, X0, X1
	VMAXPS X1, X0, X0
	VZEROUPPER
	MOVSS X0, ret+24(FP)
	RET

// Constants of geluTanhFwdAVX2: 0.044715 and -k2 (k2 = 2·sqrt(2/π)),
// eight lanes each.
DATA geluc2<>+0(SB)/4, $0x3d372713
DATA geluc2<>+4(SB)/4, $0x3d372713
DATA geluc2<>+8(SB)/4, $0x3d372713
DATA geluc2<>+12(SB)/4, $0x3d372713
DATA geluc2<>+16(SB)/4, $0x3d372713
DATA geluc2<>+20(SB)/4, $0x3d372713
DATA geluc2<>+24(SB)/4, $0x3d372713
DATA geluc2<>+28(SB)/4, $0x3d372713
DATA geluc2<>+32(SB)/4, $0xbfcc422a
DATA geluc2<>+36(SB)/4, $0xbfcc422a
DATA geluc2<>+40(SB)/4, $0xbfcc422a
DATA geluc2<>+44(SB)/4, $0xbfcc422a
DATA geluc2<>+48(SB)/4, $0xbfcc422a
DATA geluc2<>+52(SB)/4, $0xbfcc422a
DATA geluc2<>+56(SB)/4, $0xbfcc422a
DATA geluc2<>+60(SB)/4, $0xbfcc422a
GLOBL geluc2<>(SB), RODATA|NOPTR, $64

// func geluTanhFwdAVX2(out, inp *float32, n int)
// out[i] = x·sigmoid(2u) for i < n (n a multiple of 8), fused, in the
// operation order of geluTanhForwardGo on AVX2 (whose exp is expSubAVX2):
// -2u = (-k2)·(x + ((0.044715·x)·x)·x), e = exp(-2u) as expSubAVX2 computes
// it, out = x · (1/(1+e)). Bit for bit the Go loop's result.
TEXT ·geluTanhFwdAVX2(SB), NOSPLIT, $0-24
	MOVQ out+0(FP), DI
	MOVQ inp+8(FP), SI
	MOVQ n+16(FP), CX
	BCASTY(0x3fb8aa3b, Y14) // log2e
	BCASTY(0x3f318000, Y13) // c1
	BCASTY(0xb95e8083, Y12) // c2
	BCASTY(0x3f800000, Y11) // 1
	BCASTY(0xc2aeac4f, Y10) // lo
	BCASTY(0x42b17217, Y9)  // hi
	BCASTY(127, Y7)         // exponent bias
	BCASTY(0x3e2aaaaa, Y6)  // p4
	BCASTY(0x3f000000, Y5)  // p5
	SHRQ $3, CX
	JZ gelu2done
gelu2loop:
	VMOVUPS (SI), Y4
	VMULPS geluc2<>+0(SB), Y4, Y0
	VMULPS Y4, Y0, Y0
	VMULPS Y4, Y0, Y0
	VADDPS Y0, Y4, Y0
	VMULPS geluc2<>+32(SB), Y0, Y0 // -2u
	VMINPS Y9, Y0, Y0
	VCMPPS $0x1d, Y10, Y0, Y8      // Y8 = -2u >= lo (all ones)
	VMULPS Y14, Y0, Y1
	VROUNDPS $0, Y1, Y1
	VFNMADD231PS Y13, Y1, Y0
	VFNMADD231PS Y12, Y1, Y0
	VMOVUPS expc2<>+0(SB), Y2
	VFMADD213PS expc2<>+32(SB), Y0, Y2
	VFMADD213PS expc2<>+64(SB), Y0, Y2
	VFMADD213PS expc2<>+96(SB), Y0, Y2
	VFMADD213PS Y6, Y0, Y2
	VFMADD213PS Y5, Y0, Y2
	VMULPS Y0, Y0, Y3
	VFMADD213PS Y0, Y3, Y2
	VADDPS Y11, Y2, Y2
	VCVTPS2DQ Y1, Y1
	VPADDD Y7, Y1, Y1
	VPSLLD $23, Y1, Y1
	VMULPS Y1, Y2, Y2
	VANDPS Y8, Y2, Y2              // e
	VADDPS Y11, Y2, Y2
	VDIVPS Y2, Y11, Y2             // 1/(1+e)
	VMULPS Y2, Y4, Y2
	VMOVUPS Y2, (DI)
	ADDQ $32, SI
	ADDQ $32, DI
	DECQ CX
	JNZ gelu2loop
gelu2done:
	VZEROUPPER
	RET
