package gate

import (
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/toolgate/toolgate"
	"github.com/toolgate/toolgate/authz"
	"github.com/toolgate/toolgate/policy"
)

// Delegation narrows the authority of the calls made with one token: such a
// call still runs as Identity.Principal (the delegator), and passes only
// what both the principal's grants in the current snapshot and the
// delegation's grants allow (authz.Snapshot.DecideDelegated). It is what an
// enforcement point's verifier makes of a verified token, never of anything
// the client or the model sends, and it holds no credential: a call that
// carries it can be queued, approved and resumed without storing the token.
//
// Two kinds exist: a delegation token's (Delegate is the subject it was
// handed to, Grants what it was handed) and a JWT's roles claim (Roles
// names declared Roles, whose grants are read from each snapshot, so a
// reload that changes a role applies at once). A Delegation is immutable
// once an Identity carries it; verifiers hand out one pointer per token so
// that Identity stays a cheap map key.
type Delegation struct {
	// ID identifies the token in reasons and the audit log ("dlg_..." for
	// a delegation token, "jwt:ISSUER:..." for a JWT's roles).
	ID string
	// Delegate is the subject the delegation was handed to; empty for a
	// JWT's roles (the principal itself calls).
	Delegate string
	// Grants are the delegated grants (delegation tokens).
	Grants []policy.Grant
	// Roles name declared Roles whose current grants narrow the
	// principal's (a JWT's roles claim).
	Roles []string
	// ExpiresAt ends it: a call decided at or after it is denied at the
	// grant layer (the zero time denies every call).
	ExpiresAt time.Time
}

// Delegated reports whether the identity acts under a delegation or a
// token's roles.
func (id Identity) Delegated() bool { return id.Delegation != nil }

// delegationCache compiles each Delegation once per snapshot: into an
// authz.Delegation, or, when it cannot be compiled, into the failed one
// that denies every call under it (the decision core says why).
type delegationCache struct {
	mu   sync.Mutex
	snap *authz.Snapshot
	m    map[*Delegation]*authz.Delegation
}

// maxCompiledDelegations bounds the cache; it is emptied when full.
const maxCompiledDelegations = 10_000

func (c *delegationCache) compile(snap *authz.Snapshot, principal string, d *Delegation) *authz.Delegation {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.snap != snap || len(c.m) >= maxCompiledDelegations {
		c.snap, c.m = snap, map[*Delegation]*authz.Delegation{}
	}
	if got, ok := c.m[d]; ok {
		return got
	}
	cd := compileDelegation(snap, principal, d)
	c.m[d] = cd
	return cd
}

func compileDelegation(snap *authz.Snapshot, principal string, d *Delegation) *authz.Delegation {
	grants := d.Grants
	if len(d.Roles) > 0 {
		grants = slices.Clone(d.Grants)
		for _, r := range d.Roles {
			role := snap.Role(r)
			if role == nil {
				return snap.FailedDelegation(d.ID, principal, fmt.Errorf("role %s named by token %s is no longer declared in the policy bundle", r, d.ID))
			}
			grants = append(grants, role.Grants...)
		}
	}
	delegate := d.Delegate
	if delegate == "" {
		delegate = principal
	}
	cd, err := snap.CompileDelegation(d.ID, principal, delegate, grants, d.ExpiresAt)
	if err != nil {
		return snap.FailedDelegation(d.ID, principal, err)
	}
	return cd
}

// decide is the one place the gate asks the decision core: Decide for a
// plain identity, DecideDelegated for one under a delegation (compiled for
// snap; its expiry and a failure to compile it are the core's to judge).
func (g *Gate) decide(snap *authz.Snapshot, call *toolgate.Call, id Identity) toolgate.Decision {
	if id.Delegation == nil {
		return snap.Decide(call)
	}
	return snap.DecideDelegated(call, g.dlg.compile(snap, call.Principal, id.Delegation))
}

// resolve is Resolve for id at now, through its delegation when it has
// one. The boolean says whether the answer may be cached for the snapshot
// (not under a delegation, whose expiry depends on the time).
func (g *Gate) resolve(snap *authz.Snapshot, id Identity) (authz.Resolution, bool) {
	ctx := id.Context()
	ctx.Now = g.now()
	if d := id.Delegation; d != nil {
		ctx.Delegation = g.dlg.compile(snap, id.Principal, d)
		return snap.Resolve(ctx), false
	}
	return snap.Resolve(ctx), true
}

// requestedBy is who asks for an approval: the delegate for a call made
// under a delegation token (so neither it nor its delegator, the binding's
// principal, can approve the call), the principal otherwise.
func requestedBy(id Identity) string {
	if id.Delegation != nil && id.Delegation.Delegate != "" {
		return id.Delegation.Delegate
	}
	return id.Principal
}

// delegationDetails adds to an event's details who delegated to whom, so
// the audit log says both: delegator (the principal the call ran as),
// delegate, and the token's id; or the roles a JWT narrowed the call to.
func delegationDetails(id Identity, details map[string]any) map[string]any {
	d := id.Delegation
	if d == nil {
		return details
	}
	if details == nil {
		details = map[string]any{}
	}
	details["delegation_id"] = d.ID
	if d.Delegate != "" {
		details["delegator"] = id.Principal
		details["delegate"] = d.Delegate
	}
	if len(d.Roles) > 0 {
		roles := make([]any, len(d.Roles))
		for i, r := range d.Roles {
			roles[i] = r
		}
		details["token_roles"] = roles
	}
	return details
}
