// Package fstool provides the built-in workspace file tools fs.list, fs.read
// and fs.search (Wyrd "Built-in tools"). Each call reaches only the folder
// given as its invocation's workspace: every access goes through an os.Root
// opened on that folder, and every path is first resolved by Resolve, which
// refuses absolute paths, "..", and symbolic links that point outside
// (toolgate.CodePathOutsideWorkspace). No tool writes: nothing in this
// package creates, changes or removes a file.
package fstool

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/toolgate/toolgate"
	"github.com/toolgate/toolgate/builtin"
)

// Function names of the tools.
const (
	ListName   = "fs.list"
	ReadName   = "fs.read"
	SearchName = "fs.search"
)

// Defaults for Options fields left at zero.
const (
	DefaultMaxLines           = 400
	DefaultMaxEntries         = 1000
	DefaultMaxMatches         = 200
	DefaultMaxSearchFiles     = 20000
	DefaultMaxSearchFileBytes = 4 << 20
)

// Options tune the file tools. The zero value (and nil) means the defaults.
type Options struct {
	builtin.Options `yaml:",inline"`
	// MaxLines is the most lines one fs.read returns (default 400); a
	// longer span is cut and the cut marked.
	MaxLines int `json:"max_lines,omitempty" yaml:"max_lines,omitempty"`
	// MaxEntries is the most entries one fs.list returns (default 1000).
	MaxEntries int `json:"max_entries,omitempty" yaml:"max_entries,omitempty"`
	// MaxMatches is the most paths or matching lines one fs.search returns
	// (default 200).
	MaxMatches int `json:"max_matches,omitempty" yaml:"max_matches,omitempty"`
	// MaxSearchFiles is the most files one fs.search looks at (default
	// 20000); the walk stops there and the result says so.
	MaxSearchFiles int `json:"max_search_files,omitempty" yaml:"max_search_files,omitempty"`
	// MaxSearchFileBytes is the largest file fs.search reads for a query
	// (default 4 MiB); larger files are skipped and counted.
	MaxSearchFileBytes int64 `json:"max_search_file_bytes,omitempty" yaml:"max_search_file_bytes,omitempty"`
}

func (o *Options) withDefaults() Options {
	var v Options
	if o != nil {
		v = *o
	}
	if v.MaxLines <= 0 {
		v.MaxLines = DefaultMaxLines
	}
	if v.MaxEntries <= 0 {
		v.MaxEntries = DefaultMaxEntries
	}
	if v.MaxMatches <= 0 {
		v.MaxMatches = DefaultMaxMatches
	}
	if v.MaxSearchFiles <= 0 {
		v.MaxSearchFiles = DefaultMaxSearchFiles
	}
	if v.MaxSearchFileBytes <= 0 {
		v.MaxSearchFileBytes = DefaultMaxSearchFileBytes
	}
	return v
}

// New returns fs.list, fs.read and fs.search, in that order. opts may be nil.
func New(opts *Options) []builtin.Tool {
	o := opts.withDefaults()
	return []builtin.Tool{&listTool{o}, &readTool{o}, &searchTool{o}}
}

var (
	_ builtin.Tool = (*listTool)(nil)
	_ builtin.Tool = (*readTool)(nil)
	_ builtin.Tool = (*searchTool)(nil)
)

// openRoot opens the invocation's workspace, refusing a call without one.
func openRoot(tool string, inv builtin.Invocation) (*os.Root, error) {
	if inv.Workspace == "" {
		return nil, builtin.NeedWorkspace(tool)
	}
	if !filepath.IsAbs(inv.Workspace) {
		return nil, builtin.BadArguments(nil, "%s: workspace %q is not an absolute path", tool, inv.Workspace)
	}
	r, err := os.OpenRoot(inv.Workspace)
	if err != nil {
		return nil, builtin.BadArguments(err, "%s: the workspace folder cannot be opened: %v", tool, err)
	}
	return r, nil
}

func fsResource(p string) []toolgate.Resource {
	return []toolgate.Resource{{Type: "fs", Name: p, Action: "read"}}
}

// ---- fs.list ----

type listArgs struct {
	Path string `json:"path"`
}

// ListEntry is one entry of an fs.list result. Type is "file", "dir",
// "symlink" or "other"; Size is in bytes (files only). Path is
// workspace-relative.
type ListEntry struct {
	Name string `json:"name"`
	Path string `json:"path"`
	Type string `json:"type"`
	Size int64  `json:"size,omitempty"`
}

// ListResult is fs.list's Result.Structured.
type ListResult struct {
	Path      string      `json:"path"`
	Entries   []ListEntry `json:"entries"`
	Truncated bool        `json:"truncated,omitempty"`
}

type listTool struct{ o Options }

func (t *listTool) Name() string { return ListName }

func (t *listTool) Spec() builtin.Spec {
	return builtin.Spec{
		Description: "Lists the files and folders in one folder of the workspace (not recursive). " +
			"Folders end with '/'. Symbolic links are shown, not followed.",
		InputSchema: json.RawMessage(`{"type":"object","properties":{` +
			`"path":{"type":"string","description":"folder relative to the workspace; default the workspace itself"}` +
			`},"additionalProperties":false}`),
		SideEffect:     toolgate.SideEffectRead,
		NeedsWorkspace: true,
	}
}

func (t *listTool) prepare(inv builtin.Invocation) (*os.Root, string, error) {
	var a listArgs
	if inv.Workspace == "" {
		err := builtin.NeedWorkspace(ListName)
		return nil, "", err
	}
	if err := builtin.DecodeArgs(ListName, inv.Args, &a); err != nil {
		return nil, "", err
	}
	root, err := openRoot(ListName, inv)
	if err != nil {
		return nil, "", err
	}
	p, err := Resolve(root, a.Path)
	if err != nil {
		root.Close()
		return nil, "", err
	}
	fi, err := root.Stat(p)
	if err != nil {
		root.Close()
		return nil, "", builtin.BadArguments(err, "fs.list: %q cannot be read: %v", a.Path, err)
	}
	if !fi.IsDir() {
		root.Close()
		return nil, "", builtin.BadArguments(nil, "fs.list: %q is not a folder; use fs.read for files", a.Path)
	}
	return root, p, nil
}

func (t *listTool) Inspect(ctx context.Context, inv builtin.Invocation) ([]toolgate.Resource, error) {
	root, p, err := t.prepare(inv)
	if err != nil {
		return nil, err
	}
	root.Close()
	return fsResource(p), nil
}

func (t *listTool) Run(ctx context.Context, inv builtin.Invocation) (builtin.Result, error) {
	root, p, err := t.prepare(inv)
	if err != nil {
		return builtin.Result{}, err
	}
	defer root.Close()
	d, err := root.Open(p)
	if err != nil {
		return builtin.Result{}, fmt.Errorf("fs.list %s: %w", p, err)
	}
	defer d.Close()
	var entries []fs.DirEntry
	truncated := false
	for {
		if err := ctx.Err(); err != nil {
			return builtin.Result{}, err
		}
		batch, err := d.ReadDir(1024)
		entries = append(entries, batch...)
		if errors.Is(err, io.EOF) || (err == nil && len(batch) == 0) {
			break
		}
		if err != nil {
			return builtin.Result{}, fmt.Errorf("fs.list %s: %w", p, err)
		}
		if len(entries) >= 100*t.o.MaxEntries {
			truncated = true // an enormous folder: sort what was read
			break
		}
	}
	slices.SortFunc(entries, func(a, b fs.DirEntry) int { return strings.Compare(a.Name(), b.Name()) })
	if len(entries) > t.o.MaxEntries {
		entries, truncated = entries[:t.o.MaxEntries], true
	}
	res := ListResult{Path: p, Entries: make([]ListEntry, 0, len(entries))}
	lines := make([]string, 0, len(entries)+1)
	for _, e := range entries {
		le := ListEntry{Name: e.Name(), Path: path.Join(p, e.Name())}
		switch mode := e.Type(); {
		case mode.IsDir():
			le.Type = "dir"
			lines = append(lines, e.Name()+"/")
		case mode&fs.ModeSymlink != 0:
			le.Type = "symlink"
			lines = append(lines, e.Name()+"@ (symbolic link)")
		case mode.IsRegular():
			le.Type = "file"
			if info, err := e.Info(); err == nil {
				le.Size = info.Size()
			}
			lines = append(lines, fmt.Sprintf("%s (%d bytes)", e.Name(), le.Size))
		default:
			le.Type = "other"
			lines = append(lines, e.Name()+" (special file)")
		}
		res.Entries = append(res.Entries, le)
	}
	if len(lines) == 0 {
		lines = append(lines, "(empty folder)")
	}
	if truncated {
		lines = append(lines, fmt.Sprintf("[truncated: first %d entries shown]", len(res.Entries)))
	}
	text, kept, cut := builtin.CutLines(lines, t.o.MaxBytes())
	if cut && kept < len(res.Entries) {
		res.Entries = res.Entries[:kept]
	}
	res.Truncated = truncated || cut
	return builtin.Result{Content: text, Structured: res, Bytes: len(text), Truncated: res.Truncated}, nil
}

// ---- fs.read ----

type readArgs struct {
	Path      string `json:"path"`
	StartLine int    `json:"start_line"`
	EndLine   int    `json:"end_line"`
}

// ReadResult is fs.read's Result.Structured: the text of lines
// StartLine..EndLine (1-based, inclusive; EndLine is the last line actually
// returned) of the workspace-relative Path. More says the file goes on past
// EndLine.
type ReadResult struct {
	Path      string `json:"path"`
	StartLine int    `json:"start_line"`
	EndLine   int    `json:"end_line"`
	More      bool   `json:"more"`
	Text      string `json:"text"`
	Truncated bool   `json:"truncated,omitempty"`
}

type readTool struct{ o Options }

func (t *readTool) Name() string { return ReadName }

func (t *readTool) Spec() builtin.Spec {
	return builtin.Spec{
		Description: fmt.Sprintf("Reads a span of lines of a text file in the workspace (at most %d lines per call; "+
			"lines are numbered from 1, end_line included).", t.o.MaxLines),
		InputSchema: json.RawMessage(`{"type":"object","properties":{` +
			`"path":{"type":"string","description":"file relative to the workspace"},` +
			`"start_line":{"type":"integer","minimum":1,"description":"first line, default 1"},` +
			`"end_line":{"type":"integer","minimum":1,"description":"last line, included; default start_line + the line limit - 1"}` +
			`},"required":["path"],"additionalProperties":false}`),
		SideEffect:     toolgate.SideEffectRead,
		NeedsWorkspace: true,
	}
}

func (t *readTool) prepare(inv builtin.Invocation) (*os.Root, string, readArgs, error) {
	var a readArgs
	if inv.Workspace == "" {
		err := builtin.NeedWorkspace(ReadName)
		return nil, "", a, err
	}
	if err := builtin.DecodeArgs(ReadName, inv.Args, &a); err != nil {
		return nil, "", a, err
	}
	root, err := openRoot(ReadName, inv)
	if err != nil {
		return nil, "", a, err
	}
	fail := func(err error) (*os.Root, string, readArgs, error) {
		root.Close()
		return nil, "", a, err
	}
	if a.Path == "" {
		return fail(builtin.BadArguments(nil, "fs.read: path is required"))
	}
	if a.StartLine < 0 || a.EndLine < 0 {
		return fail(builtin.BadArguments(nil, "fs.read: start_line and end_line count from 1"))
	}
	if a.StartLine == 0 {
		a.StartLine = 1
	}
	if a.EndLine != 0 && a.EndLine < a.StartLine {
		return fail(builtin.BadArguments(nil, "fs.read: end_line %d is before start_line %d", a.EndLine, a.StartLine))
	}
	p, err := Resolve(root, a.Path)
	if err != nil {
		return fail(err)
	}
	fi, err := root.Stat(p)
	if err != nil {
		return fail(builtin.BadArguments(err, "fs.read: %q cannot be read: %v", a.Path, err))
	}
	if fi.IsDir() {
		return fail(builtin.BadArguments(nil, "fs.read: %q is a folder; use fs.list", a.Path))
	}
	if !fi.Mode().IsRegular() {
		return fail(builtin.BadArguments(nil, "fs.read: %q is not a regular file", a.Path))
	}
	return root, p, a, nil
}

func (t *readTool) Inspect(ctx context.Context, inv builtin.Invocation) ([]toolgate.Resource, error) {
	root, p, _, err := t.prepare(inv)
	if err != nil {
		return nil, err
	}
	root.Close()
	return fsResource(p), nil
}

func (t *readTool) Run(ctx context.Context, inv builtin.Invocation) (builtin.Result, error) {
	root, p, a, err := t.prepare(inv)
	if err != nil {
		return builtin.Result{}, err
	}
	defer root.Close()
	f, err := openRegular(root, p)
	if err != nil {
		return builtin.Result{}, err
	}
	defer f.Close()

	lineCut := false
	end := a.EndLine
	if end == 0 || end-a.StartLine+1 > t.o.MaxLines {
		lineCut = end != 0
		end = a.StartLine + t.o.MaxLines - 1
	}
	maxBytes := t.o.MaxBytes()
	br := bufio.NewReaderSize(f, 64<<10)
	if head, _ := br.Peek(8000); bytes.IndexByte(head, 0) >= 0 {
		return builtin.Result{}, builtin.BadArguments(nil, "fs.read: %q is a binary file; fs.read returns text", a.Path)
	}
	var text strings.Builder
	line, last := 1, 0
	more, byteCut := false, false
	for {
		if line%4096 == 0 {
			if err := ctx.Err(); err != nil {
				return builtin.Result{}, err
			}
		}
		chunk, err := br.ReadSlice('\n')
		if line > end && len(chunk) > 0 {
			more = true
			break
		}
		if line >= a.StartLine && len(chunk) > 0 {
			if text.Len() < maxBytes+1 { // keep just enough to know it was cut
				text.Write(chunk[:min(len(chunk), maxBytes+1-text.Len())])
			}
			last = line
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue // the same line goes on
		}
		if len(chunk) > 0 && chunk[len(chunk)-1] == '\n' {
			line++
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return builtin.Result{}, fmt.Errorf("fs.read %s: %w", p, err)
		}
	}
	if last == 0 && a.StartLine > 1 {
		return builtin.Result{}, builtin.BadArguments(nil, "fs.read: %q has fewer than %d lines", a.Path, a.StartLine)
	}
	body := strings.ToValidUTF8(text.String(), "\uFFFD")
	var note string
	if more && (lineCut || a.EndLine == 0) {
		note = fmt.Sprintf("[lines %d-%d shown; the file goes on: call fs.read with start_line=%d]", a.StartLine, last, last+1)
	}
	budget := maxBytes - len(note) - 1
	kept, cut := builtin.Cap(body, budget)
	byteCut = cut
	content := kept
	if note != "" {
		if content != "" && !strings.HasSuffix(content, "\n") {
			content += "\n"
		}
		content += note
	}
	res := ReadResult{Path: p, StartLine: a.StartLine, EndLine: last, More: more, Truncated: byteCut || note != ""}
	if byteCut {
		res.Text = kept[:strings.LastIndex(kept, "[truncated:")]
	} else {
		res.Text = body
	}
	return builtin.Result{Content: content, Structured: res, Bytes: len(content), Truncated: res.Truncated}, nil
}

// openRegular opens p for reading without blocking on special files and
// refuses anything but a regular file.
func openRegular(root *os.Root, p string) (*os.File, error) {
	f, err := root.OpenFile(p, os.O_RDONLY|oNonblock, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", p, err)
	}
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		f.Close()
		return nil, builtin.BadArguments(err, "%q is not a regular file", p)
	}
	return f, nil
}

// ---- fs.search ----

type searchArgs struct {
	Pattern    string `json:"pattern"`
	Query      string `json:"query"`
	IgnoreCase bool   `json:"ignore_case"`
}

// SearchMatch is one hit of fs.search: a workspace-relative path, and with a
// query the 1-based line number and the line's text (cut to 240 bytes).
type SearchMatch struct {
	Path string `json:"path"`
	Line int    `json:"line,omitempty"`
	Text string `json:"text,omitempty"`
}

// SearchResult is fs.search's Result.Structured. Skipped counts files not
// searched (larger than the size limit, or binary).
type SearchResult struct {
	Pattern   string        `json:"pattern"`
	Query     string        `json:"query,omitempty"`
	Matches   []SearchMatch `json:"matches"`
	Skipped   int           `json:"skipped,omitempty"`
	Truncated bool          `json:"truncated,omitempty"`
}

type searchTool struct{ o Options }

func (t *searchTool) Name() string { return SearchName }

func (t *searchTool) Spec() builtin.Spec {
	return builtin.Spec{
		Description: "Finds workspace files whose relative path matches a glob pattern ('*' within a folder name, " +
			"'**' across folders, e.g. \"docs/**/*.md\"); with query, returns each line containing that text as path:line: text. " +
			"Symbolic links are not followed.",
		InputSchema: json.RawMessage(`{"type":"object","properties":{` +
			`"pattern":{"type":"string","description":"glob over workspace-relative paths; ** matches any number of folders"},` +
			`"query":{"type":"string","description":"text to find in the matching files"},` +
			`"ignore_case":{"type":"boolean","description":"match query regardless of case"}` +
			`},"required":["pattern"],"additionalProperties":false}`),
		SideEffect:     toolgate.SideEffectRead,
		NeedsWorkspace: true,
	}
}

func (t *searchTool) prepare(inv builtin.Invocation) (*os.Root, string, glob, searchArgs, error) {
	var a searchArgs
	if inv.Workspace == "" {
		err := builtin.NeedWorkspace(SearchName)
		return nil, "", glob{}, a, err
	}
	if err := builtin.DecodeArgs(SearchName, inv.Args, &a); err != nil {
		return nil, "", glob{}, a, err
	}
	g, err := compileGlob(a.Pattern)
	if err != nil {
		return nil, "", glob{}, a, err
	}
	if strings.ContainsAny(a.Query, "\n\r") {
		return nil, "", glob{}, a, builtin.BadArguments(nil, "fs.search: query must be on one line")
	}
	root, err := openRoot(SearchName, inv)
	if err != nil {
		return nil, "", glob{}, a, err
	}
	base, err := Resolve(root, g.baseRel())
	if err != nil {
		root.Close()
		return nil, "", glob{}, a, err
	}
	return root, base, g, a, nil
}

// Inspect reports the folder searched and every file the search would
// read (up to MaxSearchFiles, the most Run reads), so conditions and
// grants see each file, not only the folder.
func (t *searchTool) Inspect(ctx context.Context, inv builtin.Invocation) ([]toolgate.Resource, error) {
	root, base, g, _, err := t.prepare(inv)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	out := fsResource(base)
	err = t.walk(ctx, root, base, g, func(p string) (bool, error) {
		if p == base {
			return true, nil // a literal file: already reported
		}
		out = append(out, toolgate.Resource{Type: "fs", Name: p, Action: "read"})
		return len(out) <= t.o.MaxSearchFiles, nil
	})
	if err != nil {
		return nil, fmt.Errorf("fs.search: %w", err)
	}
	return out, nil
}

// walk calls fn with each regular file under base whose path matches g,
// never following links, until fn returns false or an error.
func (t *searchTool) walk(ctx context.Context, root *os.Root, base string, g glob, fn func(p string) (bool, error)) error {
	errStop := errors.New("stop")
	err := fs.WalkDir(root.FS(), base, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if p == base {
				return err
			}
			return nil // an unreadable folder below the base: skip it
		}
		if cerr := ctx.Err(); cerr != nil {
			return cerr
		}
		rel := "."
		if p != base {
			rel = strings.TrimPrefix(p, base+"/")
			if base == "." {
				rel = p
			}
		}
		if d.IsDir() {
			if rel != "." && !g.prefixMayMatch(strings.Split(rel, "/")) {
				return fs.SkipDir
			}
			return nil
		}
		if !d.Type().IsRegular() || !g.match(rel) {
			return nil // symbolic links and special files are never followed
		}
		more, err := fn(p)
		if err != nil {
			return err
		}
		if !more {
			return errStop
		}
		return nil
	})
	if errors.Is(err, errStop) {
		return nil
	}
	return err
}

func (t *searchTool) Run(ctx context.Context, inv builtin.Invocation) (builtin.Result, error) {
	root, base, g, a, err := t.prepare(inv)
	if err != nil {
		return builtin.Result{}, err
	}
	defer root.Close()
	res := SearchResult{Pattern: a.Pattern, Query: a.Query, Matches: []SearchMatch{}}
	query := a.Query
	if a.IgnoreCase {
		query = strings.ToLower(query)
	}
	var allowed map[string]bool
	if len(inv.Inspected) > 0 {
		allowed = map[string]bool{}
		for _, r := range inv.Inspected {
			allowed[r.Name] = true
		}
	}
	files := 0
	walkErr := t.walk(ctx, root, base, g, func(p string) (bool, error) {
		if allowed != nil && !allowed[p] {
			return true, nil // not what the decision saw: never read
		}
		files++
		if files > t.o.MaxSearchFiles {
			res.Truncated = true
			return false, nil
		}
		if a.Query == "" {
			res.Matches = append(res.Matches, SearchMatch{Path: p})
		} else {
			skipped, err := t.grep(ctx, root, p, query, a.IgnoreCase, &res)
			if err != nil {
				return false, err
			}
			if skipped {
				res.Skipped++
			}
		}
		if len(res.Matches) >= t.o.MaxMatches {
			res.Truncated = true
			return false, nil
		}
		return true, nil
	})
	if walkErr != nil {
		return builtin.Result{}, fmt.Errorf("fs.search %s: %w", a.Pattern, walkErr)
	}
	lines := make([]string, 0, len(res.Matches)+2)
	for _, m := range res.Matches {
		if a.Query == "" {
			lines = append(lines, m.Path)
		} else {
			lines = append(lines, fmt.Sprintf("%s:%d: %s", m.Path, m.Line, m.Text))
		}
	}
	if len(lines) == 0 {
		lines = append(lines, "no matches")
	}
	if res.Skipped > 0 {
		lines = append(lines, fmt.Sprintf("[%d files skipped: binary or larger than %d bytes]", res.Skipped, t.o.MaxSearchFileBytes))
	}
	if res.Truncated {
		lines = append(lines, fmt.Sprintf("[truncated: first %d matches shown]", len(res.Matches)))
	}
	text, kept, cut := builtin.CutLines(lines, t.o.MaxBytes())
	if cut && kept < len(res.Matches) {
		res.Matches = res.Matches[:kept]
	}
	res.Truncated = res.Truncated || cut
	return builtin.Result{Content: text, Structured: res, Bytes: len(text), Truncated: res.Truncated}, nil
}

// grep appends the lines of p containing query to res. It reports skipped
// for binary and oversized files.
func (t *searchTool) grep(ctx context.Context, root *os.Root, p, query string, fold bool, res *SearchResult) (skipped bool, err error) {
	f, err := openRegular(root, p)
	if err != nil {
		return true, nil // vanished or replaced since the walk saw it
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || fi.Size() > t.o.MaxSearchFileBytes {
		return true, nil
	}
	data, err := io.ReadAll(io.LimitReader(f, t.o.MaxSearchFileBytes+1))
	if err != nil {
		return true, nil
	}
	if bytes.IndexByte(data[:min(len(data), 8000)], 0) >= 0 {
		return true, nil
	}
	for n, line := range strings.Split(string(data), "\n") {
		if n%4096 == 0 {
			if err := ctx.Err(); err != nil {
				return false, err
			}
		}
		hay := line
		if fold {
			hay = strings.ToLower(line)
		}
		if !strings.Contains(hay, query) {
			continue
		}
		text := strings.TrimRight(line, "\r")
		if len(text) > 240 {
			text = strings.ToValidUTF8(text[:240], "") + "…"
		}
		res.Matches = append(res.Matches, SearchMatch{Path: p, Line: n + 1, Text: strings.ToValidUTF8(text, "\uFFFD")})
		if len(res.Matches) >= t.o.MaxMatches {
			return false, nil
		}
	}
	return false, nil
}
