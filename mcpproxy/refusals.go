package mcpproxy

// Refused requests that never reach a decision — failed authentication,
// methods the gateway does not serve — are logged, counted and audited,
// without letting a flood fill the log or the audit log, and without
// dropping any silently.

import (
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/toolgate/toolgate"
	"github.com/toolgate/toolgate/gate"
	"github.com/toolgate/toolgate/identity"
)

// AuthFailuresTotal is the counter of failed authentications, by reason.
const AuthFailuresTotal = "toolgate_auth_failures_total"

// RequestsRefusedTotal is the counter of requests refused at the edge,
// before anything was decided (a refused origin, a body too large or not
// JSON-RPC, a batch, an unknown or foreign session, a session cap), by
// HTTP status and reason.
const RequestsRefusedTotal = "toolgate_requests_refused_total"

// MethodsRefusedTotal is the counter of MCP messages refused because their
// method is not one the gateway serves or relays, by direction
// ("client" or "upstream").
const MethodsRefusedTotal = "toolgate_mcp_methods_refused_total"

// RefusalWindow is how long the refusals of one kind, reason and source
// address are summarized: the first is logged and audited at once, the
// others of the window as one line and one event with their count and the
// times of the first and the last. A variable for tests.
var RefusalWindow = time.Minute

// maxRefusalKeys bounds the (kind, reason, source) combinations summarized
// at once; past it, refusals from new sources are summarized under the
// source "other" (counted, never dropped).
const maxRefusalKeys = 1024

type refusalKey struct {
	event  toolgate.EventType
	reason string // identity.AuthMissing..., or the refused method
	source string // the client's IP address, or "other"
	via    string // "mcp", "http", or "upstream:<name>"
	// principal and agent name who was refused, where the refusal is
	// about an authority (a session cap); "" otherwise.
	principal, agent string
}

type refusalWindow struct {
	n           int // refusals after the first of the window
	first, last time.Time
	timer       *time.Timer
}

// refusals is the rate-limited recorder of one Proxy.
type refusals struct {
	log     *slog.Logger
	record  func(gate.Refusal) // nil: no audit log
	auth    *prometheus.CounterVec
	method  *prometheus.CounterVec
	request *prometheus.CounterVec

	mu   sync.Mutex
	open map[refusalKey]*refusalWindow
}

func newRefusals(log *slog.Logger, record func(gate.Refusal)) *refusals {
	r := &refusals{log: log, record: record, open: map[refusalKey]*refusalWindow{},
		auth: prometheus.NewCounterVec(prometheus.CounterOpts{Name: AuthFailuresTotal,
			Help: "Failed authentications on /mcp and the JSON API, by reason (missing_credential, malformed_authorization, unknown_api_key, invalid_token)."},
			[]string{"reason"}),
		method: prometheus.NewCounterVec(prometheus.CounterOpts{Name: MethodsRefusedTotal,
			Help: "MCP messages refused because the gateway does not serve or relay their method, by direction (client: sent by a client; upstream: sent by an upstream)."},
			[]string{"direction"}),
		request: prometheus.NewCounterVec(prometheus.CounterOpts{Name: RequestsRefusedTotal,
			Help: "Requests refused at the edge before anything was decided (origin, body, batch, session, caps), by HTTP status and reason."},
			[]string{"status", "reason"}),
	}
	for _, reason := range []string{identity.AuthMissing, identity.AuthMalformed, identity.AuthUnknownKey, identity.AuthInvalidToken} {
		r.auth.WithLabelValues(reason)
	}
	r.method.WithLabelValues("client")
	r.method.WithLabelValues("upstream")
	return r
}

// sourceOf is the client's address without its port.
func sourceOf(r *http.Request) string {
	if r == nil {
		return ""
	}
	if h, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		return h
	}
	return r.RemoteAddr
}

// authFailed records one failed authentication of request r, answered on
// via ("mcp" or "http").
func (rf *refusals) authFailed(r *http.Request, via string, err error) {
	reason := identity.AuthReason(err)
	rf.auth.WithLabelValues(reason).Inc()
	rf.note(refusalKey{event: toolgate.EventAuthRefused, reason: reason, source: sourceOf(r), via: via})
}

// methodRefused records one refused method: from a client (r set, via
// "mcp") or an upstream (r nil, via "upstream:<name>").
func (rf *refusals) methodRefused(r *http.Request, via, method string) {
	dir := "client"
	if r == nil {
		dir = "upstream"
	}
	rf.method.WithLabelValues(dir).Inc()
	rf.note(refusalKey{event: toolgate.EventMethodRefused, reason: clipName(method), source: sourceOf(r), via: via})
}

func clipName(s string) string {
	if len(s) <= 128 {
		return s
	}
	return fmt.Sprintf("%.128s…[%d bytes]", s, len(s))
}

// requestRefused records one request refused at the edge with HTTP status
// and reason (a short code such as "batch" or "body_too_large", or the
// status text when the SDK refused it).
func (rf *refusals) requestRefused(r *http.Request, via string, status int, reason string) {
	if reason == "" {
		reason = strings.ToLower(strings.ReplaceAll(http.StatusText(status), " ", "_"))
	}
	rf.request.WithLabelValues(strconv.Itoa(status), reason).Inc()
	rf.note(refusalKey{event: toolgate.EventRequestRefused, reason: reason, source: sourceOf(r), via: fmt.Sprintf("%s %d", via, status)})
}

// sessionCapRefused records an initialize that a session cap refused
// (sessions.go) with HTTP status and reason, for identity id: counted
// like every request refused at the edge, and summarized per reason,
// source and authority.
func (rf *refusals) sessionCapRefused(r *http.Request, status int, reason string, id gate.Identity) {
	rf.request.WithLabelValues(strconv.Itoa(status), reason).Inc()
	k := refusalKey{event: toolgate.EventRequestRefused, reason: reason, source: sourceOf(r), via: fmt.Sprintf("mcp %d", status)}
	if !id.Anonymous {
		k.principal, k.agent = clipName(id.Principal), clipName(id.AgentID)
	}
	rf.note(k)
}

// note writes the first refusal of a window at once and counts the rest.
func (rf *refusals) note(k refusalKey) {
	now := time.Now()
	rf.mu.Lock()
	w := rf.open[k]
	if w == nil && len(rf.open) >= maxRefusalKeys {
		k.source, k.principal, k.agent = "other", "", ""
		w = rf.open[k]
	}
	if w != nil {
		if w.n == 0 {
			w.first = now
		}
		w.n++
		w.last = now
		rf.mu.Unlock()
		return
	}
	w = &refusalWindow{}
	rf.open[k] = w
	w.timer = time.AfterFunc(RefusalWindow, func() { rf.flush(k, w) })
	rf.mu.Unlock()
	rf.emit(k, 1, now, now)
}

// flush ends key k's window w, writing the summary of what it counted.
func (rf *refusals) flush(k refusalKey, w *refusalWindow) {
	rf.mu.Lock()
	if rf.open[k] != w {
		rf.mu.Unlock()
		return
	}
	delete(rf.open, k)
	n, first, last := w.n, w.first, w.last
	rf.mu.Unlock()
	if n > 0 {
		rf.emit(k, n, first, last)
	}
}

// Flush writes the summaries of every open window now (at shutdown, so
// that nothing counted is lost).
func (rf *refusals) Flush() {
	rf.mu.Lock()
	open := rf.open
	rf.open = map[refusalKey]*refusalWindow{}
	rf.mu.Unlock()
	for k, w := range open {
		w.timer.Stop()
		if w.n > 0 {
			rf.emit(k, w.n, w.first, w.last)
		}
	}
}

// emit writes one log line and one audit event for n refusals of key k
// between first and last.
func (rf *refusals) emit(k refusalKey, n int, first, last time.Time) {
	var what, msg string
	switch k.event {
	case toolgate.EventAuthRefused:
		what = "authentication refused"
		msg = fmt.Sprintf("authentication refused on %s from %s: %s", k.via, k.source, k.reason)
	case toolgate.EventRequestRefused:
		what = "request refused"
		msg = fmt.Sprintf("request refused on %s from %s: %s", k.via, k.source, k.reason)
		if k.principal != "" {
			msg += fmt.Sprintf(" (principal %s, agent %s)", k.principal, k.agent)
		}
	default:
		what = "method refused"
		msg = fmt.Sprintf("%s refused on %s from %s: the gateway does not serve or relay this method", k.reason, k.via, k.source)
	}
	if n > 1 {
		msg = fmt.Sprintf("%s (%d times between %s and %s)", msg, n, first.UTC().Format(time.RFC3339Nano), last.UTC().Format(time.RFC3339Nano))
	}
	attrs := []any{"reason", k.reason, "source", k.source, "via", k.via, "count", n,
		"first", first.UTC().Format(time.RFC3339Nano), "last", last.UTC().Format(time.RFC3339Nano)}
	if k.principal != "" {
		attrs = append(attrs, "principal", k.principal, "agent_id", k.agent)
	}
	rf.log.Warn(what, attrs...)
	if rf.record == nil {
		return
	}
	code := k.reason
	if k.event == toolgate.EventMethodRefused {
		code = "method_not_found"
	}
	if k.event == toolgate.EventRequestRefused {
		code = "request_refused"
	}
	details := map[string]any{"reason": k.reason, "source": k.source, "via": k.via, "count": n,
		"first": first.UTC().Format(time.RFC3339Nano), "last": last.UTC().Format(time.RFC3339Nano)}
	if k.principal != "" {
		details["principal"], details["agent_id"] = k.principal, k.agent
	}
	rf.record(gate.Refusal{Type: k.event, At: first, Code: code, Reason: msg, Details: details})
}

// statusWriter remembers the status of an answer, so that every request
// refused at the edge is recorded once, whoever refused it (the guard, or
// the SDK: an unknown or foreign session, a method it does not allow).
type statusWriter struct {
	http.ResponseWriter
	status int
	// reason names why the guard refused the request (a short code); ""
	// for the SDK's refusals, named by their status.
	reason string
	// recorded is set when the refusal was recorded already (failed
	// authentication, a refused method).
	recorded bool
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Flush flushes the answer (SSE streams).
func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap gives http.ResponseController the underlying writer.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// refuse marks the answer as the guard's refusal for reason.
func (w *statusWriter) refuse(reason string) *statusWriter {
	w.reason = reason
	return w
}

// RequestRefused records a request another handler (the JSON API) refused
// before anything was decided: logged, counted and audited like the MCP
// endpoint's, rate-limited per reason and source.
func (p *Proxy) RequestRefused(r *http.Request, via string, status int, reason string) {
	p.refused.requestRefused(r, via, status, reason)
}
