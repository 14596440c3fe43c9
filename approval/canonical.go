package approval

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// maxDepth bounds nesting of arrays and objects in arguments.
const maxDepth = 1000

// ErrInvalidArgs is wrapped by every error of CanonicalArgs and ArgsDigest.
var ErrInvalidArgs = errors.New("approval: invalid arguments")

// CanonicalArgs returns the canonical JSON of a call's arguments: object
// keys sorted bytewise (by their UTF-8 encoding) at every depth, no
// insignificant whitespace, numbers kept exactly as written, strings with
// escapes resolved and re-encoded minimally (only `"`, `\` and control
// characters are escaped; \u escapes for them use lower-case hex). Empty
// input (nil, only whitespace) and `null` canonicalize to `{}`.
//
// Two argument texts that differ only in key order, whitespace or string
// escaping give the same bytes; any other difference (a value, a key, 1 vs
// 1.0) gives different bytes. It refuses, wrapping ErrInvalidArgs, anything
// that is not exactly one JSON value, invalid UTF-8, a \u escape that is a
// lone surrogate, a duplicate key in any object (after resolving escapes:
// a parser that keeps the first and one that keeps the last would see
// different calls), and nesting deeper than 1000.
func CanonicalArgs(raw json.RawMessage) ([]byte, error) {
	if len(bytes.TrimSpace(raw)) == 0 {
		return []byte("{}"), nil
	}
	v, err := parseJSON(raw)
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

// ArgsDigest returns hex(sha256(CanonicalArgs(raw))): 64 lower-case hex
// characters. Errors are those of CanonicalArgs.
func ArgsDigest(raw json.RawMessage) (string, error) {
	c, err := CanonicalArgs(raw)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(c)
	return hex.EncodeToString(sum[:]), nil
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

type parser struct {
	in  []byte
	pos int
}

func parseJSON(in []byte) (value, error) {
	if !utf8.Valid(in) {
		return value{}, fmt.Errorf("%w: not valid UTF-8", ErrInvalidArgs)
	}
	p := &parser{in: in}
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
	return fmt.Errorf("%w: offset %d: %s", ErrInvalidArgs, p.pos, fmt.Sprintf(format, args...))
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
	return value{kind: kindNumber, lit: p.in[start:p.pos]}, nil
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
					return value{}, fmt.Errorf("%w: duplicate object key %q", ErrInvalidArgs, v.members[i].key)
				}
			}
			return v, nil
		default:
			return value{}, p.errorf("expected , or } in object")
		}
	}
}
