package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"

	"github.com/toolgate/toolgate/audit"
	"github.com/toolgate/toolgate/gate"
	"github.com/toolgate/toolgate/httpapi"
	"github.com/toolgate/toolgate/identity"
	"github.com/toolgate/toolgate/mcpproxy"
	"github.com/toolgate/toolgate/policy"
)

// EventDelegationMinted is the audit event written when POST
// /v1/delegations mints a delegation token: who handed what to whom, for
// how long (never the token itself).
const EventDelegationMinted = identity.EventMinted

// EventDelegationRefused records a refused attempt to mint a delegation
// (wider than the caller holds, another agent, a delegate re-delegating).
const EventDelegationRefused = "identity.delegation.refused"

// identityState is the gateway's token verification: the delegation
// keyring in the data folder (one for the gateway's life; the key is made
// on first use) and, per bundle, the identity.Authenticator that the
// credential table (identity.Table, installed in the gate) carries.
type identityState struct {
	once sync.Once
	keys *identity.Keyring
}

// keyring returns the data folder's delegation keyring.
func (gw *Gateway) keyring() *identity.Keyring {
	gw.ident.once.Do(func() { gw.ident.keys = identity.NewKeyring(gw.cfg.DataDir) })
	return gw.ident.keys
}

// identities builds the credential table for b: its API keys, and the JWTs
// and delegation tokens package identity verifies. The error names an
// unusable jwks_file; the bundle is then refused like an invalid one.
func (gw *Gateway) identities(b *policy.Bundle) (*identity.Table, error) {
	auth, err := identity.New(b, gw.keyring(), &identity.Options{Logger: gw.log})
	if err != nil {
		return nil, fmt.Errorf("identity settings: %w", err)
	}
	return identity.NewTable(b, auth), nil
}

// authenticator returns the current bundle's authenticator.
func (gw *Gateway) authenticator() (*identity.Authenticator, bool) {
	t, ok := gw.Gate.Credentials().(*identity.Table)
	if !ok {
		return nil, false
	}
	a := t.Authenticator()
	return a, a != nil
}

// narrowedPaths are the JSON API routes an identity narrowed by a
// delegation token or a JWT's roles may use: those that decide calls, where
// the narrowing applies. The others (approvals, the audit log) check the
// principal's own grants only and would not see the narrowing, so a
// narrowed identity is refused there (fail closed; a route added later is
// refused until listed here).
var narrowedPaths = map[string]bool{"/v1/resolve": true, "/v1/decide": true, "/v1/tools/call": true}

// identifyHTTP authenticates a JSON API request like the MCP proxy does.
// An identity narrowed by a delegation token or a JWT's roles may only
// resolve, decide and call (narrowedPaths): it may not read or decide
// approvals nor read the audit log, which its principal's own grants would
// allow but its token does not hand on.
func (gw *Gateway) identifyHTTP(r *http.Request) (gate.Identity, error) {
	id, err := gw.Proxy.Authenticate(r, "http") // a failure is logged, counted and audited
	if err != nil {
		return id, err
	}
	if id.Delegation != nil && !narrowedPaths[r.URL.Path] {
		return gate.Identity{}, &httpapi.Error{Status: http.StatusForbidden, Code: "delegated_identity",
			Message: fmt.Sprintf("%s narrows %s's authority to calling tools; approvals and the audit log need the principal's own credential", id.Delegation.ID, id.Principal)}
	}
	return id, nil
}

// delegationsHandler serves POST /v1/delegations: the caller's
// authenticated principal mints a delegation token (identity.
// DelegationRequest → 201 identity.Minted). A grant the caller does not
// hold is refused with 403 grant_not_held naming it; a caller that is
// itself a delegate gets 403 delegated_identity; a request without a
// credential (even with Settings.anonymous) or with a bad one 401; a bad
// body 400. The identity.delegation.minted event is durable before the
// token is answered; if the audit log cannot write, 503 and no token.
func (gw *Gateway) delegationsHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := gw.mintHTTP(w, r); err != nil {
			e := httpapi.Classify(err)
			if e.Status >= 500 {
				gw.log.Error("mint delegation", "err", err)
			}
			if e.Status == http.StatusForbidden || e.Status == http.StatusBadRequest {
				// A refused attempt to hand out authority is never silent.
				gw.Gate.RecordEvent(audit.Event{EventType: EventDelegationRefused, Verdict: "deny", Code: e.Code,
					Reason: e.Message, Details: map[string]any{"via": "http"}})
			}
			httpapi.WriteError(w, err)
		}
	})
}

func (gw *Gateway) mintHTTP(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		w.Header().Set("Connection", "close") // the body stays unread
		return &httpapi.Error{Status: http.StatusMethodNotAllowed, Code: "method_not_allowed",
			Message: r.Method + " " + r.URL.Path + " is not allowed; use POST"}
	}
	cred := r.Header.Get("Authorization")
	if cred == "" {
		// Not the anonymous identity: a token minted without a credential
		// would outlive Settings.anonymous being turned off.
		w.Header().Set("Connection", "close") // the body stays unread
		w.Header().Set("WWW-Authenticate", `Bearer realm="toolgate"`)
		const msg = "minting a delegation token needs the delegator's own credential (Authorization: Bearer ...)"
		gw.Proxy.AuthRefused(r, "http", mcpproxy.MissingCredential(msg))
		return &httpapi.Error{Status: http.StatusUnauthorized, Code: "unauthenticated", Message: "unauthenticated: " + msg}
	}
	caller, err := gw.Proxy.Authenticate(r, "http")
	if err != nil {
		w.Header().Set("Connection", "close")
		w.Header().Set("WWW-Authenticate", `Bearer realm="toolgate"`)
		return &httpapi.Error{Status: http.StatusUnauthorized, Code: "unauthenticated", Message: "unauthenticated: " + err.Error(), Err: err}
	}
	var body identity.DelegationRequest
	if err := httpapi.DecodeJSON(w, r, &body); err != nil {
		return err
	}
	auth, ok := gw.authenticator()
	if !ok {
		return &httpapi.Error{Status: http.StatusNotImplemented, Code: "no_delegations", Message: "this gateway mints no delegation tokens"}
	}
	req, err := body.MintRequest(caller)
	var m identity.Minted
	if err == nil {
		m, err = auth.Mint(req)
	}
	switch {
	case err == nil:
	case errors.Is(err, identity.ErrNotHeld):
		return &httpapi.Error{Status: http.StatusForbidden, Code: "grant_not_held", Message: err.Error(), Err: err}
	case errors.Is(err, identity.ErrDelegated):
		return &httpapi.Error{Status: http.StatusForbidden, Code: "delegated_identity", Message: err.Error(), Err: err}
	case errors.Is(err, identity.ErrDisabled):
		return &httpapi.Error{Status: http.StatusForbidden, Code: "delegations_disabled", Message: err.Error(), Err: err}
	case errors.Is(err, identity.ErrInvalid):
		return &httpapi.Error{Status: http.StatusBadRequest, Code: "bad_request", Message: err.Error(), Err: err}
	default:
		return err
	}
	// The token is handed out only once its record is durable: no
	// authority exists that the audit log does not show.
	if rec := gw.Gate.Recorder(); rec != nil {
		if _, err := rec.Record(context.WithoutCancel(r.Context()), m.Event(httpapi.Via)); err != nil {
			return &httpapi.Error{Status: http.StatusServiceUnavailable, Code: "audit_unavailable",
				Message: fmt.Sprintf("the audit log cannot record delegation %s, so its token is withheld: %v", m.ID, err), Err: err}
		}
	}
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusCreated)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(m) // the client went away; the token was minted and recorded
	return nil
}
