package identity

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/toolgate/toolgate"
	"github.com/toolgate/toolgate/cond"
	"github.com/toolgate/toolgate/policy"
	"github.com/toolgate/toolgate/toolid"
)

// Grant is a grant as it travels in a delegation token and in the body of
// POST /v1/delegations:
//
//	{"resource": "tool", "action": "invoke", "scope": "all" | {"tool": NAME} | {"name": NAME}, "when": CEL}
//	{"resource": "mcp_resource", "action": "read", "scope": {"upstream": U} | {"upstream": U, "uri": URI}}
//	{"resource": "prompt", "action": "get", "scope": {"upstream": U} | {"upstream": U, "prompt": NAME}}
//
// It also decodes from the CLI's string form "resource:action:scope" (see
// ParseGrant).
type Grant struct {
	Resource string
	Action   string
	Scope    policy.Scope
	// When is an optional CEL condition, as in a bundle grant.
	When string
}

// Policy returns the grant as a bundle grant.
func (g Grant) Policy() policy.Grant {
	return policy.Grant{Resource: g.Resource, Action: g.Action, Scope: g.Scope, When: g.When}
}

// GrantOf converts a bundle grant.
func GrantOf(p policy.Grant) Grant {
	return Grant{Resource: p.Resource, Action: p.Action, Scope: p.Scope, When: p.When}
}

// String formats the grant as "resource:action:scope" (with " when EXPR"
// when conditional).
func (g Grant) String() string {
	s := g.Resource + ":" + g.Action + ":"
	switch {
	case g.Scope.All:
		s += "all"
	case g.Scope.Tool != "":
		s += "tool=" + g.Scope.Tool
	case g.Scope.Upstream != "":
		s += "upstream=" + g.Scope.Upstream
		if g.Scope.URI != "" {
			s += ",uri=" + g.Scope.URI
		}
		if g.Scope.Prompt != "" {
			s += ",prompt=" + g.Scope.Prompt
		}
	default:
		s += "name=" + g.Scope.Name
	}
	if g.When != "" {
		s += " when " + g.When
	}
	return s
}

type grantJSON struct {
	Resource string          `json:"resource"`
	Action   string          `json:"action"`
	Scope    json.RawMessage `json:"scope"`
	When     string          `json:"when,omitempty"`
}

// MarshalJSON encodes the object form.
func (g Grant) MarshalJSON() ([]byte, error) {
	var scope any = "all"
	switch {
	case g.Scope.Tool != "":
		scope = map[string]string{"tool": g.Scope.Tool}
	case g.Scope.Name != "":
		scope = map[string]string{"name": g.Scope.Name}
	case g.Scope.Upstream != "":
		m := map[string]string{"upstream": g.Scope.Upstream}
		if g.Scope.URI != "" {
			m["uri"] = g.Scope.URI
		}
		if g.Scope.Prompt != "" {
			m["prompt"] = g.Scope.Prompt
		}
		scope = m
	case !g.Scope.All:
		return nil, fmt.Errorf("grant %s:%s has no scope", g.Resource, g.Action)
	}
	raw, err := json.Marshal(scope)
	if err != nil {
		return nil, err
	}
	return json.Marshal(grantJSON{Resource: g.Resource, Action: g.Action, Scope: raw, When: g.When})
}

// UnmarshalJSON decodes the object form (unknown fields refused) or the
// string form "resource:action:scope".
func (g *Grant) UnmarshalJSON(b []byte) error {
	if t := bytes.TrimSpace(b); len(t) > 0 && t[0] == '"' {
		var s string
		if err := json.Unmarshal(t, &s); err != nil {
			return err
		}
		p, err := ParseGrant(s)
		if err != nil {
			return err
		}
		*g = GrantOf(p)
		return nil
	}
	var j grantJSON
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&j); err != nil {
		return fmt.Errorf("grant: %w", err)
	}
	out := Grant{Resource: j.Resource, Action: j.Action, When: j.When}
	st := bytes.TrimSpace(j.Scope)
	switch {
	case len(st) == 0 || string(st) == "null":
		return fmt.Errorf("grant %s:%s: scope is required (\"all\", {\"tool\": NAME} or {\"name\": NAME})", j.Resource, j.Action)
	case st[0] == '"':
		var s string
		if err := json.Unmarshal(st, &s); err != nil || (s != "all" && s != "*") {
			return fmt.Errorf("grant %s:%s: scope %s: want \"all\", {\"tool\": NAME} or {\"name\": NAME}", j.Resource, j.Action, st)
		}
		out.Scope = policy.Scope{All: true}
	default:
		var m struct {
			Tool     string `json:"tool"`
			Name     string `json:"name"`
			Upstream string `json:"upstream"`
			URI      string `json:"uri"`
			Prompt   string `json:"prompt"`
		}
		d := json.NewDecoder(bytes.NewReader(st))
		d.DisallowUnknownFields()
		err := d.Decode(&m)
		if err == nil {
			err = toolgate.CheckKeys(st)
		}
		kinds := 0
		for _, set := range []bool{m.Tool != "", m.Name != "", m.Upstream != ""} {
			if set {
				kinds++
			}
		}
		if err != nil || kinds != 1 || (m.Upstream == "" && (m.URI != "" || m.Prompt != "")) || (m.URI != "" && m.Prompt != "") {
			return fmt.Errorf("grant %s:%s: scope %s: give exactly one of tool, name or upstream (with uri or prompt)", j.Resource, j.Action, st)
		}
		out.Scope = policy.Scope{Tool: m.Tool, Name: m.Name, Upstream: m.Upstream, URI: m.URI, Prompt: m.Prompt}
	}
	*g = out
	return nil
}

// ParseGrant parses the CLI form "resource:action:scope". scope is "all",
// "tool=NAME", "name=NAME", or a bare NAME, which is a tool for the
// resources tool and approval (their scopes name tools) and a resource
// name otherwise. Tool ids contain a colon, so only the first two colons
// split: "tool:invoke:tool:fs-read" hands tool:invoke on tool:fs-read.
//
//	tool:invoke:all
//	tool:invoke:fs_read_text_file
//	bifrost_query:read:vala.datasets
func ParseGrant(s string) (policy.Grant, error) {
	parts := strings.SplitN(strings.TrimSpace(s), ":", 3)
	if len(parts) != 3 || parts[0] == "" || parts[1] == "" || parts[2] == "" {
		return policy.Grant{}, fmt.Errorf("grant %q: want resource:action:scope (tool:invoke:all, tool:invoke:NAME, bifrost_query:read:vala.datasets)", s)
	}
	g := policy.Grant{Resource: parts[0], Action: parts[1]}
	sc := parts[2]
	switch {
	case sc == "all" || sc == "*":
		g.Scope = policy.Scope{All: true}
	case strings.HasPrefix(sc, "tool="):
		g.Scope = policy.Scope{Tool: strings.TrimPrefix(sc, "tool=")}
	case strings.HasPrefix(sc, "name="):
		g.Scope = policy.Scope{Name: strings.TrimPrefix(sc, "name=")}
	case strings.HasPrefix(sc, "upstream="):
		// upstream=U, upstream=U,uri=URI or upstream=U,prompt=NAME: an
		// upstream name holds no comma, and the uri is the rest as written
		// (commas included).
		up, rest, _ := strings.Cut(strings.TrimPrefix(sc, "upstream="), ",")
		g.Scope = policy.Scope{Upstream: up}
		switch {
		case rest == "":
		case strings.HasPrefix(rest, "uri="):
			g.Scope.URI = strings.TrimPrefix(rest, "uri=")
		case strings.HasPrefix(rest, "prompt="):
			g.Scope.Prompt = strings.TrimPrefix(rest, "prompt=")
		default:
			return policy.Grant{}, fmt.Errorf("grant %q: after upstream=%s, want ,uri=URI or ,prompt=NAME", s, up)
		}
	case g.Resource == "tool" || g.Resource == "approval":
		g.Scope = policy.Scope{Tool: sc}
	default:
		g.Scope = policy.Scope{Name: sc}
	}
	if err := checkGrant(g, nil); err != nil {
		return policy.Grant{}, fmt.Errorf("grant %q: %w", s, err)
	}
	return g, nil
}

// checkGrant checks one grant's shape (as the bundle validator does) and,
// with env, compiles its condition.
func checkGrant(g policy.Grant, env *cond.Env) error {
	switch {
	case g.Resource == "" || g.Action == "":
		return fmt.Errorf("resource and action are required")
	case strings.ContainsAny(g.Resource+g.Action, "* \t\n"):
		return fmt.Errorf("resource and action are exact names (a wildcard is written scope all)")
	case !g.Scope.All && g.Scope.Tool == "" && g.Scope.Name == "" && g.Scope.Upstream == "":
		return fmt.Errorf("scope is required (all, a tool, a name or an upstream)")
	case !printable(g.Resource) || !printable(g.Action):
		return fmt.Errorf("resource and action must be printable UTF-8 without spaces")
	case strings.TrimSpace(g.Scope.Tool+g.Scope.Name) != g.Scope.Tool+g.Scope.Name || !printable(g.Scope.Tool+g.Scope.Name):
		return fmt.Errorf("scope %s must be printable UTF-8 without surrounding spaces", g.Scope)
	case !printable(g.Scope.Upstream + g.Scope.URI + g.Scope.Prompt):
		return fmt.Errorf("scope %s must be printable UTF-8 without spaces", g.Scope)
	}
	if err := policy.CheckAccessScope(g); err != nil {
		return err
	}
	if g.Scope.Tool != "" {
		if _, err := toolid.Map(g.Scope.Tool); err != nil {
			return fmt.Errorf("scope tool %q: %v", g.Scope.Tool, err)
		}
	}
	if g.When != "" && env != nil {
		if _, err := env.Compile(g.When); err != nil {
			return fmt.Errorf("when: %v", err)
		}
	}
	return nil
}

// held reports whether principal p holds g in bundle b: some grant of its
// own or of its roles covers g's resource, action and scope, and, when p
// is itself delegated_from another principal, that one holds it too (the
// bundle's delegation only narrows). Conditions are not compared: a
// condition on the delegator's grant keeps applying at decision time,
// because every call under a delegation is checked against the
// delegator's current grants as well.
func held(b *policy.Bundle, p *policy.Principal, g policy.Grant, depth int) bool {
	if p == nil || depth > policy.MaxDelegationDepth {
		return false
	}
	covers := func(gs []policy.Grant) bool {
		for _, o := range gs {
			if o.Resource == g.Resource && o.Action == g.Action && policy.ScopeCovers(o.Scope, g.Scope) {
				return true
			}
		}
		return false
	}
	ok := covers(p.Grants)
	for _, r := range p.Roles {
		if ok {
			break
		}
		for _, role := range b.Roles {
			if role.RoleID == r && covers(role.Grants) {
				ok = true
				break
			}
		}
	}
	if !ok || p.DelegatedFrom == "" {
		return ok
	}
	return held(b, principalOf(b, p.DelegatedFrom), g, depth+1)
}

// printable reports whether s is valid UTF-8 of printable characters
// without spaces.
func printable(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if unicode.IsSpace(r) || !unicode.IsPrint(r) {
			return false
		}
	}
	return true
}

func principalOf(b *policy.Bundle, id string) *policy.Principal {
	for _, p := range b.Principals {
		if p.PrincipalID == id {
			return p
		}
	}
	return nil
}

func agentOf(b *policy.Bundle, id string) *policy.Agent {
	for _, a := range b.Agents {
		if a.AgentID == id {
			return a
		}
	}
	return nil
}

func roleOf(b *policy.Bundle, id string) *policy.Role {
	for _, r := range b.Roles {
		if r.RoleID == id {
			return r
		}
	}
	return nil
}
