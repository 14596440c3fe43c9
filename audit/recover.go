package audit

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/toolgate/toolgate"
)

// The spill file keeps the events a Recorder could not write before it
// closed (the store was down at shutdown): one event per line, in the JSON
// form of Event, unsealed (seq 0, no hashes; they are sealed when they are
// appended). WriteSpill replaces the file atomically (a temporary file,
// fsynced, renamed, the folder fsynced), so a crash leaves either the old
// file or the new one, never half of one. Recover appends its events at
// the next start.

// WriteSpill adds evs to the spill file at path (mode 0600), after the
// events already in it. It fails when the existing file cannot be read
// (it is then left as it is) or the new one cannot be written and synced;
// the caller then reports the events as lost.
func WriteSpill(path string, evs []Event) error {
	if len(evs) == 0 {
		return nil
	}
	old, _, err := ReadSpill(path)
	if err != nil {
		return fmt.Errorf("audit: spill: the existing spill file is kept as it is: %w", err)
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	for _, ev := range append(old, evs...) {
		ev.Seq, ev.PrevHash, ev.Hash = 0, "", ""
		if err := enc.Encode(&ev); err != nil {
			return fmt.Errorf("audit: spill: encode %s: %w", ev.EventID, err)
		}
	}
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, ".spill-*")
	if err != nil {
		return fmt.Errorf("audit: spill: %w", err)
	}
	defer os.Remove(tmp.Name()) // after a successful rename, a no-op
	err = tmp.Chmod(0o600)
	if err == nil {
		_, err = tmp.Write(buf.Bytes())
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err == nil {
		err = syncDir(dir)
	}
	if err != nil {
		return fmt.Errorf("audit: spill to %s: %w", path, err)
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// ReadSpill reads the spill file at path: its events and the hex sha256 of
// its content. A missing file is no events and no error. A line that is
// not an event is an error naming the line: the file is not replayed in
// part (fail closed; move it away to start without it).
func ReadSpill(path string) ([]Event, string, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, "", nil
	}
	if err != nil {
		return nil, "", fmt.Errorf("audit: read spill file: %w", err)
	}
	sum := sha256.Sum256(b)
	var evs []Event
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 64<<10), len(b)+1)
	for line := 1; sc.Scan(); line++ {
		if len(bytes.TrimSpace(sc.Bytes())) == 0 {
			continue
		}
		ev, err := DecodeEvent(sc.Bytes())
		if err != nil {
			return nil, "", fmt.Errorf("audit: spill file %s, line %d: %w", path, line, err)
		}
		evs = append(evs, ev)
	}
	if err := sc.Err(); err != nil {
		return nil, "", fmt.Errorf("audit: spill file %s: %w", path, err)
	}
	return evs, hex.EncodeToString(sum[:]), nil
}

// A lost marker records that a shutdown could write its unwritten events
// neither to the store nor to the spill file (the data folder's disk was
// full): an empty file next to the path the gateway names, called
// <path>.<unix-nanoseconds>.<count>. The count and the time are in the
// name because creating an empty file needs no data block, so it often
// succeeds on a file system too full to take the spill file; when it fails
// too, the next start's gateway.unclean_stop event is the trace. Recover
// turns each marker into an audit.events_lost event and removes it.

// LostMarker is one marker left by WriteLostMarker.
type LostMarker struct {
	// Path is the marker file.
	Path string
	// Count is how many events were lost.
	Count int
	// At is when (the shutdown).
	At time.Time
}

// WriteLostMarker creates the marker of count events lost at time at,
// next to path (see LostMarker), and syncs its folder. It returns the
// marker's path, or an error when even the empty file cannot be created.
func WriteLostMarker(path string, count int, at time.Time) (string, error) {
	name := fmt.Sprintf("%s.%d.%d", path, at.UnixNano(), max(count, 0))
	f, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return "", fmt.Errorf("audit: lost-events marker: %w", err)
	}
	_ = f.Sync()
	if err := f.Close(); err != nil {
		return "", fmt.Errorf("audit: lost-events marker %s: %w", name, err)
	}
	_ = syncDir(filepath.Dir(name))
	return name, nil
}

// ReadLostMarkers returns the markers next to path, oldest first. Files
// whose names do not have the marker's form are not markers and are left
// out.
func ReadLostMarkers(path string) ([]LostMarker, error) {
	ents, err := os.ReadDir(filepath.Dir(path))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("audit: read lost-events markers: %w", err)
	}
	prefix := filepath.Base(path) + "."
	var out []LostMarker
	for _, e := range ents {
		rest, ok := strings.CutPrefix(e.Name(), prefix)
		if !ok || !e.Type().IsRegular() {
			continue
		}
		ns, count, ok := strings.Cut(rest, ".")
		t, err1 := strconv.ParseInt(ns, 10, 64)
		n, err2 := strconv.Atoi(count)
		if !ok || err1 != nil || err2 != nil || t < 0 || n < 0 || !allDigits(ns) || !allDigits(count) {
			continue
		}
		out = append(out, LostMarker{Path: filepath.Join(filepath.Dir(path), e.Name()), Count: n, At: time.Unix(0, t).UTC()})
	}
	slices.SortFunc(out, func(a, b LostMarker) int { return a.At.Compare(b.At) })
	return out, nil
}

func allDigits(s string) bool {
	for _, c := range []byte(s) {
		if c < '0' || c > '9' {
			return false
		}
	}
	return s != ""
}

// CountEvents returns how many audit events evs stand for, as a lost
// count: one each, an audit.backlog_overflow summary the events it counts
// (details count), and a gateway.stopped none (it records the stop, not a
// call).
func CountEvents(evs []Event) int {
	n := 0
	for _, ev := range evs {
		switch toolgate.EventType(ev.EventType) {
		case toolgate.EventGatewayStopped:
		case toolgate.EventAuditBacklogOverflow:
			if c, ok := detailInt(ev.Details, "count"); ok {
				n += int(c)
			} else {
				n++
			}
		default:
			n++
		}
	}
	return n
}

// detailInt reads an integer detail (an int, an int64, a uint64 or a
// json.Number, as details hold after a JSON round trip).
func detailInt(d map[string]any, key string) (int64, bool) {
	switch v := d[key].(type) {
	case json.Number:
		n, err := v.Int64()
		return n, err == nil
	case int:
		return int64(v), true
	case int64:
		return v, true
	case uint64:
		return int64(v), true
	}
	return 0, false
}

// RecoverOptions configures Recover. The zero value is valid.
type RecoverOptions struct {
	// SpillPath is the spill file to replay ("" for none).
	SpillPath string
	// Now is the clock; default time.Now.
	Now func() time.Time
	// NewEventID makes event ids; default NewEventID.
	NewEventID func() string
	// Details are added to the gateway.started event's details (the
	// version, the bundle folder).
	Details map[string]any
	// LostMarker is the path given to WriteLostMarker at shutdown ("" for
	// none): each marker found becomes an audit.events_lost event and is
	// removed.
	LostMarker string
	// RecordsStop says that the caller writes a gateway.stopped event at
	// each clean shutdown (Recorder.CloseWith). It is noted in the
	// gateway.started event (details records_stop: true), and the next
	// start writes gateway.unclean_stop when that run ended without one. A
	// run whose gateway.started does not note it (an older version, or a
	// caller that records no stop) is not judged.
	RecordsStop bool
}

// RecoverReport says what Recover found and wrote.
type RecoverReport struct {
	// PreviousStart is the seq of the previous run's gateway.started
	// event; 0 when there was none (the whole log was read).
	PreviousStart int64 `json:"previous_start"`
	// Scanned is how many records of the previous run were read.
	Scanned int64 `json:"scanned"`
	// Replayed is how many events of the spill file were appended.
	Replayed int `json:"replayed"`
	// SpillAlreadyReplayed is true when the spill file found had been
	// appended by an earlier start that stopped before removing it.
	SpillAlreadyReplayed bool `json:"spill_already_replayed,omitempty"`
	// OutcomeUnknown are the agent.tool.outcome_unknown events written.
	OutcomeUnknown []Event `json:"outcome_unknown,omitempty"`
	// PreviousStop says how the previous run ended: "clean" (its
	// gateway.stopped is in the log or the spill file), "unclean" (it has
	// none: UncleanStop was written), "unknown" (its gateway.started does
	// not note RecordsStop, or there is none in a log that is not empty),
	// or "none" (the log was empty).
	PreviousStop string `json:"previous_stop"`
	// UncleanStop is the gateway.unclean_stop event written; zero when
	// PreviousStop is not "unclean".
	UncleanStop Event `json:"unclean_stop,omitzero"`
	// Lost are the audit.events_lost events written, one per lost-events
	// marker; LostCount is the sum of their counts.
	Lost      []Event `json:"lost,omitempty"`
	LostCount int     `json:"lost_count,omitempty"`
	// Started is the gateway.started event written.
	Started Event `json:"started"`
}

// recoverPage is how many records Recover reads at a time.
const recoverPage = 1000

// Recover is what a gateway does when it starts, before it takes calls and
// before any other event is written:
//
//  1. It reads the previous run: the records after the newest
//     gateway.started event (the whole log when there is none), newest
//     first, in pages.
//  2. It finds the calls that run left without an outcome: each
//     agent.tool.authorized allow with no later agent.tool.completed,
//     agent.tool.failed or agent.tool.outcome_unknown naming it as its
//     causation_id, and no internal_error refusal naming it (details
//     refused_allow_event_id: the gate refused the call after all when the
//     allow's record could not be confirmed). Allows that toolgate does not run are left out: those
//     decided only (details decide_only, the JSON API's /v1/decide) and
//     those of the CLI's call command (details via "cli"), whose process
//     is not the gateway's.
//  3. It reads the spill file (events the previous run could not write
//     before it stopped), leaving out events already in the log; a spill
//     file that an earlier start appended already (its sha256 is in that
//     start's gateway.started event) is only removed.
//  4. It tells how the previous run ended (RecoverReport.PreviousStop): a
//     run whose start noted RecordsStop and that has no gateway.stopped,
//     neither in the log nor in the spill file, stopped without a clean
//     shutdown, so events it had accepted but not written may be lost.
//  5. It reads the lost-events markers (WriteLostMarker), leaving out
//     those an earlier start recorded already (named in its
//     gateway.started event).
//  6. In one store transaction it appends the spilled events; a
//     gateway.unclean_stop event for an unclean stop (the previous start's
//     seq and time, the last record of that run, the calls marked
//     outcome_unknown, the events known lost); one audit.events_lost per
//     marker; one agent.tool.outcome_unknown per call left without an
//     outcome (its causation_id the allow's event_id); and a new
//     gateway.started event that counts them. Then it removes the spill
//     file and the markers.
//
// So the scan reads one run's records (bounded by the marker), and a
// crash anywhere in Recover repeats it without duplicates. One gateway
// must own a log: with another gateway writing the same log at the same
// time, Recover would mark that one's running calls. It returns an error,
// and the gateway must not start, when the log cannot be read or decoded
// (run toolgate audit verify), the spill file or the markers' folder
// cannot be read, or the append fails.
func Recover(ctx context.Context, s Store, opts *RecoverOptions) (RecoverReport, error) {
	var o RecoverOptions
	if opts != nil {
		o = *opts
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.NewEventID == nil {
		o.NewEventID = NewEventID
	}
	var rep RecoverReport
	var spill []Event
	var spillSum string
	if o.SpillPath != "" {
		var err error
		spill, spillSum, err = ReadSpill(o.SpillPath)
		if err != nil {
			return rep, fmt.Errorf("audit: recover: %w (move the file away to start without its events)", err)
		}
	}
	var markers []LostMarker
	if o.LostMarker != "" {
		var err error
		if markers, err = ReadLostMarkers(o.LostMarker); err != nil {
			return rep, fmt.Errorf("audit: recover: %w", err)
		}
	}
	closed := map[string]bool{}
	spillIDs := map[string]bool{}
	for _, ev := range spill {
		if closes(ev) {
			closed[ev.CausationID] = true
		}
		spillIDs[ev.EventID] = true
	}
	head, err := s.AuditHead(ctx)
	if err != nil {
		return rep, fmt.Errorf("audit: recover: read head: %w", err)
	}
	var open []Event // newest first
	var marker *Event
	var last *Event // the newest record of the previous run
	stopped := false
	inLog := map[string]bool{}
scan:
	for hi := head.Seq; hi >= 1; {
		from := max(1, hi-recoverPage+1)
		recs, err := s.ReadRecords(ctx, from, int(hi-from+1))
		if err != nil {
			return rep, fmt.Errorf("audit: recover: read from seq %d: %w", from, err)
		}
		for i := len(recs) - 1; i >= 0; i-- {
			ev, err := recs[i].Event()
			if err != nil {
				return rep, fmt.Errorf("audit: recover: %w (run toolgate audit verify)", err)
			}
			if last == nil {
				last = &ev
			}
			if ev.EventType == string(toolgate.EventGatewayStarted) {
				marker = &ev
				break scan
			}
			rep.Scanned++
			if ev.EventType == string(toolgate.EventGatewayStopped) {
				stopped = true
			}
			if spillIDs[ev.EventID] {
				inLog[ev.EventID] = true
			}
			if closes(ev) {
				closed[ev.CausationID] = true
			}
			if ev.EventType != string(toolgate.EventAuthorized) || ev.Verdict != toolgate.Allow.String() {
				continue
			}
			if closed[ev.EventID] {
				delete(closed, ev.EventID)
				continue
			}
			if ev.Details["decide_only"] == true || ev.Details["via"] == "cli" {
				continue
			}
			open = append(open, ev)
		}
		hi = from - 1
	}
	recorded := map[string]bool{} // markers an earlier start recorded
	if marker != nil {
		rep.PreviousStart = marker.Seq
		if spillSum != "" && marker.Details["spill_sha256"] == spillSum {
			rep.SpillAlreadyReplayed = true
			spill = nil
		}
		if names, ok := marker.Details["lost_markers"].([]any); ok {
			for _, n := range names {
				if n, ok := n.(string); ok {
					recorded[n] = true
				}
			}
		}
	}
	var batch []Event
	for _, ev := range spill {
		if inLog[ev.EventID] {
			continue
		}
		batch = append(batch, ev)
		// The stop of the run that spilled it: the one since marker.
		if ev.EventType == string(toolgate.EventGatewayStopped) && marker != nil {
			if seq, ok := detailInt(ev.Details, "started_seq"); ok && seq == marker.Seq {
				stopped = true
			}
		}
	}
	rep.Replayed = len(batch)
	now := o.Now().UTC()
	ts := func(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

	var lost []Event
	var seen []any // every marker found, recorded now or before
	for _, m := range markers {
		name := filepath.Base(m.Path)
		seen = append(seen, name)
		if recorded[name] {
			continue
		}
		rep.LostCount += m.Count
		lost = append(lost, Event{EventID: o.NewEventID(), EventType: string(toolgate.EventAuditEventsLost), OccurredAt: m.At,
			Code: "events_lost",
			Reason: fmt.Sprintf("at the shutdown at %s, %d audit events could be written neither to the audit store nor to the spill file (the data folder's file system was full or failing): they are lost; the gateway's log of that shutdown has the error",
				ts(m.At), m.Count),
			Details: map[string]any{"count": m.Count, "at": ts(m.At), "marker": name}})
	}

	switch {
	case marker == nil && head.Seq == 0:
		rep.PreviousStop = "none"
	case marker == nil || marker.Details["records_stop"] != true:
		rep.PreviousStop = "unknown"
	case stopped:
		rep.PreviousStop = "clean"
	default:
		rep.PreviousStop = "unclean"
	}

	slices.Reverse(open)
	var unknown []Event
	for _, a := range open {
		details := map[string]any{}
		for k, v := range a.Details {
			details[k] = v
		}
		details["allowed_seq"] = a.Seq
		u := Event{EventID: o.NewEventID(), EventType: string(toolgate.EventOutcomeUnknown), OccurredAt: now,
			CorrelationID: a.CorrelationID, CausationID: a.EventID, AgentID: a.AgentID, AgentVersion: a.AgentVersion,
			Principal: a.Principal, InstanceID: a.InstanceID, Environment: a.Environment, ToolID: a.ToolID, ToolName: a.ToolName,
			Verdict: a.Verdict, Code: "outcome_unknown", Layer: a.Layer, ArgsDigest: a.ArgsDigest, ApprovalID: a.ApprovalID,
			DeploymentMode: a.DeploymentMode, Details: details,
			Reason: fmt.Sprintf("the gateway stopped after this call was allowed (seq %d, %s) and before its outcome was recorded (it crashed or was killed, or the completion was among the events the audit log could not write or only counted): the tool may or may not have run; check the tool's own records",
				a.Seq, ts(a.OccurredAt))}
		unknown = append(unknown, u)
	}

	uncleanAt := -1
	if rep.PreviousStop == "unclean" {
		// last is never nil here: the scan read marker at least.
		reason := fmt.Sprintf("the previous run (its gateway.started is seq %d, %s) stopped without a clean shutdown: it crashed, was killed, lost power, or could not write or spill its audit events at shutdown. "+
			"Its last record is seq %d (%s). Events it had accepted but not written may be lost: completions (%d calls of that run are marked %s) and events queued while the store could not write",
			marker.Seq, ts(marker.OccurredAt), last.Seq, ts(last.OccurredAt), len(unknown), toolgate.EventOutcomeUnknown)
		if rep.LostCount > 0 {
			reason += fmt.Sprintf("; %d events are known lost at its shutdown (%s)", rep.LostCount, toolgate.EventAuditEventsLost)
		}
		if rep.Replayed > 0 {
			reason += fmt.Sprintf("; %d events it spilled were written before this one", rep.Replayed)
		}
		uncleanAt = len(batch)
		batch = append(batch, Event{EventID: o.NewEventID(), EventType: string(toolgate.EventGatewayUncleanStop), OccurredAt: now,
			Code: "unclean_stop", Reason: reason,
			Details: map[string]any{"previous_started_seq": marker.Seq, "previous_started_at": ts(marker.OccurredAt),
				"last_seq": last.Seq, "last_at": ts(last.OccurredAt), "outcome_unknown": len(unknown),
				"events_lost": rep.LostCount, "replayed": rep.Replayed}})
	}
	lostAt := len(batch)
	batch = append(batch, lost...)
	unknownAt := len(batch)
	batch = append(batch, unknown...)

	details := map[string]any{}
	for k, v := range o.Details {
		details[k] = v
	}
	details["previous_started_seq"] = rep.PreviousStart
	details["previous_stop"] = rep.PreviousStop
	details["scanned"] = rep.Scanned
	details["outcome_unknown"] = len(unknown)
	details["replayed"] = rep.Replayed
	if o.RecordsStop {
		details["records_stop"] = true
	}
	if len(seen) > 0 {
		details["lost_markers"] = seen
		details["events_lost"] = rep.LostCount
	}
	reason := fmt.Sprintf("the gateway started; %d calls of the previous run were left without an outcome and are marked %s; %d events it could not write were replayed",
		len(unknown), toolgate.EventOutcomeUnknown, rep.Replayed)
	if spillSum != "" && !rep.SpillAlreadyReplayed {
		details["spill_sha256"] = spillSum
		reason += " from " + o.SpillPath
	}
	switch rep.PreviousStop {
	case "clean":
		reason += "; the previous run stopped cleanly"
	case "unclean":
		reason += fmt.Sprintf("; the previous run stopped without a clean shutdown (%s)", toolgate.EventGatewayUncleanStop)
	}
	if rep.LostCount > 0 {
		reason += fmt.Sprintf("; %d events were lost at a previous shutdown (%s)", rep.LostCount, toolgate.EventAuditEventsLost)
	}
	if rep.PreviousStart == 0 {
		reason += " (no earlier start is recorded: the whole log was read)"
	}
	batch = append(batch, Event{EventID: o.NewEventID(), EventType: string(toolgate.EventGatewayStarted), OccurredAt: now,
		Reason: reason, Details: details})
	sealed, err := s.AppendEvents(ctx, batch)
	if err != nil {
		return rep, fmt.Errorf("audit: recover: append %d events: %w", len(batch), err)
	}
	if len(sealed) != len(batch) {
		return rep, fmt.Errorf("audit: recover: the store returned %d events for %d", len(sealed), len(batch))
	}
	rep.Started = sealed[len(sealed)-1]
	if uncleanAt >= 0 {
		rep.UncleanStop = sealed[uncleanAt]
	}
	rep.Lost = slices.Clone(sealed[lostAt : lostAt+len(lost)])
	if len(unknown) > 0 {
		rep.OutcomeUnknown = slices.Clone(sealed[unknownAt : unknownAt+len(unknown)])
	}
	if len(rep.Lost) == 0 {
		rep.Lost = nil
	}
	if spillSum != "" {
		if err := os.Remove(o.SpillPath); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return rep, fmt.Errorf("audit: recover: the spill file was replayed but cannot be removed (the next start removes it): %w", err)
		}
		_ = syncDir(filepath.Dir(o.SpillPath))
	}
	// A marker that cannot be removed stays named in this start's
	// gateway.started (lost_markers), so the next start does not record it
	// again.
	for _, m := range markers {
		_ = os.Remove(m.Path)
	}
	if len(markers) > 0 {
		_ = syncDir(filepath.Dir(o.LostMarker))
	}
	return rep, nil
}

// closes reports whether ev settles the allow named by its causation_id: a
// completion, a failure, an outcome_unknown, or the gate's internal_error
// refusal of a call whose allow record it could not confirm, which names
// the allow in details refused_allow_event_id as well (a causation_id
// alone may come from the caller: it cannot settle another call).
func closes(ev Event) bool {
	if ev.CausationID == "" {
		return false
	}
	switch toolgate.EventType(ev.EventType) {
	case toolgate.EventCompleted, toolgate.EventFailed, toolgate.EventOutcomeUnknown:
		return true
	case toolgate.EventUnauthorized:
		return ev.Code == string(toolgate.CodeInternalError) && ev.Details["refused_allow_event_id"] == ev.CausationID
	}
	return false
}
