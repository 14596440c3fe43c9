package gate

import (
	"context"
	"database/sql/driver"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolgate/toolgate"
	"github.com/toolgate/toolgate/adapter"
	"github.com/toolgate/toolgate/authz"
	"github.com/toolgate/toolgate/builtin"
	"github.com/toolgate/toolgate/upstream"
)

// Builtins finds built-in tools by their function name ("sql.query", the
// Tool's source.builtin); *registry.Registry implements it.
type Builtins interface {
	Lookup(name string) (builtin.Tool, bool)
}

// Upstreams forwards a tools/call to the named upstream MCP server;
// *upstream.Manager implements it. Errors wrapping upstream.ErrDown or
// upstream.ErrCallTimeout are transient (retried where the class allows).
type Upstreams interface {
	CallTool(ctx context.Context, name string, params *mcp.CallToolParams) (*mcp.CallToolResult, error)
}

// Executor is what Call and Execute run allowed calls with. Set its fields
// before the gate serves calls; they are not changed afterwards.
type Executor struct {
	// Builtins are the built-in tools; nil means none (a built-in tool is
	// then refused before it is decided, since what it would touch cannot
	// be known).
	Builtins Builtins
	// Upstreams reaches MCP upstream tools; nil means none.
	Upstreams Upstreams
	// BaseDir is the folder relative agent workspaces resolve against: the
	// bundle folder.
	BaseDir string
	// Runner runs the attempts (timeouts, retries, backoff); nil means
	// adapter.New(nil), the real clock.
	Runner *adapter.Runner
}

// ErrNotExecutable is a CallResult.Err for an allowed tool this gateway
// cannot run: declared only (its agent runtime runs it), an http source, a
// built-in or upstream that is not configured here.
var ErrNotExecutable = errors.New("this gateway cannot run the tool")

// ErrClientAsked marks a failed attempt during which the upstream asked the
// caller's client for input (sampling, elicitation, roots): such an attempt
// is never retried, so nobody is asked the same thing twice. Forward
// functions wrap it into their error (the MCP proxy does).
var ErrClientAsked = errors.New("the client was asked for input during the attempt, so the call is not retried")

// ErrNotAllowed is a CallResult.Err from Execute given an outcome that
// does not allow the call; nothing ran.
var ErrNotAllowed = errors.New("the call is not allowed")

// CallResult is what running an allowed call produced. Its Result (output,
// failed, error, attempts) is what the completion event records.
type CallResult struct {
	Result
	// Tool is the result returned to the caller, as an MCP tool result:
	// the tool's own (an upstream's, or a built-in's text with its data as
	// structuredContent), capped at Settings.result_max_kib; when the tool
	// could not be run (Err set), an isError result saying why. nil when
	// the call was not allowed, and when Raw is set.
	Tool *mcp.CallToolResult
	// Raw is the upstream's result as the JSON it sent, passed through
	// undecoded: set only with CallOptions.ForwardRaw, when the result is
	// a well-formed CallToolResult within the result cap (else Tool holds
	// it decoded, and capped).
	Raw json.RawMessage
	// Ran is true when at least one attempt was made.
	Ran bool
	// Truncated is true when the result was cut (by the tool's own limits
	// or the result cap); the cut is marked in the text.
	Truncated bool
	// Resources are what a built-in tool reported the call touches.
	Resources []toolgate.Resource
	// AttemptLog accounts for every attempt.
	AttemptLog []adapter.Attempt
	// Duration is how long execution took (all attempts and backoff).
	Duration time.Duration
}

// CallOptions adjust one Call or Execute; nil means none.
type CallOptions struct {
	// Forward, when set, replaces the call to the upstream of an MCP tool
	// (the MCP proxy uses it to relay the upstream's progress and requests
	// to its client's session). It is called once per attempt.
	// args are the arguments that were decided, as canonical JSON: what
	// the upstream must get (never the client's own bytes).
	Forward func(ctx context.Context, args json.RawMessage) (*mcp.CallToolResult, error)
	// ForwardRaw, when set and Forward is not, is Forward returning the
	// upstream's result as JSON (the "result" member of its response): the
	// MCP proxy's fast path, which passes a result through as bytes
	// (CallResult.Raw) unless it must be capped or is malformed.
	ForwardRaw func(ctx context.Context, args json.RawMessage) (json.RawMessage, error)
}

// Call decides a call, runs it when allowed, and records both (DESIGN.md
// §3, "Gate.Call"). For a built-in tool it first asks the tool what the
// call would touch (builtin.Tool.Inspect): a refusal there
// (path_outside_workspace, sql_not_read_only, sql_unclassifiable,
// bad_arguments) is a deny at the resource layer, recorded like any deny,
// and the reported resources join the decision (check 8), except for
// workspace tools, whose check 8 is the workspace confinement Inspect
// itself enforces (Wyrd). Inspect runs only for a call that passes every
// layer before the resource layer, so a caller learns nothing about a tool
// it may not invoke. Then Authorize decides and records, and an allowed
// call runs through Execute.
//
// The Outcome is Authorize's (or the resource refusal's); the CallResult is
// zero unless the call was allowed.
func (g *Gate) Call(ctx context.Context, req Request) (Outcome, CallResult) {
	return g.CallWith(ctx, req, nil)
}

// CallWith is Call with options.
func (g *Gate) CallWith(ctx context.Context, req Request, opts *CallOptions) (Outcome, CallResult) {
	pa := parseArgs(req.Args)
	req, res, refused, done := g.inspect(ctx, req, pa)
	if done {
		return refused, CallResult{Resources: res}
	}
	out := g.authorize(ctx, req, pa)
	cr := CallResult{Resources: res}
	if !out.Decision.Allowed() {
		return out, cr
	}
	return out, g.execute(ctx, req, out, opts, cr.Resources)
}

// AuthorizeInspected decides and records a call as Call does, without
// running it: a built-in tool is inspected first, so what the call would
// touch is part of the decision (the JSON API's /v1/decide). An allow
// consumes an approval exactly as Call's would.
func (g *Gate) AuthorizeInspected(ctx context.Context, req Request) Outcome {
	pa := parseArgs(req.Args)
	req, _, refused, done := g.inspect(ctx, req, pa)
	if done {
		return refused
	}
	return g.authorize(ctx, req, pa)
}

// inspect runs a built-in tool's Inspect for a call that passes every layer
// before the resource layer and adds what it reports to req. done is true
// when the call is already decided (refused, and recorded).
func (g *Gate) inspect(ctx context.Context, req Request, pa parsed) (Request, []toolgate.Resource, Outcome, bool) {
	snap := g.Snapshot()
	pre := g.decide(snap, &toolgate.Call{AgentID: req.AgentID, DeploymentMode: req.DeploymentMode, InstanceID: req.InstanceID,
		Environment: req.Environment, Principal: req.Principal, Tool: req.Tool, Args: pa.args.Value, ArgsErr: pa.err, ToolLevel: true}, req.Identity)
	if pre.Verdict == toolgate.Deny {
		return req, nil, Outcome{}, false // Authorize refuses it with the full decision
	}
	var cr CallResult
	if t, ok := snap.Tool(pre.ToolID); ok && t.Builtin != "" {
		bt, ok := g.builtin(t.Builtin)
		if !ok {
			return req, nil, g.refuse(ctx, req, pa, deny(pre, req, toolgate.CodeInternalError, toolgate.LayerInternal,
				fmt.Sprintf("the built-in tool %s is not available in this gateway, so what the call would touch cannot be checked (fail closed); configure it (a Database document for sql.*) or remove %s from the catalog", t.Builtin, t.ID))), true
		}
		inv := builtin.Invocation{Args: pa.args.Canonical, Workspace: g.workspace(snap, req.AgentID)}
		res, err := bt.Inspect(ctx, inv)
		if err != nil {
			var te *toolgate.Error
			if errors.As(err, &te) {
				layer := te.Layer
				if layer == toolgate.LayerNone {
					layer = toolgate.LayerResource
				}
				return req, nil, g.refuse(ctx, req, pa, deny(pre, req, te.Code, layer,
					fmt.Sprintf("%s layer: %s refused the call before it ran: %s", layer, t.Builtin, te.Message))), true
			}
			return req, nil, g.refuse(ctx, req, pa, deny(pre, req, toolgate.CodeInternalError, toolgate.LayerInternal,
				fmt.Sprintf("%s could not tell what the call would touch, so it is refused (fail closed): %v", t.Builtin, err))), true
		}
		cr.Resources = res
		if !bt.Spec().NeedsWorkspace {
			req.Resources = append(append([]toolgate.Resource(nil), req.Resources...), res...)
		} else {
			// Workspace confinement is this tool's resource check (Wyrd);
			// conditions still see the files it really touches.
			req.Observed = append(append([]toolgate.Resource(nil), req.Observed...), res...)
		}
	}
	return req, cr.Resources, Outcome{}, false
}

// Execute runs a call that Authorize allowed through the adapter (the
// tool's timeout, retries by side-effect class, the result cap) and records
// agent.tool.completed or agent.tool.failed with the output digest,
// returned bytes, attempts, duration, and in details each failed attempt.
// Given an outcome that does not allow the call, it runs nothing and
// returns ErrNotAllowed.
func (g *Gate) Execute(ctx context.Context, req Request, out Outcome, opts *CallOptions) CallResult {
	return g.execute(ctx, req, out, opts, nil)
}

// execute is Execute, recording resources (what a built-in tool reported)
// with the completion.
func (g *Gate) execute(ctx context.Context, req Request, out Outcome, opts *CallOptions, resources []toolgate.Resource) CallResult {
	cr := CallResult{Resources: resources}
	if !out.Decision.Allowed() {
		cr.Err = ErrNotAllowed
		cr.Failed = true
		return cr
	}
	snap := g.Snapshot()
	t, ok := snap.Tool(out.Decision.ToolID)
	pol := adapter.Policy{Class: out.Decision.SideEffectClass, Idempotent: t.Idempotent}
	if t.Doc != nil {
		pol.Timeout = t.Doc.Timeout.D()
		pol.MaxAttempts = t.Doc.Retry.MaxAttempts
		pol.InitialBackoff, pol.MaxBackoff = t.Doc.Retry.InitialBackoff.D(), t.Doc.Retry.MaxBackoff.D()
	}
	var (
		run       func(ctx context.Context) (*mcp.CallToolResult, bool, error)
		ex        = g.opts.Executor
		truncated bool
		raw       json.RawMessage // ForwardRaw's result
	)
	switch {
	case !ok:
		cr.Err = fmt.Errorf("%w: %s left the catalog after it was allowed", ErrNotExecutable, out.Decision.ToolID)
	case t.Builtin != "":
		bt, found := g.builtin(t.Builtin)
		if !found {
			cr.Err = fmt.Errorf("%w: the built-in tool %s is not configured", ErrNotExecutable, t.Builtin)
			break
		}
		inv := builtin.Invocation{Args: out.CanonicalArgs, Workspace: g.workspace(snap, req.AgentID), Inspected: resources}
		run = func(ctx context.Context) (*mcp.CallToolResult, bool, error) {
			r, err := bt.Run(ctx, inv)
			if err != nil {
				if transientBuiltin(err) {
					return nil, false, adapter.Transient(err)
				}
				return nil, false, err
			}
			return adapter.TextResult(r.Content, r.Structured, false), r.Truncated, nil
		}
	case t.MCPServer != "":
		// The upstream gets the arguments that were decided, re-encoded
		// (canonical JSON), never the bytes the client sent.
		args := json.RawMessage(out.CanonicalArgs)
		forward := func(ctx context.Context) (*mcp.CallToolResult, error) {
			if ex == nil || ex.Upstreams == nil {
				return nil, fmt.Errorf("%w: no upstream MCP servers are connected", ErrNotExecutable)
			}
			return ex.Upstreams.CallTool(ctx, t.MCPServer, &mcp.CallToolParams{Name: upstreamToolName(snap, t), Arguments: args})
		}
		if opts != nil && opts.Forward != nil {
			forward = func(ctx context.Context) (*mcp.CallToolResult, error) { return opts.Forward(ctx, args) }
		} else if opts != nil && opts.ForwardRaw != nil {
			forward = func(ctx context.Context) (*mcp.CallToolResult, error) {
				r, err := opts.ForwardRaw(ctx, args)
				if err == nil {
					raw = r
				}
				return nil, err
			}
		}
		run = func(ctx context.Context) (*mcp.CallToolResult, bool, error) {
			r, err := forward(ctx)
			if err != nil && !errors.Is(err, ErrClientAsked) && (errors.Is(err, upstream.ErrDown) || errors.Is(err, upstream.ErrCallTimeout)) {
				err = adapter.Transient(err)
			}
			return r, false, err
		}
	default:
		cr.Err = fmt.Errorf("%w: %s has no mcp_server or builtin source (its agent runtime runs it)", ErrNotExecutable, t.ID)
	}

	start := g.now()
	var res *mcp.CallToolResult
	if run != nil {
		runner := adapter.New(nil)
		if ex != nil && ex.Runner != nil {
			runner = ex.Runner
		}
		cr.Ran = true
		cr.AttemptLog, cr.Err = runner.Do(ctx, pol, func(actx context.Context) error {
			r, cut, err := run(actx)
			if err == nil {
				res, truncated = r, cut
			}
			return err
		})
	}
	cr.Duration = g.now().Sub(start)
	maxBytes := snap.Settings().ResultMaxKiB * 1024
	if maxBytes <= 0 {
		maxBytes = builtin.DefaultResultMaxKiB * 1024
	}
	if cr.Err == nil && raw != nil {
		if isError, ok := passThrough(raw, maxBytes); ok {
			cr.Raw, cr.Output, cr.Failed = raw, raw, isError
			cr.Attempts = len(cr.AttemptLog)
			cr.Details = completionDetails(cr)
			g.Complete(ctx, req, out, cr.Result)
			return cr
		}
		res = new(mcp.CallToolResult)
		if err := json.Unmarshal(raw, res); err != nil {
			res, cr.Err = nil, fmt.Errorf("upstream %s answered with a malformed result: %w", t.MCPServer, err)
		}
	}
	if cr.Err != nil {
		res = adapter.TextResult(failureText(req.Tool, cr.Err), nil, true)
	}
	if res != nil && cr.Err == nil {
		res.Meta = stripOwnMeta(res.Meta)
	}
	res, cut := adapter.CapResult(res, maxBytes)
	cr.Tool, cr.Truncated = res, truncated || cut
	if res != nil {
		cr.Output, _ = json.Marshal(res)
	}
	cr.Failed = cr.Err != nil || res == nil || res.IsError
	cr.Attempts = len(cr.AttemptLog)
	cr.Details = completionDetails(cr)
	g.Complete(ctx, req, out, cr.Result)
	return cr
}

// passThrough reports whether an upstream's raw result may go to the client
// as it is: no larger than maxBytes (the result cap then has nothing to
// cut), with only CallToolResult's members, and content blocks of a known
// type with their required members of the right JSON type, so that it
// decodes exactly as the SDK would decode it; anything else is decoded
// and re-encoded (or refused) as on the SDK path. isError is its isError.
func passThrough(raw json.RawMessage, maxBytes int) (isError, ok bool) {
	if len(raw) > maxBytes {
		return false, false
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(raw, &top); err != nil {
		return false, false
	}
	for k := range top {
		switch k {
		case "content", "structuredContent", "isError", "_meta":
		default:
			return false, false
		}
	}
	var probe struct {
		IsError *bool          `json:"isError"`
		Meta    map[string]any `json:"_meta"`
		Content []struct {
			Type     string  `json:"type"`
			Text     *string `json:"text"`
			Data     *string `json:"data"`
			MIMEType *string `json:"mimeType"`
			URI      *string `json:"uri"`
			Name     *string `json:"name"`
			Resource *struct {
				URI  string  `json:"uri"`
				Text *string `json:"text"`
				Blob *string `json:"blob"`
			} `json:"resource"`
		} `json:"content"`
	}
	if err := json.Unmarshal(raw, &probe); err != nil || probe.Content == nil {
		return false, false
	}
	if hasOwnMeta(probe.Meta) {
		return false, false // decoded and stripped (stripOwnMeta)
	}
	for _, c := range probe.Content {
		var good bool
		switch c.Type {
		case "text":
			good = c.Text != nil
		case "image", "audio":
			good = c.Data != nil && c.MIMEType != nil
		case "resource_link":
			good = c.URI != nil && c.Name != nil
		case "resource":
			good = c.Resource != nil && c.Resource.URI != "" && (c.Resource.Text != nil || c.Resource.Blob != nil)
		}
		if !good {
			return false, false
		}
	}
	return probe.IsError != nil && *probe.IsError, true
}

// hasOwnMeta reports whether an upstream's _meta holds a key of the
// gateway's own namespace (io.toolgate/...) other than the upstream
// guard's refusal mark (upstream.RefusedMetaKey, set by the gateway itself).
func hasOwnMeta(meta map[string]any) bool {
	for k := range meta {
		if strings.HasPrefix(k, "io.toolgate/") && k != upstream.RefusedMetaKey {
			return true
		}
	}
	return false
}

// stripOwnMeta removes from an upstream's result the keys of the gateway's
// own namespace: an upstream cannot speak for the gateway (a forged
// io.toolgate/decision, with a made-up approval id, would reach the client
// as the gateway's word). docs/design.md, "The governed party never lowers
// its own risk".
func stripOwnMeta(meta mcp.Meta) mcp.Meta {
	if !hasOwnMeta(meta) {
		return meta
	}
	out := mcp.Meta{}
	for k, v := range meta {
		if !strings.HasPrefix(k, "io.toolgate/") || k == upstream.RefusedMetaKey {
			out[k] = v
		}
	}
	return out
}

// completionDetails are what the completion event adds: failed attempts,
// resources, truncation.
func completionDetails(cr CallResult) map[string]any {
	d := map[string]any{}
	var failed []adapter.Attempt
	for _, a := range cr.AttemptLog {
		if a.Error != "" {
			failed = append(failed, a)
		}
	}
	if len(failed) > 0 {
		d["failed_attempts"] = failed
	}
	if len(cr.Resources) > 0 {
		d["resources"] = cr.Resources
	}
	if cr.Truncated {
		d["truncated"] = true
	}
	var te *toolgate.Error
	if errors.As(cr.Err, &te) {
		d["refused"] = string(te.Code)
	}
	return d
}

// failureText is the isError text of a call that could not be run.
func failureText(tool string, err error) string {
	var te *toolgate.Error
	switch {
	case errors.As(err, &te):
		return fmt.Sprintf("%s refused the call (%s): %s", tool, te.Code, te.Message)
	case errors.Is(err, ErrNotExecutable):
		return fmt.Sprintf("The call to %s was allowed and recorded, but %v.", tool, err)
	case adapter.IsTransient(err):
		return fmt.Sprintf("The call to %s was allowed and recorded, but the tool could not be reached: %v. Try again later.", tool, err)
	}
	return fmt.Sprintf("%s failed: %v", tool, err)
}

// transientBuiltin reports whether a built-in tool's error is a broken
// connection worth another attempt (never a refusal or the tool's own
// error, and never the database's statement timeout: the same query would
// time out again).
func transientBuiltin(err error) bool {
	var te *toolgate.Error
	if errors.As(err, &te) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return false
	}
	var ne net.Error
	var retry interface{ SafeToRetry() bool }
	return errors.Is(err, driver.ErrBadConn) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) ||
		errors.As(err, &ne) || (errors.As(err, &retry) && retry.SafeToRetry())
}

// upstreamToolName is the upstream's own name of an MCP tool: the
// model-visible name without the upstream's tool_prefix.
func upstreamToolName(snap *authz.Snapshot, t authz.Tool) string {
	for _, u := range snap.Bundle().Upstreams {
		if u.Name == t.MCPServer {
			return strings.TrimPrefix(t.Name, u.Prefix())
		}
	}
	return t.Name
}

func (g *Gate) builtin(name string) (builtin.Tool, bool) {
	ex := g.opts.Executor
	if ex == nil || ex.Builtins == nil {
		return nil, false
	}
	return ex.Builtins.Lookup(name)
}

// workspace returns the agent's workspace as an absolute path ("" for
// none): the bundle's value, relative to Executor.BaseDir.
func (g *Gate) workspace(snap *authz.Snapshot, agentID string) string {
	ws := snap.Workspace(agentID)
	if ws == "" {
		return ""
	}
	if !filepath.IsAbs(ws) {
		base := ""
		if g.opts.Executor != nil {
			base = g.opts.Executor.BaseDir
		}
		ws = filepath.Join(base, ws)
	}
	if abs, err := filepath.Abs(ws); err == nil {
		ws = abs
	}
	return ws
}

// deny is a refusal decided outside authz (by a built-in tool's Inspect),
// carrying what the tool-level decision knew about the tool.
func deny(pre toolgate.Decision, req Request, code toolgate.Code, layer toolgate.Layer, reason string) toolgate.Decision {
	return toolgate.Decision{Verdict: toolgate.Deny, Code: code, Layer: layer, Reason: reason, ToolID: pre.ToolID,
		ToolName: req.Tool, EventType: toolgate.EventUnauthorized, SideEffectClass: pre.SideEffectClass, ApprovalTier: pre.ApprovalTier}
}

// refuse records a deny decided outside authz, exactly as Authorize records
// its denials, and returns its outcome.
func (g *Gate) refuse(ctx context.Context, req Request, pa parsed, d toolgate.Decision) Outcome {
	out := g.newOutcome(req, pa)
	out.Decision = d
	g.record(ctx, req, &out, false)
	return out
}
