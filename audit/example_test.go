package audit_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/toolgate/toolgate/audit"
	"github.com/toolgate/toolgate/store/sqlite"
)

// A gateway records an allow decision durably before the tool runs, queues
// a denial without waiting, and verifies the chain.
func Example() {
	dir, _ := os.MkdirTemp("", "audit-example")
	defer os.RemoveAll(dir)
	store, err := sqlite.Open(filepath.Join(dir, "toolgate.db"), nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer store.Close()

	rec := audit.NewRecorder(store, &audit.RecorderOptions{
		Now: func() time.Time { return time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC) },
	})
	ctx := context.Background()
	allowed, err := rec.Record(ctx, audit.Event{EventID: "e1", EventType: "agent.tool.authorized", Verdict: "allow", Code: "ok"})
	if err != nil {
		fmt.Println("deny: audit store failed:", err) // fail closed
		return
	}
	fmt.Println("durable at seq", allowed.Seq, "hash", allowed.Hash[:12], "- the tool may run")
	_ = rec.Enqueue(audit.Event{EventID: "e2", EventType: "agent.tool.unauthorized", Verdict: "deny", Code: "not_in_ceiling"})
	if err := rec.Close(ctx); err != nil {
		fmt.Println(err)
	}

	rep, err := audit.Verify(ctx, store)
	fmt.Println("verified:", rep.OK, rep.Checked, err)
	// Output:
	// durable at seq 1 hash 5af9b1d55eec - the tool may run
	// verified: true 2 <nil>
}
