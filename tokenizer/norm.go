package tokenizer

import (
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Unicode normalization forms (UAX #15) over the generated tables in
// normtables.go, for Hugging Face's NFC/NFD/NFKC/NFKD normalizers and BERT's
// accent stripping. Invalid UTF-8 bytes pass through unchanged.

// Hangul syllable constants (UAX #15, section 16 of the Unicode standard).
const (
	hangulSBase  = 0xAC00
	hangulLBase  = 0x1100
	hangulVBase  = 0x1161
	hangulTBase  = 0x11A7
	hangulLCount = 19
	hangulVCount = 21
	hangulTCount = 28
	hangulNCount = hangulVCount * hangulTCount
	hangulSCount = hangulLCount * hangulNCount
)

// normDecompose returns s fully decomposed (compat selects NFKD) and in
// canonical order. Bytes of invalid UTF-8 are kept as they are.
func normDecompose(s string, compat bool) string {
	var b strings.Builder
	b.Grow(len(s))
	var run []rune // pending characters with a non-zero combining class
	flush := func() {
		slices.SortStableFunc(run, func(x, y rune) int { return int(cccTable[x]) - int(cccTable[y]) })
		for _, r := range run {
			b.WriteRune(r)
		}
		run = run[:0]
	}
	emit := func(r rune) {
		if cccTable[r] == 0 {
			flush()
			b.WriteRune(r)
			return
		}
		run = append(run, r)
	}
	for i := 0; i < len(s); {
		r, w := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && w == 1 {
			flush()
			b.WriteByte(s[i])
			i++
			continue
		}
		i += w
		switch d, ok := nfkdTable[r]; {
		case r >= hangulSBase && r < hangulSBase+hangulSCount:
			si := r - hangulSBase
			emit(hangulLBase + si/hangulNCount)
			emit(hangulVBase + (si%hangulNCount)/hangulTCount)
			if t := si % hangulTCount; t != 0 {
				emit(hangulTBase + t)
			}
		case compat && ok:
			for _, x := range d {
				emit(x)
			}
		default:
			if d, ok := nfdTable[r]; ok {
				for _, x := range d {
					emit(x)
				}
			} else {
				emit(r)
			}
		}
	}
	flush()
	return b.String()
}

// composePair returns the primary composite of a and b.
func composePair(a, b rune) (rune, bool) {
	if a >= hangulLBase && a < hangulLBase+hangulLCount && b >= hangulVBase && b < hangulVBase+hangulVCount {
		return hangulSBase + ((a-hangulLBase)*hangulVCount+(b-hangulVBase))*hangulTCount, true
	}
	if a >= hangulSBase && a < hangulSBase+hangulSCount && (a-hangulSBase)%hangulTCount == 0 &&
		b > hangulTBase && b < hangulTBase+hangulTCount {
		return a + (b - hangulTBase), true
	}
	c, ok := composeTable[uint64(a)<<21|uint64(b)]
	return c, ok
}

// normCompose is canonical composition of a decomposed, ordered string.
func normCompose(s string) string {
	out := make([]rune, 0, len(s))
	starter := -1
	for i := 0; i < len(s); {
		r, w := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && w == 1 {
			out = append(out, -1-rune(s[i])) // an invalid byte, kept as is
			starter = -1
			i++
			continue
		}
		i += w
		cc := cccTable[r]
		if starter >= 0 {
			last := len(out) - 1
			adjacent := last == starter
			if lastCC := cccTable[out[last]]; adjacent || (lastCC != 0 && lastCC < cc) {
				if p, ok := composePair(out[starter], r); ok {
					out[starter] = p
					continue
				}
			}
		}
		if cc == 0 {
			starter = len(out)
		}
		out = append(out, r)
	}
	var b strings.Builder
	b.Grow(len(s))
	for _, r := range out {
		if r < 0 {
			b.WriteByte(byte(-1 - r))
		} else {
			b.WriteRune(r)
		}
	}
	return b.String()
}

// NFC, NFD, NFKC and NFKD forms.
func normNFD(s string) string  { return normDecompose(s, false) }
func normNFKD(s string) string { return normDecompose(s, true) }
func normNFC(s string) string  { return normCompose(normDecompose(s, false)) }
func normNFKC(s string) string { return normCompose(normDecompose(s, true)) }

// stripAccents is BERT's accent stripping: NFD, then drop nonspacing marks.
func stripAccents(s string) string {
	return strings.Map(func(r rune) rune {
		if unicode.Is(unicode.Mn, r) {
			return -1
		}
		return r
	}, normNFD(s))
}
