//go:build amd64

#include "textflag.h"

#include "exp_amd64.h"

// SIGMOID2U sets Z2 = sigmoid(2u) = 1/(1+exp(-2u)) for the GELU-tanh
// argument u of x = Z4, in the operation order of geluTanhForwardGo:
// 2u = k2*(x + ((0.044715*x)*x)*x). Needs Z16 = sign mask, Z17 = k2,
// Z18 = 0.044715 and EXP_CONSTS; clobbers Z0, Z1, Z3, Z5, K2.
#define SIGMOID2U \
	VMULPS Z18, Z4, Z5; \
	VMULPS Z4, Z5, Z5; \
	VMULPS Z4, Z5, Z5; \
	VADDPS Z5, Z4, Z5; \
	VMULPS Z17, Z5, Z5; \
	VPXORD Z16, Z5, Z0; \
	EXP; \
	VADDPS Z21, Z2, Z2; \
	VDIVPS Z2, Z21, Z2

#define GELU_CONSTS \
	EXP_CONSTS; \
	BCAST(0x80000000, Z16); \
	BCAST(0x3fcc422a, Z17); \
	BCAST(0x3d372713, Z18)

// func geluTanhFwdAVX512(out, inp *float32, n int)
// out[i] = x*sigmoid(2u) for i < n, n a multiple of 16.
TEXT ·geluTanhFwdAVX512(SB), NOSPLIT, $0-24
	MOVQ out+0(FP), DI
	MOVQ inp+8(FP), SI
	MOVQ n+16(FP), CX
	GELU_CONSTS
	SHRQ $4, CX
	JZ done
loop:
	VMOVUPS (SI), Z4
	SIGMOID2U
	VMULPS Z2, Z4, Z2
	VMOVUPS Z2, (DI)
	ADDQ $64, SI
	ADDQ $64, DI
	DECQ CX
	JNZ loop
done:
	VZEROUPPER
	RET

// func geluTanhBwdAVX512(dinp, dout, inp *float32, n int)
// dinp[i] += dout[i] * (s + ((((2x)*s)*(1-s))*K)*(1+(c3*x)*x)), s = sigmoid(2u),
// K = sqrt(2/pi), c3 = 3*0.044715, for i < n, n a multiple of 16.
TEXT ·geluTanhBwdAVX512(SB), NOSPLIT, $0-32
	MOVQ dinp+0(FP), DI
	MOVQ dout+8(FP), R8
	MOVQ inp+16(FP), SI
	MOVQ n+24(FP), CX
	GELU_CONSTS
	BCAST(0x3f4c422a, Z15) // K
	BCAST(0x3e095d4f, Z14) // c3
	SHRQ $4, CX
	JZ done
loop:
	VMOVUPS (SI), Z4
	SIGMOID2U
	VADDPS Z4, Z4, Z5     // 2x
	VMULPS Z2, Z5, Z5     // *s
	VSUBPS Z2, Z21, Z6    // 1-s
	VMULPS Z6, Z5, Z5
	VMULPS Z15, Z5, Z5    // *K
	VMULPS Z14, Z4, Z6    // c3*x
	VMULPS Z4, Z6, Z6     // *x
	VADDPS Z21, Z6, Z6    // 1+...
	VMULPS Z6, Z5, Z5
	VADDPS Z5, Z2, Z5     // s+...
	VMULPS (R8), Z5, Z5   // dout*(...)
	VADDPS (DI), Z5, Z5   // dinp + ...
	VMOVUPS Z5, (DI)
	ADDQ $64, SI
	ADDQ $64, DI
	ADDQ $64, R8
	DECQ CX
	JNZ loop
done:
	VZEROUPPER
	RET

// func ceGradAVX512(dx, x *float32, n int, lse, scale, u float32)
// dx[i] = scale*(exp(x[i]-lse) - u) for i < n, n a multiple of 16: the
// cross-entropy gradient row without label term, in one pass.
TEXT ·ceGradAVX512(SB), NOSPLIT, $0-36
	MOVQ dx+0(FP), DI
	MOVQ x+8(FP), SI
	MOVQ n+16(FP), CX
	VBROADCASTSS lse+24(FP), Z31
	VBROADCASTSS scale+28(FP), Z17
	VBROADCASTSS u+32(FP), Z18
	EXP_CONSTS
	SHRQ $4, CX
	JZ done
loop:
	VMOVUPS (SI), Z0
	VSUBPS Z31, Z0, Z0
	EXP
	VSUBPS Z18, Z2, Z2
	VMULPS Z17, Z2, Z2
	VMOVUPS Z2, (DI)
	ADDQ $64, SI
	ADDQ $64, DI
	DECQ CX
	JNZ loop
done:
	VZEROUPPER
	RET

// func axpyAVX512(y, x *float32, n int, a float32)
// y[i] += a*x[i] for i < n, n a multiple of 16 (multiply, then add: the
// same rounding as the Go loop).
TEXT ·axpyAVX512(SB), NOSPLIT, $0-28
	MOVQ y+0(FP), DI
	MOVQ x+8(FP), SI
	MOVQ n+16(FP), CX
	VBROADCASTSS a+24(FP), Z31
	SHRQ $4, CX
	MOVQ CX, DX
	SHRQ $2, DX
	JZ tail
loop4:
	VMULPS (SI), Z31, Z0
	VMULPS 64(SI), Z31, Z1
	VMULPS 128(SI), Z31, Z2
	VMULPS 192(SI), Z31, Z3
	VADDPS (DI), Z0, Z0
	VADDPS 64(DI), Z1, Z1
	VADDPS 128(DI), Z2, Z2
	VADDPS 192(DI), Z3, Z3
	VMOVUPS Z0, (DI)
	VMOVUPS Z1, 64(DI)
	VMOVUPS Z2, 128(DI)
	VMOVUPS Z3, 192(DI)
	ADDQ $256, SI
	ADDQ $256, DI
	DECQ DX
	JNZ loop4
tail:
	ANDQ $3, CX
	JZ done
loop1:
	VMULPS (SI), Z31, Z0
	VADDPS (DI), Z0, Z0
	VMOVUPS Z0, (DI)
	ADDQ $64, SI
	ADDQ $64, DI
	DECQ CX
	JNZ loop1
done:
	VZEROUPPER
	RET

// func axpyAVX2(y, x *float32, n int, a float32)
// y[i] += a*x[i] for i < n, n a multiple of 8.
TEXT ·axpyAVX2(SB), NOSPLIT, $0-28
	MOVQ y+0(FP), DI
	MOVQ x+8(FP), SI
	MOVQ n+16(FP), CX
	VBROADCASTSS a+24(FP), Y15
	SHRQ $3, CX
	JZ done
loop:
	VMULPS (SI), Y15, Y0
	VADDPS (DI), Y0, Y0
	VMOVUPS Y0, (DI)
	ADDQ $32, SI
	ADDQ $32, DI
	DECQ CX
	JNZ loop
done:
	VZEROUPPER
	RET

// ERF_CONSTS loads, besides EXP_CONSTS, the constants of PHI: Z31 = |x|
// mask, Z8 = 1/sqrt(2), Z7 = 1/sqrt(2*pi), Z9..Z18 = c0..c9 of the
// Chebyshev fit erfc(z) = t*exp(-z*z + c0 + t*(c1 + ... + t*c9)),
// t = 1/(1+z/2), whose relative error is below 1.2e-7 for every z >= 0
// (Numerical Recipes' erfcc): relative accuracy in both tails, so
// x*Phi(x) keeps it for large negative x where 1+erf(x) would cancel.
#define ERF_CONSTS \
	EXP_CONSTS; \
	BCAST(0x7fffffff, Z31); \
	BCAST(0x3f3504f3, Z8); \
	BCAST(0x3ecc422a, Z7); \
	BCAST(0xbfa1fc4e, Z9); \
	BCAST(0x3f8000c7, Z10); \
	BCAST(0x3ebf88fb, Z11); \
	BCAST(0x3dc636c9, Z12); \
	BCAST(0xbe3ec24c, Z13); \
	BCAST(0x3e8ec7cc, Z14); \
	BCAST(0xbf914e5d, Z15); \
	BCAST(0x3fbe87b0, Z16); \
	BCAST(0xbf527892, Z17); \
	BCAST(0x3e2ef945, Z18)

// PHI sets Z6 = Phi(x) (the normal CDF) of x = Z4, clobbering Z0..Z3, Z5,
// K2, K3: 0.5*erfc(z) below zero, 1 - that above, z = |x|/sqrt(2). The
// exponent's -z*z is formed as -(x/2)*x in one rounding: its error, times
// z*z, is the kernel's error in the tails.
#define PHI \
	VPANDD Z31, Z4, Z5; \
	VMULPS Z8, Z5, Z5; \
	VMULPS Z22, Z5, Z6; \
	VADDPS Z21, Z6, Z6; \
	VDIVPS Z6, Z21, Z6; \
	VMOVAPS Z18, Z0; \
	VFMADD213PS Z17, Z6, Z0; \
	VFMADD213PS Z16, Z6, Z0; \
	VFMADD213PS Z15, Z6, Z0; \
	VFMADD213PS Z14, Z6, Z0; \
	VFMADD213PS Z13, Z6, Z0; \
	VFMADD213PS Z12, Z6, Z0; \
	VFMADD213PS Z11, Z6, Z0; \
	VFMADD213PS Z10, Z6, Z0; \
	VFMADD213PS Z9, Z6, Z0; \
	VMULPS Z22, Z4, Z3; \
	VFNMADD231PS Z3, Z4, Z0; \
	EXP; \
	VMULPS Z6, Z2, Z2; \
	VMULPS Z22, Z2, Z2; \
	VPXORD Z3, Z3, Z3; \
	VCMPPS $0x11, Z3, Z4, K3; \
	VSUBPS Z2, Z21, Z6; \
	VMOVAPS Z2, K3, Z6

// func geluErfFwdAVX512(out, inp *float32, n int)
// out[i] = x*Phi(x) for i < n, n a multiple of 16.
TEXT ·geluErfFwdAVX512(SB), NOSPLIT, $0-24
	MOVQ out+0(FP), DI
	MOVQ inp+8(FP), SI
	MOVQ n+16(FP), CX
	ERF_CONSTS
	SHRQ $4, CX
	JZ done
loop:
	VMOVUPS (SI), Z4
	PHI
	VMULPS Z6, Z4, Z6
	VMOVUPS Z6, (DI)
	ADDQ $64, SI
	ADDQ $64, DI
	DECQ CX
	JNZ loop
done:
	VZEROUPPER
	RET

// func geluErfBwdAVX512(dinp, dout, inp *float32, n int)
// dinp[i] += dout[i] * (Phi(x) + x*exp(-x*x/2)/sqrt(2*pi)) for i < n, n a
// multiple of 16.
TEXT ·geluErfBwdAVX512(SB), NOSPLIT, $0-32
	MOVQ dinp+0(FP), DI
	MOVQ dout+8(FP), R8
	MOVQ inp+16(FP), SI
	MOVQ n+24(FP), CX
	ERF_CONSTS
	SHRQ $4, CX
	JZ done
loop:
	VMOVUPS (SI), Z4
	PHI
	VMULPS Z22, Z4, Z3
	VPXORD Z0, Z0, Z0
	VFNMADD231PS Z3, Z4, Z0 // -(x/2)*x, rounded once
	EXP
	VMULPS Z7, Z2, Z2
	VMULPS Z4, Z2, Z2
	VADDPS Z2, Z6, Z6
	VMULPS (R8), Z6, Z6
	VADDPS (DI), Z6, Z6
	VMOVUPS Z6, (DI)
	ADDQ $64, SI
	ADDQ $64, DI
	ADDQ $64, R8
	DECQ CX
	JNZ loop
done:
	VZEROUPPER
	RET

// SIGMOID sets Z2 = 1/(1+exp(-x)) for x = Z4 in sigmoidOf's operation
// order (Z16 = sign mask), clobbering Z0, Z1, Z3, K2.
#define SIGMOID \
	VPXORD Z16, Z4, Z0; \
	EXP; \
	VADDPS Z21, Z2, Z2; \
	VDIVPS Z2, Z21, Z2

// func siluFwdAVX512(out, inp *float32, n int)
// out[i] = x*sigmoid(x) for i < n, n a multiple of 16.
TEXT ·siluFwdAVX512(SB), NOSPLIT, $0-24
	MOVQ out+0(FP), DI
	MOVQ inp+8(FP), SI
	MOVQ n+16(FP), CX
	EXP_CONSTS
	BCAST(0x80000000, Z16)
	SHRQ $4, CX
	JZ done
loop:
	VMOVUPS (SI), Z4
	SIGMOID
	VMULPS Z2, Z4, Z2
	VMOVUPS Z2, (DI)
	ADDQ $64, SI
	ADDQ $64, DI
	DECQ CX
	JNZ loop
done:
	VZEROUPPER
	RET

// func siluBwdAVX512(dinp, dout, inp *float32, n int)
// dinp[i] += (dout*s)*(1 + x*(1-s)), s = sigmoid(x), for i < n, n a
// multiple of 16.
TEXT ·siluBwdAVX512(SB), NOSPLIT, $0-32
	MOVQ dinp+0(FP), DI
	MOVQ dout+8(FP), R8
	MOVQ inp+16(FP), SI
	MOVQ n+24(FP), CX
	EXP_CONSTS
	BCAST(0x80000000, Z16)
	SHRQ $4, CX
	JZ done
loop:
	VMOVUPS (SI), Z4
	SIGMOID
	VSUBPS Z2, Z21, Z5    // 1-s
	VMULPS Z5, Z4, Z5     // x*(1-s)
	VADDPS Z21, Z5, Z5    // 1+...
	VMULPS (R8), Z2, Z6   // dout*s
	VMULPS Z5, Z6, Z6
	VADDPS (DI), Z6, Z6
	VMOVUPS Z6, (DI)
	ADDQ $64, SI
	ADDQ $64, DI
	ADDQ $64, R8
	DECQ CX
	JNZ loop
done:
	VZEROUPPER
	RET

// func swigluFwdAVX512(out, gate, up *float32, n int)
// out[i] = (x*sigmoid(x))*up[i], x = gate[i], for i < n, n a multiple of 16.
TEXT ·swigluFwdAVX512(SB), NOSPLIT, $0-32
	MOVQ out+0(FP), DI
	MOVQ gate+8(FP), SI
	MOVQ up+16(FP), R8
	MOVQ n+24(FP), CX
	EXP_CONSTS
	BCAST(0x80000000, Z16)
	SHRQ $4, CX
	JZ done
loop:
	VMOVUPS (SI), Z4
	SIGMOID
	VMULPS Z2, Z4, Z2
	VMULPS (R8), Z2, Z2
	VMOVUPS Z2, (DI)
	ADDQ $64, SI
	ADDQ $64, DI
	ADDQ $64, R8
	DECQ CX
	JNZ loop
done:
	VZEROUPPER
	RET

// func swigluBwdAVX512(dgate, dup, dout, gate, up *float32, n int)
// dgate[i] += ((dout*up)*s)*(1 + x*(1-s)) and dup[i] += (dout*x)*s,
// x = gate[i], s = sigmoid(x), for i < n, n a multiple of 16.
TEXT ·swigluBwdAVX512(SB), NOSPLIT, $0-48
	MOVQ dgate+0(FP), DI
	MOVQ dup+8(FP), DX
	MOVQ dout+16(FP), R8
	MOVQ gate+24(FP), SI
	MOVQ up+32(FP), R9
	MOVQ n+40(FP), CX
	EXP_CONSTS
	BCAST(0x80000000, Z16)
	SHRQ $4, CX
	JZ done
loop:
	VMOVUPS (SI), Z4
	SIGMOID
	VMOVUPS (R8), Z7      // dout
	VSUBPS Z2, Z21, Z5    // 1-s
	VMULPS Z5, Z4, Z5     // x*(1-s)
	VADDPS Z21, Z5, Z5    // 1+...
	VMULPS (R9), Z7, Z6   // dout*up
	VMULPS Z2, Z6, Z6     // *s
	VMULPS Z5, Z6, Z6
	VADDPS (DI), Z6, Z6
	VMOVUPS Z6, (DI)
	VMULPS Z4, Z7, Z6     // dout*x
	VMULPS Z2, Z6, Z6     // *s
	VADDPS (DX), Z6, Z6
	VMOVUPS Z6, (DX)
	ADDQ $64, SI
	ADDQ $64, DI
	ADDQ $64, DX
	ADDQ $64, R8
	ADDQ $64, R9
	DECQ CX
	JNZ loop
done:
	VZEROUPPER
	RET

// func addAVX512(out, a, b *float32, n int)
// out[i] = a[i] + b[i] for i < n, n a multiple of 16.
TEXT ·addAVX512(SB), NOSPLIT, $0-32
	MOVQ out+0(FP), DI
	MOVQ a+8(FP), SI
	MOVQ b+16(FP), R8
	MOVQ n+24(FP), CX
	SHRQ $4, CX
	JZ done
loop:
	VMOVUPS (SI), Z0
	VADDPS (R8), Z0, Z0
	VMOVUPS Z0, (DI)
	ADDQ $64, SI
	ADDQ $64, DI
	ADDQ $64, R8
	DECQ CX
	JNZ loop
done:
	VZEROUPPER
	RET

// func addAVX2(out, a, b *float32, n int)
// out[i] = a[i] + b[i] for i < n, n a multiple of 8.
TEXT ·addAVX2(SB), NOSPLIT, $0-32
	MOVQ out+0(FP), DI
	MOVQ a+8(FP), SI
	MOVQ b+16(FP), R8
	MOVQ n+24(FP), CX
	SHRQ $3, CX
	JZ done
loop:
	VMOVUPS (SI), Y0
	VADDPS (R8), Y0, Y0
	VMOVUPS Y0, (DI)
	ADDQ $32, SI
	ADDQ $32, DI
	ADDQ $32, R8
	DECQ CX
	JNZ loop
done:
	VZEROUPPER
	RET

// func lnParamGradAVX512(dw, dy, x *float32, n int, mean, rstd float32)
// dw[i] += (dy[i]*(x[i]-mean))*rstd for i < n, n a multiple of 16: one row's
// share of LayerNorm's weight gradient.
TEXT ·lnParamGradAVX512(SB), NOSPLIT, $0-40
	MOVQ dw+0(FP), DI
	MOVQ dy+8(FP), R8
	MOVQ x+16(FP), SI
	MOVQ n+24(FP), CX
	VBROADCASTSS mean+32(FP), Z30
	VBROADCASTSS rstd+36(FP), Z31
	SHRQ $4, CX
	JZ done
loop:
	VMOVUPS (SI), Z0
	VSUBPS Z30, Z0, Z0
	VMULPS (R8), Z0, Z0
	VMULPS Z31, Z0, Z0
	VADDPS (DI), Z0, Z0
	VMOVUPS Z0, (DI)
	ADDQ $64, SI
	ADDQ $64, DI
	ADDQ $64, R8
	DECQ CX
	JNZ loop
done:
	VZEROUPPER
	RET

// func dotF64AVX2(a, b *float32, n int, acc *[16]float64)
// Lanes i mod 16: Y0 holds 0..3, Y1 4..7, Y2 8..11, Y3 12..15; each
// float32 pair is widened to float64 and fused-multiply-added.
TEXT ·dotF64AVX2(SB), NOSPLIT, $0-32
	MOVQ a+0(FP), SI
	MOVQ b+8(FP), DI
	MOVQ n+16(FP), CX
	MOVQ acc+24(FP), DX
	VXORPD Y0, Y0, Y0
	VXORPD Y1, Y1, Y1
	VXORPD Y2, Y2, Y2
	VXORPD Y3, Y3, Y3
	SHRQ $4, CX
	JZ dotdone
dotloop:
	VCVTPS2PD (SI), Y4
	VCVTPS2PD (DI), Y8
	VFMADD231PD Y8, Y4, Y0
	VCVTPS2PD 16(SI), Y5
	VCVTPS2PD 16(DI), Y9
	VFMADD231PD Y9, Y5, Y1
	VCVTPS2PD 32(SI), Y6
	VCVTPS2PD 32(DI), Y10
	VFMADD231PD Y10, Y6, Y2
	VCVTPS2PD 48(SI), Y7
	VCVTPS2PD 48(DI), Y11
	VFMADD231PD Y11, Y7, Y3
	ADDQ $64, SI
	ADDQ $64, DI
	DECQ CX
	JNZ dotloop
dotdone:
	VMOVUPD Y0, (DX)
	VMOVUPD Y1, 32(DX)
	VMOVUPD Y2, 64(DX)
	VMOVUPD Y3, 96(DX)
	VZEROUPPER
	RET

// func dotsF64AVX2(q, k *float32, d, ldk, n int, scale float64, out *float64)
// For j < n: out[j] = DotF64(q[:d], key j)·scale, key j at k + j·ldk
// bytes, d a multiple of 16: each key's 16 lanes accumulate as in
// dotF64AVX2, then 0 + lane 0 + lane 1 + … + lane 15 in that order (as
// DotF64 sums them), then the product with scale.
TEXT ·dotsF64AVX2(SB), NOSPLIT, $0-56
	MOVQ q+0(FP), SI
	MOVQ k+8(FP), DI
	MOVQ d+16(FP), BX
	SHRQ $4, BX
	MOVQ ldk+24(FP), R8
	MOVQ n+32(FP), CX
	VMOVSD scale+40(FP), X15
	MOVQ out+48(FP), DX
	TESTQ CX, CX
	JZ dotsdone
	TESTQ BX, BX
	JZ dotsdone
dotskey:
	VXORPD Y0, Y0, Y0
	VXORPD Y1, Y1, Y1
	VXORPD Y2, Y2, Y2
	VXORPD Y3, Y3, Y3
	MOVQ SI, R9
	MOVQ DI, R10
	MOVQ BX, R11
dotschunk:
	VCVTPS2PD (R9), Y4
	VCVTPS2PD (R10), Y8
	VFMADD231PD Y8, Y4, Y0
	VCVTPS2PD 16(R9), Y5
	VCVTPS2PD 16(R10), Y9
	VFMADD231PD Y9, Y5, Y1
	VCVTPS2PD 32(R9), Y6
	VCVTPS2PD 32(R10), Y10
	VFMADD231PD Y10, Y6, Y2
	VCVTPS2PD 48(R9), Y7
	VCVTPS2PD 48(R10), Y11
	VFMADD231PD Y11, Y7, Y3
	ADDQ $64, R9
	ADDQ $64, R10
	DECQ R11
	JNZ dotschunk
	VXORPD X12, X12, X12
	VADDSD X0, X12, X12
	VPERMILPD $1, X0, X5
	VADDSD X5, X12, X12
	VEXTRACTF128 $1, Y0, X6
	VADDSD X6, X12, X12
	VPERMILPD $1, X6, X5
	VADDSD X5, X12, X12
	VADDSD X1, X12, X12
	VPERMILPD $1, X1, X5
	VADDSD X5, X12, X12
	VEXTRACTF128 $1, Y1, X6
	VADDSD X6, X12, X12
	VPERMILPD $1, X6, X5
	VADDSD X5, X12, X12
	VADDSD X2, X12, X12
	VPERMILPD $1, X2, X5
	VADDSD X5, X12, X12
	VEXTRACTF128 $1, Y2, X6
	VADDSD X6, X12, X12
	VPERMILPD $1, X6, X5
	VADDSD X5, X12, X12
	VADDSD X3, X12, X12
	VPERMILPD $1, X3, X5
	VADDSD X5, X12, X12
	VEXTRACTF128 $1, Y3, X6
	VADDSD X6, X12, X12
	VPERMILPD $1, X6, X5
	VADDSD X5, X12, X12
	VMULSD X15, X12, X12
	VMOVSD X12, (DX)
	ADDQ $8, DX
	ADDQ R8, DI
	DECQ CX
	JNZ dotskey
dotsdone:
	VZEROUPPER
	RET

// func axpysAVX2(y, x *float32, d, ldx, n int, w *float32)
// For j = 0 … n-1 in order, y[i] += w[j]·x_j[i] for i < d, row x_j at
// x + j·ldx bytes, d a multiple of 16: multiply, then add, as axpyAVX2, so
// each element gets the same bits as n calls of Axpy. y is held in
// registers, 64 (then 16) floats at a time, across all n rows.
TEXT ·axpysAVX2(SB), NOSPLIT, $0-48
	MOVQ y+0(FP), DI
	MOVQ x+8(FP), SI
	MOVQ d+16(FP), BX
	MOVQ ldx+24(FP), R8
	MOVQ n+32(FP), CX
	MOVQ w+40(FP), DX
	TESTQ CX, CX
	JZ axpysdone
axpyswide:
	CMPQ BX, $64
	JLT axpysnarrow
	VMOVUPS (DI), Y0
	VMOVUPS 32(DI), Y1
	VMOVUPS 64(DI), Y2
	VMOVUPS 96(DI), Y3
	VMOVUPS 128(DI), Y4
	VMOVUPS 160(DI), Y5
	VMOVUPS 192(DI), Y6
	VMOVUPS 224(DI), Y7
	MOVQ SI, R9
	MOVQ DX, R10
	MOVQ CX, R11
axpyswloop:
	VBROADCASTSS (R10), Y15
	VMULPS (R9), Y15, Y8
	VMULPS 32(R9), Y15, Y9
	VMULPS 64(R9), Y15, Y10
	VMULPS 96(R9), Y15, Y11
	VADDPS Y8, Y0, Y0
	VADDPS Y9, Y1, Y1
	VADDPS Y10, Y2, Y2
	VADDPS Y11, Y3, Y3
	VMULPS 128(R9), Y15, Y12
	VMULPS 160(R9), Y15, Y13
	VMULPS 192(R9), Y15, Y14
	VMULPS 224(R9), Y15, Y8
	VADDPS Y12, Y4, Y4
	VADDPS Y13, Y5, Y5
	VADDPS Y14, Y6, Y6
	VADDPS Y8, Y7, Y7
	ADDQ R8, R9
	ADDQ $4, R10
	DECQ R11
	JNZ axpyswloop
	VMOVUPS Y0, (DI)
	VMOVUPS Y1, 32(DI)
	VMOVUPS Y2, 64(DI)
	VMOVUPS Y3, 96(DI)
	VMOVUPS Y4, 128(DI)
	VMOVUPS Y5, 160(DI)
	VMOVUPS Y6, 192(DI)
	VMOVUPS Y7, 224(DI)
	ADDQ $256, DI
	ADDQ $256, SI
	SUBQ $64, BX
	JMP axpyswide
axpysnarrow:
	TESTQ BX, BX
	JZ axpysdone
	VMOVUPS (DI), Y0
	VMOVUPS 32(DI), Y1
	MOVQ SI, R9
	MOVQ DX, R10
	MOVQ CX, R11
axpysnloop:
	VBROADCASTSS (R10), Y15
	VMULPS (R9), Y15, Y8
	VMULPS 32(R9), Y15, Y9
	VADDPS Y8, Y0, Y0
	VADDPS Y9, Y1, Y1
	ADDQ R8, R9
	ADDQ $4, R10
	DECQ R11
	JNZ axpysnloop
	VMOVUPS Y0, (DI)
	VMOVUPS Y1, 32(DI)
	ADDQ $64, DI
	ADDQ $64, SI
	SUBQ $16, BX
	JMP axpysnarrow
axpysdone:
	VZEROUPPER
	RET
