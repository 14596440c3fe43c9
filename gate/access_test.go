package gate_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/toolgate/toolgate"
	"github.com/toolgate/toolgate/audit"
	"github.com/toolgate/toolgate/gate"
	"github.com/toolgate/toolgate/policy"
	"github.com/toolgate/toolgate/store/sqlite"
)

// accessBundle: agent reader reaches docs' resources through a declared
// ceiling (file:///docs/secret/... needs a human) and its prompt
// summarize; p holds grants for docs; lead approves.
const accessBundle = `
- {kind: Upstream, name: docs, transport: stdio, command: "true", tool_prefix: docs_}
- {kind: Upstream, name: wiki, transport: stdio, command: "true"}
- {kind: Tool, tool_id: tool:docs-search, side_effect_class: read, source: {mcp_server: docs}}
- kind: Agent
  agent_id: reader
  version: 1.0.0
  tool_permissions:
    - {tool_id: tool:docs-search, side_effect_class: read}
  resource_permissions:
    - {upstream: docs, uri: "file:///docs/{+path}"}
    - {upstream: docs, uri: "file:///docs/secret/{+path}", approval_tier: hitl}
  prompt_permissions:
    - {upstream: docs, prompt: summarize}
- kind: RuntimePolicy
  agent_id: reader
  deployment_mode: production
  tool_authorization_policy: {active_tool_set: all}
- kind: ToolPolicy
  name: no-leaks
  applies_to: {agents: [reader]}
  conditions:
    - {prompts: [{upstream: docs, prompt: summarize}], when: "!has(args.style) || args.style != 'leak'", reason: no leaking}
- kind: Principal
  principal_id: p
  grants:
    - {resource: tool, action: invoke, scope: all}
    - {resource: mcp_resource, action: read, scope: {upstream: docs}}
    - {resource: prompt, action: get, scope: {upstream: docs}}
- kind: Principal
  principal_id: nobody
  grants: [{resource: tool, action: invoke, scope: all}]
- kind: Principal
  principal_id: lead
  grants: [{resource: approval, action: decide, scope: all}]
`

// routes is a mirror with one template and one prompt of docs.
type routes struct{}

func (routes) ResourceOwner(uri string) (string, string) {
	if policy.CheckResourceURI(uri) == nil && strings.HasPrefix(uri, "file:///docs/") {
		return "docs", ""
	}
	return "", "no template matches it"
}

func (routes) TemplateOwner(tmpl string) (string, bool) {
	return "docs", tmpl == "file:///docs/{+path}"
}

func (routes) PromptOwner(name string) (string, string, bool) {
	if name == "docs_summarize" {
		return "docs", "summarize", true
	}
	return "", "", false
}

type forwarded struct {
	routes []gate.Route
}

func (f *forwarded) forward(ctx context.Context, r gate.Route) (any, error) {
	f.routes = append(f.routes, r)
	if strings.HasSuffix(r.URI, "/broken") {
		return nil, errors.New("upstream docs could not answer")
	}
	return map[string]any{"contents": []any{map[string]any{"uri": r.URI, "text": "hello"}}}, nil
}

func newAccessGate(t *testing.T) (*gate.Gate, *sqlite.Store, *audit.Recorder) {
	t.Helper()
	st, err := sqlite.Open(filepath.Join(t.TempDir(), "toolgate.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	rec := audit.NewRecorder(st, nil)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		rec.Close(ctx)
		st.Close()
	})
	g := gate.New(compile(t, accessBundle), &gate.Options{Recorder: rec, Approvals: st})
	g.SetRoutes(routes{})
	return g, st, rec
}

// eventsOf returns the recorded events of a correlation id, in order.
func eventsOf(t *testing.T, rec *audit.Recorder, st *sqlite.Store, correlation string) []audit.Event {
	t.Helper()
	ctx := context.Background()
	if err := rec.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	all, err := audit.ReadEvents(ctx, st, 1, 10_000)
	if err != nil {
		t.Fatal(err)
	}
	var out []audit.Event
	for _, e := range all {
		if e.CorrelationID == correlation {
			out = append(out, e)
		}
	}
	return out
}

type accessRecord struct {
	Type, Verdict, Code, Layer, ToolID, ToolName, Access, Method, Upstream string
}

func recordOf(e audit.Event) accessRecord {
	s := func(k string) string { v, _ := e.Details[k].(string); return v }
	return accessRecord{e.EventType, e.Verdict, e.Code, e.Layer, e.ToolID, e.ToolName, s("access"), s("method"), s("upstream")}
}

// TestHandleAccess: every access is decided once, recorded once (and its
// completion once more), and forwarded only when allowed, to the
// upstream the decision named; one the caller is not shown is answered
// as unknown and sent nowhere.
func TestHandleAccess(t *testing.T) {
	ctx := context.Background()
	g, st, rec := newAccessGate(t)
	reader := gate.Identity{Principal: "p", AgentID: "reader"}
	docsAll := policy.TemplateTargetPrefix + policy.JoinName("docs", "file:///docs/{+path}")
	cases := []struct {
		name      string
		req       gate.AccessRequest
		visible   bool
		forwarded []gate.Route
		records   []accessRecord
	}{
		{"an allowed read",
			gate.AccessRequest{Identity: reader, Kind: toolgate.AccessResourceRead, URI: "file:///docs/a.md", Method: "resources/read"},
			true, []gate.Route{{Upstream: "docs", URI: "file:///docs/a.md"}},
			[]accessRecord{
				{"agent.tool.authorized", "allow", "ok", "", docsAll, "file:///docs/a.md", "resource_read", "resources/read", "docs"},
				{"agent.tool.completed", "allow", "ok", "", docsAll, "file:///docs/a.md", "resource_read", "resources/read", "docs"},
			}},
		{"a read that fails upstream",
			gate.AccessRequest{Identity: reader, Kind: toolgate.AccessResourceRead, URI: "file:///docs/broken", Method: "resources/read"},
			true, []gate.Route{{Upstream: "docs", URI: "file:///docs/broken"}},
			[]accessRecord{
				{"agent.tool.authorized", "allow", "ok", "", docsAll, "file:///docs/broken", "resource_read", "resources/read", "docs"},
				{"agent.tool.failed", "allow", "execution_error", "", docsAll, "file:///docs/broken", "resource_read", "resources/read", "docs"},
			}},
		{"a read without a grant is hidden",
			gate.AccessRequest{Identity: gate.Identity{Principal: "nobody", AgentID: "reader"}, Kind: toolgate.AccessResourceRead, URI: "file:///docs/a.md", Method: "resources/read"},
			false, nil,
			[]accessRecord{{"agent.tool.unauthorized", "deny", "rbac_resource", "grant", docsAll, "file:///docs/a.md", "resource_read", "resources/read", "docs"}}},
		{"a URI no upstream owns",
			gate.AccessRequest{Identity: reader, Kind: toolgate.AccessResourceRead, URI: "file:///etc/passwd", Method: "resources/read"},
			false, nil,
			[]accessRecord{{"agent.tool.unauthorized", "deny", "unknown_resource", "composition", "", "file:///etc/passwd", "resource_read", "resources/read", ""}}},
		{"a URI with a second spelling is refused for its form, visibly",
			gate.AccessRequest{Identity: reader, Kind: toolgate.AccessResourceRead, URI: "file:///docs/%61.md", Method: "resources/read"},
			true, nil,
			[]accessRecord{{"agent.tool.unauthorized", "deny", "malformed_call", "composition", "", "file:///docs/%61.md", "resource_read", "resources/read", ""}}},
		{"a prompt its condition refuses is visible",
			gate.AccessRequest{Identity: reader, Kind: toolgate.AccessPromptGet, Prompt: "docs_summarize", Args: []byte(`{"style":"leak"}`), Method: "prompts/get"},
			true, nil,
			[]accessRecord{{"agent.tool.unauthorized", "deny", "condition_failed", "condition", "prompt:docs.summarize", "docs_summarize", "prompt_get", "prompts/get", "docs"}}},
		{"an allowed prompt goes by the upstream's own name",
			gate.AccessRequest{Identity: reader, Kind: toolgate.AccessPromptGet, Prompt: "docs_summarize", Args: []byte(`{"style":"short"}`), Method: "prompts/get"},
			true, []gate.Route{{Upstream: "docs", Prompt: "summarize"}},
			[]accessRecord{
				{"agent.tool.authorized", "allow", "ok", "", "prompt:docs.summarize", "docs_summarize", "prompt_get", "prompts/get", "docs"},
				{"agent.tool.completed", "allow", "ok", "", "prompt:docs.summarize", "docs_summarize", "prompt_get", "prompts/get", "docs"},
			}},
		{"prompt arguments with a duplicate key",
			gate.AccessRequest{Identity: reader, Kind: toolgate.AccessPromptGet, Prompt: "docs_summarize", Args: []byte(`{"style":"a","style":"leak"}`), Method: "prompts/get"},
			true, nil,
			[]accessRecord{{"agent.tool.unauthorized", "deny", "malformed_call", "composition", "", "docs_summarize", "prompt_get", "prompts/get", "docs"}}},
		{"a template completion",
			gate.AccessRequest{Identity: reader, Kind: toolgate.AccessResourceComplete, URI: "file:///docs/{+path}", Args: []byte(`{"path":"a"}`), Method: "completion/complete"},
			true, []gate.Route{{Upstream: "docs", URI: "file:///docs/{+path}", Template: true}},
			[]accessRecord{
				{"agent.tool.authorized", "allow", "ok", "", docsAll, "file:///docs/{+path}", "resource_complete", "completion/complete", "docs"},
				{"agent.tool.completed", "allow", "ok", "", docsAll, "file:///docs/{+path}", "resource_complete", "completion/complete", "docs"},
			}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var f forwarded
			req := c.req
			req.Forward = f.forward
			out := g.HandleAccess(ctx, req)
			if out.Visible != c.visible {
				t.Errorf("Visible = %v, want %v (%s %s: %s)", out.Visible, c.visible, out.Decision.Verdict, out.Decision.Code, out.Decision.Reason)
			}
			if diff := cmp.Diff(c.forwarded, f.routes); diff != "" {
				t.Errorf("forwarded (-want +got):\n%s", diff)
			}
			var got []accessRecord
			for _, e := range eventsOf(t, rec, st, out.CorrelationID) {
				got = append(got, recordOf(e))
			}
			if diff := cmp.Diff(c.records, got); diff != "" {
				t.Errorf("records (-want +got):\n%s\nreason: %s", diff, out.Decision.Reason)
			}
		})
	}
}

// TestAccessApproval: an access that needs a human is held as a pending
// approval bound to exactly that access (kind, upstream, URI, identity);
// once approved it is sent once; an approved read is not a subscribe.
func TestAccessApproval(t *testing.T) {
	ctx := context.Background()
	g, _, _ := newAccessGate(t)
	reader := gate.Identity{Principal: "p", AgentID: "reader"}
	var f forwarded
	read := gate.AccessRequest{Identity: reader, Kind: toolgate.AccessResourceRead, URI: "file:///docs/secret/plan.md", Method: "resources/read", Forward: f.forward}
	out := g.HandleAccess(ctx, read)
	if out.Decision.Verdict != toolgate.RequireApproval || out.ApprovalID == "" || !out.Visible {
		t.Fatalf("first read: %s %s approval %q visible %v: %s", out.Decision.Verdict, out.Decision.Code, out.ApprovalID, out.Visible, out.Decision.Reason)
	}
	if again := g.HandleAccess(ctx, read); again.ApprovalID != out.ApprovalID {
		t.Errorf("the same read asked again got approval %q, want the pending %q", again.ApprovalID, out.ApprovalID)
	}
	if _, err := g.DecideApproval(ctx, out.ApprovalID, true, "p", "mine", "test"); !errors.Is(err, gate.ErrSelfApproval) {
		t.Errorf("p approving its own access: %v, want ErrSelfApproval", err)
	}
	if _, err := g.DecideApproval(ctx, out.ApprovalID, true, "lead", "ok", "test"); err != nil {
		t.Fatal(err)
	}
	sub := read
	sub.Kind, sub.Method = toolgate.AccessResourceSubscribe, "resources/subscribe"
	if o := g.HandleAccess(ctx, sub); o.Decision.Verdict != toolgate.RequireApproval || o.ApprovalID == out.ApprovalID {
		t.Errorf("a subscribe of the approved read's URI: %s approval %q; want its own pending approval", o.Decision.Verdict, o.ApprovalID)
	}
	other := read
	other.URI = "file:///docs/secret/other.md"
	if o := g.HandleAccess(ctx, other); o.Decision.Verdict != toolgate.RequireApproval {
		t.Errorf("a read of another URI: %s, want require_approval", o.Decision.Verdict)
	}
	if len(f.routes) != 0 {
		t.Fatalf("forwarded before the approved read: %v", f.routes)
	}
	if o := g.HandleAccess(ctx, read); o.Decision.Verdict != toolgate.Allow || o.ApprovalID != out.ApprovalID || len(f.routes) != 1 {
		t.Fatalf("the approved read: %s approval %q forwarded %d: %s", o.Decision.Verdict, o.ApprovalID, len(f.routes), o.Decision.Reason)
	}
	if o := g.HandleAccess(ctx, read); o.Decision.Verdict != toolgate.RequireApproval || len(f.routes) != 1 {
		t.Errorf("the read once more: %s, forwarded %d; want a new approval (one approval, one read)", o.Decision.Verdict, len(f.routes))
	}
}

// TestAccessDecideOnly: decided and recorded, never forwarded.
func TestAccessDecideOnly(t *testing.T) {
	g, st, rec := newAccessGate(t)
	var f forwarded
	out := g.HandleAccess(context.Background(), gate.AccessRequest{Identity: gate.Identity{Principal: "p", AgentID: "reader"},
		Kind: toolgate.AccessResourceRead, URI: "file:///docs/a.md", DecideOnly: true, Forward: f.forward})
	if out.Decision.Verdict != toolgate.Allow || out.Forwarded || len(f.routes) != 0 {
		t.Fatalf("decide only: %s forwarded %v", out.Decision.Verdict, f.routes)
	}
	evs := eventsOf(t, rec, st, out.CorrelationID)
	if len(evs) != 1 || evs[0].Details["decide_only"] != true {
		t.Errorf("decide only records %d events (%v), want one marked decide_only", len(evs), evs)
	}
}

// TestAccessWithoutRoutes: a gate with no routes knows no owner: every
// access is unknown (fail closed), and an explicit Upstream (the CLI's)
// is decided for that upstream.
func TestAccessWithoutRoutes(t *testing.T) {
	g, _, _ := newAccessGate(t)
	g.SetRoutes(nil)
	id := gate.Identity{Principal: "p", AgentID: "reader"}
	out := g.HandleAccess(context.Background(), gate.AccessRequest{Identity: id, Kind: toolgate.AccessResourceRead, URI: "file:///docs/a.md"})
	if out.Decision.Code != toolgate.CodeUnknownResource || out.Visible {
		t.Errorf("without routes: %s visible %v", out.Decision.Code, out.Visible)
	}
	out = g.HandleAccess(context.Background(), gate.AccessRequest{Identity: id, Kind: toolgate.AccessResourceRead, URI: "file:///docs/a.md", Upstream: "docs", DecideOnly: true})
	if out.Decision.Verdict != toolgate.Allow || out.Route.Upstream != "docs" {
		t.Errorf("with an explicit upstream: %s %s", out.Decision.Verdict, out.Decision.Reason)
	}
}

// TestAccessDelegated: a delegation token's resource and prompt grants
// narrow the delegator's accesses as its tool grants narrow calls, and an
// expired one reaches nothing (answered as if nothing existed).
func TestAccessDelegated(t *testing.T) {
	ctx := context.Background()
	g, _, _ := newAccessGate(t)
	d := &gate.Delegation{ID: "dlg_test", Delegate: "agent:helper", ExpiresAt: time.Now().Add(time.Hour),
		Grants: []policy.Grant{{Resource: "mcp_resource", Action: "read", Scope: policy.Scope{Upstream: "docs", URI: "file:///docs/public/{+path}"}}}}
	id := gate.Identity{Principal: "p", AgentID: "reader", Delegation: d}
	read := func(id gate.Identity, uri string) gate.AccessOutcome {
		return g.HandleAccess(ctx, gate.AccessRequest{Identity: id, Kind: toolgate.AccessResourceRead, URI: uri, DecideOnly: true})
	}
	if out := read(id, "file:///docs/public/a.md"); out.Decision.Verdict != toolgate.Allow {
		t.Errorf("inside the delegation: %s %s", out.Decision.Verdict, out.Decision.Reason)
	}
	if out := read(id, "file:///docs/private.md"); out.Decision.Verdict != toolgate.Deny || out.Decision.Layer != toolgate.LayerGrant || out.Visible {
		t.Errorf("outside the delegation: %s %s visible %v", out.Decision.Verdict, out.Decision.Layer, out.Visible)
	}
	if out := g.HandleAccess(ctx, gate.AccessRequest{Identity: id, Kind: toolgate.AccessPromptGet, Prompt: "docs_summarize", DecideOnly: true}); out.Decision.Verdict != toolgate.Deny || out.Visible {
		t.Errorf("a prompt the delegation does not hand: %s visible %v", out.Decision.Verdict, out.Visible)
	}
	gone := *d
	gone.ExpiresAt = time.Now().Add(-time.Second)
	expired := id
	expired.Delegation = &gone
	if out := read(expired, "file:///docs/public/a.md"); out.Decision.Verdict != toolgate.Deny || out.Visible || !strings.Contains(out.Decision.Reason, "expired") {
		t.Errorf("an expired delegation: %s visible %v: %s", out.Decision.Verdict, out.Visible, out.Decision.Reason)
	}
	if g.AccessFilter(expired).Resource("docs", "file:///docs/public/a.md") {
		t.Errorf("an expired delegation's list shows a resource")
	}
}
