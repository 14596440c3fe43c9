package gateway

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"
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
const EventDelegationMinted = "identity.delegation.minted"

// identityState is the gateway's token verification: the delegation
// keyring in the data folder (one for the gateway's life; the key is made
// on first use) and, per bundle, the identity.Authenticator that the MCP
// proxy's credential table carries (mcpproxy.Identities.Tokens).
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
func (gw *Gateway) identities(b *policy.Bundle) (*mcpproxy.Identities, error) {
	auth, err := identity.New(b, gw.keyring(), &identity.Options{Logger: gw.log})
	if err != nil {
		return nil, fmt.Errorf("identity settings: %w", err)
	}
	return mcpproxy.NewIdentities(b).WithTokens(auth), nil
}

// authenticator returns the current bundle's authenticator.
func (gw *Gateway) authenticator() (*identity.Authenticator, bool) {
	a, ok := gw.Proxy.Identities().Tokens().(*identity.Authenticator)
	return a, ok && a != nil
}

// identifyHTTP authenticates a JSON API request like the MCP proxy does.
// An identity narrowed by a delegation token or a JWT's roles may not
// decide approvals: the approval:decide check reads the principal's grants
// only, so it would not see the narrowing (fail closed).
func (gw *Gateway) identifyHTTP(r *http.Request) (gate.Identity, error) {
	id, err := gw.Proxy.Identities().Identify(r.Header.Get("Authorization"))
	if err != nil {
		return id, err
	}
	if id.Delegation != nil && r.Method == http.MethodPost && strings.HasPrefix(r.URL.Path, "/v1/approvals/") {
		return gate.Identity{}, &httpapi.Error{Status: http.StatusForbidden, Code: "delegated_identity",
			Message: fmt.Sprintf("%s narrows %s's authority, and a narrowed identity cannot approve or deny calls; decide approvals with the principal's own credential", id.Delegation.ID, id.Principal)}
	}
	return id, nil
}

// delegationsHandler serves POST /v1/delegations: the caller's
// authenticated principal mints a delegation token (identity.
// DelegationRequest → 201 identity.Minted). A grant the caller does not
// hold is refused with 403 grant_not_held naming it; a caller that is
// itself a delegate gets 403 delegated_identity; a bad body 400.
func (gw *Gateway) delegationsHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := gw.mintHTTP(w, r); err != nil {
			if e := httpapi.Classify(err); e.Status >= 500 {
				gw.log.Error("mint delegation", "err", err)
			}
			httpapi.WriteError(w, err)
		}
	})
}

func (gw *Gateway) mintHTTP(w http.ResponseWriter, r *http.Request) error {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		return &httpapi.Error{Status: http.StatusMethodNotAllowed, Code: "method_not_allowed",
			Message: r.Method + " " + r.URL.Path + " is not allowed; use POST"}
	}
	caller, err := gw.Proxy.Identities().Identify(r.Header.Get("Authorization"))
	if err != nil {
		return &httpapi.Error{Status: http.StatusUnauthorized, Code: "unauthenticated", Message: "unauthenticated: " + err.Error(), Err: err}
	}
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		return &httpapi.Error{Status: http.StatusUnsupportedMediaType, Code: "unsupported_media_type",
			Message: "the request body must be JSON sent with Content-Type: application/json"}
	}
	var body identity.DelegationRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, httpapi.MaxBodyBytes))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&body); err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return err
		}
		return &httpapi.Error{Status: http.StatusBadRequest, Code: "malformed_json", Message: "the body is not a delegation request: " + err.Error(), Err: err}
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return &httpapi.Error{Status: http.StatusBadRequest, Code: "malformed_json", Message: "the request body holds more than one JSON value; send exactly one object"}
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
	grants := make([]any, len(m.Grants))
	for i, g := range m.Grants {
		grants[i] = g.String()
	}
	gw.Gate.RecordEvent(audit.Event{EventType: EventDelegationMinted, AgentID: m.AgentID, Principal: m.Delegator,
		InstanceID: m.InstanceID, Environment: m.Environment, DeploymentMode: m.DeploymentMode,
		Reason: fmt.Sprintf("%s handed %d grants to %s until %s", m.Delegator, len(m.Grants), m.Delegate, m.ExpiresAt.Format("2006-01-02T15:04:05Z07:00")),
		Details: map[string]any{"delegation_id": m.ID, "delegator": m.Delegator, "delegate": m.Delegate, "grants": grants,
			"expires_at": m.ExpiresAt.Format("2006-01-02T15:04:05Z07:00"), "via": httpapi.Via}})
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusCreated)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(m) // the client went away; the token was minted and recorded
	return nil
}
