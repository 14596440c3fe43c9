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
//  4. In one store transaction it appends the spilled events, one
//     agent.tool.outcome_unknown per call left without an outcome (its
//     causation_id the allow's event_id), and a new gateway.started event
//     that counts them; then it removes the spill file.
//
// So the scan reads one run's records (bounded by the marker), and a
// crash anywhere in Recover repeats it without duplicates. One gateway
// must own a log: with another gateway writing the same log at the same
// time, Recover would mark that one's running calls. It returns an error,
// and the gateway must not start, when the log cannot be read or decoded
// (run toolgate audit verify), the spill file cannot be read, or the
// append fails.
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
			if ev.EventType == string(toolgate.EventGatewayStarted) {
				marker = &ev
				break scan
			}
			rep.Scanned++
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
	if marker != nil {
		rep.PreviousStart = marker.Seq
		if spillSum != "" && marker.Details["spill_sha256"] == spillSum {
			rep.SpillAlreadyReplayed = true
			spill = nil
		}
	}
	var batch []Event
	for _, ev := range spill {
		if !inLog[ev.EventID] {
			batch = append(batch, ev)
		}
	}
	rep.Replayed = len(batch)
	now := o.Now().UTC()
	slices.Reverse(open)
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
			Reason: fmt.Sprintf("the gateway stopped (it crashed or was killed) after this call was allowed (seq %d, %s) and before its outcome was recorded: the tool may or may not have run; check the tool's own records",
				a.Seq, a.OccurredAt.UTC().Format(time.RFC3339Nano))}
		rep.OutcomeUnknown = append(rep.OutcomeUnknown, u)
		batch = append(batch, u)
	}
	details := map[string]any{}
	for k, v := range o.Details {
		details[k] = v
	}
	details["previous_started_seq"] = rep.PreviousStart
	details["scanned"] = rep.Scanned
	details["outcome_unknown"] = len(rep.OutcomeUnknown)
	details["replayed"] = rep.Replayed
	reason := fmt.Sprintf("the gateway started; %d calls of the previous run were left without an outcome and are marked %s; %d events it could not write were replayed",
		len(rep.OutcomeUnknown), toolgate.EventOutcomeUnknown, rep.Replayed)
	if spillSum != "" && !rep.SpillAlreadyReplayed {
		details["spill_sha256"] = spillSum
		reason += " from " + o.SpillPath
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
	for i := range rep.OutcomeUnknown {
		rep.OutcomeUnknown[i] = sealed[rep.Replayed+i]
	}
	if spillSum != "" {
		if err := os.Remove(o.SpillPath); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return rep, fmt.Errorf("audit: recover: the spill file was replayed but cannot be removed (the next start removes it): %w", err)
		}
		_ = syncDir(filepath.Dir(o.SpillPath))
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
