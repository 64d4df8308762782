package parallel

import (
	"fmt"
	"strings"
)

// generator is Megatron's RankGenerator: axes in order (leftmost fastest) with
// their sizes.
type generator struct {
	axes   []string // order-string order, size-1 axes appended
	sizes  []int    // size of each axis
	stride []int    // global stride of each axis: product of the sizes to its left
	world  int
}

// newGenerator builds a generator over the given order; size lists every axis.
// Axes of size > 1 must appear in order; missing size-1 axes are appended.
func newGenerator(order []string, size map[string]int) (generator, error) {
	g := generator{axes: append([]string(nil), order...)}
	in := map[string]bool{}
	for _, a := range order {
		in[a] = true
	}
	for _, a := range []string{"tp", "pp", "dp", "ep", "cp"} { // Megatron's name_to_size order
		if in[a] {
			continue
		}
		if size[a] != 1 {
			return g, fmt.Errorf("axis %s has size %d but is missing from the order", a, size[a])
		}
		g.axes = append(g.axes, a)
	}
	g.world = 1
	for _, a := range g.axes {
		g.stride = append(g.stride, g.world)
		g.sizes = append(g.sizes, size[a])
		g.world *= size[a]
	}
	return g, nil
}

// ranks is Megatron's get_ranks(token) via
// generate_masked_orthogonal_rank_groups: groups are the ranks equal on every
// axis not named in token. Group gi decomposes over the unmasked axes, member
// pi over the masked axes, both in order-string order.
func (g generator) ranks(token string) [][]int {
	named := map[string]bool{}
	for _, t := range strings.Split(token, "-") {
		named[t] = true
	}
	var mShape, mStride, uShape, uStride []int
	for i, a := range g.axes {
		if named[a] {
			mShape, mStride = append(mShape, g.sizes[i]), append(mStride, g.stride[i])
		} else {
			uShape, uStride = append(uShape, g.sizes[i]), append(uStride, g.stride[i])
		}
	}
	groupSize := product(mShape)
	groups := make([][]int, g.world/groupSize)
	for gi := range groups {
		base := place(gi, uShape, uStride)
		grp := make([]int, groupSize)
		for pi := range grp {
			grp[pi] = base + place(pi, mShape, mStride)
		}
		groups[gi] = grp
	}
	return groups
}

// coords returns the rank's coordinate on every axis.
func (g generator) coords(rank int) map[string]int {
	c := make(map[string]int, len(g.axes))
	for i, a := range g.axes {
		c[a] = rank / g.stride[i] % g.sizes[i]
	}
	return c
}

// place decomposes index in mixed radix over shape (first digit fastest) and
// returns Σ digit_i·stride_i.
func place(index int, shape, stride []int) int {
	r := 0
	for i, s := range shape {
		r += index % s * stride[i]
		index /= s
	}
	return r
}

func product(xs []int) int {
	p := 1
	for _, x := range xs {
		p *= x
	}
	return p
}
