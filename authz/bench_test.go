package authz_test

import (
	"testing"

	"github.com/toolgate/toolgate"
	"github.com/toolgate/toolgate/authz"
	"github.com/toolgate/toolgate/policy"
)

// benchBundle is the decision the issue measures: the tool is in the agent's
// active set, the principal holds the invoke grant, and (in the condition
// variant) one amount condition.
const benchBundle = `
- {kind: Tool, tool_id: tool:payments-refund, side_effect_class: write}
- {kind: Tool, tool_id: tool:crm-search, side_effect_class: read}
- {kind: Tool, tool_id: tool:shell-exec, side_effect_class: irreversible}
- kind: Agent
  agent_id: support
  version: 1.0.0
  runtime_engine: langgraph
  tool_permissions:
    - {tool_id: tool:payments-refund, side_effect_class: write, approval_tier: auto}
    - {tool_id: tool:crm-search, side_effect_class: read, approval_tier: auto}
- kind: RuntimePolicy
  agent_id: support
  deployment_mode: production
  tool_authorization_policy: {active_tool_set: all}
- kind: Principal
  principal_id: user:alice
  grants:
    - {resource: tool, action: invoke, scope: {tool: crm_search}}
    - resource: tool
      action: invoke
      scope: {tool: payments_refund}
      when: 'args.amount <= 100'
`

func benchSnapshot(b *testing.B) *authz.Snapshot {
	bundle := &policy.Bundle{}
	bundle.AddYAML("bench.yaml", []byte(benchBundle))
	snap, _, err := authz.Compile(bundle, nil)
	if err != nil {
		b.Fatal(err)
	}
	return snap
}

func BenchmarkDecide(b *testing.B) {
	snap := benchSnapshot(b)
	cases := []struct {
		name string
		call toolgate.Call
		want toolgate.Verdict
	}{
		{"allow", toolgate.Call{AgentID: "support", Principal: "user:alice", Tool: "crm_search", Args: map[string]any{"q": "open tickets"}}, toolgate.Allow},
		{"allow_cel_condition", toolgate.Call{AgentID: "support", Principal: "user:alice", Tool: "payments_refund", Args: map[string]any{"amount": 50.0}}, toolgate.Allow},
		{"deny_not_in_ceiling", toolgate.Call{AgentID: "support", Principal: "user:alice", Tool: "shell_exec", Args: map[string]any{}}, toolgate.Deny},
		{"deny_cel_condition", toolgate.Call{AgentID: "support", Principal: "user:alice", Tool: "payments_refund", Args: map[string]any{"amount": 500.0}}, toolgate.Deny},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			call := c.call
			b.ReportAllocs()
			for b.Loop() {
				if d := snap.Decide(&call); d.Verdict != c.want {
					b.Fatalf("got %s: %s", d.Verdict, d.Reason)
				}
			}
		})
	}
}

func BenchmarkResolve(b *testing.B) {
	snap := benchSnapshot(b)
	b.ReportAllocs()
	for b.Loop() {
		r := snap.Resolve(authz.Context{AgentID: "support", Principal: "user:alice"})
		if len(r.Disclosed) != 2 {
			b.Fatal(r.Disclosed)
		}
	}
}
