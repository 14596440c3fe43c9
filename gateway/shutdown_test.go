package gateway_test

import (
	"fmt"
	"net/http"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/toolgate/toolgate/audit"
	"github.com/toolgate/toolgate/gateway"
	"github.com/toolgate/toolgate/storetest"
)

// detail reads an integer detail (-1 when it is not one).
func detail(ev audit.Event, key string) int64 {
	n, err := strconv.ParseInt(fmt.Sprint(ev.Details[key]), 10, 64)
	if err != nil {
		return -1
	}
	return n
}

// ofType returns the events of type typ.
func ofType(evs []audit.Event, typ string) []audit.Event {
	var out []audit.Event
	for _, ev := range evs {
		if ev.EventType == typ {
			out = append(out, ev)
		}
	}
	return out
}

// TestStopsAreRecorded is finding N7 of the review of issue 7: nothing in
// the chain told a clean stop from a crash. A SIGTERM now ends the run with
// gateway.stopped (the run's last event, naming its start), and the start
// after a SIGKILL writes gateway.unclean_stop, naming the previous start
// and the last record of that run.
func TestStopsAreRecorded(t *testing.T) {
	e := newCrashEnv(t)
	p := e.start(t)
	cs := connect(t, p.url+"/mcp", crashKey)
	listNames(t, cs, 2)
	if res, err := call(t, cs, "rec_echo", map[string]any{"message": "run 1"}); err != nil || res.IsError {
		t.Fatalf("call: %v %v", err, res)
	}
	cs.Close()
	p.term(t)
	evs := readLog(t, e.data)
	starts := ofType(evs, "gateway.started")
	last := evs[len(evs)-1]
	if last.EventType != "gateway.stopped" || len(starts) != 1 || detail(last, "started_seq") != starts[0].Seq {
		t.Fatalf("the log after a SIGTERM ends with %s %v; want gateway.stopped naming the start (seq %d)", last.EventType, last.Details, starts[0].Seq)
	}

	p = e.start(t)
	evs = readLog(t, e.data)
	starts = ofType(evs, "gateway.started")
	if len(starts) != 2 || starts[1].Details["previous_stop"] != "clean" || len(ofType(evs, "gateway.unclean_stop")) != 0 {
		t.Fatalf("the start after a clean stop: %v, %d unclean stops; want previous_stop clean and none", starts[len(starts)-1].Details, len(ofType(evs, "gateway.unclean_stop")))
	}
	cs = connect(t, p.url+"/mcp", crashKey)
	listNames(t, cs, 2)
	if res, err := call(t, cs, "rec_echo", map[string]any{"message": "run 2"}); err != nil || res.IsError {
		t.Fatalf("call: %v %v", err, res)
	}
	p.kill(t)
	cs.Close()

	p = e.start(t)
	evs = readLog(t, e.data)
	unclean := ofType(evs, "gateway.unclean_stop")
	if len(unclean) != 1 {
		t.Fatalf("%d gateway.unclean_stop events after a SIGKILL; want 1", len(unclean))
	}
	u := unclean[0]
	unknown := 0
	for _, ev := range evs {
		if ev.EventType == "agent.tool.outcome_unknown" && ev.Seq > u.Seq {
			unknown++
		}
	}
	if detail(u, "previous_started_seq") != starts[1].Seq || detail(u, "last_seq") != u.Seq-1 || detail(u, "outcome_unknown") != int64(unknown) ||
		!strings.Contains(u.Reason, "without a clean shutdown") {
		t.Errorf("unclean stop %+v; want the previous start seq %d, the last seq %d, %d outcome_unknown", u, starts[1].Seq, u.Seq-1, unknown)
	}
	if !strings.Contains(p.stderr.String(), "stopped without a clean shutdown") {
		t.Errorf("the start's log does not report the unclean stop:\n%s", p.stderr)
	}
}

var lostRe = regexp.MustCompile(`events lost.* lost=(\d+)`)

// TestShutdownOnFullDiskRecordsLoss is finding N7 with a full disk: the
// store could not write at SIGTERM and the spill failed ("no space left on
// device"), and after space was freed the next start wrote "0 events
// replayed" with nothing recording the loss. Now the shutdown leaves a
// marker holding the count (an empty file, which a full disk still takes)
// that the next start records as audit.events_lost; when even that fails
// (no inode left), the start's gateway.unclean_stop is the trace.
func TestShutdownOnFullDiskRecordsLoss(t *testing.T) {
	for _, tt := range []struct {
		name     string
		noInodes bool
	}{
		{name: "marker left"},
		{name: "no inode for the marker", noInodes: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			fs := storetest.MountTmpfsInodes(t, 32<<20, 4096)
			e := newCrashEnv(t)
			e.data = filepath.Join(fs.Dir, "data")
			p := e.start(t)
			cs := connect(t, p.url+"/mcp", crashKey)
			listNames(t, cs, 2)
			if res, err := call(t, cs, "rec_echo", map[string]any{"message": "before"}); err != nil || res.IsError {
				t.Fatalf("call before the disk filled: %v %v", err, res)
			}
			free := fs.Fill(t)
			freeInodes := func() {}
			if tt.noInodes {
				freeInodes = fs.FillInodes(t)
			}
			for i := range 20 {
				if res, err := call(t, cs, "rec_echo", map[string]any{"message": fmt.Sprintf("deny-%d", i)}); err != nil || structured(t, res)["code"] != "condition_failed" {
					t.Fatalf("denied call %d on a full disk: %v %v", i, err, res)
				}
			}
			cs.Close()
			p.term(t)
			m := lostRe.FindStringSubmatch(p.stderr.String())
			if m == nil {
				t.Fatalf("the shutdown log does not say how many events were lost:\n%s", p.stderr)
			}
			lost, _ := strconv.Atoi(m[1])
			if lost < 20 {
				t.Errorf("lost=%d; want at least the 20 denials", lost)
			}
			markers, err := audit.ReadLostMarkers(filepath.Join(e.data, gateway.LostMarker))
			if err != nil {
				t.Fatal(err)
			}
			if tt.noInodes {
				if len(markers) != 0 || !strings.Contains(p.stderr.String(), "no marker could be left") {
					t.Fatalf("markers %v; want none, and the log saying so:\n%s", markers, p.stderr)
				}
			} else if len(markers) != 1 || markers[0].Count != lost {
				t.Fatalf("markers %+v; want one of %d events", markers, lost)
			}
			freeInodes()
			free()

			p = e.start(t)
			evs := readLog(t, e.data)
			unclean, lostEvs := ofType(evs, "gateway.unclean_stop"), ofType(evs, "audit.events_lost")
			if len(unclean) != 1 {
				t.Fatalf("%d gateway.unclean_stop events; want 1", len(unclean))
			}
			if tt.noInodes {
				if len(lostEvs) != 0 || detail(unclean[0], "events_lost") != 0 {
					t.Errorf("events_lost %v, unclean stop %v; want none known", lostEvs, unclean[0].Details)
				}
			} else {
				if len(lostEvs) != 1 || detail(lostEvs[0], "count") != int64(lost) || detail(unclean[0], "events_lost") != int64(lost) {
					t.Errorf("events_lost %v, unclean stop %v; want one of %d", lostEvs, unclean[0].Details, lost)
				}
				if !strings.Contains(p.stderr.String(), "events were lost at a previous shutdown") {
					t.Errorf("the start's log does not report the loss:\n%s", p.stderr)
				}
			}
			if left, _ := audit.ReadLostMarkers(filepath.Join(e.data, gateway.LostMarker)); len(left) != 0 {
				t.Errorf("markers left after the start: %v", left)
			}
		})
	}
}

func probeReady(t *testing.T, base string) int {
	t.Helper()
	resp, err := http.Get(base + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestAuditOutageLoggedOnce is finding N8: no log line said when the audit
// store began to fail or recovered, while every /readyz probe logged an
// ERROR. Now the outage is one ERROR line when it begins and one WARN line
// when it ends, and /readyz's 503s are not logged (debug only).
func TestAuditOutageLoggedOnce(t *testing.T) {
	fs := storetest.MountTmpfs(t, 32<<20)
	e := newCrashEnv(t)
	e.data = filepath.Join(fs.Dir, "data")
	p := e.start(t)
	cs := connect(t, p.url+"/mcp", crashKey)
	listNames(t, cs, 2)
	free := fs.Fill(t)
	if res, err := call(t, cs, "rec_echo", map[string]any{"message": "deny-while-full"}); err != nil || structured(t, res)["code"] != "condition_failed" {
		t.Fatalf("denied call on a full disk: %v %v", err, res)
	}
	storetest.WaitFor(t, 30*time.Second, "/readyz to turn 503", func() bool { return probeReady(t, p.url) == 503 })
	for i := range 10 {
		if code := probeReady(t, p.url); code != 503 {
			t.Fatalf("probe %d: /readyz %d while the disk is full; want 503", i, code)
		}
	}
	free()
	storetest.WaitFor(t, 60*time.Second, "/readyz to be 200 again", func() bool { return probeReady(t, p.url) == 200 })
	cs.Close()
	p.term(t)
	var failing, recovered, readyErrors []string
	for _, line := range strings.Split(p.stderr.String(), "\n") {
		switch {
		case strings.Contains(line, "the audit store cannot write"):
			failing = append(failing, line)
		case strings.Contains(line, "the audit store writes again"):
			recovered = append(recovered, line)
		case strings.Contains(line, "readyz") || strings.Contains(line, "not_ready"):
			readyErrors = append(readyErrors, line)
		}
	}
	if len(failing) != 1 || !strings.Contains(failing[0], "level=ERROR") || !strings.Contains(failing[0], "disk is full") {
		t.Errorf("lines on the failure: %q; want one ERROR with the store's error", failing)
	}
	if len(recovered) != 1 || !strings.Contains(recovered[0], "level=WARN") || !strings.Contains(recovered[0], "for=") {
		t.Errorf("lines on the recovery: %q; want one WARN with how long it failed", recovered)
	}
	if len(readyErrors) != 0 {
		t.Errorf("the /readyz probes were logged: %q", readyErrors)
	}
}
