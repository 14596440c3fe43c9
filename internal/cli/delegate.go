package cli

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/toolgate/toolgate/audit"
	"github.com/toolgate/toolgate/identity"
	"github.com/toolgate/toolgate/policy"
)

func init() {
	gatewayCommands = append(gatewayCommands, command{"delegate",
		"mint a delegation token: hand a narrower set of a principal's grants to another subject", runDelegate})
}

// runDelegate is toolgate delegate: an operator with the data folder (and
// so the gateway's signing key) mints a delegation token for --from,
// handing each --grant to --to. A grant --from does not hold is refused
// (exit 3), naming it. The identity.delegation.minted event is written
// durably to the data folder's audit log (created if the folder has none
// yet) before the token is printed; if it cannot be, no token is printed
// (exit 1). The token goes to stdout alone (text) or with what it carries
// (-o json); a summary goes to stderr.
func runDelegate(ctx context.Context, args []string, io IO) int {
	fs := newFlags("delegate", io)
	bundle := bundleFlag(fs)
	data := dataFlag(fs)
	from := fs.String("from", "", "the delegator: a declared principal whose grants are handed (required)")
	to := fs.String("to", "", "the delegate: the subject the token is for, e.g. svc:nightly-report (required)")
	agent := fs.String("agent", "", "the agent the delegate calls through (required, declared)")
	instance := fs.String("instance", "", "business instance the token is bound to")
	env := fs.String("env", "", "environment the token is bound to")
	mode := fs.String("mode", "", "deployment mode the token is bound to (default the bundle's)")
	ttl := fs.Duration("ttl", 0, "lifetime, e.g. 1h (default Settings.delegations.default_ttl, 1h; at most max_ttl, 24h)")
	var grants stringList
	fs.Var(&grants, "grant", "a grant to hand, resource:action:scope (repeatable): tool:invoke:all, tool:invoke:NAME, bifrost_query:read:vala.datasets")
	out := outputFlag(fs)
	if code, ok := parse(fs, args); !ok {
		return code
	}
	if !checkOutput(*out, io.Stderr) {
		return ExitUsage
	}
	if *from == "" || *to == "" || *agent == "" || len(grants) == 0 {
		fmt.Fprintln(io.Stderr, "toolgate delegate: --from, --to, --agent and at least one --grant are required (run toolgate delegate -h)")
		return ExitUsage
	}
	var pgs []policy.Grant
	for _, s := range grants {
		g, err := identity.ParseGrant(s)
		if err != nil {
			fmt.Fprintf(io.Stderr, "toolgate delegate: %v\n", err)
			return ExitUsage
		}
		pgs = append(pgs, g)
	}
	snap, ok := loadSnapshot(*bundle, io.Stderr)
	if !ok {
		return ExitFailure
	}
	auth, err := identity.New(snap.Bundle(), identity.NewKeyring(*data), nil)
	if err != nil {
		return fail(io.Stderr, "%v", err)
	}
	m, err := auth.Mint(identity.MintRequest{Delegator: *from, Delegate: *to, AgentID: *agent, InstanceID: *instance,
		Environment: *env, DeploymentMode: *mode, Grants: pgs, TTL: *ttl})
	switch {
	case errors.Is(err, identity.ErrNotHeld):
		fmt.Fprintf(io.Stderr, "toolgate delegate: refused: %v\n", err)
		return ExitDenied
	case err != nil:
		return fail(io.Stderr, "%v", err)
	}
	if err := recordMinted(ctx, *data, m); err != nil {
		return fail(io.Stderr, "delegation %s was not recorded, so its token is withheld: %v", m.ID, err)
	}
	if *out == "json" {
		writeJSON(io.Stdout, m)
	} else {
		fmt.Fprintln(io.Stdout, m.Token)
	}
	fmt.Fprintf(io.Stderr, "delegation %s: %s hands %d grants to %s through agent %s until %s\n",
		m.ID, m.Delegator, len(m.Grants), m.Delegate, m.AgentID, m.ExpiresAt.Format(time.RFC3339))
	return ExitOK
}

// recordMinted writes m's audit event (never its token) durably to the
// audit log of data folder dir.
func recordMinted(ctx context.Context, dir string, m identity.Minted) error {
	st, err := openStore(dir, true)
	if err != nil {
		return err
	}
	defer st.Close()
	rec := audit.NewRecorder(st, nil)
	_, err = rec.Record(ctx, m.Event("cli"))
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if cerr := rec.Close(cctx); err == nil {
		err = cerr
	}
	return err
}
