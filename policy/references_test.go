package policy_test

import (
	"testing"

	"github.com/toolgate/toolgate/policy"
)

// refBase is a valid bundle the reference cases build on: two agents with
// different ceilings, a Policy Guard tool, an MCP tool, an instance with a
// staging override, a principal.
const refBase = `
- {kind: Tool, tool_id: tool:fs-read, side_effect_class: read}
- {kind: Tool, tool_id: tool:fs-write, side_effect_class: write}
- {kind: Tool, tool_id: tool:fs-delete-file, side_effect_class: irreversible}
- {kind: Tool, tool_id: tool:pay-refund, side_effect_class: irreversible, source: {mcp_server: payments}}
- kind: Agent
  agent_id: worker
  tool_permissions:
    - {tool_id: tool:fs-read, side_effect_class: read}
    - {tool_id: tool:fs-delete-file, side_effect_class: irreversible}
    - {tool_id: tool:pay-refund, side_effect_class: irreversible, approval_tier: policy}
- kind: Agent
  agent_id: reader
  tool_permissions:
    - {tool_id: tool:fs-read, side_effect_class: read}
    - {tool_id: tool:fs-write, side_effect_class: write}
- {kind: RuntimePolicy, agent_id: worker, deployment_mode: production, tool_authorization_policy: {active_tool_set: all}}
- {kind: RuntimePolicy, agent_id: reader, deployment_mode: production, tool_authorization_policy: {active_tool_set: all}}
- {kind: RuntimePolicy, agent_id: reader, deployment_mode: development, tool_authorization_policy: {active_tool_set: all}}
- kind: Instance
  instance_id: acme
  environment_overrides:
    staging: {tool_suspensions: [tool:fs-write]}
- kind: Principal
  principal_id: user:ann
  grants:
    - {resource: tool, action: invoke, scope: all}
`

// upstreamFS declares an upstream whose tools the ceiling names unchecked.
const upstreamFS = `
- {kind: Upstream, name: gh, transport: streamable-http, url: "http://127.0.0.1:1/mcp"}
- kind: Agent
  agent_id: triage
  tool_permissions:
    - {tool_id: tool:gh-create-issue, side_effect_class: write}   # want warning "is unchecked"
- {kind: RuntimePolicy, agent_id: triage, deployment_mode: production, tool_authorization_policy: {active_tool_set: all}}
`

// referenceCases pin finding 6 of issue 7: a rule that restricts must be
// able to match something the bundle declares; one that cannot is an error
// naming the closest known name. A reference that only permits, or whose
// name is open (an upstream may still announce the tool; a caller may
// bring the environment), is a warning. Every case with markers failed
// before (it was accepted without a diagnostic, or with a warning only);
// the clean cases show that what does match is not reported.
var referenceCases = []validateCase{
	{name: "the base alone", clean: true, files: one("base.yaml", refBase)},

	// ---- ToolPolicy.applies_to ----
	{name: "applies_to agent typo", files: one("p.yaml", refBase+`
- {kind: ToolPolicy, name: p, applies_to: {agents: [wroker]}, denied: [tool:fs-delete-file]}   # want error "applies_to agent wroker is not a declared Agent, so the policy never applies to it (did you mean worker?)"
`)},
	{name: "applies_to instance typo", files: one("p.yaml", refBase+`
- {kind: ToolPolicy, name: p, applies_to: {instances: [acmee]}, denied: [tool:fs-delete-file]}   # want error "applies_to instance acmee is not a declared Instance (calls for an undeclared instance are denied), so the policy never applies (did you mean acme?)"
`)},
	{name: "applies_to environment typo", files: one("p.yaml", refBase+`
- {kind: ToolPolicy, name: p, applies_to: {environments: [stagign]}, denied: [tool:fs-delete-file]}   # want warning "applies_to environment stagign is named by no Instance override, Credential, JWT issuer or Settings.anonymous; only a caller naming it itself (in process, or the CLI's --env) brings it, and if it is a typo the policy does not apply where meant (did you mean staging?)"
`)},
	{name: "applies_to environment a credential binds", clean: true, files: one("p.yaml", refBase+`
- {kind: Credential, name: ci, api_key_sha256: 1111111111111111111111111111111111111111111111111111111111111111, principal: user:ann, agent_id: reader, environment: ci}
- {kind: ToolPolicy, name: p, applies_to: {environments: [ci, staging]}, denied: [tool:fs-write]}
`)},
	{name: "applies_to environment only a JWT claim may bring", files: one("p.yaml", refBase+`
- kind: Settings
  jwt_issuers:
    - {issuer: "https://idp.example/", audience: [tg], jwks_url: "https://idp.example/jwks", agent_id: reader, environment: {claim: env}}
- {kind: ToolPolicy, name: p, applies_to: {environments: [qa]}, denied: [tool:fs-write]}   # want warning "only a JWT environment claim or a caller naming it itself brings it"
`)},
	{name: "applies_to deployment mode typo", files: one("p.yaml", refBase+`
- {kind: ToolPolicy, name: p, applies_to: {deployment_modes: [prodution]}, denied: [tool:fs-delete-file]}   # want error "applies_to deployment_mode prodution has no RuntimePolicy for the agents the policy applies to (calls in it are denied at the runtime layer), so the policy never applies (did you mean production?)"
`)},
	{name: "applies_to deployment mode of another agent", files: one("p.yaml", refBase+`
- {kind: ToolPolicy, name: p, applies_to: {agents: [worker], deployment_modes: [development]}, denied: [tool:fs-delete-file]}   # want error "applies_to deployment_mode development has no RuntimePolicy for the agents the policy applies to"
`)},

	// ---- ToolPolicy tool rules, against the ceilings they act on ----
	{name: "denied id typo", files: one("p.yaml", refBase+`
- {kind: ToolPolicy, name: p, denied: [tool:fs-delete-fiel]}   # want error "denied tool:fs-delete-fiel matches no tool in any agent's ceiling, so the rule never applies (did you mean tool:fs-delete-file?)"
`)},
	{name: "denied glob typo", files: one("p.yaml", refBase+`
- {kind: ToolPolicy, name: p, denied: ["tool:fs-delte-*"]}   # want error "denied tool:fs-delte-* matches no tool in any agent's ceiling, so the rule never applies (did you mean tool:fs-delete-file?)"
`)},
	{name: "denied tool outside the ceiling of the agents it applies to", files: one("p.yaml", refBase+`
- {kind: ToolPolicy, name: p, applies_to: {agents: [reader]}, denied: [tool:fs-delete-file]}   # want error "denied tool:fs-delete-file matches no tool in the ceiling of agent reader"
`)},
	{name: "denied glob that matches", clean: true, files: one("p.yaml", refBase+`
- {kind: ToolPolicy, name: p, applies_to: {agents: [worker, reader]}, denied: ["tool:*-delete-*", "tool:fs-w?ite"]}
`)},
	{name: "escalation rule typo", files: one("p.yaml", refBase+`
- kind: ToolPolicy
  name: p
  escalation_rules:
    - tool:fs-wirte   # want error "escalation_rules[0] tool:fs-wirte matches no tool in any agent's ceiling, so the rule never applies (did you mean tool:fs-write?)"
`)},
	{name: "condition over a tool no agent has", files: one("p.yaml", refBase+`
- kind: ToolPolicy
  name: p
  conditions:
    - {tools: [tool:fs-search], when: 'has(args.path)'}   # want error "conditions[0] tool:fs-search matches no tool in any agent's ceiling, so the rule never applies"
`)},
	{name: "policy guard deny on a tool the guard never judges", files: one("p.yaml", refBase+`
- kind: ToolPolicy
  name: p
  policy_guard:
    - {tools: [tool:fs-delete-file], effect: deny}   # want error "the Policy Guard judges only tools whose ceiling entry has approval_tier: policy"
`)},
	{name: "policy guard escalate typo", files: one("p.yaml", refBase+`
- kind: ToolPolicy
  name: p
  policy_guard:
    - {tools: [tool:pay-refnd], effect: escalate}   # want error "policy_guard[0] tool:pay-refnd matches no tool in the approval_tier: policy entries of any agent's ceiling, so the rule never applies (did you mean tool:pay-refund?)"
`)},
	{name: "policy guard allow typo only asks more", files: one("p.yaml", refBase+`
- kind: ToolPolicy
  name: p
  policy_guard:
    - {tools: [tool:pay-refnd], when: 'args.amount < 10', effect: allow}   # want warning "so it permits nothing (did you mean tool:pay-refund?)"
`)},
	{name: "allowed typo only narrows", files: one("p.yaml", refBase+`
- {kind: ToolPolicy, name: p, allowed: [tool:fs-read, tool:fs-raed]}   # want warning "allowed tool:fs-raed matches no tool in any agent's ceiling, so it permits nothing (did you mean tool:fs-read?)"
`)},
	{name: "denied glob over an upstream tool the ceiling names", files: one("p.yaml", refBase+upstreamFS+`
- {kind: ToolPolicy, name: p, applies_to: {agents: [triage]}, denied: ["tool:gh-create-*"]}
`)},
	{name: "denied glob over an upstream tool no ceiling names", files: one("p.yaml", refBase+upstreamFS+`
- {kind: ToolPolicy, name: p, applies_to: {agents: [triage]}, denied: ["tool:gh-delete-*"]}   # want error "denied tool:gh-delete-* matches no tool in the ceiling of agent triage, so the rule never applies (did you mean tool:gh-create-issue?)"
`)},

	// ---- RuntimePolicy ----
	{name: "runtime suspension typo", files: one("r.yaml", refBase+`
- kind: RuntimePolicy   # want error "tool_suspensions entry tool:fs-delete-fle matches no tool (a typo?): the tool you meant is NOT suspended (did you mean tool:fs-delete-file?)"
  agent_id: worker
  deployment_mode: development
  tool_authorization_policy: {active_tool_set: restricted, tool_suspensions: [tool:fs-delete-fle]}
`)},
	{name: "runtime suspension of a tool outside the ceiling", files: one("r.yaml", refBase+`
- kind: RuntimePolicy   # want error "tool_suspensions entry tool:fs-write is outside the agent's ceiling, so it suspends nothing"
  agent_id: worker
  deployment_mode: development
  tool_authorization_policy: {active_tool_set: restricted, tool_suspensions: [tool:fs-write]}
`)},
	{name: "denied_servers typo", files: one("r.yaml", refBase+`
- kind: RuntimePolicy   # want error "denied_servers entry paymnets is no Upstream and no Tool's source.mcp_server, so it denies nothing (did you mean payments?)"
  agent_id: worker
  deployment_mode: development
  tool_authorization_policy: {active_tool_set: all, mcp_tool_policy: {denied_servers: [paymnets]}}
`)},
	{name: "allowed_servers typo", files: one("r.yaml", refBase+`
- kind: RuntimePolicy   # want warning "allowed_servers entry paymnets is no Upstream and no Tool's source.mcp_server, so it permits nothing (did you mean payments?)"
  agent_id: worker
  deployment_mode: development
  tool_authorization_policy: {active_tool_set: all, mcp_tool_policy: {allowed_servers: [paymnets]}}
`)},
	{name: "trust tier for an undeclared partner", files: one("r.yaml", refBase+`
- kind: RuntimePolicy   # want error "trust_tiers sets untrusted for raeder, which is not a declared Agent, so it restricts nothing (did you mean reader?)"
  agent_id: worker
  deployment_mode: development
  tool_authorization_policy: {active_tool_set: all, a2a_tool_policy: {trust_tiers: {raeder: untrusted}}}
`)},
	{name: "tool_grants typo names the closest ceiling tool", files: one("r.yaml", refBase+`
- kind: RuntimePolicy   # want warning "tool_grants entry tool:fs-raed matches no tool (a typo?); it can never add a tool (did you mean tool:fs-read?)"
  agent_id: worker
  deployment_mode: development
  tool_authorization_policy: {active_tool_set: declared, tool_grants: [tool:fs-raed]}
`)},

	// ---- Instance overrides ----
	{name: "instance suspension typo", files: one("i.yaml", refBase+`
- kind: Instance   # want error "tool_suspensions entry tool:fs-wrte matches no tool in any agent's ceiling (a typo?): the tool you meant is NOT suspended (did you mean tool:fs-write?)"
  instance_id: globex
  environment_overrides: {production: {tool_suspensions: [tool:fs-wrte]}}
`)},
	{name: "instance suspension of an upstream tool no ceiling names", files: one("i.yaml", refBase+upstreamFS+`
- kind: Instance   # want error "tool_suspensions entry tool:gh-delete-repo matches no tool in any agent's ceiling"
  instance_id: globex
  environment_overrides: {production: {tool_suspensions: [tool:gh-delete-repo]}}
`)},

	// ---- grant scopes ----
	{name: "grant scope tool typo", files: one("g.yaml", refBase+`
- kind: Role
  role_id: auditor
  grants:
    - {resource: approval, action: decide, scope: {tool: pay_refnd}}   # want error "scope tool \"pay_refnd\" (tool:pay-refnd) matches no tool: it is neither declared nor in any ceiling (did you mean tool:pay-refund?)"
`)},
	{name: "grant scope tool an upstream may announce", files: one("g.yaml", refBase+upstreamFS+`
- kind: Role
  role_id: auditor
  grants:
    - {resource: tool, action: invoke, scope: {tool: gh_close_issue}}   # want warning "upstream gh may announce it (did you mean tool:gh-create-issue?)"
`)},
	{name: "grant scope name with an unterminated quote", files: one("g.yaml", refBase+`
- {kind: Database, name: shop, driver: sqlite, path: shop.db}   # want warning "nothing can reach it"
- kind: Role
  role_id: auditor
  grants:
    - {resource: sql_table, action: read, scope: {name: 'shop."orders'}}   # want error "is not a well-formed resource name"
`)},
	{name: "grant scope name quoted where no quote is needed", files: one("g.yaml", refBase+`
- {kind: Database, name: shop, driver: sqlite, path: shop.db}   # want warning "nothing can reach it"
- kind: Role
  role_id: auditor
  grants:
    - {resource: sql_table, action: read, scope: {name: 'shop."orders"'}}   # want error "is written \"shop.orders\" in resource names"
`)},
	{name: "grant scope name for an undeclared database", files: one("g.yaml", refBase+`
- {kind: Database, name: shop, driver: sqlite, path: shop.db}   # want warning "nothing can reach it"
- kind: Role
  role_id: auditor
  grants:
    - {resource: sql_table, action: read, scope: {name: sohp.orders}}   # want warning "sohp is not a declared Database, so the grant permits nothing (did you mean shop?)"
`)},
	{name: "grant scope name for a table with a dot", clean: true, files: one("g.yaml", refBase+`
- kind: Role
  role_id: auditor
  grants:
    - {resource: bifrost_query, action: read, scope: {name: 'vala."orders.secret"'}}
`)},

	// ---- Settings ----
	{name: "control_flow_tools typo", files: one("s.yaml", refBase+`
- {kind: Settings, control_flow_tools: [tool:fs-raed]}   # want error "control_flow_tools entry tool:fs-raed is not a declared Tool (did you mean tool:fs-read?)"
`)},
	{name: "allowed origin with a path", files: one("s.yaml", refBase+`
- {kind: Settings, allowed_origins: ["https://app.example.com/"]}   # want error "is not an origin"
`)},
	{name: "allowed origin null", files: one("s.yaml", refBase+`
- {kind: Settings, allowed_origins: ["null"]}   # want error "would admit any page"
`)},

	// ---- Upstreams ----
	{name: "nested tool prefixes", files: one("u.yaml", `
- {kind: Upstream, name: fs, transport: streamable-http, url: "http://127.0.0.1:1/mcp"}
- {kind: Upstream, name: fsx, transport: streamable-http, url: "http://127.0.0.1:2/mcp", tool_prefix: fs_x_}   # want error "tool_prefix \"fs_x_\" and upstream fs's \"fs_\" start one another"
`)},
	{name: "an empty tool prefix beside another", files: one("u.yaml", `
- {kind: Upstream, name: gh, transport: streamable-http, url: "http://127.0.0.1:1/mcp"}
- {kind: Upstream, name: raw, transport: streamable-http, url: "http://127.0.0.1:2/mcp", tool_prefix: ""}   # want error "Upstream raw: its tool_prefix is empty beside upstream gh"
`)},
	{name: "nested tool prefixes declared the other way round", files: one("u.yaml", `
- {kind: Upstream, name: fsx, transport: streamable-http, url: "http://127.0.0.1:2/mcp", tool_prefix: fs_x_}
- {kind: Upstream, name: fs, transport: streamable-http, url: "http://127.0.0.1:1/mcp"}   # want error "tool_prefix \"fs_\" and upstream fsx's \"fs_x_\" start one another"
`)},
	{name: "prefixes apart", clean: true, files: one("u.yaml", `
- {kind: Upstream, name: fs, transport: streamable-http, url: "http://127.0.0.1:1/mcp"}
- {kind: Upstream, name: fsx, transport: streamable-http, url: "http://127.0.0.1:2/mcp", tool_prefix: fsx_}
`)},
	{name: "a built-in tool under an upstream's provider", files: one("u.yaml", `
- {kind: Upstream, name: fs, transport: streamable-http, url: "http://127.0.0.1:1/mcp"}
- {kind: Tool, tool_id: tool:fs-read, side_effect_class: read, source: {builtin: fs.read}}   # want warning "Tool tool:fs-read is the built-in tool fs.read, but its provider part fs is also an Upstream's name: a tool upstream fs announces as \"read\" would have the same id"
`)},
	// Class "identifiers must be injective": a tool_prefix that makes an
	// upstream's tool names spell another tool's id (review of issue 7,
	// N10).
	{name: "a tool prefix that makes a built-in's model-facing name", files: one("u.yaml", `
- {kind: Upstream, name: docs, transport: streamable-http, url: "http://127.0.0.1:1/mcp", tool_prefix: fs_}   # want warning "Upstream docs: with tool_prefix \"fs_\", a tool it announces as \"search\" would reach the model as fs_search, a name of Tool tool:fs-search"
- {kind: Tool, name: fs.search, side_effect_class: read, source: {builtin: fs.search}}
`)},
	{name: "a dotted tool prefix that spells a built-in's id", files: one("u.yaml", `
- {kind: Upstream, name: docs, transport: streamable-http, url: "http://127.0.0.1:1/mcp", tool_prefix: fs.}   # want warning "a tool it announces as \"read\" would reach the model as fs.read, a name of Tool tool:fs-read"
- {kind: Tool, tool_id: tool:fs-read, side_effect_class: read, source: {builtin: fs.read}}
`)},
	{name: "a tool prefix cut inside a built-in's name", files: one("u.yaml", `
- {kind: Upstream, name: docs, transport: streamable-http, url: "http://127.0.0.1:1/mcp", tool_prefix: f}   # want warning "a tool it announces as \"s_search\" would reach the model as fs_search"
- {kind: Tool, name: fs.search, side_effect_class: read, source: {builtin: fs.search}}
`)},
	{name: "a tool prefix that makes an HTTP tool's name", files: one("u.yaml", `
- {kind: Upstream, name: docs, transport: streamable-http, url: "http://127.0.0.1:1/mcp", tool_prefix: crm_}   # want warning "a tool it announces as \"create_lead\" would reach the model as crm_create_lead, a name of Tool tool:crm-create-lead"
- {kind: Tool, tool_id: tool:crm-create-lead, side_effect_class: write, source: {http: "https://crm.example.test/leads"}}
`)},
	{name: "a tool prefix ending where a separator would be needed", clean: true, files: one("u.yaml", `
- {kind: Upstream, name: docs, transport: streamable-http, url: "http://127.0.0.1:1/mcp", tool_prefix: fs}
- {kind: Tool, name: fs.search, side_effect_class: read, source: {builtin: fs.search}}
`)},
	{name: "a tool prefix that spells another upstream's provider part", files: one("u.yaml", `
- {kind: Upstream, name: gh, transport: streamable-http, url: "http://127.0.0.1:1/mcp", tool_prefix: github_}
- {kind: Upstream, name: hub, transport: streamable-http, url: "http://127.0.0.1:2/mcp", tool_prefix: gh_}   # want error "Upstream hub: tool_prefix \"gh_\" spells the provider part of upstream gh"
`)},
	{name: "a short tool prefix that starts another upstream's provider part", files: one("u.yaml", `
- {kind: Upstream, name: gh, transport: streamable-http, url: "http://127.0.0.1:1/mcp", tool_prefix: octo_}
- {kind: Upstream, name: hub, transport: streamable-http, url: "http://127.0.0.1:2/mcp", tool_prefix: g}   # want error "Upstream hub: tool_prefix \"g\" spells the provider part of upstream gh"
`)},
	{name: "a tool prefix that only resembles another upstream's name", clean: true, files: one("u.yaml", `
- {kind: Upstream, name: gh, transport: streamable-http, url: "http://127.0.0.1:1/mcp", tool_prefix: github_}
- {kind: Upstream, name: hub, transport: streamable-http, url: "http://127.0.0.1:2/mcp", tool_prefix: ghx_}
`)},
	{name: "a tool prefix that is another upstream's name without a separator", clean: true, files: one("u.yaml", `
- {kind: Upstream, name: gh, transport: streamable-http, url: "http://127.0.0.1:1/mcp", tool_prefix: octo_}
- {kind: Upstream, name: hub, transport: streamable-http, url: "http://127.0.0.1:2/mcp", tool_prefix: gh}
`)},
	{name: "a Tool refining an upstream's tool", clean: true, files: one("u.yaml", `
- {kind: Upstream, name: fs, transport: streamable-http, url: "http://127.0.0.1:1/mcp"}
- {kind: Tool, tool_id: tool:fs-write-file, side_effect_class: write, source: {mcp_server: fs}}
- {kind: Tool, tool_id: tool:fs-move-file, side_effect_class: write}
`)},
	{name: "empty env value", files: one("u.yaml", `
- kind: Upstream   # want error "Upstream fs: env TOKEN is empty"
  name: fs
  transport: stdio
  command: node
  env: {TOKEN: ""}
`)},
	{name: "empty header value", files: one("u.yaml", `
- kind: Upstream   # want error "Upstream gh: headers Authorization is empty"
  name: gh
  transport: streamable-http
  url: "http://127.0.0.1:1/mcp"
  headers: {Authorization: ""}
`)},

	// ---- identities ----
	{name: "credential instance typo", files: one("c.yaml", refBase+`
- {kind: Credential, name: ci, api_key_sha256: 1111111111111111111111111111111111111111111111111111111111111111, principal: user:ann, agent_id: reader, instance_id: acmee}   # want error "instance acmee is not a declared Instance, so every call will be denied at the instance layer (did you mean acme?)"
`)},
	{name: "credential environment typo skips the overrides", files: one("c.yaml", refBase+`
- {kind: Credential, name: ci, api_key_sha256: 1111111111111111111111111111111111111111111111111111111111111111, principal: user:ann, agent_id: reader, instance_id: acme, environment: stagign}   # want warning "environment stagign has no environment_overrides in instance acme, so none of its suspensions apply (did you mean staging?)"
`)},
	{name: "credential agent typo", files: one("c.yaml", refBase+`
- {kind: Credential, name: ci, api_key_sha256: 1111111111111111111111111111111111111111111111111111111111111111, principal: user:ann, agent_id: raeder}   # want error "agent raeder is not declared (did you mean reader?)"
`)},
	{name: "credential deployment mode without a runtime policy", files: one("c.yaml", refBase+`
- {kind: Credential, name: ci, api_key_sha256: 1111111111111111111111111111111111111111111111111111111111111111, principal: user:ann, agent_id: worker, deployment_mode: development}   # want warning "agent worker has no RuntimePolicy for deployment_mode development"
`)},
	{name: "JWT issuer with an undeclared fixed instance", files: one("c.yaml", refBase+`
- kind: Settings
  jwt_issuers:
    - {issuer: "https://idp.example/", audience: [tg], jwks_url: "https://idp.example/jwks", agent_id: reader, instance_id: globex}   # want error "instance_id globex is not a declared Instance"
`)},
}

func TestValidateReferences(t *testing.T) { runValidateCases(t, referenceCases) }

// TestValidateReferencesWithAnnouncedProviders checks that what an
// upstream announces does not make a dead restriction live: the ceiling
// decides.
func TestValidateReferencesWithAnnouncedProviders(t *testing.T) {
	b := &policy.Bundle{}
	b.AddYAML("p.yaml", []byte(refBase+`
- {kind: ToolPolicy, name: p, denied: ["tool:gh-delete-*"]}
`))
	rep := b.Validate(&policy.ValidateOptions{UpstreamProviders: map[string]bool{"gh": true}})
	if rep.OK() {
		t.Fatalf("a deny glob that matches no ceiling tool was accepted: warnings %v", rep.Warnings)
	}
}
