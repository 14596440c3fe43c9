package upstream

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"
)

// Transport names accepted in Config.Transport.
const (
	// TransportStdio runs the upstream as a subprocess and speaks MCP over
	// its stdin and stdout.
	TransportStdio = "stdio"
	// TransportStreamableHTTP speaks MCP Streamable HTTP to Config.URL.
	TransportStreamableHTTP = "streamable-http"
)

// Defaults for the zero values of Config and Options durations.
const (
	// DefaultCallTimeout bounds one tools/call when Config.CallTimeout is 0.
	DefaultCallTimeout = 60 * time.Second
	// DefaultConnectTimeout bounds starting, initializing and listing the
	// tools of an upstream when Config.ConnectTimeout is 0.
	DefaultConnectTimeout = 30 * time.Second
	// DefaultBackoffBase is the first restart delay when Options.BackoffBase
	// is 0.
	DefaultBackoffBase = 500 * time.Millisecond
	// DefaultBackoffMax caps the restart delay when Options.BackoffMax is 0.
	DefaultBackoffMax = 30 * time.Second
	// DefaultHealthInterval is how often an upstream that is up is checked
	// when Options.HealthInterval is 0.
	DefaultHealthInterval = 5 * time.Second
	// DefaultHealthTimeout bounds one health check when
	// Options.HealthTimeout is 0.
	DefaultHealthTimeout = 2 * time.Second
)

// Config describes one upstream MCP server. It is plain data; New validates
// it. Fields that do not apply to the chosen transport must be empty.
type Config struct {
	// Name identifies the upstream in the Manager, in logs and in errors,
	// and is the provider part of its tools' ids (tool:<name>-<tool>): 1 to
	// 64 characters from [a-z0-9], unique within a Manager. No separator
	// is allowed, so that the id names one (upstream, tool) pair only:
	// upstream "a-b" with tool "c" and upstream "a" with tool "b_c" would
	// both be tool:a-b-c.
	Name string
	// Transport is TransportStdio or TransportStreamableHTTP.
	Transport string

	// Command is the program a stdio upstream runs, looked up on the
	// gateway's PATH when not a path. Start node scripts directly
	// ("node", Args: ["/path/dist/index.js"]), not through npx, so that
	// signals reach the server. Required for stdio.
	Command string
	// Args are the command's arguments (stdio only).
	Args []string
	// Env is added to the subprocess environment (stdio only). The
	// subprocess gets PATH and HOME from the gateway and these variables,
	// nothing else of the gateway's environment. Values are Secrets,
	// resolved at each (re)start, so tokens can come from the gateway's
	// environment or a file without being written into the config.
	Env map[string]Secret
	// Dir is the subprocess's working directory (stdio only); "" means the
	// gateway's.
	Dir string

	// URL is the MCP endpoint of a streamable-http upstream, http or https,
	// e.g. "http://127.0.0.1:3001/mcp". Required for streamable-http.
	URL string
	// Headers are set on every HTTP request to the upstream (streamable-http
	// only), e.g. {"Authorization": {FromEnv: "UPSTREAM_TOKEN"}}. The
	// headers the transport itself sets (reservedHeaders: Mcp-Session-Id,
	// Mcp-Protocol-Version, Content-Type, Accept, Last-Event-ID and the
	// hop-by-hop ones) are refused: a fixed value would replace the
	// session's own on every request.
	Headers map[string]Secret

	// CallTimeout bounds one tools/call; 0 means DefaultCallTimeout.
	CallTimeout time.Duration
	// ConnectTimeout bounds one connection attempt: starting the process or
	// reaching the URL, the initialize handshake and the first tools/list;
	// 0 means DefaultConnectTimeout.
	ConnectTimeout time.Duration
}

func (c *Config) callTimeout() time.Duration {
	if c.CallTimeout > 0 {
		return c.CallTimeout
	}
	return DefaultCallTimeout
}

func (c *Config) connectTimeout() time.Duration {
	if c.ConnectTimeout > 0 {
		return c.ConnectTimeout
	}
	return DefaultConnectTimeout
}

// reservedHeaders are the headers (canonical form) the Streamable HTTP
// transport sets itself, or that HTTP itself owns.
var reservedHeaders = map[string]bool{
	"Mcp-Session-Id": true, "Mcp-Protocol-Version": true, "Content-Type": true, "Accept": true,
	"Last-Event-Id": true, "Content-Length": true, "Transfer-Encoding": true, "Host": true,
	"Connection": true, "Upgrade": true, "Te": true, "Trailer": true, "Keep-Alive": true,
	"Proxy-Connection": true,
}

var (
	nameRE    = regexp.MustCompile(`^[a-z0-9]{1,64}$`)
	envNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	// headerNameRE is an RFC 9110 token.
	headerNameRE = regexp.MustCompile("^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
)

// Validate reports every problem with c, joined, each naming the field; nil
// means the config is usable. It does not resolve secrets (that happens at
// connect time) and does not touch the file system or network.
func (c *Config) Validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("upstream %q: %s: %s", c.Name, field, fmt.Sprintf(format, args...)))
	}
	if !nameRE.MatchString(c.Name) {
		bad("name", "must be 1 to 64 characters from [a-z0-9] (it is the provider part of its tools' ids, tool:<name>-<tool>, so no separator)")
	}
	if c.CallTimeout < 0 {
		bad("call_timeout", "must not be negative")
	}
	if c.ConnectTimeout < 0 {
		bad("connect_timeout", "must not be negative")
	}
	switch c.Transport {
	case TransportStdio:
		if c.Command == "" {
			bad("command", "required for transport %q", TransportStdio)
		}
		if c.URL != "" {
			bad("url", "not allowed for transport %q", TransportStdio)
		}
		if len(c.Headers) > 0 {
			bad("headers", "not allowed for transport %q", TransportStdio)
		}
		for _, k := range sortedKeys(c.Env) {
			if !envNameRE.MatchString(k) {
				bad("env."+k, "not a valid environment variable name")
			}
			if err := c.Env[k].validate(); err != nil {
				bad("env."+k, "%v", err)
			}
		}
	case TransportStreamableHTTP:
		if c.URL == "" {
			bad("url", "required for transport %q", TransportStreamableHTTP)
		} else if u, err := url.Parse(c.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			bad("url", "must be an absolute http or https URL")
		}
		if c.Command != "" || len(c.Args) > 0 || len(c.Env) > 0 || c.Dir != "" {
			bad("command", "command, args, env and dir are not allowed for transport %q", TransportStreamableHTTP)
		}
		for _, k := range sortedKeys(c.Headers) {
			if !headerNameRE.MatchString(k) {
				bad("headers."+k, "not a valid HTTP header name")
			} else if reservedHeaders[http.CanonicalHeaderKey(k)] {
				bad("headers."+k, "set by the MCP transport itself; it cannot be configured")
			}
			if err := c.Headers[k].validate(); err != nil {
				bad("headers."+k, "%v", err)
			}
		}
	default:
		bad("transport", "must be %q or %q, got %q", TransportStdio, TransportStreamableHTTP, c.Transport)
	}
	return errors.Join(errs...)
}

// LogValue logs the config without secrets or arguments: name, transport,
// command or redacted URL, and the names (not values) of env and headers.
func (c Config) LogValue() slog.Value {
	attrs := []slog.Attr{slog.String("name", c.Name), slog.String("transport", c.Transport)}
	if c.Command != "" {
		attrs = append(attrs, slog.String("command", c.Command), slog.Int("args", len(c.Args)))
	}
	if c.URL != "" {
		attrs = append(attrs, slog.String("url", redactURL(c.URL)))
	}
	if len(c.Env) > 0 {
		attrs = append(attrs, slog.Any("env", sortedKeys(c.Env)))
	}
	if len(c.Headers) > 0 {
		attrs = append(attrs, slog.Any("headers", sortedKeys(c.Headers)))
	}
	return slog.GroupValue(attrs...)
}

// redactURL hides the password of a URL's user info; an unparsable URL is
// replaced entirely.
func redactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "<invalid url>"
	}
	return u.Redacted()
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// Secret is a value that must never be shown: a header or environment value
// given literally (Value), read from the gateway's environment variable
// FromEnv, or read from the file FromFile (one trailing newline removed).
// Exactly one of the three is set. It is resolved each time an upstream
// connects, so rotated files and variables take effect on the next restart.
//
// Printing a Secret in any way (fmt with any verb, slog, encoding/json)
// shows only where it comes from, never the value: "[secret:literal]",
// "[secret:env:VAR]" or "[secret:file:PATH]". Errors from Resolve name the
// source, not the value.
type Secret struct {
	// Value is the literal secret.
	Value string
	// FromEnv names an environment variable of the gateway process.
	FromEnv string
	// FromFile is the path of a file holding the secret.
	FromFile string
}

// String describes the secret's source, never its value.
func (s Secret) String() string {
	switch {
	case s.FromEnv != "" && s.Value == "" && s.FromFile == "":
		return "[secret:env:" + s.FromEnv + "]"
	case s.FromFile != "" && s.Value == "" && s.FromEnv == "":
		return "[secret:file:" + s.FromFile + "]"
	case s.Value != "" && s.FromEnv == "" && s.FromFile == "":
		return "[secret:literal]"
	default:
		return "[secret:invalid]"
	}
}

// GoString is String, so %#v does not show the value either.
func (s Secret) GoString() string { return s.String() }

// Format writes String for every verb, so no fmt verb shows the value.
func (s Secret) Format(f fmt.State, _ rune) { _, _ = f.Write([]byte(s.String())) }

// LogValue is String, for log/slog.
func (s Secret) LogValue() slog.Value { return slog.StringValue(s.String()) }

// MarshalJSON writes the source ({"from_env": "VAR"} or {"from_file":
// "PATH"}); a literal is written as {"value": "[redacted]"}, so a config
// written back out never holds the secret.
func (s Secret) MarshalJSON() ([]byte, error) {
	switch {
	case s.FromEnv != "":
		return json.Marshal(map[string]string{"from_env": s.FromEnv})
	case s.FromFile != "":
		return json.Marshal(map[string]string{"from_file": s.FromFile})
	default:
		return []byte(`{"value":"[redacted]"}`), nil
	}
}

// UnmarshalJSON reads a JSON string as a literal, or an object with exactly
// one of "value", "from_env" or "from_file". Unknown keys are errors.
func (s *Secret) UnmarshalJSON(b []byte) error {
	var lit string
	if err := json.Unmarshal(b, &lit); err == nil {
		*s = Secret{Value: lit}
		return s.validate()
	}
	var obj struct {
		Value    string `json:"value"`
		FromEnv  string `json:"from_env"`
		FromFile string `json:"from_file"`
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&obj); err != nil {
		// Do not echo the input: it may hold the secret.
		return errors.New(`secret: want a string or an object with one of "value", "from_env", "from_file"`)
	}
	*s = Secret{Value: obj.Value, FromEnv: obj.FromEnv, FromFile: obj.FromFile}
	return s.validate()
}

func (s Secret) validate() error {
	n := 0
	for _, v := range []string{s.Value, s.FromEnv, s.FromFile} {
		if v != "" {
			n++
		}
	}
	if n != 1 {
		return errors.New("secret: set exactly one of value, from_env, from_file")
	}
	if s.FromEnv != "" && !envNameRE.MatchString(s.FromEnv) {
		return fmt.Errorf("secret: from_env %q is not a valid environment variable name", s.FromEnv)
	}
	return nil
}

// Resolve returns the secret's value. It fails if the secret is invalid, the
// variable is unset or empty, the file cannot be read or is empty, or the
// value holds CR, LF or NUL (it must fit in a header or environment value).
// Errors name the source, never the value.
func (s Secret) Resolve() (string, error) {
	if err := s.validate(); err != nil {
		return "", err
	}
	v := s.Value
	switch {
	case s.FromEnv != "":
		var ok bool
		v, ok = os.LookupEnv(s.FromEnv)
		if !ok {
			return "", fmt.Errorf("secret: environment variable %s is not set", s.FromEnv)
		}
	case s.FromFile != "":
		b, err := os.ReadFile(s.FromFile)
		if err != nil {
			return "", fmt.Errorf("secret: %w", err)
		}
		v = strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r")
	}
	if v == "" {
		return "", fmt.Errorf("secret: %s is empty", s)
	}
	if strings.ContainsAny(v, "\r\n\x00") {
		return "", fmt.Errorf("secret: %s contains CR, LF or NUL", s)
	}
	return v, nil
}
