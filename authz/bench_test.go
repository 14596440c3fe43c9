package authz_test

import (
	"fmt"
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

// accessBenchBundle is the access decision the benchmarks measure: a
// resource under a template entry of a declared ceiling with the grant
// that covers it, a prompt entry, and an agent in the default (its
// upstream reachable through a disclosed tool).
const accessBenchBundle = `
- {kind: Upstream, name: docs, transport: stdio, command: docs-server}
- {kind: Tool, tool_id: tool:docs-search, side_effect_class: read, source: {mcp_server: docs}}
- kind: Agent
  agent_id: reader
  version: 1.0.0
  tool_permissions:
    - {tool_id: tool:docs-search, side_effect_class: read}
  resource_permissions:
    - {upstream: docs, uri: "file:///readme.md"}
    - {upstream: docs, uri: "file:///docs/{+path}"}
  prompt_permissions:
    - {upstream: docs, prompt: summarize}
- kind: Agent
  agent_id: plain
  version: 1.0.0
  tool_permissions:
    - {tool_id: tool:docs-search, side_effect_class: read}
- {kind: RuntimePolicy, agent_id: reader, deployment_mode: production, tool_authorization_policy: {active_tool_set: all}}
- {kind: RuntimePolicy, agent_id: plain, deployment_mode: production, tool_authorization_policy: {active_tool_set: all}}
- kind: Principal
  principal_id: user:alice
  grants:
    - {resource: tool, action: invoke, scope: all}
    - {resource: mcp_resource, action: read, scope: {upstream: docs, uri: "file:///docs/{+path}"}}
    - {resource: prompt, action: get, scope: {upstream: docs}}
`

func BenchmarkDecideAccess(b *testing.B) {
	bundle := &policy.Bundle{}
	bundle.AddYAML("bench.yaml", []byte(accessBenchBundle))
	snap, _, err := authz.Compile(bundle, nil)
	if err != nil {
		b.Fatal(err)
	}
	cases := []struct {
		name   string
		access toolgate.Access
		want   toolgate.Verdict
	}{
		{"allow_resource_template", toolgate.Access{Kind: toolgate.AccessResourceRead, AgentID: "reader", Principal: "user:alice",
			Upstream: "docs", URI: "file:///docs/guide/getting-started.md"}, toolgate.Allow},
		{"allow_prompt", toolgate.Access{Kind: toolgate.AccessPromptGet, AgentID: "reader", Principal: "user:alice",
			Upstream: "docs", Prompt: "summarize", PromptName: "docs_summarize", Args: map[string]any{"text": "x"}}, toolgate.Allow},
		{"allow_default", toolgate.Access{Kind: toolgate.AccessResourceRead, AgentID: "plain", Principal: "user:alice",
			Upstream: "docs", URI: "file:///docs/guide/getting-started.md"}, toolgate.Allow},
		{"deny_not_in_ceiling", toolgate.Access{Kind: toolgate.AccessResourceRead, AgentID: "reader", Principal: "user:alice",
			Upstream: "docs", URI: "file:///etc/passwd"}, toolgate.Deny},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			a := c.access
			b.ReportAllocs()
			for b.Loop() {
				if d := snap.DecideAccess(&a); d.Verdict != c.want {
					b.Fatalf("got %s: %s", d.Verdict, d.Reason)
				}
			}
		})
	}
}

// BenchmarkAccessFilter filters a resources/list of 5,000 items, half of
// them outside the ceiling, as one list request does.
func BenchmarkAccessFilter(b *testing.B) {
	bundle := &policy.Bundle{}
	bundle.AddYAML("bench.yaml", []byte(accessBenchBundle))
	snap, _, err := authz.Compile(bundle, nil)
	if err != nil {
		b.Fatal(err)
	}
	uris := make([]string, 5000)
	for i := range uris {
		if i%2 == 0 {
			uris[i] = fmt.Sprintf("file:///docs/section-%d/page-%d.md", i%37, i)
		} else {
			uris[i] = fmt.Sprintf("file:///private/page-%d.md", i)
		}
	}
	for _, agent := range []string{"reader", "plain"} {
		b.Run(agent, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				f := snap.AccessFilter(authz.Context{AgentID: agent, Principal: "user:alice"})
				n := 0
				for _, u := range uris {
					if f.Resource("docs", u) {
						n++
					}
				}
				if want := map[string]int{"reader": 2500, "plain": 5000}[agent]; n != want {
					b.Fatalf("%d shown, want %d", n, want)
				}
			}
		})
	}
}
