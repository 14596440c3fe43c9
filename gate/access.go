package gate

// Resource and prompt accesses take the pipeline a tool call takes
// (docs/design.md, "The pipeline" and "Resources and prompts"): route once
// (the upstream that owns the URI or prompt, from the gateway's mirror of
// its upstreams' lists), parse the arguments once, decide once
// (authz.Snapshot.DecideAccess), use or create the approval it needs,
// record, forward to exactly the upstream the decision named, record the
// completion. An access that is not disclosed to the caller is recorded
// with its real decision and answered as if the resource or prompt did
// not exist; nothing is forwarded.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/toolgate/toolgate"
	"github.com/toolgate/toolgate/audit"
	"github.com/toolgate/toolgate/authz"
	"github.com/toolgate/toolgate/policy"
)

// Routes tells which upstream owns what an access names: the gateway's
// mirror of its upstreams' resources/list, resources/templates/list and
// prompts/list (mcpproxy's pass-through implements it). The gate asks it
// once per access; the decision is made for, and the access forwarded to,
// the upstream it answers.
type Routes interface {
	// ResourceOwner returns the upstream that owns resource uri (the rule
	// of docs/design.md, "Resources and prompts": an exact listing, else
	// the matching template with the longest literal prefix, else the one
	// upstream with resources), or "" and why there is none.
	ResourceOwner(uri string) (upstream, why string)
	// TemplateOwner returns the upstream that listed exactly the resource
	// template tmpl.
	TemplateOwner(tmpl string) (upstream string, ok bool)
	// PromptOwner returns the upstream and the upstream's own name of the
	// prompt the client calls name (the upstream's tool_prefix and its
	// name).
	PromptOwner(name string) (upstream, prompt string, ok bool)
}

// SetRoutes installs the routes accesses are resolved with; nil removes
// them (every access then has no owner and is refused as unknown).
func (g *Gate) SetRoutes(r Routes) {
	if r == nil {
		g.routes.Store(nil)
		return
	}
	g.routes.Store(&r)
}

func (g *Gate) routesOf() Routes {
	if r := g.routes.Load(); r != nil {
		return *r
	}
	return nil
}

// AccessRequest is one resources/read, resources/subscribe, prompts/get
// or completion/complete, as an enforcement point hands it to
// HandleAccess: who asks (identified once, at the edge), what, and how to
// forward it once allowed.
type AccessRequest struct {
	Identity
	// Kind is what is asked (toolgate.AccessKind); zero is refused as
	// malformed_call.
	Kind toolgate.AccessKind
	// URI is, for a resource kind, the URI as the client sent it; for
	// AccessResourceComplete, the completion reference's uri: a template
	// an upstream listed, or else a URI.
	URI string
	// Prompt is, for a prompt kind, the prompt's name as the client sees
	// it (the upstream's tool_prefix and its name).
	Prompt string
	// Upstream, when set, is the caller's own routing (the CLI, which has
	// no mirror of the upstreams' lists: it names the upstream, and Prompt
	// is then the upstream's own name); empty means Routes resolves it.
	Upstream string
	// Args are the raw JSON arguments (an object): a prompt's arguments
	// for prompts/get; for a completion, the context's arguments with the
	// argument being completed set to its value so far. Parsed once, by
	// HandleAccess (toolgate.ParseArgs). Empty means none ({}).
	Args json.RawMessage
	// Method is the MCP method, for the record ("resources/read").
	Method string
	// CorrelationID ties the access's events together; generated when
	// empty.
	CorrelationID string
	// Via names the enforcement point ("mcp", "http", "cli").
	Via string
	// DecideOnly decides and records without forwarding (the JSON API's
	// /v1/decide, the CLI's decide): an allow consumes an approval as a
	// forwarded access would.
	DecideOnly bool
	// Forward sends the allowed access to route's upstream and returns
	// its result (an MCP result, recorded by its JSON digest and size);
	// nil means the access cannot be forwarded here (it fails after the
	// decision, as a tool this gateway cannot run does).
	Forward func(ctx context.Context, route Route) (any, error)
}

// Route is where an access goes: the upstream the decision was made for,
// and what it is asked there.
type Route struct {
	// Upstream is the owner; empty when there is none.
	Upstream string
	// URI is the resource URI or template, exactly as decided and sent.
	URI string
	// Template says URI is a template an upstream listed.
	Template bool
	// Prompt is the upstream's own name of the prompt.
	Prompt string
}

// AccessOutcome is what HandleAccess decided and did.
type AccessOutcome struct {
	// Decision is the decision, as recorded.
	Decision toolgate.Decision
	// Visible is false when the caller must be answered as if the resource
	// or prompt did not exist (Decision.Disclosed false, or no owner).
	// A URI refused for its form is Visible: the refusal depends on the
	// URI alone and tells nothing of any upstream.
	Visible bool
	// Reveal is true when the caller, though not shown it, may be told the
	// real decision (a principal that may read the audit log).
	Reveal bool
	// Route is where the access was (or would have been) sent.
	Route Route
	// ApprovalID is the pending approval a require_approval created, or
	// the approval an allowed access used; ApprovalExpires ends a pending
	// one.
	ApprovalID      string
	ApprovalExpires time.Time
	CorrelationID   string
	EventID         string
	Started         time.Time
	// Result is what Forward returned; Err its error (or why the access
	// could not be forwarded). Both zero unless the access was allowed
	// and not DecideOnly.
	Result any
	Err    error
	// Forwarded is true when Forward was called.
	Forwarded bool
}

// ErrNotForwardable is AccessOutcome.Err for an allowed access this
// enforcement point cannot forward (no Forward).
var ErrNotForwardable = errors.New("this enforcement point cannot forward the access")

// HandleAccess is the pipeline of every resource and prompt access,
// whichever entry point it came through (the file comment).
func (g *Gate) HandleAccess(ctx context.Context, req AccessRequest) AccessOutcome {
	snap := g.Snapshot()
	out := AccessOutcome{CorrelationID: req.CorrelationID, Started: g.now()}
	if out.CorrelationID == "" {
		out.CorrelationID = audit.NewEventID()
	}
	pa := parseArgs(req.Args)
	a, route := g.accessOf(snap, req, pa, out.Started)
	out.Route = route
	argsDigest, canonical := "", []byte(nil)
	if pa.err == nil {
		argsDigest, canonical = pa.args.Digest, pa.args.Canonical
	}
	d := g.decideAccess(snap, &a, req.Identity)
	out.Visible = d.Disclosed || (d.Code == toolgate.CodeMalformedCall && d.Layer == toolgate.LayerComposition && uriRefused(a))
	if !d.Disclosed && d.Verdict != toolgate.Deny {
		// Not disclosed but not refused: cannot happen (an access that does
		// not deny is disclosed); refuse rather than trust it.
		d = toolgate.Decision{Verdict: toolgate.Deny, Code: toolgate.CodeInternalError, Layer: toolgate.LayerInternal,
			Reason: "internal layer: the access was not disclosed but not refused (fail closed)", EventType: toolgate.EventUnauthorized, Target: d.Target}
	}
	if d.Verdict != toolgate.Deny {
		if err := g.admit(); err != nil {
			d = toolgate.Decision{Verdict: toolgate.Deny, Code: toolgate.CodeInternalError, Layer: toolgate.LayerInternal,
				Reason:    fmt.Sprintf("internal layer: the access is refused before anything is sent because the audit log cannot record it now: %v; retry once the audit store writes again (/readyz)", err),
				EventType: toolgate.EventUnauthorized, Target: d.Target, Disclosed: true}
		}
	}
	if d.Verdict == toolgate.RequireApproval {
		q := approvalQuery{id: req.Identity, target: accessTarget(a), name: accessName(a), argsDigest: accessDigest(a.Kind, argsDigest),
			args: canonical, correlationID: out.CorrelationID, what: "access",
			redecide: func() toolgate.Decision {
				a.Approved = true
				return g.decideAccess(snap, &a, req.Identity)
			}}
		d, out.ApprovalID, out.ApprovalExpires = g.approve(ctx, snap, q, d)
	}
	out.Decision = d
	out.Reveal = !out.Visible && g.mayReadAudit(req.Identity)
	ev := g.accessEvent(snap, req, a, &out, argsDigest)
	if d.Verdict != toolgate.Allow {
		g.recordEvent(ctx, ev, &out)
		return out
	}
	if err := g.recordDurable(ctx, ev, &out); err != nil {
		out.Decision = toolgate.Decision{Verdict: toolgate.Deny, Code: toolgate.CodeInternalError, Layer: toolgate.LayerInternal,
			Reason:    fmt.Sprintf("the audit log cannot record this allow, so the access is refused rather than sent unrecorded: %v", err),
			EventType: toolgate.EventUnauthorized, Target: d.Target, Disclosed: true}
		ev = g.accessEvent(snap, req, a, &out, argsDigest)
		if errors.Is(err, audit.ErrMaybeWritten) {
			ev.CausationID = out.EventID
			ev.Details["refused_allow_event_id"] = out.EventID
		}
		g.recordEvent(ctx, ev, &out)
		return out
	}
	if req.DecideOnly {
		return out
	}
	start := g.now()
	if req.Forward == nil {
		out.Err = ErrNotForwardable
	} else {
		out.Forwarded = true
		out.Result, out.Err = req.Forward(withCall(ctx, req.Identity, out.CorrelationID), route)
	}
	g.completeAccess(ev, &out, start)
	return out
}

// accessOf routes req and builds the access the core decides.
func (g *Gate) accessOf(snap *authz.Snapshot, req AccessRequest, pa parsed, now time.Time) (toolgate.Access, Route) {
	a := toolgate.Access{Kind: req.Kind, AgentID: req.AgentID, DeploymentMode: req.DeploymentMode, InstanceID: req.InstanceID,
		Environment: req.Environment, Principal: req.Principal, Now: now}
	if req.Kind.HasArgs() {
		a.Args, a.ArgsErr = pa.args.Value, pa.err
		if a.ArgsErr == nil && a.Args == nil {
			a.Args = map[string]any{}
		}
	} else if len(req.Args) > 0 {
		a.ArgsErr = fmt.Errorf("a %s has no arguments", req.Kind)
	}
	var route Route
	routes := g.routesOf()
	switch {
	case req.Kind.IsResource():
		a.URI = req.URI
		route.URI = req.URI
		switch {
		case req.Upstream != "":
			route.Upstream = req.Upstream
			a.Template = req.Kind == toolgate.AccessResourceComplete && policy.IsURITemplate(req.URI)
		case routes == nil:
		case req.Kind == toolgate.AccessResourceComplete:
			// A template, as listed; else a URI, by the routing rule.
			if up, ok := routes.TemplateOwner(req.URI); ok {
				route.Upstream, a.Template = up, true
				break
			}
			fallthrough
		default:
			route.Upstream, _ = routes.ResourceOwner(req.URI)
		}
		route.Template = a.Template
	case req.Kind.IsPrompt():
		a.PromptName = req.Prompt
		switch {
		case req.Upstream != "":
			route.Upstream, route.Prompt = req.Upstream, req.Prompt
		case routes != nil:
			if up, name, ok := routes.PromptOwner(req.Prompt); ok {
				route.Upstream, route.Prompt = up, name
			}
		}
		a.Prompt = route.Prompt
		if a.Prompt == "" {
			a.Prompt = req.Prompt
		}
	}
	a.Upstream = route.Upstream
	return a, route
}

// uriRefused reports whether a's URI is refused for its form alone.
func uriRefused(a toolgate.Access) bool {
	if !a.Kind.IsResource() {
		return false
	}
	if a.Template {
		return policy.CheckURITemplate(a.URI) != nil
	}
	return policy.CheckResourceURI(a.URI) != nil
}

// decideAccess is the one place the gate asks the decision core about an
// access: DecideAccess, or DecideAccessDelegated under a delegation.
func (g *Gate) decideAccess(snap *authz.Snapshot, a *toolgate.Access, id Identity) toolgate.Decision {
	if id.Delegation == nil {
		return snap.DecideAccess(a)
	}
	return snap.DecideAccessDelegated(a, g.dlg.compile(snap, a.Principal, id.Delegation))
}

// AccessFilter is the filter of resources/list, resources/templates/list
// and prompts/list for id at now: the same code as DecideAccess, at tool
// level (authz.AccessFilter).
func (g *Gate) AccessFilter(id Identity) *authz.AccessFilter {
	snap := g.Snapshot()
	ctx := id.Context()
	ctx.Now = g.now()
	if d := id.Delegation; d != nil {
		ctx.Delegation = g.dlg.compile(snap, id.Principal, d)
	}
	return snap.AccessFilter(ctx)
}

// accessTarget is what an approval of a binds (its ToolID): the exact
// resource, template or prompt, as an injective id
// (policy.ResourceTarget, PromptTarget).
func accessTarget(a toolgate.Access) string {
	if a.Kind.IsPrompt() {
		return policy.PromptTarget(a.Upstream, a.Prompt)
	}
	return policy.ResourceTarget(a.Upstream, a.URI)
}

// accessName is the access as a human reads it: the prompt as the client
// named it, or the URI.
func accessName(a toolgate.Access) string {
	if a.Kind.IsPrompt() {
		return a.PromptName
	}
	return a.URI
}

// accessDigest binds an approval to the kind of access and its
// arguments: an approved resources/read is not a resources/subscribe of
// the same URI.
func accessDigest(k toolgate.AccessKind, argsDigest string) string {
	sum := sha256.Sum256([]byte(k.String() + "\x00" + argsDigest))
	return hex.EncodeToString(sum[:])
}

// accessEvent is the decision event of an access: the target the
// decision was made on (the ceiling entry, or the upstream), the
// resource or prompt as asked, and in details the method, the kind and
// the upstream.
func (g *Gate) accessEvent(snap *authz.Snapshot, req AccessRequest, a toolgate.Access, out *AccessOutcome, argsDigest string) audit.Event {
	d := out.Decision
	mode := req.DeploymentMode
	if mode == "" && snap != nil {
		mode = snap.Settings().DefaultDeploymentMode
	}
	name := req.URI
	if req.Kind.IsPrompt() {
		name = req.Prompt
	}
	ev := audit.Event{EventType: string(d.EventType), OccurredAt: out.Started, CorrelationID: out.CorrelationID,
		AgentID: req.AgentID, AgentVersion: snap.AgentVersion(req.AgentID), Principal: req.Principal,
		InstanceID: req.InstanceID, Environment: req.Environment, ToolID: d.Target, ToolName: clipName(name),
		Verdict: d.Verdict.String(), Code: string(d.Code), Layer: string(d.Layer), Reason: d.Reason,
		ArgsDigest: argsDigest, ApprovalID: out.ApprovalID, DeploymentMode: mode}
	ev.Details = map[string]any{"access": req.Kind.String()}
	if req.Method != "" {
		ev.Details["method"] = req.Method
	}
	if req.Via != "" {
		ev.Details["via"] = req.Via
	}
	if out.Route.Upstream != "" {
		ev.Details["upstream"] = out.Route.Upstream
	}
	if a.Template {
		ev.Details["template"] = true
	}
	if req.DecideOnly {
		ev.Details["decide_only"] = true
	}
	ev.Details = delegationDetails(req.Identity, ev.Details)
	return ev
}

// recordEvent records a decision that sends nothing (queued like a
// denial: durable while the store is healthy, never dropped silently).
func (g *Gate) recordEvent(ctx context.Context, ev audit.Event, out *AccessOutcome) {
	rec := g.opts.Recorder
	if rec == nil {
		return
	}
	ev.EventID = audit.NewEventID()
	out.EventID = ev.EventID
	if rec.RecordOrQueue(ctx, ev) == audit.Lost {
		g.log.Error("audit record lost: the audit log is closed", "event", ev.EventType, "correlation_id", ev.CorrelationID)
	}
}

// recordDurable records an allow; it is durable before it returns, or the
// error says why not.
func (g *Gate) recordDurable(ctx context.Context, ev audit.Event, out *AccessOutcome) error {
	rec := g.opts.Recorder
	if rec == nil {
		return nil
	}
	ev.EventID = audit.NewEventID()
	out.EventID = ev.EventID
	if _, err := rec.Record(ctx, ev); err != nil {
		return fmt.Errorf("%w: %w", ErrAuditUnavailable, err)
	}
	return nil
}

// completeAccess records agent.tool.completed or agent.tool.failed for a
// forwarded access, with the digest and size of the result's JSON.
func (g *Gate) completeAccess(ev audit.Event, out *AccessOutcome, start time.Time) {
	rec := g.opts.Recorder
	if rec == nil {
		return
	}
	ev.CausationID = out.EventID
	ev.EventID = audit.NewEventID()
	ev.OccurredAt = g.now()
	ev.EventType = string(toolgate.EventCompleted)
	ev.Reason = "the upstream answered"
	if out.Err != nil {
		ev.EventType = string(toolgate.EventFailed)
		ev.Code = "execution_error"
		ev.Reason = "the access failed: " + out.Err.Error()
	}
	if out.Result != nil {
		if b, err := json.Marshal(out.Result); err == nil {
			sum := sha256.Sum256(b)
			ev.OutputDigest = hex.EncodeToString(sum[:])
			ev.ReturnedBytes = int64(len(b))
		}
	}
	ev.Attempts = 1
	ev.DurationMS = g.now().Sub(start).Milliseconds()
	if err := rec.Enqueue(ev); err != nil {
		g.log.Error("audit enqueue failed", "err", err, "event", ev.EventType)
	}
}
