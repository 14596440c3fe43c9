package storetest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/toolgate/toolgate/approval"
)

// ApprovalHarness is what RunApprovals needs from a backend.
type ApprovalHarness struct {
	// Store is a store over a fresh, empty database.
	Store approval.Store
	// Open opens another store on the same database, as another process
	// or replica would.
	Open func(t *testing.T) approval.Store
	// SharedListen is true when a change made through one store reaches
	// the listeners of another store opened by Open (PostgreSQL
	// LISTEN/NOTIFY); false when listeners hear only their own store.
	SharedListen bool
}

func binding(i int) approval.Binding {
	return approval.Binding{
		Principal:   "user:alice",
		AgentID:     "agent-support",
		InstanceID:  "acme",
		Environment: "production",
		ToolID:      "tool:supabase-write",
		ArgsDigest:  fmt.Sprintf("%064x", i),
	}
}

// newApproval makes a pending approval created at base+offset, living ttl.
func newApproval(t *testing.T, b approval.Binding, offset, ttl time.Duration) approval.Approval {
	t.Helper()
	a, err := approval.NewApproval(b, b.Principal, base.Add(offset), ttl)
	if err != nil {
		t.Fatal(err)
	}
	a.CorrelationID = "corr-ask"
	a.ToolName = "supabase_write"
	a.AgentVersion = "3"
	a.Args = json.RawMessage(`{"table":"tickets"}`)
	return a
}

func mustCreate(t *testing.T, s approval.Store, a approval.Approval) {
	t.Helper()
	if err := s.CreateApproval(context.Background(), a); err != nil {
		t.Fatalf("CreateApproval: %v", err)
	}
}

func mustGet(t *testing.T, s approval.Store, id string) approval.Approval {
	t.Helper()
	a, err := s.GetApproval(context.Background(), id)
	if err != nil {
		t.Fatalf("GetApproval(%s): %v", id, err)
	}
	return a
}

func ids(as []approval.Approval) []string {
	out := []string{}
	for _, a := range as {
		out = append(out, a.ID)
	}
	return out
}

// RunApprovals runs the approval.Store contract. newHarness must return a
// harness over a fresh database for every call.
func RunApprovals(t *testing.T, newHarness func(t *testing.T) *ApprovalHarness) {
	ctx := context.Background()

	t.Run("CreateGet", func(t *testing.T) {
		s := newHarness(t).Store
		a := newApproval(t, binding(1), 0, time.Hour)
		mustCreate(t, s, a)
		if diff := cmp.Diff(a, mustGet(t, s, a.ID)); diff != "" {
			t.Errorf("Get after Create (-want +got):\n%s", diff)
		}
		// A record with every field set round-trips too.
		full := newApproval(t, binding(2), time.Second, time.Hour)
		full.Status = approval.StatusUsed
		full.DecidedBy, full.DecidedAt, full.Reason = "user:bob", base.Add(2*time.Second), "looks fine"
		full.UsedAt, full.UsedCorrelationID = base.Add(3*time.Second), "corr-use"
		mustCreate(t, s, full)
		if diff := cmp.Diff(full, mustGet(t, s, full.ID)); diff != "" {
			t.Errorf("Get of a full record (-want +got):\n%s", diff)
		}
	})

	t.Run("CreateErrors", func(t *testing.T) {
		s := newHarness(t).Store
		a := newApproval(t, binding(1), 0, time.Hour)
		mustCreate(t, s, a)
		bad := newApproval(t, binding(2), 0, time.Hour)
		bad.BindingDigest = binding(3).Digest()
		noExpiry := newApproval(t, binding(2), 0, time.Hour)
		noExpiry.ExpiresAt = noExpiry.CreatedAt
		tests := []struct {
			name string
			a    approval.Approval
			want error
		}{
			{"duplicate id", a, approval.ErrExists},
			{"digest mismatch", bad, approval.ErrInvalid},
			{"expires at creation", noExpiry, approval.ErrInvalid},
			{"empty id", approval.Approval{}, approval.ErrInvalid},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				if err := s.CreateApproval(ctx, tt.a); !errors.Is(err, tt.want) {
					t.Errorf("CreateApproval = %v; want %v", err, tt.want)
				}
			})
		}
		if _, err := s.GetApproval(ctx, "apr_missing"); !errors.Is(err, approval.ErrNotFound) {
			t.Errorf("GetApproval(missing) = %v; want ErrNotFound", err)
		}
	})

	t.Run("List", func(t *testing.T) {
		s := newHarness(t).Store
		var all []approval.Approval
		for i := range 4 {
			a := newApproval(t, binding(i%2), time.Duration(3-i)*time.Second, time.Hour)
			mustCreate(t, s, a)
			all = append(all, a)
		}
		if _, err := s.DecideApproval(ctx, all[0].ID, true, "user:bob", "", base.Add(time.Minute)); err != nil {
			t.Fatal(err)
		}
		if _, err := s.DecideApproval(ctx, all[1].ID, false, "user:bob", "no", base.Add(time.Minute)); err != nil {
			t.Fatal(err)
		}
		tests := []struct {
			name string
			f    approval.Filter
			want []string
		}{
			{"all oldest first", approval.Filter{}, []string{all[3].ID, all[2].ID, all[1].ID, all[0].ID}},
			{"pending", approval.Filter{Status: []approval.Status{approval.StatusPending}}, []string{all[3].ID, all[2].ID}},
			{"approved or denied", approval.Filter{Status: []approval.Status{approval.StatusApproved, approval.StatusDenied}}, []string{all[1].ID, all[0].ID}},
			{"binding", approval.Filter{BindingDigest: binding(0).Digest()}, []string{all[2].ID, all[0].ID}},
			{"limit", approval.Filter{Limit: 1}, []string{all[3].ID}},
			{"none", approval.Filter{Status: []approval.Status{approval.StatusUsed}}, []string{}},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				got, err := s.ListApprovals(ctx, tt.f)
				if err != nil {
					t.Fatal(err)
				}
				if diff := cmp.Diff(tt.want, ids(got)); diff != "" {
					t.Errorf("ListApprovals (-want +got):\n%s", diff)
				}
			})
		}
	})

	t.Run("Decide", func(t *testing.T) {
		s := newHarness(t).Store
		at := base.Add(10 * time.Minute)
		tests := []struct {
			name    string
			prepare func(a approval.Approval) approval.Approval // what is stored
			approve bool
			by      string
			now     time.Time
			want    func(a approval.Approval) approval.Approval // stored afterwards
			wantErr error
		}{
			{
				name:    "approve",
				approve: true, by: "user:bob", now: at,
				want: func(a approval.Approval) approval.Approval {
					a.Status, a.DecidedBy, a.DecidedAt, a.Reason = approval.StatusApproved, "user:bob", at, "reason"
					return a
				},
			},
			{
				name:    "deny",
				approve: false, by: "user:bob", now: at,
				want: func(a approval.Approval) approval.Approval {
					a.Status, a.DecidedBy, a.DecidedAt, a.Reason = approval.StatusDenied, "user:bob", at, "reason"
					return a
				},
			},
			{
				name:    "expired at decision time",
				approve: true, by: "user:bob", now: base.Add(time.Hour),
				want: func(a approval.Approval) approval.Approval {
					a.Status, a.Reason = approval.StatusExpired, "expired before it was decided"
					return a
				},
				wantErr: approval.ErrExpired,
			},
			{
				name: "already decided",
				prepare: func(a approval.Approval) approval.Approval {
					a.Status, a.DecidedBy, a.DecidedAt = approval.StatusDenied, "user:carol", base.Add(time.Second)
					return a
				},
				approve: true, by: "user:bob", now: at,
				wantErr: approval.ErrNotPending,
			},
			{
				name: "already used",
				prepare: func(a approval.Approval) approval.Approval {
					a.Status, a.UsedAt = approval.StatusUsed, base.Add(time.Second)
					return a
				},
				approve: true, by: "user:bob", now: at,
				wantErr: approval.ErrNotPending,
			},
			{
				name: "already expired",
				prepare: func(a approval.Approval) approval.Approval {
					a.Status = approval.StatusExpired
					return a
				},
				approve: true, by: "user:bob", now: at,
				wantErr: approval.ErrExpired,
			},
			{
				name:    "no decider",
				approve: true, by: "", now: at,
				wantErr: approval.ErrInvalid,
			},
		}
		for i, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				a := newApproval(t, binding(100+i), 0, time.Hour)
				if tt.prepare != nil {
					a = tt.prepare(a)
				}
				mustCreate(t, s, a)
				want := a
				if tt.want != nil {
					want = tt.want(a)
				}
				got, err := s.DecideApproval(ctx, a.ID, tt.approve, tt.by, "reason", tt.now)
				if !errors.Is(err, tt.wantErr) {
					t.Errorf("DecideApproval error = %v; want %v", err, tt.wantErr)
				}
				if tt.wantErr == nil || errors.Is(tt.wantErr, approval.ErrExpired) || errors.Is(tt.wantErr, approval.ErrNotPending) {
					if diff := cmp.Diff(want, got); diff != "" {
						t.Errorf("returned record (-want +got):\n%s", diff)
					}
				}
				if diff := cmp.Diff(want, mustGet(t, s, a.ID)); diff != "" {
					t.Errorf("stored record (-want +got):\n%s", diff)
				}
			})
		}
		if _, err := s.DecideApproval(ctx, "apr_missing", true, "user:bob", "", at); !errors.Is(err, approval.ErrNotFound) {
			t.Errorf("DecideApproval(missing) = %v; want ErrNotFound", err)
		}
	})

	t.Run("Consume", func(t *testing.T) {
		s := newHarness(t).Store
		approved := func(i int, offset, ttl time.Duration) approval.Approval {
			a := newApproval(t, binding(i), offset, ttl)
			mustCreate(t, s, a)
			d, err := s.DecideApproval(ctx, a.ID, true, "user:bob", "ok", base.Add(offset+time.Second))
			if err != nil {
				t.Fatal(err)
			}
			return d
		}
		at := base.Add(time.Minute)
		// Binding 1: two approvals; the one expiring first is used first.
		later := approved(1, 0, 2*time.Hour)
		sooner := approved(1, time.Second, time.Hour)
		// Binding 2: pending only. Binding 3: denied. Binding 4: expired.
		mustCreate(t, s, newApproval(t, binding(2), 0, time.Hour))
		denied := newApproval(t, binding(3), 0, time.Hour)
		mustCreate(t, s, denied)
		if _, err := s.DecideApproval(ctx, denied.ID, false, "user:bob", "", base.Add(time.Second)); err != nil {
			t.Fatal(err)
		}
		expired := approved(4, 0, 30*time.Second)

		steps := []struct {
			name    string
			binding approval.Binding
			now     time.Time
			wantID  string // "" = none
		}{
			{"first use takes the one expiring first", binding(1), at, sooner.ID},
			{"second use takes the other", binding(1), at, later.ID},
			{"third use finds none", binding(1), at, ""},
			{"pending is not usable", binding(2), at, ""},
			{"denied is not usable", binding(3), at, ""},
			{"expired is not usable", binding(4), expired.ExpiresAt, ""},
			{"unknown binding", binding(99), at, ""},
		}
		for _, st := range steps {
			got, ok, err := s.ConsumeApproval(ctx, st.binding.Digest(), st.now, "corr-"+st.name)
			if err != nil {
				t.Fatalf("%s: %v", st.name, err)
			}
			if st.wantID == "" {
				if ok {
					t.Errorf("%s: consumed %s; want none", st.name, got.ID)
				}
				continue
			}
			if !ok || got.ID != st.wantID {
				t.Errorf("%s: got %q, %v; want %q", st.name, got.ID, ok, st.wantID)
				continue
			}
			want := mustGet(t, s, st.wantID)
			if want.Status != approval.StatusUsed || !want.UsedAt.Equal(st.now) || want.UsedCorrelationID != "corr-"+st.name {
				t.Errorf("%s: stored %+v; want used at %v by corr-%s", st.name, want, st.now, st.name)
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("%s: returned record differs from stored (-want +got):\n%s", st.name, diff)
			}
		}
	})

	t.Run("ConsumeRace", func(t *testing.T) {
		h := newHarness(t)
		stores := []approval.Store{h.Store, h.Open(t)}
		const rounds, consumers = 5, 8
		for r := range rounds {
			a := newApproval(t, binding(500+r), 0, time.Hour)
			mustCreate(t, h.Store, a)
			if _, err := h.Store.DecideApproval(ctx, a.ID, true, "user:bob", "", base.Add(time.Second)); err != nil {
				t.Fatal(err)
			}
			var wins atomic.Int32
			var wg sync.WaitGroup
			start := make(chan struct{})
			for c := range consumers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					_, ok, err := stores[c%2].ConsumeApproval(ctx, a.BindingDigest, base.Add(time.Minute), fmt.Sprintf("corr-%d", c))
					if err != nil {
						t.Errorf("consumer %d: %v", c, err)
					}
					if ok {
						wins.Add(1)
					}
				}()
			}
			close(start)
			wg.Wait()
			if n := wins.Load(); n != 1 {
				t.Errorf("round %d: %d consumers won; want exactly 1", r, n)
			}
		}
	})

	t.Run("Expire", func(t *testing.T) {
		s := newHarness(t).Store
		pendingOld := newApproval(t, binding(1), 0, time.Minute)
		pendingNew := newApproval(t, binding(2), 0, time.Hour)
		approvedOld := newApproval(t, binding(3), time.Second, time.Minute)
		usedOld := newApproval(t, binding(4), 2*time.Second, time.Minute)
		for _, a := range []approval.Approval{pendingOld, pendingNew, approvedOld, usedOld} {
			mustCreate(t, s, a)
		}
		var err error
		if approvedOld, err = s.DecideApproval(ctx, approvedOld.ID, true, "user:bob", "fine", base.Add(5*time.Second)); err != nil {
			t.Fatal(err)
		}
		if _, err := s.DecideApproval(ctx, usedOld.ID, true, "user:bob", "", base.Add(5*time.Second)); err != nil {
			t.Fatal(err)
		}
		if _, ok, err := s.ConsumeApproval(ctx, usedOld.BindingDigest, base.Add(6*time.Second), "corr"); err != nil || !ok {
			t.Fatalf("consume: %v %v", ok, err)
		}
		now := base.Add(time.Minute + time.Second) // exactly approvedOld's expiry
		got, err := s.ExpireApprovals(ctx, now)
		if err != nil {
			t.Fatal(err)
		}
		pendingOld.Status, pendingOld.Reason = approval.StatusExpired, "expired before it was decided"
		approvedOld.Status = approval.StatusExpired
		want := []approval.Approval{pendingOld, approvedOld}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("ExpireApprovals (-want +got):\n%s", diff)
		}
		for _, a := range want {
			if diff := cmp.Diff(a, mustGet(t, s, a.ID)); diff != "" {
				t.Errorf("stored %s (-want +got):\n%s", a.ID, diff)
			}
		}
		if st := mustGet(t, s, pendingNew.ID).Status; st != approval.StatusPending {
			t.Errorf("unexpired approval is %s; want pending", st)
		}
		if st := mustGet(t, s, usedOld.ID).Status; st != approval.StatusUsed {
			t.Errorf("used approval is %s; want used", st)
		}
		again, err := s.ExpireApprovals(ctx, now)
		if err != nil || len(again) != 0 {
			t.Errorf("second ExpireApprovals = %v, %v; want none", ids(again), err)
		}
	})

	t.Run("Listen", func(t *testing.T) {
		h := newHarness(t)
		listener, ok := h.Store.(approval.Listener)
		if !ok {
			t.Skip("store does not implement approval.Listener")
		}
		writer := h.Store
		if h.SharedListen {
			writer = h.Open(t)
		}
		a := newApproval(t, binding(1), 0, time.Hour)
		mustCreate(t, writer, a)

		lctx, cancel := context.WithCancel(ctx)
		defer cancel()
		ready := make(chan struct{})
		got := make(chan approval.Approval, 10)
		done := make(chan error, 1)
		go func() {
			done <- listener.ListenApprovals(lctx, func() { close(ready) }, func(a approval.Approval) { got <- a })
		}()
		select {
		case <-ready:
		case err := <-done:
			t.Fatalf("ListenApprovals ended before ready: %v", err)
		}
		decided, err := writer.DecideApproval(ctx, a.ID, true, "user:bob", "ok", base.Add(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(decided, <-got); diff != "" {
			t.Errorf("listener got (-want +got):\n%s", diff)
		}
		used, ok, err := writer.ConsumeApproval(ctx, a.BindingDigest, base.Add(2*time.Second), "corr-use")
		if err != nil || !ok {
			t.Fatalf("consume: %v %v", ok, err)
		}
		if diff := cmp.Diff(used, <-got); diff != "" {
			t.Errorf("listener got after consume (-want +got):\n%s", diff)
		}
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("ListenApprovals returned %v; want context.Canceled", err)
		}
	})
}
