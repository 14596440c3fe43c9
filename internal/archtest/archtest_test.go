package archtest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"go/parser"
	"go/token"
	"io"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// module is the import path of the module whose boundaries are checked.
const module = "github.com/toolgate/toolgate"

// rule is one never-arrow of docs/design.md ("6. Packages and the arrows
// between them"). Packages are named by their path in the module: "" is
// the root package (the vocabulary), "gate" is module/gate.
type rule struct {
	// name says the rule as a sentence; a failure quotes it.
	name string
	// subject reports whether the rule binds the package rel.
	subject func(rel string) bool
	// allowed reports whether a package the rule binds may import the
	// module's package rel. Packages outside the module are not judged.
	allowed func(rel string) bool
	// transitive makes the rule bind everything a subject depends on, not
	// only what its own files import: a path subject → … → p with p not
	// allowed breaks it.
	transitive bool
}

// rules are the boundaries the test keeps. Only the imports of non-test
// files count: a test may import what it needs to build the real thing it
// tests (a store, an upstream, the gateway). What test files import against
// a rule is logged by TestBoundaries, not failed.
var rules = []rule{
	{
		name:    "a transport (mcpproxy, httpapi) imports of the module only the vocabulary (root package), toolid, gate, identity and the adapters' public types (adapter/...)",
		subject: oneOf("mcpproxy", "httpapi"),
		allowed: func(rel string) bool { return oneOf("", "toolid", "gate", "identity")(rel) || under(rel, "adapter") },
	},
	{
		name:       "authz, the pure core, depends on nothing of the module but the vocabulary (root package), policy, cond and toolid",
		subject:    oneOf("authz"),
		allowed:    oneOf("", "policy", "cond", "toolid"),
		transitive: true,
	},
	{
		name:       "nothing under adapter/, store/ or upstream/ depends on gate",
		subject:    func(rel string) bool { return under(rel, "adapter", "store", "upstream") },
		allowed:    func(rel string) bool { return rel != "gate" },
		transitive: true,
	},
}

// oneOf is a set of package paths.
func oneOf(rels ...string) func(string) bool {
	return func(rel string) bool { return slices.Contains(rels, rel) }
}

// under reports whether rel is one of dirs or a package below one.
func under(rel string, dirs ...string) bool {
	for _, d := range dirs {
		if rel == d || strings.HasPrefix(rel, d+"/") {
			return true
		}
	}
	return false
}

// pkg is one package of the module, its imports reduced to the module's
// own packages (module-relative paths).
type pkg struct {
	// imports are what its non-test files import.
	imports []string
	// testImports are what its test files (in-package and _test package)
	// import, the package itself excepted.
	testImports []string
	// files maps each of its files (module-relative path) to what the
	// file imports, to name where an edge is.
	files map[string][]string
	// testFiles is the set of its test files among files.
	testFiles map[string]bool
}

// graph is the module's import graph by module-relative path.
type graph map[string]*pkg

// TestBoundaries fails for every import edge of a non-test file that
// breaks one of the rules, naming the rule, the edge (or, for a transitive
// rule, the whole path) and the files that import it. Imports of test files
// are checked against the same rules and logged (go test -v shows them);
// they do not fail the test.
func TestBoundaries(t *testing.T) {
	g := load(t)
	for _, r := range rules {
		n := 0
		for rel := range g {
			if r.subject(rel) {
				n++
			}
		}
		if n == 0 {
			// A rule that binds nothing passes whatever the code does:
			// a renamed package must rename the rule, not disable it.
			t.Errorf("rule %q binds no package of %s", r.name, module)
		}
	}
	for _, v := range check(g, rules, false) {
		t.Errorf("boundary broken: %s", v)
	}
	for _, v := range check(g, rules, true) {
		t.Logf("test files only (not enforced): %s", v)
	}
}

// TestCheck runs the checker on a made-up graph, so that what it reports
// (and that it reports at all) does not depend on the code today being
// right or wrong.
func TestCheck(t *testing.T) {
	g := graph{
		"":               {files: map[string][]string{"toolgate.go": nil}},
		"gate":           {imports: []string{"", "adapter"}, files: map[string][]string{"gate/gate.go": {"", "adapter"}}},
		"identity":       {imports: []string{"gate"}, files: map[string][]string{"identity/id.go": {"gate"}}},
		"policy":         {imports: []string{"", "store/sqlite"}, files: map[string][]string{"policy/p.go": {""}, "policy/q.go": {"store/sqlite"}}},
		"authz":          {imports: []string{"", "policy"}, files: map[string][]string{"authz/a.go": {"", "policy"}}},
		"upstream":       {files: map[string][]string{"upstream/m.go": nil}},
		"store/sqlite":   {files: map[string][]string{"store/sqlite/s.go": nil}},
		"adapter":        {imports: []string{""}, files: map[string][]string{"adapter/a.go": {""}}},
		"adapter/direct": {imports: []string{"gate"}, files: map[string][]string{"adapter/direct/d.go": {"gate"}}},
		"adapter/trans":  {imports: []string{"identity"}, files: map[string][]string{"adapter/trans/t.go": {"identity"}}},
		"mcpproxy": {
			imports:     []string{"gate", "upstream", "adapter/direct"},
			testImports: []string{"store/sqlite", "gate"},
			files: map[string][]string{
				"mcpproxy/a.go": {"gate", "upstream"}, "mcpproxy/b.go": {"upstream", "adapter/direct"},
				"mcpproxy/a_test.go": {"store/sqlite", "gate"},
			},
			testFiles: map[string]bool{"mcpproxy/a_test.go": true},
		},
		"httpapi": {imports: []string{"gate", "identity"}, files: map[string][]string{"httpapi/h.go": {"gate", "identity"}}},
	}
	tests := []struct {
		name string
		test bool
		want []string
	}{
		{
			name: "non-test files",
			want: []string{
				`adapter/direct imports gate (adapter/direct/d.go), breaking: ` + rules[2].name,
				`adapter/trans depends on gate through adapter/trans -> identity -> gate (identity imported by adapter/trans/t.go), breaking: ` + rules[2].name,
				`authz depends on store/sqlite through authz -> policy -> store/sqlite (policy imported by authz/a.go), breaking: ` + rules[1].name,
				`mcpproxy imports upstream (mcpproxy/a.go, mcpproxy/b.go), breaking: ` + rules[0].name,
			},
		},
		{
			name: "test files",
			test: true,
			want: []string{
				`test files of mcpproxy import store/sqlite (mcpproxy/a_test.go), breaking: ` + rules[0].name,
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, check(g, rules, tc.test)); diff != "" {
				t.Errorf("violations (-want +got):\n%s", diff)
			}
		})
	}
}

// check returns every way g breaks rs, sorted: with test false, by the
// non-test files (for transitive rules, along any path of non-test
// imports); with test true, by the direct imports of test files.
func check(g graph, rs []rule, test bool) []string {
	var out []string
	for _, r := range rs {
		for rel, p := range g {
			if !r.subject(rel) {
				continue
			}
			if test {
				for _, imp := range p.testImports {
					if !r.allowed(imp) {
						out = append(out, fmt.Sprintf("test files of %s import %s (%s), breaking: %s",
							show(rel), show(imp), strings.Join(p.importers(imp, true), ", "), r.name))
					}
				}
				continue
			}
			for _, path := range g.reach(rel, r) {
				bad := path[len(path)-1]
				if len(path) == 2 {
					out = append(out, fmt.Sprintf("%s imports %s (%s), breaking: %s",
						show(rel), show(bad), strings.Join(p.importers(bad, false), ", "), r.name))
					continue
				}
				shown := make([]string, len(path))
				for i, s := range path {
					shown[i] = show(s)
				}
				out = append(out, fmt.Sprintf("%s depends on %s through %s (%s imported by %s), breaking: %s",
					show(rel), show(bad), strings.Join(shown, " -> "),
					show(path[1]), strings.Join(p.importers(path[1], false), ", "), r.name))
			}
		}
	}
	slices.Sort(out)
	return out
}

// reach returns, for each package from depends on that r does not allow,
// the shortest import path from → … → it (just from → it unless r is
// transitive). A path ends at the first package not allowed.
func (g graph) reach(from string, r rule) [][]string {
	prev := map[string]string{from: from}
	queue := []string{from}
	var out [][]string
	for len(queue) > 0 {
		cur := queue[0]
		queue = queue[1:]
		p := g[cur]
		if p == nil {
			continue
		}
		imps := slices.Sorted(slices.Values(p.imports))
		for _, imp := range imps {
			if _, seen := prev[imp]; seen {
				continue
			}
			prev[imp] = cur
			if !r.allowed(imp) {
				path := []string{imp}
				for s := imp; s != from; {
					s = prev[s]
					path = append(path, s)
				}
				slices.Reverse(path)
				out = append(out, path)
				continue
			}
			if r.transitive {
				queue = append(queue, imp)
			}
		}
	}
	return out
}

// importers are p's files (test files when test, the others otherwise)
// that import the module's package imp, sorted.
func (p *pkg) importers(imp string, test bool) []string {
	var out []string
	for f, imps := range p.files {
		if p.testFiles[f] == test && slices.Contains(imps, imp) {
			out = append(out, f)
		}
	}
	slices.Sort(out)
	return out
}

// show names a module package for a message: its module-relative path, the
// root package by the module's path.
func show(rel string) string {
	if rel == "" {
		return module
	}
	return rel
}

// listed is what go list -json tells of one package (the fields used).
type listed struct {
	ImportPath   string
	Dir          string
	Imports      []string
	TestImports  []string
	XTestImports []string
	GoFiles      []string
	CgoFiles     []string
	TestGoFiles  []string
	XTestGoFiles []string
	Error        *listError
	DepsErrors   []*listError
}

// listError is go list's report of a package it could not load; an import
// cycle (such as a store importing gate, which imports the store) is one,
// and ImportStack names its path.
type listError struct {
	ImportStack []string
	Err         string
}

func (e *listError) String() string {
	if len(e.ImportStack) == 0 {
		return e.Err
	}
	return e.Err + " (import stack: " + strings.Join(e.ImportStack, " -> ") + ")"
}

// load reads the module's import graph with go list (build constraints of
// the host apply, as for go build) and the imports of each file with
// go/parser, to name them.
func load(t *testing.T) graph {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed to read the import graph: %v", err)
	}
	cmd := exec.Command(goBin, "list", "-e", "-json", module+"/...")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	outb, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.Bytes())
	}
	g := graph{}
	dec := json.NewDecoder(bytes.NewReader(outb))
	for {
		var l listed
		if err := dec.Decode(&l); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("go list output: %v", err)
		}
		if l.Error != nil {
			t.Fatalf("go list: package %s: %s", l.ImportPath, l.Error)
		}
		for _, e := range l.DepsErrors {
			t.Fatalf("go list: package %s: %s", l.ImportPath, e)
		}
		rel, ok := relOf(l.ImportPath)
		if !ok {
			continue
		}
		notSelf := func(s string) bool { return s == rel }
		p := &pkg{imports: own(l.Imports), testImports: slices.DeleteFunc(own(slices.Concat(l.TestImports, l.XTestImports)), notSelf),
			files: map[string][]string{}, testFiles: map[string]bool{}}
		for _, f := range slices.Concat(l.GoFiles, l.CgoFiles, l.TestGoFiles, l.XTestGoFiles) {
			imps, err := fileImports(filepath.Join(l.Dir, f))
			if err != nil {
				t.Fatal(err)
			}
			name := filepath.ToSlash(filepath.Join(rel, f))
			p.files[name] = own(imps)
			if slices.Contains(l.TestGoFiles, f) || slices.Contains(l.XTestGoFiles, f) {
				p.testFiles[name] = true
			}
		}
		g[rel] = p
	}
	if g[""] == nil {
		t.Fatalf("go list %s/... did not list the root package", module)
	}
	return g
}

// relOf is path's module-relative path; ok is false outside the module.
func relOf(path string) (rel string, ok bool) {
	if path == module {
		return "", true
	}
	rel, ok = strings.CutPrefix(path, module+"/")
	return rel, ok
}

// own keeps the module's packages of paths, module-relative, once each.
func own(paths []string) []string {
	var out []string
	for _, path := range paths {
		if rel, ok := relOf(path); ok && !slices.Contains(out, rel) {
			out = append(out, rel)
		}
	}
	return out
}

// fileImports are the import paths of one Go file.
func fileImports(file string) ([]string, error) {
	f, err := parser.ParseFile(token.NewFileSet(), file, nil, parser.ImportsOnly)
	if err != nil {
		return nil, fmt.Errorf("read the imports of %s: %w", file, err)
	}
	var out []string
	for _, s := range f.Imports {
		path, err := strconv.Unquote(s.Path.Value)
		if err != nil {
			return nil, fmt.Errorf("%s: import %s: %w", file, s.Path.Value, err)
		}
		out = append(out, path)
	}
	return out, nil
}
