package gateway

// The audit log's life cycle as the gateway runs it: a log line at each
// change of the recorder's state, the report of the start's recovery, and
// the shutdown (gateway.stopped, the spill file, the lost-events marker).

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/toolgate/toolgate"
	"github.com/toolgate/toolgate/audit"
)

// LostMarker is the name, under the data folder, of the marker a shutdown
// leaves when it can write its unwritten audit events neither to the store
// nor to SpillFile (audit.WriteLostMarker adds the time and the count to
// it); the next start records it as an audit.events_lost event.
const LostMarker = "audit-lost"

// logAuditState returns the recorder's OnState hook: one log line at each
// change (the store starts failing or writes again, a write stalls or
// finishes, the backlog overflows or drains), so an outage is in the log
// once, with its cause and its length, rather than at every /readyz probe.
func logAuditState(log *slog.Logger) func(prev, next audit.State) {
	since := func(t time.Time) []any {
		return []any{"since", t.UTC().Format(time.RFC3339Nano), "for", time.Since(t).Round(time.Millisecond).String()}
	}
	return func(prev, next audit.State) {
		switch {
		case next.Failing && !prev.Failing:
			log.Error("audit log: the audit store cannot write; calls that would run are refused (internal_error) and /readyz is 503 until it writes again; denials are queued",
				"err", next.Err)
		case prev.Failing && !next.Failing:
			log.Warn("audit log: the audit store writes again; the events queued meanwhile are written (audit.store_failed records the outage)",
				since(prev.FailingSince)...)
		}
		switch {
		case next.Stalled && !prev.Stalled:
			log.Error("audit log: a write to the audit store has stalled; calls that would run are refused (internal_error) and /readyz is 503 until it finishes",
				"err", next.Err)
		case prev.Stalled && !next.Stalled:
			log.Warn("audit log: the stalled write to the audit store finished", since(prev.StalledSince)...)
		}
		switch {
		case next.Overflowing && !prev.Overflowing:
			log.Error("audit log: the audit backlog is full; events that do not fit are counted for one audit.backlog_overflow summary instead of recorded one by one",
				"max_events", audit.DefaultMaxQueued, "max_bytes", audit.DefaultMaxQueuedBytes)
		case prev.Overflowing && !next.Overflowing:
			log.Warn("audit log: the audit backlog has drained; the audit.backlog_overflow summary of the counted events is written", since(prev.OverflowingSince)...)
		}
	}
}

// logRecover logs what the start's audit.Recover found.
func logRecover(log *slog.Logger, rr audit.RecoverReport) {
	if rr.PreviousStop == "unclean" {
		log.Warn("audit log: the previous run stopped without a clean shutdown (recorded as gateway.unclean_stop); events it had accepted but not written may be lost",
			"previous_start_seq", rr.PreviousStart, "last_seq", rr.UncleanStop.Details["last_seq"], "outcome_unknown", len(rr.OutcomeUnknown),
			"replayed_from_spill", rr.Replayed, "scanned", rr.Scanned)
	} else if len(rr.OutcomeUnknown) > 0 {
		log.Warn("audit log: calls of the previous run were left without an outcome and are marked outcome_unknown",
			"outcome_unknown", len(rr.OutcomeUnknown), "previous_start_seq", rr.PreviousStart, "previous_stop", rr.PreviousStop)
	}
	if rr.LostCount > 0 || len(rr.Lost) > 0 {
		log.Error("audit log: events were lost at a previous shutdown (recorded as audit.events_lost)", "lost", rr.LostCount, "markers", len(rr.Lost))
	}
	if rr.Replayed > 0 {
		log.Info("audit log: the events the previous run spilled at shutdown were written", "replayed", rr.Replayed)
	}
}

// closeAudit closes the recorder at shutdown: what is queued is written,
// then gateway.stopped, durably, as the run's last event. What the store
// cannot take in CloseAuditTimeout is spilled to SpillFile (gateway.stopped
// last); if even that fails, a lost-events marker keeps the count for the
// next start. Only the first call does anything; later calls return its
// result.
func (gw *Gateway) closeAudit() error {
	gw.auditOnce.Do(func() { gw.auditErr = gw.closeAuditOnce() })
	return gw.auditErr
}

func (gw *Gateway) closeAuditOnce() error {
	ctx, cancel := context.WithTimeout(context.Background(), CloseAuditTimeout)
	defer cancel()
	stopped := audit.Event{EventType: string(toolgate.EventGatewayStopped),
		Reason:  "the gateway stopped cleanly: every event it accepted was written before this one",
		Details: map[string]any{"started_seq": gw.startedSeq, "version": gw.cfg.Version}}
	cerr := gw.Rec.CloseWith(ctx, stopped)
	if cerr == nil {
		return nil
	}
	left := gw.Rec.Unwritten()
	path := filepath.Join(gw.cfg.DataDir, SpillFile)
	serr := audit.WriteSpill(path, left)
	if serr == nil {
		gw.log.Warn("audit log: events the store could not write were spilled; the next start appends them", "spilled", len(left), "file", path, "store_err", cerr)
		return nil
	}
	lost := audit.CountEvents(left)
	marker, merr := audit.WriteLostMarker(filepath.Join(gw.cfg.DataDir, LostMarker), lost, time.Now())
	if merr != nil {
		gw.log.Error("audit log: events lost: the store could not write them, they could not be spilled, and no marker could be left (the next start records an unclean stop)",
			"lost", lost, "err", serr, "store_err", cerr, "marker_err", merr)
	} else {
		gw.log.Error("audit log: events lost: the store could not write them and they could not be spilled; the next start records the loss (audit.events_lost)",
			"lost", lost, "err", serr, "store_err", cerr, "marker", marker)
	}
	return fmt.Errorf("audit log: %d events lost: %w (spill: %v)", lost, cerr, serr)
}
