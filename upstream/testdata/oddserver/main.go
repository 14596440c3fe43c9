// oddserver is an MCP server (Go SDK) for tests of what toolgate reads from
// its upstreams. Over stdio (the default) or Streamable HTTP (-http ADDR) it
// offers:
//
//   - tool echo {message}: the message back;
//   - tool big {mib}: a text result of mib MiB (default 50);
//   - tool garbage: prints lines that are not JSON-RPC messages on stdout
//     between its valid messages (stdio only), then answers "survived";
//   - resource big://file and prompt big: 50 MiB of text each.
package main

import (
	"context"
	"flag"
	"log"
	"net/http"
	"os"
	"strings"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// stdout serializes the SDK's writes and the garbage lines, so that a
// garbage line never lands inside a message.
type stdout struct{ mu sync.Mutex }

func (w *stdout) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return os.Stdout.Write(p)
}

func (w *stdout) Close() error { return os.Stdout.Close() }

// garbageLines are what the garbage tool prints, each on its own line.
var garbageLines = []string{
	`this is not json`,
	`{"hello":"world"}`,
	`[{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"in a batch"}}]`,
	`{"jsonrpc":"1.0","id":1,"result":{}}`,
	`{"jsonrpc":"2.0"}`,
	`{"jsonrpc":"2.0","id":1,"result":{}`,
}

const bigMiB = 50

func main() {
	addr := flag.String("http", "", "serve Streamable HTTP on this address instead of stdio")
	flag.Parse()
	out := &stdout{}
	s := mcp.NewServer(&mcp.Implementation{Name: "oddserver", Version: "1"}, nil)
	type echoArgs struct {
		Message string `json:"message"`
	}
	mcp.AddTool(s, &mcp.Tool{Name: "echo", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		func(_ context.Context, _ *mcp.CallToolRequest, a echoArgs) (*mcp.CallToolResult, any, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: a.Message}}}, nil, nil
		})
	type bigArgs struct {
		MiB int `json:"mib"`
	}
	mcp.AddTool(s, &mcp.Tool{Name: "big", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		func(_ context.Context, _ *mcp.CallToolRequest, a bigArgs) (*mcp.CallToolResult, any, error) {
			if a.MiB <= 0 {
				a.MiB = bigMiB
			}
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: strings.Repeat("x", a.MiB<<20)}}}, nil, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "garbage", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		func(_ context.Context, _ *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
			if *addr == "" {
				for _, l := range garbageLines {
					out.Write([]byte(l + "\n"))
				}
			}
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "survived"}}}, nil, nil
		})
	s.AddResource(&mcp.Resource{URI: "big://file", Name: "big"},
		func(_ context.Context, r *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
			return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: r.Params.URI, Text: strings.Repeat("y", bigMiB<<20)}}}, nil
		})
	s.AddPrompt(&mcp.Prompt{Name: "big"},
		func(_ context.Context, _ *mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
			return &mcp.GetPromptResult{Messages: []*mcp.PromptMessage{{Role: "user", Content: &mcp.TextContent{Text: strings.Repeat("z", bigMiB<<20)}}}}, nil
		})
	if *addr != "" {
		h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, nil)
		log.Fatal(http.ListenAndServe(*addr, h))
	}
	if err := s.Run(context.Background(), &mcp.IOTransport{Reader: os.Stdin, Writer: out}); err != nil {
		log.Fatal(err)
	}
}
