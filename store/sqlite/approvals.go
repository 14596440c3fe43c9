package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/toolgate/toolgate/approval"
)

const approvalColumns = `id, binding_digest, principal, agent_id, instance_id, environment, tool_id, args_digest,
	status, requested_by, created_at, expires_at, decided_by, decided_at, reason, used_at, used_correlation_id,
	correlation_id, tool_name, agent_version, args`

type scanner interface{ Scan(dest ...any) error }

func scanApproval(sc scanner) (approval.Approval, error) {
	var (
		a                 approval.Approval
		status            string
		created, expires  int64
		decidedAt, usedAt sql.NullInt64
		args              sql.NullString
	)
	err := sc.Scan(&a.ID, &a.BindingDigest, &a.Binding.Principal, &a.Binding.AgentID, &a.Binding.InstanceID,
		&a.Binding.Environment, &a.Binding.ToolID, &a.Binding.ArgsDigest, &status, &a.RequestedBy,
		&created, &expires, &a.DecidedBy, &decidedAt, &a.Reason, &usedAt, &a.UsedCorrelationID,
		&a.CorrelationID, &a.ToolName, &a.AgentVersion, &args)
	if err != nil {
		return approval.Approval{}, err
	}
	a.Status = approval.Status(status)
	a.CreatedAt = fromNanos(created)
	a.ExpiresAt = fromNanos(expires)
	if decidedAt.Valid {
		a.DecidedAt = fromNanos(decidedAt.Int64)
	}
	if usedAt.Valid {
		a.UsedAt = fromNanos(usedAt.Int64)
	}
	if args.Valid {
		a.Args = []byte(args.String)
	}
	return a, nil
}

func fromNanos(n int64) time.Time { return time.Unix(0, n).UTC() }

// nanos encodes t as unix nanoseconds; the zero time is NULL.
func nanos(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t.UnixNano()
}

func nullString(b []byte) any {
	if len(b) == 0 {
		return nil
	}
	return string(b)
}

// CreateApproval implements approval.Store.
func (s *Store) CreateApproval(ctx context.Context, a approval.Approval) error {
	if err := a.Validate(); err != nil {
		return err
	}
	var got string
	err := s.db.QueryRowContext(ctx, `INSERT INTO approvals (`+approvalColumns+`)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (id) DO NOTHING RETURNING id`,
		a.ID, a.BindingDigest, a.Binding.Principal, a.Binding.AgentID, a.Binding.InstanceID,
		a.Binding.Environment, a.Binding.ToolID, a.Binding.ArgsDigest, string(a.Status), a.RequestedBy,
		a.CreatedAt.UnixNano(), a.ExpiresAt.UnixNano(), a.DecidedBy, nanos(a.DecidedAt), a.Reason,
		nanos(a.UsedAt), a.UsedCorrelationID, a.CorrelationID, a.ToolName, a.AgentVersion, nullString(a.Args)).Scan(&got)
	if errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("sqlite: create approval %s: %w", a.ID, approval.ErrExists)
	}
	if err != nil {
		return fmt.Errorf("sqlite: create approval %s: %w", a.ID, err)
	}
	return nil
}

// GetApproval implements approval.Store.
func (s *Store) GetApproval(ctx context.Context, id string) (approval.Approval, error) {
	a, err := scanApproval(s.db.QueryRowContext(ctx, `SELECT `+approvalColumns+` FROM approvals WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return approval.Approval{}, fmt.Errorf("sqlite: approval %s: %w", id, approval.ErrNotFound)
	}
	if err != nil {
		return approval.Approval{}, fmt.Errorf("sqlite: get approval %s: %w", id, err)
	}
	return a, nil
}

// ListApprovals implements approval.Store.
func (s *Store) ListApprovals(ctx context.Context, f approval.Filter) ([]approval.Approval, error) {
	var (
		where []string
		args  []any
	)
	if len(f.Status) > 0 {
		ph := make([]string, len(f.Status))
		for i, st := range f.Status {
			ph[i] = "?"
			args = append(args, string(st))
		}
		where = append(where, "status IN ("+strings.Join(ph, ", ")+")")
	}
	if f.BindingDigest != "" {
		where = append(where, "binding_digest = ?")
		args = append(args, f.BindingDigest)
	}
	q := `SELECT ` + approvalColumns + ` FROM approvals`
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	q += " ORDER BY created_at, id"
	if f.Limit > 0 {
		q += " LIMIT ?"
		args = append(args, f.Limit)
	}
	rows, err := s.db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("sqlite: list approvals: %w", err)
	}
	defer rows.Close()
	var out []approval.Approval
	for rows.Next() {
		a, err := scanApproval(rows)
		if err != nil {
			return nil, fmt.Errorf("sqlite: list approvals: %w", err)
		}
		out = append(out, a)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("sqlite: list approvals: %w", err)
	}
	return out, nil
}

// DecideApproval implements approval.Store: read, apply
// approval.Approval.Decide, and save, in one BEGIN IMMEDIATE transaction.
func (s *Store) DecideApproval(ctx context.Context, id string, approve bool, by, reason string, now time.Time) (approval.Approval, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return approval.Approval{}, fmt.Errorf("sqlite: decide approval %s: begin: %w", id, err)
	}
	defer tx.Rollback()
	cur, err := scanApproval(tx.QueryRowContext(ctx, `SELECT `+approvalColumns+` FROM approvals WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return approval.Approval{}, fmt.Errorf("sqlite: approval %s: %w", id, approval.ErrNotFound)
	}
	if err != nil {
		return approval.Approval{}, fmt.Errorf("sqlite: decide approval %s: %w", id, err)
	}
	next, derr := cur.Decide(approve, by, reason, now)
	if next.Status == cur.Status {
		return cur, derr // nothing to save
	}
	if _, err := tx.ExecContext(ctx, `UPDATE approvals SET status = ?, decided_by = ?, decided_at = ?, reason = ? WHERE id = ?`,
		string(next.Status), next.DecidedBy, nanos(next.DecidedAt), next.Reason, id); err != nil {
		return approval.Approval{}, fmt.Errorf("sqlite: decide approval %s: %w", id, err)
	}
	if err := tx.Commit(); err != nil {
		return approval.Approval{}, fmt.Errorf("sqlite: decide approval %s: commit: %w", id, err)
	}
	s.hub.publish(next)
	return next, derr
}

// ConsumeApproval implements approval.Store with one UPDATE … RETURNING;
// SQLite runs writers one at a time, so exactly one consumer wins.
func (s *Store) ConsumeApproval(ctx context.Context, bindingDigest string, now time.Time, correlationID string) (approval.Approval, bool, error) {
	n := now.UnixNano()
	row := s.db.QueryRowContext(ctx, `UPDATE approvals SET status = 'used', used_at = ?, used_correlation_id = ?
		WHERE id = (
			SELECT id FROM approvals
			WHERE binding_digest = ? AND status = 'approved' AND used_at IS NULL AND expires_at > ?
			ORDER BY expires_at, id LIMIT 1)
		AND status = 'approved' AND used_at IS NULL
		RETURNING `+approvalColumns, n, correlationID, bindingDigest, n)
	a, err := scanApproval(row)
	if errors.Is(err, sql.ErrNoRows) {
		return approval.Approval{}, false, nil
	}
	if err != nil {
		return approval.Approval{}, false, fmt.Errorf("sqlite: consume approval: %w", err)
	}
	s.hub.publish(a)
	return a, true, nil
}

// ExpireApprovals implements approval.Store.
func (s *Store) ExpireApprovals(ctx context.Context, now time.Time) ([]approval.Approval, error) {
	rows, err := s.db.QueryContext(ctx, `UPDATE approvals SET status = 'expired',
		reason = CASE WHEN status = 'pending' THEN 'expired before it was decided' ELSE reason END
		WHERE status IN ('pending', 'approved') AND used_at IS NULL AND expires_at <= ?
		RETURNING `+approvalColumns, now.UnixNano())
	if err != nil {
		return nil, fmt.Errorf("sqlite: expire approvals: %w", err)
	}
	defer rows.Close()
	var out []approval.Approval
	for rows.Next() {
		a, err := scanApproval(rows)
		if err != nil {
			return nil, fmt.Errorf("sqlite: expire approvals: %w", err)
		}
		out = append(out, a)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("sqlite: expire approvals: %w", err)
	}
	approval.SortByCreation(out)
	s.hub.publish(out...)
	return out, nil
}
