package identity

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"

	"github.com/toolgate/toolgate/gate"
	"github.com/toolgate/toolgate/policy"
)

// Table is the whole credential table of one bundle: the API keys of its
// Credential documents (stored as SHA-256 only), the JWTs and delegation
// tokens an Authenticator verifies, the anonymous identity of
// Settings.anonymous, and the browser origins Settings.allowed_origins
// allows. It answers who a request is, from its Authorization header
// alone. It is immutable: a reload builds a new one (gate.Install swaps it
// with the snapshot), so credentials and policy change together. It
// implements gate.Credentials.
type Table struct {
	byKeyHash map[string]gate.Identity
	anonymous *gate.Identity
	origins   map[string]bool
	tokens    *Authenticator
}

var _ gate.Credentials = (*Table)(nil)

// NewTable builds the credential table of bundle b; tokens (nil: API keys
// only) verifies the JWT-shaped bearer tokens.
func NewTable(b *policy.Bundle, tokens *Authenticator) *Table {
	t := &Table{byKeyHash: map[string]gate.Identity{}, origins: map[string]bool{}, tokens: tokens}
	for _, c := range b.Credentials {
		t.byKeyHash[c.APIKeySHA256] = fromPolicy(c.Identity)
	}
	if len(b.Settings) > 0 {
		if a := b.Settings[0].Anonymous; a != nil {
			id := fromPolicy(*a)
			t.anonymous = &id
		}
		for _, o := range b.Settings[0].AllowedOrigins {
			t.origins[o] = true
		}
	}
	return t
}

// Authenticator returns the token verifier of the table (nil if none).
func (t *Table) Authenticator() *Authenticator { return t.tokens }

func fromPolicy(p policy.Identity) gate.Identity {
	return gate.Identity{Principal: p.Principal, AgentID: p.AgentID, InstanceID: p.InstanceID,
		Environment: p.Environment, DeploymentMode: p.DeploymentMode}
}

// Reasons of failed authentication (AuthError.Reason).
const (
	// AuthMissing: no credential, and Settings.anonymous is not set (or
	// the route needs a credential).
	AuthMissing = "missing_credential"
	// AuthMalformed: an Authorization header that is not "Bearer <key>".
	AuthMalformed = "malformed_authorization"
	// AuthUnknownKey: an API key no Credential document has.
	AuthUnknownKey = "unknown_api_key"
	// AuthInvalidToken: a JWT or delegation token that does not verify
	// (expired, wrong issuer or audience, bad signature, revoked, ...).
	AuthInvalidToken = "invalid_token"
)

// ErrUnauthorized is wrapped by every failed authentication of a Table.
var ErrUnauthorized = errors.New("unauthorized")

// AuthError is a failed authentication: Reason is one of the Auth*
// constants. It wraps ErrUnauthorized (and the verifier's error); its
// message never holds the credential.
type AuthError struct {
	Reason string
	msg    string
	err    error
}

func (e *AuthError) Error() string { return e.msg }

// Unwrap returns ErrUnauthorized and the verifier's error, if any.
func (e *AuthError) Unwrap() []error { return []error{ErrUnauthorized, e.err} }

func authError(reason string, err error, format string, args ...any) *AuthError {
	return &AuthError{Reason: reason, msg: ErrUnauthorized.Error() + ": " + fmt.Sprintf(format, args...), err: err}
}

// AuthReason returns the reason of a failed authentication (an *AuthError
// anywhere in err's chain), or AuthMissing when err says none.
func AuthReason(err error) string {
	var ae *AuthError
	if errors.As(err, &ae) {
		return ae.Reason
	}
	return AuthMissing
}

// Identify maps an Authorization header to an identity: a known API key's
// identity, a JWT or delegation token's, or the anonymous identity (marked
// Anonymous) when there is no header and one is configured. A wrong key or
// token is refused even when anonymous access is on. The error is an
// *AuthError saying why (AuthReason); it never holds the credential.
func (t *Table) Identify(authorization string) (gate.Identity, error) {
	if authorization == "" {
		if t.anonymous != nil {
			id := *t.anonymous
			id.Anonymous = true
			return id, nil
		}
		return gate.Identity{}, authError(AuthMissing, nil, "no credential (send Authorization: Bearer <api key>)")
	}
	key, ok := BearerToken(authorization)
	if !ok {
		return gate.Identity{}, authError(AuthMalformed, nil, "the Authorization header must be Bearer <api key>")
	}
	sum := sha256.Sum256([]byte(key))
	id, ok := t.byKeyHash[hex.EncodeToString(sum[:])]
	if !ok && t.tokens != nil && strings.Count(key, ".") == 2 {
		// JWT-shaped: a token, never the client's say.
		tid, err := t.tokens.Verify(key)
		if err != nil {
			return gate.Identity{}, authError(AuthInvalidToken, err, "%v", err)
		}
		return tid, nil
	}
	if !ok {
		return gate.Identity{}, authError(AuthUnknownKey, nil, "unknown API key")
	}
	return id, nil
}

// BearerToken returns the token of an Authorization header "Bearer TOKEN"
// (the scheme in any case, the token trimmed); false if it is not one.
func BearerToken(authorization string) (string, bool) {
	scheme, key, ok := strings.Cut(authorization, " ")
	key = strings.TrimSpace(key)
	if !ok || !strings.EqualFold(scheme, "bearer") || key == "" {
		return "", false
	}
	return key, true
}

// CheckOrigin refuses a browser Origin that is neither loopback nor in
// Settings.allowed_origins, and a non-loopback Host on a loopback listener
// (DNS rebinding protection). It returns why, or "".
func (t *Table) CheckOrigin(r *http.Request) string {
	if o := r.Header.Get("Origin"); o != "" && !t.origins[o] && !loopbackOrigin(o) {
		return "origin " + o + " is not allowed (DNS rebinding protection); add it to Settings.allowed_origins"
	}
	if la, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok {
		if ta, ok := la.(*net.TCPAddr); ok && ta.IP.IsLoopback() && !loopbackHost(r.Host) {
			return "host " + r.Host + " is not allowed on a loopback listener (DNS rebinding protection)"
		}
	}
	return ""
}

func loopbackHost(hostport string) bool {
	h := hostport
	if hh, _, err := net.SplitHostPort(hostport); err == nil {
		h = hh
	}
	if h == "localhost" {
		return true
	}
	ip := net.ParseIP(strings.Trim(h, "[]"))
	return ip != nil && ip.IsLoopback()
}

func loopbackOrigin(o string) bool {
	u, err := url.Parse(o)
	if err != nil {
		return false
	}
	h := u.Hostname()
	if h == "localhost" {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

// MissingCredential is the error of a route that needs a credential and got
// none (AuthReason: AuthMissing).
func MissingCredential(msg string) error { return authError(AuthMissing, nil, "%s", msg) }
