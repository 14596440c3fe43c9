package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	iofs "io/fs"
	"os"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/toolgate/toolgate/audit"
	"github.com/toolgate/toolgate/store/sqlite"
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

// verifyJSON is audit verify's JSON output: the report (ok, checked, head,
// last_good, problem), the database, and with --expect the head it was
// compared with and what differs.
type verifyJSON struct {
	Database string `json:"database"`
	audit.Report
	// Expected is the --expect head; nil without it.
	Expected *audit.Head `json:"expected,omitempty"`
	// ExpectedOK reports whether the log holds the expected head's record
	// (false when the chain itself fails).
	ExpectedOK *bool `json:"expected_ok,omitempty"`
	// ExpectedProblem says what differs from the expected head.
	ExpectedProblem string `json:"expected_problem,omitempty"`
}

func runAuditVerify(ctx context.Context, args []string, io IO) int {
	fs := newFlags("audit verify", io)
	data := dataFlag(fs)
	out := outputFlag(fs)
	expect := fs.String("expect", "", "SEQ:HASH: a head an earlier verify printed, kept outside the data folder; the log must still hold that record (detects a log cut back or re-sealed)")
	if code, ok := parse(fs, args); !ok {
		return code
	}
	if !checkOutput(*out, io.Stderr) {
		return ExitUsage
	}
	var anchor *audit.Head
	if *expect != "" {
		h, err := audit.ParseHead(*expect)
		if err != nil {
			fmt.Fprintf(io.Stderr, "toolgate audit verify: --expect: %v\n", err)
			return ExitUsage
		}
		anchor = &h
	}
	st, err := openReadOnly(*data)
	if err != nil {
		return fail(io.Stderr, "audit verify: %v", err)
	}
	defer st.Close()
	rep, err := audit.Verify(ctx, st)
	if err != nil {
		return fail(io.Stderr, "audit verify: %v", err)
	}
	res := verifyJSON{Database: st.Path(), Report: rep, Expected: anchor}
	if anchor != nil {
		aerr := audit.CheckAnchor(ctx, st, rep, *anchor)
		if aerr != nil && !errors.Is(aerr, audit.ErrAnchorMismatch) {
			return fail(io.Stderr, "audit verify: %v", aerr)
		}
		ok := aerr == nil
		res.ExpectedOK = &ok
		if aerr != nil {
			res.ExpectedProblem = aerr.Error()
		}
	}
	anchorFailed := res.ExpectedOK != nil && !*res.ExpectedOK
	if *out == "json" {
		writeJSON(io.Stdout, res)
	} else if rep.OK {
		fmt.Fprintf(io.Stdout, "audit log %s: OK, %d records verified\nhead: seq %d, hash %s\n", st.Path(), rep.Checked, rep.Head.Seq, rep.Head.Hash)
		switch {
		case anchor == nil:
			fmt.Fprintf(io.Stdout, "A log cut back or re-sealed by someone with the database and toolgate passes this check: keep the head outside the data folder and pass it to a later run as --expect %s\n", rep.Head)
		case anchorFailed:
			fmt.Fprintf(io.Stdout, "DOES NOT MATCH the head kept outside it (%s): %s\n", anchor, res.ExpectedProblem)
		default:
			fmt.Fprintf(io.Stdout, "matches the head kept outside it: seq %d, hash %s\n", anchor.Seq, anchor.Hash)
		}
	} else {
		p := rep.Problem
		fmt.Fprintf(io.Stdout, "audit log %s: TAMPERED at seq %d: the record was %s\n  %s\n", st.Path(), p.Seq, p.Kind, p.Detail)
		fmt.Fprintf(io.Stdout, "  %d records verified before it; last good record: seq %d, hash %s\n", rep.Checked, rep.LastGood.Seq, rep.LastGood.Hash)
		fmt.Fprintf(io.Stdout, "  the stored head: seq %d, hash %s\n", rep.Head.Seq, rep.Head.Hash)
	}
	switch {
	case !rep.OK:
		fmt.Fprintf(io.Stderr, "toolgate: audit verify: the audit log fails verification at seq %d (%s)\n", rep.Problem.Seq, rep.Problem.Kind)
		return ExitFailure
	case anchorFailed:
		fmt.Fprintf(io.Stderr, "toolgate: audit verify: the audit log does not match --expect %s: %s\n", anchor, res.ExpectedProblem)
		return ExitFailure
	}
	return ExitOK
}

// openReadOnly opens the data folder's database for reading only: the
// audit commands never create, migrate or write it, and a database whose
// audit log was removed is an error, not an empty log.
func openReadOnly(dir string) (*sqlite.Store, error) {
	if dir == "" {
		return nil, errors.New("--data DIR is empty; pass the data folder toolgate serve uses")
	}
	path := dbPath(dir)
	fi, err := os.Stat(path)
	switch {
	case errors.Is(err, iofs.ErrNotExist):
		return nil, fmt.Errorf("no toolgate database at %s: pass --data with the data folder toolgate serve uses (it holds %s)", path, dbFile)
	case err != nil:
		return nil, fmt.Errorf("data folder %s: %w", dir, err)
	case fi.IsDir():
		return nil, fmt.Errorf("%s is a folder, not a toolgate database", path)
	}
	return sqlite.Open(path, &sqlite.Options{ReadOnly: true})
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
	st, err := openReadOnly(*data)
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
