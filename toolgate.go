// Package toolgate holds the vocabulary shared by every part of the tool
// authorization gateway: the call being decided, the decision, its verdict,
// code and layer, side-effect classes, approval tiers and event types.
//
// The decision itself is made by package authz over a snapshot compiled by
// package policy; enforcement points (package gate, the MCP proxy, the HTTP
// API, the CLI) only call it. This package imports nothing but the standard
// library, so every other package may depend on it.
package toolgate

import (
	"fmt"
	"time"
)

// Verdict is the outcome of a decision. Deny is the zero value, so a
// Decision that was never filled in denies (docs/design.md, "The decision", fail closed).
type Verdict uint8

const (
	// Deny refuses the call; nothing is executed.
	Deny Verdict = iota
	// Allow lets the call run.
	Allow
	// RequireApproval holds the call until a human or the Policy Guard
	// approves exactly this call.
	RequireApproval
)

// String returns the wire name: "deny", "allow" or "require_approval".
func (v Verdict) String() string {
	switch v {
	case Allow:
		return "allow"
	case RequireApproval:
		return "require_approval"
	default:
		return "deny"
	}
}

// MarshalText encodes the verdict as its wire name.
func (v Verdict) MarshalText() ([]byte, error) { return []byte(v.String()), nil }

// UnmarshalText decodes a wire name; anything else is an error.
func (v *Verdict) UnmarshalText(b []byte) error {
	switch string(b) {
	case "allow":
		*v = Allow
	case "deny":
		*v = Deny
	case "require_approval":
		*v = RequireApproval
	default:
		return fmt.Errorf("unknown verdict %q (want allow, deny or require_approval)", b)
	}
	return nil
}

// Code is the stable machine code of a decision (docs/design.md, "The decision"). Codes cross
// the wire and the audit log; they never change meaning.
type Code string

// Decision codes, in the order of the checks that produce them.
// unknown_resource and unknown_prompt refuse a resource or prompt access
// (Access) that no upstream owns: the caller's routing found no owner, or
// named an upstream the bundle does not know.
const (
	CodeOK                   Code = "ok"
	CodeMalformedCall        Code = "malformed_call"
	CodeAmbiguousToolName    Code = "ambiguous_tool_name"
	CodeUnknownAgent         Code = "unknown_agent"
	CodeUnknownTool          Code = "unknown_tool"
	CodeUnknownResource      Code = "unknown_resource"
	CodeUnknownPrompt        Code = "unknown_prompt"
	CodeNotInCeiling         Code = "not_in_ceiling"
	CodeNoRuntimePolicy      Code = "no_runtime_policy"
	CodeSuspendedRuntime     Code = "suspended_runtime"
	CodeNotGrantedRuntime    Code = "not_granted_runtime"
	CodeMCPServerDenied      Code = "mcp_server_denied"
	CodeA2AUntrusted         Code = "a2a_untrusted"
	CodeUnknownInstance      Code = "unknown_instance"
	CodeSuspendedInstance    Code = "suspended_instance"
	CodePolicyDenied         Code = "policy_denied"
	CodePolicyNotAllowlisted Code = "policy_not_allowlisted"
	CodeRBACToolInvoke       Code = "rbac_tool_invoke"
	CodeRBACResource         Code = "rbac_resource"
	CodeConditionFailed      Code = "condition_failed"
	CodeGuardBudget          Code = "guard_budget"
	CodeGuardSemantic        Code = "guard_semantic"
	CodeApprovalRequired     Code = "approval_required"
	CodeInternalError        Code = "internal_error"

	// Codes an adapter reports when it inspects what a call would touch.
	CodePathOutsideWorkspace Code = "path_outside_workspace"
	CodeUnsafeQuery          Code = "sql_not_read_only"
	CodeUnparsableQuery      Code = "sql_unclassifiable"
	CodeBadArguments         Code = "bad_arguments"
)

// Error is a refusal or failure that crosses a wire or the audit log: a
// stable Code, the Layer it belongs to, and a message that names what was
// refused and what would change it. Err, when set, is the underlying cause.
type Error struct {
	Code    Code
	Layer   Layer
	Message string
	Err     error
}

// Error returns "code: message".
func (e *Error) Error() string { return string(e.Code) + ": " + e.Message }

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Err }

// Layer names the part of the model that produced a decision (docs/design.md, "The decision").
type Layer string

// Layers, outermost first.
const (
	LayerNone        Layer = ""
	LayerComposition Layer = "composition"
	LayerCeiling     Layer = "ceiling"
	LayerRuntime     Layer = "runtime"
	LayerInstance    Layer = "instance"
	LayerPolicy      Layer = "policy"
	LayerGrant       Layer = "grant"
	LayerResource    Layer = "resource"
	LayerCondition   Layer = "condition"
	LayerGuard       Layer = "guard"
	LayerApproval    Layer = "approval"
	LayerInternal    Layer = "internal"
)

// EventType is the type of an audit and stream event (docs/design.md, "What the audit log promises", the
// Synedrix agent.tool.* taxonomy).
type EventType string

// Event types.
const (
	EventAuthorized        EventType = "agent.tool.authorized"
	EventUnauthorized      EventType = "agent.tool.unauthorized"
	EventSuspended         EventType = "agent.tool.suspended"
	EventApprovalRequested EventType = "agent.tool.approval_requested"
	EventApprovalGranted   EventType = "agent.tool.approval_granted"
	EventApprovalDenied    EventType = "agent.tool.approval_denied"
	EventApprovalExpired   EventType = "agent.tool.approval_expired"
	// EventApprovalDecisionRefused records an attempt to approve or deny
	// that was refused (the requester itself, or no approval:decide grant).
	EventApprovalDecisionRefused EventType = "agent.tool.approval_decision_refused"
	EventCompleted               EventType = "agent.tool.completed"
	EventFailed                  EventType = "agent.tool.failed"
	EventDefinitionChanged       EventType = "mcp.tool.definition_changed"
	EventBundleLoaded            EventType = "policy.bundle.loaded"
	EventBundleRejected          EventType = "policy.bundle.rejected"
	// EventAuthRefused records refused authentication on /mcp or the JSON
	// API (no credential where one is needed, a malformed Authorization
	// header, an unknown API key, a token that does not verify): the
	// reason, the source address and how many such refusals it stands for
	// (details count, first, last), never the credential itself.
	EventAuthRefused EventType = "gateway.auth.refused"
	// EventMethodRefused records MCP messages refused because their method
	// is not one the gateway serves or relays (method not found): the
	// method, the source address and how many such refusals it stands for.
	EventMethodRefused EventType = "gateway.method.refused"
	// EventRequestRefused records requests refused at the edge before
	// anything was decided (a refused origin, a body too large, not
	// JSON-RPC or a batch, an unknown or foreign session, a session cap),
	// with the HTTP status and reason, the source address and how many
	// such refusals it stands for (details count, first, last).
	EventRequestRefused EventType = "gateway.request.refused"
	// EventOutcomeUnknown marks an allowed call whose completion was never
	// recorded because the gateway stopped (crashed, was killed) first: the
	// call may or may not have run. Its causation_id is the allow's
	// event_id; it is written when the gateway starts again.
	EventOutcomeUnknown EventType = "agent.tool.outcome_unknown"
	// EventGatewayStarted is written when a gateway starts, before it takes
	// calls: the start of a run, from which the next start looks for calls
	// left without an outcome.
	EventGatewayStarted EventType = "gateway.started"
	// EventListServed records a list request the gateway answered
	// (tools/list, resources/list, resources/templates/list,
	// prompts/list): who asked, and in details the method, how many items
	// were shown on the page and how many of the gateway's items the
	// caller is not shown. A list refused (a cursor of another list or
	// session) is recorded with verdict deny.
	EventListServed EventType = "mcp.list.served"
	// EventLoggingLevelSet records a client's logging/setLevel: the level
	// and the upstreams it was passed on to.
	EventLoggingLevelSet EventType = "mcp.logging.level_set"
	// EventUpstreamRequest records a request an upstream sent to a client
	// while serving one of its requests (sampling/createMessage,
	// elicitation/create, roots/list): relayed (allow) or refused (deny,
	// with why: the client did not declare the capability, the request
	// cannot be attributed to one client, the method is not relayed).
	EventUpstreamRequest EventType = "mcp.upstream.request"
	// EventAuditStoreFailed records that the audit store could not write,
	// with the error and when it began; it is written once the store can
	// write again, before the events accepted during the failure.
	EventAuditStoreFailed EventType = "audit.store_failed"
	// EventAuditBacklogOverflow summarizes the events that could not be
	// recorded one by one because the audit backlog was full (mostly
	// denials, and the internal_error refusals of calls that would have
	// run): how many, the first and last time, the counts by event type
	// and by principal, agent, tool and code.
	EventAuditBacklogOverflow EventType = "audit.backlog_overflow"
	// EventGatewayStopped is the last event of a run that stopped cleanly:
	// everything it accepted was written before it (or, when the store
	// could not write at shutdown, spilled with it and written at the next
	// start). Its details name the run's gateway.started (started_seq).
	EventGatewayStopped EventType = "gateway.stopped"
	// EventGatewayUncleanStop is written at a start whose previous run has
	// no gateway.stopped: that run crashed, was killed, lost power, or
	// could not write or spill its audit events at shutdown, so events it
	// had accepted but not written may be lost. It names the previous
	// start and the last record of that run.
	EventGatewayUncleanStop EventType = "gateway.unclean_stop"
	// EventAuditEventsLost records, at a start, that the previous shutdown
	// could write its unwritten audit events neither to the store nor to
	// the spill file: how many were lost, and when.
	EventAuditEventsLost EventType = "audit.events_lost"
)

// SideEffectClass orders what a tool may do to the world:
// none < read < write < irreversible. The zero value is SideEffectNone.
type SideEffectClass uint8

// Side-effect classes, in increasing order of risk.
const (
	SideEffectNone SideEffectClass = iota
	SideEffectRead
	SideEffectWrite
	SideEffectIrreversible
)

var sideEffectNames = [...]string{"none", "read", "write", "irreversible"}

// String returns the wire name ("none", "read", "write", "irreversible").
func (c SideEffectClass) String() string {
	if int(c) < len(sideEffectNames) {
		return sideEffectNames[c]
	}
	return fmt.Sprintf("side_effect_class(%d)", uint8(c))
}

// ParseSideEffectClass maps a wire name to its class; anything else is an error.
func ParseSideEffectClass(s string) (SideEffectClass, error) {
	for i, n := range sideEffectNames {
		if n == s {
			return SideEffectClass(i), nil
		}
	}
	return SideEffectIrreversible, fmt.Errorf("unknown side_effect_class %q (want none, read, write or irreversible)", s)
}

// MarshalText encodes the class as its wire name.
func (c SideEffectClass) MarshalText() ([]byte, error) { return []byte(c.String()), nil }

// UnmarshalText decodes a wire name.
func (c *SideEffectClass) UnmarshalText(b []byte) error {
	v, err := ParseSideEffectClass(string(b))
	if err != nil {
		return err
	}
	*c = v
	return nil
}

// ApprovalTier says who must approve a call before it runs: nobody (auto),
// the Policy Guard's automated rules (policy), or a human (hitl).
type ApprovalTier string

// Approval tiers (Synedrix tool_permissions.approval_tier).
const (
	TierAuto   ApprovalTier = "auto"
	TierPolicy ApprovalTier = "policy"
	TierHITL   ApprovalTier = "hitl"
)

// Resource is something a tool call touches, as its adapter reports it:
// Type is the permission's resource ("bifrost_query", "sql_table", "fs"),
// Name the object (dot-separated for hierarchies, "vala.datasets.tickets"),
// and Action the permission needed ("read" when empty).
type Resource struct {
	Type   string `json:"type" yaml:"type"`
	Name   string `json:"name" yaml:"name"`
	Action string `json:"action,omitempty" yaml:"action,omitempty"`
}

// Call is one tool call to decide. The identity fields (AgentID, Principal,
// InstanceID, Environment, DeploymentMode) come from the enforcement point's
// authenticated context, never from model output.
type Call struct {
	AgentID        string
	DeploymentMode string // "production" when empty
	InstanceID     string // no instance override when empty
	Environment    string // no environment override when empty
	Principal      string // the subject the call runs as

	// Tool is the name as the model called it ("supabase_write",
	// "bifrost.query", "tool:supabase-write").
	Tool string
	// Args are the decoded JSON arguments (ParseArgs's Value); nil means a
	// tool-level decision (disclosure), in which argument conditions are
	// not evaluated.
	Args map[string]any
	// ArgsErr, when set, is why the arguments did not parse (ParseArgs):
	// the call is refused as malformed_call at the composition layer,
	// whatever else it is, by every enforcement point alike.
	ArgsErr error
	// Resources lists what the call touches, as the adapter reports it; the
	// principal needs a grant on each (docs/design.md, "The decision" check 8).
	Resources []Resource
	// Observed lists what the call touches that no grant governs (a
	// workspace tool's files, confined to the workspace instead, as Wyrd
	// specifies); argument conditions see them in resources, the grant
	// layer does not check them.
	Observed []Resource
	// Approved says an unused approval bound to exactly this call exists;
	// the caller consumes it when the decision allows.
	Approved bool
	// ToolLevel asks for the tool-level verdict used for disclosure: argument
	// conditions and resources are skipped, approval does not deny.
	ToolLevel bool
	// Now is when the call is decided: what expires (a delegation) is
	// judged against it. The zero time is before everything: nothing has
	// expired yet, except a delegation with no expiry, which denies.
	Now time.Time
}

// AccessKind says what an Access asks to do with an upstream's resource or
// prompt (docs/design.md, "Resources and prompts"). The zero value is no
// kind: an Access without one is refused as malformed_call.
type AccessKind uint8

// Access kinds, each with the MCP request it decides.
const (
	// AccessResourceRead is resources/read of URI (never a template).
	AccessResourceRead AccessKind = iota + 1
	// AccessResourceSubscribe is resources/subscribe of URI; it needs
	// what a read needs (grant action read).
	AccessResourceSubscribe
	// AccessResourceComplete is completion/complete of an argument of a
	// resource template (ref/resource): URI is the template as the
	// upstream listed it (Template set), or a URI. At ToolLevel with
	// Template set, it decides the template's listing
	// (resources/templates/list).
	AccessResourceComplete
	// AccessPromptGet is prompts/get of a prompt.
	AccessPromptGet
	// AccessPromptComplete is completion/complete of an argument of a
	// prompt (ref/prompt); it needs what a get needs (grant action get).
	AccessPromptComplete
)

var accessKindNames = [...]string{"", "resource_read", "resource_subscribe", "resource_complete", "prompt_get", "prompt_complete"}

// String returns the wire name ("resource_read", "resource_subscribe",
// "resource_complete", "prompt_get", "prompt_complete"), or
// "access_kind(N)" for a value that is none of them.
func (k AccessKind) String() string {
	if k > 0 && int(k) < len(accessKindNames) {
		return accessKindNames[k]
	}
	return fmt.Sprintf("access_kind(%d)", uint8(k))
}

// MarshalText encodes the kind as its wire name.
func (k AccessKind) MarshalText() ([]byte, error) { return []byte(k.String()), nil }

// UnmarshalText decodes a wire name; anything else is an error.
func (k *AccessKind) UnmarshalText(b []byte) error {
	for i, n := range accessKindNames {
		if i > 0 && n == string(b) {
			*k = AccessKind(i)
			return nil
		}
	}
	return fmt.Errorf("unknown access kind %q (want resource_read, resource_subscribe, resource_complete, prompt_get or prompt_complete)", b)
}

// IsResource reports whether the kind reaches a resource (a URI or a
// resource template) rather than a prompt.
func (k AccessKind) IsResource() bool {
	return k == AccessResourceRead || k == AccessResourceSubscribe || k == AccessResourceComplete
}

// IsPrompt reports whether the kind reaches a prompt.
func (k AccessKind) IsPrompt() bool { return k == AccessPromptGet || k == AccessPromptComplete }

// HasArgs reports whether an access of this kind carries arguments (a
// prompt's, or a completion's): its tool-level decision (ToolLevel) then
// leaves out what the arguments decide. A resource read or subscribe has
// none, so its tool-level decision is the decision.
func (k AccessKind) HasArgs() bool {
	return k == AccessPromptGet || k == AccessPromptComplete || k == AccessResourceComplete
}

// Access is one request for an upstream's resource or prompt, decided by
// authz.Snapshot.DecideAccess like a Call. The identity fields come from
// the enforcement point's authenticated context, as for a Call; Upstream
// comes from the caller's routing (the one upstream the request will be
// sent to), never from the client.
type Access struct {
	Kind           AccessKind
	AgentID        string
	DeploymentMode string // "production" when empty
	InstanceID     string // no instance override when empty
	Environment    string // no environment override when empty
	Principal      string // the subject the access runs as

	// Upstream is the upstream the request goes to, as the caller's
	// routing resolved it; empty means no upstream owns the URI or prompt,
	// and the access is refused (unknown_resource, unknown_prompt).
	Upstream string
	// URI is, for a resource kind, the URI exactly as it will be sent to
	// Upstream, or, with Template set, the resource template exactly as
	// Upstream listed it.
	URI string
	// Template says URI is a resource template (a template listing, or the
	// completion of one of its arguments): only a ceiling entry, grant or
	// selector of exactly that template text covers it.
	Template bool
	// Prompt is, for a prompt kind, the upstream's own name of the prompt
	// (what ceiling entries, grants and selectors name); PromptName is the
	// name the model sees (the upstream's tool_prefix and Prompt), for
	// reasons and conditions.
	Prompt     string
	PromptName string
	// Args are the decoded JSON arguments (ParseArgs's Value): a prompt's
	// arguments for prompts/get; for a completion, context.arguments with
	// the argument being completed set to its value so far. Nil for a
	// resource read or subscribe.
	Args map[string]any
	// ArgsErr, when set, is why the arguments did not parse: the access is
	// refused as malformed_call at the composition layer.
	ArgsErr error
	// Approved says an unused approval bound to exactly this access
	// exists; the caller consumes it when the decision allows.
	Approved bool
	// ToolLevel asks for the verdict used to filter lists (no arguments):
	// for kinds with arguments (HasArgs) conditions and conditional rules
	// are not judged; approval does not deny.
	ToolLevel bool
	// Now is when the access is decided (the enforcement point's clock):
	// a delegation that expired by then grants nothing. The core reads no
	// clock of its own.
	Now time.Time
}

// Decision is the answer for one call. The zero value denies.
type Decision struct {
	Verdict Verdict `json:"verdict"`
	Code    Code    `json:"code"`
	Layer   Layer   `json:"layer,omitempty"`
	// Reason is one human sentence naming the layer that refused and what
	// would change the outcome.
	Reason string `json:"reason"`
	// ToolID is the canonical id the called name mapped to ("" when it did
	// not map).
	ToolID string `json:"tool_id,omitempty"`
	// ToolName is the name as called.
	ToolName string `json:"tool_name,omitempty"`
	// EventType is the event this decision emits.
	EventType EventType `json:"event_type"`
	// SideEffectClass is the effective class of the tool (the higher of the
	// tool's own and the ceiling entry's).
	SideEffectClass SideEffectClass `json:"side_effect_class"`
	// ApprovalTier is the ceiling entry's tier ("" when not in the ceiling).
	ApprovalTier ApprovalTier `json:"approval_tier,omitempty"`
	// ApprovalUsed is true when an approval turned require_approval into allow.
	ApprovalUsed bool `json:"approval_used,omitempty"`
	// Disclosed is true when the tool is in the caller's disclosed set:
	// every tool-level layer (composition, ceiling, runtime, instance,
	// policy, tool:invoke) passed, so a refusal came from the call's
	// arguments, resources or approval. A call of a tool that is not
	// disclosed is answered exactly like one of a tool that does not exist
	// (docs/design.md, "The pipeline"). The zero value hides.
	Disclosed bool `json:"disclosed,omitempty"`
	// Target is, for a resource or prompt access (Access), the canonical
	// id of what admitted it: the agent's ceiling entry the access
	// matched ("mcp_resource:docs.\"file:///docs/{+path}\"",
	// "prompt:docs.summarize"; policy.ResourceTarget, PromptTarget), or,
	// where the agent declares no such ceiling, the whole upstream
	// ("mcp_resource:docs", "prompt:docs"). Empty for a tool call and for
	// an access refused before its ceiling was matched. Ids are
	// injective: two different entries never share one.
	Target string `json:"target,omitempty"`
}

// Allowed reports whether the call may run.
func (d Decision) Allowed() bool { return d.Verdict == Allow }

// EventFor returns the event type a verdict emits.
func EventFor(v Verdict) EventType {
	switch v {
	case Allow:
		return EventAuthorized
	case RequireApproval:
		return EventApprovalRequested
	default:
		return EventUnauthorized
	}
}
