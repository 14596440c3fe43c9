package gateway

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"

	"github.com/toolgate/toolgate/adapter/builtins"
	"github.com/toolgate/toolgate/authz"
	"github.com/toolgate/toolgate/builtin/registry"
	"github.com/toolgate/toolgate/builtin/sqltool"
	"github.com/toolgate/toolgate/identity"
	"github.com/toolgate/toolgate/policy"
	"github.com/toolgate/toolgate/upstream"
)

// PrepareOptions tunes Prepare. nil is valid and means what serve does.
type PrepareOptions struct {
	// CheckOnly prepares without writing anything and keeps nothing open
	// (toolgate validate): each SQLite database is opened read-only and
	// closed again, one that is missing with an init_sql script is not
	// created (the script is checked instead), and Prepared.Builtins is
	// nil. Without it, the built-in tools are opened as serve runs them.
	CheckOnly bool
	// Connect, with CheckOnly, also connects to each PostgreSQL database
	// and pings it; without it only the DSN is parsed. Serve always
	// connects.
	Connect bool
	// Logger gets what the identity settings log; nil discards.
	Logger *slog.Logger
}

// Prepared is a bundle made ready to serve: everything toolgate serve does
// before it opens its store, listens and starts upstream processes.
type Prepared struct {
	// BundleDir is the bundle folder.
	BundleDir string
	// Bundle is the loaded bundle; Snapshot its compilation.
	Bundle   *policy.Bundle
	Snapshot *authz.Snapshot
	// Report has no errors; its warnings are validation's and the
	// preparation's own (an upstream command not found, a database that
	// init_sql will create).
	Report *policy.Report
	// Upstreams are the upstream configurations, validated, every secret
	// resolved once (they are resolved again at each start).
	Upstreams []upstream.Config
	// Credentials is the credential table, with the JWT and delegation
	// token verification of the identity settings (every jwks_file read).
	Credentials *identity.Table
	// Builtins are the built-in tools, open; nil with CheckOnly.
	Builtins *registry.Registry

	keys *identity.Keyring
}

// Close releases what Prepare opened: the built-in tools' databases.
func (p *Prepared) Close() error {
	if p == nil || p.Builtins == nil {
		return nil
	}
	return p.Builtins.Close()
}

// InvalidError is Prepare's error for a bundle that serve refuses at
// start: every problem found, each at its file and line where known.
type InvalidError struct {
	BundleDir string
	// Bundle is the loaded bundle.
	Bundle *policy.Bundle
	// Report holds the problems as errors, and the warnings.
	Report *policy.Report
}

// Error lists every problem, one per line.
func (e *InvalidError) Error() string {
	return fmt.Sprintf("the bundle %s is invalid; run toolgate validate --bundle %s: %v", e.BundleDir, e.BundleDir, e.Report.Err())
}

// Prepare does everything toolgate serve does before it opens its store,
// listens and starts upstream processes, and refuses what serve would
// refuse at start: it loads and validates the bundle folder cfg.BundleDir
// and compiles it; checks every Upstream as the upstream manager would
// (its configuration, and that every env and header secret resolves:
// {from_env} set, {from_file} readable, no value empty); builds the
// identity settings (every jwks_file read, every jwt_issuers entry
// usable); and checks every Database (its DSN secret, a SQLite file that
// opens read-only or an init_sql script that will create it, a PostgreSQL
// DSN that parses, and, unless CheckOnly without Connect, a server that
// answers), then, unless CheckOnly, opens the built-in tools.
//
// toolgate serve is Prepare and then start; toolgate validate is Prepare
// with CheckOnly and then Close. A bundle folder that cannot be read is a
// plain error; anything else that is wrong is an *InvalidError naming
// every problem. The caller closes the result.
func Prepare(ctx context.Context, cfg Config, opts *PrepareOptions) (*Prepared, error) {
	var o PrepareOptions
	if opts != nil {
		o = *opts
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	b, err := policy.LoadDir(cfg.BundleDir)
	if err != nil {
		return nil, err
	}
	snap, rep, err := authz.Compile(b, nil)
	if err != nil {
		if rep == nil || rep.OK() {
			return nil, fmt.Errorf("compile %s: %w", cfg.BundleDir, err)
		}
		return nil, &InvalidError{BundleDir: cfg.BundleDir, Bundle: b, Report: rep}
	}
	p := &Prepared{BundleDir: cfg.BundleDir, Bundle: b, Snapshot: snap, Report: rep}
	if cfg.DataDir != "" {
		p.keys = identity.NewKeyring(cfg.DataDir) // touches nothing until a token is minted
	}
	add := func(pos policy.Pos, err error) {
		for _, line := range strings.Split(err.Error(), "\n") {
			rep.Errors = append(rep.Errors, policy.Diagnostic{File: pos.File, Line: pos.Line, Message: line})
		}
	}
	warn := func(pos policy.Pos, format string, args ...any) {
		rep.Warnings = append(rep.Warnings, policy.Diagnostic{File: pos.File, Line: pos.Line, Message: fmt.Sprintf(format, args...)})
	}

	p.Upstreams = prepareUpstreams(cfg.BundleDir, b, add, warn)

	auth, err := identity.New(b, p.keys, &identity.Options{Logger: o.Logger})
	if err != nil {
		add(policy.Pos{}, fmt.Errorf("identity settings: %w", err))
	} else {
		p.Credentials = identity.NewTable(b, auth)
	}

	connect := !o.CheckOnly || o.Connect
	for _, d := range b.Databases {
		if err := checkDatabase(ctx, cfg.BundleDir, b, d, connect, o.CheckOnly, warn); err != nil {
			add(d.Pos, err)
		}
	}
	if rep.OK() && !o.CheckOnly {
		bt, err := builtins.Open(ctx, b, cfg.BundleDir)
		if err != nil {
			add(policy.Pos{}, fmt.Errorf("built-in tools: %w", err))
		} else {
			p.Builtins = bt
		}
	}
	sortDiagnostics(rep.Errors)
	sortDiagnostics(rep.Warnings)
	if !rep.OK() {
		p.Close()
		return nil, &InvalidError{BundleDir: cfg.BundleDir, Bundle: b, Report: rep}
	}
	return p, nil
}

// prepareUpstreams builds and checks the upstream configurations as the
// upstream manager does at start, and resolves every secret once.
func prepareUpstreams(dir string, b *policy.Bundle, add func(policy.Pos, error), warn func(policy.Pos, string, ...any)) []upstream.Config {
	var out []upstream.Config
	for _, u := range b.Upstreams {
		c := UpstreamConfig(dir, u)
		if err := c.Validate(); err != nil {
			add(u.Pos, err)
			continue
		}
		bad := false
		for _, m := range []struct {
			field string
			vals  map[string]upstream.Secret
		}{{"env", c.Env}, {"headers", c.Headers}} {
			keys := make([]string, 0, len(m.vals))
			for k := range m.vals {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				if _, err := m.vals[k].Resolve(); err != nil {
					add(u.Pos, fmt.Errorf("upstream %q: %s.%s: %w", c.Name, m.field, k, err))
					bad = true
				}
			}
		}
		if bad {
			continue
		}
		if c.Transport == upstream.TransportStdio {
			// Not refused: serve starts without the upstream and retries
			// (it may appear), but it is said.
			if _, err := exec.LookPath(c.Command); err != nil {
				warn(u.Pos, "Upstream %s: command %s: %v; serve starts without it and retries", u.Name, c.Command, err)
			}
			if c.Dir != "" {
				if fi, err := os.Stat(c.Dir); err != nil || !fi.IsDir() {
					warn(u.Pos, "Upstream %s: dir %s is not a folder; serve starts without it and retries", u.Name, c.Dir)
				}
			}
		}
		out = append(out, c)
	}
	return out
}

// checkDatabase checks one Database document as builtins.Open would open
// it, without writing (a missing SQLite file with init_sql: its script is
// checked, and serve creates it) and, without connect, without reaching a
// PostgreSQL server.
func checkDatabase(ctx context.Context, dir string, b *policy.Bundle, d *policy.Database, connect, checkOnly bool, warn func(policy.Pos, string, ...any)) error {
	one := *b
	one.Databases = []*policy.Database{d}
	rc, err := builtins.Config(&one, dir) // resolves the DSN secret
	if err != nil {
		return err
	}
	if len(rc.Databases) != 1 {
		return fmt.Errorf("Database %s: not configured", d.Name)
	}
	c := rc.Databases[0]
	if c.Driver == sqltool.DriverSQLite && d.InitSQL != "" {
		if _, err := os.Stat(c.Path); errors.Is(err, fs.ErrNotExist) {
			script := d.InitSQL
			if !filepath.IsAbs(script) {
				script = filepath.Join(dir, script)
			}
			fi, err := os.Stat(script)
			switch {
			case err != nil:
				return fmt.Errorf("Database %s: init_sql: %w", d.Name, err)
			case !fi.Mode().IsRegular():
				return fmt.Errorf("Database %s: init_sql %s is not a regular file", d.Name, script)
			case fi.Size() > builtins.MaxInitSQLBytes:
				return fmt.Errorf("Database %s: init_sql %s is larger than %d bytes", d.Name, script, builtins.MaxInitSQLBytes)
			}
			if f, err := os.Open(script); err != nil {
				return fmt.Errorf("Database %s: init_sql: %w", d.Name, err)
			} else {
				f.Close()
			}
			if fi, err := os.Stat(filepath.Dir(c.Path)); err != nil || !fi.IsDir() {
				return fmt.Errorf("Database %s: the folder of %s does not exist, so init_sql cannot create it", d.Name, c.Path)
			}
			if checkOnly {
				warn(d.Pos, "Database %s: %s does not exist; serve creates it from init_sql %s", d.Name, c.Path, script)
			}
			return nil
		}
	}
	return sqltool.Check(ctx, c, connect)
}

func sortDiagnostics(ds []policy.Diagnostic) {
	sort.SliceStable(ds, func(i, j int) bool {
		if ds[i].File != ds[j].File {
			return ds[i].File < ds[j].File
		}
		return ds[i].Line < ds[j].Line
	})
}
