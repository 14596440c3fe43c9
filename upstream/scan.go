package upstream

import (
	"encoding/json"
	"slices"
)

// keyScanner finds the top-level "id" and "method" members of a JSON object
// as its bytes go by, keeping only those members' short values: it tells
// what a message too large to buffer is (a request or notification, or the
// response to which request) without holding it. Keys match as the SDK's
// decoder matches them: exactly, after unescaping. Input that is not an
// object, or stops being well-formed, ends the scan with what was found so
// far.
type keyScanner struct {
	st     scanState
	depth  int // 0 before the object, 1 inside it, more inside a member's value
	inStr  bool
	esc    bool
	keep   bool   // the string or scalar being read is kept in buf
	buf    []byte // a key or an id value being read, raw
	long   bool   // buf overflowed maxScanToken
	member string // the key whose value is being read ("" when too long)

	sawMethod bool
	id        []byte // raw JSON of the last "id" member's value; nil if none or not a scalar
}

type scanState uint8

const (
	scanStart  scanState = iota // before the opening brace
	scanKey                     // expecting a key or '}'
	scanColon                   // after a key
	scanValue                   // expecting a member's value
	scanScalar                  // in a number, true, false or null at depth 1
	scanComma                   // after a value: ',' or '}'
	scanDone                    // the object ended, or the input is not an object
)

// maxScanToken bounds a key or id value the scanner keeps; ids and the keys
// it looks for are far shorter.
const maxScanToken = 256

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func (s *keyScanner) reset() { *s = keyScanner{buf: s.buf[:0]} }

func (s *keyScanner) add(c byte) {
	if !s.keep {
		return
	}
	if len(s.buf) >= maxScanToken {
		s.long = true
		return
	}
	s.buf = append(s.buf, c)
}

func (s *keyScanner) begin(keep bool) {
	s.keep, s.buf, s.long = keep, s.buf[:0], false
}

// feed scans the next bytes of the message.
func (s *keyScanner) feed(p []byte) {
	for _, c := range p {
		if s.st == scanDone {
			return
		}
		if s.inStr {
			s.add(c)
			switch {
			case s.esc:
				s.esc = false
			case c == '\\':
				s.esc = true
			case c == '"':
				s.inStr = false
				if s.depth == 1 {
					s.endString()
				}
			}
			continue
		}
		if s.depth > 1 {
			switch c {
			case '"':
				s.inStr, s.keep = true, false
			case '{', '[':
				s.depth++
			case '}', ']':
				if s.depth--; s.depth == 1 {
					s.st = scanComma
				}
			}
			continue
		}
		switch s.st {
		case scanStart:
			switch {
			case isSpace(c):
			case c == '{':
				s.depth, s.st = 1, scanKey
			default:
				s.st = scanDone
			}
		case scanKey:
			switch {
			case isSpace(c):
			case c == '"':
				s.begin(true)
				s.inStr = true
				s.add(c)
			default: // '}' or malformed
				s.st = scanDone
			}
		case scanColon:
			switch {
			case isSpace(c):
			case c == ':':
				s.st = scanValue
			default:
				s.st = scanDone
			}
		case scanValue:
			isID := s.member == "id"
			switch {
			case isSpace(c):
			case c == '"':
				s.begin(isID)
				s.inStr = true
				s.add(c)
			case c == '{' || c == '[':
				if isID {
					s.id = nil // not an id JSON-RPC allows
				}
				s.depth = 2
			default:
				s.begin(isID)
				s.add(c)
				s.st = scanScalar
			}
		case scanScalar:
			switch {
			case c == ',':
				s.endScalar()
				s.st = scanKey
			case c == '}':
				s.endScalar()
				s.st = scanDone
			case isSpace(c):
				s.endScalar()
				s.st = scanComma
			default:
				s.add(c)
			}
		case scanComma:
			switch {
			case isSpace(c):
			case c == ',':
				s.st = scanKey
			default: // '}' or malformed
				s.st = scanDone
			}
		}
	}
}

func (s *keyScanner) endString() {
	switch s.st {
	case scanKey:
		s.member = ""
		if !s.long {
			var k string
			if err := json.Unmarshal(s.buf, &k); err == nil {
				s.member = k
			}
		}
		if s.member == "method" {
			// The SDK's decoder takes any "method" member, whatever its
			// value, as making the message a request.
			s.sawMethod = true
		}
		s.st = scanColon
	case scanValue:
		s.setID()
		s.st = scanComma
	}
}

func (s *keyScanner) endScalar() { s.setID() }

func (s *keyScanner) setID() {
	if s.member != "id" {
		return
	}
	s.id = nil
	if !s.long {
		s.id = slices.Clone(s.buf)
	}
}
