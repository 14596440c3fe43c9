// Package postgres is toolgate's shared store for several gateway replicas
// (docs/design.md, "State and scale"): the audit chain and the approvals in PostgreSQL, through
// pgx/v5. Appends to the chain are serialized across processes by a row
// lock on the head row (SELECT … FOR UPDATE), approvals are consumed with a
// single guarded UPDATE … RETURNING, and a decision made on one replica
// wakes waiters on the others through LISTEN/NOTIFY (ListenApprovals).
//
// Everything lives in one schema (default "toolgate"), created with its
// tables on Open if missing, so tests and tenants can be isolated by
// schema name.
package postgres

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/toolgate/toolgate/approval"
	"github.com/toolgate/toolgate/audit"
)

// Options tunes a Store. nil is valid; zero fields take the defaults.
type Options struct {
	// Schema is the PostgreSQL schema holding toolgate's tables: lower-case
	// letters, digits and '_', starting with a letter or '_', at most 48
	// characters. Default "toolgate".
	Schema string
	// MaxConns caps the connection pool (ListenApprovals holds one
	// connection per listener on top of it). Default pgxpool's:
	// max(4, number of CPUs).
	MaxConns int32
}

// Store is an audit.Store, approval.Store and approval.Listener over one
// PostgreSQL schema. It is safe for concurrent use; several Stores, in one
// process or many, may share a schema. Close it when done.
type Store struct {
	pool    *pgxpool.Pool
	schema  string
	channel string // NOTIFY channel for approval changes

	// Qualified table names.
	events, head, approvals string
}

var (
	_ audit.Store       = (*Store)(nil)
	_ approval.Store    = (*Store)(nil)
	_ approval.Listener = (*Store)(nil)
)

var schemaName = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,47}$`)

// Open connects to dsn (a libpq URL or key=value string), creates the
// schema and its tables if missing, and returns the Store. opts may be nil.
// Errors: an invalid schema name, a DSN pgx cannot parse, a server that
// cannot be reached (Open pings it), or a failed migration.
//
// Durability: if the server's synchronous_commit is "off", each connection
// sets it to "on", so that a returned commit is on disk.
func Open(ctx context.Context, dsn string, opts *Options) (*Store, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.Schema == "" {
		o.Schema = "toolgate"
	}
	if !schemaName.MatchString(o.Schema) {
		return nil, fmt.Errorf("postgres: invalid schema name %q (want [a-z_][a-z0-9_]*, at most 48 characters)", o.Schema)
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("postgres: parse DSN: %w", err)
	}
	if o.MaxConns > 0 {
		cfg.MaxConns = o.MaxConns
	}
	cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		var sc string
		if err := c.QueryRow(ctx, "SHOW synchronous_commit").Scan(&sc); err != nil {
			return err
		}
		if sc == "off" {
			_, err := c.Exec(ctx, "SET synchronous_commit = on")
			return err
		}
		return nil
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("postgres: connect: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("postgres: connect to %s:%d: %w", cfg.ConnConfig.Host, cfg.ConnConfig.Port, err)
	}
	q := pgx.Identifier{o.Schema}.Sanitize()
	s := &Store{
		pool:      pool,
		schema:    o.Schema,
		channel:   o.Schema + "_approvals",
		events:    q + ".audit_events",
		head:      q + ".audit_head",
		approvals: q + ".approvals",
	}
	if err := s.migrate(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("postgres: create schema %s: %w", o.Schema, err)
	}
	return s, nil
}

// Schema returns the schema name the store uses.
func (s *Store) Schema() string { return s.schema }

// Close closes the pool, waiting for connections in use to be released.
func (s *Store) Close() error {
	s.pool.Close()
	return nil
}

func (s *Store) migrate(ctx context.Context) error {
	q := pgx.Identifier{s.schema}.Sanitize()
	stmts := []string{
		`CREATE SCHEMA IF NOT EXISTS ` + q,
		`CREATE TABLE IF NOT EXISTS ` + q + `.toolgate_meta (
			key   text PRIMARY KEY,
			value text NOT NULL
		)`,
		// body is the sealed event's canonical JSON (hash included), kept as
		// text so its bytes are exactly what was hashed; the other columns
		// are copies for lookups.
		`CREATE TABLE IF NOT EXISTS ` + s.events + ` (
			seq            bigint      PRIMARY KEY,
			event_id       text        NOT NULL,
			event_type     text        NOT NULL,
			occurred_at    timestamptz NOT NULL,
			correlation_id text        NOT NULL,
			body           text        NOT NULL
		)`,
		`CREATE INDEX IF NOT EXISTS audit_events_correlation ON ` + s.events + ` (correlation_id)`,
		`CREATE TABLE IF NOT EXISTS ` + s.head + ` (
			id   integer PRIMARY KEY CHECK (id = 1),
			seq  bigint  NOT NULL,
			hash text    NOT NULL
		)`,
		`INSERT INTO ` + s.head + ` (id, seq, hash) VALUES (1, 0, '` + audit.GenesisHash + `') ON CONFLICT (id) DO NOTHING`,
		// Append-only: rows are inserted, never changed or removed; the head
		// only moves forward. CREATE OR REPLACE also restores a dropped
		// trigger on the next Open.
		`CREATE OR REPLACE FUNCTION ` + q + `.audit_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			RAISE EXCEPTION 'toolgate: % is append-only: % refused', TG_TABLE_NAME, TG_OP;
		END $$`,
		`CREATE OR REPLACE FUNCTION ` + q + `.audit_head_forward() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF NEW.seq < OLD.seq OR NEW.id <> OLD.id THEN
				RAISE EXCEPTION 'toolgate: audit_head only moves forward';
			END IF;
			RETURN NEW;
		END $$`,
		`CREATE OR REPLACE TRIGGER audit_events_no_change BEFORE UPDATE OR DELETE ON ` + s.events + `
			FOR EACH ROW EXECUTE FUNCTION ` + q + `.audit_refuse()`,
		`CREATE OR REPLACE TRIGGER audit_events_no_truncate BEFORE TRUNCATE ON ` + s.events + `
			FOR EACH STATEMENT EXECUTE FUNCTION ` + q + `.audit_refuse()`,
		`CREATE OR REPLACE TRIGGER audit_head_forward BEFORE UPDATE ON ` + s.head + `
			FOR EACH ROW EXECUTE FUNCTION ` + q + `.audit_head_forward()`,
		`CREATE OR REPLACE TRIGGER audit_head_no_delete BEFORE DELETE ON ` + s.head + `
			FOR EACH ROW EXECUTE FUNCTION ` + q + `.audit_refuse()`,
		`CREATE OR REPLACE TRIGGER audit_head_no_truncate BEFORE TRUNCATE ON ` + s.head + `
			FOR EACH STATEMENT EXECUTE FUNCTION ` + q + `.audit_refuse()`,
		`CREATE TABLE IF NOT EXISTS ` + s.approvals + ` (
			id                  text        PRIMARY KEY,
			binding_digest      text        NOT NULL,
			principal           text        NOT NULL,
			agent_id            text        NOT NULL,
			instance_id         text        NOT NULL,
			environment         text        NOT NULL,
			tool_id             text        NOT NULL,
			args_digest         text        NOT NULL,
			status              text        NOT NULL,
			requested_by        text        NOT NULL,
			created_at          timestamptz NOT NULL,
			expires_at          timestamptz NOT NULL,
			decided_by          text        NOT NULL DEFAULT '',
			decided_at          timestamptz,
			reason              text        NOT NULL DEFAULT '',
			used_at             timestamptz,
			used_correlation_id text        NOT NULL DEFAULT '',
			correlation_id      text        NOT NULL DEFAULT '',
			tool_name           text        NOT NULL DEFAULT '',
			agent_version       text        NOT NULL DEFAULT '',
			args                text
		)`,
		`CREATE INDEX IF NOT EXISTS approvals_binding ON ` + s.approvals + ` (binding_digest, status, expires_at)`,
		`CREATE INDEX IF NOT EXISTS approvals_status ON ` + s.approvals + ` (status, expires_at)`,
		`INSERT INTO ` + q + `.toolgate_meta (key, value) VALUES ('schema_version', '1')
			ON CONFLICT (key) DO UPDATE SET value = excluded.value`,
	}
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		// Serialize concurrent Opens (CREATE … IF NOT EXISTS races otherwise).
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(7235, hashtext($1))`, s.schema); err != nil {
			return err
		}
		if err := s.checkExisting(ctx, tx); err != nil {
			return err
		}
		// One round trip: with no arguments pgx sends the script with the
		// simple protocol, which runs several statements.
		_, err := tx.Exec(ctx, strings.Join(stmts, ";\n"))
		return err
	})
}

// ErrTampered is wrapped by Open when an existing toolgate schema (one with
// a schema_version in toolgate_meta) lacks the audit tables or the head
// row: creating them afresh would start a new, empty chain that verifies,
// hiding that the old one was removed.
var ErrTampered = errors.New("the audit log was removed from an existing toolgate schema")

// checkExisting refuses an existing toolgate schema whose audit tables or
// head row are gone.
func (s *Store) checkExisting(ctx context.Context, tx pgx.Tx) error {
	q := pgx.Identifier{s.schema}.Sanitize()
	var meta, events, head *string
	if err := tx.QueryRow(ctx, `SELECT to_regclass($1)::text, to_regclass($2)::text, to_regclass($3)::text`,
		q+".toolgate_meta", s.events, s.head).Scan(&meta, &events, &head); err != nil {
		return err
	}
	if meta == nil {
		return nil // a new schema
	}
	var n int
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM `+q+`.toolgate_meta WHERE key = 'schema_version'`).Scan(&n); err != nil {
		return err
	}
	if n == 0 {
		return nil
	}
	switch {
	case events == nil:
		return fmt.Errorf("table %s is missing: %w", s.events, ErrTampered)
	case head == nil:
		return fmt.Errorf("table %s is missing: %w", s.head, ErrTampered)
	}
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM `+s.head+` WHERE id = 1`).Scan(&n); err != nil {
		return err
	}
	if n == 0 {
		return fmt.Errorf("the audit head row is missing: %w", ErrTampered)
	}
	return nil
}

// AppendEvents implements audit.Store: one transaction that locks the head
// row (so appenders in every process queue here), seals and inserts evs in
// one statement, moves the head, and commits.
func (s *Store) AppendEvents(ctx context.Context, evs []audit.Event) ([]audit.Event, error) {
	if len(evs) == 0 {
		return nil, nil
	}
	var out []audit.Event
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		out = make([]audit.Event, len(evs))
		var head audit.Head
		if err := tx.QueryRow(ctx, `SELECT seq, hash FROM `+s.head+` WHERE id = 1 FOR UPDATE`).Scan(&head.Seq, &head.Hash); err != nil {
			return fmt.Errorf("lock head: %w", err)
		}
		n := len(evs)
		seqs, ids, types, corrs, bodies := make([]int64, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		times := make([]time.Time, n)
		for i, ev := range evs {
			sealed, body, err := audit.Seal(head, ev)
			if err != nil {
				return err
			}
			out[i] = sealed
			seqs[i], ids[i], types[i], times[i], corrs[i], bodies[i] = sealed.Seq, sealed.EventID, sealed.EventType, sealed.OccurredAt, sealed.CorrelationID, string(body)
			head = audit.Head{Seq: sealed.Seq, Hash: sealed.Hash}
		}
		if _, err := tx.Exec(ctx, `INSERT INTO `+s.events+` (seq, event_id, event_type, occurred_at, correlation_id, body)
			SELECT * FROM unnest($1::bigint[], $2::text[], $3::text[], $4::timestamptz[], $5::text[], $6::text[])`,
			seqs, ids, types, times, corrs, bodies); err != nil {
			return fmt.Errorf("insert: %w", err)
		}
		if _, err := tx.Exec(ctx, `UPDATE `+s.head+` SET seq = $1, hash = $2 WHERE id = 1`, head.Seq, head.Hash); err != nil {
			return fmt.Errorf("move head: %w", err)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("postgres: append: %w", err)
	}
	return out, nil
}

// defaultPage is ReadRecords' page size when limit <= 0.
const defaultPage = 1000

// ReadRecords implements audit.Store.
func (s *Store) ReadRecords(ctx context.Context, from int64, limit int) ([]audit.Record, error) {
	if limit <= 0 {
		limit = defaultPage
	}
	rows, err := s.pool.Query(ctx, `SELECT seq, body FROM `+s.events+` WHERE seq >= $1 ORDER BY seq LIMIT $2`, from, limit)
	if err != nil {
		return nil, fmt.Errorf("postgres: read audit: %w", err)
	}
	recs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (audit.Record, error) {
		var r audit.Record
		var body string
		err := row.Scan(&r.Seq, &body)
		r.Body = []byte(body)
		return r, err
	})
	if err != nil {
		return nil, fmt.Errorf("postgres: read audit: %w", err)
	}
	return recs, nil
}

// AuditHead implements audit.Store.
func (s *Store) AuditHead(ctx context.Context) (audit.Head, error) {
	var h audit.Head
	if err := s.pool.QueryRow(ctx, `SELECT seq, hash FROM `+s.head+` WHERE id = 1`).Scan(&h.Seq, &h.Hash); err != nil {
		return audit.Head{}, fmt.Errorf("postgres: read audit head: %w", err)
	}
	return h, nil
}

// errNoRows reports whether err is pgx's "no rows".
func errNoRows(err error) bool { return errors.Is(err, pgx.ErrNoRows) }
