package tokenizer

import (
	"hash/maphash"
	"strings"
	"sync"
)

// pairRanker tells the BPE merge loop whether symbols a and b merge, with
// which priority (lower rank merges first) and into which symbol.
type pairRanker interface {
	pair(a, b int32) (rank int32, merged int32, ok bool)
}

// mergeTable is a pairRanker over an explicit merges list (GPT-2 merges.txt,
// tokenizer.json "merges"): key a<<32|b → rank<<32|merged.
type mergeTable map[uint64]uint64

func (m mergeTable) pair(a, b int32) (int32, int32, bool) {
	v, ok := m[uint64(uint32(a))<<32|uint64(uint32(b))]
	return int32(v >> 32), int32(uint32(v)), ok
}

func (m mergeTable) add(a, b, rank, merged int32) {
	k := uint64(uint32(a))<<32 | uint64(uint32(b))
	if _, dup := m[k]; !dup { // the first (lowest) rank of a repeated merge wins
		m[k] = uint64(uint32(rank))<<32 | uint64(uint32(merged))
	}
}

// symbolTable interns byte strings as int32 symbols.
type symbolTable struct {
	ids   map[string]int32
	bytes []string
}

func (t *symbolTable) intern(s string) int32 {
	if id, ok := t.ids[s]; ok {
		return id
	}
	id := int32(len(t.bytes))
	t.ids[s] = id
	t.bytes = append(t.bytes, s)
	return id
}

// concatRanker is a pairRanker that merges a and b when their concatenation
// is a symbol of its own with a rank (tiktoken: rank = id; SentencePiece BPE:
// rank orders by descending score).
type concatRanker struct {
	syms  *symbolTable
	ranks []int32 // rank per symbol, -1 when the symbol may not be produced by a merge
}

func (c concatRanker) pair(a, b int32) (int32, int32, bool) {
	var buf [64]byte
	s := append(append(buf[:0], c.syms.bytes[a]...), c.syms.bytes[b]...)
	id, ok := c.syms.ids[string(s)] // no allocation: the compiler keys the map by s
	if !ok || c.ranks[id] < 0 {
		return 0, 0, false
	}
	return c.ranks[id], id, true
}

// bpeMerge merges word in place by BPE: repeatedly the adjacent pair with the
// lowest rank, leftmost first, until no pair merges. It returns the merged
// symbols (a prefix of word's storage).
//
// The result equals GPT-2's encoder.py loop (merge every occurrence of the
// best bigram left to right, then repeat) for merge lists where a merge's
// output ranks after its inputs, and equals SentencePiece's and Hugging Face's
// priority-queue loops.
func bpeMerge(word []int32, r pairRanker) []int32 {
	n := len(word)
	if n < 2 {
		return word
	}
	if n <= 16 {
		return bpeMergeSmall(word, r)
	}
	// Doubly linked list over positions and a heap of candidate pairs keyed
	// by (rank, left position); stale candidates are skipped when popped.
	next := make([]int32, n)
	prev := make([]int32, n)
	for i := range n {
		next[i] = int32(i + 1)
		prev[i] = int32(i - 1)
	}
	next[n-1] = -1
	var h pq[pairCand]
	push := func(i int32) {
		if i < 0 || next[i] < 0 {
			return
		}
		j := next[i]
		if rank, merged, ok := r.pair(word[i], word[j]); ok {
			h.push(pairCand{rank: rank, left: i, a: word[i], b: word[j], merged: merged})
		}
	}
	for i := range int32(n - 1) {
		push(i)
	}
	for len(h) > 0 {
		c := h.pop()
		j := next[c.left]
		if word[c.left] != c.a || j < 0 || word[j] != c.b || word[c.left] < 0 {
			continue // stale
		}
		word[c.left] = c.merged
		word[j] = -1
		nj := next[j]
		next[c.left] = nj
		if nj >= 0 {
			prev[nj] = c.left
		}
		push(prev[c.left])
		push(c.left)
	}
	out := word[:0]
	for i := int32(0); i >= 0; i = next[i] {
		out = append(out, word[i])
	}
	return out
}

// bpeMergeSmall is bpeMerge for short words: a quadratic scan, no allocation.
func bpeMergeSmall(word []int32, r pairRanker) []int32 {
	for len(word) > 1 {
		best, bestRank, bestMerged := -1, int32(0), int32(0)
		for i := 0; i+1 < len(word); i++ {
			if rank, merged, ok := r.pair(word[i], word[i+1]); ok && (best < 0 || rank < bestRank) {
				best, bestRank, bestMerged = i, rank, merged
			}
		}
		if best < 0 {
			break
		}
		word[best] = bestMerged
		word = append(word[:best+1], word[best+2:]...)
	}
	return word
}

type pairCand struct {
	rank, left, a, b, merged int32
}

func (c pairCand) less(o pairCand) bool {
	if c.rank != o.rank {
		return c.rank < o.rank
	}
	return c.left < o.left
}

// wordCache memoises word → ids; safe for concurrent use. Each of its shards
// is cleared when full, which bounds memory on endless distinct words.
type wordCache struct {
	seed   maphash.Seed
	shards [64]cacheShard
}

type cacheShard struct {
	mu sync.Mutex // protects m
	m  map[string][]int32
}

const cacheShardEntries = 1 << 14

func newWordCache() *wordCache {
	return &wordCache{seed: maphash.MakeSeed()}
}

func (c *wordCache) shard(w string) *cacheShard {
	return &c.shards[maphash.String(c.seed, w)&63]
}

func (c *wordCache) get(w string) ([]int32, bool) {
	s := c.shard(w)
	s.mu.Lock()
	ids, ok := s.m[w]
	s.mu.Unlock()
	return ids, ok
}

func (c *wordCache) put(w string, ids []int32) {
	s := c.shard(w)
	s.mu.Lock()
	if s.m == nil || len(s.m) >= cacheShardEntries {
		s.m = make(map[string][]int32)
	}
	s.m[strings.Clone(w)] = ids
	s.mu.Unlock()
}
