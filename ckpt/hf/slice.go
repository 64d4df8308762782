package hf

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/gotron/gotron/internal/meminfo"
	"github.com/gotron/gotron/model/gpt"
	"github.com/gotron/gotron/parallel/tp"
	"github.com/gotron/gotron/tensor"
)

// A tensor-parallel rank's import (ImportOptions.Part with TP or Experts)
// reads of each Hugging Face tensor only the elements of its slice: every
// op is a permutation of whole rows (plus zero rows of vocabulary padding,
// and a transpose for GPT-2's Conv1D weights), so the rows a column-parallel
// slice keeps are a few row ranges of the source tensors, each contiguous in
// the file, and the columns a row-parallel slice keeps a range of each of
// their rows (of each source column, strided, when transposed).

// rowSource says where rows [to, to+n) of an entry's gotron parameter (its
// parameters' rows concatenated, with entry.More) come from: rows [at,
// at+n) of the Hugging Face tensor src, or with transposed its columns
// [at, at+n) (a Conv1D weight (in, out) holding a Linear's (out, in)).
// Rows no source covers are zero (the vocabulary padding).
type rowSource struct {
	src, at, to, n int
	transposed     bool
}

// rowSources is op o's toGotron as row moves, for Hugging Face tensors of
// the given shapes; minusOne says every value is the source's minus one
// (opPlusOne).
func (o op) rowSources(dm dims, shapes [][]int) (srcs []rowSource, minusOne bool) {
	switch o {
	case opCopy, opPadVocab, opPlusOne:
		return []rowSource{{n: shapes[0][0]}}, o == opPlusOne
	case opTranspose:
		return []rowSource{{n: shapes[0][1], transposed: true}}, false
	case opGPT2QKV, opGPT2QKVBias:
		// per head j: [q_j; k_j; v_j] of the [q heads | k heads | v heads]
		// columns (weight, transposed) or elements (bias)
		a, d := dm.a, dm.d
		for j := range a {
			for s := range 3 {
				srcs = append(srcs, rowSource{at: s*a*d + j*d, to: (3*j + s) * d, n: d, transposed: o == opGPT2QKV})
			}
		}
		return srcs, false
	case opLlamaQKV, opLlamaQKVBias:
		g, r, d := dm.g, dm.a/dm.g, dm.d
		for j := range g {
			o := j * (r + 2) * d
			srcs = append(srcs, rowSource{src: 0, at: j * r * d, to: o, n: r * d},
				rowSource{src: 1, at: j * d, to: o + r*d, n: d}, rowSource{src: 2, at: j * d, to: o + (r+1)*d, n: d})
		}
		return srcs, false
	case opSwiGLU:
		f := shapes[0][0]
		return []rowSource{{src: 0, n: f}, {src: 1, to: f, n: f}}, false
	case opGatedQKV, opGDNInProj:
		for _, b := range o.blocks(dm) {
			srcs = append(srcs, rowSource{src: b.src, at: b.at, to: b.to, n: b.n})
		}
		return srcs, false
	}
	panic(fmt.Sprintf("hf: unknown op %d", o))
}

// sliced is one gotron parameter of a part and the share of the whole
// parameter it holds: rows (ranges of the whole's first dimension, in
// order) and the columns [c0, c1) of each (of the whole's width, the
// product of its other dimensions).
type sliced struct {
	p      *tensor.Tensor
	rows   [][2]int // [first, end) of each range
	c0, c1 int
	width  int // the whole's
	nrows  int // the whole's
}

// sliceOf is parameter p's share of its whole tensor in part (tp.Shard's
// split, by Part.SliceOf), or ok false when p is whole.
func sliceOf(part gpt.Part, c *gpt.Config, p *tensor.Tensor) (s sliced, ok bool, err error) {
	style, rank, size := part.SliceOf(c, p.Name)
	if style == tp.Replicated || size == 1 {
		return sliced{}, false, nil
	}
	shape := p.Shape()
	if len(shape) == 0 {
		return sliced{}, false, fmt.Errorf("%s: a scalar split %v", p.Name, style)
	}
	s = sliced{p: p, nrows: shape[0], width: 1}
	for _, d := range shape[1:] {
		s.width *= d
	}
	switch style {
	case tp.Column:
		s.nrows *= size
		s.rows = [][2]int{{rank * shape[0], (rank + 1) * shape[0]}}
		s.c1 = s.width
	case tp.ColumnGLU:
		k := shape[0] / 2 // of each half
		s.nrows *= size
		half := s.nrows / 2
		s.rows = [][2]int{{rank * k, (rank + 1) * k}, {half + rank*k, half + (rank+1)*k}}
		s.c1 = s.width
	case tp.Row:
		if len(shape) != 2 {
			return sliced{}, false, fmt.Errorf("%s: a row-parallel split of a %d-dimensional tensor", p.Name, len(shape))
		}
		k := shape[1]
		s.width *= size
		s.rows = [][2]int{{0, shape[0]}}
		s.c0, s.c1 = rank*k, (rank+1)*k
	default:
		return sliced{}, false, fmt.Errorf("%s: split %v", p.Name, style)
	}
	return s, true, nil
}

// fillSlices decodes of e's Hugging Face tensors only the values of the
// slices ps (e's parameters, Gotron's then More's, in order) and writes
// them there; read counts the bytes decoded.
func fillSlices(dm dims, e planned, ps []sliced, dir string, read *int64) error {
	shapes := make([][]int, len(e.HF))
	for i, ht := range e.HF {
		shapes[i] = ht.Shape
	}
	srcs, minusOne := e.Op.rowSources(dm, shapes)
	off := 0 // the parameter's first row in the concatenation
	for _, s := range ps {
		dst := s.p.Float32s()
		lw := s.c1 - s.c0
		local := 0 // the range's first row in dst
		for _, r := range s.rows {
			n := r[1] - r[0]
			clear(dst[local*lw : (local+n)*lw]) // rows no source covers: padding
			for _, src := range srcs {
				x, y := max(off+r[0], src.to), min(off+r[1], src.to+src.n)
				if x >= y {
					continue
				}
				if err := readRows(e, src, x-src.to+src.at, y-x, s, dst[(local+x-off-r[0])*lw:], dir, read); err != nil {
					return err
				}
			}
			local += n
		}
		if minusOne {
			for i := range dst {
				dst[i]--
			}
		}
		off += s.nrows
	}
	return nil
}

// readRows decodes n rows of src's tensor from row (column, transposed)
// at, columns [s.c0, s.c1) of each, into dst (rows of s.c1-s.c0).
func readRows(e planned, src rowSource, at, n int, s sliced, dst []float32, dir string, read *int64) error {
	t, name := e.src[src.src], e.names[src.src]
	shape := e.HF[src.src].Shape
	lw := s.c1 - s.c0
	fail := func(err error) error { return fmt.Errorf("hf: %s: tensor %s: %w", dir, name, err) }
	if !src.transposed {
		w := 1
		for _, d := range shape[1:] {
			w *= d
		}
		if w != s.width {
			return fmt.Errorf("hf: internal: %s rows of %d values fill %s rows of %d", name, w, s.p.Name, s.width)
		}
		if lw == w { // whole rows: one range
			b, err := t.DecodeFloat32At(dst[:n*lw], at*w)
			*read += int64(b)
			if err != nil {
				return fail(err)
			}
			return nil
		}
		for i := range n {
			b, err := t.DecodeFloat32At(dst[i*lw:(i+1)*lw], (at+i)*w+s.c0)
			*read += int64(b)
			if err != nil {
				return fail(err)
			}
		}
		return nil
	}
	// the gotron rows are the tensor's columns [at, at+n), its columns
	// the tensor's rows [c0, c1)
	if len(shape) != 2 || shape[0] != s.width {
		return fmt.Errorf("hf: internal: %s %v transposed fills %s rows of %d", name, shape, s.p.Name, s.width)
	}
	out := shape[1]
	col := make([]float32, n)
	for q := s.c0; q < s.c1; q++ {
		b, err := t.DecodeFloat32At(col, q*out+at)
		*read += int64(b)
		if err != nil {
			return fail(err)
		}
		for i, v := range col {
			dst[i*lw+q-s.c0] = v
		}
	}
	return nil
}

// slicesOf is the shares of e's parameters that part holds, nil when each
// is whole (read as the whole import reads it).
func slicesOf(part gpt.Part, c *gpt.Config, params map[string]*tensor.Tensor, e entry) ([]sliced, error) {
	var ps []sliced
	whole := 0
	for _, n := range append([]string{e.Gotron}, e.More...) {
		p := params[n]
		if p == nil {
			return nil, fmt.Errorf("no gotron parameter %s", n)
		}
		s, ok, err := sliceOf(part, c, p)
		if err != nil {
			return nil, err
		}
		if !ok {
			whole++
			shape := p.Shape()
			s = sliced{p: p, nrows: shape[0], width: p.Numel() / shape[0]}
			s.rows, s.c1 = [][2]int{{0, s.nrows}}, s.width
		}
		ps = append(ps, s)
	}
	if whole == len(ps) {
		return nil, nil
	}
	return ps, nil
}

// checkPartMemory is checkMemory for part of the model: its share of each
// tensor (partShare), and while each layer is built (gpt.NewPart builds a
// layer whole, then keeps the part's slices) the largest layer whole, or
// the largest tensor read whole, whichever is larger.
func checkPartMemory(dir string, cfg gpt.Config, plan []planned, part gpt.Part, machine func() (meminfo.Info, bool)) error {
	if err := part.Check(&cfg); err != nil {
		return fmt.Errorf("hf: %s: %w", dir, err)
	}
	var held, largest float64
	layers := map[int]float64{}
	for _, p := range plan {
		n := 0.0
		for _, t := range p.src {
			n += float64(t.NumElements())
		}
		share := partShare(part, &cfg, p.Gotron)
		if share == 0 {
			continue
		}
		held += n * share
		if i, ok := layerOf(p.Gotron); ok {
			layers[i] += n
		}
		if share == 1 {
			largest = max(largest, n)
		}
	}
	for _, n := range layers {
		largest = max(largest, n)
	}
	if err := meminfo.CheckFloat32Import(machine, held, largest, "this rank's part of the float32 model of config.json"); err != nil {
		return fmt.Errorf("hf: %s: %w", dir, err)
	}
	return nil
}

// layerOf is the layer index of gotron parameter name, ok false outside
// the layers.
func layerOf(name string) (int, bool) {
	rest, ok := strings.CutPrefix(name, "decoder.layers.")
	if !ok {
		return 0, false
	}
	i, err := strconv.Atoi(rest[:max(0, strings.IndexByte(rest, '.'))])
	return i, err == nil
}

// partShare is the fraction of gotron parameter name's values that part
// holds: 0 for another stage's (or expert-parallel rank's, on average), 1
// whole, 1/size of a slice.
func partShare(part gpt.Part, c *gpt.Config, name string) float64 {
	held := part.Head // the final norm and output layer
	switch i, ok := layerOf(name); {
	case ok:
		held = i >= part.FirstLayer && i < part.EndLayer
	case name == "embedding.word_embeddings.weight":
		held = part.Embedding || part.Head && !c.UntieEmbeddingsAndOutputWeights
	case strings.HasPrefix(name, "embedding."):
		held = part.Embedding
	}
	if !held {
		return 0
	}
	share := 1.0
	if gpt.IsRoutedExpert(name) && part.Experts != nil {
		share /= float64(part.Experts.Size())
	}
	if _, _, size := part.SliceOf(c, name); size > 1 {
		share /= float64(size)
	}
	return share
}
