package policy_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/toolgate/toolgate/policy"
)

// accessBase is a valid bundle the resource and prompt cases build on: an
// agent with declared ceilings for upstream docs, one in the default with
// a tool of upstream hr.
const accessBase = `
- {kind: Upstream, name: docs, transport: stdio, command: docs-server}
- {kind: Upstream, name: hr, transport: stdio, command: hr-server}
- {kind: Tool, tool_id: tool:docs-search, side_effect_class: read, source: {mcp_server: docs}}
- {kind: Tool, tool_id: tool:hr-lookup, side_effect_class: read, source: {mcp_server: hr}}
- kind: Agent
  agent_id: reader
  tool_permissions:
    - {tool_id: tool:docs-search, side_effect_class: read}
  resource_permissions:
    - {upstream: docs, uri: "file:///docs/{+path}"}
  prompt_permissions:
    - {upstream: docs, prompt: summarize}
- kind: Agent
  agent_id: plain
  tool_permissions:
    - {tool_id: tool:hr-lookup, side_effect_class: read}
- {kind: RuntimePolicy, agent_id: reader, deployment_mode: production, tool_authorization_policy: {active_tool_set: all}}
- {kind: RuntimePolicy, agent_id: plain, deployment_mode: production, tool_authorization_policy: {active_tool_set: all}}
- {kind: Instance, instance_id: acme}
`

// accessValidateCases: every field that names upstream resources or
// prompts is checked like the existing references (access_validate.go).
var accessValidateCases = []validateCase{
	{name: "the base alone", clean: true, files: one("base.yaml", accessBase)},
	{name: "every shape, matching", clean: true, files: one("ok.yaml", accessBase+`
- kind: Principal
  principal_id: user:ann
  grants:
    - {resource: mcp_resource, action: read, scope: all}
    - {resource: mcp_resource, action: read, scope: {upstream: docs}}
    - {resource: mcp_resource, action: read, scope: {upstream: docs, uri: "file:///docs/{+path}"}, when: "resource.uri != ''"}
    - {resource: prompt, action: get, scope: {upstream: docs, prompt: summarize}, when: "prompt.name == 'summarize'"}
- kind: Instance
  instance_id: globex
  environment_overrides:
    eu:
      resource_suspensions: [{upstream: docs, uri: "file:///docs/hr/{+path}"}, {upstream: hr}]
      prompt_suspensions: [{upstream: docs, prompt: summarize}]
- kind: ToolPolicy
  name: p
  conditions:
    - {resources: [{upstream: docs}], when: "resource.action == 'read'"}
  escalation_rules:
    - {prompts: [{upstream: docs}], when: "has(args.x)"}
  policy_guard:
    - {resources: [{upstream: hr}], effect: deny}
`)},

	// ---- ceiling entries ----
	{name: "an entry of an unknown upstream", files: one("a.yaml", accessBase+`
- kind: Agent
  agent_id: x
  resource_permissions:
    - {upstream: dosc, uri: "file:///a"}   # want error "upstream dosc is no Upstream and no Tool's source.mcp_server, so it matches nothing (did you mean docs?)"
- {kind: RuntimePolicy, agent_id: x, deployment_mode: production, tool_authorization_policy: {active_tool_set: all}}
`)},
	{name: "an entry without upstream or uri", files: one("a.yaml", accessBase+`
- kind: Agent
  agent_id: x
  resource_permissions:
    - {uri: "file:///a"}   # want error "upstream is required"
    - {upstream: docs}   # want error "uri is required"
  prompt_permissions:
    - {upstream: docs}   # want error "prompt is required"
- {kind: RuntimePolicy, agent_id: x, deployment_mode: production, tool_authorization_policy: {active_tool_set: all}}
`)},
	{name: "a uri that can never match", files: one("a.yaml", accessBase+`
- kind: Agent
  agent_id: x
  resource_permissions:
    - {upstream: docs, uri: "file:///docs/{+path"}   # want error "does not parse as an RFC 6570 template"
    - {upstream: docs, uri: "file:///docs/../hr"}   # want error "\"..\" path segment"
    - {upstream: docs, uri: "file:///a%2Fb"}   # want error "%2F"
- {kind: RuntimePolicy, agent_id: x, deployment_mode: production, tool_authorization_policy: {active_tool_set: all}}
`)},
	{name: "duplicate entries and a bad tier", files: one("a.yaml", accessBase+`
- kind: Agent
  agent_id: x
  resource_permissions:
    - {upstream: docs, uri: "file:///a"}
    - {upstream: docs, uri: "file:///a"}   # want error "appears twice in resource_permissions"
  prompt_permissions:
    - {upstream: docs, prompt: p, approval_tier: human}   # want error "approval_tier \"human\" must be auto, policy or hitl"
    - {upstream: docs, prompt: p}   # want error "appears twice in prompt_permissions"
- {kind: RuntimePolicy, agent_id: x, deployment_mode: production, tool_authorization_policy: {active_tool_set: all}}
`)},
	{name: "an unknown field in an entry", files: one("a.yaml", accessBase+`
- kind: Agent
  agent_id: x
  resource_permissions:
    - {upstream: docs, url: "file:///a"}   # want error "unknown field \"url\""
`)},
	{name: "a check-position agent reaches no resource", files: one("a.yaml", accessBase+`
- kind: Agent   # want error "must be tool-less"
  agent_id: judge
  check_position: true
  resource_permissions: [{upstream: docs, uri: "file:///a"}]
`)},

	// ---- grants ----
	{name: "grant scopes that do not fit their resource", files: one("g.yaml", accessBase+`
- kind: Principal
  principal_id: user:ann
  grants:
    - {resource: mcp_resource, action: read, scope: {name: docs}}   # want error "a mcp_resource grant's scope is all, {upstream: U} or {upstream: U, uri: URI}"
    - {resource: prompt, action: get, scope: {tool: docs_search}}   # want error "a prompt grant's scope is all, {upstream: U} or {upstream: U, prompt: NAME}"
    - {resource: sql_table, action: read, scope: {upstream: docs}}   # want error "names an upstream, which only mcp_resource and prompt grants do"
    - {resource: mcp_resource, action: write, scope: {upstream: docs}}   # want error "the mcp_resource action is read"
    - {resource: prompt, action: read, scope: {upstream: docs}}   # want error "the prompt action is get"
    - {resource: mcp_resource, action: read, scope: {upstream: docs, prompt: summarize}}   # want error "names a uri, not a prompt"
    - {resource: prompt, action: get, scope: {upstream: docs, uri: "file:///a"}}   # want error "names a prompt, not a uri"
`)},
	{name: "grant scopes that can never match", files: one("g.yaml", accessBase+`
- kind: Principal
  principal_id: user:ann
  grants:
    - {resource: mcp_resource, action: read, scope: {upstream: dcos}}   # want error "upstream dcos is no Upstream"
    - {resource: mcp_resource, action: read, scope: {upstream: docs, uri: "file:///{a"}}   # want error "the grant matches nothing"
`)},
	{name: "grants no declared ceiling reads", files: one("g.yaml", accessBase+`
- kind: Principal
  principal_id: user:ann
  grants:
    - {resource: mcp_resource, action: read, scope: {upstream: hr}}   # want warning "no agent declares resource_permissions for upstream hr, so the grant permits nothing"
    - {resource: prompt, action: get, scope: {upstream: hr, prompt: review}}   # want warning "no agent declares prompt_permissions for upstream hr"
`)},
	{name: "scope shapes refused while decoding", files: one("g.yaml", accessBase+`
- {kind: Principal, principal_id: a, grants: [{resource: mcp_resource, action: read, scope: {uri: "file:///a"}}]}   # want error "uri and prompt name something of an upstream: give upstream too"
- {kind: Principal, principal_id: b, grants: [{resource: mcp_resource, action: read, scope: {upstream: docs, uri: "file:///a", prompt: p}}]}   # want error "not both"
- {kind: Principal, principal_id: c, grants: [{resource: mcp_resource, action: read, scope: {upstream: docs, name: docs}}]}   # want error "give exactly one of tool, name or upstream"
- {kind: Principal, principal_id: d, grants: [{resource: mcp_resource, action: read, scope: {upstream: docs, path: x}}]}   # want error "unknown field \"path\""
`)},

	// ---- rule selectors and suspensions ----
	{name: "selectors of an unknown upstream", files: one("p.yaml", accessBase+`
- kind: ToolPolicy
  name: p
  conditions:
    - {resources: [{upstream: dosc}], when: "true"}   # want error "upstream dosc is no Upstream"
  escalation_rules:
    - {prompts: [{upstream: hrr}]}   # want error "upstream hrr is no Upstream"
`)},
	{name: "selectors no agent the policy applies to can reach", files: one("p.yaml", accessBase+`
- kind: ToolPolicy
  name: p
  applies_to: {agents: [reader]}
  conditions:
    - {resources: [{upstream: hr}], when: "true"}   # want error "no agent it applies to can reach upstream hr's resources"
  policy_guard:
    - {prompts: [{upstream: hr}], effect: deny}   # want error "no agent it applies to can reach upstream hr's prompts"
    - {prompts: [{upstream: hr}], effect: allow}   # want warning "no agent it applies to can reach upstream hr's prompts"
`)},
	{name: "a selector uri that does not parse", files: one("p.yaml", accessBase+`
- kind: ToolPolicy
  name: p
  escalation_rules:
    - {resources: [{upstream: docs, uri: "file:///{x"}]}   # want error "so it matches nothing"
`)},
	{name: "a rule naming nothing", files: one("p.yaml", accessBase+`
- kind: ToolPolicy
  name: p
  conditions:
    - {when: "true"}   # want error "names no tools, resources or prompts"
`)},
	{name: "an unknown field in an escalation rule's selector", files: one("p.yaml", accessBase+`
- kind: ToolPolicy
  name: p
  escalation_rules:
    - {resources: [{upstream: docs, url: x}]}   # want error "unknown field \"url\""
`)},
	{name: "suspensions that can never match", files: one("i.yaml", accessBase+`
- kind: Instance   # want error "upstream dosc is no Upstream"
  instance_id: globex
  environment_overrides:
    eu:
      resource_suspensions: [{upstream: dosc}]
- kind: Instance   # want error "does not parse as an RFC 6570 template"
  instance_id: initech
  environment_overrides:
    eu:
      prompt_suspensions: [{upstream: docs, prompt: p}]
      resource_suspensions: [{upstream: docs, uri: "file:///{x"}]
`)},
}

func TestValidateAccess(t *testing.T) { runValidateCases(t, accessValidateCases) }

// TestValidateControlFlowToolsHaveNoSource: Settings.control_flow_tools
// may not make a tool that reaches an upstream (or anything) ungated, as
// control_flow: true may not.
func TestValidateControlFlowToolsHaveNoSource(t *testing.T) {
	runValidateCases(t, []validateCase{{name: "an upstream tool as a control-flow tool", files: one("s.yaml", accessBase+`
- {kind: Settings, control_flow_tools: [tool:docs-search]}   # want error "control_flow_tools entry tool:docs-search has a source or a2a_agent"
`)}})
}

// TestAccessCeilingDeclared: a resource or prompt ceiling is declared when
// the bundle writes the field, even empty or null; left out, it is the
// default (nil).
func TestAccessCeilingDeclared(t *testing.T) {
	b := &policy.Bundle{}
	b.AddYAML("a.yaml", []byte(`
- {kind: Agent, agent_id: absent}
- {kind: Agent, agent_id: empty, resource_permissions: [], prompt_permissions: []}
- kind: Agent
  agent_id: nulled
  resource_permissions:
  prompt_permissions: ~
`))
	type declared struct{ Resources, Prompts bool }
	got := map[string]declared{}
	for _, a := range b.Agents {
		got[a.AgentID] = declared{a.ResourcePermissions != nil, a.PromptPermissions != nil}
	}
	want := map[string]declared{"absent": {}, "empty": {true, true}, "nulled": {true, true}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("declared ceilings (-want +got):\n%s", diff)
	}
}
