package gateway_test

// Regression tests of issue 7 on a real gateway (toolgate serve): the
// existence oracle (finding 3), failed authentication (finding 9) and an
// upstream flooding tools/list_changed (finding 14). Upstreams: a stdio
// server (node), Go SDK servers over Streamable HTTP in this process, and
// the built-in sql.* tools over a real SQLite file.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolgate/toolgate/gateway"
	"github.com/toolgate/toolgate/internal/testenv"
	"github.com/toolgate/toolgate/mcpproxy"
)

// stdioTools is an MCP server over stdio announcing the tools open and
// secret; both answer "stdio ran <name>".
const stdioTools = `
const readline = require("node:readline");
const send = (m) => process.stdout.write(JSON.stringify(m) + "\n");
readline.createInterface({ input: process.stdin }).on("line", (line) => {
  let req;
  try { req = JSON.parse(line); } catch { return; }
  if (req.id === undefined) return;
  const reply = (result) => send({ jsonrpc: "2.0", id: req.id, result });
  switch (req.method) {
    case "initialize":
      return reply({ protocolVersion: req.params.protocolVersion, capabilities: { tools: {} }, serverInfo: { name: "st", version: "1.0.0" } });
    case "ping":
      return reply({});
    case "tools/list":
      return reply({ tools: [{ name: "open", inputSchema: { type: "object" } }, { name: "secret", inputSchema: { type: "object" } }] });
    case "tools/call":
      return reply({ content: [{ type: "text", text: "stdio ran " + req.params.name }] });
    default:
      return send({ jsonrpc: "2.0", id: req.id, error: { code: -32601, message: "method not found" } });
  }
});
`

// goTools is a Go SDK server over Streamable HTTP with the given tools.
func goTools(t *testing.T, names ...string) (*mcp.Server, string) {
	t.Helper()
	srv := mcp.NewServer(&mcp.Implementation{Name: "ht", Version: "1"}, nil)
	for _, n := range names {
		addEcho(srv, n)
	}
	ts := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil))
	t.Cleanup(ts.Close)
	return srv, ts.URL
}

func addEcho(srv *mcp.Server, name string) {
	srv.AddTool(&mcp.Tool{Name: name, InputSchema: map[string]any{"type": "object"}},
		func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "ran " + name}}}, nil
		})
}

const oracleKey = "tg-test-oracle"

// oracleBundle: a stdio upstream st (open, secret), an HTTP upstream ht
// (open, secret, paused), the built-in sql.* tools; the agent's ceiling
// holds st-open, ht-open, ht-paused (suspended) and sql.query, so
// st_secret, ht_secret, ht_paused and sql_describe_table are hidden.
const oracleBundle = `
- {kind: Database, name: shop, driver: sqlite, path: shop.db, init_sql: shop.sql}
- {kind: Upstream, name: st, transport: stdio, command: %q, args: [%q]}
- {kind: Upstream, name: ht, transport: streamable-http, url: %q}
- {kind: Tool, name: sql.query, side_effect_class: read, source: {builtin: sql.query}}
- {kind: Tool, name: sql.describe_table, side_effect_class: read, source: {builtin: sql.describe_table}}
- kind: Agent
  agent_id: oracle
  version: 1.0.0
  runtime_engine: mcp-client
  tool_permissions:
    - {tool_id: tool:st-open, side_effect_class: write, approval_tier: auto}
    - {tool_id: tool:ht-open, side_effect_class: write, approval_tier: auto}
    - {tool_id: tool:ht-paused, side_effect_class: write, approval_tier: auto}
    - {tool_id: tool:sql-query, side_effect_class: read, approval_tier: auto}
- kind: RuntimePolicy
  agent_id: oracle
  deployment_mode: production
  tool_authorization_policy:
    active_tool_set: restricted
    tool_suspensions: [tool:ht-paused]
    mcp_tool_policy: {mcp_write_approval_required: false}
- kind: Principal
  principal_id: user:oracle
  grants: [{resource: tool, action: invoke, scope: all}]
- kind: Credential
  name: oracle
  api_key_sha256: %x
  principal: user:oracle
  agent_id: oracle
  deployment_mode: production
`

// startLogged runs toolgate serve on bundleDir with its log in logs.
func startLogged(t *testing.T, bundleDir string, logs io.Writer) *running {
	t.Helper()
	data := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan string, 1)
	done := make(chan error, 1)
	var gwp *gateway.Gateway
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	go func() {
		done <- gateway.Run(ctx, gateway.Config{BundleDir: bundleDir, Listen: "127.0.0.1:0", DataDir: data, Logger: log,
			Ready: func(addr string) { ready <- addr },
			Mount: func(mux *http.ServeMux, gw *gateway.Gateway) { gwp = gw }}, nil)
	}()
	var addr string
	select {
	case addr = <-ready:
	case err := <-done:
		cancel()
		t.Fatalf("gateway did not start: %v", err)
	case <-time.After(60 * time.Second):
		cancel()
		t.Fatal("gateway did not start in 60s")
	}
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("gateway shutdown: %v", err)
		}
	})
	return &running{url: "http://" + addr + "/mcp", gw: gwp, data: data}
}

// rawPost posts one JSON-RPC message in session sid and returns the answer.
func rawPost(t *testing.T, url, key, sid, body string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	if sid != "" {
		req.Header.Set("Mcp-Session-Id", sid)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(b)
}

// rawSession opens a session and waits until tools/list holds want.
func rawSession(t *testing.T, url, key string, want ...string) string {
	t.Helper()
	resp, body := rawPost(t, url, key, "", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`)
	sid := resp.Header.Get("Mcp-Session-Id")
	if sid == "" {
		t.Fatalf("initialize: HTTP %d %s", resp.StatusCode, body)
	}
	rawPost(t, url, key, sid, `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	waitFor(t, fmt.Sprintf("tools %v", want), func() bool {
		_, body := rawPost(t, url, key, sid, `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`)
		for _, w := range want {
			if !strings.Contains(body, `"`+w+`"`) {
				return false
			}
		}
		return true
	})
	return sid
}

// scrape reads /metrics: every toolgate_ series and its value.
func scrape(t *testing.T, base string) map[string]float64 {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "toolgate_") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("metrics line %q: %v", line, err)
		}
		out[line[:i]] = v
	}
	return out
}

func delta(before, after map[string]float64) map[string]float64 {
	d := map[string]float64{}
	for k, v := range after {
		if v != before[k] {
			d[k] = v - before[k]
		}
	}
	for k, v := range before {
		if _, ok := after[k]; !ok {
			d[k] = -v
		}
	}
	return d
}

// answer is an HTTP answer as a caller sees it, with what must differ
// (the date, the name called, the request id) taken out.
type answer struct {
	Status  int
	Header  http.Header
	Body    string
	Metrics map[string]float64
}

// TestHiddenLooksLikeNonexistent (issue 7, finding 3): a hidden tool of a
// stdio upstream, of an HTTP upstream, a suspended one and a hidden
// built-in are answered exactly like a name that does not exist — status,
// headers, body — and move exactly the same /metrics series, on both
// request shapes (the fast path's, and with _meta the SDK path's).
func TestHiddenLooksLikeNonexistent(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "shop.sql"), []byte("CREATE TABLE IF NOT EXISTS orders (id INTEGER);"), 0o644); err != nil {
		t.Fatal(err)
	}
	script := filepath.Join(dir, "st.js")
	if err := os.WriteFile(script, []byte(stdioTools), 0o644); err != nil {
		t.Fatal(err)
	}
	_, htURL := goTools(t, "open", "secret", "paused")
	bundle := fmt.Sprintf(oracleBundle, testenv.NodeBin(t), script, htURL, sha256sum(oracleKey))
	if err := os.WriteFile(filepath.Join(dir, "bundle.yaml"), []byte(bundle), 0o644); err != nil {
		t.Fatal(err)
	}
	g := startLogged(t, dir, io.Discard)
	base := g.apiURL()
	sid := rawSession(t, g.url, oracleKey, "st_open", "ht_open", "sql_query")
	auditTotal := func(m map[string]float64) float64 {
		var n float64
		for k, v := range m {
			if strings.HasPrefix(k, "toolgate_audit_events_total") {
				n += v
			}
		}
		return n
	}
	// Every event of the start is counted before the first measurement.
	waitFor(t, "the start's audit events counted", func() bool {
		return auditTotal(scrape(t, base)) == float64(len(g.events(t)))
	})
	const id = 100 // one id for all: the answers differ in nothing else
	ask := func(name string, sdk bool) answer {
		t.Helper()
		before := scrape(t, base)
		params := `{"name":"` + name + `","arguments":{}}`
		if sdk {
			params = `{"name":"` + name + `","arguments":{},"_meta":{"progressToken":"tok"}}`
		}
		resp, body := rawPost(t, g.url, oracleKey, sid, fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":%s}`, id, params))
		var after map[string]float64
		waitFor(t, "the decision's audit event", func() bool {
			after = scrape(t, base)
			return auditTotal(after) > auditTotal(before)
		})
		h := resp.Header.Clone()
		h.Del("Date")
		return answer{Status: resp.StatusCode, Header: h, Body: strings.ReplaceAll(body, name, "NAME"), Metrics: delta(before, after)}
	}
	for _, sdk := range []bool{false, true} {
		shape := map[bool]string{false: "fast path", true: "SDK path"}[sdk]
		for _, tc := range []struct{ what, hidden, missing string }{
			{"a hidden tool of a stdio upstream", "st_secret", "zz_secret"},
			{"a hidden tool of an HTTP upstream", "ht_secret", "zz_secret"},
			{"a suspended tool of an HTTP upstream", "ht_paused", "zz_paused"},
			{"a hidden built-in", "sql_describe_table", "sql_describe_tabl3"},
		} {
			t.Run(shape+"/"+tc.what, func(t *testing.T) {
				hidden, missing := ask(tc.hidden, sdk), ask(tc.missing, sdk)
				if diff := cmp.Diff(missing, hidden); diff != "" {
					t.Errorf("%s (-nonexistent +hidden):\n%s", tc.hidden, diff)
				}
				if !strings.Contains(hidden.Body, `unknown tool \"NAME\"`) {
					t.Errorf("the answer is not unknown tool: %s", hidden.Body)
				}
			})
		}
	}
	// The visible tools still work on their own paths.
	for _, name := range []string{"st_open", "ht_open"} {
		if _, body := rawPost(t, g.url, oracleKey, sid, `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"`+name+`","arguments":{}}}`); !strings.Contains(body, "ran open") {
			t.Errorf("%s: %s", name, body)
		}
	}
}

// TestAuthFailuresAreRecorded (issue 7, finding 9): every failed
// authentication on /mcp and the JSON API is logged, counted by reason
// and audited (gateway.auth.refused, with reason and source address),
// never with the key; a flood is summarized (count, first, last) per
// reason and source, and no refusal goes uncounted.
func TestAuthFailuresAreRecorded(t *testing.T) {
	old := mcpproxy.RefusalWindow
	mcpproxy.RefusalWindow = time.Second
	t.Cleanup(func() { mcpproxy.RefusalWindow = old })
	dir := t.TempDir()
	_, htURL := goTools(t, "open")
	bundle := fmt.Sprintf(`
- {kind: Upstream, name: ht, transport: streamable-http, url: %q}
- kind: Agent
  agent_id: a
  version: 1.0.0
  runtime_engine: go
  tool_permissions: [{tool_id: tool:ht-open, side_effect_class: write, approval_tier: auto}]
- kind: RuntimePolicy
  agent_id: a
  deployment_mode: production
  tool_authorization_policy: {active_tool_set: all}
- kind: Principal
  principal_id: user:a
  grants: [{resource: tool, action: invoke, scope: all}]
- kind: Credential
  name: a
  api_key_sha256: %x
  principal: user:a
  agent_id: a
  deployment_mode: production
`, htURL, sha256sum("tg-good-key"))
	if err := os.WriteFile(filepath.Join(dir, "bundle.yaml"), []byte(bundle), 0o644); err != nil {
		t.Fatal(err)
	}
	logs := &lockedBuffer{}
	g := startLogged(t, dir, logs)
	base := g.apiURL()
	const wrongKey = "tg-wrong-key-3b9f2c"
	const badToken = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ4In0.c2lnbmF0dXJl"
	do := func(method, url, authorization, body string) int {
		req, _ := http.NewRequest(method, url, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		if authorization != "" {
			req.Header.Set("Authorization", authorization)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	init := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"x","version":"1"}}}`
	decide := `{"tool":"ht_open","args":{}}`
	before := scrape(t, base)
	cases := []struct {
		name, method, path, authorization, body, reason string
	}{
		{"wrong key on /mcp", "POST", "/mcp", "Bearer " + wrongKey, init, "unknown_api_key"},
		{"wrong key on the JSON API", "POST", "/v1/decide", "Bearer " + wrongKey, decide, "unknown_api_key"},
		{"bad token on /mcp", "POST", "/mcp", "Bearer " + badToken, init, "invalid_token"},
		{"bad token on the JSON API", "GET", "/v1/approvals", "Bearer " + badToken, "", "invalid_token"},
		{"malformed header", "POST", "/mcp", "Basic " + wrongKey, init, "malformed_authorization"},
		{"no credential on /mcp", "POST", "/mcp", "", init, "missing_credential"},
		{"no credential on the JSON API", "POST", "/v1/resolve", "", `{}`, "missing_credential"},
		{"no credential to mint", "POST", "/v1/delegations", "", `{}`, "missing_credential"},
	}
	for _, tc := range cases {
		if got := do(tc.method, base+tc.path, tc.authorization, tc.body); got != http.StatusUnauthorized {
			t.Errorf("%s: HTTP %d, want 401", tc.name, got)
		}
	}
	// A flood of one wrong key: summarized, never dropped.
	const flood = 300
	for range flood {
		do("POST", base+"/mcp", "Bearer "+wrongKey, init)
	}
	time.Sleep(mcpproxy.RefusalWindow + 500*time.Millisecond) // the windows end; their summaries are written
	after := scrape(t, base)
	wantCount := map[string]float64{"unknown_api_key": 2 + flood, "invalid_token": 2, "malformed_authorization": 1, "missing_credential": 3}
	for reason, n := range wantCount {
		series := fmt.Sprintf(`%s{reason="%s"}`, mcpproxy.AuthFailuresTotal, reason)
		if got := after[series] - before[series]; got != n {
			t.Errorf("%s went up by %v, want %v", series, got, n)
		}
	}
	type key struct{ reason, via string }
	counts := map[key]float64{}
	events := 0
	for _, ev := range g.events(t) {
		if ev.EventType != "gateway.auth.refused" {
			continue
		}
		events++
		b, _ := json.Marshal(ev)
		if strings.Contains(string(b), wrongKey) || strings.Contains(string(b), badToken) {
			t.Errorf("an event holds the credential: %s", b)
		}
		if ev.Details["source"] != "127.0.0.1" || ev.Code != ev.Details["reason"] || ev.Details["first"] == nil || ev.Details["last"] == nil {
			t.Errorf("event without reason, source, first and last: %s", b)
		}
		n, _ := strconv.ParseFloat(fmt.Sprint(ev.Details["count"]), 64)
		counts[key{fmt.Sprint(ev.Details["reason"]), fmt.Sprint(ev.Details["via"])}] += n
	}
	wantEvents := map[key]float64{{"unknown_api_key", "mcp"}: 1 + flood, {"unknown_api_key", "http"}: 1, {"invalid_token", "mcp"}: 1,
		{"invalid_token", "http"}: 1, {"malformed_authorization", "mcp"}: 1, {"missing_credential", "mcp"}: 1, {"missing_credential", "http"}: 2}
	if diff := cmp.Diff(wantEvents, counts); diff != "" {
		t.Errorf("refusals the audit log accounts for (-want +got):\n%s", diff)
	}
	if events > 40 {
		t.Errorf("%d gateway.auth.refused events for %d refusals: the flood was not summarized", events, flood+10)
	}
	out := logs.String()
	if strings.Contains(out, wrongKey) || strings.Contains(out, badToken) {
		t.Error("the log holds a credential")
	}
	if n := strings.Count(out, `msg="authentication refused"`); n < len(wantEvents) || n > 40 {
		t.Errorf("%d log lines of refused authentication, want between %d and 40", n, len(wantEvents))
	}
}

// TestListChangedFloodIsCoalesced (issue 7, finding 14): an upstream that
// floods tools/list_changed with a changing list for 3 s writes at most
// one mcp.tool.definition_changed event per ToolChangeWindow (1 s), not
// one per list; the list it ends with is what the gateway serves.
func TestListChangedFloodIsCoalesced(t *testing.T) {
	srv, url := goTools(t, "steady")
	dir := t.TempDir()
	bundle := fmt.Sprintf(`
- {kind: Upstream, name: fl, transport: streamable-http, url: %q}
- kind: Agent
  agent_id: a
  version: 1.0.0
  runtime_engine: go
  tool_permissions:
    - {tool_id: tool:fl-steady, side_effect_class: write, approval_tier: auto}
    - {tool_id: tool:fl-final, side_effect_class: write, approval_tier: auto}
- kind: RuntimePolicy
  agent_id: a
  deployment_mode: production
  tool_authorization_policy: {active_tool_set: all}
- kind: Principal
  principal_id: user:a
  grants: [{resource: tool, action: invoke, scope: all}]
- kind: Credential
  name: a
  api_key_sha256: %x
  principal: user:a
  agent_id: a
  deployment_mode: production
`, url, sha256sum("tg-flood-key"))
	if err := os.WriteFile(filepath.Join(dir, "bundle.yaml"), []byte(bundle), 0o644); err != nil {
		t.Fatal(err)
	}
	g := startLogged(t, dir, io.Discard)
	rawSession(t, g.url, "tg-flood-key", "fl_steady")
	changes := 0
	for start := time.Now(); time.Since(start) < 3*time.Second; changes++ {
		addEcho(srv, fmt.Sprintf("churn%d", changes))
		if changes > 0 {
			srv.RemoveTools(fmt.Sprintf("churn%d", changes-1))
		}
		time.Sleep(15 * time.Millisecond) // past the SDK server's own 10 ms notification delay
	}
	addEcho(srv, "final")
	rawSession(t, g.url, "tg-flood-key", "fl_steady", "fl_final")
	var changed int
	for _, ev := range g.events(t) {
		if ev.EventType == "mcp.tool.definition_changed" && ev.Details["upstream"] == "fl" {
			changed++
		}
	}
	if changed == 0 || changed > 6 {
		t.Errorf("%d definition_changed events for %d changes in 3 s, want between 1 and 6 (one per window)", changed, changes)
	}
}
