package mcpproxy

// Tests of the pass-through (passthrough.go) against real servers: the Go
// SDK's conformance everything-server over Streamable HTTP and the npm
// server-everything over stdio, behind a Proxy served on 127.0.0.1, with Go
// SDK clients as the gateway's clients.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolgate/toolgate/internal/testenv"
	"github.com/toolgate/toolgate/upstream"
)

// testKeys are the API keys of the two test clients; both run as the same
// agent and principal, so only the session tells them apart.
var testKeys = []string{"key-a", "key-b"}

// bundleFor is a bundle with the given Upstream documents, an agent whose
// ceiling is every tool of the everything-server (upstream "ev"), and two
// credentials.
func bundleFor(upstreams string) string {
	tools := []string{"test_simple_text", "test_sampling", "test_elicitation", "test_tool_with_progress",
		"test_tool_with_logging", "test_image_content", "test_input_required_result_list_roots"}
	extra := ""
	if strings.Contains(upstreams, "name: npm") {
		// Pass-through reaches an upstream only with one of its tools disclosed.
		extra = "    - {tool_id: tool:npm-echo, side_effect_class: read, approval_tier: auto}\n"
	}
	return agentBundle(upstreams, tools, extra)
}

// agentBundle is upstreams plus an agent whose ceiling holds the ev
// upstream's tools (upstream tool names) and extra ceiling lines, a
// principal that may invoke every tool, and a credential per test key.
func agentBundle(upstreams string, evTools []string, extra string) string {
	var ceiling strings.Builder
	for _, name := range evTools {
		fmt.Fprintf(&ceiling, "    - {tool_id: tool:ev-%s, side_effect_class: write, approval_tier: auto}\n", strings.ReplaceAll(name, "_", "-"))
	}
	ceiling.WriteString(extra)
	var creds strings.Builder
	for i, k := range testKeys {
		sum := sha256.Sum256([]byte(k))
		fmt.Fprintf(&creds, "- kind: Credential\n  name: client-%d\n  api_key_sha256: %s\n  principal: user:t\n  agent_id: t\n  deployment_mode: production\n",
			i, hex.EncodeToString(sum[:]))
	}
	return upstreams + `
- kind: Agent
  agent_id: t
  version: 1.0.0
  runtime_engine: go
  tool_permissions:
` + ceiling.String() + `
- kind: RuntimePolicy
  agent_id: t
  deployment_mode: production
  tool_authorization_policy:
    active_tool_set: all
    mcp_tool_policy: {mcp_write_approval_required: false}
- kind: Principal
  principal_id: user:t
  grants: [{resource: tool, action: invoke, scope: all}]
` + creds.String()
}

// evUpstream is the Upstream document of a Go everything-server at url,
// with its tools and prompts under their own names.
func evUpstream(url string) string {
	return fmt.Sprintf("- kind: Upstream\n  name: ev\n  transport: streamable-http\n  url: %s\n  tool_prefix: \"\"\n", url)
}

// npmUpstream is the Upstream document of the npm server-everything over
// stdio, with the default prefix npm_.
func npmUpstream(t *testing.T) string {
	return fmt.Sprintf("- kind: Upstream\n  name: npm\n  transport: stdio\n  command: %s\n  args: [%s, stdio]\n",
		testenv.NodeBin(t), testenv.NodePackageBin(t, "server-everything"))
}

// serveProxy compiles the bundle, connects its upstreams with the
// pass-through handlers, mirrors their tools as the gateway does, and
// serves the proxy on 127.0.0.1. It returns the MCP URL.
func serveProxy(t *testing.T, bundleYAML string) string {
	t.Helper()
	url, _ := serveProxyP(t, bundleYAML)
	return url
}

// serveProxyP is serveProxy, also returning the Proxy.
func serveProxyP(t *testing.T, bundleYAML string) (string, *Proxy) {
	t.Helper()
	return serveProxyR(t, bundleYAML, 0, nil)
}

type bearer struct {
	key  string
	base http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.key)
	return b.base.RoundTrip(r)
}

// client is a gateway client that records what the gateway relays to it.
type client struct {
	cs *mcp.ClientSession

	mu       sync.Mutex
	sampled  []string // prompts of sampling requests
	elicited []string // messages of elicitation requests
	progress []*mcp.ProgressNotificationParams
	logs     []*mcp.LoggingMessageParams
	updated  []string // resource URIs
	gotLog   chan struct{}
	gotUpd   chan struct{}
	// block, when set, is waited on inside the sampling handler, after a
	// value is sent on sampling.
	block, sampling chan struct{}
}

type declare struct{ sampling, elicitation, roots bool }

// connectClient connects to url with key; caps chooses the declared
// capabilities (through the handlers set).
func connectClient(t *testing.T, url, key string, caps declare) *client {
	t.Helper()
	c := &client{gotLog: make(chan struct{}, 100), gotUpd: make(chan struct{}, 100)}
	opts := &mcp.ClientOptions{
		Capabilities: &mcp.ClientCapabilities{},
		ProgressNotificationHandler: func(_ context.Context, r *mcp.ProgressNotificationClientRequest) {
			c.mu.Lock()
			c.progress = append(c.progress, r.Params)
			c.mu.Unlock()
		},
		LoggingMessageHandler: func(_ context.Context, r *mcp.LoggingMessageRequest) {
			c.mu.Lock()
			c.logs = append(c.logs, r.Params)
			c.mu.Unlock()
			c.gotLog <- struct{}{}
		},
		ResourceUpdatedHandler: func(_ context.Context, r *mcp.ResourceUpdatedNotificationRequest) {
			c.mu.Lock()
			c.updated = append(c.updated, r.Params.URI)
			c.mu.Unlock()
			c.gotUpd <- struct{}{}
		},
	}
	if caps.sampling {
		opts.CreateMessageHandler = func(ctx context.Context, r *mcp.CreateMessageRequest) (*mcp.CreateMessageResult, error) {
			text := ""
			if len(r.Params.Messages) > 0 {
				if tc, ok := r.Params.Messages[0].Content.(*mcp.TextContent); ok {
					text = tc.Text
				}
			}
			c.mu.Lock()
			c.sampled = append(c.sampled, text)
			block, entered := c.block, c.sampling
			c.mu.Unlock()
			if block != nil {
				entered <- struct{}{}
				select {
				case <-block:
				case <-ctx.Done():
					return nil, ctx.Err()
				}
			}
			return &mcp.CreateMessageResult{Role: "assistant", Model: "test", Content: &mcp.TextContent{Text: "sampled for " + key}}, nil
		}
	}
	if caps.elicitation {
		opts.ElicitationHandler = func(_ context.Context, r *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			c.mu.Lock()
			c.elicited = append(c.elicited, r.Params.Message)
			c.mu.Unlock()
			return &mcp.ElicitResult{Action: "accept", Content: map[string]any{"username": "user-" + key}}, nil
		}
	}
	if caps.roots {
		opts.Capabilities.RootsV2 = &mcp.RootCapabilities{}
	}
	cl := mcp.NewClient(&mcp.Implementation{Name: "test-" + key, Version: "1"}, opts)
	if caps.roots {
		cl.AddRoots(&mcp.Root{URI: "file:///work/" + key, Name: key})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cs, err := cl.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url,
		HTTPClient: &http.Client{Transport: bearer{key: key, base: http.DefaultTransport}}}, nil)
	if err != nil {
		t.Fatalf("connect %s: %v", key, err)
	}
	t.Cleanup(func() { cs.Close() })
	c.cs = cs
	return c
}

// connectDirect connects a plain Go client to an upstream, to compare.
func connectDirect(t *testing.T, url string) *mcp.ClientSession {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "direct", Version: "1"}, nil).Connect(ctx,
		&mcp.StreamableClientTransport{Endpoint: url}, &mcp.ClientSessionOptions{ProtocolVersion: upstream.ProtocolVersion})
	if err != nil {
		t.Fatalf("connect directly: %v", err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

func callText(t *testing.T, cs *mcp.ClientSession, params *mcp.CallToolParams) (string, bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := cs.CallTool(ctx, params)
	if err != nil {
		t.Fatalf("call %s: %v", params.Name, err)
	}
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String(), res.IsError
}

// waitFor waits until cond holds, polling the client (the mirror and
// notifications arrive asynchronously); it fails after 15 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for i := 0; i < 300; i++ {
		if cond() {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for %s", what)
}

func resourceURIs(t *testing.T, cs *mcp.ClientSession) []string {
	t.Helper()
	var uris []string
	for r, err := range cs.Resources(context.Background(), nil) {
		if err != nil {
			t.Fatalf("resources/list: %v", err)
		}
		uris = append(uris, r.URI)
	}
	slices.Sort(uris)
	return uris
}

func promptNames(t *testing.T, cs *mcp.ClientSession) []string {
	t.Helper()
	var names []string
	for p, err := range cs.Prompts(context.Background(), nil) {
		if err != nil {
			t.Fatalf("prompts/list: %v", err)
		}
		names = append(names, p.Name)
	}
	slices.Sort(names)
	return names
}

// TestPassThroughContent: resources, templates, prompts and completions
// read through the gateway are what the upstream itself returns.
func TestPassThroughContent(t *testing.T) {
	ev := testenv.StartEverythingServer(t, "")
	url := serveProxy(t, bundleFor(evUpstream(ev.URL)))
	direct := connectDirect(t, ev.URL)
	gw := connectClient(t, url, testKeys[0], declare{}).cs
	ctx := context.Background()

	want := resourceURIs(t, direct)
	waitFor(t, "the mirrored resources", func() bool { return len(resourceURIs(t, gw)) == len(want) })
	if diff := cmp.Diff(want, resourceURIs(t, gw)); diff != "" {
		t.Errorf("resources/list (-direct +gateway):\n%s", diff)
	}
	dt, err := direct.ListResourceTemplates(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	gt, err := gw.ListResourceTemplates(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(dt.ResourceTemplates, gt.ResourceTemplates); diff != "" {
		t.Errorf("resources/templates/list (-direct +gateway):\n%s", diff)
	}
	// The mirror lists resources, templates and prompts one after another.
	waitFor(t, "the mirrored prompts", func() bool { return len(promptNames(t, gw)) == len(promptNames(t, direct)) })
	if diff := cmp.Diff(promptNames(t, direct), promptNames(t, gw)); diff != "" {
		t.Errorf("prompts/list (-direct +gateway):\n%s", diff)
	}

	for _, uri := range []string{"test://static-text", "test://static-binary", "test://template/42/data", "test://watched-resource"} {
		t.Run("read "+uri, func(t *testing.T) {
			d, err := direct.ReadResource(ctx, &mcp.ReadResourceParams{URI: uri})
			if err != nil {
				t.Fatal(err)
			}
			g, err := gw.ReadResource(ctx, &mcp.ReadResourceParams{URI: uri})
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(d.Contents, g.Contents); diff != "" {
				t.Errorf("contents (-direct +gateway):\n%s", diff)
			}
		})
	}
	t.Run("read unknown", func(t *testing.T) {
		_, derr := direct.ReadResource(ctx, &mcp.ReadResourceParams{URI: "test://nope"})
		_, gerr := gw.ReadResource(ctx, &mcp.ReadResourceParams{URI: "test://nope"})
		if derr == nil || gerr == nil {
			t.Fatalf("want errors, got direct %v, gateway %v", derr, gerr)
		}
	})
	t.Run("prompt with arguments", func(t *testing.T) {
		params := &mcp.GetPromptParams{Name: "test_prompt_with_arguments", Arguments: map[string]string{"arg1": "x", "arg2": "y"}}
		d, err := direct.GetPrompt(ctx, params)
		if err != nil {
			t.Fatal(err)
		}
		g, err := gw.GetPrompt(ctx, params)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(d.Messages, g.Messages); diff != "" {
			t.Errorf("messages (-direct +gateway):\n%s", diff)
		}
	})
	t.Run("completion", func(t *testing.T) {
		params := &mcp.CompleteParams{Ref: &mcp.CompleteReference{Type: "ref/prompt", Name: "test_prompt_with_arguments"},
			Argument: mcp.CompleteParamsArgument{Name: "arg1", Value: "t"}}
		d, err := direct.Complete(ctx, params)
		if err != nil {
			t.Fatal(err)
		}
		g, err := gw.Complete(ctx, params)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(d.Completion, g.Completion); diff != "" {
			t.Errorf("completion (-direct +gateway):\n%s", diff)
		}
	})
	t.Run("ping and logging/setLevel are answered", func(t *testing.T) {
		if err := gw.Ping(ctx, nil); err != nil {
			t.Error(err)
		}
		if err := gw.SetLoggingLevel(ctx, &mcp.SetLoggingLevelParams{Level: "info"}); err != nil {
			t.Error(err)
		}
	})
}

// TestPassThroughRouting: what an upstream sends while serving a call
// reaches the session that made the call, and only that session.
func TestPassThroughRouting(t *testing.T) {
	ev := testenv.StartEverythingServer(t, "")
	url := serveProxy(t, bundleFor(evUpstream(ev.URL)))
	a := connectClient(t, url, testKeys[0], declare{sampling: true, elicitation: true})
	b := connectClient(t, url, testKeys[1], declare{sampling: true, elicitation: true})
	ctx := context.Background()
	waitFor(t, "the mirrored tools", func() bool {
		res, err := a.cs.ListTools(ctx, nil)
		return err == nil && len(res.Tools) >= 6
	})

	t.Run("sampling goes to the caller only", func(t *testing.T) {
		text, isErr := callText(t, a.cs, &mcp.CallToolParams{Name: "test_sampling", Arguments: map[string]any{"prompt": "from a"}})
		if isErr || !strings.Contains(text, "sampled for key-a") {
			t.Errorf("result %q (isError %v), want the answer of client a", text, isErr)
		}
		a.mu.Lock()
		b.mu.Lock()
		if diff := cmp.Diff([]string{"from a"}, a.sampled); diff != "" {
			t.Errorf("client a's sampling requests (-want +got):\n%s", diff)
		}
		if len(b.sampled) != 0 {
			t.Errorf("client b was asked to sample %q", b.sampled)
		}
		a.sampled = nil
		b.mu.Unlock()
		a.mu.Unlock()
	})
	t.Run("elicitation goes to the caller only", func(t *testing.T) {
		text, isErr := callText(t, b.cs, &mcp.CallToolParams{Name: "test_elicitation", Arguments: map[string]any{"message": "who is b"}})
		if isErr || !strings.Contains(text, "user-key-b") {
			t.Errorf("result %q (isError %v), want the answer of client b", text, isErr)
		}
		a.mu.Lock()
		defer a.mu.Unlock()
		if len(a.elicited) != 0 {
			t.Errorf("client a was asked %q", a.elicited)
		}
	})
	t.Run("a client without the capability is not asked", func(t *testing.T) {
		plain := connectClient(t, url, testKeys[1], declare{})
		text, isErr := callText(t, plain.cs, &mcp.CallToolParams{Name: "test_sampling", Arguments: map[string]any{"prompt": "p"}})
		if !isErr || !strings.Contains(text, "did not declare sampling") {
			t.Errorf("result %q (isError %v), want the refusal", text, isErr)
		}
		a.mu.Lock()
		b.mu.Lock()
		defer b.mu.Unlock()
		defer a.mu.Unlock()
		if len(a.sampled)+len(b.sampled) != 0 {
			t.Errorf("another client was asked: a %q, b %q", a.sampled, b.sampled)
		}
	})
	t.Run("roots are the caller's", func(t *testing.T) {
		withRoots := connectClient(t, url, testKeys[1], declare{roots: true})
		text, isErr := callText(t, withRoots.cs, &mcp.CallToolParams{Name: "test_input_required_result_list_roots", Arguments: map[string]any{}})
		if isErr || !strings.Contains(text, "1 root(s): file:///work/key-b") {
			t.Errorf("result %q (isError %v), want the caller's root", text, isErr)
		}
		// The server's SDK turns the failed roots/list into an error.
		_, err := a.cs.CallTool(ctx, &mcp.CallToolParams{Name: "test_input_required_result_list_roots", Arguments: map[string]any{}})
		if err == nil || !strings.Contains(err.Error(), "did not declare roots") {
			t.Errorf("got %v, want the refusal for a client without roots", err)
		}
	})
	t.Run("progress reaches the caller only, with its token", func(t *testing.T) {
		text, _ := callText(t, a.cs, &mcp.CallToolParams{Name: "test_tool_with_progress", Arguments: map[string]any{},
			Meta: mcp.Meta{"progressToken": "tok-a"}})
		if text != "tok-a" {
			t.Errorf("the upstream saw token %q, want the client's own", text)
		}
		if err := b.cs.Ping(ctx, nil); err != nil {
			t.Fatal(err)
		}
		a.mu.Lock()
		b.mu.Lock()
		defer b.mu.Unlock()
		defer a.mu.Unlock()
		var got []string
		for _, p := range a.progress {
			got = append(got, fmt.Sprintf("%v %v/%v", p.ProgressToken, p.Progress, p.Total))
		}
		if diff := cmp.Diff([]string{"tok-a 0/100", "tok-a 50/100", "tok-a 100/100"}, got); diff != "" {
			t.Errorf("client a's progress (-want +got):\n%s", diff)
		}
		if len(b.progress) != 0 {
			t.Errorf("client b got progress %v", b.progress)
		}
	})
	t.Run("log messages of a call reach the caller only", func(t *testing.T) {
		for _, c := range []*client{a, b} {
			if err := c.cs.SetLoggingLevel(ctx, &mcp.SetLoggingLevelParams{Level: "debug"}); err != nil {
				t.Fatal(err)
			}
		}
		callText(t, a.cs, &mcp.CallToolParams{Name: "test_tool_with_logging", Arguments: map[string]any{}})
		for i := 0; i < 3; i++ {
			select {
			case <-a.gotLog:
			case <-time.After(10 * time.Second):
				t.Fatalf("client a got %d of 3 log messages", i)
			}
		}
		a.mu.Lock()
		b.mu.Lock()
		defer b.mu.Unlock()
		defer a.mu.Unlock()
		var got []any
		for _, l := range a.logs {
			got = append(got, l.Data)
		}
		if diff := cmp.Diff([]any{"Tool execution started", "Tool processing data", "Tool execution completed"}, got); diff != "" {
			t.Errorf("client a's log messages (-want +got):\n%s", diff)
		}
		if len(b.logs) != 0 {
			t.Errorf("client b got log messages %v", b.logs)
		}
	})
	// Two clients' calls in flight on one upstream, each asking its client
	// to sample. On the fast path (no _meta) each request comes back on its
	// own call's stream, so each reaches its own client. On the SDK path (a
	// progress token sends the call through the SDK client) the gateway
	// cannot tell the two apart, so the second is refused, never misrouted.
	for _, tc := range []struct {
		name string
		meta func(tok string) mcp.Meta
		// refused: b's request is refused rather than relayed to b
		refused bool
	}{
		{"fast path: requests of two clients in flight each reach their own client", func(string) mcp.Meta { return nil }, false},
		{"SDK path: requests of two clients in flight are refused, not misrouted", func(tok string) mcp.Meta { return mcp.Meta{"progressToken": tok} }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			release, entered := make(chan struct{}), make(chan struct{}, 1)
			a.mu.Lock()
			a.block, a.sampling = release, entered
			a.sampled = nil
			a.mu.Unlock()
			b.mu.Lock()
			b.sampled = nil
			b.mu.Unlock()
			done := make(chan string, 1)
			go func() {
				text, _ := callText(t, a.cs, &mcp.CallToolParams{Name: "test_sampling", Arguments: map[string]any{"prompt": "slow a"}, Meta: tc.meta("pa")})
				done <- text
			}()
			<-entered // a's call is in flight, waiting in a's sampling handler
			text, isErr := callText(t, b.cs, &mcp.CallToolParams{Name: "test_sampling", Arguments: map[string]any{"prompt": "b meanwhile"}, Meta: tc.meta("pb")})
			if tc.refused {
				if !isErr || !strings.Contains(text, "cannot tell which client") {
					t.Errorf("b's result %q (isError %v), want the refusal", text, isErr)
				}
			} else if isErr || !strings.Contains(text, "sampled for key-b") {
				t.Errorf("b's result %q (isError %v), want b's own sampling", text, isErr)
			}
			close(release)
			if text := <-done; !strings.Contains(text, "sampled for key-a") {
				t.Errorf("a's result %q", text)
			}
			a.mu.Lock()
			a.block = nil
			if slices.Contains(a.sampled, "b meanwhile") {
				t.Errorf("client a was asked %q", a.sampled)
			}
			a.mu.Unlock()
			b.mu.Lock()
			defer b.mu.Unlock()
			if slices.Contains(b.sampled, "slow a") || (tc.refused && slices.Contains(b.sampled, "b meanwhile")) {
				t.Errorf("client b was asked %q", b.sampled)
			}
		})
	}
	t.Run("resource updates reach subscribers only", func(t *testing.T) {
		if err := a.cs.Subscribe(ctx, &mcp.SubscribeParams{URI: "test://watched-resource"}); err != nil {
			t.Fatal(err)
		}
		select {
		case <-a.gotUpd: // the server updates it every 3 s
		case <-time.After(15 * time.Second):
			t.Fatal("no notifications/resources/updated")
		}
		if err := a.cs.Unsubscribe(ctx, &mcp.UnsubscribeParams{URI: "test://watched-resource"}); err != nil {
			t.Fatal(err)
		}
		b.mu.Lock()
		defer b.mu.Unlock()
		if len(b.updated) != 0 {
			t.Errorf("client b got updates for %q", b.updated)
		}
	})
}

// TestPassThroughTwoUpstreams: with two upstreams, prompts, resources,
// templates and completions are routed to the upstream that owns them.
func TestPassThroughTwoUpstreams(t *testing.T) {
	ev := testenv.StartEverythingServer(t, "")
	// Beside another upstream, each needs a prefix of its own.
	evPrefixed := fmt.Sprintf("- kind: Upstream\n  name: ev\n  transport: streamable-http\n  url: %s\n  tool_prefix: ev_\n", ev.URL)
	url := serveProxy(t, bundleFor(evPrefixed+npmUpstream(t)))
	gw := connectClient(t, url, testKeys[0], declare{}).cs
	ctx := context.Background()
	waitFor(t, "the prompts of both upstreams", func() bool {
		names := promptNames(t, gw)
		return slices.Contains(names, "npm_simple-prompt") && slices.Contains(names, "ev_test_simple_prompt")
	})

	prompts := []struct{ name, want string }{
		{"ev_test_simple_prompt", "This is a simple prompt for testing."},
		{"npm_simple-prompt", "This is a simple prompt without arguments."},
	}
	for _, tc := range prompts {
		t.Run("prompt "+tc.name, func(t *testing.T) {
			res, err := gw.GetPrompt(ctx, &mcp.GetPromptParams{Name: tc.name})
			if err != nil {
				t.Fatal(err)
			}
			if got := res.Messages[0].Content.(*mcp.TextContent).Text; got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
	reads := []struct{ uri, want string }{
		{"test://static-text", "This is the content of the static text resource."},
		{"demo://resource/dynamic/text/7", "7"},
		{"demo://resource/static/document/features.md", "#"},
	}
	for _, tc := range reads {
		t.Run("read "+tc.uri, func(t *testing.T) {
			res, err := gw.ReadResource(ctx, &mcp.ReadResourceParams{URI: tc.uri})
			if err != nil {
				t.Fatal(err)
			}
			if len(res.Contents) == 0 || !strings.Contains(res.Contents[0].Text, tc.want) {
				t.Errorf("contents %+v, want text with %q", res.Contents, tc.want)
			}
		})
	}
	t.Run("a URI nobody listed is not guessed", func(t *testing.T) {
		if _, err := gw.ReadResource(ctx, &mcp.ReadResourceParams{URI: "test://nope"}); err == nil {
			t.Error("read of an unlisted URI with two resource upstreams succeeded")
		}
	})
	t.Run("completion of a prompt argument", func(t *testing.T) {
		res, err := gw.Complete(ctx, &mcp.CompleteParams{Ref: &mcp.CompleteReference{Type: "ref/prompt", Name: "npm_completable-prompt"},
			Argument: mcp.CompleteParamsArgument{Name: "department", Value: "E"}})
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(res.Completion.Values, "Engineering") {
			t.Errorf("values %q, want Engineering", res.Completion.Values)
		}
	})
}

// TestProgressTokens: a client's token is forwarded as is, unless another
// request in flight on the same upstream uses it.
func TestProgressTokens(t *testing.T) {
	r := newRelay(&Proxy{})
	ctx := context.Background()
	calls := []struct {
		upstream string
		token    any
		want     any
	}{
		{"a", "t1", "t1"},
		{"a", 7.0, 7.0},
		{"a", "t1", gatewayTokenPrefix + "1"},
		{"b", "t1", "t1"},
		{"a", gatewayTokenPrefix + "2", gatewayTokenPrefix + "2"},
		{"a", "t1", gatewayTokenPrefix + "3"},
		{"a", nil, nil},
	}
	var got, want []any
	for _, c := range calls {
		meta := mcp.Meta{}
		if c.token != nil {
			meta["progressToken"] = c.token
		}
		out := r.track(ctx, c.upstream, nil, nil, meta)
		got = append(got, out.meta["progressToken"])
		want = append(want, c.want)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("tokens sent upstream (-want +got):\n%s", diff)
	}
}
