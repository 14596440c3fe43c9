package authz_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/toolgate/toolgate"
	"github.com/toolgate/toolgate/authz"
	"github.com/toolgate/toolgate/policy"
)

// bundleOf decodes YAML documents into a bundle named after the test.
func bundleOf(t testing.TB, src string) *policy.Bundle {
	t.Helper()
	b := &policy.Bundle{}
	b.AddYAML(t.Name()+".yaml", []byte(src))
	return b
}

// compileBundle compiles b and fails the test on any error.
func compileBundle(t testing.TB, b *policy.Bundle, opts *authz.Options) *authz.Snapshot {
	t.Helper()
	snap, rep, err := authz.Compile(b, opts)
	if err != nil {
		t.Fatalf("compile: %v", err)
	}
	if snap.Report() != rep {
		t.Errorf("Snapshot.Report() is not the report Compile returned")
	}
	return snap
}

func snapshotOf(t testing.TB, src string, opts *authz.Options) *authz.Snapshot {
	t.Helper()
	return compileBundle(t, bundleOf(t, src), opts)
}

// outcome is the part of a decision the tables pin.
type outcome struct {
	Verdict toolgate.Verdict
	Code    toolgate.Code
	Layer   toolgate.Layer
	ToolID  string
}

type decideCase struct {
	name     string
	call     toolgate.Call
	want     outcome
	mentions []string // substrings of the reason
}

func outcomeOf(d toolgate.Decision) outcome {
	return outcome{d.Verdict, d.Code, d.Layer, d.ToolID}
}

func allow(id string) outcome {
	return outcome{toolgate.Allow, toolgate.CodeOK, toolgate.LayerNone, id}
}

func deny(code toolgate.Code, layer toolgate.Layer, id string) outcome {
	return outcome{toolgate.Deny, code, layer, id}
}

func approval(id string) outcome {
	return outcome{toolgate.RequireApproval, toolgate.CodeApprovalRequired, toolgate.LayerApproval, id}
}

func runDecideCases(t *testing.T, snap *authz.Snapshot, cases []decideCase) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			call := c.call
			d := snap.Decide(&call)
			if diff := cmp.Diff(c.want, outcomeOf(d)); diff != "" {
				t.Errorf("decision (-want +got):\n%s\nreason: %s", diff, d.Reason)
			}
			for _, m := range c.mentions {
				if !strings.Contains(d.Reason, m) {
					t.Errorf("reason %q does not mention %q", d.Reason, m)
				}
			}
			if d.EventType != toolgate.EventFor(d.Verdict) {
				t.Errorf("event %s for verdict %s, want %s", d.EventType, d.Verdict, toolgate.EventFor(d.Verdict))
			}
			if d.ToolName != call.Tool {
				t.Errorf("ToolName = %q, want the name as called %q", d.ToolName, call.Tool)
			}
			if d.Reason == "" {
				t.Error("empty reason")
			}
			// Explain ends in the same decision.
			ed, trace := snap.Explain(&call)
			if diff := cmp.Diff(d, ed); diff != "" {
				t.Errorf("Explain's decision differs from Decide's (-decide +explain):\n%s", diff)
			}
			checkTrace(t, trace)
		})
	}
}

// layerOrder is every layer Explain reports, in order.
var layerOrder = []toolgate.Layer{
	toolgate.LayerComposition, toolgate.LayerCeiling, toolgate.LayerRuntime, toolgate.LayerInstance,
	toolgate.LayerPolicy, toolgate.LayerGrant, toolgate.LayerResource, toolgate.LayerCondition, toolgate.LayerApproval,
}

func checkTrace(t *testing.T, trace []authz.LayerResult) {
	t.Helper()
	var layers []toolgate.Layer
	for _, lr := range trace {
		layers = append(layers, lr.Layer)
		switch lr.Verdict {
		case "pass", "skipped":
		case "deny", "require_approval":
			if lr.Code == "" || lr.Reason == "" {
				t.Errorf("layer %s: %s without code or reason", lr.Layer, lr.Verdict)
			}
		default:
			t.Errorf("layer %s: verdict %q, want pass, deny, require_approval or skipped", lr.Layer, lr.Verdict)
		}
	}
	if diff := cmp.Diff(layerOrder, layers); diff != "" {
		t.Errorf("Explain layers (-want +got):\n%s", diff)
	}
}

func args(kv ...any) map[string]any {
	m := map[string]any{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i].(string)] = kv[i+1]
	}
	return m
}

const delegationBundle = `
- {kind: Tool, tool_id: tool:fs-read, side_effect_class: read}
- {kind: Tool, tool_id: tool:fs-search, side_effect_class: read}
- {kind: Tool, tool_id: tool:code-run, side_effect_class: write}
- kind: Agent
  agent_id: verifier
  tool_permissions:
    - {tool_id: tool:fs-read, side_effect_class: read}
    - {tool_id: tool:fs-search, side_effect_class: read}
    - {tool_id: tool:code-run, side_effect_class: write}
- {kind: RuntimePolicy, agent_id: verifier, deployment_mode: production, tool_authorization_policy: {active_tool_set: all}}
- kind: Principal
  principal_id: user:owner
  grants:
    - {resource: tool, action: invoke, scope: {tool: fs.read}}
    - {resource: bifrost_query, action: read, scope: {name: vala.datasets}}
- kind: Principal
  principal_id: svc:scheduler
  delegated_from: user:owner
  grants:
    - {resource: tool, action: invoke, scope: all}
    - {resource: bifrost_query, action: read, scope: all}
- kind: Principal
  principal_id: svc:sub
  delegated_from: svc:scheduler
  grants:
    - {resource: tool, action: invoke, scope: all}
- kind: Principal
  principal_id: user:limited
  grants:
    - {resource: tool, action: invoke, scope: all, when: 'has(args.n) && args.n < 10'}
- kind: Principal
  principal_id: svc:limited-delegate
  delegated_from: user:limited
  grants:
    - {resource: tool, action: invoke, scope: {tool: fs_read}}
`

func TestDecideDelegation(t *testing.T) {
	snap := snapshotOf(t, delegationBundle, nil)
	call := func(principal, tool string, a map[string]any, res ...toolgate.Resource) toolgate.Call {
		return toolgate.Call{AgentID: "verifier", Principal: principal, Tool: tool, Args: a, Resources: res}
	}
	tickets := toolgate.Resource{Type: "bifrost_query", Name: "vala.datasets.tickets"}
	invoices := toolgate.Resource{Type: "bifrost_query", Name: "vala.billing.invoices"}
	runDecideCases(t, snap, []decideCase{
		{"delegate with scope all gets the delegator's exact tool", call("svc:scheduler", "fs_read", args()), allow("tool:fs-read"), nil},
		{"delegate gets no tool the delegator lacks", call("svc:scheduler", "fs_search", args()), deny(toolgate.CodeRBACToolInvoke, toolgate.LayerGrant, "tool:fs-search"), []string{"svc:scheduler"}},
		{"delegate gets no write tool either", call("svc:scheduler", "code.run", args()), deny(toolgate.CodeRBACToolInvoke, toolgate.LayerGrant, "tool:code-run"), nil},
		{"delegate reads below the delegator's resource scope", call("svc:scheduler", "fs_read", args(), tickets), allow("tool:fs-read"), nil},
		{"delegate reads nothing outside it", call("svc:scheduler", "fs_read", args(), invoices), deny(toolgate.CodeRBACResource, toolgate.LayerResource, "tool:fs-read"), []string{"vala.billing.invoices"}},
		{"a chain of two delegations keeps the first delegator's limit", call("svc:sub", "fs.read", args()), allow("tool:fs-read"), nil},
		{"a chain of two delegations never widens", call("svc:sub", "fs.search", args()), deny(toolgate.CodeRBACToolInvoke, toolgate.LayerGrant, "tool:fs-search"), nil},
		{"the delegator's condition binds the delegate (holds)", call("svc:limited-delegate", "fs_read", args("n", 5)), allow("tool:fs-read"), nil},
		{"the delegator's condition binds the delegate (fails)", call("svc:limited-delegate", "fs_read", args("n", 50)), deny(toolgate.CodeConditionFailed, toolgate.LayerCondition, "tool:fs-read"), nil},
		{"the delegator itself", call("user:owner", "fs_read", args()), allow("tool:fs-read"), nil},
	})

	t.Run("removing the delegator's grant removes the delegate's", func(t *testing.T) {
		b := bundleOf(t, delegationBundle)
		for _, p := range b.Principals {
			if p.PrincipalID == "user:owner" {
				p.Grants = p.Grants[1:] // drop {tool: fs.read}
			}
		}
		snap := compileBundle(t, b, nil)
		for _, p := range []string{"user:owner", "svc:scheduler", "svc:sub"} {
			d := snap.Decide(&toolgate.Call{AgentID: "verifier", Principal: p, Tool: "fs_read", Args: args()})
			if diff := cmp.Diff(deny(toolgate.CodeRBACToolInvoke, toolgate.LayerGrant, "tool:fs-read"), outcomeOf(d)); diff != "" {
				t.Errorf("%s: decision (-want +got):\n%s", p, diff)
			}
		}
	})
}

// TestDelegationThroughWildcardNeverWidens pins that a delegate never holds
// what its delegator cannot use. A delegator grant with resource or action
// "*" counts as covering everything when grants are intersected, but the
// decision never honours "*" for the delegator itself.
func TestWildcardResourceOrActionRefused(t *testing.T) {
	// Wildcards are written scope: all; a "*" resource or action would let a
	// delegation through that Decide never honours, so validation refuses it.
	b := bundleOf(t, `
- {kind: Tool, tool_id: tool:fs-read, side_effect_class: read}
- kind: Principal
  principal_id: user:boss
  grants:
    - {resource: "*", action: "*", scope: all}
- kind: Principal
  principal_id: user:reader
  grants:
    - {resource: bifrost_query, action: "*", scope: all}
`)
	rep := b.Validate(nil)
	if rep.OK() || len(rep.Errors) != 2 {
		t.Fatalf("want two errors, got %v", rep.Errors)
	}
	for _, d := range rep.Errors {
		if !strings.Contains(d.Message, "wildcard is written scope: all") {
			t.Errorf("error %q does not say how to write a wildcard", d.Message)
		}
	}
}

func rank(v toolgate.Verdict) int {
	switch v {
	case toolgate.Allow:
		return 2
	case toolgate.RequireApproval:
		return 1
	}
	return 0
}

func TestDecideConditions(t *testing.T) {
	snap := snapshotOf(t, `
- {kind: Tool, tool_id: tool:pay-refund, side_effect_class: write}
- {kind: Tool, tool_id: tool:db-query, side_effect_class: read}
- kind: Agent
  agent_id: agt
  tool_permissions:
    - {tool_id: tool:pay-refund, side_effect_class: write}
    - {tool_id: tool:db-query, side_effect_class: read}
- {kind: RuntimePolicy, agent_id: agt, deployment_mode: production, tool_authorization_policy: {active_tool_set: all}}
- kind: Principal
  principal_id: user:p
  grants:
    - {resource: tool, action: invoke, scope: {tool: pay_refund}, when: 'args.amount <= 100'}
    - {resource: tool, action: invoke, scope: {tool: db_query}}
- kind: Principal
  principal_id: user:dyn
  grants:
    - {resource: tool, action: invoke, scope: all, when: 'args.flag'}
- kind: Principal
  principal_id: user:either
  grants:
    - {resource: tool, action: invoke, scope: all, when: 'args.amount <= 10'}
    - {resource: tool, action: invoke, scope: {tool: pay_refund}, when: 'args.amount >= 1000'}
- kind: ToolPolicy
  name: limits
  conditions:
    - tools: [tool:db-query]
      when: 'args.limit <= 1000'
      reason: at most 1000 rows
- kind: ToolPolicy
  name: staging-only
  applies_to: {environments: [staging]}
  conditions:
    - {tools: [tool:pay-refund], when: 'false', reason: no refunds in staging}
- {kind: Instance, instance_id: acme}
`, nil)
	call := func(principal, tool string, a map[string]any) toolgate.Call {
		return toolgate.Call{AgentID: "agt", Principal: principal, Tool: tool, Args: a}
	}
	refund, query := "tool:pay-refund", "tool:db-query"
	failed := func(id string) outcome { return deny(toolgate.CodeConditionFailed, toolgate.LayerCondition, id) }
	stagingCall := call("user:p", "pay_refund", args("amount", 5))
	stagingCall.InstanceID, stagingCall.Environment = "acme", "staging"
	runDecideCases(t, snap, []decideCase{
		{"grant condition holds", call("user:p", "pay_refund", args("amount", 50)), allow(refund), nil},
		{"grant condition fails", call("user:p", "pay_refund", args("amount", 500)), failed(refund), []string{"user:p", refund}},
		{"missing argument is an evaluation error and denies", call("user:p", "pay_refund", args()), failed(refund), []string{"no such key", "an evaluation error denies"}},
		{"type mismatch denies", call("user:p", "pay_refund", args("amount", "fifty")), failed(refund), []string{"an evaluation error denies"}},
		{"non-bool result denies", call("user:dyn", "db_query", args("flag", 1, "limit", 1)), failed(query), []string{"not a bool"}},
		{"bool result allows", call("user:dyn", "db_query", args("flag", true, "limit", 1)), allow(query), nil},
		{"either grant may hold (first)", call("user:either", "pay_refund", args("amount", 5)), allow(refund), nil},
		{"either grant may hold (second)", call("user:either", "pay_refund", args("amount", 5000)), allow(refund), nil},
		{"neither grant holds", call("user:either", "pay_refund", args("amount", 500)), failed(refund), nil},
		{"tool policy condition holds", call("user:p", "db_query", args("limit", 10)), allow(query), nil},
		{"tool policy condition fails with its reason", call("user:p", "db_query", args("limit", 5000)), failed(query), []string{"limits", "at most 1000 rows"}},
		{"tool policy condition error denies", call("user:p", "db_query", args()), failed(query), []string{"an evaluation error denies"}},
		{"environment-scoped condition", stagingCall, failed(refund), []string{"no refunds in staging"}},
		{"tool level skips argument conditions", toolgate.Call{AgentID: "agt", Principal: "user:p", Tool: "pay_refund", ToolLevel: true}, allow(refund), nil},
	})
}

const guardBundle = `
- {kind: Tool, tool_id: tool:pay-refund, side_effect_class: irreversible}
- {kind: Tool, tool_id: tool:pay-void, side_effect_class: write}
- {kind: Tool, tool_id: tool:pay-read, side_effect_class: read}
- {kind: Tool, tool_id: tool:pay-export, side_effect_class: read}
- kind: Agent
  agent_id: cashier
  tool_permissions:
    - {tool_id: tool:pay-refund, side_effect_class: irreversible, approval_tier: policy}
    - {tool_id: tool:pay-void, side_effect_class: write, approval_tier: policy}
    - {tool_id: tool:pay-read, side_effect_class: read, approval_tier: policy}
    - {tool_id: tool:pay-export, side_effect_class: read, approval_tier: hitl}
- {kind: RuntimePolicy, agent_id: cashier, deployment_mode: production, tool_authorization_policy: {active_tool_set: all}}
- kind: Principal
  principal_id: user:clerk
  grants: [{resource: tool, action: invoke, scope: all}]
- kind: ToolPolicy
  name: guard
  policy_guard:
    - {tools: [tool:pay-refund], when: 'args.amount <= 50', effect: allow, reason: small refunds are automatic}
    - {tools: [tool:pay-refund], when: 'args.amount > 10000', effect: deny, reason: far too large}
    - {tools: [tool:pay-refund], effect: escalate, reason: larger refunds need a human}
    - {tools: [tool:pay-void], effect: deny, reason: voids are never automatic}
`

func TestDecidePolicyGuard(t *testing.T) {
	snap := snapshotOf(t, guardBundle, nil)
	call := func(tool string, a map[string]any) toolgate.Call {
		return toolgate.Call{AgentID: "cashier", Principal: "user:clerk", Tool: tool, Args: a}
	}
	approved := call("pay_refund", args("amount", 500))
	approved.Approved = true
	toolLevel := func(tool string) toolgate.Call {
		return toolgate.Call{AgentID: "cashier", Principal: "user:clerk", Tool: tool, ToolLevel: true}
	}
	refund := "tool:pay-refund"
	runDecideCases(t, snap, []decideCase{
		{"allow rule matches", call("pay_refund", args("amount", 20)), allow(refund), nil},
		{"deny rule matches", call("pay_refund", args("amount", 20000)), deny(toolgate.CodePolicyDenied, toolgate.LayerApproval, refund), []string{"Policy Guard", "far too large"}},
		{"escalate rule matches", call("pay_refund", args("amount", 500)), approval(refund), []string{"larger refunds need a human"}},
		{"a rule that cannot be evaluated denies", call("pay_refund", args()), deny(toolgate.CodeConditionFailed, toolgate.LayerApproval, refund), []string{"could not be evaluated", "an evaluation error denies"}},
		{"unconditional deny rule", call("pay_void", args()), deny(toolgate.CodePolicyDenied, toolgate.LayerApproval, "tool:pay-void"), []string{"voids are never automatic"}},
		{"no rule matches: escalate to a human", call("pay_read", args()), approval("tool:pay-read"), []string{"no policy_guard rule matches"}},
		{"hitl tier always asks a human", call("pay_export", args()), approval("tool:pay-export"), []string{"hitl"}},
		{"an approval turns escalation into allow", approved, allow(refund), nil},
		{"tool level: conditional rules are not judged", toolLevel("pay_refund"), approval(refund), nil},
		{"tool level: an unconditional deny rule denies", toolLevel("pay_void"), deny(toolgate.CodePolicyDenied, toolgate.LayerApproval, "tool:pay-void"), nil},
	})
	d := snap.Decide(&approved)
	if !d.ApprovalUsed {
		t.Errorf("approved call: ApprovalUsed = false")
	}
	if d.ApprovalTier != toolgate.TierPolicy || d.SideEffectClass != toolgate.SideEffectIrreversible {
		t.Errorf("approved call: tier %q class %s, want policy irreversible", d.ApprovalTier, d.SideEffectClass)
	}
}

func TestDecideA2ATiers(t *testing.T) {
	snap := snapshotOf(t, `
- {kind: Agent, agent_id: partner-a}
- {kind: Agent, agent_id: partner-b}
- {kind: Agent, agent_id: partner-c}
- {kind: Agent, agent_id: partner-d}
- {kind: Tool, tool_id: tool:a-invoke, side_effect_class: none, a2a_agent: partner-a}
- {kind: Tool, tool_id: tool:b-invoke, side_effect_class: none, a2a_agent: partner-b}
- {kind: Tool, tool_id: tool:c-invoke, side_effect_class: none, a2a_agent: partner-c}
- {kind: Tool, tool_id: tool:d-invoke, side_effect_class: none, a2a_agent: partner-d}
- kind: Agent
  agent_id: orchestrator
  tool_permissions:
    - {tool_id: tool:a-invoke, side_effect_class: none}
    - {tool_id: tool:b-invoke, side_effect_class: none}
    - {tool_id: tool:c-invoke, side_effect_class: none}
    - {tool_id: tool:d-invoke, side_effect_class: none}
- kind: RuntimePolicy
  agent_id: orchestrator
  deployment_mode: production
  tool_authorization_policy:
    active_tool_set: all
    a2a_tool_policy: {trust_tiers: {partner-a: trusted, partner-b: untrusted, partner-c: provisional}}
- kind: RuntimePolicy
  agent_id: orchestrator
  deployment_mode: development
  tool_authorization_policy:
    active_tool_set: all
    a2a_tool_policy: {allowed_partners: [partner-a, partner-b], default_trust_tier: trusted}
- kind: RuntimePolicy
  agent_id: orchestrator
  deployment_mode: staging
  tool_authorization_policy:
    active_tool_set: all
    a2a_tool_policy: {default_trust_tier: untrusted, trust_tiers: {partner-a: trusted}}
- kind: Principal
  principal_id: user:p
  grants: [{resource: tool, action: invoke, scope: all}]
`, nil)
	call := func(mode, tool string) toolgate.Call {
		return toolgate.Call{AgentID: "orchestrator", DeploymentMode: mode, Principal: "user:p", Tool: tool, Args: args()}
	}
	untrusted := func(id string) outcome { return deny(toolgate.CodeA2AUntrusted, toolgate.LayerRuntime, id) }
	runDecideCases(t, snap, []decideCase{
		{"trusted partner", call("production", "a_invoke"), allow("tool:a-invoke"), nil},
		{"untrusted partner", call("production", "b_invoke"), untrusted("tool:b-invoke"), []string{"partner-b", "untrusted"}},
		{"provisional partner needs approval", call("production", "c_invoke"), approval("tool:c-invoke"), []string{"provisional"}},
		{"default tier is provisional", call("production", "d_invoke"), approval("tool:d-invoke"), []string{"partner-d", "provisional"}},
		{"allowlisted partner with default trusted", call("development", "a_invoke"), allow("tool:a-invoke"), nil},
		{"partner outside allowed_partners", call("development", "c_invoke"), untrusted("tool:c-invoke"), []string{"allowed_partners"}},
		{"explicit tier beats the default", call("staging", "a_invoke"), allow("tool:a-invoke"), nil},
		{"default tier untrusted", call("staging", "d_invoke"), untrusted("tool:d-invoke"), nil},
	})
}

func TestDecideMCPServers(t *testing.T) {
	snap := snapshotOf(t, `
- {kind: Tool, tool_id: tool:gh-list, side_effect_class: read, source: {mcp_server: github}}
- {kind: Tool, tool_id: tool:gh-create, side_effect_class: write, source: {mcp_server: github}}
- {kind: Tool, tool_id: tool:wiki-edit, side_effect_class: write, source: {mcp_server: wiki}}
- {kind: Tool, tool_id: tool:slack-send, side_effect_class: write, source: {mcp_server: slack}}
- {kind: Tool, tool_id: tool:note-write, side_effect_class: write}
- {kind: Tool, tool_id: tool:gh-peek, side_effect_class: read, source: {mcp_server: github}}
- kind: Agent
  agent_id: dev
  tool_permissions:
    - {tool_id: tool:gh-list, side_effect_class: read}
    - {tool_id: tool:gh-create, side_effect_class: write}
    - {tool_id: tool:wiki-edit, side_effect_class: write}
    - {tool_id: tool:slack-send, side_effect_class: write}
    - {tool_id: tool:note-write, side_effect_class: write}
    - {tool_id: tool:gh-peek, side_effect_class: write}
- kind: RuntimePolicy
  agent_id: dev
  deployment_mode: production
  tool_authorization_policy:
    active_tool_set: all
    mcp_tool_policy: {allowed_servers: [github, wiki], denied_servers: [wiki]}
- kind: RuntimePolicy
  agent_id: dev
  deployment_mode: development
  tool_authorization_policy:
    active_tool_set: all
    mcp_tool_policy: {mcp_write_approval_required: false}
- kind: Principal
  principal_id: user:p
  grants: [{resource: tool, action: invoke, scope: all}]
`, nil)
	call := func(mode, tool string) toolgate.Call {
		return toolgate.Call{AgentID: "dev", DeploymentMode: mode, Principal: "user:p", Tool: tool, Args: args()}
	}
	denied := func(id string) outcome { return deny(toolgate.CodeMCPServerDenied, toolgate.LayerRuntime, id) }
	runDecideCases(t, snap, []decideCase{
		{"allowed server, read tool", call("production", "gh_list"), allow("tool:gh-list"), nil},
		{"allowed server, write tool needs approval", call("production", "gh_create"), approval("tool:gh-create"), []string{"mcp_write_approval_required"}},
		{"the ceiling's higher class counts for the write rule", call("production", "gh_peek"), approval("tool:gh-peek"), []string{"write"}},
		{"denied server wins over allowed", call("production", "wiki_edit"), denied("tool:wiki-edit"), []string{"denied_servers", "wiki"}},
		{"server outside allowed_servers", call("production", "slack_send"), denied("tool:slack-send"), []string{"allowed_servers", "slack"}},
		{"non-MCP write tool is not under the MCP rule", call("production", "note_write"), allow("tool:note-write"), nil},
		{"write approval switched off", call("development", "gh_create"), allow("tool:gh-create"), nil},
		{"no server lists: every server passes", call("development", "wiki_edit"), allow("tool:wiki-edit"), nil},
	})
}

func TestDecideFailsClosed(t *testing.T) {
	snap := snapshotOf(t, `
- {kind: Tool, tool_id: tool:fs-read, side_effect_class: read}
- {kind: Tool, tool_id: tool:fs-write, side_effect_class: write}
- kind: Agent
  agent_id: worker
  tool_permissions: [{tool_id: tool:fs-read, side_effect_class: read}]
- {kind: RuntimePolicy, agent_id: worker, deployment_mode: production, tool_authorization_policy: {active_tool_set: all}}
- {kind: Instance, instance_id: acme}
- kind: Principal
  principal_id: user:p
  grants: [{resource: tool, action: invoke, scope: all}]
`, nil)
	call := func(agent, principal, tool string) toolgate.Call {
		return toolgate.Call{AgentID: agent, Principal: principal, Tool: tool, Args: args()}
	}
	withInstance := call("worker", "user:p", "fs_read")
	withInstance.InstanceID, withInstance.Environment = "globex", "staging"
	withMode := call("worker", "user:p", "fs_read")
	withMode.DeploymentMode = "canary"
	toolLevel := call("worker", "user:ghost", "fs_read")
	toolLevel.Args, toolLevel.ToolLevel = nil, true
	id := "tool:fs-read"
	runDecideCases(t, snap, []decideCase{
		{"known everything", call("worker", "user:p", "fs_read"), allow(id), nil},
		{"unknown agent", call("nobody", "user:p", "fs_read"), deny(toolgate.CodeUnknownAgent, toolgate.LayerComposition, id), []string{"nobody", "not declared"}},
		{"empty agent", call("", "user:p", "fs_read"), deny(toolgate.CodeUnknownAgent, toolgate.LayerComposition, id), nil},
		{"unknown instance", withInstance, deny(toolgate.CodeUnknownInstance, toolgate.LayerInstance, id), []string{"globex"}},
		{"unknown principal", call("worker", "user:ghost", "fs_read"), deny(toolgate.CodeRBACToolInvoke, toolgate.LayerGrant, id), []string{"user:ghost", "not declared"}},
		{"no principal", call("worker", "", "fs_read"), deny(toolgate.CodeRBACToolInvoke, toolgate.LayerGrant, id), nil},
		{"unknown principal at tool level", toolLevel, deny(toolgate.CodeRBACToolInvoke, toolgate.LayerGrant, id), nil},
		{"mode without a runtime policy", withMode, deny(toolgate.CodeNoRuntimePolicy, toolgate.LayerRuntime, id), []string{"canary"}},
		{"tool outside the ceiling", call("worker", "user:p", "fs_write"), deny(toolgate.CodeNotInCeiling, toolgate.LayerCeiling, "tool:fs-write"), []string{"fs_write", "tool:fs-write", "[tool:fs-read]"}},
		{"unknown tool", call("worker", "user:p", "fs_delete"), deny(toolgate.CodeUnknownTool, toolgate.LayerComposition, "tool:fs-delete"), nil},
		{"malformed name", call("worker", "user:p", "FS_READ"), deny(toolgate.CodeMalformedCall, toolgate.LayerComposition, ""), nil},
	})

	t.Run("no snapshot", func(t *testing.T) {
		var none *authz.Snapshot
		d := none.Decide(&toolgate.Call{AgentID: "worker", Principal: "user:p", Tool: "fs_read"})
		if diff := cmp.Diff(outcome{toolgate.Deny, toolgate.CodeInternalError, toolgate.LayerInternal, ""}, outcomeOf(d)); diff != "" {
			t.Errorf("decision (-want +got):\n%s", diff)
		}
	})

	t.Run("unknown agent resolves to nothing", func(t *testing.T) {
		res := snap.Resolve(authz.Context{AgentID: "nobody"})
		if len(res.ActiveToolSet)+len(res.Authorized)+len(res.Disclosed)+len(res.Tools) != 0 {
			t.Errorf("resolution of an unknown agent has tools: %+v", res)
		}
		if len(res.Removed) != 1 || res.Removed[0].Code != toolgate.CodeUnknownAgent {
			t.Errorf("removed = %+v, want one unknown_agent removal", res.Removed)
		}
	})
}

// TestExplainWithoutSnapshot pins that Explain fails closed like Decide
// when no snapshot is loaded, instead of panicking.
func TestExplainWithoutSnapshot(t *testing.T) {
	var none *authz.Snapshot
	call := &toolgate.Call{AgentID: "worker", Principal: "user:p", Tool: "fs_read"}
	var d toolgate.Decision
	func() {
		defer func() {
			if r := recover(); r != nil {
				t.Fatalf("Explain on a nil snapshot panicked: %v", r)
			}
		}()
		d, _ = none.Explain(call)
	}()
	if diff := cmp.Diff(none.Decide(call), d); diff != "" {
		t.Errorf("Explain's decision differs from Decide's (-decide +explain):\n%s", diff)
	}
}

const controlFlowBundle = `
- {kind: Tool, tool_id: tool:task-complete, side_effect_class: none, control_flow: true}
- {kind: Tool, tool_id: tool:ask-user, side_effect_class: none}
- {kind: Tool, tool_id: tool:gh-delete, side_effect_class: irreversible}
- kind: Agent
  agent_id: runner
  tool_permissions:
    - {tool_id: tool:task-complete, side_effect_class: none, approval_tier: hitl}
    - {tool_id: tool:ask-user, side_effect_class: none, approval_tier: policy}
    - {tool_id: tool:gh-delete, side_effect_class: irreversible}
- kind: Agent
  agent_id: bare
  tool_permissions: [{tool_id: tool:gh-delete, side_effect_class: irreversible}]
- {kind: RuntimePolicy, agent_id: runner, deployment_mode: production, tool_authorization_policy: {active_tool_set: all}}
- kind: RuntimePolicy
  agent_id: runner
  deployment_mode: development
  tool_authorization_policy: {active_tool_set: restricted, tool_suspensions: [tool:task-complete]}
- {kind: RuntimePolicy, agent_id: bare, deployment_mode: production, tool_authorization_policy: {active_tool_set: all}}
- kind: Instance
  instance_id: acme
  environment_overrides: {staging: {tool_suspensions: [tool:ask-user]}}
- {kind: Principal, principal_id: user:nobody}
- kind: ToolPolicy
  name: strict
  denied: ["tool:*"]
  requires_human_approval: true
  conditions: [{tools: ["tool:*"], when: 'false', reason: nothing passes}]
- {kind: Settings, control_flow_tools: [tool:ask-user]}
`

func TestDecideControlFlowTools(t *testing.T) {
	snap := snapshotOf(t, controlFlowBundle, nil)
	call := func(agent, mode, tool string) toolgate.Call {
		return toolgate.Call{AgentID: agent, DeploymentMode: mode, Principal: "user:nobody", Tool: tool, Args: args()}
	}
	staging := call("runner", "production", "ask_user")
	staging.InstanceID, staging.Environment = "acme", "staging"
	runDecideCases(t, snap, []decideCase{
		{"not gated by policy, grants, conditions or approval", call("runner", "production", "task_complete"), allow("tool:task-complete"), nil},
		{"Settings.control_flow_tools marks a tool", call("runner", "production", "ask_user"), allow("tool:ask-user"), nil},
		{"an ordinary tool is gated", call("runner", "production", "gh_delete"), deny(toolgate.CodePolicyDenied, toolgate.LayerPolicy, "tool:gh-delete"), nil},
		{"the ceiling still binds", call("bare", "production", "task_complete"), deny(toolgate.CodeNotInCeiling, toolgate.LayerCeiling, "tool:task-complete"), nil},
		{"runtime suspensions still bind", call("runner", "development", "task_complete"), deny(toolgate.CodeSuspendedRuntime, toolgate.LayerRuntime, "tool:task-complete"), nil},
		{"instance suspensions still bind", staging, deny(toolgate.CodeSuspendedInstance, toolgate.LayerInstance, "tool:ask-user"), nil},
	})

	res := snap.Resolve(authz.Context{AgentID: "runner", Principal: "user:nobody"})
	if diff := cmp.Diff([]string{"tool:task-complete", "tool:ask-user"}, res.Disclosed); diff != "" {
		t.Errorf("disclosed (-want +got):\n%s", diff)
	}
	for _, st := range res.Tools {
		if want := st.ToolID != "tool:gh-delete"; st.ControlFlow != want {
			t.Errorf("%s: ControlFlow = %v, want %v", st.ToolID, st.ControlFlow, want)
		}
	}
	_, trace := snap.Explain(&toolgate.Call{AgentID: "runner", Principal: "user:nobody", Tool: "task_complete", Args: args()})
	for _, lr := range trace[4:] {
		if lr.Verdict != "pass" || !strings.Contains(lr.Reason, "control-flow") {
			t.Errorf("Explain %s for a control-flow tool: %s (%s), want pass as not gated", lr.Layer, lr.Verdict, lr.Reason)
		}
	}
}

const announcedBundle = `
- {kind: Tool, tool_id: tool:github-create-issue, side_effect_class: write, source: {mcp_server: github}}
- kind: Agent
  agent_id: dev
  tool_permissions:
    - {tool_id: tool:github-create-issue, side_effect_class: write}
    - {tool_id: tool:gh-create, side_effect_class: write}
    - {tool_id: tool:gh-search, side_effect_class: read}
- kind: RuntimePolicy
  agent_id: dev
  deployment_mode: production
  tool_authorization_policy: {active_tool_set: all, mcp_tool_policy: {mcp_write_approval_required: false}}
- kind: Principal
  principal_id: user:p
  grants:
    - {resource: tool, action: invoke, scope: {tool: "tool:gh-search"}}
    - {resource: tool, action: invoke, scope: {tool: gh.create}}
    - {resource: tool, action: invoke, scope: {tool: github_create_issue}}
`

var announced = []authz.AnnouncedTool{
	{ID: "tool:gh-create", Name: "gh_create", MCPServer: "gh", SideEffectClass: toolgate.SideEffectWrite},
	{ID: "tool:gh-search", Name: "GitHub_Search", MCPServer: "gh", SideEffectClass: toolgate.SideEffectRead},
	// Its name spells the catalog tool's id: refused (CheckAnnounced).
	{ID: "tool:gh-issue", Name: "github_create_issue", MCPServer: "gh", SideEffectClass: toolgate.SideEffectWrite},
}

func TestDecideAnnouncedAliases(t *testing.T) {
	snap := snapshotOf(t, announcedBundle, &authz.Options{Announced: announced,
		ValidateOptions: &policy.ValidateOptions{UpstreamProviders: map[string]bool{"gh": true}}})
	call := func(tool string) toolgate.Call {
		return toolgate.Call{AgentID: "dev", Principal: "user:p", Tool: tool, Args: args()}
	}
	runDecideCases(t, snap, []decideCase{
		{"an announced name that is another tool's function name stays that tool's", call("github_create_issue"), allow("tool:github-create-issue"), nil},
		{"the announcement that took it is refused", call("tool:gh-issue"), deny(toolgate.CodeUnknownTool, toolgate.LayerComposition, "tool:gh-issue"), nil},
		{"the catalog tool by its canonical id", call("tool:github-create-issue"), allow("tool:github-create-issue"), nil},
		{"the announced tool by its canonical id", call("tool:gh-create"), allow("tool:gh-create"), nil},
		{"the announced tool by its function name", call("gh_create"), allow("tool:gh-create"), nil},
		{"an alias outside the id syntax resolves", call("GitHub_Search"), allow("tool:gh-search"), nil},
		{"the same alias in other case does not", call("github_search"), deny(toolgate.CodeUnknownTool, toolgate.LayerComposition, "tool:github-search"), nil},
		{"the announced tool by its dot name", call("gh.search"), allow("tool:gh-search"), nil},
	})
	if tl, ok := snap.Tool("tool:gh-search"); !ok || tl.MCPServer != "gh" || tl.Name != "GitHub_Search" {
		t.Errorf("Tool(tool:gh-search) = %+v, %v", tl, ok)
	}

	// Another upstream's name that spells gh's id (validation refuses such
	// a tool_prefix; CheckAnnounced sees one upstream at a time): the
	// call by that name is ambiguous, never one of the two.
	across := snapshotOf(t, announcedBundle, &authz.Options{Announced: append(slices.Clone(announced),
		authz.AnnouncedTool{ID: "tool:hub-make", Name: "gh_create", MCPServer: "hub", SideEffectClass: toolgate.SideEffectWrite}),
		ValidateOptions: &policy.ValidateOptions{UpstreamProviders: map[string]bool{"gh": true, "hub": true}}})
	runDecideCases(t, across, []decideCase{
		{"a name of two tools is ambiguous", call("gh_create"), deny(toolgate.CodeAmbiguousToolName, toolgate.LayerComposition, ""), []string{"tool:gh-create", "tool:hub-make"}},
	})
}

func TestCompileRefusesBadAnnouncements(t *testing.T) {
	opts := func(a ...authz.AnnouncedTool) *authz.Options {
		return &authz.Options{Announced: a, ValidateOptions: &policy.ValidateOptions{UpstreamProviders: map[string]bool{"gh": true}}}
	}
	cases := []struct {
		name string
		opts *authz.Options
		want string
	}{
		{"one alias for two tools", opts(
			authz.AnnouncedTool{ID: "tool:gh-create", Name: "create", MCPServer: "gh"},
			authz.AnnouncedTool{ID: "tool:gh-search", Name: "create", MCPServer: "gh"}), "announced for both"},
		{"not a canonical id", opts(authz.AnnouncedTool{ID: "tool:GH-search", MCPServer: "gh"}), "not a canonical tool id"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, _, err := authz.Compile(bundleOf(t, announcedBundle), c.opts)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("Compile error = %v, want one mentioning %q", err, c.want)
			}
		})
	}
}

// TestCompileAcceptsAnnouncedCeiling pins that a ceiling naming a tool an
// upstream announced compiles when the announcement is given to Compile,
// without the caller repeating its provider in ValidateOptions.
func TestCompileAcceptsAnnouncedCeiling(t *testing.T) {
	snap, rep, err := authz.Compile(bundleOf(t, announcedBundle), &authz.Options{Announced: announced})
	if err != nil {
		t.Fatalf("Compile: %v (errors %v)", err, rep.Errors)
	}
	d := snap.Decide(&toolgate.Call{AgentID: "dev", Principal: "user:p", Tool: "gh_create", Args: args()})
	if d.Verdict != toolgate.Allow {
		t.Errorf("gh_create: %s %s: %s", d.Verdict, d.Code, d.Reason)
	}
}

// TestCompileAcceptsWhatValidateAccepts pins that a bundle without
// validation errors compiles: here a chain of delegations longer than the
// compiler's depth limit, declared delegate first.
func TestCompileAcceptsWhatValidateAccepts(t *testing.T) {
	var sb strings.Builder
	sb.WriteString("- {kind: Tool, tool_id: tool:fs-read, side_effect_class: read}\n")
	const depth = 40
	for i := range depth {
		fmt.Fprintf(&sb, "- {kind: Principal, principal_id: p%d, delegated_from: p%d, grants: [{resource: tool, action: invoke, scope: all}]}\n", i, i+1)
	}
	fmt.Fprintf(&sb, "- {kind: Principal, principal_id: p%d, grants: [{resource: tool, action: invoke, scope: all}]}\n", depth)
	b := bundleOf(t, sb.String())
	// A chain longer than policy.MaxDelegationDepth is refused by Validate,
	// so Compile never meets one it cannot handle.
	rep := b.Validate(nil)
	_, _, err := authz.Compile(b, nil)
	if rep.OK() != (err == nil) {
		t.Errorf("Validate ok=%v but Compile err=%v", rep.OK(), err)
	}
	if rep.OK() {
		t.Errorf("a %d-link delegation chain was accepted", depth)
	}
}

func TestExplainReportsEveryLayer(t *testing.T) {
	snap := snapshotOf(t, guardBundle+`
- kind: ToolPolicy
  name: no-exports
  denied: [tool:pay-export]
- {kind: Principal, principal_id: user:no-grants}
`, nil)
	cases := []struct {
		name   string
		call   toolgate.Call
		layers map[toolgate.Layer]string // the verdicts pinned; others must still be reported
	}{
		{"allowed: every layer passes",
			toolgate.Call{AgentID: "cashier", Principal: "user:clerk", Tool: "pay_refund", Args: args("amount", 20)},
			map[toolgate.Layer]string{toolgate.LayerComposition: "pass", toolgate.LayerPolicy: "pass", toolgate.LayerApproval: "pass"}},
		{"malformed: later layers are skipped",
			toolgate.Call{AgentID: "cashier", Principal: "user:clerk", Tool: "Pay_Refund", Args: args()},
			map[toolgate.Layer]string{toolgate.LayerComposition: "deny", toolgate.LayerCeiling: "skipped", toolgate.LayerApproval: "skipped"}},
		{"unknown agent: layers after it are skipped",
			toolgate.Call{AgentID: "nobody", Principal: "user:clerk", Tool: "pay_refund", Args: args()},
			map[toolgate.Layer]string{toolgate.LayerComposition: "pass", toolgate.LayerRuntime: "skipped", toolgate.LayerApproval: "skipped"}},
		{"policy deny: later layers are still judged",
			toolgate.Call{AgentID: "cashier", Principal: "user:ghost", Tool: "pay_export", Args: args()},
			map[toolgate.Layer]string{toolgate.LayerPolicy: "deny", toolgate.LayerGrant: "deny", toolgate.LayerApproval: "require_approval"}},
		{"no grant at all: the condition layer has no condition to judge",
			toolgate.Call{AgentID: "cashier", Principal: "user:no-grants", Tool: "pay_refund", Args: args("amount", 20)},
			map[toolgate.Layer]string{toolgate.LayerGrant: "deny", toolgate.LayerCondition: "pass", toolgate.LayerApproval: "pass"}},
		{"approval",
			toolgate.Call{AgentID: "cashier", Principal: "user:clerk", Tool: "pay_read", Args: args()},
			map[toolgate.Layer]string{toolgate.LayerGrant: "pass", toolgate.LayerApproval: "require_approval"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d, trace := snap.Explain(&c.call)
			checkTrace(t, trace)
			got := map[toolgate.Layer]string{}
			for _, lr := range trace {
				if _, pinned := c.layers[lr.Layer]; pinned {
					got[lr.Layer] = lr.Verdict
				}
			}
			if diff := cmp.Diff(c.layers, got); diff != "" {
				t.Errorf("layer verdicts (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(snap.Decide(&c.call), d); diff != "" {
				t.Errorf("Explain's decision differs from Decide's (-decide +explain):\n%s", diff)
			}
			// The first non-passing layer is the decision's.
			for _, lr := range trace {
				if lr.Verdict == "deny" || lr.Verdict == "require_approval" {
					if lr.Code != d.Code || lr.Reason != d.Reason {
						t.Errorf("first refusing layer %s (%s) is not the decision's %s (%s)", lr.Layer, lr.Code, d.Layer, d.Code)
					}
					break
				}
			}
		})
	}
}

func TestResolveSuspendedEvents(t *testing.T) {
	snap := snapshotOf(t, controlFlowBundle, nil)
	res := snap.Resolve(authz.Context{AgentID: "runner", DeploymentMode: "development", InstanceID: "acme", Environment: "staging"})
	var got []string
	for _, rm := range res.SuspendedEvents() {
		got = append(got, rm.ToolID+" "+string(rm.Code))
	}
	slices.Sort(got)
	want := []string{"tool:ask-user suspended_instance", "tool:task-complete suspended_runtime"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("suspended events (-want +got):\n%s", diff)
	}
}
