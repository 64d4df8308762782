package cpu

import "math"

// Attention dropout with keyed masks. Probability (b, head, i, j) of a call
// is kept iff a 32-bit hash of (DropoutSeed, b, FirstHead+h, i, j) is at
// least p·2³²: attnKeep (attention_ref.go) is the spec, one hash per element;
// attnDropTile below is the same function, a tile at a time. The hash is
// splitmix64 (Steele, Lea and Flood, "Fast splittable pseudorandom number
// generators", 2014): a row key per (b, head, i) from three rounds of its
// mixer, then one 64-bit output per pair of keys (j even in the low 32 bits,
// j odd in the high 32), i.e. splitmix64's sequence started at the row key.

// attnGolden is splitmix64's increment, 2⁶⁴/φ rounded to odd.
const attnGolden = 0x9E3779B97F4A7C15

// mix64 is splitmix64's output function (Stafford's Mix13): a bijection of
// uint64 in which every output bit depends on every input bit.
func mix64(z uint64) uint64 {
	z = (z ^ z>>30) * 0xBF58476D1CE4E5B9
	z = (z ^ z>>27) * 0x94D049BB133111EB
	return z ^ z>>31
}

// attnRowKey is the key of query row i of global head head in batch row b.
func attnRowKey(seed uint64, b, head, i int) uint64 {
	k := mix64(seed + uint64(b+1)*attnGolden)
	k = mix64(k + uint64(head+1)*attnGolden)
	return mix64(k + uint64(i+1)*attnGolden)
}

// attnPairBits is the 64-bit hash of keys 2m and 2m+1 of a row: the low 32
// bits decide key 2m, the high 32 bits key 2m+1.
func attnPairBits(rowKey uint64, m int) uint64 {
	return mix64(rowKey + uint64(m)*attnGolden)
}

// dropThreshold is p·2³² rounded down: a probability whose 32-bit hash is
// below it is dropped (as tensor.RNG.DropoutMask draws).
func (c *AttentionConfig) dropThreshold() uint32 {
	return uint32(float64(c.Dropout) * (1 << 32))
}

// dropScale is the multiplier of kept probabilities, 1/(1-p).
func (c *AttentionConfig) dropScale() float32 {
	return float32(1 / (1 - float64(c.Dropout)))
}

// attnDropTile fills keep (row stride attnBlockK) with the dropout
// multipliers (0 or 1/(1-p)) of the tile rows [i0, i0+nq), columns
// [j0, j0+nk) of head h in batch row b, keyed by sequence position (QPos,
// KPos added). A tile whose first key position is odd takes the high half
// of its first pair's hash.
func attnDropTile(keep []float32, cfg *AttentionConfig, b, h, i0, nq, j0, nk int) {
	thr, scale := cfg.dropThreshold(), math.Float32bits(cfg.dropScale())
	pick := func(bits uint32) float32 { // branch-free: the bits are random
		v := uint32(0)
		if bits >= thr {
			v = scale
		}
		return math.Float32frombits(v)
	}
	pj := j0 + cfg.KPos // position of the tile's first key
	for r := 0; r < nq; r++ {
		key := attnRowKey(cfg.DropoutSeed, b, cfg.FirstHead+h, cfg.QPos+i0+r)
		row := keep[r*attnBlockK : r*attnBlockK+nk]
		st := key + uint64(pj/2)*attnGolden // attnPairBits(key, m) is mix64(st) at pair m
		c := 0
		if pj%2 == 1 && nk > 0 {
			row[0] = pick(uint32(mix64(st) >> 32))
			st += attnGolden
			c = 1
		}
		for ; c+2 <= nk; c += 2 {
			x := mix64(st)
			st += attnGolden
			row[c], row[c+1] = pick(uint32(x)), pick(uint32(x>>32))
		}
		if c < nk {
			row[c] = pick(uint32(mix64(st)))
		}
	}
}

// mulF32 computes x[i] *= y[i] over len(x) (y at least as long).
func mulF32(x, y []float32) {
	y = y[:len(x)]
	for i := range x {
		x[i] *= y[i]
	}
}
