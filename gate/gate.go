// Package gate is the pipeline every tool call takes (Handle): it holds the
// current policy snapshot (swapped atomically on reload), decides each call
// once with authz, turns require_approval into pending approvals and uses
// granted ones, records every decision in the audit log before a tool runs,
// runs allowed calls through the executor of their source, and records
// their completion (docs/design.md, "The pipeline"). The MCP proxy, the
// JSON API, the CLI and the Go library all call Handle; none of them
// decides, records, forwards or counts anything itself, so they cannot
// disagree.
package gate

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/toolgate/toolgate"
	"github.com/toolgate/toolgate/approval"
	"github.com/toolgate/toolgate/audit"
	"github.com/toolgate/toolgate/authz"
)

// Identity is who a call runs as and where: bound by the enforcement point
// from an authenticated credential, never from anything the client or the
// model sends.
type Identity struct {
	Principal      string `json:"principal"`
	AgentID        string `json:"agent_id"`
	InstanceID     string `json:"instance_id,omitempty"`
	Environment    string `json:"environment,omitempty"`
	DeploymentMode string `json:"deployment_mode,omitempty"`
	// Delegation, when set, narrows the principal's authority to what a
	// delegation token or a JWT's roles also grant (delegation.go). It is
	// set only by a verifier, from a verified token.
	Delegation *Delegation `json:"-"`
	// Anonymous is true for the identity Settings.anonymous gives a request
	// that carries no credential. Every such client gets the same identity,
	// so only Session tells two of them apart. Set by the enforcement point
	// only.
	Anonymous bool `json:"-"`
	// Operator marks an identity an enforcement point took from a request
	// it could not authenticate because it has no authentication at all
	// (the JSON API without Identify, for a gateway bound to loopback in
	// development, and the CLI): the person at the keyboard, who may read
	// the audit log and every approval and is shown real decisions. Calls
	// are still decided as Principal's. Never set from a credential.
	Operator bool `json:"-"`
	// Session, for an anonymous identity, names the one client it stands
	// for here: the enforcement point sets it to a digest of the client's
	// MCP session id ("" over the JSON API, which has no sessions). An
	// approval an anonymous call asks for is bound to it, so another
	// anonymous client repeating the call cannot use it; an anonymous call
	// without a Session neither creates nor uses an approval. Ignored for
	// an identity that is not Anonymous.
	Session string `json:"-"`
}

// Context returns the identity as an authz resolution context.
func (id Identity) Context() authz.Context {
	return authz.Context{AgentID: id.AgentID, DeploymentMode: id.DeploymentMode, InstanceID: id.InstanceID,
		Environment: id.Environment, Principal: id.Principal}
}

// Options configures a Gate; nil is valid (no audit log, no approvals:
// calls that need approval are refused as such and cannot be approved).
type Options struct {
	// Recorder is the audit log. With nil, nothing is recorded (for the
	// CLI's pure decide only; serve always sets it).
	Recorder *audit.Recorder
	// Approvals stores pending approvals; nil means approvals cannot be
	// created or used.
	Approvals approval.Store
	// ApprovalTTL is how long a new approval stays usable; 0 means the
	// bundle's Settings.approval_ttl, or 15 minutes.
	ApprovalTTL time.Duration
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Logger gets operational messages; nil discards.
	Logger *slog.Logger
	// Executor runs the calls Handle allows (execute.go); nil means they
	// are decided and recorded but nothing runs (the call fails).
	Executor *Executor
	// Observer, when set, measures every decision Handle makes, once.
	Observer Observer
	// AuditLog is the audit store ReadAudit reads (the Recorder's); nil
	// means the log cannot be read through the gate.
	AuditLog audit.Store
}

// Credentials identifies the requests of an enforcement point from their
// Authorization header alone; *identity.Table implements it (API keys,
// JWTs, delegation tokens, Settings.anonymous, allowed origins).
type Credentials interface {
	// Identify returns who a request with this Authorization header is;
	// the error (answered with 401) never holds the credential.
	Identify(authorization string) (Identity, error)
	// CheckOrigin says why a browser request's Origin or Host is refused,
	// or "".
	CheckOrigin(r *http.Request) string
}

// runtime is what a reload changes, as one value: the compiled policy and
// the credentials built from the same bundle, so that no request ever sees
// the new policy with the old credentials or the reverse.
type runtime struct {
	snap  *authz.Snapshot
	creds Credentials
}

// noCredentials refuses every request (a gate installed without a table).
type noCredentials struct{}

func (noCredentials) Identify(string) (Identity, error) {
	return Identity{}, errors.New("unauthorized: this gateway has no credentials")
}
func (noCredentials) CheckOrigin(*http.Request) string { return "" }

// Gate decides, approves and records. It is safe for concurrent use.
type Gate struct {
	rt   atomic.Pointer[runtime]
	opts Options
	now  func() time.Time
	log  *slog.Logger

	discMu    sync.Mutex
	discSnap  *authz.Snapshot
	discCache map[Identity]*Disclosure

	dlg delegationCache // delegations compiled per snapshot (delegation.go)
	// routes resolves the owners of accesses (access.go: SetRoutes).
	routes atomic.Pointer[Routes]

	// pendingMu serializes counting and creating pending approvals
	// (approvalStep, MaxPendingApprovals).
	pendingMu sync.Mutex

	// waiters releases held calls (hold.go).
	waiters waiters
}

// New returns a Gate deciding with snap.
func New(snap *authz.Snapshot, opts *Options) *Gate {
	g := &Gate{}
	if opts != nil {
		g.opts = *opts
	}
	g.now = g.opts.Now
	if g.now == nil {
		g.now = time.Now
	}
	g.log = g.opts.Logger
	if g.log == nil {
		g.log = slog.New(slog.DiscardHandler)
	}
	g.rt.Store(&runtime{snap: snap, creds: noCredentials{}})
	return g
}

// Snapshot returns the current policy snapshot.
func (g *Gate) Snapshot() *authz.Snapshot { return g.rt.Load().snap }

// Credentials returns the current credential table.
func (g *Gate) Credentials() Credentials { return g.rt.Load().creds }

// Install swaps in a new snapshot and the credential table built from the
// same bundle, together (one pointer): requests identified or decided
// after it returns use both. A nil creds keeps the current table.
func (g *Gate) Install(s *authz.Snapshot, creds Credentials) {
	for {
		old := g.rt.Load()
		next := &runtime{snap: s, creds: creds}
		if creds == nil {
			next.creds = old.creds
		}
		if g.rt.CompareAndSwap(old, next) {
			return
		}
	}
}

// Swap installs a new snapshot and keeps the credentials (a recompile
// after an upstream announced new tools); calls decided after it returns
// use it.
func (g *Gate) Swap(s *authz.Snapshot) { g.Install(s, nil) }

// Recorder returns the audit recorder (nil when there is none).
func (g *Gate) Recorder() *audit.Recorder { return g.opts.Recorder }

// Approvals returns the approval store (nil when there is none).
func (g *Gate) Approvals() approval.Store { return g.opts.Approvals }

// Now returns the gate's clock reading.
func (g *Gate) Now() time.Time { return g.now() }

// Disclosure is the tool-level view for one identity: the resolution and a
// set of disclosed tool ids for quick lookups.
type Disclosure struct {
	Resolution authz.Resolution
	Disclosed  map[string]bool
}

// Disclose returns what the identity's model may see, cached per snapshot.
func (g *Gate) Disclose(id Identity) *Disclosure {
	snap := g.Snapshot()
	g.discMu.Lock()
	defer g.discMu.Unlock()
	if g.discSnap != snap {
		g.discSnap, g.discCache = snap, map[Identity]*Disclosure{}
	}
	if d, ok := g.discCache[id]; ok {
		return d
	}
	res, cacheable := g.resolve(snap, id)
	d := &Disclosure{Resolution: res, Disclosed: make(map[string]bool, len(res.Disclosed))}
	for _, t := range res.Disclosed {
		d.Disclosed[t] = true
	}
	if !cacheable {
		return d
	}
	if len(g.discCache) > 10_000 {
		g.discCache = map[Identity]*Disclosure{}
	}
	g.discCache[id] = d
	return d
}

// MaxPendingApprovals is how many approvals may be pending at a time for
// one agent's calls made with one principal's authority (its own and its
// delegates'); a call past that still needs approval but is not queued (so
// varying a call's arguments, or minting delegates, cannot flood the
// approvers).
const MaxPendingApprovals = 50

// approvalStep uses a matching approval (the decision core then allows the
// call: it is decided again, with the approval) or creates a pending one.
func (g *Gate) approvalStep(ctx context.Context, req Request, call *toolgate.Call, snap *authz.Snapshot, d toolgate.Decision, out *Outcome) toolgate.Decision {
	q := approvalQuery{id: req.Identity, target: d.ToolID, name: req.Tool, argsDigest: out.ArgsDigest, args: out.CanonicalArgs,
		correlationID: out.CorrelationID, what: "call",
		redecide: func() toolgate.Decision {
			call.Approved = true
			return g.decide(snap, call, req.Identity)
		}}
	d, out.ApprovalID, out.ApprovalExpires = g.approve(ctx, snap, q, d)
	return d
}

// approvalQuery is what approve needs of a decision that requires
// approval: who asked, what exactly (the binding's target and argument
// digest; name and args are shown to the approver), and how to decide it
// again once an approval is found.
type approvalQuery struct {
	id            Identity
	target        string // the binding's ToolID: a tool id, or an access's target (access.go)
	name          string
	argsDigest    string
	args          []byte
	correlationID string
	what          string // "call" or "access", for reasons
	redecide      func() toolgate.Decision
}

// approve uses a matching approval (q.redecide then decides with it) or
// finds or creates the pending one for d, a require_approval decision.
// It returns the decision and the approval used or pending ("" for none).
func (g *Gate) approve(ctx context.Context, snap *authz.Snapshot, q approvalQuery, d toolgate.Decision) (toolgate.Decision, string, time.Time) {
	store := g.opts.Approvals
	if store == nil {
		d.Reason += fmt.Sprintf(" (this gateway has no approval store, so the %s cannot be approved here)", q.what)
		return d, "", time.Time{}
	}
	id := q.id
	mode := id.DeploymentMode
	if mode == "" {
		mode = snap.Settings().DefaultDeploymentMode
	}
	b := approval.Binding{Principal: id.Principal, AgentID: id.AgentID, InstanceID: id.InstanceID,
		Environment: id.Environment, DeploymentMode: mode, ToolID: q.target, ArgsDigest: q.argsDigest}
	requester := requestedBy(id)
	if id.Anonymous {
		// Every anonymous client has the same identity: an approval is the
		// one client's that asked, bound to its MCP session, and a client
		// without a session (the JSON API) cannot hold one at all.
		if id.Session == "" {
			d.Reason += fmt.Sprintf(" (not queued: an anonymous caller without an MCP session cannot be told from another anonymous caller, so it can neither ask for nor use an approval; make the %s over /mcp, whose session the approval is bound to, or with a credential)", q.what)
			return d, "", time.Time{}
		}
		requester = fmt.Sprintf("%s (anonymous MCP session %s)", requester, id.Session)
	}
	if requester != id.Principal {
		b.Requester = requester // a delegate's (an anonymous session's) approval is its own
	}
	now := g.now()
	if a, ok, err := store.ConsumeApproval(ctx, b.Digest(), now, q.correlationID); err != nil {
		g.log.Error("consume approval", "err", err)
	} else if ok {
		ad := q.redecide()
		if ad.Verdict == toolgate.Allow {
			ad.Reason = fmt.Sprintf("allowed with approval %s (approved by %s)", a.ID, a.DecidedBy)
			return ad, a.ID, time.Time{}
		}
		// The policy changed since: the approval is spent, the new decision stands.
		return ad, "", time.Time{}
	}
	// One look at the pending approvals, under g.pendingMu (so concurrent
	// requests of this gateway cannot slip past the cap together):
	//   - the same request asked again while its approval is pending gets
	//     that approval, not another: repeating it cannot flood the
	//     approvers;
	//   - nor can varying the arguments: the requests made with one
	//     principal's authority (its own and its delegates', whatever their
	//     names) have at most MaxPendingApprovals waiting per agent; past
	//     that a request is not queued.
	g.pendingMu.Lock()
	defer g.pendingMu.Unlock()
	all, err := store.ListApprovals(ctx, approval.Filter{Status: []approval.Status{approval.StatusPending}})
	if err != nil {
		d.Reason += fmt.Sprintf(" (not queued: the pending approvals cannot be counted: %v)", err)
		return d, "", time.Time{}
	}
	digest, n := b.Digest(), 0
	for _, a := range all {
		if !a.ExpiresAt.After(now) {
			continue
		}
		if a.BindingDigest == digest {
			d.Reason = fmt.Sprintf("%s; approval %s is pending until %s", d.Reason, a.ID, a.ExpiresAt.Format(time.RFC3339))
			return d, a.ID, a.ExpiresAt
		}
		if a.Binding.Principal == id.Principal && a.Binding.AgentID == id.AgentID {
			n++
		}
	}
	if n >= MaxPendingApprovals {
		d.Reason += fmt.Sprintf(" (not queued: %d approvals are pending for agent %s with the authority of %s, the most allowed; wait for them to be decided or to expire)", n, id.AgentID, id.Principal)
		return d, "", time.Time{}
	}
	ttl := g.opts.ApprovalTTL
	if ttl == 0 {
		ttl = snap.Settings().ApprovalTTL.D()
	}
	if ttl == 0 {
		ttl = 15 * time.Minute
	}
	a, err := approval.NewApproval(b, requester, now, ttl)
	if err == nil {
		a.CorrelationID = q.correlationID
		a.ToolName = q.name
		a.AgentVersion = snap.AgentVersion(id.AgentID)
		a.Args = q.args
		err = store.CreateApproval(ctx, a)
	}
	if err != nil {
		d.Reason += fmt.Sprintf(" (the approval could not be stored: %v)", err)
		return d, "", time.Time{}
	}
	d.Reason = fmt.Sprintf("%s; approval %s is pending until %s", d.Reason, a.ID, a.ExpiresAt.Format(time.RFC3339))
	return d, a.ID, a.ExpiresAt
}

// maxNameInEvent bounds the tool name as called in an event (a 100 KB
// name is refused anyway; the log keeps its start and length).
const maxNameInEvent = 256

func clipName(s string) string {
	if len(s) <= maxNameInEvent {
		return s
	}
	return fmt.Sprintf("%s…[%d bytes]", s[:maxNameInEvent], len(s))
}

func (g *Gate) event(req Request, out *Outcome) audit.Event {
	d := out.Decision
	mode := req.DeploymentMode
	if mode == "" {
		mode = g.Snapshot().Settings().DefaultDeploymentMode
	}
	ev := audit.Event{EventType: string(d.EventType), OccurredAt: out.Started, CorrelationID: out.CorrelationID,
		CausationID: req.CausationID, AgentID: req.AgentID, AgentVersion: g.Snapshot().AgentVersion(req.AgentID),
		Principal: req.Principal, InstanceID: req.InstanceID, Environment: req.Environment, ToolID: d.ToolID,
		ToolName: clipName(req.Tool), Verdict: d.Verdict.String(), Code: string(d.Code), Layer: string(d.Layer), Reason: d.Reason,
		ArgsDigest: out.ArgsDigest, ApprovalID: out.ApprovalID, DeploymentMode: mode}
	if req.Via != "" {
		ev.Details = map[string]any{"via": req.Via}
	}
	if req.DecideOnly || out.refusedAllow != "" {
		if ev.Details == nil {
			ev.Details = map[string]any{}
		}
		if req.DecideOnly {
			ev.Details["decide_only"] = true
		}
		if out.refusedAllow != "" {
			ev.Details["refused_allow_event_id"] = out.refusedAllow
		}
	}
	ev.Details = delegationDetails(req.Identity, ev.Details)
	return ev
}

// admit asks the audit log whether it can take a record that must be
// durable now (audit.Recorder.Admit); nil without a recorder.
func (g *Gate) admit() error {
	if g.opts.Recorder == nil {
		return nil
	}
	return g.opts.Recorder.Admit()
}

// record writes the decision event. An allow is durable before it returns
// (or the error says why not: the caller refuses the call). Any other
// decision is durable before it returns too while the store is healthy, so
// a denial once answered survives a crash; while the store fails or
// stalls it is queued, and when the backlog is full it is counted in the
// overflow summary (audit.Recorder.RecordOrQueue).
func (g *Gate) record(ctx context.Context, req Request, out *Outcome, durable bool) error {
	rec := g.opts.Recorder
	if rec == nil {
		return nil
	}
	ev := g.event(req, out)
	ev.EventID = audit.NewEventID()
	out.EventID = ev.EventID
	if durable {
		if _, err := rec.Record(ctx, ev); err != nil {
			return fmt.Errorf("%w: %w", ErrAuditUnavailable, err)
		}
		return nil
	}
	if d := rec.RecordOrQueue(ctx, ev); d == audit.Lost {
		g.log.Error("audit record lost: the audit log is closed", "event", ev.EventType, "correlation_id", ev.CorrelationID)
	}
	return nil
}

// Result describes what a tool returned, for the completion event.
type Result struct {
	// Output is what was returned to the caller (its digest and size are
	// recorded, not its content).
	Output []byte
	// Failed is true when the tool reported an error (an isError result) or
	// could not be reached.
	Failed bool
	// Err is a failure to execute (nil when the tool ran).
	Err      error
	Attempts int
	// Details are added to the completion event's details (Call puts the
	// failed attempts and the resources there).
	Details map[string]any
}

// complete records agent.tool.completed or agent.tool.failed for an allowed
// call, with the output digest, returned bytes, attempts and duration.
func (g *Gate) complete(ctx context.Context, req Request, out Outcome, res Result) {
	rec := g.opts.Recorder
	if rec == nil {
		return
	}
	ev := g.event(req, &out)
	ev.EventID = audit.NewEventID()
	ev.CausationID = out.EventID
	ev.OccurredAt = g.now()
	ev.EventType = string(toolgate.EventCompleted)
	if res.Failed || res.Err != nil {
		ev.EventType = string(toolgate.EventFailed)
		// The decision allowed it; the code says how the execution failed.
		ev.Code = "tool_error"
		if res.Err != nil {
			ev.Code = "execution_error"
		}
	}
	sum := sha256.Sum256(res.Output)
	ev.OutputDigest = hex.EncodeToString(sum[:])
	ev.ReturnedBytes = int64(len(res.Output))
	ev.Attempts = res.Attempts
	if ev.Attempts == 0 {
		ev.Attempts = 1
	}
	ev.DurationMS = g.now().Sub(out.Started).Milliseconds()
	if res.Err != nil {
		ev.Reason = "the tool failed: " + res.Err.Error()
	} else if res.Failed {
		ev.Reason = "the tool returned an error result"
	} else {
		ev.Reason = "the tool ran"
	}
	if len(res.Details) > 0 {
		if ev.Details == nil {
			ev.Details = map[string]any{}
		}
		for k, v := range res.Details {
			ev.Details[k] = v
		}
	}
	if err := rec.Enqueue(ev); err != nil {
		g.log.Error("audit enqueue failed", "err", err, "event", ev.EventType)
	}
}

// Refusal is a request an enforcement point refused at its edge, before
// anything was decided (a failed authentication, a method it does not
// serve, a malformed or oversized request): what RecordRefusal records.
type Refusal struct {
	// Type is the event type (gateway.auth.refused, gateway.method.refused,
	// gateway.request.refused).
	Type toolgate.EventType
	// Code is the refusal's stable code; Reason one sentence saying why.
	Code, Reason string
	// At is when it (the first of a summarized flood) happened.
	At time.Time
	// Details say more (source address, count, first, last); never a
	// credential.
	Details map[string]any
}

// RecordRefusal records a refusal at the edge as a deny event, queued like
// a denial (durable when the store is healthy, never dropped silently).
func (g *Gate) RecordRefusal(r Refusal) {
	rec := g.opts.Recorder
	if rec == nil {
		return
	}
	ev := audit.Event{EventType: string(r.Type), OccurredAt: r.At, Verdict: toolgate.Deny.String(), Code: r.Code,
		Reason: r.Reason, Details: r.Details}
	if ev.OccurredAt.IsZero() {
		ev.OccurredAt = g.now()
	}
	if d := rec.RecordOrQueue(context.Background(), ev); d == audit.Lost {
		g.log.Error("audit record lost: the audit log is closed", "event", ev.EventType)
	}
}

// RecordEvent queues an event that is not a call decision (bundle loaded or
// rejected, definition changed, approval decided).
func (g *Gate) RecordEvent(ev audit.Event) {
	if g.opts.Recorder == nil {
		return
	}
	if ev.OccurredAt.IsZero() {
		ev.OccurredAt = g.now()
	}
	if err := g.opts.Recorder.Enqueue(ev); err != nil {
		g.log.Error("audit enqueue failed", "err", err, "event", ev.EventType)
	}
}
