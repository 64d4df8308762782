package infer

import (
	"testing"

	"github.com/gotron/gotron/tensor"
)

// TestKVPoolAccounting: blocks move free → used → cached (when indexed) →
// reused by lookup or evicted (least recently released first), and the
// counts always add up to the pool.
func TestKVPoolAccounting(t *testing.T) {
	p := newKVPool(tensor.CPU, []bool{true}, 1, 2, 4, 3, false)
	check := func(used, cached, avail int) {
		t.Helper()
		if p.Used() != used || p.cachedCount() != cached || p.Available() != avail {
			t.Fatalf("used %d cached %d available %d; want %d %d %d", p.Used(), p.cachedCount(), p.Available(), used, cached, avail)
		}
	}
	a, _ := p.alloc()
	b, _ := p.alloc()
	c, _ := p.alloc()
	if _, ok := p.alloc(); ok {
		t.Fatal("alloc from a full pool")
	}
	check(3, 0, 0)
	ka := p.register(a, 0, []int32{1, 2, 3, 4})
	kb := p.register(b, ka, []int32{5, 6, 7, 8})
	if p.register(c, 0, []int32{1, 2, 3, 4}) != ka || p.meta[c].hashed {
		t.Fatal("a duplicate block was indexed")
	}
	p.release(c) // unindexed: free
	p.release(b) // indexed: cached
	p.release(a)
	check(0, 2, 3)
	if id, ok := p.lookup(0, []int32{1, 2, 3, 4}); !ok || id != a {
		t.Fatalf("lookup of block a: %d %v", id, ok)
	}
	if _, ok := p.lookup(1, []int32{5, 6, 7, 8}); ok {
		t.Fatal("lookup under the wrong parent")
	}
	p.acquire(a)
	check(1, 1, 2)
	x, _ := p.alloc() // the free block c
	y, _ := p.alloc() // evicts b, the only cached block
	if x != c || y != b {
		t.Fatalf("alloc gave %d, %d; want free %d, then evicted %d", x, y, c, b)
	}
	if _, ok := p.lookup(ka, []int32{5, 6, 7, 8}); ok {
		t.Fatal("an evicted block is still found")
	}
	check(3, 0, 0)
	for _, id := range []int32{a, x, y} {
		p.release(id)
	}
	check(0, 1, 3)
	p.dropCache()
	check(0, 0, 3)
	_ = kb
}
