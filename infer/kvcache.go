package infer

import (
	"encoding/binary"
	"hash/fnv"
	"slices"

	"github.com/gotron/gotron/tensor"
)

// kvPool is the paged KV cache: one preallocated pool of fixed-size blocks,
// each holding BlockTokens positions of keys and values for every layer.
// Sequences own blocks through block tables (block ids in position order);
// a block is shared (reference-counted) when prefix caching finds the same
// full block of tokens in two sequences. Not safe for concurrent use: the
// engine's step owns it.
//
// Block states: free (on the free list, no contents), used (refs > 0), or
// cached (refs == 0 but its full-block hash is still indexed, so a later
// prompt with the same prefix can reuse it; evicted least recently released
// first when the free list is empty). Used() counts only used blocks.
type kvPool struct {
	blockTokens int // positions per block
	numBlocks   int
	dev         tensor.Device // where the keys and values are
	// k[layer], v[layer] (nil at a gated delta net layer):
	// (numBlocks, groups, blockTokens, head dim), as
	// vLLM's blocks: a block's keys of one head are contiguous, so
	// attention streams them in order (tensor.PagedAttention's layout).
	k, v []*tensor.Tensor

	refs  []int32          // per block
	meta  []blockMeta      // per block: its prefix-cache identity
	free  []int32          // free block ids (a stack)
	index map[uint64]int32 // prefix key → cached or used block
	// The cached blocks (refs 0, indexed) form a doubly linked list, least
	// recently released first: lruHead, lruTail, and per block prev/next
	// (-1: none) and inLRU.
	lruHead, lruTail int32
	lruLen           int
	prev, next       []int32
	inLRU            []bool
}

// blockMeta identifies a full block's contents for prefix caching: the key
// hashes (parent key, tokens); parent and tokens are kept to rule out hash
// collisions.
type blockMeta struct {
	hashed bool
	key    uint64
	parent uint64
	tokens []int32
}

// newKVPool allocates on dev numBlocks blocks, for each layer whose cached
// entry is true (attention; a gated delta net layer keeps no keys and
// values), of groups KV heads of dim floats per position.
func newKVPool(dev tensor.Device, cached []bool, groups, dim, blockTokens, numBlocks int, sharedKV bool) *kvPool {
	p := &kvPool{blockTokens: blockTokens, numBlocks: numBlocks, dev: dev,
		refs: make([]int32, numBlocks), meta: make([]blockMeta, numBlocks), inLRU: make([]bool, numBlocks),
		index: map[uint64]int32{}, lruHead: -1, lruTail: -1,
		prev: make([]int32, numBlocks), next: make([]int32, numBlocks)}
	// Committed now: the pool is the server's memory, so an allocation the
	// machine cannot back fails at start, not in a request, and a decode
	// step that writes a new block's keys does not fault its pages in one
	// by one (a third of a 32-sequence step of GPT-2 124M when the blocks
	// were fresh).
	for _, on := range cached {
		if !on {
			p.k, p.v = append(p.k, nil), append(p.v, nil)
			continue
		}
		k := tensor.NewCommitted(dev, numBlocks, groups, blockTokens, dim)
		v := k // sharedKV: the keys are the values (cached MLA latents), kept once
		if !sharedKV {
			v = tensor.NewCommitted(dev, numBlocks, groups, blockTokens, dim)
		}
		p.k, p.v = append(p.k, k), append(p.v, v)
	}
	for b := numBlocks - 1; b >= 0; b-- {
		p.free = append(p.free, int32(b))
	}
	return p
}

// Used returns the number of blocks held by sequences.
func (p *kvPool) Used() int { return p.numBlocks - len(p.free) - p.cachedCount() }

func (p *kvPool) cachedCount() int { return p.lruLen }

// Available returns how many blocks alloc can hand out (free and cached).
func (p *kvPool) Available() int { return len(p.free) + p.lruLen }

// lruPush appends id (just released) to the cached list.
func (p *kvPool) lruPush(id int32) {
	p.prev[id], p.next[id] = p.lruTail, -1
	if p.lruTail >= 0 {
		p.next[p.lruTail] = id
	} else {
		p.lruHead = id
	}
	p.lruTail = id
	p.inLRU[id] = true
	p.lruLen++
}

// lruRemove unlinks id from the cached list.
func (p *kvPool) lruRemove(id int32) {
	if pr := p.prev[id]; pr >= 0 {
		p.next[pr] = p.next[id]
	} else {
		p.lruHead = p.next[id]
	}
	if nx := p.next[id]; nx >= 0 {
		p.prev[nx] = p.prev[id]
	} else {
		p.lruTail = p.prev[id]
	}
	p.inLRU[id] = false
	p.lruLen--
}

// alloc returns a block with one reference, evicting the least recently
// released cached block when nothing is free; ok is false when every block
// is used.
func (p *kvPool) alloc() (id int32, ok bool) {
	if n := len(p.free); n > 0 {
		id = p.free[n-1]
		p.free = p.free[:n-1]
	} else if p.lruHead >= 0 {
		id = p.lruHead
		p.lruRemove(id)
		p.unindex(id)
	} else {
		return -1, false
	}
	p.refs[id] = 1
	return id, true
}

// release drops one reference; a block nobody holds goes to the cache when
// indexed, else to the free list.
func (p *kvPool) release(id int32) {
	p.refs[id]--
	if p.refs[id] > 0 {
		return
	}
	if p.refs[id] < 0 {
		panic("infer: KV block released twice")
	}
	if p.meta[id].hashed {
		p.lruPush(id)
		return
	}
	p.free = append(p.free, id)
}

// acquire takes a reference to an indexed block found by lookup.
func (p *kvPool) acquire(id int32) {
	if p.inLRU[id] {
		p.lruRemove(id)
	}
	p.refs[id]++
}

// lookup returns the indexed block holding tokens after the prefix parent.
func (p *kvPool) lookup(parent uint64, tokens []int32) (int32, bool) {
	id, ok := p.index[blockKey(parent, tokens)]
	if !ok {
		return -1, false
	}
	m := &p.meta[id]
	if m.parent != parent || !slices.Equal(m.tokens, tokens) {
		return -1, false // a hash collision
	}
	return id, true
}

// register indexes the full block id as holding tokens after parent and
// returns its key. A block with the same contents already indexed wins (id
// stays unindexed and is freed normally).
func (p *kvPool) register(id int32, parent uint64, tokens []int32) uint64 {
	key := blockKey(parent, tokens)
	if _, dup := p.index[key]; dup || p.meta[id].hashed {
		return key
	}
	p.index[key] = id
	p.meta[id] = blockMeta{hashed: true, key: key, parent: parent, tokens: append(p.meta[id].tokens[:0], tokens...)}
	return key
}

func (p *kvPool) unindex(id int32) {
	m := &p.meta[id]
	if m.hashed && p.index[m.key] == id {
		delete(p.index, m.key)
	}
	m.hashed = false
}

// dropCache frees every cached block (tests and a cache reset).
func (p *kvPool) dropCache() {
	for p.lruHead >= 0 {
		id := p.lruHead
		p.lruRemove(id)
		p.unindex(id)
		p.free = append(p.free, id)
	}
}

// blockKey hashes a block's tokens chained to its prefix's key (FNV-1a).
func blockKey(parent uint64, tokens []int32) uint64 {
	h := fnv.New64a()
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], parent)
	h.Write(b[:])
	for _, t := range tokens {
		binary.LittleEndian.PutUint32(b[:4], uint32(t))
		h.Write(b[:4])
	}
	return h.Sum64()
}

// slot returns where position pos of a sequence with block table table is
// kept: block·blockTokens + offset.
func (p *kvPool) slot(table []int32, pos int) int {
	return int(table[pos/p.blockTokens])*p.blockTokens + pos%p.blockTokens
}
