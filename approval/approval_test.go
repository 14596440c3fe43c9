package approval

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestBindingDigest(t *testing.T) {
	b := Binding{Principal: "user:alice", AgentID: "agent-support", InstanceID: "acme",
		Environment: "production", ToolID: "tool:supabase-write", ArgsDigest: strings.Repeat("a", 64)}
	// Golden: the digest is stored with every approval; it must not change.
	// It is sha256 of {"agent_id":"agent-support","args_digest":"aaa…",
	// "environment":"production","instance_id":"acme",
	// "principal":"user:alice","tool_id":"tool:supabase-write"}.
	const want = "51977442a16b8b330fa5bd9c7bacb4e86794cce637f9b8f410c3528e675cbb10"
	got := b.Digest()
	if got != want {
		t.Errorf("Digest = %s; want %s", got, want)
	}
	changes := []struct {
		name   string
		change func(*Binding)
	}{
		{"principal", func(b *Binding) { b.Principal = "user:bob" }},
		{"agent", func(b *Binding) { b.AgentID = "agent-other" }},
		{"instance", func(b *Binding) { b.InstanceID = "" }},
		{"environment", func(b *Binding) { b.Environment = "staging" }},
		{"tool", func(b *Binding) { b.ToolID = "tool:supabase-read" }},
		{"args", func(b *Binding) { b.ArgsDigest = strings.Repeat("b", 64) }},
		// Moving text from one field to the next must not collide.
		{"boundary shift", func(b *Binding) { b.Principal, b.AgentID = "user:aliceagent", "-support" }},
	}
	for _, c := range changes {
		t.Run(c.name, func(t *testing.T) {
			x := b
			c.change(&x)
			if x.Digest() == got {
				t.Errorf("changing %s did not change the digest", c.name)
			}
		})
	}
}

func TestNewApproval(t *testing.T) {
	b := Binding{Principal: "p", AgentID: "a", ToolID: "tool:x-y", ArgsDigest: "d"}
	now := time.Date(2026, 1, 2, 3, 4, 5, 123456789, time.FixedZone("X", 3600))
	a, err := NewApproval(b, "p", now, 15*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(a.ID, "apr_") || len(a.ID) != 30 {
		t.Errorf("ID = %q; want apr_ and 26 characters", a.ID)
	}
	if a2, _ := NewApproval(b, "p", now, time.Minute); a2.ID == a.ID {
		t.Error("two approvals got the same id")
	}
	wantCreated := time.Date(2026, 1, 2, 2, 4, 5, 123456000, time.UTC)
	if !a.CreatedAt.Equal(wantCreated) || a.CreatedAt.Location() != time.UTC || !a.ExpiresAt.Equal(wantCreated.Add(15*time.Minute)) {
		t.Errorf("times = %v, %v; want %v (µs, UTC) and 15 min later", a.CreatedAt, a.ExpiresAt, wantCreated)
	}
	if a.Status != StatusPending || a.BindingDigest != b.Digest() || a.RequestedBy != "p" {
		t.Errorf("NewApproval = %+v", a)
	}
	for _, tt := range []struct {
		name string
		b    Binding
		ttl  time.Duration
	}{
		{"zero ttl", b, 0},
		{"negative ttl", b, -time.Second},
		{"no principal", Binding{AgentID: "a", ToolID: "t", ArgsDigest: "d"}, time.Minute},
		{"no tool", Binding{Principal: "p", AgentID: "a", ArgsDigest: "d"}, time.Minute},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := NewApproval(tt.b, "p", now, tt.ttl); !errors.Is(err, ErrInvalid) {
				t.Errorf("NewApproval = %v; want ErrInvalid", err)
			}
		})
	}
}

func TestUsable(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	a := Approval{Status: StatusApproved, ExpiresAt: now.Add(time.Second)}
	tests := []struct {
		name string
		a    func(Approval) Approval
		at   time.Time
		want bool
	}{
		{"approved, before expiry", func(a Approval) Approval { return a }, now, true},
		{"at expiry", func(a Approval) Approval { return a }, now.Add(time.Second), false},
		{"pending", func(a Approval) Approval { a.Status = StatusPending; return a }, now, false},
		{"used", func(a Approval) Approval { a.UsedAt = now; return a }, now, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.a(a).Usable(tt.at); got != tt.want {
				t.Errorf("Usable = %v; want %v", got, tt.want)
			}
		})
	}
}

func TestRequesterBindsTheDelegate(t *testing.T) {
	b := Binding{Principal: "user:owner", AgentID: "a", ToolID: "tool:x-y", ArgsDigest: "d"}
	d := b
	d.Requester = "svc:delegate"
	if b.Digest() == d.Digest() {
		t.Error("a delegate's binding has the delegator's digest: either could use the other's approval")
	}
	e := d
	e.Requester = "svc:other"
	if d.Digest() == e.Digest() {
		t.Error("two delegates share a binding digest")
	}
}
