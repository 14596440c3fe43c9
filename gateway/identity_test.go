package gateway_test

// Identity beyond API keys, end to end: a real gateway (the
// server-filesystem upstream, the built-in sql.query over a real SQLite
// file, the SQLite audit log) and real tokens: JWTs signed here with keys
// the bundle's JWKS file publishes, and delegation tokens minted through
// POST /v1/delegations and through toolgate delegate (cli.Run).

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolgate/toolgate/audit"
	"github.com/toolgate/toolgate/gateway"
	"github.com/toolgate/toolgate/identity"
	"github.com/toolgate/toolgate/internal/cli"
	"github.com/toolgate/toolgate/internal/testenv"
	"github.com/toolgate/toolgate/policy"
)

const (
	// ownerKey is user:owner's API key for the verifier agent.
	ownerKey  = "tg-test-owner"
	idpIssuer = "https://idp.test/"
	// rolesIssuer's tokens must carry a roles claim.
	rolesIssuer = "https://idp-roles.test/"
)

// identitySettings trusts one identity provider (the test's keys, in
// jwks.json) and gives requests without a credential the user:anon
// identity. {{NODE}}, {{SERVER}} and {{WS}} run server-filesystem over the
// test's workspace.
const identitySettings = `
- kind: Settings
  approval_ttl: 15m
  anonymous: {principal: user:anon, agent_id: verifier, deployment_mode: production}
  jwt_issuers:
    - issuer: https://idp.test/
      audience: [toolgate]
      jwks_file: jwks.json
      algorithms: [RS256, ES256]
      principal_prefix: "user:"
      agent_id: verifier
      deployment_mode: production
    # Tokens that must name their roles (a token without the claim is refused).
    - issuer: https://idp-roles.test/
      audience: [toolgate]
      jwks_file: jwks.json
      algorithms: [RS256, ES256]
      principal_prefix: "user:"
      roles_claim: roles
      agent_id: verifier
      deployment_mode: production
- {kind: Database, name: shop, driver: sqlite, path: shop.db, init_sql: shop.sql}
- kind: Upstream
  name: fs
  transport: stdio
  command: {{NODE}}
  args: [{{SERVER}}, {{WS}}]
  call_timeout: 30s
- {kind: Tool, tool_id: tool:fs-read-text-file, side_effect_class: read, source: {mcp_server: fs}}
`

// identityAgents: the verifier agent may use bifrost.query (declared only:
// /v1/decide decides it), the built-in sql.query, and three filesystem
// tools; writes wait for a human (the MCP write rule).
const identityAgents = `
- {kind: Tool, name: bifrost.query, tool_id: tool:bifrost-query, side_effect_class: read}
- {kind: Tool, name: sql.query, side_effect_class: read, source: {builtin: sql.query}}
- {kind: Tool, tool_id: tool:fs-write-file, side_effect_class: write, source: {mcp_server: fs}}
- kind: Agent
  agent_id: verifier
  version: 1.0.0
  runtime_engine: mcp-client
  tool_permissions:
    - {tool_id: tool:bifrost-query, side_effect_class: read, approval_tier: auto}
    - {tool_id: tool:sql-query, side_effect_class: read, approval_tier: auto}
    - {tool_id: tool:fs-read-text-file, side_effect_class: read, approval_tier: auto}
    - {tool_id: tool:fs-list-directory, side_effect_class: read, approval_tier: auto}
    - {tool_id: tool:fs-write-file, side_effect_class: write, approval_tier: auto}
- kind: Agent
  agent_id: other
  version: 1.0.0
  runtime_engine: mcp-client
  tool_permissions:
    - {tool_id: tool:sql-query, side_effect_class: read, approval_tier: auto}
- kind: RuntimePolicy
  agent_id: verifier
  deployment_mode: production
  tool_authorization_policy:
    active_tool_set: all
    mcp_tool_policy: {mcp_write_approval_required: true}
- {kind: RuntimePolicy, agent_id: other, deployment_mode: production, tool_authorization_policy: {active_tool_set: all}}
`

// ownerInvokeGrants are the lines of user:owner's tool:invoke grants on
// bifrost.query and sql.query; the revocation test deletes them.
const ownerInvokeGrants = `    - {resource: tool, action: invoke, scope: {tool: bifrost.query}}
    - {resource: tool, action: invoke, scope: {tool: sql.query}}
`

// identityPrincipals: the Wyrd seed table's three principals (invoke
// only, resource only, both), user:owner who delegates, user:lead who
// approves, user:anon for requests without a credential. {{OWNER}} is
// ownerKey's SHA-256.
const identityPrincipals = `
- kind: Principal
  principal_id: user:owner
  grants:
` + ownerInvokeGrants + `    - {resource: bifrost_query, action: read, scope: {name: vala.datasets}}
    - {resource: sql_table, action: read, scope: {name: shop.orders}}
    - {resource: tool, action: invoke, scope: {tool: fs_read_text_file}}
    - {resource: tool, action: invoke, scope: {tool: fs_list_directory}}
    - {resource: tool, action: invoke, scope: {tool: fs_write_file}}
- kind: Principal
  principal_id: user:invoker
  grants: [{resource: tool, action: invoke, scope: all}]
- kind: Principal
  principal_id: user:reader
  grants:
    - {resource: bifrost_query, action: read, scope: {name: vala.datasets}}
    - {resource: sql_table, action: read, scope: {name: shop}}
- kind: Role
  role_id: bifrost-invoker
  grants: [{resource: tool, action: invoke, scope: {tool: bifrost.query}}]
- kind: Principal
  principal_id: user:both
  roles: [bifrost-invoker]
  grants:
    - {resource: bifrost_query, action: read, scope: {name: vala.datasets}}
    - {resource: tool, action: invoke, scope: {tool: sql.query}}
    - {resource: sql_table, action: read, scope: {name: shop.orders}}
- kind: Principal
  principal_id: user:lead
  grants: [{resource: approval, action: decide, scope: all}]
- kind: Principal
  principal_id: user:anon
  grants: [{resource: tool, action: invoke, scope: {tool: fs_list_directory}}]
- kind: Credential
  name: owner
  api_key_sha256: {{OWNER}}
  principal: user:owner
  agent_id: verifier
  deployment_mode: production
`

// ticketsRead is what bifrost.query touches in the Wyrd seed's table.
var ticketsRead = []map[string]string{{"type": "bifrost_query", "name": "vala.datasets.tickets", "action": "read"}}

// lockedBuffer collects the gateway's log lines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// idEnv is a gateway over the identity bundle, and the identity provider
// whose keys its JWKS file publishes.
type idEnv struct {
	*running
	base   string // http://127.0.0.1:PORT
	bundle string
	ws     string // server-filesystem's workspace
	logs   *lockedBuffer
	rsa    *rsa.PrivateKey // kid rsa-1, RS256
	ec     *ecdsa.PrivateKey
}

func newIdentityEnv(t *testing.T) *idEnv {
	t.Helper()
	root := testenv.RepoRoot(t)
	e := &idEnv{bundle: t.TempDir(), ws: t.TempDir(), logs: &lockedBuffer{}}
	var err error
	if e.rsa, err = rsa.GenerateKey(rand.Reader, 2048); err != nil {
		t.Fatal(err)
	}
	if e.ec, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
		t.Fatal(err)
	}
	jwks, err := json.Marshal(jose.JSONWebKeySet{Keys: []jose.JSONWebKey{
		{Key: e.rsa.Public(), KeyID: "rsa-1", Use: "sig", Algorithm: "RS256"},
		{Key: e.ec.Public(), KeyID: "ec-1", Use: "sig", Algorithm: "ES256"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(filepath.Join(e.ws, "notes"), 0o755)
	os.WriteFile(filepath.Join(e.ws, "notes", "a.md"), []byte("# Notes for the delegate\n"), 0o644)
	shop, err := os.ReadFile(filepath.Join(root, "examples", "bundle", "shop.sql"))
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte(ownerKey))
	r := strings.NewReplacer("{{NODE}}", testenv.NodeBin(t),
		"{{SERVER}}", filepath.Join(testenv.NodeModulesDir(t), "@modelcontextprotocol", "server-filesystem", "dist", "index.js"),
		"{{WS}}", e.ws, "{{OWNER}}", hex.EncodeToString(sum[:]))
	for name, data := range map[string]string{"settings.yaml": r.Replace(identitySettings), "agents.yaml": identityAgents,
		"principals.yaml": r.Replace(identityPrincipals), "jwks.json": string(jwks), "shop.sql": string(shop)} {
		if err := os.WriteFile(filepath.Join(e.bundle, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	e.running = e.start(t)
	e.base = strings.TrimSuffix(e.url, "/mcp")
	// Wait for the upstream's tools, so later lists are complete.
	owner := connect(t, e.url, ownerKey)
	for i := 0; ; i++ {
		if slices.Contains(names(t, owner), "fs_read_text_file") {
			break
		}
		if i == 300 {
			t.Fatal("server-filesystem's tools did not appear in 30s")
		}
		time.Sleep(100 * time.Millisecond)
	}
	return e
}

// start runs the gateway like startGateway, with its log captured in
// e.logs (to prove no token reaches it).
func (e *idEnv) start(t *testing.T) *running {
	t.Helper()
	data := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan string, 1)
	done := make(chan error, 1)
	var gwp *gateway.Gateway
	log := slog.New(slog.NewTextHandler(e.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	go func() {
		done <- gateway.Run(ctx, gateway.Config{BundleDir: e.bundle, Listen: "127.0.0.1:0", DataDir: data, Logger: log,
			Ready: func(addr string) { ready <- addr },
			Mount: func(mux *http.ServeMux, gw *gateway.Gateway) { gwp = gw }}, nil)
	}()
	var addr string
	select {
	case addr = <-ready:
	case err := <-done:
		cancel()
		t.Fatalf("gateway did not start: %v\n%s", err, e.logs)
	case <-time.After(60 * time.Second):
		cancel()
		t.Fatal("gateway did not start in 60s")
	}
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("gateway shutdown: %v", err)
		}
	})
	return &running{url: "http://" + addr + "/mcp", gw: gwp, data: data}
}

// claims are a valid token's claims for sub (now), with changes applied
// (a nil value deletes the claim).
func claims(sub string, changes map[string]any) map[string]any {
	now := time.Now()
	c := map[string]any{"iss": idpIssuer, "aud": "toolgate", "sub": sub,
		"iat": now.Add(-time.Minute).Unix(), "nbf": now.Add(-time.Minute).Unix(), "exp": now.Add(time.Hour).Unix()}
	for k, v := range changes {
		if v == nil {
			delete(c, k)
		} else {
			c[k] = v
		}
	}
	return c
}

// signJWT signs claims with key under alg, naming kid.
func signJWT(t *testing.T, alg jose.SignatureAlgorithm, key any, kid string, claims any) string {
	t.Helper()
	opts := (&jose.SignerOptions{}).WithType("JWT")
	if kid != "" {
		opts = opts.WithHeader("kid", kid)
	}
	s, err := jose.NewSigner(jose.SigningKey{Algorithm: alg, Key: key}, opts)
	if err != nil {
		t.Fatal(err)
	}
	payload, err := json.Marshal(claims)
	if err != nil {
		t.Fatal(err)
	}
	obj, err := s.Sign(payload)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := obj.CompactSerialize()
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// jwt is a valid RS256 token of the test's identity provider for user:sub.
func (e *idEnv) jwt(t *testing.T, sub string, changes map[string]any) string {
	return signJWT(t, jose.RS256, e.rsa, "rsa-1", claims(sub, changes))
}

// api sends a JSON request with token as the bearer ("" sends none) and
// returns the status and the raw answer.
func (e *idEnv) api(t *testing.T, method, path, token string, body any, header ...string) (int, []byte) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, e.base+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, out
}

// decision is what /v1/decide answers, allow or refusal, flattened.
type decision struct {
	Status    int
	Verdict   string
	Code      string // the decision's code: for a concealed refusal, the audit log's
	Reason    string // likewise
	Principal string // the refusal's execution_context.principal
	Error     string // an API error's code (401, 403 identity_mismatch...)
	Message   string
	// Concealed is true when the answer was unknown_tool for a tool the
	// caller cannot see (Code then comes from the audit log).
	Concealed bool
}

func (e *idEnv) decide(t *testing.T, token string, body map[string]any, header ...string) decision {
	t.Helper()
	status, raw := e.api(t, "POST", "/v1/decide", token, body, header...)
	var v struct {
		Verdict          string `json:"verdict"`
		Code             string `json:"code"`
		Reason           string `json:"reason"`
		ExecutionContext struct {
			Principal string `json:"principal"`
		} `json:"execution_context"`
		Decision struct {
			Verdict       string `json:"verdict"`
			Code          string `json:"code"`
			Reason        string `json:"reason"`
			CorrelationID string `json:"correlation_id"`
		} `json:"decision"`
		Error struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatalf("decide: status %d, body %s: %v", status, raw, err)
	}
	d := decision{Status: status, Verdict: v.Verdict, Code: v.Code, Reason: v.Reason, Error: v.Error.Code, Message: v.Error.Message}
	if v.Decision.Verdict != "" {
		d.Verdict, d.Code, d.Reason, d.Principal = v.Decision.Verdict, v.Decision.Code, v.Decision.Reason, v.ExecutionContext.Principal
	}
	if d.Code == "unknown_tool" && v.Decision.CorrelationID != "" {
		// A tool the caller cannot see is answered like one that does not
		// exist; what was decided is in the audit log.
		for _, ev := range e.events(t) {
			if ev.CorrelationID == v.Decision.CorrelationID && ev.EventType == "agent.tool.unauthorized" {
				d.Code, d.Reason, d.Concealed = ev.Code, ev.Reason, true
			}
		}
	}
	return d
}

// mintHTTP asks POST /v1/delegations as token; it returns the status and
// the answer (a minted token or an error).
func (e *idEnv) mintHTTP(t *testing.T, token string, body map[string]any) (int, map[string]any) {
	t.Helper()
	status, raw := e.api(t, "POST", "/v1/delegations", token, body)
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatalf("mint: status %d, body %s: %v", status, raw, err)
	}
	return status, m
}

// mint hands grants of token's principal to delegate over HTTP and returns
// the delegation token.
func (e *idEnv) mint(t *testing.T, token, delegate string, grants ...string) string {
	t.Helper()
	status, m := e.mintHTTP(t, token, map[string]any{"delegate": delegate, "grants": grants, "ttl": "30m"})
	if status != http.StatusCreated {
		t.Fatalf("mint for %s: status %d: %v", delegate, status, m)
	}
	tok, _ := m["token"].(string)
	if !strings.HasPrefix(m["id"].(string), identity.DelegationIDPrefix) || tok == "" {
		t.Fatalf("mint answer %v", m)
	}
	return tok
}

// delegateCLI runs toolgate delegate against the gateway's bundle and data
// folder and returns its exit code, stdout and stderr.
func (e *idEnv) delegateCLI(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := cli.Run(context.Background(), append([]string{"delegate", "--bundle", e.bundle, "--data", e.data}, args...),
		strings.NewReader(""), &out, &errb)
	return code, out.String(), errb.String()
}

// names lists cs's tools once, sorted.
func names(t *testing.T, cs *mcp.ClientSession) []string {
	t.Helper()
	res, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatalf("tools/list: %v", err)
	}
	out := []string{}
	for _, tl := range res.Tools {
		out = append(out, tl.Name)
	}
	slices.Sort(out)
	return out
}

// outcome calls name and sums up the answer: "allow" (a result that is
// not an error), the refusal's code, or "hidden" (the JSON-RPC error of a
// tool that does not exist).
func outcome(t *testing.T, cs *mcp.ClientSession, name string, args map[string]any) (string, *mcp.CallToolResult) {
	t.Helper()
	res, err := call(t, cs, name, args)
	switch {
	case err != nil:
		if e := rpcErr(t, err); !strings.Contains(e.Message, `unknown tool "`+name+`"`) {
			t.Fatalf("%s: JSON-RPC error %v, want unknown tool", name, e)
		}
		return "hidden", nil
	case res.IsError:
		code, _ := structured(t, res)["code"].(string)
		return code, res
	}
	return "allow", res
}

// events flushes the audit log and reads it whole through toolgate audit
// tail -o json, the operator's view.
func (e *idEnv) events(t *testing.T) []audit.Event {
	t.Helper()
	if err := e.gw.Rec.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	if code := cli.Run(context.Background(), []string{"audit", "tail", "-o", "json", "-n", "10000", "--data", e.data},
		strings.NewReader(""), &out, &errb); code != cli.ExitOK {
		t.Fatalf("audit tail: exit %d: %s", code, errb.String())
	}
	var evs []audit.Event
	dec := json.NewDecoder(&out)
	for dec.More() {
		var ev audit.Event
		if err := dec.Decode(&ev); err != nil {
			t.Fatal(err)
		}
		evs = append(evs, ev)
	}
	return evs
}

// TestIdentityWyrdTable runs the Wyrd seed's permissions table ("Holds /
// Can call bifrost.query on vala.datasets.tickets") for JWT principals and
// for delegates of user:owner, over HTTP (POST /v1/decide with the
// resource) and over MCP (tools/list and tools/call of the built-in
// sql.query, whose resource, the table shop.orders, the database reports):
// invoke only → rbac_resource, resource only → rbac_tool_invoke (and hidden
// over MCP), both → allowed. A JWT's roles claim narrows like a delegation.
func TestIdentityWyrdTable(t *testing.T) {
	e := newIdentityEnv(t)
	invokeOnly := e.mint(t, ownerKey, "svc:invoke-only", "tool:invoke:bifrost.query", "tool:invoke:sql.query")
	resourceOnly := e.mint(t, ownerKey, "svc:resource-only", "bifrost_query:read:vala.datasets", "sql_table:read:shop.orders")
	code, both, stderr := e.delegateCLI(t, "--from", "user:owner", "--to", "svc:both", "--agent", "verifier", "--ttl", "30m",
		"--grant", "tool:invoke:bifrost.query", "--grant", "bifrost_query:read:vala.datasets.tickets",
		"--grant", "tool:invoke:sql.query", "--grant", "sql_table:read:shop.orders")
	if code != cli.ExitOK {
		t.Fatalf("toolgate delegate: exit %d: %s", code, stderr)
	}
	both = strings.TrimSpace(both)

	allFS := []string{"fs_list_directory", "fs_read_text_file", "fs_write_file", "sql_query"}
	cases := []struct {
		name      string
		token     string
		principal string // who the call runs as
		status    int    // of /v1/decide
		code      string
		tools     []string // tools/list
		sql       string   // outcome of tools/call sql_query
	}{
		{"invoke only, JWT", e.jwt(t, "invoker", nil), "user:invoker", 403, "rbac_resource", allFS, "rbac_resource"},
		{"invoke only, delegate", invokeOnly, "user:owner", 403, "rbac_resource", []string{"sql_query"}, "rbac_resource"},
		{"resource only, JWT", e.jwt(t, "reader", nil), "user:reader", 403, "rbac_tool_invoke", []string{}, "hidden"},
		{"resource only, delegate", resourceOnly, "user:owner", 403, "rbac_tool_invoke", []string{}, "hidden"},
		{"both, JWT", e.jwt(t, "both", nil), "user:both", 200, "ok", []string{"sql_query"}, "allow"},
		{"both, delegate minted by toolgate delegate", both, "user:owner", 200, "ok", []string{"sql_query"}, "allow"},
		{"both, JWT narrowed by its roles claim to invoke only", e.jwt(t, "both", map[string]any{"iss": rolesIssuer, "roles": []string{"bifrost-invoker"}}),
			"user:both", 403, "rbac_resource", []string{}, "hidden"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := e.decide(t, tc.token, map[string]any{"tool": "bifrost.query", "resources": ticketsRead})
			if d.Status != tc.status || d.Code != tc.code {
				t.Errorf("decide: status %d code %s (%s %s), want %d %s", d.Status, d.Code, d.Reason, d.Message, tc.status, tc.code)
			}
			// A caller without the invoke grant cannot see the tool: the
			// answer is unknown_tool, the audit log says why.
			if want := tc.code == "rbac_tool_invoke"; d.Concealed != want {
				t.Errorf("decide: answered as an unknown tool: %v, want %v (%s)", d.Concealed, want, d.Reason)
			}
			if d.Status == 403 && d.Principal != tc.principal {
				t.Errorf("the refusal ran as %q, want %q", d.Principal, tc.principal)
			}
			cs := connect(t, e.url, tc.token)
			if diff := cmp.Diff(tc.tools, names(t, cs)); diff != "" {
				t.Errorf("tools/list (-want +got):\n%s", diff)
			}
			got, res := outcome(t, cs, "sql_query", map[string]any{"query": "SELECT id, status FROM orders ORDER BY id"})
			if got != tc.sql {
				t.Fatalf("tools/call sql_query: %s, want %s", got, tc.sql)
			}
			switch {
			case got == "allow" && !strings.Contains(text(res), "Shipped"):
				t.Errorf("the allowed query returned %q", text(res))
			case got == "rbac_resource" && strings.Contains(text(res), "Shipped"):
				t.Errorf("a call refused on its resource returned data: %q", text(res))
			}
		})
	}
}

// TestIdentityDelegateNeverWider: a delegation hands only what the
// delegator holds (minting more is refused, naming the grant, over HTTP
// and in the CLI); it stays on the delegator's agent; only a principal's
// own credential mints (not a delegate, not a role-narrowed JWT, not an
// anonymous request); and revoking the delegator's grant in the bundle
// revokes it for the delegate at the next reload while its token stays
// the same.
func TestIdentityDelegateNeverWider(t *testing.T) {
	e := newIdentityEnv(t)
	t.Run("wider grants are refused by name", func(t *testing.T) {
		for _, tc := range []struct{ grant, named string }{
			{"tool:invoke:all", "user:owner does not hold tool:invoke:all"},
			{"bifrost_query:read:vala", "bifrost_query:read:name=vala"},
			{"tool:invoke:fs_search_files", "tool:invoke:tool=fs_search_files"},
			{"approval:decide:all", "approval:decide:all"},
		} {
			status, m := e.mintHTTP(t, ownerKey, map[string]any{"delegate": "svc:greedy", "grants": []string{"tool:invoke:sql.query", tc.grant}})
			if status != 403 || m["error"].(map[string]any)["code"] != "grant_not_held" || !strings.Contains(m["error"].(map[string]any)["message"].(string), tc.named) {
				t.Errorf("%s: status %d %v; want 403 grant_not_held naming %q", tc.grant, status, m, tc.named)
			}
		}
		code, stdout, stderr := e.delegateCLI(t, "--from", "user:owner", "--to", "svc:greedy", "--agent", "verifier",
			"--grant", "tool:invoke:sql.query", "--grant", "tool:invoke:all")
		if code != cli.ExitDenied || stdout != "" || !strings.Contains(stderr, "user:owner does not hold tool:invoke:all") {
			t.Errorf("toolgate delegate: exit %d, stdout %q, stderr %q; want exit %d, no token, the grant named", code, stdout, stderr, cli.ExitDenied)
		}
	})
	t.Run("only a principal's own credential mints, for its own agent", func(t *testing.T) {
		dlg := e.mint(t, ownerKey, "svc:a", "tool:invoke:sql.query")
		for _, tc := range []struct {
			name, token string
			body        map[string]any
			status      int
			code        string
		}{
			{"a delegate", dlg, map[string]any{"delegate": "svc:b", "grants": []string{"tool:invoke:sql.query"}}, 403, "delegated_identity"},
			{"a role-narrowed JWT", e.jwt(t, "both", map[string]any{"iss": rolesIssuer, "roles": []string{"bifrost-invoker"}}),
				map[string]any{"delegate": "svc:b", "grants": []string{"tool:invoke:bifrost.query"}}, 403, "delegated_identity"},
			{"another agent", ownerKey, map[string]any{"delegate": "svc:b", "agent_id": "other", "grants": []string{"tool:invoke:sql.query"}}, 400, "bad_request"},
			{"another environment", ownerKey, map[string]any{"delegate": "svc:b", "environment": "staging", "grants": []string{"tool:invoke:sql.query"}}, 400, "bad_request"},
			{"no credential (the anonymous identity)", "", map[string]any{"delegate": "svc:b", "grants": []string{"tool:invoke:fs_list_directory"}}, 401, "unauthenticated"},
			{"a bad token", "a.b.c", map[string]any{"delegate": "svc:b", "grants": []string{"tool:invoke:sql.query"}}, 401, "unauthenticated"},
		} {
			status, m := e.mintHTTP(t, tc.token, tc.body)
			errObj, _ := m["error"].(map[string]any)
			if status != tc.status || errObj["code"] != tc.code {
				t.Errorf("%s: status %d %v; want %d %s", tc.name, status, m, tc.status, tc.code)
			}
		}
		// A JWT principal mints with its own grants, like an API key.
		if tok := e.mint(t, e.jwt(t, "both", nil), "svc:c", "tool:invoke:sql.query"); tok == "" {
			t.Error("no token")
		}
	})
	t.Run("every mint is in the audit log before its token is handed out", func(t *testing.T) {
		status, m := e.mintHTTP(t, ownerKey, map[string]any{"delegate": "svc:logged", "grants": []string{"tool:invoke:sql.query"}})
		if status != 201 {
			t.Fatalf("mint: %d %v", status, m)
		}
		// Read the store directly, without flushing: the record is durable.
		evs, err := audit.ReadEvents(context.Background(), e.gw.Store, 1, 100000)
		if err != nil {
			t.Fatal(err)
		}
		code, out, stderr := e.delegateCLI(t, "--from", "user:owner", "--to", "svc:cli-logged", "--agent", "verifier", "--grant", "tool:invoke:sql.query", "-o", "json")
		if code != cli.ExitOK {
			t.Fatalf("toolgate delegate: %d %s", code, stderr)
		}
		var cliMinted identity.Minted
		if err := json.Unmarshal([]byte(out), &cliMinted); err != nil {
			t.Fatalf("toolgate delegate -o json: %v: %s", err, out)
		}
		evs2, err := audit.ReadEvents(context.Background(), e.gw.Store, 1, 100000)
		if err != nil {
			t.Fatal(err)
		}
		// The HTTP mint's event is in the store read before the CLI ran; the
		// CLI's is there once it returned.
		for _, c := range []struct {
			evs     []audit.Event
			id, via string
		}{{evs, m["id"].(string), "http"}, {evs2, cliMinted.ID, "cli"}} {
			var found bool
			for _, ev := range c.evs {
				if ev.EventType != identity.EventMinted || ev.Details["delegation_id"] != c.id {
					continue
				}
				found = true
				if ev.Principal != "user:owner" || ev.Details["delegator"] != "user:owner" || ev.Details["via"] != c.via ||
					!strings.HasPrefix(fmt.Sprint(ev.Details["delegate"]), "svc:") || ev.AgentID != "verifier" {
					t.Errorf("mint event %+v", ev)
				}
			}
			if !found {
				t.Errorf("no durable %s event for %s (via %s)", identity.EventMinted, c.id, c.via)
			}
		}
		raw, _ := json.Marshal(evs2)
		for _, tok := range []string{m["token"].(string), cliMinted.Token} {
			if bytes.Contains(raw, []byte(strings.Split(tok, ".")[2])) {
				t.Error("a mint event holds the token")
			}
		}
		if rep, err := audit.Verify(context.Background(), e.gw.Store); err != nil || !rep.OK {
			t.Errorf("the chain with the CLI's event: %+v %v", rep, err)
		}
	})
	t.Run("a delegate reads neither the audit log nor the approvals", func(t *testing.T) {
		dlg := e.mint(t, ownerKey, "svc:nosy", "tool:invoke:sql.query")
		for _, path := range []string{"/v1/audit", "/v1/approvals"} {
			if status, body := e.api(t, "GET", path, dlg, nil); status != 403 || !strings.Contains(string(body), "delegated_identity") {
				t.Errorf("GET %s as a delegate: %d %s; want 403 delegated_identity", path, status, body)
			}
			// The owner's own key is not refused as narrowed (the audit log
			// then asks for audit:read, which user:owner lacks).
			if _, body := e.api(t, "GET", path, ownerKey, nil); strings.Contains(string(body), "delegated_identity") {
				t.Errorf("GET %s with the owner's key: %s", path, body)
			}
		}
	})
	t.Run("the delegator loses a grant: the delegate loses it at the reload", func(t *testing.T) {
		tok := e.mint(t, ownerKey, "svc:revoked", "tool:invoke:bifrost.query", "bifrost_query:read:vala.datasets",
			"tool:invoke:sql.query", "sql_table:read:shop.orders")
		cs := connect(t, e.url, tok)
		if d := e.decide(t, tok, map[string]any{"tool": "bifrost.query", "resources": ticketsRead}); d.Status != 200 {
			t.Fatalf("before the reload: %+v", d)
		}
		if got, _ := outcome(t, cs, "sql_query", map[string]any{"query": "SELECT id FROM orders"}); got != "allow" {
			t.Fatalf("before the reload: sql_query %s", got)
		}
		path := filepath.Join(e.bundle, "principals.yaml")
		src, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		cut := strings.Replace(string(src), ownerInvokeGrants, "", 1)
		if cut == string(src) {
			t.Fatal("the owner's invoke grants are not in principals.yaml")
		}
		if err := os.WriteFile(path, []byte(cut), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := e.gw.Reload(); err != nil {
			t.Fatal(err)
		}
		d := e.decide(t, tok, map[string]any{"tool": "bifrost.query", "resources": ticketsRead})
		if d.Status != 403 || d.Code != "rbac_tool_invoke" || d.Principal != "user:owner" || !strings.Contains(d.Reason, "user:owner lacks tool:invoke") {
			t.Errorf("after the reload, the same token: %+v; want 403 rbac_tool_invoke naming user:owner", d)
		}
		if diff := cmp.Diff([]string{}, names(t, cs)); diff != "" {
			t.Errorf("after the reload, tools/list (-want +got):\n%s", diff)
		}
		if got, _ := outcome(t, cs, "sql_query", map[string]any{"query": "SELECT id FROM orders"}); got != "hidden" {
			t.Errorf("after the reload: sql_query %s, want hidden", got)
		}
		var seen bool
		for _, ev := range e.events(t) {
			if ev.EventType == "agent.tool.unauthorized" && ev.ToolName == "sql_query" && ev.Code == "rbac_tool_invoke" &&
				ev.Principal == "user:owner" && ev.Details["delegate"] == "svc:revoked" {
				seen = true
			}
		}
		if !seen {
			t.Error("the audit log has no rbac_tool_invoke refusal of the revoked delegate's sql_query")
		}
		status, m := e.mintHTTP(t, ownerKey, map[string]any{"delegate": "svc:again", "grants": []string{"tool:invoke:sql.query"}})
		if status != 403 {
			t.Errorf("minting a grant the owner lost: %d %v", status, m)
		}
	})
}

// TestIdentityTokenRefusals: every way a JWT can be wrong is a 401 on the
// JSON API, on the MCP endpoint and on POST /v1/delegations (never a
// fallback to the anonymous identity), and the answer does not echo the
// token. A principal the bundle does not declare is refused too, and so
// are delegation tokens that were tampered with or signed by another
// gateway.
func TestIdentityTokenRefusals(t *testing.T) {
	e := newIdentityEnv(t)
	now := time.Now()
	good := e.jwt(t, "both", nil)
	parts := strings.Split(good, ".")
	forged, _ := json.Marshal(claims("invoker", nil))
	tampered := parts[0] + "." + base64.RawURLEncoding.EncodeToString(forged) + "." + parts[2]
	noneHeader, _ := json.Marshal(map[string]string{"alg": "none", "typ": "JWT"})
	algNone := base64.RawURLEncoding.EncodeToString(noneHeader) + "." + base64.RawURLEncoding.EncodeToString(forged) + "."
	der, err := x509.MarshalPKIXPublicKey(e.rsa.Public())
	if err != nil {
		t.Fatal(err)
	}
	pubPEM := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
	hs256 := signJWT(t, jose.HS256, pubPEM, "rsa-1", claims("invoker", nil))

	// Delegation tokens: one of this gateway's with its grants rewritten,
	// and one signed by another gateway's key for the same bundle.
	dlg := e.mint(t, ownerKey, "svc:d", "tool:invoke:sql.query")
	dp := strings.Split(dlg, ".")
	payload, _ := base64.RawURLEncoding.DecodeString(dp[1])
	wider := strings.Replace(string(payload), `{"tool":"sql.query"}`, `"all"`, 1)
	if wider == string(payload) {
		t.Fatalf("delegation payload %s", payload)
	}
	dlgTampered := dp[0] + "." + base64.RawURLEncoding.EncodeToString([]byte(wider)) + "." + dp[2]
	b, err := policy.LoadDir(e.bundle)
	if err != nil {
		t.Fatal(err)
	}
	otherGW, err := identity.New(b, identity.NewKeyring(t.TempDir()), nil)
	if err != nil {
		t.Fatal(err)
	}
	foreign, err := otherGW.Mint(identity.MintRequest{Delegator: "user:owner", Delegate: "svc:d", AgentID: "verifier",
		Grants: []policy.Grant{{Resource: "tool", Action: "invoke", Scope: policy.Scope{Tool: "sql.query"}}}})
	if err != nil {
		t.Fatal(err)
	}

	cases := []struct{ name, token, why string }{
		{"expired", e.jwt(t, "both", map[string]any{"exp": now.Add(-time.Hour).Unix(), "iat": now.Add(-2 * time.Hour).Unix(), "nbf": now.Add(-2 * time.Hour).Unix()}), "expired"},
		{"not yet valid", e.jwt(t, "both", map[string]any{"nbf": now.Add(time.Hour).Unix()}), "not valid yet"},
		{"wrong issuer", e.jwt(t, "both", map[string]any{"iss": "https://evil.test/"}), "not trusted"},
		{"wrong audience", e.jwt(t, "both", map[string]any{"aud": "someone-else"}), "aud"},
		{"no exp", e.jwt(t, "both", map[string]any{"exp": nil}), "no exp"},
		{"bad signature (tampered payload)", tampered, "bad signature"},
		{"signed by a key not in the JWKS", signJWT(t, jose.RS256, mustRSA(t), "rsa-1", claims("both", nil)), "bad signature"},
		{"unknown kid", signJWT(t, jose.RS256, e.rsa, "rsa-9", claims("both", nil)), "unknown key id"},
		{"alg none", algNone, "alg not allowed"},
		{"HS256 signed with the public key's bytes", hs256, "alg not allowed"},
		{"ES256 signature under the RS256 key's kid", signJWT(t, jose.ES256, e.ec, "rsa-1", claims("both", nil)), "unknown key id"},
		{"undeclared principal", e.jwt(t, "mallory", nil), "user:mallory (claim sub) is not a declared Principal"},
		{"delegation token with rewritten grants", dlgTampered, "bad signature"},
		{"delegation token of another gateway", foreign.Token, "unknown key id"},
	}
	mcpList := `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := e.decide(t, tc.token, map[string]any{"tool": "bifrost.query", "resources": ticketsRead})
			if d.Status != 401 || d.Error != "unauthenticated" || !strings.Contains(d.Message, tc.why) {
				t.Errorf("/v1/decide: %+v; want 401 unauthenticated saying %q", d, tc.why)
			}
			if strings.Contains(d.Message, tc.token) {
				t.Error("the 401 echoes the token")
			}
			req, _ := http.NewRequest("POST", e.url, strings.NewReader(mcpList))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Accept", "application/json, text/event-stream")
			req.Header.Set("Authorization", "Bearer "+tc.token)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 401 || !strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Bearer") || !strings.Contains(string(body), tc.why) {
				t.Errorf("/mcp: %d %q %s; want 401 saying %q", resp.StatusCode, resp.Header.Get("WWW-Authenticate"), body, tc.why)
			}
			if status, _ := e.mintHTTP(t, tc.token, map[string]any{"delegate": "svc:x", "grants": []string{"tool:invoke:sql.query"}}); status != 401 {
				t.Errorf("/v1/delegations: %d, want 401", status)
			}
		})
	}
	t.Run("the good token, and an ES256 one, pass", func(t *testing.T) {
		for _, tok := range []string{good, signJWT(t, jose.ES256, e.ec, "ec-1", claims("both", nil))} {
			if d := e.decide(t, tok, map[string]any{"tool": "bifrost.query", "resources": ticketsRead}); d.Status != 200 {
				t.Errorf("%+v", d)
			}
		}
	})
}

func mustRSA(t *testing.T) *rsa.PrivateKey {
	t.Helper()
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// TestIdentityApprovalTravels: a delegate's write needs approval; the
// approval binds the delegator's principal and stores no credential;
// neither the delegate nor its delegator may approve it; another principal
// (a JWT) approves, and the delegate's same call then runs once. The audit
// log names delegator and delegate on every event, and no token reaches
// the log, the database or the gateway's own log.
func TestIdentityApprovalTravels(t *testing.T) {
	e := newIdentityEnv(t)
	writer := e.mint(t, ownerKey, "svc:writer", "tool:invoke:fs_write_file", "tool:invoke:fs_read_text_file")
	lead := e.jwt(t, "lead", nil)
	cs := connect(t, e.url, writer)
	target := filepath.Join(e.ws, "out.txt")
	args := map[string]any{"path": target, "content": "written for user:owner by svc:writer"}

	got, res := outcome(t, cs, "fs_write_file", args)
	if got != "approval_required" {
		t.Fatalf("first call: %s", got)
	}
	id, _ := structured(t, res)["approval_id"].(string)
	if id == "" {
		t.Fatalf("no approval id in %v", structured(t, res))
	}
	if _, err := os.Stat(target); err == nil {
		t.Fatal("written before approval")
	}

	status, raw := e.api(t, "GET", "/v1/approvals", lead, nil)
	if status != 200 {
		t.Fatalf("list approvals: %d %s", status, raw)
	}
	var list struct {
		Approvals []struct {
			ID      string `json:"id"`
			Binding struct {
				Principal string `json:"principal"`
				AgentID   string `json:"agent_id"`
			} `json:"binding"`
			RequestedBy string `json:"requested_by"`
		} `json:"approvals"`
	}
	json.Unmarshal(raw, &list)
	if len(list.Approvals) != 1 || list.Approvals[0].ID != id || list.Approvals[0].Binding.Principal != "user:owner" ||
		list.Approvals[0].RequestedBy != "svc:writer" || list.Approvals[0].Binding.AgentID != "verifier" {
		t.Errorf("pending approvals %s; want %s bound to user:owner, asked by svc:writer", raw, id)
	}

	for _, tc := range []struct{ who, token, code string }{
		{"the delegate", writer, "delegated_identity"},
		{"the delegator", ownerKey, "self_approval"},
	} {
		if status, body := e.api(t, "POST", "/v1/approvals/"+id+"/approve", tc.token, map[string]any{}); status != 403 || !strings.Contains(string(body), tc.code) {
			t.Errorf("%s approves: %d %s; want 403 %s", tc.who, status, body, tc.code)
		}
	}
	if status, body := e.api(t, "POST", "/v1/approvals/"+id+"/approve", lead, map[string]any{"reason": "ok for the report"}); status != 200 {
		t.Fatalf("user:lead approves: %d %s", status, body)
	}

	if got, res := outcome(t, cs, "fs_write_file", args); got != "allow" {
		t.Fatalf("the approved call: %s %v", got, res)
	}
	if b, err := os.ReadFile(target); err != nil || string(b) != args["content"] {
		t.Fatalf("the file holds %q (%v)", b, err)
	}
	if got, _ := outcome(t, cs, "fs_write_file", args); got != "approval_required" {
		t.Errorf("the same call again: %s; an approval is used once", got)
	}

	var kinds []string
	for _, ev := range e.events(t) {
		if ev.ApprovalID != id {
			continue
		}
		kinds = append(kinds, ev.EventType)
		if ev.Principal != "user:owner" || ev.Details["delegator"] != "user:owner" || ev.Details["delegate"] != "svc:writer" {
			t.Errorf("%s: principal %q, details %v; want user:owner delegating to svc:writer", ev.EventType, ev.Principal, ev.Details)
		}
		if ev.EventType == "agent.tool.approval_granted" && ev.Details["decided_by"] != "user:lead" {
			t.Errorf("granted by %v", ev.Details["decided_by"])
		}
	}
	want := []string{"agent.tool.approval_requested", "agent.tool.approval_decision_refused", // the delegator's self-approval
		"agent.tool.approval_granted", "agent.tool.authorized", "agent.tool.completed"}
	if diff := cmp.Diff(want, kinds, cmpopts.SortSlices(func(a, b string) bool { return a < b })); diff != "" {
		t.Errorf("events of %s (-want +got):\n%s", id, diff)
	}

	// No credential is stored or logged: not in the audit log, not in the
	// approvals, not in the database files, not in the gateway's log.
	var files []byte
	for _, name := range []string{gateway.DBFile, gateway.DBFile + "-wal"} {
		b, _ := os.ReadFile(filepath.Join(e.data, name))
		files = append(files, b...)
	}
	for what, secret := range map[string]string{"the delegation token": writer, "the JWT": lead, "the API key": ownerKey,
		"the delegation token's signature": strings.Split(writer, ".")[2]} {
		if bytes.Contains(files, []byte(secret)) {
			t.Errorf("%s is in the database", what)
		}
		if strings.Contains(e.logs.String(), secret) {
			t.Errorf("%s is in the gateway's log", what)
		}
	}
}

// TestIdentityArgumentsCannotChooseIdentity: identity-looking tool
// arguments, MCP _meta, HTTP headers and body fields never change who a
// call runs as; only the token does.
func TestIdentityArgumentsCannotChooseIdentity(t *testing.T) {
	e := newIdentityEnv(t)
	claimsInArgs := map[string]any{"principal": "user:invoker", "agent_id": "other", "delegator": "user:invoker",
		"_meta": map[string]any{"principal": "user:invoker", "io.toolgate/identity": map[string]any{"principal": "user:invoker"}}}
	reader := e.jwt(t, "reader", nil)

	t.Run("HTTP", func(t *testing.T) {
		d := e.decide(t, reader, map[string]any{"tool": "bifrost.query", "args": claimsInArgs, "resources": ticketsRead},
			"X-Toolgate-Principal", "user:invoker", "X-Principal", "user:invoker")
		if d.Status != 403 || d.Code != "rbac_tool_invoke" || d.Principal != "user:reader" {
			t.Errorf("arguments naming user:invoker: %+v; want user:reader's rbac_tool_invoke", d)
		}
		d = e.decide(t, reader, map[string]any{"tool": "bifrost.query", "principal": "user:invoker", "resources": ticketsRead})
		if d.Status != 403 || d.Error != "identity_mismatch" {
			t.Errorf("a body naming another principal: %+v; want 403 identity_mismatch", d)
		}
		dlg := e.mint(t, ownerKey, "svc:agent-bound", "tool:invoke:sql.query")
		d = e.decide(t, dlg, map[string]any{"tool": "sql.query", "agent_id": "other"})
		if d.Status != 403 || d.Error != "identity_mismatch" {
			t.Errorf("a delegation token presented for another agent: %+v; want 403 identity_mismatch", d)
		}
	})
	t.Run("MCP", func(t *testing.T) {
		dlg := e.mint(t, ownerKey, "svc:reads", "tool:invoke:fs_read_text_file")
		cs := connect(t, e.url, dlg)
		if diff := cmp.Diff([]string{"fs_read_text_file"}, names(t, cs)); diff != "" {
			t.Errorf("tools/list (-want +got):\n%s", diff)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		meta := mcp.Meta{"principal": "user:invoker", "agent_id": "other", "io.toolgate/identity": map[string]any{"principal": "user:invoker"}}
		write := map[string]any{"path": filepath.Join(e.ws, "sneaky.txt"), "content": "x"}
		for k, v := range claimsInArgs {
			write[k] = v
		}
		_, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "fs_write_file", Arguments: write, Meta: meta})
		if e := rpcErr(t, err); !strings.Contains(e.Message, "unknown tool") {
			t.Errorf("fs_write_file with identity claims in arguments and _meta: %v; want unknown tool", e)
		}
		if _, err := os.Stat(filepath.Join(e.ws, "sneaky.txt")); err == nil {
			t.Error("the write ran")
		}
		read := map[string]any{"path": filepath.Join(e.ws, "notes", "a.md")}
		for k, v := range claimsInArgs {
			read[k] = v
		}
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "fs_read_text_file", Arguments: read, Meta: meta})
		if err != nil {
			t.Fatal(err)
		}
		if res.IsError || !strings.Contains(text(res), "Notes for the delegate") {
			t.Errorf("fs_read_text_file with identity claims in arguments and _meta: %v %q; want the file, read as the token says", res.IsError, text(res))
		}
		var decided bool
		for _, ev := range e.events(t) {
			if ev.ToolName != "fs_read_text_file" && ev.ToolName != "fs_write_file" {
				continue
			}
			decided = decided || ev.EventType == "agent.tool.authorized"
			if ev.Principal != "user:owner" || ev.AgentID != "verifier" || ev.Details["delegate"] != "svc:reads" {
				t.Errorf("%s %s ran as principal %q agent %q, details %v; want user:owner for svc:reads on verifier",
					ev.EventType, ev.ToolName, ev.Principal, ev.AgentID, ev.Details)
			}
		}
		if !decided {
			t.Error("no authorized fs_read_text_file event")
		}
	})
}
