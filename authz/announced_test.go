package authz_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolgate/toolgate"
	"github.com/toolgate/toolgate/adapter/mcptool"
	"github.com/toolgate/toolgate/authz"
	"github.com/toolgate/toolgate/policy"
)

// TestAnnouncedIDsAreOneTool: an announced tool whose id the bundle
// declares with another source (a built-in, an HTTP tool, an A2A agent,
// another upstream) is refused, never merged into that tool; one declared
// for its own upstream (or with no source) is refined by its document.
func TestAnnouncedIDsAreOneTool(t *testing.T) {
	src := `
- {kind: Upstream, name: up, transport: streamable-http, url: "http://127.0.0.1:1/mcp"}
- {kind: Upstream, name: other, transport: streamable-http, url: "http://127.0.0.1:2/mcp"}
- {kind: Tool, tool_id: tool:up-read, side_effect_class: read, source: {builtin: fs.read}}
- {kind: Tool, tool_id: tool:up-fetch, side_effect_class: read, source: {http: "https://example.test/fetch"}}
- {kind: Tool, tool_id: tool:up-ask, side_effect_class: read, a2a_agent: partner}
- {kind: Tool, tool_id: tool:up-theirs, side_effect_class: read, source: {mcp_server: other}}
- {kind: Tool, tool_id: tool:up-mine, side_effect_class: read, source: {mcp_server: up}}
- {kind: Tool, tool_id: tool:up-declared, side_effect_class: read}
`
	b := bundleOf(t, src)
	ann := func(name string) authz.AnnouncedTool {
		return authz.AnnouncedTool{ID: "tool:up-" + name, Name: "up_" + name, MCPServer: "up", SideEffectClass: toolgate.SideEffectWrite}
	}
	announced := []authz.AnnouncedTool{ann("read"), ann("fetch"), ann("ask"), ann("theirs"), ann("mine"), ann("declared"), ann("new")}
	ok, problems := authz.CheckAnnounced(b, announced)
	var kept []string
	for _, a := range ok {
		kept = append(kept, a.ID)
	}
	if got, want := strings.Join(kept, " "), "tool:up-mine tool:up-declared tool:up-new"; got != want {
		t.Errorf("kept %q, want %q", got, want)
	}
	if len(problems) != 4 {
		t.Errorf("problems %q, want one per refused tool", problems)
	}
	snap, _, err := authz.Compile(b, &authz.Options{Announced: announced})
	if err != nil {
		t.Fatal(err)
	}
	for id, wantServer := range map[string]string{"tool:up-read": "", "tool:up-fetch": "", "tool:up-ask": "", "tool:up-theirs": "other",
		"tool:up-mine": "up", "tool:up-declared": "up", "tool:up-new": "up"} {
		tool, found := snap.Tool(id)
		if !found || tool.MCPServer != wantServer {
			t.Errorf("%s: found %v, mcp server %q; want %q", id, found, tool.MCPServer, wantServer)
		}
	}
	if tool, _ := snap.Tool("tool:up-read"); tool.Builtin != "fs.read" {
		t.Errorf("tool:up-read is no longer the built-in: %+v", tool)
	}
}

// TestAnnouncedNeverControlFlow: an upstream that announces the id of a
// declared control-flow tool (control_flow: true, or named in
// Settings.control_flow_tools) is refused: merged, its tool would reach the
// upstream while never gated, and make the upstream's resources and
// prompts reachable in the default without any grant.
func TestAnnouncedNeverControlFlow(t *testing.T) {
	src := `
- {kind: Upstream, name: ask, transport: streamable-http, url: "http://127.0.0.1:1/mcp"}
- {kind: Tool, tool_id: tool:ask-user, side_effect_class: none, control_flow: true}
- {kind: Tool, tool_id: tool:ask-done, side_effect_class: none}
- {kind: Settings, control_flow_tools: [tool:ask-done]}
- kind: Agent
  agent_id: a
  version: 1.0.0
  tool_permissions:
    - {tool_id: tool:ask-user, side_effect_class: none}
    - {tool_id: tool:ask-done, side_effect_class: none}
- {kind: RuntimePolicy, agent_id: a, deployment_mode: production, tool_authorization_policy: {active_tool_set: all}}
`
	b := bundleOf(t, src)
	announced := []authz.AnnouncedTool{
		{ID: "tool:ask-user", Name: "ask_user", MCPServer: "ask", SideEffectClass: toolgate.SideEffectWrite},
		{ID: "tool:ask-done", Name: "ask_done", MCPServer: "ask", SideEffectClass: toolgate.SideEffectWrite},
	}
	if ok, problems := authz.CheckAnnounced(b, announced); len(ok) != 0 || len(problems) != 2 {
		t.Errorf("kept %v, problems %q; want both refused", ok, problems)
	}
	snap, _, err := authz.Compile(b, &authz.Options{Announced: announced})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"tool:ask-user", "tool:ask-done"} {
		if tool, _ := snap.Tool(id); tool.MCPServer != "" {
			t.Errorf("%s became upstream ask's tool", id)
		}
	}
	// Nobody holds a grant, yet control-flow tools are disclosed: they must
	// not make upstream ask's resources reachable.
	a := toolgate.Access{Kind: toolgate.AccessResourceRead, AgentID: "a", Principal: "user:nobody", Upstream: "ask", URI: "file:///secret"}
	if d := snap.DecideAccess(&a); d.Verdict != toolgate.Deny {
		t.Errorf("a control-flow tool made upstream ask reachable: %s %s", d.Verdict, d.Reason)
	}
}

// TestAnnouncedNamesNameOneTool (class "identifiers must be injective";
// review of issue 7, N10): the name the model sees for an upstream's tool
// (tool_prefix + announced name, as mcptool.Announced forms it) must not
// be a spelling of another tool's id — a built-in's, an HTTP tool's, a
// control-flow tool's, another upstream's declared tool's, or another tool
// of the same upstream — or it would shadow that tool's mirror in
// tools/list and make calls by that name ambiguous. Such a tool is refused
// when announced, with a reason; the others join the catalog.
func TestAnnouncedNamesNameOneTool(t *testing.T) {
	src := `
- {kind: Upstream, name: docs, transport: streamable-http, url: "http://127.0.0.1:1/mcp", tool_prefix: fs_}
- {kind: Upstream, name: files, transport: streamable-http, url: "http://127.0.0.1:2/mcp", tool_prefix: fs.}
- {kind: Upstream, name: sales, transport: streamable-http, url: "http://127.0.0.1:3/mcp", tool_prefix: crm_}
- {kind: Upstream, name: asker, transport: streamable-http, url: "http://127.0.0.1:4/mcp", tool_prefix: ask_}
- {kind: Upstream, name: xy, transport: streamable-http, url: "http://127.0.0.1:5/mcp", tool_prefix: xy_a_}
- {kind: Upstream, name: hr, transport: streamable-http, url: "http://127.0.0.1:6/mcp", tool_prefix: people_}
- {kind: Upstream, name: pay, transport: streamable-http, url: "http://127.0.0.1:7/mcp"}
- {kind: Tool, tool_id: tool:fs-read, side_effect_class: read, source: {builtin: fs.read}}
- {kind: Tool, tool_id: tool:crm-create-lead, side_effect_class: write, source: {http: "https://crm.example.test/leads"}}
- {kind: Tool, tool_id: tool:ask-user, side_effect_class: none, control_flow: true}
- {kind: Tool, tool_id: tool:people-payroll, side_effect_class: write, source: {mcp_server: pay}}
`
	b := bundleOf(t, src)
	cases := []struct {
		upstream, tool string
		refused        string // "" when accepted; else what the reason names
	}{
		{"docs", "read", "the built-in tool fs.read"},
		{"files", "read", "the built-in tool fs.read"},
		{"sales", "create_lead", "an HTTP tool"},
		{"sales", "create-lead", "an HTTP tool"},
		{"sales", "create.lead", "an HTTP tool"},
		{"asker", "user", "a control-flow tool"},
		{"hr", "payroll", "a tool of upstream pay"},
		{"xy", "b", "its own tool tool:xy-a-b"},
		{"xy", "a_b", ""}, // tool:xy-a-b, seen as xy_a_a_b
		{"docs", "find", ""},
		{"sales", "list_leads", ""},
		{"pay", "run", ""},
	}
	var announced []authz.AnnouncedTool
	for _, c := range cases {
		for _, u := range b.Upstreams {
			if u.Name == c.upstream {
				ok, problems := mcptool.Announced(u, []*mcp.Tool{{Name: c.tool}})
				if len(problems) > 0 {
					t.Fatalf("%s %s: %q", c.upstream, c.tool, problems)
				}
				announced = append(announced, ok...)
			}
		}
	}
	ok, problems := authz.CheckAnnounced(b, announced)
	kept := map[string]bool{}
	for _, a := range ok {
		kept[a.MCPServer+" "+a.Name] = true
	}
	for _, c := range cases {
		u := b.Upstreams[slices.IndexFunc(b.Upstreams, func(u *policy.Upstream) bool { return u.Name == c.upstream })]
		name := u.Prefix() + c.tool
		t.Run(c.upstream+" "+c.tool, func(t *testing.T) {
			if got := kept[c.upstream+" "+name]; got != (c.refused == "") {
				t.Errorf("%s (seen as %s) kept = %v, want %v; problems %q", c.tool, name, got, c.refused == "", problems)
			}
			if c.refused == "" {
				return
			}
			i := slices.IndexFunc(problems, func(p string) bool { return strings.Contains(p, fmt.Sprintf("%q", name)) })
			if i < 0 || !strings.Contains(problems[i], c.refused) || !strings.Contains(problems[i], "upstream "+c.upstream) {
				t.Errorf("no problem names %s of upstream %s as %s: %q", name, c.upstream, c.refused, problems)
			}
		})
	}
	// The catalog agrees: what was refused is not there, and the name
	// stays the other tool's.
	snap, _, err := authz.Compile(b, &authz.Options{Announced: announced})
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{"fs_read": "tool:fs-read", "fs.read": "tool:fs-read", "crm_create-lead": "tool:crm-create-lead",
		"people_payroll": "tool:people-payroll", "xy_a_b": "tool:xy-a-b", "tool:xy-b": "", "tool:docs-read": "", "xy_a_a_b": "tool:xy-a-b", "fs_find": "tool:docs-find"} {
		tool, found := snap.Lookup(name)
		if found != (want != "") || tool.ID != want {
			t.Errorf("Lookup(%s) = %s %v, want %q", name, tool.ID, found, want)
		}
	}
}
