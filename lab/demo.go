package lab

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/tabbynet/tabby/internal/controlplane"
)

// DemoPort is where the demo's pods serve (TCP and UDP).
const DemoPort = 8080

// DemoOptions configure Demo.
type DemoOptions struct {
	// PodsPerNode is how many web pods (agnhost serve-hostname) each
	// node runs (default 2).
	PodsPerNode int
	// Timeout bounds the wait for the pods (default 1 minute).
	Timeout time.Duration
	// Out receives the report.
	Out io.Writer
}

// DemoProbe is one probe of the demo's matrix.
type DemoProbe struct {
	From, To string
	// TCP: a connection to the target's server answered with its name;
	// ICMP: one ping answered.
	TCP, ICMP     bool
	TCPErr, Error string
}

// OK says both probes passed.
func (p DemoProbe) OK() bool { return p.TCP && p.ICMP }

// Demo runs the lab's main job on a lab that is up: web pods on every
// node (created, or kept from an earlier run), their addresses and nodes,
// how kube-scheduler placed them through tabby-scheduler-extender (with
// one more pod placed by a pod-affinity rule only the extender decides), a
// connectivity matrix of real probes from every pod to every pod (a TCP
// connection answered by the server and a ping, both sent from inside the
// source pod), then the same matrix under a NetworkPolicy that lets only
// the first pod reach the last one (on TCP), deleted again afterwards, each
// node's BGP peers, and how to use the lab. It returns an error when a
// probe did not go as expected.
func Demo(ctx context.Context, s *State, o DemoOptions) (err error) {
	var pods []*corev1.Pod
	defer func() { demoUsage(o.Out, s, pods) }()
	o.defaults()
	cs, err := s.Clientset()
	if err != nil {
		return err
	}
	names, err := createDemoPods(ctx, cs, s, o.PodsPerNode)
	if err != nil {
		return err
	}
	fmt.Fprintf(o.Out, "\nPods: %d web servers (%s serve-hostname, TCP and UDP %d) spread over %d nodes, placed by kube-scheduler with %s and wired by the tabby CNI plugin\n",
		len(names), AgnhostImage, DemoPort, len(s.Nodes), ExtenderName)
	pods, err = waitDemoPods(ctx, cs, names, o.Timeout)
	if err != nil {
		return err
	}
	nsPaths, err := printDemoPods(ctx, o.Out, s, pods)
	if err != nil {
		return err
	}
	placementErr := demoPlacement(ctx, cs, s, o, pods)

	probes := demoMatrix(ctx, pods, nsPaths)
	failed := printConnectivity(o.Out, pods, probes)

	serviceErr := demoService(ctx, cs, s, o, pods)

	var policyErr error
	if failed == 0 {
		policyErr = demoPolicy(ctx, cs, o, pods, nsPaths)
	} else {
		fmt.Fprintf(o.Out, "\n(no NetworkPolicy demonstration: the pods do not all reach each other without one)\n")
	}

	printDemoBGP(ctx, o.Out, s)
	var errs []error
	if failed > 0 {
		errs = append(errs, fmt.Errorf("%d of %d probes failed: see tabbyctl lab status and the logs in %s", failed, len(probes), s.Dir))
	}
	errs = append(errs, placementErr, serviceErr, policyErr)
	return errors.Join(errs...)
}

func (o *DemoOptions) defaults() {
	if o.PodsPerNode <= 0 {
		o.PodsPerNode = 2
	}
	if o.Timeout <= 0 {
		o.Timeout = time.Minute
	}
}

// createDemoPods creates perNode web pods on every node (or labels the
// ones an earlier run left) and returns their names.
func createDemoPods(ctx context.Context, cs kubernetes.Interface, s *State, perNode int) ([]string, error) {
	var names []string
	for i := range s.Nodes {
		for j := range perNode {
			name := fmt.Sprintf("web%d-%c", i+1, 'a'+j)
			names = append(names, name)
			if err := createDemoPod(ctx, cs, s, name, s.Nodes[i].Name); err != nil {
				return nil, err
			}
		}
	}
	return names, nil
}

// printDemoPods prints the pods' nodes, addresses and containers, and
// returns the paths of their network namespaces.
func printDemoPods(ctx context.Context, w io.Writer, s *State, pods []*corev1.Pod) ([]string, error) {
	nsPaths := make([]string, len(pods))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "POD\tNODE\tIP\tCONTAINER")
	for i, p := range pods {
		var err error
		if nsPaths[i], err = PodNetNS(ctx, s, p.Namespace+"/"+p.Name); err != nil {
			return nil, err
		}
		cid := ""
		if len(p.Status.ContainerStatuses) > 0 {
			cid = p.Status.ContainerStatuses[0].ContainerID
			if len(cid) > 25 {
				cid = cid[:25]
			}
		}
		fmt.Fprintf(tw, "default/%s\t%s\t%s\t%s\n", p.Name, p.Spec.NodeName, p.Status.PodIP, cid)
	}
	_ = tw.Flush()
	return nsPaths, nil
}

// printConnectivity prints the matrix of probes and the failed ones, and
// returns how many failed.
func printConnectivity(w io.Writer, pods []*corev1.Pod, probes []DemoProbe) (failed int) {
	fmt.Fprintf(w, "\nConnectivity, from each pod (rows) to each pod (columns): ok = TCP to its server and ping both answered\n")
	printMatrix(w, pods, func(i, j int) string {
		pr := probes[i*len(pods)+j]
		switch {
		case pr.OK():
			return "ok"
		case pr.TCP:
			return "NO PING"
		case pr.ICMP:
			return "NO TCP"
		}
		return "FAIL"
	})
	var failures []string
	for _, pr := range probes {
		if !pr.OK() {
			failed++
			failures = append(failures, fmt.Sprintf("%s -> %s: %s %s", pr.From, pr.To, pr.TCPErr, pr.Error))
		}
	}
	fmt.Fprintf(w, "%d of %d pod pairs reached each other (%d on the same node, %d across nodes)\n",
		len(probes)-failed, len(probes), sameNodePairs(pods), len(probes)-sameNodePairs(pods))
	for _, f := range failures {
		fmt.Fprintf(w, "  %s\n", f)
	}
	return failed
}

// printDemoBGP prints each node's routes and BGP peers.
func printDemoBGP(ctx context.Context, w io.Writer, s *State) {
	fmt.Fprintf(w, "\nBGP peers of each node (tabbyctl node status, inside the node)\n")
	for i := range s.Nodes {
		n := &s.Nodes[i]
		bs, err := NodeBGP(ctx, n)
		if err != nil {
			fmt.Fprintf(w, "%s: %v\n", n.Name, err)
			continue
		}
		rt := bs.Routes
		fmt.Fprintf(w, "%s (%s, AS %d): %d routes programmed (%d learned over BGP, %d blackhole for its own block)\n",
			n.Name, n.Address, bs.AS, rt.Programmed, rt.Learned, rt.Blackholes)
		bs.PrintPeers(w, "  ")
	}
}

// printMatrix writes a matrix of pods (rows: from, columns: to) whose
// cells cell gives.
func printMatrix(w io.Writer, pods []*corev1.Pod, cell func(from, to int) string) {
	tw := tabwriter.NewWriter(w, 0, 0, 1, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "FROM \\ TO\t")
	for _, p := range pods {
		fmt.Fprintf(tw, "%s\t", p.Name)
	}
	fmt.Fprintln(tw)
	for i, from := range pods {
		fmt.Fprintf(tw, "%s (%s)\t", from.Name, from.Spec.NodeName)
		for j := range pods {
			fmt.Fprintf(tw, "%s\t", cell(i, j))
		}
		fmt.Fprintln(tw)
	}
	_ = tw.Flush()
}

func sameNodePairs(pods []*corev1.Pod) int {
	n := 0
	for _, a := range pods {
		for _, b := range pods {
			if a.Spec.NodeName == b.Spec.NodeName {
				n++
			}
		}
	}
	return n
}

// Labels of the demo's pods: every one has app=lab-demo and pod=<its name>
// (what the demo's NetworkPolicy selects).
const (
	demoAppLabel = "app"
	demoApp      = "lab-demo"
	demoPodLabel = "pod"
)

func demoLabels(name string) map[string]string {
	return map[string]string{demoAppLabel: demoApp, demoPodLabel: name}
}

// WebPod is a pod of agnhost serve-hostname: every TCP connection to port
// and every UDP datagram is answered with its hostname (its name), as
// Kubernetes' e2e tests use it; Ready once its TCP port answers.
//
// It requests a tenth of a CPU, as tabbyd does. A BestEffort pod's cgroup
// has 2 CPU shares beside the hundreds of the node's Burstable pods, so
// whenever they are busy it waits: while a node's tabbyd restarted on a
// loaded machine, a BestEffort server left a probe's connection unanswered
// for over a second, though every ping on the same path was answered.
func WebPod(namespace, name string, port int32) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{
				Name: "web", Image: AgnhostImage,
				Args:  []string{"serve-hostname", "--tcp", "--udp", "--http=false", "--port", strconv.Itoa(int(port))},
				Ports: []corev1.ContainerPort{{Name: "web", ContainerPort: port}, {Name: "web-udp", ContainerPort: port, Protocol: corev1.ProtocolUDP}},
				ReadinessProbe: &corev1.Probe{
					ProbeHandler:  corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(port)}},
					PeriodSeconds: 1,
				},
				Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{
					corev1.ResourceCPU: resource.MustParse("100m"),
				}},
			}},
			TerminationGracePeriodSeconds: ptr.To[int64](5),
		},
	}
}

// createDemoPod creates a web pod on node (by its hostname label: the
// scheduler places it), unless it exists; one kept from an earlier demo
// gets the labels it lacks.
func createDemoPod(ctx context.Context, cs kubernetes.Interface, s *State, name, node string) error {
	p := WebPod(metav1.NamespaceDefault, name, DemoPort)
	p.Labels = demoLabels(name)
	p.Spec.NodeSelector = map[string]string{corev1.LabelHostname: node}
	return createOrLabel(ctx, cs, p)
}

// createOrLabel creates the pod, or, when it exists, adds its labels.
func createOrLabel(ctx context.Context, cs kubernetes.Interface, p *corev1.Pod) error {
	_, err := cs.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": p.Labels}})
		_, err = cs.CoreV1().Pods(p.Namespace).Patch(ctx, p.Name, types.MergePatchType, patch, metav1.PatchOptions{})
	}
	if err != nil {
		return fmt.Errorf("creating pod %s: %w", p.Name, err)
	}
	return nil
}

// waitDemoPods waits until the pods are Ready with an address and returns
// them in the order of names.
func waitDemoPods(ctx context.Context, cs kubernetes.Interface, names []string, d time.Duration) ([]*corev1.Pod, error) {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	out := make([]*corev1.Pod, len(names))
	for i, name := range names {
		err := poll(ctx, 200*time.Millisecond, func() error {
			p, err := cs.CoreV1().Pods(metav1.NamespaceDefault).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			ready := false
			for _, c := range p.Status.Conditions {
				ready = ready || (c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue)
			}
			if !ready || p.Status.PodIP == "" {
				return fmt.Errorf("pod %s is %s, not Ready yet", name, p.Status.Phase)
			}
			out[i] = p
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("waiting for the demo's pods: %w (see tabbyctl lab status)", err)
		}
	}
	return out, nil
}

// demoMatrix probes from every pod to every pod, a few at a time.
func demoMatrix(ctx context.Context, pods []*corev1.Pod, nsPaths []string) []DemoProbe {
	out := make([]DemoProbe, len(pods)*len(pods))
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	for i, from := range pods {
		for j, to := range pods {
			wg.Go(func() {
				sem <- struct{}{}
				defer func() { <-sem }()
				out[i*len(pods)+j] = probePods(ctx, from, to, nsPaths[i])
			})
		}
	}
	wg.Wait()
	return out
}

// probePods connects from inside pod from (its network namespace nsPath)
// to the server of pod to, and pings it.
func probePods(ctx context.Context, from, to *corev1.Pod, nsPath string) DemoProbe {
	pr := DemoProbe{From: from.Name, To: to.Name}
	addr := to.Status.PodIP + ":" + strconv.Itoa(DemoPort)
	var answer string
	err := controlplane.InNetNS(nsPath, func() error {
		var err error
		answer, err = Probe(ctx, "tcp", addr, 2*time.Second)
		return err
	})
	if err == nil && answer != to.Name {
		err = fmt.Errorf("%s answered %q", addr, answer)
	}
	pr.TCP = err == nil
	if err != nil {
		pr.TCPErr = "tcp: " + err.Error()
	}
	ping := exec.CommandContext(ctx, "nsenter", "--net="+nsPath, "ping", "-c", "1", "-W", "2", to.Status.PodIP)
	out, err := ping.CombinedOutput()
	pr.ICMP = err == nil
	if err != nil {
		pr.Error = "ping: " + strings.TrimSpace(lastLine(string(out)))
		if pr.Error == "ping: " {
			pr.Error += err.Error()
		}
	}
	return pr
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// demoUsage says how to use a lab the demo left up; pods are the demo's
// (nil when they did not come up).
func demoUsage(w io.Writer, s *State, pods []*corev1.Pod) {
	tabbyctl := s.Binaries.Tabbyctl
	kubectl := filepath.Join(s.Binaries.ControlPlaneDir, "kubectl")
	labCmd := tabbyctl + " lab"
	if s.Dir != DefaultDir {
		labCmd += " --dir " + s.Dir
	}
	from, target := "default/web1-a", "10.244.0.1"
	if len(pods) > 1 {
		from, target = "default/"+pods[0].Name, pods[len(pods)-1].Status.PodIP
	}
	node := s.Nodes[0]
	lines := []string{
		"# the cluster, as kubectl sees it",
		"export KUBECONFIG=" + s.Kubeconfig,
		kubectl + " get nodes,pods -o wide",
		kubectl + " get ippools,ipamblocks,bgppeers",
		"# nodes, processes, BGP peers and pods",
		labCmd + " status",
		"# run a command in a pod's container, or a host program in its network namespace",
		kubectl + " exec " + strings.TrimPrefix(from, "default/") + " -- nc -w 2 " + demoServiceName + " 80",
		labCmd + " exec " + from + " -- ping -c 3 " + target,
		"# import an image (docker save, ctr export) into every node: nodes cannot pull",
		labCmd + " load my-image.tar",
		"# a node's BGP peers, as its tabbyd sees them",
		"ip netns exec " + node.NetNS + " " + tabbyctl + " node status",
		"# the demo's pods; kubectl apply a NetworkPolicy and every node's tabbyd enforces it",
		kubectl + " get pods,networkpolicies -o wide -l " + demoAppLabel + "=" + demoApp,
		"# what kube-scheduler asked tabby-scheduler-extender",
		"ip netns exec " + s.ControlPlane.NetNS + " curl -s " + s.ControlPlane.Extender + "/metrics | grep ^tabby_scheduler_extender_requests_total",
		"# make " + node.Name + " a route reflector (the others then peer only with it)",
		kubectl + " label node " + node.Name + " tabby.io/route-reflector=true",
		"# restart a tabbyd: pod traffic does not notice",
		labCmd + " restart " + node.Name + " tabbyd",
		"# remove everything",
		labCmd + " down",
	}
	fmt.Fprintf(w, "\nThe lab stays up. Try:\n")
	for _, l := range lines {
		fmt.Fprintf(w, "  %s\n", l)
	}
}

// demoServiceName names the demo's Service, in front of its last pod.
const demoServiceName = "lab-demo"

// demoService puts a ClusterIP Service in front of the last pod and asks
// it, by name, from inside the first pod's container (kubectl exec: the
// API server, the kubelet, the pod's resolv.conf, CoreDNS, kube-proxy's
// rules, tabby's routes to the other node).
func demoService(ctx context.Context, cs kubernetes.Interface, s *State, o DemoOptions, pods []*corev1.Pod) error {
	from, to := pods[0], pods[len(pods)-1]
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: demoServiceName, Namespace: metav1.NamespaceDefault, Labels: map[string]string{demoAppLabel: demoApp}},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{demoPodLabel: to.Name},
			Ports:    []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(DemoPort)}},
		},
	}
	if _, err := cs.CoreV1().Services(svc.Namespace).Create(ctx, svc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating Service %s: %w", demoServiceName, err)
	}
	got, err := cs.CoreV1().Services(svc.Namespace).Get(ctx, demoServiceName, metav1.GetOptions{})
	if err != nil {
		return err
	}
	name := demoServiceName + "." + svc.Namespace + ".svc." + ClusterDomain
	wctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	var answer string
	err = poll(wctx, 500*time.Millisecond, func() error {
		out, err := s.kubectl(wctx, nil, "exec", "-n", from.Namespace, from.Name, "--", "nc", "-w", "2", name, "80")
		if err != nil {
			return err
		}
		if answer = strings.TrimSpace(out); answer != to.Name {
			return fmt.Errorf("%s answered %q", name, answer)
		}
		return nil
	})
	if err != nil {
		fmt.Fprintf(o.Out, "\nService default/%s (ClusterIP %s): NOT reached by name from %s: %v\n", demoServiceName, got.Spec.ClusterIP, from.Name, err)
		return fmt.Errorf("reaching Service %s by name: %w", demoServiceName, err)
	}
	fmt.Fprintf(o.Out, "\nService default/%s (ClusterIP %s) by name from %s (%s): %s answered %s (%s), through CoreDNS and kube-proxy\n",
		demoServiceName, got.Spec.ClusterIP, from.Name, from.Spec.NodeName, name, answer, to.Spec.NodeName)
	return nil
}
