package mcpproxy

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// recordingUpstream is a Go SDK server with one tool, echo, behind a
// handler that keeps the raw "arguments" of every tools/call it receives:
// what the upstream's own parser would read.
type recordingUpstream struct {
	URL  string
	mu   sync.Mutex
	args []string
}

func (u *recordingUpstream) received() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.args...)
}

func startRecording(t *testing.T) *recordingUpstream {
	u := &recordingUpstream{}
	srv := mcp.NewServer(&mcp.Implementation{Name: "rec", Version: "1"}, nil)
	srv.AddTool(&mcp.Tool{Name: "echo", InputSchema: map[string]any{"type": "object"}},
		func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: string(req.Params.Arguments)}}}, nil
		})
	sdk := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil)
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			body, _ := io.ReadAll(r.Body)
			var m struct {
				Method string `json:"method"`
				Params struct {
					Arguments json.RawMessage `json:"arguments"`
				} `json:"params"`
			}
			if json.Unmarshal(body, &m) == nil && m.Method == "tools/call" {
				u.mu.Lock()
				u.args = append(u.args, string(m.Params.Arguments))
				u.mu.Unlock()
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
		}
		sdk.ServeHTTP(w, r)
	}))
	t.Cleanup(ts.Close)
	u.URL = ts.URL
	return u
}

// TestTheUpstreamGetsWhatWasDecided: on both paths the upstream receives
// the arguments the gateway decided on, re-encoded (canonical JSON), never
// the client's bytes; arguments two parsers could read differently
// (duplicate keys, keys that differ only by case, numbers a float64 does
// not hold as written) are refused as malformed_call and never reach it.
func TestTheUpstreamGetsWhatWasDecided(t *testing.T) {
	up := startRecording(t)
	url := serveProxy(t, agentBundle(evUpstream(up.URL), []string{"echo"}, ""))
	sid := openRaw2(t, url, testKeys[0], "echo")
	cases := []struct {
		name string
		args string
		want string // what the upstream gets; "" when it must get nothing
	}{
		{"escapes and order re-encoded", `{"z":1,"p\u0061th":"notes\/a.md"}`, `{"path":"notes/a.md","z":1}`},
		{"nested escapes", `{"a":[{"\u0063md":"ls"}]}`, `{"a":[{"cmd":"ls"}]}`},
		{"duplicate key", `{"path":"a.md","path":".env"}`, ""},
		{"duplicate key nested", `{"o":{"cmd":"ls","cmd":"rm -rf /"}}`, ""},
		{"keys differ by case", `{"path":"a.md","Path":".env"}`, ""},
		{"keys differ by case via escape", `{"path":"a.md","\u0050ath":".env"}`, ""},
		{"Kelvin sign", `{"kind":"read","\u212aind":"write"}`, ""},
		{"integer past 2^53", `{"amount":9007199254740993}`, ""},
		{"decimal past float64", `{"amount":50.00000000000000001}`, ""},
	}
	for _, path := range []string{"fast", "sdk"} {
		for i, tc := range cases {
			t.Run(path+"/"+tc.name, func(t *testing.T) {
				before := len(up.received())
				params := `{"name":"echo","arguments":` + tc.args + `}`
				if path == "sdk" {
					// _meta takes a call to the SDK path.
					params = `{"name":"echo","arguments":` + tc.args + `,"_meta":{"progressToken":"p` + string(rune('a'+i)) + `"}}`
				}
				_, body := post(t, url, testKeys[0], sid, `{"jsonrpc":"2.0","id":`+jsonInt(100+i)+`,"method":"tools/call","params":`+params+`}`)
				got := up.received()[before:]
				if tc.want == "" {
					if len(got) != 0 {
						t.Errorf("the upstream got %q; it must get nothing", got)
					}
					if !strings.Contains(body, "malformed_call") {
						t.Errorf("answer does not say malformed_call: %s", body)
					}
					return
				}
				if len(got) != 1 || got[0] != tc.want {
					t.Errorf("the upstream got %q, want [%q]\nanswer: %s", got, tc.want, body)
				}
			})
		}
	}
}

func jsonInt(i int) string { b, _ := json.Marshal(i); return string(b) }
