// Package toolid holds the canonical tool id syntax and the mapping from a
// called function name to its id (Synedrix "Tool ID convention", docs/design.md, "Vocabulary").
//
// A canonical id is "tool:" followed by parts of [a-z0-9], joined by "-":
// "tool:supabase-write". A function name maps to its id by replacing "_" and
// "." with "-" and prefixing "tool:" ("bifrost.describe_table" becomes
// "tool:bifrost-describe-table"). Anything else (upper case, non-ASCII,
// spaces, empty parts, other characters) does not map: a malformed name is
// refused, never normalized into a real tool.
package toolid

import (
	"errors"
	"fmt"
)

// Prefix starts every canonical id.
const Prefix = "tool:"

// MaxLen is the longest name or id accepted, in bytes (MCP's SEP-986 limit).
const MaxLen = 128

// ErrMalformed is wrapped by every error for a name that does not map.
var ErrMalformed = errors.New("malformed tool name")

// Valid reports whether id is a canonical tool id.
func Valid(id string) bool {
	if len(id) > MaxLen || len(id) <= len(Prefix) || id[:len(Prefix)] != Prefix {
		return false
	}
	return validParts(id[len(Prefix):], false)
}

// validParts reports whether s is parts of [a-z0-9]+ joined by separators:
// "-" only, or also "_" and "." when function is true.
func validParts(s string, function bool) bool {
	if s == "" {
		return false
	}
	prevSep := true // no leading separator
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9':
			prevSep = false
		case c == '-' || (function && (c == '_' || c == '.')):
			if prevSep {
				return false
			}
			prevSep = true
		default:
			return false
		}
	}
	return !prevSep
}

// Map returns the canonical id for a called name: the id itself when name is
// already canonical, or the mapped function name. The error wraps
// ErrMalformed and says what is wrong.
func Map(name string) (string, error) {
	var buf [MaxLen]byte
	n, err := mapInto(&buf, name)
	if err != nil {
		return "", err
	}
	return string(buf[:n]), nil
}

// MapBytes writes the canonical id for name into buf and returns its length,
// so a hot path can look it up with m[string(buf[:n])] without allocating.
func MapBytes(buf *[MaxLen]byte, name string) (int, error) { return mapInto(buf, name) }

func mapInto(buf *[MaxLen]byte, name string) (int, error) {
	if name == "" {
		return 0, fmt.Errorf("%w: empty name", ErrMalformed)
	}
	if len(name) > MaxLen {
		return 0, fmt.Errorf("%w: %d bytes, longer than %d", ErrMalformed, len(name), MaxLen)
	}
	if len(name) > len(Prefix) && name[:len(Prefix)] == Prefix {
		if !validParts(name[len(Prefix):], false) {
			return 0, fmt.Errorf("%w: %q is not tool:<parts of a-z0-9 joined by ->", ErrMalformed, name)
		}
		return copy(buf[:], name), nil
	}
	if !validParts(name, true) {
		return 0, fmt.Errorf("%w: %q must be lowercase a-z0-9 parts joined by _ . or - (no empty parts)", ErrMalformed, name)
	}
	if len(Prefix)+len(name) > MaxLen {
		return 0, fmt.Errorf("%w: %q maps to an id longer than %d bytes", ErrMalformed, name, MaxLen)
	}
	n := copy(buf[:], Prefix)
	for i := 0; i < len(name); i++ {
		c := name[i]
		if c == '_' || c == '.' {
			c = '-'
		}
		buf[n] = c
		n++
	}
	return n, nil
}

// FunctionName returns the underscore spelling of an id ("tool:supabase-write"
// becomes "supabase_write"), the form LangGraph and n8n nodes use. It returns
// "" for an id that is not canonical.
func FunctionName(id string) string {
	if !Valid(id) {
		return ""
	}
	b := []byte(id[len(Prefix):])
	for i, c := range b {
		if c == '-' {
			b[i] = '_'
		}
	}
	return string(b)
}
