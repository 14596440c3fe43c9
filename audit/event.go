// Package audit records every decision toolgate makes in an append-only,
// hash-chained log (docs/design.md, "What the audit log promises"), so that `toolgate audit verify` can prove
// no record was edited, removed or reordered after it was written.
//
// The package holds the event envelope ([Event]), the hash chain ([Seal],
// [ComputeHash], [Verify]), the [Store] interface that the backends in
// store/sqlite and store/postgres implement, and the [Recorder], which
// group-commits events so that an allow decision waits only for one shared
// fsync and a denial does not wait at all.
package audit

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// GenesisHash is the prev_hash of the first record (seq 1): 64 zeros.
const GenesisHash = "0000000000000000000000000000000000000000000000000000000000000000"

// Event is one audit record: the envelope of docs/design.md, "What the audit log promises". Its JSON form uses
// the envelope's field names. EventType, Verdict, Code and Layer hold the
// wire names of the toolgate vocabulary (toolgate.EventAuthorized,
// toolgate.Allow.String(), toolgate.CodeOK, toolgate.LayerPolicy...).
//
// Seq, PrevHash and Hash are assigned by the store when the event is
// appended ([Seal]); whatever a caller puts there is overwritten.
type Event struct {
	// EventID identifies the event; the Recorder fills a random UUID when empty.
	EventID string `json:"event_id"`
	// EventType is the taxonomy name, e.g. "agent.tool.authorized".
	EventType string `json:"event_type"`
	// OccurredAt is when the decision was made. It is stored and hashed as
	// RFC 3339 with nanoseconds in UTC; the Recorder fills its clock when zero.
	OccurredAt time.Time `json:"occurred_at"`
	// CorrelationID ties together every event of one tool call.
	CorrelationID string `json:"correlation_id"`
	// CausationID is the event_id (or request id) that caused this event.
	CausationID string `json:"causation_id"`
	// AgentID is the agent that made the call.
	AgentID string `json:"agent_id"`
	// AgentVersion is the version of the agent definition that decided.
	AgentVersion string `json:"agent_version"`
	// Principal is the subject the call ran as.
	Principal string `json:"principal"`
	// InstanceID is the business instance (tenant); "" for none.
	InstanceID string `json:"instance_id"`
	// Environment is the instance's environment ("staging"); "" for none.
	Environment string `json:"environment"`
	// ToolID is the canonical tool id ("tool:supabase-write"); empty when the
	// called name did not map to one.
	ToolID string `json:"tool_id"`
	// ToolName is the name as the model called it.
	ToolName string `json:"tool_name"`
	// Verdict is "allow", "deny" or "require_approval" (empty for events that
	// are not decisions, such as policy.bundle.loaded).
	Verdict string `json:"verdict"`
	// Code is the stable decision code ("ok", "not_in_ceiling", ...).
	Code string `json:"code"`
	// Layer is the layer that decided ("ceiling", "policy", ...).
	Layer string `json:"layer"`
	// Reason is the human sentence of the decision.
	Reason string `json:"reason"`
	// ArgsDigest is approval.ArgsDigest of the call's arguments.
	ArgsDigest string `json:"args_digest"`

	// ApprovalID is the approval asked for, granted, denied, expired or used.
	ApprovalID string `json:"approval_id,omitempty"`
	// DeploymentMode is the runtime policy mode the decision used.
	DeploymentMode string `json:"deployment_mode,omitempty"`
	// OutputDigest is the sha256 hex of the tool's output (completed events).
	OutputDigest string `json:"output_digest,omitempty"`
	// ReturnedBytes is the size of the output returned to the caller, in bytes.
	ReturnedBytes int64 `json:"returned_bytes,omitempty"`
	// Attempts is how many times the adapter tried the call.
	Attempts int `json:"attempts,omitempty"`
	// DurationMS is how long the call took, in milliseconds.
	DurationMS int64 `json:"duration_ms,omitempty"`
	// Details holds anything else as JSON (for example a rejected bundle's
	// errors). It is normalized through JSON before hashing, so after a
	// round trip through a store numbers are json.Number and objects are
	// map[string]any.
	Details map[string]any `json:"details,omitempty"`

	// Seq is the position in the chain, starting at 1, without gaps.
	Seq int64 `json:"seq"`
	// PrevHash is the Hash of record Seq-1, or GenesisHash for Seq 1.
	PrevHash string `json:"prev_hash"`
	// Hash is hex(sha256(PrevHash || CanonicalJSON(event with Hash empty))).
	Hash string `json:"hash"`
}

// Head is the end of the chain: the Seq and Hash of the last record. The
// head of an empty log is {0, GenesisHash}.
type Head struct {
	Seq  int64  `json:"seq"`
	Hash string `json:"hash"`
}

// CanonicalJSON returns the bytes an event's hash covers: the event with Hash
// set to "" encoded as compact JSON with object keys sorted (bytewise) at
// every depth, strings escaped as encoding/json does without HTML escaping
// (bytes that are not UTF-8 become U+FFFD), occurred_at as RFC 3339 with
// nanoseconds in UTC, Details after a JSON round trip, and the optional
// fields (approval_id ... details) left out when zero. Decoding it and
// encoding again gives the same bytes. It fails only when Details cannot be
// encoded as JSON.
func CanonicalJSON(ev Event) ([]byte, error) {
	ev.Hash = ""
	return canonical(ev)
}

// ComputeHash returns hex(sha256(ev.PrevHash || CanonicalJSON(ev))), where
// PrevHash is taken as its 64 ASCII hex characters.
func ComputeHash(ev Event) (string, error) {
	b, err := CanonicalJSON(ev)
	if err != nil {
		return "", err
	}
	return hashOf(ev.PrevHash, b), nil
}

func hashOf(prev string, canon []byte) string {
	h := sha256.New()
	h.Write([]byte(prev))
	h.Write(canon)
	return hex.EncodeToString(h.Sum(nil))
}

// CheckHash reports whether ev.Hash is the hash of ev's content; the error
// says what is wrong.
func CheckHash(ev Event) error {
	h, err := ComputeHash(ev)
	if err != nil {
		return err
	}
	if h != ev.Hash {
		return fmt.Errorf("audit: seq %d: stored hash %.16s… does not match content hash %.16s…", ev.Seq, ev.Hash, h)
	}
	return nil
}

// Seal links ev after prev: it sets Seq to prev.Seq+1, PrevHash to prev.Hash
// (GenesisHash when prev is the empty head) and Hash, puts OccurredAt in UTC
// and Details in their JSON-normalized form, and returns the sealed event
// with the body a store keeps: its canonical JSON with the hash in it, so
// that DecodeEvent(body) equals the returned event.
// Stores call Seal for each event of a batch, under their append lock.
func Seal(prev Head, ev Event) (Event, []byte, error) {
	ev.Seq = prev.Seq + 1
	ev.PrevHash = prev.Hash
	if prev.Seq == 0 && prev.Hash == "" {
		ev.PrevHash = GenesisHash
	}
	ev.Hash = ""
	ev, err := normalize(ev)
	if err != nil {
		return Event{}, nil, err
	}
	canon, hashAt, err := appendCanonical(make([]byte, 0, 1024), ev)
	if err != nil {
		return Event{}, nil, err
	}
	ev.Hash = hashOf(ev.PrevHash, canon)
	body := make([]byte, 0, len(canon)+len(ev.Hash))
	body = append(body, canon[:hashAt]...)
	body = append(body, ev.Hash...)
	body = append(body, canon[hashAt:]...)
	return ev, body, nil
}

// DecodeEvent parses a stored body. Unknown fields are an error (they are not
// covered by the canonical form, so accepting them would let content slip
// past the hash). Numbers inside Details decode as json.Number.
func DecodeEvent(body []byte) (Event, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	dec.DisallowUnknownFields()
	var ev Event
	if err := dec.Decode(&ev); err != nil {
		return Event{}, fmt.Errorf("audit: decode event: %w", err)
	}
	if dec.More() {
		return Event{}, errors.New("audit: decode event: trailing data after the event")
	}
	ev.OccurredAt = ev.OccurredAt.UTC()
	return ev, nil
}

// canonical encodes ev, Hash included as it is, in canonical form.
func canonical(ev Event) ([]byte, error) {
	b, _, err := appendCanonical(make([]byte, 0, 1024), ev)
	return b, err
}

// appendCanonical appends ev's canonical JSON to b and returns it with the
// offset just after the opening quote of the "hash" value, so that Seal can
// splice the hash in without encoding twice. Keys are written in sorted
// order by hand; TestCanonicalMatchesReference checks the result against
// encoding/json over a map.
func appendCanonical(b []byte, ev Event) ([]byte, int, error) {
	str := func(key, v string) {
		b = append(b, '"')
		b = append(b, key...)
		b = append(b, `":`...)
		b = appendJSONString(b, v)
		b = append(b, ',')
	}
	num := func(key string, v int64) {
		b = append(b, '"')
		b = append(b, key...)
		b = append(b, `":`...)
		b = strconv.AppendInt(b, v, 10)
		b = append(b, ',')
	}
	b = append(b, '{')
	str("agent_id", ev.AgentID)
	str("agent_version", ev.AgentVersion)
	if ev.ApprovalID != "" {
		str("approval_id", ev.ApprovalID)
	}
	str("args_digest", ev.ArgsDigest)
	if ev.Attempts != 0 {
		num("attempts", int64(ev.Attempts))
	}
	str("causation_id", ev.CausationID)
	str("code", ev.Code)
	str("correlation_id", ev.CorrelationID)
	if ev.DeploymentMode != "" {
		str("deployment_mode", ev.DeploymentMode)
	}
	if len(ev.Details) > 0 {
		d, err := normalizeDetails(ev.Details)
		if err != nil {
			return nil, 0, err
		}
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(d); err != nil {
			return nil, 0, fmt.Errorf("audit: encode details of %s: %w", ev.EventID, err)
		}
		b = append(b, `"details":`...)
		b = append(b, bytes.TrimSuffix(buf.Bytes(), []byte("\n"))...)
		b = append(b, ',')
	}
	if ev.DurationMS != 0 {
		num("duration_ms", ev.DurationMS)
	}
	str("environment", ev.Environment)
	str("event_id", ev.EventID)
	str("event_type", ev.EventType)
	b = append(b, `"hash":"`...)
	hashAt := len(b)
	b = appendJSONStringBody(b, ev.Hash)
	b = append(b, `",`...)
	str("instance_id", ev.InstanceID)
	str("layer", ev.Layer)
	b = append(b, `"occurred_at":"`...)
	b = ev.OccurredAt.UTC().AppendFormat(b, time.RFC3339Nano)
	b = append(b, `",`...)
	if ev.OutputDigest != "" {
		str("output_digest", ev.OutputDigest)
	}
	str("prev_hash", ev.PrevHash)
	str("principal", ev.Principal)
	str("reason", ev.Reason)
	if ev.ReturnedBytes != 0 {
		num("returned_bytes", ev.ReturnedBytes)
	}
	num("seq", ev.Seq)
	str("tool_id", ev.ToolID)
	str("tool_name", ev.ToolName)
	b = append(b, `"verdict":`...)
	b = appendJSONString(b, ev.Verdict)
	b = append(b, '}')
	return b, hashAt, nil
}

// appendJSONString appends s as a JSON string exactly as encoding/json does
// with HTML escaping off.
func appendJSONString(b []byte, s string) []byte {
	b = append(b, '"')
	b = appendJSONStringBody(b, s)
	return append(b, '"')
}

const hexDigits = "0123456789abcdef"

// appendJSONStringBody appends s's escaped content (no quotes) by
// encoding/json's rules (`"` and `\` escaped, control characters as \b \f
// \n \r \t or \u00XX, U+2028 and U+2029 as \u2028 and \u2029), except that
// each byte that is not valid UTF-8 becomes the character U+FFFD itself
// rather than the escape \ufffd, so that an event and its JSON round trip
// encode the same.
func appendJSONStringBody(b []byte, s string) []byte {
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, "\uFFFD"...) // as the character, like a JSON round trip leaves it
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	return append(b, s[start:]...)
}

// normalize returns ev as it reads back after a JSON round trip:
// OccurredAt in UTC, strings with invalid UTF-8 bytes replaced by U+FFFD,
// Details normalized (nil when empty).
func normalize(ev Event) (Event, error) {
	ev.OccurredAt = ev.OccurredAt.UTC()
	for _, p := range []*string{&ev.EventID, &ev.EventType, &ev.CorrelationID, &ev.CausationID,
		&ev.AgentID, &ev.AgentVersion, &ev.Principal, &ev.InstanceID, &ev.Environment, &ev.ToolID,
		&ev.ToolName, &ev.Verdict, &ev.Code, &ev.Layer, &ev.Reason, &ev.ArgsDigest, &ev.ApprovalID,
		&ev.DeploymentMode, &ev.OutputDigest, &ev.PrevHash, &ev.Hash} {
		*p = validUTF8(*p)
	}
	if len(ev.Details) == 0 {
		ev.Details = nil
		return ev, nil
	}
	d, err := normalizeDetails(ev.Details)
	if err != nil {
		return ev, err
	}
	ev.Details = d
	return ev, nil
}

// validUTF8 replaces each byte of s that is not valid UTF-8 with U+FFFD, as
// encoding/json does.
func validUTF8(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	var sb strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			sb.WriteRune(utf8.RuneError)
		} else {
			sb.WriteString(s[i : i+size])
		}
		i += size
	}
	return sb.String()
}

// normalizeDetails turns any JSON-encodable map into the form it has after a
// JSON round trip: maps, slices, strings, bools, nil and json.Number. Maps
// encode with sorted keys, so the result encodes canonically.
func normalizeDetails(d map[string]any) (map[string]any, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(d); err != nil {
		return nil, fmt.Errorf("audit: details are not JSON-encodable: %w", err)
	}
	dec := json.NewDecoder(&buf)
	dec.UseNumber()
	var out map[string]any
	if err := dec.Decode(&out); err != nil {
		return nil, fmt.Errorf("audit: details are not JSON-encodable: %w", err)
	}
	return out, nil
}

// NewEventID returns a random version-4 UUID ("xxxxxxxx-xxxx-4xxx-yxxx-xxxxxxxxxxxx").
func NewEventID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+).
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	var sb strings.Builder
	x := hex.EncodeToString(b[:])
	sb.WriteString(x[0:8])
	sb.WriteByte('-')
	sb.WriteString(x[8:12])
	sb.WriteByte('-')
	sb.WriteString(x[12:16])
	sb.WriteByte('-')
	sb.WriteString(x[16:20])
	sb.WriteByte('-')
	sb.WriteString(x[20:])
	return sb.String()
}
