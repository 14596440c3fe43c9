package cli_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolgate/toolgate/audit"
	"github.com/toolgate/toolgate/internal/cli"
	"github.com/toolgate/toolgate/internal/testenv"
	"github.com/toolgate/toolgate/store/sqlite"
)

// callFixture copies the example bundle (its YAML and shop.sql) to
// ROOT/bundle and makes ROOT/workspace, the analyst's ../workspace.
func callFixture(t *testing.T) (bundle, data string) {
	t.Helper()
	root := t.TempDir()
	bundle = filepath.Join(root, "bundle")
	os.MkdirAll(bundle, 0o755)
	for _, pat := range []string{"*.yaml", "*.sql"} {
		files, _ := filepath.Glob(filepath.Join(exampleBundle, pat))
		for _, f := range files {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			os.WriteFile(filepath.Join(bundle, filepath.Base(f)), b, 0o644)
		}
	}
	ws := filepath.Join(root, "workspace")
	os.MkdirAll(filepath.Join(ws, "notes"), 0o755)
	os.WriteFile(filepath.Join(ws, "notes", "meeting.md"), []byte("# Weekly sync\n"), 0o644)
	os.WriteFile(filepath.Join(ws, "secrets.env"), []byte("TOKEN=x\n"), 0o644)
	return bundle, filepath.Join(root, "data")
}

type callOut struct {
	Decision struct {
		Verdict    string `json:"verdict"`
		Code       string `json:"code"`
		Layer      string `json:"layer"`
		Reason     string `json:"reason"`
		ToolID     string `json:"tool_id"`
		ApprovalID string `json:"approval_id"`
	} `json:"decision"`
	Result        *mcp.CallToolResult `json:"result"`
	CorrelationID string              `json:"correlation_id"`
	Attempts      int                 `json:"attempts"`
	Error         string              `json:"error"`
}

func resultText(r *mcp.CallToolResult) string {
	if r == nil {
		return ""
	}
	var s []string
	for _, c := range r.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			s = append(s, tc.Text)
		}
	}
	return strings.Join(s, "\n")
}

func TestCall(t *testing.T) {
	bundle, data := callFixture(t)
	analyst := func(tool, args string) []string {
		return []string{"call", "--bundle", bundle, "--data", data, "--agent", "analyst", "--principal", "user:analyst",
			"--tool", tool, "--args", args, "-o", "json"}
	}
	for _, tc := range []struct {
		name     string
		args     []string
		wantExit int
		wantCode string
		check    func(t *testing.T, o callOut)
	}{
		{"allowed query runs", analyst("sql_query", `{"query": "SELECT count(*), lower(status) FROM orders GROUP BY 2"}`), cli.ExitOK, "ok",
			func(t *testing.T, o callOut) {
				if !strings.Contains(resultText(o.Result), "shipped") || o.Attempts != 1 || o.Result.IsError {
					t.Errorf("result %q attempts %d", resultText(o.Result), o.Attempts)
				}
			}},
		{"a CTE disguised as orders", analyst("sql_query", `{"query": "WITH orders AS (SELECT * FROM api_tokens) SELECT * FROM orders"}`), cli.ExitDenied, "rbac_resource",
			func(t *testing.T, o callOut) {
				if !strings.Contains(o.Decision.Reason, "shop.api_tokens") || o.Result != nil {
					t.Errorf("decision %+v result %v", o.Decision, o.Result)
				}
			}},
		{"a file in the workspace", analyst("fs.read", `{"path": "notes/meeting.md"}`), cli.ExitOK, "ok",
			func(t *testing.T, o callOut) {
				if !strings.Contains(resultText(o.Result), "Weekly sync") {
					t.Errorf("result %q", resultText(o.Result))
				}
			}},
		{"a path out of the workspace", analyst("fs_read", `{"path": "../bundle/agents.yaml"}`), cli.ExitDenied, "path_outside_workspace", nil},
		{"a condition on the arguments", analyst("fs_read", `{"path": "secrets.env"}`), cli.ExitDenied, "condition_failed", nil},
		{"not in the ceiling", analyst("sql_describe_table", `{"table": "orders"}`), cli.ExitDenied, "not_in_ceiling", nil},
		{"the tool fails", analyst("sql_query", `{"query": "SELECT abs(-9223372036854775807 - 1) FROM orders"}`), cli.ExitToolFail, "ok",
			func(t *testing.T, o callOut) {
				if !strings.Contains(o.Error, "overflow") || o.Result == nil || !o.Result.IsError {
					t.Errorf("error %q result %v", o.Error, o.Result)
				}
			}},
		{"approval required", []string{"call", "--bundle", bundle, "--data", data, "--agent", "triage", "--principal", "user:bob",
			"--tool", "payments_refund", "--args", `{"amount": 200}`, "-o", "json"}, cli.ExitApproval, "approval_required",
			func(t *testing.T, o callOut) {
				if o.Decision.ApprovalID == "" {
					t.Errorf("no approval id: %+v", o.Decision)
				}
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := runCLI(t, tc.args...)
			if r.code != tc.wantExit {
				t.Fatalf("exit %d, want %d\nstdout:\n%s\nstderr:\n%s", r.code, tc.wantExit, r.stdout, r.stderr)
			}
			var o callOut
			keys := decodeObject(t, r.stdout, &o)
			if o.Decision.Code != tc.wantCode {
				t.Errorf("code %q, want %q: %s", o.Decision.Code, tc.wantCode, r.stdout)
			}
			for _, k := range []string{"attempts", "correlation_id", "decision", "result"} {
				if !strings.Contains(strings.Join(keys, " "), k) {
					t.Errorf("no %q in %v", k, keys)
				}
			}
			if tc.check != nil {
				tc.check(t, o)
			}
		})
	}

	t.Run("every call is in the audit log, which verifies", func(t *testing.T) {
		if r := runCLI(t, "audit", "verify", "--data", data); r.code != cli.ExitOK {
			t.Fatalf("verify exit %d: %s%s", r.code, r.stdout, r.stderr)
		}
		st, err := sqlite.Open(filepath.Join(data, "toolgate.db"), nil)
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		evs, err := audit.ReadEvents(context.Background(), st, 1, 1000)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, e := range evs {
			if e.Details["via"] != "cli" {
				t.Errorf("event %d via %v", e.Seq, e.Details["via"])
			}
			got = append(got, e.EventType+" "+e.Code)
		}
		want := []string{
			"agent.tool.authorized ok", "agent.tool.completed ok",
			"agent.tool.unauthorized rbac_resource",
			"agent.tool.authorized ok", "agent.tool.completed ok",
			"agent.tool.unauthorized path_outside_workspace",
			"agent.tool.unauthorized condition_failed",
			"agent.tool.unauthorized not_in_ceiling",
			"agent.tool.authorized ok", "agent.tool.failed execution_error",
			"agent.tool.approval_requested approval_required",
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("events (-want +got):\n%s", diff)
		}
	})

	t.Run("text output", func(t *testing.T) {
		args := analyst("sql_query", `{"query": "SELECT id FROM orders WHERE id = 1"}`)
		r := runCLI(t, args[:len(args)-2]...)
		if r.code != cli.ExitOK || !strings.HasPrefix(r.stdout, "ALLOW tool:sql-query (ok)") || !strings.Contains(r.stdout, "ran in 1 attempt(s)") {
			t.Errorf("exit %d\n%s%s", r.code, r.stdout, r.stderr)
		}
	})
}

func TestCallUsage(t *testing.T) {
	bundle, _ := callFixture(t)
	for _, tc := range []struct {
		name     string
		args     []string
		wantExit int
		wantErr  string
	}{
		{"no agent", []string{"call", "--bundle", bundle, "--tool", "sql_query"}, cli.ExitUsage, "--agent and --tool are required"},
		{"no bundle", []string{"call", "--agent", "analyst", "--tool", "sql_query"}, cli.ExitUsage, "--bundle"},
		{"bad output", []string{"call", "--bundle", bundle, "--agent", "analyst", "--tool", "sql_query", "-o", "yaml"}, cli.ExitUsage, "-o"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := runCLI(t, tc.args...)
			if r.code != tc.wantExit || !strings.Contains(r.stderr, tc.wantErr) {
				t.Errorf("exit %d stderr %q; want %d mentioning %q", r.code, r.stderr, tc.wantExit, tc.wantErr)
			}
		})
	}
}

// TestCallUpstream runs an upstream tool: call starts only the upstream the
// tool belongs to.
func TestCallUpstream(t *testing.T) {
	dir := t.TempDir()
	hang := filepath.Join(testenv.RepoRoot(t), "upstream", "testdata", "hang-server.js")
	bundle := `
- {kind: Upstream, name: hang, transport: stdio, command: ` + testenv.NodeBin(t) + `, args: [` + hang + `]}
- {kind: Upstream, name: broken, transport: stdio, command: /nonexistent/server}
- {kind: Tool, tool_id: tool:hang-echo, side_effect_class: read, source: {mcp_server: hang}}
- kind: Agent
  agent_id: a
  version: 1.0.0
  tool_permissions: [{tool_id: tool:hang-echo, side_effect_class: read, approval_tier: auto}]
- {kind: RuntimePolicy, agent_id: a, deployment_mode: production, tool_authorization_policy: {active_tool_set: all}}
- {kind: Principal, principal_id: p, grants: [{resource: tool, action: invoke, scope: all}]}
`
	os.WriteFile(filepath.Join(dir, "bundle.yaml"), []byte(bundle), 0o644)
	r := runCLI(t, "call", "--bundle", dir, "--data", filepath.Join(dir, "data"), "--agent", "a", "--principal", "p",
		"--tool", "hang_echo", "--args", `{"message": "hello upstream"}`, "-o", "json")
	if r.code != cli.ExitOK {
		t.Fatalf("exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	var o callOut
	if err := json.Unmarshal([]byte(r.stdout), &o); err != nil {
		t.Fatal(err)
	}
	if resultText(o.Result) != "hello upstream" || strings.Contains(r.stderr, "broken") {
		t.Errorf("result %q stderr %q", resultText(o.Result), r.stderr)
	}
}

// TestArgsDecidedAsTheGatewayDecides: decide, explain and call parse
// arguments with the one decoder every enforcement point uses
// (toolgate.ParseArgs), so arguments the gateway refuses are refused by
// each (malformed_call, exit 3), never allowed by one of them.
func TestArgsDecidedAsTheGatewayDecides(t *testing.T) {
	bundle, data := callFixture(t)
	for _, args := range []string{
		`{"query":"SELECT 1 FROM orders","query":"SELECT * FROM api_tokens"}`,
		`{"query":"SELECT 1 FROM orders","Query":"SELECT * FROM api_tokens"}`,
		`{"query":"SELECT 1 FROM orders","limit":9007199254740993}`,
		`{"query":"SELECT 1 FROM orders"} {"b": 2}`,
		`[1, 2]`,
		`{`,
		`nope`,
	} {
		for _, cmd := range []string{"decide", "explain", "call"} {
			t.Run(cmd+" "+args, func(t *testing.T) {
				argv := []string{cmd, "--bundle", bundle, "--agent", "analyst", "--principal", "user:analyst",
					"--tool", "sql_query", "--args", args}
				if cmd == "call" {
					argv = append(argv, "--data", data)
				}
				r := runCLI(t, argv...)
				if r.code != cli.ExitDenied {
					t.Errorf("exit %d, want %d (denied)\nstdout:\n%s\nstderr:\n%s", r.code, cli.ExitDenied, r.stdout, r.stderr)
				}
				if !strings.Contains(r.stdout, "malformed_call") {
					t.Errorf("stdout does not name malformed_call:\n%s", r.stdout)
				}
			})
		}
	}
}
