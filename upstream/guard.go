package upstream

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
)

// Limits on what is read from an upstream (Options.MaxResultBytes,
// Options.MaxMessageBytes).
const (
	// DefaultMaxResultBytes bounds an answer to tools/call, resources/read,
	// prompts/get and every other request whose answer is not a list, when
	// Options.MaxResultBytes is 0: 1 MiB, 16 times the default result cap
	// of 64 KiB (adapter.ReadLimit).
	DefaultMaxResultBytes = 1 << 20
	// DefaultMaxMessageBytes bounds every other message when
	// Options.MaxMessageBytes is 0: the answers to initialize and the list
	// methods, and the upstream's own requests and notifications. 16 MiB,
	// the SDK's own bound for one stdio line or SSE event.
	DefaultMaxMessageBytes = 16 << 20
)

// Refusal reasons, passed to Options.OnRefused and used in the
// toolgate_upstream_messages_refused_total metric.
const (
	// RefusedTooLarge: the message was larger than its limit. An answer is
	// replaced by a refusal for its request (an isError result for
	// tools/call, a JSON-RPC error otherwise); a request or notification
	// from the upstream is dropped.
	RefusedTooLarge = "too_large"
	// RefusedMalformed: the message was not one JSON-RPC 2.0 message (not
	// JSON, a batch, a wrong version, no method and no id). It is dropped;
	// on a plain JSON HTTP answer, which can carry nothing else, the
	// request gets a refusal in its place.
	RefusedMalformed = "malformed"
)

// RefusedMetaKey is the _meta key of an isError tools/call result the
// gateway put in place of an upstream's answer it refused: {"reason":
// RefusedTooLarge or RefusedMalformed, "limit": bytes}.
const RefusedMetaKey = "io.toolgate/refused"

// codeRefused is the JSON-RPC error code of a refusal put in place of an
// answer to anything but tools/call (internal error: the upstream's answer
// could not be passed on).
const codeRefused = jsonrpc.CodeInternalError

// maxPending bounds the requests a guard remembers; one it cannot remember
// is answered under the strict result limit.
const maxPending = 1 << 14

// listMethods are the requests whose answers may be as large as
// MaxMessageBytes: the handshake and the catalogs. Every other answer is a
// result, bounded by MaxResultBytes (an allow-list: an unknown method gets
// the strict limit).
var listMethods = map[string]bool{
	"initialize":               true,
	"tools/list":               true,
	"resources/list":           true,
	"resources/templates/list": true,
	"prompts/list":             true,
}

// guard checks every message one upstream session receives before the SDK
// (or the proxy's fast path) sees it: each is one well-formed JSON-RPC
// message within its size limit, or it is refused (logged, counted, and
// replaced or dropped) while the session stays up. It remembers the
// requests sent on the session to know which limit an answer has.
type guard struct {
	name       string
	log        *slog.Logger
	maxResult  *atomic.Int64 // shared with the Manager: SetMaxResultBytes
	maxMessage int
	onRefused  func(name, reason string)
	// received counts the bytes of messages received from the upstream
	// (stdio lines, SSE event data, JSON bodies): a health check whose
	// ping is not answered in time sees whether the upstream is sending.
	received atomic.Int64

	mu      sync.Mutex
	pending map[jsonrpc.ID]string // method of each request sent and not answered
	lists   int                   // pending requests of a list method
	logged  int                   // refusals logged (the first ones, then every 1000th)
}

func newGuard(u *upstream) *guard {
	return &guard{name: u.cfg.Name, log: u.log, maxResult: &u.m.maxResult, maxMessage: u.m.opts.MaxMessageBytes,
		onRefused: u.m.opts.OnRefused, pending: map[jsonrpc.ID]string{}}
}

func (g *guard) resultLimit() int { return int(g.maxResult.Load()) }

// limitFor is the limit of an answer to method ("" when unknown).
func (g *guard) limitFor(method string) int {
	if listMethods[method] {
		return max(g.maxMessage, g.resultLimit())
	}
	return g.resultLimit()
}

// sent notes a message written to the upstream: a request is remembered
// until answered, a cancellation forgets its request. It returns the
// request's id and method when msg is a request with an id.
func (g *guard) sent(msg []byte) (jsonrpc.ID, string, bool) {
	m, err := jsonrpc.DecodeMessage(bytes.TrimSpace(msg))
	if err != nil {
		return jsonrpc.ID{}, "", false
	}
	req, ok := m.(*jsonrpc.Request)
	if !ok {
		return jsonrpc.ID{}, "", false
	}
	if !req.IsCall() {
		if req.Method == "notifications/cancelled" {
			var p struct {
				RequestID any `json:"requestId"`
			}
			if json.Unmarshal(req.Params, &p) == nil {
				if id, err := jsonrpc.MakeID(p.RequestID); err == nil && id.IsValid() {
					g.take(id)
				}
			}
		}
		return jsonrpc.ID{}, "", false
	}
	g.mu.Lock()
	if _, dup := g.pending[req.ID]; !dup && len(g.pending) < maxPending {
		g.pending[req.ID] = req.Method
		if listMethods[req.Method] {
			g.lists++
		}
	}
	g.mu.Unlock()
	return req.ID, req.Method, true
}

// take forgets the request id and returns its method ("" when unknown).
func (g *guard) take(id jsonrpc.ID) string {
	g.mu.Lock()
	defer g.mu.Unlock()
	m, ok := g.pending[id]
	if ok {
		delete(g.pending, id)
		if listMethods[m] {
			g.lists--
		}
	}
	return m
}

// methodOf returns the method of a pending request, or "".
func (g *guard) methodOf(id jsonrpc.ID) string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.pending[id]
}

// unknownLimit bounds a message whose kind is not known yet on a stream
// that carries answers to any pending request: as large as a list's answer
// while a list request is pending, else a result's.
func (g *guard) unknownLimit() int {
	g.mu.Lock()
	lists := g.lists
	g.mu.Unlock()
	if lists > 0 {
		return max(g.maxMessage, g.resultLimit())
	}
	return g.resultLimit()
}

// refuse logs and counts a refused message; head is its first bytes.
func (g *guard) refuse(reason string, size int, head []byte, why string) {
	if g.onRefused != nil {
		g.onRefused(g.name, reason)
	}
	g.mu.Lock()
	g.logged++
	n := g.logged
	g.mu.Unlock()
	if n <= 20 || n%1000 == 0 {
		if len(head) > 80 {
			head = head[:80]
		}
		g.log.Warn("upstream message refused; the session stays up", "reason", reason, "bytes", size, "why", why,
			"head", string(head), "refused", n)
	}
}

// replacement is the message put in place of a refused answer to id, a
// request of method (tools/call: an isError result; anything else: a
// JSON-RPC error), saying what was refused and why.
func (g *guard) replacement(id jsonrpc.ID, method, reason, text string, limit int) []byte {
	data := map[string]any{"reason": reason, "limit": limit}
	var msg *jsonrpc.Response
	if method == "tools/call" {
		res, _ := json.Marshal(map[string]any{
			"content": []any{map[string]any{"type": "text", "text": text}},
			"isError": true,
			"_meta":   map[string]any{RefusedMetaKey: data},
		})
		msg = &jsonrpc.Response{ID: id, Result: res}
	} else {
		d, _ := json.Marshal(data)
		msg = &jsonrpc.Response{ID: id, Error: &jsonrpc.Error{Code: codeRefused, Message: text, Data: d}}
	}
	b, err := jsonrpc.EncodeMessage(msg)
	if err != nil { // cannot happen: every part is ours
		panic(fmt.Sprintf("upstream: encoding a refusal: %v", err))
	}
	return b
}

func (g *guard) tooLarge(id jsonrpc.ID, method string, size, limit int) []byte {
	what := method
	if what == "" {
		what = "a request"
	}
	hint := "Ask the tool for less (a smaller page, range or query); the limit follows Settings.result_max_kib."
	if listMethods[method] {
		hint = "The upstream must page its list in smaller pages."
	}
	text := fmt.Sprintf("toolgate refused upstream %s's answer to %s: it is %d bytes, more than the %d bytes the gateway reads. %s",
		g.name, what, size, limit, hint)
	return g.replacement(id, method, RefusedTooLarge, text, limit)
}

func (g *guard) malformed(id jsonrpc.ID, method string, why string) []byte {
	text := fmt.Sprintf("toolgate refused upstream %s's answer to %s: it is not a JSON-RPC response to the request (%s).", g.name, method, why)
	return g.replacement(id, method, RefusedMalformed, text, g.limitFor(method))
}

// delivered is what a frame passes on: the message as received or a
// refusal in its place (data), and whether it is an answer, to which id.
type delivered struct {
	data   []byte
	answer bool
	id     jsonrpc.ID
}

// errNoMessage: the frame held nothing to pass on (blank, or refused and
// dropped).
var errNoMessage = errors.New("no message")

// frame collects one message (a stdio line, an SSE event's data, a JSON
// body) as its bytes arrive, buffering no more than the message's limit
// allows; past it, the rest is only scanned for the id and method.
type frame struct {
	g *guard
	// call is the request whose stream (an HTTP POST's answer) this is;
	// zero when the stream carries answers to any request (stdio, GET).
	call       jsonrpc.ID
	callMethod string

	buf  []byte
	n    int
	skip bool
	sc   keyScanner
}

// limit is the most the frame may buffer, given what the scanner has seen.
func (f *frame) limit() int {
	switch {
	case f.sc.sawMethod:
		return max(f.g.maxMessage, f.g.resultLimit())
	case f.sc.id != nil:
		if id, ok := parseID(f.sc.id); ok {
			if m := f.g.methodOf(id); m != "" {
				return f.g.limitFor(m)
			}
			if id == f.call && f.call.IsValid() {
				return f.g.limitFor(f.callMethod)
			}
		}
		return f.g.resultLimit()
	case f.call.IsValid():
		return f.g.limitFor(f.callMethod)
	default:
		return f.g.unknownLimit()
	}
}

// write adds the next bytes of the message.
func (f *frame) write(p []byte) {
	f.n += len(p)
	f.g.received.Add(int64(len(p)))
	f.sc.feed(p)
	if f.skip {
		return
	}
	if len(f.buf)+len(p) > f.limit() {
		f.skip, f.buf = true, nil
		return
	}
	f.buf = append(f.buf, p...)
}

// end finishes the message and says what to pass on; errNoMessage when
// nothing. The frame is ready for the next message.
func (f *frame) end() (delivered, error) {
	defer func() {
		f.buf, f.n, f.skip = nil, 0, false
		f.sc.reset()
	}()
	g := f.g
	if f.skip {
		if f.sc.sawMethod {
			g.refuse(RefusedTooLarge, f.n, nil, "a request or notification larger than its limit")
			return delivered{}, errNoMessage
		}
		id, ok := parseID(f.sc.id)
		if !ok && f.call.IsValid() {
			id, ok = f.call, true
		}
		if !ok {
			g.refuse(RefusedTooLarge, f.n, nil, "a message without an id larger than its limit")
			return delivered{}, errNoMessage
		}
		m := g.take(id)
		if m == "" && id == f.call {
			m = f.callMethod
		}
		limit := g.limitFor(m)
		g.refuse(RefusedTooLarge, f.n, nil, fmt.Sprintf("an answer to %s larger than %d bytes", orRequest(m), limit))
		return delivered{data: g.tooLarge(id, m, f.n, limit), answer: true, id: id}, nil
	}
	data := bytes.TrimSpace(f.buf)
	if len(data) == 0 {
		return delivered{}, errNoMessage
	}
	if data[0] != '{' {
		g.refuse(RefusedMalformed, f.n, data, "not a JSON object (batches are not part of protocol "+ProtocolVersion+")")
		return delivered{}, errNoMessage
	}
	msg, err := jsonrpc.DecodeMessage(data)
	if err != nil {
		g.refuse(RefusedMalformed, f.n, data, err.Error())
		return delivered{}, errNoMessage
	}
	resp, ok := msg.(*jsonrpc.Response)
	if !ok {
		return delivered{data: data}, nil
	}
	m := g.take(resp.ID)
	if m == "" && resp.ID == f.call {
		m = f.callMethod
	}
	if limit := g.limitFor(m); len(data) > limit {
		g.refuse(RefusedTooLarge, f.n, nil, fmt.Sprintf("an answer to %s larger than %d bytes", orRequest(m), limit))
		return delivered{data: g.tooLarge(resp.ID, m, len(data), limit), answer: true, id: resp.ID}, nil
	}
	return delivered{data: data, answer: true, id: resp.ID}, nil
}

func orRequest(method string) string {
	if method == "" {
		return "a request"
	}
	return method
}

// parseID reads a raw JSON id (a string or a number) as the SDK does.
func parseID(raw []byte) (jsonrpc.ID, bool) {
	if len(raw) == 0 {
		return jsonrpc.ID{}, false
	}
	msg := make([]byte, 0, len(raw)+40)
	msg = append(msg, `{"jsonrpc":"2.0","id":`...)
	msg = append(msg, raw...)
	msg = append(msg, `,"result":{}}`...)
	m, err := jsonrpc.DecodeMessage(msg)
	if err != nil {
		return jsonrpc.ID{}, false
	}
	r, ok := m.(*jsonrpc.Response)
	if !ok || !r.ID.IsValid() {
		return jsonrpc.ID{}, false
	}
	return r.ID, true
}
