package mcpproxy

// Pass-through is not a way around the gate: resources/read,
// resources/subscribe, prompts/get and completion/complete are each one
// access, routed, decided, recorded and forwarded by gate.HandleAccess
// (docs/design.md, "Resources and prompts"), and the items of
// resources/list, resources/templates/list and prompts/list are shown by
// the same decision at tool level (gate.AccessFilter). Whatever is not
// disclosed to the caller looks exactly as if it did not exist.
//
// The relay is the gate's Routes: the routing and the forwarding are one
// choice, made once. The gateway resolves which upstream owns a URI, a
// prompt or a completion reference (ResourceOwner, the rule below), the
// decision is made for that upstream, and the access is forwarded to
// exactly that upstream. The SDK's own routing (its resource and template
// matching) is never used.
//
// The owner of a resource URI:
//
//  1. the upstream that listed exactly this URI in resources/list;
//  2. else, of the resource templates that match the URI, the one with the
//     longest literal prefix (the text before its first {expression}):
//     "file:///hr/{+path}" is more specific than "file:///{+path}" for
//     file:///hr/salaries.csv. Two matching templates with the same
//     literal prefix make the URI ambiguous: it has no owner (and the
//     gateway logs it);
//  3. else, the one upstream that declares resources, if exactly one does.
//
// Routing judges nothing: a URI that percent-decoding could turn into
// another path, or that has a second spelling, is refused for its form by
// the decision (the composition layer, before its owner is looked at), so
// it is never forwarded, and an upstream cannot read a different path
// than the one that was decided.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/yosida95/uritemplate/v3"

	"github.com/toolgate/toolgate"
	"github.com/toolgate/toolgate/gate"
)

// disclose is gate.Disclose for the identity without its session (the
// disclosure does not depend on it, and one cache entry per credential
// is enough).
func (p *Proxy) disclose(id gate.Identity) *gate.Disclosure {
	id.Session = ""
	return p.g.Disclose(id)
}

// reachable is gate.Reachable for the identity without its session.
func (p *Proxy) reachable(id gate.Identity) map[string]bool {
	id.Session = ""
	return p.g.Reachable(id)
}

var _ gate.Routes = (*relay)(nil)

// ResourceOwner is the upstream that owns uri (the rule in the file
// comment); why says why there is none.
func (r *relay) ResourceOwner(uri string) (string, string) { return r.ownerOfURI(uri) }

// TemplateOwner is the upstream that listed exactly the template tmpl.
func (r *relay) TemplateOwner(tmpl string) (string, bool) { return r.templateOwner(tmpl) }

// PromptOwner is the upstream, and its own name, of the prompt the client
// calls name.
func (r *relay) PromptOwner(name string) (string, string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ref, ok := r.prompts[name]
	return ref.upstream, ref.name, ok
}

// literalPrefix is the text of a URI template before its first expression.
func literalPrefix(tmpl string) string {
	if i := strings.IndexByte(tmpl, '{'); i >= 0 {
		return tmpl[:i]
	}
	return tmpl
}

// ownerOfURI resolves the upstream that owns a resource URI (the rule in
// the file comment); why says why there is none.
func (r *relay) ownerOfURI(uri string) (owner string, why string) {
	r.mu.Lock()
	if up, ok := r.resOwner[uri]; ok {
		r.mu.Unlock()
		return up, ""
	}
	type cand struct{ tmpl, owner string }
	var best []cand
	bestLen := -1
	for tmpl, up := range r.tmplOwner {
		lp := literalPrefix(tmpl)
		if !strings.HasPrefix(uri, lp) || len(lp) < bestLen {
			continue
		}
		t := r.tmplCompiled[tmpl]
		if t == nil || !t.Regexp().MatchString(uri) {
			continue
		}
		if len(lp) > bestLen {
			best, bestLen = best[:0], len(lp)
		}
		best = append(best, cand{tmpl, up})
	}
	r.mu.Unlock()
	switch len(best) {
	case 1:
		return best[0].owner, ""
	case 0:
		if up, ok := r.soleResourceUpstream(); ok {
			return up, ""
		}
		return "", "no upstream lists it and no template matches it"
	}
	var names []string
	for _, c := range best {
		names = append(names, fmt.Sprintf("%s (%s)", c.tmpl, c.owner))
	}
	return "", fmt.Sprintf("it is ambiguous: the templates %s match it with the same literal prefix %q", strings.Join(names, ", "), best[0].tmpl[:bestLen])
}

// compileTemplate is the matcher of a URI template (nil if it does not
// parse).
func compileTemplate(tmpl string) *uritemplate.Template {
	t, err := uritemplate.New(tmpl)
	if err != nil {
		return nil
	}
	return t
}

// resourceNotFound is the SDK's "Resource not found" error for uri, with
// its data encoded as JSON for any URI (the SDK's own quotes it as Go
// does, which is not JSON for a control character, and the answer is then
// lost).
func resourceNotFound(uri string) error {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.Encode(map[string]string{"uri": uri})
	return &jsonrpc.Error{Code: mcp.CodeResourceNotFound, Message: "Resource not found", Data: json.RawMessage(bytes.TrimSpace(b.Bytes()))}
}

func unknownPrompt(name string) error {
	return &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: fmt.Sprintf("unknown prompt %q", name)}
}

// ownerKey carries the owner the gate decided a resources/subscribe for
// to the SDK's subscribe handler (relay.subscribe).
type ownerKey struct{}

// passThrough serves the pass-through requests of a client: the lists
// (each item shown by its tool-level access decision, then paged:
// lists.go), and resources/read, resources/subscribe, prompts/get and
// completion/complete, each one access through gate.HandleAccess,
// forwarded to the owner the gate routed it to. handled is false for
// other requests.
func (p *Proxy) passThrough(ctx context.Context, id gate.Identity, method string, req mcp.Request, next mcp.MethodHandler) (res mcp.Result, err error, handled bool) {
	sid := sessionID(req)
	id = withSession(id, sid)
	gen := p.lists.generation(p.g.Snapshot())
	switch r := req.(type) {
	case *mcp.ListResourcesRequest:
		f := p.g.AccessFilter(id)
		items := p.relay.resourceList()
		var kept int
		page, next, err := listPage(p.lists, method, sid, gen, cursorOf(r.Params, func(p *mcp.ListResourcesParams) string { return p.Cursor }), items,
			counting(func(x ownedResource) bool { return f.Resource(x.owner, x.def.URI) }, &kept), func(x ownedResource) string { return x.def.URI })
		p.listed(ctx, id, method, len(page), len(items)-kept, err)
		if err != nil {
			return nil, err, true
		}
		out := &mcp.ListResourcesResult{Resources: make([]*mcp.Resource, 0, len(page)), NextCursor: next}
		for _, x := range page {
			out.Resources = append(out.Resources, x.def)
		}
		out.CacheScope = "private"
		return out, nil, true
	case *mcp.ListResourceTemplatesRequest:
		f := p.g.AccessFilter(id)
		items := p.relay.templateList()
		var kept int
		page, next, err := listPage(p.lists, method, sid, gen, cursorOf(r.Params, func(p *mcp.ListResourceTemplatesParams) string { return p.Cursor }), items,
			counting(func(x ownedTemplate) bool { return f.Template(x.owner, x.def.URITemplate) }, &kept), func(x ownedTemplate) string { return x.def.URITemplate })
		p.listed(ctx, id, method, len(page), len(items)-kept, err)
		if err != nil {
			return nil, err, true
		}
		out := &mcp.ListResourceTemplatesResult{ResourceTemplates: make([]*mcp.ResourceTemplate, 0, len(page)), NextCursor: next}
		for _, x := range page {
			out.ResourceTemplates = append(out.ResourceTemplates, x.def)
		}
		out.CacheScope = "private"
		return out, nil, true
	case *mcp.ListPromptsRequest:
		f := p.g.AccessFilter(id)
		items := p.relay.promptList()
		var kept int
		page, next, err := listPage(p.lists, method, sid, gen, cursorOf(r.Params, func(p *mcp.ListPromptsParams) string { return p.Cursor }), items,
			counting(func(x ownedPrompt) bool { return f.Prompt(x.owner, x.name) }, &kept), func(x ownedPrompt) string { return x.def.Name })
		p.listed(ctx, id, method, len(page), len(items)-kept, err)
		if err != nil {
			return nil, err, true
		}
		out := &mcp.ListPromptsResult{Prompts: make([]*mcp.Prompt, 0, len(page)), NextCursor: next}
		for _, x := range page {
			out.Prompts = append(out.Prompts, x.def)
		}
		out.CacheScope = "private"
		return out, nil, true
	case *mcp.ReadResourceRequest:
		if r.Params == nil {
			return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "resources/read: missing params"}, true
		}
		out := p.g.HandleAccess(ctx, gate.AccessRequest{Identity: id, Kind: toolgate.AccessResourceRead, URI: r.Params.URI,
			Method: method, Via: "mcp", Forward: func(ctx context.Context, route gate.Route) (any, error) {
				return p.relay.read(ctx, route.Upstream, r)
			}})
		res, err := accessAnswer[*mcp.ReadResourceResult](out, toolgate.AccessResourceRead, r.Params.URI)
		return res, err, true
	case *mcp.SubscribeRequest:
		if r.Params == nil {
			return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "resources/subscribe: missing params"}, true
		}
		out := p.g.HandleAccess(ctx, gate.AccessRequest{Identity: id, Kind: toolgate.AccessResourceSubscribe, URI: r.Params.URI,
			Method: method, Via: "mcp", Forward: func(ctx context.Context, route gate.Route) (any, error) {
				// The SDK keeps who subscribed (its resources/updated
				// fan-out) and calls relay.subscribe, which subscribes
				// exactly this owner.
				return next(context.WithValue(ctx, ownerKey{}, route.Upstream), method, req)
			}})
		res, err := accessAnswer[mcp.Result](out, toolgate.AccessResourceSubscribe, r.Params.URI)
		return res, err, true
	case *mcp.GetPromptRequest:
		if r.Params == nil {
			return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "prompts/get: missing params"}, true
		}
		args, err := json.Marshal(r.Params.Arguments)
		if err != nil {
			return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: fmt.Sprintf("prompts/get: arguments: %v", err)}, true
		}
		if r.Params.Arguments == nil {
			args = nil
		}
		out := p.g.HandleAccess(ctx, gate.AccessRequest{Identity: id, Kind: toolgate.AccessPromptGet, Prompt: r.Params.Name, Args: args,
			Method: method, Via: "mcp", Forward: func(ctx context.Context, route gate.Route) (any, error) {
				return p.relay.getPrompt(ctx, promptRef{route.Upstream, route.Prompt}, r)
			}})
		res, err := accessAnswer[*mcp.GetPromptResult](out, toolgate.AccessPromptGet, r.Params.Name)
		return res, err, true
	case *mcp.CompleteRequest:
		if r.Params == nil || r.Params.Ref == nil {
			return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "completion/complete: missing ref"}, true
		}
		ref := *r.Params.Ref
		// What the completion is decided on: the context's arguments with
		// the argument being completed set to its value so far.
		cargs := map[string]string{}
		if r.Params.Context != nil {
			for k, v := range r.Params.Context.Arguments {
				cargs[k] = v
			}
		}
		if r.Params.Argument.Name != "" {
			cargs[r.Params.Argument.Name] = r.Params.Argument.Value
		}
		args, err := json.Marshal(cargs)
		if err != nil {
			return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: fmt.Sprintf("completion/complete: arguments: %v", err)}, true
		}
		ar := gate.AccessRequest{Identity: id, Args: args, Method: method, Via: "mcp"}
		name := ref.URI
		switch ref.Type {
		case "ref/prompt":
			ar.Kind, ar.Prompt, name = toolgate.AccessPromptComplete, ref.Name, ref.Name
		case "ref/resource":
			ar.Kind, ar.URI = toolgate.AccessResourceComplete, ref.URI
		default:
			return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: fmt.Sprintf("completion/complete: unknown reference type %.64q", ref.Type)}, true
		}
		ar.Forward = func(ctx context.Context, route gate.Route) (any, error) {
			up := ref
			if up.Type == "ref/prompt" {
				up.Name = route.Prompt // the upstream's own name
			}
			return p.relay.completeAt(ctx, route.Upstream, &up, r)
		}
		out := p.g.HandleAccess(ctx, ar)
		res, err := accessAnswer[*mcp.CompleteResult](out, ar.Kind, name)
		return res, err, true
	}
	return nil, nil, false
}

// counting wraps a list filter to count the items it keeps in n.
func counting[T any](keep func(T) bool, n *int) func(T) bool {
	return func(x T) bool {
		k := keep(x)
		if k {
			*n++
		}
		return k
	}
}

// listed records a list request (gate.RecordMessage): how many items the
// page shows and how many of the gateway's items the caller is not shown;
// a refused list (err: a cursor of another list or session) is a deny.
func (p *Proxy) listed(ctx context.Context, id gate.Identity, method string, shown, hidden int, err error) {
	m := gate.Message{Identity: id, Type: toolgate.EventListServed, Method: method, Verdict: toolgate.Allow, Via: "mcp",
		Details: map[string]any{"shown": shown, "hidden": hidden}}
	if err != nil {
		m.Verdict, m.Code, m.Reason = toolgate.Deny, toolgate.CodeMalformedCall, err.Error()
		m.Details = nil
	}
	p.g.RecordMessage(ctx, m)
}

// AccessRefusedCode is the JSON-RPC error code of a resource or prompt
// access the caller is shown but that was refused or needs approval; the
// error's data holds the decision (verdict, code, layer, reason, target,
// approval_id).
const AccessRefusedCode = -32001

// accessAnswer is the one mapping from an access's outcome to what the
// client gets: the upstream's result, or its error; for an access the
// caller is not shown, exactly the error of a resource or prompt that
// does not exist; else an AccessRefusedCode error naming the layer.
func accessAnswer[R mcp.Result](out gate.AccessOutcome, kind toolgate.AccessKind, name string) (R, error) {
	var zero R
	d := out.Decision
	if !out.Visible {
		if kind.IsPrompt() {
			return zero, unknownPrompt(name)
		}
		return zero, resourceNotFound(name)
	}
	if d.Verdict != toolgate.Allow {
		data := map[string]any{"verdict": d.Verdict.String(), "code": string(d.Code), "layer": string(d.Layer), "reason": d.Reason}
		if d.Target != "" {
			data["target"] = d.Target
		}
		msg := fmt.Sprintf("toolgate: the %s layer refused this %s (%s): %s", d.Layer, kind, d.Code, d.Reason)
		if d.Verdict == toolgate.RequireApproval {
			msg = fmt.Sprintf("toolgate: this %s needs approval: %s", kind, d.Reason)
			if out.ApprovalID != "" {
				data["approval_id"] = out.ApprovalID
				msg = fmt.Sprintf("toolgate: approval %s is required for this %s (%s). An approver with approval:decide approves it (toolgate approvals approve %s --as PRINCIPAL, or POST /v1/approvals/%s/approve); then repeat exactly the same request and it is sent once.",
					out.ApprovalID, kind, d.Reason, out.ApprovalID, out.ApprovalID)
			}
		}
		raw, _ := json.Marshal(data)
		return zero, &jsonrpc.Error{Code: AccessRefusedCode, Message: msg, Data: raw}
	}
	if out.Err != nil {
		return zero, out.Err
	}
	res, ok := out.Result.(R)
	if !ok {
		return zero, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: fmt.Sprintf("toolgate: the %s was sent but gave no result", kind)}
	}
	return res, nil
}

// sessionID is the id of the request's session ("" for none).
func sessionID(req mcp.Request) string {
	if ss, ok := req.GetSession().(*mcp.ServerSession); ok && ss != nil {
		return ss.ID()
	}
	return ""
}

// cursorOf is a list request's cursor ("" for none): get reads it from
// params, which may be nil.
func cursorOf[P any](params *P, get func(*P) string) string {
	if params == nil {
		return ""
	}
	return get(params)
}
