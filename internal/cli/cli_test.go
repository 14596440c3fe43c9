package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/toolgate/toolgate/internal/cli"
)

var exampleBundle = filepath.Join("..", "..", "examples", "bundle")

type result struct {
	code           int
	stdout, stderr string
}

// runCLI executes the CLI with captured streams. TOOLGATE_BUNDLE is cleared so
// the caller's environment cannot change the outcome.
func runCLI(t *testing.T, args ...string) result {
	t.Helper()
	t.Setenv("TOOLGATE_BUNDLE", "")
	var stdout, stderr bytes.Buffer
	code := cli.Run(context.Background(), args, strings.NewReader(""), &stdout, &stderr)
	r := result{code, stdout.String(), stderr.String()}
	if strings.Contains(r.stderr, "goroutine ") || strings.Contains(r.stderr, "panic:") {
		t.Errorf("toolgate %s: stack trace on stderr:\n%s", strings.Join(args, " "), r.stderr)
	}
	return r
}

// decodeObject decodes one JSON object and returns its keys, sorted.
func decodeObject(t *testing.T, data string, into any) []string {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal([]byte(data), &m); err != nil {
		t.Fatalf("output is not a JSON object: %v\n%s", err, data)
	}
	if into != nil {
		if err := json.Unmarshal([]byte(data), into); err != nil {
			t.Fatalf("decode: %v", err)
		}
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func hasKeys(t *testing.T, what string, got []string, want ...string) {
	t.Helper()
	for _, k := range want {
		if !slices.Contains(got, k) {
			t.Errorf("%s: no key %q (keys %v)", what, k, got)
		}
	}
}

// copyBundle copies the example bundle into a fresh folder.
func copyBundle(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	files, err := filepath.Glob(filepath.Join(exampleBundle, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no example bundle files: %v", err)
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, filepath.Base(f)), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// lineOf returns the 1-based line of the first line of text containing s.
func lineOf(t *testing.T, text, s string) int {
	t.Helper()
	for i, l := range strings.Split(text, "\n") {
		if strings.Contains(l, s) {
			return i + 1
		}
	}
	t.Fatalf("%q not found", s)
	return 0
}

func TestValidateExampleBundle(t *testing.T) {
	r := runCLI(t, "validate", "--bundle", exampleBundle)
	if r.code != cli.ExitOK {
		t.Fatalf("exit %d, want 0\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	if !strings.Contains(r.stdout, ": valid (0 errors") {
		t.Errorf("stdout does not say valid:\n%s", r.stdout)
	}

	r = runCLI(t, "validate", "--bundle", exampleBundle, "-o", "json")
	if r.code != cli.ExitOK {
		t.Fatalf("-o json: exit %d, want 0: %s", r.code, r.stderr)
	}
	var out struct {
		OK       bool              `json:"ok"`
		Errors   []json.RawMessage `json:"errors"`
		Warnings []json.RawMessage `json:"warnings"`
	}
	keys := decodeObject(t, r.stdout, &out)
	if diff := cmp.Diff([]string{"errors", "ok", "warnings"}, keys); diff != "" {
		t.Errorf("validate JSON keys (-want +got):\n%s", diff)
	}
	if !out.OK || out.Errors == nil || len(out.Errors) != 0 || out.Warnings == nil {
		t.Errorf("validate JSON = %s; want ok true, errors [] and a warnings list", r.stdout)
	}
}

// breakage damages a copy of the example bundle; it returns the file and
// line the error must name, and a substring of its message.
type breakage struct {
	name    string
	apply   func(t *testing.T, dir string) (file string, line int)
	message string
}

var breakages = []breakage{
	{"unknown field in agents.yaml", func(t *testing.T, dir string) (string, int) {
		file := filepath.Join(dir, "agents.yaml")
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		text := strings.Replace(string(data), "  agent_id: poc-agt-001\n", "  agent_id: poc-agt-001\n  colour: blue\n", 1)
		writeFile(t, file, text)
		return file, lineOf(t, text, "colour: blue")
	}, `Agent.colour: unknown field "colour"`},
	{"ceiling naming an unknown tool", func(t *testing.T, dir string) (string, int) {
		file := filepath.Join(dir, "agents.yaml")
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		text := strings.Replace(string(data), "{tool_id: tool:searxng-search,", "{tool_id: tool:searxng-serch,", 1)
		writeFile(t, file, text)
		return file, lineOf(t, text, "tool:searxng-serch")
	}, "unknown tool tool:searxng-serch"},
	{"malformed YAML file", func(t *testing.T, dir string) (string, int) {
		file := filepath.Join(dir, "broken.yaml")
		text := "# a tool whose class line is broken\n- kind: Tool\n  tool_id: tool:extra-tool\n  side_effect_class: none: read\n"
		writeFile(t, file, text)
		return file, lineOf(t, text, "side_effect_class")
	}, "mapping values are not allowed"},
}

func writeFile(t *testing.T, path, text string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestValidateBrokenBundle(t *testing.T) {
	for _, b := range breakages {
		t.Run(b.name, func(t *testing.T) {
			dir := copyBundle(t)
			file, line := b.apply(t, dir)
			where := file + ":" + strconv.Itoa(line) + ": "

			r := runCLI(t, "validate", "--bundle", dir)
			if r.code != cli.ExitFailure {
				t.Errorf("exit %d, want 1\n%s", r.code, r.stdout)
			}
			found := false
			for _, l := range strings.Split(r.stdout, "\n") {
				if strings.HasPrefix(l, "error: "+where) && strings.Contains(l, b.message) {
					found = true
				}
			}
			if !found {
				t.Errorf("no error line starts with %q and mentions %q:\n%s", "error: "+where, b.message, r.stdout)
			}
			if !strings.Contains(r.stdout, ": invalid (") {
				t.Errorf("stdout does not say invalid:\n%s", r.stdout)
			}

			r = runCLI(t, "validate", "--bundle", dir, "-o", "json")
			if r.code != cli.ExitFailure {
				t.Errorf("-o json: exit %d, want 1", r.code)
			}
			var out struct {
				OK     bool `json:"ok"`
				Errors []struct {
					File    string `json:"file"`
					Line    int    `json:"line"`
					Message string `json:"message"`
				} `json:"errors"`
			}
			decodeObject(t, r.stdout, &out)
			var raw struct {
				Errors []map[string]json.RawMessage `json:"errors"`
			}
			decodeObject(t, r.stdout, &raw)
			for _, e := range raw.Errors {
				var keys []string
				for k := range e {
					keys = append(keys, k)
				}
				slices.Sort(keys)
				if diff := cmp.Diff([]string{"file", "line", "message"}, keys); diff != "" {
					t.Errorf("error object keys (-want +got):\n%s", diff)
				}
			}
			found = false
			for _, e := range out.Errors {
				if e.File == file && e.Line == line && strings.Contains(e.Message, b.message) {
					found = true
				}
			}
			if out.OK || !found {
				t.Errorf("JSON: ok %v; no error at %s:%d mentioning %q: %s", out.OK, file, line, b.message, r.stdout)
			}

			// Every other command refuses the bundle the same way.
			r = runCLI(t, "decide", "--bundle", dir, "--agent", "poc-agt-001", "--tool", "searxng_search")
			if r.code != cli.ExitFailure {
				t.Errorf("decide on the broken bundle: exit %d, want 1", r.code)
			}
			if !strings.Contains(r.stderr, where) {
				t.Errorf("decide on the broken bundle: stderr does not name %s:\n%s", where, r.stderr)
			}
		})
	}
}

func TestResolveJSON(t *testing.T) {
	r := runCLI(t, "resolve", "--bundle", exampleBundle, "--agent", "mkt-agt-001", "--instance", "acme", "--env", "staging", "-o", "json")
	if r.code != cli.ExitOK {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	var out struct {
		AgentID       string   `json:"agent_id"`
		ActiveToolSet []string `json:"active_tool_set"`
		Authorized    []string `json:"authorized"`
		Disclosed     []string `json:"disclosed"`
		Removed       []struct {
			ToolID string `json:"tool_id"`
			Layer  string `json:"layer"`
			Code   string `json:"code"`
			Reason string `json:"reason"`
		} `json:"removed"`
	}
	keys := decodeObject(t, r.stdout, &out)
	hasKeys(t, "resolve JSON", keys, "agent_id", "active_tool_set", "authorized", "disclosed", "removed")
	var raw struct {
		Removed []map[string]json.RawMessage `json:"removed"`
	}
	decodeObject(t, r.stdout, &raw)
	for i, rm := range raw.Removed {
		var keys []string
		for k := range rm {
			keys = append(keys, k)
		}
		hasKeys(t, "removed["+strconv.Itoa(i)+"]", keys, "tool_id", "layer", "code", "reason")
	}
	if out.AgentID != "mkt-agt-001" {
		t.Errorf("agent_id = %q", out.AgentID)
	}
	want := []string{"tool:questdb-read", "tool:redis-read"}
	if diff := cmp.Diff(want, out.ActiveToolSet); diff != "" {
		t.Errorf("active_tool_set (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(want, out.Disclosed); diff != "" {
		t.Errorf("disclosed (-want +got):\n%s", diff)
	}
	removed := map[string]string{}
	for _, rm := range out.Removed {
		removed[rm.ToolID] = rm.Layer + "/" + rm.Code
		if rm.Reason == "" {
			t.Errorf("removal of %s has no reason", rm.ToolID)
		}
	}
	wantRemoved := map[string]string{
		"tool:supabase-write":      "runtime/suspended_runtime",
		"tool:external-broker-api": "runtime/suspended_runtime",
		"tool:qdrant-query":        "instance/suspended_instance",
	}
	if diff := cmp.Diff(wantRemoved, removed); diff != "" {
		t.Errorf("removed (-want +got):\n%s", diff)
	}
}

// TestResolveMatchesREADME checks that the README's resolve example is what
// the command prints.
func TestResolveMatchesREADME(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	start := strings.Index(string(readme), "```\nagent mkt-agt-001, mode production, instance acme, environment staging\n")
	if start < 0 {
		t.Skip("the README no longer shows the resolve example")
	}
	block := string(readme)[start+4:]
	block = block[:strings.Index(block, "```")]
	r := runCLI(t, "resolve", "--bundle", exampleBundle, "--agent", "mkt-agt-001", "--instance", "acme", "--env", "staging")
	if r.code != cli.ExitOK {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	got := map[string]bool{}
	for _, l := range strings.Split(r.stdout, "\n") {
		got[strings.TrimRight(l, " ")] = true
	}
	for _, l := range strings.Split(strings.TrimSpace(block), "\n") {
		if l = strings.TrimRight(l, " "); l != "" && !got[l] {
			t.Errorf("README line missing from the output: %q\noutput:\n%s", l, r.stdout)
		}
	}
}

func TestResolveUnknownAgent(t *testing.T) {
	r := runCLI(t, "resolve", "--bundle", exampleBundle, "--agent", "nobody")
	if r.code != cli.ExitFailure {
		t.Errorf("exit %d, want 1", r.code)
	}
	if !strings.Contains(r.stdout, "nobody") {
		t.Errorf("output does not name the agent:\n%s", r.stdout)
	}
}

func TestDecideJSON(t *testing.T) {
	r := runCLI(t, "decide", "--bundle", exampleBundle, "--agent", "poc-agt-001", "--tool", "supabase_write", "-o", "json")
	if r.code != cli.ExitDenied {
		t.Fatalf("exit %d, want 3: %s", r.code, r.stderr)
	}
	var out map[string]string
	keys := decodeObject(t, r.stdout, &out)
	if diff := cmp.Diff([]string{"code", "event_type", "layer", "reason", "tool_id", "verdict"}, keys); diff != "" {
		t.Errorf("decide JSON keys (-want +got):\n%s", diff)
	}
	delete(out, "reason")
	want := map[string]string{"verdict": "deny", "code": "not_in_ceiling", "layer": "ceiling",
		"tool_id": "tool:supabase-write", "event_type": "agent.tool.unauthorized"}
	if diff := cmp.Diff(want, out); diff != "" {
		t.Errorf("decide JSON (-want +got):\n%s", diff)
	}
}

func TestDecideExitCodes(t *testing.T) {
	b := []string{"--bundle", exampleBundle}
	cases := []struct {
		name   string
		args   []string
		code   int
		stdout string // substring of stdout
	}{
		{"allow", append([]string{"decide", "--agent", "poc-agt-001", "--tool", "searxng_search"}, b...), cli.ExitOK, "ALLOW tool:searxng-search (ok)"},
		{"deny at the ceiling", append([]string{"decide", "--agent", "poc-agt-001", "--tool", "supabase_write"}, b...), cli.ExitDenied,
			"DENY tool:supabase-write (not_in_ceiling at the ceiling layer)"},
		{"deny on a resource", append([]string{"decide", "--agent", "verifier", "--tool", "bifrost.query", "--resource", "bifrost_query=vala.billing.invoices"}, b...), cli.ExitDenied,
			"rbac_resource"},
		{"resource with action", append([]string{"decide", "--agent", "verifier", "--tool", "bifrost.query", "--resource", "bifrost_query:read=vala.datasets.tickets"}, b...), cli.ExitOK,
			"ALLOW"},
		{"Policy Guard escalates", append([]string{"decide", "--agent", "triage", "--principal", "user:bob", "--tool", "payments_refund", "--args", `{"amount": 200}`}, b...), cli.ExitApproval,
			"REQUIRE_APPROVAL tool:payments-refund"},
		{"explain exits like decide", append([]string{"explain", "--agent", "triage", "--principal", "user:bob", "--tool", "github_delete_repo"}, b...), cli.ExitDenied,
			"policy_denied"},
		{"malformed name", append([]string{"decide", "--agent", "poc-agt-001", "--tool", "Searxng_Search"}, b...), cli.ExitDenied, "malformed_call"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := runCLI(t, c.args...)
			if r.code != c.code {
				t.Errorf("exit %d, want %d\nstdout:\n%s\nstderr:\n%s", r.code, c.code, r.stdout, r.stderr)
			}
			if !strings.Contains(r.stdout, c.stdout) {
				t.Errorf("stdout does not mention %q:\n%s", c.stdout, r.stdout)
			}
			if r.stderr != "" {
				t.Errorf("stderr is not empty:\n%s", r.stderr)
			}
		})
	}
}

func TestExplainJSON(t *testing.T) {
	r := runCLI(t, "explain", "--bundle", exampleBundle, "--agent", "triage", "--principal", "user:bob", "--tool", "github_delete_repo", "-o", "json")
	if r.code != cli.ExitDenied {
		t.Fatalf("exit %d, want 3: %s", r.code, r.stderr)
	}
	var out struct {
		Decision map[string]string `json:"decision"`
		Layers   []struct {
			Layer   string `json:"layer"`
			Verdict string `json:"verdict"`
		} `json:"layers"`
	}
	hasKeys(t, "explain JSON", decodeObject(t, r.stdout, &out), "decision", "layers")
	if out.Decision["code"] != "policy_denied" {
		t.Errorf("decision = %v", out.Decision)
	}
	var layers []string
	for _, l := range out.Layers {
		layers = append(layers, l.Layer+"="+l.Verdict)
	}
	want := []string{"composition=pass", "ceiling=pass", "runtime=pass", "instance=pass", "policy=deny",
		"grant=deny", "resource=pass", "condition=pass", "approval=require_approval"}
	if diff := cmp.Diff(want, layers); diff != "" {
		t.Errorf("layers (-want +got):\n%s", diff)
	}
}

// TestBadInput checks that bad input exits 1 with one line on stderr.
func TestBadInput(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "no-such-bundle")
	decide := func(extra ...string) []string {
		return append([]string{"decide", "--bundle", exampleBundle, "--agent", "poc-agt-001", "--tool", "searxng_search"}, extra...)
	}
	cases := []struct {
		name    string
		args    []string
		mention string
	}{
		{"resource without a name", decide("--resource", "bifrost_query"), "--resource"},
		{"missing bundle folder", []string{"validate", "--bundle", missing}, "no-such-bundle"},
		{"missing bundle folder for decide", []string{"decide", "--bundle", missing, "--agent", "poc-agt-001", "--tool", "searxng_search"}, "no-such-bundle"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := runCLI(t, c.args...)
			if r.code != cli.ExitFailure {
				t.Errorf("exit %d, want 1\nstderr:\n%s", r.code, r.stderr)
			}
			lines := strings.Split(strings.TrimRight(r.stderr, "\n"), "\n")
			if len(lines) != 1 || !strings.Contains(lines[0], c.mention) {
				t.Errorf("stderr is not one line mentioning %q:\n%s", c.mention, r.stderr)
			}
			if r.stdout != "" {
				t.Errorf("stdout is not empty:\n%s", r.stdout)
			}
		})
	}
}

// TestUsageErrors checks that wrong flags or arguments exit 2 with one line
// on stderr and never a stack trace.
func TestUsageErrors(t *testing.T) {
	b := []string{"--bundle", exampleBundle}
	cases := []struct {
		name string
		args []string
	}{
		{"unknown command", []string{"frobnicate"}},
		{"unknown flag", append([]string{"decide", "--agent", "poc-agt-001", "--tool", "searxng_search", "--frobnicate"}, b...)},
		{"flag without its value", append([]string{"decide", "--agent", "poc-agt-001"}, append(b, "--tool")...)},
		{"unexpected argument", append([]string{"resolve", "--agent", "poc-agt-001", "extra"}, b...)},
		{"decide without --tool", append([]string{"decide", "--agent", "poc-agt-001"}, b...)},
		{"decide without --agent", append([]string{"decide", "--tool", "searxng_search"}, b...)},
		{"explain without --tool", append([]string{"explain", "--agent", "poc-agt-001"}, b...)},
		{"resolve without --agent", append([]string{"resolve"}, b...)},
		{"bad output format", append([]string{"validate", "-o", "yaml"}, b...)},
		{"bad output format for decide", append([]string{"decide", "--agent", "poc-agt-001", "--tool", "searxng_search", "-o", "xml"}, b...)},
		{"validate without --bundle", []string{"validate"}},
		{"resolve without --bundle", []string{"resolve", "--agent", "poc-agt-001"}},
		{"decide without --bundle", []string{"decide", "--agent", "poc-agt-001", "--tool", "searxng_search"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := runCLI(t, c.args...)
			if r.code != cli.ExitUsage {
				t.Errorf("exit %d, want 2\nstderr:\n%s", r.code, r.stderr)
			}
			if lines := strings.Split(strings.TrimRight(r.stderr, "\n"), "\n"); len(lines) != 1 || lines[0] == "" {
				t.Errorf("stderr is not one line (%d lines):\n%s", len(lines), r.stderr)
			}
			if r.stdout != "" {
				t.Errorf("stdout is not empty:\n%s", r.stdout)
			}
		})
	}
}

func TestHelpAndVersion(t *testing.T) {
	r := runCLI(t, "help")
	if r.code != cli.ExitOK || !strings.Contains(r.stdout, "validate") || !strings.Contains(r.stdout, "decide") {
		t.Errorf("help: exit %d\n%s", r.code, r.stdout)
	}
	r = runCLI(t)
	if r.code != cli.ExitUsage || !strings.Contains(r.stdout, "Usage: toolgate COMMAND") {
		t.Errorf("no arguments: exit %d, want 2 with the usage\n%s", r.code, r.stdout)
	}
	r = runCLI(t, "version")
	if r.code != cli.ExitOK || !strings.HasPrefix(r.stdout, "toolgate ") {
		t.Errorf("version: exit %d: %q", r.code, r.stdout)
	}
	r = runCLI(t, "decide", "-h")
	if r.code != cli.ExitOK || !strings.Contains(r.stderr, "-agent") {
		t.Errorf("decide -h: exit %d, want 0 with the flags\n%s", r.code, r.stderr)
	}
}

func TestBundleFromEnvironment(t *testing.T) {
	t.Setenv("TOOLGATE_BUNDLE", exampleBundle)
	var stdout, stderr bytes.Buffer
	code := cli.Run(context.Background(), []string{"decide", "--agent", "poc-agt-001", "--tool", "searxng_search"}, strings.NewReader(""), &stdout, &stderr)
	if code != cli.ExitOK {
		t.Errorf("exit %d, want 0 with the bundle from $TOOLGATE_BUNDLE\n%s", code, stderr.String())
	}
}
