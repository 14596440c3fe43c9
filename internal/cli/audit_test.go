package cli_test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/toolgate/toolgate/audit"
	"github.com/toolgate/toolgate/internal/cli"
	"github.com/toolgate/toolgate/store/sqlite"
)

// tg runs toolgate with args and returns the exit code and both streams.
func tg(t *testing.T, ctx context.Context, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := cli.Run(ctx, args, strings.NewReader(""), &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

// sampleEvents are n realistic decision events, alternating allow and deny.
func sampleEvents(n int) []audit.Event {
	base := time.Date(2026, 3, 1, 9, 30, 0, 0, time.UTC)
	var evs []audit.Event
	for i := range n {
		ev := audit.Event{EventType: "agent.tool.authorized", OccurredAt: base.Add(time.Duration(i) * time.Second),
			CorrelationID: fmt.Sprintf("corr-%d", i+1), AgentID: "triage", AgentVersion: "3.0.0", Principal: "user:bob",
			ToolID: "tool:github-list-issues", ToolName: "github_list_issues", Verdict: "allow", Code: "ok",
			Reason: "allowed: every layer passed", ArgsDigest: strings.Repeat("ab", 32), DeploymentMode: "production"}
		if i%2 == 1 {
			ev.EventType, ev.Verdict, ev.Code, ev.Layer = "agent.tool.unauthorized", "deny", "policy_denied", "policy"
			ev.ToolID, ev.ToolName = "tool:github-delete-repo", "github_delete_repo"
			ev.Reason = "policy layer: tool:github-delete-repo matches denied glob tool:*-delete-* of tool policy triage-workspace"
		}
		evs = append(evs, ev)
	}
	return evs
}

// writeLog creates a data folder whose audit log holds evs, written through
// an audit.Recorder, and returns the folder.
func writeLog(t *testing.T, evs []audit.Event) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "data")
	st, err := sqlite.Open(filepath.Join(dir, "toolgate.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	appendEvents(t, st, evs)
	return dir
}

func appendEvents(t *testing.T, st audit.Store, evs []audit.Event) {
	t.Helper()
	ctx := context.Background()
	rec := audit.NewRecorder(st, nil)
	for _, ev := range evs {
		if _, err := rec.Record(ctx, ev); err != nil {
			t.Fatal(err)
		}
	}
	if err := rec.Close(ctx); err != nil {
		t.Fatal(err)
	}
}

// tamper runs SQL on the database directly, as someone with the file would,
// after dropping the append-only triggers.
func tamper(t *testing.T, dir string, stmts ...string) {
	t.Helper()
	db, err := sql.Open("sqlite", filepath.Join(dir, "toolgate.db")+"?_busy_timeout=5000")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	pre := []string{
		"DROP TRIGGER audit_events_no_update", "DROP TRIGGER audit_events_no_delete",
		"DROP TRIGGER audit_head_forward", "DROP TRIGGER audit_head_no_delete",
	}
	for _, q := range append(pre, stmts...) {
		if _, err := db.Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
}

func TestAuditVerify(t *testing.T) {
	tests := []struct {
		name     string
		tamper   []string
		wantSeq  int64
		wantKind audit.ProblemKind
	}{
		{name: "intact"},
		{name: "edited verdict", tamper: []string{
			`UPDATE audit_events SET body = replace(body, '"verdict":"deny"', '"verdict":"allow"') WHERE seq = 4`,
		}, wantSeq: 4, wantKind: audit.Edited},
		{name: "edited first record", tamper: []string{
			`UPDATE audit_events SET body = replace(body, 'user:bob', 'user:eve') WHERE seq = 1`,
		}, wantSeq: 1, wantKind: audit.Edited},
		{name: "body is not an event", tamper: []string{
			`UPDATE audit_events SET body = '{"oops":' WHERE seq = 2`,
		}, wantSeq: 2, wantKind: audit.Edited},
		{name: "removed from the middle", tamper: []string{
			`DELETE FROM audit_events WHERE seq = 3`,
		}, wantSeq: 3, wantKind: audit.Removed},
		{name: "removed and renumbered", tamper: []string{
			`DELETE FROM audit_events WHERE seq = 3`,
			`UPDATE audit_events SET seq = seq - 1 WHERE seq > 3`,
		}, wantSeq: 3, wantKind: audit.Removed},
		{name: "newest removed", tamper: []string{
			`DELETE FROM audit_events WHERE seq = 5`,
		}, wantSeq: 5, wantKind: audit.Removed},
		{name: "newest removed and head moved back", tamper: []string{
			`DELETE FROM audit_events WHERE seq = 5`,
			`UPDATE audit_head SET seq = 4`,
		}, wantSeq: 4, wantKind: audit.Edited},
		{name: "head moved back onto record 3", tamper: []string{
			// The head names record 3 exactly; records 4 and 5 would go
			// unchecked if verify stopped at the head.
			`UPDATE audit_head SET seq = 3, hash = (SELECT substr(body, instr(body, '"hash":"') + 8, 64) FROM audit_events WHERE seq = 3)`,
		}, wantSeq: 4, wantKind: audit.Edited},
		{name: "head reset to the empty log", tamper: []string{
			`UPDATE audit_head SET seq = 0, hash = '` + audit.GenesisHash + `'`,
		}, wantSeq: 1, wantKind: audit.Edited},
		{name: "duplicated key in a body", tamper: []string{
			`UPDATE audit_events SET body = replace(body, '{"agent_id"', '{"verdict":"allow","agent_id"') WHERE seq = 2`,
		}, wantSeq: 2, wantKind: audit.Edited},
		{name: "reordered", tamper: []string{
			`UPDATE audit_events SET seq = -2 WHERE seq = 2`,
			`UPDATE audit_events SET seq = 2 WHERE seq = 3`,
			`UPDATE audit_events SET seq = 3 WHERE seq = -2`,
		}, wantSeq: 2, wantKind: audit.Reordered},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := writeLog(t, sampleEvents(5))
			if tt.tamper != nil {
				tamper(t, dir, tt.tamper...)
			}
			ctx := context.Background()

			code, out, errOut := tg(t, ctx, "audit", "verify", "--data", dir)
			if tt.wantKind == "" {
				if code != 0 || !strings.Contains(out, ": OK, 5 records verified") {
					t.Fatalf("verify = %d\n%s%s; want exit 0 and OK", code, out, errOut)
				}
			} else {
				if code != cli.ExitFailure {
					t.Fatalf("verify exit = %d; want 1\n%s%s", code, out, errOut)
				}
				want := fmt.Sprintf("TAMPERED at seq %d: the record was %s", tt.wantSeq, tt.wantKind)
				if !strings.Contains(out, want) {
					t.Errorf("verify output lacks %q:\n%s", want, out)
				}
				if want := fmt.Sprintf("fails verification at seq %d (%s)", tt.wantSeq, tt.wantKind); !strings.Contains(errOut, want) {
					t.Errorf("stderr lacks %q: %s", want, errOut)
				}
			}

			code, out, _ = tg(t, ctx, "audit", "verify", "--data", dir, "-o", "json")
			var rep struct {
				Database string `json:"database"`
				audit.Report
			}
			if err := json.Unmarshal([]byte(out), &rep); err != nil {
				t.Fatalf("JSON output %q: %v", out, err)
			}
			var got *audit.Problem
			if rep.Problem != nil {
				got = &audit.Problem{Seq: rep.Problem.Seq, Kind: rep.Problem.Kind}
			}
			var want *audit.Problem
			if tt.wantKind != "" {
				want = &audit.Problem{Seq: tt.wantSeq, Kind: tt.wantKind}
			}
			if diff := cmp.Diff(want, got); diff != "" || rep.OK != (want == nil) || (code == 0) != rep.OK {
				t.Errorf("JSON report ok=%v exit %d, problem (-want +got):\n%s", rep.OK, code, diff)
			}
			if rep.Database != filepath.Join(dir, "toolgate.db") {
				t.Errorf("database = %q", rep.Database)
			}
		})
	}
}

// TestAuditVerifyExpect: verify prints the record count and head it
// checked, and --expect compares the log with a head kept outside it: a
// log cut back with its head moved to match, or re-sealed whole, passes the
// chain check but not that one.
func TestAuditVerifyExpect(t *testing.T) {
	ctx := context.Background()
	headOf := func(t *testing.T, dir string) audit.Head {
		t.Helper()
		st, err := sqlite.Open(filepath.Join(dir, "toolgate.db"), &sqlite.Options{ReadOnly: true})
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		h, err := st.AuditHead(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	tests := []struct {
		name    string
		tamper  func(t *testing.T, dir string)
		anchor  int64 // which record's head is kept outside (before tampering)
		wantOK  bool
		wantMsg string
	}{
		{name: "intact", anchor: 5, wantOK: true},
		{name: "intact, grown since", anchor: 3, wantOK: true, tamper: func(t *testing.T, dir string) {
			st, err := sqlite.Open(filepath.Join(dir, "toolgate.db"), nil)
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			appendEvents(t, st, sampleEvents(2))
		}},
		{name: "cut back, head moved to match", anchor: 5, wantMsg: "records were removed from the end", tamper: func(t *testing.T, dir string) {
			tamper(t, dir, `DELETE FROM audit_events WHERE seq > 3`,
				`UPDATE audit_head SET seq = 3, hash = (SELECT substr(body, instr(body, '"hash":"') + 8, 64) FROM audit_events WHERE seq = 3)`)
		}},
		{name: "re-sealed whole", anchor: 5, wantMsg: "re-sealed", tamper: func(t *testing.T, dir string) {
			// Someone with the file and toolgate's code writes a new log.
			os.Remove(filepath.Join(dir, "toolgate.db"))
			evs := sampleEvents(5)
			evs[1].Verdict, evs[1].Code = "allow", "ok"
			st, err := sqlite.Open(filepath.Join(dir, "toolgate.db"), nil)
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			appendEvents(t, st, evs)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := writeLog(t, sampleEvents(5))
			code, out, errOut := tg(t, ctx, "audit", "verify", "--data", dir)
			head := headOf(t, dir)
			if code != 0 || !strings.Contains(out, ": OK, 5 records verified") || !strings.Contains(out, fmt.Sprintf("head: seq 5, hash %s", head.Hash)) ||
				!strings.Contains(out, "--expect "+head.String()) {
				t.Fatalf("verify = %d\n%s%s; want OK naming 5 records, the head and how to pass it", code, out, errOut)
			}
			var anchor audit.Head
			{
				st, err := sqlite.Open(filepath.Join(dir, "toolgate.db"), &sqlite.Options{ReadOnly: true})
				if err != nil {
					t.Fatal(err)
				}
				evs, err := audit.ReadEvents(ctx, st, tt.anchor, 1)
				st.Close()
				if err != nil || len(evs) != 1 {
					t.Fatal(err)
				}
				anchor = audit.Head{Seq: evs[0].Seq, Hash: evs[0].Hash}
			}
			if tt.tamper != nil {
				tt.tamper(t, dir)
			}
			// The chain alone passes in every case.
			if code, out, errOut := tg(t, ctx, "audit", "verify", "--data", dir); code != 0 {
				t.Fatalf("verify without --expect = %d\n%s%s", code, out, errOut)
			}
			code, out, errOut = tg(t, ctx, "audit", "verify", "--data", dir, "--expect", anchor.String())
			if tt.wantOK {
				if code != 0 || !strings.Contains(out, "matches the head kept outside it") {
					t.Errorf("verify --expect = %d\n%s%s; want 0 and a match", code, out, errOut)
				}
			} else if code != cli.ExitFailure || !strings.Contains(out, "DOES NOT MATCH") || !strings.Contains(errOut, tt.wantMsg) {
				t.Errorf("verify --expect = %d\n%s%s; want 1 naming %q", code, out, errOut, tt.wantMsg)
			}
			code, out, _ = tg(t, ctx, "audit", "verify", "--data", dir, "--expect", anchor.String(), "-o", "json")
			var rep struct {
				OK              bool        `json:"ok"`
				Checked         int64       `json:"checked"`
				Head            audit.Head  `json:"head"`
				Expected        *audit.Head `json:"expected"`
				ExpectedOK      *bool       `json:"expected_ok"`
				ExpectedProblem string      `json:"expected_problem"`
			}
			if err := json.Unmarshal([]byte(out), &rep); err != nil {
				t.Fatalf("JSON output %q: %v", out, err)
			}
			now := headOf(t, dir)
			if !rep.OK || rep.Checked != now.Seq || rep.Head != now || rep.Expected == nil || *rep.Expected != anchor ||
				rep.ExpectedOK == nil || *rep.ExpectedOK != tt.wantOK || (code == 0) != tt.wantOK || !strings.Contains(rep.ExpectedProblem, tt.wantMsg) {
				t.Errorf("JSON = %s (exit %d); want checked %d, head %v, expected %v, expected_ok %v", out, code, now.Seq, now, anchor, tt.wantOK)
			}
		})
	}
	t.Run("bad --expect", func(t *testing.T) {
		dir := writeLog(t, sampleEvents(1))
		for _, bad := range []string{"5", "x:" + strings.Repeat("a", 64), "0:" + strings.Repeat("a", 64), "3:abc", "3:" + strings.Repeat("A", 64)} {
			if code, _, errOut := tg(t, ctx, "audit", "verify", "--data", dir, "--expect", bad); code != cli.ExitUsage || !strings.Contains(errOut, "--expect") {
				t.Errorf("--expect %q: exit %d, %s; want usage error", bad, code, errOut)
			}
		}
	})
}

// TestAuditReadsWithoutWriting: verify and tail open the database read-only:
// a log whose tables were dropped is refused (not recreated empty, which
// would verify), and the file is not changed.
func TestAuditReadsWithoutWriting(t *testing.T) {
	ctx := context.Background()
	dir := writeLog(t, sampleEvents(3))
	tamper(t, dir, "DROP TABLE audit_events", "DROP TABLE audit_head")
	for _, sub := range []string{"verify", "tail"} {
		code, out, errOut := tg(t, ctx, "audit", sub, "--data", dir)
		if code != cli.ExitFailure || !strings.Contains(errOut, "audit log was removed") {
			t.Errorf("audit %s on a database whose audit tables were dropped: exit %d\n%s%s; want 1 and 'audit log was removed'", sub, code, out, errOut)
		}
	}
	db, err := sql.Open("sqlite", filepath.Join(dir, "toolgate.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var n int
	if err := db.QueryRow(`SELECT count(*) FROM sqlite_master WHERE name IN ('audit_events', 'audit_head')`).Scan(&n); err != nil || n != 0 {
		t.Errorf("the audit tables were recreated (%d, %v)", n, err)
	}
}

func TestAuditNeedsADatabase(t *testing.T) {
	t.Setenv("TOOLGATE_BUNDLE", exampleBundle) // approvers are checked against the bundle
	ctx := context.Background()
	empty := t.TempDir()
	missing := filepath.Join(t.TempDir(), "nothing-here")
	tests := []struct {
		name string
		args []string
	}{
		{"verify in an empty folder", []string{"audit", "verify", "--data", empty}},
		{"verify in a missing folder", []string{"audit", "verify", "--data", missing}},
		{"tail in an empty folder", []string{"audit", "tail", "--data", empty}},
		{"approvals list in an empty folder", []string{"approvals", "list", "--data", empty}},
		{"approve in a missing folder", []string{"approvals", "approve", "apr_X", "--as", "user:carol", "--data", missing}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, out, errOut := tg(t, ctx, tt.args...)
			if code != cli.ExitFailure || !strings.Contains(errOut, "no toolgate database at ") || out != "" {
				t.Errorf("exit %d, stdout %q, stderr %q; want 1 and 'no toolgate database at'", code, out, errOut)
			}
		})
	}
	if _, err := os.Stat(filepath.Join(empty, "toolgate.db")); !os.IsNotExist(err) {
		t.Errorf("a database was created in %s: %v", empty, err)
	}
	if _, err := os.Stat(missing); !os.IsNotExist(err) {
		t.Errorf("the missing data folder was created: %v", err)
	}
}

func TestAuditUsage(t *testing.T) {
	ctx := context.Background()
	dir := writeLog(t, sampleEvents(1))
	tests := []struct {
		name     string
		args     []string
		wantCode int
		wantErr  string
	}{
		{"no subcommand", []string{"audit"}, cli.ExitUsage, "Usage: toolgate audit SUBCOMMAND"},
		{"unknown subcommand", []string{"audit", "check"}, cli.ExitUsage, `unknown subcommand "check"`},
		{"bad output", []string{"audit", "verify", "--data", dir, "-o", "yaml"}, cli.ExitUsage, `-o "yaml"`},
		{"negative n", []string{"audit", "tail", "--data", dir, "-n", "-1"}, cli.ExitUsage, "want 0 or more"},
		{"stray argument", []string{"audit", "verify", "--data", dir, "extra"}, cli.ExitUsage, `unexpected argument "extra"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, _, errOut := tg(t, ctx, tt.args...)
			if code != tt.wantCode || !strings.Contains(errOut, tt.wantErr) {
				t.Errorf("exit %d stderr %q; want %d and %q", code, errOut, tt.wantCode, tt.wantErr)
			}
		})
	}
}

func TestAuditTail(t *testing.T) {
	ctx := context.Background()
	dir := writeLog(t, sampleEvents(5))
	header := "SEQ     TIME                      TYPE                            VERDICT           CODE                  TOOL                        PRINCIPAL           REASON"
	row := func(seq int) string {
		if seq%2 == 0 {
			return fmt.Sprintf("%-6d  2026-03-01T09:30:%02d.000Z  agent.tool.unauthorized         deny              policy_denied         tool:github-delete-repo     user:bob            policy layer: tool:github-delete-repo matches denied glob tool:*-delete-* of tool policy triage-workspace", seq, seq-1)
		}
		return fmt.Sprintf("%-6d  2026-03-01T09:30:%02d.000Z  agent.tool.authorized           allow             ok                    tool:github-list-issues     user:bob            allowed: every layer passed", seq, seq-1)
	}
	tests := []struct {
		name string
		args []string
		want []string
	}{
		{"last two", []string{"-n", "2"}, []string{header, row(4), row(5)}},
		{"more than there are", []string{"-n", "50"}, []string{header, row(1), row(2), row(3), row(4), row(5)}},
		{"default", nil, []string{header, row(1), row(2), row(3), row(4), row(5)}},
		{"none", []string{"-n", "0"}, []string{"audit log " + filepath.Join(dir, "toolgate.db") + " has no events"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, out, errOut := tg(t, ctx, append([]string{"audit", "tail", "--data", dir}, tt.args...)...)
			if code != 0 {
				t.Fatalf("exit %d: %s", code, errOut)
			}
			if diff := cmp.Diff(tt.want, tableLines(out)); diff != "" {
				t.Errorf("tail (-want +got):\n%s", diff)
			}
		})
	}

	t.Run("json lines", func(t *testing.T) {
		code, out, errOut := tg(t, ctx, "audit", "tail", "--data", dir, "-n", "3", "-o", "json")
		if code != 0 {
			t.Fatalf("exit %d: %s", code, errOut)
		}
		var seqs []int64
		for line := range strings.Lines(out) {
			ev, err := audit.DecodeEvent([]byte(line))
			if err != nil {
				t.Fatalf("line %q: %v", line, err)
			}
			if err := audit.CheckHash(ev); err != nil {
				t.Errorf("a tailed event does not hash to its hash: %v", err)
			}
			seqs = append(seqs, ev.Seq)
		}
		if diff := cmp.Diff([]int64{3, 4, 5}, seqs); diff != "" {
			t.Errorf("seqs (-want +got):\n%s", diff)
		}
	})
}

func tableLines(s string) []string {
	var out []string
	for l := range strings.Lines(s) {
		out = append(out, strings.TrimRight(l, " \n"))
	}
	return out
}

// lockedBuffer is a bytes.Buffer safe for a writer and a reader goroutine.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// eventually polls until cond holds, failing the test after a generous
// deadline (this checks that something happens, not how fast).
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// TestAuditTailFollow tails with -f while another store appends, as a
// running gateway would, and stops when the context ends.
func TestAuditTailFollow(t *testing.T) {
	dir := writeLog(t, sampleEvents(2))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout, stderr lockedBuffer
	done := make(chan int, 1)
	go func() {
		done <- cli.Run(ctx, []string{"audit", "tail", "--data", dir, "-f", "-n", "1", "-o", "json"}, nil, &stdout, &stderr)
	}()
	seqs := func() []int64 {
		var out []int64
		for line := range strings.Lines(stdout.String()) {
			if ev, err := audit.DecodeEvent([]byte(line)); err == nil {
				out = append(out, ev.Seq)
			}
		}
		return out
	}
	eventually(t, "the last existing event", func() bool { return len(seqs()) == 1 })

	st, err := sqlite.Open(filepath.Join(dir, "toolgate.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	appendEvents(t, st, sampleEvents(3))
	eventually(t, "the three new events", func() bool { return len(seqs()) == 4 })
	appendEvents(t, st, sampleEvents(1))
	eventually(t, "one more event", func() bool { return len(seqs()) == 5 })

	cancel()
	if code := <-done; code != 0 {
		t.Errorf("tail -f exit = %d after the context ended; stderr %s", code, stderr.String())
	}
	if diff := cmp.Diff([]int64{2, 3, 4, 5, 6}, seqs()); diff != "" {
		t.Errorf("followed seqs (-want +got):\n%s", diff)
	}
}
