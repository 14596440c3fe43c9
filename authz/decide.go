package authz

import (
	"fmt"

	"github.com/toolgate/toolgate"
	"github.com/toolgate/toolgate/cond"
	"github.com/toolgate/toolgate/toolid"
)

const allowReason = "allowed: every layer passed"

// eval carries one call through the checks. It lives on the caller's stack.
type eval struct {
	s     *Snapshot
	c     *toolgate.Call
	mode  string
	idx   int32
	tool  *Tool
	agent *agentInfo
	ce    *ceilingEntry
	m     *modeInfo
	pr    *principalInfo
	// del, when set, is a delegation's grant set: every grant check must
	// also pass against it (the intersection, never wider).
	del *principalInfo // its delegation field is the delegation's id
	// skipPrincipal is set by Resolve without a principal: the grant layers
	// are not judged.
	skipPrincipal bool
	// disclosed is set once every tool-level layer passed
	// (toolgate.Decision.Disclosed).
	disclosed bool
	// vc caches the condition variables. It is a pointer to a struct
	// outside the eval (on the caller's stack) rather than a *cond.Vars
	// field: what condVars returns goes to CEL, that is to the heap, and a
	// pointer loaded straight from the eval would make the escape analysis
	// move every Call the core builds itself (Resolve, DecideAccess's
	// default) to the heap with it.
	vc *varsCache
}

// Decide answers one call (docs/design.md, "The decision"). It never returns an error: any
// failure inside is a deny with code internal_error. It is safe for
// concurrent use.
func (s *Snapshot) Decide(c *toolgate.Call) (d toolgate.Decision) {
	if c == nil {
		return internalError(&toolgate.Call{}, "no call to decide (fail closed)")
	}
	defer func() {
		if r := recover(); r != nil {
			d = internalError(c, fmt.Sprintf("internal error while deciding (fail closed): %v", r))
		}
	}()
	if s == nil {
		return internalError(c, "no policy snapshot loaded (fail closed)")
	}
	var vc varsCache
	e := eval{s: s, c: c, vc: &vc}
	d = e.run(nil)
	d.Disclosed = e.disclosed
	if c.ArgsErr != nil {
		d.Disclosed = s.disclosedDespiteArgs(c, nil)
	}
	return d
}

// disclosedDespiteArgs says whether the tool of a call whose arguments did
// not parse is disclosed to the caller (its tool-level decision does not
// deny): the arguments are refused at check 1, before the layers that say
// so, and a visible tool's refusal must still read as one.
func (s *Snapshot) disclosedDespiteArgs(c *toolgate.Call, del *Delegation) bool {
	tl := *c
	tl.ArgsErr, tl.Args, tl.ToolLevel = nil, nil, true
	var d toolgate.Decision
	if del != nil {
		d = s.DecideDelegated(&tl, del)
	} else {
		d = s.Decide(&tl)
	}
	return d.Verdict != toolgate.Deny
}

// LayerResult is one layer's verdict in an explanation.
type LayerResult struct {
	Layer    toolgate.Layer     `json:"layer"`
	Verdict  string             `json:"verdict"` // pass, deny, require_approval, skipped
	Code     toolgate.Code      `json:"code,omitempty"`
	Reason   string             `json:"reason"`
	Decision *toolgate.Decision `json:"-"`
}

// Explain runs the call through every layer and reports each layer's
// verdict, not only the first failure. Layers that cannot be judged (no
// tool id, unknown agent) are "skipped". The final decision is the same as
// Decide's.
func (s *Snapshot) Explain(c *toolgate.Call) (d toolgate.Decision, trace []LayerResult) {
	if c == nil {
		c = &toolgate.Call{}
	}
	defer func() {
		if r := recover(); r != nil {
			d = internalError(c, fmt.Sprintf("internal error while deciding (fail closed): %v", r))
		}
	}()
	if s == nil {
		return internalError(c, "no policy snapshot loaded (fail closed)"), nil
	}
	var vc varsCache
	e := eval{s: s, c: c, vc: &vc}
	d = e.run(&trace)
	d.Disclosed = e.disclosed
	if c.ArgsErr != nil {
		d.Disclosed = s.disclosedDespiteArgs(c, nil)
	}
	return d, trace
}

func internalError(c *toolgate.Call, reason string) toolgate.Decision {
	return toolgate.Decision{Verdict: toolgate.Deny, Code: toolgate.CodeInternalError, Layer: toolgate.LayerInternal,
		Reason: reason, ToolName: c.Tool, EventType: toolgate.EventUnauthorized}
}

func (e *eval) deny(code toolgate.Code, layer toolgate.Layer, reason string) toolgate.Decision {
	d := toolgate.Decision{Verdict: toolgate.Deny, Code: code, Layer: layer, Reason: reason, ToolName: e.c.Tool, EventType: toolgate.EventUnauthorized}
	if e.tool != nil {
		d.ToolID = e.tool.ID
		d.SideEffectClass = e.tool.SideEffectClass
	}
	if e.ce != nil {
		d.SideEffectClass = e.ce.class
		d.ApprovalTier = e.ce.tier
	}
	return d
}

// record adds a layer result to the trace; it returns true when evaluation
// should stop (Decide mode and the layer did not pass).
func record(trace *[]LayerResult, layer toolgate.Layer, d *toolgate.Decision) bool {
	if trace == nil {
		return d != nil
	}
	if d == nil {
		*trace = append(*trace, LayerResult{Layer: layer, Verdict: "pass"})
		return false
	}
	*trace = append(*trace, LayerResult{Layer: layer, Verdict: d.Verdict.String(), Code: d.Code, Reason: d.Reason, Decision: d})
	return false
}

func skipRest(trace *[]LayerResult, from int) {
	if trace == nil {
		return
	}
	for _, l := range layerOrder[from:] {
		*trace = append(*trace, LayerResult{Layer: l, Verdict: "skipped", Reason: "an earlier layer could not be judged"})
	}
}

var layerOrder = []toolgate.Layer{
	toolgate.LayerComposition, toolgate.LayerCeiling, toolgate.LayerRuntime, toolgate.LayerInstance,
	toolgate.LayerPolicy, toolgate.LayerGrant, toolgate.LayerResource, toolgate.LayerCondition, toolgate.LayerApproval,
}

// run performs the checks in order. With trace == nil it stops at the first
// layer that does not pass (Decide); otherwise it records every layer and
// returns the first non-passing decision (Explain).
func (e *eval) run(trace *[]LayerResult) toolgate.Decision {
	var first *toolgate.Decision
	note := func(layer toolgate.Layer, d *toolgate.Decision) bool {
		if d != nil && first == nil {
			first = d
		}
		return record(trace, layer, d)
	}
	// 1-2: the name maps to exactly one known tool.
	if d := e.checkName(); d != nil {
		note(toolgate.LayerComposition, d)
		skipRest(trace, 1)
		return *first
	}
	note(toolgate.LayerComposition, nil)
	// 3: ceiling (and the agent exists).
	d := e.checkCeiling()
	if note(toolgate.LayerCeiling, d) {
		return *first
	}
	if e.agent == nil || e.ce == nil {
		skipRest(trace, 2)
		return *first
	}
	// 4: runtime restriction.
	if note(toolgate.LayerRuntime, e.checkRuntime()) {
		return *first
	}
	// 5: instance override.
	if note(toolgate.LayerInstance, e.checkInstance()) {
		return *first
	}
	if e.tool.ControlFlow {
		// Control-flow tools reach no external system; no policy may strand
		// a run by withholding them (AgentArea "Disclosure").
		if first != nil {
			skipRest(trace, 4)
			return *first
		}
		e.disclosed = true
		if trace != nil {
			for _, l := range layerOrder[4:] {
				*trace = append(*trace, LayerResult{Layer: l, Verdict: "pass", Reason: "control-flow tool: not gated"})
			}
		}
		return e.allow(false)
	}
	// 6: tool policy rules.
	if note(toolgate.LayerPolicy, e.checkPolicy()) {
		return *first
	}
	// 7: invoke grant.
	if note(toolgate.LayerGrant, e.checkInvoke()) {
		return *first
	}
	if first == nil {
		// Disclosed as Resolve discloses: the tool-level decision does not
		// deny. After the invoke grant only a Policy Guard can still deny a
		// tool at the tool level (its first rule without a condition).
		e.disclosed = e.ce.tier != toolgate.TierPolicy || !e.guardDeniesAtToolLevel()
	}
	// 8: resources.
	if note(toolgate.LayerResource, e.checkResources()) {
		return *first
	}
	// 9: conditions.
	if note(toolgate.LayerCondition, e.checkConditions()) {
		return *first
	}
	// 11: approval.
	ad, approved := e.checkApproval()
	if note(toolgate.LayerApproval, ad) {
		return *first
	}
	if first != nil {
		return *first
	}
	return e.allow(approved)
}

func (e *eval) allow(approvalUsed bool) toolgate.Decision {
	d := toolgate.Decision{Verdict: toolgate.Allow, Code: toolgate.CodeOK, Reason: allowReason, ToolID: e.tool.ID,
		ToolName: e.c.Tool, EventType: toolgate.EventAuthorized, SideEffectClass: e.ce.class, ApprovalTier: e.ce.tier,
		ApprovalUsed: approvalUsed}
	return d
}

func (e *eval) checkName() *toolgate.Decision {
	var buf [toolid.MaxLen]byte
	n, err := toolid.MapBytes(&buf, e.c.Tool)
	alias, hasAlias := e.s.aliases[e.c.Tool]
	if err != nil && !hasAlias {
		d := e.deny(toolgate.CodeMalformedCall, toolgate.LayerComposition,
			fmt.Sprintf("composition layer: the called name is refused: %v; call a tool by its exact name", err))
		return &d
	}
	var idx int32 = -1
	if err == nil {
		if i, ok := e.s.byID[string(buf[:n])]; ok {
			idx = i
		}
	}
	if hasAlias {
		if idx >= 0 && idx != alias {
			d := e.deny(toolgate.CodeAmbiguousToolName, toolgate.LayerComposition,
				fmt.Sprintf("composition layer: %q names both %s and %s; call one by its canonical id", e.c.Tool, e.s.tools[alias].ID, e.s.tools[idx].ID))
			return &d
		}
		idx = alias
	}
	if idx < 0 {
		hint := "declare a Tool or connect the upstream that announces it"
		if up := e.s.upstreamFor(string(buf[:n])); up != "" {
			hint = fmt.Sprintf("it would come from upstream %s, which has not announced it (the CLI's validate, resolve and decide contact no upstream; ask a running gateway: POST /v1/decide)", up)
		}
		d := e.deny(toolgate.CodeUnknownTool, toolgate.LayerComposition,
			fmt.Sprintf("composition layer: %q (%s) is not a tool in the catalog; %s", e.c.Tool, string(buf[:n]), hint))
		d.ToolID = string(buf[:n])
		return &d
	}
	e.idx = idx
	e.tool = &e.s.tools[idx]
	if e.c.ArgsErr != nil {
		d := e.deny(toolgate.CodeMalformedCall, toolgate.LayerComposition,
			fmt.Sprintf("composition layer: the arguments are refused: %v; send one JSON object without duplicate keys, keys that differ only by case, or numbers a float64 does not hold as written", e.c.ArgsErr))
		return &d
	}
	return nil
}

func (e *eval) checkCeiling() *toolgate.Decision {
	a := e.s.agents[e.c.AgentID]
	if a == nil {
		d := e.deny(toolgate.CodeUnknownAgent, toolgate.LayerComposition,
			fmt.Sprintf("composition layer: agent %q is not declared in the policy bundle, so its ceiling is empty; add an Agent document", e.c.AgentID))
		return &d
	}
	e.agent = a
	ce := a.ceiling[e.idx]
	if ce == nil {
		d := e.deny(toolgate.CodeNotInCeiling, toolgate.LayerCeiling,
			fmt.Sprintf("ceiling layer: tool '%s' ('%s') is not in agent %s's capability ceiling (tool_permissions) %s; only a new agent version can add it",
				e.c.Tool, e.tool.ID, a.id, ceilingList(e.s, a)))
		return &d
	}
	e.ce = ce
	return nil
}

func (e *eval) checkRuntime() *toolgate.Decision {
	e.mode = e.c.DeploymentMode
	if e.mode == "" {
		e.mode = e.s.settings.DefaultDeploymentMode
	}
	m := e.agent.modes[e.mode]
	if m == nil {
		d := e.deny(toolgate.CodeNoRuntimePolicy, toolgate.LayerRuntime,
			fmt.Sprintf("runtime layer: agent %s has no RuntimePolicy for deployment mode %q, so no tool is active (fail closed); add one", e.agent.id, e.modeOf()))
		return &d
	}
	e.m = m
	if r, removed := m.removed[e.idx]; removed {
		d := e.deny(r.code, toolgate.LayerRuntime, r.reason)
		return &d
	}
	return nil
}

func (e *eval) checkInstance() *toolgate.Decision {
	if e.c.InstanceID == "" {
		return nil
	}
	envs, ok := e.s.instances[e.c.InstanceID]
	if !ok {
		d := e.deny(toolgate.CodeUnknownInstance, toolgate.LayerInstance,
			fmt.Sprintf("instance layer: business instance %q is not declared (fail closed); add an Instance document", e.c.InstanceID))
		return &d
	}
	if e.c.Environment != "" && envs[e.c.Environment][e.idx] {
		d := e.deny(toolgate.CodeSuspendedInstance, toolgate.LayerInstance,
			fmt.Sprintf("instance layer: %s is suspended for instance %s in environment %s by environment_overrides; remove it from that tool_suspensions list",
				e.tool.ID, e.c.InstanceID, e.c.Environment))
		return &d
	}
	return nil
}

func (e *eval) applies(p *compiledPolicy) bool {
	return p.applies(e.agent.id, e.c.InstanceID, e.c.Environment, e.mode)
}

func (e *eval) checkPolicy() *toolgate.Decision {
	for _, p := range e.s.policies {
		if !e.applies(p) {
			continue
		}
		pt := &p.perTool[e.idx]
		if pt.deniedBy != "" {
			d := e.deny(toolgate.CodePolicyDenied, toolgate.LayerPolicy,
				fmt.Sprintf("policy layer: %s matches denied glob %q of ToolPolicy %s; change that rule to allow it", e.tool.ID, pt.deniedBy, p.name))
			return &d
		}
	}
	for _, p := range e.s.policies {
		if !e.applies(p) {
			continue
		}
		if p.allowlist && !p.perTool[e.idx].allowed {
			d := e.deny(toolgate.CodePolicyNotAllowlisted, toolgate.LayerPolicy,
				fmt.Sprintf("policy layer: %s matches no allowed glob of ToolPolicy %s; add it to that allowlist", e.tool.ID, p.name))
			return &d
		}
	}
	return nil
}

func (e *eval) checkInvoke() *toolgate.Decision {
	if e.skipPrincipal {
		return nil
	}
	pr := e.s.principals[e.c.Principal]
	if pr == nil {
		d := e.deny(toolgate.CodeRBACToolInvoke, toolgate.LayerGrant,
			fmt.Sprintf("grant layer: principal %q is not declared, so it holds no tool:invoke grant (fail closed); add a Principal document", e.c.Principal))
		return &d
	}
	e.pr = pr
	if len(pr.invokeAll) == 0 && len(pr.invoke[e.idx]) == 0 {
		d := e.deny(toolgate.CodeRBACToolInvoke, toolgate.LayerGrant,
			fmt.Sprintf("grant layer: principal %s lacks tool:invoke on %s (%s); grant {resource: tool, action: invoke, scope: {tool: %s}}",
				pr.id, e.c.Tool, e.tool.ID, e.tool.Name))
		return &d
	}
	if e.del != nil && len(e.del.invokeAll) == 0 && len(e.del.invoke[e.idx]) == 0 {
		d := e.deny(toolgate.CodeRBACToolInvoke, toolgate.LayerGrant,
			fmt.Sprintf("grant layer: delegation %s from %s does not include tool:invoke on %s (%s); a delegate never exceeds what it was handed: mint a delegation that includes it",
				e.del.delegation, pr.id, e.c.Tool, e.tool.ID))
		return &d
	}
	return nil
}

func resourceAction(r toolgate.Resource) string {
	if r.Action == "" {
		return "read"
	}
	return r.Action
}

func covering(gs []grantC, name string, out []grantC) []grantC {
	for _, g := range gs {
		if g.scope.All || (g.scope.Name != "" && nameCovers(g.scope.Name, name)) {
			out = append(out, g)
		}
	}
	return out
}

func nameCovers(scope, name string) bool {
	if scope == name {
		return true
	}
	return len(name) > len(scope) && name[len(scope)] == '.' && name[:len(scope)] == scope
}

func (e *eval) checkResources() *toolgate.Decision {
	if e.skipPrincipal || e.pr == nil {
		return nil
	}
	for _, r := range e.c.Resources {
		act := resourceAction(r)
		var buf [4]grantC
		if len(covering(e.pr.resources[r.Type][act], r.Name, buf[:0])) == 0 {
			d := e.deny(toolgate.CodeRBACResource, toolgate.LayerResource,
				fmt.Sprintf("resource layer: principal %s lacks %s:%s on %s (the call touches it); grant {resource: %s, action: %s, scope: {name: %s}}",
					e.pr.id, r.Type, act, r.Name, r.Type, act, r.Name))
			return &d
		}
		if e.del != nil && len(covering(e.del.resources[r.Type][act], r.Name, buf[:0])) == 0 {
			d := e.deny(toolgate.CodeRBACResource, toolgate.LayerResource,
				fmt.Sprintf("resource layer: delegation %s from %s does not include %s:%s on %s (the call touches it); a delegate never exceeds what it was handed",
					e.del.delegation, e.pr.id, r.Type, act, r.Name))
			return &d
		}
	}
	return nil
}

// modeOf is the call's deployment mode (e.mode's value, read again from
// the call and the settings): a string loaded straight from the eval into
// something that reaches the heap (a reason, CEL's variables) would move
// the eval's call and varsCache to the heap with it, since the escape
// analysis does not tell the eval's fields apart; what is read through
// e.c, e.s or e.del does not.
func (e *eval) modeOf() string {
	if e.c.DeploymentMode != "" {
		return e.c.DeploymentMode
	}
	return e.s.settings.DefaultDeploymentMode
}

// varsCache holds an eval's condition variables, built on first use.
type varsCache struct{ vars *cond.Vars }

func (e *eval) condVars() *cond.Vars {
	if e.vc == nil {
		e.vc = &varsCache{}
	}
	if e.vc.vars == nil {
		var pv map[string]any
		if e.pr != nil {
			pv = e.pr.vars
		} else {
			pv = map[string]any{"id": e.c.Principal, "roles": []string{}}
		}
		v := &cond.Vars{Args: e.c.Args, Principal: pv, Agent: e.agent.vars, Tool: e.tool.vars,
			Environment: e.c.Environment, InstanceID: e.c.InstanceID, DeploymentMode: e.modeOf()}
		if n := len(e.c.Resources) + len(e.c.Observed); n > 0 {
			rs := make([]map[string]any, 0, n)
			for _, list := range [2][]toolgate.Resource{e.c.Resources, e.c.Observed} {
				for _, r := range list {
					rs = append(rs, map[string]any{"type": r.Type, "name": r.Name, "action": resourceAction(r)})
				}
			}
			v.Resources = rs
		}
		e.vc.vars = v
	}
	return e.vc.vars
}

// anyHolds reports whether some grant's conditions all hold; err is the
// last evaluation error.
func (e *eval) anyHolds(gs []grantC) (bool, error) { return anyGrantHolds(gs, e.condVars) }

// anyGrantHolds reports whether some grant of gs has every condition hold
// for the variables vars returns (asked only when a condition is
// evaluated); err is the last evaluation error. Calls and accesses share
// it.
func anyGrantHolds(gs []grantC, vars func() *cond.Vars) (bool, error) {
	var lastErr error
	for _, g := range gs {
		ok := true
		for _, p := range g.conds {
			v, err := p.Eval(vars())
			if err != nil {
				lastErr = err
			}
			if !v {
				ok = false
				break
			}
		}
		if ok {
			return true, nil
		}
	}
	return false, lastErr
}

func hasConds(gs []grantC) bool {
	for _, g := range gs {
		if len(g.conds) == 0 {
			return false
		}
	}
	return len(gs) > 0
}

func (e *eval) checkConditions() *toolgate.Decision {
	if e.c.ToolLevel {
		return nil // argument conditions narrow single calls, not disclosure
	}
	condFail := func(what string, err error) *toolgate.Decision {
		msg := "condition layer: " + what
		if err != nil {
			msg += ": " + err.Error() + " (an evaluation error denies)"
		}
		d := e.deny(toolgate.CodeConditionFailed, toolgate.LayerCondition, msg)
		return &d
	}
	for _, set := range [2]*principalInfo{e.pr, e.del} {
		if set == nil {
			continue
		}
		all, exact := set.invokeAll, set.invoke[e.idx]
		// Conditions matter only when every covering invoke grant has one.
		if len(all)+len(exact) > 0 && (len(all) == 0 || hasConds(all)) && (len(exact) == 0 || hasConds(exact)) {
			ok, err := e.anyHolds(all)
			if !ok {
				var err2 error
				ok, err2 = e.anyHolds(exact)
				if err == nil {
					err = err2
				}
			}
			if !ok {
				return condFail(fmt.Sprintf("no tool:invoke grant of %s on %s has its when-condition hold for these arguments", set.label(), e.tool.ID), err)
			}
		}
		for _, r := range e.c.Resources {
			var buf [4]grantC
			gs := covering(set.resources[r.Type][resourceAction(r)], r.Name, buf[:0])
			if hasConds(gs) {
				if ok, err := e.anyHolds(gs); !ok {
					return condFail(fmt.Sprintf("no %s:%s grant of %s covering %s has its when-condition hold", r.Type, resourceAction(r), set.label(), r.Name), err)
				}
			}
		}
	}
	for _, p := range e.s.policies {
		if !e.applies(p) {
			continue
		}
		for _, c := range p.perTool[e.idx].conditions {
			ok, err := c.prog.Eval(e.condVars())
			if !ok {
				why := c.reason
				if why == "" {
					why = "the arguments do not satisfy it"
				}
				return condFail(fmt.Sprintf("ToolPolicy %s requires %s for %s: %s", p.name, c.prog.Expr, e.tool.ID, why), err)
			}
		}
	}
	return nil
}

// checkApproval returns a require_approval (or Policy Guard deny) decision,
// or nil; approved is true when an approval turned it into an allow.
func (e *eval) checkApproval() (*toolgate.Decision, bool) {
	why := ""
	switch e.ce.tier {
	case toolgate.TierHITL:
		why = "approval_tier hitl: a human must approve each call"
	case toolgate.TierPolicy:
		effect, reason, d := e.policyGuard()
		if d != nil {
			return d, false
		}
		if effect != "allow" {
			why = "approval_tier policy: the Policy Guard escalates this call to a human" + reason
		}
	}
	if why == "" && e.tool.MCPServer != "" && e.ce.class >= toolgate.SideEffectWrite && (e.m == nil || e.m.mcpWriteApproval) {
		why = fmt.Sprintf("%s is an MCP tool of side_effect_class %s and mcp_write_approval_required is true", e.tool.ID, e.ce.class)
	}
	if why == "" && e.m != nil {
		if partner, ok := e.m.a2aApproval[e.idx]; ok {
			why = fmt.Sprintf("partner agent %s has trust tier provisional", partner)
		}
	}
	// Every applicable escalation rule is evaluated, even when the call
	// needs approval already: a rule that cannot be evaluated denies, so
	// another reason for approval (a stricter tier, say) never turns that
	// denial into an approval prompt (docs/design.md, "Fail closed on
	// anything missing").
	for _, p := range e.s.policies {
		if !e.applies(p) {
			continue
		}
		pt := &p.perTool[e.idx]
		if why == "" && p.requiresHuman {
			why = fmt.Sprintf("ToolPolicy %s has requires_human_approval", p.name)
		}
		if why == "" && pt.escalate {
			why = fmt.Sprintf("ToolPolicy %s escalation_rules match %s (%q)", p.name, e.tool.ID, pt.escalateWhy)
		}
		if len(pt.escalateIf) == 0 {
			continue
		}
		if e.c.ToolLevel {
			if why == "" {
				why = fmt.Sprintf("ToolPolicy %s escalation_rules may match %s", p.name, e.tool.ID)
			}
			continue
		}
		for _, prog := range pt.escalateIf {
			ok, err := prog.Eval(e.condVars())
			if err != nil {
				// A rule that cannot be evaluated denies: it never
				// becomes an approval prompt someone could click.
				d := e.deny(toolgate.CodeConditionFailed, toolgate.LayerApproval,
					fmt.Sprintf("approval layer: ToolPolicy %s escalation rule %s could not be evaluated for these arguments: %v (an evaluation error denies); fix the rule or the arguments", p.name, prog.Expr, err))
				return &d, false
			}
			if ok && why == "" {
				why = fmt.Sprintf("ToolPolicy %s escalation rule %s matches", p.name, prog.Expr)
			}
		}
	}
	if why == "" {
		return nil, false
	}
	if e.c.Approved {
		return nil, true
	}
	d := e.deny(toolgate.CodeApprovalRequired, toolgate.LayerApproval,
		"approval layer: "+why+"; approve exactly this call (same arguments) and repeat it")
	d.Verdict = toolgate.RequireApproval
	d.EventType = toolgate.EventApprovalRequested
	return &d, false
}

// guardDeniesAtToolLevel reports whether the Policy Guard denies the tool
// when judged without arguments (conditional rules skipped), as Resolve
// judges it: such a tool is not disclosed, whatever a call's arguments.
func (e *eval) guardDeniesAtToolLevel() bool {
	if e.c.ToolLevel {
		effect, _, _ := e.policyGuard()
		return effect == "deny"
	}
	saved := e.c
	c := *e.c
	c.ToolLevel = true
	e.c = &c
	effect, _, _ := e.policyGuard()
	e.c = saved
	return effect == "deny"
}

// policyGuard evaluates the Policy Guard rules for a policy-tier tool: the
// first matching rule decides; none matching escalates.
func (e *eval) policyGuard() (effect, reason string, deny *toolgate.Decision) {
	for _, p := range e.s.policies {
		if !e.applies(p) {
			continue
		}
		for _, g := range p.perTool[e.idx].guard {
			if g.prog != nil {
				if e.c.ToolLevel {
					continue // a conditional rule cannot be judged without arguments
				}
				ok, err := g.prog.Eval(e.condVars())
				if err != nil {
					// Fail closed: an unevaluable rule denies, never
					// escalates (an approver could be led to allow what the
					// rule was written to judge).
					d := e.deny(toolgate.CodeConditionFailed, toolgate.LayerApproval,
						fmt.Sprintf("approval layer: the Policy Guard rule %s of ToolPolicy %s could not be evaluated for these arguments: %v (an evaluation error denies); fix the rule or the arguments", g.prog.Expr, p.name, err))
					return "deny", "", &d
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
				d := e.deny(toolgate.CodePolicyDenied, toolgate.LayerApproval,
					fmt.Sprintf("approval layer: the Policy Guard (ToolPolicy %s) denies %s: %s; change that policy_guard rule", p.name, e.tool.ID, why))
				return "deny", "", &d
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
	return "escalate", " (no policy_guard rule matches)", nil
}
