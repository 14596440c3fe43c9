package mcpproxy

// Pass-through is not a way around disclosure: a client reaches the
// resources, resource templates, prompts and completions of an upstream
// only when at least one of that upstream's tools is disclosed to it (the
// agent is composed with the upstream and authorized for part of it).
// Anything else looks exactly as if it did not exist.
//
// The check and the routing are one choice, made once: the gateway
// resolves which upstream owns a URI, a prompt or a completion reference
// (ownerOfURI, the rule below), checks that the caller may reach that
// upstream, and forwards the request to exactly that upstream itself. The
// SDK's own routing (its resource and template matching) is never used
// for resources/read, resources/subscribe, prompts/get or
// completion/complete.
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
// Whatever has no owner, or an owner the caller may not reach, is
// "Resource not found", the same answer for all. A URI that percent-
// decoding could turn into another path (an encoded "/", "\", "." or "%",
// NUL or another control character, a raw "\", a "." or ".." segment, a
// malformed escape, invalid UTF-8) is refused before any of this, so an
// upstream cannot read a different path than the one that was matched.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/yosida95/uritemplate/v3"

	"github.com/toolgate/toolgate/gate"
)

// reachable returns the upstreams the identity may reach through
// pass-through.
func (p *Proxy) reachable(id gate.Identity) map[string]bool {
	disc := p.disclose(id)
	snap := p.g.Snapshot()
	out := map[string]bool{}
	for toolID := range disc.Disclosed {
		if t, ok := snap.Tool(toolID); ok && t.MCPServer != "" {
			out[t.MCPServer] = true
		}
	}
	return out
}

// disclose is gate.Disclose for the identity without its session (the
// disclosure does not depend on it, and one cache entry per credential
// is enough).
func (p *Proxy) disclose(id gate.Identity) *gate.Disclosure {
	id.Session = ""
	return p.g.Disclose(id)
}

// uriProblem says why a resource URI is refused before routing, or "".
func uriProblem(uri string) string {
	if !utf8.ValidString(uri) {
		return "it is not valid UTF-8"
	}
	for i := 0; i < len(uri); i++ {
		switch c := uri[i]; {
		case c < 0x20 || c == 0x7f:
			return "it holds a control character"
		case c == '\\':
			return `it holds a "\"`
		case c == '%':
			if i+2 >= len(uri) || !isHex(uri[i+1]) || !isHex(uri[i+2]) {
				return "it holds a malformed percent escape"
			}
			switch b := unhex(uri[i+1])<<4 | unhex(uri[i+2]); {
			case b == '/' || b == '\\' || b == '.' || b == '%' || b < 0x20 || b == 0x7f:
				return fmt.Sprintf("it holds %q, an escape that decodes to a character that changes the path (%q)", uri[i:i+3], rune(b))
			}
		}
	}
	rest := uri
	if i := strings.IndexAny(rest, "?#"); i >= 0 {
		rest = rest[:i]
	}
	for _, seg := range strings.Split(rest, "/") {
		if seg == "." || seg == ".." {
			return fmt.Sprintf("it holds a %q path segment", seg)
		}
	}
	return ""
}

func isHex(c byte) bool {
	return ('0' <= c && c <= '9') || ('a' <= c && c <= 'f') || ('A' <= c && c <= 'F')
}

func unhex(c byte) byte {
	switch {
	case '0' <= c && c <= '9':
		return c - '0'
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10
	}
	return c - 'A' + 10
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
	if msg := uriProblem(uri); msg != "" {
		return "", "the URI is refused: " + msg
	}
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

// resourceFor resolves the owner of uri for identity id: the owner, or the
// "Resource not found" error every refusal gets alike.
func (p *Proxy) resourceFor(id gate.Identity, method, uri string) (string, error) {
	owner, why := p.relay.ownerOfURI(uri)
	if owner == "" {
		p.log.Debug("pass-through: resource has no owner", "method", method, "uri", clipName(uri), "why", why)
		return "", resourceNotFound(uri)
	}
	if !p.reachable(id)[owner] {
		return "", resourceNotFound(uri)
	}
	return owner, nil
}

func (p *Proxy) promptOwner(name string) (promptRef, bool) {
	p.relay.mu.Lock()
	defer p.relay.mu.Unlock()
	ref, ok := p.relay.prompts[name]
	return ref, ok
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

// ownerKey carries the owner the middleware resolved for a
// resources/subscribe to the SDK's subscribe handler (relay.subscribe).
type ownerKey struct{}

// passThrough serves the pass-through requests of a client within the
// upstreams it may reach: the lists (filtered, then paged: lists.go), and
// resources/read, resources/subscribe, prompts/get and completion/complete
// at the owner resolved here. handled is false for other requests.
func (p *Proxy) passThrough(ctx context.Context, id gate.Identity, method string, req mcp.Request, next mcp.MethodHandler) (res mcp.Result, err error, handled bool) {
	var reach map[string]bool
	ok := func(up string) bool {
		if reach == nil {
			reach = p.reachable(id)
		}
		return up != "" && reach[up]
	}
	sid := sessionID(req)
	gen := p.lists.generation(p.g.Snapshot())
	switch r := req.(type) {
	case *mcp.ListResourcesRequest:
		items := p.relay.resourceList()
		page, next, err := listPage(p.lists, method, sid, gen, cursorOf(r.Params, func(p *mcp.ListResourcesParams) string { return p.Cursor }), items,
			func(x ownedResource) bool { return ok(x.owner) }, func(x ownedResource) string { return x.def.URI })
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
		items := p.relay.templateList()
		page, next, err := listPage(p.lists, method, sid, gen, cursorOf(r.Params, func(p *mcp.ListResourceTemplatesParams) string { return p.Cursor }), items,
			func(x ownedTemplate) bool { return ok(x.owner) }, func(x ownedTemplate) string { return x.def.URITemplate })
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
		items := p.relay.promptList()
		page, next, err := listPage(p.lists, method, sid, gen, cursorOf(r.Params, func(p *mcp.ListPromptsParams) string { return p.Cursor }), items,
			func(x ownedPrompt) bool { return ok(x.owner) }, func(x ownedPrompt) string { return x.def.Name })
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
		owner, err := p.resourceFor(id, method, r.Params.URI)
		if err != nil {
			return nil, err, true
		}
		res, err := p.relay.read(ctx, owner, r)
		return res, err, true
	case *mcp.SubscribeRequest:
		if r.Params == nil {
			return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "resources/subscribe: missing params"}, true
		}
		owner, err := p.resourceFor(id, method, r.Params.URI)
		if err != nil {
			return nil, err, true
		}
		// The SDK keeps who subscribed (its resources/updated fan-out) and
		// calls relay.subscribe, which subscribes exactly this owner.
		res, err := next(context.WithValue(ctx, ownerKey{}, owner), method, req)
		return res, err, true
	case *mcp.GetPromptRequest:
		if r.Params == nil {
			return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "prompts/get: missing params"}, true
		}
		ref, known := p.promptOwner(r.Params.Name)
		if !known || !ok(ref.upstream) {
			return nil, unknownPrompt(r.Params.Name), true
		}
		res, err := p.relay.getPrompt(ctx, ref, r)
		return res, err, true
	case *mcp.CompleteRequest:
		if r.Params == nil || r.Params.Ref == nil {
			return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "completion/complete: missing ref"}, true
		}
		ref := *r.Params.Ref
		var owner string
		switch ref.Type {
		case "ref/prompt":
			pr, known := p.promptOwner(ref.Name)
			if !known || !ok(pr.upstream) {
				return nil, unknownPrompt(ref.Name), true
			}
			owner, ref.Name = pr.upstream, pr.name
		case "ref/resource":
			// A template, as listed; else a URI, by the rule above.
			if up, known := p.relay.templateOwner(ref.URI); known {
				owner = up
				if !ok(owner) {
					return nil, resourceNotFound(ref.URI), true
				}
			} else if owner, err = p.resourceFor(id, method, ref.URI); err != nil {
				return nil, err, true
			}
		default:
			return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: fmt.Sprintf("completion/complete: unknown reference type %.64q", ref.Type)}, true
		}
		res, err := p.relay.completeAt(ctx, owner, &ref, r)
		return res, err, true
	}
	return nil, nil, false
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
