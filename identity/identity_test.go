package identity_test

import (
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/toolgate/toolgate/gate"
	"github.com/toolgate/toolgate/identity"
	"github.com/toolgate/toolgate/policy"
)

// TestVerifyJWT pins what a JWT of a configured issuer maps to, and that
// every way a token can be wrong is refused with ErrUnauthenticated.
func TestVerifyJWT(t *testing.T) {
	p := newIDP(t)
	b := loadBundle(t, testBundle, p.jwks(t))
	c := &clock{t: t0}
	auth := newAuth(t, b, nil, c)
	alice := gate.Identity{Principal: "user:alice", AgentID: "scheduler", Environment: "prod", DeploymentMode: "production"}
	withRoles := func(roles ...string) gate.Identity {
		id := alice
		id.Delegation = &gate.Delegation{Roles: roles, ExpiresAt: t0.Add(time.Hour + policy.DefaultClockSkew)}
		return id
	}
	good := sign(t, jose.RS256, p.rsa, "rsa-1", claims(nil), nil)
	cases := []struct {
		name    string
		token   string
		want    gate.Identity
		wantErr string // substring; "" means success
	}{
		{"RS256", good, alice, ""},
		{"ES256", sign(t, jose.ES256, p.ec, "ec-1", claims(nil), nil), alice, ""},
		{"EdDSA", sign(t, jose.EdDSA, p.ed, "ed-1", claims(nil), nil), alice, ""},
		{"no kid, one fitting key", sign(t, jose.ES256, p.ec, "", claims(nil), nil), alice, ""},
		{"second audience", sign(t, jose.RS256, p.rsa, "rsa-1", claims(map[string]any{"aud": "other"}), nil), alice, ""},
		{"expired within the clock skew", sign(t, jose.RS256, p.rsa, "rsa-1", claims(map[string]any{"exp": t0.Add(-10 * time.Second).Unix()}), nil), alice, ""},
		{"roles narrow", sign(t, jose.RS256, p.rsa, "rsa-1", claims(map[string]any{"iss": rolesIssuer, "roles": []string{"invoker"}}), nil), withRoles("invoker"), ""},
		{"roles as a string", sign(t, jose.RS256, p.rsa, "rsa-1", claims(map[string]any{"iss": rolesIssuer, "roles": "reader invoker reader"}), nil), withRoles("reader", "invoker"), ""},

		{"expired", sign(t, jose.RS256, p.rsa, "rsa-1", claims(map[string]any{"exp": t0.Add(-time.Hour).Unix()}), nil), gate.Identity{}, "expired"},
		{"not yet valid", sign(t, jose.RS256, p.rsa, "rsa-1", claims(map[string]any{"nbf": t0.Add(time.Hour).Unix()}), nil), gate.Identity{}, "not valid yet"},
		{"issued in the future", sign(t, jose.RS256, p.rsa, "rsa-1", claims(map[string]any{"iat": t0.Add(time.Hour).Unix()}), nil), gate.Identity{}, "issued in the future"},
		{"no exp", sign(t, jose.RS256, p.rsa, "rsa-1", claims(map[string]any{"exp": nil}), nil), gate.Identity{}, "no exp"},
		{"wrong issuer", sign(t, jose.RS256, p.rsa, "rsa-1", claims(map[string]any{"iss": "https://evil.test/"}), nil), gate.Identity{}, "not trusted"},
		{"wrong audience", sign(t, jose.RS256, p.rsa, "rsa-1", claims(map[string]any{"aud": "someone-else"}), nil), gate.Identity{}, "aud"},
		{"bad signature", sign(t, jose.RS256, p.other, "rsa-1", claims(nil), nil), gate.Identity{}, "bad signature"},
		{"tampered payload", tamper(t, good, claims(map[string]any{"sub": "owner"})), gate.Identity{}, "bad signature"},
		// Claims two JSON readers could read differently are refused,
		// signed or not.
		{"duplicate sub", sign(t, jose.RS256, p.rsa, "rsa-1", withExtraKey(claims(nil), `"sub":"owner"`), nil), gate.Identity{}, "duplicate object key"},
		{"iss and ISS", sign(t, jose.RS256, p.rsa, "rsa-1", withExtraKey(claims(nil), `"ISS":"https://evil.test/"`), nil), gate.Identity{}, "differ only by case"},
		{"sub and Sub", sign(t, jose.RS256, p.rsa, "rsa-1", withExtraKey(claims(nil), `"Sub":"owner"`), nil), gate.Identity{}, "differ only by case"},
		{"unknown kid", sign(t, jose.RS256, p.rsa, "rsa-9", claims(nil), nil), gate.Identity{}, "unknown key id"},
		{"alg none", unsigned(claims(nil)), gate.Identity{}, "alg not allowed"},
		{"HS256 with the public key as secret", hmacWithPublicKey(t, p.rsa.Public(), claims(nil)), gate.Identity{}, "alg not allowed"},
		{"alg the issuer does not allow", sign(t, jose.PS256, p.rsa, "rsa-1", claims(nil), nil), gate.Identity{}, "alg not allowed"},
		{"key alg differs", sign(t, jose.RS384, p.rsa, "rsa-1", claims(nil), nil), gate.Identity{}, "alg not allowed"},
		{"embedded jwk is ignored", sign(t, jose.RS256, p.other, "rsa-1", claims(nil),
			map[jose.HeaderKey]any{"jwk": jose.JSONWebKey{Key: p.other.Public()}}), gate.Identity{}, "bad signature"},
		{"undeclared principal", sign(t, jose.RS256, p.rsa, "rsa-1", claims(map[string]any{"sub": "mallory"}), nil), gate.Identity{}, "user:mallory (claim sub) is not a declared Principal"},
		{"roles_claim configured, no roles claim", sign(t, jose.RS256, p.rsa, "rsa-1", claims(map[string]any{"iss": rolesIssuer}), nil), gate.Identity{}, "has no claim roles"},
		{"undeclared role", sign(t, jose.RS256, p.rsa, "rsa-1", claims(map[string]any{"iss": rolesIssuer, "roles": []string{"invoker", "admin"}}), nil), gate.Identity{}, "role admin"},
		{"missing bound claim", sign(t, jose.RS256, p.rsa, "rsa-1", claims(map[string]any{"env": nil}), nil), gate.Identity{}, "no claim env"},
		{"principal claim not a string", sign(t, jose.RS256, p.rsa, "rsa-1", claims(map[string]any{"sub": 42}), nil), gate.Identity{}, "sub"},
		{"not a JWT", "not-a-token", gate.Identity{}, "not a JWT"},
		{"garbage in JWT shape", "a.b.c", gate.Identity{}, "malformed"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := auth.Verify(tc.token)
			if tc.wantErr != "" {
				if !errors.Is(err, identity.ErrUnauthenticated) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("got %+v, %v; want an ErrUnauthenticated error containing %q", got, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got, cmpopts.IgnoreFields(gate.Delegation{}, "ID")); diff != "" {
				t.Errorf("identity (-want +got):\n%s", diff)
			}
			if got.Delegation != nil && !strings.HasPrefix(got.Delegation.ID, "jwt:"+rolesIssuer+":") {
				t.Errorf("delegation id %q", got.Delegation.ID)
			}
		})
	}
	t.Run("a verified token expires with its exp, not with the cache", func(t *testing.T) {
		short := sign(t, jose.RS256, p.rsa, "rsa-1", claims(map[string]any{"exp": t0.Add(10 * time.Second).Unix()}), nil)
		if _, err := auth.Verify(short); err != nil {
			t.Fatal(err)
		}
		c.t = t0.Add(10*time.Second + policy.DefaultClockSkew + time.Second)
		defer func() { c.t = t0 }()
		if _, err := auth.Verify(short); !errors.Is(err, identity.ErrUnauthenticated) {
			t.Fatalf("expired token accepted from the cache: %v", err)
		}
	})
	t.Run("one token gives one delegation pointer", func(t *testing.T) {
		tok := sign(t, jose.RS256, p.rsa, "rsa-1", claims(map[string]any{"iss": rolesIssuer, "roles": []string{"reader"}}), nil)
		a, _ := auth.Verify(tok)
		b, _ := auth.Verify(tok)
		if a != b {
			t.Errorf("two verifications of one token differ: %+v %+v", a, b)
		}
	})
}

// TestDelegationTokens: a minted token verifies to its delegator narrowed
// by the handed grants; tampered, expired, revoked, disabled and foreign
// tokens are refused.
func TestDelegationTokens(t *testing.T) {
	p := newIDP(t)
	b := loadBundle(t, testBundle, p.jwks(t))
	c := &clock{t: t0}
	keys := identity.NewKeyring(t.TempDir())
	auth := newAuth(t, b, keys, c)
	grants := []policy.Grant{
		{Resource: "tool", Action: "invoke", Scope: policy.Scope{Tool: "bifrost.query"}},
		{Resource: "bifrost_query", Action: "read", Scope: policy.Scope{Name: "vala.datasets.tickets"}},
	}
	m, err := auth.Mint(identity.MintRequest{Delegator: "user:owner", Delegate: "svc:nightly", AgentID: "scheduler",
		Environment: "prod", Grants: grants, TTL: 30 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(m.ID, identity.DelegationIDPrefix) || len(m.ID) != 30 || !m.ExpiresAt.Equal(t0.Add(30*time.Minute)) {
		t.Errorf("minted %+v", m)
	}
	got, err := auth.Verify(m.Token)
	if err != nil {
		t.Fatal(err)
	}
	want := gate.Identity{Principal: "user:owner", AgentID: "scheduler", Environment: "prod",
		Delegation: &gate.Delegation{ID: m.ID, Delegate: "svc:nightly", Grants: grants, ExpiresAt: t0.Add(30 * time.Minute)}}
	if diff := cmp.Diff(want, got, cmpopts.IgnoreFields(policy.Grant{}, "Pos")); diff != "" {
		t.Errorf("identity (-want +got):\n%s", diff)
	}

	refused := func(t *testing.T, a *identity.Authenticator, token, want string) {
		t.Helper()
		if _, err := a.Verify(token); !errors.Is(err, identity.ErrUnauthenticated) || !strings.Contains(err.Error(), want) {
			t.Errorf("got %v, want an ErrUnauthenticated error containing %q", err, want)
		}
	}
	t.Run("tampered grants", func(t *testing.T) {
		forged := tamper(t, m.Token, map[string]any{"iss": "toolgate", "aud": "toolgate", "sub": "svc:nightly", "jti": m.ID,
			"exp": m.ExpiresAt.Unix(), "delegator": "user:owner", "agent_id": "scheduler",
			"grants": []string{"tool:invoke:all"}})
		refused(t, auth, forged, "bad signature")
	})
	t.Run("expired", func(t *testing.T) {
		c.t = t0.Add(31*time.Minute + policy.DefaultClockSkew)
		defer func() { c.t = t0 }()
		refused(t, newAuth(t, b, keys, c), m.Token, "expired")
	})
	t.Run("revoked", func(t *testing.T) {
		src := strings.Replace(testBundle, "dlg_revoked", m.ID, 1)
		refused(t, newAuth(t, loadBundle(t, src, p.jwks(t)), keys, c), m.Token, "revoked")
	})
	t.Run("disabled", func(t *testing.T) {
		src := strings.Replace(testBundle, "revoked_ids: [dlg_revoked]", "disabled: true", 1)
		a := newAuth(t, loadBundle(t, src, p.jwks(t)), keys, c)
		refused(t, a, m.Token, "disabled")
		if _, err := a.Mint(identity.MintRequest{Delegator: "user:owner", Delegate: "x", AgentID: "scheduler", Grants: grants}); !errors.Is(err, identity.ErrDisabled) {
			t.Errorf("mint while disabled: %v", err)
		}
	})
	t.Run("another gateway's key", func(t *testing.T) {
		other := newAuth(t, b, identity.NewKeyring(t.TempDir()), c)
		om, err := other.Mint(identity.MintRequest{Delegator: "user:owner", Delegate: "svc:nightly", AgentID: "scheduler", Grants: grants})
		if err != nil {
			t.Fatal(err)
		}
		refused(t, auth, om.Token, "unknown key id")
	})
	t.Run("a gateway that never minted", func(t *testing.T) {
		refused(t, newAuth(t, b, identity.NewKeyring(t.TempDir()), c), m.Token, "no delegation signing key")
	})
	t.Run("delegator no longer declared", func(t *testing.T) {
		src := strings.Replace(testBundle, "principal_id: user:owner", "principal_id: user:former", 1)
		src = strings.Replace(src, "delegated_from: user:owner", "delegated_from: user:former", 1)
		refused(t, newAuth(t, loadBundle(t, src, p.jwks(t)), keys, c), m.Token, "no longer a declared Principal")
	})
	t.Run("a token without the delegation type is a JWT of an unknown issuer", func(t *testing.T) {
		priv, kid, err := keys.Signer()
		if err != nil {
			t.Fatal(err)
		}
		tok := sign(t, jose.EdDSA, priv, kid, map[string]any{"iss": "toolgate", "aud": "toolgate", "sub": "svc:nightly",
			"jti": "dlg_x", "exp": t0.Add(time.Hour).Unix(), "delegator": "user:owner", "agent_id": "scheduler",
			"grants": []string{"tool:invoke:all"}}, nil)
		refused(t, auth, tok, "not trusted")
	})
}

// TestMint pins which grants a delegator may hand: only those it holds,
// every other refused by name.
func TestMint(t *testing.T) {
	b := loadBundle(t, testBundle, newIDP(t).jwks(t))
	auth := newAuth(t, b, identity.NewKeyring(t.TempDir()), &clock{t: t0})
	g := func(s string) policy.Grant {
		pg, err := identity.ParseGrant(s)
		if err != nil {
			t.Fatal(err)
		}
		return pg
	}
	cases := []struct {
		name    string
		req     identity.MintRequest
		wantErr error
		wantMsg string
	}{
		{"held exactly", identity.MintRequest{Delegator: "user:owner", Delegate: "svc:a", AgentID: "scheduler",
			Grants: []policy.Grant{g("tool:invoke:fs.read")}}, nil, ""},
		{"narrower resource", identity.MintRequest{Delegator: "user:owner", Delegate: "svc:a", AgentID: "scheduler",
			Grants: []policy.Grant{g("bifrost_query:read:vala.datasets.tickets")}}, nil, ""},
		{"another spelling of a held tool", identity.MintRequest{Delegator: "user:owner", Delegate: "svc:a", AgentID: "scheduler",
			Grants: []policy.Grant{g("tool:invoke:tool:bifrost-query")}}, nil, ""},
		{"through roles", identity.MintRequest{Delegator: "user:alice", Delegate: "svc:a", AgentID: "scheduler",
			Grants: []policy.Grant{g("tool:invoke:all"), g("bifrost_query:read:vala.datasets")}}, nil, ""},
		{"with a condition", identity.MintRequest{Delegator: "user:owner", Delegate: "svc:a", AgentID: "scheduler",
			Grants: []policy.Grant{{Resource: "tool", Action: "invoke", Scope: policy.Scope{Tool: "fs.read"}, When: `args.path.startsWith("/tmp")`}}}, nil, ""},

		{"all when it holds some", identity.MintRequest{Delegator: "user:owner", Delegate: "svc:a", AgentID: "scheduler",
			Grants: []policy.Grant{g("tool:invoke:fs.read"), g("tool:invoke:all")}}, identity.ErrNotHeld, "user:owner does not hold tool:invoke:all"},
		{"wider resource", identity.MintRequest{Delegator: "user:owner", Delegate: "svc:a", AgentID: "scheduler",
			Grants: []policy.Grant{g("bifrost_query:read:vala")}}, identity.ErrNotHeld, "bifrost_query:read:name=vala"},
		{"a tool not held", identity.MintRequest{Delegator: "user:owner", Delegate: "svc:a", AgentID: "scheduler",
			Grants: []policy.Grant{g("tool:invoke:fs.search")}}, identity.ErrNotHeld, "tool:invoke:tool=fs.search"},
		{"another action", identity.MintRequest{Delegator: "user:owner", Delegate: "svc:a", AgentID: "scheduler",
			Grants: []policy.Grant{g("approval:decide:all")}}, identity.ErrNotHeld, "approval:decide:all"},
		{"through a bundle delegation it only narrows", identity.MintRequest{Delegator: "svc:report", Delegate: "svc:a", AgentID: "scheduler",
			Grants: []policy.Grant{g("tool:invoke:fs.search")}}, identity.ErrNotHeld, "svc:report does not hold"},
		{"undeclared delegator", identity.MintRequest{Delegator: "user:nobody", Delegate: "svc:a", AgentID: "scheduler",
			Grants: []policy.Grant{g("tool:invoke:fs.read")}}, identity.ErrInvalid, "not a declared Principal"},
		{"undeclared agent", identity.MintRequest{Delegator: "user:owner", Delegate: "svc:a", AgentID: "ghost",
			Grants: []policy.Grant{g("tool:invoke:fs.read")}}, identity.ErrInvalid, "not a declared Agent"},
		{"no delegate", identity.MintRequest{Delegator: "user:owner", AgentID: "scheduler",
			Grants: []policy.Grant{g("tool:invoke:fs.read")}}, identity.ErrInvalid, "delegate"},
		{"no grants", identity.MintRequest{Delegator: "user:owner", Delegate: "svc:a", AgentID: "scheduler"}, identity.ErrInvalid, "at least one grant"},
		{"delegate named after a declared principal", identity.MintRequest{Delegator: "user:owner", Delegate: "svc:report", AgentID: "scheduler",
			Grants: []policy.Grant{g("tool:invoke:fs.read")}}, identity.ErrInvalid, "is a declared Principal"},
		{"delegate is the delegator", identity.MintRequest{Delegator: "user:owner", Delegate: "user:owner", AgentID: "scheduler",
			Grants: []policy.Grant{g("tool:invoke:fs.read")}}, identity.ErrInvalid, "the delegate is the delegator"},
		{"ttl over max", identity.MintRequest{Delegator: "user:owner", Delegate: "svc:a", AgentID: "scheduler",
			Grants: []policy.Grant{g("tool:invoke:fs.read")}, TTL: 48 * time.Hour}, identity.ErrInvalid, "max_ttl"},
		{"bad condition", identity.MintRequest{Delegator: "user:owner", Delegate: "svc:a", AgentID: "scheduler",
			Grants: []policy.Grant{{Resource: "tool", Action: "invoke", Scope: policy.Scope{Tool: "fs.read"}, When: "args.("}}}, identity.ErrInvalid, "when"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m, err := auth.Mint(tc.req)
			if tc.wantErr == nil {
				if err != nil {
					t.Fatal(err)
				}
				if _, err := auth.Verify(m.Token); err != nil {
					t.Errorf("the minted token does not verify: %v", err)
				}
				return
			}
			if !errors.Is(err, tc.wantErr) || !strings.Contains(err.Error(), tc.wantMsg) {
				t.Errorf("got %v, want %v containing %q", err, tc.wantErr, tc.wantMsg)
			}
		})
	}
}

// TestDelegationRequest: over HTTP the delegator is the caller, and the
// token stays with the caller's agent, instance, environment and mode.
func TestDelegationRequest(t *testing.T) {
	caller := gate.Identity{Principal: "user:owner", AgentID: "files", InstanceID: "acme", Environment: "staging"}
	tool := policy.Grant{Resource: "tool", Action: "invoke", Scope: policy.Scope{Tool: "fs.read"}}
	cases := []struct {
		name    string
		caller  gate.Identity
		req     identity.DelegationRequest
		want    identity.MintRequest
		wantErr error
	}{
		{"defaults from the caller", caller, identity.DelegationRequest{Delegate: "svc:a", Grants: []identity.Grant{identity.GrantOf(tool)}, TTL: "10m"},
			identity.MintRequest{Delegator: "user:owner", Delegate: "svc:a", AgentID: "files", InstanceID: "acme", Environment: "staging",
				Grants: []policy.Grant{tool}, TTL: 10 * time.Minute}, nil},
		{"the caller's agent repeated", caller, identity.DelegationRequest{Delegate: "svc:a", AgentID: "files", Environment: "staging", Grants: []identity.Grant{identity.GrantOf(tool)}},
			identity.MintRequest{Delegator: "user:owner", Delegate: "svc:a", AgentID: "files", InstanceID: "acme", Environment: "staging",
				Grants: []policy.Grant{tool}}, nil},
		// The credential binds the agent too: a key for the files agent
		// cannot mint a token that calls through another agent.
		{"another agent", caller, identity.DelegationRequest{Delegate: "svc:a", AgentID: "scheduler", Grants: []identity.Grant{identity.GrantOf(tool)}},
			identity.MintRequest{}, identity.ErrInvalid},
		{"another environment", caller, identity.DelegationRequest{Delegate: "svc:a", Environment: "production"}, identity.MintRequest{}, identity.ErrInvalid},
		{"another instance", caller, identity.DelegationRequest{Delegate: "svc:a", InstanceID: "globex"}, identity.MintRequest{}, identity.ErrInvalid},
		{"bad ttl", caller, identity.DelegationRequest{Delegate: "svc:a", TTL: "soon"}, identity.MintRequest{}, identity.ErrInvalid},
		{"a delegate cannot delegate", gate.Identity{Principal: "user:owner", AgentID: "files", Delegation: &gate.Delegation{ID: "dlg_x"}},
			identity.DelegationRequest{Delegate: "svc:b"}, identity.MintRequest{}, identity.ErrDelegated},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.req.MintRequest(tc.caller)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("err %v, want %v", err, tc.wantErr)
			}
			if diff := cmp.Diff(tc.want, got, cmpopts.EquateEmpty()); tc.wantErr == nil && diff != "" {
				t.Errorf("mint request (-want +got):\n%s", diff)
			}
		})
	}
}

// TestNewRefusesOpenIssuer: New is documented for validated bundles, but an
// issuer without iss or aud would make go-jose skip that check (it checks
// aud only when given some), so New refuses it itself (fail closed).
func TestNewRefusesOpenIssuer(t *testing.T) {
	dir := t.TempDir()
	p := newIDP(t)
	jwks := dir + "/jwks.json"
	if err := os.WriteFile(jwks, p.jwks(t), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		is   policy.JWTIssuer
		want string
	}{
		{"no audience", policy.JWTIssuer{Issuer: "https://idp.test/", JWKSFile: jwks, AgentID: policy.ClaimBinding{Value: "scheduler"}}, "audience"},
		{"empty audience value", policy.JWTIssuer{Issuer: "https://idp.test/", Audience: []string{""}, JWKSFile: jwks, AgentID: policy.ClaimBinding{Value: "scheduler"}}, "audience"},
		{"no issuer", policy.JWTIssuer{Audience: []string{"toolgate"}, JWKSFile: jwks, AgentID: policy.ClaimBinding{Value: "scheduler"}}, "issuer"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := &policy.Bundle{Settings: []*policy.Settings{{JWTIssuers: []policy.JWTIssuer{tc.is}}}}
			if _, err := identity.New(b, nil, nil); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("New: %v; want an error naming %s", err, tc.want)
			}
		})
	}
}

// rolesIssuer is the test issuer whose tokens must name their roles.
const rolesIssuer = "https://idp-roles.test/"

// withExtraKey is the JSON of claims with one more member added as written
// (a key the map cannot hold twice).
func withExtraKey(claims map[string]any, member string) json.RawMessage {
	b, _ := json.Marshal(claims)
	return json.RawMessage(append([]byte(`{`+member+`,`), b[1:]...))
}
