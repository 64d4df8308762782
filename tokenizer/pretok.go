package tokenizer

import (
	"unicode"

	"github.com/dlclark/regexp2/v2"
	"unicode/utf8"
)

// Pre-tokenizers split text into the pieces BPE runs on. Each is a splitFunc:
// given s and a start i < len(s) it returns the end of the piece at i. They
// are hand-written equivalents of the reference regular expressions, which
// need the lookahead \s+(?!\S) that Go's regexp (RE2) lacks.

// splitFunc returns the end of the pre-token starting at s[i].
type splitFunc func(s string, i int) int

// Character classes of the reference patterns: \p{L}, \p{N}, \s (Unicode
// White_Space, as Python's regex module) and everything else.
const (
	clsOther uint8 = iota
	clsLetter
	clsNumber
	clsSpace
)

var asciiClass = func() (t [128]uint8) {
	for c := range 128 {
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z':
			t[c] = clsLetter
		case '0' <= c && c <= '9':
			t[c] = clsNumber
		case c == ' ', '\t' <= c && c <= '\r':
			t[c] = clsSpace
		}
	}
	return t
}()

// classAt returns the class and byte width of the rune at s[i]. An invalid
// UTF-8 byte is one "other" character.
func classAt(s string, i int) (uint8, int) {
	if c := s[i]; c < utf8.RuneSelf {
		return asciiClass[c], 1
	}
	r, w := utf8.DecodeRuneInString(s[i:])
	switch {
	case r == utf8.RuneError && w == 1:
		return clsOther, 1
	case unicode.IsLetter(r):
		return clsLetter, w
	case unicode.IsNumber(r):
		return clsNumber, w
	case unicode.IsSpace(r):
		return clsSpace, w
	}
	return clsOther, w
}

// runOf returns the end of the run of class cls starting at i.
func runOf(s string, i int, cls uint8) int {
	for i < len(s) {
		c, w := classAt(s, i)
		if c != cls {
			break
		}
		i += w
	}
	return i
}

// contraction returns the length of 's 't 're 've 'm 'll 'd at s[i] (an
// apostrophe), or 0. foldCase matches them case-insensitively, as (?i:...).
func contraction(s string, i int, foldCase bool) int {
	lower := func(k int) byte {
		if i+k >= len(s) {
			return 0
		}
		c := s[i+k]
		if foldCase && 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		return c
	}
	switch lower(1) {
	case 's', 't', 'm', 'd':
		return 2
	case 'r', 'v':
		if lower(2) == 'e' {
			return 3
		}
	case 'l':
		if lower(2) == 'l' {
			return 3
		}
	}
	return 0
}

// spaceEnd implements \s+(?!\S)|\s+ at a whitespace run starting at i: the
// run up to the end of s, or up to but excluding its last character when a
// non-space follows (at least one character).
func spaceEnd(s string, i int) int {
	j, last := i, i
	for j < len(s) {
		c, w := classAt(s, j)
		if c != clsSpace {
			break
		}
		last = j
		j += w
	}
	if j == len(s) || last == i {
		return j
	}
	return last
}

// splitGPT2 is GPT-2's pattern:
//
//	's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
func splitGPT2(s string, i int) int {
	if s[i] == '\'' {
		if n := contraction(s, i, false); n > 0 {
			return i + n
		}
	}
	c, w := classAt(s, i)
	if s[i] == ' ' && i+1 < len(s) {
		if c2, w2 := classAt(s, i+1); c2 != clsSpace {
			c, w = c2, w2+1
		}
	}
	if c == clsSpace {
		return spaceEnd(s, i)
	}
	return runOf(s, i+w, c)
}

// splitLlama3 is the cl100k_base / Llama-3 pattern:
//
//	(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
//	 ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
func splitLlama3(s string, i int) int {
	if s[i] == '\'' {
		if n := contraction(s, i, true); n > 0 {
			return i + n
		}
	}
	c, w := classAt(s, i)
	if c == clsNumber { // \p{N}{1,3}
		j := i + w
		for k := 1; k < 3 && j < len(s); k++ {
			c2, w2 := classAt(s, j)
			if c2 != clsNumber {
				break
			}
			j += w2
		}
		return j
	}
	return splitLlama3Rest(s, i, c, w)
}

// splitLlama3Rest is splitLlama3 after the contractions and numbers: the
// character at i has class c (not a number) and width w.
func splitLlama3Rest(s string, i int, c uint8, w int) int {
	// [^\r\n\p{L}\p{N}]?\p{L}+
	if c == clsLetter {
		return runOf(s, i+w, clsLetter)
	}
	if c != clsNumber && s[i] != '\r' && s[i] != '\n' && i+w < len(s) {
		if c2, w2 := classAt(s, i+w); c2 == clsLetter {
			return runOf(s, i+w+w2, clsLetter)
		}
	}
	//  ?[^\s\p{L}\p{N}]+[\r\n]*
	j := i
	if s[i] == ' ' && i+1 < len(s) {
		if c2, _ := classAt(s, i+1); c2 == clsOther {
			j = i + 1
		}
	}
	if c2, _ := classAt(s, j); c2 == clsOther {
		j = runOf(s, j, clsOther)
		for j < len(s) && (s[j] == '\r' || s[j] == '\n') {
			j++
		}
		return j
	}
	// \s*[\r\n]+ : whitespace up to and including the run's last \r or \n.
	end, lastNL := i, -1
	for end < len(s) {
		c2, w2 := classAt(s, end)
		if c2 != clsSpace {
			break
		}
		if s[end] == '\r' || s[end] == '\n' {
			lastNL = end
		}
		end += w2
	}
	if lastNL >= 0 {
		return lastNL + 1
	}
	return spaceEnd(s, i)
}

// pretokenizer calls yield for each pre-token of s, in order; the pieces
// concatenate to s.
type pretokenizer func(s string, yield func(piece string))

// byRule is the pretokenizer of a hand-written splitFunc.
func byRule(f splitFunc) pretokenizer {
	return func(s string, yield func(string)) {
		for i := 0; i < len(s); {
			j := f(s, i)
			yield(s[i:j])
			i = j
		}
	}
}

// byRegexp is the pretokenizer of a regular expression with lookaround
// (dlclark/regexp2, .NET semantics: \s is Unicode White_Space as in
// Python's regex module). Text between matches is yielded as its own piece.
func byRegexp(re *regexp2.Regexp) pretokenizer {
	return func(s string, yield func(string)) {
		locs, err := re.FindAllStringIndex(s, -1)
		if err != nil { // only on a match timeout, which is not set
			yield(s)
			return
		}
		at := 0
		for _, l := range locs {
			if l[0] > at {
				yield(s[at:l[0]])
			}
			if l[1] > l[0] {
				yield(s[l[0]:l[1]])
			}
			at = l[1]
		}
		if at < len(s) {
			yield(s[at:])
		}
	}
}

// splitTikTokenV1 is Megatron's PATTERN_TIKTOKEN ("v1"):
//
//	[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+
//
// The possessive quantifiers change nothing here: what they keep cannot be
// matched by what follows them.
func splitTikTokenV1(s string, i int) int {
	c, w := classAt(s, i)
	if c == clsNumber {
		return i + w
	}
	return splitLlama3Rest(s, i, c, w)
}

// patternTikTokenV2 is Megatron's PATTERN_TIKTOKEN_V2 (o200k-like, no
// contractions), implemented by splitTikTokenV2; the tests check the two
// agree.
const patternTikTokenV2 = `[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+` +
	`|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*` +
	`|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+`

// Letter-case classes of the v2 (o200k-like) pattern, by rune.
func isUpperish(r rune) bool { // [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]
	return unicode.In(r, unicode.Lu, unicode.Lt, unicode.Lm, unicode.Lo, unicode.M)
}

func isLowerish(r rune) bool { // [\p{Ll}\p{Lm}\p{Lo}\p{M}]
	return unicode.In(r, unicode.Ll, unicode.Lm, unicode.Lo, unicode.M)
}

// runeAt decodes the rune at s[i]; an invalid byte is (RuneError, 1) and
// belongs to no letter or mark class.
func runeAt(s string, i int) (rune, int) {
	if c := s[i]; c < utf8.RuneSelf {
		return rune(c), 1
	}
	return utf8.DecodeRuneInString(s[i:])
}

// runWhile returns the end of the run of runes satisfying in from i.
func runWhile(s string, i int, in func(rune) bool) int {
	for i < len(s) {
		r, w := runeAt(s, i)
		if r == utf8.RuneError && w == 1 || !in(r) {
			break
		}
		i += w
	}
	return i
}

// upperLower matches U*W+ at i (U upper-ish, W lower-ish) with the
// regex's backtracking: the W+ starts at the last position of the U* run
// (or just after it) that holds a W, and runs greedily from there.
func upperLower(s string, i int) (int, bool) {
	k := runWhile(s, i, isUpperish)
	if k < len(s) {
		if r, w := runeAt(s, k); !(r == utf8.RuneError && w == 1) && isLowerish(r) {
			return runWhile(s, k, isLowerish), true
		}
	}
	// Backtrack into the U* run: the last rune there that is also W.
	for j := k; j > i; {
		r, w := utf8.DecodeLastRuneInString(s[i:j])
		j -= w
		if isLowerish(r) {
			return j + w, true
		}
	}
	return 0, false
}

// isV2Prefix is [^\r\n\p{L}\p{N}] at s[i], with its width.
func isV2Prefix(s string, i int) (bool, int) {
	r, w := runeAt(s, i)
	if r == '\r' || r == '\n' {
		return false, w
	}
	if r == utf8.RuneError && w == 1 {
		return true, 1
	}
	return !unicode.IsLetter(r) && !unicode.IsNumber(r), w
}

// splitTikTokenV2 is Megatron's PATTERN_TIKTOKEN_V2:
//
//	[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|
//	[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|
//	\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+
func splitTikTokenV2(s string, i int) int {
	pre, pw := isV2Prefix(s, i)
	// Alternative 1, with then without the optional prefix.
	if pre && i+pw < len(s) {
		if end, ok := upperLower(s, i+pw); ok {
			return end
		}
	}
	if end, ok := upperLower(s, i); ok {
		return end
	}
	// Alternative 2: U+ W*.
	upperRun := func(j int) int {
		if j >= len(s) {
			return j
		}
		return runWhile(s, j, isUpperish)
	}
	if pre {
		if k := upperRun(i + pw); k > i+pw {
			return runWhile(s, k, isLowerish)
		}
	}
	if k := upperRun(i); k > i {
		return runWhile(s, k, isLowerish)
	}
	c, w := classAt(s, i)
	if c == clsNumber { // \p{N}
		return i + w
	}
	//  ?[^\s\p{L}\p{N}]+[\r\n/]*
	j := i
	if s[i] == ' ' && i+1 < len(s) {
		if c2, _ := classAt(s, i+1); c2 == clsOther {
			j = i + 1
		}
	}
	if c2, _ := classAt(s, j); c2 == clsOther {
		j = runOf(s, j, clsOther)
		for j < len(s) && (s[j] == '\r' || s[j] == '\n' || s[j] == '/') {
			j++
		}
		return j
	}
	return splitLlama3Rest(s, i, c, w) // the whitespace alternatives
}
