// Package netpol is tabbyd's NetworkPolicy loop: it watches Pods,
// Namespaces, NetworkPolicies (networking.k8s.io/v1), ClusterNetworkPolicies
// (policy.networking.k8s.io/v1beta1) with the Nodes their peers may select,
// and tabby's IPAMBlocks, and on every change (coalesced, and periodically) builds the
// compiler's input (BuildInput), compiles the whole ruleset (package
// policy) and applies it to the kernel (package policy/apply). It is
// level-triggered: every sync starts from the informers' state, so a missed
// event or a restart heals itself.
//
// A pod is an endpoint from the moment IPAM hands it an address (the
// IPAMBlock's allocation names the pod), before the kubelet reports its
// IP. The CNI plugin asks tabbyd's CNI agent to wait (WaitProgrammed) until
// a sync whose input held the pod with those addresses is in the kernel,
// so no pod starts before its policies are enforced.
//
// Policies the compiler refuses (policy.Ruleset.Problems) are logged and
// reported as a Warning Event on the policy, once per distinct message; the
// other policies keep being enforced. So are policies over Config.Limits,
// which the compiler enforces fail closed rather than expand without bound:
// no one policy can make the ruleset too big to load, so none can fail the
// node's sync (which would hold every new pod of the node in its CNI ADD
// and make /readyz fail).
package netpol

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/cache"

	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/datastore/events"
	"github.com/tabbynet/tabby/internal/loop"
	"github.com/tabbynet/tabby/policy"
	"github.com/tabbynet/tabby/policy/apply"
)

// Defaults of the loop.
const (
	// DefaultResync is how often the loop syncs without an event, and
	// how often, between syncs, it reads the kernel back to repair what
	// was changed behind tabby's back (Applier.Audit).
	DefaultResync = 60 * time.Second
	// DefaultJumpCheck is how often the jumps from the built-in chains
	// are checked (and put back when something removed them).
	DefaultJumpCheck = 10 * time.Second
	// DefaultMinSyncGap spaces syncs under a storm of events: what
	// arrives meanwhile is coalesced into the next sync.
	DefaultMinSyncGap = 10 * time.Millisecond
	// syncBurst syncs may run back to back after a quiet spell
	// (loop.Config.Burst): a new pod's address arriving a millisecond
	// after the pod is not held for the gap while its ADD waits.
	syncBurst = 3
	// retryMin and retryMax bound the back-off after a failed sync.
	retryMin = time.Second
	retryMax = 30 * time.Second
	// syncTimeout bounds one sync (a hung iptables or ipset command).
	syncTimeout = time.Minute
	// maxAuditsCut is how many audits in a row a change may cut short.
	maxAuditsCut = 3
)

// Event reasons on NetworkPolicies.
const (
	// ReasonNotEnforced: the compiler refused (part of) a policy, or
	// could not program a pod.
	ReasonNotEnforced = "NotEnforced"
)

// Compiler is policy.Compile, or the Compile of a policy.Incremental
// (tabbyd's): the whole ruleset of a node from its input. The loop calls
// it from one goroutine.
type Compiler func(*policy.Input) *policy.Ruleset

// Applier makes the kernel match a ruleset: *apply.Applier, which must
// be called from a thread in the network namespace to program (tabbyd runs
// in the node's; Run calls it only from its own goroutine).
type Applier interface {
	// Apply programs the ruleset's sets, chains and jumps.
	Apply(ctx context.Context, rs *policy.Ruleset) (apply.Stats, error)
	// CheckJumps checks the jumps from the built-in chains of the last
	// ruleset applied and puts back those something removed (how many).
	CheckJumps(ctx context.Context) (int, error)
	// Audit reads the kernel back and repairs what differs from the last
	// ruleset applied; cut short by ctx during the read, it changes
	// nothing and returns ctx's error.
	Audit(ctx context.Context) (apply.Stats, error)
}

// Config configures the controller.
type Config struct {
	// Node is this node's name: its pods get chains.
	Node string
	// DS reads Pods, Namespaces and IPAMBlocks.
	DS *datastore.Client
	// Informers, when set, are the informers of Namespaces, IPAMBlocks
	// and Nodes the controller shares with tabbyd's other components
	// (nil: its own, over DS).
	Informers *datastore.Informers
	// Policies reads the NetworkPolicies of every namespace
	// (NewPolicyClient).
	Policies datastore.ListWatcher[*networkingv1.NetworkPolicyList]
	// ClusterPolicies reads the ClusterNetworkPolicies
	// (NewClusterPolicyClient); nil: none are enforced. With it the
	// controller also watches Nodes, whose addresses nodes peers match.
	ClusterPolicies datastore.ListWatcher[*unstructured.UnstructuredList]
	Compile         Compiler
	Applier         Applier
	// DenyUnlisted drops the traffic of host veths that no pod the
	// controller knows has (policy.Input.DenyUnlisted): a pod wired while
	// tabbyd was away is cut off until its policies are programmed,
	// rather than open.
	DenyUnlisted bool
	// Limits bound what one policy may expand to (policy.Input.Limits):
	// a policy over them is reported and fails closed, the others are
	// enforced.
	Limits policy.Limits
	// DeniedLog, when set, logs what policy drops
	// (policy.Input.DeniedLog), and Denied, when set, learns what each
	// sync programs, to turn those packets into records.
	DeniedLog *policy.DeniedLog
	Denied    *Denied
	// Retention says how long the chains of a combination of policies
	// that no local pod has any more stay (policy.Input.Keep), so that a
	// pod whose labels flip back, or a pod replaced by one with the same
	// labels, costs set members and not an iptables-restore; the zero
	// value keeps them policy.DefaultKeepFor, at most
	// policy.DefaultMaxKept.
	Retention policy.Retention
	// Recorder reports refused policies as Events (NewRecorder); nil:
	// they are only logged.
	Recorder events.Recorder
	// Resync, JumpCheck and MinSyncGap: see DefaultResync,
	// DefaultJumpCheck and DefaultMinSyncGap (0 means the default).
	Resync, JumpCheck, MinSyncGap time.Duration
	Log                           *slog.Logger
	// Registerer takes the loop's metrics (nil: none), unless Metrics
	// holds them already.
	Registerer prometheus.Registerer
	Metrics    *Metrics
}

// Controller is the NetworkPolicy loop of one node.
type Controller struct {
	cfg Config
	log *slog.Logger
	met *metrics

	pods, namespaces, policies, blocks cache.SharedIndexInformer
	// infs holds the shared ones (namespaces, blocks, nodes).
	infs *datastore.Informers
	// cnps and nodes are nil without Config.ClusterPolicies.
	cnps, nodes cache.SharedIndexInformer
	loop        *loop.Loop

	// Owned by the loop goroutine.
	reported map[string]string // "Kind namespace/name" -> problem reported
	// readAt is when the kernel was last read back (by a sync or an
	// audit); auditsCut counts the audits cut short since.
	readAt    time.Time
	auditsCut int
	// retain is Config.Retention, fed every sync's Ruleset.
	retain policy.Retention
	// builder builds every sync's input, remembering each Pod's part.
	builder InputBuilder

	mu sync.Mutex
	// synced: the informers have synced; gen counts syncs started.
	synced bool
	gen    uint64
	// applied is what the last successful sync programmed.
	applied applied
	// known is what the last sync's input held of the local pods.
	known map[string]endpointState
	// lastErr is the last sync's error (nil after a success).
	lastErr error
	// changed is closed (and replaced) when a sync ends.
	changed chan struct{}

	// hints are the blocks the CNI agent wrote ahead of the watch.
	hints  blockHints
	claims addressClaims
}

// applied is the state one successful sync programmed.
type applied struct {
	gen       uint64
	at        time.Time
	endpoints map[string]endpointState // local pods, by "namespace/name"
}

// endpointState is a local pod as a sync saw it.
type endpointState struct {
	uid        string
	ips        []netip.Addr
	programmed bool // in the ruleset's Programmed
}

// New makes a controller; Run runs it.
func New(cfg Config) (*Controller, error) {
	if cfg.Node == "" || cfg.DS == nil || cfg.Policies == nil || cfg.Compile == nil || cfg.Applier == nil {
		return nil, errors.New("netpol: a node name, a datastore, a NetworkPolicy client, a compiler and an applier are needed")
	}
	if cfg.Resync <= 0 {
		cfg.Resync = DefaultResync
	}
	if cfg.JumpCheck <= 0 {
		cfg.JumpCheck = DefaultJumpCheck
	}
	if cfg.MinSyncGap <= 0 {
		cfg.MinSyncGap = DefaultMinSyncGap
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	c := &Controller{
		cfg:      cfg,
		log:      cfg.Log.With("loop", "policy"),
		met:      newMetrics(),
		reported: map[string]string{},
		retain:   cfg.Retention,
		changed:  make(chan struct{}),
	}
	// A failed sync is retried after a back-off that doubles from
	// retryMin up to retryMax; a success resets it. The jumps are checked
	// on the loop's goroutine, the one that programs the kernel; a change
	// arriving meanwhile cuts the check short, so that a label flip does
	// not wait for six iptables reads.
	c.loop = loop.New(loop.Config{
		Pass:    c.sync,
		MinGap:  cfg.MinSyncGap,
		Burst:   syncBurst,
		Resync:  cfg.Resync,
		Backoff: loop.Backoff{Min: retryMin, Max: retryMax, Factor: 2},
		Task:    loop.Task{Every: cfg.JumpCheck, Do: c.checkJumps},
	})
	if cfg.Metrics != nil {
		c.met = cfg.Metrics.m
	} else if cfg.Registerer != nil {
		if err := c.met.register(cfg.Registerer); err != nil {
			return nil, fmt.Errorf("netpol: registering metrics: %w", err)
		}
	}
	c.infs = cfg.Informers
	if c.infs == nil {
		c.infs = datastore.NewInformers(cfg.DS)
	}
	c.pods = informer(&corev1.Pod{}, cfg.DS.Pods(metav1.NamespaceAll), c.markDirty, podChanged)
	c.namespaces = c.infs.Namespaces()
	datastore.OnChange(c.namespaces, c.markDirty, namespaceChanged)
	c.policies = informer(&networkingv1.NetworkPolicy{}, cfg.Policies, c.markDirty, nil)
	// An update to a version the agent handed over (ObserveBlock) was
	// synced already.
	c.blocks = c.infs.IPAMBlocks()
	datastore.OnChange(c.blocks, c.markDirty, func(old, new any) bool {
		return !c.hints.caughtUp(new) && blockChanged(old, new)
	})
	if cfg.ClusterPolicies != nil {
		c.cnps = informer(&unstructured.Unstructured{}, cfg.ClusterPolicies, c.markDirty, nil)
		c.nodes = c.infs.Nodes()
		datastore.OnChange(c.nodes, c.markDirty, nodeChanged)
	}
	return c, nil
}

// informer watches every object c lists; changed (may be nil) filters
// updates: only those it calls a change mark the loop dirty. Managed
// fields are dropped from the cache.
func informer[L runtime.Object](example runtime.Object, c datastore.ListWatcher[L], onChange func(), changed func(old, new any) bool) cache.SharedIndexInformer {
	inf := datastore.NewInformer(example, c, nil, nil)
	_ = inf.SetTransform(datastore.StripManagedFields)
	datastore.OnChange(inf, onChange, changed)
	return inf
}

// markDirty asks the loop for a sync.
func (c *Controller) markDirty() { c.loop.Trigger() }

// Run syncs the informers, then runs the loop until ctx ends. It returns
// an error only when the informers never synced; failed syncs are logged,
// shown by Ready and retried with back-off. The rules stay in the kernel
// when it returns: pods stay protected while tabbyd restarts.
func (c *Controller) Run(ctx context.Context) error {
	all := []cache.SharedIndexInformer{c.pods, c.namespaces, c.policies, c.blocks}
	if c.cnps != nil {
		all = append(all, c.cnps, c.nodes)
	}
	c.infs.Run(ctx, all...)
	synced := make([]cache.InformerSynced, 0, len(all))
	for _, inf := range all {
		synced = append(synced, inf.HasSynced)
	}
	start := time.Now()
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("the NetworkPolicy caches did not sync with the API server at %s", c.cfg.DS.Host())
	}
	c.mu.Lock()
	c.synced = true
	c.mu.Unlock()
	c.log.Info("NetworkPolicy caches synced", "took", time.Since(start).Round(time.Millisecond).String())
	return c.loop.Run(ctx)
}

func (c *Controller) checkJumps(ctx context.Context) {
	c.mu.Lock()
	ok := c.applied.gen > 0
	c.mu.Unlock()
	if !ok {
		return // nothing applied yet: the next sync puts the jumps in
	}
	if !c.readAt.IsZero() && time.Since(c.readAt) >= c.cfg.Resync {
		c.audit(ctx)
		return
	}
	n, err := c.cfg.Applier.CheckJumps(ctx)
	c.met.kernelChanges.WithLabelValues("jump").Add(float64(n))
	if err != nil && ctx.Err() != nil {
		// A sync was asked for: it goes first, and the loop checks again
		// once it is idle.
		c.met.jumpChecks.WithLabelValues("preempted").Inc()
		return
	}
	if err != nil {
		c.met.jumpChecks.WithLabelValues("error").Inc()
		c.log.Warn("checking the jumps into tabby's policy chains; syncing again", "error", err)
		c.markDirty()
		return
	}
	c.met.jumpChecks.WithLabelValues("ok").Inc()
	if n > 0 {
		c.met.jumpRepairs.Add(float64(n))
		c.log.Warn("something removed or moved tabby's jumps into its policy chains: put back", "changes", n)
	}
}

// audit has the kernel read back and repaired (the jumps too). It runs
// here, between syncs, rather than in a sync: left to the applier's
// clock, the read fell on whichever sync came next after its period, in a
// busy cluster a pod's change, which then waited for the whole read (a
// second at 5,000 local pods). Here a change arriving during the read
// cuts it short, and it runs again after the change's sync. On a node
// whose changes come faster than a read takes, the audit after three cut
// short runs to its end.
func (c *Controller) audit(ctx context.Context) {
	preemptible := c.auditsCut < maxAuditsCut
	actx := ctx
	if !preemptible {
		actx = context.WithoutCancel(ctx)
	}
	actx, cancel := context.WithTimeout(actx, syncTimeout)
	defer cancel()
	st, err := c.cfg.Applier.Audit(actx)
	if err != nil && preemptible && ctx.Err() != nil {
		c.auditsCut++
		c.met.audits.WithLabelValues("preempted").Inc()
		return
	}
	c.readAt, c.auditsCut = time.Now(), 0
	c.met.observeStats(st)
	if err != nil {
		c.met.audits.WithLabelValues("error").Inc()
		c.log.Warn("reading the kernel back; syncing again", "error", err)
		c.markDirty()
		return
	}
	c.met.audits.WithLabelValues("ok").Inc()
	if st.Changed() > 0 {
		c.log.Warn("something changed tabby's NetworkPolicy sets or chains: repaired", "changes", st.Changed())
	}
}

// Input is the compiler's input from the informers' current state.
func (c *Controller) Input() *policy.Input {
	in, _ := c.input(nil)
	return in
}

// input is Input, built with b (nil: without memory), and the
// ClusterNetworkPolicies that could not be decoded.
func (c *Controller) input(b *InputBuilder) (*policy.Input, []policy.Problem) {
	in := b.Build(c.cfg.Node, datastore.StoreList[corev1.Pod](c.pods), datastore.StoreList[corev1.Namespace](c.namespaces),
		datastore.StoreList[networkingv1.NetworkPolicy](c.policies), c.claims.apply(c.hints.storeBlocks(c.blocks)))
	in.DenyUnlisted = c.cfg.DenyUnlisted
	in.Limits = c.cfg.Limits
	in.DeniedLog = c.cfg.DeniedLog
	var bad []policy.Problem
	if c.cnps != nil {
		in.ClusterPolicies, bad = b.ClusterPolicies(datastore.StoreList[unstructured.Unstructured](c.cnps))
		in.Nodes = datastore.StoreList[corev1.Node](c.nodes)
		slices.SortFunc(in.Nodes, func(a, b *corev1.Node) int { return strings.Compare(a.Name, b.Name) })
	}
	return in, bad
}

// sync compiles and applies everything once.
func (c *Controller) sync(parent context.Context) (err error) {
	ctx, cancel := context.WithTimeout(parent, syncTimeout)
	defer cancel()
	start := time.Now()
	c.mu.Lock()
	c.gen++
	gen := c.gen
	c.mu.Unlock()
	in, undecoded := c.input(&c.builder)
	in.Keep = c.retain.Keep(start)
	known := localEndpoints(in, nil)
	defer func() {
		c.mu.Lock()
		c.known = known
		c.lastErr = err
		close(c.changed)
		c.changed = make(chan struct{})
		c.mu.Unlock()
		result := "ok"
		if err != nil {
			result = "error"
			c.met.lastSyncOK.Set(0)
			if parent.Err() == nil {
				c.log.Error("NetworkPolicy sync failed; retrying", "sync", gen, "error", err)
			}
		} else {
			c.met.lastSyncOK.Set(1)
			c.met.programmedAt.SetToCurrentTime()
		}
		c.met.syncs.WithLabelValues(result).Inc()
		c.met.syncTime.WithLabelValues("total").Observe(time.Since(start).Seconds())
	}()
	rs, err := c.compile(in)
	compiled := time.Now()
	c.met.syncTime.WithLabelValues("compile").Observe(compiled.Sub(start).Seconds())
	if err != nil {
		return err
	}
	c.retain.Observe(rs, compiled)
	c.report(append(slices.Clip(rs.Problems), undecoded...))
	if c.cfg.Denied != nil {
		c.cfg.Denied.Update(in, rs, true)
	}
	st, err := c.cfg.Applier.Apply(ctx, rs)
	c.met.observeStats(st)
	if st.KernelRead {
		c.readAt, c.auditsCut = time.Now(), 0
	}
	if err != nil {
		return fmt.Errorf("programming the kernel: %w", err)
	}
	c.met.syncTime.WithLabelValues("apply").Observe(time.Since(compiled).Seconds())
	c.met.observeRuleset(in, rs)
	if c.cfg.Denied != nil {
		c.cfg.Denied.Update(in, rs, false)
	}
	done := localEndpoints(in, rs.Programmed)
	c.mu.Lock()
	c.applied = applied{gen: gen, at: time.Now(), endpoints: done}
	c.mu.Unlock()
	c.log.Debug("NetworkPolicy synced", "sync", gen, "policies", len(in.Policies), "endpoints", len(in.Endpoints),
		"local", len(done), "chains", len(rs.Chains), "sets", len(rs.Sets), "problems", len(rs.Problems),
		"compile", compiled.Sub(start).Round(time.Microsecond).String(), "total", time.Since(start).Round(time.Microsecond).String())
	return nil
}

// localEndpoints is the local pods of an input, each marked programmed
// when programmed lists it.
func localEndpoints(in *policy.Input, programmed []string) map[string]endpointState {
	prog := make(map[string]bool, len(programmed))
	for _, k := range programmed {
		prog[k] = true
	}
	out := map[string]endpointState{}
	for _, e := range in.Endpoints {
		if e.HostIface == "" {
			continue
		}
		k := e.Pod.Namespace + "/" + e.Pod.Name
		out[k] = endpointState{uid: string(e.Pod.UID), ips: e.IPs, programmed: prog[k]}
	}
	return out
}

// compile runs the compiler; a panic is a failed sync (the rules in the
// kernel stay as they are), not a dead tabbyd.
func (c *Controller) compile(in *policy.Input) (rs *policy.Ruleset, err error) {
	defer func() {
		if r := recover(); r != nil {
			c.log.Error("the NetworkPolicy compiler panicked", "panic", r, "stack", string(debug.Stack()))
			rs, err = nil, fmt.Errorf("the NetworkPolicy compiler panicked: %v (a bug: please report it with the policies of the cluster)", r)
		}
	}()
	rs = c.cfg.Compile(in)
	if rs == nil {
		return nil, errors.New("the NetworkPolicy compiler returned no ruleset")
	}
	return rs, nil
}

// report logs the problems whose message changed and reports them as
// Warning Events on their objects (a NetworkPolicy, or a Pod the compiler
// could not program); objects no longer in trouble are forgotten (and
// reported again should they be in trouble again).
func (c *Controller) report(problems []policy.Problem) {
	now := map[string][]string{} // "Kind namespace/name" -> messages
	for _, p := range problems {
		kind := p.Kind
		if kind == "" {
			kind = policy.KindNetworkPolicy
		}
		k := kind + " " + p.Namespace + "/" + p.Name
		if !slices.Contains(now[k], p.Message) {
			now[k] = append(now[k], p.Message)
		}
	}
	for k, msgs := range now {
		msg := strings.Join(msgs, "; ")
		if c.reported[k] == msg {
			continue
		}
		c.reported[k] = msg
		kind, key, _ := strings.Cut(k, " ")
		var obj runtime.Object
		var text string
		switch kind {
		case policy.KindPod:
			c.log.Warn("a pod's NetworkPolicy cannot be programmed", "pod", key, "problem", msg)
			if o, ok, _ := c.pods.GetStore().GetByKey(key); ok {
				obj = o.(*corev1.Pod)
			}
			text = fmt.Sprintf("tabbyd on node %s cannot program the NetworkPolicy of this pod: %s", c.cfg.Node, msg)
		case policy.KindClusterNetworkPolicy:
			name := strings.TrimPrefix(key, "/")
			c.log.Warn("a ClusterNetworkPolicy is not enforced as written; the others are", "policy", name, "problem", msg)
			if c.cnps != nil {
				if o, ok, _ := c.cnps.GetStore().GetByKey(name); ok {
					obj = o.(*unstructured.Unstructured)
				}
			}
			text = fmt.Sprintf("tabbyd on node %s: %s (the other policies are enforced)", c.cfg.Node, msg)
		default:
			c.log.Warn("a NetworkPolicy is not enforced as written; the others are", "policy", key, "problem", msg)
			if o, ok, _ := c.policies.GetStore().GetByKey(key); ok {
				obj = o.(*networkingv1.NetworkPolicy)
			}
			text = fmt.Sprintf("tabbyd on node %s: %s (the other policies are enforced)", c.cfg.Node, msg)
		}
		if c.cfg.Recorder != nil && obj != nil {
			c.cfg.Recorder.Event(obj, corev1.EventTypeWarning, ReasonNotEnforced, text)
		}
	}
	for k := range c.reported {
		if _, ok := now[k]; !ok {
			c.log.Info("a problem reported before is gone", "object", k)
			delete(c.reported, k)
		}
	}
}

// Ready is nil once a sync has programmed the kernel and the last sync
// succeeded; else it says why not.
func (c *Controller) Ready() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case !c.synced:
		return errors.New("the NetworkPolicy caches have not synced with the API server yet")
	case c.lastErr != nil:
		return fmt.Errorf("the last NetworkPolicy sync failed: %w", c.lastErr)
	case c.applied.gen == 0:
		return errors.New("NetworkPolicy has not been programmed yet")
	}
	return nil
}

// WaitProgrammed returns once a sync whose input held the local pod
// namespace/name (with UID uid, when not "") with every address of ips,
// and whose ruleset lists the pod as programmed, is in the kernel. It
// returns the number of that sync, or, when ctx ends first, an error that
// says what is missing. (cniagent.PolicyWaiter)
func (c *Controller) WaitProgrammed(ctx context.Context, namespace, name, uid string, ips []netip.Addr) (uint64, error) {
	key := namespace + "/" + name
	start := time.Now()
	for {
		c.mu.Lock()
		e, ok := c.applied.endpoints[key]
		gen := c.applied.gen
		changed := c.changed
		c.mu.Unlock()
		if ok && e.covers(uid, ips) && e.programmed {
			return gen, nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return 0, fmt.Errorf("tabbyd on node %s has not programmed the NetworkPolicy of pod %s (%s) within %s: %s",
				c.cfg.Node, key, addrList(ips), time.Since(start).Round(time.Millisecond), c.missing(key, uid, ips))
		}
	}
}

// covers says whether the endpoint is the pod uid with every address of ips.
func (e endpointState) covers(uid string, ips []netip.Addr) bool {
	if uid != "" && e.uid != uid {
		return false
	}
	for _, ip := range ips {
		if !slices.Contains(e.ips, ip) {
			return false
		}
	}
	return true
}

// missing says why a pod is not programmed yet.
func (c *Controller) missing(key, uid string, ips []netip.Addr) string {
	c.mu.Lock()
	synced, lastErr, known := c.synced, c.lastErr, c.known
	kn, seen := c.known[key]
	ap, inApplied := c.applied.endpoints[key]
	c.mu.Unlock()
	switch {
	case !synced:
		return "its NetworkPolicy caches have not synced with the API server yet"
	case lastErr != nil:
		return "its last sync failed: " + lastErr.Error()
	case known == nil:
		return "it has not finished its first sync yet"
	}
	if !seen {
		if o, ok, _ := c.pods.GetStore().GetByKey(key); ok {
			p := o.(*corev1.Pod)
			switch {
			case p.Spec.NodeName != c.cfg.Node:
				return fmt.Sprintf("the pod is bound to node %q, not to this one (does the plugin's agentSocket name this node's tabbyd?)", p.Spec.NodeName)
			case p.Spec.HostNetwork:
				return "the pod uses the host's network"
			}
			return "no address of the pod has reached it yet (neither its IPAMBlock allocation nor its status.podIPs)"
		}
		return "it has not seen the pod yet (its watch of Pods lags behind, or the pod was deleted)"
	}
	if uid != "" && kn.uid != uid {
		return fmt.Sprintf("it knows the pod with UID %s, not %s (a newer pod of the same name has not reached it yet)", kn.uid, uid)
	}
	if !kn.covers("", ips) {
		return fmt.Sprintf("it knows the pod's addresses as %s (the IPAMBlock allocation of %s has not reached it yet)", addrList(kn.ips), addrList(ips))
	}
	if inApplied && ap.covers(uid, ips) && !ap.programmed {
		return "the compiler did not list the pod as programmed"
	}
	return "the sync that holds it has not finished yet"
}

func addrList(ips []netip.Addr) string {
	s := make([]string, len(ips))
	for i, ip := range ips {
		s[i] = ip.String()
	}
	return strings.Join(s, ", ")
}
