package policy_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/toolgate/toolgate"
	"github.com/toolgate/toolgate/authz"
	"github.com/toolgate/toolgate/policy"
)

// maxFuzzInput bounds one fuzz input, so that each execution (and the
// fuzzer's minimization, which runs thousands of them) stays fast.
const maxFuzzInput = 2 << 10

// compact writes a YAML node in flow style, one line per document.
func compact(f *testing.F, n *yaml.Node) []byte {
	var setFlow func(n *yaml.Node)
	setFlow = func(n *yaml.Node) {
		n.HeadComment, n.LineComment, n.FootComment = "", "", ""
		if n.Kind == yaml.MappingNode || n.Kind == yaml.SequenceNode {
			n.Style = yaml.FlowStyle
		}
		for _, c := range n.Content {
			setFlow(c)
		}
	}
	setFlow(n)
	b, err := yaml.Marshal(n)
	if err != nil {
		f.Fatal(err)
	}
	return b
}

// fuzzSeeds returns the documents of the example bundle, one seed each, and
// every conformance scenario's bundle, in compact flow style.
func fuzzSeeds(f *testing.F) [][]byte {
	var out [][]byte
	files, _ := filepath.Glob(filepath.Join("..", "examples", "bundle", "*.yaml"))
	for _, p := range files {
		data, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		var docs []yaml.Node
		if err := yaml.Unmarshal(data, &docs); err != nil {
			f.Fatalf("%s: %v", p, err)
		}
		for i := range docs {
			out = append(out, compact(f, &docs[i]))
		}
	}
	dir := os.Getenv("TOOLGATE_CONFORMANCE_DIR")
	if dir == "" {
		dir = filepath.Join("..", "..", "shared", "conformance")
	}
	scenarios, _ := filepath.Glob(filepath.Join(dir, "*.yaml"))
	for _, p := range scenarios {
		data, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		var cf struct {
			Bundle yaml.Node `yaml:"bundle"`
		}
		if err := yaml.Unmarshal(data, &cf); err != nil {
			f.Fatalf("%s: %v", p, err)
		}
		out = append(out, compact(f, &cf.Bundle))
	}
	// The resource and prompt shapes (authz's access bundle), one document
	// per seed.
	if data, err := os.ReadFile(filepath.Join("..", "authz", "testdata", "access", "bundle.yaml")); err == nil {
		var docs yaml.Node
		if err := yaml.Unmarshal(data, &docs); err != nil {
			f.Fatal(err)
		}
		out = append(out, compact(f, &docs))
		if len(docs.Content) == 1 {
			for _, d := range docs.Content[0].Content {
				out = append(out, compact(f, d))
			}
		}
	}
	return append(out,
		[]byte("kind: Tool\ntool_id: tool:a-b\nside_effect_class: none\n"),
		[]byte("- {kind: Upstream, name: u, transport: stdio, command: c}\n- {kind: Tool, tool_id: tool:u-x, side_effect_class: read, source: {mcp_server: u}}\n- {kind: Agent, agent_id: a, tool_permissions: [{tool_id: tool:u-x, side_effect_class: read}], resource_permissions: [{upstream: u, uri: 'f:///{+p}'}]}\n- {kind: RuntimePolicy, agent_id: a, deployment_mode: production, tool_authorization_policy: {active_tool_set: all}}\n"),
		[]byte("- {kind: Tool, name: a.b, side_effect_class: read}\n- {kind: Tool, name: a_b, side_effect_class: read}\n"),
		[]byte("kind: Tool\nkind: Agent\n"),
		[]byte("- &a {kind: Tool}\n- *a\n"),
		[]byte("---\n---\nkind: Settings\n---\n[1, 2]\n"),
		[]byte("- {kind: Principal, principal_id: a, delegated_from: b}\n- {kind: Principal, principal_id: b, delegated_from: a}\n"),
		[]byte("- kind: Principal\n  principal_id: p\n  grants: [{resource: tool, action: invoke, scope: {tool: a_b}, when: 'args.x > 1'}]\n"),
		[]byte("- kind: ToolPolicy\n  name: x\n  denied: ['tool:[']\n  policy_guard: [{tools: ['tool:*'], effect: allow, when: 'true'}]\n"),
		[]byte("{kind: Instance, instance_id: i, environment_overrides: {s: {tool_suspensions: [tool:a-b]}}}"),
		[]byte("\xff\xfe"),
		[]byte(""),
	)
}

// FuzzBundleDecode feeds arbitrary bytes to the strict loader and the
// validator: neither may panic, and a bundle Validate accepts must compile
// and answer Resolve and Decide without an internal error.
func FuzzBundleDecode(f *testing.F) {
	for _, s := range fuzzSeeds(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > maxFuzzInput {
			return // keep each execution small
		}
		b := &policy.Bundle{}
		b.AddYAML("fuzz.yaml", data)
		rep := b.Validate(nil)
		for _, d := range rep.Errors {
			if d.File != "fuzz.yaml" {
				t.Fatalf("error names file %q, want fuzz.yaml: %s", d.File, d)
			}
			if strings.Contains(d.Message, "internal error") {
				t.Fatalf("the loader recovered from a panic: %s", d)
			}
		}
		if !rep.OK() {
			return
		}
		snap, _, err := authz.Compile(b, nil)
		if err != nil {
			t.Fatalf("Validate accepted the bundle but Compile failed: %v", err)
		}
		var ups []string
		for _, u := range b.Upstreams {
			ups = append(ups, u.Name)
		}
		for _, a := range snap.AgentIDs() {
			res := snap.Resolve(authz.Context{AgentID: a})
			for _, st := range res.Tools {
				d := snap.Decide(&toolgate.Call{AgentID: a, Tool: st.ToolID, ToolLevel: true})
				if d.Code == toolgate.CodeInternalError {
					t.Fatalf("Decide(%s, %s): %s", a, st.ToolID, d.Reason)
				}
			}
			for _, up := range ups {
				for _, acc := range []toolgate.Access{
					{Kind: toolgate.AccessResourceRead, URI: "file:///docs/a.md"},
					{Kind: toolgate.AccessResourceComplete, URI: "file:///docs/{+path}", Template: true, Args: map[string]any{}},
					{Kind: toolgate.AccessPromptGet, Prompt: "summarize", Args: map[string]any{"n": 1.0}},
				} {
					acc.AgentID, acc.Principal, acc.Upstream = a, "user:alice", up
					if d := snap.DecideAccess(&acc); d.Code == toolgate.CodeInternalError {
						t.Fatalf("DecideAccess(%s, %s %s): %s", a, acc.Kind, up, d.Reason)
					}
				}
			}
		}
	})
}
