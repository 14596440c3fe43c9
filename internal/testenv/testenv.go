// Package testenv lets tests find the real things they run against: the npm
// MCP servers and clients pinned in testdata/npm, the Go SDK's conformance
// "everything" server, PostgreSQL, and free loopback ports.
//
// Everything here is installed by .ci/install-deps; a helper that cannot find
// what it looks for fails the test with a message that says to run it. Tests
// never install anything themselves, and nothing here is skipped silently: the
// only skip is PostgresDSN with TOOLGATE_PG_DSN=off.
package testenv

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// ModulePath is the module whose root RepoRoot looks for.
const ModulePath = "github.com/toolgate/toolgate"

// DefaultPostgresDSN is the DSN PostgresDSN returns when TOOLGATE_PG_DSN is
// unset: the local PostgreSQL with trust auth and the database "test".
const DefaultPostgresDSN = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

const installHint = "run .ci/install-deps"

// RepoRoot returns the absolute path of the repository root: the nearest
// directory at or above the working directory whose go.mod declares
// ModulePath. It fails the test if there is none.
func RepoRoot(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatalf("testenv: working directory: %v", err)
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && modulePath(b) == ModulePath {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatalf("testenv: no go.mod for module %s at or above the working directory", ModulePath)
		}
		dir = parent
	}
}

func modulePath(gomod []byte) string {
	sc := bufio.NewScanner(bytes.NewReader(gomod))
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) >= 2 && f[0] == "module" {
			return strings.Trim(f[1], `"`)
		}
	}
	return ""
}

// NodeModulesDir returns the absolute path of testdata/npm/node_modules. It
// fails the test, saying to run .ci/install-deps, if the directory is missing.
func NodeModulesDir(t testing.TB) string {
	t.Helper()
	dir := filepath.Join(RepoRoot(t), "testdata", "npm", "node_modules")
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		t.Fatalf("testenv: %s is missing: %s", dir, installHint)
	}
	return dir
}

// NodeBin returns the absolute path of the node executable found on PATH.
func NodeBin(t testing.TB) string {
	t.Helper()
	p, err := exec.LookPath("node")
	if err != nil {
		t.Fatalf("testenv: node not found on PATH (%v): install Node.js >= 20, then %s", err, installHint)
	}
	abs, err := filepath.Abs(p)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	return abs
}

// NodePackageBin returns the absolute path of the JavaScript entry point
// (the "bin" of its package.json) of an npm package installed in
// testdata/npm. A name without a scope is taken from @modelcontextprotocol:
// "server-everything", "server-filesystem", "server-memory", "inspector" and
// "conformance" are installed. Run the result with NodeBin, not through npx.
// It fails the test, saying to run .ci/install-deps, if the package or its
// entry point is missing.
func NodePackageBin(t testing.TB, name string) string {
	t.Helper()
	pkg := name
	if !strings.HasPrefix(pkg, "@") {
		pkg = "@modelcontextprotocol/" + pkg
	}
	dir := filepath.Join(NodeModulesDir(t), filepath.FromSlash(pkg))
	b, err := os.ReadFile(filepath.Join(dir, "package.json"))
	if err != nil {
		t.Fatalf("testenv: npm package %s is not installed: %s", pkg, installHint)
	}
	var meta struct {
		Bin json.RawMessage `json:"bin"`
	}
	if err := json.Unmarshal(b, &meta); err != nil {
		t.Fatalf("testenv: %s/package.json: %v", pkg, err)
	}
	rel, err := binEntry(pkg, meta.Bin)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	p := filepath.Join(dir, filepath.FromSlash(rel))
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("testenv: entry point of %s is missing (%v): %s", pkg, err, installHint)
	}
	return p
}

// binEntry picks the entry point out of a package.json "bin" value: the
// string itself, the only entry of a map, or the entry named after the
// package ("name" or "mcp-name").
func binEntry(pkg string, raw json.RawMessage) (string, error) {
	var s string
	if err := json.Unmarshal(raw, &s); err == nil && s != "" {
		return s, nil
	}
	var m map[string]string
	if err := json.Unmarshal(raw, &m); err != nil || len(m) == 0 {
		return "", fmt.Errorf("%s declares no bin", pkg)
	}
	if len(m) == 1 {
		for _, v := range m {
			return v, nil
		}
	}
	base := pkg[strings.LastIndex(pkg, "/")+1:]
	for _, k := range []string{base, "mcp-" + base} {
		if v, ok := m[k]; ok {
			return v, nil
		}
	}
	return "", fmt.Errorf("%s declares several bins and none is named %q", pkg, base)
}

// EverythingServerBin returns the absolute path of the Go SDK's conformance
// server (github.com/modelcontextprotocol/go-sdk/conformance/everything-server),
// built by .ci/install-deps into .cache/bin/everything-server. Its flags:
// -http=ADDR serves streamable HTTP at ADDR/mcp instead of stdio, and
// -stateless=false keeps sessions (the default is stateless).
func EverythingServerBin(t testing.TB) string {
	t.Helper()
	p := filepath.Join(RepoRoot(t), ".cache", "bin", "everything-server")
	if fi, err := os.Stat(p); err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
		t.Fatalf("testenv: %s is missing: %s", p, installHint)
	}
	return p
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago. Another
// process may take it before the caller binds it; prefer listening on
// "127.0.0.1:0" where the code under test allows it.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("testenv: listen on 127.0.0.1:0: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// FreeAddr returns "127.0.0.1:PORT" for a port from FreePort.
func FreeAddr(t testing.TB) string {
	t.Helper()
	return fmt.Sprintf("127.0.0.1:%d", FreePort(t))
}

// PostgresDSN returns the DSN of the test PostgreSQL: TOOLGATE_PG_DSN if set,
// else DefaultPostgresDSN. With TOOLGATE_PG_DSN=off it skips the test. For a
// URL DSN it checks that the server accepts TCP connections and fails the
// test (saying to run .ci/install-deps) if not; it does not log in. Tests
// create their own uniquely named schema or database and drop it after.
func PostgresDSN(t testing.TB) string {
	t.Helper()
	dsn := os.Getenv("TOOLGATE_PG_DSN")
	if dsn == "off" {
		t.Skip("PostgreSQL tests disabled: TOOLGATE_PG_DSN=off")
	}
	if dsn == "" {
		dsn = DefaultPostgresDSN
	}
	if u, err := url.Parse(dsn); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") && u.Host != "" {
		host := u.Host
		if u.Port() == "" {
			host = net.JoinHostPort(u.Hostname(), "5432")
		}
		c, err := net.DialTimeout("tcp", host, 5*time.Second)
		if err != nil {
			t.Fatalf("testenv: PostgreSQL at %s does not answer (%v): %s", host, err, installHint)
		}
		c.Close()
	}
	return dsn
}

// Server is a process started by StartEverythingServer.
type Server struct {
	// Addr is "127.0.0.1:PORT".
	Addr string
	// URL is the MCP endpoint, "http://127.0.0.1:PORT/mcp".
	URL string
	// Cmd is the running process.
	Cmd *exec.Cmd

	done chan struct{}
}

// StartEverythingServer starts the Go SDK conformance server (see
// EverythingServerBin) in stateful streamable HTTP mode on addr, or on a free
// loopback port if addr is "", and waits until it accepts connections (at most
// 10 s). The process is killed when the test ends; its log goes to t.Log on
// failure.
func StartEverythingServer(t testing.TB, addr string) *Server {
	t.Helper()
	bin := EverythingServerBin(t)
	if addr == "" {
		addr = FreeAddr(t)
	}
	var logBuf syncBuffer
	cmd := exec.Command(bin, "-http="+addr, "-stateless=false")
	cmd.Stdout = &logBuf
	cmd.Stderr = &logBuf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("testenv: start %s: %v", bin, err)
	}
	s := &Server{Addr: addr, URL: "http://" + addr + "/mcp", Cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(s.done) }()
	t.Cleanup(func() {
		s.Kill()
		if t.Failed() {
			t.Logf("everything-server %s log:\n%s", addr, logBuf.String())
		}
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return s
		}
		select {
		case <-s.done:
			t.Fatalf("testenv: everything-server on %s exited early:\n%s", addr, logBuf.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("testenv: everything-server on %s does not accept connections: %v", addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Kill kills the server's process group and waits for it to exit. It is safe
// to call more than once.
func (s *Server) Kill() {
	select {
	case <-s.done:
		return
	default:
	}
	_ = syscall.Kill(-s.Cmd.Process.Pid, syscall.SIGKILL)
	<-s.done
}

// syncBuffer is a bytes.Buffer safe for concurrent writes and reads.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
