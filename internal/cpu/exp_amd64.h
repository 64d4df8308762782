// Shared by attention_amd64.s and elem_amd64.s: one definition of the
// AVX-512 exp, so every kernel that uses it gives the same bits.

#define BCAST(bits, Z) MOVL $bits, AX; VPBROADCASTD AX, Z

// EXP_CONSTS loads the constants of the Cephes expf (log2e, the split ln 2,
// the degree-6 polynomial, 1, the range limits) into Z19..Z30; EXP computes
// Z2 = exp(Z0), clobbering Z0, Z1, Z3 and K2. Lanes below -87.33654
// (including -Inf) become exactly 0.
#define EXP_CONSTS \
	BCAST(0x3fb8aa3b, Z30); \
	BCAST(0x3f318000, Z29); \
	BCAST(0xb95e8083, Z28); \
	BCAST(0x39506967, Z27); \
	BCAST(0x3ab743ce, Z26); \
	BCAST(0x3c088908, Z25); \
	BCAST(0x3d2aa9c1, Z24); \
	BCAST(0x3e2aaaaa, Z23); \
	BCAST(0x3f000000, Z22); \
	BCAST(0x3f800000, Z21); \
	BCAST(0xc2aeac4f, Z20); \
	BCAST(0x42b17217, Z19)

#define EXP \
	VMINPS Z19, Z0, Z0; \
	VCMPPS $0x1d, Z20, Z0, K2; \
	VMULPS Z30, Z0, Z1; \
	VRNDSCALEPS $0, Z1, Z1; \
	VFNMADD231PS Z29, Z1, Z0; \
	VFNMADD231PS Z28, Z1, Z0; \
	VMOVAPS Z27, Z2; \
	VFMADD213PS Z26, Z0, Z2; \
	VFMADD213PS Z25, Z0, Z2; \
	VFMADD213PS Z24, Z0, Z2; \
	VFMADD213PS Z23, Z0, Z2; \
	VFMADD213PS Z22, Z0, Z2; \
	VMULPS Z0, Z0, Z3; \
	VFMADD213PS Z0, Z3, Z2; \
	VADDPS Z21, Z2, Z2; \
	VSCALEFPS.Z Z1, Z2, K2, Z2
