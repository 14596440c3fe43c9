package approval

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestCanonicalArgs(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want string
	}{
		{"absent", "", "{}"},
		{"whitespace only", " \n\t", "{}"},
		{"null", " null ", "{}"},
		{"empty object", "{ }", "{}"},
		{"keys sorted", `{"b":1,"a":2,"A":3,"aa":4}`, `{"A":3,"a":2,"aa":4,"b":1}`},
		{"whitespace removed", " {\r\n \"a\" :\t[ 1 , 2 , { } , [ ] ] } ", `{"a":[1,2,{},[]]}`},
		{"nested keys sorted", `{"z":{"y":1,"x":[{"b":0,"a":0}]},"a":null}`, `{"a":null,"z":{"x":[{"a":0,"b":0}],"y":1}}`},
		{"numbers as written", `{"a":1.0,"b":1e3,"c":-0,"d":1E+3,"e":0.10,"f":12345678901234567890123}`, `{"a":1.0,"b":1e3,"c":-0,"d":1E+3,"e":0.10,"f":12345678901234567890123}`},
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
			got, err := CanonicalArgs(json.RawMessage(tt.in))
			if err != nil {
				t.Fatalf("CanonicalArgs(%q): %v", tt.in, err)
			}
			if diff := cmp.Diff(tt.want, string(got)); diff != "" {
				t.Errorf("CanonicalArgs(%q) (-want +got):\n%s", tt.in, diff)
			}
		})
	}
}

func TestCanonicalArgsRejects(t *testing.T) {
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
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := CanonicalArgs(json.RawMessage(tt.in))
			if !errors.Is(err, ErrInvalidArgs) {
				t.Errorf("CanonicalArgs(%q) = %q, %v; want ErrInvalidArgs", tt.in, got, err)
			}
			if _, err := ArgsDigest(json.RawMessage(tt.in)); err == nil {
				t.Errorf("ArgsDigest(%q) succeeded", tt.in)
			}
		})
	}
}

func TestArgsDigest(t *testing.T) {
	digest := func(s string) string {
		t.Helper()
		d, err := ArgsDigest(json.RawMessage(s))
		if err != nil {
			t.Fatal(err)
		}
		return d
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
			t.Errorf("ArgsDigest(%s) differs; only key order, whitespace and escapes changed", s)
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
			t.Errorf("ArgsDigest(%s) equals the original; the change must show", s)
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

func FuzzCanonicalArgs(f *testing.F) {
	for _, s := range []string{
		`{"b":1,"a":[1,2,{"d":null,"c":true}]}`, `null`, ``, `"\ud83d\ude00\u2028<>"`, `{"a":1,"a":2}`,
		`[1.0e+10,-0,0.5E-3]`, `{"\u0000":"\u001f"}`, "{\"é\":\"\xff\"}", `"\ud800"`, ` [ ] `,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		c, err := CanonicalArgs(in)
		if err != nil {
			if !errors.Is(err, ErrInvalidArgs) {
				t.Fatalf("error %v does not wrap ErrInvalidArgs", err)
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
		c2, err := CanonicalArgs(c)
		if err != nil || !bytes.Equal(c, c2) {
			t.Fatalf("CanonicalArgs(%q) = %q, %v; want it unchanged", c, c2, err)
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
		v, err := parseJSON(c)
		if err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		render(&buf, &v)
		c3, err := CanonicalArgs(buf.Bytes())
		if err != nil || !bytes.Equal(c, c3) {
			t.Fatalf("re-rendered %q canonicalizes to %q, %v; want %q", buf.Bytes(), c3, err, c)
		}
	})
}
