package audit

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 600700800, time.UTC)

func sample() Event {
	return Event{
		EventID:       "ev-1",
		EventType:     "agent.tool.unauthorized",
		OccurredAt:    t0,
		CorrelationID: "corr-1",
		CausationID:   "req-1",
		AgentID:       "agent-support",
		AgentVersion:  "3",
		Principal:     "user:alice",
		InstanceID:    "acme",
		Environment:   "staging",
		ToolID:        "tool:supabase-write",
		ToolName:      "supabase_write",
		Verdict:       "deny",
		Code:          "not_in_ceiling",
		Layer:         "ceiling",
		Reason:        "<tool> & co",
		ArgsDigest:    "d1",
	}
}

// TestCanonicalJSONGolden pins the bytes the hash covers: changing them
// breaks every existing chain.
func TestCanonicalJSONGolden(t *testing.T) {
	ev := sample()
	ev.Seq, ev.PrevHash, ev.Hash = 7, GenesisHash, "ignored"
	ev.Attempts = 2
	ev.Details = map[string]any{"z": 1.5, "a": map[string]any{"y": []int{1, 2}, "b": "é"}}
	got, err := CanonicalJSON(ev)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"agent_id":"agent-support","agent_version":"3","args_digest":"d1","attempts":2,` +
		`"causation_id":"req-1","code":"not_in_ceiling","correlation_id":"corr-1",` +
		`"details":{"a":{"b":"é","y":[1,2]},"z":1.5},"environment":"staging",` +
		`"event_id":"ev-1","event_type":"agent.tool.unauthorized","hash":"","instance_id":"acme",` +
		`"layer":"ceiling","occurred_at":"2026-01-02T03:04:05.6007008Z","prev_hash":"` + GenesisHash + `",` +
		`"principal":"user:alice","reason":"<tool> & co","seq":7,"tool_id":"tool:supabase-write",` +
		`"tool_name":"supabase_write","verdict":"deny"}`
	if diff := cmp.Diff(want, string(got)); diff != "" {
		t.Errorf("CanonicalJSON (-want +got):\n%s", diff)
	}
}

func TestHashCoversEveryField(t *testing.T) {
	ev := sample()
	ev.Details = map[string]any{"k": "v"}
	sealed, _, err := Seal(Head{}, ev)
	if err != nil {
		t.Fatal(err)
	}
	if err := CheckHash(sealed); err != nil {
		t.Fatalf("CheckHash of a sealed event: %v", err)
	}
	tests := []struct {
		name   string
		change func(*Event)
	}{
		{"verdict", func(e *Event) { e.Verdict = "allow" }},
		{"principal", func(e *Event) { e.Principal = "user:mallory" }},
		{"time", func(e *Event) { e.OccurredAt = e.OccurredAt.Add(time.Nanosecond) }},
		{"seq", func(e *Event) { e.Seq++ }},
		{"prev_hash", func(e *Event) { e.PrevHash = strings.Repeat("1", 64) }},
		{"details", func(e *Event) { e.Details = map[string]any{"k": "w"} }},
		{"optional field set", func(e *Event) { e.ApprovalID = "apr_x" }},
		{"hash", func(e *Event) { e.Hash = strings.Repeat("2", 64) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ev := sealed
			tt.change(&ev)
			if err := CheckHash(ev); err == nil {
				t.Errorf("CheckHash passed after changing %s", tt.name)
			}
		})
	}
}

func TestHashIgnoresTimeZone(t *testing.T) {
	a := sample()
	b := sample()
	b.OccurredAt = t0.In(time.FixedZone("X", 3*3600))
	ha, err := ComputeHash(a)
	if err != nil {
		t.Fatal(err)
	}
	hb, err := ComputeHash(b)
	if err != nil {
		t.Fatal(err)
	}
	if ha != hb {
		t.Errorf("same instant in two zones hashes differently")
	}
}

func TestSealChainsAndRoundTrips(t *testing.T) {
	ev := sample()
	type detail struct {
		B int    `json:"b"`
		A string `json:"a"`
	}
	ev.Details = map[string]any{"errors": []detail{{B: 1, A: "x"}}, "big": int64(1) << 60}
	first, body1, err := Seal(Head{Seq: 0, Hash: GenesisHash}, ev)
	if err != nil {
		t.Fatal(err)
	}
	if first.Seq != 1 || first.PrevHash != GenesisHash {
		t.Errorf("first record: seq %d prev %s; want 1 and genesis", first.Seq, first.PrevHash)
	}
	second, body2, err := Seal(Head{Seq: first.Seq, Hash: first.Hash}, sample())
	if err != nil {
		t.Fatal(err)
	}
	if second.Seq != 2 || second.PrevHash != first.Hash {
		t.Errorf("second record: seq %d prev %.8s; want 2 and %.8s", second.Seq, second.PrevHash, first.Hash)
	}
	for _, c := range []struct {
		sealed Event
		body   []byte
	}{{first, body1}, {second, body2}} {
		got, err := DecodeEvent(c.body)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(c.sealed, got); diff != "" {
			t.Errorf("DecodeEvent(body) differs from the sealed event (-want +got):\n%s", diff)
		}
		if err := CheckHash(got); err != nil {
			t.Errorf("decoded event: %v", err)
		}
	}
	wantDetails := map[string]any{
		"errors": []any{map[string]any{"a": "x", "b": json.Number("1")}},
		"big":    json.Number("1152921504606846976"),
	}
	if diff := cmp.Diff(wantDetails, first.Details); diff != "" {
		t.Errorf("normalized details (-want +got):\n%s", diff)
	}
}

func TestDecodeEventErrors(t *testing.T) {
	tests := []struct {
		name string
		body string
	}{
		{"not JSON", `x`},
		{"unknown field", `{"event_id":"a","extra":1}`},
		{"trailing data", `{"event_id":"a"} {}`},
		{"wrong type", `{"seq":"one"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := DecodeEvent([]byte(tt.body)); err == nil {
				t.Errorf("DecodeEvent(%s) succeeded", tt.body)
			}
		})
	}
}

func TestUnencodableDetails(t *testing.T) {
	ev := sample()
	ev.Details = map[string]any{"f": func() {}}
	if _, err := CanonicalJSON(ev); err == nil {
		t.Error("CanonicalJSON with a func in details succeeded")
	}
	if _, _, err := Seal(Head{}, ev); err == nil {
		t.Error("Seal with a func in details succeeded")
	}
}

func TestNewEventID(t *testing.T) {
	a, b := NewEventID(), NewEventID()
	if a == b || len(a) != 36 || a[14] != '4' {
		t.Errorf("NewEventID = %q, %q; want two different v4 UUIDs", a, b)
	}
}

// referenceCanonical is the definition of CanonicalJSON: the event as a map
// (optional fields left out when zero), encoded by encoding/json with HTML
// escaping off, which sorts keys. The hand-written encoder must match it.
func referenceCanonical(ev Event) ([]byte, error) {
	ev, err := normalize(ev)
	if err != nil {
		return nil, err
	}
	m := map[string]any{
		"event_id": ev.EventID, "event_type": ev.EventType,
		"occurred_at":    ev.OccurredAt.UTC().Format(time.RFC3339Nano),
		"correlation_id": ev.CorrelationID, "causation_id": ev.CausationID,
		"agent_id": ev.AgentID, "agent_version": ev.AgentVersion, "principal": ev.Principal,
		"instance_id": ev.InstanceID, "environment": ev.Environment, "tool_id": ev.ToolID,
		"tool_name": ev.ToolName, "verdict": ev.Verdict, "code": ev.Code, "layer": ev.Layer,
		"reason": ev.Reason, "args_digest": ev.ArgsDigest, "seq": ev.Seq,
		"prev_hash": ev.PrevHash, "hash": ev.Hash,
	}
	opt := map[string]any{"approval_id": ev.ApprovalID, "deployment_mode": ev.DeploymentMode,
		"output_digest": ev.OutputDigest, "returned_bytes": ev.ReturnedBytes,
		"attempts": ev.Attempts, "duration_ms": ev.DurationMS}
	for k, v := range opt {
		if v != "" && v != int64(0) && v != 0 {
			m[k] = v
		}
	}
	if len(ev.Details) > 0 {
		m["details"] = ev.Details
	}
	var buf strings.Builder
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(m); err != nil {
		return nil, err
	}
	return []byte(strings.TrimSuffix(buf.String(), "\n")), nil
}

func FuzzCanonicalMatchesReference(f *testing.F) {
	f.Add("plain", "<&>", int64(3), int64(0), "\u2028\x00\"\\\xff", int64(1), "é😀")
	f.Add("", "", int64(0), int64(-5), "\t\b\f\r\n\x1f\x7f", int64(1<<62), "\u2029")
	f.Fuzz(func(t *testing.T, a, b string, n1, n2 int64, c string, seq int64, d string) {
		ev := Event{
			EventID: a, EventType: b, AgentID: c, Reason: d, Principal: a + c,
			ApprovalID: b, OutputDigest: c, ReturnedBytes: n1, DurationMS: n2, Attempts: int(n1 % 1000),
			Seq: seq, PrevHash: d, Hash: a, OccurredAt: time.Unix(0, n1).In(time.FixedZone("Z", int(n2%50000))),
			Details: map[string]any{"k": d, c: []any{a, n1}},
		}
		if n2%3 == 0 {
			ev.Details = nil
		}
		want, err := referenceCanonical(ev)
		if err != nil {
			t.Skip()
		}
		got, err := canonical(ev)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(want, got) {
			t.Errorf("canonical encoder differs from the reference:\nwant %s\ngot  %s", want, got)
		}
		// Seal's spliced body equals a full encoding with the hash in it.
		sealed, body, err := Seal(Head{Seq: seq, Hash: d}, ev)
		if err != nil {
			t.Fatal(err)
		}
		full, err := canonical(sealed)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(full, body) {
			t.Errorf("Seal body differs from the canonical encoding of the sealed event")
		}
		// The body reads back as the sealed event, and encodes the same.
		dec, err := DecodeEvent(body)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(sealed, dec); diff != "" {
			t.Errorf("DecodeEvent(body) (-want +got):\n%s", diff)
		}
		again, err := canonical(dec)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(again, body) {
			t.Errorf("re-encoding the decoded body changed it:\nwant %s\ngot  %s", body, again)
		}
		if err := CheckHash(dec); err != nil {
			t.Error(err)
		}
	})
}
