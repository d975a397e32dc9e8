package deploy

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	tabbyv1 "github.com/tabbynet/tabby/api/v1"
	"github.com/tabbynet/tabby/daemon/cnitoken"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/installcni"
	"github.com/tabbynet/tabby/internal/controlplane"
	"github.com/tabbynet/tabby/internal/controlplane/clustertest"
	"github.com/tabbynet/tabby/ipam"
)

// forceConflicts lets kubectl's server-side apply take over the fields
// that clustertest's installer set on the shared control plane (it creates
// the policies with a plain create, so the server's defaults inside the
// atomic spec.matchConstraints belong to it). A cluster where only kubectl
// applied tabby.yaml has no such conflict: TestFreshClusterInstall applies
// it twice without this flag.
const forceConflicts = "--force-conflicts"

const (
	manifest  = "tabby.yaml"
	namespace = "tabby-system"
	cniUser   = "system:serviceaccount:tabby-system:tabby-cni"
	nodeUser  = "system:serviceaccount:tabby-system:tabby-node"
)

// readmeInstall are the commands of the README's "Install on a cluster"
// (run from deploy/ here): one apply. tabby.yaml holds no custom resource
// (kubectl maps every object of a file to a resource before it applies
// any, so a custom resource in the same file as its CRD fails with "no
// matches for kind" on a fresh cluster); tabbyd creates the default
// IPPool. TestFreshClusterInstall applies tabby.yaml a second time, as an
// upgrade would.
var readmeInstall = [][]string{
	{"apply", "--server-side", "-f", manifest},
}

// adminKC is an admin kubeconfig of the shared control plane, written by
// TestMain's setup when the first test asks for the control plane.
var adminKC string

// adminKubeconfig starts the shared control plane if need be and returns
// its admin kubeconfig.
func adminKubeconfig(t *testing.T) string {
	t.Helper()
	clustertest.Cluster(t)
	return adminKC
}

func TestMain(m *testing.M) {
	clustertest.Main(m, func(c *controlplane.Cluster) error {
		if _, err := os.Stat(filepath.Join(c.BinDir, "kubectl")); err != nil {
			return fmt.Errorf("kubectl is not among the control-plane binaries: %w", err)
		}
		adminKC = filepath.Join(c.Dir, "deploy-admin.kubeconfig")
		return c.WriteKubeconfig(adminKC, "")
	})
}

// kubectl runs the control plane's kubectl with a kubeconfig; stdout and
// stderr are returned apart (kubectl warns on stderr).
func kubectl(t *testing.T, kubeconfig string, stdin []byte, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	cmd := exec.Command(filepath.Join(clustertest.Cluster(t).BinDir, "kubectl"),
		append([]string{"--kubeconfig", kubeconfig, "--request-timeout", "60s"}, args...)...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	err = cmd.Run()
	return o.String(), e.String(), err
}

func mustKubectl(t *testing.T, kubeconfig string, stdin []byte, args ...string) string {
	t.Helper()
	out, errOut, err := kubectl(t, kubeconfig, stdin, args...)
	if err != nil {
		t.Fatalf("kubectl %s: %v\n%s%s", strings.Join(args, " "), err, out, errOut)
	}
	return out
}

func readManifest(t *testing.T) []byte {
	t.Helper()
	data, err := os.ReadFile(manifest)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// ensureNamespace creates tabby-system for real (a server-side dry run of
// the namespaced objects needs it to exist).
func ensureNamespace(t *testing.T) {
	t.Helper()
	objs, err := Objects(readManifest(t))
	if err != nil {
		t.Fatal(err)
	}
	if objs[0].GetKind() != "Namespace" {
		t.Fatalf("the first object of %s is a %s, want the Namespace", manifest, objs[0].GetKind())
	}
	doc, err := objs[0].MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	mustKubectl(t, adminKubeconfig(t), doc, "apply", "--server-side", "-f", "-")
}

var applied struct {
	once sync.Once
	err  error
}

// ensureApplied applies tabby.yaml for real, once per test binary.
func ensureApplied(t *testing.T) {
	t.Helper()
	kc := adminKubeconfig(t) // outside the once: it may skip or fail t
	applied.once.Do(func() {
		out, errOut, err := kubectl(t, kc, nil, "apply", "--server-side", forceConflicts, "-f", manifest)
		if err != nil {
			applied.err = fmt.Errorf("kubectl apply --server-side -f %s: %v\n%s%s", manifest, err, out, errOut)
		}
	})
	if applied.err != nil {
		t.Fatal(applied.err)
	}
}

// TestServerSideDryRun: the API server accepts every object of tabby.yaml
// (schemas, CEL rules, admission policies, RBAC escalation checks) in a
// server-side dry run, and the dry run writes nothing.
func TestServerSideDryRun(t *testing.T) {
	ensureNamespace(t)
	objs, err := Objects(readManifest(t))
	if err != nil {
		t.Fatal(err)
	}
	cs := clientset(t)
	ctx := context.Background()
	_, dsErr := cs.AppsV1().DaemonSets(namespace).Get(ctx, "tabby-node", metav1.GetOptions{})
	existedBefore := !apierrors.IsNotFound(dsErr)

	start := time.Now()
	out := mustKubectl(t, adminKubeconfig(t), nil, "apply", "--server-side", forceConflicts, "--dry-run=server", "-f", manifest)
	t.Logf("server-side dry run of %d objects in %v", len(objs), time.Since(start).Round(time.Millisecond))
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != len(objs) {
		t.Errorf("kubectl reported %d objects, the manifest has %d:\n%s", len(lines), len(objs), out)
	}
	for _, o := range objs {
		want := fmt.Sprintf("/%s serverside-applied (server dry run)", o.GetName())
		if !strings.Contains(out, want) {
			t.Errorf("no %q for the %s in:\n%s", want, o.GetKind(), out)
		}
	}
	if !existedBefore {
		if _, err := cs.AppsV1().DaemonSets(namespace).Get(ctx, "tabby-node", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("the dry run created the DaemonSet (%v)", err)
		}
	}

	// A client-side apply (plain kubectl apply -f) passes too.
	out = mustKubectl(t, adminKubeconfig(t), nil, "apply", "--dry-run=server", "-f", manifest)
	if n := strings.Count(out, "(server dry run)"); n != len(objs) {
		t.Errorf("client-side apply: %d objects dry-run, want %d:\n%s", n, len(objs), out)
	}

	// The dry run really validates: a DaemonSet with a bad field is refused.
	bad := bytes.Replace(readManifest(t), []byte("priorityClassName: system-node-critical"), []byte("priorityClassName: 42"), 1)
	_, errOut, err := kubectl(t, adminKubeconfig(t), bad, "apply", "--server-side", forceConflicts, "--dry-run=server", "-f", "-")
	if err == nil {
		t.Errorf("a bad DaemonSet passed the dry run: %s", errOut)
	}
}

func clientset(t *testing.T) *kubernetes.Clientset {
	t.Helper()
	cs, err := kubernetes.NewForConfig(clustertest.Config(t))
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// TestDaemonSetPodAdmitted: a pod made from the DaemonSet's template, as
// the DaemonSet controller would make it, passes admission (Pod Security,
// priority class, service accounts) in a dry run; both containers carry
// tabby-node's own (kubelet-projected) token, and no Secret is mounted.
func TestDaemonSetPodAdmitted(t *testing.T) {
	ensureApplied(t)
	cs := clientset(t)
	ctx := context.Background()
	ds, err := cs.AppsV1().DaemonSets(namespace).Get(ctx, "tabby-node", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{ObjectMeta: *ds.Spec.Template.ObjectMeta.DeepCopy(), Spec: *ds.Spec.Template.Spec.DeepCopy()}
	pod.Name, pod.Namespace, pod.Spec.NodeName = "tabby-node-test", namespace, "node-1"
	got, err := cs.CoreV1().Pods(namespace).Create(ctx, pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	if err != nil {
		t.Fatalf("the DaemonSet's pod is refused: %v", err)
	}
	if got.Spec.Priority == nil || *got.Spec.Priority < 2000000000 {
		t.Errorf("priority %v, want system-node-critical's", got.Spec.Priority)
	}
	const saPath = "/var/run/secrets/kubernetes.io/serviceaccount"
	volumeAt := func(c corev1.Container) []string {
		var names []string
		for _, m := range c.VolumeMounts {
			if m.MountPath == saPath {
				names = append(names, m.Name)
			}
		}
		return names
	}
	for _, c := range append(got.Spec.InitContainers, got.Spec.Containers...) {
		if v := volumeAt(c); len(v) != 1 || !strings.HasPrefix(v[0], "kube-api-access-") {
			t.Errorf("%s has %v at %s, want its own service account's token", c.Name, v, saPath)
		}
	}
	for _, v := range got.Spec.Volumes {
		if v.Secret != nil {
			t.Errorf("volume %s mounts the Secret %s: no Secret belongs in tabby-node", v.Name, v.Secret.SecretName)
		}
	}
	// tabbyd rewrites the CNI plugin's kubeconfig where install-cni wrote it.
	tabbyd := got.Spec.Containers[0]
	if !slices.Contains(tabbyd.Args, "--cni-kubeconfig=/host/etc/cni/net.d/tabby-kubeconfig") ||
		!slices.ContainsFunc(tabbyd.VolumeMounts, func(m corev1.VolumeMount) bool {
			return m.Name == "cni-net-dir" && m.MountPath == "/host/etc/cni/net.d" && !m.ReadOnly
		}) {
		t.Errorf("tabbyd does not refresh the CNI kubeconfig in the host's /etc/cni/net.d: args %v, mounts %v", tabbyd.Args, tabbyd.VolumeMounts)
	}
}

// TestRBACLeastPrivilege asks the API server what each service account may
// do, after applying the RBAC for real.
func TestRBACLeastPrivilege(t *testing.T) {
	ensureApplied(t)
	type check struct {
		user, verb, resource, ns string
		allowed                  bool
	}
	var checks []check
	add := func(user string, allowed bool, ns string, verbResources ...string) {
		for _, vr := range verbResources {
			verb, resource, _ := strings.Cut(vr, " ")
			checks = append(checks, check{user, verb, resource, ns, allowed})
		}
	}
	ipamKinds := []string{"ipamblocks.tabby.io", "blockaffinities.tabby.io", "ipamhandles.tabby.io"}
	for _, r := range ipamKinds {
		for _, v := range []string{"get", "list", "create", "update", "delete"} {
			add(cniUser, true, "", v+" "+r)
			add(nodeUser, true, "", v+" "+r)
		}
		add(cniUser, false, "", "watch "+r, "patch "+r, "deletecollection "+r)
		add(nodeUser, true, "", "watch "+r)
	}
	// The CNI plugin: reads its pod, namespace and node, and the pools.
	add(cniUser, true, "default", "get pods")
	add(cniUser, true, "", "get namespaces", "get nodes",
		"get ippools.tabby.io", "list ippools.tabby.io", "get ipamconfigurations.tabby.io", "list ipamconfigurations.tabby.io")
	add(cniUser, false, "default", "list pods", "delete pods", "create pods", "patch pods", "get secrets", "create events")
	add(cniUser, false, namespace, "get secrets", "list secrets", "get configmaps", "create leases.coordination.k8s.io")
	add(cniUser, false, "kube-system", "get secrets")
	add(cniUser, false, "", "list nodes", "patch nodes", "delete nodes", "list namespaces",
		"create ippools.tabby.io", "update ippools.tabby.io", "delete ippools.tabby.io", "update ipamconfigurations.tabby.io",
		"get bgppeers.tabby.io", "get bgpconfigurations.tabby.io", "list networkpolicies.networking.k8s.io",
		"create customresourcedefinitions.apiextensions.k8s.io", "create clusterrolebindings.rbac.authorization.k8s.io")
	// tabbyd: watches what it reads, writes Nodes only through nodes/status
	// (the policy tabby-node-own-node narrows that to its own node: see
	// TestNodeWritesOnlyItsOwnNode), Leases in its own namespace, tokens of
	// tabby-cni only, and no Secret at all.
	add(nodeUser, true, "", "watch nodes", "list nodes", "patch nodes/status",
		"watch pods", "watch namespaces", "watch networkpolicies.networking.k8s.io",
		"watch ippools.tabby.io", "watch ipamconfigurations.tabby.io", "watch bgpconfigurations.tabby.io", "watch bgppeers.tabby.io", "watch bgpfilters.tabby.io",
		// The default pool, when the cluster has none.
		"create ippools.tabby.io")
	add(nodeUser, true, "default", "create events", "create events.events.k8s.io")
	add(nodeUser, true, namespace, "get leases.coordination.k8s.io", "create leases.coordination.k8s.io", "update leases.coordination.k8s.io",
		"create serviceaccounts/token#tabby-cni")
	add(nodeUser, false, namespace, "get secrets", "list secrets", "watch secrets", "get secrets#tabby-cni-token",
		"create serviceaccounts/token#tabby-node", "create serviceaccounts/token#default", "create serviceaccounts/token")
	add(nodeUser, false, "", "patch nodes", "update nodes", "create nodes", "delete nodes", "update nodes/status",
		"update ippools.tabby.io", "delete ippools.tabby.io",
		"update bgppeers.tabby.io", "create bgpconfigurations.tabby.io", "update ipamconfigurations.tabby.io")
	add(nodeUser, false, "default", "get secrets", "delete pods", "create pods", "patch pods", "create networkpolicies.networking.k8s.io", "delete events")
	add(nodeUser, false, "kube-system", "get secrets", "list secrets", "create leases.coordination.k8s.io")
	add(nodeUser, false, namespace, "create secrets", "update secrets", "delete leases.coordination.k8s.io")
	add(cniUser, false, namespace, "create serviceaccounts/token#tabby-cni", "create serviceaccounts/token#tabby-node")

	start := time.Now()
	sem := make(chan struct{}, 4)
	t.Run("can-i", func(t *testing.T) {
		for _, c := range checks {
			name := strings.TrimPrefix(c.user, "system:serviceaccount:tabby-system:") + " " + c.verb + " " + c.resource
			if c.ns != "" {
				name += " -n " + c.ns
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				sem <- struct{}{}
				defer func() { <-sem }()
				// RESOURCE[/SUBRESOURCE][#NAME]
				resource, name, _ := strings.Cut(c.resource, "#")
				resource, sub, _ := strings.Cut(resource, "/")
				if name != "" {
					resource += "/" + name
				}
				args := []string{"auth", "can-i", c.verb, resource, "--as", c.user}
				if sub != "" {
					args = append(args, "--subresource", sub)
				}
				if c.ns != "" {
					args = append(args, "-n", c.ns)
				} else if resource == "pods" || c.resource == "networkpolicies.networking.k8s.io" {
					args = append(args, "--all-namespaces")
				}
				out, errOut, err := kubectl(t, adminKubeconfig(t), nil, args...)
				answer := strings.TrimSpace(out)
				if answer != "yes" && answer != "no" {
					t.Fatalf("kubectl %s: %v: %s%s", strings.Join(args, " "), err, out, errOut)
				}
				if got := answer == "yes"; got != c.allowed {
					t.Errorf("allowed %v, want %v", got, c.allowed)
				}
			})
		}
	})
	t.Logf("%d can-i checks in %v", len(checks), time.Since(start).Round(time.Millisecond))
}

// TestCNICredentialsDoIPAM: install-cni, running as tabby-node with the
// token kubelet would mount (bound to a pod on the node), mints a
// short-lived tabby-cni token and writes a kubeconfig (0600, as the
// conflist) that lets tabby's IPAM give a pod an address and free it — and
// no more; tabbyd's refresher, as tabby-node, replaces the token.
func TestCNICredentialsDoIPAM(t *testing.T) {
	ensureApplied(t)
	c := clustertest.Cluster(t)
	cs := clientset(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	dir := t.TempDir()
	sa := filepath.Join(dir, "serviceaccount")
	if err := os.Mkdir(sa, 0o755); err != nil {
		t.Fatal(err)
	}
	// The node as kubelet registers it, running Debian's containerd: the
	// conflist must not be newer than its CNI 1.0.0.
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "cni-node"}}
	if _, err := cs.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	node, err := cs.CoreV1().Nodes().Get(ctx, "cni-node", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	node.Status.NodeInfo.ContainerRuntimeVersion = "containerd://1.6.20"
	if _, err := cs.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// What kubelet mounts into the tabby-node pod's install-cni container.
	nodeToken := tabbyNodeToken(t, cs, "cni-node")
	if err := os.WriteFile(filepath.Join(sa, "token"), []byte(nodeToken), 0o400); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(sa, "ca.crt"), c.CAData(), 0o400); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "image")
	if err := os.Mkdir(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, b := range installcni.DefaultPlugins {
		if err := os.WriteFile(filepath.Join(bin, b), []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}

	host := filepath.Join(dir, "host")
	res, err := installcni.Install(installcni.Options{
		BinSource: bin, HostRoot: host, NodeName: "cni-node", APIServer: c.Server,
		TokenFile: filepath.Join(sa, "token"), CAFile: filepath.Join(sa, "ca.crt"),
		CNIServiceAccount: "tabby-system/tabby-cni", TokenLifetime: time.Hour,
		ReferencePlugins: []string{}, // the node's business here (no loopback in this image)
	})
	if err != nil {
		t.Fatal(err)
	}
	// install-cni read the runtime off the Node with the tabby-cni credentials.
	if res.CNIVersion != "1.0.0" || !strings.Contains(strings.Join(res.Notes, "\n"), "cniVersion 1.0.0: containerd://1.6.20 speaks CNI up to 1.0.0") {
		t.Errorf("cniVersion %s, notes %q, warnings %q", res.CNIVersion, res.Notes, res.Warnings)
	}
	for _, w := range res.Warnings {
		if !strings.Contains(w, "has no loopback binary") {
			t.Errorf("warning: %s", w)
		}
	}
	kubeconfig := filepath.Join(host, "etc/cni/net.d/tabby-kubeconfig")
	for _, f := range []string{kubeconfig, filepath.Join(host, "etc/cni/net.d", installcni.DefaultConfName)} {
		if st, err := os.Stat(f); err != nil || st.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v, mode %v, want 0600 (CIS)", f, err, st.Mode().Perm())
		}
	}
	ds, token := cniClient(t, ctx, kubeconfig, time.Hour)
	if token == nodeToken {
		t.Fatal("the CNI kubeconfig carries tabby-node's own token")
	}

	// tabbyd's refresher, as tabby-node, replaces it with a new one.
	r := &cnitoken.Refresher{
		Minter: cnitoken.Minter{Client: tokenClient(t, nodeToken).CoreV1().RESTClient(), Namespace: namespace, ServiceAccount: "tabby-cni", Lifetime: cnitoken.DefaultLifetime},
		Path:   kubeconfig,
	}
	if _, err := r.Refresh(ctx); err != nil {
		t.Fatalf("tabbyd's refresh as tabby-node: %v", err)
	}
	ds, again := cniClient(t, ctx, kubeconfig, cnitoken.DefaultLifetime)
	if again == token {
		t.Error("the refresh left the old token in the kubeconfig")
	}

	// What kubelet would have made: the pod being wired.
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "cni-pod", Namespace: "default"},
		Spec:       corev1.PodSpec{NodeName: "cni-node", Containers: []corev1.Container{{Name: "c", Image: "example.invalid/c"}}},
	}
	if _, err := cs.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cs.CoreV1().Pods("default").Delete(context.Background(), "cni-pod", metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
	})

	// In a cluster the first tabbyd creates the default pool from its
	// --default-ipv4-pool-cidr (daemon's tests cover that); no tabbyd
	// runs here.
	pool := &tabbyv1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: "default-ipv4"}, Spec: tabbyv1.IPPoolSpec{CIDR: DefaultPodCIDR, NATOutgoing: true}}
	admin, err := datastore.New(c.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.IPPools.Create(ctx, pool, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	m := ipam.New(ds)
	const handle = "k8s-pod-network.0123456789abcdef"
	got, err := m.Assign(ctx, ipam.Request{HandleID: handle, Node: "cni-node", Namespace: "default", Pod: "cni-pod", IPv4: true})
	if err != nil {
		t.Fatalf("IPAM with the tabby-cni credentials: %v", err)
	}
	_, poolNet, _ := net.ParseCIDR(DefaultPodCIDR)
	if len(got) != 1 || !poolNet.Contains(got[0].IP) {
		t.Fatalf("assigned %v, want one address of %s", got, DefaultPodCIDR)
	}
	t.Logf("tabby-cni got %s from %s", got[0].IP, got[0].Block)
	if err := m.ReleaseHandle(ctx, handle, "cni-node"); err != nil {
		t.Fatalf("releasing with the tabby-cni credentials: %v", err)
	}
	if ips, err := m.HandleIPs(ctx, handle); err == nil && len(ips) != 0 {
		t.Errorf("still held after the release: %v", ips)
	}

	// And no more.
	err = ds.Pods("default").Delete(ctx, "cni-pod", metav1.DeleteOptions{})
	if !apierrors.IsForbidden(err) {
		t.Errorf("tabby-cni deleting a pod: %v, want Forbidden", err)
	}
	err = ds.CoreREST().Get().Namespace(namespace).Resource("secrets").Do(ctx).Error()
	if !apierrors.IsForbidden(err) {
		t.Errorf("tabby-cni listing secrets: %v, want Forbidden", err)
	}
}

// TestFreshClusterInstall follows the README on a control plane that has
// never seen tabby: the commands of "Install on a cluster" leave every
// object of tabby.yaml in place.
func TestFreshClusterInstall(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	start := time.Now()
	c, err := controlplane.Start(ctx, controlplane.Options{BinDir: clustertest.Cluster(t).BinDir})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	if err := c.WriteKubeconfig(kc, ""); err != nil {
		t.Fatal(err)
	}
	started := time.Now()
	// As in the README.
	for _, args := range readmeInstall {
		mustKubectl(t, kc, nil, args...)
	}
	mustKubectl(t, kc, nil, readmeInstall[len(readmeInstall)-1]...)
	t.Logf("fresh control plane in %v, README install in %v", started.Sub(start).Round(time.Millisecond), time.Since(started).Round(time.Millisecond))
	objs, err := Objects(readManifest(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		resource := strings.ToLower(o.GetKind())
		if group, _, ok := strings.Cut(o.GetAPIVersion(), "/"); ok {
			resource += "." + group
		}
		args := []string{"get", resource, o.GetName(), "-o", "name"}
		if o.GetNamespace() != "" {
			args = append(args, "-n", o.GetNamespace())
		}
		if _, errOut, err := kubectl(t, kc, nil, args...); err != nil {
			t.Errorf("%s %s is missing after the install: %s", o.GetKind(), o.GetName(), errOut)
		}
	}
}
