package policy

import "strings"

// Resource names are dot-separated paths ("shop.public.orders"), and a grant
// scope {name: N} covers N and every name below it (NameCovers). For that to
// be safe, the path must be injective: two different objects never share a
// name, and no object's name can pass for a name below another's. A part
// that itself holds the separator, a double quote, or nothing is therefore
// written in double quotes with every '"' doubled, as SQL quotes
// identifiers: the table orders.secret of database shop is
// `shop."orders.secret"`, which `shop.orders` does not cover, and the schema
// a.b's table c is `shop."a.b".c`, apart from the schema a's table b.c,
// `shop.a."b.c"`. Parts without those characters stand as they are, so
// ordinary names read as before.

// NameSeparator separates the parts of a resource name.
const NameSeparator = '.'

// QuoteNamePart returns part as it stands in a resource name: unchanged
// when it is not empty and holds neither '.' nor '"'; otherwise in double
// quotes, each '"' doubled.
func QuoteNamePart(part string) string {
	if part != "" && !strings.ContainsAny(part, `."`) {
		return part
	}
	return `"` + strings.ReplaceAll(part, `"`, `""`) + `"`
}

// JoinName joins parts into a resource name, each quoted as QuoteNamePart
// does. SplitName(JoinName(p...)) returns p.
func JoinName(parts ...string) string {
	q := make([]string, len(parts))
	for i, p := range parts {
		q[i] = QuoteNamePart(p)
	}
	return strings.Join(q, string(NameSeparator))
}

// SplitName splits a resource name into its parts, undoing the quoting of
// JoinName. ok is false for a name that is not well formed: empty, an empty
// unquoted part ("a..b"), a '"' inside an unquoted part, an unterminated
// quote, or text between a closing quote and the next separator.
func SplitName(name string) (parts []string, ok bool) {
	if name == "" {
		return nil, false
	}
	for i := 0; ; {
		if i < len(name) && name[i] == '"' {
			var b strings.Builder
			i++
			for {
				if i >= len(name) {
					return nil, false // unterminated
				}
				if name[i] == '"' {
					if i+1 < len(name) && name[i+1] == '"' {
						b.WriteByte('"')
						i += 2
						continue
					}
					i++
					break
				}
				b.WriteByte(name[i])
				i++
			}
			parts = append(parts, b.String())
		} else {
			j := i
			for j < len(name) && name[j] != NameSeparator {
				if name[j] == '"' {
					return nil, false
				}
				j++
			}
			if j == i {
				return nil, false // empty unquoted part
			}
			parts = append(parts, name[i:j])
			i = j
		}
		if i == len(name) {
			return parts, true
		}
		if name[i] != NameSeparator {
			return nil, false // text after a closing quote
		}
		i++
		if i == len(name) {
			return nil, false // a trailing separator
		}
	}
}

// ValidName reports whether name is a well-formed resource name (SplitName).
func ValidName(name string) bool {
	_, ok := SplitName(name)
	return ok
}
