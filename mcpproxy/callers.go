package mcpproxy

// How what an upstream sends while serving a request reaches exactly the
// client that made it. Each request the gateway forwards has a caller: the
// SDK path's client session (its ServerSession, which finds the request's
// own stream from the handler's context), or a fast call's own response
// stream. The relay (passthrough.go) attributes an upstream's requests and
// notifications to the request they are about and hands them to its
// caller, after one set of capability checks (relay.ask), whichever way the
// upstream sent them: through the SDK session every client shares, or on a
// direct call's own stream (callRelay.onStream).

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolgate/toolgate/adapter/mcptool"
)

// caller reaches the client of one request.
type caller interface {
	// ask sends a request (sampling/createMessage, elicitation/create,
	// roots/list) to the client and returns its answer's result; a
	// JSON-RPC error of the client is returned as *jsonrpc.Error.
	ask(ctx context.Context, method string, params any) (json.RawMessage, error)
	// notify sends notifications/progress or notifications/message (the
	// latter only at or above the level the client's session asked for).
	notify(ctx context.Context, method string, params any) error
}

// sdkCaller reaches a client through its SDK session: on the stream of the
// request the context belongs to.
type sdkCaller struct{ ss *mcp.ServerSession }

func (c sdkCaller) ask(ctx context.Context, method string, params any) (json.RawMessage, error) {
	var (
		res any
		err error
	)
	switch method {
	case "sampling/createMessage":
		res, err = c.ss.CreateMessageWithTools(ctx, params.(*mcp.CreateMessageWithToolsParams))
	case "elicitation/create":
		res, err = c.ss.Elicit(ctx, params.(*mcp.ElicitParams))
	case "roots/list":
		res, err = c.ss.ListRoots(ctx, params.(*mcp.ListRootsParams))
	default:
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeMethodNotFound, Message: fmt.Sprintf("toolgate: %s is not relayed to clients", method)}
	}
	if err != nil {
		return nil, err
	}
	return json.Marshal(res)
}

func (c sdkCaller) notify(ctx context.Context, method string, params any) error {
	switch method {
	case "notifications/progress":
		return c.ss.NotifyProgress(ctx, params.(*mcp.ProgressNotificationParams))
	case "notifications/message":
		return c.ss.Log(ctx, params.(*mcp.LoggingMessageParams)) // the session's level filters
	}
	return nil
}

// fastCaller reaches the client of a fast call on that call's own response
// (fastWriter): a relayed request goes out under an id of the gateway's and
// the client's answer comes back through fastAnswer.
type fastCaller struct {
	p   *Proxy
	cs  *clientSession
	out *fastWriter
}

// fastReply is a client's answer to a relayed request.
type fastReply struct {
	result json.RawMessage
	err    *jsonrpc.Error
}

func (c *fastCaller) ask(ctx context.Context, method string, params any) (json.RawMessage, error) {
	b, err := json.Marshal(params)
	if err != nil {
		return nil, err
	}
	f := c.p.fast
	id := `"toolgate-` + f.tag + "-" + strconv.FormatUint(f.seq.Add(1), 10) + `"`
	ch := make(chan fastReply, 1)
	f.mu.Lock()
	f.pending[id] = &pendingRequest{session: c.cs.ss.ID(), reply: ch}
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		delete(f.pending, id)
		f.mu.Unlock()
	}()
	msg := append(append(append(append(append([]byte(`{"jsonrpc":"2.0","id":`), id...), `,"method":`...), mustJSON(method)...), `,"params":`...), b...)
	msg = append(msg, '}')
	if err := c.out.event(msg); err != nil {
		return nil, fmt.Errorf("the client's stream cannot be written: %w", err)
	}
	select {
	case r := <-ch:
		if r.err != nil {
			return nil, r.err
		}
		return r.result, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (c *fastCaller) notify(ctx context.Context, method string, params any) error {
	if method == "notifications/message" {
		lp, ok := params.(*mcp.LoggingMessageParams)
		r := c.p.relay
		r.mu.Lock()
		want, set := r.levels[c.cs.ss]
		r.mu.Unlock()
		if !ok || !set || want.level == "" || levelRank(lp.Level) < levelRank(want.level) {
			return nil // as ServerSession.Log filters on the SDK path
		}
	}
	b, err := json.Marshal(params)
	if err != nil {
		return err
	}
	msg := append(append(append(append([]byte(`{"jsonrpc":"2.0","method":`), mustJSON(method)...), `,"params":`...), b...), '}')
	return c.out.event(msg)
}

// callRelay is one tools/call's mcptool.Relay: it tracks each attempt in
// the relay (so what the upstream sends about it is attributed to this
// caller) and, for a fast call, relays a direct call's own stream.
type callRelay struct {
	p     *Proxy
	ss    *mcp.ServerSession
	to    caller
	fast  bool // the caller's transport can carry a direct call's stream
	asked atomic.Int32

	mu  sync.Mutex
	rec *inflight // the attempt in flight
}

var _ mcptool.Relay = (*callRelay)(nil)

// Track registers the attempt in the relay (relay.begin).
func (c *callRelay) Track(ctx context.Context, up string, meta mcp.Meta) (mcp.Meta, func()) {
	call, err := c.p.relay.begin(ctx, up, c.ss, meta, c.to, &c.asked)
	if err != nil {
		return meta, func() {}
	}
	c.mu.Lock()
	c.rec = call.rec
	c.mu.Unlock()
	return call.meta, call.end
}

// Stream relays a direct call's own stream; nil on the SDK path.
func (c *callRelay) Stream() mcptool.OnMessage {
	if !c.fast {
		return nil
	}
	return c.onStream
}

// Asked is how many of the upstream's requests reached the client.
func (c *callRelay) Asked() int { return int(c.asked.Load()) }

// onStream handles one message an upstream sent on a direct call's stream
// before its result: read strictly, as a client's message is
// (parseEnvelope), and only if its method is relayed; a request goes
// through the same checks as one sent on the shared session (relay.ask).
func (c *callRelay) onStream(ctx context.Context, msg []byte, reply func([]byte)) {
	c.mu.Lock()
	rec := c.rec
	c.mu.Unlock()
	env, err := parseEnvelope(msg)
	var id json.RawMessage
	if err == nil {
		id = env.ID
	}
	answer := func(result json.RawMessage, err error) {
		if len(id) == 0 {
			return
		}
		if err != nil {
			reply(errorMessage(id, err))
			return
		}
		reply(resultMessage(id, result))
	}
	switch {
	case err != nil:
		c.p.log.Warn("upstream message refused", "err", err)
		var loose struct {
			ID json.RawMessage `json:"id"`
		}
		if json.Unmarshal(msg, &loose) == nil && len(loose.ID) > 0 {
			reply(errorMessage(loose.ID, &jsonrpc.Error{Code: jsonrpc.CodeInvalidRequest, Message: "toolgate: refused: " + err.Error()}))
		}
		return
	case env.Method == nil:
		return // a response to nothing the gateway asked
	case !upstreamMethods[*env.Method]:
		up := ""
		if rec != nil {
			up = rec.upstream
		}
		c.p.refused.methodRefused(nil, "upstream:"+up, *env.Method)
		answer(nil, &jsonrpc.Error{Code: jsonrpc.CodeMethodNotFound, Message: fmt.Sprintf("toolgate: %s is not relayed to clients", *env.Method)})
		return
	case rec == nil:
		err := &jsonrpc.Error{Code: jsonrpc.CodeInvalidRequest, Message: "toolgate: refused: the call is not tracked"}
		if env.isRequest() {
			c.p.relay.recordAsk(nil, "", *env.Method, err)
		}
		answer(nil, err)
		return
	}
	method := *env.Method
	if env.isRequest() {
		params, perr := requestParams(method, env.Params)
		if perr != nil {
			answer(nil, perr)
			return
		}
		answer(c.p.relay.ask(ctx, rec, method, params))
		return
	}
	switch method {
	case "notifications/progress":
		var p mcp.ProgressNotificationParams
		if json.Unmarshal(paramsOrEmpty(env.Params), &p) == nil {
			// On the call's own stream the client's token went out as is.
			c.p.relay.notifyCaller(rec, method, &p)
		}
	case "notifications/message":
		var p mcp.LoggingMessageParams
		if json.Unmarshal(paramsOrEmpty(env.Params), &p) == nil {
			c.p.relay.notifyCaller(rec, method, &p)
		}
	}
}

// requestParams decodes the params of a relayed request into the SDK's
// type for its method.
func requestParams(method string, raw json.RawMessage) (any, error) {
	var p any
	switch method {
	case "sampling/createMessage":
		p = new(mcp.CreateMessageWithToolsParams)
	case "elicitation/create":
		p = new(mcp.ElicitParams)
	case "roots/list":
		p = new(mcp.ListRootsParams)
	default:
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeMethodNotFound, Message: fmt.Sprintf("toolgate: %s is not relayed to clients", method)}
	}
	if err := json.Unmarshal(paramsOrEmpty(raw), p); err != nil {
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: err.Error()}
	}
	return p, nil
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
