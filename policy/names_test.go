package policy_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/toolgate/toolgate/policy"
)

// TestResourceNames pins the quoting that keeps resource names injective
// (names.go) and what a grant scope covers with it.
func TestResourceNames(t *testing.T) {
	joins := []struct {
		name  string
		parts []string
		want  string
	}{
		{"plain parts", []string{"shop", "orders"}, "shop.orders"},
		{"a part with a dot", []string{"shop", "orders.secret"}, `shop."orders.secret"`},
		{"a schema with a dot", []string{"shop", "a.b", "c"}, `shop."a.b".c`},
		{"a table with a dot", []string{"shop", "a", "b.c"}, `shop.a."b.c"`},
		{"a part with a quote", []string{"shop", `we"ird`}, `shop."we""ird"`},
		{"a part that is only a quote", []string{"shop", `"`}, `shop.""""`},
		{"an empty part", []string{"shop", ""}, `shop.""`},
		{"a part that looks quoted", []string{"shop", `"orders"`}, `shop."""orders"""`},
	}
	for _, tc := range joins {
		t.Run("join "+tc.name, func(t *testing.T) {
			got := policy.JoinName(tc.parts...)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("JoinName (-want +got):\n%s", diff)
			}
			back, ok := policy.SplitName(got)
			if diff := cmp.Diff(tc.parts, back); !ok || diff != "" {
				t.Errorf("SplitName(%q) = %q, %v (-want +got):\n%s", got, back, ok, diff)
			}
		})
	}
	for _, bad := range []string{"", ".", "a.", ".a", "a..b", `a."b`, `a."b"c`, `a"b`, `"a"b.c`, `a.b"`} {
		if parts, ok := policy.SplitName(bad); ok {
			t.Errorf("SplitName(%q) = %q, want not well formed", bad, parts)
		}
	}
	covers := []struct {
		scope, name string
		want        bool
	}{
		{"shop", "shop.orders", true},
		{"shop.orders", "shop.orders", true},
		{"shop.orders", "shop.orders.x", true},
		{"shop.orders", "shop.orders2", false},
		{"shop.orders", `shop."orders.secret"`, false},
		{`shop."orders.secret"`, `shop."orders.secret"`, true},
		{"shop.a", `shop."a.b".c`, false},
		{"shop.a", `shop.a."b.c"`, true},
		{`shop."a.b"`, `shop."a.b".c`, true},
		{`shop."a.b"`, `shop.a."b.c"`, false},
		{`shop."orders"""`, `shop."orders"".x"`, false},
		{`shop."orders`, `shop."orders.secret"`, false}, // a scope that is not well formed covers nothing else
	}
	for _, tc := range covers {
		if got := policy.NameCovers(tc.scope, tc.name); got != tc.want {
			t.Errorf("NameCovers(%q, %q) = %v, want %v", tc.scope, tc.name, got, tc.want)
		}
	}
}

// stringCovers is how the decision core (authz) matches a name scope: the
// same string, or the string followed by a dot. For names in JoinName's
// spelling it must agree with NameCovers's part-by-part reading, which is
// why validation accepts only that spelling in scopes.
func stringCovers(scope, name string) bool {
	return scope == name || (len(name) > len(scope) && name[len(scope)] == '.' && name[:len(scope)] == scope)
}

func FuzzResourceNames(f *testing.F) {
	f.Add("shop", "orders.secret", "x", uint8(1))
	f.Add("a.b", "c", `we"ird`, uint8(2))
	f.Add(`"`, "", ".", uint8(3))
	f.Fuzz(func(t *testing.T, a, b, c string, n uint8) {
		if strings.ContainsRune(a+b+c, 0) {
			return
		}
		all := []string{a, b, c}
		parts := all[:1+int(n)%3]
		name := policy.JoinName(parts...)
		back, ok := policy.SplitName(name)
		if !ok || !slices.Equal(back, parts) {
			t.Fatalf("SplitName(JoinName(%q)) = %q, %v", parts, back, ok)
		}
		for k := 1; k <= len(parts); k++ {
			scope := policy.JoinName(parts[:k]...)
			if !policy.NameCovers(scope, name) || !stringCovers(scope, name) {
				t.Fatalf("%q does not cover %q", scope, name)
			}
		}
		// Against a name built from other parts, the two readings agree.
		other := policy.JoinName(c, a, b)
		for k := 1; k <= len(parts); k++ {
			scope := policy.JoinName(parts[:k]...)
			if policy.NameCovers(scope, other) != stringCovers(scope, other) {
				t.Fatalf("NameCovers(%q, %q) and the string match disagree", scope, other)
			}
		}
	})
}
