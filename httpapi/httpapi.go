// Package httpapi is the gateway's JSON API (docs/design.md, "Where a call goes"): resolve an
// active tool set, decide a call, list, approve and deny approvals, and
// read the audit log, plus health, readiness and Prometheus metrics. It is
// an enforcement point like the MCP proxy: every decision goes through
// gate.Authorize, so it is recorded in the audit log and asks for the same
// approvals, and it cannot disagree with the proxy.
//
// Routes (bodies are JSON, at most 1 MiB, sent with Content-Type
// application/json; unknown fields are refused):
//
//	GET  /healthz                      200 "ok" while the process runs
//	GET  /readyz                       200 "ok", or 503 with the reason
//	GET  /metrics                      Prometheus exposition (with Options.Metrics)
//	POST /v1/resolve                   IdentityFields → authz.Resolution (as toolgate resolve -o json)
//	POST /v1/decide                    DecideRequest → DecisionResponse (200)
//	                                   or Envelope (403 deny, 202 approval, 503 internal_error)
//	POST /v1/tools/call                ToolsCallRequest → ToolsCallResponse: decide, run, answer (200
//	                                   success; 403, 202, 503 as decide; 502 tool failed, 504 timed out)
//	GET  /v1/approvals?status=pending  ApprovalList (status: a status, a comma list, or all)
//	POST /v1/approvals/{id}/approve    ApprovalDecisionRequest → gate.Approval
//	POST /v1/approvals/{id}/deny       ApprovalDecisionRequest → gate.Approval
//	GET  /v1/audit?from=SEQ&limit=N    AuditPage
//
// Every error is answered by WriteError as {"error":{"code","message"}}.
//
// Authentication is the caller's: with Options.Identify set, every /v1/
// route needs an identity from it, and the identity alone says who calls
// (fields in a body may only repeat it). Without Identify the API trusts
// the body, for a gateway bound to loopback in development; it then
// refuses to decide approvals, because it cannot tell who approves.
package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/toolgate/toolgate"
	"github.com/toolgate/toolgate/gate"
)

// Via is the enforcement point name this API gives the gate, the audit log
// and the metrics.
const Via = "http"

// Page sizes of the list routes.
const (
	// DefaultAuditLimit is /v1/audit's limit when none is given.
	DefaultAuditLimit = 100
	// MaxLimit is the largest limit /v1/audit and /v1/approvals accept; it
	// is also /v1/approvals' limit when none is given.
	MaxLimit = 1000
)

// Options configures New; nil is valid (no metrics, always ready, no
// authentication, no audit reading, a discarding logger).
type Options struct {
	// Metrics, when set, is served on /metrics (the gate counts the
	// decisions: gate.Options.Observer).
	Metrics http.Handler
	// Ready reports why the gateway should not take traffic (for example
	// the audit store failing); /readyz answers 503 with its error. The
	// gate's audit recorder's error is checked too, after Ready.
	Ready func() error
	// Identify authenticates a request and returns who it acts as. Its
	// error is answered with 401 (or the status of an *Error it returns).
	// When set, a /v1/ request's agent, principal, instance, environment
	// and deployment mode come only from the identity; a body naming
	// other values is refused with 403.
	Identify func(r *http.Request) (gate.Identity, error)
	// Refused, when set, is told of every request answered with an error
	// other than 401 (which Identify records): a request refused before
	// anything was decided, with its HTTP status and error code, so that
	// it is logged, counted and audited (rate-limited).
	Refused func(r *http.Request, status int, code string)
	// Logger gets request failures (5xx, panics); nil discards.
	Logger *slog.Logger
}

// IdentityFields name who calls and where: the body of /v1/resolve and the
// identity part of /v1/decide. With Options.Identify set they may be left
// out; when given they must equal the authenticated identity's.
type IdentityFields struct {
	AgentID        string `json:"agent_id"`
	DeploymentMode string `json:"deployment_mode"`
	InstanceID     string `json:"instance_id"`
	Environment    string `json:"environment"`
	Principal      string `json:"principal"`
}

// DecideRequest is the body of /v1/decide. Without Options.Identify, an
// empty principal means the bundle's Settings.default_principal.
type DecideRequest struct {
	// The identity fields, as in IdentityFields.
	AgentID        string `json:"agent_id"`
	DeploymentMode string `json:"deployment_mode"`
	InstanceID     string `json:"instance_id"`
	Environment    string `json:"environment"`
	Principal      string `json:"principal"`
	// Tool is the name as the model called it; required unless Access is
	// set (then it must be absent).
	Tool string `json:"tool"`
	// Access, instead of a tool call, asks about a resource or prompt
	// access (docs/design.md, "Resources and prompts"): resource_read,
	// resource_subscribe, resource_complete, prompt_get or
	// prompt_complete. The gateway's mirror of its upstreams' lists routes
	// it, as it routes the same MCP request.
	Access string `json:"access"`
	// URI is, for a resource access, the URI (for resource_complete, a
	// template an upstream lists, or a URI).
	URI string `json:"uri"`
	// Prompt is, for a prompt access, the prompt's name as the client sees
	// it.
	Prompt string `json:"prompt"`
	// Args are the call's arguments, a JSON object (absent or null: {}).
	Args json.RawMessage `json:"args"`
	// Arguments is Args under the name /v1/tools/call uses; send one of
	// the two (both is a 400).
	Arguments json.RawMessage `json:"arguments"`
	// Resources are what the call touches, when the caller can tell.
	Resources []toolgate.Resource `json:"resources"`
	// CorrelationID ties the call's events together; generated when empty.
	CorrelationID string `json:"correlation_id"`
	CausationID   string `json:"causation_id"`
}

// Identity returns the request's identity fields.
func (r *DecideRequest) Identity() IdentityFields {
	return IdentityFields{AgentID: r.AgentID, DeploymentMode: r.DeploymentMode, InstanceID: r.InstanceID,
		Environment: r.Environment, Principal: r.Principal}
}

// DecisionResponse is the decision of /v1/decide: the whole answer for an
// allow, and the "decision" of the Envelope otherwise.
type DecisionResponse struct {
	Verdict string `json:"verdict"`
	Code    string `json:"code"`
	Layer   string `json:"layer"`
	Reason  string `json:"reason"`
	ToolID  string `json:"tool_id"`
	// Target is, for an access, the ceiling entry (or upstream) it was
	// decided on (toolgate.Decision.Target).
	Target    string `json:"target,omitempty"`
	EventType string `json:"event_type"`
	// ApprovalID is the pending approval a require_approval created, or
	// the approval an allow used.
	ApprovalID string `json:"approval_id,omitempty"`
	// ApprovalExpiresAt is when the pending approval expires.
	ApprovalExpiresAt time.Time `json:"approval_expires_at,omitzero"`
	// CorrelationID is the call's (the request's, or a generated one).
	CorrelationID string `json:"correlation_id"`
}

// Envelope is the Outcome Envelope of a refused call: status "failure",
// the reason in errors, where the call ran, and the decision.
type Envelope struct {
	Status           string           `json:"status"`
	Errors           []string         `json:"errors"`
	ExecutionContext ExecutionContext `json:"execution_context"`
	Decision         DecisionResponse `json:"decision"`
}

// ExecutionContext is the Envelope's account of the call.
type ExecutionContext struct {
	CorrelationID string `json:"correlation_id"`
	AgentID       string `json:"agent_id"`
	Principal     string `json:"principal,omitempty"`
	InstanceID    string `json:"instance_id,omitempty"`
	Environment   string `json:"environment,omitempty"`
	ToolName      string `json:"tool_name,omitempty"`
}

// ApprovalList is the answer of GET /v1/approvals, oldest first.
type ApprovalList struct {
	Approvals []gate.Approval `json:"approvals"`
}

// ApprovalDecisionRequest is the body of approve and deny (an empty body
// is an empty reason).
type ApprovalDecisionRequest struct {
	Reason string `json:"reason"`
}

// AuditPage is the answer of GET /v1/audit: events with seq >= from, in
// order, and the from of the next page (the last seq + 1, or from when
// there were none), for paging and polling.
type AuditPage struct {
	Events   []gate.AuditEvent `json:"events"`
	NextFrom int64             `json:"next_from"`
}

type server struct {
	g   *gate.Gate
	o   Options
	log *slog.Logger
}

// handler is a route's work; an error is answered by WriteError.
type handler func(w http.ResponseWriter, r *http.Request) error

// New returns the API's handler, deciding with g. opts may be nil.
func New(g *gate.Gate, opts *Options) http.Handler {
	s := &server{g: g}
	if opts != nil {
		s.o = *opts
	}
	s.log = s.o.Logger
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	mux := http.NewServeMux()
	route := func(pattern, method string, auth bool, h handler) {
		mux.Handle(pattern, s.wrap(method, auth, h))
	}
	route("/healthz", http.MethodGet, false, s.healthz)
	route("/readyz", http.MethodGet, false, s.readyz)
	if s.o.Metrics != nil {
		mh := s.o.Metrics
		route("/metrics", http.MethodGet, false, func(w http.ResponseWriter, r *http.Request) error {
			mh.ServeHTTP(w, r)
			return nil
		})
	}
	route("/v1/resolve", http.MethodPost, true, s.resolve)
	route("/v1/decide", http.MethodPost, true, s.decide)
	route("/v1/tools/call", http.MethodPost, true, s.toolsCall)
	route("/v1/approvals", http.MethodGet, true, s.listApprovals)
	route("/v1/approvals/{id}/approve", http.MethodPost, true, s.decideApproval(true))
	route("/v1/approvals/{id}/deny", http.MethodPost, true, s.decideApproval(false))
	route("/v1/audit", http.MethodGet, true, s.audit)
	mux.Handle("/", s.wrap("", false, func(w http.ResponseWriter, r *http.Request) error {
		return apiError(http.StatusNotFound, "not_found", "no route %s %s", r.Method, r.URL.Path)
	}))
	return mux
}

type ctxKey struct{}

// wrap checks the method (GET also allows HEAD), authenticates when auth is
// set, recovers panics, and answers errors.
func (s *server) wrap(method string, auth bool, h handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if p := recover(); p != nil {
				if p == http.ErrAbortHandler {
					panic(p)
				}
				s.log.Error("httpapi: panic", "method", r.Method, "path", r.URL.Path, "panic", p)
				WriteError(w, fmt.Errorf("panic: %v", p))
			}
		}()
		err := s.serve(w, r, method, auth, h)
		if err == nil {
			return
		}
		e := Classify(err)
		if e.Status >= 500 {
			s.log.Error("httpapi: request failed", "method", r.Method, "path", r.URL.Path, "status", e.Status, "err", err)
		}
		if e.Status >= 400 && e.Status != http.StatusUnauthorized && s.o.Refused != nil {
			// A request refused before anything was decided (a failed
			// authentication is recorded by Identify).
			s.o.Refused(r, e.Status, e.Code)
		}
		WriteError(w, e)
	})
}

func (s *server) serve(w http.ResponseWriter, r *http.Request, method string, auth bool, h handler) error {
	if method != "" && r.Method != method && !(method == http.MethodGet && r.Method == http.MethodHead) {
		allow := method
		if method == http.MethodGet {
			allow += ", " + http.MethodHead
		}
		w.Header().Set("Allow", allow)
		w.Header().Set("Connection", "close") // the body stays unread
		return apiError(http.StatusMethodNotAllowed, "method_not_allowed", "%s %s is not allowed; use %s", r.Method, r.URL.Path, method)
	}
	if auth && s.o.Identify != nil {
		id, err := s.o.Identify(r)
		if err != nil {
			w.Header().Set("Connection", "close") // the body stays unread
			var ae *Error
			if errors.As(err, &ae) {
				return ae
			}
			return &Error{Status: http.StatusUnauthorized, Code: "unauthenticated", Message: "unauthenticated: " + err.Error(), Err: err}
		}
		r = r.WithContext(context.WithValue(r.Context(), ctxKey{}, id))
	}
	return h(w, r)
}

// authenticated returns the identity wrap stored, if Identify is set.
func authenticated(r *http.Request) (gate.Identity, bool) {
	id, ok := r.Context().Value(ctxKey{}).(gate.Identity)
	return id, ok
}

func (s *server) healthz(w http.ResponseWriter, r *http.Request) error {
	writeText(w, http.StatusOK, "ok\n")
	return nil
}

// readyz answers 200, or 503 with the reason. A 503 is the answer a probe
// asks for, not a failed request: it is logged at debug level only (the
// gateway logs each change of the audit log's state once) and not
// recorded as a refusal.
func (s *server) readyz(w http.ResponseWriter, r *http.Request) error {
	var e *Error
	if s.o.Ready != nil {
		if err := s.o.Ready(); err != nil {
			e = &Error{Status: http.StatusServiceUnavailable, Code: "not_ready", Message: "not ready: " + err.Error(), Err: err}
		}
	}
	if rec := s.g.Recorder(); rec != nil && e == nil {
		if err := rec.Err(); err != nil {
			e = &Error{Status: http.StatusServiceUnavailable, Code: "not_ready", Message: "not ready: the audit log cannot write: " + err.Error(), Err: err}
		}
	}
	if e != nil {
		s.log.Debug("httpapi: not ready", "path", r.URL.Path, "err", e.Err)
		WriteError(w, e)
		return nil
	}
	writeText(w, http.StatusOK, "ok\n")
	return nil
}

func writeText(w http.ResponseWriter, status int, text string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(text))
}

// reader is who reads the approvals or the audit log: the authenticated
// identity, or without Identify the operator.
func (s *server) reader(r *http.Request) (gate.Identity, error) {
	if id, ok := authenticated(r); ok {
		return id, nil
	}
	return gate.Identity{Operator: true}, nil
}

// identity returns who a /v1/resolve or /v1/decide request acts as: the
// authenticated identity, which the body may only repeat, or, without
// Identify, the body's fields (agent_id required).
func (s *server) identity(r *http.Request, f IdentityFields) (gate.Identity, error) {
	id, ok := authenticated(r)
	if !ok {
		if f.AgentID == "" {
			return gate.Identity{}, apiError(http.StatusBadRequest, "bad_request", "agent_id is required")
		}
		return gate.Identity{Principal: f.Principal, AgentID: f.AgentID, InstanceID: f.InstanceID,
			Environment: f.Environment, DeploymentMode: f.DeploymentMode, Operator: true}, nil
	}
	defMode := s.g.Snapshot().Settings().DefaultDeploymentMode
	mode := func(m string) string {
		if m == "" {
			return defMode
		}
		return m
	}
	for _, c := range []struct{ field, body, want string }{
		{"agent_id", f.AgentID, id.AgentID},
		{"principal", f.Principal, id.Principal},
		{"instance_id", f.InstanceID, id.InstanceID},
		{"environment", f.Environment, id.Environment},
		{"deployment_mode", mode(f.DeploymentMode), mode(id.DeploymentMode)},
	} {
		if c.body != "" && c.body != c.want {
			s.log.Warn("httpapi: body names another identity", "path", r.URL.Path, "field", c.field,
				"body", c.body, "identity", c.want, "agent_id", id.AgentID, "principal", id.Principal)
			return gate.Identity{}, apiError(http.StatusForbidden, "identity_mismatch",
				"%s %q in the body is not the authenticated identity's (%q); the credential alone decides who calls, so leave it out or send the same value",
				c.field, c.body, c.want)
		}
	}
	return id, nil
}

func (s *server) resolve(w http.ResponseWriter, r *http.Request) error {
	var f IdentityFields
	if err := decodeJSON(w, r, &f, false); err != nil {
		return err
	}
	id, err := s.identity(r, f)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, s.g.Resolve(id))
	return nil
}

// shown is the decision a caller is told: the real one, except for a tool
// it is not shown, which is answered as a name that is no tool at all (no
// existence oracle), unless the gate says it may be told (it reads the
// audit log anyway: gate.Outcome.Reveal).
func shown(out gate.Outcome, name string) toolgate.Decision {
	if out.Visible || out.Reveal {
		return out.Decision
	}
	return unknownTool(name)
}

// unknownTool is the decision a caller gets for a tool it cannot see, the
// same as for a name that is no tool at all (the audit log keeps what was
// really decided).
func unknownTool(name string) toolgate.Decision {
	return toolgate.Decision{Verdict: toolgate.Deny, Code: toolgate.CodeUnknownTool, Layer: toolgate.LayerComposition,
		ToolName: name, EventType: toolgate.EventUnauthorized,
		Reason: fmt.Sprintf("composition layer: %q is not a tool this caller can call; POST /v1/resolve lists the tools it can", name)}
}

// caller is the identity a decide or call request acts as: the
// authenticated one, or without authentication the body's, with the
// bundle's default principal when it names none.
func (s *server) caller(r *http.Request, body IdentityFields) (gate.Identity, error) {
	id, err := s.identity(r, body)
	if err != nil {
		return id, err
	}
	if _, ok := authenticated(r); !ok && id.Principal == "" {
		id.Principal = s.g.Snapshot().Settings().DefaultPrincipal
	}
	return id, nil
}

func (s *server) decide(w http.ResponseWriter, r *http.Request) error {
	var req DecideRequest
	if err := decodeJSON(w, r, &req, false); err != nil {
		return err
	}
	if req.Tool == "" && req.Access == "" {
		return apiError(http.StatusBadRequest, "bad_request", "tool is required: the tool name as the model called it (or access, for a resource or prompt)")
	}
	if req.Tool != "" && (req.Access != "" || req.URI != "" || req.Prompt != "") {
		return apiError(http.StatusBadRequest, "bad_request", "send a tool call (tool) or an access (access, uri or prompt), not both")
	}
	id, err := s.caller(r, req.Identity())
	if err != nil {
		return err
	}
	// The decision and its record complete even if the client goes away,
	// so the audit log says what was decided, not that recording failed.
	args := req.Args
	if len(req.Arguments) > 0 {
		if len(args) > 0 {
			return apiError(http.StatusBadRequest, "bad_request", "send the call's arguments once, as args or as arguments")
		}
		args = req.Arguments
	}
	if req.Access != "" {
		return s.decideAccess(w, r, req, id, args)
	}
	out := s.g.Handle(context.WithoutCancel(r.Context()), gate.Request{Identity: id, Tool: req.Tool, Args: args,
		Resources: req.Resources, CorrelationID: req.CorrelationID, CausationID: req.CausationID, Via: Via, DecideOnly: true})
	d := shown(out, req.Tool)
	resp := DecisionResponse{Verdict: d.Verdict.String(), Code: string(d.Code), Layer: string(d.Layer), Reason: d.Reason,
		ToolID: d.ToolID, EventType: string(d.EventType), ApprovalID: out.ApprovalID, ApprovalExpiresAt: out.ApprovalExpires,
		CorrelationID: out.CorrelationID}
	writeDecision(w, resp, ExecutionContext{CorrelationID: out.CorrelationID, AgentID: id.AgentID, Principal: id.Principal,
		InstanceID: id.InstanceID, Environment: id.Environment, ToolName: req.Tool})
	return nil
}

// decideAccess answers /v1/decide for an access: decided and recorded
// through gate.HandleAccess (DecideOnly), shown as MCP shows it: one the
// caller is not shown is unknown, unless the caller may read the audit
// log.
func (s *server) decideAccess(w http.ResponseWriter, r *http.Request, req DecideRequest, id gate.Identity, args json.RawMessage) error {
	var kind toolgate.AccessKind
	if err := kind.UnmarshalText([]byte(req.Access)); err != nil {
		return apiError(http.StatusBadRequest, "bad_request", "access %.64q is none of resource_read, resource_subscribe, resource_complete, prompt_get, prompt_complete", req.Access)
	}
	if len(req.Resources) > 0 {
		return apiError(http.StatusBadRequest, "bad_request", "resources are for tool calls; an access names its uri or prompt")
	}
	if kind.IsResource() && req.Prompt != "" || kind.IsPrompt() && req.URI != "" {
		return apiError(http.StatusBadRequest, "bad_request", "a %s names a %s", kind, map[bool]string{true: "uri", false: "prompt"}[kind.IsResource()])
	}
	out := s.g.HandleAccess(context.WithoutCancel(r.Context()), gate.AccessRequest{Identity: id, Kind: kind, URI: req.URI, Prompt: req.Prompt,
		Args: args, CorrelationID: req.CorrelationID, Via: Via, DecideOnly: true, Method: "decide"})
	d := out.Decision
	name := req.URI
	if kind.IsPrompt() {
		name = req.Prompt
	}
	if !out.Visible && !out.Reveal {
		code := toolgate.CodeUnknownResource
		what := fmt.Sprintf("resource %.200q", name)
		if kind.IsPrompt() {
			code, what = toolgate.CodeUnknownPrompt, fmt.Sprintf("prompt %.200q", name)
		}
		d = toolgate.Decision{Verdict: toolgate.Deny, Code: code, Layer: toolgate.LayerComposition, EventType: toolgate.EventUnauthorized,
			Reason: fmt.Sprintf("composition layer: %s is not one this caller can reach; resources/list and prompts/list over MCP show what it can", what)}
	}
	resp := DecisionResponse{Verdict: d.Verdict.String(), Code: string(d.Code), Layer: string(d.Layer), Reason: d.Reason,
		Target: d.Target, EventType: string(d.EventType), ApprovalID: out.ApprovalID, ApprovalExpiresAt: out.ApprovalExpires,
		CorrelationID: out.CorrelationID}
	if !out.Visible && !out.Reveal {
		resp.ApprovalID, resp.ApprovalExpiresAt = "", time.Time{}
	}
	writeDecision(w, resp, ExecutionContext{CorrelationID: out.CorrelationID, AgentID: id.AgentID, Principal: id.Principal,
		InstanceID: id.InstanceID, Environment: id.Environment, ToolName: name})
	return nil
}

// writeDecision writes a decision of /v1/decide: the decision alone for an
// allow (200); else the Envelope, 202 for require_approval, 503 for an
// internal error, 403 otherwise.
func writeDecision(w http.ResponseWriter, resp DecisionResponse, ec ExecutionContext) {
	d := resp
	if d.Verdict == toolgate.Allow.String() {
		writeJSON(w, http.StatusOK, resp)
		return
	}
	status := http.StatusForbidden
	switch {
	case d.Verdict == toolgate.RequireApproval.String():
		status = http.StatusAccepted
	case d.Code == string(toolgate.CodeInternalError):
		status = http.StatusServiceUnavailable
	}
	writeJSON(w, status, Envelope{Status: "failure", Errors: []string{d.Reason}, ExecutionContext: ec, Decision: resp})
}

// limitParam reads a positive integer query parameter, def when absent.
func limitParam(r *http.Request, name string, def int) (int, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > MaxLimit {
		return 0, apiError(http.StatusBadRequest, "bad_request", "%s=%q: want a whole number from 1 to %d", name, v, MaxLimit)
	}
	return n, nil
}

func (s *server) listApprovals(w http.ResponseWriter, r *http.Request) error {
	f := gate.ApprovalFilter{}
	switch q := r.URL.Query().Get("status"); q {
	case "", string(gate.ApprovalPending):
		f.Status = []gate.ApprovalStatus{gate.ApprovalPending}
	case "all":
	default:
		for _, p := range strings.Split(q, ",") {
			stt := gate.ApprovalStatus(strings.TrimSpace(p))
			if !stt.Valid() {
				return apiError(http.StatusBadRequest, "bad_request",
					"status=%q: want all, or one or more (comma-separated) of pending, approved, denied, expired, used", q)
			}
			f.Status = append(f.Status, stt)
		}
	}
	var err error
	if f.Limit, err = limitParam(r, "limit", MaxLimit); err != nil {
		return err
	}
	id, err := s.reader(r)
	if err != nil {
		return err
	}
	// A caller sees the approvals its own calls asked for and those it may
	// decide, nothing else (the gate's rule): pending arguments can hold
	// secrets.
	as, err := s.g.ListApprovals(r.Context(), id, f)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, ApprovalList{Approvals: as})
	return nil
}

func (s *server) decideApproval(approve bool) handler {
	return func(w http.ResponseWriter, r *http.Request) error {
		var req ApprovalDecisionRequest
		if err := decodeJSON(w, r, &req, true); err != nil {
			return err
		}
		id, ok := authenticated(r)
		if !ok {
			return apiError(http.StatusForbidden, "no_identity",
				"this API has no authentication, so it cannot tell who approves; decide approvals with an authenticated API or with toolgate approvals approve|deny --as PRINCIPAL")
		}
		if id.Principal == "" {
			return apiError(http.StatusForbidden, "no_identity", "the authenticated identity names no principal, so it cannot decide approvals")
		}
		a, err := s.g.DecideApproval(context.WithoutCancel(r.Context()), r.PathValue("id"), approve, id.Principal, req.Reason, Via)
		if err != nil {
			return err
		}
		writeJSON(w, http.StatusOK, a)
		return nil
	}
}

func (s *server) audit(w http.ResponseWriter, r *http.Request) error {
	from := int64(1)
	if v := r.URL.Query().Get("from"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 1 {
			return apiError(http.StatusBadRequest, "bad_request", "from=%q: want a sequence number, 1 or more", v)
		}
		from = n
	}
	limit, err := limitParam(r, "limit", DefaultAuditLimit)
	if err != nil {
		return err
	}
	id, err := s.reader(r)
	if err != nil {
		return err
	}
	evs, err := s.g.ReadAudit(r.Context(), id, from, limit)
	if err != nil {
		return err
	}
	page := AuditPage{Events: evs, NextFrom: from}
	if len(evs) > 0 {
		page.NextFrom = evs[len(evs)-1].Seq + 1
	}
	writeJSON(w, http.StatusOK, page)
	return nil
}
