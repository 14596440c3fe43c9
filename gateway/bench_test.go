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
// The "process" variants run the gateway as its own process (toolgate serve,
// built from this tree), as it is deployed: the in-process variants share
// one garbage collector with the benchmark's client and upstream, whose
// allocations (about 400 KB per call, the SDK's JSON decoding) then slow the
// gateway too.
// The Parallel variants keep 8 calls in flight for throughput; every loop is
// bounded by b.N and talks only to 127.0.0.1.

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolgate/toolgate/internal/testenv"
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

// serialCalls calls the tool b.N times, one after the other, and reports
// the median and the 99th percentile of the calls' latency besides the mean
// (ns/op): the design goal is about the median.
func serialCalls(b *testing.B, cs *mcp.ClientSession, tool string) {
	b.ReportAllocs()
	lat := make([]time.Duration, 0, b.N)
	for b.Loop() {
		start := time.Now()
		benchCall(b, cs, tool)
		lat = append(lat, time.Since(start))
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "µs-p50")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "µs-p99")
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
	b.Run("processes", benchProcesses)
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
		b.Run(tg.name, func(b *testing.B) { serialCalls(b, cs, tg.tool) })
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

// benchProcesses is BenchmarkToolsCall with every party in its own process,
// as deployed: the upstream is the Go SDK's conformance server (its
// test_simple_text tool, stateful Streamable HTTP with SSE responses), the
// gateway is `toolgate serve` built from this tree, the client is this
// process.
func benchProcesses(b *testing.B) {
	ev := testenv.StartEverythingServer(b, "")
	targets := []struct{ name, url, tool string }{
		{"direct", ev.URL, "test_simple_text"},
		{"reverse_proxy", startReverseProxy(b, ev.URL), "test_simple_text"},
		{"gateway", startGatewayProcess(b, ev.URL, "full"), "ev_test_simple_text"},
		{"gateway_sync_normal", startGatewayProcess(b, ev.URL, "normal"), "ev_test_simple_text"},
	}
	for _, tg := range targets {
		cs := benchSession(b, tg.url)
		waitTool(b, cs, tg.tool)
		b.Run(tg.name, func(b *testing.B) { serialCalls(b, cs, tg.tool) })
	}
}

const benchProcessBundle = `
- kind: Upstream
  name: ev
  transport: streamable-http
  url: %s
- kind: Agent
  agent_id: bench
  version: 1.0.0
  runtime_engine: go
  tool_permissions:
    - {tool_id: tool:ev-test-simple-text, side_effect_class: write, approval_tier: auto}
- kind: RuntimePolicy
  agent_id: bench
  deployment_mode: production
  tool_authorization_policy:
    active_tool_set: all
    mcp_tool_policy: {mcp_write_approval_required: false}
- kind: Principal
  principal_id: user:bench
  grants: [{resource: tool, action: invoke, scope: all}]
- kind: Settings
  anonymous: {principal: user:bench, agent_id: bench}
`

// startReverseProxy runs testdata/revproxy, a bare httputil.ReverseProxy,
// in front of up: the cost of any proxy process in the path, to set the
// gateway's figures against. It returns the proxy's URL for up's path.
func startReverseProxy(b *testing.B, up string) string {
	b.Helper()
	bin := buildBin(b, "./testdata/revproxy")
	addr := testenv.FreeAddr(b)
	return startProcess(b, exec.Command(bin, addr, up), addr) + "/mcp"
}

// buildBin builds the main package pkg (relative to this folder) into a
// temporary folder and returns the binary's path.
func buildBin(b *testing.B, pkg string) string {
	b.Helper()
	bin := filepath.Join(b.TempDir(), filepath.Base(pkg))
	if out, err := exec.Command("go", "build", "-o", bin, pkg).CombinedOutput(); err != nil {
		b.Fatalf("build %s: %v\n%s", pkg, err, out)
	}
	return bin
}

// startProcess starts cmd, stops it when the benchmark ends, and waits until
// addr accepts connections; it returns "http://"+addr.
func startProcess(b *testing.B, cmd *exec.Cmd, addr string) string {
	b.Helper()
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
	for i := 0; i < 200; i++ {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return "http://" + addr
		}
		time.Sleep(50 * time.Millisecond)
	}
	b.Fatalf("%s did not listen on %s", cmd.Path, addr)
	return ""
}

// startGatewayProcess builds toolgate from this tree and runs `toolgate
// serve` on a free loopback port in front of the upstream at up, with the
// given --audit-sync; the process is stopped when the benchmark ends. It
// returns the MCP URL.
func startGatewayProcess(b *testing.B, up, auditSync string) string {
	b.Helper()
	bin := buildBin(b, "../cmd/toolgate")
	dir := b.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "bundle.yaml"), []byte(fmt.Sprintf(benchProcessBundle, up)), 0o644); err != nil {
		b.Fatal(err)
	}
	addr := testenv.FreeAddr(b)
	return startProcess(b, exec.Command(bin, "serve", "--bundle", dir, "--listen", addr, "--data", b.TempDir(), "--audit-sync", auditSync), addr) + "/mcp"
}
