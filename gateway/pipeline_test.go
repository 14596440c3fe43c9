package gateway_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolgate/toolgate/audit"
	"github.com/toolgate/toolgate/internal/cli"
	"github.com/toolgate/toolgate/internal/testenv"
)

const pipelineKey = "tg-test-pipeline"

// pipelineBundle: the Go everything-server (ev: tools, resources,
// templates, prompts) and two SDK servers whose templates overlap ev's and
// each other's: wide lists test://{+path} and test://dup/{a}, dup lists
// test://dup/{b}. Agent t declares its resource and prompt ceilings; its
// principal may read every upstream's resources and get ev's prompts.
const pipelineBundle = `
- {kind: Upstream, name: ev, transport: streamable-http, url: %s, tool_prefix: ev_}
- {kind: Upstream, name: wide, transport: streamable-http, url: %s, tool_prefix: wide_}
- {kind: Upstream, name: dup, transport: streamable-http, url: %s, tool_prefix: dup_}
- {kind: Tool, tool_id: tool:ev-test-simple-text, side_effect_class: read, source: {mcp_server: ev}}
- {kind: Tool, tool_id: tool:ev-test-sampling, side_effect_class: read, source: {mcp_server: ev}}
- kind: Agent
  agent_id: t
  version: 1.0.0
  tool_permissions:
    - {tool_id: tool:ev-test-simple-text, side_effect_class: read, approval_tier: auto}
    - {tool_id: tool:wide-ping, side_effect_class: read, approval_tier: auto}
    - {tool_id: tool:dup-ping, side_effect_class: read, approval_tier: auto}
  resource_permissions:
    - {upstream: ev, uri: "test://static-text"}
    - {upstream: ev, uri: "test://template/{id}/data", approval_tier: hitl}
    - {upstream: wide, uri: "test://{+path}"}
    - {upstream: dup, uri: "test://dup/{b}"}
  prompt_permissions:
    - {upstream: ev, prompt: test_prompt_with_arguments}
- kind: RuntimePolicy
  agent_id: t
  deployment_mode: production
  tool_authorization_policy: {active_tool_set: all}
- kind: Principal
  principal_id: user:t
  grants:
    - {resource: tool, action: invoke, scope: all}
    - {resource: mcp_resource, action: read, scope: {upstream: ev}}
    - {resource: mcp_resource, action: read, scope: {upstream: wide}}
    - {resource: mcp_resource, action: read, scope: {upstream: dup}}
    - {resource: prompt, action: get, scope: {upstream: ev}}
- kind: Credential
  name: t
  api_key_sha256: %x
  principal: user:t
  agent_id: t
`

// templateServer is an SDK server over Streamable HTTP on 127.0.0.1 with
// a tool ping and the given resource templates, whose reads answer with
// the server's name and the URI.
func templateServer(t *testing.T, name string, templates ...string) string {
	t.Helper()
	srv := mcp.NewServer(&mcp.Implementation{Name: name, Version: "1"}, nil)
	addEcho(srv, "ping")
	for _, tmpl := range templates {
		srv.AddResourceTemplate(&mcp.ResourceTemplate{Name: tmpl, URITemplate: tmpl},
			func(_ context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
				return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: req.Params.URI, Text: name + ":" + req.Params.URI}}}, nil
			})
	}
	ts := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil))
	t.Cleanup(ts.Close)
	return ts.URL
}

// pipelineCase is one request, as each enforcement point takes it: an
// MCP method and params; the same request to /v1/decide; the same to
// toolgate decide (nil: the CLI cannot ask it: offline it has no mirror
// of the upstreams' lists to route with, or it is no decision). want is
// the decision recorded (and what the CLI, the operator's view, prints);
// visible says whether the caller is shown it (else it is answered as
// nonexistent: over MCP the unknown tool, Resource not found or unknown
// prompt error, over /v1/decide the unknown_* code).
type pipelineCase struct {
	name       string
	method     string
	params     string
	decide     string
	cli        []string
	want       decided
	visible    bool
	forwarded  bool // an allowed MCP request also records its completion
	notDecided bool // refused at the edge (a method, a credential): no decide or CLI
}

type decided struct{ Verdict, Code, Layer string }

var pipelineCases = []pipelineCase{
	{name: "tool call allowed", method: "tools/call", params: `{"name":"ev_test_simple_text","arguments":{}}`,
		decide: `{"tool":"ev_test_simple_text"}`, cli: []string{"--tool", "ev_test_simple_text"},
		want: decided{"allow", "ok", ""}, visible: true, forwarded: true},
	{name: "tool call not in the ceiling", method: "tools/call", params: `{"name":"ev_test_sampling","arguments":{}}`,
		decide: `{"tool":"ev_test_sampling"}`, cli: []string{"--tool", "ev_test_sampling"},
		want: decided{"deny", "not_in_ceiling", "ceiling"}},
	{name: "tool call with a duplicate key", method: "tools/call", params: `{"name":"ev_test_simple_text","arguments":{"a":1,"a":2}}`,
		decide: `{"tool":"ev_test_simple_text","arguments":{"a":1,"a":2}}`, cli: []string{"--tool", "ev_test_simple_text", "--args", `{"a":1,"a":2}`},
		want: decided{"deny", "malformed_call", "composition"}, visible: true},
	{name: "resource read allowed", method: "resources/read", params: `{"uri":"test://static-text"}`,
		decide: `{"access":"resource_read","uri":"test://static-text"}`, cli: []string{"--access", "resource_read", "--upstream", "ev", "--uri", "test://static-text"},
		want: decided{"allow", "ok", ""}, visible: true, forwarded: true},
	{name: "resource read outside the ceiling", method: "resources/read", params: `{"uri":"test://static-binary"}`,
		decide: `{"access":"resource_read","uri":"test://static-binary"}`, cli: []string{"--access", "resource_read", "--upstream", "ev", "--uri", "test://static-binary"},
		want: decided{"deny", "not_in_ceiling", "ceiling"}},
	{name: "resource read: an escaped unreserved character", method: "resources/read", params: `{"uri":"test://static%2Dtext"}`,
		decide: `{"access":"resource_read","uri":"test://static%2Dtext"}`, cli: []string{"--access", "resource_read", "--upstream", "ev", "--uri", "test://static%2Dtext"},
		want: decided{"deny", "malformed_call", "composition"}, visible: true},
	{name: "resource read: an uppercase scheme", method: "resources/read", params: `{"uri":"TEST://static-text"}`,
		decide: `{"access":"resource_read","uri":"TEST://static-text"}`, cli: []string{"--access", "resource_read", "--upstream", "ev", "--uri", "TEST://static-text"},
		want: decided{"deny", "malformed_call", "composition"}, visible: true},
	{name: "resource read: an encoded dot-dot", method: "resources/read", params: `{"uri":"test://template/%2E%2E/secret"}`,
		decide: `{"access":"resource_read","uri":"test://template/%2E%2E/secret"}`, cli: []string{"--access", "resource_read", "--upstream", "ev", "--uri", "test://template/%2E%2E/secret"},
		want: decided{"deny", "malformed_call", "composition"}, visible: true},
	{name: "resource read needing a human", method: "resources/read", params: `{"uri":"test://template/5/data"}`,
		decide: `{"access":"resource_read","uri":"test://template/5/data"}`, cli: []string{"--access", "resource_read", "--upstream", "ev", "--uri", "test://template/5/data"},
		want: decided{"require_approval", "approval_required", "approval"}, visible: true},
	{name: "resource read: the wider template of another upstream", method: "resources/read", params: `{"uri":"test://other/x"}`,
		decide: `{"access":"resource_read","uri":"test://other/x"}`, cli: []string{"--access", "resource_read", "--upstream", "wide", "--uri", "test://other/x"},
		want: decided{"allow", "ok", ""}, visible: true, forwarded: true},
	{name: "resource read: two templates with one literal prefix (no owner)", method: "resources/read", params: `{"uri":"test://dup/x"}`,
		decide: `{"access":"resource_read","uri":"test://dup/x"}`,
		want:   decided{"deny", "unknown_resource", "composition"}},
	{name: "prompt get allowed", method: "prompts/get", params: `{"name":"ev_test_prompt_with_arguments","arguments":{"arg1":"a","arg2":"b"}}`,
		decide: `{"access":"prompt_get","prompt":"ev_test_prompt_with_arguments","arguments":{"arg1":"a","arg2":"b"}}`,
		cli:    []string{"--access", "prompt_get", "--upstream", "ev", "--prompt", "test_prompt_with_arguments", "--args", `{"arg1":"a","arg2":"b"}`},
		want:   decided{"allow", "ok", ""}, visible: true, forwarded: true},
	{name: "prompt get outside the ceiling", method: "prompts/get", params: `{"name":"ev_test_simple_prompt"}`,
		decide: `{"access":"prompt_get","prompt":"ev_test_simple_prompt"}`, cli: []string{"--access", "prompt_get", "--upstream", "ev", "--prompt", "test_simple_prompt"},
		want: decided{"deny", "not_in_ceiling", "ceiling"}},
	{name: "completion of a prompt argument", method: "completion/complete",
		params: `{"ref":{"type":"ref/prompt","name":"ev_test_prompt_with_arguments"},"argument":{"name":"arg1","value":"t"}}`,
		decide: `{"access":"prompt_complete","prompt":"ev_test_prompt_with_arguments","arguments":{"arg1":"t"}}`,
		cli:    []string{"--access", "prompt_complete", "--upstream", "ev", "--prompt", "test_prompt_with_arguments", "--args", `{"arg1":"t"}`},
		want:   decided{"allow", "ok", ""}, visible: true, forwarded: true},
	{name: "completion of a prompt outside the ceiling", method: "completion/complete",
		params: `{"ref":{"type":"ref/prompt","name":"ev_test_simple_prompt"},"argument":{"name":"x","value":"t"}}`,
		decide: `{"access":"prompt_complete","prompt":"ev_test_simple_prompt","arguments":{"x":"t"}}`,
		cli:    []string{"--access", "prompt_complete", "--upstream", "ev", "--prompt", "test_simple_prompt", "--args", `{"x":"t"}`},
		want:   decided{"deny", "not_in_ceiling", "ceiling"}},
	{name: "a method the gateway does not serve", method: "tools/destroy", params: `{}`,
		want: decided{"deny", "method_not_found", ""}, notDecided: true},
}

// TestOnePipeline is issue 8's table: each request through MCP (tool
// calls on both paths: the fast path, and with _meta the SDK path),
// /v1/decide and toolgate decide reaches the same decision (verdict, code
// and layer), is shown or hidden alike, and leaves exactly one decision
// record in the audit log (and a forwarded one its completion).
func TestOnePipeline(t *testing.T) {
	ev := testenv.StartEverythingServer(t, "")
	wide := templateServer(t, "wide", "test://{+path}", "test://dup/{a}")
	dup := templateServer(t, "dup", "test://dup/{b}")
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "bundle.yaml"), []byte(fmt.Sprintf(pipelineBundle, ev.URL, wide, dup, sha256sum(pipelineKey))), 0o644); err != nil {
		t.Fatal(err)
	}
	g := startLogged(t, dir, io.Discard)
	sid := rawSession(t, g.url, pipelineKey, "ev_test_simple_text", "wide_ping", "dup_ping")
	waitFor(t, "the mirrored templates", func() bool {
		_, body := rawPost(t, g.url, pipelineKey, sid, `{"jsonrpc":"2.0","id":3,"method":"resources/templates/list"}`)
		return strings.Contains(body, "test://dup/{b}") && strings.Contains(body, "test://{+path}") && strings.Contains(body, "test://template/{id}/data")
	})
	waitFor(t, "the mirrored prompts", func() bool {
		_, body := rawPost(t, g.url, pipelineKey, sid, `{"jsonrpc":"2.0","id":4,"method":"prompts/list"}`)
		return strings.Contains(body, "ev_test_prompt_with_arguments")
	})
	seen := len(g.events(t))
	// newEvents returns the events since the last call.
	newEvents := func() []audit.Event {
		all := g.events(t)
		out := all[seen:]
		seen = len(all)
		return out
	}
	// checkRecorded: exactly one decision record with the wanted verdict,
	// code and layer, and a completion when forwarded.
	checkRecorded := func(t *testing.T, via string, c pipelineCase, forwarded bool) {
		t.Helper()
		evs := newEvents()
		var decisions, completions []audit.Event
		for _, e := range evs {
			switch e.EventType {
			case "agent.tool.completed", "agent.tool.failed":
				completions = append(completions, e)
			default:
				decisions = append(decisions, e)
			}
		}
		if len(decisions) != 1 {
			var types []string
			for _, e := range evs {
				types = append(types, e.EventType+" "+e.Code)
			}
			t.Fatalf("%s: %d decision records (%v), want exactly one", via, len(decisions), types)
		}
		got := decided{decisions[0].Verdict, decisions[0].Code, decisions[0].Layer}
		if c.notDecided {
			got.Layer = ""
		}
		if got != c.want {
			t.Errorf("%s recorded %+v, want %+v (%s)", via, got, c.want, decisions[0].Reason)
		}
		if want := map[bool]int{true: 1}[forwarded]; len(completions) != want {
			t.Errorf("%s: %d completion records, want %d", via, len(completions), want)
		}
	}

	for i, c := range pipelineCases {
		t.Run(c.name, func(t *testing.T) {
			// MCP; a tool call on both paths.
			shapes := []string{c.params}
			if c.method == "tools/call" {
				shapes = append(shapes, strings.Replace(c.params, `"arguments"`, `"_meta":{"progressToken":"p"},"arguments"`, 1))
			}
			for j, params := range shapes {
				via := map[int]string{0: "MCP", 1: "MCP (SDK path)"}[j]
				resp, body := rawPost(t, g.url, pipelineKey, sid, fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":%q,"params":%s}`, 100+i, c.method, params))
				checkMCPAnswer(t, via, c, resp.StatusCode, body)
				checkRecorded(t, via, c, c.forwarded)
			}
			if c.notDecided {
				return
			}
			// The JSON API.
			status, body := postJSON(t, g.apiURL()+"/v1/decide", pipelineKey, c.decide)
			var dr struct {
				Verdict, Code, Layer string
				Decision             struct{ Verdict, Code, Layer string }
			}
			if err := json.Unmarshal([]byte(body), &dr); err != nil {
				t.Fatalf("/v1/decide: HTTP %d %s", status, body)
			}
			shownAPI := decided{dr.Verdict, dr.Code, dr.Layer}
			if dr.Verdict == "" {
				shownAPI = decided{dr.Decision.Verdict, dr.Decision.Code, dr.Decision.Layer}
			}
			if c.visible && shownAPI != c.want {
				t.Errorf("/v1/decide shows %+v, want %+v (%s)", shownAPI, c.want, body)
			}
			if !c.visible && (shownAPI.Verdict != "deny" || !strings.HasPrefix(shownAPI.Code, "unknown_")) {
				t.Errorf("/v1/decide shows %+v for what the caller is not shown; want an unknown_* denial (%s)", shownAPI, body)
			}
			checkRecorded(t, "/v1/decide", c, false)
			// The CLI (offline: the operator's view, recording nothing).
			if c.cli == nil {
				return
			}
			var out, errb bytes.Buffer
			args := append([]string{"decide", "--bundle", dir, "--agent", "t", "--principal", "user:t", "-o", "json"}, c.cli...)
			cli.Run(context.Background(), args, strings.NewReader(""), &out, &errb)
			var cd decided
			if err := json.Unmarshal(out.Bytes(), &cd); err != nil {
				t.Fatalf("toolgate %s: %v\nstdout %s\nstderr %s", strings.Join(args, " "), err, out.String(), errb.String())
			}
			if cd != c.want {
				t.Errorf("toolgate decide prints %+v, want %+v (%s)", cd, c.want, out.String())
			}
			if evs := newEvents(); len(evs) != 0 {
				t.Errorf("toolgate decide left %d records in the gateway's log", len(evs))
			}
		})
	}

	// A failed authentication, on each transport: one record each.
	t.Run("a wrong credential", func(t *testing.T) {
		resp, _ := rawPost(t, g.url, "wrong-key", "", `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`)
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("MCP: HTTP %d, want 401", resp.StatusCode)
		}
		checkAuthRecorded(t, newEvents(), "mcp")
		status, _ := postJSON(t, g.apiURL()+"/v1/decide", "wrong-key", `{"tool":"ev_test_simple_text"}`)
		if status != http.StatusUnauthorized {
			t.Errorf("/v1/decide: HTTP %d, want 401", status)
		}
		checkAuthRecorded(t, newEvents(), "http")
	})
}

func checkAuthRecorded(t *testing.T, evs []audit.Event, via string) {
	t.Helper()
	if len(evs) != 1 || evs[0].EventType != "gateway.auth.refused" || evs[0].Verdict != "deny" {
		var types []string
		for _, e := range evs {
			types = append(types, e.EventType)
		}
		t.Errorf("%s: records %v, want one gateway.auth.refused", via, types)
	}
}

// checkMCPAnswer checks what an MCP client is told: a visible refusal
// names its code (an isError tool result with the decision in _meta, or
// an error whose data holds it); what it is not shown is the error of a
// nonexistent tool, resource or prompt; an allow is a result.
func checkMCPAnswer(t *testing.T, via string, c pipelineCase, status int, body string) {
	t.Helper()
	if i := strings.Index(body, "data: "); i >= 0 && strings.HasPrefix(body, "event:") {
		body = strings.TrimSpace(body[i+len("data: "):])
	}
	var msg struct {
		Result *struct {
			IsError bool           `json:"isError"`
			Meta    map[string]any `json:"_meta"`
		}
		Error *struct {
			Code    int
			Message string
			Data    json.RawMessage
		}
	}
	if err := json.Unmarshal([]byte(body), &msg); err != nil {
		t.Fatalf("%s: HTTP %d, not a JSON-RPC answer: %.300s", via, status, body)
	}
	switch {
	case c.notDecided:
		if msg.Error == nil || msg.Error.Code != -32601 {
			t.Errorf("%s: %.300s, want method not found", via, body)
		}
	case c.want.Verdict == "allow":
		if msg.Error != nil || msg.Result == nil || msg.Result.IsError {
			t.Errorf("%s: %.300s, want a result", via, body)
		}
	case !c.visible:
		wantMsg := map[string]string{"tools/call": "unknown tool", "resources/read": "Resource not found", "prompts/get": "unknown prompt", "completion/complete": "unknown prompt"}[c.method]
		if msg.Error == nil || !strings.Contains(msg.Error.Message, wantMsg) {
			t.Errorf("%s: %.300s, want the %q error", via, body, wantMsg)
		}
	case c.method == "tools/call":
		if msg.Result == nil || !msg.Result.IsError || !strings.Contains(body, `"code":"`+c.want.Code+`"`) {
			t.Errorf("%s: %.300s, want an isError result with code %s", via, body, c.want.Code)
		}
	default:
		if msg.Error == nil || msg.Error.Code != -32001 || !strings.Contains(string(msg.Error.Data), `"code":"`+c.want.Code+`"`) {
			t.Errorf("%s: %.300s, want an access refusal with code %s", via, body, c.want.Code)
		}
	}
}

// postJSON posts body to url with key and returns the status and body.
func postJSON(t *testing.T, url, key, body string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
