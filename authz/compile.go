// Package authz is the decision core: it compiles a validated policy bundle
// into an immutable Snapshot once, and answers Resolve (which tools an agent
// may use and see) and Decide (may this call run) from it with no I/O, no
// clock and no globals (docs/design.md, "The decision" and "Packages and the arrows between them"). Every enforcement point calls the
// same Decide, and Resolve is Decide run at tool level, so disclosure and
// enforcement cannot disagree.
package authz

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/toolgate/toolgate"
	"github.com/toolgate/toolgate/cond"
	"github.com/toolgate/toolgate/policy"
	"github.com/toolgate/toolgate/toolid"
)

// DefaultMode is the deployment mode of a call that names none.
const DefaultMode = "production"

// AnnouncedTool is a tool an upstream MCP server announced, joining the
// catalog at compile time. A Tool document with the same id refines it.
//
// What the upstream announces can make a tool more dangerous, never less
// (docs/design.md, "The governed party never lowers its own risk"):
// without a Tool document the tool's class is the higher of write and
// SideEffectClass (a readOnlyHint alone never makes an upstream tool read);
// with one, the document's class, raised to irreversible when the upstream
// claims irreversible (destructiveHint). Only a Tool document for the tool
// can make it read.
type AnnouncedTool struct {
	ID string // canonical id, tool:<upstream>-<mapped name>
	// Name is the name the model sees and calls (tool_prefix + announced
	// name); it is an alias of ID.
	Name      string
	MCPServer string // the upstream's name
	// SideEffectClass is the class the upstream's annotations claim (and,
	// kept by the gateway, the highest it ever claimed for this id).
	SideEffectClass toolgate.SideEffectClass
	Description     string
}

// AnnouncedClass is the class of an announced tool given the class its
// Tool document declares (doc is false when it has none): see
// AnnouncedTool.
func AnnouncedClass(claimed toolgate.SideEffectClass, docClass toolgate.SideEffectClass, doc bool) toolgate.SideEffectClass {
	if !doc {
		return max(claimed, toolgate.SideEffectWrite)
	}
	if claimed == toolgate.SideEffectIrreversible {
		return claimed
	}
	return docClass
}

// CheckAnnounced splits announced tools into those that may join the
// catalog and those refused, with why: a tool id is one tool, so an
// announced id that a Tool document declares with another source (a
// built-in, an HTTP endpoint, an A2A agent, or another upstream) is refused,
// never merged into that tool (docs/design.md, "Identifiers must be
// injective"); and so is an announced tool whose model-visible Name is a
// spelling of another tool's id (a Tool document's, a control-flow tool's,
// or another tool the same upstream announces: tool_prefix "sql_" and
// "query" make sql_query, the name of the built-in tool:sql-query), which
// would shadow that tool's mirror and make its calls ambiguous. Compile
// applies it too.
func CheckAnnounced(b *policy.Bundle, announced []AnnouncedTool) (ok []AnnouncedTool, problems []string) {
	docs := map[string]*policy.Tool{}
	controlFlow := map[string]bool{}
	if b != nil {
		for _, d := range b.Tools {
			docs[policy.ToolIDOf(d)] = d
		}
		for _, st := range b.Settings {
			for _, id := range st.ControlFlowTools {
				controlFlow[id] = true
			}
		}
	}
	ownIDs := map[string]string{} // announced id → its upstream
	for _, a := range announced {
		ownIDs[a.ID] = a.MCPServer
	}
	for _, a := range announced {
		// The name the model sees must name this tool and no other: a
		// name whose spelling maps to another tool's id (tool_prefix
		// "sql_" and an announced "query" make sql_query, a built-in's
		// model-facing name) would shadow that tool in tools/list and
		// make its calls ambiguous.
		if mapped, err := toolid.Map(a.Name); a.Name != "" && err == nil && mapped != a.ID {
			if other := docs[mapped]; other != nil || controlFlow[mapped] {
				problems = append(problems, fmt.Sprintf("upstream %s announced a tool the model would see as %q, which is the name of %s (%s); the upstream's tool is refused (change the upstream's tool_prefix)",
					a.MCPServer, a.Name, mapped, declaredAs(other, controlFlow[mapped])))
				continue
			}
			if ownIDs[mapped] == a.MCPServer {
				problems = append(problems, fmt.Sprintf("upstream %s announced a tool the model would see as %q, which is the name of its own tool %s; the tool is refused (change the upstream's tool_prefix)",
					a.MCPServer, a.Name, mapped))
				continue
			}
		}
		d := docs[a.ID]
		if d == nil {
			ok = append(ok, a)
			continue
		}
		src := d.Source
		switch {
		case src.Builtin != "":
			problems = append(problems, fmt.Sprintf("upstream %s announced %s, which the bundle declares as the built-in tool %s; the upstream's tool is refused (rename it with the upstream's tool_prefix, or drop the Tool document)", a.MCPServer, a.ID, src.Builtin))
		case src.HTTP != "":
			problems = append(problems, fmt.Sprintf("upstream %s announced %s, which the bundle declares as an HTTP tool; the upstream's tool is refused", a.MCPServer, a.ID))
		case d.A2AAgent != "":
			problems = append(problems, fmt.Sprintf("upstream %s announced %s, which the bundle declares as A2A agent %s; the upstream's tool is refused", a.MCPServer, a.ID, d.A2AAgent))
		case src.MCPServer != "" && src.MCPServer != a.MCPServer:
			problems = append(problems, fmt.Sprintf("upstream %s announced %s, which the bundle declares as a tool of upstream %s; the upstream's tool is refused", a.MCPServer, a.ID, src.MCPServer))
		case d.ControlFlow || controlFlow[a.ID]:
			// A control-flow tool is never gated by policy, grants or
			// approval because it reaches no external system; an
			// upstream's tool of that id would be one that does.
			problems = append(problems, fmt.Sprintf("upstream %s announced %s, which the bundle declares as a control-flow tool (never gated, as it reaches no external system); the upstream's tool is refused (rename it with the upstream's tool_prefix)", a.MCPServer, a.ID))
		default:
			ok = append(ok, a)
		}
	}
	return ok, problems
}

// declaredAs says what the bundle declares a tool as, for CheckAnnounced.
func declaredAs(d *policy.Tool, controlFlow bool) string {
	switch {
	case d == nil || controlFlow || d.ControlFlow:
		return "a control-flow tool"
	case d.Source.Builtin != "":
		return "the built-in tool " + d.Source.Builtin
	case d.Source.HTTP != "":
		return "an HTTP tool"
	case d.A2AAgent != "":
		return "A2A agent " + d.A2AAgent
	case d.Source.MCPServer != "":
		return "a tool of upstream " + d.Source.MCPServer
	}
	return "a tool the bundle declares"
}

// Options are compile options; nil means none.
type Options struct {
	// Announced adds upstream tools to the catalog.
	Announced []AnnouncedTool
	// ValidateOptions are passed to Bundle.Validate.
	ValidateOptions *policy.ValidateOptions
}

// Tool is the compiled catalog entry of one tool, as the gateway needs it.
type Tool struct {
	ID              string
	Name            string // the model-visible name (alias) or the function name
	Description     string
	SideEffectClass toolgate.SideEffectClass
	ControlFlow     bool
	Idempotent      bool
	MCPServer       string
	Builtin         string
	HTTP            string
	A2AAgent        string
	InputSchema     any
	OutputSchema    any
	Doc             *policy.Tool // nil for an announced tool with no document

	vars map[string]any
}

type ceilingEntry struct {
	tool  int32
	class toolgate.SideEffectClass
	tier  toolgate.ApprovalTier
}

type removal struct {
	code   toolgate.Code
	reason string
}

type modeInfo struct {
	removed          map[int32]removal
	mcpWriteApproval bool
	a2aApproval      map[int32]string // tool → partner needing approval (provisional)
	// The MCP server lists, for resource and prompt accesses (access.go).
	allowedSrv, deniedSrv map[string]bool
	where                 string
}

type agentInfo struct {
	id, version, engine string
	workspace           string
	ceiling             map[int32]*ceilingEntry
	order               []int32 // ceiling in declaration order
	modes               map[string]*modeInfo
	vars                map[string]any
	doc                 *policy.Agent
	// resCeil and promptCeil are the declared resource and prompt
	// ceilings; nil means the default (access_compile.go).
	resCeil, promptCeil *accessCeiling
	// upTools lists, per upstream, the ceiling's tools of that upstream
	// in ceiling order (the default's reachability).
	upTools map[string][]int32
}

type grantC struct {
	scope policy.Scope
	uri   policy.URIPattern // scope.URI compiled (mcp_resource grants)
	conds []*cond.Program   // all must hold; none means unconditional
	from  string            // where the grant came from, for reasons
}

type principalInfo struct {
	id         string
	delegation string // set for a delegation's grant set
	invokeAll  []grantC
	invoke     map[int32][]grantC
	resources  map[string]map[string][]grantC // resource → action → grants
	vars       map[string]any
}

type condC struct {
	prog   *cond.Program
	reason string
}

type guardC struct {
	prog   *cond.Program
	effect string
	reason string
}

type policyTool struct {
	deniedBy    string
	allowed     bool
	escalate    bool            // an unconditional escalation rule matches
	escalateIf  []*cond.Program // conditional escalation rules that match
	conditions  []condC
	guard       []guardC
	escalateWhy string
}

type compiledPolicy struct {
	name                           string
	agents, instances, envs, modes map[string]bool // nil: all
	allowlist                      bool
	requiresHuman                  bool
	perTool                        []policyTool
	// Rules that select resources and prompts (access_compile.go).
	accessConds, accessEsc, accessGuard []accessRule
}

func (p *compiledPolicy) applies(agent, instance, env, mode string) bool {
	return (p.agents == nil || p.agents[agent]) &&
		(p.instances == nil || p.instances[instance]) &&
		(p.envs == nil || p.envs[env]) &&
		(p.modes == nil || p.modes[mode])
}

// Snapshot is a compiled bundle: immutable, shared by all goroutines. A
// reload builds a new Snapshot and swaps one pointer.
type Snapshot struct {
	tools      []Tool
	byID       map[string]int32
	aliases    map[string]int32 // model-visible names that are not the rule mapping
	agents     map[string]*agentInfo
	agentOrder []string
	instances  map[string]map[string]map[int32]bool // instance → env → suspended
	principals map[string]*principalInfo
	policies   []*compiledPolicy
	// upstreams are the MCP servers the bundle knows (Upstreams, and
	// tools' servers), with the ids of their whole resource and prompt
	// sets; instAccess holds instance → environment → suspended
	// resources and prompts (access_compile.go).
	upstreams  map[string]*upstreamInfo
	instAccess map[string]map[string]*accessSels
	settings   policy.Settings
	bundle     *policy.Bundle
	report     *policy.Report
}

// Compile validates b and compiles it. It returns the validation report in
// every case; the error is non-nil when the bundle has errors (nothing is
// compiled then) or compilation fails.
func Compile(b *policy.Bundle, opts *Options) (*Snapshot, *policy.Report, error) {
	if opts == nil {
		opts = &Options{}
	}
	vo := opts.ValidateOptions
	if vo == nil {
		vo = &policy.ValidateOptions{}
	}
	if len(opts.Announced) > 0 {
		cp := *vo
		cp.UpstreamProviders = map[string]bool{}
		for k, v := range vo.UpstreamProviders {
			cp.UpstreamProviders[k] = v
		}
		for _, a := range opts.Announced {
			cp.UpstreamProviders[policy.ProviderOf(a.ID)] = true
		}
		vo = &cp
	}
	rep := b.Validate(vo)
	if !rep.OK() {
		return nil, rep, rep.Err()
	}
	env, err := cond.NewEnv()
	if err != nil {
		return nil, rep, err
	}
	c := &compiler{b: b, env: env, s: &Snapshot{
		byID:       map[string]int32{},
		aliases:    map[string]int32{},
		agents:     map[string]*agentInfo{},
		instances:  map[string]map[string]map[int32]bool{},
		principals: map[string]*principalInfo{},
		bundle:     b,
		report:     rep,
	}}
	if len(b.Settings) > 0 {
		c.s.settings = *b.Settings[0]
	}
	if c.s.settings.DefaultDeploymentMode == "" {
		c.s.settings.DefaultDeploymentMode = DefaultMode
	}
	announced, _ := CheckAnnounced(b, opts.Announced)
	if err := c.tools(announced); err != nil {
		return nil, rep, err
	}
	c.upstreams()
	c.agents()
	if err := c.accessCeilings(); err != nil {
		return nil, rep, err
	}
	if err := c.instances(); err != nil {
		return nil, rep, err
	}
	if err := c.principals(); err != nil {
		return nil, rep, err
	}
	if err := c.policies(); err != nil {
		return nil, rep, err
	}
	return c.s, rep, nil
}

type compiler struct {
	b   *policy.Bundle
	env *cond.Env
	s   *Snapshot
}

func (c *compiler) compileCond(expr string) (*cond.Program, error) {
	if expr == "" {
		return nil, nil
	}
	return c.env.Compile(expr)
}

func (c *compiler) tools(announced []AnnouncedTool) error {
	add := func(t Tool) int32 {
		idx := int32(len(c.s.tools))
		c.s.tools = append(c.s.tools, t)
		c.s.byID[t.ID] = idx
		return idx
	}
	for _, d := range c.b.Tools {
		id := policy.ToolIDOf(d)
		cls, _ := toolgate.ParseSideEffectClass(d.SideEffectClass)
		name := d.Name
		if name == "" {
			name = toolid.FunctionName(id)
		}
		add(Tool{ID: id, Name: name, Description: d.Description, SideEffectClass: cls,
			ControlFlow: d.ControlFlow, Idempotent: d.Idempotent, MCPServer: d.Source.MCPServer,
			Builtin: d.Source.Builtin, HTTP: d.Source.HTTP, A2AAgent: d.A2AAgent,
			InputSchema: d.InputSchema, OutputSchema: d.OutputSchema, Doc: d})
	}
	for _, a := range announced {
		if !toolid.Valid(a.ID) {
			return fmt.Errorf("announced tool %q from upstream %s: not a canonical tool id", a.ID, a.MCPServer)
		}
		if idx, ok := c.s.byID[a.ID]; ok {
			t := &c.s.tools[idx]
			t.SideEffectClass = AnnouncedClass(a.SideEffectClass, t.SideEffectClass, true)
			if t.MCPServer == "" {
				t.MCPServer = a.MCPServer
			}
			if a.Name != "" {
				t.Name = a.Name
			}
			if t.Description == "" {
				t.Description = a.Description
			}
		} else {
			add(Tool{ID: a.ID, Name: a.Name, Description: a.Description, MCPServer: a.MCPServer,
				SideEffectClass: AnnouncedClass(a.SideEffectClass, 0, false)})
		}
		if a.Name != "" {
			idx := c.s.byID[a.ID]
			if prev, dup := c.s.aliases[a.Name]; dup && prev != idx {
				return fmt.Errorf("tool name %q is announced for both %s and %s", a.Name, c.s.tools[prev].ID, a.ID)
			}
			if mapped, err := toolid.Map(a.Name); err != nil || mapped != a.ID {
				c.s.aliases[a.Name] = idx
			}
		}
	}
	for _, id := range c.s.settings.ControlFlowTools {
		if idx, ok := c.s.byID[id]; ok {
			c.s.tools[idx].ControlFlow = true
		}
	}
	for i := range c.s.tools {
		t := &c.s.tools[i]
		t.vars = map[string]any{"id": t.ID, "name": t.Name, "side_effect_class": t.SideEffectClass.String()}
	}
	return nil
}

func (c *compiler) agents() {
	for _, a := range c.b.Agents {
		ai := &agentInfo{id: a.AgentID, version: a.Version, engine: a.RuntimeEngine, workspace: a.Workspace,
			ceiling: map[int32]*ceilingEntry{}, modes: map[string]*modeInfo{}, doc: a,
			vars: map[string]any{"id": a.AgentID, "version": a.Version, "runtime_engine": a.RuntimeEngine}}
		for _, p := range a.ToolPermissions {
			idx, ok := c.s.byID[p.ToolID]
			if !ok {
				continue // an upstream tool not announced (yet): not in the ceiling
			}
			cls, _ := toolgate.ParseSideEffectClass(p.SideEffectClass)
			if own := c.s.tools[idx].SideEffectClass; own > cls {
				cls = own
			}
			tier := toolgate.ApprovalTier(p.ApprovalTier)
			if tier == "" {
				tier = toolgate.TierAuto
			}
			ai.ceiling[idx] = &ceilingEntry{tool: idx, class: cls, tier: tier}
			ai.order = append(ai.order, idx)
		}
		c.s.agents[a.AgentID] = ai
		c.s.agentOrder = append(c.s.agentOrder, a.AgentID)
	}
	for _, rp := range c.b.RuntimePolicies {
		ai := c.s.agents[rp.AgentID]
		if ai == nil {
			continue
		}
		p := rp.ToolAuthorizationPolicy
		m := &modeInfo{removed: map[int32]removal{}, a2aApproval: map[int32]string{}, mcpWriteApproval: true}
		if p.MCPToolPolicy.MCPWriteApprovalRequired != nil {
			m.mcpWriteApproval = *p.MCPToolPolicy.MCPWriteApprovalRequired
		}
		where := fmt.Sprintf("RuntimePolicy %s/%s (%s)", rp.AgentID, rp.DeploymentMode, rp.Pos.At())
		grants, susp := set(p.ToolGrants), set(p.ToolSuspensions)
		allowedSrv, deniedSrv := set(p.MCPToolPolicy.AllowedServers), set(p.MCPToolPolicy.DeniedServers)
		m.allowedSrv, m.deniedSrv, m.where = allowedSrv, deniedSrv, where
		partners := set(p.A2AToolPolicy.AllowedPartners)
		for _, idx := range ai.order {
			t := &c.s.tools[idx]
			switch {
			case p.ActiveToolSet == "declared" && !grants[t.ID]:
				m.removed[idx] = removal{toolgate.CodeNotGrantedRuntime, fmt.Sprintf("runtime layer: %s is not in tool_grants of %s (active_tool_set: declared); add it to tool_grants", t.ID, where)}
				continue
			case p.ActiveToolSet == "restricted" && susp[t.ID]:
				m.removed[idx] = removal{toolgate.CodeSuspendedRuntime, fmt.Sprintf("runtime layer: %s is suspended by tool_suspensions of %s; remove it from tool_suspensions", t.ID, where)}
				continue
			}
			if t.MCPServer != "" {
				switch {
				case deniedSrv[t.MCPServer]:
					m.removed[idx] = removal{toolgate.CodeMCPServerDenied, fmt.Sprintf("runtime layer: MCP server %s is in denied_servers of %s; remove it from mcp_tool_policy.denied_servers", t.MCPServer, where)}
					continue
				case len(allowedSrv) > 0 && !allowedSrv[t.MCPServer]:
					m.removed[idx] = removal{toolgate.CodeMCPServerDenied, fmt.Sprintf("runtime layer: MCP server %s is not in allowed_servers of %s; add it to mcp_tool_policy.allowed_servers", t.MCPServer, where)}
					continue
				}
			}
			if t.A2AAgent != "" {
				tier := p.A2AToolPolicy.TrustTiers[t.A2AAgent]
				if tier == "" {
					tier = p.A2AToolPolicy.DefaultTrustTier
				}
				if tier == "" {
					tier = "provisional"
				}
				switch {
				case len(partners) > 0 && !partners[t.A2AAgent]:
					m.removed[idx] = removal{toolgate.CodeA2AUntrusted, fmt.Sprintf("runtime layer: partner agent %s is not in allowed_partners of %s; add it to a2a_tool_policy.allowed_partners", t.A2AAgent, where)}
					continue
				case tier == "untrusted":
					m.removed[idx] = removal{toolgate.CodeA2AUntrusted, fmt.Sprintf("runtime layer: partner agent %s has trust tier untrusted in %s; raise its tier in a2a_tool_policy.trust_tiers", t.A2AAgent, where)}
					continue
				case tier == "provisional":
					m.a2aApproval[idx] = t.A2AAgent
				}
			}
		}
		ai.modes[rp.DeploymentMode] = m
	}
}

func set(xs []string) map[string]bool {
	m := make(map[string]bool, len(xs))
	for _, x := range xs {
		m[x] = true
	}
	return m
}

func setOrNil(xs []string) map[string]bool {
	if len(xs) == 0 {
		return nil
	}
	return set(xs)
}

func (c *compiler) instances() error {
	c.s.instAccess = map[string]map[string]*accessSels{}
	for _, in := range c.b.Instances {
		envs := map[string]map[int32]bool{}
		access := map[string]*accessSels{}
		for env, o := range in.EnvironmentOverrides {
			s := map[int32]bool{}
			for _, id := range o.ToolSuspensions {
				if idx, ok := c.s.byID[id]; ok {
					s[idx] = true
				}
			}
			envs[env] = s
			sels, err := compileSels(o.ResourceSuspensions, o.PromptSuspensions)
			if err != nil {
				return fmt.Errorf("Instance %s: environment %s: %w", in.InstanceID, env, err)
			}
			if !sels.empty() {
				access[env] = sels
			}
		}
		c.s.instances[in.InstanceID] = envs
		c.s.instAccess[in.InstanceID] = access
	}
	return nil
}

func (c *compiler) principals() error {
	roles := map[string]*policy.Role{}
	for _, r := range c.b.Roles {
		roles[r.RoleID] = r
	}
	byID := map[string]*policy.Principal{}
	for _, p := range c.b.Principals {
		byID[p.PrincipalID] = p
	}
	type cgrant struct {
		g     policy.Grant
		conds []*cond.Program
		from  string
	}
	own := func(p *policy.Principal) ([]cgrant, error) {
		var out []cgrant
		addAll := func(gs []policy.Grant, from string) error {
			for _, g := range gs {
				prog, err := c.compileCond(g.When)
				if err != nil {
					return fmt.Errorf("%s: %w", from, err)
				}
				var conds []*cond.Program
				if prog != nil {
					conds = []*cond.Program{prog}
				}
				out = append(out, cgrant{g: g, conds: conds, from: from})
			}
			return nil
		}
		if err := addAll(p.Grants, "principal "+p.PrincipalID); err != nil {
			return nil, err
		}
		for _, r := range p.Roles {
			if role := roles[r]; role != nil {
				if err := addAll(role.Grants, "role "+r); err != nil {
					return nil, err
				}
			}
		}
		return out, nil
	}
	memo := map[string][]cgrant{}
	var effective func(p *policy.Principal, depth int) ([]cgrant, error)
	effective = func(p *policy.Principal, depth int) ([]cgrant, error) {
		if got, ok := memo[p.PrincipalID]; ok {
			return got, nil
		}
		if depth > policy.MaxDelegationDepth+1 {
			return nil, fmt.Errorf("principal %s: delegation chain too deep", p.PrincipalID)
		}
		mine, err := own(p)
		if err != nil {
			return nil, err
		}
		if p.DelegatedFrom != "" {
			del := byID[p.DelegatedFrom]
			if del == nil {
				return nil, fmt.Errorf("principal %s: unknown delegator %s", p.PrincipalID, p.DelegatedFrom)
			}
			theirs, err := effective(del, depth+1)
			if err != nil {
				return nil, err
			}
			var out []cgrant
			for _, m := range mine {
				for _, t := range theirs {
					if m.g.Resource != t.g.Resource || m.g.Action != t.g.Action {
						continue
					}
					var scope policy.Scope
					switch {
					case policy.ScopeCovers(t.g.Scope, m.g.Scope):
						scope = m.g.Scope
					case policy.ScopeCovers(m.g.Scope, t.g.Scope):
						scope = t.g.Scope
					default:
						continue
					}
					g := m.g
					g.Scope = scope
					conds := append(append([]*cond.Program{}, m.conds...), t.conds...)
					out = append(out, cgrant{g: g, conds: conds, from: m.from + " delegated from " + p.DelegatedFrom})
				}
			}
			mine = out
		}
		memo[p.PrincipalID] = mine
		return mine, nil
	}
	for _, p := range c.b.Principals {
		gs, err := effective(p, 0)
		if err != nil {
			return err
		}
		pi := newPrincipalInfo(c.s, p.PrincipalID, p.Roles)
		for _, g := range gs {
			pi.add(c.s, g.g, grantC{scope: g.g.Scope, conds: g.conds, from: g.from})
		}
		c.s.principals[p.PrincipalID] = pi
	}
	return nil
}

func newPrincipalInfo(s *Snapshot, id string, roles []string) *principalInfo {
	return &principalInfo{id: id, invoke: map[int32][]grantC{}, resources: map[string]map[string][]grantC{},
		vars: map[string]any{"id": id, "roles": append([]string{}, roles...)}}
}

// add indexes one compiled grant.
func (pi *principalInfo) add(s *Snapshot, g policy.Grant, gc grantC) {
	if g.Resource == "tool" && g.Action == "invoke" {
		switch {
		case g.Scope.All:
			pi.invokeAll = append(pi.invokeAll, gc)
		case g.Scope.Tool != "":
			if id, err := toolid.Map(g.Scope.Tool); err == nil {
				if idx, ok := s.byID[id]; ok {
					pi.invoke[idx] = append(pi.invoke[idx], gc)
					return
				}
			}
			if idx, ok := s.aliases[g.Scope.Tool]; ok {
				pi.invoke[idx] = append(pi.invoke[idx], gc)
			}
		}
		return
	}
	if g.Scope.URI != "" {
		// A uri that does not compile matches nothing (the zero pattern):
		// validation and CompileDelegation refuse it before.
		gc.uri, _ = policy.CompileURIPattern(g.Scope.URI)
	}
	byAction := pi.resources[g.Resource]
	if byAction == nil {
		byAction = map[string][]grantC{}
		pi.resources[g.Resource] = byAction
	}
	byAction[g.Action] = append(byAction[g.Action], gc)
}

// label names the grant set in reasons.
func (pi *principalInfo) label() string {
	if pi.delegation != "" {
		return "delegation " + pi.delegation
	}
	return "principal " + pi.id
}

// Delegation is a compiled delegation grant set (a delegation token's): a
// call made with it passes only what both the delegator's current grants
// and these grants allow, so revoking the delegator's grant revokes it for
// the delegate too. Compile one per snapshot with CompileDelegation.
type Delegation struct {
	ID        string // the token id, for reasons and the audit log
	Delegator string // the principal whose current grants are intersected
	Delegate  string // the subject the delegation was handed to
	// ExpiresAt ends it: a call decided (toolgate.Call.Now) at or after it
	// is denied at the grant layer; the zero time denies every call.
	ExpiresAt time.Time
	// err, when set, is why the delegation could not be compiled: every
	// call under it is denied at the grant layer, saying so.
	err  error
	info *principalInfo
	snap *Snapshot
}

// FailedDelegation is a delegation that could not be compiled (a role it
// names is no longer declared, a grant that does not validate): every call
// under it is denied at the grant layer with err as the reason, and
// nothing is disclosed (fail closed).
func (s *Snapshot) FailedDelegation(id, delegator string, err error) *Delegation {
	return &Delegation{ID: id, Delegator: delegator, err: err, snap: s}
}

// CompileDelegation compiles grants handed by delegator to delegate.
// Conditions (when) are compiled once here. The error names a grant that
// does not validate.
func (s *Snapshot) CompileDelegation(id, delegator, delegate string, grants []policy.Grant, expiresAt time.Time) (*Delegation, error) {
	env, err := cond.NewEnv()
	if err != nil {
		return nil, err
	}
	pi := newPrincipalInfo(s, delegate, nil)
	pi.delegation = id
	for i, g := range grants {
		if g.Resource == "" || g.Action == "" || strings.Contains(g.Resource+g.Action, "*") {
			return nil, fmt.Errorf("delegation grant %d: resource and action are exact names", i)
		}
		if g.Scope.Empty() {
			return nil, fmt.Errorf("delegation grant %d: scope is required", i)
		}
		if err := policy.CheckAccessScope(g); err != nil {
			return nil, fmt.Errorf("delegation grant %d: %w", i, err)
		}
		gc := grantC{scope: g.Scope, from: "delegation " + id}
		if g.When != "" {
			prog, err := env.Compile(g.When)
			if err != nil {
				return nil, fmt.Errorf("delegation grant %d: %w", i, err)
			}
			gc.conds = []*cond.Program{prog}
		}
		pi.add(s, g, gc)
	}
	return &Delegation{ID: id, Delegator: delegator, Delegate: delegate, ExpiresAt: expiresAt, info: pi, snap: s}, nil
}

// DecideDelegated decides a call made under a delegation: c.Principal must
// be the delegator; every grant check must pass for the delegator's
// current grants and for the delegation's. A delegation compiled for another
// snapshot, or for another delegator, denies.
func (s *Snapshot) DecideDelegated(c *toolgate.Call, d *Delegation) (out toolgate.Decision) {
	if c == nil || d == nil || d.snap != s || d.Delegator != c.Principal {
		call := c
		if call == nil {
			call = &toolgate.Call{}
		}
		return internalError(call, "the delegation does not belong to this policy snapshot or principal (fail closed); recompile it")
	}
	defer func() {
		if r := recover(); r != nil {
			out = internalError(c, fmt.Sprintf("internal error while deciding (fail closed): %v", r))
		}
	}()
	if d.err != nil {
		return toolgate.Decision{Verdict: toolgate.Deny, Code: toolgate.CodeRBACToolInvoke, Layer: toolgate.LayerGrant,
			Reason:   fmt.Sprintf("grant layer: the grants of %s cannot be applied (fail closed): %v; mint a new token", d.ID, d.err),
			ToolName: c.Tool, EventType: toolgate.EventUnauthorized}
	}
	var vc varsCache
	e := eval{s: s, c: c, del: d.info, vc: &vc}
	out = e.run(nil)
	out.Disclosed = e.disclosed
	if c.ArgsErr != nil {
		out.Disclosed = s.disclosedDespiteArgs(c, d)
	}
	if out.Verdict != toolgate.Deny && !c.Now.Before(d.ExpiresAt) {
		out = toolgate.Decision{Verdict: toolgate.Deny, Code: toolgate.CodeRBACToolInvoke, Layer: toolgate.LayerGrant,
			Reason: fmt.Sprintf("grant layer: %s expired at %s, so it grants nothing; mint a new one",
				d.ID, d.ExpiresAt.UTC().Format(time.RFC3339)),
			ToolID: out.ToolID, ToolName: c.Tool, EventType: toolgate.EventUnauthorized,
			SideEffectClass: out.SideEffectClass, ApprovalTier: out.ApprovalTier}
	}
	return out
}

func (c *compiler) policies() error {
	for _, tp := range c.b.ToolPolicies {
		cp := &compiledPolicy{name: tp.Name,
			agents: setOrNil(tp.AppliesTo.Agents), instances: setOrNil(tp.AppliesTo.Instances),
			envs: setOrNil(tp.AppliesTo.Environments), modes: setOrNil(tp.AppliesTo.DeploymentModes),
			allowlist: len(tp.Allowed) > 0, requiresHuman: tp.RequiresHumanApproval,
			perTool: make([]policyTool, len(c.s.tools))}
		matchAny := func(globs []string, id string) string {
			for _, g := range globs {
				if policy.GlobMatch(g, id) {
					return g
				}
			}
			return ""
		}
		for i := range c.s.tools {
			id := c.s.tools[i].ID
			pt := &cp.perTool[i]
			pt.deniedBy = matchAny(tp.Denied, id)
			pt.allowed = matchAny(tp.Allowed, id) != ""
			for _, e := range tp.EscalationRules {
				g := matchAny(e.Tools, id)
				if g == "" {
					continue
				}
				prog, err := c.compileCond(e.When)
				if err != nil {
					return fmt.Errorf("ToolPolicy %s: %w", tp.Name, err)
				}
				if prog == nil {
					pt.escalate = true
					pt.escalateWhy = g
				} else {
					pt.escalateIf = append(pt.escalateIf, prog)
				}
			}
			for _, cd := range tp.Conditions {
				if matchAny(cd.Tools, id) == "" {
					continue
				}
				prog, err := c.compileCond(cd.When)
				if err != nil {
					return fmt.Errorf("ToolPolicy %s: %w", tp.Name, err)
				}
				pt.conditions = append(pt.conditions, condC{prog: prog, reason: cd.Reason})
			}
			for _, gr := range tp.PolicyGuard {
				if matchAny(gr.Tools, id) == "" {
					continue
				}
				prog, err := c.compileCond(gr.When)
				if err != nil {
					return fmt.Errorf("ToolPolicy %s: %w", tp.Name, err)
				}
				pt.guard = append(pt.guard, guardC{prog: prog, effect: gr.Effect, reason: gr.Reason})
			}
		}
		if err := c.accessRules(tp, cp); err != nil {
			return fmt.Errorf("ToolPolicy %s: %w", tp.Name, err)
		}
		c.s.policies = append(c.s.policies, cp)
	}
	return nil
}

// Report returns the validation report the snapshot was compiled with
// (warnings only, since errors stop compilation).
func (s *Snapshot) Report() *policy.Report { return s.report }

// Bundle returns the bundle the snapshot was compiled from. Callers must
// not modify it.
func (s *Snapshot) Bundle() *policy.Bundle { return s.bundle }

// Settings returns the bundle's settings with defaults applied.
func (s *Snapshot) Settings() policy.Settings { return s.settings }

// Tool returns the catalog entry for a canonical id.
func (s *Snapshot) Tool(id string) (Tool, bool) {
	idx, ok := s.byID[id]
	if !ok {
		return Tool{}, false
	}
	return s.tools[idx], true
}

// Lookup returns the tool a called name maps to (any spelling of its id,
// or an announced tool's model-visible name), as Decide's first check maps
// it; false when the name maps to no tool, or ambiguously. It decides
// nothing: it is for routing (which executor, which built-in).
func (s *Snapshot) Lookup(name string) (Tool, bool) {
	var buf [toolid.MaxLen]byte
	n, err := toolid.MapBytes(&buf, name)
	alias, hasAlias := s.aliases[name]
	idx := int32(-1)
	if err == nil {
		if i, ok := s.byID[string(buf[:n])]; ok {
			idx = i
		}
	}
	switch {
	case hasAlias && idx >= 0 && idx != alias:
		return Tool{}, false
	case hasAlias:
		idx = alias
	}
	if idx < 0 {
		return Tool{}, false
	}
	return s.tools[idx], true
}

// Role returns the declared role id (nil when it is not declared).
func (s *Snapshot) Role(id string) *policy.Role {
	if s.bundle == nil {
		return nil
	}
	for _, r := range s.bundle.Roles {
		if r.RoleID == id {
			return r
		}
	}
	return nil
}

// Tools returns the catalog, in declaration order.
func (s *Snapshot) Tools() []Tool { return slices.Clone(s.tools) }

// AgentIDs returns the declared agents in declaration order.
func (s *Snapshot) AgentIDs() []string { return slices.Clone(s.agentOrder) }

// Modes returns the deployment modes that have a RuntimePolicy for agent,
// sorted.
func (s *Snapshot) Modes(agentID string) []string {
	a := s.agents[agentID]
	if a == nil {
		return nil
	}
	out := make([]string, 0, len(a.modes))
	for m := range a.modes {
		out = append(out, m)
	}
	slices.Sort(out)
	return out
}

// Instances returns instance ids and, for each, its environments with
// overrides, sorted.
func (s *Snapshot) Instances() map[string][]string {
	out := map[string][]string{}
	for id, envs := range s.instances {
		var es []string
		for e := range envs {
			es = append(es, e)
		}
		slices.Sort(es)
		out[id] = es
	}
	return out
}

// Workspace returns the agent's workspace folder as written in the bundle.
func (s *Snapshot) Workspace(agentID string) string {
	if a := s.agents[agentID]; a != nil {
		return a.workspace
	}
	return ""
}

// AgentVersion returns the agent's version ("" for an unknown agent).
func (s *Snapshot) AgentVersion(agentID string) string {
	if a := s.agents[agentID]; a != nil {
		return a.version
	}
	return ""
}

func ceilingList(s *Snapshot, a *agentInfo) string {
	ids := make([]string, len(a.order))
	for i, idx := range a.order {
		ids[i] = s.tools[idx].ID
	}
	return "[" + strings.Join(ids, ", ") + "]"
}

// upstreamFor returns the upstream whose provider part starts id, or "".
func (s *Snapshot) upstreamFor(id string) string {
	if s.bundle == nil {
		return ""
	}
	for _, u := range s.bundle.Upstreams {
		if strings.HasPrefix(id, toolid.Prefix+u.Name+"-") {
			return u.Name
		}
	}
	return ""
}

// HoldsAll reports whether principal holds {resource, action, scope: all}
// without a condition (for gateway permissions such as audit:read).
func (s *Snapshot) HoldsAll(principal, resource, action string) bool {
	pr := s.principals[principal]
	if pr == nil {
		return false
	}
	for _, g := range pr.resources[resource][action] {
		if g.scope.All && len(g.conds) == 0 {
			return true
		}
	}
	return false
}

// MayReadAudit reports whether principal may read the audit log: it holds
// {resource: audit, action: read, scope: all} without a condition. Such a
// principal is also shown the real decision of a tool it is not shown
// (it can read every decision in the log anyway), and a resolution whole.
func (s *Snapshot) MayReadAudit(principal string) bool {
	return s.HoldsAll(principal, "audit", "read")
}

// ApprovalVisible reports whether principal may see an approval bound to
// bindingPrincipal, asked by requestedBy, for toolID: its own calls' (as
// the principal or the requester) and those it may decide, nothing else
// (pending arguments can hold secrets).
func (s *Snapshot) ApprovalVisible(principal, bindingPrincipal, requestedBy, toolID string) bool {
	if principal == "" {
		return false
	}
	return bindingPrincipal == principal || requestedBy == principal || s.MayDecideApproval(principal, toolID)
}

// MayDecideApproval reports whether principal holds {resource: approval,
// action: decide} with scope all or the exact tool, so it may approve or
// deny calls of toolID (issue: approvals need approval:decide on the tool).
// Conditions on such grants are not evaluated: an approver's grant must be
// unconditional.
func (s *Snapshot) MayDecideApproval(principal, toolID string) bool {
	pr := s.principals[principal]
	if pr == nil {
		return false
	}
	for _, g := range pr.resources["approval"]["decide"] {
		if len(g.conds) > 0 {
			continue
		}
		if g.scope.All {
			return true
		}
		if g.scope.Tool != "" {
			if id, err := toolid.Map(g.scope.Tool); err == nil && id == toolID {
				return true
			}
			if idx, ok := s.aliases[g.scope.Tool]; ok && s.tools[idx].ID == toolID {
				return true
			}
		}
	}
	return false
}
