package upstream

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"mime"
	"net/http"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
)

// guardTransport is the http.RoundTripper of a streamable-http upstream's
// session (the SDK client's and the direct path's, direct.go): every answer
// body is read through the session's guard, so that each message in it is
// checked and bounded before anyone decodes it. A JSON body is one message
// (the answer to the POSTed request); an event stream is checked event by
// event. A message the guard refuses is replaced (an answer: by a refusal
// for its request) or dropped, never passed on, and the SDK never sees
// anything that would make it end the session.
type guardTransport struct {
	base http.RoundTripper
	g    *guard
}

// maxErrorBody bounds a non-2xx answer's body (the SDK reads it whole to
// find a JSON-RPC error in it).
const maxErrorBody = 64 << 10

func (t *guardTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	var (
		call   jsonrpc.ID
		method string
		isCall bool
	)
	if r.Method == http.MethodPost && r.Body != nil && r.Body != http.NoBody {
		body, err := requestBody(r)
		if err != nil {
			return nil, err
		}
		call, method, isCall = t.g.sent(body)
	}
	resp, err := t.base.RoundTrip(r)
	if err != nil {
		if isCall {
			t.g.take(call)
		}
		return nil, err
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		if isCall {
			t.g.take(call)
		}
		resp.Body = limitedBody{io.LimitReader(resp.Body, maxErrorBody), resp.Body}
		return resp, nil
	}
	mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	f := frame{g: t.g}
	if isCall {
		f.call, f.callMethod = call, method
	}
	switch {
	case mt == "application/json" && isCall:
		resp.Body = &jsonBody{src: resp.Body, f: f}
	case mt == "text/event-stream":
		resp.Body = &sseBody{src: resp.Body, r: bufio.NewReaderSize(resp.Body, stdioReadBuffer), f: f}
	default:
		// Nothing the SDK reads as messages (202 Accepted, an answer to a
		// notification, a content type it refuses): bounded.
		resp.Body = limitedBody{io.LimitReader(resp.Body, maxErrorBody), resp.Body}
	}
	resp.ContentLength = -1
	resp.Header.Del("Content-Length")
	return resp, nil
}

// requestBody returns the request's body without consuming it.
func requestBody(r *http.Request) ([]byte, error) {
	if r.GetBody != nil {
		rc, err := r.GetBody()
		if err != nil {
			return nil, err
		}
		defer rc.Close()
		return io.ReadAll(rc)
	}
	b, err := io.ReadAll(r.Body)
	r.Body.Close()
	if err != nil {
		return nil, err
	}
	r.Body = io.NopCloser(bytes.NewReader(b))
	return b, nil
}

type limitedBody struct {
	io.Reader
	c io.Closer
}

func (b limitedBody) Close() error { return b.c.Close() }

// jsonBody is a JSON answer read through the frame on its first Read: the
// answer as sent, or a refusal for the request in its place.
type jsonBody struct {
	src  io.ReadCloser
	f    frame
	once sync.Once
	out  *bytes.Reader
	err  error
}

func (b *jsonBody) fill() {
	buf := make([]byte, 32<<10)
	for {
		n, err := b.src.Read(buf)
		b.f.write(buf[:n])
		if err == io.EOF {
			break
		}
		if err != nil {
			// The connection failed mid-answer: a transport failure, as
			// without the guard.
			b.f.end()
			b.err = err
			return
		}
	}
	g, call, method := b.f.g, b.f.call, b.f.callMethod
	d, err := b.f.end()
	switch {
	case err != nil:
		g.take(call)
		d.data = g.malformed(call, method, "not a JSON-RPC message")
	case !d.answer || d.id != call:
		g.refuse(RefusedMalformed, len(d.data), d.data, "a JSON answer that is not the response to the request")
		if d.answer {
			g.take(call)
		}
		d.data = g.malformed(call, method, "a JSON answer that is not the response to the request")
	}
	b.out = bytes.NewReader(d.data)
}

func (b *jsonBody) Read(p []byte) (int, error) {
	b.once.Do(b.fill)
	if b.err != nil {
		return 0, b.err
	}
	return b.out.Read(p)
}

func (b *jsonBody) Close() error { return b.src.Close() }

// sseBody is an event stream read event by event: each event's data goes
// through the frame, and the event is passed on (with its id, so that the
// reader can resume after it) carrying the message as sent, a refusal in
// its place, or no data. Events other than "message" events are passed on
// without their data (the SDK ignores them).
type sseBody struct {
	src io.ReadCloser
	r   *bufio.Reader
	f   frame

	// the event being read
	id      []byte
	hasID   bool
	name    []byte
	hasData bool
	retry   []byte

	out []byte
	err error
}

// maxSSEField bounds an SSE field other than data (id, event, retry); a
// longer one is ignored.
const maxSSEField = 4 << 10

func (b *sseBody) Read(p []byte) (int, error) {
	for len(b.out) == 0 {
		if b.err != nil {
			return 0, b.err
		}
		b.next()
	}
	n := copy(p, b.out)
	b.out = b.out[n:]
	return n, nil
}

func (b *sseBody) Close() error { return b.src.Close() }

// next reads lines until an event is ready to pass on, or the stream ends.
func (b *sseBody) next() {
	for {
		line, err := b.line()
		if err != nil {
			if b.hasData || b.hasID {
				b.dispatch() // an unterminated last event, as the SDK reads it
			}
			b.err = err
			return
		}
		if line {
			if len(b.out) > 0 {
				return
			}
			continue
		}
	}
}

// line reads one line and handles it; it reports whether the line was blank
// (then the event ended and was dispatched into b.out, which may stay
// empty). A line of any length is read in chunks: only data goes on, into
// the frame, which bounds it.
func (b *sseBody) line() (blank bool, err error) {
	chunk, err := b.r.ReadSlice('\n')
	more := errors.Is(err, bufio.ErrBufferFull) // the line goes on
	if err != nil && !more && len(chunk) == 0 {
		return false, err
	}
	final := err // nil, ErrBufferFull, or the error after a last unterminated line
	if more {
		final = nil
	}
	trim := func(c []byte, last bool) []byte {
		if last {
			return bytes.TrimRight(c, "\r\n")
		}
		return c
	}
	// rest passes the line's remaining chunks to fn.
	rest := func(fn func([]byte)) error {
		for more {
			c, err := b.r.ReadSlice('\n')
			more = errors.Is(err, bufio.ErrBufferFull)
			fn(trim(c, !more))
			if err != nil && !more {
				return err
			}
		}
		return nil
	}
	first := trim(chunk, !more)
	if len(first) == 0 && !more && final == nil {
		b.dispatch()
		return true, nil
	}
	field, value, hasColon := bytes.Cut(first, []byte(":"))
	if !hasColon {
		value = nil
	}
	value = bytes.TrimPrefix(value, []byte(" "))
	switch string(field) {
	case "data":
		if b.hasData {
			b.f.write([]byte("\n"))
		}
		b.hasData = true
		b.f.write(value)
		err = rest(b.f.write)
	case "id", "event", "retry":
		v := append([]byte(nil), value...)
		long := false
		err = rest(func(c []byte) {
			if len(v)+len(c) > maxSSEField {
				long = true
				return
			}
			v = append(v, c...)
		})
		if !long && len(v) <= maxSSEField && !bytes.ContainsAny(v, "\x00\r\n") {
			switch string(field) {
			case "id":
				b.id, b.hasID = v, true
			case "event":
				b.name = v
			case "retry":
				b.retry = v
			}
		}
	default: // a comment or an unknown field: skipped
		err = rest(func([]byte) {})
	}
	if err != nil {
		return false, err
	}
	return false, final
}

// dispatch ends the event being read and puts what to pass on in b.out.
func (b *sseBody) dispatch() {
	var data []byte
	if b.hasData {
		if len(b.name) == 0 || string(b.name) == "message" {
			if d, err := b.f.end(); err == nil {
				data = d.data
			}
		} else {
			b.f.end() // not a message: the SDK ignores it
		}
	}
	var out []byte
	if b.hasID {
		out = append(append(append(out, "id: "...), b.id...), '\n')
	}
	if len(b.retry) > 0 {
		out = append(append(append(out, "retry: "...), b.retry...), '\n')
	}
	if len(data) > 0 {
		for l := range bytes.SplitSeq(data, []byte("\n")) {
			out = append(append(append(out, "data: "...), l...), '\n')
		}
	}
	if len(out) > 0 {
		b.out = append(out, '\n')
	}
	b.id, b.hasID, b.name, b.hasData, b.retry = nil, false, nil, false, nil
}
