package hf

import (
	"fmt"

	"github.com/gotron/gotron/model/gpt"
)

// op is how one gotron parameter is assembled from Hugging Face tensors (and
// split back). Every op but opPlusOne is a pure permutation of values (plus
// zero rows for vocabulary padding), so a round trip reproduces the Hugging
// Face bytes.
type op int

const (
	// opCopy: same shape, same layout.
	opCopy op = iota
	// opTranspose: HF Conv1D weight (in, out), y = x·W + b  ↔  gotron Linear
	// weight (out, in), y = x·Wᵀ + b. GPT-2 stores every linear this way.
	opTranspose
	// opPadVocab: HF (V, h)  ↔  gotron (V_padded, h); the padded rows are zero
	// on import and dropped on export.
	opPadVocab
	// opGPT2QKV: HF c_attn.weight (h, 3·a·d), columns [q heads | k heads | v
	// heads]  ↔  gotron linear_qkv.weight (a·3·d, h), rows per head j:
	// [q_j (d); k_j (d); v_j (d)] (Megatron's per-query-group layout with
	// g = a groups of one query head).
	opGPT2QKV
	// opGPT2QKVBias: c_attn.bias (3·a·d) [q | k | v]  ↔  per head [q_j; k_j; v_j].
	opGPT2QKVBias
	// opLlamaQKV: HF q_proj (a·d, h), k_proj (g·d, h), v_proj (g·d, h)  ↔
	// gotron linear_qkv.weight (g·(r+2)·d, h), rows per query group j:
	// [q heads j·r … j·r+r−1 (r·d); k_j (d); v_j (d)], r = a/g. HF's q/k rows
	// are already in rotate-half order (its conversion script permuted Meta's
	// interleaved layout), and gotron rotates halves too: no permutation.
	opLlamaQKV
	// opLlamaQKVBias: HF q_proj.bias (a·d), k_proj.bias (g·d), v_proj.bias
	// (g·d) (Qwen's)  ↔  gotron linear_qkv.bias, per group j [q of j; k_j; v_j].
	opLlamaQKVBias
	// opSwiGLU: HF gate_proj (f, h), up_proj (f, h)  ↔  gotron linear_fc1
	// (2·f, h) rows [gate; up].
	opSwiGLU
	// opGatedQKV (Qwen3-Next's gated attention): HF q_proj (a·2d, h) rows
	// per head [q_i (d); gate_i (d)], k_proj, v_proj (g·d, h)  ↔  gotron
	// linear_qkv.weight with --attention-output-gate, rows per query group
	// j: [q of heads j·r…j·r+r−1 (r·d); their gates (r·d); k_j; v_j].
	opGatedQKV
	// opGDNInProj (Qwen3-Next's gated delta net): HF in_proj_qkvz
	// (nk·(2dk+2r·dv), h) rows per key head j [q_j (dk); k_j (dk); v (r·dv);
	// z (r·dv)] of j's r = nv/nk value heads, in_proj_ba (2nv, h) rows per
	// key head j [b (r); a (r)]  ↔  gotron's in_proj sections query, key,
	// value, z, beta, alpha concatenated (Megatron's fused in_proj rows).
	opGDNInProj
	// opPlusOne: HF w = 1 + gotron γ (a norm weight that is the scale itself
	// on the Hugging Face side, 1 + γ under --apply-layernorm-1p in gotron).
	// Not a permutation: exact when w − 1 is (w in [0.5, 2]).
	opPlusOne
)

// dims are the sizes the ops need.
type dims struct {
	h, a, g, d     int // hidden, attention heads, query groups, head dim
	nk, nv, dk, dv int // gated delta net key heads, value heads, key and value head dims
}

// dimsOf is the ops' sizes for model config c.
func dimsOf(c gpt.Config) dims {
	g := c.GDN
	return dims{h: c.HiddenSize, a: c.NumAttentionHeads, g: c.NumQueryGroups, d: c.KVChannels,
		nk: g.NumKeyHeads, nv: g.NumValueHeads, dk: g.KeyHeadDim, dv: g.ValueHeadDim}
}

// rowBlock moves n rows of an HF tensor (src, from row at) to row to of
// the gotron parameter: the ops that shuffle rows are lists of them.
type rowBlock struct{ src, at, to, n int }

// blocks is the row moves of opGatedQKV and opGDNInProj.
func (o op) blocks(dm dims) []rowBlock {
	var b []rowBlock
	to := 0
	add := func(src, at, n int) {
		b = append(b, rowBlock{src, at, to, n})
		to += n
	}
	switch o {
	case opGatedQKV:
		r, d := dm.a/dm.g, dm.d
		for j := range dm.g {
			for i := range r {
				add(0, (j*r+i)*2*d, d)
			}
			for i := range r {
				add(0, (j*r+i)*2*d+d, d)
			}
			add(1, j*d, d)
			add(2, j*d, d)
		}
	case opGDNInProj:
		r := dm.nv / dm.nk
		per := 2*dm.dk + 2*r*dm.dv
		for _, part := range []struct{ src, off, n, stride int }{
			{0, 0, dm.dk, per}, {0, dm.dk, dm.dk, per}, {0, 2 * dm.dk, r * dm.dv, per}, {0, 2*dm.dk + r*dm.dv, r * dm.dv, per},
			{1, 0, r, 2 * r}, {1, r, r, 2 * r}} {
			for j := range dm.nk {
				add(part.src, j*part.stride+part.off, part.n)
			}
		}
	}
	return b
}

// toGotron fills dst (the gotron parameter, row-major) from the Hugging Face
// tensors src (row-major float32, of the given shapes).
func (o op) toGotron(dm dims, dst []float32, src [][]float32, shapes [][]int) {
	switch o {
	case opCopy:
		copy(dst, src[0])
	case opTranspose:
		transposeInto(dst, src[0], shapes[0][0]) // (in, out) → (out, in)
	case opPadVocab:
		n := copy(dst, src[0])
		clear(dst[n:])
	case opGPT2QKV:
		// src (h, 3·a·d) → t (3·a·d, h) = [q (a·d rows); k; v] → per head.
		h, a, d := dm.h, dm.a, dm.d
		t := make([]float32, len(src[0]))
		transposeInto(t, src[0], h)
		fuseQKV(dst, t[:a*d*h], t[a*d*h:2*a*d*h], t[2*a*d*h:], a, 1, d, h)
	case opGPT2QKVBias:
		a, d := dm.a, dm.d
		b := src[0]
		fuseQKV(dst, b[:a*d], b[a*d:2*a*d], b[2*a*d:], a, 1, d, 1)
	case opLlamaQKV:
		fuseQKV(dst, src[0], src[1], src[2], dm.g, dm.a/dm.g, dm.d, dm.h)
	case opLlamaQKVBias:
		fuseQKV(dst, src[0], src[1], src[2], dm.g, dm.a/dm.g, dm.d, 1)
	case opSwiGLU:
		n := copy(dst, src[0])
		copy(dst[n:], src[1])
	case opGatedQKV, opGDNInProj:
		w := dm.h
		for _, b := range o.blocks(dm) {
			copy(dst[b.to*w:(b.to+b.n)*w], src[b.src][b.at*w:(b.at+b.n)*w])
		}
	case opPlusOne:
		for i, x := range src[0] {
			dst[i] = x - 1
		}
	default:
		panic(fmt.Sprintf("hf: unknown op %d", o))
	}
}

// toHF splits src (a gotron parameter) into the Hugging Face tensors dst,
// allocated by the caller with the given shapes.
func (o op) toHF(dm dims, dst [][]float32, src []float32, shapes [][]int) {
	switch o {
	case opCopy:
		copy(dst[0], src)
	case opTranspose:
		transposeInto(dst[0], src, shapes[0][1]) // (out, in) → (in, out)
	case opPadVocab:
		copy(dst[0], src[:len(dst[0])])
	case opGPT2QKV:
		h, a, d := dm.h, dm.a, dm.d
		t := make([]float32, len(src))
		splitQKV(src, t[:a*d*h], t[a*d*h:2*a*d*h], t[2*a*d*h:], a, 1, d, h)
		transposeInto(dst[0], t, 3*a*d) // (3ad, h) → (h, 3ad)
	case opGPT2QKVBias:
		a, d := dm.a, dm.d
		b := dst[0]
		splitQKV(src, b[:a*d], b[a*d:2*a*d], b[2*a*d:], a, 1, d, 1)
	case opLlamaQKV:
		splitQKV(src, dst[0], dst[1], dst[2], dm.g, dm.a/dm.g, dm.d, dm.h)
	case opLlamaQKVBias:
		splitQKV(src, dst[0], dst[1], dst[2], dm.g, dm.a/dm.g, dm.d, 1)
	case opSwiGLU:
		n := copy(dst[0], src)
		copy(dst[1], src[n:])
	case opGatedQKV, opGDNInProj:
		w := dm.h
		for _, b := range o.blocks(dm) {
			copy(dst[b.src][b.at*w:(b.at+b.n)*w], src[b.to*w:(b.to+b.n)*w])
		}
	case opPlusOne:
		for i, x := range src {
			dst[0][i] = x + 1
		}
	default:
		panic(fmt.Sprintf("hf: unknown op %d", o))
	}
}

// transposeInto writes the transpose of src, a (rows, len/rows) matrix, into
// dst, (len/rows, rows).
func transposeInto(dst, src []float32, rows int) {
	cols := len(src) / rows
	for i := range rows {
		for j := range cols {
			dst[j*rows+i] = src[i*cols+j]
		}
	}
}

// fuseQKV interleaves q (g·r·d rows), k (g·d rows) and v (g·d rows), each row
// of width w, into qkv: per group j, [q rows of heads j·r…j·r+r−1; k_j; v_j].
func fuseQKV(qkv, q, k, v []float32, g, r, d, w int) {
	qn, kn := r*d*w, d*w // floats per group
	o := 0
	for j := range g {
		o += copy(qkv[o:], q[j*qn:(j+1)*qn])
		o += copy(qkv[o:], k[j*kn:(j+1)*kn])
		o += copy(qkv[o:], v[j*kn:(j+1)*kn])
	}
}

// splitQKV is fuseQKV's inverse.
func splitQKV(qkv, q, k, v []float32, g, r, d, w int) {
	qn, kn := r*d*w, d*w
	o := 0
	for j := range g {
		o += copy(q[j*qn:(j+1)*qn], qkv[o:o+qn])
		o += copy(k[j*kn:(j+1)*kn], qkv[o:o+kn])
		o += copy(v[j*kn:(j+1)*kn], qkv[o:o+kn])
	}
}
