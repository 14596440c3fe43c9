package gateway_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/toolgate/toolgate"
	"github.com/toolgate/toolgate/audit"
	"github.com/toolgate/toolgate/gate"
	"github.com/toolgate/toolgate/internal/testenv"
)

const goevKey = "tg-test-goev"

// goServerBundle fronts the Go SDK's conformance server over stateful
// Streamable HTTP with a narrow ceiling.
const goServerBundle = `
- {kind: Upstream, name: goev, transport: streamable-http, url: %q}
# The Go server announces no annotations (so: write, careful); these are reads.
- {kind: Tool, tool_id: tool:goev-test-simple-text, side_effect_class: read, source: {mcp_server: goev}}
- {kind: Tool, tool_id: tool:goev-test-image-content, side_effect_class: read, source: {mcp_server: goev}}
- kind: Agent
  agent_id: go-agent
  version: 1.0.0
  runtime_engine: mcp-client
  tool_permissions:
    - {tool_id: tool:goev-test-simple-text, side_effect_class: read, approval_tier: auto}
    - {tool_id: tool:goev-test-image-content, side_effect_class: read, approval_tier: auto}
    - {tool_id: tool:goev-test-tool-with-progress, side_effect_class: write, approval_tier: hitl}
- kind: RuntimePolicy
  agent_id: go-agent
  deployment_mode: production
  tool_authorization_policy: {active_tool_set: all}
- kind: ToolPolicy
  name: no-flags
  conditions:
    - {tools: [tool:goev-test-simple-text], when: '!has(args.debug)', reason: debug output is off}
- kind: Principal
  principal_id: user:go
  grants: [{resource: tool, action: invoke, scope: all}]
- kind: Credential
  name: go
  api_key_sha256: %x
  principal: user:go
  agent_id: go-agent
`

// TestGatewayGoConformanceServer: the same checklist as for the npm
// servers, against the Go SDK's conformance server.
func TestGatewayGoConformanceServer(t *testing.T) {
	srv := testenv.StartEverythingServer(t, "")
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "bundle.yaml"), []byte(fmt.Sprintf(goServerBundle, srv.URL, sha256sum(goevKey))), 0o644); err != nil {
		t.Fatal(err)
	}
	g := startGateway(t, dir)
	cs := connect(t, g.url, goevKey)
	if diff := cmp.Diff([]string{"goev_test_image_content", "goev_test_simple_text", "goev_test_tool_with_progress"}, listNames(t, cs, 3)); diff != "" {
		t.Errorf("tools (-want +got):\n%s", diff)
	}
	res, err := call(t, cs, "goev_test_simple_text", map[string]any{})
	if err != nil || res.IsError || text(res) == "" {
		t.Fatalf("allowed call: %v %v", err, res)
	}
	_, errHidden := call(t, cs, "goev_test_error_handling", map[string]any{})
	if e := rpcErr(t, errHidden); e.Message != `unknown tool "goev_test_error_handling"` {
		t.Errorf("hidden: %v", e)
	}
	res, err = call(t, cs, "goev_test_simple_text", map[string]any{"debug": true})
	if err != nil || !res.IsError || structured(t, res)["code"] != "condition_failed" {
		t.Errorf("argument-level deny: %v %v", err, res)
	}
	res, err = call(t, cs, "goev_test_tool_with_progress", map[string]any{})
	if err != nil || !res.IsError || structured(t, res)["code"] != "approval_required" {
		t.Errorf("approval: %v %v", err, res)
	}
	if code, _ := post(t, g.url, "wrong", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`)); code != 401 {
		t.Errorf("wrong key: %d", code)
	}
	if code, _ := post(t, g.url, goevKey, strings.NewReader(`[{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"goev_test_simple_text","arguments":{}}}]`)); code != 400 {
		t.Errorf("batch: %d", code)
	}
	ctx := context.Background()
	g.gw.Rec.Flush(ctx)
	if rep, err := audit.Verify(ctx, g.gw.Store); err != nil || !rep.OK {
		t.Fatalf("verify: %+v %v", rep, err)
	}
}

// TestCeilingBelowAnnouncedClass: a ceiling entry that declares a lower
// side_effect_class than an upstream tool announces (no Tool document) is
// reported once the upstream is connected, and the tool's own class
// applies: the Go conformance server announces no annotations, so write,
// and a write MCP tool needs approval by default.
func TestCeilingBelowAnnouncedClass(t *testing.T) {
	ev := testenv.StartEverythingServer(t, "")
	dir := t.TempDir()
	bundle := fmt.Sprintf(`
- {kind: Upstream, name: ev, transport: streamable-http, url: %q}
- kind: Agent
  agent_id: a
  version: 1.0.0
  tool_permissions:
    - {tool_id: tool:ev-test-simple-text, side_effect_class: read, approval_tier: auto}
    - {tool_id: tool:ev-test-image-content, side_effect_class: write, approval_tier: auto}
- {kind: RuntimePolicy, agent_id: a, deployment_mode: production, tool_authorization_policy: {active_tool_set: all}}
- {kind: Principal, principal_id: user:p, grants: [{resource: tool, action: invoke, scope: all}]}
- {kind: Settings, anonymous: {principal: user:p, agent_id: a}}
`, ev.URL)
	if err := os.WriteFile(filepath.Join(dir, "bundle.yaml"), []byte(bundle), 0o644); err != nil {
		t.Fatal(err)
	}
	logs := &lockedBuffer{}
	e := &idEnv{bundle: dir, logs: logs}
	g := e.start(t)
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(logs.String(), "ceiling entries below the class the upstream announces") {
		if time.Now().After(deadline) {
			t.Fatalf("no warning in the log:\n%s", logs)
		}
		time.Sleep(50 * time.Millisecond)
	}
	line := ""
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, "ceiling entries below") {
			line = l
		}
	}
	if !strings.Contains(line, "tool:ev-test-simple-text declares read, the tool is write") || strings.Contains(line, "image-content") {
		t.Errorf("warning %q", line)
	}
	out := g.gw.Gate.Decide(context.Background(), gate.Request{Identity: gate.Identity{Principal: "user:p", AgentID: "a"},
		Tool: "ev_test_simple_text", Args: json.RawMessage(`{}`), Via: "test"})
	if out.Decision.SideEffectClass != toolgate.SideEffectWrite || out.Decision.Verdict != toolgate.RequireApproval {
		t.Errorf("decision %+v, want the tool's own class write (approval required)", out.Decision)
	}
}
