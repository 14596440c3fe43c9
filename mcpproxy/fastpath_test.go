package mcpproxy

// Tests of the tools/call fast path (fastpath.go) against the Go SDK's
// conformance everything-server over Streamable HTTP: which calls take it,
// that they answer as the SDK path and as the server directly does, that a
// session stays bound to its credential, stream resumption (SEP-1699),
// cancellation, and idle sessions.

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolgate/toolgate/internal/testenv"
)

// resultJSON is a result as JSON with volatile parts left out, to compare
// what two paths returned.
func resultJSON(t *testing.T, res *mcp.CallToolResult) string {
	t.Helper()
	b, err := json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestFastPathAnswersAsTheServerAndTheSDKPath(t *testing.T) {
	ev := testenv.StartEverythingServer(t, "")
	url, p := serveProxyP(t, bundleFor(evUpstream(ev.URL)))
	direct := connectDirect(t, ev.URL)
	a := connectClient(t, url, testKeys[0], declare{sampling: true, elicitation: true})
	ctx := context.Background()
	waitFor(t, "the mirrored tools", func() bool {
		res, err := a.cs.ListTools(ctx, nil)
		return err == nil && len(res.Tools) >= 6
	})

	for _, name := range []string{"test_simple_text", "test_image_content"} {
		fast0, sdk0 := p.CallPaths()
		want, err := direct.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: map[string]any{}})
		if err != nil {
			t.Fatal(err)
		}
		got, err := a.cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: map[string]any{}})
		if err != nil {
			t.Fatalf("%s through the gateway: %v", name, err)
		}
		if fast, sdk := p.CallPaths(); fast != fast0+1 || sdk != sdk0 {
			t.Errorf("%s: paths fast %d→%d sdk %d→%d, want the fast path", name, fast0, fast, sdk0, sdk)
		}
		if diff := cmp.Diff(resultJSON(t, want), resultJSON(t, got)); diff != "" {
			t.Errorf("%s (-direct +fast path):\n%s", name, diff)
		}
		// The same call with a progress token takes the SDK path and
		// answers the same.
		viaSDK, err := a.cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: map[string]any{}, Meta: mcp.Meta{"progressToken": "p-" + name}})
		if err != nil {
			t.Fatal(err)
		}
		if _, sdk := p.CallPaths(); sdk != sdk0+1 {
			t.Errorf("%s with a progress token did not take the SDK path", name)
		}
		if diff := cmp.Diff(resultJSON(t, viaSDK), resultJSON(t, got)); diff != "" {
			t.Errorf("%s (-SDK path +fast path):\n%s", name, diff)
		}
	}

	// A tool this client cannot call gets the SDK path's unknown-tool
	// error, word for word, on both paths.
	_, fastErr := a.cs.CallTool(ctx, &mcp.CallToolParams{Name: "test_error_handling", Arguments: map[string]any{}})
	_, sdkErr := a.cs.CallTool(ctx, &mcp.CallToolParams{Name: "test_error_handling", Arguments: map[string]any{}, Meta: mcp.Meta{"progressToken": 7}})
	if fastErr == nil || sdkErr == nil || fastErr.Error() != sdkErr.Error() || !strings.Contains(fastErr.Error(), `unknown tool "test_error_handling"`) {
		t.Errorf("hidden tool: fast path %v, SDK path %v; want the same unknown-tool error", fastErr, sdkErr)
	}

	// An upstream's elicitation during a fast call reaches the caller on
	// the call's stream, and the answer goes back to the upstream.
	text, isErr := callText(t, a.cs, &mcp.CallToolParams{Name: "test_elicitation", Arguments: map[string]any{"message": "who?"}})
	if isErr || !strings.Contains(text, "user-key-a") {
		t.Errorf("elicitation through the fast path: %q (isError %v)", text, isErr)
	}
	// A client that did not declare sampling gets the SDK path's refusal.
	b := connectClient(t, url, testKeys[1], declare{})
	text, isErr = callText(t, b.cs, &mcp.CallToolParams{Name: "test_sampling", Arguments: map[string]any{"prompt": "x"}})
	if !strings.Contains(text, "did not declare sampling") {
		t.Errorf("sampling for a client without the capability: %q (isError %v)", text, isErr)
	}
}

// TestFastPathResumesAClosedStream: the server closes the call's SSE stream
// mid-call (SEP-1699); the gateway reconnects with Last-Event-ID, as the
// SDK client does, and the call completes. The upstream is a Go SDK server
// with an event store (the conformance server has none, so there even a
// direct SDK client gets "request terminated without response"; the
// gateway answers that case with an isError result).
func TestFastPathResumesAClosedStream(t *testing.T) {
	srv := mcp.NewServer(&mcp.Implementation{Name: "resumable", Version: "1"}, nil)
	mcp.AddTool(srv, &mcp.Tool{Name: "test_reconnection"}, func(ctx context.Context, req *mcp.CallToolRequest, _ any) (*mcp.CallToolResult, any, error) {
		if req.Extra != nil && req.Extra.CloseSSEStream != nil {
			req.Extra.CloseSSEStream(mcp.CloseSSEStreamArgs{RetryAfter: 10 * time.Millisecond})
		}
		time.Sleep(100 * time.Millisecond)
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "resumed and answered"}}}, nil, nil
	})
	ts := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv },
		&mcp.StreamableHTTPOptions{EventStore: mcp.NewMemoryEventStore(nil)}))
	t.Cleanup(ts.Close)
	bundle := strings.Replace(bundleFor(evUpstream(ts.URL)), "    - {tool_id: tool:ev-test-simple-text,",
		"    - {tool_id: tool:ev-test-reconnection, side_effect_class: write, approval_tier: auto}\n    - {tool_id: tool:ev-test-simple-text,", 1)
	url, p := serveProxyP(t, bundle)
	a := connectClient(t, url, testKeys[0], declare{})
	ctx := context.Background()
	waitFor(t, "the mirrored tool", func() bool {
		res, err := a.cs.ListTools(ctx, nil)
		return err == nil && len(res.Tools) == 1
	})
	want, err := connectDirect(t, ts.URL).CallTool(ctx, &mcp.CallToolParams{Name: "test_reconnection", Arguments: map[string]any{}})
	if err != nil {
		t.Fatalf("direct: %v", err)
	}
	fast0, _ := p.CallPaths()
	got, err := a.cs.CallTool(ctx, &mcp.CallToolParams{Name: "test_reconnection", Arguments: map[string]any{}})
	if err != nil {
		t.Fatalf("through the gateway: %v", err)
	}
	if diff := cmp.Diff(resultJSON(t, want), resultJSON(t, got)); diff != "" {
		t.Errorf("test_reconnection (-direct +fast path):\n%s", diff)
	}
	if fast, _ := p.CallPaths(); fast != fast0+1 {
		t.Error("test_reconnection did not take the fast path")
	}
}

// TestFastPathStreamEndedWithoutAnswer: the conformance server's
// test_reconnection closes the stream with no event id to resume from; the
// call gets an isError result saying so, and the gateway keeps serving.
func TestFastPathStreamEndedWithoutAnswer(t *testing.T) {
	ev := testenv.StartEverythingServer(t, "")
	bundle := strings.Replace(bundleFor(evUpstream(ev.URL)), "    - {tool_id: tool:ev-test-simple-text,",
		"    - {tool_id: tool:ev-test-reconnection, side_effect_class: write, approval_tier: auto}\n    - {tool_id: tool:ev-test-simple-text,", 1)
	url, _ := serveProxyP(t, bundle)
	a := connectClient(t, url, testKeys[0], declare{})
	ctx := context.Background()
	waitFor(t, "the mirrored tools", func() bool {
		res, err := a.cs.ListTools(ctx, nil)
		return err == nil && len(res.Tools) >= 7
	})
	text, isErr := callText(t, a.cs, &mcp.CallToolParams{Name: "test_reconnection", Arguments: map[string]any{}})
	if !isErr || !strings.Contains(text, "request terminated without response") {
		t.Errorf("test_reconnection: %q (isError %v)", text, isErr)
	}
	if text, isErr := callText(t, a.cs, &mcp.CallToolParams{Name: "test_simple_text", Arguments: map[string]any{}}); isErr || text == "" {
		t.Errorf("next call: %q (isError %v)", text, isErr)
	}
}

// post sends one JSON-RPC message to the gateway as a raw HTTP client.
func post(t *testing.T, url, key, session, body string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	if session != "" {
		req.Header.Set("Mcp-Session-Id", session)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(b)
}

// TestFastPathKeepsSessionsBoundToTheirCredential: another key posting a
// tools/call into a's session is refused (403), as the SDK refuses it, and
// nothing runs.
func TestFastPathKeepsSessionsBoundToTheirCredential(t *testing.T) {
	ev := testenv.StartEverythingServer(t, "")
	url, p := serveProxyP(t, bundleFor(evUpstream(ev.URL)))
	a := connectClient(t, url, testKeys[0], declare{})
	ctx := context.Background()
	waitFor(t, "the mirrored tools", func() bool {
		res, err := a.cs.ListTools(ctx, nil)
		return err == nil && len(res.Tools) >= 6
	})
	call := `{"jsonrpc":"2.0","id":41,"method":"tools/call","params":{"name":"test_simple_text","arguments":{}}}`
	fast0, _ := p.CallPaths()
	resp, body := post(t, url, testKeys[1], a.cs.ID(), call)
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("key b in a's session: HTTP %d %s, want 403", resp.StatusCode, body)
	}
	resp, body = post(t, url, "", a.cs.ID(), call)
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("no key in a's session: HTTP %d %s, want 401", resp.StatusCode, body)
	}
	if fast, _ := p.CallPaths(); fast != fast0 {
		t.Errorf("a refused call took the fast path")
	}
	// The owner's raw call is served on the fast path with a JSON body.
	resp, body = post(t, url, testKeys[0], a.cs.ID(), call)
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/json" || !strings.Contains(body, `"id":41`) || !strings.Contains(body, "This is a simple text response") {
		t.Errorf("a's own raw call: HTTP %d %q %s", resp.StatusCode, resp.Header.Get("Content-Type"), body)
	}
	if fast, _ := p.CallPaths(); fast != fast0+1 {
		t.Errorf("a's own raw call did not take the fast path")
	}
	// A session id nobody created goes to the SDK, which does not know it.
	resp, body = post(t, url, testKeys[0], "no-such-session", call)
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("unknown session: HTTP %d %s, want 404", resp.StatusCode, body)
	}
}

// TestFastPathCancellation: a client's notifications/cancelled for a fast
// call in flight ends it; the gateway stays usable.
func TestFastPathCancellation(t *testing.T) {
	ev := testenv.StartEverythingServer(t, "")
	url, _ := serveProxyP(t, bundleFor(evUpstream(ev.URL)))
	a := connectClient(t, url, testKeys[0], declare{sampling: true})
	ctx := context.Background()
	waitFor(t, "the mirrored tools", func() bool {
		res, err := a.cs.ListTools(ctx, nil)
		return err == nil && len(res.Tools) >= 6
	})
	// The call blocks in a's sampling handler until cancelled.
	release, entered := make(chan struct{}), make(chan struct{}, 1)
	defer close(release)
	a.mu.Lock()
	a.block, a.sampling = release, entered
	a.mu.Unlock()
	cctx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() {
		_, err := a.cs.CallTool(cctx, &mcp.CallToolParams{Name: "test_sampling", Arguments: map[string]any{"prompt": "slow"}})
		errc <- err
	}()
	<-entered
	cancel() // the SDK client sends notifications/cancelled
	select {
	case err := <-errc:
		if err == nil {
			t.Error("cancelled call returned no error")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("cancelled call did not return")
	}
	a.mu.Lock()
	a.block = nil
	a.mu.Unlock()
	if text, isErr := callText(t, a.cs, &mcp.CallToolParams{Name: "test_simple_text", Arguments: map[string]any{}}); isErr || text == "" {
		t.Errorf("after a cancellation: %q (isError %v)", text, isErr)
	}
}

// TestFastPathClosesIdleSessions: with no request for SessionTimeout, the
// session is closed (the SDK's own timer is off, since it would not see
// fast-path calls), and a session in use is kept.
func TestFastPathClosesIdleSessions(t *testing.T) {
	ev := testenv.StartEverythingServer(t, "")
	url, p := serveProxyP(t, bundleFor(evUpstream(ev.URL)))
	p.opts.SessionTimeout = 400 * time.Millisecond
	// Two raw clients (no standing GET stream, which counts as activity as
	// it does for the SDK): initialize, initialized; then one calls every
	// 100 ms and the other makes no request.
	open := func(key string) string {
		resp, body := post(t, url, key, "", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`)
		sid := resp.Header.Get("Mcp-Session-Id")
		if sid == "" {
			t.Fatalf("initialize: HTTP %d %s", resp.StatusCode, body)
		}
		post(t, url, key, sid, `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
		return sid
	}
	busy, idle := open(testKeys[0]), open(testKeys[1])
	list := `{"jsonrpc":"2.0","id":3,"method":"tools/list","params":{}}`
	waitFor(t, "the mirrored tools", func() bool {
		_, body := post(t, url, testKeys[0], busy, list)
		return strings.Contains(body, "test_simple_text")
	})
	if resp, body := post(t, url, testKeys[1], idle, list); resp.StatusCode != http.StatusOK {
		t.Fatalf("idle session's first request: HTTP %d %s", resp.StatusCode, body)
	}
	call := `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"test_simple_text","arguments":{}}}`
	for i := 0; i < 15; i++ {
		if resp, body := post(t, url, testKeys[0], busy, call); resp.StatusCode != http.StatusOK || !bytes.Contains([]byte(body), []byte("simple text")) {
			t.Fatalf("busy session, call %d: HTTP %d %s", i, resp.StatusCode, body)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// idle made no request for 1.5 s: closed; its next request is 404.
	if resp, body := post(t, url, testKeys[1], idle, list); resp.StatusCode != http.StatusNotFound {
		t.Errorf("the idle session answered HTTP %d %s, want 404 (closed)", resp.StatusCode, body)
	}
	if fast, _ := p.CallPaths(); fast < 14 {
		t.Errorf("fast path served %d of the busy session's calls", fast)
	}
}
