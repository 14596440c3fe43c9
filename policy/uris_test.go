package policy_test

import (
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/toolgate/toolgate/policy"
)

func TestCheckResourceURI(t *testing.T) {
	cases := []struct {
		name    string
		uri     string
		wantErr string // "" means accepted
	}{
		{"plain", "file:///docs/a.md", ""},
		{"query and fragment", "https://x.example/a?b=c#d", ""},
		{"escaped space", "file:///docs/a%20b.md", ""},
		{"a dot inside a name", "file:///docs/.hidden", ""},
		{"dots in a query", "file:///a?p=../b", ""},
		{"empty", "", "empty"},
		{"dot-dot", "file:///docs/../etc/passwd", `".."`},
		{"dot", "file:///docs/./a", `"."`},
		{"trailing dot-dot", "file:///docs/..", `".."`},
		{"encoded slash", "file:///docs%2fetc", "%2f"},
		{"encoded dot", "file:///docs/%2E%2E/x", "%2E"},
		{"encoded backslash", "file:///docs/%5c", "%5c"},
		{"encoded percent", "file:///docs/%25", "%25"},
		{"encoded NUL", "file:///docs/%00", "%00"},
		{"truncated escape", "file:///docs/%4", "malformed percent escape"},
		{"non-hex escape", "file:///docs/%g1", "malformed percent escape"},
		{"backslash", `file:///docs\a`, `"\"`},
		{"control character", "file:///docs/a\nb", "control character"},
		{"DEL", "file:///docs/a\x7fb", "control character"},
		{"invalid UTF-8", "file:///docs/\xc3", "UTF-8"},
		{"a template's brace", "file:///docs/{x}", "template"},
		{"too long", "file:///" + strings.Repeat("a", policy.MaxURILen), "longer than"},
		{"escaped unreserved letter", "file:///docs/%73ecret", "unreserved"},
		{"escaped tilde", "file:///docs/%7Ejo", "unreserved"},
		{"escaped digit", "file:///docs/%31", "unreserved"},
		{"lowercase hex", "file:///docs/a%3ab", "lowercase hex"},
		{"uppercase hex reserved", "file:///docs/a%3Ab", ""},
		{"uppercase scheme", "FILE:///docs/secret", "scheme"},
		{"mixed-case scheme", "File:///docs/secret", "scheme"},
		{"uppercase host", "https://Wiki.example/home", "authority"},
		{"a colon in a path is no scheme", "notes/a:b", ""},
		{"an urn", "urn:isbn:0451450523", ""},
		{"uppercase path is kept", "file:///Docs/A.md", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := policy.CheckResourceURI(c.uri)
			switch {
			case c.wantErr == "" && err != nil:
				t.Errorf("CheckResourceURI(%q) = %v, want nil", c.uri, err)
			case c.wantErr != "" && (err == nil || !strings.Contains(err.Error(), c.wantErr)):
				t.Errorf("CheckResourceURI(%q) = %v, want an error mentioning %q", c.uri, err, c.wantErr)
			}
		})
	}
}

func TestCompileURIPattern(t *testing.T) {
	for _, bad := range []string{"", "file:///docs/{+path", "file:///../{x}", "file:///a%2f{x}", "file:///a/{x}}", "file:///a\\{x}"} {
		if _, err := policy.CompileURIPattern(bad); err == nil {
			t.Errorf("CompileURIPattern(%q) compiled", bad)
		}
	}
}

func TestURIPatternMatches(t *testing.T) {
	cases := []struct {
		pattern, uri string
		template     bool
		want         bool
	}{
		{"file:///readme.md", "file:///readme.md", false, true},
		{"file:///readme.md", "file:///readme.md", true, false}, // an exact entry covers no template
		{"file:///readme.md", "file:///readme.mdx", false, false},
		{"file:///docs/{+path}", "file:///docs/a/b.md", false, true},
		{"file:///docs/{+path}", "file:///docs/", false, true},
		{"file:///docs/{+path}", "file:///docsx", false, false},
		{"file:///docs/{+path}", "file:///doc", false, false},
		{"file:///docs/{+path}", "file:///docs/a b", false, false},
		{"file:///docs/{+path}", "file:///docs/a%20b", false, true},
		{"file:///docs/{+path}", "file:///docs/{+path}", true, true},
		{"file:///docs/{+path}", "file:///docs/{path}", true, false},
		{"file:///docs/{+path}", "file:///docs/é", false, false},
		{"file:///notes/{name}", "file:///notes/a", false, true},
		{"file:///notes/{name}", "file:///notes/a/b", false, false},
		{"file:///notes/{name}", "file:///notes/a,b", false, true},
		{"file:///notes/{name}", "file:///notes/a?x", false, false},
		{"db://{schema}/{table}", "db://s/t", false, true},
		{"db://{schema}/{table}", "db://s/t/u", false, false},
		{"search{?q,lang}", "search?q=a&lang=en", false, true},
		{"search{?q,lang}", "search?q=a/b", false, false},
	}
	for _, c := range cases {
		p, err := policy.CompileURIPattern(c.pattern)
		if err != nil {
			t.Fatalf("CompileURIPattern(%q): %v", c.pattern, err)
		}
		if got := p.Matches(c.uri, c.template); got != c.want {
			t.Errorf("%q.Matches(%q, template=%v) = %v, want %v", c.pattern, c.uri, c.template, got, c.want)
		}
	}
}

// fastPathTemplates are templates Matches scans rather than matching with
// the regexp, and one it does not.
var fastPathTemplates = []string{"file:///docs/{+path}", "hr://salaries/{id}", "{+all}", "x:{v}", "a/b{?q}"}

// TestURIPatternFastPath: the scan gives the regexp's answer for every
// string, URI or not.
func TestURIPatternFastPath(t *testing.T) {
	const alphabet = "aZ09-._~!#$&'()*+,/:;=?@[]%%%{}\\ \"<>^`|é\x00fF"
	rng := rand.New(rand.NewPCG(1, 2))
	for _, tmpl := range fastPathTemplates {
		p, err := policy.CompileURIPattern(tmpl)
		if err != nil {
			t.Fatal(err)
		}
		if want := !strings.Contains(tmpl, "?"); p.HasFastPath() != want {
			t.Errorf("%q: fast path %v, want %v", tmpl, p.HasFastPath(), want)
		}
		prefix := tmpl[:strings.IndexByte(tmpl, '{')]
		for range 20000 {
			var b strings.Builder
			if rng.IntN(4) > 0 {
				b.WriteString(prefix)
			}
			for n := rng.IntN(12); n > 0; n-- {
				r := []rune(alphabet)
				b.WriteRune(r[rng.IntN(len(r))])
			}
			u := b.String()
			if u == "" {
				continue // Matches refuses an empty URI outright
			}
			if got, want := p.Matches(u, false), p.MatchesRegexp(u); got != want {
				t.Fatalf("%q: Matches(%q) = %v, the regexp says %v", tmpl, u, got, want)
			}
		}
	}
}

// FuzzURIPattern: the fast path agrees with the regexp, and no URI
// CheckResourceURI refuses is one a fuzzed template reaches by another
// spelling of a refused path.
func FuzzURIPattern(f *testing.F) {
	for _, s := range []string{"file:///docs/a.md", "file:///docs/%41", "file:///docs/a%2", "hr://salaries/1,2", "x:"} {
		f.Add(s)
	}
	pats := make([]policy.URIPattern, len(fastPathTemplates))
	for i, tmpl := range fastPathTemplates {
		p, err := policy.CompileURIPattern(tmpl)
		if err != nil {
			f.Fatal(err)
		}
		pats[i] = p
	}
	f.Fuzz(func(t *testing.T, u string) {
		if len(u) > 512 || u == "" {
			return
		}
		for i, p := range pats {
			if got, want := p.Matches(u, false), p.MatchesRegexp(u); got != want {
				t.Fatalf("%q: Matches(%q) = %v, the regexp says %v", fastPathTemplates[i], u, got, want)
			}
		}
		if policy.CheckResourceURI(u) == nil && (strings.Contains(u, "/../") || strings.Contains(strings.ToLower(u), "%2f")) {
			t.Fatalf("CheckResourceURI accepted %q", u)
		}
	})
}
