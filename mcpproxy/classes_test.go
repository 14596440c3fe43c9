package mcpproxy

// Issue 7: finding 5 (logging/setLevel), finding 14 (session caps), and
// table tests of the classes "Anonymous is not shared", "Only the
// allow-list is safe" and "Decide on exactly what runs" (the envelope),
// each probing several places of the enforcement point.

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolgate/toolgate/approval"
	"github.com/toolgate/toolgate/audit"
	"github.com/toolgate/toolgate/gate"
	"github.com/toolgate/toolgate/store/sqlite"
)

// TestSetLevelReachesOnlyReachableUpstreams (issue 7, finding 5): a
// client's logging/setLevel reaches only the upstreams it may reach; each
// upstream gets the most verbose level of the clients that may reach it;
// and a message an upstream logs about itself reaches only the clients
// that may reach it and asked for that level.
func TestSetLevelReachesOnlyReachableUpstreams(t *testing.T) {
	one := startGoUpstream(t, "one", upstreamOpts{tools: []string{"x"}, logging: true})
	two := startGoUpstream(t, "two", upstreamOpts{tools: []string{"y"}, logging: true})
	url := serveProxy(t, multiBundle([]*goUpstream{one, two}, []agentSpec{
		{key: "key-one", agent: "a1", tools: []string{"tool:one-x"}},
		{key: "key-two", agent: "a2", tools: []string{"tool:two-y"}},
		{key: "key-quiet", agent: "a3", tools: []string{"tool:one-x"}},
	}, ""))
	a := connectClient(t, url, "key-one", declare{})
	b := connectClient(t, url, "key-two", declare{})
	q := connectClient(t, url, "key-quiet", declare{})
	waitTools(t, a.cs, 1)
	waitTools(t, b.cs, 1)
	waitTools(t, q.cs, 1)
	ctx := context.Background()
	levels := func(u *goUpstream) []string { _, _, _, l := u.got(); return l }

	if err := q.cs.SetLoggingLevel(ctx, &mcp.SetLoggingLevelParams{Level: "error"}); err != nil {
		t.Fatal(err)
	}
	if err := a.cs.SetLoggingLevel(ctx, &mcp.SetLoggingLevelParams{Level: "debug"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "upstream one set to debug", func() bool { return slices.Contains(levels(one), "debug") })
	if got := levels(two); len(got) != 0 {
		t.Errorf("upstream two, which neither client may reach, got levels %q", got)
	}
	if err := b.cs.SetLoggingLevel(ctx, &mcp.SetLoggingLevelParams{Level: "warning"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "upstream two set to warning", func() bool { return slices.Equal(levels(two), []string{"warning"}) })
	if got := levels(one); !slices.Equal(got, []string{"error", "debug"}) {
		t.Errorf("upstream one got levels %q, want [error debug] (b's warning is not its)", got)
	}

	// A message upstream one logs about itself (no request in flight).
	for ss := range one.srv.Sessions() {
		ss.Log(ctx, &mcp.LoggingMessageParams{Level: "info", Data: "one's own news"})
	}
	select {
	case <-a.gotLog:
	case <-time.After(10 * time.Second):
		t.Fatal("a did not get upstream one's info message")
	}
	time.Sleep(300 * time.Millisecond) // any misrouted copy would have arrived by now
	for name, c := range map[string]*client{"b (may not reach one)": b, "q (asked for error only)": q} {
		c.mu.Lock()
		if len(c.logs) != 0 {
			t.Errorf("%s got %d log messages of upstream one", name, len(c.logs))
		}
		c.mu.Unlock()
	}
}

// TestSessionCaps (issue 7, finding 14): one authority (here: one key of
// one principal and agent) holds at most MaxSessionsPerAuthority sessions
// (a new one closes its own longest-idle session; with none idle it is
// refused, 429), and all together at most MaxSessions (503); another
// authority's sessions are never closed.
func TestSessionCaps(t *testing.T) {
	up := startGoUpstream(t, "docs", upstreamOpts{tools: []string{"find"}})
	bundle := multiBundle([]*goUpstream{up}, []agentSpec{
		{key: "key-a", agent: "a", tools: []string{"tool:docs-find"}},
		{key: "key-b", agent: "b", tools: []string{"tool:docs-find"}},
	}, "")
	initialize := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`
	alive := func(url, key, sid string) bool {
		resp, _ := post(t, url, key, sid, `{"jsonrpc":"2.0","id":2,"method":"ping"}`)
		return resp.StatusCode == http.StatusOK
	}

	t.Run("per credential", func(t *testing.T) {
		url, p := serveProxyEnv(t, bundle, proxyEnv{opts: &Options{MaxSessionsPerAuthority: 3, MaxSessions: 100}})
		b := openRaw(t, url, "key-b")
		var a []string
		for i := 0; i < 40; i++ {
			a = append(a, openRaw(t, url, "key-a"))
			time.Sleep(2 * time.Millisecond) // distinct idle times
		}
		waitFor(t, "key-a down to 3 sessions", func() bool {
			_, by := p.Sessions()
			return by[authorityKey(gate.Identity{Principal: "user:t", AgentID: "a"})] == 3
		})
		for i, sid := range a[:37] {
			if alive(url, "key-a", sid) {
				t.Errorf("session %d of 40 of key-a is still open; only the 3 newest should be", i)
			}
		}
		for _, sid := range a[37:] {
			if !alive(url, "key-a", sid) {
				t.Errorf("one of the 3 newest sessions of key-a was closed")
			}
		}
		if !alive(url, "key-b", b) {
			t.Errorf("key-b's session was closed to make room for key-a's")
		}
		// With a stream open on each of its sessions, none is idle: refused.
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		for _, sid := range a[37:] {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
			req.Header.Set("Accept", "text/event-stream")
			req.Header.Set("Authorization", "Bearer key-a")
			req.Header.Set("Mcp-Session-Id", sid)
			req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
			resp, err := http.DefaultClient.Do(req)
			if err != nil || resp.StatusCode != http.StatusOK {
				t.Fatalf("GET stream: %v %v", err, resp)
			}
			defer resp.Body.Close()
		}
		resp, body := post(t, url, "key-a", "", initialize)
		if resp.StatusCode != http.StatusTooManyRequests || !strings.Contains(body, "maximum of 3 sessions") {
			t.Errorf("a 4th session with none idle: HTTP %d %s, want 429", resp.StatusCode, body)
		}
	})

	t.Run("total", func(t *testing.T) {
		url, _ := serveProxyEnv(t, bundle, proxyEnv{opts: &Options{MaxSessionsPerAuthority: 10, MaxSessions: 4}})
		var all []string
		for i := 0; i < 3; i++ {
			all = append(all, openRaw(t, url, "key-a"))
		}
		all = append(all, openRaw(t, url, "key-b"))
		resp, body := post(t, url, "key-b", "", initialize)
		if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" || !strings.Contains(body, "maximum of 4 sessions") {
			t.Errorf("a 5th session: HTTP %d %v %s, want 503 with Retry-After", resp.StatusCode, resp.Header, body)
		}
		for i, sid := range all {
			key := "key-a"
			if i == 3 {
				key = "key-b"
			}
			if !alive(url, key, sid) {
				t.Errorf("session %d was closed to make room", i)
			}
		}
	})
}

// anonBundle: the echo tool of upstream rec needs a human's approval;
// requests without a credential run as user:anon (Settings.anonymous);
// user:lead may decide approvals; key-a is a credential of user:t.
func anonBundle(up *recordingUpstream) string {
	return fmt.Sprintf(`
- kind: Upstream
  name: rec
  transport: streamable-http
  url: %s
  tool_prefix: ""
- kind: Settings
  anonymous: {principal: "user:anon", agent_id: a, deployment_mode: production}
- kind: Agent
  agent_id: a
  version: 1.0.0
  runtime_engine: go
  tool_permissions:
    - {tool_id: tool:rec-echo, side_effect_class: write, approval_tier: hitl}
- kind: RuntimePolicy
  agent_id: a
  deployment_mode: production
  tool_authorization_policy:
    active_tool_set: all
- kind: Principal
  principal_id: user:anon
  grants: [{resource: tool, action: invoke, scope: all}]
- kind: Principal
  principal_id: user:t
  grants: [{resource: tool, action: invoke, scope: all}]
- kind: Principal
  principal_id: user:lead
  grants: [{resource: approval, action: decide, scope: all}]
- kind: Credential
  name: a
  api_key_sha256: %s
  principal: user:t
  agent_id: a
  deployment_mode: production
`, up.URL, sha256hex("key-a"))
}

// callRaw posts a tools/call of tool with args in session sid (as key;
// "" for none), on the fast path or, with a progress token, the SDK path,
// and returns the HTTP status and the JSON-RPC message answered.
func callRaw(t *testing.T, url, key, sid, tool, args string, sdk bool, id int) (int, string) {
	t.Helper()
	params := `{"name":` + string(mustJSON(tool)) + `,"arguments":` + args
	if sdk {
		params += `,"_meta":{"progressToken":"p` + fmt.Sprint(id) + `"}`
	}
	resp, body := post(t, url, key, sid, fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":%s}}`, id, params))
	return resp.StatusCode, sseData(body)
}

// approvalIn is the approval id a refusal names, or "".
func approvalIn(msg string) string {
	i := strings.Index(msg, `"approval_id":"`)
	if i < 0 {
		return ""
	}
	rest := msg[i+len(`"approval_id":"`):]
	return rest[:strings.IndexByte(rest, '"')]
}

// TestAnonymousIsNotShared (class "Anonymous is not shared"): with
// Settings.anonymous, each anonymous client is its own party. Probed in
// several places: an approval (both paths), the session's streams and
// requests (the SDK path, the fast path, GET, DELETE) against a
// credential, the approvals list, and the JSON API (no session: no
// approval).
func TestAnonymousIsNotShared(t *testing.T) {
	up := startRecording(t)
	store, err := sqlite.Open(filepath.Join(t.TempDir(), "tg.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	url, p := serveProxyEnv(t, anonBundle(up), proxyEnv{approvals: store})
	a := openRaw2(t, url, "", "echo")
	b := openRaw2(t, url, "", "echo")
	keyed := openRaw2(t, url, "key-a", "echo")
	ctx := context.Background()

	for i, sdk := range []bool{false, true} {
		path := map[bool]string{false: "fast", true: "sdk"}[sdk]
		args := fmt.Sprintf(`{"n":%d}`, i)
		_, msg := callRaw(t, url, "", a, "echo", args, sdk, 10+i)
		id := approvalIn(msg)
		if id == "" {
			t.Fatalf("%s: a's call did not ask for approval: %s", path, msg)
		}
		if _, err := p.g.DecideApproval(ctx, id, true, "user:lead", "ok", "test"); err != nil {
			t.Fatal(err)
		}
		before := len(up.received())
		_, msg = callRaw(t, url, "", b, "echo", args, sdk, 20+i)
		if other := approvalIn(msg); other == "" || other == id || len(up.received()) != before {
			t.Errorf("%s: anonymous b repeating a's approved call: %s (upstream got %d calls); want a new approval and nothing run", path, msg, len(up.received())-before)
		}
		_, msg = callRaw(t, url, "key-a", keyed, "echo", args, sdk, 30+i)
		if other := approvalIn(msg); other == "" || other == id {
			t.Errorf("%s: a credential repeating a's approved call: %s; want a new approval", path, msg)
		}
		_, msg = callRaw(t, url, "", a, "echo", args, sdk, 40+i)
		if !strings.Contains(msg, `"text":"{\"n\":`+fmt.Sprint(i)+`}"`) || len(up.received()) != before+1 {
			t.Errorf("%s: a repeating its own approved call: %s; want it run once", path, msg)
		}
	}

	// The approvals list shows a digest of the session, never its id.
	all, err := store.ListApprovals(ctx, approval.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	for _, ap := range all {
		if strings.Contains(ap.RequestedBy, a) || strings.Contains(ap.RequestedBy, b) {
			t.Errorf("approval %s shows a session id in requested_by %q", ap.ID, ap.RequestedBy)
		}
	}

	// A credential cannot use an anonymous session, and no anonymous
	// request can use a credential's.
	raw := func(method, key, sid, body string) int {
		req, _ := http.NewRequest(method, url, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
		req.Header.Set("Mcp-Session-Id", sid)
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		resp, err := http.DefaultClient.Do(req.WithContext(ctx))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	list := `{"jsonrpc":"2.0","id":5,"method":"tools/list"}`
	call := `{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":"echo","arguments":{"n":9}}}`
	before := len(up.received())
	for _, tc := range []struct {
		name, method, key, sid, body string
	}{
		{"credential posts into an anonymous session (SDK)", http.MethodPost, "key-a", a, list},
		{"credential calls in an anonymous session (fast path)", http.MethodPost, "key-a", a, call},
		{"credential reads an anonymous session's stream", http.MethodGet, "key-a", a, ""},
		{"credential deletes an anonymous session", http.MethodDelete, "key-a", a, ""},
		{"anonymous posts into a credential's session", http.MethodPost, "", keyed, list},
		{"anonymous deletes a credential's session", http.MethodDelete, "", keyed, ""},
	} {
		if got := raw(tc.method, tc.key, tc.sid, tc.body); got != http.StatusForbidden {
			t.Errorf("%s: HTTP %d, want 403", tc.name, got)
		}
	}
	if n := len(up.received()) - before; n != 0 {
		t.Errorf("refused requests ran %d calls", n)
	}

	// Over the JSON API there is no session: an anonymous call that needs
	// approval neither creates nor uses one.
	anon, _ := p.g.Credentials().Identify("")
	out := p.g.Decide(ctx, gate.Request{Identity: anon, Tool: "echo", Args: json.RawMessage(`{"n":0}`), Via: "http"})
	if out.ApprovalID != "" || !strings.Contains(out.Decision.Reason, "not queued") {
		t.Errorf("anonymous call without a session: approval %q, reason %q; want none, not queued", out.ApprovalID, out.Decision.Reason)
	}
}

func sha256hex(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// methodEnv is a proxy over an upstream that records every message it
// receives, with an audit recorder of its own.
type methodEnv struct {
	url, sid string
	p        *Proxy
	store    *memStore
	rec      *audit.Recorder
	upMu     sync.Mutex
	upBodies []string
	// noisy, when set, answers tools/call of "noisy": what it writes
	// before the result.
	noisy []string
}

func (e *methodEnv) upstreamGot() []string {
	e.upMu.Lock()
	defer e.upMu.Unlock()
	return slices.Clone(e.upBodies)
}

func newMethodEnv(t *testing.T) *methodEnv {
	e := &methodEnv{store: &memStore{}}
	srv := mcp.NewServer(&mcp.Implementation{Name: "rec", Version: "1"}, nil)
	for _, n := range []string{"echo", "noisy"} {
		srv.AddTool(&mcp.Tool{Name: n, InputSchema: map[string]any{"type": "object"}},
			func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
				return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "ran"}}}, nil
			})
	}
	sdk := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil)
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			body, _ := io.ReadAll(r.Body)
			e.upMu.Lock()
			e.upBodies = append(e.upBodies, string(body))
			e.upMu.Unlock()
			var m struct {
				ID     json.RawMessage `json:"id"`
				Method string          `json:"method"`
				Params struct {
					Name string `json:"name"`
				} `json:"params"`
			}
			json.Unmarshal(body, &m)
			if m.Method == "tools/call" && m.Params.Name == "noisy" {
				sse(w)
				for _, msg := range e.noisy {
					fmt.Fprintf(w, "event: message\ndata: %s\n\n", msg)
				}
				fmt.Fprintf(w, "event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":%s,\"result\":{\"content\":[{\"type\":\"text\",\"text\":\"noisy done\"}]}}\n\n", m.ID)
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
		}
		sdk.ServeHTTP(w, r)
	}))
	t.Cleanup(ts.Close)
	e.rec = audit.NewRecorder(e.store, nil)
	e.url, e.p = serveProxyEnv(t, agentBundle(evUpstream(ts.URL), []string{"echo", "noisy"}, ""), proxyEnv{rec: e.rec})
	e.sid = openRaw2(t, e.url, testKeys[0], "noisy")
	return e
}

// events returns the committed events of type typ.
func (e *methodEnv) events(t *testing.T, typ string) []audit.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	e.rec.Flush(ctx)
	e.store.mu.Lock()
	defer e.store.mu.Unlock()
	var out []audit.Event
	for _, ev := range e.store.evs {
		if ev.EventType == typ {
			out = append(out, ev)
		}
	}
	return out
}

// TestOnlyAllowedMethods (class "Only the allow-list is safe"): a client
// may send only the methods the gateway serves; anything else is refused
// as method not found, reaches no upstream, and is recorded. Of what an
// upstream sends on a call's stream, only relayed methods reach the
// client; other requests are answered method not found.
func TestOnlyAllowedMethods(t *testing.T) {
	e := newMethodEnv(t)
	before := len(e.upstreamGot())
	cases := []struct {
		name, body string
		status     int
	}{
		{"server/discover", `{"jsonrpc":"2.0","id":1,"method":"server/discover"}`, 200},
		{"subscriptions/listen", `{"jsonrpc":"2.0","id":2,"method":"subscriptions/listen","params":{}}`, 200},
		{"tasks/list", `{"jsonrpc":"2.0","id":3,"method":"tasks/list","params":{}}`, 200},
		{"a method differing by case", `{"jsonrpc":"2.0","id":4,"method":"Tools/call","params":{"name":"echo","arguments":{}}}`, 200},
		{"a method with a trailing space", `{"jsonrpc":"2.0","id":5,"method":"tools/list ","params":{}}`, 200},
		{"a client→server use of a server→client method", `{"jsonrpc":"2.0","id":6,"method":"sampling/createMessage","params":{"messages":[],"maxTokens":1}}`, 200},
		{"roots/list sent to the server", `{"jsonrpc":"2.0","id":7,"method":"roots/list"}`, 200},
		{"an unknown notification", `{"jsonrpc":"2.0","method":"notifications/tasks/status","params":{}}`, 400},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := post(t, e.url, testKeys[0], e.sid, tc.body)
			if resp.StatusCode != tc.status || !strings.Contains(body, `"code":-32601`) {
				t.Errorf("HTTP %d %s; want %d with method not found (-32601)", resp.StatusCode, body, tc.status)
			}
		})
	}
	if got := e.upstreamGot()[before:]; len(got) != 0 {
		t.Errorf("refused methods reached the upstream: %q", got)
	}
	if evs := e.events(t, "gateway.method.refused"); len(evs) != len(cases) {
		t.Errorf("%d gateway.method.refused events, want %d", len(evs), len(cases))
	}

	// The upstream's direction, on a fast call's stream.
	e.noisy = []string{
		`{"jsonrpc":"2.0","id":"u1","method":"tasks/get","params":{}}`,
		`{"jsonrpc":"2.0","id":"u2","method":"ROOTS/list"}`,
		`{"jsonrpc":"2.0","id":"u3","method":"ping","method":"sampling/createMessage","params":{}}`,
		`{"jsonrpc":"2.0","method":"notifications/tools/updated","params":{"x":1}}`,
		`{"jsonrpc":"2.0","method":"notifications/message","Method":"x","params":{"level":"error","data":"x"}}`,
	}
	before = len(e.upstreamGot())
	resp, body := post(t, e.url, testKeys[0], e.sid, `{"jsonrpc":"2.0","id":50,"method":"tools/call","params":{"name":"noisy","arguments":{}}}`)
	if resp.Header.Get("Content-Type") != "application/json" || !strings.Contains(body, "noisy done") || strings.Contains(body, "tasks/get") {
		t.Errorf("the client got more than the result: %q %s", resp.Header.Get("Content-Type"), body)
	}
	waitFor(t, "the upstream's requests answered", func() bool {
		got := strings.Join(e.upstreamGot()[before:], "\n")
		return strings.Count(got, `"error"`) >= 3
	})
	got := strings.Join(e.upstreamGot()[before:], "\n")
	for _, id := range []string{`"u1"`, `"u2"`, `"u3"`} {
		if !strings.Contains(got, `"id":`+id) {
			t.Errorf("the upstream's request %s was not answered with an error: %s", id, got)
		}
	}
	if strings.Contains(got, `"id":"u3","result"`) {
		t.Errorf("the ambiguous request u3 was served: %s", got)
	}
}

// TestEnvelopeIsReadOneWay (class "Decide on exactly what runs", the
// envelope): a message that two readers could read differently is refused
// (HTTP 400) before anything is decided or forwarded, wherever in the
// envelope or its params the ambiguity is.
func TestEnvelopeIsReadOneWay(t *testing.T) {
	e := newMethodEnv(t)
	before := len(e.upstreamGot())
	cases := []struct{ name, body string }{
		{"duplicate method", `{"jsonrpc":"2.0","id":1,"method":"ping","method":"tools/call","params":{"name":"echo","arguments":{}}}`},
		{"method twin by case", `{"jsonrpc":"2.0","id":2,"method":"tools/call","Method":"ping","params":{"name":"echo","arguments":{}}}`},
		{"duplicate id", `{"jsonrpc":"2.0","id":3,"id":"x","method":"tools/call","params":{"name":"echo","arguments":{}}}`},
		{"duplicate tool name", `{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"nothing","name":"echo","arguments":{}}}`},
		{"tool name twin by case", `{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"Name":"nothing","name":"echo","arguments":{}}}`},
		{"duplicate arguments member", `{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":"echo","arguments":{},"arguments":{"a":1}}}`},
		{"duplicate key in _meta", `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"echo","arguments":{},"_meta":{"progressToken":1,"progressToken":2}}}`},
		{"lone surrogate in the method", `{"jsonrpc":"2.0","id":8,"method":"tools/call\ud800","params":{"name":"echo","arguments":{}}}`},
		{"invalid UTF-8 in the name", "{\"jsonrpc\":\"2.0\",\"id\":9,\"method\":\"tools/call\",\"params\":{\"name\":\"ech\xff\",\"arguments\":{}}}"},
		{"unknown top-level member", `{"jsonrpc":"2.0","id":10,"method":"tools/call","params":{"name":"echo","arguments":{}},"extra":1}`},
		{"id no float64 holds", `{"jsonrpc":"2.0","id":18446744073709551617,"method":"tools/call","params":{"name":"echo","arguments":{}}}`},
		{"duplicate key in a response", `{"jsonrpc":"2.0","id":"toolgate-x","result":{"a":1,"a":2}}`},
		{"duplicate key in resources/read params", `{"jsonrpc":"2.0","id":12,"method":"resources/read","params":{"uri":"a","uri":"b"}}`},
		{"request and response at once", `{"jsonrpc":"2.0","id":13,"method":"ping","result":{}}`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fast, sdk := e.p.CallPaths()
			resp, body := post(t, e.url, testKeys[0], e.sid, tc.body)
			if resp.StatusCode != http.StatusBadRequest {
				t.Errorf("HTTP %d %s, want 400", resp.StatusCode, body)
			}
			if f, s := e.p.CallPaths(); f != fast || s != sdk {
				t.Errorf("the message was served as a call")
			}
		})
	}
	if got := e.upstreamGot()[before:]; len(got) != 0 {
		t.Errorf("refused messages reached the upstream: %q", got)
	}
	if evs := e.events(t, "agent.tool.unauthorized"); len(evs) != 0 {
		t.Errorf("refused messages were decided: %d events", len(evs))
	}
	// Arguments are the decision's to judge: refused as malformed_call,
	// recorded (mcpproxy/args_test.go has the table).
	_, body := post(t, e.url, testKeys[0], e.sid, `{"jsonrpc":"2.0","id":20,"method":"tools/call","params":{"name":"echo","arguments":{"a":1,"a":2}}}`)
	if !strings.Contains(body, "malformed_call") {
		t.Errorf("duplicate argument keys: %s, want a malformed_call refusal", body)
	}
}
