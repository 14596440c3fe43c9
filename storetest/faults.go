package storetest

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The helpers below make real stores fail the way they fail in production:
// a file system that fills up, one that freezes (fsfreeze), a PostgreSQL
// server that stops or stops answering. They need root (mount, fsfreeze,
// initdb as the postgres user); CI runs as root. Without root they fail the
// test, unless TOOLGATE_FAULT_TESTS=off, which skips them (saying so):
// nothing is skipped silently.

// RequireRoot fails t unless the process runs as root; with
// TOOLGATE_FAULT_TESTS=off it skips t instead.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Getenv("TOOLGATE_FAULT_TESTS") == "off" {
		t.Skip("TOOLGATE_FAULT_TESTS=off: the store fault tests (real full and frozen file systems, a stopped PostgreSQL) are skipped")
	}
	if os.Geteuid() != 0 {
		t.Fatal("this store fault test mounts file systems and runs a private PostgreSQL: it needs root (CI runs as root); set TOOLGATE_FAULT_TESTS=off to skip it")
	}
}

func run(t testing.TB, name string, args ...string) {
	t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
}

// FS is a small file system of its own, mounted for one test.
type FS struct {
	// Dir is where it is mounted.
	Dir    string
	filler string
	frozen bool
	mu     sync.Mutex
}

// MountTmpfs mounts a tmpfs of size bytes under t.TempDir() and unmounts it
// when the test ends. Fill makes it full.
func MountTmpfs(t testing.TB, size int64) *FS {
	t.Helper()
	RequireRoot(t)
	dir := filepath.Join(t.TempDir(), "tmpfs")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	run(t, "mount", "-t", "tmpfs", "-o", fmt.Sprintf("size=%d,mode=0700", size), "tmpfs", dir)
	t.Cleanup(func() { exec.Command("umount", "-l", dir).Run() })
	return &FS{Dir: dir}
}

// MountTmpfsInodes is MountTmpfs with at most inodes files (and folders)
// on it, so that FillInodes is quick.
func MountTmpfsInodes(t testing.TB, size, inodes int64) *FS {
	t.Helper()
	RequireRoot(t)
	dir := filepath.Join(t.TempDir(), "tmpfs")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	run(t, "mount", "-t", "tmpfs", "-o", fmt.Sprintf("size=%d,nr_inodes=%d,mode=0700", size, inodes), "tmpfs", dir)
	t.Cleanup(func() { exec.Command("umount", "-l", dir).Run() })
	return &FS{Dir: dir}
}

// FillInodes creates empty files until the file system has no inode left
// (not even an empty file can be created) and returns a func that removes
// them. Use it on a file system with few inodes (MountTmpfsInodes).
func (f *FS) FillInodes(t testing.TB) (free func()) {
	t.Helper()
	dir := filepath.Join(f.Dir, "inode-filler")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatalf("fill the inodes of %s: %v", f.Dir, err)
	}
	for i := 0; ; i++ {
		fh, err := os.OpenFile(filepath.Join(dir, strconv.Itoa(i)), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("fill the inodes of %s: %v", f.Dir, err)
			}
			break
		}
		fh.Close()
		if i > 10_000_000 {
			t.Fatalf("fill the inodes of %s: more than 10 million files; mount it with fewer inodes", f.Dir)
		}
	}
	return func() {
		if err := os.RemoveAll(dir); err != nil {
			t.Errorf("free the inodes of %s: %v", f.Dir, err)
		}
	}
}

// MountExt4 makes an ext4 file system of size bytes in a file under
// t.TempDir(), loop-mounts it and unmounts it when the test ends (thawing
// it first). Freeze freezes it (fsfreeze).
func MountExt4(t testing.TB, size int64) *FS {
	t.Helper()
	RequireRoot(t)
	base := t.TempDir()
	img := filepath.Join(base, "fs.img")
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, size); err != nil {
		t.Fatal(err)
	}
	run(t, "mkfs.ext4", "-q", "-F", img)
	dir := filepath.Join(base, "ext4")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	run(t, "mount", "-o", "loop", img, dir)
	f := &FS{Dir: dir}
	t.Cleanup(func() {
		f.Thaw(t)
		exec.Command("umount", "-l", dir).Run()
	})
	return f
}

// Fill writes a file until the file system is full and returns a func that
// removes it (the file system has room again).
func (f *FS) Fill(t testing.TB) (free func()) {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	path := filepath.Join(f.Dir, "filler")
	fh, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	chunk := bytes.Repeat([]byte{'x'}, 64<<10)
	for {
		if _, err := fh.Write(chunk); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				fh.Close()
				t.Fatalf("fill %s: %v", f.Dir, err)
			}
			break
		}
	}
	// Down to the last bytes.
	for _, n := range []int{4096, 512, 1} {
		for {
			if _, err := fh.Write(chunk[:n]); err != nil {
				break
			}
		}
	}
	fh.Sync()
	fh.Close()
	f.filler = path
	return func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		if err := os.Remove(path); err != nil {
			t.Errorf("free %s: %v", f.Dir, err)
		}
		f.filler = ""
	}
}

// Freeze freezes the file system (fsfreeze -f): every write to it blocks
// until Thaw, as under a snapshot or a hung disk. The test's cleanup thaws
// it in any case.
func (f *FS) Freeze(t testing.TB) {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	run(t, "fsfreeze", "-f", f.Dir)
	f.frozen = true
}

// Thaw unfreezes a frozen file system; it does nothing otherwise.
func (f *FS) Thaw(t testing.TB) {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.frozen {
		return
	}
	run(t, "fsfreeze", "-u", f.Dir)
	f.frozen = false
}

// Postgres is a private PostgreSQL cluster (initdb, pg_ctl) run by the
// postgres user under t.TempDir() on a free loopback port, for tests that
// stop it or freeze it. It is stopped when the test ends.
type Postgres struct {
	bin, data, sock, log string
	port                 int
	cred                 *syscall.Credential
	mu                   sync.Mutex
	frozen               []int
}

// StartPostgres initializes and starts a private cluster. It needs root
// (the server runs as the postgres user) and the server binaries under
// /usr/lib/postgresql/*/bin.
func StartPostgres(t testing.TB) *Postgres {
	t.Helper()
	RequireRoot(t)
	bins, _ := filepath.Glob("/usr/lib/postgresql/*/bin/pg_ctl")
	if len(bins) == 0 {
		t.Fatal("no PostgreSQL server binaries under /usr/lib/postgresql/*/bin (install the postgresql package)")
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		t.Fatalf("the private PostgreSQL runs as the postgres user: %v", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	base := t.TempDir()
	// The postgres user must reach base: open the path to it for traversal.
	for d := base; d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	dir := filepath.Join(base, "pg")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, uid, gid); err != nil {
		t.Fatal(err)
	}
	p := &Postgres{bin: filepath.Dir(bins[len(bins)-1]), data: filepath.Join(dir, "data"), sock: dir, log: filepath.Join(dir, "log"),
		port: freePort(t), cred: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
	p.pg(t, "initdb", "-D", p.data, "-A", "trust", "-U", "postgres", "--no-sync")
	p.Start(t)
	t.Cleanup(func() {
		p.Thaw(t)
		p.pgErr("pg_ctl", "-D", p.data, "-m", "immediate", "-w", "stop")
	})
	return p
}

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func (p *Postgres) pgErr(name string, args ...string) ([]byte, error) {
	cmd := exec.Command(filepath.Join(p.bin, name), args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: p.cred}
	cmd.Dir = p.sock
	return cmd.CombinedOutput()
}

func (p *Postgres) pg(t testing.TB, name string, args ...string) {
	t.Helper()
	if out, err := p.pgErr(name, args...); err != nil {
		log, _ := os.ReadFile(p.log)
		t.Fatalf("%s %s: %v\n%s\nserver log:\n%s", name, strings.Join(args, " "), err, out, log)
	}
}

// DSN is the cluster's database "postgres" over TCP on 127.0.0.1. Its
// connect_timeout is 2 s, so a stopped server fails fast.
func (p *Postgres) DSN() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable&connect_timeout=2", p.port)
}

// Start starts the server (again) and waits until it takes connections.
func (p *Postgres) Start(t testing.TB) {
	t.Helper()
	p.pg(t, "pg_ctl", "-D", p.data, "-l", p.log, "-w", "-t", "60", "-o",
		fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1", p.port, p.sock), "start")
}

// Stop stops the server (fast shutdown: connections are closed).
func (p *Postgres) Stop(t testing.TB) {
	t.Helper()
	p.pg(t, "pg_ctl", "-D", p.data, "-m", "fast", "-w", "stop")
}

// Freeze stops (SIGSTOP) the postmaster and every server process: the
// server keeps its connections but answers nothing until Thaw.
func (p *Postgres) Freeze(t testing.TB) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	b, err := os.ReadFile(filepath.Join(p.data, "postmaster.pid"))
	if err != nil {
		t.Fatal(err)
	}
	pm, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0]))
	if err != nil {
		t.Fatal(err)
	}
	pids := append([]int{pm}, children(pm)...)
	for _, pid := range pids {
		if err := syscall.Kill(pid, syscall.SIGSTOP); err == nil {
			p.frozen = append(p.frozen, pid)
		}
	}
}

// Thaw continues (SIGCONT) what Freeze stopped.
func (p *Postgres) Thaw(t testing.TB) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, pid := range p.frozen {
		syscall.Kill(pid, syscall.SIGCONT)
	}
	p.frozen = nil
}

// children returns the pids whose parent is pid (from /proc).
func children(pid int) []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces, so split after ')'.
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) > 1 {
			if pp, _ := strconv.Atoi(f[1]); pp == pid {
				out = append(out, n)
			}
		}
	}
	return out
}

// WaitFor polls cond every 10 ms until it is true, failing t with what
// after limit. It waits for a state, it does not time anything.
func WaitFor(t testing.TB, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited %s for %s", limit, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
