package mcpproxy

// The JSON-RPC envelope, read once and strictly, and the methods the
// gateway serves and relays.
//
// Decide on exactly what runs: the guard reads a message, decides on it
// (which method, which tool, which session), and the SDK reads the same
// bytes again. Two readers of one text agree only when the text cannot be
// read two ways, so a message is refused (HTTP 400, nothing forwarded) when
// it is not strict JSON by toolgate.CanonicalJSON's rules at any depth —
// duplicate keys, keys that differ only by case, invalid UTF-8 or lone
// surrogates, numbers a float64 does not hold as written, nesting deeper
// than 1000 — or when its top level has a member other than the six of
// JSON-RPC 2.0. The envelope's members are then taken by their exact names,
// as the SDK (which matches case-sensitively) takes them. One exception:
// the arguments of a tools/call are judged by the decision itself
// (toolgate.ParseArgs, by the same rules), so that a call refused for its
// arguments is decided and recorded as malformed_call like on every other
// entry point; everything around them must be strict here.
//
// Only the allow-list is safe: a client may send only the methods in
// clientMethods (the gateway serves or relays each of them, under its own
// checks), and of what an upstream sends only upstreamMethods are relayed
// to a client. Anything else is refused as method not found and recorded
// (gateway.method.refused, rate-limited like failed authentication).

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/toolgate/toolgate"
)

// clientMethods are the methods a client may send to the gateway, each
// served by the gateway (tools, lists, resources/read, prompts/get,
// completion/complete: decided and routed here) or by the SDK session it
// keeps (initialize, ping, logging/setLevel, unsubscribe, notifications).
// Every other method is refused with method not found, whether or not the
// SDK would serve it (server/discover, subscriptions/listen, tasks/*, ...).
var clientMethods = map[string]bool{
	"initialize":                       true,
	"ping":                             true,
	"tools/list":                       true,
	"tools/call":                       true,
	"resources/list":                   true,
	"resources/templates/list":         true,
	"resources/read":                   true,
	"resources/subscribe":              true,
	"resources/unsubscribe":            true,
	"prompts/list":                     true,
	"prompts/get":                      true,
	"completion/complete":              true,
	"logging/setLevel":                 true,
	"notifications/initialized":        true,
	"notifications/cancelled":          true,
	"notifications/progress":           true,
	"notifications/roots/list_changed": true,
}

// upstreamMethods are the messages an upstream may send that reach a
// client (to the one client they are attributed to, after that client's
// capability checks: passthrough.go, fastpath.go). On the SDK path the
// upstream Manager's handlers are exactly these; on the fast path
// readEvents checks this table. ping is answered by the gateway itself;
// list_changed notifications refresh the gateway's mirror and reach
// clients as the gateway's own. Anything else an upstream sends is
// refused (a request gets method not found) and logged.
var upstreamMethods = map[string]bool{
	"ping":                                 true,
	"sampling/createMessage":               true,
	"elicitation/create":                   true,
	"roots/list":                           true,
	"notifications/message":                true,
	"notifications/progress":               true,
	"notifications/resources/updated":      true,
	"notifications/resources/list_changed": true,
	"notifications/prompts/list_changed":   true,
	"notifications/tools/list_changed":     true,
	"notifications/elicitation/complete":   true,
	"notifications/cancelled":              true,
}

// envelope is one JSON-RPC message, parsed once (parseEnvelope, by the
// members' exact names; the tags serve the upstream's final response on
// the fast path, which the gateway re-frames).
type envelope struct {
	JSONRPC string          `json:"jsonrpc"`
	Method  *string         `json:"method"`
	ID      json.RawMessage `json:"id"`
	Params  json.RawMessage `json:"params"`
	Result  json.RawMessage `json:"result"`
	Error   json.RawMessage `json:"error"`
}

func (e *envelope) isRequest() bool {
	return e.Method != nil && len(e.ID) > 0 && string(e.ID) != "null"
}

// parseEnvelope reads one JSON-RPC message strictly (see the file
// comment), or returns why it is not one.
func parseEnvelope(body []byte) (*envelope, error) {
	argsLeft := false
	if _, err := toolgate.CanonicalJSON(body); err != nil {
		// Strict but for params.arguments? Then the decision judges those.
		s, e, ok := argumentsSpan(body)
		if ok {
			masked := make([]byte, 0, len(body)-(e-s)+4)
			masked = append(append(append(masked, body[:s]...), "null"...), body[e:]...)
			_, err2 := toolgate.CanonicalJSON(masked)
			argsLeft = err2 == nil
		}
		if !argsLeft {
			return nil, fmt.Errorf("the body is not strict JSON (%w); duplicate keys, keys that differ only by case, invalid UTF-8 and numbers a float64 does not hold as written are refused, so that every reader of the message reads the same message", err)
		}
	}
	var members map[string]json.RawMessage
	if err := json.Unmarshal(body, &members); err != nil || members == nil {
		return nil, fmt.Errorf("the body is not a JSON-RPC object")
	}
	env := new(envelope)
	for k, v := range members {
		switch k {
		case "jsonrpc":
			if err := json.Unmarshal(v, &env.JSONRPC); err != nil {
				return nil, fmt.Errorf(`"jsonrpc" is not a string`)
			}
		case "method":
			var m string
			if err := json.Unmarshal(v, &m); err != nil {
				return nil, fmt.Errorf(`"method" is not a string`)
			}
			env.Method = &m
		case "id":
			env.ID = v
		case "params":
			env.Params = v
		case "result":
			env.Result = v
		case "error":
			env.Error = v
		default:
			return nil, fmt.Errorf("the member %.64q is not one of JSON-RPC 2.0's (jsonrpc, id, method, params, result, error)", k)
		}
	}
	if env.JSONRPC != "2.0" {
		return nil, fmt.Errorf(`the body is not JSON-RPC 2.0 (want "jsonrpc": "2.0")`)
	}
	if env.Method == nil && (len(env.ID) == 0 || (env.Result == nil && env.Error == nil)) {
		return nil, fmt.Errorf("the body is neither a request, a notification nor a response")
	}
	if env.Method != nil && (env.Result != nil || env.Error != nil) {
		return nil, fmt.Errorf("the body is both a request and a response")
	}
	if argsLeft && (env.Method == nil || *env.Method != "tools/call") {
		return nil, fmt.Errorf("the body is not strict JSON: its params.arguments are not (only a tools/call's arguments are left to the decision)")
	}
	return env, nil
}

// argumentsSpan finds the value of params.arguments in a message: the
// byte offsets [start, end) of the first "arguments" member of the first
// "params" member; ok is false if there is none or the text is not JSON.
func argumentsSpan(body []byte) (start, end int, ok bool) {
	ps, pe, ok := memberSpan(body, "params")
	if !ok {
		return 0, 0, false
	}
	as, ae, ok := memberSpan(body[ps:pe], "arguments")
	if !ok {
		return 0, 0, false
	}
	return ps + as, ps + ae, true
}

// memberSpan finds the value of the first member key (after resolving
// escapes) of the JSON object obj: its byte offsets [start, end).
func memberSpan(obj []byte, key string) (start, end int, ok bool) {
	dec := json.NewDecoder(bytes.NewReader(obj))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return 0, 0, false
	}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return 0, 0, false
		}
		k, _ := t.(string)
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return 0, 0, false
		}
		if k == key {
			end := int(dec.InputOffset())
			start := end - len(raw)
			if start < 0 || !bytes.Equal(obj[start:end], raw) {
				return 0, 0, false
			}
			return start, end, true
		}
	}
	return 0, 0, false
}

// strictMember returns the member key of a JSON object exactly as named
// (case-sensitively, as the SDK reads it); ok is false when obj is not an
// object or has no such member.
func strictMember(obj json.RawMessage, key string) (json.RawMessage, bool) {
	var m map[string]json.RawMessage
	if json.Unmarshal(obj, &m) != nil {
		return nil, false
	}
	v, ok := m[key]
	return v, ok
}
