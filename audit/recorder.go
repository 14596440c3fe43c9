package audit

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/toolgate/toolgate"
)

// RecorderOptions tunes a Recorder. The zero value (or nil) is valid; zero
// fields take the documented defaults.
type RecorderOptions struct {
	// MaxBatch is the most events written in one store transaction.
	// Default 512. Events that must be durable before their caller goes on
	// (Record) are taken into the next transaction ahead of a backlog of
	// queued ones, so an allow never waits behind more than one batch.
	MaxBatch int
	// MaxQueued and MaxQueuedBytes bound the events accepted but not yet
	// written (the backlog that builds while the store fails or stalls):
	// at most MaxQueued events (default 10,000) and MaxQueuedBytes of their
	// encoded size (default 8 MiB). When either is reached, Admit and
	// Record refuse at once (ErrBacklogFull) and RecordOrQueue counts the
	// event in a summary instead of queueing it (see the Recorder doc).
	// Enqueue (completions of calls already running, gateway lifecycle
	// events) may go up to twice these bounds before it counts too.
	MaxQueued      int
	MaxQueuedBytes int
	// StallAfter is how long one store append may run before the store
	// counts as stalled: Health reports it (a gateway's /readyz turns 503),
	// Admit and Record refuse at once (ErrStalled), callers already waiting
	// in Record get ErrStalled, and RecordOrQueue stops waiting and leaves
	// its event queued. Default 2 s.
	StallAfter time.Duration
	// Sinks receive every committed batch, in commit order, after it is
	// durable. Each sink has its own goroutine and queue: a slow or failing
	// sink never delays or fails Record.
	Sinks []Sink
	// SinkQueue is how many committed batches may wait for each sink. When a
	// sink's queue is full the batch is dropped for that sink only (the
	// store still has it), counted in Stats().SinkDropped and reported to
	// OnSinkError as ErrSinkOverflow. Default 1024.
	SinkQueue int
	// OnSinkError, if set, is called with each sink error (from that sink's
	// goroutine) and each overflow (from the writer goroutine, so it must
	// not block: it would delay the next commit).
	OnSinkError func(s Sink, err error)
	// Now is the clock used to fill an event's zero OccurredAt and to time
	// stalls and overflows. Default time.Now.
	Now func() time.Time
	// NewEventID makes the id of an event whose EventID is empty.
	// Default NewEventID (random UUID).
	NewEventID func() string
	// RetryMin and RetryMax bound the exponential backoff between attempts
	// to write queued events while the store is failing. Defaults 50 ms and
	// 5 s. A Flush or Close call triggers an attempt at once.
	RetryMin, RetryMax time.Duration
	// WriteTimeout bounds one store append (its context). Default 30 s.
	WriteTimeout time.Duration
	// EnqueueLinger is how long an enqueued event may wait for company
	// before a write is started for it: a Record in that window takes it
	// along in the same transaction, so a tool call's completion event
	// does not cost the next call an extra fsync. 0 means 50 ms; negative
	// means write at once.
	EnqueueLinger time.Duration
	// OnState, if set, is called at each change of the Recorder's State:
	// the store starts failing or writes again, an append stalls or
	// finishes, the backlog overflows or its summary is queued. It gets
	// the state before and after. The calls come in order, one at a time,
	// from a goroutine of the Recorder's own (so a slow OnState delays the
	// next report, never a write); when changes come faster than OnState
	// returns, at most 64 wait and the newest are merged into one. Close
	// waits for the last call (until its ctx ends).
	OnState func(prev, next State)
}

// State is a Recorder's condition, as OnState and State report it. The
// zero value is healthy.
type State struct {
	// Failing: the last store append failed. Events that must be durable
	// now are refused (ErrUnavailable); queued events are retried.
	Failing bool
	// Stalled: a store append has run longer than StallAfter. Events that
	// must be durable now are refused (ErrStalled).
	Stalled bool
	// Overflowing: the backlog was full, so events RecordOrQueue (and,
	// past twice the bounds, Enqueue) could not keep are being counted for
	// an audit.backlog_overflow summary. It ends when the summary is
	// queued: once the store writes and the queue has drained to half.
	Overflowing bool
	// Err is the store's error while Failing, else the stall's while
	// Stalled, else nil.
	Err error
	// FailingSince, StalledSince and OverflowingSince are when each
	// condition in effect began (zero when it is not in effect).
	FailingSince, StalledSince, OverflowingSince time.Time
}

// Healthy reports whether the store writes, no append is stalled and no
// event is being counted.
func (s State) Healthy() bool { return !s.Failing && !s.Stalled && !s.Overflowing }

// String returns "healthy", or the conditions in effect joined by "+"
// ("failing", "stalled", "overflowing").
func (s State) String() string {
	var parts []string
	if s.Failing {
		parts = append(parts, "failing")
	}
	if s.Stalled {
		parts = append(parts, "stalled")
	}
	if s.Overflowing {
		parts = append(parts, "overflowing")
	}
	if len(parts) == 0 {
		return "healthy"
	}
	return strings.Join(parts, "+")
}

// maxPendingStates bounds the state changes waiting for OnState.
const maxPendingStates = 64

// Defaults of RecorderOptions.
const (
	DefaultMaxQueued      = 10_000
	DefaultMaxQueuedBytes = 8 << 20
	DefaultStallAfter     = 2 * time.Second
)

// Sink receives committed events, for example to stream them to a log
// shipper. Write is called with batches in commit order, never concurrently
// for one sink. An error is reported to RecorderOptions.OnSinkError; the
// batch is not retried.
type Sink interface {
	Write(ctx context.Context, evs []Event) error
}

// ErrSinkOverflow is reported to OnSinkError when a sink's queue is full and
// a batch is dropped for it.
var ErrSinkOverflow = errors.New("audit: sink queue full; batch dropped for this sink")

// Errors of Admit and Record: the Recorder cannot take an event that must be
// durable now, so the caller refuses what it was about to do. Each is
// answered at once, never after waiting on the store.
var (
	// ErrUnavailable: the last store append failed (the error wraps it);
	// queued events are retried in the background.
	ErrUnavailable = errors.New("audit: the audit store cannot write")
	// ErrStalled: a store append has run longer than StallAfter.
	ErrStalled = errors.New("audit: the audit store has stopped answering")
	// ErrBacklogFull: MaxQueued or MaxQueuedBytes is reached.
	ErrBacklogFull = errors.New("audit: the audit backlog is full")
	// ErrMaybeWritten is wrapped by a Record error when the event was
	// already in a store append that had not finished: it may still be
	// written, so a refusal recorded after it should name it (causation_id).
	ErrMaybeWritten = errors.New("it may still be written")
)

// Disposition says what RecordOrQueue did with an event.
type Disposition uint8

const (
	// Durable: the event was written before RecordOrQueue returned.
	Durable Disposition = iota
	// Queued: the store was failing, stalled or slower than the caller's
	// ctx; the event is queued and written once the store can (or spilled
	// at Close, see Unwritten).
	Queued
	// Counted: the backlog was full; the event is counted in the next
	// audit.backlog_overflow summary instead of being kept.
	Counted
	// Lost: the Recorder was closed; the event is not recorded.
	Lost
)

// String returns "durable", "queued", "counted" or "lost".
func (d Disposition) String() string {
	switch d {
	case Durable:
		return "durable"
	case Queued:
		return "queued"
	case Counted:
		return "counted"
	default:
		return "lost"
	}
}

// RecorderStats is a snapshot of a Recorder's counters.
type RecorderStats struct {
	// Pending is the number of events accepted but not yet durable.
	Pending int
	// QueuedBytes is the encoded size of the queued events, in bytes.
	QueuedBytes int
	// Overflowed is how many events are counted for the next
	// audit.backlog_overflow summary (not yet written).
	Overflowed uint64
	// Committed is the number of events written since the Recorder started.
	Committed uint64
	// Batches is the number of store transactions that committed.
	Batches uint64
	// Failures is the number of store appends that failed.
	Failures uint64
	// SinkDropped is the number of events dropped for sinks whose queue was full.
	SinkDropped uint64
	// SinkErrors is the number of sink writes that failed.
	SinkErrors uint64
	// Stalled is true while a store append has run longer than StallAfter.
	Stalled bool
	// Err is the last store error, nil once an append succeeds again.
	Err error
}

// Recorder writes events to a Store with group commit.
//
// Three ways in, by what the caller needs:
//
//   - Record: durable before the caller goes on (an allow decision, before
//     the tool runs). Concurrent calls share one store transaction, so N
//     callers pay for one fsync. While the store fails or stalls, or the
//     backlog is full, it answers at once with an error (ErrUnavailable,
//     ErrStalled, ErrBacklogFull) and the caller refuses the call; it never
//     waits behind a failing store. Admit asks the same question without
//     an event, before anything is decided.
//   - RecordOrQueue: durable before the answer when the store is healthy
//     (a denial: the same group commit, the same fsync as the allows);
//     while it fails or stalls, queued at once instead.
//   - Enqueue: queued, never waiting (a completion: it rides along with the
//     next transaction, so it adds no fsync to a call).
//
// The queue is bounded (MaxQueued events, MaxQueuedBytes). While the store
// fails, queued events stay at the front and are retried with exponential
// backoff; the first failure also queues an audit.store_failed event
// (written with them on recovery), and Err and Health report the failure so
// the gateway reports not-ready and denies. When the queue is full, an
// event RecordOrQueue cannot keep is counted, never silently dropped: once
// the store writes again and the queue has drained to half, one
// audit.backlog_overflow event records how many, the first and last time,
// and the counts by event type and by principal, agent, tool and code (see
// overflowEventLocked). OnState reports each change of these conditions
// (State), for one log line at each.
//
// A crash loses what was queued and not yet written: completions (the
// gateway marks their calls outcome_unknown at its next start, see
// Recover) and what was queued while the store failed. Record'ed events
// are never lost once Record returned nil. Close writes the queue, and when
// it must give up, Unwritten returns what is left for the caller to spill;
// CloseWith also writes one last event (a gateway's gateway.stopped), by
// which the next start knows that this run ended with everything written
// or spilled.
//
// A Recorder is safe for concurrent use.
type Recorder struct {
	store Store
	opts  RecorderOptions
	sinks []*sinkWorker

	lingerArmed atomic.Bool

	mu           sync.Mutex
	durable      []*waiter
	queued       []item
	queuedBytes  int
	nextAdmit    uint64
	closed       bool
	force        bool // attempt at once even while failing (Flush asked)
	err          error
	failedAt     time.Time
	durAdmitted  uint64
	durResolved  uint64
	enqAdmitted  uint64
	enqCommitted uint64
	progress     chan struct{}
	overflow     overflowCount
	unwritten    []Event

	// Stall detection: writeGen counts appends; stalled is set by a timer
	// when append writeGen runs longer than StallAfter, and stallCh is
	// closed (and replaced) then, waking the callers waiting on it.
	writing    bool
	writeGen   uint64
	stalled    bool
	stallCh    chan struct{}
	stallErr   error
	stallSince time.Time

	// OnState reports: state is the state last reported, transitions the
	// changes waiting for the notifier goroutine (notifyStates).
	state       State
	transitions [][2]State
	stateWake   chan struct{}
	stateQuit   chan struct{}
	stateDone   chan struct{}

	committed, batches, failures atomic.Uint64

	wake        chan struct{}
	quit        chan struct{}
	abortCtx    context.Context // canceled when Close gives up
	abortCancel context.CancelFunc
	writerDone  chan struct{}
	sinkCtx     context.Context
	sinkCancel  context.CancelFunc
	closeOnce   sync.Once
	closeErr    error
}

// item is a queued event.
type item struct {
	ev    Event
	admit uint64
	size  int
	// notify, when set, is RecordOrQueue's caller waiting: it receives nil
	// once the event is durable or the error of the first failed attempt
	// (then it is set to nil; the event stays queued).
	notify chan error
}

// overflowCount is what the next audit.backlog_overflow summary reports.
type overflowCount struct {
	n           uint64
	first, last time.Time
	since       time.Time // when counting began (the Recorder's clock)
	byType      map[string]uint64
	// groups counts by (principal, agent, tool, code), for at most
	// maxOverflowGroups groups, then (principal, agent, any tool, code)
	// for at most overflowSpareGroups more; what fits in neither is
	// untracked (counted in n only).
	groups    map[overflowKey]*overflowGroup
	untracked uint64
	// internal counts the events with code internal_error: the calls
	// refused because the audit log could not take their record.
	internal uint64
}

// overflowKey is a group of counted events. Each part is clipped to
// maxOverflowKeyPart bytes (a called tool name is the caller's choice).
type overflowKey struct {
	principal, agent, tool, code string
}

type overflowGroup struct {
	n           uint64
	first, last time.Time
}

const (
	// maxOverflowGroups and overflowSpareGroups bound the memory of the
	// groups counted while the backlog is full (see overflowCount).
	maxOverflowGroups   = 1000
	overflowSpareGroups = 200
	// overflowTop is how many groups the summary lists, the most frequent
	// first; the others are one "other" total.
	overflowTop = 50
	// maxOverflowKeyPart is the longest part of a group key, in bytes.
	maxOverflowKeyPart = 200
	// overflowAnyTool is the tool of a group that stands for every tool
	// of its principal, agent and code not counted in a group of its own.
	overflowAnyTool = "*"
)

// waiter states.
const (
	waiting int32 = iota
	taken
	abandoned
)

type waiter struct {
	ev    Event
	admit uint64 // admission order, shared with queued events
	pos   int    // index in the batch it was taken into
	state atomic.Int32
	done  chan result
}

type result struct {
	ev  Event
	err error
}

// NewRecorder starts a Recorder writing to store. opts may be nil.
func NewRecorder(store Store, opts *RecorderOptions) *Recorder {
	var o RecorderOptions
	if opts != nil {
		o = *opts
	}
	if o.MaxBatch <= 0 {
		o.MaxBatch = 512
	}
	if o.MaxQueued <= 0 {
		o.MaxQueued = DefaultMaxQueued
	}
	if o.MaxQueuedBytes <= 0 {
		o.MaxQueuedBytes = DefaultMaxQueuedBytes
	}
	if o.StallAfter <= 0 {
		o.StallAfter = DefaultStallAfter
	}
	if o.SinkQueue <= 0 {
		o.SinkQueue = 1024
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.NewEventID == nil {
		o.NewEventID = NewEventID
	}
	if o.RetryMin <= 0 {
		o.RetryMin = 50 * time.Millisecond
	}
	if o.RetryMax < o.RetryMin {
		o.RetryMax = max(5*time.Second, o.RetryMin)
	}
	if o.WriteTimeout <= 0 {
		o.WriteTimeout = 30 * time.Second
	}
	if o.EnqueueLinger == 0 {
		o.EnqueueLinger = 50 * time.Millisecond
	}
	r := &Recorder{
		store:      store,
		opts:       o,
		progress:   make(chan struct{}),
		stallCh:    make(chan struct{}),
		wake:       make(chan struct{}, 1),
		quit:       make(chan struct{}),
		writerDone: make(chan struct{}),
		stateWake:  make(chan struct{}, 1),
		stateQuit:  make(chan struct{}),
		stateDone:  make(chan struct{}),
	}
	r.abortCtx, r.abortCancel = context.WithCancel(context.Background())
	r.sinkCtx, r.sinkCancel = context.WithCancel(context.Background())
	for _, s := range o.Sinks {
		w := &sinkWorker{sink: s, in: make(chan []Event, o.SinkQueue), done: make(chan struct{})}
		r.sinks = append(r.sinks, w)
		go w.run(r)
	}
	go r.run()
	if o.OnState != nil {
		go r.notifyStates()
	} else {
		close(r.stateDone)
	}
	return r
}

// admitLocked says why an event that must be durable now cannot be taken;
// r.mu must be held.
func (r *Recorder) admitLocked() error {
	switch {
	case r.closed:
		return ErrClosed
	case r.fullLocked(1):
		cause := ""
		if r.err != nil {
			cause = fmt.Sprintf(" (%v)", r.err)
		}
		return fmt.Errorf("%w: %d events (%d bytes) wait for the store%s, the most allowed (%d events, %d bytes); calls that would run or ask for approval are refused until it drains (denials are answered and counted)",
			ErrBacklogFull, len(r.queued), r.queuedBytes, cause, r.opts.MaxQueued, r.opts.MaxQueuedBytes)
	case r.stalled:
		return fmt.Errorf("%w: %v", ErrStalled, r.stallErr)
	case r.err != nil:
		return fmt.Errorf("%w: %w", ErrUnavailable, r.err)
	}
	return nil
}

// fullLocked reports whether the queue has reached factor times its bounds.
func (r *Recorder) fullLocked(factor int) bool {
	return len(r.queued) >= factor*r.opts.MaxQueued || r.queuedBytes >= factor*r.opts.MaxQueuedBytes
}

// Admit reports whether the Recorder can take an event that must be
// durable now: nil, or the error Record would answer with at once
// (ErrClosed, ErrStalled, ErrUnavailable or ErrBacklogFull, wrapped with
// the detail). An enforcement point asks before it decides to run
// anything, so a call it cannot record consumes no approval.
func (r *Recorder) Admit() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.admitLocked()
}

// Record writes ev and returns once it is durable, with Seq, PrevHash and
// Hash filled in. It fills an empty EventID and a zero OccurredAt. It
// returns an error, and the caller must then refuse the call: at once when
// the store is failing or stalled or the backlog is full (see Admit); when
// Details cannot be encoded; after Close (ErrClosed); when the store append
// fails; when the append it waits for stalls (ErrStalled); or when ctx ends
// first. In the last two cases the event may still be written later (the
// error says so).
func (r *Recorder) Record(ctx context.Context, ev Event) (Event, error) {
	ev, _, err := r.prepare(ev)
	if err != nil {
		return Event{}, err
	}
	w := &waiter{ev: ev, done: make(chan result, 1)}
	r.mu.Lock()
	if err := r.admitLocked(); err != nil {
		r.mu.Unlock()
		return Event{}, fmt.Errorf("audit: record %s: %w", ev.EventID, err)
	}
	w.admit = r.nextAdmit
	r.nextAdmit++
	r.durable = append(r.durable, w)
	r.durAdmitted++
	stall := r.stallCh
	r.mu.Unlock()
	r.signal()
	giveUp := func(err error) (Event, error) {
		if w.state.CompareAndSwap(waiting, abandoned) {
			return Event{}, fmt.Errorf("audit: record %s: %w (not written)", ev.EventID, err)
		}
		return Event{}, fmt.Errorf("audit: record %s: %w (%w)", ev.EventID, err, ErrMaybeWritten)
	}
	select {
	case res := <-w.done:
		return res.ev, res.err
	case <-ctx.Done():
		return giveUp(ctx.Err())
	case <-stall:
		r.mu.Lock()
		serr := r.stallErr
		r.mu.Unlock()
		return giveUp(fmt.Errorf("%w: %v", ErrStalled, serr))
	}
}

// RecordOrQueue writes ev durably before it returns when the store is
// healthy, sharing the transaction (and fsync) of concurrent Record calls:
// for a denial, whose answer must not be lost in a crash once given. While
// the store is failing or stalled, or when ctx ends or the append stalls
// first, it returns Queued at once and the event is written when the store
// can. When the backlog is full it returns Counted (the event is counted
// in the next audit.backlog_overflow summary); after Close, Lost. Details
// that cannot be encoded are replaced by {"details_error": "..."} so the
// event is still recorded.
func (r *Recorder) RecordOrQueue(ctx context.Context, ev Event) Disposition {
	ev, size, err := r.prepare(ev)
	if err != nil {
		ev.Details = map[string]any{"details_error": err.Error()}
		size += len(err.Error())
	}
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return Lost
	}
	if r.fullLocked(1) {
		r.countLocked(ev)
		r.mu.Unlock()
		return Counted
	}
	it := item{ev: ev, admit: r.nextAdmit, size: size}
	wait := r.err == nil && !r.stalled
	if wait {
		it.notify = make(chan error, 1)
	}
	r.nextAdmit++
	r.enqAdmitted++
	r.queued = append(r.queued, it)
	r.queuedBytes += size
	stall := r.stallCh
	r.mu.Unlock()
	if !wait {
		return Queued
	}
	r.signal()
	select {
	case err := <-it.notify:
		if err == nil {
			return Durable
		}
		return Queued
	case <-ctx.Done():
	case <-stall:
	case <-r.writerDone:
	}
	return Queued
}

// Enqueue accepts ev for writing and returns at once; the event is committed
// with the next batch. It is for events that belong to something already
// admitted (a running call's completion) or to the gateway itself, so it
// may fill the queue up to twice its bounds; past that the event is
// counted in the overflow summary and Enqueue returns ErrBacklogFull.
// Details that cannot be encoded are replaced by {"details_error": "..."}
// so the event is still recorded. After Close it returns ErrClosed.
func (r *Recorder) Enqueue(ev Event) error {
	ev, size, err := r.prepare(ev)
	if err != nil {
		ev.Details = map[string]any{"details_error": err.Error()}
		size += len(err.Error())
	}
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return ErrClosed
	}
	if r.fullLocked(2) {
		r.countLocked(ev)
		r.mu.Unlock()
		return fmt.Errorf("%w: %s counted in the overflow summary", ErrBacklogFull, ev.EventType)
	}
	r.queueLocked(ev, size)
	r.mu.Unlock()
	if r.opts.EnqueueLinger < 0 {
		r.signal()
	} else if r.lingerArmed.CompareAndSwap(false, true) {
		time.AfterFunc(r.opts.EnqueueLinger, func() {
			r.lingerArmed.Store(false)
			r.signal()
		})
	}
	return nil
}

// queueLocked appends ev to the queue; r.mu must be held.
func (r *Recorder) queueLocked(ev Event, size int) {
	r.queued = append(r.queued, item{ev: ev, admit: r.nextAdmit, size: size})
	r.queuedBytes += size
	r.nextAdmit++
	r.enqAdmitted++
}

// countLocked counts ev for the overflow summary; r.mu must be held.
func (r *Recorder) countLocked(ev Event) {
	o := &r.overflow
	if o.n == 0 {
		*o = overflowCount{first: ev.OccurredAt, since: r.opts.Now(), byType: map[string]uint64{},
			groups: map[overflowKey]*overflowGroup{}}
	}
	o.n++
	if o.n == 1 {
		r.noteStateLocked()
	}
	if ev.OccurredAt.Before(o.first) {
		o.first = ev.OccurredAt
	}
	if ev.OccurredAt.After(o.last) {
		o.last = ev.OccurredAt
	}
	o.byType[ev.EventType]++
	if ev.Code == string(toolgate.CodeInternalError) {
		o.internal++
	}
	k := overflowKey{principal: clipPart(ev.Principal), agent: clipPart(ev.AgentID), tool: clipPart(ev.ToolID), code: clipPart(ev.Code)}
	g := o.groups[k]
	if g == nil && len(o.groups) >= maxOverflowGroups {
		k.tool = overflowAnyTool
		g = o.groups[k]
		if g == nil && len(o.groups) >= maxOverflowGroups+overflowSpareGroups {
			o.untracked++
			return
		}
	}
	if g == nil {
		g = &overflowGroup{first: ev.OccurredAt, last: ev.OccurredAt}
		o.groups[k] = g
	}
	g.n++
	if ev.OccurredAt.Before(g.first) {
		g.first = ev.OccurredAt
	}
	if ev.OccurredAt.After(g.last) {
		g.last = ev.OccurredAt
	}
}

// clipPart clips a part of an overflow group key to maxOverflowKeyPart
// bytes (copied, so the event's strings are not kept alive).
func clipPart(s string) string {
	if len(s) <= maxOverflowKeyPart {
		return s
	}
	return strings.ToValidUTF8(strings.Clone(s[:maxOverflowKeyPart]), "") + "…"
}

// overflowEventLocked returns the summary of the counted events and resets
// the count; r.mu must be held and r.overflow.n > 0.
//
// Its details: count, first and last (RFC 3339, UTC), by_type (event type
// to count), internal_error (how many have that code), top (the
// overflowTop largest groups by principal, agent_id, tool_id and code,
// most frequent first, each with count, first and last; tool_id "*"
// stands for the tools of that principal, agent and code counted when no
// more groups could be kept), and other (events and groups outside top;
// untracked: events counted when no group could be kept at all).
func (r *Recorder) overflowEventLocked() Event {
	o := r.overflow
	r.overflow = overflowCount{}
	byType := map[string]any{}
	for t, n := range o.byType {
		byType[t] = n
	}
	type group struct {
		k overflowKey
		g *overflowGroup
	}
	groups := make([]group, 0, len(o.groups))
	for k, g := range o.groups {
		groups = append(groups, group{k, g})
	}
	slices.SortFunc(groups, func(a, b group) int {
		if a.g.n != b.g.n {
			if a.g.n > b.g.n {
				return -1
			}
			return 1
		}
		return strings.Compare(a.k.principal+"\x00"+a.k.agent+"\x00"+a.k.tool+"\x00"+a.k.code,
			b.k.principal+"\x00"+b.k.agent+"\x00"+b.k.tool+"\x00"+b.k.code)
	})
	ts := func(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }
	top := []any{}
	otherEvents, otherGroups := o.untracked, 0
	for i, g := range groups {
		if i >= overflowTop {
			otherEvents += g.g.n
			otherGroups++
			continue
		}
		top = append(top, map[string]any{"principal": g.k.principal, "agent_id": g.k.agent, "tool_id": g.k.tool, "code": g.k.code,
			"count": g.g.n, "first": ts(g.g.first), "last": ts(g.g.last)})
	}
	most := ""
	if len(groups) > 0 {
		g := groups[0]
		most = fmt.Sprintf("; the most frequent: principal %q, agent %q, tool %q, code %q, %d times", g.k.principal, g.k.agent, g.k.tool, g.k.code, g.g.n)
	}
	ev := Event{
		EventID:    r.opts.NewEventID(),
		EventType:  string(toolgate.EventAuditBacklogOverflow),
		OccurredAt: r.opts.Now(),
		Reason: fmt.Sprintf("%d events from %s to %s were counted here instead of recorded one by one, because the audit backlog was full (%d events or %d bytes waiting for the store). "+
			"Each call was answered as it would have been, except that a call that would have run or asked for approval was refused with internal_error (%d events here have that code); "+
			"denied calls kept their denial. Details count them by event type and by principal, agent, tool and code (the %d most frequent, with their first and last times, then the rest as one total)%s",
			o.n, ts(o.first), ts(o.last), r.opts.MaxQueued, r.opts.MaxQueuedBytes, o.internal, overflowTop, most),
		Details: map[string]any{"count": o.n, "first": ts(o.first), "last": ts(o.last), "by_type": byType,
			"internal_error": o.internal, "top": top,
			"other": map[string]any{"events": otherEvents, "groups": otherGroups, "untracked": o.untracked}},
	}
	ev, _ = normalize(ev)
	return ev
}

// Flush returns once every event accepted before the call is durable, or
// with an error when ctx ends first (the error includes the store's last
// error). It triggers a write attempt at once, even while the store is
// failing.
func (r *Recorder) Flush(ctx context.Context) error {
	r.mu.Lock()
	targetDur, targetEnq := r.durAdmitted, r.enqAdmitted
	r.force = true
	r.mu.Unlock()
	r.signal()
	for {
		r.mu.Lock()
		if r.durResolved >= targetDur && r.enqCommitted >= targetEnq {
			r.mu.Unlock()
			return nil
		}
		ch := r.progress
		storeErr := r.err
		r.mu.Unlock()
		select {
		case <-ch:
		case <-r.writerDone:
			return fmt.Errorf("audit: flush: %w", ErrClosed)
		case <-ctx.Done():
			if storeErr != nil {
				return fmt.Errorf("audit: flush: %w (last store error: %v)", ctx.Err(), storeErr)
			}
			return fmt.Errorf("audit: flush: %w", ctx.Err())
		}
	}
}

// Close stops accepting events, writes everything queued (retrying while the
// store fails; the overflow summary too), delivers the committed batches to
// the sinks, and returns. When ctx ends first it gives up: it fails Record
// calls still waiting, keeps the queued events (and a summary of the
// counted ones) for Unwritten, and returns an error counting them. Close
// does not close the store or the sinks. Later calls (Close or CloseWith)
// return the first result.
func (r *Recorder) Close(ctx context.Context) error {
	r.closeOnce.Do(func() { r.closeErr = r.close(ctx, nil) })
	return r.closeErr
}

// CloseWith is Close with a last event: once everything accepted is
// written, final is appended on its own, durably, as the last event of
// this Recorder (a gateway's gateway.stopped), and delivered to the sinks.
// Close fills its EventID and OccurredAt when empty and sets its details
// "committed" (the events this Recorder wrote before it). When Close gives
// up, or the append of final fails, final is kept last in Unwritten, with
// details "unwritten" (how many events are kept before it) and a reason
// saying that the store could not take it at shutdown, so that the spill
// file carries it.
func (r *Recorder) CloseWith(ctx context.Context, final Event) error {
	r.closeOnce.Do(func() { r.closeErr = r.close(ctx, &final) })
	return r.closeErr
}

func (r *Recorder) close(ctx context.Context, final *Event) error {
	r.mu.Lock()
	r.closed = true
	r.force = true
	r.mu.Unlock()
	close(r.quit)
	var errs []error
	select {
	case <-r.writerDone:
	case <-ctx.Done():
		r.abortCancel()
		<-r.writerDone
	}
	r.mu.Lock()
	for _, it := range r.queued {
		r.unwritten = append(r.unwritten, it.ev)
	}
	r.queued, r.queuedBytes = nil, 0
	if r.overflow.n > 0 {
		// Handed over with the rest; not reported to OnState as the end
		// of the overflow (it is not written).
		r.unwritten = append(r.unwritten, r.overflowEventLocked())
		r.state.Overflowing = false
	}
	lost := len(r.unwritten)
	storeErr := r.err
	r.mu.Unlock()
	if lost > 0 {
		errs = append(errs, fmt.Errorf("audit: close: %d events not written: %w (last store error: %v)", lost, ctx.Err(), storeErr))
	}
	if final != nil {
		if err := r.writeFinal(ctx, *final, lost); err != nil {
			errs = append(errs, err)
		}
	}
	for _, w := range r.sinks {
		close(w.in)
	}
	for _, w := range r.sinks {
		select {
		case <-w.done:
		case <-ctx.Done():
			r.sinkCancel()
			<-w.done
		}
	}
	r.sinkCancel()
	r.abortCancel()
	close(r.stateQuit)
	select {
	case <-r.stateDone:
	case <-ctx.Done():
	}
	return errors.Join(errs...)
}

// writeFinal appends CloseWith's final event when nothing is left
// unwritten (lost == 0), or keeps it last in Unwritten; the writer has
// stopped.
func (r *Recorder) writeFinal(ctx context.Context, ev Event, lost int) error {
	ev, _, err := r.prepare(ev)
	if err != nil {
		ev.Details = map[string]any{"details_error": err.Error()}
	}
	if ev.Details == nil {
		ev.Details = map[string]any{}
	}
	ev.Details["committed"] = r.committed.Load()
	// keep puts ev last in Unwritten, after the n events there.
	keep := func(n int, why error) error {
		ev.Details["unwritten"] = n
		ev.Reason = strings.TrimSuffix(ev.Reason, ".") + fmt.Sprintf("; the audit store could not take this event at shutdown (%v), so it and the %d events before it were kept for the spill file and written at the next start", why, n)
		ev, _ = normalize(ev)
		r.mu.Lock()
		r.unwritten = append(r.unwritten, ev)
		r.mu.Unlock()
		return fmt.Errorf("audit: close: the final event %s (%s) not written: %w", ev.EventID, ev.EventType, why)
	}
	if lost > 0 || ctx.Err() != nil {
		cause := r.Err()
		if cause == nil {
			cause = ctx.Err()
		}
		if cause == nil {
			cause = errors.New("events are left unwritten")
		}
		return keep(lost, cause)
	}
	ev, _ = normalize(ev)
	stop := context.AfterFunc(ctx, r.abortCancel)
	sealed, err := r.write([]Event{ev})
	stop()
	r.finish(nil, 0, sealed, err)
	if err != nil {
		// finish queued the audit.store_failed event of this failure: it
		// goes first.
		r.mu.Lock()
		for _, it := range r.queued {
			r.unwritten = append(r.unwritten, it.ev)
		}
		r.queued, r.queuedBytes = nil, 0
		n := len(r.unwritten)
		r.mu.Unlock()
		return keep(n, err)
	}
	return nil
}

// Unwritten returns, after Close gave up, the events it could not write, in
// the order they were accepted, the overflow summary last: for the caller
// to keep (WriteSpill) and append later. It is empty before Close and
// after a Close that wrote everything.
func (r *Recorder) Unwritten() []Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.unwritten)
}

// Err returns the last store error, or nil when the last append succeeded.
func (r *Recorder) Err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

// Health returns why the Recorder cannot take an event that must be durable
// now (as Admit does): closed, the store failing, an append running longer
// than StallAfter, or the backlog full. A gateway reports not-ready while it
// is non-nil.
func (r *Recorder) Health() error {
	return r.Admit()
}

// Stats returns a snapshot of the counters.
func (r *Recorder) Stats() RecorderStats {
	r.mu.Lock()
	st := RecorderStats{Pending: len(r.queued) + len(r.durable), QueuedBytes: r.queuedBytes, Overflowed: r.overflow.n,
		Stalled: r.stalled, Err: r.err}
	r.mu.Unlock()
	st.Committed = r.committed.Load()
	st.Batches = r.batches.Load()
	st.Failures = r.failures.Load()
	for _, w := range r.sinks {
		st.SinkDropped += w.dropped.Load()
		st.SinkErrors += w.errors.Load()
	}
	return st
}

// prepare fills the id and time and normalizes ev; it returns the event's
// size as the queue counts it (its strings and details, plus a fixed
// overhead for the envelope).
func (r *Recorder) prepare(ev Event) (Event, int, error) {
	if ev.EventID == "" {
		ev.EventID = r.opts.NewEventID()
	}
	if ev.OccurredAt.IsZero() {
		ev.OccurredAt = r.opts.Now()
	}
	ev.Seq, ev.PrevHash, ev.Hash = 0, "", ""
	ev, err := normalize(ev)
	size := eventSize(ev)
	if err != nil {
		return ev, size, fmt.Errorf("audit: event %s: %w", ev.EventID, err)
	}
	return ev, size, nil
}

// eventOverhead approximates an event's fixed cost in bytes: the envelope's
// keys, hashes, seq and time as stored, and its Go headers in memory.
const eventOverhead = 512

func eventSize(ev Event) int {
	n := eventOverhead
	for _, s := range []string{ev.EventID, ev.EventType, ev.CorrelationID, ev.CausationID, ev.AgentID, ev.AgentVersion,
		ev.Principal, ev.InstanceID, ev.Environment, ev.ToolID, ev.ToolName, ev.Verdict, ev.Code, ev.Layer, ev.Reason,
		ev.ArgsDigest, ev.ApprovalID, ev.DeploymentMode, ev.OutputDigest} {
		n += len(s)
	}
	if len(ev.Details) > 0 {
		n += detailsSize(ev.Details)
	}
	return n
}

// detailsSize approximates the encoded size of normalized details.
func detailsSize(v any) int {
	switch x := v.(type) {
	case map[string]any:
		n := 2
		for k, e := range x {
			n += len(k) + 4 + detailsSize(e)
		}
		return n
	case []any:
		n := 2
		for _, e := range x {
			n += 1 + detailsSize(e)
		}
		return n
	case string:
		return len(x) + 2
	default:
		return 8
	}
}

func (r *Recorder) signal() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// run is the single writer.
func (r *Recorder) run() {
	defer r.finishWriter()
	var retry <-chan time.Time
	delay := r.opts.RetryMin
	quit := r.quit
	closing := false
	for {
		timerFired := false
		select {
		case <-r.wake:
		case <-retry:
			retry, timerFired = nil, true
		case <-quit:
			quit, closing = nil, true
		case <-r.abortCtx.Done():
			return
		}
		if r.abortCtx.Err() != nil {
			return
		}
		for {
			batch, ws, nq, ok := r.take(timerFired)
			if !ok {
				break
			}
			timerFired = false
			sealed, err := r.write(batch)
			r.finish(ws, nq, sealed, err)
			if err != nil {
				if retry == nil {
					retry = time.After(delay)
					delay = min(2*delay, r.opts.RetryMax)
				}
				break
			}
			delay, retry = r.opts.RetryMin, nil
		}
		if closing && r.empty() {
			return
		}
		if closing && retry == nil {
			// Something is left but no retry is scheduled (we were woken
			// with nothing to do); try again.
			r.signal()
		}
	}
}

func (r *Recorder) empty() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.queued) == 0 && len(r.durable) == 0 && r.overflow.n == 0
}

// entry is one event of a batch being assembled.
type entry struct {
	admit uint64
	ev    Event
	w     *waiter
}

// take picks the next batch: every waiting Record (up to MaxBatch), then
// queued events oldest first, ordered by admission so the chain records
// events in the order they were accepted. While the store is failing and
// nothing forces an attempt (a Record waiter, Flush, Close, or the retry
// timer), it returns !ok. It adds the overflow summary to the queue once
// the store writes and the queue has drained to half its bounds.
func (r *Recorder) take(timerFired bool) (batch []Event, ws []*waiter, nq int, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	// Drop abandoned waiters; they count as resolved.
	kept := r.durable[:0]
	for _, w := range r.durable {
		if w.state.Load() == abandoned {
			r.durResolved++
			continue
		}
		kept = append(kept, w)
	}
	clear(r.durable[len(kept):])
	r.durable = kept
	if r.overflow.n > 0 && r.err == nil && 2*len(r.queued) <= r.opts.MaxQueued && 2*r.queuedBytes <= r.opts.MaxQueuedBytes {
		ev := r.overflowEventLocked()
		r.queueLocked(ev, eventSize(ev))
		r.noteStateLocked()
	}
	if len(r.durable) == 0 && len(r.queued) == 0 {
		r.force = false
		r.broadcastLocked()
		return nil, nil, 0, false
	}
	if r.err != nil && !timerFired && !r.force && len(r.durable) == 0 {
		return nil, nil, 0, false
	}
	r.force = false
	entries := make([]entry, 0, min(r.opts.MaxBatch, len(r.durable)+len(r.queued)))
	n := 0
	for n < len(r.durable) && len(entries) < r.opts.MaxBatch {
		w := r.durable[n]
		n++
		if !w.state.CompareAndSwap(waiting, taken) {
			r.durResolved++ // abandoned just now
			continue
		}
		entries = append(entries, entry{admit: w.admit, ev: w.ev, w: w})
	}
	for nq < len(r.queued) && len(entries) < r.opts.MaxBatch {
		entries = append(entries, entry{admit: r.queued[nq].admit, ev: r.queued[nq].ev})
		nq++
	}
	// Remove what was taken from the durable queue now: a waiter gets its
	// answer from this attempt, success or failure.
	clear(r.durable[:n])
	r.durable = r.durable[n:]
	if len(entries) == 0 {
		r.broadcastLocked()
		return nil, nil, 0, false
	}
	slices.SortFunc(entries, func(a, b entry) int {
		switch {
		case a.admit < b.admit:
			return -1
		case a.admit > b.admit:
			return 1
		}
		return 0
	})
	batch = make([]Event, len(entries))
	for i, e := range entries {
		batch[i] = e.ev
		if e.w != nil {
			e.w.pos = i
			ws = append(ws, e.w)
		}
	}
	return batch, ws, nq, true
}

// write runs one store append, marking the store stalled when it runs
// longer than StallAfter.
func (r *Recorder) write(batch []Event) ([]Event, error) {
	r.mu.Lock()
	r.writing = true
	r.writeGen++
	gen := r.writeGen
	r.mu.Unlock()
	start := r.opts.Now()
	timer := time.AfterFunc(r.opts.StallAfter, func() { r.markStalled(gen, start) })
	ctx, cancel := context.WithTimeout(r.abortCtx, r.opts.WriteTimeout)
	sealed, err := r.store.AppendEvents(ctx, batch)
	cancel()
	timer.Stop()
	r.mu.Lock()
	r.writing = false
	if r.stalled {
		r.stalled, r.stallErr, r.stallSince = false, nil, time.Time{}
		r.noteStateLocked()
	}
	r.mu.Unlock()
	if err == nil && len(sealed) != len(batch) {
		err = fmt.Errorf("audit: store returned %d events for a batch of %d", len(sealed), len(batch))
	}
	return sealed, err
}

// markStalled marks append gen stalled if it is still running.
func (r *Recorder) markStalled(gen uint64, start time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.writing || r.writeGen != gen || r.stalled {
		return
	}
	r.stalled = true
	r.stallSince = start
	r.stallErr = fmt.Errorf("a store append has been running since %s, longer than %s", start.UTC().Format(time.RFC3339Nano), r.opts.StallAfter)
	close(r.stallCh)
	r.stallCh = make(chan struct{})
	r.noteStateLocked()
}

func (r *Recorder) finish(ws []*waiter, nq int, sealed []Event, err error) {
	r.mu.Lock()
	r.durResolved += uint64(len(ws))
	var notify []chan error
	if err != nil {
		if r.err == nil {
			// The first failure of an outage: an event says so, written
			// first once the store can write again (and it keeps the queue
			// non-empty, so the retries go on until then).
			r.failedAt = r.opts.Now()
			fe := Event{EventID: r.opts.NewEventID(), EventType: string(toolgate.EventAuditStoreFailed), OccurredAt: r.failedAt,
				Reason:  fmt.Sprintf("the audit store could not write from %s: %v; calls that would run or ask for approval were refused meanwhile (internal_error), denials were answered; the events queued meanwhile follow (those that did not fit in the backlog are counted in an audit.backlog_overflow summary)", r.failedAt.UTC().Format(time.RFC3339Nano), err),
				Details: map[string]any{"error": err.Error()}}
			fe, _ = normalize(fe)
			r.queueLocked(fe, eventSize(fe))
		}
		r.err = fmt.Errorf("audit: store append failed: %w", err)
		r.failures.Add(1)
		for i := range r.queued[:nq] {
			if ch := r.queued[i].notify; ch != nil {
				notify = append(notify, ch)
				r.queued[i].notify = nil
			}
		}
	} else {
		r.err = nil
		for _, it := range r.queued[:nq] {
			r.queuedBytes -= it.size
			if it.notify != nil {
				notify = append(notify, it.notify)
			}
		}
		clear(r.queued[:nq])
		r.queued = r.queued[nq:]
		if len(r.queued) == 0 {
			r.queued, r.queuedBytes = nil, 0
		}
		r.enqCommitted += uint64(nq)
		r.committed.Add(uint64(len(sealed)))
		r.batches.Add(1)
	}
	storeErr := r.err
	r.noteStateLocked()
	r.broadcastLocked()
	r.mu.Unlock()
	for _, ch := range notify {
		ch <- storeErr
	}
	for _, w := range ws {
		if err != nil {
			w.done <- result{err: storeErr}
		} else {
			w.done <- result{ev: sealed[w.pos]}
		}
	}
	if err == nil {
		for _, s := range r.sinks {
			s.offer(r, sealed)
		}
	}
}

// stateLocked returns the current State; r.mu must be held.
func (r *Recorder) stateLocked() State {
	s := State{Failing: r.err != nil, Stalled: r.stalled, Overflowing: r.overflow.n > 0}
	if s.Failing {
		s.Err, s.FailingSince = r.err, r.failedAt
	}
	if s.Stalled {
		if s.Err == nil {
			s.Err = r.stallErr
		}
		s.StalledSince = r.stallSince
	}
	if s.Overflowing {
		s.OverflowingSince = r.overflow.since
	}
	return s
}

// State returns the Recorder's current state.
func (r *Recorder) State() State {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stateLocked()
}

// noteStateLocked queues a report for OnState when the state changed
// since the last one; r.mu must be held.
func (r *Recorder) noteStateLocked() {
	if r.opts.OnState == nil {
		return
	}
	s := r.stateLocked()
	if s.Failing == r.state.Failing && s.Stalled == r.state.Stalled && s.Overflowing == r.state.Overflowing {
		return
	}
	if n := len(r.transitions); n >= maxPendingStates {
		r.transitions[n-1][1] = s // merged with the newest waiting change
	} else {
		r.transitions = append(r.transitions, [2]State{r.state, s})
	}
	r.state = s
	select {
	case r.stateWake <- struct{}{}:
	default:
	}
}

// notifyStates calls OnState with each state change, in order, until
// Close (after which it delivers what is left and stops).
func (r *Recorder) notifyStates() {
	defer close(r.stateDone)
	for {
		select {
		case <-r.stateWake:
			r.deliverStates()
		case <-r.stateQuit:
			r.deliverStates()
			return
		}
	}
}

func (r *Recorder) deliverStates() {
	for {
		r.mu.Lock()
		ts := r.transitions
		r.transitions = nil
		r.mu.Unlock()
		if len(ts) == 0 {
			return
		}
		for _, t := range ts {
			r.opts.OnState(t[0], t[1])
		}
	}
}

// broadcastLocked wakes Flush callers; r.mu must be held.
func (r *Recorder) broadcastLocked() {
	close(r.progress)
	r.progress = make(chan struct{})
}

// finishWriter fails the Record calls still waiting when the writer stops.
func (r *Recorder) finishWriter() {
	r.mu.Lock()
	ws := r.durable
	r.durable = nil
	r.durResolved += uint64(len(ws))
	r.broadcastLocked()
	r.mu.Unlock()
	for _, w := range ws {
		if w.state.CompareAndSwap(waiting, taken) {
			w.done <- result{err: ErrClosed}
		}
	}
	close(r.writerDone)
}

type sinkWorker struct {
	sink    Sink
	in      chan []Event
	done    chan struct{}
	dropped atomic.Uint64
	errors  atomic.Uint64
}

func (w *sinkWorker) offer(r *Recorder, evs []Event) {
	select {
	case w.in <- evs:
	default:
		w.dropped.Add(uint64(len(evs)))
		if r.opts.OnSinkError != nil {
			r.opts.OnSinkError(w.sink, ErrSinkOverflow)
		}
	}
}

func (w *sinkWorker) run(r *Recorder) {
	defer close(w.done)
	for evs := range w.in {
		if r.sinkCtx.Err() != nil {
			w.dropped.Add(uint64(len(evs)))
			continue
		}
		if err := w.sink.Write(r.sinkCtx, evs); err != nil {
			w.errors.Add(1)
			if r.opts.OnSinkError != nil {
				r.opts.OnSinkError(w.sink, err)
			}
		}
	}
}
