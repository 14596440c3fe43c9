package toolgate

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"math/big"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestCanonicalJSON(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want string
	}{
		{"absent", "", "{}"},
		{"whitespace only", " \n\t", "{}"},
		{"null", " null ", "{}"},
		{"empty object", "{ }", "{}"},
		{"keys sorted", `{"c":1,"a":2,"B":3,"aa":4}`, `{"B":3,"a":2,"aa":4,"c":1}`},
		{"whitespace removed", " {\r\n \"a\" :\t[ 1 , 2 , { } , [ ] ] } ", `{"a":[1,2,{},[]]}`},
		{"nested keys sorted", `{"z":{"y":1,"x":[{"b":0,"a":0}]},"a":null}`, `{"a":null,"z":{"x":[{"a":0,"b":0}],"y":1}}`},
		{"numbers as written", `{"a":1.0,"b":1e3,"c":-0,"d":1E+3,"e":0.10,"f":9007199254740992,"g":1.5e-7}`, `{"a":1.0,"b":1e3,"c":-0,"d":1E+3,"e":0.10,"f":9007199254740992,"g":1.5e-7}`},
		{"literals", `[true,false,null]`, `[true,false,null]`},
		{"escapes resolved", `{"a":"\u0041\/\"\\\n\t\b\f\r"}`, `{"a":"A/\"\\\n\t\b\f\r"}`},
		{"control character escaped", `"\u001f\u0000"`, `"\u001f\u0000"`},
		{"non-ASCII kept raw", `{"é":"\u00e9 ☃"}`, `{"é":"é ☃"}`},
		{"surrogate pair", `"\ud83d\ude00"`, `"😀"`},
		{"html not escaped", `"<&>\u003c"`, `"<&><"`},
		{"U+2028 raw", `"\u2028"`, "\"\u2028\""},
		{"scalar top level", ` 42 `, `42`},
		{"escaped key sorts by its value", `{"b":1,"\u0061":2}`, `{"a":2,"b":1}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := CanonicalJSON([]byte(tt.in))
			if err != nil {
				t.Fatalf("CanonicalJSON(%q): %v", tt.in, err)
			}
			if diff := cmp.Diff(tt.want, string(got)); diff != "" {
				t.Errorf("CanonicalJSON(%q) (-want +got):\n%s", tt.in, diff)
			}
		})
	}
}

func TestCanonicalJSONRejects(t *testing.T) {
	tests := []struct {
		name string
		in   string
	}{
		{"duplicate key", `{"a":1,"a":2}`},
		{"duplicate key nested", `{"x":[{"a":1,"b":0,"a":1}]}`},
		{"duplicate key via escape", `{"a":1,"\u0061":1}`},
		{"invalid UTF-8 in string", "{\"a\":\"\xff\"}"},
		{"invalid UTF-8 in key", "{\"\xc3\":1}"},
		{"lone high surrogate", `"\ud800"`},
		{"lone low surrogate", `"\udc00"`},
		{"high surrogate then letter", `"\ud800\u0041"`},
		{"high surrogate then raw", `"\ud800x"`},
		{"two values", `{} {}`},
		{"trailing garbage", `{}x`},
		{"leading zero", `01`},
		{"bare dot", `1.`},
		{"leading dot", `.5`},
		{"plus sign", `+1`},
		{"empty exponent", `1e`},
		{"minus alone", `-`},
		{"NaN", `NaN`},
		{"truncated literal", `tru`},
		{"single quotes", `{'a':1}`},
		{"unterminated string", `"abc`},
		{"unterminated object", `{"a":1`},
		{"unterminated array", `[1,2`},
		{"trailing comma", `[1,]`},
		{"missing colon", `{"a" 1}`},
		{"non-string key", `{1:2}`},
		{"raw control character", "\"a\nb\""},
		{"bad escape", `"\x41"`},
		{"short unicode escape", `"\u12"`},
		{"too deep", strings.Repeat("[", maxDepth+2) + strings.Repeat("]", maxDepth+2)},
		// Parser differentials: what the decision reads must be what
		// every tool reads.
		{"keys differ by case", `{"path":"a","Path":"b"}`},
		{"keys differ by case nested", `{"x":[{"cmd":"ls","CMD":"rm"}]}`},
		{"keys differ by case via escape", `{"path":1,"\u0050ath":2}`},
		{"Kelvin sign folds to k", "{\"k\":1,\"\u212a\":2}"},
		{"long s folds to s", "{\"s\":1,\"\u017f\":2}"},
		{"non-ASCII case", `{"é":1,"É":2}`},
		{"dotted capital I lowers to i", "{\"i\":1,\"\u0130\":2}"},
		{"integer beyond 2^53", `{"n":9007199254740993}`},
		{"integer far beyond 2^53", `{"n":12345678901234567890123}`},
		{"decimal with excess precision", `{"amount":50.00000000000000001}`},
		{"decimal just above", `{"x":0.1000000000000000001}`},
		{"overflow", `{"x":1e400}`},
		{"underflow", `{"x":1e-400}`},
		{"huge exponent", `{"x":1e-99999999}`},
		{"exact binary expansion", `{"x":0.1000000000000000055511151231257827021181583404541015625}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := CanonicalJSON([]byte(tt.in))
			if !errors.Is(err, ErrInvalidJSON) {
				t.Errorf("CanonicalJSON(%q) = %q, %v; want ErrInvalidJSON", tt.in, got, err)
			}
			if _, err := ParseArgs([]byte(tt.in)); err == nil {
				t.Errorf("ParseArgs(%q) succeeded", tt.in)
			}
		})
	}
}

func TestArgsDigest(t *testing.T) {
	digest := func(s string) string {
		t.Helper()
		a, err := ParseArgs([]byte(s))
		if err != nil {
			t.Fatal(err)
		}
		return a.Digest
	}
	base := digest(`{"table":"tickets","limit":10,"where":{"a":1,"b":[1,2]}}`)
	if len(base) != 64 {
		t.Fatalf("digest %q is not 64 hex characters", base)
	}
	same := []string{
		` { "where" : { "b" : [ 1 , 2 ] , "a" : 1 } , "limit" : 10 , "table" : "tickets" } `,
		`{"limit":10,"table":"\u0074ickets","where":{"b":[1,2],"a":1}}`,
	}
	for _, s := range same {
		if d := digest(s); d != base {
			t.Errorf("ParseArgs(%s).Digest differs; only key order, whitespace and escapes changed", s)
		}
	}
	different := []string{
		`{"table":"tickets","limit":10.0,"where":{"a":1,"b":[1,2]}}`,
		`{"table":"tickets","limit":"10","where":{"a":1,"b":[1,2]}}`,
		`{"table":"Tickets","limit":10,"where":{"a":1,"b":[1,2]}}`,
		`{"table":"tickets","limit":10,"where":{"a":1,"b":[2,1]}}`,
		`{"table":"tickets","limit":10,"where":{"a":1,"b":[1,2],"c":null}}`,
		`{"table":"tickets","limit":10,"where":{"a":1}}`,
		`{"table ":"tickets","limit":10,"where":{"a":1,"b":[1,2]}}`,
	}
	for _, s := range different {
		if d := digest(s); d == base {
			t.Errorf("ParseArgs(%s).Digest equals the original; the change must show", s)
		}
	}
	if digest("") != digest("null") || digest("null") != digest("{}") {
		t.Error("absent, null and {} arguments must share one digest")
	}
}

// render writes v back as JSON with keys in reverse order, escapes for
// every non-ASCII character and whitespace between every token: the same
// value, written as differently as JSON allows.
func render(buf *bytes.Buffer, v *value) {
	ws := func() { buf.WriteString(" \n\t ") }
	str := func(s string) {
		buf.WriteByte('"')
		for _, r := range s {
			switch {
			case r == '"' || r == '\\':
				buf.WriteByte('\\')
				buf.WriteRune(r)
			case r < 0x20 || r > 0x7e:
				if r > 0xffff {
					r1, r2 := utf16Encode(r)
					buf.WriteString(`\u` + hex4(r1) + `\u` + hex4(r2))
				} else {
					buf.WriteString(`\u` + hex4(r))
				}
			default:
				buf.WriteRune(r)
			}
		}
		buf.WriteByte('"')
	}
	ws()
	switch v.kind {
	case kindNull:
		buf.WriteString("null")
	case kindBool, kindNumber:
		buf.Write(v.lit)
	case kindString:
		str(v.str)
	case kindArray:
		buf.WriteByte('[')
		for i := range v.elems {
			if i > 0 {
				buf.WriteByte(',')
			}
			render(buf, &v.elems[i])
		}
		ws()
		buf.WriteByte(']')
	case kindObject:
		buf.WriteByte('{')
		for i := len(v.members) - 1; i >= 0; i-- {
			ws()
			str(v.members[i].key)
			ws()
			buf.WriteByte(':')
			render(buf, &v.members[i].val)
			if i > 0 {
				buf.WriteByte(',')
			}
		}
		ws()
		buf.WriteByte('}')
	}
	ws()
}

func hex4(r rune) string {
	const h = "0123456789abcdef"
	return string([]byte{h[r>>12&0xf], h[r>>8&0xf], h[r>>4&0xf], h[r&0xf]})
}

func utf16Encode(r rune) (rune, rune) {
	r -= 0x10000
	return 0xd800 + (r>>10)&0x3ff, 0xdc00 + r&0x3ff
}

func FuzzCanonicalJSON(f *testing.F) {
	for _, s := range []string{
		`{"b":1,"a":[1,2,{"d":null,"c":true}]}`, `null`, ``, `"\ud83d\ude00\u2028<>"`, `{"a":1,"a":2}`,
		`[1.0e+10,-0,0.5E-3]`, `{"\u0000":"\u001f"}`, "{\"é\":\"\xff\"}", `"\ud800"`, ` [ ] `,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		c, err := CanonicalJSON(in)
		if err != nil {
			if !errors.Is(err, ErrInvalidJSON) {
				t.Fatalf("error %v does not wrap ErrInvalidJSON", err)
			}
			return
		}
		if len(bytes.TrimSpace(in)) > 0 && !json.Valid(in) {
			t.Fatalf("accepted invalid JSON %q", in)
		}
		if !json.Valid(c) {
			t.Fatalf("canonical form %q is not valid JSON", c)
		}
		// Stable: canonicalizing the canonical form changes nothing.
		c2, err := CanonicalJSON(c)
		if err != nil || !bytes.Equal(c, c2) {
			t.Fatalf("CanonicalJSON(%q) = %q, %v; want it unchanged", c, c2, err)
		}
		// Same value as the input, by encoding/json's reading.
		if t1 := bytes.TrimSpace(in); len(t1) > 0 && !bytes.Equal(t1, []byte("null")) {
			var a, b any
			da := json.NewDecoder(bytes.NewReader(in))
			da.UseNumber()
			db := json.NewDecoder(bytes.NewReader(c))
			db.UseNumber()
			if da.Decode(&a) != nil || db.Decode(&b) != nil || !reflect.DeepEqual(a, b) {
				t.Fatalf("canonical form %q does not mean what %q means", c, in)
			}
		}
		// Written as differently as JSON allows, it gives one digest.
		v, err := parseJSON(c, ErrInvalidJSON, true)
		if err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		render(&buf, &v)
		c3, err := CanonicalJSON(buf.Bytes())
		if err != nil || !bytes.Equal(c, c3) {
			t.Fatalf("re-rendered %q canonicalizes to %q, %v; want %q", buf.Bytes(), c3, err, c)
		}
	})
}

func TestParseArgs(t *testing.T) {
	tests := []struct {
		name      string
		in        string
		canonical string
		value     map[string]any
	}{
		{"none", "", "{}", map[string]any{}},
		{"null", "null", "{}", map[string]any{}},
		{"object", ` {"b": [1, true, null, {"c": "d"}], "a": 0.1} `, `{"a":0.1,"b":[1,true,null,{"c":"d"}]}`,
			map[string]any{"a": 0.1, "b": []any{1.0, true, nil, map[string]any{"c": "d"}}}},
		{"numbers a float64 holds as written", `{"a":1.0,"b":1e3,"c":-0,"d":9007199254740992,"e":0.10,"f":2.5E-3,"g":123456789012345680}`,
			`{"a":1.0,"b":1e3,"c":-0,"d":9007199254740992,"e":0.10,"f":2.5E-3,"g":123456789012345680}`,
			map[string]any{"a": 1.0, "b": 1000.0, "c": 0.0, "d": 9007199254740992.0, "e": 0.1, "f": 0.0025, "g": 123456789012345680.0}},
		{"keys equal ignoring case in different objects", `{"a":{"x":1},"A2":{"X":2}}`, `{"A2":{"X":2},"a":{"x":1}}`,
			map[string]any{"a": map[string]any{"x": 1.0}, "A2": map[string]any{"X": 2.0}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, err := ParseArgs([]byte(tt.in))
			if err != nil {
				t.Fatalf("ParseArgs(%q): %v", tt.in, err)
			}
			if diff := cmp.Diff(tt.canonical, string(a.Canonical)); diff != "" {
				t.Errorf("Canonical (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.value, a.Value); diff != "" {
				t.Errorf("Value (-want +got):\n%s", diff)
			}
			var want map[string]any
			if err := json.Unmarshal(a.Canonical, &want); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(want, a.Value, cmp.Transformer("nil", func(m map[string]any) map[string]any {
				if m == nil {
					return map[string]any{}
				}
				return m
			})); diff != "" {
				t.Errorf("Value differs from encoding/json's reading of Canonical (-json +ParseArgs):\n%s", diff)
			}
			sum := sha256.Sum256(a.Canonical)
			if a.Digest != hex.EncodeToString(sum[:]) {
				t.Errorf("Digest %s is not sha256(Canonical)", a.Digest)
			}
		})
	}
	for _, in := range []string{`[]`, `"x"`, `1`, `true`} {
		if _, err := ParseArgs([]byte(in)); !errors.Is(err, ErrInvalidArgs) {
			t.Errorf("ParseArgs(%s): %v; want ErrInvalidArgs (not an object)", in, err)
		}
	}
}

func FuzzParseArgs(f *testing.F) {
	for _, s := range []string{`{"a":1}`, `{"a":0.1,"B":[1e3]}`, `{"k":1,"K":2}`, `{"n":9007199254740993}`, ``, `null`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		a, err := ParseArgs(in)
		if err != nil {
			if !errors.Is(err, ErrInvalidArgs) {
				t.Fatalf("error %v does not wrap ErrInvalidArgs", err)
			}
			return
		}
		// encoding/json reads the canonical bytes exactly as Value, and
		// decoding into a struct-like case-insensitive view cannot differ:
		// no two keys of one object fold together.
		var m map[string]any
		if err := json.Unmarshal(a.Canonical, &m); err != nil {
			t.Fatalf("canonical %q: %v", a.Canonical, err)
		}
		if len(m) == 0 && len(a.Value) == 0 {
			return
		}
		if !reflect.DeepEqual(m, a.Value) {
			t.Fatalf("Value %#v differs from encoding/json's %#v", a.Value, m)
		}
		// Every number is exactly its float64's shortest decimal.
		dec := json.NewDecoder(bytes.NewReader(a.Canonical))
		dec.UseNumber()
		var n any
		if err := dec.Decode(&n); err != nil {
			t.Fatal(err)
		}
		var walk func(any)
		walk = func(v any) {
			switch x := v.(type) {
			case json.Number:
				f, err := x.Float64()
				if err != nil {
					t.Fatalf("number %s accepted but not a float64: %v", x, err)
				}
				r1, _ := new(big.Rat).SetString(string(x))
				r2, _ := new(big.Rat).SetString(strconv.FormatFloat(f, 'g', -1, 64))
				if r1 == nil || r2 == nil || r1.Cmp(r2) != 0 {
					t.Fatalf("number %s accepted but it is not the shortest decimal of its float64 %v", x, f)
				}
			case []any:
				for _, e := range x {
					walk(e)
				}
			case map[string]any:
				seen := map[string]bool{}
				for k, e := range x {
					l := strings.ToLower(k)
					if seen[l] {
						t.Fatalf("keys folding to %q both accepted", l)
					}
					seen[l] = true
					walk(e)
				}
			}
		}
		walk(n)
	})
}

func TestCheckKeys(t *testing.T) {
	for _, in := range []string{`{"a":1}`, `{"n":9007199254740993,"x":[{"k":1e400}]}`, `[1,"x",null]`, `{"isError":false,"content":[]}`} {
		if err := CheckKeys([]byte(in)); err != nil {
			t.Errorf("CheckKeys(%s): %v; want nil (numbers are not judged)", in, err)
		}
	}
	for _, in := range []string{`{"isError":false,"isError":true}`, `{"isError":false,"IsError":true}`, `{"a":[{"k":1,"K":2}]}`, `{"a":1} {}`, `{`, "\"\xff\""} {
		if err := CheckKeys([]byte(in)); !errors.Is(err, ErrInvalidJSON) {
			t.Errorf("CheckKeys(%s): %v; want ErrInvalidJSON", in, err)
		}
	}
}
