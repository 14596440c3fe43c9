// Package mcptool is the executor of tools whose source is an upstream MCP
// server: the one forwarder of a tools/call, whichever entry point the call
// came through (the MCP proxy's two transports, the JSON API, the CLI, the
// Go library). It posts the call on the session the upstream Manager keeps
// (the direct client for a Streamable HTTP upstream, or the SDK session),
// relays what the upstream sends while serving the call to the caller
// through a Relay, marks failures that are worth another attempt, and
// measures every call once (docs/design.md, "Where a call goes").
//
// The package decides nothing: package gate runs it for a call the
// decision core allowed.
package mcptool

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolgate/toolgate/adapter"
	"github.com/toolgate/toolgate/upstream"
)

// ErrClientAsked marks a failed attempt during which the upstream asked the
// caller's client for input (sampling, elicitation, roots): such an attempt
// is never retried, so nobody is asked the same thing twice.
var ErrClientAsked = errors.New("the client was asked for input during the attempt, so the call is not retried")

// ErrNoUpstreams is a call's error when the gateway fronts no upstream.
var ErrNoUpstreams = errors.New("no upstream MCP servers are configured")

// Relay is the caller's side of one call: the channel back to the client for
// what the upstream sends while it serves the call. The enforcement point
// that received the call provides it (the MCP proxy); nil means the caller
// cannot be reached (the JSON API, the CLI): the upstream's requests are
// then refused and its notifications dropped.
type Relay interface {
	// Track registers one attempt on upstream up before it is sent, so
	// that what the upstream sends about it outside the call's own stream
	// (through the SDK session every client shares) is attributed to this
	// caller, or refused when it cannot be, never misrouted. meta is the
	// client's _meta (its progress token); send is what the call carries
	// upstream (the token may be replaced). Call end when the attempt's
	// answer is in.
	Track(ctx context.Context, up string, meta mcp.Meta) (send mcp.Meta, end func())
	// Stream handles what the upstream sends on the call's own stream
	// (the direct client); nil when this caller's transport cannot carry
	// it, and then the SDK session is used.
	Stream() upstream.OnMessage
	// Asked is how many times the client has been asked for input
	// (sampling, elicitation, roots) on behalf of this call so far.
	Asked() int
}

// Observer measures upstream calls; *metrics.Metrics implements it.
type Observer interface {
	// UpstreamCall is called once per attempt with its outcome ("ok",
	// "tool_error", "error") and duration.
	UpstreamCall(upstream, outcome string, took time.Duration)
}

// Executor forwards tools/call requests to upstream MCP servers. Set its
// fields before use; they are not changed afterwards.
type Executor struct {
	// Upstreams are the connected upstream servers; nil means none.
	Upstreams *upstream.Manager
	// Observer, when set, measures every attempt.
	Observer Observer
}

// Call is one tools/call to forward.
type Call struct {
	// Upstream is the upstream's name; Tool its own name for the tool
	// (without the gateway's tool_prefix).
	Upstream, Tool string
	// Args are the arguments that were decided, as canonical JSON: what
	// the upstream gets (never the client's own bytes).
	Args json.RawMessage
	// Meta is the client's _meta for the call (a progress token), without
	// the gateway's own namespace; nil for none.
	Meta mcp.Meta
	// Relay reaches the caller; nil for none.
	Relay Relay
}

// Result is one attempt's answer: the upstream's result as sent (Raw, on
// the direct client) or decoded (Tool, on the SDK session).
type Result struct {
	Tool *mcp.CallToolResult
	Raw  json.RawMessage
}

// Run makes one attempt of c. A stream-capable caller of a Streamable HTTP
// upstream gets the direct client (the call's bytes posted on the kept
// session, what comes before the result relayed on the caller's stream);
// any other call goes through the SDK session. Errors wrapping
// upstream.ErrDown or upstream.ErrCallTimeout are marked transient (retried
// where the tool's class allows), unless the client was asked for input
// during the attempt (ErrClientAsked). A JSON-RPC error of the upstream is
// returned as *jsonrpc.Error.
func (e *Executor) Run(ctx context.Context, c Call) (Result, error) {
	if e == nil || e.Upstreams == nil {
		return Result{}, ErrNoUpstreams
	}
	asked := 0
	if c.Relay != nil {
		asked = c.Relay.Asked()
	}
	start := time.Now()
	res, err := e.run(ctx, c)
	if err != nil && c.Relay != nil && c.Relay.Asked() > asked {
		err = fmt.Errorf("%w (%w)", err, ErrClientAsked)
	}
	if e.Observer != nil {
		outcome := "ok"
		switch {
		case err != nil:
			outcome = "error"
		case res.Tool != nil && res.Tool.IsError, res.Raw != nil && bytes.Contains(res.Raw, []byte(`"isError":true`)):
			outcome = "tool_error"
		}
		e.Observer.UpstreamCall(c.Upstream, outcome, time.Since(start))
	}
	if err != nil && !errors.Is(err, ErrClientAsked) && (errors.Is(err, upstream.ErrDown) || errors.Is(err, upstream.ErrCallTimeout)) {
		err = adapter.Transient(err)
	}
	return res, err
}

func (e *Executor) run(ctx context.Context, c Call) (Result, error) {
	var stream upstream.OnMessage
	if c.Relay != nil {
		stream = c.Relay.Stream()
	}
	if stream != nil {
		d, err := e.Upstreams.Direct(c.Upstream)
		switch {
		case err == nil:
			if c.Relay != nil {
				// What the upstream sends outside the call's stream (a
				// server that answers with JSON) is attributed too.
				_, end := c.Relay.Track(ctx, c.Upstream, nil)
				defer end()
			}
			var meta json.RawMessage
			if len(c.Meta) > 0 {
				// On the call's own stream the client's progress token
				// needs no replacing: nothing else shares the stream.
				if meta, err = json.Marshal(c.Meta); err != nil {
					return Result{}, fmt.Errorf("tools/call %q: _meta: %w", c.Tool, err)
				}
			}
			raw, err := d.Call(ctx, c.Tool, c.Args, meta, stream)
			return Result{Raw: raw}, err
		case !errors.Is(err, upstream.ErrNotDirect):
			return Result{}, fmt.Errorf("%w (tools/call %q)", err, c.Tool)
		}
	}
	meta := c.Meta
	if c.Relay != nil {
		var end func()
		meta, end = c.Relay.Track(ctx, c.Upstream, c.Meta)
		defer end()
	}
	res, err := e.Upstreams.CallTool(ctx, c.Upstream, &mcp.CallToolParams{Name: c.Tool, Arguments: c.Args, Meta: meta})
	return Result{Tool: res}, err
}

// OwnMetaPrefix is the gateway's own _meta namespace: what an upstream finds
// there comes from the gateway, never from a client posing as it, and what
// a client finds there never from an upstream.
const OwnMetaPrefix = "io.toolgate/"

// WithoutOwnMeta is meta without the keys of the gateway's own namespace
// (OwnMetaPrefix) except keep; meta itself when it holds none.
func WithoutOwnMeta(meta mcp.Meta, keep ...string) mcp.Meta {
	has := false
	for k := range meta {
		if strings.HasPrefix(k, OwnMetaPrefix) && !contains(keep, k) {
			has = true
			break
		}
	}
	if !has {
		return meta
	}
	out := mcp.Meta{}
	for k, v := range meta {
		if !strings.HasPrefix(k, OwnMetaPrefix) || contains(keep, k) {
			out[k] = v
		}
	}
	return out
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
