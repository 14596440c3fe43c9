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
	"github.com/toolgate/toolgate/adapter"
	"github.com/toolgate/toolgate/adapter/mcptool"
	"github.com/toolgate/toolgate/audit"
	"github.com/toolgate/toolgate/authz"
	"github.com/toolgate/toolgate/builtin/registry"
	"github.com/toolgate/toolgate/gate"
	"github.com/toolgate/toolgate/httpapi"
	"github.com/toolgate/toolgate/identity"
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
	// startedSeq is the seq of this run's gateway.started event;
	// auditOnce and auditErr make closeAudit run once.
	startedSeq int64
	auditOnce  sync.Once
	auditErr   error
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
	// claimed is the highest class each announced tool id has claimed
	// since the gateway started (onToolsChanged).
	claimed map[string]toolgate.SideEffectClass
	gen     int
	// bundleGen counts accepted bundles: 1 at start, one more per accepted
	// reload (toolgate_bundle_generation); gen also counts recompilations
	// after upstream tool changes.
	bundleGen uint64
	// problems are the refusals last reported per upstream (onToolsChanged
	// records only new ones); applied the sequence number of the tool list
	// last applied per upstream.
	problems map[string]map[string]bool
	applied  map[string]uint64

	// changes coalesces upstreams' tool list changes (toolChanges).
	changes toolChanges
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
	gw := &Gateway{cfg: cfg, log: log, announced: map[string][]authz.AnnouncedTool{},
		claimed:  map[string]toolgate.SideEffectClass{},
		problems: map[string]map[string]bool{}, applied: map[string]uint64{}}

	// Everything short of the store, listening and upstream processes;
	// toolgate validate runs the same (prepare.go).
	prep, err := Prepare(ctx, cfg, &PrepareOptions{Logger: log})
	if err != nil {
		var inv *InvalidError
		if errors.As(err, &inv) {
			for _, d := range inv.Report.Errors {
				log.Error("bundle error", "at", d.String())
			}
		}
		return err
	}
	defer prep.Close()
	b, snap, rep := prep.Bundle, prep.Snapshot, prep.Report
	for _, d := range rep.Warnings {
		if d.Unchecked {
			// Checked below once the upstream connects (reportMissingLocked).
			log.Info("bundle note", "at", d.String())
			continue
		}
		log.Warn("bundle warning", "at", d.String())
	}
	gw.bundle = b
	gw.ident.once.Do(func() { gw.ident.keys = prep.keys })

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
	before, err := store.AuditHead(ctx)
	if err != nil {
		return fmt.Errorf("audit log: %w", err)
	}
	rr, err := audit.Recover(ctx, store, &audit.RecoverOptions{SpillPath: filepath.Join(cfg.DataDir, SpillFile),
		LostMarker: filepath.Join(cfg.DataDir, LostMarker), RecordsStop: true,
		Details: map[string]any{"version": cfg.Version, "bundle": cfg.BundleDir}})
	if err != nil {
		return fmt.Errorf("audit log: %w", err)
	}
	gw.startedSeq = rr.Started.Seq
	logRecover(log, rr) // auditstate.go
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
	gw.Rec = audit.NewRecorder(store, &audit.RecorderOptions{Sinks: sinks, OnState: logAuditState(log), OnSinkError: func(_ audit.Sink, err error) {
		now, last := time.Now().UnixNano(), sinkLogged.Load()
		if now-last >= int64(time.Second) && sinkLogged.CompareAndSwap(last, now) {
			log.Warn("audit event sink: events not delivered to it (the audit log has them)", "err", err)
		}
	}})
	// Every return from here on closes the audit log (shutdown does it
	// first; a start that fails later does it here).
	defer gw.closeAudit()
	// What Recover wrote (the start, calls left without an outcome, events
	// replayed from a spill) went to the store before the sinks existed;
	// the event stream and the metrics get it now, in order.
	if err := replayToSinks(ctx, store, before.Seq+1, sinks); err != nil {
		log.Warn("audit event sinks: the events written at start could not be delivered to them (the audit log has them)", "err", err)
	}
	bt := prep.Builtins
	gw.Builtins = bt
	executor := &gate.Executor{Builtins: bt, BaseDir: cfg.BundleDir}
	gw.Gate = gate.New(snap, &gate.Options{Recorder: gw.Rec, Approvals: store, Logger: log, Executor: executor,
		Observer: gw.Metrics, AuditLog: store})
	gw.Gate.RecordEvent(bundleEvent(toolgate.EventBundleLoaded, cfg.BundleDir, "the bundle was loaded", nil))
	gw.bundleGen = 1
	gw.Metrics.BundleLoaded(gw.bundleGen)

	ups, err := gw.newUpstreams(prep.Upstreams)
	if err != nil {
		return err
	}
	gw.Ups = ups
	if ups != nil {
		// The one forwarder of upstream tool calls, whichever entry point
		// they came through; it measures every attempt.
		executor.Upstreams = &mcptool.Executor{Upstreams: ups, Observer: gw.Metrics}
	}
	gw.Gate.Install(snap, prep.Credentials)
	gw.Proxy = mcpproxy.New(gw.Gate, ups, &mcpproxy.Options{Logger: log, Version: cfg.Version, Observer: gw.Metrics,
		Registerer: gw.Metrics.Registry()})
	gw.Proxy.SetBuiltins(bt)
	if ups != nil {
		if err := ups.Start(ctx); err != nil {
			log.Warn("some upstreams are down; they are restarted in the background", "err", err)
		}
	}

	mux := http.NewServeMux()
	mux.Handle("/mcp", gw.Proxy.Handler())
	// The JSON API also serves /healthz, /readyz and /metrics.
	mux.Handle("/", gw.Proxy.OriginGuard(httpapi.New(gw.Gate, &httpapi.Options{Metrics: gw.Metrics.Handler(), Ready: gw.Ready, Logger: log,
		Refused:  func(r *http.Request, status int, code string) { gw.Proxy.RequestRefused(r, "http", status, code) },
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

// replayToSinks writes the committed events from seq from on to each sink,
// in order.
func replayToSinks(ctx context.Context, store audit.Store, from int64, sinks []audit.Sink) error {
	for {
		evs, err := audit.ReadEvents(ctx, store, from, 1000)
		if err != nil || len(evs) == 0 {
			return err
		}
		for _, s := range sinks {
			if err := s.Write(ctx, evs); err != nil {
				return err
			}
		}
		from = evs[len(evs)-1].Seq + 1
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
	gw.stopToolChanges()
	gw.Proxy.FlushRefusals() // the refusals counted but not yet written
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	// The audit log gets its own time: what it cannot write (the store is
	// down) is spilled to the data folder and appended at the next start;
	// its last event is gateway.stopped (auditstate.go).
	if aerr := gw.closeAudit(); aerr != nil {
		err = errors.Join(err, aerr)
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

func (gw *Gateway) newUpstreams(cfgs []upstream.Config) (*upstream.Manager, error) {
	if len(cfgs) == 0 {
		return nil, nil
	}
	b := gw.bundle
	m := gw.Metrics
	o := &upstream.Options{Logger: gw.log, OnChange: gw.onToolsChanged,
		MaxResultBytes: adapter.ReadLimit(resultCap(b)),
		OnState:        func(name string, s upstream.State) { m.SetUpstreamUp(name, s == upstream.StateUp) },
		OnRestart:      m.UpstreamRestart,
		OnRefused:      m.UpstreamRefused}
	for _, u := range b.Upstreams {
		m.DeclareUpstream(u.Name)
	}
	// Route what upstreams send to clients (sampling, elicitation, roots,
	// progress, logging, resource and prompt changes) through the proxy.
	var relay mcptool.ClientHandlers
	mcpproxy.RelayUpstream(&relay, func() *mcpproxy.Proxy { return gw.Proxy })
	relay.Install(o)
	return upstream.New(cfgs, o)
}

// ToolChangeWindow is the shortest time between two applications of one
// upstream's changed tool list (onToolsChanged). A variable for tests.
var ToolChangeWindow = time.Second

// toolChanges coalesces the tool lists upstreams announce: an upstream that
// floods tools/list_changed with a changing list is re-listed one list at
// a time (the upstream Manager never has two re-lists of one upstream in
// flight), and what it announces is applied — recompiled, mirrored to the
// clients, and recorded as mcp.tool.definition_changed — at most once per
// ToolChangeWindow: the first change at once, the ones after it within the
// window as one, the latest list, when the window ends. So one event
// stands for the actual change within a window, and a list that changes
// back within it records none.
type toolChanges struct {
	mu      sync.Mutex
	byName  map[string]*pendingTools
	stopped bool
}

type pendingTools struct {
	seq     uint64      // lists received
	tools   []*mcp.Tool // the latest, while waiting
	waiting *time.Timer // set while a list waits for the window to end
	last    time.Time   // when a list was last applied
}

// onToolsChanged receives an upstream's new tool list (from the upstream
// Manager) and applies it now or when the window ends (toolChanges).
func (gw *Gateway) onToolsChanged(name string, tools []*mcp.Tool) {
	c := &gw.changes
	c.mu.Lock()
	if c.byName == nil {
		c.byName = map[string]*pendingTools{}
	}
	pt := c.byName[name]
	if pt == nil {
		pt = &pendingTools{}
		c.byName[name] = pt
	}
	pt.seq++
	seq, now := pt.seq, time.Now()
	switch {
	case c.stopped:
		c.mu.Unlock()
		return
	case pt.waiting != nil:
		pt.tools = tools // the window's end applies the latest
		c.mu.Unlock()
		return
	case pt.last.IsZero() || now.Sub(pt.last) >= ToolChangeWindow:
		pt.last = now
		c.mu.Unlock()
		gw.applyTools(name, tools, seq)
		return
	}
	pt.tools = tools
	pt.waiting = time.AfterFunc(pt.last.Add(ToolChangeWindow).Sub(now), func() {
		c.mu.Lock()
		tools, seq := pt.tools, pt.seq
		pt.tools, pt.waiting, pt.last = nil, nil, time.Now()
		stopped := c.stopped
		c.mu.Unlock()
		if !stopped {
			gw.applyTools(name, tools, seq)
		}
	})
	c.mu.Unlock()
}

// stopToolChanges drops the tool lists still waiting (at shutdown).
func (gw *Gateway) stopToolChanges() {
	c := &gw.changes
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stopped = true
	for _, pt := range c.byName {
		if pt.waiting != nil {
			pt.waiting.Stop()
		}
	}
}

// applyTools maps an upstream's new tool list into the catalog,
// recompiles and mirrors the tools into the MCP server. seq orders the
// lists of one upstream; an older one than the last applied is ignored.
func (gw *Gateway) applyTools(name string, tools []*mcp.Tool, seq uint64) {
	gw.mu.Lock()
	defer gw.mu.Unlock()
	if seq <= gw.applied[name] {
		return
	}
	gw.applied[name] = seq
	var u *policy.Upstream
	for _, x := range gw.bundle.Upstreams {
		if x.Name == name {
			u = x
		}
	}
	if u == nil {
		return
	}
	accepted, problems := mcptool.Announced(u, tools)
	accepted, conflicts := authz.CheckAnnounced(gw.bundle, accepted)
	problems = append(problems, conflicts...)
	seen := map[string]bool{}
	for _, p := range problems {
		seen[p] = true
		if gw.problems[name][p] {
			continue // reported when it first appeared
		}
		gw.log.Warn("upstream tool refused", "upstream", name, "problem", p)
		gw.Gate.RecordEvent(audit.Event{EventType: string(toolgate.EventDefinitionChanged), Reason: p,
			Details: map[string]any{"upstream": name, "refused": true}})
	}
	// A later announcement takes effect only as strictly as the first: the
	// class an id ever claimed is kept (it can rise, never fall back).
	for i := range accepted {
		a := &accepted[i]
		if seen, ok := gw.claimed[a.ID]; ok && seen > a.SideEffectClass {
			a.SideEffectClass = seen
		}
		gw.claimed[a.ID] = a.SideEffectClass
	}
	gw.problems[name] = seen
	prev := gw.announced[name]
	gw.announced[name] = accepted
	if !sameAnnounced(prev, accepted) && prev != nil {
		gw.Gate.RecordEvent(audit.Event{EventType: string(toolgate.EventDefinitionChanged),
			Reason:  fmt.Sprintf("upstream %s changed its tool list (%d tools now)", name, len(accepted)),
			Details: map[string]any{"upstream": name}})
	}
	if err := gw.recompileLocked(gw.bundle, nil); err != nil {
		gw.log.Error("recompile after upstream change failed; the previous snapshot stays", "upstream", name, "err", err)
	}
	if gw.Proxy != nil {
		gw.Proxy.SetTools(u.Name, u.Prefix(), tools, accepted)
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
	// A ceiling entry below the class of the announced tool (at least
	// write without a Tool document: authz.AnnouncedClass) is what validate
	// refuses for a Tool document; here the tool's own, higher class
	// applies, and the operator is told.
	announced := map[string]toolgate.SideEffectClass{}
	for _, a := range gw.announced[name] {
		announced[a.ID] = authz.AnnouncedClass(a.SideEffectClass, 0, false)
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
				lower = append(lower, fmt.Sprintf("%s: %s declares %s, the tool is %s (an upstream tool without a Tool document is at least write)", a.AgentID, p.ToolID, c, own))
			}
		}
	}
	sort.Strings(lower)
	if len(lower) > 0 {
		gw.log.Warn("ceiling entries below the class the upstream announces: the tool's own class applies (add a Tool document to set it, or raise the entry)",
			"upstream", name, "entries", lower)
	}
}

// recompileLocked compiles b with the tools the upstreams announced and
// installs the snapshot, with creds (nil: the current credential table)
// in the same swap.
func (gw *Gateway) recompileLocked(b *policy.Bundle, creds gate.Credentials) error {
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
	gw.Gate.Install(snap, creds)
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
	var creds *identity.Table
	if err == nil {
		creds, err = gw.identities(b)
	}
	if err == nil {
		// The new policy and its credentials, in one swap.
		err = gw.recompileLocked(b, creds)
	}
	if err != nil {
		gw.log.Error("bundle rejected; the last good bundle stays", "err", err)
		gw.Gate.RecordEvent(bundleEvent(toolgate.EventBundleRejected, gw.cfg.BundleDir, "the bundle was refused: "+err.Error(), nil))
		gw.Metrics.BundleRejected()
		return err
	}
	gw.bundle = b
	gw.Proxy.SetBuiltins(gw.Builtins)
	if gw.Ups != nil {
		gw.Ups.SetMaxResultBytes(adapter.ReadLimit(resultCap(b)))
	}
	gw.Gate.RecordEvent(bundleEvent(toolgate.EventBundleLoaded, gw.cfg.BundleDir, "the bundle was reloaded", nil))
	gw.bundleGen++
	gw.Metrics.BundleLoaded(gw.bundleGen)
	gw.log.Info("bundle reloaded", "generation", gw.gen)
	return nil
}

// resultCap is the bundle's result cap in bytes (Settings.result_max_kib;
// 0 when unset, which adapter.ReadLimit reads as the default).
func resultCap(b *policy.Bundle) int {
	if len(b.Settings) == 0 {
		return 0
	}
	return b.Settings[0].ResultMaxKiB * 1024
}

// Generation counts successful compilations.
func (gw *Gateway) Generation() int {
	gw.mu.Lock()
	defer gw.mu.Unlock()
	return gw.gen
}
