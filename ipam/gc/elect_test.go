package gc_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	tabbyv1 "github.com/tabbynet/tabby/api/v1"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/internal/controlplane"
	"github.com/tabbynet/tabby/internal/controlplane/clustertest"
	"github.com/tabbynet/tabby/ipam"
	"github.com/tabbynet/tabby/ipam/gc"
)

// candidate is one collector taking part in the election.
type candidate struct {
	id     string
	g      *gc.GC
	reg    *prometheus.Registry
	cancel context.CancelFunc
	stop   func() error // cancels and waits for RunElected to return
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(90 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestLeaderElection: of two collectors one leads and runs passes (it
// releases a leaked address), the other runs none; a Lease left by a
// crashed holder is taken over once it expires; when the leader stops it
// hands the Lease over and the other takes over the work.
func TestLeaderElection(t *testing.T) {
	ds := client(t)
	fresh(t, ds)
	mkPool(t, ds, "elect", "10.67.0.0/24", 28)
	mkNode(t, ds, "n1")
	m := ipam.New(ds)
	leaked1 := assign(t, m, "net.gone-1", "n1", "gone-1", "") // a pod that never was

	leases, err := coordinationv1client.NewForConfig(clustertest.Config(t))
	if err != nil {
		t.Fatal(err)
	}
	const lease = "tabby-ipam-gc-test"
	ctx := context.Background()
	t.Cleanup(func() { _ = leases.Leases(ns).Delete(ctx, lease, metav1.DeleteOptions{}) })
	// A holder that crashed moments ago, without releasing its Lease.
	now := metav1.NewMicroTime(time.Now())
	if _, err := leases.Leases(ns).Create(ctx, &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: lease, Namespace: ns},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("crashed"), LeaseDurationSeconds: ptr.To(int32(3)),
			AcquireTime: &now, RenewTime: &now},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	start := func(id string) *candidate {
		reg := prometheus.NewRegistry()
		g, err := gc.New(gc.Config{DS: ds, Grace: time.Millisecond, Interval: 20 * time.Millisecond, Log: logger(t).With("gc", id), Registerer: reg})
		if err != nil {
			t.Fatal(err)
		}
		c, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() {
			done <- g.RunElected(c, gc.Election{Leases: leases.Leases(ns), Namespace: ns, Name: lease, Identity: id,
				LeaseDuration: 3 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: 100 * time.Millisecond})
		}()
		var once sync.Once
		var result error
		stop := func() error {
			once.Do(func() { cancel(); result = <-done })
			return result
		}
		t.Cleanup(func() { _ = stop() })
		return &candidate{id: id, g: g, reg: reg, cancel: cancel, stop: stop}
	}
	a, b := start("gc-a"), start("gc-b")
	both := func() {
		if a.g.Leading() && b.g.Leading() {
			t.Fatal("both collectors lead at once")
		}
	}
	holder := func() string {
		l, err := leases.Leases(ns).Get(ctx, lease, metav1.GetOptions{})
		if err != nil || l.Spec.HolderIdentity == nil {
			return ""
		}
		return *l.Spec.HolderIdentity
	}

	var leader, follower *candidate
	waitFor(t, "a collector to take over the expired Lease and run passes", func() bool {
		both()
		switch {
		case a.g.Leading() && a.g.Passes() >= 3:
			leader, follower = a, b
		case b.g.Leading() && b.g.Passes() >= 3:
			leader, follower = b, a
		}
		return leader != nil
	})
	if h := holder(); h != leader.id {
		t.Errorf("the Lease is held by %q, want the leader %s", h, leader.id)
	}
	waitFor(t, "the leader to release the leaked address", func() bool { both(); return free(t, ds, leaked1)() })
	if follower.g.Passes() != 0 || follower.g.Leading() {
		t.Fatalf("the follower ran %d passes (leading %v)", follower.g.Passes(), follower.g.Leading())
	}
	if metric(t, leader.reg, "tabby_ipam_gc_leader", "") != 1 || metric(t, follower.reg, "tabby_ipam_gc_leader", "") != 0 {
		t.Errorf("tabby_ipam_gc_leader: leader %v, follower %v", metric(t, leader.reg, "tabby_ipam_gc_leader", ""), metric(t, follower.reg, "tabby_ipam_gc_leader", ""))
	}
	if metric(t, leader.reg, "tabby_ipam_gc_releases_total", "pod-gone") != 1 {
		t.Errorf("the leader's releases{pod-gone} = %v, want 1", metric(t, leader.reg, "tabby_ipam_gc_releases_total", "pod-gone"))
	}

	// The leader stops: its passes end, it hands the Lease over.
	if err := leader.stop(); err != nil {
		t.Fatalf("RunElected: %v", err)
	}
	if leader.g.Leading() {
		t.Fatal("the stopped collector still says it leads")
	}
	stoppedAt := leader.g.Passes()
	leaked2 := assign(t, m, "net.gone-2", "n1", "gone-2", "")
	waitFor(t, "the other collector to take over and release the next leaked address", func() bool {
		return follower.g.Leading() && free(t, ds, leaked2)()
	})
	if h := holder(); h != follower.id {
		t.Errorf("the Lease is held by %q, want %s", h, follower.id)
	}
	if leader.g.Passes() != stoppedAt {
		t.Errorf("the stopped collector ran %d more passes", leader.g.Passes()-stoppedAt)
	}
	for _, ip := range []net.IP{leaked1, leaked2} {
		if !free(t, ds, ip)() {
			t.Errorf("%s is still held", ip)
		}
	}
}

// recorder keeps the warnings and errors a collector logs.
type recorder struct {
	mu   sync.Mutex
	msgs []string
}

func (r *recorder) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (r *recorder) Handle(_ context.Context, rec slog.Record) error {
	var b strings.Builder
	b.WriteString(rec.Message)
	rec.Attrs(func(a slog.Attr) bool { fmt.Fprintf(&b, " %s=%v", a.Key, a.Value); return true })
	r.mu.Lock()
	r.msgs = append(r.msgs, b.String())
	r.mu.Unlock()
	return nil
}
func (r *recorder) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *recorder) WithGroup(string) slog.Handler      { return r }

// TestRunsWithTabbydRBAC: the elected collector does all its work (the
// Lease in tabby-system, pods and nodes read, addresses released, blocks,
// affinities and handles deleted) as tabbyd's service account, with the
// RBAC of deploy/base, and nothing it tries is forbidden.
func TestRunsWithTabbydRBAC(t *testing.T) {
	admin := client(t)
	fresh(t, admin)
	ctx := context.Background()
	if err := controlplane.ApplyManifests(ctx, clustertest.Config(t), "../../deploy/base/namespace.yaml", "../../deploy/base/rbac.yaml"); err != nil {
		t.Fatalf("applying tabby's namespace and RBAC: %v", err)
	}
	const tabbyNS = "tabby-system"
	cfg := rest.CopyConfig(clustertest.Config(t))
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + tabbyNS + ":tabby-node",
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + tabbyNS, "system:authenticated"}}
	asNode, err := datastore.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := asNode.Nodes.Delete(ctx, "nobody", metav1.DeleteOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("deleting a node as tabby-node: %v; want Forbidden (is the impersonation in effect?)", err)
	}
	leases, err := coordinationv1client.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	adminLeases, err := coordinationv1client.NewForConfig(clustertest.Config(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = adminLeases.Leases(tabbyNS).Delete(ctx, gc.DefaultLeaseName, metav1.DeleteOptions{}) })

	mkPool(t, admin, "rbac", "10.68.0.0/24", 29)
	mkNode(t, admin, "n1")
	mkNode(t, admin, "n2")
	m := ipam.New(admin)
	tun := assign(t, m, "vxlan-tunnel-addr-n1", "n1", "", tabbyv1.UseTunnel)
	leaked := assign(t, m, "net.gone", "n2", "gone", "")
	if _, err := admin.IPAMHandles.Create(ctx, &tabbyv1.IPAMHandle{ObjectMeta: metav1.ObjectMeta{Name: "net.nothing"},
		Spec: tabbyv1.IPAMHandleSpec{HandleID: "net.nothing"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	deleteNode(t, admin, "n1")

	rec := &recorder{}
	g, err := gc.New(gc.Config{DS: asNode, Grace: time.Millisecond, Interval: 20 * time.Millisecond, Log: slog.New(rec)})
	if err != nil {
		t.Fatal(err)
	}
	c, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- g.RunElected(c, gc.Election{Leases: leases.Leases(tabbyNS), Namespace: tabbyNS, Identity: "n2",
			LeaseDuration: 3 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: 100 * time.Millisecond})
	}()
	defer func() { cancel(); <-done }()
	waitFor(t, "the collector, as tabby-node, to free n1's block, the leaked address and the empty handle", func() bool {
		_, herr := admin.IPAMHandles.Get(ctx, "net.nothing", metav1.GetOptions{})
		return free(t, admin, tun)() && free(t, admin, leaked)() && len(nodeBlocks(t, admin, "n1")) == 0 &&
			len(nodeAffinities(t, admin, "n1")) == 0 && apierrors.IsNotFound(herr)
	})
	l, err := adminLeases.Leases(tabbyNS).Get(ctx, gc.DefaultLeaseName, metav1.GetOptions{})
	if err != nil || l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity != "n2" {
		t.Errorf("the Lease %s/%s: %+v, %v", tabbyNS, gc.DefaultLeaseName, l, err)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	for _, msg := range rec.msgs {
		t.Errorf("the collector warned: %s", msg)
	}
}

// record is one line a logger was given.
type record struct {
	level slog.Level
	msg   string
}

// allRecorder keeps every line a logger is given, at every level, with
// the logger's attributes.
type allRecorder struct {
	mu    *sync.Mutex
	recs  *[]record
	attrs []slog.Attr
}

func newAllRecorder() *allRecorder { return &allRecorder{mu: &sync.Mutex{}, recs: &[]record{}} }

func (r *allRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (r *allRecorder) Handle(_ context.Context, rec slog.Record) error {
	var b strings.Builder
	b.WriteString(rec.Message)
	for _, a := range r.attrs {
		fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
	}
	rec.Attrs(func(a slog.Attr) bool { fmt.Fprintf(&b, " %s=%v", a.Key, a.Value); return true })
	r.mu.Lock()
	*r.recs = append(*r.recs, record{rec.Level, b.String()})
	r.mu.Unlock()
	return nil
}
func (r *allRecorder) WithAttrs(as []slog.Attr) slog.Handler {
	c := *r
	c.attrs = append(slices.Clip(r.attrs), as...)
	return &c
}
func (r *allRecorder) WithGroup(string) slog.Handler { return r }

func (r *allRecorder) lines() []record {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(*r.recs)
}

// klogSink records what reaches klog's global logger (client-go logs
// there when a context carries no logger).
type klogSink struct{ r *allRecorder }

func (s klogSink) Init(klog.RuntimeInfo) {}
func (s klogSink) Enabled(int) bool      { return true }
func (s klogSink) Info(_ int, msg string, kv ...any) {
	s.r.Handle(context.Background(), slog.NewRecord(time.Now(), slog.LevelInfo, fmt.Sprint(msg, kv), 0))
}
func (s klogSink) Error(err error, msg string, kv ...any) {
	s.r.Handle(context.Background(), slog.NewRecord(time.Now(), slog.LevelError, fmt.Sprint(msg, kv, err), 0))
}
func (s klogSink) WithValues(...any) klog.LogSink { return s }
func (s klogSink) WithName(string) klog.LogSink   { return s }

// racingLease holds the answer to a candidate's first read of the Lease
// until the other candidate has read it too: both find no Lease, both
// create it, and one of them is told it already exists.
type racingLease struct {
	coordinationv1client.LeaseInterface
	first *sync.Once
	both  *sync.WaitGroup
}

func (l racingLease) Get(ctx context.Context, name string, opts metav1.GetOptions) (*coordinationv1.Lease, error) {
	lease, err := l.LeaseInterface.Get(ctx, name, opts)
	l.first.Do(func() {
		l.both.Done()
		l.both.Wait()
	})
	return lease, err
}

// TestLoserLogsNoError: two candidates that find no Lease both create it;
// the one that loses that race (and every later round) logs no error and
// no warning, and nothing is written to klog's global logger (where
// client-go logs without one): the election logs into the collector's
// log, the lost race at debug level.
func TestLoserLogsNoError(t *testing.T) {
	ds := client(t)
	fresh(t, ds)
	leases, err := coordinationv1client.NewForConfig(clustertest.Config(t))
	if err != nil {
		t.Fatal(err)
	}
	const lease = "tabby-ipam-gc-race"
	ctx := context.Background()
	_ = leases.Leases(ns).Delete(ctx, lease, metav1.DeleteOptions{})
	t.Cleanup(func() { _ = leases.Leases(ns).Delete(ctx, lease, metav1.DeleteOptions{}) })

	global := newAllRecorder()
	klog.SetLogger(klog.New(klogSink{global}))
	t.Cleanup(klog.ClearLogger)

	var both sync.WaitGroup
	both.Add(2)
	type contender struct {
		id   string
		g    *gc.GC
		logs *allRecorder
		stop func()
	}
	start := func(id string) *contender {
		logs := newAllRecorder()
		g, err := gc.New(gc.Config{DS: ds, Grace: time.Hour, Interval: time.Hour, Log: slog.New(logs), Registerer: prometheus.NewRegistry()})
		if err != nil {
			t.Fatal(err)
		}
		c, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() {
			done <- g.RunElected(c, gc.Election{Leases: racingLease{LeaseInterface: leases.Leases(ns), first: &sync.Once{}, both: &both},
				Namespace: ns, Name: lease, Identity: id,
				LeaseDuration: 3 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: 100 * time.Millisecond})
		}()
		var once sync.Once
		stop := func() {
			once.Do(func() {
				cancel()
				if err := <-done; err != nil {
					t.Errorf("RunElected %s: %v", id, err)
				}
			})
		}
		t.Cleanup(stop)
		return &contender{id: id, g: g, logs: logs, stop: stop}
	}
	a, b := start("race-a"), start("race-b")
	var leader, loser *contender
	waitFor(t, "one contender to lead", func() bool {
		switch {
		case a.g.Leading():
			leader, loser = a, b
		case b.g.Leading():
			leader, loser = b, a
		}
		return leader != nil
	})
	// The loser keeps trying for a while: every round finds the Lease held.
	time.Sleep(time.Second)
	if loser.g.Leading() {
		t.Fatal("both contenders lead")
	}
	leader.stop()
	loser.stop()

	lostRace := false
	for _, c := range []*contender{leader, loser} {
		for _, r := range c.logs.lines() {
			if r.level >= slog.LevelWarn {
				t.Errorf("%s logged at %s: %s", c.id, r.level, r.msg)
			}
			if c == loser && r.level == slog.LevelDebug && strings.Contains(r.msg, "lost the race to create") &&
				strings.Contains(r.msg, "already exists") && strings.Contains(r.msg, "component=leaderelection") {
				lostRace = true
			}
		}
	}
	if !lostRace {
		t.Errorf("the loser did not lose a race to create the Lease (or did not log it at debug level):\n%v", loser.logs.lines())
	}
	for _, r := range global.lines() {
		t.Errorf("client-go logged through klog's global logger: %s %s", r.level, r.msg)
	}
	if !slices.ContainsFunc(leader.logs.lines(), func(r record) bool {
		return r.level == slog.LevelInfo && strings.Contains(r.msg, "acquired the IPAM garbage collector's Lease") &&
			strings.Contains(r.msg, "component=leaderelection")
	}) {
		t.Errorf("the leader's log lacks the election's info line:\n%v", leader.logs.lines())
	}
}
