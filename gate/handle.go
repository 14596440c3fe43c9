package gate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolgate/toolgate"
	"github.com/toolgate/toolgate/adapter/mcptool"
	"github.com/toolgate/toolgate/audit"
	"github.com/toolgate/toolgate/authz"
	"github.com/toolgate/toolgate/builtin"
)

// Request is one tool call, as an enforcement point hands it to Handle: who
// calls (identified once, at the edge, from the credential), what, and how
// the caller can be reached while the call runs.
type Request struct {
	Identity
	// Tool is the name as the model called it.
	Tool string
	// Args are the raw JSON arguments (an object; empty means {}). They are
	// parsed once, by Handle (toolgate.ParseArgs).
	Args json.RawMessage
	// Resources are what the call touches, when the caller can tell; the
	// principal needs a grant on each.
	Resources []toolgate.Resource
	// Observed are what the call touches that no grant governs (a
	// workspace tool's files); conditions see them.
	Observed []toolgate.Resource
	// CorrelationID ties the call's events together; generated when empty.
	CorrelationID string
	CausationID   string
	// Via names the enforcement point ("mcp", "http", "cli", "lib") for
	// the audit log and the metrics.
	Via string
	// DecideOnly decides and records without running the tool (the JSON
	// API's /v1/decide): an allow consumes an approval as a run would, and
	// its record says decide_only, so a restart does not take the call for
	// one whose outcome was lost.
	DecideOnly bool
	// Meta is the client's _meta for the call (its progress token),
	// forwarded to an upstream without the gateway's own namespace.
	Meta mcp.Meta
	// Relay reaches the caller while the call runs (the MCP proxy); nil
	// for none: an upstream's requests are then refused.
	Relay mcptool.Relay
	// Hold, when set, lets Handle hold a call that needs approval for up
	// to Settings.approval_wait and run it as soon as it is approved
	// (the MCP proxy); Progress, when set, is told while it waits.
	Hold bool
	// Progress is called about once a second while a call is held:
	// seconds waited, seconds the hold lasts at most, and a message.
	Progress func(waited, total float64, message string)
	// StillValid, when set, is asked before a held call resumes: an error
	// (the credential was removed or revoked meanwhile) ends it unrun.
	StillValid func() error
}

// Outcome is what Handle decided and did. Each transport has exactly one
// mapping from it to its wire (mcpproxy/result.go, httpapi's Classify).
type Outcome struct {
	// Decision is the decision, as recorded in the audit log.
	Decision toolgate.Decision
	// Visible is false when the caller must be answered as if the tool did
	// not exist: the name maps to no tool in the caller's disclosed set
	// (Decision.Disclosed). Nothing was run, no approval was created or
	// used.
	Visible bool
	// Args are the decoded arguments (nil when they did not parse).
	Args map[string]any
	// CanonicalArgs is the canonical JSON the approval digest is taken
	// over, and what the tool received.
	CanonicalArgs []byte
	ArgsDigest    string
	// ApprovalID is the pending approval created for a require_approval
	// decision, or the approval an allowed call used.
	ApprovalID string
	// ApprovalExpires is when the pending approval expires.
	ApprovalExpires time.Time
	CorrelationID   string
	// EventID is the recorded decision event's id (the causation of the
	// completion event).
	EventID string
	// Started is when the decision was made.
	Started time.Time
	// Result is what running the call produced; zero unless the call was
	// allowed and not DecideOnly.
	Result CallResult
	// Took is how long the decision took, without the tool's run time.
	Took time.Duration
	// Reveal is true when the caller, though not shown the tool, may be
	// told the real decision (a principal that may read the audit log, as
	// authz.Snapshot.MayReadAudit says); transports that show decisions
	// (the JSON API) use it, MCP never does.
	Reveal bool
	// refusedAllow is the event id of an allow whose record may still be
	// written although the call was refused: the refusal's event names it
	// (causation_id, details refused_allow_event_id), so a restart does
	// not mark that call outcome_unknown.
	refusedAllow string
}

// Observer measures what Handle decides, once per call; *metrics.Metrics
// implements it.
type Observer interface {
	// Decision is called with the decision as the caller may see it (a
	// hidden tool counts as an unknown one: metrics are no oracle) and how
	// long deciding took (the tool's run time left out).
	Decision(via string, d toolgate.Decision, took time.Duration)
}

// ErrAuditUnavailable is wrapped when the audit log cannot make an allow
// durable: the call is denied rather than run unrecorded.
var ErrAuditUnavailable = errors.New("audit log unavailable")

// Handle is the pipeline every tool call takes, whichever entry point it
// came through (docs/design.md, "The pipeline"): parse the arguments once;
// decide once (the decision also says whether the tool is disclosed to the
// caller; a built-in tool is first asked what the call would touch); use or
// create the approval it needs, or hold it until approved; record; run
// through the tool's executor; record the completion; measure once. A call
// of a tool the caller is not shown is recorded with its real decision and
// answered as unknown (Visible false), and nothing is run or approved.
func (g *Gate) Handle(ctx context.Context, req Request) Outcome {
	start := time.Now()
	out := g.handle(ctx, req)
	out.Visible = out.Decision.Disclosed
	out.Reveal = !out.Visible && g.mayReadAudit(req.Identity)
	if o := g.opts.Observer; o != nil {
		shown, took := out.Decision, time.Since(start)-out.Result.Duration
		if !out.Visible {
			// Metrics are no oracle: a hidden tool counts as an unknown
			// one, and its decision time as none (both the lowest bucket).
			shown = toolgate.Decision{Verdict: toolgate.Deny, Code: toolgate.CodeUnknownTool, Layer: toolgate.LayerComposition, ToolName: req.Tool}
			took = 0
		}
		out.Took = took
		o.Decision(req.Via, shown, took)
	}
	return out
}

// Decide is Handle with req.DecideOnly: the call is decided and recorded
// (an approval used or asked for as a run would), and nothing runs. It is
// the Go library's way to ask before running the tool itself.
func (g *Gate) Decide(ctx context.Context, req Request) Outcome {
	req.DecideOnly = true
	return g.Handle(ctx, req)
}

func (g *Gate) handle(ctx context.Context, req Request) Outcome {
	pa := parseArgs(req.Args)
	snap := g.Snapshot()
	out := g.newOutcome(req, pa)
	call := callOf(req, pa, out.Started)
	var inspected []toolgate.Resource
	if t, ok := snap.Lookup(req.Tool); ok && t.Builtin != "" {
		// A built-in tool says what the call would touch before the
		// resource layer judges it, but only for a caller that may invoke
		// it (the tool-level decision), so nobody learns anything of a
		// tool it may not use.
		pre := call
		pre.ToolLevel, pre.Args = true, nil
		if d := g.decide(snap, &pre, req.Identity); d.Verdict == toolgate.Deny {
			out.Decision = d
			return g.refuse(ctx, req, out)
		}
		res, d, ok := g.inspect(ctx, snap, t, req, pa)
		if !ok {
			out.Decision = d
			return g.refuse(ctx, req, out)
		}
		inspected = res
		if g.builtinSpec(t.Builtin).NeedsWorkspace {
			// Workspace confinement is this tool's resource check;
			// conditions still see the files it really touches.
			call.Observed = append(append([]toolgate.Resource(nil), call.Observed...), res...)
		} else {
			call.Resources = append(append([]toolgate.Resource(nil), call.Resources...), res...)
		}
	}
	d := g.decide(snap, &call, req.Identity)
	if !d.Disclosed {
		// Never shown to this caller: decided and recorded only; nothing
		// runs, no approval is created or used. A decision that would not
		// deny (the arguments could make a hidden tool's call pass) is
		// recorded as the refusal it is.
		if d.Verdict != toolgate.Deny {
			d = toolgate.Decision{Verdict: toolgate.Deny, Code: toolgate.CodeUnknownTool, Layer: toolgate.LayerComposition,
				Reason: fmt.Sprintf("composition layer: %q is not a tool this caller is shown (its tool-level decision denies), so no call of it runs, whatever its arguments (they would have given %s: %s)",
					req.Tool, d.Verdict, d.Reason),
				ToolID: d.ToolID, ToolName: req.Tool, EventType: toolgate.EventUnauthorized, SideEffectClass: d.SideEffectClass, ApprovalTier: d.ApprovalTier}
		}
		out.Decision = d
		return g.refuse(ctx, req, out)
	}
	if d.Verdict != toolgate.Deny {
		// Before anything could run (or an approval be used): can the
		// audit log take the record? If not, refuse now.
		if err := g.admit(); err != nil {
			out.Decision = toolgate.Decision{Verdict: toolgate.Deny, Code: toolgate.CodeInternalError, Layer: toolgate.LayerInternal,
				Reason: fmt.Sprintf("internal layer: the call is refused before anything runs because the audit log cannot record it now: %v; retry once the audit store writes again (/readyz)", err),
				ToolID: d.ToolID, ToolName: req.Tool, EventType: toolgate.EventUnauthorized, Disclosed: true}
			return g.refuse(ctx, req, out)
		}
	}
	if d.Verdict == toolgate.RequireApproval {
		d = g.approvalStep(ctx, req, &call, snap, d, &out)
		if d.Verdict == toolgate.RequireApproval && out.ApprovalID != "" && req.Hold {
			if wait := snap.Settings().ApprovalWait.D(); wait > 0 {
				out.Decision = d
				g.record(ctx, req, &out, false)
				if !g.hold(ctx, req, out.ApprovalID, wait) {
					return out
				}
				// Approved while held: the same call again, which uses the
				// approval and runs, once (if its credential still holds).
				if req.StillValid != nil {
					if err := req.StillValid(); err != nil {
						return out
					}
				}
				req.Hold = false
				req.CorrelationID = out.CorrelationID
				return g.handle(ctx, req)
			}
		}
	}
	out.Decision = d
	if d.Verdict != toolgate.Allow {
		return g.refuse(ctx, req, out)
	}
	if err := g.record(ctx, req, &out, true); err != nil {
		out.Decision = toolgate.Decision{Verdict: toolgate.Deny, Code: toolgate.CodeInternalError, Layer: toolgate.LayerInternal,
			Reason: fmt.Sprintf("the audit log cannot record this allow, so the call is refused rather than run unrecorded: %v", err),
			ToolID: d.ToolID, ToolName: req.Tool, EventType: toolgate.EventUnauthorized, Disclosed: true}
		if errors.Is(err, audit.ErrMaybeWritten) {
			// The allow may still reach the log: the refusal names it, so
			// the log shows the call did not run.
			req.CausationID, out.refusedAllow = out.EventID, out.EventID
		}
		return g.refuse(ctx, req, out)
	}
	if req.DecideOnly {
		return out
	}
	out.Result = g.execute(withCall(ctx, req.Identity, out.CorrelationID), snap, req, out, inspected)
	return out
}

// refuse records out's decision, which does not run (a denial, a pending
// approval, a hidden tool), and returns out.
func (g *Gate) refuse(ctx context.Context, req Request, out Outcome) Outcome {
	g.record(ctx, req, &out, false)
	return out
}

// parsed is a request's arguments, parsed once (toolgate.ParseArgs) by
// Handle and handed to every step after it.
type parsed struct {
	args toolgate.Args
	err  error
}

func parseArgs(raw json.RawMessage) parsed {
	a, err := toolgate.ParseArgs(raw)
	return parsed{args: a, err: err}
}

// newOutcome starts the outcome of a request: correlation id, start time
// and the parsed arguments.
func (g *Gate) newOutcome(req Request, pa parsed) Outcome {
	out := Outcome{CorrelationID: req.CorrelationID, Started: g.now()}
	if out.CorrelationID == "" {
		out.CorrelationID = audit.NewEventID()
	}
	if pa.err == nil {
		out.Args, out.CanonicalArgs, out.ArgsDigest = pa.args.Value, pa.args.Canonical, pa.args.Digest
	}
	return out
}

// callOf is the call the decision core decides for a request at now.
func callOf(req Request, pa parsed, now time.Time) toolgate.Call {
	return toolgate.Call{AgentID: req.AgentID, DeploymentMode: req.DeploymentMode, InstanceID: req.InstanceID,
		Environment: req.Environment, Principal: req.Principal, Tool: req.Tool, Resources: req.Resources, Observed: req.Observed,
		Args: pa.args.Value, ArgsErr: pa.err, Now: now}
}

// inspect asks built-in tool t what the call would touch. A refusal there
// (path_outside_workspace, sql_not_read_only, sql_unclassifiable,
// bad_arguments) is a deny at the resource layer (ok false).
func (g *Gate) inspect(ctx context.Context, snap *authz.Snapshot, t authz.Tool, req Request, pa parsed) ([]toolgate.Resource, toolgate.Decision, bool) {
	deny := func(code toolgate.Code, layer toolgate.Layer, reason string) toolgate.Decision {
		return toolgate.Decision{Verdict: toolgate.Deny, Code: code, Layer: layer, Reason: reason, ToolID: t.ID,
			ToolName: req.Tool, EventType: toolgate.EventUnauthorized, SideEffectClass: t.SideEffectClass, Disclosed: true}
	}
	if pa.err != nil {
		return nil, toolgate.Decision{}, true // the decision refuses it as malformed_call
	}
	bt, ok := g.builtin(t.Builtin)
	if !ok {
		return nil, deny(toolgate.CodeInternalError, toolgate.LayerInternal,
			fmt.Sprintf("the built-in tool %s is not available in this gateway, so what the call would touch cannot be checked (fail closed); configure it (a Database document for sql.*) or remove %s from the catalog", t.Builtin, t.ID)), false
	}
	res, err := bt.Inspect(ctx, builtin.Invocation{Args: pa.args.Canonical, Workspace: g.workspace(snap, req.AgentID)})
	if err != nil {
		var te *toolgate.Error
		if errors.As(err, &te) {
			layer := te.Layer
			if layer == toolgate.LayerNone {
				layer = toolgate.LayerResource
			}
			return nil, deny(te.Code, layer, fmt.Sprintf("%s layer: %s refused the call before it ran: %s", layer, t.Builtin, te.Message)), false
		}
		return nil, deny(toolgate.CodeInternalError, toolgate.LayerInternal,
			fmt.Sprintf("%s could not tell what the call would touch, so it is refused (fail closed): %v", t.Builtin, err)), false
	}
	return res, toolgate.Decision{}, true
}

// builtinSpec is the spec of a configured built-in tool (zero when it is
// not configured).
func (g *Gate) builtinSpec(name string) builtin.Spec {
	if bt, ok := g.builtin(name); ok {
		return bt.Spec()
	}
	return builtin.Spec{}
}
