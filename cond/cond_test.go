package cond_test

import (
	"strings"
	"testing"

	"github.com/toolgate/toolgate/cond"
)

func newEnv(t testing.TB) *cond.Env {
	t.Helper()
	env, err := cond.NewEnv()
	if err != nil {
		t.Fatal(err)
	}
	return env
}

func TestCompile(t *testing.T) {
	env := newEnv(t)
	cases := []struct {
		name    string
		expr    string
		wantErr string // "" means it compiles
	}{
		{"comparison", "args.amount <= 100", ""},
		{"has macro", "!has(args.limit) || args.limit <= 1000", ""},
		{"every variable", "principal.id != '' && agent.id != '' && tool.id != '' && env.environment == 'staging'", ""},
		{"dynamic field is accepted at compile time", "args.flag", ""},
		{"syntax error", "args.amount <=", "does not compile"},
		{"undeclared variable", "amount <= 100", "does not compile"},
		{"int result", "1 + 2", "want bool"},
		{"string result", "'yes'", "want bool"},
		{"list result", "[true]", "want bool"},
		{"bad constant regexp", "args.s.matches('[')", "error parsing regexp"},
		{"too long", "true && " + strings.Repeat("true && ", cond.MaxExprLen/8) + "true", "longer than"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p, err := env.Compile(c.expr)
			if c.wantErr == "" {
				if err != nil {
					t.Fatalf("Compile(%q): %v", c.expr, err)
				}
				if p.Expr != c.expr {
					t.Errorf("Expr = %q, want %q", p.Expr, c.expr)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Fatalf("Compile(%q) error = %v, want one mentioning %q", c.expr, err, c.wantErr)
			}
		})
	}
}

func TestEval(t *testing.T) {
	env := newEnv(t)
	long := make([]any, 200)
	for i := range long {
		long[i] = int64(i)
	}
	vars := &cond.Vars{
		Args:        map[string]any{"amount": 50.0, "limit": int64(10), "flag": 1, "list": long, "pattern": "("},
		Principal:   map[string]any{"id": "user:bob", "roles": []string{"maintainer"}},
		Agent:       map[string]any{"id": "triage", "version": "3.0.0", "runtime_engine": "temporal"},
		Tool:        map[string]any{"id": "tool:payments-refund", "name": "payments_refund", "side_effect_class": "irreversible"},
		Environment: "staging", InstanceID: "acme", DeploymentMode: "production",
	}
	cases := []struct {
		name    string
		expr    string
		vars    *cond.Vars
		want    bool
		wantErr string
	}{
		{"holds", "args.amount <= 100", vars, true, ""},
		{"does not hold", "args.amount > 100", vars, false, ""},
		{"principal roles", "'maintainer' in principal.roles", vars, true, ""},
		{"agent, tool and env", "agent.runtime_engine == 'temporal' && tool.side_effect_class == 'irreversible' && env.instance_id == 'acme'", vars, true, ""},
		{"has on a missing key", "has(args.missing)", vars, false, ""},
		{"missing key is an error", "args.missing <= 100", vars, false, "no such key"},
		{"nil maps are empty", "size(args) == 0 && size(principal) == 0", &cond.Vars{}, true, ""},
		{"missing key on nil args", "args.amount <= 100", &cond.Vars{}, false, "no such key"},
		{"non-bool dynamic result", "args.flag", vars, false, "not a bool"},
		{"type mismatch", "args.amount <= 'x'", vars, false, "no such overload"},
		{"bad regexp at run time", "'abc'.matches(args.pattern)", vars, false, "regexp"},
		{"cost limit", "args.list.all(x, args.list.all(y, x + y > -1))", vars, false, "cost limit"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p, err := env.Compile(c.expr)
			if err != nil {
				t.Fatalf("Compile(%q): %v", c.expr, err)
			}
			got, err := p.Eval(c.vars)
			if got != c.want {
				t.Errorf("Eval(%q) = %v, want %v (err %v)", c.expr, got, c.want, err)
			}
			switch {
			case c.wantErr == "" && err != nil:
				t.Errorf("Eval(%q): unexpected error %v", c.expr, err)
			case c.wantErr != "" && (err == nil || !strings.Contains(err.Error(), c.wantErr)):
				t.Errorf("Eval(%q) error = %v, want one mentioning %q", c.expr, err, c.wantErr)
			}
		})
	}
}

func TestVarsResolveName(t *testing.T) {
	v := &cond.Vars{Args: map[string]any{"a": 1}}
	if got, ok := v.ResolveName("args"); !ok || got.(map[string]any)["a"] != 1 {
		t.Errorf("ResolveName(args) = %v, %v", got, ok)
	}
	if got, ok := v.ResolveName("principal"); !ok || len(got.(map[string]any)) != 0 {
		t.Errorf("ResolveName(principal) of a nil map = %v, %v; want an empty map", got, ok)
	}
	v.Environment = "staging"
	if got, ok := v.ResolveName("env"); !ok || got.(map[string]any)["environment"] != "staging" {
		t.Errorf("ResolveName(env) = %v, %v; want environment staging", got, ok)
	}
	if _, ok := v.ResolveName("secrets"); ok {
		t.Error("ResolveName(secrets) resolved an undeclared name")
	}
	if v.Parent() != nil {
		t.Error("Parent() is not nil")
	}
}

func TestCleanPathAndResources(t *testing.T) {
	env, err := cond.NewEnv()
	if err != nil {
		t.Fatal(err)
	}
	p, err := env.Compile(`!has(args.path) || !clean_path(args.path).endsWith(".env")`)
	if err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]bool{
		"secrets.env": false, "secrets.env/": false, "./secrets.env/.": false, "notes/../secrets.env/": false,
		"notes/meeting.md": true, "env/notes.md": true,
	} {
		got, err := p.Eval(&cond.Vars{Args: map[string]any{"path": path}})
		if err != nil || got != want {
			t.Errorf("path %q: got %v %v, want %v", path, got, err, want)
		}
	}
	r, err := env.Compile(`resources.all(x, !x.name.endsWith(".env"))`)
	if err != nil {
		t.Fatal(err)
	}
	ok, err := r.Eval(&cond.Vars{Resources: []map[string]any{{"type": "fs", "name": "secrets.env", "action": "read"}}})
	if err != nil || ok {
		t.Errorf("resources condition: got %v %v, want false", ok, err)
	}
	ok, err = r.Eval(&cond.Vars{})
	if err != nil || !ok {
		t.Errorf("no resources: got %v %v, want true", ok, err)
	}
}
