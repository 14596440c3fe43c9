package policy_test

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/toolgate/toolgate/policy"
)

// The identity settings' validation cases join TestValidate's table (the
// # want markers name each diagnostic's severity, file, line and text).
func init() {
	validateCases = append(validateCases, identityValidateCases...)
}

var identityValidateCases = []validateCase{
	{name: "jwt issuer without issuer, audience or keys", files: one("settings.yaml", base+`
- kind: Settings
  jwt_issuers:
    - {agent_id: worker}   # want error "issuer is required" # want error "audience is required" # want error "exactly one of jwks_file and jwks_url"
`)},
	{name: "jwt issuer with an empty audience value", files: one("settings.yaml", base+`
- kind: Settings
  jwt_issuers:
    - {issuer: "https://idp/", audience: [tg, ""], jwks_file: k.json, agent_id: worker}   # want error "audience values may not be empty"
`)},
	{name: "jwt issuer with both key sources", files: one("settings.yaml", base+`
- kind: Settings
  jwt_issuers:
    - {issuer: "https://idp/", audience: [tg], jwks_file: k.json, jwks_url: "https://idp/jwks", agent_id: worker}   # want error "exactly one of jwks_file and jwks_url"
`)},
	{name: "duplicate issuer", files: one("settings.yaml", base+`
- kind: Settings
  jwt_issuers:
    - {issuer: "https://idp/", audience: [tg], jwks_file: k.json, agent_id: worker}
    - {issuer: "https://idp/", audience: [tg], jwks_file: k.json, agent_id: worker}   # want error "already configured at settings.yaml:15"
`)},
	{name: "refused algorithms", files: one("settings.yaml", base+`
- kind: Settings
  jwt_issuers:
    - issuer: "https://idp/"   # want error "algorithm none is refused" # want error "HS256 is refused" # want error "\"XY1\" is not one of"
      audience: [tg]
      jwks_file: k.json
      agent_id: worker
      algorithms: [RS256, none, HS256, XY1]
`)},
	{name: "jwks url", files: one("settings.yaml", base+`
- kind: Settings
  jwt_issuers:
    - {issuer: a, audience: [tg], jwks_url: "ftp://idp/jwks", agent_id: worker}             # want error "absolute http(s) URL"
    - {issuer: b, audience: [tg], jwks_url: "http://idp.example/jwks", agent_id: worker}     # want warning "plain http"
    - {issuer: c, audience: [tg], jwks_url: "http://127.0.0.1:9/jwks", agent_id: worker}
    - {issuer: d, audience: [tg], jwks_url: "https://u:p@idp/jwks", agent_id: worker}       # want error "credentials"
    - {issuer: e, audience: [tg], jwks_url: "https://idp/jwks", jwks_refresh: 1s, agent_id: worker}   # want error "jwks_refresh must be at least"
`)},
	{name: "jwt bindings", files: one("settings.yaml", base+`
- kind: Settings
  jwt_issuers:
    - {issuer: a, audience: [tg], jwks_file: k.json}                                          # want error "agent_id is required"
    - {issuer: b, audience: [tg], jwks_file: k.json, agent_id: ghost}                         # want error "agent_id ghost is not a declared Agent"
    - {issuer: c, audience: [tg], jwks_file: k.json, agent_id: {claim: azp}, environment: {claim: env}}
    - {issuer: d, audience: [tg], jwks_file: k.json, agent_id: worker, deployment_mode: canary}   # want warning "no RuntimePolicy for deployment_mode canary"
    - {issuer: e, audience: [tg], jwks_file: k.json, agent_id: worker, clock_skew: 10m}       # want error "more than 5m0s"
`)},
	{name: "claim binding syntax", files: one("settings.yaml", base+`
- kind: Settings
  jwt_issuers:
    - {issuer: a, audience: [tg], jwks_file: k.json, agent_id: {claims: azp}}   # want error "unknown field \"claims\""
`)},
	{name: "delegation settings", files: one("settings.yaml", base+`
- kind: Settings
  delegations:
    default_ttl: 48h   # want error "default_ttl 48h0m0s is longer than max_ttl 24h0m0s" # want warning "not a delegation token id"
    revoked_ids: [abc]
`)},
}

func TestDelegationTTLs(t *testing.T) {
	h := func(d time.Duration) policy.Duration { return policy.Duration(d) }
	cases := []struct {
		name     string
		in       policy.DelegationSettings
		def, max time.Duration
	}{
		{"defaults", policy.DelegationSettings{}, time.Hour, 24 * time.Hour},
		{"short max lowers the default", policy.DelegationSettings{MaxTTL: h(10 * time.Minute)}, 10 * time.Minute, 10 * time.Minute},
		{"both set", policy.DelegationSettings{DefaultTTL: h(5 * time.Minute), MaxTTL: h(time.Hour)}, 5 * time.Minute, time.Hour},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			def, max := tc.in.TTLs()
			if diff := cmp.Diff([]time.Duration{tc.def, tc.max}, []time.Duration{def, max}); diff != "" {
				t.Errorf("ttls (-want +got):\n%s", diff)
			}
		})
	}
}
