package gateway_test

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	_ "modernc.org/sqlite"

	"github.com/toolgate/toolgate/audit"
	"github.com/toolgate/toolgate/gateway"
	"github.com/toolgate/toolgate/internal/testenv"
)

const evKey = "tg-test-everything"

// everythingBundle fronts @modelcontextprotocol/server-everything (stdio) and
// a server that never answers tools/call "hang".
const everythingBundle = `
- {kind: Upstream, name: everything, transport: stdio, command: node, args: [%q, stdio], call_timeout: 20s}
- {kind: Upstream, name: hang, transport: stdio, command: node, args: [%q], call_timeout: 2s}
# hang-server announces no annotations (so: write); these say read.
- {kind: Tool, tool_id: tool:hang-hang, side_effect_class: read, source: {mcp_server: hang}}
- {kind: Tool, tool_id: tool:hang-echo, side_effect_class: read, source: {mcp_server: hang}}
# One attempt only: the upstream-killed-mid-call case shows the call failing,
# not a retry racing the restart (retries: TestRetriesThroughGateway).
- {kind: Tool, tool_id: tool:everything-trigger-long-running-operation, side_effect_class: read, source: {mcp_server: everything}, retry: {max_attempts: 1}}
# server-everything's readOnlyHint does not make a tool read: the bundle does.
- {kind: Tool, tool_id: tool:everything-echo, side_effect_class: read, source: {mcp_server: everything}}
- {kind: Tool, tool_id: tool:everything-get-sum, side_effect_class: read, source: {mcp_server: everything}}
- kind: Agent
  agent_id: ev-agent
  version: 1.0.0
  runtime_engine: mcp-client
  tool_permissions:
    - {tool_id: tool:everything-echo, side_effect_class: read, approval_tier: auto}
    - {tool_id: tool:everything-get-sum, side_effect_class: read, approval_tier: auto}
    - {tool_id: tool:everything-trigger-long-running-operation, side_effect_class: read, approval_tier: auto}
    - {tool_id: tool:everything-toggle-simulated-logging, side_effect_class: write, approval_tier: auto}
    - {tool_id: tool:hang-hang, side_effect_class: read, approval_tier: auto}
    - {tool_id: tool:hang-echo, side_effect_class: read, approval_tier: auto}
- kind: RuntimePolicy
  agent_id: ev-agent
  deployment_mode: production
  tool_authorization_policy: {active_tool_set: all}
- kind: ToolPolicy
  name: small-sums
  conditions:
    - {tools: [tool:everything-get-sum], when: 'args.a < 1000', reason: sums stay small}
- kind: Principal
  principal_id: user:ev
  grants: [{resource: tool, action: invoke, scope: all}]
- kind: Credential
  name: ev
  api_key_sha256: %s
  principal: user:ev
  agent_id: ev-agent
`

func everythingGateway(t *testing.T) *running {
	t.Helper()
	dir := t.TempDir()
	sum := fmt.Sprintf("%x", sha256sum(evKey))
	body := fmt.Sprintf(everythingBundle, testenv.NodePackageBin(t, "server-everything"),
		filepath.Join(testenv.RepoRoot(t), "upstream", "testdata", "hang-server.js"), sum)
	if err := os.WriteFile(filepath.Join(dir, "bundle.yaml"), []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return startGateway(t, dir)
}

func post(t *testing.T, url, key string, body io.Reader) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("POST", url, body)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("post: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestGatewayEverything(t *testing.T) {
	g := everythingGateway(t)
	cs := connect(t, g.url, evKey)
	t.Run("filtered list", func(t *testing.T) {
		got := listNames(t, cs, 6)
		want := []string{"everything_echo", "everything_get-sum", "everything_toggle-simulated-logging",
			"everything_trigger-long-running-operation", "hang_echo", "hang_hang"}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("tools (-want +got):\n%s", diff)
		}
	})
	t.Run("allowed call", func(t *testing.T) {
		res, err := call(t, cs, "everything_echo", map[string]any{"message": "hi there"})
		if err != nil || res.IsError || !strings.Contains(text(res), "hi there") {
			t.Fatalf("echo: %v %v", err, res)
		}
	})
	t.Run("hidden like unknown", func(t *testing.T) {
		_, err := call(t, cs, "everything_get-env", map[string]any{})
		if e := rpcErr(t, err); e.Message != `unknown tool "everything_get-env"` {
			t.Errorf("got %v", e)
		}
	})
	t.Run("argument-level deny", func(t *testing.T) {
		res, err := call(t, cs, "everything_get-sum", map[string]any{"a": 5000, "b": 1})
		if err != nil || !res.IsError || structured(t, res)["code"] != "condition_failed" {
			t.Fatalf("got %v %v", err, res)
		}
		res, err = call(t, cs, "everything_get-sum", map[string]any{"a": 2, "b": 3})
		if err != nil || res.IsError || !strings.Contains(text(res), "5") {
			t.Fatalf("small sum: %v %v", err, res)
		}
	})
	t.Run("approval required", func(t *testing.T) {
		res, err := call(t, cs, "everything_toggle-simulated-logging", map[string]any{})
		if err != nil || !res.IsError || structured(t, res)["code"] != "approval_required" {
			t.Fatalf("got %v %v", err, res)
		}
	})
	t.Run("401", func(t *testing.T) {
		if code, _ := post(t, g.url, "", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`)); code != 401 {
			t.Errorf("status %d", code)
		}
	})
	t.Run("batch refused", func(t *testing.T) {
		code, body := post(t, g.url, evKey, strings.NewReader(`[{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"everything_echo","arguments":{"message":"x"}}}]`))
		if code != 400 || !strings.Contains(body, "batches are refused") {
			t.Errorf("status %d body %s", code, body)
		}
	})
	t.Run("upstream that never answers times out", func(t *testing.T) {
		start := time.Now()
		res, err := call(t, cs, "hang_hang", map[string]any{"message": "x"})
		if err != nil || !res.IsError || !strings.Contains(text(res), "upstream hang failed") {
			t.Fatalf("got %v %v", err, res)
		}
		if time.Since(start) > 15*time.Second {
			t.Errorf("the call timeout was not applied")
		}
		if res, err := call(t, cs, "hang_echo", map[string]any{"message": "still up"}); err != nil || res.IsError {
			t.Fatalf("after the hang: %v %v", err, res)
		}
	})
	t.Run("upstream killed mid-call", func(t *testing.T) {
		var wg sync.WaitGroup
		wg.Add(1)
		var text0 string
		var isErr bool
		go func() {
			defer wg.Done()
			res, err := call(t, cs, "everything_trigger-long-running-operation", map[string]any{"duration": 6, "steps": 6})
			if err == nil {
				isErr, text0 = res.IsError, text(res)
			} else {
				isErr, text0 = true, err.Error()
			}
		}()
		time.Sleep(700 * time.Millisecond)
		pid := 0
		for _, s := range g.gw.Ups.Status() {
			if s.Name == "everything" {
				pid = s.PID
			}
		}
		if pid == 0 {
			t.Fatal("no pid for the everything upstream")
		}
		syscall.Kill(pid, syscall.SIGKILL)
		wg.Wait()
		if !isErr {
			t.Fatalf("a call whose upstream died succeeded: %s", text0)
		}
		// The gateway restarts the upstream and keeps serving.
		deadline := time.Now().Add(30 * time.Second)
		for {
			res, err := call(t, cs, "everything_echo", map[string]any{"message": "back"})
			if err == nil && !res.IsError {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the upstream did not come back: %v %v", err, res)
			}
			time.Sleep(200 * time.Millisecond)
		}
	})
	t.Run("50 MB body", func(t *testing.T) {
		big := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"everything_echo","arguments":{"message":"` + strings.Repeat("x", 50<<20) + `"}}}`
		if code, _ := post(t, g.url, evKey, strings.NewReader(big)); code != http.StatusRequestEntityTooLarge {
			t.Errorf("status %d, want 413", code)
		}
	})
	t.Run("malformed JSON-RPC", func(t *testing.T) {
		for _, body := range []string{`{not json`, `{"jsonrpc":"2.0","id":1}`, `"just a string"`, ``} {
			code, _ := post(t, g.url, evKey, strings.NewReader(body))
			if code < 400 || code >= 500 {
				t.Errorf("body %q: status %d, want 4xx", body, code)
			}
		}
		if res, err := call(t, cs, "everything_echo", map[string]any{"message": "alive"}); err != nil || res.IsError {
			t.Fatalf("gateway down after bad input: %v %v", err, res)
		}
	})
	t.Run("audit store unwritable", func(t *testing.T) {
		db, err := sql.Open("sqlite", filepath.Join(g.data, gateway.DBFile)+"?_busy_timeout=5000")
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		if _, err := db.Exec(`CREATE TRIGGER fail_inserts BEFORE INSERT ON audit_events BEGIN SELECT RAISE(ABORT, 'simulated disk failure'); END`); err != nil {
			t.Fatal(err)
		}
		res, err := call(t, cs, "everything_echo", map[string]any{"message": "must not run unrecorded"})
		if err != nil || !res.IsError || structured(t, res)["code"] != "internal_error" {
			t.Fatalf("a call ran while the audit log could not record it: %v %v", err, res)
		}
		resp, err := http.Get(strings.TrimSuffix(g.url, "/mcp") + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 503 {
			t.Errorf("readyz %d while the store fails, want 503", resp.StatusCode)
		}
		if _, err := db.Exec(`DROP TRIGGER fail_inserts`); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := g.gw.Rec.Flush(ctx); err != nil {
			t.Fatalf("flush after recovery: %v", err)
		}
		evs, _ := audit.ReadEvents(ctx, g.gw.Store, 1, 100000)
		found := false
		for _, e := range evs {
			if e.Code == "internal_error" && e.ToolName == "everything_echo" {
				found = true
			}
		}
		if !found {
			t.Error("the refusal during the outage was lost from the audit log")
		}
		if rep, err := audit.Verify(ctx, g.gw.Store); err != nil || !rep.OK {
			t.Fatalf("verify: %+v %v", rep, err)
		}
	})
}

func sha256sum(s string) []byte {
	h := sha256.Sum256([]byte(s))
	return h[:]
}

// TestPassThroughGating: resources and prompts of an upstream reach only
// clients with at least one of its tools disclosed.
func TestPassThroughGating(t *testing.T) {
	dir := t.TempDir()
	body := fmt.Sprintf(everythingBundle, testenv.NodePackageBin(t, "server-everything"),
		filepath.Join(testenv.RepoRoot(t), "upstream", "testdata", "hang-server.js"), fmt.Sprintf("%x", sha256sum(evKey)))
	body += fmt.Sprintf(`
- kind: Agent
  agent_id: hang-only
  version: 1.0.0
  runtime_engine: mcp-client
  tool_permissions:
    - {tool_id: tool:hang-echo, side_effect_class: read, approval_tier: auto}
- kind: RuntimePolicy
  agent_id: hang-only
  deployment_mode: production
  tool_authorization_policy: {active_tool_set: all}
- kind: Credential
  name: hang-only
  api_key_sha256: %x
  principal: user:ev
  agent_id: hang-only
`, sha256sum("tg-test-hang-only"))
	if err := os.WriteFile(filepath.Join(dir, "bundle.yaml"), []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	g := startGateway(t, dir)
	ev := connect(t, g.url, evKey)
	listNames(t, ev, 6)
	other := connect(t, g.url, "tg-test-hang-only")
	listNames(t, other, 1)
	ctx := context.Background()
	var evRes *mcp.ListResourcesResult
	for i := 0; i < 100; i++ {
		r, err := ev.ListResources(ctx, nil)
		if err == nil && len(r.Resources) > 0 {
			evRes = r
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if evRes == nil {
		t.Fatal("the everything agent sees no resources")
	}
	if r, err := other.ListResources(ctx, nil); err != nil || len(r.Resources) != 0 {
		t.Errorf("an agent without everything tools lists its resources: %v %v", err, r)
	}
	if _, err := other.ReadResource(ctx, &mcp.ReadResourceParams{URI: evRes.Resources[0].URI}); err == nil {
		t.Error("an agent without everything tools reads its resource")
	}
	if _, err := ev.ReadResource(ctx, &mcp.ReadResourceParams{URI: evRes.Resources[0].URI}); err != nil {
		t.Errorf("the everything agent cannot read its resource: %v", err)
	}
	if r, err := other.ListPrompts(ctx, nil); err != nil || len(r.Prompts) != 0 {
		t.Errorf("an agent without everything tools lists its prompts: %v %v", err, r)
	}
}
