// Package policy loads, validates and describes the policy bundle: a folder of
// YAML files whose documents (Tool, Agent, RuntimePolicy, Instance,
// Principal, Role, ToolPolicy, Settings) are the seeds' configuration
// (docs/design.md, "Vocabulary"). Loading is strict (an unknown field or kind is an error
// naming file, line and field path) and has no side effects; Validate
// separates errors, which stop a bundle, from warnings, which do not.
// Package authz compiles a valid bundle into the snapshot decisions use.
package policy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Bundle is the decoded documents of a policy bundle, in file order, with
// the problems found while decoding. The zero value is an empty bundle.
type Bundle struct {
	Tools           []*Tool
	Agents          []*Agent
	RuntimePolicies []*RuntimePolicy
	Instances       []*Instance
	Principals      []*Principal
	Roles           []*Role
	ToolPolicies    []*ToolPolicy
	Settings        []*Settings
	Upstreams       []*Upstream
	Credentials     []*Credential
	Databases       []*Database
	// Extra holds documents of kinds registered by other packages (see
	// RegisterKind), keyed by kind.
	Extra map[string][]any

	// Files lists the files read, in order.
	Files []string
	// Decode holds problems found while decoding; Validate reports them too.
	decode []Diagnostic
}

// kinds maps a document kind to the Go type it decodes into.
var kinds = map[string]reflect.Type{
	"Tool":          reflect.TypeFor[Tool](),
	"Agent":         reflect.TypeFor[Agent](),
	"RuntimePolicy": reflect.TypeFor[RuntimePolicy](),
	"Instance":      reflect.TypeFor[Instance](),
	"Principal":     reflect.TypeFor[Principal](),
	"Role":          reflect.TypeFor[Role](),
	"ToolPolicy":    reflect.TypeFor[ToolPolicy](),
	"Settings":      reflect.TypeFor[Settings](),
	"Upstream":      reflect.TypeFor[Upstream](),
	"Credential":    reflect.TypeFor[Credential](),
	"Database":      reflect.TypeFor[Database](),
}

// KindNames lists the document kinds the loader accepts, sorted.
func KindNames() []string {
	out := make([]string, 0, len(kinds))
	for k := range kinds {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// MaxFileBytes bounds one bundle file; larger files are refused.
const MaxFileBytes = 8 << 20

// LoadDir reads every *.yaml and *.yml file directly in dir (sorted by
// name). The error is for an unreadable folder; problems inside files are
// diagnostics returned by Validate.
func LoadDir(dir string) (*Bundle, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("read bundle: %w", err)
	}
	b := &Bundle{}
	n := 0
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || strings.HasPrefix(name, ".") || !(strings.HasSuffix(name, ".yaml") || strings.HasSuffix(name, ".yml")) {
			continue
		}
		path := filepath.Join(dir, name)
		data, err := readLimited(path)
		if err != nil {
			b.decode = append(b.decode, Diagnostic{File: path, Message: err.Error()})
			continue
		}
		b.AddYAML(path, data)
		n++
	}
	if n == 0 {
		b.decode = append(b.decode, Diagnostic{File: dir, Message: "no *.yaml files in the bundle folder"})
	}
	return b, nil
}

func readLimited(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxFileBytes+1))
	if err != nil {
		return nil, err
	}
	if len(data) > MaxFileBytes {
		return nil, fmt.Errorf("file is larger than %d bytes", MaxFileBytes)
	}
	return data, nil
}

// AddYAML decodes every document of one YAML file into the bundle. A
// document may be a single mapping with a kind, or a sequence of them.
func (b *Bundle) AddYAML(file string, data []byte) {
	b.Files = append(b.Files, file)
	dec := yaml.NewDecoder(bytes.NewReader(data))
	for {
		var doc yaml.Node
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			b.decode = append(b.decode, Diagnostic{File: file, Line: syntaxErrLine(data, err), Message: "YAML: " + strings.ReplaceAll(err.Error(), "\n", "; ")})
			return
		}
		b.AddNode(file, &doc)
	}
}

// AddNode decodes the documents in one YAML node (a document node, a
// mapping with a kind, or a sequence of such mappings).
func (b *Bundle) AddNode(file string, n *yaml.Node) {
	switch n.Kind {
	case yaml.DocumentNode:
		for _, c := range n.Content {
			b.AddNode(file, c)
		}
	case yaml.SequenceNode:
		for _, c := range n.Content {
			b.addDocument(file, c)
		}
	case yaml.MappingNode:
		b.addDocument(file, n)
	case 0:
	default:
		if n.Tag == "!!null" {
			return
		}
		b.decode = append(b.decode, Diagnostic{File: file, Line: n.Line, Message: "expected a document with a kind, found a scalar"})
	}
}

func (b *Bundle) addDocument(file string, n *yaml.Node) {
	errf := func(line int, format string, args ...any) {
		b.decode = append(b.decode, Diagnostic{File: file, Line: line, Message: fmt.Sprintf(format, args...)})
	}
	defer func() {
		if r := recover(); r != nil {
			errf(n.Line, "internal error decoding this document (refused): %v", r)
		}
	}()
	if n.Kind != yaml.MappingNode {
		errf(n.Line, "expected a document (a mapping with a kind)")
		return
	}
	kind := ""
	var rest []*yaml.Node
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Value == "kind" {
			if kind != "" {
				errf(k.Line, "duplicate kind key (the document already has kind %s)", kind)
				return
			}
			kind = v.Value
			if kind == "" {
				kind = "\x00empty"
			}
			continue
		}
		rest = append(rest, k, v)
	}
	if kind == "" || kind == "\x00empty" {
		errf(n.Line, "document has no kind (want one of %s)", strings.Join(allKindNames(), ", "))
		return
	}
	t, ok := kinds[kind]
	if !ok {
		t, ok = extraKinds[kind]
	}
	if !ok {
		errf(n.Line, "unknown kind %q (want one of %s)", kind, strings.Join(allKindNames(), ", "))
		return
	}
	body := &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map", Line: n.Line, Column: n.Column, Content: rest}
	if problems := checkFields(body, t, kind); len(problems) > 0 {
		for _, p := range problems {
			errf(p.line, "%s", p.msg)
		}
		return
	}
	v := reflect.New(t)
	if err := body.Decode(v.Interface()); err != nil {
		errf(yamlErrLine(err), "%s: %s", kind, strings.TrimPrefix(err.Error(), "yaml: "))
		return
	}
	fillPos(body, v.Elem(), file)
	switch d := v.Interface().(type) {
	case *Tool:
		b.Tools = append(b.Tools, d)
	case *Agent:
		b.Agents = append(b.Agents, d)
	case *RuntimePolicy:
		b.RuntimePolicies = append(b.RuntimePolicies, d)
	case *Instance:
		b.Instances = append(b.Instances, d)
	case *Principal:
		b.Principals = append(b.Principals, d)
	case *Role:
		b.Roles = append(b.Roles, d)
	case *ToolPolicy:
		b.ToolPolicies = append(b.ToolPolicies, d)
	case *Settings:
		b.Settings = append(b.Settings, d)
	case *Upstream:
		b.Upstreams = append(b.Upstreams, d)
	case *Credential:
		b.Credentials = append(b.Credentials, d)
	case *Database:
		b.Databases = append(b.Databases, d)
	default:
		if b.Extra == nil {
			b.Extra = map[string][]any{}
		}
		b.Extra[kind] = append(b.Extra[kind], d)
	}
}

// extraKinds are kinds registered by packages outside policy (the gateway's
// Upstream and Credential documents).
var extraKinds = map[string]reflect.Type{}

// RegisterKind makes the loader accept documents of kind, decoded strictly
// into a new *T and kept in Bundle.Extra[kind]. Call it from an init
// function; it panics on a duplicate kind (a programming error).
func RegisterKind[T any](kind string) {
	if _, dup := kinds[kind]; dup {
		panic("policy: duplicate kind " + kind)
	}
	if _, dup := extraKinds[kind]; dup {
		panic("policy: duplicate kind " + kind)
	}
	extraKinds[kind] = reflect.TypeFor[T]()
}

func allKindNames() []string {
	out := KindNames()
	for k := range extraKinds {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

type fieldProblem struct {
	line int
	msg  string
}

var unmarshalerType = reflect.TypeFor[yaml.Unmarshaler]()

// checkFields walks n against type t and reports every key that names no
// field, with its line and field path ("Agent tool_permissions[1].tier").
func checkFields(n *yaml.Node, t reflect.Type, path string) []fieldProblem {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if reflect.PointerTo(t).Implements(unmarshalerType) {
		return nil // the type checks its own fields
	}
	if n.Kind == yaml.AliasNode {
		return []fieldProblem{{n.Line, path + ": YAML aliases are not allowed in a policy bundle"}}
	}
	var out []fieldProblem
	switch t.Kind() {
	case reflect.Struct:
		if n.Kind != yaml.MappingNode {
			return nil // node.Decode reports the type error
		}
		fields := yamlFields(t)
		for i := 0; i+1 < len(n.Content); i += 2 {
			k := n.Content[i]
			f, ok := fields[k.Value]
			if !ok {
				out = append(out, fieldProblem{k.Line, fmt.Sprintf("%s: unknown field %q (known: %s)", path+"."+k.Value, k.Value, strings.Join(sortedKeys(fields), ", "))})
				continue
			}
			out = append(out, checkFields(n.Content[i+1], f.Type, path+"."+k.Value)...)
		}
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			return nil
		}
		for i, c := range n.Content {
			out = append(out, checkFields(c, t.Elem(), fmt.Sprintf("%s[%d]", path, i))...)
		}
	case reflect.Map:
		if n.Kind != yaml.MappingNode {
			return nil
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			out = append(out, checkFields(n.Content[i+1], t.Elem(), path+"."+n.Content[i].Value)...)
		}
	}
	return out
}

// yamlFields maps YAML keys to struct fields, skipping "-" and following
// inline embedding.
func yamlFields(t reflect.Type) map[string]reflect.StructField {
	out := map[string]reflect.StructField{}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		tag := f.Tag.Get("yaml")
		name, opts, _ := strings.Cut(tag, ",")
		if name == "-" || !f.IsExported() {
			continue
		}
		if strings.Contains(opts, "inline") {
			for k, v := range yamlFields(f.Type) {
				v.Index = append([]int{i}, v.Index...)
				out[k] = v
			}
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		out[name] = f
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

var posType = reflect.TypeFor[Pos]()

// fillPos sets the Pos of every struct reachable from v to its node's
// line, and makes every list field the node writes non-nil.
func fillPos(n *yaml.Node, v reflect.Value, file string) {
	for v.Kind() == reflect.Pointer {
		if v.IsNil() {
			return
		}
		v = v.Elem()
	}
	switch v.Kind() {
	case reflect.Struct:
		if f := v.FieldByName("Pos"); f.IsValid() && f.Type() == posType && f.CanSet() {
			f.Set(reflect.ValueOf(Pos{File: file, Line: n.Line}))
		}
		if n.Kind != yaml.MappingNode {
			return
		}
		fields := yamlFields(v.Type())
		for i := 0; i+1 < len(n.Content); i += 2 {
			if sf, ok := fields[n.Content[i].Value]; ok {
				f := v.FieldByIndex(sf.Index)
				if f.Kind() == reflect.Slice && f.IsNil() && f.CanSet() {
					// A list written in the bundle is declared, even when
					// it is empty or null ("resource_permissions:" with its
					// last entry deleted declares none, never the default).
					f.Set(reflect.MakeSlice(f.Type(), 0, 0))
				}
				fillPos(n.Content[i+1], f, file)
			}
		}
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			return
		}
		for i := 0; i < v.Len() && i < len(n.Content); i++ {
			fillPos(n.Content[i], v.Index(i), file)
		}
	}
}

// syntaxErrLine finds the line of a YAML syntax error. yaml.v3 reports the
// line where the enclosing construct starts, so the first line whose
// prefix no longer parses is a better answer.
func syntaxErrLine(data []byte, err error) int {
	reported := yamlErrLine(err)
	lines := bytes.SplitAfter(data, []byte("\n"))
	if len(lines) > 2000 {
		return reported
	}
	var prefix []byte
	for i, l := range lines {
		prefix = append(prefix, l...)
		dec := yaml.NewDecoder(bytes.NewReader(prefix))
		for {
			var n yaml.Node
			e := dec.Decode(&n)
			if errors.Is(e, io.EOF) {
				break
			}
			if e != nil {
				return i + 1
			}
		}
	}
	return reported
}

// yamlErrLine extracts "line N" from a yaml.v3 error, or 0.
func yamlErrLine(err error) int {
	var te *yaml.TypeError
	msg := err.Error()
	if errors.As(err, &te) && len(te.Errors) > 0 {
		msg = te.Errors[0]
	}
	i := strings.Index(msg, "line ")
	if i < 0 {
		return 0
	}
	n := 0
	for _, c := range msg[i+5:] {
		if c < '0' || c > '9' {
			break
		}
		n = n*10 + int(c-'0')
	}
	return n
}
