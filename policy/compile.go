package policy

import (
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/tabbynet/tabby/contract"
)

// Families by index: 0 is IPv4, 1 is IPv6.
var (
	families = [2]string{FamilyIPv4, FamilyIPv6}
	famDigit = [2]string{"4", "6"}
)

const (
	markSet = "0x10000/0x10000"
	// markClear clears every bit of MarkMask.
	markClear = "0x0/0x30000"
	// jumpComment marks the one rule tabby keeps in FORWARD.
	jumpComment = contract.CommentPrefix + "network-policy"
	// nsNameLabel is the label the API server puts on every Namespace.
	nsNameLabel = "kubernetes.io/metadata.name"
)

func init() {
	// The mark strings above are MarkAllowed and MarkMask spelled out.
	if fmt.Sprintf("%#x/%#x", MarkAllowed, MarkAllowed) != markSet || fmt.Sprintf("0x0/%#x", MarkMask) != markClear ||
		fmt.Sprintf("%#x/%#x", MarkPass, MarkMask) != markPassSet || fmt.Sprintf("%#x/%#x", MarkAllowed, MarkMask) != markAcceptSet {
		panic("policy: the mark strings do not match MarkAllowed, MarkPass and MarkMask")
	}
}

// Compile turns Pods, Namespaces and NetworkPolicies into the ipsets and
// iptables chains that enforce them on in.Node. It is pure and
// deterministic: the same Input (in any order) gives the same Ruleset, with
// every list sorted.
func Compile(in *Input) *Ruleset {
	if in == nil {
		in = &Input{}
	}
	return newCompiler(in).run()
}

func newCompiler(in *Input) *compiler {
	c := &compiler{
		in:       in,
		prefix:   in.HostVethPrefix,
		nsLabels: map[string]labels.Set{},
		byNs:     map[string][]*group{},
		localNs:  map[string][]*group{},
		nsSel:    map[string][]string{},
		podSets:  map[string]*podSet{},
		sets:     map[string]*Set{},
		made:     map[string]*Set{},
		limits:   in.Limits.withDefaults(),
		named:    map[string][]namedEntry{},
		netMemo:  map[string]*[2][]string{},
	}
	if !validIfaceChars(c.prefix, 14) {
		c.prefix = DefaultHostVethPrefix
	}
	return c
}

func (c *compiler) run() *Ruleset {
	c.loadNamespaces()
	c.loadEndpoints()
	c.loadPolicies()
	c.loadClusterPolicies()
	c.selectLocal()
	c.selectLocalCNP()
	return c.emit()
}

type compiler struct {
	in     *Input
	prefix string
	rs     Ruleset

	nsLabels map[string]labels.Set
	nsNames  []string // sorted: every namespace known from any input
	eps      []*endpoint
	byNs     map[string][]*group // every endpoint, grouped by namespace and labels
	localNs  map[string][]*group // local endpoints only
	locals   []*endpoint         // sorted by key
	addrs    []string            // every pod IP, sorted as strings; endpoint.ranks index it
	addrFam  []int               // the family of each of addrs
	named    map[string][]namedEntry

	policies []*cpolicy
	cnps     []*ccnp             // in the order they run: Admin then Baseline, by priority and name
	nsSel    map[string][]string // namespace selector string -> matching namespaces
	podSets  map[string]*podSet
	// sets are the sets of the Ruleset; made holds every set computed,
	// and cur the sets the policy being emitted names, which join sets
	// only when the policy is within the limits.
	sets     map[string]*Set
	made     map[string]*Set
	cur      map[string]*Set
	curBuf   map[string]*Set // cur's storage, cleared per policy
	limits   Limits
	netMemo  map[string]*[2][]string
	stamp    []int // per endpoint, for de-duplicating set members
	stampGen int

	// With an Incremental: its memory, what this compile keeps of it
	// (next…), and where the sets a policy's rules name are recorded.
	memo         *Incremental
	nextPolicies map[*networkingv1.NetworkPolicy]*policyMemo
	nextPods     map[*corev1.Pod]*podMemo
	nextMembers  map[string]*membersMemo
	nextNamed    map[string][]string
	nextSigs     map[string]*sigMemo
	reused       bool    // the endpoints are the last compile's (reuseEndpoints)
	moved        []moved // endpoints reuseEndpoints moved to other groups
	rec          *[]setUse
}

type endpoint struct {
	idx     int // in compiler.eps
	key, ns string
	pod     *corev1.Pod
	labels  labels.Set
	group   string    // the key of its group (labelKey)
	ranks   []int     // indexes into compiler.addrs
	ports   []podPort // its named ports (namedPorts)
	iface   string
	local   bool
	in, eg  []*cpolicy // policies selecting the local pod
	cnp     [directions][]*ccnp
}

type group struct {
	labels labels.Set
	eps    []*endpoint
}

type namedEntry struct {
	ranks []int
	proto string // tcp, udp, sctp
	port  int32
	local bool // of a local endpoint
}

func (c *compiler) problem(kind, ns, name, msg string) {
	c.rs.Problems = append(c.rs.Problems, Problem{Namespace: ns, Name: name, Message: msg, Kind: kind})
}

func (c *compiler) loadNamespaces() {
	known := map[string]bool{}
	for _, ns := range c.in.Namespaces {
		if ns == nil || known[ns.Name] {
			continue
		}
		known[ns.Name] = true
		l := labels.Set{}
		for k, v := range ns.Labels {
			l[k] = v
		}
		if _, ok := l[nsNameLabel]; !ok {
			l[nsNameLabel] = ns.Name
		}
		c.nsLabels[ns.Name] = l
	}
}

// nsLabelsOf gives a namespace's labels, the automatic name label alone for
// a namespace the input does not list.
func (c *compiler) nsLabelsOf(ns string) labels.Set {
	if l, ok := c.nsLabels[ns]; ok {
		return l
	}
	l := labels.Set{nsNameLabel: ns}
	c.nsLabels[ns] = l
	return l
}

func labelKey(ns string, l map[string]string) string {
	keys := make([]string, 0, len(l))
	for k := range l {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	b.WriteString(strconv.Itoa(len(ns)))
	b.WriteByte(':')
	b.WriteString(ns)
	for _, k := range keys {
		v := l[k]
		b.WriteString(strconv.Itoa(len(k)))
		b.WriteByte(':')
		b.WriteString(k)
		b.WriteString(strconv.Itoa(len(v)))
		b.WriteByte(':')
		b.WriteString(v)
	}
	return b.String()
}

// endpointIn is an input endpoint and its namespace/name key.
type endpointIn struct {
	ep  *Endpoint
	key string
	i   int // in Input.Endpoints
}

// addrRef is one address of the endpoint c.eps[ep].
type addrRef struct {
	a  netip.Addr
	ep int
}

// loadEndpoints reads the input's endpoints into c.eps, in key order:
// the local ones (with a valid host veth) into c.locals, all grouped by
// namespace and labels, their addresses ranked and named ports listed.
func (c *compiler) loadEndpoints() {
	c.reused = c.reuseEndpoints()
	if c.memo != nil {
		c.carryMembers()
	}
	if c.reused {
		return
	}
	if c.memo != nil {
		c.nextPods = make(map[*corev1.Pod]*podMemo, len(c.in.Endpoints))
	}
	problems := len(c.rs.Problems)
	sorted := c.sortedEndpoints()
	n := 0
	for _, r := range sorted {
		n += len(r.ep.IPs)
	}
	ips := make([]addrRef, 0, n)
	ifaces := map[string]string{} // host veth → the key of the pod that has it
	groups := map[string]*group{}
	// One allocation for every endpoint, not one each: a compile makes
	// thousands.
	slab := make([]endpoint, len(sorted))
	c.eps = make([]*endpoint, 0, len(sorted))
	byIn := make([]int, len(c.in.Endpoints))
	for i := range byIn {
		byIn[i] = -1
	}
	for _, r := range sorted {
		if len(c.eps) > 0 && c.eps[len(c.eps)-1].key == r.key {
			continue // a duplicate: the first one wins
		}
		pod := r.ep.Pod
		ep := &slab[len(c.eps)]
		*ep = endpoint{idx: len(c.eps), key: r.key, ns: pod.Namespace, labels: labels.Set(pod.Labels), pod: pod}
		c.eps = append(c.eps, ep)
		ips = appendAddrs(ips, ep.idx, r.ep.IPs)
		if r.ep.HostIface != "" {
			c.claimIface(ep, r.ep.HostIface, ifaces)
		}
		pm := c.podMemoOf(pod)
		ep.ports = pm.ports
		ep.group = pm.group
		joinGroup(groups, c.byNs, ep.group, ep)
		if ep.local {
			joinGroup(groups, c.localNs, "L"+ep.group, ep)
		}
		c.nsLabelsOf(ep.ns)
		byIn[r.i] = ep.idx
	}
	c.rankAddrsOnce(ips)
	c.stamp = make([]int, len(c.eps))
	// Each name's list is made at its final size: grown by appends, the
	// lists of a name every pod has were a quarter of a compile's garbage.
	count := map[string]int{}
	for _, ep := range c.eps {
		if len(ep.ranks) > 0 {
			for _, p := range ep.ports {
				count[p.name]++
			}
		}
	}
	for name, n := range count {
		c.named[name] = make([]namedEntry, 0, n)
	}
	for _, ep := range c.eps {
		if len(ep.ranks) > 0 {
			c.addNamedPorts(ep)
		}
	}
	c.saveEndpoints(byIn, groups, c.rs.Problems[problems:])
}

// sortedEndpoints are the input's endpoints that are pods, stably sorted
// by key.
func (c *compiler) sortedEndpoints() []endpointIn {
	rs := make([]endpointIn, 0, len(c.in.Endpoints))
	for i := range c.in.Endpoints {
		e := &c.in.Endpoints[i]
		if e.Pod == nil || e.Pod.Spec.HostNetwork {
			continue // hostNetwork pods are the node, not endpoints
		}
		rs = append(rs, endpointIn{e, c.podMemoOf(e.Pod).key, i})
	}
	return c.sortEndpoints(rs)
}

// appendAddrs appends endpoint idx's usable addresses, each once. A pod
// has one address per family, so the duplicates are looked for in what
// this call appended rather than in a map.
func appendAddrs(ips []addrRef, idx int, addrs []netip.Addr) []addrRef {
	start := len(ips)
	for _, a := range addrs {
		a = a.Unmap().WithZone("")
		if !a.IsValid() || a.IsUnspecified() || slices.ContainsFunc(ips[start:], func(r addrRef) bool { return r.a == a }) {
			continue
		}
		ips = append(ips, addrRef{a, idx})
	}
	return ips
}

// claimIface makes ep local with the host veth iface, unless the name is
// not a pod veth's or another local pod (in ifaces) has it: then the pod
// is reported and not programmed.
func (c *compiler) claimIface(ep *endpoint, iface string, ifaces map[string]string) {
	switch other, dup := ifaces[iface]; {
	case !validIfaceChars(iface, 15) || iface == "." || iface == ".." || !strings.HasPrefix(iface, c.prefix) ||
		c.excludeDevices() && strings.HasPrefix(iface, DeviceIfacePrefix):
		c.problem(KindPod, ep.pod.Namespace, ep.pod.Name, fmt.Sprintf(
			"host interface %q is not a pod veth name (%q and up to %d of [A-Za-z0-9_.-], not %q…): the pod's traffic is not policed until its endpoint names its host veth correctly",
			iface, c.prefix, 15-len(c.prefix), DeviceIfacePrefix))
	case dup:
		c.problem(KindPod, ep.pod.Namespace, ep.pod.Name, fmt.Sprintf(
			"host interface %q is also the interface of pod %s: the pod is not programmed until only one local pod has it (a stale endpoint?)",
			iface, other))
	default:
		ifaces[iface] = ep.key
		ep.iface = iface
		ep.local = true
		c.locals = append(c.locals, ep)
	}
}

// joinGroup adds ep to groups[key], making the group and listing it under
// ep's namespace in byNs when it is new.
func joinGroup(groups map[string]*group, byNs map[string][]*group, key string, ep *endpoint) {
	g := groups[key]
	if g == nil {
		g = &group{labels: ep.labels}
		groups[key] = g
		byNs[ep.ns] = append(byNs[ep.ns], g)
	}
	g.eps = append(g.eps, ep)
}

// rankAddrs fills c.addrs and each endpoint's ranks.
func (c *compiler) rankAddrs(ips []addrRef) {
	// Addresses sorted once, as strings; sets hold ranks, so their
	// members come out sorted by sorting integers.
	type ipStr struct {
		s   string
		fam int
		ep  int
	}
	strs := make([]ipStr, len(ips))
	for i, r := range ips {
		fam := 0
		if r.a.Is6() {
			fam = 1
		}
		strs[i] = ipStr{r.a.String(), fam, r.ep}
	}
	slices.SortFunc(strs, func(a, b ipStr) int {
		if c := strings.Compare(a.s, b.s); c != 0 {
			return c
		}
		return a.ep - b.ep
	})
	for _, r := range strs {
		if n := len(c.addrs); n == 0 || c.addrs[n-1] != r.s {
			c.addrs = append(c.addrs, r.s)
			c.addrFam = append(c.addrFam, r.fam)
		}
		ep := c.eps[r.ep]
		ep.ranks = append(ep.ranks, len(c.addrs)-1)
	}
}

// addNamedPorts lists ep's named ports in c.named.
func (c *compiler) addNamedPorts(ep *endpoint) {
	for _, p := range ep.ports {
		c.named[p.name] = append(c.named[p.name], namedEntry{ranks: ep.ranks, local: ep.local, proto: p.proto, port: p.port})
	}
}

// podPort is a named container port of a pod.
type podPort struct {
	name, proto string
	port        int32
}

// namedPorts are a pod's named ports: the first port of a name and
// protocol in the pod's containers, then its sidecars, as Kubernetes
// resolves them.
func namedPorts(pod *corev1.Pod) []podPort {
	var out []podPort
	add := func(ports []corev1.ContainerPort) {
		for _, p := range ports {
			if p.Name == "" || p.ContainerPort < 1 || p.ContainerPort > 65535 {
				continue
			}
			proto, ok := protoName(p.Protocol)
			if !ok || slices.ContainsFunc(out, func(x podPort) bool { return x.name == p.Name && x.proto == proto }) {
				continue
			}
			out = append(out, podPort{name: p.Name, proto: proto, port: p.ContainerPort})
		}
	}
	for _, ct := range pod.Spec.Containers {
		add(ct.Ports)
	}
	for _, ct := range pod.Spec.InitContainers {
		if ct.RestartPolicy != nil && *ct.RestartPolicy == corev1.ContainerRestartPolicyAlways {
			add(ct.Ports)
		}
	}
	return out
}

// protoName is the iptables and ipset name of a protocol; "" is TCP.
func protoName(p corev1.Protocol) (string, bool) {
	switch p {
	case "", corev1.ProtocolTCP:
		return "tcp", true
	case corev1.ProtocolUDP:
		return "udp", true
	case corev1.ProtocolSCTP:
		return "sctp", true
	}
	return "", false
}
