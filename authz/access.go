package authz

// Resource and prompt accesses (docs/design.md, "Resources and prompts"):
// resources/read, resources/subscribe, prompts/get and completion/complete
// are decided here, by the same layers as a tool call and in the same
// order, from the same snapshot:
//
//  1. composition: the kind is known, the URI is one the decision can
//     judge as the upstream will resolve it (policy.CheckResourceURI), the
//     arguments parsed, an upstream owns it and the agent is declared;
//  2. ceiling: with a declared resource_permissions (prompt_permissions),
//     an entry of the owner covers it (every covering entry's tier
//     applies at 8); without one, the default: one of the owner's tools is
//     disclosed to this identity, which is the tool-level Decide of the
//     agent's ceiling tools of that upstream, grant layer included;
//  3. runtime: a RuntimePolicy for the mode, and mcp_tool_policy's
//     allowed_servers and denied_servers keep the owner;
//  4. instance: the instance is declared and its environment's
//     resource_suspensions (prompt_suspensions) do not select it;
//  5. policy: no rule of this layer selects resources or prompts;
//  6. grant: with a declared ceiling, the principal (and a delegation)
//     holds mcp_resource:read (prompt:get) covering it; the default needs
//     no grant;
//  7. condition: grant conditions, and the conditions of tool policies
//     that select it;
//  8. approval: the entry's tier (hitl; policy: the Policy Guard's rules
//     that select it), requires_human_approval, escalation rules that
//     select it.
//
// A list item (resources/list, resources/templates/list, prompts/list) is
// shown exactly when its tool-level access (Access.ToolLevel) does not
// deny: a read of the resource, the completion of the template, the get of
// the prompt. AccessFilter runs this same code, so listing and access
// cannot disagree.

import (
	"fmt"
	"time"

	"github.com/toolgate/toolgate"
	"github.com/toolgate/toolgate/cond"
	"github.com/toolgate/toolgate/policy"
)

// DecideAccess answers one resource or prompt access. Like Decide it does
// no I/O, reads no clock, never returns an error (a panic inside is a deny
// with internal_error) and is safe for concurrent use. Every refusal names
// its layer, code and what would change it; Decision.Target names the
// ceiling entry (or, in the default, the upstream) that was decided on.
func (s *Snapshot) DecideAccess(a *toolgate.Access) (d toolgate.Decision) {
	if a == nil {
		return accessInternal("no access to decide (fail closed)")
	}
	defer func() {
		if r := recover(); r != nil {
			d = accessInternal(fmt.Sprintf("internal error while deciding (fail closed): %v", r))
		}
	}()
	if s == nil {
		return accessInternal("no policy snapshot loaded (fail closed)")
	}
	e := accessEval{s: s, a: *a}
	return e.disclose(e.run())
}

// disclose sets d.Disclosed, as Decide does for a call: the access's
// tool-level decision (what the lists show) does not deny, so a refusal
// came from its arguments or its approval, and the caller may be told it.
// A refusal of an access that is not disclosed is answered as if the
// resource or prompt did not exist.
func (e *accessEval) disclose(d toolgate.Decision) toolgate.Decision {
	switch {
	case d.Verdict != toolgate.Deny:
		d.Disclosed = true
	case e.a.ToolLevel || !e.a.Kind.HasArgs() || d.Layer == toolgate.LayerInternal:
		// The tool-level decision is this one (it denied).
	default:
		tl := accessEval{s: e.s, a: e.a, del: e.del, delID: e.delID, quiet: true}
		tl.a.ToolLevel, tl.a.Args, tl.a.ArgsErr = true, nil, nil
		d.Disclosed = tl.run().Verdict != toolgate.Deny
	}
	return d
}

// expired is the refusal of an access made under delegation d at now, or
// nil while d holds.
func expired(d *Delegation, now time.Time, target string) *toolgate.Decision {
	if now.Before(d.ExpiresAt) && d.err == nil {
		return nil
	}
	reason := fmt.Sprintf("grant layer: %s expired at %s, so it grants nothing; mint a new one", d.ID, d.ExpiresAt.UTC().Format(time.RFC3339))
	if d.err != nil {
		reason = fmt.Sprintf("grant layer: the grants of %s cannot be applied (fail closed): %v; mint a new token", d.ID, d.err)
	}
	return &toolgate.Decision{Verdict: toolgate.Deny, Code: toolgate.CodeRBACResource, Layer: toolgate.LayerGrant,
		Reason: reason, EventType: toolgate.EventUnauthorized, SideEffectClass: toolgate.SideEffectRead, Target: target}
}

// DecideAccessDelegated decides an access made under a delegation, as
// DecideDelegated does a call: a.Principal must be the delegator, and
// every grant check must pass for the delegator's current grants and for
// the delegation's. In the default (no declared ceiling) the tool-level
// decisions that make an upstream reachable are the delegated ones. A
// delegation compiled for another snapshot, or for another delegator,
// denies.
func (s *Snapshot) DecideAccessDelegated(a *toolgate.Access, d *Delegation) (out toolgate.Decision) {
	if a == nil || d == nil || d.snap != s || d.Delegator != a.Principal {
		return accessInternal("the delegation does not belong to this policy snapshot or principal (fail closed); recompile it")
	}
	defer func() {
		if r := recover(); r != nil {
			out = accessInternal(fmt.Sprintf("internal error while deciding (fail closed): %v", r))
		}
	}()
	e := accessEval{s: s, a: *a, del: d.info, delID: d.ID}
	out = e.disclose(e.run())
	if x := expired(d, a.Now, out.Target); x != nil && out.Verdict != toolgate.Deny {
		// An expired delegation discloses nothing (as in Resolve).
		out = *x
	}
	return out
}

func accessInternal(reason string) toolgate.Decision {
	return toolgate.Decision{Verdict: toolgate.Deny, Code: toolgate.CodeInternalError, Layer: toolgate.LayerInternal,
		Reason: reason, EventType: toolgate.EventUnauthorized}
}

// reachResult caches, in an AccessFilter, whether an upstream is reachable
// in the default, and the refusal when it is not.
type reachResult struct {
	ok   bool
	deny toolgate.Decision
}

// accessEval carries one access through the layers. It lives on the
// caller's stack.
type accessEval struct {
	s *Snapshot
	// a is a copy of the access (so an access the core builds itself, an
	// AccessFilter's list item, stays on the stack), and out the refusal
	// the checks fill in (deny), returned as &e.out.
	a     toolgate.Access
	out   toolgate.Decision
	agent *agentInfo
	mode  string
	m     *modeInfo
	pr    *principalInfo
	del   *principalInfo
	delID string
	// ceil is the agent's declared ceiling of this kind (nil: the
	// default); tier and target are the matched entry's (or the
	// default's).
	ceil   *accessCeiling
	tier   toolgate.ApprovalTier
	target string
	// guard and human say some covering entry has approval_tier policy
	// (the Policy Guard judges the access) or hitl (a human approves it):
	// every covering entry's tier applies, not only the strictest's.
	guard, human bool
	skipArgs     bool
	vars         *cond.Vars
	// reach, when set (AccessFilter), caches the default's reachability
	// per upstream; quiet leaves refusals without a reason.
	reach map[string]*reachResult
	quiet bool
}

// deny builds a refusal; reason is called only when the caller wants
// reasons (an AccessFilter's list items do not, so a list of thousands of
// hidden items formats none).
func (e *accessEval) deny(code toolgate.Code, layer toolgate.Layer, reason func() string) *toolgate.Decision {
	r := ""
	if !e.quiet {
		r = reason()
	}
	e.out = toolgate.Decision{Verdict: toolgate.Deny, Code: code, Layer: layer, Reason: r,
		EventType: toolgate.EventUnauthorized, SideEffectClass: toolgate.SideEffectRead, ApprovalTier: e.tier, Target: e.target}
	return &e.out
}

// what names the accessed thing in reasons.
func (e *accessEval) what() string {
	a := &e.a
	switch {
	case a.Kind.IsResource() && a.Template:
		return fmt.Sprintf("resource template %q of upstream %s", a.URI, a.Upstream)
	case a.Kind.IsResource():
		return fmt.Sprintf("resource %q of upstream %s", a.URI, a.Upstream)
	case a.PromptName != "" && a.PromptName != a.Prompt:
		return fmt.Sprintf("prompt %q (upstream %s's %q)", a.PromptName, a.Upstream, a.Prompt)
	}
	return fmt.Sprintf("prompt %q of upstream %s", a.Prompt, a.Upstream)
}

// kindWords are the ceiling field, grant and plural of the access's kind.
func (e *accessEval) kindWords() (ceiling, grant, things string) {
	if e.a.Kind.IsPrompt() {
		return "prompt_permissions", "prompt:get", "prompts"
	}
	return "resource_permissions", "mcp_resource:read", "resources"
}

func (e *accessEval) run() toolgate.Decision {
	e.skipArgs = e.a.ToolLevel && e.a.Kind.HasArgs()
	// 1 composition, 2 ceiling, 3 runtime, 4 instance; 5, the policy
	// layer, has no rule for accesses; 6 grant, 7 condition, 8 approval.
	if d := e.checkComposition(); d != nil {
		return *d
	}
	if d := e.checkCeiling(); d != nil {
		return *d
	}
	if d := e.checkRuntime(); d != nil {
		return *d
	}
	if d := e.checkInstance(); d != nil {
		return *d
	}
	if d := e.checkGrant(); d != nil {
		return *d
	}
	if d := e.checkConditions(); d != nil {
		return *d
	}
	d, approved := e.checkApproval()
	if d != nil {
		return *d
	}
	return toolgate.Decision{Verdict: toolgate.Allow, Code: toolgate.CodeOK, Reason: allowReason, EventType: toolgate.EventAuthorized,
		SideEffectClass: toolgate.SideEffectRead, ApprovalTier: e.tier, ApprovalUsed: approved, Target: e.target}
}

// checkComposition: the access is well formed, an upstream the bundle
// knows owns it, and the agent is declared.
func (e *accessEval) checkComposition() *toolgate.Decision {
	a := &e.a
	malformed := func(format string, args ...any) *toolgate.Decision {
		return e.deny(toolgate.CodeMalformedCall, toolgate.LayerComposition, func() string { return "composition layer: " + fmt.Sprintf(format, args...) })
	}
	switch {
	case a.Kind.IsResource():
		if a.Template {
			if a.Kind != toolgate.AccessResourceComplete {
				return malformed("a resource template (%.200q) is not a resource: read or subscribe to a URI", a.URI)
			}
			if err := policy.CheckURITemplate(a.URI); err != nil {
				return malformed("%v; use the template exactly as the upstream lists it", err)
			}
		} else if err := policy.CheckResourceURI(a.URI); err != nil {
			return malformed("%v; the decision judges a URI exactly as the upstream will resolve it, so one whose decoding could change its path, or that has a second spelling, is refused: send it in the one form the upstream lists", err)
		}
	case a.Kind.IsPrompt():
		if a.Prompt == "" {
			return malformed("the access names no prompt; name one the upstream lists")
		}
	default:
		return malformed("the access kind %s is none the decision knows (resource_read, resource_subscribe, resource_complete, prompt_get, prompt_complete)", a.Kind)
	}
	if a.ArgsErr != nil {
		return malformed("the arguments are refused: %v; send one JSON object without duplicate keys, keys that differ only by case, or numbers a float64 does not hold as written", a.ArgsErr)
	}
	code := toolgate.CodeUnknownResource
	if a.Kind.IsPrompt() {
		code = toolgate.CodeUnknownPrompt
	}
	if a.Upstream == "" {
		return e.deny(code, toolgate.LayerComposition, func() string {
			return fmt.Sprintf("composition layer: no upstream owns %s (the routing found none, fail closed); ask for one an upstream lists", e.whatNoOwner())
		})
	}
	if e.s.upstreams[a.Upstream] == nil {
		return e.deny(code, toolgate.LayerComposition, func() string {
			return fmt.Sprintf("composition layer: %s names upstream %s, which the policy bundle does not declare (fail closed); add an Upstream document", e.what(), a.Upstream)
		})
	}
	ag := e.s.agents[a.AgentID]
	if ag == nil {
		return e.deny(toolgate.CodeUnknownAgent, toolgate.LayerComposition,
			func() string {
				return fmt.Sprintf("composition layer: agent %q is not declared in the policy bundle, so its ceiling is empty; add an Agent document", a.AgentID)
			})
	}
	e.agent = ag
	return nil
}

func (e *accessEval) whatNoOwner() string {
	a := &e.a
	if a.Kind.IsResource() {
		return fmt.Sprintf("resource %.200q", a.URI)
	}
	if a.PromptName != "" {
		return fmt.Sprintf("prompt %q", a.PromptName)
	}
	return fmt.Sprintf("prompt %q", a.Prompt)
}

// checkCeiling: a declared ceiling entry covers the access, or, in the
// default, one of the owner's tools is disclosed to this identity.
func (e *accessEval) checkCeiling() *toolgate.Decision {
	a, ag := &e.a, e.agent
	up := e.s.upstreams[a.Upstream]
	if a.Kind.IsPrompt() {
		e.ceil = ag.promptCeil
	} else {
		e.ceil = ag.resCeil
	}
	ceiling, _, things := e.kindWords()
	if e.ceil != nil {
		var best *accessEntry
		entries := e.ceil.byUpstream[a.Upstream]
		for i := range entries {
			en := &entries[i]
			if a.Kind.IsPrompt() {
				if en.key != a.Prompt {
					continue
				}
			} else if !en.uri.Matches(a.URI, a.Template) {
				continue
			}
			if best == nil || tierRank(en.tier) > tierRank(best.tier) {
				best = en
			}
			e.guard = e.guard || en.tier == toolgate.TierPolicy
			e.human = e.human || en.tier == toolgate.TierHITL
		}
		if best == nil {
			return e.deny(toolgate.CodeNotInCeiling, toolgate.LayerCeiling,
				func() string {
					return fmt.Sprintf("ceiling layer: %s matches no %s entry of agent %s %s; only a new agent version can add it",
						e.what(), ceiling, ag.id, e.ceilingList())
				})
		}
		e.tier, e.target = best.tier, best.target
		return nil
	}
	// The default: reachable when one of the upstream's tools is disclosed.
	e.tier = toolgate.TierAuto
	if a.Kind.IsPrompt() {
		e.target = up.promptTarget
	} else {
		e.target = up.resTarget
	}
	tools := ag.upTools[a.Upstream]
	if len(tools) == 0 {
		return e.deny(toolgate.CodeNotInCeiling, toolgate.LayerCeiling,
			func() string {
				return fmt.Sprintf("ceiling layer: agent %s declares no %s, so upstream %s's %s are reachable only while one of its tools is disclosed, and none of %s's tools is in its ceiling; declare %s for it in a new agent version",
					ag.id, ceiling, a.Upstream, things, a.Upstream, ceiling)
			})
	}
	if e.reach != nil {
		// A refusal cached without its reason (quiet) is not reused for a
		// caller that wants one.
		if r := e.reach[a.Upstream]; r != nil && (r.ok || e.quiet || r.deny.Reason != "") {
			if r.ok {
				return nil
			}
			e.out = r.deny
			return &e.out
		}
	}
	d := e.defaultReach(tools)
	if e.reach != nil {
		r := &reachResult{ok: d == nil}
		if d != nil {
			r.deny = *d
		}
		e.reach[a.Upstream] = r
	}
	return d
}

// defaultReach runs the tool-level decision of the owner's ceiling tools
// until one is not denied; if none is, it refuses with the first one's
// layer and code.
func (e *accessEval) defaultReach(tools []int32) *toolgate.Decision {
	a := &e.a
	var first toolgate.Decision
	for i, idx := range tools {
		call := toolgate.Call{AgentID: a.AgentID, DeploymentMode: a.DeploymentMode, InstanceID: a.InstanceID,
			Environment: a.Environment, Principal: a.Principal, Tool: e.s.tools[idx].ID, ToolLevel: true}
		var vc varsCache
		te := eval{s: e.s, c: &call, del: e.del, vc: &vc}
		d := te.run(nil)
		if d.Verdict != toolgate.Deny {
			return nil
		}
		if i == 0 {
			first = d
		}
	}
	ceiling, _, things := e.kindWords()
	return e.deny(first.Code, first.Layer,
		func() string {
			return fmt.Sprintf("%s layer: agent %s declares no %s, so upstream %s's %s are reachable only while one of its tools is disclosed, and none is (%d in its ceiling); the first, %s: %s",
				first.Layer, e.agent.id, ceiling, a.Upstream, things, len(tools), first.ToolID, first.Reason)
		})
}

// ceilingList formats the agent's entries of the owner, for reasons.
func (e *accessEval) ceilingList() string {
	entries := e.ceil.byUpstream[e.a.Upstream]
	if len(entries) == 0 {
		return fmt.Sprintf("(it has %d entries, none for upstream %s)", e.ceil.count, e.a.Upstream)
	}
	out := "["
	for i, en := range entries {
		if i > 0 {
			out += ", "
		}
		out += en.key
	}
	return "for upstream " + e.a.Upstream + " " + out + "]"
}

// checkRuntime: a RuntimePolicy for the mode exists and its MCP server
// lists keep the owner.
func (e *accessEval) checkRuntime() *toolgate.Decision {
	a := &e.a
	e.mode = a.DeploymentMode
	if e.mode == "" {
		e.mode = e.s.settings.DefaultDeploymentMode
	}
	m := e.agent.modes[e.mode]
	if m == nil {
		_, _, things := e.kindWords()
		return e.deny(toolgate.CodeNoRuntimePolicy, toolgate.LayerRuntime,
			func() string {
				return fmt.Sprintf("runtime layer: agent %s has no RuntimePolicy for deployment mode %q, so no tool and none of its %s is active (fail closed); add one", e.agent.id, e.mode, things)
			})
	}
	e.m = m
	switch {
	case m.deniedSrv[a.Upstream]:
		return e.deny(toolgate.CodeMCPServerDenied, toolgate.LayerRuntime,
			func() string {
				return fmt.Sprintf("runtime layer: MCP server %s is in denied_servers of %s, which removes its tools, resources and prompts; remove it from mcp_tool_policy.denied_servers", a.Upstream, m.where)
			})
	case len(m.allowedSrv) > 0 && !m.allowedSrv[a.Upstream]:
		return e.deny(toolgate.CodeMCPServerDenied, toolgate.LayerRuntime,
			func() string {
				return fmt.Sprintf("runtime layer: MCP server %s is not in allowed_servers of %s, so its tools, resources and prompts are removed; add it to mcp_tool_policy.allowed_servers", a.Upstream, m.where)
			})
	}
	return nil
}

// checkInstance: the instance is declared and no suspension of its
// environment selects the access.
func (e *accessEval) checkInstance() *toolgate.Decision {
	a := &e.a
	if a.InstanceID == "" {
		return nil
	}
	if _, ok := e.s.instances[a.InstanceID]; !ok {
		return e.deny(toolgate.CodeUnknownInstance, toolgate.LayerInstance,
			func() string {
				return fmt.Sprintf("instance layer: business instance %q is not declared (fail closed); add an Instance document", a.InstanceID)
			})
	}
	if a.Environment == "" {
		return nil
	}
	if sel := e.s.instAccess[a.InstanceID][a.Environment].match(a); sel != "" {
		field := "resource_suspensions"
		if a.Kind.IsPrompt() {
			field = "prompt_suspensions"
		}
		return e.deny(toolgate.CodeSuspendedInstance, toolgate.LayerInstance,
			func() string {
				return fmt.Sprintf("instance layer: %s is suspended for instance %s in environment %s by environment_overrides %s %s; remove that entry",
					e.what(), a.InstanceID, a.Environment, field, sel)
			})
	}
	return nil
}

// grantKey is the grant resource and action of the access's kind.
func (e *accessEval) grantKey() (resource, action string) {
	if e.a.Kind.IsPrompt() {
		return policy.ResourcePrompt, policy.ActionGet
	}
	return policy.ResourceMCPResource, policy.ActionRead
}

// covers reports whether a resource or prompt grant covers the access.
func (e *accessEval) covers(g *grantC) bool {
	sc, a := &g.scope, &e.a
	switch {
	case sc.All:
		return true
	case sc.Upstream == "" || sc.Upstream != a.Upstream:
		return false
	case a.Kind.IsPrompt():
		return sc.URI == "" && (sc.Prompt == "" || sc.Prompt == a.Prompt)
	}
	return sc.Prompt == "" && (sc.URI == "" || g.uri.Matches(a.URI, a.Template))
}

func (e *accessEval) covering(gs []grantC, out []grantC) []grantC {
	for i := range gs {
		if e.covers(&gs[i]) {
			out = append(out, gs[i])
		}
	}
	return out
}

func anyConditional(gs []grantC) bool {
	for i := range gs {
		if len(gs[i].conds) > 0 {
			return true
		}
	}
	return false
}

func (e *accessEval) anyCovers(gs []grantC) bool {
	for i := range gs {
		if e.covers(&gs[i]) {
			return true
		}
	}
	return false
}

// checkGrant: with a declared ceiling, the principal (and a delegation)
// holds the kind's grant on the access.
func (e *accessEval) checkGrant() *toolgate.Decision {
	if e.ceil == nil {
		return nil // the default: the disclosed tool's grants decided
	}
	a := &e.a
	res, act := e.grantKey()
	_, grant, _ := e.kindWords()
	pr := e.s.principals[a.Principal]
	if pr == nil {
		return e.deny(toolgate.CodeRBACResource, toolgate.LayerGrant,
			func() string {
				return fmt.Sprintf("grant layer: principal %q is not declared, so it holds no %s grant (fail closed); add a Principal document", a.Principal, grant)
			})
	}
	e.pr = pr
	if !e.anyCovers(pr.resources[res][act]) {
		return e.deny(toolgate.CodeRBACResource, toolgate.LayerGrant,
			func() string {
				return fmt.Sprintf("grant layer: principal %s lacks %s on %s; grant {resource: %s, action: %s, scope: %s}",
					pr.id, grant, e.what(), res, act, e.scopeHint())
			})
	}
	if e.del != nil && !e.anyCovers(e.del.resources[res][act]) {
		return e.deny(toolgate.CodeRBACResource, toolgate.LayerGrant,
			func() string {
				return fmt.Sprintf("grant layer: delegation %s from %s does not include %s on %s; a delegate never exceeds what it was handed: mint a delegation that includes it",
					e.delID, pr.id, grant, e.what())
			})
	}
	return nil
}

// scopeHint is the narrowest scope that would cover the access.
func (e *accessEval) scopeHint() string {
	a := &e.a
	if a.Kind.IsPrompt() {
		return policy.Scope{Upstream: a.Upstream, Prompt: a.Prompt}.String()
	}
	return policy.Scope{Upstream: a.Upstream, URI: a.URI}.String()
}

func (e *accessEval) applies(p *compiledPolicy) bool {
	return p.applies(e.agent.id, e.a.InstanceID, e.a.Environment, e.mode)
}

func (e *accessEval) condVars() *cond.Vars {
	if e.vars != nil {
		return e.vars
	}
	a := &e.a
	pr := e.pr
	if pr == nil {
		pr = e.s.principals[a.Principal]
	}
	var pv map[string]any
	if pr != nil {
		pv = pr.vars
	} else {
		pv = map[string]any{"id": a.Principal, "roles": []string{}}
	}
	v := &cond.Vars{Args: a.Args, Principal: pv, Agent: e.agent.vars,
		Environment: a.Environment, InstanceID: a.InstanceID, DeploymentMode: e.mode}
	switch a.Kind {
	case toolgate.AccessResourceRead:
		v.Resource = map[string]any{"upstream": a.Upstream, "uri": a.URI, "template": a.Template, "action": "read"}
	case toolgate.AccessResourceSubscribe:
		v.Resource = map[string]any{"upstream": a.Upstream, "uri": a.URI, "template": a.Template, "action": "subscribe"}
	case toolgate.AccessResourceComplete:
		v.Resource = map[string]any{"upstream": a.Upstream, "uri": a.URI, "template": a.Template, "action": "complete"}
	default:
		visible := a.PromptName
		if visible == "" {
			visible = a.Prompt
		}
		action := "get"
		if a.Kind == toolgate.AccessPromptComplete {
			action = "complete"
		}
		v.Prompt = map[string]any{"upstream": a.Upstream, "name": a.Prompt, "visible_name": visible, "action": action}
	}
	e.vars = v
	return v
}

func (e *accessEval) anyHolds(gs []grantC) (bool, error) { return anyGrantHolds(gs, e.condVars) }

// checkConditions: grant conditions (when every covering grant has one)
// and the conditions of applicable tool policies that select the access.
// A tool-level decision of a kind with arguments leaves them out.
func (e *accessEval) checkConditions() *toolgate.Decision {
	if e.skipArgs {
		return nil
	}
	condFail := func(what string, err error) *toolgate.Decision {
		msg := "condition layer: " + what
		if err != nil {
			msg += ": " + err.Error() + " (an evaluation error denies)"
		}
		return e.deny(toolgate.CodeConditionFailed, toolgate.LayerCondition, func() string { return msg })
	}
	if e.ceil != nil {
		res, act := e.grantKey()
		_, grant, _ := e.kindWords()
		for _, set := range [2]*principalInfo{e.pr, e.del} {
			if set == nil {
				continue
			}
			list := set.resources[res][act]
			if !anyConditional(list) {
				continue // the grant layer found an unconditional one
			}
			var buf [4]grantC
			gs := e.covering(list, buf[:0])
			if hasConds(gs) {
				if ok, err := e.anyHolds(gs); !ok {
					return condFail(fmt.Sprintf("no %s grant of %s covering %s has its when-condition hold", grant, set.label(), e.what()), err)
				}
			}
		}
	}
	for _, p := range e.s.policies {
		if len(p.accessConds) == 0 || !e.applies(p) {
			continue
		}
		for i := range p.accessConds {
			r := &p.accessConds[i]
			sel := r.sels.match(&e.a)
			if sel == "" {
				continue
			}
			ok, err := r.prog.Eval(e.condVars())
			if !ok {
				why := r.reason
				if why == "" {
					why = "the access does not satisfy it"
				}
				return condFail(fmt.Sprintf("ToolPolicy %s requires %s for %s (selected by %s): %s", p.name, r.prog.Expr, e.what(), sel, why), err)
			}
		}
	}
	return nil
}

// checkApproval returns a require_approval (or Policy Guard deny)
// decision, or nil; approved is true when an approval turned it into an
// allow.
func (e *accessEval) checkApproval() (*toolgate.Decision, bool) {
	why := ""
	if e.guard {
		effect, reason, d := e.policyGuard()
		if d != nil {
			return d, false
		}
		if effect != "allow" {
			why = fmt.Sprintf("approval_tier policy (%s): the Policy Guard escalates this access to a human%s", e.target, reason)
		}
	}
	if why == "" && e.human {
		why = fmt.Sprintf("approval_tier hitl (%s): a human must approve each access", e.target)
	}
	// Every escalation rule that selects the access is evaluated, even when
	// it needs approval already, so that one that cannot be evaluated
	// denies (as in Decide).
	for _, p := range e.s.policies {
		if (!p.requiresHuman && len(p.accessEsc) == 0) || !e.applies(p) {
			continue
		}
		if why == "" && p.requiresHuman {
			why = fmt.Sprintf("ToolPolicy %s has requires_human_approval, which covers resource and prompt accesses too", p.name)
		}
		for i := range p.accessEsc {
			r := &p.accessEsc[i]
			sel := r.sels.match(&e.a)
			switch {
			case sel == "":
				continue
			case r.prog == nil:
				if why == "" {
					why = fmt.Sprintf("ToolPolicy %s escalation rule for %s matches", p.name, sel)
				}
				continue
			case e.skipArgs:
				if why == "" {
					why = fmt.Sprintf("ToolPolicy %s escalation rule %s for %s may match", p.name, r.prog.Expr, sel)
				}
				continue
			}
			ok, err := r.prog.Eval(e.condVars())
			if err != nil {
				// A rule that cannot be evaluated denies: it never
				// becomes an approval prompt someone could click.
				return e.deny(toolgate.CodeConditionFailed, toolgate.LayerApproval,
					func() string {
						return fmt.Sprintf("approval layer: ToolPolicy %s escalation rule %s could not be evaluated for %s: %v (an evaluation error denies); fix the rule or the request", p.name, r.prog.Expr, e.what(), err)
					}), false
			}
			if ok && why == "" {
				why = fmt.Sprintf("ToolPolicy %s escalation rule %s matches", p.name, r.prog.Expr)
			}
		}
	}
	if why == "" {
		return nil, false
	}
	if e.a.Approved {
		return nil, true
	}
	d := e.deny(toolgate.CodeApprovalRequired, toolgate.LayerApproval,
		func() string { return "approval layer: " + why + "; approve exactly this access and repeat it" })
	d.Verdict = toolgate.RequireApproval
	d.EventType = toolgate.EventApprovalRequested
	return d, false
}

// policyGuard evaluates the Policy Guard rules that select the access: the
// first matching rule decides; none matching escalates.
func (e *accessEval) policyGuard() (effect, reason string, deny *toolgate.Decision) {
	for _, p := range e.s.policies {
		if len(p.accessGuard) == 0 || !e.applies(p) {
			continue
		}
		for i := range p.accessGuard {
			g := &p.accessGuard[i]
			if g.sels.match(&e.a) == "" {
				continue
			}
			if g.prog != nil {
				if e.skipArgs {
					continue // a conditional rule cannot be judged without arguments
				}
				ok, err := g.prog.Eval(e.condVars())
				if err != nil {
					return "deny", "", e.deny(toolgate.CodeConditionFailed, toolgate.LayerApproval,
						func() string {
							return fmt.Sprintf("approval layer: the Policy Guard rule %s of ToolPolicy %s could not be evaluated for %s: %v (an evaluation error denies); fix the rule or the request", g.prog.Expr, p.name, e.what(), err)
						})
				}
				if !ok {
					continue
				}
			}
			switch g.effect {
			case "deny":
				why := g.reason
				if why == "" {
					why = "a deny rule matches"
				}
				return "deny", "", e.deny(toolgate.CodePolicyDenied, toolgate.LayerApproval,
					func() string {
						return fmt.Sprintf("approval layer: the Policy Guard (ToolPolicy %s) denies %s: %s; change that policy_guard rule", p.name, e.what(), why)
					})
			case "allow":
				return "allow", "", nil
			default:
				r := ""
				if g.reason != "" {
					r = ": " + g.reason
				}
				return "escalate", r, nil
			}
		}
	}
	return "escalate", " (no policy_guard rule selects it)", nil
}

// AccessFilter filters the items of resources/list,
// resources/templates/list and prompts/list for one identity: an item is
// shown exactly when its tool-level access (DecideAccess with ToolLevel)
// does not deny, computed by the same code. Build one per list request
// (Snapshot.AccessFilter); it caches, per upstream, the default's
// reachability, so thousands of items cost one tool-level decision per
// upstream plus the entry, grant and rule matching of each item. It is not
// safe for concurrent use.
type AccessFilter struct {
	s     *Snapshot
	base  toolgate.Access
	del   *Delegation
	none  bool // the delegation is not this snapshot's or principal's
	reach map[string]*reachResult
}

// AccessFilter returns a filter for the identity ctx names (with its
// Delegation, if any: a delegation of another snapshot or principal shows
// nothing, as does one that expired by ctx.Now). Unlike Resolve, an empty Principal is not "every principal":
// it holds no grant, as in DecideAccess.
func (s *Snapshot) AccessFilter(ctx Context) *AccessFilter {
	f := &AccessFilter{s: s, del: ctx.Delegation, reach: map[string]*reachResult{},
		base: toolgate.Access{AgentID: ctx.AgentID, DeploymentMode: ctx.DeploymentMode, InstanceID: ctx.InstanceID,
			Environment: ctx.Environment, Principal: ctx.Principal, ToolLevel: true}}
	if d := ctx.Delegation; d != nil && (d.snap != s || d.Delegator != ctx.Principal || expired(d, ctx.Now, "") != nil) {
		f.none = true
	}
	return f
}

// Resource reports whether resources/list shows upstream's resource uri.
func (f *AccessFilter) Resource(upstream, uri string) bool {
	a := f.base
	a.Kind, a.Upstream, a.URI = toolgate.AccessResourceRead, upstream, uri
	return f.decide(&a, true).Verdict != toolgate.Deny
}

// Template reports whether resources/templates/list shows upstream's
// resource template tmpl (as the upstream lists it): the tool-level
// completion of the template (AccessResourceComplete, Template), the only
// access a template itself gets; each URI of it is decided when read.
func (f *AccessFilter) Template(upstream, tmpl string) bool {
	a := f.base
	a.Kind, a.Upstream, a.URI, a.Template = toolgate.AccessResourceComplete, upstream, tmpl, true
	return f.decide(&a, true).Verdict != toolgate.Deny
}

// Prompt reports whether prompts/list shows upstream's prompt (the
// upstream's own name).
func (f *AccessFilter) Prompt(upstream, prompt string) bool {
	a := f.base
	a.Kind, a.Upstream, a.Prompt = toolgate.AccessPromptGet, upstream, prompt
	return f.decide(&a, true).Verdict != toolgate.Deny
}

// Decide returns the tool-level decision a list item is filtered by: a
// with ToolLevel set and the filter's identity.
func (f *AccessFilter) Decide(a toolgate.Access) toolgate.Decision {
	if f == nil {
		return accessInternal("no access filter (fail closed)")
	}
	a.AgentID, a.DeploymentMode, a.InstanceID, a.Environment, a.Principal = f.base.AgentID, f.base.DeploymentMode, f.base.InstanceID, f.base.Environment, f.base.Principal
	a.ToolLevel = true
	return f.decide(&a, false)
}

// decide runs the access at tool level; quiet leaves refusals without a
// reason (the bool methods need only the verdict).
func (f *AccessFilter) decide(a *toolgate.Access, quiet bool) (d toolgate.Decision) {
	if f == nil || f.s == nil || f.none {
		return accessInternal("no policy snapshot, or a delegation that does not belong to it (fail closed)")
	}
	defer func() {
		if r := recover(); r != nil {
			d = accessInternal(fmt.Sprintf("internal error while deciding (fail closed): %v", r))
		}
	}()
	e := accessEval{s: f.s, a: *a, reach: f.reach, quiet: quiet}
	if f.del != nil {
		e.del, e.delID = f.del.info, f.del.ID
	}
	return e.run()
}
