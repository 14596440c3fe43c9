// Package builtins builds the gateway's built-in tools (package
// builtin/registry: fs.*, and sql.* over the bundle's Database documents)
// from a policy bundle, so that toolgate serve and toolgate call configure
// them the same way. It is apart from package adapter so that the decision
// facade (package gate) does not link the SQL drivers.
package builtins

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	_ "modernc.org/sqlite" // driver "sqlite", for init_sql

	"github.com/toolgate/toolgate/builtin/registry"
	"github.com/toolgate/toolgate/builtin/sqltool"
	"github.com/toolgate/toolgate/policy"
	"github.com/toolgate/toolgate/upstream"
)

// MaxInitSQLBytes bounds a Database's init_sql script.
const MaxInitSQLBytes = 4 << 20

// Config returns the registry configuration of bundle b, whose folder is
// bundleDir: the result cap from Settings.result_max_kib and one
// sqltool.Config per Database document, with relative paths resolved
// against bundleDir and the DSN secret resolved. Errors name the database.
func Config(b *policy.Bundle, bundleDir string) (registry.Config, error) {
	var cfg registry.Config
	if len(b.Settings) > 0 {
		cfg.ResultMaxKiB = b.Settings[0].ResultMaxKiB
	}
	for _, d := range b.Databases {
		c := sqltool.Config{Name: d.Name, Driver: d.Driver, StatementTimeout: d.StatementTimeout.D(),
			MaxRows: d.MaxRows, AllowedFunctions: d.AllowedFunctions}
		if d.Path != "" {
			c.Path = resolve(bundleDir, d.Path)
		}
		if d.DSN != (policy.Secret{}) {
			dsn, err := upstream.Secret{Value: d.DSN.Value, FromEnv: d.DSN.FromEnv, FromFile: d.DSN.FromFile}.Resolve()
			if err != nil {
				return registry.Config{}, fmt.Errorf("Database %s: dsn: %w", d.Name, err)
			}
			c.DSN = dsn
		}
		cfg.Databases = append(cfg.Databases, c)
	}
	return cfg, nil
}

func resolve(dir, p string) string {
	if filepath.IsAbs(p) {
		return p
	}
	return filepath.Join(dir, p)
}

// Open creates every missing SQLite file that has an init_sql script (see
// InitSQLite), then opens the built-in tools of bundle b (see Config). The
// caller closes the registry. A database that cannot be opened is an
// error: the gateway does not start with a tool it cannot run.
func Open(ctx context.Context, b *policy.Bundle, bundleDir string) (*registry.Registry, error) {
	for _, d := range b.Databases {
		if d.Driver == sqltool.DriverSQLite && d.InitSQL != "" {
			if _, err := InitSQLite(ctx, resolve(bundleDir, d.Path), resolve(bundleDir, d.InitSQL)); err != nil {
				return nil, fmt.Errorf("Database %s: %w", d.Name, err)
			}
		}
	}
	cfg, err := Config(b, bundleDir)
	if err != nil {
		return nil, err
	}
	return registry.New(ctx, cfg)
}

// InitSQLite creates the SQLite database path by running the SQL script
// scriptPath, when path does not exist; it reports whether it created it.
// An existing file is never touched. The database is built under a
// temporary name in the same folder and linked into place, so a concurrent
// reader never sees a half-built file and two processes racing to create
// it both end with the same complete file.
func InitSQLite(ctx context.Context, path, scriptPath string) (bool, error) {
	if _, err := os.Stat(path); err == nil {
		return false, nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return false, fmt.Errorf("database file %s: %w", path, err)
	}
	fi, err := os.Stat(scriptPath)
	if err != nil {
		return false, fmt.Errorf("init_sql: %w", err)
	}
	if fi.Size() > MaxInitSQLBytes {
		return false, fmt.Errorf("init_sql %s is larger than %d bytes", scriptPath, MaxInitSQLBytes)
	}
	script, err := os.ReadFile(scriptPath)
	if err != nil {
		return false, fmt.Errorf("init_sql: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".init-*")
	if err != nil {
		return false, fmt.Errorf("init_sql: %w", err)
	}
	tmpName := tmp.Name()
	tmp.Close()
	defer os.Remove(tmpName)
	db, err := sql.Open("sqlite", tmpName)
	if err != nil {
		return false, fmt.Errorf("init_sql: %w", err)
	}
	_, err = db.ExecContext(ctx, string(script))
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return false, fmt.Errorf("init_sql %s: %w", scriptPath, err)
	}
	if err := os.Link(tmpName, path); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return false, nil // another process created it first
		}
		return false, fmt.Errorf("init_sql: %w", err)
	}
	return true, nil
}
