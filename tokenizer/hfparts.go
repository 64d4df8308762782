package tokenizer

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/dlclark/regexp2/v2"
)

// hfNormalizer rewrites one segment of text; first reports whether the
// segment starts the input.
type hfNormalizer func(s string, first bool) string

// component is the "type" of a tokenizer.json component plus its fields.
type component map[string]json.RawMessage

func (c component) typ() string { return c.str("type") }

func (c component) str(k string) string {
	var s string
	_ = json.Unmarshal(c[k], &s)
	return s
}

func (c component) boolean(k string, def bool) bool {
	b := def
	if raw, ok := c[k]; ok && string(raw) != "null" {
		_ = json.Unmarshal(raw, &b)
	}
	return b
}

func (c component) list(k string) []component {
	var l []component
	_ = json.Unmarshal(c[k], &l)
	return l
}

// pattern reads {"String": s} or {"Regex": r} as a regexp2 expression.
func (c component) pattern(k string) (string, error) {
	var p struct {
		String *string `json:"String"`
		Regex  *string `json:"Regex"`
	}
	if err := json.Unmarshal(c[k], &p); err != nil {
		return "", fmt.Errorf("%s: %w", k, err)
	}
	switch {
	case p.String != nil:
		return regexp2.Escape(*p.String), nil
	case p.Regex != nil:
		return *p.Regex, nil
	}
	return "", fmt.Errorf("%s: want {\"String\": ...} or {\"Regex\": ...}", k)
}

func parseComponent(raw json.RawMessage) (component, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var c component
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, err
	}
	return c, nil
}

func parseHFNormalizer(raw json.RawMessage) ([]hfNormalizer, error) {
	c, err := parseComponent(raw)
	if c == nil || err != nil {
		return nil, err
	}
	switch c.typ() {
	case "Sequence":
		var out []hfNormalizer
		for _, sub := range c.list("normalizers") {
			b, _ := json.Marshal(sub)
			n, err := parseHFNormalizer(b)
			if err != nil {
				return nil, err
			}
			out = append(out, n...)
		}
		return out, nil
	case "Prepend":
		p := c.str("prepend")
		return []hfNormalizer{func(s string, _ bool) string {
			if s == "" {
				return s
			}
			return p + s
		}}, nil
	case "Replace":
		pat, err := c.pattern("pattern")
		if err != nil {
			return nil, err
		}
		re, err := regexp2.Compile(pat, regexp2.None)
		if err != nil {
			return nil, fmt.Errorf("normalizer \"Replace\": pattern: %w", err)
		}
		content := c.str("content")
		return []hfNormalizer{func(s string, _ bool) string { return replaceAll(re, s, content) }}, nil
	case "Lowercase":
		return []hfNormalizer{func(s string, _ bool) string { return hfLower(s) }}, nil
	case "NFC", "NFD", "NFKC", "NFKD":
		f := map[string]func(string) string{"NFC": normNFC, "NFD": normNFD, "NFKC": normNFKC, "NFKD": normNFKD}[c.typ()]
		return []hfNormalizer{func(s string, _ bool) string { return f(s) }}, nil
	case "Strip":
		left, right := c.boolean("strip_left", true), c.boolean("strip_right", true)
		return []hfNormalizer{func(s string, _ bool) string {
			if left {
				s = strings.TrimLeftFunc(s, unicode.IsSpace)
			}
			if right {
				s = strings.TrimRightFunc(s, unicode.IsSpace)
			}
			return s
		}}, nil
	case "BertNormalizer":
		lower := c.boolean("lowercase", true)
		strip := c.boolean("strip_accents", lower) // null means "as lowercase"
		clean, chinese := c.boolean("clean_text", true), c.boolean("handle_chinese_chars", true)
		return []hfNormalizer{func(s string, _ bool) string { return bertNormalize(s, clean, chinese, strip, lower) }}, nil
	}
	return nil, fmt.Errorf("normalizer %q is not supported", c.typ())
}

func replaceAll(re *regexp2.Regexp, s, content string) string {
	out, err := re.Replace(s, strings.ReplaceAll(content, "$", "$$"), -1, -1)
	if err != nil {
		return s
	}
	return out
}

// bertNormalize is Hugging Face's BertNormalizer: drop control characters
// and map whitespace to spaces, pad CJK ideographs with spaces, strip accents
// (NFD, then drop nonspacing marks), lowercase.
func bertNormalize(s string, clean, chinese, strip, lower bool) string {
	var b strings.Builder
	for _, r := range s {
		if clean {
			if r == 0 || r == 0xFFFD || isBertControl(r) {
				continue
			}
			if isBertWhitespace(r) {
				r = ' '
			}
		}
		if chinese && isCJK(r) {
			b.WriteByte(' ')
			b.WriteRune(r)
			b.WriteByte(' ')
			continue
		}
		b.WriteRune(r)
	}
	out := b.String()
	if strip {
		out = stripAccents(out)
	}
	if lower {
		out = hfLower(out)
	}
	return out
}

// hfLower is Rust's char::to_lowercase per character (as Hugging Face's
// Lowercase): Go's simple mapping except U+0130, which lowercases to
// "i\u0307".
func hfLower(s string) string {
	if !strings.ContainsRune(s, '\u0130') {
		return strings.ToLower(s)
	}
	return strings.ToLower(strings.ReplaceAll(s, "\u0130", "i\u0307"))
}

func isBertWhitespace(r rune) bool {
	return r == ' ' || r == '\t' || r == '\n' || r == '\r' || unicode.Is(unicode.Zs, r)
}

func isBertControl(r rune) bool {
	if r == '\t' || r == '\n' || r == '\r' {
		return false
	}
	return unicode.In(r, unicode.Cc, unicode.Cf, unicode.Co, unicode.Cs)
}

func isCJK(r rune) bool {
	return (r >= 0x4E00 && r <= 0x9FFF) || (r >= 0x3400 && r <= 0x4DBF) || (r >= 0x20000 && r <= 0x2A6DF) ||
		(r >= 0x2A700 && r <= 0x2B73F) || (r >= 0x2B740 && r <= 0x2B81F) || (r >= 0x2B820 && r <= 0x2CEAF) ||
		(r >= 0xF900 && r <= 0xFAFF) || (r >= 0x2F800 && r <= 0x2FA1F)
}

// hfPreTok splits pieces further.
type hfPreTok struct {
	apply     func(pieces []string, first bool) []string
	byteLevel bool
}

// eachPiece builds an hfPreTok from a per-piece splitter.
func eachPiece(split func(s string, first bool, yield func(string))) func([]string, bool) []string {
	return func(pieces []string, first bool) []string {
		var out []string
		for _, p := range pieces {
			split(p, first, func(q string) { out = append(out, q) })
		}
		return out
	}
}

// knownSplit returns the hand-written splitter for a reference pattern.
func knownSplit(pattern string) (pretokenizer, bool) {
	switch pattern {
	case `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`:
		return byRule(splitGPT2), true
	case `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`:
		return byRule(splitLlama3), true
	}
	return nil, false
}

func parseHFPreTok(raw json.RawMessage) ([]hfPreTok, error) {
	c, err := parseComponent(raw)
	if c == nil || err != nil {
		return nil, err
	}
	switch c.typ() {
	case "Sequence":
		var out []hfPreTok
		for _, sub := range c.list("pretokenizers") {
			b, _ := json.Marshal(sub)
			p, err := parseHFPreTok(b)
			if err != nil {
				return nil, err
			}
			out = append(out, p...)
		}
		return out, nil
	case "ByteLevel":
		prefix, useRegex := c.boolean("add_prefix_space", true), c.boolean("use_regex", true)
		split := byRule(splitGPT2)
		return []hfPreTok{{byteLevel: true, apply: eachPiece(func(s string, first bool, yield func(string)) {
			if prefix && s != "" && s[0] != ' ' {
				s = " " + s
			}
			if useRegex {
				split(s, yield)
			} else {
				yield(s)
			}
		})}}, nil
	case "Split":
		pat, err := c.pattern("pattern")
		if err != nil {
			return nil, err
		}
		if c.boolean("invert", false) {
			return nil, errors.New("pre-tokenizer \"Split\": invert=true is not supported")
		}
		behavior := c.str("behavior")
		split, known := knownSplit(pat)
		if !known || behavior != "Isolated" {
			re, err := regexp2.Compile(pat, regexp2.None)
			if err != nil {
				return nil, fmt.Errorf("pre-tokenizer \"Split\": pattern %q: %w", pat, err)
			}
			split, err = splitBehavior(re, behavior)
			if err != nil {
				return nil, err
			}
		}
		return []hfPreTok{{apply: eachPiece(func(s string, _ bool, yield func(string)) { split(s, yield) })}}, nil
	case "Metaspace":
		return parseMetaspace(c)
	case "BertPreTokenizer":
		return []hfPreTok{{apply: eachPiece(func(s string, _ bool, yield func(string)) {
			splitFields(s, unicode.IsSpace, isBertPunct, yield)
		})}}, nil
	case "WhitespaceSplit":
		return []hfPreTok{{apply: eachPiece(func(s string, _ bool, yield func(string)) {
			for _, f := range strings.FieldsFunc(s, unicode.IsSpace) {
				yield(f)
			}
		})}}, nil
	case "Whitespace":
		split := byRegexp(regexp2.MustCompile(`\w+|[^\w\s]+`, regexp2.None))
		return []hfPreTok{{apply: eachPiece(func(s string, _ bool, yield func(string)) {
			split(s, func(p string) {
				if strings.TrimFunc(p, unicode.IsSpace) != "" {
					yield(p)
				}
			})
		})}}, nil
	case "Digits":
		single := c.boolean("individual_digits", false)
		return []hfPreTok{{apply: eachPiece(func(s string, _ bool, yield func(string)) {
			splitDigits(s, single, yield)
		})}}, nil
	case "Punctuation":
		if b := c.str("behavior"); b != "" && b != "Isolated" {
			return nil, fmt.Errorf("pre-tokenizer \"Punctuation\": behavior %q is not supported", b)
		}
		return []hfPreTok{{apply: eachPiece(func(s string, _ bool, yield func(string)) {
			splitFields(s, func(rune) bool { return false }, isBertPunct, yield)
		})}}, nil
	}
	return nil, fmt.Errorf("pre-tokenizer %q is not supported", c.typ())
}

// splitBehavior is a Split pre-tokenizer over a regular expression.
func splitBehavior(re *regexp2.Regexp, behavior string) (pretokenizer, error) {
	type span struct {
		s     string
		match bool
	}
	spans := func(s string) []span {
		var out []span
		locs, _ := re.FindAllStringIndex(s, -1)
		at := 0
		for _, l := range locs {
			if l[0] > at {
				out = append(out, span{s[at:l[0]], false})
			}
			if l[1] > l[0] {
				out = append(out, span{s[l[0]:l[1]], true})
			}
			at = l[1]
		}
		if at < len(s) {
			out = append(out, span{s[at:], false})
		}
		return out
	}
	switch behavior {
	case "Isolated":
		return byRegexp(re), nil
	case "Removed":
		return func(s string, yield func(string)) {
			for _, sp := range spans(s) {
				if !sp.match {
					yield(sp.s)
				}
			}
		}, nil
	case "MergedWithPrevious":
		return func(s string, yield func(string)) {
			cur := ""
			for _, sp := range spans(s) {
				cur += sp.s
				if sp.match {
					yield(cur)
					cur = ""
				}
			}
			if cur != "" {
				yield(cur)
			}
		}, nil
	case "MergedWithNext":
		return func(s string, yield func(string)) {
			cur := ""
			for _, sp := range spans(s) {
				if sp.match && cur != "" {
					yield(cur)
					cur = ""
				}
				cur += sp.s
			}
			if cur != "" {
				yield(cur)
			}
		}, nil
	}
	return nil, fmt.Errorf("pre-tokenizer \"Split\": behavior %q is not supported", behavior)
}

func parseMetaspace(c component) ([]hfPreTok, error) {
	repl := c.str("replacement")
	if repl == "" {
		repl = spSpace
	}
	scheme := c.str("prepend_scheme")
	if scheme == "" {
		scheme = "never"
		if c.boolean("add_prefix_space", true) {
			scheme = "always"
		}
	}
	doSplit := c.boolean("split", true)
	return []hfPreTok{{apply: eachPiece(func(s string, first bool, yield func(string)) {
		s = strings.ReplaceAll(s, " ", repl)
		if (scheme == "always" || (scheme == "first" && first)) && !strings.HasPrefix(s, repl) {
			s = repl + s
		}
		if !doSplit {
			yield(s)
			return
		}
		for s != "" { // MergedWithNext: each replacement starts a piece
			i := strings.Index(s[1:], repl)
			if i < 0 {
				yield(s)
				return
			}
			yield(s[:i+1])
			s = s[i+1:]
		}
	})}}, nil
}

// splitFields drops runs of drop characters and isolates each isolate
// character.
func splitFields(s string, drop, isolate func(rune) bool, yield func(string)) {
	start := -1
	for i, r := range s {
		switch {
		case drop(r):
			if start >= 0 {
				yield(s[start:i])
				start = -1
			}
		case isolate(r):
			if start >= 0 {
				yield(s[start:i])
				start = -1
			}
			yield(s[i : i+utf8.RuneLen(r)])
		default:
			if start < 0 {
				start = i
			}
		}
	}
	if start >= 0 {
		yield(s[start:])
	}
}

// isBertPunct is BERT's punctuation: ASCII symbols and Unicode P*.
func isBertPunct(r rune) bool {
	if (r >= 33 && r <= 47) || (r >= 58 && r <= 64) || (r >= 91 && r <= 96) || (r >= 123 && r <= 126) {
		return true
	}
	return unicode.IsPunct(r)
}

func splitDigits(s string, single bool, yield func(string)) {
	start, digits := 0, false
	for i, r := range s {
		d := unicode.IsDigit(r)
		if i > start && (d != digits || (d && single)) {
			yield(s[start:i])
			start = i
		}
		digits = d
	}
	if start < len(s) {
		yield(s[start:])
	}
}

// hfDecoder rewrites the list of token strings.
type hfDecoder func(toks []string) []string

func parseHFDecoder(raw json.RawMessage) ([]hfDecoder, error) {
	c, err := parseComponent(raw)
	if c == nil || err != nil {
		return nil, err
	}
	switch c.typ() {
	case "Sequence":
		var out []hfDecoder
		for _, sub := range c.list("decoders") {
			b, _ := json.Marshal(sub)
			d, err := parseHFDecoder(b)
			if err != nil {
				return nil, err
			}
			out = append(out, d...)
		}
		return out, nil
	case "ByteLevel":
		return []hfDecoder{func(toks []string) []string {
			return []string{byteLevelDecode(strings.Join(toks, ""))}
		}}, nil
	case "Replace":
		pat, err := c.pattern("pattern")
		if err != nil {
			return nil, err
		}
		re, err := regexp2.Compile(pat, regexp2.None)
		if err != nil {
			return nil, err
		}
		content := c.str("content")
		return []hfDecoder{func(toks []string) []string {
			for i, t := range toks {
				toks[i] = replaceAll(re, t, content)
			}
			return toks
		}}, nil
	case "ByteFallback":
		return []hfDecoder{decodeByteFallback}, nil
	case "Fuse":
		return []hfDecoder{func(toks []string) []string { return []string{strings.Join(toks, "")} }}, nil
	case "Strip":
		content := c.str("content")
		var start, stop int
		_ = json.Unmarshal(c["start"], &start)
		_ = json.Unmarshal(c["stop"], &stop)
		return []hfDecoder{func(toks []string) []string {
			for i, t := range toks {
				for k := 0; k < start && strings.HasPrefix(t, content); k++ {
					t = t[len(content):]
				}
				for k := 0; k < stop && strings.HasSuffix(t, content); k++ {
					t = t[:len(t)-len(content)]
				}
				toks[i] = t
			}
			return toks
		}}, nil
	case "Metaspace":
		repl := c.str("replacement")
		if repl == "" {
			repl = spSpace
		}
		scheme := c.str("prepend_scheme")
		if scheme == "" && c.boolean("add_prefix_space", true) {
			scheme = "always"
		}
		return []hfDecoder{func(toks []string) []string {
			for i, t := range toks {
				t = strings.ReplaceAll(t, repl, " ")
				if i == 0 && scheme != "never" {
					t = strings.TrimPrefix(t, " ")
				}
				toks[i] = t
			}
			return toks
		}}, nil
	case "WordPiece":
		prefix := c.str("prefix")
		if prefix == "" {
			prefix = "##"
		}
		cleanup := c.boolean("cleanup", true)
		return []hfDecoder{func(toks []string) []string {
			for i, t := range toks {
				if i > 0 {
					if strings.HasPrefix(t, prefix) {
						t = t[len(prefix):]
					} else {
						t = " " + t
					}
				}
				if cleanup {
					t = wordPieceCleanup(t)
				}
				toks[i] = t
			}
			return toks
		}}, nil
	}
	return nil, fmt.Errorf("decoder %q is not supported", c.typ())
}

// decodeByteFallback turns runs of "<0xXX>" tokens into their UTF-8 text
// (U+FFFD per invalid byte, as Hugging Face's ByteFallback decoder).
func decodeByteFallback(toks []string) []string {
	var out []string
	var pending []byte
	flush := func() {
		if len(pending) == 0 {
			return
		}
		if utf8.Valid(pending) {
			out = append(out, string(pending))
		} else {
			for range pending {
				out = append(out, "\uFFFD")
			}
		}
		pending = pending[:0]
	}
	for _, t := range toks {
		if len(t) == 6 && strings.HasPrefix(t, "<0x") && t[5] == '>' {
			if b, err := strconv.ParseUint(t[3:5], 16, 8); err == nil {
				pending = append(pending, byte(b))
				continue
			}
		}
		flush()
		out = append(out, t)
	}
	flush()
	return out
}

func wordPieceCleanup(s string) string {
	r := strings.NewReplacer(" .", ".", " ?", "?", " !", "!", " ,", ",", " ' ", "'", " n't", "n't",
		" 'm", "'m", " do not", " don't", " 's", "'s", " 've", "'ve", " 're", "'re")
	return r.Replace(s)
}

// hfTemplatePart is one item of a single-sequence post-processor template.
type hfTemplatePart struct {
	sequence bool
	id       int
}

func parseHFPostProcessor(raw json.RawMessage, vocab map[string]int) ([]hfTemplatePart, error) {
	c, err := parseComponent(raw)
	if c == nil || err != nil {
		return nil, err
	}
	pair := func(k string) (int, error) {
		var p []json.RawMessage
		if err := json.Unmarshal(c[k], &p); err != nil || len(p) != 2 {
			return 0, fmt.Errorf("%s: want [token, id]", k)
		}
		var id int
		err := json.Unmarshal(p[1], &id)
		return id, err
	}
	switch c.typ() {
	case "TemplateProcessing":
		var single []struct {
			SpecialToken *struct{ ID string } `json:"SpecialToken"`
			Sequence     *struct{ ID string } `json:"Sequence"`
		}
		if err := json.Unmarshal(c["single"], &single); err != nil {
			return nil, fmt.Errorf("single: %w", err)
		}
		var specials map[string]struct {
			IDs []int `json:"ids"`
		}
		_ = json.Unmarshal(c["special_tokens"], &specials)
		var out []hfTemplatePart
		for _, p := range single {
			switch {
			case p.Sequence != nil:
				out = append(out, hfTemplatePart{sequence: true})
			case p.SpecialToken != nil:
				s, ok := specials[p.SpecialToken.ID]
				if !ok {
					id, ok := vocab[p.SpecialToken.ID]
					if !ok {
						return nil, fmt.Errorf("special token %q has no id", p.SpecialToken.ID)
					}
					s.IDs = []int{id}
				}
				for _, id := range s.IDs {
					out = append(out, hfTemplatePart{id: id})
				}
			}
		}
		return out, nil
	case "BertProcessing", "RobertaProcessing":
		cls, err := pair("cls")
		if err != nil {
			return nil, err
		}
		sep, err := pair("sep")
		if err != nil {
			return nil, err
		}
		return []hfTemplatePart{{id: cls}, {sequence: true}, {id: sep}}, nil
	case "ByteLevel":
		return nil, nil
	case "Sequence":
		var out []hfTemplatePart
		for _, sub := range c.list("processors") {
			b, _ := json.Marshal(sub)
			p, err := parseHFPostProcessor(b, vocab)
			if err != nil {
				return nil, err
			}
			if p != nil {
				out = p
			}
		}
		return out, nil
	}
	return nil, fmt.Errorf("post-processor %q is not supported", c.typ())
}
