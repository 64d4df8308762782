package train

import (
	"crypto/sha1"
	"encoding/binary"
	"fmt"
	"math"
	"strings"

	"github.com/gotron/gotron/comm"
	"github.com/gotron/gotron/tensor"
)

// Megatron's check_param_hashes_across_dp_replicas (megatron/core/utils.py,
// --check-weight-hash-across-dp-replicas-interval): every data-parallel
// replica hashes each of its parameters (SHA-1 of the float32 values), the
// hashes are all-gathered over the data-parallel group (the routed
// experts' over the expert-data-parallel group), and every replica must
// hold the same parameters as every other (cross_check=True).

// hashWords is a SHA-1 digest (20 bytes) padded into int64 words for the
// all-gather.
const hashWords = 3

// paramHash is SHA-1 of p's float32 values in little-endian order (what
// hashlib.sha1 of param.float().numpy() reads on a little-endian host).
func paramHash(p *tensor.Tensor) [hashWords]int64 {
	v := hostValues(p)
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	d := sha1.Sum(b)
	var padded [8 * hashWords]byte
	copy(padded[:], d[:])
	var w [hashWords]int64
	for i := range w {
		w[i] = int64(binary.LittleEndian.Uint64(padded[8*i:]))
	}
	return w
}

// checkWeightHashes compares this rank's parameters with every replica's
// in its data-parallel group (and the experts' over the expert-data-parallel
// group). On a mismatch every rank of the group returns an error naming
// the ranks whose parameters differ from the group's first and the first
// parameters that differ.
func (st *stepper) checkWeightHashes() error {
	if err := st.syncParams(); err != nil { // --overlap-param-gather: whole parameters
		return err
	}
	if st.corruptReplica != nil {
		st.corruptReplica(st.Iteration, st.par.World.Rank(), st.localParams())
	}
	dense, experts := st.splitExperts(st.localParams())
	for _, part := range []struct {
		params []*tensor.Tensor
		group  comm.ProcessGroup
		name   string
	}{{dense, st.par.DP, "data-parallel"}, {experts, st.par.ExpertDP, "expert-data-parallel"}} {
		if len(part.params) == 0 || part.group == nil {
			continue
		}
		if err := st.compareHashes(part.params, part.group, part.name); err != nil {
			return err
		}
	}
	return nil
}

func (st *stepper) compareHashes(params []*tensor.Tensor, g comm.ProcessGroup, groupName string) error {
	n := len(params) * hashWords
	mine := make([]int64, 0, n)
	for _, p := range params {
		h := paramHash(p)
		mine = append(mine, h[:]...)
	}
	// The world ranks of the group's members, gathered with the hashes.
	mine = append(mine, int64(st.par.World.Rank()))
	size := g.Size()
	all := mine
	if size > 1 {
		all = make([]int64, (n+1)*size)
		if err := g.AllGather(st.cctx, comm.Int64s(all), comm.Int64s(mine), nil); err != nil {
			return fmt.Errorf("train: iteration %d: --check-weight-hash-across-dp-replicas-interval: gather the parameter hashes: %w", st.Iteration, err)
		}
	}
	row := func(r int) []int64 { return all[r*(n+1) : (r+1)*(n+1)] }
	first := row(0)
	var bad []string
	var badParams []string
	for r := 1; r < size; r++ {
		h := row(r)
		var names []string
		for i, p := range params {
			if !equalWords(h[i*hashWords:(i+1)*hashWords], first[i*hashWords:(i+1)*hashWords]) {
				names = append(names, p.Name)
			}
		}
		if len(names) > 0 {
			bad = append(bad, fmt.Sprintf("world rank %d (%s rank %d)", h[n], groupName, r))
			if len(badParams) == 0 {
				badParams = names
			}
		}
	}
	if len(bad) == 0 {
		return nil
	}
	if len(badParams) > 3 {
		badParams = append(badParams[:3], fmt.Sprintf("and %d more", len(badParams)-3))
	}
	return fmt.Errorf("train: iteration %d: parameter hashes do not match across %s replicas: %s differ from world rank %d (%s rank 0) in %s",
		st.Iteration, groupName, strings.Join(bad, ", "), first[n], groupName, strings.Join(badParams, ", "))
}

func equalWords(a, b []int64) bool {
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
