package httpapi

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/toolgate/toolgate"
	"github.com/toolgate/toolgate/approval"
	"github.com/toolgate/toolgate/audit"
)

// ErrSelfApproval is wrapped when a principal tries to approve or deny an
// approval that its own call asked for: someone else must decide it.
var ErrSelfApproval = errors.New("the principal whose call asked for an approval cannot decide it")

// DecideApproval approves (approve true) or denies approval id as principal
// by, at now, with reason. It is the one approval-deciding rule shared by
// the HTTP API and the CLI:
//
//   - by must not be empty (approval.ErrInvalid) and must not be the
//     principal the call ran as, nor the one that requested it
//     (ErrSelfApproval, checked before anything is changed);
//   - the store applies approval.Approval.Decide atomically.
//
// It returns the saved record, and the audit event to record for the
// change (agent.tool.approval_granted or _denied; _expired when the
// approval turned out to be expired and this call marked it so), or nil
// when nothing changed. via names the caller ("http", "cli") in the event's
// details. Errors are the store's (approval.ErrNotFound, ErrNotPending,
// ErrExpired with the expired record) or ErrSelfApproval, wrapped.
func DecideApproval(ctx context.Context, store approval.Store, id string, approve bool, by, reason, via string, now time.Time) (approval.Approval, *audit.Event, error) {
	if by == "" {
		return approval.Approval{}, nil, fmt.Errorf("%w: approval %s: the deciding principal is empty", approval.ErrInvalid, id)
	}
	cur, err := store.GetApproval(ctx, id)
	if err != nil {
		return approval.Approval{}, nil, err
	}
	if by == cur.Binding.Principal || by == cur.RequestedBy {
		return cur, nil, fmt.Errorf("approval %s: %s asked for it: %w; another principal must approve or deny it", id, by, ErrSelfApproval)
	}
	a, err := store.DecideApproval(ctx, id, approve, by, reason, now)
	switch {
	case err == nil:
		ev := ApprovalEvent(a, by, via, now)
		return a, &ev, nil
	case errors.Is(err, approval.ErrExpired) && cur.Status == approval.StatusPending && a.Status == approval.StatusExpired:
		ev := ApprovalEvent(a, "", via, now)
		return a, &ev, err
	}
	return a, nil, err
}

// ApprovalEvent returns the audit event for an approval's status: granted
// (approved), denied, or expired; any other status gives an
// agent.tool.approval_requested event. The event carries the approval's
// binding (principal, agent, instance, environment, tool id, args digest),
// its correlation id (that of the call that asked), the approval id, and in
// details the approval's status, decided_by (when by is set) and via.
// Verdict and code are empty: the event is not a call decision.
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
	return audit.Event{
		EventType: string(typ), OccurredAt: at, CorrelationID: a.CorrelationID,
		AgentID: a.Binding.AgentID, AgentVersion: a.AgentVersion, Principal: a.Binding.Principal,
		InstanceID: a.Binding.InstanceID, Environment: a.Binding.Environment, ToolID: a.Binding.ToolID,
		ToolName: a.ToolName, Layer: string(toolgate.LayerApproval), Reason: reason,
		ArgsDigest: a.Binding.ArgsDigest, ApprovalID: a.ID, Details: details,
	}
}
