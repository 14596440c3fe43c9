package identity_test

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"

	"github.com/toolgate/toolgate/identity"
	"github.com/toolgate/toolgate/policy"
)

func TestKeyring(t *testing.T) {
	dir := t.TempDir() + "/data"
	k := identity.NewKeyring(dir)
	if _, _, err := k.Public(); !errors.Is(err, identity.ErrNoKey) {
		t.Fatalf("Public before any key: %v, want ErrNoKey", err)
	}
	if _, err := os.Stat(k.Path()); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Public created the key: %v", err)
	}
	_, kid, err := k.Signer()
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(k.Path())
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("key mode %04o, want 0600", fi.Mode().Perm())
	}
	if di, _ := os.Stat(dir); di.Mode().Perm() != 0o700 {
		t.Errorf("data folder mode %04o, want 0700", di.Mode().Perm())
	}
	_, kid2, err := identity.NewKeyring(dir).Public()
	if err != nil || kid2 != kid {
		t.Fatalf("another keyring on the folder: kid %q %v, want %q", kid2, err, kid)
	}
	if err := os.Chmod(k.Path(), 0o640); err != nil {
		t.Fatal(err)
	}
	if _, _, err := identity.NewKeyring(dir).Public(); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Errorf("group-readable key: %v, want a refusal", err)
	}
	t.Run("concurrent first use makes one key", func(t *testing.T) {
		dir := t.TempDir()
		kids := make([]string, 8)
		var wg sync.WaitGroup
		for i := range kids {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, kids[i], _ = identity.NewKeyring(dir).Signer()
			}()
		}
		wg.Wait()
		for _, k := range kids {
			if k == "" || k != kids[0] {
				t.Fatalf("kids %v", kids)
			}
		}
	})
}

// jwksServer serves a key set that a test can swap, and counts fetches.
type jwksServer struct {
	mu      sync.Mutex
	body    []byte
	status  int
	fetches int
}

func (s *jwksServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fetches++
	if s.status != 0 {
		w.WriteHeader(s.status)
		return
	}
	w.Header().Set("Content-Type", "application/jwk-set+json")
	w.Write(s.body)
}

func (s *jwksServer) set(body []byte, status int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.body, s.status = body, status
}

func (s *jwksServer) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.fetches
}

// TestJWKSURL: keys are fetched on first use and cached; a token with an
// unknown kid makes one more fetch (not more often than every 10 s); a
// failing issuer keeps the last good keys; redirects are not followed.
func TestJWKSURL(t *testing.T) {
	p := newIDP(t)
	srv := &jwksServer{}
	srv.set(p.jwks(t), 0)
	ts := httptest.NewServer(srv)
	defer ts.Close()
	redirect := httptest.NewServer(http.RedirectHandler(ts.URL, http.StatusFound))
	defer redirect.Close()

	src := strings.Replace(testBundle, "jwks_file: jwks.json", "jwks_url: "+ts.URL+"/jwks", -1)
	c := &clock{t: t0}
	auth := newAuth(t, loadBundle(t, src, nil), nil, c)
	if srv.count() != 0 {
		t.Fatal("New fetched the keys; they are fetched on first use")
	}
	verify := func(tok string) error { _, err := auth.Verify(tok); return err }
	if err := verify(sign(t, jose.RS256, p.rsa, "rsa-1", claims(nil), nil)); err != nil {
		t.Fatal(err)
	}
	if err := verify(sign(t, jose.ES256, p.ec, "ec-1", claims(nil), nil)); err != nil || srv.count() != 1 {
		t.Fatalf("second token: %v, %d fetches (want 1: cached)", err, srv.count())
	}

	// The issuer rotates: a new RSA key rsa-2 replaces rsa-1.
	rotated := newIDP(t)
	set := jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{Key: rotated.rsa.Public(), KeyID: "rsa-2"}}}
	body, _ := json.Marshal(set)
	srv.set(body, 0)
	newTok := sign(t, jose.RS256, rotated.rsa, "rsa-2", claims(nil), nil)
	if err := verify(newTok); err == nil || !strings.Contains(err.Error(), "unknown key id") || srv.count() != 1 {
		t.Fatalf("right after the last fetch: %v, %d fetches (want unknown key id, no fetch)", err, srv.count())
	}
	c.t = t0.Add(policy.MinJWKSRefresh)
	if err := verify(newTok); err != nil || srv.count() != 2 {
		t.Fatalf("after the rate limit: %v, %d fetches", err, srv.count())
	}
	if err := verify(sign(t, jose.RS256, p.rsa, "rsa-1", claims(map[string]any{"jti": "x"}), nil)); err == nil {
		t.Fatal("a key the issuer removed still verifies")
	}

	// The issuer fails: the last good keys stay.
	srv.set(nil, http.StatusInternalServerError)
	c.t = t0.Add(policy.DefaultJWKSRefresh + time.Minute)
	if err := verify(sign(t, jose.RS256, rotated.rsa, "rsa-2", claims(map[string]any{"jti": "y", "exp": c.t.Add(time.Hour).Unix()}), nil)); err != nil {
		t.Fatalf("with the issuer down: %v", err)
	}

	t.Run("never fetched", func(t *testing.T) {
		down := &jwksServer{}
		down.set(nil, http.StatusNotFound)
		ds := httptest.NewServer(down)
		defer ds.Close()
		a := newAuth(t, loadBundle(t, strings.Replace(testBundle, "jwks_file: jwks.json", "jwks_url: "+ds.URL, -1), nil), nil, &clock{t: t0})
		if _, err := a.Verify(sign(t, jose.RS256, p.rsa, "rsa-1", claims(nil), nil)); !errors.Is(err, identity.ErrUnauthenticated) || !strings.Contains(err.Error(), "could not be fetched") {
			t.Errorf("got %v", err)
		}
	})
	t.Run("redirects are not followed", func(t *testing.T) {
		a := newAuth(t, loadBundle(t, strings.Replace(testBundle, "jwks_file: jwks.json", "jwks_url: "+redirect.URL, -1), nil), nil, &clock{t: t0})
		if _, err := a.Verify(sign(t, jose.RS256, p.rsa, "rsa-1", claims(nil), nil)); err == nil || !strings.Contains(err.Error(), "redirect") {
			t.Errorf("got %v", err)
		}
	})
}

// TestJWKSFile: a JWKS file with a key that cannot verify signatures is
// refused when the bundle is loaded, naming the problem.
func TestJWKSFile(t *testing.T) {
	cases := []struct {
		name string
		jwks string
		want string
	}{
		{"symmetric key", `{"keys":[{"kty":"oct","k":"c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0"}]}`, "symmetric"},
		{"private key", `{"keys":[{"kty":"OKP","crv":"Ed25519","x":"11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo","d":"nWGxne_9WmC6hEr0kuwsxERJxWl7MmkZcDusAxyuf2A"}]}`, "private"},
		{"encryption key", `{"keys":[{"kty":"OKP","crv":"Ed25519","use":"enc","x":"11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"}]}`, "use"},
		{"not JSON", `keys`, "not a JWKS"},
		{"empty", `{"keys":[]}`, "no key"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := loadBundle(t, testBundle, []byte(tc.jwks))
			if _, err := identity.New(b, nil, nil); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}
