package labtest

// The chaos test's AddressMonitor: no address held by two running pods,
// checked from the API server and from every pod sandbox's eth0.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"

	tabbyv1 "github.com/tabbynet/tabby/api/v1"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/ipam/gc"
	"github.com/tabbynet/tabby/lab"
)

// PodRecord is what an AddressMonitor saw of one pod (names are unique
// in a chaos test: a name is never reused).
type PodRecord struct {
	// Key is namespace/name.
	Key, UID, Node string
	// FirstSeen: in the API; GoneAt: deleted from the API (zero while it
	// exists).
	FirstSeen, GoneAt time.Time
	Phase             corev1.PodPhase
	Deleting          bool
	// StatusIPs are the addresses of its status now; EverIPs all it ever
	// listed.
	StatusIPs []netip.Addr
	EverIPs   []netip.Addr
	// Alloc are the addresses IPAM's blocks hold for it now;
	// EverAllocated says they ever held one, AllocFreedAt when the last
	// of them was freed (zero while some are held).
	Alloc         map[netip.Addr]bool
	EverAllocated bool
	AllocFreedAt  time.Time
}

// Violation is an address held by two running pods at once.
type Violation struct {
	// Source is "api" (two Running pods, neither being deleted, list it in
	// their status), "kernel" (the eth0 of two Running pods' sandboxes
	// carries it) or "kernel-stale" (a Running pod's and that of a
	// sandbox whose pod no longer runs, on a node whose kubelet is up).
	Source  string
	IP      netip.Addr
	Holders []string
	// First and Last seen, and in how many samples.
	First, Last time.Time
	Samples     int
}

func (v Violation) String() string {
	return fmt.Sprintf("%s: %s held by %v from %s to %s (%d samples)", v.Source, v.IP, v.Holders,
		v.First.Format("15:04:05.000"), v.Last.Format("15:04:05.000"), v.Samples)
}

// StaleHolding is an address on the eth0 of a pod sandbox whose pod no
// longer exists (or is not Running), while a Running pod holds it: a
// sandbox its kubelet has not torn down (a node that died).
type StaleHolding struct {
	IP          netip.Addr
	Sandbox     string
	Node        string
	Holder      string
	First, Last time.Time
}

// nodeCgroup is where a node's pods live in the kernel.
type nodeCgroup struct {
	name string
	// kubepods is the kubelet's pod cgroup tree in one hierarchy.
	kubepods string
	// netns is the inode of the node's network namespace (hostNetwork
	// pods share it).
	netns uint64
}

// sandbox is a running pod sandbox found in a node's cgroups.
type sandbox struct {
	node, uid string
	// netns is /proc/PID/ns/net of one of its processes (the pause
	// process when there is one).
	netns string
	addrs []netip.Addr
}

// AddressMonitor checks continuously (on every pod event, and every
// interval from a fresh list of the API server and from the kernel) that
// no address is held by two running pods, and follows IPAM's blocks to see
// when the addresses of each pod are freed. It watches every pod of the
// cluster but hostNetwork ones (CoreDNS's hold pool addresses too). It
// lists rather than relies on informers alone: after an API server outage
// a reflector may wait a while before it lists again.
type AddressMonitor struct {
	l        *Lab
	ds       *datastore.Client
	interval time.Duration
	nodes    []nodeCgroup
	hostNS   uint64

	mu                                    sync.Mutex
	pods                                  map[string]*PodRecord
	rv                                    map[string]uint64 // resourceVersion of the pod object last applied
	byUID                                 map[string]string // pod UID -> key
	blocks                                map[string]blockView
	violations                            map[string]*Violation
	stale                                 map[string]*StaleHolding
	apiSamples, kernelSamples, listErrors int
	maxRunning, kernelAddrs               int
	kernelErrors                          int
	// kernelRunning counts the sandboxes (over all kernel checks) whose
	// pod was Running: the kernel check judged those.
	kernelRunning              int
	lastKernelErr, lastListErr string
	// mismatches: Running pods whose eth0 lacks their status address.
	mismatches map[string]int
	// nodesDown are nodes whose kubelet is down (stale sandboxes there are
	// expected).
	nodesDown map[string]bool
	// sandboxes are those of the last kernel check.
	sandboxes []sandbox

	cancel context.CancelFunc
	done   chan struct{}
}

// cgroupMounts are the mount points of the machine's cgroup hierarchies.
func cgroupMounts() ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS... - FSTYPE SOURCE SUPER
		fields := strings.Fields(sc.Text())
		i := slices.Index(fields, "-")
		if i < 0 || i+1 >= len(fields) || len(fields) < 5 {
			continue
		}
		if fs := fields[i+1]; fs == "cgroup" || fs == "cgroup2" {
			out = append(out, fields[4])
		}
	}
	return out, sc.Err()
}

// nodeCgroups finds each node's kubepods tree (in the first hierarchy
// that has it) and network namespace.
func nodeCgroups(st *lab.State) ([]nodeCgroup, error) {
	mounts, err := cgroupMounts()
	if err != nil {
		return nil, err
	}
	var out []nodeCgroup
	for _, n := range st.Nodes {
		nc := nodeCgroup{name: n.Name}
		for _, m := range mounts {
			p := filepath.Join(m, n.CgroupRoot, "kubepods")
			if _, err := os.Stat(p); err == nil {
				nc.kubepods = p
				break
			}
		}
		if nc.kubepods == "" {
			return nil, fmt.Errorf("node %s: no cgroup hierarchy holds %s/kubepods", n.Name, n.CgroupRoot)
		}
		if nc.netns, err = nsInode(lab.NetNSPath(n.NetNS)); err != nil {
			return nil, err
		}
		out = append(out, nc)
	}
	return out, nil
}

func nsInode(path string) (uint64, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return 0, err
	}
	return st.Ino, nil
}

// StartAddressMonitor starts watching the cluster's pods and IPAM's
// blocks. Stop ends it.
func (l *Lab) StartAddressMonitor(t testing.TB, interval time.Duration) *AddressMonitor {
	t.Helper()
	m := &AddressMonitor{l: l, ds: l.DS(t), interval: interval,
		pods: map[string]*PodRecord{}, rv: map[string]uint64{}, byUID: map[string]string{}, blocks: map[string]blockView{},
		violations: map[string]*Violation{}, stale: map[string]*StaleHolding{}, nodesDown: map[string]bool{},
		mismatches: map[string]int{}, done: make(chan struct{})}
	var err error
	if m.nodes, err = nodeCgroups(l.State); err != nil {
		t.Fatal(err)
	}
	if m.hostNS, err = nsInode("/proc/self/ns/net"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	m.cancel = cancel
	factory := informers.NewSharedInformerFactory(l.CS, 0)
	podInf := factory.Core().V1().Pods().Informer()
	_, _ = podInf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { m.podEvent(o, false) },
		UpdateFunc: func(_, o any) { m.podEvent(o, false) },
		DeleteFunc: func(o any) { m.podEvent(o, true) },
	})
	factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), podInf.HasSynced) {
		cancel()
		t.Fatal("the address monitor's pod cache did not sync")
	}
	m.pollAPI(ctx)
	go m.run(ctx)
	return m
}

// NodeDown tells the monitor that a node's kubelet is down (or back), so
// that the sandboxes it leaves are stale, not violations.
func (m *AddressMonitor) NodeDown(node string, down bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if down {
		m.nodesDown[node] = true
	} else {
		delete(m.nodesDown, node)
	}
}

func (m *AddressMonitor) record(key string) *PodRecord {
	r := m.pods[key]
	if r == nil {
		r = &PodRecord{Key: key, FirstSeen: time.Now(), Alloc: map[netip.Addr]bool{}}
		m.pods[key] = r
	}
	return r
}

func (m *AddressMonitor) podEvent(o any, deleted bool) {
	if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
		o = d.Obj
	}
	p, ok := o.(*corev1.Pod)
	if !ok || p.Spec.HostNetwork {
		return
	}
	now := time.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	m.applyPodLocked(p, deleted, now)
	m.checkAPILocked(now)
}

// applyPodLocked records what a pod object says, unless a newer version
// of it was applied already (events and lists race).
func (m *AddressMonitor) applyPodLocked(p *corev1.Pod, deleted bool, now time.Time) {
	key := p.Namespace + "/" + p.Name
	rv, _ := strconv.ParseUint(p.ResourceVersion, 10, 64)
	if rv < m.rv[key] {
		return
	}
	m.rv[key] = rv
	r := m.record(key)
	if !r.GoneAt.IsZero() {
		return // names are never reused: gone is final
	}
	r.UID = string(p.UID)
	if p.Spec.NodeName != "" {
		r.Node = p.Spec.NodeName
	}
	if r.UID != "" {
		m.byUID[r.UID] = key
	}
	r.Phase, r.Deleting = p.Status.Phase, p.DeletionTimestamp != nil
	r.StatusIPs = r.StatusIPs[:0]
	for _, ip := range p.Status.PodIPs {
		if a, err := netip.ParseAddr(ip.IP); err == nil {
			r.StatusIPs = append(r.StatusIPs, a)
			if !slices.Contains(r.EverIPs, a) {
				r.EverIPs = append(r.EverIPs, a)
			}
		}
	}
	if deleted {
		r.GoneAt = now
		r.Phase, r.StatusIPs = "", nil
	}
}

// pollAPI lists the pods and IPAM's blocks: pods missing from the list
// are gone; allocations are taken from the blocks.
func (m *AddressMonitor) pollAPI(ctx context.Context) {
	lctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	pods, err := m.l.CS.CoreV1().Pods(metav1.NamespaceAll).List(lctx, metav1.ListOptions{})
	var blocks *tabbyv1.IPAMBlockList
	if err == nil {
		blocks, err = m.ds.IPAMBlocks.List(lctx, metav1.ListOptions{})
	}
	now := time.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	if err != nil {
		m.listErrors++
		m.lastListErr = err.Error()
		return
	}
	listRV, _ := strconv.ParseUint(pods.ResourceVersion, 10, 64)
	listed := map[string]bool{}
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Spec.HostNetwork {
			continue
		}
		listed[p.Namespace+"/"+p.Name] = true
		m.applyPodLocked(p, false, now)
	}
	for key, r := range m.pods {
		if !listed[key] && r.GoneAt.IsZero() && m.rv[key] != 0 && m.rv[key] <= listRV {
			r.GoneAt = now
			r.Phase, r.StatusIPs = "", nil
		}
	}
	m.blocks = map[string]blockView{}
	for i := range blocks.Items {
		b := &blocks.Items[i]
		m.blocks[b.Name] = blockView{node: strings.TrimPrefix(b.Spec.Affinity, "host:"), allocs: gc.Allocations(b)}
	}
	held := map[string]map[netip.Addr]bool{}
	for _, bv := range m.blocks {
		for _, a := range bv.allocs {
			if a.Attr.Pod == "" {
				continue
			}
			key := a.Attr.Namespace + "/" + a.Attr.Pod
			if held[key] == nil {
				held[key] = map[netip.Addr]bool{}
			}
			held[key][a.IP] = true
		}
	}
	for key := range held {
		m.record(key)
	}
	for _, r := range m.pods {
		h := held[r.Key]
		if len(h) > 0 {
			r.EverAllocated = true
			r.AllocFreedAt = time.Time{}
		} else if len(r.Alloc) > 0 {
			r.AllocFreedAt = now
		}
		if h == nil {
			h = map[netip.Addr]bool{}
		}
		r.Alloc = h
	}
	m.checkAPILocked(now)
}

func (m *AddressMonitor) violation(source string, ip netip.Addr, holders []string, now time.Time) {
	sort.Strings(holders)
	key := source + "/" + ip.String() + "/" + strings.Join(holders, ",")
	v := m.violations[key]
	if v == nil {
		v = &Violation{Source: source, IP: ip, Holders: holders, First: now}
		m.violations[key] = v
	}
	v.Last = now
	v.Samples++
}

// checkAPILocked: no address in the status of two Running pods that are
// not being deleted. (A pod being deleted still lists its address after
// CNI DEL freed it, until the kubelet deletes the object: the kernel
// check judges those.)
func (m *AddressMonitor) checkAPILocked(now time.Time) {
	m.apiSamples++
	by := map[netip.Addr][]string{}
	for key, r := range m.pods {
		if r.Phase != corev1.PodRunning || r.Deleting || !r.GoneAt.IsZero() {
			continue
		}
		for _, ip := range r.StatusIPs {
			by[ip] = append(by[ip], key)
		}
	}
	m.maxRunning = max(m.maxRunning, len(by))
	for ip, holders := range by {
		if len(holders) > 1 {
			m.violation("api", ip, holders, now)
		}
	}
}

// netnsAddrs are the global addresses on eth0 of a network namespace
// (none when it has no eth0).
func netnsAddrs(path string) ([]netip.Addr, error) {
	h, err := netns.GetFromPath(path)
	if err != nil {
		return nil, err
	}
	defer h.Close()
	nh, err := netlink.NewHandleAt(h)
	if err != nil {
		return nil, err
	}
	defer nh.Close()
	link, err := nh.LinkByName("eth0")
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil, nil
		}
		return nil, err
	}
	addrs, err := nh.AddrList(link, netlink.FAMILY_ALL)
	if err != nil {
		return nil, err
	}
	var out []netip.Addr
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && ip.Unmap().IsGlobalUnicast() {
			out = append(out, ip.Unmap())
		}
	}
	return out, nil
}

// findSandboxes lists the running pod sandboxes of the nodes that have a
// network namespace of their own (hostNetwork pods are skipped), with the
// addresses on their eth0. kubelet's cgroupfs layout:
// ROOT/kubepods[/QOS]/podUID/CONTAINER.
func (m *AddressMonitor) findSandboxes() (out []sandbox, errs []error) {
	for _, nc := range m.nodes {
		_ = filepath.WalkDir(nc.kubepods, func(path string, d fs.DirEntry, err error) error {
			if err != nil || !d.IsDir() {
				return nil
			}
			uid, ok := strings.CutPrefix(d.Name(), "pod")
			if !ok || uid == "" {
				return nil
			}
			pids := lab.CgroupPids(path)
			// The sandbox's pause holds the namespace for the pod's life.
			slices.SortStableFunc(pids, func(a, b int) int {
				pa, pb := comm(a) == "pause", comm(b) == "pause"
				switch {
				case pa && !pb:
					return -1
				case pb && !pa:
					return 1
				}
				return 0
			})
			for _, pid := range pids {
				nsPath := "/proc/" + strconv.Itoa(pid) + "/ns/net"
				ino, err := nsInode(nsPath)
				if err != nil {
					continue // gone meanwhile
				}
				if ino == nc.netns || ino == m.hostNS {
					break // hostNetwork
				}
				addrs, err := netnsAddrs(nsPath)
				if err != nil {
					if procStart(pid) != 0 && !errors.Is(err, syscall.ENOENT) && !errors.Is(err, syscall.ESRCH) {
						errs = append(errs, fmt.Errorf("pod %s on %s: %w", uid, nc.name, err))
					}
					continue
				}
				out = append(out, sandbox{node: nc.name, uid: uid, netns: nsPath, addrs: addrs})
				break
			}
			return filepath.SkipDir
		})
	}
	return out, errs
}

// checkKernel reads the eth0 addresses of every pod sandbox of the
// lab's nodes: an address on two sandboxes whose pods are both Running is
// a violation; on one of a Running pod and a stale sandbox, a stale
// holding (a violation too unless the stale sandbox's node is down).
func (m *AddressMonitor) checkKernel() {
	sbs, errs := m.findSandboxes()
	now := time.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	m.sandboxes = sbs
	m.kernelSamples++
	m.kernelErrors += len(errs)
	if len(errs) > 0 {
		m.lastKernelErr = errs[len(errs)-1].Error()
	}
	type holder struct {
		key string
		sb  sandbox
	}
	by := map[netip.Addr][]holder{}
	for _, sb := range sbs {
		key := m.byUID[sb.uid]
		if key == "" {
			key = "uid:" + sb.uid
		}
		m.kernelAddrs += len(sb.addrs)
		for _, a := range sb.addrs {
			by[a] = append(by[a], holder{key: key, sb: sb})
		}
	}
	running := func(key string) (*PodRecord, bool) {
		r := m.pods[key]
		return r, r != nil && r.GoneAt.IsZero() && r.Phase == corev1.PodRunning
	}
	for ip, hs := range by {
		if len(hs) < 2 {
			continue
		}
		var live []string
		var stale []holder
		for _, h := range hs {
			if _, ok := running(h.key); ok {
				live = append(live, h.key+"@"+h.sb.node)
			} else {
				stale = append(stale, h)
			}
		}
		if len(live) > 1 {
			m.violation("kernel", ip, live, now)
		}
		if len(live) == 1 {
			for _, s := range stale {
				if !m.nodesDown[s.sb.node] {
					m.violation("kernel-stale", ip, []string{live[0], "stale:" + s.key + "@" + s.sb.node}, now)
					continue
				}
				k := ip.String() + "/" + s.sb.uid
				st := m.stale[k]
				if st == nil {
					st = &StaleHolding{IP: ip, Sandbox: s.key, Node: s.sb.node, Holder: live[0], First: now}
					m.stale[k] = st
				}
				st.Last = now
			}
		}
	}
	// A Running pod's eth0 should carry its status addresses.
	for _, sb := range sbs {
		key := m.byUID[sb.uid]
		r, ok := running(key)
		if ok {
			m.kernelRunning++
		}
		if ok && !r.Deleting {
			for _, ip := range r.StatusIPs {
				if !slices.Contains(sb.addrs, ip) {
					m.mismatches[key+" "+ip.String()]++
				}
			}
		}
	}
}

// ProveKernelCheck shows that the kernel check catches a double holding
// on the real sandboxes: with the monitor stopped, it adds the address of
// one Running pod to the eth0 of another's sandbox, runs a kernel check,
// takes the address away again and returns what that check found (the
// violation is not kept in the report).
func (m *AddressMonitor) ProveKernelCheck() (Violation, error) {
	m.checkKernel()
	m.mu.Lock()
	var from, to *sandbox
	var ip netip.Addr
	for i := range m.sandboxes {
		sb := &m.sandboxes[i]
		r := m.pods[m.byUID[sb.uid]]
		if r == nil || r.Phase != corev1.PodRunning || !r.GoneAt.IsZero() || len(sb.addrs) == 0 || !slices.Contains(r.StatusIPs, sb.addrs[0]) {
			continue
		}
		if from == nil {
			from, ip = sb, sb.addrs[0]
		} else if to == nil {
			to = sb
		}
	}
	m.mu.Unlock()
	if to == nil {
		return Violation{}, errors.New("fewer than two Running pods with sandboxes: nothing to prove the kernel check on")
	}
	h, err := netns.GetFromPath(to.netns)
	if err != nil {
		return Violation{}, err
	}
	defer h.Close()
	nh, err := netlink.NewHandleAt(h)
	if err != nil {
		return Violation{}, err
	}
	defer nh.Close()
	link, err := nh.LinkByName("eth0")
	if err != nil {
		return Violation{}, err
	}
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: ip.AsSlice(), Mask: net.CIDRMask(ip.BitLen(), ip.BitLen())}}
	if err := nh.AddrAdd(link, addr); err != nil {
		return Violation{}, fmt.Errorf("adding %s to the eth0 of pod %s: %w", ip, to.uid, err)
	}
	m.checkKernel()
	if err := nh.AddrDel(link, addr); err != nil {
		return Violation{}, fmt.Errorf("taking %s from the eth0 of pod %s again: %w", ip, to.uid, err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for key, v := range m.violations {
		if v.Source == "kernel" && v.IP == ip {
			delete(m.violations, key)
			return *v, nil
		}
	}
	return Violation{}, fmt.Errorf("the kernel check missed %s on the eth0 of pods %s and %s", ip, from.uid, to.uid)
}

// StaleSandboxes are the running sandboxes on node whose pods are gone
// from the API (at the last kernel check).
func (m *AddressMonitor) StaleSandboxes(node string) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for _, sb := range m.sandboxes {
		if sb.node != node {
			continue
		}
		if r := m.pods[m.byUID[sb.uid]]; r != nil && !r.GoneAt.IsZero() {
			out = append(out, r.Key)
		}
	}
	sort.Strings(out)
	return out
}

// KernelSamples is how many kernel checks ran so far.
func (m *AddressMonitor) KernelSamples() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.kernelSamples
}

func (m *AddressMonitor) run(ctx context.Context) {
	defer close(m.done)
	t := time.NewTicker(m.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		m.pollAPI(ctx)
		m.checkKernel()
	}
}

// Stop ends the monitor; it may be called again.
func (m *AddressMonitor) Stop() {
	m.cancel()
	<-m.done
}

// MonitorReport is what an AddressMonitor found.
type MonitorReport struct {
	APISamples, KernelSamples int
	KernelErrors              int
	LastKernelError           string
	ListErrors                int
	// MaxRunning: most Running pods with addresses in one API check;
	// KernelAddrs: pod addresses read from the kernel in all;
	// KernelRunning: sandboxes of Running pods seen in all.
	MaxRunning, KernelAddrs, KernelRunning int
	LastListError                          string
	// Mismatches: Running pods (and address) whose eth0 lacked their
	// status address, in how many samples.
	Mismatches map[string]int
	Violations []Violation
	Stale      []StaleHolding
}

// Report returns the violations and counts so far.
func (m *AddressMonitor) Report() MonitorReport {
	m.mu.Lock()
	defer m.mu.Unlock()
	r := MonitorReport{APISamples: m.apiSamples, KernelSamples: m.kernelSamples, KernelErrors: m.kernelErrors,
		LastKernelError: m.lastKernelErr, Mismatches: maps.Clone(m.mismatches), ListErrors: m.listErrors, LastListError: m.lastListErr,
		MaxRunning: m.maxRunning, KernelAddrs: m.kernelAddrs, KernelRunning: m.kernelRunning}
	for _, v := range m.violations {
		r.Violations = append(r.Violations, *v)
	}
	sort.Slice(r.Violations, func(i, j int) bool { return r.Violations[i].First.Before(r.Violations[j].First) })
	for _, s := range m.stale {
		r.Stale = append(r.Stale, *s)
	}
	sort.Slice(r.Stale, func(i, j int) bool { return r.Stale[i].First.Before(r.Stale[j].First) })
	return r
}

// Pods returns a copy of the records of every pod seen, by namespace/name.
func (m *AddressMonitor) Pods() map[string]PodRecord {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[string]PodRecord, len(m.pods))
	for k, r := range m.pods {
		c := *r
		c.Alloc = maps.Clone(r.Alloc)
		c.StatusIPs = slices.Clone(r.StatusIPs)
		c.EverIPs = slices.Clone(r.EverIPs)
		out[k] = c
	}
	return out
}

// NodeAllocations counts the allocations IPAM's blocks hold for node and
// the blocks affine to it.
func (m *AddressMonitor) NodeAllocations(node string) (allocs, blocks int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, bv := range m.blocks {
		if bv.node == node {
			blocks++
		}
		for _, a := range bv.allocs {
			if a.Node() == node {
				allocs++
			}
		}
	}
	return allocs, blocks
}

// blockView is what the monitor keeps of a block.
type blockView struct {
	node   string
	allocs []gc.Allocation
}
