package comm

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/gotron/gotron/tensor"
)

// reduceRef is the element-at-a-time specification of ReduceN.
func reduceRef(srcs [][]float64, op ReduceOp) []float64 {
	out := make([]float64, len(srcs[0]))
	for i := range out {
		acc := srcs[0][i]
		for _, s := range srcs[1:] {
			switch op {
			case Max:
				acc = math.Max(acc, s[i])
			case Min:
				acc = math.Min(acc, s[i])
			default:
				acc += s[i]
			}
		}
		out[i] = acc
	}
	return out
}

// TestReduceN compares ReduceN and Accumulate with the reference on all
// dtypes and ops, over lengths that cross the block size, with the
// destination aliasing a source.
func TestReduceN(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	for _, dt := range []tensor.DType{tensor.Float32, tensor.BFloat16, tensor.Int32, tensor.Int64} {
		for _, op := range []ReduceOp{Sum, Avg, Max, Min} {
			for _, n := range []int{1, 3} {
				for _, size := range []int{0, 1, blockElems - 1, blockElems + 5, 3*blockElems + 17} {
					vals := make([][]float64, n)
					bufs := make([]Buffer, n)
					for r := range vals {
						vals[r] = make([]float64, size)
						bufs[r] = MakeBuffer(dt, size)
						for i := range size {
							v := float64(rng.IntN(41) - 20) // exact in every dtype
							vals[r][i] = v
							setF(bufs[r], i, v)
						}
					}
					ref := reduceRef(vals, op)
					// Accumulate path, as the ring uses it.
					acc := MakeBuffer(dt, size)
					copy(acc.Data, bufs[0].Data)
					for _, b := range bufs[1:] {
						Accumulate(acc, b, op)
					}
					if op == Avg {
						DivideBy(acc, n)
					}
					ReduceN(bufs[n-1], bufs, op) // in place on the last source
					for i := range size {
						want := ref[i]
						if op == Avg {
							want = avgAs(dt, want, n)
						}
						if got := getF(bufs[n-1], i); got != want {
							t.Fatalf("%s %s n=%d size=%d: ReduceN element %d = %v, want %v", dt, op, n, size, i, got, want)
						}
						if got := getF(acc, i); got != want {
							t.Fatalf("%s %s n=%d size=%d: Accumulate element %d = %v, want %v", dt, op, n, size, i, got, want)
						}
					}
				}
			}
		}
	}
}

func avgAs(dt tensor.DType, sum float64, n int) float64 {
	switch dt {
	case tensor.Int32, tensor.Int64:
		return float64(int64(sum) / int64(n))
	case tensor.BFloat16:
		return float64(tensor.BFloat16ToFloat32(tensor.Float32ToBFloat16(float32(sum) / float32(n))))
	}
	return float64(float32(sum) / float32(n))
}

func setF(b Buffer, i int, v float64) {
	switch b.DType {
	case tensor.Float32:
		b.Float32()[i] = float32(v)
	case tensor.BFloat16:
		b.BFloat16()[i] = tensor.Float32ToBFloat16(float32(v))
	case tensor.Int32:
		b.Int32()[i] = int32(v)
	case tensor.Int64:
		b.Int64()[i] = int64(v)
	}
}

func getF(b Buffer, i int) float64 {
	switch b.DType {
	case tensor.Float32:
		return float64(b.Float32()[i])
	case tensor.BFloat16:
		return float64(tensor.BFloat16ToFloat32(b.BFloat16()[i]))
	case tensor.Int32:
		return float64(b.Int32()[i])
	}
	return float64(b.Int64()[i])
}

// TestBF16SumRoundsOnce: 256 + 1 + 1 is 258 in float32 and in bfloat16
// (258 is representable), but rounding after each add would give 256.
func TestBF16SumRoundsOnce(t *testing.T) {
	a, b, c := []uint16{tensor.Float32ToBFloat16(256)}, []uint16{tensor.Float32ToBFloat16(1)}, []uint16{tensor.Float32ToBFloat16(1)}
	ReduceN(BFloat16s(a), []Buffer{BFloat16s(a), BFloat16s(b), BFloat16s(c)}, Sum)
	if got := tensor.BFloat16ToFloat32(a[0]); got != 258 {
		t.Errorf("256+1+1 in bfloat16 = %v, want 258 (float32 accumulation, one rounding)", got)
	}
}

func TestCounts(t *testing.T) {
	if _, err := ResolveCounts(nil, 10, 3, "counts"); err == nil {
		t.Error("10 over 3 evenly: no error")
	}
	if c, err := ResolveCounts(nil, 12, 3, "counts"); err != nil || c[2] != 4 {
		t.Errorf("12 over 3: %v %v", c, err)
	}
	for _, bad := range [][]int{{1, 2}, {1, -1, 10}, {1, 2, 3}} {
		if _, err := ResolveCounts(bad, 10, 3, "counts"); err == nil {
			t.Errorf("%v: no error", bad)
		}
	}
	if got := Offsets([]int{2, 0, 3}); got[3] != 5 || got[2] != 2 {
		t.Errorf("offsets: %v", got)
	}
}

func TestRankError(t *testing.T) {
	err := error(&RankError{Rank: 3, Op: OpAllReduce, Err: ErrPeerLost})
	if err.Error() != "comm: all_reduce: rank 3: peer lost" {
		t.Errorf("message %q", err)
	}
	if !errors.Is(err, ErrPeerLost) || errors.Is(err, ErrTimeout) {
		t.Error("errors.Is does not see the cause")
	}
	if _, err := ValidateRanks([]int{0, 2}, 4, 1); !errors.Is(err, ErrNotMember) {
		t.Errorf("non-member: %v", err)
	}
	for _, bad := range [][]int{nil, {0, 0}, {0, 4}, {-1}} {
		if _, err := ValidateRanks(bad, 4, 0); err == nil {
			t.Errorf("%v: no error", bad)
		}
	}
}

// TestAddF32 checks the vector add against its reference, bit for bit, on
// random floats for every length up to 100 and at unaligned offsets.
func TestAddF32(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for n := 0; n <= 100; n++ {
		for off := range 3 {
			d := make([]float32, n+off)
			s := make([]float32, n+off)
			for i := range d {
				d[i] = float32(rng.NormFloat64() * 1e3)
				s[i] = float32(rng.NormFloat64())
			}
			want := append([]float32(nil), d...)
			addF32Ref(want[off:], s[off:])
			addF32(d[off:], s[off:])
			for i := range d {
				if math.Float32bits(d[i]) != math.Float32bits(want[i]) {
					t.Fatalf("n=%d off=%d: element %d = %v, want %v", n, off, i, d[i], want[i])
				}
			}
		}
	}
}

// TestBufferCheck: a Buffer carries the four tensor dtypes comm reduces and
// refuses the others (float16) and ragged lengths.
func TestBufferCheck(t *testing.T) {
	for _, dt := range []tensor.DType{tensor.Float32, tensor.BFloat16, tensor.Int32, tensor.Int64} {
		b := MakeBuffer(dt, 3)
		if err := b.Check(); err != nil || b.Len() != 3 || len(b.Data) != 3*dt.Size() {
			t.Errorf("%v: Check %v, Len %d, %d bytes", dt, err, b.Len(), len(b.Data))
		}
	}
	if err := (Buffer{DType: tensor.Float16, Data: make([]byte, 4)}).Check(); err == nil || err.Error() != "unsupported dtype float16" {
		t.Errorf("float16: %v", err)
	}
	if err := (Buffer{DType: tensor.Int64, Data: make([]byte, 12)}).Check(); err == nil {
		t.Error("a 12-byte int64 buffer passed Check")
	}
}
