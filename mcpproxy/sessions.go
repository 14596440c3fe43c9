package mcpproxy

// Session caps. A session costs the gateway memory and goroutines for as
// long as it lives (up to SessionTimeout idle), so the sessions one
// credential holds, and those of all clients together, are bounded:
//
//   - one credential (an API key, a token; every anonymous client counts
//     as one credential) holds at most MaxSessionsPerCredential sessions.
//     An initialize past that closes the credential's own session that has
//     been idle longest (no request in progress, no stream open), so a
//     client that forgets its sessions keeps working; when none of its
//     sessions is idle, the initialize is refused with HTTP 429 and a
//     JSON-RPC error saying so. Another credential's sessions are never
//     touched;
//   - all clients together hold at most MaxSessions; an initialize past
//     that is refused with HTTP 503 (Retry-After), and no session of
//     another client is closed to make room.
//
// An initialize counts from the moment the guard admits it, so concurrent
// ones cannot slip past a cap together.

import (
	"fmt"
	"net/http"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
)

// Defaults of Options.MaxSessionsPerCredential and Options.MaxSessions.
const (
	DefaultMaxSessionsPerCredential = 64
	DefaultMaxSessions              = 4096
)

func (p *Proxy) sessionCaps() (perCred, total int) {
	perCred, total = p.opts.MaxSessionsPerCredential, p.opts.MaxSessions
	if perCred <= 0 {
		perCred = DefaultMaxSessionsPerCredential
	}
	if total <= 0 {
		total = DefaultMaxSessions
	}
	return perCred, total
}

// admitSession admits an initialize of credential cred (credentialKey)
// under the caps, closing that credential's longest-idle session when it is
// at its own cap, or answers the refusal and returns false. Call release
// when the initialize is done (the session is then counted as a session).
func (p *Proxy) admitSession(w http.ResponseWriter, cred string) (release func(), ok bool) {
	perCred, total := p.sessionCaps()
	f := p.fast
	f.mu.Lock()
	mine, all := f.admitting[cred], f.admittingTotal
	var oldest *clientSession
	for _, cs := range f.sessions {
		if cs.closing {
			continue
		}
		all++
		if cs.cred != cred {
			continue
		}
		mine++
		if cs.active.Load() == 0 && (oldest == nil || cs.seen.Load() < oldest.seen.Load()) {
			oldest = cs
		}
	}
	switch {
	case all >= total:
		f.mu.Unlock()
		p.log.Warn("session refused: the gateway holds its maximum of sessions", "max", total)
		w.Header().Set("Retry-After", "60")
		writeRPCError(w, http.StatusServiceUnavailable, jsonrpc.CodeInternalError,
			fmt.Sprintf("toolgate: the gateway holds its maximum of %d sessions; close sessions you no longer use (HTTP DELETE with their Mcp-Session-Id) or try again later", total))
		return nil, false
	case mine >= perCred && oldest == nil:
		f.mu.Unlock()
		writeRPCError(w, http.StatusTooManyRequests, jsonrpc.CodeInvalidRequest,
			fmt.Sprintf("toolgate: this credential holds its maximum of %d sessions and none of them is idle; close sessions you no longer use (HTTP DELETE with their Mcp-Session-Id)", perCred))
		return nil, false
	case mine >= perCred:
		oldest.closing = true // counted no more, closed below
	}
	f.admitting[cred]++
	f.admittingTotal++
	f.mu.Unlock()
	if oldest != nil && mine >= perCred {
		p.log.Info("session closed: its credential opened one more than its maximum, and this one was idle longest",
			"max", perCred, "idle", time.Since(time.Unix(0, oldest.seen.Load())).Round(time.Second))
		go oldest.ss.Close()
	}
	return func() {
		f.mu.Lock()
		if f.admitting[cred]--; f.admitting[cred] <= 0 {
			delete(f.admitting, cred)
		}
		f.admittingTotal--
		f.mu.Unlock()
	}, true
}

// Sessions returns how many client sessions the gateway holds, in total
// and for each credential key (for tests and diagnostics).
func (p *Proxy) Sessions() (total int, byCredential map[string]int) {
	f := p.fast
	f.mu.Lock()
	defer f.mu.Unlock()
	byCredential = map[string]int{}
	for _, cs := range f.sessions {
		if !cs.closing {
			total++
			byCredential[cs.cred]++
		}
	}
	return total, byCredential
}
