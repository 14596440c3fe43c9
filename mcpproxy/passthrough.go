package mcpproxy

// Pass-through: everything but tools (docs/design.md, "The pipeline").
// Resources, prompts, completions, logging, progress, cancellation,
// sampling, elicitation and roots pass between the gateway's clients and
// its upstreams, so the gateway stays a conforming MCP server. Tools never
// take this path: tools/list and tools/call stay in the middleware of
// proxy.go and go through gate.Handle.
//
// How each part travels:
//
//   - Resources, resource templates and prompts are mirrored: the gateway
//     keeps their definitions (the lists it answers itself, filtered by the
//     access decision at tool level and paged: lists.go) and registers them
//     with its mcp.Server only so that the SDK sends list_changed to the
//     gateway's clients; the SDK's handlers for them are never reached and
//     refuse if they are. The mirror is rebuilt when an upstream's tools are
//     (re)listed, when it sends resources/list_changed or
//     prompts/list_changed, and when a forwarded request finds that its
//     session was replaced (a restart). A resource URI or template belongs
//     to the first upstream that announced it (a clash is logged and the
//     later one skipped); prompts get the upstream's tool_prefix, like its
//     tools.
//   - resources/read, resources/subscribe, prompts/get and
//     completion/complete are accesses: gate.HandleAccess routes each once
//     through this mirror (gating.go: an exact URI, else the matching
//     template with the longest literal prefix, ties owned by none, else
//     the sole upstream with resources), decides it for that owner, records
//     it, and forwards it here to exactly that owner, never where the SDK's
//     own matching would send it. The owner of a URI is subscribed once
//     however many clients subscribe, and unsubscribed when the last one
//     leaves; the subscriptions of a session, of an authority and of all
//     clients are capped (subscriptions.go). An upstream's
//     notifications/resources/updated reaches only the clients subscribed
//     to that URI.
//   - logging/setLevel is answered by the SDK for the calling session. On
//     each upstream that declares logging the gateway sets the most verbose
//     level asked for by the connected clients that may reach that
//     upstream (one of its tools is disclosed to them): an upstream a
//     client may not see never hears of that client's level. Each client
//     still gets only the messages at or above its own level, so one
//     client's debug level shows another nothing it did not ask for.
//   - ping is answered by the gateway itself; notifications/cancelled
//     cancels the handler's context, and the SDK client then sends
//     notifications/cancelled to the upstream for the forwarded request.
//
// Upstream-to-client traffic is attributed to a client session by tracking
// the requests each session has in flight on each upstream session:
//
//   - notifications/progress: the client's progressToken is forwarded as is
//     unless another request in flight on that upstream already uses it, in
//     which case a gateway token replaces it. Progress goes back, with the
//     client's own token, to the calling session only.
//   - sampling/createMessage, elicitation/create and roots/list that an
//     upstream sends while serving requests of exactly one client session go
//     to that session (on the stream of its request). When requests of
//     several sessions are in flight on that upstream the request cannot be
//     attributed and is refused, never sent to a client that may not own
//     it. A session that did not declare sampling, elicitation (of that
//     mode) or roots is never asked: the upstream gets an error. roots/list
//     outside any request (server-filesystem asks after initialize) is
//     answered with an empty list, which keeps such a server's own
//     configuration.
//   - notifications/message: to the session with requests in flight on
//     that upstream or, with none in flight, the one whose request there
//     finished last (within doneLinger); dropped when another client's
//     request overlaps, so that a message is never taken for another
//     client's (logTarget); to every session that set a level and may
//     reach that upstream, each filtering by its own level, when no client
//     has used that upstream within doneLinger.
//   - notifications/elicitation/complete: to the session that received the
//     URL elicitation with that id.
//
// Relayed notifications are queued per client session and sent in order by
// a goroutine (post), so a slow client cannot stall the upstream session
// that all clients share.
//
// Because the gateway's upstream sessions are shared by all its clients and
// exist before any client connects, the gateway declares sampling (with
// tools), elicitation (form and url) and roots to every upstream
// (RelayUpstream), and checks each client's own capabilities per request.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/yosida95/uritemplate/v3"

	"github.com/toolgate/toolgate"
	"github.com/toolgate/toolgate/adapter/mcptool"
	"github.com/toolgate/toolgate/gate"
)

const (
	// passTimeout bounds one forwarded request that is not a tools/call
	// (those use the upstream's call_timeout) and one mirror refresh.
	passTimeout = mcptool.DefaultCallTimeout
	// notifyTimeout bounds sending one relayed notification.
	notifyTimeout = 5 * time.Second
	// outboxLimit bounds the notifications waiting for one client session.
	outboxLimit = 1000
	// logSettle bounds how late the upstream's SDK client may handle a log
	// message relative to the result that followed it (relayed
	// notifications are queued, never sent, on the client's handler
	// goroutine, so it stays short); see logTarget.
	logSettle = 10 * time.Millisecond
	// doneLinger is how long after its last request there finished a
	// session can still be the one an upstream's log message is for; only
	// with no such session is a message taken to be about the server.
	doneLinger = 2 * time.Second
	// gatewayTokenPrefix starts the progress tokens the gateway substitutes
	// for a client's token that another request already uses.
	gatewayTokenPrefix = "toolgate-progress-"
)

// RelayUpstream installs in o the handlers that carry upstream-to-client
// traffic (sampling, elicitation, roots, progress, logging, resource and
// prompt notifications) to the proxy that proxy returns, and the client
// capabilities that let upstreams use them: sampling with tools,
// elicitation in form and url mode, roots (without listChanged). proxy is
// called for each message; while it returns nil (before the proxy exists)
// upstream requests are refused and notifications dropped. Handlers already
// set in o are replaced; o.ClientCapabilities is kept if set. The gateway's
// wiring puts o into the upstream Options (mcptool.ClientHandlers.Install).
func RelayUpstream(o *mcptool.ClientHandlers, proxy func() *Proxy) {
	get := func() *relay {
		if p := proxy(); p != nil {
			return p.relay
		}
		return nil
	}
	notReady := func(method string) error {
		return &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "toolgate: " + method + " refused: the gateway is not serving yet"}
	}
	if o.ClientCapabilities == nil {
		o.ClientCapabilities = &mcp.ClientCapabilities{
			Elicitation: &mcp.ElicitationCapabilities{Form: &mcp.FormElicitationCapabilities{}, URL: &mcp.URLElicitationCapabilities{}},
		}
	}
	o.CreateMessage = func(ctx context.Context, name string, req *mcp.CreateMessageWithToolsRequest) (*mcp.CreateMessageWithToolsResult, error) {
		if r := get(); r != nil {
			return r.createMessage(ctx, name, req)
		}
		return nil, notReady("sampling/createMessage")
	}
	o.Elicit = func(ctx context.Context, name string, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
		if r := get(); r != nil {
			return r.elicit(ctx, name, req)
		}
		return nil, notReady("elicitation/create")
	}
	o.ListRoots = func(ctx context.Context, name string, req *mcp.ListRootsRequest) (*mcp.ListRootsResult, error) {
		if r := get(); r != nil {
			return r.listRoots(ctx, name, req)
		}
		return &mcp.ListRootsResult{Roots: []*mcp.Root{}}, nil
	}
	o.Progress = func(ctx context.Context, name string, req *mcp.ProgressNotificationClientRequest) {
		if r := get(); r != nil {
			r.progress(name, req)
		}
	}
	o.LoggingMessage = func(ctx context.Context, name string, req *mcp.LoggingMessageRequest) {
		if r := get(); r != nil {
			r.logMessage(name, req)
		}
	}
	o.ResourceUpdated = func(ctx context.Context, name string, req *mcp.ResourceUpdatedNotificationRequest) {
		if r := get(); r != nil {
			r.resourceUpdated(name, req)
		}
	}
	o.ResourceListChanged = func(ctx context.Context, name string, req *mcp.ResourceListChangedRequest) {
		if r := get(); r != nil {
			r.resync(name)
		}
	}
	o.PromptListChanged = func(ctx context.Context, name string, req *mcp.PromptListChangedRequest) {
		if r := get(); r != nil {
			r.resync(name)
		}
	}
	o.ElicitationComplete = func(ctx context.Context, name string, req *mcp.ElicitationCompleteNotificationRequest) {
		if r := get(); r != nil {
			r.elicitationComplete(name, req)
		}
	}
}

// relay is the pass-through state of one Proxy.
type relay struct {
	p *Proxy

	mu        sync.Mutex
	seq       uint64
	calls     []*inflight              // in flight, and finished within doneLinger
	ups       map[string]*upState      // by upstream name
	resOwner  map[string]string        // resource URI → upstream
	tmplOwner map[string]string        // URI template → upstream
	prompts   map[string]promptRef     // name the client sees → owner
	subs      map[string]*subscription // resource URI → who subscribed
	levels    map[*mcp.ServerSession]levelRequest
	// The mirrored definitions (what the lists show), by the keys of
	// resOwner, tmplOwner and prompts, and each template's matcher.
	resDef       map[string]*mcp.Resource
	tmplDef      map[string]*mcp.ResourceTemplate
	tmplCompiled map[string]*uritemplate.Template
	promptDef    map[string]*mcp.Prompt
	elicits      map[string]*mcp.ServerSession // URL elicitation id → session asked
	outboxes     map[*mcp.ServerSession]*outbox
	// counts counts the members of subs for the subscription caps
	// (subscriptions.go).
	counts subCounts
	// sdk is the SDK's own method handler (captureSDK), set once at New.
	sdk mcp.MethodHandler
}

// upState is what the relay knows of one upstream.
type upState struct {
	known  bool   // SetTools has named it (prefix is valid)
	prefix string // tool_prefix, also used for its prompts
	// synced is the session the mirror was last built from; a different
	// live session means the upstream restarted.
	synced         *mcp.ClientSession
	syncing, again bool
	caps           mcp.ServerCapabilities
	level          mcp.LoggingLevel  // last set on synced
	resources      map[string]string // URI → JSON of the mirrored definition
	templates      map[string]string // URI template → JSON
	prompts        map[string]string // name the client sees → JSON
}

type promptRef struct{ upstream, name string }

// levelRequest is the logging level a client session asked for, and who
// asked (the upstreams it may reach get it: setLevel).
type levelRequest struct {
	level mcp.LoggingLevel
	id    gate.Identity
}

// ownedResource, ownedTemplate and ownedPrompt are mirrored definitions
// with the upstream that owns them (for the lists: lists.go).
type (
	ownedResource struct {
		def   *mcp.Resource
		owner string
	}
	ownedTemplate struct {
		def   *mcp.ResourceTemplate
		owner string
	}
	ownedPrompt struct {
		def   *mcp.Prompt
		owner string
		name  string // the upstream's own name
	}
)

func (r *relay) resourceList() []ownedResource {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]ownedResource, 0, len(r.resDef))
	for k, d := range r.resDef {
		out = append(out, ownedResource{d, r.resOwner[k]})
	}
	return out
}

func (r *relay) templateList() []ownedTemplate {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]ownedTemplate, 0, len(r.tmplDef))
	for k, d := range r.tmplDef {
		out = append(out, ownedTemplate{d, r.tmplOwner[k]})
	}
	return out
}

func (r *relay) promptList() []ownedPrompt {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]ownedPrompt, 0, len(r.promptDef))
	for k, d := range r.promptDef {
		out = append(out, ownedPrompt{d, r.prompts[k].upstream, r.prompts[k].name})
	}
	return out
}

// templateOwner returns the upstream that listed exactly this template.
func (r *relay) templateOwner(tmpl string) (string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	up, ok := r.tmplOwner[tmpl]
	return up, ok
}

type subscription struct {
	upstream string
	sessions map[*mcp.ServerSession]bool
}

// inflight is one request a client session has in flight on an upstream.
type inflight struct {
	upstream string
	cs       *mcp.ClientSession // the upstream session it was sent on
	ss       *mcp.ServerSession // the client session that sent it
	ctx      context.Context    // its handler context: routes to its stream
	token    string             // key of the progress token sent upstream; "" if none
	client   any                // the client's own progress token
	start    time.Time
	done     time.Time     // zero while in flight; read under relay.mu
	ended    chan struct{} // closed with done set
	// to reaches the client that made the request (callers.go).
	to caller
	// asked counts the upstream's requests relayed to the client during
	// this request (mcptool.ErrClientAsked); shared by the attempts of one
	// tools/call.
	asked *atomic.Int32
}

// live reports whether the request is still in flight (its stream open).
func (c *inflight) live() bool {
	select {
	case <-c.ended:
		return false
	default:
		return true
	}
}

func newRelay(p *Proxy) *relay {
	return &relay{p: p, ups: map[string]*upState{}, resOwner: map[string]string{}, tmplOwner: map[string]string{},
		prompts: map[string]promptRef{}, subs: map[string]*subscription{}, levels: map[*mcp.ServerSession]levelRequest{},
		elicits: map[string]*mcp.ServerSession{}, outboxes: map[*mcp.ServerSession]*outbox{},
		resDef: map[string]*mcp.Resource{}, tmplDef: map[string]*mcp.ResourceTemplate{},
		tmplCompiled: map[string]*uritemplate.Template{}, promptDef: map[string]*mcp.Prompt{}}
}

// configure adds the pass-through capabilities and handlers to the
// gateway's server options.
func (r *relay) configure(o *mcp.ServerOptions) {
	if o.Capabilities == nil {
		o.Capabilities = &mcp.ServerCapabilities{}
	}
	o.Capabilities.Resources = &mcp.ResourceCapabilities{ListChanged: true, Subscribe: true}
	o.Capabilities.Prompts = &mcp.PromptCapabilities{ListChanged: true}
	o.Capabilities.Completions = &mcp.CompletionCapabilities{}
	o.Capabilities.Logging = &mcp.LoggingCapabilities{}
	// completion/complete never reaches the SDK (passThrough answers it);
	// the handler declares the capability and refuses if ever reached.
	o.CompletionHandler = func(context.Context, *mcp.CompleteRequest) (*mcp.CompleteResult, error) {
		return nil, unguarded("completion/complete")
	}
	o.SubscribeHandler = r.subscribe
	o.UnsubscribeHandler = r.unsubscribe
}

// unguarded is the error of an SDK handler the middleware should have
// answered before it (fail closed).
func unguarded(method string) error {
	return &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "toolgate: " + method + " reached an unguarded handler (refused)"}
}

func (r *relay) upLocked(name string) *upState {
	st := r.ups[name]
	if st == nil {
		st = &upState{resources: map[string]string{}, templates: map[string]string{}, prompts: map[string]string{}}
		r.ups[name] = st
	}
	return st
}

// upstreamChanged is called when an upstream's tools were (re)listed: it
// records the upstream's prefix and refreshes its mirror.
func (r *relay) upstreamChanged(name, prefix string) {
	r.mu.Lock()
	st := r.upLocked(name)
	st.known, st.prefix = true, prefix
	r.mu.Unlock()
	r.resync(name)
}

// handleSetLevel answers logging/setLevel for the calling session (the
// SDK keeps its level) and passes the level on to the upstreams the
// caller id may reach (setLevel).
func (r *relay) handleSetLevel(ctx context.Context, id gate.Identity, method string, q *mcp.ServerRequest[*mcp.SetLoggingLevelParams], next mcp.MethodHandler) (mcp.Result, error) {
	res, err := next(ctx, method, q)
	m := gate.Message{Identity: withSession(id, sessionID(q)), Type: toolgate.EventLoggingLevelSet, Method: method, Verdict: toolgate.Allow, Via: "mcp"}
	if err == nil && q.Params != nil {
		r.setLevel(ctx, q.Session, id, q.Params.Level)
		// The upstreams that may hear of this level: those the caller
		// reaches (the most verbose level of their callers is set there).
		m.Details = map[string]any{"level": string(q.Params.Level), "upstreams": slices.Sorted(maps.Keys(r.p.reachable(id)))}
	} else {
		m.Verdict, m.Code = toolgate.Deny, toolgate.CodeMalformedCall
		m.Reason = "logging/setLevel refused: " + fmt.Sprint(err)
	}
	r.p.g.RecordMessage(ctx, m)
	return res, err
}

// --- request tracking ---------------------------------------------------

// call is a request being forwarded to an upstream.
type call struct {
	cs   *mcp.ClientSession
	meta mcp.Meta // the meta to send (progress token possibly replaced)
	rec  *inflight
	r    *relay
}

// end marks the request finished.
func (c *call) end() {
	c.r.mu.Lock()
	c.rec.done = time.Now()
	close(c.rec.ended)
	c.r.mu.Unlock()
}

// begin registers a request of client session ss (nil for none) about to be
// forwarded to upstream name with meta, and returns the upstream session to
// use; what the upstream sends about it reaches the client through to (nil:
// the session's SDK side), and asked counts its requests to the client (nil:
// a counter of its own). Call end when the answer is in. It fails when the
// upstream is down.
func (r *relay) begin(ctx context.Context, name string, ss *mcp.ServerSession, meta mcp.Meta, to caller, asked *atomic.Int32) (*call, error) {
	if r.p.ups == nil {
		return nil, errors.New("no upstreams are configured")
	}
	cs, err := r.p.ups.Session(name)
	if err != nil {
		return nil, err
	}
	// The gateway's own _meta namespace never comes from a client (every
	// request forwarded, not only tools/call).
	if to == nil && ss != nil {
		to = sdkCaller{ss}
	}
	if asked == nil {
		asked = new(atomic.Int32)
	}
	c := r.track(ctx, name, cs, ss, withoutOwnMeta(meta))
	c.rec.to, c.rec.asked = to, asked
	r.mu.Lock()
	st := r.upLocked(name)
	stale := st.known && st.synced != cs
	r.mu.Unlock()
	if stale {
		r.resync(name) // the upstream restarted since its mirror was built
	}
	return c, nil
}

// track registers the request, replacing its progress token when another
// request in flight on the upstream uses the same one.
func (r *relay) track(ctx context.Context, name string, cs *mcp.ClientSession, ss *mcp.ServerSession, meta mcp.Meta) *call {
	rec := &inflight{upstream: name, cs: cs, ss: ss, ctx: ctx, start: time.Now(), ended: make(chan struct{})}
	c := &call{cs: cs, meta: meta, rec: rec, r: r}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.pruneLocked(time.Now())
	if tok, ok := meta["progressToken"]; ok && tok != nil {
		key := tokenKey(tok)
		replaced := false
		for r.tokenUsedLocked(name, key) {
			r.seq++
			tok = gatewayTokenPrefix + strconv.FormatUint(r.seq, 10)
			key, replaced = tokenKey(tok), true
		}
		rec.token, rec.client = key, meta["progressToken"]
		if replaced {
			c.meta = maps.Clone(meta)
			c.meta["progressToken"] = tok
		}
	}
	r.calls = append(r.calls, rec)
	return c
}

// tokenKey is a comparable form of a progress token (a string or a number).
func tokenKey(tok any) string {
	b, err := json.Marshal(tok)
	if err != nil {
		return fmt.Sprintf("%T:%v", tok, tok)
	}
	return string(b)
}

func (r *relay) tokenUsedLocked(name, key string) bool {
	for _, c := range r.calls {
		if c.upstream == name && c.token == key {
			return true
		}
	}
	return false
}

// pruneLocked drops requests that finished more than doneLinger ago.
func (r *relay) pruneLocked(now time.Time) {
	r.calls = slices.DeleteFunc(r.calls, func(c *inflight) bool {
		return !c.done.IsZero() && now.Sub(c.done) > doneLinger
	})
}

// attribute finds the client session upstream name's session cs is serving
// when it sends a request: the one session with requests in flight there.
// It returns that session's latest request, and how many sessions have
// requests in flight (the request is nil unless that is 1).
func (r *relay) attribute(name string, cs *mcp.ClientSession) (rec *inflight, sessions int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.pruneLocked(time.Now())
	seen := map[*mcp.ServerSession]bool{}
	for _, c := range r.calls {
		if c.upstream == name && c.cs == cs && c.ss != nil && c.done.IsZero() {
			seen[c.ss] = true
			rec = c
		}
	}
	if len(seen) != 1 {
		return nil, len(seen)
	}
	return rec, 1
}

// logTarget finds the client session a log message from upstream name's
// session cs is for. Log messages carry no request id, and the SDK client
// may hand the gateway a call's result before it has handled a message sent
// just before that result, so:
//
//   - with requests of one session in flight, that session, unless another
//     connected session's request there finished after logSettle before the
//     first of them started (its late message could be this one);
//   - with none in flight, the connected session whose request there
//     finished last within doneLinger, unless another one's finished within
//     logSettle of it;
//   - with neither, every session that asked for log messages and may
//     reach the upstream (server is true): a message about the server
//     itself, which each session filters by its own level.
//
// In every other case it returns nothing and the message is dropped.
func (r *relay) logTarget(name string, cs *mcp.ClientSession) (rec *inflight, server bool) {
	live := map[*mcp.ServerSession]bool{}
	for ss := range r.p.server.Sessions() {
		live[ss] = true
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.pruneLocked(time.Now())
	var mine []*inflight
	for _, c := range r.calls {
		if c.upstream == name && c.cs == cs && c.ss != nil && (c.done.IsZero() || live[c.ss]) {
			mine = append(mine, c)
		}
	}
	// others reports whether a session other than ss has a request that
	// finished after t.
	others := func(ss *mcp.ServerSession, t time.Time) bool {
		for _, c := range mine {
			if c.ss != ss && !c.done.IsZero() && c.done.After(t) {
				return true
			}
		}
		return false
	}
	var first time.Time
	sessions := map[*mcp.ServerSession]bool{}
	for _, c := range mine {
		if c.done.IsZero() {
			sessions[c.ss] = true
			if first.IsZero() || c.start.Before(first) {
				first = c.start
			}
			rec = c
		}
	}
	switch {
	case len(sessions) > 1:
		return nil, false
	case len(sessions) == 1:
		if others(rec.ss, first.Add(-logSettle)) {
			return nil, false
		}
		return rec, false
	}
	for _, c := range mine {
		if rec == nil || c.done.After(rec.done) {
			rec = c
		}
	}
	if rec == nil {
		return nil, true
	}
	if others(rec.ss, rec.done.Add(-logSettle)) {
		return nil, false
	}
	return rec, false
}

// requester returns the request an upstream's request (method) belongs to,
// or a JSON-RPC error saying why there is none.
func (r *relay) requester(name string, cs *mcp.ClientSession, method string) (*inflight, error) {
	rec, n := r.attribute(name, cs)
	switch {
	case rec != nil:
		return rec, nil
	case n == 0:
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidRequest,
			Message: fmt.Sprintf("toolgate: %s refused: the gateway relays it only while it serves a request of one client, and no request to upstream %s is in flight", method, name)}
	default:
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidRequest,
			Message: fmt.Sprintf("toolgate: %s refused: requests of %d clients are in flight on upstream %s, so the gateway cannot tell which client it is for", method, n, name)}
	}
}

// relayCtx is a context that routes to rec's stream and ends when either
// rec's request or the upstream's request (upCtx) ends.
func relayCtx(rec *inflight, upCtx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(rec.ctx)
	stop := context.AfterFunc(upCtx, cancel)
	return ctx, func() { stop(); cancel() }
}

func missingCapability(method, what string) error {
	// Not -32601: the SDK replaces that code's message with its own.
	return &jsonrpc.Error{Code: jsonrpc.CodeInvalidRequest,
		Message: fmt.Sprintf("toolgate: %s refused: the client this request is for did not declare %s", method, what)}
}

func clientCaps(ss *mcp.ServerSession) *mcp.ClientCapabilities {
	if ip := ss.InitializeParams(); ip != nil && ip.Capabilities != nil {
		return ip.Capabilities
	}
	return &mcp.ClientCapabilities{}
}

// --- upstream-to-client requests ------------------------------------------

// ask relays an upstream's request to the client of rec (the one request
// it is about), after the checks every relayed request gets, whichever way
// the upstream sent it: the client must have declared the capability (of
// that mode), or the upstream gets an error and the client is not asked.
func (r *relay) ask(ctx context.Context, rec *inflight, method string, params any) (json.RawMessage, error) {
	if err := r.checkAsk(rec, method, params); err != nil {
		r.recordAsk(rec, rec.upstream, method, err)
		return nil, err
	}
	r.recordAsk(rec, rec.upstream, method, nil)
	cctx, cancel := relayCtx(rec, ctx)
	defer cancel()
	rec.asked.Add(1)
	res, err := rec.to.ask(cctx, method, params)
	return res, clientError(method, err)
}

// recordAsk records an upstream's request to a client (gate.RecordMessage):
// relayed (refused nil) or refused, under the correlation id of the call
// or access it came during (rec; nil when it could not be attributed).
func (r *relay) recordAsk(rec *inflight, upstream, method string, refused error) {
	m := gate.Message{Type: toolgate.EventUpstreamRequest, Method: method, Verdict: toolgate.Allow, Upstream: upstream, Via: "mcp"}
	if rec != nil {
		if id, corr, ok := gate.CallOf(rec.ctx); ok {
			m.Identity, m.CorrelationID = id, corr
		}
	}
	if refused != nil {
		m.Verdict, m.Code, m.Reason = toolgate.Deny, "upstream_request_refused", refused.Error()
		var rpcErr *jsonrpc.Error
		if errors.As(refused, &rpcErr) {
			m.Reason = rpcErr.Message
		}
	}
	r.p.g.RecordMessage(context.Background(), m)
}

// checkAsk is why an upstream's request may not be relayed to the client
// of rec, or nil: the client must have declared the capability (of that
// mode), and the method must be one relayed to clients.
func (r *relay) checkAsk(rec *inflight, method string, params any) error {
	caps := clientCaps(rec.ss)
	switch method {
	case "sampling/createMessage":
		p, _ := params.(*mcp.CreateMessageWithToolsParams)
		if caps.Sampling == nil {
			return missingCapability(method, "sampling")
		}
		if p != nil && len(p.Tools) > 0 && caps.Sampling.Tools == nil {
			return missingCapability(method, "sampling with tools")
		}
	case "elicitation/create":
		p, _ := params.(*mcp.ElicitParams)
		if caps.Elicitation == nil {
			return missingCapability(method, "elicitation")
		}
		url := p != nil && (p.Mode == "url" || (p.Mode == "" && p.URL != ""))
		if url && caps.Elicitation.URL == nil {
			return missingCapability(method, "url elicitation")
		}
		if url && p.ElicitationID != "" {
			r.mu.Lock()
			r.elicits[p.ElicitationID] = rec.ss
			r.mu.Unlock()
		}
	case "roots/list":
		if caps.RootsV2 == nil {
			return missingCapability(method, "roots")
		}
	default:
		return &jsonrpc.Error{Code: jsonrpc.CodeMethodNotFound, Message: fmt.Sprintf("toolgate: %s is not relayed to clients", method)}
	}
	if rec.to == nil {
		return &jsonrpc.Error{Code: jsonrpc.CodeInvalidRequest, Message: fmt.Sprintf("toolgate: %s refused: the request it is about cannot reach its client", method)}
	}
	return nil
}

// askAs relays an upstream's request sent on the shared session (an SDK
// client handler) to the request it is attributed to, decoding the
// client's answer into res.
func askAs[R any](r *relay, ctx context.Context, name string, cs *mcp.ClientSession, method string, params any) (*R, error) {
	rec, err := r.requester(name, cs, method)
	if err != nil {
		r.recordAsk(nil, name, method, err)
		return nil, err
	}
	raw, err := r.ask(ctx, rec, method, params)
	if err != nil {
		return nil, err
	}
	res := new(R)
	if err := json.Unmarshal(raw, res); err != nil {
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: fmt.Sprintf("toolgate: %s: the client's answer is malformed: %v", method, err)}
	}
	return res, nil
}

func (r *relay) createMessage(ctx context.Context, name string, req *mcp.CreateMessageWithToolsRequest) (*mcp.CreateMessageWithToolsResult, error) {
	return askAs[mcp.CreateMessageWithToolsResult](r, ctx, name, req.Session, "sampling/createMessage", req.Params)
}

func (r *relay) elicit(ctx context.Context, name string, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
	return askAs[mcp.ElicitResult](r, ctx, name, req.Session, "elicitation/create", req.Params)
}

func (r *relay) listRoots(ctx context.Context, name string, req *mcp.ListRootsRequest) (*mcp.ListRootsResult, error) {
	if _, n := r.attribute(name, req.Session); n == 0 {
		// Outside any request (server-filesystem asks after initialize):
		// an empty list, which keeps such a server's own configuration.
		return &mcp.ListRootsResult{Roots: []*mcp.Root{}}, nil
	}
	params := req.Params
	if params == nil {
		params = &mcp.ListRootsParams{}
	}
	return askAs[mcp.ListRootsResult](r, ctx, name, req.Session, "roots/list", params)
}

// notifyCaller sends a notification to the client of rec, in order with
// the others queued for its session (post); a log message whose request
// has finished goes to the session's standalone stream instead.
func (r *relay) notifyCaller(rec *inflight, method string, params any) {
	r.post(rec.ss, func() {
		if rec.live() && rec.to != nil {
			ctx, cancel := context.WithTimeout(rec.ctx, notifyTimeout)
			err := rec.to.notify(ctx, method, params)
			cancel()
			if err == nil {
				return
			}
			r.p.log.Debug("notification not delivered on the request's stream", "method", method, "err", err)
		}
		if lp, ok := params.(*mcp.LoggingMessageParams); ok && rec.ss != nil {
			ctx, cancel := context.WithTimeout(context.Background(), notifyTimeout)
			defer cancel()
			rec.ss.Log(ctx, lp)
		}
	})
}

// clientError passes a client's JSON-RPC error back to the upstream as is;
// other failures become an internal error.
func clientError(method string, err error) error {
	if err == nil {
		return nil
	}
	var rpcErr *jsonrpc.Error
	if errors.As(err, &rpcErr) {
		return rpcErr
	}
	return &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: fmt.Sprintf("toolgate: %s: the client did not answer: %v", method, err)}
}

// --- upstream-to-client notifications ---------------------------------------

func (r *relay) progress(name string, req *mcp.ProgressNotificationClientRequest) {
	if req.Params == nil {
		return
	}
	key := tokenKey(req.Params.ProgressToken)
	r.mu.Lock()
	var rec *inflight
	for _, c := range r.calls {
		if c.upstream == name && c.cs == req.Session && c.token == key && c.done.IsZero() && c.ss != nil {
			rec = c
		}
	}
	r.mu.Unlock()
	if rec == nil {
		r.p.log.Debug("progress notification dropped: no request in flight with its token", "upstream", name)
		return
	}
	p := *req.Params
	p.ProgressToken = rec.client
	r.notifyCaller(rec, "notifications/progress", &p)
}

func (r *relay) logMessage(name string, req *mcp.LoggingMessageRequest) {
	if req.Params == nil {
		return
	}
	params := req.Params
	rec, server := r.logTarget(name, req.Session)
	switch {
	case rec != nil:
		r.notifyCaller(rec, "notifications/message", params)
	case server:
		// A message about the server itself: to the sessions that asked
		// for log messages and may reach this upstream (a session that
		// set no level gets none anyway), each filtering by its own level.
		r.mu.Lock()
		asked := maps.Clone(r.levels)
		r.mu.Unlock()
		for ss := range r.p.server.Sessions() {
			l, ok := asked[ss]
			if !ok || !r.p.reachable(l.id)[name] {
				continue
			}
			r.post(ss, func() {
				ctx, cancel := context.WithTimeout(context.Background(), notifyTimeout)
				defer cancel()
				ss.Log(ctx, params) // the session's own level filters
			})
		}
	default:
		r.p.log.Debug("log message dropped: the gateway cannot tell which client it is for", "upstream", name)
	}
}

func (r *relay) resourceUpdated(name string, req *mcp.ResourceUpdatedNotificationRequest) {
	if req.Params == nil {
		return
	}
	r.pruneSessions()
	r.mu.Lock()
	s := r.subs[req.Params.URI]
	ok := s != nil && s.upstream == name
	r.mu.Unlock()
	if !ok {
		return
	}
	params := req.Params
	r.post(nil, func() {
		ctx, cancel := context.WithTimeout(context.Background(), notifyTimeout)
		defer cancel()
		r.p.server.ResourceUpdated(ctx, params) // to the subscribed sessions only
	})
}

func (r *relay) elicitationComplete(name string, req *mcp.ElicitationCompleteNotificationRequest) {
	if req.Params == nil {
		return
	}
	r.mu.Lock()
	ss := r.elicits[req.Params.ElicitationID]
	delete(r.elicits, req.Params.ElicitationID)
	r.mu.Unlock()
	if ss == nil {
		return
	}
	params := req.Params
	r.post(ss, func() {
		ctx, cancel := context.WithTimeout(context.Background(), notifyTimeout)
		defer cancel()
		ss.NotifyElicitationComplete(ctx, params)
	})
}

// outbox holds the notifications waiting to be sent to one client session.
type outbox struct {
	queue   []func()
	running bool
}

// post queues a notification for client session ss (nil: for the server's
// subscription fan-out) and sends the queue in order in a goroutine, so the
// upstream's handler goroutine, shared by all clients, never waits for a
// slow client. A session with outboxLimit notifications waiting loses the
// new one.
func (r *relay) post(ss *mcp.ServerSession, send func()) {
	r.mu.Lock()
	ob := r.outboxes[ss]
	if ob == nil {
		ob = &outbox{}
		r.outboxes[ss] = ob
	}
	if len(ob.queue) >= outboxLimit {
		r.mu.Unlock()
		r.p.log.Warn("notification dropped: the client is not reading its stream", "queued", outboxLimit)
		return
	}
	ob.queue = append(ob.queue, send)
	if ob.running {
		r.mu.Unlock()
		return
	}
	ob.running = true
	r.mu.Unlock()
	go func() {
		for {
			r.mu.Lock()
			if len(ob.queue) == 0 {
				ob.running = false
				delete(r.outboxes, ss)
				r.mu.Unlock()
				return
			}
			send := ob.queue[0]
			ob.queue = ob.queue[1:]
			r.mu.Unlock()
			send()
		}
	}()
}

// --- client-to-upstream requests --------------------------------------------

// upstreamError passes an upstream's JSON-RPC error on as is; other
// failures become an internal error naming the upstream (details are
// logged, not sent).
func (r *relay) upstreamError(name, method string, err error) error {
	if err == nil {
		return nil
	}
	var rpcErr *jsonrpc.Error
	if errors.As(err, &rpcErr) && rpcErr.Code != -32005 { // -32005: the SDK's local "rejected by transport"
		return rpcErr
	}
	r.p.log.Warn("pass-through request failed", "upstream", name, "method", method, "err", err)
	return &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: fmt.Sprintf("toolgate: upstream %s could not answer %s; try again later", name, method)}
}

func (r *relay) read(ctx context.Context, name string, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
	c, err := r.begin(ctx, name, req.Session, req.Params.Meta, nil, nil)
	if err != nil {
		return nil, r.upstreamError(name, "resources/read", err)
	}
	defer c.end()
	ctx, cancel := context.WithTimeout(ctx, passTimeout)
	defer cancel()
	res, err := c.cs.ReadResource(ctx, &mcp.ReadResourceParams{Meta: c.meta, URI: req.Params.URI})
	return res, r.upstreamError(name, "resources/read", err)
}

func (r *relay) getPrompt(ctx context.Context, ref promptRef, req *mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
	c, err := r.begin(ctx, ref.upstream, req.Session, req.Params.Meta, nil, nil)
	if err != nil {
		return nil, r.upstreamError(ref.upstream, "prompts/get", err)
	}
	defer c.end()
	ctx, cancel := context.WithTimeout(ctx, passTimeout)
	defer cancel()
	res, err := c.cs.GetPrompt(ctx, &mcp.GetPromptParams{Meta: c.meta, Name: ref.name, Arguments: req.Params.Arguments})
	return res, r.upstreamError(ref.upstream, "prompts/get", err)
}

// completeAt answers completion/complete from upstream name, the owner
// passThrough resolved, with ref in the upstream's own terms (a prompt's
// own name). An owner without completions gives no values.
func (r *relay) completeAt(ctx context.Context, name string, ref *mcp.CompleteReference, req *mcp.CompleteRequest) (*mcp.CompleteResult, error) {
	r.mu.Lock()
	var completions bool
	if st := r.ups[name]; st != nil {
		completions = st.caps.Completions != nil
	}
	r.mu.Unlock()
	if !completions {
		return &mcp.CompleteResult{Completion: mcp.CompletionResultDetails{Values: []string{}}}, nil
	}
	c, err := r.begin(ctx, name, req.Session, req.Params.Meta, nil, nil)
	if err != nil {
		return nil, r.upstreamError(name, "completion/complete", err)
	}
	defer c.end()
	ctx, cancel := context.WithTimeout(ctx, passTimeout)
	defer cancel()
	res, err := c.cs.Complete(ctx, &mcp.CompleteParams{Meta: c.meta, Argument: req.Params.Argument, Context: req.Params.Context, Ref: ref})
	return res, r.upstreamError(name, "completion/complete", err)
}

func (r *relay) soleResourceUpstream() (string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var found []string
	for name, st := range r.ups {
		if st.caps.Resources != nil {
			found = append(found, name)
		}
	}
	if len(found) == 1 {
		return found[0], true
	}
	return "", false
}

// subscribe subscribes the owner of the URI once, for the first client
// session that subscribes to it, within the subscription caps
// (subscriptions.go). The owner is the one passThrough resolved and
// checked (in ctx); without one the request is refused.
func (r *relay) subscribe(ctx context.Context, req *mcp.SubscribeRequest) error {
	uri := req.Params.URI
	name, ok := ctx.Value(ownerKey{}).(string)
	if !ok || name == "" {
		return unguarded("resources/subscribe")
	}
	id, err := r.p.identify(req)
	if err != nil {
		return &jsonrpc.Error{Code: jsonrpc.CodeInvalidRequest, Message: err.Error()}
	}
	r.pruneSessions()
	r.mu.Lock()
	st := r.upLocked(name)
	if st.caps.Resources == nil || !st.caps.Resources.Subscribe {
		r.mu.Unlock()
		return &jsonrpc.Error{Code: jsonrpc.CodeMethodNotFound, Message: fmt.Sprintf("resources/subscribe: upstream %s does not support resource subscriptions", name)}
	}
	s := r.subs[uri]
	if s != nil && s.sessions[req.Session] {
		r.mu.Unlock()
		return nil // held already: costs nothing more
	}
	if err := r.subscriptionCapLocked(req.Session, authorityKey(id)); err != nil {
		r.mu.Unlock()
		return err
	}
	first := s == nil || len(s.sessions) == 0
	if s == nil {
		s = &subscription{upstream: name, sessions: map[*mcp.ServerSession]bool{}}
		r.subs[uri] = s
	}
	s.sessions[req.Session] = true
	r.counts.add(req.Session, authorityKey(id))
	r.mu.Unlock()
	if !first {
		return nil
	}
	c, err := r.begin(ctx, name, req.Session, nil, nil, nil)
	if err == nil {
		defer c.end()
		sctx, cancel := context.WithTimeout(ctx, passTimeout)
		defer cancel()
		err = c.cs.Subscribe(sctx, &mcp.SubscribeParams{URI: uri})
	}
	if err != nil {
		r.mu.Lock()
		if s.sessions[req.Session] {
			delete(s.sessions, req.Session)
			r.counts.remove(req.Session)
		}
		if len(s.sessions) == 0 && r.subs[uri] == s {
			delete(r.subs, uri)
		}
		r.mu.Unlock()
		return r.upstreamError(name, "resources/subscribe", err)
	}
	return nil
}

// unsubscribe removes the session and unsubscribes the upstream when no
// session is left.
func (r *relay) unsubscribe(ctx context.Context, req *mcp.UnsubscribeRequest) error {
	if ctx.Value(cleanupKey{}) != nil {
		return nil // the gateway's own cleanup of the SDK's record (forgetSDK)
	}
	r.pruneSessions()
	r.mu.Lock()
	s := r.subs[req.Params.URI]
	held := s != nil && s.sessions[req.Session]
	last := held && len(s.sessions) == 1
	if held {
		delete(s.sessions, req.Session)
		r.counts.remove(req.Session)
	}
	r.mu.Unlock()
	if last {
		r.unsubscribeUpstream(ctx, s.upstream, req.Params.URI)
	}
	return nil
}

func (r *relay) unsubscribeUpstream(ctx context.Context, name, uri string) {
	r.mu.Lock()
	if s := r.subs[uri]; s != nil && len(s.sessions) == 0 {
		delete(r.subs, uri)
	}
	r.mu.Unlock()
	if r.p.ups == nil {
		return
	}
	cs, err := r.p.ups.Session(name)
	if err != nil {
		return // a new session starts without subscriptions
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), passTimeout)
	defer cancel()
	if err := cs.Unsubscribe(ctx, &mcp.UnsubscribeParams{URI: uri}); err != nil {
		r.p.log.Debug("upstream unsubscribe failed", "upstream", name, "uri", uri, "err", err)
	}
}

// pruneSessions forgets the state of client sessions that have closed, and
// unsubscribes upstreams from URIs nobody watches any more (sessionClosed
// does it at once for each session; this catches what raced with it).
func (r *relay) pruneSessions() {
	live := map[*mcp.ServerSession]bool{}
	for ss := range r.p.server.Sessions() {
		live[ss] = true
	}
	r.mu.Lock()
	for ss := range r.levels {
		if !live[ss] {
			delete(r.levels, ss)
		}
	}
	for id, ss := range r.elicits {
		if !live[ss] {
			delete(r.elicits, id)
		}
	}
	dead := map[*mcp.ServerSession]bool{}
	for ss := range r.counts.bySession {
		if !live[ss] {
			dead[ss] = true
		}
	}
	drop, sdk := r.forgetLocked(dead)
	r.mu.Unlock()
	r.forgetSDK(sdk)
	for _, d := range drop {
		r.unsubscribeUpstream(context.Background(), d.upstream, d.uri)
	}
}

// --- logging levels -----------------------------------------------------

// levelRank orders logging levels from debug (0) to emergency (7); -1 for
// an unknown level.
func levelRank(l mcp.LoggingLevel) int {
	switch l {
	case "debug":
		return 0
	case "info":
		return 1
	case "notice":
		return 2
	case "warning":
		return 3
	case "error":
		return 4
	case "critical":
		return 5
	case "alert":
		return 6
	case "emergency":
		return 7
	}
	return -1
}

// wantLevel is the most verbose level asked for by a live session that
// may reach upstream name, or "" if none did.
func (r *relay) wantLevel(name string) mcp.LoggingLevel {
	r.mu.Lock()
	asked := make([]levelRequest, 0, len(r.levels))
	for _, l := range r.levels {
		asked = append(asked, l)
	}
	r.mu.Unlock()
	var want mcp.LoggingLevel
	for _, l := range asked {
		if levelRank(l.level) >= 0 && (want == "" || levelRank(l.level) < levelRank(want)) && r.p.reachable(l.id)[name] {
			want = l.level
		}
	}
	return want
}

// setLevel records ss's level (asked for by id) and sets, on every
// upstream that declares logging, the most verbose level asked for by the
// sessions that may reach it (wantLevel): an upstream a caller may not
// see never hears of its level, and each client still gets only the
// messages at or above its own level (the SDK's ServerSession.Log; the
// fast path's relayLog).
func (r *relay) setLevel(ctx context.Context, ss *mcp.ServerSession, id gate.Identity, level mcp.LoggingLevel) {
	r.pruneSessions()
	r.mu.Lock()
	r.levels[ss] = levelRequest{level: level, id: id}
	names := slices.Sorted(maps.Keys(r.ups))
	r.mu.Unlock()
	for _, name := range names {
		r.applyLevel(ctx, name)
	}
}

// applyLevel sets the wanted level on upstream name if it declares logging
// and its current session has another level.
func (r *relay) applyLevel(ctx context.Context, name string) {
	if r.p.ups == nil {
		return
	}
	cs, err := r.p.ups.Session(name)
	if err != nil {
		return
	}
	want := r.wantLevel(name)
	r.mu.Lock()
	st := r.upLocked(name)
	skip := want == "" || st.caps.Logging == nil || st.synced != cs || st.level == want
	r.mu.Unlock()
	if skip {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), passTimeout)
	defer cancel()
	if err := cs.SetLoggingLevel(ctx, &mcp.SetLoggingLevelParams{Level: want}); err != nil {
		r.p.log.Warn("upstream logging/setLevel failed", "upstream", name, "level", want, "err", err)
		return
	}
	r.mu.Lock()
	if st.synced == cs {
		st.level = want
	}
	r.mu.Unlock()
}

// --- mirroring ----------------------------------------------------------

// resync refreshes upstream name's mirror in the background; calls while
// one runs are merged into one more run.
func (r *relay) resync(name string) {
	r.mu.Lock()
	st := r.upLocked(name)
	if !st.known {
		r.mu.Unlock()
		return
	}
	if st.syncing {
		st.again = true
		r.mu.Unlock()
		return
	}
	st.syncing = true
	r.mu.Unlock()
	go func() {
		for {
			r.sync(name)
			r.mu.Lock()
			if !st.again {
				st.syncing = false
				r.mu.Unlock()
				return
			}
			st.again = false
			r.mu.Unlock()
		}
	}()
}

// sync lists upstream name's resources, templates and prompts and mirrors
// them; after a restart it also restores the log level and subscriptions.
// A list that fails keeps the previous mirror of that kind.
func (r *relay) sync(name string) {
	if r.p.ups == nil {
		return
	}
	cs, err := r.p.ups.Session(name)
	if err != nil {
		return // down: the next (re)listing of its tools syncs again
	}
	ctx, cancel := context.WithTimeout(context.Background(), passTimeout)
	defer cancel()
	var caps mcp.ServerCapabilities
	if ir := cs.InitializeResult(); ir != nil && ir.Capabilities != nil {
		caps = *ir.Capabilities
	}
	r.mu.Lock()
	st := r.upLocked(name)
	restarted := st.synced != cs
	st.synced, st.caps = cs, caps
	if restarted {
		st.level = ""
	}
	prefix := st.prefix
	r.mu.Unlock()

	if caps.Resources != nil {
		if list, err := collect(cs.Resources(ctx, nil)); err != nil {
			r.p.log.Warn("upstream resources/list failed; the previous list stays", "upstream", name, "err", err)
		} else {
			r.mirrorResources(name, list)
		}
		if list, err := collect(cs.ResourceTemplates(ctx, nil)); err != nil {
			r.p.log.Warn("upstream resources/templates/list failed; the previous list stays", "upstream", name, "err", err)
		} else {
			r.mirrorTemplates(name, list)
		}
	} else {
		r.mirrorResources(name, nil)
		r.mirrorTemplates(name, nil)
	}
	if caps.Prompts != nil {
		if list, err := collect(cs.Prompts(ctx, nil)); err != nil {
			r.p.log.Warn("upstream prompts/list failed; the previous list stays", "upstream", name, "err", err)
		} else {
			r.mirrorPrompts(name, prefix, list)
		}
	} else {
		r.mirrorPrompts(name, prefix, nil)
	}

	r.applyLevel(ctx, name)
	if restarted {
		r.mu.Lock()
		var uris []string
		for uri, s := range r.subs {
			if s.upstream == name && len(s.sessions) > 0 {
				uris = append(uris, uri)
			}
		}
		r.mu.Unlock()
		for _, uri := range uris {
			if err := cs.Subscribe(ctx, &mcp.SubscribeParams{URI: uri}); err != nil {
				r.p.log.Warn("upstream resubscribe failed", "upstream", name, "uri", uri, "err", err)
			}
		}
	}
}

func collect[T any](seq func(yield func(T, error) bool)) ([]T, error) {
	var out []T
	for v, err := range seq {
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}

// diffLocked updates one kind of upstream name's mirror (prev: key → JSON)
// for its new definitions (key → definition), honouring owners (key →
// upstream, first come first served). It returns the keys to (re)register
// and to remove.
func (r *relay) diffLocked(name string, prev map[string]string, owners map[string]string, defs map[string]any, kind string) (add, remove []string) {
	next := map[string]string{}
	for key, def := range defs {
		if owner, ok := owners[key]; ok && owner != name {
			r.p.log.Warn("upstream "+kind+" refused: another upstream already has it", "upstream", name, kind, key, "owner", owner)
			continue
		}
		b, _ := json.Marshal(def)
		next[key] = string(b)
		if prev[key] != string(b) {
			add = append(add, key)
			owners[key] = name
		}
	}
	for key := range prev {
		if _, ok := next[key]; !ok {
			remove = append(remove, key)
			delete(owners, key)
			delete(prev, key)
		}
	}
	for key, v := range next {
		prev[key] = v
	}
	slices.Sort(add)
	return add, remove
}

// register runs an SDK registration, turning its panic on an invalid
// definition into an error.
func register(f func()) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("%v", v)
		}
	}()
	f()
	return nil
}

// The SDK's registrations of mirrored resources, templates and prompts
// declare them (its list_changed notifications); their handlers are never
// reached, since passThrough answers resources/read and prompts/get at the
// owner it resolved, and refuse if they ever are.
func refuseRead(context.Context, *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
	return nil, unguarded("resources/read")
}

func (r *relay) mirrorResources(name string, list []*mcp.Resource) {
	mirrorByKey(r, name, list, "resource", func(x *mcp.Resource) string { return x.URI },
		func(st *upState) map[string]string { return st.resources }, r.resOwner, r.resDef,
		func(keys ...string) { r.p.server.RemoveResources(keys...) },
		func(x *mcp.Resource) { r.p.server.AddResource(x, refuseRead) })
}

func (r *relay) mirrorTemplates(name string, list []*mcp.ResourceTemplate) {
	mirrorByKey(r, name, list, "resource template", func(x *mcp.ResourceTemplate) string { return x.URITemplate },
		func(st *upState) map[string]string { return st.templates }, r.tmplOwner, r.tmplDef,
		func(keys ...string) {
			r.p.server.RemoveResourceTemplates(keys...)
		},
		func(x *mcp.ResourceTemplate) {
			r.p.server.AddResourceTemplate(x, refuseRead)
			t := compileTemplate(x.URITemplate)
			r.mu.Lock()
			r.tmplCompiled[x.URITemplate] = t
			r.mu.Unlock()
		})
}

// mirrorByKey brings the gateway's server in line with an upstream's list
// of resources or templates: what left it is removed, what is new is added
// (a definition the SDK refuses is logged and forgotten). defs keeps the
// definitions the lists show.
func mirrorByKey[T any](r *relay, name string, list []*T, kind string, key func(*T) string,
	mirrored func(*upState) map[string]string, owners map[string]string, defs map[string]*T,
	remove func(keys ...string), add func(*T)) {
	all := map[string]any{}
	byKey := map[string]*T{}
	for _, x := range list {
		if x != nil && key(x) != "" {
			all[key(x)], byKey[key(x)] = x, x
		}
	}
	r.mu.Lock()
	st := r.upLocked(name)
	added, removed := r.diffLocked(name, mirrored(st), owners, all, kind)
	for _, k := range removed {
		delete(defs, k)
		delete(r.tmplCompiled, k)
	}
	r.mu.Unlock()
	if len(removed) > 0 {
		remove(removed...)
	}
	for _, k := range added {
		if err := register(func() { add(byKey[k]) }); err != nil {
			r.p.log.Warn("upstream "+kind+" refused", "upstream", name, "key", k, "err", err)
			r.mu.Lock()
			delete(mirrored(st), k)
			delete(owners, k)
			delete(defs, k)
			delete(r.tmplCompiled, k)
			r.mu.Unlock()
			continue
		}
		r.mu.Lock()
		defs[k] = byKey[k]
		r.mu.Unlock()
	}
	if len(added)+len(removed) > 0 {
		r.p.lists.changed()
	}
}

func (r *relay) mirrorPrompts(name, prefix string, list []*mcp.Prompt) {
	defs := map[string]any{}
	byKey := map[string]*mcp.Prompt{}
	for _, p := range list {
		if p != nil && p.Name != "" {
			cp := *p
			cp.Name = prefix + p.Name
			defs[cp.Name], byKey[cp.Name] = &cp, &cp
		}
	}
	r.mu.Lock()
	st := r.upLocked(name)
	owners := map[string]string{}
	for k, ref := range r.prompts {
		owners[k] = ref.upstream
	}
	add, remove := r.diffLocked(name, st.prompts, owners, defs, "prompt")
	for _, k := range remove {
		delete(r.prompts, k)
		delete(r.promptDef, k)
	}
	for _, k := range add {
		r.prompts[k] = promptRef{upstream: name, name: k[len(prefix):]}
	}
	r.mu.Unlock()
	if len(remove) > 0 {
		r.p.server.RemovePrompts(remove...)
	}
	for _, visible := range add {
		err := register(func() {
			r.p.server.AddPrompt(byKey[visible], func(context.Context, *mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
				return nil, unguarded("prompts/get")
			})
		})
		r.mu.Lock()
		if err != nil {
			r.p.log.Warn("upstream prompt refused", "upstream", name, "prompt", visible, "err", err)
			delete(st.prompts, visible)
			delete(r.prompts, visible)
			delete(r.promptDef, visible)
		} else {
			r.promptDef[visible] = byKey[visible]
		}
		r.mu.Unlock()
	}
	if len(add)+len(remove) > 0 {
		r.p.lists.changed()
	}
}
