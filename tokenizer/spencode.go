package tokenizer

import (
	"math"
	"slices"
	"strings"
)

// encodeBPE is sentencepiece's bpe::Model::Encode over normalized text:
// start from characters (user-defined symbols are single frozen symbols),
// repeatedly merge the adjacent pair whose concatenation is a piece with the
// highest score, leftmost on ties, then split merged UNUSED pieces back.
func (sp *SentencePiece) encodeBPE(norm string) []spSpan {
	// Symbols are spans of norm: symbol i covers norm[start[i]:start[next[i]]].
	var start, next, prev []int
	var frozen []bool
	for i := 0; i < len(norm); {
		n := sp.userPrefix(norm[i:])
		fr := n > 0
		if !fr {
			n = sp.charLen(norm[i:])
		}
		k := len(start)
		start = append(start, i)
		prev = append(prev, k-1)
		next = append(next, k+1)
		frozen = append(frozen, fr)
		i += n
	}
	next[len(next)-1] = -1
	start = append(start, len(norm)) // sentinel end
	end := func(i int) int {
		if next[i] < 0 {
			return len(norm)
		}
		return start[next[i]]
	}
	var h pq[spCand]
	var rev map[string][2]string
	add := func(l, r int) {
		if l < 0 || r < 0 || frozen[l] || frozen[r] {
			return
		}
		piece := norm[start[l]:end(r)]
		id, ok := sp.ids[piece]
		if !ok {
			return
		}
		h.push(spCand{score: sp.m.pieces[id].score, left: l, right: r, size: len(piece)})
		if sp.m.pieces[id].typ == spUnused {
			if rev == nil {
				rev = map[string][2]string{}
			}
			rev[piece] = [2]string{norm[start[l]:end(l)], norm[start[r]:end(r)]}
		}
	}
	for i := 1; i < len(next); i++ {
		add(i-1, i)
	}
	dead := make([]bool, len(next))
	for len(h) > 0 {
		c := h.pop()
		if dead[c.left] || dead[c.right] || next[c.left] != c.right || end(c.right)-start[c.left] != c.size {
			continue // stale
		}
		dead[c.right] = true
		next[c.left] = next[c.right]
		if next[c.right] >= 0 {
			prev[next[c.right]] = c.left
		}
		add(prev[c.left], c.left)
		add(c.left, next[c.left])
	}
	var out []spSpan
	var resegment func(w string)
	resegment = func(w string) {
		id := sp.pieceID(w)
		if id != sp.m.unkID || rev == nil {
			out = append(out, spSpan{w, id})
			return
		}
		p, ok := rev[w]
		if !ok {
			out = append(out, spSpan{w, id})
			return
		}
		resegment(p[0])
		resegment(p[1])
	}
	for i := 0; i >= 0; i = next[i] {
		w := norm[start[i]:end(i)]
		if id, ok := sp.ids[w]; ok && sp.m.pieces[id].typ == spUnused && rev != nil {
			if p, ok := rev[w]; ok {
				resegment(p[0])
				resegment(p[1])
				continue
			}
		}
		resegment(w)
	}
	return out
}

// spCand is a merge candidate: higher score first, then leftmost.
type spCand struct {
	score       float32
	left, right int
	size        int
}

func (c spCand) less(o spCand) bool {
	if c.score != o.score {
		return c.score > o.score
	}
	return c.left < o.left
}

// spTrie is a byte trie over the pieces: the root's children in a table,
// the other nodes' children as sorted runs of edges.
type spTrie struct {
	root  [256]int32 // byte → child of the root, 0 when none
	first []int32    // node → index of its first edge
	count []int32    // node → number of edges
	label []byte     // edge → byte
	child []int32    // edge → node
	id    []int32    // node → piece id, -1 when no piece ends there
}

// step returns the child of node for byte b, or 0.
func (t *spTrie) step(node int32, b byte) int32 {
	if node == 0 {
		return t.root[b]
	}
	lo, hi := t.first[node], t.first[node]+t.count[node]
	for e := lo; e < hi; e++ {
		if t.label[e] == b {
			return t.child[e]
		}
	}
	return 0
}

// initUnigram builds the piece trie and the score range.
func (sp *SentencePiece) initUnigram() {
	type key struct {
		node int32
		b    byte
	}
	children := map[key]int32{}
	ids := []int32{-1}
	sp.minScore, sp.maxScore = math.MaxFloat32, math.SmallestNonzeroFloat32
	for i, p := range sp.m.pieces {
		if p.typ == spNormal {
			sp.minScore = min(sp.minScore, p.score)
			sp.maxScore = max(sp.maxScore, p.score)
		}
		if p.typ != spNormal && p.typ != spUserDefined && p.typ != spUnused {
			continue
		}
		node := int32(0)
		for k := 0; k < len(p.piece); k++ {
			c, ok := children[key{node, p.piece[k]}]
			if !ok {
				c = int32(len(ids))
				ids = append(ids, -1)
				children[key{node, p.piece[k]}] = c
			}
			node = c
		}
		if ids[node] < 0 { // the first of duplicate pieces wins
			ids[node] = int32(i)
		}
	}
	t := &sp.trie
	t.id = ids
	t.first = make([]int32, len(ids))
	t.count = make([]int32, len(ids))
	edges := make([]key, 0, len(children))
	for k := range children {
		edges = append(edges, k)
	}
	slices.SortFunc(edges, func(a, b key) int {
		if a.node != b.node {
			return int(a.node - b.node)
		}
		return int(a.b) - int(b.b)
	})
	for _, e := range edges {
		c := children[e]
		if e.node == 0 {
			t.root[e.b] = c
			continue
		}
		if t.count[e.node] == 0 {
			t.first[e.node] = int32(len(t.label))
		}
		t.count[e.node]++
		t.label = append(t.label, e.b)
		t.child = append(t.child, c)
	}
}

// encodeUnigram is sentencepiece's unigram Model::EncodeOptimized: Viterbi
// over all pieces in the trie, candidate scores computed in float64
// and kept in float32 as the C++ code;
// a character no piece covers becomes <unk> with score min_score - 10.
func (sp *SentencePiece) encodeUnigram(norm string) []spSpan {
	type best struct {
		id     int32
		score  float32
		starts int
	}
	size := len(norm)
	unkScore := sp.minScore - 10
	path := make([]best, size+1)
	for i := range path {
		path[i].starts = -1
	}
	for at := 0; at < size; {
		here := path[at].score
		mblen := min(sp.charLen(norm[at:]), size-at)
		single := false
		node := int32(0)
		for k := at; k < size; k++ {
			node = sp.trie.step(node, norm[k])
			if node == 0 {
				break
			}
			id := sp.trie.id[node]
			if id < 0 || sp.m.pieces[id].typ == spUnused {
				continue
			}
			length := k + 1 - at
			// The C++ ternary makes the score a double: compare in float64,
			// store float32.
			var score float64
			if sp.m.pieces[id].typ == spUserDefined {
				score = float64(float32(length)*sp.maxScore) - 0.1
			} else {
				score = float64(sp.m.pieces[id].score)
			}
			cand := score + float64(here)
			if t := &path[k+1]; t.starts < 0 || cand > float64(t.score) {
				*t = best{id: id, score: float32(cand), starts: at}
			}
			if length == mblen {
				single = true
			}
		}
		if !single {
			cand := unkScore + here
			if t := &path[at+mblen]; t.starts < 0 || cand > t.score {
				*t = best{id: int32(sp.m.unkID), score: cand, starts: at}
			}
		}
		at += mblen
	}
	var out []spSpan
	for e := size; e > 0; e = path[e].starts {
		out = append(out, spSpan{norm[path[e].starts:e], int(path[e].id)})
	}
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return out
}

// spaceSymbol is the whitespace symbol in normalized text.
func (sp *SentencePiece) spaceSymbol() string {
	if sp.m.escapeWS {
		return spSpace
	}
	return " "
}

// initWords decides whether BPE may run word by word: no piece (of those
// merges can produce) holds a space symbol right after another character,
// and whitespace is a prefix. Then no merge crosses a position where a
// space follows a non-space, and each word's merges are independent of the
// others' (the merge order only compares scores and positions).
func (sp *SentencePiece) initWords() {
	if sp.m.treatWSAsSuf {
		return
	}
	ws := sp.spaceSymbol()
	for p := range sp.ids {
		for i := 1; i < len(p); i++ {
			if strings.HasPrefix(p[i:], ws) && !strings.HasSuffix(p[:i], ws) {
				return
			}
		}
	}
	sp.words = true
	sp.cache = newWordCache()
}

// encodeBPEWords is encodeBPE, word by word through a cache when initWords
// allowed it.
func (sp *SentencePiece) encodeBPEWords(norm string) []spSpan {
	if !sp.words {
		return sp.encodeBPE(norm)
	}
	ws := sp.spaceSymbol()
	var out []spSpan
	for len(norm) > 0 {
		// The word ends where a space symbol follows a non-space.
		end := len(norm)
		for i := 1; i < len(norm); i++ {
			if strings.HasPrefix(norm[i:], ws) && !strings.HasSuffix(norm[:i], ws) {
				end = i
				break
			}
		}
		word := norm[:end]
		norm = norm[end:]
		enc, ok := sp.cache.get(word) // pairs of (id, length in bytes)
		if !ok {
			spans := sp.encodeBPE(word)
			enc = make([]int32, 0, 2*len(spans))
			for _, s := range spans {
				enc = append(enc, int32(s.id), int32(len(s.text)))
			}
			sp.cache.put(word, enc)
		}
		at := 0
		for k := 0; k+1 < len(enc); k += 2 {
			n := int(enc[k+1])
			out = append(out, spSpan{word[at : at+n], int(enc[k])})
			at += n
		}
	}
	return out
}
