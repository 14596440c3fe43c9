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
