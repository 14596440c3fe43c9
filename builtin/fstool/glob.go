package fstool

import (
	"path"
	"path/filepath"
	"strings"

	"github.com/toolgate/toolgate"
	"github.com/toolgate/toolgate/builtin"
)

// glob is a compiled search pattern: a literal base folder and the
// segments matched below it. A "**" segment matches zero or more path
// segments; any other segment is a path.Match pattern for one segment.
type glob struct {
	base []string // literal leading segments (no glob metacharacters)
	segs []string // the rest, matched against paths relative to base
}

// compileGlob parses a slash-separated pattern relative to the workspace.
// Absolute patterns and ".." segments are refused with
// toolgate.CodePathOutsideWorkspace; malformed ones with CodeBadArguments.
func compileGlob(pattern string) (glob, error) {
	if pattern == "" {
		return glob{}, builtin.BadArguments(nil, "fs.search: pattern is required (e.g. \"**/*.md\")")
	}
	if strings.ContainsRune(pattern, 0) {
		return glob{}, builtin.BadArguments(nil, "fs.search: pattern %q contains a NUL byte", pattern)
	}
	if path.IsAbs(pattern) || filepath.IsAbs(pattern) || filepath.VolumeName(pattern) != "" {
		return glob{}, builtin.Refuse(toolgate.CodePathOutsideWorkspace,
			"fs.search pattern %q is outside the workspace: absolute patterns are refused", pattern)
	}
	var g glob
	literal := true
	for _, s := range strings.Split(pattern, "/") {
		switch s {
		case "", ".":
			continue
		case "..":
			return glob{}, builtin.Refuse(toolgate.CodePathOutsideWorkspace,
				"fs.search pattern %q is outside the workspace: \"..\" is refused", pattern)
		}
		if s != "**" {
			if _, err := path.Match(s, ""); err != nil {
				return glob{}, builtin.BadArguments(err, "fs.search: pattern %q: segment %q is malformed: %v", pattern, s, err)
			}
		}
		if literal && !strings.ContainsAny(s, `*?[\`) {
			g.base = append(g.base, s)
			continue
		}
		literal = false
		g.segs = append(g.segs, s)
	}
	return g, nil
}

// baseRel is the literal base folder as a workspace-relative path.
func (g glob) baseRel() string { return joinPath(g.base) }

// match reports whether rel (slash-separated, relative to the base) matches.
// When the pattern had no wildcard segment, only the base itself matches,
// and the caller passes ".".
func (g glob) match(rel string) bool {
	if rel == "." {
		return len(g.segs) == 0 || allDoubleStar(g.segs)
	}
	return matchSegs(g.segs, strings.Split(rel, "/"))
}

func allDoubleStar(segs []string) bool {
	for _, s := range segs {
		if s != "**" {
			return false
		}
	}
	return true
}

// matchSegs matches pattern segments against path segments in O(len(pat) ×
// len(name)) time (a table, not backtracking). Hidden files are matched like
// any other.
func matchSegs(pat, name []string) bool {
	// ok[j] says pat[i:] matches name[j:], computed from the last i down.
	ok := make([]bool, len(name)+1)
	ok[len(name)] = true // empty pattern matches the empty name
	next := make([]bool, len(name)+1)
	for i := len(pat) - 1; i >= 0; i-- {
		if pat[i] == "**" {
			// "**" matches name[j:k] for any k >= j.
			acc := false
			for j := len(name); j >= 0; j-- {
				acc = acc || ok[j]
				next[j] = acc
			}
		} else {
			next[len(name)] = false
			for j := len(name) - 1; j >= 0; j-- {
				m, _ := path.Match(pat[i], name[j])
				next[j] = m && ok[j+1]
			}
		}
		ok, next = next, ok
	}
	return ok[0]
}

// prefixMayMatch reports whether some path below dir (relative to the base)
// could still match, so the walk can skip folders that cannot.
func (g glob) prefixMayMatch(dir []string) bool {
	pat := g.segs
	for _, d := range dir {
		if len(pat) == 0 {
			return false
		}
		if pat[0] == "**" {
			return true
		}
		if ok, _ := path.Match(pat[0], d); !ok {
			return false
		}
		pat = pat[1:]
	}
	return true
}
