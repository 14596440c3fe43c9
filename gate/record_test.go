package gate_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/toolgate/toolgate"
	"github.com/toolgate/toolgate/adapter/mcptool"
	"github.com/toolgate/toolgate/approval"
	"github.com/toolgate/toolgate/audit"
	"github.com/toolgate/toolgate/gate"
	"github.com/toolgate/toolgate/store/sqlite"
	"github.com/toolgate/toolgate/storetest"
)

const recordBundle = `
- {kind: Upstream, name: up, transport: stdio, command: "true"}
- kind: Agent
  agent_id: a
  version: 1.0.0
  tool_permissions:
    - {tool_id: tool:up-read, side_effect_class: read, approval_tier: auto}
    - {tool_id: tool:up-wire, side_effect_class: write, approval_tier: hitl}
- kind: RuntimePolicy
  agent_id: a
  deployment_mode: production
  tool_authorization_policy: {active_tool_set: all}
- {kind: Tool, tool_id: tool:up-read, side_effect_class: read, source: {mcp_server: up}}
- {kind: Tool, tool_id: tool:up-wire, side_effect_class: write, source: {mcp_server: up}}
- {kind: Tool, tool_id: tool:up-delete, side_effect_class: irreversible, source: {mcp_server: up}}
- kind: Principal
  principal_id: p
  grants: [{resource: tool, action: invoke, scope: all}]
- kind: Principal
  principal_id: lead
  grants: [{resource: approval, action: decide, scope: all}]
`

var recordID = gate.Identity{Principal: "p", AgentID: "a", DeploymentMode: "production"}

func newRecordGate(t *testing.T, path string, opts *audit.RecorderOptions) (*gate.Gate, *sqlite.Store, *audit.Recorder) {
	t.Helper()
	st, err := sqlite.Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	rec := audit.NewRecorder(st, opts)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		rec.Close(ctx)
		st.Close()
	})
	return gate.New(compile(t, recordBundle), &gate.Options{Recorder: rec, Approvals: st}), st, rec
}

// TestDenialDurableBeforeAnswer is the denial half of finding 11 of issue
// 7: a denial was only queued when it was answered, so a SIGKILL right
// after lost it. Now, with the store healthy, it is in the database (read
// through another connection, as a restarted gateway would) by the time
// the caller has its answer, on every refusal path.
func TestDenialDurableBeforeAnswer(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "toolgate.db")
	g, _, _ := newRecordGate(t, path, nil)
	other, err := sqlite.Open(path, &sqlite.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	tests := []struct {
		name string
		call func() gate.Outcome
		code toolgate.Code
	}{
		{"not in the ceiling", func() gate.Outcome {
			return g.Decide(ctx, gate.Request{Identity: recordID, Tool: "up_delete", Args: []byte(`{}`)})
		}, toolgate.CodeNotInCeiling},
		{"unknown tool", func() gate.Outcome {
			return g.Decide(ctx, gate.Request{Identity: recordID, Tool: "up_nothing", Args: []byte(`{}`)})
		}, toolgate.CodeUnknownTool},
		{"malformed arguments", func() gate.Outcome {
			return g.Decide(ctx, gate.Request{Identity: recordID, Tool: "up_read", Args: []byte(`{"a":1,"a":2}`)})
		}, toolgate.CodeMalformedCall},
		{"hidden tool", func() gate.Outcome {
			return g.Decide(ctx, gate.Request{Identity: recordID, Tool: "up_secret", Args: []byte(`{}`)})
		}, toolgate.CodeUnknownTool},
		{"approval required", func() gate.Outcome {
			return g.Decide(ctx, gate.Request{Identity: recordID, Tool: "up_wire", Args: []byte(`{}`)})
		}, toolgate.CodeApprovalRequired},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out := tt.call()
			if out.Decision.Code != tt.code {
				t.Fatalf("decision %s (%s); want %s", out.Decision.Code, out.Decision.Reason, tt.code)
			}
			evs, err := audit.ReadEvents(ctx, other, 1, 1000)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range evs {
				if e.EventID == out.EventID {
					return
				}
			}
			t.Errorf("the %s answer's event %s is not durable when the answer is given", tt.code, out.EventID)
		})
	}
}

// TestFullBacklogRefusesBeforeAnything is finding 12's refusal: with the
// store down and the backlog full, a call that would run is refused at
// once with internal_error saying the backlog is full, before an approval
// is used; the refusals that cannot be kept are counted and summarized
// once the store recovers.
func TestFullBacklogRefusesBeforeAnything(t *testing.T) {
	ctx := context.Background()
	fs := storetest.MountTmpfs(t, 4<<20)
	g, st, rec := newRecordGate(t, filepath.Join(fs.Dir, "toolgate.db"),
		&audit.RecorderOptions{MaxQueued: 50, RetryMin: 10 * time.Millisecond, RetryMax: 100 * time.Millisecond})
	// An approved approval for up_wire, ready to be used.
	out := g.Decide(ctx, gate.Request{Identity: recordID, Tool: "up_wire", Args: []byte(`{}`)})
	if out.ApprovalID == "" {
		t.Fatalf("no approval asked: %+v", out.Decision)
	}
	if _, err := st.DecideApproval(ctx, out.ApprovalID, true, "user:approver", "ok", time.Now()); err != nil {
		t.Fatal(err)
	}
	free := fs.Fill(t)
	for i := 0; rec.Stats().Overflowed == 0; i++ {
		g.Decide(ctx, gate.Request{Identity: recordID, Tool: "up_delete", Args: []byte(`{}`)})
		if i > 10_000 {
			t.Fatalf("the backlog never filled: %+v", rec.Stats())
		}
	}
	for _, tool := range []string{"up_read", "up_wire"} {
		out := g.Decide(ctx, gate.Request{Identity: recordID, Tool: tool, Args: []byte(`{}`)})
		d := out.Decision
		if d.Verdict != toolgate.Deny || d.Code != toolgate.CodeInternalError || d.Layer != toolgate.LayerInternal ||
			!strings.Contains(d.Reason, "audit backlog is full") {
			t.Errorf("%s with a full backlog: %s %s %q; want internal_error saying the audit backlog is full", tool, d.Verdict, d.Code, d.Reason)
		}
	}
	a, err := st.GetApproval(ctx, out.ApprovalID)
	if err != nil {
		t.Fatal(err)
	}
	if a.Status != approval.StatusApproved {
		t.Errorf("approval %s is %s after the refused call; want it still approved (unused)", a.ID, a.Status)
	}
	free()
	fctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	storetest.WaitFor(t, 30*time.Second, "the backlog to drain and the summary to be written", func() bool {
		rec.Flush(fctx)
		return rec.Stats().Overflowed == 0 && rec.Stats().Pending == 0
	})
	evs, err := audit.ReadEvents(ctx, st, 1, 100000)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range evs {
		if e.EventType == string(toolgate.EventAuditBacklogOverflow) {
			n++
		}
	}
	if n != 1 {
		t.Errorf("%d overflow summaries; want 1", n)
	}
	// With the store back, the approved call runs (is allowed) again.
	if out := g.Decide(ctx, gate.Request{Identity: recordID, Tool: "up_wire", Args: []byte(`{}`)}); out.Decision.Verdict != toolgate.Allow {
		t.Errorf("the approved call after recovery: %+v", out.Decision)
	}
}

// TestDecideOnlyIsMarked: an allow decided for a caller that runs the call
// itself says so, so that a restart does not mark it outcome_unknown.
func TestDecideOnlyIsMarked(t *testing.T) {
	ctx := context.Background()
	g, st, rec := newRecordGate(t, filepath.Join(t.TempDir(), "toolgate.db"), nil)
	only := g.Decide(ctx, gate.Request{Identity: recordID, Tool: "up_read", Args: []byte(`{}`), Via: "http", DecideOnly: true})
	// A call that runs, and whose completion is lost: the gateway stops
	// (the recorder closes) while the tool runs.
	running, release := make(chan struct{}), make(chan struct{})
	gr := gate.New(compile(t, recordBundle), &gate.Options{Recorder: rec, Approvals: st, Executor: &gate.Executor{
		Upstreams: blockingUpstream{running, release}}})
	done := make(chan gate.Outcome, 1)
	go func() {
		done <- gr.Handle(ctx, gate.Request{Identity: recordID, Tool: "up_read", Args: []byte(`{}`), Via: "http"})
	}()
	<-running
	if err := rec.Close(ctx); err != nil {
		t.Fatal(err)
	}
	close(release)
	runs := <-done
	if !only.Decision.Allowed() || !runs.Decision.Allowed() {
		t.Fatalf("decisions %+v %+v", only.Decision, runs.Decision)
	}
	rep, err := audit.Recover(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.OutcomeUnknown) != 1 || rep.OutcomeUnknown[0].CausationID != runs.EventID {
		t.Errorf("outcome_unknown %+v; want one, for the allow without decide_only (%s)", rep.OutcomeUnknown, runs.EventID)
	}
}

// TestStalledAllowIsRefusedAndNamed: when the append holding an allow
// stalls (a frozen file system), the call is refused with internal_error
// at the stall threshold, not run; the allow may still reach the log, so
// the refusal names it (causation_id and details refused_allow_event_id),
// and a restart does not mark that call outcome_unknown.
func TestStalledAllowIsRefusedAndNamed(t *testing.T) {
	ctx := context.Background()
	fs := storetest.MountExt4(t, 32<<20)
	g, st, rec := newRecordGate(t, filepath.Join(fs.Dir, "toolgate.db"), &audit.RecorderOptions{StallAfter: 300 * time.Millisecond})
	if out := g.Decide(ctx, gate.Request{Identity: recordID, Tool: "up_read", Args: []byte(`{}`)}); !out.Decision.Allowed() {
		t.Fatalf("before the freeze: %+v", out.Decision)
	}
	fs.Freeze(t)
	out := g.Decide(ctx, gate.Request{Identity: recordID, Tool: "up_read", Args: []byte(`{"n":1}`), CausationID: "req-1"})
	fs.Thaw(t)
	if d := out.Decision; d.Code != toolgate.CodeInternalError || !strings.Contains(d.Reason, "stopped answering") {
		t.Fatalf("allow in a stalled append: %s %q; want internal_error saying the store stopped answering", d.Code, d.Reason)
	}
	if err := rec.Close(ctx); err != nil {
		t.Fatal(err)
	}
	evs, err := audit.ReadEvents(ctx, st, 1, 1000)
	if err != nil {
		t.Fatal(err)
	}
	var allow, refusal *audit.Event
	for i, e := range evs {
		if e.CorrelationID != out.CorrelationID {
			continue
		}
		switch e.EventType {
		case string(toolgate.EventAuthorized):
			allow = &evs[i]
		case string(toolgate.EventUnauthorized):
			refusal = &evs[i]
		}
	}
	if refusal == nil {
		t.Fatal("the refusal is not in the log")
	}
	if allow != nil && (refusal.CausationID != allow.EventID || refusal.Details["refused_allow_event_id"] != allow.EventID) {
		t.Errorf("refusal causation %q details %v; want both naming the allow %s", refusal.CausationID, refusal.Details, allow.EventID)
	}
	rep, err := audit.Recover(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range rep.OutcomeUnknown {
		if u.CorrelationID == out.CorrelationID {
			t.Errorf("the refused call was marked outcome_unknown: %+v", u)
		}
	}
	t.Logf("allow written: %v", allow != nil)
}

// TestApprovalDecisionNeedsItsRecord: an approval is not decided while the
// audit log cannot take the decision's record (the store stalled): the
// approver is told, the approval stays pending, and nothing is decided
// unrecorded.
func TestApprovalDecisionNeedsItsRecord(t *testing.T) {
	ctx := context.Background()
	fs := storetest.MountExt4(t, 32<<20)
	g, st, _ := newRecordGate(t, filepath.Join(fs.Dir, "toolgate.db"), &audit.RecorderOptions{StallAfter: 300 * time.Millisecond})
	out := g.Decide(ctx, gate.Request{Identity: recordID, Tool: "up_wire", Args: []byte(`{"to":"x"}`)})
	if out.Decision.Verdict != toolgate.RequireApproval || out.ApprovalID == "" {
		t.Fatalf("first call: %+v", out.Decision)
	}
	fs.Freeze(t)
	thawed := false
	thaw := func() {
		if !thawed {
			thawed = true
			fs.Thaw(t)
		}
	}
	defer thaw()
	// A record that stalls makes the log unable to take one at once.
	done := make(chan struct{})
	go func() {
		defer close(done)
		g.Decide(ctx, gate.Request{Identity: recordID, Tool: "up_read", Args: []byte(`{}`)})
	}()
	time.Sleep(600 * time.Millisecond)
	errc := make(chan error, 1)
	go func() {
		_, err := g.DecideApproval(ctx, out.ApprovalID, true, "lead", "ok", "test")
		errc <- err
	}()
	var err error
	select {
	case err = <-errc:
	case <-time.After(10 * time.Second):
		thaw()
		t.Fatal("DecideApproval blocked on the stalled store; it must answer at once")
	}
	thaw()
	<-done
	if !errors.Is(err, gate.ErrAuditUnavailable) {
		t.Fatalf("deciding while the audit log cannot write: %v; want ErrAuditUnavailable", err)
	}
	a, gerr := st.GetApproval(ctx, out.ApprovalID)
	if gerr != nil {
		t.Fatal(gerr)
	}
	if a.Status != approval.StatusPending {
		t.Errorf("approval is %s; it must stay pending when its decision cannot be recorded", a.Status)
	}
}

// blockingUpstream signals running when a call reaches it and answers once
// release is closed.
type blockingUpstream struct{ running, release chan struct{} }

func (b blockingUpstream) Run(ctx context.Context, c mcptool.Call) (mcptool.Result, error) {
	close(b.running)
	<-b.release
	return mcptool.Result{Raw: []byte(`{"content":[{"type":"text","text":"ok"}]}`)}, nil
}
