package upstream_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"

	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolgate/toolgate/internal/testenv"
	"github.com/toolgate/toolgate/upstream"
)

// oddServer builds testdata/oddserver and returns its path.
func oddServer(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "oddserver")
	cmd := exec.Command("go", "build", "-o", bin, "./testdata/oddserver")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build oddserver: %v\n%s", err, out)
	}
	return bin
}

// oddHTTP runs oddserver over Streamable HTTP on a free port until the test
// ends and returns its MCP URL.
func oddHTTP(t *testing.T, bin string) string {
	t.Helper()
	addr := testenv.FreeAddr(t)
	cmd := exec.Command(bin, "-http", addr)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); cmd.Wait() })
	for i := 0; ; i++ {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return "http://" + addr
		}
		if i > 200 {
			t.Fatalf("oddserver does not listen on %s", addr)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// refusals counts Options.OnRefused calls by upstream and reason.
type refusals struct {
	mu sync.Mutex
	n  map[string]int
}

func (r *refusals) add(name, reason string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.n == nil {
		r.n = map[string]int{}
	}
	r.n[name+" "+reason]++
}

func (r *refusals) get() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]int{}
	for k, v := range r.n {
		out[k] = v
	}
	return out
}

// TestStdioMalformedLineKeepsSession: lines that are not one JSON-RPC
// message, printed by a stdio upstream between its valid messages, are
// refused one by one (logged, counted); the session, its process and the
// call in flight carry on (issue 7, finding 14: the SDK's reader used to end
// the session at the first such line, for every client of the upstream).
func TestStdioMalformedLineKeepsSession(t *testing.T) {
	bin := oddServer(t)
	var ref refusals
	m := start(t, []upstream.Config{{Name: "odd", Transport: upstream.TransportStdio, Command: bin}},
		&upstream.Options{OnRefused: ref.add})
	before := statusOf(m, "odd")
	if got := text(t, call(t, m, "odd", "echo", map[string]any{"message": "one"})); got != "one" {
		t.Fatalf("echo before: %q", got)
	}
	res := call(t, m, "odd", "garbage", nil)
	if res.IsError || text(t, res) != "survived" {
		t.Fatalf("the call that printed garbage: %v %q", res.IsError, text(t, res))
	}
	if got := text(t, call(t, m, "odd", "echo", map[string]any{"message": "two"})); got != "two" {
		t.Fatalf("echo after: %q", got)
	}
	after := statusOf(m, "odd")
	if after.State != upstream.StateUp || after.Restarts != 0 || after.PID != before.PID {
		t.Errorf("status after the garbage: %+v, want up, no restart, pid %d", after, before.PID)
	}
	if diff := cmp.Diff(map[string]int{"odd malformed": 6}, ref.get()); diff != "" {
		t.Errorf("refusals (-want +got):\n%s", diff)
	}
}

// TestResultLimit: an answer to tools/call, resources/read or prompts/get
// larger than MaxResultBytes is refused while it is read, on stdio and
// Streamable HTTP, on the SDK client's path and the direct path: tools/call
// gets an isError result saying it was too large, the others a JSON-RPC
// error; the session stays up. Answers within the limit pass unchanged.
// (Issue 7, finding 13: results were read and decoded up to 64 MiB before
// the cap applied.)
func TestResultLimit(t *testing.T) {
	bin := oddServer(t)
	url := oddHTTP(t, bin)
	var ref refusals
	const limit = 2 << 20
	m := start(t, []upstream.Config{
		{Name: "stdio", Transport: upstream.TransportStdio, Command: bin},
		{Name: "http", Transport: upstream.TransportStreamableHTTP, URL: url},
	}, &upstream.Options{OnRefused: ref.add, MaxResultBytes: limit})
	ctx := context.Background()
	for _, up := range []string{"stdio", "http"} {
		t.Run(up, func(t *testing.T) {
			res := call(t, m, up, "big", map[string]any{"mib": 1})
			if res.IsError || len(text(t, res)) != 1<<20 {
				t.Errorf("1 MiB within the limit: isError %v, %d bytes", res.IsError, len(text(t, res)))
			}
			res = call(t, m, up, "big", map[string]any{"mib": 50})
			meta, _ := res.Meta[upstream.RefusedMetaKey].(map[string]any)
			if !res.IsError || !strings.Contains(text(t, res), "more than the 2097152 bytes the gateway reads") ||
				meta["reason"] != upstream.RefusedTooLarge {
				t.Errorf("50 MiB: isError %v, meta %v, text %q", res.IsError, res.Meta, text(t, res))
			}
			cs, err := m.Session(up)
			if err != nil {
				t.Fatal(err)
			}
			_, err = cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: "big://file"})
			var rpcErr *jsonrpc.Error
			if !errors.As(err, &rpcErr) || !strings.Contains(rpcErr.Message, "answer to resources/read") {
				t.Errorf("resources/read of 50 MiB: %v", err)
			}
			_, err = cs.GetPrompt(ctx, &mcp.GetPromptParams{Name: "big"})
			if !errors.As(err, &rpcErr) || !strings.Contains(rpcErr.Message, "answer to prompts/get") {
				t.Errorf("prompts/get of 50 MiB: %v", err)
			}
			if got := text(t, call(t, m, up, "echo", map[string]any{"message": "still up"})); got != "still up" {
				t.Errorf("echo after: %q", got)
			}
			if s := statusOf(m, up); s.State != upstream.StateUp || s.Restarts != 0 {
				t.Errorf("status: %+v", s)
			}
		})
	}
	t.Run("direct", func(t *testing.T) {
		d, err := m.Direct("http")
		if err != nil {
			t.Fatal(err)
		}
		resp, err := d.Post(ctx, []byte(`{"jsonrpc":"2.0","id":"direct-1","method":"tools/call","params":{"name":"big","arguments":{"mib":50}}}`))
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || len(body) > 64<<10 || !bytes.Contains(body, []byte(`"id":"direct-1"`)) || !bytes.Contains(body, []byte(`"isError":true`)) ||
			!bytes.Contains(body, []byte(upstream.RefusedMetaKey)) {
			t.Errorf("direct answer (%d bytes, %v): %.300s", len(body), err, body)
		}
	})
	t.Run("limit changed on a live session", func(t *testing.T) {
		m.SetMaxResultBytes(512 << 10)
		defer m.SetMaxResultBytes(limit)
		for _, up := range []string{"stdio", "http"} {
			if res := call(t, m, up, "big", map[string]any{"mib": 1}); !res.IsError || !strings.Contains(text(t, res), "more than the 524288 bytes") {
				t.Errorf("%s: 1 MiB under a 512 KiB limit: isError %v %.200q", up, res.IsError, text(t, res))
			}
		}
	})
	want := map[string]int{"stdio too_large": 4, "http too_large": 5}
	if diff := cmp.Diff(want, ref.get()); diff != "" {
		t.Errorf("refusals (-want +got):\n%s", diff)
	}
}

// TestResultLimitMemory: several 50 MiB answers in flight at once cost the
// reader about the limit each, not the answer's size: what this process
// allocates while they are read stays far below one answer.
func TestResultLimitMemory(t *testing.T) {
	bin := oddServer(t)
	url := oddHTTP(t, bin)
	m := start(t, []upstream.Config{
		{Name: "stdio", Transport: upstream.TransportStdio, Command: bin},
		{Name: "http", Transport: upstream.TransportStreamableHTTP, URL: url},
	}, nil) // the default limit, 1 MiB
	ctx := context.Background()
	var failed atomic.Int32
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	var wg sync.WaitGroup
	for i := range 8 {
		up := []string{"stdio", "http"}[i%2]
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := m.CallTool(ctx, up, &mcp.CallToolParams{Name: "big", Arguments: map[string]any{"mib": 50}})
			if err != nil || !res.IsError {
				failed.Add(1)
			}
		}()
	}
	wg.Wait()
	runtime.ReadMemStats(&after)
	// Eight answers of 50 MiB: 400 MiB on the wire. Reading them in
	// chunks, with 1 MiB at most buffered per answer, allocates a few MiB
	// in all; reading any one of them whole would allocate 50 MiB.
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 96<<20 {
		t.Errorf("reading eight refused 50 MiB answers allocated %d MiB, want under 96", alloc>>20)
	} else {
		t.Logf("allocated %.1f MiB", float64(alloc)/(1<<20))
	}
	if failed.Load() > 0 {
		t.Errorf("%d of 8 calls did not end in an isError result", failed.Load())
	}
}

// garbageHandler serves srv over Streamable HTTP; the answer to a
// tools/call of "garbage" is spoilt: on an event stream, events whose data
// is not a JSON-RPC message come first; a JSON answer is replaced by one
// that is not JSON.
func garbageHandler(srv *mcp.Server, jsonResponse bool) http.Handler {
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, &mcp.StreamableHTTPOptions{JSONResponse: jsonResponse})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		if !bytes.Contains(body, []byte(`"name":"garbage"`)) {
			h.ServeHTTP(w, r)
			return
		}
		sw := &spoilWriter{ResponseWriter: w, json: jsonResponse}
		h.ServeHTTP(sw, r)
	})
}

type spoilWriter struct {
	http.ResponseWriter
	json, started bool
}

func (s *spoilWriter) Write(p []byte) (int, error) {
	if s.json {
		s.ResponseWriter.Write([]byte(`{"jsonrpc":"2.0","id":` + strings.Repeat("[", 10)))
		return len(p), nil
	}
	if !s.started {
		s.started = true
		s.ResponseWriter.Write([]byte("data: this is not json\n\ndata: {\"hello\":\"world\"}\n\ndata: [1,2]\n\n"))
	}
	return s.ResponseWriter.Write(p)
}

func (s *spoilWriter) Flush() {
	if f, ok := s.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// TestHTTPMalformedKeepsSession: a Streamable HTTP upstream's message that
// is not JSON-RPC is refused on its own and the session stays up (the SDK
// client used to end the whole session on it): on an event stream the bad
// events are dropped and the call gets its answer; a JSON answer that is
// not JSON becomes an isError result for that call alone.
func TestHTTPMalformedKeepsSession(t *testing.T) {
	srv := mcp.NewServer(&mcp.Implementation{Name: "spoilt", Version: "1"}, nil)
	type echoArgs struct {
		Message string `json:"message"`
	}
	mcp.AddTool(srv, &mcp.Tool{Name: "echo"}, func(_ context.Context, _ *mcp.CallToolRequest, a echoArgs) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: a.Message}}}, nil, nil
	})
	mcp.AddTool(srv, &mcp.Tool{Name: "garbage"}, func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "survived"}}}, nil, nil
	})
	// Closed after the Manager (t.Cleanup runs last in, first out).
	sse := httptest.NewServer(garbageHandler(srv, false))
	t.Cleanup(sse.Close)
	js := httptest.NewServer(garbageHandler(srv, true))
	t.Cleanup(js.Close)
	var ref refusals
	m := start(t, []upstream.Config{
		{Name: "sse", Transport: upstream.TransportStreamableHTTP, URL: sse.URL},
		{Name: "json", Transport: upstream.TransportStreamableHTTP, URL: js.URL},
	}, &upstream.Options{OnRefused: ref.add})

	if res := call(t, m, "sse", "garbage", nil); res.IsError || text(t, res) != "survived" {
		t.Errorf("event stream with bad events: isError %v %q", res.IsError, text(t, res))
	}
	res := call(t, m, "json", "garbage", nil)
	meta, _ := res.Meta[upstream.RefusedMetaKey].(map[string]any)
	if !res.IsError || meta["reason"] != upstream.RefusedMalformed || !strings.Contains(text(t, res), "not a JSON-RPC") {
		t.Errorf("JSON answer that is not JSON: isError %v meta %v %q", res.IsError, res.Meta, text(t, res))
	}
	for _, up := range []string{"sse", "json"} {
		if got := text(t, call(t, m, up, "echo", map[string]any{"message": "up"})); got != "up" {
			t.Errorf("%s: echo after: %q", up, got)
		}
		if s := statusOf(m, up); s.State != upstream.StateUp || s.Restarts != 0 {
			t.Errorf("%s: status %+v", up, s)
		}
	}
	if diff := cmp.Diff(map[string]int{"sse malformed": 3, "json malformed": 1}, ref.get()); diff != "" {
		t.Errorf("refusals (-want +got):\n%s", diff)
	}
}
