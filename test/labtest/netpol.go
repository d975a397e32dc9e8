package labtest

// The model of the upstream Kubernetes NetworkPolicy end-to-end suite
// (k8s.io/kubernetes test/e2e/network/netpol): namespaces x, y and z, each
// with pods a, b and c, each pod serving TCP and UDP on ports 80 and 81
// from one container per port and protocol (cont-80-tcp with the container
// port serve-80-tcp, ...), and its truth tables: every pod probes every
// other pod on every port and protocol, and the observed matrix is
// compared with the expected one.
//
// The pods are real pods of the lab's kubelets and containerd, their
// containers agnhost serve-hostname (as upstream's model runs agnhost
// servers), one per port and protocol. Each pod's spec.hostname is
// "NAMESPACE-NAME" (x-a, ...): serve-hostname answers every TCP connection
// and every UDP datagram with it, so a probe tells which pod answered.
//
// Probes are real connections made from inside the pods' network
// namespaces (found through each pod's cgroup, as tabbyctl lab exec finds
// them): the test process opens each probe's socket in the client pod's
// namespace (setns on a locked thread), so a whole matrix of 324 probes
// runs in parallel in about a second instead of forking a process, or a
// kubectl exec, per probe. TCP probes connect and read the server's answer
// (its hostname); UDP probes send datagrams and wait for the answer. A
// wrong answer counts as a failed probe.
//
// SCTP: the NetworkPolicy scenarios with SCTP ports check that such rules
// isolate TCP and UDP as they should; SCTP traffic itself is not probed
// (upstream's [Feature:SCTPConnectivity]), since many kernels, this
// machine's among them, have no SCTP (see SCTPSupport).

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

	"github.com/tabbynet/tabby/internal/controlplane"
	"github.com/tabbynet/tabby/lab"
)

// PortProto is a port and protocol the model's pods serve.
type PortProto struct {
	Port  int
	Proto corev1.Protocol
}

func (pp PortProto) String() string { return fmt.Sprintf("%s/%d", pp.Proto, pp.Port) }

// The ports and protocols every model pod serves.
var (
	TCP80 = PortProto{80, corev1.ProtocolTCP}
	TCP81 = PortProto{81, corev1.ProtocolTCP}
	UDP80 = PortProto{80, corev1.ProtocolUDP}
	UDP81 = PortProto{81, corev1.ProtocolUDP}

	NetpolPortProtos = []PortProto{TCP80, TCP81, UDP80, UDP81}
)

// NetpolPortName is the upstream name of the container port serving pp
// (serve-80-tcp, ...).
func NetpolPortName(pp PortProto) string {
	return fmt.Sprintf("serve-%d-%s", pp.Port, strings.ToLower(string(pp.Proto)))
}

// NetpolPod is one pod of the model.
type NetpolPod struct {
	Namespace, Name string
	Node            string
	// IP is the pod's address the model probes and its policies name:
	// of the family SetFamily chose (IPv4 at first), one of IPs.
	IP  netip.Addr
	IPs []netip.Addr
	// NetNS is the path of the pod's network namespace (/proc/PID/ns/net
	// of its sandbox's pause process).
	NetNS string
}

func (p *NetpolPod) String() string { return p.Namespace + "/" + p.Name }

// Hostname is what the pod's servers answer: its spec.hostname,
// NetpolHostname of its namespace and name.
func (p *NetpolPod) Hostname() string { return NetpolHostname(p.Namespace, p.Name) }

// NetpolHostname is the hostname of the model's pod ns/name: "ns-name"
// (a hostname is a DNS label, so it cannot be "ns/name").
func NetpolHostname(ns, name string) string { return ns + "-" + name }

// NetpolModel is the upstream model running in a lab.
type NetpolModel struct {
	Lab        *Lab
	Namespaces []string
	// Pods in namespace-major order: x/a, x/b, x/c, y/a, ...
	Pods []*NetpolPod
	// NodeNetNS is each node's network namespace path, by node name.
	NodeNetNS map[string]string

	// ProbeTimeout bounds one probe; Concurrency bounds the probes in
	// flight; Settle is how long Validate keeps probing a matrix that is
	// not yet as expected (the time tabbyd may take to program a change).
	ProbeTimeout time.Duration
	Concurrency  int
	Settle       time.Duration

	// family is 4 or 6 (SetFamily); 0 is 4.
	family int

	mu sync.Mutex
	// lastDenied counts the failed probes of the last matrix.
	lastDenied int
}

// SetFamily makes the model probe, and its scenarios name, the pods'
// addresses of one family (4 or 6); it fails the test when a pod has none.
func (m *NetpolModel) SetFamily(t testing.TB, family int) {
	t.Helper()
	for _, p := range m.Pods {
		i := slices.IndexFunc(p.IPs, func(a netip.Addr) bool { return a.Is4() == (family == 4) })
		if i < 0 {
			t.Fatalf("pod %s has no IPv%d address (%v): is the lab dual-stack?", p, family, p.IPs)
		}
		p.IP = p.IPs[i]
	}
	m.family = family
}

// PodCIDR is the lab's pod network of the model's family.
func (m *NetpolModel) PodCIDR() string {
	if m.family == 6 {
		return m.Lab.State.IPv6PodCIDR
	}
	return lab.DefaultPodCIDR
}

// NewNetpolModel creates namespaces x, y, z and pods a, b, c in each
// (spread over nodes round-robin so that every namespace has pods on
// several nodes), all at once, waits until all are Running and Ready, and
// returns the model.
func NewNetpolModel(t testing.TB, l *Lab, nodes []string) *NetpolModel {
	t.Helper()
	m := &NetpolModel{
		Lab: l, Namespaces: []string{"x", "y", "z"}, NodeNetNS: map[string]string{},
		ProbeTimeout: time.Second, Concurrency: 128, Settle: 10 * time.Second,
	}
	for _, name := range nodes {
		m.NodeNetNS[name] = lab.NetNSPath(l.Node(t, name).NetNS)
	}
	ctx := context.Background()
	for _, ns := range m.Namespaces {
		_, err := l.CS.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
			Name: ns, Labels: map[string]string{"ns": ns}}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("creating namespace %s: %v", ns, err)
		}
	}
	for ni, ns := range m.Namespaces {
		for pi, name := range []string{"a", "b", "c"} {
			node := nodes[(ni+pi)%len(nodes)]
			m.Pods = append(m.Pods, &NetpolPod{Namespace: ns, Name: name, Node: node})
			m.createPod(t, netpolPodSpec(ns, name, node))
		}
	}
	deadline := time.Now().Add(2 * time.Minute)
	for _, p := range m.Pods {
		for {
			got, err := l.CS.CoreV1().Pods(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
			if err == nil {
				err = Running(true)(got)
			}
			if err == nil {
				p.IP = netip.MustParseAddr(got.Status.PodIP)
				p.IPs = nil
				for _, a := range got.Status.PodIPs {
					p.IPs = append(p.IPs, netip.MustParseAddr(a.IP))
				}
				p.NetNS, err = lab.PodNetNS(ctx, l.State, p.Namespace+"/"+p.Name)
			}
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("pod %s: %v", p, err)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	return m
}

// netpolPodSpec is a model pod: one agnhost container per port and
// protocol, as upstream (cont-80-tcp serving container port serve-80-tcp,
// ...), each serve-hostname answering with the pod's hostname "ns-name".
func netpolPodSpec(ns, name, node string) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"pod": name}},
		Spec: corev1.PodSpec{
			Hostname:                      NetpolHostname(ns, name),
			NodeSelector:                  map[string]string{corev1.LabelHostname: node},
			TerminationGracePeriodSeconds: ptr.To[int64](2),
		},
	}
	for _, pp := range NetpolPortProtos {
		proto := strings.ToLower(string(pp.Proto))
		c := corev1.Container{
			Name:  fmt.Sprintf("cont-%d-%s", pp.Port, proto),
			Image: lab.AgnhostImage,
			Args:  []string{"serve-hostname", "--" + proto, "--http=false", "--port", strconv.Itoa(pp.Port)},
			Ports: []corev1.ContainerPort{{Name: NetpolPortName(pp), ContainerPort: int32(pp.Port), Protocol: pp.Proto}},
		}
		if pp.Proto == corev1.ProtocolTCP {
			c.ReadinessProbe = &corev1.Probe{
				ProbeHandler:  corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromString(NetpolPortName(pp))}},
				PeriodSeconds: 1,
			}
		}
		p.Spec.Containers = append(p.Spec.Containers, c)
	}
	return p
}

// createPod creates a pod, retrying while its namespace's default service
// account does not exist yet.
func (m *NetpolModel) createPod(t testing.TB, p *corev1.Pod) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := m.Lab.CS.CoreV1().Pods(p.Namespace).Create(context.Background(), p, metav1.CreateOptions{})
		if err == nil {
			return
		}
		if time.Now().After(deadline) || !strings.Contains(err.Error(), "serviceaccount") {
			t.Fatalf("creating pod %s/%s: %v", p.Namespace, p.Name, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// Pod returns the model's pod "ns/name".
func (m *NetpolModel) Pod(t testing.TB, ref string) *NetpolPod {
	t.Helper()
	for _, p := range m.Pods {
		if p.String() == ref {
			return p
		}
	}
	t.Fatalf("the model has no pod %s", ref)
	return nil
}

// ---- the API side: policies and labels ----

// CreatePolicy creates a NetworkPolicy in ns.
func (m *NetpolModel) CreatePolicy(t testing.TB, ns string, np *networkingv1.NetworkPolicy) {
	t.Helper()
	if _, err := m.Lab.CS.NetworkingV1().NetworkPolicies(ns).Create(context.Background(), np, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating NetworkPolicy %s/%s: %v", ns, np.Name, err)
	}
}

// UpdatePolicy changes the NetworkPolicy ns/name with change.
func (m *NetpolModel) UpdatePolicy(t testing.TB, ns, name string, change func(*networkingv1.NetworkPolicy)) {
	t.Helper()
	api := m.Lab.CS.NetworkingV1().NetworkPolicies(ns)
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		np, err := api.Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		change(np)
		_, err = api.Update(context.Background(), np, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatalf("updating NetworkPolicy %s/%s: %v", ns, name, err)
	}
}

// DeletePolicy deletes the NetworkPolicy ns/name.
func (m *NetpolModel) DeletePolicy(t testing.TB, ns, name string) {
	t.Helper()
	if err := m.Lab.CS.NetworkingV1().NetworkPolicies(ns).Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("deleting NetworkPolicy %s/%s: %v", ns, name, err)
	}
}

// DeleteAllPolicies deletes every NetworkPolicy of the model's namespaces.
func (m *NetpolModel) DeleteAllPolicies(t testing.TB) {
	t.Helper()
	for _, ns := range m.Namespaces {
		err := m.Lab.CS.NetworkingV1().NetworkPolicies(ns).DeleteCollection(context.Background(), metav1.DeleteOptions{}, metav1.ListOptions{})
		if err != nil {
			t.Fatalf("deleting the NetworkPolicies of %s: %v", ns, err)
		}
	}
}

// labelPatch is a JSON merge patch of labels: nil values remove a label.
func labelPatch(labels map[string]*string) []byte {
	var b strings.Builder
	b.WriteString(`{"metadata":{"labels":{`)
	first := true
	for k, v := range labels {
		if !first {
			b.WriteByte(',')
		}
		first = false
		b.WriteString(strconv.Quote(k) + ":")
		if v == nil {
			b.WriteString("null")
		} else {
			b.WriteString(strconv.Quote(*v))
		}
	}
	b.WriteString(`}}}`)
	return []byte(b.String())
}

// LabelPod sets (or, with a nil value, removes) labels of the pod "ns/name".
func (m *NetpolModel) LabelPod(t testing.TB, ref string, labels map[string]*string) {
	t.Helper()
	p := m.Pod(t, ref)
	_, err := m.Lab.CS.CoreV1().Pods(p.Namespace).Patch(context.Background(), p.Name, types.MergePatchType, labelPatch(labels), metav1.PatchOptions{})
	if err != nil {
		t.Fatalf("labelling pod %s: %v", ref, err)
	}
}

// LabelNamespace sets (or, with a nil value, removes) labels of a namespace.
func (m *NetpolModel) LabelNamespace(t testing.TB, ns string, labels map[string]*string) {
	t.Helper()
	_, err := m.Lab.CS.CoreV1().Namespaces().Patch(context.Background(), ns, types.MergePatchType, labelPatch(labels), metav1.PatchOptions{})
	if err != nil {
		t.Fatalf("labelling namespace %s: %v", ns, err)
	}
}

// Reset brings the API objects back to the model's initial state: no
// NetworkPolicy, pods labelled only pod=NAME, namespaces only ns=NAME
// (and the API server's kubernetes.io/metadata.name).
func (m *NetpolModel) Reset(t testing.TB) {
	t.Helper()
	m.DeleteAllPolicies(t)
	ctx := context.Background()
	for _, p := range m.Pods {
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			pod, err := m.Lab.CS.CoreV1().Pods(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			want := map[string]string{"pod": p.Name}
			if mapsEqual(pod.Labels, want) {
				return nil
			}
			pod.Labels = want
			_, err = m.Lab.CS.CoreV1().Pods(p.Namespace).Update(ctx, pod, metav1.UpdateOptions{})
			return err
		})
		if err != nil {
			t.Fatalf("resetting the labels of pod %s: %v", p, err)
		}
	}
	for _, name := range m.Namespaces {
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			ns, err := m.Lab.CS.CoreV1().Namespaces().Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			want := map[string]string{"ns": name, corev1.LabelMetadataName: name}
			if mapsEqual(ns.Labels, want) {
				return nil
			}
			ns.Labels = want
			_, err = m.Lab.CS.CoreV1().Namespaces().Update(ctx, ns, metav1.UpdateOptions{})
			return err
		})
		if err != nil {
			t.Fatalf("resetting the labels of namespace %s: %v", name, err)
		}
	}
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// ---- expectations ----

// NetpolPeer selects model pods: an empty Namespace or Name matches any.
type NetpolPeer struct{ Namespace, Name string }

// PodPeer is the peer "ns/name"; NamespacePeer every pod of ns; AnyPeer
// every pod.
func PodPeer(ref string) NetpolPeer {
	ns, name, _ := strings.Cut(ref, "/")
	return NetpolPeer{ns, name}
}
func NamespacePeer(ns string) NetpolPeer { return NetpolPeer{Namespace: ns} }

var AnyPeer = NetpolPeer{}

func (p NetpolPeer) matches(pod *NetpolPod) bool {
	return (p.Namespace == "" || p.Namespace == pod.Namespace) && (p.Name == "" || p.Name == pod.Name)
}

// NetpolCell is one probe of a matrix: from pod From to pod To (indexes into
// Pods) on PP. From is NetpolNodeRow for a probe from To's own node.
type NetpolCell struct {
	From, To int
	PP       PortProto
}

// NetpolNodeRow is NetpolCell.From of a probe from the target pod's own node.
const NetpolNodeRow = -1

// Reachability is an expected matrix: pod to pod on each port and
// protocol. A pod to itself is not checked (upstream ignores loopback),
// and a node always reaches its own pods.
type Reachability struct {
	m    *NetpolModel
	want map[NetpolCell]bool
}

// NewReachability is a matrix where everything is def.
func (m *NetpolModel) NewReachability(def bool) *Reachability {
	r := &Reachability{m: m, want: map[NetpolCell]bool{}}
	for i := range m.Pods {
		for j := range m.Pods {
			if i == j {
				continue
			}
			for _, pp := range NetpolPortProtos {
				r.want[NetpolCell{i, j, pp}] = def
			}
		}
	}
	return r
}

// Expect sets the cells from the pods from matches to the pods to
// matches, on pps (all four when none), to ok.
func (r *Reachability) Expect(from, to NetpolPeer, ok bool, pps ...PortProto) *Reachability {
	if len(pps) == 0 {
		pps = NetpolPortProtos
	}
	for i, pf := range r.m.Pods {
		for j, pt := range r.m.Pods {
			if i == j || !from.matches(pf) || !to.matches(pt) {
				continue
			}
			for _, pp := range pps {
				r.want[NetpolCell{i, j, pp}] = ok
			}
		}
	}
	return r
}

// ExpectAllIngress sets everything to the pods to matches.
func (r *Reachability) ExpectAllIngress(to NetpolPeer, ok bool, pps ...PortProto) *Reachability {
	return r.Expect(AnyPeer, to, ok, pps...)
}

// ExpectAllEgress sets everything from the pods from matches.
func (r *Reachability) ExpectAllEgress(from NetpolPeer, ok bool, pps ...PortProto) *Reachability {
	return r.Expect(from, AnyPeer, ok, pps...)
}

// ExpectFunc sets every cell f decides (set true) to what it says.
func (r *Reachability) ExpectFunc(f func(from, to *NetpolPod, pp PortProto) (ok, set bool)) *Reachability {
	for c := range r.want {
		if ok, set := f(r.m.Pods[c.From], r.m.Pods[c.To], c.PP); set {
			r.want[c] = ok
		}
	}
	return r
}

// ---- probing ----

// NetpolObservation is a probed matrix: nil for a probe that got its answer,
// else why not.
type NetpolObservation map[NetpolCell]error

// cells is every probe of a matrix: pod to pod (not to itself) and node
// to its own pods, on every port and protocol.
func (m *NetpolModel) cells() []NetpolCell {
	var cs []NetpolCell
	for j := range m.Pods {
		for _, pp := range NetpolPortProtos {
			cs = append(cs, NetpolCell{NetpolNodeRow, j, pp})
		}
		for i := range m.Pods {
			if i != j {
				for _, pp := range NetpolPortProtos {
					cs = append(cs, NetpolCell{i, j, pp})
				}
			}
		}
	}
	return cs
}

// ProbeAll probes the whole matrix, Concurrency probes at a time.
func (m *NetpolModel) ProbeAll(ctx context.Context) NetpolObservation {
	obs, _ := m.probeAll(ctx, nil)
	return obs
}

// probeAll probes the whole matrix, Concurrency probes at a time. When
// stop says that a probe's result makes the pass wrong already, it cuts
// the pass short: the probes still running are cancelled, none is started,
// and it returns complete false with a partial observation.
func (m *NetpolModel) probeAll(ctx context.Context, stop func(NetpolCell, error) bool) (obs NetpolObservation, complete bool) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cells := m.cells()
	obs = make(NetpolObservation, len(cells))
	var mu sync.Mutex
	var wg sync.WaitGroup
	stopped := false
	sem := make(chan struct{}, max(m.Concurrency, 1))
	for _, c := range cells {
		sem <- struct{}{}
		if ctx.Err() != nil {
			break
		}
		wg.Go(func() {
			defer func() { <-sem }()
			err := m.probe(ctx, c)
			mu.Lock()
			defer mu.Unlock()
			if stopped {
				return
			}
			obs[c] = err
			if stop != nil && stop(c, err) {
				stopped = true
				cancel()
			}
		})
	}
	wg.Wait()
	if stopped {
		return obs, false
	}
	denied := 0
	for _, err := range obs {
		if err != nil {
			denied++
		}
	}
	m.mu.Lock()
	m.lastDenied = denied
	m.mu.Unlock()
	return obs, true
}

// LastDenied is how many probes of the last matrix failed.
func (m *NetpolModel) LastDenied() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.lastDenied
}

// probe runs one probe of the matrix.
func (m *NetpolModel) probe(ctx context.Context, c NetpolCell) error {
	to := m.Pods[c.To]
	from := m.NodeNetNS[to.Node]
	if c.From != NetpolNodeRow {
		from = m.Pods[c.From].NetNS
	}
	return ProbeFromNetNS(ctx, from, c.PP, netip.AddrPortFrom(to.IP, uint16(c.PP.Port)), to.Hostname(), m.ProbeTimeout)
}

// ProbeFromNetNS connects from inside the network namespace at nsPath to
// dst over pp's protocol and checks that the answer is want (agnhost
// serve-hostname answers its pod's hostname): over TCP it connects and
// reads the answer until the server closes; over UDP it sends a datagram
// every 200ms until the answer comes. All within timeout, or until ctx is
// cancelled.
func ProbeFromNetNS(ctx context.Context, nsPath string, pp PortProto, dst netip.AddrPort, want string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	network := strings.ToLower(string(pp.Proto))
	conn, err := controlplane.DialInNetNS(ctx, nsPath, network, dst.String())
	if err != nil {
		return err
	}
	defer conn.Close()
	// A cancelled probe ends at once.
	defer context.AfterFunc(ctx, func() { _ = conn.Close() })()
	deadline, _ := ctx.Deadline()
	_ = conn.SetDeadline(deadline)
	if pp.Proto == corev1.ProtocolUDP {
		done := make(chan struct{})
		defer close(done)
		go func() {
			tick := time.NewTicker(200 * time.Millisecond)
			defer tick.Stop()
			for {
				if _, err := conn.Write([]byte("probe\n")); err != nil {
					return
				}
				select {
				case <-done:
					return
				case <-tick.C:
				}
			}
		}()
	}
	buf := make([]byte, 256)
	var got []byte
	for {
		n, err := conn.Read(buf)
		got = append(got, buf[:n]...)
		if pp.Proto == corev1.ProtocolUDP && n > 0 {
			break
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			if len(got) == 0 {
				return err
			}
			break
		}
	}
	if answer := strings.TrimSpace(string(got)); answer != want {
		return fmt.Errorf("answer %q, want %q", answer, want)
	}
	return nil
}

// SCTPSupport says whether this machine's kernel has SCTP: nil when an
// SCTP socket opens, else why not.
func SCTPSupport() error {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, syscall.IPPROTO_SCTP)
	if err != nil {
		return fmt.Errorf("opening an SCTP socket: %w", err)
	}
	_ = syscall.Close(fd)
	return nil
}

// ---- validation and truth tables ----

// Validate probes the matrix until it is as r expects, for up to Settle
// (a change takes tabbyd a moment to program); the matrix is right when a
// pass probed every cell and found each as expected, and the test fails,
// printing the truth tables, when the last pass still differs. It returns
// whether the matrix became right.
//
// A pass that is already wrong (a probe answered that should not have,
// or was refused that should have been answered) is cut short while
// there is time for another: a denied probe takes ProbeTimeout, so
// waiting for the rest of a pass that probed too early, before tabbyd had
// programmed the change, would double a step's time.
func (m *NetpolModel) Validate(t testing.TB, step string, r *Reachability) bool {
	t.Helper()
	return m.ValidateWithin(t, step, r, m.Settle)
}

// ValidateWithin is Validate with its own settle time.
func (m *NetpolModel) ValidateWithin(t testing.TB, step string, r *Reachability, settle time.Duration) bool {
	t.Helper()
	start := time.Now()
	deadline := start.Add(settle)
	wrongCell := func(c NetpolCell, err error) bool {
		want := true
		if c.From != NetpolNodeRow {
			want = r.want[c]
		}
		return (err == nil) != want
	}
	cut := 0
	for pass := 1; ; pass++ {
		var stop func(NetpolCell, error) bool
		if time.Now().Add(2*m.ProbeTimeout + time.Second).Before(deadline) {
			stop = wrongCell
		}
		obs, complete := m.probeAll(context.Background(), stop)
		if !complete {
			cut++
			time.Sleep(200 * time.Millisecond)
			continue
		}
		wrong := m.wrong(r, obs)
		if len(wrong) == 0 {
			t.Logf("%s: matrix right (%d probes) after %d pass(es) (%d cut short), %v", step, len(obs), pass, cut, time.Since(start).Round(time.Millisecond))
			return true
		}
		if time.Now().After(deadline) {
			t.Errorf("%s: %d of %d probes wrong after %d passes over %v:\n%s",
				step, len(wrong), len(obs), pass, time.Since(start).Round(time.Millisecond), m.TruthTables(r, obs))
			return false
		}
		time.Sleep(300 * time.Millisecond)
	}
}

// wrong lists the cells whose observation differs from r (node rows
// must always be allowed).
func (m *NetpolModel) wrong(r *Reachability, obs NetpolObservation) []NetpolCell {
	var out []NetpolCell
	for c, err := range obs {
		want := true
		if c.From != NetpolNodeRow {
			want = r.want[c]
		}
		if (err == nil) != want {
			out = append(out, c)
		}
	}
	slices.SortFunc(out, func(a, b NetpolCell) int {
		if a.PP != b.PP {
			return strings.Compare(a.PP.String(), b.PP.String())
		}
		if a.From != b.From {
			return a.From - b.From
		}
		return a.To - b.To
	})
	return out
}

// TruthTables prints, for every port and protocol with a wrong cell, the
// expected and the observed matrix as upstream does: rows are clients,
// columns servers, '.' allowed, 'X' denied, '*' after a wrong cell, '-'
// a pod to itself; the row "node" is each pod's own node. Then the
// wrong cells with what their probe said.
func (m *NetpolModel) TruthTables(r *Reachability, obs NetpolObservation) string {
	wrong := m.wrong(r, obs)
	bad := map[NetpolCell]bool{}
	bySet := map[PortProto]bool{}
	for _, c := range wrong {
		bad[c] = true
		bySet[c.PP] = true
	}
	var b strings.Builder
	mark := func(ok bool) string {
		if ok {
			return "."
		}
		return "X"
	}
	header := func() {
		fmt.Fprintf(&b, "%-6s", "")
		for _, p := range m.Pods {
			fmt.Fprintf(&b, "%-5s", p)
		}
		b.WriteByte('\n')
	}
	for _, pp := range NetpolPortProtos {
		if !bySet[pp] {
			continue
		}
		fmt.Fprintf(&b, "%s expected:\n", pp)
		header()
		for i, pf := range m.Pods {
			fmt.Fprintf(&b, "%-6s", pf)
			for j := range m.Pods {
				cell := "-"
				if i != j {
					cell = mark(r.want[NetpolCell{i, j, pp}])
				}
				fmt.Fprintf(&b, "%-5s", cell)
			}
			b.WriteByte('\n')
		}
		fmt.Fprintf(&b, "%s observed ('*' wrong):\n", pp)
		header()
		for i := NetpolNodeRow; i < len(m.Pods); i++ {
			name := "node"
			if i != NetpolNodeRow {
				name = m.Pods[i].String()
			}
			fmt.Fprintf(&b, "%-6s", name)
			for j := range m.Pods {
				cell := "-"
				c := NetpolCell{i, j, pp}
				if i != j {
					cell = mark(obs[c] == nil)
					if bad[c] {
						cell += "*"
					}
				}
				fmt.Fprintf(&b, "%-5s", cell)
			}
			b.WriteByte('\n')
		}
	}
	b.WriteString("wrong cells:\n")
	for n, c := range wrong {
		if n == 40 {
			fmt.Fprintf(&b, "  ... and %d more\n", len(wrong)-n)
			break
		}
		from := "node " + m.Pods[c.To].Node
		if c.From != NetpolNodeRow {
			from = m.Pods[c.From].String() + " (" + m.Pods[c.From].Node + ")"
		}
		got := "allowed"
		if err := obs[c]; err != nil {
			got = "denied: " + err.Error()
		}
		fmt.Fprintf(&b, "  %s -> %s (%s) %s: %s\n", from, m.Pods[c.To], m.Pods[c.To].Node, c.PP, got)
	}
	return b.String()
}

// ---- policy builders (the upstream GenNetworkPolicy helpers, shorter) ----

// npOption changes a NetworkPolicy being built.
type npOption func(*networkingv1.NetworkPolicy)

// npPolicy is a NetworkPolicy named name selecting the pods whose labels
// match podLabels (all pods for none).
func npPolicy(name string, podLabels map[string]string, opts ...npOption) *networkingv1.NetworkPolicy {
	np := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: podLabels}},
	}
	for _, o := range opts {
		o(np)
	}
	return np
}

// npIngress adds policyType Ingress and these rules (none: deny all
// ingress), as upstream's SetSpecIngressRules.
func npIngress(rules ...networkingv1.NetworkPolicyIngressRule) npOption {
	return func(np *networkingv1.NetworkPolicy) {
		np.Spec.PolicyTypes = append(np.Spec.PolicyTypes, networkingv1.PolicyTypeIngress)
		np.Spec.Ingress = append([]networkingv1.NetworkPolicyIngressRule{}, rules...)
	}
}

// npEgress adds policyType Egress and these rules (none: deny all
// egress), as upstream's SetSpecEgressRules.
func npEgress(rules ...networkingv1.NetworkPolicyEgressRule) npOption {
	return func(np *networkingv1.NetworkPolicy) {
		np.Spec.PolicyTypes = append(np.Spec.PolicyTypes, networkingv1.PolicyTypeEgress)
		np.Spec.Egress = append([]networkingv1.NetworkPolicyEgressRule{}, rules...)
	}
}

// npFrom is an ingress rule from peers on ports (any for none).
func npFrom(peers []networkingv1.NetworkPolicyPeer, ports ...networkingv1.NetworkPolicyPort) networkingv1.NetworkPolicyIngressRule {
	return networkingv1.NetworkPolicyIngressRule{From: peers, Ports: ports}
}

// npTo is an egress rule to peers on ports (any for none).
func npTo(peers []networkingv1.NetworkPolicyPeer, ports ...networkingv1.NetworkPolicyPort) networkingv1.NetworkPolicyEgressRule {
	return networkingv1.NetworkPolicyEgressRule{To: peers, Ports: ports}
}

// npPeers lists peers.
func npPeers(p ...networkingv1.NetworkPolicyPeer) []networkingv1.NetworkPolicyPeer { return p }

// npLabels is a label selector matching these labels (all for none).
func npLabels(kv ...string) *metav1.LabelSelector {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return &metav1.LabelSelector{MatchLabels: m}
}

// npExpr is a label selector with one expression.
func npExpr(key string, op metav1.LabelSelectorOperator, values ...string) *metav1.LabelSelector {
	return &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: key, Operator: op, Values: values}}}
}

// npPodSel, npNsSel and npPodNsSel are peers by pod selector, by namespace
// selector, and by both (AND).
func npPodSel(s *metav1.LabelSelector) networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{PodSelector: s}
}
func npNsSel(s *metav1.LabelSelector) networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{NamespaceSelector: s}
}
func npPodNsSel(pod, ns *metav1.LabelSelector) networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{PodSelector: pod, NamespaceSelector: ns}
}

// npIPBlock is an ipBlock peer.
func npIPBlock(cidr string, except ...string) networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: cidr, Except: except}}
}

// npPort is a numeric port; proto "" leaves the protocol unset (TCP).
func npPort(port int, proto corev1.Protocol) networkingv1.NetworkPolicyPort {
	p := networkingv1.NetworkPolicyPort{Port: ptr.To(intstr.FromInt32(int32(port)))}
	if proto != "" {
		p.Protocol = ptr.To(proto)
	}
	return p
}

// npNamedPort is a named port; proto "" leaves the protocol unset (TCP).
func npNamedPort(name string, proto corev1.Protocol) networkingv1.NetworkPolicyPort {
	p := networkingv1.NetworkPolicyPort{Port: ptr.To(intstr.FromString(name))}
	if proto != "" {
		p.Protocol = ptr.To(proto)
	}
	return p
}

// npPortRange is port..end.
func npPortRange(port, end int, proto corev1.Protocol) networkingv1.NetworkPolicyPort {
	p := npPort(port, proto)
	p.EndPort = ptr.To(int32(end))
	return p
}

// npProtoOnly is every port of a protocol.
func npProtoOnly(proto corev1.Protocol) networkingv1.NetworkPolicyPort {
	return networkingv1.NetworkPolicyPort{Protocol: ptr.To(proto)}
}

// npHostCIDR is the /32 (or /128) of a pod's address.
func npHostCIDR(p *NetpolPod) string { return netip.PrefixFrom(p.IP, p.IP.BitLen()).String() }
