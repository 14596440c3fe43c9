package upstream

import (
	"encoding/json"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
)

// scanned is what a keyScanner found, fed in chunks of n bytes.
func scanned(msg string, n int) (sawMethod bool, id string) {
	var s keyScanner
	for i := 0; i < len(msg); i += n {
		s.feed([]byte(msg[i:min(i+n, len(msg))]))
	}
	return s.sawMethod, string(s.id)
}

func TestKeyScanner(t *testing.T) {
	tests := []struct {
		name      string
		msg       string
		sawMethod bool
		id        string
	}{
		{"response, id first", `{"jsonrpc":"2.0","id":7,"result":{"content":[]}}`, false, `7`},
		{"response, id last (TypeScript SDK order)", `{"result":{"id":1,"method":"x"},"jsonrpc":"2.0","id":"a\"b"}`, false, `"a\"b"`},
		{"request", `{"jsonrpc":"2.0","method":"sampling/createMessage","id":3,"params":{}}`, true, `3`},
		{"notification with method last", `{"params":{"id":9},"jsonrpc":"2.0","method":"notifications/progress"}`, true, ``},
		{"escaped keys", `{"\u0069d":12,"\u006dethod":null}`, true, `12`},
		{"nested id and method are not top level", `{"a":{"id":1,"method":"m"},"b":["id","method"]}`, false, ``},
		{"id that is an object", `{"jsonrpc":"2.0","id":{"x":1},"result":{}}`, false, ``},
		{"duplicate id: the last wins", `{"id":1,"result":{},"id":2}`, false, `2`},
		{"spaces everywhere", " {\n \"id\" :\t-5 , \"result\" : { } } ", false, `-5`},
		{"key differing by case", `{"ID":1,"Method":"x"}`, false, ``},
		{"not an object", `[{"id":1}]`, false, ``},
		{"not JSON", `this is not json "id":1`, false, ``},
		{"strings with braces", `{"x":"}{\"","id":"}"}`, false, `"}"`},
		{"truncated", `{"jsonrpc":"2.0","id":4,"result":{"content":[{"text":"abc`, false, `4`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for _, n := range []int{1, 3, len(tc.msg)} {
				m, id := scanned(tc.msg, n)
				if diff := cmp.Diff([2]any{tc.sawMethod, tc.id}, [2]any{m, id}); diff != "" {
					t.Errorf("chunks of %d: (sawMethod, id) (-want +got):\n%s", n, diff)
				}
			}
		})
	}
}

// FuzzKeyScanner: for every message the SDK decodes, the scanner agrees
// with the SDK on whether it is a request and on the id of an answer.
func FuzzKeyScanner(f *testing.F) {
	for _, s := range []string{
		`{"jsonrpc":"2.0","id":1,"result":{}}`, `{"jsonrpc":"2.0","method":"m","params":{"id":2}}`,
		`{"result":{},"jsonrpc":"2.0","id":"x"}`, `{"jsonrpc":"2.0","id":1,"id":2,"result":{}}`,
		`{"jsonrpc":"2.0","\u0069d":3,"error":{"code":1,"message":"m"}}`, `{"jsonrpc":"2.0","id":1e2,"result":{}}`,
	} {
		f.Add(s, 5)
	}
	f.Fuzz(func(t *testing.T, msg string, n int) {
		if n <= 0 || n > 64 {
			n = 7
		}
		m, err := jsonrpc.DecodeMessage([]byte(msg))
		if err != nil || !json.Valid([]byte(msg)) {
			return
		}
		sawMethod, id := scanned(msg, n)
		switch m := m.(type) {
		case *jsonrpc.Request:
			if !sawMethod {
				t.Fatalf("%q is a request to the SDK, the scanner saw no method", msg)
			}
		case *jsonrpc.Response:
			if sawMethod {
				t.Fatalf("%q is an answer to the SDK, the scanner saw a method", msg)
			}
			got, ok := parseID([]byte(id))
			if !ok || got != m.ID {
				t.Fatalf("%q answers %v to the SDK, the scanner found id %q", msg, m.ID, id)
			}
		}
	})
}
