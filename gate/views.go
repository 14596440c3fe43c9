package gate

import (
	"context"
	"errors"
	"fmt"

	"github.com/toolgate/toolgate/approval"
	"github.com/toolgate/toolgate/audit"
	"github.com/toolgate/toolgate/authz"
)

// What an identity may see of the gateway's state besides its own calls:
// its tool sets, the approvals, the audit log. The rules are the decision
// core's (authz.Snapshot.MayReadAudit, ApprovalVisible); the gate applies
// them, so every enforcement point shows the same.

// ErrNotAuditor is returned by ReadAudit for a principal that may not read
// the audit log.
var ErrNotAuditor = errors.New("may not read the audit log")

// ErrNoAuditLog is returned by ReadAudit when the gate has no audit log to
// read (Options.AuditLog).
var ErrNoAuditLog = errors.New("this gateway serves no audit log")

// Resolve returns the identity's tool sets (authz.Resolution), cut down to
// what it may see: the disclosed tools, and nothing of the others (not even
// that they exist or which layer removed them), as tools/list shows it. A
// principal that may read the audit log gets the whole resolution.
func (g *Gate) Resolve(id Identity) authz.Resolution {
	res := g.Disclose(id).Resolution
	if g.mayReadAudit(id) {
		return res
	}
	return disclosedOnly(res)
}

// mayReadAudit is authz.Snapshot.MayReadAudit for id (an operator may).
func (g *Gate) mayReadAudit(id Identity) bool {
	return id.Operator || g.Snapshot().MayReadAudit(id.Principal)
}

func disclosedOnly(res authz.Resolution) authz.Resolution {
	shown := make(map[string]bool, len(res.Disclosed))
	for _, t := range res.Disclosed {
		shown[t] = true
	}
	keep := func(ids []string) []string {
		out := []string{}
		for _, t := range ids {
			if shown[t] {
				out = append(out, t)
			}
		}
		return out
	}
	res.ActiveToolSet, res.Authorized = keep(res.ActiveToolSet), keep(res.Authorized)
	res.Removed = []authz.Removal{}
	tools := []authz.ToolStatus{}
	for _, t := range res.Tools {
		if shown[t.ToolID] {
			tools = append(tools, t)
		}
	}
	res.Tools = tools
	return res
}

// ListApprovals lists the approvals f selects that id may see: those its
// own calls asked for and those it may decide. The result is never nil.
func (g *Gate) ListApprovals(ctx context.Context, id Identity, f approval.Filter) ([]approval.Approval, error) {
	store := g.opts.Approvals
	if store == nil {
		return nil, ErrNoApprovals
	}
	as, err := store.ListApprovals(ctx, f)
	if err != nil {
		return nil, err
	}
	snap := g.Snapshot()
	kept := make([]approval.Approval, 0, len(as))
	for _, a := range as {
		if id.Operator || snap.ApprovalVisible(id.Principal, a.Binding.Principal, a.RequestedBy, a.Binding.ToolID) {
			kept = append(kept, a)
		}
	}
	return kept, nil
}

// ReadAudit reads up to limit audit events from seq from on, for a
// principal that may read the audit log (ErrNotAuditor otherwise). A record
// that cannot be decoded is an error naming its seq.
func (g *Gate) ReadAudit(ctx context.Context, id Identity, from int64, limit int) ([]audit.Event, error) {
	if g.opts.AuditLog == nil {
		return nil, ErrNoAuditLog
	}
	if !g.mayReadAudit(id) {
		return nil, fmt.Errorf("%w: principal %s; grant {resource: audit, action: read, scope: all}", ErrNotAuditor, id.Principal)
	}
	return audit.ReadEvents(ctx, g.opts.AuditLog, from, limit)
}

// The approval and audit types the gate's verbs take and give, for the
// enforcement points (which need not import the stores' packages).
type (
	// Approval is a stored approval (approval.Approval).
	Approval = approval.Approval
	// ApprovalFilter selects approvals (approval.Filter).
	ApprovalFilter = approval.Filter
	// ApprovalStatus is where an approval is in its life (approval.Status).
	ApprovalStatus = approval.Status
	// AuditEvent is one audit event (audit.Event).
	AuditEvent = audit.Event
)

// ApprovalPending is the status of an approval waiting for its decision.
const ApprovalPending = approval.StatusPending

// Errors of the approval verbs (approval's sentinels), for errors.Is.
var (
	ErrApprovalNotFound   = approval.ErrNotFound
	ErrApprovalNotPending = approval.ErrNotPending
	ErrApprovalExpired    = approval.ErrExpired
	ErrApprovalInvalid    = approval.ErrInvalid
)

// Reachable returns the upstreams at least one of whose tools is
// disclosed to id: those whose log messages and logging level may reach
// it (mcpproxy's pass-through of logging/setLevel and
// notifications/message). It is derived from Disclose, the core's
// resolution, and decides nothing of its own.
func (g *Gate) Reachable(id Identity) map[string]bool {
	disc := g.Disclose(id)
	snap := g.Snapshot()
	out := map[string]bool{}
	for toolID := range disc.Disclosed {
		if t, ok := snap.Tool(toolID); ok && t.MCPServer != "" {
			out[t.MCPServer] = true
		}
	}
	return out
}
