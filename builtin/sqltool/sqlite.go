package sqltool

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"modernc.org/libc"
	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/toolgate/toolgate"
	"github.com/toolgate/toolgate/builtin"
)

// sqliteBackend reaches one SQLite file through its own driver instance.
// Every connection carries an authorizer from the moment it opens: one that
// denies everything, swapped for a recording or enforcing one only while this
// package prepares or runs a statement on it, and swapped back after.
type sqliteBackend struct {
	cfg Config
	db  *sql.DB
}

// harmlessVTabs are SQLite's eponymous table-valued functions that compute
// rows from their arguments alone; reading them touches no table.
var harmlessVTabs = map[string]bool{"json_each": true, "json_tree": true, "jsonb_each": true, "jsonb_tree": true}

// knownVTabs are eponymous virtual tables that some SQLite builds carry;
// reading them, even only counting their rows, is refused.
var knownVTabs = map[string]bool{
	"dbstat": true, "sqlite_dbpage": true, "sqlite_dbdata": true, "sqlite_dbptr": true, "sqlite_stmt": true,
	"generate_series": true, "carray": true, "completion": true, "zipfile": true, "fsdir": true,
	"sqlite_memstat": true, "bytecode": true, "tables_used": true, "pragma_module_list": true,
}

// readModules adds the virtual table modules of the connection.
func readModules(ctx context.Context, c *sql.Conn, into map[string]bool) error {
	rs, err := c.QueryContext(ctx, `SELECT name FROM pragma_module_list`)
	if err != nil {
		return err
	}
	defer rs.Close()
	for rs.Next() {
		var n string
		if err := rs.Scan(&n); err != nil {
			return err
		}
		into[strings.ToLower(n)] = true
	}
	return rs.Err()
}

func denyAll(sqlite.AuthorizerActionCode, string, string, string, string) sqlite.AuthorizerReturnCode {
	return sqlite.AuthorizerDeny
}

func allowAll(sqlite.AuthorizerActionCode, string, string, string, string) sqlite.AuthorizerReturnCode {
	return sqlite.AuthorizerOK
}

// MaxValueBytes bounds one string or blob any statement on a SQLite
// connection of this package may build or read (its own schema reads
// included); sql.query's statements have the lower bound of
// sqliteValueBound.
const MaxValueBytes = 16 << 20

// sqliteLimitLength is SQLITE_LIMIT_LENGTH.
const sqliteLimitLength = 0

type sqliteConnector struct {
	d   *sqlite.Driver
	dsn string
}

func (c sqliteConnector) Connect(ctx context.Context) (driver.Conn, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return c.d.Open(c.dsn)
}

func (c sqliteConnector) Driver() driver.Driver { return c.d }

func openSQLite(ctx context.Context, cfg Config) (*sqliteBackend, error) {
	abs, err := filepath.Abs(cfg.Path)
	if err != nil {
		return nil, err
	}
	fi, err := os.Stat(abs)
	if err != nil {
		return nil, fmt.Errorf("sqlite file: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("sqlite file %s is not a regular file", abs)
	}
	// mode=ro: never create, never write; query_only: a second guard.
	u := url.URL{Scheme: "file", Path: abs, RawQuery: "mode=ro&_query_only=1"}
	d := &sqlite.Driver{}
	d.RegisterConnectionHook(func(c sqlite.ExecQuerierContext, _ string) error {
		reg, ok := c.(sqlite.AuthorizerRegisterer)
		if !ok {
			return errors.New("the sqlite driver does not support an authorizer")
		}
		return reg.RegisterAuthorizer(denyAll)
	})
	db := sql.OpenDB(sqliteConnector{d: d, dsn: u.String()})
	db.SetMaxOpenConns(4)
	be := &sqliteBackend{cfg: cfg, db: db}
	if _, err := be.schema(ctx); err != nil {
		db.Close()
		return nil, err
	}
	return be, nil
}

func (b *sqliteBackend) close() error { return b.db.Close() }

// withConn runs fn on one connection with the authorizer auth installed,
// and puts the deny-all authorizer back after. A connection whose
// authorizer cannot be restored is discarded.
func (b *sqliteBackend) withConn(ctx context.Context, auth sqlite.AuthorizerFn, fn func(c *sql.Conn, raw any) error) error {
	c, err := b.db.Conn(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	// Bound every string and blob a statement may build (zeroblob(450e6)
	// would otherwise take gigabytes); run lowers it for the query.
	if _, err := sqlite.Limit(c, sqliteLimitLength, MaxValueBytes); err != nil {
		return err
	}
	var raw any
	if err := c.Raw(func(dc any) error {
		reg, ok := dc.(sqlite.AuthorizerRegisterer)
		if !ok {
			return errors.New("the sqlite driver does not support an authorizer")
		}
		raw = dc
		return reg.RegisterAuthorizer(auth)
	}); err != nil {
		return err
	}
	defer c.Raw(func(dc any) error {
		if err := dc.(sqlite.AuthorizerRegisterer).RegisterAuthorizer(denyAll); err != nil {
			return driver.ErrBadConn
		}
		return nil
	})
	return fn(c, raw)
}

type schemaEntry struct{ name, typ string }

// schema reads the tables and views, keyed by lowercase name.
func (b *sqliteBackend) schema(ctx context.Context) (map[string]schemaEntry, error) {
	m := map[string]schemaEntry{}
	err := b.withConn(ctx, allowAll, func(c *sql.Conn, _ any) error {
		rs, err := c.QueryContext(ctx, `SELECT name, type FROM sqlite_schema WHERE type IN ('table', 'view') ORDER BY name`)
		if err != nil {
			return err
		}
		defer rs.Close()
		for rs.Next() {
			var e schemaEntry
			if err := rs.Scan(&e.name, &e.typ); err != nil {
				return err
			}
			m[strings.ToLower(e.name)] = e
		}
		return rs.Err()
	})
	if err != nil {
		return nil, fmt.Errorf("read schema: %w", err)
	}
	return m, nil
}

func (b *sqliteBackend) listTables(ctx context.Context) ([]TableInfo, error) {
	m, err := b.schema(ctx)
	if err != nil {
		return nil, err
	}
	out := []TableInfo{}
	for _, e := range m {
		if strings.HasPrefix(strings.ToLower(e.name), "sqlite_") {
			continue
		}
		out = append(out, TableInfo{Name: e.name, Type: e.typ})
	}
	sortTables(out)
	return out, nil
}

func (b *sqliteBackend) resolveTable(ctx context.Context, name string) (TableRef, error) {
	n := name
	if strings.Contains(name, `"`) {
		ref, err := parseTableArg(name, 2)
		if err != nil {
			return TableRef{}, err
		}
		if ref.Schema != "" && !strings.EqualFold(ref.Schema, "main") {
			return TableRef{}, builtin.BadArguments(nil, "%s: table %q: only the main database's tables can be described", DescribeTableName, name)
		}
		n = ref.Name
	} else if s, t, ok := strings.Cut(name, "."); ok && strings.EqualFold(s, "main") {
		n = t
	}
	m, err := b.schema(ctx)
	if err != nil {
		return TableRef{}, err
	}
	if e, ok := m[strings.ToLower(n)]; ok {
		return TableRef{Name: e.name}, nil
	}
	return TableRef{Name: n}, nil // reported as named; describe says it does not exist
}

func (b *sqliteBackend) describe(ctx context.Context, ref TableRef) ([]ColumnInfo, error) {
	m, err := b.schema(ctx)
	if err != nil {
		return nil, err
	}
	if _, ok := m[strings.ToLower(ref.Name)]; !ok {
		return nil, builtin.BadArguments(nil, "%s: table %q does not exist in database %q", DescribeTableName, ref.Name, b.cfg.Name)
	}
	var cols []ColumnInfo
	err = b.withConn(ctx, allowAll, func(c *sql.Conn, _ any) error {
		rs, err := c.QueryContext(ctx, `SELECT name, type, "notnull", dflt_value, pk, hidden FROM pragma_table_xinfo(?) ORDER BY cid`, ref.Name)
		if err != nil {
			return err
		}
		defer rs.Close()
		for rs.Next() {
			var (
				col         ColumnInfo
				notNull, pk int
				hidden      int
				dflt        sql.NullString
				typ         sql.NullString
				name        string
			)
			if err := rs.Scan(&name, &typ, &notNull, &dflt, &pk, &hidden); err != nil {
				return err
			}
			if hidden == 1 { // a virtual table's hidden column
				continue
			}
			col = ColumnInfo{Name: name, Type: typ.String, Nullable: notNull == 0 && pk == 0, PrimaryKey: pk > 0}
			if dflt.Valid {
				col.Default = &dflt.String
			}
			cols = append(cols, col)
		}
		return rs.Err()
	})
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", DescribeTableName, ref.Name, err)
	}
	return cols, nil
}

// authEvent is one call of SQLite's authorizer.
type authEvent struct {
	action      sqlite.AuthorizerActionCode
	arg1, arg2  string
	dbName, ctx string
}

// guard records authorizer calls and denies every action that is not part
// of reading. In enforcing mode (tables != nil) it also denies reading any
// table not in tables.
//
// While a statement is only prepared for analysis, never stepped, the writes
// to sqlite_master that come with DDL are recorded and allowed, so that
// SQLite goes on to present the DDL action itself, which names what the
// statement does (DROP TABLE orders rather than DELETE FROM sqlite_master).
// Before authorization (deferViews), an action inside a view or CTE (the
// authorizer's context names it) that would be refused is recorded in
// deferred and allowed; analyze refuses those of CTEs, and leaves those
// of views to Run, so that a refusal does not describe a view the caller
// may not read.
type guard struct {
	mu         sync.Mutex
	events     []authEvent
	violation  *toolgate.Error // the first refused action
	schemaOp   *toolgate.Error // the first write to sqlite_master, when analysing
	deferred   []deferral      // refused actions inside a view or CTE, when deferring
	tables     map[string]bool
	analysing  bool
	deferViews bool
}

func (g *guard) authorize(action sqlite.AuthorizerActionCode, a1, a2, dbName, ctx string) sqlite.AuthorizerReturnCode {
	g.mu.Lock()
	defer g.mu.Unlock()
	e := authEvent{action, a1, a2, dbName, ctx}
	g.events = append(g.events, e)
	err := classify(e)
	if err == nil && g.tables != nil && action == sqlite.AuthRead && !g.tables[strings.ToLower(a1)] {
		err = builtin.Refuse(toolgate.CodeUnsafeQuery, "the query read table %s, which inspection did not report", a1)
	}
	if err == nil {
		return sqlite.AuthorizerOK
	}
	if g.analysing && isSchemaWrite(e) {
		if g.schemaOp == nil {
			g.schemaOp = err
		}
		return sqlite.AuthorizerOK // prepared only; it never runs
	}
	if g.analysing && g.deferViews && e.ctx != "" {
		g.deferred = append(g.deferred, deferral{e.ctx, err})
		return sqlite.AuthorizerOK // prepared only, never run
	}
	if g.violation == nil {
		g.violation = err
	}
	return sqlite.AuthorizerDeny
}

// deferral is a refusal of an action inside the view or CTE ctx.
type deferral struct {
	ctx string
	err *toolgate.Error
}

// refusal is the refusal to report: the statement's own action first.
func (g *guard) refusal() *toolgate.Error {
	if g.violation != nil {
		return g.violation
	}
	return g.schemaOp
}

func isSchemaWrite(e authEvent) bool {
	switch e.action {
	case sqlite.AuthInsert, sqlite.AuthUpdate, sqlite.AuthDelete:
		n := strings.ToLower(e.arg1)
		return n == "sqlite_master" || n == "sqlite_temp_master"
	}
	return false
}

// classify allows the actions of a read and refuses the rest, naming them.
func classify(e authEvent) *toolgate.Error {
	unsafe := func(format string, args ...any) *toolgate.Error {
		return builtin.Refuse(toolgate.CodeUnsafeQuery, "sql.query refused %s: only a single read-only SELECT may run", fmt.Sprintf(format, args...))
	}
	switch e.action {
	case sqlite.AuthSelect, sqlite.AuthRecursive:
		return nil
	case sqlite.AuthRead:
		if e.dbName != "" && e.dbName != "main" {
			return unsafe("reading %s.%s (only the main database may be read)", e.dbName, e.arg1)
		}
		return nil
	case sqlite.AuthFunction:
		// An allow-list (functions.go): anything else may reach files,
		// load code or show connection state.
		if !safeSQLiteFunction(e.arg2) {
			return unsafe("function %s(), which is not one of the functions known to be safe in a read-only query", e.arg2)
		}
		return nil
	case sqlite.AuthPragma:
		if e.arg2 != "" {
			return unsafe("PRAGMA %s(%s)", e.arg1, e.arg2)
		}
		return unsafe("PRAGMA %s", e.arg1)
	case sqlite.AuthAttach:
		return unsafe("ATTACH DATABASE '%s'", e.arg1)
	case sqlite.AuthDetach:
		return unsafe("DETACH DATABASE %s", e.arg1)
	case sqlite.AuthInsert:
		return unsafe("INSERT INTO %s", e.arg1)
	case sqlite.AuthUpdate:
		return unsafe("UPDATE %s (column %s)", e.arg1, e.arg2)
	case sqlite.AuthDelete:
		return unsafe("DELETE FROM %s", e.arg1)
	case sqlite.AuthTransaction:
		return unsafe("transaction statement %s", e.arg1)
	case sqlite.AuthSavepoint:
		return unsafe("SAVEPOINT %s %s", e.arg1, e.arg2)
	case sqlite.AuthCreateTable, sqlite.AuthCreateTempTable:
		return unsafe("CREATE TABLE %s", e.arg1)
	case sqlite.AuthCreateView, sqlite.AuthCreateTempView:
		return unsafe("CREATE VIEW %s", e.arg1)
	case sqlite.AuthCreateIndex, sqlite.AuthCreateTempIndex:
		return unsafe("CREATE INDEX %s ON %s", e.arg1, e.arg2)
	case sqlite.AuthCreateTrigger, sqlite.AuthCreateTempTrigger:
		return unsafe("CREATE TRIGGER %s ON %s", e.arg1, e.arg2)
	case sqlite.AuthCreateVTable:
		return unsafe("CREATE VIRTUAL TABLE %s USING %s", e.arg1, e.arg2)
	case sqlite.AuthDropTable, sqlite.AuthDropTempTable:
		return unsafe("DROP TABLE %s", e.arg1)
	case sqlite.AuthDropView, sqlite.AuthDropTempView:
		return unsafe("DROP VIEW %s", e.arg1)
	case sqlite.AuthDropIndex, sqlite.AuthDropTempIndex:
		return unsafe("DROP INDEX %s", e.arg1)
	case sqlite.AuthDropTrigger, sqlite.AuthDropTempTrigger:
		return unsafe("DROP TRIGGER %s", e.arg1)
	case sqlite.AuthDropVTable:
		return unsafe("DROP VIRTUAL TABLE %s", e.arg1)
	case sqlite.AuthAlterTable:
		return unsafe("ALTER TABLE %s", e.arg2)
	case sqlite.AuthReindex:
		return unsafe("REINDEX %s", e.arg1)
	case sqlite.AuthAnalyze:
		return unsafe("ANALYZE %s", e.arg1)
	default:
		return unsafe("SQLite action %d (%s %s)", e.action, e.arg1, e.arg2)
	}
}

// splitStatements splits q into statements at the semicolons that SQLite's
// own sqlite3_complete says end one. The last piece may lack its semicolon.
// Pieces may be empty or hold only comments; the caller prepares each.
func splitStatements(q string) ([]string, error) {
	tls := libc.NewTLS()
	defer tls.Close()
	var pieces []string
	start, candidates := 0, 0
	for i := 0; i < len(q); i++ {
		if q[i] != ';' {
			continue
		}
		candidates++
		if candidates > 256 {
			return nil, builtin.Refuse(toolgate.CodeUnparsableQuery, "sql.query: the query has more than 256 semicolons; it cannot be classified")
		}
		cs, err := libc.CString(q[start : i+1])
		if err != nil {
			return nil, err
		}
		done := sqlite3.Xsqlite3_complete(tls, cs) != 0
		libc.Xfree(tls, cs)
		if done {
			pieces = append(pieces, q[start:i+1])
			start = i + 1
		}
	}
	if start < len(q) {
		pieces = append(pieces, q[start:])
	}
	return pieces, nil
}

// analysis is the result of classifying a query on one connection.
type analysis struct {
	stmt   string          // the one statement to run
	tables []TableRef      // tables and views read, in schema spelling
	reads  map[string]bool // lowercase names the authorizer may see read
}

// analyze classifies q on connection c (raw is its driver connection) and
// leaves the deny-all authorizer in place. Before authorization (ph), what
// a view reads or calls is reported, never refused (see guard).
func (b *sqliteBackend) analyze(ctx context.Context, c *sql.Conn, raw any, q string, ph phase) (*analysis, error) {
	pieces, err := splitStatements(q)
	if err != nil {
		return nil, err
	}
	ci, ok := raw.(interface {
		ColumnInfo(string) ([]sqlite.ColumnInfo, error)
	})
	if !ok {
		return nil, errors.New("the sqlite driver cannot describe statements")
	}
	reg := raw.(sqlite.AuthorizerRegisterer)
	var stmts []string
	a := &analysis{reads: map[string]bool{}}
	var readNames []string
	var reads []authEvent
	var deferred []deferral
	columnRead := map[string]bool{} // names some column was read from
	for _, p := range pieces {
		g := &guard{analysing: true, deferViews: ph == beforeAuth}
		var info []sqlite.ColumnInfo
		err := c.Raw(func(any) error {
			if err := reg.RegisterAuthorizer(g.authorize); err != nil {
				return err
			}
			var perr error
			info, perr = ci.ColumnInfo(p)
			if err := reg.RegisterAuthorizer(denyAll); err != nil {
				return driver.ErrBadConn
			}
			return perr
		})
		if r := g.refusal(); r != nil {
			return nil, r
		}
		if err != nil {
			return nil, &toolgate.Error{Code: toolgate.CodeUnparsableQuery, Layer: toolgate.LayerResource,
				Message: fmt.Sprintf("sql.query: SQLite cannot prepare %s: %v", quoteStmt(p), err), Err: err}
		}
		if info == nil && len(g.events) == 0 {
			continue // empty, or only comments
		}
		if len(g.events) == 0 || g.events[0].action != sqlite.AuthSelect {
			return nil, builtin.Refuse(toolgate.CodeUnsafeQuery,
				"sql.query refused %s: it is not a query; only a single read-only SELECT may run", quoteStmt(p))
		}
		stmts = append(stmts, p)
		deferred = append(deferred, g.deferred...)
		for _, e := range g.events {
			if e.action == sqlite.AuthRead {
				readNames = append(readNames, e.arg1)
				reads = append(reads, e)
				if e.arg2 != "" || e.dbName != "" {
					columnRead[strings.ToLower(e.arg1)] = true
				}
			}
		}
	}
	switch len(stmts) {
	case 0:
		return nil, builtin.BadArguments(nil, "sql.query: the query holds no statement")
	case 1:
	default:
		return nil, builtin.Refuse(toolgate.CodeUnsafeQuery,
			"sql.query refused %d statements (%s, then %s): it runs exactly one statement per call", len(stmts), quoteStmt(stmts[0]), quoteStmt(stmts[1]))
	}
	a.stmt = stmts[0]

	schema := map[string]schemaEntry{}
	modules := map[string]bool{}
	if len(readNames) > 0 || len(deferred) > 0 {
		// Read the schema on this same connection, under allow-all.
		if err := c.Raw(func(any) error { return reg.RegisterAuthorizer(allowAll) }); err != nil {
			return nil, err
		}
		rs, err := c.QueryContext(ctx, `SELECT name, type FROM sqlite_schema WHERE type IN ('table', 'view')`)
		if err == nil {
			for rs.Next() {
				var e schemaEntry
				if err = rs.Scan(&e.name, &e.typ); err != nil {
					break
				}
				schema[strings.ToLower(e.name)] = e
			}
			rs.Close()
			if err == nil {
				err = rs.Err()
			}
		}
		if err == nil {
			err = readModules(ctx, c, modules)
		}
		if rerr := c.Raw(func(any) error { return reg.RegisterAuthorizer(denyAll) }); rerr != nil {
			return nil, driver.ErrBadConn
		}
		if err != nil {
			return nil, fmt.Errorf("read schema: %w", err)
		}
	}
	// What a view does is refused by Run only; what a CTE does, now.
	isView := func(ctx string) bool { return ctx != "" && schema[strings.ToLower(ctx)].typ == "view" }
	for _, d := range deferred {
		if !isView(d.ctx) {
			return nil, d.err
		}
	}
	outsideView := map[string]bool{} // names read other than inside a view
	for _, e := range reads {
		if !isView(e.ctx) {
			outsideView[strings.ToLower(e.arg1)] = true
		}
	}
	seen := map[string]bool{}
	for _, n := range readNames {
		low := strings.ToLower(n)
		if seen[low] {
			continue
		}
		seen[low] = true
		a.reads[low] = true
		switch e, ok := schema[low]; {
		case ok:
			a.tables = append(a.tables, TableRef{Name: e.name})
		case low == "sqlite_master" || low == "sqlite_schema":
			a.tables = append(a.tables, TableRef{Name: "sqlite_master"})
		case harmlessVTabs[low]:
		case !columnRead[low] && !modules[low] && !knownVTabs[low] && !strings.HasPrefix(low, "pragma_"):
			// SQLite names a FROM item it reads no column of (count(*)):
			// not a table, view or virtual table, so a CTE or subquery,
			// whose own reads were reported.
		case ph == beforeAuth && !outsideView[low]:
			// Read by a view only: Run refuses it.
		default:
			return nil, builtin.Refuse(toolgate.CodeUnsafeQuery,
				"sql.query refused reading %s: it is a table-valued function or virtual table, not a table of database %q", n, b.cfg.Name)
		}
	}
	return a, nil
}

// quoteStmt quotes a statement for a message, shortened.
func quoteStmt(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 120 {
		s = s[:117] + "..."
	}
	return fmt.Sprintf("%q", s)
}

func (b *sqliteBackend) inspect(ctx context.Context, q string) ([]TableRef, error) {
	var a *analysis
	err := b.withConn(ctx, denyAll, func(c *sql.Conn, raw any) (err error) {
		a, err = b.analyze(ctx, c, raw, q, beforeAuth)
		return err
	})
	if err != nil {
		return nil, err
	}
	return a.tables, nil
}

func (b *sqliteBackend) run(ctx context.Context, q string, lim limits) (rows, error) {
	var out rows
	err := b.withConn(ctx, denyAll, func(c *sql.Conn, raw any) error {
		a, err := b.analyze(ctx, c, raw, q, afterAuth)
		if err != nil {
			return err
		}
		// Execute under an enforcing authorizer: the same classification,
		// and only the tables inspection reported.
		reg := raw.(sqlite.AuthorizerRegisterer)
		g := &guard{tables: a.reads}
		if err := c.Raw(func(any) error { return reg.RegisterAuthorizer(g.authorize) }); err != nil {
			return err
		}
		vb, err := sqliteValueBound(ctx, c, a.stmt, lim)
		if err != nil {
			if g.violation != nil {
				return g.violation
			}
			return fmt.Errorf("sql.query %s: %w", b.cfg.Name, err)
		}
		if _, err := sqlite.Limit(c, sqliteLimitLength, vb.value); err != nil {
			return err
		}
		tooBig := func(err error) error {
			var se *sqlite.Error
			if errors.As(err, &se) && se.Code() == sqlite3.SQLITE_TOOBIG {
				return fmt.Errorf("sql.query %s: a value the query reads or builds is larger than %d bytes, the most one value of this query may hold "+
					"(%d bytes shared among the %d steps of its program that hold values; the bound grows with Settings.result_max_kib); "+
					"narrow the query: fewer or shorter values (a stored value larger than the bound cannot be read, not even by substr or length): %w",
					b.cfg.Name, vb.value, lim.rowBound(), vb.steps, ErrResultTooLarge)
			}
			if g.violation != nil {
				return g.violation
			}
			return fmt.Errorf("sql.query %s: %w", b.cfg.Name, err)
		}
		rs, err := c.QueryContext(ctx, a.stmt)
		if err != nil {
			return tooBig(err)
		}
		defer rs.Close() // stops the statement when reading stops early
		cols, err := rs.Columns()
		if err != nil {
			return err
		}
		col := newCollector(lim, cols)
		for rs.Next() && col.room() {
			vals := make([]any, len(cols))
			ptrs := make([]any, len(vals))
			for i := range vals {
				ptrs[i] = &vals[i]
			}
			if err := rs.Scan(ptrs...); err != nil {
				return err
			}
			n := 0
			for _, v := range vals {
				n += cellTextMin(v)
			}
			if n = rowTextMin(len(cols), n); !col.fits(n) {
				break
			}
			for i := range vals {
				vals[i] = jsonValue(vals[i])
			}
			col.add(vals, n)
		}
		if err := rs.Err(); err != nil {
			return tooBig(err)
		}
		out = col.out
		if g.violation != nil {
			return g.violation
		}
		return nil
	})
	return out, err
}

// valueBound is the bound of one SQLite value for one statement.
type valueBound struct {
	value int // bytes, for SQLITE_LIMIT_LENGTH
	steps int // the program steps it is shared among
}

// sqliteValueBound divides the row bound W (limits.rowBound) among the
// values a statement can hold at once, so that together they stay within
// W: SQLite bounds each string and blob it builds or reads by
// SQLITE_LIMIT_LENGTH, but a statement holds many at once (every result
// column, every constant subexpression in its own register, every
// aggregate), so the bound of one is W divided by the number of steps of
// the statement's program (EXPLAIN) that can hold one: every step except
// those known to hold none (jumps, comparisons, integer arithmetic,
// cursor moves), a range copy counting once per register it copies. The
// bound is at least MinValueBound.
func sqliteValueBound(ctx context.Context, c *sql.Conn, stmt string, lim limits) (valueBound, error) {
	if strings.EqualFold(leadingWord(stmt), "explain") {
		// Its rows list the program of the statement it explains, whose
		// values come from the query text: nothing to divide.
		return valueBound{value: lim.rowBound() / explainColumns, steps: explainColumns}, nil
	}
	rs, err := c.QueryContext(ctx, "EXPLAIN "+stmt)
	if err != nil {
		return valueBound{}, err
	}
	defer rs.Close()
	steps := 0
	for rs.Next() {
		var (
			addr, p1, p2, p3 int64
			op               string
			p4, p5, comment  any
		)
		if err := rs.Scan(&addr, &op, &p1, &p2, &p3, &p4, &p5, &comment); err != nil {
			return valueBound{}, err
		}
		switch {
		case valuelessOps[op]:
		case op == "Copy":
			steps += int(max(p3, 0)) + 1
		default:
			steps++
		}
	}
	if err := rs.Err(); err != nil {
		return valueBound{}, err
	}
	steps = max(steps, 1)
	return valueBound{value: max(lim.rowBound()/steps, MinValueBound), steps: steps}, nil
}

// explainColumns is the number of columns of EXPLAIN's result.
const explainColumns = 8

// leadingWord returns the first word of a statement, after white space and
// comments ("--" to the end of the line, "/* */").
func leadingWord(stmt string) string {
	for {
		stmt = strings.TrimLeft(stmt, " \t\r\n\f")
		switch {
		case strings.HasPrefix(stmt, "--"):
			_, rest, ok := strings.Cut(stmt, "\n")
			if !ok {
				return ""
			}
			stmt = rest
		case strings.HasPrefix(stmt, "/*"):
			_, rest, ok := strings.Cut(stmt[2:], "*/")
			if !ok {
				return ""
			}
			stmt = rest
		default:
			end := strings.IndexFunc(stmt, func(r rune) bool {
				return !(r == '_' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9')
			})
			if end < 0 {
				return stmt
			}
			return stmt[:end]
		}
	}
}

// valuelessOps are the opcodes of SQLite's virtual machine that never
// make a string or blob a register keeps (control flow, comparisons,
// integer arithmetic, cursor moves, integers and NULLs); every other step
// of a program may hold one value. An opcode not listed counts: the list
// only lowers the count.
var valuelessOps = setOf(
	"Init", "Goto", "Gosub", "Return", "InitCoroutine", "Yield", "EndCoroutine", "BeginSubrtn", "Once", "Halt", "HaltIfNull",
	"Jump", "If", "IfNot", "IfPos", "IfNotZero", "DecrJumpZero", "IfNullRow", "IsNull", "NotNull", "IsTrue", "IsType",
	"Eq", "Ne", "Lt", "Le", "Gt", "Ge", "ElseEq", "Compare", "Permutation", "And", "Or", "Not", "BitNot",
	"BitAnd", "BitOr", "ShiftLeft", "ShiftRight", "Add", "Subtract", "Multiply", "Divide", "Remainder", "AddImm",
	"MustBeInt", "RealAffinity", "Integer", "Int64", "Real", "Null", "SoftNull", "ZeroOrNull", "IntCopy", "Move",
	"MemMax", "Offset", "OffsetLimit", "Count", "Sequence", "SequenceTest", "Rowid", "IdxRowid", "NullRow",
	"Transaction", "TableLock", "OpenRead", "ReopenIdx", "OpenDup", "OpenPseudo", "Close", "ColumnsUsed", "CursorHint",
	"Rewind", "Next", "Prev", "Last", "SeekEnd", "SeekRowid", "NotExists", "SeekLT", "SeekLE", "SeekGE", "SeekGT",
	"SeekScan", "SeekHit", "IdxLE", "IdxGT", "IdxLT", "IdxGE", "Found", "NotFound", "NoConflict", "IfNoHope",
	"DeferredSeek", "FinishSeek", "IfEmpty", "IfSizeBetween", "Sort", "SorterSort", "SorterNext", "SorterCompare",
	"ResultRow", "TypeCheck", "CollSeq", "ReleaseReg", "Noop", "Explain", "Abortable", "Trace", "MaxPgcnt",
	"Pagecount", "ReadCookie", "Expire", "CursorLock", "CursorUnlock", "ResetSorter", "VNext", "Filter",
	"RowSetTest", "RowSetRead", "ClrSubtype", "GetSubtype", "SetSubtype",
)
