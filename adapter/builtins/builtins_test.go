package builtins_test

import (
	"context"
	"database/sql"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	_ "modernc.org/sqlite"

	"github.com/toolgate/toolgate/adapter/builtins"
	"github.com/toolgate/toolgate/builtin/sqltool"
	"github.com/toolgate/toolgate/policy"
)

const script = `CREATE TABLE orders (id INTEGER PRIMARY KEY, status TEXT);
INSERT INTO orders VALUES (1, 'shipped'), (2, 'pending');`

func countOrders(t *testing.T, path string) int {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var n int
	if err := db.QueryRow(`SELECT count(*) FROM orders`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestInitSQLite(t *testing.T) {
	dir := t.TempDir()
	sqlPath := filepath.Join(dir, "shop.sql")
	os.WriteFile(sqlPath, []byte(script), 0o644)
	dbPath := filepath.Join(dir, "shop.db")

	t.Run("creates a missing file, once, under concurrency", func(t *testing.T) {
		var wg sync.WaitGroup
		created := make(chan bool, 8)
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ok, err := builtins.InitSQLite(context.Background(), dbPath, sqlPath)
				if err != nil {
					t.Error(err)
				}
				created <- ok
			}()
		}
		wg.Wait()
		close(created)
		n := 0
		for ok := range created {
			if ok {
				n++
			}
		}
		if n != 1 {
			t.Errorf("%d callers created the file, want 1", n)
		}
		if got := countOrders(t, dbPath); got != 2 {
			t.Errorf("%d orders, want 2", got)
		}
		left, _ := filepath.Glob(filepath.Join(dir, ".shop.db.init-*"))
		if len(left) > 0 {
			t.Errorf("temporary files left: %v", left)
		}
	})
	t.Run("never touches an existing file", func(t *testing.T) {
		before, _ := os.ReadFile(dbPath)
		os.WriteFile(sqlPath, []byte(script+"\nINSERT INTO orders VALUES (3, 'x');"), 0o644)
		ok, err := builtins.InitSQLite(context.Background(), dbPath, sqlPath)
		after, _ := os.ReadFile(dbPath)
		if ok || err != nil || string(before) != string(after) {
			t.Errorf("created %v err %v; the file changed: %v", ok, err, string(before) != string(after))
		}
	})
	t.Run("a failing script leaves nothing behind", func(t *testing.T) {
		bad := filepath.Join(dir, "bad.sql")
		os.WriteFile(bad, []byte("CREATE TABLE t (x); INSERT INTO nope VALUES (1);"), 0o644)
		target := filepath.Join(dir, "bad.db")
		_, err := builtins.InitSQLite(context.Background(), target, bad)
		if err == nil || !strings.Contains(err.Error(), "nope") {
			t.Errorf("err %v, want the script's error", err)
		}
		if _, err := os.Stat(target); err == nil {
			t.Error("a half-built database was left in place")
		}
	})
}

func TestConfigAndOpen(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "shop.sql"), []byte(script), 0o644)
	t.Setenv("TG_BUILTINS_TEST_DSN", "postgres://reader@127.0.0.1:5432/shop")
	b := &policy.Bundle{}
	b.AddYAML("db.yaml", []byte(`
- {kind: Settings, result_max_kib: 8}
- {kind: Database, name: shop, driver: sqlite, path: shop.db, init_sql: shop.sql, statement_timeout: 2s, max_rows: 10}
- {kind: Database, name: wh, driver: postgres, dsn: {from_env: TG_BUILTINS_TEST_DSN}, allowed_functions: [public.f]}
`))
	cfg, err := builtins.Config(b, dir)
	if err != nil {
		t.Fatal(err)
	}
	want := []sqltool.Config{
		{Name: "shop", Driver: "sqlite", Path: filepath.Join(dir, "shop.db"), StatementTimeout: 2e9, MaxRows: 10},
		{Name: "wh", Driver: "postgres", DSN: "postgres://reader@127.0.0.1:5432/shop", AllowedFunctions: []string{"public.f"}},
	}
	if diff := cmp.Diff(want, cfg.Databases); diff != "" || cfg.ResultMaxKiB != 8 {
		t.Errorf("databases (-want +got):\n%s\nresult_max_kib %d", diff, cfg.ResultMaxKiB)
	}

	// Open builds shop.db from shop.sql and serves the sql tools over it.
	b2 := &policy.Bundle{}
	b2.AddYAML("db.yaml", []byte(`- {kind: Database, name: shop, driver: sqlite, path: shop.db, init_sql: shop.sql}`))
	reg, err := builtins.Open(context.Background(), b2, dir)
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	if diff := cmp.Diff([]string{"fs.list", "fs.read", "fs.search", "sql.describe_table", "sql.list_tables", "sql.query"}, reg.Names()); diff != "" {
		t.Errorf("tools (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(policy.BuiltinNames(), reg.Names()); diff != "" {
		t.Errorf("policy.BuiltinNames differs from the registry (-policy +registry):\n%s", diff)
	}

	// A database that cannot open is an error naming it.
	b3 := &policy.Bundle{}
	b3.AddYAML("db.yaml", []byte(`- {kind: Database, name: gone, driver: sqlite, path: missing.db}`))
	if _, err := builtins.Open(context.Background(), b3, dir); err == nil || !strings.Contains(err.Error(), `"gone"`) {
		t.Errorf("err %v, want one naming the database", err)
	}
	b4 := &policy.Bundle{}
	b4.AddYAML("db.yaml", []byte(`- {kind: Database, name: wh, driver: postgres, dsn: {from_env: TG_BUILTINS_TEST_UNSET}}`))
	if _, err := builtins.Config(b4, dir); err == nil || !strings.Contains(err.Error(), "Database wh") {
		t.Errorf("err %v, want one naming the database", err)
	}
}
