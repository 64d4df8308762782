package infer

// jsonMaxDepth bounds the nesting of a constrained JSON object.
const jsonMaxDepth = 32

// jsonObject is a pushdown automaton over bytes that accepts exactly the
// prefixes of one JSON object (RFC 8259; leading whitespace allowed,
// nothing after the closing brace, nesting up to jsonMaxDepth). A value
// copy is an independent state, so a token can be tried on a copy (the
// stack is an array, not a slice).
type jsonObject struct {
	stack [jsonMaxDepth]byte // open containers: '{' or '['
	depth int
	mode  jsonMode
	key   bool   // the string being read is an object key
	lit   string // the rest of a literal (true, false, null) being read
	hex   int    // \u digits still to read
	done  bool   // the object is closed
}

type jsonMode uint8

const (
	jStart      jsonMode = iota // whitespace or '{'
	jValue                      // a value (after ':' or ',' in an array)
	jValueOrEnd                 // a value or ']' (after '[')
	jKeyOrEnd                   // a key or '}' (after '{')
	jKey                        // a key (after ',' in an object)
	jColon                      // ':'
	jAfterValue                 // ',' or the closing bracket
	jString                     // inside a string
	jEscape                     // after '\' in a string
	jHex                        // \u digits
	jLiteral                    // inside true, false or null
	jMinus                      // after '-': a digit
	jZero                       // after a leading 0: '.', 'e' or the end
	jInt                        // integer digits
	jDot                        // after '.': a digit
	jFrac                       // fraction digits
	jExp                        // after 'e': sign or digit
	jExpSign                    // after the exponent's sign: a digit
	jExpDigits                  // exponent digits
)

func isJSONSpace(b byte) bool { return b == ' ' || b == '\t' || b == '\n' || b == '\r' }
func isDigit(b byte) bool     { return b >= '0' && b <= '9' }

// feed advances the state by b and reports whether the bytes so far are
// still a prefix of a JSON object.
func (j *jsonObject) feed(b byte) bool {
	if j.done {
		return false
	}
	switch j.mode {
	case jStart:
		if isJSONSpace(b) {
			return true
		}
		return b == '{' && j.open(b, jKeyOrEnd)
	case jValue, jValueOrEnd:
		if isJSONSpace(b) {
			return true
		}
		if b == ']' && j.mode == jValueOrEnd {
			return j.close(b)
		}
		return j.value(b)
	case jKeyOrEnd, jKey:
		switch {
		case isJSONSpace(b):
			return true
		case b == '"':
			j.mode, j.key = jString, true
			return true
		case b == '}' && j.mode == jKeyOrEnd:
			return j.close(b)
		}
		return false
	case jColon:
		if isJSONSpace(b) {
			return true
		}
		if b == ':' {
			j.mode = jValue
			return true
		}
		return false
	case jAfterValue:
		switch {
		case isJSONSpace(b):
			return true
		case b == ',':
			if j.stack[j.depth-1] == '{' {
				j.mode = jKey
			} else {
				j.mode = jValue
			}
			return true
		case b == '}' || b == ']':
			return j.close(b)
		}
		return false
	case jString:
		switch {
		case b == '"':
			if j.key {
				j.mode = jColon
			} else {
				j.mode = jAfterValue
			}
			return true
		case b == '\\':
			j.mode = jEscape
			return true
		}
		return b >= 0x20 // control characters must be escaped
	case jEscape:
		switch b {
		case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			j.mode = jString
			return true
		case 'u':
			j.mode, j.hex = jHex, 4
			return true
		}
		return false
	case jHex:
		if !(isDigit(b) || b >= 'a' && b <= 'f' || b >= 'A' && b <= 'F') {
			return false
		}
		if j.hex--; j.hex == 0 {
			j.mode = jString
		}
		return true
	case jLiteral:
		if b != j.lit[0] {
			return false
		}
		if j.lit = j.lit[1:]; j.lit == "" {
			j.mode = jAfterValue
		}
		return true
	case jMinus:
		switch {
		case b == '0':
			j.mode = jZero
		case isDigit(b):
			j.mode = jInt
		default:
			return false
		}
		return true
	case jZero, jInt:
		switch {
		case isDigit(b) && j.mode == jInt:
			return true
		case b == '.':
			j.mode = jDot
			return true
		case b == 'e' || b == 'E':
			j.mode = jExp
			return true
		}
		return j.endNumber(b)
	case jDot:
		if isDigit(b) {
			j.mode = jFrac
			return true
		}
		return false
	case jFrac:
		switch {
		case isDigit(b):
			return true
		case b == 'e' || b == 'E':
			j.mode = jExp
			return true
		}
		return j.endNumber(b)
	case jExp:
		switch {
		case b == '+' || b == '-':
			j.mode = jExpSign
		case isDigit(b):
			j.mode = jExpDigits
		default:
			return false
		}
		return true
	case jExpSign:
		if isDigit(b) {
			j.mode = jExpDigits
			return true
		}
		return false
	case jExpDigits:
		if isDigit(b) {
			return true
		}
		return j.endNumber(b)
	}
	return false
}

// value starts a value with b.
func (j *jsonObject) value(b byte) bool {
	switch {
	case b == '{':
		return j.open(b, jKeyOrEnd)
	case b == '[':
		return j.open(b, jValueOrEnd)
	case b == '"':
		j.mode, j.key = jString, false
	case b == 't':
		j.mode, j.lit = jLiteral, "rue"
	case b == 'f':
		j.mode, j.lit = jLiteral, "alse"
	case b == 'n':
		j.mode, j.lit = jLiteral, "ull"
	case b == '-':
		j.mode = jMinus
	case b == '0':
		j.mode = jZero
	case isDigit(b):
		j.mode = jInt
	default:
		return false
	}
	return true
}

// endNumber ends a number at b, which must then follow a value.
func (j *jsonObject) endNumber(b byte) bool {
	j.mode = jAfterValue
	return j.feed(b)
}

func (j *jsonObject) open(b byte, next jsonMode) bool {
	if j.depth == jsonMaxDepth {
		return false
	}
	j.stack[j.depth] = b
	j.depth++
	j.mode = next
	return true
}

func (j *jsonObject) close(b byte) bool {
	want := byte('{')
	if b == ']' {
		want = '['
	}
	if j.depth == 0 || j.stack[j.depth-1] != want {
		return false
	}
	j.depth--
	j.mode = jAfterValue
	j.done = j.depth == 0
	return true
}

// accepts reports whether text may follow the state (on a copy: j is not
// changed).
func (j jsonObject) accepts(text []byte) bool {
	if len(text) == 0 {
		return false
	}
	for _, b := range text {
		if !j.feed(b) {
			return false
		}
	}
	return true
}
