package policy_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/toolgate/toolgate/policy"
)

// builtinBase declares one sqlite database and the sql.query tool over it.
const builtinBase = `
- {kind: Database, name: shop, driver: sqlite, path: shop.db}
- {kind: Tool, name: sql.query, side_effect_class: read, source: {builtin: sql.query}}
`

// databaseCases use the # want markers of TestValidate.
var databaseCases = []validateCase{
	{name: "unknown built-in tool", files: one("tools.yaml", `
- {kind: Tool, name: code.run, side_effect_class: read, source: {builtin: code.run}}   # want error "source.builtin \"code.run\" is not a built-in tool"
`)},
	{name: "sql tool without a database", files: one("tools.yaml", `
- {kind: Tool, name: sql.query, side_effect_class: read, source: {builtin: sql.query}}   # want error "needs at least one Database"
`)},
	{name: "built-in tool declared side-effect free", files: one("tools.yaml", `
- {kind: Database, name: shop, driver: sqlite, path: shop.db}
- {kind: Tool, name: sql.query, side_effect_class: none, source: {builtin: sql.query}}   # want error "must be read or higher"
`)},
	{name: "database name with a dot", files: one("db.yaml", builtinBase+`
- {kind: Database, name: shop.eu, driver: sqlite, path: eu.db}   # want error "no dots"
`)},
	{name: "duplicate database", files: one("db.yaml", builtinBase+`
- {kind: Database, name: shop, driver: sqlite, path: other.db}   # want error "db.yaml:2"
`)},
	{name: "sqlite without path", files: one("db.yaml", `
- {kind: Tool, name: sql.query, side_effect_class: read, source: {builtin: sql.query}}
- {kind: Database, name: shop, driver: sqlite}   # want error "needs path"
`)},
	{name: "postgres without dsn", files: one("db.yaml", `
- {kind: Tool, name: sql.query, side_effect_class: read, source: {builtin: sql.query}}
- {kind: Database, name: wh, driver: postgres}   # want error "needs dsn"
`)},
	{name: "postgres with a path", files: one("db.yaml", `
- {kind: Tool, name: sql.query, side_effect_class: read, source: {builtin: sql.query}}
- {kind: Database, name: wh, driver: postgres, dsn: x, init_sql: x.sql}   # want error "path and init_sql are for driver sqlite"
`)},
	{name: "sqlite with a dsn", files: one("db.yaml", `
- {kind: Tool, name: sql.query, side_effect_class: read, source: {builtin: sql.query}}
- {kind: Database, name: shop, driver: sqlite, path: s.db, dsn: {from_env: DSN}}   # want error "dsn is for driver postgres"
`)},
	{name: "unknown driver", files: one("db.yaml", `
- {kind: Tool, name: sql.query, side_effect_class: read, source: {builtin: sql.query}}
- {kind: Database, name: shop, driver: mysql, dsn: x}   # want error "driver \"mysql\" is not supported"
`)},
	{name: "bad allowed function", files: one("db.yaml", `
- {kind: Tool, name: sql.query, side_effect_class: read, source: {builtin: sql.query}}
- {kind: Database, name: wh, driver: postgres, dsn: x, allowed_functions: [f]}   # want error "must be schema.name"
`)},
	{name: "unknown field", files: one("db.yaml", builtinBase+`
- {kind: Database, name: wh, driver: postgres, dsn: x, password: y}   # want error "unknown field \"password\""
`)},
	{name: "database nothing reaches", files: one("db.yaml", `
- {kind: Database, name: shop, driver: sqlite, path: shop.db}   # want warning "nothing can reach it"
`)},
}

func TestValidateDatabases(t *testing.T) {
	for _, c := range databaseCases {
		t.Run(c.name, func(t *testing.T) {
			b := &policy.Bundle{}
			for _, f := range c.files {
				b.AddYAML(f.name, []byte(f.body))
			}
			rep := b.Validate(c.opts)
			type diag struct{ key, msg string }
			var got []diag
			for _, d := range rep.Errors {
				got = append(got, diag{fmt.Sprintf("error %s:%d", d.File, d.Line), d.Message})
			}
			for _, d := range rep.Warnings {
				got = append(got, diag{fmt.Sprintf("warning %s:%d", d.File, d.Line), d.Message})
			}
			var wantKeys, gotKeys []string
			for _, w := range markers(c.files) {
				wantKeys = append(wantKeys, fmt.Sprintf("%s %s:%d", w.Severity, w.File, w.Line))
				if !slices.ContainsFunc(got, func(d diag) bool {
					return d.key == fmt.Sprintf("%s %s:%d", w.Severity, w.File, w.Line) && strings.Contains(d.msg, w.mention)
				}) {
					t.Errorf("no %s at %s:%d mentions %q; got %v", w.Severity, w.File, w.Line, w.mention, got)
				}
			}
			for _, d := range got {
				gotKeys = append(gotKeys, d.key)
			}
			slices.Sort(wantKeys)
			slices.Sort(gotKeys)
			if diff := cmp.Diff(wantKeys, gotKeys); diff != "" {
				t.Errorf("diagnostics (-want +got):\n%s\n%v", diff, got)
			}
		})
	}
}

func TestValidateBuiltinBase(t *testing.T) {
	b := &policy.Bundle{}
	b.AddYAML("base.yaml", []byte(builtinBase+`
- {kind: Database, name: wh, driver: postgres, dsn: {from_env: WH_DSN}, statement_timeout: 3s, max_rows: 50, allowed_functions: [public.score]}
`))
	rep := b.Validate(nil)
	if len(rep.Errors)+len(rep.Warnings) > 0 {
		t.Fatalf("errors %v warnings %v", rep.Errors, rep.Warnings)
	}
	if len(b.Databases) != 2 || b.Databases[1].DSN.FromEnv != "WH_DSN" || b.Databases[1].StatementTimeout.D().Seconds() != 3 {
		t.Errorf("decoded %+v", b.Databases[1])
	}
}
