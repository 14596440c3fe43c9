package gateway_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/toolgate/toolgate/audit"
	"github.com/toolgate/toolgate/httpapi"
	"github.com/toolgate/toolgate/internal/testenv"
)

const analystKey = "tg-test-analyst"

// flakyServer is an MCP server over stdio for the retry tests. Its tools
// fetch (read) and charge (irreversible) count their executions per
// arguments.key in files under the folder given as its argument, and the
// first execution for a key kills the server mid-call (SIGKILL, no answer);
// later ones answer. echo always answers.
const flakyServer = `
const readline = require("node:readline");
const fs = require("node:fs");
const path = require("node:path");
const dir = process.argv[2];
const send = (m) => process.stdout.write(JSON.stringify(m) + "\n");
const schema = { type: "object", properties: { key: { type: "string" } } };
readline.createInterface({ input: process.stdin }).on("line", (line) => {
  let req;
  try { req = JSON.parse(line); } catch { return; }
  if (req.id === undefined) return;
  const reply = (result) => send({ jsonrpc: "2.0", id: req.id, result });
  switch (req.method) {
    case "initialize":
      return reply({ protocolVersion: req.params.protocolVersion, capabilities: { tools: {} }, serverInfo: { name: "flaky", version: "1.0.0" } });
    case "ping":
      return reply({});
    case "tools/list":
      return reply({ tools: [
        { name: "fetch", inputSchema: schema, annotations: { readOnlyHint: true } },
        { name: "charge", inputSchema: schema, annotations: { destructiveHint: true } },
        { name: "echo", inputSchema: schema, annotations: { readOnlyHint: true } },
      ] });
    case "tools/call": {
      const name = req.params.name, key = String((req.params.arguments || {}).key || "").replace(/[^a-z0-9]/g, "");
      if (name === "echo") return reply({ content: [{ type: "text", text: "echo " + key }] });
      const f = path.join(dir, name + "-" + key);
      fs.appendFileSync(f, "x");
      const n = fs.readFileSync(f).length;
      if (n === 1) { process.kill(process.pid, "SIGKILL"); return; }
      return reply({ content: [{ type: "text", text: name + " " + key + " served on execution " + n }] });
    }
    default:
      return send({ jsonrpc: "2.0", id: req.id, error: { code: -32601, message: "method not found" } });
  }
});
`

// builtinBundle is the gateway the built-in, retry and equivalence tests
// share. %[1]s is the shop.sql fixture, %[2]s the node binary, %[3]s the
// flaky server script, %[4]s its count folder, %[5]s the analyst key's
// sha256, %[6]s extra documents.
const builtinBundle = `
- {kind: Settings, result_max_kib: 64}
- {kind: Database, name: shop, driver: sqlite, path: shop.db, init_sql: %[1]q}
- {kind: Upstream, name: flaky, transport: stdio, command: %[2]q, args: [%[3]q, %[4]q], call_timeout: 10s}

- {kind: Tool, name: sql.query, side_effect_class: read, source: {builtin: sql.query}}
- {kind: Tool, name: sql.list_tables, side_effect_class: read, source: {builtin: sql.list_tables}}
- {kind: Tool, name: sql.describe_table, side_effect_class: read, source: {builtin: sql.describe_table}}
- {kind: Tool, name: fs.read, side_effect_class: read, source: {builtin: fs.read}}
- {kind: Tool, name: fs.list, side_effect_class: read, source: {builtin: fs.list}}
- {kind: Tool, name: fs.search, side_effect_class: read, source: {builtin: fs.search}}
- kind: Tool
  tool_id: tool:flaky-fetch
  side_effect_class: read
  source: {mcp_server: flaky}
  retry: {max_attempts: 12, initial_backoff: 100ms, max_backoff: 1s}
- {kind: Tool, tool_id: tool:flaky-charge, side_effect_class: irreversible, source: {mcp_server: flaky}, retry: {max_attempts: 8}}

- kind: Agent
  agent_id: analyst
  version: 1.0.0
  runtime_engine: mcp-client
  workspace: ../ws
  tool_permissions:
    - {tool_id: tool:sql-query, side_effect_class: read, approval_tier: auto}
    - {tool_id: tool:sql-list-tables, side_effect_class: read, approval_tier: auto}
    - {tool_id: tool:fs-read, side_effect_class: read, approval_tier: auto}
    - {tool_id: tool:fs-list, side_effect_class: read, approval_tier: auto}
    - {tool_id: tool:fs-search, side_effect_class: read, approval_tier: hitl}
    - {tool_id: tool:flaky-fetch, side_effect_class: read, approval_tier: auto}
    - {tool_id: tool:flaky-charge, side_effect_class: irreversible, approval_tier: auto}
    - {tool_id: tool:flaky-echo, side_effect_class: read, approval_tier: auto}
- kind: RuntimePolicy
  agent_id: analyst
  deployment_mode: production
  tool_authorization_policy:
    active_tool_set: all
    mcp_tool_policy: {mcp_write_approval_required: false}
- kind: ToolPolicy
  name: no-env-files
  conditions:
    - {tools: ["tool:fs-read"], when: '!has(args.path) || !args.path.endsWith(".env")', reason: .env files hold credentials}
- kind: Principal
  principal_id: user:analyst
  description: May read orders, never api_tokens; may not list tables.
  grants:
    - {resource: tool, action: invoke, scope: {tool: sql.query}}
    - {resource: tool, action: invoke, scope: {tool: fs.read}}
    - {resource: tool, action: invoke, scope: {tool: fs.list}}
    - {resource: tool, action: invoke, scope: {tool: fs.search}}
    - {resource: tool, action: invoke, scope: {tool: flaky_fetch}}
    - {resource: tool, action: invoke, scope: {tool: flaky_charge}}
    - {resource: tool, action: invoke, scope: {tool: flaky_echo}}
    - {resource: sql_table, action: read, scope: {name: shop.orders}}
- kind: Credential
  name: analyst
  api_key_sha256: %[5]s
  principal: user:analyst
  agent_id: analyst
  deployment_mode: production
%[6]s`

// builtinEnv is a running gateway over builtinBundle.
type builtinEnv struct {
	*running
	root   string // ROOT: bundle/, ws/, ws-evil/, counts/
	counts string
}

// startBuiltinGateway lays out ROOT/bundle (the bundle), ROOT/ws (the
// analyst's workspace, ../ws from the bundle: notes/a.md, secrets.env, a
// link inside and a link pointing out), ROOT/ws-evil/secret.txt, and starts
// the gateway; it waits until the flaky upstream's tools are in the catalog.
func startBuiltinGateway(t *testing.T, extra string) *builtinEnv {
	t.Helper()
	root := t.TempDir()
	e := &builtinEnv{root: root, counts: filepath.Join(root, "counts")}
	for _, d := range []string{"bundle", "ws/notes", "ws-evil", "counts"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write := func(rel, body string) {
		if err := os.WriteFile(filepath.Join(root, rel), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("ws/notes/a.md", "# Notes\nthe quarterly numbers are in orders\n")
	write("ws/secrets.env", "TOKEN=inside-but-never-read\n")
	write("ws-evil/secret.txt", "EVIL-SECRET-CONTENT\n")
	write("flaky.js", flakyServer)
	for link, target := range map[string]string{"ws/out": "../ws-evil/secret.txt", "ws/evil-dir": "../ws-evil", "ws/in": "notes/a.md"} {
		if err := os.Symlink(target, filepath.Join(root, link)); err != nil {
			t.Fatal(err)
		}
	}
	shopSQL := filepath.Join(testenv.RepoRoot(t), "examples", "bundle", "shop.sql")
	body := fmt.Sprintf(builtinBundle, shopSQL, testenv.NodeBin(t), filepath.Join(root, "flaky.js"), e.counts,
		fmt.Sprintf("%x", sha256sum(analystKey)), extra)
	write("bundle/bundle.yaml", body)
	e.running = startGateway(t, filepath.Join(root, "bundle"))
	waitFor(t, "the flaky upstream's tools", func() bool {
		tl, ok := e.gw.Gate.Snapshot().Tool("tool:flaky-echo")
		return ok && tl.MCPServer == "flaky"
	})
	return e
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// apiURL is the JSON API's base URL.
func (r *running) apiURL() string { return strings.TrimSuffix(r.url, "/mcp") }

// toolsCall posts to /v1/tools/call as key and decodes the answer.
func toolsCall(t *testing.T, base, key, tool string, args any) (int, httpapi.ToolsCallResponse, string) {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"tool": tool, "arguments": args})
	req, _ := http.NewRequest("POST", base+"/v1/tools/call", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var out httpapi.ToolsCallResponse
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatalf("decode %s: %v", raw, err)
	}
	return resp.StatusCode, out, string(raw)
}

// events flushes the audit log and returns every event.
func (r *running) events(t *testing.T) []audit.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := r.gw.Rec.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	evs, err := audit.ReadEvents(ctx, r.gw.Store, 1, 100000)
	if err != nil {
		t.Fatal(err)
	}
	return evs
}

// sqlCase is a query through sql.query and what must come of it.
type sqlCase struct {
	name     string
	query    string
	status   int
	code     string
	mentions []string // in the reason (refusals) or in the result (allowed)
}

// sqlCases are the same on SQLite and PostgreSQL; table names the
// resources start with differ (shop.api_tokens, pg.<schema>.api_tokens).
func sqlCases(apiTokens string) []sqlCase {
	return []sqlCase{
		{"a subquery aliased as orders", "SELECT * FROM (SELECT * FROM api_tokens) AS orders", 403, "rbac_resource", []string{apiTokens}},
		{"a CTE named orders", "WITH orders AS (SELECT * FROM api_tokens) SELECT * FROM orders", 403, "rbac_resource", []string{apiTokens}},
		{"a join", "SELECT o.id FROM orders o JOIN api_tokens t ON t.id = o.id", 403, "rbac_resource", []string{apiTokens}},
		{"a read followed by a delete", "SELECT 1; DELETE FROM orders", 403, "sql_not_read_only", []string{"DELETE FROM orders"}},
		{"a write", "UPDATE orders SET status = 'x'", 403, "sql_not_read_only", []string{"UPDATE"}},
		{"an aggregate over orders", "SELECT count(*), lower(status) FROM orders GROUP BY 2 ORDER BY 2", 200, "ok", []string{"shipped", "pending", "cancelled"}},
	}
}

func runSQLCases(t *testing.T, base string, cases []sqlCase) {
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			status, out, raw := toolsCall(t, base, analystKey, "sql_query", map[string]any{"query": tc.query})
			if status != tc.status || out.Decision.Code != tc.code {
				t.Fatalf("status %d code %q, want %d %q: %s", status, out.Decision.Code, tc.status, tc.code, raw)
			}
			where := out.Decision.Reason
			if tc.status == 200 {
				where = raw
				if out.Status != "success" || out.ExecutionContext.Attempts != 1 {
					t.Errorf("envelope %s", raw)
				}
			} else if out.Result != nil || strings.Contains(raw, "sk_live") {
				t.Errorf("a refused query returned data: %s", raw)
			}
			for _, m := range tc.mentions {
				if !strings.Contains(where, m) {
					t.Errorf("%q does not mention %q", where, m)
				}
			}
		})
	}
}

func TestBuiltinSQLiteThroughGateway(t *testing.T) {
	e := startBuiltinGateway(t, "")
	runSQLCases(t, e.apiURL(), sqlCases("shop.api_tokens"))
	t.Run("the audit log names the hidden table", func(t *testing.T) {
		found := false
		for _, ev := range e.events(t) {
			if ev.Code == "rbac_resource" && strings.Contains(ev.Reason, "shop.api_tokens") && ev.Details["via"] == "http" {
				found = true
			}
		}
		if !found {
			t.Error("no rbac_resource event naming shop.api_tokens")
		}
	})
}

func TestBuiltinPostgresThroughGateway(t *testing.T) {
	base := testenv.PostgresDSN(t)
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, base)
	if err != nil {
		t.Fatalf("PostgreSQL at %s: %v (TOOLGATE_PG_DSN=off skips)", base, err)
	}
	// A database of its own, so that no other test's tables show up.
	var rnd [6]byte
	rand.Read(rnd[:])
	dbName := "tg_gw_builtin_" + hex.EncodeToString(rnd[:])
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+dbName); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := admin.Exec(context.Background(), "DROP DATABASE "+dbName+" WITH (FORCE)"); err != nil {
			t.Errorf("drop database: %v", err)
		}
		admin.Close(context.Background())
	})
	u, err := url.Parse(base)
	if err != nil || u.Scheme == "" {
		t.Fatalf("TOOLGATE_PG_DSN must be a postgres:// URL for this test: %v", err)
	}
	u.Path = "/" + dbName
	dsn := u.String()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	shop, err := os.ReadFile(filepath.Join(testenv.RepoRoot(t), "examples", "bundle", "shop.sql"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = conn.Exec(ctx, string(shop))
	conn.Close(ctx)
	if err != nil {
		t.Fatal(err)
	}
	dsnFile := filepath.Join(t.TempDir(), "dsn")
	os.WriteFile(dsnFile, []byte(dsn+"\n"), 0o600)
	schema := "public"
	// The DSN comes from a file, as a secret would; pg-analyst may read
	// pg's orders only.
	extra := fmt.Sprintf(`- {kind: Database, name: pg, driver: postgres, dsn: {from_file: %q}, statement_timeout: 5s}
- kind: Principal
  principal_id: user:pg-analyst
  grants:
    - {resource: tool, action: invoke, scope: {tool: sql.query}}
    - {resource: sql_table, action: read, scope: {name: pg.%s.orders}}
- {kind: Credential, name: pg, api_key_sha256: %x, principal: user:pg-analyst, agent_id: analyst}
`, dsnFile, schema, sha256sum("tg-test-pg"))
	e := startBuiltinGateway(t, extra)
	cases := sqlCases("pg." + schema + ".api_tokens")
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			status, out, raw := toolsCall(t, e.apiURL(), "tg-test-pg", "sql_query", map[string]any{"database": "pg", "query": tc.query})
			if status != tc.status || out.Decision.Code != tc.code {
				t.Fatalf("status %d code %q, want %d %q: %s", status, out.Decision.Code, tc.status, tc.code, raw)
			}
			where := out.Decision.Reason
			if status == 200 {
				where = raw
			}
			for _, m := range tc.mentions {
				if !strings.Contains(where, m) {
					t.Errorf("%q does not mention %q", where, m)
				}
			}
		})
	}
}

func TestBuiltinWorkspaceThroughGateway(t *testing.T) {
	e := startBuiltinGateway(t, "")
	for _, tc := range []struct {
		name   string
		tool   string
		args   map[string]any
		status int
		code   string
	}{
		{"a file in the workspace", "fs_read", map[string]any{"path": "notes/a.md"}, 200, "ok"},
		{"a link that stays inside", "fs_read", map[string]any{"path": "in"}, 200, "ok"},
		{"dot-dot to a sibling folder", "fs_read", map[string]any{"path": "../ws-evil/secret.txt"}, 403, "path_outside_workspace"},
		{"a link pointing out", "fs_read", map[string]any{"path": "out"}, 403, "path_outside_workspace"},
		{"through a linked folder", "fs_read", map[string]any{"path": "evil-dir/secret.txt"}, 403, "path_outside_workspace"},
		{"an absolute path", "fs_read", map[string]any{"path": filepath.Join(e.root, "ws-evil", "secret.txt")}, 403, "path_outside_workspace"},
		{"listing a link pointing out", "fs_list", map[string]any{"path": "evil-dir"}, 403, "path_outside_workspace"},
		{"a .env file inside", "fs_read", map[string]any{"path": "secrets.env"}, 403, "condition_failed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, out, raw := toolsCall(t, e.apiURL(), analystKey, tc.tool, tc.args)
			if status != tc.status || out.Decision.Code != tc.code {
				t.Fatalf("status %d code %q, want %d %q: %s", status, out.Decision.Code, tc.status, tc.code, raw)
			}
			if strings.Contains(raw, "EVIL-SECRET") || strings.Contains(raw, "inside-but-never-read") {
				t.Errorf("secret content leaked: %s", raw)
			}
			if status == 200 && !strings.Contains(raw, "quarterly numbers") {
				t.Errorf("result lacks the file: %s", raw)
			}
		})
	}
}

// attemptsOf returns the attempts and failed-attempt details of the
// completion event of a call.
func attemptsOf(t *testing.T, r *running, correlation string) (string, int, int) {
	t.Helper()
	for _, ev := range r.events(t) {
		if ev.CorrelationID == correlation && (ev.EventType == "agent.tool.completed" || ev.EventType == "agent.tool.failed") {
			failed, _ := ev.Details["failed_attempts"].([]any)
			return ev.EventType, ev.Attempts, len(failed)
		}
	}
	t.Fatalf("no completion event for %s", correlation)
	return "", 0, 0
}

func executions(t *testing.T, dir, tool, key string) int {
	t.Helper()
	b, _ := os.ReadFile(filepath.Join(dir, tool+"-"+key))
	return len(b)
}

func TestRetriesThroughGateway(t *testing.T) {
	e := startBuiltinGateway(t, "")
	t.Run("a read tool is retried after its upstream dies mid-call", func(t *testing.T) {
		status, out, raw := toolsCall(t, e.apiURL(), analystKey, "flaky_fetch", map[string]any{"key": "http"})
		if status != 200 || !strings.Contains(raw, "served on execution 2") {
			t.Fatalf("status %d: %s", status, raw)
		}
		typ, attempts, failed := attemptsOf(t, e.running, out.ExecutionContext.CorrelationID)
		if typ != "agent.tool.completed" || attempts < 2 || attempts != out.ExecutionContext.Attempts || failed != attempts-1 {
			t.Errorf("audit: %s after %d attempts (%d failed), answer says %d", typ, attempts, failed, out.ExecutionContext.Attempts)
		}
		if n := executions(t, e.counts, "fetch", "http"); n != 2 {
			t.Errorf("the tool ran %d times, want 2 (the killed one and the retry)", n)
		}
	})
	t.Run("an irreversible tool is never retried", func(t *testing.T) {
		waitFor(t, "the upstream to come back", func() bool {
			status, _, _ := toolsCall(t, e.apiURL(), analystKey, "flaky_echo", map[string]any{"key": "ping"})
			return status == 200
		})
		status, out, raw := toolsCall(t, e.apiURL(), analystKey, "flaky_charge", map[string]any{"key": "http"})
		if status != 502 || out.Status != "failure" || out.Decision.Verdict != "allow" || !strings.Contains(out.Errors[0], "upstream is down") {
			t.Fatalf("status %d: %s", status, raw)
		}
		typ, attempts, failed := attemptsOf(t, e.running, out.ExecutionContext.CorrelationID)
		if typ != "agent.tool.failed" || attempts != 1 || failed != 1 {
			t.Errorf("audit: %s after %d attempts (%d failed), want agent.tool.failed after 1", typ, attempts, failed)
		}
		if n := executions(t, e.counts, "charge", "http"); n != 1 {
			t.Errorf("the irreversible tool ran %d times, want 1", n)
		}
	})
	t.Run("the MCP proxy retries the same way", func(t *testing.T) {
		waitFor(t, "the upstream to come back", func() bool {
			status, _, _ := toolsCall(t, e.apiURL(), analystKey, "flaky_echo", map[string]any{"key": "ping"})
			return status == 200
		})
		cs := connect(t, e.url, analystKey)
		res, err := call(t, cs, "flaky_fetch", map[string]any{"key": "mcp"})
		if err != nil || res.IsError || !strings.Contains(text(res), "served on execution 2") {
			t.Fatalf("got %v %v", err, res)
		}
		if n := executions(t, e.counts, "fetch", "mcp"); n != 2 {
			t.Errorf("the tool ran %d times, want 2", n)
		}
	})
}
