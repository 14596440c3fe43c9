// Package sqltool provides the built-in SQL tools sql.list_tables,
// sql.describe_table and sql.query over configured databases, SQLite
// (modernc.org/sqlite) and PostgreSQL (pgx).
//
// The point of the package is that sql.query can say, before it runs, every
// table and view a query reads, found by the database's own machinery rather
// than by matching strings, so the gateway can check a grant on each
// (docs/design.md, "The decision", check 8):
//
//   - SQLite: the statement is prepared under SQLite's authorizer callback,
//     which reports each table and view read (views, and CTE and subquery
//     bodies, are expanded by SQLite itself) and every other action, which is
//     refused unless it is part of a read. Statements are split with SQLite's
//     own sqlite3_complete.
//   - PostgreSQL: the query is parsed by PostgreSQL's parser (libpg_query,
//     github.com/pganalyze/pg_query_go/v6); relation names are scoped against
//     the CTEs visible where they appear and resolved through the catalog
//     (to_regclass, so search_path applies); views are expanded through
//     pg_depend.
//
// A view is reported, and so is everything it reads, recursively (the same
// on both databases): a grant on a view alone does not let a query read the
// tables below it. Anything but one read-only statement is refused with
// toolgate.CodeUnsafeQuery naming the statement, function or table; SQL the
// database cannot classify with toolgate.CodeUnparsableQuery. Run re-checks,
// and executes on a read-only connection (SQLite mode=ro and query_only, with
// the authorizer still enforcing) or in a READ ONLY transaction (PostgreSQL),
// under a statement timeout.
//
// The functions a query may call are an allow-list (functions.go): on
// SQLite every function the authorizer reports (views included); on
// PostgreSQL every function call, every operator (one of pg_catalog, one an
// extension installed, or one whose function is allowed), every cast or
// type whose cast function or domain constraint calls a function, and
// TABLESAMPLE methods, in the query and in the body of every view it
// reads. Config.AllowedFunctions permits more.
//
// Nothing may ask the catalog about objects the caller may not read. On
// PostgreSQL the catalog-lookup types (regclass, regproc, regtype, ...:
// regTypeNames), whose input answers whether a name exists, are refused
// as casts, literals and column definitions, through every type built on
// them, as columns of the tables and views read, and in the overloads of
// the functions called (to_tsvector('english', x) passes a regconfig);
// COLLATE names only pg_catalog's collations; and a type naming a table's
// or view's row type (NULL::t, which shows its columns) is a read of that
// table, a type name that resolves to nothing being reported like a table
// that does not exist. Inspect runs before authorization, so its
// refusals depend only on the query and on objects that are not tables
// or views: what a table or view is (a view's body, a column's type, a
// row type's fields) is checked by Run, after authorization, on both
// databases.
//
// Reading stops at the result cap: rows are read while a lower bound of
// the bytes they take in Content fits the cap, then the query is stopped
// (SQLite: the statement reset; PostgreSQL: the cursor fetched in small
// batches, in text format, so nothing is decoded past the cap) and the
// cut marked. One row (PostgreSQL, refused as it arrives) or all values a
// SQLite statement holds at once (SQLITE_LIMIT_LENGTH, divided among its
// program's steps) may hold at most max(16 x cap, 4 MiB)
// (RowBoundFactor); more fails the call with ErrResultTooLarge.
//
// Resource names are injective: a part holding '.' or '"' is quoted
// (policy.JoinName), so the table "orders.secret" is shop."orders.secret",
// which a grant on shop.orders does not cover.
//
// Known limits: on PostgreSQL, what the planner chooses implicitly is not
// seen (implicit casts, and the equality and sort operators of GROUP BY,
// DISTINCT and joins, for types defined outside pg_catalog); row-level
// policies are the table owner's. On SQLite a query naming a table or
// column that does not exist fails to prepare, so the refusal says so
// before authorization (PostgreSQL and describe_table report the name
// instead). Before authorization PostgreSQL still answers, for names on
// the search path, in which schema a table lives (its resource name) and
// whether a function, operator or type of its own exists (the refusal
// names it); the resources Inspect reports include the tables below the
// views read, so a decision's refusal may name one. The memory a query
// works in (SQLite's sorter and temporary
// tables, about 2 MiB each before they spill to disk) is bounded by the
// statement timeout, not by the cap.
package sqltool

import (
	"context"
	"database/sql/driver"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"regexp"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/toolgate/toolgate"
	"github.com/toolgate/toolgate/builtin"
	"github.com/toolgate/toolgate/policy"
)

// Function names of the tools.
const (
	ListTablesName    = "sql.list_tables"
	DescribeTableName = "sql.describe_table"
	QueryName         = "sql.query"
)

// Drivers.
const (
	DriverSQLite   = "sqlite"
	DriverPostgres = "postgres"
)

// Resource types reported by the tools.
const (
	// ResourceTable is a table or view: "<db>.<table>" (SQLite) or
	// "<db>.<schema>.<table>" (PostgreSQL).
	ResourceTable = "sql_table"
	// ResourceDatabase is a whole database, "<db>", reported by
	// sql.list_tables.
	ResourceDatabase = "sql_database"
)

// Defaults for Config fields left at zero.
const (
	DefaultStatementTimeout = 5 * time.Second
	DefaultMaxRows          = 200
	// MaxQueryBytes is the longest SQL text sql.query accepts.
	MaxQueryBytes = 64 << 10
)

// Config is one database the SQL tools may reach.
type Config struct {
	// Name identifies the database in resource names and in the tools'
	// "database" argument: lowercase letters, digits, '_' and '-', no dots.
	Name string `json:"name" yaml:"name"`
	// Driver is "sqlite" or "postgres".
	Driver string `json:"driver" yaml:"driver"`
	// DSN is the PostgreSQL connection string (URL or key=value), e.g.
	// "postgres://reader@127.0.0.1:5432/shop?sslmode=disable". Required
	// for postgres; the role should itself be read-only.
	DSN string `json:"dsn,omitempty" yaml:"dsn,omitempty"`
	// Path is the SQLite database file. Required for sqlite; the file must
	// exist and is opened read-only (never created).
	Path string `json:"path,omitempty" yaml:"path,omitempty"`
	// StatementTimeout bounds each statement (default 5s).
	StatementTimeout time.Duration `json:"statement_timeout,omitempty" yaml:"statement_timeout,omitempty"`
	// MaxRows is the most rows sql.query returns (default 200); more are
	// cut and the cut is marked.
	MaxRows int `json:"max_rows,omitempty" yaml:"max_rows,omitempty"`
	// AllowedFunctions lists PostgreSQL functions defined outside
	// pg_catalog that queries may call, as "schema.name". Every other such
	// function is refused, because its body may read tables the query
	// does not name.
	AllowedFunctions []string `json:"allowed_functions,omitempty" yaml:"allowed_functions,omitempty"`
}

var nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]*$`)

// Validate reports the first problem of c, naming the field.
func (c Config) Validate() error {
	switch {
	case !nameRE.MatchString(c.Name):
		return fmt.Errorf("database %q: name must be lowercase letters, digits, '_' or '-' (no dots)", c.Name)
	case c.Driver == DriverSQLite && c.Path == "":
		return fmt.Errorf("database %q: path is required for driver sqlite", c.Name)
	case c.Driver == DriverSQLite && c.DSN != "":
		return fmt.Errorf("database %q: dsn is for driver postgres; give path for sqlite", c.Name)
	case c.Driver == DriverPostgres && c.DSN == "":
		return fmt.Errorf("database %q: dsn is required for driver postgres", c.Name)
	case c.Driver == DriverPostgres && c.Path != "":
		return fmt.Errorf("database %q: path is for driver sqlite; give dsn for postgres", c.Name)
	case c.Driver != DriverSQLite && c.Driver != DriverPostgres:
		return fmt.Errorf("database %q: driver %q is not supported (want sqlite or postgres)", c.Name, c.Driver)
	case c.StatementTimeout < 0 || c.MaxRows < 0:
		return fmt.Errorf("database %q: statement_timeout and max_rows must not be negative", c.Name)
	}
	for _, f := range c.AllowedFunctions {
		if _, ok := parseFunctionName(f); !ok {
			return fmt.Errorf("database %q: allowed_functions entry %q must be schema.name (a part in double quotes is taken as written, an unquoted one in lower case)", c.Name, f)
		}
	}
	return nil
}

func (c Config) timeout() time.Duration {
	if c.StatementTimeout > 0 {
		return c.StatementTimeout
	}
	return DefaultStatementTimeout
}

func (c Config) maxRows() int {
	if c.MaxRows > 0 {
		return c.MaxRows
	}
	return DefaultMaxRows
}

// TableRef names a table or view: Schema is "" on SQLite.
type TableRef struct {
	Schema string `json:"schema,omitempty"`
	Name   string `json:"name"`
}

// String returns "table" or "schema.table", each part quoted as in
// resource names (policy.QuoteNamePart) when it holds '.' or '"', so that
// no two references print alike.
func (r TableRef) String() string {
	if r.Schema == "" {
		return policy.JoinName(r.Name)
	}
	return policy.JoinName(r.Schema, r.Name)
}

// resourceName is the sql_table resource name of ref in database db:
// "<db>.<table>" or "<db>.<schema>.<table>", each part quoted when it holds
// '.' or '"' (policy.JoinName), so that a grant on one object never covers
// another: the table orders.secret is db."orders.secret", apart from any
// table below db.orders, and the schema a.b's table c (db."a.b".c) is apart
// from the schema a's table b.c (db.a."b.c").
func resourceName(db string, ref TableRef) string {
	if ref.Schema == "" {
		return policy.JoinName(db, ref.Name)
	}
	return policy.JoinName(db, ref.Schema, ref.Name)
}

// parseTableArg reads a table argument of sql.describe_table. Written with
// double quotes, it is read like a resource name (policy.SplitName): up to
// maxParts parts, each quoted part as written ("orders.secret" is one
// table). Without quotes it is split at its first dot when maxParts is 2
// (schema.table) and taken whole otherwise. Names are never case-folded.
func parseTableArg(s string, maxParts int) (TableRef, error) {
	if !strings.Contains(s, `"`) {
		if maxParts == 2 {
			if sc, t, ok := strings.Cut(s, "."); ok {
				return TableRef{Schema: sc, Name: t}, nil
			}
		}
		return TableRef{Name: s}, nil
	}
	parts, ok := policy.SplitName(s)
	if !ok || len(parts) > maxParts {
		return TableRef{}, builtin.BadArguments(nil, "%s: table %q is not a table name (parts joined by '.', a part holding '.' or '\"' in double quotes, each '\"' doubled)", DescribeTableName, s)
	}
	if len(parts) == 2 {
		return TableRef{Schema: parts[0], Name: parts[1]}, nil
	}
	return TableRef{Name: parts[0]}, nil
}

// TableInfo is one entry of sql.list_tables. Type is "table" or "view"
// (PostgreSQL also "materialized_view", "foreign_table", "partitioned_table").
type TableInfo struct {
	Schema string `json:"schema,omitempty"`
	Name   string `json:"name"`
	Type   string `json:"type"`
}

// ColumnInfo is one column in sql.describe_table.
type ColumnInfo struct {
	Name       string  `json:"name"`
	Type       string  `json:"type"`
	Nullable   bool    `json:"nullable"`
	Default    *string `json:"default,omitempty"`
	PrimaryKey bool    `json:"primary_key,omitempty"`
}

// rows is what a backend returns for a query.
type rows struct {
	columns []string
	values  [][]any // JSON-ready values (see jsonValue)
	more    bool    // rows were left unread past max_rows
	cut     bool    // reading stopped at the byte cap: the next row could not be shown
}

// limits bound what sql.query reads: at most maxRows rows, and rows only
// while what they hold could still be shown within maxBytes (the result
// cap, Settings.result_max_kib).
type limits struct {
	maxRows  int
	maxBytes int
}

// Bounds on what sql.query reads, relative to the result cap C in bytes
// (Settings.result_max_kib; 64 KiB by default).
const (
	// RowBoundFactor and MinRowBound give the bound W = max(16 C, 4 MiB)
	// on what one row of a result may hold while it is read, before any
	// cut: on PostgreSQL, one result row as it arrives (a larger row is
	// refused as it is read); on SQLite, every value the statement holds
	// at once together (the bound of one value is W divided among the
	// steps of the statement's program that can hold one, see
	// sqliteValueBound). A larger row or value fails the call with
	// ErrResultTooLarge.
	RowBoundFactor = 16
	MinRowBound    = 4 << 20
	// MinValueBound is the least bound of one SQLite value, however many
	// steps the program has.
	MinValueBound = 1 << 10
)

// rowBound is W, the bound on one row (see RowBoundFactor).
func (l limits) rowBound() int { return max(RowBoundFactor*l.maxBytes, MinRowBound) }

// ErrResultTooLarge is wrapped by the error of a query whose result holds
// a row (PostgreSQL) or a value (SQLite) larger than the bound on one row
// (see RowBoundFactor): the call fails, saying the bound, rather than
// the gateway holding it. It is a failure of the call, not a refusal, and
// the same query fails again.
var ErrResultTooLarge = errors.New("the result is too large to read")

// collector gathers the rows of a result while they can still be shown:
// it keeps a lower bound of the bytes the text rendering of the rows so
// far takes (render's Content), and refuses a row once that bound passes
// the cap, so that reading stops at about the cap, however the result is
// shaped.
type collector struct {
	lim  limits
	out  rows
	used int // lower bound of the bytes of Content so far
}

func newCollector(lim limits, columns []string) *collector {
	c := &collector{lim: lim, out: rows{columns: columns}}
	c.used = len(strings.Join(columns, " | ")) + 1
	return c
}

// room reports, when there is another row, whether it may be read at
// all: false (and the result marked) once max_rows rows are held or
// nothing more could be shown.
func (c *collector) room() bool {
	switch {
	case len(c.out.values) >= c.lim.maxRows:
		c.out.more = true
		return false
	case c.used >= c.lim.maxBytes:
		c.out.cut = true
		return false
	}
	return true
}

// fits reports whether a row whose text takes at least n bytes can still
// be shown; when not, the result is marked cut and reading should stop.
func (c *collector) fits(n int) bool {
	if c.used+n > c.lim.maxBytes {
		c.out.cut = true
		return false
	}
	return true
}

// add keeps a row of JSON-ready values whose text takes at least n bytes.
func (c *collector) add(vals []any, n int) {
	c.used += n
	c.out.values = append(c.out.values, vals)
}

// rowTextMin is the least number of bytes a row's line takes in Content
// when its cells take at least cells bytes: the cells, " | " between
// them and the newline.
func rowTextMin(ncols, cells int) int { return cells + 3*max(ncols-1, 0) + 1 }

// cellTextMin is a lower bound of len(cellText(jsonValue(v))) for a value
// as a driver returns it, computed without copying v.
func cellTextMin(v any) int {
	switch x := v.(type) {
	case nil:
		return len("NULL")
	case string:
		return len(x)
	case []byte:
		return len(x) // itself, or "\x" and hex
	case bool:
		return len("true")
	default:
		return 1
	}
}

// backend is one database engine.
type backend interface {
	// listTables lists user tables and views.
	listTables(ctx context.Context) ([]TableInfo, error)
	// resolveTable returns the canonical reference of a table argument.
	// A table that does not exist is returned as named, never as an
	// error, so that existence is not revealed before authorization.
	resolveTable(ctx context.Context, name string) (TableRef, error)
	describe(ctx context.Context, ref TableRef) ([]ColumnInfo, error)
	// inspect classifies query and returns every table and view it reads.
	inspect(ctx context.Context, query string) ([]TableRef, error)
	// run re-classifies and executes query, reading at most lim allows
	// (a collector), and fails with ErrResultTooLarge when one row or
	// value passes limits.rowBound.
	run(ctx context.Context, query string, lim limits) (rows, error)
	close() error
}

// DB is one opened database. It is safe for concurrent use.
type DB struct {
	cfg Config
	be  backend
}

// Open validates cfg and connects (PostgreSQL: a pool, pinged; SQLite: the
// file opened read-only and its schema read). Close releases it.
func Open(ctx context.Context, cfg Config) (*DB, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	var be backend
	var err error
	switch cfg.Driver {
	case DriverSQLite:
		be, err = openSQLite(ctx, cfg)
	case DriverPostgres:
		be, err = openPostgres(ctx, cfg)
	}
	if err != nil {
		return nil, fmt.Errorf("database %q: %w", cfg.Name, err)
	}
	return &DB{cfg: cfg, be: be}, nil
}

// Name returns the configured name.
func (d *DB) Name() string { return d.cfg.Name }

// Driver returns "sqlite" or "postgres".
func (d *DB) Driver() string { return d.cfg.Driver }

// Close closes the connections.
func (d *DB) Close() error { return d.be.close() }

// Tables reports, for one query, every table and view it reads as
// "sql_table" resources, or the refusal (see the package comment). It is
// what sql.query's Inspect returns.
func (d *DB) Tables(ctx context.Context, query string) ([]toolgate.Resource, error) {
	if err := checkQueryText(query); err != nil {
		return nil, err
	}
	refs, err := d.be.inspect(ctx, query)
	if err != nil {
		return nil, err
	}
	return d.resources(refs), nil
}

func (d *DB) resources(refs []TableRef) []toolgate.Resource {
	seen := map[string]bool{}
	out := make([]toolgate.Resource, 0, len(refs))
	for _, r := range refs {
		name := resourceName(d.cfg.Name, r)
		if seen[name] {
			continue
		}
		seen[name] = true
		out = append(out, toolgate.Resource{Type: ResourceTable, Name: name, Action: "read"})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

func checkQueryText(q string) error {
	switch {
	case strings.TrimSpace(q) == "":
		return builtin.BadArguments(nil, "sql.query: query is required")
	case len(q) > MaxQueryBytes:
		return builtin.BadArguments(nil, "sql.query: query is %d bytes, more than the %d allowed", len(q), MaxQueryBytes)
	case strings.ContainsRune(q, 0):
		return builtin.BadArguments(nil, "sql.query: query contains a NUL byte")
	case !utf8.ValidString(q):
		return builtin.BadArguments(nil, "sql.query: query is not valid UTF-8")
	}
	return nil
}

// Options tune the SQL tools. nil is valid.
type Options struct {
	builtin.Options
}

// New returns sql.list_tables, sql.describe_table and sql.query over dbs,
// in that order. Each tool takes a "database" argument naming one of dbs,
// optional when there is only one. dbs must be non-empty with unique names.
func New(dbs []*DB, opts *Options) ([]builtin.Tool, error) {
	if len(dbs) == 0 {
		return nil, errors.New("sqltool: no database configured")
	}
	s := &set{byName: map[string]*DB{}}
	if opts != nil {
		s.o = *opts
	}
	for _, d := range dbs {
		if _, dup := s.byName[d.Name()]; dup {
			return nil, fmt.Errorf("sqltool: database %q configured twice", d.Name())
		}
		s.byName[d.Name()] = d
		s.names = append(s.names, d.Name())
	}
	sort.Strings(s.names)
	return []builtin.Tool{&listTablesTool{s}, &describeTool{s}, &queryTool{s}}, nil
}

type set struct {
	o      Options
	byName map[string]*DB
	names  []string
}

func (s *set) pick(tool, name string) (*DB, error) {
	if name == "" {
		if len(s.names) == 1 {
			return s.byName[s.names[0]], nil
		}
		return nil, builtin.BadArguments(nil, "%s: database is required, one of %s", tool, strings.Join(s.names, ", "))
	}
	d, ok := s.byName[name]
	if !ok {
		return nil, builtin.BadArguments(nil, "%s: unknown database %q (want one of %s)", tool, name, strings.Join(s.names, ", "))
	}
	return d, nil
}

func (s *set) dbSchema() string {
	enum, _ := json.Marshal(s.names)
	return `"database":{"type":"string","enum":` + string(enum) + `,"description":"which database; optional when only one is configured"}`
}

var (
	_ builtin.Tool = (*listTablesTool)(nil)
	_ builtin.Tool = (*describeTool)(nil)
	_ builtin.Tool = (*queryTool)(nil)
)

// ---- sql.list_tables ----

type listTablesArgs struct {
	Database string `json:"database"`
}

// ListTablesResult is sql.list_tables' Result.Structured.
type ListTablesResult struct {
	Database  string      `json:"database"`
	Tables    []TableInfo `json:"tables"`
	Truncated bool        `json:"truncated,omitempty"`
}

type listTablesTool struct{ s *set }

func (t *listTablesTool) Name() string { return ListTablesName }

func (t *listTablesTool) Spec() builtin.Spec {
	return builtin.Spec{
		Description: "Lists the tables and views of a database.",
		InputSchema: json.RawMessage(`{"type":"object","properties":{` + t.s.dbSchema() + `},"additionalProperties":false}`),
		SideEffect:  toolgate.SideEffectRead,
	}
}

func (t *listTablesTool) Inspect(ctx context.Context, inv builtin.Invocation) ([]toolgate.Resource, error) {
	var a listTablesArgs
	if err := builtin.DecodeArgs(ListTablesName, inv.Args, &a); err != nil {
		return nil, err
	}
	d, err := t.s.pick(ListTablesName, a.Database)
	if err != nil {
		return nil, err
	}
	return []toolgate.Resource{{Type: ResourceDatabase, Name: d.Name(), Action: "read"}}, nil
}

func (t *listTablesTool) Run(ctx context.Context, inv builtin.Invocation) (builtin.Result, error) {
	var a listTablesArgs
	if err := builtin.DecodeArgs(ListTablesName, inv.Args, &a); err != nil {
		return builtin.Result{}, err
	}
	d, err := t.s.pick(ListTablesName, a.Database)
	if err != nil {
		return builtin.Result{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, d.cfg.timeout())
	defer cancel()
	tables, err := d.be.listTables(ctx)
	if err != nil {
		return builtin.Result{}, fmt.Errorf("%s %s: %w", ListTablesName, d.Name(), err)
	}
	lines := make([]string, 0, len(tables))
	for _, tb := range tables {
		n := TableRef{Schema: tb.Schema, Name: tb.Name}.String()
		lines = append(lines, n+" ("+tb.Type+")")
	}
	if len(lines) == 0 {
		lines = append(lines, "(no tables)")
	}
	text, kept, cut := builtin.CutLines(lines, t.s.o.MaxBytes())
	if cut {
		tables = tables[:min(kept, len(tables))]
	}
	res := ListTablesResult{Database: d.Name(), Tables: tables, Truncated: cut}
	return builtin.Result{Content: text, Structured: res, Bytes: len(text), Truncated: cut}, nil
}

// ---- sql.describe_table ----

type describeArgs struct {
	Database string `json:"database"`
	Table    string `json:"table"`
}

// DescribeResult is sql.describe_table's Result.Structured.
type DescribeResult struct {
	Database string       `json:"database"`
	Table    TableRef     `json:"table"`
	Columns  []ColumnInfo `json:"columns"`
}

type describeTool struct{ s *set }

func (t *describeTool) Name() string { return DescribeTableName }

func (t *describeTool) Spec() builtin.Spec {
	return builtin.Spec{
		Description: "Describes one table or view: its columns, types, nullability, defaults and primary key.",
		InputSchema: json.RawMessage(`{"type":"object","properties":{` + t.s.dbSchema() +
			`,"table":{"type":"string","description":"table or view name; on PostgreSQL optionally schema.table; a part holding a dot or a double quote is written in double quotes (\"orders.secret\")"}` +
			`},"required":["table"],"additionalProperties":false}`),
		SideEffect: toolgate.SideEffectRead,
	}
}

func (t *describeTool) prepare(ctx context.Context, inv builtin.Invocation) (*DB, TableRef, error) {
	var a describeArgs
	if err := builtin.DecodeArgs(DescribeTableName, inv.Args, &a); err != nil {
		return nil, TableRef{}, err
	}
	d, err := t.s.pick(DescribeTableName, a.Database)
	if err != nil {
		return nil, TableRef{}, err
	}
	if strings.TrimSpace(a.Table) == "" || strings.ContainsRune(a.Table, 0) {
		return nil, TableRef{}, builtin.BadArguments(nil, "%s: table is required", DescribeTableName)
	}
	ctx, cancel := context.WithTimeout(ctx, d.cfg.timeout())
	defer cancel()
	ref, err := d.be.resolveTable(ctx, a.Table)
	if err != nil {
		return nil, TableRef{}, err
	}
	return d, ref, nil
}

func (t *describeTool) Inspect(ctx context.Context, inv builtin.Invocation) ([]toolgate.Resource, error) {
	d, ref, err := t.prepare(ctx, inv)
	if err != nil {
		return nil, err
	}
	return d.resources([]TableRef{ref}), nil
}

func (t *describeTool) Run(ctx context.Context, inv builtin.Invocation) (builtin.Result, error) {
	d, ref, err := t.prepare(ctx, inv)
	if err != nil {
		return builtin.Result{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, d.cfg.timeout())
	defer cancel()
	cols, err := d.be.describe(ctx, ref)
	if err != nil {
		return builtin.Result{}, err
	}
	lines := []string{resourceName(d.Name(), ref)}
	for _, c := range cols {
		l := "  " + c.Name + " " + c.Type
		if !c.Nullable {
			l += " NOT NULL"
		}
		if c.Default != nil {
			l += " DEFAULT " + *c.Default
		}
		if c.PrimaryKey {
			l += " PRIMARY KEY"
		}
		lines = append(lines, l)
	}
	text, kept, cut := builtin.CutLines(lines, t.s.o.MaxBytes())
	if cut {
		cols = cols[:max(kept-1, 0)]
	}
	res := DescribeResult{Database: d.Name(), Table: ref, Columns: cols}
	return builtin.Result{Content: text, Structured: res, Bytes: len(text), Truncated: cut}, nil
}

// ---- sql.query ----

type queryArgs struct {
	Database string `json:"database"`
	Query    string `json:"query"`
}

// QueryResult is sql.query's Result.Structured: column names and rows of
// JSON values (numbers, strings, booleans, null; times as RFC 3339 text,
// binary as "\x" hex, PostgreSQL json as JSON), cut to the rows Content
// shows.
type QueryResult struct {
	Database  string   `json:"database"`
	Columns   []string `json:"columns"`
	Rows      [][]any  `json:"rows"`
	Truncated bool     `json:"truncated,omitempty"`
}

type queryTool struct{ s *set }

func (t *queryTool) Name() string { return QueryName }

func (t *queryTool) Spec() builtin.Spec {
	return builtin.Spec{
		Description: "Runs one read-only SQL query (a single SELECT, WITH … SELECT, VALUES or TABLE statement) " +
			"and returns its columns and rows. Writes, DDL, PRAGMA, ATTACH and transaction control are refused, " +
			"and so is any function that is not on the list of those known to be safe (core, date, math, JSON, " +
			"aggregate and window functions).",
		InputSchema: json.RawMessage(`{"type":"object","properties":{` + t.s.dbSchema() +
			`,"query":{"type":"string","description":"exactly one read-only SQL statement"}` +
			`},"required":["query"],"additionalProperties":false}`),
		SideEffect: toolgate.SideEffectRead,
	}
}

func (t *queryTool) prepare(inv builtin.Invocation) (*DB, string, error) {
	var a queryArgs
	if err := builtin.DecodeArgs(QueryName, inv.Args, &a); err != nil {
		return nil, "", err
	}
	d, err := t.s.pick(QueryName, a.Database)
	if err != nil {
		return nil, "", err
	}
	if err := checkQueryText(a.Query); err != nil {
		return nil, "", err
	}
	return d, a.Query, nil
}

func (t *queryTool) Inspect(ctx context.Context, inv builtin.Invocation) ([]toolgate.Resource, error) {
	d, q, err := t.prepare(inv)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, d.cfg.timeout())
	defer cancel()
	return d.Tables(ctx, q)
}

func (t *queryTool) Run(ctx context.Context, inv builtin.Invocation) (builtin.Result, error) {
	d, q, err := t.prepare(inv)
	if err != nil {
		return builtin.Result{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, d.cfg.timeout())
	defer cancel()
	lim := limits{maxRows: d.cfg.maxRows(), maxBytes: t.s.o.MaxBytes()}
	out, err := d.be.run(ctx, q, lim)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) || errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return builtin.Result{}, fmt.Errorf("%s %s: the query ran longer than the statement timeout %s: %w", QueryName, d.Name(), d.cfg.timeout(), err)
		}
		return builtin.Result{}, err
	}
	return render(d.Name(), out, lim), nil
}

// render builds the text table and the structured result, both cut to the
// byte cap and holding the same rows. The last line says how the result
// ends: "(N rows)"; "[truncated: first N rows shown; max_rows is M]"; or,
// when the rows (read, or readable) do not fit the cap, "[truncated:
// first N rows shown; the result is larger than the C-byte cap
// (Settings.result_max_kib)]".
func render(db string, r rows, lim limits) builtin.Result {
	header := strings.Join(r.columns, " | ")
	lines := make([]string, len(r.values))
	jsonLen := make([]int, len(r.values))
	textLen, jsonTotal := len(header)+1, 0
	for i, row := range r.values {
		cells := make([]string, len(row))
		for j, v := range row {
			cells[j] = cellText(v)
		}
		lines[i] = strings.Join(cells, " | ")
		b, _ := json.Marshal(row)
		jsonLen[i] = len(b) + 1
		textLen += len(lines[i]) + 1
		jsonTotal += jsonLen[i]
	}
	n := len(r.values)
	footer := fmt.Sprintf("(%d rows)", n)
	switch {
	case n == 1:
		footer = "(1 row)"
	case r.more:
		footer = fmt.Sprintf("[truncated: first %d rows shown; max_rows is %d]", n, lim.maxRows)
	}
	cut := r.cut || textLen+len(footer) > lim.maxBytes || jsonTotal > lim.maxBytes
	if cut {
		// Keep the longest prefix of rows that fits, as text with the
		// marker and as JSON.
		marker := func(k int) string {
			return fmt.Sprintf("[truncated: first %d rows shown; the result is larger than the %d-byte cap (Settings.result_max_kib)]", k, lim.maxBytes)
		}
		reserve := len(marker(n))
		textLen, jsonTotal = len(header)+1, 0
		k := 0
		for k < n && textLen+len(lines[k])+1+reserve <= lim.maxBytes && jsonTotal+jsonLen[k] <= lim.maxBytes {
			textLen += len(lines[k]) + 1
			jsonTotal += jsonLen[k]
			k++
		}
		n, lines, footer = k, lines[:k], marker(k)
	}
	text := strings.Join(append(append([]string{header}, lines...), footer), "\n")
	if len(text) > lim.maxBytes { // only a header longer than the cap
		text, _ = builtin.Cap(text, lim.maxBytes)
		n, cut = 0, true
	}
	res := QueryResult{Database: db, Columns: r.columns, Rows: r.values[:n], Truncated: cut || r.more}
	if res.Rows == nil {
		res.Rows = [][]any{}
	}
	return builtin.Result{Content: text, Structured: res, Bytes: len(text), Truncated: res.Truncated}
}

func cellText(v any) string {
	switch v := v.(type) {
	case nil:
		return "NULL"
	case string:
		return strings.NewReplacer("\n", `\n`, "\r", `\r`).Replace(v)
	default:
		b, err := json.Marshal(v)
		if err != nil {
			return fmt.Sprint(v)
		}
		return string(b)
	}
}

// jsonValue turns a value scanned from a driver into one encoding/json
// renders faithfully.
func jsonValue(v any) any {
	switch x := v.(type) {
	case nil, bool, string, int, int8, int16, int32, int64, uint8, uint16, uint32, uint64:
		return x
	case float64:
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return fmt.Sprint(x)
		}
		return x
	case float32:
		return jsonValue(float64(x))
	case time.Time:
		return x.Format(time.RFC3339Nano)
	case []byte:
		if utf8.Valid(x) {
			return string(x)
		}
		return `\x` + hex.EncodeToString(x)
	case [16]byte: // PostgreSQL uuid
		h := hex.EncodeToString(x[:])
		return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
	case map[string]any:
		m := make(map[string]any, len(x))
		for k, e := range x {
			m[k] = jsonValue(e)
		}
		return m
	case []any:
		s := make([]any, len(x))
		for i, e := range x {
			s[i] = jsonValue(e)
		}
		return s
	case driver.Valuer:
		dv, err := x.Value()
		if err != nil {
			return fmt.Sprint(v)
		}
		if _, same := dv.(driver.Valuer); same {
			return fmt.Sprint(dv)
		}
		return jsonValue(dv)
	case fmt.Stringer:
		return x.String()
	default:
		if b, err := json.Marshal(x); err == nil && json.Valid(b) {
			var out any
			if json.Unmarshal(b, &out) == nil {
				return out
			}
		}
		return fmt.Sprint(x)
	}
}

func sortTables(ts []TableInfo) {
	sort.Slice(ts, func(i, j int) bool {
		if ts[i].Schema != ts[j].Schema {
			return ts[i].Schema < ts[j].Schema
		}
		return ts[i].Name < ts[j].Name
	})
}

// Check reports whether cfg can be opened, as Open would, without keeping
// anything open and without writing: the configuration is validated; a
// SQLite file is opened read-only, its schema read, and closed; a
// PostgreSQL DSN is parsed, and with connect the server is also reached
// and pinged (no connection stays open). Errors are Open's.
func Check(ctx context.Context, cfg Config, connect bool) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	if cfg.Driver == DriverPostgres && !connect {
		if _, err := pgxpool.ParseConfig(cfg.DSN); err != nil {
			return fmt.Errorf("database %q: dsn: %w", cfg.Name, err)
		}
		return nil
	}
	db, err := Open(ctx, cfg)
	if err != nil {
		return err
	}
	return db.Close()
}
