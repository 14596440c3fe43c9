package mcpproxy

// Regression tests from a review of the fast path by an engineer who had not
// seen it: upstream messages sent outside a fast call's stream are
// attributed as on the SDK path (never to another client), a client that
// stops reading cannot hold a call, stream resumption is bounded, an
// upstream's ping flood is paced, malformed results are not passed through,
// and another credential's requests keep no session alive. The upstreams
// are Go SDK servers on 127.0.0.1; "evil" ones answer tools/call with what
// a test writes.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolgate/toolgate/adapter/mcptool"
	"github.com/toolgate/toolgate/approval"
	"github.com/toolgate/toolgate/audit"
	"github.com/toolgate/toolgate/authz"
	"github.com/toolgate/toolgate/gate"
	"github.com/toolgate/toolgate/identity"
	"github.com/toolgate/toolgate/internal/testenv"
	"github.com/toolgate/toolgate/policy"
	"github.com/toolgate/toolgate/upstream"
)

// reviewBundle: upstream "ev" at url, the agent's ceiling holds exactly tools
// (upstream tool names), both test keys as in bundleFor.
func reviewBundle(url string, tools ...string) string { return agentBundle(evUpstream(url), tools, "") }

// jsonResponseUpstream is a Go SDK server whose Streamable HTTP handler
// answers with application/json (StreamableHTTPOptions.JSONResponse), so it
// sends everything but responses (log messages, sampling requests) on the
// session's standalone GET stream, as the SDK documents.
func jsonResponseUpstream(t *testing.T, slowRelease chan struct{}) string {
	srv := mcp.NewServer(&mcp.Implementation{Name: "jsonresp", Version: "1"}, &mcp.ServerOptions{
		Capabilities: &mcp.ServerCapabilities{Logging: &mcp.LoggingCapabilities{}, Tools: &mcp.ToolCapabilities{}},
	})
	type askArgs struct {
		Secret string `json:"secret"`
	}
	mcp.AddTool(srv, &mcp.Tool{Name: "ask"}, func(ctx context.Context, req *mcp.CallToolRequest, a askArgs) (*mcp.CallToolResult, any, error) {
		res, err := req.Session.CreateMessage(ctx, &mcp.CreateMessageParams{MaxTokens: 10,
			Messages: []*mcp.SamplingMessage{{Role: "user", Content: &mcp.TextContent{Text: a.Secret}}}})
		if err != nil {
			return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: "sampling failed: " + err.Error()}}}, nil, nil
		}
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "answer: " + res.Content.(*mcp.TextContent).Text}}}, nil, nil
	})
	mcp.AddTool(srv, &mcp.Tool{Name: "logit"}, func(ctx context.Context, req *mcp.CallToolRequest, a askArgs) (*mcp.CallToolResult, any, error) {
		req.Session.Log(ctx, &mcp.LoggingMessageParams{Level: "info", Data: "private log of the caller: " + a.Secret})
		time.Sleep(50 * time.Millisecond)
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "logged"}}}, nil, nil
	})
	mcp.AddTool(srv, &mcp.Tool{Name: "slow"}, func(ctx context.Context, req *mcp.CallToolRequest, _ any) (*mcp.CallToolResult, any, error) {
		select {
		case <-slowRelease:
		case <-ctx.Done():
		}
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "slow done"}}}, nil, nil
	})
	ts := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv },
		&mcp.StreamableHTTPOptions{JSONResponse: true}))
	t.Cleanup(ts.Close)
	return ts.URL
}

// serveProxyT is serveProxyP with an upstream call timeout.
func serveProxyT(t *testing.T, bundleYAML string, callTimeout time.Duration) (string, *Proxy) {
	return serveProxyR(t, bundleYAML, callTimeout, nil)
}

// serveProxyR compiles the bundle, connects its upstreams (each call bounded
// by callTimeout; 0 is the default) with the pass-through handlers, mirrors
// their tools as the gateway does, and serves the proxy on 127.0.0.1,
// recording decisions with rec (nil: none). It returns the MCP URL and the
// Proxy.
func serveProxyR(t *testing.T, bundleYAML string, callTimeout time.Duration, rec *audit.Recorder) (string, *Proxy) {
	t.Helper()
	return serveProxyEnv(t, bundleYAML, proxyEnv{callTimeout: callTimeout, rec: rec})
}

// proxyEnv is what serveProxyEnv builds a Proxy with: the upstream call
// timeout (0: the default), the audit recorder and the approval store
// (nil: none), and the Proxy's options (nil: the defaults).
type proxyEnv struct {
	callTimeout time.Duration
	rec         *audit.Recorder
	approvals   approval.Store
	opts        *Options
	// observer measures the executor's upstream calls (nil: none).
	observer mcptool.Observer
}

// serveProxyEnv is serveProxyR with everything env says.
func serveProxyEnv(t *testing.T, bundleYAML string, env proxyEnv) (string, *Proxy) {
	t.Helper()
	callTimeout, rec := env.callTimeout, env.rec
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "bundle.yaml"), []byte(bundleYAML), 0o600); err != nil {
		t.Fatal(err)
	}
	b, err := policy.LoadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	snap, _, err := authz.Compile(b, nil)
	if err != nil {
		t.Fatal(err)
	}
	ex := &gate.Executor{}
	g := gate.New(snap, &gate.Options{Recorder: rec, Approvals: env.approvals, Executor: ex})
	var (
		p         *Proxy
		mu        sync.Mutex
		announced = map[string][]authz.AnnouncedTool{}
		cfgs      []upstream.Config
	)
	for _, u := range b.Upstreams {
		cfgs = append(cfgs, upstream.Config{Name: u.Name, Transport: u.Transport, Command: u.Command, Args: u.Args, URL: u.URL, CallTimeout: callTimeout})
	}
	o := &upstream.Options{OnChange: func(name string, tools []*mcp.Tool) {
		mu.Lock()
		defer mu.Unlock()
		i := slices.IndexFunc(b.Upstreams, func(u *policy.Upstream) bool { return u.Name == name })
		accepted, _ := mcptool.Announced(b.Upstreams[i], tools)
		announced[name] = accepted
		var all []authz.AnnouncedTool
		for _, u := range b.Upstreams {
			all = append(all, announced[u.Name]...)
		}
		snap, _, err := authz.Compile(b, &authz.Options{Announced: all})
		if err != nil {
			t.Errorf("compile with announced tools: %v", err)
			return
		}
		g.Swap(snap)
		p.SetTools(b.Upstreams[i].Name, b.Upstreams[i].Prefix(), tools, accepted)
	}}
	var relay mcptool.ClientHandlers
	RelayUpstream(&relay, func() *Proxy { return p })
	relay.Install(o)
	ups, err := upstream.New(cfgs, o)
	if err != nil {
		t.Fatal(err)
	}
	ex.Upstreams = &mcptool.Executor{Upstreams: ups, Observer: env.observer}
	g.Install(g.Snapshot(), identity.NewTable(b, nil))
	p = New(g, ups, env.opts)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := ups.Start(ctx); err != nil {
		t.Fatalf("upstreams: %v", err)
	}
	srv := httptest.NewServer(p.Handler())
	t.Cleanup(func() {
		srv.CloseClientConnections()
		srv.Close()
		ups.Close()
	})
	return srv.URL, p
}

// evilUpstream: a Go SDK server announcing the given tools; a tools/call of
// one of them is answered by evil (given the call's JSON-RPC id) instead.
// GETs with Last-Event-ID go to resume when set.
type evilUpstream struct {
	URL    string
	gets   atomic.Int64
	evil   func(w http.ResponseWriter, id json.RawMessage, name string)
	resume func(w http.ResponseWriter, r *http.Request)
}

func startEvil(t *testing.T, tools ...string) *evilUpstream {
	e := &evilUpstream{}
	srv := mcp.NewServer(&mcp.Implementation{Name: "evil", Version: "1"}, nil)
	for _, n := range tools {
		mcp.AddTool(srv, &mcp.Tool{Name: n}, func(ctx context.Context, req *mcp.CallToolRequest, _ any) (*mcp.CallToolResult, any, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "benign"}}}, nil, nil
		})
	}
	sdk := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil)
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && r.Header.Get("Last-Event-ID") != "" && e.resume != nil {
			e.gets.Add(1)
			e.resume(w, r)
			return
		}
		if r.Method == http.MethodPost {
			body, _ := io.ReadAll(r.Body)
			var m struct {
				ID     json.RawMessage `json:"id"`
				Method string          `json:"method"`
				Params struct {
					Name string `json:"name"`
				} `json:"params"`
			}
			json.Unmarshal(body, &m)
			if m.Method == "tools/call" && e.evil != nil {
				e.evil(w, m.ID, m.Params.Name)
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
		}
		sdk.ServeHTTP(w, r)
	}))
	t.Cleanup(ts.Close)
	e.URL = ts.URL
	return e
}

func sse(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(200)
	w.(http.Flusher).Flush()
}

// openRaw2 opens a session as a raw client that declares sampling and
// waits until tool is listed.
func openRaw2(t *testing.T, url, key, tool string) string {
	t.Helper()
	resp, body := post(t, url, key, "", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{"sampling":{}},"clientInfo":{"name":"raw","version":"1"}}}`)
	sid := resp.Header.Get("Mcp-Session-Id")
	if sid == "" {
		t.Fatalf("initialize: HTTP %d %s", resp.StatusCode, body)
	}
	post(t, url, key, sid, `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	waitFor(t, "the mirrored tools", func() bool {
		_, body := post(t, url, key, sid, `{"jsonrpc":"2.0","id":3,"method":"tools/list","params":{}}`)
		return strings.Contains(body, tool)
	})
	return sid
}

// memStore is an in-memory audit store.
type memStore struct {
	mu  sync.Mutex
	evs []audit.Event
}

// AppendEvents implements audit.Store.
func (m *memStore) AppendEvents(_ context.Context, evs []audit.Event) ([]audit.Event, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.evs = append(m.evs, evs...)
	return evs, nil
}
func (m *memStore) ReadRecords(context.Context, int64, int) ([]audit.Record, error) { return nil, nil }
func (m *memStore) AuditHead(context.Context) (audit.Head, error)                   { return audit.Head{}, nil }
func (m *memStore) types() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for _, e := range m.evs {
		out = append(out, string(e.EventType))
	}
	return out
}

// TestFastCallMessagesOutsideItsStream: an upstream that answers with JSON
// sends its sampling requests and log messages on its standalone stream.
// For a fast call they reach the caller, as on the SDK path; with another
// client's call in flight they are refused, never sent to that client.
func TestFastCallMessagesOutsideItsStream(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	up := jsonResponseUpstream(t, release)
	url, p := serveProxyP(t, reviewBundle(up, "ask", "logit", "slow"))
	a := connectClient(t, url, testKeys[0], declare{sampling: true})
	b := connectClient(t, url, testKeys[1], declare{sampling: true})
	ctx := context.Background()
	waitFor(t, "the mirrored tools", func() bool {
		res, err := a.cs.ListTools(ctx, nil)
		return err == nil && len(res.Tools) == 3
	})
	// B's session is ready for the fast path once the SDK has served it a
	// request after the handshake (the initialized notification is
	// handled asynchronously).
	if _, err := b.cs.ListTools(ctx, nil); err != nil {
		t.Fatal(err)
	}

	// B alone: the fast path answers as the SDK path does.
	fast0, _ := p.CallPaths()
	fastText, fastErr := callText(t, b.cs, &mcp.CallToolParams{Name: "ask", Arguments: map[string]any{"secret": "q"}})
	sdkText, sdkErr := callText(t, b.cs, &mcp.CallToolParams{Name: "ask", Arguments: map[string]any{"secret": "q"}, Meta: mcp.Meta{"progressToken": "x"}})
	if fast1, _ := p.CallPaths(); fast1 != fast0+1 {
		t.Errorf("B's plain call did not take the fast path")
	}
	if fastText != sdkText || fastErr != sdkErr || fastText != "answer: sampled for key-b" {
		t.Errorf("fast path %q (isError %v), SDK path %q (isError %v); want both B's own sampling", fastText, fastErr, sdkText, sdkErr)
	}

	// Logs: B's call's log reaches B, never A.
	for _, c := range []*client{a, b} {
		if err := c.cs.SetLoggingLevel(ctx, &mcp.SetLoggingLevelParams{Level: "debug"}); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(2500 * time.Millisecond) // past the linger of earlier requests
	callText(t, b.cs, &mcp.CallToolParams{Name: "logit", Arguments: map[string]any{"secret": "B-only"}})
	select {
	case <-b.gotLog:
	case <-time.After(5 * time.Second):
		t.Error("B did not get its call's log message")
	}
	time.Sleep(300 * time.Millisecond)
	a.mu.Lock()
	for _, l := range a.logs {
		if s, _ := json.Marshal(l.Data); strings.Contains(string(s), "B-only") {
			t.Errorf("client A got B's call's log message: %s", s)
		}
	}
	a.mu.Unlock()

	// A's call in flight on the SDK path, B's fast call asks: refused, and
	// A is never asked.
	go a.cs.CallTool(ctx, &mcp.CallToolParams{Name: "slow", Arguments: map[string]any{}, Meta: mcp.Meta{"progressToken": "pa"}})
	time.Sleep(300 * time.Millisecond)
	a.mu.Lock()
	a.sampled = nil
	a.mu.Unlock()
	text, _ := callText(t, b.cs, &mcp.CallToolParams{Name: "ask", Arguments: map[string]any{"secret": "B's secret prompt"}})
	a.mu.Lock()
	if slices.Contains(a.sampled, "B's secret prompt") || strings.Contains(text, "key-a") {
		t.Errorf("client A was asked B's sampling request (A asked %q, B's result %q)", a.sampled, text)
	}
	a.mu.Unlock()

}

// TestFastPathStalledClient: a client that stops reading its call's stream
// (a 21 MB relayed sampling request) fails only its own stream: the call
// ends within the call timeout and the write timeout, and its completion is
// recorded while the client still holds the connection.
func TestFastPathStalledClient(t *testing.T) {
	defer func(d time.Duration) { fastWriteTimeout = d }(fastWriteTimeout)
	fastWriteTimeout = time.Second
	st := &memStore{}
	rec := audit.NewRecorder(st, nil)
	ev := testenv.StartEverythingServer(t, "")
	url, p := serveProxyR(t, bundleFor(evUpstream(ev.URL)), 2*time.Second, rec)
	sid := openRaw2(t, url, testKeys[0], "test_sampling")
	conn, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	body := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"test_sampling","arguments":{"prompt":"` + strings.Repeat("<", 3500000) + `"}}}`
	fmt.Fprintf(conn, "POST / HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nMcp-Session-Id: %s\r\nMcp-Protocol-Version: 2025-11-25\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: %d\r\n\r\n%s",
		strings.TrimPrefix(url, "http://"), testKeys[0], sid, len(body), body)
	if line, _ := bufio.NewReaderSize(conn, 16).ReadString('\n'); !strings.Contains(line, "200") {
		t.Fatalf("status line %q", line)
	}
	// The client reads nothing more.
	deadline := time.Now().Add(15 * time.Second)
	for {
		rec.Flush(context.Background())
		p.fast.mu.Lock()
		n := len(p.fast.calls)
		p.fast.mu.Unlock()
		types := st.types()
		if n == 0 && (slices.Contains(types, "agent.tool.failed") || slices.Contains(types, "agent.tool.completed")) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("15 s on (call timeout 2 s, write timeout 1 s): %d fast calls in flight, audit events %v", n, types)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestFastPathResumptionIsBounded: an upstream that closes the call's stream
// after every event, asking for an immediate retry, gets a bounded number
// of resumptions, paced, and the call fails with a clear error.
func TestFastPathResumptionIsBounded(t *testing.T) {
	e := startEvil(t, "loop")
	again := func(w http.ResponseWriter) {
		sse(w)
		fmt.Fprintf(w, "id: 1\nretry: 0\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\"params\":{\"level\":\"error\",\"data\":\"again\"}}\n\n")
	}
	e.evil = func(w http.ResponseWriter, _ json.RawMessage, _ string) { again(w) }
	e.resume = func(w http.ResponseWriter, _ *http.Request) { again(w) }
	url, _ := serveProxyT(t, reviewBundle(e.URL, "loop"), 20*time.Second)
	sid := openRaw2(t, url, testKeys[0], "loop")
	post(t, url, testKeys[0], sid, `{"jsonrpc":"2.0","id":5,"method":"logging/setLevel","params":{"level":"debug"}}`)
	_, body := post(t, url, testKeys[0], sid, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"loop","arguments":{}}}`)
	if n := e.gets.Load(); n > maxDirectResumes {
		t.Errorf("%d resumptions without a new event id, want at most %d", n, maxDirectResumes)
	}
	if n := strings.Count(body, `"again"`); n > maxDirectResumes+1 {
		t.Errorf("%d copies of the event relayed", n)
	}
	if !strings.Contains(body, `"isError":true`) || !strings.Contains(body, "closed the call's stream") {
		t.Errorf("answer %.500s", body)
	}
}

// TestFastPathPingFlood: an upstream's flood of pings on a call's stream is
// answered in line, so it cannot pile up goroutines or connections.
func TestFastPathPingFlood(t *testing.T) {
	e := startEvil(t, "flood")
	e.evil = func(w http.ResponseWriter, id json.RawMessage, _ string) {
		sse(w)
		for i := 0; i < 3000; i++ {
			fmt.Fprintf(w, "data: {\"jsonrpc\":\"2.0\",\"id\":%d,\"method\":\"ping\"}\n\n", i)
		}
		w.(http.Flusher).Flush()
		fmt.Fprintf(w, "data: {\"jsonrpc\":\"2.0\",\"id\":%s,\"result\":{\"content\":[{\"type\":\"text\",\"text\":\"flood done\"}]}}\n\n", id)
	}
	url, _ := serveProxyT(t, reviewBundle(e.URL, "flood"), 30*time.Second)
	sid := openRaw2(t, url, testKeys[0], "flood")
	g0 := runtime.NumGoroutine()
	var peak atomic.Int64
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-done:
				return
			case <-time.After(5 * time.Millisecond):
			}
			if n := int64(runtime.NumGoroutine()); n > peak.Load() {
				peak.Store(n)
			}
		}
	}()
	_, out := post(t, url, testKeys[0], sid, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"flood","arguments":{}}}`)
	close(done)
	if !strings.Contains(out, "flood done") {
		t.Errorf("answer %.300s", out)
	}
	if p := peak.Load(); p > int64(g0)+100 {
		t.Errorf("goroutines peaked at %d (before: %d)", p, g0)
	}
}

// TestFastPathMalformedResult: a result whose content does not decode is
// not passed through: the caller gets an isError result, as on the SDK path.
func TestFastPathMalformedResult(t *testing.T) {
	e := startEvil(t, "bad_text")
	e.evil = func(w http.ResponseWriter, id json.RawMessage, _ string) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"result":{"content":[{"type":"text","text":{"not":"a string"}}],"extra":"x"}}`, id)
	}
	url, p := serveProxyT(t, reviewBundle(e.URL, "bad_text"), 5*time.Second)
	sid := openRaw2(t, url, testKeys[0], "bad_text")
	fast0, _ := p.CallPaths()
	_, fast := post(t, url, testKeys[0], sid, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"bad_text","arguments":{}}}`)
	if f, _ := p.CallPaths(); f != fast0+1 {
		t.Fatal("not served on the fast path")
	}
	if strings.Contains(fast, `"not":"a string"`) || !strings.Contains(fast, `"isError":true`) {
		t.Errorf("malformed result passed through: %s", fast)
	}
}

// TestFastPathForeignRequestsKeepNoSessionAlive: requests of another
// credential into a session (refused 403) do not count as its activity.
func TestFastPathForeignRequestsKeepNoSessionAlive(t *testing.T) {
	ev := testenv.StartEverythingServer(t, "")
	url, p := serveProxyT(t, bundleFor(evUpstream(ev.URL)), 5*time.Second)
	p.opts.SessionTimeout = time.Second
	a := openRaw2(t, url, testKeys[0], "test_simple_text")
	for i := 0; i < 8; i++ {
		// 403 while a's session lives, 404 once it is closed.
		if resp, _ := post(t, url, testKeys[1], a, `{"jsonrpc":"2.0","id":9,"method":"tools/list","params":{}}`); resp.StatusCode != http.StatusForbidden && resp.StatusCode != http.StatusNotFound {
			t.Fatalf("key b in a's session: HTTP %d", resp.StatusCode)
		}
		time.Sleep(400 * time.Millisecond)
	}
	if resp, body := post(t, url, testKeys[0], a, `{"jsonrpc":"2.0","id":9,"method":"tools/list","params":{}}`); resp.StatusCode != http.StatusNotFound {
		t.Errorf("a's session, idle 3.2 s with a 1 s timeout: HTTP %d %.200s, want 404", resp.StatusCode, body)
	}
}

// TestSlowBodies: a client cannot hold a connection by sending its body
// slowly or never. Without a credential it gets 401 at once (the body
// unread, the connection closed); with one, a body that does not arrive
// within BodyReadTimeout gets 408.
func TestSlowBodies(t *testing.T) {
	defer func(d time.Duration) { BodyReadTimeout = d }(BodyReadTimeout)
	BodyReadTimeout = 500 * time.Millisecond
	ev := testenv.StartEverythingServer(t, "")
	url, _ := serveProxyT(t, bundleFor(evUpstream(ev.URL)), 5*time.Second)
	host := strings.TrimPrefix(url, "http://")
	for _, tc := range []struct {
		name, auth string
		status     string
	}{
		{"no credential", "", "401"},
		{"a credential", "Authorization: Bearer " + testKeys[0] + "\r\n", "408"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conn, err := net.Dial("tcp", host)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			// 100 000 bytes announced, one sent.
			fmt.Fprintf(conn, "POST / HTTP/1.1\r\nHost: %s\r\n%sContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: 100000\r\n\r\n{", host, tc.auth)
			conn.SetReadDeadline(time.Now().Add(10 * time.Second))
			start := time.Now()
			line, err := bufio.NewReader(conn).ReadString('\n')
			if err != nil || !strings.Contains(line, " "+tc.status+" ") {
				t.Fatalf("after %v: %q %v, want HTTP %s", time.Since(start), line, err, tc.status)
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("answered after %v", d)
			}
		})
	}
}

// TestOwnMetaNotForwarded: a client's _meta keys in the gateway's namespace
// (io.toolgate/...) never reach an upstream; its other keys do.
func TestOwnMetaNotForwarded(t *testing.T) {
	seen := make(chan map[string]any, 1)
	srv := mcp.NewServer(&mcp.Implementation{Name: "meta", Version: "1"}, nil)
	mcp.AddTool(srv, &mcp.Tool{Name: "show"}, func(ctx context.Context, req *mcp.CallToolRequest, _ any) (*mcp.CallToolResult, any, error) {
		seen <- req.Params.Meta
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "ok"}}}, nil, nil
	})
	ts := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil))
	t.Cleanup(ts.Close)
	url, _ := serveProxyP(t, reviewBundle(ts.URL, "show"))
	a := connectClient(t, url, testKeys[0], declare{})
	ctx := context.Background()
	waitFor(t, "the mirrored tool", func() bool {
		res, err := a.cs.ListTools(ctx, nil)
		return err == nil && len(res.Tools) == 1
	})
	callText(t, a.cs, &mcp.CallToolParams{Name: "show", Arguments: map[string]any{},
		Meta: mcp.Meta{"io.toolgate/decision": map[string]any{"verdict": "allow"}, "progressToken": "p", "x.example/trace": "t1"}})
	got := <-seen
	if _, ok := got["io.toolgate/decision"]; ok || got["x.example/trace"] != "t1" {
		t.Errorf("the upstream saw _meta %v", got)
	}
}

// TestNoRetryAfterAskingTheClient: a read tool whose attempt times out is
// retried, unless the upstream asked the client for input during it: the
// user would be asked the same thing again. On both paths.
func TestNoRetryAfterAskingTheClient(t *testing.T) {
	ev := testenv.StartEverythingServer(t, "")
	// test_elicitation as a read tool (retried after a timeout by default).
	ups := evUpstream(ev.URL) + "- {kind: Tool, tool_id: tool:ev-test-elicitation, side_effect_class: read, source: {mcp_server: ev}}\n"
	url, _ := serveProxyT(t, agentBundle(ups, nil, "    - {tool_id: tool:ev-test-elicitation, side_effect_class: read, approval_tier: auto}\n"), time.Second)
	var asked atomic.Int32
	cl := mcp.NewClient(&mcp.Implementation{Name: "slow-human", Version: "1"}, &mcp.ClientOptions{
		ElicitationHandler: func(ctx context.Context, r *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			asked.Add(1)
			select { // the human takes longer than the call timeout
			case <-time.After(3 * time.Second):
			case <-ctx.Done():
			}
			return &mcp.ElicitResult{Action: "decline"}, nil
		}})
	ctx := context.Background()
	cs, err := cl.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url,
		HTTPClient: &http.Client{Transport: bearer{key: testKeys[0], base: http.DefaultTransport}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	waitFor(t, "the mirrored tool", func() bool {
		res, err := cs.ListTools(ctx, nil)
		return err == nil && len(res.Tools) == 1
	})
	for _, tc := range []struct {
		name string
		meta mcp.Meta
	}{{"fast path", nil}, {"SDK path", mcp.Meta{"progressToken": "p"}}} {
		t.Run(tc.name, func(t *testing.T) {
			asked.Store(0)
			res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "test_elicitation", Arguments: map[string]any{"message": "who?"}, Meta: tc.meta})
			if err == nil && !res.IsError {
				t.Errorf("the call succeeded")
			}
			time.Sleep(500 * time.Millisecond) // a retry would ask again by now
			if n := asked.Load(); n != 1 {
				t.Errorf("the client was asked %d times, want once", n)
			}
		})
	}
}

// maxDirectResumes is upstream.Direct.Call's bound on resuming a call's
// stream without a new event id.
const maxDirectResumes = 5
