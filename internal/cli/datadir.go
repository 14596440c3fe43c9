package cli

import (
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/toolgate/toolgate/store/sqlite"
)

// The data folder: where toolgate serve keeps its state, one SQLite file
// (the audit log and the approvals) named dbFile. --data chooses it; its
// default is $TOOLGATE_DATA, or defaultDataDir.
const (
	defaultDataDir = "./toolgate-data"
	dbFile         = "toolgate.db"
)

// dataFlag adds --data DIR.
func dataFlag(fs *flag.FlagSet) *string {
	def := os.Getenv("TOOLGATE_DATA")
	if def == "" {
		def = defaultDataDir
	}
	return fs.String("data", def, "data folder holding "+dbFile+" (the default is $TOOLGATE_DATA when set)")
}

// dbPath returns the database file of data folder dir.
func dbPath(dir string) string { return filepath.Join(dir, dbFile) }

// openStore opens the data folder's SQLite store. With create, a missing
// folder and database are created (serve). Without it, a missing database
// is an error that names the path and says what --data should be: the
// commands that read state (audit, approvals) never create an empty
// database, which would look like an empty but valid log.
func openStore(dir string, create bool) (*sqlite.Store, error) {
	if dir == "" {
		return nil, errors.New("--data DIR is empty; pass the data folder toolgate serve uses")
	}
	path := dbPath(dir)
	if !create {
		fi, err := os.Stat(path)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			return nil, fmt.Errorf("no toolgate database at %s: pass --data with the data folder toolgate serve uses (it holds %s)", path, dbFile)
		case err != nil:
			return nil, fmt.Errorf("data folder %s: %w", dir, err)
		case fi.IsDir():
			return nil, fmt.Errorf("%s is a folder, not a toolgate database", path)
		}
	}
	st, err := sqlite.Open(path, nil)
	if err != nil {
		return nil, err
	}
	return st, nil
}

// parseInterleaved parses flags that may come before, between or after
// positional arguments ("approve ID --as X" and "approve --as X ID"), and
// returns the positional ones. Like parse, it returns an exit code and
// false when the caller should return it.
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, int, bool) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, ExitOK, false
			}
			return nil, ExitUsage, false
		}
		if fs.NArg() == 0 {
			return pos, 0, true
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
}
