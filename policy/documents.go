package policy

import (
	"fmt"
	"reflect"
	"time"

	"go.yaml.in/yaml/v3"
)

// Pos is where a document or entry stands in its bundle file. The loader
// fills it; it is never read from YAML.
type Pos struct {
	File string `yaml:"-" json:"-"`
	Line int    `yaml:"-" json:"-"`
}

// At formats the position as "file:line".
func (p Pos) At() string { return fmt.Sprintf("%s:%d", p.File, p.Line) }

// Tool declares one tool of the catalog (kind: Tool). Synedrix "Tool ID
// convention"; docs/design.md, "Vocabulary".
type Tool struct {
	Pos `yaml:"-"`
	// ToolID is the canonical id, "tool:<provider>-<verb>". Required unless
	// Name is given, in which case it defaults to Name's mapping.
	ToolID string `yaml:"tool_id"`
	// Name is an optional function name the model calls the tool by
	// ("fs.read"); it must map to ToolID.
	Name        string `yaml:"name"`
	Description string `yaml:"description"`
	// SideEffectClass is none, read, write or irreversible. Required.
	SideEffectClass string `yaml:"side_effect_class"`
	// ControlFlow marks a tool that reaches no external system (AgentArea's
	// task_complete, request_user_input): always disclosed, never gated by
	// tool policy, grants, conditions or approval.
	ControlFlow bool `yaml:"control_flow"`
	// Idempotent lets a write tool retry on transient failures.
	Idempotent bool       `yaml:"idempotent"`
	Source     ToolSource `yaml:"source"`
	// A2AAgent names the agent this tool invokes (agent-to-agent
	// delegation); that agent must be callable_as_tool.
	A2AAgent     string    `yaml:"a2a_agent"`
	InputSchema  any       `yaml:"input_schema"`
	OutputSchema any       `yaml:"output_schema"`
	Timeout      Duration  `yaml:"timeout"`
	Retry        RetrySpec `yaml:"retry"`
}

// ToolSource says where a tool runs: an MCP server (upstream) name, a
// built-in function name, or an HTTP endpoint. All empty means the tool is
// only declared (an agent runtime executes it itself).
type ToolSource struct {
	MCPServer string `yaml:"mcp_server"`
	Builtin   string `yaml:"builtin"`
	HTTP      string `yaml:"http"`
}

// RetrySpec bounds tool-call-level retries (Tool Abstraction seed,
// "Retries"). Zero values mean the gateway's defaults.
type RetrySpec struct {
	MaxAttempts    int      `yaml:"max_attempts"`
	InitialBackoff Duration `yaml:"initial_backoff"`
	MaxBackoff     Duration `yaml:"max_backoff"`
}

// Agent declares an agent and its capability ceiling (kind: Agent).
// Synedrix §2; Wyrd "Selecting tools".
type Agent struct {
	Pos           `yaml:"-"`
	AgentID       string `yaml:"agent_id"`
	Version       string `yaml:"version"`
	RuntimeEngine string `yaml:"runtime_engine"`
	Description   string `yaml:"description"`
	// CallableAsTool defaults to true; false forbids any ceiling from
	// reaching this agent through an A2A tool (Synedrix invariant 5).
	CallableAsTool *bool `yaml:"callable_as_tool"`
	// ToolPermissions is the capability ceiling: the hard upper bound.
	ToolPermissions []ToolPermission `yaml:"tool_permissions"`
	// ResourcePermissions is the ceiling of upstream resources the agent
	// may reach (docs/design.md, "Resources and prompts"). Left out (nil),
	// an upstream's resources are reachable when one of that upstream's
	// tools is disclosed to the caller, and no mcp_resource grant is
	// needed; declared, only the resources its entries cover are, and the
	// principal needs an mcp_resource:read grant. An empty list
	// (resource_permissions: []) declares that no resource is reachable.
	ResourcePermissions []ResourcePermission `yaml:"resource_permissions"`
	// PromptPermissions is the same for prompts (a prompt:get grant).
	PromptPermissions []PromptPermission `yaml:"prompt_permissions"`
	// Workspace is the folder the agent's fs.* tools reach (Wyrd).
	Workspace string `yaml:"workspace"`
	// CheckPosition marks an agent that judges others' work: it must be
	// tool-less (Wyrd).
	CheckPosition bool `yaml:"check_position"`
}

// ToolPermission is one ceiling entry.
type ToolPermission struct {
	Pos             `yaml:"-"`
	ToolID          string `yaml:"tool_id"`
	SideEffectClass string `yaml:"side_effect_class"`
	// ApprovalTier is auto, policy (Policy Guard) or hitl (human). Default auto.
	ApprovalTier string `yaml:"approval_tier"`
}

// ResourcePermission is one resource ceiling entry: the resources of one
// upstream that one uri covers.
type ResourcePermission struct {
	Pos `yaml:"-"`
	// Upstream is the upstream (an Upstream's name, or a Tool's
	// source.mcp_server) whose resources the entry covers. Required.
	Upstream string `yaml:"upstream"`
	// URI is an exact URI, or an RFC 6570 template as the upstream lists
	// it ("file:///docs/{+path}"), which covers the URIs it matches and
	// that template itself (uris.go). Required.
	URI string `yaml:"uri"`
	// ApprovalTier is auto, policy (Policy Guard) or hitl (human). Default
	// auto. When several entries cover an access, each one's tier applies
	// (the Policy Guard judges it if one is policy, a human approves it if
	// one is hitl).
	ApprovalTier string `yaml:"approval_tier"`
}

// PromptPermission is one prompt ceiling entry: one prompt of one upstream.
type PromptPermission struct {
	Pos `yaml:"-"`
	// Upstream is the upstream whose prompt it is. Required.
	Upstream string `yaml:"upstream"`
	// Prompt is the upstream's own name of the prompt (without the
	// tool_prefix the model sees). Required.
	Prompt string `yaml:"prompt"`
	// ApprovalTier is auto, policy or hitl. Default auto.
	ApprovalTier string `yaml:"approval_tier"`
}

// ResourceSelector selects upstream resources in a rule or a suspension:
// every resource (and resource template) of Upstream, or, with URI, those
// URI covers as a ResourcePermission's uri does.
type ResourceSelector struct {
	Pos      `yaml:"-"`
	Upstream string `yaml:"upstream"`
	URI      string `yaml:"uri"`
}

// String formats the selector as written.
func (s ResourceSelector) String() string {
	if s.URI == "" {
		return "{upstream: " + s.Upstream + "}"
	}
	return "{upstream: " + s.Upstream + ", uri: " + s.URI + "}"
}

// PromptSelector selects upstream prompts in a rule or a suspension: every
// prompt of Upstream, or, with Prompt, the one of that name (the
// upstream's own).
type PromptSelector struct {
	Pos      `yaml:"-"`
	Upstream string `yaml:"upstream"`
	Prompt   string `yaml:"prompt"`
}

// String formats the selector as written.
func (s PromptSelector) String() string {
	if s.Prompt == "" {
		return "{upstream: " + s.Upstream + "}"
	}
	return "{upstream: " + s.Upstream + ", prompt: " + s.Prompt + "}"
}

// RuntimePolicy restricts an agent's ceiling for one deployment mode (kind:
// RuntimePolicy). Synedrix Agent Runtime Policy Spec.
type RuntimePolicy struct {
	Pos                     `yaml:"-"`
	AgentID                 string                  `yaml:"agent_id"`
	DeploymentMode          string                  `yaml:"deployment_mode"`
	ToolAuthorizationPolicy ToolAuthorizationPolicy `yaml:"tool_authorization_policy"`
}

// ToolAuthorizationPolicy is the runtime restriction layer.
type ToolAuthorizationPolicy struct {
	// ActiveToolSet is all (the ceiling passes), declared (only ToolGrants)
	// or restricted (the ceiling minus ToolSuspensions). Required.
	ActiveToolSet   string        `yaml:"active_tool_set"`
	ToolGrants      []string      `yaml:"tool_grants"`
	ToolSuspensions []string      `yaml:"tool_suspensions"`
	MCPToolPolicy   MCPToolPolicy `yaml:"mcp_tool_policy"`
	A2AToolPolicy   A2AToolPolicy `yaml:"a2a_tool_policy"`
}

// MCPToolPolicy governs MCP-backed tools, and the resources and prompts
// of MCP servers.
type MCPToolPolicy struct {
	// AllowedServers, when non-empty, is the only servers whose tools,
	// resources and prompts pass.
	AllowedServers []string `yaml:"allowed_servers"`
	// DeniedServers removes every tool, resource and prompt of these
	// servers.
	DeniedServers []string `yaml:"denied_servers"`
	// MCPWriteApprovalRequired (default true) makes every MCP tool of class
	// write or higher need approval.
	MCPWriteApprovalRequired *bool `yaml:"mcp_write_approval_required"`
}

// A2AToolPolicy governs tools that invoke another agent.
type A2AToolPolicy struct {
	// AllowedPartners, when non-empty, is the only agents A2A tools may reach.
	AllowedPartners []string `yaml:"allowed_partners"`
	// TrustTiers maps partner agent id to trusted, provisional or untrusted.
	TrustTiers map[string]string `yaml:"trust_tiers"`
	// DefaultTrustTier applies to partners missing from TrustTiers; default
	// provisional (calls need approval). untrusted partners are denied.
	DefaultTrustTier string `yaml:"default_trust_tier"`
}

// Instance is a business instance (tenant) with per-environment overrides
// that may only suspend more tools (kind: Instance). Synedrix §4.
type Instance struct {
	Pos                  `yaml:"-"`
	InstanceID           string                         `yaml:"instance_id"`
	Name                 string                         `yaml:"name"`
	EnvironmentOverrides map[string]EnvironmentOverride `yaml:"environment_overrides"`
}

// EnvironmentOverride narrows the active set in one environment.
type EnvironmentOverride struct {
	ToolSuspensions []string `yaml:"tool_suspensions"`
	// ResourceSuspensions make the resources they select unreachable in
	// this environment.
	ResourceSuspensions []ResourceSelector `yaml:"resource_suspensions"`
	// PromptSuspensions make the prompts they select unreachable.
	PromptSuspensions []PromptSelector `yaml:"prompt_suspensions"`
}

// Principal is a subject a call runs as (kind: Principal). Wyrd "Whose
// authority".
type Principal struct {
	Pos         `yaml:"-"`
	PrincipalID string   `yaml:"principal_id"`
	Description string   `yaml:"description"`
	Roles       []string `yaml:"roles"`
	Grants      []Grant  `yaml:"grants"`
	// DelegatedFrom names the delegator: the effective grants are the
	// intersection with the delegator's, never wider.
	DelegatedFrom string `yaml:"delegated_from"`
}

// Role groups grants (kind: Role).
type Role struct {
	Pos         `yaml:"-"`
	RoleID      string  `yaml:"role_id"`
	Description string  `yaml:"description"`
	Grants      []Grant `yaml:"grants"`
}

// Grant is {resource, action, scope}, optionally with a CEL condition.
// resource "tool" with action "invoke" is the tool:invoke grant;
// mcp_resource with action read lets the principal read and subscribe to
// an upstream's resources, and prompt with action get lets it get an
// upstream's prompts, for agents whose resource (prompt) ceiling is
// declared (docs/design.md, "Resources and prompts"); any other resource
// is checked against what a call touches (docs/design.md, "The decision" check 8).
type Grant struct {
	Pos      `yaml:"-"`
	Resource string `yaml:"resource"`
	Action   string `yaml:"action"`
	Scope    Scope  `yaml:"scope"`
	// When is a CEL expression over args, principal, agent, tool, env,
	// resource and prompt that must hold for the grant to apply.
	When string `yaml:"when"`
}

// The resources and actions of resource and prompt grants.
const (
	ResourceMCPResource = "mcp_resource"
	ActionRead          = "read"
	ResourcePrompt      = "prompt"
	ActionGet           = "get"
)

// Scope is "all", {tool: NAME} (an exact tool, any spelling that maps to
// its id), {name: NAME} (a resource name covering itself and the
// dot-separated names below it), or, for the mcp_resource and prompt
// resources, {upstream: U} (every resource or prompt of upstream U),
// {upstream: U, uri: URI} (mcp_resource: the resources of U that URI, an
// exact URI or a template, covers: uris.go) or {upstream: U, prompt: P}
// (prompt: U's own prompt P). An upstream is its own field, never joined
// into a name, so a scope of one upstream never covers another's.
type Scope struct {
	All      bool
	Tool     string
	Name     string
	Upstream string
	URI      string
	Prompt   string
}

const scopeShapes = `"all", {tool: NAME}, {name: NAME}, {upstream: U}, {upstream: U, uri: URI} or {upstream: U, prompt: NAME}`

// UnmarshalYAML accepts the shapes Scope lists.
func (s *Scope) UnmarshalYAML(n *yaml.Node) error {
	switch n.Kind {
	case yaml.ScalarNode:
		if n.Value == "all" || n.Value == "*" {
			*s = Scope{All: true}
			return nil
		}
		return fmt.Errorf("line %d: scope %q: want %s", n.Line, n.Value, scopeShapes)
	case yaml.MappingNode:
		var m struct {
			Tool     string `yaml:"tool"`
			Name     string `yaml:"name"`
			Upstream string `yaml:"upstream"`
			URI      string `yaml:"uri"`
			Prompt   string `yaml:"prompt"`
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			switch k := n.Content[i].Value; k {
			case "tool", "name", "upstream", "uri", "prompt":
			default:
				return fmt.Errorf("line %d: scope: unknown field %q (want tool, name, upstream, uri or prompt)", n.Content[i].Line, k)
			}
		}
		if err := n.Decode(&m); err != nil {
			return err
		}
		kinds := 0
		for _, v := range []string{m.Tool, m.Name, m.Upstream} {
			if v != "" {
				kinds++
			}
		}
		switch {
		case (m.URI != "" || m.Prompt != "") && m.Upstream == "":
			return fmt.Errorf("line %d: scope: uri and prompt name something of an upstream: give upstream too", n.Line)
		case kinds != 1:
			return fmt.Errorf("line %d: scope: give exactly one of tool, name or upstream (want %s)", n.Line, scopeShapes)
		case m.URI != "" && m.Prompt != "":
			return fmt.Errorf("line %d: scope: give uri (an mcp_resource scope) or prompt (a prompt scope), not both", n.Line)
		}
		*s = Scope{Tool: m.Tool, Name: m.Name, Upstream: m.Upstream, URI: m.URI, Prompt: m.Prompt}
		return nil
	}
	return fmt.Errorf("line %d: scope: want %s", n.Line, scopeShapes)
}

// String formats the scope as written.
func (s Scope) String() string {
	switch {
	case s.All:
		return "all"
	case s.Tool != "":
		return "{tool: " + s.Tool + "}"
	case s.Name != "":
		return "{name: " + s.Name + "}"
	case s.Upstream != "" && s.URI != "":
		return "{upstream: " + s.Upstream + ", uri: " + s.URI + "}"
	case s.Upstream != "" && s.Prompt != "":
		return "{upstream: " + s.Upstream + ", prompt: " + s.Prompt + "}"
	case s.Upstream != "":
		return "{upstream: " + s.Upstream + "}"
	}
	return "{}"
}

// Empty reports whether the scope names nothing (no shape was given).
func (s Scope) Empty() bool { return s == Scope{} }

// ToolPolicy holds AgentArea-style rules over tool ids (kind: ToolPolicy),
// applied in docs/design.md, "The decision" checks 6, 9 and 11. Conditions, escalation rules
// and Policy Guard rules may also select upstream resources and prompts
// (resources, prompts), and requires_human_approval covers their accesses
// too (docs/design.md, "Resources and prompts").
type ToolPolicy struct {
	Pos       `yaml:"-"`
	Name      string    `yaml:"name"`
	AppliesTo AppliesTo `yaml:"applies_to"`
	// Denied globs over tool ids ("tool:*-delete-*"): a match denies.
	Denied []string `yaml:"denied"`
	// Allowed, when non-empty, is an allowlist: a tool matching none is denied.
	Allowed []string `yaml:"allowed"`
	// EscalationRules send matching calls to approval.
	EscalationRules []EscalationRule `yaml:"escalation_rules"`
	// RequiresHumanApproval sends every call this policy applies to to
	// approval, and every resource and prompt access of those agents.
	RequiresHumanApproval bool `yaml:"requires_human_approval"`
	// Conditions must hold for matching tools, or the call is denied.
	Conditions []Condition `yaml:"conditions"`
	// PolicyGuard rules judge calls of tools whose approval_tier is policy:
	// the first matching rule allows, denies or escalates; none matching
	// escalates.
	PolicyGuard []GuardRule `yaml:"policy_guard"`
}

// AppliesTo selects where a ToolPolicy applies; an empty list matches all.
type AppliesTo struct {
	Agents          []string `yaml:"agents"`
	Instances       []string `yaml:"instances"`
	Environments    []string `yaml:"environments"`
	DeploymentModes []string `yaml:"deployment_modes"`
}

// EscalationRule is a tool glob, optionally with a CEL condition; written
// as a plain string or as {tools: [...], resources: [...], prompts: [...],
// when: EXPR}.
type EscalationRule struct {
	Pos   `yaml:"-"`
	Tools []string `yaml:"tools"`
	// Resources and Prompts select the resource and prompt accesses the
	// rule sends to approval, besides the calls of Tools.
	Resources []ResourceSelector `yaml:"resources"`
	Prompts   []PromptSelector   `yaml:"prompts"`
	When      string             `yaml:"when"`
}

// UnmarshalYAML accepts a glob string or {tools, resources, prompts, when},
// strictly (an unknown field at any depth is an error).
func (r *EscalationRule) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode {
		*r = EscalationRule{Tools: []string{n.Value}}
		return nil
	}
	type plain EscalationRule
	var p plain
	if problems := checkFields(n, reflect.TypeFor[plain](), "escalation rule"); len(problems) > 0 {
		return fmt.Errorf("line %d: %s", problems[0].line, problems[0].msg)
	}
	if err := n.Decode(&p); err != nil {
		return err
	}
	*r = EscalationRule(p)
	return nil
}

// Condition is an argument condition: for calls of matching tools, and
// accesses of matching resources and prompts, When must hold or the call
// or access is denied with Reason.
type Condition struct {
	Pos       `yaml:"-"`
	Tools     []string           `yaml:"tools"`
	Resources []ResourceSelector `yaml:"resources"`
	Prompts   []PromptSelector   `yaml:"prompts"`
	When      string             `yaml:"when"`
	Reason    string             `yaml:"reason"`
}

// GuardRule is one Policy Guard rule: Effect is allow, deny or escalate.
// It judges calls of Tools and accesses of Resources and Prompts whose
// ceiling entry has approval_tier policy.
type GuardRule struct {
	Pos       `yaml:"-"`
	Tools     []string           `yaml:"tools"`
	Resources []ResourceSelector `yaml:"resources"`
	Prompts   []PromptSelector   `yaml:"prompts"`
	When      string             `yaml:"when"`
	Effect    string             `yaml:"effect"`
	Reason    string             `yaml:"reason"`
}

// Settings holds bundle-wide settings (kind: Settings; at most one).
type Settings struct {
	Pos `yaml:"-"`
	// ControlFlowTools are tool ids treated as control-flow tools in
	// addition to those marked control_flow.
	ControlFlowTools []string `yaml:"control_flow_tools"`
	// DefaultPrincipal is used by the CLI when --principal is absent.
	DefaultPrincipal string `yaml:"default_principal"`
	// DefaultDeploymentMode applies when a call names none; default production.
	DefaultDeploymentMode string `yaml:"default_deployment_mode"`
	// ApprovalTTL is how long an approval stays usable; default 15m.
	ApprovalTTL Duration `yaml:"approval_ttl"`
	// ApprovalWait, when set, makes the MCP proxy hold a call that needs
	// approval open for up to this long, sending progress notifications,
	// and run it as soon as it is approved; 0 (the default) answers at once
	// with the approval id, and the client repeats the call.
	ApprovalWait Duration `yaml:"approval_wait"`
	// ResultMaxKiB caps every tool result; default 64.
	ResultMaxKiB int `yaml:"result_max_kib"`
	// Anonymous is the identity of MCP and HTTP requests that carry no
	// credential, for local use; nil means such requests get 401. A wrong
	// credential is refused even when this is set.
	Anonymous *Identity `yaml:"anonymous"`
	// AllowedOrigins are the browser Origin values the gateway accepts
	// besides loopback ones (DNS rebinding protection).
	AllowedOrigins []string `yaml:"allowed_origins"`
	// JWTIssuers are the identity providers whose bearer JWTs the MCP
	// proxy and the JSON API accept besides API keys (identity_docs.go).
	JWTIssuers []JWTIssuer `yaml:"jwt_issuers"`
	// Delegations configures the gateway's delegation tokens
	// (identity_docs.go).
	Delegations DelegationSettings `yaml:"delegations"`
}

// Duration is a time.Duration written as "30s", "15m".
type Duration time.Duration

// UnmarshalYAML parses a Go duration string.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	v, err := time.ParseDuration(n.Value)
	if err != nil || v < 0 {
		return fmt.Errorf("line %d: %q is not a duration like 30s or 15m", n.Line, n.Value)
	}
	*d = Duration(v)
	return nil
}

// D returns the value as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }
