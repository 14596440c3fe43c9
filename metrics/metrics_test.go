package metrics_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/toolgate/toolgate"
	"github.com/toolgate/toolgate/audit"
	"github.com/toolgate/toolgate/metrics"
)

// scrape returns the lines of m's exposition that start with one of the
// toolgate_ metric names (comments and other collectors left out).
func scrape(t *testing.T, m *metrics.Metrics) []string {
	t.Helper()
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("GET /metrics = %d: %s", rec.Code, rec.Body)
	}
	var out []string
	for line := range strings.Lines(rec.Body.String()) {
		line = strings.TrimSuffix(line, "\n")
		if strings.HasPrefix(line, "toolgate_") {
			out = append(out, line)
		}
	}
	return out
}

// pick returns the lines of all that start with prefix.
func pick(all []string, prefix string) []string {
	var out []string
	for _, l := range all {
		if strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return out
}

func TestMetrics(t *testing.T) {
	allow := toolgate.Decision{Verdict: toolgate.Allow, Code: toolgate.CodeOK}
	deny := toolgate.Decision{Verdict: toolgate.Deny, Code: toolgate.CodeNotInCeiling, Layer: toolgate.LayerCeiling}
	approve := toolgate.Decision{Verdict: toolgate.RequireApproval, Code: toolgate.CodeApprovalRequired, Layer: toolgate.LayerApproval}

	tests := []struct {
		name    string
		observe func(m *metrics.Metrics)
		prefix  string
		want    []string
	}{
		{
			name: "decisions by verdict, code, layer and via",
			observe: func(m *metrics.Metrics) {
				m.Decision("http", allow, 40*time.Microsecond)
				m.Decision("http", allow, 3*time.Millisecond)
				m.Decision("mcp", deny, time.Microsecond)
				m.Decision("mcp", approve, time.Microsecond)
			},
			prefix: "toolgate_decisions_total",
			want: []string{
				`toolgate_decisions_total{code="approval_required",layer="approval",verdict="require_approval",via="mcp"} 1`,
				`toolgate_decisions_total{code="not_in_ceiling",layer="ceiling",verdict="deny",via="mcp"} 1`,
				`toolgate_decisions_total{code="ok",layer="",verdict="allow",via="http"} 2`,
			},
		},
		{
			name: "decision duration buckets from 10µs to 1s",
			observe: func(m *metrics.Metrics) {
				m.Decision("http", allow, 40*time.Microsecond)
				m.Decision("http", allow, 3*time.Millisecond)
				m.Decision("http", allow, 2*time.Second)
			},
			prefix: `toolgate_decision_duration_seconds_bucket{via="http",le="`,
			want: []string{
				`toolgate_decision_duration_seconds_bucket{via="http",le="1e-05"} 0`,
				`toolgate_decision_duration_seconds_bucket{via="http",le="2.5e-05"} 0`,
				`toolgate_decision_duration_seconds_bucket{via="http",le="5e-05"} 1`,
				`toolgate_decision_duration_seconds_bucket{via="http",le="0.0001"} 1`,
				`toolgate_decision_duration_seconds_bucket{via="http",le="0.00025"} 1`,
				`toolgate_decision_duration_seconds_bucket{via="http",le="0.0005"} 1`,
				`toolgate_decision_duration_seconds_bucket{via="http",le="0.001"} 1`,
				`toolgate_decision_duration_seconds_bucket{via="http",le="0.0025"} 1`,
				`toolgate_decision_duration_seconds_bucket{via="http",le="0.005"} 2`,
				`toolgate_decision_duration_seconds_bucket{via="http",le="0.01"} 2`,
				`toolgate_decision_duration_seconds_bucket{via="http",le="0.025"} 2`,
				`toolgate_decision_duration_seconds_bucket{via="http",le="0.05"} 2`,
				`toolgate_decision_duration_seconds_bucket{via="http",le="0.1"} 2`,
				`toolgate_decision_duration_seconds_bucket{via="http",le="0.25"} 2`,
				`toolgate_decision_duration_seconds_bucket{via="http",le="0.5"} 2`,
				`toolgate_decision_duration_seconds_bucket{via="http",le="1"} 2`,
				`toolgate_decision_duration_seconds_bucket{via="http",le="+Inf"} 3`,
			},
		},
		{
			name: "upstream calls and health",
			observe: func(m *metrics.Metrics) {
				m.UpstreamCall("github", metrics.OutcomeOK, 20*time.Millisecond)
				m.UpstreamCall("github", metrics.OutcomeError, 31*time.Second)
				m.SetUpstreamUp("github", true)
				m.SetUpstreamUp("files", false)
			},
			prefix: "toolgate_upstream_",
			want: []string{
				`toolgate_upstream_call_duration_seconds_sum{outcome="error",upstream="github"} 31`,
				`toolgate_upstream_call_duration_seconds_count{outcome="error",upstream="github"} 1`,
				`toolgate_upstream_call_duration_seconds_sum{outcome="ok",upstream="github"} 0.02`,
				`toolgate_upstream_call_duration_seconds_count{outcome="ok",upstream="github"} 1`,
				`toolgate_upstream_up{upstream="files"} 0`,
				`toolgate_upstream_up{upstream="github"} 1`,
			},
		},
		{
			name: "declared upstreams start at zero; restarts and refusals count",
			observe: func(m *metrics.Metrics) {
				m.DeclareUpstream("files")
				m.DeclareUpstream("github")
				m.SetUpstreamUp("github", true)
				m.UpstreamRestart("github")
				m.UpstreamRestart("github")
				m.UpstreamRefused("github", "too_large")
				m.UpstreamRefused("files", "malformed")
			},
			prefix: "toolgate_upstream_",
			want: []string{
				`toolgate_upstream_messages_refused_total{reason="malformed",upstream="files"} 1`,
				`toolgate_upstream_messages_refused_total{reason="malformed",upstream="github"} 0`,
				`toolgate_upstream_messages_refused_total{reason="too_large",upstream="files"} 0`,
				`toolgate_upstream_messages_refused_total{reason="too_large",upstream="github"} 1`,
				`toolgate_upstream_restarts_total{upstream="files"} 0`,
				`toolgate_upstream_restarts_total{upstream="github"} 2`,
				`toolgate_upstream_up{upstream="files"} 0`,
				`toolgate_upstream_up{upstream="github"} 1`,
			},
		},
		{
			name: "audit events through the sink",
			observe: func(m *metrics.Metrics) {
				s := m.AuditSink()
				_ = s.Write(context.Background(), []audit.Event{{EventType: "agent.tool.authorized"}, {EventType: "agent.tool.unauthorized"}})
				_ = s.Write(context.Background(), []audit.Event{{EventType: "agent.tool.authorized"}})
			},
			prefix: "toolgate_audit_events_total",
			want: []string{
				`toolgate_audit_events_total{event_type="agent.tool.authorized"} 2`,
				`toolgate_audit_events_total{event_type="agent.tool.unauthorized"} 1`,
			},
		},
		{
			name: "bundle reloads and generation",
			observe: func(m *metrics.Metrics) {
				m.BundleLoaded(1)
				m.BundleRejected()
				m.BundleLoaded(2)
				m.BundleRejected()
			},
			prefix: "toolgate_bundle_",
			want: []string{
				`toolgate_bundle_generation 2`,
				`toolgate_bundle_reloads_total{result="loaded"} 2`,
				`toolgate_bundle_reloads_total{result="rejected"} 2`,
			},
		},
		{
			name:    "reload results start at zero",
			observe: func(m *metrics.Metrics) {},
			prefix:  "toolgate_bundle_",
			want: []string{
				`toolgate_bundle_generation 0`,
				`toolgate_bundle_reloads_total{result="loaded"} 0`,
				`toolgate_bundle_reloads_total{result="rejected"} 0`,
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := metrics.New(&metrics.Options{NoRuntimeCollectors: true})
			tt.observe(m)
			got := pick(scrape(t, m), tt.prefix)
			if tt.prefix == "toolgate_upstream_" {
				// Buckets are checked by the decision case; keep sums, counts, gauges.
				got = dropBuckets(got)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("exposition (-want +got):\n%s", diff)
			}
		})
	}
}

func dropBuckets(lines []string) []string {
	var out []string
	for _, l := range lines {
		if !strings.Contains(l, "_bucket{") {
			out = append(out, l)
		}
	}
	return out
}

// TestOwnRegistry checks that two Metrics in one process do not collide
// (nothing is on the default registry) and that the runtime collectors are
// there by default.
func TestOwnRegistry(t *testing.T) {
	a, b := metrics.New(nil), metrics.New(nil)
	a.BundleLoaded(7)
	if got := pick(scrape(t, b), "toolgate_bundle_generation"); !cmp.Equal(got, []string{"toolgate_bundle_generation 0"}) {
		t.Errorf("second Metrics sees the first's gauge: %q", got)
	}
	srv := httptest.NewServer(a.Handler())
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{"go_goroutines ", "process_", "toolgate_bundle_generation 7"} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

// TestNil checks that every method is a no-op on a nil *Metrics.
func TestNil(t *testing.T) {
	var m *metrics.Metrics
	m.Decision("http", toolgate.Decision{}, time.Millisecond)
	m.UpstreamCall("x", metrics.OutcomeOK, time.Millisecond)
	m.SetUpstreamUp("x", true)
	m.DeclareUpstream("x")
	m.UpstreamRestart("x")
	m.UpstreamRefused("x", "malformed")
	m.ToolsCallPath("fast")
	m.CountAuditEvents([]audit.Event{{EventType: "x"}})
	if err := m.AuditSink().Write(context.Background(), []audit.Event{{EventType: "x"}}); err != nil {
		t.Errorf("nil sink Write = %v", err)
	}
	m.BundleLoaded(1)
	m.BundleRejected()
	if m.Registry() != nil {
		t.Error("nil Registry() is not nil")
	}
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if rec.Code != http.StatusNotFound {
		t.Errorf("nil Handler = %d; want 404", rec.Code)
	}
}
