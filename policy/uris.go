package policy

// Resource URIs and prompt names as the bundle names them (docs/design.md,
// "Resources and prompts"). A ceiling entry, grant scope or rule selector
// names an upstream's resources by uri, which is either an exact URI or an
// RFC 6570 URI template as the upstream lists it (it holds a '{'), and an
// upstream's prompts by the upstream's own prompt name.
//
// A URI is judged in exactly the form the upstream will resolve it. One
// whose percent-decoding or path resolution could make it another path
// than the one matched (CheckResourceURI) is refused before any pattern
// is matched, so a template such as file:///docs/{+path} never admits
// file:///docs/..%2Fsecrets or file:///docs/../secrets.
//
// Matching is injective in both directions. An exact entry covers only
// that URI, never a template; a template entry covers the URIs its
// regular expression matches (yosida95/uritemplate) and, as a template
// (a template listing or the completion of one of its arguments), only
// the template of exactly its own text, never a narrower or wider one.
// Every pattern belongs to one upstream, so it never covers another
// upstream's URI, whatever the URI.

import (
	"fmt"
	"regexp"
	"strings"
	"unicode/utf8"

	"github.com/yosida95/uritemplate/v3"
)

// MaxURILen bounds a resource URI or template the decision looks at, in
// bytes; a longer one is refused.
const MaxURILen = 8 << 10

// CheckResourceURI reports why a resource URI is refused before it is
// matched or routed, or nil: it is empty, longer than MaxURILen, not valid
// UTF-8, or holds something percent-decoding or path resolution could turn
// into another path: a control character, a '\', a '{' or '}' (a template,
// not a URI), a malformed percent escape, an escape that decodes to '/',
// '\', '.', '%' or a control character, or a "." or ".." path segment; or
// that has a second spelling RFC 3986 normalization makes equal to it (an
// escaped unreserved character, lowercase hex in an escape, an uppercase
// letter in the scheme or host), so that an exact entry, a selector or a
// suspension sees every URI in its one spelling.
func CheckResourceURI(uri string) error {
	if err := checkURIText(uri, false); err != nil {
		return fmt.Errorf("resource URI %.200q is refused: %w", uri, err)
	}
	return nil
}

// CheckURITemplate reports why a resource template is refused, or nil: it
// must parse as an RFC 6570 template, and its literal text obeys
// CheckResourceURI's rule ('{' and '}' aside, which delimit expressions).
func CheckURITemplate(tmpl string) error {
	if err := checkURIText(tmpl, true); err != nil {
		return fmt.Errorf("resource template %.200q is refused: %w", tmpl, err)
	}
	if _, err := uritemplate.New(tmpl); err != nil {
		return fmt.Errorf("resource template %.200q does not parse as an RFC 6570 template: %w", tmpl, err)
	}
	return nil
}

func checkURIText(uri string, template bool) error {
	switch {
	case uri == "":
		return fmt.Errorf("it is empty")
	case len(uri) > MaxURILen:
		return fmt.Errorf("it is %d bytes, longer than %d", len(uri), MaxURILen)
	case !utf8.ValidString(uri):
		return fmt.Errorf("it is not valid UTF-8")
	}
	for i := 0; i < len(uri); i++ {
		switch c := uri[i]; {
		case c < 0x20 || c == 0x7f:
			return fmt.Errorf("it holds a control character")
		case c == '\\':
			return fmt.Errorf(`it holds a "\"`)
		case (c == '{' || c == '}') && !template:
			return fmt.Errorf("it holds %q: a URI template is not a resource URI", c)
		case c == '%':
			if i+2 >= len(uri) || !isHex(uri[i+1]) || !isHex(uri[i+2]) {
				return fmt.Errorf("it holds a malformed percent escape")
			}
			switch b := unhex(uri[i+1])<<4 | unhex(uri[i+2]); {
			case b == '/' || b == '\\' || b == '.' || b == '%' || b < 0x20 || b == 0x7f:
				return fmt.Errorf("it holds %q, an escape that decodes to a character that changes the path (%q)", uri[i:i+3], rune(b))
			case unreserved(b):
				// RFC 3986 6.2.2.2: an escaped unreserved character is the
				// character itself, so the URI has a second spelling that
				// an exact entry, a selector or a suspension would not see.
				return fmt.Errorf("it holds %q, an escape of the unreserved character %q (write %q: a URI has one spelling here)", uri[i:i+3], rune(b), rune(b))
			case isLowerHex(uri[i+1]) || isLowerHex(uri[i+2]):
				// RFC 3986 6.2.2.1: %3a and %3A are the same octet.
				return fmt.Errorf("it holds %q, a percent escape with lowercase hex digits (write %q: a URI has one spelling here)", uri[i:i+3], strings.ToUpper(uri[i:i+3]))
			}
		}
	}
	if err := checkSchemeAndHost(uri); err != nil {
		return err
	}
	rest := uri
	if i := strings.IndexAny(rest, "?#"); i >= 0 {
		rest = rest[:i]
	}
	for len(rest) > 0 {
		seg := rest
		if i := strings.IndexByte(rest, '/'); i >= 0 {
			seg, rest = rest[:i], rest[i+1:]
		} else {
			rest = ""
		}
		if seg == "." || seg == ".." {
			return fmt.Errorf("it holds a %q path segment", seg)
		}
	}
	return nil
}

// unreserved reports whether b is an RFC 3986 unreserved character
// (ALPHA / DIGIT / "-" / "." / "_" / "~").
func unreserved(b byte) bool {
	return ('a' <= b && b <= 'z') || ('A' <= b && b <= 'Z') || ('0' <= b && b <= '9') || b == '-' || b == '.' || b == '_' || b == '~'
}

func isLowerHex(c byte) bool { return 'a' <= c && c <= 'f' }

// checkSchemeAndHost refuses the spellings RFC 3986 6.2.2.1 makes equal to
// another: a scheme or a host with an uppercase letter (FILE:///x is
// file:///x). The scheme is the text before the first ':' when it is one
// (ALPHA *( ALPHA / DIGIT / "+" / "-" / "." )); the host is what follows
// "//" up to the next '/', '?' or '#' (userinfo and port included).
func checkSchemeAndHost(uri string) error {
	colon := strings.IndexByte(uri, ':')
	if colon <= 0 {
		return nil
	}
	scheme := uri[:colon]
	for i := 0; i < len(scheme); i++ {
		c := scheme[i]
		if !(('a' <= c && c <= 'z') || ('A' <= c && c <= 'Z') || (i > 0 && (('0' <= c && c <= '9') || c == '+' || c == '-' || c == '.'))) {
			return nil // not a scheme: the ':' is part of a path
		}
	}
	if strings.ToLower(scheme) != scheme {
		return fmt.Errorf("its scheme %q has an uppercase letter (write %q: a URI has one spelling here)", scheme, strings.ToLower(scheme))
	}
	rest := uri[colon+1:]
	if !strings.HasPrefix(rest, "//") {
		return nil
	}
	host := rest[2:]
	if i := strings.IndexAny(host, "/?#"); i >= 0 {
		host = host[:i]
	}
	if strings.ToLower(host) != host {
		return fmt.Errorf("its authority %q has an uppercase letter (write %q: a URI has one spelling here)", host, strings.ToLower(host))
	}
	return nil
}

func isHex(c byte) bool {
	return ('0' <= c && c <= '9') || ('a' <= c && c <= 'f') || ('A' <= c && c <= 'F')
}

func unhex(c byte) byte {
	switch {
	case '0' <= c && c <= '9':
		return c - '0'
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10
	}
	return c - 'A' + 10
}

// IsURITemplate reports whether a bundle uri is a template (it holds a
// '{') rather than an exact URI.
func IsURITemplate(uri string) bool { return strings.ContainsRune(uri, '{') }

// URIPattern is a compiled bundle uri: an exact URI or a URI template. The
// zero value matches nothing. It is immutable and safe for concurrent use.
type URIPattern struct {
	raw string
	re  *regexp.Regexp // nil for an exact URI
	// prefix is a template's literal text before its first expression:
	// every URI it matches starts with it. tail, when set, says the
	// template is prefix and one expression, {+name} (tailReserved) or
	// {name} (tailSimple), matched by a scan instead of the regexp, with
	// the same result (TestURIPatternFastPath).
	prefix string
	tail   uint8
}

const (
	tailNone uint8 = iota
	tailReserved
	tailSimple
)

// CompileURIPattern compiles a bundle uri. The error says why it is
// refused (CheckResourceURI, CheckURITemplate); such a uri can never match.
func CompileURIPattern(uri string) (URIPattern, error) {
	if !IsURITemplate(uri) {
		if err := CheckResourceURI(uri); err != nil {
			return URIPattern{}, err
		}
		return URIPattern{raw: uri}, nil
	}
	if err := CheckURITemplate(uri); err != nil {
		return URIPattern{}, err
	}
	t, err := uritemplate.New(uri)
	if err != nil {
		return URIPattern{}, err
	}
	p := URIPattern{raw: uri, re: t.Regexp()}
	i := strings.IndexByte(uri, '{')
	p.prefix = uri[:i]
	if expr := uri[i:]; strings.HasSuffix(expr, "}") && strings.Count(expr, "{") == 1 {
		name := expr[1 : len(expr)-1]
		tail := tailSimple
		if strings.HasPrefix(name, "+") {
			name, tail = name[1:], tailReserved
		}
		if name != "" && strings.Trim(name, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_") == "" {
			p.tail = tail
		}
	}
	return p, nil
}

// uriChars are the characters an expression's value may hold as it stands
// in a URI (RFC 6570 §1.5, as yosida95/uritemplate's regexp admits them):
// unreserved, and for reserved expansion ({+x}) the reserved characters
// too; simple expansion ({x}) admits the ',' that joins list values.
var uriChars = func() (t [2][256]bool) {
	for c := range 256 {
		b := byte(c)
		unreserved := 'a' <= b && b <= 'z' || 'A' <= b && b <= 'Z' || '0' <= b && b <= '9' || strings.IndexByte("-._~", b) >= 0
		t[0][c] = unreserved || strings.IndexByte("!#$&'()*+,/:;=?@[]", b) >= 0
		t[1][c] = unreserved || b == ','
	}
	return t
}()

// scanTail reports whether s is a value of the tail expression: allowed
// characters and %XX escapes only.
func (p URIPattern) scanTail(s string) bool {
	class := &uriChars[0]
	if p.tail == tailSimple {
		class = &uriChars[1]
	}
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == '%':
			if i+2 >= len(s) || !isHex(s[i+1]) || !isHex(s[i+2]) {
				return false
			}
			i += 3
		case class[c]:
			i++
		default:
			return false
		}
	}
	return true
}

// String returns the uri as written.
func (p URIPattern) String() string { return p.raw }

// IsTemplate reports whether the pattern is a URI template.
func (p URIPattern) IsTemplate() bool { return p.re != nil }

// Matches reports whether the pattern covers uri (template false: a URI as
// it will be sent upstream) or the template uri (template true): an exact
// pattern covers only the same URI; a template pattern covers the URIs its
// expansion can produce, and of templates only its own text.
func (p URIPattern) Matches(uri string, template bool) bool {
	switch {
	case p.raw == "" || uri == "":
		return false
	case p.re == nil:
		return !template && p.raw == uri
	case template:
		return p.raw == uri
	case !strings.HasPrefix(uri, p.prefix):
		return false
	case p.tail != tailNone:
		return p.scanTail(uri[len(p.prefix):])
	}
	return p.re.MatchString(uri)
}

// matchesRegexp is Matches without the fast path (for its test).
func (p URIPattern) matchesRegexp(uri string) bool { return p.re != nil && p.re.MatchString(uri) }

// Covers reports whether the pattern covers everything other covers
// (for narrowing a delegation's scopes): the same text, or an exact URI
// this template matches. Two different templates never cover each other.
func (p URIPattern) Covers(other URIPattern) bool {
	if p.raw == "" || other.raw == "" {
		return false
	}
	if p.raw == other.raw {
		return true
	}
	return other.re == nil && p.Matches(other.raw, false)
}

// Canonical ids of what an access decision names (toolgate.Decision's
// Target): the kind, then the upstream and the uri or prompt name joined
// as a resource name (JoinName), so the id of one upstream's resource
// never equals another's and a uri or prompt name holding '.' or '"' is
// quoted, never split. A template and an exact URI are different kinds.
const (
	ResourceTargetPrefix = "mcp_resource:"
	TemplateTargetPrefix = "mcp_resource_template:"
	PromptTargetPrefix   = "prompt:"
)

// ResourceTarget is the id of an upstream's resource uri (an exact URI or,
// for a template, TemplateTarget's), or of all its resources when uri is
// empty: "mcp_resource:docs", `mcp_resource:docs."file:///a.md"`.
func ResourceTarget(upstream, uri string) string {
	if uri == "" {
		return ResourceTargetPrefix + JoinName(upstream)
	}
	if IsURITemplate(uri) {
		return TemplateTargetPrefix + JoinName(upstream, uri)
	}
	return ResourceTargetPrefix + JoinName(upstream, uri)
}

// PromptTarget is the id of an upstream's prompt (its own name), or of all
// its prompts when prompt is empty: "prompt:docs", "prompt:docs.summarize".
func PromptTarget(upstream, prompt string) string {
	if prompt == "" {
		return PromptTargetPrefix + JoinName(upstream)
	}
	return PromptTargetPrefix + JoinName(upstream, prompt)
}
