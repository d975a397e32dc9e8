// Package cniagent is tabbyd's CNI agent: it does the CNI plugins' IPAM
// work for them, as Cilium's agent does for its plugin. The plugin, a
// process started for every pod, would otherwise pay a TLS handshake and a
// handful of API round trips per command; tabbyd has warm connections and
// informer caches (package caches.go) and serves the plugins over a unix
// socket (protocol: package agentapi).
//
// Assignments and releases of the node are serialised by a mutex (the
// plugin needs no lock file then). Reads come from the caches, and stale
// reads are safe because every write is a compare-and-swap (ipam.Source).
// The IPAMHandle of an assignment from the node's own blocks is written
// shortly after the answer, once the ADD is likely done (recordDelay;
// ipam.AssignDeferred): until then the allocation
// is found through the blocks, which carry the handle, and the agent makes
// a release or CHECK of that handle wait for the write.
//
// It also answers policy-wait (Config.Policy, tabbyd's NetworkPolicy
// loop): the plugin's ADD waits there until the new pod's NetworkPolicy is
// in the kernel. Every block IPAM writes is handed to that loop at once
// (PolicyWaiter.ObserveBlock), so it programs a new pod while the plugin
// still wires it, rather than after the block's watch event.
package cniagent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	tabbyv1 "github.com/tabbynet/tabby/api/v1"
	"github.com/tabbynet/tabby/contract/agentapi"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/ipam"
	"github.com/tabbynet/tabby/ipam/ipamops"
)

// Config configures the agent.
type Config struct {
	// Socket is the unix socket to serve (agentapi.DefaultSocket).
	Socket   string
	NodeName string
	DS       *datastore.Client
	// Informers, when set, are the informers of IPPools, IPAMBlocks,
	// Nodes and Namespaces the agent shares with tabbyd's other components
	// (nil: its own, over DS).
	Informers *datastore.Informers
	Log       *slog.Logger
	// Registerer takes the agent's metrics (nil: none).
	Registerer prometheus.Registerer
	// Metrics, when set, are the agent's metrics instead of Registerer's.
	Metrics *Metrics
	// Policy answers policy-wait (package netpol's Controller); nil: this
	// tabbyd enforces no NetworkPolicy and policy-wait answers at once.
	Policy PolicyWaiter
	// Spares is how many addresses the agent holds ahead of the ADDs that
	// need them (spares.go); 0 holds none, and releases those held before.
	Spares int
}

// PolicyWaiter waits until a pod's NetworkPolicy is in the kernel.
type PolicyWaiter interface {
	// WaitProgrammed returns once a ruleset is applied that programs the
	// local pod namespace/name (with UID uid, when not "") with every
	// address of ips, with the number of its sync; or with an error
	// saying what is missing when ctx ends first.
	WaitProgrammed(ctx context.Context, namespace, name, uid string, ips []netip.Addr) (uint64, error)
	// ObserveBlock is told of every IPAMBlock version the agent's IPAM
	// wrote or read from the API server, as soon as it has it: a new
	// pod's allocation reaches the policy loop without waiting for its
	// watch (a version the loop's informer has caught up with is ignored).
	ObserveBlock(b *tabbyv1.IPAMBlock)
	// ObserveClaims is told of spare addresses handed to a pod before its
	// block records them (ipam.AddressClaim); ForgetClaims withdraws them
	// once the block does, or the pod was deleted first.
	ObserveClaims(cl []ipam.AddressClaim)
	ForgetClaims(cl []ipam.AddressClaim)
}

// Bounds of policy-wait on tabbyd's side.
const (
	// DefaultPolicyWait applies when the request names no timeout.
	DefaultPolicyWait = 30 * time.Second
	// MaxPolicyWait caps the timeout a request names.
	MaxPolicyWait = 5 * time.Minute
)

// Agent serves the CNI plugins' IPAM requests.
type Agent struct {
	cfg    Config
	log    *slog.Logger
	caches *Caches
	ipam   *ipam.IPAM
	ops    ipamops.Ops

	// mu serialises the node's assignments and releases, and the spares'
	// refills and transfers. Assignments (queue) and releases (releases)
	// queue while it is held; whoever takes it answers the queues.
	mu       sync.Mutex
	queueMu  sync.Mutex
	queue    []*assignCall
	releases []*releaseCall

	pendingMu sync.Mutex
	pending   map[string]*pendingRecord // by handle ID
	records   sync.WaitGroup

	otherNodes sync.Map // node names of refused requests for other nodes (warned once)

	// stopping ends when the agent shuts down: policy waits end with it
	// rather than hold tabbyd's exit for their whole bound. (IPAM requests
	// in flight are finished.) Set by Run before it serves.
	stopping context.Context

	// spares: addresses held ahead (nil: none).
	spares *spares
	// writeDelay is recordDelay (tests lengthen it).
	writeDelay time.Duration

	met metrics
}

// New makes an agent; Run serves it.
func New(cfg Config) (*Agent, error) {
	if cfg.Socket == "" || cfg.NodeName == "" || cfg.DS == nil {
		return nil, errors.New("cniagent: a socket, a node name and a datastore are needed")
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	a := &Agent{cfg: cfg, log: cfg.Log.With("component", "cni-agent"), pending: map[string]*pendingRecord{}, met: newMetrics(), writeDelay: recordDelay}
	var err error
	if a.caches, err = NewCaches(cfg.DS, cfg.Informers, cfg.NodeName); err != nil {
		return nil, err
	}
	a.caches.podLookup = func(source string) { a.met.podLookups.WithLabelValues(source).Inc() }
	if cfg.Policy != nil {
		a.caches.onBlock = cfg.Policy.ObserveBlock
	}
	a.ipam = ipam.New(cfg.DS, ipam.WithLogger(a.log), ipam.WithSource(a.caches))
	a.ops = ipamops.Ops{DS: cfg.DS, IPAM: a.ipam}
	if cfg.Spares > 0 {
		a.spares = &spares{want: cfg.Spares, path: JournalPath(cfg.Socket), handed: map[string]handover{}}
	}
	if cfg.Metrics != nil {
		a.met = cfg.Metrics.m
	} else if cfg.Registerer != nil {
		if err := a.met.register(cfg.Registerer); err != nil {
			return nil, fmt.Errorf("cniagent: registering metrics: %w", err)
		}
	}
	return a, nil
}

// Run syncs the caches, then serves the socket until ctx ends; the socket
// exists only while the agent can answer (before, plugins fall back to the
// API server). On the way out it finishes the requests in flight and the
// handle writes, and removes the socket.
func (a *Agent) Run(ctx context.Context) error {
	if err := prepareSocket(a.cfg.Socket); err != nil {
		return err
	}
	start := time.Now()
	if err := a.caches.Run(ctx); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	a.stopping = ctx
	// Before the first answer: the handovers a restart interrupted.
	for backoff := 100 * time.Millisecond; ; backoff = min(2*backoff, 5*time.Second) {
		err := a.recoverSpares(ctx)
		if err == nil {
			break
		}
		a.log.Warn("recovering the spare addresses; retrying", "error", err)
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			a.records.Wait()
			return nil
		}
	}
	ln, err := listen(a.cfg.Socket)
	if err != nil {
		a.records.Wait()
		return err
	}
	srv := &http.Server{Handler: a.Handler(), ReadHeaderTimeout: 5 * time.Second, IdleTimeout: time.Minute}
	done := make(chan struct{})
	go func() {
		defer close(done)
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	a.log.Info("serving the CNI plugins", "socket", a.cfg.Socket, "node", a.cfg.NodeName, "cacheSync", time.Since(start).Round(time.Millisecond).String())
	err = srv.Serve(ln)
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	<-done
	a.records.Wait()
	return err
}

// prepareSocket makes the socket's folder and removes a stale socket: one
// that accepts no connection (its tabbyd is gone). A socket that another
// live process serves is left alone and refused.
func prepareSocket(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("cniagent: creating the folder of %s: %w", path, err)
	}
	if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
		_ = c.Close()
		return fmt.Errorf("cniagent: another process (another tabbyd?) serves %s: give each tabbyd its own --cni-socket, and the CNI config the same agentSocket", path)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("cniagent: removing the stale socket %s: %w", path, err)
	}
	return nil
}

// listen creates the socket, readable and writable by its owner only.
func listen(path string) (net.Listener, error) {
	if err := prepareSocket(path); err != nil {
		return nil, err
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("cniagent: listening on %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		_ = ln.Close()
		return nil, fmt.Errorf("cniagent: restricting %s to its owner: %w", path, err)
	}
	return ln, nil
}

// Handler serves the endpoints of agentapi.
func (a *Agent) Handler() http.Handler {
	mux := http.NewServeMux()
	endpoint(mux, a, agentapi.EndpointAssign, a.assign)
	endpoint(mux, a, agentapi.EndpointRelease, a.release)
	endpoint(mux, a, agentapi.EndpointHandleIPs, a.handleIPs)
	endpoint(mux, a, agentapi.EndpointNodeHandles, a.nodeHandles)
	endpoint(mux, a, agentapi.EndpointPools, a.usablePools)
	endpoint(mux, a, agentapi.EndpointPing, a.ping)
	endpoint(mux, a, agentapi.EndpointPolicyWait, a.policyWait)
	endpoint(mux, a, agentapi.EndpointReport, a.report)
	return mux
}

// endpoint serves one JSON endpoint and counts it.
func endpoint[Req, Resp any](mux *http.ServeMux, a *Agent, name string, f func(context.Context, Req) (Resp, error)) {
	mux.HandleFunc("POST "+agentapi.Path+name, func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		var req Req
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 1<<20))
		if err == nil {
			err = json.Unmarshal(body, &req)
		}
		var resp Resp
		if err != nil {
			err = &agentapi.Error{Message: fmt.Sprintf("tabbyd: a malformed %s request: %v", name, err), Invalid: true}
		} else {
			resp, err = f(r.Context(), req)
		}
		a.met.duration.WithLabelValues(name).Observe(time.Since(start).Seconds())
		w.Header().Set("Content-Type", "application/json")
		if err != nil {
			e := ipamops.Classify(err)
			a.met.requests.WithLabelValues(name, "error").Inc()
			status := http.StatusInternalServerError
			switch {
			case e.Unreachable:
				status = http.StatusServiceUnavailable
			case e.Exhausted:
				status = http.StatusConflict
			case e.Forbidden:
				status = http.StatusForbidden
			case e.Invalid:
				status = http.StatusBadRequest
			}
			a.log.Debug("request failed", "endpoint", name, "error", e.Message)
			w.WriteHeader(status)
			_ = json.NewEncoder(w).Encode(e)
			return
		}
		a.met.requests.WithLabelValues(name, "ok").Inc()
		_ = json.NewEncoder(w).Encode(resp)
	})
}

// report records the duration of a plugin's command. Anything but the
// known commands and results is refused, so that a client cannot grow the
// histogram's label sets.
func (a *Agent) report(_ context.Context, r agentapi.CommandReport) (agentapi.Empty, error) {
	if r.Command != agentapi.CommandAdd && r.Command != agentapi.CommandDel {
		return agentapi.Empty{}, &agentapi.Error{Message: fmt.Sprintf("tabbyd: a report of command %q: only %s and %s are counted", r.Command, agentapi.CommandAdd, agentapi.CommandDel), Invalid: true}
	}
	if r.Result != agentapi.ResultOK && r.Result != agentapi.ResultError {
		return agentapi.Empty{}, &agentapi.Error{Message: fmt.Sprintf("tabbyd: a report with result %q: want %s or %s", r.Result, agentapi.ResultOK, agentapi.ResultError), Invalid: true}
	}
	if r.Seconds < 0 {
		return agentapi.Empty{}, &agentapi.Error{Message: fmt.Sprintf("tabbyd: a report of %s lasting %v seconds: want a duration of 0 or more", r.Command, r.Seconds), Invalid: true}
	}
	a.met.commands.WithLabelValues(r.Command, r.Result).Observe(r.Seconds)
	return agentapi.Empty{}, nil
}

// checkNode refuses a request that names another node than this tabbyd's
// (or none): each node's agent serves only its own node's plugins, so a
// plugin on one node (or anything else that reaches the socket) cannot
// take or free addresses in another node's blocks through it. It means a
// CNI config whose nodename, or whose agentSocket, is another node's.
// Warned once per node name.
func (a *Agent) checkNode(node string) error {
	if node == a.cfg.NodeName {
		return nil
	}
	a.met.otherNode.Inc()
	if _, seen := a.otherNodes.LoadOrStore(node, true); !seen {
		a.log.Warn("refused a CNI request for another node: its CNI config's nodename or agentSocket is wrong", "node", node, "this", a.cfg.NodeName, "socket", a.cfg.Socket)
	}
	return &agentapi.Error{Forbidden: true, Message: fmt.Sprintf(
		"tabbyd: the CNI agent at %s serves node %q only, and the request names node %q: set the CNI config's \"nodename\" to this node's name (as kubectl get nodes shows it), or point \"agentSocket\" at this node's tabbyd", a.cfg.Socket, a.cfg.NodeName, node)}
}

func (a *Agent) assign(ctx context.Context, r agentapi.AssignRequest) (agentapi.AssignResponse, error) {
	if err := a.checkNode(r.Node); err != nil {
		return agentapi.AssignResponse{}, err
	}
	ops := a.ops
	ops.Pods = a.caches.ForPod(r.PodUID)
	// The annotations are read before the lock: only the assignment itself
	// is serialised.
	req, err := ops.Request(ctx, r)
	if err != nil {
		return agentapi.AssignResponse{}, err
	}
	a.awaitRecord(ctx, r.HandleID)
	if as, ok := a.handOut(ctx, req); ok {
		return agentapi.AssignResponse{Addresses: ipamops.Addresses(as)}, nil
	}
	o := a.assignQueued(ctx, req)
	if errors.Is(o.err, ipam.ErrExhausted) && a.dropSpares(ctx) {
		// The addresses held ahead may be what the pools lack.
		o = a.assignQueued(ctx, req)
	}
	if plainRequest(req) {
		a.refill()
	}
	if o.err != nil {
		return agentapi.AssignResponse{}, o.err
	}
	return agentapi.AssignResponse{Addresses: ipamops.Addresses(o.assigned)}, nil
}

// assignQueued assigns req with the node's other assignments (mu).
func (a *Agent) assignQueued(ctx context.Context, req ipam.Request) assignOutcome {
	call := &assignCall{ctx: ctx, req: req, done: make(chan assignOutcome, 1)}
	drain(a, &a.queue, call, a.assignBatch)
	return <-call.done
}

// assignCall is an assignment waiting for mu.
type assignCall struct {
	ctx  context.Context
	req  ipam.Request
	done chan assignOutcome
}

type assignOutcome struct {
	assigned []ipam.Assigned
	err      error
}

// assignBatch answers the assignments that queued while mu was held: one
// alone as it asks, several at once with ipam.AssignDeferredBatch, which
// gives those one block can serve their addresses in a single write (a
// burst of pods on the node). Called with mu held. A request that failed,
// or whose caller went away meanwhile, has its handle released: Assign
// undoes what it did, but a cancelled write's outcome is unknown.
func (a *Agent) assignBatch(batch []*assignCall) {
	var outs []ipam.Deferred
	if len(batch) == 1 {
		var d ipam.Deferred
		d.Assigned, d.Record, d.Err = a.ipam.AssignDeferred(batch[0].ctx, batch[0].req)
		outs = []ipam.Deferred{d}
	} else {
		// The batch is not any one caller's: it runs to the end even
		// when one of them goes away.
		ctx, cancel := context.WithTimeout(context.Background(), datastore.Timeout)
		reqs := make([]ipam.Request, len(batch))
		for i, c := range batch {
			reqs[i] = c.req
		}
		outs = a.ipam.AssignDeferredBatch(ctx, reqs)
		cancel()
	}
	a.met.assignBatch.Observe(float64(len(batch)))
	for i, c := range batch {
		d := outs[i]
		if d.Err == nil && c.ctx.Err() != nil {
			d.Err = c.ctx.Err()
		}
		if d.Err != nil {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(c.ctx), datastore.Timeout)
			if rerr := a.ipam.ReleaseHandle(cctx, c.req.HandleID, c.req.Node); rerr != nil {
				a.log.Warn("releasing the handle after a failed assignment", "handle", c.req.HandleID, "error", rerr)
			}
			cancel()
			c.done <- assignOutcome{err: d.Err}
			continue
		}
		if d.Record != nil {
			a.recordAfter(c.req.HandleID, a.writeDelay, d.Record, nil)
		}
		c.done <- assignOutcome{assigned: d.Assigned}
	}
}

// recordDelay is how long after answering an assignment the agent waits
// before it writes the handle. Nothing needs the handle object sooner (the
// blocks carry the handle), and the write is the API server's and
// tabbyd's work: on a node whose CPUs are busy while the plugin wires the
// pod (2 cores: the plugin, tabbyd, the API server), writing it at once
// made every ADD about 2 ms slower. A release or CHECK of the handle, and
// tabbyd's shutdown, have it written at once.
const recordDelay = 50 * time.Millisecond

// pendingRecord is a write under way after an answer (a handle's record,
// a spare's transfer): done is closed once it is written (or failed), and
// closing now (once) writes it without waiting out its delay. A record
// with onCancel may be called off before it starts (cancelRecord).
type pendingRecord struct {
	done    chan struct{}
	now     chan struct{}
	nowOnce sync.Once

	onCancel           func()
	mu                 sync.Mutex
	started, cancelled bool
}

// recordAfter writes a record delay after the answer goes out (the
// handle's, after an assignment: recordDelay). An assignment calls it with
// mu held, so that a release of the same handle waits for it; a spare's
// handover before it answers.
func (a *Agent) recordAfter(handleID string, delay time.Duration, record func(context.Context) error, onCancel func()) {
	p := &pendingRecord{done: make(chan struct{}), now: make(chan struct{}), onCancel: onCancel}
	a.pendingMu.Lock()
	a.pending[handleID] = p
	a.pendingMu.Unlock()
	a.records.Add(1)
	stopping := a.stopping
	if stopping == nil {
		stopping = context.Background()
	}
	go func() {
		defer a.records.Done()
		defer func() {
			a.pendingMu.Lock()
			if a.pending[handleID] == p {
				delete(a.pending, handleID)
			}
			a.pendingMu.Unlock()
			close(p.done)
		}()
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-p.now:
		case <-stopping.Done():
		}
		t.Stop()
		p.mu.Lock()
		cancelled := p.cancelled
		p.started = !cancelled
		p.mu.Unlock()
		if cancelled {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), datastore.Timeout)
		defer cancel()
		if err := record(ctx); err != nil {
			// A handle's record: the blocks still carry the handle, and
			// DEL and GC find the addresses without it. A spare's
			// transfer: the journal keeps it for the restart.
			a.met.records.WithLabelValues("error").Inc()
			a.log.Warn("writing an IPAM record after the answer (the blocks or the spares journal keep what it would say)", "handle", handleID, "error", err)
			return
		}
		a.met.records.WithLabelValues("ok").Inc()
	}()
}

// cancelRecord calls off the handle's pending record if it may be called
// off and has not started, and reports whether it did.
func (a *Agent) cancelRecord(handleID string) bool {
	a.pendingMu.Lock()
	p := a.pending[handleID]
	a.pendingMu.Unlock()
	if p == nil || p.onCancel == nil {
		return false
	}
	p.mu.Lock()
	ok := !p.started && !p.cancelled
	p.cancelled = true
	p.mu.Unlock()
	if !ok {
		return false
	}
	p.nowOnce.Do(func() { close(p.now) })
	<-p.done
	p.onCancel()
	return true
}

// awaitRecord has the handle's pending write (if any) done now, and waits
// for it.
func (a *Agent) awaitRecord(ctx context.Context, handleID string) {
	a.pendingMu.Lock()
	p := a.pending[handleID]
	a.pendingMu.Unlock()
	if p == nil {
		return
	}
	p.nowOnce.Do(func() { close(p.now) })
	select {
	case <-p.done:
	case <-ctx.Done():
	}
}

func (a *Agent) release(ctx context.Context, r agentapi.HandleRequest) (agentapi.Empty, error) {
	if err := a.checkNode(r.Node); err != nil {
		return agentapi.Empty{}, err
	}
	if a.cancelRecord(r.HandleID) && !a.holdsMore(ctx, r.HandleID) {
		// A spare handed over moments ago, back among the spares: the
		// blocks never recorded it as the pod's.
		return agentapi.Empty{}, nil
	}
	a.awaitRecord(ctx, r.HandleID)
	call := &releaseCall{ctx: ctx, handleID: r.HandleID, done: make(chan error, 1)}
	drain(a, &a.releases, call, a.releaseBatch)
	return agentapi.Empty{}, <-call.done
}

// drain queues call on q, then takes mu and answers with run everything
// queued there. When it returns, call has been answered: in this batch or
// in one that an earlier holder of mu took, and answered before it let mu
// go.
func drain[T any](a *Agent, q *[]T, call T, run func([]T)) {
	a.queueMu.Lock()
	*q = append(*q, call)
	a.queueMu.Unlock()
	a.mu.Lock()
	defer a.mu.Unlock()
	a.queueMu.Lock()
	batch := *q
	*q = nil
	a.queueMu.Unlock()
	if len(batch) > 0 {
		run(batch)
	}
}

// releaseCall is a release waiting for mu.
type releaseCall struct {
	ctx      context.Context
	handleID string
	done     chan error
}

// releaseBatch answers the releases that queued while mu was held: one
// alone as it asks, several at once with ipam.ReleaseHandles, which frees
// what they hold in one block in a single write (a burst of pods deleted
// on the node: one by one, each release's block write waited for the one
// before). Called with mu held.
func (a *Agent) releaseBatch(batch []*releaseCall) {
	a.met.releaseBatch.Observe(float64(len(batch)))
	if len(batch) == 1 {
		c := batch[0]
		c.done <- a.ops.ReleaseHandle(c.ctx, c.handleID, a.cfg.NodeName)
		return
	}
	// The batch is not any one caller's: it runs to the end even when
	// one of them goes away.
	ctx, cancel := context.WithTimeout(context.Background(), datastore.Timeout)
	defer cancel()
	ids := make([]string, len(batch))
	for i, c := range batch {
		ids[i] = c.handleID
	}
	for i, err := range a.ipam.ReleaseHandles(ctx, ids, a.cfg.NodeName) {
		batch[i].done <- err
	}
}

// holdsMore says whether a handle holds anything as far as the caches know
// (a handle object, or an allocation in the node's blocks).
func (a *Agent) holdsMore(ctx context.Context, handleID string) bool {
	if h, err := a.caches.Handle(ctx, ipam.HandleObjectName(handleID)); err != nil || h != nil {
		return true
	}
	blocks, err := a.caches.NodeBlocks(ctx, a.cfg.NodeName)
	if err != nil {
		return true
	}
	for _, b := range blocks {
		if ipam.BlockHolds(b, handleID) {
			return true
		}
	}
	return false
}

func (a *Agent) handleIPs(ctx context.Context, r agentapi.HandleRequest) (agentapi.HandleIPsResponse, error) {
	if err := a.checkNode(r.Node); err != nil {
		return agentapi.HandleIPsResponse{}, err
	}
	a.awaitRecord(ctx, r.HandleID)
	ips, err := a.ops.HandleIPs(ctx, r.HandleID, r.Node)
	return agentapi.HandleIPsResponse{IPs: ips}, err
}

func (a *Agent) nodeHandles(ctx context.Context, r agentapi.NodeRequest) (agentapi.NodeHandlesResponse, error) {
	if err := a.checkNode(r.Node); err != nil {
		return agentapi.NodeHandlesResponse{}, err
	}
	hs, err := a.ops.NodeHandles(ctx, r.Node)
	if err != nil {
		return agentapi.NodeHandlesResponse{}, err
	}
	// The pods answered from spares whose blocks do not record them yet.
	return agentapi.NodeHandlesResponse{Handles: a.withHandovers(hs)}, nil
}

func (a *Agent) usablePools(ctx context.Context, r agentapi.NodeRequest) (agentapi.PoolsResponse, error) {
	if err := a.checkNode(r.Node); err != nil {
		return agentapi.PoolsResponse{}, err
	}
	ps, err := a.ops.UsablePools(ctx, r.Node)
	return agentapi.PoolsResponse{Pools: ps}, err
}

func (a *Agent) ping(ctx context.Context, _ agentapi.Empty) (agentapi.Empty, error) {
	return agentapi.Empty{}, a.ops.Ping(ctx)
}

func (a *Agent) policyWait(ctx context.Context, r agentapi.PolicyWaitRequest) (agentapi.PolicyWaitResponse, error) {
	if a.cfg.Policy == nil {
		return agentapi.PolicyWaitResponse{Enforced: false}, nil
	}
	if r.Namespace == "" || r.Pod == "" || len(r.IPs) == 0 {
		return agentapi.PolicyWaitResponse{}, &agentapi.Error{Message: "tabbyd: a policy-wait request needs the pod's namespace, name and addresses"}
	}
	ips := make([]netip.Addr, 0, len(r.IPs))
	for _, ip := range r.IPs {
		addr, ok := netip.AddrFromSlice(ip)
		if !ok {
			return agentapi.PolicyWaitResponse{}, &agentapi.Error{Message: fmt.Sprintf("tabbyd: policy-wait: %q is not an IP address", ip)}
		}
		ips = append(ips, addr.Unmap())
	}
	bound := DefaultPolicyWait
	if r.TimeoutMillis > 0 {
		bound = min(time.Duration(r.TimeoutMillis)*time.Millisecond, MaxPolicyWait)
	}
	ctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	if a.stopping != nil {
		defer context.AfterFunc(a.stopping, cancel)()
	}
	gen, err := a.cfg.Policy.WaitProgrammed(ctx, r.Namespace, r.Pod, r.PodUID, ips)
	if err != nil && a.stopping != nil && a.stopping.Err() != nil {
		return agentapi.PolicyWaitResponse{}, &agentapi.Error{Message: fmt.Sprintf("tabbyd on this node is shutting down before the policy of pod %s/%s was confirmed; the runtime retries the ADD", r.Namespace, r.Pod)}
	}
	if err != nil {
		// A wait that ran out is not an unreachable API server: the
		// message says what is missing.
		return agentapi.PolicyWaitResponse{}, &agentapi.Error{Message: err.Error()}
	}
	return agentapi.PolicyWaitResponse{Enforced: true, Generation: gen}, nil
}
