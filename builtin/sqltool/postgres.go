package sqltool

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
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
	allowed map[string]bool // "schema.name" functions outside pg_catalog
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
	b := &pgBackend{cfg: cfg, pool: pool, allowed: map[string]bool{}}
	for _, f := range cfg.AllowedFunctions {
		b.allowed[strings.ToLower(f)] = true
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

// splitQualified splits "schema.table" written by a caller; quoted
// identifiers are not supported here, names are taken literally.
func splitQualified(name string) TableRef {
	if s, t, ok := strings.Cut(name, "."); ok {
		return TableRef{Schema: s, Name: t}
	}
	return TableRef{Name: name}
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
		_, r, _, err := resolveRel(ctx, tx, splitQualified(name))
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
}

// deniedPGFunctions reach files, other servers or server state, run SQL
// text the analysis cannot see, or write.
var deniedPGFunctions = map[string]bool{
	"pg_read_file": true, "pg_read_binary_file": true, "pg_stat_file": true,
	"lo_import": true, "lo_export": true, "loread": true, "lowrite": true,
	"query_to_xml": true, "query_to_xmlschema": true, "query_to_xml_and_xmlschema": true,
	"cursor_to_xml": true, "cursor_to_xmlschema": true,
	"table_to_xml": true, "table_to_xmlschema": true, "table_to_xml_and_xmlschema": true,
	"ts_stat": true, "ts_rewrite": true,
	"set_config": true, "nextval": true, "setval": true,
	"pg_sleep": true, "pg_sleep_for": true, "pg_sleep_until": true,
	"pg_terminate_backend": true, "pg_cancel_backend": true, "pg_reload_conf": true, "pg_rotate_logfile": true,
	"pg_promote": true, "pg_switch_wal": true, "pg_create_restore_point": true,
	"pg_backup_start": true, "pg_backup_stop": true, "pg_start_backup": true, "pg_stop_backup": true,
	"pg_notify": true, "pg_logical_emit_message": true, "pg_import_system_collations": true,
	"pg_log_backend_memory_contexts": true, "pg_nextoid": true, "pg_current_logfile": true,
	"pg_wal_replay_pause": true, "pg_wal_replay_resume": true, "txid_current": true, "pg_current_xact_id": true,
	"pg_export_snapshot": true,
}

// deniedPGPrefixes cover families: large objects, dblink, directory
// listings, file access, advisory locks, replication and statistics resets.
var deniedPGPrefixes = []string{
	"lo_", "dblink", "pg_ls_", "pg_read_", "pg_file_", "pg_advisory", "pg_try_advisory",
	"schema_to_xml", "database_to_xml", "pg_replication_", "pg_logical_slot_", "pg_create_", "pg_drop_",
	"pg_copy_", "pg_stat_reset", "binary_upgrade_",
}

func deniedPGFunction(name string) bool {
	name = strings.ToLower(name)
	if deniedPGFunctions[name] {
		return true
	}
	for _, p := range deniedPGPrefixes {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
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

func (w *walker) funcCall(n *pg.FuncCall) {
	var parts []string
	for _, p := range n.Funcname {
		parts = append(parts, p.GetString_().GetSval())
	}
	name := strings.Join(parts, ".")
	if len(parts) == 0 || len(parts) > 2 || slices.Contains(parts, "") {
		w.fail(builtin.Refuse(toolgate.CodeUnparsableQuery, "sql.query: function name %q cannot be classified", name))
		return
	}
	ref := TableRef{Name: parts[len(parts)-1]}
	if len(parts) == 2 {
		ref.Schema = parts[0]
	}
	if deniedPGFunction(ref.Name) {
		w.fail(refuseQuery("function %s(), which reaches files, other connections or server state", name))
		return
	}
	w.parsed.funcs = append(w.parsed.funcs, ref)
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
	seenF := map[TableRef]bool{}
	for _, f := range p.funcs {
		if seenF[f] {
			continue
		}
		seenF[f] = true
		if err := b.checkFunction(ctx, tx, f); err != nil {
			return nil, err
		}
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
	rs, err := tx.Query(ctx, `
		WITH RECURSIVE deps(oid) AS (
			SELECT unnest($1::int8[])::oid
			UNION
			SELECT d.refobjid
			FROM deps
			JOIN pg_rewrite r ON r.ev_class = deps.oid
			JOIN pg_depend d ON d.classid = 'pg_rewrite'::regclass AND d.objid = r.oid
			                AND d.refclassid = 'pg_class'::regclass AND d.refobjid <> deps.oid
		)
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
	return out, rs.Err()
}

// checkFunction refuses a function defined outside pg_catalog, unless the
// configuration allows it: its body may read tables the query never names.
func (b *pgBackend) checkFunction(ctx context.Context, tx pgx.Tx, f TableRef) error {
	if f.Schema != "" {
		if f.Schema == "pg_catalog" || b.allowed[strings.ToLower(f.String())] {
			return nil
		}
		return refuseQuery("function %s(): it is defined outside pg_catalog (list it in allowed_functions to permit it)", f)
	}
	rs, err := tx.Query(ctx, `
		SELECT DISTINCT n.nspname
		FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
		WHERE p.proname = $1 AND n.nspname = ANY (current_schemas(true))`, f.Name)
	if err != nil {
		return fmt.Errorf("look up function %s: %w", f.Name, err)
	}
	defer rs.Close()
	for rs.Next() {
		var schema string
		if err := rs.Scan(&schema); err != nil {
			return err
		}
		if schema != "pg_catalog" && !b.allowed[strings.ToLower(schema+"."+f.Name)] {
			return refuseQuery("function %s(): %s.%s is defined outside pg_catalog (list it in allowed_functions to permit it)", f.Name, schema, f.Name)
		}
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

func (b *pgBackend) run(ctx context.Context, q string, maxRows int) (rows, error) {
	var out rows
	p, err := parsePG(q)
	if err != nil {
		return out, err
	}
	err = b.readTx(ctx, func(tx pgx.Tx) error {
		if _, err := b.resolve(ctx, tx, p); err != nil {
			return err
		}
		// A cursor lets us stop after maxRows+1 rows. The extended
		// protocol refuses more than one statement, a third guard.
		res := tx.Conn().PgConn().ExecParams(ctx, "DECLARE toolgate_query NO SCROLL CURSOR FOR "+p.stmt, nil, nil, nil, nil).Read()
		if res.Err != nil {
			return fmt.Errorf("sql.query %s: %w", b.cfg.Name, res.Err)
		}
		rs, err := tx.Query(ctx, fmt.Sprintf("FETCH FORWARD %d FROM toolgate_query", maxRows+1))
		if err != nil {
			return fmt.Errorf("sql.query %s: %w", b.cfg.Name, err)
		}
		defer rs.Close()
		for _, fd := range rs.FieldDescriptions() {
			out.columns = append(out.columns, fd.Name)
		}
		for rs.Next() {
			if len(out.values) == maxRows {
				out.more = true
				break
			}
			vals, err := rs.Values()
			if err != nil {
				return err
			}
			for i := range vals {
				vals[i] = jsonValue(vals[i])
			}
			out.values = append(out.values, vals)
		}
		rs.Close()
		if err := rs.Err(); err != nil {
			return fmt.Errorf("sql.query %s: %w", b.cfg.Name, err)
		}
		return nil
	})
	return out, err
}
