// Package identity authenticates the bearer tokens that are not API keys:
// JWTs from the identity providers a bundle trusts (Settings.jwt_issuers),
// and the gateway's own delegation tokens, with which a principal hands a
// narrower set of its grants to another subject (a scheduler, a
// sub-agent). It turns a verified token into a gate.Identity and never
// reads anything else: no header the client sets, no tool argument, no
// model output can choose who a call runs as (Wyrd, "Whose authority").
//
// A JWT's principal must be a declared Principal; its roles claim, when
// present, narrows that principal's grants to those of the named Roles. A
// delegation token runs as its delegator, narrowed to the token's grants;
// the narrowing is a gate.Delegation that the gate compiles against each
// policy snapshot, so the effective authority is always the intersection
// with the delegator's current grants: revoking a grant in the bundle and
// reloading revokes it for every delegate at once.
//
// The JOSE work (JWS parsing, signature verification, JWKS keys, claim
// time checks) is github.com/go-jose/go-jose/v4: it makes the caller list
// the accepted algorithms when parsing, so "none" and algorithm confusion
// are refused by construction, it parses JWKS documents itself, and it has
// no dependencies beyond the standard library.
package identity

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"

	"github.com/toolgate/toolgate"
	"github.com/toolgate/toolgate/gate"
	"github.com/toolgate/toolgate/policy"
)

// Errors callers branch on; Verify and Mint wrap them with %w.
var (
	// ErrUnauthenticated: the token is refused (answer 401).
	ErrUnauthenticated = errors.New("the bearer token is refused")
	// ErrNotHeld: a delegation hands a grant its delegator does not hold
	// (answer 403).
	ErrNotHeld = errors.New("a delegation may only hand grants its delegator holds")
	// ErrInvalid: a malformed mint request (answer 400).
	ErrInvalid = errors.New("invalid delegation request")
	// ErrDelegated: the caller holds a delegation token or a role-narrowed
	// JWT, which cannot hand on authority (answer 403).
	ErrDelegated = errors.New("only a principal's own credential may delegate")
	// ErrDisabled: delegation tokens are off in this bundle (answer 403).
	ErrDisabled = errors.New("delegation tokens are disabled (Settings.delegations.disabled)")
)

// The delegation token's fixed header and claim values.
const (
	// DelegationType is the typ header of a delegation token.
	DelegationType = "tg-delegation+jwt"
	// DelegationIssuer is the iss and aud of a delegation token.
	DelegationIssuer = "toolgate"
	// DelegationIDPrefix starts every delegation token id.
	DelegationIDPrefix = "dlg_"
)

// Options configures New; nil is valid.
type Options struct {
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// HTTPClient fetches jwks_url keys; nil means a client with a 10 s
	// timeout that follows no redirects.
	HTTPClient *http.Client
	// Logger gets JWKS fetch failures and skipped keys; nil discards.
	Logger *slog.Logger
}

// Authenticator verifies JWTs and delegation tokens against one policy
// bundle, and mints delegation tokens. Build a new one for each bundle
// (on reload); it is safe for concurrent use.
type Authenticator struct {
	b       *policy.Bundle
	keys    *Keyring
	now     func() time.Time
	issuers map[string]*issuer
	dlg     policy.DelegationSettings
	algs    []jose.SignatureAlgorithm // every alg any path accepts

	mu    sync.Mutex
	cache map[[32]byte]cached
}

type issuer struct {
	cfg  policy.JWTIssuer
	algs []jose.SignatureAlgorithm
	skew time.Duration
	keys keySource
}

type cached struct {
	id    gate.Identity
	until time.Time
}

// maxCached bounds the verified-token cache; it is emptied when full.
const maxCached = 10_000

// cacheFor is how long a verified token is trusted without verifying it
// again (never past its expiry).
const cacheFor = time.Minute

// New prepares verification for bundle b (which must have validated): it
// reads every jwks_file (relative to the bundle file naming it); jwks_url
// keys are fetched on first use. keys is the gateway's delegation keyring;
// nil refuses every delegation token and cannot mint. The error names an
// unreadable or unusable JWKS file.
func New(b *policy.Bundle, keys *Keyring, opts *Options) (*Authenticator, error) {
	o := Options{}
	if opts != nil {
		o = *opts
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.HTTPClient == nil {
		o.HTTPClient = defaultHTTPClient()
	}
	a := &Authenticator{b: b, keys: keys, now: o.Now, issuers: map[string]*issuer{}, cache: map[[32]byte]cached{}}
	algSet := map[jose.SignatureAlgorithm]bool{jose.EdDSA: true}
	if len(b.Settings) > 0 {
		s := b.Settings[0]
		a.dlg = s.Delegations
		for _, cfg := range s.JWTIssuers {
			// The validator requires both; checked again because go-jose
			// skips the iss and aud checks when nothing is expected.
			if cfg.Issuer == "" {
				return nil, fmt.Errorf("JWT issuer %s: issuer is required", cfg.Label())
			}
			if len(cfg.Audience) == 0 || slices.Contains(cfg.Audience, "") {
				return nil, fmt.Errorf("JWT issuer %s: audience is required and may not hold an empty value", cfg.Label())
			}
			is := &issuer{cfg: cfg, skew: cfg.ClockSkew.D()}
			if is.skew == 0 {
				is.skew = policy.DefaultClockSkew
			}
			names := cfg.Algorithms
			if len(names) == 0 {
				names = policy.DefaultJWTAlgorithms
			}
			for _, n := range names {
				if !slices.Contains(policy.JWTAlgorithms, n) {
					return nil, fmt.Errorf("JWT issuer %s: algorithm %q is not allowed", cfg.Label(), n)
				}
				is.algs = append(is.algs, jose.SignatureAlgorithm(n))
				algSet[jose.SignatureAlgorithm(n)] = true
			}
			switch {
			case cfg.JWKSFile != "":
				path := cfg.JWKSFile
				if !filepath.IsAbs(path) && cfg.Pos.File != "" {
					path = filepath.Join(filepath.Dir(cfg.Pos.File), path)
				}
				keys, err := readJWKSFile(path)
				if err != nil {
					return nil, fmt.Errorf("JWT issuer %s (%s): %w", cfg.Label(), cfg.Pos.At(), err)
				}
				is.keys = &staticKeys{keys: keys}
			case cfg.JWKSURL != "":
				refresh := cfg.JWKSRefresh.D()
				if refresh == 0 {
					refresh = policy.DefaultJWKSRefresh
				}
				is.keys = &remoteKeys{url: cfg.JWKSURL, refresh: refresh, client: o.HTTPClient, log: o.Logger}
			default:
				return nil, fmt.Errorf("JWT issuer %s: give jwks_file or jwks_url", cfg.Label())
			}
			a.issuers[cfg.Issuer] = is
		}
	}
	for _, n := range policy.JWTAlgorithms {
		if algSet[jose.SignatureAlgorithm(n)] {
			a.algs = append(a.algs, jose.SignatureAlgorithm(n))
		}
	}
	return a, nil
}

func readJWKSFile(path string) ([]jose.JSONWebKey, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("jwks_file: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxJWKSBytes+1))
	if err != nil {
		return nil, fmt.Errorf("jwks_file: %w", err)
	}
	if len(data) > MaxJWKSBytes {
		return nil, fmt.Errorf("jwks_file %s is larger than %d bytes", path, MaxJWKSBytes)
	}
	keys, problems, err := parseJWKS(data)
	if err != nil {
		return nil, fmt.Errorf("jwks_file %s: %w", path, err)
	}
	if len(problems) > 0 {
		return nil, fmt.Errorf("jwks_file %s: %s", path, strings.Join(problems, "; "))
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("jwks_file %s has no key", path)
	}
	return keys, nil
}

// LooksLikeJWT reports whether token has the shape of a JWS compact
// serialization (three dot-separated parts), so an API key table can tell
// it from a key without trying to verify it.
func LooksLikeJWT(token string) bool {
	return strings.Count(token, ".") == 2 && !strings.ContainsAny(token, " \t\r\n")
}

// Verify authenticates a bearer token: a delegation token (typ
// tg-delegation+jwt, signed by this gateway's key) or a JWT of a
// configured issuer. Every refusal wraps ErrUnauthenticated and says why:
// a malformed token, an alg not allowed (none and HMAC never are), an
// unknown issuer or kid, a bad signature, a wrong audience, an expired or
// not yet valid token, a missing claim, an undeclared principal, agent or
// role, a revoked or disabled delegation. A verified token's identity is
// kept for up to a minute (never past its expiry), so that one request's
// repeated checks share one verification and one gate.Delegation.
func (a *Authenticator) Verify(token string) (gate.Identity, error) {
	now := a.now()
	sum := sha256.Sum256([]byte(token))
	a.mu.Lock()
	c, ok := a.cache[sum]
	a.mu.Unlock()
	if ok && now.Before(c.until) {
		return c.id, nil
	}
	id, exp, err := a.verify(token, now)
	if err != nil {
		return gate.Identity{}, fmt.Errorf("%w: %v", ErrUnauthenticated, err)
	}
	until := now.Add(cacheFor)
	if exp.Before(until) {
		until = exp
	}
	a.mu.Lock()
	if len(a.cache) >= maxCached {
		a.cache = map[[32]byte]cached{}
	}
	a.cache[sum] = cached{id: id, until: until}
	a.mu.Unlock()
	return id, nil
}

func (a *Authenticator) verify(token string, now time.Time) (gate.Identity, time.Time, error) {
	if !LooksLikeJWT(token) {
		return gate.Identity{}, time.Time{}, errors.New("not a JWT (want header.payload.signature)")
	}
	jws, err := jose.ParseSignedCompact(token, a.algs)
	if err != nil {
		return gate.Identity{}, time.Time{}, fmt.Errorf("malformed token or alg not allowed (allowed: %s): %v", algNames(a.algs), err)
	}
	if len(jws.Signatures) != 1 {
		return gate.Identity{}, time.Time{}, errors.New("want exactly one signature")
	}
	// Claims two JSON readers could read differently (a duplicate "sub",
	// "iss" next to "ISS") are refused: the claims checked are the claims
	// mapped.
	if err := toolgate.CheckKeys(jws.UnsafePayloadWithoutVerification()); err != nil {
		return gate.Identity{}, time.Time{}, fmt.Errorf("the claims are refused: %v", err)
	}
	h := jws.Signatures[0].Header
	if typ, _ := h.ExtraHeaders[jose.HeaderType].(string); typ == DelegationType {
		return a.verifyDelegation(jws, h, now)
	}
	return a.verifyJWT(jws, h, now)
}

func algNames(algs []jose.SignatureAlgorithm) string {
	s := make([]string, len(algs))
	for i, a := range algs {
		s[i] = string(a)
	}
	return strings.Join(s, ", ")
}

// verifyJWT verifies a token of a configured issuer and maps its claims.
func (a *Authenticator) verifyJWT(jws *jose.JSONWebSignature, h jose.Header, now time.Time) (gate.Identity, time.Time, error) {
	var peek struct {
		Iss string `json:"iss"`
	}
	if err := json.Unmarshal(jws.UnsafePayloadWithoutVerification(), &peek); err != nil {
		return gate.Identity{}, time.Time{}, errors.New("the payload is not a JSON claims object")
	}
	is := a.issuers[peek.Iss]
	if is == nil {
		return gate.Identity{}, time.Time{}, fmt.Errorf("issuer %q is not trusted (Settings.jwt_issuers)", peek.Iss)
	}
	alg := h.Algorithm
	if !slices.Contains(is.algs, jose.SignatureAlgorithm(alg)) {
		return gate.Identity{}, time.Time{}, fmt.Errorf("alg %s is not allowed for issuer %s (allowed: %s)", alg, is.cfg.Label(), algNames(is.algs))
	}
	keys, err := is.keys.lookup(h.KeyID, alg, now)
	if err != nil {
		return gate.Identity{}, time.Time{}, err
	}
	switch {
	case len(keys) == 0 && h.KeyID != "":
		return gate.Identity{}, time.Time{}, fmt.Errorf("unknown key id %q for issuer %s", h.KeyID, is.cfg.Label())
	case len(keys) == 0:
		return gate.Identity{}, time.Time{}, fmt.Errorf("issuer %s has no %s key", is.cfg.Label(), alg)
	case len(keys) > 1 && h.KeyID == "":
		return gate.Identity{}, time.Time{}, fmt.Errorf("the token names no kid and issuer %s has several %s keys", is.cfg.Label(), alg)
	}
	var payload []byte
	for _, k := range keys {
		if payload, err = jws.Verify(k.Key); err == nil {
			break
		}
	}
	if err != nil {
		return gate.Identity{}, time.Time{}, errors.New("bad signature")
	}
	var std jwt.Claims
	claims := map[string]any{}
	if err := json.Unmarshal(payload, &std); err != nil {
		return gate.Identity{}, time.Time{}, fmt.Errorf("claims: %v", err)
	}
	if err := json.Unmarshal(payload, &claims); err != nil {
		return gate.Identity{}, time.Time{}, fmt.Errorf("claims: %v", err)
	}
	if std.Expiry == nil {
		return gate.Identity{}, time.Time{}, errors.New("the token has no exp; tokens that never expire are refused")
	}
	if err := std.ValidateWithLeeway(jwt.Expected{Issuer: is.cfg.Issuer, AnyAudience: is.cfg.Audience, Time: now}, is.skew); err != nil {
		return gate.Identity{}, time.Time{}, claimError(err, is.cfg)
	}
	id, err := a.mapClaims(is, claims)
	if err != nil {
		return gate.Identity{}, time.Time{}, err
	}
	exp := std.Expiry.Time()
	if id.Delegation != nil {
		id.Delegation.ExpiresAt = exp.Add(is.skew)
		tag := std.ID
		if tag == "" {
			sum := sha256.Sum256(jws.Signatures[0].Signature)
			tag = hex.EncodeToString(sum[:8])
		}
		id.Delegation.ID = "jwt:" + is.cfg.Label() + ":" + tag
	}
	return id, exp.Add(is.skew), nil
}

func claimError(err error, cfg policy.JWTIssuer) error {
	switch {
	case errors.Is(err, jwt.ErrExpired):
		return errors.New("the token has expired")
	case errors.Is(err, jwt.ErrNotValidYet):
		return errors.New("the token is not valid yet (nbf)")
	case errors.Is(err, jwt.ErrIssuedInTheFuture):
		return errors.New("the token was issued in the future (iat)")
	case errors.Is(err, jwt.ErrInvalidAudience):
		return fmt.Errorf("the token's aud is not one of %v", cfg.Audience)
	case errors.Is(err, jwt.ErrInvalidIssuer):
		return fmt.Errorf("the token's iss is not %s", cfg.Issuer)
	}
	return err
}

// mapClaims binds the identity from a verified JWT's claims.
func (a *Authenticator) mapClaims(is *issuer, claims map[string]any) (gate.Identity, error) {
	cfg := is.cfg
	pc := cfg.PrincipalClaim
	if pc == "" {
		pc = "sub"
	}
	sub, err := stringClaim(claims, pc)
	if err != nil {
		return gate.Identity{}, err
	}
	principal := cfg.PrincipalPrefix + sub
	if principalOf(a.b, principal) == nil {
		return gate.Identity{}, fmt.Errorf("principal %s (claim %s) is not a declared Principal", principal, pc)
	}
	id := gate.Identity{Principal: principal}
	for _, f := range []struct {
		name string
		b    policy.ClaimBinding
		dst  *string
	}{
		{"agent_id", cfg.AgentID, &id.AgentID},
		{"instance_id", cfg.InstanceID, &id.InstanceID},
		{"environment", cfg.Environment, &id.Environment},
		{"deployment_mode", cfg.DeploymentMode, &id.DeploymentMode},
	} {
		switch {
		case f.b.Claim != "":
			v, err := stringClaim(claims, f.b.Claim)
			if err != nil {
				return gate.Identity{}, fmt.Errorf("%s: %v", f.name, err)
			}
			*f.dst = v
		default:
			*f.dst = f.b.Value
		}
	}
	if id.AgentID == "" || agentOf(a.b, id.AgentID) == nil {
		return gate.Identity{}, fmt.Errorf("agent %q is not a declared Agent", id.AgentID)
	}
	if cfg.RolesClaim != "" {
		// Fail closed: with roles_claim configured, a token without the
		// claim is refused, never given the principal's whole authority
		// (an IdP that leaves the claim out must not widen a token).
		raw, present := claims[cfg.RolesClaim]
		if !present {
			return gate.Identity{}, fmt.Errorf("the token has no claim %s (roles_claim is configured for this issuer, so every token must name its roles; an empty list grants nothing)", cfg.RolesClaim)
		}
		roles, err := roleList(raw)
		if err != nil {
			return gate.Identity{}, fmt.Errorf("claim %s: %v", cfg.RolesClaim, err)
		}
		for _, r := range roles {
			if roleOf(a.b, r) == nil {
				return gate.Identity{}, fmt.Errorf("role %s (claim %s) is not a declared Role", r, cfg.RolesClaim)
			}
		}
		id.Delegation = &gate.Delegation{Roles: roles}
	}
	return id, nil
}

func stringClaim(claims map[string]any, name string) (string, error) {
	v, ok := claims[name]
	if !ok {
		return "", fmt.Errorf("the token has no claim %s", name)
	}
	s, ok := v.(string)
	if !ok || strings.TrimSpace(s) == "" || strings.TrimSpace(s) != s {
		return "", fmt.Errorf("claim %s must be a non-empty string without surrounding spaces", name)
	}
	return s, nil
}

// roleList reads a roles claim: a list of strings or one space-separated
// string; duplicates are dropped, order kept.
func roleList(v any) ([]string, error) {
	var raw []string
	switch x := v.(type) {
	case string:
		raw = strings.Fields(x)
	case []any:
		for _, e := range x {
			s, ok := e.(string)
			if !ok || s == "" {
				return nil, errors.New("want a list of role names")
			}
			raw = append(raw, s)
		}
	default:
		return nil, errors.New("want a list of role names or a space-separated string")
	}
	out := []string{}
	for _, r := range raw {
		if !slices.Contains(out, r) {
			out = append(out, r)
		}
	}
	return out, nil
}

// DelegationClaims are the claims of a delegation token.
type DelegationClaims struct {
	// ID (jti) is "dlg_" + 26 base32 characters; Subject (sub) is the
	// delegate; Issuer and Audience are "toolgate".
	jwt.Claims
	// Delegator is the principal whose grants are handed.
	Delegator      string `json:"delegator"`
	AgentID        string `json:"agent_id"`
	InstanceID     string `json:"instance_id,omitempty"`
	Environment    string `json:"environment,omitempty"`
	DeploymentMode string `json:"deployment_mode,omitempty"`
	// Grants are the handed grants, never wider than the delegator held
	// when minting; each call is also checked against its current grants.
	Grants []Grant `json:"grants"`
}

// verifyDelegation verifies a delegation token with the gateway's key.
func (a *Authenticator) verifyDelegation(jws *jose.JSONWebSignature, h jose.Header, now time.Time) (gate.Identity, time.Time, error) {
	if a.dlg.Disabled {
		return gate.Identity{}, time.Time{}, ErrDisabled
	}
	if h.Algorithm != string(jose.EdDSA) {
		return gate.Identity{}, time.Time{}, fmt.Errorf("a delegation token is signed with EdDSA, not %s", h.Algorithm)
	}
	if a.keys == nil {
		return gate.Identity{}, time.Time{}, ErrNoKey
	}
	pub, kid, err := a.keys.Public()
	if err != nil {
		return gate.Identity{}, time.Time{}, err
	}
	if h.KeyID != kid {
		return gate.Identity{}, time.Time{}, fmt.Errorf("unknown key id %q: the token was not signed by this gateway's delegation key", h.KeyID)
	}
	payload, err := jws.Verify(ed25519.PublicKey(pub))
	if err != nil {
		return gate.Identity{}, time.Time{}, errors.New("bad signature")
	}
	var c DelegationClaims
	dec := json.NewDecoder(strings.NewReader(string(payload)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return gate.Identity{}, time.Time{}, fmt.Errorf("delegation claims: %v", err)
	}
	if c.Expiry == nil || !strings.HasPrefix(c.ID, DelegationIDPrefix) {
		return gate.Identity{}, time.Time{}, errors.New("a delegation token needs exp and a dlg_ jti")
	}
	err = c.Claims.ValidateWithLeeway(jwt.Expected{Issuer: DelegationIssuer, AnyAudience: jwt.Audience{DelegationIssuer}, Time: now}, policy.DefaultClockSkew)
	if err != nil {
		return gate.Identity{}, time.Time{}, fmt.Errorf("delegation %s: %v", c.ID, claimError(err, policy.JWTIssuer{Issuer: DelegationIssuer, Audience: []string{DelegationIssuer}}))
	}
	if slices.Contains(a.dlg.RevokedIDs, c.ID) {
		return gate.Identity{}, time.Time{}, fmt.Errorf("delegation %s is revoked (Settings.delegations.revoked_ids)", c.ID)
	}
	if principalOf(a.b, c.Delegator) == nil {
		return gate.Identity{}, time.Time{}, fmt.Errorf("delegation %s: delegator %s is no longer a declared Principal", c.ID, c.Delegator)
	}
	if agentOf(a.b, c.AgentID) == nil {
		return gate.Identity{}, time.Time{}, fmt.Errorf("delegation %s: agent %s is not a declared Agent", c.ID, c.AgentID)
	}
	if c.Subject == "" || len(c.Grants) == 0 {
		return gate.Identity{}, time.Time{}, fmt.Errorf("delegation %s names no delegate or no grants", c.ID)
	}
	grants := make([]policy.Grant, len(c.Grants))
	for i, g := range c.Grants {
		grants[i] = g.Policy()
	}
	exp := c.Expiry.Time()
	return gate.Identity{Principal: c.Delegator, AgentID: c.AgentID, InstanceID: c.InstanceID,
		Environment: c.Environment, DeploymentMode: c.DeploymentMode,
		Delegation: &gate.Delegation{ID: c.ID, Delegate: c.Subject, Grants: grants, ExpiresAt: exp}}, exp, nil
}
