package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/toolgate/toolgate"
	"github.com/toolgate/toolgate/authz"
	"github.com/toolgate/toolgate/gateway"
	"github.com/toolgate/toolgate/policy"
)

// extraCommands are the subcommands beyond the decision core's; the
// gateway's files add theirs here.
func extraCommands() []command { return append(storeCommands(), gatewayCommands...) }

// gatewayCommands is set by the gateway subcommands' file.
var gatewayCommands []command

// loadSnapshot loads and compiles a bundle, printing diagnostics on failure.
func loadSnapshot(dir string, stderr io.Writer) (*authz.Snapshot, bool) {
	if dir == "" {
		fmt.Fprintln(stderr, "toolgate: --bundle DIR is required (or set TOOLGATE_BUNDLE)")
		return nil, false
	}
	b, err := policy.LoadDir(dir)
	if err != nil {
		fmt.Fprintf(stderr, "toolgate: %v\n", err)
		return nil, false
	}
	return compileReporting(b, dir, compileOptions(b), stderr)
}

// compileReporting compiles b, printing its errors on failure.
func compileReporting(b *policy.Bundle, dir string, opts *authz.Options, stderr io.Writer) (*authz.Snapshot, bool) {
	snap, rep, err := authz.Compile(b, opts)
	if err != nil {
		if rep != nil && !rep.OK() {
			fmt.Fprintf(stderr, "toolgate: the bundle %s is invalid (%d errors); run toolgate validate --bundle %s\n", dir, len(rep.Errors), dir)
			for _, d := range rep.Errors {
				fmt.Fprintf(stderr, "  error: %s\n", d)
			}
		} else {
			fmt.Fprintf(stderr, "toolgate: compile %s: %v\n", dir, err)
		}
		return nil, false
	}
	return snap, true
}

// compileOptions is replaced by the gateway to know its upstreams' names.
var compileOptions = func(b *policy.Bundle) *authz.Options { return nil }

// runValidate is "toolgate validate": everything toolgate serve does
// before it opens its store, listens and starts upstreams
// (gateway.Prepare with CheckOnly), so that a bundle it passes is one
// serve starts with. It writes nothing; --connect also reaches every
// PostgreSQL database.
func runValidate(ctx context.Context, args []string, io IO) int {
	fs := newFlags("validate", io)
	bundle := bundleFlag(fs)
	out := outputFlag(fs)
	connect := fs.Bool("connect", false, "also connect to every PostgreSQL database, as serve does (default: the DSN is only parsed)")
	if code, ok := parse(fs, args); !ok {
		return code
	}
	if !checkOutput(*out, io.Stderr) {
		return ExitUsage
	}
	if *bundle == "" {
		fmt.Fprintln(io.Stderr, "toolgate: --bundle DIR is required (or set TOOLGATE_BUNDLE)")
		return ExitUsage
	}
	var b *policy.Bundle
	var rep *policy.Report
	p, err := gateway.Prepare(ctx, gateway.Config{BundleDir: *bundle}, &gateway.PrepareOptions{CheckOnly: true, Connect: *connect})
	var inv *gateway.InvalidError
	switch {
	case err == nil:
		b, rep = p.Bundle, p.Report
		p.Close()
	case errors.As(err, &inv):
		b, rep = inv.Bundle, inv.Report
	default:
		return fail(io.Stderr, "%v", err)
	}
	if *out == "json" {
		writeJSON(io.Stdout, struct {
			OK bool `json:"ok"`
			*policy.Report
		}{rep.OK(), rep})
	} else {
		for _, d := range rep.Errors {
			fmt.Fprintf(io.Stdout, "error: %s\n", d)
		}
		for _, d := range rep.Warnings {
			fmt.Fprintf(io.Stdout, "warning: %s\n", d)
		}
		status := "valid"
		if !rep.OK() {
			status = "invalid"
		}
		fmt.Fprintf(io.Stdout, "%s: %s (%d errors, %d warnings; %d tools, %d agents, %d principals)\n", *bundle, status,
			len(rep.Errors), len(rep.Warnings), len(b.Tools), len(b.Agents), len(b.Principals))
	}
	if !rep.OK() {
		return ExitFailure
	}
	return ExitOK
}

// contextFlags are the invocation-context flags shared by resolve, decide,
// explain and call.
type contextFlags struct {
	agent, mode, instance, env, principal *string
}

func addContextFlags(fs *flag.FlagSet) contextFlags {
	return contextFlags{
		agent:     fs.String("agent", "", "agent id (required)"),
		mode:      fs.String("mode", authz.DefaultMode, "deployment mode"),
		instance:  fs.String("instance", "", "business instance id"),
		env:       fs.String("env", "", "environment of the instance (e.g. staging)"),
		principal: fs.String("principal", "", "principal the call runs as (default: Settings.default_principal)"),
	}
}

func runResolve(ctx context.Context, args []string, io IO) int {
	fs := newFlags("resolve", io)
	bundle := bundleFlag(fs)
	out := outputFlag(fs)
	cf := addContextFlags(fs)
	if code, ok := parse(fs, args); !ok {
		return code
	}
	if !checkOutput(*out, io.Stderr) {
		return ExitUsage
	}
	if *cf.agent == "" {
		fmt.Fprintln(io.Stderr, "toolgate resolve: --agent is required")
		return ExitUsage
	}
	if *bundle == "" {
		fmt.Fprintln(io.Stderr, "toolgate resolve: --bundle DIR is required (or set TOOLGATE_BUNDLE)")
		return ExitUsage
	}
	snap, ok := loadSnapshot(*bundle, io.Stderr)
	if !ok {
		return ExitFailure
	}
	res := snap.Resolve(authz.Context{AgentID: *cf.agent, DeploymentMode: *cf.mode, InstanceID: *cf.instance, Environment: *cf.env, Principal: *cf.principal})
	if *out == "json" {
		writeJSON(io.Stdout, res)
	} else {
		printResolution(io.Stdout, res)
	}
	if len(res.Tools) == 0 && len(res.Removed) > 0 {
		return ExitFailure // unknown agent
	}
	return ExitOK
}

var tableLayers = []toolgate.Layer{toolgate.LayerCeiling, toolgate.LayerRuntime, toolgate.LayerInstance,
	toolgate.LayerPolicy, toolgate.LayerGrant, toolgate.LayerApproval}

func mark(v string) string {
	switch v {
	case "pass":
		return "ok"
	case "deny":
		return "DENY"
	case "require_approval":
		return "approval"
	case "", "skipped":
		return "-"
	}
	return v
}

func printResolution(w io.Writer, r authz.Resolution) {
	ctx := "agent " + r.AgentID + ", mode " + r.DeploymentMode
	if r.InstanceID != "" {
		ctx += ", instance " + r.InstanceID
	}
	if r.Environment != "" {
		ctx += ", environment " + r.Environment
	}
	fmt.Fprintln(w, ctx)
	if len(r.Tools) == 0 {
		for _, rm := range r.Removed {
			fmt.Fprintln(w, "  "+rm.Reason)
		}
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprint(tw, "TOOL\tCLASS\tTIER")
	for _, l := range tableLayers {
		fmt.Fprint(tw, "\t"+strings.ToUpper(string(l)))
	}
	fmt.Fprintln(tw, "\tRESULT")
	for _, t := range r.Tools {
		fmt.Fprintf(tw, "%s\t%s\t%s", t.ToolID, t.SideEffectClass, t.ApprovalTier)
		for _, l := range tableLayers {
			fmt.Fprint(tw, "\t"+mark(t.Layers[l]))
		}
		result := "removed"
		switch {
		case t.Disclosed && t.ControlFlow:
			result = "disclosed (control flow)"
		case t.Disclosed && t.RequiresApproval:
			result = "disclosed (needs approval)"
		case t.Disclosed:
			result = "disclosed"
		}
		fmt.Fprintln(tw, "\t"+result)
	}
	tw.Flush()
	fmt.Fprintf(w, "\nactive tool set: [%s]\ndisclosed:       [%s]\n", strings.Join(r.ActiveToolSet, ", "), strings.Join(r.Disclosed, ", "))
	if len(r.Removed) > 0 {
		fmt.Fprintln(w, "removed:")
		for _, rm := range r.Removed {
			fmt.Fprintf(w, "  %s (%s, %s): %s\n", rm.ToolID, rm.Layer, rm.Code, rm.Reason)
		}
	}
}

// callFlags are decide/explain/call's flags.
type callFlags struct {
	contextFlags
	tool      *string
	args      *string
	resources stringList
}

func addCallFlags(fs *flag.FlagSet) *callFlags {
	cf := &callFlags{contextFlags: addContextFlags(fs)}
	cf.tool = fs.String("tool", "", "tool name as the model calls it (required)")
	cf.args = fs.String("args", "{}", "call arguments as a JSON object")
	fs.Var(&cf.resources, "resource", "a resource the call touches, TYPE=NAME or TYPE:ACTION=NAME (repeatable)")
	return cf
}

// buildCall turns flags into a Call; the error is bad input (exit 1).
// Arguments are parsed as every enforcement point parses them
// (toolgate.ParseArgs): ones the gateway refuses are decided as refused
// (malformed_call), not reported as a usage error.
func (cf *callFlags) buildCall(snap *authz.Snapshot) (*toolgate.Call, error) {
	a, argsErr := toolgate.ParseArgs([]byte(*cf.args))
	principal := *cf.principal
	if principal == "" {
		principal = snap.Settings().DefaultPrincipal
	}
	c := &toolgate.Call{AgentID: *cf.agent, DeploymentMode: *cf.mode, InstanceID: *cf.instance, Environment: *cf.env,
		Principal: principal, Tool: *cf.tool, Args: a.Value, ArgsErr: argsErr}
	for _, r := range cf.resources {
		typ, name, ok := strings.Cut(r, "=")
		if !ok || typ == "" || name == "" {
			return nil, fmt.Errorf("--resource %q: want TYPE=NAME or TYPE:ACTION=NAME", r)
		}
		typ, action, _ := strings.Cut(typ, ":")
		c.Resources = append(c.Resources, toolgate.Resource{Type: typ, Name: name, Action: action})
	}
	return c, nil
}

// accessFlags are decide's flags for a resource or prompt access instead
// of a tool call (docs/design.md, "Resources and prompts"). Offline there
// is no mirror of the upstreams' lists, so the upstream is named.
type accessFlags struct {
	access, upstream, uri, prompt *string
}

func addAccessFlags(fs *flag.FlagSet) *accessFlags {
	return &accessFlags{
		access:   fs.String("access", "", "decide a resource or prompt access instead of a tool call: resource_read, resource_subscribe, resource_complete, prompt_get or prompt_complete"),
		upstream: fs.String("upstream", "", "with --access: the upstream that owns the resource or prompt (required)"),
		uri:      fs.String("uri", "", "with --access resource_*: the resource URI (resource_complete: a template as the upstream lists it, or a URI)"),
		prompt:   fs.String("prompt", "", "with --access prompt_*: the upstream's own name of the prompt"),
	}
}

// buildAccess turns flags into an Access; the error is bad input (exit
// 1). --args are the prompt's (or completion's) arguments, parsed as
// every enforcement point parses them.
func (af *accessFlags) buildAccess(cf *callFlags, snap *authz.Snapshot) (*toolgate.Access, error) {
	var kind toolgate.AccessKind
	if err := kind.UnmarshalText([]byte(*af.access)); err != nil {
		return nil, fmt.Errorf("--access %q: want resource_read, resource_subscribe, resource_complete, prompt_get or prompt_complete", *af.access)
	}
	if *af.upstream == "" {
		return nil, fmt.Errorf("--access needs --upstream: the upstream that owns the resource or prompt")
	}
	if len(cf.resources) > 0 {
		return nil, fmt.Errorf("--resource is for tool calls; an access names --uri or --prompt")
	}
	principal := *cf.principal
	if principal == "" {
		principal = snap.Settings().DefaultPrincipal
	}
	a := &toolgate.Access{Kind: kind, AgentID: *cf.agent, DeploymentMode: *cf.mode, InstanceID: *cf.instance, Environment: *cf.env,
		Principal: principal, Upstream: *af.upstream, Now: time.Now()}
	switch {
	case kind.IsResource():
		if *af.prompt != "" || *af.uri == "" {
			return nil, fmt.Errorf("--access %s needs --uri (and no --prompt)", kind)
		}
		a.URI = *af.uri
		a.Template = kind == toolgate.AccessResourceComplete && policy.IsURITemplate(a.URI)
	default:
		if *af.uri != "" || *af.prompt == "" {
			return nil, fmt.Errorf("--access %s needs --prompt (and no --uri)", kind)
		}
		a.Prompt, a.PromptName = *af.prompt, *af.prompt
	}
	if kind.HasArgs() {
		args, err := toolgate.ParseArgs([]byte(*cf.args))
		a.Args, a.ArgsErr = args.Value, err
	} else if *cf.args != "{}" && *cf.args != "" {
		return nil, fmt.Errorf("--access %s takes no --args", kind)
	}
	return a, nil
}

// decisionJSON is decide's JSON output.
type decisionJSON struct {
	Verdict   string `json:"verdict"`
	Code      string `json:"code"`
	Layer     string `json:"layer"`
	Reason    string `json:"reason"`
	ToolID    string `json:"tool_id"`
	Target    string `json:"target,omitempty"`
	EventType string `json:"event_type"`
}

func toDecisionJSON(d toolgate.Decision) decisionJSON {
	return decisionJSON{Verdict: d.Verdict.String(), Code: string(d.Code), Layer: string(d.Layer), Reason: d.Reason,
		ToolID: d.ToolID, Target: d.Target, EventType: string(d.EventType)}
}

func verdictExit(v toolgate.Verdict) int {
	switch v {
	case toolgate.Allow:
		return ExitOK
	case toolgate.RequireApproval:
		return ExitApproval
	}
	return ExitDenied
}

func runDecide(ctx context.Context, args []string, io IO) int {
	return decideOrExplain("decide", args, io)
}

func runExplain(ctx context.Context, args []string, io IO) int {
	return decideOrExplain("explain", args, io)
}

func decideOrExplain(name string, args []string, io IO) int {
	fs := newFlags(name, io)
	bundle := bundleFlag(fs)
	out := outputFlag(fs)
	cf := addCallFlags(fs)
	af := &accessFlags{}
	if name == "decide" {
		af = addAccessFlags(fs)
	} else {
		af.access = new(string)
	}
	if code, ok := parse(fs, args); !ok {
		return code
	}
	if !checkOutput(*out, io.Stderr) {
		return ExitUsage
	}
	if *af.access != "" && name == "decide" {
		if *cf.agent == "" || *cf.tool != "" || *bundle == "" {
			fmt.Fprintf(io.Stderr, "toolgate %s --access: --agent and --bundle are required, and --tool is not (an access names --upstream and --uri or --prompt)\n", name)
			return ExitUsage
		}
		snap, ok := loadSnapshot(*bundle, io.Stderr)
		if !ok {
			return ExitFailure
		}
		a, err := af.buildAccess(cf, snap)
		if err != nil {
			return fail(io.Stderr, "%v", err)
		}
		d := snap.DecideAccess(a)
		if *out == "json" {
			writeJSON(io.Stdout, toDecisionJSON(d))
		} else {
			printDecision(io.Stdout, d)
		}
		return verdictExit(d.Verdict)
	}
	if *cf.agent == "" || *cf.tool == "" {
		fmt.Fprintf(io.Stderr, "toolgate %s: --agent and --tool are required\n", name)
		return ExitUsage
	}
	if *bundle == "" {
		fmt.Fprintf(io.Stderr, "toolgate %s: --bundle DIR is required (or set TOOLGATE_BUNDLE)\n", name)
		return ExitUsage
	}
	snap, ok := loadSnapshot(*bundle, io.Stderr)
	if !ok {
		return ExitFailure
	}
	call, err := cf.buildCall(snap)
	if err != nil {
		return fail(io.Stderr, "%v", err)
	}
	if name == "decide" {
		d := snap.Decide(call)
		if *out == "json" {
			writeJSON(io.Stdout, toDecisionJSON(d))
		} else {
			printDecision(io.Stdout, d)
		}
		return verdictExit(d.Verdict)
	}
	d, trace := snap.Explain(call)
	if *out == "json" {
		writeJSON(io.Stdout, struct {
			Decision decisionJSON        `json:"decision"`
			Layers   []authz.LayerResult `json:"layers"`
		}{toDecisionJSON(d), trace})
	} else {
		fmt.Fprintf(io.Stdout, "%s as principal %q, agent %s, mode %s\n", call.Tool, call.Principal, call.AgentID, modeOf(call))
		tw := tabwriter.NewWriter(io.Stdout, 0, 0, 2, ' ', 0)
		for _, l := range trace {
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", l.Layer, mark(l.Verdict), l.Code, l.Reason)
		}
		tw.Flush()
		fmt.Fprintln(io.Stdout)
		printDecision(io.Stdout, d)
	}
	return verdictExit(d.Verdict)
}

func modeOf(c *toolgate.Call) string {
	if c.DeploymentMode == "" {
		return authz.DefaultMode
	}
	return c.DeploymentMode
}

func printDecision(w io.Writer, d toolgate.Decision) {
	layer := ""
	if d.Layer != "" {
		layer = " at the " + string(d.Layer) + " layer"
	}
	what := d.ToolID
	if what == "" {
		what = d.Target
	}
	fmt.Fprintf(w, "%s %s (%s%s)\n  %s\n  event: %s\n", strings.ToUpper(d.Verdict.String()), what, d.Code, layer, d.Reason, d.EventType)
}
