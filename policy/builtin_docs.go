package policy

import (
	"regexp"
	"sort"
	"strings"
)

// Database is a database the built-in sql.* tools reach (kind: Database).
// Every sql.* tool takes a "database" argument naming one (optional when
// there is only one), and reports what a query reads as sql_table
// resources named "<name>.<table>" (SQLite) or "<name>.<schema>.<table>"
// (PostgreSQL), which principals need {resource: sql_table, action: read}
// grants on (docs/design.md, "The decision", check 8).
//
//   - kind: Database
//     name: shop
//     driver: sqlite
//     path: shop.db          # relative to the bundle folder
//     init_sql: shop.sql     # creates shop.db on first use when it is missing
//     statement_timeout: 5s
//     max_rows: 200
//
// Database documents are read when the gateway (or toolgate call) starts;
// changing them needs a restart.
type Database struct {
	Pos `yaml:"-"`
	// Name is how tools and resources name the database: lowercase letters,
	// digits, '_' and '-', no dots. Required, unique.
	Name        string `yaml:"name"`
	Description string `yaml:"description"`
	// Driver is sqlite or postgres. Required.
	Driver string `yaml:"driver"`
	// Path is the SQLite file (sqlite only), relative to the bundle folder
	// unless absolute. It is opened read-only and never created, except
	// from InitSQL.
	Path string `yaml:"path"`
	// InitSQL (sqlite only) is a SQL script, relative to the bundle folder
	// unless absolute, that creates Path when Path does not exist (for
	// examples and fixtures). An existing file is never touched.
	InitSQL string `yaml:"init_sql"`
	// DSN is the PostgreSQL connection string (postgres only), written
	// literally or as {from_env: VAR} / {from_file: PATH}; its role should
	// itself be read-only.
	DSN Secret `yaml:"dsn"`
	// StatementTimeout bounds each statement; default 5s.
	StatementTimeout Duration `yaml:"statement_timeout"`
	// MaxRows is the most rows one sql.query returns (default 200); more
	// are cut, and the cut is marked.
	MaxRows int `yaml:"max_rows"`
	// AllowedFunctions (postgres only) lists functions, as schema.name,
	// that queries may call besides the built-in allow-list of pg_catalog
	// functions known to be safe; every other one is refused (a function
	// outside pg_catalog may read tables the query does not name, one of
	// pg_catalog may reach files or server state). An unquoted part is read
	// in lower case, a part in double quotes as written.
	AllowedFunctions []string `yaml:"allowed_functions"`
}

// builtinNames are the function names of the built-in tools, which a Tool's
// source.builtin may name (package builtin/registry builds them).
var builtinNames = []string{"fs.list", "fs.read", "fs.search", "sql.describe_table", "sql.list_tables", "sql.query"}

// BuiltinNames returns the built-in tools a Tool's source.builtin may name,
// sorted.
func BuiltinNames() []string { return append([]string(nil), builtinNames...) }

var databaseName = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]*$`)

// databases checks the Database documents and the Tools whose source is a
// built-in tool (Wyrd: an unknown tool name fails registration).
func (v *validator) databases() {
	seen := map[string]*Database{}
	for _, d := range v.b.Databases {
		where := "Database " + d.Name
		switch {
		case d.Name == "":
			v.r.Errorf(d.Pos, "Database has no name")
			continue
		case !databaseName.MatchString(d.Name):
			v.r.Errorf(d.Pos, "%s: name must be lowercase letters, digits, '_' or '-', starting with a letter or digit (no dots: it is the first part of its tables' resource names)", where)
			continue
		}
		if prev, dup := seen[d.Name]; dup {
			v.r.Errorf(d.Pos, "duplicate %s (first declared at %s)", where, prev.Pos.At())
			continue
		}
		seen[d.Name] = d
		hasDSN := d.DSN != (Secret{})
		switch d.Driver {
		case "sqlite":
			if d.Path == "" {
				v.r.Errorf(d.Pos, "%s: driver sqlite needs path (the database file)", where)
			}
			if hasDSN {
				v.r.Errorf(d.Pos, "%s: dsn is for driver postgres; give path for sqlite", where)
			}
			if len(d.AllowedFunctions) > 0 {
				v.r.Errorf(d.Pos, "%s: allowed_functions is for driver postgres", where)
			}
		case "postgres":
			if !hasDSN {
				v.r.Errorf(d.Pos, "%s: driver postgres needs dsn (a connection string, or {from_env: VAR})", where)
			}
			if d.Path != "" || d.InitSQL != "" {
				v.r.Errorf(d.Pos, "%s: path and init_sql are for driver sqlite; give dsn for postgres", where)
			}
		case "":
			v.r.Errorf(d.Pos, "%s: driver is required (sqlite or postgres)", where)
		default:
			v.r.Errorf(d.Pos, "%s: driver %q is not supported (want sqlite or postgres)", where, d.Driver)
		}
		if d.MaxRows < 0 {
			v.r.Errorf(d.Pos, "%s: max_rows must be 0 (the default, 200) or more", where)
		}
		for _, f := range d.AllowedFunctions {
			// PostgreSQL's identifier syntax: a part in double quotes is
			// taken as written, an unquoted one in lower case.
			if parts, ok := SplitName(f); !ok || len(parts) != 2 || parts[0] == "" || parts[1] == "" {
				v.r.Errorf(d.Pos, "%s: allowed_functions entry %q must be schema.name (a part holding '.' or '\"' in double quotes)", where, f)
			}
		}
	}
	usesSQL := false
	for _, t := range v.b.Tools {
		name := t.Source.Builtin
		if name == "" {
			continue
		}
		id := ToolIDOf(t)
		i := sort.SearchStrings(builtinNames, name)
		if i == len(builtinNames) || builtinNames[i] != name {
			v.r.Errorf(t.Pos, "Tool %s: source.builtin %q is not a built-in tool (registration refused; the built-in tools are %s)", id, name, strings.Join(builtinNames, ", "))
			continue
		}
		if t.SideEffectClass == "none" {
			v.r.Errorf(t.Pos, "Tool %s: the built-in tool %s reads, so its side_effect_class must be read or higher, not none", id, name)
		}
		if strings.HasPrefix(name, "sql.") {
			usesSQL = true
			if len(v.b.Databases) == 0 {
				v.r.Errorf(t.Pos, "Tool %s: source.builtin %s needs at least one Database document for it to reach", id, name)
			}
		}
	}
	if !usesSQL {
		for _, d := range v.b.Databases {
			v.r.Warnf(d.Pos, "Database %s: no Tool has source.builtin sql.*, so nothing can reach it", d.Name)
		}
	}
}
