package toolid_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/toolgate/toolgate/toolid"
)

func TestValid(t *testing.T) {
	long := "tool:" + strings.Repeat("a", toolid.MaxLen-len(toolid.Prefix))
	cases := []struct {
		name string
		id   string
		want bool
	}{
		{"provider and verb", "tool:supabase-write", true},
		{"one part", "tool:search", true},
		{"digits", "tool:s3-put2", true},
		{"many parts", "tool:bifrost-describe-table", true},
		{"exactly MaxLen", long, true},
		{"longer than MaxLen", long + "a", false},
		{"prefix only", "tool:", false},
		{"no prefix", "supabase-write", false},
		{"underscore", "tool:supabase_write", false},
		{"dot", "tool:bifrost.query", false},
		{"upper case", "tool:Supabase-write", false},
		{"upper case prefix", "Tool:supabase-write", false},
		{"leading dash", "tool:-write", false},
		{"trailing dash", "tool:write-", false},
		{"double dash", "tool:a--b", false},
		{"space", "tool:a b", false},
		{"non-ASCII", "tool:supabase-writ\u0435", false},
		{"empty", "", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := toolid.Valid(c.id); got != c.want {
				t.Errorf("Valid(%q) = %v, want %v", c.id, got, c.want)
			}
		})
	}
}

func TestMap(t *testing.T) {
	cases := []struct {
		name    string
		in      string
		want    string // "" means malformed
		wantErr string // substring of the error
	}{
		{"canonical id", "tool:supabase-write", "tool:supabase-write", ""},
		{"underscore function name", "supabase_write", "tool:supabase-write", ""},
		{"dot name", "bifrost.query", "tool:bifrost-query", ""},
		{"dash name", "supabase-write", "tool:supabase-write", ""},
		{"mixed separators", "bifrost.describe_table", "tool:bifrost-describe-table", ""},
		{"one part", "search", "tool:search", ""},
		{"name starting with tool", "tool_run", "tool:tool-run", ""},
		{"empty", "", "", "empty name"},
		{"upper case", "Supabase_Write", "", "lowercase"},
		{"upper case id", "tool:Supabase-write", "", "tool:<parts"},
		{"double underscore", "supabase__write", "", "no empty parts"},
		{"leading separator", "_write", "", "no empty parts"},
		{"trailing separator", "write.", "", "no empty parts"},
		{"trailing space", "supabase_write ", "", "lowercase"},
		{"inner space", "supabase write", "", "lowercase"},
		{"tab", "supabase\twrite", "", "lowercase"},
		{"cyrillic e", "supabase_writ\u0435", "", "lowercase"},
		{"slash", "fs/read", "", "lowercase"},
		{"colon inside", "a:b", "", "lowercase"},
		{"prefix only", "tool:", "", "lowercase"},
		{"id with underscore", "tool:supabase_write", "", "tool:<parts"},
		{"id with dot", "tool:bifrost.query", "", "tool:<parts"},
		{"too long", strings.Repeat("a", toolid.MaxLen+1), "", "longer than"},
		{"mapped id too long", strings.Repeat("a", toolid.MaxLen-len(toolid.Prefix)+1), "", "maps to an id longer"},
		{"longest mappable", strings.Repeat("a", toolid.MaxLen-len(toolid.Prefix)), "tool:" + strings.Repeat("a", toolid.MaxLen-len(toolid.Prefix)), ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := toolid.Map(c.in)
			if c.want == "" {
				if err == nil {
					t.Fatalf("Map(%q) = %q, want an error", c.in, got)
				}
				if !errors.Is(err, toolid.ErrMalformed) {
					t.Errorf("Map(%q) error %v does not wrap ErrMalformed", c.in, err)
				}
				if !strings.Contains(err.Error(), c.wantErr) {
					t.Errorf("Map(%q) error %q does not mention %q", c.in, err, c.wantErr)
				}
				if got != "" {
					t.Errorf("Map(%q) returned %q with its error", c.in, got)
				}
				return
			}
			if err != nil {
				t.Fatalf("Map(%q): %v", c.in, err)
			}
			if got != c.want {
				t.Errorf("Map(%q) = %q, want %q", c.in, got, c.want)
			}
			var buf [toolid.MaxLen]byte
			n, err := toolid.MapBytes(&buf, c.in)
			if err != nil || string(buf[:n]) != c.want {
				t.Errorf("MapBytes(%q) = %q, %v; want %q", c.in, buf[:n], err, c.want)
			}
		})
	}
}

func TestFunctionName(t *testing.T) {
	cases := []struct {
		name, id, want string
	}{
		{"two parts", "tool:supabase-write", "supabase_write"},
		{"three parts", "tool:bifrost-describe-table", "bifrost_describe_table"},
		{"one part", "tool:search", "search"},
		{"not canonical", "tool:Supabase-write", ""},
		{"function name given", "supabase_write", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := toolid.FunctionName(c.id)
			if diff := cmp.Diff(c.want, got); diff != "" {
				t.Errorf("FunctionName(%q) (-want +got):\n%s", c.id, diff)
			}
			if got != "" {
				if back, err := toolid.Map(got); err != nil || back != c.id {
					t.Errorf("Map(FunctionName(%q)) = %q, %v; want the id back", c.id, back, err)
				}
			}
		})
	}
}
