package upstream_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/toolgate/toolgate/upstream"
)

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		cfg  upstream.Config
		want []string // substrings of the error, in order; nil: valid
	}{
		{
			name: "stdio ok",
			cfg: upstream.Config{Name: "ev", Transport: "stdio", Command: "node", Args: []string{"x.js"},
				Env: map[string]upstream.Secret{"TOKEN": {FromEnv: "GW_TOKEN"}}},
		},
		{
			name: "http ok",
			cfg: upstream.Config{Name: "goev1", Transport: "streamable-http", URL: "http://127.0.0.1:1/mcp",
				Headers: map[string]upstream.Secret{"Authorization": {Value: "Bearer x"}}},
		},
		{
			name: "name with a dash: tool:a-b-c would be upstream a-b's c and upstream a's b_c",
			cfg:  upstream.Config{Name: "a-b", Transport: "stdio", Command: "c"},
			want: []string{`upstream "a-b": name: must be 1 to 64 characters from [a-z0-9]`},
		},
		{
			name: "name with an underscore",
			cfg:  upstream.Config{Name: "a_b", Transport: "stdio", Command: "c"},
			want: []string{`upstream "a_b": name:`},
		},
		{
			name: "name with a dot",
			cfg:  upstream.Config{Name: "go.ev", Transport: "stdio", Command: "c"},
			want: []string{`upstream "go.ev": name:`},
		},
		{
			name: "upper-case name (ids are lower case)",
			cfg:  upstream.Config{Name: "Ev", Transport: "stdio", Command: "c"},
			want: []string{`upstream "Ev": name:`},
		},
		{
			name: "name too long",
			cfg:  upstream.Config{Name: strings.Repeat("a", 65), Transport: "stdio", Command: "c"},
			want: []string{`name: must be 1 to 64`},
		},
		{
			name: "bad name and transport",
			cfg:  upstream.Config{Name: "a b", Transport: "sse"},
			want: []string{`upstream "a b": name:`, `transport: must be "stdio" or "streamable-http", got "sse"`},
		},
		{
			name: "stdio without command, with url",
			cfg:  upstream.Config{Name: "x", Transport: "stdio", URL: "http://h/mcp"},
			want: []string{"command: required", "url: not allowed"},
		},
		{
			name: "stdio bad env",
			cfg: upstream.Config{Name: "x", Transport: "stdio", Command: "c",
				Env: map[string]upstream.Secret{"1BAD": {Value: "v"}, "EMPTY": {}, "TWO": {Value: "v", FromEnv: "E"}}},
			want: []string{"env.1BAD: not a valid", "env.EMPTY: secret: set exactly one", "env.TWO: secret: set exactly one"},
		},
		{
			name: "http bad url and header",
			cfg: upstream.Config{Name: "x", Transport: "streamable-http", URL: "ftp://h/",
				Headers: map[string]upstream.Secret{"Bad Header": {Value: "v"}}},
			want: []string{"url: must be an absolute http or https URL", "headers.Bad Header: not a valid HTTP header name"},
		},
		{
			name: "headers the transport sets itself, in any case",
			cfg: upstream.Config{Name: "x", Transport: "streamable-http", URL: "http://h/mcp",
				Headers: map[string]upstream.Secret{"Authorization": {Value: "Bearer x"}, "mcp-session-id": {Value: "fixed"},
					"Mcp-Protocol-Version": {Value: "2024-11-05"}, "content-type": {Value: "text/plain"}, "Last-Event-ID": {Value: "1"}, "Host": {Value: "evil"}}},
			want: []string{"headers.Host: set by the MCP transport", "headers.Last-Event-ID: set by", "headers.Mcp-Protocol-Version: set by",
				"headers.content-type: set by", "headers.mcp-session-id: set by"},
		},
		{
			name: "http with command",
			cfg:  upstream.Config{Name: "x", Transport: "streamable-http", URL: "http://h/mcp", Command: "node"},
			want: []string{"command, args, env and dir are not allowed"},
		},
		{
			name: "negative timeouts",
			cfg:  upstream.Config{Name: "x", Transport: "stdio", Command: "c", CallTimeout: -1, ConnectTimeout: -1},
			want: []string{"call_timeout: must not be negative", "connect_timeout: must not be negative"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if tc.want == nil {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate() = nil, want errors %q", tc.want)
			}
			msg := err.Error()
			for _, w := range tc.want {
				i := strings.Index(msg, w)
				if i < 0 {
					t.Fatalf("Validate() = %q, missing %q", err, w)
				}
				msg = msg[i+len(w):]
			}
		})
	}
}

func TestNewRejectsDuplicateNames(t *testing.T) {
	cfg := upstream.Config{Name: "a", Transport: "stdio", Command: "c"}
	_, err := upstream.New([]upstream.Config{cfg, cfg}, nil)
	if err == nil || !strings.Contains(err.Error(), `upstream "a": name: configured more than once`) {
		t.Fatalf("New(duplicate names) = %v, want a duplicate-name error", err)
	}
}

func TestSecretResolve(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	t.Setenv("TG_TEST_SECRET_SET", "from-env")
	t.Setenv("TG_TEST_SECRET_EMPTY", "")
	tests := []struct {
		name    string
		s       upstream.Secret
		want    string
		wantErr string
	}{
		{name: "literal", s: upstream.Secret{Value: "lit"}, want: "lit"},
		{name: "env", s: upstream.Secret{FromEnv: "TG_TEST_SECRET_SET"}, want: "from-env"},
		{name: "file with newline", s: upstream.Secret{FromFile: write("nl", "tok\n")}, want: "tok"},
		{name: "file with crlf", s: upstream.Secret{FromFile: write("crlf", "tok\r\n")}, want: "tok"},
		{name: "file without newline", s: upstream.Secret{FromFile: write("plain", "tok")}, want: "tok"},
		{name: "env unset", s: upstream.Secret{FromEnv: "TG_TEST_SECRET_UNSET"}, wantErr: "environment variable TG_TEST_SECRET_UNSET is not set"},
		{name: "env empty", s: upstream.Secret{FromEnv: "TG_TEST_SECRET_EMPTY"}, wantErr: "[secret:env:TG_TEST_SECRET_EMPTY] is empty"},
		{name: "file missing", s: upstream.Secret{FromFile: filepath.Join(dir, "nope")}, wantErr: "no such file"},
		{name: "two lines", s: upstream.Secret{FromFile: write("two", "a\nb\n")}, wantErr: "contains CR, LF or NUL"},
		{name: "zero", s: upstream.Secret{}, wantErr: "set exactly one"},
		{name: "bad env name", s: upstream.Secret{FromEnv: "A-B"}, wantErr: "not a valid environment variable name"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.s.Resolve()
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Resolve() = %q, %v; want error containing %q", got, err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("Resolve() = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

// TestSecretNeverShown prints secrets and configs holding them in every way a
// log line or error could, and checks the value never appears.
func TestSecretNeverShown(t *testing.T) {
	const value = "hunter2-very-secret"
	dir := t.TempDir()
	file := filepath.Join(dir, "tok")
	if err := os.WriteFile(file, []byte(value+"\nsecond line"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("TG_TEST_SECRET_VALUE", value+"\n")
	secrets := map[string]upstream.Secret{
		"literal": {Value: value},
		"env":     {FromEnv: "TG_TEST_SECRET_VALUE"},
		"file":    {FromFile: file},
		"invalid": {Value: value, FromEnv: "X"},
	}
	for name, s := range secrets {
		t.Run(name, func(t *testing.T) {
			cfg := upstream.Config{Name: "x", Transport: "streamable-http", URL: "http://127.0.0.1/mcp",
				Headers: map[string]upstream.Secret{"Authorization": s}}
			var outputs []string
			for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x", "%X", "%d", "%T"} {
				outputs = append(outputs, fmt.Sprintf(verb, s), fmt.Sprintf(verb, &s), fmt.Sprintf(verb, cfg.Headers))
			}
			outputs = append(outputs, s.String(), fmt.Sprint(s), fmt.Sprintln(s))
			var logBuf bytes.Buffer
			for _, h := range []slog.Handler{slog.NewTextHandler(&logBuf, nil), slog.NewJSONHandler(&logBuf, nil)} {
				slog.New(h).Info("cfg", "secret", s, "cfg", cfg, "headers", cfg.Headers)
			}
			outputs = append(outputs, logBuf.String())
			b, err := json.Marshal(cfg)
			if err != nil {
				t.Fatal(err)
			}
			outputs = append(outputs, string(b))
			if _, err := s.Resolve(); err != nil {
				outputs = append(outputs, err.Error())
			}
			if err := cfg.Validate(); err != nil {
				outputs = append(outputs, err.Error())
			}
			for _, out := range outputs {
				if strings.Contains(out, value) || strings.Contains(out, fmt.Sprintf("%x", value)) {
					t.Errorf("secret value shown in %q", out)
				}
			}
		})
	}
}

func TestConfigLogValueRedactsURL(t *testing.T) {
	cfg := upstream.Config{Name: "x", Transport: "streamable-http", URL: "http://user:pa55word@127.0.0.1/mcp",
		Headers: map[string]upstream.Secret{"Authorization": {Value: "pa55word"}}}
	var buf bytes.Buffer
	slog.New(slog.NewTextHandler(&buf, nil)).Info("cfg", "cfg", cfg)
	if strings.Contains(buf.String(), "pa55word") || !strings.Contains(buf.String(), "cfg.headers=[Authorization]") {
		t.Errorf("log line %q shows the password or lacks the header names", buf.String())
	}
}

func TestSecretJSON(t *testing.T) {
	tests := []struct {
		name     string
		in       string
		want     upstream.Secret
		wantErr  bool
		wantBack string
	}{
		{name: "string", in: `"lit"`, want: upstream.Secret{Value: "lit"}, wantBack: `{"value":"[redacted]"}`},
		{name: "env", in: `{"from_env":"TOK"}`, want: upstream.Secret{FromEnv: "TOK"}, wantBack: `{"from_env":"TOK"}`},
		{name: "file", in: `{"from_file":"/run/tok"}`, want: upstream.Secret{FromFile: "/run/tok"}, wantBack: `{"from_file":"/run/tok"}`},
		{name: "value", in: `{"value":"lit"}`, want: upstream.Secret{Value: "lit"}, wantBack: `{"value":"[redacted]"}`},
		{name: "two sources", in: `{"value":"lit","from_env":"TOK"}`, wantErr: true},
		{name: "unknown key", in: `{"valeu":"lit"}`, wantErr: true},
		{name: "empty string", in: `""`, wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var got upstream.Secret
			err := json.Unmarshal([]byte(tc.in), &got)
			if tc.wantErr {
				if err == nil {
					t.Fatalf("Unmarshal(%s) = %+v, want an error", tc.in, got)
				}
				if strings.Contains(err.Error(), "lit") {
					t.Errorf("error %q echoes the input", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Unmarshal(%s): %v", tc.in, err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Unmarshal(%s) (-want +got):\n%s", tc.in, diff)
			}
			back, err := json.Marshal(got)
			if err != nil || string(back) != tc.wantBack {
				t.Errorf("Marshal = %s, %v; want %s", back, err, tc.wantBack)
			}
		})
	}
}
