package audit_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/toolgate/toolgate/audit"
	"github.com/toolgate/toolgate/store/sqlite"
)

// openSQLite opens a real SQLite store in the test's temp folder.
func openSQLite(tb testing.TB) *sqlite.Store {
	tb.Helper()
	s, err := sqlite.Open(filepath.Join(tb.TempDir(), "audit.db"), nil)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { s.Close() })
	return s
}

// faultyStore wraps a real store: it can fail appends, and hold them at a
// gate so a test can pile up callers behind a write in progress.
type faultyStore struct {
	audit.Store
	fail    atomic.Bool
	mu      sync.Mutex
	gate    chan struct{} // when set, AppendEvents waits for it to close
	entered chan struct{} // receives once per gated AppendEvents call
}

var errInjected = errors.New("injected store failure")

func (f *faultyStore) AppendEvents(ctx context.Context, evs []audit.Event) ([]audit.Event, error) {
	f.mu.Lock()
	gate, entered := f.gate, f.entered
	f.mu.Unlock()
	if gate != nil {
		entered <- struct{}{}
		select {
		case <-gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if f.fail.Load() {
		return nil, errInjected
	}
	return f.Store.AppendEvents(ctx, evs)
}

// hold makes the next appends wait; the returned func releases them.
func (f *faultyStore) hold() (entered <-chan struct{}, release func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.gate = make(chan struct{})
	f.entered = make(chan struct{}, 100)
	gate := f.gate
	return f.entered, func() {
		f.mu.Lock()
		f.gate = nil
		f.mu.Unlock()
		close(gate)
	}
}

func ev(i int) audit.Event {
	return audit.Event{
		EventID:    fmt.Sprintf("ev-%d", i),
		EventType:  "agent.tool.authorized",
		OccurredAt: time.Date(2026, 1, 1, 0, 0, 0, i, time.UTC),
		Verdict:    "allow",
		Code:       "ok",
	}
}

func closeRecorder(t *testing.T, r *audit.Recorder) {
	t.Helper()
	if err := r.Close(context.Background()); err != nil {
		t.Fatalf("Close: %v", err)
	}
}

func verifyCount(t *testing.T, s audit.Store, want int64) {
	t.Helper()
	rep, err := audit.Verify(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK || rep.Checked != want {
		t.Errorf("Verify = %+v; want OK with %d records", rep, want)
	}
}

// waitPending polls Stats until n events are pending (the state a test
// sets up before releasing a gate; no timing is asserted).
func waitPending(t *testing.T, r *audit.Recorder, n int) {
	t.Helper()
	for r.Stats().Pending != n {
		time.Sleep(time.Millisecond)
	}
}

func TestRecordConcurrent(t *testing.T) {
	s := openSQLite(t)
	r := audit.NewRecorder(s, nil)
	const callers, each = 20, 10
	var wg sync.WaitGroup
	results := make(chan audit.Event, callers*each)
	for c := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				n := c*each + i
				if i%2 == 0 {
					got, err := r.Record(context.Background(), ev(n))
					if err != nil {
						t.Errorf("Record: %v", err)
						return
					}
					results <- got
				} else if err := r.Enqueue(ev(n)); err != nil {
					t.Errorf("Enqueue: %v", err)
				}
			}
		}()
	}
	wg.Wait()
	close(results)
	for got := range results {
		if got.Seq == 0 || audit.CheckHash(got) != nil {
			t.Errorf("Record returned an unsealed event: %+v", got)
		}
	}
	closeRecorder(t, r)
	verifyCount(t, s, callers*each)
	evs, err := audit.ReadEvents(context.Background(), s, 1, 10*callers*each)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, e := range evs {
		if seen[e.EventID] {
			t.Errorf("%s written twice", e.EventID)
		}
		seen[e.EventID] = true
	}
	if st := r.Stats(); st.Committed != callers*each || st.Pending != 0 || st.Err != nil {
		t.Errorf("Stats = %+v", st)
	}
}

// TestGroupCommit holds the first write and checks that the callers who
// arrive meanwhile share one transaction.
func TestGroupCommit(t *testing.T) {
	fs := &faultyStore{Store: openSQLite(t)}
	r := audit.NewRecorder(fs, nil)
	defer closeRecorder(t, r)
	entered, release := fs.hold()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if _, err := r.Record(context.Background(), ev(0)); err != nil {
			t.Error(err)
		}
	}()
	<-entered // the first batch is in the store
	const waiting = 10
	for i := 1; i <= waiting; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := r.Record(context.Background(), ev(i)); err != nil {
				t.Error(err)
			}
		}()
	}
	// Denials are accepted while the store is busy: Enqueue does not wait.
	for i := 100; i < 100+waiting; i++ {
		if err := r.Enqueue(ev(i)); err != nil {
			t.Fatal(err)
		}
	}
	waitPending(t, r, 2*waiting)
	release()
	wg.Wait()
	if err := r.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	st := r.Stats()
	if st.Batches != 2 || st.Committed != 1+2*waiting {
		t.Errorf("Stats = %+v; want 2 batches, %d events", st, 1+2*waiting)
	}
	verifyCount(t, fs, 1+2*waiting)
}

func TestStoreFailure(t *testing.T) {
	ctx := context.Background()
	fs := &faultyStore{Store: openSQLite(t)}
	r := audit.NewRecorder(fs, &audit.RecorderOptions{RetryMin: time.Hour, RetryMax: time.Hour})
	defer closeRecorder(t, r)
	if _, err := r.Record(ctx, ev(0)); err != nil {
		t.Fatal(err)
	}
	fs.fail.Store(true)
	for i := 1; i <= 5; i++ {
		if err := r.Enqueue(ev(i)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := r.Record(ctx, ev(6)); !errors.Is(err, errInjected) {
		t.Fatalf("Record on a failing store = %v; want the store's error", err)
	}
	if err := r.Err(); !errors.Is(err, errInjected) {
		t.Errorf("Err() = %v; want the store's error", err)
	}
	if st := r.Stats(); st.Pending != 6 || st.Failures == 0 {
		t.Errorf("Stats = %+v; want the 5 denials and the outage event pending", st)
	}
	// While the store fails, an event that must be durable is refused at
	// once, not after another attempt.
	if _, err := r.Record(ctx, ev(7)); !errors.Is(err, audit.ErrUnavailable) || !errors.Is(err, errInjected) {
		t.Errorf("Record while failing = %v; want ErrUnavailable wrapping the store's error", err)
	}
	short, cancel := context.WithCancel(ctx)
	cancel()
	if err := r.Flush(short); err == nil {
		t.Error("Flush with a failing store and an ended ctx succeeded")
	}
	fs.fail.Store(false)
	if err := r.Flush(ctx); err != nil {
		t.Fatalf("Flush after the store recovered: %v", err)
	}
	if err := r.Err(); err != nil {
		t.Errorf("Err() after recovery = %v", err)
	}
	evs, err := audit.ReadEvents(ctx, fs, 1, 100)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range evs {
		if e.EventType == "audit.store_failed" {
			got = append(got, "store_failed: "+e.Details["error"].(string))
			continue
		}
		got = append(got, e.EventID)
	}
	// The failed Record's event is not written (its caller refused the
	// call); every enqueued denial is, and the outage is recorded.
	want := []string{"ev-0", "ev-1", "ev-2", "ev-3", "ev-4", "ev-5", "store_failed: injected store failure"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("stored events (-want +got):\n%s", diff)
	}
	verifyCount(t, fs, 7)
}

func TestRecordCanceledWhileQueued(t *testing.T) {
	fs := &faultyStore{Store: openSQLite(t)}
	r := audit.NewRecorder(fs, nil)
	defer closeRecorder(t, r)
	entered, release := fs.hold()
	done := make(chan error, 1)
	go func() {
		_, err := r.Record(context.Background(), ev(0))
		done <- err
	}()
	<-entered
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := r.Record(ctx, ev(1))
		errc <- err
	}()
	waitPending(t, r, 1)
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Errorf("canceled Record = %v; want context.Canceled", err)
	}
	release()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := r.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	verifyCount(t, fs, 1) // the abandoned event was not written
}

func TestFillsIDAndTime(t *testing.T) {
	s := openSQLite(t)
	now := time.Date(2026, 5, 6, 7, 8, 9, 0, time.FixedZone("X", 3600))
	r := audit.NewRecorder(s, &audit.RecorderOptions{
		Now:        func() time.Time { return now },
		NewEventID: func() string { return "fixed-id" },
	})
	defer closeRecorder(t, r)
	got, err := r.Record(context.Background(), audit.Event{EventType: "policy.bundle.loaded"})
	if err != nil {
		t.Fatal(err)
	}
	if got.EventID != "fixed-id" || !got.OccurredAt.Equal(now) || got.OccurredAt.Location() != time.UTC {
		t.Errorf("Record filled id %q time %v; want fixed-id and %v in UTC", got.EventID, got.OccurredAt, now)
	}
}

func TestBadDetails(t *testing.T) {
	s := openSQLite(t)
	r := audit.NewRecorder(s, nil)
	bad := ev(1)
	bad.Details = map[string]any{"c": make(chan int)}
	if _, err := r.Record(context.Background(), bad); err == nil {
		t.Error("Record with unencodable details succeeded")
	}
	if err := r.Enqueue(bad); err != nil {
		t.Fatal(err)
	}
	closeRecorder(t, r)
	evs, err := audit.ReadEvents(context.Background(), s, 1, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 1 || evs[0].Details["details_error"] == nil {
		t.Errorf("enqueued event with bad details stored as %+v; want it kept with details_error", evs)
	}
}

func TestClosed(t *testing.T) {
	r := audit.NewRecorder(openSQLite(t), nil)
	closeRecorder(t, r)
	if _, err := r.Record(context.Background(), ev(1)); !errors.Is(err, audit.ErrClosed) {
		t.Errorf("Record after Close = %v; want ErrClosed", err)
	}
	if err := r.Enqueue(ev(2)); !errors.Is(err, audit.ErrClosed) {
		t.Errorf("Enqueue after Close = %v; want ErrClosed", err)
	}
	if err := r.Close(context.Background()); err != nil {
		t.Errorf("second Close = %v", err)
	}
}

func TestCloseGivesUp(t *testing.T) {
	fs := &faultyStore{Store: openSQLite(t)}
	fs.fail.Store(true)
	r := audit.NewRecorder(fs, nil)
	for i := range 3 {
		if err := r.Enqueue(ev(i)); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := r.Close(ctx)
	if err == nil || !errors.Is(err, context.Canceled) {
		t.Errorf("Close on a failing store with an ended ctx = %v; want an error counting unwritten events", err)
	}
}

// blockingSink blocks every Write until released.
type blockingSink struct{ release chan struct{} }

func (b blockingSink) Write(ctx context.Context, _ []audit.Event) error {
	select {
	case <-b.release:
	case <-ctx.Done():
	}
	return nil
}

type failingSink struct{}

func (failingSink) Write(context.Context, []audit.Event) error { return errors.New("sink down") }

func TestSinks(t *testing.T) {
	ctx := context.Background()
	s := openSQLite(t)
	var buf bytes.Buffer
	jsonl := audit.NewJSONLSink(&buf)
	slow := blockingSink{release: make(chan struct{})}
	var overflows, failures atomic.Int32
	r := audit.NewRecorder(s, &audit.RecorderOptions{
		Sinks:     []audit.Sink{jsonl, slow, failingSink{}},
		SinkQueue: 1,
		OnSinkError: func(sink audit.Sink, err error) {
			switch {
			case errors.Is(err, audit.ErrSinkOverflow):
				overflows.Add(1)
			default:
				failures.Add(1)
			}
		},
	})
	// The slow sink never returns while these are recorded, and the failing
	// one fails every batch: Record is unaffected.
	const n = 5
	var want []audit.Event
	for i := range n {
		got, err := r.Record(ctx, ev(i))
		if err != nil {
			t.Fatalf("Record with a stuck sink: %v", err)
		}
		want = append(want, got)
	}
	close(slow.release)
	closeRecorder(t, r)
	st := r.Stats()
	if st.SinkDropped == 0 || overflows.Load() == 0 {
		t.Errorf("Stats = %+v, %d overflows; want the stuck sink's overflow counted", st, overflows.Load())
	}
	if st.SinkErrors != n || failures.Load() != n {
		t.Errorf("SinkErrors = %d, reported %d; want %d", st.SinkErrors, failures.Load(), n)
	}
	// The JSON-lines sink got every event, in order, as committed.
	var got []audit.Event
	sc := bufio.NewScanner(&buf)
	for sc.Scan() {
		e, err := audit.DecodeEvent(sc.Bytes())
		if err != nil {
			t.Fatalf("JSON-lines line %q: %v", sc.Text(), err)
		}
		got = append(got, e)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("JSON-lines sink (-want +got):\n%s", diff)
	}
}

func TestJSONLFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "events.jsonl")
	sink, err := audit.OpenJSONLFile(path)
	if err != nil {
		t.Fatal(err)
	}
	e, _, err := audit.Seal(audit.Head{}, ev(1))
	if err != nil {
		t.Fatal(err)
	}
	if err := sink.Write(context.Background(), []audit.Event{e, e}); err != nil {
		t.Fatal(err)
	}
	if err := sink.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := audit.OpenJSONLFile(filepath.Join(path, "sub")); err == nil {
		t.Error("OpenJSONLFile under a file succeeded")
	}
}

func BenchmarkRecordConcurrent(b *testing.B) {
	for _, p := range []int{1, 8, 64} {
		b.Run(fmt.Sprintf("callers=%dxGOMAXPROCS", p), func(b *testing.B) {
			s := openSQLite(b)
			r := audit.NewRecorder(s, nil)
			var i atomic.Int64
			b.SetParallelism(p)
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := r.Record(context.Background(), ev(int(i.Add(1)))); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.StopTimer()
			st := r.Stats()
			if st.Batches > 0 {
				b.ReportMetric(float64(st.Committed)/float64(st.Batches), "events/batch")
			}
			if err := r.Close(context.Background()); err != nil {
				b.Fatal(err)
			}
		})
	}
}

func BenchmarkEnqueue(b *testing.B) {
	s := openSQLite(b)
	r := audit.NewRecorder(s, nil)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if err := r.Enqueue(ev(i)); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	if err := r.Close(context.Background()); err != nil {
		b.Fatal(err)
	}
}
