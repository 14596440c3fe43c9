// Package builtin defines the contract of toolgate's built-in tools: tools the
// gateway itself provides (workspace files in package builtin/fstool,
// configured SQL databases in package builtin/sqltool) rather than forwards to
// an upstream.
//
// A built-in tool differs from an upstream tool in one way that matters to the
// decision: before it runs, it can say exactly which resources a call would
// touch. Inspect validates the arguments and returns every resource (each file
// path, each table and view a query reads) or refuses the call with a
// *toolgate.Error; the decision's resource check (docs/design.md, "The decision", check 8) runs
// over that list. Run executes the call and enforces the same limits again, so
// a call that Inspect refused can never run.
//
// Results are capped (Options.ResultMaxKiB, 64 KiB by default); a cut is
// always marked in the text ("[truncated: N of M bytes shown]") and in
// Result.Truncated, never silent.
package builtin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"
	"unicode/utf8"

	"github.com/toolgate/toolgate"
)

// DefaultResultMaxKiB is the result cap used when Options.ResultMaxKiB is 0.
const DefaultResultMaxKiB = 64

// Tool is a built-in tool. Implementations are safe for concurrent use.
type Tool interface {
	// Name is the function name the model calls, e.g. "fs.read", "sql.query".
	Name() string
	// Spec describes the tool: description, input JSON Schema and
	// side-effect class.
	Spec() Spec
	// Inspect has no side effects: it validates the arguments and reports
	// every resource the call would touch, or refuses with a *toolgate.Error
	// (Layer toolgate.LayerResource, or toolgate.LayerNone for bad arguments)
	// whose message names what was refused.
	Inspect(ctx context.Context, inv Invocation) ([]toolgate.Resource, error)
	// Run executes the call. It re-checks everything Inspect checks and
	// returns the same *toolgate.Error refusals; other errors are failures
	// of the tool itself (a database that is down, a timeout).
	Run(ctx context.Context, inv Invocation) (Result, error)
}

// Spec describes a built-in tool to the catalog and the model.
type Spec struct {
	// Description is the one-paragraph text shown to the model.
	Description string `json:"description"`
	// InputSchema is the JSON Schema (draft 2020-12) of the arguments
	// object. Unknown properties are refused by Inspect and Run.
	InputSchema json.RawMessage `json:"input_schema"`
	// SideEffect is the tool's side-effect class; every built-in tool is
	// toolgate.SideEffectRead.
	SideEffect toolgate.SideEffectClass `json:"side_effect_class"`
	// NeedsWorkspace is true for tools that only work inside an
	// invocation's workspace (fs.*); such a tool refuses a call with no
	// workspace, and a workspace needs at least one of them (Wyrd
	// "Selecting tools").
	NeedsWorkspace bool `json:"needs_workspace,omitempty"`
}

// Invocation is one call of a built-in tool.
type Invocation struct {
	// Args is the JSON arguments object as the model sent it.
	Args json.RawMessage
	// Workspace is the absolute path of the folder the agent's file tools
	// may reach; "" means the agent has no workspace. It comes from the
	// caller's configuration, never from model output.
	Workspace string
	// Inspected, when set, is what Inspect reported for this call and the
	// decision allowed: a tool that reads a set of files reads only those
	// (a file that appeared after the decision is not read).
	Inspected []toolgate.Resource
}

// Result is what a tool returns.
type Result struct {
	// Content is the text shown to the model, at most the configured cap
	// in bytes, including any truncation marker.
	Content string
	// Structured is the same result as JSON-encodable data (its shape is
	// documented on each tool), cut to match Content.
	Structured any
	// Bytes is len(Content), the returned byte count recorded with the call.
	Bytes int
	// Truncated is true when Content or Structured was cut (by the KiB cap,
	// a row limit, a line limit or a match limit); the cut is also marked in
	// Content.
	Truncated bool
}

// Options are the settings every built-in tool shares. The zero value is
// valid and means the defaults.
type Options struct {
	// ResultMaxKiB caps Result.Content, in KiB (1024 bytes). 0 means
	// DefaultResultMaxKiB (64); the Wyrd setting is
	// WYRD_VERIFICATION_TOOL_RESULT_MAX_KIB.
	ResultMaxKiB int `json:"result_max_kib,omitempty" yaml:"result_max_kib,omitempty"`
}

// MaxBytes returns the cap in bytes (o may be nil).
func (o *Options) MaxBytes() int {
	if o == nil || o.ResultMaxKiB <= 0 {
		return DefaultResultMaxKiB * 1024
	}
	return o.ResultMaxKiB * 1024
}

// Refuse returns a refusal on the resource layer: code is one of
// toolgate.CodePathOutsideWorkspace, CodeUnsafeQuery, CodeUnparsableQuery;
// the message names what was refused.
func Refuse(code toolgate.Code, format string, args ...any) *toolgate.Error {
	return &toolgate.Error{Code: code, Layer: toolgate.LayerResource, Message: fmt.Sprintf(format, args...)}
}

// BadArguments returns a toolgate.CodeBadArguments refusal (Layer resource,
// since it is the tool that refuses), wrapping cause when it is not nil.
func BadArguments(cause error, format string, args ...any) *toolgate.Error {
	return &toolgate.Error{Code: toolgate.CodeBadArguments, Layer: toolgate.LayerResource, Message: fmt.Sprintf(format, args...), Err: cause}
}

// NeedWorkspace is the refusal of a file tool called without a workspace.
func NeedWorkspace(tool string) *toolgate.Error {
	return BadArguments(nil, "%s needs a workspace, and this agent has none: give the agent a workspace folder or remove %s from its tool_names", tool, tool)
}

// DecodeArgs decodes a JSON arguments object into v strictly: unknown fields,
// trailing data and non-object arguments are refused with
// toolgate.CodeBadArguments naming the tool. Empty args mean {}.
func DecodeArgs(tool string, args json.RawMessage, v any) error {
	if len(bytes.TrimSpace(args)) == 0 || bytes.Equal(bytes.TrimSpace(args), []byte("null")) {
		args = json.RawMessage("{}")
	}
	// encoding/json matches field names case-insensitively; a condition
	// written on args.path must not be dodged with "Path", so every key
	// must be exactly a field's name.
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(args, &keys); err != nil {
		return BadArguments(err, "%s: invalid arguments: %v", tool, err)
	}
	known := jsonFieldNames(v)
	for k := range keys {
		if !known[k] {
			return BadArguments(nil, "%s: unknown argument %q (argument names are exact and case-sensitive)", tool, k)
		}
	}
	dec := json.NewDecoder(bytes.NewReader(args))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return BadArguments(err, "%s: invalid arguments: %v", tool, err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return BadArguments(err, "%s: invalid arguments: trailing data after the JSON object", tool)
	}
	return nil
}

// jsonFieldNames returns the exact JSON names of the struct v points to.
func jsonFieldNames(v any) map[string]bool {
	out := map[string]bool{}
	t := reflect.TypeOf(v)
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == nil || t.Kind() != reflect.Struct {
		return out
	}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" || !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out[name] = true
	}
	return out
}

// TruncationMarker formats the marker appended to a cut text:
// "[truncated: N of M bytes shown]".
func TruncationMarker(shown, total int) string {
	return fmt.Sprintf("[truncated: %d of %d bytes shown]", shown, total)
}

// Cap cuts text to at most maxBytes bytes including the marker, at a UTF-8
// boundary and preferably at a line end, and appends
// "\n[truncated: N of M bytes shown]" (N bytes of text kept, M in total). It
// returns the text unchanged and false when it fits.
func Cap(text string, maxBytes int) (string, bool) {
	if len(text) <= maxBytes {
		return text, false
	}
	// The marker's length depends on N; reserve room for the widest one.
	reserve := len("\n"+TruncationMarker(len(text), len(text))) + 1
	keep := max(maxBytes-reserve, 0)
	for keep > 0 && !utf8.RuneStart(text[keep]) {
		keep--
	}
	if nl := strings.LastIndexByte(text[:keep], '\n'); nl >= keep/2 && nl >= 0 {
		keep = nl + 1
	}
	out := text[:keep]
	if !strings.HasSuffix(out, "\n") && out != "" {
		out += "\n"
	}
	return out + TruncationMarker(keep, len(text)), true
}

// CutLines joins lines (each without its newline) into a text of at most
// maxBytes bytes. When all lines fit it returns them joined and kept =
// len(lines). Otherwise it keeps the longest prefix of whole lines that fits
// with the marker "[truncated: N of M bytes shown]" (M is the size of all
// lines joined) and returns how many lines were kept, so a tool can cut its
// structured result to match.
func CutLines(lines []string, maxBytes int) (text string, kept int, truncated bool) {
	total := 0
	for _, l := range lines {
		total += len(l) + 1
	}
	if total <= maxBytes {
		return strings.Join(lines, "\n"), len(lines), false
	}
	reserve := len(TruncationMarker(total, total)) + 1
	var b strings.Builder
	for _, l := range lines {
		if b.Len()+len(l)+1+reserve > maxBytes {
			break
		}
		b.WriteString(l)
		b.WriteByte('\n')
		kept++
	}
	shown := b.Len()
	b.WriteString(TruncationMarker(shown, total))
	return b.String(), kept, true
}

// NewResult builds a Result from content, applying the cap: truncated says
// whether the tool already cut the data (rows, lines, matches).
func NewResult(content string, structured any, truncated bool, maxBytes int) Result {
	c, cut := Cap(content, maxBytes)
	return Result{Content: c, Structured: structured, Bytes: len(c), Truncated: truncated || cut}
}
