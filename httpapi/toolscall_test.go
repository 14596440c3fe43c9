package httpapi_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolgate/toolgate"
	"github.com/toolgate/toolgate/adapter/builtins"
	"github.com/toolgate/toolgate/audit"
	"github.com/toolgate/toolgate/authz"
	"github.com/toolgate/toolgate/gate"
	"github.com/toolgate/toolgate/httpapi"
	"github.com/toolgate/toolgate/metrics"
	"github.com/toolgate/toolgate/policy"
	"github.com/toolgate/toolgate/store/sqlite"
)

// callBundle serves the example shop database (built from
// examples/bundle/shop.sql) to an analyst who may read orders only.
const callBundle = `
- {kind: Database, name: shop, driver: sqlite, path: shop.db, init_sql: %q}
- {kind: Tool, name: sql.query, side_effect_class: read, source: {builtin: sql.query}}
- {kind: Tool, name: fs.search, side_effect_class: read, source: {builtin: fs.search}}
- kind: Agent
  agent_id: analyst
  version: 1.0.0
  workspace: ws
  tool_permissions:
    - {tool_id: tool:sql-query, side_effect_class: read, approval_tier: auto}
    - {tool_id: tool:fs-search, side_effect_class: read, approval_tier: hitl}
- {kind: RuntimePolicy, agent_id: analyst, deployment_mode: production, tool_authorization_policy: {active_tool_set: all}}
- kind: Principal
  principal_id: user:analyst
  grants:
    - {resource: tool, action: invoke, scope: {tool: sql.query}}
    - {resource: tool, action: invoke, scope: {tool: fs.search}}
    - {resource: sql_table, action: read, scope: {name: shop.orders}}
- {kind: Principal, principal_id: user:lead, grants: [{resource: approval, action: decide, scope: all}]}
`

func newCallEnv(t *testing.T) *env {
	t.Helper()
	dir := t.TempDir()
	os.Mkdir(filepath.Join(dir, "ws"), 0o755)
	sqlPath, _ := filepath.Abs(filepath.Join(bundleDir, "shop.sql"))
	os.WriteFile(filepath.Join(dir, "bundle.yaml"), []byte(fmt.Sprintf(callBundle, sqlPath)), 0o644)
	b, err := policy.LoadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	snap, _, err := authz.Compile(b, nil)
	if err != nil {
		t.Fatal(err)
	}
	reg, err := builtins.Open(context.Background(), b, dir)
	if err != nil {
		t.Fatal(err)
	}
	st, err := sqlite.Open(filepath.Join(t.TempDir(), "toolgate.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, snap: snap, store: st, metrics: metrics.New(&metrics.Options{NoRuntimeCollectors: true})}
	e.rec = audit.NewRecorder(st, nil)
	e.g = gate.New(snap, &gate.Options{Recorder: e.rec, Approvals: st, AuditLog: st, Observer: e.metrics,
		Executor: &gate.Executor{Builtins: reg, BaseDir: dir}})
	e.srv = httptest.NewServer(httpapi.New(e.g, &httpapi.Options{Metrics: e.metrics.Handler(),
		Identify: func(r *http.Request) (gate.Identity, error) {
			if r.Header.Get("Authorization") != "Bearer analyst" {
				return gate.Identity{}, errors.New("unknown token")
			}
			return gate.Identity{Principal: "user:analyst", AgentID: "analyst"}, nil
		}}))
	t.Cleanup(func() {
		e.srv.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		e.rec.Close(ctx)
		st.Close()
		reg.Close()
	})
	return e
}

func texts(r *mcp.CallToolResult) string {
	if r == nil {
		return ""
	}
	var b strings.Builder
	for _, c := range r.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

func TestToolsCall(t *testing.T) {
	e := newCallEnv(t)
	query := func(q string) map[string]any {
		return map[string]any{"tool": "sql_query", "arguments": map[string]any{"query": q}}
	}
	for _, tc := range []struct {
		name       string
		body       any
		wantStatus int
		wantState  string // status field
		wantCode   string // decision code
		check      func(t *testing.T, r httpapi.ToolsCallResponse)
	}{
		{"allowed query returns rows", query("SELECT count(*), lower(status) FROM orders GROUP BY 2"), 200, "success", "ok",
			func(t *testing.T, r httpapi.ToolsCallResponse) {
				if !strings.Contains(texts(r.Result), "shipped") || r.Result.StructuredContent == nil || r.Result.IsError {
					t.Errorf("result %s %v", texts(r.Result), r.Result.StructuredContent)
				}
				x := r.ExecutionContext
				if x.Attempts != 1 || x.ReturnedBytes == 0 || len(x.OutputDigest) != 64 || x.ToolName != "sql_query" || x.Principal != "user:analyst" {
					t.Errorf("execution_context %+v", x)
				}
				if diff := cmp.Diff([]toolgate.Resource{{Type: "sql_table", Name: "shop.orders", Action: "read"}}, x.Resources); diff != "" {
					t.Errorf("resources (-want +got):\n%s", diff)
				}
			}},
		{"a subquery disguised as orders", query("SELECT * FROM (SELECT * FROM api_tokens) AS orders"), 403, "failure", "rbac_resource",
			func(t *testing.T, r httpapi.ToolsCallResponse) {
				if r.Result != nil || len(r.Errors) != 1 || !strings.Contains(r.Errors[0], "shop.api_tokens") || r.ExecutionContext.Attempts != 0 {
					t.Errorf("envelope %+v", r)
				}
			}},
		{"two statements", query("SELECT 1; DELETE FROM orders"), 403, "failure", "sql_not_read_only",
			func(t *testing.T, r httpapi.ToolsCallResponse) {
				if r.Decision.Layer != "resource" || !strings.Contains(r.Errors[0], "DELETE FROM orders") {
					t.Errorf("decision %+v", r.Decision)
				}
			}},
		{"the tool fails at run time", query("SELECT abs(-9223372036854775807 - 1) FROM orders"), 502, "failure", "ok",
			func(t *testing.T, r httpapi.ToolsCallResponse) {
				if r.Result == nil || !r.Result.IsError || !strings.Contains(r.Errors[0], "overflow") || r.ExecutionContext.Attempts != 1 {
					t.Errorf("envelope %+v / %s", r, texts(r.Result))
				}
			}},
		{"approval required", map[string]any{"tool": "fs_search", "arguments": map[string]any{"pattern": "**/*.md", "query": "x"}}, 202, "failure", "approval_required",
			func(t *testing.T, r httpapi.ToolsCallResponse) {
				if r.Decision.ApprovalID == "" || r.Result != nil {
					t.Errorf("envelope %+v", r)
				}
			}},
		{"unknown tool", map[string]any{"tool": "sql_drop", "correlation_id": "corr-1", "causation_id": "cause-1"}, 403, "failure", "unknown_tool",
			func(t *testing.T, r httpapi.ToolsCallResponse) {
				if r.ExecutionContext.CorrelationID != "corr-1" || r.ExecutionContext.CausationID != "cause-1" || r.Decision.CorrelationID != "corr-1" {
					t.Errorf("context %+v", r.ExecutionContext)
				}
			}},
		// A name the caller was not shown is answered like an unknown tool
		// (the audit log has malformed_call).
		{"malformed name", map[string]any{"tool": "SQL.Query", "arguments": map[string]any{}}, 403, "failure", "unknown_tool",
			func(t *testing.T, r httpapi.ToolsCallResponse) {
				if r.Decision.ToolID != "" || !strings.Contains(r.Decision.Reason, `"SQL.Query" is not a tool this caller can call`) {
					t.Errorf("decision %+v", r.Decision)
				}
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := e.do("POST", "/v1/tools/call", "analyst", tc.body)
			if r.status != tc.wantStatus {
				t.Fatalf("status %d, want %d: %s", r.status, tc.wantStatus, r.body)
			}
			got := decode[httpapi.ToolsCallResponse](t, r)
			if got.Status != tc.wantState || got.Decision.Code != tc.wantCode {
				t.Fatalf("status %q code %q, want %q %q: %s", got.Status, got.Decision.Code, tc.wantState, tc.wantCode, r.body)
			}
			if tc.check != nil {
				tc.check(t, got)
			}
		})
	}

	t.Run("the audit log records the run", func(t *testing.T) {
		var kinds []string
		for _, ev := range e.events() {
			if ev.ToolName == "sql_query" {
				kinds = append(kinds, ev.EventType+" "+ev.Code)
			}
		}
		want := []string{
			"agent.tool.authorized ok", "agent.tool.completed ok",
			"agent.tool.unauthorized rbac_resource",
			"agent.tool.unauthorized sql_not_read_only",
			"agent.tool.authorized ok", "agent.tool.failed execution_error",
		}
		if diff := cmp.Diff(want, kinds); diff != "" {
			t.Errorf("events (-want +got):\n%s", diff)
		}
	})
}

func TestToolsCallAfterApproval(t *testing.T) {
	e := newCallEnv(t)
	body := map[string]any{"tool": "fs_search", "arguments": map[string]any{"pattern": "**/*"}}
	r := e.do("POST", "/v1/tools/call", "analyst", body)
	first := decode[httpapi.ToolsCallResponse](t, r)
	if r.status != 202 || first.Decision.ApprovalID == "" {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	if _, err := e.g.DecideApproval(context.Background(), first.Decision.ApprovalID, true, "user:lead", "fine", "test"); err != nil {
		t.Fatal(err)
	}
	r = e.do("POST", "/v1/tools/call", "analyst", body)
	second := decode[httpapi.ToolsCallResponse](t, r)
	if r.status != 200 || second.Status != "success" || second.Decision.ApprovalID != first.Decision.ApprovalID || second.ExecutionContext.Attempts != 1 {
		t.Fatalf("after approval: status %d: %s", r.status, r.body)
	}
	// An approval is used once: the same call asks again.
	if r = e.do("POST", "/v1/tools/call", "analyst", body); r.status != 202 {
		t.Errorf("third call: status %d: %s", r.status, r.body)
	}
}

func TestToolsCallRequestErrors(t *testing.T) {
	e := newCallEnv(t)
	for _, tc := range []struct {
		name       string
		token      string
		body       any
		wantStatus int
		wantCode   string
	}{
		{"no credential", "", map[string]any{"tool": "sql_query"}, 401, "unauthenticated"},
		{"another principal in the body", "analyst", map[string]any{"tool": "sql_query", "principal": "user:root"}, 403, "identity_mismatch"},
		{"no tool", "analyst", map[string]any{"arguments": map[string]any{}}, 400, "bad_request"},
		{"unknown field", "analyst", map[string]any{"tool": "sql_query", "args": map[string]any{}}, 400, "unknown_field"},
		{"not JSON", "analyst", "{", 400, "malformed_json"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := e.do("POST", "/v1/tools/call", tc.token, tc.body)
			if r.status != tc.wantStatus || errorOf(t, r).Code != tc.wantCode {
				t.Errorf("status %d body %s, want %d %s", r.status, r.body, tc.wantStatus, tc.wantCode)
			}
		})
	}
	if r := e.do("GET", "/v1/tools/call", "analyst", nil); r.status != 405 {
		t.Errorf("GET: status %d", r.status)
	}
}
