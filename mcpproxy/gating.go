package mcpproxy

import (
	"context"
	"fmt"
	"maps"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/yosida95/uritemplate/v3"

	"github.com/toolgate/toolgate/gate"
)

// Pass-through is not a way around disclosure: a client reaches the
// resources, resource templates, prompts and completions of an upstream
// only when at least one of that upstream's tools is disclosed to it (the
// agent is composed with the upstream and authorized for part of it).
// Anything else looks exactly as if it did not exist.

// reachable returns the upstreams the identity may reach through
// pass-through.
func (p *Proxy) reachable(id gate.Identity) map[string]bool {
	disc := p.g.Disclose(id)
	snap := p.g.Snapshot()
	out := map[string]bool{}
	for toolID := range disc.Disclosed {
		if t, ok := snap.Tool(toolID); ok && t.MCPServer != "" {
			out[t.MCPServer] = true
		}
	}
	return out
}

// resourceOwner returns the upstream a resource URI belongs to: its listed
// owner, or the only upstream with resources (for URIs from templates).
func (p *Proxy) resourceOwner(uri string) (string, bool) {
	if p.relay == nil {
		return "", false
	}
	p.relay.mu.Lock()
	up, ok := p.relay.resOwner[uri]
	var tmpls map[string]string
	if !ok {
		tmpls = maps.Clone(p.relay.tmplOwner)
	}
	p.relay.mu.Unlock()
	if ok {
		return up, true
	}
	// A URI made from a template belongs to the template's upstream.
	for tmpl, owner := range tmpls {
		if t, err := uritemplate.New(tmpl); err == nil && t.Regexp().MatchString(uri) {
			return owner, true
		}
	}
	return p.relay.soleResourceUpstream()
}

func (p *Proxy) promptOwner(name string) (string, bool) {
	if p.relay == nil {
		return "", false
	}
	p.relay.mu.Lock()
	defer p.relay.mu.Unlock()
	ref, ok := p.relay.prompts[name]
	return ref.upstream, ok
}

func (p *Proxy) templateOwner(tmpl string) (string, bool) {
	if p.relay == nil {
		return "", false
	}
	p.relay.mu.Lock()
	defer p.relay.mu.Unlock()
	up, ok := p.relay.tmplOwner[tmpl]
	return up, ok
}

// gatePassThrough filters or refuses the pass-through requests of a
// client by the upstreams it may reach. handled is false for requests it
// does not govern.
func (p *Proxy) gatePassThrough(ctx context.Context, id gate.Identity, method string, req mcp.Request, next mcp.MethodHandler) (res mcp.Result, err error, handled bool) {
	var reach map[string]bool
	ok := func(up string, known bool) bool {
		if reach == nil {
			reach = p.reachable(id)
		}
		return known && reach[up]
	}
	switch r := req.(type) {
	case *mcp.ListResourcesRequest:
		res, err = next(ctx, method, req)
		if lr, isList := res.(*mcp.ListResourcesResult); err == nil && isList {
			out := *lr
			out.Resources = nil
			for _, x := range lr.Resources {
				if ok(p.resourceOwner(x.URI)) {
					out.Resources = append(out.Resources, x)
				}
			}
			out.CacheScope = "private"
			return &out, nil, true
		}
		return res, err, true
	case *mcp.ListResourceTemplatesRequest:
		res, err = next(ctx, method, req)
		if lr, isList := res.(*mcp.ListResourceTemplatesResult); err == nil && isList {
			out := *lr
			out.ResourceTemplates = nil
			for _, x := range lr.ResourceTemplates {
				if ok(p.templateOwner(x.URITemplate)) {
					out.ResourceTemplates = append(out.ResourceTemplates, x)
				}
			}
			out.CacheScope = "private"
			return &out, nil, true
		}
		return res, err, true
	case *mcp.ReadResourceRequest:
		if r.Params != nil && !ok(p.resourceOwner(r.Params.URI)) {
			return nil, mcp.ResourceNotFoundError(r.Params.URI), true
		}
	case *mcp.SubscribeRequest:
		if r.Params != nil && !ok(p.resourceOwner(r.Params.URI)) {
			return nil, mcp.ResourceNotFoundError(r.Params.URI), true
		}
	case *mcp.ListPromptsRequest:
		res, err = next(ctx, method, req)
		if lp, isList := res.(*mcp.ListPromptsResult); err == nil && isList {
			out := *lp
			out.Prompts = nil
			for _, x := range lp.Prompts {
				if ok(p.promptOwner(x.Name)) {
					out.Prompts = append(out.Prompts, x)
				}
			}
			out.CacheScope = "private"
			return &out, nil, true
		}
		return res, err, true
	case *mcp.GetPromptRequest:
		if r.Params != nil && !ok(p.promptOwner(r.Params.Name)) {
			return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: fmt.Sprintf("unknown prompt %q", r.Params.Name)}, true
		}
	case *mcp.CompleteRequest:
		if r.Params != nil && r.Params.Ref != nil {
			switch r.Params.Ref.Type {
			case "ref/prompt":
				if !ok(p.promptOwner(r.Params.Ref.Name)) {
					return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: fmt.Sprintf("unknown prompt %q", r.Params.Ref.Name)}, true
				}
			case "ref/resource":
				up, known := p.templateOwner(r.Params.Ref.URI)
				if !known {
					up, known = p.resourceOwner(r.Params.Ref.URI)
				}
				if !ok(up, known) {
					return nil, mcp.ResourceNotFoundError(r.Params.Ref.URI), true
				}
			}
		}
	}
	return nil, nil, false
}
