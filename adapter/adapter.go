// Package adapter is the execution half of the Tool Abstraction layer: once a
// call is allowed, it runs it with the tool's timeout, retries it only where
// its side-effect class makes a retry safe, and caps what it returns (Tool
// Abstraction seed, "Retries"; docs/design.md, "Vocabulary" and "Where a call goes").
//
// The retry rules, by side-effect class:
//
//   - none and read: retried on a transient failure.
//   - write: retried on a transient failure only when the tool is declared
//     idempotent (Tool.idempotent: true).
//   - irreversible: never retried; one attempt, whatever happens.
//
// A transient failure is an attempt that timed out (the tool's per-attempt
// timeout, ErrTimeout) or an error the caller marked with Transient (an
// upstream that is down or lost its connection mid-call, a database
// connection that broke). A tool's own error result, a refusal, bad
// arguments and the caller's cancellation are never retried. Backoff is
// exponential with jitter; the clock, the sleep and the randomness are
// injected (Options), so tests control them.
//
// The package decides nothing: it runs what package gate allowed.
package adapter

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/toolgate/toolgate"
)

// Defaults for the zero fields of Policy.
const (
	// DefaultMaxAttempts is the number of attempts (the first one included)
	// of a retryable tool that declares no retry.max_attempts.
	DefaultMaxAttempts = 3
	// DefaultInitialBackoff is the wait before the second attempt.
	DefaultInitialBackoff = 200 * time.Millisecond
	// DefaultMaxBackoff caps the wait between attempts.
	DefaultMaxBackoff = 5 * time.Second
)

// Errors callers branch on with errors.Is.
var (
	// ErrTransient marks a failure that another attempt may not meet (see
	// Transient).
	ErrTransient = errors.New("transient failure")
	// ErrTimeout is an attempt that ran past Policy.Timeout. It is transient.
	ErrTimeout = errors.New("attempt timed out")
)

type transientError struct{ err error }

func (e *transientError) Error() string { return e.err.Error() }
func (e *transientError) Unwrap() []error {
	return []error{e.err, ErrTransient}
}

// Transient marks err as transient: errors.Is(Transient(err), ErrTransient)
// holds, and so does errors.Is for anything err wraps. It returns nil for
// nil.
func Transient(err error) error {
	if err == nil {
		return nil
	}
	return &transientError{err: err}
}

// IsTransient reports whether err is worth another attempt: marked with
// Transient, or an ErrTimeout.
func IsTransient(err error) bool {
	return errors.Is(err, ErrTransient) || errors.Is(err, ErrTimeout)
}

// Policy is how one tool is run: its side-effect class and idempotence
// (which say whether a retry is safe), its per-attempt timeout, and its
// retry bounds (Tool.timeout and Tool.retry in the bundle).
type Policy struct {
	// Class is the call's effective side-effect class.
	Class toolgate.SideEffectClass
	// Idempotent lets a write tool retry.
	Idempotent bool
	// Timeout bounds each attempt; 0 adds no bound of this layer's (the
	// upstream's call_timeout or the database's statement_timeout still
	// apply).
	Timeout time.Duration
	// MaxAttempts is the most attempts, the first included; 0 means
	// DefaultMaxAttempts. It has no effect on a tool that may not retry.
	MaxAttempts int
	// InitialBackoff is the wait before the second attempt (0:
	// DefaultInitialBackoff); each further wait doubles, up to MaxBackoff
	// (0: DefaultMaxBackoff). The wait slept is drawn from [d/2, d].
	InitialBackoff, MaxBackoff time.Duration
}

// MayRetry reports whether the class allows another attempt after a
// transient failure: none and read always, write only when idempotent,
// irreversible never.
func (p Policy) MayRetry() bool {
	switch p.Class {
	case toolgate.SideEffectNone, toolgate.SideEffectRead:
		return true
	case toolgate.SideEffectWrite:
		return p.Idempotent
	}
	return false
}

// Attempts returns the most attempts this policy makes: 1 for a tool that
// may not retry, else MaxAttempts or DefaultMaxAttempts.
func (p Policy) Attempts() int {
	switch {
	case !p.MayRetry():
		return 1
	case p.MaxAttempts > 0:
		return p.MaxAttempts
	}
	return DefaultMaxAttempts
}

// Backoff returns the un-jittered wait after failed attempt n (1-based):
// InitialBackoff doubled n-1 times, at most MaxBackoff.
func (p Policy) Backoff(n int) time.Duration {
	d, top := p.InitialBackoff, p.MaxBackoff
	if d <= 0 {
		d = DefaultInitialBackoff
	}
	if top <= 0 {
		top = DefaultMaxBackoff
	}
	for i := 1; i < n && d < top; i++ {
		d *= 2
	}
	return min(d, top)
}

// Attempt is the account of one attempt, for the completion event.
type Attempt struct {
	// N is the attempt's number, from 1.
	N int `json:"attempt"`
	// Error is why it failed ("" when it succeeded).
	Error string `json:"error,omitempty"`
	// Transient says the failure was worth another attempt.
	Transient bool `json:"transient,omitempty"`
	// Duration is how long the attempt ran.
	Duration time.Duration `json:"-"`
	// DurationMS is Duration in milliseconds.
	DurationMS int64 `json:"duration_ms"`
	// BackoffMS is the wait slept before the next attempt, in milliseconds
	// (0 for the last attempt).
	BackoffMS int64 `json:"backoff_ms,omitempty"`
}

// Options injects the clock, the sleep and the jitter. nil and zero fields
// mean the real ones.
type Options struct {
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Sleep waits d or until ctx is done (returning ctx.Err()); nil means a
	// timer.
	Sleep func(ctx context.Context, d time.Duration) error
	// Rand returns a number in [0, 1) for the jitter; nil means
	// math/rand/v2.Float64.
	Rand func() float64
}

// Runner runs attempts under a Policy. It is safe for concurrent use.
type Runner struct {
	now   func() time.Time
	sleep func(ctx context.Context, d time.Duration) error
	rand  func() float64
}

// New returns a Runner; opts may be nil.
func New(opts *Options) *Runner {
	r := &Runner{now: time.Now, sleep: sleepTimer, rand: rand.Float64}
	if opts != nil {
		if opts.Now != nil {
			r.now = opts.Now
		}
		if opts.Sleep != nil {
			r.sleep = opts.Sleep
		}
		if opts.Rand != nil {
			r.rand = opts.Rand
		}
	}
	return r
}

func sleepTimer(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Do calls fn until it succeeds, fails in a way that is not transient, the
// policy allows no more attempts, or ctx ends. Each call gets a context
// bounded by p.Timeout; an attempt that runs past it fails with an error
// wrapping ErrTimeout (and context.DeadlineExceeded). It returns the
// account of every attempt and the last attempt's error (nil on success).
// When ctx ends while waiting to retry, the error is the last attempt's,
// joined with ctx.Err().
func (r *Runner) Do(ctx context.Context, p Policy, fn func(ctx context.Context) error) ([]Attempt, error) {
	limit := p.Attempts()
	var log []Attempt
	for n := 1; ; n++ {
		start := r.now()
		err := r.attempt(ctx, p.Timeout, fn)
		a := Attempt{N: n, Duration: r.now().Sub(start)}
		a.DurationMS = a.Duration.Milliseconds()
		if err == nil {
			return append(log, a), nil
		}
		a.Error, a.Transient = err.Error(), IsTransient(err) && ctx.Err() == nil
		if !a.Transient || n >= limit {
			return append(log, a), err
		}
		d := p.Backoff(n)
		half := d / 2
		d = half + time.Duration(r.rand()*float64(d-half))
		a.BackoffMS = d.Milliseconds()
		log = append(log, a)
		if serr := r.sleep(ctx, d); serr != nil {
			return log, errors.Join(err, serr)
		}
	}
}

// attempt runs fn once under timeout, turning its own deadline into
// ErrTimeout and a panic into an error.
func (r *Runner) attempt(ctx context.Context, timeout time.Duration, fn func(ctx context.Context) error) (err error) {
	actx := ctx
	if timeout > 0 {
		var cancel context.CancelFunc
		actx, cancel = context.WithTimeoutCause(ctx, timeout, ErrTimeout)
		defer cancel()
	}
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("the tool panicked: %v", p)
		}
	}()
	err = fn(actx)
	if err != nil && ctx.Err() == nil && actx.Err() != nil && errors.Is(context.Cause(actx), ErrTimeout) {
		err = fmt.Errorf("%w after %s: %w", ErrTimeout, timeout, err)
	}
	return err
}
