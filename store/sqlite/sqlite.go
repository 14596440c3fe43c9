// Package sqlite is toolgate's embedded store: the audit chain and the
// approvals in one SQLite file under the data folder, with no server to run
// (docs/design.md, "State and scale"). It uses modernc.org/sqlite (pure Go, driver "sqlite").
//
// The file is opened in WAL mode with synchronous=FULL: in WAL mode,
// NORMAL skips the fsync at commit (it syncs only at checkpoints), so a
// committed transaction can be lost on power failure. docs/design.md, "What the audit log promises" requires
// the allow record to be durable before the tool runs, so every commit
// fsyncs the WAL; audit.Recorder's group commit is what keeps that cheap.
//
// Write transactions start with BEGIN IMMEDIATE (they take the write lock
// first and wait up to the busy timeout for it), so several Stores on one
// file, in one process or several, serialize their appends and never fork
// the chain.
package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	sqlite "modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/toolgate/toolgate/approval"
	"github.com/toolgate/toolgate/audit"
)

// Options tunes a Store. nil is valid; zero fields take the defaults.
type Options struct {
	// BusyTimeout is how long a statement waits for another connection's
	// lock before failing. Default 5 s.
	BusyTimeout time.Duration
	// MaxOpenConns caps the connection pool. Default 4 (WAL readers run in
	// parallel; writers queue on the file lock).
	MaxOpenConns int
	// Synchronous is "full" (default: every commit is fsynced, so a
	// committed audit record survives power loss) or "normal" (commits
	// reach the OS, so they survive a crash of the gateway process but not
	// of the machine; WAL is fsynced at checkpoints). "normal" saves about
	// one fsync per committed batch.
	Synchronous string
	// ReadOnly opens an existing database for reading only (audit verify,
	// audit tail): nothing is created or written, and a file that is not a
	// toolgate database, or one whose audit tables are missing, is an
	// error rather than a new, empty log.
	ReadOnly bool
}

// Store is an audit.Store and an approval.Store over one SQLite file. It is
// safe for concurrent use. Close it when done.
type Store struct {
	db   *sql.DB
	path string
	hub  hub

	// Statements of the append hot path, prepared once (each pooled
	// connection prepares them once too); nil when preparing failed, and
	// then the plain queries are used.
	selHead, updHead, insOne *sql.Stmt
}

var (
	_ audit.Store       = (*Store)(nil)
	_ approval.Store    = (*Store)(nil)
	_ approval.Listener = (*Store)(nil)
)

// schemaVersion is written to toolgate_meta on every Open.
const schemaVersion = "1"

var schema = []string{
	`CREATE TABLE IF NOT EXISTS toolgate_meta (
		key   TEXT PRIMARY KEY,
		value TEXT NOT NULL
	)`,
	// audit_events: body is the sealed event's canonical JSON (hash
	// included), the only source Verify trusts; the other columns are copies
	// for lookups.
	`CREATE TABLE IF NOT EXISTS audit_events (
		seq            INTEGER PRIMARY KEY,
		event_id       TEXT    NOT NULL,
		event_type     TEXT    NOT NULL,
		occurred_at    INTEGER NOT NULL, -- unix nanoseconds, UTC
		correlation_id TEXT    NOT NULL,
		body           TEXT    NOT NULL
	)`,
	`CREATE INDEX IF NOT EXISTS audit_events_correlation ON audit_events (correlation_id)`,
	`CREATE TABLE IF NOT EXISTS audit_head (
		id   INTEGER PRIMARY KEY CHECK (id = 1),
		seq  INTEGER NOT NULL,
		hash TEXT    NOT NULL
	)`,
	`INSERT INTO audit_head (id, seq, hash) VALUES (1, 0, '` + audit.GenesisHash + `') ON CONFLICT (id) DO NOTHING`,
	// Append-only: rows can be inserted, never changed or removed, and the
	// head only moves forward. IF NOT EXISTS also restores a dropped trigger
	// on the next Open.
	`CREATE TRIGGER IF NOT EXISTS audit_events_no_update BEFORE UPDATE ON audit_events
	BEGIN SELECT RAISE(ABORT, 'audit_events is append-only: UPDATE refused'); END`,
	`CREATE TRIGGER IF NOT EXISTS audit_events_no_delete BEFORE DELETE ON audit_events
	BEGIN SELECT RAISE(ABORT, 'audit_events is append-only: DELETE refused'); END`,
	`CREATE TRIGGER IF NOT EXISTS audit_head_forward BEFORE UPDATE ON audit_head
	WHEN NEW.seq < OLD.seq OR NEW.id <> OLD.id
	BEGIN SELECT RAISE(ABORT, 'audit_head only moves forward'); END`,
	`CREATE TRIGGER IF NOT EXISTS audit_head_no_delete BEFORE DELETE ON audit_head
	BEGIN SELECT RAISE(ABORT, 'audit_head cannot be deleted'); END`,
	`CREATE TABLE IF NOT EXISTS approvals (
		id                  TEXT PRIMARY KEY,
		binding_digest      TEXT    NOT NULL,
		principal           TEXT    NOT NULL,
		agent_id            TEXT    NOT NULL,
		instance_id         TEXT    NOT NULL,
		environment         TEXT    NOT NULL,
		tool_id             TEXT    NOT NULL,
		args_digest         TEXT    NOT NULL,
		status              TEXT    NOT NULL,
		requested_by        TEXT    NOT NULL,
		created_at          INTEGER NOT NULL, -- unix nanoseconds, UTC
		expires_at          INTEGER NOT NULL,
		decided_by          TEXT    NOT NULL DEFAULT '',
		decided_at          INTEGER,
		reason              TEXT    NOT NULL DEFAULT '',
		used_at             INTEGER,
		used_correlation_id TEXT    NOT NULL DEFAULT '',
		correlation_id      TEXT    NOT NULL DEFAULT '',
		tool_name           TEXT    NOT NULL DEFAULT '',
		agent_version       TEXT    NOT NULL DEFAULT '',
		args                TEXT
	)`,
	`CREATE INDEX IF NOT EXISTS approvals_binding ON approvals (binding_digest, status, expires_at)`,
	`CREATE INDEX IF NOT EXISTS approvals_status ON approvals (status, expires_at)`,
	// A real write on every Open: it fails at once when the file is not
	// writable, even when the schema already exists.
	`INSERT INTO toolgate_meta (key, value) VALUES ('schema_version', '` + schemaVersion + `')
	ON CONFLICT (key) DO UPDATE SET value = excluded.value`,
}

// Open opens (creating it, and its folder with mode 0700, if missing) the
// SQLite database at path, creates the schema if missing, and checks that
// the file is writable. opts may be nil. Errors: a path containing '?', a
// folder that cannot be created, a path that cannot be opened ("… cannot be
// opened …"), a file that is not a SQLite database, or one that is not
// writable ("… is not writable: …").
func Open(path string, opts *Options) (*Store, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.BusyTimeout <= 0 {
		o.BusyTimeout = 5 * time.Second
	}
	if o.MaxOpenConns <= 0 {
		o.MaxOpenConns = 4
	}
	sync := "FULL"
	switch strings.ToLower(o.Synchronous) {
	case "", "full":
	case "normal":
		sync = "NORMAL"
	default:
		return nil, fmt.Errorf("sqlite: synchronous %q: want full or normal", o.Synchronous)
	}
	if path == "" || strings.ContainsRune(path, '?') {
		return nil, fmt.Errorf("sqlite: invalid database path %q (empty, or contains '?')", path)
	}
	if dir := filepath.Dir(path); dir != "" {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("sqlite: create folder for %s: %w", path, err)
		}
	}
	if o.ReadOnly {
		return openReadOnly(path, o)
	}
	dsn := fmt.Sprintf("%s?_busy_timeout=%d&_journal_mode=WAL&_synchronous=%s&_foreign_keys=1&_txlock=immediate",
		path, o.BusyTimeout.Milliseconds(), sync)
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("sqlite: open %s: %w", path, err)
	}
	db.SetMaxOpenConns(o.MaxOpenConns)
	db.SetMaxIdleConns(o.MaxOpenConns)
	s := &Store{db: db, path: path}
	if err := s.migrate(context.Background()); err != nil {
		db.Close()
		return nil, s.openError(err)
	}
	s.selHead, _ = db.Prepare(selectHead)
	s.updHead, _ = db.Prepare(updateHead)
	s.insOne, _ = db.Prepare(insertPrefix + "(?, ?, ?, ?, ?, ?)")
	return s, nil
}

const (
	selectHead = `SELECT seq, hash FROM audit_head WHERE id = 1`
	updateHead = `UPDATE audit_head SET seq = ?, hash = ? WHERE id = 1`
)

// stmt returns the prepared statement bound to tx, or nil.
func stmt(ctx context.Context, tx *sql.Tx, st *sql.Stmt) *sql.Stmt {
	if st == nil {
		return nil
	}
	return tx.StmtContext(ctx, st)
}

// querier is what checkExisting needs of a *sql.DB or *sql.Tx.
type querier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// checkExisting refuses a toolgate database (one with a schema_version in
// toolgate_meta) whose audit tables or head row are gone. With mustExist, a
// database that is not a toolgate database at all is refused too.
func checkExisting(ctx context.Context, q querier, path string, mustExist bool) error {
	has := func(table string) (bool, error) {
		var n int
		err := q.QueryRowContext(ctx, `SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?`, table).Scan(&n)
		return n > 0, err
	}
	meta, err := has("toolgate_meta")
	if err != nil {
		return err
	}
	if meta {
		var v string
		switch err := q.QueryRowContext(ctx, `SELECT value FROM toolgate_meta WHERE key = 'schema_version'`).Scan(&v); {
		case errors.Is(err, sql.ErrNoRows):
			meta = false
		case err != nil:
			return err
		}
	}
	if !meta {
		if mustExist {
			return fmt.Errorf("%s is not a toolgate database (no schema_version in toolgate_meta)", path)
		}
		return nil
	}
	for _, table := range []string{"audit_events", "audit_head"} {
		ok, err := has(table)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("sqlite: %s: table %s is missing: %w; keep the file for investigation and run toolgate audit verify on a backup", path, table, ErrTampered)
		}
	}
	var n int
	if err := q.QueryRowContext(ctx, `SELECT count(*) FROM audit_head WHERE id = 1`).Scan(&n); err != nil {
		return err
	}
	if n == 0 {
		return fmt.Errorf("sqlite: %s: the audit head row is missing: %w; keep the file for investigation", path, ErrTampered)
	}
	return nil
}

// openReadOnly opens path with mode=ro: no schema is created, no pragma
// that writes is set, and the audit tables must be there.
func openReadOnly(path string, o Options) (*Store, error) {
	if _, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("sqlite: open %s: %w", path, err)
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("sqlite: open %s: %w", path, err)
	}
	// A URI filename (mode=ro needs one), its path percent-escaped so that
	// '#', '%' and '&' in folder names name the file they say.
	uri := (&url.URL{Scheme: "file", Path: abs}).String()
	db, err := sql.Open("sqlite", fmt.Sprintf("%s?mode=ro&_busy_timeout=%d", uri, o.BusyTimeout.Milliseconds()))
	if err != nil {
		return nil, fmt.Errorf("sqlite: open %s: %w", path, err)
	}
	db.SetMaxOpenConns(o.MaxOpenConns)
	s := &Store{db: db, path: path}
	if err := checkExisting(context.Background(), db, path, true); err != nil {
		db.Close()
		if errors.Is(err, ErrTampered) {
			return nil, err
		}
		return nil, s.openError(err)
	}
	return s, nil
}

func (s *Store) openError(err error) error {
	if errors.Is(err, ErrTampered) {
		return err
	}
	if code, ok := sqliteCode(err); ok {
		switch code & 0xff {
		case sqlite3.SQLITE_READONLY, sqlite3.SQLITE_PERM, sqlite3.SQLITE_AUTH:
			return fmt.Errorf("sqlite: %s is not writable: %w", s.path, err)
		case sqlite3.SQLITE_CANTOPEN:
			return fmt.Errorf("sqlite: %s cannot be opened (a folder, or no permission?): %w", s.path, err)
		}
	}
	return fmt.Errorf("sqlite: open %s: %w", s.path, err)
}

func sqliteCode(err error) (int, bool) {
	var se *sqlite.Error
	if errors.As(err, &se) {
		return se.Code(), true
	}
	return 0, false
}

// ErrTampered is wrapped by Open when an existing toolgate database lacks
// the audit tables or the head row: creating them afresh would start a new,
// empty chain that verifies, hiding that the old one was removed.
var ErrTampered = errors.New("the audit log was removed from an existing toolgate database")

func (s *Store) migrate(ctx context.Context) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if err := checkExisting(ctx, tx, s.path, false); err != nil {
		return err
	}
	for _, q := range schema {
		if _, err := tx.ExecContext(ctx, q); err != nil {
			return err
		}
	}
	return tx.Commit()
}

// Close closes the database. Listeners return once their ctx ends.
func (s *Store) Close() error {
	for _, st := range []*sql.Stmt{s.selHead, s.updHead, s.insOne} {
		if st != nil {
			st.Close()
		}
	}
	return s.db.Close()
}

// Path returns the database file's path.
func (s *Store) Path() string { return s.path }

// AppendEvents implements audit.Store: one BEGIN IMMEDIATE transaction that
// reads the head, seals and inserts evs, and moves the head.
func (s *Store) AppendEvents(ctx context.Context, evs []audit.Event) ([]audit.Event, error) {
	if len(evs) == 0 {
		return nil, nil
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("sqlite: append: begin: %w", err)
	}
	defer tx.Rollback()
	var head audit.Head
	var row *sql.Row
	if st := stmt(ctx, tx, s.selHead); st != nil {
		row = st.QueryRowContext(ctx)
	} else {
		row = tx.QueryRowContext(ctx, selectHead)
	}
	if err := row.Scan(&head.Seq, &head.Hash); err != nil {
		return nil, fmt.Errorf("sqlite: append: read head: %w", err)
	}
	out := make([]audit.Event, len(evs))
	args := make([]any, 0, 6*min(len(evs), insertChunk))
	for i, ev := range evs {
		sealed, body, err := audit.Seal(head, ev)
		if err != nil {
			return nil, fmt.Errorf("sqlite: append: %w", err)
		}
		args = append(args, sealed.Seq, sealed.EventID, sealed.EventType, sealed.OccurredAt.UnixNano(), sealed.CorrelationID, string(body))
		head = audit.Head{Seq: sealed.Seq, Hash: sealed.Hash}
		out[i] = sealed
		// A small batch (the usual group commit: an allow and the previous
		// call's completion) runs the prepared one-row INSERT per event; a
		// large one a multi-row INSERT per chunk, far cheaper than a
		// statement per row once parsing is amortised.
		if st := stmt(ctx, tx, s.insOne); st != nil && len(evs) <= smallBatch {
			if _, err := st.ExecContext(ctx, args...); err != nil {
				return nil, fmt.Errorf("sqlite: append seq %d: %w", sealed.Seq, err)
			}
			args = args[:0]
			continue
		}
		if len(args) == 6*insertChunk || i == len(evs)-1 {
			var err error
			if st := stmt(ctx, tx, s.insOne); st != nil && len(args) == 6 {
				_, err = st.ExecContext(ctx, args...)
			} else {
				q := insertPrefix + strings.Repeat("(?, ?, ?, ?, ?, ?), ", len(args)/6-1) + "(?, ?, ?, ?, ?, ?)"
				_, err = tx.ExecContext(ctx, q, args...)
			}
			if err != nil {
				return nil, fmt.Errorf("sqlite: append up to seq %d: %w", sealed.Seq, err)
			}
			args = args[:0]
		}
	}
	var uerr error
	if st := stmt(ctx, tx, s.updHead); st != nil {
		_, uerr = st.ExecContext(ctx, head.Seq, head.Hash)
	} else {
		_, uerr = tx.ExecContext(ctx, updateHead, head.Seq, head.Hash)
	}
	if err := uerr; err != nil {
		return nil, fmt.Errorf("sqlite: append: move head: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("sqlite: append: commit: %w", err)
	}
	return out, nil
}

// insertChunk is how many rows one INSERT statement of AppendEvents writes.
const insertChunk = 128

// smallBatch is the largest batch AppendEvents inserts row by row with the
// prepared statement.
const smallBatch = 8

const insertPrefix = `INSERT INTO audit_events (seq, event_id, event_type, occurred_at, correlation_id, body) VALUES `

// defaultPage is ReadRecords' page size when limit <= 0.
const defaultPage = 1000

// ReadRecords implements audit.Store.
func (s *Store) ReadRecords(ctx context.Context, from int64, limit int) ([]audit.Record, error) {
	if limit <= 0 {
		limit = defaultPage
	}
	rows, err := s.db.QueryContext(ctx, `SELECT seq, body FROM audit_events WHERE seq >= ? ORDER BY seq LIMIT ?`, from, limit)
	if err != nil {
		return nil, fmt.Errorf("sqlite: read audit: %w", err)
	}
	defer rows.Close()
	var out []audit.Record
	for rows.Next() {
		var r audit.Record
		var body string
		if err := rows.Scan(&r.Seq, &body); err != nil {
			return nil, fmt.Errorf("sqlite: read audit: %w", err)
		}
		r.Body = []byte(body)
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("sqlite: read audit: %w", err)
	}
	return out, nil
}

// AuditHead implements audit.Store.
func (s *Store) AuditHead(ctx context.Context) (audit.Head, error) {
	var h audit.Head
	if err := s.db.QueryRowContext(ctx, `SELECT seq, hash FROM audit_head WHERE id = 1`).Scan(&h.Seq, &h.Hash); err != nil {
		return audit.Head{}, fmt.Errorf("sqlite: read audit head: %w", err)
	}
	return h, nil
}

// hub delivers approval changes to the in-process listeners.
type hub struct {
	mu   sync.Mutex
	next int
	subs map[int]*subscriber
}

type subscriber struct {
	mu     sync.Mutex
	queue  []approval.Approval
	signal chan struct{}
}

func (h *hub) publish(as ...approval.Approval) {
	if len(as) == 0 {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, sub := range h.subs {
		sub.mu.Lock()
		sub.queue = append(sub.queue, as...)
		sub.mu.Unlock()
		select {
		case sub.signal <- struct{}{}:
		default:
		}
	}
}

// ListenApprovals implements approval.Listener for changes made through
// this Store (one SQLite file is one process's store; other processes'
// changes are not seen). The queue to each listener is unbounded.
func (s *Store) ListenApprovals(ctx context.Context, ready func(), fn func(approval.Approval)) error {
	sub := &subscriber{signal: make(chan struct{}, 1)}
	s.hub.mu.Lock()
	if s.hub.subs == nil {
		s.hub.subs = map[int]*subscriber{}
	}
	id := s.hub.next
	s.hub.next++
	s.hub.subs[id] = sub
	s.hub.mu.Unlock()
	defer func() {
		s.hub.mu.Lock()
		delete(s.hub.subs, id)
		s.hub.mu.Unlock()
	}()
	if ready != nil {
		ready()
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-sub.signal:
		}
		sub.mu.Lock()
		q := sub.queue
		sub.queue = nil
		sub.mu.Unlock()
		for _, a := range q {
			fn(a)
		}
	}
}
