// Package metrics exposes what the gateway is doing as Prometheus metrics:
// decisions by verdict, code, layer and enforcement point, how long they
// take, upstream calls, health, restarts and refused messages, audit events
// written, and policy bundle reloads. Operators alert on these (a rise in internal_error denials, an
// upstream down, a bundle rejected) without reading the audit log.
//
// A Metrics owns its own prometheus.Registry; nothing is registered on the
// process-wide default registry, so several gateways (or tests) in one
// process never collide. Every method is safe for concurrent use, and safe
// on a nil *Metrics (it does nothing), so callers need not check whether
// metrics are enabled.
package metrics

import (
	"context"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/toolgate/toolgate"
	"github.com/toolgate/toolgate/audit"
)

// Metric names, as they appear on /metrics.
const (
	DecisionsTotal       = "toolgate_decisions_total"
	DecisionDuration     = "toolgate_decision_duration_seconds"
	UpstreamCallDuration = "toolgate_upstream_call_duration_seconds"
	UpstreamUp           = "toolgate_upstream_up"
	// UpstreamRestartsTotal counts connection attempts to an upstream
	// after its first one (a restart after a crash, a lost session or a
	// failed attempt).
	UpstreamRestartsTotal = "toolgate_upstream_restarts_total"
	// UpstreamMessagesRefusedTotal counts messages from an upstream that
	// the gateway refused, by reason (too_large, malformed); the session
	// stays up.
	UpstreamMessagesRefusedTotal = "toolgate_upstream_messages_refused_total"
	AuditEventsTotal             = "toolgate_audit_events_total"
	BundleGeneration             = "toolgate_bundle_generation"
	BundleReloadsTotal           = "toolgate_bundle_reloads_total"
	// ToolsCallPathTotal counts MCP tools/call requests by the path that
	// served them: fast (the gateway's own JSON-RPC handling) or sdk.
	ToolsCallPathTotal = "toolgate_mcp_tools_call_path_total"
)

// Upstream call outcomes for UpstreamCall: the call returned a result
// (OutcomeOK), returned a tool error result (OutcomeToolError), or could not
// be made, failed in transport or timed out (OutcomeError).
const (
	OutcomeOK        = "ok"
	OutcomeToolError = "tool_error"
	OutcomeError     = "error"
)

// Values of the result label of toolgate_bundle_reloads_total.
const (
	reloadResultLoaded   = "loaded"
	reloadResultRejected = "rejected"
)

// DecisionBuckets are the upper bounds, in seconds, of the decision
// duration histogram: 10 µs to 1 s. A decision from the compiled snapshot
// takes microseconds; one that waits for the audit log's group commit takes
// about one fsync (milliseconds).
var DecisionBuckets = []float64{
	10e-6, 25e-6, 50e-6, 100e-6, 250e-6, 500e-6,
	1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3,
	100e-3, 250e-3, 500e-3, 1,
}

// UpstreamBuckets are the upper bounds, in seconds, of the upstream call
// duration histogram: 5 ms to 60 s.
var UpstreamBuckets = []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}

// Options configures New; nil is valid.
type Options struct {
	// NoRuntimeCollectors leaves out the Go runtime (go_*) and process
	// (process_*) collectors, which are registered by default.
	NoRuntimeCollectors bool
}

// Metrics holds the gateway's collectors on a registry of its own.
type Metrics struct {
	reg *prometheus.Registry

	decisions        *prometheus.CounterVec
	decisionDuration *prometheus.HistogramVec
	upstreamDuration *prometheus.HistogramVec
	upstreamUp       *prometheus.GaugeVec
	upstreamRestarts *prometheus.CounterVec
	upstreamRefused  *prometheus.CounterVec
	auditEvents      *prometheus.CounterVec
	bundleGeneration prometheus.Gauge
	bundleReloads    *prometheus.CounterVec
	callPath         *prometheus.CounterVec
}

// New returns a Metrics with every collector registered on a new registry.
// opts may be nil.
func New(opts *Options) *Metrics {
	var o Options
	if opts != nil {
		o = *opts
	}
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: DecisionsTotal,
			Help: "Tool call decisions, by verdict (allow, deny, require_approval), decision code, layer and enforcement point (via: mcp, http, cli).",
		}, []string{"verdict", "code", "layer", "via"}),
		decisionDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    DecisionDuration,
			Help:    "Time to decide a tool call, including approval lookup and making an allow durable in the audit log, by enforcement point.",
			Buckets: DecisionBuckets,
		}, []string{"via"}),
		upstreamDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    UpstreamCallDuration,
			Help:    "Duration of calls forwarded to an upstream tool server, by upstream and outcome (ok, tool_error, error).",
			Buckets: UpstreamBuckets,
		}, []string{"upstream", "outcome"}),
		upstreamUp: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: UpstreamUp,
			Help: "1 when the upstream tool server is connected, 0 when it is not.",
		}, []string{"upstream"}),
		upstreamRestarts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: UpstreamRestartsTotal,
			Help: "Connection attempts to the upstream tool server after its first one (restarts after a crash, a lost session or a failed attempt).",
		}, []string{"upstream"}),
		upstreamRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: UpstreamMessagesRefusedTotal,
			Help: "Messages from the upstream tool server refused by the gateway, by reason (too_large: over its size limit; malformed: not one JSON-RPC message); the session stays up.",
		}, []string{"upstream", "reason"}),
		auditEvents: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: AuditEventsTotal,
			Help: "Audit events committed to the audit log, by event type.",
		}, []string{"event_type"}),
		bundleGeneration: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: BundleGeneration,
			Help: "Generation of the policy bundle in force: 1 for the bundle loaded at start, plus one per accepted reload.",
		}),
		bundleReloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: BundleReloadsTotal,
			Help: "Policy bundle reloads, by result (loaded, rejected: the bundle failed validation and the last good one stays).",
		}, []string{"result"}),
		callPath: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: ToolsCallPathTotal,
			Help: "MCP tools/call requests by the path that served them: fast (parsed once, bytes forwarded to a Streamable HTTP upstream or a built-in) or sdk (the MCP SDK's server and client: progress tokens, stdio upstreams, approval_wait).",
		}, []string{"path"}),
	}
	m.reg.MustRegister(m.decisions, m.decisionDuration, m.upstreamDuration, m.upstreamUp,
		m.upstreamRestarts, m.upstreamRefused, m.auditEvents, m.bundleGeneration, m.bundleReloads, m.callPath)
	// Both results exist from the start, so a rate() over rejections is 0,
	// not absent, until the first one.
	m.bundleReloads.WithLabelValues(reloadResultLoaded)
	m.bundleReloads.WithLabelValues(reloadResultRejected)
	if !o.NoRuntimeCollectors {
		m.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	return m
}

// Registry returns the registry the collectors are on, to register more
// (it is never the process-wide default registry).
func (m *Metrics) Registry() *prometheus.Registry {
	if m == nil {
		return nil
	}
	return m.reg
}

// Handler returns the /metrics handler: the registry in the Prometheus text
// (or OpenMetrics, when the scraper asks for it) exposition format. On a nil
// *Metrics it answers 404.
func (m *Metrics) Handler() http.Handler {
	if m == nil {
		return http.NotFoundHandler()
	}
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{
		Registry:          m.reg, // counts promhttp_metric_handler_errors_total
		ErrorHandling:     promhttp.ContinueOnError,
		EnableOpenMetrics: true,
	})
}

// Decision counts one decision and its duration. via names the enforcement
// point ("mcp", "http", "cli"); took is the time from the request reaching
// the gate to the decision (in seconds on the histogram). With UpstreamCall
// it makes *Metrics an mcpproxy.Observer.
func (m *Metrics) Decision(via string, d toolgate.Decision, took time.Duration) {
	if m == nil {
		return
	}
	m.decisions.WithLabelValues(d.Verdict.String(), string(d.Code), string(d.Layer), via).Inc()
	m.decisionDuration.WithLabelValues(via).Observe(took.Seconds())
}

// UpstreamCall records one call forwarded to upstream (its configured name)
// that ended with outcome (OutcomeOK, OutcomeToolError or OutcomeError)
// after took.
func (m *Metrics) UpstreamCall(upstream, outcome string, took time.Duration) {
	if m == nil {
		return
	}
	m.upstreamDuration.WithLabelValues(upstream, outcome).Observe(took.Seconds())
}

// ToolsCallPath counts one MCP tools/call served by path ("fast" or "sdk").
func (m *Metrics) ToolsCallPath(path string) {
	if m == nil {
		return
	}
	m.callPath.WithLabelValues(path).Inc()
}

// SetUpstreamUp sets whether upstream is connected (1) or not (0).
func (m *Metrics) SetUpstreamUp(upstream string, up bool) {
	if m == nil {
		return
	}
	v := 0.0
	if up {
		v = 1
	}
	m.upstreamUp.WithLabelValues(upstream).Set(v)
}

// DeclareUpstream starts upstream's series before it first connects: up
// 0, no restarts, no refused messages, so that alerts on them see 0 rather
// than nothing. Upstreams are fixed for the gateway's life (they are read
// at start), so no series is ever removed.
func (m *Metrics) DeclareUpstream(upstream string) {
	if m == nil {
		return
	}
	m.upstreamUp.WithLabelValues(upstream).Set(0)
	m.upstreamRestarts.WithLabelValues(upstream)
	for _, r := range []string{"too_large", "malformed"} { // upstream.RefusedTooLarge, RefusedMalformed
		m.upstreamRefused.WithLabelValues(upstream, r)
	}
}

// UpstreamRestart counts one connection attempt to upstream after its
// first one.
func (m *Metrics) UpstreamRestart(upstream string) {
	if m == nil {
		return
	}
	m.upstreamRestarts.WithLabelValues(upstream).Inc()
}

// UpstreamRefused counts one message from upstream refused for reason
// (too_large, malformed).
func (m *Metrics) UpstreamRefused(upstream, reason string) {
	if m == nil {
		return
	}
	m.upstreamRefused.WithLabelValues(upstream, reason).Inc()
}

// CountAuditEvents counts committed audit events by event type.
func (m *Metrics) CountAuditEvents(evs []audit.Event) {
	if m == nil {
		return
	}
	for i := range evs {
		m.auditEvents.WithLabelValues(evs[i].EventType).Inc()
	}
}

// AuditSink returns an audit.Sink that counts every committed event; add it
// to audit.RecorderOptions.Sinks. It never fails. On a nil *Metrics the
// sink does nothing.
func (m *Metrics) AuditSink() audit.Sink { return auditSink{m} }

type auditSink struct{ m *Metrics }

func (s auditSink) Write(_ context.Context, evs []audit.Event) error {
	s.m.CountAuditEvents(evs)
	return nil
}

// BundleLoaded records an accepted policy bundle: the reload counter's
// "loaded" result goes up and the generation gauge is set to generation.
// Call it for the bundle loaded at start too (generation 1).
func (m *Metrics) BundleLoaded(generation uint64) {
	if m == nil {
		return
	}
	m.bundleReloads.WithLabelValues(reloadResultLoaded).Inc()
	m.bundleGeneration.Set(float64(generation))
}

// BundleRejected records a reload refused because the bundle failed
// validation; the generation gauge is unchanged (the last good bundle
// stays).
func (m *Metrics) BundleRejected() {
	if m == nil {
		return
	}
	m.bundleReloads.WithLabelValues(reloadResultRejected).Inc()
}
