package gate

// Messages that cross the gateway but are neither a tool call nor an
// access (docs/design.md, "The pipeline"): list requests, logging levels,
// and the requests an upstream sends to a client during one of its
// requests. Each is recorded as one event by RecordMessage, allowed or
// refused, so no message kind crosses unrecorded.

import (
	"context"

	"github.com/toolgate/toolgate"
	"github.com/toolgate/toolgate/audit"
)

// Message is one such message, as the enforcement point that handled it
// describes it.
type Message struct {
	// Identity is who sent it, or whom it is for (zero when no client
	// could be told: an upstream's request that could not be attributed).
	Identity
	// Type is the event type (toolgate.EventListServed,
	// EventLoggingLevelSet, EventUpstreamRequest).
	Type toolgate.EventType
	// Method is the MCP method.
	Method string
	// Verdict says whether it was served or relayed (Allow) or refused
	// (Deny); Code and Reason say why ("ok" and "" for an allow).
	Verdict toolgate.Verdict
	Code    toolgate.Code
	Reason  string
	// Upstream is the upstream it came from or went to, if one.
	Upstream string
	// CorrelationID ties it to the call or access it belongs to (an
	// upstream's request during a call: the call's); generated when empty.
	CorrelationID string
	// Via names the enforcement point ("mcp").
	Via string
	// Details say more (counts, the level); never a credential or content.
	Details map[string]any
}

// RecordMessage records m as one event, queued like a denial: durable
// before it returns while the store is healthy, never dropped silently.
func (g *Gate) RecordMessage(ctx context.Context, m Message) {
	rec := g.opts.Recorder
	if rec == nil {
		return
	}
	snap := g.Snapshot()
	code := m.Code
	if code == "" && m.Verdict == toolgate.Allow {
		code = toolgate.CodeOK
	}
	mode := m.DeploymentMode
	if mode == "" && m.AgentID != "" {
		mode = snap.Settings().DefaultDeploymentMode
	}
	ev := audit.Event{EventID: audit.NewEventID(), EventType: string(m.Type), OccurredAt: g.now(), CorrelationID: m.CorrelationID,
		AgentID: m.AgentID, AgentVersion: snap.AgentVersion(m.AgentID), Principal: m.Principal, InstanceID: m.InstanceID,
		Environment: m.Environment, DeploymentMode: mode, Verdict: m.Verdict.String(), Code: string(code), Reason: m.Reason}
	if ev.CorrelationID == "" {
		ev.CorrelationID = audit.NewEventID()
	}
	if ev.Verdict == toolgate.Deny.String() && ev.Code == "" {
		ev.Code = string(toolgate.CodeInternalError)
	}
	ev.Details = map[string]any{"method": m.Method}
	for k, v := range m.Details {
		ev.Details[k] = v
	}
	if m.Upstream != "" {
		ev.Details["upstream"] = m.Upstream
	}
	if m.Via != "" {
		ev.Details["via"] = m.Via
	}
	if m.AgentID != "" || m.Principal != "" {
		ev.Details = delegationDetails(m.Identity, ev.Details)
	}
	if rec.RecordOrQueue(ctx, ev) == audit.Lost {
		g.log.Error("audit record lost: the audit log is closed", "event", ev.EventType, "method", m.Method)
	}
}

// callKey is the context key under which Handle and HandleAccess carry,
// while a call or access runs, who made it and its correlation id, so
// that what an upstream sends during it is recorded as part of it.
type callKey struct{}

type callInfo struct {
	id          Identity
	correlation string
}

// withCall returns ctx carrying the identity and correlation id of the
// call or access about to run.
func withCall(ctx context.Context, id Identity, correlation string) context.Context {
	return context.WithValue(ctx, callKey{}, callInfo{id, correlation})
}

// CallOf returns the identity and correlation id of the call or access
// that ctx runs (false outside one): an adapter or relay records what an
// upstream sends during it under that correlation.
func CallOf(ctx context.Context) (Identity, string, bool) {
	ci, ok := ctx.Value(callKey{}).(callInfo)
	return ci.id, ci.correlation, ok
}
