package gateway_test

// BenchmarkToolsCall measures what the gateway adds to one tools/call over
// calling the same Streamable HTTP upstream directly: run with
//
//	go test -run '^$' -bench ToolsCall -benchmem -benchtime 2000x -count 6 ./gateway
//
// "direct" is a Go SDK client calling an in-process echo server; "gateway" is
// the same client calling the same server through toolgate (decision, durable
// audit record with group commit in SQLite, forwarding, completion record);
// "gateway_sync_normal" is the same with --audit-sync normal (no fsync per
// commit), which shows what the fsync costs on this disk.
// The Parallel variants keep 8 calls in flight for throughput; every loop is
// bounded by b.N and talks only to 127.0.0.1.

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

type echoIn struct {
	Message string `json:"message"`
}

func echoServer(b *testing.B) string {
	srv := mcp.NewServer(&mcp.Implementation{Name: "echo", Version: "1"}, nil)
	mcp.AddTool(srv, &mcp.Tool{Name: "echo", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		func(ctx context.Context, req *mcp.CallToolRequest, in echoIn) (*mcp.CallToolResult, any, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: in.Message}}}, nil, nil
		})
	ts := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv },
		&mcp.StreamableHTTPOptions{JSONResponse: true}))
	b.Cleanup(ts.Close)
	return ts.URL
}

const benchGatewayBundle = `
- kind: Upstream
  name: echo
  transport: streamable-http
  url: %s
- kind: Agent
  agent_id: bench
  version: 1.0.0
  runtime_engine: go
  tool_permissions:
    - {tool_id: tool:echo-echo, side_effect_class: read, approval_tier: auto}
- kind: RuntimePolicy
  agent_id: bench
  deployment_mode: production
  tool_authorization_policy: {active_tool_set: all}
- kind: Principal
  principal_id: user:bench
  grants: [{resource: tool, action: invoke, scope: all}]
- kind: Settings
  anonymous: {principal: user:bench, agent_id: bench}
`

func benchSession(b *testing.B, url string) *mcp.ClientSession {
	c := mcp.NewClient(&mcp.Implementation{Name: "bench", Version: "1"}, nil)
	cs, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: url}, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cs.Close() })
	return cs
}

func benchCall(b *testing.B, cs *mcp.ClientSession, name string) {
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: name, Arguments: map[string]any{"message": "hello"}})
	if err != nil || res.IsError {
		b.Fatalf("call %s: %v %v", name, err, res)
	}
}

// waitTool waits until the tool is listed (the upstream connects in the
// background) and calls it once.
func waitTool(b *testing.B, cs *mcp.ClientSession, name string) {
	for i := 0; i < 200; i++ {
		res, err := cs.ListTools(context.Background(), nil)
		if err == nil {
			for _, t := range res.Tools {
				if t.Name == name {
					benchCall(b, cs, name)
					return
				}
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	b.Fatalf("tool %s never appeared", name)
}

func BenchmarkToolsCall(b *testing.B) {
	up := echoServer(b)
	dir := b.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "bundle.yaml"), []byte(fmt.Sprintf(benchGatewayBundle, up)), 0o644); err != nil {
		b.Fatal(err)
	}
	gw := startGateway(b, dir).url
	dir2 := b.TempDir()
	os.WriteFile(filepath.Join(dir2, "bundle.yaml"), []byte(fmt.Sprintf(benchGatewayBundle, up)), 0o644)
	gwNormal := startGatewaySync(b, dir2, "normal").url
	targets := []struct{ name, url, tool string }{
		{"direct", up, "echo"},
		{"gateway", gw, "echo_echo"},
		{"gateway_sync_normal", gwNormal, "echo_echo"},
	}
	for _, tg := range targets {
		cs := benchSession(b, tg.url)
		waitTool(b, cs, tg.tool)
		b.Run(tg.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				benchCall(b, cs, tg.tool)
			}
		})
		b.Run(tg.name+"/parallel8", func(b *testing.B) {
			b.ReportAllocs()
			b.SetParallelism(4) // 4 × GOMAXPROCS(2) = 8 in flight
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					benchCall(b, cs, tg.tool)
				}
			})
		})
	}
}
