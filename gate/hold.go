package gate

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/toolgate/toolgate/approval"
)

// waiters releases held calls when their approval is decided: one listener
// on the approval store's notifications (approval.Store.ListenApprovals:
// in-process for SQLite, LISTEN/NOTIFY for PostgreSQL, so a decision made
// through any gateway sharing the store releases the call), fanned out by
// approval id. Nothing polls.
type waiters struct {
	mu      sync.Mutex
	started bool
	ready   chan struct{} // closed once the listener is subscribed
	byID    map[string][]chan approval.Approval
}

// listen starts the gate's one listener once; it runs until the process
// ends, resubscribing after an error.
func (g *Gate) listen() <-chan struct{} {
	w := &g.waiters
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.started {
		return w.ready
	}
	w.started, w.ready, w.byID = true, make(chan struct{}), map[string][]chan approval.Approval{}
	store, ok := g.opts.Approvals.(approval.Listener)
	if !ok {
		return nil // never ready: a store without notifications cannot hold
	}
	go func() {
		once := sync.Once{}
		ready := func() { once.Do(func() { close(w.ready) }) }
		for backoff := 100 * time.Millisecond; ; backoff = min(2*backoff, 5*time.Second) {
			err := store.ListenApprovals(context.Background(), ready, func(a approval.Approval) {
				w.mu.Lock()
				chans := w.byID[a.ID]
				w.mu.Unlock()
				for _, c := range chans {
					select {
					case c <- a:
					default:
					}
				}
			})
			g.log.Warn("approval notifications stopped; resubscribing", "err", err, "after", backoff)
			time.Sleep(backoff)
		}
	}()
	return w.ready
}

func (w *waiters) add(id string) chan approval.Approval {
	c := make(chan approval.Approval, 1)
	w.mu.Lock()
	w.byID[id] = append(w.byID[id], c)
	w.mu.Unlock()
	return c
}

func (w *waiters) remove(id string, c chan approval.Approval) {
	w.mu.Lock()
	defer w.mu.Unlock()
	cs := w.byID[id]
	for i, x := range cs {
		if x == c {
			cs = append(cs[:i], cs[i+1:]...)
			break
		}
	}
	if len(cs) == 0 {
		delete(w.byID, id)
	} else {
		w.byID[id] = cs
	}
}

// hold waits until approval id is decided or wait passes (Settings.
// approval_wait), telling req.Progress about once a second; it reports
// whether the approval was granted. The wait ends at once when the
// approval is denied or expires, or when ctx ends (the client went away).
func (g *Gate) hold(ctx context.Context, req Request, id string, wait time.Duration) bool {
	store := g.opts.Approvals
	if store == nil {
		return false
	}
	if _, ok := store.(approval.Listener); !ok {
		g.log.Warn("approval_wait: the approval store sends no notifications, so calls are not held", "approval", id)
		return false
	}
	select {
	case <-g.listen():
	case <-ctx.Done():
		return false
	case <-time.After(wait):
		return false
	}
	c := g.waiters.add(id)
	defer g.waiters.remove(id, c)
	// Decided before the waiter was in place?
	if a, err := store.GetApproval(ctx, id); err != nil || a.Status != approval.StatusPending {
		return err == nil && a.Status == approval.StatusApproved
	}
	start := time.Now()
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		if req.Progress != nil {
			waited := time.Since(start)
			req.Progress(waited.Seconds(), wait.Seconds(), fmt.Sprintf("waiting for approval %s (%s left)", id, (wait-waited).Round(time.Second)))
		}
		select {
		case a := <-c:
			switch a.Status {
			case approval.StatusApproved:
				return true
			case approval.StatusPending:
				continue
			}
			return false
		case <-tick.C:
		case <-deadline.C:
			return false
		case <-ctx.Done():
			return false
		}
	}
}
