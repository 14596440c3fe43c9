package audit

import (
	"context"
	"fmt"
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
	// Head is the head the store reported when Verify started; records
	// appended after it are not checked. Keep it outside the store (print it,
	// sign it) to detect later rewrites of the whole chain.
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

// Verify walks the chain from seq 1 to the head the store reports and
// returns a Report naming the first bad record and how it is bad. It returns
// an error only when the store cannot be read (or ctx ends); a tampered log
// is a Report with OK false, not an error.
//
// Each record is checked in this order: its seq follows the previous one
// (else Removed), its body decodes (else Edited), the seq inside the body is
// the seq it is stored at (else Reordered when the record sealed for this
// seq is stored elsewhere, Removed when it is nowhere: records were removed
// and the rest renumbered), its hash matches its content
// (else Edited), and its prev_hash is the previous record's hash (else
// Removed). Finally the last record must be the head (else Removed when
// records are missing at the end, Edited when the head row disagrees).
func Verify(ctx context.Context, s Store) (Report, error) {
	head, err := s.AuditHead(ctx)
	if err != nil {
		return Report{}, fmt.Errorf("audit: verify: read head: %w", err)
	}
	rep := Report{Head: head, LastGood: Head{Seq: 0, Hash: GenesisHash}}
	fail := func(seq int64, kind ProblemKind, format string, args ...any) (Report, error) {
		rep.Problem = &Problem{Seq: seq, Kind: kind, Detail: fmt.Sprintf(format, args...)}
		return rep, nil
	}
	prev := rep.LastGood
	next := int64(1)
walk:
	for next <= head.Seq {
		recs, err := s.ReadRecords(ctx, next, verifyPage)
		if err != nil {
			return Report{}, fmt.Errorf("audit: verify: read from seq %d: %w", next, err)
		}
		if len(recs) == 0 {
			break
		}
		for _, r := range recs {
			if r.Seq > head.Seq {
				break walk
			}
			if r.Seq != next {
				return fail(next, Removed, "record seq %d is missing: the next stored record is seq %d", next, r.Seq)
			}
			ev, err := r.Event()
			if err != nil {
				return fail(r.Seq, Edited, "stored body is not a valid event: %v", err)
			}
			if ev.Seq != r.Seq {
				if ev.Seq > r.Seq {
					found, err := findSealed(ctx, s, r.Seq+1, r.Seq)
					if err != nil {
						return Report{}, err
					}
					if !found {
						return fail(r.Seq, Removed, "record seq %d is missing and the records after it were renumbered (the record stored at seq %d was sealed as seq %d)", r.Seq, r.Seq, ev.Seq)
					}
				}
				return fail(r.Seq, Reordered, "the record stored at seq %d was sealed as seq %d", r.Seq, ev.Seq)
			}
			h, err := ComputeHash(ev)
			if err != nil {
				return fail(r.Seq, Edited, "content cannot be hashed: %v", err)
			}
			if h != ev.Hash {
				return fail(r.Seq, Edited, "content does not match its hash (stored %.12s…, computed %.12s…)", ev.Hash, h)
			}
			if ev.PrevHash != prev.Hash {
				return fail(r.Seq, Removed, "prev_hash %.12s… is not the hash of seq %d (%.12s…): a record before it was removed or replaced", ev.PrevHash, prev.Seq, prev.Hash)
			}
			prev = Head{Seq: ev.Seq, Hash: ev.Hash}
			rep.LastGood = prev
			rep.Checked++
			next++
			if err := ctx.Err(); err != nil {
				return Report{}, fmt.Errorf("audit: verify: %w", err)
			}
		}
	}
	switch {
	case prev.Seq < head.Seq:
		return fail(prev.Seq+1, Removed, "the log ends at seq %d but its head says seq %d: the newest records were removed", prev.Seq, head.Seq)
	case prev.Hash != head.Hash:
		return fail(head.Seq, Edited, "the head row's hash %.12s… is not the hash of seq %d (%.12s…)", head.Hash, prev.Seq, prev.Hash)
	}
	rep.OK = true
	return rep, nil
}
