package bench

// Route convergence and per-node cost of tabbyd, full mesh against route
// reflectors (issue 3, section 5):
//
//	go test -run '^$' -bench RouteConvergence -benchtime 1x -timeout 30m ./test/bench/
//
// 30 nodes of real kubelets and containerds do not fit on a small machine,
// and the benchmark needs no kubelet: each node is a network namespace on
// one bridge (the BGP underlay) running tabbyd alone, against the shared
// control plane of this package. The benchmark registers the nodes' Node
// objects as a kubelet would (Ready, InternalIP and Hostname) and adds pods
// as a runtime would: a Pod object bound to the node, then CNI ADD through
// the tabby plugin (libcni, inside the node's namespace), whose IPAM asks
// the node's tabbyd, which claims a new block for each pod (the pool's
// blocks are /32). What is timed is that block's claim until its route is
// in every other node's kernel.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"

	tabbyv1 "github.com/tabbynet/tabby/api/v1"
	"github.com/tabbynet/tabby/daemon/nodestatus"
	"github.com/tabbynet/tabby/daemon/routing"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/internal/controlplane/clustertest"
	"github.com/tabbynet/tabby/internal/netnstest"
	"github.com/tabbynet/tabby/internal/testnet"
)

// convSubnet is the underlay's subnet: node i (0-based) is .11+i.
var convSubnet = netip.MustParsePrefix("10.79.0.0/24")

// convNode is a node of the benchmark: its namespace and tabbyd.
type convNode struct {
	*testnet.Node
	tabbyd *testnet.Tabbyd
	ip     netip.Addr
}

// convSubnet6 is the underlay's IPv6 subnet of a dual-stack run: node i
// (0-based) is ::11+i (hex).
var convSubnet6 = netip.MustParsePrefix("fd00:79::/64")

// startNodes makes count nodes named prefix-nodeI on u, each with its
// tabbyd, a few at a time; dual gives them an IPv6 address too.
func startNodes(b *testing.B, u *netnstest.Net, prefix string, count int, dual bool) []*convNode {
	b.Helper()
	nodes := make([]*convNode, count)
	errs := make([]error, count)
	sem := make(chan struct{}, 6)
	var wg sync.WaitGroup
	for i := range count {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			nodes[i], errs[i] = startNode(b, u, fmt.Sprintf("%s-node%d", prefix, i+1), i, dual)
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		b.Fatal(err)
	}
	return nodes
}

func startNode(b *testing.B, u *netnstest.Net, name string, i int, dual bool) (*convNode, error) {
	ctx := context.Background()
	n, err := testnet.NewNode(ctx, testnet.NodeOptions{
		Name: name,
		Dir:  b.TempDir(),
		// One family only: the uplink that leads nowhere holds the default
		// route; eth0 on the underlay is the node's address.
		UplinkAddrs: []string{"10.254.0.1/24"},
		Sysctls:     map[string]string{"net/ipv4/ip_forward": "1"},
		PluginDirs:  []string{binDir},
		Cluster:     clustertest.Cluster(b),
	})
	if err != nil {
		return nil, err
	}
	b.Cleanup(func() {
		if err := n.Close(); err != nil {
			b.Errorf("removing node %s: %v", name, err)
		}
	})
	ip, ip6 := convSubnet.Addr(), convSubnet6.Addr()
	for range 11 + i {
		ip, ip6 = ip.Next(), ip6.Next()
	}
	addrs, nodeIP := []string{netip.PrefixFrom(ip, convSubnet.Bits()).String()}, ip.String()
	if dual {
		addrs, nodeIP = append(addrs, netip.PrefixFrom(ip6, convSubnet6.Bits()).String()), nodeIP+","+ip6.String()
	}
	if err := u.Plug(n.NS, "eth0", fmt.Sprintf("p%d", i+1), "br0", addrs...); err != nil {
		return nil, fmt.Errorf("plugging %s into the underlay: %w", name, err)
	}
	if err := n.Register(ctx, ip, "tabbyd alone (route convergence benchmark)"); err != nil {
		return nil, err
	}
	// tabbyd as the DaemonSet runs it, but for the node's addresses (no
	// kubelet here says which address is the node's).
	// TABBY_BENCH_LOG_LEVEL=debug logs every BGP UPDATE sent and received
	// (timestamps for a breakdown; it slows tabbyd down),
	// TABBY_BENCH_LOGS=DIR keeps each node's log there, and
	// TABBY_BENCH_TABBYD_ARGS adds flags (--profiling, to profile a node).
	args := append([]string{"--node-ip", nodeIP, "--log-level", cmp.Or(os.Getenv("TABBY_BENCH_LOG_LEVEL"), "info")},
		strings.Fields(os.Getenv("TABBY_BENCH_TABBYD_ARGS"))...)
	d, err := n.StartTabbyd(ctx, tabbyd, args...)
	if err != nil {
		return nil, err
	}
	b.Cleanup(func() {
		if err := d.Stop(); err != nil {
			b.Errorf("stopping the tabbyd of %s: %v", name, err)
		}
		if dir := os.Getenv("TABBY_BENCH_LOGS"); dir != "" {
			if err := keepLog(d.Log, filepath.Join(dir, name+".log")); err != nil {
				b.Errorf("keeping the log of %s: %v", name, err)
			}
		}
	})
	return &convNode{Node: n, tabbyd: d, ip: ip}, nil
}

// keepLog copies a tabbyd log to dst, making its folder.
func keepLog(src, dst string) error {
	data, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	return os.WriteFile(dst, data, 0o644)
}

// routeWatch records, for every node, when tabby's route to each prefix
// first appeared (netlink route notifications in each node's namespace),
// and when each IPAM block was created (a watch on the API).
type routeWatch struct {
	mu      sync.Mutex
	routes  map[netip.Prefix]map[string]time.Time // prefix -> node -> first seen
	blocks  map[netip.Prefix]time.Time            // block -> created (watch event)
	owner   map[netip.Prefix]string
	changed chan struct{}
	stop    chan struct{}
}

func watchRoutes(b *testing.B, ds *datastore.Client, nodes []*convNode) *routeWatch {
	b.Helper()
	w := &routeWatch{routes: map[netip.Prefix]map[string]time.Time{}, blocks: map[netip.Prefix]time.Time{},
		owner: map[netip.Prefix]string{}, changed: make(chan struct{}, 1), stop: make(chan struct{})}
	b.Cleanup(func() { close(w.stop) })
	for _, n := range nodes {
		h, err := netns.GetFromPath(n.NS.Path())
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
	bw, err := ds.IPAMBlocks.Watch(context.Background(), metav1.ListOptions{})
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

// dump writes, when TABBY_BENCH_LOGS is set, every block the watch saw
// there: its owner, when it was created and when each node routed it (for
// lining up with the nodes' logs).
func (w *routeWatch) dump(b *testing.B, name string) {
	dir := os.Getenv("TABBY_BENCH_LOGS")
	if dir == "" {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	var sb strings.Builder
	for p, created := range w.blocks {
		fmt.Fprintf(&sb, "%s owner=%s created=%s", p, w.owner[p], created.Format(time.RFC3339Nano))
		for node, at := range w.routes[p] {
			fmt.Fprintf(&sb, " %s=%s", node, at.Format(time.RFC3339Nano))
		}
		sb.WriteString("\n")
	}
	err := os.MkdirAll(dir, 0o755)
	if err == nil {
		err = os.WriteFile(filepath.Join(dir, name), []byte(sb.String()), 0o644)
	}
	if err != nil {
		b.Errorf("keeping the routes seen: %v", err)
	}
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
func (w *routeWatch) converged(b *testing.B, addr netip.Addr, nodes []*convNode, d time.Duration) (claimed, routed time.Time) {
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
				if n.Name == w.owner[blk] {
					continue
				}
				at, ok := w.routes[blk][n.Name]
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

// tabbydRSS is the resident memory of each node's tabbyd in MiB: all of
// it (VmRSS), and its anonymous part (RssAnon: heap, stacks), without the
// pages of the tabbyd binary that the process maps (RssFile).
func tabbydRSS(b *testing.B, nodes []*convNode) (rss, anon []float64) {
	b.Helper()
	for _, n := range nodes {
		data, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(n.tabbyd.Cmd.Process.Pid), "status"))
		if err != nil {
			b.Fatal(err)
		}
		for _, line := range strings.Split(string(data), "\n") {
			f := strings.Fields(line)
			if len(f) < 2 {
				continue
			}
			kb, _ := strconv.Atoi(f[1])
			switch f[0] {
			case "VmRSS:":
				rss = append(rss, float64(kb)/1024)
			case "RssAnon:":
				anon = append(anon, float64(kb)/1024)
			}
		}
	}
	return rss, anon
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

// convPod is a pod the benchmark added.
type convPod struct {
	*testnet.Pod
	node *convNode
	ip   netip.Addr
}

// addSamples adds pods one at a time, round robin over the nodes, each
// claiming a new block (the pool's blocks are /32), and measures how long
// each block takes to be routed on every other node: from its claim, and
// from the pod's addition (its Pod object created, then CNI ADD: the
// plugin, the node's tabbyd and the claim included). The benchmark's
// cleanup deletes the pods (CNI DEL, as a runtime does).
func addSamples(b *testing.B, nodes []*convNode, confs map[string]*libcni.NetworkConfigList, pool string, w *routeWatch, prefix string, samples int) (fromClaim, fromPod []time.Duration, pods []*convPod) {
	b.Helper()
	for i := range samples {
		p, created, ips := addPod(b, nodes[i%len(nodes)], confs, prefix, i, map[string]string{tabbyv1.AnnotationIPv4Pools: fmt.Sprintf("[%q]", pool)})
		claimed, routed := w.converged(b, ips[0], nodes, time.Minute)
		fromClaim = append(fromClaim, routed.Sub(claimed))
		fromPod = append(fromPod, routed.Sub(created))
		pods = append(pods, &convPod{Pod: p.Pod, node: p.node, ip: ips[0]})
	}
	return fromClaim, fromPod, pods
}

// addPod adds sample i on n: its Pod object with annotations, then CNI
// ADD. It returns the pod, when its object was created, and its
// addresses (IPv4 first); the benchmark's cleanup deletes it.
func addPod(b *testing.B, n *convNode, confs map[string]*libcni.NetworkConfigList, prefix string, i int, annotations map[string]string) (*convPod, time.Time, []netip.Addr) {
	b.Helper()
	ctx := context.Background()
	list := confs[n.Name]
	p, err := testnet.NewPod(metav1.NamespaceDefault, fmt.Sprintf("%s-%s-%d", n.Name, prefix, i))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := n.Del(context.Background(), list, p, nil); err != nil {
			b.Errorf("DEL of %s: %v", p.Name, err)
		}
		_ = p.Close()
		_ = n.DeletePodObject(context.Background(), p)
	})
	created := time.Now()
	if err := n.CreatePodObject(ctx, p, annotations); err != nil {
		b.Fatal(err)
	}
	res, err := n.Add(ctx, list, p, nil)
	if err != nil {
		b.Fatalf("ADD of %s on %s: %v", p.Name, n.Name, err)
	}
	var ips []netip.Addr
	for _, v6 := range []bool{false, true} {
		for _, ip := range testnet.ResultIPs(res, v6) {
			a, _ := netip.AddrFromSlice(ip)
			ips = append(ips, a.Unmap())
		}
	}
	if len(ips) == 0 {
		b.Fatalf("ADD of %s gave no address: %v", p.Name, res)
	}
	return &convPod{Pod: p, node: n}, created, ips
}

// cleanupPool deletes the pool and what IPAM left of it for the run's
// nodes (blocks, affinities), once their tabbyds are gone.
func cleanupPool(b *testing.B, ds *datastore.Client, pool, prefix string) {
	ctx := context.Background()
	var errs []error
	if blocks, err := ds.IPAMBlocks.List(ctx, metav1.ListOptions{}); err == nil {
		for _, blk := range blocks.Items {
			if strings.HasPrefix(strings.TrimPrefix(blk.Spec.Affinity, "host:"), prefix+"-") {
				errs = append(errs, ds.IPAMBlocks.Delete(ctx, blk.Name, metav1.DeleteOptions{}))
			}
		}
	}
	if affs, err := ds.BlockAffinities.List(ctx, metav1.ListOptions{}); err == nil {
		for _, a := range affs.Items {
			if strings.HasPrefix(a.Spec.Node, prefix+"-") {
				errs = append(errs, ds.BlockAffinities.Delete(ctx, a.Name, metav1.DeleteOptions{}))
			}
		}
	}
	errs = append(errs, ds.IPPools.Delete(ctx, pool, metav1.DeleteOptions{}))
	if err := errors.Join(errs...); err != nil {
		b.Errorf("removing pool %s: %v", pool, err)
	}
}

// nodeStatus asks a node's tabbyd for its status (from inside the node).
func nodeStatus(ctx context.Context, n *testnet.Node) (*nodestatus.Status, error) {
	hc := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DialContext: func(ctx context.Context, network, addr string) (c net.Conn, err error) {
		err = n.Do(func() (err error) {
			c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
			return err
		})
		return c, err
	}}}
	defer hc.CloseIdleConnections()
	return nodestatus.Fetch(ctx, hc, testnet.TabbydHealthAddr)
}

// waitAllBGP waits until every node's tabbyd is ready with sessions that
// ok accepts, all Established.
func waitAllBGP(b *testing.B, nodes []*convNode, d time.Duration, ok func(node string, st *nodestatus.Status) error) map[string]*nodestatus.Status {
	b.Helper()
	out := map[string]*nodestatus.Status{}
	deadline := time.Now().Add(d)
	for _, n := range nodes {
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			st, err := nodeStatus(ctx, n.Node)
			cancel()
			if err == nil {
				err = func() error {
					for _, p := range st.Peers {
						if !p.Established() {
							return fmt.Errorf("session with %s is %s", p.Address, p.State)
						}
					}
					if !st.Ready {
						return fmt.Errorf("not ready: %v", st.NotReady)
					}
					return ok(n.Name, st)
				}()
			}
			if err == nil {
				out[n.Name] = st
				break
			}
			if time.Now().After(deadline) {
				b.Fatalf("%s's tabbyd: %v (waited %v)\n%s", n.Name, err, d, n.tabbyd.LogTail(20))
			}
			time.Sleep(200 * time.Millisecond)
		}
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

// pingAcross pings from the first pod to the last (on another node): the
// routes the benchmark timed carry packets.
func pingAcross(b *testing.B, pods []*convPod) {
	b.Helper()
	from, to := pods[0], pods[len(pods)-1]
	if from.node == to.node {
		return
	}
	if err := testnet.Ping(from.NS, to.ip.AsSlice()); err != nil {
		b.Errorf("ping from %s (%s on %s) to %s (%s on %s): %v", from.Name, from.ip, from.node.Name, to.Name, to.ip, to.node.Name, err)
	}
}

// convRun is one run of a benchmark: its nodes, the watch on their
// routes and each node's conflist (naming its own kubeconfig and tabbyd's
// socket).
type convRun struct {
	ds    *datastore.Client
	nodes []*convNode
	w     *routeWatch
	confs map[string]*libcni.NetworkConfigList
}

// startRun creates pools (of the run's own: runs share the control plane;
// the cleanup removes them and what IPAM left of them), then count nodes
// named prefix-nodeI on an underlay of their own (dual: with an IPv6
// address too), watches their routes and makes each node's conflist with
// the tabby-ipam settings ipamConf (nil: the defaults).
func startRun(b *testing.B, prefix string, count int, dual bool, ipamConf map[string]any, pools ...*tabbyv1.IPPool) *convRun {
	b.Helper()
	start := time.Now()
	ds, err := datastore.New(clustertest.Cluster(b).RESTConfig())
	if err != nil {
		b.Fatal(err)
	}
	for _, p := range pools {
		if _, err := ds.IPPools.Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { cleanupPool(b, ds, p.Name, prefix) })
	}
	u := netnstest.NewNet(b, "br0")
	r := &convRun{ds: ds, nodes: startNodes(b, u, prefix, count, dual), confs: map[string]*libcni.NetworkConfigList{}}
	b.Logf("%d nodes (namespaces on one bridge, tabbyd alone in each; dual-stack %v) up in %v", count, dual, time.Since(start).Round(time.Millisecond))
	r.w = watchRoutes(b, ds, r.nodes)
	for _, n := range r.nodes {
		if r.confs[n.Name], err = testnet.ConfList(cniVersion, n.TabbyConf(ipamConf)); err != nil {
			b.Fatal(err)
		}
	}
	return r
}

// BenchmarkRouteConvergence: with 10 and 30 nodes (tabbyd alone in each),
// first as a full mesh, then with node1 and node2 labelled route
// reflectors, the time from the creation of a block (a pod ADD claiming
// it) until its route is installed on every other node (p50, p99), the
// BGP sessions per node and tabbyd's resident memory per node.
func BenchmarkRouteConvergence(b *testing.B) {
	for _, nodes := range []int{10, 30} {
		b.Run(fmt.Sprintf("nodes=%d", nodes), func(b *testing.B) {
			for i := range b.N {
				benchConvergence(b, nodes, i)
			}
		})
	}
}

func benchConvergence(b *testing.B, count, run int) {
	samples := max(20, count)
	ctx := context.Background()
	prefix := fmt.Sprintf("rc%d-%d", count, run)
	pool := &tabbyv1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: prefix},
		Spec: tabbyv1.IPPoolSpec{CIDR: fmt.Sprintf("10.%d.0.0/16", 200+(count+run)%50), BlockSize: 32}}
	r := startRun(b, prefix, count, false, nil, pool)
	ds, nodes, w, confs := r.ds, r.nodes, r.w, r.confs
	report := func(topology string, sessions map[string]*nodestatus.Status, fromClaim, fromPod []time.Duration) {
		slices.Sort(fromClaim)
		slices.Sort(fromPod)
		rss, anon := tabbydRSS(b, nodes)
		sm, slo, shi := stats(sessionCounts(sessions))
		rm, rlo, rhi := stats(rss)
		am, alo, ahi := stats(anon)
		ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
		p50, p99 := percentile(fromClaim, 50), percentile(fromClaim, 99)
		pp50, pp99 := percentile(fromPod, 50), percentile(fromPod, 99)
		b.Logf("%d nodes, %s, %d samples: block claim -> routed on every other node p50 %.1f ms, p99 %.1f ms (max %.1f); "+
			"pod added (Pod object, CNI ADD) -> routed everywhere p50 %.1f ms, p99 %.1f ms; BGP sessions/node mean %.1f (%g..%g); tabbyd RSS/node mean %.1f MiB (%.1f..%.1f), of it anonymous %.1f MiB (%.1f..%.1f)",
			count, topology, len(fromClaim), ms(p50), ms(p99), ms(fromClaim[len(fromClaim)-1]), ms(pp50), ms(pp99), sm, slo, shi, rm, rlo, rhi, am, alo, ahi)
		b.ReportMetric(ms(p50), topology+"-claim-p50-ms")
		b.ReportMetric(ms(p99), topology+"-claim-p99-ms")
		b.ReportMetric(ms(pp50), topology+"-pod-p50-ms")
		b.ReportMetric(ms(pp99), topology+"-pod-p99-ms")
		b.ReportMetric(sm, topology+"-sessions/node")
		b.ReportMetric(rm, topology+"-rss-MiB/node")
		b.ReportMetric(am, topology+"-rss-anon-MiB/node")
	}

	meshStart := time.Now()
	meshSessions := waitAllBGP(b, nodes, 3*time.Minute, func(_ string, st *nodestatus.Status) error {
		if len(st.Peers) != count-1 {
			return fmt.Errorf("%d sessions, want %d", len(st.Peers), count-1)
		}
		return nil
	})
	b.Logf("%d nodes: full mesh established in %v", count, time.Since(meshStart).Round(time.Millisecond))
	claim, pod, pods := addSamples(b, nodes, confs, pool.Name, w, "mesh", samples)
	report("mesh", meshSessions, claim, pod)
	pingAcross(b, pods)

	rrStart := time.Now()
	for _, rr := range nodes[:2] {
		patch := fmt.Sprintf(`{"metadata":{"labels":{%q:"true"}}}`, tabbyv1.LabelRouteReflector)
		if _, err := ds.Nodes.Patch(ctx, rr.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	rrSessions := waitAllBGP(b, nodes, 3*time.Minute, func(node string, st *nodestatus.Status) error {
		want := 2
		if node == nodes[0].Name || node == nodes[1].Name {
			want = count - 1
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
	b.Logf("%d nodes: mesh -> 2 route reflectors in %v", count, time.Since(rrStart).Round(time.Millisecond))
	claim, pod, pods = addSamples(b, nodes, confs, pool.Name, w, "rr", samples)
	report("rr", rrSessions, claim, pod)
	pingAcross(b, pods)
	w.dump(b, prefix+"-routes.txt")
}
