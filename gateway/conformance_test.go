package gateway_test

// TestConformance runs the MCP conformance suite's server scenarios
// (@modelcontextprotocol/conformance 0.1.12, pinned in testdata/npm) against
// the Go SDK's conformance everything-server twice, at once: directly, and
// through toolgate serving testdata/conformance-bundle. Every scenario that
// passes directly must pass through the gateway; both counts are logged
// (go test -v). scripts/conformance does the same from the shell.

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

// knownGaps are scenarios that pass directly but cannot pass through the
// gateway today, with the reason. The test fails when one starts passing,
// so the entry gets removed.
var knownGaps = map[string]string{
	// The server asks for a form whose multi-select property has items
	// {"type":"string","anyOf":[{const,title}...]}. The Go SDK client that
	// the upstream package uses for upstream sessions validates an
	// elicitation's schema before any handler runs and rejects this one
	// ("items must specify enum for untitled enums"), so the request never
	// reaches the gateway's relay. Fix: in upstream.newClient, answer
	// *mcp.ElicitRequest in the client's receiving middleware (as it does
	// for roots/list), which runs before that validation.
	"elicitation-sep1330-enums": "the Go SDK client rejects the SEP-1330 titled multi-select schema before the relay sees it",
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
	cmd.Dir = t.TempDir() // it writes results/ into the working directory
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
	if len(direct.passed) == 0 {
		t.Fatalf("the suite reported no scenario against the server itself:\n%s", direct.output)
	}
	var names []string
	for name := range direct.passed {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		if !direct.passed[name] {
			continue
		}
		reason, known := knownGaps[name]
		switch {
		case via.passed[name] && known:
			t.Errorf("scenario %s now passes through the gateway: remove it from knownGaps", name)
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
