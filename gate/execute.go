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
	"github.com/toolgate/toolgate/adapter/mcptool"
	"github.com/toolgate/toolgate/authz"
	"github.com/toolgate/toolgate/builtin"
	"github.com/toolgate/toolgate/upstream"
)

// Builtins finds built-in tools by their function name ("sql.query", the
// Tool's source.builtin); *registry.Registry implements it.
type Builtins interface {
	Lookup(name string) (builtin.Tool, bool)
}

// Upstreams runs tools of upstream MCP servers: one attempt of one call;
// *mcptool.Executor implements it (the one forwarder for every entry
// point).
type Upstreams interface {
	Run(ctx context.Context, c mcptool.Call) (mcptool.Result, error)
}

var _ Upstreams = (*mcptool.Executor)(nil)

// Executor is what Handle runs allowed calls with, by the tool's source.
// Set its fields before the gate serves calls; they are not changed
// afterwards.
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

// CallResult is what running an allowed call produced. Its Result (output,
// failed, error, attempts) is what the completion event records.
type CallResult struct {
	Result
	// Tool is the result returned to the caller, as an MCP tool result:
	// the tool's own (an upstream's, or a built-in's text with its data as
	// structuredContent), capped at Settings.result_max_kib; when the tool
	// could not be run (Err set), an isError result saying why. nil when
	// the call was not run, and when Raw is set.
	Tool *mcp.CallToolResult
	// Raw is the upstream's result as the JSON it sent, passed through
	// undecoded: set only when the upstream was reached on the direct
	// client and the result is a well-formed CallToolResult within the
	// result cap (else Tool holds it decoded, and capped).
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

// execute runs an allowed call through the executor of its source (the
// tool's timeout, retries by side-effect class, the result cap) and records
// agent.tool.completed or agent.tool.failed with the output digest,
// returned bytes, attempts, duration, and in details each failed attempt
// and what a built-in tool reported it touches (resources).
func (g *Gate) execute(ctx context.Context, snap *authz.Snapshot, req Request, out Outcome, resources []toolgate.Resource) CallResult {
	cr := CallResult{Resources: resources}
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
		raw       json.RawMessage // the direct client's result
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
		if ex == nil || ex.Upstreams == nil {
			cr.Err = fmt.Errorf("%w: no upstream MCP servers are connected", ErrNotExecutable)
			break
		}
		// The upstream gets the arguments that were decided, re-encoded
		// (canonical JSON), never the bytes the client sent; and the
		// client's _meta without the gateway's own namespace.
		c := mcptool.Call{Upstream: t.MCPServer, Tool: upstreamToolName(snap, t), Args: json.RawMessage(out.CanonicalArgs),
			Meta: mcptool.WithoutOwnMeta(req.Meta), Relay: req.Relay}
		run = func(ctx context.Context) (*mcp.CallToolResult, bool, error) {
			r, err := ex.Upstreams.Run(ctx, c)
			if err == nil {
				raw = r.Raw
			}
			return r.Tool, false, err
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
			g.complete(ctx, req, out, cr.Result)
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
	g.complete(ctx, req, out, cr.Result)
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
	if toolgate.CheckKeys(raw) != nil {
		// Duplicate or case-variant keys: a first-wins client and the
		// gateway (last wins) would read different results. Decoded and
		// re-encoded: the client gets what the audit log records.
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
