package mcpproxy

// The fast path for tools/call (issue 3: "parse the JSON-RPC envelope once
// and forward bytes"). A tools/call on an established session is decided
// and recorded exactly as on the SDK path (callTool → gate.CallWith), but
// neither end is terminated by an SDK layer: the guard answers the client
// itself, and an upstream reached over Streamable HTTP gets the call's
// bytes posted on the session the upstream Manager keeps. Everything the
// fast path does not handle goes to the SDK as before: requests before the
// session is in use, other methods, calls carrying _meta (progress tokens)
// or unknown params, Settings.approval_wait, and tools of stdio upstreams
// the caller may see. Visibility is decided before the path: a name the
// caller may not see (a hidden tool of any upstream or built-in, or none
// at all) is answered here, alike, whatever its upstream, so the shape of
// the answer and the path counter never tell hidden from nonexistent.
//
// While a call is in flight, what the upstream sends on its stream before
// the result (log messages, and its own requests: sampling, elicitation,
// roots, ping) is relayed as the SDK path relays it: requests go to this
// client only, on this call's stream, under an id of the gateway's, after
// the same capability checks; the client's answer is posted back to the
// upstream under the upstream's id. A client's notifications/cancelled for
// a fast call cancels it and is passed on to the upstream.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolgate/toolgate/gate"
	"github.com/toolgate/toolgate/upstream"
)

// SessionTimeout is how long a client session may stay idle (no request of
// any kind, fast path included) before the gateway closes it, unless
// Options.SessionTimeout says otherwise.
const SessionTimeout = 30 * time.Minute

// maxUpstreamMessage bounds one message read from an upstream on the fast
// path (the result cap applies after it).
const maxUpstreamMessage = 64 << 20

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
	// by credential key and in total (sessions.go).
	admitting      map[string]int
	admittingTotal int
}

// clientSession is a session the SDK created, as the fast path knows it.
type clientSession struct {
	ss *mcp.ServerSession
	// cred is the credential the session is bound to ("" without one):
	// the same key the SDK binds it with (auth.TokenInfo.UserID).
	cred string
	// ready is set once the session has made a request other than
	// initialize through the SDK (the handshake is done).
	ready bool
	// closing is set when the session is being closed to make room
	// (sessions.go); it no longer counts.
	closing bool
	seen    atomic.Int64 // unix nanoseconds of the last request
	active  atomic.Int32 // HTTP requests in progress (an open GET stream too)
}

// pendingRequest is an upstream's request relayed to a client.
type pendingRequest struct {
	session string           // the client session it was sent to
	d       *upstream.Direct // where the answer goes
	id      json.RawMessage  // the upstream's id for it
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
	token, ok := bearerToken(authorization)
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
	cred := ""
	if extra := req.GetExtra(); extra != nil && extra.TokenInfo != nil {
		cred = extra.TokenInfo.UserID
	}
	f := p.fast
	f.mu.Lock()
	cs := f.sessions[ss.ID()]
	if cs == nil {
		cs = &clientSession{ss: ss, cred: cred}
		f.sessions[ss.ID()] = cs
		go func(id string) {
			ss.Wait()
			f.mu.Lock()
			delete(f.sessions, id)
			f.mu.Unlock()
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
			return false // _meta (a progress token), task, ...: the SDK path
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
	if p.g.Snapshot().Settings().ApprovalWait.D() > 0 {
		return false
	}
	id = withSession(id, sid)
	// Visibility first, then the path: every name this caller may not see
	// (hidden, of any upstream or built-in, or nonexistent) is answered
	// here, alike, so neither the answer's shape nor the path counter can
	// tell a hidden tool from one that does not exist.
	if m, ok := p.lookup(name); ok && m.builtin == "" && p.disclose(id).Disclosed[m.id] {
		if p.ups == nil {
			return false
		}
		if _, err := p.ups.Direct(m.upstream); errors.Is(err, upstream.ErrNotDirect) {
			return false // a stdio upstream: the SDK client relays its stream
		}
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
	forward := func(m mirror) *gate.CallOptions {
		return &gate.CallOptions{ForwardRaw: func(ctx context.Context, decided json.RawMessage) (json.RawMessage, error) {
			return p.forwardDirect(ctx, m, cs, decided, out)
		}}
	}
	res, raw, callErr := p.callTool(ctx, id, name, args, forward, nil)
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

// forwardDirect posts the call, with the arguments that were decided
// (canonical JSON), to the upstream on its session and returns
// the result member of its response as sent, relaying what comes before it
// (see the file comment). A JSON-RPC error from the upstream is returned as
// a *jsonrpc.Error.
func (p *Proxy) forwardDirect(ctx context.Context, m mirror, cs *clientSession, args json.RawMessage, out *fastWriter) (json.RawMessage, error) {
	if p.ups == nil {
		return nil, errors.New("no upstreams are configured")
	}
	d, err := p.ups.Direct(m.upstream)
	if err != nil {
		if errors.Is(err, upstream.ErrNotDirect) {
			// Reconfigured to stdio since the call was admitted.
			res, err := p.ups.CallTool(ctx, m.upstream, &mcp.CallToolParams{Name: m.name, Arguments: args})
			if err != nil {
				return nil, err
			}
			return json.Marshal(res)
		}
		return nil, fmt.Errorf("%w (tools/call %q)", err, m.name)
	}
	// Tracked as the SDK path tracks its calls, so that what the upstream
	// sends about this call outside the call's own stream (a server that
	// answers with JSON, or sends unrelated to the request) is attributed
	// to this client, or refused when it cannot be, never misrouted.
	if c, err := p.relay.begin(ctx, m.upstream, cs.ss, nil); err == nil {
		defer c.end()
	}
	start := time.Now()
	asked := out.asked.Load()
	res, err := p.postCall(ctx, d, m, cs, args, out)
	if err != nil && out.asked.Load() > asked {
		err = fmt.Errorf("%w (%w)", err, gate.ErrClientAsked)
	}
	if p.opts.Observer != nil {
		outcome := "ok"
		switch {
		case err != nil:
			outcome = "error"
		case bytes.Contains(res, []byte(`"isError":true`)):
			outcome = "tool_error"
		}
		p.opts.Observer.UpstreamCall(m.upstream, outcome, time.Since(start))
	}
	return res, err
}

// postCall is one attempt of forwardDirect.
func (p *Proxy) postCall(ctx context.Context, d *upstream.Direct, m mirror, cs *clientSession, args json.RawMessage, out *fastWriter) (json.RawMessage, error) {
	cctx, cancel := d.WithTimeout(ctx)
	defer cancel()
	upID := []byte(`"toolgate-` + strconv.FormatUint(p.fast.seq.Add(1), 10) + `"`)
	name, _ := json.Marshal(m.name)
	if len(args) == 0 {
		args = json.RawMessage("{}")
	}
	body := make([]byte, 0, 64+len(name)+len(args))
	body = append(body, `{"jsonrpc":"2.0","id":`...)
	body = append(body, upID...)
	body = append(body, `,"method":"tools/call","params":{"name":`...)
	body = append(body, name...)
	body = append(body, `,"arguments":`...)
	body = append(body, args...)
	body = append(body, `}}`...)

	answered := false
	defer func() {
		if !answered {
			// Cancelled or timed out: tell the upstream, as the SDK would.
			n := []byte(`{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":` + string(upID) + `,"reason":"cancelled by the gateway"}}`)
			go func() {
				c, stop := context.WithTimeout(context.Background(), 5*time.Second)
				defer stop()
				if resp, err := d.Post(c, n); err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			}()
		}
	}()
	resp, err := d.Post(cctx, body)
	if err != nil {
		return nil, d.CallError("tools/call", m.name, ctx, cctx, err)
	}
	defer resp.Body.Close()
	var final envelope
	mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	switch mt {
	case "application/json":
		b, err := io.ReadAll(io.LimitReader(resp.Body, maxUpstreamMessage+1))
		if err != nil {
			return nil, d.CallError("tools/call", m.name, ctx, cctx, err)
		}
		if len(b) > maxUpstreamMessage {
			answered = true
			return nil, fmt.Errorf("upstream %q: tools/call %q: the answer is larger than %d bytes", m.upstream, m.name, maxUpstreamMessage)
		}
		if err := json.Unmarshal(b, &final); err != nil || !bytes.Equal(final.ID, upID) {
			answered = true
			return nil, fmt.Errorf("upstream %q: tools/call %q: the upstream's answer is not the response to the call", m.upstream, m.name)
		}
	case "text/event-stream":
		found, err := p.readStream(cctx, resp.Body, d, cs, upID, out, &final)
		if err != nil {
			return nil, d.CallError("tools/call", m.name, ctx, cctx, err)
		}
		if !found {
			// Ended without an event id to resume from: as the SDK client
			// says, "request terminated without response".
			return nil, d.CallError("tools/call", m.name, ctx, cctx, errors.New("the upstream ended the call's stream without answering and without an event id to resume from (request terminated without response)"))
		}
	default:
		answered = true
		return nil, fmt.Errorf("upstream %q: tools/call %q: the upstream answered with content type %q", m.upstream, m.name, mt)
	}
	answered = true
	if len(final.Error) > 0 && string(final.Error) != "null" {
		var e jsonrpc.Error
		if err := json.Unmarshal(final.Error, &e); err != nil {
			return nil, fmt.Errorf("upstream %q: tools/call %q: malformed error: %v", m.upstream, m.name, err)
		}
		return nil, &e
	}
	if len(final.Result) == 0 || final.Result[0] != '{' {
		return nil, fmt.Errorf("upstream %q: tools/call %q: the response has no result object", m.upstream, m.name)
	}
	return final.Result, nil
}

// drainWait and maxDrain bound reading the rest of an answered stream.
const (
	drainWait = 50 * time.Millisecond
	maxDrain  = 64 << 10
)

// Stream resumption (SEP-1699) is bounded: at most maxResumes in a row
// without a new event id, at most maxResumesTotal per call, and never
// sooner than minResumeDelay whatever retry the upstream asks for.
const (
	maxResumes      = 5
	maxResumesTotal = 32
	minResumeDelay  = 50 * time.Millisecond
)

// readStream reads the upstream's SSE stream for the call upID until its
// response, relaying what comes first. When the upstream closes the stream
// before answering, having sent event ids, it is resumed from the last one
// after the retry delay the upstream asked for (SEP-1699), as the SDK
// client does. It reports whether the response was found (then in final).
func (p *Proxy) readStream(ctx context.Context, body io.ReadCloser, d *upstream.Direct, cs *clientSession, upID []byte, out *fastWriter, final *envelope) (bool, error) {
	var (
		lastID, prevID string
		retry          = 100 * time.Millisecond
		stalled, total int
	)
	for {
		found, _, err := p.readEvents(ctx, body, d, cs, upID, out, final, &lastID, &retry)
		if found {
			// The upstream ends the stream once it has answered: read to
			// the end, so that the connection goes back to the pool (an
			// unread body closes it), but do not wait on a stream that
			// stays open.
			t := time.AfterFunc(drainWait, func() { body.Close() })
			io.Copy(io.Discard, io.LimitReader(body, maxDrain))
			t.Stop()
		}
		body.Close()
		if found || (err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF)) {
			return found, err
		}
		if lastID == "" {
			return false, nil // nothing to resume from
		}
		if lastID != prevID {
			prevID, stalled = lastID, 0
		}
		stalled++
		if total++; stalled > maxResumes || total > maxResumesTotal {
			return false, fmt.Errorf("the upstream closed the call's stream %d times (%d without a new event) without answering", total, stalled)
		}
		t := time.NewTimer(min(max(retry, minResumeDelay), 5*time.Second))
		select {
		case <-ctx.Done():
			t.Stop()
			return false, ctx.Err()
		case <-t.C:
		}
		resp, rerr := d.Resume(ctx, lastID)
		if rerr != nil {
			return false, rerr
		}
		body = resp.Body
	}
}

// readEvents reads one SSE response body (see readStream); gotEvent is true
// when at least one event with data arrived.
func (p *Proxy) readEvents(ctx context.Context, body io.Reader, d *upstream.Direct, cs *clientSession, upID []byte, out *fastWriter, final *envelope, lastID *string, retry *time.Duration) (found, gotEvent bool, err error) {
	br := bufio.NewReaderSize(body, 16<<10)
	var data []byte
	for {
		line, err := readLine(br)
		if err != nil {
			return false, gotEvent, err
		}
		if len(line) > 0 {
			field, value, _ := bytes.Cut(line, []byte(":"))
			value = bytes.TrimPrefix(value, []byte(" "))
			switch string(field) {
			case "data":
				if len(data) > 0 {
					data = append(data, '\n')
				}
				if len(data)+len(value) > maxUpstreamMessage {
					return false, gotEvent, fmt.Errorf("a message on the upstream's stream is larger than %d bytes", maxUpstreamMessage)
				}
				data = append(data, value...)
			case "id":
				*lastID = string(value)
			case "retry":
				if ms, err := strconv.Atoi(string(value)); err == nil && ms >= 0 {
					*retry = time.Duration(ms) * time.Millisecond
				}
			}
			continue
		}
		if len(data) == 0 {
			continue
		}
		gotEvent = true
		msg := data
		data = nil
		var env envelope
		if err := json.Unmarshal(msg, &env); err != nil {
			return false, gotEvent, fmt.Errorf("the upstream sent a message that is not JSON: %v", err)
		}
		if env.Method == nil && bytes.Equal(env.ID, upID) {
			*final = env
			return true, gotEvent, nil
		}
		// What reaches the client is read strictly, as a client's message
		// is (parseEnvelope), and only if its method is relayed.
		strict, err := parseEnvelope(msg)
		switch {
		case err != nil:
			p.log.Warn("fast path: upstream message refused", "upstream", d.Upstream, "err", err)
			if env.isRequest() {
				postAnswer(d, errorMessage(env.ID, &jsonrpc.Error{Code: jsonrpc.CodeInvalidRequest, Message: "toolgate: refused: " + err.Error()}))
			}
		case strict.Method != nil && !upstreamMethods[*strict.Method]:
			p.refused.methodRefused(nil, "upstream:"+d.Upstream, *strict.Method)
			if strict.isRequest() {
				postAnswer(d, errorMessage(strict.ID, &jsonrpc.Error{Code: jsonrpc.CodeMethodNotFound, Message: fmt.Sprintf("toolgate: %s is not relayed to clients", *strict.Method)}))
			}
		case strict.isRequest():
			p.relayRequest(ctx, d, cs, strict, out)
		case strict.Method != nil && *strict.Method == "notifications/message":
			p.relayLog(cs, strict, out)
		default:
			p.log.Debug("fast path: upstream message not relayed", "upstream", d.Upstream, "method", strict.Method)
		}
	}
}

// readLine reads one line without its line ending; a line longer than
// maxUpstreamMessage is an error.
func readLine(br *bufio.Reader) ([]byte, error) {
	var line []byte
	for {
		chunk, isPrefix, err := br.ReadLine()
		if err != nil {
			return nil, err
		}
		line = append(line, chunk...)
		if len(line) > maxUpstreamMessage {
			return nil, fmt.Errorf("a line on the upstream's stream is longer than %d bytes", maxUpstreamMessage)
		}
		if !isPrefix {
			return line, nil
		}
	}
}

// relayLog passes a log message to the client when its session asked for
// that level (as ServerSession.Log filters on the SDK path).
func (p *Proxy) relayLog(cs *clientSession, env *envelope, out *fastWriter) {
	var params mcp.LoggingMessageParams
	if err := json.Unmarshal(env.Params, &params); err != nil {
		return
	}
	r := p.relay
	r.mu.Lock()
	want, ok := r.levels[cs.ss]
	r.mu.Unlock()
	if !ok || want.level == "" || levelRank(params.Level) < levelRank(want.level) {
		return
	}
	msg, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "method": "notifications/message", "params": &params})
	out.event(msg)
}

// relayRequest handles a request the upstream sent while serving the call:
// ping is answered here; sampling, elicitation and roots go to the client
// when it declared the capability, under an id of the gateway's, and its
// answer is routed back by fastAnswer; anything else is refused.
func (p *Proxy) relayRequest(ctx context.Context, d *upstream.Direct, cs *clientSession, env *envelope, out *fastWriter) {
	method := *env.Method
	answer := func(result any, rpcErr *jsonrpc.Error) {
		var msg []byte
		if rpcErr != nil {
			msg = errorMessage(env.ID, rpcErr)
		} else {
			b, _ := json.Marshal(result)
			msg = resultMessage(env.ID, b)
		}
		postAnswer(d, msg) // in line: a flood of upstream requests is paced by its own answers
	}
	caps := clientCaps(cs.ss)
	switch method {
	case "ping":
		answer(map[string]any{}, nil)
		return
	case "sampling/createMessage":
		var params mcp.CreateMessageWithToolsParams
		if err := json.Unmarshal(env.Params, &params); err != nil {
			answer(nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: err.Error()})
			return
		}
		if caps.Sampling == nil {
			answer(nil, missingCapability(method, "sampling").(*jsonrpc.Error))
			return
		}
		if len(params.Tools) > 0 && caps.Sampling.Tools == nil {
			answer(nil, missingCapability(method, "sampling with tools").(*jsonrpc.Error))
			return
		}
	case "elicitation/create":
		var params mcp.ElicitParams
		if err := json.Unmarshal(env.Params, &params); err != nil {
			answer(nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: err.Error()})
			return
		}
		if caps.Elicitation == nil {
			answer(nil, missingCapability(method, "elicitation").(*jsonrpc.Error))
			return
		}
		url := params.Mode == "url" || (params.Mode == "" && params.URL != "")
		if url && caps.Elicitation.URL == nil {
			answer(nil, missingCapability(method, "url elicitation").(*jsonrpc.Error))
			return
		}
		if url && params.ElicitationID != "" {
			p.relay.mu.Lock()
			p.relay.elicits[params.ElicitationID] = cs.ss
			p.relay.mu.Unlock()
		}
	case "roots/list":
		if caps.RootsV2 == nil {
			answer(nil, missingCapability(method, "roots").(*jsonrpc.Error))
			return
		}
	default:
		answer(nil, &jsonrpc.Error{Code: jsonrpc.CodeMethodNotFound, Message: fmt.Sprintf("toolgate: %s is not relayed to clients", method)})
		return
	}
	id := `"toolgate-` + p.fast.tag + "-" + strconv.FormatUint(p.fast.seq.Add(1), 10) + `"`
	p.fast.mu.Lock()
	p.fast.pending[id] = &pendingRequest{session: cs.ss.ID(), d: d, id: append(json.RawMessage(nil), env.ID...)}
	p.fast.mu.Unlock()
	go func() {
		// Forget it when the call ends unanswered.
		<-ctx.Done()
		p.fast.mu.Lock()
		delete(p.fast.pending, id)
		p.fast.mu.Unlock()
	}()
	msg := append(append(append(append(append([]byte(`{"jsonrpc":"2.0","id":`), id...), `,"method":`...), mustJSON(method)...), `,"params":`...), paramsOrEmpty(env.Params)...)
	msg = append(msg, '}')
	out.asked.Add(1)
	if err := out.event(msg); err != nil {
		answer(nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: fmt.Sprintf("toolgate: %s: the client did not answer: %v", method, err)})
	}
}

func mustJSON(v any) []byte {
	b, _ := json.Marshal(v)
	return b
}

func paramsOrEmpty(p json.RawMessage) []byte {
	if len(p) == 0 {
		return []byte("{}")
	}
	return p
}

// postAnswer posts a response to the upstream's request (best effort: the
// upstream times its request out if it never arrives).
func postAnswer(d *upstream.Direct, msg []byte) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := d.Post(ctx, msg)
	if err != nil {
		return
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
}

// fastAnswer routes a client's response to a relayed request back to the
// upstream that asked; other responses go to the SDK.
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
	var msg []byte
	if len(env.Error) > 0 && string(env.Error) != "null" {
		msg = append(append(append(append([]byte(`{"jsonrpc":"2.0","id":`), pr.id...), `,"error":`...), env.Error...), '}')
	} else {
		msg = resultMessage(pr.id, paramsOrEmpty(env.Result))
	}
	postAnswer(pr.d, msg)
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
