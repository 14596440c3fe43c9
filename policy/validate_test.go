package policy_test

import (
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/toolgate/toolgate/policy"
)

// A validation case is a bundle whose expected diagnostics are written next
// to the lines they concern, as YAML comments:
//
//	tool_id: tool:Fs_Read    # want error "tool_id must be"
//
// Every case must produce exactly the diagnostics its markers name: the
// severity, the file and the line, with a message containing the quoted
// text. Everything else in a case's bundle is valid, so each case isolates
// one rule.
var wantMarker = regexp.MustCompile(`#\s*want (error|warning)(?: "((?:[^"\\]|\\.)*)")?`)

type yamlFile struct{ name, body string }

type validateCase struct {
	name  string
	files []yamlFile
	opts  *policy.ValidateOptions
	// clean marks a case that must produce no diagnostic at all (it has
	// no markers).
	clean bool
}

type diagKey struct {
	Severity string
	File     string
	Line     int
}

type wantDiag struct {
	diagKey
	mention string
}

func markers(files []yamlFile) []wantDiag {
	var out []wantDiag
	for _, f := range files {
		for i, line := range strings.Split(f.body, "\n") {
			for _, m := range wantMarker.FindAllStringSubmatch(line, -1) {
				out = append(out, wantDiag{diagKey{m[1], f.name, i + 1}, strings.ReplaceAll(m[2], `\"`, `"`)})
			}
		}
	}
	return out
}

func one(name, body string) []yamlFile { return []yamlFile{{name, body}} }

// base is a valid agent with a runtime policy that the cases build on.
const base = `
- {kind: Tool, tool_id: tool:fs-read, side_effect_class: read}
- {kind: Tool, tool_id: tool:fs-write, side_effect_class: write}
- kind: Agent
  agent_id: worker
  tool_permissions:
    - {tool_id: tool:fs-read, side_effect_class: read}
- kind: RuntimePolicy
  agent_id: worker
  deployment_mode: production
  tool_authorization_policy: {active_tool_set: all}
`

// guarded adds an agent whose fs.read is judged by the Policy Guard.
const guarded = `- kind: Agent
  agent_id: guarded
  tool_permissions:
    - {tool_id: tool:fs-read, side_effect_class: read, approval_tier: policy}
- {kind: RuntimePolicy, agent_id: guarded, deployment_mode: production, tool_authorization_policy: {active_tool_set: all}}
`

var validateCases = []validateCase{
	{name: "tool id syntax", files: one("tools.yaml", `
- kind: Tool                          # want error "tool_id must be tool:<provider>-<verb>"
  tool_id: tool:Fs_Read
  side_effect_class: read
`)},
	{name: "tool name that does not map", files: one("tools.yaml", `
- {kind: Tool, name: Fs.Read, side_effect_class: read}   # want error "does not map to a tool id"
`)},
	{name: "tool name mapping to another id", files: one("tools.yaml", `
- {kind: Tool, tool_id: tool:fs-read, name: fs.fetch, side_effect_class: read}   # want error "not to its tool_id"
`)},
	{name: "two names mapping to one id", files: one("tools.yaml", `
- {kind: Tool, name: fs.read, side_effect_class: read}
- {kind: Tool, name: fs_read, side_effect_class: read}   # want error "map to the same tool id tool:fs-read"
`)},
	{name: "two names mapping to one id across files", files: []yamlFile{
		{"a.yaml", `- {kind: Tool, name: fs.read, side_effect_class: read}`},
		{"b.yaml", `
- {kind: Tool, name: fs-read, side_effect_class: read}   # want error "a.yaml:1"
`}}},
	{name: "duplicate tool id", files: one("tools.yaml", `
- {kind: Tool, tool_id: tool:fs-read, side_effect_class: read}
- {kind: Tool, tool_id: tool:fs-read, side_effect_class: read}   # want error "duplicate Tool tool:fs-read"
`)},
	{name: "missing side_effect_class", files: one("tools.yaml", `
- {kind: Tool, tool_id: tool:fs-read}   # want error "side_effect_class is required"
`)},
	{name: "unknown side_effect_class", files: one("tools.yaml", `
- {kind: Tool, tool_id: tool:fs-read, side_effect_class: harmless}   # want error "unknown side_effect_class"
`)},
	{name: "ceiling entry that is not a tool id", files: one("agents.yaml", base+`
- kind: Agent
  agent_id: other
  tool_permissions:
    - {tool_id: fs_read, side_effect_class: read}   # want error "is not a tool id"
- {kind: RuntimePolicy, agent_id: other, deployment_mode: production, tool_authorization_policy: {active_tool_set: all}}
`)},
	{name: "ceiling naming an unknown tool", files: one("agents.yaml", base+`
- kind: Agent
  agent_id: checker
  tool_permissions:
    - {tool_id: tool:fs-read, side_effect_class: read}
    - {tool_id: tool:fs-fetch, side_effect_class: read}   # want error "unknown tool tool:fs-fetch"
- {kind: RuntimePolicy, agent_id: checker, deployment_mode: production, tool_authorization_policy: {active_tool_set: all}}
`)},
	{name: "ceiling naming an upstream tool", opts: &policy.ValidateOptions{UpstreamProviders: map[string]bool{"gh": true}}, files: one("agents.yaml", base+`
- kind: Agent
  agent_id: other
  tool_permissions:
    - {tool_id: tool:gh-search, side_effect_class: read}   # want warning "upstream \"gh\""
- {kind: RuntimePolicy, agent_id: other, deployment_mode: production, tool_authorization_policy: {active_tool_set: all}}
`)},
	{name: "ceiling class lower than the tool's", files: one("agents.yaml", base+`
- kind: Agent
  agent_id: writer
  tool_permissions:
    - {tool_id: tool:fs-write, side_effect_class: read}   # want error "lower than the tool's own write"
- {kind: RuntimePolicy, agent_id: writer, deployment_mode: production, tool_authorization_policy: {active_tool_set: all}}
`)},
	{name: "ceiling entry listed twice", files: one("agents.yaml", base+`
- kind: Agent
  agent_id: twice
  tool_permissions:
    - {tool_id: tool:fs-read, side_effect_class: read}
    - {tool_id: tool:fs-read, side_effect_class: read}   # want error "appears twice"
- {kind: RuntimePolicy, agent_id: twice, deployment_mode: production, tool_authorization_policy: {active_tool_set: all}}
`)},
	{name: "bad approval tier", files: one("agents.yaml", base+`
- kind: Agent
  agent_id: tiered
  tool_permissions:
    - {tool_id: tool:fs-read, side_effect_class: read, approval_tier: manual}   # want error "must be auto, policy or hitl"
- {kind: RuntimePolicy, agent_id: tiered, deployment_mode: production, tool_authorization_policy: {active_tool_set: all}}
`)},
	{name: "callable_as_tool false agent reachable through a2a_agent", files: one("agents.yaml", base+`
- kind: Agent
  agent_id: auditor
  callable_as_tool: false
- {kind: Tool, tool_id: tool:auditor-invoke, side_effect_class: none, a2a_agent: auditor}
- kind: Agent
  agent_id: reporter
  tool_permissions:
    - {tool_id: tool:auditor-invoke, side_effect_class: none}   # want error "callable_as_tool: false"
- {kind: RuntimePolicy, agent_id: reporter, deployment_mode: production, tool_authorization_policy: {active_tool_set: all}}
`)},
	{name: "a2a_agent naming no agent", files: one("agents.yaml", base+`
- {kind: Tool, tool_id: tool:ghost-invoke, side_effect_class: none, a2a_agent: ghost}   # want error "is not a declared Agent"
- kind: Agent
  agent_id: caller
  tool_permissions:
    - {tool_id: tool:ghost-invoke, side_effect_class: none}
- {kind: RuntimePolicy, agent_id: caller, deployment_mode: production, tool_authorization_policy: {active_tool_set: all}}
`)},
	{name: "agent without a runtime policy", files: one("agents.yaml", base+`
- kind: Agent                 # want warning "has no RuntimePolicy"
  agent_id: idle
  tool_permissions:
    - {tool_id: tool:fs-read, side_effect_class: read}
`)},
	{name: "check position agent with tools", files: one("agents.yaml", base+`
- kind: Agent                 # want error "must be tool-less"
  agent_id: judge
  check_position: true
  tool_permissions:
    - {tool_id: tool:fs-read, side_effect_class: read}
- {kind: RuntimePolicy, agent_id: judge, deployment_mode: production, tool_authorization_policy: {active_tool_set: all}}
`)},
	{name: "tool_grants entry outside the ceiling", files: one("runtime.yaml", base+`
- kind: RuntimePolicy         # want warning "tool_grants entry tool:fs-write is outside the agent's ceiling"
  agent_id: worker
  deployment_mode: development
  tool_authorization_policy:
    active_tool_set: declared
    tool_grants: [tool:fs-read, tool:fs-write]
`)},
	{name: "tool_grants entry matching no tool", files: one("runtime.yaml", base+`
- kind: RuntimePolicy         # want warning "tool_grants entry tool:fs-raed matches no tool"
  agent_id: worker
  deployment_mode: development
  tool_authorization_policy:
    active_tool_set: declared
    tool_grants: [tool:fs-read, tool:fs-raed]
`)},
	{name: "tool_suspensions entry outside the ceiling", files: one("runtime.yaml", base+`
- kind: RuntimePolicy         # want error "tool_suspensions entry tool:fs-write is outside the agent's ceiling, so it suspends nothing (did you mean tool:fs-read?)"
  agent_id: worker
  deployment_mode: development
  tool_authorization_policy:
    active_tool_set: restricted
    tool_suspensions: [tool:fs-write]
`)},
	{name: "tool_suspensions entry matching no tool", files: one("runtime.yaml", base+`
- kind: RuntimePolicy         # want error "tool_suspensions entry tool:fs-raed matches no tool (a typo?): the tool you meant is NOT suspended (did you mean tool:fs-read?)"
  agent_id: worker
  deployment_mode: development
  tool_authorization_policy:
    active_tool_set: restricted
    tool_suspensions: [tool:fs-raed]
`)},
	{name: "tool_grants entry that is not a tool id", files: one("runtime.yaml", base+`
- kind: RuntimePolicy         # want error "tool_grants entry \"fs_read\" is not a tool id"
  agent_id: worker
  deployment_mode: development
  tool_authorization_policy:
    active_tool_set: declared
    tool_grants: [fs_read]
`)},
	{name: "tool_grants with restricted", files: one("runtime.yaml", base+`
- kind: RuntimePolicy         # want error "tool_grants only apply with active_tool_set: declared"
  agent_id: worker
  deployment_mode: development
  tool_authorization_policy:
    active_tool_set: restricted
    tool_grants: [tool:fs-read]
`)},
	{name: "tool_grants with all", files: one("runtime.yaml", base+`
- kind: RuntimePolicy         # want error "tool_grants only apply with active_tool_set: declared"
  agent_id: worker
  deployment_mode: development
  tool_authorization_policy:
    active_tool_set: all
    tool_grants: [tool:fs-read]
`)},
	{name: "tool_suspensions with declared", files: one("runtime.yaml", base+`
- kind: RuntimePolicy         # want error "tool_suspensions do not apply with active_tool_set: declared"
  agent_id: worker
  deployment_mode: development
  tool_authorization_policy:
    active_tool_set: declared
    tool_grants: [tool:fs-read]
    tool_suspensions: [tool:fs-read]
`)},
	{name: "missing active_tool_set", files: one("runtime.yaml", base+`
- kind: RuntimePolicy         # want error "active_tool_set is required"
  agent_id: worker
  deployment_mode: development
  tool_authorization_policy: {}
`)},
	{name: "two runtime policies for one agent and mode", files: one("runtime.yaml", base+`
- kind: RuntimePolicy         # want error "two RuntimePolicies for agent worker in deployment mode production"
  agent_id: worker
  deployment_mode: production
  tool_authorization_policy: {active_tool_set: all}
`)},
	{name: "runtime policy for an unknown agent", files: one("runtime.yaml", base+`
- {kind: RuntimePolicy, agent_id: nobody, deployment_mode: production, tool_authorization_policy: {active_tool_set: all}}   # want error "unknown agent nobody"
`)},
	{name: "bad trust tier", files: one("runtime.yaml", base+`
- kind: RuntimePolicy         # want error "must be trusted, provisional or untrusted"
  agent_id: worker
  deployment_mode: development
  tool_authorization_policy:
    active_tool_set: all
    a2a_tool_policy: {default_trust_tier: maybe}
`)},
	{name: "instance suspension matching no tool", files: one("instances.yaml", base+`
- kind: Instance              # want error "tool_suspensions entry tool:fs-raed matches no tool in any agent's ceiling"
  instance_id: acme
  environment_overrides:
    staging: {tool_suspensions: [tool:fs-raed]}
`)},
	{name: "duplicate instance", files: one("instances.yaml", base+`
- {kind: Instance, instance_id: acme}
- {kind: Instance, instance_id: acme}   # want error "duplicate Instance acme"
`)},
	{name: "delegation asking for more than the delegator holds", files: one("principals.yaml", base+`
- kind: Principal
  principal_id: user:owner
  grants:
    - {resource: tool, action: invoke, scope: {tool: fs.read}}
- kind: Principal             # want warning "which its delegator user:owner does not hold"
  principal_id: svc:scheduler
  delegated_from: user:owner
  grants:
    - {resource: tool, action: invoke, scope: all}
`)},
	{name: "delegation from an undeclared principal", files: one("principals.yaml", base+`
- kind: Principal             # want error "delegated_from user:ghost is not a declared Principal"
  principal_id: svc:scheduler
  delegated_from: user:ghost
`)},
	{name: "delegation cycle", files: one("principals.yaml", base+`
- {kind: Principal, principal_id: a, delegated_from: b}   # want error "delegation cycle"
- {kind: Principal, principal_id: b, delegated_from: a}   # want error "delegation cycle"
`)},
	{name: "unknown role", files: one("principals.yaml", base+`
- {kind: Principal, principal_id: user:bob, roles: [maintainer]}   # want error "unknown role maintainer"
`)},
	{name: "grant without scope", files: one("principals.yaml", base+`
- kind: Principal
  principal_id: user:bob
  grants:
    - {resource: tool, action: invoke}   # want error "scope is required"
`)},
	{name: "grant scope naming no tool", files: one("principals.yaml", base+`
- kind: Principal
  principal_id: user:bob
  grants:
    - {resource: tool, action: invoke, scope: {tool: fs_raed}}   # want error "matches no tool: it is neither declared nor in any ceiling (did you mean tool:fs-read?)"
`)},
	{name: "grant condition that does not compile", files: one("principals.yaml", base+`
- kind: Principal
  principal_id: user:bob
  grants:
    - {resource: tool, action: invoke, scope: all, when: 'args.amount <='}   # want error "does not compile"
`)},
	{name: "role grant condition that is not boolean", files: one("principals.yaml", base+`
- kind: Role
  role_id: maintainer
  grants:
    - resource: tool          # want error "want bool"
      action: invoke
      scope: all
      when: 'args.amount + 1'
`)},
	{name: "tool policy condition that is not boolean", files: one("policies.yaml", base+`
- kind: ToolPolicy
  name: limits
  conditions:
    - tools: [tool:fs-read]   # want error "has type string, want bool"
      when: '"yes"'
`)},
	{name: "policy guard condition that does not compile", files: one("policies.yaml", base+guarded+`
- kind: ToolPolicy
  name: guard
  policy_guard:
    - {tools: [tool:fs-read], when: 'amount < 3', effect: allow}   # want error "does not compile"
`)},
	{name: "escalation rule condition that does not compile", files: one("policies.yaml", base+`
- kind: ToolPolicy
  name: escalate
  escalation_rules:
    - {tools: [tool:fs-read], when: 'args.x >'}   # want error "escalation_rules[0] when"
`)},
	{name: "policy guard effect", files: one("policies.yaml", base+guarded+`
- kind: ToolPolicy
  name: guard
  policy_guard:
    - {tools: [tool:fs-read], effect: maybe}   # want error "must be allow, deny or escalate"
`)},
	{name: "glob not over tool ids", files: one("policies.yaml", base+`
- kind: ToolPolicy            # want error "starts with tool:"
  name: globs
  denied: ["*-delete-*"]
`)},
	{name: "unknown field with its path", files: one("agents.yaml", base+`
- kind: Agent
  agent_id: other
  tool_permissions:
    - {tool_id: tool:fs-read, side_effect_class: read}
    - tool_id: tool:fs-write
      side_effect_class: write
      tier: auto              # want error "Agent.tool_permissions[1].tier: unknown field"
`)},
	{name: "unknown nested field in a map", files: one("instances.yaml", base+`
- kind: Instance
  instance_id: acme
  environment_overrides:
    staging:
      tool_suspension: [tool:fs-read]   # want error "Instance.environment_overrides.staging.tool_suspension: unknown field"
`)},
	{name: "unknown field in a scope", files: one("principals.yaml", base+`
- kind: Principal
  principal_id: user:bob
  grants:
    - {resource: tool, action: invoke, scope: {tool: fs_read, when: x}}   # want error "scope: unknown field \"when\""
`)},
	{name: "unknown kind", files: one("extra.yaml", base+`
- kind: Tools                 # want error "unknown kind \"Tools\""
  tool_id: tool:fs-list
`)},
	{name: "document without kind", files: one("extra.yaml", base+`
- {tool_id: tool:fs-list, side_effect_class: read}   # want error "document has no kind"
`)},
	{name: "duplicate YAML key", files: one("tools.yaml", base+`
- kind: Tool
  tool_id: tool:fs-list
  side_effect_class: read
  side_effect_class: none     # want error "already defined"
`)},
	{name: "duplicate kind key", files: one("tools.yaml", base+`
- kind: Tool
  kind: Agent                 # want error "kind"
  agent_id: sneaky
`)},
	{name: "YAML syntax error", files: one("broken.yaml", base+`
- kind: Tool
  tool_id: tool:fs-list
  side_effect_class: read: none   # want error "mapping values are not allowed"
`)},
	// yaml.v3 reports its parser's errors (as opposed to its scanner's) at
	// the 0-based line of the construct, one line too early.
	{name: "YAML parser error names the line of the construct", files: one("broken.yaml", base+`
- kind: Tool
  tool_id: [tool:fs-list      # want error "did not find expected"
`)},
	{name: "YAML parser error on a misindented entry", files: one("broken.yaml", base+`
- kind: Tool
  tool_id: tool:fs-list
 - kind: Tool                 # want error "did not find expected '-' indicator"
`)},
	{name: "YAML alias", files: one("tools.yaml", base+`
- kind: Tool
  tool_id: tool:fs-list
  side_effect_class: read
  input_schema: &schema {type: object}
  output_schema: *schema      # want error "aliases are not allowed"
`)},
	{name: "bad duration", files: one("tools.yaml", base+`
- kind: Tool
  tool_id: tool:fs-list
  side_effect_class: read
  timeout: forever            # want error "is not a duration"
`)},
	{name: "control_flow_tools entry naming no tool", files: one("settings.yaml", base+`
- {kind: Settings, control_flow_tools: [tool:task-complete]}   # want error "is not a declared Tool"
`)},
	{name: "two settings documents", files: one("settings.yaml", base+`
- {kind: Settings, result_max_kib: 64}
- {kind: Settings, result_max_kib: 32}   # want error "more than one Settings document"
`)},
}

func TestValidate(t *testing.T) { runValidateCases(t, validateCases) }

// runValidateCases checks that each case produces exactly the diagnostics
// its markers name.
func runValidateCases(t *testing.T, cases []validateCase) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			want := markers(c.files)
			if len(want) == 0 && !c.clean {
				t.Fatal("case has no # want markers")
			}
			if len(want) > 0 && c.clean {
				t.Fatal("a clean case has # want markers")
			}
			b := &policy.Bundle{}
			for _, f := range c.files {
				b.AddYAML(f.name, []byte(f.body))
			}
			rep := b.Validate(c.opts)
			var got []policy.Diagnostic
			gotKeys := []diagKey{}
			for _, sev := range []struct {
				name string
				ds   []policy.Diagnostic
			}{{"error", rep.Errors}, {"warning", rep.Warnings}} {
				for _, d := range sev.ds {
					got = append(got, d)
					gotKeys = append(gotKeys, diagKey{sev.name, d.File, d.Line})
				}
			}
			wantKeys := make([]diagKey, len(want))
			for i, w := range want {
				wantKeys[i] = w.diagKey
			}
			sortKeys := func(ks []diagKey) {
				slices.SortFunc(ks, func(a, b diagKey) int {
					return strings.Compare(fmt.Sprint(a), fmt.Sprint(b))
				})
			}
			sortKeys(wantKeys)
			sortKeys(gotKeys)
			if diff := cmp.Diff(wantKeys, gotKeys); diff != "" {
				t.Fatalf("diagnostics (-want +got):\n%s\nerrors: %v\nwarnings: %v", diff, rep.Errors, rep.Warnings)
			}
			for _, w := range want {
				found := false
				for i, d := range got {
					if gotKeys[i] == w.diagKey && strings.Contains(d.Message, w.mention) {
						found = true
					}
				}
				if !found {
					t.Errorf("no %s at %s:%d mentions %q; errors: %v; warnings: %v", w.Severity, w.File, w.Line, w.mention, rep.Errors, rep.Warnings)
				}
			}
			if rep.OK() != (len(rep.Errors) == 0) {
				t.Errorf("OK() = %v with %d errors", rep.OK(), len(rep.Errors))
			}
			if (rep.Err() == nil) != rep.OK() {
				t.Errorf("Err() = %v, OK() = %v", rep.Err(), rep.OK())
			}
		})
	}
}

// TestValidateBase checks that the fragment the cases build on is clean,
// so every diagnostic in a case comes from what the case adds.
func TestValidateBase(t *testing.T) {
	b := &policy.Bundle{}
	b.AddYAML("base.yaml", []byte(base))
	rep := b.Validate(nil)
	if diff := cmp.Diff(&policy.Report{Errors: []policy.Diagnostic{}, Warnings: []policy.Diagnostic{}}, rep); diff != "" {
		t.Errorf("base bundle report (-want +got):\n%s", diff)
	}
}

func TestValidateExampleBundle(t *testing.T) {
	b, err := policy.LoadDir(filepath.Join("..", "examples", "bundle"))
	if err != nil {
		t.Fatal(err)
	}
	rep := b.Validate(nil)
	if !rep.OK() {
		t.Errorf("examples/bundle: errors %v", rep.Errors)
	}
}

func TestValidateSortsByFileAndLine(t *testing.T) {
	b := &policy.Bundle{}
	b.AddYAML("b.yaml", []byte("- {kind: Nope}\n- {kind: Nope}\n"))
	b.AddYAML("a.yaml", []byte("\n\n- {kind: Nope}\n"))
	b.AddYAML("a.yaml", []byte("- {kind: Nope}\n"))
	rep := b.Validate(nil)
	var got []string
	for _, d := range rep.Errors {
		got = append(got, fmt.Sprintf("%s:%d", d.File, d.Line))
	}
	want := []string{"a.yaml:1", "a.yaml:3", "b.yaml:1", "b.yaml:2"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("error order (-want +got):\n%s", diff)
	}
}

func TestLoadDir(t *testing.T) {
	cases := []struct {
		name string
		dir  string
		want []policy.Diagnostic // errors; messages are matched as substrings
	}{
		{"names of two files map to one id", filepath.Join("testdata", "two-files"), []policy.Diagnostic{
			{File: filepath.Join("testdata", "two-files", "b.yaml"), Line: 3,
				Message: `"fs.read" (` + filepath.Join("testdata", "two-files", "a.yaml") + `:3) and "fs_read" map to the same tool id tool:fs-read`},
		}},
		{"folder without YAML files", filepath.Join("testdata", "empty"), []policy.Diagnostic{
			{File: filepath.Join("testdata", "empty"), Message: "no *.yaml files"},
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b, err := policy.LoadDir(c.dir)
			if err != nil {
				t.Fatal(err)
			}
			rep := b.Validate(nil)
			got := slices.Clone(rep.Errors)
			for i := range got {
				if i < len(c.want) && strings.Contains(got[i].Message, c.want[i].Message) {
					got[i].Message = c.want[i].Message
				}
			}
			if diff := cmp.Diff(c.want, got); diff != "" {
				t.Errorf("errors (-want +got):\n%s", diff)
			}
		})
	}
	if _, err := policy.LoadDir(filepath.Join("testdata", "no-such-folder")); err == nil {
		t.Error("LoadDir of a missing folder returned no error")
	}
}
