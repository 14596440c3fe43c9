package identity_test

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"encoding/base64"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"

	"github.com/toolgate/toolgate/identity"
	"github.com/toolgate/toolgate/policy"
)

// t0 is the tests' clock reading.
var t0 = time.Date(2026, 10, 18, 12, 0, 0, 0, time.UTC)

// idp is a test identity provider: real keys, real signed tokens.
type idp struct {
	rsa   *rsa.PrivateKey
	ec    *ecdsa.PrivateKey
	ed    ed25519.PrivateKey
	other *rsa.PrivateKey // not in the JWKS
}

func newIDP(t testing.TB) *idp {
	t.Helper()
	r, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	o, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	e, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	_, ed, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return &idp{rsa: r, ec: e, ed: ed, other: o}
}

// jwks is the public key set: rsa-1, ec-1, ed-1.
func (p *idp) jwks(t testing.TB) []byte {
	t.Helper()
	set := jose.JSONWebKeySet{Keys: []jose.JSONWebKey{
		{Key: p.rsa.Public(), KeyID: "rsa-1", Use: "sig", Algorithm: "RS256"},
		{Key: p.ec.Public(), KeyID: "ec-1", Use: "sig"},
		{Key: p.ed.Public(), KeyID: "ed-1"},
	}}
	b, err := json.Marshal(set)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// sign signs claims with key under alg, with kid and any extra headers.
func sign(t testing.TB, alg jose.SignatureAlgorithm, key any, kid string, claims any, extra map[jose.HeaderKey]any) string {
	t.Helper()
	opts := &jose.SignerOptions{}
	opts.WithType("JWT")
	if kid != "" {
		opts.WithHeader("kid", kid)
	}
	for k, v := range extra {
		opts.WithHeader(k, v)
	}
	s, err := jose.NewSigner(jose.SigningKey{Algorithm: alg, Key: key}, opts)
	if err != nil {
		t.Fatal(err)
	}
	payload, err := json.Marshal(claims)
	if err != nil {
		t.Fatal(err)
	}
	obj, err := s.Sign(payload)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := obj.CompactSerialize()
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// unsigned builds a token with alg none by hand.
func unsigned(claims any) string {
	enc := base64.RawURLEncoding
	h, _ := json.Marshal(map[string]string{"alg": "none", "typ": "JWT"})
	p, _ := json.Marshal(claims)
	return enc.EncodeToString(h) + "." + enc.EncodeToString(p) + "."
}

// hmacWithPublicKey signs with HS256 using the RSA public key's JWK as the
// secret: the classic algorithm-confusion forgery.
func hmacWithPublicKey(t testing.TB, pub crypto.PublicKey, claims any) string {
	t.Helper()
	secret, err := json.Marshal(jose.JSONWebKey{Key: pub})
	if err != nil {
		t.Fatal(err)
	}
	return sign(t, jose.HS256, secret, "rsa-1", claims, nil)
}

// tamper replaces the payload of a signed token, keeping its signature.
func tamper(t testing.TB, token string, claims any) string {
	t.Helper()
	parts := strings.Split(token, ".")
	p, _ := json.Marshal(claims)
	parts[1] = base64.RawURLEncoding.EncodeToString(p)
	return strings.Join(parts, ".")
}

// claims returns the standard claims of a good token at t0, with changes
// applied (a nil value deletes the claim).
func claims(changes map[string]any) map[string]any {
	c := map[string]any{
		"iss": "https://idp.test/", "aud": []string{"toolgate"}, "sub": "alice", "env": "prod",
		"iat": t0.Add(-time.Minute).Unix(), "nbf": t0.Add(-time.Minute).Unix(), "exp": t0.Add(time.Hour).Unix(),
	}
	for k, v := range changes {
		if v == nil {
			delete(c, k)
		} else {
			c[k] = v
		}
	}
	return c
}

const testBundle = `
- {kind: Tool, tool_id: tool:fs-read, side_effect_class: read}
- {kind: Tool, tool_id: tool:fs-search, side_effect_class: read}
- {kind: Tool, name: bifrost.query, tool_id: tool:bifrost-query, side_effect_class: read}
- kind: Agent
  agent_id: scheduler
  version: 1.0.0
  runtime_engine: cron
  tool_permissions:
    - {tool_id: tool:fs-read, side_effect_class: read}
    - {tool_id: tool:fs-search, side_effect_class: read}
    - {tool_id: tool:bifrost-query, side_effect_class: read}
- {kind: RuntimePolicy, agent_id: scheduler, deployment_mode: production, tool_authorization_policy: {active_tool_set: all}}
- kind: Role
  role_id: invoker
  grants: [{resource: tool, action: invoke, scope: all}]
- kind: Role
  role_id: reader
  grants: [{resource: bifrost_query, action: read, scope: {name: vala.datasets}}]
- kind: Principal
  principal_id: user:alice
  roles: [invoker, reader]
- kind: Principal
  principal_id: user:owner
  grants:
    - {resource: tool, action: invoke, scope: {tool: fs.read}}
    - {resource: tool, action: invoke, scope: {tool: bifrost.query}}
    - {resource: bifrost_query, action: read, scope: {name: vala.datasets}, when: 'true'}
- kind: Principal
  principal_id: svc:report
  delegated_from: user:owner
  grants:
    - {resource: tool, action: invoke, scope: all}
- kind: Settings
  jwt_issuers:
    - issuer: https://idp.test/
      audience: [toolgate, other]
      jwks_file: jwks.json
      algorithms: [RS256, ES256, EdDSA]
      principal_prefix: "user:"
      agent_id: scheduler
      environment: {claim: env}
      deployment_mode: production
    # The same IdP's tokens for clients that must name their roles.
    - issuer: https://idp-roles.test/
      audience: [toolgate, other]
      jwks_file: jwks.json
      algorithms: [RS256, ES256, EdDSA]
      principal_prefix: "user:"
      roles_claim: roles
      agent_id: scheduler
      environment: {claim: env}
      deployment_mode: production
  delegations:
    revoked_ids: [dlg_revoked]
`

// loadBundle writes src and the JWKS into a folder and loads it; the
// bundle must validate.
func loadBundle(t testing.TB, src string, jwks []byte) *policy.Bundle {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "bundle.yaml"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	if jwks != nil {
		if err := os.WriteFile(filepath.Join(dir, "jwks.json"), jwks, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	b, err := policy.LoadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if rep := b.Validate(nil); !rep.OK() {
		t.Fatalf("bundle: %v", rep.Err())
	}
	return b
}

// clock is a settable test clock.
type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func newAuth(t testing.TB, b *policy.Bundle, keys *identity.Keyring, c *clock) *identity.Authenticator {
	t.Helper()
	a, err := identity.New(b, keys, &identity.Options{Now: c.now})
	if err != nil {
		t.Fatal(err)
	}
	return a
}
