package identity

import (
	"fmt"
	"time"

	"github.com/toolgate/toolgate/gate"
	"github.com/toolgate/toolgate/policy"
)

// DelegationRequest is the body of POST /v1/delegations. The delegator is
// the caller's authenticated principal, never a body field.
//
//	{"delegate": "svc:nightly-report",
//	 "grants": [{"resource": "tool", "action": "invoke", "scope": {"tool": "bifrost.query"}},
//	            "bifrost_query:read:vala.datasets.tickets"],
//	 "ttl": "1h"}
type DelegationRequest struct {
	// Delegate is the subject the token is for (required).
	Delegate string `json:"delegate"`
	// AgentID, InstanceID, Environment and DeploymentMode may be left
	// out (the caller's are used) or repeat the caller's: a delegation
	// never moves to another agent, tenant, environment or mode than its
	// delegator's credential is bound to (the credential's binding is part
	// of the authority; an operator binds a token to another agent with
	// toolgate delegate).
	AgentID        string `json:"agent_id"`
	InstanceID     string `json:"instance_id"`
	Environment    string `json:"environment"`
	DeploymentMode string `json:"deployment_mode"`
	// Grants are what is handed (at least one), objects or
	// "resource:action:scope" strings.
	Grants []Grant `json:"grants"`
	// TTL is a Go duration ("1h"); empty means the bundle's default_ttl.
	TTL string `json:"ttl"`
}

// MintRequest turns the body into a MintRequest for caller. Errors wrap
// ErrInvalid, or ErrDelegated when caller is itself a delegate or a
// role-narrowed token (a delegation is not handed on: the delegator mints
// each one with its own credential).
func (r DelegationRequest) MintRequest(caller gate.Identity) (MintRequest, error) {
	if caller.Delegation != nil {
		return MintRequest{}, fmt.Errorf("%w: the caller holds a delegation token or a role-narrowed token (%s), which cannot hand authority on", ErrDelegated, caller.Delegation.ID)
	}
	if caller.Principal == "" {
		return MintRequest{}, fmt.Errorf("%w: the caller's credential names no principal", ErrInvalid)
	}
	for _, f := range []struct{ name, body, want string }{
		{"agent_id", r.AgentID, caller.AgentID},
		{"instance_id", r.InstanceID, caller.InstanceID},
		{"environment", r.Environment, caller.Environment},
		{"deployment_mode", r.DeploymentMode, caller.DeploymentMode},
	} {
		if f.body != "" && f.body != f.want {
			return MintRequest{}, fmt.Errorf("%w: %s %q is not the caller's (%q); a delegation stays where its delegator's credential is bound", ErrInvalid, f.name, f.body, f.want)
		}
	}
	m := MintRequest{Delegator: caller.Principal, Delegate: r.Delegate, AgentID: caller.AgentID,
		InstanceID: caller.InstanceID, Environment: caller.Environment, DeploymentMode: caller.DeploymentMode}
	if r.TTL != "" {
		d, err := time.ParseDuration(r.TTL)
		if err != nil || d <= 0 {
			return MintRequest{}, fmt.Errorf("%w: ttl %q is not a positive duration like 30m or 1h", ErrInvalid, r.TTL)
		}
		m.TTL = d
	}
	m.Grants = make([]policy.Grant, len(r.Grants))
	for i, g := range r.Grants {
		m.Grants[i] = g.Policy()
	}
	return m, nil
}
