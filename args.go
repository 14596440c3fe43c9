package toolgate

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// maxDepth bounds nesting of arrays and objects in arguments.
const maxDepth = 1000

// maxNumberLen bounds one number literal in arguments. No float64 needs
// more characters than this in its shortest form ("-2.2250738585072014e-308"
// has 24), so a longer literal cannot be one ParseArgs accepts.
const maxNumberLen = 40

// ErrInvalidArgs is wrapped by every error of ParseArgs.
var ErrInvalidArgs = errors.New("invalid arguments")

// ErrInvalidJSON is wrapped by every error of CanonicalJSON and CheckKeys:
// JSON that is not well formed, or that two parsers could read
// differently.
var ErrInvalidJSON = errors.New("invalid JSON")

// Args are a call's arguments, parsed once at the edge: every enforcement
// point (MCP, the JSON API, the CLI, the Go library) uses ParseArgs, so
// they cannot disagree on what a call's arguments are (docs/design.md,
// "Decide on exactly what runs"). What is decided (Value), what an approval
// binds (Digest) and what the tool receives (Canonical) are one parse.
type Args struct {
	// Canonical is the canonical JSON of the arguments (CanonicalJSON; {}
	// when there were none). It is what the digest is taken over and what
	// is forwarded to the tool: never the bytes as the client sent them.
	Canonical []byte
	// Digest is hex(sha256(Canonical)): 64 lower-case hex characters.
	Digest string
	// Value is the decoded object, as encoding/json decodes into
	// map[string]any (numbers are float64); never nil.
	Value map[string]any
}

// ParseArgs parses a call's arguments: a JSON object, or nothing (empty
// input, whitespace or null, which mean {}). On top of JSON's grammar it
// refuses, wrapping ErrInvalidArgs, every input that two parsers could read
// as two different calls, so that the decision and the tool can never see
// different arguments:
//
//   - invalid UTF-8, or a \u escape that is a lone surrogate;
//   - a duplicate key in any object, after resolving escapes (a parser that
//     keeps the first and one that keeps the last would differ);
//   - two keys of one object that differ only by case, under Unicode simple
//     case folding ("path" and "Path", or "k" and the Kelvin sign): Go's
//     encoding/json matches struct fields case-insensitively, so a tool
//     written in Go could read the one the decision did not look at;
//   - a number that float64 does not hold as written: one whose literal is
//     not, as a decimal, the shortest decimal of the float64 it parses to
//     (9007199254740993, 0.1000000000000000001, 1e400, 1e-400): a decimal
//     or integer parser would read another value than the decision's;
//   - nesting deeper than 1000, and anything but one JSON object.
func ParseArgs(raw []byte) (Args, error) {
	if len(bytes.TrimSpace(raw)) == 0 {
		return emptyArgs(), nil
	}
	v, err := parseJSON(raw, ErrInvalidArgs, true)
	if err != nil {
		return Args{}, err
	}
	switch v.kind {
	case kindNull:
		return emptyArgs(), nil
	case kindObject:
	default:
		return Args{}, fmt.Errorf("%w: the arguments must be a JSON object, not %s", ErrInvalidArgs, v.kind)
	}
	var buf bytes.Buffer
	buf.Grow(len(raw))
	v.write(&buf)
	a := Args{Canonical: buf.Bytes(), Value: v.object()}
	sum := sha256.Sum256(a.Canonical)
	a.Digest = hex.EncodeToString(sum[:])
	return a, nil
}

var emptyDigest = func() string { s := sha256.Sum256([]byte("{}")); return hex.EncodeToString(s[:]) }()

func emptyArgs() Args {
	return Args{Canonical: []byte("{}"), Digest: emptyDigest, Value: map[string]any{}}
}

// CanonicalJSON returns the canonical JSON of any JSON value, by the rules
// of ParseArgs: object keys sorted bytewise (by their UTF-8 encoding) at
// every depth, no insignificant whitespace, numbers kept exactly as
// written, strings with escapes resolved and re-encoded minimally (only
// `"`, `\` and control characters are escaped; \u escapes for them use
// lower-case hex). Empty input (nil, only whitespace) and `null` give `{}`.
//
// Two texts that differ only in key order, whitespace or string escaping
// give the same bytes; any other difference (a value, a key, 1 vs 1.0)
// gives different bytes. It refuses what ParseArgs refuses, except that the
// value need not be an object.
func CanonicalJSON(raw []byte) ([]byte, error) {
	if len(bytes.TrimSpace(raw)) == 0 {
		return []byte("{}"), nil
	}
	v, err := parseJSON(raw, ErrInvalidJSON, true)
	if err != nil {
		return nil, err
	}
	if v.kind == kindNull {
		return []byte("{}"), nil
	}
	var buf bytes.Buffer
	buf.Grow(len(raw))
	v.write(&buf)
	return buf.Bytes(), nil
}

type kind uint8

const (
	kindNull kind = iota
	kindBool
	kindNumber
	kindString
	kindArray
	kindObject
)

func (k kind) String() string {
	return [...]string{"null", "a boolean", "a number", "a string", "an array", "an object"}[k]
}

// value is a parsed JSON value. For numbers and booleans lit is the literal;
// for strings str is the decoded string.
type value struct {
	kind    kind
	lit     []byte
	str     string
	elems   []value
	members []member
}

type member struct {
	key string
	val value
}

// object returns an object value as encoding/json decodes it into
// map[string]any.
func (v *value) object() map[string]any {
	m := make(map[string]any, len(v.members))
	for i := range v.members {
		m[v.members[i].key] = v.members[i].val.any()
	}
	return m
}

func (v *value) any() any {
	switch v.kind {
	case kindBool:
		return v.lit[0] == 't'
	case kindNumber:
		f, _ := strconv.ParseFloat(string(v.lit), 64) // checked by exactNumber
		return f
	case kindString:
		return v.str
	case kindArray:
		a := make([]any, len(v.elems))
		for i := range v.elems {
			a[i] = v.elems[i].any()
		}
		return a
	case kindObject:
		return v.object()
	}
	return nil
}

func (v *value) write(buf *bytes.Buffer) {
	switch v.kind {
	case kindNull:
		buf.WriteString("null")
	case kindBool, kindNumber:
		buf.Write(v.lit)
	case kindString:
		writeString(buf, v.str)
	case kindArray:
		buf.WriteByte('[')
		for i := range v.elems {
			if i > 0 {
				buf.WriteByte(',')
			}
			v.elems[i].write(buf)
		}
		buf.WriteByte(']')
	case kindObject:
		buf.WriteByte('{')
		for i := range v.members {
			if i > 0 {
				buf.WriteByte(',')
			}
			writeString(buf, v.members[i].key)
			buf.WriteByte(':')
			v.members[i].val.write(buf)
		}
		buf.WriteByte('}')
	}
}

const hexDigits = "0123456789abcdef"

func writeString(buf *bytes.Buffer, s string) {
	buf.WriteByte('"')
	start := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		buf.WriteString(s[start:i])
		switch c {
		case '"':
			buf.WriteString(`\"`)
		case '\\':
			buf.WriteString(`\\`)
		case '\n':
			buf.WriteString(`\n`)
		case '\r':
			buf.WriteString(`\r`)
		case '\t':
			buf.WriteString(`\t`)
		case '\b':
			buf.WriteString(`\b`)
		case '\f':
			buf.WriteString(`\f`)
		default:
			buf.WriteString(`\u00`)
			buf.WriteByte(hexDigits[c>>4])
			buf.WriteByte(hexDigits[c&0xf])
		}
		start = i + 1
	}
	buf.WriteString(s[start:])
	buf.WriteByte('"')
}

// CheckKeys checks that raw is exactly one well-formed JSON value in which
// no object has two keys that are equal or differ only by case (at any
// depth), the readings two JSON parsers can disagree on for a value both
// accept; unlike CanonicalJSON it does not judge numbers (a result may
// carry any). The error wraps ErrInvalidJSON.
func CheckKeys(raw []byte) error {
	_, err := parseJSON(raw, ErrInvalidJSON, false)
	return err
}

type parser struct {
	// base is the error every error of this parse wraps; numbers says
	// whether numbers must be held exactly by a float64.
	base    error
	numbers bool
	in      []byte
	pos     int
}

func parseJSON(in []byte, base error, numbers bool) (value, error) {
	if !utf8.Valid(in) {
		return value{}, fmt.Errorf("%w: not valid UTF-8", base)
	}
	p := &parser{in: in, base: base, numbers: numbers}
	p.skipSpace()
	v, err := p.value(0)
	if err != nil {
		return value{}, err
	}
	p.skipSpace()
	if p.pos != len(p.in) {
		return value{}, p.errorf("unexpected data after the JSON value")
	}
	return v, nil
}

func (p *parser) errorf(format string, args ...any) error {
	return fmt.Errorf("%w: offset %d: %s", p.base, p.pos, fmt.Sprintf(format, args...))
}

func (p *parser) skipSpace() {
	for p.pos < len(p.in) {
		switch p.in[p.pos] {
		case ' ', '\t', '\n', '\r':
			p.pos++
		default:
			return
		}
	}
}

func (p *parser) value(depth int) (value, error) {
	if depth > maxDepth {
		return value{}, p.errorf("nested deeper than %d", maxDepth)
	}
	if p.pos >= len(p.in) {
		return value{}, p.errorf("unexpected end of input")
	}
	switch c := p.in[p.pos]; {
	case c == '{':
		return p.object(depth)
	case c == '[':
		return p.array(depth)
	case c == '"':
		s, err := p.string()
		if err != nil {
			return value{}, err
		}
		return value{kind: kindString, str: s}, nil
	case c == 't':
		return p.literal("true", kindBool)
	case c == 'f':
		return p.literal("false", kindBool)
	case c == 'n':
		return p.literal("null", kindNull)
	case c == '-' || (c >= '0' && c <= '9'):
		return p.number()
	default:
		return value{}, p.errorf("unexpected character %q", c)
	}
}

func (p *parser) literal(word string, k kind) (value, error) {
	if !bytes.HasPrefix(p.in[p.pos:], []byte(word)) {
		return value{}, p.errorf("invalid literal")
	}
	v := value{kind: k, lit: p.in[p.pos : p.pos+len(word)]}
	p.pos += len(word)
	return v, nil
}

// number accepts exactly the JSON number grammar.
func (p *parser) number() (value, error) {
	start := p.pos
	digits := func() int {
		n := 0
		for p.pos < len(p.in) && p.in[p.pos] >= '0' && p.in[p.pos] <= '9' {
			p.pos++
			n++
		}
		return n
	}
	if p.in[p.pos] == '-' {
		p.pos++
	}
	switch {
	case p.pos < len(p.in) && p.in[p.pos] == '0':
		p.pos++
	case digits() == 0:
		return value{}, p.errorf("invalid number")
	}
	if p.pos < len(p.in) && p.in[p.pos] == '.' {
		p.pos++
		if digits() == 0 {
			return value{}, p.errorf("invalid number: no digits after the decimal point")
		}
	}
	if p.pos < len(p.in) && (p.in[p.pos] == 'e' || p.in[p.pos] == 'E') {
		p.pos++
		if p.pos < len(p.in) && (p.in[p.pos] == '+' || p.in[p.pos] == '-') {
			p.pos++
		}
		if digits() == 0 {
			return value{}, p.errorf("invalid number: no digits in the exponent")
		}
	}
	lit := p.in[start:p.pos]
	if p.numbers && !exactNumber(lit) {
		p.pos = start
		return value{}, p.errorf("the number %.40s is not held exactly by a float64 (a decimal parser would read another value than the decision); send it as the shortest decimal of a float64, or as a string", lit)
	}
	return value{kind: kindNumber, lit: lit}, nil
}

// exactNumber reports whether a JSON number literal means, as a decimal,
// exactly the shortest decimal of the float64 it parses to: then a float64
// parser and an exact decimal parser read the same value.
func exactNumber(lit []byte) bool {
	if len(lit) > maxNumberLen {
		return false
	}
	f, err := strconv.ParseFloat(string(lit), 64)
	if err != nil {
		return false // out of range
	}
	var tmp [32]byte
	short := strconv.AppendFloat(tmp[:0], f, 'g', -1, 64)
	if bytes.Equal(short, lit) {
		return true
	}
	a, ok1 := decimalOf(lit)
	b, ok2 := decimalOf(short)
	return ok1 && ok2 && a == b
}

// decimal is a number as sign, significant digits (no leading or trailing
// zeros) and the exponent of its first digit; zero has no digits and no
// sign.
type decimal struct {
	neg    bool
	digits string
	exp    int
}

// decimalOf normalizes a JSON number literal; false for an exponent too
// large to matter (no float64 has one).
func decimalOf(lit []byte) (decimal, bool) {
	var d decimal
	s := string(lit)
	if strings.HasPrefix(s, "-") {
		d.neg, s = true, s[1:]
	}
	exp := 0
	if i := strings.IndexAny(s, "eE"); i >= 0 {
		e := strings.TrimLeft(strings.TrimLeft(s[i+1:], "+"), "-")
		neg := strings.HasPrefix(s[i+1:], "-")
		e = strings.TrimLeft(e, "0")
		if len(e) > 4 {
			return decimal{}, false
		}
		n, _ := strconv.Atoi("0" + e)
		if neg {
			n = -n
		}
		exp, s = n, s[:i]
	}
	intPart, frac, _ := strings.Cut(s, ".")
	all := intPart + frac
	exp += len(intPart)
	trimmed := strings.TrimLeft(all, "0")
	exp -= len(all) - len(trimmed)
	trimmed = strings.TrimRight(trimmed, "0")
	if trimmed == "" {
		return decimal{}, true // zero, whatever its sign
	}
	d.digits, d.exp = trimmed, exp
	return d, true
}

func (p *parser) string() (string, error) {
	p.pos++ // opening quote
	var sb strings.Builder
	start := p.pos
	for {
		if p.pos >= len(p.in) {
			return "", p.errorf("unterminated string")
		}
		c := p.in[p.pos]
		switch {
		case c == '"':
			sb.Write(p.in[start:p.pos])
			p.pos++
			return sb.String(), nil
		case c < 0x20:
			return "", p.errorf("control character %#02x in string", c)
		case c == '\\':
			sb.Write(p.in[start:p.pos])
			if err := p.escape(&sb); err != nil {
				return "", err
			}
			start = p.pos
		default:
			p.pos++
		}
	}
}

func (p *parser) escape(sb *strings.Builder) error {
	p.pos++ // backslash
	if p.pos >= len(p.in) {
		return p.errorf("unterminated escape")
	}
	c := p.in[p.pos]
	p.pos++
	switch c {
	case '"', '\\', '/':
		sb.WriteByte(c)
	case 'b':
		sb.WriteByte('\b')
	case 'f':
		sb.WriteByte('\f')
	case 'n':
		sb.WriteByte('\n')
	case 'r':
		sb.WriteByte('\r')
	case 't':
		sb.WriteByte('\t')
	case 'u':
		r1, err := p.hex4()
		if err != nil {
			return err
		}
		switch {
		case utf16.IsSurrogate(r1) && r1 < 0xdc00:
			// A high surrogate must be followed by an escaped low one.
			if p.pos+1 >= len(p.in) || p.in[p.pos] != '\\' || p.in[p.pos+1] != 'u' {
				return p.errorf("lone surrogate \\u%04x", r1)
			}
			p.pos += 2
			r2, err := p.hex4()
			if err != nil {
				return err
			}
			r := utf16.DecodeRune(r1, r2)
			if r == utf8.RuneError {
				return p.errorf("invalid surrogate pair \\u%04x\\u%04x", r1, r2)
			}
			sb.WriteRune(r)
		case utf16.IsSurrogate(r1):
			return p.errorf("lone surrogate \\u%04x", r1)
		default:
			sb.WriteRune(r1)
		}
	default:
		return p.errorf("invalid escape \\%c", c)
	}
	return nil
}

// caseCollision refuses two keys that differ only by case (Unicode simple
// folding: the closure strings.EqualFold and encoding/json's field
// matching both stay within).
func caseCollision(ms []member, base error) error {
	if len(ms) < 2 {
		return nil
	}
	seen := make(map[string]string, len(ms))
	for _, m := range ms {
		k := foldKey(m.key)
		if other, dup := seen[k]; dup {
			return fmt.Errorf("%w: the keys %q and %q differ only by case (a reader that matches keys case-insensitively could read the one that was not decided on); send one of them", base, other, m.key)
		}
		seen[k] = m.key
	}
	return nil
}

// foldKey maps every rune of s to the smallest rune of the simple case
// folding orbit of its encoding/json folding (upper of lower), so two
// strings equal under strings.EqualFold, or matched as one struct field by
// encoding/json, have one key.
func foldKey(s string) string {
	var b strings.Builder
	b.Grow(len(s))
	for _, r := range s {
		if r < utf8.RuneSelf {
			if 'a' <= r && r <= 'z' {
				r -= 'a' - 'A' // the smallest of {A, a} (and of {K, k, U+212A}, {S, s, U+017F})
			}
			b.WriteByte(byte(r))
			continue
		}
		r = unicode.ToUpper(unicode.ToLower(r)) // encoding/json's folding ("İ" is "i")
		min := r
		for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
			if f < min {
				min = f
			}
		}
		b.WriteRune(min)
	}
	return b.String()
}

func (p *parser) hex4() (rune, error) {
	if p.pos+4 > len(p.in) {
		return 0, p.errorf("short \\u escape")
	}
	var r rune
	for _, c := range p.in[p.pos : p.pos+4] {
		r <<= 4
		switch {
		case c >= '0' && c <= '9':
			r |= rune(c - '0')
		case c >= 'a' && c <= 'f':
			r |= rune(c - 'a' + 10)
		case c >= 'A' && c <= 'F':
			r |= rune(c - 'A' + 10)
		default:
			return 0, p.errorf("invalid \\u escape")
		}
	}
	p.pos += 4
	return r, nil
}

func (p *parser) array(depth int) (value, error) {
	p.pos++ // [
	v := value{kind: kindArray}
	p.skipSpace()
	if p.pos < len(p.in) && p.in[p.pos] == ']' {
		p.pos++
		return v, nil
	}
	for {
		p.skipSpace()
		e, err := p.value(depth + 1)
		if err != nil {
			return value{}, err
		}
		v.elems = append(v.elems, e)
		p.skipSpace()
		if p.pos >= len(p.in) {
			return value{}, p.errorf("unterminated array")
		}
		switch p.in[p.pos] {
		case ',':
			p.pos++
		case ']':
			p.pos++
			return v, nil
		default:
			return value{}, p.errorf("expected , or ] in array")
		}
	}
}

func (p *parser) object(depth int) (value, error) {
	p.pos++ // {
	v := value{kind: kindObject}
	p.skipSpace()
	if p.pos < len(p.in) && p.in[p.pos] == '}' {
		p.pos++
		return v, nil
	}
	for {
		p.skipSpace()
		if p.pos >= len(p.in) || p.in[p.pos] != '"' {
			return value{}, p.errorf("expected a string key in object")
		}
		k, err := p.string()
		if err != nil {
			return value{}, err
		}
		p.skipSpace()
		if p.pos >= len(p.in) || p.in[p.pos] != ':' {
			return value{}, p.errorf("expected : after object key")
		}
		p.pos++
		p.skipSpace()
		e, err := p.value(depth + 1)
		if err != nil {
			return value{}, err
		}
		v.members = append(v.members, member{key: k, val: e})
		p.skipSpace()
		if p.pos >= len(p.in) {
			return value{}, p.errorf("unterminated object")
		}
		switch p.in[p.pos] {
		case ',':
			p.pos++
		case '}':
			p.pos++
			slices.SortFunc(v.members, func(a, b member) int { return strings.Compare(a.key, b.key) })
			for i := 1; i < len(v.members); i++ {
				if v.members[i].key == v.members[i-1].key {
					return value{}, fmt.Errorf("%w: duplicate object key %q", p.base, v.members[i].key)
				}
			}
			if err := caseCollision(v.members, p.base); err != nil {
				return value{}, err
			}
			return v, nil
		default:
			return value{}, p.errorf("expected , or } in object")
		}
	}
}
