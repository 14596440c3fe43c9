package mcpproxy

import (
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolgate/toolgate/audit"
	"github.com/toolgate/toolgate/internal/testenv"
	"github.com/toolgate/toolgate/store/sqlite"
)

// accessBundleFor is the everything-server at url behind an agent whose
// resource and prompt ceilings are declared: one exact resource, one
// template that needs a human, one prompt. The principal holds read and
// get on the whole upstream; approver decides approvals.
func accessBundleFor(url string) string {
	return agentBundle(evUpstream(url), []string{"test_simple_text"}, `  resource_permissions:
    - {upstream: ev, uri: "test://static-text"}
    - {upstream: ev, uri: "test://template/{id}/data", approval_tier: hitl}
  prompt_permissions:
    - {upstream: ev, prompt: test_prompt_with_arguments}
`) + `
- kind: Principal
  principal_id: approver
  grants: [{resource: approval, action: decide, scope: all}]
`
}

// TestAccessesThroughTheGate: with declared resource and prompt ceilings,
// the lists show exactly what the ceiling and the grants admit; a read or
// get outside them is answered as if it did not exist and never reaches
// the upstream; a hitl template needs an approval bound to that URI, and
// is read once after it; every request is one decision record (and an
// allowed one its completion).
func TestAccessesThroughTheGate(t *testing.T) {
	ctx := context.Background()
	st, err := sqlite.Open(filepath.Join(t.TempDir(), "toolgate.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	rec := audit.NewRecorder(st, nil)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		rec.Close(ctx)
		st.Close()
	})
	ev := testenv.StartEverythingServer(t, "")
	bundle := strings.Replace(accessBundleFor(ev.URL), "grants: [{resource: tool, action: invoke, scope: all}]",
		"grants:\n    - {resource: tool, action: invoke, scope: all}\n    - {resource: mcp_resource, action: read, scope: {upstream: ev}}\n    - {resource: prompt, action: get, scope: {upstream: ev}}", 1)
	url, p := serveProxyEnv(t, bundle, proxyEnv{rec: rec, approvals: st})
	gw := connectClient(t, url, testKeys[0], declare{}).cs

	waitFor(t, "the mirrored resources and prompts", func() bool { return len(resourceURIs(t, gw)) > 0 && len(promptNames(t, gw)) > 0 })
	if diff := cmp.Diff([]string{"test://static-text"}, resourceURIs(t, gw)); diff != "" {
		t.Errorf("resources/list (-want +got):\n%s", diff)
	}
	tl, err := gw.ListResourceTemplates(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var tmpls []string
	for _, x := range tl.ResourceTemplates {
		tmpls = append(tmpls, x.URITemplate)
	}
	if diff := cmp.Diff([]string{"test://template/{id}/data"}, tmpls); diff != "" {
		t.Errorf("resources/templates/list (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"test_prompt_with_arguments"}, promptNames(t, gw)); diff != "" {
		t.Errorf("prompts/list (-want +got):\n%s", diff)
	}

	before := countEvents(t, rec, st)
	if text, err := readText(gw, "test://static-text"); err != nil || text == "" {
		t.Errorf("read test://static-text: %q, %v", text, err)
	}
	for _, uri := range []string{"test://static-binary", "test://watched-resource", "test://nope"} {
		if _, err := gw.ReadResource(ctx, &mcp.ReadResourceParams{URI: uri}); rpcCode(err) != mcp.CodeResourceNotFound {
			t.Errorf("read %s outside the ceiling: %v, want Resource not found", uri, err)
		}
	}
	if _, err := gw.GetPrompt(ctx, &mcp.GetPromptParams{Name: "test_simple_prompt"}); err == nil || !strings.Contains(err.Error(), "unknown prompt") {
		t.Errorf("get test_simple_prompt outside the ceiling: %v, want unknown prompt", err)
	}
	if res, err := gw.GetPrompt(ctx, &mcp.GetPromptParams{Name: "test_prompt_with_arguments", Arguments: map[string]string{"arg1": "a", "arg2": "b"}}); err != nil || len(res.Messages) == 0 {
		t.Errorf("get test_prompt_with_arguments: %v, %v", res, err)
	}
	if _, err := gw.Complete(ctx, &mcp.CompleteParams{Ref: &mcp.CompleteReference{Type: "ref/prompt", Name: "test_simple_prompt"},
		Argument: mcp.CompleteParamsArgument{Name: "x", Value: "y"}}); err == nil || !strings.Contains(err.Error(), "unknown prompt") {
		t.Errorf("complete test_simple_prompt outside the ceiling: %v, want unknown prompt", err)
	}

	// The hitl template: refused with a pending approval, named.
	_, err = gw.ReadResource(ctx, &mcp.ReadResourceParams{URI: "test://template/42/data"})
	var rpcErr *jsonrpc.Error
	if !errors.As(err, &rpcErr) || rpcErr.Code != AccessRefusedCode {
		t.Fatalf("read test://template/42/data: %v, want an AccessRefusedCode error", err)
	}
	var data struct {
		Verdict, Code, Layer, Target string
		ApprovalID                   string `json:"approval_id"`
	}
	if err := json.Unmarshal(rpcErr.Data, &data); err != nil || data.Verdict != "require_approval" || data.Layer != "approval" || data.ApprovalID == "" {
		t.Fatalf("refusal data %s (%v)", rpcErr.Data, err)
	}
	if _, err := p.g.DecideApproval(ctx, data.ApprovalID, true, "approver", "ok", "test"); err != nil {
		t.Fatal(err)
	}
	if _, err := gw.ReadResource(ctx, &mcp.ReadResourceParams{URI: "test://template/7/data"}); rpcCode(err) != AccessRefusedCode {
		t.Errorf("read of another URI of the template after the approval: %v, want its own approval", err)
	}
	if res, err := gw.ReadResource(ctx, &mcp.ReadResourceParams{URI: "test://template/42/data"}); err != nil || len(res.Contents) == 0 {
		t.Errorf("the approved read: %v, %v", res, err)
	}
	if _, err := gw.ReadResource(ctx, &mcp.ReadResourceParams{URI: "test://template/42/data"}); rpcCode(err) != AccessRefusedCode {
		t.Errorf("the approved read once more: %v, want a new approval (one approval, one read)", err)
	}

	// Every request above is recorded: 1 allowed read (+1 completion), 3
	// hidden reads, 1 hidden prompt, 1 allowed prompt (+1), 1 hidden
	// completion, 2 reads needing approval, 1 approval granted, 1 approved
	// read (+1), 1 read needing approval.
	evs := eventsSince(t, rec, st, before)
	var kinds []string
	for _, e := range evs {
		if e.Details["access"] == nil {
			kinds = append(kinds, e.EventType)
			continue
		}
		kinds = append(kinds, e.EventType+" "+e.Details["access"].(string)+" "+e.ToolName)
	}
	want := []string{
		"agent.tool.authorized resource_read test://static-text",
		"agent.tool.completed resource_read test://static-text",
		"agent.tool.unauthorized resource_read test://static-binary",
		"agent.tool.unauthorized resource_read test://watched-resource",
		"agent.tool.unauthorized resource_read test://nope",
		"agent.tool.unauthorized prompt_get test_simple_prompt",
		"agent.tool.authorized prompt_get test_prompt_with_arguments",
		"agent.tool.completed prompt_get test_prompt_with_arguments",
		"agent.tool.unauthorized prompt_complete test_simple_prompt",
		"agent.tool.approval_requested resource_read test://template/42/data",
		"agent.tool.approval_granted",
		"agent.tool.approval_requested resource_read test://template/7/data",
		"agent.tool.authorized resource_read test://template/42/data",
		"agent.tool.completed resource_read test://template/42/data",
		"agent.tool.approval_requested resource_read test://template/42/data",
	}
	if diff := cmp.Diff(want, kinds); diff != "" {
		t.Errorf("audit records (-want +got):\n%s", diff)
	}
}

func countEvents(t *testing.T, rec *audit.Recorder, st *sqlite.Store) int {
	return len(eventsSince(t, rec, st, 0))
}

// eventsSince returns the committed events after the first n.
func eventsSince(t *testing.T, rec *audit.Recorder, st *sqlite.Store, n int) []audit.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := rec.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	all, err := audit.ReadEvents(ctx, st, 1, 100_000)
	if err != nil {
		t.Fatal(err)
	}
	// Lists and the gateway's own events are not part of what a test
	// counts.
	all = slices.DeleteFunc(all, func(e audit.Event) bool { return strings.HasPrefix(e.EventType, "gateway.") })
	if n > len(all) {
		return nil
	}
	return all[n:]
}
