package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolgate/toolgate"
	"github.com/toolgate/toolgate/adapter/builtins"
	"github.com/toolgate/toolgate/adapter/mcptool"
	"github.com/toolgate/toolgate/audit"
	"github.com/toolgate/toolgate/authz"
	"github.com/toolgate/toolgate/gate"
	"github.com/toolgate/toolgate/gateway"
	"github.com/toolgate/toolgate/policy"
	"github.com/toolgate/toolgate/toolid"
	"github.com/toolgate/toolgate/upstream"
)

// callVia is the enforcement point name toolgate call records.
const callVia = "cli"

// callJSON is call's JSON output.
type callJSON struct {
	Decision callDecisionJSON `json:"decision"`
	// Result is the tool's result (MCP CallToolResult shape), null when it
	// did not run.
	Result        *mcp.CallToolResult `json:"result"`
	CorrelationID string              `json:"correlation_id"`
	// Attempts is how many times the tool was tried (0: it did not run).
	Attempts  int                 `json:"attempts"`
	Truncated bool                `json:"truncated,omitempty"`
	Resources []toolgate.Resource `json:"resources,omitempty"`
	// Error says why the tool failed (exit 5).
	Error string `json:"error,omitempty"`
}

type callDecisionJSON struct {
	decisionJSON
	ApprovalID string `json:"approval_id,omitempty"`
}

// runCall is "toolgate call": decide one call, run it when allowed, and
// record both in the data folder's audit log, in process (the built-in
// tools, and the upstreams the call may need, are started here).
func runCall(ctx context.Context, args []string, io IO) int {
	fs := newFlags("call", io)
	bundle := bundleFlag(fs)
	out := outputFlag(fs)
	cf := addCallFlags(fs)
	data := dataFlag(fs)
	if code, ok := parse(fs, args); !ok {
		return code
	}
	if !checkOutput(*out, io.Stderr) {
		return ExitUsage
	}
	if *cf.agent == "" || *cf.tool == "" {
		fmt.Fprintln(io.Stderr, "toolgate call: --agent and --tool are required")
		return ExitUsage
	}
	if *bundle == "" {
		fmt.Fprintln(io.Stderr, "toolgate call: --bundle DIR is required (or set TOOLGATE_BUNDLE)")
		return ExitUsage
	}
	b, err := policy.LoadDir(*bundle)
	if err != nil {
		return fail(io.Stderr, "%v", err)
	}
	snap, ok := compileCall(b, *bundle, nil, io.Stderr)
	if !ok {
		return ExitFailure
	}
	call, err := cf.buildCall(snap) // checks --args and --resource
	if err != nil {
		return fail(io.Stderr, "%v", err)
	}

	// Upstreams: only those the called name may belong to.
	mgr, err := startUpstreams(ctx, b, *bundle, snap, call.Tool, io.Stderr)
	if err != nil {
		return fail(io.Stderr, "%v", err)
	}
	if mgr != nil {
		defer mgr.Close()
		var announced []authz.AnnouncedTool
		for _, u := range b.Upstreams {
			if tools, ok := mgr.Tools(u.Name); ok {
				acc, _ := mcptool.Announced(u, tools)
				announced = append(announced, acc...)
			}
		}
		if snap, ok = compileCall(b, *bundle, announced, io.Stderr); !ok {
			return ExitFailure
		}
	}

	bt, err := builtins.Open(ctx, b, *bundle)
	if err != nil {
		return fail(io.Stderr, "built-in tools: %v", err)
	}
	defer bt.Close()
	store, err := openStore(*data, true)
	if err != nil {
		return fail(io.Stderr, "%v", err)
	}
	defer store.Close()
	rec := audit.NewRecorder(store, nil)
	ex := &gate.Executor{Builtins: bt, BaseDir: *bundle}
	if mgr != nil {
		ex.Upstreams = &mcptool.Executor{Upstreams: mgr}
	}
	g := gate.New(snap, &gate.Options{Recorder: rec, Approvals: store, Executor: ex})
	req := gate.Request{Identity: gate.Identity{Principal: call.Principal, AgentID: call.AgentID, InstanceID: call.InstanceID,
		Environment: call.Environment, DeploymentMode: call.DeploymentMode},
		Tool: call.Tool, Args: json.RawMessage(*cf.args), Resources: call.Resources, Via: callVia}
	o := g.Handle(ctx, req) // the operator chose the identity: the real decision is shown
	cr := o.Result

	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if err := rec.Close(cctx); err != nil {
		fmt.Fprintf(io.Stderr, "toolgate call: the audit log could not record everything: %v\n", err)
		return ExitFailure
	}

	d := o.Decision
	res := callJSON{Decision: callDecisionJSON{decisionJSON: toDecisionJSON(d), ApprovalID: o.ApprovalID}, Result: cr.Tool,
		CorrelationID: o.CorrelationID, Attempts: cr.Attempts, Truncated: cr.Truncated, Resources: cr.Resources}
	if d.Allowed() && cr.Failed {
		res.Error = resultText(cr)
	}
	if *out == "json" {
		writeJSON(io.Stdout, res)
	} else {
		printCall(io.Stdout, d, o, cr)
	}
	switch {
	case !d.Allowed():
		return verdictExit(d.Verdict)
	case cr.Failed:
		return ExitToolFail
	}
	return ExitOK
}

// compileCall compiles b with the upstream tools announced so far.
func compileCall(b *policy.Bundle, dir string, announced []authz.AnnouncedTool, stderr io.Writer) (*authz.Snapshot, bool) {
	opts := &authz.Options{}
	if o := compileOptions(b); o != nil {
		*opts = *o
	}
	opts.Announced = append(opts.Announced, announced...)
	return compileReporting(b, dir, opts, stderr)
}

// startUpstreams connects the upstreams the called name may belong to (by
// tool prefix, by provider, or by its Tool document's mcp_server), and
// returns nil when there are none (a built-in or declared-only tool). An
// upstream that does not start is reported on stderr; the call is then
// decided without its tools.
func startUpstreams(ctx context.Context, b *policy.Bundle, dir string, snap *authz.Snapshot, name string, stderr io.Writer) (*upstream.Manager, error) {
	id, _ := toolid.Map(name)
	t, known := snap.Tool(id)
	if known && t.Builtin != "" {
		return nil, nil
	}
	var cfgs []upstream.Config
	for _, u := range b.Upstreams {
		if strings.HasPrefix(name, u.Prefix()) || policy.ProviderOf(id) == u.Name || (known && t.MCPServer == u.Name) {
			cfgs = append(cfgs, gateway.UpstreamConfig(dir, u))
		}
	}
	if len(cfgs) == 0 {
		return nil, nil
	}
	mgr, err := upstream.New(cfgs, &upstream.Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return nil, err
	}
	if err := mgr.Start(ctx); err != nil {
		fmt.Fprintf(stderr, "toolgate call: warning: %v\n", err)
	}
	return mgr, nil
}

// resultText is the text of a result, or the error when there is none.
func resultText(cr gate.CallResult) string {
	var parts []string
	if cr.Tool != nil {
		for _, c := range cr.Tool.Content {
			if tc, ok := c.(*mcp.TextContent); ok {
				parts = append(parts, tc.Text)
			}
		}
	}
	if len(parts) == 0 && cr.Err != nil {
		return cr.Err.Error()
	}
	return strings.Join(parts, "\n")
}

func printCall(w io.Writer, d toolgate.Decision, o gate.Outcome, cr gate.CallResult) {
	printDecision(w, d)
	if o.ApprovalID != "" {
		fmt.Fprintf(w, "  approval: %s (approve it, then repeat exactly this call)\n", o.ApprovalID)
	}
	if !d.Allowed() {
		return
	}
	status := "ran"
	if cr.Failed {
		status = "FAILED"
	}
	fmt.Fprintf(w, "%s in %d attempt(s), %s\n", status, cr.Attempts, cr.Duration.Round(time.Millisecond))
	if text := resultText(cr); text != "" {
		fmt.Fprintln(w, text)
	}
}
