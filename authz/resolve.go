package authz

import (
	"fmt"
	"time"

	"github.com/toolgate/toolgate"
)

// Context is where an invocation runs: the agent, deployment mode,
// business instance and environment, and optionally the principal.
type Context struct {
	AgentID        string `json:"agent_id"`
	DeploymentMode string `json:"deployment_mode,omitempty"`
	InstanceID     string `json:"instance_id,omitempty"`
	Environment    string `json:"environment,omitempty"`
	// Principal, when set, makes the grant layer part of authorization
	// (tools the principal may not invoke are not disclosed).
	Principal string `json:"principal,omitempty"`
	// Delegation, when set, narrows the grant layer to what the delegation
	// also grants (Principal must be its delegator).
	Delegation *Delegation `json:"-"`
	// Now is when the resolution is asked: a delegation that expired by
	// then discloses nothing.
	Now time.Time `json:"-"`
}

// Removal says which layer removed a ceiling tool, with the decision code
// and a reason naming what to change.
type Removal struct {
	ToolID string         `json:"tool_id"`
	Layer  toolgate.Layer `json:"layer"`
	Code   toolgate.Code  `json:"code"`
	Reason string         `json:"reason"`
}

// ToolStatus is one ceiling tool's path through the layers, for the
// resolve table.
type ToolStatus struct {
	ToolID string `json:"tool_id"`
	Name   string `json:"name"`
	// Layers maps each layer to pass, deny, require_approval or skipped.
	Layers           map[toolgate.Layer]string `json:"layers"`
	Active           bool                      `json:"active"`
	Authorized       bool                      `json:"authorized"`
	Disclosed        bool                      `json:"disclosed"`
	RequiresApproval bool                      `json:"requires_approval"`
	ControlFlow      bool                      `json:"control_flow"`
	SideEffectClass  toolgate.SideEffectClass  `json:"side_effect_class"`
	ApprovalTier     toolgate.ApprovalTier     `json:"approval_tier"`
}

// Resolution is the outcome of Resolve: the active tool set (ceiling →
// runtime restriction → instance override), the authorized set (active
// minus what tool policy, and with a principal the grant layer, denies) and
// the disclosed set the model is shown (authorized, approval-needing tools
// included, control-flow tools always). Each list is in ceiling order.
type Resolution struct {
	AgentID        string       `json:"agent_id"`
	DeploymentMode string       `json:"deployment_mode"`
	InstanceID     string       `json:"instance_id,omitempty"`
	Environment    string       `json:"environment,omitempty"`
	ActiveToolSet  []string     `json:"active_tool_set"`
	Authorized     []string     `json:"authorized"`
	Disclosed      []string     `json:"disclosed"`
	Removed        []Removal    `json:"removed"`
	Tools          []ToolStatus `json:"tools"`
}

// Resolve computes the tool sets for one invocation context. It is the
// tool-level Decide run for every ceiling tool, so a disclosed tool's
// tool-level decision is never deny. An unknown agent resolves to empty
// sets with one removal naming the agent.
func (s *Snapshot) Resolve(ctx Context) Resolution {
	mode := ctx.DeploymentMode
	if mode == "" {
		mode = s.settings.DefaultDeploymentMode
	}
	r := Resolution{AgentID: ctx.AgentID, DeploymentMode: mode, InstanceID: ctx.InstanceID, Environment: ctx.Environment,
		ActiveToolSet: []string{}, Authorized: []string{}, Disclosed: []string{}, Removed: []Removal{}, Tools: []ToolStatus{}}
	if d := ctx.Delegation; d != nil && (d.err != nil || !ctx.Now.Before(d.ExpiresAt)) {
		reason := fmt.Sprintf("grant layer: %s expired at %s", d.ID, d.ExpiresAt.UTC().Format(time.RFC3339))
		if d.err != nil {
			reason = fmt.Sprintf("grant layer: the grants of %s cannot be applied (fail closed): %v", d.ID, d.err)
		}
		r.Removed = append(r.Removed, Removal{Layer: toolgate.LayerGrant, Code: toolgate.CodeRBACToolInvoke, Reason: reason})
		return r
	}
	a := s.agents[ctx.AgentID]
	if a == nil {
		r.Removed = append(r.Removed, Removal{Layer: toolgate.LayerComposition, Code: toolgate.CodeUnknownAgent,
			Reason: "composition layer: agent " + ctx.AgentID + " is not declared in the policy bundle; add an Agent document"})
		return r
	}
	for _, idx := range a.order {
		t := &s.tools[idx]
		call := toolgate.Call{AgentID: ctx.AgentID, DeploymentMode: mode, InstanceID: ctx.InstanceID,
			Environment: ctx.Environment, Principal: ctx.Principal, Tool: t.ID, ToolLevel: true}
		var trace []LayerResult
		var vc varsCache
		e := eval{s: s, c: &call, skipPrincipal: ctx.Principal == "", vc: &vc}
		if d := ctx.Delegation; d != nil {
			if d.snap != s || d.Delegator != ctx.Principal {
				continue // not this snapshot's or principal's: disclose nothing through it
			}
			e.del = d.info
		}
		d := e.run(&trace)
		st := ToolStatus{ToolID: t.ID, Name: t.Name, Layers: map[toolgate.Layer]string{}, ControlFlow: t.ControlFlow,
			SideEffectClass: d.SideEffectClass, ApprovalTier: d.ApprovalTier}
		active := true
		for _, lr := range trace {
			st.Layers[lr.Layer] = lr.Verdict
			switch lr.Layer {
			case toolgate.LayerCeiling, toolgate.LayerRuntime, toolgate.LayerInstance:
				if lr.Verdict != "pass" {
					active = false
				}
			}
		}
		if ctx.Principal == "" {
			st.Layers[toolgate.LayerGrant] = "skipped"
			st.Layers[toolgate.LayerResource] = "skipped"
		}
		st.Active = active
		st.RequiresApproval = d.Verdict == toolgate.RequireApproval
		st.Authorized = d.Verdict != toolgate.Deny
		st.Disclosed = st.Authorized
		if active {
			r.ActiveToolSet = append(r.ActiveToolSet, t.ID)
		}
		if st.Authorized {
			r.Authorized = append(r.Authorized, t.ID)
			r.Disclosed = append(r.Disclosed, t.ID)
		} else {
			r.Removed = append(r.Removed, Removal{ToolID: t.ID, Layer: d.Layer, Code: d.Code, Reason: d.Reason})
		}
		r.Tools = append(r.Tools, st)
	}
	return r
}

// SuspendedEvents lists the removals that a suspension caused (runtime
// tool_suspensions or an instance override), for agent.tool.suspended
// events.
func (r Resolution) SuspendedEvents() []Removal {
	var out []Removal
	for _, rm := range r.Removed {
		if rm.Code == toolgate.CodeSuspendedRuntime || rm.Code == toolgate.CodeSuspendedInstance {
			out = append(out, rm)
		}
	}
	return out
}
