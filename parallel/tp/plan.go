package tp

import (
	"fmt"

	"github.com/gotron/gotron/tensor"
)

// Style says how a parameter is split across tensor-parallel ranks.
type Style int

const (
	// Replicated parameters are whole on every rank (norms, row-parallel
	// biases, position embeddings).
	Replicated Style = iota
	// Column splits dimension 0 (output rows) into contiguous slices:
	// column-parallel weights and biases (QKV, whose rows are grouped per
	// query group, so a slice is whole groups), and vocab-parallel
	// embedding and output layers.
	Column
	// ColumnGLU splits dimension 0 as two stacked halves [gate; up], each
	// half into contiguous slices: rank r holds [gate_r; up_r] (Megatron's
	// SwiGLU fc1 under TP).
	ColumnGLU
	// Row splits the last dimension (input columns): row-parallel weights
	// (attention projection, fc2).
	Row
)

// String names the style as a torchtitan plan would.
func (s Style) String() string {
	switch s {
	case Replicated:
		return "replicated"
	case Column:
		return "column"
	case ColumnGLU:
		return "column-glu"
	case Row:
		return "row"
	}
	return fmt.Sprintf("Style(%d)", int(s))
}

// Shard returns rank's slice of the whole tensor x (a new tensor named
// x.Name); size must divide the split dimension (in halves for ColumnGLU).
func Shard(x *tensor.Tensor, s Style, rank, size int) (*tensor.Tensor, error) {
	shape := x.Shape()
	out, err := shardShape(x.Name, shape, s, size)
	if err != nil {
		return nil, err
	}
	dst := tensor.Param(x.Name, out...)
	moveShard(dst.Float32s(), x.Float32s(), shape, s, rank, size, false)
	return dst, nil
}

// Merge writes shard (rank's slice, in style s) into whole, the tensor of
// the full shape: Shard's inverse.
func Merge(whole, shard []float32, fullShape []int, s Style, rank, size int) {
	moveShard(shard, whole, fullShape, s, rank, size, true)
}

func shardShape(name string, shape []int, s Style, size int) ([]int, error) {
	out := append([]int(nil), shape...)
	switch s {
	case Replicated:
	case Column:
		if shape[0]%size != 0 {
			return nil, fmt.Errorf("tp: %s: dimension 0 (%d) does not divide by the tensor-parallel size %d", name, shape[0], size)
		}
		out[0] /= size
	case ColumnGLU:
		if shape[0]%(2*size) != 0 {
			return nil, fmt.Errorf("tp: %s: each half of dimension 0 (%d) does not divide by the tensor-parallel size %d", name, shape[0]/2, size)
		}
		out[0] /= size
	case Row:
		last := len(shape) - 1
		if shape[last]%size != 0 {
			return nil, fmt.Errorf("tp: %s: last dimension (%d) does not divide by the tensor-parallel size %d", name, shape[last], size)
		}
		out[last] /= size
	default:
		return nil, fmt.Errorf("tp: %s: unknown style %v", name, s)
	}
	return out, nil
}

// moveShard copies rank's slice between shard and whole (whole → shard, or
// shard → whole when toWhole).
func moveShard(shard, whole []float32, shape []int, s Style, rank, size int, toWhole bool) {
	mv := func(dst, src []float32) {
		if toWhole {
			copy(src, dst)
		} else {
			copy(dst, src)
		}
	}
	inner := 1
	for _, d := range shape[1:] {
		inner *= d
	}
	switch s {
	case Replicated:
		mv(shard, whole)
	case Column:
		k := shape[0] / size
		mv(shard, whole[rank*k*inner:(rank+1)*k*inner])
	case ColumnGLU:
		half := shape[0] / 2
		k := half / size
		mv(shard[:k*inner], whole[rank*k*inner:(rank+1)*k*inner])
		mv(shard[k*inner:], whole[(half+rank*k)*inner:(half+(rank+1)*k)*inner])
	case Row:
		last := shape[len(shape)-1]
		k := last / size
		rows := len(whole) / last
		for i := range rows {
			mv(shard[i*k:(i+1)*k], whole[i*last+rank*k:i*last+(rank+1)*k])
		}
	}
}
