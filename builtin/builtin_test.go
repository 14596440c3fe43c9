package builtin_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/toolgate/toolgate"
	"github.com/toolgate/toolgate/builtin"
)

func TestCap(t *testing.T) {
	tests := []struct {
		name      string
		text      string
		max       int
		want      string
		truncated bool
	}{
		{"fits", "abc\n", 10, "abc\n", false},
		{"exact", "abcd", 4, "abcd", false},
		{"cut at a line", strings.Repeat("0123456789\n", 10), 80, "0123456789\n0123456789\n0123456789\n[truncated: 33 of 110 bytes shown]", true},
		{"cut inside a rune", "ééééééééééééééééééééééééééééééééééééééé", 50, "ééééééé\n[truncated: 14 of 78 bytes shown]", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, cut := builtin.Cap(tc.text, tc.max)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
			if cut != tc.truncated || len(got) > tc.max && cut {
				t.Errorf("cut = %v, len %d > %d", cut, len(got), tc.max)
			}
		})
	}
}

func TestCutLines(t *testing.T) {
	lines := []string{"header", "row 1", "row 2", "row 3"}
	text, kept, cut := builtin.CutLines(lines, 100)
	if diff := cmp.Diff("header\nrow 1\nrow 2\nrow 3", text); diff != "" || kept != 4 || cut {
		t.Errorf("fits: (-want +got):\n%s kept %d cut %v", diff, kept, cut)
	}
	lines = append(lines, "row 4", "row 5", "row 6", "row 7", "row 8")
	text, kept, cut = builtin.CutLines(lines, 50)
	if diff := cmp.Diff("header\nrow 1\n[truncated: 13 of 55 bytes shown]", text); diff != "" || kept != 2 || !cut {
		t.Errorf("cut: (-want +got):\n%s kept %d cut %v", diff, kept, cut)
	}
	if len(text) > 50 {
		t.Errorf("len %d > 50", len(text))
	}
}

func TestDecodeArgs(t *testing.T) {
	type args struct {
		Path string `json:"path"`
	}
	tests := []struct {
		name string
		in   string
		want args
		err  bool
	}{
		{"object", `{"path":"a"}`, args{"a"}, false},
		{"empty means {}", ``, args{}, false},
		{"null means {}", `null`, args{}, false},
		{"unknown field", `{"path":"a","x":1}`, args{}, true},
		{"trailing data", `{"path":"a"} {"path":"b"}`, args{}, true},
		{"not an object", `["a"]`, args{}, true},
		{"wrong type", `{"path":1}`, args{}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var got args
			err := builtin.DecodeArgs("fs.read", json.RawMessage(tc.in), &got)
			if tc.err {
				var te *toolgate.Error
				if !errors.As(err, &te) || te.Code != toolgate.CodeBadArguments || !strings.Contains(te.Message, "fs.read") {
					t.Fatalf("err = %v, want bad_arguments naming the tool", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func ExampleCap() {
	text, cut := builtin.Cap(strings.Repeat("line\n", 20), 64)
	fmt.Println(cut)
	fmt.Println(text)
	// Output:
	// true
	// line
	// line
	// line
	// line
	// line
	// [truncated: 25 of 100 bytes shown]
}
