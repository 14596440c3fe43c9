package identity

import (
	"crypto"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"

	jose "github.com/go-jose/go-jose/v4"
)

// KeyFile is the name of the delegation signing key in the data folder: an
// Ed25519 private key, PKCS #8 in PEM, mode 0600.
const KeyFile = "delegation-key.pem"

// ErrNoKey is wrapped when the data folder holds no delegation key yet
// (nothing was ever minted there), so no delegation token can verify.
var ErrNoKey = errors.New("no delegation signing key")

// Keyring is the gateway's delegation signing key in a data folder. The key
// is generated on first use (Signer) and read on later ones; Public never
// creates it. A key file that group or others may read is refused. Safe
// for concurrent use; the CLI and a running gateway may share the folder
// (creation is atomic: the first writer wins, the others read its key).
type Keyring struct {
	dir string

	mu   sync.Mutex
	priv ed25519.PrivateKey
	kid  string
}

// NewKeyring returns the keyring of data folder dir (created, mode 0700,
// when the key is first generated).
func NewKeyring(dir string) *Keyring { return &Keyring{dir: dir} }

// Path returns the key file's path.
func (k *Keyring) Path() string { return filepath.Join(k.dir, KeyFile) }

// Signer returns the private key and its key id (the RFC 7638 SHA-256
// thumbprint of the public key, base64url), generating the key first if the
// folder has none.
func (k *Keyring) Signer() (ed25519.PrivateKey, string, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.priv != nil {
		return k.priv, k.kid, nil
	}
	err := k.loadLocked()
	if errors.Is(err, ErrNoKey) {
		err = k.createLocked()
	}
	if err != nil {
		return nil, "", err
	}
	return k.priv, k.kid, nil
}

// Public returns the public key and its key id. It never creates the key:
// without one the error wraps ErrNoKey.
func (k *Keyring) Public() (ed25519.PublicKey, string, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.priv == nil {
		if err := k.loadLocked(); err != nil {
			return nil, "", err
		}
	}
	return k.priv.Public().(ed25519.PublicKey), k.kid, nil
}

func (k *Keyring) loadLocked() error {
	path := k.Path()
	fi, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%w at %s", ErrNoKey, path)
	}
	if err != nil {
		return fmt.Errorf("delegation key: %w", err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return fmt.Errorf("delegation key %s has mode %04o: group or others may read it; chmod 600 it", path, fi.Mode().Perm())
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("delegation key: %w", err)
	}
	blk, _ := pem.Decode(data)
	if blk == nil || blk.Type != "PRIVATE KEY" {
		return fmt.Errorf("delegation key %s: not a PEM PRIVATE KEY", path)
	}
	key, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
	if err != nil {
		return fmt.Errorf("delegation key %s: %w", path, err)
	}
	priv, ok := key.(ed25519.PrivateKey)
	if !ok {
		return fmt.Errorf("delegation key %s: not an Ed25519 key", path)
	}
	kid, err := keyID(priv.Public().(ed25519.PublicKey))
	if err != nil {
		return err
	}
	k.priv, k.kid = priv, kid
	return nil
}

func (k *Keyring) createLocked() error {
	if err := os.MkdirAll(k.dir, 0o700); err != nil {
		return fmt.Errorf("delegation key: %w", err)
	}
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return fmt.Errorf("delegation key: %w", err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return fmt.Errorf("delegation key: %w", err)
	}
	tmp, err := os.CreateTemp(k.dir, ".delegation-key-*")
	if err != nil {
		return fmt.Errorf("delegation key: %w", err)
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return fmt.Errorf("delegation key: %w", err)
	}
	if err := pem.Encode(tmp, &pem.Block{Type: "PRIVATE KEY", Bytes: der}); err != nil {
		tmp.Close()
		return fmt.Errorf("delegation key: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("delegation key: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("delegation key: %w", err)
	}
	// Link fails if another process created the key meanwhile: use theirs.
	if err := os.Link(tmp.Name(), k.Path()); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("delegation key: %w", err)
	}
	return k.loadLocked()
}

// keyID is the RFC 7638 thumbprint of pub, base64url without padding.
func keyID(pub ed25519.PublicKey) (string, error) {
	jwk := jose.JSONWebKey{Key: pub}
	sum, err := jwk.Thumbprint(crypto.SHA256)
	if err != nil {
		return "", fmt.Errorf("delegation key id: %w", err)
	}
	return base64.RawURLEncoding.EncodeToString(sum), nil
}
