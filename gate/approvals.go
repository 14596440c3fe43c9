package gate

import (
	"context"
	"errors"
	"fmt"

	"github.com/toolgate/toolgate"
	"github.com/toolgate/toolgate/approval"
	"github.com/toolgate/toolgate/audit"
)

// ErrNotApprover is returned when the principal may not decide the approval:
// it lacks approval:decide on the tool, or it asked for the call itself.
var ErrNotApprover = errors.New("not allowed to decide this approval")

// ErrNoApprovals is returned when the gate has no approval store.
var ErrNoApprovals = errors.New("this gateway has no approval store")

// DecideApproval approves (approve true) or denies the pending approval id
// as principal by. by needs {resource: approval, action: decide} on the
// tool (scope all or the tool) and must not be the principal that asked
// for the call. The decision is recorded as agent.tool.approval_granted or
// _denied; an approval found expired is recorded as _expired.
func (g *Gate) DecideApproval(ctx context.Context, id string, approve bool, by, reason string) (approval.Approval, error) {
	store := g.opts.Approvals
	if store == nil {
		return approval.Approval{}, ErrNoApprovals
	}
	a, err := store.GetApproval(ctx, id)
	if err != nil {
		return approval.Approval{}, err
	}
	if by == "" {
		return a, fmt.Errorf("%w: no approver principal given", ErrNotApprover)
	}
	if by == a.RequestedBy || by == a.Binding.Principal {
		return a, fmt.Errorf("%w: %s asked for this call and cannot approve its own call; another principal with approval:decide must", ErrNotApprover, by)
	}
	if !g.Snapshot().MayDecideApproval(by, a.Binding.ToolID) {
		return a, fmt.Errorf("%w: %s lacks {resource: approval, action: decide} on %s; grant it with scope all or {tool: %s}", ErrNotApprover, by, a.Binding.ToolID, a.Binding.ToolID)
	}
	saved, err := store.DecideApproval(ctx, id, approve, by, reason, g.now())
	if errors.Is(err, approval.ErrExpired) {
		g.approvalEvent(saved, toolgate.EventApprovalExpired, "the approval expired before it was decided")
		return saved, err
	}
	if err != nil {
		return saved, err
	}
	t, why := toolgate.EventApprovalDenied, "denied by "+by
	if approve {
		t, why = toolgate.EventApprovalGranted, "approved by "+by
	}
	if reason != "" {
		why += ": " + reason
	}
	g.approvalEvent(saved, t, why)
	return saved, nil
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
	for _, a := range expired {
		g.approvalEvent(a, toolgate.EventApprovalExpired, "the approval expired unused")
	}
	return len(expired), err
}

func (g *Gate) approvalEvent(a approval.Approval, t toolgate.EventType, reason string) {
	g.RecordEvent(audit.Event{EventType: string(t), CorrelationID: a.CorrelationID, AgentID: a.Binding.AgentID,
		AgentVersion: a.AgentVersion, Principal: a.Binding.Principal, InstanceID: a.Binding.InstanceID,
		Environment: a.Binding.Environment, ToolID: a.Binding.ToolID, ToolName: a.ToolName, ArgsDigest: a.Binding.ArgsDigest,
		ApprovalID: a.ID, Reason: reason, Details: map[string]any{"decided_by": a.DecidedBy}})
}
