package gate_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/toolgate/toolgate"
	"github.com/toolgate/toolgate/approval"
	"github.com/toolgate/toolgate/audit"
	"github.com/toolgate/toolgate/authz"
	"github.com/toolgate/toolgate/gate"
	"github.com/toolgate/toolgate/policy"
	"github.com/toolgate/toolgate/store/sqlite"
)

const delegationBundle = `
- {kind: Tool, tool_id: tool:fs-read, side_effect_class: read}
- {kind: Tool, tool_id: tool:fs-write, side_effect_class: write}
- {kind: Tool, name: bifrost.query, tool_id: tool:bifrost-query, side_effect_class: read}
- kind: Agent
  agent_id: scheduler
  version: 1.0.0
  runtime_engine: cron
  tool_permissions:
    - {tool_id: tool:fs-read, side_effect_class: read}
    - {tool_id: tool:fs-write, side_effect_class: write, approval_tier: hitl}
    - {tool_id: tool:bifrost-query, side_effect_class: read}
- {kind: RuntimePolicy, agent_id: scheduler, deployment_mode: production, tool_authorization_policy: {active_tool_set: all}}
- kind: Role
  role_id: invoker
  grants: [{resource: tool, action: invoke, scope: all}]
- kind: Role
  role_id: reader
  grants: [{resource: bifrost_query, action: read, scope: {name: vala.datasets}}]
- kind: Principal
  principal_id: user:owner
  roles: [invoker, reader]
- kind: Principal
  principal_id: svc:nightly
  grants: [{resource: approval, action: decide, scope: all}]
- kind: Principal
  principal_id: user:lead
  grants: [{resource: approval, action: decide, scope: all}]
`

func compile(t *testing.T, src string) *authz.Snapshot {
	t.Helper()
	b := &policy.Bundle{}
	b.AddYAML(t.Name()+".yaml", []byte(src))
	snap, _, err := authz.Compile(b, nil)
	if err != nil {
		t.Fatal(err)
	}
	return snap
}

// TestAuthorizeDelegated: Authorize and Disclose decide a delegated
// identity by the intersection of its delegator's current grants and the
// delegation's; the seed table holds through a delegation token and
// through a JWT's roles; an expired delegation grants nothing.
func TestAuthorizeDelegated(t *testing.T) {
	now := time.Date(2026, 10, 18, 12, 0, 0, 0, time.UTC)
	g := gate.New(compile(t, delegationBundle), &gate.Options{Now: func() time.Time { return now }})
	tickets := []toolgate.Resource{{Type: "bifrost_query", Name: "vala.datasets.tickets"}}
	grant := func(res, act string, sc policy.Scope) policy.Grant {
		return policy.Grant{Resource: res, Action: act, Scope: sc}
	}
	owner := func(d *gate.Delegation) gate.Identity {
		return gate.Identity{Principal: "user:owner", AgentID: "scheduler", Delegation: d}
	}
	token := func(gs ...policy.Grant) *gate.Delegation {
		return &gate.Delegation{ID: "dlg_test", Delegate: "svc:nightly", Grants: gs, ExpiresAt: now.Add(time.Hour)}
	}
	roles := func(rs ...string) *gate.Delegation {
		return &gate.Delegation{ID: "jwt:test", Roles: rs, ExpiresAt: now.Add(time.Hour)}
	}
	cases := []struct {
		name      string
		id        gate.Identity
		tool      string
		res       []toolgate.Resource
		want      toolgate.Code
		disclosed []string
	}{
		{"no delegation", owner(nil), "bifrost.query", tickets, toolgate.CodeOK, []string{"tool:fs-read", "tool:fs-write", "tool:bifrost-query"}},
		{"token: invoke only", owner(token(grant("tool", "invoke", policy.Scope{All: true}))), "bifrost.query", tickets, toolgate.CodeRBACResource,
			[]string{"tool:fs-read", "tool:fs-write", "tool:bifrost-query"}},
		{"token: resource only", owner(token(grant("bifrost_query", "read", policy.Scope{Name: "vala.datasets"}))), "bifrost.query", tickets, toolgate.CodeRBACToolInvoke, []string{}},
		{"token: both", owner(token(grant("tool", "invoke", policy.Scope{Tool: "bifrost.query"}), grant("bifrost_query", "read", policy.Scope{Name: "vala.datasets.tickets"}))),
			"bifrost.query", tickets, toolgate.CodeOK, []string{"tool:bifrost-query"}},
		{"token wider than the delegator", owner(token(grant("tool", "invoke", policy.Scope{All: true}), grant("bifrost_query", "read", policy.Scope{All: true}))),
			"bifrost.query", []toolgate.Resource{{Type: "bifrost_query", Name: "vala.billing.invoices"}}, toolgate.CodeRBACResource,
			[]string{"tool:fs-read", "tool:fs-write", "tool:bifrost-query"}},
		{"roles: invoker only", owner(roles("invoker")), "bifrost.query", tickets, toolgate.CodeRBACResource, []string{"tool:fs-read", "tool:fs-write", "tool:bifrost-query"}},
		{"roles: reader only", owner(roles("reader")), "bifrost.query", tickets, toolgate.CodeRBACToolInvoke, []string{}},
		{"roles: both", owner(roles("invoker", "reader")), "bifrost.query", tickets, toolgate.CodeOK, []string{"tool:fs-read", "tool:fs-write", "tool:bifrost-query"}},
		{"roles: undeclared role fails closed", owner(roles("admin")), "fs_read", nil, toolgate.CodeRBACToolInvoke, []string{}},
		{"expired", owner(&gate.Delegation{ID: "dlg_old", Delegate: "svc:nightly", Grants: []policy.Grant{grant("tool", "invoke", policy.Scope{All: true})},
			ExpiresAt: now}), "fs_read", nil, toolgate.CodeRBACToolInvoke, []string{}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out := g.Decide(context.Background(), gate.Request{Identity: tc.id, Tool: tc.tool, Resources: tc.res})
			if out.Decision.Code != tc.want {
				t.Errorf("decision %s (%s), want %s", out.Decision.Code, out.Decision.Reason, tc.want)
			}
			if diff := cmp.Diff(tc.disclosed, g.Disclose(tc.id).Resolution.Disclosed); diff != "" {
				t.Errorf("disclosed (-want +got):\n%s", diff)
			}
		})
	}
	t.Run("the delegator losing a grant revokes it for the delegate", func(t *testing.T) {
		id := owner(token(grant("tool", "invoke", policy.Scope{Tool: "fs_read"})))
		if d := g.Decide(context.Background(), gate.Request{Identity: id, Tool: "fs_read"}).Decision; d.Code != toolgate.CodeOK {
			t.Fatalf("before: %s", d.Reason)
		}
		g2 := gate.New(compile(t, delegationBundle), nil)
		g2.Swap(compile(t, `
- {kind: Tool, tool_id: tool:fs-read, side_effect_class: read}
- kind: Agent
  agent_id: scheduler
  tool_permissions: [{tool_id: tool:fs-read, side_effect_class: read}]
- {kind: RuntimePolicy, agent_id: scheduler, deployment_mode: production, tool_authorization_policy: {active_tool_set: all}}
- {kind: Principal, principal_id: user:owner}
`))
		if d := g2.Decide(context.Background(), gate.Request{Identity: id, Tool: "fs_read"}).Decision; d.Code != toolgate.CodeRBACToolInvoke {
			t.Errorf("after the reload: %s (%s), want rbac_tool_invoke", d.Code, d.Reason)
		}
		if got := g2.Disclose(id).Resolution.Disclosed; len(got) != 0 {
			t.Errorf("after the reload, disclosed %v", got)
		}
	})
}

// TestDelegatedApproval: the approval a delegate's call asks for is bound
// to the delegator (the principal the call runs as) and requested by the
// delegate, so neither may decide it; once another approver approves, the
// delegate's identical call runs, and its events name delegate and
// delegator.
func TestDelegatedApproval(t *testing.T) {
	ctx := context.Background()
	st, err := sqlite.Open(filepath.Join(t.TempDir(), "tg.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	rec := audit.NewRecorder(st, nil)
	defer rec.Close(ctx)
	g := gate.New(compile(t, delegationBundle), &gate.Options{Approvals: st, Recorder: rec})
	id := gate.Identity{Principal: "user:owner", AgentID: "scheduler", Delegation: &gate.Delegation{ID: "dlg_w", Delegate: "svc:nightly",
		Grants: []policy.Grant{{Resource: "tool", Action: "invoke", Scope: policy.Scope{Tool: "fs_write"}}}, ExpiresAt: time.Now().Add(time.Hour)}}
	req := gate.Request{Identity: id, Tool: "fs_write", Args: json.RawMessage(`{"path":"a"}`), Via: "test"}
	out := g.Decide(ctx, req)
	if out.Decision.Verdict != toolgate.RequireApproval || out.ApprovalID == "" {
		t.Fatalf("first call: %+v", out.Decision)
	}
	a, err := st.GetApproval(ctx, out.ApprovalID)
	if err != nil {
		t.Fatal(err)
	}
	if a.Binding.Principal != "user:owner" || a.RequestedBy != "svc:nightly" {
		t.Errorf("binding principal %q, requested by %q", a.Binding.Principal, a.RequestedBy)
	}
	for _, by := range []string{"svc:nightly", "user:owner"} {
		if _, err := g.DecideApproval(ctx, a.ID, true, by, "", "test"); !errors.Is(err, gate.ErrSelfApproval) {
			t.Errorf("%s approving: %v, want ErrSelfApproval", by, err)
		}
	}
	if _, err := g.DecideApproval(ctx, a.ID, true, "user:lead", "ok", "test"); err != nil {
		t.Fatal(err)
	}
	if out := g.Decide(ctx, req); out.Decision.Verdict != toolgate.Allow || out.ApprovalID != a.ID {
		t.Fatalf("approved call: %+v", out.Decision)
	}
	if err := rec.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	evs, err := audit.ReadEvents(ctx, st, 1, 100)
	if err != nil {
		t.Fatal(err)
	}
	var seen []string
	for _, e := range evs {
		if e.ToolName != "fs_write" || e.Details == nil {
			continue
		}
		if e.Details["delegator"] != "user:owner" || e.Details["delegate"] != "svc:nightly" || e.Principal != "user:owner" ||
			(e.EventType != "agent.tool.approval_granted" && e.EventType != "agent.tool.approval_decision_refused" && e.Details["delegation_id"] != "dlg_w") {
			t.Errorf("event %s details %v principal %s", e.EventType, e.Details, e.Principal)
		}
		seen = append(seen, e.EventType)
	}
	// The delegate's and the delegator's own attempts to approve are refused, and recorded.
	if diff := cmp.Diff([]string{"agent.tool.approval_requested", "agent.tool.approval_decision_refused", "agent.tool.approval_decision_refused",
		"agent.tool.approval_granted", "agent.tool.authorized"}, seen); diff != "" {
		t.Errorf("delegated call events (-want +got):\n%s", diff)
	}
}

// TestRepeatedCallReusesPendingApproval: asking the same call again while
// its approval is pending gets that approval (the approvers' queue does not
// grow with repeats); other arguments get their own; once the approval is
// used, the next repeat asks anew.
func TestRepeatedCallReusesPendingApproval(t *testing.T) {
	ctx := context.Background()
	st, err := sqlite.Open(filepath.Join(t.TempDir(), "tg.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	g := gate.New(compile(t, delegationBundle), &gate.Options{Approvals: st})
	id := gate.Identity{Principal: "user:owner", AgentID: "scheduler"}
	call := func(args string) gate.Outcome {
		t.Helper()
		return g.Decide(ctx, gate.Request{Identity: id, Tool: "fs_write", Args: json.RawMessage(args), Via: "test"})
	}
	first := call(`{"path":"a"}`)
	if first.Decision.Verdict != toolgate.RequireApproval || first.ApprovalID == "" {
		t.Fatalf("first call: %+v", first.Decision)
	}
	for i := 0; i < 5; i++ {
		if again := call(`{ "path" : "a" }`); again.ApprovalID != first.ApprovalID || again.ApprovalExpires != first.ApprovalExpires {
			t.Fatalf("repeat %d: approval %s, want %s", i, again.ApprovalID, first.ApprovalID)
		}
	}
	other := call(`{"path":"b"}`)
	if other.ApprovalID == "" || other.ApprovalID == first.ApprovalID {
		t.Errorf("other arguments: approval %q", other.ApprovalID)
	}
	pending, err := st.ListApprovals(ctx, approval.Filter{Status: []approval.Status{approval.StatusPending}})
	if err != nil {
		t.Fatal(err)
	}
	if len(pending) != 2 {
		t.Errorf("%d pending approvals, want 2", len(pending))
	}
	if _, err := g.DecideApproval(ctx, first.ApprovalID, true, "user:lead", "ok", "test"); err != nil {
		t.Fatal(err)
	}
	if ran := call(`{"path":"a"}`); ran.Decision.Verdict != toolgate.Allow || ran.ApprovalID != first.ApprovalID {
		t.Fatalf("approved call: %+v", ran.Decision)
	}
	if next := call(`{"path":"a"}`); next.Decision.Verdict != toolgate.RequireApproval || next.ApprovalID == first.ApprovalID {
		t.Errorf("after the approval was used: %+v (approval %s)", next.Decision, next.ApprovalID)
	}
}

// TestPendingApprovalsAreCapped: nobody can flood the approvers by
// varying a call's arguments or by minting delegates: past
// MaxPendingApprovals pending for an agent's calls made with one
// principal's authority, a call still needs approval but none is created,
// whatever the delegate calls itself; another principal is not affected,
// even when a delegate takes its name; concurrent calls do not slip past.
func TestPendingApprovalsAreCapped(t *testing.T) {
	ctx := context.Background()
	st, err := sqlite.Open(filepath.Join(t.TempDir(), "tg.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	g := gate.New(compile(t, delegationBundle+"- {kind: Principal, principal_id: user:other, roles: [invoker]}\n"), &gate.Options{Approvals: st})
	owner := gate.Identity{Principal: "user:owner", AgentID: "scheduler"}
	delegate := func(name string) gate.Identity {
		id := owner
		id.Delegation = &gate.Delegation{ID: "dlg_" + name, Delegate: name,
			Grants: []policy.Grant{{Resource: "tool", Action: "invoke", Scope: policy.Scope{Tool: "fs_write"}}}, ExpiresAt: time.Now().Add(time.Hour)}
		return id
	}
	var seq atomic.Int64
	call := func(id gate.Identity) gate.Outcome {
		n := seq.Add(1)
		return g.Decide(ctx, gate.Request{Identity: id, Tool: "fs_write", Args: json.RawMessage(fmt.Sprintf(`{"path":"f%d"}`, n)), Via: "test"})
	}
	// Concurrent calls: the owner's own and its delegates' under many names.
	var wg sync.WaitGroup
	for i := 0; i < 4*gate.MaxPendingApprovals; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			id := owner
			if i%2 == 1 {
				id = delegate(fmt.Sprintf("svc:d%d", i))
			}
			call(id)
		}(i)
	}
	wg.Wait()
	pending, err := st.ListApprovals(ctx, approval.Filter{Status: []approval.Status{approval.StatusPending}})
	if err != nil {
		t.Fatal(err)
	}
	if len(pending) != gate.MaxPendingApprovals {
		t.Errorf("%d pending approvals, want %d", len(pending), gate.MaxPendingApprovals)
	}
	for _, id := range []gate.Identity{owner, delegate("svc:fresh"), delegate("user:other")} {
		out := call(id)
		if out.Decision.Verdict != toolgate.RequireApproval || out.ApprovalID != "" || !strings.Contains(out.Decision.Reason, "not queued") {
			t.Errorf("past the cap (%+v): %+v (approval %q)", id.Delegation, out.Decision, out.ApprovalID)
		}
	}
	// Another principal is not affected, though a delegate took its name.
	if out := call(gate.Identity{Principal: "user:other", AgentID: "scheduler"}); out.ApprovalID == "" {
		t.Errorf("another principal got no approval: %+v", out.Decision)
	}
}

// TestApprovalBindsEveryIdentityField: an approval granted for a call is
// used only by exactly that call: the same tool and arguments in another
// deployment mode, instance, environment, agent or principal, or as a
// delegate, do not consume it.
func TestApprovalBindsEveryIdentityField(t *testing.T) {
	ctx := context.Background()
	st, err := sqlite.Open(filepath.Join(t.TempDir(), "tg.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	src := delegationBundle + `
- {kind: RuntimePolicy, agent_id: scheduler, deployment_mode: staging, tool_authorization_policy: {active_tool_set: all}}
- kind: Agent
  agent_id: other
  version: 1.0.0
  tool_permissions: [{tool_id: tool:fs-write, side_effect_class: write, approval_tier: hitl}]
- {kind: RuntimePolicy, agent_id: other, deployment_mode: production, tool_authorization_policy: {active_tool_set: all}}
- {kind: Instance, instance_id: acme}
- {kind: Instance, instance_id: globex}
- {kind: Principal, principal_id: user:twin, roles: [invoker]}
`
	g := gate.New(compile(t, src), &gate.Options{Approvals: st})
	base := gate.Identity{Principal: "user:owner", AgentID: "scheduler", InstanceID: "acme", Environment: "prod", DeploymentMode: "production"}
	call := func(id gate.Identity) gate.Request {
		return gate.Request{Identity: id, Tool: "fs_write", Args: json.RawMessage(`{"path":"a"}`), Via: "test"}
	}
	out := g.Decide(ctx, call(base))
	if out.Decision.Verdict != toolgate.RequireApproval || out.ApprovalID == "" {
		t.Fatalf("first call: %+v", out.Decision)
	}
	if _, err := g.DecideApproval(ctx, out.ApprovalID, true, "user:lead", "ok", "test"); err != nil {
		t.Fatal(err)
	}
	others := map[string]gate.Identity{}
	mod := func(name string, f func(*gate.Identity)) {
		id := base
		f(&id)
		others[name] = id
	}
	mod("deployment mode", func(id *gate.Identity) { id.DeploymentMode = "staging" })
	mod("instance", func(id *gate.Identity) { id.InstanceID = "globex" })
	mod("environment", func(id *gate.Identity) { id.Environment = "staging" })
	mod("agent", func(id *gate.Identity) { id.AgentID = "other" })
	mod("principal", func(id *gate.Identity) { id.Principal = "user:twin" })
	mod("a delegate of the principal", func(id *gate.Identity) {
		id.Delegation = &gate.Delegation{ID: "dlg_x", Delegate: "svc:x", ExpiresAt: time.Now().Add(time.Hour),
			Grants: []policy.Grant{{Resource: "tool", Action: "invoke", Scope: policy.Scope{All: true}}}}
	})
	for name, id := range others {
		t.Run(name, func(t *testing.T) {
			got := g.Decide(ctx, call(id))
			if got.Decision.Verdict == toolgate.Allow || got.ApprovalID == out.ApprovalID {
				t.Errorf("the approval for %+v was used by a call with another %s: %+v (approval %s)", base, name, got.Decision, got.ApprovalID)
			}
		})
	}
	if got := g.Decide(ctx, call(base)); got.Decision.Verdict != toolgate.Allow || got.ApprovalID != out.ApprovalID {
		t.Errorf("the approved call itself: %+v (approval %s)", got.Decision, got.ApprovalID)
	}
}
