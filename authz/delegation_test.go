package authz_test

import (
	"testing"
	"time"

	"github.com/toolgate/toolgate"
	"github.com/toolgate/toolgate/authz"
	"github.com/toolgate/toolgate/policy"
)

const tokenDelegationBundle = `
- {kind: Tool, tool_id: tool:fs-read, side_effect_class: read}
- {kind: Tool, tool_id: tool:fs-search, side_effect_class: read}
- {kind: Tool, tool_id: tool:bifrost-query, side_effect_class: read}
- kind: Agent
  agent_id: scheduler
  version: 1.0.0
  runtime_engine: cron
  tool_permissions:
    - {tool_id: tool:fs-read, side_effect_class: read}
    - {tool_id: tool:fs-search, side_effect_class: read}
    - {tool_id: tool:bifrost-query, side_effect_class: read}
- {kind: RuntimePolicy, agent_id: scheduler, deployment_mode: production, tool_authorization_policy: {active_tool_set: all}}
- kind: Principal
  principal_id: user:owner
  grants:
    - {resource: tool, action: invoke, scope: {tool: fs.read}}
    - {resource: tool, action: invoke, scope: {tool: bifrost.query}}
    - {resource: bifrost_query, action: read, scope: {name: vala.datasets}}
`

// The seed table of Wyrd, through a delegation: invoke only, resource only,
// both; and a delegate never exceeds its delegator, also after the
// delegator loses a grant.
func TestDelegationIntersection(t *testing.T) {
	snap := snapshotOf(t, tokenDelegationBundle, nil)
	tickets := []toolgate.Resource{{Type: "bifrost_query", Name: "vala.datasets.tickets"}}
	grant := func(res, act string, sc policy.Scope) policy.Grant {
		return policy.Grant{Resource: res, Action: act, Scope: sc}
	}
	all := policy.Scope{All: true}
	cases := []struct {
		name   string
		grants []policy.Grant
		tool   string
		res    []toolgate.Resource
		want   toolgate.Code
	}{
		{"invoke only", []policy.Grant{grant("tool", "invoke", all)}, "bifrost.query", tickets, toolgate.CodeRBACResource},
		{"resource only", []policy.Grant{grant("bifrost_query", "read", policy.Scope{Name: "vala.datasets"})}, "bifrost.query", tickets, toolgate.CodeRBACToolInvoke},
		{"both", []policy.Grant{grant("tool", "invoke", policy.Scope{Tool: "bifrost.query"}), grant("bifrost_query", "read", all)}, "bifrost.query", tickets, toolgate.CodeOK},
		{"all handed, delegator holds less", []policy.Grant{grant("tool", "invoke", all)}, "fs.search", nil, toolgate.CodeRBACToolInvoke},
		{"wider resource handed than held", []policy.Grant{grant("tool", "invoke", all), grant("bifrost_query", "read", all)}, "bifrost.query",
			[]toolgate.Resource{{Type: "bifrost_query", Name: "vala.billing.invoices"}}, toolgate.CodeRBACResource},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d, err := snap.CompileDelegation("dlg-1", "user:owner", "svc:scheduler", c.grants, farFuture)
			if err != nil {
				t.Fatal(err)
			}
			got := snap.DecideDelegated(&toolgate.Call{AgentID: "scheduler", Principal: "user:owner", Tool: c.tool, Args: map[string]any{}, Resources: c.res}, d)
			if got.Code != c.want {
				t.Errorf("got %s (%s), want %s", got.Code, got.Reason, c.want)
			}
		})
	}
	t.Run("revoking the delegator's grant revokes the delegate's", func(t *testing.T) {
		b := bundleOf(t, tokenDelegationBundle)
		b.Principals[0].Grants = b.Principals[0].Grants[1:] // owner loses fs.read
		snap2, _, err := authz.Compile(b, nil)
		if err != nil {
			t.Fatal(err)
		}
		d, _ := snap2.CompileDelegation("dlg-2", "user:owner", "svc:scheduler", []policy.Grant{grant("tool", "invoke", policy.Scope{Tool: "fs.read"})}, farFuture)
		got := snap2.DecideDelegated(&toolgate.Call{AgentID: "scheduler", Principal: "user:owner", Tool: "fs.read", Args: map[string]any{}}, d)
		if got.Code != toolgate.CodeRBACToolInvoke {
			t.Errorf("got %s, want rbac_tool_invoke", got.Code)
		}
	})
	t.Run("a delegation from another snapshot or principal denies", func(t *testing.T) {
		other := snapshotOf(t, tokenDelegationBundle, nil)
		d, _ := other.CompileDelegation("dlg-3", "user:owner", "svc:x", []policy.Grant{grant("tool", "invoke", all)}, farFuture)
		if got := snap.DecideDelegated(&toolgate.Call{AgentID: "scheduler", Principal: "user:owner", Tool: "fs.read"}, d); got.Verdict != toolgate.Deny {
			t.Errorf("foreign delegation allowed")
		}
		d2, _ := snap.CompileDelegation("dlg-4", "user:owner", "svc:x", []policy.Grant{grant("tool", "invoke", all)}, farFuture)
		if got := snap.DecideDelegated(&toolgate.Call{AgentID: "scheduler", Principal: "user:other", Tool: "fs.read"}, d2); got.Verdict != toolgate.Deny {
			t.Errorf("delegation used for another principal allowed")
		}
	})
	t.Run("disclosure through a delegation", func(t *testing.T) {
		d, _ := snap.CompileDelegation("dlg-5", "user:owner", "svc:x", []policy.Grant{grant("tool", "invoke", policy.Scope{Tool: "fs.read"})}, farFuture)
		r := snap.Resolve(authz.Context{AgentID: "scheduler", Principal: "user:owner", Delegation: d})
		if len(r.Disclosed) != 1 || r.Disclosed[0] != "tool:fs-read" {
			t.Errorf("disclosed %v, want [tool:fs-read]", r.Disclosed)
		}
	})
}

// farFuture is a delegation expiry no test reaches.
var farFuture = time.Now().Add(100 * 365 * 24 * time.Hour)
