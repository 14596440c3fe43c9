package sqlite_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/toolgate/toolgate/audit"
	"github.com/toolgate/toolgate/store/sqlite"
)

// BenchmarkAppendEvents measures one group commit of the usual size on the
// gateway's hot path (an allow and the previous call's completion), by
// durability mode: go test -run '^$' -bench AppendEvents -benchmem ./store/sqlite
func BenchmarkAppendEvents(b *testing.B) {
	for _, mode := range []string{"normal", "full"} {
		b.Run(mode, func(b *testing.B) {
			s, err := sqlite.Open(filepath.Join(b.TempDir(), "a.db"), &sqlite.Options{Synchronous: mode})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			ctx := context.Background()
			ev := func(i int, typ string) audit.Event {
				return audit.Event{EventID: fmt.Sprintf("ev-%d-%s", i, typ), EventType: typ, OccurredAt: time.Unix(1700000000, int64(i)).UTC(),
					CorrelationID: fmt.Sprintf("corr-%d", i), AgentID: "bench", Principal: "user:bench", ToolID: "tool:echo-echo", ToolName: "echo_echo",
					Layer: "composition", Reason: "allowed: every layer passed", ArgsDigest: "3f1a6c2b9e8d7f6a5b4c3d2e1f0a9b8c7d6e5f4a3b2c1d0e9f8a7b6c5d4e3f2a",
					Details: map[string]any{"via": "mcp", "attempts": 1}}
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				i++
				if _, err := s.AppendEvents(ctx, []audit.Event{ev(i, "agent.tool.completed"), ev(i+1, "agent.tool.authorized")}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
