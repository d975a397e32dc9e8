package netpol

import (
	"cmp"
	"maps"
	"net/netip"
	"reflect"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	tabbyv1 "github.com/tabbynet/tabby/api/v1"
	"github.com/tabbynet/tabby/contract"
	"github.com/tabbynet/tabby/policy"
)

// BuildInput is the compiler's input from the informers' objects: every
// namespace and policy, and an endpoint for every pod that is not on the
// host's network, has not ended and has an address. A pod's addresses are
// those of its status.podIPs and those IPAM holds for it (an IPAMBlock
// allocation whose attributes name the pod, on the pod's node), so a pod is
// an endpoint from the moment IPAM hands it an address, before the kubelet
// reports it. Pods on node get HostIface, the host end of their veth
// (HostIface). The result is sorted, so equal objects give equal inputs.
func BuildInput(node string, pods []*corev1.Pod, namespaces []*corev1.Namespace, policies []*networkingv1.NetworkPolicy, blocks []*tabbyv1.IPAMBlock) *policy.Input {
	return (*InputBuilder)(nil).Build(node, pods, namespaces, policies, blocks)
}

// InputBuilder is BuildInput with a memory of what each Pod object gives
// on its own (whether it is an endpoint, its key, the addresses of its
// status), reused while the next call holds the same object: informers
// hand out a new object for every change and never modify one. A sync
// then costs a map lookup per unchanged pod rather than parsing its
// addresses and building its key. Build's result is always BuildInput's
// (TestInputBuilderEqualsBuildInput); the addresses of an endpoint may be
// shared with earlier results, and are never modified. Pods no longer
// given are forgotten once they are more than an eighth of those given
// (and 64). ClusterPolicies does the same for ClusterNetworkPolicy
// objects. Not safe for concurrent use; a nil *InputBuilder builds
// without memory.
type InputBuilder struct {
	pods map[*corev1.Pod]*podEntry
	gen  uint64 // Build calls: an entry's gen says when it was last given
	// cnps are the ClusterNetworkPolicy objects decoded (ClusterPolicies),
	// and cnpGen counts its calls.
	cnps   map[*unstructured.Unstructured]*cnpEntry
	cnpGen uint64
}

type podEntry struct {
	podInput
	gen uint64
}

// podInput is what one Pod object gives the input on its own.
type podInput struct {
	endpoint bool
	key      string       // namespace/name
	ips      []netip.Addr // of its status: sorted, each once, clipped
	node     string       // spec.nodeName
	iface    string       // HostIface, when on the node Build was given
}

// podInputOf works out p's podInput for a Build for node.
func podInputOf(p *corev1.Pod, node string) podInput {
	if !endpointPod(p) {
		return podInput{}
	}
	pi := podInput{endpoint: true, key: p.Namespace + "/" + p.Name, node: p.Spec.NodeName}
	if node != "" && pi.node == node {
		pi.iface = HostIface(p)
	}
	for _, s := range p.Status.PodIPs {
		if a, err := netip.ParseAddr(s.IP); err == nil {
			pi.ips = append(pi.ips, a.Unmap())
		}
	}
	if len(p.Status.PodIPs) == 0 || p.Status.PodIPs[0].IP != p.Status.PodIP {
		// (Else status.podIP is status.podIPs[0], as the kubelet sets them.)
		if a, err := netip.ParseAddr(p.Status.PodIP); err == nil {
			pi.ips = append(pi.ips, a.Unmap())
		}
	}
	slices.SortFunc(pi.ips, func(a, b netip.Addr) int { return a.Compare(b) })
	pi.ips = slices.Clip(slices.Compact(pi.ips))
	return pi
}

// Build is BuildInput, from memory for the Pod objects the last call had.
func (b *InputBuilder) Build(node string, pods []*corev1.Pod, namespaces []*corev1.Namespace, policies []*networkingv1.NetworkPolicy, blocks []*tabbyv1.IPAMBlock) *policy.Input {
	in := &policy.Input{Node: node}
	for _, ns := range namespaces {
		if ns != nil {
			in.Namespaces = append(in.Namespaces, ns)
		}
	}
	slices.SortFunc(in.Namespaces, func(a, b *corev1.Namespace) int { return strings.Compare(a.Name, b.Name) })
	for _, p := range policies {
		if p != nil {
			in.Policies = append(in.Policies, p)
		}
	}
	slices.SortFunc(in.Policies, func(a, b *networkingv1.NetworkPolicy) int {
		return compareKeys(a.Namespace, a.Name, b.Namespace, b.Name)
	})

	type entry struct {
		pod         *corev1.Pod
		node, iface string       // the podInput's
		ips         []netip.Addr // the podInput's (clipped), or a copy once IPAM's are added
		// more says IPAM added addresses: ips need sorting again.
		more bool
	}
	// The entries are allocated together, not one by one: a sync builds
	// one for every pod of the cluster. (Their addresses are not: the
	// compiler may keep one pod's addresses for many syncs, which must not
	// keep a whole sync's array alive.)
	entries := make([]entry, len(pods))
	byKey := make(map[string]*entry, len(pods))
	if b != nil {
		b.gen++
		if b.pods == nil {
			b.pods = make(map[*corev1.Pod]*podEntry, len(pods))
		}
	}
	for i, p := range pods {
		var pi podInput
		if b != nil {
			m := b.pods[p]
			if m == nil {
				m = &podEntry{podInput: podInputOf(p, node)}
				b.pods[p] = m
			}
			m.gen = b.gen
			pi = m.podInput
		} else {
			pi = podInputOf(p, node)
		}
		if !pi.endpoint {
			continue
		}
		e := &entries[i]
		e.pod, e.node, e.iface, e.ips = p, pi.node, pi.iface, pi.ips
		byKey[pi.key] = e
	}
	if b != nil && len(b.pods) > len(pods)+len(pods)/8+64 {
		maps.DeleteFunc(b.pods, func(_ *corev1.Pod, m *podEntry) bool { return m.gen != b.gen })
	}
	for _, blk := range blocks {
		if blk == nil {
			continue
		}
		forEachPodAllocation(blk, func(ip netip.Addr, attr *tabbyv1.AllocationAttribute) {
			e := byKey[attr.Namespace+"/"+attr.Pod]
			if e == nil {
				return
			}
			// An allocation left on another node by an older pod of the
			// same name is not this pod's.
			if attr.Node != "" && e.node != "" && attr.Node != e.node {
				return
			}
			// The podInput's addresses are clipped: append copies them.
			e.ips = append(e.ips, ip)
			e.more = true
		})
	}
	// Sorted by key, each key made once (not in every comparison).
	keys := make([]string, 0, len(byKey))
	for k, e := range byKey {
		if len(e.ips) > 0 {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	in.Endpoints = make([]policy.Endpoint, 0, len(keys))
	for _, k := range keys {
		e := byKey[k]
		if e.more {
			slices.SortFunc(e.ips, func(a, b netip.Addr) int { return a.Compare(b) })
			e.ips = slices.Compact(e.ips)
		}
		ep := policy.Endpoint{Pod: e.pod, IPs: e.ips}
		if node != "" && e.node == node {
			if ep.HostIface = e.iface; ep.HostIface == "" { // remembered from a Build for another node
				ep.HostIface = HostIface(e.pod)
			}
		}
		in.Endpoints = append(in.Endpoints, ep)
	}
	return in
}

// compareKeys compares the keys namespace/name a1/a2 and b1/b2 as strings,
// without building them: the keys of a sync's objects are compared tens
// of thousands of times.
func compareKeys(a1, a2, b1, b2 string) int {
	if a1 == b1 {
		return strings.Compare(a2, b2)
	}
	n := min(len(a1), len(b1))
	if c := strings.Compare(a1[:n], b1[:n]); c != 0 {
		return c
	}
	// One namespace starts the other: its "/" meets the other's next byte.
	switch {
	case len(a1) < len(b1) && b1[n] != '/':
		return cmp.Compare('/', b1[n])
	case len(b1) < len(a1) && a1[n] != '/':
		return cmp.Compare(a1[n], '/')
	}
	return strings.Compare(a1+"/"+a2, b1+"/"+b2) // a "/" in a namespace: not from the API server
}

// HostIface is the name of the host end of a pod's veth: the CNI plugin
// derives it from the pod's namespace and name (contract.HostVethName, for
// the interface eth0 every container runtime asks for), so it is known
// before the plugin creates it, and rules naming it are in place when it
// appears.
func HostIface(p *corev1.Pod) string {
	return contract.HostVethName(contract.PodID{Namespace: p.Namespace, Name: p.Name}, "", contract.DefaultIfName)
}

// endpointPod tells the pods policies apply to: not on the host's network,
// not ended (an ended pod's address may already be another pod's).
func endpointPod(p *corev1.Pod) bool {
	if p == nil || p.Spec.HostNetwork {
		return false
	}
	return p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed
}

// forEachPodAllocation calls f for every address of the block that IPAM
// holds for a pod (its attributes name a namespace and a pod).
func forEachPodAllocation(b *tabbyv1.IPAMBlock, f func(netip.Addr, *tabbyv1.AllocationAttribute)) {
	cidr, err := netip.ParsePrefix(b.Spec.CIDR)
	if err != nil {
		return
	}
	cidr = cidr.Masked()
	hostBits := cidr.Addr().BitLen() - cidr.Bits()
	if hostBits > 16 {
		return // not a block IPAM makes (at most 4096 addresses)
	}
	size := 1 << hostBits
	for ord, idx := range b.Spec.Allocations {
		if idx < 0 || idx >= len(b.Spec.Attributes) || ord >= size {
			continue
		}
		attr := &b.Spec.Attributes[idx]
		if attr.Namespace == "" || attr.Pod == "" || attr.Use == tabbyv1.UseTunnel {
			continue
		}
		f(addrAt(cidr.Addr(), ord), attr)
	}
}

// addrAt is the address ord places after base.
func addrAt(base netip.Addr, ord int) netip.Addr {
	b := base.As16()
	carry := uint32(ord)
	for i := 15; i >= 0 && carry > 0; i-- {
		sum := uint32(b[i]) + carry&0xff
		b[i] = byte(sum)
		carry = carry>>8 + sum>>8
	}
	a := netip.AddrFrom16(b)
	if base.Is4() {
		return a.Unmap()
	}
	return a
}

// podChanged says whether a pod update can change the compiler's input:
// labels, node, host networking, phase, addresses, container ports or a
// deletion. Status conditions and the like do not.
func podChanged(old, new any) bool {
	a, ok1 := old.(*corev1.Pod)
	b, ok2 := new.(*corev1.Pod)
	if !ok1 || !ok2 {
		return true
	}
	if a.UID != b.UID || !maps.Equal(a.Labels, b.Labels) || a.Spec.NodeName != b.Spec.NodeName ||
		a.Spec.HostNetwork != b.Spec.HostNetwork || a.Status.Phase != b.Status.Phase ||
		a.Status.PodIP != b.Status.PodIP || !reflect.DeepEqual(a.Status.PodIPs, b.Status.PodIPs) ||
		(a.DeletionTimestamp == nil) != (b.DeletionTimestamp == nil) {
		return true
	}
	return !reflect.DeepEqual(containerPorts(a), containerPorts(b))
}

func containerPorts(p *corev1.Pod) [][]corev1.ContainerPort {
	var out [][]corev1.ContainerPort
	for _, c := range p.Spec.InitContainers {
		out = append(out, c.Ports)
	}
	for _, c := range p.Spec.Containers {
		out = append(out, c.Ports)
	}
	return out
}

// namespaceChanged: only a namespace's labels matter to policies.
func namespaceChanged(old, new any) bool {
	a, ok1 := old.(*corev1.Namespace)
	b, ok2 := new.(*corev1.Namespace)
	if !ok1 || !ok2 {
		return true
	}
	return !maps.Equal(a.Labels, b.Labels)
}

// blockChanged: only a block's allocations matter to policies.
func blockChanged(old, new any) bool {
	a, ok1 := old.(*tabbyv1.IPAMBlock)
	b, ok2 := new.(*tabbyv1.IPAMBlock)
	if !ok1 || !ok2 {
		return true
	}
	return a.Spec.CIDR != b.Spec.CIDR || !slices.Equal(a.Spec.Allocations, b.Spec.Allocations) ||
		!reflect.DeepEqual(a.Spec.Attributes, b.Spec.Attributes)
}
