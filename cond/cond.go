// Package cond compiles and evaluates argument conditions: CEL expressions
// (cel-go) that grants and tool policy rules attach with "when:"
// (docs/design.md, "The decision", check 9). An expression is compiled
// once when the bundle is compiled;
// evaluating it does no I/O and is bounded by a cost limit, so a hostile
// expression cannot stall the decision.
//
// Variables, all maps from string to dynamic values:
//
//	args       the call's decoded JSON arguments
//	principal  {id, roles}
//	agent      {id, version, runtime_engine}
//	tool       {id, name, side_effect_class}
//	env        {environment, instance_id, deployment_mode}
//	resources  [{type, name, action}]: what the call touches, as the
//	           adapter reports it (a built-in tool's real files and tables)
//	resource   for a resource access: {upstream, uri, template, action}
//	           (uri as it is sent upstream, or the template's text when
//	           template is true; action read, subscribe or complete);
//	           empty otherwise
//	prompt     for a prompt access: {upstream, name (the upstream's own),
//	           visible_name (as the model sees it), action (get or
//	           complete)}; empty otherwise
//
// Functions beyond standard CEL: clean_path(string) returns the path with
// "." and ".." elements and repeated or trailing slashes resolved
// lexically (Go's path.Clean), so "notes/../secrets.env/" and
// "secrets.env" compare equal; conditions on paths should use it.
//
// An expression must have type bool. A missing key (args.amount when the
// call has no amount) is an evaluation error, and an evaluation error
// denies: write has(args.amount) && args.amount <= 100 to allow calls
// without the field.
package cond

import (
	"fmt"
	"path"

	"cel.dev/cel-go/cel"
	"cel.dev/cel-go/common/cost"
	"cel.dev/cel-go/common/types"
	"cel.dev/cel-go/common/types/ref"
	"cel.dev/cel-go/interpreter"
)

// noEstimates leaves every size unknown, so the estimate is a true worst case.
type noEstimates struct{}

func (noEstimates) EstimateCallCost(string, string, *cost.AstNode, []cost.AstNode) *cost.CallEstimate {
	return nil
}
func (noEstimates) EstimateSize(cost.AstNode) *cost.SizeEstimate { return nil }

// CostLimit bounds one evaluation, in cel-go cost units.
const CostLimit = 10_000

// MaxExprLen bounds the source of one expression, in bytes.
const MaxExprLen = 4096

// Env is a compiled CEL environment with the condition variables declared.
// It is safe for concurrent use.
type Env struct{ env *cel.Env }

// NewEnv returns the environment every condition compiles in.
func NewEnv() (*Env, error) {
	dynMap := cel.MapType(cel.StringType, cel.DynType)
	env, err := cel.NewEnv(
		cel.Variable("args", dynMap),
		cel.Variable("principal", dynMap),
		cel.Variable("agent", dynMap),
		cel.Variable("tool", dynMap),
		cel.Variable("env", dynMap),
		cel.Variable("resources", cel.ListType(dynMap)),
		cel.Variable("resource", dynMap),
		cel.Variable("prompt", dynMap),
		cel.Function("clean_path", cel.Overload("clean_path_string", []*cel.Type{cel.StringType}, cel.StringType,
			cel.UnaryBinding(func(v ref.Val) ref.Val {
				s, ok := v.(types.String)
				if !ok {
					return types.NewErr("clean_path: want a string")
				}
				return types.String(path.Clean(string(s)))
			}))),
	)
	if err != nil {
		return nil, fmt.Errorf("cel environment: %w", err)
	}
	return &Env{env: env}, nil
}

// Program is one compiled condition. It is immutable and safe for
// concurrent use.
type Program struct {
	// Expr is the source text.
	Expr string
	prg  cel.Program
}

// Compile parses and type-checks expr; the error says why it does not
// compile or that it is not boolean.
func (e *Env) Compile(expr string) (*Program, error) {
	if len(expr) > MaxExprLen {
		return nil, fmt.Errorf("condition is %d bytes, longer than %d", len(expr), MaxExprLen)
	}
	ast, iss := e.env.Compile(expr)
	if iss.Err() != nil {
		return nil, fmt.Errorf("condition %q does not compile: %w", expr, iss.Err())
	}
	if !ast.OutputType().IsExactType(cel.BoolType) && !ast.OutputType().IsExactType(cel.DynType) {
		return nil, fmt.Errorf("condition %q has type %s, want bool", expr, ast.OutputType())
	}
	// Runtime cost tracking costs allocations on every evaluation; it is
	// needed only when the static worst case is unbounded or over the limit
	// (a comprehension over args, say).
	opts := []cel.ProgramOption{cel.EvalOptions(cel.OptOptimize)}
	est, err := e.env.EstimateCost(ast, noEstimates{})
	if err != nil || est.Max > CostLimit {
		opts = append(opts, cel.CostLimit(CostLimit))
	}
	prg, err := e.env.Program(ast, opts...)
	if err != nil {
		return nil, fmt.Errorf("condition %q: %w", expr, err)
	}
	return &Program{Expr: expr, prg: prg}, nil
}

// Vars are the values a condition sees. Nil maps are empty. The env map
// is built from the three fields only when an expression reads it.
type Vars struct {
	Args, Principal, Agent, Tool map[string]any
	// Resources are the call's resources as {type, name, action} maps.
	Resources []map[string]any
	// Resource and Prompt describe a resource or prompt access (the
	// package comment lists their keys); nil for a tool call.
	Resource, Prompt map[string]any

	Environment, InstanceID, DeploymentMode string
}

var emptyMap = map[string]any{}

// ResolveName implements interpreter.Activation.
func (v *Vars) ResolveName(name string) (any, bool) {
	var m map[string]any
	switch name {
	case "args":
		m = v.Args
	case "principal":
		m = v.Principal
	case "agent":
		m = v.Agent
	case "tool":
		m = v.Tool
	case "resource":
		m = v.Resource
	case "prompt":
		m = v.Prompt
	case "resources":
		if v.Resources == nil {
			return []map[string]any{}, true
		}
		return v.Resources, true
	case "env":
		m = map[string]any{"environment": v.Environment, "instance_id": v.InstanceID, "deployment_mode": v.DeploymentMode}
	default:
		return nil, false
	}
	if m == nil {
		m = emptyMap
	}
	return m, true
}

// Parent implements interpreter.Activation.
func (v *Vars) Parent() interpreter.Activation { return nil }

// Eval runs the condition. It returns false and an error when evaluation
// fails (a missing key, a type mismatch, the cost limit) or the result is not
// a bool; callers deny on any error.
func (p *Program) Eval(v *Vars) (ok bool, err error) {
	defer func() {
		if r := recover(); r != nil {
			ok, err = false, fmt.Errorf("condition %q panicked: %v", p.Expr, r)
		}
	}()
	out, _, err := p.prg.Eval(v)
	if err != nil {
		return false, fmt.Errorf("condition %q: %w", p.Expr, err)
	}
	b, isBool := out.Value().(bool)
	if !isBool {
		return false, fmt.Errorf("condition %q returned %v, not a bool", p.Expr, out.Value())
	}
	return b, nil
}
