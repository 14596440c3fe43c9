package sqltool

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	pg "github.com/pganalyze/pg_query_go/v6"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/toolgate/toolgate"
	"github.com/toolgate/toolgate/builtin"
)

// pgBackend reaches one PostgreSQL database through a pgx pool. Every
// statement it runs is inside a READ ONLY transaction with a statement
// timeout.
type pgBackend struct {
	cfg     Config
	pool    *pgxpool.Pool
	allowed map[TableRef]bool // Config.AllowedFunctions, as written
}

func openPostgres(ctx context.Context, cfg Config) (*pgBackend, error) {
	pc, err := pgxpool.ParseConfig(cfg.DSN)
	if err != nil {
		return nil, fmt.Errorf("dsn: %w", err)
	}
	if pc.MaxConns > 4 {
		pc.MaxConns = 4
	}
	// Ad-hoc queries: never fill a per-connection statement cache.
	pc.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeDescribeExec
	pc.ConnConfig.MaxProtocolMessageBodyLen = pgMaxMessageBytes
	if pc.ConnConfig.RuntimeParams == nil {
		pc.ConnConfig.RuntimeParams = map[string]string{}
	}
	if _, ok := pc.ConnConfig.RuntimeParams["application_name"]; !ok {
		pc.ConnConfig.RuntimeParams["application_name"] = "toolgate"
	}
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, err
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, err
	}
	b := &pgBackend{cfg: cfg, pool: pool, allowed: map[TableRef]bool{}}
	for _, f := range cfg.AllowedFunctions {
		if ref, ok := parseFunctionName(f); ok {
			b.allowed[ref] = true
		}
	}
	return b, nil
}

func (b *pgBackend) close() error { b.pool.Close(); return nil }

// readTx runs fn in a READ ONLY transaction with the statement timeout set,
// and always rolls back.
func (b *pgBackend) readTx(ctx context.Context, fn func(tx pgx.Tx) error) error {
	tx, err := b.pool.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly})
	if err != nil {
		return err
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = tx.Rollback(rctx)
	}()
	ms := fmt.Sprintf("%dms", b.cfg.timeout().Milliseconds())
	if _, err := tx.Exec(ctx, `SELECT set_config('statement_timeout', $1, true)`, ms); err != nil {
		return fmt.Errorf("set statement_timeout: %w", err)
	}
	return fn(tx)
}

var relkindNames = map[string]string{
	"r": "table", "p": "partitioned_table", "v": "view", "m": "materialized_view", "f": "foreign_table", "S": "sequence",
}

func (b *pgBackend) listTables(ctx context.Context) ([]TableInfo, error) {
	out := []TableInfo{}
	err := b.readTx(ctx, func(tx pgx.Tx) error {
		rs, err := tx.Query(ctx, `
			SELECT n.nspname, c.relname, c.relkind::text
			FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
			WHERE c.relkind IN ('r', 'p', 'v', 'm', 'f')
			  AND n.nspname NOT IN ('pg_catalog', 'information_schema')
			  AND n.nspname NOT LIKE 'pg\_toast%' AND n.nspname NOT LIKE 'pg\_temp%'
			ORDER BY 1, 2`)
		if err != nil {
			return err
		}
		for rs.Next() {
			var ti TableInfo
			var kind string
			if err := rs.Scan(&ti.Schema, &ti.Name, &kind); err != nil {
				return err
			}
			ti.Type = relkindNames[kind]
			out = append(out, ti)
		}
		return rs.Err()
	})
	return out, err
}

// resolveRel finds the relation PostgreSQL itself would use for ref
// (to_regclass applies search_path). A relation that does not exist is
// returned under the schema it would be looked up in first.
func resolveRel(ctx context.Context, tx pgx.Tx, ref TableRef) (oid uint32, out TableRef, found bool, err error) {
	row := tx.QueryRow(ctx, `
		SELECT c.oid::int8, n.nspname, c.relname
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE c.oid = to_regclass(CASE WHEN $1 = '' THEN quote_ident($2) ELSE quote_ident($1) || '.' || quote_ident($2) END)`,
		ref.Schema, ref.Name)
	var o int64
	if err := row.Scan(&o, &out.Schema, &out.Name); err == nil {
		return uint32(o), out, true, nil
	} else if !errors.Is(err, pgx.ErrNoRows) {
		return 0, TableRef{}, false, err
	}
	out = ref
	if out.Schema == "" {
		if err := tx.QueryRow(ctx, `SELECT coalesce(current_schema(), 'public')`).Scan(&out.Schema); err != nil {
			return 0, TableRef{}, false, err
		}
	}
	return 0, out, false, nil
}

func (b *pgBackend) resolveTable(ctx context.Context, name string) (TableRef, error) {
	var out TableRef
	err := b.readTx(ctx, func(tx pgx.Tx) error {
		ref, err := parseTableArg(name, 2)
		if err != nil {
			return err
		}
		_, r, _, err := resolveRel(ctx, tx, ref)
		out = r
		return err
	})
	return out, err
}

func (b *pgBackend) describe(ctx context.Context, ref TableRef) ([]ColumnInfo, error) {
	var cols []ColumnInfo
	err := b.readTx(ctx, func(tx pgx.Tx) error {
		oid, _, found, err := resolveRel(ctx, tx, ref)
		if err != nil {
			return err
		}
		if !found {
			return builtin.BadArguments(nil, "%s: table %q does not exist in database %q", DescribeTableName, ref.String(), b.cfg.Name)
		}
		rs, err := tx.Query(ctx, `
			SELECT a.attname, format_type(a.atttypid, a.atttypmod), NOT a.attnotnull,
			       pg_get_expr(d.adbin, d.adrelid),
			       EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = a.attrelid AND i.indisprimary AND a.attnum = ANY (i.indkey))
			FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
			WHERE a.attrelid = $1::int8::oid AND a.attnum > 0 AND NOT a.attisdropped
			ORDER BY a.attnum`, int64(oid))
		if err != nil {
			return err
		}
		for rs.Next() {
			var c ColumnInfo
			if err := rs.Scan(&c.Name, &c.Type, &c.Nullable, &c.Default, &c.PrimaryKey); err != nil {
				return err
			}
			cols = append(cols, c)
		}
		return rs.Err()
	})
	return cols, err
}

// ---- analysis ----

// pgParsed is what the parse tree says, before catalog lookups.
type pgParsed struct {
	stmt  string     // the statement's own text
	rels  []TableRef // relation references that are not CTEs, as written
	funcs []TableRef // function calls, as written (Schema "" when unqualified)
	ops   []TableRef // operators, as written (OPERATOR(schema.op) qualified)
	types []TableRef // type names (casts, column definitions), as written
}

// cteScope is the set of CTE names visible at a point of the tree.
type cteScope struct {
	name   string
	parent *cteScope
}

func (s *cteScope) has(n string) bool {
	for ; s != nil; s = s.parent {
		if s.name == n {
			return true
		}
	}
	return false
}

func (s *cteScope) push(n string) *cteScope { return &cteScope{name: n, parent: s} }

// walker collects relation references and function calls from a parse tree
// and refuses anything that is not a read.
type walker struct {
	version int32 // of the parse tree, for Deparse
	parsed  pgParsed
	err     *toolgate.Error
	cte     string // the CTE being walked, for messages
}

func refuseQuery(format string, args ...any) *toolgate.Error {
	return builtin.Refuse(toolgate.CodeUnsafeQuery, "sql.query refused %s: only a single read-only SELECT may run", fmt.Sprintf(format, args...))
}

func (w *walker) fail(e *toolgate.Error) {
	if w.err == nil {
		w.err = e
	}
}

func (w *walker) walk(m protoreflect.Message, sc *cteScope) {
	if w.err != nil || !m.IsValid() {
		return
	}
	switch n := m.Interface().(type) {
	case *pg.SelectStmt:
		w.selectStmt(n, sc)
		return
	case *pg.RangeVar:
		w.rangeVar(n, sc)
		return
	case *pg.FuncCall:
		w.funcCall(n)
	case *pg.A_Expr:
		w.operator(n.Name)
	case *pg.SubLink:
		w.operator(n.OperName)
	case *pg.SortBy:
		w.operator(n.UseOp)
	case *pg.TypeName:
		w.typeName(n)
	case *pg.RangeTableSample:
		w.sampleMethod(n.Method)
	default:
		if strings.HasSuffix(string(m.Descriptor().Name()), "Stmt") {
			w.fail(refuseQuery("%s", w.describe(m)))
			return
		}
	}
	w.children(m, sc, "")
}

func (w *walker) children(m protoreflect.Message, sc *cteScope, skip protoreflect.Name) {
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		if fd.Name() == skip || fd.Kind() != protoreflect.MessageKind && fd.Kind() != protoreflect.GroupKind {
			return true
		}
		switch {
		case fd.IsList():
			l := v.List()
			for i := 0; i < l.Len(); i++ {
				w.walk(l.Get(i).Message(), sc)
			}
		case fd.IsMap():
			v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
				w.walk(mv.Message(), sc)
				return true
			})
		default:
			w.walk(v.Message(), sc)
		}
		return w.err == nil
	})
}

func (w *walker) selectStmt(n *pg.SelectStmt, sc *cteScope) {
	if n.IntoClause != nil {
		w.fail(refuseQuery("SELECT INTO %s (it creates a table)", rangeVarName(n.IntoClause.GetRel())))
		return
	}
	if len(n.LockingClause) > 0 {
		w.fail(refuseQuery("SELECT ... FOR UPDATE/SHARE (it locks rows)"))
		return
	}
	inner := sc
	if wc := n.WithClause; wc != nil {
		if wc.Recursive {
			// Every CTE of a WITH RECURSIVE sees all of them.
			for _, c := range wc.Ctes {
				inner = inner.push(c.GetCommonTableExpr().GetCtename())
			}
			for _, c := range wc.Ctes {
				w.cteQuery(c.GetCommonTableExpr(), inner)
			}
		} else {
			// A plain WITH's CTE sees only the ones before it: a later
			// sibling's name there is a real table.
			for _, c := range wc.Ctes {
				w.cteQuery(c.GetCommonTableExpr(), inner)
				inner = inner.push(c.GetCommonTableExpr().GetCtename())
			}
		}
	}
	w.children(n.ProtoReflect(), inner, "with_clause")
}

func (w *walker) cteQuery(c *pg.CommonTableExpr, sc *cteScope) {
	if c == nil {
		w.fail(builtin.Refuse(toolgate.CodeUnparsableQuery, "sql.query: a WITH clause could not be read"))
		return
	}
	prev := w.cte
	w.cte = c.Ctename
	if q := c.Ctequery; q != nil {
		w.walk(q.ProtoReflect(), sc)
	}
	w.cte = prev
}

func (w *walker) rangeVar(n *pg.RangeVar, sc *cteScope) {
	if n.Catalogname != "" {
		w.fail(refuseQuery("the cross-database reference %s", rangeVarName(n)))
		return
	}
	if n.Schemaname == "" && sc.has(n.Relname) {
		return // a CTE in scope, not a table
	}
	w.parsed.rels = append(w.parsed.rels, TableRef{Schema: n.Schemaname, Name: n.Relname})
}

// qualifiedName reads a name list of the parse tree ([schema,] name); ok
// is false for anything else (a catalog-qualified name, a non-string part).
func qualifiedName(nodes []*pg.Node) (TableRef, bool) {
	var parts []string
	for _, p := range nodes {
		s := p.GetString_()
		if s == nil || s.GetSval() == "" {
			return TableRef{}, false
		}
		parts = append(parts, s.GetSval())
	}
	switch len(parts) {
	case 1:
		return TableRef{Name: parts[0]}, true
	case 2:
		return TableRef{Schema: parts[0], Name: parts[1]}, true
	}
	return TableRef{}, false
}

// namesText renders a name list for a message.
func namesText(nodes []*pg.Node) string {
	var parts []string
	for _, p := range nodes {
		parts = append(parts, p.GetString_().GetSval())
	}
	return strings.Join(parts, ".")
}

func (w *walker) funcCall(n *pg.FuncCall) {
	ref, ok := qualifiedName(n.Funcname)
	if !ok {
		w.fail(builtin.Refuse(toolgate.CodeUnparsableQuery, "sql.query: function name %q cannot be classified", namesText(n.Funcname)))
		return
	}
	w.parsed.funcs = append(w.parsed.funcs, ref)
}

// operator records an operator name (none for an A_Expr kind without one).
func (w *walker) operator(names []*pg.Node) {
	if len(names) == 0 {
		return
	}
	ref, ok := qualifiedName(names)
	if !ok {
		w.fail(builtin.Refuse(toolgate.CodeUnparsableQuery, "sql.query: operator %q cannot be classified", namesText(names)))
		return
	}
	w.parsed.ops = append(w.parsed.ops, ref)
}

// typeName records a type a cast or column definition names.
func (w *walker) typeName(n *pg.TypeName) {
	if n.PctType {
		w.fail(builtin.Refuse(toolgate.CodeUnparsableQuery, "sql.query: type %s%%TYPE cannot be classified", namesText(n.Names)))
		return
	}
	ref, ok := qualifiedName(n.Names)
	if !ok {
		w.fail(builtin.Refuse(toolgate.CodeUnparsableQuery, "sql.query: type name %q cannot be classified", namesText(n.Names)))
		return
	}
	w.parsed.types = append(w.parsed.types, ref)
}

// sampleMethod refuses a TABLESAMPLE method other than core PostgreSQL's:
// a method is a function.
func (w *walker) sampleMethod(names []*pg.Node) {
	ref, ok := qualifiedName(names)
	if !ok || (ref.Schema != "" && ref.Schema != "pg_catalog") || !safePGSampleMethods[ref.Name] {
		w.fail(refuseQuery("TABLESAMPLE %s: only the core methods SYSTEM and BERNOULLI may run", namesText(names)))
	}
}

func rangeVarName(n *pg.RangeVar) string {
	if n == nil {
		return "?"
	}
	parts := []string{}
	for _, p := range []string{n.Catalogname, n.Schemaname, n.Relname} {
		if p != "" {
			parts = append(parts, p)
		}
	}
	return strings.Join(parts, ".")
}

// describe names a statement node for a refusal: "DELETE FROM orders", with
// the CTE it sits in.
func (w *walker) describe(m protoreflect.Message) string {
	var s string
	switch n := m.Interface().(type) {
	case *pg.InsertStmt:
		s = "INSERT INTO " + rangeVarName(n.Relation)
	case *pg.UpdateStmt:
		s = "UPDATE " + rangeVarName(n.Relation)
	case *pg.DeleteStmt:
		s = "DELETE FROM " + rangeVarName(n.Relation)
	case *pg.MergeStmt:
		s = "MERGE INTO " + rangeVarName(n.Relation)
	default:
		s = deparseNode(m, w.version)
	}
	if w.cte != "" {
		s += " inside WITH " + w.cte
	}
	return s
}

// deparseNode renders a statement node as SQL, or by its node type.
func deparseNode(m protoreflect.Message, version int32) string {
	node := &pg.Node{}
	nf := node.ProtoReflect().Descriptor().Oneofs().ByName("node")
	for i := 0; nf != nil && i < nf.Fields().Len(); i++ {
		fd := nf.Fields().Get(i)
		if fd.Message() != nil && fd.Message().FullName() == m.Descriptor().FullName() {
			node.ProtoReflect().Set(fd, protoreflect.ValueOfMessage(m))
			if sql, err := pg.Deparse(&pg.ParseResult{Version: version, Stmts: []*pg.RawStmt{{Stmt: node}}}); err == nil && sql != "" {
				return shorten(sql)
			}
			break
		}
	}
	return "statement " + strings.TrimSuffix(string(m.Descriptor().Name()), "Stmt")
}

func shorten(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 120 {
		s = s[:117] + "..."
	}
	return s
}

// parsePG classifies q with PostgreSQL's parser, without the database.
func parsePG(q string) (*pgParsed, error) {
	tree, err := pg.Parse(q)
	if err != nil {
		return nil, &toolgate.Error{Code: toolgate.CodeUnparsableQuery, Layer: toolgate.LayerResource,
			Message: fmt.Sprintf("sql.query: PostgreSQL cannot parse the query: %v", err), Err: err}
	}
	if len(tree.Stmts) == 0 {
		return nil, builtin.BadArguments(nil, "sql.query: the query holds no statement")
	}
	var first *pgParsed
	for i, raw := range tree.Stmts {
		w := &walker{version: tree.Version}
		text := stmtText(q, raw)
		if raw.Stmt.GetSelectStmt() == nil {
			// Name the statement by what it is, not by its text: a
			// leading comment must not disguise it.
			inner := raw.Stmt.ProtoReflect()
			if od := inner.Descriptor().Oneofs().ByName("node"); od != nil {
				if fd := inner.WhichOneof(od); fd != nil {
					return nil, refuseQuery("%s", w.describe(inner.Get(fd).Message()))
				}
			}
			return nil, builtin.Refuse(toolgate.CodeUnparsableQuery, "sql.query: statement %q cannot be classified", shorten(text))
		}
		w.walk(raw.Stmt.GetSelectStmt().ProtoReflect(), nil)
		if w.err != nil {
			return nil, w.err
		}
		if i == 0 {
			w.parsed.stmt = text
			first = &w.parsed
		}
	}
	if len(tree.Stmts) > 1 {
		return nil, builtin.Refuse(toolgate.CodeUnsafeQuery,
			"sql.query refused %d statements (%q, then %q): it runs exactly one statement per call",
			len(tree.Stmts), shorten(stmtText(q, tree.Stmts[0])), shorten(stmtText(q, tree.Stmts[1])))
	}
	return first, nil
}

// stmtText is the statement's own text within q (byte offsets).
func stmtText(q string, raw *pg.RawStmt) string {
	start := int(raw.StmtLocation)
	end := len(q)
	if raw.StmtLen > 0 {
		end = start + int(raw.StmtLen)
	}
	if start < 0 || start > len(q) || end > len(q) || end < start {
		return q
	}
	return strings.TrimSpace(q[start:end])
}

// resolve looks up functions and relations in the catalog, inside tx, and
// returns every table and view read, views expanded.
func (b *pgBackend) resolve(ctx context.Context, tx pgx.Tx, p *pgParsed) ([]TableRef, error) {
	if err := b.checkCalls(ctx, tx, p, ""); err != nil {
		return nil, err
	}
	var out []TableRef
	var oids []int64
	seen := map[TableRef]bool{}
	for _, r := range p.rels {
		oid, ref, found, err := resolveRel(ctx, tx, r)
		if err != nil {
			return nil, fmt.Errorf("resolve %s: %w", r, err)
		}
		if !seen[ref] {
			seen[ref] = true
			out = append(out, ref)
		}
		if found {
			oids = append(oids, int64(oid))
		}
	}
	if len(oids) == 0 {
		return out, nil
	}
	// Everything the referenced views read, recursively, through the
	// dependencies of their rewrite rules.
	rs, err := tx.Query(ctx, viewDepsSQL+`
		SELECT DISTINCT n.nspname, c.relname
		FROM deps JOIN pg_class c ON c.oid = deps.oid JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE c.relkind IN ('r', 'p', 'v', 'm', 'f', 'S')`, oids)
	if err != nil {
		return nil, fmt.Errorf("expand views: %w", err)
	}
	defer rs.Close()
	for rs.Next() {
		var ref TableRef
		if err := rs.Scan(&ref.Schema, &ref.Name); err != nil {
			return nil, err
		}
		if !seen[ref] {
			seen[ref] = true
			out = append(out, ref)
		}
	}
	if err := rs.Err(); err != nil {
		return nil, err
	}
	rs.Close()
	if err := b.checkViewCalls(ctx, tx, oids); err != nil {
		return nil, err
	}
	return out, nil
}

// viewDepsSQL starts a query with deps(oid): the relations $1 and, for
// views, every relation their rewrite rules depend on, recursively.
const viewDepsSQL = `
		WITH RECURSIVE deps(oid) AS (
			SELECT unnest($1::int8[])::oid
			UNION
			SELECT d.refobjid
			FROM deps
			JOIN pg_rewrite r ON r.ev_class = deps.oid
			JOIN pg_depend d ON d.classid = 'pg_rewrite'::regclass AND d.objid = r.oid
			                AND d.refclassid = 'pg_class'::regclass AND d.refobjid <> deps.oid
		)`

// checkViewCalls applies the function, operator and type checks to the
// views among oids and below them: a view's body runs as part of the
// query, so what it calls, the query calls. The body is read back with
// pg_get_viewdef (names qualified where the search path would not find
// them) and parsed like the query (PostgreSQL does not record dependencies
// on pg_catalog's own functions). A materialized view's body does not run
// when it is read.
func (b *pgBackend) checkViewCalls(ctx context.Context, tx pgx.Tx, oids []int64) error {
	rs, err := tx.Query(ctx, viewDepsSQL+`
		SELECT n.nspname, c.relname, pg_get_viewdef(c.oid)
		FROM deps JOIN pg_class c ON c.oid = deps.oid JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE c.relkind = 'v'
		ORDER BY 1, 2`, oids)
	if err != nil {
		return fmt.Errorf("expand views: %w", err)
	}
	type view struct {
		ref TableRef
		def string
	}
	var views []view
	for rs.Next() {
		var v view
		if err := rs.Scan(&v.ref.Schema, &v.ref.Name, &v.def); err != nil {
			rs.Close()
			return err
		}
		views = append(views, v)
	}
	rs.Close()
	if err := rs.Err(); err != nil {
		return err
	}
	for _, v := range views {
		p, err := parsePG(v.def)
		if err != nil {
			return builtin.Refuse(toolgate.CodeUnparsableQuery, "sql.query: the body of view %s cannot be classified: %v", v.ref, err)
		}
		if err := b.checkCalls(ctx, tx, p, "view "+v.ref.String()); err != nil {
			return err
		}
	}
	return nil
}

// checkCalls checks every function, operator and type p names; in, when
// set, names the view whose body p is, for the refusal.
func (b *pgBackend) checkCalls(ctx context.Context, tx pgx.Tx, p *pgParsed, in string) error {
	for _, check := range []struct {
		refs []TableRef
		fn   func(context.Context, pgx.Tx, TableRef, string) error
	}{{p.funcs, b.checkFunction}, {p.ops, b.checkOperator}, {p.types, b.checkType}} {
		seen := map[TableRef]bool{}
		for _, r := range check.refs {
			if seen[r] {
				continue
			}
			seen[r] = true
			if err := check.fn(ctx, tx, r, in); err != nil {
				return err
			}
		}
	}
	return nil
}

// refuseIn is refuseQuery, for a call found in the body of view in.
func refuseIn(in, format string, args ...any) *toolgate.Error {
	if in == "" {
		return refuseQuery(format, args...)
	}
	return refuseQuery("%s, whose body has %s", in, fmt.Sprintf(format, args...))
}

// checkFunction allows a function call only when it is known to be safe:
// a pg_catalog function on safePGFunctions, or one Config.AllowedFunctions
// names. An unqualified name is looked up the way PostgreSQL resolves it
// (every schema of the search path, pg_catalog included), and every
// function of that name there must be allowed, since the analysis does not
// know which overload PostgreSQL picks; a name that resolves to nothing is
// refused too.
func (b *pgBackend) checkFunction(ctx context.Context, tx pgx.Tx, f TableRef, in string) error {
	refuse := func(schema string) error {
		where := "it is not one of the functions known to be safe in a read-only query"
		if schema != "" && schema != "pg_catalog" {
			where = "it is defined outside pg_catalog, where its body may read tables the query does not name"
		}
		return refuseIn(in, "function %s(): %s (list %s in allowed_functions to permit it)", f, where, TableRef{Schema: orDefault(schema, "pg_catalog"), Name: f.Name})
	}
	if f.Schema != "" {
		if !b.functionAllowed(f.Schema, f.Name) {
			return refuse(f.Schema)
		}
		return nil
	}
	rs, err := tx.Query(ctx, `
		SELECT DISTINCT n.nspname
		FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
		WHERE p.proname = $1 AND n.nspname = ANY (current_schemas(true))
		ORDER BY 1`, f.Name)
	if err != nil {
		return fmt.Errorf("look up function %s: %w", f.Name, err)
	}
	defer rs.Close()
	found := false
	for rs.Next() {
		var schema string
		if err := rs.Scan(&schema); err != nil {
			return err
		}
		found = true
		if !b.functionAllowed(schema, f.Name) {
			return refuse(schema)
		}
	}
	if err := rs.Err(); err != nil {
		return err
	}
	if !found {
		return refuse("")
	}
	return nil
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// functionAllowed reports whether schema.name may be called: a safe
// pg_catalog function, or one the configuration allows (compared exactly:
// PostgreSQL names are case sensitive once quoted).
func (b *pgBackend) functionAllowed(schema, name string) bool {
	return (schema == "pg_catalog" && safePGFunctions[name]) || b.allowed[TableRef{Schema: schema, Name: name}]
}

// checkOperator allows an operator of pg_catalog, one that an extension
// installed (CREATE EXTENSION: citext's =, hstore's ->), or one whose
// function is allowed (functionAllowed). Any other operator, one a user
// made with CREATE OPERATOR, runs a function the query never names, so it
// is refused. An unqualified operator is checked in every schema of the
// search path.
func (b *pgBackend) checkOperator(ctx context.Context, tx pgx.Tx, op TableRef, in string) error {
	if op.Schema == "pg_catalog" {
		return nil
	}
	rs, err := tx.Query(ctx, `
		SELECT n.nspname, pn.nspname, p.proname,
		       EXISTS (SELECT 1 FROM pg_depend d WHERE d.classid = 'pg_operator'::regclass AND d.objid = o.oid
		               AND d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e')
		FROM pg_operator o
		JOIN pg_namespace n ON n.oid = o.oprnamespace
		JOIN pg_proc p ON p.oid = o.oprcode JOIN pg_namespace pn ON pn.oid = p.pronamespace
		WHERE o.oprname = $1 AND n.nspname <> 'pg_catalog'
		  AND CASE WHEN $2 = '' THEN n.nspname = ANY (current_schemas(true)) ELSE n.nspname = $2 END
		ORDER BY 1, 2, 3`, op.Name, op.Schema)
	if err != nil {
		return fmt.Errorf("look up operator %s: %w", op, err)
	}
	defer rs.Close()
	for rs.Next() {
		var schema, fschema, fname string
		var ext bool
		if err := rs.Scan(&schema, &fschema, &fname, &ext); err != nil {
			return err
		}
		if !ext && !b.functionAllowed(fschema, fname) {
			return refuseIn(in, "operator %s: %s.%s runs %s.%s(), which is not known to be safe (list it in allowed_functions to permit it)",
				op.Name, schema, op.Name, fschema, fname)
		}
	}
	return rs.Err()
}

// checkType allows a cast to (or column of) a type unless it can run a
// function that is not allowed: a cast into it defined with a function
// outside pg_catalog (CREATE CAST ... WITH FUNCTION), or, for a domain, a
// CHECK constraint calling one (also through the domains it is built on).
// An unqualified name is checked in every schema of the search path.
func (b *pgBackend) checkType(ctx context.Context, tx pgx.Tx, t TableRef, in string) error {
	rs, err := tx.Query(ctx, `
		WITH RECURSIVE typ(oid) AS (
			SELECT t.oid FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
			WHERE t.typname = $1
			  AND CASE WHEN $2 = '' THEN n.nspname = ANY (current_schemas(true)) ELSE n.nspname = $2 END
			UNION
			SELECT t.typbasetype FROM typ JOIN pg_type t ON t.oid = typ.oid WHERE t.typtype = 'd'
		)
		SELECT 'cast', pn.nspname, p.proname
		FROM typ JOIN pg_cast c ON c.casttarget = typ.oid
		JOIN pg_proc p ON p.oid = c.castfunc JOIN pg_namespace pn ON pn.oid = p.pronamespace
		WHERE pn.nspname <> 'pg_catalog'
		  AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.classid = 'pg_cast'::regclass AND d.objid = c.oid
		                  AND d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e')
		UNION ALL
		SELECT 'domain', pn.nspname, p.proname
		FROM typ JOIN pg_constraint k ON k.contypid = typ.oid
		JOIN pg_depend d ON d.classid = 'pg_constraint'::regclass AND d.objid = k.oid AND d.refclassid = 'pg_proc'::regclass
		JOIN pg_proc p ON p.oid = d.refobjid JOIN pg_namespace pn ON pn.oid = p.pronamespace
		ORDER BY 1, 2, 3`, t.Name, t.Schema)
	if err != nil {
		return fmt.Errorf("look up type %s: %w", t, err)
	}
	defer rs.Close()
	for rs.Next() {
		var kind, fschema, fname string
		if err := rs.Scan(&kind, &fschema, &fname); err != nil {
			return err
		}
		if b.functionAllowed(fschema, fname) {
			continue
		}
		how := "a cast into it"
		if kind == "domain" {
			how = "its domain constraint"
		}
		return refuseIn(in, "type %s: %s runs %s.%s(), which is not known to be safe (list it in allowed_functions to permit it)", t, how, fschema, fname)
	}
	return rs.Err()
}

func (b *pgBackend) inspect(ctx context.Context, q string) ([]TableRef, error) {
	p, err := parsePG(q)
	if err != nil {
		return nil, err
	}
	var refs []TableRef
	err = b.readTx(ctx, func(tx pgx.Tx) error {
		refs, err = b.resolve(ctx, tx, p)
		return err
	})
	return refs, err
}

// pgMaxMessageBytes bounds every message the pool's connections read
// from PostgreSQL (catalog lookups included); a query's rows have the
// lower bound of limits.rowBound.
const pgMaxMessageBytes = 16 << 20

// pgRowSlack is what a row message may hold beyond the row bound: a
// length word per column, and the row description (a name and 18 bytes
// per column, up to 1664 columns).
const pgRowSlack = 256 << 10

func (b *pgBackend) run(ctx context.Context, q string, lim limits) (rows, error) {
	var out rows
	p, err := parsePG(q)
	if err != nil {
		return out, err
	}
	err = b.readTx(ctx, func(tx pgx.Tx) error {
		if _, err := b.resolve(ctx, tx, p); err != nil {
			return err
		}
		// A cursor lets us stop after maxRows+1 rows, or as soon as the
		// rows read no longer fit the cap. The extended protocol refuses
		// more than one statement, a third guard.
		pgc := tx.Conn().PgConn()
		res := pgc.ExecParams(ctx, "DECLARE toolgate_query NO SCROLL CURSOR FOR "+p.stmt, nil, nil, nil, nil).Read()
		if res.Err != nil {
			return fmt.Errorf("sql.query %s: %w", b.cfg.Name, res.Err)
		}
		// A row larger than the bound is refused as it arrives (the
		// connection is then closed), before it is held.
		fe := pgc.Frontend()
		fe.SetMaxBodyLen(lim.rowBound() + pgRowSlack)
		defer fe.SetMaxBodyLen(pgMaxMessageBytes)
		col, err := b.fetch(ctx, tx, lim)
		if err != nil {
			var big *pgproto3.ExceededMaxBodyLenErr
			if errors.As(err, &big) {
				return fmt.Errorf("sql.query %s: a row of the result is larger than %d bytes (PostgreSQL announced %d), the most one row may hold "+
					"(the bound grows with Settings.result_max_kib); narrow the query: select fewer or shorter columns (left(col, 1000)): %w",
					b.cfg.Name, lim.rowBound(), big.ActualBodyLen, ErrResultTooLarge)
			}
			return fmt.Errorf("sql.query %s: %w", b.cfg.Name, err)
		}
		out = col.out
		return nil
	})
	return out, err
}

// fetch reads the open cursor toolgate_query into a collector, in
// batches sized so that PostgreSQL sends little beyond what the cap can
// show. Values arrive in PostgreSQL's text format, whose size is at most
// twice what they take in Content (bytea's hex digits), so a row is
// refused by the collector before it is decoded; the binary format would
// let a few bytes decode to far more (a numeric 1e131071 is 14 bytes, and
// 131072 digits).
func (b *pgBackend) fetch(ctx context.Context, tx pgx.Tx, lim limits) (*collector, error) {
	pgc := tx.Conn().PgConn()
	tm := tx.Conn().TypeMap()
	var col *collector
	batch := min(lim.maxRows+1, 8)
	for {
		rr := pgc.ExecParams(ctx, fmt.Sprintf("FETCH FORWARD %d FROM toolgate_query", batch), nil, nil, nil, []int16{pgtype.TextFormatCode})
		fds := rr.FieldDescriptions()
		if col == nil {
			names := make([]string, len(fds))
			for i, fd := range fds {
				names[i] = fd.Name
			}
			col = newCollector(lim, names)
		}
		got, stop := 0, false
		for rr.NextRow() {
			got++
			if !col.room() {
				stop = true
				break
			}
			raw := rr.Values()
			n := 0
			for _, v := range raw {
				if v == nil {
					n += len("NULL")
				} else {
					n += (len(v) + 1) / 2
				}
			}
			if n = rowTextMin(len(raw), n); !col.fits(n) {
				stop = true
				break
			}
			vals, err := decodePGRow(tm, fds, raw)
			if err != nil {
				rr.Close()
				return nil, err
			}
			col.add(vals, n)
		}
		if _, err := rr.Close(); err != nil {
			return nil, err
		}
		if stop || got < batch {
			return col, nil
		}
		// The next batch: about as many rows as the cap has room for,
		// judged by the rows so far, and never past maxRows+1.
		held := len(col.out.values)
		perRow := max(col.used/max(held, 1), 1)
		batch = max(min((lim.maxBytes-col.used)/perRow+1, lim.maxRows+1-held), 1)
	}
}

// decodePGRow decodes one row of text-format values into JSON-ready
// values (see jsonValue). A numeric stays the text PostgreSQL wrote (as
// before: a JSON string); decoding it would cost time growing faster
// than its digits. A type pgx does not know is its text.
func decodePGRow(tm *pgtype.Map, fds []pgconn.FieldDescription, raw [][]byte) ([]any, error) {
	vals := make([]any, len(raw))
	for i, buf := range raw {
		oid := fds[i].DataTypeOID
		t, known := tm.TypeForOID(oid)
		switch {
		case buf == nil:
		case oid == pgtype.NumericOID || !known:
			vals[i] = string(buf)
		default:
			v, err := t.Codec.DecodeValue(tm, oid, pgtype.TextFormatCode, buf)
			if err != nil {
				return nil, fmt.Errorf("column %s: %w", fds[i].Name, err)
			}
			vals[i] = jsonValue(v)
		}
	}
	return vals, nil
}
