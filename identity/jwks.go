package identity

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"time"

	jose "github.com/go-jose/go-jose/v4"

	"github.com/toolgate/toolgate/policy"
)

// MaxJWKSBytes bounds a JWKS document (file or fetched).
const MaxJWKSBytes = 1 << 20

// MinRSABits is the smallest RSA modulus a JWKS key may have.
const MinRSABits = 2048

// keySource hands out an issuer's verification keys.
type keySource interface {
	// lookup returns the keys a token signed with alg and naming kid ("" when
	// it names none) may be verified with.
	lookup(kid, alg string, now time.Time) ([]jose.JSONWebKey, error)
}

// parseJWKS decodes a JWKS document key by key. Keys that cannot be used
// to verify signatures (symmetric, private, encryption-only, small RSA,
// unknown types) are left out and described in problems.
func parseJWKS(data []byte) (keys []jose.JSONWebKey, problems []string, err error) {
	var doc struct {
		Keys []json.RawMessage `json:"keys"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		return nil, nil, fmt.Errorf("not a JWKS document: %w", err)
	}
	for i, raw := range doc.Keys {
		var probe struct {
			Kty string `json:"kty"`
			D   string `json:"d"`
		}
		_ = json.Unmarshal(raw, &probe)
		switch {
		case probe.Kty == "oct":
			problems = append(problems, fmt.Sprintf("key %d is symmetric (kty oct): refused, a JWKS holds public keys", i))
			continue
		case probe.D != "":
			problems = append(problems, fmt.Sprintf("key %d is a private key: refused, publish only public keys", i))
			continue
		}
		var k jose.JSONWebKey
		if err := k.UnmarshalJSON(raw); err != nil {
			problems = append(problems, fmt.Sprintf("key %d: %v", i, err))
			continue
		}
		switch {
		case !k.Valid() || !k.IsPublic():
			problems = append(problems, fmt.Sprintf("key %d (kid %q) is not a usable public key", i, k.KeyID))
			continue
		case k.Use != "" && k.Use != "sig":
			problems = append(problems, fmt.Sprintf("key %d (kid %q) has use %q, not sig", i, k.KeyID, k.Use))
			continue
		}
		if rk, ok := k.Key.(*rsa.PublicKey); ok && rk.N.BitLen() < MinRSABits {
			problems = append(problems, fmt.Sprintf("key %d (kid %q) is RSA with %d bits, fewer than %d", i, k.KeyID, rk.N.BitLen(), MinRSABits))
			continue
		}
		keys = append(keys, k)
	}
	return keys, problems, nil
}

// fits reports whether key k may verify a signature made with alg.
func fits(k jose.JSONWebKey, alg string) bool {
	if k.Algorithm != "" && k.Algorithm != alg {
		return false
	}
	switch key := k.Key.(type) {
	case *rsa.PublicKey:
		switch alg {
		case "RS256", "RS384", "RS512", "PS256", "PS384", "PS512":
			return true
		}
	case *ecdsa.PublicKey:
		switch alg {
		case "ES256":
			return key.Curve == elliptic.P256()
		case "ES384":
			return key.Curve == elliptic.P384()
		case "ES512":
			return key.Curve == elliptic.P521()
		}
	case ed25519.PublicKey:
		return alg == "EdDSA"
	}
	return false
}

// pick selects the keys for kid and alg from keys.
func pick(keys []jose.JSONWebKey, kid, alg string) []jose.JSONWebKey {
	var out []jose.JSONWebKey
	for _, k := range keys {
		if (kid == "" || k.KeyID == kid) && fits(k, alg) {
			out = append(out, k)
		}
	}
	return out
}

// staticKeys is a JWKS read from a file when the bundle was loaded.
type staticKeys struct{ keys []jose.JSONWebKey }

func (s *staticKeys) lookup(kid, alg string, _ time.Time) ([]jose.JSONWebKey, error) {
	return pick(s.keys, kid, alg), nil
}

// remoteKeys is a JWKS fetched from a URL: cached, fetched again when older
// than refresh, and when a token names a kid it does not hold (at most once
// every policy.MinJWKSRefresh). A failed fetch keeps the last good keys.
type remoteKeys struct {
	url     string
	refresh time.Duration
	client  *http.Client
	log     *slog.Logger

	mu        sync.Mutex // held while fetching: one fetch at a time
	keys      []jose.JSONWebKey
	fetchedAt time.Time // last successful fetch
	triedAt   time.Time // last attempt
	lastErr   error
}

func (r *remoteKeys) lookup(kid, alg string, now time.Time) ([]jose.JSONWebKey, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fetchedAt.IsZero() || now.Sub(r.fetchedAt) >= r.refresh {
		r.fetchLocked(now)
	}
	got := pick(r.keys, kid, alg)
	if len(got) == 0 && kid != "" {
		r.fetchLocked(now) // a rotated key: look again
		got = pick(r.keys, kid, alg)
	}
	if r.fetchedAt.IsZero() {
		return nil, fmt.Errorf("the issuer's keys could not be fetched from %s: %v", r.url, r.lastErr)
	}
	return got, nil
}

func (r *remoteKeys) fetchLocked(now time.Time) {
	if !r.triedAt.IsZero() && now.Sub(r.triedAt) < policy.MinJWKSRefresh {
		return // fetched or tried a moment ago: do not hammer the issuer
	}
	r.triedAt = now
	keys, err := r.fetch()
	if err != nil {
		r.lastErr = err
		r.log.Warn("JWKS fetch failed; the last good keys stay", "url", r.url, "err", err)
		return
	}
	r.keys, r.fetchedAt, r.lastErr = keys, now, nil
}

func (r *remoteKeys) fetch() ([]jose.JSONWebKey, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, r.url, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/jwk-set+json, application/json")
	resp, err := r.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: status %d", r.url, resp.StatusCode)
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, MaxJWKSBytes+1))
	if err != nil {
		return nil, err
	}
	if len(data) > MaxJWKSBytes {
		return nil, fmt.Errorf("GET %s: the JWKS is larger than %d bytes", r.url, MaxJWKSBytes)
	}
	keys, problems, err := parseJWKS(data)
	if err != nil {
		return nil, err
	}
	for _, p := range problems {
		r.log.Warn("JWKS key skipped", "url", r.url, "problem", p)
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("GET %s: the JWKS has no usable signature key", r.url)
	}
	return keys, nil
}

// errRedirect refuses redirects: keys come only from where the operator
// pointed.
var errRedirect = errors.New("the JWKS URL redirected; redirects are not followed (point jwks_url at the final address)")

// defaultHTTPClient fetches JWKS URLs: 10 s timeout, no redirects.
func defaultHTTPClient() *http.Client {
	return &http.Client{Timeout: 10 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return errRedirect }}
}
