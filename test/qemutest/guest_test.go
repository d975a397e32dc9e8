package qemutest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/vishvananda/netlink"

	tabbyv1 "github.com/tabbynet/tabby/api/v1"
	"github.com/tabbynet/tabby/daemon/routing"
	"github.com/tabbynet/tabby/internal/controlplane"
	"github.com/tabbynet/tabby/internal/testnet"
)

// The guest's part: runs as the VM's only program, prints to the serial
// console and returns the exit status /init reports.

// guestMain runs the scenario from the configuration at path and prints a
// CHECK line for each check; any failure makes the status 1.
func guestMain(path string) int {
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	failed, err := runGuest(ctx, path)
	if err != nil {
		fmt.Printf("GUEST ERROR: %v\n", err)
		return 1
	}
	fmt.Printf("GUEST done in %s, %d of %d checks failed\n", time.Since(start).Round(time.Second), failed, len(checks))
	if failed > 0 {
		return 1
	}
	return 0
}

// guestNode is a node of the VM: its namespace, address and tabbyd.
type guestNode struct {
	*testnet.Node
	ip     netip.Addr
	tabbyd *testnet.Tabbyd
}

func runGuest(ctx context.Context, path string) (failed int, err error) {
	cfg, err := readGuestConfig(path)
	if err != nil {
		return 0, err
	}
	c, err := controlplane.Connect(cfg.Server, []byte(cfg.CA), cfg.Token)
	if err != nil {
		return 0, err
	}
	undo := &cleanups{}
	defer undo.run()
	router, err := testnet.NewRouter(subnets...)
	if err != nil {
		return 0, err
	}
	undo.add(router.Close)
	var vms []*guestNode
	for _, spec := range nodes {
		n, err := startNode(ctx, c, cfg, router, spec, undo)
		if err != nil {
			return 0, err
		}
		vms = append(vms, n)
	}
	stamp("nodes and their tabbyds are up")
	pods, err := addPods(ctx, vms, undo)
	if err != nil {
		return 0, err
	}
	stamp("pods wired")
	for _, ch := range checks {
		if err := waitReachable(ctx, pods[ch.pool][ch.from], pods[ch.pool][ch.to]); err != nil {
			return 0, fmt.Errorf("%s: %w\n%s", ch.name(), err, vms[ch.from].tabbyd.LogTail(20))
		}
	}
	stamp("every pair answers")
	for _, ch := range checks {
		if err := runCheck(vms, pods, ch); err != nil {
			fmt.Printf("CHECK %s: FAIL: %v\n", ch.name(), err)
			failed++
		}
	}
	return failed, nil
}

// cleanups undoes what the guest made, last first; pods are wired
// concurrently, so add takes a lock.
type cleanups struct {
	mu sync.Mutex
	fs []func() error
}

func (c *cleanups) add(f func() error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.fs = append(c.fs, f)
}

func (c *cleanups) run() {
	for i := len(c.fs) - 1; i >= 0; i-- {
		if err := c.fs[i](); err != nil {
			fmt.Printf("GUEST cleanup: %v\n", err)
		}
	}
}

var guestStart = time.Now()

func stamp(what string) {
	fmt.Printf("GUEST [%5.1fs] %s\n", time.Since(guestStart).Seconds(), what)
}

func readGuestConfig(path string) (*guestConfig, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var cfg guestConfig
	if err := json.Unmarshal(b, &cfg); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &cfg, nil
}

// startNode makes the node of spec on the router, registers its Node as a
// kubelet would and starts its tabbyd; undo gets what undoes each.
func startNode(ctx context.Context, c *controlplane.Cluster, cfg *guestConfig, r *testnet.Router, spec nodeSpec, undo *cleanups) (*guestNode, error) {
	n, err := testnet.NewNode(ctx, testnet.NodeOptions{
		Name: spec.name,
		// One family: the uplink that leads nowhere holds the default
		// route; eth0 on the underlay is the node's address.
		UplinkAddrs: []string{"10.254.0.1/24"},
		Sysctls:     map[string]string{"net/ipv4/ip_forward": "1"},
		PluginDirs:  []string{cfg.BinDir},
		Cluster:     c,
	})
	if err != nil {
		return nil, err
	}
	undo.add(n.Close)
	if err := r.Plug(n, spec.subnet, spec.addr, underlayRoute); err != nil {
		return nil, err
	}
	ip := netip.MustParsePrefix(spec.addr).Addr()
	if err := n.Register(ctx, ip, "tabbyd alone (IPIP under qemu)"); err != nil {
		return nil, err
	}
	// Under TCG on a busy host tabbyd takes longer than the 30s a host
	// test allows it to sync its caches. The IPAM garbage collector is not
	// under test here: it stays off, leaving the guest's CPU to the rest.
	wait, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	d, err := n.StartTabbyd(wait, filepath.Join(cfg.BinDir, "tabbyd"), "--node-ip", ip.String(), "--log-level", "info", "--ipam-gc=false")
	if err != nil {
		return nil, err
	}
	undo.add(d.Stop)
	return &guestNode{Node: n, ip: ip, tabbyd: d}, nil
}

// guestPod is a pod and the address the plugin gave it.
type guestPod struct {
	*testnet.Pod
	node *guestNode
	ip   net.IP
}

// addPods wires one pod of each pool on each node, all at once, as
// runtimes would: its Pod object (naming the pool) first, then CNI ADD.
func addPods(ctx context.Context, vms []*guestNode, undo *cleanups) (map[string][]*guestPod, error) {
	made := make([][]*guestPod, len(pools))
	errs := make([]error, len(pools)*len(vms))
	var wg sync.WaitGroup
	for i, pl := range pools {
		made[i] = make([]*guestPod, len(vms))
		for j, n := range vms {
			wg.Go(func() { made[i][j], errs[i*len(vms)+j] = addPod(ctx, n, pl.name, undo) })
		}
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	out := map[string][]*guestPod{}
	for i, pl := range pools {
		for _, p := range made[i] {
			fmt.Printf("GUEST pod %s/%s on %s: %s\n", p.Namespace, p.Name, p.node.Name, p.ip)
		}
		out[pl.name] = made[i]
	}
	return out, nil
}

func addPod(ctx context.Context, n *guestNode, pool string, undo *cleanups) (*guestPod, error) {
	conf := n.TabbyConf(nil)
	// Under TCG tabbyd takes seconds to see the pod's allocation: give it
	// longer than the default 10s before the plugin gives up on its
	// policy, and the plugin's calls longer than a host test's 20s.
	conf["policyWaitTimeout"] = "90s"
	conf["timeout"] = "90s"
	list, err := testnet.ConfList("1.1.0", conf)
	if err != nil {
		return nil, err
	}
	p, err := testnet.NewPod("default", pool+"-"+n.Name)
	if err != nil {
		return nil, err
	}
	undo.add(p.Close)
	ann, _ := json.Marshal([]string{pool})
	if err := n.CreatePodObject(ctx, p, map[string]string{tabbyv1.AnnotationIPv4Pools: string(ann)}); err != nil {
		return nil, err
	}
	undo.add(func() error { return n.DeletePodObject(context.Background(), p) })
	res, err := n.Add(ctx, list, p, nil)
	if err != nil {
		return nil, fmt.Errorf("CNI ADD of %s on %s: %w\ntabbyd's log:\n%s", p.Name, n.Name, err, n.tabbyd.LogTail(30))
	}
	undo.add(func() error { return n.Del(context.Background(), list, p, nil) })
	ips := testnet.ResultIPs(res, false)
	if len(ips) == 0 {
		return nil, fmt.Errorf("CNI ADD of %s on %s gave no IPv4 address: %v", p.Name, n.Name, res)
	}
	return &guestPod{Pod: p, node: n, ip: ips[0]}, nil
}

// waitReachable pings to from from until an echo is answered: the nodes'
// routes come from BGP and the IPAM blocks, a few seconds after the pods.
func waitReachable(ctx context.Context, from, to *guestPod) error {
	for {
		err := testnet.Ping(from.NS, to.ip)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s on %s never answered %s on %s: %v", to.ip, to.node.Name, from.ip, from.node.Name, err)
		default:
		}
	}
}

// counters are a node's tunl0 packet counters.
type counters struct{ tx, rx uint64 }

func tunl0(n *guestNode) (counters, error) {
	var c counters
	err := n.Do(func() error {
		l, err := netlink.LinkByName(routing.IPIPDevice)
		if err != nil {
			return err
		}
		s := l.Attrs().Statistics
		c = counters{tx: s.TxPackets, rx: s.RxPackets}
		return nil
	})
	return c, err
}

// routeDevice is the device the node routes dst through.
func routeDevice(n *guestNode, dst net.IP) (string, error) {
	var dev string
	err := n.Do(func() error {
		rs, err := netlink.RouteGet(dst)
		if err != nil || len(rs) == 0 {
			return fmt.Errorf("no route to %s: %v", dst, err)
		}
		l, err := netlink.LinkByIndex(rs[0].LinkIndex)
		if err != nil {
			return err
		}
		dev = l.Attrs().Name
		return nil
	})
	return dev, err
}

// runCheck pings once more and judges the route and the tunl0 counters of
// both nodes, printing the CHECK line of a pass.
func runCheck(vms []*guestNode, pods map[string][]*guestPod, ch check) error {
	from, to := pods[ch.pool][ch.from], pods[ch.pool][ch.to]
	src, dst := vms[ch.from], vms[ch.to]
	dev, err := routeDevice(src, to.ip)
	if err != nil {
		return err
	}
	s0, err := tunl0(src)
	if err != nil {
		return err
	}
	d0, err := tunl0(dst)
	if err != nil {
		return err
	}
	if err := testnet.Ping(from.NS, to.ip); err != nil {
		return err
	}
	s1, _ := tunl0(src)
	d1, _ := tunl0(dst)
	got := fmt.Sprintf("route to %s via %s; tunl0 on %s tx +%d rx +%d, on %s rx +%d tx +%d (totals %d/%d, %d/%d)",
		to.ip, dev, src.Name, s1.tx-s0.tx, s1.rx-s0.rx, dst.Name, d1.rx-d0.rx, d1.tx-d0.tx, s1.tx, s1.rx, d1.rx, d1.tx)
	moved := s1.tx > s0.tx && s1.rx > s0.rx && d1.rx > d0.rx && d1.tx > d0.tx
	still := s1 == s0 && d1 == d0
	switch {
	case ch.tunnel && (dev != routing.IPIPDevice || !moved):
		return fmt.Errorf("want the echo and its reply through tunl0 both ways: %s", got)
	case !ch.tunnel && (dev == routing.IPIPDevice || !still):
		return fmt.Errorf("want no tunl0 traffic in the same subnet: %s", got)
	}
	fmt.Printf("CHECK %s: ok: %s\n", ch.name(), got)
	return nil
}
