package httpapi

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolgate/toolgate"
	"github.com/toolgate/toolgate/adapter"
	"github.com/toolgate/toolgate/gate"
)

// ToolsCallRequest is the body of POST /v1/tools/call: the Synedrix
// invocation fields. The identity fields follow IdentityFields' rules (with
// Options.Identify they may only repeat the credential's identity).
type ToolsCallRequest struct {
	// CorrelationID ties the call's events together; generated when empty.
	CorrelationID string `json:"correlation_id"`
	// CausationID is the event or request that caused this call.
	CausationID    string `json:"causation_id"`
	AgentID        string `json:"agent_id"`
	DeploymentMode string `json:"deployment_mode"`
	InstanceID     string `json:"instance_id"`
	Environment    string `json:"environment"`
	Principal      string `json:"principal"`
	// Tool is the name as the model called it (required).
	Tool string `json:"tool"`
	// Arguments are the call's arguments, a JSON object (absent or null: {}).
	Arguments json.RawMessage `json:"arguments"`
}

// Identity returns the request's identity fields.
func (r *ToolsCallRequest) Identity() IdentityFields {
	return IdentityFields{AgentID: r.AgentID, DeploymentMode: r.DeploymentMode, InstanceID: r.InstanceID,
		Environment: r.Environment, Principal: r.Principal}
}

// ToolsCallResponse is the answer of POST /v1/tools/call. On success Status
// is "success" and Result holds the tool's result; otherwise it is the
// Outcome Envelope: Status "failure", the reasons in Errors, and Result
// when the tool ran and failed. Decision and ExecutionContext are always
// there.
type ToolsCallResponse struct {
	Status string `json:"status"`
	// Result is the tool's result in the MCP CallToolResult shape
	// ({"content": [{"type": "text", "text": …}], "structuredContent": …,
	// "isError": …}), capped at Settings.result_max_kib (a cut is marked).
	Result           *mcp.CallToolResult `json:"result,omitempty"`
	Errors           []string            `json:"errors,omitempty"`
	Decision         DecisionResponse    `json:"decision"`
	ExecutionContext CallContext         `json:"execution_context"`
}

// CallContext is the execution_context of /v1/tools/call: the Envelope's
// ExecutionContext plus what running the tool recorded.
type CallContext struct {
	ExecutionContext
	CausationID string `json:"causation_id,omitempty"`
	ToolID      string `json:"tool_id,omitempty"`
	// Attempts is how many times the tool was tried (0: it did not run).
	Attempts int `json:"attempts"`
	// DurationMS is how long running the tool took, all attempts included.
	DurationMS int64 `json:"duration_ms"`
	// ReturnedBytes and OutputDigest (sha256 hex) are of Result's JSON, as
	// the audit log records them.
	ReturnedBytes int    `json:"returned_bytes,omitempty"`
	OutputDigest  string `json:"output_digest,omitempty"`
	Truncated     bool   `json:"truncated,omitempty"`
	// Resources are what a built-in tool reported the call touches.
	Resources []toolgate.Resource `json:"resources,omitempty"`
	// FailedAttempts accounts for each attempt that failed.
	FailedAttempts []adapter.Attempt `json:"failed_attempts,omitempty"`
}

// toolsCall decides a call, runs it when allowed (gate.Handle) and answers:
// 200 success; 403 deny; 202 approval required (the pending approval in
// decision.approval_id); 503 internal_error; 502 the tool failed or could
// not be reached; 504 it timed out.
func (s *server) toolsCall(w http.ResponseWriter, r *http.Request) error {
	var req ToolsCallRequest
	if err := decodeJSON(w, r, &req, false); err != nil {
		return err
	}
	if req.Tool == "" {
		return apiError(http.StatusBadRequest, "bad_request", "tool is required: the tool name as the model called it")
	}
	id, err := s.caller(r, req.Identity())
	if err != nil {
		return err
	}
	// The call and its records complete even if the client goes away, so
	// the audit log says what ran.
	out := s.g.Handle(context.WithoutCancel(r.Context()), gate.Request{Identity: id, Tool: req.Tool, Args: req.Arguments,
		CorrelationID: req.CorrelationID, CausationID: req.CausationID, Via: Via})
	cr := out.Result
	d := shown(out, req.Tool)
	resp := ToolsCallResponse{
		Status: "failure",
		Decision: DecisionResponse{Verdict: d.Verdict.String(), Code: string(d.Code), Layer: string(d.Layer), Reason: d.Reason,
			ToolID: d.ToolID, EventType: string(d.EventType), ApprovalID: out.ApprovalID, ApprovalExpiresAt: out.ApprovalExpires,
			CorrelationID: out.CorrelationID},
		ExecutionContext: CallContext{
			ExecutionContext: ExecutionContext{CorrelationID: out.CorrelationID, AgentID: id.AgentID, Principal: id.Principal,
				InstanceID: id.InstanceID, Environment: id.Environment, ToolName: req.Tool},
			CausationID: req.CausationID, ToolID: d.ToolID, Attempts: cr.Attempts, DurationMS: cr.Duration.Milliseconds(),
			ReturnedBytes: len(cr.Output), Truncated: cr.Truncated, Resources: cr.Resources,
		},
	}
	for _, a := range cr.AttemptLog {
		if a.Error != "" {
			resp.ExecutionContext.FailedAttempts = append(resp.ExecutionContext.FailedAttempts, a)
		}
	}
	if cr.Output != nil {
		resp.ExecutionContext.OutputDigest = digest(cr.Output)
	}
	status := http.StatusOK
	switch {
	case d.Verdict == toolgate.RequireApproval:
		status = http.StatusAccepted
		resp.Errors = []string{d.Reason}
	case d.Verdict != toolgate.Allow && d.Code == toolgate.CodeInternalError:
		status = http.StatusServiceUnavailable
		resp.Errors = []string{d.Reason}
	case d.Verdict != toolgate.Allow:
		status = http.StatusForbidden
		resp.Errors = []string{d.Reason}
	case cr.Failed:
		resp.Result = cr.Tool
		status = http.StatusBadGateway
		if errors.Is(cr.Err, adapter.ErrTimeout) || errors.Is(cr.Err, context.DeadlineExceeded) {
			status = http.StatusGatewayTimeout
		}
		resp.Errors = []string{resultText(cr.Tool)}
	default:
		resp.Status = "success"
		resp.Result = cr.Tool
	}
	writeJSON(w, status, resp)
	return nil
}

// resultText joins a result's text items.
func resultText(r *mcp.CallToolResult) string {
	if r == nil {
		return "the tool returned no result"
	}
	s := ""
	for _, c := range r.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			if s != "" {
				s += "\n"
			}
			s += tc.Text
		}
	}
	if s == "" {
		s = "the tool reported an error without text"
	}
	return s
}

// digest is the sha256 hex of b, as the audit log's output_digest.
func digest(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}
