package lab

import (
	"bytes"
	"context"
	"embed"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"

	"github.com/tabbynet/tabby/deploy"
)

// What runs in every lab next to tabby, as on a cluster kubeadm made:
// kube-proxy (a DaemonSet) and CoreDNS (a Deployment behind the kube-dns
// Service). tabby itself is installed from the repository's deploy/, as
// users install it.

//go:embed manifests/*.yaml
var manifests embed.FS

// Images of the cluster's add-ons (built by the lab, see images.go).
const (
	KubeProxyImage = "registry.k8s.io/kube-proxy:v1.35.4"
	CoreDNSImage   = "registry.k8s.io/coredns/coredns:v1.15.0"
)

// addonValues fill the add-ons' manifests: each {{.Name}} in them is the
// value of that name.
type addonValues map[string]string

// placeholder is a manifest's {{.Name}}.
var placeholder = regexp.MustCompile(`\{\{ *\.([A-Za-z][A-Za-z0-9]*) *\}\}`)

// renderAddon fills manifests/name with v. A placeholder v lacks, or
// anything else between {{ and }}, is an error. (Not text/template: it
// executes templates through reflection by method name, and linking it
// into tabbyctl kept every exported method of every type in the binary,
// 20 MB of its 54; see internal/buildinfo's TestDeadcode.)
func renderAddon(name string, v addonValues) ([]byte, error) {
	data, err := manifests.ReadFile("manifests/" + name)
	if err != nil {
		return nil, err
	}
	return fill(name, data, v)
}

// fill is renderAddon on data.
func fill(name string, data []byte, v addonValues) ([]byte, error) {
	// Placeholders hold no newline: the lines of data and of rest match.
	rest := placeholder.ReplaceAll(data, nil)
	if i := bytes.Index(rest, []byte("{{")); i >= 0 {
		return nil, fmt.Errorf("rendering %s: line %d has a {{ that is not a {{.Name}} placeholder", name, 1+bytes.Count(rest[:i], []byte("\n")))
	}
	var missing []string
	out := placeholder.ReplaceAllFunc(data, func(m []byte) []byte {
		key := string(placeholder.FindSubmatch(m)[1])
		val, ok := v[key]
		if !ok {
			missing = append(missing, key)
		}
		return []byte(val)
	})
	if len(missing) > 0 {
		return nil, fmt.Errorf("rendering %s: no value for %s", name, strings.Join(missing, ", "))
	}
	return out, nil
}

// kubectl runs the control plane's kubectl with the lab's admin kubeconfig
// (through the host's forward), stdin as given.
func (s *State) kubectl(ctx context.Context, stdin []byte, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(s.Binaries.ControlPlaneDir, "kubectl"), append([]string{"--kubeconfig", s.Kubeconfig}, args...)...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// apply runs kubectl apply --server-side -f - on manifest (as the README
// installs tabby), keeping a copy of it in the lab's folder.
func (s *State) apply(ctx context.Context, name string, manifest []byte) error {
	dir := filepath.Join(s.Dir, "manifests")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, name), manifest, 0o644); err != nil {
		return err
	}
	_, err := s.kubectl(ctx, manifest, "apply", "--server-side", "-f", "-")
	return err
}

// installAddons applies kube-proxy and CoreDNS.
func installAddons(ctx context.Context, s *State) error {
	v := addonValues{
		"APIServer":     s.ControlPlane.Server,
		"ClusterCIDR":   s.PodCIDR,
		"ClusterDomain": ClusterDomain,
		"ClusterDNS":    ClusterDNS,
		// A Service is single-stack unless it asks for more.
		"IPFamilyPolicy": string(corev1.IPFamilyPolicySingleStack),
	}
	if v["ClusterCIDR"] == "" {
		v["ClusterCIDR"] = DefaultPodCIDR
	}
	if s.DualStack {
		// kube-proxy runs both families when the node has both
		// addresses; clusterCIDR tells it the pods' range in each.
		v["ClusterCIDR"] += "," + s.IPv6PodCIDR
		// An IPv6 address for kube-dns next to the kubelets' clusterDNS.
		v["IPFamilyPolicy"] = string(corev1.IPFamilyPolicyPreferDualStack)
	}
	for _, a := range []struct{ file, image string }{
		{"kube-proxy.yaml", KubeProxyImage},
		{"coredns.yaml", CoreDNSImage},
	} {
		v["Image"] = a.image
		m, err := renderAddon(a.file, v)
		if err != nil {
			return err
		}
		if err := s.apply(ctx, a.file, m); err != nil {
			return err
		}
	}
	return nil
}

// installTabby renders the repository's deploy/tabby.yaml with the lab's
// image and pod CIDRs (deploy/gen's options) and applies it, as users do.
// tabbydArgs are added to the tabbyd container's (tests shorten the IPAM
// collector's grace so).
func installTabby(ctx context.Context, s *State, image string, tabbydArgs []string) error {
	// IPv6PodCIDR is "" unless dual-stack: no default IPv6 pool.
	m, err := deploy.Render(filepath.Join(s.Binaries.RepoRoot, "deploy"), deploy.RenderOptions{Image: image, PodCIDR: s.PodCIDR, PodCIDRv6: s.IPv6PodCIDR})
	if err != nil {
		return fmt.Errorf("rendering deploy/tabby.yaml: %w", err)
	}
	args := map[string][]string{"tabbyd": slices.Clone(tabbydArgs)}
	switch {
	case s.PodCIDR == "":
		// No default pool: a later flag wins.
		args["tabbyd"] = append(args["tabbyd"], "--default-ipv4-pool-cidr=")
	case s.Subnets > 1:
		// Nodes on other subnets cannot route pods natively.
		args["tabbyd"] = append(args["tabbyd"], "--default-ipv4-pool-encapsulation=VXLANCrossSubnet")
	}
	if s.DualStack {
		// The CNI config asks for both families (the first tabbyd makes
		// the IPv6 pool from the rendered DEFAULT_IPV6_POOL_CIDR, as
		// calico-node does from CALICO_IPV6POOL_CIDR).
		args["install-cni"] = []string{"--assign-ipv6"}
	}
	if len(args["tabbyd"])+len(args["install-cni"]) > 0 {
		if m, err = withContainerArgs(m, args); err != nil {
			return err
		}
	}
	return s.apply(ctx, "tabby.yaml", m)
}

// withContainerArgs adds args[name] to the args of the container (or init
// container) name of the DaemonSet in a rendered tabby.yaml.
func withContainerArgs(m []byte, args map[string][]string) ([]byte, error) {
	objs, err := deploy.Objects(m)
	if err != nil {
		return nil, err
	}
	var out bytes.Buffer
	for _, o := range objs {
		if o.GetKind() == "DaemonSet" {
			if err := addContainerArgs(o, args); err != nil {
				return nil, err
			}
		}
		data, err := o.MarshalJSON()
		if err != nil {
			return nil, err
		}
		out.WriteString("---\n")
		out.Write(data)
		out.WriteString("\n")
	}
	return out.Bytes(), nil
}

// addContainerArgs adds args[name] to the args of the containers and init
// containers named name in the DaemonSet ds.
func addContainerArgs(ds *unstructured.Unstructured, args map[string][]string) error {
	found := map[string]bool{}
	for _, field := range []string{"initContainers", "containers"} {
		containers, _, _ := unstructured.NestedSlice(ds.Object, "spec", "template", "spec", field)
		if containers == nil {
			continue
		}
		for _, c := range containers {
			cm, ok := c.(map[string]any)
			name, _ := cm["name"].(string)
			if !ok || args[name] == nil {
				continue
			}
			have, _ := cm["args"].([]any)
			for _, a := range args[name] {
				have = append(have, a)
			}
			cm["args"], found[name] = have, true
		}
		if err := unstructured.SetNestedSlice(ds.Object, containers, "spec", "template", "spec", field); err != nil {
			return err
		}
	}
	for name, a := range args {
		if len(a) > 0 && !found[name] {
			return fmt.Errorf("deploy/tabby.yaml's DaemonSet has no container named %s", name)
		}
	}
	return nil
}

// waitDaemonSet waits until the DaemonSet runs an up-to-date, ready pod on
// each of nodes nodes.
func waitDaemonSet(ctx context.Context, cs kubernetes.Interface, namespace, name string, nodes int) error {
	return poll(ctx, 200*time.Millisecond, func() error {
		ds, err := cs.AppsV1().DaemonSets(namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		st := ds.Status
		if ds.Generation != st.ObservedGeneration || int(st.DesiredNumberScheduled) != nodes ||
			st.UpdatedNumberScheduled != st.DesiredNumberScheduled || st.NumberReady != st.DesiredNumberScheduled ||
			st.NumberUnavailable != 0 {
			return fmt.Errorf("DaemonSet %s/%s: %d of %d pods ready (%d up to date)%s", namespace, name, st.NumberReady, nodes,
				st.UpdatedNumberScheduled, podTroubles(ctx, cs, namespace, ds.Spec.Selector.MatchLabels))
		}
		return nil
	})
}

// waitDeployment waits until the Deployment's replicas are all ready.
func waitDeployment(ctx context.Context, cs kubernetes.Interface, namespace, name string) error {
	return poll(ctx, 200*time.Millisecond, func() error {
		d, err := cs.AppsV1().Deployments(namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if !deploymentReady(d) {
			return fmt.Errorf("Deployment %s/%s: %d of %d replicas ready%s", namespace, name, d.Status.ReadyReplicas,
				ptrOr(d.Spec.Replicas, 1), podTroubles(ctx, cs, namespace, d.Spec.Selector.MatchLabels))
		}
		return nil
	})
}

func deploymentReady(d *appsv1.Deployment) bool {
	want := ptrOr(d.Spec.Replicas, 1)
	return d.Generation == d.Status.ObservedGeneration && d.Status.UpdatedReplicas == want &&
		d.Status.ReadyReplicas == want && d.Status.Replicas == want
}

func ptrOr(p *int32, def int32) int32 {
	if p == nil {
		return def
	}
	return *p
}

// podTroubles says why the pods matching sel are not ready: waiting
// reasons and messages, for the error a timed-out wait returns.
func podTroubles(ctx context.Context, cs kubernetes.Interface, namespace string, sel map[string]string) string {
	pods, err := cs.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: labels.SelectorFromSet(sel).String()})
	if err != nil {
		return ""
	}
	var why []string
	for _, p := range pods.Items {
		for _, c := range append(append([]corev1.ContainerStatus{}, p.Status.InitContainerStatuses...), p.Status.ContainerStatuses...) {
			switch {
			case c.State.Waiting != nil && c.State.Waiting.Reason != "" && c.State.Waiting.Reason != "PodInitializing":
				why = append(why, fmt.Sprintf("%s on %s: %s %s: %s", p.Name, p.Spec.NodeName, c.Name, c.State.Waiting.Reason, c.State.Waiting.Message))
			case c.LastTerminationState.Terminated != nil && !c.Ready:
				t := c.LastTerminationState.Terminated
				why = append(why, fmt.Sprintf("%s on %s: %s last exited %d (%s) %s", p.Name, p.Spec.NodeName, c.Name, t.ExitCode, t.Reason, strings.TrimSpace(t.Message)))
			}
		}
		if p.Spec.NodeName == "" {
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodScheduled && c.Status != corev1.ConditionTrue {
					why = append(why, fmt.Sprintf("%s: not scheduled: %s", p.Name, c.Message))
				}
			}
		}
	}
	if len(why) == 0 {
		return ""
	}
	return "; " + strings.Join(why, "; ")
}

// restartTabbyd deletes node n's tabby-node pod (with grace as its grace
// period) and waits until the DaemonSet's new pod there is ready, or ctx
// ends (without a deadline, it waits at most three minutes past grace).
func restartTabbyd(ctx context.Context, s *State, n *Node, grace time.Duration) error {
	cs, err := s.Clientset()
	if err != nil {
		return err
	}
	old, err := tabbyNodePod(ctx, cs, n.Name)
	if err != nil {
		return err
	}
	secs := int64(grace.Seconds())
	err = cs.CoreV1().Pods(tabbyNamespace).Delete(ctx, old.Name, metav1.DeleteOptions{GracePeriodSeconds: &secs})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting %s/%s: %w", tabbyNamespace, old.Name, err)
	}
	wctx, cancel := ctx, context.CancelFunc(func() {})
	if _, ok := ctx.Deadline(); !ok {
		wctx, cancel = context.WithTimeout(ctx, 3*time.Minute+grace)
	}
	defer cancel()
	return poll(wctx, 200*time.Millisecond, func() error {
		p, err := tabbyNodePod(wctx, cs, n.Name)
		if err != nil {
			return err
		}
		if p.UID == old.UID || !podReady(p) {
			return fmt.Errorf("no new ready tabby-node pod on %s yet", n.Name)
		}
		return nil
	})
}

// TabbyNodeLabel selects the tabby-node DaemonSet's pods.
const TabbyNodeLabel = "app.kubernetes.io/name=tabby-node"

// tabbyNodePod is the tabby-node pod on node (not one being deleted).
func tabbyNodePod(ctx context.Context, cs kubernetes.Interface, node string) (*corev1.Pod, error) {
	pods, err := cs.CoreV1().Pods(tabbyNamespace).List(ctx, metav1.ListOptions{
		LabelSelector: TabbyNodeLabel, FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		return nil, err
	}
	for i := range pods.Items {
		if pods.Items[i].DeletionTimestamp == nil {
			return &pods.Items[i], nil
		}
	}
	return nil, fmt.Errorf("no tabby-node pod on %s", node)
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
