package comm

import (
	"fmt"

	"github.com/gotron/gotron/tensor"
)

// This file holds the reduction kernels every backend shares. They are plain
// loops (the compiler vectorises none of them; they run at memory speed for
// large buffers anyway). reduceRef in reduce_test.go is the element-at-a-time
// specification they are tested against.

// blockElems is the block ReduceN accumulates in a stack-sized scratch
// buffer, so each source is streamed once and the partial result stays in L1.
const blockElems = 1024

type number interface {
	~float32 | ~int32 | ~int64
}

// CheckReduce returns an error if op is unknown or dst and src differ in
// dtype or length.
func CheckReduce(dst, src Buffer, op ReduceOp) error {
	if !op.Valid() {
		return fmt.Errorf("unknown reduce op %d", int(op))
	}
	if dst.DType != src.DType {
		return fmt.Errorf("%w: dtype %s vs %s", ErrMismatch, dst.DType, src.DType)
	}
	if len(dst.Data) != len(src.Data) {
		return fmt.Errorf("%w: %d vs %d elements", ErrMismatch, dst.Len(), src.Len())
	}
	return dst.Check()
}

// Accumulate sets dst[i] = dst[i] op src[i]. Avg accumulates like Sum (the
// caller divides once at the end with DivideBy). BFloat16 elements are
// widened to float32, combined and rounded to nearest even. dst and src must
// have the same dtype and length (see CheckReduce); otherwise it panics.
func Accumulate(dst, src Buffer, op ReduceOp) {
	if err := CheckReduce(dst, src, op); err != nil {
		panic("comm.Accumulate: " + err.Error())
	}
	switch dst.DType {
	case tensor.Float32:
		accumulate(dst.Float32(), src.Float32(), op)
	case tensor.Int32:
		accumulate(dst.Int32(), src.Int32(), op)
	case tensor.Int64:
		accumulate(dst.Int64(), src.Int64(), op)
	case tensor.BFloat16:
		d, s := dst.BFloat16(), src.BFloat16()
		for i := range d {
			d[i] = tensor.Float32ToBFloat16(combine(tensor.BFloat16ToFloat32(d[i]), tensor.BFloat16ToFloat32(s[i]), op))
		}
	}
}

func combine[T number](a, b T, op ReduceOp) T {
	switch op {
	case Max:
		if b > a {
			return b
		}
		return a
	case Min:
		if b < a {
			return b
		}
		return a
	}
	return a + b
}

// ntMinBytes is the output size (all destinations together) from which
// ReduceNTo sums float32 with non-temporal stores (sumToNT): twice this
// machine's per-core L2, past which the result is evicted before it is read
// again anyway (Go's memmove streams copies from 1 MiB on for the same
// reason).
const ntMinBytes = 4 << 20

// sumF32Ref sets every dsts[k][i], lo ≤ i < hi, to srcs[0][i] + srcs[1][i]
// + ... in that order, divided by div when div != 0: the reference of
// sumF32NT (reduce_amd64.s) and the head and tail around its aligned body.
func sumF32Ref(dsts, srcs []Buffer, lo, hi int, div float32) {
	for i := lo; i < hi; i++ {
		v := srcs[0].Float32()[i]
		for _, s := range srcs[1:] {
			v += s.Float32()[i]
		}
		if div != 0 {
			v /= div
		}
		for _, d := range dsts {
			d.Float32()[i] = v
		}
	}
}

// addF32Ref is the reference of addF32 (reduce_amd64.s).
func addF32Ref(d, s []float32) {
	s = s[:len(d)]
	for i := range d {
		d[i] += s[i]
	}
}

func accumulate[T number](d, s []T, op ReduceOp) {
	s = s[:len(d)]
	if f, ok := any(d).([]float32); ok && (op == Sum || op == Avg) {
		addF32(f, any(s).([]float32))
		return
	}
	switch op {
	case Sum, Avg:
		for i := range d {
			d[i] += s[i]
		}
	case Max:
		for i := range d {
			if s[i] > d[i] {
				d[i] = s[i]
			}
		}
	case Min:
		for i := range d {
			if s[i] < d[i] {
				d[i] = s[i]
			}
		}
	}
}

// DivideBy divides every element by n (the last step of Avg). Integers
// truncate toward zero; bfloat16 is divided in float32 and rounded.
func DivideBy(buf Buffer, n int) {
	switch buf.DType {
	case tensor.Float32:
		f := float32(n)
		for i, v := range buf.Float32() {
			buf.Float32()[i] = v / f
		}
	case tensor.Int32:
		s := buf.Int32()
		for i := range s {
			s[i] /= int32(n)
		}
	case tensor.Int64:
		s := buf.Int64()
		for i := range s {
			s[i] /= int64(n)
		}
	case tensor.BFloat16:
		s, f := buf.BFloat16(), float32(n)
		for i := range s {
			s[i] = tensor.Float32ToBFloat16(tensor.BFloat16ToFloat32(s[i]) / f)
		}
	}
}

// ReduceN sets dst to the elementwise reduction of srcs, combined in slice
// order (((s0 op s1) op s2) ...), so the result does not depend on timing.
// Avg divides the sum by len(srcs) once at the end. BFloat16 is accumulated
// in float32 and rounded once. dst may alias any of srcs exactly (same
// memory); all must have dst's dtype and length, else it panics.
func ReduceN(dst Buffer, srcs []Buffer, op ReduceOp) {
	ReduceNTo([]Buffer{dst}, srcs, op)
}

// ReduceNTo is ReduceN writing the result into every buffer of dsts (the
// in-process all-reduce writes each chunk straight into every rank's
// buffer). The work goes block by block: a block of every source is read
// before the block of any destination is written, so destinations may alias
// sources exactly.
func ReduceNTo(dsts, srcs []Buffer, op ReduceOp) {
	if len(srcs) == 0 || len(dsts) == 0 {
		panic("comm.ReduceNTo: no sources or destinations")
	}
	dst := dsts[0]
	for _, list := range [2][]Buffer{srcs, dsts} {
		for _, s := range list {
			if err := CheckReduce(dst, s, op); err != nil {
				panic("comm.ReduceNTo: " + err.Error())
			}
		}
	}
	n := dst.Len()
	switch dst.DType {
	case tensor.Float32:
		if (op == Sum || op == Avg) && len(dsts)*len(dst.Data) >= ntMinBytes && sumToNT(dsts, srcs, op == Avg) {
			return
		}
		var tmp [blockElems]float32
		reduceN(dsts, srcs, op, tmp[:], n, Buffer.Float32)
	case tensor.Int32:
		var tmp [blockElems]int32
		reduceN(dsts, srcs, op, tmp[:], n, Buffer.Int32)
	case tensor.Int64:
		var tmp [blockElems]int64
		reduceN(dsts, srcs, op, tmp[:], n, Buffer.Int64)
	case tensor.BFloat16:
		var tmp [blockElems]float32
		for lo := 0; lo < n; lo += blockElems {
			hi := min(lo+blockElems, n)
			t := tmp[:hi-lo]
			for i, h := range srcs[0].BFloat16()[lo:hi] {
				t[i] = tensor.BFloat16ToFloat32(h)
			}
			for _, s := range srcs[1:] {
				ss := s.BFloat16()[lo:hi]
				for i := range t {
					t[i] = combine(t[i], tensor.BFloat16ToFloat32(ss[i]), op)
				}
			}
			if op == Avg {
				f := float32(len(srcs))
				for i := range t {
					t[i] /= f
				}
			}
			d := dsts[0].BFloat16()[lo:hi]
			for i, v := range t {
				d[i] = tensor.Float32ToBFloat16(v)
			}
			for _, o := range dsts[1:] {
				copy(o.BFloat16()[lo:hi], d)
			}
		}
	}
}

func reduceN[T number](dsts, srcs []Buffer, op ReduceOp, tmp []T, n int, view func(Buffer) []T) {
	for lo := 0; lo < n; lo += len(tmp) {
		hi := min(lo+len(tmp), n)
		t := tmp[:hi-lo]
		copy(t, view(srcs[0])[lo:hi])
		for _, s := range srcs[1:] {
			accumulate(t, view(s)[lo:hi], op)
		}
		if op == Avg {
			k := T(len(srcs))
			for i := range t {
				t[i] /= k
			}
		}
		for _, d := range dsts {
			copy(view(d)[lo:hi], t)
		}
	}
}
