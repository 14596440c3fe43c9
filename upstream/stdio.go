package upstream

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// stdioTransport runs a stdio upstream as mcp.CommandTransport does, with
// a guard between the process and the SDK: every line the server prints is
// checked (guard, frame) before the SDK reads it, so that a line that is
// not one JSON-RPC message, or is too large, is refused on its own instead
// of ending the session (the SDK's reader stops at the first bad line), and
// a result is never buffered beyond its limit.
//
// Messages are one per line, as the MCP stdio transport requires (no
// embedded newlines); a message spread over several lines is refused line
// by line.
type stdioTransport struct {
	cmd *exec.Cmd
	g   *guard
}

// stdioReadBuffer is the chunk size lines are read in.
const stdioReadBuffer = 64 << 10

// Connect starts the command and connects to it over its stdin and stdout.
func (t *stdioTransport) Connect(ctx context.Context) (mcp.Connection, error) {
	stdout, err := t.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	stdin, err := t.cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	if err := t.cmd.Start(); err != nil {
		return nil, err
	}
	r := &stdioReader{f: frame{g: t.g}, src: bufio.NewReaderSize(stdout, stdioReadBuffer)}
	w := &stdioWriter{cmd: t.cmd, stdin: stdin, g: t.g}
	// No bound of the SDK's own: the reader passes nothing larger than the
	// guard's limits, which may grow after the session started
	// (SetMaxResultBytes), and a fixed bound here would end the session.
	return (&mcp.IOTransport{Reader: r, Writer: w, MaxLineLength: -1}).Connect(ctx)
}

// stdioReader passes on the server's output line by line, each line checked
// by the frame: the line as printed, a refusal in its place, or nothing.
type stdioReader struct {
	f   frame
	src *bufio.Reader
	out []byte // what is left of the line being passed on
	err error
}

func (r *stdioReader) Read(p []byte) (int, error) {
	for len(r.out) == 0 {
		if r.err != nil {
			return 0, r.err
		}
		r.next()
	}
	n := copy(p, r.out)
	r.out = r.out[n:]
	return n, nil
}

// next reads lines until one is passed on, or the output ends.
func (r *stdioReader) next() {
	for {
		chunk, err := r.src.ReadSlice('\n')
		r.f.write(bytes.TrimSuffix(chunk, []byte("\n")))
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if d, derr := r.f.end(); derr == nil {
			r.out = append(d.data, '\n')
		}
		if err != nil {
			r.err = err
			return
		}
		if len(r.out) > 0 {
			return
		}
	}
}

// Close does not close the server's stdout: the session ends by closing
// its stdin (stdioWriter.Close).
func (r *stdioReader) Close() error { return nil }

// stdioWriter writes the SDK's messages to the server's stdin, telling the
// guard about each request; closing it stops the server.
type stdioWriter struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	g     *guard

	once sync.Once
	err  error
}

func (w *stdioWriter) Write(p []byte) (int, error) {
	w.g.sent(p)
	return w.stdin.Write(p)
}

// Close ends the server as the MCP stdio transport says: close its stdin,
// wait up to stopGrace for it to exit, then SIGTERM, then SIGKILL (conn.close
// then kills its whole process group).
func (w *stdioWriter) Close() error {
	w.once.Do(func() {
		if err := w.stdin.Close(); err != nil {
			w.err = fmt.Errorf("closing stdin: %w", err)
			return
		}
		done := make(chan error, 1)
		go func() { done <- w.cmd.Wait() }()
		wait := func() (error, bool) {
			t := time.NewTimer(stopGrace)
			defer t.Stop()
			select {
			case err := <-done:
				return err, true
			case <-t.C:
				return nil, false
			}
		}
		if err, ok := wait(); ok {
			w.err = err
			return
		}
		if w.cmd.Process.Signal(syscall.SIGTERM) == nil {
			if err, ok := wait(); ok {
				w.err = err
				return
			}
		}
		_ = w.cmd.Process.Kill()
		if err, ok := wait(); ok {
			w.err = err
			return
		}
		w.err = errors.New("unresponsive subprocess")
	})
	return w.err
}
