package identity_test

import (
	"encoding/json"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/toolgate/toolgate/identity"
	"github.com/toolgate/toolgate/policy"
)

func TestParseGrant(t *testing.T) {
	cases := []struct {
		in      string
		want    policy.Grant
		wantErr bool
	}{
		{"tool:invoke:all", policy.Grant{Resource: "tool", Action: "invoke", Scope: policy.Scope{All: true}}, false},
		{"tool:invoke:fs_read_text_file", policy.Grant{Resource: "tool", Action: "invoke", Scope: policy.Scope{Tool: "fs_read_text_file"}}, false},
		{"tool:invoke:tool:fs-read", policy.Grant{Resource: "tool", Action: "invoke", Scope: policy.Scope{Tool: "tool:fs-read"}}, false},
		{"approval:decide:fs_write_file", policy.Grant{Resource: "approval", Action: "decide", Scope: policy.Scope{Tool: "fs_write_file"}}, false},
		{"bifrost_query:read:vala.datasets", policy.Grant{Resource: "bifrost_query", Action: "read", Scope: policy.Scope{Name: "vala.datasets"}}, false},
		{"sql_table:read:name=main.tickets", policy.Grant{Resource: "sql_table", Action: "read", Scope: policy.Scope{Name: "main.tickets"}}, false},
		{"x:y:tool=bifrost.query", policy.Grant{Resource: "x", Action: "y", Scope: policy.Scope{Tool: "bifrost.query"}}, false},
		{"tool:invoke", policy.Grant{}, true},
		{"tool::all", policy.Grant{}, true},
		{"*:invoke:all", policy.Grant{}, true},
		{"tool:invoke:Not A Tool", policy.Grant{}, true},
		{"tool:invoke:tool=", policy.Grant{}, true},
		{"mcp_resource:read:upstream=docs", policy.Grant{Resource: "mcp_resource", Action: "read", Scope: policy.Scope{Upstream: "docs"}}, false},
		{"mcp_resource:read:upstream=docs,uri=file:///docs/{+path}", policy.Grant{Resource: "mcp_resource", Action: "read", Scope: policy.Scope{Upstream: "docs", URI: "file:///docs/{+path}"}}, false},
		{"mcp_resource:read:upstream=docs,uri=file:///a,b", policy.Grant{Resource: "mcp_resource", Action: "read", Scope: policy.Scope{Upstream: "docs", URI: "file:///a,b"}}, false},
		{"prompt:get:upstream=docs,prompt=summarize", policy.Grant{Resource: "prompt", Action: "get", Scope: policy.Scope{Upstream: "docs", Prompt: "summarize"}}, false},
		{"mcp_resource:write:upstream=docs", policy.Grant{}, true},
		{"mcp_resource:read:upstream=docs,prompt=x", policy.Grant{}, true},
		{"prompt:get:upstream=docs,uri=file:///x", policy.Grant{}, true},
		{"mcp_resource:read:upstream=docs,uri=file:///docs/{+path", policy.Grant{}, true},
		{"mcp_resource:read:upstream=docs,size=3", policy.Grant{}, true},
		{"tool:invoke:upstream=docs", policy.Grant{}, true},
		{"mcp_resource:read:docs", policy.Grant{}, true},
	}
	for _, tc := range cases {
		t.Run(tc.in, func(t *testing.T) {
			got, err := identity.ParseGrant(tc.in)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err %v, wantErr %v", err, tc.wantErr)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("grant (-want +got):\n%s", diff)
			}
		})
	}
}

func TestGrantJSON(t *testing.T) {
	cases := []struct {
		name    string
		in      string
		want    identity.Grant
		wantErr bool
	}{
		{"all", `{"resource":"tool","action":"invoke","scope":"all"}`, identity.Grant{Resource: "tool", Action: "invoke", Scope: policy.Scope{All: true}}, false},
		{"tool", `{"resource":"tool","action":"invoke","scope":{"tool":"bifrost.query"}}`, identity.Grant{Resource: "tool", Action: "invoke", Scope: policy.Scope{Tool: "bifrost.query"}}, false},
		{"name with when", `{"resource":"bifrost_query","action":"read","scope":{"name":"vala"},"when":"true"}`,
			identity.Grant{Resource: "bifrost_query", Action: "read", Scope: policy.Scope{Name: "vala"}, When: "true"}, false},
		{"string form", `"bifrost_query:read:vala.datasets"`, identity.Grant{Resource: "bifrost_query", Action: "read", Scope: policy.Scope{Name: "vala.datasets"}}, false},
		{"no scope", `{"resource":"tool","action":"invoke"}`, identity.Grant{}, true},
		{"both scopes", `{"resource":"tool","action":"invoke","scope":{"tool":"a","name":"b"}}`, identity.Grant{}, true},
		{"unknown field", `{"resource":"tool","action":"invoke","scope":"all","extra":1}`, identity.Grant{}, true},
		{"unknown scope word", `{"resource":"tool","action":"invoke","scope":"everything"}`, identity.Grant{}, true},
		{"an upstream", `{"resource":"mcp_resource","action":"read","scope":{"upstream":"docs"}}`,
			identity.Grant{Resource: "mcp_resource", Action: "read", Scope: policy.Scope{Upstream: "docs"}}, false},
		{"an upstream's uri", `{"resource":"mcp_resource","action":"read","scope":{"upstream":"docs","uri":"file:///docs/{+path}"}}`,
			identity.Grant{Resource: "mcp_resource", Action: "read", Scope: policy.Scope{Upstream: "docs", URI: "file:///docs/{+path}"}}, false},
		{"an upstream's prompt", `{"resource":"prompt","action":"get","scope":{"upstream":"docs","prompt":"summarize"}}`,
			identity.Grant{Resource: "prompt", Action: "get", Scope: policy.Scope{Upstream: "docs", Prompt: "summarize"}}, false},
		{"a uri without an upstream", `{"resource":"mcp_resource","action":"read","scope":{"uri":"file:///x"}}`, identity.Grant{}, true},
		{"a uri and a prompt", `{"resource":"mcp_resource","action":"read","scope":{"upstream":"d","uri":"file:///x","prompt":"p"}}`, identity.Grant{}, true},
		{"an upstream and a tool", `{"resource":"mcp_resource","action":"read","scope":{"upstream":"d","tool":"x"}}`, identity.Grant{}, true},
		{"a scope key twice", `{"resource":"mcp_resource","action":"read","scope":{"upstream":"d","upstream":"e"}}`, identity.Grant{}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var got identity.Grant
			err := json.Unmarshal([]byte(tc.in), &got)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err %v, wantErr %v", err, tc.wantErr)
			}
			if tc.wantErr {
				return
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("grant (-want +got):\n%s", diff)
			}
			raw, err := json.Marshal(got)
			if err != nil {
				t.Fatal(err)
			}
			var back identity.Grant
			if err := json.Unmarshal(raw, &back); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(got, back, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("round trip (-want +got):\n%s", diff)
			}
		})
	}
}

// FuzzParseGrant: the CLI grant parser never panics, and what it accepts
// survives the JSON round trip a token makes.
func FuzzParseGrant(f *testing.F) {
	for _, s := range []string{"tool:invoke:all", "tool:invoke:fs.read", "a:b:name=c.d", "tool:invoke:tool:fs-read", "x:y:tool=", "::"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		g, err := identity.ParseGrant(s)
		if err != nil {
			return
		}
		raw, err := json.Marshal(identity.GrantOf(g))
		if err != nil {
			t.Fatalf("%q: marshal: %v", s, err)
		}
		var back identity.Grant
		if err := json.Unmarshal(raw, &back); err != nil {
			t.Fatalf("%q: %s does not decode: %v", s, raw, err)
		}
		if diff := cmp.Diff(g, back.Policy()); diff != "" {
			t.Fatalf("%q: round trip (-want +got):\n%s", s, diff)
		}
	})
}
