package upstream

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
)

// ErrNotDirect: the upstream cannot be posted to directly (it is a stdio
// server); use the Manager's SDK session.
var ErrNotDirect = errors.New("upstream session cannot be posted to directly")

// Direct is the live session of a streamable-http upstream, for a caller
// that writes the JSON-RPC messages itself: the MCP proxy's fast path posts
// a tools/call's bytes on the session the Manager keeps, with no SDK client
// in between (issue 3: parse the envelope once and forward bytes). It is
// good for one call; take a new one for the next (the session may have been
// replaced by a restart).
type Direct struct {
	// Upstream is the upstream's name.
	Upstream string
	// SessionID is the upstream's Mcp-Session-Id for this session; "" for
	// a stateless server (no header is sent).
	SessionID string
	// ProtocolVersion is the version negotiated at initialize, sent as
	// Mcp-Protocol-Version.
	ProtocolVersion string
	// Timeout is the upstream's per-call timeout (Config.CallTimeout).
	Timeout time.Duration

	u *upstream
	c *conn
}

// Direct returns the named upstream's live session for direct posting. It
// fails with ErrUnknownUpstream, ErrDown, ErrClosed, or ErrNotDirect for a
// stdio upstream.
func (m *Manager) Direct(name string) (*Direct, error) {
	u, err := m.lookup(name)
	if err != nil {
		return nil, err
	}
	cs, c, err := u.session()
	if err != nil {
		return nil, err
	}
	if c.httpClient == nil {
		return nil, fmt.Errorf("upstream %q: %w", name, ErrNotDirect)
	}
	pv := ProtocolVersion
	if r := cs.InitializeResult(); r != nil && r.ProtocolVersion != "" {
		pv = r.ProtocolVersion
	}
	return &Direct{Upstream: name, SessionID: cs.ID(), ProtocolVersion: pv, Timeout: u.cfg.callTimeout(), u: u, c: c}, nil
}

// WithTimeout derives the context of one call from the caller's: bounded
// by Timeout, with ErrCallTimeout as the cause when that bound is hit.
func (d *Direct) WithTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeoutCause(ctx, d.Timeout, ErrCallTimeout)
}

// Post sends one JSON-RPC message (a request, a notification, or a response
// to the upstream's own request) on the session, with the headers the
// streamable HTTP transport requires and the upstream's configured ones.
// The caller reads and closes the response body. A status other than 200
// and 202 is returned as an error (404: the session is gone, wrapping
// ErrDown). Every failure but the caller's cancellation (a network error, a
// timeout, such a status) has the session checked at once
// (Options.HealthInterval), which restarts it if it is gone.
func (d *Direct) Post(ctx context.Context, body []byte) (*http.Response, error) {
	resp, err := d.post(ctx, body)
	if failed(ctx, err) {
		d.c.suspect()
	}
	return resp, err
}

func (d *Direct) post(ctx context.Context, body []byte) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, d.c.endpoint, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	d.setSession(req)
	resp, err := d.c.httpClient.Do(req)
	if err != nil {
		return nil, err
	}
	switch resp.StatusCode {
	case http.StatusOK, http.StatusAccepted:
		return resp, nil
	}
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound && d.SessionID != "" {
		return nil, fmt.Errorf("%w: the upstream no longer knows session %s (HTTP 404): %s", ErrDown, d.SessionID, bytes.TrimSpace(msg))
	}
	return nil, fmt.Errorf("the upstream answered HTTP %d: %s", resp.StatusCode, bytes.TrimSpace(msg))
}

// Resume reopens a call's SSE stream that the upstream closed before
// answering (SEP-1699): a GET with Last-Event-ID, as the SDK client does.
// The caller reads and closes the response body. A failure has the
// session checked as for Post.
func (d *Direct) Resume(ctx context.Context, lastEventID string) (*http.Response, error) {
	resp, err := d.resume(ctx, lastEventID)
	if failed(ctx, err) {
		d.c.suspect()
	}
	return resp, err
}

func (d *Direct) resume(ctx context.Context, lastEventID string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, d.c.endpoint, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "text/event-stream")
	d.setSession(req)
	req.Header.Set("Last-Event-ID", lastEventID)
	resp, err := d.c.httpClient.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		resp.Body.Close()
		return nil, fmt.Errorf("resuming the stream after event %s: the upstream answered HTTP %d: %s", lastEventID, resp.StatusCode, bytes.TrimSpace(msg))
	}
	return resp, nil
}

func (d *Direct) setSession(req *http.Request) {
	if d.SessionID != "" {
		req.Header.Set("Mcp-Session-Id", d.SessionID)
	}
	req.Header.Set("Mcp-Protocol-Version", d.ProtocolVersion)
}

// CallError classifies an error of a direct call as CallTool does: ctx is
// the caller's context, cctx the one WithTimeout gave. The result wraps
// ErrCallTimeout, ErrDown (the connection was lost; the supervisor is asked
// to check it) or ErrClosed, or is the caller's own context error.
func (d *Direct) CallError(method, tool string, ctx, cctx context.Context, err error) error {
	if errors.Is(err, ErrDown) {
		return fmt.Errorf("upstream %q: %s %q: %w", d.Upstream, method, tool, err)
	}
	return d.u.callError(d.c, method, tool, ctx, cctx, d.Timeout, err)
}

// directSeq numbers the requests the gateway posts directly, so each has an
// id of its own on the upstream's session ("toolgate-N": a string, never
// one of the ids the SDK client's own requests use).
var directSeq atomic.Uint64

// maxDirectMessage bounds one message read on a direct call; the guard
// below Direct (guard.go) refuses a larger answer first.
const maxDirectMessage = 64 << 20

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

// OnMessage handles one message an upstream sends on a direct call's
// stream before the call's response: a request of its own (sampling,
// elicitation, roots; ping is answered by Call itself) or a notification
// (a log message, progress). msg is the message as sent; reply posts a
// response to a request back to the upstream (the caller builds it with
// the request's id) and may be called at most once, from any goroutine.
type OnMessage func(ctx context.Context, msg []byte, reply func(response []byte))

// directEnvelope is what Call reads of a message on its stream.
type directEnvelope struct {
	ID     json.RawMessage `json:"id"`
	Method *string         `json:"method"`
	Result json.RawMessage `json:"result"`
	Error  json.RawMessage `json:"error"`
}

// Call posts a tools/call of the upstream's tool name with args (a JSON
// object; empty means {}) and meta (its _meta, a JSON object; empty means
// none) on the session and returns the "result" member
// of the upstream's response, as sent. What the upstream sends on the
// call's stream before the response goes to onMessage (nil: its requests
// are refused and its notifications dropped); ping is answered here. A
// stream the upstream closes before answering is resumed with
// Last-Event-ID (SEP-1699), boundedly. When the call ends unanswered
// (cancelled, timed out) the upstream is sent notifications/cancelled.
//
// Errors: a JSON-RPC error of the upstream as *jsonrpc.Error; otherwise
// errors classified as CallError does (ErrCallTimeout, ErrDown, ErrClosed,
// the caller's context error) or describing a malformed answer.
func (d *Direct) Call(ctx context.Context, name string, args, meta json.RawMessage, onMessage OnMessage) (json.RawMessage, error) {
	cctx, cancel := d.WithTimeout(ctx)
	defer cancel()
	upID := []byte(`"toolgate-` + strconv.FormatUint(directSeq.Add(1), 10) + `"`)
	qname, _ := json.Marshal(name)
	if len(args) == 0 {
		args = json.RawMessage("{}")
	}
	body := make([]byte, 0, 80+len(qname)+len(args)+len(meta))
	body = append(body, `{"jsonrpc":"2.0","id":`...)
	body = append(body, upID...)
	body = append(body, `,"method":"tools/call","params":{"name":`...)
	body = append(body, qname...)
	body = append(body, `,"arguments":`...)
	body = append(body, args...)
	if len(meta) > 0 {
		body = append(body, `,"_meta":`...)
		body = append(body, meta...)
	}
	body = append(body, `}}`...)

	answered := false
	defer func() {
		if !answered {
			// Cancelled or timed out: tell the upstream, as the SDK would.
			n := []byte(`{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":` + string(upID) + `,"reason":"cancelled by the gateway"}}`)
			go d.postQuietly(n)
		}
	}()
	resp, err := d.Post(cctx, body)
	if err != nil {
		return nil, d.CallError("tools/call", name, ctx, cctx, err)
	}
	defer resp.Body.Close()
	var final directEnvelope
	mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	switch mt {
	case "application/json":
		b, err := io.ReadAll(io.LimitReader(resp.Body, maxDirectMessage+1))
		if err != nil {
			return nil, d.CallError("tools/call", name, ctx, cctx, err)
		}
		if len(b) > maxDirectMessage {
			answered = true
			return nil, fmt.Errorf("upstream %q: tools/call %q: the answer is larger than %d bytes", d.Upstream, name, maxDirectMessage)
		}
		if err := json.Unmarshal(b, &final); err != nil || !bytes.Equal(final.ID, upID) {
			answered = true
			return nil, fmt.Errorf("upstream %q: tools/call %q: the upstream's answer is not the response to the call", d.Upstream, name)
		}
	case "text/event-stream":
		found, err := d.readStream(cctx, resp.Body, upID, onMessage, &final)
		if err != nil {
			return nil, d.CallError("tools/call", name, ctx, cctx, err)
		}
		if !found {
			// Ended without an event id to resume from: as the SDK client
			// says, "request terminated without response".
			return nil, d.CallError("tools/call", name, ctx, cctx, errors.New("the upstream ended the call's stream without answering and without an event id to resume from (request terminated without response)"))
		}
	default:
		answered = true
		return nil, fmt.Errorf("upstream %q: tools/call %q: the upstream answered with content type %q", d.Upstream, name, mt)
	}
	answered = true
	if len(final.Error) > 0 && string(final.Error) != "null" {
		var e jsonrpc.Error
		if err := json.Unmarshal(final.Error, &e); err != nil {
			return nil, fmt.Errorf("upstream %q: tools/call %q: malformed error: %v", d.Upstream, name, err)
		}
		return nil, &e
	}
	if len(final.Result) == 0 || final.Result[0] != '{' {
		return nil, fmt.Errorf("upstream %q: tools/call %q: the response has no result object", d.Upstream, name)
	}
	return final.Result, nil
}

// Reply posts a response to one of the upstream's own requests (best
// effort: the upstream times its request out if it never arrives).
func (d *Direct) Reply(response []byte) { d.postQuietly(response) }

func (d *Direct) postQuietly(msg []byte) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := d.Post(ctx, msg)
	if err != nil {
		return
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
}

// readStream reads the upstream's SSE stream for the call upID until its
// response, handing what comes first to onMessage. When the upstream
// closes the stream before answering, having sent event ids, it is resumed
// from the last one after the retry delay the upstream asked for
// (SEP-1699), as the SDK client does. It reports whether the response was
// found (then in final).
func (d *Direct) readStream(ctx context.Context, body io.ReadCloser, upID []byte, onMessage OnMessage, final *directEnvelope) (bool, error) {
	var (
		lastID, prevID string
		retry          = 100 * time.Millisecond
		stalled, total int
	)
	for {
		found, err := d.readEvents(ctx, body, upID, onMessage, final, &lastID, &retry)
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

// readEvents reads one SSE response body (see readStream).
func (d *Direct) readEvents(ctx context.Context, body io.Reader, upID []byte, onMessage OnMessage, final *directEnvelope, lastID *string, retry *time.Duration) (found bool, err error) {
	br := bufio.NewReaderSize(body, 16<<10)
	var data []byte
	for {
		line, err := readLine(br)
		if err != nil {
			return false, err
		}
		if len(line) > 0 {
			field, value, _ := bytes.Cut(line, []byte(":"))
			value = bytes.TrimPrefix(value, []byte(" "))
			switch string(field) {
			case "data":
				if len(data) > 0 {
					data = append(data, '\n')
				}
				if len(data)+len(value) > maxDirectMessage {
					return false, fmt.Errorf("a message on the upstream's stream is larger than %d bytes", maxDirectMessage)
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
		msg := data
		data = nil
		var env directEnvelope
		if err := json.Unmarshal(msg, &env); err != nil {
			return false, fmt.Errorf("the upstream sent a message that is not JSON: %v", err)
		}
		if env.Method == nil && bytes.Equal(env.ID, upID) {
			*final = env
			return true, nil
		}
		isRequest := env.Method != nil && len(env.ID) > 0 && string(env.ID) != "null"
		switch {
		case isRequest && *env.Method == "ping":
			// Answered in line: a flood of pings is paced by its answers.
			d.postQuietly(directResult(env.ID, []byte("{}")))
		case onMessage != nil:
			onMessage(ctx, msg, d.Reply)
		case isRequest:
			d.postQuietly(directError(env.ID, jsonrpc.CodeMethodNotFound, "toolgate: "+*env.Method+" is not relayed to this caller"))
		}
	}
}

// directResult is a JSON-RPC response to id carrying result.
func directResult(id json.RawMessage, result []byte) []byte {
	msg := make([]byte, 0, 40+len(id)+len(result))
	msg = append(msg, `{"jsonrpc":"2.0","id":`...)
	msg = append(msg, id...)
	msg = append(msg, `,"result":`...)
	msg = append(msg, result...)
	return append(msg, '}')
}

func directError(id json.RawMessage, code int64, message string) []byte {
	e, _ := json.Marshal(map[string]any{"code": code, "message": message})
	return append(append(append(append([]byte(`{"jsonrpc":"2.0","id":`), id...), `,"error":`...), e...), '}')
}

// readLine reads one line without its line ending; a line longer than
// maxDirectMessage is an error.
func readLine(br *bufio.Reader) ([]byte, error) {
	var line []byte
	for {
		chunk, isPrefix, err := br.ReadLine()
		if err != nil {
			return nil, err
		}
		line = append(line, chunk...)
		if len(line) > maxDirectMessage {
			return nil, fmt.Errorf("a line on the upstream's stream is longer than %d bytes", maxDirectMessage)
		}
		if !isPrefix {
			return line, nil
		}
	}
}
