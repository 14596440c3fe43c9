// Package gateway runs toolgate serve: it loads the policy bundle, opens the
// embedded store, connects the upstream MCP servers, and serves the MCP
// proxy, the JSON API, health and metrics on one loopback listener. It owns
// the lifecycle: reload on SIGHUP or a bundle change (a bundle that fails
// validation is refused and the last good one stays), recompilation when an
// upstream announces new tools, and graceful shutdown.
package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolgate/toolgate"
	"github.com/toolgate/toolgate/adapter/builtins"
	"github.com/toolgate/toolgate/audit"
	"github.com/toolgate/toolgate/authz"
	"github.com/toolgate/toolgate/builtin/registry"
	"github.com/toolgate/toolgate/gate"
	"github.com/toolgate/toolgate/httpapi"
	"github.com/toolgate/toolgate/mcpproxy"
	"github.com/toolgate/toolgate/metrics"
	"github.com/toolgate/toolgate/policy"
	"github.com/toolgate/toolgate/store/sqlite"
	"github.com/toolgate/toolgate/upstream"
)

// DefaultListen is where serve listens unless told otherwise.
const DefaultListen = "127.0.0.1:8420"

// DBFile is the SQLite file under the data folder.
const DBFile = "toolgate.db"

// SpillFile is where, at shutdown, the audit events that could not be
// written (the store was down) are kept, under the data folder; the next
// start appends them to the log and removes the file (audit.Recover).
const SpillFile = "audit-spill.jsonl"

// LockFile, under the data folder, is held (flock) by the running gateway:
// one gateway per data folder, so that the start of one never marks the
// calls another is running as outcome_unknown.
const LockFile = "toolgate.lock"

// CloseAuditTimeout is how long shutdown gives the audit log to write what
// is queued before it spills the rest to SpillFile.
const CloseAuditTimeout = 5 * time.Second

// Config configures Run.
type Config struct {
	BundleDir string
	Listen    string // default DefaultListen
	DataDir   string // default ./toolgate-data
	// AuditSync is the SQLite store's durability: "full" (default, fsync
	// per commit) or "normal" (survives a gateway crash, not power loss).
	AuditSync string
	// EventsFile, when set, also writes every committed event as a JSON
	// line to this file ("-" is stdout).
	EventsFile string
	Logger     *slog.Logger
	Version    string
	// Ready, when set, receives the bound address once serving.
	Ready func(addr string)
	// Mount, when set, adds routes (the JSON API) to the mux; it is given
	// the gateway.
	Mount func(mux *http.ServeMux, gw *Gateway)
}

// Gateway is a running gateway's state.
type Gateway struct {
	cfg   Config
	log   *slog.Logger
	Gate  *gate.Gate
	Proxy *mcpproxy.Proxy
	Ups   *upstream.Manager
	Store *sqlite.Store
	Rec   *audit.Recorder
	// Metrics is the gateway's Prometheus registry, served at /metrics.
	Metrics *metrics.Metrics
	// ident verifies JWTs and delegation tokens (identity.go).
	ident identityState
	// Builtins are the built-in tools (fs.*, sql.* over the bundle's
	// Database documents), read at start.
	Builtins *registry.Registry

	mu        sync.Mutex
	bundle    *policy.Bundle
	announced map[string][]authz.AnnouncedTool
	gen       int
}

// Run serves until ctx ends, then shuts down gracefully. reload receives a
// value on each SIGHUP.
func Run(ctx context.Context, cfg Config, reload <-chan struct{}) error {
	if cfg.Listen == "" {
		cfg.Listen = DefaultListen
	}
	if cfg.DataDir == "" {
		cfg.DataDir = "toolgate-data"
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	gw := &Gateway{cfg: cfg, log: log, announced: map[string][]authz.AnnouncedTool{}}

	b, err := policy.LoadDir(cfg.BundleDir)
	if err != nil {
		return err
	}
	snap, rep, err := authz.Compile(b, nil)
	if err != nil {
		for _, d := range rep.Errors {
			log.Error("bundle error", "at", d.String())
		}
		return fmt.Errorf("the bundle %s is invalid; run toolgate validate --bundle %s: %w", cfg.BundleDir, cfg.BundleDir, err)
	}
	for _, d := range rep.Warnings {
		if d.Unchecked {
			// Checked below once the upstream connects (reportMissingLocked).
			log.Info("bundle note", "at", d.String())
			continue
		}
		log.Warn("bundle warning", "at", d.String())
	}
	gw.bundle = b

	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return fmt.Errorf("data folder: %w", err)
	}
	unlock, err := lockDataDir(cfg.DataDir)
	if err != nil {
		return err
	}
	defer unlock()
	store, err := sqlite.Open(filepath.Join(cfg.DataDir, DBFile), &sqlite.Options{Synchronous: cfg.AuditSync})
	if err != nil {
		return fmt.Errorf("open store: %w", err)
	}
	gw.Store = store
	defer store.Close()
	// Before any call and any other event: close the previous run (calls it
	// left without an outcome, events it spilled) and mark this start.
	rr, err := audit.Recover(ctx, store, &audit.RecoverOptions{SpillPath: filepath.Join(cfg.DataDir, SpillFile),
		Details: map[string]any{"version": cfg.Version, "bundle": cfg.BundleDir}})
	if err != nil {
		return fmt.Errorf("audit log: %w", err)
	}
	if len(rr.OutcomeUnknown) > 0 || rr.Replayed > 0 {
		log.Warn("audit log: the previous run stopped uncleanly", "outcome_unknown", len(rr.OutcomeUnknown),
			"replayed_from_spill", rr.Replayed, "previous_start_seq", rr.PreviousStart, "scanned", rr.Scanned)
	}
	var sinks []audit.Sink
	if cfg.EventsFile != "" {
		var w io.Writer = os.Stdout
		if cfg.EventsFile != "-" {
			f, err := os.OpenFile(cfg.EventsFile, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
			if err != nil {
				return fmt.Errorf("events file: %w", err)
			}
			defer f.Close()
			w = f
		}
		sinks = append(sinks, audit.NewJSONLSink(w))
	}
	gw.Metrics = metrics.New(nil)
	sinks = append(sinks, gw.Metrics.AuditSink())
	// A sink that fails or falls behind (its queue is full) never fails a
	// call: the store has every event. It is not silent either: logged, at
	// most once a second.
	var sinkLogged atomic.Int64
	gw.Rec = audit.NewRecorder(store, &audit.RecorderOptions{Sinks: sinks, OnSinkError: func(_ audit.Sink, err error) {
		now, last := time.Now().UnixNano(), sinkLogged.Load()
		if now-last >= int64(time.Second) && sinkLogged.CompareAndSwap(last, now) {
			log.Warn("audit event sink: events not delivered to it (the audit log has them)", "err", err)
		}
	}})
	bt, err := builtins.Open(ctx, b, cfg.BundleDir)
	if err != nil {
		return fmt.Errorf("built-in tools: %w", err)
	}
	defer bt.Close()
	gw.Builtins = bt
	executor := &gate.Executor{Builtins: bt, BaseDir: cfg.BundleDir}
	gw.Gate = gate.New(snap, &gate.Options{Recorder: gw.Rec, Approvals: store, Logger: log, Executor: executor})
	gw.Gate.RecordEvent(bundleEvent(toolgate.EventBundleLoaded, cfg.BundleDir, "the bundle was loaded", nil))

	ups, err := gw.newUpstreams(b)
	if err != nil {
		return err
	}
	gw.Ups = ups
	if ups != nil {
		executor.Upstreams = ups
	}
	ids, err := gw.identities(b)
	if err != nil {
		return err
	}
	gw.Proxy = mcpproxy.New(gw.Gate, ups, ids, &mcpproxy.Options{Logger: log, Version: cfg.Version, Observer: gw.Metrics})
	gw.Proxy.SetBuiltins(snap, bt)
	if ups != nil {
		if err := ups.Start(ctx); err != nil {
			log.Warn("some upstreams are down; they are restarted in the background", "err", err)
		}
	}

	mux := http.NewServeMux()
	mux.Handle("/mcp", gw.Proxy.Handler())
	// The JSON API also serves /healthz, /readyz and /metrics.
	mux.Handle("/", gw.Proxy.OriginGuard(httpapi.New(gw.Gate, &httpapi.Options{Metrics: gw.Metrics, Ready: gw.Ready, Audit: store, Logger: log,
		Identify: gw.identifyHTTP})))
	mux.Handle("/v1/delegations", gw.Proxy.OriginGuard(gw.delegationsHandler())) // identity.go
	if cfg.Mount != nil {
		cfg.Mount(mux, gw)
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	// Headers must arrive within 10 s, a kept-alive connection idles at most
	// 2 min, a body not read to its end cannot hold a connection
	// (ReleaseUnread), and bodies are read under a deadline where they are
	// read (httpapi.BodyReadTimeout, mcpproxy.BodyReadTimeout); no
	// ReadTimeout, which would cut long response streams.
	srv := &http.Server{Handler: httpapi.ReleaseUnread(mux), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	log.Info("toolgate serving", "mcp", "http://"+ln.Addr().String()+"/mcp", "bundle", cfg.BundleDir, "data", cfg.DataDir)
	if cfg.Ready != nil {
		cfg.Ready(ln.Addr().String())
	}
	stopWatch := gw.watch(ctx)
	defer stopWatch()

	expire := time.NewTicker(15 * time.Second)
	defer expire.Stop()
	for {
		select {
		case <-expire.C:
			if _, err := gw.Gate.ExpireApprovals(ctx); err != nil {
				log.Error("expire approvals", "err", err)
			}
		case <-ctx.Done():
			return gw.shutdown(srv)
		case <-reload:
			gw.Reload()
		case err := <-errc:
			gw.shutdown(srv)
			return fmt.Errorf("serve: %w", err)
		}
	}
}

func (gw *Gateway) shutdown(srv *http.Server) error {
	gw.log.Info("shutting down")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := srv.Shutdown(ctx)
	if gw.Ups != nil {
		gw.Ups.Close()
	}
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	// The audit log gets its own time: what it cannot write (the store is
	// down) is spilled to the data folder and appended at the next start.
	actx, acancel := context.WithTimeout(context.Background(), CloseAuditTimeout)
	defer acancel()
	if cerr := gw.Rec.Close(actx); cerr != nil {
		left := gw.Rec.Unwritten()
		path := filepath.Join(gw.cfg.DataDir, SpillFile)
		if serr := audit.WriteSpill(path, left); serr != nil {
			gw.log.Error("audit log: events lost: the store could not write them and they could not be spilled", "lost", len(left), "err", serr, "store_err", cerr)
			err = errors.Join(err, fmt.Errorf("audit log: %d events lost: %w (spill: %v)", len(left), cerr, serr))
		} else {
			gw.log.Warn("audit log: events the store could not write were spilled; the next start appends them", "spilled", len(left), "file", path, "store_err", cerr)
		}
	}
	return err
}

// Ready reports why the gateway should not take traffic: the audit log
// cannot take a record that must be durable now (the store failing, a
// write running longer than audit.DefaultStallAfter, the backlog full).
func (gw *Gateway) Ready() error {
	if err := gw.Rec.Health(); err != nil {
		return fmt.Errorf("audit log: %w", err)
	}
	return nil
}

// lockDataDir takes the data folder's lock file (flock, released when the
// returned func is called or the process ends) or says who holds it.
func lockDataDir(dir string) (func(), error) {
	path := filepath.Join(dir, LockFile)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("data folder: lock %s: %w", path, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		b, _ := os.ReadFile(path)
		f.Close()
		return nil, fmt.Errorf("data folder %s is in use by another toolgate serve (pid %s holds %s): one gateway per data folder", dir, strings.TrimSpace(string(b)), path)
	}
	_ = f.Truncate(0)
	fmt.Fprintf(f, "%d\n", os.Getpid())
	return func() { f.Close() }, nil
}

func bundleEvent(t toolgate.EventType, dir, reason string, details map[string]any) audit.Event {
	if details == nil {
		details = map[string]any{}
	}
	details["bundle"] = dir
	return audit.Event{EventType: string(t), Reason: reason, Details: details}
}

// UpstreamConfig turns an Upstream document into the manager's config;
// relative paths resolve against the bundle folder.
func UpstreamConfig(bundleDir string, u *policy.Upstream) upstream.Config {
	secret := func(s policy.Secret) upstream.Secret {
		return upstream.Secret{Value: s.Value, FromEnv: s.FromEnv, FromFile: s.FromFile}
	}
	c := upstream.Config{Name: u.Name, Transport: u.Transport, Command: u.Command, URL: u.URL,
		CallTimeout: u.CallTimeout.D(), ConnectTimeout: u.ConnectTimeout.D()}
	for _, a := range u.Args {
		if strings.HasPrefix(a, "./") || strings.HasPrefix(a, "../") {
			a = filepath.Join(bundleDir, a)
		}
		c.Args = append(c.Args, a)
	}
	if u.Dir != "" {
		c.Dir = u.Dir
		if !filepath.IsAbs(c.Dir) {
			c.Dir = filepath.Join(bundleDir, c.Dir)
		}
	}
	if len(u.Env) > 0 {
		c.Env = map[string]upstream.Secret{}
		for k, v := range u.Env {
			c.Env[k] = secret(v)
		}
	}
	if len(u.Headers) > 0 {
		c.Headers = map[string]upstream.Secret{}
		for k, v := range u.Headers {
			c.Headers[k] = secret(v)
		}
	}
	return c
}

func (gw *Gateway) newUpstreams(b *policy.Bundle) (*upstream.Manager, error) {
	if len(b.Upstreams) == 0 {
		return nil, nil
	}
	var cfgs []upstream.Config
	for _, u := range b.Upstreams {
		cfgs = append(cfgs, UpstreamConfig(gw.cfg.BundleDir, u))
	}
	o := &upstream.Options{Logger: gw.log, OnChange: gw.onToolsChanged}
	// Route what upstreams send to clients (sampling, elicitation, roots,
	// progress, logging, resource and prompt changes) through the proxy.
	mcpproxy.RelayUpstream(o, func() *mcpproxy.Proxy { return gw.Proxy })
	return upstream.New(cfgs, o)
}

// onToolsChanged maps an upstream's new tool list into the catalog,
// recompiles and mirrors the tools into the MCP server.
func (gw *Gateway) onToolsChanged(name string, tools []*mcp.Tool) {
	gw.mu.Lock()
	defer gw.mu.Unlock()
	var u *policy.Upstream
	for _, x := range gw.bundle.Upstreams {
		if x.Name == name {
			u = x
		}
	}
	if u == nil {
		return
	}
	accepted, problems := mcpproxy.Announced(u, tools)
	for _, p := range problems {
		gw.log.Warn("upstream tool refused", "upstream", name, "problem", p)
		gw.Gate.RecordEvent(audit.Event{EventType: string(toolgate.EventDefinitionChanged), Reason: p,
			Details: map[string]any{"upstream": name, "refused": true}})
	}
	prev := gw.announced[name]
	gw.announced[name] = accepted
	if !sameAnnounced(prev, accepted) && prev != nil {
		gw.Gate.RecordEvent(audit.Event{EventType: string(toolgate.EventDefinitionChanged),
			Reason:  fmt.Sprintf("upstream %s changed its tool list (%d tools now)", name, len(accepted)),
			Details: map[string]any{"upstream": name}})
	}
	if err := gw.recompileLocked(gw.bundle); err != nil {
		gw.log.Error("recompile after upstream change failed; the previous snapshot stays", "upstream", name, "err", err)
	}
	if gw.Proxy != nil {
		gw.Proxy.SetTools(u, tools, accepted)
	}
	gw.reportMissingLocked(name)
}

func sameAnnounced(a, b []authz.AnnouncedTool) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// reportMissingLocked logs ceiling tools under an upstream's provider that
// the upstream does not announce, and ceiling entries whose class is below
// the one the upstream announces.
func (gw *Gateway) reportMissingLocked(name string) {
	have := map[string]bool{}
	for _, a := range gw.announced[name] {
		have[a.ID] = true
	}
	for _, t := range gw.bundle.Tools {
		have[policy.ToolIDOf(t)] = true
	}
	var missing []string
	for _, a := range gw.bundle.Agents {
		for _, p := range a.ToolPermissions {
			if strings.HasPrefix(p.ToolID, "tool:"+name+"-") && !have[p.ToolID] {
				missing = append(missing, a.AgentID+": "+p.ToolID)
			}
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		gw.log.Warn("ceiling tools the upstream does not announce (they stay unavailable)", "upstream", name, "tools", missing)
	}
	// A ceiling entry below the class the upstream announces (its
	// annotations; unknown means write) is what validate refuses for a Tool
	// document; here the tool's own, higher class applies, and the operator
	// is told.
	announced := map[string]toolgate.SideEffectClass{}
	for _, a := range gw.announced[name] {
		announced[a.ID] = a.SideEffectClass
	}
	for _, t := range gw.bundle.Tools {
		delete(announced, policy.ToolIDOf(t)) // a Tool document decides, and validate checked it
	}
	var lower []string
	for _, a := range gw.bundle.Agents {
		for _, p := range a.ToolPermissions {
			own, ok := announced[p.ToolID]
			if !ok || p.SideEffectClass == "" {
				continue
			}
			if c, err := toolgate.ParseSideEffectClass(p.SideEffectClass); err == nil && c < own {
				lower = append(lower, fmt.Sprintf("%s: %s declares %s, the upstream's annotations say %s", a.AgentID, p.ToolID, c, own))
			}
		}
	}
	sort.Strings(lower)
	if len(lower) > 0 {
		gw.log.Warn("ceiling entries below the class the upstream announces: the tool's own class applies (add a Tool document to set it, or raise the entry)",
			"upstream", name, "entries", lower)
	}
}

func (gw *Gateway) recompileLocked(b *policy.Bundle) error {
	var all []authz.AnnouncedTool
	names := make([]string, 0, len(gw.announced))
	for n := range gw.announced {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		all = append(all, gw.announced[n]...)
	}
	snap, _, err := authz.Compile(b, &authz.Options{Announced: all})
	if err != nil {
		return err
	}
	gw.Gate.Swap(snap)
	gw.gen++
	return nil
}

// Reload re-reads the bundle. A bundle that fails validation is refused
// (policy.bundle.rejected) and the last good one stays. Upstream documents
// are read at start only; changing them needs a restart.
func (gw *Gateway) Reload() error {
	gw.mu.Lock()
	defer gw.mu.Unlock()
	b, err := policy.LoadDir(gw.cfg.BundleDir)
	var ids *mcpproxy.Identities
	if err == nil {
		ids, err = gw.identities(b)
	}
	if err == nil {
		err = gw.recompileLocked(b)
	}
	if err != nil {
		gw.log.Error("bundle rejected; the last good bundle stays", "err", err)
		gw.Gate.RecordEvent(bundleEvent(toolgate.EventBundleRejected, gw.cfg.BundleDir, "the bundle was refused: "+err.Error(), nil))
		return err
	}
	gw.bundle = b
	gw.Proxy.SetIdentities(ids)
	gw.Proxy.SetBuiltins(gw.Gate.Snapshot(), gw.Builtins)
	gw.Gate.RecordEvent(bundleEvent(toolgate.EventBundleLoaded, gw.cfg.BundleDir, "the bundle was reloaded", nil))
	gw.log.Info("bundle reloaded", "generation", gw.gen)
	return nil
}

// Generation counts successful compilations.
func (gw *Gateway) Generation() int {
	gw.mu.Lock()
	defer gw.mu.Unlock()
	return gw.gen
}
