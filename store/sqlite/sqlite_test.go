package sqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/toolgate/toolgate/approval"
	"github.com/toolgate/toolgate/audit"
	"github.com/toolgate/toolgate/store/sqlite"
	"github.com/toolgate/toolgate/storetest"
)

// open opens a Store on path and closes it when the test ends.
func open(t *testing.T, path string) *sqlite.Store {
	t.Helper()
	s, err := sqlite.Open(path, nil)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// raw opens the file directly, bypassing the Store, as an attacker with
// access to the file would.
func raw(t *testing.T, path string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", path+"?_busy_timeout=5000")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func TestAuditContract(t *testing.T) {
	storetest.RunAudit(t, func(t *testing.T) *storetest.AuditHarness {
		path := filepath.Join(t.TempDir(), "toolgate.db")
		s := open(t, path)
		db := raw(t, path)
		return &storetest.AuditHarness{
			Store: s,
			Open:  func(t *testing.T) audit.Store { return open(t, path) },
			Exec: func(q string) error {
				q = strings.NewReplacer("{events}", "audit_events", "{head}", "audit_head").Replace(q)
				_, err := db.Exec(q)
				return err
			},
			DropTriggers: func() error {
				for _, name := range []string{"audit_events_no_update", "audit_events_no_delete", "audit_head_forward", "audit_head_no_delete"} {
					if _, err := db.Exec("DROP TRIGGER " + name); err != nil {
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
		path := filepath.Join(t.TempDir(), "toolgate.db")
		return &storetest.ApprovalHarness{
			Store: open(t, path),
			Open:  func(t *testing.T) approval.Store { return open(t, path) },
		}
	})
}

// immutable makes paths unchangeable even for root (chattr +i) until the
// test ends. The files' open descriptors stop working for writes too, which
// is how a store "becomes unwritable" under a running gateway.
func immutable(t *testing.T, paths ...string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("chattr +i needs root (CAP_LINUX_IMMUTABLE); CI runs as root")
	}
	for _, p := range paths {
		if out, err := exec.Command("chattr", "+i", p).CombinedOutput(); err != nil {
			t.Fatalf("chattr +i %s: %v: %s", p, err, out)
		}
		t.Cleanup(func() { exec.Command("chattr", "-i", p).Run() })
	}
}

func mutable(t *testing.T, paths ...string) {
	t.Helper()
	for _, p := range paths {
		if out, err := exec.Command("chattr", "-i", p).CombinedOutput(); err != nil {
			t.Fatalf("chattr -i %s: %v: %s", p, err, out)
		}
	}
}

func TestOpenErrors(t *testing.T) {
	dir := t.TempDir()
	notDB := filepath.Join(dir, "not-a-db")
	if err := os.WriteFile(notDB, []byte("this is not a SQLite database, just some text that is long enough to matter"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		path string
		want string // substring of the error
	}{
		{"empty path", "", "invalid database path"},
		{"question mark", filepath.Join(dir, "a?b.db"), "invalid database path"},
		{"directory", dir, "cannot be opened"},
		{"not a database", notDB, "not a database"},
		{"folder under a file", filepath.Join(notDB, "x.db"), "create folder"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := sqlite.Open(tt.path, nil)
			if err == nil {
				s.Close()
				t.Fatalf("Open(%q) succeeded", tt.path)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Open(%q) = %v; want an error containing %q", tt.path, err, tt.want)
			}
		})
	}
}

func TestOpenNotWritable(t *testing.T) {
	path := filepath.Join(t.TempDir(), "toolgate.db")
	s := open(t, path)
	if _, err := s.AppendEvents(context.Background(), []audit.Event{{EventID: "e1", EventType: "agent.tool.authorized"}}); err != nil {
		t.Fatal(err)
	}
	s.Close() // checkpoints the WAL into the file
	if os.Geteuid() == 0 {
		immutable(t, path)
	} else if err := os.Chmod(path, 0o444); err != nil {
		t.Fatal(err)
	}
	s2, err := sqlite.Open(path, nil)
	if err == nil {
		s2.Close()
		t.Fatal("Open of a read-only file succeeded")
	}
	if want := path + " is not writable"; !strings.Contains(err.Error(), want) {
		t.Errorf("Open = %v; want an error containing %q", err, want)
	}
}

func TestAppendFailsWhenFileBecomesUnwritable(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "toolgate.db")
	s := open(t, path)
	if _, err := s.AppendEvents(ctx, []audit.Event{{EventID: "e1"}}); err != nil {
		t.Fatal(err)
	}
	files := []string{path, path + "-wal"} // not -shm: it is mmapped, and a write fault there is SIGBUS
	immutable(t, files...)
	_, err := s.AppendEvents(ctx, []audit.Event{{EventID: "e2"}})
	if err == nil {
		t.Fatal("AppendEvents on an unwritable file succeeded")
	}
	t.Logf("AppendEvents on an unwritable file: %v", err)
	mutable(t, files...)
	// The store recovers once the file is writable again, and nothing of
	// the failed batch was written.
	out, err := s.AppendEvents(ctx, []audit.Event{{EventID: "e3"}})
	if err != nil {
		t.Fatalf("AppendEvents after the file became writable again: %v", err)
	}
	if out[0].Seq != 2 {
		t.Errorf("seq after recovery = %d; want 2", out[0].Seq)
	}
	if rep, err := audit.Verify(ctx, s); err != nil || !rep.OK {
		t.Errorf("Verify = %+v, %v; want OK", rep, err)
	}
}

// TestOpenRefusesRemovedAuditLog: an existing toolgate database whose audit
// tables or head row were removed is refused, not given a fresh, empty
// chain that would verify (fail closed on anything missing).
func TestOpenRefusesRemovedAuditLog(t *testing.T) {
	tests := []struct {
		name   string
		tamper []string
	}{
		{"events table dropped", []string{"DROP TABLE audit_events"}},
		{"head table dropped", []string{"DROP TABLE audit_head"}},
		{"both dropped", []string{"DROP TABLE audit_events", "DROP TABLE audit_head"}},
		{"head row deleted", []string{"DROP TRIGGER audit_head_no_delete", "DELETE FROM audit_head"}},
		{"head row deleted, log empty", []string{"DROP TRIGGER audit_head_no_delete", "DELETE FROM audit_head", "DELETE FROM audit_events"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "toolgate.db")
			s := open(t, path)
			if _, err := s.AppendEvents(context.Background(), []audit.Event{{EventID: "e1"}}); err != nil {
				t.Fatal(err)
			}
			s.Close()
			db := raw(t, path)
			db.Exec("DROP TRIGGER audit_events_no_delete")
			for _, q := range tt.tamper {
				if _, err := db.Exec(q); err != nil {
					t.Fatalf("%s: %v", q, err)
				}
			}
			db.Close()
			for _, ro := range []bool{false, true} {
				s2, err := sqlite.Open(path, &sqlite.Options{ReadOnly: ro})
				if err == nil {
					s2.Close()
					t.Fatalf("Open (read-only %v) of a database whose audit log was removed succeeded", ro)
				}
				if !errors.Is(err, sqlite.ErrTampered) {
					t.Errorf("Open (read-only %v) = %v; want ErrTampered", ro, err)
				}
			}
		})
	}
}

// TestOpenReadOnly: a read-only open reads what a writer wrote (closed, or
// still open in another connection), writes nothing, and refuses a file
// that is not a toolgate database instead of creating the schema in it.
func TestOpenReadOnly(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	path := filepath.Join(dir, "toolgate.db")
	w := open(t, path)
	if _, err := w.AppendEvents(ctx, []audit.Event{{EventID: "e1"}, {EventID: "e2"}}); err != nil {
		t.Fatal(err)
	}
	check := func(name string) {
		t.Helper()
		r, err := sqlite.Open(path, &sqlite.Options{ReadOnly: true})
		if err != nil {
			t.Fatalf("%s: read-only Open: %v", name, err)
		}
		defer r.Close()
		if rep, err := audit.Verify(ctx, r); err != nil || !rep.OK || rep.Checked != 2 {
			t.Errorf("%s: Verify = %+v, %v; want OK with 2 records", name, rep, err)
		}
		if _, err := r.AppendEvents(ctx, []audit.Event{{EventID: "e3"}}); err == nil {
			t.Errorf("%s: AppendEvents on a read-only store succeeded", name)
		}
	}
	check("writer open")
	w.Close()
	check("writer closed")

	other := filepath.Join(dir, "other.db")
	db := raw(t, other)
	if _, err := db.Exec("CREATE TABLE x (a)"); err != nil {
		t.Fatal(err)
	}
	db.Close()
	if s, err := sqlite.Open(other, &sqlite.Options{ReadOnly: true}); err == nil {
		s.Close()
		t.Error("read-only Open of a database that is not toolgate's succeeded")
	} else if !strings.Contains(err.Error(), "not a toolgate database") {
		t.Errorf("read-only Open of another database = %v; want 'not a toolgate database'", err)
	}
	if _, err := sqlite.Open(filepath.Join(dir, "missing.db"), &sqlite.Options{ReadOnly: true}); err == nil {
		t.Error("read-only Open of a missing file succeeded")
	}
	if _, err := os.Stat(filepath.Join(dir, "missing.db")); err == nil {
		t.Error("read-only Open created a file")
	}
}

// TestOpenReadOnlyOddPaths: the read-only open names its file with a URI
// (mode=ro needs one); characters that mean something in a URI must still
// name the file they say, never another (empty) database.
func TestOpenReadOnlyOddPaths(t *testing.T) {
	for _, name := range []string{"a#b", "a%20b", "a%", "a b", "a&mode=rw", "ä;b"} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			dir := filepath.Join(t.TempDir(), name)
			if err := os.MkdirAll(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(dir, "toolgate.db")
			w := open(t, path)
			if _, err := w.AppendEvents(ctx, []audit.Event{{EventID: "e1"}}); err != nil {
				t.Fatal(err)
			}
			w.Close()
			r, err := sqlite.Open(path, &sqlite.Options{ReadOnly: true})
			if err != nil {
				t.Fatalf("read-only Open: %v", err)
			}
			defer r.Close()
			if rep, err := audit.Verify(ctx, r); err != nil || !rep.OK || rep.Checked != 1 {
				t.Errorf("Verify through the read-only store = %+v, %v; want the log written (1 record)", rep, err)
			}
			if _, err := r.AppendEvents(ctx, []audit.Event{{EventID: "e2"}}); err == nil {
				t.Error("AppendEvents through the read-only store succeeded")
			}
		})
	}
}
