package cli

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"syscall"

	"github.com/toolgate/toolgate/gateway"
)

// mountAPI adds the JSON API routes to the gateway's mux.
var mountAPI func(mux *http.ServeMux, gw *gateway.Gateway)

func runServe(ctx context.Context, args []string, io IO) int {
	fs := newFlags("serve", io)
	bundle := bundleFlag(fs)
	listen := fs.String("listen", gateway.DefaultListen, "address to listen on (loopback)")
	data := fs.String("data", "toolgate-data", "data folder (SQLite store)")
	events := fs.String("events", "", "also write every event as a JSON line to this file (- for stdout)")
	level := fs.String("log-level", "info", "log level: debug, info, warn, error")
	auditSync := fs.String("audit-sync", "full", "audit store durability: full (fsync per commit; survives power loss) or normal (survives a gateway crash, not power loss)")
	if code, ok := parse(fs, args); !ok {
		return code
	}
	if *bundle == "" {
		fmt.Fprintln(io.Stderr, "toolgate serve: --bundle DIR is required (or set TOOLGATE_BUNDLE)")
		return ExitUsage
	}
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(*level)); err != nil {
		fmt.Fprintf(io.Stderr, "toolgate serve: --log-level %q: %v\n", *level, err)
		return ExitUsage
	}
	log := slog.New(slog.NewTextHandler(io.Stderr, &slog.HandlerOptions{Level: lv}))
	reload := make(chan struct{}, 1)
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	go func() {
		for range hup {
			select {
			case reload <- struct{}{}:
			default:
			}
		}
	}()
	cfg := gateway.Config{BundleDir: *bundle, Listen: *listen, DataDir: *data, EventsFile: *events, AuditSync: *auditSync, Logger: log, Version: Version,
		Mount: mountAPI}
	if err := gateway.Run(ctx, cfg, reload); err != nil {
		fmt.Fprintf(io.Stderr, "toolgate serve: %v\n", err)
		return ExitFailure
	}
	return ExitOK
}
