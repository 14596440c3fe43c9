// Package storetest is the one contract suite every toolgate store runs
// (store/sqlite, store/postgres): what audit.Store and approval.Store
// promise, checked the same way against each real database. A backend's
// _test.go calls RunAudit and RunApprovals with a function that opens a
// fresh, isolated database.
package storetest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/toolgate/toolgate/audit"
)

// AuditHarness is what RunAudit needs from a backend.
type AuditHarness struct {
	// Store is a store over a fresh, empty database.
	Store audit.Store
	// Open opens another store on the same database, as another process
	// would. The suite appends through both at once to check the chain
	// does not fork.
	Open func(t *testing.T) audit.Store
	// Exec runs raw SQL on the database behind Store, bypassing the store:
	// the tamper tests use it as an attacker with access to the file or
	// the tables would. Statements use the placeholders {events} and {head}
	// for the (qualified) table names; the harness substitutes them.
	Exec func(query string) error
	// DropTriggers removes the append-only triggers (an attacker would do
	// that first).
	DropTriggers func() error
}

// base is the suite's clock: every time is derived from it, microsecond
// aligned so that every backend stores it exactly.
var base = time.Date(2026, 3, 4, 5, 6, 7, 890123000, time.UTC)

func testEvent(i int) audit.Event {
	verdict, code, typ := "allow", "ok", "agent.tool.authorized"
	if i%3 == 2 {
		verdict, code, typ = "deny", "not_in_ceiling", "agent.tool.unauthorized"
	}
	ev := audit.Event{
		EventID:       fmt.Sprintf("ev-%04d", i),
		EventType:     typ,
		OccurredAt:    base.Add(time.Duration(i) * time.Millisecond),
		CorrelationID: fmt.Sprintf("corr-%d", i/2),
		CausationID:   fmt.Sprintf("req-%d", i),
		AgentID:       "agent-support",
		AgentVersion:  "3",
		Principal:     "user:alice",
		InstanceID:    "acme",
		Environment:   "staging",
		ToolID:        "tool:supabase-write",
		ToolName:      "supabase_write",
		Verdict:       verdict,
		Code:          code,
		Layer:         "ceiling",
		Reason:        `tool "supabase_write" <is> & stays`,
		ArgsDigest:    strings.Repeat("ab", 32),
	}
	if i%4 == 1 {
		ev.Details = map[string]any{"errors": []any{"a", json.Number("1.50")}, "z": true, "a": nil}
		ev.Attempts = 2
		ev.DurationMS = 17
		ev.ReturnedBytes = 1 << 40
		ev.ApprovalID = "apr_X"
	}
	return ev
}

// appendN appends events numbered from, from+1, …, one batch.
func appendN(t *testing.T, s audit.Store, from, n int) []audit.Event {
	t.Helper()
	evs := make([]audit.Event, n)
	for i := range evs {
		evs[i] = testEvent(from + i)
	}
	out, err := s.AppendEvents(context.Background(), evs)
	if err != nil {
		t.Fatalf("AppendEvents: %v", err)
	}
	return out
}

func mustVerify(t *testing.T, s audit.Store) audit.Report {
	t.Helper()
	rep, err := audit.Verify(context.Background(), s)
	if err != nil {
		t.Fatalf("Verify: %v", err)
	}
	return rep
}

// hashAt returns the hash of the record stored at seq.
func hashAt(t *testing.T, h *AuditHarness, seq int64) string {
	t.Helper()
	recs, err := h.Store.ReadRecords(context.Background(), seq, 1)
	if err != nil || len(recs) != 1 {
		t.Fatalf("read seq %d: %d records, %v", seq, len(recs), err)
	}
	ev, err := recs[0].Event()
	if err != nil {
		t.Fatal(err)
	}
	return ev.Hash
}

// sqlQuote quotes s as an SQL string literal.
func sqlQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// RunAudit runs the audit.Store contract. newHarness must return a harness
// over a fresh database for every call (and clean it up with t.Cleanup); it
// is called from parallel subtests.
func RunAudit(t *testing.T, newHarness func(t *testing.T) *AuditHarness) {
	ctx := context.Background()

	t.Run("Empty", func(t *testing.T) {
		h := newHarness(t)
		head, err := h.Store.AuditHead(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(audit.Head{Seq: 0, Hash: audit.GenesisHash}, head); diff != "" {
			t.Errorf("head of empty log (-want +got):\n%s", diff)
		}
		recs, err := h.Store.ReadRecords(ctx, 1, 10)
		if err != nil || len(recs) != 0 {
			t.Errorf("ReadRecords on empty log = %d records, %v; want none", len(recs), err)
		}
		out, err := h.Store.AppendEvents(ctx, nil)
		if err != nil || len(out) != 0 {
			t.Errorf("AppendEvents(nil) = %v, %v; want no-op", out, err)
		}
		rep := mustVerify(t, h.Store)
		if diff := cmp.Diff(audit.Report{OK: true, Head: head, LastGood: head}, rep); diff != "" {
			t.Errorf("Verify of empty log (-want +got):\n%s", diff)
		}
	})

	t.Run("AppendAndRead", func(t *testing.T) {
		h := newHarness(t)
		first := appendN(t, h.Store, 0, 3)
		second := appendN(t, h.Store, 3, 2)
		sealed := append(first, second...)
		prev := audit.GenesisHash
		for i, ev := range sealed {
			if ev.Seq != int64(i+1) || ev.PrevHash != prev {
				t.Errorf("event %d: seq %d prev %.8s; want seq %d prev %.8s", i, ev.Seq, ev.PrevHash, i+1, prev)
			}
			if err := audit.CheckHash(ev); err != nil {
				t.Errorf("event %d: %v", i, err)
			}
			prev = ev.Hash
		}
		got, err := audit.ReadEvents(ctx, h.Store, 1, 100)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(sealed, got); diff != "" {
			t.Errorf("read events differ from appended (-want +got):\n%s", diff)
		}
		page, err := audit.ReadEvents(ctx, h.Store, 2, 2)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(sealed[1:3], page); diff != "" {
			t.Errorf("ReadEvents(from 2, limit 2) (-want +got):\n%s", diff)
		}
		head, err := h.Store.AuditHead(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(audit.Head{Seq: 5, Hash: sealed[4].Hash}, head); diff != "" {
			t.Errorf("head (-want +got):\n%s", diff)
		}
		rep := mustVerify(t, h.Store)
		if !rep.OK || rep.Checked != 5 {
			t.Errorf("Verify = %+v; want OK with 5 checked", rep)
		}
		// Another store on the same database sees the same chain.
		other := h.Open(t)
		got2, err := audit.ReadEvents(ctx, other, 1, 100)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(sealed, got2); diff != "" {
			t.Errorf("second store reads (-want +got):\n%s", diff)
		}
	})

	t.Run("LargeBatch", func(t *testing.T) {
		h := newHarness(t)
		appendN(t, h.Store, 0, 1)
		sealed := appendN(t, h.Store, 1, 300)
		if last := sealed[len(sealed)-1]; last.Seq != 301 {
			t.Errorf("last seq = %d; want 301", last.Seq)
		}
		if rep := mustVerify(t, h.Store); !rep.OK || rep.Checked != 301 {
			t.Errorf("Verify = %+v; want OK with 301 records", rep)
		}
		recs, err := h.Store.ReadRecords(ctx, 1, 0)
		if err != nil || len(recs) == 0 {
			t.Errorf("ReadRecords with limit 0 = %d records, %v; want a default page", len(recs), err)
		}
	})

	t.Run("BadDetailsFailWholeBatch", func(t *testing.T) {
		h := newHarness(t)
		good := testEvent(0)
		bad := testEvent(1)
		bad.Details = map[string]any{"ch": make(chan int)}
		if _, err := h.Store.AppendEvents(ctx, []audit.Event{good, bad}); err == nil {
			t.Fatal("AppendEvents with unencodable details succeeded")
		}
		head, err := h.Store.AuditHead(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if head.Seq != 0 {
			t.Errorf("head after failed batch = %d; want 0 (nothing written)", head.Seq)
		}
	})

	t.Run("ConcurrentAppendersDoNotFork", func(t *testing.T) {
		h := newHarness(t)
		stores := []audit.Store{h.Store, h.Open(t)}
		const workers, rounds = 6, 15
		var wg sync.WaitGroup
		errs := make(chan error, workers*rounds)
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				s := stores[w%len(stores)]
				for r := range rounds {
					n := 1 + (w+r)%3
					evs := make([]audit.Event, n)
					for i := range evs {
						evs[i] = testEvent(w*1000 + r*10 + i)
					}
					if _, err := s.AppendEvents(ctx, evs); err != nil {
						errs <- err
						return
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatalf("concurrent append: %v", err)
		}
		want := int64(0)
		for w := range workers {
			for r := range rounds {
				want += int64(1 + (w+r)%3)
			}
		}
		rep := mustVerify(t, h.Store)
		if !rep.OK || rep.Checked != want || rep.Head.Seq != want {
			t.Errorf("Verify after concurrent appends = %+v; want OK with %d records", rep, want)
		}
		evs, err := audit.ReadEvents(ctx, h.Store, 1, int(want)+10)
		if err != nil {
			t.Fatal(err)
		}
		seen := map[string]bool{}
		for _, ev := range evs {
			if seen[ev.EventID] {
				t.Errorf("event %s stored twice", ev.EventID)
			}
			seen[ev.EventID] = true
		}
	})

	t.Run("AppendOnlyTriggers", func(t *testing.T) {
		h := newHarness(t)
		appendN(t, h.Store, 0, 3)
		for _, q := range []string{
			`UPDATE {events} SET body = body WHERE seq = 2`,
			`DELETE FROM {events} WHERE seq = 3`,
			`UPDATE {head} SET seq = 1 WHERE id = 1`,
			`DELETE FROM {head}`,
		} {
			if err := h.Exec(q); err == nil {
				t.Errorf("%s: succeeded; want the append-only trigger to refuse it", q)
			}
		}
		if rep := mustVerify(t, h.Store); !rep.OK || rep.Checked != 3 {
			t.Errorf("Verify after refused tampering = %+v; want OK", rep)
		}
	})

	t.Run("Tamper", func(t *testing.T) {
		forged := func(t *testing.T, h *AuditHarness) string {
			// A record 3 re-sealed with other content and a hash that
			// matches it: only the link from record 4 gives it away.
			recs, err := h.Store.ReadRecords(ctx, 2, 1)
			if err != nil {
				t.Fatal(err)
			}
			prev, err := recs[0].Event()
			if err != nil {
				t.Fatal(err)
			}
			ev := testEvent(2)
			ev.Verdict, ev.Code = "allow", "ok"
			_, body, err := audit.Seal(audit.Head{Seq: prev.Seq, Hash: prev.Hash}, ev)
			if err != nil {
				t.Fatal(err)
			}
			return `UPDATE {events} SET body = '` + strings.ReplaceAll(string(body), "'", "''") + `' WHERE seq = 3`
		}
		tests := []struct {
			name   string
			tamper func(t *testing.T, h *AuditHarness) []string
			want   audit.Problem
		}{
			{
				name: "edited verdict",
				tamper: func(*testing.T, *AuditHarness) []string {
					return []string{`UPDATE {events} SET body = replace(body, '"verdict":"deny"', '"verdict":"allow"') WHERE seq = 3`}
				},
				want: audit.Problem{Seq: 3, Kind: audit.Edited},
			},
			{
				name: "edited hash only",
				tamper: func(*testing.T, *AuditHarness) []string {
					return []string{`UPDATE {events} SET body = replace(body, '"hash":"', '"hash":"0') WHERE seq = 2`}
				},
				want: audit.Problem{Seq: 2, Kind: audit.Edited},
			},
			{
				name: "body not JSON",
				tamper: func(*testing.T, *AuditHarness) []string {
					return []string{`UPDATE {events} SET body = 'x' WHERE seq = 4`}
				},
				want: audit.Problem{Seq: 4, Kind: audit.Edited},
			},
			{
				name: "removed from the middle",
				tamper: func(*testing.T, *AuditHarness) []string {
					return []string{`DELETE FROM {events} WHERE seq = 3`}
				},
				want: audit.Problem{Seq: 3, Kind: audit.Removed},
			},
			{
				name: "removed first",
				tamper: func(*testing.T, *AuditHarness) []string {
					return []string{`DELETE FROM {events} WHERE seq = 1`}
				},
				want: audit.Problem{Seq: 1, Kind: audit.Removed},
			},
			{
				name: "removed newest",
				tamper: func(*testing.T, *AuditHarness) []string {
					return []string{`DELETE FROM {events} WHERE seq = 5`}
				},
				want: audit.Problem{Seq: 5, Kind: audit.Removed},
			},
			{
				name: "removed and renumbered",
				tamper: func(*testing.T, *AuditHarness) []string {
					return []string{
						`DELETE FROM {events} WHERE seq = 3`,
						`UPDATE {events} SET seq = seq - 1 WHERE seq = 4`,
						`UPDATE {events} SET seq = seq - 1 WHERE seq = 5`,
					}
				},
				want: audit.Problem{Seq: 3, Kind: audit.Removed},
			},
			{
				name: "reordered by swapping seq",
				tamper: func(*testing.T, *AuditHarness) []string {
					return []string{
						`UPDATE {events} SET seq = -1 WHERE seq = 2`,
						`UPDATE {events} SET seq = 2 WHERE seq = 4`,
						`UPDATE {events} SET seq = 4 WHERE seq = -1`,
					}
				},
				want: audit.Problem{Seq: 2, Kind: audit.Reordered},
			},
			{
				name: "replaced with a re-sealed record",
				tamper: func(t *testing.T, h *AuditHarness) []string {
					return []string{forged(t, h)}
				},
				want: audit.Problem{Seq: 4, Kind: audit.Removed},
			},
			{
				name: "body with a duplicated key",
				tamper: func(*testing.T, *AuditHarness) []string {
					// A reader that takes the first "verdict" sees allow;
					// encoding/json takes the last, so the hash still matches.
					return []string{`UPDATE {events} SET body = replace(body, '{"agent_id"', '{"verdict":"allow","agent_id"') WHERE seq = 3`}
				},
				want: audit.Problem{Seq: 3, Kind: audit.Edited},
			},
			{
				name: "key in other case",
				tamper: func(*testing.T, *AuditHarness) []string {
					return []string{`UPDATE {events} SET body = replace(body, '"verdict":"deny"', '"VERDICT":"deny"') WHERE seq = 3`}
				},
				want: audit.Problem{Seq: 3, Kind: audit.Edited},
			},
			{
				name: "spacing added",
				tamper: func(*testing.T, *AuditHarness) []string {
					return []string{`UPDATE {events} SET body = replace(body, '{"agent_id"', '{ "agent_id"') WHERE seq = 2`}
				},
				want: audit.Problem{Seq: 2, Kind: audit.Edited},
			},
			{
				name: "escape in other form",
				tamper: func(*testing.T, *AuditHarness) []string {
					return []string{`UPDATE {events} SET body = replace(body, '"agent_id":"agent-support"', '"agent_id":"\u0061gent-support"') WHERE seq = 4`}
				},
				want: audit.Problem{Seq: 4, Kind: audit.Edited},
			},
			{
				name: "head moved back",
				tamper: func(t *testing.T, h *AuditHarness) []string {
					// The head names record 3 exactly: records 4 and 5
					// would go unchecked.
					return []string{`UPDATE {head} SET seq = 3, hash = '` + hashAt(t, h, 3) + `' WHERE id = 1`}
				},
				want: audit.Problem{Seq: 4, Kind: audit.Edited},
			},
			{
				name: "head reset to the empty log",
				tamper: func(*testing.T, *AuditHarness) []string {
					return []string{`UPDATE {head} SET seq = 0, hash = '` + audit.GenesisHash + `' WHERE id = 1`}
				},
				want: audit.Problem{Seq: 1, Kind: audit.Edited},
			},
			{
				name: "head rewritten",
				tamper: func(*testing.T, *AuditHarness) []string {
					return []string{`UPDATE {head} SET hash = '` + strings.Repeat("1", 64) + `' WHERE id = 1`}
				},
				want: audit.Problem{Seq: 5, Kind: audit.Edited},
			},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				t.Parallel() // each case has its own database
				h := newHarness(t)
				appendN(t, h.Store, 0, 2)
				appendN(t, h.Store, 2, 3)
				if rep := mustVerify(t, h.Store); !rep.OK {
					t.Fatalf("Verify before tampering = %+v", rep)
				}
				if err := h.DropTriggers(); err != nil {
					t.Fatalf("drop triggers: %v", err)
				}
				for _, q := range tt.tamper(t, h) {
					if err := h.Exec(q); err != nil {
						t.Fatalf("tamper %q: %v", q, err)
					}
				}
				rep := mustVerify(t, h.Store)
				if rep.OK || rep.Problem == nil {
					t.Fatalf("Verify after tampering = %+v; want a problem", rep)
				}
				got := *rep.Problem
				if got.Detail == "" {
					t.Errorf("problem has no detail")
				}
				got.Detail = ""
				if diff := cmp.Diff(tt.want, got); diff != "" {
					t.Errorf("first problem (-want +got):\n%s\ndetail: %s", diff, rep.Problem.Detail)
				}
			})
		}
	})
	// What Verify alone cannot see (a chain cut back with its head moved to
	// match, or re-sealed whole with the store's own code) is caught by a
	// head kept outside the database.
	t.Run("AnchorDetectsRewrites", func(t *testing.T) {
		tests := []struct {
			name   string
			tamper func(t *testing.T, h *AuditHarness) []string
			anchor int64 // the seq of the head kept outside, taken before the tampering
			want   string
		}{
			{
				name: "tail cut and head moved to match",
				tamper: func(t *testing.T, h *AuditHarness) []string {
					return []string{`DELETE FROM {events} WHERE seq > 3`, `UPDATE {head} SET seq = 3, hash = '` + hashAt(t, h, 3) + `' WHERE id = 1`}
				},
				anchor: 5,
				want:   "records were removed from the end",
			},
			{
				name:   "re-sealed whole",
				tamper: reseal(3),
				anchor: 5,
				want:   "re-sealed",
			},
			{
				name:   "re-sealed from before an earlier anchor",
				tamper: reseal(1),
				anchor: 2,
				want:   "re-sealed",
			},
			{
				// The limit: an anchor vouches for the records up to it.
				name:   "re-sealed only after the anchor",
				tamper: reseal(3),
				anchor: 2,
				want:   "",
			},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				t.Parallel()
				h := newHarness(t)
				appendN(t, h.Store, 0, 5)
				anchor := audit.Head{Seq: tt.anchor, Hash: hashAt(t, h, tt.anchor)}
				if err := audit.CheckAnchor(ctx, h.Store, mustVerify(t, h.Store), anchor); err != nil {
					t.Fatalf("CheckAnchor before tampering: %v", err)
				}
				if err := h.DropTriggers(); err != nil {
					t.Fatalf("drop triggers: %v", err)
				}
				for _, q := range tt.tamper(t, h) {
					if err := h.Exec(q); err != nil {
						t.Fatalf("tamper %q: %v", q, err)
					}
				}
				rep := mustVerify(t, h.Store)
				if !rep.OK {
					t.Fatalf("Verify = %+v; this rewrite is one Verify alone cannot see (the case is meant to show the anchor's use)", rep)
				}
				err := audit.CheckAnchor(ctx, h.Store, rep, anchor)
				if tt.want == "" {
					if err != nil {
						t.Errorf("CheckAnchor = %v; want nil (the records up to the anchor are untouched)", err)
					}
					return
				}
				if !errors.Is(err, audit.ErrAnchorMismatch) || !strings.Contains(err.Error(), tt.want) {
					t.Errorf("CheckAnchor after tampering = %v; want ErrAnchorMismatch saying %q", err, tt.want)
				}
			})
		}
	})
}

// reseal returns a tamper that rewrites every record, the one at seq
// changed (it becomes an allow), re-sealed with audit.Seal, and moves
// the head to match: what someone with the database and this code could do.
func reseal(seq int64) func(t *testing.T, h *AuditHarness) []string {
	return func(t *testing.T, h *AuditHarness) []string { return resealAt(t, h, seq) }
}

func resealAt(t *testing.T, h *AuditHarness, seq int64) []string {
	t.Helper()
	recs, err := h.Store.ReadRecords(context.Background(), 1, 100)
	if err != nil {
		t.Fatal(err)
	}
	var qs []string
	head := audit.Head{}
	for _, r := range recs {
		ev, err := r.Event()
		if err != nil {
			t.Fatal(err)
		}
		if ev.Seq == seq {
			ev.Verdict, ev.Code, ev.Reason = "allow", "ok", "rewritten"
		}
		sealed, body, err := audit.Seal(head, ev)
		if err != nil {
			t.Fatal(err)
		}
		head = audit.Head{Seq: sealed.Seq, Hash: sealed.Hash}
		qs = append(qs, fmt.Sprintf(`UPDATE {events} SET body = %s WHERE seq = %d`, sqlQuote(string(body)), sealed.Seq))
	}
	return append(qs, fmt.Sprintf(`UPDATE {head} SET seq = %d, hash = '%s' WHERE id = 1`, head.Seq, head.Hash))
}
