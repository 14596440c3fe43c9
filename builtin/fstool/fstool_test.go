package fstool

import (
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/toolgate/toolgate"
	"github.com/toolgate/toolgate/builtin"
)

// fixture lays out, under one temporary parent:
//
//	ws/            the workspace
//	ws-evil/       a sibling sharing the workspace's name as a prefix
//	outside/       a folder outside, with secret.txt
//
// and inside ws links that stay in and links that point out, some dangling.
type fixture struct {
	parent, ws, outside string
}

func newFixture(t testing.TB) fixture {
	t.Helper()
	parent := t.TempDir()
	fx := fixture{parent: parent, ws: filepath.Join(parent, "ws"), outside: filepath.Join(parent, "outside")}
	files := map[string]string{
		"ws/README.md":                "# Project\nhello world\nsecond line\n",
		"ws/docs/a.md":                "alpha\nneedle one\nbeta\n",
		"ws/docs/sub/b.md":            "gamma\nNeedle two\n",
		"ws/docs/sub/c.txt":           "needle three\n",
		"ws/.hidden/h.md":             "needle hidden\n",
		"ws/lines.txt":                numbered(1000),
		"ws/bin.dat":                  "\x00\x01\x02binary",
		"ws-evil/secret.txt":          "evil secret\n",
		"outside/secret.txt":          "outside secret\n",
		"outside/sub/deeper/file.txt": "deep\n",
	}
	for name, body := range files {
		p := filepath.Join(parent, filepath.FromSlash(name))
		must(t, os.MkdirAll(filepath.Dir(p), 0o755))
		must(t, os.WriteFile(p, []byte(body), 0o644))
	}
	links := map[string]string{
		"ws/link_in":         "docs/a.md",
		"ws/docs/up_in":      "../README.md",
		"ws/dirlink_in":      "docs/sub",
		"ws/link_abs_in":     filepath.Join(fx.ws, "README.md"),
		"ws/link_out_abs":    filepath.Join(fx.outside, "secret.txt"),
		"ws/link_out_rel":    "../outside/secret.txt",
		"ws/link_evil":       "../ws-evil",
		"ws/dirlink_out":     fx.outside,
		"ws/docs/deep_out":   "../../outside",
		"ws/dangling_out":    "../outside/new.txt",
		"ws/dangling_abs":    filepath.Join(fx.outside, "new2.txt"),
		"ws/dangling_in":     "missing.txt",
		"ws/chain1":          "chain2",
		"ws/chain2":          "docs/../../outside/secret.txt",
		"ws/loop":            "loop",
		"ws/docs/sub/via_up": "../../dirlink_out/secret.txt",
	}
	for name, target := range links {
		must(t, os.Symlink(target, filepath.Join(parent, filepath.FromSlash(name))))
	}
	must(t, syscall.Mkfifo(filepath.Join(fx.ws, "fifo"), 0o644))
	return fx
}

func numbered(n int) string {
	var b strings.Builder
	for i := 1; i <= n; i++ {
		b.WriteString("line ")
		b.WriteString(strconv.Itoa(i))
		b.WriteByte('\n')
	}
	return b.String()
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func tools(t testing.TB, opts *Options) map[string]builtin.Tool {
	m := map[string]builtin.Tool{}
	for _, tl := range New(opts) {
		m[tl.Name()] = tl
	}
	return m
}

func codeOf(err error) toolgate.Code {
	var te *toolgate.Error
	if errors.As(err, &te) {
		return te.Code
	}
	if err != nil {
		return "other:" + toolgate.Code(err.Error())
	}
	return ""
}

func TestInspect(t *testing.T) {
	fx := newFixture(t)
	tl := tools(t, nil)
	res := func(p string) []toolgate.Resource { return []toolgate.Resource{{Type: "fs", Name: p, Action: "read"}} }
	tests := []struct {
		name      string
		tool      string
		args      string
		want      []toolgate.Resource
		wantCode  toolgate.Code
		wantInMsg string
	}{
		{"list root", ListName, `{}`, res("."), "", ""},
		{"list dot", ListName, `{"path":"."}`, res("."), "", ""},
		{"list docs", ListName, `{"path":"docs/"}`, res("docs"), "", ""},
		{"list linked folder inside", ListName, `{"path":"dirlink_in"}`, res("docs/sub"), "", ""},
		{"read file", ReadName, `{"path":"docs/a.md"}`, res("docs/a.md"), "", ""},
		{"read cleans", ReadName, `{"path":"./docs//a.md"}`, res("docs/a.md"), "", ""},
		{"read link inside reports target", ReadName, `{"path":"link_in"}`, res("docs/a.md"), "", ""},
		{"read link up inside", ReadName, `{"path":"docs/up_in"}`, res("README.md"), "", ""},
		{"read through linked folder inside", ReadName, `{"path":"dirlink_in/b.md"}`, res("docs/sub/b.md"), "", ""},
		// A search reports its folder and every file it would read.
		{"search all", SearchName, `{"pattern":"**/*.md"}`, append(res("."), append(res(".hidden/h.md"), append(res("README.md"), append(res("docs/a.md"), res("docs/sub/b.md")...)...)...)...), "", ""},
		{"search base", SearchName, `{"pattern":"docs/**/*.md","query":"x"}`, append(res("docs"), append(res("docs/a.md"), res("docs/sub/b.md")...)...), "", ""},
		{"search literal file", SearchName, `{"pattern":"docs/a.md"}`, res("docs/a.md"), "", ""},

		{"dotdot", ReadName, `{"path":"../outside/secret.txt"}`, nil, toolgate.CodePathOutsideWorkspace, `"../outside/secret.txt"`},
		{"dotdot inside path", ReadName, `{"path":"docs/../README.md"}`, nil, toolgate.CodePathOutsideWorkspace, `".."`},
		{"absolute", ReadName, `{"path":"` + filepath.Join(fx.ws, "README.md") + `"}`, nil, toolgate.CodePathOutsideWorkspace, "absolute"},
		{"absolute sibling prefix", ReadName, `{"path":"` + fx.ws + `-evil/secret.txt"}`, nil, toolgate.CodePathOutsideWorkspace, "ws-evil"},
		{"relative sibling prefix", ListName, `{"path":"../ws-evil"}`, nil, toolgate.CodePathOutsideWorkspace, "ws-evil"},
		{"link out absolute", ReadName, `{"path":"link_out_abs"}`, nil, toolgate.CodePathOutsideWorkspace, "link_out_abs"},
		{"link out relative", ReadName, `{"path":"link_out_rel"}`, nil, toolgate.CodePathOutsideWorkspace, "link_out_rel"},
		{"absolute link even inside", ReadName, `{"path":"link_abs_in"}`, nil, toolgate.CodePathOutsideWorkspace, "absolute"},
		{"link to sibling", ListName, `{"path":"link_evil"}`, nil, toolgate.CodePathOutsideWorkspace, "link_evil"},
		{"through link to sibling", ReadName, `{"path":"link_evil/secret.txt"}`, nil, toolgate.CodePathOutsideWorkspace, "link_evil"},
		{"linked folder out", ListName, `{"path":"dirlink_out"}`, nil, toolgate.CodePathOutsideWorkspace, "dirlink_out"},
		{"linked folder out file", ReadName, `{"path":"dirlink_out/secret.txt"}`, nil, toolgate.CodePathOutsideWorkspace, "dirlink_out"},
		{"nested link out", ListName, `{"path":"docs/deep_out/sub"}`, nil, toolgate.CodePathOutsideWorkspace, "deep_out"},
		{"chain out", ReadName, `{"path":"chain1"}`, nil, toolgate.CodePathOutsideWorkspace, "chain1"},
		{"link via up out", ReadName, `{"path":"docs/sub/via_up"}`, nil, toolgate.CodePathOutsideWorkspace, "via_up"},
		{"dangling out", ReadName, `{"path":"dangling_out"}`, nil, toolgate.CodePathOutsideWorkspace, "dangling_out"},
		{"dangling absolute", ReadName, `{"path":"dangling_abs"}`, nil, toolgate.CodePathOutsideWorkspace, "dangling_abs"},
		{"dangling in", ReadName, `{"path":"dangling_in"}`, nil, toolgate.CodeBadArguments, "does not exist"},
		{"loop", ReadName, `{"path":"loop"}`, nil, toolgate.CodeBadArguments, "symbolic links"},
		{"missing", ReadName, `{"path":"nope.txt"}`, nil, toolgate.CodeBadArguments, "does not exist"},
		{"file as folder", ReadName, `{"path":"README.md/x"}`, nil, toolgate.CodeBadArguments, "not a folder"},
		{"read folder", ReadName, `{"path":"docs"}`, nil, toolgate.CodeBadArguments, "is a folder"},
		{"read fifo", ReadName, `{"path":"fifo"}`, nil, toolgate.CodeBadArguments, "not a regular file"},
		{"list file", ListName, `{"path":"README.md"}`, nil, toolgate.CodeBadArguments, "not a folder"},
		{"read no path", ReadName, `{}`, nil, toolgate.CodeBadArguments, "path is required"},
		{"unknown field", ReadName, `{"path":"README.md","mode":"w"}`, nil, toolgate.CodeBadArguments, "mode"},
		{"nul", ReadName, `{"path":"README.md\u0000x"}`, nil, toolgate.CodeBadArguments, "NUL"},
		{"bad span", ReadName, `{"path":"README.md","start_line":5,"end_line":2}`, nil, toolgate.CodeBadArguments, "before"},
		{"search climbs", SearchName, `{"pattern":"../**/secret.txt"}`, nil, toolgate.CodePathOutsideWorkspace, `"../**/secret.txt"`},
		{"search climbs later", SearchName, `{"pattern":"docs/**/../../secret.txt"}`, nil, toolgate.CodePathOutsideWorkspace, "docs/**/../../secret.txt"},
		{"search absolute", SearchName, `{"pattern":"/etc/**"}`, nil, toolgate.CodePathOutsideWorkspace, "/etc/**"},
		{"search sibling absolute", SearchName, `{"pattern":"` + fx.ws + `-evil/**"}`, nil, toolgate.CodePathOutsideWorkspace, "absolute"},
		{"search through link out", SearchName, `{"pattern":"dirlink_out/**"}`, nil, toolgate.CodePathOutsideWorkspace, "dirlink_out"},
		{"search bad glob", SearchName, `{"pattern":"docs/[a"}`, nil, toolgate.CodeBadArguments, "malformed"},
		{"search no pattern", SearchName, `{"query":"x"}`, nil, toolgate.CodeBadArguments, "pattern is required"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tl[tc.tool].Inspect(context.Background(), builtin.Invocation{Args: json.RawMessage(tc.args), Workspace: fx.ws})
			if diff := cmp.Diff(tc.wantCode, codeOf(err)); diff != "" {
				t.Fatalf("code (-want +got):\n%s\nerr: %v", diff, err)
			}
			if err != nil {
				var te *toolgate.Error
				errors.As(err, &te)
				if te.Layer != toolgate.LayerResource {
					t.Errorf("layer = %q, want resource", te.Layer)
				}
				if !strings.Contains(te.Message, tc.wantInMsg) {
					t.Errorf("message %q does not name %q", te.Message, tc.wantInMsg)
				}
				// Run refuses the same way.
				_, rerr := tl[tc.tool].Run(context.Background(), builtin.Invocation{Args: json.RawMessage(tc.args), Workspace: fx.ws})
				if codeOf(rerr) != tc.wantCode {
					t.Errorf("Run code = %q, want %q (%v)", codeOf(rerr), tc.wantCode, rerr)
				}
				return
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("resources (-want +got):\n%s", diff)
			}
		})
	}
}

func TestNoWorkspace(t *testing.T) {
	for _, tl := range New(nil) {
		t.Run(tl.Name(), func(t *testing.T) {
			inv := builtin.Invocation{Args: json.RawMessage(`{"path":"a","pattern":"**"}`)}
			_, err := tl.Inspect(context.Background(), inv)
			var te *toolgate.Error
			if !errors.As(err, &te) || te.Code != toolgate.CodeBadArguments || !strings.Contains(te.Message, "needs a workspace") {
				t.Fatalf("Inspect err = %v, want bad_arguments saying it needs a workspace", err)
			}
			if _, err := tl.Run(context.Background(), inv); codeOf(err) != toolgate.CodeBadArguments {
				t.Fatalf("Run err = %v", err)
			}
			if !tl.Spec().NeedsWorkspace || tl.Spec().SideEffect != toolgate.SideEffectRead {
				t.Errorf("spec = %+v", tl.Spec())
			}
		})
	}
}

func run(t *testing.T, tl builtin.Tool, ws, args string) builtin.Result {
	t.Helper()
	r, err := tl.Run(context.Background(), builtin.Invocation{Args: json.RawMessage(args), Workspace: ws})
	if err != nil {
		t.Fatalf("%s %s: %v", tl.Name(), args, err)
	}
	if r.Bytes != len(r.Content) {
		t.Errorf("Bytes = %d, len(Content) = %d", r.Bytes, len(r.Content))
	}
	return r
}

func TestRead(t *testing.T) {
	fx := newFixture(t)
	tl := tools(t, &Options{MaxLines: 50})
	tests := []struct {
		name      string
		args      string
		want      ReadResult
		content   string
		truncated bool
	}{
		{"whole small file", `{"path":"README.md"}`,
			ReadResult{Path: "README.md", StartLine: 1, EndLine: 3, Text: "# Project\nhello world\nsecond line\n"},
			"# Project\nhello world\nsecond line\n", false},
		{"span", `{"path":"lines.txt","start_line":10,"end_line":12}`,
			ReadResult{Path: "lines.txt", StartLine: 10, EndLine: 12, More: true, Text: "line 10\nline 11\nline 12\n"},
			"line 10\nline 11\nline 12\n", false},
		{"through inside link", `{"path":"link_in","start_line":2,"end_line":2}`,
			ReadResult{Path: "docs/a.md", StartLine: 2, EndLine: 2, More: true, Text: "needle one\n"},
			"needle one\n", false},
		{"last lines", `{"path":"lines.txt","start_line":999}`,
			ReadResult{Path: "lines.txt", StartLine: 999, EndLine: 1000, Text: "line 999\nline 1000\n"},
			"line 999\nline 1000\n", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := run(t, tl[ReadName], fx.ws, tc.args)
			if diff := cmp.Diff(tc.want, r.Structured); diff != "" {
				t.Errorf("structured (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.content, r.Content); diff != "" {
				t.Errorf("content (-want +got):\n%s", diff)
			}
			if r.Truncated != tc.truncated {
				t.Errorf("truncated = %v", r.Truncated)
			}
		})
	}

	t.Run("span longer than MaxLines is cut and marked", func(t *testing.T) {
		r := run(t, tl[ReadName], fx.ws, `{"path":"lines.txt","start_line":1,"end_line":500}`)
		st := r.Structured.(ReadResult)
		if st.EndLine != 50 || !st.More || !r.Truncated {
			t.Fatalf("got %+v truncated=%v", st, r.Truncated)
		}
		if !strings.HasSuffix(r.Content, "line 50\n[lines 1-50 shown; the file goes on: call fs.read with start_line=51]") {
			t.Errorf("content tail = %q", r.Content[len(r.Content)-120:])
		}
	})
	t.Run("KiB cap is marked", func(t *testing.T) {
		small := tools(t, &Options{Options: builtin.Options{ResultMaxKiB: 1}, MaxLines: 1000})
		r := run(t, small[ReadName], fx.ws, `{"path":"lines.txt","end_line":1000}`)
		if len(r.Content) > 1024 || !r.Truncated {
			t.Fatalf("len %d truncated %v", len(r.Content), r.Truncated)
		}
		if !strings.Contains(r.Content, "[truncated: ") || !strings.Contains(r.Content, " bytes shown]") {
			t.Errorf("no marker in %q", r.Content)
		}
		st := r.Structured.(ReadResult)
		if !st.Truncated || !strings.HasPrefix(st.Text, "line 1\n") || strings.Contains(st.Text, "[truncated") {
			t.Errorf("structured = %+v", st)
		}
	})
	t.Run("binary refused", func(t *testing.T) {
		_, err := tl[ReadName].Run(context.Background(), builtin.Invocation{Args: json.RawMessage(`{"path":"bin.dat"}`), Workspace: fx.ws})
		if codeOf(err) != toolgate.CodeBadArguments || !strings.Contains(err.Error(), "binary") {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("start past end", func(t *testing.T) {
		_, err := tl[ReadName].Run(context.Background(), builtin.Invocation{Args: json.RawMessage(`{"path":"README.md","start_line":10}`), Workspace: fx.ws})
		if codeOf(err) != toolgate.CodeBadArguments {
			t.Fatalf("err = %v", err)
		}
	})
}

func TestList(t *testing.T) {
	fx := newFixture(t)
	tl := tools(t, nil)
	r := run(t, tl[ListName], fx.ws, `{"path":"docs"}`)
	want := ListResult{Path: "docs", Entries: []ListEntry{
		{Name: "a.md", Path: "docs/a.md", Type: "file", Size: 22},
		{Name: "deep_out", Path: "docs/deep_out", Type: "symlink"},
		{Name: "sub", Path: "docs/sub", Type: "dir"},
		{Name: "up_in", Path: "docs/up_in", Type: "symlink"},
	}}
	if diff := cmp.Diff(want, r.Structured); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	if diff := cmp.Diff("a.md (22 bytes)\ndeep_out@ (symbolic link)\nsub/\nup_in@ (symbolic link)", r.Content); diff != "" {
		t.Errorf("content (-want +got):\n%s", diff)
	}
	small := tools(t, &Options{MaxEntries: 2})
	r = run(t, small[ListName], fx.ws, `{"path":"docs"}`)
	if st := r.Structured.(ListResult); len(st.Entries) != 2 || !st.Truncated || !r.Truncated {
		t.Errorf("MaxEntries: %+v", st)
	}
}

func TestSearch(t *testing.T) {
	fx := newFixture(t)
	tl := tools(t, nil)
	paths := func(r builtin.Result) []string {
		var out []string
		for _, m := range r.Structured.(SearchResult).Matches {
			out = append(out, m.Path)
		}
		return out
	}
	tests := []struct {
		name string
		args string
		want []SearchMatch
	}{
		{"md anywhere", `{"pattern":"**/*.md"}`, []SearchMatch{
			{Path: ".hidden/h.md"}, {Path: "README.md"}, {Path: "docs/a.md"}, {Path: "docs/sub/b.md"}}},
		{"under docs", `{"pattern":"docs/**"}`, []SearchMatch{
			{Path: "docs/a.md"}, {Path: "docs/sub/b.md"}, {Path: "docs/sub/c.txt"}}},
		{"one level", `{"pattern":"docs/*.md"}`, []SearchMatch{{Path: "docs/a.md"}}},
		{"through inside folder link", `{"pattern":"dirlink_in/*.txt"}`, []SearchMatch{{Path: "docs/sub/c.txt"}}},
		{"query", `{"pattern":"**","query":"needle"}`, []SearchMatch{
			{Path: ".hidden/h.md", Line: 1, Text: "needle hidden"},
			{Path: "docs/a.md", Line: 2, Text: "needle one"},
			{Path: "docs/sub/c.txt", Line: 1, Text: "needle three"}}},
		{"query ignore case", `{"pattern":"docs/**/*.md","query":"NEEDLE","ignore_case":true}`, []SearchMatch{
			{Path: "docs/a.md", Line: 2, Text: "needle one"},
			{Path: "docs/sub/b.md", Line: 2, Text: "Needle two"}}},
		{"no matches", `{"pattern":"**/*.go"}`, []SearchMatch{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := run(t, tl[SearchName], fx.ws, tc.args)
			if diff := cmp.Diff(tc.want, r.Structured.(SearchResult).Matches); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
	r := run(t, tl[SearchName], fx.ws, `{"pattern":"**","query":"needle"}`)
	if diff := cmp.Diff(".hidden/h.md:1: needle hidden\ndocs/a.md:2: needle one\ndocs/sub/c.txt:1: needle three\n[1 files skipped: binary or larger than 4194304 bytes]", r.Content); diff != "" {
		t.Errorf("content (-want +got):\n%s", diff)
	}
	// Search never reports anything outside, whatever links exist.
	r = run(t, tl[SearchName], fx.ws, `{"pattern":"**","query":"secret"}`)
	if got := paths(r); len(got) != 0 {
		t.Errorf("search found %v outside the workspace", got)
	}
	small := tools(t, &Options{MaxMatches: 2})
	r = run(t, small[SearchName], fx.ws, `{"pattern":"**"}`)
	if got := r.Structured.(SearchResult); len(got.Matches) != 2 || !got.Truncated || !strings.Contains(r.Content, "[truncated: first 2 matches shown]") {
		t.Errorf("MaxMatches: %+v %q", got, r.Content)
	}
}

// snapshot records every name, size and link under dir.
func snapshot(t *testing.T, dir string) map[string]string {
	t.Helper()
	m := map[string]string{}
	must(t, filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		v := info.Mode().String() + " " + strconv.FormatInt(info.Size(), 10) + " " + info.ModTime().String()
		if d.Type()&fs.ModeSymlink != 0 {
			target, _ := os.Readlink(p)
			v += " -> " + target
		}
		m[p] = v
		return nil
	}))
	return m
}

// TestNothingIsCreatedOutside calls every tool, Inspect and Run, on every
// path the fixture has (dangling links pointing out included) and checks
// that nothing outside the workspace, and nothing inside, changed.
func TestNothingIsCreatedOutside(t *testing.T) {
	fx := newFixture(t)
	before := snapshot(t, fx.parent)
	var names []string
	must(t, filepath.WalkDir(fx.ws, func(p string, d fs.DirEntry, err error) error {
		rel, _ := filepath.Rel(fx.ws, p)
		names = append(names, filepath.ToSlash(rel))
		return err
	}))
	sort.Strings(names)
	extra := []string{"dangling_out/x", "dangling_abs/../x", "dirlink_out/new.txt", "link_evil/new.txt", "../outside/new.txt", "new.txt"}
	for _, tl := range New(nil) {
		for _, n := range append(names, extra...) {
			for _, args := range []string{
				`{"path":` + jsonString(n) + `}`,
				`{"path":` + jsonString(n) + `,"start_line":1,"end_line":3}`,
				`{"pattern":` + jsonString(n) + `,"query":"secret"}`,
				`{"pattern":` + jsonString(n+"/**") + `,"query":"x"}`,
			} {
				inv := builtin.Invocation{Args: json.RawMessage(args), Workspace: fx.ws}
				_, _ = tl.Inspect(context.Background(), inv)
				r, err := tl.Run(context.Background(), inv)
				if err == nil && strings.Contains(r.Content, "secret") {
					t.Errorf("%s %s returned text from outside: %q", tl.Name(), args, r.Content)
				}
			}
		}
	}
	after := snapshot(t, fx.parent)
	if diff := cmp.Diff(before, after); diff != "" {
		t.Errorf("the file tree changed (-before +after):\n%s", diff)
	}
	for _, p := range []string{filepath.Join(fx.outside, "new.txt"), filepath.Join(fx.outside, "new2.txt")} {
		if _, err := os.Lstat(p); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s exists: %v", p, err)
		}
	}
}

func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

func TestSearchReadsOnlyWhatWasInspected(t *testing.T) {
	ws := t.TempDir()
	os.WriteFile(filepath.Join(ws, "a.md"), []byte("needle\n"), 0o644)
	tools := New(nil)
	var search builtin.Tool
	for _, tl := range tools {
		if tl.Name() == SearchName {
			search = tl
		}
	}
	inv := builtin.Invocation{Args: json.RawMessage(`{"pattern":"*","query":"needle"}`), Workspace: ws}
	res, err := search.Inspect(context.Background(), inv)
	if err != nil {
		t.Fatal(err)
	}
	// A file that appears after the decision is not read.
	os.WriteFile(filepath.Join(ws, "late.env"), []byte("needle SECRET\n"), 0o644)
	inv.Inspected = res
	out, err := search.Run(context.Background(), inv)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out.Content, "SECRET") || !strings.Contains(out.Content, "a.md") {
		t.Errorf("search read %q", out.Content)
	}
}
