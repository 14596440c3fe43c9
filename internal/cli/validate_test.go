package cli_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	tggateway "github.com/toolgate/toolgate/gateway"
	"github.com/toolgate/toolgate/policy"
)

// prepBase is a valid bundle the preparation cases add one defect to.
const prepBase = `
- {kind: Tool, tool_id: tool:note-read, side_effect_class: read}
- kind: Agent
  agent_id: a
  tool_permissions: [{tool_id: tool:note-read, side_effect_class: read}]
- {kind: RuntimePolicy, agent_id: a, deployment_mode: production, tool_authorization_policy: {active_tool_set: all}}
`

// sqlTool lets a Database be reached (no "nothing can reach it" warning).
const sqlTool = `
- {kind: Tool, name: sql.query, tool_id: tool:sql-query, side_effect_class: read, source: {builtin: sql.query}}
`

// unsetVar is an environment variable the tests make sure is not set.
const unsetVar = "TOOLGATE_TEST_NEVER_SET_7F3A"

// TestValidatePreparesLikeServe pins finding 7 (the validate half) and the
// empty env value of finding 14 of issue 7: toolgate validate prepares
// everything serve does short of listening (gateway.Prepare), so every
// bundle serve refuses at start, validate refuses too, with the same
// diagnostics. Before, validate passed each of these (except the
// unsupported driver, a control) and serve then refused it.
func TestValidatePreparesLikeServe(t *testing.T) {
	os.Unsetenv(unsetVar)
	cases := []struct {
		name    string
		bundle  string
		files   map[string]string // more files of the bundle folder
		connect bool              // validate --connect (serve always connects)
		want    string            // in some error
	}{
		{name: "missing jwks_file", bundle: prepBase + `
- kind: Settings
  jwt_issuers: [{issuer: "https://idp.example/", audience: [tg], jwks_file: missing-jwks.json, agent_id: a}]
`, want: "missing-jwks.json"},
		{name: "jwks_file that is no key set", bundle: prepBase + `
- kind: Settings
  jwt_issuers: [{issuer: "https://idp.example/", audience: [tg], jwks_file: jwks.json, agent_id: a}]
`, files: map[string]string{"jwks.json": "not json"}, want: "JWT issuer"},
		{name: "empty env value", bundle: prepBase + `
- {kind: Upstream, name: up, transport: stdio, command: node, env: {TOKEN: ""}}
`, want: "Upstream up: env TOKEN is empty"},
		{name: "env secret from an unset variable", bundle: prepBase + `
- {kind: Upstream, name: up, transport: stdio, command: node, env: {TOKEN: {from_env: ` + unsetVar + `}}}
`, want: `upstream "up": env.TOKEN: secret: environment variable ` + unsetVar + ` is not set`},
		{name: "header secret from a missing file", bundle: prepBase + `
- {kind: Upstream, name: up, transport: streamable-http, url: "http://127.0.0.1:9/mcp", headers: {Authorization: {from_file: /nonexistent/toolgate-token}}}
`, want: `upstream "up": headers.Authorization: secret:`},
		{name: "header secret from an empty file", bundle: prepBase + `
- {kind: Upstream, name: up, transport: streamable-http, url: "http://127.0.0.1:9/mcp", headers: {Authorization: {from_file: TOKENFILE}}}
`, files: map[string]string{"token": ""}, want: "is empty"},
		{name: "upstream url that is not http", bundle: prepBase + `
- {kind: Upstream, name: up, transport: streamable-http, url: "ftp://127.0.0.1/mcp"}
`, want: `upstream "up": url: must be an absolute http or https URL`},
		{name: "env name that is not a variable name", bundle: prepBase + `
- {kind: Upstream, name: up, transport: stdio, command: node, env: {BAD-NAME: x}}
`, want: `env.BAD-NAME: not a valid environment variable name`},
		{name: "header name that is not a header name", bundle: prepBase + `
- {kind: Upstream, name: up, transport: streamable-http, url: "http://127.0.0.1:9/mcp", headers: {"Bad Header": x}}
`, want: `headers.Bad Header: not a valid HTTP header name`},
		{name: "sqlite file missing", bundle: prepBase + sqlTool + `
- {kind: Database, name: shop, driver: sqlite, path: missing.db}
`, want: `database "shop": sqlite file:`},
		{name: "sqlite path that is a folder", bundle: prepBase + sqlTool + `
- {kind: Database, name: shop, driver: sqlite, path: sub}
`, files: map[string]string{"sub/keep": "x"}, want: "is not a regular file"},
		{name: "sqlite file that is no database", bundle: prepBase + sqlTool + `
- {kind: Database, name: shop, driver: sqlite, path: shop.db}
`, files: map[string]string{"shop.db": strings.Repeat("not a database ", 100)}, want: `database "shop": read schema:`},
		{name: "init_sql script missing", bundle: prepBase + sqlTool + `
- {kind: Database, name: shop, driver: sqlite, path: new.db, init_sql: missing.sql}
`, want: "Database shop: init_sql:"},
		{name: "postgres dsn that does not parse", bundle: prepBase + sqlTool + `
- {kind: Database, name: pg, driver: postgres, dsn: "host=127.0.0.1 port=notaport"}
`, want: `database "pg": dsn:`},
		{name: "postgres dsn from an unset variable", bundle: prepBase + sqlTool + `
- {kind: Database, name: pg, driver: postgres, dsn: {from_env: ` + unsetVar + `}}
`, want: "Database pg: dsn: secret: environment variable " + unsetVar + " is not set"},
		{name: "postgres server that does not answer", connect: true, bundle: prepBase + sqlTool + `
- {kind: Database, name: pg, driver: postgres, dsn: "postgres://postgres@127.0.0.1:1/test?sslmode=disable&connect_timeout=5"}
`, want: `database "pg":`},
		{name: "unsupported driver (validation)", bundle: prepBase + sqlTool + `
- {kind: Database, name: shop, driver: mysql, dsn: x}
`, want: `driver "mysql" is not supported`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for name, body := range tc.files {
				p := filepath.Join(dir, name)
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			bundle := strings.ReplaceAll(tc.bundle, "TOKENFILE", filepath.Join(dir, "token"))
			if err := os.WriteFile(filepath.Join(dir, "bundle.yaml"), []byte(bundle), 0o644); err != nil {
				t.Fatal(err)
			}

			args := []string{"validate", "--bundle", dir, "-o", "json"}
			if tc.connect {
				args = append(args, "--connect")
			}
			r := runCLI(t, args...)
			var got struct {
				OK bool `json:"ok"`
				policy.Report
			}
			decodeObject(t, r.stdout, &got)
			if r.code != 1 || got.OK {
				t.Fatalf("validate: exit %d, ok %v, want 1 and false\nstdout: %s\nstderr: %s", r.code, got.OK, r.stdout, r.stderr)
			}
			if !mentions(got.Errors, tc.want) {
				t.Errorf("validate: no error mentions %q: %v", tc.want, got.Errors)
			}

			serveErrs := serveStartErrors(t, dir)
			if diff := cmp.Diff(got.Errors, serveErrs); diff != "" {
				t.Errorf("validate and serve disagree (-validate +serve):\n%s", diff)
			}
		})
	}
}

// TestValidateExampleBundlePrepares checks that the example bundle passes
// the preparation as serve runs it, without validate writing anything.
func TestValidateExampleBundlePrepares(t *testing.T) {
	dir := copyBundle(t)
	script, err := os.ReadFile(filepath.Join(exampleBundle, "shop.sql"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "shop.sql"), script, 0o644); err != nil {
		t.Fatal(err)
	}
	before, _ := filepath.Glob(filepath.Join(dir, "*"))
	r := runCLI(t, "validate", "--bundle", dir)
	if r.code != 0 {
		t.Fatalf("validate: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	after, _ := filepath.Glob(filepath.Join(dir, "*"))
	if diff := cmp.Diff(before, after); diff != "" {
		t.Errorf("validate wrote to the bundle folder (-before +after):\n%s", diff)
	}
	if !strings.Contains(r.stdout, "serve creates it from init_sql") {
		t.Errorf("validate does not say the database will be created: %s", r.stdout)
	}
}

func mentions(ds []policy.Diagnostic, s string) bool {
	for _, d := range ds {
		if strings.Contains(d.String(), s) {
			return true
		}
	}
	return false
}

// serveStartErrors starts the gateway on dir, which must refuse to start,
// and returns the errors it refused with. Nothing may be created in its
// data folder.
func serveStartErrors(t *testing.T, dir string) []policy.Diagnostic {
	t.Helper()
	data := filepath.Join(t.TempDir(), "data")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	err := tggateway.Run(ctx, tggateway.Config{BundleDir: dir, Listen: "127.0.0.1:0", DataDir: data,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Ready:  func(string) { t.Error("serve started"); cancel() },
		Mount:  func(*http.ServeMux, *tggateway.Gateway) {}}, nil)
	var inv *tggateway.InvalidError
	if !errors.As(err, &inv) {
		t.Fatalf("serve: %v, want an *InvalidError", err)
	}
	if !strings.Contains(err.Error(), "run toolgate validate --bundle "+dir) {
		t.Errorf("serve's error does not point to validate: %v", err)
	}
	if _, err := os.Stat(data); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("serve created its data folder before refusing the bundle: %v", err)
	}
	return inv.Report.Errors
}
