package labtest

// Route convergence and per-node cost of tabbyd, full mesh against route
// reflectors (issue 3, section 5):
//
//	go test -run '^$' -bench RouteConvergence -benchtime 1x -timeout 30m ./test/labtest/

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"

	tabbyv1 "github.com/tabbynet/tabby/api/v1"
	"github.com/tabbynet/tabby/daemon/nodestatus"
	"github.com/tabbynet/tabby/daemon/routing"
	"github.com/tabbynet/tabby/lab"
)

// routeWatch records, for every node of a lab, when tabby's route to each
// prefix first appeared (netlink route notifications in each node's
// namespace), and when each IPAM block was created (a watch on the API).
type routeWatch struct {
	mu      sync.Mutex
	routes  map[netip.Prefix]map[string]time.Time // prefix -> node -> first seen
	blocks  map[netip.Prefix]time.Time            // block -> created (watch event)
	owner   map[netip.Prefix]string
	changed chan struct{}
	stop    chan struct{}
}

func watchRoutes(b *testing.B, l *Lab) *routeWatch {
	b.Helper()
	w := &routeWatch{routes: map[netip.Prefix]map[string]time.Time{}, blocks: map[netip.Prefix]time.Time{},
		owner: map[netip.Prefix]string{}, changed: make(chan struct{}, 1), stop: make(chan struct{})}
	b.Cleanup(func() { close(w.stop) })
	for i := range l.State.Nodes {
		n := l.State.Nodes[i]
		h, err := netns.GetFromPath(lab.NetNSPath(n.NetNS))
		if err != nil {
			b.Fatal(err)
		}
		ch := make(chan netlink.RouteUpdate, 1024)
		err = netlink.RouteSubscribeWithOptions(ch, w.stop, netlink.RouteSubscribeOptions{Namespace: &h})
		h.Close()
		if err != nil {
			b.Fatalf("watching the routes of %s: %v", n.Name, err)
		}
		go func() {
			for u := range ch {
				if u.Type != unix.RTM_NEWROUTE || u.Protocol != routing.RouteProtocol || u.Dst == nil {
					continue
				}
				ones, _ := u.Dst.Mask.Size()
				a, _ := netip.AddrFromSlice(u.Dst.IP)
				p := netip.PrefixFrom(a.Unmap(), ones)
				now := time.Now()
				w.mu.Lock()
				if w.routes[p] == nil {
					w.routes[p] = map[string]time.Time{}
				}
				if _, seen := w.routes[p][n.Name]; !seen {
					w.routes[p][n.Name] = now
				}
				w.mu.Unlock()
				w.signal()
			}
		}()
	}
	bw, err := l.DS(b).IPAMBlocks.Watch(context.Background(), metav1.ListOptions{})
	if err != nil {
		b.Fatal(err)
	}
	go func() {
		<-w.stop
		bw.Stop()
	}()
	go func() {
		for ev := range bw.ResultChan() {
			blk, ok := ev.Object.(*tabbyv1.IPAMBlock)
			if !ok || ev.Type != watch.Added {
				continue
			}
			p, err := netip.ParsePrefix(blk.Spec.CIDR)
			if err != nil {
				continue
			}
			w.mu.Lock()
			w.blocks[p] = time.Now()
			w.owner[p] = strings.TrimPrefix(blk.Spec.Affinity, "host:")
			w.mu.Unlock()
			w.signal()
		}
	}()
	return w
}

func (w *routeWatch) signal() {
	select {
	case w.changed <- struct{}{}:
	default:
	}
}

// converged waits until the block holding addr is routed on every node
// but its owner and returns when the last node's route appeared, and when
// the block was claimed: the watch event of its creation, or the first
// route to it anywhere (the owner's blackhole) when that came first.
func (w *routeWatch) converged(b *testing.B, addr netip.Addr, nodes []string, d time.Duration) (claimed, routed time.Time) {
	b.Helper()
	deadline := time.After(d)
	for {
		w.mu.Lock()
		var blk netip.Prefix
		for p := range w.blocks {
			if p.Contains(addr) {
				blk = p
			}
		}
		var last time.Time
		missing := 0
		if blk.IsValid() {
			for _, n := range nodes {
				if n == w.owner[blk] {
					continue
				}
				at, ok := w.routes[blk][n]
				if !ok {
					missing++
				} else if at.After(last) {
					last = at
				}
			}
		}
		created := w.blocks[blk]
		for _, at := range w.routes[blk] {
			if at.Before(created) {
				created = at
			}
		}
		w.mu.Unlock()
		if blk.IsValid() && missing == 0 {
			return created, last
		}
		select {
		case <-w.changed:
		case <-time.After(50 * time.Millisecond):
		case <-deadline:
			b.Fatalf("the block of %s (%v) is not routed on every node after %v (%d missing)", addr, blk, d, missing)
		}
	}
}

// percentile of sorted durations (nearest rank).
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(p/100*float64(len(sorted))+0.5) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// tabbydRSS is the resident memory of each node's tabbyd, in MiB.
func tabbydRSS(b *testing.B, l *Lab) []float64 {
	b.Helper()
	l.Reload(b)
	var out []float64
	for _, n := range l.State.Nodes {
		data, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(l.TabbydProc(b, n.Name).Pid), "status"))
		if err != nil {
			b.Fatal(err)
		}
		for _, line := range strings.Split(string(data), "\n") {
			if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
				kb, _ := strconv.Atoi(f[1])
				out = append(out, float64(kb)/1024)
			}
		}
	}
	return out
}

func stats(xs []float64) (mean, lo, hi float64) {
	if len(xs) == 0 {
		return 0, 0, 0
	}
	lo, hi = xs[0], xs[0]
	for _, x := range xs {
		mean += x
		lo, hi = min(lo, x), max(hi, x)
	}
	return mean / float64(len(xs)), lo, hi
}

// benchSamples creates pods one at a time, round robin over the nodes, each
// claiming a new block (the pool's blocks are /32), and measures how long
// each block takes to be routed on every other node: from its claim, and
// from the creation of the pod (scheduling, the kubelet and the CNI ADD
// included).
func benchSamples(b *testing.B, l *Lab, w *routeWatch, prefix string, samples int) (fromClaim, fromPod []time.Duration) {
	b.Helper()
	var nodes []string
	for _, n := range l.State.Nodes {
		nodes = append(nodes, n.Name)
	}
	for i := range samples {
		node := nodes[i%len(nodes)]
		name := fmt.Sprintf("%s-%d", prefix, i)
		p := Sleeper(name, node)
		p.Annotations = map[string]string{tabbyv1.AnnotationIPv4Pools: `["bench"]`}
		created := time.Now()
		l.Create(b, p)
		pod := l.WaitPod(b, name, time.Minute, Running(false))
		claimed, routed := w.converged(b, netip.MustParseAddr(pod.Status.PodIP), nodes, time.Minute)
		fromClaim = append(fromClaim, routed.Sub(claimed))
		fromPod = append(fromPod, routed.Sub(created))
	}
	return fromClaim, fromPod
}

// waitAllBGP waits until every node's tabbyd is ready with sessions that
// ok accepts.
func waitAllBGP(b *testing.B, l *Lab, d time.Duration, ok func(node string, st *nodestatus.Status) error) map[string]*nodestatus.Status {
	b.Helper()
	out := map[string]*nodestatus.Status{}
	for _, n := range l.State.Nodes {
		out[n.Name] = l.WaitBGP(b, n.Name, d, func(st *nodestatus.Status) error {
			for _, p := range st.Peers {
				if !p.Established() {
					return fmt.Errorf("session with %s is %s", p.Address, p.State)
				}
			}
			if !st.Ready {
				return fmt.Errorf("not ready: %v", st.NotReady)
			}
			return ok(n.Name, st)
		})
	}
	return out
}

func sessionCounts(sts map[string]*nodestatus.Status) []float64 {
	var out []float64
	for _, st := range sts {
		out = append(out, float64(len(st.Peers)))
	}
	return out
}

// BenchmarkRouteConvergence: in labs of 10 and 30 nodes, first as a full
// mesh, then with node1 and node2 labelled route reflectors, the time from
// the creation of a block (a pod ADD claiming it) until its route is
// installed on every other node (p50, p99), the BGP sessions per node and
// tabbyd's resident memory per node.
func BenchmarkRouteConvergence(b *testing.B) {
	for _, nodes := range []int{10, 30} {
		b.Run(fmt.Sprintf("nodes=%d", nodes), func(b *testing.B) {
			for range b.N {
				benchConvergence(b, nodes)
			}
		})
	}
}

func benchConvergence(b *testing.B, nodes int) {
	samples := max(20, nodes)
	l := Up(b, "--nodes", strconv.Itoa(nodes), "--pod-cidr", "", "--timeout", "5m")
	ctx := context.Background()
	pool := &tabbyv1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: "bench"}, Spec: tabbyv1.IPPoolSpec{CIDR: "10.248.0.0/16", BlockSize: 32}}
	if _, err := l.DS(b).IPPools.Create(ctx, pool, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	w := watchRoutes(b, l)
	report := func(topology string, sessions map[string]*nodestatus.Status, fromClaim, fromPod []time.Duration) {
		slices.Sort(fromClaim)
		slices.Sort(fromPod)
		rss := tabbydRSS(b, l)
		sm, slo, shi := stats(sessionCounts(sessions))
		rm, rlo, rhi := stats(rss)
		ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
		p50, p99 := percentile(fromClaim, 50), percentile(fromClaim, 99)
		pp50, pp99 := percentile(fromPod, 50), percentile(fromPod, 99)
		b.Logf("%d nodes, %s, %d samples: block claim -> routed on every other node p50 %.1f ms, p99 %.1f ms (max %.1f); "+
			"pod created -> routed everywhere p50 %.1f ms, p99 %.1f ms; BGP sessions/node mean %.1f (%g..%g); tabbyd RSS/node mean %.1f MiB (%.1f..%.1f)",
			nodes, topology, len(fromClaim), ms(p50), ms(p99), ms(fromClaim[len(fromClaim)-1]), ms(pp50), ms(pp99), sm, slo, shi, rm, rlo, rhi)
		b.ReportMetric(ms(p50), topology+"-claim-p50-ms")
		b.ReportMetric(ms(p99), topology+"-claim-p99-ms")
		b.ReportMetric(ms(pp50), topology+"-pod-p50-ms")
		b.ReportMetric(ms(pp99), topology+"-pod-p99-ms")
		b.ReportMetric(sm, topology+"-sessions/node")
		b.ReportMetric(rm, topology+"-rss-MiB/node")
	}

	meshSessions := waitAllBGP(b, l, 2*time.Minute, func(_ string, st *nodestatus.Status) error {
		if len(st.Peers) != nodes-1 {
			return fmt.Errorf("%d sessions, want %d", len(st.Peers), nodes-1)
		}
		return nil
	})
	claim, pod := benchSamples(b, l, w, "mesh", samples)
	report("mesh", meshSessions, claim, pod)

	start := time.Now()
	for _, rr := range []string{"node1", "node2"} {
		patch := fmt.Sprintf(`{"metadata":{"labels":{%q:"true"}}}`, tabbyv1.LabelRouteReflector)
		if _, err := l.CS.CoreV1().Nodes().Patch(ctx, rr, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	rrSessions := waitAllBGP(b, l, 3*time.Minute, func(node string, st *nodestatus.Status) error {
		want := 2
		if node == "node1" || node == "node2" {
			want = nodes - 1
		}
		if len(st.Peers) != want {
			return fmt.Errorf("%d sessions, want %d", len(st.Peers), want)
		}
		for _, p := range st.Peers {
			if p.Type == "node-mesh" {
				return fmt.Errorf("still a mesh session with %s", p.Address)
			}
		}
		return nil
	})
	b.Logf("%d nodes: mesh -> 2 route reflectors in %v", nodes, time.Since(start).Round(time.Millisecond))
	claim, pod = benchSamples(b, l, w, "rr", samples)
	report("rr", rrSessions, claim, pod)
}
