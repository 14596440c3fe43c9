package registry

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.yaml.in/yaml/v3"
	_ "modernc.org/sqlite"

	"github.com/toolgate/toolgate"
	"github.com/toolgate/toolgate/builtin"
	"github.com/toolgate/toolgate/builtin/fstool"
	"github.com/toolgate/toolgate/builtin/sqltool"
)

func newRegistry(t *testing.T) (*Registry, string) {
	t.Helper()
	dir := t.TempDir()
	db, err := sql.Open("sqlite", filepath.Join(dir, "shop.db"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`CREATE TABLE orders (id INTEGER PRIMARY KEY, status TEXT); INSERT INTO orders VALUES (1, 'open')`); err != nil {
		t.Fatal(err)
	}
	db.Close()
	raw, err := os.ReadFile("../testdata/registry.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var cfg Config
	dec := yaml.NewDecoder(strings.NewReader(strings.ReplaceAll(string(raw), "${DIR}", dir)))
	dec.KnownFields(true)
	if err := dec.Decode(&cfg); err != nil {
		t.Fatal(err)
	}
	r, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r, dir
}

func TestRegistry(t *testing.T) {
	r, dir := newRegistry(t)
	want := []string{"fs.list", "fs.read", "fs.search", "sql.describe_table", "sql.list_tables", "sql.query"}
	if diff := cmp.Diff(want, r.Names()); diff != "" {
		t.Errorf("names (-want +got):\n%s", diff)
	}
	for _, n := range want {
		tl, ok := r.Lookup(n)
		if !ok || tl.Name() != n {
			t.Errorf("Lookup(%q) = %v, %v", n, tl, ok)
		}
		if !json.Valid(tl.Spec().InputSchema) || tl.Spec().SideEffect != toolgate.SideEffectRead {
			t.Errorf("%s: spec %+v", n, tl.Spec())
		}
	}
	if _, ok := r.Lookup("fs.write"); ok {
		t.Error("fs.write exists")
	}
	q, _ := r.Lookup("sql.query")
	res, err := q.Inspect(context.Background(), builtin.Invocation{Args: json.RawMessage(`{"query":"SELECT * FROM orders"}`), Workspace: dir})
	if diff := cmp.Diff([]toolgate.Resource{{Type: "sql_table", Name: "shop.orders", Action: "read"}}, res); diff != "" || err != nil {
		t.Errorf("sql.query resources (-want +got):\n%s %v", diff, err)
	}
}

func TestSelect(t *testing.T) {
	r, dir := newRegistry(t)
	tests := []struct {
		name      string
		names     []string
		workspace string
		want      []string
		err       error
	}{
		{"sql only", []string{"sql.query"}, "", []string{"sql.query"}, nil},
		{"fs with workspace", []string{"fs.read", "fs.search", "fs.read"}, dir, []string{"fs.read", "fs.search"}, nil},
		{"unknown", []string{"fs.read", "fetch"}, dir, nil, ErrUnknownTool},
		{"pattern is not a name", []string{"fs.*"}, dir, nil, ErrUnknownTool},
		{"fs without workspace", []string{"fs.read"}, "", nil, ErrNeedsWorkspace},
		{"workspace without fs", []string{"sql.query"}, dir, nil, ErrWorkspaceUnused},
		{"tool-less", nil, "", nil, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := r.Select(tc.names, tc.workspace)
			if !errors.Is(err, tc.err) {
				t.Fatalf("err = %v, want %v", err, tc.err)
			}
			var names []string
			for _, tl := range got {
				names = append(names, tl.Name())
			}
			if diff := cmp.Diff(tc.want, names); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestResultCapReachesTools(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "big.txt"), []byte(strings.Repeat("0123456789\n", 1000)), 0o644); err != nil {
		t.Fatal(err)
	}
	r, err := New(context.Background(), Config{ResultMaxKiB: 1, FS: fstool.Options{MaxLines: 1000}})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if _, ok := r.Lookup("sql.query"); ok {
		t.Error("sql.query exists without databases")
	}
	rd, _ := r.Lookup("fs.read")
	res, err := rd.Run(context.Background(), builtin.Invocation{Args: json.RawMessage(`{"path":"big.txt","end_line":1000}`), Workspace: dir})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Content) > 1024 || !res.Truncated || !strings.Contains(res.Content, "[truncated: ") {
		t.Errorf("len %d truncated %v", len(res.Content), res.Truncated)
	}
}

func TestNewFailsClosed(t *testing.T) {
	_, err := New(context.Background(), Config{Databases: []sqltool.Config{{Name: "shop", Driver: "sqlite", Path: filepath.Join(t.TempDir(), "missing.db")}}})
	if err == nil {
		t.Fatal("a registry with a missing database was built")
	}
}
