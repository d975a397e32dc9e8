package schedtest

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
	"k8s.io/utils/ptr"

	"github.com/tabbynet/tabby/internal/benchstat"
	"github.com/tabbynet/tabby/internal/controlplane"
	"github.com/tabbynet/tabby/internal/controlplane/clustertest"
)

const (
	benchNodes = 500
	benchPods  = 1000
	// plainScheduler is a second kube-scheduler with the default plugins
	// and no extender: the baseline.
	plainScheduler = "plain-scheduler"
	// benchQPS is both schedulers' API client rate.
	benchQPS = 2000
)

var benchOnce sync.Once

// benchFixture adds 500 nodes (with tabbyd heartbeats; 10 zones) and starts
// the plain scheduler, once.
func benchFixture(b *testing.B, cs kubernetes.Interface) {
	var err error
	benchOnce.Do(func() {
		ctx := context.Background()
		res := corev1.ResourceList{corev1.ResourcePods: resource.MustParse("110"), corev1.ResourceCPU: resource.MustParse("32"), corev1.ResourceMemory: resource.MustParse("128Gi")}
		parallel(benchNodes, func(i int) error {
			name := fmt.Sprintf("bench-%03d", i)
			n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
				corev1.LabelHostname: name, corev1.LabelTopologyZone: fmt.Sprintf("z%d", i%10), "bench": "true"}},
				Status: corev1.NodeStatus{Capacity: res, Allocatable: res,
					Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "Bench"}}}}
			if _, err := cs.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{}); err != nil {
				return err
			}
			if _, err := cs.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, []byte(`{"spec":{"taints":[]}}`), metav1.PatchOptions{}); err != nil {
				return err
			}
			now := metav1.NewMicroTime(time.Now())
			_, err := cs.CoordinationV1().Leases("tabby-system").Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "tabbyd-" + name},
				Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(name), LeaseDurationSeconds: ptr.To(int32(3600)), RenewTime: &now}}, metav1.CreateOptions{})
			return err
		}, &err)
		if err != nil {
			return
		}
		_, err = clustertest.Cluster(b).StartScheduler(ctx, controlplane.SchedulerOptions{Name: plainScheduler, QPS: benchQPS,
			Config: []byte("profiles:\n- schedulerName: " + plainScheduler + "\n")})
	})
	if err != nil {
		b.Fatal(err)
	}
}

// parallel runs f(0..n-1) on 32 workers; the first error lands in *errp.
func parallel(n int, f func(int) error, errp *error) {
	var mu sync.Mutex
	var wg sync.WaitGroup
	next := make(chan int)
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := f(i); err != nil {
					mu.Lock()
					if *errp == nil {
						*errp = err
					}
					mu.Unlock()
				}
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
}

// BenchmarkSchedulingThroughput creates 1,000 pods at once for 500 nodes and
// measures until kube-scheduler has bound them all: with tabby's
// configuration (extender, in-tree rules disabled) and with the default
// plugins and no extender, one batch each per iteration, the order
// alternating, so that the machine's drifts meet both alike. Half of the
// pods spread over zones (ScheduleAnyway) so that both schedulers do real
// work. The headline is ratio: the median over iterations of tabby's
// pods/s over the plain scheduler's in the same iteration. Beside it, the
// CPU all the cluster's processes (etcd, kube-apiserver, both schedulers,
// the extender) used a pod until the batch was bound, in total and, in
// the log, each: on a machine the benchmark keeps busy, pods/s follows
// it.
func BenchmarkSchedulingThroughput(b *testing.B) {
	rc := rest.CopyConfig(clustertest.Config(b))
	rc.QPS, rc.Burst = -1, 0
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		b.Fatal(err)
	}
	// The fixture of the tests, for the tabby-system namespace and pools.
	var ferr error
	fixtureOnce.Do(func() { ferr = makeFixture(cs, clustertest.Client(b)) })
	if ferr != nil {
		b.Fatal(ferr)
	}
	benchFixture(b, cs)
	wcs := watchClient(b)
	scheds := []string{"default-scheduler", plainScheduler}
	rate := map[string][]float64{}
	// The CPU (all threads) of each of the cluster's processes while a
	// batch is placed, per pod. On a shared machine pods/s is what the
	// processes' CPU allows: the extender's with the plain scheduler is
	// only its informers' share, watching the pods.
	cpu := map[string]map[string]time.Duration{}
	var ratios []float64
	for i := 0; b.Loop(); i++ {
		for j := range scheds {
			sched := scheds[(i+j)%len(scheds)]
			d, used := scheduleBatch(b, cs, wcs, sched, i)
			if cpu[sched] == nil {
				cpu[sched] = map[string]time.Duration{}
			}
			for name, t := range used {
				cpu[sched][name] += t
			}
			rate[sched] = append(rate[sched], float64(benchPods)/d.Seconds())
		}
		ratios = append(ratios, rate[scheds[0]][i]/rate[plainScheduler][i])
	}
	perPod := func(t time.Duration) float64 {
		return float64(t) / float64(time.Millisecond) / float64(benchPods*len(ratios))
	}
	for _, sched := range scheds {
		name := "tabby"
		if sched == plainScheduler {
			name = "plain"
		}
		b.ReportMetric(benchstat.Median(rate[sched]), name+"-pods/s")
		var total time.Duration
		var parts []string
		for _, p := range slices.Sorted(maps.Keys(cpu[sched])) {
			total += cpu[sched][p]
			parts = append(parts, fmt.Sprintf("%s %.2f", p, perPod(cpu[sched][p])))
		}
		b.ReportMetric(perPod(cpu[sched][extender.Name]), name+"-extender-cpu-ms/pod")
		b.ReportMetric(perPod(total), name+"-cpu-ms/pod")
		b.Logf("%s: CPU ms a pod, all the cluster's processes %.2f: %s", sched, perPod(total), strings.Join(parts, ", "))
	}
	b.ReportMetric(benchstat.Median(ratios), "ratio")
	b.Logf("pods/s with tabby's extender %.1f, with the plain scheduler %.1f; ratios %.2f", rate[scheds[0]], rate[plainScheduler], ratios)
	// Where the extender's share of the time goes.
	logPlacementWaits(b)
}

// scheduleBatch creates the batch's pods through cs and watches for their
// bindings through wcs (watchClient); it returns how long until all were
// bound, and the CPU each of the cluster's processes used meanwhile.
func scheduleBatch(b *testing.B, cs, wcs kubernetes.Interface, sched string, round int) (time.Duration, map[string]time.Duration) {
	ctx := context.Background()
	ns := fmt.Sprintf("bench-%s-%d-%d", sched, round, time.Now().UnixNano()%100000)
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	defer func() {
		_ = cs.CoreV1().Pods(ns).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))}, metav1.ListOptions{})
		_ = cs.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{})
	}()
	// Bindings are counted from a watch, started before the first pod is
	// created. Polling with List instead (it was every 50 ms) made the API
	// server serialize and the benchmark decode every pod still waiting,
	// over and over: CPU that the schedulers lose on this shared machine,
	// and more of it the slower a scheduler is.
	wctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	bound := make(chan error, 1)
	go func() { bound <- awaitBound(wctx, wcs, ns, benchPods) }()
	cpu0 := clusterCPU(b)
	start := time.Now()
	var err error
	parallel(benchPods, func(i int) error {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p%04d", i), Namespace: ns, Labels: map[string]string{"app": fmt.Sprintf("a%d", i%2)}},
			Spec: corev1.PodSpec{SchedulerName: sched, NodeSelector: map[string]string{"bench": "true"},
				Containers: []corev1.Container{{Name: "c", Image: "none"}}}}
		if i%2 == 0 {
			p.Spec.TopologySpreadConstraints = []corev1.TopologySpreadConstraint{{MaxSkew: 1, TopologyKey: corev1.LabelTopologyZone,
				WhenUnsatisfiable: corev1.ScheduleAnyway, LabelSelector: &metav1.LabelSelector{MatchLabels: p.Labels}}}
		}
		_, err := cs.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
		return err
	}, &err)
	if err != nil {
		b.Fatal(err)
	}
	err = <-bound
	d, used := time.Since(start), clusterCPU(b)
	for name := range used {
		used[name] -= cpu0[name]
	}
	if err != nil {
		l, lerr := cs.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{FieldSelector: "spec.nodeName="})
		if lerr != nil || len(l.Items) == 0 {
			b.Fatalf("%s: waiting for %d pods to be bound: %v (list: %v)", sched, benchPods, err, lerr)
		}
		b.Fatalf("%s: %d of %d pods still unscheduled after 5 minutes: %s", sched, len(l.Items), benchPods, scheduledCondition(&l.Items[0]))
	}
	return d, used
}

// clusterCPU is the CPU time each of the cluster's running processes has
// used, by name.
func clusterCPU(b *testing.B) map[string]time.Duration {
	out := map[string]time.Duration{}
	for _, p := range clustertest.Cluster(b).Processes() {
		out[p.Name] += processCPU(b, p.Pid())
	}
	return out
}

// watchClient is a client that speaks protobuf, as the schedulers' do, so
// the API server encodes each watch event once for all of them.
func watchClient(b *testing.B) kubernetes.Interface {
	rc := rest.CopyConfig(clustertest.Config(b))
	rc.QPS, rc.Burst = -1, 0
	rc.ContentType = "application/vnd.kubernetes.protobuf"
	rc.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		b.Fatal(err)
	}
	return cs
}

// awaitBound returns once n pods of namespace ns have a node, as a watch
// (client-go's UntilWithSync: it lists, watches and rewatches) shows them.
func awaitBound(ctx context.Context, cs kubernetes.Interface, ns string, n int) error {
	seen := map[string]bool{}
	lw := cache.NewListWatchFromClient(cs.CoreV1().RESTClient(), "pods", ns, fields.Everything())
	_, err := watchtools.UntilWithSync(ctx, lw, &corev1.Pod{}, nil, func(ev watch.Event) (bool, error) {
		if p, ok := ev.Object.(*corev1.Pod); ok && p.Spec.NodeName != "" && ev.Type != watch.Deleted {
			seen[p.Name] = true
		}
		return len(seen) == n, nil
	})
	return err
}

// processCPU is the CPU time (user and system, all threads) process pid
// has used, from /proc/pid/stat.
func processCPU(b *testing.B, pid int) time.Duration {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		b.Fatal(err)
	}
	// The fields after the command (which may hold spaces), from the
	// state (field 3): utime and stime are fields 14 and 15, in clock
	// ticks (USER_HZ, 100 on Linux).
	f := strings.Fields(string(data[bytes.LastIndexByte(data, ')')+1:]))
	if len(f) < 13 {
		b.Fatalf("/proc/%d/stat: %q", pid, data)
	}
	var ticks int64
	for _, s := range f[11:13] {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			b.Fatalf("/proc/%d/stat: %v", pid, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * (time.Second / 100)
}
