package preprocess

import (
	"strings"
	"unicode"
	"unicode/utf8"
)

// abbreviations end with a period that does not end a sentence (lower case,
// without the final period).
var abbreviations = map[string]bool{
	"mr": true, "mrs": true, "ms": true, "dr": true, "prof": true, "sr": true, "jr": true, "st": true,
	"vs": true, "etc": true, "e.g": true, "i.e": true, "cf": true, "al": true, "fig": true, "no": true,
	"vol": true, "inc": true, "ltd": true, "co": true, "corp": true, "jan": true, "feb": true, "mar": true,
	"apr": true, "jun": true, "jul": true, "aug": true, "sep": true, "sept": true, "oct": true, "nov": true,
	"dec": true, "u.s": true, "mt": true, "gen": true, "gov": true, "approx": true, "dept": true, "est": true,
}

// SplitSentences splits text into sentences with a small rule-based
// splitter standing in for NLTK's punkt (which Megatron's
// --split-sentences uses). A sentence ends at '.', '!' or '?' (plus any
// closing quotes or brackets) followed by whitespace and then an upper-case
// letter, a digit or an opening quote/bracket — unless the word before a '.'
// is a known abbreviation ("Dr.", "e.g.") or a single letter (an initial).
// Differences from punkt: punkt learns abbreviations, collocations and
// sentence starters from a trained model per language (--lang) and also
// splits before lower-case starters it has seen; this splitter knows a
// fixed English abbreviation list and never splits before a lower-case word.
//
// As punkt, the whitespace between sentences is dropped and empty sentences
// are not returned. With keepNewlines (--keep-newlines, Megatron's
// CustomLanguageVars) the whitespace after a sentence stays at its end, so
// newlines survive.
func SplitSentences(text string, keepNewlines bool) []string {
	var out []string
	emit := func(s string) {
		if !keepNewlines {
			s = strings.TrimSpace(s)
		}
		if strings.TrimSpace(s) != "" {
			out = append(out, s)
		}
	}
	start := 0
	for i := 0; i < len(text); {
		r, w := utf8.DecodeRuneInString(text[i:])
		i += w
		if r != '.' && r != '!' && r != '?' {
			continue
		}
		end := i // after the terminator and closing punctuation
		for end < len(text) {
			c, cw := utf8.DecodeRuneInString(text[end:])
			if c == '.' || c == '!' || c == '?' || c == '"' || c == '\'' || c == ')' || c == ']' || c == '”' || c == '’' {
				end += cw
				continue
			}
			break
		}
		ws := end
		for ws < len(text) {
			c, cw := utf8.DecodeRuneInString(text[ws:])
			if !unicode.IsSpace(c) {
				break
			}
			ws += cw
		}
		if ws == end || ws == len(text) {
			i = end
			continue
		}
		next, _ := utf8.DecodeRuneInString(text[ws:])
		if !(unicode.IsUpper(next) || unicode.IsDigit(next) || strings.ContainsRune("\"'([“‘", next)) {
			i = end
			continue
		}
		if r == '.' && isAbbreviation(text[start:i-1]) {
			i = end
			continue
		}
		if keepNewlines {
			emit(text[start:ws])
		} else {
			emit(text[start:end])
		}
		start, i = ws, ws
	}
	emit(text[start:])
	return out
}

// isAbbreviation reports whether the word ending s (before a period) is an
// abbreviation or an initial.
func isAbbreviation(s string) bool {
	j := strings.LastIndexFunc(s, func(r rune) bool { return unicode.IsSpace(r) || r == '(' || r == '"' })
	word := s
	if j >= 0 {
		_, w := utf8.DecodeRuneInString(s[j:])
		word = s[j+w:]
	}
	if utf8.RuneCountInString(word) == 1 {
		r, _ := utf8.DecodeRuneInString(word)
		return unicode.IsLetter(r)
	}
	return abbreviations[strings.ToLower(word)]
}
