package labtest

// Helpers of the chaos tests (chaos_test.go): a killer of CNI plugins in
// the middle of ADD, a monitor that checks continuously, from the API
// server and from the kernel, that no address is held by two running pods,
// and readers of what the lab's processes logged.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
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

// procStart is a process's start time (field 22 of /proc/PID/stat), 0 when
// it is gone.
func procStart(pid int) uint64 {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	i := strings.LastIndexByte(string(data), ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(data[i+1:]))
	if len(f) < 20 || f[0] == "Z" || f[0] == "X" {
		return 0
	}
	n, _ := strconv.ParseUint(f[19], 10, 64)
	return n
}

// KillProc sends SIGKILL to a process the lab recorded (if it is still
// that process) and waits until it is gone.
func KillProc(p lab.Proc) error {
	if !p.Alive() {
		return nil
	}
	if err := syscall.Kill(p.Pid, syscall.SIGKILL); err != nil {
		return fmt.Errorf("killing %s (pid %d): %w", p.Name, p.Pid, err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for p.Alive() {
		if time.Now().After(deadline) {
			return fmt.Errorf("%s (pid %d) survives SIGKILL", p.Name, p.Pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return nil
}

// CNIKill is one CNI plugin process killed in the middle of ADD.
type CNIKill struct {
	At  time.Time
	Pid int
	// Binary is tabby, or tabby-ipam when tabby had handed the command
	// over (tabbyd's agent was not there).
	Binary string
	Pod    string
	// Age is how long the ADD had run (since first seen).
	Age time.Duration
}

// CNIKiller SIGKILLs CNI plugin processes that run ADD for the lab's pods,
// a random time after they start, as a node that loses a runtime's child
// in the middle of its work would. It finds them among the children of
// the lab's kubelets (which run the plugins through libcni), by their
// environment (CNI_COMMAND=ADD).
type CNIKiller struct {
	l        *Lab
	prob     float64
	maxDelay time.Duration

	mu    sync.Mutex
	rng   *rand.Rand
	procs map[[2]uint64]*cniProc
	kills []CNIKill
	// adds counts the ADDs seen; lifetimes are how long those not killed
	// ran (from first seen to gone, to a scan's resolution).
	adds      int
	lifetimes []time.Duration
	paused    bool

	stop chan struct{}
	done chan struct{}
}

type cniProc struct {
	pid    int
	start  uint64
	binary string
	pod    string
	seen   time.Time
	kill   bool
	gone   bool
	killed bool
}

// StartCNIKiller starts killing the ADDs of the lab's CNI plugins: each
// one with probability prob, after a delay drawn uniformly from
// [0, maxDelay). Stop ends it.
func (l *Lab) StartCNIKiller(prob float64, maxDelay time.Duration, seed uint64) *CNIKiller {
	k := &CNIKiller{l: l, prob: prob, maxDelay: maxDelay, rng: rand.New(rand.NewPCG(seed, 7)),
		procs: map[[2]uint64]*cniProc{}, stop: make(chan struct{}), done: make(chan struct{})}
	go k.run()
	return k
}

// Pause stops (or resumes) the killing; ADDs are still counted.
func (k *CNIKiller) Pause(p bool) {
	k.mu.Lock()
	k.paused = p
	k.mu.Unlock()
}

// Stop ends the killer and returns how many ADDs it saw and what it killed.
func (k *CNIKiller) Stop() (adds int, kills []CNIKill, lifetimes []time.Duration) {
	select {
	case <-k.stop:
	default:
		close(k.stop)
	}
	<-k.done
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.adds, slices.Clone(k.kills), slices.Clone(k.lifetimes)
}

// kubeletPids are the pids of the lab's running kubelets (the state file
// is re-read: restarts change them).
func (k *CNIKiller) kubeletPids() []int {
	st, err := lab.Load(k.l.Dir)
	if err != nil {
		return nil
	}
	var out []int
	for _, n := range st.Nodes {
		if n.Kubelet.Alive() {
			out = append(out, n.Kubelet.Pid)
		}
	}
	return out
}

func children(pid int) []int {
	files, _ := filepath.Glob("/proc/" + strconv.Itoa(pid) + "/task/*/children")
	var out []int
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, s := range strings.Fields(string(data)) {
			if c, err := strconv.Atoi(s); err == nil {
				out = append(out, c)
			}
		}
	}
	return out
}

func comm(pid int) string {
	data, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
	return strings.TrimSpace(string(data))
}

// environ is a process's environment as a map.
func environ(pid int) map[string]string {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
	if err != nil {
		return nil
	}
	env := map[string]string{}
	for _, kv := range strings.Split(string(data), "\x00") {
		if k, v, ok := strings.Cut(kv, "="); ok {
			env[k] = v
		}
	}
	return env
}

func (k *CNIKiller) run() {
	defer close(k.done)
	var kubelets []int
	lastKubelets := time.Time{}
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		select {
		case <-k.stop:
			return
		case <-tick.C:
		}
		now := time.Now()
		if now.Sub(lastKubelets) > 300*time.Millisecond {
			kubelets, lastKubelets = k.kubeletPids(), now
		}
		live := map[[2]uint64]bool{}
		for _, kp := range kubelets {
			for _, c := range children(kp) {
				start := procStart(c)
				if start == 0 {
					continue
				}
				key := [2]uint64{uint64(c), start}
				live[key] = true
				k.mu.Lock()
				_, known := k.procs[key]
				k.mu.Unlock()
				if known {
					continue
				}
				bin := comm(c)
				if bin != "tabby" && bin != "tabby-ipam" {
					continue // not a plugin, or not exec'd yet: look again
				}
				env := environ(c)
				p := &cniProc{pid: c, start: start, binary: bin, seen: now}
				if env["CNI_COMMAND"] != "ADD" {
					p.gone = true // not ours to kill, never counted
					k.mu.Lock()
					k.procs[key] = p
					k.mu.Unlock()
					continue
				}
				for _, a := range strings.Split(env["CNI_ARGS"], ";") {
					if v, ok := strings.CutPrefix(a, "K8S_POD_NAME="); ok {
						p.pod = v
					}
				}
				k.mu.Lock()
				k.adds++
				k.procs[key] = p
				p.kill = !k.paused && k.rng.Float64() < k.prob
				delay := time.Duration(k.rng.Int64N(int64(k.maxDelay)))
				k.mu.Unlock()
				if p.kill {
					wg.Add(1)
					go func() {
						defer wg.Done()
						k.killLater(p, delay)
					}()
				}
			}
		}
		// ADDs that ended.
		k.mu.Lock()
		for key, p := range k.procs {
			if !p.gone && !live[key] && procStart(p.pid) != p.start {
				p.gone = true
				if !p.killed {
					k.lifetimes = append(k.lifetimes, now.Sub(p.seen))
				}
			}
		}
		k.mu.Unlock()
	}
}

func (k *CNIKiller) killLater(p *cniProc, delay time.Duration) {
	select {
	case <-k.stop:
		return
	case <-time.After(delay):
	}
	// Still the same process, still the plugin (tabby may have exec'd
	// tabby-ipam: same pid, same start time).
	if procStart(p.pid) != p.start {
		return
	}
	bin := comm(p.pid)
	if bin != "tabby" && bin != "tabby-ipam" {
		return
	}
	if syscall.Kill(p.pid, syscall.SIGKILL) != nil {
		return
	}
	k.mu.Lock()
	p.killed = true
	k.kills = append(k.kills, CNIKill{At: time.Now(), Pid: p.pid, Binary: bin, Pod: p.pod, Age: time.Since(p.seen)})
	k.mu.Unlock()
}

// PodRecord is what an AddressMonitor saw of one pod (names are unique
// in a chaos test: a name is never reused).
type PodRecord struct {
	Name, UID, Node string
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
	// their status), "kernel" (the eth0 of two Running pods' network
	// namespaces carries it) or "kernel-stale" (a Running pod's and that
	// of a pod no longer running, on a node whose kubelet is up).
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

// StaleHolding is an address on the eth0 of a pod network namespace whose
// pod no longer exists (or is not Running), while a Running pod holds it:
// a sandbox its kubelet has not torn down (a node that died).
type StaleHolding struct {
	IP          netip.Addr
	NetNS, Node string
	Holder      string
	First, Last time.Time
}

// AddressMonitor checks continuously (on every pod event, and every
// interval from a fresh list of the API server and from the kernel) that
// no address is held by two running pods, and follows IPAM's blocks to see
// when the addresses of each pod are freed. It lists rather than relies on
// informers alone: after an API server outage a reflector may wait up to
// a minute before it lists again.
type AddressMonitor struct {
	l        *Lab
	ds       *datastore.Client
	selector string
	nsPrefix string
	interval time.Duration

	mu                                    sync.Mutex
	pods                                  map[string]*PodRecord
	rv                                    map[string]uint64 // resourceVersion of the pod object last applied
	byNetNS                               map[string]string // pod namespace name -> pod name
	blocks                                map[string]blockView
	violations                            map[string]*Violation
	stale                                 map[string]*StaleHolding
	apiSamples, kernelSamples, listErrors int
	maxRunning, kernelAddrs               int
	kernelErrors                          int
	lastKernelErr, lastListErr            string
	// mismatches: Running pods whose eth0 lacks their status address.
	mismatches map[string]int
	// nodesDown are nodes whose kubelet is down (stale sandboxes there are
	// expected).
	nodesDown map[string]bool

	cancel context.CancelFunc
	done   chan struct{}
}

// StartAddressMonitor starts watching the pods of namespace default that
// match selector and IPAM's blocks. Stop ends it.
func (l *Lab) StartAddressMonitor(t testing.TB, selector string, interval time.Duration) *AddressMonitor {
	t.Helper()
	m := &AddressMonitor{l: l, ds: l.DS(t), selector: selector, nsPrefix: lab.Prefix(l.Name) + "pod-", interval: interval,
		pods: map[string]*PodRecord{}, rv: map[string]uint64{}, byNetNS: map[string]string{}, blocks: map[string]blockView{},
		violations: map[string]*Violation{}, stale: map[string]*StaleHolding{}, nodesDown: map[string]bool{},
		mismatches: map[string]int{}, done: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	m.cancel = cancel
	factory := informers.NewSharedInformerFactoryWithOptions(l.CS, 0, informers.WithNamespace(metav1.NamespaceDefault),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = selector }))
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

func (m *AddressMonitor) record(name string) *PodRecord {
	r := m.pods[name]
	if r == nil {
		r = &PodRecord{Name: name, FirstSeen: time.Now(), Alloc: map[netip.Addr]bool{}}
		m.pods[name] = r
	}
	return r
}

func (m *AddressMonitor) podEvent(o any, deleted bool) {
	if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
		o = d.Obj
	}
	p, ok := o.(*corev1.Pod)
	if !ok {
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
	rv, _ := strconv.ParseUint(p.ResourceVersion, 10, 64)
	if rv < m.rv[p.Name] {
		return
	}
	m.rv[p.Name] = rv
	r := m.record(p.Name)
	if !r.GoneAt.IsZero() {
		return // names are never reused: gone is final
	}
	r.UID = string(p.UID)
	if p.Spec.NodeName != "" {
		r.Node = p.Spec.NodeName
	}
	if r.UID != "" {
		m.byNetNS[m.nsPrefix+strings.ReplaceAll(r.UID, "-", "")[:12]] = p.Name
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
	pods, err := m.l.CS.CoreV1().Pods(metav1.NamespaceDefault).List(lctx, metav1.ListOptions{LabelSelector: m.selector})
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
		listed[pods.Items[i].Name] = true
		m.applyPodLocked(&pods.Items[i], false, now)
	}
	for name, r := range m.pods {
		if !listed[name] && r.GoneAt.IsZero() && m.rv[name] != 0 && m.rv[name] <= listRV {
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
			if a.Attr.Pod == "" || a.Attr.Namespace != metav1.NamespaceDefault {
				continue
			}
			if held[a.Attr.Pod] == nil {
				held[a.Attr.Pod] = map[netip.Addr]bool{}
			}
			held[a.Attr.Pod][a.IP] = true
		}
	}
	for name := range held {
		m.record(name)
	}
	for name, r := range m.pods {
		h := held[name]
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
	for name, r := range m.pods {
		if r.Phase != corev1.PodRunning || r.Deleting || !r.GoneAt.IsZero() {
			continue
		}
		for _, ip := range r.StatusIPs {
			by[ip] = append(by[ip], name)
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

// checkKernel reads the eth0 addresses of every pod network namespace of
// the lab: an address on two namespaces whose pods are both Running is a
// violation; on one of a Running pod and a stale sandbox, a stale
// holding (a violation too unless the stale sandbox's node is down).
func (m *AddressMonitor) checkKernel() {
	ents, err := os.ReadDir(lab.NetNSDir)
	if err != nil {
		return
	}
	type holder struct{ netns, pod string }
	by := map[netip.Addr][]holder{}
	byNS := map[string][]netip.Addr{}
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), m.nsPrefix) {
			continue
		}
		path := filepath.Join(lab.NetNSDir, e.Name())
		addrs, err := netnsAddrs(path)
		if err != nil {
			// A namespace being removed: its file goes, or is no longer
			// a namespace (EINVAL entering it).
			if _, serr := os.Stat(path); serr == nil && !errors.Is(err, syscall.EINVAL) && !strings.Contains(err.Error(), "invalid argument") {
				m.mu.Lock()
				m.kernelErrors++
				m.lastKernelErr = err.Error()
				m.mu.Unlock()
			}
			continue
		}
		byNS[e.Name()] = addrs
		m.mu.Lock()
		m.kernelAddrs += len(addrs)
		m.mu.Unlock()
		for _, a := range addrs {
			by[a] = append(by[a], holder{netns: e.Name()})
		}
	}
	now := time.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	m.kernelSamples++
	running := func(ns string) (string, *PodRecord, bool) {
		name := m.byNetNS[ns]
		r := m.pods[name]
		return name, r, r != nil && r.GoneAt.IsZero() && r.Phase == corev1.PodRunning
	}
	for ip, hs := range by {
		if len(hs) < 2 {
			continue
		}
		var live []string
		var stale []holder
		for _, h := range hs {
			if name, _, ok := running(h.netns); ok {
				live = append(live, name+"@"+h.netns)
			} else {
				stale = append(stale, holder{netns: h.netns, pod: name})
			}
		}
		if len(live) > 1 {
			m.violation("kernel", ip, live, now)
		}
		if len(live) == 1 {
			for _, s := range stale {
				node := ""
				if r := m.pods[s.pod]; r != nil {
					node = r.Node
				}
				if !m.nodesDown[node] {
					m.violation("kernel-stale", ip, []string{live[0], "stale:" + s.pod + "@" + s.netns}, now)
					continue
				}
				key := ip.String() + "/" + s.netns
				st := m.stale[key]
				if st == nil {
					st = &StaleHolding{IP: ip, NetNS: s.netns, Node: node, Holder: live[0], First: now}
					m.stale[key] = st
				}
				st.Last = now
			}
		}
	}
	// A Running pod's eth0 should carry its status addresses.
	for ns, addrs := range byNS {
		if _, r, ok := running(ns); ok && !r.Deleting {
			for _, ip := range r.StatusIPs {
				if !slices.Contains(addrs, ip) {
					m.mismatches[r.Name+" "+ip.String()]++
				}
			}
		}
	}
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

// Stop ends the monitor.
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
	// KernelAddrs: pod addresses read from the kernel in all.
	MaxRunning, KernelAddrs int
	LastListError           string
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
		MaxRunning: m.maxRunning, KernelAddrs: m.kernelAddrs}
	for _, v := range m.violations {
		r.Violations = append(r.Violations, *v)
	}
	sort.Slice(r.Violations, func(i, j int) bool { return r.Violations[i].First.Before(r.Violations[j].First) })
	for _, s := range m.stale {
		r.Stale = append(r.Stale, *s)
	}
	return r
}

// Pods returns a copy of the records of every pod seen.
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

// LogLine is one slog text line of a lab process's log.
type LogLine struct {
	Time  time.Time
	Level string
	Msg   string
	Attrs map[string]string
	Raw   string
}

var slogAttr = regexp.MustCompile(`([A-Za-z0-9_.]+)=("(?:[^"\\]|\\.)*"|\S*)`)

// ReadLog parses the slog text lines of a log file (other lines are
// skipped) for which keep returns true.
func ReadLog(path string, keep func(LogLine) bool) ([]LogLine, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []LogLine
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "time=") {
			continue
		}
		ll := LogLine{Attrs: map[string]string{}, Raw: line}
		for _, m := range slogAttr.FindAllStringSubmatch(line, -1) {
			v := m[2]
			if strings.HasPrefix(v, `"`) {
				if u, err := strconv.Unquote(v); err == nil {
					v = u
				}
			}
			switch m[1] {
			case "time":
				ll.Time, _ = time.Parse(time.RFC3339Nano, v)
			case "level":
				ll.Level = v
			case "msg":
				ll.Msg = v
			default:
				if _, dup := ll.Attrs[m[1]]; !dup {
					ll.Attrs[m[1]] = v
				}
			}
		}
		if keep(ll) {
			out = append(out, ll)
		}
	}
	return out, sc.Err()
}

// NodeLog reads the slog lines of one node's tabbyd or kubelet log.
func (l *Lab) NodeLog(t testing.TB, node, component string, keep func(LogLine) bool) []LogLine {
	t.Helper()
	n := l.Node(t, node)
	lines, err := ReadLog(filepath.Join(n.Dir, component+".log"), keep)
	if err != nil {
		t.Fatal(err)
	}
	return lines
}
