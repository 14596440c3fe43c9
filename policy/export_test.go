package policy

// MatchesRegexp is URIPattern.Matches without its fast path, for
// TestURIPatternFastPath and FuzzURIPattern.
func (p URIPattern) MatchesRegexp(uri string) bool { return p.matchesRegexp(uri) }

// HasFastPath reports whether Matches scans instead of running the regexp.
func (p URIPattern) HasFastPath() bool { return p.tail != tailNone }
