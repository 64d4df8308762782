package tokenizer

import "unicode/utf8"

// byteToRune is GPT-2's bytes_to_unicode: printable Latin-1 bytes map to
// themselves, the other 68 bytes to U+0100.. in order, so that every byte
// string is a printable string.
var byteToRune, runeToByte = func() (b2r [256]rune, r2b map[rune]byte) {
	r2b = make(map[rune]byte, 256)
	n := rune(0)
	for b := range 256 {
		if ('!' <= b && b <= '~') || (0xA1 <= b && b <= 0xAC) || (0xAE <= b && b <= 0xFF) {
			b2r[b] = rune(b)
		} else {
			b2r[b] = 256 + n
			n++
		}
		r2b[b2r[b]] = byte(b)
	}
	return b2r, r2b
}()

// byteLevelDecode maps a byte-level token string back to raw bytes. Runes
// outside the byte alphabet (added tokens) are kept as UTF-8.
func byteLevelDecode(tok string) string {
	out := make([]byte, 0, len(tok))
	for _, r := range tok {
		if b, ok := runeToByte[r]; ok {
			out = append(out, b)
		} else {
			out = utf8.AppendRune(out, r)
		}
	}
	return string(out)
}

// byteLevelEncode maps raw bytes to their byte-level string.
func byteLevelEncode(raw string) string {
	out := make([]byte, 0, 2*len(raw))
	for i := 0; i < len(raw); i++ {
		out = utf8.AppendRune(out, byteToRune[raw[i]])
	}
	return string(out)
}

// byteBPE is byte-level BPE (GPT-2, Hugging Face ByteLevel models): text is
// split by a pre-tokenizer, each piece's bytes become symbols through the
// byte alphabet, and the merges list joins them.
type byteBPE struct {
	split   pretokenizer
	added   *addedTokens
	syms    symbolTable // byte-level token strings
	byteSym [256]int32
	merges  mergeTable
	symID   []int32  // symbol → vocabulary id, -1 when not in the vocabulary
	idBytes []string // vocabulary id → raw bytes
	unk     int      // id for symbols outside the vocabulary, -1 to drop them
	// ignoreMerges maps a piece that is itself a token straight to it
	// (Hugging Face's ignore_merges, set by Llama-3).
	ignoreMerges bool
	cache        *wordCache
}

// newByteBPE builds the model from vocab (token string → id) and merges
// (pairs of token strings, in rank order).
func newByteBPE(vocab map[string]int, merges [][2]string, split pretokenizer, unk int) *byteBPE {
	m := &byteBPE{split: split, unk: unk, cache: newWordCache(),
		syms: symbolTable{ids: make(map[string]int32, len(vocab)+len(merges))}}
	size := 0
	for _, id := range vocab {
		size = max(size, id+1)
	}
	m.idBytes = make([]string, size)
	for tok, id := range vocab {
		m.idBytes[id] = byteLevelDecode(tok)
	}
	intern := func(tok string) int32 {
		s := m.syms.intern(tok)
		for int(s) >= len(m.symID) {
			id, ok := vocab[m.syms.bytes[len(m.symID)]]
			if !ok {
				id = -1
			}
			m.symID = append(m.symID, int32(id))
		}
		return s
	}
	for b := range 256 {
		m.byteSym[b] = intern(string(byteToRune[b]))
	}
	m.merges = make(mergeTable, len(merges))
	for rank, p := range merges {
		m.merges.add(intern(p[0]), intern(p[1]), int32(rank), intern(p[0]+p[1]))
	}
	return m
}

// appendPiece appends the ids of one pre-token.
func (m *byteBPE) appendPiece(ids []int, piece string) []int {
	syms, ok := m.cache.get(piece)
	if !ok && m.ignoreMerges {
		if s, whole := m.syms.ids[byteLevelEncode(piece)]; whole {
			syms, ok = []int32{s}, true
			m.cache.put(piece, syms)
		}
	}
	if !ok {
		word := make([]int32, len(piece))
		for i := 0; i < len(piece); i++ {
			word[i] = m.byteSym[piece[i]]
		}
		syms = bpeMerge(word, m.merges)
		syms = syms[:len(syms):len(syms)]
		m.cache.put(piece, syms)
	}
	for _, s := range syms {
		if id := m.symID[s]; id >= 0 {
			ids = append(ids, int(id))
		} else if m.unk >= 0 {
			ids = append(ids, m.unk)
		}
	}
	return ids
}

func (m *byteBPE) encode(text string) []int {
	ids := make([]int, 0, len(text)/3+1)
	m.added.each(text, func(seg string) {
		m.split(seg, func(piece string) { ids = m.appendPiece(ids, piece) })
	}, func(id int) { ids = append(ids, id) })
	return ids
}

// decode concatenates the raw bytes of ids; ids outside the vocabulary are
// skipped.
func (m *byteBPE) decode(ids []int) string {
	n := 0
	for _, id := range ids {
		if id >= 0 && id < len(m.idBytes) {
			n += len(m.idBytes[id])
		}
	}
	out := make([]byte, 0, n)
	for _, id := range ids {
		if id >= 0 && id < len(m.idBytes) {
			out = append(out, m.idBytes[id]...)
		}
	}
	return string(out)
}
