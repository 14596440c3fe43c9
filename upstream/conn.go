package upstream

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// stopGrace is how long closing a session waits for a stdio server to exit
// after its stdin is closed (and for an HTTP session's DELETE) before the
// process group is killed (or the HTTP session abandoned).
const stopGrace = 2 * time.Second

// conn is one live session with an upstream.
type conn struct {
	cs   *mcp.ClientSession
	g    *guard // checks what the upstream sends; counts the bytes
	pid  int    // stdio: the server's pid, which is also its process group id
	done chan struct{}
	// probe (capacity 1) asks for a health check now: a request on the
	// session failed (see failed).
	probe chan struct{}
	// ctx is the session's life in the supervisor: cancelled, with the
	// reason as its cause, by a failed health check, when serve is done
	// with the session, or when the Manager closes.
	ctx    context.Context
	cancel context.CancelCauseFunc
	// waitErr is cs.Wait's result; read only after done is closed.
	waitErr error
	// httpClient and endpoint are a streamable-http session's own client
	// (with the upstream's headers) and URL, for direct calls (direct.go);
	// nil and "" for stdio.
	httpClient *http.Client
	endpoint   string

	closeOnce sync.Once
}

// lost reports whether err, from a call on c, means the connection is gone:
// the SDK says so, the stream ended (the server died mid-call), or the
// session has already ended.
func (c *conn) lost(err error) bool {
	if errors.Is(err, mcp.ErrConnectionClosed) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return true
	}
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// suspect asks for a health check of the session now (non-blocking; a
// check already asked for and not yet started absorbs it).
func (c *conn) suspect() {
	select {
	case c.probe <- struct{}{}:
	default:
	}
}

// unreachable reports whether err says a request did not reach the server:
// an HTTP client or network error.
func unreachable(err error) bool {
	var (
		urlErr *url.Error
		netErr net.Error
	)
	return errors.As(err, &urlErr) || errors.As(err, &netErr)
}

// dial starts or reaches the upstream and runs the initialize handshake.
func (u *upstream) dial(ctx context.Context) (*conn, error) {
	var (
		t   mcp.Transport
		cmd *exec.Cmd
		hc  *http.Client
		g   *guard
	)
	switch u.cfg.Transport {
	case TransportStdio:
		env, err := u.env()
		if err != nil {
			return nil, err
		}
		cmd = exec.Command(u.cfg.Command, u.cfg.Args...)
		cmd.Env = env
		cmd.Dir = u.cfg.Dir
		cmd.Stderr = &lineLogger{log: u.log}
		// Own process group, so that Close can kill the server and anything
		// it started.
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		g = newGuard(u)
		t = &stdioTransport{cmd: cmd, g: g}
	case TransportStreamableHTTP:
		headers := make(http.Header, len(u.cfg.Headers))
		for _, k := range sortedKeys(u.cfg.Headers) {
			v, err := u.cfg.Headers[k].Resolve()
			if err != nil {
				return nil, fmt.Errorf("header %s: %w", k, err)
			}
			headers.Set(k, v)
		}
		base := http.DefaultTransport.(*http.Transport).Clone()
		g = newGuard(u)
		hc = &http.Client{Transport: &guardTransport{base: &headerTransport{base: base, headers: headers}, g: g}}
		t = &mcp.StreamableClientTransport{Endpoint: u.cfg.URL, HTTPClient: hc}
	default:
		return nil, fmt.Errorf("transport %q not supported", u.cfg.Transport)
	}

	cs, err := u.client.Connect(ctx, t, &mcp.ClientSessionOptions{ProtocolVersion: ProtocolVersion})
	if err != nil {
		if cmd != nil && cmd.Process != nil {
			killGroup(cmd.Process.Pid)
		}
		return nil, fmt.Errorf("connect: %w", err)
	}
	c := &conn{cs: cs, g: g, done: make(chan struct{}), probe: make(chan struct{}, 1), httpClient: hc}
	c.ctx, c.cancel = context.WithCancelCause(u.m.ctx)
	if hc != nil {
		c.endpoint = u.cfg.URL
	}
	if cmd != nil {
		c.pid = cmd.Process.Pid
	}
	go func() {
		c.waitErr = cs.Wait()
		close(c.done)
	}()
	return c, nil
}

// env builds a stdio server's environment: PATH and HOME of the gateway,
// then Config.Env. Nothing else of the gateway's environment is passed.
func (u *upstream) env() ([]string, error) {
	vals := map[string]string{}
	for _, k := range []string{"PATH", "HOME"} {
		if v, ok := os.LookupEnv(k); ok {
			vals[k] = v
		}
	}
	for _, k := range sortedKeys(u.cfg.Env) {
		v, err := u.cfg.Env[k].Resolve()
		if err != nil {
			return nil, fmt.Errorf("env %s: %w", k, err)
		}
		vals[k] = v
	}
	env := make([]string, 0, len(vals))
	for _, k := range sortedKeys(vals) {
		env = append(env, k+"="+vals[k])
	}
	return env, nil
}

// close ends the session: for stdio it closes stdin, waits up to stopGrace
// for the server to exit, then kills its process group (always, to catch
// children). Safe to call more than once and concurrently.
func (c *conn) close() {
	c.closeOnce.Do(func() {
		closed := make(chan struct{})
		go func() {
			_ = c.cs.Close()
			close(closed)
		}()
		t := time.NewTimer(stopGrace)
		defer t.Stop()
		select {
		case <-closed:
		case <-t.C:
		}
		if c.pid > 0 {
			killGroup(c.pid)
			<-closed // the SDK reaps the process once it is dead
		}
	})
}

// killGroup sends SIGKILL to the process group pgid; errors (the group is
// already gone) are ignored.
func killGroup(pgid int) {
	if pgid > 0 {
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
	}
}

// headerTransport sets fixed headers on every request.
type headerTransport struct {
	base    http.RoundTripper
	headers http.Header
}

func (h *headerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	for k, v := range h.headers {
		r.Header[k] = v
	}
	return h.base.RoundTrip(r)
}

// lineLogger logs a stdio server's stderr line by line at Debug level.
// Lines longer than 4 KiB are cut.
type lineLogger struct {
	log *slog.Logger
	mu  sync.Mutex
	buf []byte
}

const maxLogLine = 4 << 10

func (l *lineLogger) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf = append(l.buf, p...)
	for {
		i := bytes.IndexByte(l.buf, '\n')
		if i < 0 {
			if len(l.buf) > maxLogLine {
				l.emit(l.buf[:maxLogLine])
				l.buf = l.buf[:0]
			}
			return len(p), nil
		}
		l.emit(l.buf[:i])
		l.buf = l.buf[i+1:]
	}
}

func (l *lineLogger) emit(line []byte) {
	line = bytes.TrimRight(line, "\r")
	if len(line) > maxLogLine {
		line = line[:maxLogLine]
	}
	if len(line) > 0 {
		l.log.Debug("upstream stderr", "line", string(line))
	}
}
