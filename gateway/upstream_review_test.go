package gateway_test

// Issue 7, findings 9 (metrics that never moved), 13 (large upstream results
// read whole) and 14 (one malformed line took a stdio upstream down), each
// through a real gateway and real upstreams.

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolgate/toolgate/audit"
	"github.com/toolgate/toolgate/internal/testenv"
	"github.com/toolgate/toolgate/store/sqlite"
	"github.com/toolgate/toolgate/upstream"
)

const oddKey = "tg-test-odd"

// buildOddServer builds upstream/testdata/oddserver (an MCP server with a
// tool answering 50 MiB, one printing garbage on stdout, and a 50 MiB
// resource and prompt) and returns its path.
func buildOddServer(t testing.TB) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "oddserver")
	if out, err := exec.Command("go", "build", "-o", bin, "../upstream/testdata/oddserver").CombinedOutput(); err != nil {
		t.Fatalf("build oddserver: %v\n%s", err, out)
	}
	return bin
}

// startOddHTTP runs oddserver over Streamable HTTP until the test ends and
// returns its MCP URL.
func startOddHTTP(t testing.TB, bin string) string {
	t.Helper()
	addr := testenv.FreeAddr(t)
	cmd := exec.Command(bin, "-http", addr)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); cmd.Wait() })
	waitListening(t, addr)
	return "http://" + addr
}

func waitListening(t testing.TB, addr string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := http.Get("http://" + addr + "/healthz")
		if err == nil {
			resp.Body.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("nothing listens on %s: %v", addr, err)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// scrapeMetrics reads base's /metrics into a map from series (name and
// labels, as exposed) to value.
func scrapeMetrics(t testing.TB, base string) map[string]float64 {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "toolgate_") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("metrics line %q: %v", line, err)
		}
		out[line[:i]] = v
	}
	return out
}

// waitMetric polls /metrics until series satisfies ok; it fails after 60 s.
func waitMetric(t testing.TB, base, series string, ok func(float64) bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		v, found := scrapeMetrics(t, base)[series]
		if found && ok(v) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s stayed at %v (present: %v)", series, v, found)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func is(want float64) func(float64) bool   { return func(v float64) bool { return v == want } }
func atLeast(n float64) func(float64) bool { return func(v float64) bool { return v >= n } }

const metricsBundle = `
- {kind: Upstream, name: goev, transport: streamable-http, url: %q, connect_timeout: 5s}
- {kind: Upstream, name: odd, transport: stdio, command: %q}
- kind: Agent
  agent_id: odd-agent
  version: 1.0.0
  runtime_engine: mcp-client
  tool_permissions:
    - {tool_id: tool:odd-echo, side_effect_class: read, approval_tier: auto}
    - {tool_id: tool:odd-garbage, side_effect_class: read, approval_tier: auto}
- {kind: RuntimePolicy, agent_id: odd-agent, deployment_mode: production, tool_authorization_policy: {active_tool_set: all, mcp_tool_policy: {mcp_write_approval_required: false}}}
- {kind: Principal, principal_id: user:odd, grants: [{resource: tool, action: invoke, scope: all}]}
- {kind: Credential, name: odd, api_key_sha256: %x, principal: user:odd, agent_id: odd-agent}
`

// TestMetricsMoveThroughGateway: every metric family the gateway declares
// moves when what it measures happens (issue 7, finding 9: the upstream
// health gauge and the bundle reload counters stayed 0). An HTTP upstream
// killed shows up 0 until it is back, then 1 with the restart counted; a
// stdio upstream SIGKILLed is restarted and counted; a valid bundle edit
// counts as loaded and raises the generation, an invalid one counts as
// rejected and leaves the generation.
func TestMetricsMoveThroughGateway(t *testing.T) {
	odd := buildOddServer(t)
	ev := testenv.StartEverythingServer(t, "")
	dir := t.TempDir()
	bundle := fmt.Sprintf(metricsBundle, ev.URL, odd, sha256sum(oddKey))
	file := filepath.Join(dir, "bundle.yaml")
	if err := os.WriteFile(file, []byte(bundle), 0o644); err != nil {
		t.Fatal(err)
	}
	g := startGateway(t, dir)
	base := g.apiURL()
	cs := connect(t, g.url, oddKey)
	listNames(t, cs, 2)

	waitMetric(t, base, `toolgate_upstream_up{upstream="goev"}`, is(1))
	waitMetric(t, base, `toolgate_upstream_up{upstream="odd"}`, is(1))
	// Audit events are counted once committed (group commit).
	waitMetric(t, base, `toolgate_audit_events_total{event_type="policy.bundle.loaded"}`, is(1))
	m := scrapeMetrics(t, base)
	for series, want := range map[string]float64{
		`toolgate_upstream_restarts_total{upstream="goev"}`:                                  0,
		`toolgate_upstream_restarts_total{upstream="odd"}`:                                   0,
		`toolgate_upstream_messages_refused_total{reason="malformed",upstream="odd"}`:        0,
		`toolgate_upstream_messages_refused_total{reason="too_large",upstream="goev"}`:       0,
		`toolgate_bundle_generation`:                                                         1,
		`toolgate_bundle_reloads_total{result="loaded"}`:                                     1,
		`toolgate_bundle_reloads_total{result="rejected"}`:                                   0,
		`toolgate_audit_events_total{event_type="policy.bundle.loaded"}`:                     1,
		`toolgate_upstream_call_duration_seconds_count{outcome="ok",upstream="odd"}`:         0,
		`toolgate_decisions_total{code="ok",layer="",verdict="allow",via="mcp"}`:             0,
		`toolgate_mcp_tools_call_path_total{path="sdk"}`:                                     0,
		`toolgate_decision_duration_seconds_count{via="http"}`:                               0,
		`toolgate_upstream_call_duration_seconds_count{outcome="tool_error",upstream="odd"}`: 0,
	} {
		if got := m[series]; got != want {
			t.Errorf("at start: %s = %v, want %v", series, got, want)
		}
	}

	t.Run("calls", func(t *testing.T) {
		if res, err := call(t, cs, "odd_echo", map[string]any{"message": "hi"}); err != nil || res.IsError {
			t.Fatalf("odd_echo over MCP: %v %v", err, res)
		}
		if code, out, raw := toolsCall(t, base, oddKey, "odd_echo", map[string]any{"message": "hi"}); code != 200 || out.Result == nil || out.Result.IsError {
			t.Fatalf("odd_echo over the JSON API: %d %s", code, raw)
		}
		m := scrapeMetrics(t, base)
		for series, want := range map[string]float64{
			`toolgate_decisions_total{code="ok",layer="",verdict="allow",via="mcp"}`:     1,
			`toolgate_decisions_total{code="ok",layer="",verdict="allow",via="http"}`:    1,
			`toolgate_decision_duration_seconds_count{via="mcp"}`:                        1,
			`toolgate_decision_duration_seconds_count{via="http"}`:                       1,
			`toolgate_mcp_tools_call_path_total{path="fast"}`:                            1, // stdio too: the caller is the call's own stream
			`toolgate_upstream_call_duration_seconds_count{outcome="ok",upstream="odd"}`: 2, // MCP and the JSON API
			`toolgate_audit_events_total{event_type="agent.tool.authorized"}`:            2,
		} {
			if got := m[series]; got != want {
				t.Errorf("%s = %v, want %v", series, got, want)
			}
		}
	})

	t.Run("HTTP upstream killed and back", func(t *testing.T) {
		ev.Kill()
		// A call to the dead upstream has the gateway check it at once.
		call(t, cs, "odd_echo", map[string]any{"message": "x"})
		waitMetric(t, base, `toolgate_upstream_up{upstream="goev"}`, is(0))
		testenv.StartEverythingServer(t, ev.Addr)
		waitMetric(t, base, `toolgate_upstream_up{upstream="goev"}`, is(1))
		waitMetric(t, base, `toolgate_upstream_restarts_total{upstream="goev"}`, atLeast(1))
	})

	t.Run("stdio upstream SIGKILLed", func(t *testing.T) {
		var pid int
		for _, s := range g.gw.Ups.Status() {
			if s.Name == "odd" {
				pid = s.PID
			}
		}
		if pid == 0 {
			t.Fatal("no pid for odd")
		}
		syscall.Kill(pid, syscall.SIGKILL)
		waitMetric(t, base, `toolgate_upstream_restarts_total{upstream="odd"}`, is(1))
		waitMetric(t, base, `toolgate_upstream_up{upstream="odd"}`, is(1))
		for _, s := range g.gw.Ups.Status() {
			if s.Name == "odd" && (s.PID == pid || s.State != upstream.StateUp) {
				t.Errorf("odd after the kill: %+v (old pid %d)", s, pid)
			}
		}
	})

	t.Run("bundle reloads", func(t *testing.T) {
		valid := bundle + "- {kind: ToolPolicy, name: short, conditions: [{tools: [tool:odd-echo], when: 'size(args.message) < 100', reason: short messages}]}\n"
		if err := os.WriteFile(file, []byte(valid), 0o644); err != nil {
			t.Fatal(err)
		}
		waitMetric(t, base, `toolgate_bundle_reloads_total{result="loaded"}`, is(2))
		waitMetric(t, base, `toolgate_bundle_generation`, is(2))
		if err := os.WriteFile(file, []byte(valid+"- {kind: NoSuchKind, name: typo}\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		waitMetric(t, base, `toolgate_bundle_reloads_total{result="rejected"}`, is(1))
		m := scrapeMetrics(t, base)
		if m[`toolgate_bundle_generation`] != 2 || m[`toolgate_bundle_reloads_total{result="loaded"}`] != 2 {
			t.Errorf("after a rejected reload: generation %v, loaded %v; want 2 and 2",
				m[`toolgate_bundle_generation`], m[`toolgate_bundle_reloads_total{result="loaded"}`])
		}
		waitMetric(t, base, `toolgate_audit_events_total{event_type="policy.bundle.rejected"}`, is(1))
	})
}

// TestStdioGarbageThroughGateway: a stdio upstream that prints lines that
// are not JSON-RPC messages between its valid ones keeps serving every
// client; each bad line is refused, logged and counted (issue 7, finding
// 14: the first such line ended the session for all its clients).
func TestStdioGarbageThroughGateway(t *testing.T) {
	odd := buildOddServer(t)
	ev := testenv.StartEverythingServer(t, "")
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "bundle.yaml"), []byte(fmt.Sprintf(metricsBundle, ev.URL, odd, sha256sum(oddKey))), 0o644); err != nil {
		t.Fatal(err)
	}
	g := startGateway(t, dir)
	a, b := connect(t, g.url, oddKey), connect(t, g.url, oddKey)
	listNames(t, a, 2)
	listNames(t, b, 2)
	before := g.gw.Ups.Status()

	res, err := call(t, a, "odd_garbage", map[string]any{})
	if err != nil || res.IsError || text(res) != "survived" {
		t.Fatalf("the call that printed garbage: %v %v", err, res)
	}
	for i, cs := range []*mcp.ClientSession{a, b} {
		if res, err := call(t, cs, "odd_echo", map[string]any{"message": "still here"}); err != nil || res.IsError || text(res) != "still here" {
			t.Errorf("client %d after the garbage: %v %v", i, err, res)
		}
	}
	after := g.gw.Ups.Status()
	for i := range after {
		if after[i].Name == "odd" && (after[i].Restarts != 0 || after[i].PID != before[i].PID || after[i].State != upstream.StateUp) {
			t.Errorf("odd was restarted: before %+v, after %+v", before[i], after[i])
		}
	}
	if got := scrapeMetrics(t, g.apiURL())[`toolgate_upstream_messages_refused_total{reason="malformed",upstream="odd"}`]; got != 6 {
		t.Errorf("refused malformed messages: %v, want 6", got)
	}
}

const largeBundle = `
- {kind: Upstream, name: bigh, transport: streamable-http, url: %q}
- {kind: Upstream, name: bigs, transport: stdio, command: %q}
- kind: Agent
  agent_id: big-agent
  version: 1.0.0
  runtime_engine: mcp-client
  tool_permissions:
    - {tool_id: tool:bigh-big, side_effect_class: read, approval_tier: auto}
    - {tool_id: tool:bigs-big, side_effect_class: read, approval_tier: auto}
    - {tool_id: tool:bigh-echo, side_effect_class: read, approval_tier: auto}
    - {tool_id: tool:bigs-echo, side_effect_class: read, approval_tier: auto}
- {kind: RuntimePolicy, agent_id: big-agent, deployment_mode: production, tool_authorization_policy: {active_tool_set: all, mcp_tool_policy: {mcp_write_approval_required: false}}}
- {kind: Principal, principal_id: user:big, grants: [{resource: tool, action: invoke, scope: all}]}
- {kind: Credential, name: big, api_key_sha256: %x, principal: user:big, agent_id: big-agent}
`

// vmHWM returns the peak resident set size of process pid, in bytes.
func vmHWM(t testing.TB, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmHWM:" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatal("no VmHWM in /proc status")
	return 0
}

// TestLargeResultsThroughGateway: eight 50 MiB tool results in flight at
// once, on the fast path, the SDK path over HTTP and over stdio, plus 50 MiB
// resources, cost a real `toolgate serve` little memory: each answer is
// refused while it is read, past 16 × result_max_kib, and becomes an isError
// result saying it was too large (a JSON-RPC error for resources/read); the
// calls were allowed, recorded, and their completions record the failure;
// both upstreams stay up. (Issue 7, finding 13: eight such results reached
// 994 MiB.)
func TestLargeResultsThroughGateway(t *testing.T) {
	odd := buildOddServer(t)
	url := startOddHTTP(t, odd)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "bundle.yaml"), []byte(fmt.Sprintf(largeBundle, url, odd, sha256sum("tg-test-big"))), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "toolgate")
	if out, err := exec.Command("go", "build", "-o", bin, "../cmd/toolgate").CombinedOutput(); err != nil {
		t.Fatalf("build toolgate: %v\n%s", err, out)
	}
	addr, data := testenv.FreeAddr(t), t.TempDir()
	var logs lockedBuffer
	cmd := exec.Command(bin, "serve", "--bundle", dir, "--listen", addr, "--data", data)
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	}
	t.Cleanup(func() {
		stop()
		if t.Failed() {
			t.Logf("toolgate serve log:\n%s", logs.String())
		}
	})
	waitListening(t, addr)
	mcpURL := "http://" + addr + "/mcp"
	cs := connect(t, mcpURL, "tg-test-big")
	listNames(t, cs, 4)

	type outcome struct {
		what string
		res  *mcp.CallToolResult
		err  error
	}
	var (
		mu  sync.Mutex
		got []outcome
		wg  sync.WaitGroup
	)
	run := func(what string, f func(cs *mcp.ClientSession) (*mcp.CallToolResult, error)) {
		c := connect(t, mcpURL, "tg-test-big") // each call from a client of its own
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := f(c)
			mu.Lock()
			got = append(got, outcome{what, res, err})
			mu.Unlock()
		}()
	}
	ctx := context.Background()
	bigCall := func(name string, progress bool) func(cs *mcp.ClientSession) (*mcp.CallToolResult, error) {
		return func(cs *mcp.ClientSession) (*mcp.CallToolResult, error) {
			p := &mcp.CallToolParams{Name: name, Arguments: map[string]any{"mib": 50}}
			if progress {
				p.Meta = mcp.Meta{"progressToken": "p-" + name}
			}
			return cs.CallTool(ctx, p)
		}
	}
	for range 4 {
		run("HTTP upstream, fast path", bigCall("bigh_big", false))
	}
	for range 2 {
		run("HTTP upstream, SDK path", bigCall("bigh_big", true))
	}
	for range 2 {
		run("stdio upstream", bigCall("bigs_big", false))
	}
	for range 2 {
		run("resources/read", func(cs *mcp.ClientSession) (*mcp.CallToolResult, error) {
			_, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: "big://file"})
			return nil, err
		})
	}
	wg.Wait()
	peak := vmHWM(t, cmd.Process.Pid)
	t.Logf("toolgate serve peak RSS: %.1f MiB", float64(peak)/(1<<20))

	for _, o := range got {
		if o.what == "resources/read" {
			if o.err == nil || !strings.Contains(o.err.Error(), "more than the 1048576 bytes the gateway reads") {
				t.Errorf("%s: %v, want a JSON-RPC error saying it is too large", o.what, o.err)
			}
			continue
		}
		if o.err != nil || !o.res.IsError || !strings.Contains(text(o.res), "more than the 1048576 bytes the gateway reads") {
			t.Errorf("%s: %v %+v, want an isError result saying it is too large", o.what, o.err, o.res)
		}
	}
	// Without the bound, each answer was read and decoded whole (50 MiB,
	// then copies of it): eight reached 994 MiB. With it, each costs about
	// the read limit (1 MiB) plus buffers.
	if peak > 200<<20 {
		t.Errorf("peak RSS %d MiB with eight 50 MiB results in flight, want under 200 MiB", peak>>20)
	}
	for _, name := range []string{"bigh_echo", "bigs_echo"} {
		if res, err := call(t, cs, name, map[string]any{"message": "up"}); err != nil || res.IsError {
			t.Errorf("%s after the large results: %v %v", name, err, res)
		}
	}
	m := scrapeMetrics(t, "http://"+addr)
	if n := m[`toolgate_upstream_messages_refused_total{reason="too_large",upstream="bigh"}`] + m[`toolgate_upstream_messages_refused_total{reason="too_large",upstream="bigs"}`]; n != 10 {
		t.Errorf("too_large refusals: %v, want 10", n)
	}

	stop()
	st, err := sqlite.Open(filepath.Join(data, "toolgate.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	evs, err := audit.ReadEvents(ctx, st, 1, 100000)
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]int{}
	for _, e := range evs {
		if strings.HasSuffix(e.ToolName, "_big") {
			counts[e.EventType]++
		}
	}
	if counts["agent.tool.authorized"] != 8 || counts["agent.tool.failed"] != 8 || counts["agent.tool.completed"] != 0 {
		t.Errorf("events of the large calls: %v; want 8 authorized and 8 failed", counts)
	}
}
