package audit_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/toolgate/toolgate/audit"
	"github.com/toolgate/toolgate/store/postgres"
	"github.com/toolgate/toolgate/store/sqlite"
	"github.com/toolgate/toolgate/storetest"
)

// A fault makes a real store fail or stall, and heals it.
type fault struct {
	name  string
	open  func(t *testing.T) (audit.Store, *faultCtl)
	stall bool // the fault makes appends hang rather than fail
}

type faultCtl struct {
	apply, heal func(t testing.TB)
}

// failing are real store failures: a file system that is full, a
// PostgreSQL server that was stopped.
var failing = []fault{
	{name: "sqlite on a full file system", open: func(t *testing.T) (audit.Store, *faultCtl) {
		fs := storetest.MountTmpfs(t, 4<<20)
		s := openSQLiteAt(t, filepath.Join(fs.Dir, "toolgate.db"))
		var free func()
		return s, &faultCtl{apply: func(t testing.TB) { free = fs.Fill(t) }, heal: func(testing.TB) { free() }}
	}},
	{name: "postgres stopped", open: func(t *testing.T) (audit.Store, *faultCtl) {
		p := storetest.StartPostgres(t)
		s := openPostgres(t, p.DSN())
		return s, &faultCtl{apply: p.Stop, heal: p.Start}
	}},
}

// stalling are real stores that stop answering: a frozen file system
// (fsfreeze), a SQLite write lock held by another connection, a PostgreSQL
// server whose processes are stopped (SIGSTOP).
var stalling = []fault{
	{name: "sqlite on a frozen file system", stall: true, open: func(t *testing.T) (audit.Store, *faultCtl) {
		fs := storetest.MountExt4(t, 32<<20)
		s := openSQLiteAt(t, filepath.Join(fs.Dir, "toolgate.db"))
		return s, &faultCtl{apply: fs.Freeze, heal: fs.Thaw}
	}},
	{name: "sqlite write lock held by another connection", stall: true, open: func(t *testing.T) (audit.Store, *faultCtl) {
		path := filepath.Join(t.TempDir(), "toolgate.db")
		s := openSQLiteAt(t, path)
		db, err := sql.Open("sqlite", path+"?_busy_timeout=5000")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		var tx *sql.Tx
		return s, &faultCtl{
			apply: func(t testing.TB) {
				var err error
				if tx, err = db.BeginTx(context.Background(), nil); err == nil {
					_, err = tx.Exec(`INSERT INTO toolgate_meta (key, value) VALUES ('lock', 'held') ON CONFLICT (key) DO UPDATE SET value = 'held'`)
				}
				if err != nil {
					t.Fatalf("take the write lock: %v", err)
				}
			},
			heal: func(t testing.TB) {
				if err := tx.Rollback(); err != nil {
					t.Errorf("release the write lock: %v", err)
				}
			},
		}
	}},
	{name: "postgres frozen", stall: true, open: func(t *testing.T) (audit.Store, *faultCtl) {
		p := storetest.StartPostgres(t)
		s := openPostgres(t, p.DSN())
		return s, &faultCtl{apply: p.Freeze, heal: p.Thaw}
	}},
}

func openSQLiteAt(t *testing.T, path string) *sqlite.Store {
	t.Helper()
	s, err := sqlite.Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func openPostgres(t *testing.T, dsn string) *postgres.Store {
	t.Helper()
	s, err := postgres.Open(context.Background(), dsn, &postgres.Options{MaxConns: 4})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func denial(i int) audit.Event {
	return audit.Event{EventID: fmt.Sprintf("deny-%d", i), EventType: "agent.tool.unauthorized", Verdict: "deny",
		Code: "not_in_ceiling", Reason: "ceiling layer: " + strings.Repeat("r", 200)}
}

// storedIDs returns the ids of the stored events and how many of each type.
func storedIDs(t *testing.T, s audit.Store) (map[string]bool, map[string]int) {
	t.Helper()
	evs, err := audit.ReadEvents(context.Background(), s, 1, 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	ids, types := map[string]bool{}, map[string]int{}
	for _, e := range evs {
		ids[e.EventID] = true
		types[e.EventType]++
	}
	return ids, types
}

// TestRecordAnswersAtOnceWhileStoreFails is finding 10 of issue 7: once
// more events were queued than one batch holds (512), a Record for an
// allow waited behind them for as long as the store failed, so the client
// got no answer. Now it is answered at once with ErrUnavailable (the gate
// denies with internal_error), and nothing queued is lost.
func TestRecordAnswersAtOnceWhileStoreFails(t *testing.T) {
	for _, f := range failing {
		t.Run(f.name, func(t *testing.T) {
			ctx := context.Background()
			s, ctl := f.open(t)
			r := audit.NewRecorder(s, &audit.RecorderOptions{RetryMin: 20 * time.Millisecond, RetryMax: 200 * time.Millisecond})
			defer r.Close(ctx)
			if _, err := r.Record(ctx, ev(0)); err != nil {
				t.Fatal(err)
			}
			ctl.apply(t)
			const n = 600 // more than MaxBatch
			for i := range n {
				if d := r.RecordOrQueue(ctx, denial(i)); d != audit.Queued {
					t.Fatalf("denial %d while the store fails: %s; want queued", i, d)
				}
			}
			storetest.WaitFor(t, 30*time.Second, "the store to fail", func() bool { return r.Err() != nil })
			if st := r.Stats(); st.Pending <= 512 {
				t.Fatalf("Stats = %+v; want more than one batch queued", st)
			}
			if err := r.Admit(); !errors.Is(err, audit.ErrUnavailable) {
				t.Errorf("Admit while the store fails = %v; want ErrUnavailable", err)
			}
			// The allow is answered, not left waiting: within the caller's
			// ctx, with the store's failure rather than the ctx's end.
			wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			_, err := r.Record(wctx, ev(1))
			cancel()
			if !errors.Is(err, audit.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("Record while %d events are queued and the store fails = %v; want ErrUnavailable at once", n, err)
			}
			if !strings.Contains(health(r), "cannot write") {
				t.Errorf("Health = %q; want the store's failure", health(r))
			}
			ctl.heal(t)
			fctx, cancel := context.WithTimeout(ctx, 60*time.Second)
			defer cancel()
			if err := r.Flush(fctx); err != nil {
				t.Fatalf("Flush after the store recovered: %v", err)
			}
			if err := r.Health(); err != nil {
				t.Errorf("Health after recovery = %v", err)
			}
			ids, types := storedIDs(t, s)
			for i := range n {
				if !ids[fmt.Sprintf("deny-%d", i)] {
					t.Fatalf("denial %d queued during the failure is not in the log", i)
				}
			}
			if ids["ev-1"] {
				t.Error("the refused allow was written")
			}
			if types["audit.store_failed"] != 1 {
				t.Errorf("%d audit.store_failed events; want 1", types["audit.store_failed"])
			}
			verifyCount(t, s, int64(n+2))
		})
	}
}

func health(r *audit.Recorder) string {
	if err := r.Health(); err != nil {
		return err.Error()
	}
	return ""
}

// TestStallIsVisible is the /readyz part of finding 14: a store that stops
// answering (no error) is reported by Health once an append has run longer
// than StallAfter; new allows are refused at once (ErrStalled), the allow
// waiting in the stalled append gets ErrStalled too, and a denial is queued
// instead of waiting. When the store answers again, everything queued is
// written.
func TestStallIsVisible(t *testing.T) {
	for _, f := range stalling {
		t.Run(f.name, func(t *testing.T) {
			ctx := context.Background()
			s, ctl := f.open(t)
			r := audit.NewRecorder(s, &audit.RecorderOptions{StallAfter: 300 * time.Millisecond})
			defer r.Close(ctx)
			if _, err := r.Record(ctx, ev(0)); err != nil {
				t.Fatal(err)
			}
			ctl.apply(t)
			healed := false
			defer func() {
				if !healed {
					ctl.heal(t)
				}
			}()
			waiting := make(chan error, 1)
			go func() {
				_, err := r.Record(ctx, ev(1))
				waiting <- err
			}()
			storetest.WaitFor(t, 30*time.Second, "Health to report the stall", func() bool { return errors.Is(r.Health(), audit.ErrStalled) })
			if err := <-waiting; !errors.Is(err, audit.ErrStalled) || !errors.Is(err, audit.ErrMaybeWritten) {
				t.Errorf("the Record in the stalled append = %v; want ErrStalled, may still be written", err)
			}
			if _, err := r.Record(ctx, ev(2)); !errors.Is(err, audit.ErrStalled) {
				t.Errorf("Record while stalled = %v; want ErrStalled at once", err)
			}
			if d := r.RecordOrQueue(ctx, denial(0)); d != audit.Queued {
				t.Errorf("RecordOrQueue while stalled = %s; want queued", d)
			}
			if !r.Stats().Stalled {
				t.Error("Stats().Stalled is false during the stall")
			}
			ctl.heal(t)
			healed = true
			fctx, cancel := context.WithTimeout(ctx, 60*time.Second)
			defer cancel()
			if err := r.Flush(fctx); err != nil {
				t.Fatalf("Flush after the stall: %v", err)
			}
			ids, _ := storedIDs(t, s)
			if !ids["deny-0"] {
				t.Error("the denial queued during the stall is not in the log")
			}
			if ids["ev-2"] {
				t.Error("the allow refused during the stall was written")
			}
			if err := r.Health(); err != nil && !errors.Is(err, audit.ErrUnavailable) {
				t.Errorf("Health after the stall = %v", err)
			}
			if rep, err := audit.Verify(ctx, s); err != nil || !rep.OK {
				t.Errorf("Verify = %+v, %v", rep, err)
			}
		})
	}
}

// TestBacklogBoundedWhileStoreDown is finding 12 of issue 7: while the
// store was down the queue grew without bound (a caller calling a hidden
// tool in a loop could exhaust memory). Now the queue holds at most
// MaxQueued events and MaxQueuedBytes; past that, calls are refused
// (Admit: ErrBacklogFull) and the events that could not be kept are
// counted and written as one audit.backlog_overflow summary once the store
// recovers.
func TestBacklogBoundedWhileStoreDown(t *testing.T) {
	tests := []struct {
		name       string
		opts       audit.RecorderOptions
		reasonSize int
		maxPending int
	}{
		{name: "by events", opts: audit.RecorderOptions{MaxQueued: 2000}, reasonSize: 200, maxPending: 2000},
		{name: "by bytes", opts: audit.RecorderOptions{MaxQueuedBytes: 1 << 20}, reasonSize: 8 << 10, maxPending: (1 << 20) / (8 << 10)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			fs := storetest.MountTmpfs(t, 8<<20)
			s := openSQLiteAt(t, filepath.Join(fs.Dir, "toolgate.db"))
			opts := tt.opts
			opts.RetryMin, opts.RetryMax = 20*time.Millisecond, 200*time.Millisecond
			r := audit.NewRecorder(s, &opts)
			defer r.Close(ctx)
			if _, err := r.Record(ctx, ev(0)); err != nil {
				t.Fatal(err)
			}
			free := fs.Fill(t)
			var before runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			// A flood: far more denials than the queue may hold, each with
			// a reason of reasonSize bytes.
			const workers, each = 8, 12_500
			reason := strings.Repeat("x", tt.reasonSize)
			var wg sync.WaitGroup
			var mu sync.Mutex
			counts := map[audit.Disposition]int{}
			maxPending := 0
			for w := range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					local := map[audit.Disposition]int{}
					for i := range each {
						e := denial(w*each + i)
						e.Reason = reason
						local[r.RecordOrQueue(ctx, e)]++
						if i%1000 == 0 {
							p := r.Stats().Pending
							mu.Lock()
							maxPending = max(maxPending, p)
							mu.Unlock()
						}
					}
					mu.Lock()
					for d, n := range local {
						counts[d] += n
					}
					mu.Unlock()
				}()
			}
			wg.Wait()
			st := r.Stats()
			// +2: the event that found the store failing, and
			// audit.store_failed, are queued past the bound.
			if st.Pending > tt.maxPending+2 || maxPending > tt.maxPending+2 {
				t.Errorf("pending %d (at most %d during the flood); want at most %d", st.Pending, maxPending, tt.maxPending+2)
			}
			if got := int(st.Overflowed) + counts[audit.Queued] + counts[audit.Durable]; got != workers*each || counts[audit.Counted] != int(st.Overflowed) {
				t.Errorf("dispositions %v, overflowed %d; want every one of %d events kept or counted", counts, st.Overflowed, workers*each)
			}
			if err := r.Admit(); !errors.Is(err, audit.ErrBacklogFull) && !errors.Is(err, audit.ErrUnavailable) {
				t.Errorf("Admit with a full backlog = %v", err)
			}
			var after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&after)
			// 100,000 events kept would be far above this.
			if grown := int64(after.HeapAlloc) - int64(before.HeapAlloc); grown > 48<<20 {
				t.Errorf("the heap grew by %d MiB during the flood; want it bounded by the queue", grown>>20)
			}
			free()
			fctx, cancel := context.WithTimeout(ctx, 60*time.Second)
			defer cancel()
			if err := r.Flush(fctx); err != nil {
				t.Fatalf("Flush after recovery: %v", err)
			}
			// Flush returns once what was accepted is written; the summary
			// follows with the next write.
			storetest.WaitFor(t, 30*time.Second, "the overflow summary", func() bool { return r.Stats().Overflowed == 0 })
			if err := r.Flush(fctx); err != nil {
				t.Fatal(err)
			}
			evs, err := audit.ReadEvents(ctx, s, 1, 1<<30)
			if err != nil {
				t.Fatal(err)
			}
			var summaries []audit.Event
			denials := 0
			for _, e := range evs {
				switch e.EventType {
				case "audit.backlog_overflow":
					summaries = append(summaries, e)
				case "agent.tool.unauthorized":
					denials++
				}
			}
			if denials != counts[audit.Queued]+counts[audit.Durable] {
				t.Errorf("%d denials in the log; want the %d kept", denials, counts[audit.Queued]+counts[audit.Durable])
			}
			if len(summaries) != 1 {
				t.Fatalf("%d overflow summaries; want 1", len(summaries))
			}
			d := summaries[0].Details
			if d["count"] != jsonNumber(counts[audit.Counted]) || d["first"] == nil || d["last"] == nil ||
				d["by_type"].(map[string]any)["agent.tool.unauthorized"] != jsonNumber(counts[audit.Counted]) {
				t.Errorf("summary details %v; want count %d, first, last and by_type", d, counts[audit.Counted])
			}
			first, _ := time.Parse(time.RFC3339Nano, d["first"].(string))
			last, _ := time.Parse(time.RFC3339Nano, d["last"].(string))
			if first.IsZero() || last.Before(first) {
				t.Errorf("summary first %v last %v", d["first"], d["last"])
			}
			if rep, err := audit.Verify(ctx, s); err != nil || !rep.OK {
				t.Errorf("Verify = %+v, %v", rep, err)
			}
		})
	}
}

func jsonNumber(n int) json.Number { return json.Number(fmt.Sprint(n)) }
