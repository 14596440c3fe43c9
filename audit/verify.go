package audit

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// ProblemKind says how a record is bad.
type ProblemKind string

// Problem kinds.
const (
	// Edited: the record's content does not match its hash, its body is not
	// a valid event, or the head row does not match the last record.
	Edited ProblemKind = "edited"
	// Removed: records are missing, either as a gap in seq, as a prev_hash
	// that does not match the hash of the record before (something before it
	// was removed or replaced), or as a log that ends before its head.
	Removed ProblemKind = "removed"
	// Reordered: the record sits at a seq other than the one it was sealed
	// with.
	Reordered ProblemKind = "reordered"
)

// Problem is the first bad record Verify found.
type Problem struct {
	// Seq is the stored position of the first bad record (for records
	// removed from the end, the first missing seq).
	Seq int64 `json:"seq"`
	// Kind is how it is bad.
	Kind ProblemKind `json:"kind"`
	// Detail is one sentence saying what was found.
	Detail string `json:"detail"`
}

// Report is the result of Verify.
type Report struct {
	// OK is true when every record up to the head checked out.
	OK bool `json:"ok"`
	// Checked is how many records were checked.
	Checked int64 `json:"checked"`
	// Head is the head the store reported after the walk (when the walk
	// stopped at a bad record: the head read when Verify started). When OK,
	// Checked == Head.Seq and Head is the last record checked; records
	// appended after it are not checked. Keep it outside the data folder
	// (print it, sign it) and pass it to a later run ([CheckAnchor], audit
	// verify --expect): a chain cut back or re-sealed with the store's own
	// code passes every check above, but not that one.
	Head Head `json:"head"`
	// LastGood is the last record that checked out ({0, GenesisHash} if none).
	LastGood Head `json:"last_good"`
	// Problem is the first bad record; nil when OK.
	Problem *Problem `json:"problem,omitempty"`
}

// findSealed reports whether a record stored at seq >= from was sealed as
// seq want (its body says so).
func findSealed(ctx context.Context, s Store, from, want int64) (bool, error) {
	for {
		recs, err := s.ReadRecords(ctx, from, verifyPage)
		if err != nil {
			return false, fmt.Errorf("audit: verify: read from seq %d: %w", from, err)
		}
		if len(recs) == 0 {
			return false, nil
		}
		for _, r := range recs {
			if ev, err := r.Event(); err == nil && ev.Seq == want {
				return true, nil
			}
		}
		from = recs[len(recs)-1].Seq + 1
	}
}

// verifyPage is how many records Verify reads at a time.
const verifyPage = 1000

// Verify walks every stored record from seq 1 to the last, then reads the
// head the store recorded with its last append, and returns a Report naming
// the first bad record and how it is bad. It returns an error only when the
// store cannot be read (or ctx ends); a tampered log is a Report with OK
// false, not an error.
//
// Each record is checked in this order: its seq follows the previous one
// (else Removed), its body decodes (else Edited), the seq inside the body is
// the seq it is stored at (else Reordered when the record sealed for this
// seq is stored elsewhere, Removed when it is nowhere: records were removed
// and the rest renumbered), its hash matches its content (else Edited), its
// body is byte for byte the canonical encoding of that content (else
// Edited: a duplicated key, a key in other case, other escapes or spacing
// would put bytes in the record that the hash does not cover), and its
// prev_hash is the previous record's hash (else Removed).
//
// Finally the head must be the last record: a head behind the last record
// (moved back, so that the records after it would go unchecked) or with
// another hash is Edited; a head past the last record is Removed (the
// newest records were removed). Records appended while Verify runs are
// checked up to the head it reads at the end; Report.Head is that head.
//
// What Verify cannot see: a chain cut back and re-sealed, or rewritten
// whole, with a matching head, by someone who can write the database and
// run this code. Compare Report.Head (or a record's hash) with a copy kept
// outside the data folder to detect that ([CheckAnchor]).
func Verify(ctx context.Context, s Store) (Report, error) {
	first, err := s.AuditHead(ctx)
	if err != nil {
		return Report{}, fmt.Errorf("audit: verify: read head: %w", err)
	}
	genesis := Head{Seq: 0, Hash: GenesisHash}
	rep := Report{Head: first, LastGood: genesis}
	fail := func(seq int64, kind ProblemKind, format string, args ...any) (Report, error) {
		rep.Problem = &Problem{Seq: seq, Kind: kind, Detail: fmt.Sprintf(format, args...)}
		return rep, nil
	}
	prev := genesis
	next := int64(1)
	// walk checks the records from next on, up to upTo (-1: to the last
	// stored record). It returns a non-nil Report when it found a problem.
	walk := func(upTo int64) (*Report, error) {
		for upTo < 0 || next <= upTo {
			recs, err := s.ReadRecords(ctx, next, verifyPage)
			if err != nil {
				return nil, fmt.Errorf("audit: verify: read from seq %d: %w", next, err)
			}
			if len(recs) == 0 {
				return nil, nil
			}
			for _, r := range recs {
				if upTo >= 0 && r.Seq > upTo {
					return nil, nil
				}
				if r.Seq != next {
					rp, _ := fail(next, Removed, "record seq %d is missing: the next stored record is seq %d", next, r.Seq)
					return &rp, nil
				}
				ev, err := r.Event()
				if err != nil {
					rp, _ := fail(r.Seq, Edited, "stored body is not a valid event: %v", err)
					return &rp, nil
				}
				if ev.Seq != r.Seq {
					if ev.Seq > r.Seq {
						found, err := findSealed(ctx, s, r.Seq+1, r.Seq)
						if err != nil {
							return nil, err
						}
						if !found {
							rp, _ := fail(r.Seq, Removed, "record seq %d is missing and the records after it were renumbered (the record stored at seq %d was sealed as seq %d)", r.Seq, r.Seq, ev.Seq)
							return &rp, nil
						}
					}
					rp, _ := fail(r.Seq, Reordered, "the record stored at seq %d was sealed as seq %d", r.Seq, ev.Seq)
					return &rp, nil
				}
				h, err := ComputeHash(ev)
				if err != nil {
					rp, _ := fail(r.Seq, Edited, "content cannot be hashed: %v", err)
					return &rp, nil
				}
				if h != ev.Hash {
					rp, _ := fail(r.Seq, Edited, "content does not match its hash (stored %.12s…, computed %.12s…)", ev.Hash, h)
					return &rp, nil
				}
				if canon, err := canonical(ev); err != nil || !bytes.Equal(canon, r.Body) {
					rp, _ := fail(r.Seq, Edited, "the stored body is not the canonical encoding of its content (a duplicated key, a key in other case, other escapes or spacing): it holds bytes the hash does not cover")
					return &rp, nil
				}
				if ev.PrevHash != prev.Hash {
					rp, _ := fail(r.Seq, Removed, "prev_hash %.12s… is not the hash of seq %d (%.12s…): a record before it was removed or replaced", ev.PrevHash, prev.Seq, prev.Hash)
					return &rp, nil
				}
				prev = Head{Seq: ev.Seq, Hash: ev.Hash}
				rep.LastGood = prev
				rep.Checked++
				next++
				if err := ctx.Err(); err != nil {
					return nil, fmt.Errorf("audit: verify: %w", err)
				}
			}
		}
		return nil, nil
	}
	if bad, err := walk(-1); err != nil || bad != nil {
		if err != nil {
			return Report{}, err
		}
		return *bad, nil
	}
	// Every append writes its records and moves the head in one
	// transaction, and the head is read after the records: a head behind
	// the last record read cannot come from an append.
	head, err := s.AuditHead(ctx)
	if err != nil {
		return Report{}, fmt.Errorf("audit: verify: read head: %w", err)
	}
	rep.Head = head
	if head.Seq > prev.Seq {
		// Appended while we walked: check up to the head.
		if bad, err := walk(head.Seq); err != nil || bad != nil {
			if err != nil {
				return Report{}, err
			}
			return *bad, nil
		}
	}
	switch {
	case head.Seq < prev.Seq:
		return fail(head.Seq+1, Edited, "the head row says the log ends at seq %d, but records go on to seq %d: the head was moved back (the records after it would go unchecked)", head.Seq, prev.Seq)
	case prev.Seq < head.Seq:
		return fail(prev.Seq+1, Removed, "the log ends at seq %d but its head says seq %d: the newest records were removed", prev.Seq, head.Seq)
	case prev.Hash != head.Hash:
		return fail(head.Seq, Edited, "the head row's hash %.12s… is not the hash of seq %d (%.12s…)", head.Hash, prev.Seq, prev.Hash)
	}
	rep.OK = true
	return rep, nil
}

// ParseHead parses a head as audit verify prints it for --expect:
// "SEQ:HASH", a seq of 1 or more and 64 lower-case hex digits.
func ParseHead(s string) (Head, error) {
	seqText, hash, ok := strings.Cut(strings.TrimSpace(s), ":")
	if !ok {
		return Head{}, fmt.Errorf("audit: head %q: want SEQ:HASH (as audit verify prints it)", s)
	}
	seq, err := strconv.ParseInt(seqText, 10, 64)
	if err != nil || seq < 1 {
		return Head{}, fmt.Errorf("audit: head %q: the seq must be a whole number of 1 or more", s)
	}
	if !hexHash.MatchString(hash) {
		return Head{}, fmt.Errorf("audit: head %q: the hash must be 64 lower-case hex digits", s)
	}
	return Head{Seq: seq, Hash: hash}, nil
}

var hexHash = regexp.MustCompile(`^[0-9a-f]{64}$`)

// String returns "SEQ:HASH", the form ParseHead reads.
func (h Head) String() string { return strconv.FormatInt(h.Seq, 10) + ":" + h.Hash }

// ErrAnchorMismatch is wrapped by CheckAnchor when the log does not hold the
// anchored record.
var ErrAnchorMismatch = errors.New("audit: the log does not match the head kept outside it")

// CheckAnchor checks a log that Verify passed (rep.OK) against a head kept
// outside the data folder from an earlier run (anchor): the log only grows,
// so the record at anchor.Seq must still be there with anchor.Hash. Because
// each hash covers the one before, that proves every record up to
// anchor.Seq is the one that was anchored. It returns an error wrapping
// ErrAnchorMismatch naming what differs: a log now shorter than the anchor
// (cut back), or another record at that seq (rewritten or re-sealed).
func CheckAnchor(ctx context.Context, s Store, rep Report, anchor Head) error {
	if !rep.OK {
		return fmt.Errorf("%w: the log fails verification, so it is not checked against the anchor", ErrAnchorMismatch)
	}
	if anchor.Seq > rep.Head.Seq {
		return fmt.Errorf("%w: the anchor is seq %d but the log now ends at seq %d: records were removed from the end", ErrAnchorMismatch, anchor.Seq, rep.Head.Seq)
	}
	recs, err := s.ReadRecords(ctx, anchor.Seq, 1)
	if err != nil {
		return fmt.Errorf("audit: check anchor: read seq %d: %w", anchor.Seq, err)
	}
	if len(recs) == 0 || recs[0].Seq != anchor.Seq {
		return fmt.Errorf("%w: record seq %d is missing", ErrAnchorMismatch, anchor.Seq)
	}
	ev, err := recs[0].Event()
	if err != nil {
		return fmt.Errorf("%w: %v", ErrAnchorMismatch, err)
	}
	if ev.Hash != anchor.Hash {
		return fmt.Errorf("%w: record seq %d has hash %s, the anchor says %s: the log was rewritten up to there (re-sealed) or replaced", ErrAnchorMismatch, anchor.Seq, ev.Hash, anchor.Hash)
	}
	return nil
}
