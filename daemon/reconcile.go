package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"sync"
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
	// retryAfter is when a reconcile that failed part-way runs again.
	retryAfter = 2 * time.Second
)

// routerConfig configures the routing loop.
type routerConfig struct {
	Node string
	// NodeIP is --node-ip (nil: detected).
	NodeIP net.IP
	// Namespace holds the Secrets of BGP passwords.
	Namespace string
	// Resync and StartupHold: see DefaultResync and DefaultStartupHold.
	Resync      time.Duration
	StartupHold time.Duration
	// Transition tunes BGP's make-before-break.
	Transition bgp.TransitionOptions
	DS         *datastore.Client
	Log        *slog.Logger
	Registerer prometheus.Registerer
	// Metrics, when set, are the loop's metrics instead of Registerer's.
	Metrics *routingMetrics
}

// router is tabbyd's routing loop: it registers the node's routing
// identity, and on every change (and periodically) computes the BGP
// sessions, the advertisements and the routes from the caches and the
// speaker's table, then converges the speaker and the kernel to them.
type router struct {
	cfg     routerConfig
	log     *slog.Logger
	caches  *caches
	applier *routing.Applier
	vxlan   *tunnel
	ipip    *tunnel
	metrics *routingMetrics
	loop    *loop.Loop

	// Owned by the loop goroutine.
	addr4, addr6 netip.Prefix
	speaker      *bgp.Speaker
	speakerKey   string // AS, router ID and port the speaker runs with
	firstStart   bool   // the speaker has not started yet
	restarted    bool   // the previous run left routes in the kernel
	kept         []routing.Route
	holdUntil    time.Time
	holding      bool
	restartNote  string
	lastProblems string
	// applied is the state the last Apply programmed without an error,
	// at appliedAt (nil after a failure).
	applied          *routing.State
	appliedAt        time.Time
	appliedConflicts []string
	lastApply        nodestatus.Apply
	conditionSet     bool

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
	// A reconcile that failed part-way runs again after retryAfter, however
	// often it failed: the failures are on /readyz meanwhile.
	r.loop = loop.New(loop.Config{
		Pass:    r.reconcile,
		MinGap:  minReconcileGap,
		Resync:  cfg.Resync,
		Backoff: loop.Backoff{Min: retryAfter, Max: retryAfter},
		Wake:    r.speakerChanges,
	})
	m := ipam.New(cfg.DS, ipam.WithLogger(cfg.Log))
	r.vxlan = &tunnel{kind: "vxlan", node: cfg.Node, m: m}
	r.ipip = &tunnel{kind: "ipip", node: cfg.Node, m: m}
	r.caches = newCaches(cfg.DS, r.markDirty)
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
		p, how, err := nodeAddress(r.cfg.NodeIP, r.cfg.DS.Host())
		if err == nil {
			if p.Addr().Is4() {
				r.addr4 = p
			} else {
				r.addr6 = p
			}
			r.log.Info("node address", "address", p.String(), "from", how)
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
	_ = r.loop.Run(ctx)
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

func (r *router) reconcileOnce(ctx context.Context) (out outcome) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	snap := r.caches.snapshot()
	self := snap.node(r.cfg.Node)
	if self == nil {
		why := fmt.Sprintf("the Node %s does not exist (yet): the kubelet registers it", r.cfg.Node)
		r.setNotReady(why)
		out.problem(true, "%s", why)
		return out
	}
	var notReady []string

	// 1. The node's routing identity, published in its annotations.
	info := r.identity(ctx, &snap, self, &out)
	if changed, err := publish(ctx, r.cfg.DS, self, info); err != nil {
		out.problem(true, "%v", err)
		notReady = append(notReady, err.Error())
	} else if changed {
		r.log.Info("published this node's routing identity", "annotations", info.Annotations())
	}

	// 2. The speaker, with this node's AS and router ID.
	settings := bgp.SettingsOf(snap.config)
	selfBGP := bgpNode(self, &out)
	selfBGP.IPv4, selfBGP.IPv6 = r.addr4, r.addr6
	as := settings.AS
	if selfBGP.AS != 0 {
		as = selfBGP.AS
	}
	if err := r.ensureSpeaker(ctx, as, bgp.RouterID(selfBGP), settings.ListenPort); err != nil {
		out.problem(true, "%v", err)
		r.setNotReady(err.Error())
		return out
	}

	// 3. Sessions.
	nodes := make([]bgp.Node, 0, len(snap.nodes))
	peerInfos := make([]routing.NodeInfo, 0, len(snap.nodes))
	for i := range snap.nodes {
		n := &snap.nodes[i]
		if n.Name == r.cfg.Node {
			continue
		}
		nodes = append(nodes, bgpNode(n, &out))
		ni, err := routing.NodeInfoFromAnnotations(n.Name, n.Annotations)
		if err != nil {
			out.problem(false, "%v", err)
		}
		peerInfos = append(peerInfos, ni)
	}
	in := bgp.Inputs{Self: selfBGP, Nodes: nodes, Config: snap.config, BGPPeers: snap.peers, Passwords: map[string]string{}}
	if ref := snap.config.NodeMeshPassword; ref != nil {
		pw, err := r.secret(ctx, ref)
		if err != nil {
			out.problem(true, "the node-to-node mesh password: %v", err)
		}
		in.MeshPassword = pw
	}
	for _, bp := range snap.peers {
		if bp.Spec.Password == nil {
			continue
		}
		pw, err := r.secret(ctx, bp.Spec.Password)
		if err != nil {
			out.problem(true, "the password of BGPPeer %s: %v", bp.Name, err)
			continue
		}
		in.Passwords[bp.Name] = pw
	}
	desired, errs := bgp.DesiredPeers(in)
	for _, err := range errs {
		out.problem(false, "%v", err)
	}
	filters, errs := bgp.NewFilters(bgp.FilterInputs{Nodes: append([]bgp.Node{selfBGP}, nodes...), Pools: snap.pools,
		Blocks: snap.blocks, Config: snap.config, BGPPeers: snap.peers, BGPFilters: snap.filters})
	for _, err := range errs {
		out.problem(false, "%v", err)
	}
	if err := r.speaker.SetFilters(ctx, filters); err != nil {
		out.problem(true, "applying the BGP route filters: %v", err)
	}
	if err := r.speaker.SetPeers(ctx, desired); err != nil {
		out.problem(true, "configuring BGP sessions: %v", err)
	}

	// 4. Advertisements.
	adverts, errs := bgp.Advertisements(bgp.AdvertInputs{Node: r.cfg.Node, IPv4: r.addr4.Addr(), IPv6: r.addr6.Addr(),
		Pools: snap.pools, Blocks: snap.blocks, Config: snap.config})
	for _, err := range errs {
		out.problem(false, "%v", err)
	}
	routes := make([]bgp.Route, 0, len(adverts))
	for _, a := range adverts {
		routes = append(routes, a.Route)
	}
	if err := r.speaker.SetAdvertisements(ctx, routes); err != nil {
		out.problem(true, "advertising routes: %v", err)
	}

	// 5. Routes: what BGP learned, through routing.Desired, into the kernel.
	learned, err := r.speaker.Learned(ctx)
	if err != nil {
		out.problem(true, "reading the routes BGP learned: %v", err)
	}
	states, err := r.speaker.PeerStates(ctx)
	if err != nil {
		out.problem(true, "reading the BGP sessions: %v", err)
	}
	nodeAddrs := map[netip.Addr]bool{}
	for _, n := range nodes {
		nodeAddrs[n.IPv4.Addr()], nodeAddrs[n.IPv6.Addr()] = true, true
	}
	toInstall, stale, refused := installable(learned, snap.pools, nodeAddrs, filters, desired)
	for _, why := range refused {
		out.problem(false, "%s", why)
	}
	var own []netip.Prefix
	for _, b := range snap.blocks {
		if b.Spec.Affinity != "host:"+r.cfg.Node || b.Spec.Deleted {
			continue
		}
		if p, err := netip.ParsePrefix(b.Spec.CIDR); err == nil {
			own = append(own, p)
		}
	}
	state := routing.Desired(routing.Inputs{Node: info, Pools: snap.pools, Blocks: own, Learned: toInstall, Peers: peerInfos})
	for _, w := range state.Warnings {
		out.problem(false, "%s", w)
	}
	restartNote, nKept := r.holdKept(&state, desired, states)
	applyStart := time.Now()
	var stats routing.Stats
	var applyErr error
	if r.applied != nil && reflect.DeepEqual(*r.applied, state) && time.Since(r.appliedAt) < r.cfg.Resync/2 {
		// What the last Apply programmed, successfully, a moment ago:
		// reading the kernel again (routes, links, iptables) would find
		// nothing to do. The periodic resync applies anyway, to heal
		// changes made behind tabby's back.
		stats = routing.Stats{Conflicts: r.appliedConflicts}
	} else {
		stats, applyErr = r.applier.Apply(state)
		r.metrics.observeApply(stats, applyErr)
		applyDur := time.Since(applyStart)
		r.applied, r.appliedAt, r.appliedConflicts = nil, time.Time{}, stats.Conflicts
		if applyErr == nil {
			r.applied, r.appliedAt = &state, applyStart
		}
		r.lastApply = nodestatus.Apply{Time: applyStart, Duration: applyDur, Changes: stats.Changed()}
		if applyErr != nil {
			r.lastApply.Error = applyErr.Error()
		}
		if n := stats.Changed(); n > 0 {
			r.log.Debug("programmed the kernel", "changes", n, "routes", stats.Routes, "took", applyDur)
		}
	}
	if applyErr != nil {
		out.problem(true, "programming the kernel: %v", applyErr)
		notReady = append(notReady, "programming the kernel failed: "+applyErr.Error())
	} else if !r.conditionSet {
		r.conditionSet = setNetworkAvailable(ctx, r.cfg.DS, self, r.log)
	}
	for _, c := range stats.Conflicts {
		out.problem(false, "%s", c)
	}

	// 6. Status, readiness and metrics.
	blackholes := 0
	for _, rt := range state.Routes {
		if rt.Type == routing.Blackhole {
			blackholes++
		}
	}
	for _, p := range desired {
		st := findState(states, p.Key())
		if st == nil || !st.Established() {
			why := "no session yet"
			if st != nil {
				why = string(st.State)
				if st.Detail != "" {
					why += ": " + st.Detail
				}
			}
			notReady = append(notReady, fmt.Sprintf("BGP session with %s (%s) is not established (%s)", p.Address, p.Reason(), why))
		}
	}
	r.metrics.observeSessions(states)
	r.metrics.observeRejected(states)
	r.metrics.routes.WithLabelValues("programmed").Set(float64(len(state.Routes)))
	r.metrics.routes.WithLabelValues("blackhole").Set(float64(blackholes))
	r.metrics.routes.WithLabelValues("learned").Set(float64(len(learned)))
	r.metrics.routes.WithLabelValues("stale").Set(float64(stale))
	r.metrics.routes.WithLabelValues("advertised").Set(float64(len(routes)))
	r.metrics.routes.WithLabelValues("kept").Set(float64(nKept))
	r.mu.Lock()
	defer r.mu.Unlock()
	st := &r.status
	st.IPv4, st.IPv6 = prefixString(r.addr4), prefixString(r.addr6)
	st.AS, st.RouterID = as, bgp.RouterID(selfBGP).String()
	st.Routes = nodestatus.Routes{Programmed: len(state.Routes), Blackholes: blackholes, Learned: len(learned), Stale: stale,
		Advertised: len(routes), Kept: nKept}
	st.LastApply = r.lastApply
	st.Reconciles++
	st.Restart = restartNote
	st.Warnings = out.problems
	r.notReady = notReady
	r.live = r.speaker
	return out
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
