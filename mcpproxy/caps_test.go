package mcpproxy

// Regression tests of the review of issue 7: N2 (the session cap keyed by
// the authority, not the credential), N3 (resource subscriptions bounded)
// and N10 (SetTools never takes another tool's mirror).

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/toolgate/toolgate/adapter/mcptool"
	"github.com/toolgate/toolgate/audit"
	"github.com/toolgate/toolgate/builtin/registry"
	"github.com/toolgate/toolgate/gate"
	"github.com/toolgate/toolgate/identity"
	"github.com/toolgate/toolgate/policy"
	"github.com/toolgate/toolgate/store/sqlite"
)

// sqliteAudit is an audit recorder on a real SQLite file, and a reader of
// its committed events of one type.
func sqliteAudit(t *testing.T) (*audit.Recorder, func(typ string) []audit.Event) {
	t.Helper()
	st, err := sqlite.Open(filepath.Join(t.TempDir(), "toolgate.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	rec := audit.NewRecorder(st, nil)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		rec.Close(ctx)
		st.Close()
	})
	return rec, func(typ string) []audit.Event {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := rec.Flush(ctx); err != nil {
			t.Fatal(err)
		}
		recs, err := st.ReadRecords(ctx, 0, 100000)
		if err != nil {
			t.Fatal(err)
		}
		var out []audit.Event
		for _, r := range recs {
			ev, err := r.Event()
			if err != nil {
				t.Fatal(err)
			}
			if ev.EventType == typ {
				out = append(out, ev)
			}
		}
		return out
	}
}

// openStream opens the GET stream of session sid, so that it is not idle,
// until the returned function (or the end of the test) closes it.
func openStream(t *testing.T, url, key, sid string) (close func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Mcp-Session-Id", sid)
	req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != http.StatusOK {
		cancel()
		t.Fatalf("GET stream: %v %v", err, resp)
	}
	close = func() { cancel(); resp.Body.Close() }
	t.Cleanup(close)
	return close
}

// TestAuthorityKeyIsInjective (class "identifiers must be injective"): the
// key the caps count a client under is the principal and agent and
// nothing else, so every credential of one authority shares it, two
// authorities never do, and every anonymous client counts as one.
func TestAuthorityKeyIsInjective(t *testing.T) {
	dlg := &gate.Delegation{}
	cases := []struct {
		name string
		a, b gate.Identity
		same bool
	}{
		{"an API key and a delegation token of one principal and agent", gate.Identity{Principal: "user:t", AgentID: "a"},
			gate.Identity{Principal: "user:t", AgentID: "a", Delegation: dlg}, true},
		{"another instance and environment of the same authority", gate.Identity{Principal: "user:t", AgentID: "a", InstanceID: "i1", Environment: "prod"},
			gate.Identity{Principal: "user:t", AgentID: "a", InstanceID: "i2", Environment: "dev"}, true},
		{"the same principal with another agent", gate.Identity{Principal: "user:t", AgentID: "a"}, gate.Identity{Principal: "user:t", AgentID: "b"}, false},
		{"a space moved between principal and agent", gate.Identity{Principal: "user:t a", AgentID: "b"},
			gate.Identity{Principal: "user:t", AgentID: "a b"}, false},
		{"a quote moved between principal and agent", gate.Identity{Principal: `u" "x`, AgentID: "a"},
			gate.Identity{Principal: "u", AgentID: `x" "a`}, false},
		{"a principal named like the anonymous key", gate.Identity{Principal: "anonymous", AgentID: ""},
			gate.Identity{Principal: "user:anon", AgentID: "a", Anonymous: true}, false},
		{"two anonymous clients (their sessions differ)", gate.Identity{Principal: "user:anon", AgentID: "a", Anonymous: true, Session: "s1"},
			gate.Identity{Principal: "user:anon", AgentID: "a", Anonymous: true, Session: "s2"}, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := authorityKey(c.a) == authorityKey(c.b); got != c.same {
				t.Errorf("authorityKey(%+v) = %q, authorityKey(%+v) = %q; same = %v, want %v", c.a, authorityKey(c.a), c.b, authorityKey(c.b), got, c.same)
			}
		})
	}
}

// TestSessionCapPerAuthority (review of issue 7, N2): the session cap
// counts the sessions of a principal and agent over all their credentials
// — two API keys and any number of delegation tokens the principal mints —
// so minting credentials does not buy sessions. Past the cap with none
// idle, an initialize is refused (429) naming the cap, the count and what
// to do, counted and audited with the principal and agent; another
// authority still gets sessions; with idle ones, the authority's longest
// idle is closed, and it never holds more than the cap.
func TestSessionCapPerAuthority(t *testing.T) {
	up := startGoUpstream(t, "docs", upstreamOpts{tools: []string{"find"}})
	sum := sha256.Sum256([]byte("key-a2"))
	bundle := multiBundle([]*goUpstream{up}, []agentSpec{
		{key: "key-a", agent: "a", tools: []string{"tool:docs-find"}},
		{key: "key-b", agent: "b", tools: []string{"tool:docs-find"}},
	}, fmt.Sprintf("- kind: Credential\n  name: second-key-of-a\n  api_key_sha256: %s\n  principal: user:t\n  agent_id: a\n  deployment_mode: production\n", hex.EncodeToString(sum[:])))
	rec, events := sqliteAudit(t)
	reg := prometheus.NewRegistry()
	url, p := serveProxyEnv(t, bundle, proxyEnv{rec: rec, opts: &Options{MaxSessionsPerAuthority: 3, MaxSessions: 100, Registerer: reg}})

	// Delegation tokens, as toolgate delegate mints them.
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "bundle.yaml"), []byte(bundle), 0o600); err != nil {
		t.Fatal(err)
	}
	b, err := policy.LoadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	auth, err := identity.New(b, identity.NewKeyring(t.TempDir()), nil)
	if err != nil {
		t.Fatal(err)
	}
	p.g.Install(p.g.Snapshot(), identity.NewTable(b, auth))
	grant, _ := identity.ParseGrant("tool:invoke:all")
	var tokens []string
	for i := range 6 {
		m, err := auth.Mint(identity.MintRequest{Delegator: "user:t", Delegate: fmt.Sprintf("svc:job%d", i), AgentID: "a",
			DeploymentMode: "production", Grants: []policy.Grant{grant}})
		if err != nil {
			t.Fatal(err)
		}
		tokens = append(tokens, m.Token)
	}
	authority := authorityKey(gate.Identity{Principal: "user:t", AgentID: "a"})
	held := func() int { _, by := p.Sessions(); return by[authority] }

	// Three sessions of user:t with agent a, by three credentials, none
	// idle.
	var streams []func()
	for _, key := range []string{"key-a", "key-a2", tokens[0]} {
		streams = append(streams, openStream(t, url, key, openRaw(t, url, key)))
	}
	initialize := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`
	resp, body := post(t, url, tokens[1], "", initialize)
	for _, want := range []string{"session cap per authority", "principal user:t with agent a", "maximum of 3 sessions (3 open)", "HTTP DELETE"} {
		if resp.StatusCode != http.StatusTooManyRequests || !strings.Contains(body, want) {
			t.Errorf("a 4th session of user:t/a by a freshly minted token: HTTP %d %s; want 429 mentioning %q", resp.StatusCode, body, want)
		}
	}
	if n := held(); n != 3 {
		t.Errorf("user:t/a holds %d sessions, want 3", n)
	}
	if n := counterValue(t, reg, RequestsRefusedTotal, map[string]string{"status": "429", "reason": reasonSessionCapAuthority}); n != 1 {
		t.Errorf("%s{429,%s} = %v, want 1", RequestsRefusedTotal, reasonSessionCapAuthority, n)
	}
	var refused []audit.Event
	for _, ev := range events("gateway.request.refused") {
		if ev.Details["reason"] == reasonSessionCapAuthority {
			refused = append(refused, ev)
		}
	}
	if len(refused) != 1 || refused[0].Details["principal"] != "user:t" || refused[0].Details["agent_id"] != "a" ||
		!strings.Contains(refused[0].Reason, "principal user:t, agent a") {
		t.Errorf("gateway.request.refused events of the cap: %+v; want one naming user:t and agent a", refused)
	}

	// Another authority is not held back.
	if sid := openRaw(t, url, "key-b"); sid == "" {
		t.Error("key-b (agent b) got no session")
	}

	// With idle sessions, new tokens' sessions close the authority's
	// longest idle; the authority never holds more than 3.
	for _, close := range streams {
		close()
	}
	waitFor(t, "the streams closed", func() bool {
		p.fast.mu.Lock()
		defer p.fast.mu.Unlock()
		for _, cs := range p.fast.sessions {
			if cs.active.Load() != 0 {
				return false
			}
		}
		return true
	})
	var idle []string
	for _, tok := range tokens[1:] {
		idle = append(idle, openRaw(t, url, tok))
		time.Sleep(2 * time.Millisecond) // distinct idle times
	}
	waitFor(t, "user:t/a back at 3 sessions", func() bool { return held() <= 3 })
	if n := held(); n != 3 {
		t.Errorf("user:t/a holds %d sessions after 5 more tokens, want 3", n)
	}
}

// TestSubscriptionCaps (review of issue 7, N3): resources/subscribe is
// bounded per session, per authority (all its sessions together) and in
// total; a subscribe past a cap is refused with a JSON-RPC error naming
// the cap and reaches no upstream; subscribing again to a held URI costs
// nothing; unsubscribe and the end of a session free their slots (and the
// upstream's subscription, and the SDK's record of them). A URI longer
// than policy.MaxURILen is refused at the decision, before any of this.
func TestSubscriptionCaps(t *testing.T) {
	up := startGoUpstream(t, "docs", upstreamOpts{tools: []string{"find"}, templates: []string{"file:///{+path}"}})
	bundle := multiBundle([]*goUpstream{up}, []agentSpec{
		{key: "key-a", agent: "a", tools: []string{"tool:docs-find"}},
		{key: "key-b", agent: "b", tools: []string{"tool:docs-find"}},
	}, "")
	rec, events := sqliteAudit(t)
	url, p := serveProxyEnv(t, bundle, proxyEnv{rec: rec, opts: &Options{MaxSubscriptionsPerSession: 4, MaxSubscriptionsPerAuthority: 6, MaxSubscriptions: 8}})
	a1 := connectClient(t, url, "key-a", declare{}).cs
	a2 := connectClient(t, url, "key-a", declare{}).cs
	b := connectClient(t, url, "key-b", declare{}).cs
	waitTools(t, a1, 1)
	waitFor(t, "the template mirrored", func() bool {
		res, err := b.ListResourceTemplates(context.Background(), nil)
		return err == nil && len(res.ResourceTemplates) == 1
	})
	ctx := context.Background()
	subscribe := func(cs *mcp.ClientSession, uri string) error {
		return cs.Subscribe(ctx, &mcp.SubscribeParams{URI: uri})
	}
	upstreamSubs := func() int { _, _, subs, _ := up.got(); return len(subs) }
	sdkEntries := func() int {
		return reflect.ValueOf(p.server).Elem().FieldByName("resourceSubscriptions").Len()
	}
	refusedBy := func(err error, cap string) bool {
		return rpcCode(err) == jsonrpc.CodeInvalidRequest && strings.Contains(err.Error(), cap)
	}

	for i := range 4 {
		if err := subscribe(a1, fmt.Sprintf("file:///a1/%d", i)); err != nil {
			t.Fatalf("a1 subscribe %d: %v", i, err)
		}
	}
	if err := subscribe(a1, "file:///a1/0"); err != nil {
		t.Errorf("a1 subscribing again to a URI it holds: %v", err)
	}
	if err := subscribe(a1, "file:///a1/4"); !refusedBy(err, "subscription cap per session") || !strings.Contains(err.Error(), "maximum of 4 subscriptions") {
		t.Errorf("a1's 5th subscription: %v; want refused by the cap per session", err)
	}
	for i := range 2 {
		if err := subscribe(a2, fmt.Sprintf("file:///a2/%d", i)); err != nil {
			t.Fatalf("a2 subscribe %d: %v", i, err)
		}
	}
	if err := subscribe(a2, "file:///a2/2"); !refusedBy(err, "subscription cap per authority") || !strings.Contains(err.Error(), "maximum of 6 subscriptions") {
		t.Errorf("user:t/a's 7th subscription (a second session): %v; want refused by the cap per authority", err)
	}
	for i := range 2 {
		if err := subscribe(b, fmt.Sprintf("file:///b/%d", i)); err != nil {
			t.Fatalf("b subscribe %d: %v", i, err)
		}
	}
	if err := subscribe(b, "file:///b/2"); !refusedBy(err, "the gateway's subscription cap") || !strings.Contains(err.Error(), "maximum of 8 subscriptions") {
		t.Errorf("the 9th subscription of all: %v; want refused by the total cap", err)
	}
	if n := upstreamSubs(); n != 8 {
		t.Errorf("the upstream got %d subscriptions, want 8 (none past a cap)", n)
	}
	if total, _ := p.Subscriptions(); total != 8 {
		t.Errorf("Subscriptions() = %d, want 8", total)
	}
	// Each refusal is recorded: the access was allowed, its subscribe
	// failed with the cap's message.
	capped := 0
	for _, ev := range events("agent.tool.failed") {
		if strings.Contains(ev.Reason, "subscription cap") {
			capped++
		}
	}
	if capped != 3 {
		t.Errorf("%d failed accesses name a subscription cap, want 3", capped)
	}

	// A URI past policy.MaxURILen never gets this far.
	long := "file:///" + strings.Repeat("x", policy.MaxURILen)
	if err := subscribe(b, long); rpcCode(err) != AccessRefusedCode || !strings.Contains(err.Error(), "malformed_call") {
		t.Errorf("subscribe to a %d-byte URI: %v; want refused at the decision", len(long), err)
	}

	// Unsubscribe frees a slot of all three caps at once.
	if err := a1.Unsubscribe(ctx, &mcp.UnsubscribeParams{URI: "file:///a1/0"}); err != nil {
		t.Fatal(err)
	}
	if err := subscribe(b, "file:///b/2"); err != nil {
		t.Errorf("b subscribe after a1 unsubscribed: %v", err)
	}
	// The end of a session frees its slots, the upstream's subscriptions
	// of URIs nobody else watches, and the SDK's record of them.
	a1.Close()
	waitFor(t, "a1's 3 subscriptions freed", func() bool { total, _ := p.Subscriptions(); return total == 5 })
	waitFor(t, "the upstream unsubscribed from a1's URIs", func() bool {
		methods, _, _, _ := up.got()
		return countOf(methods, "resources/unsubscribe") == 4
	})
	if n := sdkEntries(); n != 5 {
		t.Errorf("the SDK keeps %d subscribed URIs, want 5 (a closed session's are forgotten)", n)
	}
	for i := range 2 {
		if err := subscribe(a2, fmt.Sprintf("file:///a2/%d", i+2)); err != nil {
			t.Errorf("a2 subscribe after a1 closed: %v", err)
		}
	}
	if _, by := p.Subscriptions(); by[authorityKey(gate.Identity{Principal: "user:t", AgentID: "a"})] != 4 {
		t.Errorf("user:t/a holds %v subscriptions, want 4", by)
	}
}

// counterValue is the value of counter name with exactly these labels in
// reg (0 when it has none).
func counterValue(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			got := map[string]string{}
			for _, l := range m.GetLabel() {
				got[l.GetName()] = l.GetValue()
			}
			if reflect.DeepEqual(got, labels) {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

func countOf(list []string, s string) int {
	n := 0
	for _, x := range list {
		if x == s {
			n++
		}
	}
	return n
}

// syncBuffer is a log destination for concurrent writers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestMirrorsKeepTheirOwner (review of issue 7, N10): upstream docs with
// tool_prefix fs_ announces read, whose model-visible name fs_read is the
// built-in tool:fs-read's. The catalog refuses docs's tool
// (authz.CheckAnnounced), the built-in takes the name over from the
// mirror SetTools made before the built-ins were set, and when docs
// announces again, SetTools keeps the built-in's mirror and logs the
// skipped tool with both owners. Neither does it take another upstream's
// mirror (prefixes that clash pass no validation, but a reload that swaps
// them runs SetTools for one upstream before the other re-announces).
func TestMirrorsKeepTheirOwner(t *testing.T) {
	up := startGoUpstream(t, "docs", upstreamOpts{tools: []string{"read", "find"}})
	key := sha256.Sum256([]byte("key-a"))
	bundle := fmt.Sprintf(`
- {kind: Upstream, name: docs, transport: streamable-http, url: %q, tool_prefix: fs_}
- {kind: Tool, tool_id: tool:fs-read, side_effect_class: read, source: {builtin: fs.read}}
- kind: Agent
  agent_id: a
  version: 1.0.0
  runtime_engine: go
  workspace: %q
  tool_permissions:
    - {tool_id: tool:fs-read, side_effect_class: read, approval_tier: auto}
    - {tool_id: tool:docs-read, side_effect_class: write, approval_tier: auto}
    - {tool_id: tool:docs-find, side_effect_class: write, approval_tier: auto}
    - {tool_id: tool:docs-search, side_effect_class: write, approval_tier: auto}
- {kind: RuntimePolicy, agent_id: a, deployment_mode: production, tool_authorization_policy: {active_tool_set: all, mcp_tool_policy: {mcp_write_approval_required: false}}}
- {kind: Credential, name: a, api_key_sha256: %s, principal: user:t, agent_id: a, deployment_mode: production}
- {kind: Principal, principal_id: user:t, grants: [{resource: tool, action: invoke, scope: all}]}
`, up.URL, t.TempDir(), hex.EncodeToString(key[:]))
	logs := &syncBuffer{}
	url, p := serveProxyEnv(t, bundle, proxyEnv{opts: &Options{Logger: slog.New(slog.NewTextHandler(logs, nil))}})
	waitFor(t, "docs's tools mirrored", func() bool { _, ok := p.lookup("fs_find"); return ok })

	reg, err := registry.New(context.Background(), registry.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reg.Close() })
	p.SetBuiltins(reg)
	if m, _ := p.lookup("fs_read"); m.builtin != "fs.read" {
		t.Fatalf("fs_read belongs to %s (%s) after SetBuiltins, want the built-in fs.read", m.owner(), m.id)
	}

	// docs announces again (a new tool: list_changed).
	up.srv.AddTool(&mcp.Tool{Name: "search", InputSchema: map[string]any{"type": "object"}},
		func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return &mcp.CallToolResult{}, nil
		})
	waitFor(t, "docs's new tool mirrored", func() bool { _, ok := p.lookup("fs_search"); return ok })
	if m, _ := p.lookup("fs_read"); m.builtin != "fs.read" {
		t.Errorf("fs_read belongs to %s (%s) after docs announced again, want the built-in fs.read", m.owner(), m.id)
	}
	if l := logs.String(); !strings.Contains(l, "upstream tool skipped") || !strings.Contains(l, `owner="builtin fs.read"`) || !strings.Contains(l, "upstream=docs") {
		t.Errorf("no log line names the skipped tool with both owners:\n%s", l)
	}

	// Another upstream's SetTools does not take docs's mirror either.
	p.SetTools("other", "fs_", []*mcp.Tool{{Name: "find", Description: "other's"}},
		[]mcptool.AnnouncedTool{{ID: "tool:other-find", Name: "fs_find", MCPServer: "other"}})
	if m, _ := p.lookup("fs_find"); m.upstream != "docs" || m.id != "tool:docs-find" {
		t.Errorf("fs_find belongs to %s (%s), want upstream docs's tool:docs-find", m.owner(), m.id)
	}
	if l := logs.String(); !strings.Contains(l, "upstream=other") || !strings.Contains(l, `owner="upstream docs"`) {
		t.Errorf("no log line names other's skipped tool with docs as owner:\n%s", l)
	}

	// What the client sees: fs_read once, the built-in's.
	cs := connectClient(t, url, "key-a", declare{}).cs
	res, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tool := range res.Tools {
		names = append(names, tool.Name)
		if tool.Name == "fs_read" && tool.Description == "" {
			t.Errorf("fs_read is listed without the built-in's description: %+v", tool)
		}
	}
	slices.Sort(names)
	if want := []string{"fs_find", "fs_read", "fs_search"}; !slices.Equal(names, want) {
		t.Errorf("tools/list = %q, want %q", names, want)
	}
}
