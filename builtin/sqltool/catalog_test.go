package sqltool

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"

	"github.com/toolgate/toolgate"
)

// catalogCase is one query probing the catalog: Inspect (before
// authorization) either refuses with inspect or reports tables (names
// below the database, "{schema}" replaced); Run (after it) ends with run
// ("other" for a failure that is not a refusal) and its refusal names
// names.
type catalogCase struct {
	name    string
	query   string
	inspect toolgate.Code
	tables  []string
	run     toolgate.Code
	names   []string
}

const unsafeQ = toolgate.CodeUnsafeQuery

// TestCatalogOracles pins the class "a query learns about an object the
// caller may not read": PostgreSQL's catalog-lookup (reg*) types answer
// whether a name exists ('r7.secret'::regclass gives an oid or "does not
// exist"), and so do functions that take or return one, collations named
// outside pg_catalog, and a table's row type named as a type (which shows
// its columns). Each is refused, or reported as the table it reveals, in
// the query and in the views it reads; no refusal before authorization
// depends on what a table or view is. On SQLite the catalog is reached
// only through sqlite_master (a resource like any table) and the
// table-valued pragma functions (refused).
func TestCatalogOracles(t *testing.T) {
	t.Run(DriverPostgres, func(t *testing.T) {
		if os.Getenv("TOOLGATE_PG_DSN") == "off" {
			t.Skip("TOOLGATE_PG_DSN=off")
		}
		ctx := context.Background()
		dsn, schema := pgSchema(t)
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		_, err = conn.Exec(ctx, fmt.Sprintf(`
			CREATE DOMAIN %[1]s.rc AS regclass;
			CREATE TYPE %[1]s.holds_rc AS (r regclass);
			CREATE TYPE %[1]s.plain AS (a int, b text);
			CREATE TABLE %[1]s.reg_holder (id int, r regclass);
			CREATE VIEW %[1]s.reg_view AS SELECT id, r FROM %[1]s.reg_holder;
			CREATE VIEW %[1]s.no_reg_view AS SELECT id FROM %[1]s.reg_holder;
			CREATE VIEW %[1]s.cast_view AS SELECT 'api_tokens'::regclass::oid AS o;
			CREATE VIEW %[1]s.typeof_view AS SELECT pg_typeof(1)::text AS t;
			CREATE VIEW %[1]s.rowtype_view AS SELECT (NULL::%[1]s.api_tokens).id AS id`, schema))
		conn.Close(ctx)
		if err != nil {
			t.Fatal(err)
		}
		db, err := Open(ctx, Config{Name: "shop", Driver: DriverPostgres, DSN: dsn})
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		cases := []catalogCase{
			// every reg* type, however it is written
			{"regclass cast, the finding", "SELECT 'r7.secret'::regclass::oid", unsafeQ, nil, unsafeQ, []string{"regclass", "existence oracle"}},
			{"regclass of a table that exists", "SELECT 'api_tokens'::regclass::oid", unsafeQ, nil, unsafeQ, []string{"regclass"}},
			{"CAST syntax", "SELECT CAST('orders' AS regclass)", unsafeQ, nil, unsafeQ, []string{"regclass"}},
			{"typed literal", "SELECT regclass 'orders'", unsafeQ, nil, unsafeQ, []string{"regclass"}},
			{"qualified and quoted", `SELECT 'orders'::pg_catalog."regclass"`, unsafeQ, nil, unsafeQ, []string{"regclass"}},
			{"array of regclass", "SELECT '{orders}'::regclass[]", unsafeQ, nil, unsafeQ, []string{"regclass"}},
			{"array type by its own name", "SELECT '{orders}'::_regclass", unsafeQ, nil, unsafeQ, []string{"_regclass", "built on regclass"}},
			{"regproc", "SELECT 'lower'::regproc", unsafeQ, nil, unsafeQ, []string{"regproc"}},
			{"regprocedure", "SELECT 'lower(text)'::regprocedure", unsafeQ, nil, unsafeQ, []string{"regprocedure"}},
			{"regoper", "SELECT '!'::regoper", unsafeQ, nil, unsafeQ, []string{"regoper"}},
			{"regoperator", "SELECT '+(int4,int4)'::regoperator", unsafeQ, nil, unsafeQ, []string{"regoperator"}},
			{"regtype", "SELECT 'int4'::regtype", unsafeQ, nil, unsafeQ, []string{"regtype"}},
			{"regnamespace", "SELECT 'r7'::regnamespace", unsafeQ, nil, unsafeQ, []string{"regnamespace"}},
			{"regrole", "SELECT 'postgres'::regrole", unsafeQ, nil, unsafeQ, []string{"regrole"}},
			{"regconfig", "SELECT 'english'::regconfig", unsafeQ, nil, unsafeQ, []string{"regconfig"}},
			{"regdictionary", "SELECT 'simple'::regdictionary", unsafeQ, nil, unsafeQ, []string{"regdictionary"}},
			{"regcollation", `SELECT 'C'::regcollation`, unsafeQ, nil, unsafeQ, []string{"regcollation"}},
			{"aclitem names a role", "SELECT 'r7=r/postgres'::aclitem", unsafeQ, nil, unsafeQ, []string{"aclitem"}},
			{"aclitem array", "SELECT '{}'::aclitem[]", unsafeQ, nil, unsafeQ, []string{"aclitem"}},
			{"column definition list", `SELECT r FROM json_to_record('{"r": "orders"}') AS x(r regclass)`, unsafeQ, nil, unsafeQ, []string{"regclass"}},
			{"in a subquery of WHERE", "SELECT id FROM orders WHERE id IN (SELECT 'orders'::regclass::oid::int)", unsafeQ, nil, unsafeQ, []string{"regclass"}},
			{"domain over regclass", "SELECT 'orders'::rc", unsafeQ, nil, unsafeQ, []string{"rc", "built on regclass"}},
			{"composite holding regclass", "SELECT '(orders)'::holds_rc", unsafeQ, nil, unsafeQ, []string{"holds_rc", "built on regclass"}},
			// functions with a reg* in the overload PostgreSQL may pick
			{"to_regclass", "SELECT to_regclass('r7.secret')", unsafeQ, nil, unsafeQ, []string{"to_regclass"}},
			{"to_regproc", "SELECT to_regproc('lower')", unsafeQ, nil, unsafeQ, []string{"to_regproc"}},
			{"to_regtype", "SELECT to_regtype('r7.secret')", unsafeQ, nil, unsafeQ, []string{"to_regtype"}},
			{"to_regnamespace", "SELECT to_regnamespace('r7')", unsafeQ, nil, unsafeQ, []string{"to_regnamespace"}},
			{"pg_typeof, which returns a regtype", "SELECT pg_typeof(1) = 'r7.secret'", unsafeQ, nil, unsafeQ, []string{"pg_typeof"}},
			{"text search configuration by name", "SELECT to_tsvector('english', 'a cat')", unsafeQ, nil, unsafeQ, []string{"to_tsvector", "regconfig"}},
			{"ts_headline with a configuration", "SELECT ts_headline('english', 'a cat', to_tsquery('cat'))", unsafeQ, nil, unsafeQ, []string{"ts_headline", "regconfig"}},
			{"text search with the default configuration", "SELECT to_tsvector('a cat') @@ to_tsquery('cat') AS m", "", nil, "", nil},
			{"ts_headline without a configuration", "SELECT ts_headline('a cat', to_tsquery('cat')) AS h", "", nil, "", nil},
			// collations
			{"collation of pg_catalog", `SELECT 'a' COLLATE "C" < 'b' AS lt`, "", nil, "", nil},
			{"collation qualified pg_catalog", `SELECT 'a' COLLATE pg_catalog."POSIX" AS a`, "", nil, "", nil},
			{"collation in another schema", `SELECT 'a' COLLATE r7."C"`, unsafeQ, nil, unsafeQ, []string{`COLLATE r7.C`, "pg_catalog"}},
			{"collation that exists nowhere", `SELECT 'a' COLLATE no_such_collation`, unsafeQ, nil, unsafeQ, []string{"no_such_collation"}},
			// a table's row type is a read of the table
			{"row type of a table", "SELECT (NULL::api_tokens).*", "", []string{"{schema}.api_tokens"}, "", nil},
			{"row type, qualified", "SELECT (NULL::{schema}.api_tokens).*", "", []string{"{schema}.api_tokens"}, "", nil},
			{"row type in json_populate_record", `SELECT * FROM json_populate_record(NULL::api_tokens, '{}')`, "", []string{"{schema}.api_tokens"}, "", nil},
			{"array of a row type", "SELECT NULL::api_tokens[]", "", []string{"{schema}.api_tokens"}, "", nil},
			{"row type of a table that does not exist", "SELECT NULL::r7.secret", "", []string{"r7.secret"}, "other", nil},
			{"type that does not exist, unqualified", "SELECT NULL::no_such_type", "", []string{"{schema}.no_such_type"}, "other", nil},
			{"composite type of its own", "SELECT '(1,x)'::plain AS p", "", []string{}, "", nil},
			// tables and views: only after authorization
			{"table with a regclass column", "SELECT id FROM reg_holder", "", []string{"{schema}.reg_holder"}, unsafeQ, []string{"reg_holder", "column r", "regclass"}},
			{"row type of a table with a regclass column", "SELECT NULL::reg_holder", "", []string{"{schema}.reg_holder"}, unsafeQ, []string{"reg_holder", "regclass"}},
			{"view showing a regclass column", "SELECT id FROM reg_view", "", []string{"{schema}.reg_holder", "{schema}.reg_view"}, unsafeQ, []string{"reg_view", "column r"}},
			{"view hiding it", "SELECT id FROM no_reg_view", "", []string{"{schema}.no_reg_view", "{schema}.reg_holder"}, "", nil},
			{"view casting to regclass", "SELECT o FROM cast_view", "", []string{"{schema}.api_tokens", "{schema}.cast_view"}, unsafeQ, []string{"view " + schema + ".cast_view", "regclass"}},
			{"view calling pg_typeof", "SELECT t FROM typeof_view", "", []string{"{schema}.typeof_view"}, unsafeQ, []string{"typeof_view", "pg_typeof"}},
			{"catalog table with aclitem and regproc columns", "SELECT proname FROM pg_catalog.pg_proc LIMIT 1", "", []string{"pg_catalog.pg_proc"}, unsafeQ, []string{"pg_proc", "column"}},
			{"view naming a row type", "SELECT id FROM rowtype_view", "", []string{"{schema}.api_tokens", "{schema}.rowtype_view"}, "", nil},
		}
		runCatalogCases(t, db, "shop.", schema, cases)

		// allowed_functions cannot permit a function whose signature has
		// a catalog-lookup type.
		db2, err := Open(ctx, Config{Name: "shop", Driver: DriverPostgres, DSN: dsn, AllowedFunctions: []string{"pg_catalog.pg_typeof", "pg_catalog.to_regclass"}})
		if err != nil {
			t.Fatal(err)
		}
		defer db2.Close()
		runCatalogCases(t, db2, "shop.", schema, []catalogCase{
			{"pg_typeof, allowed by name", "SELECT pg_typeof(1)", unsafeQ, nil, unsafeQ, []string{"pg_typeof", "regtype"}},
			{"to_regclass, allowed by name", "SELECT to_regclass('r7.secret')", unsafeQ, nil, unsafeQ, []string{"to_regclass", "regclass"}},
		})
	})
	t.Run(DriverSQLite, func(t *testing.T) {
		ctx := context.Background()
		p := sqliteFile(t)
		raw, err := sql.Open("sqlite", p)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := raw.Exec(`CREATE VIEW pragma_view AS SELECT name FROM pragma_table_info('api_tokens');
			CREATE VIEW master_view AS SELECT name FROM sqlite_master`); err != nil {
			t.Fatal(err)
		}
		raw.Close()
		db, err := Open(ctx, Config{Name: "shop", Driver: DriverSQLite, Path: p})
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		runCatalogCases(t, db, "shop.", "", []catalogCase{
			{"sqlite_master is a table to grant", "SELECT name FROM sqlite_master", "", []string{"sqlite_master"}, "", nil},
			{"sqlite_schema is the same table", "SELECT name FROM sqlite_schema", "", []string{"sqlite_master"}, "", nil},
			{"main.sqlite_master", "SELECT name FROM main.sqlite_master", "", []string{"sqlite_master"}, "", nil},
			{"temp.sqlite_master", "SELECT name FROM temp.sqlite_master", unsafeQ, nil, unsafeQ, []string{"temp"}},
			{"sqlite_temp_master", "SELECT name FROM sqlite_temp_master", unsafeQ, nil, unsafeQ, []string{"temp"}},
			{"pragma_table_info", "SELECT name FROM pragma_table_info('api_tokens')", unsafeQ, nil, unsafeQ, []string{"pragma_table_info"}},
			{"pragma_table_xinfo counted", "SELECT count(*) FROM pragma_table_xinfo('api_tokens')", unsafeQ, nil, unsafeQ, []string{"pragma_table_xinfo"}},
			{"pragma_table_list", "SELECT name FROM pragma_table_list", unsafeQ, nil, unsafeQ, []string{"pragma_table_list"}},
			{"pragma_index_list", "SELECT * FROM pragma_index_list('orders')", unsafeQ, nil, unsafeQ, []string{"pragma_index_list"}},
			{"pragma_function_list", "SELECT name FROM pragma_function_list", unsafeQ, nil, unsafeQ, []string{"pragma_function_list"}},
			{"pragma_table_info in a CTE", "WITH c AS (SELECT name FROM pragma_table_info('api_tokens')) SELECT * FROM c", unsafeQ, nil, unsafeQ, []string{"pragma_table_info"}},
			{"dbstat", "SELECT name FROM dbstat", unsafeQ, nil, unsafeQ, []string{"dbstat"}},
			{"sqlite_offset", "SELECT sqlite_offset(id) FROM orders", unsafeQ, nil, unsafeQ, []string{"sqlite_offset"}},
			{"view reading a pragma function", "SELECT name FROM pragma_view", "", []string{"pragma_view"}, unsafeQ, []string{"pragma_table_info"}},
			{"view reading sqlite_master", "SELECT name FROM master_view", "", []string{"master_view", "sqlite_master"}, "", nil},
		})
	})
}

func runCatalogCases(t *testing.T, db *DB, prefix, schema string, cases []catalogCase) {
	t.Helper()
	tl := toolsFor(t, db, nil)[QueryName]
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			q := strings.ReplaceAll(tc.query, "{schema}", schema)
			got, err := tl.Inspect(ctx, inv(map[string]string{"query": q}))
			if diff := cmp.Diff(tc.inspect, codeOf(err)); diff != "" {
				t.Fatalf("Inspect code (-want +got):\n%s\nerr: %v", diff, err)
			}
			if tc.inspect == "" && tc.tables != nil {
				want := []string{}
				for _, n := range tc.tables {
					want = append(want, prefix+strings.ReplaceAll(n, "{schema}", schema))
				}
				sort.Strings(want)
				names := []string{}
				for _, r := range got {
					names = append(names, r.Name)
				}
				if diff := cmp.Diff(want, names); diff != "" {
					t.Errorf("Inspect resources (-want +got):\n%s", diff)
				}
			}
			_, rerr := tl.Run(ctx, inv(map[string]string{"query": q}))
			if diff := cmp.Diff(tc.run, codeOf(rerr)); diff != "" {
				t.Fatalf("Run code (-want +got):\n%s\nerr: %v", diff, rerr)
			}
			for _, n := range tc.names {
				if !strings.Contains(rerr.Error(), n) {
					t.Errorf("refusal %q does not name %q", rerr, n)
				}
			}
		})
	}
}
