package gateway_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolgate/toolgate"
	"github.com/toolgate/toolgate/gate"
)

// TestAnnouncementsNeverLowerRisk: what an upstream announces about its
// tools (annotations) can make a tool more dangerous, never less. Without a
// Tool document a readOnlyHint does not make a tool read (it stays write),
// destructiveHint makes it irreversible even over a Tool document that says
// read, only a Tool document makes an upstream tool read, and a class once
// claimed stays when a later announcement drops the claim.
func TestAnnouncementsNeverLowerRisk(t *testing.T) {
	yes, no := true, false
	srv := mcp.NewServer(&mcp.Implementation{Name: "ann", Version: "1"}, nil)
	add := func(name string, a *mcp.ToolAnnotations) {
		srv.AddTool(&mcp.Tool{Name: name, InputSchema: map[string]any{"type": "object"}, Annotations: a},
			func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
				return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "ok"}}}, nil
			})
	}
	add("claims_read", &mcp.ToolAnnotations{ReadOnlyHint: true})                             // no Tool document
	add("no_annotations", nil)                                                               // no Tool document
	add("reviewed_read", &mcp.ToolAnnotations{ReadOnlyHint: true})                           // Tool document: read
	add("destructive_over_doc", &mcp.ToolAnnotations{DestructiveHint: &yes})                 // Tool document: read
	add("contradictory", &mcp.ToolAnnotations{ReadOnlyHint: true, DestructiveHint: &yes})    // no Tool document
	add("becomes_harmless", &mcp.ToolAnnotations{DestructiveHint: &yes})                     // changes below
	add("becomes_dangerous", &mcp.ToolAnnotations{ReadOnlyHint: true, DestructiveHint: &no}) // changes below
	ts := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil))
	t.Cleanup(ts.Close)

	dir := t.TempDir()
	bundle := fmt.Sprintf(`
- {kind: Upstream, name: ann, transport: streamable-http, url: %q}
- {kind: Tool, tool_id: tool:ann-reviewed-read, side_effect_class: read, source: {mcp_server: ann}}
- {kind: Tool, tool_id: tool:ann-destructive-over-doc, side_effect_class: read, source: {mcp_server: ann}}
- kind: Agent
  agent_id: a
  version: 1.0.0
  tool_permissions:
    - {tool_id: tool:ann-claims-read, side_effect_class: read, approval_tier: auto}
    - {tool_id: tool:ann-reviewed-read, side_effect_class: read, approval_tier: auto}
- {kind: RuntimePolicy, agent_id: a, deployment_mode: production, tool_authorization_policy: {active_tool_set: all}}
- {kind: Principal, principal_id: user:p, grants: [{resource: tool, action: invoke, scope: all}]}
`, ts.URL)
	if err := os.WriteFile(filepath.Join(dir, "bundle.yaml"), []byte(bundle), 0o644); err != nil {
		t.Fatal(err)
	}
	e := &idEnv{bundle: dir, logs: &lockedBuffer{}}
	g := e.start(t)

	class := func(id string) (toolgate.SideEffectClass, bool) {
		tool, ok := g.gw.Gate.Snapshot().Tool(id)
		return tool.SideEffectClass, ok
	}
	waitClass := func(id string, want toolgate.SideEffectClass) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			got, ok := class(id)
			if ok && got == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: class %v (in catalog %v), want %v", id, got, ok, want)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	for id, want := range map[string]toolgate.SideEffectClass{
		"tool:ann-claims-read":          toolgate.SideEffectWrite,
		"tool:ann-no-annotations":       toolgate.SideEffectWrite,
		"tool:ann-reviewed-read":        toolgate.SideEffectRead,
		"tool:ann-destructive-over-doc": toolgate.SideEffectIrreversible,
		"tool:ann-contradictory":        toolgate.SideEffectIrreversible,
		"tool:ann-becomes-harmless":     toolgate.SideEffectIrreversible,
		"tool:ann-becomes-dangerous":    toolgate.SideEffectWrite,
	} {
		waitClass(id, want)
	}
	// The ceiling entry says read for claims_read: the tool's own class
	// (write) applies, so the MCP write rule asks for approval.
	out := g.gw.Gate.Decide(context.Background(), gateRequest("user:p", "a", "ann_claims_read"))
	if out.Decision.Verdict != toolgate.RequireApproval || out.Decision.SideEffectClass != toolgate.SideEffectWrite {
		t.Errorf("claims_read: %+v; want require_approval as write", out.Decision)
	}
	out = g.gw.Gate.Decide(context.Background(), gateRequest("user:p", "a", "ann_reviewed_read"))
	if out.Decision.Verdict != toolgate.Allow {
		t.Errorf("reviewed_read (a Tool document says read): %+v; want allow", out.Decision)
	}

	// Later announcements: dropping destructiveHint does not lower the
	// class; adding it raises it.
	add("becomes_harmless", &mcp.ToolAnnotations{ReadOnlyHint: true})
	add("becomes_dangerous", &mcp.ToolAnnotations{DestructiveHint: &yes})
	waitClass("tool:ann-becomes-dangerous", toolgate.SideEffectIrreversible)
	if got, _ := class("tool:ann-becomes-harmless"); got != toolgate.SideEffectIrreversible {
		t.Errorf("becomes_harmless after dropping destructiveHint: %v, want irreversible (a claim stays)", got)
	}
}

func gateRequest(principal, agent, tool string) gate.Request {
	return gate.Request{Identity: gate.Identity{Principal: principal, AgentID: agent}, Tool: tool, Args: []byte(`{}`), Via: "test"}
}
