package sqlite

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/toolgate/toolgate/audit"
)

func TestPragmas(t *testing.T) {
	s, err := Open(filepath.Join(t.TempDir(), "toolgate.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var mode string
	var sync, busy int
	ctx := context.Background()
	if err := s.db.QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&mode); err != nil {
		t.Fatal(err)
	}
	if err := s.db.QueryRowContext(ctx, "PRAGMA synchronous").Scan(&sync); err != nil {
		t.Fatal(err)
	}
	if err := s.db.QueryRowContext(ctx, "PRAGMA busy_timeout").Scan(&busy); err != nil {
		t.Fatal(err)
	}
	if mode != "wal" || sync != 2 || busy != 5000 {
		t.Errorf("journal_mode=%s synchronous=%d busy_timeout=%d; want wal, 2 (FULL), 5000", mode, sync, busy)
	}
}

// TestAppendFailsWhenDiskFull caps the database's size (max_page_count), as
// a full disk would, and checks that Append fails with an error and writes
// nothing.
func TestAppendFailsWhenDiskFull(t *testing.T) {
	ctx := context.Background()
	s, err := Open(filepath.Join(t.TempDir(), "toolgate.db"), &Options{MaxOpenConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var pages int
	if err := s.db.QueryRowContext(ctx, "PRAGMA page_count").Scan(&pages); err != nil {
		t.Fatal(err)
	}
	if _, err := s.db.ExecContext(ctx, fmt.Sprintf("PRAGMA max_page_count = %d", pages)); err != nil {
		t.Fatal(err)
	}
	big := strings.Repeat("x", 64<<10)
	_, err = s.AppendEvents(ctx, []audit.Event{{EventID: "e1", Reason: big}})
	if err == nil || !strings.Contains(err.Error(), "full") {
		t.Fatalf("AppendEvents on a full database = %v; want a 'full' error", err)
	}
	head, err := s.AuditHead(ctx)
	if err != nil || head.Seq != 0 {
		t.Errorf("head after failed append = %+v, %v; want seq 0", head, err)
	}
}
