package policy

import (
	"fmt"
	"path"
	"slices"
	"sort"
	"strings"

	"github.com/toolgate/toolgate"
	"github.com/toolgate/toolgate/cond"
	"github.com/toolgate/toolgate/toolid"
)

// Diagnostic is one validation finding with its place in the bundle.
type Diagnostic struct {
	File    string `json:"file"`
	Line    int    `json:"line"`
	Message string `json:"message"`
	// Unchecked marks a warning that only says something could not be
	// checked without contacting an upstream; a running gateway checks it
	// once the upstream is connected (and warns then if it is wrong).
	Unchecked bool `json:"unchecked,omitempty"`
}

// String formats the diagnostic as "file:line: message".
func (d Diagnostic) String() string {
	if d.Line > 0 {
		return fmt.Sprintf("%s:%d: %s", d.File, d.Line, d.Message)
	}
	if d.File != "" {
		return d.File + ": " + d.Message
	}
	return d.Message
}

// Report is the outcome of Validate. A bundle with any error is refused;
// warnings are for a person to read.
type Report struct {
	Errors   []Diagnostic `json:"errors"`
	Warnings []Diagnostic `json:"warnings"`
}

// OK reports whether the bundle has no errors.
func (r *Report) OK() bool { return len(r.Errors) == 0 }

// Err returns nil for a valid bundle, or an error listing every error.
func (r *Report) Err() error {
	if r.OK() {
		return nil
	}
	msgs := make([]string, len(r.Errors))
	for i, d := range r.Errors {
		msgs[i] = d.String()
	}
	return fmt.Errorf("invalid policy bundle (%d errors):\n  %s", len(r.Errors), strings.Join(msgs, "\n  "))
}

// ValidateOptions widens what Validate accepts.
type ValidateOptions struct {
	// UpstreamProviders are the provider parts of tools that upstream MCP
	// servers will announce ("fs" for tool:fs-read-file). A ceiling entry
	// under such a provider is accepted unchecked (with a warning), since
	// validation contacts nothing.
	UpstreamProviders map[string]bool
	// ExtraChecks run after the built-in checks (the gateway's own kinds).
	ExtraChecks []func(b *Bundle, r *Reporter)
}

// Reporter collects diagnostics during validation.
type Reporter struct{ rep *Report }

// Errorf adds an error at pos.
func (r *Reporter) Errorf(pos Pos, format string, args ...any) {
	r.rep.Errors = append(r.rep.Errors, Diagnostic{File: pos.File, Line: pos.Line, Message: fmt.Sprintf(format, args...)})
}

// Warnf adds a warning at pos.
func (r *Reporter) Warnf(pos Pos, format string, args ...any) {
	r.rep.Warnings = append(r.rep.Warnings, Diagnostic{File: pos.File, Line: pos.Line, Message: fmt.Sprintf(format, args...)})
}

// Uncheckedf adds a warning at pos that something cannot be checked
// offline (Diagnostic.Unchecked).
func (r *Reporter) Uncheckedf(pos Pos, format string, args ...any) {
	r.rep.Warnings = append(r.rep.Warnings, Diagnostic{File: pos.File, Line: pos.Line, Message: fmt.Sprintf(format, args...), Unchecked: true})
}

// MaxDelegationDepth bounds a chain of delegated_from links.
const MaxDelegationDepth = 32

// Modes are the active_tool_set modes.
var activeModes = map[string]bool{"all": true, "declared": true, "restricted": true}

var tiers = map[string]bool{"auto": true, "policy": true, "hitl": true}

var trustTiers = map[string]bool{"trusted": true, "provisional": true, "untrusted": true}

// Validate checks the bundle and returns every error and warning, sorted by
// file and line. It has no side effects and contacts nothing.
func (b *Bundle) Validate(opts *ValidateOptions) *Report {
	if opts == nil {
		opts = &ValidateOptions{}
	}
	rep := &Report{}
	rep.Errors = append(rep.Errors, b.decode...)
	r := &Reporter{rep: rep}
	v := &validator{b: b, r: r, opts: opts}
	if len(b.Upstreams) > 0 {
		providers := map[string]bool{}
		for k, ok := range opts.UpstreamProviders {
			providers[k] = ok
		}
		for _, u := range b.Upstreams {
			providers[u.Name] = true
		}
		o := *opts
		o.UpstreamProviders = providers
		v.opts = &o
	}
	v.tools()
	v.agents()
	v.buildRefs()
	v.accessCeilings()
	v.runtimePolicies()
	v.instances()
	v.roles()
	v.principals()
	v.toolPolicies()
	v.settings()
	v.upstreams()
	v.sharedProviders()
	v.prefixShadows()
	v.credentials()
	v.databases()
	v.identitySettings()
	for _, f := range opts.ExtraChecks {
		f(b, r)
	}
	for _, ds := range [][]Diagnostic{rep.Errors, rep.Warnings} {
		sort.SliceStable(ds, func(i, j int) bool {
			if ds[i].File != ds[j].File {
				return ds[i].File < ds[j].File
			}
			return ds[i].Line < ds[j].Line
		})
	}
	if rep.Errors == nil {
		rep.Errors = []Diagnostic{}
	}
	if rep.Warnings == nil {
		rep.Warnings = []Diagnostic{}
	}
	return rep
}

type validator struct {
	b    *Bundle
	r    *Reporter
	opts *ValidateOptions

	tools_     map[string]*Tool
	agents_    map[string]*Agent
	roles_     map[string]*Role
	principal_ map[string]*Principal
	celEnv     *cond.Env
	refs       *refs                   // references.go
	reach      map[string]*accessReach // agent id → what it can reach (access_validate.go)
}

// ToolIDOf returns the canonical id a Tool document declares: tool_id, or
// its name's mapping.
func ToolIDOf(t *Tool) string {
	if t.ToolID != "" {
		return t.ToolID
	}
	id, _ := toolid.Map(t.Name)
	return id
}

func (v *validator) tools() {
	v.tools_ = map[string]*Tool{}
	for _, t := range v.b.Tools {
		id := t.ToolID
		if id == "" && t.Name == "" {
			v.r.Errorf(t.Pos, "Tool has neither tool_id nor name")
			continue
		}
		if id != "" && !toolid.Valid(id) {
			v.r.Errorf(t.Pos, "Tool %q: tool_id must be tool:<provider>-<verb> with lowercase a-z0-9 parts joined by -", id)
			continue
		}
		if t.Name != "" {
			mapped, err := toolid.Map(t.Name)
			switch {
			case err != nil:
				v.r.Errorf(t.Pos, "Tool %q: name %q does not map to a tool id: %v", id, t.Name, err)
				continue
			case id == "":
				id = mapped
			case mapped != id:
				v.r.Errorf(t.Pos, "Tool %q: name %q maps to %s, not to its tool_id", id, t.Name, mapped)
				continue
			}
		}
		if prev, dup := v.tools_[id]; dup {
			if prev.Name != "" && t.Name != "" && prev.Name != t.Name {
				v.r.Errorf(t.Pos, "Tool names %q (%s) and %q map to the same tool id %s; rename one", prev.Name, prev.Pos.At(), t.Name, id)
			} else {
				v.r.Errorf(t.Pos, "duplicate Tool %s (first declared at %s)", id, prev.Pos.At())
			}
			continue
		}
		v.tools_[id] = t
		if t.SideEffectClass == "" {
			v.r.Errorf(t.Pos, "Tool %s: side_effect_class is required (none, read, write or irreversible)", id)
		} else if _, err := toolgate.ParseSideEffectClass(t.SideEffectClass); err != nil {
			v.r.Errorf(t.Pos, "Tool %s: %v", id, err)
		}
		n := 0
		for _, s := range []string{t.Source.MCPServer, t.Source.Builtin, t.Source.HTTP} {
			if s != "" {
				n++
			}
		}
		if n > 1 {
			v.r.Errorf(t.Pos, "Tool %s: source names more than one of mcp_server, builtin, http", id)
		}
		if t.ControlFlow && (n > 0 || t.A2AAgent != "") {
			v.r.Errorf(t.Pos, "Tool %s: a control_flow tool reaches no external system, so it cannot have a source or a2a_agent", id)
		}
		if t.Retry.MaxAttempts < 0 {
			v.r.Errorf(t.Pos, "Tool %s: retry.max_attempts must be 0 or more", id)
		}
	}
}

func (v *validator) agents() {
	v.agents_ = map[string]*Agent{}
	for _, a := range v.b.Agents {
		if a.AgentID == "" {
			v.r.Errorf(a.Pos, "Agent has no agent_id")
			continue
		}
		if prev, dup := v.agents_[a.AgentID]; dup {
			v.r.Errorf(a.Pos, "duplicate Agent %s (first declared at %s)", a.AgentID, prev.Pos.At())
			continue
		}
		v.agents_[a.AgentID] = a
	}
	for _, a := range v.b.Agents {
		if v.agents_[a.AgentID] != a {
			continue
		}
		seen := map[string]bool{}
		hasFS, hasWorkspaceTool := false, false
		for _, p := range a.ToolPermissions {
			pos := p.Pos
			if !toolid.Valid(p.ToolID) {
				v.r.Errorf(pos, "Agent %s: tool_permissions entry %q is not a tool id (tool:<provider>-<verb>)", a.AgentID, p.ToolID)
				continue
			}
			if seen[p.ToolID] {
				v.r.Errorf(pos, "Agent %s: %s appears twice in tool_permissions", a.AgentID, p.ToolID)
			}
			seen[p.ToolID] = true
			if p.ApprovalTier != "" && !tiers[p.ApprovalTier] {
				v.r.Errorf(pos, "Agent %s: %s: approval_tier %q must be auto, policy or hitl", a.AgentID, p.ToolID, p.ApprovalTier)
			}
			cls, err := toolgate.ParseSideEffectClass(p.SideEffectClass)
			if p.SideEffectClass == "" {
				v.r.Errorf(pos, "Agent %s: %s: side_effect_class is required", a.AgentID, p.ToolID)
			} else if err != nil {
				v.r.Errorf(pos, "Agent %s: %s: %v", a.AgentID, p.ToolID, err)
			}
			t, known := v.tools_[p.ToolID]
			if !known {
				if prov := provider(p.ToolID); v.opts.UpstreamProviders[prov] {
					v.r.Uncheckedf(pos, "Agent %s: %s is unchecked: upstream %q will be asked for it when the gateway connects", a.AgentID, p.ToolID, prov)
				} else {
					v.r.Errorf(pos, "Agent %s: unknown tool %s in tool_permissions (registration refused: declare a Tool %s or remove the entry)", a.AgentID, p.ToolID, p.ToolID)
				}
				continue
			}
			if own, err2 := toolgate.ParseSideEffectClass(t.SideEffectClass); err == nil && err2 == nil && cls < own {
				v.r.Errorf(pos, "Agent %s: %s: side_effect_class %s is lower than the tool's own %s", a.AgentID, p.ToolID, cls, own)
			}
			if t.A2AAgent != "" {
				target, ok := v.agents_[t.A2AAgent]
				switch {
				case !ok:
					v.r.Errorf(t.Pos, "Tool %s: a2a_agent %s is not a declared Agent", p.ToolID, t.A2AAgent)
				case target.CallableAsTool != nil && !*target.CallableAsTool:
					v.r.Errorf(pos, "Agent %s: %s reaches agent %s, which is callable_as_tool: false and must never be in a ceiling", a.AgentID, p.ToolID, target.AgentID)
				}
			}
			if isWorkspaceBuiltin(t.Source.Builtin) {
				hasWorkspaceTool = true
				if strings.HasPrefix(t.Source.Builtin, "fs.") || t.Source.Builtin == "code.run" {
					hasFS = true
				}
			}
		}
		if a.CheckPosition && (len(a.ToolPermissions) > 0 || a.Workspace != "" || len(a.ResourcePermissions) > 0 || len(a.PromptPermissions) > 0) {
			v.r.Errorf(a.Pos, "Agent %s is in a check position and must be tool-less: no tool_permissions, resource_permissions, prompt_permissions or workspace (registration refused)", a.AgentID)
		}
		if hasFS && a.Workspace == "" {
			v.r.Errorf(a.Pos, "Agent %s has a filesystem tool but no workspace (registration refused: add workspace)", a.AgentID)
		}
		if a.Workspace != "" && !hasWorkspaceTool {
			v.r.Errorf(a.Pos, "Agent %s has a workspace but no fs.* or code.run tool (registration refused)", a.AgentID)
		}
	}
	for _, a := range v.b.Agents {
		if v.agents_[a.AgentID] != a {
			continue
		}
		has := false
		for _, rp := range v.b.RuntimePolicies {
			if rp.AgentID == a.AgentID {
				has = true
			}
		}
		if !has && len(a.ToolPermissions) > 0 {
			v.r.Warnf(a.Pos, "Agent %s has no RuntimePolicy: every call is denied until one exists (fail closed)", a.AgentID)
		}
	}
}

func isWorkspaceBuiltin(name string) bool {
	return strings.HasPrefix(name, "fs.") || name == "code.run"
}

// ProviderOf returns the provider part of an id: "fs" for "tool:fs-read-file".
func ProviderOf(id string) string { return provider(id) }

func provider(id string) string {
	s := strings.TrimPrefix(id, toolid.Prefix)
	p, _, _ := strings.Cut(s, "-")
	return p
}

func (v *validator) ceilingOf(agentID string) map[string]bool {
	out := map[string]bool{}
	if a := v.agents_[agentID]; a != nil {
		for _, p := range a.ToolPermissions {
			out[p.ToolID] = true
		}
	}
	return out
}

func (v *validator) runtimePolicies() {
	seen := map[[2]string]*RuntimePolicy{}
	for _, rp := range v.b.RuntimePolicies {
		if rp.AgentID == "" {
			v.r.Errorf(rp.Pos, "RuntimePolicy has no agent_id")
			continue
		}
		if _, ok := v.agents_[rp.AgentID]; !ok {
			v.r.Errorf(rp.Pos, "RuntimePolicy for unknown agent %s", rp.AgentID)
		}
		mode := rp.DeploymentMode
		if mode == "" {
			v.r.Errorf(rp.Pos, "RuntimePolicy for %s has no deployment_mode", rp.AgentID)
		}
		key := [2]string{rp.AgentID, mode}
		if prev, dup := seen[key]; dup {
			v.r.Errorf(rp.Pos, "two RuntimePolicies for agent %s in deployment mode %s (the other at %s)", rp.AgentID, mode, prev.Pos.At())
		}
		seen[key] = rp
		p := rp.ToolAuthorizationPolicy
		switch {
		case p.ActiveToolSet == "":
			v.r.Errorf(rp.Pos, "RuntimePolicy %s/%s: tool_authorization_policy.active_tool_set is required (all, declared or restricted)", rp.AgentID, mode)
		case !activeModes[p.ActiveToolSet]:
			v.r.Errorf(rp.Pos, "RuntimePolicy %s/%s: active_tool_set %q must be all, declared or restricted", rp.AgentID, mode, p.ActiveToolSet)
		}
		if len(p.ToolGrants) > 0 && p.ActiveToolSet != "declared" {
			v.r.Errorf(rp.Pos, "RuntimePolicy %s/%s: tool_grants only apply with active_tool_set: declared (mode is %s)", rp.AgentID, mode, p.ActiveToolSet)
		}
		if len(p.ToolSuspensions) > 0 && p.ActiveToolSet == "declared" {
			v.r.Errorf(rp.Pos, "RuntimePolicy %s/%s: tool_suspensions do not apply with active_tool_set: declared (use restricted)", rp.AgentID, mode)
		}
		ceiling := v.ceilingOf(rp.AgentID)
		ceilingIDs := sortedSet(ceiling)
		where := fmt.Sprintf("RuntimePolicy %s/%s", rp.AgentID, mode)
		for _, id := range p.ToolGrants {
			// A grant that matches nothing makes the set smaller than
			// meant, never larger: a warning.
			switch {
			case !toolid.Valid(id):
				v.r.Errorf(rp.Pos, "%s: tool_grants entry %q is not a tool id", where, id)
			case !slices.Contains(v.refs.knownTools, id) && !v.opts.UpstreamProviders[provider(id)]:
				v.r.Warnf(rp.Pos, "%s: tool_grants entry %s matches no tool (a typo?); it can never add a tool%s", where, id, didYouMean(id, ceilingIDs))
			case !ceiling[id]:
				v.r.Warnf(rp.Pos, "%s: tool_grants entry %s is outside the agent's ceiling: it can never add a tool%s", where, id, didYouMean(id, ceilingIDs))
			}
		}
		for _, id := range p.ToolSuspensions {
			// A suspension that matches nothing leaves the tool it was
			// meant for running: an error.
			switch {
			case !toolid.Valid(id):
				v.r.Errorf(rp.Pos, "%s: tool_suspensions entry %q is not a tool id", where, id)
			case ceiling[id]:
			case !slices.Contains(v.refs.knownTools, id):
				v.r.Errorf(rp.Pos, "%s: tool_suspensions entry %s matches no tool (a typo?): the tool you meant is NOT suspended%s", where, id, didYouMean(id, ceilingIDs))
			default:
				v.r.Errorf(rp.Pos, "%s: tool_suspensions entry %s is outside the agent's ceiling, so it suspends nothing%s", where, id, didYouMean(id, ceilingIDs))
			}
		}
		mcp := p.MCPToolPolicy
		for _, s := range append(append([]string{}, mcp.AllowedServers...), mcp.DeniedServers...) {
			if s == "" {
				v.r.Errorf(rp.Pos, "RuntimePolicy %s/%s: empty MCP server name", rp.AgentID, mode)
			}
		}
		v.checkServers(rp, where)
		a2a := p.A2AToolPolicy
		if a2a.DefaultTrustTier != "" && !trustTiers[a2a.DefaultTrustTier] {
			v.r.Errorf(rp.Pos, "RuntimePolicy %s/%s: default_trust_tier %q must be trusted, provisional or untrusted", rp.AgentID, mode, a2a.DefaultTrustTier)
		}
		for partner, tier := range a2a.TrustTiers {
			if !trustTiers[tier] {
				v.r.Errorf(rp.Pos, "RuntimePolicy %s/%s: trust tier %q for %s must be trusted, provisional or untrusted", rp.AgentID, mode, tier, partner)
			}
		}
	}
}

func (v *validator) instances() {
	seen := map[string]*Instance{}
	for _, in := range v.b.Instances {
		if in.InstanceID == "" {
			v.r.Errorf(in.Pos, "Instance has no instance_id")
			continue
		}
		if prev, dup := seen[in.InstanceID]; dup {
			v.r.Errorf(in.Pos, "duplicate Instance %s (first declared at %s)", in.InstanceID, prev.Pos.At())
		}
		seen[in.InstanceID] = in
		pool, _ := v.refs.ceilingPool(nil, false)
		for _, env := range sortedKeys(in.EnvironmentOverrides) {
			o := in.EnvironmentOverrides[env]
			v.checkSelectors(in.Pos, fmt.Sprintf("Instance %s: environment %s: resource_suspensions/prompt_suspensions", in.InstanceID, env),
				o.ResourceSuspensions, o.PromptSuspensions, nil, true)
			for _, id := range in.EnvironmentOverrides[env].ToolSuspensions {
				switch {
				case !toolid.Valid(id):
					v.r.Errorf(in.Pos, "Instance %s: environment %s: tool_suspensions entry %q is not a tool id", in.InstanceID, env, id)
				case !slices.Contains(pool, id):
					// Only ceiling tools are ever callable, so this
					// suspends nothing, and the tool meant stays on.
					v.r.Errorf(in.Pos, "Instance %s: environment %s: tool_suspensions entry %s matches no tool in any agent's ceiling (a typo?): the tool you meant is NOT suspended%s",
						in.InstanceID, env, id, didYouMean(id, pool))
				}
			}
		}
	}
}

func (v *validator) cel() *cond.Env {
	if v.celEnv == nil {
		env, err := cond.NewEnv()
		if err != nil {
			panic(err) // static declarations; cannot fail
		}
		v.celEnv = env
	}
	return v.celEnv
}

func (v *validator) checkWhen(pos Pos, where, expr string) {
	if expr == "" {
		return
	}
	if _, err := v.cel().Compile(expr); err != nil {
		v.r.Errorf(pos, "%s: %v", where, err)
	}
}

func (v *validator) checkGrants(pos Pos, owner string, grants []Grant) {
	for i, g := range grants {
		gp := g.Pos
		if gp.Line == 0 {
			gp = pos
		}
		where := fmt.Sprintf("%s grants[%d]", owner, i)
		if g.Resource == "" || g.Action == "" {
			v.r.Errorf(gp, "%s: resource and action are required", where)
			continue
		}
		if strings.Contains(g.Resource, "*") || strings.Contains(g.Action, "*") {
			v.r.Errorf(gp, "%s: resource and action are exact names (a wildcard is written scope: all)", where)
			continue
		}
		if g.Scope.Empty() {
			v.r.Errorf(gp, "%s: scope is required (%s)", where, scopeShapes)
		}
		if g.Scope.Upstream != "" || g.Resource == ResourceMCPResource || g.Resource == ResourcePrompt {
			v.checkAccessGrantScope(gp, where, g)
		} else {
			v.checkGrantScope(gp, where, g)
		}
		v.checkWhen(gp, where+" when", g.When)
	}
}

func (v *validator) roles() {
	v.roles_ = map[string]*Role{}
	for _, r := range v.b.Roles {
		if r.RoleID == "" {
			v.r.Errorf(r.Pos, "Role has no role_id")
			continue
		}
		if prev, dup := v.roles_[r.RoleID]; dup {
			v.r.Errorf(r.Pos, "duplicate Role %s (first declared at %s)", r.RoleID, prev.Pos.At())
		}
		v.roles_[r.RoleID] = r
		v.checkGrants(r.Pos, "Role "+r.RoleID, r.Grants)
	}
}

func (v *validator) principals() {
	v.principal_ = map[string]*Principal{}
	for _, p := range v.b.Principals {
		if p.PrincipalID == "" {
			v.r.Errorf(p.Pos, "Principal has no principal_id")
			continue
		}
		if prev, dup := v.principal_[p.PrincipalID]; dup {
			v.r.Errorf(p.Pos, "duplicate Principal %s (first declared at %s)", p.PrincipalID, prev.Pos.At())
		}
		v.principal_[p.PrincipalID] = p
	}
	for _, p := range v.b.Principals {
		for _, r := range p.Roles {
			if v.roles_[r] == nil {
				v.r.Errorf(p.Pos, "Principal %s: unknown role %s", p.PrincipalID, r)
			}
		}
		v.checkGrants(p.Pos, "Principal "+p.PrincipalID, p.Grants)
		if p.DelegatedFrom == "" {
			continue
		}
		if v.principal_[p.DelegatedFrom] == nil {
			v.r.Errorf(p.Pos, "Principal %s: delegated_from %s is not a declared Principal", p.PrincipalID, p.DelegatedFrom)
			continue
		}
		// cycle and depth check
		seen := map[string]bool{p.PrincipalID: true}
		for cur := p.DelegatedFrom; cur != ""; {
			if seen[cur] {
				v.r.Errorf(p.Pos, "Principal %s: delegation cycle through %s", p.PrincipalID, cur)
				break
			}
			if len(seen) > MaxDelegationDepth {
				v.r.Errorf(p.Pos, "Principal %s: delegation chain longer than %d", p.PrincipalID, MaxDelegationDepth)
				break
			}
			seen[cur] = true
			next := v.principal_[cur]
			if next == nil {
				break
			}
			cur = next.DelegatedFrom
		}
		// A delegation asking for more than its delegator holds.
		delegator := v.allGrants(v.principal_[p.DelegatedFrom], map[string]bool{})
		for _, g := range v.allGrants(p, map[string]bool{}) {
			if !grantCoveredBy(g, delegator) {
				v.r.Warnf(p.Pos, "Principal %s asks for %s:%s on %s, which its delegator %s does not hold; the delegation only narrows, so it has no effect", p.PrincipalID, g.Resource, g.Action, g.Scope, p.DelegatedFrom)
			}
		}
	}
}

// allGrants returns a principal's own and role grants (not intersected with
// its delegator: that is for compile).
func (v *validator) allGrants(p *Principal, seen map[string]bool) []Grant {
	if p == nil || seen[p.PrincipalID] {
		return nil
	}
	out := append([]Grant{}, p.Grants...)
	for _, r := range p.Roles {
		if role := v.roles_[r]; role != nil {
			out = append(out, role.Grants...)
		}
	}
	return out
}

// grantCoveredBy reports whether some grant in set covers g entirely
// (ignoring conditions).
func grantCoveredBy(g Grant, set []Grant) bool {
	for _, o := range set {
		if o.Resource != g.Resource || o.Action != g.Action {
			continue
		}
		if ScopeCovers(o.Scope, g.Scope) {
			return true
		}
	}
	return false
}

// ScopeCovers reports whether scope outer includes all of scope inner: all
// covers everything; a tool covers only the same tool id; a name covers
// itself and the dot-separated names below it.
func ScopeCovers(outer, inner Scope) bool {
	switch {
	case outer.All:
		return true
	case inner.All:
		return false
	case outer.Tool != "" && inner.Tool != "":
		a, err1 := toolid.Map(outer.Tool)
		b, err2 := toolid.Map(inner.Tool)
		return err1 == nil && err2 == nil && a == b
	case outer.Name != "" && inner.Name != "":
		return NameCovers(outer.Name, inner.Name)
	case outer.Upstream != "" && inner.Upstream != "":
		return upstreamScopeCovers(outer, inner)
	}
	return false
}

// upstreamScopeCovers is ScopeCovers for two {upstream, ...} scopes: the
// same upstream, and a whole upstream covers its every resource and prompt;
// a uri covers a uri it covers (URIPattern.Covers); a prompt only itself.
func upstreamScopeCovers(outer, inner Scope) bool {
	switch {
	case outer.Upstream != inner.Upstream:
		return false
	case outer.URI == "" && outer.Prompt == "":
		return true
	case outer.Prompt != "":
		return inner.Prompt == outer.Prompt && inner.URI == ""
	case inner.URI == "":
		return false
	}
	o, err1 := CompileURIPattern(outer.URI)
	i, err2 := CompileURIPattern(inner.URI)
	return err1 == nil && err2 == nil && o.Covers(i)
}

// NameCovers reports whether a grant on resource name scope covers name:
// the same name, or a name below it, part by part ("vala.datasets" covers
// "vala.datasets.tickets" but not "vala.datasets2", and "shop.orders" does
// not cover `shop."orders.secret"`, the table named orders.secret; see
// JoinName). A name that is not well formed is covered only by itself.
func NameCovers(scope, name string) bool {
	if scope == name {
		return true
	}
	s, ok1 := SplitName(scope)
	n, ok2 := SplitName(name)
	if !ok1 || !ok2 || len(n) <= len(s) {
		return false
	}
	for i := range s {
		if s[i] != n[i] {
			return false
		}
	}
	return true
}

func (v *validator) toolPolicies() {
	seen := map[string]*ToolPolicy{}
	for _, tp := range v.b.ToolPolicies {
		if tp.Name == "" {
			v.r.Errorf(tp.Pos, "ToolPolicy has no name")
		} else if prev, dup := seen[tp.Name]; dup {
			v.r.Errorf(tp.Pos, "duplicate ToolPolicy %s (first declared at %s)", tp.Name, prev.Pos.At())
		}
		seen[tp.Name] = tp
		where := "ToolPolicy " + tp.Name
		v.checkAppliesTo(tp, where)
		// The tool rules act on the ceilings of the agents the policy
		// applies to; with none of them declared, that is reported above.
		agents := tp.AppliesTo.Agents
		checkRefs := len(agents) == 0 || slices.ContainsFunc(agents, func(a string) bool { return v.agents_[a] != nil })
		refsOf := func(pos Pos, field string, globs []string, tierPolicy, restricting bool) {
			if checkRefs {
				v.checkToolRefs(pos, where, field, globs, agents, tierPolicy, restricting)
			}
		}
		checkGlobs := func(pos Pos, field string, globs []string) {
			for _, g := range globs {
				if err := ValidGlob(g); err != nil {
					v.r.Errorf(pos, "%s: %s: %v", where, field, err)
				}
			}
		}
		checkGlobs(tp.Pos, "denied", tp.Denied)
		checkGlobs(tp.Pos, "allowed", tp.Allowed)
		refsOf(tp.Pos, "denied", tp.Denied, false, true)
		refsOf(tp.Pos, "allowed", tp.Allowed, false, false)
		for i, e := range tp.EscalationRules {
			pos := e.Pos
			if pos.Line == 0 {
				pos = tp.Pos
			}
			field := fmt.Sprintf("escalation_rules[%d]", i)
			if len(e.Tools)+len(e.Resources)+len(e.Prompts) == 0 {
				v.r.Errorf(pos, "%s: %s names no tools, resources or prompts", where, field)
			}
			checkGlobs(pos, field, e.Tools)
			refsOf(pos, field, e.Tools, false, true)
			v.checkSelectors(pos, where+": "+field, e.Resources, e.Prompts, agents, true)
			v.checkWhen(pos, fmt.Sprintf("%s: %s when", where, field), e.When)
		}
		for i, c := range tp.Conditions {
			pos := c.Pos
			field := fmt.Sprintf("conditions[%d]", i)
			if len(c.Tools)+len(c.Resources)+len(c.Prompts) == 0 {
				v.r.Errorf(pos, "%s: %s names no tools, resources or prompts", where, field)
			}
			v.checkSelectors(pos, where+": "+field, c.Resources, c.Prompts, agents, true)
			if c.When == "" {
				v.r.Errorf(pos, "%s: %s has no when", where, field)
			}
			checkGlobs(pos, field, c.Tools)
			refsOf(pos, field, c.Tools, false, true)
			v.checkWhen(pos, fmt.Sprintf("%s: %s when", where, field), c.When)
		}
		for i, g := range tp.PolicyGuard {
			pos := g.Pos
			field := fmt.Sprintf("policy_guard[%d]", i)
			if g.Effect != "allow" && g.Effect != "deny" && g.Effect != "escalate" {
				v.r.Errorf(pos, "%s: %s: effect %q must be allow, deny or escalate", where, field, g.Effect)
			}
			if len(g.Tools)+len(g.Resources)+len(g.Prompts) == 0 {
				v.r.Errorf(pos, "%s: %s names no tools, resources or prompts", where, field)
			}
			checkGlobs(pos, field, g.Tools)
			v.checkSelectors(pos, where+": "+field, g.Resources, g.Prompts, agents, g.Effect != "allow")
			// A deny or escalate rule that never applies lets the calls
			// it was for through to an earlier allow rule or to a
			// human; an allow rule that never applies only asks more.
			if g.Effect == "allow" || g.Effect == "deny" || g.Effect == "escalate" {
				refsOf(pos, field, g.Tools, true, g.Effect != "allow")
			}
			v.checkWhen(pos, fmt.Sprintf("%s: %s when", where, field), g.When)
		}
	}
}

// ValidGlob checks a tool glob: it must start with "tool:" and use only *,
// ? and character classes as special characters.
func ValidGlob(g string) error {
	if !strings.HasPrefix(g, toolid.Prefix) {
		return fmt.Errorf("glob %q must match tool ids, so it starts with tool:", g)
	}
	if _, err := path.Match(g, ""); err != nil {
		return fmt.Errorf("glob %q: %v", g, err)
	}
	return nil
}

// GlobMatch reports whether a valid tool glob matches id.
func GlobMatch(glob, id string) bool {
	ok, err := path.Match(glob, id)
	return err == nil && ok
}

func (v *validator) settings() {
	if len(v.b.Settings) > 1 {
		v.r.Errorf(v.b.Settings[1].Pos, "more than one Settings document (first at %s)", v.b.Settings[0].Pos.At())
	}
	for _, s := range v.b.Settings {
		for _, id := range s.ControlFlowTools {
			t := v.tools_[id]
			switch {
			case t == nil:
				v.r.Errorf(s.Pos, "Settings: control_flow_tools entry %s is not a declared Tool%s", id, didYouMean(id, sortedKeys(v.tools_)))
			case t.Source != (ToolSource{}) || t.A2AAgent != "":
				// As for control_flow: true (tools()): a control-flow tool
				// is never gated, because it reaches no external system.
				v.r.Errorf(s.Pos, "Settings: control_flow_tools entry %s has a source or a2a_agent, but a control-flow tool reaches no external system (it is never gated by policy, grants or approval); remove it from control_flow_tools", id)
			}
		}
		for _, o := range s.AllowedOrigins {
			if err := checkOrigin(o); err != nil {
				v.r.Errorf(s.Pos, "Settings: allowed_origins: %v", err)
			}
		}
		if s.ResultMaxKiB < 0 {
			v.r.Errorf(s.Pos, "Settings: result_max_kib must be positive")
		}
		if s.DefaultPrincipal != "" && len(v.b.Principals) > 0 && v.principal_[s.DefaultPrincipal] == nil {
			v.r.Warnf(s.Pos, "Settings: default_principal %s is not a declared Principal%s", s.DefaultPrincipal, didYouMean(s.DefaultPrincipal, sortedKeys(v.principal_)))
		}
	}
}
