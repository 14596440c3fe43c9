package policy

import (
	"fmt"
	"regexp"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/toolgate/toolgate/toolid"
)

// Upstream is an MCP server the gateway fronts (kind: Upstream). Its tools
// join the catalog as tool:<name>-<mapped tool name>.
type Upstream struct {
	Pos `yaml:"-"`
	// Name is the provider part of its tools' ids: lowercase [a-z0-9]+.
	Name string `yaml:"name"`
	// Transport is stdio or streamable-http.
	Transport string `yaml:"transport"`
	// Command, Args, Env and Dir start a stdio upstream. It gets PATH and
	// HOME plus Env, never the gateway's own environment. Relative Dir and
	// relative paths in Args are resolved against the bundle folder.
	Command string            `yaml:"command"`
	Args    []string          `yaml:"args"`
	Env     map[string]Secret `yaml:"env"`
	Dir     string            `yaml:"dir"`
	// URL and Headers reach a streamable-http upstream.
	URL     string            `yaml:"url"`
	Headers map[string]Secret `yaml:"headers"`
	// ToolPrefix starts the name the model sees for each of its tools;
	// nil means Name + "_"; it may be empty.
	ToolPrefix *string `yaml:"tool_prefix"`
	// CallTimeout bounds one call (default 60s); ConnectTimeout one connect.
	CallTimeout    Duration `yaml:"call_timeout"`
	ConnectTimeout Duration `yaml:"connect_timeout"`
}

// Prefix returns the model-visible name prefix of the upstream's tools.
func (u *Upstream) Prefix() string {
	if u.ToolPrefix != nil {
		return *u.ToolPrefix
	}
	return u.Name + "_"
}

// Secret is a value written literally, or {from_env: VAR}, or
// {from_file: PATH}. Values from the environment or a file never appear in
// the bundle, in logs or in errors.
type Secret struct {
	Value    string
	FromEnv  string
	FromFile string
}

// UnmarshalYAML accepts a string or {from_env} / {from_file}.
func (s *Secret) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode {
		*s = Secret{Value: n.Value}
		return nil
	}
	var m struct {
		FromEnv  string `yaml:"from_env"`
		FromFile string `yaml:"from_file"`
	}
	if n.Kind != yaml.MappingNode {
		return fmt.Errorf("line %d: want a string, {from_env: VAR} or {from_file: PATH}", n.Line)
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if k := n.Content[i].Value; k != "from_env" && k != "from_file" {
			return fmt.Errorf("line %d: unknown field %q (want from_env or from_file)", n.Content[i].Line, k)
		}
	}
	if err := n.Decode(&m); err != nil {
		return err
	}
	if (m.FromEnv == "") == (m.FromFile == "") {
		return fmt.Errorf("line %d: give exactly one of from_env or from_file", n.Line)
	}
	*s = Secret{FromEnv: m.FromEnv, FromFile: m.FromFile}
	return nil
}

// Credential binds an API key to an identity (kind: Credential). Only the
// key's SHA-256 is stored; the client sends the key as a bearer token.
type Credential struct {
	Pos `yaml:"-"`
	// Name labels the credential in logs and the audit log.
	Name string `yaml:"name"`
	// APIKeySHA256 is the lowercase hex SHA-256 of the key.
	APIKeySHA256 string `yaml:"api_key_sha256"`
	Identity     `yaml:",inline"`
}

// Identity is who a call runs as and where.
type Identity struct {
	Principal      string `yaml:"principal"`
	AgentID        string `yaml:"agent_id"`
	InstanceID     string `yaml:"instance_id"`
	Environment    string `yaml:"environment"`
	DeploymentMode string `yaml:"deployment_mode"`
}

var (
	upstreamName = regexp.MustCompile(`^[a-z0-9]+$`)
	sha256Hex    = regexp.MustCompile(`^[0-9a-f]{64}$`)
)

func (v *validator) upstreams() {
	seen := map[string]*Upstream{}
	var prefixed []*Upstream // in order, for the nesting check
	for _, u := range v.b.Upstreams {
		if !upstreamName.MatchString(u.Name) {
			v.r.Errorf(u.Pos, "Upstream name %q must be lowercase [a-z0-9]+ (it is the provider part of its tools' ids)", u.Name)
			continue
		}
		if prev, dup := seen[u.Name]; dup {
			v.r.Errorf(u.Pos, "duplicate Upstream %s (first declared at %s)", u.Name, prev.Pos.At())
			continue
		}
		seen[u.Name] = u
		for _, prev := range prefixed {
			switch p, q := u.Prefix(), prev.Prefix(); {
			case p == q:
				v.r.Errorf(u.Pos, "Upstream %s: tool_prefix %q is also upstream %s's; the names the model sees would clash", u.Name, p, prev.Name)
			case p == "" || q == "":
				// An empty prefix starts every other: any of its tools may
				// be named like one of the other upstream's (an upstream
				// with an empty prefix could shadow another's tools).
				empty, other := u, prev
				if q == "" {
					empty, other = prev, u
				}
				v.r.Errorf(u.Pos, "Upstream %s: its tool_prefix is empty beside upstream %s, so any of its tool names may start with %s's %q and read as one of %s's; give it a prefix of its own (an empty prefix is for a gateway with one upstream)",
					empty.Name, other.Name, other.Name, other.Prefix(), other.Name)
			case nestedPrefix(p, q):
				// fs_ and fs_x_: fs_x_read is both fs's x_read and
				// fs_x's read, so a name of one can reach the other.
				v.r.Errorf(u.Pos, "Upstream %s: tool_prefix %q and upstream %s's %q start one another, so a name the model sees could belong to either; choose prefixes neither of which starts the other",
					u.Name, p, prev.Name, q)
			}
		}
		prefixed = append(prefixed, u)
		for _, m := range []struct {
			field string
			vals  map[string]Secret
		}{{"env", u.Env}, {"headers", u.Headers}} {
			for _, k := range sortedKeys(m.vals) {
				if m.vals[k] == (Secret{}) {
					v.r.Errorf(u.Pos, "Upstream %s: %s %s is empty; give a value, {from_env: VAR} or {from_file: PATH}, or remove it", u.Name, m.field, k)
				}
			}
		}
		switch u.Transport {
		case "stdio":
			if u.Command == "" {
				v.r.Errorf(u.Pos, "Upstream %s: transport stdio needs command", u.Name)
			}
			if u.URL != "" || len(u.Headers) > 0 {
				v.r.Errorf(u.Pos, "Upstream %s: url and headers are for streamable-http, not stdio", u.Name)
			}
		case "streamable-http":
			if u.URL == "" {
				v.r.Errorf(u.Pos, "Upstream %s: transport streamable-http needs url", u.Name)
			}
			if u.Command != "" || len(u.Args) > 0 || len(u.Env) > 0 {
				v.r.Errorf(u.Pos, "Upstream %s: command, args and env are for stdio, not streamable-http", u.Name)
			}
		default:
			v.r.Errorf(u.Pos, "Upstream %s: transport %q must be stdio or streamable-http", u.Name, u.Transport)
		}
	}
}

// sharedProviders warns about a Tool that runs elsewhere (built in, over
// HTTP, another agent or another server) under the provider part of a
// declared Upstream: the upstream announcing a tool of that name would
// give it the same id, so two different tools would share one.
func (v *validator) sharedProviders() {
	ups := map[string]bool{}
	for _, u := range v.b.Upstreams {
		ups[u.Name] = true
	}
	for _, t := range v.b.Tools {
		id := ToolIDOf(t)
		prov := provider(id)
		if !ups[prov] || id == "" {
			continue
		}
		var runs string
		switch {
		case t.Source.Builtin != "":
			runs = "is the built-in tool " + t.Source.Builtin
		case t.Source.HTTP != "":
			runs = "runs over HTTP"
		case t.A2AAgent != "":
			runs = "invokes agent " + t.A2AAgent
		case t.Source.MCPServer != "" && t.Source.MCPServer != prov:
			runs = "belongs to MCP server " + t.Source.MCPServer
		case t.ControlFlow:
			runs = "is a control-flow tool"
		default:
			continue // it refines the upstream's own tool
		}
		v.r.Warnf(t.Pos, "Tool %s %s, but its provider part %s is also an Upstream's name: a tool upstream %s announces as %q would have the same id; give one of them another name",
			id, runs, prov, prov, strings.ReplaceAll(strings.TrimPrefix(id, "tool:"+prov+"-"), "-", "_"))
	}
}

// prefixShadows warns about an upstream whose tool_prefix lets a tool it
// announces take the name of a tool the bundle declares elsewhere (a
// built-in, an HTTP or A2A tool, another upstream's tool): prefix "sql_"
// and an announced "query" make sql_query, the model-facing name of
// tool:sql-query. Such a tool is refused when it is announced
// (authz.CheckAnnounced); the warning says so before. A tool under the
// upstream's own provider part is left to sharedProviders.
//
// An upstream's tool_prefix that spells another upstream's provider part
// (hub with tool_prefix "gh_" beside upstream gh) is an error: its tools'
// names would read as that upstream's tool ids (hub's "create" as gh_create,
// tool:gh-create), in calls, in grant and approval scopes that name a
// tool, whether or not gh announces such a tool.
func (v *validator) prefixShadows() {
	for _, u := range v.b.Upstreams {
		p := u.Prefix()
		sep := strings.NewReplacer("_", "-", ".", "-").Replace(p)
		for _, w := range v.b.Upstreams {
			ns := w.Name + "-"
			if w == u || w.Name == u.Name || p == "" || w.Prefix() == "" || nestedPrefix(p, w.Prefix()) ||
				!(strings.HasPrefix(sep, ns) || (len(sep) < len(ns)-1 && strings.HasPrefix(ns, sep))) {
				continue // the same upstream, or reported by upstreams as a clash of prefixes
			}
			v.r.Errorf(u.Pos, "Upstream %s: tool_prefix %q spells the provider part of upstream %s, so the names of its tools would read as %s's tool ids (tool:%s...); choose a tool_prefix that does not start with %q, %q or %q",
				u.Name, p, w.Name, w.Name, ns, w.Name+"_", w.Name+".", w.Name+"-")
		}
		for _, t := range v.b.Tools {
			id := ToolIDOf(t)
			body, ok := strings.CutPrefix(id, toolid.Prefix)
			if !ok || t.Source.MCPServer == u.Name || provider(id) == u.Name {
				continue
			}
			rest, ok := strings.CutPrefix(body, sep)
			if !ok || rest == "" {
				continue
			}
			rest = strings.ReplaceAll(rest, "-", "_")
			if _, err := toolid.Map(rest); err != nil {
				continue // no name an upstream may announce (mcptool.Announced)
			}
			if mapped, err := toolid.Map(p + rest); err != nil || mapped != id {
				continue
			}
			v.r.Warnf(u.Pos, "Upstream %s: with tool_prefix %q, a tool it announces as %q would reach the model as %s, a name of Tool %s; such a tool is refused when announced: choose a tool_prefix no declared tool's name starts with",
				u.Name, p, rest, p+rest, id)
		}
	}
}

func (v *validator) credentials() {
	seen := map[string]*Credential{}
	for _, c := range v.b.Credentials {
		label := c.Name
		if label == "" {
			label = c.Principal
		}
		if !sha256Hex.MatchString(c.APIKeySHA256) {
			v.r.Errorf(c.Pos, "Credential %s: api_key_sha256 must be 64 lowercase hex digits (sha256sum of the key)", label)
		} else if prev, dup := seen[c.APIKeySHA256]; dup {
			v.r.Errorf(c.Pos, "Credential %s: the same key is already bound at %s", label, prev.Pos.At())
		}
		seen[c.APIKeySHA256] = c
		v.checkIdentity(c.Pos, "Credential "+label, c.Identity)
	}
	for _, s := range v.b.Settings {
		if s.Anonymous != nil {
			v.checkIdentity(s.Pos, "Settings.anonymous", *s.Anonymous)
		}
	}
}

// checkIdentity checks the identity a credential (or Settings.anonymous)
// binds. Names nothing declares make every call fail closed (an undeclared
// agent or instance: an error, as the credential can do nothing; an
// undeclared principal: a warning, as before); an environment that none of
// the instance's environment_overrides names is a warning, because the
// suspensions meant for it then do not apply.
func (v *validator) checkIdentity(pos Pos, where string, id Identity) {
	if id.Principal == "" || id.AgentID == "" {
		v.r.Errorf(pos, "%s: principal and agent_id are required", where)
		return
	}
	if v.agents_[id.AgentID] == nil {
		v.r.Errorf(pos, "%s: agent %s is not declared%s", where, id.AgentID, didYouMean(id.AgentID, v.refs.agents))
	}
	if v.principal_[id.Principal] == nil {
		v.r.Warnf(pos, "%s: principal %s is not declared, so every call will be denied at the grant layer%s", where, id.Principal, didYouMean(id.Principal, sortedKeys(v.principal_)))
	}
	if id.InstanceID != "" {
		in := v.refs.instances[id.InstanceID]
		switch {
		case in == nil:
			v.r.Errorf(pos, "%s: instance %s is not a declared Instance, so every call will be denied at the instance layer%s",
				where, id.InstanceID, didYouMean(id.InstanceID, sortedKeys(v.refs.instances)))
		case id.Environment != "" && len(in.EnvironmentOverrides) > 0 && in.EnvironmentOverrides[id.Environment].ToolSuspensions == nil:
			if _, ok := in.EnvironmentOverrides[id.Environment]; !ok {
				v.r.Warnf(pos, "%s: environment %s has no environment_overrides in instance %s, so none of its suspensions apply%s",
					where, id.Environment, in.InstanceID, didYouMean(id.Environment, sortedKeys(in.EnvironmentOverrides)))
			}
		}
	}
	if a := v.agents_[id.AgentID]; a != nil && len(a.ToolPermissions) > 0 {
		mode := id.DeploymentMode
		if mode == "" && len(v.b.Settings) > 0 {
			mode = v.b.Settings[0].DefaultDeploymentMode
		}
		if mode == "" {
			mode = "production"
		}
		if !v.hasMode(a.AgentID, mode) {
			v.r.Warnf(pos, "%s: agent %s has no RuntimePolicy for deployment_mode %s, so every call will be denied", where, a.AgentID, mode)
		}
	}
}
