package audit

import (
	"context"
	"errors"
	"fmt"
)

// Store keeps the chain. It is implemented by store/sqlite and
// store/postgres; the contract every implementation meets is the suite in
// package storetest.
type Store interface {
	// AppendEvents seals evs onto the end of the chain, in order, and writes
	// them in one transaction: either all are durable (the commit returned
	// after the database synced it) or none is written and the error says
	// why. The store reads its head, calls [Seal] for each event and moves the
	// head, all under a lock that serializes every appender (goroutines of
	// one process and, for a shared database, other processes), so the chain
	// never forks. It returns the sealed events (Seq, PrevHash, Hash set).
	// An empty evs is a no-op.
	AppendEvents(ctx context.Context, evs []Event) ([]Event, error)

	// ReadRecords returns up to limit stored records whose seq is >= from,
	// ordered by seq, exactly as stored (no checking). limit <= 0 means a
	// store-chosen page size (at least 1).
	ReadRecords(ctx context.Context, from int64, limit int) ([]Record, error)

	// AuditHead returns the head the store recorded with its last append
	// ({0, GenesisHash} for an empty log). It is kept apart from the records
	// so that removing the newest records is detected too.
	AuditHead(ctx context.Context) (Head, error)
}

// Record is one row as a store holds it.
type Record struct {
	// Seq is the store's position column: the place the record sits in the log.
	Seq int64
	// Body is the event's canonical JSON with its hash, as returned by Seal.
	Body []byte
}

// Event decodes the record's body (see [DecodeEvent]).
func (r Record) Event() (Event, error) {
	ev, err := DecodeEvent(r.Body)
	if err != nil {
		return Event{}, fmt.Errorf("record at seq %d: %w", r.Seq, err)
	}
	return ev, nil
}

// ReadEvents reads up to limit events with seq >= from and decodes them. It
// does not verify the chain; use [Verify] for that.
func ReadEvents(ctx context.Context, s Store, from int64, limit int) ([]Event, error) {
	recs, err := s.ReadRecords(ctx, from, limit)
	if err != nil {
		return nil, err
	}
	out := make([]Event, 0, len(recs))
	for _, r := range recs {
		ev, err := r.Event()
		if err != nil {
			return nil, err
		}
		out = append(out, ev)
	}
	return out, nil
}

// ErrClosed is returned by a Recorder (and may be returned by a store) after
// Close.
var ErrClosed = errors.New("audit: closed")
