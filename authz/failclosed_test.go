package authz_test

import (
	"strings"
	"testing"

	"github.com/toolgate/toolgate"
)

// failClosedBundle has a rule of every kind whose evaluation fails for
// calls without the argument it reads, and one that exceeds the CEL cost
// limit for a long list.
const failClosedBundle = `
- {kind: Tool, tool_id: tool:t-grant, side_effect_class: read}
- {kind: Tool, tool_id: tool:t-res, side_effect_class: read}
- {kind: Tool, tool_id: tool:t-cond, side_effect_class: read}
- {kind: Tool, tool_id: tool:t-guard, side_effect_class: write}
- {kind: Tool, tool_id: tool:t-esc, side_effect_class: write}
- {kind: Tool, tool_id: tool:t-cost, side_effect_class: read}
- kind: Agent
  agent_id: a
  version: 1.0.0
  tool_permissions:
    - {tool_id: tool:t-grant, side_effect_class: read, approval_tier: auto}
    - {tool_id: tool:t-res, side_effect_class: read, approval_tier: auto}
    - {tool_id: tool:t-cond, side_effect_class: read, approval_tier: auto}
    - {tool_id: tool:t-guard, side_effect_class: write, approval_tier: policy}
    - {tool_id: tool:t-esc, side_effect_class: write, approval_tier: auto}
    - {tool_id: tool:t-cost, side_effect_class: read, approval_tier: auto}
- {kind: RuntimePolicy, agent_id: a, deployment_mode: production, tool_authorization_policy: {active_tool_set: all}}
- kind: Principal
  principal_id: user:p
  grants:
    - {resource: tool, action: invoke, scope: {tool: tool:t-grant}, when: 'args.n < 5'}
    - {resource: tool, action: invoke, scope: {tool: tool:t-res}}
    - {resource: tool, action: invoke, scope: {tool: tool:t-cond}}
    - {resource: tool, action: invoke, scope: {tool: tool:t-guard}}
    - {resource: tool, action: invoke, scope: {tool: tool:t-esc}}
    - {resource: tool, action: invoke, scope: {tool: tool:t-cost}}
    - {resource: table, action: read, scope: {name: db}, when: 'args.n < 5'}
- kind: ToolPolicy
  name: rules
  conditions:
    - {tools: [tool:t-cond], when: 'args.n < 5', reason: small n}
    - {tools: [tool:t-cost], when: 'args.xs.all(a, args.xs.all(b, args.xs.all(c, a + b + c >= 0)))', reason: a costly rule}
  escalation_rules:
    - {tools: [tool:t-esc], when: 'args.n > 100'}
  policy_guard:
    - {tools: [tool:t-guard], when: 'args.n < 5', effect: allow}
    - {tools: [tool:t-guard], effect: escalate}
`

// TestFailClosed: a rule that cannot be evaluated (a missing argument, a
// type mismatch, the CEL cost limit) denies in every kind of rule — grant
// conditions, resource grant conditions, tool policy conditions, Policy
// Guard rules, escalation rules — and never becomes an approval or an
// allow; a missing principal, agent, runtime policy or instance denies.
func TestFailClosed(t *testing.T) {
	snap := snapshotOf(t, failClosedBundle, nil)
	call := func(tool string, a map[string]any, res ...toolgate.Resource) toolgate.Call {
		return toolgate.Call{AgentID: "a", Principal: "user:p", Tool: tool, Args: a, Resources: res}
	}
	long := make([]any, 60)
	for i := range long {
		long[i] = float64(i)
	}
	db := toolgate.Resource{Type: "table", Name: "db.t"}
	runDecideCases(t, snap, []decideCase{
		// The rules hold when their input is there (the baseline).
		{"grant condition holds", call("t_grant", args("n", 1.0)), allow("tool:t-grant"), nil},
		{"guard rule allows", call("t_guard", args("n", 1.0)), allow("tool:t-guard"), nil},
		{"escalation rule does not match", call("t_esc", args("n", 1.0)), allow("tool:t-esc"), nil},
		{"escalation rule matches", call("t_esc", args("n", 1000.0)), approval("tool:t-esc"), nil},
		{"cheap list passes the costly rule", call("t_cost", args("xs", []any{1.0, 2.0})), allow("tool:t-cost"), nil},
		// Missing or mistyped input denies, whatever kind of rule reads it.
		{"grant condition: missing argument", call("t_grant", args()), deny(toolgate.CodeConditionFailed, toolgate.LayerCondition, "tool:t-grant"), []string{"evaluation error denies"}},
		{"grant condition: wrong type", call("t_grant", args("n", "one")), deny(toolgate.CodeConditionFailed, toolgate.LayerCondition, "tool:t-grant"), nil},
		{"resource grant condition: missing argument", call("t_res", args(), db), deny(toolgate.CodeConditionFailed, toolgate.LayerCondition, "tool:t-res"), nil},
		{"tool policy condition: missing argument", call("t_cond", args()), deny(toolgate.CodeConditionFailed, toolgate.LayerCondition, "tool:t-cond"), nil},
		{"tool policy condition: null argument", call("t_cond", args("n", nil)), deny(toolgate.CodeConditionFailed, toolgate.LayerCondition, "tool:t-cond"), nil},
		{"Policy Guard rule: missing argument", call("t_guard", args()), deny(toolgate.CodeConditionFailed, toolgate.LayerApproval, "tool:t-guard"), []string{"could not be evaluated"}},
		{"Policy Guard rule: wrong type", call("t_guard", args("n", []any{})), deny(toolgate.CodeConditionFailed, toolgate.LayerApproval, "tool:t-guard"), nil},
		{"escalation rule: missing argument", call("t_esc", args()), deny(toolgate.CodeConditionFailed, toolgate.LayerApproval, "tool:t-esc"), []string{"could not be evaluated"}},
		{"escalation rule: wrong type", call("t_esc", args("n", true)), deny(toolgate.CodeConditionFailed, toolgate.LayerApproval, "tool:t-esc"), nil},
		{"cost limit", call("t_cost", args("xs", long)), deny(toolgate.CodeConditionFailed, toolgate.LayerCondition, "tool:t-cost"), nil},
		// Missing identity denies.
		{"no principal", toolgate.Call{AgentID: "a", Tool: "t_res", Args: args()}, deny(toolgate.CodeRBACToolInvoke, toolgate.LayerGrant, "tool:t-res"), nil},
		{"undeclared principal", toolgate.Call{AgentID: "a", Principal: "user:nobody", Tool: "t_res", Args: args()}, deny(toolgate.CodeRBACToolInvoke, toolgate.LayerGrant, "tool:t-res"), nil},
		{"no agent", toolgate.Call{Principal: "user:p", Tool: "t_res", Args: args()}, deny(toolgate.CodeUnknownAgent, toolgate.LayerComposition, "tool:t-res"), nil},
		{"no runtime policy for the mode", toolgate.Call{AgentID: "a", DeploymentMode: "staging", Principal: "user:p", Tool: "t_res", Args: args()}, deny(toolgate.CodeNoRuntimePolicy, toolgate.LayerRuntime, "tool:t-res"), nil},
		{"undeclared instance", toolgate.Call{AgentID: "a", InstanceID: "nobody", Principal: "user:p", Tool: "t_res", Args: args()}, deny(toolgate.CodeUnknownInstance, toolgate.LayerInstance, "tool:t-res"), nil},
		{"arguments that did not parse", toolgate.Call{AgentID: "a", Principal: "user:p", Tool: "t_res", ArgsErr: toolgate.ErrInvalidArgs}, deny(toolgate.CodeMalformedCall, toolgate.LayerComposition, "tool:t-res"), nil},
	})
	// An approval never turns an unevaluable rule into an allow.
	for _, tool := range []string{"t_guard", "t_esc"} {
		c := call(tool, args())
		c.Approved = true
		if d := snap.Decide(&c); d.Verdict != toolgate.Deny || !strings.Contains(d.Reason, "could not be evaluated") {
			t.Errorf("%s approved, rule unevaluable: %+v; want deny", tool, d)
		}
	}
}

// escalationBehindBundle has escalation rules whose evaluation fails for
// calls that need approval for another reason already: a hitl tool, an MCP
// write tool, a policy with requires_human_approval, a second policy after
// one that escalates.
const escalationBehindBundle = `
- {kind: Upstream, name: up, transport: stdio, command: up-server}
- {kind: Tool, tool_id: tool:t-hitl, side_effect_class: read}
- {kind: Tool, tool_id: tool:up-write, side_effect_class: write, source: {mcp_server: up}}
- {kind: Tool, tool_id: tool:t-human, side_effect_class: read}
- {kind: Tool, tool_id: tool:t-two, side_effect_class: read}
- kind: Agent
  agent_id: a
  version: 1.0.0
  tool_permissions:
    - {tool_id: tool:t-hitl, side_effect_class: read, approval_tier: hitl}
    - {tool_id: tool:up-write, side_effect_class: write}
    - {tool_id: tool:t-human, side_effect_class: read}
    - {tool_id: tool:t-two, side_effect_class: read}
- {kind: RuntimePolicy, agent_id: a, deployment_mode: production, tool_authorization_policy: {active_tool_set: all}}
- kind: Principal
  principal_id: user:p
  grants: [{resource: tool, action: invoke, scope: all}]
- kind: ToolPolicy
  name: first
  escalation_rules:
    - {tools: [tool:t-two]}
- kind: ToolPolicy
  name: rules
  escalation_rules:
    - {tools: [tool:t-hitl, tool:up-write, tool:t-two], when: 'args.n > 100'}
- kind: ToolPolicy
  name: human
  requires_human_approval: true
  applies_to: {agents: [a]}
  escalation_rules:
    - {tools: [tool:t-human], when: 'args.n > 100'}
`

// TestFailClosedEscalationBehindOtherApproval: an escalation rule that
// cannot be evaluated denies even when the call needs approval anyway (its
// tier, the MCP write rule, requires_human_approval, an earlier rule), so
// raising a tool's tier never turns such a denial into an approval prompt.
func TestFailClosedEscalationBehindOtherApproval(t *testing.T) {
	snap := snapshotOf(t, escalationBehindBundle, nil)
	call := func(tool string, a map[string]any) toolgate.Call {
		return toolgate.Call{AgentID: "a", Principal: "user:p", Tool: tool, Args: a}
	}
	var cases []decideCase
	for _, tool := range []string{"t_hitl", "up_write", "t_human", "t_two"} {
		id := "tool:" + strings.ReplaceAll(tool, "_", "-")
		cases = append(cases,
			decideCase{tool + " evaluable", call(tool, args("n", 1.0)), approval(id), nil},
			decideCase{tool + " unevaluable", call(tool, args()), deny(toolgate.CodeConditionFailed, toolgate.LayerApproval, id), []string{"could not be evaluated"}})
	}
	runDecideCases(t, snap, cases)
}
