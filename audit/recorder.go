package audit

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// RecorderOptions tunes a Recorder. The zero value (or nil) is valid; zero
// fields take the documented defaults.
type RecorderOptions struct {
	// MaxBatch is the most events written in one store transaction.
	// Default 512.
	MaxBatch int
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
	// Now is the clock used to fill an event's zero OccurredAt.
	// Default time.Now.
	Now func() time.Time
	// NewEventID makes the id of an event whose EventID is empty.
	// Default NewEventID (random UUID).
	NewEventID func() string
	// RetryMin and RetryMax bound the exponential backoff between attempts
	// to write queued events while the store is failing. Defaults 50 ms and
	// 5 s. A Record or Flush call always triggers an attempt at once.
	RetryMin, RetryMax time.Duration
	// WriteTimeout bounds one store append. Default 30 s.
	WriteTimeout time.Duration
	// EnqueueLinger is how long an enqueued event may wait for company
	// before a write is started for it: a Record in that window takes it
	// along in the same transaction, so a tool call's completion event
	// does not cost the next call an extra fsync. 0 means 50 ms; negative
	// means write at once.
	EnqueueLinger time.Duration
}

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

// RecorderStats is a snapshot of a Recorder's counters.
type RecorderStats struct {
	// Pending is the number of events accepted but not yet durable.
	Pending int
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
	// Err is the last store error, nil once an append succeeds again.
	Err error
}

// Recorder writes events to a Store with group commit.
//
// Record is for events that must be durable before the caller goes on (an
// allow decision, before the tool runs): concurrent Record calls share one
// store transaction, so N callers pay for one fsync. Enqueue is for events
// that must not delay the answer (denials): it returns at once and the same
// writer commits the event with the next batch.
//
// Queueing: Enqueue's queue is an unbounded in-memory FIFO; nothing is ever
// dropped while the process lives. While the store fails, queued events stay
// at the front of the queue and are retried with exponential backoff, and
// Err reports the failure so the gateway can report not-ready and deny. A
// crash loses what was queued and not yet committed (the answer to a denied
// call never depends on it); Record'ed events are never lost once Record
// returned nil.
//
// A Recorder is safe for concurrent use. Close it to drain the queue.
type Recorder struct {
	store Store
	opts  RecorderOptions
	sinks []*sinkWorker

	lingerArmed atomic.Bool

	mu           sync.Mutex
	durable      []*waiter
	queued       []Event
	queuedAdmit  []uint64 // admission order of queued, same length
	nextAdmit    uint64
	closed       bool
	force        bool // attempt at once even while failing (Flush asked)
	err          error
	durAdmitted  uint64
	durResolved  uint64
	enqAdmitted  uint64
	enqCommitted uint64
	progress     chan struct{}

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
		wake:       make(chan struct{}, 1),
		quit:       make(chan struct{}),
		writerDone: make(chan struct{}),
	}
	r.abortCtx, r.abortCancel = context.WithCancel(context.Background())
	r.sinkCtx, r.sinkCancel = context.WithCancel(context.Background())
	for _, s := range o.Sinks {
		w := &sinkWorker{sink: s, in: make(chan []Event, o.SinkQueue), done: make(chan struct{})}
		r.sinks = append(r.sinks, w)
		go w.run(r)
	}
	go r.run()
	return r
}

// Record writes ev and returns once it is durable, with Seq, PrevHash and
// Hash filled in. It fills an empty EventID and a zero OccurredAt. It
// returns an error, and the caller must then refuse the call, when the store
// fails, when Details cannot be encoded, after Close (ErrClosed), or when
// ctx ends first; in the last case the event may still be written later.
func (r *Recorder) Record(ctx context.Context, ev Event) (Event, error) {
	ev, err := r.prepare(ev)
	if err != nil {
		return Event{}, err
	}
	w := &waiter{ev: ev, done: make(chan result, 1)}
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return Event{}, ErrClosed
	}
	w.admit = r.nextAdmit
	r.nextAdmit++
	r.durable = append(r.durable, w)
	r.durAdmitted++
	r.mu.Unlock()
	r.signal()
	select {
	case res := <-w.done:
		return res.ev, res.err
	case <-ctx.Done():
		if w.state.CompareAndSwap(waiting, abandoned) {
			return Event{}, fmt.Errorf("audit: record %s: %w (not written)", ev.EventID, ctx.Err())
		}
		return Event{}, fmt.Errorf("audit: record %s: %w (may still be written)", ev.EventID, ctx.Err())
	}
}

// Enqueue accepts ev for writing and returns at once; the event is committed
// with the next batch and never dropped while the process runs (see the
// Recorder doc for the queue). Details that cannot be encoded are replaced
// by {"details_error": "..."} so the event is still recorded. The only error
// is ErrClosed, after Close.
func (r *Recorder) Enqueue(ev Event) error {
	ev, err := r.prepare(ev)
	if err != nil {
		ev.Details = map[string]any{"details_error": err.Error()}
	}
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return ErrClosed
	}
	r.queued = append(r.queued, ev)
	r.queuedAdmit = append(r.queuedAdmit, r.nextAdmit)
	r.nextAdmit++
	r.enqAdmitted++
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
// store fails), delivers the committed batches to the sinks, and returns.
// When ctx ends first it gives up: it returns an error counting the events
// that were not written, and fails Record calls still waiting. Close does
// not close the store or the sinks. Later calls return the first result.
func (r *Recorder) Close(ctx context.Context) error {
	r.closeOnce.Do(func() { r.closeErr = r.close(ctx) })
	return r.closeErr
}

func (r *Recorder) close(ctx context.Context) error {
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
	lost := len(r.queued) + len(r.durable)
	storeErr := r.err
	r.mu.Unlock()
	if lost > 0 {
		errs = append(errs, fmt.Errorf("audit: close: %d events not written: %w (last store error: %v)", lost, ctx.Err(), storeErr))
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
	return errors.Join(errs...)
}

// Err returns the last store error, or nil when the last append succeeded.
// A gateway reports not-ready while it is non-nil.
func (r *Recorder) Err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

// Stats returns a snapshot of the counters.
func (r *Recorder) Stats() RecorderStats {
	r.mu.Lock()
	st := RecorderStats{Pending: len(r.queued) + len(r.durable), Err: r.err}
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

func (r *Recorder) prepare(ev Event) (Event, error) {
	if ev.EventID == "" {
		ev.EventID = r.opts.NewEventID()
	}
	if ev.OccurredAt.IsZero() {
		ev.OccurredAt = r.opts.Now()
	}
	ev.Seq, ev.PrevHash, ev.Hash = 0, "", ""
	ev, err := normalize(ev)
	if err != nil {
		return ev, fmt.Errorf("audit: event %s: %w", ev.EventID, err)
	}
	return ev, nil
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
	return len(r.queued) == 0 && len(r.durable) == 0
}

// take picks the next batch: Record'ed events first (oldest first), then
// queued ones. While the store is failing and nothing forces an attempt
// (a Record waiter, Flush, Close, or the retry timer), it returns !ok.
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
	if len(r.durable) == 0 && len(r.queued) == 0 {
		r.force = false
		r.broadcastLocked()
		return nil, nil, 0, false
	}
	if r.err != nil && !timerFired && !r.force && len(r.durable) == 0 {
		return nil, nil, 0, false
	}
	r.force = false
	// Merge the durable waiters and the queued events in admission order,
	// so the chain records events in the order they happened.
	n := 0
	for len(batch) < r.opts.MaxBatch && (n < len(r.durable) || nq < len(r.queued)) {
		if nq < len(r.queued) && (n == len(r.durable) || r.queuedAdmit[nq] < r.durable[n].admit) {
			batch = append(batch, r.queued[nq])
			nq++
			continue
		}
		w := r.durable[n]
		n++
		if !w.state.CompareAndSwap(waiting, taken) {
			r.durResolved++ // abandoned just now
			continue
		}
		w.pos = len(batch)
		ws = append(ws, w)
		batch = append(batch, w.ev)
	}
	// Remove what was taken from the durable queue now: a waiter gets its
	// answer from this attempt, success or failure.
	clear(r.durable[:n])
	r.durable = r.durable[n:]
	if len(batch) == 0 {
		r.broadcastLocked()
		return nil, nil, 0, false
	}
	return batch, ws, nq, true
}

func (r *Recorder) write(batch []Event) ([]Event, error) {
	ctx, cancel := context.WithTimeout(r.abortCtx, r.opts.WriteTimeout)
	defer cancel()
	sealed, err := r.store.AppendEvents(ctx, batch)
	if err == nil && len(sealed) != len(batch) {
		err = fmt.Errorf("audit: store returned %d events for a batch of %d", len(sealed), len(batch))
	}
	return sealed, err
}

func (r *Recorder) finish(ws []*waiter, nq int, sealed []Event, err error) {
	r.mu.Lock()
	r.durResolved += uint64(len(ws))
	if err != nil {
		r.err = fmt.Errorf("audit: store append failed: %w", err)
		r.failures.Add(1)
	} else {
		r.err = nil
		clear(r.queued[:nq])
		r.queued = r.queued[nq:]
		r.queuedAdmit = r.queuedAdmit[nq:]
		if len(r.queued) == 0 {
			r.queued, r.queuedAdmit = nil, nil
		}
		r.enqCommitted += uint64(nq)
		r.committed.Add(uint64(len(sealed)))
		r.batches.Add(1)
	}
	storeErr := r.err
	r.broadcastLocked()
	r.mu.Unlock()
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
