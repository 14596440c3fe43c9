package upstream_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolgate/toolgate/internal/testenv"
	"github.com/toolgate/toolgate/upstream"
)

// gate is an injected Options.Sleep: each restart delay is sent on delays,
// and the sleep returns only when the test sends on release. Restarts thus
// happen exactly when a test allows them, with no real waiting.
type gate struct {
	delays  chan time.Duration
	release chan struct{}
}

func newGate() *gate {
	return &gate{delays: make(chan time.Duration, 100), release: make(chan struct{})}
}

func (g *gate) sleep(ctx context.Context, d time.Duration) error {
	g.delays <- d
	select {
	case <-g.release:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// nextDelay waits for the next restart to be scheduled and returns its delay.
func (g *gate) nextDelay(t *testing.T) time.Duration {
	t.Helper()
	select {
	case d := <-g.delays:
		return d
	case <-time.After(20 * time.Second):
		t.Fatal("no restart was scheduled")
		return 0
	}
}

// eventually polls cond until it holds; it fails the test after 20 s. It
// waits for asynchronous events (a process noticed dead, a notification
// handled); it is never used to measure time.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func everythingStdio(t *testing.T, name string) upstream.Config {
	return upstream.Config{
		Name:      name,
		Transport: upstream.TransportStdio,
		Command:   testenv.NodeBin(t),
		Args:      []string{testenv.NodePackageBin(t, "server-everything"), "stdio"},
	}
}

func filesystemStdio(t *testing.T, name, dir string) upstream.Config {
	return upstream.Config{
		Name:      name,
		Transport: upstream.TransportStdio,
		Command:   testenv.NodeBin(t),
		Args:      []string{testenv.NodePackageBin(t, "server-filesystem"), dir},
	}
}

func start(t *testing.T, cfgs []upstream.Config, opts *upstream.Options) *upstream.Manager {
	t.Helper()
	if opts == nil {
		opts = &upstream.Options{}
	}
	if opts.Logger == nil {
		opts.Logger = testLogger(t)
	}
	m, err := upstream.New(cfgs, opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { m.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := m.Start(ctx); err != nil {
		t.Fatalf("Start: %v", err)
	}
	return m
}

func toolNames(tools []*mcp.Tool) []string {
	var names []string
	for _, tl := range tools {
		names = append(names, tl.Name)
	}
	return names
}

func text(t *testing.T, res *mcp.CallToolResult) string {
	t.Helper()
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

func call(t *testing.T, m *upstream.Manager, up, tool string, args map[string]any) *mcp.CallToolResult {
	t.Helper()
	res, err := m.CallTool(context.Background(), up, &mcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		t.Fatalf("CallTool(%s, %s): %v", up, tool, err)
	}
	return res
}

func statusOf(m *upstream.Manager, name string) upstream.Status {
	for _, s := range m.Status() {
		if s.Name == name {
			return s
		}
	}
	return upstream.Status{}
}

// TestStdioNPMServers lists and calls the real server-everything and
// server-filesystem over stdio, side by side in one Manager.
func TestStdioNPMServers(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "hello.txt"), []byte("hello from disk"), 0o600); err != nil {
		t.Fatal(err)
	}
	m := start(t, []upstream.Config{everythingStdio(t, "ev"), filesystemStdio(t, "fs", dir)}, nil)

	evTools, ok := m.Tools("ev")
	if !ok {
		t.Fatal("Tools(ev): not listed")
	}
	for _, want := range []string{"echo", "get-sum", "get-env", "trigger-long-running-operation"} {
		if !slices.Contains(toolNames(evTools), want) {
			t.Errorf("Tools(ev) = %v, missing %s", toolNames(evTools), want)
		}
	}
	// No roots, sampling or elicitation declared: no tools that need them.
	for _, absent := range []string{"get-roots-list", "trigger-sampling-request", "trigger-elicitation-request"} {
		if slices.Contains(toolNames(evTools), absent) {
			t.Errorf("Tools(ev) has %s, which needs a capability the Manager does not declare", absent)
		}
	}
	fsTools, _ := m.Tools("fs")
	wantFS := []string{"read_file", "read_text_file", "read_media_file", "read_multiple_files", "write_file",
		"edit_file", "create_directory", "list_directory", "list_directory_with_sizes", "directory_tree",
		"move_file", "search_files", "get_file_info", "list_allowed_directories"}
	if diff := cmp.Diff(wantFS, toolNames(fsTools)); diff != "" {
		t.Errorf("Tools(fs) (-want +got):\n%s", diff)
	}
	if _, ok := m.Tools("nope"); ok {
		t.Error("Tools(nope) reported ok")
	}

	tests := []struct {
		name, up, tool string
		args           map[string]any
		want           string
		wantIsError    bool
	}{
		{name: "echo", up: "ev", tool: "echo", args: map[string]any{"message": "hi there"}, want: "Echo: hi there"},
		{name: "get-sum", up: "ev", tool: "get-sum", args: map[string]any{"a": 2, "b": 5}, want: "The sum of 2 and 5 is 7."},
		{name: "read file", up: "fs", tool: "read_text_file", args: map[string]any{"path": filepath.Join(dir, "hello.txt")}, want: "hello from disk"},
		{name: "outside root", up: "fs", tool: "read_text_file", args: map[string]any{"path": "/etc/hostname"}, wantIsError: true},
		// The TS SDK reports an unknown tool as an isError result, not a
		// JSON-RPC error; the Manager passes it on unchanged.
		{name: "unknown tool", up: "ev", tool: "no-such-tool", wantIsError: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			res := call(t, m, tc.up, tc.tool, tc.args)
			if res.IsError != tc.wantIsError {
				t.Fatalf("IsError = %v, want %v (%s)", res.IsError, tc.wantIsError, text(t, res))
			}
			if tc.want != "" && text(t, res) != tc.want {
				t.Errorf("text = %q, want %q", text(t, res), tc.want)
			}
		})
	}

	st := m.Status()
	if len(st) != 2 || st[0].State != upstream.StateUp || st[1].State != upstream.StateUp || st[0].PID == 0 {
		t.Errorf("Status() = %+v, want both up with a pid", st)
	}
	if st[0].Tools != len(evTools) {
		t.Errorf("Status(ev).Tools = %d, want %d", st[0].Tools, len(evTools))
	}
	cs, err := m.Session("ev")
	if err != nil {
		t.Fatalf("Session(ev): %v", err)
	}
	if got := cs.InitializeResult().ProtocolVersion; got != upstream.ProtocolVersion {
		t.Errorf("negotiated protocol %q, want %q", got, upstream.ProtocolVersion)
	}
	if _, err := m.CallTool(context.Background(), "nope", &mcp.CallToolParams{Name: "x"}); !errors.Is(err, upstream.ErrUnknownUpstream) {
		t.Errorf("CallTool(nope) = %v, want ErrUnknownUpstream", err)
	}

	pid := st[0].PID
	m.Close()
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("server process %d still exists after Close (kill 0: %v)", pid, err)
	}
	if _, err := m.CallTool(context.Background(), "ev", &mcp.CallToolParams{Name: "echo"}); !errors.Is(err, upstream.ErrClosed) {
		t.Errorf("CallTool after Close = %v, want ErrClosed", err)
	}
	if got := statusOf(m, "ev").State; got != upstream.StateClosed {
		t.Errorf("state after Close = %s, want closed", got)
	}
}

// TestStdioEnvironment shows that a stdio upstream sees PATH, HOME and its
// Config.Env, and none of the gateway's other variables.
func TestStdioEnvironment(t *testing.T) {
	const leaked = "gateway-secret-do-not-pass"
	t.Setenv("TOOLGATE_TEST_GATEWAY_SECRET", leaked)
	t.Setenv("TOOLGATE_TEST_FORWARDED", "forwarded-value")
	cfg := everythingStdio(t, "ev")
	cfg.Env = map[string]upstream.Secret{
		"GIVEN_LITERAL": {Value: "literal-value"},
		"GIVEN_FROM":    {FromEnv: "TOOLGATE_TEST_FORWARDED"},
	}
	m := start(t, []upstream.Config{cfg}, nil)
	res := call(t, m, "ev", "get-env", nil)
	var env map[string]string
	if err := json.Unmarshal([]byte(text(t, res)), &env); err != nil {
		t.Fatalf("get-env result %q: %v", text(t, res), err)
	}
	if strings.Contains(text(t, res), leaked) {
		t.Fatalf("upstream sees the gateway's secret: %s", text(t, res))
	}
	for k, want := range map[string]string{
		"GIVEN_LITERAL": "literal-value",
		"GIVEN_FROM":    "forwarded-value",
		"PATH":          os.Getenv("PATH"),
		"HOME":          os.Getenv("HOME"),
	} {
		if env[k] != want {
			t.Errorf("upstream env %s = %q, want %q", k, env[k], want)
		}
	}
	if _, ok := env["TOOLGATE_TEST_FORWARDED"]; ok {
		t.Error("upstream sees TOOLGATE_TEST_FORWARDED under its own name")
	}
}

// TestStdioCrashAndRestart kills server-everything in the middle of a call:
// the call fails with ErrDown, the upstream is down and answers at once, the
// other upstream keeps serving, and after the (injected) backoff the server
// is restarted and serves again.
func TestStdioCrashAndRestart(t *testing.T) {
	t.Parallel()
	g := newGate()
	progress := make(chan string, 100)
	m := start(t, []upstream.Config{everythingStdio(t, "ev"), filesystemStdio(t, "fs", t.TempDir())}, &upstream.Options{
		Sleep: g.sleep,
		Progress: func(_ context.Context, name string, r *mcp.ProgressNotificationClientRequest) {
			progress <- name
		},
	})
	pid := statusOf(m, "ev").PID

	callErr := make(chan error, 1)
	go func() {
		_, err := m.CallTool(context.Background(), "ev", &mcp.CallToolParams{
			Name:      "trigger-long-running-operation",
			Arguments: map[string]any{"duration": 60, "steps": 600},
			Meta:      mcp.Meta{"progressToken": "tok-1"},
		})
		callErr <- err
	}()
	select { // the call is running upstream once it reports progress
	case name := <-progress:
		if name != "ev" {
			t.Errorf("progress from %q, want ev", name)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no progress from the long-running call")
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	err := <-callErr
	if !errors.Is(err, upstream.ErrDown) || !strings.Contains(err.Error(), "connection lost") {
		t.Fatalf("call during crash: %v, want ErrDown, connection lost", err)
	}

	d := g.nextDelay(t) // the supervisor noticed and scheduled a restart
	if d < upstream.DefaultBackoffBase/2 || d > upstream.DefaultBackoffBase {
		t.Errorf("first restart delay %s, want within [%s, %s]", d, upstream.DefaultBackoffBase/2, upstream.DefaultBackoffBase)
	}
	st := statusOf(m, "ev")
	if st.State != upstream.StateDown || st.LastError == nil || st.PID != 0 {
		t.Errorf("Status(ev) after crash = %+v, want down with an error and no pid", st)
	}
	_, err = m.CallTool(context.Background(), "ev", &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"message": "x"}})
	if !errors.Is(err, upstream.ErrDown) || !strings.Contains(err.Error(), "last error: connection lost") {
		t.Errorf("call to down upstream = %v, want ErrDown naming the last error", err)
	}
	if _, err := m.Session("ev"); !errors.Is(err, upstream.ErrDown) {
		t.Errorf("Session(ev) while down = %v, want ErrDown", err)
	}
	if tools, ok := m.Tools("ev"); !ok || len(tools) == 0 {
		t.Error("Tools(ev) lost the cached list while down")
	}
	if res := call(t, m, "fs", "list_allowed_directories", nil); res.IsError {
		t.Errorf("fs while ev is down: %s", text(t, res))
	}

	g.release <- struct{}{}
	eventually(t, "ev back up", func() bool { return statusOf(m, "ev").State == upstream.StateUp })
	st = statusOf(m, "ev")
	if st.Restarts != 1 || st.PID == 0 || st.PID == pid {
		t.Errorf("Status(ev) after restart = %+v, want 1 restart and a new pid", st)
	}
	if got := text(t, call(t, m, "ev", "echo", map[string]any{"message": "again"})); got != "Echo: again" {
		t.Errorf("echo after restart = %q", got)
	}
}

// TestHangTimesOut: an upstream that accepts a call and never answers hits
// the call timeout; the upstream stays up and answers other calls.
func TestHangTimesOut(t *testing.T) {
	t.Parallel()
	cfg := upstream.Config{
		Name:        "hang",
		Transport:   upstream.TransportStdio,
		Command:     testenv.NodeBin(t),
		Args:        []string{filepath.Join("testdata", "hang-server.js")},
		CallTimeout: 200 * time.Millisecond,
	}
	m := start(t, []upstream.Config{cfg}, nil)
	_, err := m.CallTool(context.Background(), "hang", &mcp.CallToolParams{Name: "hang"})
	if !errors.Is(err, upstream.ErrCallTimeout) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("CallTool(hang) = %v, want ErrCallTimeout and DeadlineExceeded", err)
	}
	if !strings.Contains(err.Error(), `upstream "hang": tools/call "hang"`) {
		t.Errorf("error %q does not name the upstream and tool", err)
	}
	if got := text(t, call(t, m, "hang", "echo", map[string]any{"message": "still here"})); got != "still here" {
		t.Errorf("echo after timeout = %q", got)
	}
	if st := statusOf(m, "hang"); st.State != upstream.StateUp {
		t.Errorf("state after a timeout = %s, want up", st.State)
	}

	// The caller's own cancellation is reported as such, not as a timeout.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = m.CallTool(ctx, "hang", &mcp.CallToolParams{Name: "hang"})
	if !errors.Is(err, context.Canceled) || errors.Is(err, upstream.ErrCallTimeout) {
		t.Errorf("CallTool(cancelled ctx) = %v, want context.Canceled", err)
	}
}

// TestStartFailureBackoff: an upstream that cannot start is down from the
// start, fails calls at once, and is retried with doubling, jittered delays
// up to the maximum; the other upstream is unaffected.
func TestStartFailureBackoff(t *testing.T) {
	t.Parallel()
	g := newGate()
	bad := upstream.Config{Name: "bad", Transport: upstream.TransportStdio, Command: filepath.Join(t.TempDir(), "no-such-program")}
	m, err := upstream.New([]upstream.Config{bad, everythingStdio(t, "ev")}, &upstream.Options{
		Logger:      testLogger(t),
		Sleep:       g.sleep,
		BackoffBase: time.Second,
		BackoffMax:  5 * time.Second,
		Rand:        func() float64 { return 0.999999 },
	})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	err = m.Start(context.Background())
	if err == nil || !strings.Contains(err.Error(), `upstream "bad"`) || strings.Contains(err.Error(), `upstream "ev"`) {
		t.Fatalf("Start() = %v, want an error for bad only", err)
	}
	_, err = m.CallTool(context.Background(), "bad", &mcp.CallToolParams{Name: "x"})
	if !errors.Is(err, upstream.ErrDown) || !strings.Contains(err.Error(), "no-such-program") {
		t.Errorf("CallTool(bad) = %v, want ErrDown naming the failure", err)
	}
	if _, ok := m.Tools("bad"); ok {
		t.Error("Tools(bad) reports a list for an upstream that never started")
	}
	var delays []time.Duration
	for i := 0; i < 5; i++ {
		delays = append(delays, g.nextDelay(t).Round(time.Millisecond))
		g.release <- struct{}{}
	}
	want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 5 * time.Second, 5 * time.Second}
	if diff := cmp.Diff(want, delays); diff != "" {
		t.Errorf("restart delays (-want +got):\n%s", diff)
	}
	g.nextDelay(t)
	if st := statusOf(m, "bad"); st.Restarts != 5 || st.State != upstream.StateDown {
		t.Errorf("Status(bad) = %+v, want down after 5 restarts", st)
	}
	if got := text(t, call(t, m, "ev", "echo", map[string]any{"message": "ok"})); got != "Echo: ok" {
		t.Errorf("ev while bad is down: %q", got)
	}
}

// TestSamplingPassThrough: with Options.CreateMessage set, the Manager
// declares sampling, server-everything announces trigger-sampling-request
// (after initialized, through tools/list_changed), and its sampling request
// reaches the handler tagged with the upstream's name.
func TestSamplingPassThrough(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var changes [][]string
	var gotName, gotPrompt string
	m := start(t, []upstream.Config{everythingStdio(t, "ev")}, &upstream.Options{
		OnChange: func(name string, tools []*mcp.Tool) {
			mu.Lock()
			defer mu.Unlock()
			changes = append(changes, toolNames(tools))
		},
		CreateMessage: func(_ context.Context, name string, r *mcp.CreateMessageWithToolsRequest) (*mcp.CreateMessageWithToolsResult, error) {
			gotName = name
			if len(r.Params.Messages) > 0 && len(r.Params.Messages[0].Content) > 0 {
				if tc, ok := r.Params.Messages[0].Content[0].(*mcp.TextContent); ok {
					gotPrompt = tc.Text
				}
			}
			return &mcp.CreateMessageWithToolsResult{
				Model: "test-model", Role: "assistant",
				Content: []mcp.Content{&mcp.TextContent{Text: "sampled answer"}},
			}, nil
		},
	})
	eventually(t, "trigger-sampling-request to be listed", func() bool {
		tools, _ := m.Tools("ev")
		return slices.Contains(toolNames(tools), "trigger-sampling-request")
	})
	mu.Lock()
	last := changes[len(changes)-1]
	mu.Unlock()
	if !slices.Contains(last, "trigger-sampling-request") {
		t.Errorf("last OnChange list %v lacks trigger-sampling-request", last)
	}
	res := call(t, m, "ev", "trigger-sampling-request", map[string]any{"prompt": "ping"})
	if res.IsError || !strings.Contains(text(t, res), "sampled answer") {
		t.Errorf("trigger-sampling-request = %s", text(t, res))
	}
	if gotName != "ev" || !strings.Contains(gotPrompt, "ping") {
		t.Errorf("sampling handler got upstream %q prompt %q", gotName, gotPrompt)
	}
}

// TestHTTPGoEverythingServer runs the Go SDK's conformance server over
// streamable HTTP behind a recording reverse proxy: headers are sent, tools
// are listed and called, tools/list_changed refreshes the cache, and a
// JSON-RPC error comes back as *jsonrpc.Error.
func TestHTTPGoEverythingServer(t *testing.T) {
	srv := testenv.StartEverythingServer(t, "")
	target, _ := url.Parse(srv.URL)
	var mu sync.Mutex
	var auth []string
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		auth = append(auth, r.Header.Get("Authorization"))
		mu.Unlock()
		(&httputil.ReverseProxy{Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.Out.URL.Path = target.Path
			pr.Out.Host = target.Host
		}, FlushInterval: -1}).ServeHTTP(w, r)
	}))
	defer proxy.Close()
	t.Setenv("TOOLGATE_TEST_UPSTREAM_TOKEN", "Bearer tok-123")

	changed := make(chan []string, 10)
	cfg := upstream.Config{
		Name:      "goev",
		Transport: upstream.TransportStreamableHTTP,
		URL:       proxy.URL + "/mcp",
		Headers:   map[string]upstream.Secret{"Authorization": {FromEnv: "TOOLGATE_TEST_UPSTREAM_TOKEN"}},
	}
	m, err := upstream.New([]upstream.Config{cfg}, &upstream.Options{
		Logger:   testLogger(t),
		OnChange: func(_ string, tools []*mcp.Tool) { changed <- toolNames(tools) },
	})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close() // before proxy.Close: the session's SSE stream must end first
	if err := m.Start(context.Background()); err != nil {
		// A first attempt can lose its tools/list to a server still
		// starting; the manager retries in the background, which is what
		// this waits for.
		t.Logf("Start (retried in the background): %v", err)
	}
	var first []string
	select {
	case first = <-changed:
	case <-time.After(60 * time.Second):
		t.Fatal("the upstream never came up")
	}
	for _, want := range []string{"test_simple_text", "test_error_handling", "test_trigger_tool_change"} {
		if !slices.Contains(first, want) {
			t.Errorf("tools %v lack %s", first, want)
		}
	}

	res := call(t, m, "goev", "test_simple_text", nil)
	if res.IsError || text(t, res) == "" {
		t.Errorf("test_simple_text = %+v", res)
	}
	if res := call(t, m, "goev", "test_error_handling", nil); !res.IsError {
		t.Errorf("test_error_handling IsError = false, want true")
	}

	_, err = m.CallTool(context.Background(), "goev", &mcp.CallToolParams{Name: "no_such_tool"})
	var rpcErr *jsonrpc.Error
	if !errors.As(err, &rpcErr) || rpcErr.Code != jsonrpc.CodeInvalidParams {
		t.Fatalf("unknown tool: %v, want *jsonrpc.Error code %d", err, jsonrpc.CodeInvalidParams)
	}
	if _, ok := err.(*jsonrpc.Error); !ok {
		t.Errorf("unknown tool error is %T, want *jsonrpc.Error itself (unwrapped)", err)
	}

	call(t, m, "goev", "test_trigger_tool_change", nil)
	select {
	case got := <-changed:
		if !slices.Contains(got, "__transient_tool_for_list_changed") {
			t.Errorf("OnChange after list_changed = %v, want the transient tool", got)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no OnChange after tools/list_changed")
	}
	tools, _ := m.Tools("goev")
	if !slices.Contains(toolNames(tools), "__transient_tool_for_list_changed") {
		t.Errorf("Tools(goev) not refreshed: %v", toolNames(tools))
	}

	mu.Lock()
	defer mu.Unlock()
	if len(auth) == 0 {
		t.Fatal("proxy saw no requests")
	}
	for _, a := range auth {
		if a != "Bearer tok-123" {
			t.Fatalf("request with Authorization %q, want the resolved secret on every request", a)
		}
	}
}

// TestHTTPServerCrashAndRestart kills the HTTP upstream's process: calls fail
// with ErrDown, the upstream is marked down, and once a new server listens on
// the same address and the backoff is released it is up again.
func TestHTTPServerCrashAndRestart(t *testing.T) {
	t.Parallel()
	srv := testenv.StartEverythingServer(t, "")
	g := newGate()
	m := start(t, []upstream.Config{{Name: "goev", Transport: upstream.TransportStreamableHTTP, URL: srv.URL}},
		&upstream.Options{Sleep: g.sleep})
	call(t, m, "goev", "test_simple_text", nil)

	srv.Kill()
	_, err := m.CallTool(context.Background(), "goev", &mcp.CallToolParams{Name: "test_simple_text"})
	if !errors.Is(err, upstream.ErrDown) || !strings.Contains(err.Error(), "connection lost") {
		t.Fatalf("call to a dead HTTP upstream = %v, want ErrDown, connection lost", err)
	}
	g.nextDelay(t)
	if st := statusOf(m, "goev"); st.State != upstream.StateDown {
		t.Fatalf("state after the server died = %s, want down", st.State)
	}
	if _, err := m.CallTool(context.Background(), "goev", &mcp.CallToolParams{Name: "test_simple_text"}); !errors.Is(err, upstream.ErrDown) {
		t.Errorf("call while down = %v, want ErrDown", err)
	}

	testenv.StartEverythingServer(t, srv.Addr)
	g.release <- struct{}{}
	eventually(t, "goev back up", func() bool { return statusOf(m, "goev").State == upstream.StateUp })
	if res := call(t, m, "goev", "test_simple_text", nil); res.IsError {
		t.Errorf("after restart: %s", text(t, res))
	}
}
