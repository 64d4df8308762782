package rl

import (
	"fmt"
	"math"
	"math/big"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// Countdown is one task of Megatron's countdown environment
// (examples/rl/environments/countdown, from TinyZero): reach Target with
// each of Nums once and + − × ÷.
type Countdown struct {
	Target int64   `json:"target"`
	Nums   []int64 `json:"nums"`
}

// Prompt is CountdownAgent.make_prefix: the task's text as Megatron words it
// (the numbers as a Python list, and the source's line break and
// indentation before "Return").
func (c Countdown) Prompt() string {
	nums := make([]string, len(c.Nums))
	for i, n := range c.Nums {
		nums[i] = strconv.FormatInt(n, 10)
	}
	return fmt.Sprintf("Using the numbers [%s], create an equation that equals %d. You can use basic arithmetic operations (+, -, *, /) and each number can only be used once. \n"+
		"        Return the final answer in <answer> </answer> tags, for example <answer> (1 + 2) / 3 </answer>. Do not include an = sign.",
		strings.Join(nums, ", "), c.Target)
}

// The countdown rewards (compute_score's defaults).
const (
	countdownFormatScore = 0.1
	countdownScore       = 1.0
)

var (
	answerPattern  = regexp.MustCompile(`<answer>(.*?)</answer>`)
	numberPattern  = regexp.MustCompile(`\d+`)
	allowedPattern = regexp.MustCompile(`^[\d+\-*/().\s]+$`)
)

// Score is countdown.compute_score(response, task): 0 without an
// <answer>…</answer> on the response's last line, 1 when the last such
// answer uses exactly the task's numbers and evaluates (as Python would)
// to within 1e-5 of the target, else 0.1.
func (c Countdown) Score(response string) float64 {
	lines := strings.Split(response, "\n")
	m := answerPattern.FindAllStringSubmatch(lines[len(lines)-1], -1)
	if len(m) == 0 {
		return 0
	}
	eq := pyStrip(m[len(m)-1][1])
	var used []int64
	for _, s := range numberPattern.FindAllString(eq, -1) {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return countdownFormatScore // a number no task has: not the task's numbers
		}
		used = append(used, n)
	}
	want := slices.Clone(c.Nums)
	slices.Sort(used)
	slices.Sort(want)
	if !slices.Equal(used, want) {
		return countdownFormatScore
	}
	if !allowedPattern.MatchString(eq) {
		return countdownFormatScore
	}
	v, ok := evalPython(eq)
	if !ok {
		return countdownFormatScore
	}
	if v.diffBelow(c.Target, 1e-5) {
		return countdownScore
	}
	return countdownFormatScore
}

// pyStrip is Python's str.strip(): its whitespace includes the ASCII
// separators \x1c–\x1f that Go's unicode.IsSpace does not.
func pyStrip(s string) string {
	return strings.TrimFunc(s, func(r rune) bool {
		switch r {
		case ' ', '\t', '\n', '\v', '\f', '\r', 0x1c, 0x1d, 0x1e, 0x1f, 0x85, 0xa0, 0x1680, 0x2028, 0x2029, 0x202f, 0x205f, 0x3000:
			return true
		}
		return r >= 0x2000 && r <= 0x200a
	})
}

// pyValue is a Python number from the countdown alphabet: an int (exact,
// as Python's) or a float.
type pyValue struct {
	isInt bool
	i     *big.Int
	f     float64
}

func (v pyValue) float() float64 {
	if v.isInt {
		f, _ := new(big.Float).SetInt(v.i).Float64()
		return f
	}
	return v.f
}

// diffBelow is abs(v − target) < eps as Python computes it.
func (v pyValue) diffBelow(target int64, eps float64) bool {
	if v.isInt {
		d := new(big.Int).Sub(v.i, big.NewInt(target))
		return d.Sign() == 0 // |int| < 1e-5 only for 0
	}
	return math.Abs(v.f-float64(target)) < eps
}

// maxIntBits bounds the ints a power may build: Python would compute any,
// but one this large is never within 1e-5 of a task's target (and a
// response like 9**9**9 must not stall the run).
const maxIntBits = 1 << 16

// evalPython evaluates eq, made of digits, + - * / ( ) . and whitespace, as
// Python's eval does (int literals exact, / true division, // floor
// division, ** power, unary + and -); ok is false where Python raises
// (a syntax error, a division by zero, calling an int as in "(2)(3)").
func evalPython(eq string) (pyValue, bool) {
	p := &pyParser{src: eq}
	v, ok := p.expr()
	if !ok {
		return pyValue{}, false
	}
	p.space()
	return v, ok && p.pos == len(p.src)
}

type pyParser struct {
	src   string
	pos   int
	depth int // open parentheses: Python's tokenizer joins lines inside them
}

// space skips what Python's tokenizer skips: spaces, tabs and form feeds,
// and line breaks inside parentheses (outside they end the statement: a
// syntax error, as a vertical tab always is; the parse then stops there).
func (p *pyParser) space() {
	for p.pos < len(p.src) {
		switch c := p.src[p.pos]; {
		case c == ' ' || c == '\t' || c == '\f':
		case (c == '\n' || c == '\r') && p.depth > 0:
		default:
			return
		}
		p.pos++
	}
}

func (p *pyParser) peek(op string) bool {
	p.space()
	return strings.HasPrefix(p.src[p.pos:], op)
}

// expr: term (('+'|'-') term)*
func (p *pyParser) expr() (pyValue, bool) {
	v, ok := p.term()
	for ok {
		switch {
		case p.peek("+"):
			p.pos++
			var w pyValue
			if w, ok = p.term(); ok {
				v, ok = arith('+', v, w)
			}
		case p.peek("-"):
			p.pos++
			var w pyValue
			if w, ok = p.term(); ok {
				v, ok = arith('-', v, w)
			}
		default:
			return v, true
		}
	}
	return v, false
}

// term: factor (('*'|'/'|'//') factor)*  ('**' binds tighter: in power)
func (p *pyParser) term() (pyValue, bool) {
	v, ok := p.factor()
	for ok {
		var op byte
		switch {
		case p.peek("**"):
			return v, true // power's, never here after a factor
		case p.peek("//"):
			op, p.pos = 'f', p.pos+2
		case p.peek("*"):
			op, p.pos = '*', p.pos+1
		case p.peek("/"):
			op, p.pos = '/', p.pos+1
		default:
			return v, true
		}
		var w pyValue
		if w, ok = p.factor(); ok {
			v, ok = arith(op, v, w)
		}
	}
	return v, false
}

// factor: ('+'|'-') factor | power
func (p *pyParser) factor() (pyValue, bool) {
	switch {
	case p.peek("+"):
		p.pos++
		return p.factor()
	case p.peek("-"):
		p.pos++
		v, ok := p.factor()
		if !ok {
			return v, false
		}
		return arith('-', pyValue{isInt: true, i: big.NewInt(0)}, v)
	}
	return p.power()
}

// power: atom ['**' factor]  (right-associative; binds tighter than a
// unary minus on its left, looser on its right)
func (p *pyParser) power() (pyValue, bool) {
	v, ok := p.atom()
	if !ok {
		return v, false
	}
	if p.peek("**") {
		p.pos += 2
		w, ok := p.factor()
		if !ok {
			return v, false
		}
		return pow(v, w)
	}
	return v, true
}

// atom: number | '(' expr ')'; an atom followed by '(' is a call (Python
// raises TypeError: 'int' object is not callable).
func (p *pyParser) atom() (pyValue, bool) {
	p.space()
	if p.pos >= len(p.src) {
		return pyValue{}, false
	}
	var v pyValue
	if p.src[p.pos] == '(' {
		p.pos++
		p.depth++
		var ok bool
		if v, ok = p.expr(); !ok || !p.peek(")") {
			return v, false
		}
		p.pos++
		p.depth--
	} else {
		var ok bool
		if v, ok = p.number(); !ok {
			return v, false
		}
	}
	if p.peek("(") || p.peekDigitOrDot() {
		return v, false // a call, or two literals in a row: Python raises
	}
	return v, true
}

func (p *pyParser) peekDigitOrDot() bool {
	p.space()
	return p.pos < len(p.src) && (p.src[p.pos] == '.' || p.src[p.pos] >= '0' && p.src[p.pos] <= '9')
}

// number is a Python int or float literal of digits and '.': "12", "1.5",
// "1.", ".5"; "012" is a syntax error (leading zeros), "00" is 0.
func (p *pyParser) number() (pyValue, bool) {
	start := p.pos
	for p.pos < len(p.src) && p.src[p.pos] >= '0' && p.src[p.pos] <= '9' {
		p.pos++
	}
	intPart := p.src[start:p.pos]
	if p.pos < len(p.src) && p.src[p.pos] == '.' {
		p.pos++
		for p.pos < len(p.src) && p.src[p.pos] >= '0' && p.src[p.pos] <= '9' {
			p.pos++
		}
		lit := p.src[start:p.pos]
		if lit == "." {
			return pyValue{}, false
		}
		if p.pos < len(p.src) && p.src[p.pos] == '.' {
			return pyValue{}, false // "1.2.3"
		}
		f, err := strconv.ParseFloat(lit, 64)
		if err != nil {
			return pyValue{}, false
		}
		return pyValue{f: f}, true
	}
	if intPart == "" {
		return pyValue{}, false
	}
	if len(intPart) > 1 && intPart[0] == '0' && strings.Trim(intPart, "0") != "" {
		return pyValue{}, false // "leading zeros in decimal integer literals are not permitted"
	}
	i, _ := new(big.Int).SetString(intPart, 10)
	return pyValue{isInt: true, i: i}, true
}

// arith applies op ('+', '-', '*', '/', 'f' for //) with Python's rules:
// int op int stays an int except true division; a float operand makes a
// float; division by zero raises.
func arith(op byte, a, b pyValue) (pyValue, bool) {
	if a.isInt && b.isInt && op != '/' {
		r := new(big.Int)
		switch op {
		case '+':
			r.Add(a.i, b.i)
		case '-':
			r.Sub(a.i, b.i)
		case '*':
			if a.i.BitLen()+b.i.BitLen() > maxIntBits {
				return pyValue{}, false
			}
			r.Mul(a.i, b.i)
		case 'f':
			if b.i.Sign() == 0 {
				return pyValue{}, false
			}
			m := new(big.Int)
			r.DivMod(a.i, b.i, m) // Euclidean (m >= 0); Python floors
			if m.Sign() != 0 && b.i.Sign() < 0 {
				r.Sub(r, big.NewInt(1))
			}
		}
		return pyValue{isInt: true, i: r}, true
	}
	if a.isInt && b.isInt { // int / int: Python's correctly rounded true division
		if b.i.Sign() == 0 {
			return pyValue{}, false
		}
		f, _ := new(big.Rat).SetFrac(a.i, b.i).Float64()
		return pyValue{f: f}, !math.IsInf(f, 0)
	}
	x, y := a.float(), b.float()
	if math.IsInf(x, 0) || math.IsInf(y, 0) {
		return pyValue{}, false // OverflowError converting a huge int
	}
	var r float64
	switch op {
	case '+':
		r = x + y
	case '-':
		r = x - y
	case '*':
		r = x * y
	case '/':
		if y == 0 {
			return pyValue{}, false
		}
		r = x / y
	case 'f':
		if y == 0 {
			return pyValue{}, false
		}
		r = pyFloorDiv(x, y)
	}
	return pyValue{f: r}, true
}

// pow is Python's **: an int to a non-negative int is an exact int, to a
// negative int a float; a negative float to a fractional power is a
// complex number, never within 1e-5 of a target here (its imaginary part is
// not small for the exponents such an answer can write), so false.
func pow(a, b pyValue) (pyValue, bool) {
	if a.isInt && b.isInt && b.i.Sign() >= 0 {
		if a.i.CmpAbs(big.NewInt(1)) > 0 && (!b.i.IsInt64() || int64(a.i.BitLen())*b.i.Int64() > maxIntBits) {
			return pyValue{}, false
		}
		// 0, 1 and -1 to any power stay small: reduce the exponent to its parity.
		e := b.i
		if a.i.CmpAbs(big.NewInt(1)) <= 0 && e.Sign() > 0 {
			e = big.NewInt(2 - int64(b.i.Bit(0))) // 1 when odd, 2 when even
		}
		return pyValue{isInt: true, i: new(big.Int).Exp(a.i, e, nil)}, true
	}
	x, y := a.float(), b.float()
	if x == 0 && y < 0 {
		return pyValue{}, false // ZeroDivisionError
	}
	if x < 0 && y != math.Trunc(y) {
		return pyValue{}, false // complex
	}
	r := math.Pow(x, y)
	if math.IsInf(r, 0) {
		return pyValue{}, false // OverflowError
	}
	return pyValue{f: r}, true
}

// pyFloorDiv is Python's float // (float_floor_div: from fmod, so that
// x == (x//y)*y + x%y as nearly as float allows).
func pyFloorDiv(x, y float64) float64 {
	mod := math.Mod(x, y)
	div := (x - mod) / y
	if mod != 0 && (y < 0) != (mod < 0) {
		div--
	}
	if div == 0 {
		return math.Copysign(0, x/y)
	}
	f := math.Floor(div)
	if div-f > 0.5 {
		f++
	}
	return f
}
