package authz_test

// Properties of resource and prompt accesses, checked over the example
// bundle, every valid conformance bundle and testdata/access/bundle.yaml,
// for every context of contextsOf (agent × mode × instance × environment
// × principal) and every item itemsOf draws from the bundle:
//
//   (a) the list side is the access side: AccessFilter shows an item
//       exactly when its tool-level DecideAccess does not deny;
//   (b) a resource read has no arguments, so its tool-level decision is
//       its decision: shown ⟺ the read (approved) is allowed, and a
//       subscription decides as the read;
//   (c) nothing hidden is reachable: a prompt get or completion, or a
//       template completion, allowed for some arguments is shown;
//   (d) the default is the behaviour before resource and prompt ceilings
//       existed: for an agent without a declared ceiling, an access is
//       reachable only while a tool of its upstream is disclosed, and, in
//       bundles whose rules select no resource or prompt, whenever one is;
//   (e) narrowing never adds: dropping an auto ceiling entry (an entry of
//       a stricter tier may be what raises the tier of URIs a broader one
//       covers, so dropping it is no narrowing) or a grant, raising an
//       entry to hitl, or suspending an upstream's resources and prompts
//       for an instance never makes an access decision more permissive.

import (
	"fmt"
	"slices"
	"testing"

	"github.com/yosida95/uritemplate/v3"

	"github.com/toolgate/toolgate"
	"github.com/toolgate/toolgate/authz"
	"github.com/toolgate/toolgate/policy"
)

func accessPropertySources(t *testing.T) []propSource {
	return append(propertySources(t), propSource{name: "access-bundle", load: func(t testing.TB) *policy.Bundle { return loadAccessBundle(t) }})
}

// accessItem is one thing a list may show.
type accessItem struct {
	kind     string // resource, template, prompt
	upstream string
	key      string // URI, template or prompt name
}

func (it accessItem) String() string { return it.kind + " " + it.upstream + " " + it.key }

// upstreamsOf lists the MCP servers a bundle names, and one it does not.
func upstreamsOf(b *policy.Bundle) []string {
	set := map[string]bool{"ghost": true}
	for _, u := range b.Upstreams {
		set[u.Name] = true
	}
	for _, t := range b.Tools {
		if t.Source.MCPServer != "" {
			set[t.Source.MCPServer] = true
		}
	}
	for _, a := range b.Agents {
		for _, p := range a.ToolPermissions {
			set[policy.ProviderOf(p.ToolID)] = true
		}
	}
	return sortedKeys(set)
}

// itemsOf draws items from every uri and prompt name the bundle writes
// (entries, grant scopes, selectors), expanded with sample values, offered
// under every upstream, with decoys.
func itemsOf(b *policy.Bundle) []accessItem {
	uris := map[string]bool{"file:///decoy.md": true, "file:///docs/a%2Fb": true, "file:///docs/../x": true}
	tmpls := map[string]bool{"file:///{+decoy}": true}
	prompts := map[string]bool{"decoy": true, "a": true}
	addURI := func(u string) {
		if u == "" {
			return
		}
		if !policy.IsURITemplate(u) {
			uris[u] = true
			return
		}
		tmpls[u] = true
		t, err := uritemplate.New(u)
		if err != nil {
			return
		}
		for _, val := range []string{"x", "a/b", "ceo", "1", "2", "3", "drafts/q3.md", "secret/p.md", "public/a.md"} {
			vals := uritemplate.Values{}
			for _, n := range t.Varnames() {
				vals.Set(n, uritemplate.String(val))
			}
			if s, err := t.Expand(vals); err == nil {
				uris[s] = true
			}
		}
	}
	addGrants := func(gs []policy.Grant) {
		for _, g := range gs {
			addURI(g.Scope.URI)
			if g.Scope.Prompt != "" {
				prompts[g.Scope.Prompt] = true
			}
		}
	}
	addSels := func(rs []policy.ResourceSelector, ps []policy.PromptSelector) {
		for _, r := range rs {
			addURI(r.URI)
		}
		for _, p := range ps {
			if p.Prompt != "" {
				prompts[p.Prompt] = true
			}
		}
	}
	for _, a := range b.Agents {
		for _, p := range a.ResourcePermissions {
			addURI(p.URI)
		}
		for _, p := range a.PromptPermissions {
			prompts[p.Prompt] = true
		}
	}
	for _, p := range b.Principals {
		addGrants(p.Grants)
	}
	for _, r := range b.Roles {
		addGrants(r.Grants)
	}
	for _, tp := range b.ToolPolicies {
		for _, c := range tp.Conditions {
			addSels(c.Resources, c.Prompts)
		}
		for _, e := range tp.EscalationRules {
			addSels(e.Resources, e.Prompts)
		}
		for _, g := range tp.PolicyGuard {
			addSels(g.Resources, g.Prompts)
		}
	}
	for _, in := range b.Instances {
		for _, o := range in.EnvironmentOverrides {
			addSels(o.ResourceSuspensions, o.PromptSuspensions)
		}
	}
	var out []accessItem
	for _, up := range upstreamsOf(b) {
		for _, u := range sortedKeys(uris) {
			out = append(out, accessItem{"resource", up, u})
		}
		for _, u := range sortedKeys(tmpls) {
			out = append(out, accessItem{"template", up, u})
		}
		for _, p := range sortedKeys(prompts) {
			out = append(out, accessItem{"prompt", up, p})
		}
	}
	return out
}

// accessOf is the access an item's use makes in context c.
func accessOf(c propCtx, it accessItem, kind toolgate.AccessKind) toolgate.Access {
	a := toolgate.Access{Kind: kind, AgentID: c.Agent, DeploymentMode: c.Mode, InstanceID: c.Instance, Environment: c.Env,
		Principal: c.Principal, Upstream: it.upstream}
	switch it.kind {
	case "prompt":
		a.Prompt, a.PromptName = it.key, it.upstream+"_"+it.key
	case "template":
		a.URI, a.Template = it.key, true
	default:
		a.URI = it.key
	}
	return a
}

func shown(f *authz.AccessFilter, it accessItem) bool {
	switch it.kind {
	case "prompt":
		return f.Prompt(it.upstream, it.key)
	case "template":
		return f.Template(it.upstream, it.key)
	}
	return f.Resource(it.upstream, it.key)
}

// listKind is the access kind a list item is decided as.
func listKind(it accessItem) toolgate.AccessKind {
	switch it.kind {
	case "prompt":
		return toolgate.AccessPromptGet
	case "template":
		return toolgate.AccessResourceComplete
	}
	return toolgate.AccessResourceRead
}

var accessArgVariants = []map[string]any{{}, {"n": 2, "x": 1, "style": "plain", "length": 10}, {"n": "{name}", "length": 5000}}

// selectsAccesses reports whether some rule of b selects resources or
// prompts (then (d)'s converse does not hold: such a rule may refuse what
// the default reaches).
func selectsAccesses(b *policy.Bundle) bool {
	for _, tp := range b.ToolPolicies {
		if tp.RequiresHumanApproval {
			continue // approval does not deny at tool level
		}
		for _, c := range tp.Conditions {
			if len(c.Resources)+len(c.Prompts) > 0 {
				return true
			}
		}
		for _, g := range tp.PolicyGuard {
			if len(g.Resources)+len(g.Prompts) > 0 {
				return true
			}
		}
		for _, e := range tp.EscalationRules {
			if len(e.Resources)+len(e.Prompts) > 0 {
				return true
			}
		}
	}
	for _, in := range b.Instances {
		for _, o := range in.EnvironmentOverrides {
			if len(o.ResourceSuspensions)+len(o.PromptSuspensions) > 0 {
				return true
			}
		}
	}
	return false
}

func TestPropertyAccessListingMatchesAccess(t *testing.T) {
	for _, src := range accessPropertySources(t) {
		t.Run(src.name, func(t *testing.T) {
			t.Parallel()
			b := src.load(t)
			if rep := b.Validate(nil); !rep.OK() {
				t.Skipf("bundle is invalid on purpose: %v", rep.Errors)
			}
			snap := compileBundle(t, b, nil)
			items := itemsOf(b)
			ctxs := contextsOf(b)
			if len(ctxs) == 0 {
				t.Skip("no agents")
			}
			agents := map[string]*policy.Agent{}
			for _, a := range b.Agents {
				agents[a.AgentID] = a
			}
			selects := selectsAccesses(b)
			checked := 0
			for _, c := range ctxs {
				f := snap.AccessFilter(c.resolveContext())
				res := snap.Resolve(c.resolveContext())
				disclosedUp := map[string]bool{}
				for _, id := range res.Disclosed {
					if tool, ok := snap.Tool(id); ok && tool.MCPServer != "" {
						disclosedUp[tool.MCPServer] = true
					}
				}
				for _, it := range items {
					checked++
					show := shown(f, it)
					tl := accessOf(c, it, listKind(it))
					tl.ToolLevel = true
					d := snap.DecideAccess(&tl)
					// (a)
					if show != (d.Verdict != toolgate.Deny) {
						t.Fatalf("%s %s: shown %v, but its tool-level access is %s/%s: %s", c, it, show, d.Verdict, d.Code, d.Reason)
					}
					switch it.kind {
					case "resource":
						// (b)
						for _, k := range []toolgate.AccessKind{toolgate.AccessResourceRead, toolgate.AccessResourceSubscribe} {
							a := accessOf(c, it, k)
							a.Approved = true
							if got := snap.DecideAccess(&a); got.Allowed() != show {
								t.Fatalf("%s %s: shown %v, but %s (approved) is %s/%s: %s", c, it, show, k, got.Verdict, got.Code, got.Reason)
							}
						}
					default:
						// (c)
						kinds := []toolgate.AccessKind{toolgate.AccessPromptGet, toolgate.AccessPromptComplete}
						if it.kind == "template" {
							kinds = []toolgate.AccessKind{toolgate.AccessResourceComplete}
						}
						for _, k := range kinds {
							for _, args := range accessArgVariants {
								a := accessOf(c, it, k)
								a.Args, a.Approved = args, true
								if got := snap.DecideAccess(&a); got.Allowed() && !show {
									t.Fatalf("%s %s: hidden, but %s with %v is allowed", c, it, k, args)
								}
							}
						}
					}
					// (d)
					ag := agents[c.Agent]
					if ag == nil {
						continue
					}
					declared := ag.ResourcePermissions != nil
					if it.kind == "prompt" {
						declared = ag.PromptPermissions != nil
					}
					if declared {
						continue
					}
					if show && !disclosedUp[it.upstream] {
						t.Fatalf("%s %s: shown by the default, but no tool of %s is disclosed", c, it, it.upstream)
					}
					valid := it.kind == "prompt" || (it.kind == "resource" && policy.CheckResourceURI(it.key) == nil) ||
						(it.kind == "template" && policy.CheckURITemplate(it.key) == nil)
					if !selects && c.Principal != "" && valid && disclosedUp[it.upstream] && !show {
						t.Fatalf("%s %s: a tool of %s is disclosed, but the default hides it: %s/%s %s", c, it, it.upstream, d.Verdict, d.Code, d.Reason)
					}
				}
			}
			if checked == 0 {
				t.Skip("no items")
			}
		})
	}
}

// accessNarrowings lists one-step narrowings of b's resource and prompt
// rules (by index, so they apply to a fresh copy).
func accessNarrowings(b *policy.Bundle) []mutation {
	var out []mutation
	for i, a := range b.Agents {
		// Dropping an entry narrows only when it cannot be what raises the
		// tier of URIs another entry covers too (every covering entry's
		// tier applies): an auto entry. Raising an auto entry to hitl
		// narrows; raising a policy entry does not (the Policy Guard may
		// deny where a human may approve).
		for j, p := range a.ResourcePermissions {
			if p.ApprovalTier == "" || p.ApprovalTier == "auto" {
				out = append(out, mutation{fmt.Sprintf("Agent %s: drop resource entry %s", a.AgentID, p.URI), func(b *policy.Bundle) {
					ag := b.Agents[i]
					ag.ResourcePermissions = slices.Delete(slices.Clone(ag.ResourcePermissions), j, j+1)
				}})
				out = append(out, mutation{fmt.Sprintf("Agent %s: resource entry %s to hitl", a.AgentID, p.URI), func(b *policy.Bundle) {
					ag := b.Agents[i]
					ag.ResourcePermissions = slices.Clone(ag.ResourcePermissions)
					ag.ResourcePermissions[j].ApprovalTier = "hitl"
				}})
			}
		}
		for j, p := range a.PromptPermissions {
			out = append(out, mutation{fmt.Sprintf("Agent %s: drop prompt entry %s", a.AgentID, p.Prompt), func(b *policy.Bundle) {
				ag := b.Agents[i]
				ag.PromptPermissions = slices.Delete(slices.Clone(ag.PromptPermissions), j, j+1)
			}})
			if p.ApprovalTier == "" || p.ApprovalTier == "auto" {
				out = append(out, mutation{fmt.Sprintf("Agent %s: prompt entry %s to hitl", a.AgentID, p.Prompt), func(b *policy.Bundle) {
					ag := b.Agents[i]
					ag.PromptPermissions = slices.Clone(ag.PromptPermissions)
					ag.PromptPermissions[j].ApprovalTier = "hitl"
				}})
			}
		}
	}
	for i, p := range b.Principals {
		for j, g := range p.Grants {
			if g.Resource != policy.ResourceMCPResource && g.Resource != policy.ResourcePrompt && g.Resource != "tool" {
				continue
			}
			out = append(out, mutation{fmt.Sprintf("Principal %s: drop grant %s:%s on %s", p.PrincipalID, g.Resource, g.Action, g.Scope), func(b *policy.Bundle) {
				p := b.Principals[i]
				p.Grants = slices.Delete(slices.Clone(p.Grants), j, j+1)
			}})
		}
	}
	ups := upstreamsOf(b)
	for i, in := range b.Instances {
		for _, env := range append(sortedKeys(map[string]bool{envWithoutOverride: true}), keysOf(in.EnvironmentOverrides)...) {
			for _, up := range ups {
				if up == "ghost" {
					continue
				}
				out = append(out, mutation{fmt.Sprintf("Instance %s/%s: suspend %s", in.InstanceID, env, up), func(b *policy.Bundle) {
					in := b.Instances[i]
					overrides := map[string]policy.EnvironmentOverride{}
					for k, v := range in.EnvironmentOverrides {
						overrides[k] = v
					}
					o := overrides[env]
					o.ResourceSuspensions = append(slices.Clone(o.ResourceSuspensions), policy.ResourceSelector{Upstream: up})
					o.PromptSuspensions = append(slices.Clone(o.PromptSuspensions), policy.PromptSelector{Upstream: up})
					overrides[env] = o
					in.EnvironmentOverrides = overrides
				}})
			}
		}
	}
	return out
}

func keysOf[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// accessPlan fixes the accesses an observation decides, so two
// observations compare index by index.
type accessPlan []struct {
	what string
	a    toolgate.Access
}

func accessPlanOf(b *policy.Bundle) accessPlan {
	var plan accessPlan
	items := itemsOf(b)
	for _, c := range contextsOf(b) {
		for _, it := range items {
			for _, k := range []toolgate.AccessKind{listKind(it), toolgate.AccessPromptComplete} {
				if k == toolgate.AccessPromptComplete && it.kind != "prompt" {
					continue
				}
				a := accessOf(c, it, k)
				a.Args = accessArgVariants[1]
				plan = append(plan, struct {
					what string
					a    toolgate.Access
				}{fmt.Sprintf("%s %s %s", c, it, k), a})
			}
		}
	}
	return plan
}

func (p accessPlan) observe(s *authz.Snapshot) []toolgate.Verdict {
	out := make([]toolgate.Verdict, len(p))
	for i := range p {
		a := p[i].a
		out[i] = s.DecideAccess(&a).Verdict
	}
	return out
}

// widened lists every access after decides more permissively than before.
func (p accessPlan) widened(before, after []toolgate.Verdict) []string {
	var out []string
	for i := range p {
		if rank(after[i]) > rank(before[i]) {
			out = append(out, fmt.Sprintf("%s became more permissive: %s -> %s", p[i].what, before[i], after[i]))
		}
	}
	return out
}

func TestPropertyAccessNarrowingNeverAdds(t *testing.T) {
	b := loadAccessBundle(t)
	plan := accessPlanOf(b)
	before := plan.observe(compileBundle(t, b, nil))
	muts := accessNarrowings(b)
	if len(muts) == 0 {
		t.Fatal("nothing to narrow")
	}
	for _, m := range muts {
		nb := loadAccessBundle(t)
		m.apply(nb)
		nsnap, rep, err := authz.Compile(nb, nil)
		if err != nil {
			// A narrowing can make a restricting rule match nothing (its
			// last target gone), which validation refuses: not wider.
			t.Logf("%s: does not compile (%v); skipped", m.name, rep.Errors)
			continue
		}
		for i, v := range plan.widened(before, plan.observe(nsnap)) {
			if i == 5 {
				t.Errorf("%s: more violations", m.name)
				break
			}
			t.Errorf("%s: %s", m.name, v)
		}
	}
}

// TestPropertyAccessHarness: the narrowing check notices a change that
// widens, so a passing property means something.
func TestPropertyAccessHarness(t *testing.T) {
	b := loadAccessBundle(t)
	plan := accessPlanOf(b)
	before := plan.observe(compileBundle(t, b, nil))
	for name, widen := range map[string]func(b *policy.Bundle){
		"lift instance suspensions": func(b *policy.Bundle) {
			for _, in := range b.Instances {
				for env, o := range in.EnvironmentOverrides {
					o.ResourceSuspensions, o.PromptSuspensions = nil, nil
					in.EnvironmentOverrides[env] = o
				}
			}
		},
		"a wider grant": func(b *policy.Bundle) {
			for _, p := range b.Principals {
				if p.PrincipalID == "user:carol" {
					p.Grants = append(p.Grants, policy.Grant{Resource: "mcp_resource", Action: "read", Scope: policy.Scope{All: true}})
				}
			}
		},
		"a declared ceiling dropped (the default)": func(b *policy.Bundle) {
			for _, a := range b.Agents {
				if a.AgentID == "none" {
					a.ResourcePermissions = nil
				}
			}
		},
	} {
		wide := loadAccessBundle(t)
		widen(wide)
		if len(plan.widened(before, plan.observe(compileBundle(t, wide, nil)))) == 0 {
			t.Errorf("%s: the narrowing check did not notice that it widens", name)
		}
	}
}
