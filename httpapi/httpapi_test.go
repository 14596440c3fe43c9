package httpapi_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/toolgate/toolgate/approval"
	"github.com/toolgate/toolgate/audit"
	"github.com/toolgate/toolgate/authz"
	"github.com/toolgate/toolgate/gate"
	"github.com/toolgate/toolgate/httpapi"
	"github.com/toolgate/toolgate/internal/cli"
	"github.com/toolgate/toolgate/metrics"
	"github.com/toolgate/toolgate/policy"
	"github.com/toolgate/toolgate/store/sqlite"
)

const bundleDir = "../examples/bundle"

// env is a real gateway: the example bundle compiled, a SQLite store in a
// temporary folder, an audit recorder, and the API on a loopback server.
type env struct {
	t       *testing.T
	srv     *httptest.Server
	g       *gate.Gate
	snap    *authz.Snapshot
	store   *sqlite.Store
	rec     *audit.Recorder
	metrics *metrics.Metrics
}

// tokens are the test credentials Identify accepts (Authorization: Bearer NAME).
var tokens = map[string]gate.Identity{
	"bob":   {Principal: "user:bob", AgentID: "triage"},
	"carol": {Principal: "user:carol", AgentID: "triage"},
	"alice": {Principal: "user:alice", AgentID: "mkt-agt-001", InstanceID: "acme", Environment: "staging"},
	// lead holds audit:read: it sees whole resolutions and real codes.
	"lead": {Principal: "user:lead", AgentID: "mkt-agt-001", InstanceID: "acme", Environment: "staging"},
}

func identify(r *http.Request) (gate.Identity, error) {
	tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok {
		return gate.Identity{}, errors.New("send Authorization: Bearer TOKEN")
	}
	id, ok := tokens[tok]
	if !ok {
		return gate.Identity{}, errors.New("unknown token")
	}
	return id, nil
}

func compile(t *testing.T) *authz.Snapshot {
	t.Helper()
	b, err := policy.LoadDir(bundleDir)
	if err != nil {
		t.Fatal(err)
	}
	snap, _, err := authz.Compile(b, nil)
	if err != nil {
		t.Fatal(err)
	}
	return snap
}

// newEnv starts a gateway; edit adjusts the API options (Audit and Metrics
// are set before it runs).
func newEnv(t *testing.T, edit func(*httpapi.Options)) *env {
	t.Helper()
	return newEnvFor(t, compile(t), edit)
}

// newEnvFor is newEnv deciding with snap.
func newEnvFor(t *testing.T, snap *authz.Snapshot, edit func(*httpapi.Options)) *env {
	t.Helper()
	e := &env{t: t, snap: snap, metrics: metrics.New(&metrics.Options{NoRuntimeCollectors: true})}
	st, err := sqlite.Open(filepath.Join(t.TempDir(), "toolgate.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	e.store = st
	e.rec = audit.NewRecorder(st, &audit.RecorderOptions{Sinks: []audit.Sink{e.metrics.AuditSink()}})
	e.g = gate.New(e.snap, &gate.Options{Recorder: e.rec, Approvals: st, AuditLog: st, Observer: e.metrics})
	opts := &httpapi.Options{Metrics: e.metrics.Handler()}
	if edit != nil {
		edit(opts)
	}
	e.srv = httptest.NewServer(httpapi.New(e.g, opts))
	t.Cleanup(func() {
		e.srv.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		e.rec.Close(ctx)
		st.Close()
	})
	return e
}

type response struct {
	status int
	header http.Header
	body   []byte
}

// do sends a request; body is JSON-encoded unless it is a string (sent as
// is) or nil. token, when set, is sent as a bearer credential.
func (e *env) do(method, path, token string, body any) response {
	e.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	default:
		j, err := json.Marshal(b)
		if err != nil {
			e.t.Fatal(err)
		}
		rd = bytes.NewReader(j)
	}
	req, err := http.NewRequest(method, e.srv.URL+path, rd)
	if err != nil {
		e.t.Fatal(err)
	}
	if rd != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := e.srv.Client().Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		e.t.Fatal(err)
	}
	return response{status: resp.StatusCode, header: resp.Header, body: b}
}

func decode[T any](t *testing.T, r response) T {
	t.Helper()
	var v T
	dec := json.NewDecoder(bytes.NewReader(r.body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("decode %T from %s: %v", v, r.body, err)
	}
	return v
}

func errorOf(t *testing.T, r response) httpapi.ErrorDetail {
	t.Helper()
	return decode[httpapi.ErrorBody](t, r).Error
}

// events flushes the recorder and returns every event in the log.
func (e *env) events() []audit.Event {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.rec.Flush(ctx); err != nil {
		e.t.Fatal(err)
	}
	evs, err := audit.ReadEvents(ctx, e.store, 1, 0)
	if err != nil {
		e.t.Fatal(err)
	}
	return evs
}

func TestHealthAndReady(t *testing.T) {
	tests := []struct {
		name       string
		ready      func() error
		path       string
		wantStatus int
		wantBody   string // exact for text, the error message for JSON
	}{
		{"healthz", nil, "/healthz", 200, "ok\n"},
		{"readyz with no check", nil, "/readyz", 200, "ok\n"},
		{"readyz ready", func() error { return nil }, "/readyz", 200, "ok\n"},
		{"readyz not ready", func() error { return errors.New("audit store: disk full") }, "/readyz", 503, "not ready: audit store: disk full"},
		{"healthz while not ready", func() error { return errors.New("down") }, "/healthz", 200, "ok\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, func(o *httpapi.Options) { o.Ready = tt.ready; o.Identify = identify })
			r := e.do("GET", tt.path, "", nil)
			if r.status != tt.wantStatus {
				t.Fatalf("status = %d; want %d (%s)", r.status, tt.wantStatus, r.body)
			}
			got := string(r.body)
			if r.status != 200 {
				got = errorOf(t, r).Message
			}
			if got != tt.wantBody {
				t.Errorf("body = %q; want %q", got, tt.wantBody)
			}
		})
	}
}

// TestReadyWhenAuditFails closes the database under a running gateway: the
// recorder's error makes /readyz 503, and an allow that cannot be recorded
// is refused (503, internal_error), never answered allow.
func TestReadyWhenAuditFails(t *testing.T) {
	e := newEnv(t, nil)
	e.store.Close()
	r := e.do("POST", "/v1/decide", "", map[string]any{"agent_id": "poc-agt-001", "tool": "searxng_search"})
	if r.status != http.StatusServiceUnavailable {
		t.Fatalf("decide with a closed audit store = %d %s; want 503", r.status, r.body)
	}
	env := decode[httpapi.Envelope](t, r)
	if env.Decision.Verdict != "deny" || env.Decision.Code != "internal_error" || env.Status != "failure" {
		t.Errorf("envelope = %+v; want a deny with code internal_error", env)
	}
	r = e.do("GET", "/readyz", "", nil)
	if r.status != http.StatusServiceUnavailable || errorOf(t, r).Code != "not_ready" {
		t.Errorf("readyz = %d %s; want 503 not_ready", r.status, r.body)
	}
	// The queued denial can never be written: give up at once.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	e.rec.Close(ctx)
}

// TestResolve checks that /v1/resolve answers exactly what
// toolgate resolve -o json prints.
func TestResolve(t *testing.T) {
	e := newEnv(t, nil)
	tests := []struct {
		name string
		body httpapi.IdentityFields
		args []string
	}{
		{"three layers", httpapi.IdentityFields{AgentID: "mkt-agt-001", InstanceID: "acme", Environment: "staging"},
			[]string{"--agent", "mkt-agt-001", "--instance", "acme", "--env", "staging"}},
		{"with a principal", httpapi.IdentityFields{AgentID: "triage", Principal: "user:bob"},
			[]string{"--agent", "triage", "--principal", "user:bob"}},
		{"development mode", httpapi.IdentityFields{AgentID: "mkt-agt-001", DeploymentMode: "development"},
			[]string{"--agent", "mkt-agt-001", "--mode", "development"}},
		{"unknown agent", httpapi.IdentityFields{AgentID: "nobody"}, []string{"--agent", "nobody"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := e.do("POST", "/v1/resolve", "", tt.body)
			if r.status != 200 {
				t.Fatalf("status %d: %s", r.status, r.body)
			}
			var stdout, stderr bytes.Buffer
			cli.Run(context.Background(), append([]string{"resolve", "--bundle", bundleDir, "-o", "json"}, tt.args...), nil, &stdout, &stderr)
			var want, got any
			if err := json.Unmarshal(stdout.Bytes(), &want); err != nil {
				t.Fatalf("CLI output %q: %v (stderr %s)", stdout.String(), err, stderr.String())
			}
			if err := json.Unmarshal(r.body, &got); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("/v1/resolve vs toolgate resolve -o json (-want +got):\n%s", diff)
			}
		})
	}
}

func TestDecide(t *testing.T) {
	e := newEnv(t, nil)
	tests := []struct {
		name       string
		body       map[string]any
		wantStatus int
		wantCode   string
		wantLayer  string
		approval   bool // an approval id is expected
	}{
		{"allow", map[string]any{"agent_id": "poc-agt-001", "tool": "searxng_search", "args": map[string]any{"q": "go"}},
			200, "ok", "", false},
		{"deny at the ceiling", map[string]any{"agent_id": "poc-agt-001", "tool": "supabase_write"},
			403, "not_in_ceiling", "ceiling", false},
		{"require approval", map[string]any{"agent_id": "triage", "principal": "user:bob", "tool": "payments_refund", "args": map[string]any{"amount": 200}},
			202, "approval_required", "approval", true},
		{"default principal lacks the grant", map[string]any{"agent_id": "triage", "tool": "github_list_issues"},
			403, "rbac_tool_invoke", "grant", false},
		{"resource permission", map[string]any{"agent_id": "verifier", "tool": "bifrost.query",
			"resources": []map[string]any{{"type": "bifrost_query", "name": "vala.billing.invoices", "action": "read"}}},
			403, "rbac_resource", "resource", false},
		{"duplicate argument keys are refused by the gate", map[string]any{"agent_id": "poc-agt-001", "tool": "searxng_search",
			"args": json.RawMessage(`{"q":"a","q":"b"}`)}, 403, "malformed_call", "composition", false},
		{"arguments that are not an object", map[string]any{"agent_id": "poc-agt-001", "tool": "searxng_search", "args": []int{1}},
			403, "malformed_call", "composition", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.body["correlation_id"] = "corr-" + strings.ReplaceAll(tt.name, " ", "-")
			r := e.do("POST", "/v1/decide", "", tt.body)
			if r.status != tt.wantStatus {
				t.Fatalf("status = %d; want %d: %s", r.status, tt.wantStatus, r.body)
			}
			var d httpapi.DecisionResponse
			if r.status == 200 {
				d = decode[httpapi.DecisionResponse](t, r)
			} else {
				env := decode[httpapi.Envelope](t, r)
				d = env.Decision
				wantCtx := httpapi.ExecutionContext{CorrelationID: tt.body["correlation_id"].(string), AgentID: tt.body["agent_id"].(string),
					Principal: e.principalOf(tt.body), ToolName: tt.body["tool"].(string)}
				if diff := cmp.Diff(wantCtx, env.ExecutionContext); diff != "" {
					t.Errorf("execution_context (-want +got):\n%s", diff)
				}
				if env.Status != "failure" || !cmp.Equal(env.Errors, []string{d.Reason}) {
					t.Errorf("envelope status %q errors %q; want failure and [reason]", env.Status, env.Errors)
				}
			}
			if d.Code != tt.wantCode || d.Layer != tt.wantLayer || d.CorrelationID != tt.body["correlation_id"] {
				t.Errorf("decision = %+v; want code %s layer %q", d, tt.wantCode, tt.wantLayer)
			}
			if (d.ApprovalID != "") != tt.approval || (d.ApprovalExpiresAt.IsZero() == tt.approval) {
				t.Errorf("approval_id %q expires %v; want one: %v", d.ApprovalID, d.ApprovalExpiresAt, tt.approval)
			}
		})
	}
	// Every decision is in the audit log, with via=http, and counted.
	evs := e.events()
	if len(evs) != len(tests) {
		t.Fatalf("audit log has %d events; want %d", len(evs), len(tests))
	}
	for i, ev := range evs {
		if ev.Code != tests[i].wantCode || ev.Details["via"] != "http" {
			t.Errorf("event %d = %s %s via %v; want code %s via http", i, ev.EventType, ev.Code, ev.Details["via"], tests[i].wantCode)
		}
	}
	r := e.do("GET", "/metrics", "", nil)
	for _, want := range []string{
		`toolgate_decisions_total{code="ok",layer="",verdict="allow",via="http"} 1`,
		`toolgate_decisions_total{code="malformed_call",layer="composition",verdict="deny",via="http"} 2`,
		`toolgate_decisions_total{code="approval_required",layer="approval",verdict="require_approval",via="http"} 1`,
		`toolgate_decision_duration_seconds_count{via="http"} 7`,
	} {
		if !strings.Contains(string(r.body), want+"\n") {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	// The audit sink counts committed events on its own goroutine, after
	// the commit Flush waited for: wait for it to catch up.
	want := `toolgate_audit_events_total{event_type="agent.tool.unauthorized"} 5` + "\n"
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		r = e.do("GET", "/metrics", "", nil)
		if strings.Contains(string(r.body), want) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/metrics lacks %s", want)
		}
	}
}

func (e *env) principalOf(body map[string]any) string {
	if p, ok := body["principal"].(string); ok {
		return p
	}
	return e.snap.Settings().DefaultPrincipal
}

func TestRequestErrors(t *testing.T) {
	e := newEnv(t, nil)
	big := `{"agent_id":"poc-agt-001","tool":"searxng_search","args":{"pad":"` + strings.Repeat("x", httpapi.MaxBodyBytes) + `"}}`
	tests := []struct {
		name        string
		method      string
		path        string
		contentType string // "" sends application/json when there is a body
		body        string
		wantStatus  int
		wantCode    string
		wantMessage string // substring
	}{
		{"unknown field", "POST", "/v1/decide", "", `{"agent_id":"a","tool":"t","tol":"x"}`, 400, "unknown_field", `unknown field "tol"`},
		{"unknown field in a resource", "POST", "/v1/decide", "", `{"agent_id":"a","tool":"t","resources":[{"type":"x","name":"y","verb":"z"}]}`, 400, "unknown_field", `"verb"`},
		{"malformed JSON", "POST", "/v1/decide", "", `{"agent_id":}`, 400, "malformed_json", "malformed JSON at byte"},
		{"truncated JSON", "POST", "/v1/decide", "", `{"agent_id":"a"`, 400, "malformed_json", "ends in the middle"},
		{"two values", "POST", "/v1/decide", "", `{"agent_id":"a","tool":"t"} {}`, 400, "malformed_json", "more than one JSON value"},
		{"trailing garbage", "POST", "/v1/decide", "", `{"agent_id":"a","tool":"t"} x`, 400, "malformed_json", "malformed JSON"},
		{"empty body", "POST", "/v1/decide", "", ``, 400, "malformed_json", "empty"},
		// Members encoding/json would fold into one field are refused.
		{"a member twice", "POST", "/v1/decide", "", `{"agent_id":"a","tool":"t","tool":"u"}`, 400, "malformed_json", `names "tool" twice`},
		{"members differing by case", "POST", "/v1/decide", "", `{"agent_id":"a","tool":"t","Tool":"u"}`, 400, "malformed_json", "differ only by case"},
		{"arguments differing by case", "POST", "/v1/tools/call", "", `{"agent_id":"a","tool":"t","arguments":{"a":1},"Arguments":{"a":2}}`, 400, "malformed_json", "differ only by case"},
		{"an identity field twice", "POST", "/v1/decide", "", `{"agent_id":"a","AGENT_ID":"b","tool":"t"}`, 400, "malformed_json", "differ only by case"},
		{"args and arguments", "POST", "/v1/decide", "", `{"agent_id":"a","tool":"t","args":{},"arguments":{}}`, 400, "bad_request", "as args or as arguments"},
		{"an array body", "POST", "/v1/decide", "", `[1]`, 400, "bad_request", "must be a JSON object, not an array"},
		{"wrong field type", "POST", "/v1/decide", "", `{"agent_id":5,"tool":"t"}`, 400, "bad_request", "field agent_id must be a string, not a number"},
		{"too large", "POST", "/v1/decide", "", big, 413, "body_too_large", "larger than 1048576 bytes"},
		{"no content type", "POST", "/v1/decide", "none", `{}`, 415, "unsupported_media_type", "Content-Type: application/json"},
		{"form content type", "POST", "/v1/decide", "application/x-www-form-urlencoded", `a=b`, 415, "unsupported_media_type", "application/x-www-form-urlencoded"},
		{"json with charset", "POST", "/v1/decide", "application/json; charset=utf-8", `{"agent_id":"a"}`, 400, "bad_request", "tool is required"},
		{"missing agent", "POST", "/v1/decide", "", `{"tool":"t"}`, 400, "bad_request", "agent_id is required"},
		{"missing agent in resolve", "POST", "/v1/resolve", "", `{}`, 400, "bad_request", "agent_id is required"},
		{"wrong method", "GET", "/v1/decide", "", ``, 405, "method_not_allowed", "use POST"},
		{"unknown route", "GET", "/v2/decide", "", ``, 404, "not_found", "no route GET /v2/decide"},
		{"bad approval status", "GET", "/v1/approvals?status=maybe", "", ``, 400, "bad_request", `status="maybe"`},
		{"bad limit", "GET", "/v1/approvals?limit=0", "", ``, 400, "bad_request", `limit="0"`},
		{"bad from", "GET", "/v1/audit?from=-1", "", ``, 400, "bad_request", `from="-1"`},
		{"limit too big", "GET", "/v1/audit?limit=5000", "", ``, 400, "bad_request", "from 1 to 1000"},
		{"approve without authentication", "POST", "/v1/approvals/apr_nope/approve", "", `{}`, 403, "no_identity", "cannot tell who approves"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, err := http.NewRequest(tt.method, e.srv.URL+tt.path, strings.NewReader(tt.body))
			if err != nil {
				t.Fatal(err)
			}
			switch tt.contentType {
			case "":
				req.Header.Set("Content-Type", "application/json")
			case "none":
			default:
				req.Header.Set("Content-Type", tt.contentType)
			}
			resp, err := e.srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			r := response{status: resp.StatusCode, header: resp.Header, body: b}
			if r.status != tt.wantStatus {
				t.Fatalf("status = %d; want %d: %s", r.status, tt.wantStatus, r.body)
			}
			if ct := r.header.Get("Content-Type"); ct != "application/json; charset=utf-8" {
				t.Errorf("Content-Type = %q", ct)
			}
			got := errorOf(t, r)
			if got.Code != tt.wantCode || !strings.Contains(got.Message, tt.wantMessage) {
				t.Errorf("error = %+v; want code %s and a message containing %q", got, tt.wantCode, tt.wantMessage)
			}
			if tt.wantStatus == 405 && r.header.Get("Allow") != "POST" {
				t.Errorf("Allow = %q; want POST", r.header.Get("Allow"))
			}
		})
	}
	if evs := e.events(); len(evs) != 0 {
		t.Errorf("refused requests reached the gate: %d events recorded", len(evs))
	}
}

func TestIdentify(t *testing.T) {
	e := newEnv(t, func(o *httpapi.Options) { o.Identify = identify })
	tests := []struct {
		name       string
		token      string
		path       string
		body       map[string]any
		wantStatus int
		wantCode   string // error code, or the decision code
	}{
		{"no credential", "", "/v1/decide", map[string]any{"tool": "github_list_issues"}, 401, "unauthenticated"},
		{"unknown credential", "mallory", "/v1/decide", map[string]any{"tool": "github_list_issues"}, 401, "unauthenticated"},
		{"no credential for the audit log", "", "/v1/audit", nil, 401, "unauthenticated"},
		{"no credential for approvals", "", "/v1/approvals", nil, 401, "unauthenticated"},
		{"identity decides", "bob", "/v1/decide", map[string]any{"tool": "github_list_issues"}, 200, "ok"},
		{"body repeats the identity", "bob", "/v1/decide",
			map[string]any{"agent_id": "triage", "principal": "user:bob", "deployment_mode": "production", "tool": "github_list_issues"}, 200, "ok"},
		{"body names another principal", "bob", "/v1/decide", map[string]any{"principal": "user:alice", "tool": "github_list_issues"}, 403, "identity_mismatch"},
		{"body names another agent", "bob", "/v1/decide", map[string]any{"agent_id": "verifier", "tool": "github_list_issues"}, 403, "identity_mismatch"},
		{"body names an instance the identity lacks", "bob", "/v1/decide", map[string]any{"instance_id": "acme", "tool": "github_list_issues"}, 403, "identity_mismatch"},
		{"body names another mode", "bob", "/v1/resolve", map[string]any{"deployment_mode": "development"}, 403, "identity_mismatch"},
		{"resolve by identity", "alice", "/v1/resolve", map[string]any{}, 200, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			method := "POST"
			var body any = tt.body
			if tt.body == nil {
				method, body = "GET", nil
			}
			r := e.do(method, tt.path, tt.token, body)
			if r.status != tt.wantStatus {
				t.Fatalf("status = %d; want %d: %s", r.status, tt.wantStatus, r.body)
			}
			switch {
			case r.status >= 400:
				if got := errorOf(t, r).Code; got != tt.wantCode {
					t.Errorf("error code = %s; want %s", got, tt.wantCode)
				}
			case tt.path == "/v1/decide":
				if got := decode[httpapi.DecisionResponse](t, r).Code; got != tt.wantCode {
					t.Errorf("decision code = %s; want %s", got, tt.wantCode)
				}
			}
		})
	}
	// The resolution is the identity's, instance and environment included,
	// cut down to the tools it may see: nothing of the others, not even
	// which layer removed them.
	r := e.do("POST", "/v1/resolve", "alice", map[string]any{})
	got := decode[authz.Resolution](t, r)
	full := e.snap.Resolve(tokens["alice"].Context())
	if len(full.Removed) == 0 {
		t.Fatal("the fixture removes no tool for alice; the test needs one")
	}
	want := full
	want.ActiveToolSet, want.Authorized, want.Removed = nil, nil, []authz.Removal{}
	want.Tools = nil
	shown := map[string]bool{}
	for _, id := range full.Disclosed {
		shown[id] = true
	}
	for _, id := range full.ActiveToolSet {
		if shown[id] {
			want.ActiveToolSet = append(want.ActiveToolSet, id)
		}
	}
	for _, id := range full.Authorized {
		if shown[id] {
			want.Authorized = append(want.Authorized, id)
		}
	}
	for _, ts := range full.Tools {
		if shown[ts.ToolID] {
			want.Tools = append(want.Tools, ts)
		}
	}
	if diff := cmp.Diff(want, got, cmpopts.EquateEmpty()); diff != "" {
		t.Errorf("resolution (-want +got):\n%s", diff)
	}
	// Two decisions reached the gate, both as bob.
	evs := e.events()
	if len(evs) != 2 {
		t.Fatalf("%d events; want 2", len(evs))
	}
	for _, ev := range evs {
		if ev.Principal != "user:bob" || ev.AgentID != "triage" {
			t.Errorf("event as %s/%s; want user:bob/triage", ev.Principal, ev.AgentID)
		}
	}
}

// TestApprovalFlow runs a call through approval: bob's refund needs a
// human, bob cannot approve it himself, carol approves, bob's repeated call
// is allowed once, and the next one asks again; carol denies that one.
func TestApprovalFlow(t *testing.T) {
	e := newEnv(t, func(o *httpapi.Options) { o.Identify = identify })
	refund := map[string]any{"tool": "payments_refund", "args": map[string]any{"amount": 200}}

	r := e.do("POST", "/v1/decide", "bob", refund)
	if r.status != http.StatusAccepted {
		t.Fatalf("first refund = %d %s; want 202", r.status, r.body)
	}
	first := decode[httpapi.Envelope](t, r).Decision.ApprovalID

	r = e.do("GET", "/v1/approvals", "carol", nil)
	list := decode[httpapi.ApprovalList](t, r).Approvals
	if len(list) != 1 || list[0].ID != first || list[0].Status != approval.StatusPending || list[0].RequestedBy != "user:bob" {
		t.Fatalf("pending approvals = %+v; want %s pending, requested by user:bob", list, first)
	}
	if string(list[0].Args) != `{"amount":200}` || list[0].ToolName != "payments_refund" {
		t.Errorf("approval shows args %s tool %s", list[0].Args, list[0].ToolName)
	}

	steps := []struct {
		name        string
		token       string
		path        string
		body        any
		wantStatus  int
		wantCode    string
		wantStatus2 approval.Status
	}{
		{"the requester cannot approve", "bob", "/v1/approvals/" + first + "/approve", map[string]any{"reason": "mine"}, 403, "self_approval", ""},
		{"unknown field in the reason", "carol", "/v1/approvals/" + first + "/approve", map[string]any{"why": "x"}, 400, "unknown_field", ""},
		{"unknown approval", "carol", "/v1/approvals/apr_NOPE/approve", map[string]any{}, 404, "not_found", ""},
		{"no body at all (the reason is optional)", "carol", "/v1/approvals/apr_NOPE/approve", nil, 404, "not_found", ""},
		{"carol approves", "carol", "/v1/approvals/" + first + "/approve", map[string]any{"reason": "refund ok"}, 200, "", approval.StatusApproved},
		{"approved twice", "carol", "/v1/approvals/" + first + "/deny", map[string]any{}, 409, "approval_not_pending", ""},
	}
	for _, s := range steps {
		r := e.do("POST", s.path, s.token, s.body)
		if r.status != s.wantStatus {
			t.Fatalf("%s: status = %d; want %d: %s", s.name, r.status, s.wantStatus, r.body)
		}
		if s.wantCode != "" {
			if got := errorOf(t, r).Code; got != s.wantCode {
				t.Errorf("%s: code = %s; want %s", s.name, got, s.wantCode)
			}
			continue
		}
		a := decode[approval.Approval](t, r)
		if a.Status != s.wantStatus2 || a.DecidedBy != "user:carol" || a.Reason != "refund ok" {
			t.Errorf("%s: approval = %+v", s.name, a)
		}
	}

	// The same call is now allowed, once.
	r = e.do("POST", "/v1/decide", "bob", refund)
	if r.status != 200 {
		t.Fatalf("approved refund = %d %s; want 200", r.status, r.body)
	}
	if d := decode[httpapi.DecisionResponse](t, r); d.ApprovalID != first || d.Verdict != "allow" {
		t.Errorf("approved refund decision = %+v; want allow with %s", d, first)
	}
	r = e.do("POST", "/v1/decide", "bob", refund)
	if r.status != http.StatusAccepted {
		t.Fatalf("refund after the approval was used = %d %s; want 202", r.status, r.body)
	}
	second := decode[httpapi.Envelope](t, r).Decision.ApprovalID
	if second == "" || second == first {
		t.Fatalf("second approval id %q", second)
	}
	r = e.do("POST", "/v1/approvals/"+second+"/deny", "carol", "")
	if r.status != 200 || decode[approval.Approval](t, r).Status != approval.StatusDenied {
		t.Fatalf("deny with an empty body = %d %s", r.status, r.body)
	}

	r = e.do("GET", "/v1/approvals?status=all", "carol", nil)
	var got []approval.Status
	for _, a := range decode[httpapi.ApprovalList](t, r).Approvals {
		got = append(got, a.Status)
	}
	if diff := cmp.Diff([]approval.Status{approval.StatusUsed, approval.StatusDenied}, got); diff != "" {
		t.Errorf("all approvals' statuses (-want +got):\n%s", diff)
	}
	r = e.do("GET", "/v1/approvals?status=used,denied&limit=1", "carol", nil)
	if l := decode[httpapi.ApprovalList](t, r).Approvals; len(l) != 1 || l[0].ID != first {
		t.Errorf("status=used,denied&limit=1 = %+v; want %s", l, first)
	}

	// The audit log tells the story, via the API.
	e.events() // flush
	r = e.do("GET", "/v1/audit", "carol", nil)
	page := decode[httpapi.AuditPage](t, r)
	type row struct{ Type, Approval, DecidedBy string }
	var rows []row
	for _, ev := range page.Events {
		by, _ := ev.Details["decided_by"].(string)
		rows = append(rows, row{ev.EventType, ev.ApprovalID, by})
	}
	want := []row{
		{"agent.tool.approval_requested", first, ""},
		{"agent.tool.approval_decision_refused", first, ""}, // bob tried to approve his own call
		{"agent.tool.approval_granted", first, "user:carol"},
		{"agent.tool.approval_decision_refused", first, ""}, // approving it twice
		{"agent.tool.authorized", first, ""},
		{"agent.tool.approval_requested", second, ""},
		{"agent.tool.approval_denied", second, "user:carol"},
	}
	if diff := cmp.Diff(want, rows); diff != "" {
		t.Errorf("audit log (-want +got):\n%s", diff)
	}
	if page.NextFrom != int64(len(want)+1) {
		t.Errorf("next_from = %d; want %d", page.NextFrom, len(want)+1)
	}
	if rep, err := audit.Verify(context.Background(), e.store); err != nil || !rep.OK {
		t.Errorf("Verify = %+v, %v", rep, err)
	}
}

func TestAuditPaging(t *testing.T) {
	e := newEnv(t, nil)
	for range 5 {
		e.do("POST", "/v1/decide", "", map[string]any{"agent_id": "poc-agt-001", "tool": "searxng_search"})
	}
	e.events()
	tests := []struct {
		query    string
		wantSeqs []int64
		wantNext int64
	}{
		{"", []int64{1, 2, 3, 4, 5}, 6},
		{"?limit=2", []int64{1, 2}, 3},
		{"?from=3&limit=2", []int64{3, 4}, 5},
		{"?from=5", []int64{5}, 6},
		{"?from=9", nil, 9},
	}
	for _, tt := range tests {
		t.Run(tt.query, func(t *testing.T) {
			r := e.do("GET", "/v1/audit"+tt.query, "", nil)
			page := decode[httpapi.AuditPage](t, r)
			var seqs []int64
			for _, ev := range page.Events {
				seqs = append(seqs, ev.Seq)
			}
			if diff := cmp.Diff(tt.wantSeqs, seqs); diff != "" || page.NextFrom != tt.wantNext {
				t.Errorf("seqs (-want +got):\n%s next_from %d; want %d", diff, page.NextFrom, tt.wantNext)
			}
		})
	}
}

// TestNoStores checks the answers of a gateway with neither an audit store
// for the API nor an approval store, and without metrics.
func TestNoStores(t *testing.T) {
	g := gate.New(compile(t), nil)
	srv := httptest.NewServer(httpapi.New(g, nil))
	defer srv.Close()
	e := &env{t: t, srv: srv}
	tests := []struct {
		method, path string
		wantStatus   int
		wantCode     string
	}{
		{"GET", "/v1/audit", 501, "no_audit_store"},
		{"GET", "/v1/approvals", 501, "no_approval_store"},
		{"GET", "/metrics", 404, "not_found"},
	}
	for _, tt := range tests {
		r := e.do(tt.method, tt.path, "", nil)
		if r.status != tt.wantStatus || errorOf(t, r).Code != tt.wantCode {
			t.Errorf("%s %s = %d %s; want %d %s", tt.method, tt.path, r.status, r.body, tt.wantStatus, tt.wantCode)
		}
	}
	// A call that needs approval is still refused as such (202), without
	// an approval id.
	r := e.do("POST", "/v1/decide", "", map[string]any{"agent_id": "triage", "principal": "user:bob", "tool": "payments_refund", "args": map[string]any{"amount": 200}})
	if d := decode[httpapi.Envelope](t, r).Decision; r.status != 202 || d.ApprovalID != "" || !strings.Contains(d.Reason, "no approval store") {
		t.Errorf("decide without an approval store = %d %+v", r.status, d)
	}
}

func TestClassify(t *testing.T) {
	tests := []struct {
		name       string
		err        error
		wantStatus int
		wantCode   string
	}{
		{"api error", &httpapi.Error{Status: 418, Code: "teapot", Message: "short and stout"}, 418, "teapot"},
		{"wrapped api error", errors.Join(errors.New("x"), &httpapi.Error{Status: 409, Code: "c"}), 409, "c"},
		{"not found", approval.ErrNotFound, 404, "not_found"},
		{"not pending", approval.ErrNotPending, 409, "approval_not_pending"},
		{"expired", approval.ErrExpired, 409, "approval_expired"},
		{"invalid", approval.ErrInvalid, 400, "bad_request"},
		{"self approval", gate.ErrSelfApproval, 403, "self_approval"},
		{"audit unavailable", gate.ErrAuditUnavailable, 503, "audit_unavailable"},
		{"canceled", context.Canceled, 503, "canceled"},
		{"anything else", errors.New("disk on fire at /var/lib/x"), 500, "internal_error"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := httpapi.Classify(tt.err)
			if got.Status != tt.wantStatus || got.Code != tt.wantCode {
				t.Errorf("Classify(%v) = %d %s; want %d %s", tt.err, got.Status, got.Code, tt.wantStatus, tt.wantCode)
			}
			if tt.wantCode == "internal_error" && strings.Contains(got.Message, "/var/lib") {
				t.Errorf("internal error detail leaks to the client: %q", got.Message)
			}
		})
	}
}

// TestHiddenToolsLookUnknown: over the JSON API, as over MCP, a caller
// learns nothing of a tool it cannot see: /v1/decide and /v1/tools/call
// answer it exactly like a tool that does not exist, and /v1/resolve lists
// only the disclosed tools. The audit log keeps the real decision, and a
// principal holding audit:read (who can read that log) gets it as it is.
func TestHiddenToolsLookUnknown(t *testing.T) {
	e := newEnv(t, func(o *httpapi.Options) { o.Identify = identify })
	full := e.snap.Resolve(tokens["alice"].Context())
	if len(full.Removed) == 0 || full.Removed[0].ToolID == "" {
		t.Fatalf("the fixture removes no tool for alice: %+v", full.Removed)
	}
	hidden := full.Removed[0]
	name := hidden.ToolID // any spelling: the id itself
	answer := func(token, path, tool string) (int, httpapi.DecisionResponse) {
		t.Helper()
		body := map[string]any{"tool": tool, "args": map[string]any{}}
		if path == "/v1/tools/call" {
			body = map[string]any{"tool": tool, "arguments": map[string]any{}}
		}
		r := e.do("POST", path, token, body)
		var env struct {
			httpapi.DecisionResponse
			Decision httpapi.DecisionResponse `json:"decision"`
		}
		if err := json.Unmarshal(r.body, &env); err != nil {
			t.Fatalf("%s: %s", path, r.body)
		}
		if env.Decision.Code != "" {
			return r.status, env.Decision
		}
		return r.status, env.DecisionResponse
	}
	for _, path := range []string{"/v1/decide", "/v1/tools/call"} {
		hs, hd := answer("alice", path, name)
		us, ud := answer("alice", path, "tool:no-such-tool")
		if hd.Code != "unknown_tool" || hd.ToolID != "" || hs != us || ud.Code != "unknown_tool" {
			t.Errorf("%s: hidden %d %+v; unknown %d %+v; want both unknown_tool with no tool id", path, hs, hd, us, ud)
		}
		if strings.ReplaceAll(hd.Reason, name, "X") != strings.ReplaceAll(ud.Reason, "tool:no-such-tool", "X") {
			t.Errorf("%s: the reasons differ beyond the name: %q vs %q", path, hd.Reason, ud.Reason)
		}
		if _, ld := answer("lead", path, name); ld.Code == "unknown_tool" || ld.ToolID != hidden.ToolID {
			t.Errorf("%s: an auditor got %+v, want the real decision", path, ld)
		}
	}
	// The audit log has what was decided for alice.
	var codes []string
	for _, ev := range e.events() {
		if ev.Principal == "user:alice" && ev.ToolName == name {
			codes = append(codes, ev.Code)
		}
	}
	if len(codes) != 2 || codes[0] != string(hidden.Code) || codes[1] != string(hidden.Code) {
		t.Errorf("audit codes %v, want %s twice", codes, hidden.Code)
	}
	// /v1/resolve: the auditor gets the whole resolution.
	if got := decode[authz.Resolution](t, e.do("POST", "/v1/resolve", "lead", map[string]any{})); len(got.Removed) == 0 {
		t.Errorf("an auditor's resolution lists no removed tool")
	}
	if got := decode[authz.Resolution](t, e.do("POST", "/v1/resolve", "alice", map[string]any{})); len(got.Removed) != 0 {
		t.Errorf("alice's resolution names removed tools: %+v", got.Removed)
	}
}

// TestSlowBodies: a client cannot hold a connection by sending its body
// slowly or never: without a credential it gets 401 at once (the body
// unread, the connection closed); with one, a body that does not arrive
// within BodyReadTimeout gets 408.
func TestSlowBodies(t *testing.T) {
	defer func(d time.Duration) { httpapi.BodyReadTimeout = d }(httpapi.BodyReadTimeout)
	httpapi.BodyReadTimeout = 500 * time.Millisecond
	e := newEnv(t, func(o *httpapi.Options) { o.Identify = identify })
	host := strings.TrimPrefix(e.srv.URL, "http://")
	for _, tc := range []struct{ name, auth, status string }{
		{"no credential", "", "401"},
		{"a credential", "Authorization: Bearer bob\r\n", "408"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conn, err := net.Dial("tcp", host)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			fmt.Fprintf(conn, "POST /v1/decide HTTP/1.1\r\nHost: %s\r\n%sContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{", host, tc.auth)
			conn.SetReadDeadline(time.Now().Add(10 * time.Second))
			start := time.Now()
			line, err := bufio.NewReader(conn).ReadString('\n')
			if err != nil || !strings.Contains(line, " "+tc.status+" ") {
				t.Fatalf("after %v: %q %v, want HTTP %s", time.Since(start), line, err, tc.status)
			}
		})
	}
}
