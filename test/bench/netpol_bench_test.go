package bench

// NetworkPolicy at scale (issue 4, section 4), against the real kernel in
// network namespaces the benchmarks make and remove:
//
//   - BenchmarkNetpolFullSync: a full sync of 1,000 NetworkPolicies over
//     5,000 pods (newNPWorld) into a fresh node namespace, compile and apply
//     timed apart, for a node with 100 of the pods and for one with all of
//     them, with both iptables backends; the size of what was programmed.
//   - BenchmarkNetpolRuleCount: rules, chains, sets and members against the
//     number of policies (10, 100, 1,000) and pods (500, 5,000).
//   - BenchmarkNetpolLabelFlip: tabbyd's NetworkPolicy controller
//     (daemon/netpol) against the real API server holding the 1,000
//     policies and 5,000 pods; a pod's label flips (Update) and the time
//     until the kernel of the node's namespace has the new set membership.
//   - BenchmarkNetpolThroughput: iperf3 between two pods of one node
//     through the node's FORWARD path, without tabby's rules and with the
//     1,000-policy ruleset applied (both pods selected by policies that
//     allow the traffic), and the ratio.
//
// `make bench` runs them; see the Makefile for the -benchtime of each.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/tabbynet/tabby/daemon/netpol"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/internal/benchstat"
	"github.com/tabbynet/tabby/internal/controlplane/clustertest"
	"github.com/tabbynet/tabby/internal/iptbackend"
	"github.com/tabbynet/tabby/internal/netnstest"
	"github.com/tabbynet/tabby/internal/testnet"
	"github.com/tabbynet/tabby/internal/tier"
	"github.com/tabbynet/tabby/plugin"
	"github.com/tabbynet/tabby/policy"
	"github.com/tabbynet/tabby/policy/apply"
)

// TestNPWorld: the benchmarks' cluster compiles without a problem, every
// local pod is programmed, and ten times the pods (the node's 100 pods
// the same) under the same policies change set members only: not a rule,
// chain or set. (Pure: it runs in make test.)
func TestNPWorld(t *testing.T) {
	small, big := newNPWorld(500, 1000, 100), newNPWorld(5000, 1000, 100)
	rsSmall, rsBig := policy.Compile(small.input()), policy.Compile(big.input())
	for _, rs := range []*policy.Ruleset{rsSmall, rsBig} {
		if len(rs.Problems) > 0 {
			t.Fatalf("the compiler refused %d policies, the first: %+v", len(rs.Problems), rs.Problems[0])
		}
		if got := len(rs.Programmed); got != 100 {
			t.Errorf("%d local pods programmed, want 100", got)
		}
	}
	s, b := rulesetSize(rsSmall), rulesetSize(rsBig)
	t.Logf("1,000 policies, 100 local pods; 500 pods: %+v; 5,000 pods: %+v", s, b)
	if !reflect.DeepEqual(rsSmall.Chains, rsBig.Chains) || s.sets != b.sets || b.members <= s.members {
		t.Errorf("10x the pods, the same local pods: %+v -> %+v; want the same chains and sets, more members", s, b)
	}
	// The iperf3 pods of BenchmarkNetpolThroughput are selected by
	// policies of both directions.
	w := newNPWorld(5000, 1000, 100)
	server, client := iperfPods(w)
	rs := policy.Compile(w.input())
	for _, p := range []*corev1.Pod{server, client} {
		if !slices.Contains(rs.Programmed, p.Namespace+"/"+p.Name) {
			t.Errorf("%s/%s is not programmed", p.Namespace, p.Name)
		}
		ms, err := membersOf(rs, netip.MustParseAddr(p.Status.PodIP))
		if err != nil {
			t.Fatal(err)
		}
		var in, out bool
		for _, m := range ms {
			in = in || strings.HasPrefix(m.set, policy.SetPrefix+"i4-")
			out = out || strings.HasPrefix(m.set, policy.SetPrefix+"e4-")
		}
		if !in || !out {
			t.Errorf("%s: in an ingress dispatch set %v, in an egress one %v; want both (members %v)", p.Name, in, out, slices.Collect(maps.Keys(ms)))
		}
	}
}

// TestNPWorldPredicted: after a full sync of the benchmarks' biggest
// cluster (1,000 policies and 100 ClusterNetworkPolicies over 5,000 local
// pods) into a fresh node namespace, with each backend, a kernel read
// finds every chain printed as the applier predicted: nothing to rewrite.
// With the nft backend the applier read back a few chains of the 2,908 it
// wrote, and predicted the printing of the others from theirs.
func TestNPWorldPredicted(t *testing.T) {
	tier.Root(t, "the test makes a network namespace, iptables rules and ipsets", "ipset", "iptables-restore")
	rs := policy.Compile(newNPWorld(5000, 1000, 5000).withCNPs(100).input())
	if len(rs.Problems) > 0 {
		t.Fatalf("the compiler refused %d policies, the first: %+v", len(rs.Problems), rs.Problems[0])
	}
	for _, be := range npBackends(t) {
		t.Run(string(be.Mode), func(t *testing.T) {
			netns := netnstest.New(t, "np-predict")
			a := newApplier(t, netns, &be)
			st, err := applyIn(netns, a, rs)
			if err != nil {
				t.Fatal(err)
			}
			if be.Mode == iptbackend.NFT && st.ChainsReadBack > 64 {
				t.Errorf("the full sync read back %d chains of %d written; want the few that teach the rest's printing", st.ChainsReadBack, st.ChainsWritten)
			}
			if _, err := checkKernel(netns, be, rs); err != nil {
				t.Fatal(err)
			}
			a.Invalidate()
			again, err := applyIn(netns, a, rs)
			if err != nil {
				t.Fatal(err)
			}
			if !again.KernelRead || again.Changed() != 0 {
				t.Errorf("a kernel read after the full sync: %+v; want nothing changed (every chain printed as predicted)", again)
			}
			t.Logf("full sync: %d chains written, %d read back", st.ChainsWritten, st.ChainsReadBack)
		})
	}
}

// needPolicyTools skips, loudly, when the kernel tools the benchmarks
// drive are missing.
func needPolicyTools(b *testing.B, extra ...string) {
	b.Helper()
	tier.Root(b, "the NetworkPolicy benchmarks make network namespaces, iptables rules and ipsets",
		append([]string{"ipset", "iptables-restore"}, extra...)...)
}

var quiet = slog.New(slog.DiscardHandler)

// newApplier is an applier for netns (be nil: the backend detected there,
// as tabbyd does).
func newApplier(b testing.TB, netns ns.NetNS, be *iptbackend.Backend) *apply.Applier {
	b.Helper()
	var a *apply.Applier
	err := netnstest.Thread(netns, func() (err error) {
		a, err = apply.New(apply.Options{Backend: be, Logger: quiet})
		return err
	})
	if err != nil {
		b.Fatal(err)
	}
	return a
}

func applyIn(netns ns.NetNS, a *apply.Applier, rs *policy.Ruleset) (st apply.Stats, err error) {
	err = netnstest.Thread(netns, func() (err error) {
		st, err = a.Apply(context.Background(), rs)
		return err
	})
	return st, err
}

// checkKernel compares what the kernel of netns holds with rs.
func checkKernel(netns ns.NetNS, be iptbackend.Backend, rs *policy.Ruleset) (npSize, error) {
	var got npSize
	err := netnstest.Thread(netns, func() (err error) {
		got, err = kernelSize(context.Background(), be.IPTablesSave, be.IP6TablesSave)
		return err
	})
	if err != nil {
		return got, err
	}
	if want := rulesetSize(rs); got != want {
		return got, fmt.Errorf("the kernel holds %+v, the ruleset %+v", got, want)
	}
	return got, nil
}

// npBackends are the iptables backends installed.
func npBackends(b testing.TB) []iptbackend.Backend {
	var out []iptbackend.Backend
	for _, m := range []iptbackend.Mode{iptbackend.NFT, iptbackend.Legacy} {
		be, err := iptbackend.Paths(m)
		if err != nil {
			b.Logf("the %s iptables backend is not installed: not measured (%v)", m, err)
			continue
		}
		out = append(out, be)
	}
	if len(out) == 0 {
		b.Skip("SKIPPING: no iptables backend installed (make deps)")
	}
	return out
}

func msOf(d time.Duration, n int) float64 {
	return float64(d) / float64(time.Millisecond) / float64(max(n, 1))
}

// BenchmarkNetpolFullSync: 1,000 policies over 5,000 pods, alone and with
// 100 ClusterNetworkPolicies (npCNP, both tiers), for a node with 100 of
// the pods and for one with all of them, from nothing to all of it in
// the kernel of a fresh node namespace: policy.Compile of the
// node's input, then Apply (ipsets, iptables-restore, jumps). The timer
// covers both; compile-ms, apply-ms and total-ms are their means, the
// applier's phases are ipset-ms, chains-ms (iptables-restore and reading
// back, beyond the members added while the restore reads its rules, which
// count in ipset-ms) and read-ms (reading the empty kernel first). Making and removing
// the namespace is not timed. The first iteration checks that the kernel
// holds exactly the ruleset's rules, chains, sets and members.
func BenchmarkNetpolFullSync(b *testing.B) {
	needPolicyTools(b)
	for _, c := range []struct {
		name        string
		local, cnps int
	}{
		{"5000pods-1000policies-100local", 100, 0}, {"5000pods-1000policies-5000local", 5000, 0},
		{"5000pods-1000policies-100cnps-100local", 100, 100}, {"5000pods-1000policies-100cnps-5000local", 5000, 100},
	} {
		w := newNPWorld(5000, 1000, c.local).withCNPs(c.cnps)
		in := w.input()
		for _, be := range npBackends(b) {
			b.Run(c.name+"/"+string(be.Mode), func(b *testing.B) {
				var compileT, applyT, setsT, chainsT, readT time.Duration
				var rs *policy.Ruleset
				var st apply.Stats
				n := 0
				for b.Loop() {
					b.StopTimer()
					netns := netnstest.New(b, "np-apply")
					a := newApplier(b, netns, &be)
					b.StartTimer()
					t0 := time.Now()
					rs = policy.Compile(in)
					t1 := time.Now()
					var err error
					st, err = applyIn(netns, a, rs)
					t2 := time.Now()
					b.StopTimer()
					if err != nil {
						b.Fatal(err)
					}
					if len(rs.Problems) > 0 {
						b.Fatalf("the compiler refused %d policies, the first: %+v", len(rs.Problems), rs.Problems[0])
					}
					if n == 0 {
						if _, err := checkKernel(netns, be, rs); err != nil {
							b.Fatal(err)
						}
					}
					n++
					compileT += t1.Sub(t0)
					applyT += t2.Sub(t1)
					setsT += st.SetsTime
					chainsT += st.ChainsTime
					readT += st.ReadTime
					netns.Remove()
					b.StartTimer()
				}
				size := rulesetSize(rs)
				b.ReportMetric(msOf(compileT, n), "compile-ms")
				b.ReportMetric(msOf(applyT, n), "apply-ms")
				b.ReportMetric(msOf(compileT+applyT, n), "total-ms")
				b.ReportMetric(msOf(setsT, n), "ipset-ms")
				b.ReportMetric(msOf(chainsT, n), "chains-ms")
				b.ReportMetric(msOf(readT, n), "read-ms")
				b.ReportMetric(float64(st.ChainsReadBack), "read-back")
				b.ReportMetric(float64(size.rules), "rules")
				b.ReportMetric(float64(size.chains), "chains")
				b.ReportMetric(float64(size.sets), "sets")
				b.ReportMetric(float64(size.members), "members")
				b.ReportMetric(float64(len(rs.Programmed)), "local-pods")
				b.ReportMetric(float64(st.Restores), "restores")
			})
		}
	}
}

// BenchmarkNetpolRuleCount: the size of a node's ruleset against the
// number of policies (10, 100, 1,000) and pods (500, 5,000), for a node
// with 100 of the pods (the same 100 whatever the number of pods) and for
// a node with all of them, each compiled and applied into a fresh
// namespace and counted in the kernel (iptables-save, ip6tables-save,
// ipset save; both families). At the end a table: rules follow the
// policies (and, on the node, the distinct combinations of policies its
// pods have), members the pods.
func BenchmarkNetpolRuleCount(b *testing.B) {
	needPolicyTools(b)
	type row struct {
		policies, pods, local int
		size                  npSize
	}
	var rows []row
	for _, allLocal := range []bool{false, true} {
		for _, pods := range []int{500, 5000} {
			for _, policies := range []int{10, 100, 1000} {
				local, name := 100, "100"
				if allLocal {
					local, name = pods, "all"
				}
				b.Run(fmt.Sprintf("policies=%d/pods=%d/local=%s", policies, pods, name), func(b *testing.B) {
					in := newNPWorld(pods, policies, local).input()
					var size npSize
					var rs *policy.Ruleset
					for b.Loop() {
						b.StopTimer()
						netns := netnstest.New(b, "np-apply")
						a := newApplier(b, netns, nil)
						b.StartTimer()
						rs = policy.Compile(in)
						if _, err := applyIn(netns, a, rs); err != nil {
							b.Fatal(err)
						}
						b.StopTimer()
						var err error
						if size, err = checkKernel(netns, a.Backend(), rs); err != nil {
							b.Fatal(err)
						}
						netns.Remove()
						b.StartTimer()
					}
					b.ReportMetric(float64(size.rules), "rules")
					b.ReportMetric(float64(size.chains), "chains")
					b.ReportMetric(float64(size.sets), "sets")
					b.ReportMetric(float64(size.members), "members")
					b.ReportMetric(float64(len(rs.Programmed)), "local-pods")
					rows = append(rows, row{policies, pods, len(rs.Programmed), size})
				})
			}
		}
	}
	if len(rows) == 0 {
		return
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(os.Stdout, "\nNetworkPolicy ruleset in the kernel of a node (both families): the node's 100 pods are the same pods in every 100-local row")
	fmt.Fprintln(w, "policies\tpods\tlocal pods\trules\tchains\tsets\tset members\t")
	for _, r := range rows {
		fmt.Fprintf(w, "%d\t%d\t%d\t%d\t%d\t%d\t%d\t\n", r.policies, r.pods, r.local, r.size.rules, r.size.chains, r.size.sets, r.size.members)
	}
	_ = w.Flush()
}

// loadNPWorld creates w in the API server (namespaces with their default
// ServiceAccount, policies, pods whose status then gets their addresses)
// and removes it when the benchmark ends.
func loadNPWorld(b *testing.B, w *npWorld) {
	b.Helper()
	ctx := context.Background()
	cfg := rest.CopyConfig(clustertest.Config(b))
	cfg.QPS, cfg.Burst = 5000, 5000
	ds, err := datastore.New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		zero := int64(0)
		for _, n := range w.Namespaces {
			pc, err := netpol.NewPolicyClient(cfg, n.Name)
			if err == nil {
				err = pc.DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
			}
			if err == nil {
				err = ds.Pods(n.Name).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{})
			}
			if err == nil {
				// Without a namespace controller the namespace stays
				// Terminating, empty, until the control plane stops.
				err = ds.Namespaces.Delete(ctx, n.Name, metav1.DeleteOptions{})
			}
			if err != nil {
				b.Errorf("removing namespace %s: %v", n.Name, err)
			}
		}
	})
	for _, n := range w.Namespaces {
		if _, err := ds.Namespaces.Create(ctx, n, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
		// No controller-manager makes the default ServiceAccount pods need.
		sa := datastore.NewResource[*corev1.ServiceAccount, *corev1.ServiceAccountList]("serviceaccounts", ds.CoreREST(), datastore.ParameterCodec, n.Name,
			func() *corev1.ServiceAccount { return &corev1.ServiceAccount{} }, func() *corev1.ServiceAccountList { return &corev1.ServiceAccountList{} })
		if _, err := sa.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	pcs := map[string]*netpol.PolicyClient{}
	for _, n := range w.Namespaces {
		if pcs[n.Name], err = netpol.NewPolicyClient(cfg, n.Name); err != nil {
			b.Fatal(err)
		}
	}
	err = workers(32, len(w.Policies), func(i int) error {
		p := w.Policies[i]
		_, err := pcs[p.Namespace].Create(ctx, p, metav1.CreateOptions{})
		return err
	})
	if err != nil {
		b.Fatalf("creating the policies: %v", err)
	}
	err = workers(32, len(w.Pods), func(i int) error {
		p := w.Pods[i]
		got, err := ds.Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			return err
		}
		got.Status = p.Status
		_, err = ds.Pods(p.Namespace).UpdateStatus(ctx, got, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		b.Fatalf("creating the pods: %v", err)
	}
}

// workers runs f(0..count-1) on n goroutines; the first error stops it.
func workers(n, count int, f func(i int) error) error {
	var mu sync.Mutex
	next, errs := 0, []error(nil)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			for {
				mu.Lock()
				i := next
				next++
				stop := i >= count || len(errs) > 0
				mu.Unlock()
				if stop {
					return
				}
				if err := f(i); err != nil {
					mu.Lock()
					errs = append(errs, fmt.Errorf("item %d: %w", i, err))
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// runningController is tabbyd's NetworkPolicy loop for npNode, in netns.
type runningController struct {
	c   *netpol.Controller
	a   *apply.Applier
	reg *prometheus.Registry
}

// startController runs the controller as tabbyd does (policy.Incremental, the
// applier of the backend detected in the node, deny-unlisted, default
// resync and jump check) with its loop on a thread in netns, until the
// benchmark ends; then it removes what it programmed.
func startController(b *testing.B, netns *netnstest.NS) *runningController {
	b.Helper()
	cfg := clustertest.Config(b)
	ds, err := datastore.New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	pc, err := netpol.NewPolicyClient(cfg, metav1.NamespaceAll)
	if err != nil {
		b.Fatal(err)
	}
	r := &runningController{reg: prometheus.NewRegistry()}
	netns.Serve("the NetworkPolicy controller", func() (err error) {
		if r.a, err = apply.New(apply.Options{Logger: quiet, ResyncPeriod: 2 * netpol.DefaultResync}); err != nil { // as tabbyd
			return err
		}
		r.c, err = netpol.New(netpol.Config{Node: npNode, DS: ds, Policies: pc, Compile: policy.NewIncremental().Compile, Applier: r.a,
			DenyUnlisted: true, Registerer: r.reg})
		return err
	}, func(ctx context.Context) error {
		err := r.c.Run(ctx)
		cctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, cerr := r.a.Cleanup(cctx)
		return errors.Join(err, cerr)
	})
	return r
}

// syncStats are the controller's sync metrics: syncs, the summed seconds
// of each phase, and the chains it wrote.
type syncStats struct {
	syncs          float64
	compile, apply float64
	chains         float64
}

func readSyncStats(b *testing.B, reg *prometheus.Registry) syncStats {
	mfs, err := reg.Gather()
	if err != nil {
		b.Fatal(err)
	}
	var s syncStats
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			label := ""
			if len(m.GetLabel()) == 1 {
				label = m.GetLabel()[0].GetValue()
			}
			switch mf.GetName() + "/" + label {
			case "tabby_policy_syncs_total/ok":
				s.syncs = m.GetCounter().GetValue()
			case "tabby_policy_sync_duration_seconds/compile":
				s.compile = m.GetHistogram().GetSampleSum()
			case "tabby_policy_sync_duration_seconds/apply":
				s.apply = m.GetHistogram().GetSampleSum()
			case "tabby_policy_kernel_changes_total/chain":
				s.chains = m.GetCounter().GetValue()
			}
		}
	}
	return s
}

// flip is a pod whose labels alternate between two sets, and the set
// members of its address the kernel holds in each state.
type flip struct {
	pod    *corev1.Pod
	labels [2]map[string]string
	// only[s] are the members in state s and not in the other.
	only [2]map[string]setMember
}

// newFlip works out, with the compiler, what changes in the sets when pod
// (in w) goes from its labels to other's: the flip must change some
// membership.
func newFlip(b *testing.B, w *npWorld, pod *corev1.Pod, to map[string]string) *flip {
	b.Helper()
	f := &flip{pod: pod, labels: [2]map[string]string{maps.Clone(pod.Labels), maps.Clone(to)}}
	addr := netip.MustParseAddr(pod.Status.PodIP)
	var members [2]map[string]setMember
	for s := range 2 {
		in := w.input()
		for i, e := range in.Endpoints {
			if e.Pod.Namespace == pod.Namespace && e.Pod.Name == pod.Name {
				p := e.Pod.DeepCopy()
				p.Labels = f.labels[s]
				in.Endpoints[i].Pod = p
			}
		}
		var err error
		if members[s], err = membersOf(policy.Compile(in), addr); err != nil {
			b.Fatal(err)
		}
	}
	for s := range 2 {
		f.only[s] = map[string]setMember{}
		for k, m := range members[s] {
			if _, ok := members[1-s][k]; !ok {
				f.only[s][k] = m
			}
		}
	}
	if len(f.only[0])+len(f.only[1]) == 0 {
		b.Fatalf("flipping %s/%s from %v to %v changes no set membership: choose other labels", pod.Namespace, pod.Name, f.labels[0], f.labels[1])
	}
	return f
}

// inState says whether the kernel (netlink, in the calling thread's
// namespace) holds the members of state s and none of those only of the
// other state; what is off when not.
func (f *flip) inState(s int) (bool, string, error) {
	for want, ms := range map[bool]map[string]setMember{true: f.only[s], false: f.only[1-s]} {
		for _, m := range ms {
			e := m.entry
			got, err := netlink.IpsetTest(m.set, &e)
			if errors.Is(err, unix.ENOENT) {
				got, err = false, nil // no such set (yet, or any more)
			}
			if err != nil {
				return false, "", fmt.Errorf("testing %s in %s over netlink: %w", m.member, m.set, err)
			}
			if got != want {
				return false, fmt.Sprintf("%s in %s: %v, want %v", m.member, m.set, got, want), nil
			}
		}
	}
	return true, "", nil
}

// checkWithIPSet checks state s with the ipset command (in the calling
// thread's namespace).
func (f *flip) checkWithIPSet(s int) error {
	for want, ms := range map[bool]map[string]setMember{true: f.only[s], false: f.only[1-s]} {
		for _, m := range ms {
			got, err := ipsetTest(context.Background(), m)
			if err != nil {
				return err
			}
			if got != want {
				return fmt.Errorf("netlink saw the flip done, but ipset test %s %s says %v, want %v", m.set, m.member, got, want)
			}
		}
	}
	return nil
}

// waitState polls the kernel of netns every 500 µs until it is in state
// s, and returns when it saw it.
func (f *flip) waitState(netns ns.NetNS, s int, timeout time.Duration) (time.Time, error) {
	var at time.Time
	err := netnstest.Thread(netns, func() error {
		deadline := time.Now().Add(timeout)
		for {
			ok, off, err := f.inState(s)
			if err != nil {
				return err
			}
			if ok {
				at = time.Now()
				return nil
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("after %v the kernel still has %s", timeout, off)
			}
			time.Sleep(500 * time.Microsecond)
		}
	})
	return at, err
}

// BenchmarkNetpolLabelFlip: the latency of an incremental change end to
// end. The API server holds the 1,000 policies and 5,000 pods (100 on the
// node); tabbyd's NetworkPolicy controller runs for the node with its loop
// in the node's namespace. Each iteration flips one pod's labels (Update)
// and polls the node's kernel over netlink (ipset test, every 500 µs) until
// the pod's address has left the sets of its old labels and joined those
// of its new ones; latency is from the Update call returning to then, and
// every flip is checked again with the ipset command. 100 ms pass between
// flips (not timed). Sub-benchmarks: a remote pod (peer sets only) and a
// local pod (its dispatch sets too; it takes another local pod's labels).
// It also reports the controller's first sync (informers, compile, apply)
// and, over the flips, its syncs per flip and their mean compile and apply
// times.
func BenchmarkNetpolLabelFlip(b *testing.B) {
	needPolicyTools(b)
	w := newNPWorld(5000, 1000, 100)
	start := time.Now()
	loadNPWorld(b, w)
	loaded := time.Now()
	b.Logf("created 50 namespaces, %d policies and %d pods in the API server in %v", len(w.Policies), len(w.Pods), loaded.Sub(start).Round(time.Millisecond))
	netns := netnstest.New(b, "np-node")
	r := startController(b, netns)
	var first *corev1.Pod
	for _, p := range w.Pods {
		if p.Spec.NodeName == npNode {
			first = p
			break
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if _, err := r.c.WaitProgrammed(ctx, first.Namespace, first.Name, "", []netip.Addr{netip.MustParseAddr(first.Status.PodIP)}); err != nil {
		b.Fatal(err)
	}
	firstSync := time.Since(loaded)
	if got := len(r.c.Input().Endpoints); got != len(w.Pods) {
		b.Fatalf("the controller knows %d endpoints, want %d", got, len(w.Pods))
	}
	b.Logf("the controller's first sync was in the kernel %v after it started", firstSync.Round(time.Millisecond))

	// The remote pod: app4 of np-03 is the peer of the app-to-app policy
	// that selects the node's app3 pod there; as a web pod it is also the
	// peer of the api-from-team-web policies selecting the node's api pods
	// in the namespaces of its team. It flips to app6, tier db.
	var remote, local, other *corev1.Pod
	for _, p := range w.Pods {
		if p.Namespace != npNamespace(3) {
			continue
		}
		switch {
		case p.Spec.NodeName != npNode && p.Labels["app"] == "app4" && remote == nil:
			remote = p
		case p.Spec.NodeName == npNode && local == nil:
			local = p
		case p.Spec.NodeName == npNode && other == nil:
			other = p
		}
	}
	if remote == nil || local == nil || other == nil {
		b.Fatal("the world has no remote app4 pod or not two local pods in np-03")
	}
	remoteTo := maps.Clone(remote.Labels)
	remoteTo["app"], remoteTo["tier"] = "app6", "db"
	cfg := rest.CopyConfig(clustertest.Config(b))
	ds, err := datastore.New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name string
		f    *flip
	}{{"remote-pod", newFlip(b, w, remote, remoteTo)}, {"local-pod", newFlip(b, w, local, other.Labels)}} {
		b.Run(c.name, func(b *testing.B) {
			f := c.f
			if _, err := f.waitState(netns, 0, time.Minute); err != nil {
				b.Fatalf("before any flip: %v", err)
			}
			cur, err := ds.Pods(f.pod.Namespace).Get(context.Background(), f.pod.Name, metav1.GetOptions{})
			if err != nil {
				b.Fatal(err)
			}
			before := readSyncStats(b, r.reg)
			var lat, upd []time.Duration
			state := 0
			for b.Loop() {
				state = 1 - state
				cur.Labels = f.labels[state]
				t0 := time.Now()
				cur, err = ds.Pods(f.pod.Namespace).Update(context.Background(), cur, metav1.UpdateOptions{})
				t1 := time.Now()
				if err != nil {
					b.Fatal(err)
				}
				at, err := f.waitState(netns, state, time.Minute)
				if err != nil {
					b.Fatalf("flip %d: %v", len(lat)+1, err)
				}
				b.StopTimer()
				lat = append(lat, at.Sub(t1))
				upd = append(upd, t1.Sub(t0))
				if err := netnstest.Thread(netns, func() error { return f.checkWithIPSet(state) }); err != nil {
					b.Fatalf("flip %d: %v", len(lat), err)
				}
				time.Sleep(100 * time.Millisecond)
				b.StartTimer()
			}
			b.StopTimer()
			after := readSyncStats(b, r.reg)
			syncs := after.syncs - before.syncs
			b.ReportMetric(ms(quantile(lat, .5)), "p50-ms")
			b.ReportMetric(ms(quantile(lat, .99)), "p99-ms")
			b.ReportMetric(ms(quantile(lat, 1)), "max-ms")
			b.ReportMetric(ms(quantile(upd, .5)), "update-p50-ms")
			b.ReportMetric(syncs/float64(len(lat)), "syncs/flip")
			b.ReportMetric(1000*(after.compile-before.compile)/max(syncs, 1), "sync-compile-ms")
			b.ReportMetric(1000*(after.apply-before.apply)/max(syncs, 1), "sync-apply-ms")
			b.ReportMetric((after.chains-before.chains)/float64(len(lat)), "chain-changes/flip")
			b.ReportMetric(float64(len(f.only[0])+len(f.only[1])), "members-moved")
			b.ReportMetric(firstSync.Seconds(), "first-sync-s")
			// Back to the pod's own labels for the next sub-benchmark.
			if state == 1 {
				cur.Labels = f.labels[0]
				if _, err := ds.Pods(f.pod.Namespace).Update(context.Background(), cur, metav1.UpdateOptions{}); err != nil {
					b.Fatal(err)
				}
				if _, err := f.waitState(netns, 0, time.Minute); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// iperfPods adds to w the two pods BenchmarkNetpolThroughput runs iperf3
// in, on npNode in np-00: a server with app0 (which app-to-app policy m=0
// opens to app1 on TCP 8080-8081; its named port http is 8080) and a
// client with app1 (whose egress the namespace's policies allow within
// the namespace). Both are isolated in both directions by the namespace's
// default denies.
func iperfPods(w *npWorld) (server, client *corev1.Pod) {
	ports := []corev1.ContainerPort{{Name: "http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP}}
	server = npPod(npNamespace(0), "iperf-server", npNode, map[string]string{"app": "app0", "tier": "api"}, ports, netip.MustParseAddr("10.245.0.2"))
	client = npPod(npNamespace(0), "iperf-client", npNode, map[string]string{"app": "app1", "tier": "web"}, ports, netip.MustParseAddr("10.245.0.3"))
	w.Pods = append(w.Pods, server, client)
	return server, client
}

// wirePod makes a pod's namespace wired to the node by the CNI plugin's own
// code (plugin.SetupPod, SetupHost): a veth named as tabbyd expects it,
// the pod's /32, routes through 169.254.1.1 by proxy ARP, a /32 route in
// the node.
func wirePod(b testing.TB, node ns.NetNS, p *corev1.Pod) ns.NetNS {
	b.Helper()
	podNS := netnstest.New(b, "np-pod")
	addr := netip.MustParseAddr(p.Status.PodIP)
	w := &plugin.Wiring{
		HostVeth: netpol.HostIface(p), IfName: "eth0", MTU: 1500,
		Alias: plugin.VethAlias(plugin.Attachment{Network: "k8s-pod-network", ContainerID: p.Name, IfName: "eth0"}),
	}
	w.IPs = []net.IPNet{{IP: addr.AsSlice(), Mask: net.CIDRMask(32, 32)}}
	err := netnstest.Thread(node, func() error {
		if _, _, err := plugin.SetupPod(podNS, w); err != nil {
			return err
		}
		return plugin.SetupHost(w)
	})
	if err != nil {
		b.Fatalf("wiring pod %s: %v", p.Name, err)
	}
	return podNS
}

// pairNode is a node namespace as testnet makes one (lo, an uplink that
// leads nowhere with the default route: proxy ARP for the pods' gateway
// needs a route to it; forwarding on) with the pods server and client
// wired to it (wirePod); removed when tb ends.
func pairNode(tb testing.TB, server, client *corev1.Pod) (node, serverNS, clientNS ns.NetNS) {
	tb.Helper()
	n, err := testnet.NewNode(context.Background(), testnet.NodeOptions{Name: npNode, Dir: tb.TempDir(),
		Sysctls: map[string]string{"net/ipv4/ip_forward": "1"}})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := n.Close(); err != nil {
			tb.Errorf("removing the node: %v", err)
		}
	})
	return n.NS, wirePod(tb, n.NS, server), wirePod(tb, n.NS, client)
}

// nodeRule adds (op "-A") or deletes ("-D") rule in chain of the node's
// filter table.
func nodeRule(node ns.NetNS, be iptbackend.Backend, op, chain string, rule ...string) error {
	return netnstest.Thread(node, func() error {
		out, err := exec.Command(be.IPTables, append([]string{"-w", op, chain}, rule...)...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("iptables %s %s %s: %v: %s", op, chain, strings.Join(rule, " "), err, out)
		}
		return nil
	})
}

// conntrackOn adds (op "-A") or deletes ("-D") a rule in the node's INPUT
// that turns conntrack on in its namespace and that forwarded packets
// never meet: a node with kube-proxy (every node of a cluster) tracks
// connections, so the benchmarks' second baseline does too.
func conntrackOn(node ns.NetNS, be iptbackend.Backend, op string) error {
	return nodeRule(node, be, op, "INPUT", "-m", "conntrack", "--ctstate", "INVALID", "-m", "comment", "--comment", "bench-conntrack", "-j", "DROP")
}

// cleanupIn removes the applier's rules and sets from the node.
func cleanupIn(node ns.NetNS, a *apply.Applier) error {
	return netnstest.Thread(node, func() error { _, err := a.Cleanup(context.Background()); return err })
}

// startIperfServer runs iperf3 -s on port in netns until the benchmark
// ends, once it listens.
func startIperfServer(b *testing.B, netns ns.NetNS, port int) {
	b.Helper()
	cmd := exec.Command("nsenter", "--net="+netns.Path(), "iperf3", "-s", "-p", strconv.Itoa(port))
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	for deadline := time.Now().Add(10 * time.Second); ; {
		o, _ := exec.Command("nsenter", "--net="+netns.Path(), "ss", "-Hltn", "sport", "=", ":"+strconv.Itoa(port)).Output()
		if len(strings.TrimSpace(string(o))) > 0 {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("iperf3 -s does not listen on %d: %s", port, out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// runIperf runs a 5 s TCP test (after a 1 s warm-up left out) from netns
// to addr:port and returns bits per second.
func runIperf(netns ns.NetNS, addr string, port int) (iperfResult, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "nsenter", "--net="+netns.Path(), "iperf3", "-c", addr, "-p", strconv.Itoa(port), "-t", "5", "-O", "1", "-J").Output()
	r, perr := parseIperf(out)
	if perr != nil {
		return r, fmt.Errorf("%w (exit: %v)", perr, err)
	}
	return r, nil
}

var counterLine = regexp.MustCompile(`^\[(\d+):(\d+)\] -A (\S+) `)

// chainPackets sums, from iptables-save -c of the node, the packets the
// rules of each of tabby's chains matched, by chain name prefix
// (TABBY-NP-POD, TABBY-NP-PI-, …) and the jump from FORWARD.
func chainPackets(netns ns.NetNS, save string) (map[string]uint64, error) {
	got := map[string]uint64{}
	err := netnstest.Thread(netns, func() error {
		out, err := exec.Command(save, "-c", "-t", "filter").Output()
		if err != nil {
			return fmt.Errorf("%s -c: %w", save, err)
		}
		for line := range strings.Lines(string(out)) {
			m := counterLine.FindStringSubmatch(line)
			if m == nil {
				continue
			}
			pk, _ := strconv.ParseUint(m[1], 10, 64)
			chain := m[3]
			switch {
			case chain == "FORWARD" && strings.Contains(line, "-j "+policy.ChainForward):
				got["FORWARD->"+policy.ChainForward] += pk
			case strings.HasPrefix(chain, policy.PolicyChainPrefix+"PI-"), strings.HasPrefix(chain, policy.PolicyChainPrefix+"PE-"),
				strings.HasPrefix(chain, policy.PolicyChainPrefix+"I-"), strings.HasPrefix(chain, policy.PolicyChainPrefix+"E-"):
				got[chain[:strings.LastIndex(chain, "-")+1]] += pk
			case strings.HasPrefix(chain, policy.PolicyChainPrefix):
				got[chain] += pk
			}
		}
		return nil
	})
	return got, err
}

// BenchmarkNetpolThroughput: pod-to-pod TCP throughput (iperf3, 5 s after
// a 1 s warm-up) between two pods of one node, through the node's FORWARD
// path: every iteration first without any tabby rule in the node, then
// with conntrack on (a rule in INPUT that forwarded packets never meet),
// then with conntrack and one FORWARD rule accepting RELATED,ESTABLISHED
// (the least a stateful iptables policy costs an established
// connection), then
// with the ruleset of 1,000 policies over 5,000 pods (the two pods among
// the node's 102, each selected by policies of both directions that allow
// this traffic). Each iteration checks that the rules are really there
// and enforced: a port no policy opens is refused with them and reachable
// without them, and the policy chains' counters show the iperf3
// connection went through them. It reports the medians in Gbit/s and
// the ratios of the policies' to each baseline's.
func BenchmarkNetpolThroughput(b *testing.B) {
	needPolicyTools(b, "iperf3", "nsenter", "ss")
	w := newNPWorld(5000, 1000, 100)
	server, client := iperfPods(w)
	rs := policy.Compile(w.input())
	if len(rs.Problems) > 0 {
		b.Fatalf("the compiler refused %d policies, the first: %+v", len(rs.Problems), rs.Problems[0])
	}
	node, serverNS, clientNS := pairNode(b, server, client)
	const port, closedPort = 8080, 5201
	startIperfServer(b, serverNS, port)
	stopProbe, err := testnet.ServeTCP(serverNS, fmt.Sprintf("%s:%d", server.Status.PodIP, closedPort), []byte("open"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(stopProbe)
	a := newApplier(b, node, nil)
	b.Cleanup(func() {
		_ = cleanupIn(node, a)
	})
	be := a.Backend()
	probe := func() error {
		_, err := testnet.ReadTCP(clientNS, fmt.Sprintf("%s:%d", server.Status.PodIP, closedPort), time.Second)
		return err
	}
	// The second baseline turns conntrack on (conntrackOn); the third is
	// the least a stateful iptables policy puts on an established
	// connection's path: a FORWARD rule accepting it.
	floorRule := func(op string) error {
		return nodeRule(node, be, op, "FORWARD", "-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", "-m", "comment", "--comment", "bench-floor", "-j", "ACCEPT")
	}
	// withRule runs iperf3 with a baseline's rule in place.
	withRule := func(rule func(op string) error, what string) iperfResult {
		if err := rule("-A"); err != nil {
			b.Fatal(err)
		}
		r, err := runIperf(clientNS, server.Status.PodIP, port)
		if err != nil {
			b.Fatalf("without policies, %s: %v", what, err)
		}
		if err := rule("-D"); err != nil {
			b.Fatal(err)
		}
		return r
	}
	var none, tracked, floor, with []float64
	var retrNone, retrTracked, retrWith int
	for b.Loop() {
		if err := cleanupIn(node, a); err != nil {
			b.Fatal(err)
		}
		if err := probe(); err != nil {
			b.Fatalf("without tabby's rules, port %d of the server is unreachable: %v", closedPort, err)
		}
		r, err := runIperf(clientNS, server.Status.PodIP, port)
		if err != nil {
			b.Fatalf("without policies: %v", err)
		}
		none = append(none, r.End.SumReceived.BitsPerSecond/1e9)
		retrNone += r.End.SumSent.Retransmits

		r = withRule(func(op string) error { return conntrackOn(node, be, op) }, "conntrack on")
		tracked = append(tracked, r.End.SumReceived.BitsPerSecond/1e9)
		retrTracked += r.End.SumSent.Retransmits

		r = withRule(floorRule, "one FORWARD rule accepting established traffic")
		floor = append(floor, r.End.SumReceived.BitsPerSecond/1e9)

		if _, err := applyIn(node, a, rs); err != nil {
			b.Fatal(err)
		}
		if err := probe(); err == nil {
			b.Fatalf("with the policies, port %d of the server (which no policy opens) is reachable", closedPort)
		}
		r, err = runIperf(clientNS, server.Status.PodIP, port)
		if err != nil {
			b.Fatalf("with the policies: %v", err)
		}
		with = append(with, r.End.SumReceived.BitsPerSecond/1e9)
		retrWith += r.End.SumSent.Retransmits
		pk, err := chainPackets(node, be.IPTablesSave)
		if err != nil {
			b.Fatal(err)
		}
		for _, c := range []string{"FORWARD->" + policy.ChainForward, policy.ChainPod, policy.ChainFromPod, policy.ChainToPod,
			policy.PolicyChainPrefix + "E-", policy.PolicyChainPrefix + "I-", policy.PolicyChainPrefix + "PE-", policy.PolicyChainPrefix + "PI-"} {
			if pk[c] == 0 {
				b.Fatalf("no packet went through %s: %v", c, pk)
			}
		}
		if len(with) == 1 {
			b.Logf("packets matched by the rules of tabby's chains during one round: %v", pk)
		}
	}
	mNone, mTracked, mFloor, mWith := benchstat.Median(none), benchstat.Median(tracked), benchstat.Median(floor), benchstat.Median(with)
	b.ReportMetric(mNone, "none-Gbit/s")
	b.ReportMetric(mTracked, "conntrack-Gbit/s")
	b.ReportMetric(mFloor, "one-rule-Gbit/s")
	b.ReportMetric(mWith/mFloor, "ratio-one-rule")
	b.ReportMetric(mWith, "policies-Gbit/s")
	b.ReportMetric(mWith/mNone, "ratio")
	b.ReportMetric(mWith/mTracked, "ratio-conntrack")
	b.ReportMetric(float64(retrNone)/float64(len(none)), "none-retransmits")
	b.ReportMetric(float64(retrTracked)/float64(len(tracked)), "conntrack-retransmits")
	b.ReportMetric(float64(retrWith)/float64(len(with)), "policies-retransmits")
	b.ReportMetric(float64(rulesetSize(rs).rules), "rules")
	b.Logf("Gbit/s without policies %.2f, without policies with conntrack on %.2f, with one FORWARD rule accepting established traffic %.2f, with %.2f (%s backend)", none, tracked, floor, with, be.Mode)
}
