package gateway

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// watch polls the bundle folder's YAML files and reloads when one changes.
// Polling (every second) works on every file system and for editors that
// replace files; it returns a stop function.
func (gw *Gateway) watch(ctx context.Context) func() {
	ctx, cancel := context.WithCancel(ctx)
	last := gw.fingerprint()
	go func() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				fp := gw.fingerprint()
				if fp != last {
					last = fp
					gw.Reload()
				}
			}
		}
	}()
	return cancel
}

// fingerprint summarizes the bundle files' names, sizes and times.
func (gw *Gateway) fingerprint() string {
	var s string
	for _, pat := range []string{"*.yaml", "*.yml"} {
		files, _ := filepath.Glob(filepath.Join(gw.cfg.BundleDir, pat))
		for _, f := range files {
			if fi, err := os.Stat(f); err == nil {
				s += fmt.Sprintf("%s %d %d|", f, fi.ModTime().UnixNano(), fi.Size())
			}
		}
	}
	return s
}
