package gateway_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/toolgate/toolgate"
	"github.com/toolgate/toolgate/gate"
)

// equivalenceCases is ONE table of calls, each run through the three
// enforcement points: the Go API (gate.Call), the HTTP API
// (/v1/tools/call) and the MCP proxy. All three must reach the same verdict
// and code, and the audit log must record that code for each. visible says
// whether the caller sees the tool: a refusal of a visible tool carries the
// code (an isError result over MCP); a tool the caller cannot see is
// answered exactly like one that does not exist (the unknown-tool JSON-RPC
// error over MCP, code unknown_tool over HTTP), and only the audit log
// tells the codes apart.
var equivalenceCases = []struct {
	name    string
	tool    string
	args    string
	verdict string
	code    string
	visible bool
}{
	{"allow: built-in tool", "sql_query", `{"query": "SELECT count(*) AS n FROM orders"}`, "allow", "ok", true},
	{"allow: upstream tool", "flaky_echo", `{"key": "equivalence"}`, "allow", "ok", true},
	{"hidden: not in the ceiling", "sql_describe_table", `{"table": "orders"}`, "deny", "not_in_ceiling", false},
	{"hidden: no tool:invoke grant", "sql_list_tables", `{}`, "deny", "rbac_tool_invoke", false},
	{"rbac_resource through sql.query", "sql_query", `{"query": "SELECT * FROM (SELECT * FROM api_tokens) AS orders"}`, "deny", "rbac_resource", true},
	{"refused by the tool: not read-only", "sql_query", `{"query": "SELECT 1; DELETE FROM orders"}`, "deny", "sql_not_read_only", true},
	{"refused by the tool: outside the workspace", "fs_read", `{"path": "../ws-evil/secret.txt"}`, "deny", "path_outside_workspace", true},
	{"condition_failed", "fs_read", `{"path": "secrets.env"}`, "deny", "condition_failed", true},
	{"approval_required", "fs_search", `{"pattern": "**/*.md"}`, "require_approval", "approval_required", true},
	{"malformed name", "SQL_Query", `{"query": "SELECT 1"}`, "deny", "malformed_call", false},
	{"unknown tool", "sql_drop", `{}`, "deny", "unknown_tool", false},
}

func TestEnforcementPointsAgree(t *testing.T) {
	e := startBuiltinGateway(t, "")
	id, err := e.gw.Gate.Credentials().Identify("Bearer " + analystKey)
	if err != nil {
		t.Fatal(err)
	}
	cs := connect(t, e.url, analystKey)
	t.Run("the MCP list is the disclosed set, built-in tools included", func(t *testing.T) {
		got := listNames(t, cs, 7)
		want := []string{"flaky_charge", "flaky_echo", "flaky_fetch", "fs_list", "fs_read", "fs_search", "sql_query"}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("tools (-want +got):\n%s", diff)
		}
	})
	type verdict struct{ Verdict, Code string }
	for _, tc := range equivalenceCases {
		t.Run(tc.name, func(t *testing.T) {
			want := verdict{tc.verdict, tc.code}
			var args map[string]any
			if err := json.Unmarshal([]byte(tc.args), &args); err != nil {
				t.Fatal(err)
			}

			// Go API.
			out := e.gw.Gate.Handle(context.Background(), gate.Request{Identity: id, Tool: tc.tool, Args: json.RawMessage(tc.args), Via: "go"})
			cr := out.Result
			if diff := cmp.Diff(want, verdict{out.Decision.Verdict.String(), string(out.Decision.Code)}); diff != "" {
				t.Errorf("Go API (-want +got):\n%s%s", diff, out.Decision.Reason)
			}
			if ran := out.Decision.Allowed(); cr.Ran != ran || (ran && cr.Failed) {
				t.Errorf("Go API: ran %v failed %v (%v)", cr.Ran, cr.Failed, cr.Err)
			}

			// HTTP API.
			status, resp, raw := toolsCall(t, e.apiURL(), analystKey, tc.tool, args)
			wantHTTP := want
			if !tc.visible {
				wantHTTP = verdict{"deny", "unknown_tool"}
				if want := fmt.Sprintf("composition layer: %q is not a tool this caller can call; POST /v1/resolve lists the tools it can", tc.tool); resp.Decision.Reason != want || resp.Decision.ToolID != "" {
					t.Errorf("HTTP API: a hidden tool got reason %q tool_id %q, want %q and none", resp.Decision.Reason, resp.Decision.ToolID, want)
				}
			}
			if diff := cmp.Diff(wantHTTP, verdict{resp.Decision.Verdict, resp.Decision.Code}); diff != "" {
				t.Errorf("HTTP API (-want +got):\n%s%s", diff, raw)
			}
			wantStatus := map[string]int{"allow": 200, "deny": 403, "require_approval": 202}[tc.verdict]
			if status != wantStatus || (resp.Status == "success") != (tc.verdict == "allow") {
				t.Errorf("HTTP API: status %d (want %d), %s", status, wantStatus, raw)
			}

			// MCP proxy.
			res, err := call(t, cs, tc.tool, args)
			switch {
			case !tc.visible:
				if e := rpcErr(t, err); e.Message != fmt.Sprintf("unknown tool %q", tc.tool) {
					t.Errorf("MCP: a hidden tool got %v, want the unknown-tool error", e)
				}
			case err != nil:
				t.Errorf("MCP: %v", err)
			case tc.verdict == "allow":
				if res.IsError {
					t.Errorf("MCP: allowed call failed: %s", text(res))
				}
			default:
				sc := structured(t, res)
				if diff := cmp.Diff(want, verdict{fmt.Sprint(sc["verdict"]), fmt.Sprint(sc["code"])}); diff != "" || !res.IsError {
					t.Errorf("MCP (-want +got):\n%s%s", diff, text(res))
				}
			}

			// The audit log: the same code from each enforcement point.
			parsed, err := toolgate.ParseArgs([]byte(tc.args))
			if err != nil {
				t.Fatal(err)
			}
			digest := parsed.Digest
			got := map[string]verdict{}
			for _, ev := range e.events(t) {
				decision := ev.EventType == "agent.tool.authorized" || ev.EventType == "agent.tool.unauthorized" || ev.EventType == "agent.tool.approval_requested"
				if decision && ev.ToolName == tc.tool && ev.ArgsDigest == digest {
					got[fmt.Sprint(ev.Details["via"])] = verdict{ev.Verdict, ev.Code}
				}
			}
			wantLog := map[string]verdict{"go": want, "http": want, "mcp": want}
			if diff := cmp.Diff(wantLog, got); diff != "" {
				t.Errorf("audit log by enforcement point (-want +got):\n%s", diff)
			}
		})
	}
	t.Run("every case is covered", func(t *testing.T) {
		var codes []string
		for _, tc := range equivalenceCases {
			codes = append(codes, tc.code)
		}
		for _, c := range []string{"ok", "not_in_ceiling", "rbac_tool_invoke", "rbac_resource", "condition_failed", "approval_required", "malformed_call"} {
			if !slices.Contains(codes, c) {
				t.Errorf("no case for %s", c)
			}
		}
	})
}
