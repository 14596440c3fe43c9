package policy

import (
	"fmt"
	"net"
	"net/url"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Identity beyond API keys: the Settings fields that let the MCP proxy and
// the JSON API accept bearer JWTs from an identity provider
// (Settings.jwt_issuers) and the gateway's own delegation tokens
// (Settings.delegations). Package identity verifies both; these are the
// documents and their validation.

// JWTAlgorithms are the JWS algorithms a JWTIssuer may allow: asymmetric
// signatures only. "none" and the HMAC algorithms (HS256...) are refused:
// a JWKS holds public keys, and a verifier that accepted HMAC with a public
// key as the secret could be fooled by anyone who has the public key.
var JWTAlgorithms = []string{"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"}

// DefaultJWTAlgorithms are allowed when a JWTIssuer names none.
var DefaultJWTAlgorithms = []string{"RS256", "ES256", "EdDSA"}

// Defaults and bounds of the identity settings.
const (
	// DefaultClockSkew is how far exp, nbf and iat may be off; at most
	// MaxClockSkew.
	DefaultClockSkew = 30 * time.Second
	MaxClockSkew     = 5 * time.Minute
	// DefaultJWKSRefresh is how often a jwks_url is fetched again; at
	// least MinJWKSRefresh.
	DefaultJWKSRefresh = 10 * time.Minute
	MinJWKSRefresh     = 10 * time.Second
	// DefaultDelegationTTL is a delegation token's lifetime when the
	// minter names none; DefaultMaxDelegationTTL bounds any.
	DefaultDelegationTTL    = time.Hour
	DefaultMaxDelegationTTL = 24 * time.Hour
)

// JWTIssuer trusts the bearer JWTs of one identity provider (an entry of
// Settings.jwt_issuers). A token is accepted only when its signature
// verifies with a key of the issuer's JWKS (chosen by kid, never the
// token's own embedded key), its alg is one of Algorithms, iss equals
// Issuer, aud contains one of Audience, and exp (required), nbf and iat
// hold within ClockSkew. Anything else is answered with 401.
//
// The principal comes from PrincipalClaim (prefixed with PrincipalPrefix)
// and must be a declared Principal: the token authenticates a subject, the
// bundle says what that subject may do; an undeclared principal is
// refused (401), never given empty or default grants.
//
// Roles: when RolesClaim is set and the token carries it, its values must
// name declared Roles, and they narrow the principal's authority for calls
// made with this token: a call passes only what both the principal's
// current grants and the grants of the named roles allow (like OAuth
// scopes: a token can carry less than its subject holds, never more). A
// token without the claim runs with the principal's own grants.
//
// AgentID, InstanceID, Environment and DeploymentMode are each bound from
// a claim ({claim: NAME}) or fixed per issuer (a plain value); never from a
// header or body the client sets. AgentID is required and must name a
// declared Agent. A configured claim that the token lacks is a 401.
type JWTIssuer struct {
	Pos `yaml:"-"`
	// Name labels the issuer in logs; default Issuer.
	Name string `yaml:"name"`
	// Issuer is the exact iss value ("https://idp.example.com/"). Required
	// and unique among the issuers.
	Issuer string `yaml:"issuer"`
	// Audience lists accepted aud values; the token's aud must contain one.
	// Required.
	Audience []string `yaml:"audience"`
	// JWKSFile is a JSON Web Key Set file, relative to the bundle file that
	// names it; read when the bundle is loaded or reloaded.
	JWKSFile string `yaml:"jwks_file"`
	// JWKSURL is an http(s) URL of the issuer's JWKS, fetched on first use,
	// cached, fetched again every JWKSRefresh and when a token names an
	// unknown kid (at most every MinJWKSRefresh). Redirects are not
	// followed. Give exactly one of JWKSFile and JWKSURL.
	JWKSURL string `yaml:"jwks_url"`
	// JWKSRefresh is how long fetched keys are used before fetching again;
	// default 10m, at least 10s.
	JWKSRefresh Duration `yaml:"jwks_refresh"`
	// Algorithms are the allowed alg values, from JWTAlgorithms; default
	// RS256, ES256, EdDSA.
	Algorithms []string `yaml:"algorithms"`
	// ClockSkew is the leeway on exp, nbf and iat; default 30s, at most 5m.
	ClockSkew Duration `yaml:"clock_skew"`
	// PrincipalClaim names the claim holding the principal; default sub.
	PrincipalClaim string `yaml:"principal_claim"`
	// PrincipalPrefix is prepended to the claim's value ("user:" turns sub
	// "alice" into the principal "user:alice").
	PrincipalPrefix string `yaml:"principal_prefix"`
	// RolesClaim, when set, names a claim holding role names (a list of
	// strings, or one space-separated string).
	RolesClaim     string       `yaml:"roles_claim"`
	AgentID        ClaimBinding `yaml:"agent_id"`
	InstanceID     ClaimBinding `yaml:"instance_id"`
	Environment    ClaimBinding `yaml:"environment"`
	DeploymentMode ClaimBinding `yaml:"deployment_mode"`
}

// Label returns Name, or Issuer when Name is empty.
func (j *JWTIssuer) Label() string {
	if j.Name != "" {
		return j.Name
	}
	return j.Issuer
}

// ClaimBinding binds one identity field: a fixed Value (written as a plain
// string) or the string value of a token Claim (written {claim: NAME}).
// The zero value binds nothing (the field stays empty).
type ClaimBinding struct {
	Value string
	Claim string
}

// IsZero reports whether the binding binds nothing.
func (c ClaimBinding) IsZero() bool { return c.Value == "" && c.Claim == "" }

// String formats the binding as written.
func (c ClaimBinding) String() string {
	if c.Claim != "" {
		return "{claim: " + c.Claim + "}"
	}
	return c.Value
}

// UnmarshalYAML accepts a string or {claim: NAME}.
func (c *ClaimBinding) UnmarshalYAML(n *yaml.Node) error {
	switch n.Kind {
	case yaml.ScalarNode:
		*c = ClaimBinding{Value: n.Value}
		return nil
	case yaml.MappingNode:
		var m struct {
			Claim string `yaml:"claim"`
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			if k := n.Content[i].Value; k != "claim" {
				return fmt.Errorf("line %d: unknown field %q (want a value, or {claim: NAME})", n.Content[i].Line, k)
			}
		}
		if err := n.Decode(&m); err != nil {
			return err
		}
		if m.Claim == "" {
			return fmt.Errorf("line %d: {claim: NAME} needs a claim name", n.Line)
		}
		*c = ClaimBinding{Claim: m.Claim}
		return nil
	}
	return fmt.Errorf("line %d: want a value, or {claim: NAME}", n.Line)
}

// DelegationSettings configures delegation tokens: tokens the gateway signs
// with its own Ed25519 key (kept in the data folder) that hand a narrower
// grant set of one principal (the delegator) to another subject (the
// delegate). A call made with one runs as the delegator and passes only
// what both the delegator's current grants and the token's grants allow.
type DelegationSettings struct {
	Pos `yaml:"-"`
	// Disabled refuses minting and every delegation token.
	Disabled bool `yaml:"disabled"`
	// DefaultTTL is a new token's lifetime when the minter names none;
	// default 1h.
	DefaultTTL Duration `yaml:"default_ttl"`
	// MaxTTL bounds any token's lifetime; default 24h.
	MaxTTL Duration `yaml:"max_ttl"`
	// RevokedIDs lists token ids (dlg_...) refused before they expire.
	RevokedIDs []string `yaml:"revoked_ids"`
}

// TTLs returns the default and maximum lifetime with defaults applied.
func (d DelegationSettings) TTLs() (def, max time.Duration) {
	def, max = d.DefaultTTL.D(), d.MaxTTL.D()
	if max == 0 {
		max = DefaultMaxDelegationTTL
	}
	if def == 0 {
		def = min(DefaultDelegationTTL, max)
	}
	return def, max
}

// identitySettings validates Settings.jwt_issuers and Settings.delegations.
func (v *validator) identitySettings() {
	allowed := map[string]bool{}
	for _, a := range JWTAlgorithms {
		allowed[a] = true
	}
	seen := map[string]*JWTIssuer{}
	for _, s := range v.b.Settings {
		for i := range s.JWTIssuers {
			j := &s.JWTIssuers[i]
			pos := j.Pos
			if pos.Line == 0 {
				pos = s.Pos
			}
			where := fmt.Sprintf("Settings.jwt_issuers[%d]", i)
			if j.Issuer == "" {
				v.r.Errorf(pos, "%s: issuer is required (the exact iss of the tokens)", where)
			} else if prev, dup := seen[j.Issuer]; dup {
				v.r.Errorf(pos, "%s: issuer %s is already configured at %s", where, j.Issuer, prev.Pos.At())
			} else {
				seen[j.Issuer] = j
			}
			if len(j.Audience) == 0 {
				v.r.Errorf(pos, "%s: audience is required (the aud values this gateway accepts)", where)
			} else if slices.Contains(j.Audience, "") {
				v.r.Errorf(pos, "%s: audience values may not be empty", where)
			}
			switch {
			case (j.JWKSFile == "") == (j.JWKSURL == ""):
				v.r.Errorf(pos, "%s: give exactly one of jwks_file and jwks_url", where)
			case j.JWKSURL != "":
				u, err := url.Parse(j.JWKSURL)
				switch {
				case err != nil || u.Host == "" || (u.Scheme != "https" && u.Scheme != "http"):
					v.r.Errorf(pos, "%s: jwks_url %q must be an absolute http(s) URL", where, j.JWKSURL)
				case u.User != nil:
					v.r.Errorf(pos, "%s: jwks_url must not carry credentials", where)
				case u.Scheme == "http" && !loopbackHost(u.Hostname()):
					v.r.Warnf(pos, "%s: jwks_url %s is plain http to a non-loopback host; anyone on the path could swap the keys (use https)", where, j.JWKSURL)
				}
			}
			if r := j.JWKSRefresh.D(); r != 0 && r < MinJWKSRefresh {
				v.r.Errorf(pos, "%s: jwks_refresh must be at least %s", where, MinJWKSRefresh)
			}
			for _, a := range j.Algorithms {
				switch {
				case strings.EqualFold(a, "none"):
					v.r.Errorf(pos, "%s: algorithm none is refused: an unsigned token proves nothing", where)
				case strings.HasPrefix(strings.ToUpper(a), "HS"):
					v.r.Errorf(pos, "%s: algorithm %s is refused: HMAC needs a shared secret, and a JWKS holds public keys", where, a)
				case !allowed[a]:
					v.r.Errorf(pos, "%s: algorithm %q is not one of %s", where, a, strings.Join(JWTAlgorithms, ", "))
				}
			}
			if sk := j.ClockSkew.D(); sk > MaxClockSkew {
				v.r.Errorf(pos, "%s: clock_skew %s is more than %s", where, sk, MaxClockSkew)
			}
			if j.AgentID.IsZero() {
				v.r.Errorf(pos, "%s: agent_id is required: a fixed agent id, or {claim: NAME}", where)
			} else if j.AgentID.Value != "" && v.agents_[j.AgentID.Value] == nil {
				v.r.Errorf(pos, "%s: agent_id %s is not a declared Agent", where, j.AgentID.Value)
			}
			if in := j.InstanceID.Value; in != "" && v.refs.instances[in] == nil {
				v.r.Errorf(pos, "%s: instance_id %s is not a declared Instance, so every call will be denied at the instance layer%s",
					where, in, didYouMean(in, sortedKeys(v.refs.instances)))
			}
			if j.DeploymentMode.Value != "" && j.AgentID.Value != "" {
				if a := v.agents_[j.AgentID.Value]; a != nil && !v.hasMode(a.AgentID, j.DeploymentMode.Value) {
					v.r.Warnf(pos, "%s: agent %s has no RuntimePolicy for deployment_mode %s, so every call will be denied", where, a.AgentID, j.DeploymentMode.Value)
				}
			}
		}
		d := s.Delegations
		pos := d.Pos
		if pos.Line == 0 {
			pos = s.Pos
		}
		def, max := d.TTLs()
		if def > max {
			v.r.Errorf(pos, "Settings.delegations: default_ttl %s is longer than max_ttl %s", def, max)
		}
		for _, id := range d.RevokedIDs {
			if !strings.HasPrefix(id, "dlg_") {
				v.r.Warnf(pos, "Settings.delegations.revoked_ids: %q is not a delegation token id (dlg_...)", id)
			}
		}
	}
}

func (v *validator) hasMode(agentID, mode string) bool {
	for _, rp := range v.b.RuntimePolicies {
		if rp.AgentID == agentID && rp.DeploymentMode == mode {
			return true
		}
	}
	return false
}

func loopbackHost(h string) bool {
	if h == "localhost" {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}
