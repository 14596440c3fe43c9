package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/toolgate/toolgate/approval"
	"github.com/toolgate/toolgate/audit"
	"github.com/toolgate/toolgate/gate"
)

// storeCommands are the subcommands that read and change the data folder.
func storeCommands() []command {
	return []command{
		{"audit", "verify the audit log's hash chain, or print its last events", runAudit},
		{"approvals", "list pending approvals; approve or deny one as a principal", runApprovals},
	}
}

func runApprovals(ctx context.Context, args []string, io IO) int {
	return subcommand(ctx, "approvals", args, io, []command{
		{"list", "list pending approvals (--status all for every one)", runApprovalsList},
		{"approve", "approve ID --as PRINCIPAL [--reason R]: the call it binds may run once", runApprovalsDecide(true)},
		{"deny", "deny ID --as PRINCIPAL [--reason R]", runApprovalsDecide(false)},
	})
}

// parseStatuses reads --status: all, or a comma-separated list of statuses.
func parseStatuses(s string) ([]approval.Status, error) {
	if s == "all" {
		return nil, nil
	}
	var out []approval.Status
	for _, p := range strings.Split(s, ",") {
		st := approval.Status(strings.TrimSpace(p))
		if !st.Valid() {
			return nil, fmt.Errorf("--status %q: want all, or one or more (comma-separated) of pending, approved, denied, expired, used", s)
		}
		out = append(out, st)
	}
	return out, nil
}

func runApprovalsList(ctx context.Context, args []string, io IO) int {
	fs := newFlags("approvals list", io)
	data := dataFlag(fs)
	out := outputFlag(fs)
	status := fs.String("status", "pending", "which approvals: all, or statuses separated by commas (pending, approved, denied, expired, used)")
	if code, ok := parse(fs, args); !ok {
		return code
	}
	if !checkOutput(*out, io.Stderr) {
		return ExitUsage
	}
	statuses, err := parseStatuses(*status)
	if err != nil {
		fmt.Fprintf(io.Stderr, "toolgate approvals list: %v\n", err)
		return ExitUsage
	}
	st, err := openStore(*data, false)
	if err != nil {
		return fail(io.Stderr, "approvals list: %v", err)
	}
	defer st.Close()
	as, err := st.ListApprovals(ctx, approval.Filter{Status: statuses})
	if err != nil {
		return fail(io.Stderr, "approvals list: %v", err)
	}
	if *out == "json" {
		if as == nil {
			as = []approval.Approval{}
		}
		writeJSON(io.Stdout, as)
		return ExitOK
	}
	if len(as) == 0 {
		fmt.Fprintf(io.Stdout, "no approvals with status %s\n", *status)
		return ExitOK
	}
	printApprovals(io.Stdout, as)
	return ExitOK
}

func printApprovals(w io.Writer, as []approval.Approval) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSTATUS\tTOOL\tAGENT\tPRINCIPAL\tINSTANCE/ENV\tCREATED\tEXPIRES\tDECIDED BY\tARGS")
	for _, a := range as {
		where := dash(strings.Trim(a.Binding.InstanceID+"/"+a.Binding.Environment, "/"))
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", a.ID, a.Status, a.Binding.ToolID, a.Binding.AgentID,
			a.Binding.Principal, where, a.CreatedAt.Format(time.RFC3339), a.ExpiresAt.Format(time.RFC3339),
			dash(a.DecidedBy), clip(string(a.Args), 60))
	}
	tw.Flush()
}

// clip shortens s to at most n runes, marking the cut with "…".
func clip(s string, n int) string {
	if s == "" {
		return "-"
	}
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}

func runApprovalsDecide(approve bool) func(ctx context.Context, args []string, io IO) int {
	verb, name := "approve", "approvals approve"
	if !approve {
		verb, name = "deny", "approvals deny"
	}
	return func(ctx context.Context, args []string, io IO) int {
		fs := newFlags(name, io)
		data := dataFlag(fs)
		bundle := bundleFlag(fs)
		out := outputFlag(fs)
		as := fs.String("as", "", "the principal who "+verb+"s (required; not the one whose call asked)")
		reason := fs.String("reason", "", "why, for the audit log")
		pos, code, ok := parseInterleaved(fs, args)
		if !ok {
			return code
		}
		if !checkOutput(*out, io.Stderr) {
			return ExitUsage
		}
		if len(pos) != 1 {
			fmt.Fprintf(io.Stderr, "toolgate %s: want exactly one approval ID (see toolgate approvals list)\n", name)
			return ExitUsage
		}
		if *as == "" {
			fmt.Fprintf(io.Stderr, "toolgate %s: --as PRINCIPAL is required: the principal who %ss\n", name, verb)
			return ExitUsage
		}
		if *bundle == "" {
			fmt.Fprintf(io.Stderr, "toolgate %s: --bundle DIR is required: the approver's approval:decide grant is checked against it\n", name)
			return ExitUsage
		}
		snap, ok := loadSnapshot(*bundle, io.Stderr)
		if !ok {
			return ExitFailure
		}
		st, err := openStore(*data, false)
		if err != nil {
			return fail(io.Stderr, "%s: %v", name, err)
		}
		defer st.Close()
		rec := audit.NewRecorder(st, nil)
		defer func() {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			defer cancel()
			rec.Close(cctx)
		}()
		g := gate.New(snap, &gate.Options{Recorder: rec, Approvals: st})
		a, derr := g.DecideApproval(ctx, pos[0], approve, *as, *reason, "cli")
		if derr != nil {
			switch {
			case errors.Is(derr, gate.ErrSelfApproval), errors.Is(derr, gate.ErrNotApprover):
				return fail(io.Stderr, "%s: %v", name, derr)
			case errors.Is(derr, approval.ErrNotFound):
				return fail(io.Stderr, "%s: no approval %s (see toolgate approvals list)", name, pos[0])
			case errors.Is(derr, approval.ErrExpired):
				return fail(io.Stderr, "%s: approval %s expired at %s; the call must be made again to ask anew", name, pos[0], a.ExpiresAt.Format(time.RFC3339))
			case errors.Is(derr, approval.ErrNotPending):
				return fail(io.Stderr, "%s: approval %s is already %s (by %s)", name, pos[0], a.Status, dash(a.DecidedBy))
			}
			return fail(io.Stderr, "%s: %v", name, derr)
		}
		if *out == "json" {
			writeJSON(io.Stdout, a)
			return ExitOK
		}
		past := "approved"
		if !approve {
			past = "denied"
		}
		fmt.Fprintf(io.Stdout, "%s %s: %s for agent %s as %s, arguments %s\n", past, a.ID, a.Binding.ToolID, a.Binding.AgentID,
			a.Binding.Principal, clip(string(a.Args), 200))
		if approve {
			fmt.Fprintf(io.Stdout, "the same call may now run once, until %s\n", a.ExpiresAt.Format(time.RFC3339))
		}
		return ExitOK
	}
}

// recordNow writes one event durably to the audit log.
