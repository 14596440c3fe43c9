package fstool

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// inside reports whether p, with every link resolved by the operating
// system, is the folder ws or below it.
func inside(t *testing.T, ws, p string) bool {
	real, err := filepath.EvalSymlinks(p)
	if err != nil {
		t.Fatalf("accepted path %s does not resolve: %v", p, err)
	}
	return real == ws || strings.HasPrefix(real, ws+string(filepath.Separator))
}

// FuzzResolve checks that no accepted path escapes the workspace: whatever
// Resolve accepts exists, is local, and resolves (by the operating system's
// own symlink resolution) inside the workspace. The seed corpus is in
// testdata/fuzz/FuzzResolve plus the f.Add calls.
func FuzzResolve(f *testing.F) {
	for _, s := range []string{
		"", ".", "README.md", "docs/a.md", "../outside/secret.txt", "/etc/passwd", "link_out_rel",
		"link_evil/secret.txt", "dirlink_out/secret.txt", "dirlink_in/b.md", "docs/up_in", "chain1",
		"docs/sub/via_up", "dangling_out", "loop", "docs//sub/./b.md", "docs/sub/../../..", "..",
	} {
		f.Add(s)
	}
	fx := newFixture(f)
	ws, err := filepath.EvalSymlinks(fx.ws)
	if err != nil {
		f.Fatal(err)
	}
	root, err := os.OpenRoot(fx.ws)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { root.Close() })
	f.Fuzz(func(t *testing.T, rel string) {
		got, err := Resolve(root, rel)
		if err != nil {
			return
		}
		if got != "." && !filepath.IsLocal(got) {
			t.Fatalf("Resolve(%q) = %q, not local", rel, got)
		}
		if !inside(t, ws, filepath.Join(fx.ws, got)) {
			t.Fatalf("Resolve(%q) = %q resolves outside the workspace", rel, got)
		}
		// The name as given must lead to the same place through os.Root.
		if _, err := root.Stat(got); err != nil {
			t.Fatalf("Resolve(%q) = %q, which os.Root cannot stat: %v", rel, got, err)
		}
	})
}

// FuzzSearchPattern checks that an accepted search pattern's base folder
// resolves inside the workspace and that every path the pattern matches
// under it stays there.
func FuzzSearchPattern(f *testing.F) {
	for _, s := range []string{
		"**", "**/*.md", "docs/**", "../**/secret.txt", "/etc/**", "dirlink_out/**", "dirlink_in/*",
		"link_evil/**", "docs/**/../../secret.txt", "[", "*/../*", "./docs/./*.md",
	} {
		f.Add(s)
	}
	fx := newFixture(f)
	ws, err := filepath.EvalSymlinks(fx.ws)
	if err != nil {
		f.Fatal(err)
	}
	root, err := os.OpenRoot(fx.ws)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { root.Close() })
	f.Fuzz(func(t *testing.T, pattern string) {
		g, err := compileGlob(pattern)
		if err != nil {
			return
		}
		for _, s := range append(g.base, g.segs...) {
			if s == ".." {
				t.Fatalf("compileGlob(%q) kept a \"..\" segment", pattern)
			}
		}
		base, err := Resolve(root, g.baseRel())
		if err != nil {
			return
		}
		if !inside(t, ws, filepath.Join(fx.ws, base)) {
			t.Fatalf("pattern %q: base %q resolves outside", pattern, base)
		}
	})
}
