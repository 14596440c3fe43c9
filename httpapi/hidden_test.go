package httpapi_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/toolgate/toolgate/approval"
	"github.com/toolgate/toolgate/authz"
	"github.com/toolgate/toolgate/httpapi"
	"github.com/toolgate/toolgate/metrics"
	"github.com/toolgate/toolgate/policy"
)

// TestHiddenButConditionallyAllowed: a Policy Guard that allows small
// refunds, escalates huge ones and denies the rest hides the tool (at the
// tool level, with no arguments, it is denied), so no call of it may be
// allowed, run or put up for approval through the JSON API either, and the
// answer is an unknown tool's whatever the arguments; a visible tool with
// malformed arguments keeps its real answer; /metrics counts hidden tools
// as unknown ones. (Found by a reviewer: the JSON API used to decide such a
// call with its arguments and allow it.)
func TestHiddenButConditionallyAllowed(t *testing.T) {
	t.Run("caller", func(t *testing.T) { hiddenButConditionallyAllowed(t, false) })
	// audit:read changes what the answer shows, never what is enforced.
	t.Run("caller holding audit:read", func(t *testing.T) { hiddenButConditionallyAllowed(t, true) })
}

func hiddenButConditionallyAllowed(t *testing.T, auditor bool) {
	dir := t.TempDir()
	ents, err := os.ReadDir(bundleDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, en := range ents {
		b, err := os.ReadFile(filepath.Join(bundleDir, en.Name()))
		if err != nil {
			continue
		}
		s := string(b)
		if en.Name() == "policies.yaml" {
			r := strings.Replace(s, "      effect: escalate\n      reason: larger refunds need a human",
				"      when: 'args.amount > 200'\n      effect: escalate\n      reason: huge refunds need a human\n    - tools: [tool:payments-refund]\n      effect: deny\n      reason: no mid refunds", 1)
			if r == s {
				t.Fatal("policies.yaml changed; update the test's rewrite")
			}
			s = r
		}
		if auditor && en.Name() == "principals.yaml" {
			r := strings.Replace(s, "  roles: [maintainer]\n", "  roles: [maintainer]\n  grants:\n    - {resource: audit, action: read, scope: all}\n", 1)
			if r == s {
				t.Fatal("principals.yaml changed; update the test's rewrite")
			}
			s = r
		}
		os.WriteFile(filepath.Join(dir, en.Name()), []byte(s), 0o644)
	}
	b, err := policy.LoadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	snap, _, err := authz.Compile(b, nil)
	if err != nil {
		t.Fatal(err)
	}
	e := newEnvFor(t, snap, func(o *httpapi.Options) { o.Identify = identify })
	g, st := e.g, e.store
	if g.Disclose(tokens["bob"]).Disclosed["tool:payments-refund"] {
		t.Fatal("the rewritten guard should hide payments-refund from bob")
	}
	unknown := func(path, tool string, args map[string]any) (int, string) {
		t.Helper()
		body := map[string]any{"tool": tool, "args": args}
		if path == "/v1/tools/call" {
			body = map[string]any{"tool": tool, "arguments": args}
		}
		r := e.do("POST", path, "bob", body)
		var v struct {
			Decision httpapi.DecisionResponse `json:"decision"`
		}
		json.Unmarshal(r.body, &v)
		return r.status, v.Decision.Code + "|" + v.Decision.ToolID + "|" + strings.ReplaceAll(v.Decision.Reason, tool, "T")
	}
	for _, path := range []string{"/v1/decide", "/v1/tools/call"} {
		ws, want := unknown(path, "no_such_tool", map[string]any{"amount": 10})
		for _, amt := range []int{10, 100, 300} {
			s, got := unknown(path, "payments_refund", map[string]any{"amount": amt})
			switch {
			case !auditor && (s != ws || got != want):
				t.Errorf("%s amount %d: %d %s; want %d %s (an unknown tool's answer)", path, amt, s, got, ws, want)
			case auditor && (s != 403 || strings.HasPrefix(got, "|") || got == want):
				t.Errorf("%s amount %d (auditor): %d %s; want a 403 refusal showing the real decision", path, amt, s, got)
			}
		}
	}
	pending, err := st.ListApprovals(context.Background(), approval.Filter{Status: []approval.Status{approval.StatusPending}})
	if err != nil {
		t.Fatal(err)
	}
	if len(pending) != 0 {
		t.Errorf("%d approvals created for a hidden tool", len(pending))
	}
	// A visible tool with malformed arguments keeps its real answer.
	visible := g.Disclose(tokens["bob"]).Resolution.Disclosed[0]
	r := e.do("POST", "/v1/decide", "bob", map[string]any{"tool": visible, "args": []int{1}})
	if d := decode[httpapi.Envelope](t, r).Decision; d.Code != "malformed_call" {
		t.Errorf("malformed arguments to visible %s: %+v", visible, d)
	}
	if auditor {
		return
	}
	// /metrics: the hidden tool's calls count as unknown_tool.
	mr := e.do("GET", "/metrics", "", nil)
	for _, line := range strings.Split(string(mr.body), "\n") {
		if strings.HasPrefix(line, metrics.DecisionsTotal) && (strings.Contains(line, "policy_guard") || strings.Contains(line, `verdict="allow"`) || strings.Contains(line, "approval_required")) {
			t.Errorf("metrics name the hidden tool's real decision: %s", line)
		}
	}
}
