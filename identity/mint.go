package identity

import (
	"crypto/rand"
	"encoding/base32"
	"fmt"
	"strings"
	"time"
	"unicode"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"

	"github.com/toolgate/toolgate/audit"
	"github.com/toolgate/toolgate/cond"
	"github.com/toolgate/toolgate/policy"
)

// MintRequest asks for a delegation token: Delegator hands Grants to
// Delegate, for calls by AgentID in InstanceID, Environment and
// DeploymentMode, for TTL.
type MintRequest struct {
	// Delegator is the principal whose grants are handed; it must be a
	// declared Principal. Over HTTP it is the caller's authenticated
	// principal, never a body field.
	Delegator string
	// Delegate is the subject the token is for ("svc:nightly-report"); it
	// need not be declared (it gets nothing of its own).
	Delegate string
	// AgentID must be a declared Agent; the others may be empty.
	AgentID        string
	InstanceID     string
	Environment    string
	DeploymentMode string
	// Grants are what is handed: each must be held by Delegator (see
	// ErrNotHeld). At least one.
	Grants []policy.Grant
	// TTL is the token's lifetime; 0 means Settings.delegations.default_ttl
	// (1h), and more than max_ttl (24h) is refused.
	TTL time.Duration
}

// Minted is a new delegation token and what it carries.
type Minted struct {
	// Token is the bearer token (a JWS compact serialization).
	Token          string    `json:"token"`
	ID             string    `json:"id"`
	Delegator      string    `json:"delegator"`
	Delegate       string    `json:"delegate"`
	AgentID        string    `json:"agent_id"`
	InstanceID     string    `json:"instance_id,omitempty"`
	Environment    string    `json:"environment,omitempty"`
	DeploymentMode string    `json:"deployment_mode,omitempty"`
	Grants         []Grant   `json:"grants"`
	IssuedAt       time.Time `json:"issued_at"`
	ExpiresAt      time.Time `json:"expires_at"`
}

// Mint signs a delegation token with the gateway's key (generating the key
// on first use). It refuses, wrapping ErrNotHeld, any grant the delegator
// does not hold (own or through its roles, and through its own
// delegated_from), naming each one: nothing is silently dropped. Other
// refusals wrap ErrInvalid or ErrDisabled.
func (a *Authenticator) Mint(req MintRequest) (Minted, error) {
	if a.dlg.Disabled {
		return Minted{}, ErrDisabled
	}
	if a.keys == nil {
		return Minted{}, fmt.Errorf("%w: this gateway has no delegation keyring", ErrInvalid)
	}
	def, max := a.dlg.TTLs()
	ttl := req.TTL
	switch {
	case ttl == 0:
		ttl = def
	case ttl < 0:
		return Minted{}, fmt.Errorf("%w: ttl %s is negative", ErrInvalid, ttl)
	case ttl > max:
		return Minted{}, fmt.Errorf("%w: ttl %s is longer than Settings.delegations.max_ttl %s", ErrInvalid, ttl, max)
	}
	del := principalOf(a.b, req.Delegator)
	switch {
	case req.Delegator == "":
		return Minted{}, fmt.Errorf("%w: the delegator is empty", ErrInvalid)
	case del == nil:
		return Minted{}, fmt.Errorf("%w: delegator %s is not a declared Principal", ErrInvalid, req.Delegator)
	case !validSubject(req.Delegate):
		return Minted{}, fmt.Errorf("%w: delegate %q must be 1 to 200 printable characters without spaces", ErrInvalid, req.Delegate)
	case req.Delegate == req.Delegator:
		return Minted{}, fmt.Errorf("%w: the delegate is the delegator %s; name the delegate on its own (e.g. svc:<job>)", ErrInvalid, req.Delegate)
	case principalOf(a.b, req.Delegate) != nil:
		// A delegate named after a declared principal would read as that
		// principal in approvals (its own, which it may not decide) and in
		// the audit log.
		return Minted{}, fmt.Errorf("%w: delegate %q is a declared Principal; a delegate holds only what it is handed and must not take another principal's name: name it on its own (e.g. svc:<job>)", ErrInvalid, req.Delegate)
	case agentOf(a.b, req.AgentID) == nil:
		return Minted{}, fmt.Errorf("%w: agent %q is not a declared Agent", ErrInvalid, req.AgentID)
	case len(req.Grants) == 0:
		return Minted{}, fmt.Errorf("%w: hand at least one grant", ErrInvalid)
	}
	env, err := cond.NewEnv()
	if err != nil {
		return Minted{}, err
	}
	var notHeld []string
	grants := make([]Grant, len(req.Grants))
	for i, g := range req.Grants {
		if err := checkGrant(g, env); err != nil {
			return Minted{}, fmt.Errorf("%w: grant %d (%s): %v", ErrInvalid, i, GrantOf(g), err)
		}
		if !held(a.b, del, g, 0) {
			notHeld = append(notHeld, GrantOf(g).String())
		}
		grants[i] = GrantOf(g)
	}
	if len(notHeld) > 0 {
		return Minted{}, fmt.Errorf("%w: %s does not hold %s; hand only grants it holds (its own or its roles'), or narrow the scope",
			ErrNotHeld, req.Delegator, strings.Join(notHeld, ", "))
	}
	priv, kid, err := a.keys.Signer()
	if err != nil {
		return Minted{}, err
	}
	now := a.now().UTC().Truncate(time.Second)
	exp := now.Add(ttl)
	m := Minted{ID: newDelegationID(), Delegator: req.Delegator, Delegate: req.Delegate, AgentID: req.AgentID,
		InstanceID: req.InstanceID, Environment: req.Environment, DeploymentMode: req.DeploymentMode,
		Grants: grants, IssuedAt: now, ExpiresAt: exp}
	claims := DelegationClaims{
		Claims: jwt.Claims{Issuer: DelegationIssuer, Audience: jwt.Audience{DelegationIssuer}, Subject: m.Delegate, ID: m.ID,
			IssuedAt: jwt.NewNumericDate(now), NotBefore: jwt.NewNumericDate(now), Expiry: jwt.NewNumericDate(exp)},
		Delegator: m.Delegator, AgentID: m.AgentID, InstanceID: m.InstanceID, Environment: m.Environment,
		DeploymentMode: m.DeploymentMode, Grants: grants,
	}
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.EdDSA, Key: priv},
		(&jose.SignerOptions{}).WithType(DelegationType).WithHeader(jose.HeaderKey("kid"), kid))
	if err != nil {
		return Minted{}, fmt.Errorf("sign delegation: %w", err)
	}
	m.Token, err = jwt.Signed(signer).Claims(claims).Serialize()
	if err != nil {
		return Minted{}, fmt.Errorf("sign delegation: %w", err)
	}
	return m, nil
}

// EventMinted is the audit event type that records a minted delegation
// token.
const EventMinted = "identity.delegation.minted"

// Event returns the audit event that records m: who handed which grants to
// whom, through which agent and where, until when, and via which
// enforcement point ("http", "cli"). It never carries the token. Callers
// make it durable before handing the token out, so no authority exists
// that the log does not show.
func (m Minted) Event(via string) audit.Event {
	grants := make([]any, len(m.Grants))
	for i, g := range m.Grants {
		grants[i] = g.String()
	}
	exp := m.ExpiresAt.UTC().Format(time.RFC3339)
	details := map[string]any{"delegation_id": m.ID, "delegator": m.Delegator, "delegate": m.Delegate,
		"grants": grants, "expires_at": exp}
	if via != "" {
		details["via"] = via
	}
	return audit.Event{EventType: EventMinted, AgentID: m.AgentID, Principal: m.Delegator,
		InstanceID: m.InstanceID, Environment: m.Environment, DeploymentMode: m.DeploymentMode,
		Reason:  fmt.Sprintf("%s handed %d grants to %s (delegation %s) until %s", m.Delegator, len(m.Grants), m.Delegate, m.ID, exp),
		Details: details}
}

func validSubject(s string) bool {
	if s == "" || len(s) > 200 {
		return false
	}
	for _, r := range s {
		if unicode.IsSpace(r) || !unicode.IsPrint(r) {
			return false
		}
	}
	return true
}

// newDelegationID returns "dlg_" + 26 base32 characters (128 random bits).
func newDelegationID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return DelegationIDPrefix + strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(b[:]))
}
