package upstream_test

import (
	"context"
	"fmt"
	"log"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolgate/toolgate/upstream"
)

// A Manager with one stdio and one Streamable HTTP upstream: list the tools
// and call one. (Compiled, not run: it needs the servers.)
func ExampleManager() {
	m, err := upstream.New([]upstream.Config{
		{
			Name:      "everything",
			Transport: upstream.TransportStdio,
			Command:   "node",
			Args:      []string{"/opt/mcp/server-everything/dist/index.js", "stdio"},
		},
		{
			Name:      "search",
			Transport: upstream.TransportStreamableHTTP,
			URL:       "http://127.0.0.1:3001/mcp",
			Headers:   map[string]upstream.Secret{"Authorization": {FromEnv: "SEARCH_TOKEN"}},
		},
	}, &upstream.Options{
		OnChange: func(name string, tools []*mcp.Tool) { fmt.Println(name, "now has", len(tools), "tools") },
	})
	if err != nil {
		log.Fatal(err)
	}
	defer m.Close()
	if err := m.Start(context.Background()); err != nil {
		log.Print(err) // failed upstreams are down and retried in the background
	}
	res, err := m.CallTool(context.Background(), "everything", &mcp.CallToolParams{
		Name:      "get-sum",
		Arguments: map[string]any{"a": 2, "b": 5},
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(res.Content[0].(*mcp.TextContent).Text)
}
