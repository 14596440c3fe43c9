package audit_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/toolgate/toolgate/audit"
)

func allowEv(id, via string) audit.Event {
	e := audit.Event{EventID: id, EventType: "agent.tool.authorized", CorrelationID: "corr-" + id, Verdict: "allow", Code: "ok",
		Layer: "approval", AgentID: "agent-a", Principal: "user:alice", ToolID: "tool:fs-write", ToolName: "fs_write",
		ArgsDigest: strings.Repeat("ab", 32), OccurredAt: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	if via != "" {
		e.Details = map[string]any{"via": via}
	}
	return e
}

func after(typ, causation string) audit.Event {
	return audit.Event{EventID: typ + "-" + causation, EventType: typ, CausationID: causation, Verdict: "allow", Code: "ok"}
}

func marker(id string, details map[string]any) audit.Event {
	return audit.Event{EventID: id, EventType: "gateway.started", Details: details}
}

func TestSpillFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "spill.jsonl")
	if evs, sum, err := audit.ReadSpill(path); err != nil || evs != nil || sum != "" {
		t.Fatalf("ReadSpill of a missing file = %v, %q, %v; want nothing", evs, sum, err)
	}
	sealed, _, _ := audit.Seal(audit.Head{}, denial(0)) // WriteSpill drops the chain fields
	if err := audit.WriteSpill(path, []audit.Event{sealed, denial(1)}); err != nil {
		t.Fatal(err)
	}
	if err := audit.WriteSpill(path, []audit.Event{denial(2)}); err != nil {
		t.Fatal(err)
	}
	evs, sum, err := audit.ReadSpill(path)
	if err != nil || len(sum) != 64 {
		t.Fatalf("ReadSpill = %v, %q", err, sum)
	}
	var ids []string
	for _, e := range evs {
		ids = append(ids, e.EventID)
		if e.Seq != 0 || e.Hash != "" || e.PrevHash != "" {
			t.Errorf("spilled event %s kept chain fields: %+v", e.EventID, e)
		}
	}
	if diff := cmp.Diff([]string{"deny-0", "deny-1", "deny-2"}, ids); diff != "" {
		t.Errorf("spilled events (-want +got):\n%s", diff)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("spill file mode %v, %v; want 0600", fi.Mode(), err)
	}
	left, _ := filepath.Glob(filepath.Join(dir, ".spill-*"))
	if len(left) != 0 {
		t.Errorf("temporary files left: %v", left)
	}
	// A damaged file is neither replayed in part nor overwritten.
	b, _ := os.ReadFile(path)
	bad := append(b, []byte("{\"event_id\":\"x\",\n")...)
	os.WriteFile(path, bad, 0o600)
	if _, _, err := audit.ReadSpill(path); err == nil || !strings.Contains(err.Error(), "line 4") {
		t.Errorf("ReadSpill of a damaged file = %v; want an error naming line 4", err)
	}
	if err := audit.WriteSpill(path, []audit.Event{denial(3)}); err == nil {
		t.Error("WriteSpill over a damaged spill file succeeded")
	}
	if got, _ := os.ReadFile(path); string(got) != string(bad) {
		t.Error("WriteSpill changed a damaged spill file")
	}
}

// TestRecover: at start, the previous run's allows without an outcome are
// marked agent.tool.outcome_unknown (causation_id: the allow), its spilled
// events are appended once, and a gateway.started event bounds the next
// scan.
func TestRecover(t *testing.T) {
	tests := []struct {
		name  string
		log   []audit.Event
		spill []audit.Event
		// spillReplayed puts the spill file's sha256 in the last marker, as
		// a start that crashed before removing the file would have.
		spillReplayed bool
		wantUnknown   []string // causation ids, in order
		wantReplayed  []string
	}{
		{name: "empty log"},
		{name: "completed", log: []audit.Event{allowEv("a1", "mcp"), after("agent.tool.completed", "a1")}},
		{name: "failed", log: []audit.Event{allowEv("a1", "mcp"), after("agent.tool.failed", "a1")}},
		{name: "no outcome", log: []audit.Event{allowEv("a1", "mcp"), allowEv("a2", "http"), after("agent.tool.completed", "a2"), allowEv("a3", "")},
			wantUnknown: []string{"a1", "a3"}},
		{name: "outcome unknown already", log: []audit.Event{allowEv("a1", "mcp"), after("agent.tool.outcome_unknown", "a1")}},
		{name: "decide only", log: func() []audit.Event {
			a := allowEv("a1", "http")
			a.Details["decide_only"] = true
			return []audit.Event{a}
		}()},
		{name: "the CLI's own call", log: []audit.Event{allowEv("a1", "cli")}},
		{name: "refused after its record could not be confirmed", log: []audit.Event{allowEv("a1", "mcp"),
			{EventID: "r1", EventType: "agent.tool.unauthorized", CausationID: "a1", Verdict: "deny", Code: "internal_error", Layer: "internal",
				Details: map[string]any{"refused_allow_event_id": "a1"}}}},
		{name: "an internal_error refusal whose causation the caller chose does not settle it", log: []audit.Event{allowEv("a1", "mcp"),
			{EventID: "r1", EventType: "agent.tool.unauthorized", CausationID: "a1", Verdict: "deny", Code: "internal_error", Layer: "internal"}},
			wantUnknown: []string{"a1"}},
		{name: "a denial naming an allow does not settle it", log: []audit.Event{allowEv("a1", "mcp"),
			{EventID: "r1", EventType: "agent.tool.unauthorized", CausationID: "a1", Verdict: "deny", Code: "not_in_ceiling", Layer: "ceiling"}},
			wantUnknown: []string{"a1"}},
		{name: "before the previous start", log: []audit.Event{allowEv("a0", "mcp"), marker("m1", nil), allowEv("a1", "mcp")},
			wantUnknown: []string{"a1"}},
		{name: "completion in the spill", log: []audit.Event{allowEv("a1", "mcp"), allowEv("a2", "mcp")},
			spill:       []audit.Event{denial(1), after("agent.tool.completed", "a1")},
			wantUnknown: []string{"a2"}, wantReplayed: []string{"deny-1", "agent.tool.completed-a1"}},
		{name: "spill partly in the log", log: []audit.Event{allowEv("a1", "mcp"), denial(1)},
			spill:       []audit.Event{denial(1), denial(2)},
			wantUnknown: []string{"a1"}, wantReplayed: []string{"deny-2"}},
		{name: "spill already replayed", log: []audit.Event{denial(1)}, spill: []audit.Event{denial(1)}, spillReplayed: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			s := openSQLite(t)
			spillPath := filepath.Join(t.TempDir(), "spill.jsonl")
			if len(tt.spill) > 0 {
				if err := audit.WriteSpill(spillPath, tt.spill); err != nil {
					t.Fatal(err)
				}
			}
			log := slices.Clone(tt.log)
			if tt.spillReplayed {
				_, sum, _ := audit.ReadSpill(spillPath)
				log = append(log, marker("m0", map[string]any{"spill_sha256": sum}))
			}
			if len(log) > 0 {
				if _, err := s.AppendEvents(ctx, log); err != nil {
					t.Fatal(err)
				}
			}
			now := time.Date(2026, 2, 2, 0, 0, 0, 0, time.UTC)
			rep, err := audit.Recover(ctx, s, &audit.RecoverOptions{SpillPath: spillPath, Now: func() time.Time { return now },
				Details: map[string]any{"version": "test"}})
			if err != nil {
				t.Fatal(err)
			}
			var unknown []string
			for _, u := range rep.OutcomeUnknown {
				unknown = append(unknown, u.CausationID)
				if u.EventType != "agent.tool.outcome_unknown" || u.CorrelationID != "corr-"+u.CausationID || u.Principal != "user:alice" ||
					u.ToolID != "tool:fs-write" || !strings.Contains(u.Reason, "the gateway stopped") || u.Seq == 0 {
					t.Errorf("outcome_unknown event %+v", u)
				}
			}
			if diff := cmp.Diff(tt.wantUnknown, unknown); diff != "" {
				t.Errorf("outcome_unknown for (-want +got):\n%s", diff)
			}
			if rep.Replayed != len(tt.wantReplayed) || rep.SpillAlreadyReplayed != tt.spillReplayed {
				t.Errorf("replayed %d (already %v); want %d (%v)", rep.Replayed, rep.SpillAlreadyReplayed, len(tt.wantReplayed), tt.spillReplayed)
			}
			if _, err := os.Stat(spillPath); !os.IsNotExist(err) {
				t.Errorf("the spill file is still there: %v", err)
			}
			// The log: what was there, the replayed events, the outcome
			// events, then the marker.
			evs, err := audit.ReadEvents(ctx, s, int64(len(log))+1, 1000)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, e := range evs {
				got = append(got, e.EventType+" "+e.EventID)
			}
			var want []string
			for _, id := range tt.wantReplayed {
				for _, e := range tt.spill {
					if e.EventID == id {
						want = append(want, e.EventType+" "+id)
					}
				}
			}
			for _, u := range rep.OutcomeUnknown {
				want = append(want, "agent.tool.outcome_unknown "+u.EventID)
			}
			want = append(want, "gateway.started "+rep.Started.EventID)
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("appended (-want +got):\n%s", diff)
			}
			if d := rep.Started.Details; d["version"] != "test" || d["outcome_unknown"] != jsonNumber(len(tt.wantUnknown)) {
				t.Errorf("gateway.started details %v", d)
			}
			// A second start (even one after a crash right after the first)
			// finds nothing more to mark and reads only the marker's run.
			rep2, err := audit.Recover(ctx, s, nil)
			if err != nil {
				t.Fatal(err)
			}
			if len(rep2.OutcomeUnknown) != 0 || rep2.Replayed != 0 || rep2.PreviousStart != rep.Started.Seq || rep2.Scanned != 0 {
				t.Errorf("second Recover = %+v; want nothing to do, the scan bounded by seq %d", rep2, rep.Started.Seq)
			}
			if rep, err := audit.Verify(ctx, s); err != nil || !rep.OK {
				t.Errorf("Verify = %+v, %v", rep, err)
			}
		})
	}
}

func TestRecoverRefuses(t *testing.T) {
	ctx := context.Background()
	t.Run("damaged spill file", func(t *testing.T) {
		s := openSQLite(t)
		path := filepath.Join(t.TempDir(), "spill.jsonl")
		os.WriteFile(path, []byte("not an event\n"), 0o600)
		if _, err := audit.Recover(ctx, s, &audit.RecoverOptions{SpillPath: path}); err == nil || !strings.Contains(err.Error(), "move the file away") {
			t.Errorf("Recover with a damaged spill file = %v; want an error saying what to do", err)
		}
		if head, _ := s.AuditHead(ctx); head.Seq != 0 {
			t.Errorf("Recover wrote %d events", head.Seq)
		}
	})
	t.Run("undecodable record", func(t *testing.T) {
		s := openSQLite(t)
		if _, err := s.AppendEvents(ctx, []audit.Event{allowEv("a1", "mcp")}); err != nil {
			t.Fatal(err)
		}
		db := rawDB(t, s.Path())
		db.Exec(`DROP TRIGGER audit_events_no_update`)
		if _, err := db.Exec(`UPDATE audit_events SET body = 'x'`); err != nil {
			t.Fatal(err)
		}
		if _, err := audit.Recover(ctx, s, nil); err == nil || !strings.Contains(err.Error(), "audit verify") {
			t.Errorf("Recover over an undecodable record = %v; want an error pointing at audit verify", err)
		}
	})
}

// rawDB opens a SQLite file directly, bypassing the store.
func rawDB(t *testing.T, path string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", path+"?_busy_timeout=5000")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// FuzzParseHead: a head that parses prints back as the text it came from
// (trimmed), and nothing else parses.
func FuzzParseHead(f *testing.F) {
	f.Add("5:" + strings.Repeat("ab", 32))
	f.Add(" 12:" + strings.Repeat("0", 64) + "\n")
	f.Add("0:" + strings.Repeat("a", 64))
	f.Add("+1:" + strings.Repeat("a", 64))
	f.Add("1:" + strings.Repeat("A", 64))
	f.Fuzz(func(t *testing.T, s string) {
		h, err := audit.ParseHead(s)
		if err != nil {
			return
		}
		if h.Seq < 1 || len(h.Hash) != 64 {
			t.Fatalf("ParseHead(%q) = %+v", s, h)
		}
		back, err := audit.ParseHead(h.String())
		if err != nil || back != h {
			t.Fatalf("ParseHead(%q).String() = %q does not parse back: %+v %v", s, h.String(), back, err)
		}
	})
}

// FuzzReadSpill: a spill file either reads as events, which write back and
// read again as the same events, or is refused as a whole.
func FuzzReadSpill(f *testing.F) {
	var buf strings.Builder
	for i := range 3 {
		b, _ := json.Marshal(denial(i))
		buf.Write(b)
		buf.WriteByte('\n')
	}
	f.Add([]byte(buf.String()))
	f.Add([]byte("\n\n"))
	f.Add([]byte(`{"event_id":"x","VERDICT":"allow"}` + "\n"))
	f.Add([]byte(`{"event_id":"x"} {"event_id":"y"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		dir := t.TempDir()
		in := filepath.Join(dir, "in.jsonl")
		if err := os.WriteFile(in, data, 0o600); err != nil {
			t.Fatal(err)
		}
		evs, _, err := audit.ReadSpill(in)
		if err != nil || len(evs) == 0 {
			return
		}
		out := filepath.Join(dir, "out.jsonl")
		if err := audit.WriteSpill(out, evs); err != nil {
			t.Fatalf("WriteSpill of events ReadSpill returned: %v", err)
		}
		again, _, err := audit.ReadSpill(out)
		if err != nil {
			t.Fatalf("ReadSpill of what WriteSpill wrote: %v", err)
		}
		for i := range evs {
			evs[i].Seq, evs[i].PrevHash, evs[i].Hash = 0, "", ""
		}
		if diff := cmp.Diff(evs, again); diff != "" {
			t.Errorf("spill round trip (-want +got):\n%s", diff)
		}
	})
}
