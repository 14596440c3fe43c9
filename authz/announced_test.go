package authz_test

import (
	"strings"
	"testing"

	"github.com/toolgate/toolgate"
	"github.com/toolgate/toolgate/authz"
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
