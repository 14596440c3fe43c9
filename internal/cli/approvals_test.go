package cli_test

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/toolgate/toolgate"
	"github.com/toolgate/toolgate/approval"
	"github.com/toolgate/toolgate/audit"
	"github.com/toolgate/toolgate/authz"
	"github.com/toolgate/toolgate/gate"
	"github.com/toolgate/toolgate/internal/cli"
	"github.com/toolgate/toolgate/policy"
	"github.com/toolgate/toolgate/store/sqlite"
)

// gateway is a gate on the example bundle with its state in a data folder,
// as toolgate serve would run it next to the CLI.
type gateway struct {
	dir   string
	store *sqlite.Store
	rec   *audit.Recorder
	g     *gate.Gate
}

func newGateway(t *testing.T) *gateway {
	t.Helper()
	b, err := policy.LoadDir(exampleBundle)
	if err != nil {
		t.Fatal(err)
	}
	snap, _, err := authz.Compile(b, nil)
	if err != nil {
		t.Fatal(err)
	}
	gw := &gateway{dir: filepath.Join(t.TempDir(), "data")}
	gw.store, err = sqlite.Open(filepath.Join(gw.dir, "toolgate.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	gw.rec = audit.NewRecorder(gw.store, nil)
	gw.g = gate.New(snap, &gate.Options{Recorder: gw.rec, Approvals: gw.store})
	t.Cleanup(func() {
		gw.rec.Close(context.Background())
		gw.store.Close()
	})
	return gw
}

var refund = gate.Request{Identity: gate.Identity{Principal: "user:bob", AgentID: "triage"},
	Tool: "payments_refund", Args: json.RawMessage(`{"amount": 200}`), Via: "mcp"}

func (gw *gateway) authorize(t *testing.T, want toolgate.Verdict) gate.Outcome {
	t.Helper()
	out := gw.g.Decide(context.Background(), refund)
	if out.Decision.Verdict != want {
		t.Fatalf("refund decision = %+v; want %s", out.Decision, want)
	}
	// Refusals are queued; make this one durable so the log's order is
	// the order of the steps.
	if err := gw.rec.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestApprovalsCommands(t *testing.T) {
	t.Setenv("TOOLGATE_BUNDLE", exampleBundle) // approvers are checked against the bundle
	ctx := context.Background()
	gw := newGateway(t)
	first := gw.authorize(t, toolgate.RequireApproval).ApprovalID
	data := []string{"--data", gw.dir}

	// list, text and JSON.
	code, out, errOut := tg(t, ctx, append([]string{"approvals", "list"}, data...)...)
	if code != 0 {
		t.Fatalf("list: exit %d: %s", code, errOut)
	}
	lines := tableLines(out)
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "ID  ") {
		t.Fatalf("list output:\n%s", out)
	}
	for _, want := range []string{first, "pending", "tool:payments-refund", "triage", "user:bob", `{"amount":200}`} {
		if !strings.Contains(lines[1], want) {
			t.Errorf("list row lacks %q: %s", want, lines[1])
		}
	}
	code, out, _ = tg(t, ctx, append([]string{"approvals", "list", "-o", "json"}, data...)...)
	var listed []approval.Approval
	if err := json.Unmarshal([]byte(out), &listed); err != nil || code != 0 {
		t.Fatalf("list -o json: exit %d %v: %s", code, err, out)
	}
	if len(listed) != 1 || listed[0].ID != first || listed[0].Binding.Principal != "user:bob" {
		t.Errorf("list -o json = %+v", listed)
	}

	steps := []struct {
		name     string
		args     []string
		wantCode int
		wantOut  string // substring of stdout
		wantErr  string // substring of stderr
	}{
		{"list approved: none", []string{"approvals", "list", "--status", "approved"}, 0, "no approvals with status approved", ""},
		{"list bad status", []string{"approvals", "list", "--status", "maybe"}, cli.ExitUsage, "", `--status "maybe"`},
		{"approve without --as", []string{"approvals", "approve", first}, cli.ExitUsage, "", "--as PRINCIPAL is required"},
		{"approve without an id", []string{"approvals", "approve", "--as", "user:carol"}, cli.ExitUsage, "", "want exactly one approval ID"},
		{"approve two ids", []string{"approvals", "approve", first, first, "--as", "user:carol"}, cli.ExitUsage, "", "want exactly one approval ID"},
		{"the requester cannot approve", []string{"approvals", "approve", first, "--as", "user:bob"}, cli.ExitFailure, "", "user:bob asked for it"},
		{"the requester cannot deny", []string{"approvals", "deny", first, "--as", "user:bob"}, cli.ExitFailure, "", "another principal with approval:decide must approve or deny it"},
		{"unknown approval", []string{"approvals", "approve", "apr_NOPE", "--as", "user:carol"}, cli.ExitFailure, "", "no approval apr_NOPE"},
		{"carol approves, flags after the id", []string{"approvals", "approve", first, "--as", "user:carol", "--reason", "refund checked"}, 0, "approved " + first + ": tool:payments-refund for agent triage as user:bob", ""},
		{"approved twice", []string{"approvals", "deny", "--as", "user:carol", first}, cli.ExitFailure, "", "is already approved (by user:carol)"},
		{"list approved", []string{"approvals", "list", "--status", "approved"}, 0, first, ""},
		{"no subcommand", []string{"approvals"}, cli.ExitUsage, "", "Usage: toolgate approvals SUBCOMMAND"},
	}
	for _, s := range steps {
		code, out, errOut := tg(t, ctx, append(s.args, data...)...)
		if code != s.wantCode || !strings.Contains(out, s.wantOut) || !strings.Contains(errOut, s.wantErr) {
			t.Errorf("%s: exit %d stdout %q stderr %q; want exit %d, stdout with %q, stderr with %q",
				s.name, code, out, errOut, s.wantCode, s.wantOut, s.wantErr)
		}
	}

	// The gateway sees carol's approval: the same call runs once.
	if out := gw.authorize(t, toolgate.Allow); out.ApprovalID != first {
		t.Errorf("allowed with approval %q; want %s", out.ApprovalID, first)
	}
	second := gw.authorize(t, toolgate.RequireApproval).ApprovalID
	code, out, errOut = tg(t, ctx, append([]string{"approvals", "deny", second, "--as", "user:carol", "-o", "json"}, data...)...)
	var denied approval.Approval
	if err := json.Unmarshal([]byte(out), &denied); err != nil || code != 0 {
		t.Fatalf("deny -o json: exit %d %v: %s%s", code, err, out, errOut)
	}
	if denied.ID != second || denied.Status != approval.StatusDenied || denied.DecidedBy != "user:carol" {
		t.Errorf("denied = %+v", denied)
	}
	gw.authorize(t, toolgate.RequireApproval) // a denial does not allow, and asks anew

	// An approval that expired before anyone decided it.
	old, err := approval.NewApproval(approval.Binding{Principal: "user:bob", AgentID: "triage", ToolID: "tool:payments-refund",
		ArgsDigest: strings.Repeat("0", 64)}, "user:bob", time.Now().Add(-time.Hour), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := gw.store.CreateApproval(ctx, old); err != nil {
		t.Fatal(err)
	}
	code, _, errOut = tg(t, ctx, append([]string{"approvals", "approve", old.ID, "--as", "user:carol"}, data...)...)
	if code != cli.ExitFailure || !strings.Contains(errOut, "expired at") {
		t.Errorf("approve an expired approval: exit %d, stderr %q", code, errOut)
	}

	// The audit log holds every step, from the gateway and from the CLI,
	// in one intact chain.
	if err := gw.rec.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	evs, err := audit.ReadEvents(ctx, gw.store, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	type row struct{ Type, Approval, By, Via string }
	var got []row
	for _, ev := range evs {
		by, _ := ev.Details["decided_by"].(string)
		via, _ := ev.Details["via"].(string)
		got = append(got, row{ev.EventType, ev.ApprovalID, by, via})
	}
	want := []row{
		{"agent.tool.approval_requested", first, "", "mcp"},
		// bob's two attempts to decide his own call are refused, and recorded
		{"agent.tool.approval_decision_refused", first, "", "cli"},
		{"agent.tool.approval_decision_refused", first, "", "cli"},
		{"agent.tool.approval_granted", first, "user:carol", "cli"},
		{"agent.tool.approval_decision_refused", first, "", "cli"}, // denied after it was approved
		{"agent.tool.authorized", first, "", "mcp"},
		{"agent.tool.approval_requested", second, "", "mcp"},
		{"agent.tool.approval_denied", second, "user:carol", "cli"},
		{"agent.tool.approval_requested", got[8].Approval, "", "mcp"},
		{"agent.tool.approval_expired", old.ID, "", "cli"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("audit log (-want +got):\n%s", diff)
	}
	if code, out, errOut := tg(t, ctx, append([]string{"audit", "verify"}, data...)...); code != 0 {
		t.Errorf("audit verify after CLI and gateway writes: exit %d\n%s%s", code, out, errOut)
	}
}
