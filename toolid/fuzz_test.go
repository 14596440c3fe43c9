package toolid_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/toolgate/toolgate"
	"github.com/toolgate/toolgate/authz"
	"github.com/toolgate/toolgate/policy"
	"github.com/toolgate/toolgate/toolid"
)

// The spellings a name may take, written independently of toolid's scanner:
// the canonical id, or lowercase [a-z0-9] parts joined by any of _ . -.
var (
	idSpelling       = regexp.MustCompile(`^tool:[a-z0-9]+(-[a-z0-9]+)*$`)
	functionSpelling = regexp.MustCompile(`^[a-z0-9]+([_.-][a-z0-9]+)*$`)
	toDash           = strings.NewReplacer("_", "-", ".", "-")
)

// spellingOf returns the id name is a spelling of, or "" when it is none.
func spellingOf(name string) string {
	switch {
	case len(name) > toolid.MaxLen:
		return ""
	case idSpelling.MatchString(name):
		return name
	case functionSpelling.MatchString(name) && len(toolid.Prefix)+len(name) <= toolid.MaxLen:
		return toolid.Prefix + toDash.Replace(name)
	}
	return ""
}

// namesMalformedSnapshot compiles the catalog of the conformance scenario
// names-malformed.yaml, with the conformance default principal.
func namesMalformedSnapshot(tb testing.TB) *authz.Snapshot {
	tb.Helper()
	dir := os.Getenv("TOOLGATE_CONFORMANCE_DIR")
	if dir == "" {
		dir = filepath.Join("..", "..", "shared", "conformance")
	}
	file := filepath.Join(dir, "names-malformed.yaml")
	data, err := os.ReadFile(file)
	if err != nil {
		tb.Fatalf("read the conformance scenario (set TOOLGATE_CONFORMANCE_DIR): %v", err)
	}
	var cf struct {
		Bundle yaml.Node `yaml:"bundle"`
	}
	if err := yaml.Unmarshal(data, &cf); err != nil {
		tb.Fatal(err)
	}
	b := &policy.Bundle{}
	b.AddNode(file, &cf.Bundle)
	b.Principals = append(b.Principals, &policy.Principal{PrincipalID: "system:test",
		Grants: []policy.Grant{{Resource: "tool", Action: "invoke", Scope: policy.Scope{All: true}}}})
	snap, _, err := authz.Compile(b, nil)
	if err != nil {
		tb.Fatal(err)
	}
	return snap
}

// FuzzMap checks that a name maps exactly when it is a spelling of an id,
// and that no other name ever reaches a known tool through Decide.
func FuzzMap(f *testing.F) {
	for _, s := range []string{
		"supabase_write", "supabase.write", "supabase-write", "tool:supabase-write", "tool:supabase-read",
		"Supabase_Write", "supabase__write", "supabase_writ\u0435", "supabase_write ", " supabase_write", "",
		"tool:", "tool:supabase_write", "tool:Supabase-write", "TOOL:supabase-write", "supabase_write\x00",
		"supabase\u200bwrite", "ｓupabase_write", "supabase/write", "supabase:write", "_supabase_write",
		"supabase_write_", "tool::supabase-write", "tool:tool:supabase-write", "a.b-c_d", strings.Repeat("a", 124),
		strings.Repeat("a", 123), "tool:" + strings.Repeat("b", 123), "supabase_write\n", "supabase\u00a0write",
	} {
		f.Add(s)
	}
	snap := namesMalformedSnapshot(f)
	f.Fuzz(func(t *testing.T, name string) {
		id, err := toolid.Map(name)
		want := spellingOf(name)
		switch {
		case err == nil && want == "":
			t.Fatalf("Map(%q) = %q, but the name is no spelling of any id", name, id)
		case err == nil && id != want:
			t.Fatalf("Map(%q) = %q, want %q", name, id, want)
		case err != nil && want != "":
			t.Fatalf("Map(%q) failed (%v), but it spells %q", name, err, want)
		}
		if err == nil && !toolid.Valid(id) {
			t.Fatalf("Map(%q) = %q, which is not a valid id", name, id)
		}
		var buf [toolid.MaxLen]byte
		n, berr := toolid.MapBytes(&buf, name)
		if (berr == nil) != (err == nil) || (err == nil && string(buf[:n]) != id) {
			t.Fatalf("MapBytes(%q) = %q, %v; Map = %q, %v", name, buf[:n], berr, id, err)
		}

		d := snap.Decide(&toolgate.Call{AgentID: "app", Principal: "system:test", Tool: name, Args: map[string]any{}})
		switch d.Code {
		case toolgate.CodeMalformedCall:
			if err == nil {
				t.Fatalf("Decide(%q) = malformed_call, but Map gives %q", name, id)
			}
		case toolgate.CodeUnknownTool:
			if err != nil {
				t.Fatalf("Decide(%q) = unknown_tool, but Map refuses it: %v", name, err)
			}
		default:
			if err != nil || d.ToolID != id {
				t.Fatalf("Decide(%q) reached tool %q (%s: %s), but Map(name) = %q, %v", name, d.ToolID, d.Code, d.Reason, id, err)
			}
		}
	})
}
