package gateway_test

// TestConformance runs the MCP conformance suite's server scenarios
// (@modelcontextprotocol/conformance 0.1.12, pinned in testdata/npm) against
// the Go SDK's conformance everything-server twice, at once: directly, and
// through toolgate serving testdata/conformance-bundle. Every scenario that
// passes directly must pass through the gateway; both counts are logged
// (go test -v). Scenarios listed in testdata/conformance-bundle/known-gaps.txt
// are accepted as failing, with the reason given there. scripts/conformance
// does the same from the shell.

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolgate/toolgate/internal/testenv"
)

// knownGaps reads testdata/conformance-bundle/known-gaps.txt: scenarios
// that pass directly but cannot pass through the gateway today, with the
// reason. The test fails when one starts passing, so its line is removed.
func knownGaps(t *testing.T) map[string]string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", "conformance-bundle", "known-gaps.txt"))
	if err != nil {
		t.Fatal(err)
	}
	gaps := map[string]string{}
	for _, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, reason, _ := strings.Cut(line, " ")
		gaps[name] = strings.TrimSpace(reason)
	}
	return gaps
}

// conformanceBundle copies testdata/conformance-bundle with the upstream
// URL pointing at addr.
func conformanceBundle(t *testing.T, addr string) string {
	t.Helper()
	src := filepath.Join("testdata", "conformance-bundle")
	entries, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		s := strings.ReplaceAll(string(data), "127.0.0.1:3920", addr)
		if err := os.WriteFile(filepath.Join(dir, e.Name()), []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// suiteResult is what one run of the suite reported: scenario → passed,
// and the summed check counts.
type suiteResult struct {
	passed         map[string]bool
	checks, failed int
	output         string
}

// scenarioLine matches the summary lines "✓ name: 1 passed, 0 failed".
var scenarioLine = regexp.MustCompile(`(?m)^([✓✗]) ([a-z0-9-]+): (\d+) passed, (\d+) failed`)

func runSuite(ctx context.Context, t *testing.T, url string) suiteResult {
	t.Helper()
	cmd := exec.CommandContext(ctx, testenv.NodeBin(t), testenv.NodePackageBin(t, "conformance"), "server", "--url", url)
	cmd.Dir = t.TempDir()          // it writes results/ into the working directory
	out, _ := cmd.CombinedOutput() // exit status 1 when a check fails
	res := suiteResult{passed: map[string]bool{}, output: string(out)}
	for _, m := range scenarioLine.FindAllStringSubmatch(res.output, -1) {
		p, _ := strconv.Atoi(m[3])
		f, _ := strconv.Atoi(m[4])
		res.passed[m[2]] = m[1] == "✓" && f == 0
		res.checks += p
		res.failed += f
	}
	return res
}

func TestConformance(t *testing.T) {
	ev := testenv.StartEverythingServer(t, "")
	g := startGateway(t, conformanceBundle(t, ev.Addr))

	// Resources and prompts are mirrored in the background after the
	// upstream's tools; wait for them before the suite lists them.
	c := mcp.NewClient(&mcp.Implementation{Name: "conformance-wait", Version: "1"}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: g.url}, nil)
	if err != nil {
		t.Fatalf("connect to the gateway: %v", err)
	}
	for {
		r, rerr := cs.ListResources(ctx, nil)
		p, perr := cs.ListPrompts(ctx, nil)
		if rerr == nil && perr == nil && len(r.Resources) > 0 && len(p.Prompts) > 0 {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the gateway did not mirror the upstream's resources and prompts: %v %v", rerr, perr)
		}
		time.Sleep(50 * time.Millisecond)
	}
	cs.Close()

	ctx, cancel = context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	results := make(chan suiteResult, 1)
	go func() { results <- runSuite(ctx, t, ev.URL) }()
	via := runSuite(ctx, t, g.url)
	direct := <-results

	t.Logf("directly (%s): %d scenarios, %d checks passed, %d failed", ev.URL, len(direct.passed), direct.checks, direct.failed)
	t.Logf("through toolgate (%s): %d scenarios, %d checks passed, %d failed", g.url, len(via.passed), via.checks, via.failed)
	// The suite's plain tool calls take the fast path, those with a
	// progress token the SDK path: both are held to the suite.
	fast, sdk := g.gw.Proxy.CallPaths()
	t.Logf("tools/call through toolgate: %d on the fast path, %d on the SDK path", fast, sdk)
	if fast == 0 || sdk == 0 {
		t.Errorf("the suite exercised the fast path %d times and the SDK path %d times; want both", fast, sdk)
	}
	if len(direct.passed) == 0 {
		t.Fatalf("the suite reported no scenario against the server itself:\n%s", direct.output)
	}
	var names []string
	for name := range direct.passed {
		names = append(names, name)
	}
	slices.Sort(names)
	gaps := knownGaps(t)
	for _, name := range names {
		if !direct.passed[name] {
			continue
		}
		reason, known := gaps[name]
		switch {
		case via.passed[name] && known:
			t.Errorf("scenario %s now passes through the gateway: remove it from testdata/conformance-bundle/known-gaps.txt", name)
		case !via.passed[name] && known:
			t.Logf("known gap: %s fails through the gateway: %s", name, reason)
		case !via.passed[name]:
			t.Errorf("scenario %s passes directly but not through the gateway", name)
		}
	}
	if t.Failed() {
		t.Logf("suite output through the gateway:\n%s", via.output)
	}
}
