package policy

import (
	"fmt"
	"sort"

	"github.com/toolgate/toolgate/toolid"
)

// Validation of what names upstream resources and prompts: ceiling
// entries (resource_permissions, prompt_permissions), grant scopes
// {upstream, uri | prompt}, rule selectors (conditions, escalation rules,
// Policy Guard rules) and instance suspensions. As for tools
// (references.go), a name that can never match is an error where it
// restricts, and a warning where it only permits:
//
//   - an upstream must be a known MCP server (an Upstream, a Tool's
//     source.mcp_server, or an upstream provider the caller names), and a
//     uri must be an exact URI or a template the decision can match
//     (uris.go: CheckResourceURI, CheckURITemplate); otherwise error,
//     wherever it stands;
//   - a restricting rule's selector must name an upstream that some agent
//     it applies to can reach: one whose resource (prompt) ceiling names
//     the upstream, or, with no such ceiling declared, one with a tool of
//     that upstream in its ceiling (the default: docs/design.md,
//     "Resources and prompts"); otherwise error;
//   - a grant on mcp_resource or prompt permits something only for agents
//     that declare that ceiling; one for an upstream no such ceiling names
//     is a warning.

// accessReach is what one agent can reach of upstream resources and
// prompts, for the reference checks.
type accessReach struct {
	resDeclared, promptDeclared bool
	resUpstreams                map[string]bool // upstreams its resource ceiling names
	promptUpstreams             map[string]bool
	toolUpstreams               map[string]bool // upstreams of its ceiling's tools
}

// toolUpstream is the upstream a ceiling tool id comes from, or "": its
// Tool document's source.mcp_server, or, for a tool an upstream announces,
// the provider part of its id.
func (v *validator) toolUpstream(id string) string {
	if t := v.tools_[id]; t != nil {
		return t.Source.MCPServer
	}
	if p := provider(id); v.opts.UpstreamProviders[p] {
		return p
	}
	return ""
}

func (v *validator) reachOf(a *Agent) *accessReach {
	r := &accessReach{resDeclared: a.ResourcePermissions != nil, promptDeclared: a.PromptPermissions != nil,
		resUpstreams: map[string]bool{}, promptUpstreams: map[string]bool{}, toolUpstreams: map[string]bool{}}
	for _, p := range a.ResourcePermissions {
		r.resUpstreams[p.Upstream] = true
	}
	for _, p := range a.PromptPermissions {
		r.promptUpstreams[p.Upstream] = true
	}
	for _, p := range a.ToolPermissions {
		if toolid.Valid(p.ToolID) {
			if up := v.toolUpstream(p.ToolID); up != "" {
				r.toolUpstreams[up] = true
			}
		}
	}
	return r
}

// reaches reports whether agent a can reach upstream's resources
// (prompts false) or prompts (prompts true) at all.
func (r *accessReach) reaches(upstream string, prompts bool) bool {
	switch {
	case prompts && r.promptDeclared:
		return r.promptUpstreams[upstream]
	case !prompts && r.resDeclared:
		return r.resUpstreams[upstream]
	}
	return r.toolUpstreams[upstream]
}

// accessCeilings checks every agent's resource_permissions and
// prompt_permissions.
func (v *validator) accessCeilings() {
	v.reach = map[string]*accessReach{}
	known := sortedSet(v.refs.servers)
	for _, a := range v.b.Agents {
		if v.agents_[a.AgentID] != a {
			continue
		}
		v.reach[a.AgentID] = v.reachOf(a)
		seen := map[[2]string]Pos{}
		for _, p := range a.ResourcePermissions {
			pos := p.Pos
			where := fmt.Sprintf("Agent %s: resource_permissions entry %s", a.AgentID, ResourceSelector{Upstream: p.Upstream, URI: p.URI})
			v.checkUpstream(pos, where, p.Upstream, known, true)
			if p.URI == "" {
				v.r.Errorf(pos, "%s: uri is required (an exact URI or an RFC 6570 template as the upstream lists it)", where)
			} else if _, err := CompileURIPattern(p.URI); err != nil {
				v.r.Errorf(pos, "%s: %v, so the entry admits nothing", where, err)
			}
			k := [2]string{p.Upstream, p.URI}
			if prev, dup := seen[k]; dup {
				v.r.Errorf(pos, "%s appears twice in resource_permissions (first at %s)", where, prev.At())
			}
			seen[k] = pos
			v.checkTier(pos, where, p.ApprovalTier)
		}
		seen = map[[2]string]Pos{}
		for _, p := range a.PromptPermissions {
			pos := p.Pos
			where := fmt.Sprintf("Agent %s: prompt_permissions entry %s", a.AgentID, PromptSelector{Upstream: p.Upstream, Prompt: p.Prompt})
			v.checkUpstream(pos, where, p.Upstream, known, true)
			if p.Prompt == "" {
				v.r.Errorf(pos, "%s: prompt is required (the upstream's own prompt name)", where)
			}
			k := [2]string{p.Upstream, p.Prompt}
			if prev, dup := seen[k]; dup {
				v.r.Errorf(pos, "%s appears twice in prompt_permissions (first at %s)", where, prev.At())
			}
			seen[k] = pos
			v.checkTier(pos, where, p.ApprovalTier)
		}
	}
}

func (v *validator) checkTier(pos Pos, where, tier string) {
	if tier != "" && !tiers[tier] {
		v.r.Errorf(pos, "%s: approval_tier %q must be auto, policy or hitl", where, tier)
	}
}

// checkUpstream reports an upstream that is no known MCP server: an error
// (it can never match), or a warning where it only permits (restricting
// false).
func (v *validator) checkUpstream(pos Pos, where, upstream string, known []string, isErr bool) bool {
	switch {
	case upstream == "":
		v.r.Errorf(pos, "%s: upstream is required", where)
		return false
	case !v.refs.servers[upstream]:
		if isErr {
			v.r.Errorf(pos, "%s: upstream %s is no Upstream and no Tool's source.mcp_server, so it matches nothing%s", where, upstream, didYouMean(upstream, known))
		} else {
			v.r.Warnf(pos, "%s: upstream %s is no Upstream and no Tool's source.mcp_server, so it matches nothing%s", where, upstream, didYouMean(upstream, known))
		}
		return false
	}
	return true
}

// checkSelectors checks the resource and prompt selectors of one rule or
// suspension list. agents are the agents the rule applies to (all when
// empty); restricting says whether a selector that matches nothing leaves
// open what it was written to close (error) or only permits less
// (warning).
func (v *validator) checkSelectors(pos Pos, where string, res []ResourceSelector, prompts []PromptSelector, agents []string, restricting bool) {
	known := sortedSet(v.refs.servers)
	for _, s := range res {
		p := s.Pos
		if p.Line == 0 {
			p = pos
		}
		w := where + ": resources " + s.String()
		if !v.checkUpstream(p, w, s.Upstream, known, true) {
			continue
		}
		if s.URI != "" {
			if _, err := CompileURIPattern(s.URI); err != nil {
				v.r.Errorf(p, "%s: %v, so it matches nothing", w, err)
				continue
			}
		}
		v.checkReach(p, w, s.Upstream, agents, false, restricting)
	}
	for _, s := range prompts {
		p := s.Pos
		if p.Line == 0 {
			p = pos
		}
		w := where + ": prompts " + s.String()
		if !v.checkUpstream(p, w, s.Upstream, known, true) {
			continue
		}
		v.checkReach(p, w, s.Upstream, agents, true, restricting)
	}
}

// checkReach reports a selector of upstream that no agent among agents (all
// when empty; undeclared ones are reported elsewhere) can reach.
func (v *validator) checkReach(pos Pos, where, upstream string, agents []string, prompts, restricting bool) {
	pool := agents
	if len(pool) == 0 {
		pool = v.refs.agents
	}
	checked := false
	for _, a := range pool {
		r := v.reach[a]
		if r == nil {
			continue
		}
		checked = true
		if r.reaches(upstream, prompts) {
			return
		}
	}
	if !checked {
		return
	}
	what := "resources"
	ceiling := "resource_permissions"
	if prompts {
		what, ceiling = "prompts", "prompt_permissions"
	}
	msg := fmt.Sprintf("%s: no agent it applies to can reach upstream %s's %s (none names it in %s, and none without %s has a tool of %s in its ceiling), so it never applies",
		where, upstream, what, ceiling, ceiling, upstream)
	if restricting {
		v.r.Errorf(pos, "%s", msg)
	} else {
		v.r.Warnf(pos, "%s", msg)
	}
}

// checkAccessGrantScope checks a grant's scope against its resource: the
// {upstream, ...} shapes belong to mcp_resource and prompt grants, and
// those grants take no other shape but all.
func (v *validator) checkAccessGrantScope(pos Pos, where string, g Grant) {
	sc := g.Scope
	isRes, isPrompt := g.Resource == ResourceMCPResource, g.Resource == ResourcePrompt
	switch {
	case sc.Upstream != "" && !isRes && !isPrompt:
		v.r.Errorf(pos, "%s: scope %s names an upstream, which only mcp_resource and prompt grants do; on %s it matches nothing", where, sc, g.Resource)
		return
	case !isRes && !isPrompt:
		return
	case sc.Tool != "" || sc.Name != "":
		shapes := "all, {upstream: U} or {upstream: U, uri: URI}"
		if isPrompt {
			shapes = "all, {upstream: U} or {upstream: U, prompt: NAME}"
		}
		v.r.Errorf(pos, "%s: a %s grant's scope is %s; %s matches nothing", where, g.Resource, shapes, sc)
		return
	case isRes && g.Action != ActionRead:
		v.r.Errorf(pos, "%s: the mcp_resource action is read (it covers resources/read, resources/subscribe and completions of resource templates); %s matches nothing", where, g.Action)
	case isPrompt && g.Action != ActionGet:
		v.r.Errorf(pos, "%s: the prompt action is get (it covers prompts/get and completions of prompt arguments); %s matches nothing", where, g.Action)
	case isRes && sc.Prompt != "":
		v.r.Errorf(pos, "%s: an mcp_resource scope names a uri, not a prompt; %s matches nothing", where, sc)
	case isPrompt && sc.URI != "":
		v.r.Errorf(pos, "%s: a prompt scope names a prompt, not a uri; %s matches nothing", where, sc)
	}
	if sc.All {
		v.checkGrantReach(pos, where, "", isPrompt)
		return
	}
	if !v.checkUpstream(pos, where+": scope", sc.Upstream, sortedSet(v.refs.servers), true) {
		return
	}
	if sc.URI != "" {
		if _, err := CompileURIPattern(sc.URI); err != nil {
			v.r.Errorf(pos, "%s: scope uri: %v, so the grant matches nothing", where, err)
			return
		}
	}
	v.checkGrantReach(pos, where, sc.Upstream, isPrompt)
}

// checkGrantReach warns about a resource or prompt grant that no agent's
// declared ceiling of that kind can use (upstream "" for any upstream):
// without a declared ceiling no such grant is needed or read.
func (v *validator) checkGrantReach(pos Pos, where, upstream string, prompts bool) {
	ids := make([]string, 0, len(v.reach))
	for id := range v.reach {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		r := v.reach[id]
		declared, ups := r.resDeclared, r.resUpstreams
		if prompts {
			declared, ups = r.promptDeclared, r.promptUpstreams
		}
		if declared && (upstream == "" || ups[upstream]) {
			return
		}
	}
	ceiling, kind := "resource_permissions", "resources"
	if prompts {
		ceiling, kind = "prompt_permissions", "prompts"
	}
	of := "any upstream"
	if upstream != "" {
		of = "upstream " + upstream
	}
	v.r.Warnf(pos, "%s: no agent declares %s for %s, so the grant permits nothing (without a declared %s an upstream's %s are reachable when one of its tools is disclosed, and no grant is read)",
		where, ceiling, of, ceiling, kind)
}

// CheckAccessScope checks the shape of one mcp_resource or prompt grant, or
// of any grant whose scope names an upstream, as validation does, without
// the references a bundle declares (for grants compiled on their own, such
// as a delegation's). Other grants are nil.
func CheckAccessScope(g Grant) error {
	sc := g.Scope
	isRes, isPrompt := g.Resource == ResourceMCPResource, g.Resource == ResourcePrompt
	switch {
	case !isRes && !isPrompt && sc.Upstream != "":
		return fmt.Errorf("scope %s names an upstream, which only mcp_resource and prompt grants do", sc)
	case !isRes && !isPrompt:
		return nil
	case isRes && g.Action != ActionRead:
		return fmt.Errorf("the mcp_resource action is read, not %s", g.Action)
	case isPrompt && g.Action != ActionGet:
		return fmt.Errorf("the prompt action is get, not %s", g.Action)
	case sc.All:
		return nil
	case sc.Upstream == "":
		return fmt.Errorf("a %s grant's scope is all or {upstream: U, ...}, not %s", g.Resource, sc)
	case isRes && sc.Prompt != "", isPrompt && sc.URI != "":
		return fmt.Errorf("scope %s does not fit a %s grant", sc, g.Resource)
	case sc.URI != "":
		if _, err := CompileURIPattern(sc.URI); err != nil {
			return fmt.Errorf("scope uri: %w", err)
		}
	}
	return nil
}
