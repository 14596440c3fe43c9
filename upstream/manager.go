// Package upstream keeps toolgate's client sessions to the MCP servers it
// fronts (its upstreams) alive, and gives the MCP proxy and the tool adapters
// one place to list their tools and call them.
//
// A Manager runs one supervisor goroutine per upstream. The supervisor
// connects (a stdio subprocess or a Streamable HTTP endpoint) with the
// official MCP Go SDK, pins the session to protocol 2025-11-25, lists the
// tools, re-lists them when the upstream sends notifications/tools/list_changed,
// and when the session is lost marks the upstream down and reconnects with
// exponential backoff and jitter. A down upstream never blocks the others:
// calls to it fail at once with ErrDown.
//
// The package decides nothing: it neither filters nor authorizes. It forwards
// what it is asked to forward, and passes upstream-to-client requests
// (sampling, elicitation, roots) and notifications (progress, logging,
// resource and prompt changes) to the handlers in Options, tagged with the
// upstream's name, so that a proxy can route them to its own clients.
package upstream

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// ProtocolVersion is the MCP protocol version every upstream session is
// pinned to. The SDK's default (2026-07-28) costs a server/discover round
// trip that today's servers reject, and a stateful gateway needs the
// initialize handshake anyway.
const ProtocolVersion = "2025-11-25"

// Errors callers branch on with errors.Is. Errors returned by Manager wrap
// them with the upstream's name and the operation.
var (
	// ErrUnknownUpstream: no upstream of that name was configured.
	ErrUnknownUpstream = errors.New("unknown upstream")
	// ErrDown: the upstream is not connected (starting, crashed, or
	// restarting); the error also carries the last connection error.
	ErrDown = errors.New("upstream is down")
	// ErrCallTimeout: the upstream did not answer a call within its
	// Config.CallTimeout. The upstream stays up unless the health check
	// this triggers fails (Options.HealthInterval).
	ErrCallTimeout = errors.New("upstream call timed out")
	// ErrClosed: the Manager was closed.
	ErrClosed = errors.New("upstream manager closed")
)

// State is the connection state of an upstream.
type State uint8

const (
	// StateStarting: the first connection attempt has not finished.
	StateStarting State = iota
	// StateUp: connected; tools listed; calls are forwarded.
	StateUp
	// StateDown: the last attempt failed or the session was lost; a restart
	// is scheduled.
	StateDown
	// StateClosed: the Manager was closed.
	StateClosed
)

// String returns "starting", "up", "down" or "closed".
func (s State) String() string {
	switch s {
	case StateStarting:
		return "starting"
	case StateUp:
		return "up"
	case StateDown:
		return "down"
	case StateClosed:
		return "closed"
	default:
		return fmt.Sprintf("State(%d)", uint8(s))
	}
}

// MarshalText encodes the state as its String.
func (s State) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// Status is a snapshot of one upstream, as returned by Manager.Status.
type Status struct {
	// Name and Transport are copied from the Config.
	Name, Transport string
	// State is the connection state.
	State State
	// Since is when State last changed (Options.Now clock).
	Since time.Time
	// LastError is why the upstream last went down or failed to connect;
	// nil if it never did. It stays set after a successful restart.
	LastError error
	// Restarts counts connection attempts after the first one.
	Restarts int
	// PID is the process id of a stdio upstream while it runs, else 0.
	PID int
	// Tools is the number of tools in the cached list.
	Tools int
}

// Options configures a Manager. The zero value, and a nil *Options, are
// valid: no handlers, the default backoff, the real clock.
type Options struct {
	// Logger receives connection events (never secret values). nil
	// discards. An upstream's stderr lines are logged at Debug level.
	Logger *slog.Logger
	// ClientInfo is sent to upstreams in initialize; nil means
	// {Name: "toolgate", Version: "dev"}.
	ClientInfo *mcp.Implementation
	// ClientCapabilities are declared to every upstream. nil means none
	// (in particular no roots: server-filesystem would otherwise replace its
	// allowed directories with the client's roots). Setting CreateMessage,
	// Elicit or ListRoots below adds the sampling, elicitation or roots
	// capability unless this sets it. Capabilities change which tools some
	// servers announce (server-everything adds trigger-sampling-request,
	// trigger-elicitation-request, get-roots-list).
	ClientCapabilities *mcp.ClientCapabilities

	// OnChange is called with an upstream's new tool list whenever the
	// list differs from the cached one: after the first successful listing,
	// after a refresh on notifications/tools/list_changed, and after a
	// restart that changed the list. It is not called when an upstream goes
	// down (the cached list is kept; see Status for liveness). Calls for one
	// upstream are sequential; calls for different upstreams may run
	// concurrently. It must not call Manager.Close. The slice and the
	// tools are shared: do not modify them.
	OnChange func(name string, tools []*mcp.Tool)

	// CreateMessage answers an upstream's sampling/createMessage request.
	// nil: sampling is not declared and such requests are refused.
	CreateMessage func(ctx context.Context, name string, req *mcp.CreateMessageWithToolsRequest) (*mcp.CreateMessageWithToolsResult, error)
	// Elicit answers an upstream's elicitation/create request. nil:
	// elicitation is not declared and such requests are refused.
	Elicit func(ctx context.Context, name string, req *mcp.ElicitRequest) (*mcp.ElicitResult, error)
	// ListRoots answers an upstream's roots/list request. nil: roots are
	// not declared (unless ClientCapabilities does) and the answer is an
	// empty list.
	ListRoots func(ctx context.Context, name string, req *mcp.ListRootsRequest) (*mcp.ListRootsResult, error)

	// Progress receives notifications/progress (for calls made with a
	// progress token in CallToolParams.Meta).
	Progress func(ctx context.Context, name string, req *mcp.ProgressNotificationClientRequest)
	// LoggingMessage receives notifications/message.
	LoggingMessage func(ctx context.Context, name string, req *mcp.LoggingMessageRequest)
	// ResourceUpdated receives notifications/resources/updated.
	ResourceUpdated func(ctx context.Context, name string, req *mcp.ResourceUpdatedNotificationRequest)
	// ResourceListChanged receives notifications/resources/list_changed.
	ResourceListChanged func(ctx context.Context, name string, req *mcp.ResourceListChangedRequest)
	// PromptListChanged receives notifications/prompts/list_changed.
	PromptListChanged func(ctx context.Context, name string, req *mcp.PromptListChangedRequest)
	// ElicitationComplete receives notifications/elicitation/complete.
	ElicitationComplete func(ctx context.Context, name string, req *mcp.ElicitationCompleteNotificationRequest)
	// (notifications/tools/list_changed is handled by the Manager: it
	// re-lists the tools and calls OnChange.)

	// BackoffBase is the delay before the first restart; each further
	// consecutive failure doubles it, up to BackoffMax. The delay actually
	// slept is drawn uniformly from [d/2, d] (jitter). A session that stayed
	// up for at least BackoffMax resets the sequence. 0 means
	// DefaultBackoffBase / DefaultBackoffMax.
	BackoffBase, BackoffMax time.Duration
	// HealthInterval is how often each upstream that is up is checked
	// without waiting for traffic: an MCP ping on its session, bounded by
	// HealthTimeout. The next check starts HealthInterval after the last
	// one ended, so a session that stopped answering is marked down within
	// HealthInterval + HealthTimeout (7 s by default) with no request made.
	// Any request through the session that fails without an answer from
	// the upstream (a tools/call, resources/read, prompts/get, a list call,
	// a ping, a notification, a Direct post: a network error, a timeout, a
	// lost stream, an HTTP status other than 200 and 202; not a JSON-RPC
	// error, which the upstream answered, nor the caller's cancellation)
	// triggers a check at once. Failures while a check runs are answered by
	// at most one more check: one check is in flight per upstream at any
	// time. A check fails when the request cannot reach the server, or
	// when the ping gets no answer within the timeout and nothing else was
	// received from the upstream meanwhile (a JSON-RPC error, from a server
	// without ping, counts as an answer; bytes still arriving mean busy, not
	// gone: a stdio server's answer to the ping can wait behind a large
	// result on the same pipe); the upstream is then marked down (OnState)
	// and restarted with the backoff below. A stdio
	// upstream's exit is seen at once, without a check. Checks use real
	// timers, not Sleep. 0 means DefaultHealthInterval.
	HealthInterval time.Duration
	// HealthTimeout bounds one health check's ping, and is itself bounded by
	// the upstream's Config.CallTimeout; 0 means DefaultHealthTimeout.
	HealthTimeout time.Duration

	// Sleep waits d or until ctx is done (then it returns ctx.Err()); nil
	// means a timer. Tests inject one to control restarts without waiting.
	Sleep func(ctx context.Context, d time.Duration) error
	// Now is the clock for Status.Since and the backoff reset; nil means
	// time.Now.
	Now func() time.Time
	// Rand returns a number in [0, 1) for the jitter; nil means
	// math/rand/v2.Float64.
	Rand func() float64

	// MaxResultBytes bounds, in bytes, one answer to tools/call,
	// resources/read, prompts/get or any other request whose answer is not
	// a list; 0 means DefaultMaxResultBytes. Nothing larger is buffered or
	// decoded: the answer is refused (OnRefused) and the request gets, in
	// its place, an isError result (tools/call, with RefusedMetaKey in
	// _meta) or a JSON-RPC error saying it was too large. The gateway sets
	// it to a small multiple of Settings.result_max_kib
	// (adapter.ReadLimit); SetMaxResultBytes changes it.
	MaxResultBytes int
	// MaxMessageBytes bounds, in bytes, every other message from an
	// upstream: answers to initialize and the list methods, and the
	// upstream's own requests and notifications; 0 means
	// DefaultMaxMessageBytes. A larger answer is refused as above; a larger
	// request or notification is dropped.
	MaxMessageBytes int
	// OnRefused is called with the upstream's name and the reason
	// (RefusedTooLarge, RefusedMalformed) for every message from an
	// upstream that was refused. The session stays up: one bad message
	// never takes an upstream down. It must not block.
	OnRefused func(name, reason string)
	// OnState is called with the upstream's name and its new state after
	// every change of state (starting → up, up → down, down → up, → closed).
	// Calls for one upstream are sequential. It must not block or call the
	// Manager.
	OnState func(name string, s State)
	// OnRestart is called with the upstream's name each time a connection
	// attempt after the first one begins (Status.Restarts goes up). It must
	// not block.
	OnRestart func(name string)
}

// Manager keeps sessions to a fixed set of upstreams. Create it with New,
// call Start once, and Close when done. Its methods are safe for concurrent
// use.
type Manager struct {
	opts  Options
	log   *slog.Logger
	ups   []*upstream
	byKey map[string]*upstream

	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup

	// maxResult is Options.MaxResultBytes, changed by SetMaxResultBytes.
	maxResult atomic.Int64

	mu      sync.Mutex
	started bool
	closed  bool
}

// New validates cfgs (every error is reported, joined; names must be unique)
// and returns a Manager that has not connected yet; the configs are copied.
// opts may be nil.
func New(cfgs []Config, opts *Options) (*Manager, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if o.ClientInfo == nil {
		o.ClientInfo = &mcp.Implementation{Name: "toolgate", Version: "dev"}
	}
	if o.BackoffBase <= 0 {
		o.BackoffBase = DefaultBackoffBase
	}
	if o.BackoffMax <= 0 {
		o.BackoffMax = DefaultBackoffMax
	}
	if o.BackoffMax < o.BackoffBase {
		o.BackoffMax = o.BackoffBase
	}
	if o.HealthInterval <= 0 {
		o.HealthInterval = DefaultHealthInterval
	}
	if o.HealthTimeout <= 0 {
		o.HealthTimeout = DefaultHealthTimeout
	}
	if o.Sleep == nil {
		o.Sleep = sleepTimer
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Rand == nil {
		o.Rand = rand.Float64
	}
	if o.MaxResultBytes <= 0 {
		o.MaxResultBytes = DefaultMaxResultBytes
	}
	if o.MaxMessageBytes <= 0 {
		o.MaxMessageBytes = DefaultMaxMessageBytes
	}

	m := &Manager{opts: o, log: o.Logger, byKey: make(map[string]*upstream, len(cfgs))}
	m.maxResult.Store(int64(o.MaxResultBytes))
	var errs []error
	for i := range cfgs {
		cfg := cfgs[i]
		cfg.Args = slices.Clone(cfg.Args)
		cfg.Env = maps.Clone(cfg.Env)
		cfg.Headers = maps.Clone(cfg.Headers)
		if err := cfg.Validate(); err != nil {
			errs = append(errs, err)
			continue
		}
		if _, dup := m.byKey[cfg.Name]; dup {
			errs = append(errs, fmt.Errorf("upstream %q: name: configured more than once", cfg.Name))
			continue
		}
		u := newUpstream(m, cfg)
		m.ups = append(m.ups, u)
		m.byKey[cfg.Name] = u
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	m.ctx, m.cancel = context.WithCancel(context.Background())
	return m, nil
}

func sleepTimer(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// SetMaxResultBytes changes Options.MaxResultBytes for every session,
// including those already up (0 or less: DefaultMaxResultBytes). Answers
// being read when it changes may be bounded by either value.
func (m *Manager) SetMaxResultBytes(n int) {
	if n <= 0 {
		n = DefaultMaxResultBytes
	}
	m.maxResult.Store(int64(n))
}

// Names returns the configured upstream names, in configuration order.
func (m *Manager) Names() []string {
	names := make([]string, len(m.ups))
	for i, u := range m.ups {
		names[i] = u.cfg.Name
	}
	return names
}

// Start connects every upstream concurrently and returns when each has
// finished its first attempt, or when ctx is done. It returns the first
// attempts' errors, joined (nil if all came up); upstreams that failed are
// down and keep being restarted in the background, so an error here need not
// be fatal. Supervision runs until Close, whatever happens to ctx. Calling
// Start twice, or after Close, is an error.
func (m *Manager) Start(ctx context.Context) error {
	m.mu.Lock()
	switch {
	case m.closed:
		m.mu.Unlock()
		return ErrClosed
	case m.started:
		m.mu.Unlock()
		return errors.New("upstream: Start called twice")
	}
	m.started = true
	firsts := make([]chan error, len(m.ups))
	for i, u := range m.ups {
		firsts[i] = make(chan error, 1)
		m.wg.Add(1)
		go func() {
			defer m.wg.Done()
			u.supervise(firsts[i])
		}()
	}
	m.mu.Unlock()

	var errs []error
	for i, ch := range firsts {
		select {
		case err := <-ch:
			if err != nil {
				errs = append(errs, fmt.Errorf("upstream %q: %w", m.ups[i].cfg.Name, err))
			}
		case <-ctx.Done():
			return fmt.Errorf("upstream: start: %w", ctx.Err())
		}
	}
	return errors.Join(errs...)
}

// Close stops supervision, closes every session and kills every stdio
// upstream's process group, then waits for all of it. Later calls return
// ErrClosed. Close is idempotent and returns nil.
func (m *Manager) Close() error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.closed = true
	m.mu.Unlock()
	m.cancel()
	m.wg.Wait()
	for _, u := range m.ups {
		u.setState(StateClosed, nil)
	}
	return nil
}

func (m *Manager) lookup(name string) (*upstream, error) {
	u, ok := m.byKey[name]
	if !ok {
		return nil, fmt.Errorf("upstream %q: %w", name, ErrUnknownUpstream)
	}
	return u, nil
}

// Tools returns the cached tool list of the named upstream, in the order the
// upstream announced it, and whether a list was ever obtained (false also
// for an unknown name). The list is kept while the upstream is down. The
// slice is a copy; the tools are shared and must not be modified.
func (m *Manager) Tools(name string) ([]*mcp.Tool, bool) {
	u, ok := m.byKey[name]
	if !ok {
		return nil, false
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	return slices.Clone(u.tools), u.listed
}

// Session returns the live client session of the named upstream, for
// passing through requests the Manager has no method for (resources,
// prompts, completions, logging/setLevel, ping). It fails with
// ErrUnknownUpstream, ErrDown or ErrClosed. The session may die at any
// moment; its calls then fail with an error wrapping mcp.ErrConnectionClosed
// or a network error, and the Manager restarts the upstream: every failed
// request on the session has it checked at once (Options.HealthInterval).
// Do not close it.
func (m *Manager) Session(name string) (*mcp.ClientSession, error) {
	u, err := m.lookup(name)
	if err != nil {
		return nil, err
	}
	cs, _, err := u.session()
	return cs, err
}

// CallTool forwards a tools/call to the named upstream, bounded by its
// Config.CallTimeout (and by ctx). params go out as given (Name, Arguments,
// Meta such as a progress token).
//
// A result is returned as the upstream sent it, IsError results included. A
// JSON-RPC error from the upstream is returned unwrapped, as a
// *jsonrpc.Error, so a proxy can pass it on. Other errors wrap
// ErrUnknownUpstream, ErrDown (the upstream is down, or its connection was
// lost during the call), ErrCallTimeout (with context.DeadlineExceeded),
// ErrClosed, or the caller's context error.
func (m *Manager) CallTool(ctx context.Context, name string, params *mcp.CallToolParams) (*mcp.CallToolResult, error) {
	u, err := m.lookup(name)
	if err != nil {
		return nil, err
	}
	if params == nil || params.Name == "" {
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "tools/call: missing tool name"}
	}
	cs, c, err := u.session()
	if err != nil {
		return nil, fmt.Errorf("%w (tools/call %q)", err, params.Name)
	}
	// The SDK writes to params (nil Arguments become {}): send a copy. A
	// typed nil (nil map, nil or "null" json.RawMessage) would go out as
	// null, which servers reject; send {} as for a nil interface.
	p := *params
	if noArguments(p.Arguments) {
		p.Arguments = map[string]any{}
	}
	timeout := u.cfg.callTimeout()
	cctx, cancel := context.WithTimeoutCause(ctx, timeout, ErrCallTimeout)
	defer cancel()
	res, err := cs.CallTool(cctx, &p)
	if err == nil {
		return res, nil
	}
	return nil, u.callError(c, "tools/call", p.Name, ctx, cctx, timeout, err)
}

// rejectedLocally reports whether e is the SDK's own "rejected by
// transport" error (jsonrpc2.ErrRejected, which is internal to the SDK):
// the request was refused on this side and never answered by the upstream.
func rejectedLocally(e *jsonrpc.Error) bool {
	return e.Code == -32005 && e.Message == "rejected by transport"
}

// noArguments reports whether args would marshal to JSON null.
func noArguments(args any) bool {
	switch a := args.(type) {
	case nil:
		return true
	case map[string]any:
		return a == nil
	case json.RawMessage:
		return len(a) == 0 || string(a) == "null"
	}
	return false
}

// callError classifies an error of a call made on c with cctx (derived from
// the caller's ctx with the call timeout).
//
// Every failure but the upstream's own JSON-RPC error and the caller's
// cancellation has the session checked at once (Options.HealthInterval).
func (u *upstream) callError(c *conn, method, tool string, ctx, cctx context.Context, timeout time.Duration, err error) error {
	if failed(ctx, err) {
		c.suspect()
	}
	var rpcErr *jsonrpc.Error
	switch {
	case ctx.Err() != nil:
		return fmt.Errorf("upstream %q: %s %q: %w", u.cfg.Name, method, tool, ctx.Err())
	case errors.Is(context.Cause(cctx), ErrCallTimeout):
		return fmt.Errorf("upstream %q: %s %q: %w after %s: %w", u.cfg.Name, method, tool, ErrCallTimeout, timeout, context.DeadlineExceeded)
	case c.lost(err) || unreachable(err):
		u.m.mu.Lock()
		closed := u.m.closed
		u.m.mu.Unlock()
		if closed {
			return fmt.Errorf("upstream %q: %s %q: %w", u.cfg.Name, method, tool, ErrClosed)
		}
		// The server died mid-call, or the request did not reach it (an
		// HTTP upstream that is gone: the SDK keeps such a session for a
		// while in case of a blip). The check asked for above decides.
		return fmt.Errorf("upstream %q: %s %q: %w: connection lost: %w", u.cfg.Name, method, tool, ErrDown, err)
	case errors.As(err, &rpcErr) && !rejectedLocally(rpcErr):
		return rpcErr
	default:
		return fmt.Errorf("upstream %q: %s %q: %w", u.cfg.Name, method, tool, err)
	}
}

// Status returns a snapshot of every upstream, in configuration order.
func (m *Manager) Status() []Status {
	out := make([]Status, len(m.ups))
	for i, u := range m.ups {
		u.mu.Lock()
		out[i] = Status{
			Name:      u.cfg.Name,
			Transport: u.cfg.Transport,
			State:     u.state,
			Since:     u.since,
			LastError: u.lastErr,
			Restarts:  u.restarts,
			Tools:     len(u.tools),
		}
		if u.state == StateUp && u.live != nil {
			out[i].PID = u.live.pid
		}
		u.mu.Unlock()
	}
	return out
}

// backoff returns the delay before restart number failures (1-based).
func (m *Manager) backoff(failures int) time.Duration {
	d := m.opts.BackoffBase
	for i := 1; i < failures && d < m.opts.BackoffMax; i++ {
		d *= 2
	}
	d = min(d, m.opts.BackoffMax)
	half := d / 2
	return half + time.Duration(m.opts.Rand()*float64(d-half))
}

// upstream is one configured server and its supervisor's state.
type upstream struct {
	m      *Manager
	cfg    Config
	log    *slog.Logger
	client *mcp.Client
	// refresh is signalled (non-blocking, capacity 1) by the
	// tools/list_changed handler; the supervisor re-lists.
	refresh chan struct{}

	mu       sync.Mutex
	state    State
	since    time.Time
	live     *conn // non-nil while up
	tools    []*mcp.Tool
	toolsKey []byte // JSON of tools, to detect changes
	listed   bool
	lastErr  error
	restarts int
}

func newUpstream(m *Manager, cfg Config) *upstream {
	u := &upstream{
		m:       m,
		cfg:     cfg,
		log:     m.log.With("upstream", cfg.Name),
		refresh: make(chan struct{}, 1),
		since:   m.opts.Now(),
	}
	u.client = u.newClient()
	return u
}

// newClient builds the SDK client for this upstream; its handlers tag every
// upstream-to-client message with the upstream's name.
func (u *upstream) newClient() *mcp.Client {
	o := &u.m.opts
	name := u.cfg.Name
	caps := &mcp.ClientCapabilities{}
	if o.ClientCapabilities != nil {
		c := *o.ClientCapabilities
		caps = &c
	}
	if o.ListRoots != nil && caps.RootsV2 == nil {
		caps.RootsV2 = &mcp.RootCapabilities{}
	}
	co := &mcp.ClientOptions{
		Logger:       u.log,
		Capabilities: caps,
		ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) {
			select {
			case u.refresh <- struct{}{}:
			default:
			}
		},
	}
	if f := o.CreateMessage; f != nil {
		co.CreateMessageWithToolsHandler = func(ctx context.Context, r *mcp.CreateMessageWithToolsRequest) (*mcp.CreateMessageWithToolsResult, error) {
			return f(ctx, name, r)
		}
	}
	if f := o.Elicit; f != nil {
		co.ElicitationHandler = func(ctx context.Context, r *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			return f(ctx, name, r)
		}
	}
	if f := o.Progress; f != nil {
		co.ProgressNotificationHandler = func(ctx context.Context, r *mcp.ProgressNotificationClientRequest) { f(ctx, name, r) }
	}
	if f := o.LoggingMessage; f != nil {
		co.LoggingMessageHandler = func(ctx context.Context, r *mcp.LoggingMessageRequest) { f(ctx, name, r) }
	}
	if f := o.ResourceUpdated; f != nil {
		co.ResourceUpdatedHandler = func(ctx context.Context, r *mcp.ResourceUpdatedNotificationRequest) { f(ctx, name, r) }
	}
	if f := o.ResourceListChanged; f != nil {
		co.ResourceListChangedHandler = func(ctx context.Context, r *mcp.ResourceListChangedRequest) { f(ctx, name, r) }
	}
	if f := o.PromptListChanged; f != nil {
		co.PromptListChangedHandler = func(ctx context.Context, r *mcp.PromptListChangedRequest) { f(ctx, name, r) }
	}
	if f := o.ElicitationComplete; f != nil {
		co.ElicitationCompleteHandler = func(ctx context.Context, r *mcp.ElicitationCompleteNotificationRequest) { f(ctx, name, r) }
	}
	c := mcp.NewClient(o.ClientInfo, co)
	// Every request sent on a session, whoever sends it (CallTool, the
	// proxy's pass-through of resources, prompts and lists through
	// Session, the Manager's own listings), has the session checked when it
	// fails.
	c.AddSendingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			res, err := next(ctx, method, req)
			if failed(ctx, err) {
				u.suspectSession(req.GetSession())
			}
			return res, err
		}
	})
	listRoots, elicit := o.ListRoots, o.Elicit
	if listRoots != nil || elicit != nil {
		// Answered in middleware: the SDK client's own elicitation handler
		// validates the requested schema first and refuses shapes newer
		// than it knows (SEP-1330 titled multi-select), which the
		// downstream client may well understand; relay them unchanged.
		c.AddReceivingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
			return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
				switch r := req.(type) {
				case *mcp.ListRootsRequest:
					if listRoots != nil {
						return listRoots(ctx, name, r)
					}
				case *mcp.ElicitRequest:
					if elicit != nil {
						return elicit(ctx, name, r)
					}
				}
				return next(ctx, method, req)
			}
		})
	}
	return c
}

func (u *upstream) setState(s State, err error) {
	u.mu.Lock()
	if u.state == StateClosed {
		u.mu.Unlock()
		return
	}
	changed := s != u.state
	if changed {
		u.since = u.m.opts.Now()
	}
	u.state = s
	if err != nil {
		u.lastErr = err
	}
	if s != StateUp {
		u.live = nil
	}
	u.mu.Unlock()
	if f := u.m.opts.OnState; changed && f != nil {
		f(u.cfg.Name, s)
	}
}

// session returns the live session or an error saying why there is none.
func (u *upstream) session() (*mcp.ClientSession, *conn, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	switch {
	case u.state == StateUp && u.live != nil:
		return u.live.cs, u.live, nil
	case u.state == StateClosed:
		return nil, nil, fmt.Errorf("upstream %q: %w", u.cfg.Name, ErrClosed)
	case u.lastErr != nil:
		return nil, nil, fmt.Errorf("upstream %q: %w (%s; last error: %v)", u.cfg.Name, ErrDown, u.state, u.lastErr)
	default:
		return nil, nil, fmt.Errorf("upstream %q: %w (%s)", u.cfg.Name, ErrDown, u.state)
	}
}

// supervise connects, serves until the session is lost, and restarts, until
// the Manager is closed. The first attempt's result goes to first.
func (u *upstream) supervise(first chan<- error) {
	ctx := u.m.ctx
	failures := 0
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			d := u.m.backoff(failures)
			u.log.Info("upstream restart scheduled", "in", d, "failures", failures)
			if err := u.m.opts.Sleep(ctx, d); err != nil || ctx.Err() != nil {
				return
			}
			u.mu.Lock()
			u.restarts++
			u.mu.Unlock()
			if f := u.m.opts.OnRestart; f != nil {
				f(u.cfg.Name)
			}
		}
		c, err := u.connect(ctx)
		if first != nil {
			first <- err
			first = nil
		}
		if ctx.Err() != nil {
			if c != nil {
				c.close()
			}
			return
		}
		if err != nil {
			failures++
			u.log.Warn("upstream connect failed", "err", err)
			u.setState(StateDown, err)
			continue
		}
		upAt := u.m.opts.Now()
		err = u.serve(ctx, c)
		if ctx.Err() != nil {
			return
		}
		if u.m.opts.Now().Sub(upAt) >= u.m.opts.BackoffMax {
			failures = 0
		}
		failures++
		u.log.Warn("upstream lost", "err", err)
	}
}

// connect makes one connection attempt: start or reach the server,
// initialize, list the tools. On success the upstream is up.
func (u *upstream) connect(ctx context.Context) (*conn, error) {
	ctx, cancel := context.WithTimeout(ctx, u.cfg.connectTimeout())
	defer cancel()
	c, err := u.dial(ctx)
	if err != nil {
		return nil, err
	}
	tools, err := listTools(ctx, c.cs)
	if err != nil {
		c.close()
		return nil, fmt.Errorf("tools/list: %w", err)
	}
	u.mu.Lock()
	u.live = c
	u.mu.Unlock()
	u.setState(StateUp, nil)
	u.log.Info("upstream up", "tools", len(tools), "pid", c.pid)
	u.storeTools(tools)
	return c, nil
}

// serve waits for the session to end (returning why) or the Manager to
// close (returning nil), re-listing tools when asked to. The session's
// health checks run in a goroutine of their own (watch), so that a slow
// re-listing never delays them; serve waits for it before returning.
func (u *upstream) serve(ctx context.Context, c *conn) error {
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		u.watch(c)
	}()
	defer func() {
		c.cancel(errSessionEnded)
		<-watched
	}()
	for {
		select {
		case <-c.done:
			err := fmt.Errorf("connection lost: %w", mcp.ErrConnectionClosed)
			if c.waitErr != nil {
				err = fmt.Errorf("connection lost: %w", c.waitErr)
			}
			u.setState(StateDown, err)
			c.close()
			return err
		case <-c.ctx.Done():
			if ctx.Err() != nil {
				c.close()
				return nil
			}
			// A health check failed.
			err := context.Cause(c.ctx)
			u.setState(StateDown, err)
			c.close()
			return err
		case <-u.refresh:
			// Bounded by the session's context too: a failed health check
			// ends the listing at once.
			lctx, cancel := context.WithTimeout(c.ctx, u.cfg.callTimeout())
			tools, err := listTools(lctx, c.cs)
			cancel()
			if err != nil {
				u.log.Warn("upstream tools/list after list_changed failed", "err", err)
				continue // if the session died, c.done or c.ctx fires next
			}
			u.storeTools(tools)
		case <-ctx.Done():
			c.close()
			return nil
		}
	}
}

// errSessionEnded cancels a session's context once serve is done with it.
var errSessionEnded = errors.New("session ended")

// watch checks the session c every Options.HealthInterval, and at once when
// a failed request asks for it (c.probe), until the session's context is
// done (serve returned, the Manager closed) or the session ended. Checks
// are sequential: one in flight per session, and serve waits for watch
// before the next session starts, so one per upstream. No lock is held
// while a check waits. A failed check cancels the session's context with
// the reason, which has serve mark the upstream down and restart it.
func (u *upstream) watch(c *conn) {
	every := u.m.opts.HealthInterval
	t := time.NewTimer(every)
	defer t.Stop()
	for {
		var why string
		select {
		case <-c.ctx.Done():
			return
		case <-c.done:
			return // serve reports the session's end
		case <-t.C:
			why = "periodic"
		case <-c.probe:
			why = "after a failed request"
		}
		err := u.ping(c.ctx, c)
		if c.ctx.Err() != nil {
			return
		}
		if err != nil {
			u.log.Warn("upstream health check failed", "check", why, "err", err)
			c.cancel(fmt.Errorf("connection lost: health check (%s) failed: %w", why, err))
			return
		}
		t.Reset(every)
	}
}

// ping checks that the session still answers, within Options.HealthTimeout
// (and the upstream's call timeout). A JSON-RPC error (a server without
// ping) counts as an answer, and so does, when no answer came in time, the
// upstream having sent anything meanwhile: it is busy, not gone (a stdio
// server's answer to the ping waits behind the large results it is
// writing on the same pipe).
func (u *upstream) ping(ctx context.Context, c *conn) error {
	timeout := min(u.m.opts.HealthTimeout, u.cfg.callTimeout())
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	before := c.g.received.Load()
	err := c.cs.Ping(ctx, nil)
	switch {
	case err == nil || answered(err):
		return nil
	case errors.Is(err, context.DeadlineExceeded) && c.g.received.Load() != before:
		u.log.Debug("upstream ping not answered in time, but the upstream is sending", "timeout", timeout)
		return nil
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("no answer to ping within %s, and nothing else received: %w", timeout, err)
	default:
		return err
	}
}

// answered reports whether err, from a request to an upstream, is the
// upstream's own JSON-RPC error: proof that it is there and answering.
func answered(err error) bool {
	var rpcErr *jsonrpc.Error
	return errors.As(err, &rpcErr) && !rejectedLocally(rpcErr) && !unreachable(err)
}

// failed reports whether err, from a request made with ctx, is a failure
// that calls for a health check: any error but the upstream's own JSON-RPC
// error and the caller's cancellation.
func failed(ctx context.Context, err error) bool {
	return err != nil && !answered(err) && !errors.Is(ctx.Err(), context.Canceled)
}

// suspectSession asks for a health check of cs if it is the live session.
func (u *upstream) suspectSession(cs mcp.Session) {
	u.mu.Lock()
	c := u.live
	u.mu.Unlock()
	if c != nil && mcp.Session(c.cs) == cs {
		c.suspect()
	}
}

// storeTools caches tools and calls OnChange if they differ from the cache.
// Only the supervisor goroutine calls it, so OnChange calls are sequential.
func (u *upstream) storeTools(tools []*mcp.Tool) {
	key, err := json.Marshal(tools)
	if err != nil {
		key = nil // always differs: report the change
	}
	u.mu.Lock()
	changed := !u.listed || key == nil || string(key) != string(u.toolsKey)
	u.tools, u.toolsKey, u.listed = tools, key, true
	u.mu.Unlock()
	if changed {
		u.log.Info("upstream tools changed", "tools", len(tools))
		if f := u.m.opts.OnChange; f != nil {
			f(u.cfg.Name, slices.Clone(tools))
		}
	}
}

// listTools fetches every page of tools/list.
func listTools(ctx context.Context, cs *mcp.ClientSession) ([]*mcp.Tool, error) {
	tools := []*mcp.Tool{}
	for t, err := range cs.Tools(ctx, nil) {
		if err != nil {
			return nil, err
		}
		tools = append(tools, t)
	}
	return tools, nil
}
