// Command client is a real MCP client (the official Go SDK) pointed at a
// running toolgate: it lists the tools its credential may see, then calls
// one allowed tool, one hidden tool and one that needs approval.
//
//	go run ./examples/client -url http://127.0.0.1:8420/mcp -key tg-demo-files-agent
package main

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

type bearer struct{ key string }

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.key)
	return http.DefaultTransport.RoundTrip(r)
}

func main() {
	url := flag.String("url", "http://127.0.0.1:8420/mcp", "the gateway's MCP endpoint")
	key := flag.String("key", "tg-demo-files-agent", "API key (a Credential in the bundle)")
	ws := flag.String("workspace", "examples/workspace", "the workspace the filesystem upstream serves")
	flag.Parse()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := mcp.NewClient(&mcp.Implementation{Name: "toolgate-example", Version: "1"}, nil)
	cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: *url, HTTPClient: &http.Client{Transport: bearer{*key}}}, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, "connect:", err)
		os.Exit(1)
	}
	defer cs.Close()
	res, err := cs.ListTools(ctx, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, "tools/list:", err)
		os.Exit(1)
	}
	fmt.Println("tools/list:")
	for _, t := range res.Tools {
		fmt.Println("  " + t.Name)
	}
	abs, _ := filepath.Abs(*ws)
	calls := []struct {
		what, tool string
		args       map[string]any
	}{
		{"allowed", "fs_read_text_file", map[string]any{"path": filepath.Join(abs, "notes", "meeting.md")}},
		{"hidden (not in the ceiling)", "fs_move_file", map[string]any{"source": "a", "destination": "b"}},
		{"argument-level deny", "fs_read_text_file", map[string]any{"path": filepath.Join(abs, "secrets.env")}},
		{"needs approval", "fs_write_file", map[string]any{"path": filepath.Join(abs, "notes", "todo.md"), "content": "- try toolgate\n"}},
	}
	for _, call := range calls {
		fmt.Printf("\ntools/call %s (%s):\n", call.tool, call.what)
		r, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: call.tool, Arguments: call.args})
		if err != nil {
			fmt.Println("  error:", err)
			continue
		}
		for _, ct := range r.Content {
			if t, ok := ct.(*mcp.TextContent); ok {
				fmt.Printf("  isError=%v: %s\n", r.IsError, strings.TrimSpace(t.Text))
			}
		}
	}
}
