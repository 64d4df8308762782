package tokenizer

import (
	"strings"
	"unicode"
	"unicode/utf8"
)

// addedTokens finds special/added tokens (such as "<|endoftext|>") in text,
// which are cut out before pre-tokenization and map straight to their ids.
// At each position the longest token wins; the leftmost position first.
type addedTokens struct {
	byFirst [256][]addedToken // candidates by first byte, longest first
	any     bool
}

type addedToken struct {
	text string
	id   int
	// Hugging Face's AddedToken flags: lstrip and rstrip take the
	// whitespace before/after the token into it; singleWord matches only
	// where no word character touches the token.
	lstrip, rstrip, singleWord bool
}

func newAddedTokens(toks []addedToken) *addedTokens {
	a := &addedTokens{}
	for _, t := range toks {
		if t.text == "" {
			continue
		}
		b := t.text[0]
		list := append(a.byFirst[b], t)
		for k := len(list) - 1; k > 0 && len(list[k].text) > len(list[k-1].text); k-- {
			list[k], list[k-1] = list[k-1], list[k]
		}
		a.byFirst[b] = list
		a.any = true
	}
	return a
}

// isWordRune is a word character for single_word tokens.
func isWordRune(r rune) bool {
	return r == '_' || unicode.IsLetter(r) || unicode.IsNumber(r)
}

// next returns the first added token in s at or after i: its start, end and
// id, or start = -1. With lstrip/rstrip the span includes the whitespace
// around the token (never before i).
func (a *addedTokens) next(s string, i int) (start, end, id int) {
	if a == nil || !a.any {
		return -1, -1, -1
	}
	from := i
	for ; i < len(s); i++ {
		for _, t := range a.byFirst[s[i]] {
			if !strings.HasPrefix(s[i:], t.text) {
				continue
			}
			e := i + len(t.text)
			if t.singleWord {
				before, _ := utf8.DecodeLastRuneInString(s[:i])
				after, _ := utf8.DecodeRuneInString(s[e:])
				if (i > 0 && isWordRune(before)) || (e < len(s) && isWordRune(after)) {
					continue
				}
			}
			st := i
			if t.lstrip {
				st = from + len(strings.TrimRightFunc(s[from:i], unicode.IsSpace))
			}
			if t.rstrip {
				e = len(s) - len(strings.TrimLeftFunc(s[e:], unicode.IsSpace))
			}
			return st, e, t.id
		}
	}
	return -1, -1, -1
}

// each calls text for every stretch of s between added tokens and special
// for every added token, in order.
func (a *addedTokens) each(s string, text func(string), special func(id int)) {
	for len(s) > 0 {
		start, end, id := a.next(s, 0)
		if start < 0 {
			text(s)
			return
		}
		if start > 0 {
			text(s[:start])
		}
		special(id)
		s = s[end:]
	}
}
