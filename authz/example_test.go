package authz_test

import (
	"fmt"
	"strings"

	"github.com/toolgate/toolgate"
	"github.com/toolgate/toolgate/authz"
	"github.com/toolgate/toolgate/policy"
)

// exampleBundle is a small bundle: one agent whose ceiling holds a search
// tool and a refund tool, restricted in staging, and one principal who may
// refund at most 100.
const exampleBundle = `
- {kind: Tool, tool_id: tool:web-search, side_effect_class: none}
- {kind: Tool, tool_id: tool:payments-refund, side_effect_class: write}
- kind: Agent
  agent_id: support
  version: 1.0.0
  tool_permissions:
    - {tool_id: tool:web-search, side_effect_class: none, approval_tier: auto}
    - {tool_id: tool:payments-refund, side_effect_class: write, approval_tier: auto}
- kind: RuntimePolicy
  agent_id: support
  deployment_mode: production
  tool_authorization_policy: {active_tool_set: all}
- kind: RuntimePolicy
  agent_id: support
  deployment_mode: staging
  tool_authorization_policy:
    active_tool_set: restricted
    tool_suspensions: [tool:payments-refund]
- kind: Principal
  principal_id: user:alice
  grants:
    - {resource: tool, action: invoke, scope: {tool: web_search}}
    - {resource: tool, action: invoke, scope: {tool: payments_refund}, when: 'args.amount <= 100'}
`

func exampleSnapshot() *authz.Snapshot {
	b := &policy.Bundle{}
	b.AddYAML("example.yaml", []byte(exampleBundle))
	snap, _, err := authz.Compile(b, nil)
	if err != nil {
		panic(err)
	}
	return snap
}

// Decide answers one call; a refusal names its layer and code.
func ExampleSnapshot_Decide() {
	snap := exampleSnapshot()
	for _, c := range []toolgate.Call{
		{AgentID: "support", Principal: "user:alice", Tool: "web_search", Args: map[string]any{"q": "refund policy"}},
		{AgentID: "support", Principal: "user:alice", Tool: "payments_refund", Args: map[string]any{"amount": 40}},
		{AgentID: "support", Principal: "user:alice", Tool: "payments_refund", Args: map[string]any{"amount": 400}},
		{AgentID: "support", Principal: "user:alice", Tool: "payments_refund", DeploymentMode: "staging", Args: map[string]any{"amount": 40}},
		{AgentID: "support", Principal: "user:alice", Tool: "Payments_Refund", Args: map[string]any{"amount": 40}},
	} {
		d := snap.Decide(&c)
		fmt.Printf("%-16s %-7s %s\n", c.Tool, d.Verdict, strings.TrimSpace(string(d.Code)+" "+string(d.Layer)))
	}
	// Output:
	// web_search       allow   ok
	// payments_refund  allow   ok
	// payments_refund  deny    condition_failed condition
	// payments_refund  deny    suspended_runtime runtime
	// Payments_Refund  deny    malformed_call composition
}

// Resolve computes the tool sets of an invocation context: what is active
// after each narrowing layer, and what the model is shown.
func ExampleSnapshot_Resolve() {
	snap := exampleSnapshot()
	for _, mode := range []string{"production", "staging"} {
		r := snap.Resolve(authz.Context{AgentID: "support", DeploymentMode: mode, Principal: "user:alice"})
		fmt.Println(mode, "active:", r.ActiveToolSet, "disclosed:", r.Disclosed)
		for _, rm := range r.Removed {
			fmt.Println("  removed", rm.ToolID, "by the", rm.Layer, "layer:", rm.Code)
		}
	}
	// Output:
	// production active: [tool:web-search tool:payments-refund] disclosed: [tool:web-search tool:payments-refund]
	// staging active: [tool:web-search] disclosed: [tool:web-search]
	//   removed tool:payments-refund by the runtime layer: suspended_runtime
}

// Explain reports every layer's verdict, not only the first refusal.
func ExampleSnapshot_Explain() {
	snap := exampleSnapshot()
	d, layers := snap.Explain(&toolgate.Call{AgentID: "support", DeploymentMode: "staging", Principal: "user:bob",
		Tool: "payments_refund", Args: map[string]any{"amount": 40}})
	for _, l := range layers {
		fmt.Printf("%-12s %s\n", l.Layer, strings.TrimSpace(l.Verdict+" "+string(l.Code)))
	}
	fmt.Println("decision:", d.Verdict, d.Code)
	// Output:
	// composition  pass
	// ceiling      pass
	// runtime      deny suspended_runtime
	// instance     pass
	// policy       pass
	// grant        deny rbac_tool_invoke
	// resource     pass
	// condition    pass
	// approval     pass
	// decision: deny suspended_runtime
}

// Compile refuses an invalid bundle and returns the report naming file and
// line of every error.
func ExampleCompile() {
	b := &policy.Bundle{}
	b.AddYAML("agents.yaml", []byte(`
- kind: Agent
  agent_id: support
  tool_permissions:
    - {tool_id: tool:web-search, side_effect_class: none}
`))
	_, rep, err := authz.Compile(b, nil)
	fmt.Println("compiled:", err == nil)
	for _, d := range rep.Errors {
		fmt.Printf("%s:%d\n", d.File, d.Line)
	}
	// Output:
	// compiled: false
	// agents.yaml:5
}

// accessExampleBundle lets agent support read the docs upstream's guides
// (a template entry) and its changelog (an exact URI, for a human to
// approve), and get one prompt; user:alice holds the grants for them.
const accessExampleBundle = `
- {kind: Upstream, name: docs, transport: stdio, command: docs-server}
- {kind: Tool, tool_id: tool:docs-search, side_effect_class: read, source: {mcp_server: docs}}
- kind: Agent
  agent_id: support
  version: 1.0.0
  tool_permissions:
    - {tool_id: tool:docs-search, side_effect_class: read}
  resource_permissions:
    - {upstream: docs, uri: "file:///guides/{+path}"}
    - {upstream: docs, uri: "file:///CHANGELOG.md", approval_tier: hitl}
  prompt_permissions:
    - {upstream: docs, prompt: summarize}
- {kind: RuntimePolicy, agent_id: support, deployment_mode: production, tool_authorization_policy: {active_tool_set: all}}
- kind: Principal
  principal_id: user:alice
  grants:
    - {resource: tool, action: invoke, scope: all}
    - {resource: mcp_resource, action: read, scope: {upstream: docs}}
    - {resource: prompt, action: get, scope: {upstream: docs, prompt: summarize}}
`

// DecideAccess decides resources/read, resources/subscribe, prompts/get and
// completion/complete like a tool call; Target names the ceiling entry
// that was decided on, and AccessFilter filters lists by the same rule.
func ExampleSnapshot_DecideAccess() {
	b := &policy.Bundle{}
	b.AddYAML("example.yaml", []byte(accessExampleBundle))
	snap, _, err := authz.Compile(b, nil)
	if err != nil {
		panic(err)
	}
	read := func(uri string) *toolgate.Access {
		return &toolgate.Access{Kind: toolgate.AccessResourceRead, AgentID: "support", Principal: "user:alice", Upstream: "docs", URI: uri}
	}
	for _, a := range []*toolgate.Access{
		read("file:///guides/setup/linux.md"),
		read("file:///guides/%2e%2e/secrets.env"),
		read("file:///secrets.env"),
		read("file:///CHANGELOG.md"),
		{Kind: toolgate.AccessPromptGet, AgentID: "support", Principal: "user:alice", Upstream: "docs", Prompt: "summarize", PromptName: "docs_summarize"},
		{Kind: toolgate.AccessPromptGet, AgentID: "support", Principal: "user:bob", Upstream: "docs", Prompt: "summarize", PromptName: "docs_summarize"},
	} {
		d := snap.DecideAccess(a)
		fmt.Println(strings.TrimSpace(fmt.Sprintf("%-36s %-16s %-16s %s", a.URI+a.PromptName, d.Verdict, d.Code, d.Target)))
	}
	f := snap.AccessFilter(authz.Context{AgentID: "support", Principal: "user:alice"})
	fmt.Println(f.Resource("docs", "file:///guides/a.md"), f.Resource("docs", "file:///secrets.env"), f.Template("docs", "file:///guides/{+path}"))
	// Output:
	// file:///guides/setup/linux.md        allow            ok               mcp_resource_template:docs.file:///guides/{+path}
	// file:///guides/%2e%2e/secrets.env    deny             malformed_call
	// file:///secrets.env                  deny             not_in_ceiling
	// file:///CHANGELOG.md                 require_approval approval_required mcp_resource:docs."file:///CHANGELOG.md"
	// docs_summarize                       allow            ok               prompt:docs.summarize
	// docs_summarize                       deny             rbac_resource    prompt:docs.summarize
	// true false true
}
