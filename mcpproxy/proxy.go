// Package mcpproxy is the MCP enforcement point: an MCP server over
// Streamable HTTP (the official Go SDK) that fronts the upstream MCP servers
// of package upstream. Each client is identified by its credential, which
// binds principal, agent, instance and environment; tools/list returns
// exactly the disclosed set and tools/call is decided by gate.Authorize
// before anything is forwarded (docs/design.md, "Where a call goes").
//
// A tool the caller cannot see gets the same JSON-RPC error as a tool that
// does not exist, so the list cannot be probed; the audit log still records
// the attempt. A visible tool refused on its arguments or resources gets an
// isError result the model can act on, with code and layer in
// structuredContent.
package mcpproxy

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/toolgate/toolgate"
	"github.com/toolgate/toolgate/adapter/mcptool"
	"github.com/toolgate/toolgate/gate"
	"github.com/toolgate/toolgate/identity"
	"github.com/toolgate/toolgate/toolid"
)

// MaxBodyBytes bounds one request body; larger ones get 413.
const MaxBodyBytes = 4 << 20

// BodyReadTimeout bounds reading one request body; a slower one gets 408
// and the connection is closed.
var BodyReadTimeout = 30 * time.Second

// Observer receives measurements; nil methods are fine to leave out.
type Observer interface {
	Decision(via string, d toolgate.Decision, took time.Duration)
	UpstreamCall(upstream, outcome string, took time.Duration)
}

// Options configures a Proxy.
type Options struct {
	Logger   *slog.Logger
	Observer Observer
	// Version is reported to clients in serverInfo.
	Version string
	// SessionTimeout is how long a client session may stay idle before
	// the gateway closes it; 0 means the default, SessionTimeout.
	SessionTimeout time.Duration
	// MaxSessionsPerAuthority bounds the sessions one principal and agent
	// hold at a time, with all their credentials together (API keys,
	// delegation tokens, JWTs; every anonymous client together); 0 means
	// DefaultMaxSessionsPerAuthority. See sessions.go.
	MaxSessionsPerAuthority int
	// MaxSessions bounds the sessions of all clients together; 0 means
	// DefaultMaxSessions.
	MaxSessions int
	// MaxSubscriptionsPerSession, MaxSubscriptionsPerAuthority and
	// MaxSubscriptions bound the resource subscriptions of one client
	// session, of one principal and agent (all their sessions together)
	// and of all clients together; 0 means DefaultMaxSubscriptionsPerSession
	// (256), DefaultMaxSubscriptionsPerAuthority (1024) and
	// DefaultMaxSubscriptions (8192). See subscriptions.go.
	MaxSubscriptionsPerSession, MaxSubscriptionsPerAuthority, MaxSubscriptions int
	// PageSize is how many items one page of tools/list, resources/list,
	// resources/templates/list or prompts/list holds; 0 means
	// DefaultPageSize.
	PageSize int
	// Registerer, when set, gets the proxy's own collectors:
	// toolgate_auth_failures_total and toolgate_mcp_methods_refused_total.
	Registerer prometheus.Registerer
}

// pathObserver is the optional Observer method that counts tools/call
// requests by the path that served them ("fast" or "sdk");
// *metrics.Metrics has it.
type pathObserver interface{ ToolsCallPath(path string) }

// mirror is one upstream tool as the gateway's clients see it.
type mirror struct {
	// def is the definition tools/list shows (under the model-visible
	// name).
	def      *mcp.Tool
	upstream string
	name     string // the upstream's own name for the tool
	id       string // canonical id
	// typed is true when the tool declares an outputSchema: clients check
	// structuredContent against it, so refusals carry their details in
	// _meta only.
	typed bool
	// builtin is the built-in tool's function name ("sql.query") for a
	// built-in tool (SetBuiltins); "" for an upstream tool.
	builtin string
}

// Proxy is the MCP gateway. Create it with New; serve Handler().
type Proxy struct {
	g       *gate.Gate
	ups     mcptool.Sessions // nil: no upstreams
	server  *mcp.Server
	handler http.Handler
	opts    Options
	log     *slog.Logger

	mu      sync.Mutex
	mirrors map[string]mirror // model-visible name → upstream tool

	// relay passes everything but tools through (passthrough.go).
	relay *relay
	// fast is the fast path's state (fastpath.go).
	fast *fastState
	// fastCalls and sdkCalls count tools/call requests by path.
	fastCalls, sdkCalls atomic.Uint64
	// refused records failed authentication and refused methods
	// (refusals.go).
	refused *refusals
	// lists pages the gateway's own lists (lists.go).
	lists *lister
}

// CallPaths returns how many tools/call requests the fast path and the SDK
// path have served (fastpath.go says which takes which).
func (p *Proxy) CallPaths() (fast, sdk uint64) { return p.fastCalls.Load(), p.sdkCalls.Load() }

func (p *Proxy) countPath(path string) {
	if path == "fast" {
		p.fastCalls.Add(1)
	} else {
		p.sdkCalls.Add(1)
	}
	if o, ok := p.opts.Observer.(pathObserver); ok {
		o.ToolsCallPath(path)
	}
}

// New builds the proxy. ups (an *upstream.Manager) may be nil, or a nil
// *upstream.Manager (no upstreams yet).
func New(g *gate.Gate, ups mcptool.Sessions, opts *Options) *Proxy {
	p := &Proxy{g: g, ups: mcptool.SessionsOrNil(ups), mirrors: map[string]mirror{}}
	if opts != nil {
		p.opts = *opts
	}
	p.log = p.opts.Logger
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	p.relay = newRelay(p)
	g.SetRoutes(p.relay) // accesses are routed by this proxy's mirror (gating.go)
	p.fast = newFastState()
	p.lists = newLister(p.opts.PageSize)
	p.refused = newRefusals(p.log, p.g.RecordRefusal)
	if p.opts.Registerer != nil {
		p.opts.Registerer.MustRegister(p.refused.auth, p.refused.method, p.refused.request)
	}
	version := p.opts.Version
	if version == "" {
		version = "dev"
	}
	so := &mcp.ServerOptions{
		Capabilities: &mcp.ServerCapabilities{Tools: &mcp.ToolCapabilities{ListChanged: true}},
		Logger:       p.log,
	}
	p.relay.configure(so) // resources, prompts, completions, logging, subscriptions
	p.server = mcp.NewServer(&mcp.Implementation{Name: "toolgate", Version: version}, so)
	p.server.AddReceivingMiddleware(p.relay.captureSDK) // innermost: the SDK's own handler
	p.server.AddReceivingMiddleware(p.middleware)
	sdk := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return p.server },
		&mcp.StreamableHTTPOptions{Logger: p.log}) // idle sessions: Proxy.begin
	// A request with a credential carries it to the SDK as TokenInfo, so a
	// session is bound to the credential that created it: another key
	// cannot GET its stream, DELETE it or post into it (403).
	bound := auth.RequireBearerToken(func(_ context.Context, token string, r *http.Request) (*auth.TokenInfo, error) {
		return &auth.TokenInfo{UserID: tokenUserID(token), Expiration: time.Now().Add(24 * time.Hour), Extra: identityExtra(r)}, nil
	}, nil)(sdk)
	// A request without one (Settings.anonymous) is bound to the anonymous
	// user, so that no credential's request can use an anonymous session
	// either; anonymous clients are told apart by their session ids alone.
	anonymous := auth.RequireBearerToken(func(_ context.Context, _ string, r *http.Request) (*auth.TokenInfo, error) {
		return &auth.TokenInfo{UserID: anonymousUserID, Expiration: time.Now().Add(24 * time.Hour), Extra: identityExtra(r)}, nil
	}, nil)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Header.Del("Authorization")
		sdk.ServeHTTP(w, r)
	}))
	p.handler = p.guard(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "" {
			bound.ServeHTTP(w, r)
			return
		}
		r.Header.Set("Authorization", "Bearer "+anonymousUserID) // removed before the SDK reads the request
		anonymous.ServeHTTP(w, r)
	}))
	return p
}

// anonymousUserID is the SDK user every session without a credential is
// bound to (auth.TokenInfo.UserID); no credential's key (tokenUserID) is
// ever equal to it.
const anonymousUserID = "anonymous"

// FlushRefusals writes the summaries of refused authentications and
// methods counted but not yet written (refusals.go); call it at shutdown,
// before the audit log closes.
func (p *Proxy) FlushRefusals() { p.refused.Flush() }

// Authenticate identifies a request to another endpoint of the gateway
// (via: "http" for the JSON API) as the MCP endpoint does, and records a
// failure (log line, toolgate_auth_failures_total, gateway.auth.refused;
// never the credential).
func (p *Proxy) Authenticate(r *http.Request, via string) (gate.Identity, error) {
	id, err := p.g.Credentials().Identify(r.Header.Get("Authorization"))
	if err != nil {
		p.refused.authFailed(r, via, err)
	}
	return id, err
}

// AuthRefused records a failed authentication that the caller decided on
// itself (a route that needs a credential even with Settings.anonymous);
// err says why (AuthReason).
func (p *Proxy) AuthRefused(r *http.Request, via string, err error) {
	p.refused.authFailed(r, via, err)
}

// MissingCredential is the error of a route that needs a credential and
// got none (identity.AuthReason: identity.AuthMissing).
func MissingCredential(msg string) error { return identity.MissingCredential(msg) }

// Handler returns the HTTP handler to mount at /mcp.
func (p *Proxy) Handler() http.Handler { return p.handler }

// writeRPCError answers an HTTP request with a JSON-RPC error body.
func writeRPCError(w http.ResponseWriter, status int, code int64, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": nil, "error": map[string]any{"code": code, "message": msg}})
	w.Write(body)
}

// guard checks Origin, the credential, the body size and batches before
// the SDK sees the request.
func (p *Proxy) guard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		// Every request refused here or by the SDK is recorded, once.
		w := &statusWriter{ResponseWriter: rw}
		defer func() {
			if w.status >= 400 && !w.recorded {
				p.refused.requestRefused(r, "mcp", w.status, w.reason)
			}
		}()
		creds := p.g.Credentials()
		if msg := creds.CheckOrigin(r); msg != "" {
			w.refuse("origin_refused")
			// The body is not read: close the connection rather than let
			// net/http wait for it (a client could send it never).
			w.Header().Set("Connection", "close")
			writeRPCError(w, http.StatusForbidden, jsonrpc.CodeInvalidRequest, msg)
			return
		}
		ident, err := creds.Identify(r.Header.Get("Authorization"))
		if err != nil {
			p.refused.authFailed(r, "mcp", err)
			w.recorded = true
			w.Header().Set("Connection", "close")
			w.Header().Set("WWW-Authenticate", `Bearer realm="toolgate"`)
			writeRPCError(w, http.StatusUnauthorized, jsonrpc.CodeInvalidRequest, err.Error())
			return
		}
		r = r.WithContext(context.WithValue(r.Context(), identityKey{}, ident))
		sid := r.Header.Get("Mcp-Session-Id")
		cred := credentialKey(r.Header.Get("Authorization"))
		done := p.begin(sid, cred)
		defer done()
		if r.Method == http.MethodPost {
			// A slow body cannot hold the connection: BodyReadTimeout for the
			// whole body, then no deadline (a response stream may be long).
			rc := http.NewResponseController(w)
			rc.SetReadDeadline(time.Now().Add(BodyReadTimeout))
			body, err := io.ReadAll(http.MaxBytesReader(rw, r.Body, MaxBodyBytes)) // rw: net/http closes the connection after a 413
			rc.SetReadDeadline(time.Time{})
			if err != nil {
				var tooBig *http.MaxBytesError
				if errors.As(err, &tooBig) {
					w.refuse("body_too_large")
					writeRPCError(w, http.StatusRequestEntityTooLarge, jsonrpc.CodeInvalidRequest, fmt.Sprintf("request body is larger than %d bytes", MaxBodyBytes))
					return
				}
				var ne net.Error
				if errors.As(err, &ne) && ne.Timeout() {
					w.refuse("body_timeout")
					w.Header().Set("Connection", "close")
					writeRPCError(w, http.StatusRequestTimeout, jsonrpc.CodeInvalidRequest, fmt.Sprintf("the request body did not arrive within %s", BodyReadTimeout))
					return
				}
				w.refuse("body_unreadable")
				writeRPCError(w, http.StatusBadRequest, jsonrpc.CodeParseError, "could not read the request body: "+err.Error())
				return
			}
			if t := bytes.TrimLeft(body, " \t\r\n"); len(t) > 0 && t[0] == '[' {
				w.refuse("batch")
				writeRPCError(w, http.StatusBadRequest, jsonrpc.CodeInvalidRequest, "JSON-RPC batches are refused: send each request on its own so each is decided on its own (nothing in this batch was forwarded)")
				return
			}
			env, err := parseEnvelope(body)
			if err != nil {
				w.refuse("malformed_jsonrpc")
				writeRPCError(w, http.StatusBadRequest, jsonrpc.CodeInvalidRequest, err.Error())
				return
			}
			if env.Method != nil && !clientMethods[*env.Method] {
				w.recorded = true
				p.refuseMethod(w, r, env)
				return
			}
			if sid == "" && env.Method != nil && *env.Method == "initialize" {
				release, ok := p.admitSession(w, r, cred, ident)
				if !ok {
					return
				}
				defer release()
			}
			if sid != "" && p.serveFast(w, r, sid, env, ident) {
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
			r.ContentLength = int64(len(body))
		}
		next.ServeHTTP(w, r)
	})
}

// refuseMethod answers a message whose method the gateway does not serve
// (clientMethods): a request gets method not found, a notification 400;
// both are recorded.
func (p *Proxy) refuseMethod(w http.ResponseWriter, r *http.Request, env *envelope) {
	p.refused.methodRefused(r, "mcp", *env.Method)
	msg := fmt.Sprintf("method %.128q is not one the gateway serves (toolgate serves the MCP methods of tools, resources, prompts, completion and logging, and nothing else)", *env.Method)
	if !env.isRequest() {
		writeRPCError(w, http.StatusBadRequest, jsonrpc.CodeMethodNotFound, msg)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	w.Write(errorMessage(env.ID, &jsonrpc.Error{Code: jsonrpc.CodeMethodNotFound, Message: msg}))
}

// OriginGuard applies the Origin and Host checks of the MCP endpoint to
// another handler (the JSON API).
func (p *Proxy) OriginGuard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if msg := p.g.Credentials().CheckOrigin(r); msg != "" {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusForbidden)
			body, _ := json.Marshal(map[string]any{"error": map[string]any{"code": "origin_refused", "message": msg}})
			w.Write(body)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// identify is the identity of an MCP request: the one the guard found for
// it at the edge (carried to the SDK in its TokenInfo), bound to its
// session when anonymous. The request is never identified twice.
func (p *Proxy) identify(req mcp.Request) (gate.Identity, error) {
	extra := req.GetExtra()
	if extra == nil || extra.TokenInfo == nil {
		return gate.Identity{}, fmt.Errorf("%w: no identity from the edge", identity.ErrUnauthorized)
	}
	id, ok := extra.TokenInfo.Extra[identityExtraKey].(gate.Identity)
	if !ok {
		return gate.Identity{}, fmt.Errorf("%w: no identity from the edge", identity.ErrUnauthorized)
	}
	return withSession(id, sessionID(req)), nil
}

// identityExtraKey is where the SDK's TokenInfo carries the identity the
// guard found for a request.
const identityExtraKey = "io.toolgate/identity"

// identityKey is the request context key of that identity.
type identityKey struct{}

// identityExtra is the TokenInfo.Extra of a request the guard identified.
func identityExtra(r *http.Request) map[string]any {
	if id, ok := r.Context().Value(identityKey{}).(gate.Identity); ok {
		return map[string]any{identityExtraKey: id}
	}
	return nil
}

// withSession binds an anonymous identity to the MCP session sid (a
// digest of it: the id itself lets whoever holds it into the session, and
// approvals show who asked); other identities are returned as they are.
func withSession(id gate.Identity, sid string) gate.Identity {
	if !id.Anonymous || sid == "" {
		return id
	}
	sum := sha256.Sum256([]byte("toolgate anonymous session\x00" + sid))
	id.Session = hex.EncodeToString(sum[:8])
	return id
}

func unknownTool(name string) error {
	return &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: fmt.Sprintf("unknown tool %q", name)}
}

func (p *Proxy) middleware(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		p.remember(req, method)
		if !clientMethods[method] {
			// The guard refused it already (envelope.go); fail closed if
			// anything reaches the SDK another way.
			return nil, &jsonrpc.Error{Code: jsonrpc.CodeMethodNotFound, Message: fmt.Sprintf("method %.128q is not one the gateway serves", method)}
		}
		switch method {
		case "initialize", "ping", "notifications/initialized", "notifications/cancelled",
			"notifications/progress", "notifications/roots/list_changed", "resources/unsubscribe":
			// The SDK's own, per session: nothing to decide or route.
			return next(ctx, method, req)
		}
		id, err := p.identify(req)
		if err != nil {
			return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidRequest, Message: err.Error()}
		}
		switch r := req.(type) {
		case *mcp.ListToolsRequest:
			return p.listTools(ctx, id, r)
		case *mcp.CallToolRequest:
			return p.call(ctx, id, r, next, method)
		case *mcp.ServerRequest[*mcp.SetLoggingLevelParams]:
			return p.relay.handleSetLevel(ctx, id, method, r, next)
		}
		if res, err, handled := p.passThrough(ctx, id, method, req, next); handled {
			return res, err
		}
		// A method in clientMethods that nothing above serves: refused
		// rather than left to the SDK.
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeMethodNotFound, Message: fmt.Sprintf("method %.128q is not one the gateway serves", method)}
	}
}

// listTools answers tools/list with the tools disclosed to id: filtered,
// then paged (lists.go).
func (p *Proxy) listTools(ctx context.Context, id gate.Identity, r *mcp.ListToolsRequest) (mcp.Result, error) {
	disc := p.disclose(id)
	p.mu.Lock()
	all := make([]mirror, 0, len(p.mirrors))
	for _, m := range p.mirrors {
		all = append(all, m)
	}
	p.mu.Unlock()
	gen := p.lists.generation(p.g.Snapshot())
	var kept int
	page, next, err := listPage(p.lists, "tools/list", sessionID(r), gen,
		cursorOf(r.Params, func(p *mcp.ListToolsParams) string { return p.Cursor }), all,
		counting(func(m mirror) bool { return m.def != nil && disc.Disclosed[m.id] }, &kept), func(m mirror) string { return m.def.Name })
	p.listed(ctx, withSession(id, sessionID(r)), "tools/list", len(page), len(all)-kept, err)
	if err != nil {
		return nil, err
	}
	class := make(map[string]toolgate.SideEffectClass, len(disc.Resolution.Tools))
	for _, st := range disc.Resolution.Tools {
		class[st.ToolID] = st.SideEffectClass
	}
	snap := p.g.Snapshot()
	out := &mcp.ListToolsResult{Tools: make([]*mcp.Tool, 0, len(page)), NextCursor: next}
	for _, m := range page {
		t, _ := snap.Tool(m.id)
		out.Tools = append(out.Tools, withGatewayAnnotations(m.def, class[m.id], t.Idempotent))
	}
	out.CacheScope = "private" // the list is this credential's, not everyone's
	return out, nil
}

// withGatewayAnnotations is a tool's definition as the caller is shown it:
// the annotations say the gateway's classification (the tool's effective
// side_effect_class for this caller, and idempotent as the bundle says),
// never the upstream's own claims, which may only ever have raised it. A
// client that trusts readOnlyHint is told the truth.
func withGatewayAnnotations(def *mcp.Tool, class toolgate.SideEffectClass, idempotent bool) *mcp.Tool {
	t := *def
	a := &mcp.ToolAnnotations{IdempotentHint: idempotent}
	if def.Annotations != nil {
		a.Title = def.Annotations.Title
	}
	yes, no := true, false
	switch {
	case class <= toolgate.SideEffectRead:
		a.ReadOnlyHint, a.DestructiveHint = true, &no
	case class == toolgate.SideEffectWrite:
		a.DestructiveHint = &no
	default:
		a.DestructiveHint = &yes
	}
	// openWorldHint left out: its default (true) is the careful reading.
	t.Annotations = a
	return &t
}

func (p *Proxy) lookup(name string) (mirror, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	m, ok := p.mirrors[name]
	return m, ok
}

func (p *Proxy) call(ctx context.Context, id gate.Identity, r *mcp.CallToolRequest, next mcp.MethodHandler, method string) (mcp.Result, error) {
	p.countPath("sdk")
	authorization := ""
	if extra := r.GetExtra(); extra != nil && extra.Header != nil {
		authorization = extra.Header.Get("Authorization")
	}
	req := p.toolRequest(withSession(id, sessionID(r)), r.Params.Name, r.Params.Arguments, r.Params.Meta,
		&callRelay{p: p, ss: r.Session, to: sdkCaller{r.Session}},
		func(ctx context.Context, params *mcp.ProgressNotificationParams) error {
			return r.Session.NotifyProgress(ctx, params)
		}, authorization)
	res, _, err := p.toolAnswer(p.g.Handle(ctx, req), r.Params.Name)
	if err != nil {
		return nil, err
	}
	return res, nil
}

// toolRequest is a tools/call as both transports hand it to gate.Handle:
// the identity, the call, the caller to relay to (relay), and what a held
// call needs (progress notifications when the client gave a progress
// token; its credential checked again before it resumes).
func (p *Proxy) toolRequest(id gate.Identity, name string, args json.RawMessage, meta mcp.Meta, relay *callRelay,
	notify func(context.Context, *mcp.ProgressNotificationParams) error, authorization string) gate.Request {
	req := gate.Request{Identity: id, Tool: name, Args: args, Via: "mcp", Meta: mcptool.WithoutOwnMeta(meta), Relay: relay, Hold: true,
		StillValid: func() error {
			// Approved while held: the call runs, once, but only if its
			// credential is still good (a key removed or a token revoked
			// while it waited must not run it).
			if _, err := p.g.Credentials().Identify(authorization); err != nil {
				return &jsonrpc.Error{Code: jsonrpc.CodeInvalidRequest, Message: err.Error()}
			}
			return nil
		}}
	if token := meta["progressToken"]; token != nil && notify != nil {
		req.Progress = func(waited, total float64, message string) {
			ctx, cancel := context.WithTimeout(context.Background(), notifyTimeout)
			defer cancel()
			notify(ctx, &mcp.ProgressNotificationParams{ProgressToken: token, Progress: waited, Total: total, Message: message})
		}
	}
	return req
}

// toolAnswer is the one mapping from a tools/call's outcome to what the
// client gets, whichever transport carries it: the tool's result (decoded,
// or as the upstream's JSON when it was passed through: raw), an isError
// result for a visible tool that was refused, needs approval or could not
// be run (the decision in _meta), or, for a tool the caller is not shown,
// exactly the JSON-RPC error of a tool that does not exist.
func (p *Proxy) toolAnswer(out gate.Outcome, name string) (res *mcp.CallToolResult, raw json.RawMessage, err error) {
	if !out.Visible {
		return nil, nil, unknownTool(name)
	}
	m, _ := p.lookup(name)
	d := out.Decision
	switch d.Verdict {
	case toolgate.Deny:
		return refusal(d, out.ApprovalID, "", m.typed), nil, nil
	case toolgate.RequireApproval:
		msg := fmt.Sprintf("This call needs approval before it can run: %s", d.Reason)
		if out.ApprovalID != "" {
			msg = fmt.Sprintf("Approval %s is required before %s can run (%s). An approver with approval:decide approves it (toolgate approvals approve %s --as PRINCIPAL, or POST /v1/approvals/%s/approve); then repeat exactly the same call and it runs once.",
				out.ApprovalID, name, d.Reason, out.ApprovalID, out.ApprovalID)
		}
		return refusal(d, out.ApprovalID, msg, m.typed), nil, nil
	}
	cr := out.Result
	if err := cr.Err; err != nil && m.builtin == "" {
		var rpcErr *jsonrpc.Error
		if errors.As(err, &rpcErr) {
			return nil, nil, rpcErr
		}
		return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{
			Text: fmt.Sprintf("The tool %s could not be run: upstream %s failed: %v. The call was authorized and recorded; try again later.", name, m.upstream, err)}},
			Meta: mcp.Meta{DecisionMetaKey: map[string]any{"code": "upstream_unavailable", "layer": "adapter", "upstream": m.upstream}}}, nil, nil
	}
	return cr.Tool, cr.Raw, nil
}

// DecisionMetaKey is the _meta key under which a refused call's result
// carries the decision (verdict, code, layer, reason, tool_id, approval_id).
const DecisionMetaKey = "io.toolgate/decision"

// refusal is the isError result of a visible tool refused by a decision:
// text the model can act on, the decision in _meta, and in
// structuredContent too unless the tool declares an outputSchema.
func refusal(d toolgate.Decision, approvalID, msg string, typed bool) *mcp.CallToolResult {
	if msg == "" {
		msg = fmt.Sprintf("The call was refused by the %s layer (%s): %s", d.Layer, d.Code, d.Reason)
	}
	sc := map[string]any{"verdict": d.Verdict.String(), "code": string(d.Code), "layer": string(d.Layer), "reason": d.Reason, "tool_id": d.ToolID}
	if approvalID != "" {
		sc["approval_id"] = approvalID
	}
	res := &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: msg}}, Meta: mcp.Meta{DecisionMetaKey: sc}}
	if !typed {
		res.StructuredContent = sc
	}
	return res
}

// withoutOwnMeta is a client's _meta without the gateway's own namespace
// (io.toolgate/...): what an upstream finds there comes from the gateway,
// never from a client posing as it.
func withoutOwnMeta(meta mcp.Meta) mcp.Meta { return mcptool.WithoutOwnMeta(meta) }

// SetTools mirrors an upstream's announced tools into the gateway's MCP
// server (sending tools/list_changed to connected clients) under the names
// the model sees. tools are the upstream's own definitions; accepted are
// those Announced accepted. A name already mirrored for a built-in tool or
// another upstream is never taken over: the tool is skipped, logged with
// both owners, and the existing mirror stays.
func (p *Proxy) SetTools(upstreamName, prefix string, tools []*mcp.Tool, accepted []mcptool.AnnouncedTool) {
	keep := map[string]mcptool.AnnouncedTool{}
	for _, a := range accepted {
		keep[a.Name] = a
	}
	p.mu.Lock()
	var remove []string
	for name, m := range p.mirrors {
		if m.upstream == upstreamName {
			if _, still := keep[name]; !still {
				remove = append(remove, name)
				delete(p.mirrors, name)
			}
		}
	}
	p.mu.Unlock()
	if len(remove) > 0 {
		p.server.RemoveTools(remove...)
	}
	for _, t := range tools {
		name := prefix + t.Name
		a, ok := keep[name]
		if !ok {
			continue
		}
		mt := &mcp.Tool{Name: name, Title: t.Title, Description: t.Description, InputSchema: t.InputSchema,
			OutputSchema: t.OutputSchema, Annotations: t.Annotations}
		if mt.InputSchema == nil {
			mt.InputSchema = map[string]any{"type": "object"}
		}
		m := mirror{def: mt, upstream: upstreamName, name: t.Name, id: a.ID, typed: t.OutputSchema != nil}
		p.mu.Lock()
		if prev, taken := p.mirrors[name]; taken && (prev.builtin != "" || prev.upstream != upstreamName) {
			p.mu.Unlock()
			p.log.Warn("upstream tool skipped: its name is another tool's; that tool keeps it",
				"name", name, "upstream", upstreamName, "tool", a.ID, "owner", prev.owner(), "owner_tool", prev.id)
			continue
		}
		p.mirrors[name] = m // claimed before it is registered: SetBuiltins sees it
		p.mu.Unlock()
		if err := p.addTool(mt); err != nil {
			p.log.Warn("upstream tool refused", "upstream", upstreamName, "tool", t.Name, "err", err)
			p.mu.Lock()
			cur, ok := p.mirrors[name]
			mine := ok && cur.upstream == upstreamName && cur.builtin == ""
			if mine {
				delete(p.mirrors, name)
			}
			p.mu.Unlock()
			if mine {
				p.server.RemoveTools(name) // an earlier definition of it, if any
			}
			continue
		}
	}
	p.lists.changed()
	// Refresh the upstream's mirrored resources and prompts (passthrough.go).
	p.relay.upstreamChanged(upstreamName, prefix)
}

// addTool registers a tool, turning the SDK's panic on a bad schema into
// an error.
func (p *Proxy) addTool(t *mcp.Tool) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("invalid tool definition: %v", r)
		}
	}()
	// The handler is never reached: the middleware answers every call.
	p.server.AddTool(t, func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "toolgate: call reached an unguarded handler (refused)"}
	})
	return nil
}

// SetBuiltins mirrors the catalog's built-in tools (Tool documents whose
// source is builtin) into the MCP server, so the model sees them like any
// other tool, under the underscore spelling of their id
// (toolid.FunctionName: sql.query is sql_query, fs.read is fs_read), the
// one spelling every model API accepts as a function name. Their calls run
// through gate.Call: inspected, decided, run and recorded. Call it after
// each compilation; built-in tools that left the catalog are removed. A
// name an upstream tool already uses is refused and logged.
func (p *Proxy) SetBuiltins(tools gate.Builtins) {
	want := map[string]mirror{}
	defs := map[string]*mcp.Tool{}
	for _, t := range p.g.Snapshot().Tools() {
		if t.Builtin == "" || tools == nil {
			continue
		}
		bt, ok := tools.Lookup(t.Builtin)
		if !ok {
			p.log.Warn("built-in tool not configured; it is not offered", "tool", t.ID, "builtin", t.Builtin)
			continue
		}
		spec := bt.Spec()
		schema := map[string]any{}
		if err := json.Unmarshal(spec.InputSchema, &schema); err != nil || schema["type"] != "object" {
			schema = map[string]any{"type": "object"}
		}
		desc := t.Description
		if desc == "" {
			desc = spec.Description
		}
		name := toolid.FunctionName(t.ID)
		defs[name] = &mcp.Tool{Name: name, Description: desc, InputSchema: schema,
			Annotations: &mcp.ToolAnnotations{ReadOnlyHint: t.SideEffectClass <= toolgate.SideEffectRead}}
		want[name] = mirror{def: defs[name], id: t.ID, name: t.Builtin, builtin: t.Builtin}
	}
	p.mu.Lock()
	var remove []string
	for name, m := range p.mirrors {
		if _, keep := want[name]; m.builtin != "" && !keep {
			remove = append(remove, name)
			delete(p.mirrors, name)
		}
	}
	snap := p.g.Snapshot()
	for name, m := range want {
		prev, taken := p.mirrors[name]
		if taken && prev.builtin == "" {
			// An upstream's mirror the catalog still holds keeps its name;
			// one the catalog refused (authz.CheckAnnounced: its name
			// spells this built-in's id) gives way.
			if t, ok := snap.Tool(prev.id); ok && t.MCPServer == prev.upstream && t.Builtin == "" {
				p.log.Warn("built-in tool name is taken by an upstream tool; the built-in tool is not offered",
					"name", name, "tool", m.id, "owner", prev.owner(), "owner_tool", prev.id)
				delete(want, name)
				continue
			}
			p.log.Warn("upstream tool's mirror replaced by the built-in tool whose name it took (the catalog refused the upstream's tool)",
				"name", name, "tool", m.id, "upstream", prev.upstream, "upstream_tool", prev.id)
		}
		p.mirrors[name] = m // claimed before it is registered: SetTools sees it
	}
	p.mu.Unlock()
	if len(remove) > 0 {
		p.server.RemoveTools(remove...)
	}
	for name := range want {
		if err := p.addTool(defs[name]); err != nil {
			p.log.Warn("built-in tool refused", "tool", name, "err", err)
			p.mu.Lock()
			cur, ok := p.mirrors[name]
			mine := ok && cur.builtin != ""
			if mine {
				delete(p.mirrors, name)
			}
			p.mu.Unlock()
			if mine {
				p.server.RemoveTools(name) // what it replaced, if anything
			}
		}
	}
	p.lists.changed()
}

// owner names who a mirror belongs to, for logs: "builtin fs.read" or
// "upstream docs".
func (m mirror) owner() string {
	if m.builtin != "" {
		return "builtin " + m.builtin
	}
	return "upstream " + m.upstream
}
