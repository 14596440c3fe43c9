package authz_test

// This test runs every scenario in ../shared/conformance (the seeds' cases as
// data, see its README). A new file there is picked up with no code change.
// TOOLGATE_CONFORMANCE_DIR overrides the folder.

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.yaml.in/yaml/v3"

	"github.com/toolgate/toolgate"
	"github.com/toolgate/toolgate/authz"
	"github.com/toolgate/toolgate/policy"
)

type confGiven struct {
	AgentID        string              `yaml:"agent_id"`
	DeploymentMode string              `yaml:"deployment_mode"`
	InstanceID     string              `yaml:"instance_id"`
	Environment    string              `yaml:"environment"`
	Principal      string              `yaml:"principal"`
	Tool           string              `yaml:"tool"`
	Args           map[string]any      `yaml:"args"`
	Resources      []toolgate.Resource `yaml:"resources"`
}

type confFile struct {
	Name     string    `yaml:"name"`
	Source   string    `yaml:"source"`
	Bundle   yaml.Node `yaml:"bundle"`
	Validate *struct {
		OK              bool     `yaml:"ok"`
		ErrorsMention   []string `yaml:"errors_mention"`
		WarningsMention []string `yaml:"warnings_mention"`
	} `yaml:"validate"`
	Resolve []struct {
		Given  confGiven `yaml:"given"`
		Expect struct {
			ActiveToolSet []string          `yaml:"active_tool_set"`
			Disclosed     []string          `yaml:"disclosed"`
			Removed       map[string]string `yaml:"removed"`
		} `yaml:"expect"`
	} `yaml:"resolve"`
	Decide []struct {
		Given  confGiven `yaml:"given"`
		Expect struct {
			Verdict        string   `yaml:"verdict"`
			Code           string   `yaml:"code"`
			Layer          string   `yaml:"layer"`
			Event          string   `yaml:"event"`
			ReasonMentions []string `yaml:"reason_mentions"`
		} `yaml:"expect"`
	} `yaml:"decide"`
}

// ConformanceDir returns the shared conformance folder.
func conformanceDir(t *testing.T) string {
	if d := os.Getenv("TOOLGATE_CONFORMANCE_DIR"); d != "" {
		return d
	}
	d, err := filepath.Abs(filepath.Join("..", "..", "shared", "conformance"))
	if err != nil {
		t.Fatal(err)
	}
	return d
}

const defaultPrincipal = "system:test"

func TestConformance(t *testing.T) {
	dir := conformanceDir(t)
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no conformance files in %s (set TOOLGATE_CONFORMANCE_DIR): %v", dir, err)
	}
	for _, f := range files {
		t.Run(strings.TrimSuffix(filepath.Base(f), ".yaml"), func(t *testing.T) {
			data, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			var cf confFile
			if err := yaml.Unmarshal(data, &cf); err != nil {
				t.Fatalf("decode %s: %v", f, err)
			}
			b := &policy.Bundle{}
			b.AddNode(f, &cf.Bundle)
			if len(b.Principals) == 0 {
				// The README's default: system:test holds tool:invoke on all.
				b.Principals = append(b.Principals, &policy.Principal{PrincipalID: defaultPrincipal,
					Grants: []policy.Grant{{Resource: "tool", Action: "invoke", Scope: policy.Scope{All: true}}}})
			}
			rep := b.Validate(nil)
			if cf.Validate != nil {
				if rep.OK() != cf.Validate.OK {
					t.Errorf("validate ok = %v, want %v; errors: %v", rep.OK(), cf.Validate.OK, rep.Errors)
				}
				for _, m := range cf.Validate.ErrorsMention {
					if !mentions(rep.Errors, m) {
						t.Errorf("no error mentions %q; errors: %v", m, rep.Errors)
					}
				}
				for _, m := range cf.Validate.WarningsMention {
					if !mentions(rep.Warnings, m) {
						t.Errorf("no warning mentions %q; warnings: %v", m, rep.Warnings)
					}
				}
			}
			if len(cf.Resolve) == 0 && len(cf.Decide) == 0 {
				return
			}
			snap, _, err := authz.Compile(b, nil)
			if err != nil {
				t.Fatalf("compile: %v", err)
			}
			for i, rc := range cf.Resolve {
				g := rc.Given
				res := snap.Resolve(authz.Context{AgentID: g.AgentID, DeploymentMode: g.DeploymentMode, InstanceID: g.InstanceID, Environment: g.Environment})
				if rc.Expect.ActiveToolSet != nil {
					if diff := cmp.Diff(sorted(rc.Expect.ActiveToolSet), sorted(res.ActiveToolSet)); diff != "" {
						t.Errorf("resolve[%d] active_tool_set (-want +got):\n%s", i, diff)
					}
				}
				if rc.Expect.Disclosed != nil {
					if diff := cmp.Diff(sorted(rc.Expect.Disclosed), sorted(res.Disclosed)); diff != "" {
						t.Errorf("resolve[%d] disclosed (-want +got):\n%s", i, diff)
					}
				}
				for id, layer := range rc.Expect.Removed {
					found := false
					for _, rm := range res.Removed {
						if rm.ToolID == id {
							found = true
							if string(rm.Layer) != layer {
								t.Errorf("resolve[%d] %s removed by %s, want %s (%s)", i, id, rm.Layer, layer, rm.Reason)
							}
						}
					}
					if !found {
						t.Errorf("resolve[%d] %s not removed, want removed by %s", i, id, layer)
					}
				}
			}
			for i, dc := range cf.Decide {
				g := dc.Given
				p := g.Principal
				if p == "" {
					p = defaultPrincipal
				}
				args := g.Args
				if args == nil {
					args = map[string]any{}
				}
				d := snap.Decide(&toolgate.Call{AgentID: g.AgentID, DeploymentMode: g.DeploymentMode, InstanceID: g.InstanceID,
					Environment: g.Environment, Principal: p, Tool: g.Tool, Args: args, Resources: g.Resources})
				x := dc.Expect
				if d.Verdict.String() != x.Verdict || string(d.Code) != x.Code {
					t.Errorf("decide[%d] %q: got %s/%s, want %s/%s (reason: %s)", i, g.Tool, d.Verdict, d.Code, x.Verdict, x.Code, d.Reason)
				}
				if x.Layer != "" && string(d.Layer) != x.Layer {
					t.Errorf("decide[%d] %q: layer %s, want %s", i, g.Tool, d.Layer, x.Layer)
				}
				if x.Event != "" && string(d.EventType) != x.Event {
					t.Errorf("decide[%d] %q: event %s, want %s", i, g.Tool, d.EventType, x.Event)
				}
				for _, m := range x.ReasonMentions {
					if !strings.Contains(d.Reason, m) {
						t.Errorf("decide[%d] %q: reason %q does not mention %q", i, g.Tool, d.Reason, m)
					}
				}
			}
		})
	}
}

func mentions(ds []policy.Diagnostic, s string) bool {
	for _, d := range ds {
		if strings.Contains(d.Message, s) {
			return true
		}
	}
	return false
}

func sorted(xs []string) []string {
	out := slices.Clone(xs)
	slices.Sort(out)
	if out == nil {
		out = []string{}
	}
	return out
}
