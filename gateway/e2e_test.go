package gateway_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolgate/toolgate/audit"
	"github.com/toolgate/toolgate/gateway"
	"github.com/toolgate/toolgate/internal/testenv"
	"github.com/toolgate/toolgate/mcpproxy"
)

const (
	devKey    = "tg-demo-files-agent"
	viewerKey = "tg-demo-viewer"
)

// running is a gateway started for one test.
type running struct {
	url  string
	gw   *gateway.Gateway
	data string
}

// startGateway runs toolgate serve on bundleDir with a fresh data folder and
// stops it when the test ends.
func startGateway(t testing.TB, bundleDir string) *running {
	return startGatewaySync(t, bundleDir, "")
}

// startGatewaySync is startGateway with the audit store's durability mode.
func startGatewaySync(t testing.TB, bundleDir, auditSync string) *running {
	t.Helper()
	testenv.NodeModulesDir(t) // fail with "run .ci/install-deps" when missing
	data := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan string, 1)
	var gwp *gateway.Gateway
	done := make(chan error, 1)
	go func() {
		done <- gateway.Run(ctx, gateway.Config{BundleDir: bundleDir, Listen: "127.0.0.1:0", DataDir: data, AuditSync: auditSync,
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

type bearer struct {
	key  string
	base http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	if b.key != "" {
		r.Header.Set("Authorization", "Bearer "+b.key)
	}
	return b.base.RoundTrip(r)
}

func connect(t *testing.T, url, key string) *mcp.ClientSession {
	t.Helper()
	c := mcp.NewClient(&mcp.Implementation{Name: "e2e", Version: "1"}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url,
		HTTPClient: &http.Client{Transport: bearer{key: key, base: http.DefaultTransport}}}, nil)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

// eventually waits for a tool list (the upstream may still be starting).
func listNames(t *testing.T, cs *mcp.ClientSession, want int) []string {
	t.Helper()
	var names []string
	for i := 0; i < 100; i++ {
		res, err := cs.ListTools(context.Background(), nil)
		if err != nil {
			t.Fatalf("list tools: %v", err)
		}
		names = names[:0]
		for _, tl := range res.Tools {
			names = append(names, tl.Name)
		}
		if len(names) >= want {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	slices.Sort(names)
	return names
}

func call(t *testing.T, cs *mcp.ClientSession, name string, args map[string]any) (*mcp.CallToolResult, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
}

func text(r *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range r.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// structured returns the decision a refusal carries in _meta (and, for
// tools without an outputSchema, in structuredContent too).
func structured(t *testing.T, r *mcp.CallToolResult) map[string]any {
	t.Helper()
	raw, err := json.Marshal(r.Meta[mcpproxy.DecisionMetaKey])
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	json.Unmarshal(raw, &m)
	if r.StructuredContent != nil {
		sraw, _ := json.Marshal(r.StructuredContent)
		var sm map[string]any
		json.Unmarshal(sraw, &sm)
		if _, ok := sm["code"]; ok && !reflect.DeepEqual(sm, m) {
			t.Errorf("structuredContent %v differs from _meta %v", sm, m)
		}
	}
	return m
}

func rpcErr(t *testing.T, err error) *jsonrpc.Error {
	t.Helper()
	var e *jsonrpc.Error
	if !errors.As(err, &e) {
		t.Fatalf("want a JSON-RPC error, got %v", err)
	}
	return e
}

// exampleGateway serves a copy of examples/bundle whose filesystem upstream
// points at a scratch workspace with notes/meeting.md and secrets.env.
func exampleGateway(t *testing.T) (*running, string) {
	t.Helper()
	return exampleGatewayEdited(t, nil)
}

// exampleGatewayEdited is exampleGateway with each bundle file passed
// through edit (file name, content) first.
func exampleGatewayEdited(t *testing.T, edit func(name, content string) string) (*running, string) {
	t.Helper()
	root := testenv.RepoRoot(t)
	ws := t.TempDir()
	os.MkdirAll(filepath.Join(ws, "notes"), 0o755)
	os.WriteFile(filepath.Join(ws, "notes", "meeting.md"), []byte("# Weekly sync\n"), 0o644)
	os.WriteFile(filepath.Join(ws, "secrets.env"), []byte("TOKEN=x\n"), 0o644)
	bundle := t.TempDir()
	src := filepath.Join(root, "examples", "bundle")
	entries, _ := os.ReadDir(src)
	for _, e := range entries {
		data, _ := os.ReadFile(filepath.Join(src, e.Name()))
		s := strings.ReplaceAll(string(data), "../../testdata/npm", filepath.Join(root, "testdata", "npm"))
		s = strings.ReplaceAll(s, "- ../workspace", "- "+ws)
		s = strings.ReplaceAll(s, "workspace: ../workspace", "workspace: "+ws)
		if edit != nil {
			s = edit(e.Name(), s)
		}
		os.WriteFile(filepath.Join(bundle, e.Name()), []byte(s), 0o644)
	}
	return startGateway(t, bundle), ws
}

func TestGatewayFilesystem(t *testing.T) {
	g, ws := exampleGateway(t)
	dev := connect(t, g.url, devKey)

	t.Run("list is exactly the disclosed set", func(t *testing.T) {
		got := listNames(t, dev, 6)
		want := []string{"fs_get_file_info", "fs_list_allowed_directories", "fs_list_directory", "fs_read_text_file", "fs_search_files", "fs_write_file"}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("tools (-want +got):\n%s", diff)
		}
	})
	t.Run("allowed call returns the real result", func(t *testing.T) {
		res, err := call(t, dev, "fs_read_text_file", map[string]any{"path": filepath.Join(ws, "notes", "meeting.md")})
		if err != nil || res.IsError {
			t.Fatalf("call: %v %v", err, res)
		}
		if !strings.Contains(text(res), "Weekly sync") {
			t.Errorf("result %q lacks the file's text", text(res))
		}
	})
	t.Run("hidden tool is answered like an unknown one", func(t *testing.T) {
		_, errHidden := call(t, dev, "fs_move_file", map[string]any{"source": "a", "destination": "b"})
		_, errUnknown := call(t, dev, "fs_no_such_tool", map[string]any{})
		h, u := rpcErr(t, errHidden), rpcErr(t, errUnknown)
		if h.Code != u.Code || strings.ReplaceAll(h.Message, "fs_move_file", "X") != strings.ReplaceAll(u.Message, "fs_no_such_tool", "X") {
			t.Errorf("hidden %v differs from unknown %v", h, u)
		}
	})
	t.Run("argument-level deny", func(t *testing.T) {
		res, err := call(t, dev, "fs_read_text_file", map[string]any{"path": filepath.Join(ws, "secrets.env")})
		if err != nil || !res.IsError {
			t.Fatalf("want an isError result, got %v %v", err, res)
		}
		sc := structured(t, res)
		if sc["code"] != "condition_failed" || sc["layer"] != "condition" {
			t.Errorf("structuredContent %v", sc)
		}
		if strings.Contains(text(res), "TOKEN=x") {
			t.Error("the secret leaked")
		}
	})
	t.Run("write needs approval", func(t *testing.T) {
		target := filepath.Join(ws, "out.txt")
		res, err := call(t, dev, "fs_write_file", map[string]any{"path": target, "content": "hi"})
		if err != nil || !res.IsError {
			t.Fatalf("want an isError result, got %v %v", err, res)
		}
		sc := structured(t, res)
		if sc["code"] != "approval_required" || sc["approval_id"] == nil {
			t.Errorf("structuredContent %v", sc)
		}
		if _, err := os.Stat(target); err == nil {
			t.Error("the file was written before approval")
		}
	})
	t.Run("viewer cannot see read", func(t *testing.T) {
		viewer := connect(t, g.url, viewerKey)
		got := listNames(t, viewer, 2)
		if diff := cmp.Diff([]string{"fs_list_allowed_directories", "fs_list_directory"}, got); diff != "" {
			t.Errorf("viewer tools (-want +got):\n%s", diff)
		}
		_, err := call(t, viewer, "fs_read_text_file", map[string]any{"path": filepath.Join(ws, "notes", "meeting.md")})
		if e := rpcErr(t, err); !strings.Contains(e.Message, "unknown tool") {
			t.Errorf("got %v", e)
		}
	})
	t.Run("401 without or with a wrong key", func(t *testing.T) {
		for _, key := range []string{"", "wrong-key"} {
			req, _ := http.NewRequest("POST", g.url, strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Accept", "application/json, text/event-stream")
			if key != "" {
				req.Header.Set("Authorization", "Bearer "+key)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != 401 || !strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Bearer") {
				t.Errorf("key %q: status %d, WWW-Authenticate %q", key, resp.StatusCode, resp.Header.Get("WWW-Authenticate"))
			}
		}
	})
	t.Run("batch refused with nothing forwarded", func(t *testing.T) {
		target := filepath.Join(ws, "batch.txt")
		body, _ := json.Marshal([]map[string]any{
			{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": map[string]any{"name": "fs_read_text_file", "arguments": map[string]any{"path": filepath.Join(ws, "notes", "meeting.md")}}},
			{"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": map[string]any{"name": "fs_write_file", "arguments": map[string]any{"path": target, "content": "x"}}},
		})
		req, _ := http.NewRequest("POST", g.url, bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Authorization", "Bearer "+devKey)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 400 {
			t.Errorf("batch status %d, want 400", resp.StatusCode)
		}
		if _, err := os.Stat(target); err == nil {
			t.Error("a batch element was forwarded")
		}
	})
	t.Run("audit chain verifies and records the hidden attempt", func(t *testing.T) {
		ctx := context.Background()
		if err := g.gw.Rec.Flush(ctx); err != nil {
			t.Fatal(err)
		}
		rep, err := audit.Verify(ctx, g.gw.Store)
		if err != nil || !rep.OK {
			t.Fatalf("verify: %+v %v", rep, err)
		}
		evs, err := audit.ReadEvents(ctx, g.gw.Store, 1, 10000)
		if err != nil {
			t.Fatal(err)
		}
		seen := map[string]bool{}
		for _, e := range evs {
			seen[e.EventType+" "+e.ToolName+" "+e.Code] = true
		}
		for _, want := range []string{
			"agent.tool.unauthorized fs_move_file not_in_ceiling",
			"agent.tool.authorized fs_read_text_file ok",
			"agent.tool.completed fs_read_text_file ok",
			"agent.tool.unauthorized fs_read_text_file condition_failed",
			"agent.tool.approval_requested fs_write_file approval_required",
		} {
			if !seen[want] {
				t.Errorf("no event %q in %d events", want, len(evs))
			}
		}
	})
}
