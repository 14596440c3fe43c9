package mcpproxy

import (
	"testing"

	"github.com/toolgate/toolgate/adapter/mcptool"
	"github.com/toolgate/toolgate/gate"
	"github.com/toolgate/toolgate/upstream"
)

// TestNewWithoutUpstreams checks that a gateway without upstreams, which
// passes New a nil *upstream.Manager, gets a proxy whose upstream sessions
// are nil: the relay's "no upstreams" checks (r.p.ups == nil) hold, and no
// request reaches Session on a nil Manager (which would panic).
func TestNewWithoutUpstreams(t *testing.T) {
	tests := []struct {
		name string
		ups  mcptool.Sessions
	}{
		{name: "nil Sessions", ups: nil},
		{name: "nil *upstream.Manager", ups: (*upstream.Manager)(nil)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := New(gate.New(nil, nil), tc.ups, nil)
			if p.ups != nil {
				t.Fatalf("Proxy.ups = %#v, want nil", p.ups)
			}
			if _, err := p.relay.begin(t.Context(), "docs", nil, nil, nil, nil); err == nil {
				t.Error("relay.begin without upstreams: no error, want one")
			}
		})
	}
}
