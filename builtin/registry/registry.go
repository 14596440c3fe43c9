// Package registry builds toolgate's built-in tools from configuration and
// finds them by function name. It is the one place that knows every
// built-in family (builtin/fstool, builtin/sqltool), so the gateway and the
// decision only ever see the builtin.Tool contract.
//
// Workspaces are not part of the configuration: each call carries its own
// (builtin.Invocation.Workspace), given by the caller from the agent's step.
// Select applies the Wyrd registration rules for one agent's tool_names.
package registry

import (
	"context"
	"errors"
	"fmt"
	"sort"

	"github.com/toolgate/toolgate/builtin"
	"github.com/toolgate/toolgate/builtin/fstool"
	"github.com/toolgate/toolgate/builtin/sqltool"
)

// Config is the built-in tools' configuration. The zero value gives the
// file tools with their defaults and no SQL tools.
type Config struct {
	// ResultMaxKiB caps every tool's result, in KiB (default 64; the Wyrd
	// setting WYRD_VERIFICATION_TOOL_RESULT_MAX_KIB).
	ResultMaxKiB int `json:"result_max_kib,omitempty" yaml:"result_max_kib,omitempty"`
	// FS tunes fs.list, fs.read and fs.search; its result_max_kib, when
	// set, overrides ResultMaxKiB for them.
	FS fstool.Options `json:"fs" yaml:"fs"`
	// Databases are the databases the sql.* tools reach; with none, the
	// sql.* tools do not exist.
	Databases []sqltool.Config `json:"databases,omitempty" yaml:"databases,omitempty"`
}

// Errors Select wraps, for callers that branch on the cause.
var (
	// ErrUnknownTool: a name is not a built-in tool.
	ErrUnknownTool = errors.New("unknown built-in tool")
	// ErrNeedsWorkspace: a file tool was selected for an agent without a
	// workspace.
	ErrNeedsWorkspace = errors.New("file tool without a workspace")
	// ErrWorkspaceUnused: a workspace was given but no tool that uses it.
	ErrWorkspaceUnused = errors.New("workspace without a file tool")
)

// Registry holds the built-in tools. It is safe for concurrent use.
type Registry struct {
	tools map[string]builtin.Tool
	names []string
	dbs   []*sqltool.DB
}

// New validates cfg, opens every configured database and builds the tools.
// On error nothing stays open. Close releases the databases.
func New(ctx context.Context, cfg Config) (*Registry, error) {
	r := &Registry{tools: map[string]builtin.Tool{}}
	fsOpts := cfg.FS
	if fsOpts.ResultMaxKiB == 0 {
		fsOpts.ResultMaxKiB = cfg.ResultMaxKiB
	}
	if err := r.add(fstool.New(&fsOpts)); err != nil {
		return nil, err
	}
	if len(cfg.Databases) > 0 {
		for _, dc := range cfg.Databases {
			db, err := sqltool.Open(ctx, dc)
			if err != nil {
				r.Close()
				return nil, fmt.Errorf("builtin tools: %w", err)
			}
			r.dbs = append(r.dbs, db)
		}
		tools, err := sqltool.New(r.dbs, &sqltool.Options{Options: builtin.Options{ResultMaxKiB: cfg.ResultMaxKiB}})
		if err == nil {
			err = r.add(tools)
		}
		if err != nil {
			r.Close()
			return nil, fmt.Errorf("builtin tools: %w", err)
		}
	}
	sort.Strings(r.names)
	return r, nil
}

func (r *Registry) add(tools []builtin.Tool) error {
	for _, t := range tools {
		if _, dup := r.tools[t.Name()]; dup {
			return fmt.Errorf("builtin tools: %s defined twice", t.Name())
		}
		r.tools[t.Name()] = t
		r.names = append(r.names, t.Name())
	}
	return nil
}

// Lookup returns the tool with this exact function name ("fs.read").
func (r *Registry) Lookup(name string) (builtin.Tool, bool) {
	t, ok := r.tools[name]
	return t, ok
}

// Names returns every tool's function name, sorted.
func (r *Registry) Names() []string { return append([]string(nil), r.names...) }

// Tools returns every tool, sorted by name.
func (r *Registry) Tools() []builtin.Tool {
	out := make([]builtin.Tool, 0, len(r.names))
	for _, n := range r.names {
		out = append(out, r.tools[n])
	}
	return out
}

// Select resolves an agent's tool_names against the registry, in order,
// with the Wyrd registration rules: an unknown name fails (ErrUnknownTool),
// a file tool with workspace "" fails (ErrNeedsWorkspace), and a workspace
// with no file tool among names fails (ErrWorkspaceUnused). A tool is never
// silently dropped or replaced; duplicates are kept once.
func (r *Registry) Select(names []string, workspace string) ([]builtin.Tool, error) {
	var out []builtin.Tool
	seen := map[string]bool{}
	usesWorkspace := false
	for _, n := range names {
		t, ok := r.tools[n]
		if !ok {
			return nil, fmt.Errorf("%w: %q (built-in tools are %v)", ErrUnknownTool, n, r.names)
		}
		if t.Spec().NeedsWorkspace {
			if workspace == "" {
				return nil, fmt.Errorf("%w: %s needs a workspace and the agent has none", ErrNeedsWorkspace, n)
			}
			usesWorkspace = true
		}
		if !seen[n] {
			seen[n] = true
			out = append(out, t)
		}
	}
	if workspace != "" && !usesWorkspace {
		return nil, fmt.Errorf("%w: the agent has workspace %s but none of fs.list, fs.read, fs.search", ErrWorkspaceUnused, workspace)
	}
	return out, nil
}

// Close closes the databases.
func (r *Registry) Close() error {
	var errs []error
	for _, db := range r.dbs {
		errs = append(errs, db.Close())
	}
	r.dbs = nil
	return errors.Join(errs...)
}
