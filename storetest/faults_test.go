package storetest_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/toolgate/toolgate/storetest"
)

// TestFaultHelpers checks the fault helpers themselves: a filled tmpfs
// refuses writes and takes them again once freed, and the private
// PostgreSQL answers, refuses when stopped, and answers after a restart.
func TestFaultHelpers(t *testing.T) {
	t.Run("tmpfs fill", func(t *testing.T) {
		fs := storetest.MountTmpfs(t, 1<<20)
		free := fs.Fill(t)
		if err := os.WriteFile(filepath.Join(fs.Dir, "x"), make([]byte, 8192), 0o600); err == nil {
			t.Error("a write to a full file system succeeded")
		}
		free()
		if err := os.WriteFile(filepath.Join(fs.Dir, "x"), make([]byte, 8192), 0o600); err != nil {
			t.Errorf("write after free: %v", err)
		}
	})
	t.Run("tmpfs fill inodes", func(t *testing.T) {
		fs := storetest.MountTmpfsInodes(t, 1<<20, 64)
		free := fs.FillInodes(t)
		if err := os.WriteFile(filepath.Join(fs.Dir, "x"), nil, 0o600); err == nil {
			t.Error("an empty file was created on a file system without inodes")
		}
		free()
		if err := os.WriteFile(filepath.Join(fs.Dir, "x"), nil, 0o600); err != nil {
			t.Errorf("create after free: %v", err)
		}
	})
	t.Run("postgres stop and start", func(t *testing.T) {
		ctx := context.Background()
		p := storetest.StartPostgres(t)
		ping := func() error {
			c, err := pgx.Connect(ctx, p.DSN())
			if err != nil {
				return err
			}
			defer c.Close(ctx)
			return c.Ping(ctx)
		}
		if err := ping(); err != nil {
			t.Fatalf("ping: %v", err)
		}
		p.Stop(t)
		if err := ping(); err == nil {
			t.Error("ping of a stopped server succeeded")
		}
		p.Start(t)
		if err := ping(); err != nil {
			t.Errorf("ping after restart: %v", err)
		}
	})
}
