package testenv

import (
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestRepoRoot(t *testing.T) {
	root := RepoRoot(t)
	if _, err := os.Stat(filepath.Join(root, "toolgate.go")); err != nil {
		t.Fatalf("RepoRoot() = %s, which has no toolgate.go: %v", root, err)
	}
}

func TestNodePackageBin(t *testing.T) {
	tests := []struct {
		name string
		want string // suffix of the entry point
	}{
		{"server-everything", "server-everything/dist/index.js"},
		{"server-filesystem", "server-filesystem/dist/index.js"},
		{"server-memory", "server-memory/dist/index.js"},
		{"inspector", "inspector/cli/build/cli.js"},
		{"conformance", "conformance/dist/index.js"},
		{"@modelcontextprotocol/conformance", "conformance/dist/index.js"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := NodePackageBin(t, tc.name)
			if !strings.HasSuffix(got, filepath.FromSlash(tc.want)) || !filepath.IsAbs(got) {
				t.Errorf("NodePackageBin(%q) = %s, want an absolute path ending in %s", tc.name, got, tc.want)
			}
		})
	}
	_ = NodeBin(t)
}

func TestBinEntry(t *testing.T) {
	tests := []struct {
		name, pkg, bin, want string
		wantErr              bool
	}{
		{name: "string", pkg: "@s/x", bin: `"a.js"`, want: "a.js"},
		{name: "single", pkg: "@s/x", bin: `{"whatever":"b.js"}`, want: "b.js"},
		{name: "named", pkg: "@s/x", bin: `{"y":"1.js","x":"2.js"}`, want: "2.js"},
		{name: "mcp-named", pkg: "@s/x", bin: `{"y":"1.js","mcp-x":"3.js"}`, want: "3.js"},
		{name: "ambiguous", pkg: "@s/x", bin: `{"y":"1.js","z":"2.js"}`, wantErr: true},
		{name: "none", pkg: "@s/x", bin: `null`, wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := binEntry(tc.pkg, []byte(tc.bin))
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Errorf("binEntry(%s) = %q, %v; want %q, error %v", tc.bin, got, err, tc.want, tc.wantErr)
			}
		})
	}
}

func TestFreeAddr(t *testing.T) {
	addr := FreeAddr(t)
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listen on FreeAddr() %s: %v", addr, err)
	}
	l.Close()
}

func TestStartEverythingServer(t *testing.T) {
	s := StartEverythingServer(t, "")
	// A GET without a session is refused, but it proves the handler answers.
	resp, err := http.Get(s.URL)
	if err != nil {
		t.Fatalf("GET %s: %v", s.URL, err)
	}
	resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound {
		t.Errorf("GET %s: status %d, want the MCP handler", s.URL, resp.StatusCode)
	}
	s.Kill()
	s.Kill()
	if _, err := net.Dial("tcp", s.Addr); err == nil {
		t.Errorf("%s still accepts connections after Kill", s.Addr)
	}
}

func TestPostgresDSN(t *testing.T) {
	t.Setenv("TOOLGATE_PG_DSN", "")
	if got := PostgresDSN(t); got != DefaultPostgresDSN {
		t.Errorf("PostgresDSN() = %q, want %q", got, DefaultPostgresDSN)
	}
}
