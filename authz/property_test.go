package authz_test

// Properties that must hold for every bundle, checked over the example
// bundle and every conformance scenario whose bundle is valid:
//
//   (a) disclosure and enforcement agree: Resolve discloses exactly the
//       ceiling tools whose tool-level Decide does not deny, and every
//       spelling of a tool (id, function name, dot name) decides alike;
//   (b) narrowing never adds: suspending one more tool, removing one
//       tool_grants entry, suspending one more tool for an instance, or
//       removing one principal or role grant never makes any decision more
//       permissive and never grows the active or disclosed sets.
//
// Each is checked for every agent × deployment mode (those with a
// RuntimePolicy plus one without) × instance (none and each declared) ×
// environment (none, each with overrides, one without) × principal (none and
// each declared).

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.yaml.in/yaml/v3"

	"github.com/toolgate/toolgate"
	"github.com/toolgate/toolgate/authz"
	"github.com/toolgate/toolgate/policy"
	"github.com/toolgate/toolgate/toolid"
)

// propSource loads a fresh copy of one bundle, so a mutation never leaks
// into another.
type propSource struct {
	name string
	load func(t testing.TB) *policy.Bundle
}

const (
	modeWithoutPolicy  = "mode-without-policy"
	envWithoutOverride = "env-without-overrides"
)

func propertySources(t *testing.T) []propSource {
	out := []propSource{{name: "examples-bundle", load: func(t testing.TB) *policy.Bundle {
		b, err := policy.LoadDir(filepath.Join("..", "examples", "bundle"))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}}}
	dir := os.Getenv("TOOLGATE_CONFORMANCE_DIR")
	if dir == "" {
		dir = filepath.Join("..", "..", "shared", "conformance")
	}
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no conformance files in %s (set TOOLGATE_CONFORMANCE_DIR): %v", dir, err)
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var cf struct {
			Bundle yaml.Node `yaml:"bundle"`
		}
		if err := yaml.Unmarshal(data, &cf); err != nil {
			t.Fatalf("decode %s: %v", f, err)
		}
		out = append(out, propSource{name: strings.TrimSuffix(filepath.Base(f), ".yaml"), load: func(t testing.TB) *policy.Bundle {
			b := &policy.Bundle{}
			b.AddNode(f, &cf.Bundle)
			if len(b.Principals) == 0 {
				// The conformance default, as in TestConformance.
				b.Principals = append(b.Principals, &policy.Principal{PrincipalID: "system:test",
					Grants: []policy.Grant{{Resource: "tool", Action: "invoke", Scope: policy.Scope{All: true}}}})
			}
			return b
		}})
	}
	return out
}

// propCtx is one invocation context.
type propCtx struct {
	Agent, Mode, Instance, Env, Principal string
}

func (c propCtx) String() string {
	return fmt.Sprintf("agent=%s mode=%s instance=%s env=%s principal=%s", c.Agent, c.Mode, c.Instance, c.Env, c.Principal)
}

func (c propCtx) resolveContext() authz.Context {
	return authz.Context{AgentID: c.Agent, DeploymentMode: c.Mode, InstanceID: c.Instance, Environment: c.Env, Principal: c.Principal}
}

func (c propCtx) call(tool string) toolgate.Call {
	return toolgate.Call{AgentID: c.Agent, DeploymentMode: c.Mode, InstanceID: c.Instance, Environment: c.Env, Principal: c.Principal, Tool: tool}
}

// contextsOf lists every context the properties are checked in.
func contextsOf(b *policy.Bundle) []propCtx {
	instances := []string{""}
	envSet := map[string]bool{}
	for _, in := range b.Instances {
		instances = append(instances, in.InstanceID)
		for env := range in.EnvironmentOverrides {
			envSet[env] = true
		}
	}
	envs := append([]string{""}, sortedKeys(envSet)...)
	envs = append(envs, envWithoutOverride)
	principals := []string{""}
	for _, p := range b.Principals {
		principals = append(principals, p.PrincipalID)
	}
	var out []propCtx
	for _, a := range b.Agents {
		modeSet := map[string]bool{}
		for _, rp := range b.RuntimePolicies {
			if rp.AgentID == a.AgentID {
				modeSet[rp.DeploymentMode] = true
			}
		}
		modes := append(sortedKeys(modeSet), modeWithoutPolicy)
		for _, m := range modes {
			for _, in := range instances {
				for _, env := range envs {
					for _, p := range principals {
						out = append(out, propCtx{a.AgentID, m, in, env, p})
					}
				}
			}
		}
	}
	return out
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// ceilings maps each agent to its ceiling's tool ids as written.
func ceilings(b *policy.Bundle) map[string][]string {
	out := map[string][]string{}
	for _, a := range b.Agents {
		for _, p := range a.ToolPermissions {
			out[a.AgentID] = append(out[a.AgentID], p.ToolID)
		}
	}
	return out
}

// spellings returns the names a model may call a tool by.
func spellings(id string) []string {
	fn := toolid.FunctionName(id)
	return []string{id, fn, strings.ReplaceAll(fn, "_", ".")}
}

func TestPropertyDisclosureMatchesEnforcement(t *testing.T) {
	for _, src := range propertySources(t) {
		t.Run(src.name, func(t *testing.T) {
			t.Parallel()
			b := src.load(t)
			if rep := b.Validate(nil); !rep.OK() {
				t.Skipf("bundle is invalid on purpose: %v", rep.Errors)
			}
			snap := compileBundle(t, b, nil)
			ceil := ceilings(b)
			ctxs := contextsOf(b)
			if len(ctxs) == 0 {
				t.Skip("no agents")
			}
			for _, c := range ctxs {
				checkDisclosure(t, snap, ceil[c.Agent], c)
			}
		})
	}
}

func checkDisclosure(t *testing.T, snap *authz.Snapshot, ceiling []string, c propCtx) {
	t.Helper()
	res := snap.Resolve(c.resolveContext())
	active, disclosed := set(res.ActiveToolSet), set(res.Disclosed)
	removed := map[string]authz.Removal{}
	for _, rm := range res.Removed {
		removed[rm.ToolID] = rm
	}
	status := map[string]authz.ToolStatus{}
	for _, st := range res.Tools {
		status[st.ToolID] = st
	}
	for _, id := range res.Disclosed {
		if !active[id] {
			t.Errorf("%s: %s is disclosed but not active", c, id)
		}
		if !slices.Contains(ceiling, id) {
			t.Errorf("%s: %s is disclosed but not in the ceiling", c, id)
		}
	}
	for _, id := range ceiling {
		var first toolgate.Decision
		for i, name := range spellings(id) {
			call := c.call(name)
			call.ToolLevel = true
			d := snap.Decide(&call)
			if i == 0 {
				first = d
				continue
			}
			if outcomeOf(d) != outcomeOf(first) {
				t.Errorf("%s: %q decides %+v but %q decides %+v", c, name, outcomeOf(d), id, outcomeOf(first))
			}
		}
		d := first
		call := c.call(id)
		call.ToolLevel = true
		if ed, _ := snap.Explain(&call); ed != d {
			t.Errorf("%s %s: Explain decides %+v, Decide %+v", c, id, outcomeOf(ed), outcomeOf(d))
		}
		if disclosed[id] {
			// Without a principal, Resolve leaves the grant layer out while
			// Decide refuses an undeclared principal there.
			grantOnly := c.Principal == "" && d.Code == toolgate.CodeRBACToolInvoke && d.Layer == toolgate.LayerGrant
			if d.Verdict == toolgate.Deny && !grantOnly {
				t.Errorf("%s: %s is disclosed but its tool-level decision denies: %s: %s", c, id, d.Code, d.Reason)
			}
			if c.Principal != "" && (d.Verdict == toolgate.RequireApproval) != status[id].RequiresApproval {
				t.Errorf("%s: %s: requires_approval %v in Resolve, verdict %s in Decide", c, id, status[id].RequiresApproval, d.Verdict)
			}
			continue
		}
		if d.Verdict != toolgate.Deny {
			t.Errorf("%s: %s is not disclosed but its tool-level decision is %s (%s)", c, id, d.Verdict, d.Reason)
		}
		rm, ok := removed[id]
		if !ok {
			if _, compiled := status[id]; compiled {
				t.Errorf("%s: %s is neither disclosed nor removed", c, id)
			}
			continue
		}
		if (rm.Code != d.Code || rm.Layer != d.Layer) && !(c.Principal == "" && d.Code == toolgate.CodeRBACToolInvoke) {
			t.Errorf("%s: %s removed by %s/%s, but Decide denies with %s/%s", c, id, rm.Layer, rm.Code, d.Layer, d.Code)
		}
	}
}

func set(xs []string) map[string]bool {
	m := make(map[string]bool, len(xs))
	for _, x := range xs {
		m[x] = true
	}
	return m
}

// callVariant is one way to call every tool in a context.
type callVariant struct {
	name      string
	toolLevel bool
	args      map[string]any
	resources []toolgate.Resource
}

// variantsOf lists the calls made per tool: tool level, a few argument
// sets, and one call per resource the bundle grants on.
func variantsOf(b *policy.Bundle) []callVariant {
	small := map[string]any{"amount": 10, "limit": 10, "n": 1}
	out := []callVariant{
		{name: "tool-level", toolLevel: true},
		{name: "no-args", args: map[string]any{}},
		{name: "small", args: small},
		{name: "large", args: map[string]any{"amount": 20000, "limit": 5000, "n": 50}},
	}
	seen := map[toolgate.Resource]bool{}
	var grants []policy.Grant
	for _, p := range b.Principals {
		grants = append(grants, p.Grants...)
	}
	for _, r := range b.Roles {
		grants = append(grants, r.Grants...)
	}
	for _, g := range grants {
		if g.Resource == "tool" || g.Scope.Name == "" {
			continue
		}
		r := toolgate.Resource{Type: g.Resource, Name: g.Scope.Name + ".x", Action: g.Action}
		if seen[r] {
			continue
		}
		seen[r] = true
		out = append(out, callVariant{name: "resource " + r.Type + ":" + r.Action + "=" + r.Name, args: small, resources: []toolgate.Resource{r}})
	}
	return out
}

// plan fixes the order of the calls an observation makes, so two
// observations compare index by index.
type plan struct {
	ctxs  []propCtx
	calls []planCall
}

type planCall struct {
	ctx     int
	call    toolgate.Call
	variant string
}

func (c planCall) String(p *plan) string {
	return fmt.Sprintf("%s tool=%s call=%s", p.ctxs[c.ctx], c.call.Tool, c.variant)
}

func planOf(b *policy.Bundle) *plan {
	p := &plan{ctxs: contextsOf(b)}
	ceil, variants := ceilings(b), variantsOf(b)
	for i, c := range p.ctxs {
		for _, id := range ceil[c.Agent] {
			for _, v := range variants {
				call := c.call(id)
				call.ToolLevel, call.Args, call.Resources = v.toolLevel, v.args, v.resources
				p.calls = append(p.calls, planCall{i, call, v.name})
			}
		}
	}
	return p
}

// observation is everything a snapshot answers over a plan.
type observation struct {
	decisions []toolgate.Decision // per plan call
	active    [][]string          // per context: the active tool set
	disclosed [][]string          // per context: the disclosed tools
}

func observe(snap *authz.Snapshot, p *plan) observation {
	o := observation{decisions: make([]toolgate.Decision, len(p.calls)),
		active: make([][]string, len(p.ctxs)), disclosed: make([][]string, len(p.ctxs))}
	for i, c := range p.ctxs {
		res := snap.Resolve(c.resolveContext())
		o.active[i], o.disclosed[i] = res.ActiveToolSet, res.Disclosed
	}
	for i := range p.calls {
		call := p.calls[i].call
		o.decisions[i] = snap.Decide(&call)
	}
	return o
}

// mutation narrows a freshly loaded bundle.
type mutation struct {
	name  string
	apply func(b *policy.Bundle)
}

// narrowings lists every one-step narrowing of b (by index, so it applies
// to any fresh copy of the same bundle).
func narrowings(b *policy.Bundle) []mutation {
	var out []mutation
	ceil := ceilings(b)
	for i, rp := range b.RuntimePolicies {
		p := rp.ToolAuthorizationPolicy
		where := fmt.Sprintf("RuntimePolicy %s/%s", rp.AgentID, rp.DeploymentMode)
		switch p.ActiveToolSet {
		case "all", "restricted":
			for _, id := range ceil[rp.AgentID] {
				if slices.Contains(p.ToolSuspensions, id) {
					continue
				}
				out = append(out, mutation{where + ": suspend " + id, func(b *policy.Bundle) {
					tp := &b.RuntimePolicies[i].ToolAuthorizationPolicy
					tp.ActiveToolSet = "restricted"
					tp.ToolSuspensions = append(slices.Clone(tp.ToolSuspensions), id)
				}})
			}
		case "declared":
			for j, id := range p.ToolGrants {
				out = append(out, mutation{where + ": ungrant " + id, func(b *policy.Bundle) {
					tp := &b.RuntimePolicies[i].ToolAuthorizationPolicy
					tp.ToolGrants = slices.Delete(slices.Clone(tp.ToolGrants), j, j+1)
				}})
			}
		}
	}
	var tools []string
	toolSet := map[string]bool{}
	for _, a := range b.Agents {
		for _, id := range ceil[a.AgentID] {
			if !toolSet[id] {
				toolSet[id] = true
				tools = append(tools, id)
			}
		}
	}
	for i, in := range b.Instances {
		envs := map[string]bool{envWithoutOverride: true}
		for env := range in.EnvironmentOverrides {
			envs[env] = true
		}
		for _, env := range sortedKeys(envs) {
			for _, id := range tools {
				if slices.Contains(in.EnvironmentOverrides[env].ToolSuspensions, id) {
					continue
				}
				out = append(out, mutation{fmt.Sprintf("Instance %s/%s: suspend %s", in.InstanceID, env, id), func(b *policy.Bundle) {
					in := b.Instances[i]
					overrides := map[string]policy.EnvironmentOverride{}
					for k, v := range in.EnvironmentOverrides {
						overrides[k] = v
					}
					o := overrides[env]
					o.ToolSuspensions = append(slices.Clone(o.ToolSuspensions), id)
					overrides[env] = o
					in.EnvironmentOverrides = overrides
				}})
			}
		}
	}
	for i, p := range b.Principals {
		for j, g := range p.Grants {
			out = append(out, mutation{fmt.Sprintf("Principal %s: drop grant %s:%s on %s", p.PrincipalID, g.Resource, g.Action, g.Scope), func(b *policy.Bundle) {
				p := b.Principals[i]
				p.Grants = slices.Delete(slices.Clone(p.Grants), j, j+1)
			}})
		}
	}
	for i, r := range b.Roles {
		for j, g := range r.Grants {
			out = append(out, mutation{fmt.Sprintf("Role %s: drop grant %s:%s on %s", r.RoleID, g.Resource, g.Action, g.Scope), func(b *policy.Bundle) {
				r := b.Roles[i]
				r.Grants = slices.Delete(slices.Clone(r.Grants), j, j+1)
			}})
		}
	}
	return out
}

func TestPropertyNarrowingNeverAdds(t *testing.T) {
	for _, src := range propertySources(t) {
		t.Run(src.name, func(t *testing.T) {
			t.Parallel()
			b := src.load(t)
			if rep := b.Validate(nil); !rep.OK() {
				t.Skipf("bundle is invalid on purpose: %v", rep.Errors)
			}
			snap := compileBundle(t, b, nil)
			p := planOf(b)
			before := observe(snap, p)
			muts := narrowings(b)
			if len(muts) == 0 {
				t.Skip("nothing to narrow")
			}
			for _, m := range muts {
				nb := src.load(t)
				m.apply(nb)
				nsnap, rep, err := authz.Compile(nb, nil)
				if err != nil {
					t.Errorf("%s: the narrowed bundle does not compile: %v %v", m.name, err, rep.Errors)
					continue
				}
				compareNarrowing(t, m.name, p, before, observe(nsnap, p))
			}
		})
	}
}

// violations lists every way after is wider than before.
func violations(p *plan, before, after observation) []string {
	var out []string
	for i, was := range before.decisions {
		if now := after.decisions[i]; rank(now.Verdict) > rank(was.Verdict) {
			out = append(out, fmt.Sprintf("%s became more permissive: %s (%s) -> %s (%s: %s)",
				p.calls[i].String(p), was.Verdict, was.Code, now.Verdict, now.Code, now.Reason))
		}
	}
	for i, c := range p.ctxs {
		if extra := missingFrom(before.active[i], after.active[i]); len(extra) > 0 {
			out = append(out, fmt.Sprintf("%s: active tool set grew by %v", c, extra))
		}
		if extra := missingFrom(before.disclosed[i], after.disclosed[i]); len(extra) > 0 {
			out = append(out, fmt.Sprintf("%s: disclosed set grew by %v", c, extra))
		}
	}
	return out
}

func compareNarrowing(t *testing.T, mutation string, p *plan, before, after observation) {
	t.Helper()
	const maxReports = 5
	v := violations(p, before, after)
	for i, s := range v {
		if i == maxReports {
			t.Errorf("%s: %d more violations", mutation, len(v)-maxReports)
			break
		}
		t.Errorf("%s: %s", mutation, s)
	}
}

// missingFrom returns the ids in got that are not in base.
func missingFrom(base, got []string) []string {
	b := set(base)
	var out []string
	for _, id := range got {
		if !b[id] {
			out = append(out, id)
		}
	}
	return out
}

// TestPropertyHarness checks the harness itself: the narrowing check must
// catch a change that widens, so a passing property means something.
func TestPropertyHarness(t *testing.T) {
	src := propertySources(t)[0]
	b := src.load(t)
	snap := compileBundle(t, b, nil)
	p := planOf(b)
	before := observe(snap, p)

	wide := src.load(t)
	for _, rp := range wide.RuntimePolicies {
		tp := &rp.ToolAuthorizationPolicy
		if tp.ActiveToolSet == "restricted" && len(tp.ToolSuspensions) > 0 {
			tp.ToolSuspensions = nil // widening: lift every suspension
		}
	}
	after := observe(compileBundle(t, wide, nil), p)
	if v := violations(p, before, after); len(v) == 0 {
		t.Error("the narrowing check did not notice that lifting suspensions widens the bundle")
	}
	if diff := cmp.Diff(len(before.decisions), len(after.decisions)); diff != "" {
		t.Errorf("observations differ in size (-before +after):\n%s", diff)
	}
}
