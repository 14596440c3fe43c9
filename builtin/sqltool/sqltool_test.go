package sqltool

import (
	"context"
	"crypto/rand"
	"database/sql"
	"database/sql/driver"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"
	_ "modernc.org/sqlite"

	"go.yaml.in/yaml/v3"

	"github.com/toolgate/toolgate"
	"github.com/toolgate/toolgate/authz"
	"github.com/toolgate/toolgate/builtin"
	"github.com/toolgate/toolgate/policy"
)

// ---- fixtures ----

func fixtureSQL(t testing.TB) string {
	t.Helper()
	b, err := os.ReadFile("testdata/fixture.sql")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// sqliteFile writes the fixture into a new SQLite file (with the package's
// plain driver, which writes) and returns its path.
func sqliteFile(t testing.TB) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "shop.db")
	db, err := sql.Open("sqlite", p)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(fixtureSQL(t)); err != nil {
		t.Fatal(err)
	}
	return p
}

// pgDSN returns the test server's DSN, or skips when TOOLGATE_PG_DSN is
// "off". A server that cannot be reached fails the test.
func pgDSN(t testing.TB) string {
	t.Helper()
	dsn := os.Getenv("TOOLGATE_PG_DSN")
	if dsn == "off" {
		t.Skip("TOOLGATE_PG_DSN=off")
	}
	if dsn == "" {
		dsn = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	}
	return dsn
}

// pgSchema creates a throwaway schema holding the fixture, dropped after
// the test, and returns a DSN whose search_path starts with it.
func pgSchema(t testing.TB) (dsn, schema string) {
	t.Helper()
	base := pgDSN(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		t.Fatalf("PostgreSQL at %s: %v (set TOOLGATE_PG_DSN=off to skip)", base, err)
	}
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	schema = "tg_builtin_" + hex.EncodeToString(rnd[:])
	// peek_tokens reads api_tokens in its body; === , peeky and the cast
	// into mood reach it (or one like it) without naming it
	// (testdata/functions.yaml).
	setup := fmt.Sprintf("CREATE SCHEMA %[1]s; SET search_path = %[1]s; %[2]s\n"+
		"CREATE FUNCTION %[1]s.peek_tokens() RETURNS bigint LANGUAGE sql AS 'SELECT count(*) FROM %[1]s.api_tokens';\n"+
		"CREATE FUNCTION %[1]s.peek_eq(int, int) RETURNS bool LANGUAGE sql AS 'SELECT count(*) > 0 FROM %[1]s.api_tokens';\n"+
		"CREATE OPERATOR %[1]s.=== (FUNCTION = %[1]s.peek_eq, LEFTARG = int, RIGHTARG = int);\n"+
		"CREATE DOMAIN %[1]s.peeky AS int CHECK (%[1]s.peek_tokens() >= 0);\n"+
		"CREATE TYPE %[1]s.mood AS ENUM ('ok');\n"+
		"CREATE FUNCTION %[1]s.mood_of(int) RETURNS %[1]s.mood LANGUAGE sql AS 'SELECT ''ok''::%[1]s.mood FROM %[1]s.api_tokens LIMIT 1';\n"+
		"CREATE CAST (int AS %[1]s.mood) WITH FUNCTION %[1]s.mood_of(int);",
		schema, fixtureSQL(t))
	if _, err := conn.Exec(ctx, setup); err != nil {
		conn.Close(ctx)
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := conn.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE"); err != nil {
			t.Errorf("drop schema: %v", err)
		}
		conn.Close(context.Background())
	})
	sep := "?"
	if strings.Contains(base, "?") {
		sep = "&"
	}
	return base + sep + "search_path=" + schema, schema
}

type backendCase struct {
	driver string
	db     *DB
	prefix string // resource name prefix before the table
	schema string // PostgreSQL: the test's own schema
}

// backends opens the fixture on both databases.
func backends(t *testing.T, mod func(*Config)) []backendCase {
	t.Helper()
	ctx := context.Background()
	var out []backendCase
	scfg := Config{Name: "shop", Driver: DriverSQLite, Path: sqliteFile(t)}
	if mod != nil {
		mod(&scfg)
	}
	sdb, err := Open(ctx, scfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sdb.Close() })
	out = append(out, backendCase{DriverSQLite, sdb, "shop.", ""})
	if os.Getenv("TOOLGATE_PG_DSN") == "off" {
		t.Log("TOOLGATE_PG_DSN=off: PostgreSQL cases skipped")
		return out
	}
	dsn, schema := pgSchema(t)
	pcfg := Config{Name: "shop", Driver: DriverPostgres, DSN: dsn}
	if mod != nil {
		mod(&pcfg)
	}
	pdb, err := Open(ctx, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pdb.Close() })
	return append(out, backendCase{DriverPostgres, pdb, "shop." + schema + ".", schema})
}

func toolsFor(t *testing.T, db *DB, opts *Options) map[string]builtin.Tool {
	t.Helper()
	ts, err := New([]*DB{db}, opts)
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]builtin.Tool{}
	for _, tl := range ts {
		m[tl.Name()] = tl
	}
	return m
}

func inv(args any) builtin.Invocation {
	b, _ := json.Marshal(args)
	return builtin.Invocation{Args: b}
}

func codeOf(err error) toolgate.Code {
	var te *toolgate.Error
	if errors.As(err, &te) {
		return te.Code
	}
	if err != nil {
		return "other"
	}
	return ""
}

// ---- the shared query cases ----

type queryCase struct {
	Name   string        `yaml:"name"`
	Query  string        `yaml:"query"`
	Only   string        `yaml:"only"`
	Tables []string      `yaml:"tables"`
	Code   toolgate.Code `yaml:"code"`
	Names  []string      `yaml:"names"`
}

func loadCases(t *testing.T, file string) []queryCase {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", file))
	if err != nil {
		t.Fatal(err)
	}
	var cs []queryCase
	dec := yaml.NewDecoder(strings.NewReader(string(b)))
	dec.KnownFields(true)
	if err := dec.Decode(&cs); err != nil {
		t.Fatal(err)
	}
	return cs
}

func TestQueryCases(t *testing.T) { runQueryCases(t, "queries.yaml") }

// TestFunctionAllowList pins the allow-list of functions a query may call
// (functions.go), through calls, operators, casts and TABLESAMPLE, on the
// real SQLite and PostgreSQL.
func TestFunctionAllowList(t *testing.T) { runQueryCases(t, "functions.yaml") }

// runQueryCases checks Inspect and Run of every case of a testdata file on
// both databases.
func runQueryCases(t *testing.T, file string) {
	cases := loadCases(t, file)
	for _, be := range backends(t, nil) {
		tl := toolsFor(t, be.db, nil)[QueryName]
		t.Run(be.driver, func(t *testing.T) {
			for _, tc := range cases {
				if tc.Only != "" && tc.Only != be.driver {
					continue
				}
				t.Run(tc.Name, func(t *testing.T) {
					ctx := context.Background()
					q := strings.ReplaceAll(tc.Query, "{schema}", be.schema)
					got, err := tl.Inspect(ctx, inv(map[string]string{"query": q}))
					if diff := cmp.Diff(tc.Code, codeOf(err)); diff != "" {
						t.Fatalf("code (-want +got):\n%s\nerr: %v", diff, err)
					}
					_, rerr := tl.Run(ctx, inv(map[string]string{"query": q}))
					if tc.Code != "" {
						var te *toolgate.Error
						errors.As(err, &te)
						if te.Layer != toolgate.LayerResource {
							t.Errorf("layer = %q", te.Layer)
						}
						for _, n := range tc.Names {
							if !strings.Contains(te.Message, n) {
								t.Errorf("message %q does not name %q", te.Message, n)
							}
						}
						if codeOf(rerr) != tc.Code {
							t.Errorf("Run: code %q, want %q (%v)", codeOf(rerr), tc.Code, rerr)
						}
						return
					}
					want := []toolgate.Resource{}
					for _, n := range tc.Tables {
						want = append(want, toolgate.Resource{Type: ResourceTable, Name: be.prefix + n, Action: "read"})
					}
					sort.Slice(want, func(i, j int) bool { return want[i].Name < want[j].Name })
					if diff := cmp.Diff(want, got); diff != "" {
						t.Errorf("resources (-want +got):\n%s", diff)
					}
					if rerr != nil {
						t.Errorf("Run: %v", rerr)
					}
				})
			}
		})
	}
}

// TestRefusalsLeaveNoTrace checks that refused statements changed nothing:
// no file was attached, copied or vacuumed into, no row deleted.
func TestRefusalsLeaveNoTrace(t *testing.T) {
	bes := backends(t, nil)
	dir := t.TempDir()
	t.Chdir(dir) // where a relative ATTACH or VACUUM INTO would write
	for _, be := range bes {
		tl := toolsFor(t, be.db, nil)[QueryName]
		for _, q := range []string{
			"ATTACH DATABASE 'other.db' AS x",
			"SELECT 1; ATTACH DATABASE 'other2.db' AS x",
			"VACUUM INTO 'copy.db'",
			"SELECT 1; DELETE FROM orders",
			"/* report */ DELETE FROM orders",
			"WITH gone AS (DELETE FROM orders RETURNING 1) SELECT count(*) FROM gone",
		} {
			_, _ = tl.Run(context.Background(), inv(map[string]string{"query": q}))
		}
		r, err := tl.Run(context.Background(), inv(map[string]string{"query": "SELECT count(*) AS n FROM orders"}))
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff([][]any{{int64(5)}}, r.Structured.(QueryResult).Rows); diff != "" {
			t.Errorf("%s: orders changed (-want +got):\n%s", be.driver, diff)
		}
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 0 {
		t.Errorf("files were created: %v", entries)
	}
}

func TestQueryRun(t *testing.T) {
	for _, be := range backends(t, func(c *Config) { c.MaxRows = 3 }) {
		t.Run(be.driver, func(t *testing.T) {
			tl := toolsFor(t, be.db, nil)[QueryName]
			ctx := context.Background()
			r, err := tl.Run(ctx, inv(map[string]string{"query": "SELECT count(*) AS n, lower(status) AS s FROM orders GROUP BY 2 ORDER BY 2"}))
			if err != nil {
				t.Fatal(err)
			}
			want := QueryResult{Database: "shop", Columns: []string{"n", "s"}, Rows: [][]any{{int64(2), "closed"}, {int64(3), "open"}}}
			if diff := cmp.Diff(want, r.Structured); diff != "" {
				t.Errorf("structured (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff("n | s\n2 | closed\n3 | open\n(2 rows)", r.Content); diff != "" {
				t.Errorf("content (-want +got):\n%s", diff)
			}
			if r.Truncated || r.Bytes != len(r.Content) {
				t.Errorf("truncated %v bytes %d", r.Truncated, r.Bytes)
			}

			// max_rows cuts and says so.
			r, err = tl.Run(ctx, inv(map[string]string{"query": "SELECT id, status FROM orders ORDER BY id"}))
			if err != nil {
				t.Fatal(err)
			}
			got := r.Structured.(QueryResult)
			if len(got.Rows) != 3 || !got.Truncated || !r.Truncated {
				t.Errorf("max_rows: %+v", got)
			}
			if !strings.HasSuffix(r.Content, "[truncated: first 3 rows shown; max_rows is 3]") {
				t.Errorf("content = %q", r.Content)
			}

			// NULLs and JSON values.
			r, err = tl.Run(ctx, inv(map[string]string{"query": "SELECT NULL AS a, 1.5 AS b, 'x' AS c"}))
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff("a | b | c\nNULL | 1.5 | x\n(1 row)", r.Content); diff != "" {
				t.Errorf("content (-want +got):\n%s", diff)
			}
		})
	}
}

func TestQueryByteCap(t *testing.T) {
	for _, be := range backends(t, func(c *Config) { c.MaxRows = 1000 }) {
		t.Run(be.driver, func(t *testing.T) {
			tl := toolsFor(t, be.db, &Options{Options: builtin.Options{ResultMaxKiB: 1}})[QueryName]
			q := "WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n WHERE x < 500) SELECT x, 'padding-padding-padding' AS p FROM n"
			r, err := tl.Run(context.Background(), inv(map[string]string{"query": q}))
			if err != nil {
				t.Fatal(err)
			}
			if len(r.Content) > 1024 || !r.Truncated {
				t.Fatalf("len %d truncated %v", len(r.Content), r.Truncated)
			}
			lines := strings.Split(r.Content, "\n")
			last := lines[len(lines)-1]
			want := fmt.Sprintf("[truncated: first %d rows shown; the result is larger than the 1024-byte cap (Settings.result_max_kib)]", len(lines)-2)
			if diff := cmp.Diff(want, last); diff != "" {
				t.Errorf("last line (-want +got):\n%s", diff)
			}
			got := r.Structured.(QueryResult)
			if !got.Truncated || len(got.Rows) != len(lines)-2 || len(got.Rows) == 0 {
				t.Errorf("structured has %d rows, content %d", len(got.Rows), len(lines)-2)
			}
			if b, _ := json.Marshal(got.Rows); len(b) > 1024 {
				t.Errorf("structured rows take %d bytes, more than the cap", len(b))
			}
		})
	}
}

// TestReadingStopsAtTheCap checks that sql.query stops reading once the
// rows read fill the cap: a row past that point is never computed, so
// the error row 60 would raise (integer overflow, division by zero)
// never happens, though max_rows would allow 1000 rows. Without the stop
// the call fails with that error.
func TestReadingStopsAtTheCap(t *testing.T) {
	queries := map[string]string{
		DriverSQLite: "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT 1000) " +
			"SELECT x, CASE WHEN x >= 60 THEN abs(x - x - 9223372036854775807 - 1) ELSE x END AS y, printf('%.100c', 'p') AS pad FROM c",
		DriverPostgres: "SELECT x, CASE WHEN x >= 60 THEN 1 / (x - x) ELSE x END AS y, repeat('p', 100) AS pad FROM generate_series(1, 1000) AS x",
	}
	for _, be := range backends(t, func(c *Config) { c.MaxRows = 1000 }) {
		t.Run(be.driver, func(t *testing.T) {
			tl := toolsFor(t, be.db, &Options{Options: builtin.Options{ResultMaxKiB: 1}})[QueryName]
			r, err := tl.Run(context.Background(), inv(map[string]string{"query": queries[be.driver]}))
			if err != nil {
				t.Fatalf("a row past the cap was computed: %v", err)
			}
			got := r.Structured.(QueryResult)
			if !r.Truncated || len(got.Rows) == 0 || len(got.Rows) >= 60 || len(r.Content) > 1024 {
				t.Errorf("truncated %v, %d rows, %d bytes", r.Truncated, len(got.Rows), len(r.Content))
			}
			if !strings.HasSuffix(r.Content, "the result is larger than the 1024-byte cap (Settings.result_max_kib)]") {
				t.Errorf("content ends %q", r.Content[max(len(r.Content)-120, 0):])
			}
		})
	}
}

func TestStatementTimeout(t *testing.T) {
	for _, be := range backends(t, func(c *Config) { c.StatementTimeout = 50 * time.Millisecond }) {
		t.Run(be.driver, func(t *testing.T) {
			tl := toolsFor(t, be.db, nil)[QueryName]
			q := "WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n) SELECT count(*) FROM n"
			_, err := tl.Run(context.Background(), inv(map[string]string{"query": q}))
			if err == nil {
				t.Fatal("an endless query returned")
			}
			if codeOf(err) != "other" {
				t.Errorf("a timeout is a failure, not a refusal: %v", err)
			}
		})
	}
}

// TestReadOnlyUnderneath checks the defence below the analysis: the
// connection (SQLite) and transaction (PostgreSQL) refuse writes even when
// the analysis is bypassed.
func TestReadOnlyUnderneath(t *testing.T) {
	ctx := context.Background()
	for _, be := range backends(t, nil) {
		t.Run(be.driver, func(t *testing.T) {
			var err error
			switch b := be.db.be.(type) {
			case *sqliteBackend:
				err = b.withConn(ctx, allowAll, func(c *sql.Conn, _ any) error {
					_, err := c.ExecContext(ctx, "DELETE FROM orders")
					return err
				})
				if err == nil || !strings.Contains(err.Error(), "readonly") {
					t.Errorf("DELETE on the read-only connection: %v", err)
				}
				// And the default authorizer denies everything.
				c, _ := b.db.Conn(ctx)
				_, err = c.QueryContext(ctx, "SELECT 1")
				c.Close()
				if err == nil || !strings.Contains(err.Error(), "not authorized") {
					t.Errorf("SELECT under the idle authorizer: %v", err)
				}
			case *pgBackend:
				err = b.readTx(ctx, func(tx pgx.Tx) error {
					_, err := tx.Exec(ctx, "DELETE FROM orders")
					return err
				})
				if err == nil || !strings.Contains(err.Error(), "read-only transaction") {
					t.Errorf("DELETE in the read-only transaction: %v", err)
				}
			}
		})
	}
}

func TestListAndDescribe(t *testing.T) {
	ctx := context.Background()
	for _, be := range backends(t, nil) {
		t.Run(be.driver, func(t *testing.T) {
			tl := toolsFor(t, be.db, nil)
			res, err := tl[ListTablesName].Inspect(ctx, inv(map[string]any{}))
			if diff := cmp.Diff([]toolgate.Resource{{Type: ResourceDatabase, Name: "shop", Action: "read"}}, res); diff != "" || err != nil {
				t.Errorf("list_tables resources (-want +got):\n%s %v", diff, err)
			}
			r, err := tl[ListTablesName].Run(ctx, inv(map[string]any{}))
			if err != nil {
				t.Fatal(err)
			}
			// Other tests create schemas in the shared database at the
			// same time: look only at this test's own schema.
			parts := strings.Split(be.prefix, ".")
			var names []string
			for _, ti := range r.Structured.(ListTablesResult).Tables {
				if be.driver == DriverPostgres && len(parts) > 2 && ti.Schema != parts[1] {
					continue
				}
				names = append(names, ti.Name+":"+ti.Type)
			}
			want := []string{"api_tokens:table", "customers:table", "nested_view:view", "open_orders:view", "orders:table", "token_view:view"}
			if diff := cmp.Diff(want, names); diff != "" {
				t.Errorf("tables (-want +got):\n%s", diff)
			}

			res, err = tl[DescribeTableName].Inspect(ctx, inv(map[string]any{"table": "orders"}))
			if diff := cmp.Diff([]toolgate.Resource{{Type: ResourceTable, Name: be.prefix + "orders", Action: "read"}}, res); diff != "" || err != nil {
				t.Errorf("describe resources (-want +got):\n%s %v", diff, err)
			}
			r, err = tl[DescribeTableName].Run(ctx, inv(map[string]any{"table": "orders"}))
			if err != nil {
				t.Fatal(err)
			}
			var cols []string
			for _, c := range r.Structured.(DescribeResult).Columns {
				cols = append(cols, fmt.Sprintf("%s nullable=%v pk=%v default=%v", c.Name, c.Nullable, c.PrimaryKey, c.Default != nil))
			}
			wantCols := []string{"id nullable=false pk=true default=false", "status nullable=false pk=false default=true", "total nullable=true pk=false default=false"}
			if diff := cmp.Diff(wantCols, cols); diff != "" {
				t.Errorf("columns (-want +got):\n%s", diff)
			}

			// A table that does not exist is reported as named (no
			// existence oracle before authorization); Run says it is not there.
			res, err = tl[DescribeTableName].Inspect(ctx, inv(map[string]any{"table": "nope"}))
			if err != nil || len(res) != 1 || res[0].Name != be.prefix+"nope" {
				t.Errorf("describe missing: %v %v", res, err)
			}
			if _, err := tl[DescribeTableName].Run(ctx, inv(map[string]any{"table": "nope"})); codeOf(err) != toolgate.CodeBadArguments {
				t.Errorf("describe missing Run: %v", err)
			}
		})
	}
}

func TestArgumentsAndDatabases(t *testing.T) {
	ctx := context.Background()
	a, err := Open(ctx, Config{Name: "a", Driver: DriverSQLite, Path: sqliteFile(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := Open(ctx, Config{Name: "b", Driver: DriverSQLite, Path: sqliteFile(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ts, err := New([]*DB{a, b}, nil)
	if err != nil {
		t.Fatal(err)
	}
	q := ts[2]
	tests := []struct {
		name string
		args string
		want []toolgate.Resource
		code toolgate.Code
	}{
		{"database required with two", `{"query":"SELECT 1"}`, nil, toolgate.CodeBadArguments},
		{"unknown database", `{"database":"c","query":"SELECT 1"}`, nil, toolgate.CodeBadArguments},
		{"picks b", `{"database":"b","query":"SELECT id FROM orders"}`, []toolgate.Resource{{Type: ResourceTable, Name: "b.orders", Action: "read"}}, ""},
		{"unknown field", `{"database":"a","query":"SELECT 1","mode":"rw"}`, nil, toolgate.CodeBadArguments},
		{"no query", `{"database":"a"}`, nil, toolgate.CodeBadArguments},
		{"NUL", `{"database":"a","query":"SELECT 1\u0000; DELETE FROM orders"}`, nil, toolgate.CodeBadArguments},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := q.Inspect(ctx, builtin.Invocation{Args: json.RawMessage(tc.args)})
			if codeOf(err) != tc.code {
				t.Fatalf("code %q, want %q (%v)", codeOf(err), tc.code, err)
			}
			if diff := cmp.Diff(tc.want, got); tc.code == "" && diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
	if _, err := New([]*DB{a, a}, nil); err == nil {
		t.Error("duplicate database names accepted")
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		want string
	}{
		{"ok sqlite", Config{Name: "shop", Driver: "sqlite", Path: "x.db"}, ""},
		{"ok postgres", Config{Name: "shop-2", Driver: "postgres", DSN: "postgres://x"}, ""},
		{"dot in name", Config{Name: "a.b", Driver: "sqlite", Path: "x"}, "name"},
		{"no path", Config{Name: "a", Driver: "sqlite"}, "path is required"},
		{"no dsn", Config{Name: "a", Driver: "postgres"}, "dsn is required"},
		{"mysql", Config{Name: "a", Driver: "mysql", DSN: "x"}, "not supported"},
		{"bad allowed function", Config{Name: "a", Driver: "postgres", DSN: "x", AllowedFunctions: []string{"f"}}, "schema.name"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if (tc.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.want)) {
				t.Errorf("Validate() = %v, want %q", err, tc.want)
			}
		})
	}
	if _, err := Open(context.Background(), Config{Name: "a", Driver: "sqlite", Path: filepath.Join(t.TempDir(), "missing.db")}); err == nil {
		t.Error("a missing SQLite file was opened (it must never be created)")
	}
}

// TestAllowedFunctions checks that allowed_functions permits exactly the
// functions it names, read with PostgreSQL's identifier rules: an unquoted
// entry names the lowercase function, never another one spelled with other
// cases, and a quoted one exactly what it quotes.
func TestAllowedFunctions(t *testing.T) {
	if os.Getenv("TOOLGATE_PG_DSN") == "off" {
		t.Skip("TOOLGATE_PG_DSN=off")
	}
	ctx := context.Background()
	dsn, schema := pgSchema(t)
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	_, err = conn.Exec(ctx, fmt.Sprintf(`CREATE FUNCTION %[1]s."PEEK_TOKENS"() RETURNS bigint LANGUAGE sql AS 'SELECT count(*) FROM %[1]s.api_tokens';
		CREATE FUNCTION %[1]s."Mixed"() RETURNS int LANGUAGE sql AS 'SELECT 1'`, schema))
	conn.Close(ctx)
	if err != nil {
		t.Fatal(err)
	}
	orders := []toolgate.Resource{{Type: ResourceTable, Name: "shop." + schema + ".orders", Action: "read"}}
	tests := []struct {
		name    string
		allowed []string
		query   string
		want    []toolgate.Resource // nil: refused
	}{
		{"the named function", []string{schema + ".peek_tokens"}, "SELECT peek_tokens() FROM orders", orders},
		{"written in capitals, an unquoted entry is lower case", []string{strings.ToUpper(schema) + ".PEEK_TOKENS"}, "SELECT peek_tokens() FROM orders", orders},
		{"another function spelled in capitals is not covered", []string{schema + ".peek_tokens"}, `SELECT "PEEK_TOKENS"() FROM orders`, nil},
		{"a quoted entry names it", []string{schema + `."PEEK_TOKENS"`}, `SELECT "PEEK_TOKENS"() FROM orders`, orders},
		{"a quoted entry does not name the lower-case one", []string{schema + `."PEEK_TOKENS"`}, "SELECT peek_tokens() FROM orders", nil},
		{"mixed case needs quotes", []string{schema + ".Mixed"}, `SELECT "Mixed"() FROM orders`, nil},
		{"mixed case quoted", []string{schema + `."Mixed"`}, `SELECT "Mixed"() FROM orders`, orders},
		{"a pg_catalog function off the list", []string{"pg_catalog.version"}, "SELECT version() FROM orders", orders},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			db, err := Open(ctx, Config{Name: "shop", Driver: DriverPostgres, DSN: dsn, AllowedFunctions: tc.allowed})
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			got, err := db.Tables(ctx, tc.query)
			if tc.want == nil {
				if codeOf(err) != toolgate.CodeUnsafeQuery {
					t.Fatalf("got %v, %v; want a refusal", got, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// TestValueBound checks the bound on one row (PostgreSQL) or value
// (SQLite) a result may hold while it is read (limits.rowBound): within
// it a large stored value is read and measured; past it the call fails
// with ErrResultTooLarge, a failure (not a refusal, not a broken
// connection worth a retry) that names the bound, and the database keeps
// answering.
func TestValueBound(t *testing.T) {
	ctx := context.Background()
	const big = 3 << 20 // under the 4 MiB bound at the default cap
	for _, be := range backends(t, nil) {
		t.Run(be.driver, func(t *testing.T) {
			tl := toolsFor(t, be.db, nil)[QueryName]
			// SQLite divides the bound among the values its program
			// holds (zeroblob, hex and length: 1 MiB each).
			within := map[string]string{
				DriverSQLite:   "SELECT length(hex(zeroblob(500000))) AS n",
				DriverPostgres: "SELECT length(repeat('x', 1000000))::int8 AS n",
			}[be.driver]
			r, err := tl.Run(ctx, inv(map[string]string{"query": within}))
			if err != nil {
				t.Fatalf("within the bound: %v", err)
			}
			if diff := cmp.Diff(int64(1000000), r.Structured.(QueryResult).Rows[0][0]); diff != "" {
				t.Errorf("length (-want +got):\n%s", diff)
			}
			// A row within the bound but past the cap is read, and cut.
			if be.driver == DriverPostgres {
				r, err := tl.Run(ctx, inv(map[string]string{"query": fmt.Sprintf("SELECT repeat('x', %d) AS v", big)}))
				if err != nil || !r.Truncated || len(r.Structured.(QueryResult).Rows) != 0 || len(r.Content) > builtin.DefaultResultMaxKiB<<10 {
					t.Errorf("a %d-byte row: err %v, truncated %v, %d bytes", big, err, r.Truncated, len(r.Content))
				}
			}
			for _, q := range map[string][]string{
				DriverSQLite:   {"SELECT hex(zeroblob(450000000))", "SELECT length(hex(zeroblob(3000000)))"},
				DriverPostgres: {"SELECT repeat('x', 50000000)", fmt.Sprintf("SELECT repeat('x', %d) AS a, repeat('y', %d) AS b", big, big)},
			}[be.driver] {
				_, err := tl.Run(ctx, inv(map[string]string{"query": q}))
				var te *toolgate.Error
				var ne net.Error
				switch {
				case !errors.Is(err, ErrResultTooLarge):
					t.Errorf("%s: want ErrResultTooLarge, got %v", q, err)
				case errors.As(err, &te) || errors.Is(err, driver.ErrBadConn) || errors.As(err, &ne):
					t.Errorf("%s: a refusal or a broken connection: %v", q, err)
				case !strings.Contains(err.Error(), "narrow the query") || !strings.Contains(err.Error(), "Settings.result_max_kib"):
					t.Errorf("%s: the message does not say what to do: %v", q, err)
				}
			}
			if _, err := tl.Run(ctx, inv(map[string]string{"query": "SELECT 1 AS one"})); err != nil {
				t.Errorf("after a value past the bound: %v", err)
			}
		})
	}
}

// TestFunctionsThroughViews checks that a function a view calls is held to
// the allow-list like one the query names: reading the view runs it.
func TestFunctionsThroughViews(t *testing.T) {
	ctx := context.Background()
	type viewCase struct {
		name  string
		query string
		names []string // "" refusal: the query passes
	}
	t.Run(DriverSQLite, func(t *testing.T) {
		p := sqliteFile(t)
		raw, err := sql.Open("sqlite", p)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := raw.Exec(`CREATE VIEW build AS SELECT sqlite_version() AS v;
			CREATE VIEW over_build AS SELECT v FROM build;
			CREATE VIEW fine AS SELECT lower(status) AS s FROM orders`); err != nil {
			t.Fatal(err)
		}
		raw.Close()
		db, err := Open(ctx, Config{Name: "shop", Driver: DriverSQLite, Path: p})
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		for _, tc := range []viewCase{
			{"view calling an unsafe function", "SELECT * FROM build", []string{"sqlite_version"}},
			{"view over such a view", "SELECT * FROM over_build", []string{"sqlite_version"}},
			{"view calling safe functions", "SELECT * FROM fine", nil},
		} {
			t.Run(tc.name, func(t *testing.T) { checkViewCase(t, db, tc.query, tc.names) })
		}
	})
	t.Run(DriverPostgres, func(t *testing.T) {
		if os.Getenv("TOOLGATE_PG_DSN") == "off" {
			t.Skip("TOOLGATE_PG_DSN=off")
		}
		dsn, schema := pgSchema(t)
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		_, err = conn.Exec(ctx, fmt.Sprintf(`CREATE VIEW %[1]s.peek_view AS SELECT %[1]s.peek_tokens() AS n;
			CREATE VIEW %[1]s.over_peek AS SELECT n FROM %[1]s.peek_view;
			CREATE VIEW %[1]s.op_view AS SELECT id FROM %[1]s.orders WHERE id OPERATOR(%[1]s.===) 1;
			CREATE VIEW %[1]s.setting_view AS SELECT current_setting('search_path') AS s;
			CREATE VIEW %[1]s.fine_view AS SELECT lower(status) AS s, count(*) AS n FROM %[1]s.orders GROUP BY 1`, schema))
		conn.Close(ctx)
		if err != nil {
			t.Fatal(err)
		}
		db, err := Open(ctx, Config{Name: "shop", Driver: DriverPostgres, DSN: dsn})
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		for _, tc := range []viewCase{
			{"view calling a function outside pg_catalog", "SELECT * FROM peek_view", []string{"view " + schema + ".peek_view, whose body has function", "peek_tokens"}},
			{"view over such a view", "SELECT * FROM over_peek", []string{"peek_view", "peek_tokens"}},
			{"view using a user operator", "SELECT * FROM op_view", []string{"op_view", "===", "peek_eq"}},
			{"view calling an unsafe pg_catalog function", "SELECT * FROM setting_view", []string{"setting_view", "current_setting"}},
			{"view calling safe functions", "SELECT * FROM fine_view", nil},
		} {
			t.Run(tc.name, func(t *testing.T) { checkViewCase(t, db, tc.query, tc.names) })
		}
	})
}

// checkViewCase checks one query over views: Inspect, before
// authorization, never refuses because of what a view holds (a refusal
// would describe a view the caller may not be allowed to read) and
// reports the views read; Run refuses, naming names.
func checkViewCase(t *testing.T, db *DB, query string, names []string) {
	t.Helper()
	tl := toolsFor(t, db, nil)[QueryName]
	ctx := context.Background()
	res, err := tl.Inspect(ctx, inv(map[string]string{"query": query}))
	if err != nil || len(res) == 0 {
		t.Errorf("Inspect refused before authorization, or reported nothing: %v, %v", res, err)
	}
	_, rerr := tl.Run(ctx, inv(map[string]string{"query": query}))
	if names == nil {
		if rerr != nil {
			t.Fatalf("Run: %v", rerr)
		}
		return
	}
	if codeOf(rerr) != toolgate.CodeUnsafeQuery {
		t.Fatalf("code %q, want %q (%v)", codeOf(rerr), toolgate.CodeUnsafeQuery, rerr)
	}
	for _, n := range names {
		if !strings.Contains(rerr.Error(), n) {
			t.Errorf("refusal %q does not name %q", rerr, n)
		}
	}
}

// TestResourceNamesInjective pins that a table's resource name never
// passes for another object's, with real tables whose names hold dots and
// quotes: a grant on shop.orders does not cover the table "orders.secret",
// and the schema "a.b"'s table c is apart from the schema a's table "b.c".
// Each call is decided by the real decision core with the resources
// Inspect reports.
func TestResourceNamesInjective(t *testing.T) {
	ctx := context.Background()
	type nameCase struct {
		name   string
		args   map[string]string // sql.query's or sql.describe_table's
		tool   string
		want   []string        // resource names
		grants map[string]bool // grant scope (name) → whether the call passes with it alone
	}
	run := func(t *testing.T, db *DB, cases []nameCase) {
		tl := toolsFor(t, db, nil)
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				res, err := tl[tc.tool].Inspect(ctx, inv(tc.args))
				if err != nil {
					t.Fatalf("Inspect: %v", err)
				}
				var got []string
				for _, r := range res {
					got = append(got, r.Name)
				}
				if diff := cmp.Diff(tc.want, got); diff != "" {
					t.Fatalf("resources (-want +got):\n%s", diff)
				}
				if _, err := tl[tc.tool].Run(ctx, inv(tc.args)); err != nil {
					t.Errorf("Run: %v", err)
				}
				for scope, pass := range tc.grants {
					if got := decideWith(t, scope, res); got != pass {
						t.Errorf("a grant on {name: %s} lets the call through: %v, want %v", scope, got, pass)
					}
				}
			})
		}
	}

	t.Run(DriverSQLite, func(t *testing.T) {
		p := filepath.Join(t.TempDir(), "shop.db")
		raw, err := sql.Open("sqlite", p)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := raw.Exec(`CREATE TABLE orders (id INTEGER);
			CREATE TABLE "orders.secret" (token TEXT); INSERT INTO "orders.secret" VALUES ('s3cret');
			CREATE TABLE "we""ird" (x INTEGER);
			CREATE TABLE "orders"".x" (x INTEGER);`); err != nil {
			t.Fatal(err)
		}
		raw.Close()
		db, err := Open(ctx, Config{Name: "shop", Driver: DriverSQLite, Path: p})
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		run(t, db, []nameCase{
			{"plain table", map[string]string{"query": "SELECT * FROM orders"}, QueryName, []string{"shop.orders"},
				map[string]bool{"shop": true, "shop.orders": true, `shop."orders.secret"`: false}},
			{"table with a dot", map[string]string{"query": `SELECT * FROM "orders.secret"`}, QueryName, []string{`shop."orders.secret"`},
				map[string]bool{"shop.orders": false, `shop."orders.secret"`: true, "shop": true}},
			{"table with a quote", map[string]string{"query": `SELECT * FROM "we""ird"`}, QueryName, []string{`shop."we""ird"`},
				map[string]bool{`shop."we""ird"`: true, "shop.we": false}},
			{"table with a quote and a dot", map[string]string{"query": `SELECT * FROM "orders"".x"`}, QueryName, []string{`shop."orders"".x"`},
				map[string]bool{"shop.orders": false, `shop."orders"""`: false, `shop."orders"".x"`: true}},
			{"describe a table with a dot", map[string]string{"table": `"orders.secret"`}, DescribeTableName, []string{`shop."orders.secret"`},
				map[string]bool{"shop.orders": false, `shop."orders.secret"`: true}},
			{"describe it unquoted", map[string]string{"table": "orders.secret"}, DescribeTableName, []string{`shop."orders.secret"`},
				map[string]bool{"shop.orders": false}},
		})
	})

	t.Run(DriverPostgres, func(t *testing.T) {
		if os.Getenv("TOOLGATE_PG_DSN") == "off" {
			t.Skip("TOOLGATE_PG_DSN=off")
		}
		dsn, s := pgSchema(t)
		dotted := s + ".b" // the schema "<s>.b", beside the schema <s>
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			c, err := pgx.Connect(context.Background(), dsn)
			if err == nil {
				_, _ = c.Exec(context.Background(), fmt.Sprintf(`DROP SCHEMA IF EXISTS %q CASCADE`, dotted))
				c.Close(context.Background())
			}
		})
		_, err = conn.Exec(ctx, fmt.Sprintf(`CREATE SCHEMA %[2]q; CREATE TABLE %[2]q.c (x int);
			CREATE TABLE %[1]s."b.c" (x int); CREATE TABLE %[1]s."orders.secret" (token text);
			CREATE TABLE %[1]s."we""ird" (x int)`, s, dotted))
		conn.Close(ctx)
		if err != nil {
			t.Fatal(err)
		}
		db, err := Open(ctx, Config{Name: "shop", Driver: DriverPostgres, DSN: dsn})
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		qs := fmt.Sprintf("%q", dotted)
		run(t, db, []nameCase{
			{"the schema a's table b.c", map[string]string{"query": `SELECT * FROM "b.c"`}, QueryName, []string{"shop." + s + `."b.c"`},
				map[string]bool{"shop." + s: true, "shop." + qs: false, "shop." + s + `."b.c"`: true}},
			{"the schema a.b's table c", map[string]string{"query": "SELECT * FROM " + qs + ".c"}, QueryName, []string{"shop." + qs + ".c"},
				map[string]bool{"shop." + s: false, "shop." + qs: true, "shop." + s + `."b.c"`: false}},
			{"table with a dot", map[string]string{"query": `SELECT * FROM "orders.secret"`}, QueryName, []string{"shop." + s + `."orders.secret"`},
				map[string]bool{"shop." + s + ".orders": false, "shop." + s + `."orders.secret"`: true}},
			{"table with a quote", map[string]string{"query": `SELECT * FROM "we""ird"`}, QueryName, []string{"shop." + s + `."we""ird"`},
				map[string]bool{"shop." + s + ".we": false, "shop." + s + `."we""ird"`: true}},
			{"both in one query", map[string]string{"query": `SELECT * FROM "b.c", ` + qs + ".c"}, QueryName,
				[]string{"shop." + qs + ".c", "shop." + s + `."b.c"`},
				map[string]bool{"shop." + s: false, "shop." + qs: false, "shop": true}},
			{"describe the schema a.b's table c", map[string]string{"table": qs + ".c"}, DescribeTableName, []string{"shop." + qs + ".c"},
				map[string]bool{"shop." + s: false, "shop." + qs: true}},
			{"describe the schema a's table b.c", map[string]string{"table": s + `."b.c"`}, DescribeTableName, []string{"shop." + s + `."b.c"`},
				map[string]bool{"shop." + qs: false, "shop." + s: true}},
		})
	})
}

// decideWith decides a sql.query call touching res for a principal whose
// only sql_table grant is {name: scope}, with the real decision core.
func decideWith(t *testing.T, scope string, res []toolgate.Resource) bool {
	t.Helper()
	b := &policy.Bundle{}
	q, _ := json.Marshal(scope)
	b.AddYAML("bundle.yaml", []byte(`
- {kind: Database, name: shop, driver: sqlite, path: shop.db}
- {kind: Tool, name: sql.query, tool_id: tool:sql-query, side_effect_class: read, source: {builtin: sql.query}}
- kind: Agent
  agent_id: analyst
  tool_permissions: [{tool_id: tool:sql-query, side_effect_class: read}]
- {kind: RuntimePolicy, agent_id: analyst, deployment_mode: production, tool_authorization_policy: {active_tool_set: all}}
- kind: Principal
  principal_id: user:a
  grants:
    - {resource: tool, action: invoke, scope: all}
    - {resource: sql_table, action: read, scope: {name: `+string(q)+`}}
`))
	snap, rep, err := authz.Compile(b, nil)
	if err != nil {
		t.Fatalf("compile: %v (%v)", err, rep.Errors)
	}
	d := snap.Decide(&toolgate.Call{AgentID: "analyst", Principal: "user:a", Tool: "sql_query", Resources: res})
	return d.Verdict == toolgate.Allow
}
