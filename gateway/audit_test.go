package gateway_test

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolgate/toolgate"
	"github.com/toolgate/toolgate/audit"
	"github.com/toolgate/toolgate/gateway"
	"github.com/toolgate/toolgate/internal/testenv"
	"github.com/toolgate/toolgate/store/sqlite"
	"github.com/toolgate/toolgate/storetest"
)

const crashKey = "tg-test-crash"

// crashBundle fronts testdata/record-server.js, which logs every call it
// receives to a file: what the gateway really forwarded.
const crashBundle = `
- {kind: Upstream, name: rec, transport: stdio, command: node, args: [%q, %q], call_timeout: 120s}
# record-server's readOnlyHint does not make its tools read; the bundle does.
- {kind: Tool, tool_id: tool:rec-echo, side_effect_class: read, source: {mcp_server: rec}}
- {kind: Tool, tool_id: tool:rec-hang, side_effect_class: read, source: {mcp_server: rec}}
- kind: Agent
  agent_id: crash-agent
  version: 1.0.0
  runtime_engine: mcp-client
  tool_permissions:
    - {tool_id: tool:rec-echo, side_effect_class: read, approval_tier: auto}
    - {tool_id: tool:rec-hang, side_effect_class: read, approval_tier: auto}
- kind: RuntimePolicy
  agent_id: crash-agent
  deployment_mode: production
  tool_authorization_policy: {active_tool_set: all}
- kind: ToolPolicy
  name: no-deny-messages
  conditions:
    - {tools: [tool:rec-echo], when: '!args.message.startsWith("deny")', reason: messages starting with deny are refused}
- kind: Principal
  principal_id: user:crash
  grants: [{resource: tool, action: invoke, scope: all}]
- kind: Credential
  name: crash
  api_key_sha256: %x
  principal: user:crash
  agent_id: crash-agent
`

// crashEnv is a bundle, a data folder and a toolgate binary built from this
// tree, for tests that kill the gateway process and start it again.
type crashEnv struct {
	bin, bundle, data, received string
}

func newCrashEnv(t *testing.T) *crashEnv {
	t.Helper()
	testenv.NodeModulesDir(t)
	e := &crashEnv{bundle: t.TempDir(), data: t.TempDir()}
	e.received = filepath.Join(t.TempDir(), "received.jsonl")
	e.bin = filepath.Join(t.TempDir(), "toolgate")
	if out, err := exec.Command("go", "build", "-o", e.bin, "../cmd/toolgate").CombinedOutput(); err != nil {
		t.Fatalf("build toolgate: %v\n%s", err, out)
	}
	body := fmt.Sprintf(crashBundle, filepath.Join(testenv.RepoRoot(t), "gateway", "testdata", "record-server.js"), e.received, sha256sum(crashKey))
	if err := os.WriteFile(filepath.Join(e.bundle, "bundle.yaml"), []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return e
}

// proc is a running toolgate serve.
type proc struct {
	cmd    *exec.Cmd
	url    string
	stderr *syncBuf
	done   chan error
}

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// start runs toolgate serve and waits until /healthz answers (the start's
// audit recovery is done by then). The process is killed when the test
// ends if it still runs.
func (e *crashEnv) start(t *testing.T) *proc {
	t.Helper()
	addr := testenv.FreeAddr(t)
	p := &proc{url: "http://" + addr, stderr: &syncBuf{}, done: make(chan error, 1)}
	p.cmd = exec.Command(e.bin, "serve", "--bundle", e.bundle, "--listen", addr, "--data", e.data)
	p.cmd.Stderr = p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.done <- p.cmd.Wait() }()
	t.Cleanup(func() {
		p.cmd.Process.Kill()
		<-p.done
	})
	deadline := time.Now().Add(60 * time.Second)
	for {
		if resp, err := http.Get(p.url + "/healthz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return p
			}
		}
		select {
		case err := <-p.done:
			t.Fatalf("toolgate serve exited: %v\n%s", err, p.stderr)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("toolgate serve did not answer in 60s\n%s", p.stderr)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// kill SIGKILLs the process and waits for it.
func (p *proc) kill(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-p.done
	p.done <- nil // for the cleanup
}

// term sends SIGTERM and waits (at most 60 s) for the process to end.
func (p *proc) term(t *testing.T) {
	t.Helper()
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		p.done <- nil
	case <-time.After(60 * time.Second):
		t.Fatalf("toolgate serve did not stop in 60s after SIGTERM\n%s", p.stderr)
	}
}

// readLog reads the data folder's whole audit log (read-only, as audit
// verify does, while a gateway may be running) and verifies it.
func readLog(t *testing.T, data string) []audit.Event {
	t.Helper()
	ctx := context.Background()
	st, err := sqlite.Open(filepath.Join(data, gateway.DBFile), &sqlite.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if rep, err := audit.Verify(ctx, st); err != nil || !rep.OK {
		t.Fatalf("audit verify: %+v %v", rep, err)
	}
	evs, err := audit.ReadEvents(ctx, st, 1, 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	return evs
}

func digest(t *testing.T, args any) string {
	t.Helper()
	raw, _ := json.Marshal(args)
	a, err := toolgate.ParseArgs(raw)
	if err != nil {
		t.Fatal(err)
	}
	return a.Digest
}

// TestCrashKeepsAnsweredDenials is the denial part of finding 11 of issue
// 7: denials already answered to clients were missing after a SIGKILL.
// Now each is durable before it is answered: kill the gateway right after
// the last answer, start it again, and every denial is in the log.
func TestCrashKeepsAnsweredDenials(t *testing.T) {
	e := newCrashEnv(t)
	p := e.start(t)
	cs := connect(t, p.url+"/mcp", crashKey)
	listNames(t, cs, 2)
	var want []string
	for i := range 20 {
		args := map[string]any{"message": fmt.Sprintf("deny-%d", i)}
		res, err := call(t, cs, "rec_echo", args)
		if err != nil || !res.IsError || structured(t, res)["code"] != "condition_failed" {
			t.Fatalf("denied call %d: %v %v", i, err, res)
		}
		want = append(want, "condition_failed "+digest(t, args))
	}
	for i := range 5 {
		args := map[string]any{"message": fmt.Sprintf("hidden-%d", i)}
		if _, err := call(t, cs, "rec_secret", args); err == nil {
			t.Fatalf("a call of a tool that does not exist succeeded")
		}
		want = append(want, "unknown_tool "+digest(t, args))
	}
	p.kill(t) // right after the last answer
	e.start(t)
	have := map[string]bool{}
	for _, ev := range readLog(t, e.data) {
		if ev.EventType == "agent.tool.unauthorized" {
			have[ev.Code+" "+ev.ArgsDigest] = true
		}
	}
	for _, w := range want {
		if !have[w] {
			t.Errorf("denial %s was answered before the SIGKILL but is not in the log", w)
		}
	}
}

// TestCrashMidCallMarksOutcomeUnknown is the completion part of finding 11:
// after a SIGKILL, calls that ran had no completion and nothing said their
// outcome was unknown. Calls run while the gateway is killed; after the
// restart, every call the upstream received has its allow record (the
// guarantee that held before: nothing runs unrecorded), and every allow
// has a completion or an agent.tool.outcome_unknown naming it.
func TestCrashMidCallMarksOutcomeUnknown(t *testing.T) {
	e := newCrashEnv(t)
	p := e.start(t)
	cs := connect(t, p.url+"/mcp", crashKey)
	listNames(t, cs, 2)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		call(t, cs, "rec_hang", map[string]any{"message": "in flight"}) // ends when the gateway dies
	}()
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := call(t, cs, "rec_echo", map[string]any{"message": fmt.Sprintf("ok-%d-%d", g, i)}); err != nil {
					return
				}
			}
		}()
	}
	storetest.WaitFor(t, 30*time.Second, "the upstream to receive the hanging call", func() bool {
		b, _ := os.ReadFile(e.received)
		return bytes.Contains(b, []byte(`"in flight"`)) && bytes.Count(b, []byte("\n")) > 20
	})
	p.kill(t)
	close(stop)
	wg.Wait()
	e.start(t)

	evs := readLog(t, e.data)
	allows := map[string]audit.Event{} // by event id
	byDigest := map[string][]string{}  // args digest -> allow ids
	settled := map[string]string{}     // allow id -> the type of the event that settles it
	for _, ev := range evs {
		switch ev.EventType {
		case "agent.tool.authorized":
			allows[ev.EventID] = ev
			byDigest[ev.ToolID+" "+ev.ArgsDigest] = append(byDigest[ev.ToolID+" "+ev.ArgsDigest], ev.EventID)
		case "agent.tool.completed", "agent.tool.failed", "agent.tool.outcome_unknown":
			if prev, ok := settled[ev.CausationID]; ok {
				t.Errorf("allow %s settled twice: %s and %s", ev.CausationID, prev, ev.EventType)
			}
			settled[ev.CausationID] = ev.EventType
		}
	}
	f, err := os.Open(e.received)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	received := 0
	for sc.Scan() {
		var c struct {
			Name      string         `json:"name"`
			Arguments map[string]any `json:"arguments"`
		}
		if err := json.Unmarshal(sc.Bytes(), &c); err != nil {
			t.Fatal(err)
		}
		received++
		if len(byDigest["tool:rec-"+c.Name+" "+digest(t, c.Arguments)]) == 0 {
			t.Errorf("the upstream ran %s %v, which has no allow record", c.Name, c.Arguments)
		}
	}
	unknown := 0
	for id, a := range allows {
		switch settled[id] {
		case "":
			t.Errorf("allow %s (%s %s) has neither a completion nor outcome_unknown", id, a.ToolName, a.ArgsDigest)
		case "agent.tool.outcome_unknown":
			unknown++
		}
	}
	hang := byDigest["tool:rec-hang "+digest(t, map[string]any{"message": "in flight"})]
	if len(hang) != 1 || settled[hang[0]] != "agent.tool.outcome_unknown" {
		t.Errorf("the call in flight at the kill: allows %v, settled by %q; want outcome_unknown", hang, settled[hang[0]])
	}
	for _, ev := range evs {
		if ev.EventType == "agent.tool.outcome_unknown" && (!strings.Contains(ev.Reason, "the gateway stopped") || allows[ev.CausationID].CorrelationID != ev.CorrelationID) {
			t.Errorf("outcome_unknown %+v: want the reason and the allow's correlation id", ev)
		}
	}
	t.Logf("%d calls received by the upstream, %d allows, %d marked outcome_unknown", received, len(allows), unknown)
}

// TestShutdownWithStoreDownSpills is the shutdown part of finding 11:
// everything queued was dropped when the gateway stopped while the store
// could not write. Now it is spilled to the data folder and appended at
// the next start.
func TestShutdownWithStoreDownSpills(t *testing.T) {
	storetest.RequireRoot(t) // chattr +i
	e := newCrashEnv(t)
	p := e.start(t)
	cs := connect(t, p.url+"/mcp", crashKey)
	listNames(t, cs, 2)
	if res, err := call(t, cs, "rec_echo", map[string]any{"message": "before"}); err != nil || res.IsError {
		t.Fatalf("call before the outage: %v %v", err, res)
	}
	// The store's files become unwritable (even their open descriptors).
	db := filepath.Join(e.data, gateway.DBFile)
	for _, f := range []string{db, db + "-wal"} {
		if out, err := exec.Command("chattr", "+i", f).CombinedOutput(); err != nil {
			t.Fatalf("chattr +i %s: %v %s", f, err, out)
		}
		t.Cleanup(func() { exec.Command("chattr", "-i", f).Run() })
	}
	var want []string
	for i := range 5 {
		args := map[string]any{"message": fmt.Sprintf("deny-out-%d", i)}
		if res, err := call(t, cs, "rec_echo", args); err != nil || structured(t, res)["code"] != "condition_failed" {
			t.Fatalf("denied call during the outage: %v %v", err, res)
		}
		want = append(want, "condition_failed "+digest(t, args))
	}
	args := map[string]any{"message": "allowed-out"}
	if res, err := call(t, cs, "rec_echo", args); err != nil || structured(t, res)["code"] != "internal_error" {
		t.Fatalf("an allowed call during the outage: %v %v; want internal_error", err, res)
	}
	want = append(want, "internal_error "+digest(t, args))
	cs.Close() // an open stream would hold the HTTP shutdown for its 10 s
	p.term(t)
	if !strings.Contains(p.stderr.String(), "spilled") {
		t.Errorf("the shutdown log does not say the events were spilled:\n%s", p.stderr)
	}
	spill := filepath.Join(e.data, gateway.SpillFile)
	if _, err := os.Stat(spill); err != nil {
		t.Fatalf("no spill file: %v", err)
	}
	for _, f := range []string{db, db + "-wal"} {
		if out, err := exec.Command("chattr", "-i", f).CombinedOutput(); err != nil {
			t.Fatalf("chattr -i %s: %v %s", f, err, out)
		}
	}
	e.start(t)
	if _, err := os.Stat(spill); !os.IsNotExist(err) {
		t.Errorf("the spill file is still there after the start: %v", err)
	}
	have := map[string]bool{}
	types := map[string]int{}
	for _, ev := range readLog(t, e.data) {
		types[ev.EventType]++
		if ev.EventType == "agent.tool.unauthorized" {
			have[ev.Code+" "+ev.ArgsDigest] = true
		}
	}
	for _, w := range want {
		if !have[w] {
			t.Errorf("event %s queued during the outage is not in the log after the restart", w)
		}
	}
	if types["audit.store_failed"] != 1 || types["gateway.started"] != 2 {
		t.Errorf("event types %v; want one audit.store_failed and two gateway.started", types)
	}
	// Finding N7: the spill carries the run's gateway.stopped, so the
	// next start knows it stopped cleanly.
	if types["gateway.stopped"] != 1 || types["gateway.unclean_stop"] != 0 {
		t.Errorf("event types %v; want the spilled gateway.stopped and no unclean stop", types)
	}
}

// startGatewayAt is startGateway with a data folder of the test's choice.
func startGatewayAt(t *testing.T, bundleDir, data string) *running {
	t.Helper()
	testenv.NodeModulesDir(t)
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan string, 1)
	var gwp *gateway.Gateway
	done := make(chan error, 1)
	go func() {
		done <- gateway.Run(ctx, gateway.Config{BundleDir: bundleDir, Listen: "127.0.0.1:0", DataDir: data,
			Ready: func(addr string) { ready <- addr },
			Mount: func(mux *http.ServeMux, gw *gateway.Gateway) { gwp = gw }}, nil)
	}()
	select {
	case addr := <-ready:
		t.Cleanup(func() {
			cancel()
			<-done
		})
		return &running{url: "http://" + addr + "/mcp", gw: gwp, data: data}
	case err := <-done:
		cancel()
		t.Fatalf("gateway did not start: %v", err)
	case <-time.After(60 * time.Second):
		cancel()
		t.Fatal("gateway did not start in 60s")
	}
	return nil
}

func readyz(t *testing.T, g *running) int {
	t.Helper()
	resp, err := http.Get(strings.TrimSuffix(g.url, "/mcp") + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestAllowedCallAnsweredWhileDiskFull is finding 10 of issue 7 through the
// gateway: with the data folder's file system full and more than one
// batch of denials queued, an allowed call is answered at once with
// internal_error (it hung before), /readyz is 503, and once the disk has
// room everything is written.
func TestAllowedCallAnsweredWhileDiskFull(t *testing.T) {
	fs := storetest.MountTmpfs(t, 16<<20)
	e := newCrashEnv(t)
	g := startGatewayAt(t, e.bundle, fs.Dir)
	cs := connect(t, g.url, crashKey)
	listNames(t, cs, 2)
	free := fs.Fill(t)
	for i := 0; i < 600 || g.gw.Rec.Err() == nil; i++ {
		if i > 20_000 {
			t.Fatal("the store never failed on a full file system")
		}
		if res, err := call(t, cs, "rec_echo", map[string]any{"message": fmt.Sprintf("deny-%d", i)}); err != nil || !res.IsError {
			t.Fatalf("denied call %d: %v %v", i, err, res)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "rec_echo", Arguments: map[string]any{"message": "allowed"}})
	if err != nil || !res.IsError || structured(t, res)["code"] != "internal_error" {
		t.Fatalf("an allowed call while the disk is full: %v %v; want internal_error", err, res)
	}
	if code := readyz(t, g); code != 503 {
		t.Errorf("/readyz %d while the store fails; want 503", code)
	}
	free()
	fctx, fcancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer fcancel()
	if err := g.gw.Rec.Flush(fctx); err != nil {
		t.Fatal(err)
	}
	if code := readyz(t, g); code != 200 {
		t.Errorf("/readyz %d after recovery; want 200", code)
	}
}

// TestReadyzWhileStoreStalls is the /readyz part of finding 14: a store
// that stops answering (here another connection holds SQLite's write lock)
// kept /readyz at 200 while calls stalled. Now /readyz turns 503 once a
// write has run longer than audit.DefaultStallAfter, allowed calls are
// refused at once, and it is 200 again when the store answers.
func TestReadyzWhileStoreStalls(t *testing.T) {
	e := newCrashEnv(t)
	g := startGatewayAt(t, e.bundle, t.TempDir())
	cs := connect(t, g.url, crashKey)
	listNames(t, cs, 2)
	if code := readyz(t, g); code != 200 {
		t.Fatalf("/readyz %d before the stall", code)
	}
	db, err := sql.Open("sqlite", filepath.Join(g.data, gateway.DBFile)+"?_busy_timeout=5000")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	tx, err := db.Begin()
	if err == nil {
		_, err = tx.Exec(`INSERT INTO toolgate_meta (key, value) VALUES ('lock', 'held') ON CONFLICT (key) DO UPDATE SET value = 'held'`)
	}
	if err != nil {
		t.Fatalf("hold the write lock: %v", err)
	}
	// A write that waits for the lock: the stall begins.
	go call(t, cs, "rec_echo", map[string]any{"message": "deny-waits"})
	storetest.WaitFor(t, 30*time.Second, "/readyz to turn 503", func() bool { return readyz(t, g) == 503 })
	res, err := call(t, cs, "rec_echo", map[string]any{"message": "allowed-during-stall"})
	if err != nil || structured(t, res)["code"] != "internal_error" {
		t.Errorf("an allowed call during the stall: %v %v; want internal_error", err, res)
	}
	tx.Rollback()
	storetest.WaitFor(t, 30*time.Second, "/readyz to be 200 again", func() bool { return readyz(t, g) == 200 })
}

// rssKiB returns the resident set size of process pid, in KiB.
func rssKiB(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			var kb int
			fmt.Sscanf(strings.TrimSpace(rest), "%d", &kb)
			return kb
		}
	}
	t.Fatal("no VmRSS")
	return 0
}

// TestFloodWhileStoreDownStaysBounded is finding 12 through a real gateway
// process: a key holder calls a tool it cannot see in a loop while the
// store cannot write. The gateway's memory stays bounded (it grew by
// 300 MiB before), and once the store writes again every call is in the
// log: one by one, or counted in the one audit.backlog_overflow summary.
func TestFloodWhileStoreDownStaysBounded(t *testing.T) {
	storetest.RequireRoot(t) // chattr +i
	e := newCrashEnv(t)
	p := e.start(t)
	cs := connect(t, p.url+"/mcp", crashKey)
	listNames(t, cs, 2)
	db := filepath.Join(e.data, gateway.DBFile)
	for _, f := range []string{db, db + "-wal"} {
		if out, err := exec.Command("chattr", "+i", f).CombinedOutput(); err != nil {
			t.Fatalf("chattr +i %s: %v %s", f, err, out)
		}
		t.Cleanup(func() { exec.Command("chattr", "-i", f).Run() })
	}
	before := rssKiB(t, p.cmd.Process.Pid)
	const workers, each = 16, 2500 // 40,000 calls: four times the queue's bound
	reason := strings.Repeat("y", 2000)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				_, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "rec_hidden", Arguments: map[string]any{"n": w*each + i, "pad": reason}})
				cancel()
				if err == nil {
					t.Errorf("a call of a tool that does not exist succeeded")
					return
				}
			}
		}()
	}
	wg.Wait()
	grown := rssKiB(t, p.cmd.Process.Pid) - before
	t.Logf("RSS grew by %d MiB over %d calls", grown>>10, workers*each)
	// The bounded queue holds at most 8 MiB of events (about 2.5 KiB each
	// here, so 3,300 of them); unbounded, 40,000 would hold over 100 MiB.
	if grown > 80<<10 {
		t.Errorf("the gateway's RSS grew by %d MiB during the flood; want it bounded", grown>>10)
	}
	for _, f := range []string{db, db + "-wal"} {
		if out, err := exec.Command("chattr", "-i", f).CombinedOutput(); err != nil {
			t.Fatalf("chattr -i %s: %v %s", f, err, out)
		}
	}
	var evs []audit.Event
	storetest.WaitFor(t, 60*time.Second, "the overflow summary to be written", func() bool {
		evs = readLog(t, e.data)
		for _, ev := range evs {
			if ev.EventType == "audit.backlog_overflow" {
				return true
			}
		}
		return false
	})
	seen, counted, summaries := 0, 0, 0
	var summary audit.Event
	for _, ev := range evs {
		switch {
		case ev.EventType == "agent.tool.unauthorized" && ev.ToolName == "rec_hidden":
			seen++
		case ev.EventType == "audit.backlog_overflow":
			summaries++
			summary = ev
			var n int
			fmt.Sscan(fmt.Sprint(ev.Details["count"]), &n)
			counted += n
		}
	}
	if summaries != 1 || seen+counted != workers*each {
		t.Fatalf("%d calls recorded one by one, %d counted in %d summaries; want all %d, in one summary", seen, counted, summaries, workers*each)
	}
	// Finding N6: the summary names who made the calls it counts.
	top, _ := summary.Details["top"].([]any)
	if len(top) == 0 {
		t.Fatalf("summary details %v; want the counts by caller", summary.Details)
	}
	g := top[0].(map[string]any)
	if g["principal"] != "user:crash" || g["agent_id"] != "crash-agent" || g["code"] != "unknown_tool" || fmt.Sprint(g["count"]) != fmt.Sprint(counted) {
		t.Errorf("the largest group %v; want all %d counted calls, by user:crash, crash-agent, unknown_tool", g, counted)
	}
}
