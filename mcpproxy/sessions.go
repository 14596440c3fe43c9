package mcpproxy

// Session caps. A session costs the gateway memory and goroutines for as
// long as it lives (up to SessionTimeout idle), so the sessions of one
// authority, and those of all clients together, are bounded:
//
//   - one authority — the principal and agent a credential's identity
//     resolves to, whatever credential carries it: each API key bound to
//     them, each delegation token the principal mints for that agent, each
//     JWT — holds at most MaxSessionsPerAuthority sessions. A credential
//     is something a caller can mint freely (toolgate delegate, a token
//     endpoint), so a cap per credential would be no cap. Every anonymous
//     client counts as one authority (they share one identity: README,
//     Anonymous mode). An initialize past the cap closes the authority's
//     session that has been idle longest (no request in progress, no
//     stream open; one of the same credential first), so a client that
//     forgets its sessions keeps working; when none of its sessions is
//     idle, the initialize is refused with HTTP 429 and a JSON-RPC error
//     naming the cap, the count and what to do. Another authority's
//     sessions are never touched;
//   - all clients together hold at most MaxSessions; an initialize past
//     that is refused with HTTP 503 (Retry-After), and no session of
//     another client is closed to make room.
//
// Each refusal is logged, counted (toolgate_requests_refused_total with
// reason session_cap_authority or session_cap_total) and audited
// (gateway.request.refused, with the principal and agent), summarized per
// window like every refusal at the edge (refusals.go). An initialize counts
// from the moment the guard admits it, so concurrent ones cannot slip past
// a cap together.

import (
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"

	"github.com/toolgate/toolgate/gate"
)

// Defaults of Options.MaxSessionsPerAuthority and Options.MaxSessions.
const (
	// DefaultMaxSessionsPerAuthority is how many sessions one principal
	// and agent (all their credentials together) hold at a time.
	DefaultMaxSessionsPerAuthority = 64
	// DefaultMaxSessions is how many sessions all clients together hold.
	DefaultMaxSessions = 4096
)

// Reasons of the session caps' refusals (toolgate_requests_refused_total,
// gateway.request.refused).
const (
	reasonSessionCapAuthority = "session_cap_authority"
	reasonSessionCapTotal     = "session_cap_total"
)

func (p *Proxy) sessionCaps() (perAuthority, total int) {
	perAuthority, total = p.opts.MaxSessionsPerAuthority, p.opts.MaxSessions
	if perAuthority <= 0 {
		perAuthority = DefaultMaxSessionsPerAuthority
	}
	if total <= 0 {
		total = DefaultMaxSessions
	}
	return perAuthority, total
}

// authorityKey is the key the caps count a client under: the principal and
// agent of its identity, quoted (so that no two pairs share a key), or
// anonymousUserID for every anonymous client.
func authorityKey(id gate.Identity) string {
	if id.Anonymous {
		return anonymousUserID
	}
	return "authority:" + strconv.Quote(id.Principal) + " " + strconv.Quote(id.AgentID)
}

// authorityOf names an identity's authority in a refusal.
func authorityOf(id gate.Identity) string {
	if id.Anonymous {
		return "the anonymous clients (all of them share one budget)"
	}
	return fmt.Sprintf("principal %s with agent %s (all its credentials together: API keys, delegation tokens, JWTs)", id.Principal, id.AgentID)
}

// admitSession admits an initialize of request r, sent with credential
// cred (credentialKey) by identity id, under the caps, closing the longest
// idle session of id's authority when it is at its cap; or it answers,
// records and counts the refusal and returns false. Call release when the
// initialize is done (the session is then counted as a session).
func (p *Proxy) admitSession(w *statusWriter, r *http.Request, cred string, id gate.Identity) (release func(), ok bool) {
	perAuthority, total := p.sessionCaps()
	auth := authorityKey(id)
	f := p.fast
	f.mu.Lock()
	mine, all := f.admitting[auth], f.admittingTotal
	var oldest *clientSession
	for _, cs := range f.sessions {
		if cs.closing {
			continue
		}
		all++
		if cs.authority != auth {
			continue
		}
		mine++
		if cs.active.Load() != 0 {
			continue
		}
		// The credential's own idle sessions go first, then the
		// authority's others; the longest idle of them.
		switch own, oldOwn := cs.cred == cred, oldest != nil && oldest.cred == cred; {
		case oldest == nil, own && !oldOwn:
			oldest = cs
		case own == oldOwn && cs.seen.Load() < oldest.seen.Load():
			oldest = cs
		}
	}
	refuse := func(status int, reason string, code int64, msg string) (func(), bool) {
		f.mu.Unlock()
		w.recorded = true
		p.refused.sessionCapRefused(r, status, reason, id)
		writeRPCError(w, status, code, msg)
		return nil, false
	}
	switch {
	case all >= total:
		w.Header().Set("Retry-After", "60")
		return refuse(http.StatusServiceUnavailable, reasonSessionCapTotal, jsonrpc.CodeInternalError,
			fmt.Sprintf("toolgate: session cap of the gateway: all clients together hold its maximum of %d sessions (%d open); close sessions you no longer use (HTTP DELETE with their Mcp-Session-Id) or try again later", total, all))
	case mine >= perAuthority && oldest == nil:
		return refuse(http.StatusTooManyRequests, reasonSessionCapAuthority, jsonrpc.CodeInvalidRequest,
			fmt.Sprintf("toolgate: session cap per authority: %s holds its maximum of %d sessions (%d open) and none of them is idle; close sessions you no longer use (HTTP DELETE with their Mcp-Session-Id), or ask the operator to raise the cap", authorityOf(id), perAuthority, mine))
	case mine >= perAuthority:
		oldest.closing = true // counted no more, closed below
	}
	f.admitting[auth]++
	f.admittingTotal++
	f.mu.Unlock()
	if oldest != nil && mine >= perAuthority {
		p.log.Info("session closed: its authority opened one more than its maximum, and this one was idle longest",
			"principal", id.Principal, "agent_id", id.AgentID, "max", perAuthority, "same_credential", oldest.cred == cred,
			"idle", time.Since(time.Unix(0, oldest.seen.Load())).Round(time.Second))
		go oldest.ss.Close()
	}
	return func() {
		f.mu.Lock()
		if f.admitting[auth]--; f.admitting[auth] <= 0 {
			delete(f.admitting, auth)
		}
		f.admittingTotal--
		f.mu.Unlock()
	}, true
}

// Sessions returns how many client sessions the gateway holds, in total
// and for each authority key (the principal and agent, quoted, or
// "anonymous"; for tests and diagnostics).
func (p *Proxy) Sessions() (total int, byAuthority map[string]int) {
	f := p.fast
	f.mu.Lock()
	defer f.mu.Unlock()
	byAuthority = map[string]int{}
	for _, cs := range f.sessions {
		if !cs.closing {
			total++
			byAuthority[cs.authority]++
		}
	}
	return total, byAuthority
}
