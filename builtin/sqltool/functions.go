package sqltool

import "strings"

// The SQL functions a read-only query may call are an allow-list: a
// function is known to compute its result from its arguments (and the rows
// the query itself reads) alone, reaching no file, no other server or
// connection, no server or session state, and running no SQL text the
// analysis cannot see. Anything else is refused with its name
// (toolgate.CodeUnsafeQuery), however it is spelled (schema-qualified,
// reached through a view, an operator or a cast); a deny-list could only
// ever name the dangers someone thought of.
//
// The lists hold core and json1/math functions only. Extension functions
// (FTS5's match, bm25, highlight, snippet; R*Tree and Geopoly; PostgreSQL
// extensions such as dblink) are refused; a PostgreSQL database can permit
// more, as "schema.name", with Config.AllowedFunctions.

// safeSQLiteFunctions are SQLite's built-in functions (as SQLite's
// authorizer names them, lowercase) that a read-only query may call.
// Left out on purpose: load_extension, sqlite_log (writes the log),
// sqlite_offset (file offsets), changes, total_changes and
// last_insert_rowid (connection state), sqlite_version, sqlite_source_id
// and sqlite_compileoption_* (build details), subtype, and every extension
// function.
var safeSQLiteFunctions = setOf(
	// core scalar functions
	"abs", "char", "coalesce", "concat", "concat_ws", "format", "glob", "hex", "if", "ifnull", "iif", "instr",
	"length", "like", "likelihood", "likely", "lower", "ltrim", "max", "min", "nullif", "octet_length",
	"printf", "quote", "random", "randomblob", "replace", "round", "rtrim", "sign", "soundex", "substr",
	"substring", "trim", "typeof", "unhex", "unicode", "unistr", "unistr_quote", "unlikely", "upper", "zeroblob",
	// date and time
	"date", "time", "datetime", "julianday", "unixepoch", "strftime", "timediff",
	"current_date", "current_time", "current_timestamp",
	// math
	"acos", "acosh", "asin", "asinh", "atan", "atan2", "atanh", "ceil", "ceiling", "cos", "cosh", "degrees",
	"exp", "floor", "ln", "log", "log10", "log2", "mod", "pi", "pow", "power", "radians", "sin", "sinh",
	"sqrt", "tan", "tanh", "trunc",
	// JSON (the -> and ->> operators are functions to the authorizer)
	"json", "jsonb", "json_array", "jsonb_array", "json_array_insert", "jsonb_array_insert", "json_array_length",
	"json_error_position", "json_extract", "jsonb_extract", "json_insert", "jsonb_insert", "json_object",
	"jsonb_object", "json_patch", "jsonb_patch", "json_pretty", "json_quote", "json_remove", "jsonb_remove",
	"json_replace", "jsonb_replace", "json_set", "jsonb_set", "json_type", "json_valid",
	"json_group_array", "jsonb_group_array", "json_group_object", "jsonb_group_object", "->", "->>",
	// aggregates and window functions
	"avg", "count", "group_concat", "string_agg", "sum", "total",
	"row_number", "rank", "dense_rank", "percent_rank", "cume_dist", "ntile", "lag", "lead",
	"first_value", "last_value", "nth_value",
)

// safePGFunctions are functions of pg_catalog (as PostgreSQL's parser names
// them: lowercase unless quoted) that a read-only query may call, among
// them those the grammar itself turns SQL syntax into (EXTRACT, SUBSTRING,
// TRIM, POSITION, OVERLAY, AT TIME ZONE, OVERLAPS, SIMILAR TO, NORMALIZE,
// IS NORMALIZED, COLLATION FOR). Left out on purpose, among others: file
// and large-object access (pg_read_file, lo_*), anything that runs SQL
// text (query_to_xml, ts_stat, ts_rewrite), settings and session state
// (current_setting, set_config, setseed, nextval, setval), server
// administration and statistics (pg_*), sleeping, advisory locks,
// notifications, xml and xpath (a parser of untrusted documents), and
// catalog introspection (pg_get_*, has_*_privilege, to_reg*, pg_typeof,
// which returns a regtype). A function listed here is still refused when
// the overload PostgreSQL may pick takes or returns a catalog-lookup type
// (regTypeNames): to_tsvector, to_tsquery, ts_headline and the other text
// search functions only in their forms without a regconfig argument.
var safePGFunctions = setOf(
	// aggregates
	"avg", "bit_and", "bit_or", "bit_xor", "bool_and", "bool_or", "count", "every", "max", "min", "sum",
	"stddev", "stddev_pop", "stddev_samp", "variance", "var_pop", "var_samp", "corr", "covar_pop", "covar_samp",
	"regr_avgx", "regr_avgy", "regr_count", "regr_intercept", "regr_r2", "regr_slope", "regr_sxx", "regr_sxy",
	"regr_syy", "mode", "percentile_cont", "percentile_disc", "any_value", "string_agg", "array_agg",
	"json_agg", "jsonb_agg", "json_object_agg", "jsonb_object_agg", "range_agg", "range_intersect_agg",
	// window functions
	"row_number", "rank", "dense_rank", "percent_rank", "cume_dist", "ntile", "lag", "lead",
	"first_value", "last_value", "nth_value",
	// numbers
	"abs", "cbrt", "ceil", "ceiling", "degrees", "div", "exp", "factorial", "floor", "gcd", "lcm", "ln", "log",
	"log10", "min_scale", "mod", "pi", "power", "radians", "round", "scale", "sign", "sqrt", "trim_scale",
	"trunc", "width_bucket", "random", "random_normal", "acos", "acosd", "asin", "asind", "atan", "atand",
	"atan2", "atan2d", "cos", "cosd", "cot", "cotd", "sin", "sind", "tan", "tand", "sinh", "cosh", "tanh",
	"asinh", "acosh", "atanh", "erf", "erfc", "to_char", "to_number",
	// text
	"ascii", "bit_length", "btrim", "casefold", "char_length", "character_length", "chr", "concat", "concat_ws",
	"convert_from", "convert_to", "decode", "encode", "format", "initcap", "left", "length", "lower", "lpad",
	"ltrim", "md5", "normalize", "is_normalized", "octet_length", "overlay", "position", "quote_ident",
	"quote_literal", "quote_nullable", "regexp_count", "regexp_instr", "regexp_like", "regexp_match",
	"regexp_matches", "regexp_replace", "regexp_split_to_array", "regexp_split_to_table", "regexp_substr",
	"repeat", "replace", "reverse", "right", "rpad", "rtrim", "split_part", "starts_with", "strpos", "substr",
	"substring", "to_ascii", "to_hex", "translate", "unistr", "upper", "sha224", "sha256", "sha384", "sha512",
	"string_to_array", "string_to_table", "array_to_string", "similar_to_escape", "pg_collation_for",
	// dates and times
	"age", "clock_timestamp", "date_bin", "date_part", "date_trunc", "extract", "isfinite", "justify_days",
	"justify_hours", "justify_interval", "make_date", "make_interval", "make_time", "make_timestamp",
	"make_timestamptz", "now", "statement_timestamp", "timeofday", "timezone", "to_date", "to_timestamp",
	"transaction_timestamp", "overlaps",
	// JSON
	"to_json", "to_jsonb", "array_to_json", "row_to_json", "json_build_array", "jsonb_build_array",
	"json_build_object", "jsonb_build_object", "json_object", "jsonb_object", "json_array_length",
	"jsonb_array_length", "json_each", "jsonb_each", "json_each_text", "jsonb_each_text", "json_array_elements",
	"jsonb_array_elements", "json_array_elements_text", "jsonb_array_elements_text", "json_object_keys",
	"jsonb_object_keys", "json_extract_path", "jsonb_extract_path", "json_extract_path_text",
	"jsonb_extract_path_text", "json_typeof", "jsonb_typeof", "json_strip_nulls", "jsonb_strip_nulls",
	"jsonb_pretty", "jsonb_set", "jsonb_set_lax", "jsonb_insert", "jsonb_path_exists", "jsonb_path_match",
	"jsonb_path_query", "jsonb_path_query_array", "jsonb_path_query_first", "json_to_record", "jsonb_to_record",
	"json_to_recordset", "jsonb_to_recordset", "json_populate_record", "jsonb_populate_record",
	"json_populate_recordset", "jsonb_populate_recordset",
	// arrays and ranges
	"array_append", "array_cat", "array_dims", "array_fill", "array_length", "array_lower", "array_ndims",
	"array_position", "array_positions", "array_prepend", "array_remove", "array_replace", "array_upper",
	"cardinality", "unnest", "generate_series", "generate_subscripts", "trim_array", "array_sample",
	"array_shuffle", "isempty", "lower_inc", "upper_inc", "lower_inf", "upper_inf", "range_merge",
	"int4range", "int8range", "numrange", "tsrange", "tstzrange", "daterange",
	// text search (ts_stat and ts_rewrite, which run SQL text, are not here)
	"to_tsvector", "to_tsquery", "plainto_tsquery", "phraseto_tsquery", "websearch_to_tsquery", "ts_rank",
	"ts_rank_cd", "ts_headline", "setweight", "strip", "numnode", "querytree", "tsvector_to_array",
	"array_to_tsvector",
	// other
	"num_nulls", "num_nonnulls", "gen_random_uuid",
)

// safePGSampleMethods are the TABLESAMPLE methods of core PostgreSQL.
var safePGSampleMethods = setOf("system", "bernoulli")

func setOf(names ...string) map[string]bool {
	m := make(map[string]bool, len(names))
	for _, n := range names {
		m[n] = true
	}
	return m
}

// safeSQLiteFunction reports whether SQLite's function name (any case:
// SQLite's function names are not case sensitive) is on the allow-list.
func safeSQLiteFunction(name string) bool { return safeSQLiteFunctions[strings.ToLower(name)] }

// parseFunctionName reads a Config.AllowedFunctions entry, schema.name,
// with PostgreSQL's identifier rules: an unquoted part is folded to lower
// case, a part in double quotes ("" for a quote) is taken as written.
func parseFunctionName(s string) (TableRef, bool) {
	var parts []string
	for i := 0; i < len(s); {
		var part string
		if s[i] == '"' {
			var b strings.Builder
			i++
			for {
				if i >= len(s) {
					return TableRef{}, false
				}
				if s[i] == '"' {
					if i+1 < len(s) && s[i+1] == '"' {
						b.WriteByte('"')
						i += 2
						continue
					}
					i++
					break
				}
				b.WriteByte(s[i])
				i++
			}
			part = b.String()
		} else {
			j := strings.IndexAny(s[i:], `."`)
			if j < 0 {
				j = len(s) - i
			}
			part = strings.ToLower(s[i : i+j])
			i += j
		}
		if part == "" {
			return TableRef{}, false
		}
		parts = append(parts, part)
		if i == len(s) {
			break
		}
		if s[i] != '.' || i+1 == len(s) {
			return TableRef{}, false
		}
		i++
	}
	if len(parts) != 2 {
		return TableRef{}, false
	}
	return TableRef{Schema: parts[0], Name: parts[1]}, true
}
