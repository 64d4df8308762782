package tensor

import (
	"hash/fnv"
	"math"
)

// RNG is a counter-based random generator (Philox-4x32-10): the value at a
// position depends only on the key and the position, so streams can be split,
// skipped and replayed (activation recomputation replays dropout masks by
// restoring the offset). Not safe for concurrent use; fork one per goroutine.
//
// Megatron keeps several named streams (data-parallel, model-parallel seeded
// seed+2718+tp_rank, expert-parallel); Fork derives them by name.
type RNG struct {
	key    [2]uint32
	offset uint64 // next 128-bit block to draw
}

// NewRNG returns the stream for seed.
func NewRNG(seed uint64) *RNG {
	return &RNG{key: [2]uint32{uint32(seed), uint32(seed >> 32)}}
}

// Fork returns an independent stream derived from r's key and name (not from
// r's offset): the same name always gives the same stream.
func (r *RNG) Fork(name string) *RNG {
	h := fnv.New64a()
	var kb [8]byte
	for i := range 4 {
		kb[i] = byte(r.key[0] >> (8 * i))
		kb[4+i] = byte(r.key[1] >> (8 * i))
	}
	h.Write(kb[:])
	h.Write([]byte(name))
	return NewRNG(h.Sum64())
}

// State is an RNG's position, saved in checkpoints.
type RNGState struct {
	Key    [2]uint32 `json:"key"`
	Offset uint64    `json:"offset"`
}

// State returns r's position.
func (r *RNG) State() RNGState { return RNGState{Key: r.key, Offset: r.offset} }

// SetState moves r to a saved position.
func (r *RNG) SetState(s RNGState) { r.key, r.offset = s.Key, s.Offset }

func philox(ctr [4]uint32, key [2]uint32) [4]uint32 {
	const m0, m1, w0, w1 = 0xD2511F53, 0xCD9E8D57, 0x9E3779B9, 0xBB67AE85
	for range 10 {
		p0 := uint64(m0) * uint64(ctr[0])
		p1 := uint64(m1) * uint64(ctr[2])
		ctr = [4]uint32{
			uint32(p1>>32) ^ ctr[1] ^ key[0], uint32(p1),
			uint32(p0>>32) ^ ctr[3] ^ key[1], uint32(p0),
		}
		key[0] += w0
		key[1] += w1
	}
	return ctr
}

// block returns the four 32-bit words of block i.
func (r *RNG) block(i uint64) [4]uint32 {
	return philox([4]uint32{uint32(i), uint32(i >> 32), 0, 0}, r.key)
}

func toUnit(x uint32) float32 { // (0, 1]
	return (float32(x>>8) + 1) * (1.0 / (1 << 24))
}

// Uniform fills dst with uniform values in [lo, hi).
func (r *RNG) Uniform(dst []float32, lo, hi float32) {
	for i := 0; i < len(dst); i += 4 {
		w := r.block(r.offset)
		r.offset++
		for j := 0; j < 4 && i+j < len(dst); j++ {
			dst[i+j] = lo + (hi-lo)*(1-toUnit(w[j]))
		}
	}
}

// Normal fills dst with normal values of the given mean and standard
// deviation (Box-Muller on pairs).
func (r *RNG) Normal(dst []float32, mean, std float32) {
	for i := 0; i < len(dst); i += 4 {
		w := r.block(r.offset)
		r.offset++
		for j := 0; j < 4; j += 2 {
			u1, u2 := float64(toUnit(w[j])), float64(toUnit(w[j+1]))
			rad := math.Sqrt(-2 * math.Log(u1))
			s, c := math.Sincos(2 * math.Pi * u2)
			if i+j < len(dst) {
				dst[i+j] = mean + std*float32(rad*c)
			}
			if i+j+1 < len(dst) {
				dst[i+j+1] = mean + std*float32(rad*s)
			}
		}
	}
}

// Uint64 draws the next block and returns 64 bits of it: a key for
// generators that hash their own coordinates (the attention kernel's
// dropout). It advances r by one block, as any draw of up to four values.
func (r *RNG) Uint64() uint64 {
	w := r.block(r.offset)
	r.offset++
	return uint64(w[0]) | uint64(w[1])<<32
}

// DropoutMask fills mask with 0 (dropped, probability p) or 1/(1-p) (kept),
// the scale inverted dropout applies.
func (r *RNG) DropoutMask(mask []float32, p float32) {
	keep := 1 / (1 - p)
	thr := uint32(float64(p) * (1 << 32))
	if p >= 1 {
		clear(mask)
		return
	}
	for i := 0; i < len(mask); i += 4 {
		w := r.block(r.offset)
		r.offset++
		for j := 0; j < 4 && i+j < len(mask); j++ {
			if w[j] < thr {
				mask[i+j] = 0
			} else {
				mask[i+j] = keep
			}
		}
	}
}
