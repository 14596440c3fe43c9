package upstream_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolgate/toolgate/internal/testenv"
	"github.com/toolgate/toolgate/upstream"
)

// states records Options.OnState calls and lets a test wait for one.
type states struct {
	mu  sync.Mutex
	got []upstream.State
	ch  chan struct{} // signalled (capacity 1) on every call
}

func newStates() *states { return &states{ch: make(chan struct{}, 1)} }

func (s *states) on(_ string, st upstream.State) {
	s.mu.Lock()
	s.got = append(s.got, st)
	s.mu.Unlock()
	select {
	case s.ch <- struct{}{}:
	default:
	}
}

// count returns how many times OnState reported st.
func (s *states) count(st upstream.State) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, g := range s.got {
		if g == st {
			n++
		}
	}
	return n
}

// waitFor waits until OnState has reported st n times in all, for at most
// within; it reports whether it did.
func (s *states) waitFor(st upstream.State, n int, within time.Duration) bool {
	deadline := time.NewTimer(within)
	defer deadline.Stop()
	for s.count(st) < n {
		select {
		case <-s.ch:
		case <-deadline.C:
			return s.count(st) >= n
		}
	}
	return true
}

// slack is added to a documented bound when a test waits for it to be
// kept: room for a loaded machine, far below the minute the SDK's own
// session takes to notice a Streamable HTTP server that is gone (issue 7,
// finding 9).
const slack = 3 * time.Second

// TestHealthCheckMarksStoppedHTTPUpstreamDown (issue 7, finding 9): a
// Streamable HTTP upstream whose server is killed is reported down through
// OnState within HealthInterval + HealthTimeout, with no request made to
// it; once a server listens on the same port again it is reported up.
func TestHealthCheckMarksStoppedHTTPUpstreamDown(t *testing.T) {
	t.Parallel()
	srv := testenv.StartEverythingServer(t, "")
	st := newStates()
	const interval, timeout = 300 * time.Millisecond, time.Second
	m := start(t, []upstream.Config{{Name: "hr", Transport: upstream.TransportStreamableHTTP, URL: srv.URL}}, &upstream.Options{
		OnState:        st.on,
		HealthInterval: interval,
		HealthTimeout:  timeout,
		BackoffBase:    50 * time.Millisecond,
		BackoffMax:     200 * time.Millisecond,
	})
	if !st.waitFor(upstream.StateUp, 1, time.Second) {
		t.Fatal("OnState never reported the upstream up")
	}
	// Several checks pass while the server runs: the upstream stays up.
	time.Sleep(3 * interval)
	if n := st.count(upstream.StateDown); n != 0 {
		t.Fatalf("OnState reported down %d times while the server ran", n)
	}

	srv.Kill()
	if !st.waitFor(upstream.StateDown, 1, interval+timeout+slack) {
		t.Fatalf("OnState did not report down within %s of the server's death (HealthInterval %s + HealthTimeout %s + %s)",
			interval+timeout+slack, interval, timeout, slack)
	}
	s := statusOf(m, "hr")
	if s.State != upstream.StateDown || s.LastError == nil || !strings.Contains(s.LastError.Error(), "health check (periodic) failed") {
		t.Errorf("Status after the server died = %s, %v; want down by a periodic health check", s.State, s.LastError)
	}
	if _, err := m.Session("hr"); !errors.Is(err, upstream.ErrDown) {
		t.Errorf("Session while down = %v, want ErrDown", err)
	}

	testenv.StartEverythingServer(t, srv.Addr)
	if !st.waitFor(upstream.StateUp, 2, 20*time.Second) {
		t.Fatal("OnState did not report the upstream up again after the server came back")
	}
	if res := call(t, m, "hr", "test_simple_text", nil); res.IsError {
		t.Errorf("call after the server came back: %s", text(t, res))
	}
}

// TestFailedRequestTriggersHealthCheck (issue 7, finding 9): with the
// periodic check an hour away, any kind of request to a killed Streamable
// HTTP upstream that fails has it checked at once, and reported down
// within HealthTimeout: not only tools/call.
func TestFailedRequestTriggersHealthCheck(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		// prepare runs while the server is up and returns the request to
		// make once it is dead.
		prepare func(t *testing.T, m *upstream.Manager) func(ctx context.Context) error
	}{
		{name: "resources/read", prepare: func(t *testing.T, m *upstream.Manager) func(ctx context.Context) error {
			cs := session(t, m)
			res, err := cs.ListResources(context.Background(), nil)
			if err != nil || len(res.Resources) == 0 {
				t.Fatalf("resources/list = %v, %v; want resources", res, err)
			}
			uri := res.Resources[0].URI
			if _, err := cs.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: uri}); err != nil {
				t.Fatalf("resources/read %s while up: %v", uri, err)
			}
			return func(ctx context.Context) error {
				_, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: uri})
				return err
			}
		}},
		{name: "prompts/get", prepare: func(t *testing.T, m *upstream.Manager) func(ctx context.Context) error {
			cs := session(t, m)
			res, err := cs.ListPrompts(context.Background(), nil)
			if err != nil || len(res.Prompts) == 0 {
				t.Fatalf("prompts/list = %v, %v; want prompts", res, err)
			}
			p := res.Prompts[0]
			args := map[string]string{}
			for _, a := range p.Arguments {
				args[a.Name] = "x"
			}
			return func(ctx context.Context) error {
				_, err := cs.GetPrompt(ctx, &mcp.GetPromptParams{Name: p.Name, Arguments: args})
				return err
			}
		}},
		{name: "resources/list", prepare: func(t *testing.T, m *upstream.Manager) func(ctx context.Context) error {
			cs := session(t, m)
			return func(ctx context.Context) error {
				_, err := cs.ListResources(ctx, nil)
				return err
			}
		}},
		{name: "direct post", prepare: func(t *testing.T, m *upstream.Manager) func(ctx context.Context) error {
			d, err := m.Direct("hr")
			if err != nil {
				t.Fatalf("Direct: %v", err)
			}
			return func(ctx context.Context) error {
				resp, err := d.Post(ctx, []byte(`{"jsonrpc":"2.0","method":"notifications/roots/list_changed"}`))
				if err == nil {
					resp.Body.Close()
				}
				return err
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := testenv.StartEverythingServer(t, "")
			st := newStates()
			const timeout = time.Second
			g := newGate()
			m := start(t, []upstream.Config{{Name: "hr", Transport: upstream.TransportStreamableHTTP, URL: srv.URL}}, &upstream.Options{
				OnState:        st.on,
				HealthInterval: time.Hour,
				HealthTimeout:  timeout,
				Sleep:          g.sleep,
			})
			request := tc.prepare(t, m)

			srv.Kill()
			if err := request(context.Background()); err == nil {
				t.Fatal("the request to a dead upstream succeeded")
			}
			if !st.waitFor(upstream.StateDown, 1, timeout+slack) {
				t.Fatalf("OnState did not report down within %s of the failed request (HealthTimeout %s + %s)", timeout+slack, timeout, slack)
			}
			s := statusOf(m, "hr")
			if s.LastError == nil || !strings.Contains(s.LastError.Error(), "health check (after a failed request) failed") {
				t.Errorf("LastError = %v, want a health check after a failed request", s.LastError)
			}
			g.nextDelay(t) // the restart is scheduled with the backoff
		})
	}
}

func session(t *testing.T, m *upstream.Manager) *mcp.ClientSession {
	t.Helper()
	cs, err := m.Session("hr")
	if err != nil {
		t.Fatalf("Session: %v", err)
	}
	return cs
}

// pingCounter is an in-process Go SDK server over Streamable HTTP whose
// pings take delay to answer; it counts them and the most in flight at once.
type pingCounter struct {
	delay             time.Duration
	inflight, maxSeen atomic.Int32
	total             atomic.Int32
}

func (p *pingCounter) middleware(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		if method != "ping" {
			return next(ctx, method, req)
		}
		n := p.inflight.Add(1)
		defer p.inflight.Add(-1)
		for {
			m := p.maxSeen.Load()
			if n <= m || p.maxSeen.CompareAndSwap(m, n) {
				break
			}
		}
		p.total.Add(1)
		select {
		case <-time.After(p.delay):
		case <-ctx.Done():
		}
		return next(ctx, method, req)
	}
}

// TestHealthChecksDoNotPileUp: with checks due far more often than a ping
// takes, and failed requests asking for more, one check at most is in flight
// per upstream; a slow ping that answers within HealthTimeout keeps the
// upstream up; and no check runs after Close.
func TestHealthChecksDoNotPileUp(t *testing.T) {
	t.Parallel()
	pc := &pingCounter{delay: 100 * time.Millisecond}
	srv := mcp.NewServer(&mcp.Implementation{Name: "slow-ping", Version: "1"}, nil)
	mcp.AddTool(srv, &mcp.Tool{Name: "echo"}, func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "ok"}}}, nil, nil
	})
	srv.AddReceivingMiddleware(pc.middleware)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil)}
	go hs.Serve(l)
	t.Cleanup(func() { hs.Close() })

	st := newStates()
	m, err := upstream.New([]upstream.Config{{Name: "hr", Transport: upstream.TransportStreamableHTTP, URL: "http://" + l.Addr().String()}}, &upstream.Options{
		Logger:         testLogger(t),
		OnState:        st.on,
		HealthInterval: time.Millisecond,
		HealthTimeout:  5 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := m.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	d, err := m.Direct("hr")
	if err != nil {
		t.Fatal(err)
	}
	// Failed requests, each asking for a check: the server refuses a body
	// that is not JSON (HTTP 400).
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() {
			if resp, err := d.Post(context.Background(), []byte("not json")); err == nil {
				resp.Body.Close()
				t.Error("the server accepted a body that is not JSON")
			}
		})
	}
	wg.Wait()
	eventually(t, "5 health checks", func() bool { return pc.total.Load() >= 5 })
	if got := pc.maxSeen.Load(); got != 1 {
		t.Errorf("at most %d pings were in flight at once, want 1", got)
	}
	if n := st.count(upstream.StateDown); n != 0 {
		t.Errorf("OnState reported down %d times for pings slower than the interval but within the timeout", n)
	}

	m.Close()
	time.Sleep(pc.delay) // a ping sent just before Close reaches the server
	after := pc.total.Load()
	time.Sleep(5 * pc.delay)
	if got := pc.total.Load(); got != after {
		t.Errorf("%d pings after Close, want none", got-after)
	}
}

// TestHealthCheckStdio: a stdio upstream that holds back its answer to a
// ping while it keeps sending (its output queued behind other messages) is
// busy, not gone, and stays up; one that holds it back and sends nothing
// (hung, though its process runs) is reported down within HealthInterval +
// HealthTimeout, and its call in flight fails with ErrDown.
func TestHealthCheckStdio(t *testing.T) {
	t.Parallel()
	const interval, timeout = 50 * time.Millisecond, 500 * time.Millisecond
	tests := []struct {
		name     string
		tool     string
		ms       int
		wantDown bool
	}{
		{name: "busy and sending stays up", tool: "busy", ms: 1500},
		{name: "hung and silent goes down", tool: "mute", ms: 30000, wantDown: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			st := newStates()
			g := newGate()
			cfg := upstream.Config{
				Name:      "busy",
				Transport: upstream.TransportStdio,
				Command:   testenv.NodeBin(t),
				Args:      []string{filepath.Join("testdata", "busy-server.js")},
			}
			m := start(t, []upstream.Config{cfg}, &upstream.Options{
				OnState: st.on, HealthInterval: interval, HealthTimeout: timeout, Sleep: g.sleep,
			})
			callErr := make(chan error, 1)
			go func() {
				res, err := m.CallTool(context.Background(), "busy", &mcp.CallToolParams{Name: tc.tool, Arguments: map[string]any{"ms": tc.ms}})
				if err == nil && text(t, res) != "done" {
					err = errors.New("answer " + text(t, res))
				}
				callErr <- err
			}()
			if !tc.wantDown {
				if err := <-callErr; err != nil {
					t.Fatalf("call %s: %v", tc.tool, err)
				}
				if n := st.count(upstream.StateDown); n != 0 {
					t.Errorf("OnState reported down %d times while the upstream was busy sending", n)
				}
				return
			}
			if !st.waitFor(upstream.StateDown, 1, interval+timeout+slack) {
				t.Fatalf("OnState did not report the hung upstream down within %s", interval+timeout+slack)
			}
			if err := <-callErr; !errors.Is(err, upstream.ErrDown) {
				t.Errorf("call in flight on the hung upstream = %v, want ErrDown", err)
			}
			g.nextDelay(t) // the restart is scheduled with the backoff
		})
	}
}
