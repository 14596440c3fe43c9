package mcpproxy

// Subscription caps. A resources/subscribe of a URI costs an upstream
// subscription (for the first client that asks) and memory (the URI, kept
// by the gateway and by the SDK) for as long as the client session keeps
// it, and the URIs a template allows are without number, so subscriptions
// are bounded per client session, per authority and in total:
//
//   - one client session holds at most MaxSubscriptionsPerSession
//     (DefaultMaxSubscriptionsPerSession, 256) subscriptions;
//   - one authority — the principal and agent of the session's identity,
//     all its sessions together (every anonymous client together), as for
//     the session caps (sessions.go) — holds at most
//     MaxSubscriptionsPerAuthority (DefaultMaxSubscriptionsPerAuthority,
//     1024): a session is something a client can open freely, so the
//     per-session cap alone would let one authority hold its session cap
//     times as many;
//   - all sessions together hold at most MaxSubscriptions
//     (DefaultMaxSubscriptions, 8192).
//
// A subscribe past a cap gets a JSON-RPC error (invalid request) naming the
// cap, its count and what to do; nothing is sent upstream, and the access
// (decided and recorded before, by gate.HandleAccess) is recorded as failed
// with that message. Subscribing again to a URI the session holds costs
// nothing. resources/unsubscribe and the end of a session free their slots
// at once, with the upstream's subscription when no session is left on
// that URI, and the SDK's own record of them (forgetSDK). The length of a
// URI is bounded before any of this, at the decision (policy.MaxURILen).

import (
	"context"
	"fmt"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Defaults of Options.MaxSubscriptionsPerSession,
// MaxSubscriptionsPerAuthority and MaxSubscriptions.
const (
	// DefaultMaxSubscriptionsPerSession is how many resource
	// subscriptions one client session holds at a time.
	DefaultMaxSubscriptionsPerSession = 256
	// DefaultMaxSubscriptionsPerAuthority is how many one principal and
	// agent hold with all their sessions together.
	DefaultMaxSubscriptionsPerAuthority = 1024
	// DefaultMaxSubscriptions is how many all client sessions together
	// hold.
	DefaultMaxSubscriptions = 8192
)

// subscriber is what the caps know of one client session's subscriptions.
type subscriber struct {
	authority string // authorityKey of its identity
	n         int    // URIs it is subscribed to
}

// subCounts counts the subscriptions of client sessions (the members of
// relay.subs), by session, by authority and in total; guarded by relay.mu.
type subCounts struct {
	bySession   map[*mcp.ServerSession]*subscriber
	byAuthority map[string]int
	total       int
}

func (c *subCounts) add(ss *mcp.ServerSession, authority string) {
	if c.bySession == nil {
		c.bySession, c.byAuthority = map[*mcp.ServerSession]*subscriber{}, map[string]int{}
	}
	s := c.bySession[ss]
	if s == nil {
		s = &subscriber{authority: authority}
		c.bySession[ss] = s
	}
	s.n++
	c.byAuthority[s.authority]++
	c.total++
}

func (c *subCounts) remove(ss *mcp.ServerSession) {
	s := c.bySession[ss]
	if s == nil {
		return
	}
	s.n--
	c.total--
	if c.byAuthority[s.authority]--; c.byAuthority[s.authority] <= 0 {
		delete(c.byAuthority, s.authority)
	}
	if s.n <= 0 {
		delete(c.bySession, ss)
	}
}

func (p *Proxy) subscriptionCaps() (perSession, perAuthority, total int) {
	perSession, perAuthority, total = p.opts.MaxSubscriptionsPerSession, p.opts.MaxSubscriptionsPerAuthority, p.opts.MaxSubscriptions
	if perSession <= 0 {
		perSession = DefaultMaxSubscriptionsPerSession
	}
	if perAuthority <= 0 {
		perAuthority = DefaultMaxSubscriptionsPerAuthority
	}
	if total <= 0 {
		total = DefaultMaxSubscriptions
	}
	return perSession, perAuthority, total
}

// subscriptionCapLocked returns the error of a subscribe of session ss (of
// authority) to a URI it does not hold yet when a cap is reached, or nil.
func (r *relay) subscriptionCapLocked(ss *mcp.ServerSession, authority string) error {
	perSession, perAuthority, total := r.p.subscriptionCaps()
	mine := 0
	if s := r.counts.bySession[ss]; s != nil {
		mine = s.n
	}
	const undo = "unsubscribe (resources/unsubscribe) from resources you no longer watch"
	var msg string
	switch {
	case mine >= perSession:
		msg = fmt.Sprintf("toolgate: resources/subscribe refused by the subscription cap per session: this session holds its maximum of %d subscriptions (%d); %s", perSession, mine, undo)
	case r.counts.byAuthority[authority] >= perAuthority:
		msg = fmt.Sprintf("toolgate: resources/subscribe refused by the subscription cap per authority: your principal and agent hold their maximum of %d subscriptions (%d, all sessions together); %s, or close sessions you no longer use", perAuthority, r.counts.byAuthority[authority], undo)
	case r.counts.total >= total:
		msg = fmt.Sprintf("toolgate: resources/subscribe refused by the gateway's subscription cap: all clients together hold its maximum of %d subscriptions (%d); %s, or try again later", total, r.counts.total, undo)
	default:
		return nil
	}
	r.p.log.Info("resource subscription refused: a cap is reached", "reason", msg)
	return &jsonrpc.Error{Code: jsonrpc.CodeInvalidRequest, Message: msg}
}

// Subscriptions returns how many resource subscriptions client sessions
// hold, in total and for each authority key (as Sessions; for tests and
// diagnostics).
func (p *Proxy) Subscriptions() (total int, byAuthority map[string]int) {
	r := p.relay
	r.mu.Lock()
	defer r.mu.Unlock()
	byAuthority = make(map[string]int, len(r.counts.byAuthority))
	for k, n := range r.counts.byAuthority {
		byAuthority[k] = n
	}
	return r.counts.total, byAuthority
}

// sdkUnsubscribe is a subscription of a closed session that the SDK may
// still keep.
type sdkUnsubscribe struct {
	ss  *mcp.ServerSession
	uri string
}

// cleanupKey marks the context of an unsubscribe the gateway sends the
// SDK itself (forgetSDK): relay.unsubscribe leaves it to the SDK.
type cleanupKey struct{}

// captureSDK is a receiving middleware, installed innermost, that keeps
// the SDK's own method handler (for forgetSDK) and changes nothing.
func (r *relay) captureSDK(next mcp.MethodHandler) mcp.MethodHandler {
	r.sdk = next
	return next
}

// forgetSDK removes subscriptions of closed sessions from the SDK's own
// record. The SDK forgets a closed session's subscriptions but keeps each
// URI it subscribed to as an empty entry, for good (go-sdk v1.8.0
// Server.disconnect), so a client subscribing to ever new URIs and
// closing its sessions would grow it without bound; its unsubscribe
// removes an entry left empty. Call it without relay.mu.
func (r *relay) forgetSDK(list []sdkUnsubscribe) {
	if r.sdk == nil || len(list) == 0 {
		return
	}
	ctx := context.WithValue(context.Background(), cleanupKey{}, true)
	for _, u := range list {
		if _, err := r.sdk(ctx, "resources/unsubscribe", &mcp.UnsubscribeRequest{Session: u.ss, Params: &mcp.UnsubscribeParams{URI: u.uri}}); err != nil {
			r.p.log.Debug("forgetting a closed session's subscription failed", "uri", u.uri, "err", err)
		}
	}
}

// forgetLocked drops the subscriptions of the sessions in dead: it returns
// the URIs nobody watches any more (their upstreams are to be
// unsubscribed) and what the SDK is to forget (forgetSDK).
func (r *relay) forgetLocked(dead map[*mcp.ServerSession]bool) (drop []subscriptionRef, sdk []sdkUnsubscribe) {
	if len(dead) == 0 {
		return nil, nil
	}
	for uri, s := range r.subs {
		before := len(s.sessions)
		for ss := range s.sessions {
			if dead[ss] {
				delete(s.sessions, ss)
				r.counts.remove(ss)
				sdk = append(sdk, sdkUnsubscribe{ss, uri})
			}
		}
		if before > 0 && len(s.sessions) == 0 {
			drop = append(drop, subscriptionRef{s.upstream, uri})
		}
	}
	return drop, sdk
}

// subscriptionRef is one URI subscribed at one upstream.
type subscriptionRef struct{ upstream, uri string }

// sessionClosed frees what client session ss held in the relay, at once:
// its subscriptions (and the upstreams' of URIs nobody else watches), its
// logging level and its URL elicitations.
func (r *relay) sessionClosed(ss *mcp.ServerSession) {
	r.mu.Lock()
	delete(r.levels, ss)
	for id, s := range r.elicits {
		if s == ss {
			delete(r.elicits, id)
		}
	}
	drop, sdk := r.forgetLocked(map[*mcp.ServerSession]bool{ss: true})
	r.mu.Unlock()
	r.forgetSDK(sdk)
	for _, d := range drop {
		r.unsubscribeUpstream(context.Background(), d.upstream, d.uri)
	}
}
