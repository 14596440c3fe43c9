package mcpproxy

// Regression tests of issue 7 (security review findings) for the MCP
// enforcement point, against real Go SDK upstreams on 127.0.0.1 that
// record every message they receive, behind a Proxy served on 127.0.0.1.

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolgate/toolgate/internal/testenv"
)

// goUpstream is a Go SDK MCP server over Streamable HTTP that records the
// methods it receives, the resource URIs it is asked to read or subscribe
// to, and the logging levels it is set to.
type goUpstream struct {
	URL  string
	Name string
	srv  *mcp.Server

	mu      sync.Mutex
	methods []string
	reads   []string
	subs    []string
	levels  []string
	metas   []mcp.Meta // of reads and prompts/get
}

func (u *goUpstream) got() (methods, reads, subs, levels []string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return slices.Clone(u.methods), slices.Clone(u.reads), slices.Clone(u.subs), slices.Clone(u.levels)
}

// upstreamOpts says what a goUpstream serves: tools (by name; each answers
// "<upstream>:<tool>"), resource templates (each read answers
// "<upstream>:<uri>"), and whether it declares logging, completions and
// subscriptions.
type upstreamOpts struct {
	tools     []string
	templates []string
	resources []string
	prompts   []string
	logging   bool
}

func startGoUpstream(t *testing.T, name string, o upstreamOpts) *goUpstream {
	t.Helper()
	u := &goUpstream{Name: name}
	so := &mcp.ServerOptions{
		SubscribeHandler: func(_ context.Context, r *mcp.SubscribeRequest) error {
			u.mu.Lock()
			u.subs = append(u.subs, r.Params.URI)
			u.mu.Unlock()
			return nil
		},
		UnsubscribeHandler: func(context.Context, *mcp.UnsubscribeRequest) error { return nil },
		CompletionHandler: func(_ context.Context, r *mcp.CompleteRequest) (*mcp.CompleteResult, error) {
			return &mcp.CompleteResult{Completion: mcp.CompletionResultDetails{Values: []string{name + ":" + r.Params.Ref.URI + r.Params.Ref.Name}}}, nil
		},
	}
	if o.logging {
		so.Capabilities = &mcp.ServerCapabilities{Logging: &mcp.LoggingCapabilities{}}
	}
	srv := mcp.NewServer(&mcp.Implementation{Name: name, Version: "1"}, so)
	u.srv = srv
	srv.AddReceivingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			u.mu.Lock()
			u.methods = append(u.methods, method)
			if r, ok := req.(*mcp.ServerRequest[*mcp.SetLoggingLevelParams]); ok && r.Params != nil {
				u.levels = append(u.levels, string(r.Params.Level))
			}
			u.mu.Unlock()
			return next(ctx, method, req)
		}
	})
	for _, tool := range o.tools {
		srv.AddTool(&mcp.Tool{Name: tool, InputSchema: map[string]any{"type": "object"}},
			func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
				return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: name + ":" + tool}}}, nil
			})
	}
	read := func(_ context.Context, r *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
		u.mu.Lock()
		u.reads = append(u.reads, r.Params.URI)
		u.metas = append(u.metas, r.Params.Meta)
		u.mu.Unlock()
		return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: r.Params.URI, Text: name + ":" + r.Params.URI}}}, nil
	}
	for _, tmpl := range o.templates {
		srv.AddResourceTemplate(&mcp.ResourceTemplate{URITemplate: tmpl, Name: name + "-files"}, read)
	}
	for _, uri := range o.resources {
		srv.AddResource(&mcp.Resource{URI: uri, Name: name + "-" + uri}, read)
	}
	for _, pr := range o.prompts {
		srv.AddPrompt(&mcp.Prompt{Name: pr}, func(_ context.Context, r *mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
			u.mu.Lock()
			u.metas = append(u.metas, r.Params.Meta)
			u.mu.Unlock()
			return &mcp.GetPromptResult{Messages: []*mcp.PromptMessage{{Role: "user", Content: &mcp.TextContent{Text: name + ":" + pr}}}}, nil
		})
	}
	ts := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil))
	t.Cleanup(ts.Close)
	u.URL = ts.URL
	return u
}

// agentSpec is one credential of multiBundle: its key, and the agent it
// binds with the ceiling tools (tool ids).
type agentSpec struct {
	key, agent string
	tools      []string
}

// multiBundle is the Upstream documents of ups (each with the default
// prefix <name>_), an agent per spec with its ceiling, a principal that
// may invoke everything, a credential per spec, and extra documents.
func multiBundle(ups []*goUpstream, specs []agentSpec, extra string) string {
	var b strings.Builder
	for _, u := range ups {
		fmt.Fprintf(&b, "- kind: Upstream\n  name: %s\n  transport: streamable-http\n  url: %s\n", u.Name, u.URL)
	}
	for _, s := range specs {
		fmt.Fprintf(&b, "- kind: Agent\n  agent_id: %s\n  version: 1.0.0\n  runtime_engine: go\n  tool_permissions:\n", s.agent)
		for _, tool := range s.tools {
			fmt.Fprintf(&b, "    - {tool_id: %s, side_effect_class: write, approval_tier: auto}\n", tool)
		}
		if len(s.tools) == 0 {
			b.WriteString("    []\n")
		}
		fmt.Fprintf(&b, "- kind: RuntimePolicy\n  agent_id: %s\n  deployment_mode: production\n  tool_authorization_policy:\n    active_tool_set: all\n    mcp_tool_policy: {mcp_write_approval_required: false}\n", s.agent)
		if s.key != "" {
			sum := sha256.Sum256([]byte(s.key))
			fmt.Fprintf(&b, "- kind: Credential\n  name: cred-%s\n  api_key_sha256: %s\n  principal: user:t\n  agent_id: %s\n  deployment_mode: production\n", s.key, hex.EncodeToString(sum[:]), s.agent)
		}
	}
	b.WriteString("- kind: Principal\n  principal_id: user:t\n  grants: [{resource: tool, action: invoke, scope: all}]\n")
	b.WriteString(extra)
	return b.String()
}

// rpcCode is the JSON-RPC error code of err, or 0.
func rpcCode(err error) int64 {
	var e *jsonrpc.Error
	if errors.As(err, &e) {
		return e.Code
	}
	return 0
}

// readText reads a resource and returns its text, or the error.
func readText(cs *mcp.ClientSession, uri string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: uri})
	if err != nil {
		return "", err
	}
	if len(res.Contents) == 0 {
		return "", nil
	}
	return res.Contents[0].Text, nil
}

func waitTools(t *testing.T, cs *mcp.ClientSession, n int) {
	t.Helper()
	waitFor(t, fmt.Sprintf("%d tools listed", n), func() bool {
		res, err := cs.ListTools(context.Background(), nil)
		return err == nil && len(res.Tools) == n
	})
}

// TestResourceOwnerIsOneChoice (issue 7, finding 1): of two upstreams with
// overlapping templates, docs (file:///{+path}, reachable) and hr
// (file:///hr/{+path}, hidden from caller a), the read of
// file:///hr/salaries.csv is never answered by hr for a (nor by docs: the
// URI is hr's), in 40 of 40 tries; caller b, who may reach both, gets hr's
// answer every time. Subscriptions and completions follow the same owner.
// URIs whose percent-decoding could change their path are refused before
// any upstream sees them.
func TestResourceOwnerIsOneChoice(t *testing.T) {
	docs := startGoUpstream(t, "docs", upstreamOpts{tools: []string{"find"}, templates: []string{"file:///{+path}"}})
	hr := startGoUpstream(t, "hr", upstreamOpts{tools: []string{"pay"}, templates: []string{"file:///hr/{+path}"}})
	url := serveProxy(t, multiBundle([]*goUpstream{docs, hr}, []agentSpec{
		{key: "key-a", agent: "a", tools: []string{"tool:docs-find"}},
		{key: "key-b", agent: "b", tools: []string{"tool:docs-find", "tool:hr-pay"}},
	}, ""))
	a := connectClient(t, url, "key-a", declare{}).cs
	b := connectClient(t, url, "key-b", declare{}).cs
	waitTools(t, a, 1)
	waitTools(t, b, 2)
	waitFor(t, "both templates mirrored", func() bool {
		res, err := b.ListResourceTemplates(context.Background(), nil)
		return err == nil && len(res.ResourceTemplates) == 2
	})
	hrReads := func() int { _, r, _, _ := hr.got(); return len(r) }
	docsReads := func() int { _, r, _, _ := docs.got(); return len(r) }

	for i := 0; i < 40; i++ {
		if text, err := readText(a, "file:///hr/salaries.csv"); rpcCode(err) != mcp.CodeResourceNotFound {
			t.Fatalf("try %d: a read file:///hr/salaries.csv: %q, %v; want Resource not found", i, text, err)
		}
		if text, err := readText(b, "file:///hr/salaries.csv"); err != nil || text != "hr:file:///hr/salaries.csv" {
			t.Fatalf("try %d: b read file:///hr/salaries.csv: %q, %v; want hr's answer", i, text, err)
		}
	}
	if n := hrReads(); n != 40 {
		t.Errorf("hr was asked %d reads, want 40 (b's only)", n)
	}
	if n := docsReads(); n != 0 {
		t.Errorf("docs was asked %d reads of hr's URI, want 0", n)
	}
	if text, err := readText(a, "file:///notes/a.md"); err != nil || text != "docs:file:///notes/a.md" {
		t.Errorf("a read file:///notes/a.md: %q, %v; want docs's answer", text, err)
	}

	// Subscriptions and completions: the same owner, the same check.
	ctx := context.Background()
	if err := a.Subscribe(ctx, &mcp.SubscribeParams{URI: "file:///hr/salaries.csv"}); rpcCode(err) != mcp.CodeResourceNotFound {
		t.Errorf("a subscribe to hr's URI: %v, want Resource not found", err)
	}
	if err := b.Subscribe(ctx, &mcp.SubscribeParams{URI: "file:///hr/salaries.csv"}); err != nil {
		t.Errorf("b subscribe to hr's URI: %v", err)
	}
	if _, _, subs, _ := hr.got(); !slices.Equal(subs, []string{"file:///hr/salaries.csv"}) {
		t.Errorf("hr subscriptions = %q, want b's only", subs)
	}
	if _, _, subs, _ := docs.got(); len(subs) != 0 {
		t.Errorf("docs got subscriptions %q, want none", subs)
	}
	complete := func(cs *mcp.ClientSession, uri string) (string, error) {
		res, err := cs.Complete(ctx, &mcp.CompleteParams{Ref: &mcp.CompleteReference{Type: "ref/resource", URI: uri},
			Argument: mcp.CompleteParamsArgument{Name: "path", Value: "s"}})
		if err != nil {
			return "", err
		}
		return strings.Join(res.Completion.Values, ","), nil
	}
	for _, uri := range []string{"file:///hr/{+path}", "file:///hr/salaries.csv"} {
		if got, err := complete(a, uri); rpcCode(err) != mcp.CodeResourceNotFound {
			t.Errorf("a complete %s: %q, %v; want Resource not found", uri, got, err)
		}
		if got, err := complete(b, uri); err != nil || got != "hr:"+uri {
			t.Errorf("b complete %s: %q, %v; want hr's answer", uri, got, err)
		}
	}

	// Odd encodings, for b (who may reach both: the URI itself is refused,
	// for its form, at the composition layer; the refusal names no
	// upstream), and for a, who is told the same.
	before := hrReads() + docsReads()
	for _, uri := range []string{
		`file:///hr%2Fsalaries.csv`,
		`file:///docs/%2e%2e/hr/salaries.csv`,
		`file:///docs/%2E%2E%2Fhr%2Fsalaries.csv`,
		`file:///docs/../hr/salaries.csv`,
		`file:///docs/./../hr/salaries.csv`,
		`file:///hr\salaries.csv`,
		`file:///hr/%5c..%5csecret`,
		`file:///hr/a%00.csv`,
		`file:///hr/%252e%252e/secret`,
		`file:///hr/%zz`,
		"file:///hr/a\x01b",
	} {
		for who, cs := range map[string]*mcp.ClientSession{"a": a, "b": b} {
			text, err := readText(cs, uri)
			if rpcCode(err) != AccessRefusedCode || !strings.Contains(err.Error(), "malformed_call") || strings.Contains(err.Error(), "upstream hr") || strings.Contains(err.Error(), "upstream docs") {
				t.Errorf("%s read %q: %q, %v; want a malformed_call refusal naming no upstream", who, uri, text, err)
			}
		}
	}
	if after := hrReads() + docsReads(); after != before {
		t.Errorf("the upstreams were asked %d reads of refused URIs", after-before)
	}
}

// TestOwnerOfURI is the resolution rule (gating.go) as a table: exact URIs
// first, then the matching template with the longest literal prefix, a
// tie refused as ambiguous, then the sole upstream with resources.
func TestOwnerOfURI(t *testing.T) {
	r := newRelay(&Proxy{})
	r.resOwner["file:///hr/public.txt"] = "docs" // listed exactly: wins over any template
	for tmpl, up := range map[string]string{
		"file:///{+path}":       "docs",
		"file:///hr/{+path}":    "hr",
		"file:///hr/{name}.csv": "hr2", // same literal prefix as hr's
		"db://{table}/rows":     "db",
		"db://orders/{id}":      "orders",
	} {
		r.tmplOwner[tmpl] = up
		r.tmplCompiled[tmpl] = compileTemplate(tmpl)
	}
	cases := []struct {
		name, uri, owner, why string
	}{
		{"exact listing wins", "file:///hr/public.txt", "docs", ""},
		{"longest prefix", "file:///hr/a/b.txt", "hr", ""},
		{"shorter prefix", "file:///notes/a.md", "docs", ""},
		{"tie is ambiguous", "file:///hr/salaries.csv", "", "ambiguous"},
		{"literal beats expression", "db://orders/7", "orders", ""},
		{"other table", "db://users/rows", "db", ""},
		{"no match", "https://example.com/", "", "no upstream"},
		{"space is fine", "file:///a%20b.txt", "docs", ""},
		// Routing judges no URI's form: the decision refuses these for it
		// (composition layer) before their owner counts, so they are never
		// forwarded (TestResourceOwnerIsOneChoice, gateway's
		// TestOnePipeline).
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			owner, why := r.ownerOfURI(tc.uri)
			if owner != tc.owner || !strings.Contains(why, tc.why) || (tc.why == "") != (why == "") {
				t.Errorf("ownerOfURI(%q) = %q, %q; want %q, %q", tc.uri, owner, why, tc.owner, tc.why)
			}
		})
	}
}

// rawList posts a list request and returns the result member.
func rawList(t *testing.T, url, key, sid, method, cursor string) (map[string]json.RawMessage, *jsonrpc.Error) {
	t.Helper()
	params := `{}`
	if cursor != "" {
		params = `{"cursor":` + string(mustJSON(cursor)) + `}`
	}
	_, body := post(t, url, key, sid, `{"jsonrpc":"2.0","id":9,"method":"`+method+`","params":`+params+`}`)
	body = sseData(body)
	var msg struct {
		Result map[string]json.RawMessage `json:"result"`
		Error  *jsonrpc.Error             `json:"error"`
	}
	if err := json.Unmarshal([]byte(body), &msg); err != nil {
		t.Fatalf("%s: %v in %s", method, err, body)
	}
	return msg.Result, msg.Error
}

// sseData is the data of the last event of an SSE body, or the body.
func sseData(body string) string {
	if !strings.Contains(body, "data: ") {
		return body
	}
	var last string
	for _, line := range strings.Split(body, "\n") {
		if d, ok := strings.CutPrefix(line, "data: "); ok {
			last = d
		}
	}
	return last
}

// TestListsAreNeverNull (issue 7, finding 2): for a caller that may reach
// nothing, every list is an empty array, never null; for one that may
// reach something, its part.
func TestListsAreNeverNull(t *testing.T) {
	up := startGoUpstream(t, "docs", upstreamOpts{tools: []string{"find"}, templates: []string{"file:///{+path}"},
		resources: []string{"file:///readme.md"}, prompts: []string{"summarize"}})
	url := serveProxy(t, multiBundle([]*goUpstream{up}, []agentSpec{
		{key: "key-none", agent: "none"},
		{key: "key-some", agent: "some", tools: []string{"tool:docs-find"}},
	}, ""))
	some := openRaw2(t, url, "key-some", "docs_find")
	none := openRaw(t, url, "key-none")
	lists := []struct{ method, member string }{
		{"tools/list", "tools"}, {"resources/list", "resources"},
		{"resources/templates/list", "resourceTemplates"}, {"prompts/list", "prompts"},
	}
	for _, l := range lists {
		res, rpcErr := rawList(t, url, "key-none", none, l.method, "")
		if rpcErr != nil || string(res[l.member]) != "[]" {
			t.Errorf("%s for a caller that may reach nothing: %s = %s (error %v), want []", l.method, l.member, res[l.member], rpcErr)
		}
		waitFor(t, l.method+" for the other caller", func() bool {
			res, rpcErr := rawList(t, url, "key-some", some, l.method, "")
			return rpcErr == nil && len(res[l.member]) > 2
		})
	}
}

// openRaw opens a session as a raw client and returns its id.
func openRaw(t *testing.T, url, key string) string {
	t.Helper()
	resp, body := post(t, url, key, "", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`)
	sid := resp.Header.Get("Mcp-Session-Id")
	if sid == "" {
		t.Fatalf("initialize: HTTP %d %s", resp.StatusCode, body)
	}
	post(t, url, key, sid, `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	return sid
}

// TestToolsListFiltersBeforePaging (issue 7, finding 4): an upstream
// announcing 20,000 tools, 8 of them disclosed: tools/list is one page of
// the 8 with no nextCursor. With a page size of 3 it is three pages, whose
// cursors are opaque and bound to the session and the catalog generation.
func TestToolsListFiltersBeforePaging(t *testing.T) {
	var names, ceiling []string
	for i := range 20000 {
		names = append(names, fmt.Sprintf("t%05d", i))
	}
	for i := 0; i < 20000; i += 2500 {
		ceiling = append(ceiling, fmt.Sprintf("tool:big-t%05d", i))
	}
	up := startGoUpstream(t, "big", upstreamOpts{tools: names})
	bundle := multiBundle([]*goUpstream{up}, []agentSpec{{key: "key-a", agent: "a", tools: ceiling}, {key: "key-b", agent: "b", tools: ceiling}}, "")

	t.Run("one page", func(t *testing.T) {
		url := serveProxy(t, bundle)
		sid := openRaw2(t, url, "key-a", "big_t17500")
		res, rpcErr := rawList(t, url, "key-a", sid, "tools/list", "")
		var tools []*mcp.Tool
		json.Unmarshal(res["tools"], &tools)
		if rpcErr != nil || len(tools) != 8 || res["nextCursor"] != nil {
			t.Errorf("tools/list: %d tools, nextCursor %s, error %v; want the 8 disclosed, no cursor", len(tools), res["nextCursor"], rpcErr)
		}
	})

	t.Run("paged", func(t *testing.T) {
		url, p := serveProxyEnv(t, bundle, proxyEnv{opts: &Options{PageSize: 3}})
		sid := openRaw(t, url, "key-a")
		other := openRaw(t, url, "key-b")
		waitFor(t, "the mirrored tools", func() bool {
			res, _ := rawList(t, url, "key-a", sid, "tools/list", "")
			return strings.Contains(string(res["tools"]), "big_t00000")
		})
		var got []string
		var cursors []string
		cursor := ""
		for page := 0; page < 10; page++ {
			res, rpcErr := rawList(t, url, "key-a", sid, "tools/list", cursor)
			if rpcErr != nil {
				t.Fatalf("page %d: %v", page, rpcErr)
			}
			var tools []*mcp.Tool
			json.Unmarshal(res["tools"], &tools)
			if len(tools) == 0 {
				t.Errorf("page %d is empty", page)
			}
			for _, tool := range tools {
				got = append(got, tool.Name)
			}
			if res["nextCursor"] == nil {
				break
			}
			json.Unmarshal(res["nextCursor"], &cursor)
			cursors = append(cursors, cursor)
		}
		var want []string
		for _, id := range ceiling {
			want = append(want, "big_"+strings.TrimPrefix(id, "tool:big-"))
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("the pages (-want +got):\n%s", diff)
		}
		if len(cursors) != 2 {
			t.Fatalf("%d cursors, want 2", len(cursors))
		}
		for _, c := range cursors {
			raw, _ := base64.RawURLEncoding.DecodeString(c)
			for _, name := range names {
				if strings.Contains(c, name) || strings.Contains(string(raw), name) {
					t.Fatalf("cursor %q shows the tool name %s", c, name)
				}
			}
		}
		refused := func(what, session, key, cursor string) {
			t.Helper()
			_, rpcErr := rawList(t, url, key, session, "tools/list", cursor)
			if rpcErr == nil || rpcErr.Code != jsonrpc.CodeInvalidParams {
				t.Errorf("%s: error %v, want invalid params", what, rpcErr)
			}
		}
		refused("another session's cursor", other, "key-b", cursors[0])
		_, rpcErr := rawList(t, url, "key-a", sid, "prompts/list", cursors[0])
		if rpcErr == nil || rpcErr.Code != jsonrpc.CodeInvalidParams {
			t.Errorf("a tools/list cursor for prompts/list: error %v, want invalid params", rpcErr)
		}
		refused("a made-up cursor", sid, "key-a", base64.RawURLEncoding.EncodeToString([]byte("big_t05000")))
		refused("an altered cursor", sid, "key-a", cursors[0][:len(cursors[0])-2]+"AA")
		p.lists.changed() // the catalog moves on: old cursors are stale
		refused("a stale cursor", sid, "key-a", cursors[0])
	})
}

// tsList runs the TypeScript SDK client (testdata/tslist.cjs) against url
// with key and returns what it listed, or its error output.
func tsList(t *testing.T, url, key string) (map[string][]string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, testenv.NodeBin(t), "testdata/tslist.cjs", url, key)
	cmd.Env = append(os.Environ(), "NODE_PATH="+testenv.NodeModulesDir(t))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Sprintf("%v: %s", err, stderr.String())
	}
	var got map[string][]string
	if err := json.Unmarshal(out, &got); err != nil {
		return nil, fmt.Sprintf("%v: %s", err, out)
	}
	return got, ""
}

// TestTypeScriptClientLists (issue 7, finding 2): the TypeScript SDK
// client (@modelcontextprotocol/sdk, which validates every list against
// the MCP schema) lists tools, resources, templates and prompts through
// the gateway without error, for a caller that may reach nothing and one
// that may reach something.
func TestTypeScriptClientLists(t *testing.T) {
	up := startGoUpstream(t, "docs", upstreamOpts{tools: []string{"find"}, templates: []string{"file:///{+path}"},
		resources: []string{"file:///readme.md"}, prompts: []string{"summarize"}})
	url := serveProxy(t, multiBundle([]*goUpstream{up}, []agentSpec{
		{key: "key-none", agent: "none"},
		{key: "key-some", agent: "some", tools: []string{"tool:docs-find"}},
	}, ""))
	openRaw2(t, url, "key-some", "docs_find") // the mirror is built
	waitFor(t, "the mirrored prompts", func() bool {
		got, _ := tsList(t, url, "key-some")
		return got != nil && len(got["prompts"]) == 1
	})
	got, errOut := tsList(t, url, "key-none")
	if diff := cmp.Diff(map[string][]string{"tools": {}, "resources": {}, "resourceTemplates": {}, "prompts": {}}, got); diff != "" || errOut != "" {
		t.Errorf("a caller that may reach nothing (-want +got):\n%s%s", diff, errOut)
	}
	got, errOut = tsList(t, url, "key-some")
	want := map[string][]string{"tools": {"docs_find"}, "resources": {"file:///readme.md"},
		"resourceTemplates": {"file:///{+path}"}, "prompts": {"docs_summarize"}}
	if diff := cmp.Diff(want, got); diff != "" || errOut != "" {
		t.Errorf("a caller that may reach docs (-want +got):\n%s%s", diff, errOut)
	}
}

// TestOwnMetaNotForwardedOnPassThrough: the gateway's own _meta namespace
// (io.toolgate/...) reaches no upstream on resources/read and prompts/get
// either (class "Decide on exactly what runs": an upstream reads as the
// gateway's only what the gateway sent); other keys do.
func TestOwnMetaNotForwardedOnPassThrough(t *testing.T) {
	up := startGoUpstream(t, "docs", upstreamOpts{tools: []string{"find"}, resources: []string{"file:///readme.md"}, prompts: []string{"summarize"}})
	url := serveProxy(t, multiBundle([]*goUpstream{up}, []agentSpec{{key: "key-a", agent: "a", tools: []string{"tool:docs-find"}}}, ""))
	a := connectClient(t, url, "key-a", declare{}).cs
	waitTools(t, a, 1)
	ctx := context.Background()
	meta := mcp.Meta{"io.toolgate/decision": map[string]any{"verdict": "allow"}, "x.example/trace": "t1"}
	waitFor(t, "the mirrored prompt", func() bool {
		_, err := a.GetPrompt(ctx, &mcp.GetPromptParams{Name: "docs_summarize", Meta: meta})
		return err == nil
	})
	if _, err := a.ReadResource(ctx, &mcp.ReadResourceParams{URI: "file:///readme.md", Meta: meta}); err != nil {
		t.Fatal(err)
	}
	up.mu.Lock()
	defer up.mu.Unlock()
	if len(up.metas) < 2 {
		t.Fatalf("the upstream saw %d requests, want 2", len(up.metas))
	}
	for _, m := range up.metas {
		if _, ok := m["io.toolgate/decision"]; ok || m["x.example/trace"] != "t1" {
			t.Errorf("the upstream saw _meta %v", m)
		}
	}
}
