package authz

import (
	"fmt"

	"github.com/toolgate/toolgate"
	"github.com/toolgate/toolgate/cond"
	"github.com/toolgate/toolgate/policy"
)

// What Compile builds for resource and prompt accesses (access.go): each
// agent's declared ceilings indexed by upstream, the tools of each
// upstream in its tool ceiling (the default), instance suspensions, and
// the rules that select resources and prompts, with every uri compiled
// once.

// upstreamInfo is one MCP server the bundle knows.
type upstreamInfo struct {
	// resTarget and promptTarget are the ids of all its resources and all
	// its prompts (the default's Decision.Target).
	resTarget, promptTarget string
}

// accessEntry is one compiled resource or prompt ceiling entry.
type accessEntry struct {
	key    string            // the uri or the prompt name, as written
	uri    policy.URIPattern // resource entries
	tier   toolgate.ApprovalTier
	target string // policy.ResourceTarget / PromptTarget of the entry
}

// accessCeiling is an agent's declared resource or prompt ceiling.
type accessCeiling struct {
	byUpstream map[string][]accessEntry // in declaration order
	count      int
}

// resSel and promptSel are compiled selectors (policy.ResourceSelector,
// PromptSelector).
type resSel struct {
	upstream string
	uri      policy.URIPattern
	all      bool // no uri: every resource of the upstream
	text     string
}

type promptSel struct {
	upstream, prompt string // prompt "" selects every prompt of upstream
	text             string
}

// accessSels is a compiled list of resource and prompt selectors.
type accessSels struct {
	res     []resSel
	prompts []promptSel
}

func (s *accessSels) empty() bool { return s == nil || len(s.res)+len(s.prompts) == 0 }

// match returns the text of the first selector that selects the access,
// or "".
func (s *accessSels) match(a *toolgate.Access) string {
	if s == nil {
		return ""
	}
	if a.Kind.IsResource() {
		for i := range s.res {
			r := &s.res[i]
			if r.upstream == a.Upstream && (r.all || r.uri.Matches(a.URI, a.Template)) {
				return r.text
			}
		}
		return ""
	}
	for i := range s.prompts {
		p := &s.prompts[i]
		if p.upstream == a.Upstream && (p.prompt == "" || p.prompt == a.Prompt) {
			return p.text
		}
	}
	return ""
}

func compileSels(res []policy.ResourceSelector, prompts []policy.PromptSelector) (*accessSels, error) {
	out := &accessSels{}
	for _, r := range res {
		rs := resSel{upstream: r.Upstream, all: r.URI == "", text: r.String()}
		if r.URI != "" {
			p, err := policy.CompileURIPattern(r.URI)
			if err != nil {
				return nil, fmt.Errorf("resources %s: %w", r, err)
			}
			rs.uri = p
		}
		out.res = append(out.res, rs)
	}
	for _, p := range prompts {
		out.prompts = append(out.prompts, promptSel{upstream: p.Upstream, prompt: p.Prompt, text: p.String()})
	}
	return out, nil
}

// accessRule is a compiled condition, escalation rule or Policy Guard rule
// that selects resources or prompts.
type accessRule struct {
	sels   *accessSels
	prog   *cond.Program // nil: unconditional (escalation and guard rules)
	reason string
	effect string // guard rules: allow, deny or escalate
}

func (c *compiler) upstreams() {
	c.s.upstreams = map[string]*upstreamInfo{}
	add := func(name string) {
		if name == "" || c.s.upstreams[name] != nil {
			return
		}
		c.s.upstreams[name] = &upstreamInfo{resTarget: policy.ResourceTarget(name, ""), promptTarget: policy.PromptTarget(name, "")}
	}
	for _, u := range c.b.Upstreams {
		add(u.Name)
	}
	for i := range c.s.tools {
		add(c.s.tools[i].MCPServer)
	}
}

func tierOf(s string) toolgate.ApprovalTier {
	if s == "" {
		return toolgate.TierAuto
	}
	return toolgate.ApprovalTier(s)
}

// tierRank orders approval tiers from the least strict; when several
// ceiling entries cover an access, the strictest names it (Decision's
// Target and ApprovalTier), and every one's tier applies (access.go).
func tierRank(t toolgate.ApprovalTier) int {
	switch t {
	case toolgate.TierHITL:
		return 2
	case toolgate.TierPolicy:
		return 1
	}
	return 0
}

func (c *compiler) accessCeilings() error {
	for _, a := range c.b.Agents {
		ai := c.s.agents[a.AgentID]
		if ai == nil {
			continue
		}
		ai.upTools = map[string][]int32{}
		for _, idx := range ai.order {
			// A control-flow tool reaches no external system (and is never
			// gated), so it never makes an upstream reachable.
			if t := &c.s.tools[idx]; t.MCPServer != "" && !t.ControlFlow {
				ai.upTools[t.MCPServer] = append(ai.upTools[t.MCPServer], idx)
			}
		}
		if a.ResourcePermissions != nil {
			ai.resCeil = &accessCeiling{byUpstream: map[string][]accessEntry{}}
			for _, p := range a.ResourcePermissions {
				pat, err := policy.CompileURIPattern(p.URI)
				if err != nil {
					return fmt.Errorf("Agent %s: resource_permissions %s: %w", a.AgentID, p.URI, err)
				}
				ai.resCeil.byUpstream[p.Upstream] = append(ai.resCeil.byUpstream[p.Upstream], accessEntry{
					key: p.URI, uri: pat, tier: tierOf(p.ApprovalTier), target: policy.ResourceTarget(p.Upstream, p.URI)})
				ai.resCeil.count++
			}
		}
		if a.PromptPermissions != nil {
			ai.promptCeil = &accessCeiling{byUpstream: map[string][]accessEntry{}}
			for _, p := range a.PromptPermissions {
				ai.promptCeil.byUpstream[p.Upstream] = append(ai.promptCeil.byUpstream[p.Upstream], accessEntry{
					key: p.Prompt, tier: tierOf(p.ApprovalTier), target: policy.PromptTarget(p.Upstream, p.Prompt)})
				ai.promptCeil.count++
			}
		}
	}
	return nil
}

// accessRules compiles the rules of tp that select resources or prompts.
func (c *compiler) accessRules(tp *policy.ToolPolicy, cp *compiledPolicy) error {
	rule := func(res []policy.ResourceSelector, prompts []policy.PromptSelector, when string) (*accessRule, error) {
		if len(res)+len(prompts) == 0 {
			return nil, nil
		}
		sels, err := compileSels(res, prompts)
		if err != nil {
			return nil, err
		}
		prog, err := c.compileCond(when)
		if err != nil {
			return nil, err
		}
		return &accessRule{sels: sels, prog: prog}, nil
	}
	for _, cd := range tp.Conditions {
		r, err := rule(cd.Resources, cd.Prompts, cd.When)
		if err != nil {
			return err
		}
		if r != nil {
			if r.prog == nil {
				return fmt.Errorf("a condition has no when") // validation refuses it first
			}
			r.reason = cd.Reason
			cp.accessConds = append(cp.accessConds, *r)
		}
	}
	for _, e := range tp.EscalationRules {
		r, err := rule(e.Resources, e.Prompts, e.When)
		if err != nil {
			return err
		}
		if r != nil {
			cp.accessEsc = append(cp.accessEsc, *r)
		}
	}
	for _, g := range tp.PolicyGuard {
		r, err := rule(g.Resources, g.Prompts, g.When)
		if err != nil {
			return err
		}
		if r != nil {
			r.effect, r.reason = g.Effect, g.Reason
			cp.accessGuard = append(cp.accessGuard, *r)
		}
	}
	return nil
}
