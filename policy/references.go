package policy

import (
	"fmt"
	"net/url"
	"slices"
	"sort"
	"strings"

	"github.com/agnivade/levenshtein"

	"github.com/toolgate/toolgate/toolid"
)

// References: a rule that restricts (a deny, a suspension, a condition, an
// escalation, a policy that applies only somewhere) must be able to match
// something, because a rule that can never match is almost always a typo,
// and a typo in a restriction silently leaves open what it was written to
// close. Validation therefore resolves every name such a rule gives against
// what the bundle declares:
//
//   - a tool id or glob against the ceilings it can act on. Every tool a
//     call can reach is in some agent's ceiling, and ceilings are written
//     out in the bundle (an upstream's tools by id, checked once it
//     connects), so a restriction that matches no ceiling entry of the
//     agents it applies to never takes effect;
//   - agents, instances, environments, deployment modes, MCP servers and
//     databases against their declarations.
//
// A restricting reference that matches nothing is an error naming the
// closest known name (edit distance). One in a place that only permits
// (an allowed glob, tool_grants, allowed_servers) makes the bundle
// stricter than meant, not weaker: a warning, with the same hint. Two
// kinds of names are open, so matching nothing declared is a warning
// there too: a grant scope's tool under the provider of a declared
// upstream (the upstream may announce it), and an environment (a runtime
// calling in process, or the CLI, may name one the bundle does not).

// refs is what a bundle declares that rules may refer to.
type refs struct {
	ceiling    map[string]map[string]bool // agent id → tool ids of its ceiling
	policyTier map[string]map[string]bool // agent id → ceiling ids whose approval_tier is policy
	agents     []string                   // sorted
	knownTools []string                   // declared Tool ids and ceiling ids, sorted
	instances  map[string]*Instance
	envs       map[string]bool            // environments something binds or overrides
	envByClaim bool                       // a JWT issuer takes the environment from a claim
	modes      map[string]map[string]bool // deployment mode → agents with a RuntimePolicy in it
	servers    map[string]bool            // MCP server names: upstreams and Tool source.mcp_server
	upstreams  map[string]bool            // upstream providers (declared or announced)
	databases  []string                   // sorted
}

func (v *validator) buildRefs() {
	r := &refs{ceiling: map[string]map[string]bool{}, policyTier: map[string]map[string]bool{},
		instances: map[string]*Instance{}, envs: map[string]bool{}, modes: map[string]map[string]bool{},
		servers: map[string]bool{}, upstreams: map[string]bool{}}
	known := map[string]bool{}
	for id := range v.tools_ {
		known[id] = true
	}
	for id, a := range v.agents_ {
		r.agents = append(r.agents, id)
		c, pt := map[string]bool{}, map[string]bool{}
		for _, p := range a.ToolPermissions {
			if !toolid.Valid(p.ToolID) {
				continue
			}
			c[p.ToolID] = true
			known[p.ToolID] = true
			if p.ApprovalTier == "policy" {
				pt[p.ToolID] = true
			}
		}
		r.ceiling[id], r.policyTier[id] = c, pt
	}
	sort.Strings(r.agents)
	r.knownTools = sortedSet(known)
	for _, in := range v.b.Instances {
		if in.InstanceID == "" {
			continue
		}
		if _, dup := r.instances[in.InstanceID]; !dup {
			r.instances[in.InstanceID] = in
		}
		for env := range in.EnvironmentOverrides {
			r.envs[env] = true
		}
	}
	for _, c := range v.b.Credentials {
		if c.Environment != "" {
			r.envs[c.Environment] = true
		}
	}
	for _, s := range v.b.Settings {
		if s.Anonymous != nil && s.Anonymous.Environment != "" {
			r.envs[s.Anonymous.Environment] = true
		}
		for _, j := range s.JWTIssuers {
			if j.Environment.Value != "" {
				r.envs[j.Environment.Value] = true
			}
			if j.Environment.Claim != "" {
				r.envByClaim = true
			}
		}
	}
	for _, rp := range v.b.RuntimePolicies {
		if rp.DeploymentMode == "" {
			continue
		}
		if r.modes[rp.DeploymentMode] == nil {
			r.modes[rp.DeploymentMode] = map[string]bool{}
		}
		r.modes[rp.DeploymentMode][rp.AgentID] = true
	}
	for _, u := range v.b.Upstreams {
		r.servers[u.Name] = true
	}
	for p, ok := range v.opts.UpstreamProviders {
		if ok {
			r.servers[p] = true
			r.upstreams[p] = true
		}
	}
	for _, t := range v.b.Tools {
		if t.Source.MCPServer != "" {
			r.servers[t.Source.MCPServer] = true
		}
	}
	for _, d := range v.b.Databases {
		if d.Name != "" && !slices.Contains(r.databases, d.Name) {
			r.databases = append(r.databases, d.Name)
		}
	}
	sort.Strings(r.databases)
	v.refs = r
}

func sortedSet(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k, ok := range m {
		if ok {
			out = append(out, k)
		}
	}
	sort.Strings(out)
	return out
}

// ceilingPool returns the ceiling ids of agents (all agents when agents is
// empty; undeclared ones are skipped), sorted, and a phrase naming where
// they were looked for. tierPolicy keeps only entries of approval_tier
// policy.
func (r *refs) ceilingPool(agents []string, tierPolicy bool) ([]string, string) {
	src := r.ceiling
	if tierPolicy {
		src = r.policyTier
	}
	set := map[string]bool{}
	var named []string
	if len(agents) == 0 {
		for _, c := range src {
			for id := range c {
				set[id] = true
			}
		}
	} else {
		for _, a := range agents {
			c, ok := src[a]
			if !ok {
				continue
			}
			named = append(named, a)
			for id := range c {
				set[id] = true
			}
		}
	}
	what := "any agent's ceiling"
	switch {
	case len(named) == 1:
		what = "the ceiling of agent " + named[0]
	case len(named) > 1:
		what = "the ceilings of agents " + strings.Join(named, ", ")
	}
	if tierPolicy {
		what = "the approval_tier: policy entries of " + what
	}
	return sortedSet(set), what
}

// matchesAny reports whether the tool glob g matches one of ids.
func matchesAny(g string, ids []string) bool {
	for _, id := range ids {
		if GlobMatch(g, id) {
			return true
		}
	}
	return false
}

// closest returns the candidate nearest to word by edit distance (the
// first in order among equals), or "" when there is none. For a glob, only
// its literal part before the first wildcard is compared, with the same
// length of each candidate.
func closest(word string, cands []string) string {
	lit := word
	if i := strings.IndexAny(word, `*?[\`); i >= 0 {
		lit = word[:i]
	}
	best, bestD := "", -1
	for _, c := range cands {
		if c == word {
			continue
		}
		cmpTo := c
		if len(lit) < len(word) && len(c) > len(lit) {
			cmpTo = c[:len(lit)]
		}
		d := levenshtein.ComputeDistance(lit, cmpTo)
		if bestD < 0 || d < bestD {
			best, bestD = c, d
		}
	}
	return best
}

// didYouMean is " (did you mean X?)" for the closest candidate, or "" when
// there are none.
func didYouMean(word string, cands []string) string {
	if c := closest(word, cands); c != "" {
		return " (did you mean " + c + "?)"
	}
	return ""
}

// checkAppliesTo checks a ToolPolicy's applies_to: each name must be able
// to match a call, or the policy never restricts anything there.
func (v *validator) checkAppliesTo(tp *ToolPolicy, where string) {
	r := v.refs
	for _, a := range tp.AppliesTo.Agents {
		if v.agents_[a] == nil {
			v.r.Errorf(tp.Pos, "%s: applies_to agent %s is not a declared Agent, so the policy never applies to it%s", where, a, didYouMean(a, r.agents))
		}
	}
	for _, in := range tp.AppliesTo.Instances {
		if r.instances[in] == nil {
			v.r.Errorf(tp.Pos, "%s: applies_to instance %s is not a declared Instance (calls for an undeclared instance are denied), so the policy never applies%s",
				where, in, didYouMean(in, sortedKeys(r.instances)))
		}
	}
	for _, env := range tp.AppliesTo.Environments {
		// Environments are open: a runtime calling in process, or the
		// CLI, may name one the bundle does not (unlike agents, instances
		// and modes, which must be declared for any call to pass). So an
		// environment nothing names is a warning.
		if r.envs[env] {
			continue
		}
		how := "only a caller naming it itself (in process, or the CLI's --env) brings it"
		if r.envByClaim {
			how = "only a JWT environment claim or a caller naming it itself brings it"
		}
		v.r.Warnf(tp.Pos, "%s: applies_to environment %s is named by no Instance override, Credential, JWT issuer or Settings.anonymous; %s, and if it is a typo the policy does not apply where meant%s",
			where, env, how, didYouMean(env, sortedSet(r.envs)))
	}
	for _, m := range tp.AppliesTo.DeploymentModes {
		agents := r.modes[m]
		ok := len(agents) > 0
		if ok && len(tp.AppliesTo.Agents) > 0 {
			ok = false
			for _, a := range tp.AppliesTo.Agents {
				ok = ok || agents[a]
			}
		}
		if !ok {
			v.r.Errorf(tp.Pos, "%s: applies_to deployment_mode %s has no RuntimePolicy for the agents the policy applies to (calls in it are denied at the runtime layer), so the policy never applies%s",
				where, m, didYouMean(m, sortedKeys(r.modes)))
		}
	}
}

// checkToolRefs checks the tool globs of one ToolPolicy field against the
// ceilings they can act on. restricting says whether a rule that matches
// nothing weakens the bundle (error) or only narrows it (warning).
func (v *validator) checkToolRefs(pos Pos, where, field string, globs []string, agents []string, tierPolicy, restricting bool) {
	pool, what := v.refs.ceilingPool(agents, tierPolicy)
	for _, g := range globs {
		if ValidGlob(g) != nil || matchesAny(g, pool) {
			continue // a bad glob is reported by checkGlobs
		}
		hint := didYouMean(g, pool)
		if tierPolicy {
			all, _ := v.refs.ceilingPool(agents, false)
			if matchesAny(g, all) {
				hint = " (the Policy Guard judges only tools whose ceiling entry has approval_tier: policy)"
			}
		}
		if restricting {
			v.r.Errorf(pos, "%s: %s %s matches no tool in %s, so the rule never applies%s", where, field, g, what, hint)
		} else {
			v.r.Warnf(pos, "%s: %s %s matches no tool in %s, so it permits nothing%s", where, field, g, what, hint)
		}
	}
}

// checkGrantScope checks what a grant's scope names: a tool scope must
// name a known tool (a declared one, a ceiling entry, or, with a warning,
// one an upstream may announce); a name scope must be a well-formed
// resource name in its canonical spelling; a name scope on the built-in
// SQL resources should start with a declared Database.
func (v *validator) checkGrantScope(pos Pos, where string, g Grant) {
	if g.Scope.Tool != "" {
		id, err := toolid.Map(g.Scope.Tool)
		switch {
		case err != nil:
			v.r.Errorf(pos, "%s: scope tool %q: %v", where, g.Scope.Tool, err)
		case slices.Contains(v.refs.knownTools, id):
		case v.refs.upstreams[provider(id)]:
			v.r.Warnf(pos, "%s: scope tool %q (%s) is no declared tool and in no ceiling; upstream %s may announce it%s",
				where, g.Scope.Tool, id, provider(id), didYouMean(id, v.refs.knownTools))
		default:
			v.r.Errorf(pos, "%s: scope tool %q (%s) matches no tool: it is neither declared nor in any ceiling%s",
				where, g.Scope.Tool, id, didYouMean(id, v.refs.knownTools))
		}
	}
	if n := g.Scope.Name; n != "" {
		parts, ok := SplitName(n)
		switch {
		case !ok:
			v.r.Errorf(pos, "%s: scope name %q is not a well-formed resource name (parts joined by '.', a part holding '.' or '\"' written in double quotes, each '\"' doubled)", where, n)
		case JoinName(parts...) != n:
			v.r.Errorf(pos, "%s: scope name %q is written %q in resource names (a part is quoted only when it holds '.' or '\"'); write it so, or it matches nothing", where, n, JoinName(parts...))
		case (g.Resource == "sql_table" || g.Resource == "sql_database") && !slices.Contains(v.refs.databases, parts[0]):
			v.r.Warnf(pos, "%s: scope name %q: %s resources start with the Database name, and %s is not a declared Database, so the grant permits nothing%s",
				where, n, g.Resource, parts[0], didYouMean(parts[0], v.refs.databases))
		}
	}
}

// checkServers checks a RuntimePolicy's MCP server lists.
func (v *validator) checkServers(rp *RuntimePolicy, where string) {
	mcp := rp.ToolAuthorizationPolicy.MCPToolPolicy
	known := sortedSet(v.refs.servers)
	for _, s := range mcp.DeniedServers {
		if s != "" && !v.refs.servers[s] {
			v.r.Errorf(rp.Pos, "%s: denied_servers entry %s is no Upstream and no Tool's source.mcp_server, so it denies nothing%s", where, s, didYouMean(s, known))
		}
	}
	for _, s := range mcp.AllowedServers {
		if s != "" && !v.refs.servers[s] {
			v.r.Warnf(rp.Pos, "%s: allowed_servers entry %s is no Upstream and no Tool's source.mcp_server, so it permits nothing%s", where, s, didYouMean(s, known))
		}
	}
	a2a := rp.ToolAuthorizationPolicy.A2AToolPolicy
	for _, p := range a2a.AllowedPartners {
		if v.agents_[p] == nil {
			v.r.Warnf(rp.Pos, "%s: allowed_partners entry %s is not a declared Agent, so it permits nothing%s", where, p, didYouMean(p, v.refs.agents))
		}
	}
	for _, p := range sortedKeys(a2a.TrustTiers) {
		if v.agents_[p] != nil {
			continue
		}
		if tier := a2a.TrustTiers[p]; tier == "trusted" {
			v.r.Warnf(rp.Pos, "%s: trust_tiers names %s, which is not a declared Agent%s", where, p, didYouMean(p, v.refs.agents))
		} else {
			v.r.Errorf(rp.Pos, "%s: trust_tiers sets %s for %s, which is not a declared Agent, so it restricts nothing%s", where, tier, p, didYouMean(p, v.refs.agents))
		}
	}
}

// checkOrigin checks one Settings.allowed_origins entry: a browser sends
// its Origin as scheme://host[:port], so anything else never matches.
func checkOrigin(o string) error {
	if o == "null" || o == "*" {
		return fmt.Errorf("%q would admit any page (a sandboxed frame or file sends Origin: null); list the pages' origins", o)
	}
	u, err := url.Parse(o)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil ||
		u.Path != "" || u.RawQuery != "" || u.Fragment != "" || strings.ToLower(o) != o {
		return fmt.Errorf("%q is not an origin; a browser sends scheme://host[:port] in lowercase, without a path (e.g. https://app.example.com)", o)
	}
	return nil
}

// nestedPrefix reports whether one of two model-visible tool prefixes
// starts the other, so that a name of one upstream can be read as a name
// of the other ("fs_" and "fs_x_": fs_x_read is fs's "x_read" and fs_x's
// "read").
func nestedPrefix(a, b string) bool {
	return strings.HasPrefix(a, b) || strings.HasPrefix(b, a)
}
