package mcpproxy

// The gateway's lists: tools/list, resources/list, resources/templates/list
// and prompts/list are answered by the gateway itself, never by the SDK's
// own paging, in three steps that every list shares (listPage):
//
//  1. filter: only what the caller may see (its disclosed tools; the
//     resources, templates and prompts of upstreams it may reach,
//     gating.go), so paging cannot show what filtering hides;
//  2. sort by key (name or URI), as the SDK does;
//  3. page the filtered list: at most PageSize items, and a nextCursor
//     when more follow.
//
// A list is always an array, [] when nothing is left: MCP clients (the
// TypeScript SDK, the inspector) refuse null.
//
// Cursors are opaque: sealed (AES-GCM, a key made at random for each
// process) over the list they page, the session they were given to, the
// generation of the gateway's catalog (which moves on every reload and
// every change of an upstream's tools, resources, templates or prompts)
// and the offset. A cursor of another session, of another list, from
// before a change, from another process, or altered, is refused with
// invalid params ("list again from the start"); none says which item it
// points at.

import (
	"cmp"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"slices"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
)

// DefaultPageSize is the default of Options.PageSize: the SDK's own.
const DefaultPageSize = 1000

// lister seals cursors and keeps the catalog generation.
type lister struct {
	size int
	aead cipher.AEAD

	mu   sync.Mutex
	snap any // the snapshot gen last saw
	gen  uint64
}

func newLister(size int) *lister {
	if size <= 0 {
		size = DefaultPageSize
	}
	key := make([]byte, 32)
	rand.Read(key)
	block, err := aes.NewCipher(key)
	if err != nil {
		panic(err) // a 32-byte key is always valid
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		panic(err)
	}
	return &lister{size: size, aead: aead}
}

// generation returns the catalog generation for the snapshot in force
// (a new snapshot starts a new generation).
func (l *lister) generation(snap any) uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	if snap != l.snap {
		l.snap = snap
		l.gen++
	}
	return l.gen
}

// changed starts a new generation: the catalog of some list changed.
func (l *lister) changed() {
	l.mu.Lock()
	l.gen++
	l.mu.Unlock()
}

// seal makes the cursor of offset in list kind for session at gen.
func (l *lister) seal(kind, session string, gen uint64, offset int) string {
	var plain [16]byte
	binary.BigEndian.PutUint64(plain[:8], gen)
	binary.BigEndian.PutUint64(plain[8:], uint64(offset))
	nonce := make([]byte, l.aead.NonceSize(), l.aead.NonceSize()+len(plain)+l.aead.Overhead())
	rand.Read(nonce)
	return base64.RawURLEncoding.EncodeToString(l.aead.Seal(nonce, nonce, plain[:], []byte(kind+"\x00"+session)))
}

// open returns the offset a cursor of list kind for session at gen
// points at, or the invalid-params error for any other cursor.
func (l *lister) open(kind, session string, gen uint64, cursor string) (int, error) {
	bad := func(why string) error {
		return &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams,
			Message: fmt.Sprintf("invalid cursor for %s: %s; list again from the start (without a cursor)", kind, why)}
	}
	raw, err := base64.RawURLEncoding.DecodeString(cursor)
	if err != nil || len(raw) < l.aead.NonceSize() {
		return 0, bad("it is not one this gateway gave out")
	}
	plain, err := l.aead.Open(nil, raw[:l.aead.NonceSize()], raw[l.aead.NonceSize():], []byte(kind+"\x00"+session))
	if err != nil || len(plain) != 16 {
		return 0, bad("it is not one this gateway gave out in this session")
	}
	if binary.BigEndian.Uint64(plain[:8]) != gen {
		return 0, bad("the list has changed since it was given out")
	}
	off := binary.BigEndian.Uint64(plain[8:])
	if off > 1<<31 {
		return 0, bad("it is out of range")
	}
	return int(off), nil
}

// listPage filters items (keep), sorts them by key and returns the page a
// cursor points at ("" for the first) and the cursor of the next page (""
// for none). The page is never nil.
func listPage[T any](l *lister, kind, session string, gen uint64, cursor string, items []T, keep func(T) bool, key func(T) string) ([]T, string, error) {
	kept := make([]T, 0, len(items))
	for _, x := range items {
		if keep(x) {
			kept = append(kept, x)
		}
	}
	slices.SortFunc(kept, func(a, b T) int { return cmp.Compare(key(a), key(b)) })
	start := 0
	if cursor != "" {
		off, err := l.open(kind, session, gen, cursor)
		if err != nil {
			return nil, "", err
		}
		if off > len(kept) {
			return nil, "", &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: fmt.Sprintf("invalid cursor for %s: it is out of range; list again from the start (without a cursor)", kind)}
		}
		start = off
	}
	end := min(start+l.size, len(kept))
	page := kept[start:end:end]
	next := ""
	if end < len(kept) {
		next = l.seal(kind, session, gen, end)
	}
	return page, next, nil
}
