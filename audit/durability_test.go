package audit_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/toolgate/toolgate/audit"
	"github.com/toolgate/toolgate/storetest"
)

// num reads a JSON number detail as an int (-1 when it is not one).
func num(v any) int {
	var n int
	if _, err := fmt.Sscan(fmt.Sprint(v), &n); err != nil {
		return -1
	}
	return n
}

// TestOverflowSummaryCountsByCaller is finding N6 of the review of issue
// 7: the audit.backlog_overflow summary said "the refused calls were
// answered internal_error", false for the denials it counts, and counted
// only by event type. Now its reason says which answers were given, and
// its details count by principal, agent, tool and code (the 50 most
// frequent with their first and last times, the rest as one total), with
// the memory for the groups bounded while a caller sprays tool names.
func TestOverflowSummaryCountsByCaller(t *testing.T) {
	ctx := context.Background()
	fs := storetest.MountTmpfs(t, 8<<20)
	s := openSQLiteAt(t, filepath.Join(fs.Dir, "toolgate.db"))
	var mu sync.Mutex
	var states []string
	r := audit.NewRecorder(s, &audit.RecorderOptions{MaxQueued: 50, RetryMin: 20 * time.Millisecond, RetryMax: 200 * time.Millisecond,
		OnState: func(prev, next audit.State) {
			mu.Lock()
			states = append(states, prev.String()+">"+next.String())
			mu.Unlock()
		}})
	defer r.Close(ctx)
	if _, err := r.Record(ctx, ev(0)); err != nil {
		t.Fatal(err)
	}
	free := fs.Fill(t)
	// Fill the backlog: the first event that does not fit is counted.
	for i := 0; ; i++ {
		if i > 1000 {
			t.Fatal("the backlog of 50 never filled")
		}
		e := denial(10_000 + i)
		e.Principal, e.AgentID, e.ToolID = "user:filler", "agent-f", "tool:fill"
		if r.RecordOrQueue(ctx, e) == audit.Counted {
			break
		}
	}
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	count := func(e audit.Event) {
		t.Helper()
		if d := r.RecordOrQueue(ctx, e); d != audit.Counted {
			t.Fatalf("event %s with a full backlog: %s; want counted", e.EventID, d)
		}
	}
	n := 0
	mk := func(principal, agent, tool, code string, at time.Time) audit.Event {
		n++
		return audit.Event{EventID: fmt.Sprintf("c-%d", n), EventType: "agent.tool.unauthorized", Verdict: "deny", OccurredAt: at,
			Principal: principal, AgentID: agent, ToolID: tool, Code: code, Reason: "r"}
	}
	for i := range 30 {
		count(mk("user:alice", "agent-a", "tool:fs-write", "not_in_ceiling", t0.Add(time.Duration(i)*time.Second)))
	}
	for i := range 20 {
		count(mk("user:bob", "agent-b", "tool:fs-read", "internal_error", t0.Add(time.Duration(100+i)*time.Second)))
	}
	// A caller spraying tool names: 1,300 distinct ones, the last 304 of
	// them past the bound of 1,000 groups, so counted under tool "*".
	for i := range 1300 {
		count(mk("user:carol", "agent-c", fmt.Sprintf("tool:x-%d-%s", i, strings.Repeat("y", 300)), "unknown_tool", t0.Add(time.Hour)))
	}
	// 250 more principals, each a group of its own: 199 fit in the spare
	// groups (with carol's "*" group: 200), 51 are untracked.
	for i := range 250 {
		count(mk(fmt.Sprintf("user:p%03d", i), "agent-p", "tool:p", "unknown_tool", t0.Add(2*time.Hour)))
	}
	if st := r.State(); !st.Failing || !st.Overflowing {
		t.Errorf("State while the store fails with a full backlog = %s; want failing+overflowing", st)
	}
	free()
	fctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := r.Flush(fctx); err != nil {
		t.Fatal(err)
	}
	storetest.WaitFor(t, 30*time.Second, "the overflow summary", func() bool { return r.Stats().Overflowed == 0 })
	if err := r.Flush(fctx); err != nil {
		t.Fatal(err)
	}
	evs, err := audit.ReadEvents(ctx, s, 1, 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	var sum *audit.Event
	for i := range evs {
		if evs[i].EventType == "audit.backlog_overflow" {
			if sum != nil {
				t.Fatal("two overflow summaries")
			}
			sum = &evs[i]
		}
	}
	if sum == nil {
		t.Fatal("no overflow summary")
	}
	d := sum.Details
	total := 1 + 30 + 20 + 1300 + 250
	if num(d["count"]) != total || num(d["internal_error"]) != 20 {
		t.Errorf("count %v internal_error %v; want %d and 20", d["count"], d["internal_error"], total)
	}
	if strings.Contains(sum.Reason, "the refused calls were answered internal_error") || !strings.Contains(sum.Reason, "denied calls kept their denial") ||
		!strings.Contains(sum.Reason, "would have run or asked for approval was refused with internal_error") {
		t.Errorf("summary reason %q: want what each kind of call was answered", sum.Reason)
	}
	top := d["top"].([]any)
	if len(top) != 50 {
		t.Fatalf("%d groups listed; want the top 50", len(top))
	}
	type group struct {
		Principal, Agent, Tool, Code string
		Count                        int
		First, Last                  string
	}
	g := func(i int) group {
		m := top[i].(map[string]any)
		return group{m["principal"].(string), m["agent_id"].(string), m["tool_id"].(string), m["code"].(string), num(m["count"]),
			m["first"].(string), m["last"].(string)}
	}
	ts := func(t time.Time) string { return t.Format(time.RFC3339Nano) }
	want := []group{
		{"user:carol", "agent-c", "*", "unknown_tool", 1300 - (1000 - 3), ts(t0.Add(time.Hour)), ts(t0.Add(time.Hour))},
		{"user:alice", "agent-a", "tool:fs-write", "not_in_ceiling", 30, ts(t0), ts(t0.Add(29 * time.Second))},
		{"user:bob", "agent-b", "tool:fs-read", "internal_error", 20, ts(t0.Add(100 * time.Second)), ts(t0.Add(119 * time.Second))},
	}
	if diff := cmp.Diff(want, []group{g(0), g(1), g(2)}); diff != "" {
		t.Errorf("the most frequent groups (-want +got):\n%s", diff)
	}
	listed := 0
	for i := range top {
		listed += g(i).Count
		if i > 0 && g(i).Count > g(i-1).Count {
			t.Errorf("group %d (%d) is larger than group %d (%d): not sorted", i, g(i).Count, i-1, g(i-1).Count)
		}
		if len(g(i).Tool) > 210 {
			t.Errorf("group %d tool_id is %d bytes; want it clipped", i, len(g(i).Tool))
		}
	}
	other := d["other"].(map[string]any)
	if num(other["untracked"]) != 51 || listed+num(other["events"]) != total || 50+num(other["groups"]) != 1200 {
		t.Errorf("other %v (listed %d); want 51 untracked, every event listed or in other, 1,200 groups kept", other, listed)
	}
	// OnState is called from its own goroutine: wait for the last report.
	storetest.WaitFor(t, 30*time.Second, "the report of the recovery", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(states) >= 4
	})
	mu.Lock()
	defer mu.Unlock()
	if diff := cmp.Diff([]string{"healthy>failing", "failing>failing+overflowing", "failing+overflowing>overflowing", "overflowing>healthy"}, states); diff != "" {
		t.Errorf("OnState reports (-want +got):\n%s", diff)
	}
}

// transitions records what OnState reports.
type transitions struct {
	mu  sync.Mutex
	got [][2]audit.State
}

func (tr *transitions) on(prev, next audit.State) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.got = append(tr.got, [2]audit.State{prev, next})
}

func (tr *transitions) list() [][2]audit.State {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return append([][2]audit.State(nil), tr.got...)
}

func (tr *transitions) names() []string {
	var out []string
	for _, t := range tr.list() {
		out = append(out, t[0].String()+">"+t[1].String())
	}
	return out
}

// TestOnStateReportsTransitions is finding N8: nothing was logged when the
// audit store began to fail or recovered. Now OnState is called once at
// each change, with a real store that fails (full disk, stopped
// PostgreSQL) or stalls (frozen file system, a write lock held), and
// with the error and the time the condition began.
func TestOnStateReportsTransitions(t *testing.T) {
	for _, f := range failing {
		t.Run(f.name, func(t *testing.T) {
			ctx := context.Background()
			s, ctl := f.open(t)
			var tr transitions
			r := audit.NewRecorder(s, &audit.RecorderOptions{RetryMin: 20 * time.Millisecond, RetryMax: 100 * time.Millisecond, OnState: tr.on})
			defer r.Close(ctx)
			if _, err := r.Record(ctx, ev(0)); err != nil {
				t.Fatal(err)
			}
			before := time.Now()
			ctl.apply(t)
			for i := range 20 {
				r.RecordOrQueue(ctx, denial(i))
			}
			storetest.WaitFor(t, 30*time.Second, "the failure to be reported", func() bool { return len(tr.list()) >= 1 })
			// Retries keep failing meanwhile: no more reports.
			time.Sleep(300 * time.Millisecond)
			ctl.heal(t)
			storetest.WaitFor(t, 60*time.Second, "the recovery to be reported", func() bool { return len(tr.list()) >= 2 })
			if err := r.Flush(ctx); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff([]string{"healthy>failing", "failing>healthy"}, tr.names()); diff != "" {
				t.Fatalf("OnState reports (-want +got):\n%s", diff)
			}
			got := tr.list()
			if fail := got[0][1]; fail.Err == nil || fail.FailingSince.Before(before) || !got[1][0].Failing || got[1][1].Err != nil {
				t.Errorf("failing state %+v, then %+v; want the store's error and when it began", fail, got[1])
			}
		})
	}
	for _, f := range stalling {
		t.Run(f.name, func(t *testing.T) {
			ctx := context.Background()
			s, ctl := f.open(t)
			var tr transitions
			r := audit.NewRecorder(s, &audit.RecorderOptions{StallAfter: 300 * time.Millisecond, RetryMin: 20 * time.Millisecond,
				RetryMax: 100 * time.Millisecond, OnState: tr.on})
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
			r.RecordOrQueue(ctx, denial(0))
			storetest.WaitFor(t, 30*time.Second, "the stall to be reported", func() bool { return len(tr.list()) >= 1 })
			if got := tr.list()[0]; !got[1].Stalled || !errors.Is(r.Health(), audit.ErrStalled) || got[1].Err == nil || got[1].StalledSince.IsZero() {
				t.Errorf("first report %+v; want a stall with its error and start", got)
			}
			ctl.heal(t)
			healed = true
			fctx, cancel := context.WithTimeout(ctx, 60*time.Second)
			defer cancel()
			if err := r.Flush(fctx); err != nil {
				t.Fatal(err)
			}
			storetest.WaitFor(t, 30*time.Second, "the report of the recovery", func() bool { return r.State().Healthy() && tr.list()[len(tr.list())-1][1].Healthy() })
			names := tr.names()
			if len(names) < 2 || names[0] != "healthy>stalled" || !strings.HasSuffix(names[len(names)-1], ">healthy") {
				t.Errorf("OnState reports %v; want healthy>stalled first and healthy last", names)
			}
		})
	}
}

// TestCloseWithWritesFinalLast is the shutdown half of finding N7:
// nothing in the chain recorded a clean stop, so the next start could not
// tell one from a crash. CloseWith writes its final event durably after
// everything else, and the sinks get it.
func TestCloseWithWritesFinalLast(t *testing.T) {
	ctx := context.Background()
	s := openSQLite(t)
	var sink memSink
	r := audit.NewRecorder(s, &audit.RecorderOptions{Sinks: []audit.Sink{&sink}})
	if _, err := r.Record(ctx, ev(0)); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if err := r.Enqueue(denial(i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.CloseWith(ctx, audit.Event{EventType: "gateway.stopped", Reason: "stopped", Details: map[string]any{"started_seq": 1}}); err != nil {
		t.Fatal(err)
	}
	evs, err := audit.ReadEvents(ctx, s, 1, 100)
	if err != nil {
		t.Fatal(err)
	}
	last := evs[len(evs)-1]
	if len(evs) != 7 || last.EventType != "gateway.stopped" || num(last.Details["committed"]) != 6 || num(last.Details["started_seq"]) != 1 || last.EventID == "" {
		t.Errorf("%d events, the last %+v; want 7, gateway.stopped last with committed 6", len(evs), last)
	}
	if got := sink.types(); len(got) != 7 || got[6] != "gateway.stopped" {
		t.Errorf("the sink got %v; want the final event last", got)
	}
	if len(r.Unwritten()) != 0 {
		t.Errorf("Unwritten = %v", r.Unwritten())
	}
	if err := r.CloseWith(ctx, audit.Event{EventType: "gateway.stopped"}); err != nil {
		t.Errorf("second CloseWith = %v", err)
	}
	verifyCount(t, s, 7)
}

// TestCloseWithKeepsFinalWhenStoreFails: at a shutdown while the disk is
// full, the final event is kept last in Unwritten (for the spill file),
// saying so; and when the queue was written but the final append fails,
// the audit.store_failed event of that failure is kept before it.
func TestCloseWithKeepsFinalWhenStoreFails(t *testing.T) {
	ctx := context.Background()
	fs := storetest.MountTmpfs(t, 4<<20)
	s := openSQLiteAt(t, filepath.Join(fs.Dir, "toolgate.db"))
	r := audit.NewRecorder(s, &audit.RecorderOptions{RetryMin: 20 * time.Millisecond, RetryMax: 100 * time.Millisecond})
	if _, err := r.Record(ctx, ev(0)); err != nil {
		t.Fatal(err)
	}
	free := fs.Fill(t)
	defer free()
	for i := range 3 {
		r.RecordOrQueue(ctx, denial(i))
	}
	cctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if err := r.CloseWith(cctx, audit.Event{EventType: "gateway.stopped", Reason: "stopped cleanly."}); err == nil {
		t.Fatal("CloseWith on a full disk succeeded")
	}
	left := r.Unwritten()
	var types []string
	for _, e := range left {
		types = append(types, e.EventType)
	}
	want := []string{"agent.tool.unauthorized", "audit.store_failed", "agent.tool.unauthorized", "agent.tool.unauthorized", "gateway.stopped"}
	if diff := cmp.Diff(want, types); diff != "" {
		t.Errorf("Unwritten (-want +got):\n%s", diff)
	}
	final := left[len(left)-1]
	if num(final.Details["unwritten"]) != 4 || num(final.Details["committed"]) != 1 || !strings.Contains(final.Reason, "kept for the spill file") {
		t.Errorf("final event %+v; want unwritten 4, committed 1 and a reason saying it was kept for the spill", final)
	}
	if n := audit.CountEvents(left); n != 4 {
		t.Errorf("CountEvents = %d; want 4 (gateway.stopped is not a lost event)", n)
	}
}

type memSink struct {
	mu  sync.Mutex
	evs []audit.Event
}

func (m *memSink) Write(_ context.Context, evs []audit.Event) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.evs = append(m.evs, evs...)
	return nil
}

func (m *memSink) types() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for _, e := range m.evs {
		out = append(out, e.EventType)
	}
	return out
}

// TestRecoverPreviousStop is the start half of finding N7: after a run
// that lost events (killed, or its shutdown could neither write nor
// spill them), the next start wrote only "gateway.started … 0 events …
// replayed". Now a run whose start noted records_stop and that has no
// gateway.stopped is reported by a gateway.unclean_stop event, and each
// lost-events marker by an audit.events_lost event.
func TestRecoverPreviousStop(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	start := func(id string, recordsStop bool) audit.Event {
		e := marker(id, nil)
		e.OccurredAt = t0
		if recordsStop {
			e.Details = map[string]any{"records_stop": true}
		}
		return e
	}
	stop := func(startedSeq int) audit.Event {
		return audit.Event{EventID: fmt.Sprintf("stop-%d", startedSeq), EventType: "gateway.stopped", Details: map[string]any{"started_seq": startedSeq}}
	}
	late := allowEv("a1", "mcp")
	late.OccurredAt = t0.Add(time.Minute)
	tests := []struct {
		name    string
		log     []audit.Event
		spill   []audit.Event
		markers []int // counts of lost-events markers
		want    string
		// wantLast is the unclean stop's last_seq.
		wantLast   int
		wantLost   int
		wantTypes  []string // appended, before gateway.started
		wantStarts int
	}{
		{name: "empty log", want: "none"},
		{name: "a start that does not record its stop", log: []audit.Event{start("m1", false), denial(1)}, want: "unknown"},
		{name: "a log without starts", log: []audit.Event{denial(1)}, want: "unknown"},
		{name: "clean", log: []audit.Event{start("m1", true), denial(1), stop(1)}, want: "clean"},
		{name: "clean, stop in the spill", log: []audit.Event{start("m1", true), denial(1)}, spill: []audit.Event{denial(2), stop(1)},
			want: "clean", wantTypes: []string{"agent.tool.unauthorized", "gateway.stopped"}},
		{name: "a spilled stop of another run", log: []audit.Event{start("m1", true), denial(1)}, spill: []audit.Event{stop(7)},
			want: "unclean", wantLast: 2, wantTypes: []string{"gateway.stopped", "gateway.unclean_stop"}},
		{name: "killed", log: []audit.Event{start("m1", true), denial(1), late}, want: "unclean", wantLast: 3,
			wantTypes: []string{"gateway.unclean_stop", "agent.tool.outcome_unknown"}},
		{name: "killed right after the start", log: []audit.Event{start("m1", true)}, want: "unclean", wantLast: 1,
			wantTypes: []string{"gateway.unclean_stop"}},
		{name: "the stop of an earlier run does not count", log: []audit.Event{start("m0", true), stop(1), start("m1", true)}, want: "unclean",
			wantLast: 3, wantTypes: []string{"gateway.unclean_stop"}},
		{name: "events lost at shutdown", log: []audit.Event{start("m1", true), denial(1)}, markers: []int{8797, 3}, want: "unclean",
			wantLast: 2, wantLost: 8800, wantTypes: []string{"gateway.unclean_stop", "audit.events_lost", "audit.events_lost"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			s := openSQLite(t)
			dir := t.TempDir()
			spillPath, lostPath := filepath.Join(dir, "spill.jsonl"), filepath.Join(dir, "audit-lost")
			if len(tt.log) > 0 {
				if _, err := s.AppendEvents(ctx, tt.log); err != nil {
					t.Fatal(err)
				}
			}
			if len(tt.spill) > 0 {
				if err := audit.WriteSpill(spillPath, tt.spill); err != nil {
					t.Fatal(err)
				}
			}
			for i, n := range tt.markers {
				if _, err := audit.WriteLostMarker(lostPath, n, t0.Add(time.Duration(i)*time.Second)); err != nil {
					t.Fatal(err)
				}
			}
			os.WriteFile(lostPath+".notes.txt", []byte("not a marker"), 0o600)
			opts := &audit.RecoverOptions{SpillPath: spillPath, LostMarker: lostPath, RecordsStop: true}
			rep, err := audit.Recover(ctx, s, opts)
			if err != nil {
				t.Fatal(err)
			}
			if rep.PreviousStop != tt.want || rep.LostCount != tt.wantLost || rep.Started.Details["previous_stop"] != tt.want ||
				rep.Started.Details["records_stop"] != true {
				t.Errorf("PreviousStop %q, lost %d, started details %v; want %q, %d", rep.PreviousStop, rep.LostCount, rep.Started.Details, tt.want, tt.wantLost)
			}
			evs, err := audit.ReadEvents(ctx, s, int64(len(tt.log))+1, 1000)
			if err != nil {
				t.Fatal(err)
			}
			var types []string
			for _, e := range evs[:len(evs)-1] {
				types = append(types, e.EventType)
			}
			if diff := cmp.Diff(tt.wantTypes, types); diff != "" {
				t.Errorf("appended before gateway.started (-want +got):\n%s", diff)
			}
			if tt.want == "unclean" {
				u := rep.UncleanStop
				d := u.Details
				if u.EventType != "gateway.unclean_stop" || int64(num(d["previous_started_seq"])) != rep.PreviousStart || num(d["last_seq"]) != tt.wantLast ||
					num(d["outcome_unknown"]) != len(rep.OutcomeUnknown) || num(d["events_lost"]) != tt.wantLost || d["previous_started_at"] != t0.Format(time.RFC3339Nano) ||
					!strings.Contains(u.Reason, "without a clean shutdown") || !strings.Contains(u.Reason, "may be lost") {
					t.Errorf("unclean stop %+v", u)
				}
			} else if rep.UncleanStop.EventType != "" {
				t.Errorf("an unclean stop was written: %+v", rep.UncleanStop)
			}
			for i, l := range rep.Lost {
				if num(l.Details["count"]) != tt.markers[i] || !l.OccurredAt.Equal(t0.Add(time.Duration(i)*time.Second)) || !strings.Contains(l.Reason, "lost") {
					t.Errorf("events_lost %d: %+v", i, l)
				}
			}
			if left, _ := audit.ReadLostMarkers(lostPath); len(left) != 0 {
				t.Errorf("markers left after the start: %v", left)
			}
			if _, err := os.Stat(lostPath + ".notes.txt"); err != nil {
				t.Errorf("a file that is not a marker was removed: %v", err)
			}
			// The next start: this run has no stop either (it was never
			// closed), and nothing is recorded twice.
			rep2, err := audit.Recover(ctx, s, opts)
			if err != nil {
				t.Fatal(err)
			}
			if rep2.PreviousStop != "unclean" || rep2.LostCount != 0 || len(rep2.OutcomeUnknown) != 0 || num(rep2.UncleanStop.Details["last_seq"]) != int(rep.Started.Seq) {
				t.Errorf("second Recover %+v; want an unclean stop of the first start only", rep2)
			}
		})
	}
}

// TestRecoverMarkerAlreadyRecorded: a start that crashed after recording
// a marker but before removing it does not have it recorded again.
func TestRecoverMarkerAlreadyRecorded(t *testing.T) {
	ctx := context.Background()
	s := openSQLite(t)
	lostPath := filepath.Join(t.TempDir(), "audit-lost")
	m, err := audit.WriteLostMarker(lostPath, 5, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.AppendEvents(ctx, []audit.Event{marker("m1", map[string]any{"records_stop": true, "lost_markers": []any{filepath.Base(m)}}),
		{EventID: "stop", EventType: "gateway.stopped", Details: map[string]any{"started_seq": 1}}}); err != nil {
		t.Fatal(err)
	}
	rep, err := audit.Recover(ctx, s, &audit.RecoverOptions{LostMarker: lostPath, RecordsStop: true})
	if err != nil {
		t.Fatal(err)
	}
	if rep.LostCount != 0 || len(rep.Lost) != 0 || rep.PreviousStop != "clean" {
		t.Errorf("Recover %+v; want the recorded marker only removed", rep)
	}
	if _, err := os.Stat(m); !os.IsNotExist(err) {
		t.Errorf("the marker is still there: %v", err)
	}
}

// TestLostMarkerOnFullDisk: on a file system too full for the spill file,
// the marker (an empty file whose name holds the count) is still made;
// with no inode left it fails too, and says so.
func TestLostMarkerOnFullDisk(t *testing.T) {
	fs := storetest.MountTmpfsInodes(t, 1<<20, 256)
	free := fs.Fill(t)
	defer free()
	spill, lost := filepath.Join(fs.Dir, "audit-spill.jsonl"), filepath.Join(fs.Dir, "audit-lost")
	evs := []audit.Event{denial(1), denial(2)}
	evs[0].Reason = strings.Repeat("x", 64<<10)
	if err := audit.WriteSpill(spill, evs); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("WriteSpill on a full disk = %v; want ENOSPC", err)
	}
	at := time.Date(2026, 4, 1, 0, 0, 0, 0, time.UTC)
	if _, err := audit.WriteLostMarker(lost, 2, at); err != nil {
		t.Fatalf("WriteLostMarker on a full disk: %v", err)
	}
	got, err := audit.ReadLostMarkers(lost)
	if err != nil || len(got) != 1 || got[0].Count != 2 || !got[0].At.Equal(at) {
		t.Fatalf("ReadLostMarkers = %+v, %v", got, err)
	}
	freeInodes := fs.FillInodes(t)
	defer freeInodes()
	if _, err := audit.WriteLostMarker(lost, 3, at.Add(time.Second)); !errors.Is(err, syscall.ENOSPC) {
		t.Errorf("WriteLostMarker without inodes = %v; want ENOSPC", err)
	}
}
