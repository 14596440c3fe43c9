package cond_test

import (
	"strings"
	"testing"

	"github.com/toolgate/toolgate/cond"
)

// FuzzCondition compiles arbitrary expressions and evaluates the ones that
// compile on arguments built from the fuzzer's values: neither may panic,
// and Eval's own recover must never be what saved it.
func FuzzCondition(f *testing.F) {
	for _, s := range []string{
		"args.amount <= 100",
		"!has(args.limit) || args.limit <= 1000",
		"has(args.amount) && args.amount <= 500",
		"'admin' in principal.roles",
		"args.s.matches(args.s)",
		"args.list.all(x, args.list.all(y, x == y))",
		"args.m.k == args.s",
		"size(args.s) > args.n",
		"args.n / 0 == 1",
		"args.n % args.n == 0",
		"int(args.s) > 0",
		"double(args.n) > args.amount",
		"args.b ? args.n > 0 : args.amount < 0",
		"tool.side_effect_class == 'write' && env.environment == 'staging'",
		"args.list[args.n] == 1",
		"timestamp(args.s) > timestamp('2024-01-01T00:00:00Z')",
		"duration(args.s) > duration('1s')",
		"args.s.startsWith('a') || args.s.endsWith('z')",
		"[1, 2, 3].exists(x, x > args.n)",
		"{'a': 1}[args.s] == 1",
		"((((((((((true))))))))))",
		"args",
		"1 +",
	} {
		f.Add(s, int64(7), 3.5, "abc", true)
	}
	env, err := cond.NewEnv()
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, expr string, n int64, amount float64, s string, b bool) {
		p, err := env.Compile(expr)
		if err != nil {
			return
		}
		args := map[string]any{
			"n": n, "amount": amount, "s": s, "b": b,
			"list": []any{n, s, b, amount},
			"m":    map[string]any{"k": s, "n": n},
		}
		vars := &cond.Vars{
			Args:        args,
			Principal:   map[string]any{"id": s, "roles": []string{s, "admin"}},
			Agent:       map[string]any{"id": s, "version": "1.0.0", "runtime_engine": "langgraph"},
			Tool:        map[string]any{"id": "tool:a-b", "name": "a_b", "side_effect_class": "write"},
			Environment: s, InstanceID: "acme", DeploymentMode: "production",
		}
		for _, v := range []*cond.Vars{vars, {}} {
			ok, err := p.Eval(v)
			if err != nil && ok {
				t.Fatalf("Eval(%q) = true with error %v", expr, err)
			}
			if err != nil && strings.Contains(err.Error(), "panicked") {
				t.Fatalf("Eval(%q) panicked inside cel-go: %v", expr, err)
			}
		}
	})
}
