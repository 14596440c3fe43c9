// Command toolgate is the tool authorization gateway for AI agents: it
// validates policy bundles, resolves and decides tool calls, and serves the
// MCP gateway. All the work is in internal/cli.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/toolgate/toolgate/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
