package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/toolgate/toolgate/audit"
)

// tailPoll is how often audit tail -f looks for new events.
const tailPoll = 250 * time.Millisecond

// subcommand dispatches "toolgate NAME SUB ..." to subs, printing usage
// for a missing or unknown SUB.
func subcommand(ctx context.Context, name string, args []string, io IO, subs []command) int {
	if len(args) == 0 {
		subUsage(io.Stderr, name, subs)
		return ExitUsage
	}
	if args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		subUsage(io.Stdout, name, subs)
		return ExitOK
	}
	for _, s := range subs {
		if s.name == args[0] {
			return s.run(ctx, args[1:], io)
		}
	}
	fmt.Fprintf(io.Stderr, "toolgate %s: unknown subcommand %q\n", name, args[0])
	subUsage(io.Stderr, name, subs)
	return ExitUsage
}

func subUsage(w io.Writer, name string, subs []command) {
	fmt.Fprintf(w, "Usage: toolgate %s SUBCOMMAND [flags]\n\nSubcommands:\n", name)
	for _, s := range subs {
		fmt.Fprintf(w, "  %-8s %s\n", s.name, s.summary)
	}
	fmt.Fprintf(w, "\nRun toolgate %s SUBCOMMAND -h for its flags.\n", name)
}

func runAudit(ctx context.Context, args []string, io IO) int {
	return subcommand(ctx, "audit", args, io, []command{
		{"verify", "check the hash chain: exit 0 intact, 1 naming the first edited, removed or reordered record", runAuditVerify},
		{"tail", "print the last events (-n N), and follow new ones with -f", runAuditTail},
	})
}

// verifyJSON is audit verify's JSON output: the report and the database.
type verifyJSON struct {
	Database string `json:"database"`
	audit.Report
}

func runAuditVerify(ctx context.Context, args []string, io IO) int {
	fs := newFlags("audit verify", io)
	data := dataFlag(fs)
	out := outputFlag(fs)
	if code, ok := parse(fs, args); !ok {
		return code
	}
	if !checkOutput(*out, io.Stderr) {
		return ExitUsage
	}
	st, err := openStore(*data, false)
	if err != nil {
		return fail(io.Stderr, "audit verify: %v", err)
	}
	defer st.Close()
	rep, err := audit.Verify(ctx, st)
	if err != nil {
		return fail(io.Stderr, "audit verify: %v", err)
	}
	if *out == "json" {
		writeJSON(io.Stdout, verifyJSON{Database: st.Path(), Report: rep})
	} else if rep.OK {
		fmt.Fprintf(io.Stdout, "audit log %s: OK, %d records verified\nhead: seq %d, hash %s\n", st.Path(), rep.Checked, rep.Head.Seq, rep.Head.Hash)
	} else {
		p := rep.Problem
		fmt.Fprintf(io.Stdout, "audit log %s: TAMPERED at seq %d: the record was %s\n  %s\n", st.Path(), p.Seq, p.Kind, p.Detail)
		fmt.Fprintf(io.Stdout, "  %d records verified before it; last good record: seq %d, hash %s\n", rep.Checked, rep.LastGood.Seq, rep.LastGood.Hash)
	}
	if !rep.OK {
		fmt.Fprintf(io.Stderr, "toolgate: audit verify: the audit log fails verification at seq %d (%s)\n", rep.Problem.Seq, rep.Problem.Kind)
		return ExitFailure
	}
	return ExitOK
}

func runAuditTail(ctx context.Context, args []string, io IO) int {
	fs := newFlags("audit tail", io)
	data := dataFlag(fs)
	out := outputFlag(fs)
	n := fs.Int("n", 20, "how many of the last events to print")
	follow := fs.Bool("f", false, "keep printing new events as they are written, until interrupted")
	if code, ok := parse(fs, args); !ok {
		return code
	}
	if !checkOutput(*out, io.Stderr) {
		return ExitUsage
	}
	if *n < 0 {
		fmt.Fprintf(io.Stderr, "toolgate audit tail: -n %d: want 0 or more\n", *n)
		return ExitUsage
	}
	st, err := openStore(*data, false)
	if err != nil {
		return fail(io.Stderr, "audit tail: %v", err)
	}
	defer st.Close()
	head, err := st.AuditHead(ctx)
	if err != nil {
		return fail(io.Stderr, "audit tail: %v", err)
	}
	p := &eventPrinter{w: io.Stdout, json: *out == "json"}
	next := max(1, head.Seq-int64(*n)+1)
	if *n == 0 {
		next = head.Seq + 1
	}
	// The first read stops at the head; -f reads on from there.
	for next <= head.Seq {
		evs, err := readEvents(ctx, st, next, int(min(head.Seq-next+1, 1000)))
		if err != nil {
			return fail(io.Stderr, "audit tail: %v", err)
		}
		if len(evs) == 0 {
			break
		}
		p.print(evs)
		next = evs[len(evs)-1].Seq + 1
	}
	if !*follow {
		if p.rows == 0 && !p.json {
			fmt.Fprintf(io.Stdout, "audit log %s has no events\n", st.Path())
		}
		return ExitOK
	}
	p.header() // a header even before the first event
	tick := time.NewTicker(tailPoll)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return ExitOK
		case <-tick.C:
		}
		for {
			evs, err := readEvents(ctx, st, next, 1000)
			if err != nil {
				if ctx.Err() != nil {
					return ExitOK
				}
				return fail(io.Stderr, "audit tail: %v", err)
			}
			if len(evs) == 0 {
				break
			}
			p.print(evs)
			next = evs[len(evs)-1].Seq + 1
		}
	}
}

// readEvents reads and decodes; a record that does not decode is named.
func readEvents(ctx context.Context, st audit.Store, from int64, limit int) ([]audit.Event, error) {
	evs, err := audit.ReadEvents(ctx, st, from, limit)
	if err != nil {
		return nil, fmt.Errorf("%w (run toolgate audit verify)", err)
	}
	return evs, nil
}

// eventPrinter prints events as a table with fixed-width columns (so rows
// printed later by -f line up) or as JSON lines.
type eventPrinter struct {
	w      io.Writer
	json   bool
	headed bool
	rows   int
}

const tailFormat = "%-6s  %-24s  %-30s  %-16s  %-20s  %-26s  %-18s  %s\n"

func (p *eventPrinter) header() {
	if p.json || p.headed {
		return
	}
	p.headed = true
	fmt.Fprintf(p.w, tailFormat, "SEQ", "TIME", "TYPE", "VERDICT", "CODE", "TOOL", "PRINCIPAL", "REASON")
}

func (p *eventPrinter) print(evs []audit.Event) {
	if p.json {
		enc := json.NewEncoder(p.w)
		enc.SetEscapeHTML(false)
		for i := range evs {
			_ = enc.Encode(&evs[i])
		}
		p.rows += len(evs)
		return
	}
	p.header()
	for _, ev := range evs {
		tool := ev.ToolID
		if tool == "" {
			tool = ev.ToolName
		}
		fmt.Fprintf(p.w, tailFormat, fmt.Sprint(ev.Seq), ev.OccurredAt.UTC().Format("2006-01-02T15:04:05.000Z"), safe(ev.EventType),
			dash(safe(ev.Verdict)), dash(safe(ev.Code)), dash(safe(tool)), dash(safe(ev.Principal)), oneLine(safe(ev.Reason)))
		p.rows++
	}
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// safe escapes control characters (CR, LF, ESC, NUL...) so a tool name or
// reason chosen by a caller cannot forge rows or drive the terminal.
func safe(s string) string {
	for _, r := range s {
		if unicode.IsControl(r) || r == '\u2028' || r == '\u2029' {
			q := strconv.Quote(s)
			return q[1 : len(q)-1]
		}
	}
	return s
}

func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}
