// Package backendtest holds conformance checks for tensor.Backend
// implementations: each calls one backend method on deterministic inputs
// and compares the result with a straightforward reference computed here
// in plain Go (a direct loop, no kernel), returning the first difference
// it finds. The CPU backend runs them in this package's tests; a device
// backend runs the same functions on itself.
//
// The method-level checks (CheckPagedAttention, CheckAdamW, ...) build their
// inputs on the host (tensor.FromFloat32, tensor.FromInt32) and move them to
// the backend's device (be.Device(), Tensor.ToDevice; tensor lists and
// PagedAttentionConfig tables of moved tensors, packed weights from the
// backend's own PackWeight), allocate outputs there (tensor.NewOn,
// tensor.ZerosOn) and read results back through tensor.ToHost: on the CPU
// these are the tensors themselves, on a device the backend gets only its
// own storage. The simulated device (tensor.SimBackend), whose host
// accessors panic, runs them in this package's tests. CheckOps(dev, tol)
// runs the core ops forward and backward on a device, moving its inputs
// there, against the CPU (docs/design/compute.md, "Adding a CUDA backend").
package backendtest

import (
	"fmt"
	"math"

	"github.com/gotron/gotron/tensor"
)

// onDev returns a float32 tensor of x's values (shape) on dev: x itself,
// wrapped, on the CPU.
func onDev(dev tensor.Device, x []float32, shape ...int) *tensor.Tensor {
	return tensor.FromFloat32(x, shape...).ToDevice(dev)
}

// idsOn returns an int32 tensor of x's values (shape) on dev.
func idsOn(dev tensor.Device, x []int32, shape ...int) *tensor.Tensor {
	return tensor.FromInt32(x, shape...).ToDevice(dev)
}

// host returns t's float32 values read back to the host (t's own storage
// on the CPU).
func host(t *tensor.Tensor) []float32 { return tensor.ToHost(t).Float32s() }

// hostIDs returns t's int32 values read back to the host.
func hostIDs(t *tensor.Tensor) []int32 { return tensor.ToHost(t).Int32s() }

// pagedCase is one PagedAttention/PagedKVWrite shape: sequences of rows[s]
// new rows at first position pos[s], in pools of Blocks blocks of
// BlockTokens positions.
type pagedCase struct {
	Name                string
	Heads, Groups, Dim  int
	BlockTokens, Blocks int
	Rows, Pos           []int
}

// pagedCases covers decode rows (one per sequence), prefill chunks,
// sequences ending inside a block and on a block boundary, grouped-query
// and multi-head attention, and the contiguous single-sequence cache (one
// block of MaxLen positions).
var pagedCases = []pagedCase{
	{Name: "decode", Heads: 4, Groups: 2, Dim: 8, BlockTokens: 4, Blocks: 24, Rows: []int{1, 1, 1}, Pos: []int{0, 6, 11}},
	{Name: "mixed", Heads: 6, Groups: 3, Dim: 20, BlockTokens: 3, Blocks: 40, Rows: []int{1, 5, 1, 3}, Pos: []int{9, 0, 2, 4}},
	{Name: "mha", Heads: 3, Groups: 3, Dim: 33, BlockTokens: 16, Blocks: 6, Rows: []int{2, 17}, Pos: []int{30, 0}},
	{Name: "contiguous", Heads: 4, Groups: 1, Dim: 16, BlockTokens: 40, Blocks: 1, Rows: []int{7}, Pos: []int{5}},
	{Name: "contiguous-decode", Heads: 2, Groups: 2, Dim: 64, BlockTokens: 64, Blocks: 1, Rows: []int{1}, Pos: []int{63}},
}

// paged is a case's inputs: pools filled at every slot (so a read of a
// wrong slot shows), block tables with the blocks shuffled, spans, slots;
// the pools and the tables as tensors on the backend's device.
type paged struct {
	c              pagedCase
	rows           int
	q, k, v        []float32 // the rows' queries, keys, values
	kPool, vPool   []float32
	tables, spans  []int32
	slots          []int32
	maxBlocks      int
	kPoolT, vPoolT *tensor.Tensor
	cfg            tensor.PagedAttentionConfig
}

func newPaged(dev tensor.Device, c pagedCase, seed uint64) *paged {
	p := &paged{c: c}
	rng := tensor.NewRNG(seed)
	for s := range c.Rows {
		p.rows += c.Rows[s]
		p.maxBlocks = max(p.maxBlocks, (c.Pos[s]+c.Rows[s]+c.BlockTokens-1)/c.BlockTokens)
	}
	fill := func(n int) []float32 {
		x := make([]float32, n)
		rng.Normal(x, 0, 1)
		return x
	}
	p.q = fill(p.rows * c.Heads * c.Dim)
	p.k, p.v = fill(p.rows*c.Groups*c.Dim), fill(p.rows*c.Groups*c.Dim)
	poolN := c.Blocks * c.Groups * c.BlockTokens * c.Dim
	p.kPool, p.vPool = fill(poolN), fill(poolN)
	// Blocks handed out in a scrambled order (a stride coprime to Blocks),
	// so positions and pool order differ.
	next := 0
	p.tables = make([]int32, len(c.Rows)*p.maxBlocks)
	for s := range c.Rows {
		used := (c.Pos[s] + c.Rows[s] + c.BlockTokens - 1) / c.BlockTokens
		for b := range p.maxBlocks {
			id := int32(-1) // unused entries: never read
			if b < used {
				id = int32(next * 7 % c.Blocks)
				next++
			}
			p.tables[s*p.maxBlocks+b] = id
		}
	}
	if next > c.Blocks || c.Blocks%7 == 0 {
		panic(fmt.Sprintf("backendtest: case %s does not fit its pool", c.Name))
	}
	row := 0
	for s := range c.Rows {
		p.spans = append(p.spans, int32(row), int32(c.Rows[s]), int32(c.Pos[s]))
		for i := range c.Rows[s] {
			pos := c.Pos[s] + i
			p.slots = append(p.slots, p.tables[s*p.maxBlocks+pos/c.BlockTokens]*int32(c.BlockTokens)+int32(pos%c.BlockTokens))
		}
		row += c.Rows[s]
	}
	p.kPoolT = onDev(dev, p.kPool, c.Blocks, c.Groups, c.BlockTokens, c.Dim)
	p.vPoolT = onDev(dev, p.vPool, c.Blocks, c.Groups, c.BlockTokens, c.Dim)
	p.cfg = tensor.PagedAttentionConfig{
		BlockTables: idsOn(dev, p.tables, len(c.Rows), p.maxBlocks),
		Spans:       idsOn(dev, p.spans, len(c.Rows), 3),
	}
	return p
}

// write writes the case's new keys and values into the pools with
// be.PagedKVWrite.
func (p *paged) write(be tensor.Backend) {
	c, dev := p.c, be.Device()
	be.PagedKVWrite(p.kPoolT, p.vPoolT,
		onDev(dev, p.k, p.rows, c.Groups, c.Dim), onDev(dev, p.v, p.rows, c.Groups, c.Dim),
		idsOn(dev, p.slots, p.rows))
}

// at is the offset in a pool of slot's KV head h.
func (p *paged) at(slot int32, h int) int {
	c := p.c
	b, o := int(slot)/c.BlockTokens, int(slot)%c.BlockTokens
	return ((b*c.Groups+h)*c.BlockTokens + o) * c.Dim
}

// CheckPagedKVWrite writes each case's new keys and values with
// be.PagedKVWrite and checks that exactly their slots changed, to the
// written values.
func CheckPagedKVWrite(be tensor.Backend) error {
	for ci, c := range pagedCases {
		p := newPaged(be.Device(), c, uint64(ci)+1)
		wantK, wantV := append([]float32(nil), p.kPool...), append([]float32(nil), p.vPool...)
		for i, s := range p.slots {
			for h := range c.Groups {
				src := (i*c.Groups + h) * c.Dim
				copy(wantK[p.at(s, h):][:c.Dim], p.k[src:src+c.Dim])
				copy(wantV[p.at(s, h):][:c.Dim], p.v[src:src+c.Dim])
			}
		}
		p.write(be)
		if err := sameBits(c.Name+": key pool", host(p.kPoolT), wantK); err != nil {
			return err
		}
		if err := sameBits(c.Name+": value pool", host(p.vPoolT), wantV); err != nil {
			return err
		}
	}
	return nil
}

// CheckPagedAttention runs be.PagedAttention on each case (keys and values
// written by be.PagedKVWrite) and compares every output with
// PagedAttentionRef's, bit for bit: the operation's arithmetic is fixed.
func CheckPagedAttention(be tensor.Backend) error {
	for ci, c := range pagedCases {
		p := newPaged(be.Device(), c, uint64(ci)+100)
		p.write(be)
		kPool, vPool := host(p.kPoolT), host(p.vPoolT)
		want := make([]float32, p.rows*c.Heads*c.Dim)
		r := c.Heads / c.Groups
		row := 0
		for s := range c.Rows {
			for i := range c.Rows[s] {
				pos := c.Pos[s] + i
				for h := range c.Heads {
					keys, values := make([][]float32, pos+1), make([][]float32, pos+1)
					for j := range keys {
						slot := p.tables[s*p.maxBlocks+j/c.BlockTokens]*int32(c.BlockTokens) + int32(j%c.BlockTokens)
						keys[j] = kPool[p.at(slot, h/r):][:c.Dim]
						values[j] = vPool[p.at(slot, h/r):][:c.Dim]
					}
					off := ((row+i)*c.Heads + h) * c.Dim
					PagedAttentionRef(want[off:off+c.Dim], p.q[off:off+c.Dim], keys, values)
				}
			}
			row += c.Rows[s]
		}
		nan := make([]float32, len(want))
		for i := range nan {
			nan[i] = float32(math.NaN()) // out is overwritten, not added to
		}
		out := onDev(be.Device(), nan, p.rows, c.Heads, c.Dim)
		be.PagedAttention(out, onDev(be.Device(), p.q, p.rows, c.Heads, c.Dim), p.kPoolT, p.vPoolT, p.cfg)
		if err := sameBits(c.Name+": attention", host(out), want); err != nil {
			return err
		}
	}
	return nil
}

// PagedAttentionRef writes into out one query's attention over keys and
// values (one per position, in order) in tensor.PagedAttention's fixed
// arithmetic, element by element: the specification the kernels match bit
// for bit.
func PagedAttentionRef(out, q []float32, keys, values [][]float32) {
	scale := 1 / math.Sqrt(float64(len(q)))
	sc := make([]float64, len(keys))
	mx := math.Inf(-1)
	for j, k := range keys {
		var acc [16]float64
		for i := range q {
			acc[i%16] = math.FMA(float64(q[i]), float64(k[i]), acc[i%16])
		}
		var s float64
		for _, a := range acc {
			s += a
		}
		sc[j] = s * scale
		if sc[j] > mx {
			mx = sc[j]
		}
	}
	var sum float64
	for j := range sc {
		sc[j] = math.Exp(sc[j] - mx)
		sum += sc[j]
	}
	clear(out)
	for j, v := range values {
		w := float32(sc[j] / sum)
		for i := range out {
			out[i] = out[i] + float32(w*v[i]) // the conversion forbids a fused multiply-add
		}
	}
}

// CheckPackedLinear packs weights with be.PackWeight in float32 and
// bfloat16 and checks be.PackedLinear against a float64 product of the
// (rounded) weights, within float32 summation error, and that the bias is
// added to the rounded product exactly as a separate add would.
func CheckPackedLinear(be tensor.Backend) error {
	dev := be.Device()
	rng := tensor.NewRNG(7)
	for _, sh := range [][3]int{{1, 48, 40}, {3, 17, 130}, {37, 300, 33}, {64, 64, 64}} {
		rows, in, outF := sh[0], sh[1], sh[2]
		x, w, b := make([]float32, rows*in), make([]float32, outF*in), make([]float32, outF)
		rng.Normal(x, 0, 1)
		rng.Normal(w, 0, 1)
		rng.Normal(b, 0, 1)
		xT, bT := onDev(dev, x, rows, in), onDev(dev, b, outF)
		for _, dt := range []tensor.DType{tensor.Float32, tensor.BFloat16} {
			name := fmt.Sprintf("%d×%d·(%d×%d)ᵀ %v", rows, in, outF, in, dt)
			pw := be.PackWeight(onDev(dev, w, outF, in), dt)
			if pw.Out() != outF || pw.In() != in || pw.DType() != dt || pw.Bytes() < int64(outF*in*dt.Size()) || pw.Device() != dev {
				return fmt.Errorf("%s: packed weight (%d, %d) %v of %d bytes on %v, want on %v", name, pw.Out(), pw.In(), pw.DType(), pw.Bytes(), pw.Device(), dev)
			}
			plainT, biasedT := tensor.ZerosOn(dev, rows, outF), tensor.ZerosOn(dev, rows, outF)
			be.PackedLinear(plainT, xT, pw, nil)
			be.PackedLinear(biasedT, xT, pw, bT)
			plain, biased := host(plainT), host(biasedT)
			for i := range rows {
				for o := range outF {
					var want, mag float64
					for k := range in {
						wk := w[o*in+k]
						if dt == tensor.BFloat16 {
							wk = tensor.BFloat16ToFloat32(tensor.Float32ToBFloat16(wk))
						}
						want += float64(x[i*in+k]) * float64(wk)
						mag += math.Abs(float64(x[i*in+k]) * float64(wk))
					}
					got := plain[i*outF+o]
					if d := math.Abs(float64(got) - want); d > 1e-6*mag+1e-30 || math.IsNaN(float64(got)) {
						return fmt.Errorf("%s: out[%d,%d] = %v, want %v (|difference| %g, Σ|x·w| %g)", name, i, o, got, want, d, mag)
					}
					if wb := got + b[o]; math.Float32bits(biased[i*outF+o]) != math.Float32bits(wb) {
						return fmt.Errorf("%s: with bias out[%d,%d] = %v, want %v + %v = %v", name, i, o, biased[i*outF+o], got, b[o], wb)
					}
				}
			}
		}
	}
	return nil
}

// CheckAllocCommitted checks that be.AllocCommitted returns a zeroed
// float32 tensor of the shape asked for, on the backend's device.
func CheckAllocCommitted(be tensor.Backend) error {
	t := be.AllocCommitted(tensor.Float32, []int{3, 2, 5000})
	if t.DType() != tensor.Float32 || !tensor.SameShape(t.Shape(), []int{3, 2, 5000}) || t.Device() != be.Device() {
		return fmt.Errorf("%v on %v, want float32[3 2 5000] on %v", t, t.Device(), be.Device())
	}
	for i, v := range tensor.ToHost(t).Float32s() { // on the backend's device: read through a copy
		if v != 0 || math.Signbit(float64(v)) {
			return fmt.Errorf("element %d is %v, want +0", i, v)
		}
	}
	return nil
}

// sameBits reports the first element of got whose bits differ from want's
// (any NaN matches any NaN).
func sameBits(what string, got, want []float32) error {
	for i := range want {
		if math.IsNaN(float64(got[i])) && math.IsNaN(float64(want[i])) {
			continue // NaN payloads are the hardware's (x86 keeps the operand's sign, a GPU writes its canonical NaN)
		}
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			return fmt.Errorf("%s: element %d = %v, want %v (bit for bit)", what, i, got[i], want[i])
		}
	}
	return nil
}
