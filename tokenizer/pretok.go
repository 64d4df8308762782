package tokenizer

import (
	"unicode"
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
	// [^\r\n\p{L}\p{N}]?\p{L}+
	if c == clsLetter {
		return runOf(s, i+w, clsLetter)
	}
	if c != clsNumber && s[i] != '\r' && s[i] != '\n' && i+w < len(s) {
		if c2, w2 := classAt(s, i+w); c2 == clsLetter {
			return runOf(s, i+w+w2, clsLetter)
		}
	}
	// \p{N}{1,3}
	if c == clsNumber {
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
