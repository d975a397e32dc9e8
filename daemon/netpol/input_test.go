package netpol

import (
	"fmt"
	"math/rand"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	tabbyv1 "github.com/tabbynet/tabby/api/v1"
	"github.com/tabbynet/tabby/contract"
	"github.com/tabbynet/tabby/policy"
)

func testPod(ns, name, node string, mod ...func(*corev1.Pod)) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("uid-" + name), Labels: map[string]string{"app": name}},
		Spec:       corev1.PodSpec{NodeName: node},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning},
	}
	for _, m := range mod {
		m(p)
	}
	return p
}

func withStatusIPs(ips ...string) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		for _, ip := range ips {
			p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: ip})
		}
		if len(ips) > 0 {
			p.Status.PodIP = ips[0]
		}
	}
}

// testBlock is a block of cidr whose ordinals hold the given attributes.
func testBlock(cidr string, held map[int]tabbyv1.AllocationAttribute) *tabbyv1.IPAMBlock {
	p := netip.MustParsePrefix(cidr)
	n := 1 << (p.Addr().BitLen() - p.Bits())
	b := &tabbyv1.IPAMBlock{ObjectMeta: metav1.ObjectMeta{Name: "b-" + cidr}, Spec: tabbyv1.IPAMBlockSpec{CIDR: cidr, Allocations: make([]int, n)}}
	for i := range b.Spec.Allocations {
		b.Spec.Allocations[i] = -1
	}
	for ord, attr := range held {
		b.Spec.Allocations[ord] = len(b.Spec.Attributes)
		b.Spec.Attributes = append(b.Spec.Attributes, attr)
	}
	return b
}

func addrs(s ...string) []netip.Addr {
	out := make([]netip.Addr, len(s))
	for i, a := range s {
		out[i] = netip.MustParseAddr(a)
	}
	return out
}

// ep is what a test expects of one endpoint.
type ep struct {
	Key   string
	IPs   []netip.Addr
	Iface string
}

func TestBuildInput(t *testing.T) {
	const node = "n1"
	veth := func(ns, name string) string {
		return contract.HostVethName(contract.PodID{Namespace: ns, Name: name}, "", "eth0")
	}
	attr := func(ns, pod, node string) tabbyv1.AllocationAttribute {
		return tabbyv1.AllocationAttribute{HandleID: "net." + pod, Use: tabbyv1.UseWorkload, Namespace: ns, Pod: pod, Node: node}
	}
	tests := []struct {
		name   string
		pods   []*corev1.Pod
		blocks []*tabbyv1.IPAMBlock
		want   []ep
	}{
		{
			name: "addresses from status",
			pods: []*corev1.Pod{testPod("x", "a", node, withStatusIPs("10.0.0.5", "fd00::5")), testPod("x", "b", "n2", withStatusIPs("10.0.1.5"))},
			want: []ep{{"x/a", addrs("10.0.0.5", "fd00::5"), veth("x", "a")}, {"x/b", addrs("10.0.1.5"), ""}},
		},
		{
			name:   "addresses from IPAM before the status has them",
			pods:   []*corev1.Pod{testPod("x", "a", node), testPod("y", "b", "n2")},
			blocks: []*tabbyv1.IPAMBlock{testBlock("10.0.0.0/28", map[int]tabbyv1.AllocationAttribute{3: attr("x", "a", node), 9: attr("y", "b", "n2")})},
			want:   []ep{{"x/a", addrs("10.0.0.3"), veth("x", "a")}, {"y/b", addrs("10.0.0.9"), ""}},
		},
		{
			name: "IPAM and status together, without duplicates",
			pods: []*corev1.Pod{testPod("x", "a", node, withStatusIPs("10.0.0.3"))},
			blocks: []*tabbyv1.IPAMBlock{
				testBlock("10.0.0.0/28", map[int]tabbyv1.AllocationAttribute{3: attr("x", "a", node)}),
				testBlock("fd00::/124", map[int]tabbyv1.AllocationAttribute{15: attr("x", "a", node)}),
			},
			want: []ep{{"x/a", addrs("10.0.0.3", "fd00::f"), veth("x", "a")}},
		},
		{
			name: "a block's ordinals carry across bytes",
			pods: []*corev1.Pod{testPod("x", "a", node)},
			blocks: []*tabbyv1.IPAMBlock{
				testBlock("10.0.0.0/23", map[int]tabbyv1.AllocationAttribute{300: attr("x", "a", node)}),
			},
			want: []ep{{"x/a", addrs("10.0.1.44"), veth("x", "a")}},
		},
		{
			name: "no address, host network, ended pods and tunnels are no endpoints",
			pods: []*corev1.Pod{
				testPod("x", "noaddr", node),
				testPod("x", "host", node, withStatusIPs("192.168.1.1"), func(p *corev1.Pod) { p.Spec.HostNetwork = true }),
				testPod("x", "done", node, withStatusIPs("10.0.0.7"), func(p *corev1.Pod) { p.Status.Phase = corev1.PodSucceeded }),
				testPod("x", "failed", node, withStatusIPs("10.0.0.8"), func(p *corev1.Pod) { p.Status.Phase = corev1.PodFailed }),
				testPod("x", "pending", node, withStatusIPs("10.0.0.9"), func(p *corev1.Pod) { p.Status.Phase = corev1.PodPending }),
			},
			blocks: []*tabbyv1.IPAMBlock{testBlock("10.0.0.0/28", map[int]tabbyv1.AllocationAttribute{
				1: {HandleID: "vxlan-tunnel-addr-n1", Use: tabbyv1.UseTunnel, Node: node},
				2: {HandleID: "net.c1", Use: tabbyv1.UseWorkload, Namespace: "x", Pod: "gone", Node: node},
			})},
			want: []ep{{"x/pending", addrs("10.0.0.9"), veth("x", "pending")}},
		},
		{
			name: "an allocation another node holds for a namesake is not the pod's",
			pods: []*corev1.Pod{testPod("x", "a", node, withStatusIPs("10.0.0.2"))},
			blocks: []*tabbyv1.IPAMBlock{testBlock("10.0.0.0/28", map[int]tabbyv1.AllocationAttribute{
				2: attr("x", "a", node), 4: attr("x", "a", "n2"),
			})},
			want: []ep{{"x/a", addrs("10.0.0.2"), veth("x", "a")}},
		},
		{
			name: "a malformed block is skipped",
			pods: []*corev1.Pod{testPod("x", "a", node)},
			blocks: []*tabbyv1.IPAMBlock{
				{Spec: tabbyv1.IPAMBlockSpec{CIDR: "not-a-cidr", Allocations: []int{0}, Attributes: []tabbyv1.AllocationAttribute{attr("x", "a", node)}}},
				{Spec: tabbyv1.IPAMBlockSpec{CIDR: "10.0.0.0/30", Allocations: []int{5, 0, 0, 0, 0, 0}, Attributes: []tabbyv1.AllocationAttribute{attr("x", "a", node)}}},
				{Spec: tabbyv1.IPAMBlockSpec{CIDR: "10.8.0.0/8", Allocations: []int{0}, Attributes: []tabbyv1.AllocationAttribute{attr("x", "a", node)}}},
				nil,
			},
			want: []ep{{"x/a", addrs("10.0.0.1", "10.0.0.2", "10.0.0.3"), veth("x", "a")}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			in := BuildInput(node, tc.pods, nil, nil, tc.blocks)
			var got []ep
			for _, e := range in.Endpoints {
				got = append(got, ep{e.Pod.Namespace + "/" + e.Pod.Name, e.IPs, e.HostIface})
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("endpoints\n got %v\nwant %v", got, tc.want)
			}
			if in.Node != node {
				t.Errorf("node %q", in.Node)
			}
		})
	}
}

func TestBuildInputSortsAndKeepsObjects(t *testing.T) {
	nsB := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "b"}}
	nsA := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "a"}}
	p2 := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "b", Name: "a"}}
	p1 := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "z"}}
	podB := testPod("b", "p", "n1", withStatusIPs("10.0.0.2"))
	podA := testPod("a", "p", "n2", withStatusIPs("10.0.0.1"))
	in := BuildInput("n1", []*corev1.Pod{podB, nil, podA}, []*corev1.Namespace{nsB, nil, nsA}, []*networkingv1.NetworkPolicy{p2, nil, p1}, nil)
	if len(in.Namespaces) != 2 || in.Namespaces[0] != nsA || in.Namespaces[1] != nsB {
		t.Errorf("namespaces %v", in.Namespaces)
	}
	if len(in.Policies) != 2 || in.Policies[0] != p1 || in.Policies[1] != p2 {
		t.Errorf("policies %v", in.Policies)
	}
	if len(in.Endpoints) != 2 || in.Endpoints[0].Pod != podA || in.Endpoints[1].Pod != podB {
		t.Fatalf("endpoints %v", in.Endpoints)
	}
	if in.Endpoints[0].HostIface != "" || in.Endpoints[1].HostIface == "" {
		t.Errorf("host ifaces %q %q", in.Endpoints[0].HostIface, in.Endpoints[1].HostIface)
	}
	// The same objects in another order give the same input.
	again := BuildInput("n1", []*corev1.Pod{podA, podB}, []*corev1.Namespace{nsA, nsB}, []*networkingv1.NetworkPolicy{p1, p2}, nil)
	if !reflect.DeepEqual(in, again) {
		t.Error("the input depends on the order of the objects")
	}
}

func TestHostIfaceIsThePluginsName(t *testing.T) {
	// The plugin names the host veth from the pod identity in CNI_ARGS and
	// the container ID (plugin's TestAttachmentNameIsTabbyds checks it
	// does so with contract.HostVethName); the controller from the Pod:
	// both must agree for the rules to meet the pod's traffic.
	p := testPod("kube-system", "coredns-abc", "n1")
	id := contract.PodID{Namespace: "kube-system", Name: "coredns-abc"}
	if got, want := HostIface(p), contract.HostVethName(id, "c1", "eth0"); got != want || len(got) > 15 {
		t.Errorf("HostIface %q, the plugin's %q", got, want)
	}
}

func TestChangeFilters(t *testing.T) {
	base := testPod("x", "a", "n1", withStatusIPs("10.0.0.1"), func(p *corev1.Pod) {
		p.Spec.Containers = []corev1.Container{{Name: "c", Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 80}}}}
	})
	mod := func(f func(*corev1.Pod)) *corev1.Pod {
		p := base.DeepCopy()
		f(p)
		return p
	}
	now := metav1.Now()
	for name, tc := range map[string]struct {
		new  *corev1.Pod
		want bool
	}{
		"conditions":   {mod(func(p *corev1.Pod) { p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady}} }), false},
		"annotations":  {mod(func(p *corev1.Pod) { p.Annotations = map[string]string{"a": "b"} }), false},
		"labels":       {mod(func(p *corev1.Pod) { p.Labels["tier"] = "web" }), true},
		"ips":          {mod(func(p *corev1.Pod) { p.Status.PodIPs = nil }), true},
		"phase":        {mod(func(p *corev1.Pod) { p.Status.Phase = corev1.PodSucceeded }), true},
		"named port":   {mod(func(p *corev1.Pod) { p.Spec.Containers[0].Ports[0].ContainerPort = 8080 }), true},
		"node":         {mod(func(p *corev1.Pod) { p.Spec.NodeName = "n2" }), true},
		"host network": {mod(func(p *corev1.Pod) { p.Spec.HostNetwork = true }), true},
		"deletion":     {mod(func(p *corev1.Pod) { p.DeletionTimestamp = &now }), true},
		"uid":          {mod(func(p *corev1.Pod) { p.UID = "other" }), true},
	} {
		if got := podChanged(base, tc.new); got != tc.want {
			t.Errorf("%s: podChanged %v, want %v", name, got, tc.want)
		}
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "x", Labels: map[string]string{"a": "1"}}}
	ns2 := ns.DeepCopy()
	ns2.Annotations = map[string]string{"b": "2"}
	if namespaceChanged(ns, ns2) {
		t.Error("a namespace annotation is no change")
	}
	ns2.Labels["a"] = "2"
	if !namespaceChanged(ns, ns2) {
		t.Error("a namespace label is a change")
	}
	b := testBlock("10.0.0.0/30", nil)
	b2 := b.DeepCopy()
	b2.Spec.SequenceNumber = 7
	if blockChanged(b, b2) {
		t.Error("a sequence number is no change")
	}
	b2.Spec.Allocations[1] = 0
	b2.Spec.Attributes = []tabbyv1.AllocationAttribute{{Namespace: "x", Pod: "a"}}
	if !blockChanged(b, b2) {
		t.Error("an allocation is a change")
	}
}

// TestCompareKeys: compareKeys orders namespace/name keys as the joined
// strings do, also where one namespace starts another.
func TestCompareKeys(t *testing.T) {
	keys := [][2]string{{"a", "z"}, {"a", "b"}, {"a-b", "a"}, {"ab", "a"}, {"a.b", "x"}, {"a", ""}, {"", "a"},
		{"np-03", "p1"}, {"np-3", "p1"}, {"np-03", "p10"}, {"a/b", "c"}, {"a", "b/c"}, {"b", "a"}}
	for _, x := range keys {
		for _, y := range keys {
			want := strings.Compare(x[0]+"/"+x[1], y[0]+"/"+y[1])
			if got := compareKeys(x[0], x[1], y[0], y[1]); got != want {
				t.Errorf("compareKeys(%q, %q, %q, %q) = %d, want %d", x[0], x[1], y[0], y[1], got, want)
			}
		}
	}
}

// TestInputBuilderEqualsBuildInput: on random sequences of changes (pods
// added, deleted, replaced by new objects with other labels, addresses,
// phase, node or host networking; IPAM's allocations changed), an
// InputBuilder fed every step gives exactly BuildInput's input, and never
// changes the addresses of an input it returned before.
func TestInputBuilderEqualsBuildInput(t *testing.T) {
	const node = "n1"
	for seed := range 200 {
		r := rand.New(rand.NewSource(int64(seed)))
		ip := func() string {
			if r.Intn(3) == 0 {
				return fmt.Sprintf("fd00::%x", r.Intn(24))
			}
			return fmt.Sprintf("10.0.0.%d", r.Intn(24))
		}
		newPod := func(name string) *corev1.Pod {
			var ips []string
			for range r.Intn(3) {
				ips = append(ips, ip())
			}
			p := testPod([]string{"x", "y"}[r.Intn(2)], name, []string{node, "n2"}[r.Intn(2)], withStatusIPs(ips...))
			p.Labels = map[string]string{"app": fmt.Sprint(r.Intn(3))}
			switch r.Intn(8) {
			case 0:
				p.Spec.HostNetwork = true
			case 1:
				p.Status.Phase = corev1.PodSucceeded
			case 2:
				p.Status.PodIP = ip() // not podIPs[0]
			}
			return p
		}
		var pods []*corev1.Pod
		for i := range 4 + r.Intn(8) {
			pods = append(pods, newPod(fmt.Sprintf("p%d", i)))
		}
		newBlock := func() *tabbyv1.IPAMBlock {
			held := map[int]tabbyv1.AllocationAttribute{}
			for range r.Intn(6) {
				p := pods[r.Intn(len(pods))]
				held[r.Intn(16)] = tabbyv1.AllocationAttribute{HandleID: "net." + p.Name, Use: tabbyv1.UseWorkload,
					Namespace: p.Namespace, Pod: p.Name, Node: []string{node, "n2", ""}[r.Intn(3)]}
			}
			return testBlock([]string{"10.0.0.0/28", "10.0.0.16/28", "fd00::/124"}[r.Intn(3)], held)
		}
		blocks := []*tabbyv1.IPAMBlock{newBlock()}
		var b InputBuilder
		var before []*policy.Input
		var saved [][][]netip.Addr
		for step := range 30 {
			// Now and then for the other node: the builder's memory of
			// which pods are local is for the node it was given.
			on := node
			if r.Intn(6) == 0 {
				on = "n2"
			}
			got, want := b.Build(on, pods, nil, nil, blocks), BuildInput(on, pods, nil, nil, blocks)
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("seed %d step %d (for node %s): InputBuilder\n got %+v\nwant %+v", seed, step, on, got.Endpoints, want.Endpoints)
			}
			var ips [][]netip.Addr
			for _, e := range got.Endpoints {
				ips = append(ips, slices.Clone(e.IPs))
			}
			before, saved = append(before, got), append(saved, ips)
			for i, in := range before {
				for j, e := range in.Endpoints {
					if !slices.Equal(e.IPs, saved[i][j]) {
						t.Fatalf("seed %d step %d: the input of step %d changed: %v, was %v", seed, step, i, e.IPs, saved[i][j])
					}
				}
			}
			switch i := r.Intn(len(pods)); r.Intn(6) {
			case 0:
				pods = append(pods, newPod(fmt.Sprintf("n%d", step)))
			case 1:
				if len(pods) > 1 {
					pods = slices.Delete(pods, i, i+1)
				}
			case 2:
				blocks = append(blocks, newBlock())
			case 3:
				blocks = blocks[:max(0, len(blocks)-1)]
			default: // a new object for the same pod
				p := newPod(pods[i].Name)
				p.Namespace = pods[i].Namespace
				pods[i] = p
			}
			r.Shuffle(len(pods), func(i, j int) { pods[i], pods[j] = pods[j], pods[i] })
		}
	}
}

// An InputBuilder forgets the Pod objects it is no longer given once they
// are more than an eighth of those given and 64, and still builds what
// BuildInput does.
func TestInputBuilderForgets(t *testing.T) {
	var b InputBuilder
	pods := make([]*corev1.Pod, 16)
	swept := false
	for round := range 20 {
		for i := range pods {
			pods[i] = testPod("x", fmt.Sprintf("p%d", i), "n1", withStatusIPs(fmt.Sprintf("10.0.%d.%d", round, i)))
		}
		before := len(b.pods)
		got, want := b.Build("n1", pods, nil, nil, nil), BuildInput("n1", pods, nil, nil, nil)
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("round %d: got %+v, want %+v", round, got.Endpoints, want.Endpoints)
		}
		if most := len(pods) + len(pods)/8 + 64; len(b.pods) > most {
			t.Fatalf("round %d: %d pods remembered, more than %d", round, len(b.pods), most)
		}
		swept = forgotTo(t, "pods", round, before, len(b.pods), len(pods)) || swept
	}
	if !swept {
		t.Error("never forgot a pod")
	}
}

// forgotTo checks a builder's memory after a call of one round given
// objects: when it shrank from before to now (it forgot), it holds
// exactly the given ones. It says whether it forgot.
func forgotTo(t *testing.T, what string, round, before, now, given int) bool {
	t.Helper()
	if now >= before {
		return false
	}
	if now != given {
		t.Errorf("round %d: after forgetting, %d %s remembered, want the %d given", round, now, what, given)
	}
	return true
}
