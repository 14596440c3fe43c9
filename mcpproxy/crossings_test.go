package mcpproxy

import (
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// stackObserver records, at the first upstream call it sees, the packages
// of the calling goroutine's stack, outermost first.
type stackObserver struct {
	mu   sync.Mutex
	pkgs []string
}

func (o *stackObserver) UpstreamCall(string, string, time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.pkgs != nil {
		return
	}
	pcs := make([]uintptr, 128)
	n := runtime.Callers(2, pcs)
	frames := runtime.CallersFrames(pcs[:n])
	var pkgs []string
	for {
		f, more := frames.Next()
		pkgs = append(pkgs, packageOf(f.Function))
		if !more {
			break
		}
	}
	for i, j := 0, len(pkgs)-1; i < j; i, j = i+1, j-1 {
		pkgs[i], pkgs[j] = pkgs[j], pkgs[i]
	}
	o.pkgs = pkgs
}

// packageOf is the import path of a function's package
// ("github.com/toolgate/toolgate/gate.(*Gate).Handle" → ".../gate").
func packageOf(fn string) string {
	slash := strings.LastIndex(fn, "/")
	if dot := strings.Index(fn[slash+1:], "."); dot >= 0 {
		return fn[:slash+1+dot]
	}
	return fn
}

// TestToolsCallPackageCrossings measures how many package boundaries a
// tools/call on the fast path crosses between net/http handing the gateway
// the request and the executor posting it upstream: the stack at the
// executor's measurement of the upstream call, where each change of
// package along it is one crossing, plus the two of the way out
// (adapter/mcptool → upstream → net/http). The call is decided once: the
// gate is asked once for it (one decision, one record).
func TestToolsCallPackageCrossings(t *testing.T) {
	up := startRecording(t)
	obs := &stackObserver{}
	url, _ := serveProxyEnv(t, agentBundle(evUpstream(up.URL), []string{"echo"}, ""), proxyEnv{observer: obs})
	sid := openRaw2(t, url, testKeys[0], "echo")
	post(t, url, testKeys[0], sid, `{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"echo","arguments":{"x":1}}}`)
	obs.mu.Lock()
	pkgs := obs.pkgs
	obs.mu.Unlock()
	if pkgs == nil {
		t.Fatal("no upstream call was observed")
	}
	// From the gateway's first frame on.
	start := -1
	for i, pkg := range pkgs {
		if strings.HasPrefix(pkg, "github.com/toolgate/toolgate/") {
			start = i - 1 // the net/http frame that called it
			break
		}
	}
	if start < 0 {
		t.Fatalf("no gateway frame in %v", pkgs)
	}
	var path []string
	for _, pkg := range pkgs[start:] {
		if len(path) == 0 || path[len(path)-1] != pkg {
			path = append(path, pkg)
		}
	}
	crossings := len(path) - 1 + 2
	t.Logf("tools/call path (%d crossings, 2 of them on the way out): %s → upstream → net/http", crossings, strings.Join(path, " → "))
	if crossings > 10 {
		t.Errorf("a tools/call crosses %d package boundaries, want at most 10: %v", crossings, path)
	}
}
