package inspect

import (
	"bytes"
	"encoding/json"
	"net/netip"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	tabbyv1 "github.com/tabbynet/tabby/api/v1"
	"github.com/tabbynet/tabby/ipam"
)

var now = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// alloc describes one allocation of a test block.
type alloc struct {
	ip                    string
	handle, ns, pod, node string
	use                   tabbyv1.IPPoolAllowedUse
	age                   time.Duration // default: an hour
}

func podAlloc(ip, ns, pod, node string) alloc {
	return alloc{ip: ip, handle: "net." + pod, ns: ns, pod: pod, node: node}
}

func mkPool(name, cidr string, bs int) tabbyv1.IPPool {
	return tabbyv1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: tabbyv1.IPPoolSpec{CIDR: cidr, BlockSize: bs}}
}

// mkBlock builds a block as IPAM would: arrays, attributes, sequence numbers.
func mkBlock(cidr, node string, allocs ...alloc) tabbyv1.IPAMBlock {
	p := netip.MustParsePrefix(cidr)
	n := 1 << (p.Addr().BitLen() - p.Bits())
	b := tabbyv1.IPAMBlock{
		ObjectMeta: metav1.ObjectMeta{Name: ipam.BlockName(p)},
		Spec:       tabbyv1.IPAMBlockSpec{CIDR: cidr, Allocations: make([]int, n), SequenceNumberForAllocation: map[string]uint64{}},
	}
	if node != "" {
		b.Spec.Affinity = "host:" + node
	}
	taken := map[int]bool{}
	for _, a := range allocs {
		ip := netip.MustParseAddr(a.ip)
		ord := int(ip.As16()[15]) - int(p.Addr().As16()[15])
		age := a.age
		if age == 0 {
			age = time.Hour
		}
		ts := metav1.NewTime(now.Add(-age))
		use := a.use
		if use == "" {
			use = tabbyv1.UseWorkload
		}
		b.Spec.Attributes = append(b.Spec.Attributes, tabbyv1.AllocationAttribute{
			HandleID: a.handle, Use: use, Namespace: a.ns, Pod: a.pod, Node: a.node, Timestamp: &ts})
		b.Spec.SequenceNumber++
		b.Spec.Allocations[ord] = len(b.Spec.Attributes) - 1
		b.Spec.SequenceNumberForAllocation[strconv.Itoa(ord)] = b.Spec.SequenceNumber
		taken[ord] = true
	}
	b.Spec.Unallocated = []int{}
	for i := range n {
		if !taken[i] {
			b.Spec.Allocations[i] = -1
			b.Spec.Unallocated = append(b.Spec.Unallocated, i)
		}
	}
	return b
}

func mkAff(node, cidr string, st tabbyv1.AffinityState) tabbyv1.BlockAffinity {
	p := netip.MustParsePrefix(cidr)
	return tabbyv1.BlockAffinity{
		ObjectMeta: metav1.ObjectMeta{Name: affinityName(node, p), CreationTimestamp: metav1.NewTime(now.Add(-time.Hour))},
		Spec:       tabbyv1.BlockAffinitySpec{Node: node, CIDR: cidr, State: st},
	}
}

func mkHandle(id string, blocks map[string]int) tabbyv1.IPAMHandle {
	return tabbyv1.IPAMHandle{ObjectMeta: metav1.ObjectMeta{Name: ipam.HandleObjectName(id)}, Spec: tabbyv1.IPAMHandleSpec{HandleID: id, Block: blocks}}
}

func mkPod(ns, name, node string, ips ...string) corev1.Pod {
	p := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: corev1.PodSpec{NodeName: node},
		Status: corev1.PodStatus{Phase: corev1.PodRunning}}
	for _, ip := range ips {
		p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: ip})
	}
	if len(ips) > 0 {
		p.Status.PodIP = ips[0]
	}
	return p
}

func mkNode(name string, annotations ...string) corev1.Node {
	n := corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{}}}
	for i := 0; i+1 < len(annotations); i += 2 {
		n.Annotations[annotations[i]] = annotations[i+1]
	}
	return n
}

// base is a clean cluster: one pool, node1's block with two running pods
// and its tunnel address, node2's block with one pod.
func base() *Snapshot {
	return &Snapshot{
		Now:   now,
		Pools: []tabbyv1.IPPool{mkPool("default", "10.0.0.0/16", 26)},
		Blocks: []tabbyv1.IPAMBlock{
			mkBlock("10.0.1.0/26", "node1", podAlloc("10.0.1.1", "default", "a", "node1"), podAlloc("10.0.1.2", "default", "b", "node1"),
				alloc{ip: "10.0.1.3", handle: "vxlan-tunnel-addr-node1", node: "node1", use: tabbyv1.UseTunnel}),
			mkBlock("10.0.2.0/26", "node2", podAlloc("10.0.2.1", "kube-system", "c", "node2")),
		},
		Affinities: []tabbyv1.BlockAffinity{mkAff("node1", "10.0.1.0/26", tabbyv1.AffinityConfirmed), mkAff("node2", "10.0.2.0/26", tabbyv1.AffinityConfirmed)},
		Handles: []tabbyv1.IPAMHandle{
			mkHandle("net.a", map[string]int{"10.0.1.0/26": 1}), mkHandle("net.b", map[string]int{"10.0.1.0/26": 1}),
			mkHandle("vxlan-tunnel-addr-node1", map[string]int{"10.0.1.0/26": 1}), mkHandle("net.c", map[string]int{"10.0.2.0/26": 1}),
		},
		Pods: []corev1.Pod{mkPod("default", "a", "node1", "10.0.1.1"), mkPod("default", "b", "node1", "10.0.1.2"),
			mkPod("kube-system", "c", "node2", "10.0.2.1"), {ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "host"},
				Spec: corev1.PodSpec{HostNetwork: true}, Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIPs: []corev1.PodIP{{IP: "192.168.0.1"}}}}},
		Nodes: []corev1.Node{mkNode("node1", tabbyv1.AnnotationVXLANTunnelAddress, "10.0.1.3"), mkNode("node2")},
	}
}

// node2WithSpare is base's block of node2 with a spare at 10.0.2.7.
func node2WithSpare() tabbyv1.IPAMBlock {
	return mkBlock("10.0.2.0/26", "node2", podAlloc("10.0.2.1", "kube-system", "c", "node2"),
		alloc{ip: "10.0.2.7", handle: ipam.SpareHandle("node2", "0a1b"), node: "node2"})
}

func (s *Snapshot) pod(ns, name string) *corev1.Pod {
	for i := range s.Pods {
		if s.Pods[i].Namespace == ns && s.Pods[i].Name == name {
			return &s.Pods[i]
		}
	}
	panic("no pod " + ns + "/" + name)
}

func (s *Snapshot) dropPod(ns, name string) {
	for i := range s.Pods {
		if s.Pods[i].Namespace == ns && s.Pods[i].Name == name {
			s.Pods = append(s.Pods[:i], s.Pods[i+1:]...)
			return
		}
	}
	panic("no pod " + ns + "/" + name)
}

func (s *Snapshot) dropNode(name string) {
	for i := range s.Nodes {
		if s.Nodes[i].Name == name {
			s.Nodes = append(s.Nodes[:i], s.Nodes[i+1:]...)
			return
		}
	}
	panic("no node " + name)
}

// want is one expected finding: severity, kind and subject (IP, object or block).
type want struct {
	sev     Severity
	kind    Kind
	subject string
	// fix and message must contain these.
	fix, msg string
}

func TestCheck(t *testing.T) {
	terminating := metav1.NewTime(now)
	cases := []struct {
		name   string
		mutate func(s *Snapshot)
		want   []want
	}{
		{name: "clean", mutate: func(*Snapshot) {}},
		{
			name:   "pod gone: leaked",
			mutate: func(s *Snapshot) { s.dropPod("default", "a") },
			want:   []want{{Problem, Leaked, "10.0.1.1", "tabbyctl ipam release --ip 10.0.1.1", "pod default/a does not exist"}},
		},
		{
			name: "pod without addresses yet: pending, not leaked",
			mutate: func(s *Snapshot) {
				p := s.pod("default", "a")
				p.Status.PodIPs, p.Status.PodIP, p.Status.Phase = nil, "", corev1.PodPending
			},
			want: []want{{Note, Pending, "10.0.1.1", "", "no address in its status yet"}},
		},
		{
			name: "pod with other addresses, allocation recent: pending",
			mutate: func(s *Snapshot) {
				s.Blocks[0] = mkBlock("10.0.1.0/26", "node1", alloc{ip: "10.0.1.1", handle: "net.a", ns: "default", pod: "a", node: "node1", age: 30 * time.Second},
					podAlloc("10.0.1.2", "default", "b", "node1"), alloc{ip: "10.0.1.3", handle: "vxlan-tunnel-addr-node1", node: "node1", use: tabbyv1.UseTunnel})
				s.pod("default", "a").Status.PodIPs = []corev1.PodIP{{IP: "10.0.1.9"}}
			},
			want: []want{
				{Note, Pending, "10.0.1.1", "", "younger than 2m0s"},
				{Problem, UnallocatedInUse, "10.0.1.9", "kubectl delete pod -n default a", "IPAM has it free in block 10.0.1.0/26"},
			},
		},
		{
			name:   "pod with other addresses, allocation old: leaked",
			mutate: func(s *Snapshot) { s.pod("default", "a").Status.PodIPs = []corev1.PodIP{{IP: "192.168.7.7"}} },
			want:   []want{{Problem, Leaked, "10.0.1.1", "tabbyctl ipam release --ip 10.0.1.1", "has 192.168.7.7 now"}},
		},
		{
			name:   "pod finished: leaked",
			mutate: func(s *Snapshot) { s.pod("default", "b").Status.Phase = corev1.PodSucceeded },
			want:   []want{{Problem, Leaked, "10.0.1.2", "tabbyctl ipam release --ip 10.0.1.2", "finished (Succeeded)"}},
		},
		{
			name:   "two live pods on one address",
			mutate: func(s *Snapshot) { s.Pods = append(s.Pods, mkPod("other", "x", "node2", "10.0.1.1")) },
			want:   []want{{Problem, DoubleBooked, "10.0.1.1", "kubectl delete pod -n other x", "IPAM records it for pod default/a"}},
		},
		{
			name: "two pods on one address, the other terminating: a note",
			mutate: func(s *Snapshot) {
				p := mkPod("other", "x", "node2", "10.0.1.1")
				p.DeletionTimestamp = &terminating
				s.Pods = append(s.Pods, p)
			},
			want: []want{{Note, DoubleBooked, "10.0.1.1", "none", "terminating"}},
		},
		{
			name: "a finished pod's old status does not double-book",
			mutate: func(s *Snapshot) {
				p := mkPod("other", "done", "node2", "10.0.1.1")
				p.Status.Phase = corev1.PodFailed
				s.Pods = append(s.Pods, p)
			},
		},
		{
			name: "pod uses an address IPAM records for a gone pod: misattributed, not leaked",
			mutate: func(s *Snapshot) {
				s.dropPod("default", "a")
				s.Pods = append(s.Pods, mkPod("other", "x", "node1", "10.0.1.1"))
			},
			want: []want{{Problem, Misattributed, "10.0.1.1", "do not release 10.0.1.1", "IPAM records it for pod default/a"}},
		},
		{
			name:   "pod uses a free pool address",
			mutate: func(s *Snapshot) { s.Pods = append(s.Pods, mkPod("other", "x", "node1", "10.0.1.40")) },
			want:   []want{{Problem, UnallocatedInUse, "10.0.1.40", "kubectl delete pod -n other x", "free in block 10.0.1.0/26"}},
		},
		{
			name:   "pod uses a pool address no block covers",
			mutate: func(s *Snapshot) { s.Pods = append(s.Pods, mkPod("other", "x", "node1", "10.0.9.9")) },
			want:   []want{{Problem, UnallocatedInUse, "10.0.9.9", "kubectl delete pod", "free in pool default"}},
		},
		{
			name: "pod addresses outside the pools are not tabby's",
			mutate: func(s *Snapshot) {
				s.Pods = append(s.Pods, mkPod("other", "x", "node1", "172.16.0.1"), mkPod("other", "y", "node1", "172.16.0.1"))
			},
		},
		{
			name:   "handle records more than the blocks hold",
			mutate: func(s *Snapshot) { s.Handles[0].Spec.Block = map[string]int{"10.0.1.0/26": 2, "10.0.2.0/26": 1} },
			want: []want{{Problem, HandleMismatch, "ipamhandle/net.a",
				`kubectl patch ipamhandle net.a --type=merge -p '{"spec":{"block":{"10.0.1.0/26":1,"10.0.2.0/26":null}}}'`,
				"records 2 addresses in 10.0.1.0/26, 1 address in 10.0.2.0/26 for handle net.a, but the blocks hold 1 address in 10.0.1.0/26"}},
		},
		{
			name: "handle that holds nothing",
			mutate: func(s *Snapshot) {
				s.Handles = append(s.Handles, mkHandle("net.gone", map[string]int{"10.0.1.0/26": 1}))
			},
			want: []want{{Problem, HandleMismatch, "ipamhandle/net.gone", "kubectl delete ipamhandle net.gone", "the blocks hold no address"}},
		},
		{
			name: "a spare of a live node, without a handle: nothing to say",
			mutate: func(s *Snapshot) {
				s.Blocks[1] = node2WithSpare()
			},
		},
		{
			name: "a spare of a deleted node: leaked",
			mutate: func(s *Snapshot) {
				s.Blocks[1] = mkBlock("10.0.2.0/26", "node2", alloc{ip: "10.0.2.7", handle: ipam.SpareHandle("node2", "0a1b"), node: "node2"})
				s.Handles, s.Nodes = s.Handles[:3], s.Nodes[:1]
				s.dropPod("kube-system", "c")
			},
			want: []want{{Problem, DeletedNode, "10.0.2.7", "tabbyctl ipam release --ip 10.0.2.7", "node2's spare"},
				{Problem, DeletedNode, "ipamblock/10-0-2-0-26", "release its addresses", "which does not exist"}},
		},
		{
			name: "a spare handed to a pod of its node, the block not written yet: pending",
			mutate: func(s *Snapshot) {
				s.Blocks[1] = node2WithSpare()
				s.Pods = append(s.Pods, mkPod("default", "new", "node2", "10.0.2.7"))
			},
			want: []want{{Note, Pending, "10.0.2.7", "", "tabbyd on node node2 handed it from node node2's spare"}},
		},
		{
			name: "a spare used by a pod of another node: misattributed",
			mutate: func(s *Snapshot) {
				s.Blocks[1] = node2WithSpare()
				s.Pods = append(s.Pods, mkPod("default", "new", "node1", "10.0.2.7"))
			},
			want: []want{{Problem, Misattributed, "10.0.2.7", "kubectl delete pod", "node node2's spare"}},
		},
		{
			name:   "live pod's addresses without a handle: a note",
			mutate: func(s *Snapshot) { s.Handles = s.Handles[1:] },
			want:   []want{{Note, HandleMissing, "10.0.1.1", "", "no IPAMHandle records handle net.a"}},
		},
		{
			name:   "block without its affinity",
			mutate: func(s *Snapshot) { s.Affinities = s.Affinities[1:] },
			want: []want{{Problem, BlockWithoutAffinity, "ipamblock/10-0-1-0-26",
				`echo '{"apiVersion":"tabby.io/v1","kind":"BlockAffinity","metadata":{"labels":{"tabby.io/node":"node1","tabby.io/pool":"default"},"name":"node1-10-0-1-0-26"},"spec":{"cidr":"10.0.1.0/26","node":"node1","state":"confirmed"}}' | kubectl create -f -`,
				"no BlockAffinity records the claim"}},
		},
		{
			name:   "empty block of no node",
			mutate: func(s *Snapshot) { s.Blocks = append(s.Blocks, mkBlock("10.0.3.0/26", "")) },
			want:   []want{{Problem, BlockWithoutAffinity, "ipamblock/10-0-3-0-26", "kubectl delete ipamblock/10-0-3-0-26", "has no node"}},
		},
		{
			name: "block of no node with a borrowed address: a note",
			mutate: func(s *Snapshot) {
				s.Blocks = append(s.Blocks, mkBlock("10.0.3.0/26", "", podAlloc("10.0.3.1", "default", "d", "node2")))
				s.Handles = append(s.Handles, mkHandle("net.d", map[string]int{"10.0.3.0/26": 1}))
				s.Pods = append(s.Pods, mkPod("default", "d", "node2", "10.0.3.1"))
			},
			want: []want{{Note, BlockWithoutAffinity, "ipamblock/10-0-3-0-26", "once its addresses are released", "1 address in use"}},
		},
		{
			name: "confirmed affinity without its block",
			mutate: func(s *Snapshot) {
				s.Affinities = append(s.Affinities, mkAff("node1", "10.0.5.0/26", tabbyv1.AffinityConfirmed))
			},
			want: []want{{Problem, AffinityWithoutBlock, "blockaffinity/node1-10-0-5-0-26", "kubectl delete blockaffinity node1-10-0-5-0-26",
				"claims block 10.0.5.0/26 for node node1 (confirmed), but the block does not exist"}},
		},
		{
			name: "pending affinity without its block, just created: a claim in progress",
			mutate: func(s *Snapshot) {
				a := mkAff("node1", "10.0.5.0/26", tabbyv1.AffinityPending)
				a.CreationTimestamp = metav1.NewTime(now.Add(-time.Second))
				s.Affinities = append(s.Affinities, a)
			},
			want: []want{{Note, Pending, "blockaffinity/node1-10-0-5-0-26", "none", "a claim is in progress"}},
		},
		{
			name: "pending affinity without its block, old",
			mutate: func(s *Snapshot) {
				s.Affinities = append(s.Affinities, mkAff("node1", "10.0.5.0/26", tabbyv1.AffinityPending))
			},
			want: []want{{Problem, AffinityWithoutBlock, "blockaffinity/node1-10-0-5-0-26", "kubectl delete blockaffinity", "(pending)"}},
		},
		{
			name: "affinity naming another node than its block",
			mutate: func(s *Snapshot) {
				s.Affinities = append(s.Affinities, mkAff("node2", "10.0.1.0/26", tabbyv1.AffinityConfirmed))
			},
			want: []want{{Problem, AffinityMismatch, "blockaffinity/node2-10-0-1-0-26", "kubectl delete blockaffinity node2-10-0-1-0-26",
				"the block is node node1's"}},
		},
		{
			name: "empty block outside any pool",
			mutate: func(s *Snapshot) {
				s.Blocks = append(s.Blocks, mkBlock("10.9.0.0/26", "node1"))
				s.Affinities = append(s.Affinities, mkAff("node1", "10.9.0.0/26", tabbyv1.AffinityConfirmed))
			},
			want: []want{{Problem, BlockOutsidePool, "ipamblock/10-9-0-0-26", "kubectl delete ipamblock/10-9-0-0-26 blockaffinity/node1-10-9-0-0-26", "lies in no IPPool"}},
		},
		{
			name: "block of another size than its pool's blocks",
			mutate: func(s *Snapshot) {
				s.Blocks = append(s.Blocks, mkBlock("10.0.4.0/28", "node1"))
				s.Affinities = append(s.Affinities, mkAff("node1", "10.0.4.0/28", tabbyv1.AffinityConfirmed))
			},
			want: []want{{Problem, BlockOutsidePool, "ipamblock/10-0-4-0-28", "kubectl delete", "is a /28, but its pool default carves /26 blocks"}},
		},
		{
			name: "node deleted: its block and allocations",
			mutate: func(s *Snapshot) {
				s.dropNode("node2")
				s.dropPod("kube-system", "c")
			},
			want: []want{
				{Problem, DeletedNode, "10.0.2.1", "tabbyctl ipam release --ip 10.0.2.1", "its node node2 does not exist"},
				{Problem, DeletedNode, "ipamblock/10-0-2-0-26", "release its addresses (reported above), then kubectl delete ipamblock/10-0-2-0-26 blockaffinity/node2-10-0-2-0-26", "affine to node node2, which does not exist"},
			},
		},
		{
			name: "tunnel address of a deleted node",
			mutate: func(s *Snapshot) {
				s.Blocks[1] = mkBlock("10.0.2.0/26", "node2", podAlloc("10.0.2.1", "kube-system", "c", "node2"),
					alloc{ip: "10.0.2.2", handle: "vxlan-tunnel-addr-node3", node: "node3", use: tabbyv1.UseTunnel})
				s.Handles = append(s.Handles, mkHandle("vxlan-tunnel-addr-node3", map[string]int{"10.0.2.0/26": 1}))
			},
			want: []want{{Problem, DeletedNode, "10.0.2.2", "tabbyctl ipam release --ip 10.0.2.2", `node "node3" does not exist`}},
		},
		{
			name:   "tunnel address its node replaced",
			mutate: func(s *Snapshot) { s.Nodes[0].Annotations[tabbyv1.AnnotationVXLANTunnelAddress] = "10.0.1.7" },
			want:   []want{{Problem, Leaked, "10.0.1.3", "tabbyctl ipam release --ip 10.0.1.3", "node node1 publishes 10.0.1.7"}},
		},
		{
			name:   "tunnel address of a node that publishes none yet is in use",
			mutate: func(s *Snapshot) { delete(s.Nodes[0].Annotations, tabbyv1.AnnotationVXLANTunnelAddress) },
		},
		{
			name: "corrupted block: slots missing",
			mutate: func(s *Snapshot) {
				s.Blocks[1].Spec.Allocations = s.Blocks[1].Spec.Allocations[:10]
			},
			want: []want{{Problem, CorruptedBlock, "ipamblock/10-0-2-0-26", "kubectl edit ipamblock 10-0-2-0-26", "has 10 allocation slots for 64 addresses"}},
		},
		{
			name: "free addresses missing from the free list",
			mutate: func(s *Snapshot) {
				s.Blocks[1].Spec.Unallocated = s.Blocks[1].Spec.Unallocated[2:] // ordinals 0 and 2
			},
			want: []want{{Problem, CorruptedBlock, "ipamblock/10-0-2-0-26", "append 0, 2 to spec.unallocated", "2 free addresses (10.0.2.0, 10.0.2.2)"}},
		},
		{
			name: "overlapping blocks allocating one address twice",
			mutate: func(s *Snapshot) {
				s.Blocks = append(s.Blocks, mkBlock("10.0.1.0/28", "node2", podAlloc("10.0.1.1", "other", "x", "node2")))
				s.Affinities = append(s.Affinities, mkAff("node2", "10.0.1.0/28", tabbyv1.AffinityConfirmed))
				s.Handles = append(s.Handles, mkHandle("net.x", map[string]int{"10.0.1.0/28": 1}))
				s.Pods = append(s.Pods, mkPod("other", "x", "node2", "10.0.1.1"))
			},
			want: []want{
				{Problem, DoubleBooked, "10.0.1.1", "repair by hand", "allocated 2 times, by overlapping blocks"},
				{Problem, BlockOutsidePool, "ipamblock/10-0-1-0-28", "delete the pods", "is a /28"},
				{Problem, OverlappingBlocks, "ipamblock/10-0-1-0-26", "kubectl delete ipamblock", "overlap"},
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := base()
			tc.mutate(s)
			rep := Check(s, Options{})
			var got []string
			for _, f := range rep.Findings {
				got = append(got, string(f.Severity)+" "+string(f.Kind)+" "+subject(f))
			}
			var exp []string
			problems := 0
			for _, w := range tc.want {
				exp = append(exp, string(w.sev)+" "+string(w.kind)+" "+w.subject)
				if w.sev == Problem {
					problems++
				}
			}
			sort.Strings(got)
			sort.Strings(exp)
			if strings.Join(got, "\n") != strings.Join(exp, "\n") {
				t.Fatalf("findings:\n%s\nwant:\n%s\nreport: %s", strings.Join(got, "\n"), strings.Join(exp, "\n"), dump(rep))
			}
			for _, w := range tc.want {
				for _, f := range rep.Findings {
					if f.Kind != w.kind || subject(f) != w.subject {
						continue
					}
					if !strings.Contains(f.Fix, w.fix) {
						t.Errorf("%s %s: fix %q does not contain %q", w.kind, w.subject, f.Fix, w.fix)
					}
					if !strings.Contains(f.Message, w.msg) {
						t.Errorf("%s %s: message %q does not contain %q", w.kind, w.subject, f.Message, w.msg)
					}
				}
			}
			if rep.OK != (problems == 0) || rep.Problems != problems || rep.Notes != len(tc.want)-problems {
				t.Errorf("ok=%v problems=%d notes=%d, want %d problems and %d notes", rep.OK, rep.Problems, rep.Notes, problems, len(tc.want)-problems)
			}
			for _, f := range rep.Findings {
				if f.Command != "" && (!strings.HasPrefix(f.Fix, f.Command) || f.Severity == Note) {
					t.Errorf("%s %s: command %q, fix %q", f.Severity, f.Kind, f.Command, f.Fix)
				}
			}
			if rep.Findings == nil {
				t.Error("findings is nil: JSON would print null, not []")
			}
			if rep.Checked.Allocations == 0 {
				t.Error("checked no allocations")
			}
		})
	}
}

func dump(v any) string {
	b, _ := json.MarshalIndent(v, "", "  ")
	return string(b)
}

func TestCheckGrace(t *testing.T) {
	s := base()
	s.Blocks[0] = mkBlock("10.0.1.0/26", "node1", alloc{ip: "10.0.1.1", handle: "net.a", ns: "default", pod: "a", node: "node1", age: 5 * time.Minute},
		podAlloc("10.0.1.2", "default", "b", "node1"), alloc{ip: "10.0.1.3", handle: "vxlan-tunnel-addr-node1", node: "node1", use: tabbyv1.UseTunnel})
	s.pod("default", "a").Status.PodIPs = []corev1.PodIP{{IP: "192.168.7.7"}}
	for _, tc := range []struct {
		grace time.Duration
		kind  Kind
	}{{0, Leaked}, {10 * time.Minute, Pending}, {-1, Leaked}, {time.Minute, Leaked}} {
		rep := Check(s, Options{Grace: tc.grace})
		if len(rep.Findings) != 1 || rep.Findings[0].Kind != tc.kind {
			t.Errorf("grace %v: %s, want one %s", tc.grace, dump(rep.Findings), tc.kind)
		}
	}
}

func TestShow(t *testing.T) {
	s := base()
	s.Pools = append(s.Pools, mkPool("v6", "fd00::/48", 122), mkPool("off", "10.1.0.0/24", 28))
	s.Pools[2].Spec.Disabled = true
	// node2 borrowed an address from node1's block.
	s.Blocks[0] = mkBlock("10.0.1.0/26", "node1", podAlloc("10.0.1.1", "default", "a", "node1"), podAlloc("10.0.1.2", "default", "b", "node1"),
		podAlloc("10.0.1.5", "default", "e", "node2"))
	s.Blocks = append(s.Blocks, mkBlock("fd00::/122", "node2", podAlloc("fd00::1", "default", "v6", "node2")), mkBlock("10.9.0.0/26", "gone"))
	s.Affinities = s.Affinities[:1]
	rep := Show(s)
	if len(rep.Pools) != 3 {
		t.Fatalf("pools: %s", dump(rep))
	}
	def, off, v6 := rep.Pools[0], rep.Pools[1], rep.Pools[2]
	if def.Name != "default" || def.Size != "65536" || def.BlockCapacity != "1024" || def.BlocksClaimed != 2 || def.Used != 4 ||
		def.FreeInBlocks != 124 || def.Free != "65532" || def.BlockSize != 26 {
		t.Errorf("default pool: %s", dump(def))
	}
	b0 := def.Blocks[0]
	if b0.CIDR != "10.0.1.0/26" || b0.Node != "node1" || b0.Affinity != "confirmed" || b0.Used != 3 || b0.Free != 61 || b0.Borrowed != 1 || b0.Size != 64 || b0.Name != "10-0-1-0-26" || b0.Pool != "default" {
		t.Errorf("node1's block: %s", dump(b0))
	}
	if b1 := def.Blocks[1]; b1.Affinity != "missing" || b1.Node != "node2" {
		t.Errorf("node2's block: %s", dump(b1))
	}
	if !off.Disabled || off.BlocksClaimed != 0 || off.Free != "256" || len(off.Blocks) != 0 {
		t.Errorf("disabled pool: %s", dump(off))
	}
	if v6.Size != "1208925819614629174706176" || v6.BlockCapacity != "18889465931478580854784" || v6.Used != 1 || v6.Free != "1208925819614629174706175" || v6.Blocks[0].Size != 64 {
		t.Errorf("IPv6 pool: %s", dump(v6))
	}
	if len(rep.BlocksOutsidePools) != 1 || !rep.BlocksOutsidePools[0].NodeMissing || rep.BlocksOutsidePools[0].Pool != "" {
		t.Errorf("blocks outside pools: %s", dump(rep.BlocksOutsidePools))
	}
	if rep.Totals != (Totals{Pools: 3, Blocks: 4, Used: 5, FreeInBlocks: 251}) {
		t.Errorf("totals: %+v", rep.Totals)
	}
	var buf bytes.Buffer
	if err := rep.WriteTable(&buf); err != nil {
		t.Fatal(err)
	}
	for _, line := range []string{
		"default         10.0.0.0/16  /26         2 of 1024                     4     124             65532",
		"10.0.1.0/26  default  node1  confirmed  3     61    1",
		"10.9.0.0/26  -        gone   missing    0     64    0         in no pool, node does not exist",
		"Total: 3 pools, 4 blocks, 5 addresses used, 251 free in the blocks.",
	} {
		if !strings.Contains(buf.String(), line) {
			t.Errorf("table lacks %q:\n%s", line, buf.String())
		}
	}
}

func TestShowIP(t *testing.T) {
	s := base()
	s.dropPod("default", "b")
	s.Pods = append(s.Pods, mkPod("other", "x", "node1", "10.0.1.2"))
	cases := []struct {
		ip        string
		allocated bool
		pool      string
		state     string
		inUse     bool
		usedBy    int
		findings  []Kind
	}{
		{ip: "10.0.1.1", allocated: true, pool: "default", state: StateRunning, inUse: true, usedBy: 1},
		{ip: "10.0.1.2", allocated: true, pool: "default", state: StateMissing, inUse: true, usedBy: 1, findings: []Kind{Misattributed}},
		{ip: "10.0.1.3", allocated: true, pool: "default", state: StateNode, inUse: true},
		{ip: "10.0.1.4", pool: "default"},
		{ip: "10.7.0.1"},
	}
	for _, tc := range cases {
		r := ShowIP(s, netip.MustParseAddr(tc.ip), Options{})
		if r.Allocated != tc.allocated || r.Pool != tc.pool || len(r.UsedBy) != tc.usedBy || len(r.Findings) != len(tc.findings) {
			t.Errorf("%s: %s", tc.ip, dump(r))
			continue
		}
		for i, k := range tc.findings {
			if r.Findings[i].Kind != k {
				t.Errorf("%s: finding %d is %s, want %s", tc.ip, i, r.Findings[i].Kind, k)
			}
		}
		if tc.allocated {
			h := r.Holders[0]
			if h.State != tc.state || h.InUse != tc.inUse || h.Block != "10.0.1.0/26" || h.Sequence == nil || h.Since == nil || h.HandleObject == "" {
				t.Errorf("%s: holder %s", tc.ip, dump(h))
			}
		}
		var buf bytes.Buffer
		if err := r.WriteTable(&buf); err != nil || !strings.Contains(buf.String(), "ADDRESS") {
			t.Errorf("%s: table %q (%v)", tc.ip, buf.String(), err)
		}
	}
}

func TestPlanRelease(t *testing.T) {
	terminating := metav1.NewTime(now)
	cases := []struct {
		name    string
		mutate  func(s *Snapshot)
		ip      string
		refused string // "" when it may be released
		err     string
		free    bool
	}{
		{name: "live pod holds it", ip: "10.0.1.1", refused: "pod default/a is live and has this address"},
		{name: "terminating pod holds it", ip: "10.0.1.1", mutate: func(s *Snapshot) { s.pod("default", "a").DeletionTimestamp = &terminating },
			refused: "is live and has this address"},
		{name: "pod gone", ip: "10.0.1.1", mutate: func(s *Snapshot) { s.dropPod("default", "a") }},
		{name: "pod finished", ip: "10.0.1.1", mutate: func(s *Snapshot) { s.pod("default", "a").Status.Phase = corev1.PodFailed }},
		{name: "pod pending", ip: "10.0.1.1", mutate: func(s *Snapshot) { s.pod("default", "a").Status.PodIPs = nil; s.pod("default", "a").Status.PodIP = "" },
			refused: "no address in its status yet"},
		{name: "pod has other addresses", ip: "10.0.1.1", mutate: func(s *Snapshot) { s.pod("default", "a").Status.PodIPs = []corev1.PodIP{{IP: "10.0.7.7"}} }},
		{name: "another live pod uses it", ip: "10.0.1.1", mutate: func(s *Snapshot) {
			s.dropPod("default", "a")
			s.Pods = append(s.Pods, mkPod("other", "x", "node1", "10.0.1.1"))
		}, refused: "the status of live pod other/x lists it"},
		{name: "a live node's tunnel address", ip: "10.0.1.3", refused: "tunnel address of node node1"},
		{name: "a deleted node's tunnel address", ip: "10.0.1.3", mutate: func(s *Snapshot) { s.dropNode("node1") }},
		{name: "free", ip: "10.0.1.9", free: true},
		{name: "not in a pool", ip: "10.9.0.1", err: "is in no IPPool"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := base()
			if tc.mutate != nil {
				tc.mutate(s)
			}
			plan, err := PlanRelease(s, netip.MustParseAddr(tc.ip), Options{})
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if plan.Allocated == tc.free {
				t.Fatalf("allocated %v: %s", plan.Allocated, dump(plan))
			}
			if tc.free {
				return
			}
			if (tc.refused == "") != (plan.Refusal == "") || !strings.Contains(plan.Refusal, tc.refused) {
				t.Fatalf("refusal %q, want %q", plan.Refusal, tc.refused)
			}
			if plan.Handle == "" || plan.Sequence == nil || plan.Block != "10.0.1.0/26" {
				t.Fatalf("plan does not pin the allocation: %s", dump(plan))
			}
			// What check calls leaked, release frees; what release refuses, check does not call leaked.
			leaked := false
			for _, f := range Check(s, Options{}).Findings {
				if f.IP == tc.ip && (f.Kind == Leaked || f.Kind == DeletedNode) {
					leaked = true
					if f.Fix != "tabbyctl ipam release --ip "+tc.ip {
						t.Errorf("fix %q", f.Fix)
					}
				}
			}
			if leaked != (plan.Refusal == "") {
				t.Errorf("check calls it leaked: %v, release refuses it: %q", leaked, plan.Refusal)
			}
		})
	}
}

func TestCheckTable(t *testing.T) {
	var buf bytes.Buffer
	if err := Check(base(), Options{}).WriteTable(&buf); err != nil {
		t.Fatal(err)
	}
	if want := "ipam check: no problems (checked 1 pool, 2 blocks, 4 allocations, 4 handles, 2 affinities, 4 pods, 2 nodes).\n"; buf.String() != want {
		t.Errorf("got %q, want %q", buf.String(), want)
	}
	s := base()
	s.dropPod("default", "a")
	buf.Reset()
	if err := Check(s, Options{}).WriteTable(&buf); err != nil {
		t.Fatal(err)
	}
	for _, line := range []string{
		"ipam check: 1 problem, 0 notes",
		"SEVERITY  KIND    SUBJECT   WHAT TO DO",
		"problem   leaked  10.0.1.1  tabbyctl ipam release --ip 10.0.1.1",
		"  10.0.1.1 (leaked): 10.0.1.1 is allocated to pod default/a (handle net.a) in block 10.0.1.0/26 (node node1), but pod default/a does not exist",
	} {
		if !strings.Contains(buf.String(), line) {
			t.Errorf("table lacks %q:\n%s", line, buf.String())
		}
	}
}

// TestAffinityName: the name check proposes is the one IPAM gives a claim.
func TestAffinityName(t *testing.T) {
	if got := affinityName("node1", netip.MustParsePrefix("10.0.1.0/26")); got != "node1-10-0-1-0-26" {
		t.Errorf("got %q", got)
	}
}

func TestAddrAt(t *testing.T) {
	for _, tc := range []struct {
		block string
		ord   int
		want  string
	}{{"10.0.1.0/26", 5, "10.0.1.5"}, {"10.0.1.192/26", 63, "10.0.1.255"}, {"10.0.0.0/20", 4095, "10.0.15.255"},
		{"fd00::40/122", 1, "fd00::41"}, {"fd00:0:0:ffff:ffff:ffff:ffff:ffc0/122", 63, "fd00::ffff:ffff:ffff:ffff:ffff"}} {
		if got := addrAt(netip.MustParsePrefix(tc.block), tc.ord); got.String() != tc.want {
			t.Errorf("addrAt(%s, %d) = %s, want %s", tc.block, tc.ord, got, tc.want)
		}
	}
}

// TestConfirm: only problems both looks found are reported; a DEL caught
// between freeing its block and deleting its handle is not one.
func TestConfirm(t *testing.T) {
	leak := base()
	leak.dropPod("default", "a")
	// The first look catches c's DEL half way: its block is free, its handle not yet deleted.
	first := base()
	first.dropPod("default", "a")
	first.dropPod("kube-system", "c")
	first.Blocks[1] = mkBlock("10.0.2.0/26", "node2")
	// The second finds the DEL done, the leak still there, and a pod starting.
	second := base()
	second.dropPod("default", "a")
	second.dropPod("kube-system", "c")
	second.Blocks[1] = mkBlock("10.0.2.0/26", "node2", podAlloc("10.0.2.5", "default", "new", "node2"))
	second.Handles = append(second.Handles[:3], mkHandle("net.new", map[string]int{"10.0.2.0/26": 1}))
	second.Pods = append(second.Pods, mkPod("default", "new", "node2"))
	r1, r2 := Check(first, Options{}), Check(second, Options{})
	if r1.Problems != 2 || r2.Problems != 1 || r2.Notes != 1 {
		t.Fatalf("first look %s\nsecond look %s", dump(r1), dump(r2))
	}
	got := Confirm(r1, r2)
	if got.OK || got.Problems != 1 || got.Notes != 1 || got.Transient != 1 || len(got.Findings) != 2 ||
		got.Findings[0].Kind != Leaked || got.Findings[0].IP != "10.0.1.1" || got.Findings[1].Kind != Pending {
		t.Fatalf("confirmed: %s", dump(got))
	}
	// A problem only the second look found is left out too.
	got = Confirm(Check(base(), Options{}), Check(leak, Options{}))
	if !got.OK || got.Transient != 1 || len(got.Findings) != 0 {
		t.Fatalf("a problem seen once: %s", dump(got))
	}
	var buf bytes.Buffer
	if err := got.WriteTable(&buf); err != nil || !strings.Contains(buf.String(), "no problems (") ||
		!strings.Contains(buf.String(), "left out 1 problem only one of two looks found, work in flight") {
		t.Errorf("table %q (%v)", buf.String(), err)
	}
}
