package authz_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/toolgate/toolgate"
	"github.com/toolgate/toolgate/authz"
	"github.com/toolgate/toolgate/policy"
)

const accessBundleFile = "testdata/access/bundle.yaml"

// accessSnapshot compiles testdata/access/bundle.yaml.
func accessSnapshot(t testing.TB) *authz.Snapshot {
	t.Helper()
	return compileBundle(t, loadAccessBundle(t), nil)
}

func loadAccessBundle(t testing.TB) *policy.Bundle {
	t.Helper()
	data, err := os.ReadFile(accessBundleFile)
	if err != nil {
		t.Fatal(err)
	}
	b := &policy.Bundle{}
	b.AddYAML(filepath.ToSlash(accessBundleFile), data)
	return b
}

// accessOutcome is the part of an access decision the tables pin.
type accessOutcome struct {
	Verdict toolgate.Verdict
	Code    toolgate.Code
	Layer   toolgate.Layer
	Target  string
}

func accessOutcomeOf(d toolgate.Decision) accessOutcome {
	return accessOutcome{d.Verdict, d.Code, d.Layer, d.Target}
}

func accessAllow(target string) accessOutcome {
	return accessOutcome{toolgate.Allow, toolgate.CodeOK, toolgate.LayerNone, target}
}

func accessDeny(code toolgate.Code, layer toolgate.Layer, target string) accessOutcome {
	return accessOutcome{toolgate.Deny, code, layer, target}
}

func accessApproval(target string) accessOutcome {
	return accessOutcome{toolgate.RequireApproval, toolgate.CodeApprovalRequired, toolgate.LayerApproval, target}
}

type accessCase struct {
	name     string
	access   toolgate.Access
	want     accessOutcome
	mentions []string // substrings of the reason
}

func runAccessCases(t *testing.T, snap *authz.Snapshot, cases []accessCase) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a := c.access
			d := snap.DecideAccess(&a)
			if diff := cmp.Diff(c.want, accessOutcomeOf(d)); diff != "" {
				t.Errorf("decision (-want +got):\n%s\nreason: %s", diff, d.Reason)
			}
			for _, m := range c.mentions {
				if !strings.Contains(d.Reason, m) {
					t.Errorf("reason %q does not mention %q", d.Reason, m)
				}
			}
			if d.Verdict != toolgate.Allow && d.Reason == "" {
				t.Errorf("a refusal without a reason")
			}
			if d.Verdict == toolgate.Deny && d.Layer == toolgate.LayerNone {
				t.Errorf("a deny without a layer: %s", d.Reason)
			}
			if want := toolgate.EventFor(d.Verdict); d.EventType != want {
				t.Errorf("event %s, want %s", d.EventType, want)
			}
		})
	}
}

// Access builders for the bundle's identities.
func read(agent, principal, upstream, uri string) toolgate.Access {
	return toolgate.Access{Kind: toolgate.AccessResourceRead, AgentID: agent, Principal: principal, Upstream: upstream, URI: uri}
}

func withKind(a toolgate.Access, k toolgate.AccessKind) toolgate.Access {
	a.Kind = k
	return a
}

func withMode(a toolgate.Access, mode string) toolgate.Access {
	a.DeploymentMode = mode
	return a
}

func withInstance(a toolgate.Access, instance, env string) toolgate.Access {
	a.InstanceID, a.Environment = instance, env
	return a
}

func withArgs(a toolgate.Access, args map[string]any) toolgate.Access {
	a.Args = args
	return a
}

func approved(a toolgate.Access) toolgate.Access {
	a.Approved = true
	return a
}

func toolLevel(a toolgate.Access) toolgate.Access {
	a.ToolLevel = true
	return a
}

func template(agent, principal, upstream, tmpl string) toolgate.Access {
	return toolgate.Access{Kind: toolgate.AccessResourceComplete, AgentID: agent, Principal: principal, Upstream: upstream,
		URI: tmpl, Template: true, Args: map[string]any{}}
}

func prompt(agent, principal, upstream, name string, args map[string]any) toolgate.Access {
	if args == nil {
		args = map[string]any{}
	}
	return toolgate.Access{Kind: toolgate.AccessPromptGet, AgentID: agent, Principal: principal, Upstream: upstream,
		Prompt: name, PromptName: upstream + "_" + name, Args: args}
}

// Targets of the bundle's entries.
var (
	tDocsAll    = "mcp_resource_template:docs.file:///docs/{+path}"
	tDocsSecret = "mcp_resource_template:docs.file:///docs/secret/{+path}"
	tReadme     = `mcp_resource:docs."file:///readme.md"`
	tNotes      = "mcp_resource_template:docs.file:///notes/{name}"
	tSalaries   = "mcp_resource_template:hr.hr://salaries/{id}"
	tSummarize  = "prompt:docs.summarize"
	tAB         = `prompt:docs."a.b"`
	tReview     = "prompt:hr.review"
	tWikiAll    = "mcp_resource:wiki"
	tDocsRes    = "mcp_resource:docs"
	tDocsPrompt = "prompt:docs"
)

// TestDecideAccessResources covers every layer for resource reads,
// subscriptions and template completions against declared ceilings.
func TestDecideAccessResources(t *testing.T) {
	snap := accessSnapshot(t)
	const al = "user:alice"
	cases := []accessCase{
		{"read under a template entry", read("reader", al, "docs", "file:///docs/guide/intro.md"), accessAllow(tDocsAll), nil},
		{"subscribe needs what a read needs", withKind(read("reader", al, "docs", "file:///docs/guide/intro.md"), toolgate.AccessResourceSubscribe), accessAllow(tDocsAll), nil},
		{"exact entry", read("reader", al, "docs", "file:///readme.md"), accessAllow(tReadme), nil},
		{"reserved expansion spans folders", read("reader", al, "docs", "file:///docs/a/b/c.md"), accessAllow(tDocsAll), nil},

		// composition
		{"no kind", toolgate.Access{AgentID: "reader", Principal: al, Upstream: "docs", URI: "file:///readme.md"},
			accessDeny(toolgate.CodeMalformedCall, toolgate.LayerComposition, ""), []string{"access kind"}},
		{"dot-dot segment", read("reader", al, "docs", "file:///docs/../hr/salaries.csv"),
			accessDeny(toolgate.CodeMalformedCall, toolgate.LayerComposition, ""), []string{`".." path segment`}},
		{"encoded slash", read("reader", al, "docs", "file:///docs/a%2Fb"),
			accessDeny(toolgate.CodeMalformedCall, toolgate.LayerComposition, ""), []string{"%2F"}},
		{"encoded dot", read("reader", al, "docs", "file:///docs/%2e%2e/x"),
			accessDeny(toolgate.CodeMalformedCall, toolgate.LayerComposition, ""), []string{"%2e"}},
		{"encoded percent", read("reader", al, "docs", "file:///docs/%252e"),
			accessDeny(toolgate.CodeMalformedCall, toolgate.LayerComposition, ""), nil},
		{"backslash", read("reader", al, "docs", `file:///docs/a\..\b`),
			accessDeny(toolgate.CodeMalformedCall, toolgate.LayerComposition, ""), nil},
		{"NUL", read("reader", al, "docs", "file:///docs/a\x00b"),
			accessDeny(toolgate.CodeMalformedCall, toolgate.LayerComposition, ""), []string{"control character"}},
		{"malformed escape", read("reader", al, "docs", "file:///docs/a%zz"),
			accessDeny(toolgate.CodeMalformedCall, toolgate.LayerComposition, ""), []string{"malformed percent escape"}},
		{"invalid UTF-8", read("reader", al, "docs", "file:///docs/\xff"),
			accessDeny(toolgate.CodeMalformedCall, toolgate.LayerComposition, ""), []string{"UTF-8"}},
		{"a URI that is a template's text is no URI", read("reader", al, "hr", "hr://salaries/{id}"),
			accessDeny(toolgate.CodeMalformedCall, toolgate.LayerComposition, ""), []string{"template"}},
		{"reading a template is malformed", toolgate.Access{Kind: toolgate.AccessResourceRead, AgentID: "reader", Principal: al, Upstream: "docs", URI: "file:///docs/{+path}", Template: true},
			accessDeny(toolgate.CodeMalformedCall, toolgate.LayerComposition, ""), []string{"is not a resource"}},
		{"reading a template is malformed at tool level too", toolgate.Access{Kind: toolgate.AccessResourceSubscribe, AgentID: "reader", Principal: al, Upstream: "docs", URI: "file:///docs/{+path}", Template: true, ToolLevel: true},
			accessDeny(toolgate.CodeMalformedCall, toolgate.LayerComposition, ""), nil},
		{"empty URI", read("reader", al, "docs", ""),
			accessDeny(toolgate.CodeMalformedCall, toolgate.LayerComposition, ""), []string{"empty"}},
		{"arguments that did not parse", toolgate.Access{Kind: toolgate.AccessResourceComplete, AgentID: "reader", Principal: al, Upstream: "docs",
			URI: "file:///docs/{+path}", Template: true, ArgsErr: errors.New("duplicate key")},
			accessDeny(toolgate.CodeMalformedCall, toolgate.LayerComposition, ""), []string{"duplicate key"}},
		{"no owner", read("reader", al, "", "file:///docs/x"),
			accessDeny(toolgate.CodeUnknownResource, toolgate.LayerComposition, ""), []string{"no upstream owns"}},
		{"an owner the bundle does not know", read("reader", al, "ghost", "file:///docs/x"),
			accessDeny(toolgate.CodeUnknownResource, toolgate.LayerComposition, ""), []string{"ghost"}},
		{"unknown agent", read("nobody", al, "docs", "file:///docs/x"),
			accessDeny(toolgate.CodeUnknownAgent, toolgate.LayerComposition, ""), nil},

		// ceiling
		{"outside every entry", read("reader", al, "docs", "file:///etc/passwd"),
			accessDeny(toolgate.CodeNotInCeiling, toolgate.LayerCeiling, ""), []string{"resource_permissions", "file:///docs/{+path}"}},
		{"a simple expansion does not span folders", read("reader", al, "docs", "file:///notes/a/b"),
			accessDeny(toolgate.CodeNotInCeiling, toolgate.LayerCeiling, ""), nil},
		{"another upstream's URI of an entry", read("reader", al, "hr", "file:///docs/x"),
			accessDeny(toolgate.CodeNotInCeiling, toolgate.LayerCeiling, ""), []string{"for upstream hr"}},
		{"an upstream the ceiling does not name", read("reader", al, "wiki", "wiki://home"),
			accessDeny(toolgate.CodeNotInCeiling, toolgate.LayerCeiling, ""), []string{"none for upstream wiki"}},
		{"another case of the path is another URI", read("reader", al, "docs", "file:///DOCS/x"),
			accessDeny(toolgate.CodeNotInCeiling, toolgate.LayerCeiling, ""), nil},
		{"an uppercase scheme is a second spelling", read("reader", al, "docs", "FILE:///docs/x"),
			accessDeny(toolgate.CodeMalformedCall, toolgate.LayerComposition, ""), []string{"one spelling"}},
		{"an escaped unreserved character is a second spelling", read("reader", al, "docs", "file:///docs/%78"),
			accessDeny(toolgate.CodeMalformedCall, toolgate.LayerComposition, ""), []string{"unreserved"}},
		{"an empty declared ceiling reaches nothing", read("none", "user:carol", "docs", "file:///docs/x"),
			accessDeny(toolgate.CodeNotInCeiling, toolgate.LayerCeiling, ""), nil},

		// runtime
		{"no runtime policy for the mode", withMode(read("reader", al, "docs", "file:///readme.md"), "nightly"),
			accessDeny(toolgate.CodeNoRuntimePolicy, toolgate.LayerRuntime, tReadme), nil},
		{"denied_servers", withMode(read("reader", al, "hr", "hr://salaries/7"), "staging"),
			accessDeny(toolgate.CodeMCPServerDenied, toolgate.LayerRuntime, tSalaries), []string{"denied_servers"}},
		{"not in allowed_servers", withMode(read("reader", al, "hr", "hr://salaries/7"), "docsonly"),
			accessDeny(toolgate.CodeMCPServerDenied, toolgate.LayerRuntime, tSalaries), []string{"allowed_servers"}},
		{"allowed_servers keeps docs", withMode(read("reader", al, "docs", "file:///readme.md"), "docsonly"), accessAllow(tReadme), nil},

		// instance
		{"undeclared instance", withInstance(read("reader", al, "docs", "file:///readme.md"), "globex", ""),
			accessDeny(toolgate.CodeUnknownInstance, toolgate.LayerInstance, tReadme), nil},
		{"suspended in the environment", withInstance(read("reader", al, "docs", "file:///docs/drafts/q3.md"), "acme", "eu"),
			accessDeny(toolgate.CodeSuspendedInstance, toolgate.LayerInstance, tDocsAll), []string{"resource_suspensions"}},
		{"other files of the instance pass", withInstance(read("reader", al, "docs", "file:///docs/final/q3.md"), "acme", "eu"), accessAllow(tDocsAll), nil},

		// grant
		{"no grant", read("reader", "user:carol", "docs", "file:///readme.md"),
			accessDeny(toolgate.CodeRBACResource, toolgate.LayerGrant, tReadme), []string{"mcp_resource:read", `{upstream: docs, uri: file:///readme.md}`}},
		{"undeclared principal", read("reader", "user:mallory", "docs", "file:///readme.md"),
			accessDeny(toolgate.CodeRBACResource, toolgate.LayerGrant, tReadme), []string{"not declared"}},
		{"a narrower grant template", read("reader", "user:bob", "docs", "file:///docs/public/a.md"), accessAllow(tDocsAll), nil},
		{"outside the grant template", read("reader", "user:bob", "docs", "file:///docs/private/a.md"),
			accessDeny(toolgate.CodeRBACResource, toolgate.LayerGrant, tDocsAll), nil},
		{"a grant on hr's readme is not docs' readme", read("reader", "user:bob", "docs", "file:///readme.md"),
			accessDeny(toolgate.CodeRBACResource, toolgate.LayerGrant, tReadme), nil},

		// condition
		{"a grant condition that holds", read("reader", al, "hr", "hr://salaries/7"), accessAllow(tSalaries), nil},
		{"a grant condition that errors denies", read("reader", "user:dave", "docs", "file:///readme.md"),
			accessDeny(toolgate.CodeConditionFailed, toolgate.LayerCondition, tReadme), []string{"evaluation error denies"}},
		{"a policy condition over resource.uri", read("reader", al, "hr", "hr://salaries/ceo"),
			accessDeny(toolgate.CodeConditionFailed, toolgate.LayerCondition, tSalaries), []string{"CEO"}},

		// approval
		{"the strictest of overlapping entries", read("reader", al, "docs", "file:///docs/secret/plans.md"),
			accessApproval(tDocsSecret), []string{"hitl"}},
		{"approved", approved(read("reader", al, "docs", "file:///docs/secret/plans.md")), accessAllow(tDocsSecret), nil},
		{"policy tier: a guard allow rule", read("reader", al, "hr", "hr://salaries/7"), accessAllow(tSalaries), nil},
		{"policy and hitl entries: the guard allows, a human approves", read("reader", al, "hr", "hr://salaries/1"),
			accessApproval("mcp_resource:hr.hr://salaries/1"), []string{"hitl"}},
		{"policy and hitl entries: the guard denies", read("reader", al, "hr", "hr://salaries/2"),
			accessDeny(toolgate.CodePolicyDenied, toolgate.LayerApproval, "mcp_resource:hr.hr://salaries/2"), []string{"two is private"}},
		{"policy tier: a guard rule that errors denies", read("reader", al, "hr", "hr://salaries/3"),
			accessDeny(toolgate.CodeConditionFailed, toolgate.LayerApproval, tSalaries), []string{"evaluation error denies"}},
		{"an escalation rule that errors denies", read("reader", al, "docs", "file:///notes/x"),
			accessDeny(toolgate.CodeConditionFailed, toolgate.LayerApproval, tNotes), []string{"escalation rule"}},

		// template completions
		{"completing a listed template", withArgs(template("reader", al, "docs", "file:///notes/{name}"), map[string]any{"n": "x"}), accessAllow(tNotes), nil},
		{"a completion without the argument a rule reads", template("reader", al, "docs", "file:///notes/{name}"),
			accessDeny(toolgate.CodeConditionFailed, toolgate.LayerApproval, tNotes), []string{"no such key"}},
		{"tool level: a template listing of a template with an argument rule", toolLevel(template("reader", al, "docs", "file:///notes/{name}")), accessApproval(tNotes), []string{"may match"}},
		{"completion arguments reach conditions", withArgs(template("reader", al, "docs", "file:///notes/{name}"), map[string]any{"n": "{name}"}),
			accessApproval(tNotes), []string{"escalation rule"}},
		{"a template is covered only by its own text", template("reader", al, "docs", "file:///docs/guide/{page}"),
			accessDeny(toolgate.CodeNotInCeiling, toolgate.LayerCeiling, ""), nil},
		{"an exact entry covers no template", template("reader", al, "docs", "file:///readme.md"),
			accessDeny(toolgate.CodeNotInCeiling, toolgate.LayerCeiling, ""), nil},
		{"a template that does not parse", template("reader", al, "docs", "file:///docs/{+path"),
			accessDeny(toolgate.CodeMalformedCall, toolgate.LayerComposition, ""), []string{"RFC 6570"}},
		{"a completion of a URI", toolgate.Access{Kind: toolgate.AccessResourceComplete, AgentID: "reader", Principal: al, Upstream: "docs", URI: "file:///readme.md"}, accessAllow(tReadme), nil},
		{"grant templates follow the same rule", template("reader", "user:bob", "docs", "file:///docs/{+path}"),
			accessDeny(toolgate.CodeRBACResource, toolgate.LayerGrant, tDocsAll), nil},
	}
	runAccessCases(t, snap, cases)
}

// TestDecideAccessPrompts covers every layer for prompts/get and prompt
// argument completions.
func TestDecideAccessPrompts(t *testing.T) {
	snap := accessSnapshot(t)
	const al = "user:alice"
	cases := []accessCase{
		{"get", prompt("reader", al, "docs", "summarize", nil), accessAllow(tSummarize), nil},
		{"complete needs what a get needs", withKind(prompt("reader", al, "docs", "summarize", nil), toolgate.AccessPromptComplete), accessAllow(tSummarize), nil},
		{"a dotted prompt name", prompt("reader", al, "docs", "a.b", map[string]any{"n": 2}), accessAllow(tAB), nil},

		{"no prompt name", prompt("reader", al, "docs", "", nil),
			accessDeny(toolgate.CodeMalformedCall, toolgate.LayerComposition, ""), []string{"names no prompt"}},
		{"no owner", prompt("reader", al, "", "summarize", nil),
			accessDeny(toolgate.CodeUnknownPrompt, toolgate.LayerComposition, ""), []string{"no upstream owns"}},
		{"unknown agent", prompt("nobody", al, "docs", "summarize", nil),
			accessDeny(toolgate.CodeUnknownAgent, toolgate.LayerComposition, ""), nil},
		{"arguments that did not parse", func() toolgate.Access {
			a := prompt("reader", al, "docs", "summarize", nil)
			a.ArgsErr = errors.New("keys that differ only by case")
			return a
		}(), accessDeny(toolgate.CodeMalformedCall, toolgate.LayerComposition, ""), []string{"differ only by case"}},

		{"not in the ceiling", prompt("reader", al, "docs", "translate", nil),
			accessDeny(toolgate.CodeNotInCeiling, toolgate.LayerCeiling, ""), []string{"prompt_permissions", "summarize"}},
		{"a dotted name is not its first part", prompt("reader", al, "docs", "a", nil),
			accessDeny(toolgate.CodeNotInCeiling, toolgate.LayerCeiling, ""), nil},
		{"another upstream's prompt of the same name", prompt("reader", al, "hr", "summarize", nil),
			accessDeny(toolgate.CodeNotInCeiling, toolgate.LayerCeiling, ""), nil},

		{"denied_servers", withMode(prompt("reader", al, "hr", "review", nil), "staging"),
			accessDeny(toolgate.CodeMCPServerDenied, toolgate.LayerRuntime, tReview), nil},
		{"no runtime policy", withMode(prompt("reader", al, "docs", "summarize", nil), "nightly"),
			accessDeny(toolgate.CodeNoRuntimePolicy, toolgate.LayerRuntime, tSummarize), nil},
		{"suspended in the environment", withInstance(prompt("reader", al, "docs", "summarize", nil), "acme", "eu"),
			accessDeny(toolgate.CodeSuspendedInstance, toolgate.LayerInstance, tSummarize), []string{"prompt_suspensions"}},
		{"undeclared instance", withInstance(prompt("reader", al, "docs", "summarize", nil), "globex", "eu"),
			accessDeny(toolgate.CodeUnknownInstance, toolgate.LayerInstance, tSummarize), nil},

		{"no grant", prompt("reader", "user:carol", "docs", "summarize", nil),
			accessDeny(toolgate.CodeRBACResource, toolgate.LayerGrant, tSummarize), []string{"prompt:get", "{upstream: docs, prompt: summarize}"}},
		{"a grant on prompt a does not cover a.b", prompt("reader", "user:bob", "docs", "a.b", map[string]any{"n": 2}),
			accessDeny(toolgate.CodeRBACResource, toolgate.LayerGrant, tAB), nil},
		{"a grant condition that errors denies", prompt("reader", "user:dave", "docs", "summarize", nil),
			accessDeny(toolgate.CodeConditionFailed, toolgate.LayerCondition, tSummarize), []string{"evaluation error denies"}},
		{"a grant condition that holds", prompt("reader", "user:dave", "docs", "summarize", map[string]any{"x": 1}), accessAllow(tSummarize), nil},

		{"a condition over args", prompt("reader", al, "docs", "summarize", map[string]any{"style": "leak"}),
			accessDeny(toolgate.CodeConditionFailed, toolgate.LayerCondition, tSummarize), []string{"no leaking"}},
		{"a condition that errors denies", prompt("reader", al, "docs", "a.b", nil),
			accessDeny(toolgate.CodeConditionFailed, toolgate.LayerCondition, tAB), []string{"evaluation error denies"}},
		{"a condition that does not hold", prompt("reader", al, "docs", "a.b", map[string]any{"n": 1}),
			accessDeny(toolgate.CodeConditionFailed, toolgate.LayerCondition, tAB), []string{"n above one"}},
		{"completion arguments are conditions' args", withKind(prompt("reader", al, "docs", "summarize", map[string]any{"style": "leak"}), toolgate.AccessPromptComplete),
			accessDeny(toolgate.CodeConditionFailed, toolgate.LayerCondition, tSummarize), nil},

		{"hitl tier", prompt("reader", al, "hr", "review", nil), accessApproval(tReview), []string{"hitl"}},
		{"hitl tier approved", approved(prompt("reader", al, "hr", "review", nil)), accessAllow(tReview), nil},
		{"an escalation rule over args", prompt("reader", al, "docs", "summarize", map[string]any{"length": 5000}), accessApproval(tSummarize), []string{"escalation rule"}},
		{"tool level: conditions are not judged", toolLevel(prompt("reader", al, "docs", "a.b", nil)), accessAllow(tAB), nil},
		{"tool level: a conditional escalation may match", toolLevel(prompt("reader", al, "docs", "summarize", nil)), accessApproval(tSummarize), []string{"may match"}},
	}
	runAccessCases(t, snap, cases)
}

// TestDecideAccessDefault: an agent without resource_permissions or
// prompt_permissions reaches an upstream's resources and prompts exactly
// when one of that upstream's tools is disclosed to the identity (its
// tool-level Decide), and no grant is needed.
func TestDecideAccessDefault(t *testing.T) {
	snap := accessSnapshot(t)
	cases := []accessCase{
		{"a disclosed tool of the upstream", read("plain", "user:carol", "docs", "file:///anything"), accessAllow(tDocsRes), nil},
		{"prompts too", prompt("plain", "user:carol", "docs", "anything", nil), accessAllow(tDocsPrompt), nil},
		{"one disclosed tool suffices", read("plain", "user:bob", "docs", "file:///x"), accessAllow(tDocsRes), nil},
		{"no tool of the upstream in the ceiling", read("plain", "user:carol", "hr", "hr://salaries/1"),
			accessDeny(toolgate.CodeNotInCeiling, toolgate.LayerCeiling, "mcp_resource:hr"), []string{"declares no resource_permissions", "none of hr's tools"}},
		{"the tools are suspended: the tool's layer and code", withMode(read("plain", "user:carol", "docs", "file:///x"), "staging"),
			accessDeny(toolgate.CodeSuspendedRuntime, toolgate.LayerRuntime, tDocsRes), []string{"tool:docs-search", "reachable only while one of its tools is disclosed"}},
		{"no tool:invoke grant: the grant layer", read("plain", "user:mallory", "docs", "file:///x"),
			accessDeny(toolgate.CodeRBACToolInvoke, toolgate.LayerGrant, tDocsRes), nil},
		{"no principal holds nothing", read("plain", "", "docs", "file:///x"),
			accessDeny(toolgate.CodeRBACToolInvoke, toolgate.LayerGrant, tDocsRes), nil},
		{"no runtime policy", withMode(read("plain", "user:carol", "docs", "file:///x"), "nightly"),
			accessDeny(toolgate.CodeNoRuntimePolicy, toolgate.LayerRuntime, tDocsRes), nil},
		{"instance suspensions apply", withInstance(read("plain", "user:carol", "wiki", "wiki://home"), "acme", "eu"),
			accessDeny(toolgate.CodeSuspendedInstance, toolgate.LayerInstance, tWikiAll), nil},
		{"conditions that select it apply", read("plain", "user:carol", "wiki", "wiki://private/hr"),
			accessDeny(toolgate.CodeConditionFailed, toolgate.LayerCondition, tWikiAll), []string{"private pages stay private"}},
		{"requires_human_approval covers accesses", withMode(read("plain", "user:carol", "wiki", "wiki://home"), "careful"),
			accessApproval(tWikiAll), []string{"requires_human_approval"}},
		{"requires_human_approval: approved", approved(withMode(prompt("plain", "user:carol", "wiki", "p", nil), "careful")), accessAllow("prompt:wiki"), nil},
		{"malformed URIs are refused in the default too", read("plain", "user:carol", "docs", "file:///a/%2e%2e/b"),
			accessDeny(toolgate.CodeMalformedCall, toolgate.LayerComposition, ""), nil},
		{"an empty declared prompt ceiling reaches nothing", prompt("none", "user:carol", "docs", "p", nil),
			accessDeny(toolgate.CodeNotInCeiling, toolgate.LayerCeiling, ""), nil},
	}
	runAccessCases(t, snap, cases)
}

// TestDecideAccessDelegated: a delegation narrows resource and prompt
// grants as it narrows tool grants, and in the default narrows the tools
// that make an upstream reachable.
func TestDecideAccessDelegated(t *testing.T) {
	snap := accessSnapshot(t)
	del, err := snap.CompileDelegation("dlg_1", "user:alice", "agent:helper", []policy.Grant{
		{Resource: "tool", Action: "invoke", Scope: policy.Scope{Tool: "docs_index"}},
		{Resource: "mcp_resource", Action: "read", Scope: policy.Scope{Upstream: "docs", URI: "file:///docs/{+path}"}},
	}, farFuture)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name   string
		access toolgate.Access
		want   accessOutcome
	}{
		{"inside both", read("reader", "user:alice", "docs", "file:///docs/a.md"), accessAllow(tDocsAll)},
		{"outside the delegation", read("reader", "user:alice", "docs", "file:///readme.md"), accessDeny(toolgate.CodeRBACResource, toolgate.LayerGrant, tReadme)},
		{"no prompt grant delegated", prompt("reader", "user:alice", "docs", "summarize", nil), accessDeny(toolgate.CodeRBACResource, toolgate.LayerGrant, tSummarize)},
		// plain's ceiling has docs-search and docs-index; only docs-index
		// is delegated, and it is enough.
		{"the default through a delegated tool", read("plain", "user:alice", "docs", "file:///x"), accessAllow(tDocsRes)},
		{"the default without a delegated tool", read("plain", "user:alice", "wiki", "wiki://home"), accessDeny(toolgate.CodeRBACToolInvoke, toolgate.LayerGrant, tWikiAll)},
		{"another delegator", read("reader", "user:bob", "docs", "file:///docs/public/a.md"), accessDeny(toolgate.CodeInternalError, toolgate.LayerInternal, "")},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a := c.access
			d := snap.DecideAccessDelegated(&a, del)
			if diff := cmp.Diff(c.want, accessOutcomeOf(d)); diff != "" {
				t.Errorf("decision (-want +got):\n%s\nreason: %s", diff, d.Reason)
			}
		})
	}
	for _, g := range []policy.Grant{
		{Resource: "mcp_resource", Action: "read", Scope: policy.Scope{Upstream: "docs", URI: "file:///docs/{+path"}},
		{Resource: "mcp_resource", Action: "read", Scope: policy.Scope{Name: "docs"}},
		{Resource: "mcp_resource", Action: "write", Scope: policy.Scope{All: true}},
		{Resource: "prompt", Action: "get", Scope: policy.Scope{Upstream: "docs", URI: "file:///x"}},
		{Resource: "sql_table", Action: "read", Scope: policy.Scope{Upstream: "docs"}},
	} {
		if _, err := snap.CompileDelegation("dlg_2", "user:alice", "x", []policy.Grant{g}, farFuture); err == nil {
			t.Errorf("CompileDelegation accepted %s:%s on %s", g.Resource, g.Action, g.Scope)
		}
	}
}

// TestDecideAccessFailClosed: no snapshot, no access, a panic inside.
func TestDecideAccessFailClosed(t *testing.T) {
	var nilSnap *authz.Snapshot
	a := read("reader", "user:alice", "docs", "file:///readme.md")
	for name, d := range map[string]toolgate.Decision{
		"nil snapshot": nilSnap.DecideAccess(&a),
		"nil access":   accessSnapshot(t).DecideAccess(nil),
		"nil filter":   (*authz.AccessFilter)(nil).Decide(a),
	} {
		if d.Verdict != toolgate.Deny || d.Code != toolgate.CodeInternalError {
			t.Errorf("%s: %s/%s, want deny/internal_error", name, d.Verdict, d.Code)
		}
	}
	var zero toolgate.Decision
	if zero.Verdict != toolgate.Deny {
		t.Errorf("the zero Decision does not deny")
	}
}

// TestAccessFilter: the list side shows exactly what the tool-level access
// does not deny, including the default's per-upstream cache.
func TestAccessFilter(t *testing.T) {
	snap := accessSnapshot(t)
	type item struct {
		kind              string
		upstream, key     string
		wantAlice, wantNo bool // shown for user:alice / user:carol (no resource grants)
	}
	items := []item{
		{"resource", "docs", "file:///docs/a.md", true, false},
		{"resource", "docs", "file:///docs/secret/a.md", true, false}, // needs approval: still listed
		{"resource", "docs", "file:///etc/passwd", false, false},
		{"resource", "hr", "hr://salaries/ceo", false, false}, // a condition over the URI: not listed
		{"resource", "docs", "file:///docs/%2e%2e/x", false, false},
		{"template", "docs", "file:///docs/{+path}", true, false},
		{"template", "docs", "file:///other/{+path}", false, false},
		{"template", "docs", "file:///notes/{name}", true, false}, // a rule over completion arguments: listed
		{"prompt", "docs", "summarize", true, false},
		{"prompt", "docs", "a.b", true, false}, // its condition needs arguments: listed
		{"prompt", "docs", "translate", false, false},
		{"prompt", "hr", "review", true, false},
	}
	for _, principal := range []string{"user:alice", "user:carol"} {
		f := snap.AccessFilter(authz.Context{AgentID: "reader", Principal: principal})
		for _, it := range items {
			var got bool
			switch it.kind {
			case "resource":
				got = f.Resource(it.upstream, it.key)
			case "template":
				got = f.Template(it.upstream, it.key)
			default:
				got = f.Prompt(it.upstream, it.key)
			}
			want := it.wantAlice
			if principal == "user:carol" {
				want = it.wantNo
			}
			if got != want {
				t.Errorf("%s: %s %s %s shown = %v, want %v", principal, it.kind, it.upstream, it.key, got, want)
			}
		}
	}
	// The default, cached per upstream: the same answer on every item.
	f := snap.AccessFilter(authz.Context{AgentID: "plain", Principal: "user:carol", DeploymentMode: "staging"})
	for range 3 {
		if f.Resource("docs", "file:///x") || !f.Resource("wiki", "wiki://home") || f.Resource("wiki", "wiki://private/x") {
			t.Fatalf("plain/staging: docs is suspended, wiki reachable but its private pages are not")
		}
	}
}

// TestAccessTargetsInjective: the ids of what a decision names never
// collide, whatever dots, quotes or template braces a uri or prompt name
// holds, and a grant or entry of one upstream never covers another's.
func TestAccessTargetsInjective(t *testing.T) {
	type in struct{ kind, upstream, key string }
	ins := []in{
		{"res", "docs", ""}, {"res", "docs", "a"}, {"res", "docs", "a.b"}, {"res", "docs", `"a.b"`},
		{"res", "docs", "file:///a.md"}, {"res", "docs", "file:///a"}, {"res", "docs", "file:///{a}"},
		{"res", "docsa", ""}, {"res", "doc", "s.a"}, {"res", "docs", `a"."b`}, {"res", "docs", `a""b`},
		{"prompt", "docs", ""}, {"prompt", "docs", "a"}, {"prompt", "docs", "a.b"}, {"prompt", "docs.a", "b"},
		{"prompt", "docs", `a"b`}, {"prompt", "docs", `"a"`}, {"prompt", "docs", "a..b"}, {"prompt", "d", "ocs.a.b"},
	}
	seen := map[string]in{}
	for _, x := range ins {
		var id string
		if x.kind == "res" {
			id = policy.ResourceTarget(x.upstream, x.key)
		} else {
			id = policy.PromptTarget(x.upstream, x.key)
		}
		if prev, dup := seen[id]; dup {
			t.Errorf("%+v and %+v share the id %q", prev, x, id)
		}
		seen[id] = x
	}

	// Scope coverage never crosses upstreams or kinds.
	covers := []struct {
		outer, inner policy.Scope
		want         bool
	}{
		{policy.Scope{Upstream: "docs"}, policy.Scope{Upstream: "docs", URI: "file:///a"}, true},
		{policy.Scope{Upstream: "docs"}, policy.Scope{Upstream: "docsx", URI: "file:///a"}, false},
		{policy.Scope{Upstream: "doc"}, policy.Scope{Upstream: "docs"}, false},
		{policy.Scope{Upstream: "docs", URI: "file:///{+p}"}, policy.Scope{Upstream: "docs", URI: "file:///a/b"}, true},
		{policy.Scope{Upstream: "docs", URI: "file:///{+p}"}, policy.Scope{Upstream: "hr", URI: "file:///a/b"}, false},
		{policy.Scope{Upstream: "docs", URI: "file:///{+p}"}, policy.Scope{Upstream: "docs", URI: "file:///a/{x}"}, false},
		{policy.Scope{Upstream: "docs", URI: "file:///a"}, policy.Scope{Upstream: "docs"}, false},
		{policy.Scope{Upstream: "docs", Prompt: "a"}, policy.Scope{Upstream: "docs", Prompt: "a.b"}, false},
		{policy.Scope{Upstream: "docs", Prompt: "a.b"}, policy.Scope{Upstream: "docs", Prompt: "a.b"}, true},
		{policy.Scope{Name: "docs"}, policy.Scope{Upstream: "docs"}, false},
		{policy.Scope{Upstream: "docs"}, policy.Scope{Name: "docs.a"}, false},
	}
	for _, c := range covers {
		if got := policy.ScopeCovers(c.outer, c.inner); got != c.want {
			t.Errorf("ScopeCovers(%s, %s) = %v, want %v", c.outer, c.inner, got, c.want)
		}
	}
}

// TestDecideAccessDisclosed: an access's decision says whether the
// resource or prompt is disclosed (its tool-level access does not deny),
// so a refusal of an access the lists hide is answered as if it did not
// exist, and one the lists show names its layer.
func TestDecideAccessDisclosed(t *testing.T) {
	snap := accessSnapshot(t)
	al := "user:alice"
	cases := []struct {
		name   string
		access toolgate.Access
		want   bool
	}{
		{"an allowed read", read("reader", al, "docs", "file:///docs/a.md"), true},
		{"a read needing approval", read("reader", al, "docs", "file:///docs/secret/a"), true},
		{"a read outside the ceiling", read("reader", al, "docs", "file:///other"), false},
		{"a read without a grant", read("reader", "user:bob", "docs", "file:///docs/a.md"), false},
		{"a read a condition refuses (no arguments: the list hides it too)", read("reader", al, "hr", "hr://salaries/ceo"), false},
		{"a prompt its arguments refuse", prompt("reader", al, "docs", "summarize", map[string]any{"style": "leak"}), true},
		{"a prompt outside the ceiling, whatever its arguments", prompt("reader", al, "docs", "other", map[string]any{"style": "leak"}), false},
		{"a prompt without a grant", prompt("reader", "user:bob", "docs", "summarize", nil), false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a := c.access
			d := snap.DecideAccess(&a)
			if d.Disclosed != c.want {
				t.Errorf("Disclosed = %v, want %v (%s %s: %s)", d.Disclosed, c.want, d.Verdict, d.Code, d.Reason)
			}
			f := snap.AccessFilter(authz.Context{AgentID: a.AgentID, Principal: a.Principal})
			if shown := f.Decide(a).Verdict != toolgate.Deny; shown != c.want {
				t.Errorf("the list shows it: %v, but Disclosed should agree (%v)", shown, c.want)
			}
		})
	}
}

// TestDecideAccessDelegationExpiry: an access under a delegation that
// expired at the access's Now is refused at the grant layer and
// disclosed nothing; an AccessFilter for it shows nothing.
func TestDecideAccessDelegationExpiry(t *testing.T) {
	snap := accessSnapshot(t)
	end := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	del, err := snap.CompileDelegation("dlg_x", "user:alice", "agent:helper", []policy.Grant{
		{Resource: "mcp_resource", Action: "read", Scope: policy.Scope{Upstream: "docs"}},
	}, end)
	if err != nil {
		t.Fatal(err)
	}
	a := read("reader", "user:alice", "docs", "file:///docs/a.md")
	a.Now = end.Add(-time.Second)
	if d := snap.DecideAccessDelegated(&a, del); d.Verdict != toolgate.Allow {
		t.Fatalf("before expiry: %s %s", d.Verdict, d.Reason)
	}
	a.Now = end
	d := snap.DecideAccessDelegated(&a, del)
	if d.Verdict != toolgate.Deny || d.Layer != toolgate.LayerGrant || d.Disclosed || !strings.Contains(d.Reason, "expired") {
		t.Errorf("at expiry: %s %s %s disclosed=%v: %s", d.Verdict, d.Code, d.Layer, d.Disclosed, d.Reason)
	}
	for _, now := range []time.Time{end, end.Add(time.Hour)} {
		f := snap.AccessFilter(authz.Context{AgentID: "reader", Principal: "user:alice", Delegation: del, Now: now})
		if f.Resource("docs", "file:///docs/a.md") {
			t.Errorf("an AccessFilter at %s shows a resource through an expired delegation", now)
		}
	}
	f := snap.AccessFilter(authz.Context{AgentID: "reader", Principal: "user:alice", Delegation: del, Now: end.Add(-time.Minute)})
	if !f.Resource("docs", "file:///docs/a.md") {
		t.Errorf("an AccessFilter before expiry hides the resource")
	}
}
