package gateway_test

// Regression tests for what a reviewer found by attacking the example
// gateway with the weakest key.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/toolgate/toolgate/approval"
	"github.com/toolgate/toolgate/audit"
	"github.com/toolgate/toolgate/internal/testenv"
)

func do(t *testing.T, method, url, key string, hdr map[string]string, body string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	for k, v := range hdr {
		if k == "Host" {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	return resp.StatusCode, string(b)
}

func TestReviewFindings(t *testing.T) {
	g, ws := exampleGateway(t)
	dev := connect(t, g.url, devKey)
	listNames(t, dev, 6)
	base := strings.TrimSuffix(g.url, "/mcp")
	ctx := context.Background()

	t.Run("a cleaned path cannot dodge the .env condition", func(t *testing.T) {
		for _, p := range []string{"secrets.env/", "./secrets.env/.", "notes/../secrets.env/", filepath.Join(ws, "secrets.env") + "/"} {
			res, err := call(t, dev, "fs_read_text_file", map[string]any{"path": p})
			if err != nil || !res.IsError || structured(t, res)["code"] != "condition_failed" {
				t.Errorf("path %q: %v %v", p, err, res)
			}
			if strings.Contains(text(res), "TOKEN=x") {
				t.Errorf("path %q leaked the secret", p)
			}
		}
	})
	t.Run("another spelling of a visible tool is that tool", func(t *testing.T) {
		// One rule for visibility on every entry point: a name is visible
		// when it maps to a tool disclosed to the caller, whatever its
		// spelling; it is decided as that tool (here: it needs approval),
		// and the same call gets the same approval.
		var ids []string
		for _, name := range []string{"fs_write_file", "tool:fs-write-file", "fs-write-file", "fs.write.file"} {
			res, err := call(t, dev, name, map[string]any{"path": filepath.Join(ws, "x.txt"), "content": "x"})
			if err != nil || !res.IsError || structured(t, res)["code"] != "approval_required" {
				t.Errorf("%s: %v %v", name, err, res)
				continue
			}
			ids = append(ids, fmt.Sprint(structured(t, res)["approval_id"]))
		}
		pending, err := g.gw.Store.ListApprovals(ctx, approval.Filter{Status: []approval.Status{approval.StatusPending}})
		if err != nil || len(pending) != 1 || len(ids) != 4 || ids[1] != ids[0] || ids[3] != ids[0] {
			t.Errorf("spellings of one call: approvals %v pending %v %v; want one, shared", ids, pending, err)
		}
		g.gw.Rec.Flush(ctx)
		evs, _ := audit.ReadEvents(ctx, g.gw.Store, 1, 100000)
		for _, e := range evs {
			if strings.HasPrefix(e.ToolName, "tool:fs-write") || e.ToolName == "fs.write.file" || e.ToolName == "fs-write-file" {
				if e.ToolID != "tool:fs-write-file" || e.Code != "approval_required" {
					t.Errorf("%s recorded as %s %s/%s", e.ToolName, e.ToolID, e.Verdict, e.Code)
				}
			}
		}
	})
	t.Run("a session is bound to the credential that created it", func(t *testing.T) {
		sid := dev.ID()
		for _, m := range []string{"GET", "DELETE"} {
			code, _ := do(t, m, g.url, viewerKey, map[string]string{"Mcp-Session-Id": sid}, "")
			if code != http.StatusForbidden {
				t.Errorf("%s with another key on the session: %d, want 403", m, code)
			}
		}
		code, _ := do(t, "POST", g.url, viewerKey, map[string]string{"Mcp-Session-Id": sid, "Mcp-Protocol-Version": "2025-11-25"},
			`{"jsonrpc":"2.0","id":9,"method":"tools/list"}`)
		if code != http.StatusForbidden {
			t.Errorf("POST with another key on the session: %d, want 403", code)
		}
		if _, err := call(t, dev, "fs_list_allowed_directories", map[string]any{}); err != nil {
			t.Errorf("the session owner lost its session: %v", err)
		}
	})
	t.Run("the JSON API checks Origin and Host too", func(t *testing.T) {
		code, _ := do(t, "POST", base+"/v1/decide", devKey, map[string]string{"Origin": "http://evil.example"}, `{"tool":"fs_list_directory","args":{"path":"."}}`)
		if code != http.StatusForbidden {
			t.Errorf("evil origin: %d", code)
		}
		code, _ = do(t, "POST", base+"/v1/decide", devKey, map[string]string{"Host": "evil.example"}, `{"tool":"fs_list_directory","args":{"path":"."}}`)
		if code != http.StatusForbidden {
			t.Errorf("evil host: %d", code)
		}
	})
	t.Run("approvals and the audit log are not for every key", func(t *testing.T) {
		res, _ := call(t, dev, "fs_write_file", map[string]any{"path": filepath.Join(ws, "p.txt"), "content": "secret draft"})
		id, _ := structured(t, res)["approval_id"].(string)
		code, body := do(t, "GET", base+"/v1/approvals", viewerKey, nil, "")
		var list struct{ Approvals []approval.Approval }
		json.Unmarshal([]byte(body), &list)
		if code != 200 || len(list.Approvals) != 0 {
			t.Errorf("viewer sees approvals: %d %s", code, body)
		}
		code, body = do(t, "GET", base+"/v1/approvals", devKey, nil, "")
		if code != 200 || !strings.Contains(body, id) {
			t.Errorf("the requester does not see its own approval: %d %s", code, body)
		}
		if code, _ := do(t, "GET", base+"/v1/audit?from=1", viewerKey, nil, ""); code != http.StatusForbidden {
			t.Errorf("viewer reads the audit log: %d", code)
		}
	})
}

// TestReviewFindingsBuiltins: the second review's findings on the built-ins.
func TestReviewFindingsBuiltins(t *testing.T) {
	g, _ := exampleGateway(t)
	base := strings.TrimSuffix(g.url, "/mcp")
	const analyst = "tg-demo-analyst"
	t.Run("fs_search does not leak .env contents", func(t *testing.T) {
		for _, pat := range []string{"**", "*", "secrets.en?", "**/*.env"} {
			code, body := do(t, "POST", base+"/v1/tools/call", analyst, nil,
				`{"tool":"fs_search","arguments":{"pattern":"`+pat+`","query":"="}}`)
			if code == 200 || strings.Contains(body, "TOKEN=x") || !strings.Contains(body, "condition_failed") {
				t.Errorf("pattern %q: %d %s", pat, code, body)
			}
		}
	})
	t.Run("/v1/decide inspects built-in calls", func(t *testing.T) {
		code, body := do(t, "POST", base+"/v1/decide", analyst, nil, `{"tool":"sql_query","args":{"query":"SELECT token FROM api_tokens"}}`)
		if code != 403 || !strings.Contains(body, "rbac_resource") || !strings.Contains(body, "api_tokens") {
			t.Errorf("decide on a forbidden table: %d %s", code, body)
		}
		code, body = do(t, "POST", base+"/v1/decide", analyst, nil, `{"tool":"fs_read","args":{"path":"../../etc/passwd"}}`)
		if code != 403 || !strings.Contains(body, "path_outside_workspace") {
			t.Errorf("decide on a path outside: %d %s", code, body)
		}
	})
	t.Run("argument names are exact", func(t *testing.T) {
		code, body := do(t, "POST", base+"/v1/tools/call", analyst, nil, `{"tool":"fs_read","arguments":{"Path":"secrets.env"}}`)
		if code == 200 || strings.Contains(body, "TOKEN=x") {
			t.Errorf("Path instead of path: %d %s", code, body)
		}
	})
}

// TestRefusalsReleaseTheConnection: a request that declares a body and
// never sends it is answered at once and its connection closed, whatever
// refuses it (no credential on /mcp or the JSON API, a wrong method, an
// unknown route, a route that takes no body, a foreign Origin): no client
// can hold connections and goroutines without a credential.
func TestRefusalsReleaseTheConnection(t *testing.T) {
	g := startGateway(t, filepath.Join(testenv.RepoRoot(t), "examples", "bundle"))
	host := strings.TrimPrefix(strings.TrimSuffix(g.url, "/mcp"), "http://")
	for _, tc := range []struct{ name, req, status string }{
		{"401 on /mcp", "POST /mcp HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: 1000\r\n\r\n{", "401"},
		{"401 on the JSON API", "POST /v1/decide HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{", "401"},
		{"405", "PUT /v1/decide HTTP/1.1\r\nHost: %s\r\nContent-Length: 1000\r\n\r\n{", "405"},
		{"404", "POST /nope HTTP/1.1\r\nHost: %s\r\nContent-Length: 1000\r\n\r\n{", "404"},
		{"healthz with a body", "GET /healthz HTTP/1.1\r\nHost: %s\r\nContent-Length: 1000\r\n\r\n{", "200"},
		{"foreign Origin", "POST /mcp HTTP/1.1\r\nHost: %s\r\nOrigin: https://evil.example\r\nContent-Length: 1000\r\n\r\n{", "403"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conn, err := net.Dial("tcp", host)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			fmt.Fprintf(conn, tc.req, host)
			conn.SetReadDeadline(time.Now().Add(5 * time.Second))
			br := bufio.NewReader(conn)
			line, err := br.ReadString('\n')
			if err != nil || !strings.Contains(line, " "+tc.status+" ") {
				t.Fatalf("status line %q %v, want %s", line, err, tc.status)
			}
			// The server closes the connection: the rest reads to EOF.
			if _, err := io.Copy(io.Discard, br); err != nil {
				t.Errorf("the connection is still open after the answer: %v", err)
			}
		})
	}
}
