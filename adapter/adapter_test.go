package adapter_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolgate/toolgate"
	"github.com/toolgate/toolgate/adapter"
	"github.com/toolgate/toolgate/upstream"
)

var errDown = errors.New("upstream is down")

// fakeTime is an injected clock and sleep that record the waits.
type fakeTime struct {
	now    time.Time
	sleeps []time.Duration
}

func (f *fakeTime) opts(r float64) *adapter.Options {
	return &adapter.Options{
		Now: func() time.Time { return f.now },
		Sleep: func(ctx context.Context, d time.Duration) error {
			f.sleeps = append(f.sleeps, d)
			f.now = f.now.Add(d)
			return ctx.Err()
		},
		Rand: func() float64 { return r },
	}
}

func TestRetriesBySideEffectClass(t *testing.T) {
	transient := adapter.Transient(fmt.Errorf("tools/call: %w", errDown))
	toolErr := errors.New("no such column: x")
	refusal := &toolgate.Error{Code: toolgate.CodeUnsafeQuery, Layer: toolgate.LayerResource, Message: "not read-only"}
	for _, tc := range []struct {
		name      string
		policy    adapter.Policy
		errs      []error // what each attempt returns; nil = success
		wantCalls int
		wantErr   error
	}{
		{"read retries a transient failure", adapter.Policy{Class: toolgate.SideEffectRead}, []error{transient, nil}, 2, nil},
		{"none retries a transient failure", adapter.Policy{Class: toolgate.SideEffectNone}, []error{transient, transient, nil}, 3, nil},
		{"read gives up after max attempts", adapter.Policy{Class: toolgate.SideEffectRead, MaxAttempts: 2}, []error{transient, transient, nil}, 2, errDown},
		{"default is three attempts", adapter.Policy{Class: toolgate.SideEffectRead}, []error{transient, transient, transient, nil}, 3, errDown},
		{"write does not retry", adapter.Policy{Class: toolgate.SideEffectWrite, MaxAttempts: 5}, []error{transient, nil}, 1, errDown},
		{"idempotent write retries", adapter.Policy{Class: toolgate.SideEffectWrite, Idempotent: true}, []error{transient, nil}, 2, nil},
		{"irreversible never retries", adapter.Policy{Class: toolgate.SideEffectIrreversible, Idempotent: true, MaxAttempts: 9}, []error{transient, nil}, 1, errDown},
		{"the tool's own error is not retried", adapter.Policy{Class: toolgate.SideEffectRead}, []error{toolErr, nil}, 1, toolErr},
		{"a refusal is not retried", adapter.Policy{Class: toolgate.SideEffectRead}, []error{refusal, nil}, 1, refusal},
		{"success first time", adapter.Policy{Class: toolgate.SideEffectIrreversible}, []error{nil}, 1, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ft := &fakeTime{now: time.Unix(0, 0)}
			calls := 0
			log, err := adapter.New(ft.opts(0.5)).Do(context.Background(), tc.policy, func(context.Context) error {
				e := tc.errs[calls]
				calls++
				return e
			})
			if calls != tc.wantCalls || len(log) != tc.wantCalls {
				t.Errorf("calls %d, attempt log %d, want %d", calls, len(log), tc.wantCalls)
			}
			if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil) != (err == nil) {
				t.Errorf("err %v, want %v", err, tc.wantErr)
			}
			if len(ft.sleeps) != tc.wantCalls-1 {
				t.Errorf("slept %v, want %d waits", ft.sleeps, tc.wantCalls-1)
			}
		})
	}
}

func TestBackoffIsExponentialWithJitter(t *testing.T) {
	p := adapter.Policy{Class: toolgate.SideEffectRead, MaxAttempts: 6, InitialBackoff: 100 * time.Millisecond, MaxBackoff: 500 * time.Millisecond}
	fail := func(context.Context) error { return adapter.Transient(errDown) }
	for _, tc := range []struct {
		name string
		rand float64
		want []time.Duration
	}{
		// The wait is drawn from [d/2, d]: rand 0 gives d/2, rand ~1 gives d.
		{"lowest jitter", 0, []time.Duration{50, 100, 200, 250, 250}},
		{"middle jitter", 0.5, []time.Duration{75, 150, 300, 375, 375}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ft := &fakeTime{now: time.Unix(0, 0)}
			log, _ := adapter.New(ft.opts(tc.rand)).Do(context.Background(), p, fail)
			want := make([]time.Duration, len(tc.want))
			for i, w := range tc.want {
				want[i] = w * time.Millisecond
			}
			if diff := cmp.Diff(want, ft.sleeps); diff != "" {
				t.Errorf("waits (-want +got):\n%s", diff)
			}
			var backoffs []int64
			for _, a := range log {
				backoffs = append(backoffs, a.BackoffMS)
			}
			if diff := cmp.Diff([]int64{int64(tc.want[0]), int64(tc.want[1]), int64(tc.want[2]), int64(tc.want[3]), int64(tc.want[4]), 0}, backoffs); diff != "" {
				t.Errorf("recorded backoffs (-want +got):\n%s", diff)
			}
		})
	}
	if got := (adapter.Policy{}).Backoff(1); got != adapter.DefaultInitialBackoff {
		t.Errorf("default first backoff %s", got)
	}
	if got := (adapter.Policy{}).Backoff(30); got != adapter.DefaultMaxBackoff {
		t.Errorf("default backoff cap %s", got)
	}
}

func TestAttemptTimeoutIsTransient(t *testing.T) {
	ft := &fakeTime{now: time.Unix(0, 0)}
	calls := 0
	log, err := adapter.New(ft.opts(0)).Do(context.Background(), adapter.Policy{Class: toolgate.SideEffectRead, Timeout: time.Millisecond},
		func(ctx context.Context) error {
			calls++
			if calls == 1 {
				<-ctx.Done() // a tool that hangs until its attempt times out
				return ctx.Err()
			}
			return nil
		})
	if err != nil || calls != 2 {
		t.Fatalf("err %v after %d calls; want success on the second", err, calls)
	}
	if !strings.Contains(log[0].Error, "attempt timed out") || !log[0].Transient {
		t.Errorf("first attempt %+v, want a transient timeout", log[0])
	}

	// The same hang on an irreversible tool: one attempt, an ErrTimeout.
	_, err = adapter.New(ft.opts(0)).Do(context.Background(), adapter.Policy{Class: toolgate.SideEffectIrreversible, Timeout: time.Millisecond},
		func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() })
	if !errors.Is(err, adapter.ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("err %v, want ErrTimeout wrapping DeadlineExceeded", err)
	}
}

func TestCallerCancellationStops(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	calls := 0
	_, err := adapter.New(&adapter.Options{Sleep: func(ctx context.Context, d time.Duration) error { return ctx.Err() }}).Do(ctx,
		adapter.Policy{Class: toolgate.SideEffectRead, MaxAttempts: 5}, func(context.Context) error {
			calls++
			cancel()
			return adapter.Transient(errDown)
		})
	if calls != 1 || !errors.Is(err, errDown) {
		t.Errorf("calls %d err %v; want one attempt and its error", calls, err)
	}
}

func TestPanicIsAnError(t *testing.T) {
	_, err := adapter.New(nil).Do(context.Background(), adapter.Policy{Class: toolgate.SideEffectRead},
		func(context.Context) error { panic("boom") })
	if err == nil || !strings.Contains(err.Error(), "panicked: boom") || adapter.IsTransient(err) {
		t.Errorf("err %v", err)
	}
}

func TestCapResult(t *testing.T) {
	text := func(s string) mcp.Content { return &mcp.TextContent{Text: s} }
	texts := func(r *mcp.CallToolResult) []string {
		var out []string
		for _, c := range r.Content {
			if tc, ok := c.(*mcp.TextContent); ok {
				out = append(out, tc.Text)
			} else {
				out = append(out, fmt.Sprintf("<%T>", c))
			}
		}
		return out
	}
	img := &mcp.ImageContent{MIMEType: "image/png", Data: []byte(strings.Repeat("x", 2000))}
	for _, tc := range []struct {
		name    string
		in      *mcp.CallToolResult
		max     int
		wantCut bool
		check   func(t *testing.T, got *mcp.CallToolResult)
	}{
		{"fits", &mcp.CallToolResult{Content: []mcp.Content{text("hello")}}, 1024, false, nil},
		{"long text is cut and marked", &mcp.CallToolResult{Content: []mcp.Content{text(strings.Repeat("line of text\n", 500))}}, 1024, true,
			func(t *testing.T, got *mcp.CallToolResult) {
				all := strings.Join(texts(got), "\n")
				if len(all) > 1024+200 || !strings.Contains(all, "[truncated: ") || !strings.Contains(all, "capped at 1024 bytes") {
					t.Errorf("cut text (%d bytes):\n%s", len(all), all)
				}
			}},
		{"items after the cut are dropped and counted", &mcp.CallToolResult{Content: []mcp.Content{text(strings.Repeat("a", 900)), img, text("tail")}}, 1024, true,
			func(t *testing.T, got *mcp.CallToolResult) {
				ts := texts(got)
				if len(ts) != 2 || !strings.Contains(ts[1], "2 more content items") {
					t.Errorf("contents %q", ts)
				}
			}},
		{"large structured content is dropped with a marker", &mcp.CallToolResult{Content: []mcp.Content{text("ok")},
			StructuredContent: map[string]any{"rows": strings.Repeat("r", 5000)}}, 1024, true,
			func(t *testing.T, got *mcp.CallToolResult) {
				if got.StructuredContent != nil || !strings.Contains(strings.Join(texts(got), "\n"), "structuredContent (") {
					t.Errorf("got %v %q", got.StructuredContent, texts(got))
				}
			}},
		{"structured content up to twice the cap stays", &mcp.CallToolResult{Content: []mcp.Content{text("ok")},
			StructuredContent: map[string]any{"rows": strings.Repeat("r", 1500)}}, 1024, false, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := texts(tc.in)
			got, cut := adapter.CapResult(tc.in, tc.max)
			if cut != tc.wantCut {
				t.Fatalf("cut %v, want %v", cut, tc.wantCut)
			}
			if diff := cmp.Diff(before, texts(tc.in)); diff != "" {
				t.Errorf("the input was modified (-before +after):\n%s", diff)
			}
			if !cut && got != tc.in {
				t.Error("an uncut result was copied")
			}
			if tc.check != nil {
				tc.check(t, got)
			}
		})
	}
}

// TestReadLimit: the gateway reads an upstream answer up to ReadFactor
// times the result cap, and the upstream package's default is the limit
// for the default cap.
func TestReadLimit(t *testing.T) {
	tests := []struct {
		name     string
		maxBytes int
		want     int
	}{
		{"unset: the default cap of 64 KiB", 0, 1 << 20},
		{"negative: the default cap", -5, 1 << 20},
		{"the default cap", 64 << 10, 1 << 20},
		{"1 KiB", 1 << 10, 16 << 10},
		{"4 MiB", 4 << 20, 64 << 20},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := adapter.ReadLimit(tc.maxBytes); got != tc.want {
				t.Errorf("ReadLimit(%d) = %d, want %d", tc.maxBytes, got, tc.want)
			}
		})
	}
	if got := adapter.ReadLimit(0); got != upstream.DefaultMaxResultBytes {
		t.Errorf("ReadLimit(0) = %d, upstream.DefaultMaxResultBytes = %d: they must agree", got, upstream.DefaultMaxResultBytes)
	}
}
