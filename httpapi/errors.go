package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/toolgate/toolgate"
	"github.com/toolgate/toolgate/gate"
)

// MaxBodyBytes bounds a request body: 1 MiB. A larger body is refused with
// 413 and code body_too_large.
const MaxBodyBytes = 1 << 20

// Error is an API error: the HTTP status, a stable machine code and a
// message that says what was wrong and what to send instead. Handlers and an
// Options.Identify function may return one to choose the status; any other
// error is mapped by WriteError.
type Error struct {
	// Status is the HTTP status code (4xx or 5xx).
	Status int
	// Code is stable and machine-readable ("malformed_json", "not_found"...).
	Code string
	// Message is one human sentence; it is sent to the client.
	Message string
	// Err is the cause, for errors.Is/As and the log; never sent.
	Err error
}

// Error returns the message.
func (e *Error) Error() string { return e.Message }

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Err }

func apiError(status int, code, format string, args ...any) *Error {
	return &Error{Status: status, Code: code, Message: fmt.Sprintf(format, args...)}
}

// ErrorBody is the JSON body of every error answer:
// {"error": {"code": "...", "message": "..."}}.
type ErrorBody struct {
	Error ErrorDetail `json:"error"`
}

// ErrorDetail is the content of ErrorBody.
type ErrorDetail struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// Classify maps an error to the API error it is answered with. It is the
// one place that chooses a status:
//
//   - *Error: as it is.
//   - *http.MaxBytesError: 413 body_too_large.
//   - gate.ErrSelfApproval: 403 self_approval; gate.ErrNotApprover: 403 not_approver;
//     gate.ErrNotAuditor: 403 not_auditor; gate.ErrNoApprovals: 501
//     no_approval_store; gate.ErrNoAuditLog: 501 no_audit_store.
//   - gate.ErrApprovalNotFound: 404 not_found; gate.ErrApprovalNotPending: 409
//     approval_not_pending; gate.ErrApprovalExpired: 409 approval_expired;
//     gate.ErrApprovalInvalid: 400 bad_request.
//   - gate.ErrAuditUnavailable: 503 audit_unavailable.
//   - *toolgate.Error: 403 with its code (500 for internal_error).
//   - context.Canceled / DeadlineExceeded: 503 canceled.
//   - anything else: 500 internal_error, with a generic message (the
//     detail goes to the log, not to the client).
func Classify(err error) *Error {
	var (
		ae  *Error
		mbe *http.MaxBytesError
		te  *toolgate.Error
	)
	switch {
	case err == nil:
		return nil
	case errors.As(err, &ae):
		return ae
	case errors.As(err, &mbe):
		return &Error{Status: http.StatusRequestEntityTooLarge, Code: "body_too_large",
			Message: fmt.Sprintf("the request body is larger than %d bytes (1 MiB)", mbe.Limit), Err: err}
	case errors.Is(err, gate.ErrSelfApproval):
		return &Error{Status: http.StatusForbidden, Code: "self_approval", Message: err.Error(), Err: err}
	case errors.Is(err, gate.ErrNotApprover):
		return &Error{Status: http.StatusForbidden, Code: "not_approver", Message: err.Error(), Err: err}
	case errors.Is(err, gate.ErrNotAuditor):
		return &Error{Status: http.StatusForbidden, Code: "not_auditor", Message: err.Error(), Err: err}
	case errors.Is(err, gate.ErrNoApprovals):
		return &Error{Status: http.StatusNotImplemented, Code: "no_approval_store", Message: err.Error(), Err: err}
	case errors.Is(err, gate.ErrNoAuditLog):
		return &Error{Status: http.StatusNotImplemented, Code: "no_audit_store", Message: err.Error(), Err: err}
	case errors.Is(err, gate.ErrApprovalNotFound):
		return &Error{Status: http.StatusNotFound, Code: "not_found", Message: err.Error(), Err: err}
	case errors.Is(err, gate.ErrApprovalNotPending):
		return &Error{Status: http.StatusConflict, Code: "approval_not_pending", Message: err.Error(), Err: err}
	case errors.Is(err, gate.ErrApprovalExpired):
		return &Error{Status: http.StatusConflict, Code: "approval_expired", Message: err.Error(), Err: err}
	case errors.Is(err, gate.ErrApprovalInvalid):
		return &Error{Status: http.StatusBadRequest, Code: "bad_request", Message: err.Error(), Err: err}
	case errors.Is(err, gate.ErrAuditUnavailable):
		return &Error{Status: http.StatusServiceUnavailable, Code: "audit_unavailable", Message: err.Error(), Err: err}
	case errors.As(err, &te):
		status := http.StatusForbidden
		if te.Code == toolgate.CodeInternalError {
			status = http.StatusInternalServerError
		}
		return &Error{Status: status, Code: string(te.Code), Message: te.Message, Err: err}
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return &Error{Status: http.StatusServiceUnavailable, Code: "canceled", Message: "the request was canceled or timed out", Err: err}
	}
	return &Error{Status: http.StatusInternalServerError, Code: "internal_error",
		Message: "internal error; the gateway's log has the detail", Err: err}
}

// WriteError answers err as its Classify status with an ErrorBody.
func WriteError(w http.ResponseWriter, err error) {
	e := Classify(err)
	if e == nil {
		e = Classify(errors.New("WriteError called with a nil error"))
	}
	if e.Status == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="toolgate"`)
	}
	writeJSON(w, e.Status, ErrorBody{Error: ErrorDetail{Code: e.Code, Message: e.Message}})
}

// writeJSON writes v as the JSON answer with status.
func writeJSON(w http.ResponseWriter, status int, v any) {
	h := w.Header()
	h.Set("Content-Type", "application/json; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v) // the client went away; nothing to do
}

// BodyReadTimeout bounds reading one request body; a slower one gets 408
// and the connection is closed.
var BodyReadTimeout = 30 * time.Second

// DecodeJSON is decodeJSON for handlers outside this package (a body is
// required): the same limits, deadline and errors (*Error).
func DecodeJSON(w http.ResponseWriter, r *http.Request, v any) error {
	return decodeJSON(w, r, v, false)
}

// decodeJSON reads r's body, at most MaxBodyBytes, into v: exactly one JSON
// value, no unknown fields, Content-Type application/json. With
// emptyOK, an empty body leaves v as it is.
func decodeJSON(w http.ResponseWriter, r *http.Request, v any, emptyOK bool) error {
	if emptyOK && r.ContentLength == 0 {
		return nil // no body at all: nothing to decode, whatever the Content-Type
	}
	ct := r.Header.Get("Content-Type")
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil || mt != "application/json" {
		w.Header().Set("Connection", "close") // the body stays unread
		return apiError(http.StatusUnsupportedMediaType, "unsupported_media_type",
			"the request body must be JSON sent with Content-Type: application/json (got %q)", ct)
	}
	// A slow body cannot hold the connection: BodyReadTimeout for all of it.
	rc := http.NewResponseController(w)
	rc.SetReadDeadline(time.Now().Add(BodyReadTimeout))
	raw, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	rc.SetReadDeadline(time.Time{})
	if err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			w.Header().Set("Connection", "close")
			return apiError(http.StatusRequestTimeout, "body_timeout", "the request body did not arrive within %s", BodyReadTimeout)
		}
		return decodeError(err)
	}
	if err := strictTopLevel(raw); err != nil {
		return apiError(http.StatusBadRequest, "malformed_json", "%v", err)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if errors.Is(err, io.EOF) && emptyOK {
			return nil
		}
		return decodeError(err)
	}
	var extra json.RawMessage
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		if err != nil {
			return decodeError(err)
		}
		return apiError(http.StatusBadRequest, "malformed_json", "the request body holds more than one JSON value; send exactly one object")
	}
	return nil
}

// strictTopLevel refuses a body object with two members of one name, or of
// names that differ only by case: encoding/json would fold them into one
// field (the last wins), so "tool" next to "Tool" would be decided as
// whichever came last. The members' values (a call's arguments) are judged
// by their own readers (toolgate.ParseArgs).
func strictTopLevel(raw []byte) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	tok, err := dec.Token()
	if err != nil || tok != json.Delim('{') {
		return nil // not an object: Decode says why
	}
	seen := map[string]string{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil
		}
		key, _ := tok.(string)
		fold := strings.ToLower(key)
		if prev, dup := seen[fold]; dup {
			if prev == key {
				return fmt.Errorf("the body names %q twice; send each member once", key)
			}
			return fmt.Errorf("the body's members %q and %q differ only by case; send one of them", prev, key)
		}
		seen[fold] = key
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return nil
		}
	}
	return nil
}

func decodeError(err error) error {
	var (
		mbe *http.MaxBytesError
		se  *json.SyntaxError
		ute *json.UnmarshalTypeError
	)
	switch {
	case errors.As(err, &mbe):
		return err
	case errors.Is(err, io.EOF):
		return &Error{Status: http.StatusBadRequest, Code: "malformed_json", Message: "the request body is empty; send a JSON object", Err: err}
	case errors.Is(err, io.ErrUnexpectedEOF):
		return &Error{Status: http.StatusBadRequest, Code: "malformed_json", Message: "malformed JSON: the body ends in the middle of a value", Err: err}
	case errors.As(err, &se):
		return &Error{Status: http.StatusBadRequest, Code: "malformed_json",
			Message: fmt.Sprintf("malformed JSON at byte %d: %s", se.Offset, strings.TrimPrefix(se.Error(), "json: ")), Err: err}
	case errors.As(err, &ute):
		if ute.Field == "" {
			return &Error{Status: http.StatusBadRequest, Code: "bad_request",
				Message: fmt.Sprintf("the request body must be a JSON object, not %s", article(ute.Value)), Err: err}
		}
		return &Error{Status: http.StatusBadRequest, Code: "bad_request",
			Message: fmt.Sprintf("field %s must be %s, not %s", ute.Field, typeName(ute.Type.Kind().String()), article(ute.Value)), Err: err}
	}
	if f, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		return &Error{Status: http.StatusBadRequest, Code: "unknown_field",
			Message: fmt.Sprintf("unknown field %s in the request body; unknown fields are refused so that a misspelt one cannot be ignored silently", f), Err: err}
	}
	return &Error{Status: http.StatusBadRequest, Code: "malformed_json", Message: "malformed JSON: " + strings.TrimPrefix(err.Error(), "json: "), Err: err}
}

func article(jsonKind string) string {
	switch jsonKind {
	case "array", "object":
		return "an " + jsonKind
	case "":
		return "that value"
	}
	return "a " + jsonKind
}

func typeName(kind string) string {
	switch kind {
	case "string":
		return "a string"
	case "slice", "array":
		return "an array"
	case "map", "struct":
		return "an object"
	case "bool":
		return "true or false"
	}
	return "a " + kind
}

// ReleaseUnread wraps a handler so that a request whose body the handler
// did not read to the end (a refusal before reading it, a route that takes
// no body) cannot hold the connection: net/http would otherwise wait, with
// no deadline, for up to 256 KiB of it before answering or closing. The
// read deadline is set to now once the handler returns, so the connection
// is answered and closed at once.
func ReleaseUnread(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
			next.ServeHTTP(w, r)
			return
		}
		body := &eofReader{ReadCloser: r.Body}
		r.Body = body
		next.ServeHTTP(w, r)
		if !body.eof {
			http.NewResponseController(w).SetReadDeadline(time.Now())
		}
	})
}

// eofReader notes whether its reader reached the end.
type eofReader struct {
	io.ReadCloser
	eof bool
}

func (e *eofReader) Read(p []byte) (int, error) {
	n, err := e.ReadCloser.Read(p)
	if err == io.EOF {
		e.eof = true
	}
	return n, err
}
