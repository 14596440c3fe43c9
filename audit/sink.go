package audit

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sync"
)

// JSONLSink writes each event as one line of JSON (the Event's JSON form,
// the same fields as the envelope) to an io.Writer: a log file, stdout, a
// pipe to a shipper. Each batch is written with one Write call. It is safe
// for concurrent use.
type JSONLSink struct {
	mu     sync.Mutex
	w      io.Writer
	closer io.Closer
}

var _ Sink = (*JSONLSink)(nil)

// NewJSONLSink returns a sink writing to w. Close does not close w.
func NewJSONLSink(w io.Writer) *JSONLSink { return &JSONLSink{w: w} }

// OpenJSONLFile opens (creating, mode 0600) path for appending and returns a
// sink writing to it; Close closes the file.
func OpenJSONLFile(path string) (*JSONLSink, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("audit: open JSON-lines sink: %w", err)
	}
	return &JSONLSink{w: f, closer: f}, nil
}

// Write encodes evs, one line each, and writes them. ctx is not consulted:
// one Write call to the underlying writer is not interruptible.
func (s *JSONLSink) Write(_ context.Context, evs []Event) error {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	for i := range evs {
		if err := enc.Encode(&evs[i]); err != nil {
			return fmt.Errorf("audit: JSON-lines sink: encode seq %d: %w", evs[i].Seq, err)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := s.w.Write(buf.Bytes()); err != nil {
		return fmt.Errorf("audit: JSON-lines sink: %w", err)
	}
	return nil
}

// Close closes the file opened by OpenJSONLFile; for NewJSONLSink it does
// nothing.
func (s *JSONLSink) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closer == nil {
		return nil
	}
	return s.closer.Close()
}
