package mcpproxy

// The fast path for tools/call. A tools/call on an established session is
// served by the gateway's own JSON-RPC handling, not the SDK's: the
// envelope is parsed once in the guard, the call is handed to gate.Handle
// (the one pipeline: decided, recorded, run, completed, measured), and the
// answer is written back by the one mapping every tools/call takes
// (result.go). Its caller (callers.go) is this call's own response: what an
// upstream sends while serving the call (its sampling, elicitation and
// roots requests, log messages, progress) reaches exactly this client on
// this stream, and the client's answers come back through fastAnswer. The
// SDK path remains for requests before the session is in use, odd ids,
// calls with _meta (a progress token: the upstream's progress travels
// through the SDK session, with the token replaced where two callers
// share it) and transport shapes the fast path does not take (another
// protocol version, a content type or Accept header it does not serve,
// params it does not know): it hands its calls to the same Handle, with
// the SDK session as caller.
//
// A client's notifications/cancelled for a fast call cancels it; the
// executor tells the upstream.

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolgate/toolgate/gate"
	"github.com/toolgate/toolgate/identity"
)

// SessionTimeout is how long a client session may stay idle (no request of
// any kind, fast path included) before the gateway closes it, unless
// Options.SessionTimeout says otherwise.
const SessionTimeout = 30 * time.Minute

// fastVersions are the session protocol versions the fast path serves; a
// request with another Mcp-Protocol-Version header goes to the SDK.
var fastVersions = []string{"2025-03-26", "2025-06-18", "2025-11-25"}

// fastState is the fast path's bookkeeping.
type fastState struct {
	tag string // random per process; in the ids of relayed requests
	seq atomic.Uint64

	mu       sync.Mutex
	sessions map[string]*clientSession  // Mcp-Session-Id → session
	pending  map[string]*pendingRequest // relayed request id → where the answer goes
	calls    map[callKey]context.CancelFunc
	reaped   time.Time
	// admitting counts the initialize requests admitted and not yet done,
	// by authority key and in total (sessions.go).
	admitting      map[string]int
	admittingTotal int
}

// clientSession is a session the SDK created, as the fast path knows it.
type clientSession struct {
	ss *mcp.ServerSession
	// cred is the credential the session is bound to ("" without one):
	// the same key the SDK binds it with (auth.TokenInfo.UserID).
	cred string
	// authority is the key the session caps count it under: the
	// principal and agent of its identity (authorityKey).
	authority string
	// ready is set once the session has made a request other than
	// initialize through the SDK (the handshake is done).
	ready bool
	// closing is set when the session is being closed to make room
	// (sessions.go); it no longer counts.
	closing bool
	seen    atomic.Int64 // unix nanoseconds of the last request
	active  atomic.Int32 // HTTP requests in progress (an open GET stream too)
}

// pendingRequest is an upstream's request relayed to a fast call's client,
// waiting for the client's answer.
type pendingRequest struct {
	session string         // the client session it was sent to
	reply   chan fastReply // where the answer goes (fastCaller.ask)
}

type callKey struct{ session, id string }

func newFastState() *fastState {
	b := make([]byte, 6)
	rand.Read(b)
	return &fastState{tag: hex.EncodeToString(b), sessions: map[string]*clientSession{},
		pending: map[string]*pendingRequest{}, calls: map[callKey]context.CancelFunc{}, admitting: map[string]int{}}
}

// credentialKey is the key a session is bound to for an Authorization
// header, as New's auth.RequireBearerToken computes it: anonymousUserID for
// none, else tokenUserID of the token as Identify reads it.
func credentialKey(authorization string) string {
	if authorization == "" {
		return anonymousUserID
	}
	token, ok := identity.BearerToken(authorization)
	if !ok {
		return "unparsed"
	}
	return tokenUserID(token)
}

// tokenUserID is the key a session is bound to for a bearer token (the
// SDK's auth.TokenInfo.UserID): a digest, never the token itself.
func tokenUserID(token string) string {
	sum := sha256.Sum256([]byte(token))
	return "credential:" + hex.EncodeToString(sum[:12])
}

// remember records a session the SDK is serving (called from the
// middleware for every request it handles).
func (p *Proxy) remember(req mcp.Request, method string) {
	ss, ok := req.GetSession().(*mcp.ServerSession)
	if !ok || ss == nil || ss.ID() == "" {
		return
	}
	cred, authority := "", "unidentified"
	if extra := req.GetExtra(); extra != nil && extra.TokenInfo != nil {
		cred = extra.TokenInfo.UserID
		if id, ok := extra.TokenInfo.Extra[identityExtraKey].(gate.Identity); ok {
			authority = authorityKey(id)
		}
	}
	f := p.fast
	f.mu.Lock()
	cs := f.sessions[ss.ID()]
	if cs == nil {
		cs = &clientSession{ss: ss, cred: cred, authority: authority}
		f.sessions[ss.ID()] = cs
		go func(id string) {
			ss.Wait()
			f.mu.Lock()
			delete(f.sessions, id)
			f.mu.Unlock()
			p.relay.sessionClosed(ss) // its subscriptions' slots, at once
		}(ss.ID())
	}
	// The SDK serves requests other than initialize and ping only once
	// the handshake is done, so either of these shows it is.
	if method == "notifications/initialized" || (method != "initialize" && method != "ping" && !strings.HasPrefix(method, "notifications/")) {
		cs.ready = true
	}
	f.mu.Unlock()
	cs.seen.Store(time.Now().UnixNano())
}

// begin notes an HTTP request on a session (any method; sessionID may be
// "", and a request with another credential than the session's counts for
// nothing) and, at most once a minute, closes sessions idle for SessionTimeout
// with no request in progress. The SDK's own idle timer would not see the
// fast path's calls, so the gateway keeps time itself. Call the returned
// function when the request is done.
func (p *Proxy) begin(sessionID, cred string) (done func()) {
	f := p.fast
	now := time.Now()
	var idle []*mcp.ServerSession
	f.mu.Lock()
	cs := f.sessions[sessionID]
	if cs != nil && cs.cred != cred {
		cs = nil // another credential's request keeps nobody's session alive
	}
	if cs != nil {
		cs.seen.Store(now.UnixNano())
		cs.active.Add(1)
	}
	timeout := p.opts.SessionTimeout
	if timeout <= 0 {
		timeout = SessionTimeout
	}
	if now.Sub(f.reaped) > min(time.Minute, timeout/2) {
		f.reaped = now
		for _, c := range f.sessions {
			if c.active.Load() == 0 && now.Sub(time.Unix(0, c.seen.Load())) > timeout {
				idle = append(idle, c.ss)
			}
		}
	}
	f.mu.Unlock()
	for _, ss := range idle {
		go ss.Close()
	}
	return func() {
		if cs != nil {
			cs.seen.Store(time.Now().UnixNano())
			cs.active.Add(-1)
		}
	}
}

// serveFast serves a POSTed message on the fast path when it can and
// reports whether it did.
// id is the caller's identity, from the request's credential.
func (p *Proxy) serveFast(w http.ResponseWriter, r *http.Request, sid string, env *envelope, id gate.Identity) bool {
	switch {
	case env.Method != nil && *env.Method == "notifications/initialized":
		p.fast.initialized(sid, r)
		return false // the SDK completes its side of the handshake
	case env.Method == nil && len(env.ID) > 0:
		return p.fastAnswer(w, r, sid, env)
	case env.Method != nil && *env.Method == "notifications/cancelled" && len(env.ID) == 0:
		return p.fastCancel(w, r, sid, env)
	case env.Method != nil && *env.Method == "tools/call" && env.isRequest():
		return p.fastCall(w, r, sid, env, id)
	}
	return false
}

// initialized marks session sid ready when the client that created it
// sends notifications/initialized: its next call may take the fast path
// even before the SDK has handled the notification (asynchronously).
func (f *fastState) initialized(sid string, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if cs := f.sessions[sid]; cs != nil && cs.cred == credentialKey(r.Header.Get("Authorization")) {
		cs.ready = true
	}
}

// session returns the ready session sid if the request may use it: the
// same credential the SDK bound it to.
func (f *fastState) session(sid string, r *http.Request) *clientSession {
	f.mu.Lock()
	cs := f.sessions[sid]
	ok := cs != nil && cs.ready && cs.cred == credentialKey(r.Header.Get("Authorization"))
	f.mu.Unlock()
	if !ok {
		return nil
	}
	return cs
}

// fastCall serves a tools/call, or returns false to leave it to the SDK.
func (p *Proxy) fastCall(w http.ResponseWriter, r *http.Request, sid string, env *envelope, id gate.Identity) bool {
	cs := p.fast.session(sid, r)
	if cs == nil || !slices.Contains(fastVersions, r.Header.Get("Mcp-Protocol-Version")) || !plainID(env.ID) {
		return false
	}
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		return false
	}
	if accept := strings.Join(r.Header.Values("Accept"), ","); !strings.Contains(accept, "application/json") || !strings.Contains(accept, "text/event-stream") {
		return false
	}
	var params map[string]json.RawMessage // exact member names (parseEnvelope refused case twins)
	if err := json.Unmarshal(env.Params, &params); err != nil {
		return false
	}
	for k := range params {
		if k != "name" && k != "arguments" {
			// _meta (a progress token: the SDK client of the upstream
			// relays its progress), task, ...: the SDK path.
			return false
		}
	}
	var name string
	if err := json.Unmarshal(params["name"], &name); err != nil || name == "" {
		return false
	}
	args := params["arguments"]
	if string(args) == "null" {
		args = nil
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	key := callKey{sid, string(env.ID)}
	p.fast.mu.Lock()
	if _, dup := p.fast.calls[key]; dup {
		p.fast.mu.Unlock()
		return false
	}
	p.fast.calls[key] = cancel
	p.fast.mu.Unlock()
	defer func() {
		p.fast.mu.Lock()
		delete(p.fast.calls, key)
		p.fast.mu.Unlock()
	}()

	p.countPath("fast")
	out := newFastWriter(w)
	to := &fastCaller{p: p, cs: cs, out: out}
	req := p.toolRequest(withSession(id, sid), name, args, nil,
		&callRelay{p: p, ss: cs.ss, to: to, fast: true},
		func(ctx context.Context, params *mcp.ProgressNotificationParams) error {
			return to.notify(ctx, "notifications/progress", params)
		}, r.Header.Get("Authorization"))
	res, raw, callErr := p.toolAnswer(p.g.Handle(ctx, req), name)
	var msg []byte
	switch {
	case callErr != nil:
		msg = errorMessage(env.ID, callErr)
	case raw != nil:
		msg = resultMessage(env.ID, raw)
	default:
		if res.Content == nil {
			res.Content = []mcp.Content{}
		}
		b, err := json.Marshal(res)
		if err != nil {
			msg = errorMessage(env.ID, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "toolgate: the result could not be encoded: " + err.Error()})
		} else {
			msg = resultMessage(env.ID, b)
		}
	}
	out.final(msg)
	return true
}

// resultMessage is a JSON-RPC response to id carrying result.
func resultMessage(id json.RawMessage, result []byte) []byte {
	msg := make([]byte, 0, 40+len(id)+len(result))
	msg = append(msg, `{"jsonrpc":"2.0","id":`...)
	msg = append(msg, id...)
	msg = append(msg, `,"result":`...)
	msg = append(msg, result...)
	return append(msg, '}')
}

// plainID reports whether a request id is a string or a number, the ids
// JSON-RPC allows (anything else is left to the SDK to refuse).
func plainID(id json.RawMessage) bool {
	return len(id) > 0 && (id[0] == '"' || id[0] == '-' || (id[0] >= '0' && id[0] <= '9'))
}

// errorMessage is a JSON-RPC error response to id.
func errorMessage(id json.RawMessage, err error) []byte {
	var rpcErr *jsonrpc.Error
	if !errors.As(err, &rpcErr) {
		rpcErr = &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: err.Error()}
	}
	e, _ := json.Marshal(map[string]any{"code": rpcErr.Code, "message": rpcErr.Message, "data": rpcErr.Data})
	if rpcErr.Data == nil {
		e, _ = json.Marshal(map[string]any{"code": rpcErr.Code, "message": rpcErr.Message})
	}
	return append(append(append(append([]byte(`{"jsonrpc":"2.0","id":`), id...), `,"error":`...), e...), '}')
}

// fastWriter answers one fast call: a JSON body when nothing came before
// the result, else an SSE stream that carries what the upstream sent before
// it (relayed requests, log messages) and then the result. Each write has
// fastWriteTimeout to reach the client: a client that stops reading fails its
// own stream, never holds the call (whose completion is recorded anyway).
type fastWriter struct {
	mu  sync.Mutex
	w   http.ResponseWriter
	rc  *http.ResponseController
	sse bool
	err error
	// asked counts the upstream's requests relayed to the client
	// (gate.ErrClientAsked).
	asked atomic.Int32
}

// fastWriteTimeout bounds one write to the client on the fast path (a
// variable for tests).
var fastWriteTimeout = 10 * time.Second

func newFastWriter(w http.ResponseWriter) *fastWriter {
	return &fastWriter{w: w, rc: http.NewResponseController(w)}
}

// event sends one message on the call's stream, switching to SSE. msg is
// compacted first: an upstream's pretty-printed JSON would break the SSE
// framing.
func (f *fastWriter) event(msg []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return f.err
	}
	if bytes.ContainsAny(msg, "\r\n") {
		var b bytes.Buffer
		if err := json.Compact(&b, msg); err != nil {
			return err
		}
		msg = b.Bytes()
	}
	f.rc.SetWriteDeadline(time.Now().Add(fastWriteTimeout))
	defer f.rc.SetWriteDeadline(time.Time{}) // the connection outlives this call
	if !f.sse {
		f.sse = true
		h := f.w.Header()
		h.Set("Content-Type", "text/event-stream")
		h.Set("Cache-Control", "no-cache, no-transform")
		h.Set("Connection", "keep-alive")
		f.w.WriteHeader(http.StatusOK)
	}
	if _, err := fmt.Fprintf(f.w, "event: message\ndata: %s\n\n", msg); err != nil {
		f.err = err
		return err
	}
	if err := f.rc.Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
		f.err = err
		return err
	}
	return nil
}

// final sends the response.
func (f *fastWriter) final(msg []byte) {
	f.mu.Lock()
	sse := f.sse
	f.mu.Unlock()
	if sse {
		f.event(msg)
		return
	}
	f.rc.SetWriteDeadline(time.Now().Add(fastWriteTimeout))
	defer f.rc.SetWriteDeadline(time.Time{})
	f.w.Header().Set("Content-Type", "application/json")
	f.w.WriteHeader(http.StatusOK)
	f.w.Write(msg)
}

// fastAnswer hands a client's response to a relayed request to the call
// waiting for it; other responses go to the SDK.
func (p *Proxy) fastAnswer(w http.ResponseWriter, r *http.Request, sid string, env *envelope) bool {
	if !bytes.HasPrefix(env.ID, []byte(`"toolgate-`+p.fast.tag+"-")) {
		return false
	}
	if p.fast.session(sid, r) == nil {
		return false
	}
	key := string(env.ID)
	p.fast.mu.Lock()
	pr := p.fast.pending[key]
	if pr != nil && pr.session == sid {
		delete(p.fast.pending, key)
	} else {
		pr = nil
	}
	p.fast.mu.Unlock()
	if pr == nil {
		w.WriteHeader(http.StatusAccepted) // late or unknown: nothing waits for it
		return true
	}
	var rep fastReply
	if len(env.Error) > 0 && string(env.Error) != "null" {
		rep.err = new(jsonrpc.Error)
		if err := json.Unmarshal(env.Error, rep.err); err != nil {
			rep.err = &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "toolgate: the client's error is malformed: " + err.Error()}
		}
	} else {
		rep.result = append(json.RawMessage(nil), paramsOrEmpty(env.Result)...)
	}
	select {
	case pr.reply <- rep:
	default:
	}
	w.WriteHeader(http.StatusAccepted)
	return true
}

// fastCancel cancels a fast call the client gave up on; other
// cancellations go to the SDK.
func (p *Proxy) fastCancel(w http.ResponseWriter, r *http.Request, sid string, env *envelope) bool {
	reqID, ok := strictMember(env.Params, "requestId") // as the SDK reads it
	if !ok || len(reqID) == 0 {
		return false
	}
	if p.fast.session(sid, r) == nil {
		return false
	}
	p.fast.mu.Lock()
	cancel := p.fast.calls[callKey{sid, string(reqID)}]
	p.fast.mu.Unlock()
	if cancel == nil {
		return false
	}
	cancel()
	w.WriteHeader(http.StatusAccepted)
	return true
}
