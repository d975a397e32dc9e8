package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	tabbyv1 "github.com/tabbynet/tabby/api/v1"
	"github.com/tabbynet/tabby/bgp"
	"github.com/tabbynet/tabby/contract"
	"github.com/tabbynet/tabby/daemon/nodestatus"
	"github.com/tabbynet/tabby/daemon/routing"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/datastore/events"
	"github.com/tabbynet/tabby/internal/loop"
	"github.com/tabbynet/tabby/ipam"
)

// Defaults of the routing loop.
const (
	// DefaultNamespace is where tabbyd runs and reads BGP passwords from.
	DefaultNamespace = contract.DefaultNamespace
	// DefaultResync is how often the loop reconciles without an event.
	DefaultResync = 30 * time.Second
	// minReconcileGap spaces reconciles under a storm of events: what
	// arrives meanwhile is coalesced into the next one.
	minReconcileGap = 20 * time.Millisecond
	// reconcileBurst reconciles may run back to back after a quiet
	// spell (loop.Config.Burst): a claimed block's route arriving a
	// millisecond after the block is not held for minReconcileGap.
	reconcileBurst = 3
	// retryAfter is when a reconcile that failed part-way runs again.
	retryAfter = 2 * time.Second
)

// routerConfig configures the routing loop.
type routerConfig struct {
	Node string
	// NodeIPs are --node-ip: at most one address per family; the
	// families not given are detected.
	NodeIPs []netip.Addr
	// Namespace holds the Secrets of BGP passwords.
	Namespace string
	// Resync and StartupHold: see DefaultResync and DefaultStartupHold.
	Resync      time.Duration
	StartupHold time.Duration
	// Transition tunes BGP's make-before-break.
	Transition bgp.TransitionOptions
	DS         *datastore.Client
	// Informers, when set, are the informers the loop shares with
	// tabbyd's other components (nil: its own).
	Informers  *datastore.Informers
	Log        *slog.Logger
	Registerer prometheus.Registerer
	// Metrics, when set, are the loop's metrics instead of Registerer's.
	Metrics *routingMetrics
	// Recorder, when set, records Events on the node (a family its pods
	// use and it has no address of).
	Recorder events.Recorder
}

// router is tabbyd's routing loop: it registers the node's routing
// identity, and on every change (and periodically) computes the BGP
// sessions, the advertisements and the routes from the caches and the
// speaker's table, then converges the speaker and the kernel to them.
type router struct {
	cfg     routerConfig
	log     *slog.Logger
	caches  *caches
	applier *routing.Applier // all but NAT outgoing, which is nat's
	nat     *natWorker
	vxlan   *tunnel
	ipip    *tunnel
	metrics *routingMetrics
	loop    *loop.Loop

	// Owned by the loop goroutine.
	addr4, addr6 netip.Prefix
	why4, why6   string // why detection found no address of the family
	recorded     string // the family problems last recorded as Events
	speaker      *bgp.Speaker
	speakerKey   string // AS, router ID and port the speaker runs with
	firstStart   bool   // the speaker has not started yet
	restarted    bool   // the previous run left routes in the kernel
	kept         []routing.Route
	holdUntil    time.Time
	holding      bool
	restartNote  string
	lastProblems string
	// lastLearned: what the last pass read from BGP (debug level only).
	lastLearned map[netip.Prefix]bgp.LearnedRoute
	// plan is what the last planSessions computed (see reusablePlan).
	plan *plan
	// statesDue is when a pass that published the sessions' route
	// counts from an earlier read (bgp.Speaker.RecentPeerStates) has
	// another pass come, to publish them new.
	statesDue time.Time
	// applied is the state the last Apply programmed without an error,
	// at appliedAt (nil after a failure).
	applied          *routing.State
	appliedAt        time.Time
	appliedConflicts []string
	lastApply        nodestatus.Apply
	conditionSet     bool
	// beating: the node's heartbeat Lease was renewed in this run.
	beating atomic.Bool
	// poolsPending: the default pools (--default-ipv4-pool-cidr, ...)
	// not yet known to be there, or one of their family.
	poolsPending atomic.Int32

	mu       sync.Mutex
	status   nodestatus.Status
	notReady []string
	live     *bgp.Speaker
}

func newRouter(cfg routerConfig) *router {
	if cfg.Namespace == "" {
		cfg.Namespace = DefaultNamespace
	}
	if cfg.Resync <= 0 {
		cfg.Resync = DefaultResync
	}
	if cfg.StartupHold <= 0 {
		cfg.StartupHold = DefaultStartupHold
	}
	if cfg.Metrics == nil {
		cfg.Metrics = newRoutingMetrics(cfg.Registerer)
	}
	r := &router{
		cfg:        cfg,
		log:        cfg.Log.With("loop", "routing"),
		applier:    routing.NewApplier(routing.Options{Log: cfg.Log.With("loop", "routing")}),
		metrics:    cfg.Metrics,
		firstStart: true,
	}
	r.nat = newNATWorker(cfg.Log.With("loop", "nat-outgoing"), cfg.Metrics, cfg.Resync, r.markDirty)
	// A reconcile that failed part-way runs again after retryAfter, however
	// often it failed: the failures are on /readyz meanwhile.
	r.loop = loop.New(loop.Config{
		Pass:    r.reconcile,
		MinGap:  minReconcileGap,
		Burst:   reconcileBurst,
		Resync:  cfg.Resync,
		Backoff: loop.Backoff{Min: retryAfter, Max: retryAfter},
		Wake:    r.speakerChanges,
	})
	m := ipam.New(cfg.DS, ipam.WithLogger(cfg.Log))
	r.vxlan = &tunnel{kind: "vxlan", node: cfg.Node, m: m}
	r.ipip = &tunnel{kind: "ipip", node: cfg.Node, m: m}
	r.caches = newCaches(cfg.DS, cfg.Informers, r.markDirty)
	r.status = nodestatus.Status{Node: cfg.Node}
	r.notReady = []string{"the routing caches have not synced with the API server yet"}
	return r
}

// markDirty asks the loop for a reconcile.
func (r *router) markDirty() { r.loop.Trigger() }

// speakerChanges wakes the loop when BGP's table changes (nil before the
// speaker runs).
func (r *router) speakerChanges() <-chan struct{} {
	if r.speaker == nil {
		return nil
	}
	return r.speaker.Changes()
}

// run runs the loop until ctx ends. It returns only then: problems are
// logged, shown on /readyz and /status, and retried. The speaker is not
// stopped: a tabbyd that exits is restarting, and its peers keep its
// routes meanwhile (graceful restart).
func (r *router) run(ctx context.Context) {
	if err := r.caches.run(ctx); err != nil {
		return
	}
	r.setNotReady("this node's address is not known yet")
	for {
		na, err := nodeAddresses(r.cfg.NodeIPs, r.cfg.DS.Host())
		if err == nil {
			r.addr4, r.addr6, r.why4, r.why6 = na.v4, na.v6, na.problem4, na.problem6
			r.log.Info("node addresses", "ipv4", prefixString(na.v4), "ipv4From", na.how4, "ipv6", prefixString(na.v6), "ipv6From", na.how6)
			if na.problem4 != "" {
				r.log.Info("no IPv4 node address", "why", na.problem4)
			}
			if na.problem6 != "" {
				r.log.Info("no IPv6 node address", "why", na.problem6)
			}
			break
		}
		r.setNotReady(err.Error())
		r.log.Error("finding this node's address", "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(5 * time.Second):
		}
	}
	kept, err := kernelRoutes()
	if err != nil {
		r.log.Warn("reading the routes a previous run left", "err", err)
	}
	if len(kept) > 0 {
		r.restarted, r.kept, r.holding = true, kept, true
		r.holdUntil = time.Now().Add(r.cfg.StartupHold)
		time.AfterFunc(r.cfg.StartupHold, r.markDirty) // the bound, should nothing else happen then
		r.log.Info("restarting: the previous run's routes are kept until BGP has converged", "routes", len(kept), "atMost", r.cfg.StartupHold)
	}
	natDone := make(chan struct{})
	go func() {
		defer close(natDone)
		r.nat.run(ctx)
	}()
	_ = r.loop.Run(ctx)
	<-natDone // a NAT pass under way ends before tabbyd does
}

func (r *router) setNotReady(why ...string) {
	r.mu.Lock()
	r.notReady = why
	r.mu.Unlock()
}

// reconcile computes everything from the caches and the speaker's table,
// and converges the node's identity, the speaker and the kernel to it. Its
// error asks the loop to retry.
func (r *router) reconcile(ctx context.Context) error {
	start := time.Now()
	res := r.reconcileOnce(ctx)
	d := time.Since(start)
	r.metrics.reconcileTime.Observe(d.Seconds())
	result := "ok"
	if res.retry {
		result = "error"
	}
	r.metrics.reconciles.WithLabelValues(result).Inc()
	if problems := strings.Join(res.problems, "\n"); problems != r.lastProblems {
		for _, p := range res.problems {
			r.log.Warn("routing", "problem", p)
		}
		r.lastProblems = problems
	}
	if res.retry {
		return errRetry
	}
	return nil
}

// errNotApplied: apply without heal had nothing but routes to leave to
// the full Apply.
var errNotApplied = errors.New("left to the full Apply")

// errRetry is a reconcile that failed part-way (its problems are logged
// and on /readyz already).
var errRetry = errors.New("the reconcile failed part-way")

// outcome is what one reconcile ran into.
type outcome struct {
	problems []string
	retry    bool
}

func (o *outcome) problem(retry bool, format string, args ...any) {
	o.problems = append(o.problems, fmt.Sprintf(format, args...))
	o.retry = o.retry || retry
}

// pass is one reconcile's inputs and what its steps computed, handed from
// step to step.
type pass struct {
	snap     snapshot
	self     *corev1.Node
	out      outcome
	notReady []string

	info     routing.NodeInfo // 1: this node's routing identity
	families []familyProblem  // families its pods use and it lacks
	selfBGP  bgp.Node         // 2: this node as BGP sees it
	as       uint32
	nodes    []bgp.Node         // 4: the other nodes
	peers    []routing.NodeInfo // their routing identities
	desired  []bgp.Peer         // the sessions
	filters  *bgp.Filters       // the route filters
	adverts  []bgp.Route        // 3: what this node advertises
	learned  []bgp.LearnedRoute // 5: what BGP learned
	learnedV uint64             // the speaker's LearnedVersion before learned was read
	states   []bgp.PeerState    // the sessions' states
	stale    int                // learned routes kept stale by graceful restart
	refused  []string           // why learned routes are not installed
	state    routing.State      // what the kernel gets
	nKept    int                // routes of the previous run still kept
	restart  string             // the restart's note
	debug    bool               // the log takes debug lines
	steps    []string           // debug: how long the slow steps took
}

// step notes, at debug level, how long a step of the pass took.
func (p *pass) step(name string, since time.Time) {
	if !p.debug {
		return
	}
	p.steps = append(p.steps, name+"="+time.Since(since).Round(time.Microsecond).String())
}

func (r *router) reconcileOnce(ctx context.Context) outcome {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	p := &pass{snap: r.caches.snapshot(), debug: r.log.Enabled(ctx, slog.LevelDebug)}
	p.self = p.snap.node(r.cfg.Node)
	if p.self == nil {
		why := fmt.Sprintf("the Node %s does not exist (yet): the kubelet registers it", r.cfg.Node)
		r.setNotReady(why)
		p.out.problem(true, "%s", why)
		return p.out
	}
	r.publishIdentity(ctx, p)
	r.checkFamilies(p)
	if err := r.startSpeaker(ctx, p); err != nil {
		p.out.problem(true, "%v", err)
		r.setNotReady(err.Error())
		return p.out
	}
	// This node's routes first: a block it just claimed goes out before
	// the filters and sessions are converged (the claim changes every
	// node's filters, and that work would otherwise delay the route).
	t0 := time.Now()
	r.advertise(ctx, p)
	t1 := time.Now()
	r.planSessions(ctx, p)
	r.earlyRoutes(ctx, p)
	t2 := time.Now()
	holding := r.holding
	r.configureSessions(ctx, p)
	t3 := time.Now()
	r.programKernel(ctx, p)
	t4 := time.Now()
	if !holding {
		r.readStates(ctx, p, true)
	}
	t5 := time.Now()
	r.report(p)
	r.log.Debug("routing pass", "advertise", t1.Sub(t0), "early", t2.Sub(t1), "sessions", t3.Sub(t2), "kernel", t4.Sub(t3), "states", t5.Sub(t4), "steps", p.steps)
	return p.out
}

// publishIdentity is step 1: the node's routing identity, published in
// its annotations.
func (r *router) publishIdentity(ctx context.Context, p *pass) {
	p.info = r.identity(ctx, &p.snap, p.self, &p.out)
	if changed, err := publish(ctx, r.cfg.DS, p.self, p.info); err != nil {
		p.out.problem(true, "%v", err)
		p.notReady = append(p.notReady, err.Error())
	} else if changed {
		r.log.Info("published this node's routing identity", "annotations", p.info.Annotations())
	}
}

// checkFamilies reports the address families this node's pods use and
// the node has no address of: on /status, in the log and as an Event on
// the Node, each time they change.
func (r *router) checkFamilies(p *pass) {
	p.families = missingFamilies(p.snap.pools, p.snap.blocks, p.self, r.addr4, r.addr6, r.why4, r.why6)
	var key strings.Builder
	for _, f := range p.families {
		key.WriteString(f.Reason + ": " + f.Message + "\n")
	}
	if key.String() == r.recorded {
		return
	}
	r.recorded = key.String()
	for _, f := range p.families {
		r.log.Warn("pods use an address family this node has no address of", "reason", f.Reason, "problem", f.Message)
		if r.cfg.Recorder != nil {
			r.cfg.Recorder.Event(p.self, corev1.EventTypeWarning, f.Reason, f.Message)
		}
	}
}

// startSpeaker is step 2: the speaker, with this node's AS and router ID.
func (r *router) startSpeaker(ctx context.Context, p *pass) error {
	settings := bgp.SettingsOf(p.snap.config)
	p.selfBGP = bgpNode(p.self, &p.out)
	p.selfBGP.IPv4, p.selfBGP.IPv6 = r.addr4, r.addr6
	p.as = settings.AS
	if p.selfBGP.AS != 0 {
		p.as = p.selfBGP.AS
	}
	return r.ensureSpeaker(ctx, p.as, bgp.RouterID(p.selfBGP), settings.ListenPort)
}

// planSessions is step 4: the sessions, their passwords and the route
// filters, computed (configureSessions hands them to the speaker).
func (r *router) planSessions(ctx context.Context, p *pass) {
	snap, out := &p.snap, &p.out
	if reusablePlan(r.plan, snap, p.selfBGP) {
		// The same inputs as the last pass's plan: the same objects,
		// which SetFilters and SetPeers find they have already.
		p.nodes, p.peers, p.desired, p.filters = r.plan.nodes, r.plan.peers, r.plan.desired, r.plan.filters
		for _, pr := range r.plan.problems {
			out.problem(false, "%s", pr)
		}
		return
	}
	before := len(out.problems)
	defer func() {
		r.plan = &plan{snap: snap.id, self: p.selfBGP, nodes: p.nodes, peers: p.peers, desired: p.desired, filters: p.filters,
			problems: slices.Clone(out.problems[before:])}
	}()
	p.nodes = make([]bgp.Node, 0, len(snap.nodes))
	p.peers = make([]routing.NodeInfo, 0, len(snap.nodes))
	for i := range snap.nodes {
		n := &snap.nodes[i]
		if n.Name == r.cfg.Node {
			continue
		}
		p.nodes = append(p.nodes, bgpNode(n, out))
		ni, err := routing.NodeInfoFromAnnotations(n.Name, n.Annotations)
		if err != nil {
			out.problem(false, "%v", err)
		}
		p.peers = append(p.peers, ni)
	}
	in := bgp.Inputs{Self: p.selfBGP, Nodes: p.nodes, Config: snap.config, BGPPeers: snap.peers, NoIPv6Pools: bgp.NoIPv6Pools(snap.pools)}
	if ref := snap.config.NodeMeshPassword; ref != nil {
		pw, err := r.secret(ctx, ref)
		if err != nil {
			out.problem(true, "the node-to-node mesh password: %v", err)
		}
		in.MeshPassword = pw
	}
	in.Passwords = r.passwords(ctx, snap, out)
	var errs []error
	p.desired, errs = bgp.DesiredPeers(in)
	for _, err := range errs {
		out.problem(false, "%v", err)
	}
	p.filters, errs = bgp.NewFilters(bgp.FilterInputs{Nodes: append([]bgp.Node{p.selfBGP}, p.nodes...), Pools: snap.pools,
		Blocks: snap.blocks, Config: snap.config, BGPPeers: snap.peers, BGPFilters: snap.filters})
	for _, err := range errs {
		out.problem(false, "%v", err)
	}
}

// plan is what planSessions computed from a snapshot and this node's BGP
// identity.
type plan struct {
	snap     uint64 // snapshot.id
	self     bgp.Node
	nodes    []bgp.Node
	peers    []routing.NodeInfo
	desired  []bgp.Peer
	filters  *bgp.Filters
	problems []string // what it reported (none asks for a retry)
}

// reusablePlan says whether last, the plan of an earlier pass, is what
// planSessions would compute from snap for self: it was computed from the
// same snapshot (a pass BGP asked for, see caches.snapshot) for the same
// identity, and no password is configured (passwords are read from their
// Secrets, not from the snapshot). Half the passes are of that kind, and
// recomputing the filters made the speaker compile and compare its GoBGP
// policies again for nothing.
func reusablePlan(last *plan, snap *snapshot, self bgp.Node) bool {
	if last == nil || last.snap != snap.id || snap.config.NodeMeshPassword != nil {
		return false
	}
	if slices.ContainsFunc(snap.peers, func(bp tabbyv1.BGPPeer) bool { return bp.Spec.Password != nil }) {
		return false
	}
	return reflect.DeepEqual(last.self, self)
}

// configureSessions is step 5: the speaker gets the sessions and route
// filters planSessions computed.
func (r *router) configureSessions(ctx context.Context, p *pass) {
	out := &p.out
	t := time.Now()
	if err := r.speaker.SetFilters(ctx, p.filters); err != nil {
		out.problem(true, "applying the BGP route filters: %v", err)
	}
	p.step("setFilters", t)
	t = time.Now()
	if err := r.speaker.SetPeers(ctx, p.desired); err != nil {
		out.problem(true, "configuring BGP sessions: %v", err)
	}
	p.step("setPeers", t)
}

// passwords reads the BGPPeers' passwords, by BGPPeer name.
func (r *router) passwords(ctx context.Context, snap *snapshot, out *outcome) map[string]string {
	pws := map[string]string{}
	for _, bp := range snap.peers {
		if bp.Spec.Password == nil {
			continue
		}
		pw, err := r.secret(ctx, bp.Spec.Password)
		if err != nil {
			out.problem(true, "the password of BGPPeer %s: %v", bp.Name, err)
			continue
		}
		pws[bp.Name] = pw
	}
	return pws
}

// advertise is step 3: the advertisements.
func (r *router) advertise(ctx context.Context, p *pass) {
	adverts, errs := bgp.Advertisements(bgp.AdvertInputs{Node: r.cfg.Node, IPv4: r.addr4.Addr(), IPv6: r.addr6.Addr(),
		Pools: p.snap.pools, Blocks: p.snap.blocks, Config: p.snap.config})
	for _, err := range errs {
		p.out.problem(false, "%v", err)
	}
	p.adverts = make([]bgp.Route, 0, len(adverts))
	for _, a := range adverts {
		p.adverts = append(p.adverts, a.Route)
	}
	if err := r.speaker.SetAdvertisements(ctx, p.adverts); err != nil {
		p.out.problem(true, "advertising routes: %v", err)
	}
}

// earlyRoutes programs the routes BGP has learned already, before the
// speaker gets the pass's filters and sessions (configureSessions): when a
// block is claimed every node's filters change, and on a busy node
// GoBGP's soft resets take long; a route the speaker accepted meanwhile
// (arrived after its filter knew the block) would wait for them, and for a
// full Apply the pass may be due. Only routes are programmed here, and
// only those the pass's filters accept (installable); anything else waits
// for programKernel. Not while a restart's kept routes wait on BGP.
func (r *router) earlyRoutes(ctx context.Context, p *pass) {
	if r.holding || r.applied == nil {
		return
	}
	t := time.Now()
	v := r.speaker.LearnedVersion()
	learned, err := r.speaker.Learned(ctx)
	p.step("earlyLearned", t)
	if err != nil {
		return // programKernel reads them again, and reports
	}
	p.learned, p.learnedV = learned, v
	r.desiredState(p)
	t = time.Now()
	if _, err := r.apply(p.state, false); err == nil {
		p.step("earlyApply", t)
	}
}

// desiredState works out p.state, what the kernel gets from p.learned:
// the routes the filters accept, through routing.Desired (p.refused says
// why others are not installed, p.stale counts the stale ones).
func (r *router) desiredState(p *pass) {
	nodeAddrs := map[netip.Addr]bool{}
	for _, n := range p.nodes {
		nodeAddrs[n.IPv4.Addr()], nodeAddrs[n.IPv6.Addr()] = true, true
	}
	var toInstall []routing.LearnedRoute
	toInstall, p.stale, p.refused = installable(p.learned, p.snap.pools, nodeAddrs, p.filters, p.desired)
	p.state = routing.Desired(routing.Inputs{Node: p.info, Pools: p.snap.pools, Blocks: r.ownBlocks(&p.snap), Learned: toInstall, Peers: p.peers})
}

// programKernel is step 6: what BGP learned, through routing.Desired,
// into the kernel. It reads what BGP learned again when earlyRoutes did
// not, or when that may have changed since: the speaker re-evaluated
// sessions or changed them (configureSessions), or GoBGP signalled a
// route meanwhile, which is then in the kernel a pass sooner.
func (r *router) programKernel(ctx context.Context, p *pass) {
	out := &p.out
	// The sessions' states are for the report: reconcileOnce reads them
	// after the routes are in, unless a restart's kept routes wait on
	// them. Then they are read here, first: a peer's End-of-RIB seen in
	// the states must come before the routes read, or the routes it sent
	// just before it would be missing from them while the kept routes are
	// dropped, and a route would leave the kernel until the next pass.
	holding := r.holding
	if holding {
		r.readStates(ctx, p, false)
	}
	// The state earlyRoutes worked out from them stands unless they are
	// read again. After the states, the routes are read anew: an
	// End-of-RIB in them may be ahead of the events of the routes sent
	// before it.
	if v := r.speaker.LearnedVersion(); p.learned == nil || v != p.learnedV || holding {
		var err error
		t := time.Now()
		p.learnedV = v
		learned := r.speaker.Learned
		if holding {
			learned = r.speaker.LearnedFresh
		}
		if p.learned, err = learned(ctx); err != nil {
			out.problem(true, "reading the routes BGP learned: %v", err)
		}
		p.step("learned", t)
		r.desiredState(p)
	}
	r.traceLearned(p)
	for _, why := range p.refused {
		out.problem(false, "%s", why)
	}
	for _, w := range p.state.Warnings {
		out.problem(false, "%s", w)
	}
	p.restart, p.nKept = r.holdKept(&p.state, p.desired, p.states)
	t := time.Now()
	stats, applyErr := r.apply(p.state, true)
	p.step("apply", t)
	if applyErr != nil {
		out.problem(true, "programming the kernel: %v", applyErr)
		p.notReady = append(p.notReady, "programming the kernel failed: "+applyErr.Error())
	} else if !r.conditionSet && r.beating.Load() && r.poolsPending.Load() == 0 {
		// After the heartbeat and the default pools: the scheduler
		// extender keeps pods off a node without a heartbeat, and off
		// every node while no pool of their family exists, and
		// kube-scheduler tries a pod it turned away again only on a
		// cluster event, such as this condition's change. Set before the
		// first heartbeat, it left such pods (CoreDNS in the lab) pending
		// until kube-scheduler's 5-minute flush; set before the default
		// pool, while admission still refused it, the same.
		r.conditionSet = setNetworkAvailable(ctx, r.cfg.DS, p.self, r.log)
	}
	for _, c := range stats.Conflicts {
		out.problem(false, "%s", c)
	}
	// NAT outgoing is the worker's: it retries on its own, and its
	// result changing brings a pass here.
	r.nat.set(p.state.NAT)
	programmed, natErr := r.nat.state()
	switch {
	case natErr != nil:
		out.problem(false, "programming NAT outgoing: %v", natErr)
		p.notReady = append(p.notReady, "programming NAT outgoing failed: "+natErr.Error())
	case !programmed:
		p.notReady = append(p.notReady, "NAT outgoing is not programmed yet")
	}
	// Both parts, also when apply found nothing to do (the NAT worker's
	// recovery brings such a pass).
	ok := 0.0
	if applyErr == nil && natErr == nil {
		ok = 1
	}
	r.metrics.lastReconcileOK.Set(ok)
}

// traceLearned logs, at debug level, how the routes BGP learned changed
// since the last pass: with the time each pass read them, it tells a
// route BGP learned late from one the pass installed late.
func (r *router) traceLearned(p *pass) {
	if !p.debug {
		r.lastLearned = nil
		return
	}
	learned := p.learned
	now := make(map[netip.Prefix]bgp.LearnedRoute, len(learned))
	var added, gone []string
	for _, lr := range learned {
		now[lr.Prefix] = lr
		if old, ok := r.lastLearned[lr.Prefix]; !ok || old.NextHop != lr.NextHop || old.Peer != lr.Peer {
			added = append(added, lr.Prefix.String()+" via "+lr.NextHop.String()+" from "+lr.Peer.String())
		}
	}
	for pfx := range r.lastLearned {
		if _, ok := now[pfx]; !ok {
			gone = append(gone, pfx.String())
		}
	}
	if len(added)+len(gone) > 0 {
		r.log.Debug("learned routes changed", "new", added, "gone", gone, "total", len(learned))
	}
	r.lastLearned = now
}

// readStates reads the BGP sessions' states into p. A pass that has read
// its routes (afterLearned) takes them from bgp.Speaker.RecentPeerStates:
// the sessions' states current, their route counts (for the metrics) at
// most statesMaxAge old, and when they were older, another pass comes
// then to publish them new. A claim anywhere brings every node two passes
// (its block, then its route), and reading the states afresh was most of
// what each pass cost a node when nothing else changed.
func (r *router) readStates(ctx context.Context, p *pass, afterLearned bool) {
	var err error
	if !afterLearned {
		if p.states, err = r.speaker.PeerStates(ctx); err != nil {
			p.out.problem(true, "reading the BGP sessions: %v", err)
		}
		return
	}
	var until time.Time
	if p.states, until, err = r.speaker.RecentPeerStates(ctx, statesMaxAge); err != nil {
		p.out.problem(true, "reading the BGP sessions: %v", err)
		return
	}
	if !until.IsZero() && (r.statesDue.Before(time.Now()) || until.Before(r.statesDue)) {
		r.statesDue = until
		time.AfterFunc(time.Until(until), r.markDirty)
	}
}

// statesMaxAge bounds how old the sessions' route counts a routing pass
// publishes may be (see readStates).
const statesMaxAge = time.Second

// ownBlocks are the CIDRs of this node's live blocks.
func (r *router) ownBlocks(snap *snapshot) []netip.Prefix {
	var own []netip.Prefix
	for _, b := range snap.blocks {
		if b.Spec.Affinity != "host:"+r.cfg.Node || b.Spec.Deleted {
			continue
		}
		if p, err := netip.ParsePrefix(b.Spec.CIDR); err == nil {
			own = append(own, p)
		}
	}
	return own
}

// apply programs state into the kernel (all but its NAT, which is the NAT
// worker's: see natWorker), unless the last Apply programmed the same a
// moment ago. Without heal, it programs state only when that
// differs from the last Apply's in its routes alone, however long ago
// that was, and otherwise nothing: the pass's full Apply comes later.
func (r *router) apply(state routing.State, heal bool) (routing.Stats, error) {
	recent := r.applied != nil && (!heal || time.Since(r.appliedAt) < r.cfg.Resync/2)
	if recent && reflect.DeepEqual(*r.applied, state) {
		// What the last Apply programmed, successfully, a moment ago:
		// reading the kernel again (routes, links, sysctls) would find
		// nothing to do. The periodic resync applies anyway, to heal
		// changes made behind tabby's back.
		return routing.Stats{Conflicts: r.appliedConflicts}, nil
	}
	// Only the routes changed since a full Apply a moment ago (BGP learned
	// or lost one: the common case): program those alone, keeping the
	// full Apply's time so the resync still heals the rest.
	routesOnly := recent && routing.SameButRoutes(*r.applied, state)
	if !heal && !routesOnly {
		return routing.Stats{}, errNotApplied
	}
	applyStart := time.Now()
	var stats routing.Stats
	var applyErr error
	at := applyStart
	if routesOnly {
		stats, applyErr = r.applier.ApplyRoutes(state)
		at = r.appliedAt
	} else {
		stats, applyErr = r.applier.ApplyNetlink(state)
	}
	r.metrics.observeApply(stats, applyErr)
	applyDur := time.Since(applyStart)
	r.applied, r.appliedAt, r.appliedConflicts = nil, time.Time{}, stats.Conflicts
	if applyErr == nil {
		r.applied, r.appliedAt = &state, at
	}
	r.lastApply = nodestatus.Apply{Time: applyStart, Duration: applyDur, Changes: stats.Changed()}
	if applyErr != nil {
		r.lastApply.Error = applyErr.Error()
	}
	if n := stats.Changed(); n > 0 {
		r.log.Debug("programmed the kernel", "changes", n, "routes", stats.Routes, "took", applyDur)
	}
	return stats, applyErr
}

// report is step 7: status, readiness and metrics.
func (r *router) report(p *pass) {
	blackholes := 0
	for _, rt := range p.state.Routes {
		if rt.Type == routing.Blackhole {
			blackholes++
		}
	}
	for _, peer := range p.desired {
		st := findState(p.states, peer.Key())
		if st == nil || !st.Established() {
			why := "no session yet"
			if st != nil {
				why = string(st.State)
				if st.Detail != "" {
					why += ": " + st.Detail
				}
			}
			p.notReady = append(p.notReady, fmt.Sprintf("BGP session with %s (%s) is not established (%s)", peer.Address, peer.Reason(), why))
		}
	}
	r.metrics.observeSessions(p.states)
	r.metrics.observeRejected(p.states)
	r.metrics.routes.WithLabelValues("programmed").Set(float64(len(p.state.Routes)))
	r.metrics.routes.WithLabelValues("blackhole").Set(float64(blackholes))
	r.metrics.routes.WithLabelValues("learned").Set(float64(len(p.learned)))
	r.metrics.routes.WithLabelValues("stale").Set(float64(p.stale))
	r.metrics.routes.WithLabelValues("advertised").Set(float64(len(p.adverts)))
	r.metrics.routes.WithLabelValues("kept").Set(float64(p.nKept))
	r.mu.Lock()
	defer r.mu.Unlock()
	st := &r.status
	st.IPv4, st.IPv6 = prefixString(r.addr4), prefixString(r.addr6)
	st.AS, st.RouterID = p.as, bgp.RouterID(p.selfBGP).String()
	st.Routes = nodestatus.Routes{Programmed: len(p.state.Routes), Blackholes: blackholes, Learned: len(p.learned), Stale: p.stale,
		Advertised: len(p.adverts), Kept: p.nKept}
	st.LastApply = r.lastApply
	st.Reconciles++
	st.Restart = p.restart
	st.Warnings = p.out.problems
	st.Problems = nil
	for _, f := range p.families {
		st.Problems = append(st.Problems, f.Reason+": "+f.Message)
	}
	r.notReady = p.notReady
	r.live = r.speaker
}

// identity computes the node's routing identity: its address, and its
// VXLAN MAC and tunnel addresses when pools need them (allocated by IPAM
// the first time).
func (r *router) identity(ctx context.Context, snap *snapshot, self *corev1.Node, out *outcome) routing.NodeInfo {
	info := routing.NodeInfo{Name: r.cfg.Node, IPv4: r.addr4, IPv6: r.addr6}
	current, _ := routing.NodeInfoFromAnnotations(self.Name, self.Annotations)
	anyVXLAN := slices.ContainsFunc(snap.pools, func(p tabbyv1.IPPool) bool {
		return p.Spec.VXLANMode != "" && p.Spec.VXLANMode != tabbyv1.EncapNever
	})
	if anyVXLAN && r.addr4.IsValid() {
		info.VXLANMAC = routing.DefaultVXLANMAC(r.cfg.Node)
	}
	for _, t := range []struct {
		tun     *tunnel
		vxlan   bool
		current netip.Addr
		dst     *netip.Addr
	}{
		{r.vxlan, true, current.VXLANAddress, &info.VXLANAddress},
		{r.ipip, false, current.IPIPAddress, &info.IPIPAddress},
	} {
		var pools []tabbyv1.IPPool
		if r.addr4.IsValid() {
			pools = tunnelPools(snap.pools, self, t.vxlan)
		}
		a, err := t.tun.ensure(ctx, pools, t.current)
		if err != nil {
			out.problem(true, "%v", err)
			a = t.current
		}
		*t.dst = a
	}
	return info
}

// ensureSpeaker starts the speaker, or starts it again when its AS,
// router ID or port changed.
func (r *router) ensureSpeaker(ctx context.Context, as uint32, id netip.Addr, port uint16) error {
	key := fmt.Sprintf("AS %d, router ID %s, port %d", as, id, port)
	if r.speaker != nil && r.speakerKey == key {
		return nil
	}
	if r.speaker != nil {
		r.log.Info("BGP identity changed: restarting the speaker", "from", r.speakerKey, "to", key)
		if err := r.speaker.Stop(ctx); err != nil {
			r.log.Warn("stopping the speaker", "err", err)
		}
		r.speaker = nil
		r.metrics.gobgp.Set(nil)
	}
	restarting := r.firstStart && r.restarted
	sp, err := bgp.Start(ctx, bgp.Config{RouterID: id, AS: as, ListenPort: port, Restarting: restarting,
		Transition: r.cfg.Transition, Log: r.cfg.Log.With("loop", "bgp"), OnPrefixLimit: r.metrics.prefixLimitReached})
	if err != nil {
		return fmt.Errorf("starting BGP: %w", err)
	}
	r.log.Info("BGP speaker started", "as", as, "routerID", id, "port", port, "restarting", restarting)
	r.speaker, r.speakerKey, r.firstStart = sp, key, false
	r.metrics.gobgp.Set(sp)
	return nil
}

// holdKept adds the routes the previous run left to state while BGP has
// not converged after a restart, and says what it did.
func (r *router) holdKept(state *routing.State, desired []bgp.Peer, states []bgp.PeerState) (string, int) {
	if !r.restarted {
		return "", 0
	}
	if r.holding {
		done, why := converged(desired, states)
		took := time.Since(r.holdUntil.Add(-r.cfg.StartupHold)).Round(time.Millisecond)
		switch {
		case done:
			r.log.Info("BGP converged after the restart: routes the previous run left are no longer kept", "took", took)
			r.restartNote = fmt.Sprintf("restarted; BGP converged %v after the start, and the %d routes the previous run left were kept until then", took, len(r.kept))
		case time.Now().After(r.holdUntil):
			r.log.Warn("BGP has not converged after the restart: routes the previous run left are no longer kept", "waited", took, "waitingFor", why)
			r.restartNote = fmt.Sprintf("restarted; BGP had not converged %v after the start (%s), so the %d routes the previous run left were kept no longer", took, why, len(r.kept))
		default:
			var n int
			*state, n = withKept(*state, r.kept)
			return fmt.Sprintf("restarted %v ago: %d routes of the previous run are kept until BGP converges (%s)", took, n, why), n
		}
		r.holding, r.kept = false, nil
	}
	return r.restartNote, 0
}

// installable picks the learned routes the kernel gets: those inside a
// pool (pod routes of other nodes), and those whose next hop is not a
// cluster node (routes of external peers). What nodes advertise outside
// the pools (service CIDRs) is reached on every node already. It also
// counts the stale routes.
//
// The speaker's import policy already turned away what the filters
// reject; they are asked again here, so that a route that reached GoBGP's
// table anyway (held across a reset, or accepted before IPAM changed and
// not yet re-evaluated) never reaches the kernel. Such routes are
// returned as refused, with why.
func installable(learned []bgp.LearnedRoute, pools []tabbyv1.IPPool, nodeAddrs map[netip.Addr]bool, f *bgp.Filters, peers []bgp.Peer) ([]routing.LearnedRoute, int, []string) {
	byAddr := map[netip.Addr]bgp.Peer{}
	for _, p := range peers {
		byAddr[p.Address] = p
	}
	var refused []string
	var cidrs []netip.Prefix
	for _, p := range pools {
		if c, err := netip.ParsePrefix(p.Spec.CIDR); err == nil {
			cidrs = append(cidrs, c.Masked())
		}
	}
	out := make([]routing.LearnedRoute, 0, len(learned))
	stale := 0
	for _, lr := range learned {
		if lr.Stale {
			stale++
		}
		inPool := slices.ContainsFunc(cidrs, func(c netip.Prefix) bool { return c.Bits() <= lr.Prefix.Bits() && c.Contains(lr.Prefix.Addr()) })
		if !inPool && nodeAddrs[lr.NextHop.Unmap()] {
			continue
		}
		if p, ok := byAddr[lr.Peer]; ok && f != nil {
			if v := f.Import(p, lr.Route); !v.Accept {
				refused = append(refused, fmt.Sprintf("route %s via %s from %s (%s) is not installed: %s", lr.Prefix, lr.NextHop, lr.Peer, p.Reason(), v.Reason))
				continue
			}
		}
		out = append(out, routing.LearnedRoute{Prefix: lr.Prefix, NextHop: lr.NextHop})
	}
	return out, stale, refused
}

// bgpNode is a Node as BGP sees it (its addresses from its annotations).
func bgpNode(n *corev1.Node, out *outcome) bgp.Node {
	ni, _ := routing.NodeInfoFromAnnotations(n.Name, n.Annotations)
	as, err := bgp.NodeAS(n.Annotations)
	if err != nil {
		out.problem(false, "node %s: %v", n.Name, err)
	}
	return bgp.Node{Name: n.Name, Labels: n.Labels, IPv4: ni.IPv4, IPv6: ni.IPv6, AS: as}
}

// secret reads one key of a Secret from the API server, by name: the
// tabby-node service account may read no Secret but those its owner grants
// by name (a Role with resourceNames in the Secret's namespace), so there
// is no cache of a namespace's Secrets. It is read at each reconcile that
// needs it (events and the periodic resync), so a changed password takes
// effect within DefaultResync.
func (r *router) secret(ctx context.Context, ref *tabbyv1.SecretKeyRef) (string, error) {
	ns := ref.Namespace
	if ns == "" {
		ns = r.cfg.Namespace
	}
	sec, err := secretClient(r.cfg.DS, ns).Get(ctx, ref.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return "", fmt.Errorf("no Secret %s/%s: create it with the key %s", ns, ref.Name, ref.Key)
	case apierrors.IsForbidden(err):
		return "", fmt.Errorf("reading Secret %s/%s: %w (grant it to tabbyd by name: a Role in %s with resources [secrets], resourceNames [%s], verbs [get], bound to the service account %s/tabby-node)", ns, ref.Name, err, ns, ref.Name, r.cfg.Namespace)
	case err != nil:
		return "", fmt.Errorf("reading Secret %s/%s: %w", ns, ref.Name, err)
	}
	v, ok := sec.Data[ref.Key]
	if !ok {
		if s, ok := sec.StringData[ref.Key]; ok {
			return s, nil
		}
		return "", fmt.Errorf("the Secret %s/%s has no key %s", ns, ref.Name, ref.Key)
	}
	return string(v), nil
}

func findState(states []bgp.PeerState, key string) *bgp.PeerState {
	for i := range states {
		if states[i].Key() == key {
			return &states[i]
		}
	}
	return nil
}

func prefixString(p netip.Prefix) string {
	if !p.IsValid() {
		return ""
	}
	return p.String()
}

// Ready says whether routing is ready: the node's identity is published,
// every expected BGP session is established and the last programming of
// the kernel succeeded; otherwise why not.
func (r *router) Ready() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.notReady) == 0 {
		return nil
	}
	return errors.New(strings.Join(r.notReady, "; "))
}

// Status is the node's routing status, with the sessions read now.
func (r *router) Status(ctx context.Context) nodestatus.Status {
	r.mu.Lock()
	st := r.status
	sp := r.live
	st.NotReady = slices.Clone(r.notReady)
	st.Warnings = slices.Clone(r.status.Warnings)
	st.Problems = slices.Clone(r.status.Problems)
	r.mu.Unlock()
	st.Time = time.Now()
	st.Ready = len(st.NotReady) == 0
	st.Peers = []nodestatus.Peer{}
	if sp == nil {
		return st
	}
	states, err := sp.PeerStates(ctx)
	if err != nil {
		st.NotReady = append(st.NotReady, "reading the BGP sessions: "+err.Error())
		return st
	}
	for _, ps := range states {
		p := nodestatus.Peer{Address: ps.Address.String(), Port: ps.Port, AS: ps.AS, Type: ps.Reason(), Node: ps.Node,
			State: string(ps.State), Since: ps.Since, Synced: ps.Synced, Received: ps.Received, Accepted: ps.Accepted,
			Rejected: ps.Rejected, MaxPrefixes: ps.MaxPrefixes, LimitTrips: ps.LimitTrips, Info: ps.Detail}
		if p.MaxPrefixes == 0 {
			p.MaxPrefixes = bgp.DefaultMaxPrefixes
		}
		for _, rp := range ps.RejectedPrefixes {
			p.RejectedPrefixes = append(p.RejectedPrefixes, rp.String())
		}
		if !ps.HeldSince.IsZero() {
			p.Info = strings.TrimSpace(fmt.Sprintf("being replaced since %s: %s %s", ps.HeldSince.Local().Format(time.TimeOnly), ps.HeldFor, p.Info))
		}
		st.Peers = append(st.Peers, p)
	}
	return st
}
