package upstream

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"
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
// and 202 is returned as an error (404: the session is gone, which has the
// supervisor check and restart it).
func (d *Direct) Post(ctx context.Context, body []byte) (*http.Response, error) {
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
		d.c.suspect()
		return nil, fmt.Errorf("%w: the upstream no longer knows session %s (HTTP 404): %s", ErrDown, d.SessionID, bytes.TrimSpace(msg))
	}
	return nil, fmt.Errorf("the upstream answered HTTP %d: %s", resp.StatusCode, bytes.TrimSpace(msg))
}

// Resume reopens a call's SSE stream that the upstream closed before
// answering (SEP-1699): a GET with Last-Event-ID, as the SDK client does.
// The caller reads and closes the response body.
func (d *Direct) Resume(ctx context.Context, lastEventID string) (*http.Response, error) {
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
