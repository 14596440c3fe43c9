package postgres_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"

	"github.com/toolgate/toolgate/approval"
	"github.com/toolgate/toolgate/audit"
	"github.com/toolgate/toolgate/store/postgres"
	"github.com/toolgate/toolgate/storetest"
)

// dsn returns the test database's DSN: TOOLGATE_PG_DSN, or the local
// default. TOOLGATE_PG_DSN=off skips the tests; otherwise an unreachable
// server fails them.
func dsn(t *testing.T) string {
	t.Helper()
	d := os.Getenv("TOOLGATE_PG_DSN")
	if d == "off" {
		t.Skip("TOOLGATE_PG_DSN=off")
	}
	if d == "" {
		d = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	}
	return d
}

// testSchema returns a new schema name and drops the schema when the test
// ends.
func testSchema(t *testing.T) string {
	t.Helper()
	b := make([]byte, 6)
	rand.Read(b)
	name := "tg_test_" + hex.EncodeToString(b)
	conn := rawConn(t)
	t.Cleanup(func() {
		if _, err := conn.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+name+" CASCADE"); err != nil {
			t.Errorf("drop schema %s: %v", name, err)
		}
	})
	return name
}

// rawConn connects directly, bypassing any Store, as an attacker with
// access to the tables would.
func rawConn(t *testing.T) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), dsn(t))
	if err != nil {
		t.Fatalf("connect to PostgreSQL (set TOOLGATE_PG_DSN, or TOOLGATE_PG_DSN=off to skip): %v", err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

func open(t *testing.T, schema string) *postgres.Store {
	t.Helper()
	s, err := postgres.Open(context.Background(), dsn(t), &postgres.Options{Schema: schema, MaxConns: 4})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestAuditContract(t *testing.T) {
	storetest.RunAudit(t, func(t *testing.T) *storetest.AuditHarness {
		schema := testSchema(t)
		s := open(t, schema)
		conn := rawConn(t)
		exec := func(q string) error {
			_, err := conn.Exec(context.Background(), q)
			return err
		}
		return &storetest.AuditHarness{
			Store: s,
			Open:  func(t *testing.T) audit.Store { return open(t, schema) },
			Exec: func(q string) error {
				return exec(strings.NewReplacer("{events}", schema+".audit_events", "{head}", schema+".audit_head").Replace(q))
			},
			DropTriggers: func() error {
				for _, tr := range []string{"audit_events_no_change ON %s.audit_events", "audit_events_no_truncate ON %s.audit_events",
					"audit_head_forward ON %s.audit_head", "audit_head_no_delete ON %s.audit_head", "audit_head_no_truncate ON %s.audit_head"} {
					if err := exec("DROP TRIGGER " + strings.ReplaceAll(tr, "%s", schema)); err != nil {
						return err
					}
				}
				return nil
			},
		}
	})
}

func TestApprovalContract(t *testing.T) {
	storetest.RunApprovals(t, func(t *testing.T) *storetest.ApprovalHarness {
		schema := testSchema(t)
		return &storetest.ApprovalHarness{
			Store:        open(t, schema),
			Open:         func(t *testing.T) approval.Store { return open(t, schema) },
			SharedListen: true,
		}
	})
}

func TestTruncateRefused(t *testing.T) {
	schema := testSchema(t)
	s := open(t, schema)
	if _, err := s.AppendEvents(context.Background(), []audit.Event{{EventID: "e1"}}); err != nil {
		t.Fatal(err)
	}
	conn := rawConn(t)
	for _, table := range []string{"audit_events", "audit_head"} {
		if _, err := conn.Exec(context.Background(), "TRUNCATE "+schema+"."+table); err == nil {
			t.Errorf("TRUNCATE %s succeeded; want the append-only trigger to refuse it", table)
		}
	}
}

func TestOpenErrors(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name string
		dsn  string
		opts *postgres.Options
		want string
	}{
		{"bad schema name", dsn(t), &postgres.Options{Schema: "Robert'); DROP"}, "invalid schema name"},
		{"bad DSN", "postgres://%zz", nil, "parse DSN"},
		{"no server", "postgres://postgres@127.0.0.1:1/test?sslmode=disable&connect_timeout=2", nil, "connect"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := postgres.Open(ctx, tt.dsn, tt.opts)
			if err == nil {
				s.Close()
				t.Fatal("Open succeeded")
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Open = %v; want an error containing %q", err, tt.want)
			}
		})
	}
}

// TestOpenConcurrently opens several stores on a new schema at once: the
// migration is serialized, so none fails on a CREATE race.
func TestOpenConcurrently(t *testing.T) {
	schema := testSchema(t)
	errs := make(chan error, 4)
	for range 4 {
		go func() {
			s, err := postgres.Open(context.Background(), dsn(t), &postgres.Options{Schema: schema, MaxConns: 2})
			if err == nil {
				s.Close()
			}
			errs <- err
		}()
	}
	for range 4 {
		if err := <-errs; err != nil {
			t.Errorf("concurrent Open: %v", err)
		}
	}
}

// TestListenAcrossReplicas decides on one replica and checks that a waiter
// listening through another wakes with the saved record, including one too
// large for a NOTIFY payload (sent as its id and read back).
func TestListenAcrossReplicas(t *testing.T) {
	ctx := context.Background()
	schema := testSchema(t)
	waiter, decider := open(t, schema), open(t, schema)
	b := approval.Binding{Principal: "user:alice", AgentID: "agent-x", ToolID: "tool:fs-write", ArgsDigest: strings.Repeat("c", 64)}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	small, err := approval.NewApproval(b, "user:alice", now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	big := small
	big.ID = approval.NewID()
	big.Args = json.RawMessage(`{"content":"` + strings.Repeat("x", 10000) + `"}`)
	for _, a := range []approval.Approval{small, big} {
		if err := decider.CreateApproval(ctx, a); err != nil {
			t.Fatal(err)
		}
	}
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ready := make(chan struct{})
	got := make(chan approval.Approval, 4)
	done := make(chan error, 1)
	go func() {
		done <- waiter.ListenApprovals(lctx, func() { close(ready) }, func(a approval.Approval) { got <- a })
	}()
	<-ready
	for _, a := range []approval.Approval{small, big} {
		want, err := decider.DecideApproval(ctx, a.ID, true, "user:bob", "ok", now.Add(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(want, <-got); diff != "" {
			t.Errorf("waiter got (-want +got):\n%s", diff)
		}
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("ListenApprovals = %v; want context.Canceled", err)
	}
}

// TestOpenRefusesRemovedAuditLog: an existing toolgate schema whose audit
// tables or head row were removed is refused, not given a fresh, empty
// chain that would verify (fail closed on anything missing).
func TestOpenRefusesRemovedAuditLog(t *testing.T) {
	tests := []struct {
		name   string
		tamper []string
	}{
		{"events table dropped", []string{"DROP TABLE %s.audit_events"}},
		{"head table dropped", []string{"DROP TABLE %s.audit_head"}},
		{"both dropped", []string{"DROP TABLE %s.audit_events", "DROP TABLE %s.audit_head"}},
		{"head row deleted", []string{"DROP TRIGGER audit_head_no_delete ON %s.audit_head", "DELETE FROM %s.audit_head"}},
		{"head row deleted, log empty", []string{"DROP TRIGGER audit_head_no_delete ON %s.audit_head", "DELETE FROM %s.audit_head",
			"DROP TRIGGER audit_events_no_change ON %s.audit_events", "DELETE FROM %s.audit_events"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			schema := testSchema(t)
			s := open(t, schema)
			if _, err := s.AppendEvents(ctx, []audit.Event{{EventID: "e1"}}); err != nil {
				t.Fatal(err)
			}
			s.Close()
			conn := rawConn(t)
			for _, q := range tt.tamper {
				if _, err := conn.Exec(ctx, strings.ReplaceAll(q, "%s", schema)); err != nil {
					t.Fatalf("%s: %v", q, err)
				}
			}
			s2, err := postgres.Open(ctx, dsn(t), &postgres.Options{Schema: schema})
			if err == nil {
				s2.Close()
				t.Fatal("Open of a schema whose audit log was removed succeeded")
			}
			if !errors.Is(err, postgres.ErrTampered) {
				t.Errorf("Open = %v; want ErrTampered", err)
			}
		})
	}
}
