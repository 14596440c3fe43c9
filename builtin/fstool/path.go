package fstool

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/toolgate/toolgate"
	"github.com/toolgate/toolgate/builtin"
)

// maxLinkHops bounds how many symbolic links one path may go through (the
// Linux limit, ELOOP).
const maxLinkHops = 40

// Resolve checks that rel names an existing file or folder inside root and
// returns its workspace-relative path: slash-separated, clean, every symbolic
// link followed ("." for the workspace itself).
//
// rel is relative and slash-separated; "" means ".". It is refused with
// toolgate.CodePathOutsideWorkspace when it is absolute, has a ".."
// component, or goes through a symbolic link that is absolute or climbs above
// the workspace (a link to a sibling folder such as ../ws-evil included),
// even when the link dangles. It is refused with toolgate.CodeBadArguments
// when it contains a NUL byte, does not exist, or goes through a file as if
// it were a folder. Resolve only reads (Lstat, Readlink through root); it
// never follows a link with anything but its own lexical walk, so a dangling
// link pointing out is never opened or created.
func Resolve(root *os.Root, rel string) (string, error) {
	if err := checkLexical(rel); err != nil {
		return "", err
	}
	pending := splitPath(rel)
	var cur []string // resolved components, no links among them
	hops := 0
	for len(pending) > 0 {
		c := pending[0]
		pending = pending[1:]
		switch c {
		case "", ".":
			continue
		case "..":
			// Only link targets reach here (checkLexical refuses ".." in
			// rel): step up, never above the workspace.
			if len(cur) == 0 {
				return "", builtin.Refuse(toolgate.CodePathOutsideWorkspace,
					"path %q is outside the workspace: a symbolic link on it climbs above the workspace folder", rel)
			}
			cur = cur[:len(cur)-1]
			continue
		}
		cand := joinPath(append(cur[:len(cur):len(cur)], c))
		fi, err := root.Lstat(cand)
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return "", builtin.BadArguments(err, "path %q does not exist in the workspace", rel)
			}
			if errors.Is(err, syscall.ENOTDIR) {
				return "", builtin.BadArguments(err, "path %q goes through a file as if it were a folder", rel)
			}
			// Fail closed: anything os.Root refuses is treated as outside.
			return "", &toolgate.Error{Code: toolgate.CodePathOutsideWorkspace, Layer: toolgate.LayerResource,
				Message: fmt.Sprintf("path %q cannot be resolved inside the workspace: %v", rel, err), Err: err}
		}
		if fi.Mode()&fs.ModeSymlink != 0 {
			hops++
			if hops > maxLinkHops {
				return "", builtin.BadArguments(nil, "path %q goes through more than %d symbolic links", rel, maxLinkHops)
			}
			target, err := root.Readlink(cand)
			if err != nil {
				return "", &toolgate.Error{Code: toolgate.CodePathOutsideWorkspace, Layer: toolgate.LayerResource,
					Message: fmt.Sprintf("path %q: symbolic link %q cannot be read: %v", rel, cand, err), Err: err}
			}
			if target == "" || path.IsAbs(target) || strings.ContainsRune(target, 0) {
				return "", builtin.Refuse(toolgate.CodePathOutsideWorkspace,
					"path %q is outside the workspace: symbolic link %q points to %q, an absolute path", rel, cand, target)
			}
			pending = append(splitPath(target), pending...)
			continue
		}
		if len(pending) > 0 && hasMore(pending) && !fi.IsDir() {
			return "", builtin.BadArguments(nil, "path %q goes through %q, which is not a folder", rel, cand)
		}
		cur = append(cur, c)
	}
	return joinPath(cur), nil
}

// checkLexical refuses what no lookup is needed to refuse.
func checkLexical(rel string) error {
	if strings.ContainsRune(rel, 0) {
		return builtin.BadArguments(nil, "path %q contains a NUL byte", rel)
	}
	if path.IsAbs(rel) || filepath.IsAbs(rel) || filepath.VolumeName(rel) != "" {
		return builtin.Refuse(toolgate.CodePathOutsideWorkspace,
			"path %q is outside the workspace: absolute paths are refused; give a path relative to the workspace", rel)
	}
	for _, c := range splitPath(rel) {
		if c == ".." {
			return builtin.Refuse(toolgate.CodePathOutsideWorkspace,
				"path %q is outside the workspace: \"..\" is refused; give a path relative to the workspace", rel)
		}
	}
	return nil
}

// hasMore reports whether pending holds a real component still to walk.
func hasMore(pending []string) bool {
	for _, p := range pending {
		if p != "" && p != "." {
			return true
		}
	}
	return false
}

func splitPath(p string) []string { return strings.Split(p, "/") }

func joinPath(cs []string) string {
	if len(cs) == 0 {
		return "."
	}
	return strings.Join(cs, "/")
}
