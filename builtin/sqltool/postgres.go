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
	stmt       string     // the statement's own text
	rels       []TableRef // relation references that are not CTEs, as written
	funcs      []callRef  // function calls, as written (Schema "" when unqualified)
	ops        []TableRef // operators, as written (OPERATOR(schema.op) qualified)
	types      []TableRef // type names (casts, column definitions), as written
	collations []TableRef // COLLATE names, as written
}

// callRef is one function call: its name and how many arguments it
// passes (WITHIN GROUP's ordering columns included).
type callRef struct {
	TableRef
	nargs int
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
	case *pg.CollateClause:
		w.collation(n.Collname)
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
	nargs := len(n.Args)
	if n.AggWithinGroup {
		nargs += len(n.AggOrder)
	}
	w.parsed.funcs = append(w.parsed.funcs, callRef{ref, nargs})
}

// collation records a COLLATE name.
func (w *walker) collation(names []*pg.Node) {
	ref, ok := qualifiedName(names)
	if !ok {
		w.fail(builtin.Refuse(toolgate.CodeUnparsableQuery, "sql.query: collation %q cannot be classified", namesText(names)))
		return
	}
	w.parsed.collations = append(w.parsed.collations, ref)
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

// phase says what a check may look at when it refuses. Before
// authorization (Inspect) a refusal may depend only on the query and on
// objects that are not tables or views (functions, operators, types of
// their own); what a table or view is (its columns' types, its row type's
// fields, a view's body) is only reported as resources, so that no
// refusal describes an object the caller may not read. After
// authorization (Run) every check applies.
type phase int

const (
	beforeAuth phase = iota
	afterAuth
)

// resolve looks up functions and relations in the catalog, inside tx, and
// returns every table and view read, views expanded, and the tables and
// views whose row types the query names.
func (b *pgBackend) resolve(ctx context.Context, tx pgx.Tx, p *pgParsed, ph phase) ([]TableRef, error) {
	reg, err := regTypes(ctx, tx)
	if err != nil {
		return nil, err
	}
	typeRels, err := b.checkCalls(ctx, tx, p, "", ph, reg)
	if err != nil {
		return nil, err
	}
	var out []TableRef
	var oids, named []int64
	seen := map[TableRef]bool{}
	add := func(ref TableRef) {
		if !seen[ref] {
			seen[ref] = true
			out = append(out, ref)
		}
	}
	for _, r := range p.rels {
		oid, ref, found, err := resolveRel(ctx, tx, r)
		if err != nil {
			return nil, fmt.Errorf("resolve %s: %w", r, err)
		}
		add(ref)
		if found {
			oids = append(oids, int64(oid))
		}
	}
	for _, t := range typeRels {
		add(t.ref)
		if t.oid != 0 {
			named = append(named, int64(t.oid))
		}
	}
	if ph == afterAuth {
		if err := checkRegColumns(ctx, tx, append(append([]int64{}, oids...), named...), reg); err != nil {
			return nil, err
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
		add(ref)
	}
	if err := rs.Err(); err != nil {
		return nil, err
	}
	rs.Close()
	viewRels, err := b.checkViewCalls(ctx, tx, oids, ph, reg)
	if err != nil {
		return nil, err
	}
	for _, t := range viewRels {
		add(t.ref)
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
// when it is read. It returns the tables and views whose row types the
// bodies name; before authorization it refuses nothing (a refusal would
// describe the view), after it, the first refusal is returned.
func (b *pgBackend) checkViewCalls(ctx context.Context, tx pgx.Tx, oids []int64, ph phase, reg []int64) ([]typeRel, error) {
	rs, err := tx.Query(ctx, viewDepsSQL+`
		SELECT n.nspname, c.relname, pg_get_viewdef(c.oid)
		FROM deps JOIN pg_class c ON c.oid = deps.oid JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE c.relkind = 'v'
		ORDER BY 1, 2`, oids)
	if err != nil {
		return nil, fmt.Errorf("expand views: %w", err)
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
			return nil, err
		}
		views = append(views, v)
	}
	rs.Close()
	if err := rs.Err(); err != nil {
		return nil, err
	}
	var out []typeRel
	for _, v := range views {
		p, err := parsePG(v.def)
		switch {
		case err != nil && ph == beforeAuth:
			continue
		case err != nil:
			return nil, builtin.Refuse(toolgate.CodeUnparsableQuery, "sql.query: the body of view %s cannot be classified: %v", v.ref, err)
		}
		var rels []typeRel
		if ph == beforeAuth {
			rels, err = b.typeRels(ctx, tx, p.types, ph)
		} else {
			rels, err = b.checkCalls(ctx, tx, p, "view "+v.ref.String(), ph, reg)
		}
		if err != nil {
			return nil, err
		}
		out = append(out, rels...)
	}
	return out, nil
}

// typeRel is a table or view whose row type a query names (NULL::t,
// json_populate_record(NULL::t, ...), a column definition of type t):
// naming it shows its columns, so it is read. oid is 0 for a name that
// resolves to no type, which is reported like a table that does not
// exist.
type typeRel struct {
	ref TableRef
	oid uint32
}

// checkCalls checks every function, operator, type and collation p names
// (in, when set, names the view whose body p is, for the refusal) and
// returns the tables and views whose row types it names. reg is the
// catalog-lookup types (regTypes).
func (b *pgBackend) checkCalls(ctx context.Context, tx pgx.Tx, p *pgParsed, in string, ph phase, reg []int64) ([]typeRel, error) {
	seenCall := map[callRef]bool{}
	for _, f := range p.funcs {
		if !seenCall[f] {
			seenCall[f] = true
			if err := b.checkFunction(ctx, tx, f, in, reg); err != nil {
				return nil, err
			}
		}
	}
	seen := map[TableRef]bool{}
	for _, op := range p.ops {
		if !seen[op] {
			seen[op] = true
			if err := b.checkOperator(ctx, tx, op, in); err != nil {
				return nil, err
			}
		}
	}
	seen = map[TableRef]bool{}
	for _, c := range p.collations {
		if !seen[c] {
			seen[c] = true
			if err := checkCollation(ctx, tx, c, in); err != nil {
				return nil, err
			}
		}
	}
	var rels []typeRel
	seen = map[TableRef]bool{}
	for _, t := range p.types {
		if seen[t] {
			continue
		}
		seen[t] = true
		info, err := lookupType(ctx, tx, t, ph)
		if err != nil {
			return nil, err
		}
		if err := b.checkTypeInfo(t, info, in); err != nil {
			return nil, err
		}
		rels = append(rels, info.rels...)
	}
	return rels, nil
}

// typeRels returns the tables and views whose row types types name,
// refusing nothing (for a view's body before authorization).
func (b *pgBackend) typeRels(ctx context.Context, tx pgx.Tx, types []TableRef, ph phase) ([]typeRel, error) {
	var rels []typeRel
	for _, t := range types {
		info, err := lookupType(ctx, tx, t, ph)
		if err != nil {
			return nil, err
		}
		rels = append(rels, info.rels...)
	}
	return rels, nil
}

// regTypeNames are PostgreSQL's catalog-lookup types: the input of each
// (a cast from text, a literal, a text argument where one is expected)
// looks a name up in the catalog, so that 'r7.secret'::regclass answers
// whether a table the caller may not read exists (its oid, or "does not
// exist"), and 'r7=r/postgres'::aclitem whether a role does. Every other
// type of pg_catalog whose name starts with "reg" counts too (regPattern),
// so that one a later PostgreSQL adds is covered. No query may use them:
// not as a cast or a column definition, not through an array, domain,
// composite or range built on one, not as a column of a table or view it
// reads, and not through a function that takes or returns one.
var regTypeNames = []string{
	"regclass", "regproc", "regprocedure", "regoper", "regoperator", "regtype",
	"regnamespace", "regrole", "regconfig", "regdictionary", "regcollation", "aclitem",
}

// regPattern is the SQL condition on pg_type t for a catalog-lookup type
// ($N: regTypeNames).
func regPattern(n int) string {
	return fmt.Sprintf(`(t.typnamespace = 'pg_catalog'::regnamespace AND (t.typname = ANY ($%d::text[]) OR (t.typname LIKE 'reg%%' AND t.typcategory <> 'A')))`, n)
}

// regTypes returns the oids of the catalog-lookup types and of every type
// built on one (arrays, domains, composites, ranges, multiranges).
func regTypes(ctx context.Context, tx pgx.Tx) ([]int64, error) {
	var out []int64
	err := tx.QueryRow(ctx, `
		WITH RECURSIVE base(oid) AS (
			SELECT t.oid FROM pg_type t WHERE `+regPattern(1)+`
		), part(typ, part) AS (
			SELECT t.oid, t.typelem FROM pg_type t WHERE t.typelem <> 0
			UNION ALL
			SELECT t.oid, t.typbasetype FROM pg_type t WHERE t.typbasetype <> 0
			UNION ALL
			SELECT t.oid, a.atttypid
			FROM pg_type t JOIN pg_attribute a ON a.attrelid = t.typrelid JOIN pg_type at ON at.oid = a.atttypid
			WHERE t.typrelid <> 0 AND a.attnum > 0 AND NOT a.attisdropped
			  AND (at.typnamespace <> 'pg_catalog'::regnamespace OR at.oid IN (SELECT oid FROM base) OR at.typelem IN (SELECT oid FROM base))
			UNION ALL
			SELECT r.rngtypid, r.rngsubtype FROM pg_range r
			UNION ALL
			SELECT (to_jsonb(r) ->> 'rngmultitypid')::oid, r.rngtypid FROM pg_range r WHERE to_jsonb(r) ? 'rngmultitypid'
		), reg(oid) AS (
			SELECT oid FROM base
			UNION
			SELECT part.typ FROM part JOIN reg ON reg.oid = part.part
		)
		SELECT coalesce(array_agg(oid::int8), '{}') FROM reg`, regTypeNames).Scan(&out)
	if err != nil {
		return nil, fmt.Errorf("look up the catalog-lookup types: %w", err)
	}
	return out, nil
}

// checkRegColumns refuses reading a table or view among oids that has a
// column of a catalog-lookup type (regTypes): comparing it with text
// looks the text up in the catalog. It runs after authorization only.
func checkRegColumns(ctx context.Context, tx pgx.Tx, oids, reg []int64) error {
	if len(oids) == 0 {
		return nil
	}
	var schema, rel, col, typ string
	err := tx.QueryRow(ctx, `
		SELECT n.nspname, c.relname, a.attname, format_type(a.atttypid, a.atttypmod)
		FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE a.attrelid::int8 = ANY ($1) AND a.attnum > 0 AND NOT a.attisdropped AND a.atttypid::int8 = ANY ($2)
		ORDER BY 1, 2, a.attnum LIMIT 1`, oids, reg).Scan(&schema, &rel, &col, &typ)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil
	case err != nil:
		return fmt.Errorf("look up column types: %w", err)
	}
	return refuseQuery("reading %s: its column %s has type %s, which looks names up in the catalog when it meets text (an existence oracle); "+
		"read it through a view that does not show that column", TableRef{Schema: schema, Name: rel}, col, typ)
}

// checkCollation allows a COLLATE name only when it is one of pg_catalog's
// collations (written unqualified or as pg_catalog.name): looking up
// another would answer whether a schema or collation exists.
func checkCollation(ctx context.Context, tx pgx.Tx, c TableRef, in string) error {
	if c.Schema == "pg_catalog" {
		return nil
	}
	ok := false
	if c.Schema == "" {
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_collation WHERE collname = $1 AND collnamespace = 'pg_catalog'::regnamespace)`, c.Name).Scan(&ok); err != nil {
			return fmt.Errorf("look up collation %s: %w", c, err)
		}
	}
	if !ok {
		return refuseIn(in, "COLLATE %s: only the collations of pg_catalog may be named", c)
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
// refused too. A call is refused as well when an overload PostgreSQL may
// pick for it (one taking that many arguments) takes or returns a
// catalog-lookup type (regTypeNames): to_tsvector('english', body) passes
// 'english' as a regconfig, pg_typeof returns a regtype.
func (b *pgBackend) checkFunction(ctx context.Context, tx pgx.Tx, f callRef, in string, reg []int64) error {
	refuse := func(schema string) error {
		where := "it is not one of the functions known to be safe in a read-only query"
		if schema != "" && schema != "pg_catalog" {
			where = "it is defined outside pg_catalog, where its body may read tables the query does not name"
		}
		return refuseIn(in, "function %s(): %s (list %s in allowed_functions to permit it)", f.TableRef, where, TableRef{Schema: orDefault(schema, "pg_catalog"), Name: f.Name})
	}
	if f.Schema != "" {
		if !b.functionAllowed(f.Schema, f.Name) {
			return refuse(f.Schema)
		}
	} else {
		rs, err := tx.Query(ctx, `
			SELECT DISTINCT n.nspname
			FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
			WHERE p.proname = $1 AND n.nspname = ANY (current_schemas(true))
			ORDER BY 1`, f.Name)
		if err != nil {
			return fmt.Errorf("look up function %s: %w", f.Name, err)
		}
		found := false
		for rs.Next() {
			var schema string
			if err := rs.Scan(&schema); err != nil {
				rs.Close()
				return err
			}
			found = true
			if !b.functionAllowed(schema, f.Name) {
				rs.Close()
				return refuse(schema)
			}
		}
		rs.Close()
		if err := rs.Err(); err != nil {
			return err
		}
		if !found {
			return refuse("")
		}
	}
	var schema, args, result string
	err := tx.QueryRow(ctx, `
		SELECT n.nspname, pg_get_function_identity_arguments(p.oid), format_type(p.prorettype, NULL)
		FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
		WHERE p.proname = $1
		  AND CASE WHEN $2 = '' THEN n.nspname = ANY (current_schemas(true)) ELSE n.nspname = $2 END
		  AND ($3 BETWEEN p.pronargs - p.pronargdefaults AND p.pronargs OR (p.provariadic <> 0 AND $3 >= p.pronargs - 1))
		  AND EXISTS (SELECT 1 FROM unnest(p.proargtypes::oid[] || coalesce(p.proallargtypes, '{}'::oid[]) || p.prorettype) AS u(t)
		              WHERE u.t::int8 = ANY ($4))
		ORDER BY 1, 2 LIMIT 1`, f.Name, f.Schema, f.nargs, reg).Scan(&schema, &args, &result)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil
	case err != nil:
		return fmt.Errorf("look up function %s: %w", f.Name, err)
	}
	return refuseIn(in, "function %s() with %d arguments: PostgreSQL may pick %s.%s(%s) returning %s, which takes or returns a type that looks names up in the catalog "+
		"(regclass, regconfig, regtype, ...: an existence oracle); use a form without it (to_tsvector(body) takes the configuration from default_text_search_config)",
		f.TableRef, f.nargs, schema, f.Name, args, result)
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

// typeInfo is what lookupType found for a type name.
type typeInfo struct {
	found bool
	reg   string // a catalog-lookup type it is or is built on
	// unsafe is a function a cast into it, or into a type it is built
	// on, or a domain constraint of one, runs: how ("cast" or
	// "domain"), schema and name; empty when there is none.
	unsafe []unsafeCall
	rels   []typeRel // tables and views whose row types it is or holds
}

type unsafeCall struct{ how, schema, name string }

// lookupType resolves a type name as PostgreSQL would (the first schema
// of the search path holding it, when unqualified) and follows what it is
// built on: array elements, domain base types, the fields of composite
// types, range subtypes and a multirange's range. The row type of a table
// or view is reported in rels, and followed into its columns only after
// authorization. A name that resolves to no type outside pg_catalog is
// reported in rels too, as a table of that name (oid 0), so that the
// answer before authorization is the same whether it exists or not.
func lookupType(ctx context.Context, tx pgx.Tx, t TableRef, ph phase) (typeInfo, error) {
	rs, err := tx.Query(ctx, `
		WITH RECURSIVE typ(oid) AS (
			SELECT oid FROM (
				SELECT t.oid FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
				WHERE t.typname = $1
				  AND CASE WHEN $2 = '' THEN n.nspname = ANY (current_schemas(true)) ELSE n.nspname = $2 END
				ORDER BY array_position(current_schemas(true), n.nspname::text) LIMIT 1
			) AS named
			UNION
			SELECT p.part
			FROM typ JOIN pg_type t ON t.oid = typ.oid,
			LATERAL (
				SELECT t.typelem WHERE t.typelem <> 0
				UNION ALL
				SELECT t.typbasetype WHERE t.typbasetype <> 0
				UNION ALL
				SELECT a.atttypid FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
				WHERE t.typrelid <> 0 AND a.attrelid = t.typrelid AND a.attnum > 0 AND NOT a.attisdropped
				  AND (c.relkind = 'c' OR $3)
				UNION ALL
				SELECT r.rngsubtype FROM pg_range r WHERE r.rngtypid = t.oid
				UNION ALL
				SELECT r.rngtypid FROM pg_range r WHERE to_jsonb(r) ->> 'rngmultitypid' = t.oid::text
			) AS p(part)
		)
		SELECT 0, 'found', '', '', 0::int8 WHERE EXISTS (SELECT FROM typ)
		UNION ALL
		SELECT 1, 'reg', '', t.typname::text, 0 FROM typ JOIN pg_type t ON t.oid = typ.oid
		WHERE `+regPattern(4)+`
		UNION ALL
		SELECT 2, 'cast', pn.nspname, p.proname, 0
		FROM typ JOIN pg_cast c ON c.casttarget = typ.oid
		JOIN pg_proc p ON p.oid = c.castfunc JOIN pg_namespace pn ON pn.oid = p.pronamespace
		WHERE pn.nspname <> 'pg_catalog'
		  AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.classid = 'pg_cast'::regclass AND d.objid = c.oid
		                  AND d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e')
		UNION ALL
		SELECT 2, 'domain', pn.nspname, p.proname, 0
		FROM typ JOIN pg_constraint k ON k.contypid = typ.oid
		JOIN pg_depend d ON d.classid = 'pg_constraint'::regclass AND d.objid = k.oid AND d.refclassid = 'pg_proc'::regclass
		JOIN pg_proc p ON p.oid = d.refobjid JOIN pg_namespace pn ON pn.oid = p.pronamespace
		UNION ALL
		SELECT 3, 'rel', n.nspname, c.relname, c.oid::int8
		FROM typ JOIN pg_type t ON t.oid = typ.oid JOIN pg_class c ON c.oid = t.typrelid JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE c.relkind IN ('r', 'p', 'v', 'm', 'f')
		ORDER BY 1, 2, 3, 4`, t.Name, t.Schema, ph == afterAuth, regTypeNames)
	if err != nil {
		return typeInfo{}, fmt.Errorf("look up type %s: %w", t, err)
	}
	defer rs.Close()
	var info typeInfo
	for rs.Next() {
		var (
			prio         int
			kind, sc, nm string
			oid          int64
		)
		if err := rs.Scan(&prio, &kind, &sc, &nm, &oid); err != nil {
			return typeInfo{}, err
		}
		switch kind {
		case "found":
			info.found = true
		case "reg":
			if info.reg == "" {
				info.reg = nm
			}
		case "cast", "domain":
			info.unsafe = append(info.unsafe, unsafeCall{kind, sc, nm})
		case "rel":
			info.rels = append(info.rels, typeRel{ref: TableRef{Schema: sc, Name: nm}, oid: uint32(oid)})
		}
	}
	if err := rs.Err(); err != nil {
		return typeInfo{}, err
	}
	rs.Close()
	if !info.found && t.Schema != "pg_catalog" {
		ref := t
		if ref.Schema == "" {
			if err := tx.QueryRow(ctx, `SELECT coalesce(current_schema(), 'public')`).Scan(&ref.Schema); err != nil {
				return typeInfo{}, err
			}
		}
		info.rels = append(info.rels, typeRel{ref: ref})
	}
	return info, nil
}

// checkTypeInfo refuses a type (a cast to it, a column of it) that is or
// is built on a catalog-lookup type, or that can run a function that is
// not allowed: a cast into it defined with a function outside pg_catalog
// (CREATE CAST ... WITH FUNCTION), or, for a domain, a CHECK constraint
// calling one, on it or on any type it is built on.
func (b *pgBackend) checkTypeInfo(t TableRef, info typeInfo, in string) error {
	if info.reg != "" {
		what := "is"
		if info.reg != t.Name {
			what = "is built on"
		}
		return refuseIn(in, "type %s: it %s %s, a type whose input looks names up in the catalog (an existence oracle: 'r7.secret'::regclass); "+
			"these types may not be used: %s and every other reg* type", t, what, info.reg, strings.Join(regTypeNames, ", "))
	}
	for _, u := range info.unsafe {
		if b.functionAllowed(u.schema, u.name) {
			continue
		}
		how := "a cast into it"
		if u.how == "domain" {
			how = "its domain constraint"
		}
		return refuseIn(in, "type %s: %s runs %s.%s(), which is not known to be safe (list it in allowed_functions to permit it)", t, how, u.schema, u.name)
	}
	return nil
}

func (b *pgBackend) inspect(ctx context.Context, q string) ([]TableRef, error) {
	p, err := parsePG(q)
	if err != nil {
		return nil, err
	}
	var refs []TableRef
	err = b.readTx(ctx, func(tx pgx.Tx) error {
		refs, err = b.resolve(ctx, tx, p, beforeAuth)
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
		if _, err := b.resolve(ctx, tx, p, afterAuth); err != nil {
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
// show. Values arrive in PostgreSQL's text format, of which a value takes
// at least half, less one byte, in Content (bytea's "\x" and hex digits
// are the worst), so a row is refused by the collector before it is
// decoded; the binary format would let a few bytes decode to far more (a
// numeric 1e131071 is 14 bytes, and 131072 digits).
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
					n += max(len(v)/2-1, 0)
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
