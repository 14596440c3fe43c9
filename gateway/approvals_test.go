package gateway_test

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolgate/toolgate/approval"

	"github.com/toolgate/toolgate/audit"
	"github.com/toolgate/toolgate/gate"
)

// TestGatewayApprovals: an approved call runs once; changed arguments need a
// new approval; a second identical call needs approval again; the requester
// cannot approve its own call; the audit log links the execution to the
// approval it used.
func TestGatewayApprovals(t *testing.T) {
	g, ws := exampleGateway(t)
	dev := connect(t, g.url, devKey)
	listNames(t, dev, 6)
	ctx := context.Background()
	target := filepath.Join(ws, "approved.txt")
	args := map[string]any{"path": target, "content": "approved content"}

	res, err := call(t, dev, "fs_write_file", args)
	if err != nil || !res.IsError {
		t.Fatalf("first call: %v %v", err, res)
	}
	id, _ := structured(t, res)["approval_id"].(string)
	if id == "" {
		t.Fatalf("no approval id in %v", res.StructuredContent)
	}

	if _, err := g.gw.Gate.DecideApproval(ctx, id, true, "user:dev", "self", "test"); !errors.Is(err, gate.ErrSelfApproval) {
		t.Fatalf("self-approval: got %v, want ErrSelfApproval", err)
	}
	if _, err := g.gw.Gate.DecideApproval(ctx, id, true, "user:viewer", "", "test"); !errors.Is(err, gate.ErrNotApprover) {
		t.Fatalf("approval by a principal without approval:decide: got %v", err)
	}
	if _, err := g.gw.Gate.DecideApproval(ctx, id, true, "user:lead", "looks fine", "test"); err != nil {
		t.Fatalf("approve: %v", err)
	}

	// One argument changed: still needs its own approval.
	changed := map[string]any{"path": target, "content": "something else"}
	if res, err := call(t, dev, "fs_write_file", changed); err != nil || !res.IsError || structured(t, res)["code"] != "approval_required" {
		t.Fatalf("changed args: %v %v", err, res)
	}
	if _, err := os.Stat(target); err == nil {
		t.Fatal("the changed call wrote the file")
	}

	// The approved call, with the keys in another order, runs once.
	same := map[string]any{"content": "approved content", "path": target}
	res, err = call(t, dev, "fs_write_file", same)
	if err != nil || res.IsError {
		t.Fatalf("approved call: %v %v", err, text(res))
	}
	data, err := os.ReadFile(target)
	if err != nil || string(data) != "approved content" {
		t.Fatalf("file: %q %v", data, err)
	}
	// A second identical call needs approval again.
	if res, err := call(t, dev, "fs_write_file", same); err != nil || !res.IsError || structured(t, res)["code"] != "approval_required" {
		t.Fatalf("second call: %v %v", err, res)
	}

	g.gw.Rec.Flush(ctx)
	evs, _ := audit.ReadEvents(ctx, g.gw.Store, 1, 10000)
	var granted, authorized, completed bool
	for _, e := range evs {
		switch {
		case e.EventType == "agent.tool.approval_granted" && e.ApprovalID == id:
			granted = true
		case e.EventType == "agent.tool.authorized" && e.ApprovalID == id:
			authorized = true
		case e.EventType == "agent.tool.completed" && e.ApprovalID == id:
			completed = true
		}
	}
	if !granted || !authorized || !completed {
		t.Errorf("audit links: granted %v authorized %v completed %v", granted, authorized, completed)
	}
	if rep, err := audit.Verify(ctx, g.gw.Store); err != nil || !rep.OK {
		t.Fatalf("verify: %+v %v", rep, err)
	}
}

// TestApprovalExpiry: an expired approval denies (the call needs a new one).
func TestApprovalExpiry(t *testing.T) {
	g, ws := exampleGateway(t)
	dev := connect(t, g.url, devKey)
	listNames(t, dev, 6)
	ctx := context.Background()
	args := map[string]any{"path": filepath.Join(ws, "late.txt"), "content": "x"}
	res, _ := call(t, dev, "fs_write_file", args)
	id, _ := structured(t, res)["approval_id"].(string)
	if _, err := g.gw.Gate.DecideApproval(ctx, id, true, "user:lead", "", "test"); err != nil {
		t.Fatal(err)
	}
	// Expire it in the store as if its TTL had passed.
	a, _ := g.gw.Store.GetApproval(ctx, id)
	if _, err := g.gw.Store.ExpireApprovals(ctx, a.ExpiresAt.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	res, err := call(t, dev, "fs_write_file", args)
	if err != nil || !res.IsError || structured(t, res)["code"] != "approval_required" {
		t.Fatalf("after expiry: %v %v", err, res)
	}
	if _, err := os.Stat(filepath.Join(ws, "late.txt")); err == nil {
		t.Fatal("an expired approval let the call run")
	}
}

// TestApprovalWait: with Settings.approval_wait the proxy holds the call,
// sends progress while it waits, and runs it once it is approved.
func TestApprovalWait(t *testing.T) {
	g, ws := exampleGatewayEdited(t, func(name, s string) string {
		if name == "settings.yaml" {
			return strings.Replace(s, "approval_ttl: 15m", "approval_ttl: 15m\n  approval_wait: 20s", 1)
		}
		return s
	})
	progress := make(chan string, 16)
	c := mcp.NewClient(&mcp.Implementation{Name: "wait", Version: "1"}, &mcp.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, r *mcp.ProgressNotificationClientRequest) {
			select {
			case progress <- r.Params.Message:
			default:
			}
		}})
	ctx := context.Background()
	cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: g.url,
		HTTPClient: &http.Client{Transport: bearer{key: devKey, base: http.DefaultTransport}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	listNames(t, cs, 6)
	target := filepath.Join(ws, "held.txt")
	type res struct {
		r   *mcp.CallToolResult
		err error
	}
	done := make(chan res, 1)
	go func() {
		params := &mcp.CallToolParams{Name: "fs_write_file", Arguments: map[string]any{"path": target, "content": "held"}}
		params.SetProgressToken("wait-1")
		r, err := cs.CallTool(ctx, params)
		done <- res{r, err}
	}()
	// Wait for the pending approval, then approve it as user:lead.
	var id string
	for i := 0; i < 200 && id == ""; i++ {
		pending, _ := g.gw.Store.ListApprovals(ctx, approval.Filter{Status: []approval.Status{approval.StatusPending}})
		if len(pending) > 0 {
			id = pending[0].ID
		}
		time.Sleep(50 * time.Millisecond)
	}
	if id == "" {
		t.Fatal("no pending approval appeared")
	}
	select {
	case msg := <-progress:
		if !strings.Contains(msg, id) {
			t.Errorf("progress %q does not name the approval", msg)
		}
	case <-time.After(10 * time.Second):
		t.Error("no progress notification while waiting")
	}
	if _, err := g.gw.Gate.DecideApproval(ctx, id, true, "user:lead", "ok", "test"); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-done:
		if r.err != nil || r.r.IsError {
			t.Fatalf("held call: %v %v", r.err, r.r)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the held call did not finish after approval")
	}
	if data, err := os.ReadFile(target); err != nil || string(data) != "held" {
		t.Fatalf("file %q %v", data, err)
	}
}
