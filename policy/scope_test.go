package policy_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/toolgate/toolgate/policy"
)

func TestNameCovers(t *testing.T) {
	cases := []struct {
		name         string
		scope, name2 string
		want         bool
	}{
		{"same name", "vala.datasets", "vala.datasets", true},
		{"name below", "vala.datasets", "vala.datasets.tickets", true},
		{"two levels below", "vala", "vala.datasets.tickets", true},
		{"sibling with the same prefix", "vala.datasets", "vala.datasets2", false},
		{"name above", "vala.datasets.tickets", "vala.datasets", false},
		{"other name", "vala.billing", "vala.datasets", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := policy.NameCovers(c.scope, c.name2); got != c.want {
				t.Errorf("NameCovers(%q, %q) = %v, want %v", c.scope, c.name2, got, c.want)
			}
		})
	}
}

func TestScopeCovers(t *testing.T) {
	all := policy.Scope{All: true}
	tool := func(n string) policy.Scope { return policy.Scope{Tool: n} }
	name := func(n string) policy.Scope { return policy.Scope{Name: n} }
	cases := []struct {
		name         string
		outer, inner policy.Scope
		want         bool
	}{
		{"all covers all", all, all, true},
		{"all covers a tool", all, tool("fs_read"), true},
		{"a tool does not cover all", tool("fs_read"), all, false},
		{"a tool covers another spelling of itself", tool("fs.read"), tool("tool:fs-read"), true},
		{"a tool does not cover another tool", tool("fs_read"), tool("fs_search"), false},
		{"a malformed tool covers nothing", tool("FS_READ"), tool("FS_READ"), false},
		{"a name covers a name below", name("vala"), name("vala.datasets"), true},
		{"a name does not cover a name above", name("vala.datasets"), name("vala"), false},
		{"a name does not cover a tool", name("fs"), tool("fs_read"), false},
		{"the empty scope covers nothing", policy.Scope{}, policy.Scope{}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := policy.ScopeCovers(c.outer, c.inner); got != c.want {
				t.Errorf("ScopeCovers(%s, %s) = %v, want %v", c.outer, c.inner, got, c.want)
			}
		})
	}
}

func TestGlobs(t *testing.T) {
	cases := []struct {
		name, glob, id string
		valid, match   bool
	}{
		{"star in the middle", "tool:*-delete-*", "tool:github-delete-repo", true, true},
		{"star misses", "tool:*-delete-*", "tool:github-list-issues", true, false},
		{"prefix", "tool:github-*", "tool:github-list-issues", true, true},
		{"question mark", "tool:fs-rea?", "tool:fs-read", true, true},
		{"class", "tool:fs-[rw]*", "tool:fs-write", true, true},
		{"exact", "tool:fs-read", "tool:fs-read", true, true},
		{"not over tool ids", "*-delete-*", "tool:github-delete-repo", false, false},
		{"bad pattern", "tool:[", "tool:[", false, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if err := policy.ValidGlob(c.glob); (err == nil) != c.valid {
				t.Errorf("ValidGlob(%q) = %v, want valid %v", c.glob, err, c.valid)
			}
			if c.valid {
				if got := policy.GlobMatch(c.glob, c.id); got != c.match {
					t.Errorf("GlobMatch(%q, %q) = %v, want %v", c.glob, c.id, got, c.match)
				}
			}
		})
	}
}

// TestDecodeShorthands pins the short forms the bundle accepts.
func TestDecodeShorthands(t *testing.T) {
	b := &policy.Bundle{}
	b.AddYAML("short.yaml", []byte(`
- kind: Principal
  principal_id: user:a
  grants:
    - {resource: tool, action: invoke, scope: all}
    - {resource: tool, action: invoke, scope: "*"}
    - {resource: tool, action: invoke, scope: {tool: fs_read}}
    - {resource: sql_table, action: read, scope: {name: vala.datasets}}
- kind: ToolPolicy
  name: p
  escalation_rules:
    - tool:fs-write
    - {tools: [tool:fs-delete], when: 'args.force'}
- {kind: Tool, tool_id: tool:fs-read, side_effect_class: read, timeout: 30s, retry: {max_attempts: 3, initial_backoff: 100ms}}
- {kind: Tool, tool_id: tool:fs-write, side_effect_class: write}
- {kind: Tool, tool_id: tool:fs-delete, side_effect_class: irreversible}
- kind: Agent
  agent_id: worker
  tool_permissions:
    - {tool_id: tool:fs-write, side_effect_class: write}
    - {tool_id: tool:fs-delete, side_effect_class: irreversible}
`))
	if rep := b.Validate(nil); len(rep.Errors) > 0 {
		t.Fatalf("errors: %v", rep.Errors)
	}
	var scopes []string
	for _, g := range b.Principals[0].Grants {
		scopes = append(scopes, g.Scope.String())
	}
	if diff := cmp.Diff([]string{"all", "all", "{tool: fs_read}", "{name: vala.datasets}"}, scopes); diff != "" {
		t.Errorf("scopes (-want +got):\n%s", diff)
	}
	var rules [][]string
	var whens []string
	for _, r := range b.ToolPolicies[0].EscalationRules {
		rules = append(rules, r.Tools)
		whens = append(whens, r.When)
	}
	if diff := cmp.Diff([][]string{{"tool:fs-write"}, {"tool:fs-delete"}}, rules); diff != "" {
		t.Errorf("escalation rules (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"", "args.force"}, whens); diff != "" {
		t.Errorf("escalation conditions (-want +got):\n%s", diff)
	}
	tl := b.Tools[0]
	if tl.Timeout.D().String() != "30s" || tl.Retry.MaxAttempts != 3 || tl.Retry.InitialBackoff.D().String() != "100ms" {
		t.Errorf("timeout %v, retry %+v", tl.Timeout.D(), tl.Retry)
	}
	if tl.Pos.File != "short.yaml" || tl.Pos.Line != 14 {
		t.Errorf("Tool position = %s, want short.yaml:14", tl.Pos.At())
	}
	if g := b.Principals[0].Grants[2]; g.Pos.Line != 7 {
		t.Errorf("grant position = %s, want short.yaml:7", g.Pos.At())
	}
}
