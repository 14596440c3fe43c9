package upstream

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestBackoff(t *testing.T) {
	tests := []struct {
		name      string
		base, max time.Duration
		rand      float64
		want      []time.Duration // for failures 1, 2, 3, ...
	}{
		{name: "upper bound doubles to max", base: time.Second, max: 10 * time.Second, rand: 1,
			want: []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 10 * time.Second, 10 * time.Second}},
		{name: "lower bound is half", base: time.Second, max: 10 * time.Second, rand: 0,
			want: []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second, 4 * time.Second, 5 * time.Second}},
		{name: "defaults", rand: 1,
			want: []time.Duration{DefaultBackoffBase, 2 * DefaultBackoffBase, 4 * DefaultBackoffBase}},
		{name: "max below base", base: time.Second, max: time.Millisecond, rand: 1,
			want: []time.Duration{time.Second, time.Second}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m, err := New(nil, &Options{BackoffBase: tc.base, BackoffMax: tc.max, Rand: func() float64 { return tc.rand }})
			if err != nil {
				t.Fatal(err)
			}
			var got []time.Duration
			for i := range tc.want {
				got = append(got, m.backoff(i+1))
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("backoff (-want +got):\n%s", diff)
			}
		})
	}
}

func TestNoArguments(t *testing.T) {
	tests := []struct {
		name string
		args any
		want bool
	}{
		{"nil", nil, true},
		{"nil map", map[string]any(nil), true},
		{"empty map", map[string]any{}, false},
		{"nil raw", []byte(nil), false}, // not a json.RawMessage: sent as is
		{"null raw", rawNull, true},
		{"empty raw", rawEmpty, true},
		{"object raw", rawObj, false},
		{"struct", struct{ A int }{1}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := noArguments(tc.args); got != tc.want {
				t.Errorf("noArguments(%#v) = %v, want %v", tc.args, got, tc.want)
			}
		})
	}
}

var (
	rawNull  = json.RawMessage("null")
	rawEmpty = json.RawMessage(nil)
	rawObj   = json.RawMessage(`{"a":1}`)
)
