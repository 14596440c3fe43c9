// Package approval holds the approvals that turn a require_approval decision
// into a one-time allow (docs/design.md, "Vocabulary"): an approval is bound to
// the exact call (principal, agent, instance, environment, tool id, digest
// of the canonical arguments), is used at most once, and expires.
//
// The package defines the record ([Approval]), the binding and its digest
// ([Binding]; the argument digest is toolgate.ParseArgs's), the state transitions every
// store applies ([Approval.Decide]), and the [Store] interface implemented
// by store/sqlite and store/postgres. Stores never read the clock: every
// operation that depends on time takes it as an argument.
package approval

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Sentinel errors; stores wrap them with %w, so test with errors.Is.
var (
	// ErrNotFound: no approval has that id.
	ErrNotFound = errors.New("approval: not found")
	// ErrNotPending: the approval was already decided or used.
	ErrNotPending = errors.New("approval: not pending")
	// ErrExpired: the approval expired before it was decided.
	ErrExpired = errors.New("approval: expired")
	// ErrExists: Create with an id that is already stored.
	ErrExists = errors.New("approval: id already exists")
	// ErrInvalid: an approval that fails Validate, or a bad argument.
	ErrInvalid = errors.New("approval: invalid")
)

// Binding is what an approval is bound to: exactly one call. All fields are
// compared exactly; ArgsDigest is ArgsDigest of the call's arguments.
type Binding struct {
	// Principal is the subject the call runs as.
	Principal string `json:"principal"`
	// Requester, when set, is the delegate that made the call under a
	// delegation from Principal: the approval is then the delegate's
	// alone (neither the delegator nor another delegate can use it).
	// Empty for a call made by the principal itself, which keeps the
	// digest of such bindings unchanged. Stores keep it as RequestedBy
	// (and in BindingDigest), not as a binding column.
	Requester string `json:"requester,omitempty"`
	// AgentID is the calling agent.
	AgentID string `json:"agent_id"`
	// InstanceID is the business instance ("" for none).
	InstanceID string `json:"instance_id"`
	// Environment is the instance's environment ("" for none).
	Environment string `json:"environment"`
	// DeploymentMode is the mode the call was decided in ("production"):
	// an approval asked in one mode is never used in another. It is part
	// of BindingDigest (stores keep the digest, not a column).
	DeploymentMode string `json:"deployment_mode,omitempty"`
	// ToolID is the canonical tool id ("tool:supabase-write").
	ToolID string `json:"tool_id"`
	// ArgsDigest is ArgsDigest of the call's arguments.
	ArgsDigest string `json:"args_digest"`
}

// bindingKey lists the binding's fields with keys in sorted order, so its
// encoding is canonical.
type bindingKey struct {
	AgentID        string `json:"agent_id"`
	ArgsDigest     string `json:"args_digest"`
	DeploymentMode string `json:"deployment_mode,omitempty"`
	Environment    string `json:"environment"`
	InstanceID     string `json:"instance_id"`
	Principal      string `json:"principal"`
	Requester      string `json:"requester,omitempty"`
	ToolID         string `json:"tool_id"`
}

// Digest returns hex(sha256(canonical JSON of the binding)) (64 lower-case
// hex characters), where the canonical JSON is the object of the fields
// with keys sorted: {"agent_id":…,"args_digest":…,"deployment_mode":…,
// "environment":…,"instance_id":…,"principal":…,"requester":…,"tool_id":…}
// (deployment_mode and requester left out when empty). Every field is a
// JSON string, so no two bindings share a digest.
func (b Binding) Digest() string {
	j, _ := json.Marshal(bindingKey{ // strings only: cannot fail
		AgentID:        b.AgentID,
		ArgsDigest:     b.ArgsDigest,
		DeploymentMode: b.DeploymentMode,
		Environment:    b.Environment,
		InstanceID:     b.InstanceID,
		Principal:      b.Principal,
		Requester:      b.Requester,
		ToolID:         b.ToolID,
	})
	sum := sha256.Sum256(j)
	return hex.EncodeToString(sum[:])
}

// Status is where an approval is in its life:
// pending → approved → used, pending → denied, pending|approved → expired.
type Status string

// Statuses.
const (
	StatusPending  Status = "pending"
	StatusApproved Status = "approved"
	StatusDenied   Status = "denied"
	StatusExpired  Status = "expired"
	StatusUsed     Status = "used"
)

// Valid reports whether s is one of the five statuses.
func (s Status) Valid() bool {
	switch s {
	case StatusPending, StatusApproved, StatusDenied, StatusExpired, StatusUsed:
		return true
	}
	return false
}

// Approval is one request for approval and what became of it. Times are
// UTC; PostgreSQL keeps microseconds, so NewApproval truncates to them.
type Approval struct {
	// ID is random and unguessable ("apr_" + 26 base32 characters, 130 bits).
	ID string `json:"id"`
	// Binding is the call this approval allows.
	Binding Binding `json:"binding"`
	// BindingDigest is Binding.Digest(); Consume looks approvals up by it.
	BindingDigest string `json:"binding_digest"`
	// Status is where the approval is in its life.
	Status Status `json:"status"`
	// RequestedBy is the principal the call that asked ran as.
	RequestedBy string `json:"requested_by"`
	// CreatedAt is when the approval was asked for.
	CreatedAt time.Time `json:"created_at"`
	// ExpiresAt ends the approval: it can be decided and used only while
	// now < ExpiresAt.
	ExpiresAt time.Time `json:"expires_at"`
	// DecidedBy is who approved or denied ("" while pending or if expired).
	DecidedBy string `json:"decided_by,omitempty"`
	// DecidedAt is when it was approved or denied (zero if not).
	DecidedAt time.Time `json:"decided_at,omitzero"`
	// Reason is the decider's reason, or the reason it expired.
	Reason string `json:"reason,omitempty"`
	// UsedAt and UsedCorrelationID say which call used it.
	UsedAt            time.Time `json:"used_at,omitzero"`
	UsedCorrelationID string    `json:"used_correlation_id,omitempty"`

	// For display to the approver; not part of the binding.

	// CorrelationID is that of the call that asked for the approval.
	CorrelationID string `json:"correlation_id,omitempty"`
	// ToolName is the tool name as called.
	ToolName string `json:"tool_name,omitempty"`
	// AgentVersion is the version of the agent that asked.
	AgentVersion string `json:"agent_version,omitempty"`
	// Args are the canonical arguments, so the approver sees what the call
	// would do; empty if the gateway chose not to store them.
	Args json.RawMessage `json:"args,omitempty"`
}

// NewID returns a new approval id: "apr_" followed by 26 base32 characters
// from crypto/rand (130 bits).
func NewID() string { return "apr_" + rand.Text() }

// NewApproval returns a pending approval for b with a new id, created at now
// and expiring after ttl (both truncated to microseconds, in UTC). The
// display fields are left for the caller to fill. It fails (ErrInvalid) when
// ttl is not positive or b is incomplete.
func NewApproval(b Binding, requestedBy string, now time.Time, ttl time.Duration) (Approval, error) {
	if ttl <= 0 {
		return Approval{}, fmt.Errorf("%w: ttl %v is not positive", ErrInvalid, ttl)
	}
	now = now.UTC().Truncate(time.Microsecond)
	a := Approval{
		ID:            NewID(),
		Binding:       b,
		BindingDigest: b.Digest(),
		Status:        StatusPending,
		RequestedBy:   requestedBy,
		CreatedAt:     now,
		ExpiresAt:     now.Add(ttl).Truncate(time.Microsecond),
	}
	if err := a.Validate(); err != nil {
		return Approval{}, err
	}
	return a, nil
}

// Validate checks what Create requires: an id, a binding with principal,
// agent id, tool id and args digest, the matching BindingDigest, a known
// status, and ExpiresAt after CreatedAt. Errors wrap ErrInvalid.
func (a Approval) Validate() error {
	switch {
	case a.ID == "":
		return fmt.Errorf("%w: empty id", ErrInvalid)
	case a.Binding.Principal == "" || a.Binding.AgentID == "" || a.Binding.ToolID == "" || a.Binding.ArgsDigest == "":
		return fmt.Errorf("%w: approval %s: binding needs principal, agent_id, tool_id and args_digest", ErrInvalid, a.ID)
	case a.BindingDigest != a.Binding.Digest():
		return fmt.Errorf("%w: approval %s: binding_digest does not match the binding", ErrInvalid, a.ID)
	case !a.Status.Valid():
		return fmt.Errorf("%w: approval %s: unknown status %q", ErrInvalid, a.ID, a.Status)
	case !a.ExpiresAt.After(a.CreatedAt):
		return fmt.Errorf("%w: approval %s: expires_at is not after created_at", ErrInvalid, a.ID)
	}
	return nil
}

// Expired reports whether the approval's time is up at now (now >= ExpiresAt).
func (a Approval) Expired(now time.Time) bool { return !now.Before(a.ExpiresAt) }

// Usable reports whether Consume may use the approval at now: approved, not
// used, not expired.
func (a Approval) Usable(now time.Time) bool {
	return a.Status == StatusApproved && a.UsedAt.IsZero() && !a.Expired(now)
}

// Decide applies a decision to a and returns the new record. It is the one
// transition rule every store applies under its row lock:
//
//   - pending and not expired: approved (approve) or denied, with DecidedBy,
//     DecidedAt (now, UTC) and Reason set; error nil.
//   - pending but expired at now: the record becomes expired (Reason
//     "expired before it was decided"), and the error wraps ErrExpired; the
//     store must still save the record.
//   - expired already: a unchanged, error wraps ErrExpired.
//   - anything else: a unchanged, error wraps ErrNotPending.
//
// by must be non-empty (ErrInvalid).
func (a Approval) Decide(approve bool, by, reason string, now time.Time) (Approval, error) {
	if by == "" {
		return a, fmt.Errorf("%w: approval %s: decided_by is empty", ErrInvalid, a.ID)
	}
	switch {
	case a.Status == StatusExpired:
		return a, fmt.Errorf("approval %s: %w", a.ID, ErrExpired)
	case a.Status != StatusPending:
		return a, fmt.Errorf("approval %s is %s: %w", a.ID, a.Status, ErrNotPending)
	case a.Expired(now):
		a.Status = StatusExpired
		a.Reason = "expired before it was decided"
		return a, fmt.Errorf("approval %s expired at %s: %w", a.ID, a.ExpiresAt.Format(time.RFC3339), ErrExpired)
	}
	if approve {
		a.Status = StatusApproved
	} else {
		a.Status = StatusDenied
	}
	a.DecidedBy = by
	a.DecidedAt = now.UTC()
	a.Reason = reason
	return a, nil
}

// Filter selects approvals for List.
type Filter struct {
	// Status keeps approvals in any of these statuses; empty keeps all.
	Status []Status
	// BindingDigest, when set, keeps only approvals for that binding.
	BindingDigest string
	// Limit caps the number returned; 0 means no cap.
	Limit int
}

// Store keeps approvals. Implementations: store/sqlite, store/postgres; the
// contract is the suite in package storetest. Times are arguments, never
// read from a clock.
type Store interface {
	// CreateApproval stores a new approval (any status, so imports work;
	// normally pending). Errors: ErrInvalid (fails Validate), ErrExists.
	CreateApproval(ctx context.Context, a Approval) error
	// GetApproval returns the approval with that id, or ErrNotFound.
	GetApproval(ctx context.Context, id string) (Approval, error)
	// ListApprovals returns the approvals f selects, oldest first
	// (created_at, then id).
	ListApprovals(ctx context.Context, f Filter) ([]Approval, error)
	// DecideApproval approves (approve true) or denies a pending approval,
	// atomically, by the rules of Approval.Decide, and returns the saved
	// record. Errors: ErrNotFound; ErrExpired (the record, now expired, is
	// saved and returned with the error); ErrNotPending (the current record
	// is returned); ErrInvalid (empty by).
	DecideApproval(ctx context.Context, id string, approve bool, by, reason string, now time.Time) (Approval, error)
	// ConsumeApproval atomically marks one approval for bindingDigest that
	// is approved, unused and unexpired at now as used (UsedAt now,
	// UsedCorrelationID correlationID) and returns it with true. Among
	// several, the one expiring first is used. With none it returns false
	// and no error. Of concurrent consumers of a single approval, across
	// processes, exactly one gets true.
	ConsumeApproval(ctx context.Context, bindingDigest string, now time.Time, correlationID string) (Approval, bool, error)
	// ExpireApprovals marks every pending or approved-but-unused approval
	// with ExpiresAt <= now as expired and returns them (as saved), so the
	// caller can emit approval_expired events.
	ExpireApprovals(ctx context.Context, now time.Time) ([]Approval, error)
}

// Listener is implemented by stores that can tell a waiter about changes
// made by other goroutines or, for PostgreSQL, other replicas.
type Listener interface {
	// ListenApprovals subscribes to approval changes: it calls ready (if
	// not nil) once the subscription is active, then fn with the saved
	// record after each status change (decide, consume, expire), until ctx
	// ends; it returns ctx's error or the error that broke the
	// subscription. Changes made before ready are not replayed, so a waiter
	// re-reads what it waits for from ready on. fn and ready run on the
	// listener's goroutine and must not block long.
	ListenApprovals(ctx context.Context, ready func(), fn func(Approval)) error
}

// SortByCreation sorts as in place, oldest first (CreatedAt, then ID): the
// order every List and Expire returns.
func SortByCreation(as []Approval) {
	slices.SortFunc(as, func(a, b Approval) int {
		if c := a.CreatedAt.Compare(b.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
}
