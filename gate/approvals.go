package gate

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/toolgate/toolgate"
	"github.com/toolgate/toolgate/approval"
	"github.com/toolgate/toolgate/audit"
)

// ErrNotApprover is wrapped when the principal lacks {resource: approval,
// action: decide} on the approval's tool.
var ErrNotApprover = errors.New("not allowed to decide this approval")

// ErrSelfApproval is wrapped when a principal tries to approve or deny an
// approval that its own call asked for: someone else must decide it.
var ErrSelfApproval = errors.New("the principal whose call asked for an approval cannot decide it")

// ErrNoApprovals is returned when the gate has no approval store.
var ErrNoApprovals = errors.New("this gateway has no approval store")

// DecideApproval approves (approve true) or denies the pending approval id
// as principal by. by needs {resource: approval, action: decide} on the
// tool (scope all or the tool) and must not be the principal that asked
// for the call. The decision is recorded as agent.tool.approval_granted or
// _denied; an approval found expired is recorded as _expired.
func (g *Gate) DecideApproval(ctx context.Context, id string, approve bool, by, reason, via string) (approval.Approval, error) {
	store := g.opts.Approvals
	if store == nil {
		return approval.Approval{}, ErrNoApprovals
	}
	// A decision must not be stored without its record: while the audit
	// log cannot take one now (the store failing or stalled, the backlog
	// full), the approval is left as it is and the approver told.
	if err := g.admit(); err != nil {
		return approval.Approval{}, fmt.Errorf("%w: approval %s is left undecided: %w", ErrAuditUnavailable, id, err)
	}
	a, err := store.GetApproval(ctx, id)
	if err != nil {
		return approval.Approval{}, err
	}
	if by == "" {
		return a, fmt.Errorf("%w: approval %s: the deciding principal is empty", approval.ErrInvalid, id)
	}
	var refused error
	switch {
	case by == a.RequestedBy || by == a.Binding.Principal:
		refused = fmt.Errorf("approval %s: %s asked for it: %w; another principal with approval:decide must approve or deny it", id, by, ErrSelfApproval)
	case !g.Snapshot().MayDecideApproval(by, a.Binding.ToolID):
		refused = fmt.Errorf("%w: %s lacks {resource: approval, action: decide} on %s; grant it with scope all or {tool: %s}", ErrNotApprover, by, a.Binding.ToolID, a.Binding.ToolID)
	}
	if refused != nil {
		// A refused attempt is never silent.
		ev := ApprovalEvent(a, "", via, g.now())
		ev.EventType = string(toolgate.EventApprovalDecisionRefused)
		ev.Verdict, ev.Code = toolgate.Deny.String(), "approval_decision_refused"
		ev.Reason = refused.Error()
		ev.Details["attempted_by"] = by
		g.RecordEvent(ev)
		return a, refused
	}
	now := g.now()
	saved, err := store.DecideApproval(ctx, id, approve, by, reason, now)
	switch {
	case err == nil:
		return saved, g.recordApproval(ctx, ApprovalEvent(saved, by, via, now))
	case errors.Is(err, approval.ErrExpired) && a.Status == approval.StatusPending && saved.Status == approval.StatusExpired:
		g.recordApproval(ctx, ApprovalEvent(saved, "", via, now))
	case errors.Is(err, approval.ErrNotPending):
		// Deciding an approval that is already decided or used is refused,
		// and recorded.
		ev := ApprovalEvent(saved, "", via, now)
		ev.EventType = string(toolgate.EventApprovalDecisionRefused)
		ev.Verdict, ev.Code = toolgate.Deny.String(), "approval_not_pending"
		ev.Reason = fmt.Sprintf("approval %s is already %s; %s cannot decide it again", id, saved.Status, by)
		ev.Details["attempted_by"] = by
		g.RecordEvent(ev)
	}
	return saved, err
}

// recordApproval writes an approval event durably (a decision must not
// vanish from the log), or, if the store fails after the admission, queues
// it; without a recorder it does nothing.
func (g *Gate) recordApproval(ctx context.Context, ev audit.Event) error {
	if g.opts.Recorder == nil {
		return nil
	}
	if _, err := g.opts.Recorder.Record(ctx, ev); err != nil {
		// The store failed between the admission and the write: the event
		// is queued, never dropped (written once the store recovers, or
		// counted in the overflow summary).
		if d := g.opts.Recorder.RecordOrQueue(ctx, ev); d == audit.Lost {
			return fmt.Errorf("the approval was decided but its audit event could not be written: %w", err)
		}
	}
	return nil
}

// ApprovalEvent returns the audit event for an approval's status: granted
// (approved), denied, or expired; any other status gives an
// agent.tool.approval_requested event. The event carries the approval's
// binding, its correlation id (that of the call that asked), the approval
// id, and in details the status, decided_by (when by is set) and via.
func ApprovalEvent(a approval.Approval, by, via string, at time.Time) audit.Event {
	typ := toolgate.EventApprovalRequested
	what := "is pending"
	switch a.Status {
	case approval.StatusApproved:
		typ, what = toolgate.EventApprovalGranted, "was approved by "+by
	case approval.StatusDenied:
		typ, what = toolgate.EventApprovalDenied, "was denied by "+by
	case approval.StatusExpired:
		typ, what = toolgate.EventApprovalExpired, "expired"
	}
	reason := fmt.Sprintf("approval %s for %s %s", a.ID, a.Binding.ToolID, what)
	if a.Reason != "" {
		reason += ": " + a.Reason
	}
	details := map[string]any{"status": string(a.Status)}
	if by != "" {
		details["decided_by"] = by
	}
	if via != "" {
		details["via"] = via
	}
	if a.RequestedBy != "" && a.RequestedBy != a.Binding.Principal {
		// A delegate's call: it ran as the delegator (delegation.go).
		details["delegate"], details["delegator"] = a.RequestedBy, a.Binding.Principal
	}
	return audit.Event{
		EventType: string(typ), OccurredAt: at, CorrelationID: a.CorrelationID,
		AgentID: a.Binding.AgentID, AgentVersion: a.AgentVersion, Principal: a.Binding.Principal,
		InstanceID: a.Binding.InstanceID, Environment: a.Binding.Environment, ToolID: a.Binding.ToolID,
		ToolName: a.ToolName, Layer: string(toolgate.LayerApproval), Reason: reason,
		ArgsDigest: a.Binding.ArgsDigest, ApprovalID: a.ID, Details: details,
	}
}

// ExpireApprovals marks overdue approvals expired and records an
// agent.tool.approval_expired event for each. The gateway calls it
// periodically.
func (g *Gate) ExpireApprovals(ctx context.Context) (int, error) {
	store := g.opts.Approvals
	if store == nil {
		return 0, nil
	}
	expired, err := store.ExpireApprovals(ctx, g.now())
	now := g.now()
	for _, a := range expired {
		g.RecordEvent(ApprovalEvent(a, "", "expiry", now))
	}
	return len(expired), err
}
