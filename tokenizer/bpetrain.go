package tokenizer

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
)

// GPT2Files are the two files of a GPT2BPETokenizer (--vocab-file,
// --merge-file), as TrainGPT2BPE writes them.
type GPT2Files struct {
	VocabJSON []byte // vocab.json: token → id
	MergesTxt []byte // merges.txt: "#version: 0.2", then one "left right" pair per line
}

// Tokenizer parses the files (ParseGPT2).
func (f GPT2Files) Tokenizer() (*GPT2, error) {
	return ParseGPT2(f.VocabJSON, f.MergesTxt, "vocab.json", "merges.txt")
}

// Write writes vocab.json and merges.txt into dir (created if needed).
func (f GPT2Files) Write(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("tokenizer: %w", err)
	}
	for name, b := range map[string][]byte{"vocab.json": f.VocabJSON, "merges.txt": f.MergesTxt} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			return fmt.Errorf("tokenizer: %w", err)
		}
	}
	return nil
}

// TrainGPT2BPE learns a byte-level BPE vocabulary of at most vocabSize
// tokens from texts, in GPT2BPETokenizer's format: GPT-2's pre-tokenizer
// splits the text, each piece starts as its bytes, and the adjacent pair
// most frequent over all pieces is merged, again and again, until the
// vocabulary holds the 256 bytes, the merged tokens and "<|endoftext|>"
// (the last id, the EOD). It stops early when no pair is left to merge.
// Ties go to the pair whose bytes sort first, so the files depend only on
// the texts and vocabSize. vocabSize 257 is a byte-level tokenizer: no
// merges. Encoding the texts with the result reproduces the training's
// segmentation.
func TrainGPT2BPE(ctx context.Context, texts []string, vocabSize int) (GPT2Files, error) {
	if vocabSize < 257 {
		return GPT2Files{}, fmt.Errorf("tokenizer: BPE vocabulary size %d: want ≥ 257 (256 bytes and %s)", vocabSize, GPT2EndOfText)
	}
	t := newBPETrainer(countPieces(texts))
	for len(t.syms.bytes) < vocabSize-1 {
		if err := ctx.Err(); err != nil {
			return GPT2Files{}, err
		}
		if !t.mergeBest() {
			break
		}
	}
	return t.files(), nil
}

// countPieces counts GPT-2's pre-tokens in texts ("<|endoftext|>" is cut
// out first, as ParseGPT2's encoder does).
func countPieces(texts []string) map[string]int64 {
	counts := map[string]int64{}
	split := byRule(splitGPT2)
	eot := newAddedTokens([]addedToken{{text: GPT2EndOfText}})
	for _, text := range texts {
		eot.each(text, func(seg string) { split(seg, func(p string) { counts[p]++ }) }, func(int) {})
	}
	return counts
}

// bpeTrainer holds the pieces (as symbol sequences) and the count of every
// adjacent pair, kept up to date as pairs merge; a heap finds the most
// frequent pair (entries whose count changed since they were pushed are
// skipped when popped).
type bpeTrainer struct {
	words  []bpeWord
	syms   symbolTable         // raw bytes of each symbol; 0..255 are the bytes
	counts map[uint64]int64    // pair key → occurrences over all pieces
	where  map[uint64][]int32  // pair key → pieces that held it when it was counted (may repeat or be stale)
	heap   pq[bpePairCount]    // candidates, most frequent first
	merges [][2]int32          // in rank order
	seen   []int32             // per piece: the merge that last visited it, plus one
	dirty  map[uint64]struct{} // pairs whose count changed in this merge
}

type bpeWord struct {
	syms  []int32
	count int64 // occurrences of the piece in the texts
}

// bpePairCount is a heap entry: more frequent first, then by bytes.
type bpePairCount struct {
	count  int64
	a, b   int32
	sa, sb string
}

func (p bpePairCount) less(o bpePairCount) bool {
	if p.count != o.count {
		return p.count > o.count
	}
	if p.sa != o.sa {
		return p.sa < o.sa
	}
	return p.sb < o.sb
}

func pairKey(a, b int32) uint64 { return uint64(uint32(a))<<32 | uint64(uint32(b)) }

func newBPETrainer(counts map[string]int64) *bpeTrainer {
	pieces := make([]string, 0, len(counts))
	for p := range counts {
		pieces = append(pieces, p)
	}
	sort.Strings(pieces)
	t := &bpeTrainer{syms: symbolTable{ids: map[string]int32{}}, counts: map[uint64]int64{},
		where: map[uint64][]int32{}, seen: make([]int32, len(pieces)), dirty: map[uint64]struct{}{}}
	for b := range 256 {
		t.syms.intern(string([]byte{byte(b)}))
	}
	t.words = make([]bpeWord, len(pieces))
	for i, p := range pieces {
		w := bpeWord{syms: make([]int32, len(p)), count: counts[p]}
		for j := 0; j < len(p); j++ {
			w.syms[j] = int32(p[j])
		}
		t.words[i] = w
		t.addPairs(int32(i))
	}
	for k := range t.dirty {
		t.push(k)
	}
	clear(t.dirty)
	return t
}

// addPairs counts the pairs of piece i (sign +1) and indexes them.
func (t *bpeTrainer) addPairs(i int32) {
	w := &t.words[i]
	for j := 0; j+1 < len(w.syms); j++ {
		k := pairKey(w.syms[j], w.syms[j+1])
		t.counts[k] += w.count
		t.dirty[k] = struct{}{}
		if l := t.where[k]; len(l) == 0 || l[len(l)-1] != i {
			t.where[k] = append(l, i)
		}
	}
}

// removePairs uncounts the pairs of piece i.
func (t *bpeTrainer) removePairs(i int32) {
	w := &t.words[i]
	for j := 0; j+1 < len(w.syms); j++ {
		k := pairKey(w.syms[j], w.syms[j+1])
		t.counts[k] -= w.count
		t.dirty[k] = struct{}{}
	}
}

func (t *bpeTrainer) push(k uint64) {
	if n := t.counts[k]; n > 0 {
		a, b := int32(k>>32), int32(uint32(k))
		t.heap.push(bpePairCount{count: n, a: a, b: b, sa: t.syms.bytes[a], sb: t.syms.bytes[b]})
	} else {
		delete(t.counts, k)
	}
}

// mergeBest merges the most frequent pair everywhere (left to right within
// a piece) and reports false when no pair is left.
func (t *bpeTrainer) mergeBest() bool {
	var best bpePairCount
	for {
		if len(t.heap) == 0 {
			return false
		}
		best = t.heap.pop()
		if t.counts[pairKey(best.a, best.b)] == best.count {
			break // current; otherwise stale
		}
	}
	k := pairKey(best.a, best.b)
	c := t.syms.intern(best.sa + best.sb) // may exist already (another pair with the same bytes)
	t.merges = append(t.merges, [2]int32{best.a, best.b})
	stamp := int32(len(t.merges))
	for _, i := range t.where[k] {
		if t.seen[i] == stamp {
			continue
		}
		t.seen[i] = stamp
		w := &t.words[i]
		if !hasPair(w.syms, best.a, best.b) {
			continue // stale index entry
		}
		t.removePairs(i)
		out := w.syms[:0]
		for j := 0; j < len(w.syms); j++ {
			if j+1 < len(w.syms) && w.syms[j] == best.a && w.syms[j+1] == best.b {
				out = append(out, c)
				j++
			} else {
				out = append(out, w.syms[j])
			}
		}
		w.syms = out
		t.addPairs(i)
	}
	delete(t.where, k)
	for d := range t.dirty {
		t.push(d)
	}
	clear(t.dirty)
	return true
}

func hasPair(s []int32, a, b int32) bool {
	for j := 0; j+1 < len(s); j++ {
		if s[j] == a && s[j+1] == b {
			return true
		}
	}
	return false
}

// files renders the vocabulary (bytes, merged tokens in the order they
// first appeared, then "<|endoftext|>") and the merges.
func (t *bpeTrainer) files() GPT2Files {
	var v bytes.Buffer
	v.WriteString("{")
	for id, s := range t.syms.bytes {
		key, _ := json.Marshal(byteLevelEncode(s))
		fmt.Fprintf(&v, "%s: %d, ", key, id)
	}
	key, _ := json.Marshal(GPT2EndOfText)
	fmt.Fprintf(&v, "%s: %d}\n", key, len(t.syms.bytes))
	var m bytes.Buffer
	m.WriteString("#version: 0.2\n")
	for _, p := range t.merges {
		fmt.Fprintf(&m, "%s %s\n", byteLevelEncode(t.syms.bytes[p[0]]), byteLevelEncode(t.syms.bytes[p[1]]))
	}
	return GPT2Files{VocabJSON: v.Bytes(), MergesTxt: m.Bytes()}
}
