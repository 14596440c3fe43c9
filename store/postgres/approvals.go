package postgres

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/toolgate/toolgate/approval"
)

const approvalColumns = `id, binding_digest, principal, agent_id, instance_id, environment, tool_id, args_digest,
	status, requested_by, created_at, expires_at, decided_by, decided_at, reason, used_at, used_correlation_id,
	correlation_id, tool_name, agent_version, args`

func scanApproval(row pgx.Row) (approval.Approval, error) {
	var (
		a                 approval.Approval
		status            string
		decidedAt, usedAt *time.Time
		args              *string
	)
	err := row.Scan(&a.ID, &a.BindingDigest, &a.Binding.Principal, &a.Binding.AgentID, &a.Binding.InstanceID,
		&a.Binding.Environment, &a.Binding.ToolID, &a.Binding.ArgsDigest, &status, &a.RequestedBy,
		&a.CreatedAt, &a.ExpiresAt, &a.DecidedBy, &decidedAt, &a.Reason, &usedAt, &a.UsedCorrelationID,
		&a.CorrelationID, &a.ToolName, &a.AgentVersion, &args)
	if err != nil {
		return approval.Approval{}, err
	}
	a.Status = approval.Status(status)
	a.CreatedAt = a.CreatedAt.UTC()
	a.ExpiresAt = a.ExpiresAt.UTC()
	if decidedAt != nil {
		a.DecidedAt = decidedAt.UTC()
	}
	if usedAt != nil {
		a.UsedAt = usedAt.UTC()
	}
	if args != nil {
		a.Args = json.RawMessage(*args)
	}
	return a, nil
}

func collectApprovals(rows pgx.Rows) ([]approval.Approval, error) {
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (approval.Approval, error) { return scanApproval(row) })
}

// nullTime maps the zero time to NULL.
func nullTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

func nullString(b []byte) *string {
	if len(b) == 0 {
		return nil
	}
	s := string(b)
	return &s
}

// CreateApproval implements approval.Store.
func (s *Store) CreateApproval(ctx context.Context, a approval.Approval) error {
	if err := a.Validate(); err != nil {
		return err
	}
	tag, err := s.pool.Exec(ctx, `INSERT INTO `+s.approvals+` (`+approvalColumns+`)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21)
		ON CONFLICT (id) DO NOTHING`,
		a.ID, a.BindingDigest, a.Binding.Principal, a.Binding.AgentID, a.Binding.InstanceID,
		a.Binding.Environment, a.Binding.ToolID, a.Binding.ArgsDigest, string(a.Status), a.RequestedBy,
		a.CreatedAt, a.ExpiresAt, a.DecidedBy, nullTime(a.DecidedAt), a.Reason,
		nullTime(a.UsedAt), a.UsedCorrelationID, a.CorrelationID, a.ToolName, a.AgentVersion, nullString(a.Args))
	if err != nil {
		return fmt.Errorf("postgres: create approval %s: %w", a.ID, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("postgres: create approval %s: %w", a.ID, approval.ErrExists)
	}
	return nil
}

// GetApproval implements approval.Store.
func (s *Store) GetApproval(ctx context.Context, id string) (approval.Approval, error) {
	a, err := scanApproval(s.pool.QueryRow(ctx, `SELECT `+approvalColumns+` FROM `+s.approvals+` WHERE id = $1`, id))
	if errNoRows(err) {
		return approval.Approval{}, fmt.Errorf("postgres: approval %s: %w", id, approval.ErrNotFound)
	}
	if err != nil {
		return approval.Approval{}, fmt.Errorf("postgres: get approval %s: %w", id, err)
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
		st := make([]string, len(f.Status))
		for i, x := range f.Status {
			st[i] = string(x)
		}
		args = append(args, st)
		where = append(where, fmt.Sprintf("status = ANY($%d)", len(args)))
	}
	if f.BindingDigest != "" {
		args = append(args, f.BindingDigest)
		where = append(where, fmt.Sprintf("binding_digest = $%d", len(args)))
	}
	q := `SELECT ` + approvalColumns + ` FROM ` + s.approvals
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	q += " ORDER BY created_at, id"
	if f.Limit > 0 {
		args = append(args, f.Limit)
		q += fmt.Sprintf(" LIMIT $%d", len(args))
	}
	rows, err := s.pool.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("postgres: list approvals: %w", err)
	}
	out, err := collectApprovals(rows)
	if err != nil {
		return nil, fmt.Errorf("postgres: list approvals: %w", err)
	}
	return out, nil
}

// DecideApproval implements approval.Store: lock the row, apply
// approval.Approval.Decide, save, and NOTIFY, in one transaction.
func (s *Store) DecideApproval(ctx context.Context, id string, approve bool, by, reason string, now time.Time) (approval.Approval, error) {
	var (
		result  approval.Approval
		decided error
	)
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		cur, err := scanApproval(tx.QueryRow(ctx, `SELECT `+approvalColumns+` FROM `+s.approvals+` WHERE id = $1 FOR UPDATE`, id))
		if errNoRows(err) {
			return fmt.Errorf("approval %s: %w", id, approval.ErrNotFound)
		}
		if err != nil {
			return err
		}
		next, derr := cur.Decide(approve, by, reason, now)
		result, decided = next, derr
		if next.Status == cur.Status {
			return nil // nothing to save
		}
		if _, err := tx.Exec(ctx, `UPDATE `+s.approvals+` SET status = $1, decided_by = $2, decided_at = $3, reason = $4 WHERE id = $5`,
			string(next.Status), next.DecidedBy, nullTime(next.DecidedAt), next.Reason, id); err != nil {
			return err
		}
		return s.notify(ctx, tx, next)
	})
	if err != nil {
		return approval.Approval{}, fmt.Errorf("postgres: decide approval %s: %w", id, err)
	}
	return result, decided
}

// ConsumeApproval implements approval.Store. The UPDATE locks the chosen row
// and re-checks status and used_at after any wait, so of concurrent
// consumers of one approval exactly one gets it.
func (s *Store) ConsumeApproval(ctx context.Context, bindingDigest string, now time.Time, correlationID string) (approval.Approval, bool, error) {
	var (
		a     approval.Approval
		found bool
	)
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var err error
		a, err = scanApproval(tx.QueryRow(ctx, `UPDATE `+s.approvals+` SET status = 'used', used_at = $2, used_correlation_id = $3
			WHERE id = (
				SELECT id FROM `+s.approvals+`
				WHERE binding_digest = $1 AND status = 'approved' AND used_at IS NULL AND expires_at > $2
				ORDER BY expires_at, id LIMIT 1
				FOR UPDATE)
			AND status = 'approved' AND used_at IS NULL
			RETURNING `+approvalColumns, bindingDigest, now, correlationID))
		if errNoRows(err) {
			return nil
		}
		if err != nil {
			return err
		}
		found = true
		return s.notify(ctx, tx, a)
	})
	if err != nil {
		return approval.Approval{}, false, fmt.Errorf("postgres: consume approval: %w", err)
	}
	return a, found, nil
}

// ExpireApprovals implements approval.Store.
func (s *Store) ExpireApprovals(ctx context.Context, now time.Time) ([]approval.Approval, error) {
	var out []approval.Approval
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `UPDATE `+s.approvals+` SET status = 'expired',
			reason = CASE WHEN status = 'pending' THEN 'expired before it was decided' ELSE reason END
			WHERE status IN ('pending', 'approved') AND used_at IS NULL AND expires_at <= $1
			RETURNING `+approvalColumns, now)
		if err != nil {
			return err
		}
		if out, err = collectApprovals(rows); err != nil {
			return err
		}
		return s.notify(ctx, tx, out...)
	})
	if err != nil {
		return nil, fmt.Errorf("postgres: expire approvals: %w", err)
	}
	approval.SortByCreation(out)
	return out, nil
}

// maxPayload keeps NOTIFY payloads under PostgreSQL's 8000-byte limit.
const maxPayload = 7900

// notify queues a NOTIFY for each record, delivered when tx commits. The
// payload is the record's JSON; one too large for NOTIFY is sent as its id
// alone and read back by the listener.
func (s *Store) notify(ctx context.Context, tx pgx.Tx, as ...approval.Approval) error {
	if len(as) == 0 {
		return nil
	}
	payloads := make([]string, len(as))
	for i, a := range as {
		b, err := json.Marshal(a)
		if err != nil {
			return err
		}
		if len(b) > maxPayload {
			b, _ = json.Marshal(map[string]string{"id": a.ID})
		}
		payloads[i] = string(b)
	}
	_, err := tx.Exec(ctx, `SELECT pg_notify($1, p) FROM unnest($2::text[]) AS p`, s.channel, payloads)
	return err
}

// ListenApprovals implements approval.Listener with LISTEN on a dedicated
// connection (not returned to the pool). Changes committed by any Store on
// the same schema, in any process, are delivered. It returns ctx's error
// when ctx ends, or the error that broke the connection; the caller
// decides whether to listen again (and re-read what it waits for).
func (s *Store) ListenApprovals(ctx context.Context, ready func(), fn func(approval.Approval)) error {
	pc, err := s.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("postgres: listen: %w", err)
	}
	conn := pc.Hijack()
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{s.channel}.Sanitize()); err != nil {
		return fmt.Errorf("postgres: listen: %w", err)
	}
	if ready != nil {
		ready()
	}
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("postgres: listen: %w", err)
		}
		var a approval.Approval
		if err := json.Unmarshal([]byte(n.Payload), &a); err != nil {
			return fmt.Errorf("postgres: listen: bad payload: %w", err)
		}
		if a.Status == "" { // too large for NOTIFY: read it back
			if a, err = s.GetApproval(ctx, a.ID); err != nil {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				return fmt.Errorf("postgres: listen: %w", err)
			}
		}
		fn(a)
	}
}
