package upstream

import (
	"bufio"
	"bytes"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
)

// fuzzGuard is a guard with small limits and a pending tools/call 1 and
// tools/list 2.
func fuzzGuard() *guard {
	var max atomic.Int64
	max.Store(64)
	g := &guard{name: "f", log: slog.New(slog.DiscardHandler), maxResult: &max, maxMessage: 256, pending: map[jsonrpc.ID]string{}}
	g.sent([]byte(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{}}`))
	g.sent([]byte(`{"jsonrpc":"2.0","id":2,"method":"tools/list","params":{}}`))
	return g
}

// checkPassed fails unless msg is one JSON-RPC message within the guard's
// largest limit, as the SDK decodes it.
func checkPassed(t *testing.T, msg []byte) {
	t.Helper()
	if len(msg) > 4<<10 { // a refusal is small; anything passed is ≤ 256
		t.Fatalf("passed %d bytes", len(msg))
	}
	if _, err := jsonrpc.DecodeMessage(msg); err != nil {
		t.Fatalf("passed %q, which the SDK refuses: %v", msg, err)
	}
	if !bytes.Contains(msg, []byte("toolgate refused")) && len(msg) > 256 {
		t.Fatalf("passed %d bytes, over the limit", len(msg))
	}
}

// FuzzStdioReader: whatever a stdio upstream prints, the SDK reads only
// lines that are one JSON-RPC message each, within their limit.
func FuzzStdioReader(f *testing.F) {
	for _, s := range []string{
		"{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\nnot json\n[1]\n",
		"{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"x\":\"" + strings.Repeat("y", 300) + "\"}}\n",
		"{\"result\":{\"x\":\"" + strings.Repeat("y", 300) + "\"},\"jsonrpc\":\"2.0\",\"id\":2}\r\n{\"jsonrpc\":\"2.0\",\"method\":\"m\"}",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		r := &stdioReader{f: frame{g: fuzzGuard()}, src: bufio.NewReaderSize(bytes.NewReader(in), 16)}
		out, err := io.ReadAll(r)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range bytes.Split(bytes.TrimSuffix(out, []byte("\n")), []byte("\n")) {
			if len(out) > 0 {
				checkPassed(t, line)
			}
		}
	})
}

// FuzzSSEBody: whatever an HTTP upstream's event stream holds, what is
// passed on is events whose data is one JSON-RPC message within its limit.
func FuzzSSEBody(f *testing.F) {
	for _, s := range []string{
		"id: 1\ndata: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\n\n",
		"data: not json\n\n: comment\nevent: other\ndata: x\n\nretry: 10\nid: 7\n\n",
		"data: {\"jsonrpc\":\"2.0\",\ndata: \"id\":1,\"result\":{\"x\":\"" + strings.Repeat("y", 300) + "\"}}\n\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		g := fuzzGuard()
		one, _ := jsonrpc.MakeID(float64(1))
		b := &sseBody{src: io.NopCloser(bytes.NewReader(in)), r: bufio.NewReaderSize(bytes.NewReader(in), 16),
			f: frame{g: g, call: one, callMethod: "tools/call"}}
		out, err := io.ReadAll(b)
		if err != nil {
			t.Fatal(err)
		}
		for ev := range bytes.SplitSeq(out, []byte("\n\n")) {
			var data [][]byte
			for l := range bytes.SplitSeq(ev, []byte("\n")) {
				if d, ok := bytes.CutPrefix(l, []byte("data: ")); ok {
					data = append(data, d)
				}
			}
			if len(data) > 0 {
				checkPassed(t, bytes.Join(data, []byte("\n")))
			}
		}
	})
}
