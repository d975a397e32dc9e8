package deploy

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"

	tabbyv1 "github.com/tabbynet/tabby/api/v1"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/internal/controlplane/clustertest"
	"github.com/tabbynet/tabby/internal/testnet"
)

const tabbyctlPod = "tabbyctl-pod.yaml"

// tokenKubeconfig writes a kubeconfig of the shared control plane that
// carries token, as the in-cluster config of a pod would.
func tokenKubeconfig(t *testing.T, token string) string {
	t.Helper()
	admin := clustertest.Config(t)
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["c"] = &clientcmdapi.Cluster{Server: admin.Host, CertificateAuthority: admin.CAFile, CertificateAuthorityData: admin.CAData}
	cfg.AuthInfos["u"] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["c"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "u"}
	cfg.CurrentContext = "c"
	path := filepath.Join(t.TempDir(), "tabbyctl.kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// allowed asks the API server whether the client may do verb on resource
// of tabby.io (SelfSubjectAccessReview: the real authorizer's answer).
func allowed(t *testing.T, ctx context.Context, token, verb, resource string) bool {
	t.Helper()
	r, err := tokenClient(t, token).AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authorizationv1.SelfSubjectAccessReview{
		Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authorizationv1.ResourceAttributes{Group: tabbyv1.GroupName, Verb: verb, Resource: resource}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return r.Status.Allowed
}

// TestTabbyctlPod applies deploy/tabbyctl-pod.yaml and runs the real
// tabbyctl with the credentials kubelet would mount into that pod (a token
// of its service account bound to it): ipam show and ipam check work, a
// write is Forbidden, and the README's one-liner grants what ipam release
// writes, and only that.
func TestTabbyctlPod(t *testing.T) {
	ctx := context.Background()
	bin, err := testnet.Binary(t.TempDir(), "tabbyctl")
	if err != nil {
		t.Fatal(err)
	}
	ensureNamespace(t)
	mustKubectl(t, adminKubeconfig(t), nil, "apply", "--server-side", "-f", tabbyctlPod)
	t.Cleanup(func() {
		_, _, _ = kubectl(t, adminKubeconfig(t), nil, "delete", "--ignore-not-found", "--wait=false", "-f", tabbyctlPod)
	})
	cs := clientset(t)
	pod, err := cs.CoreV1().Pods(namespace).Get(ctx, "tabbyctl", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pod.Spec.ServiceAccountName != "tabbyctl" {
		t.Fatalf("the pod runs as %q", pod.Spec.ServiceAccountName)
	}
	tr, err := cs.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, "tabbyctl", &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		ExpirationSeconds: ptr.To(int64(600)),
		BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
	}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	token := tr.Status.Token
	kc := tokenKubeconfig(t, token)

	// A pool for ipam show to find.
	admin := clustertest.Client(t)
	pool := &tabbyv1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: "tabbyctl-pod-test"}, Spec: tabbyv1.IPPoolSpec{CIDR: "198.18.240.0/24"}}
	if _, err := admin.IPPools.Create(ctx, pool, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.IPPools.Delete(context.Background(), pool.Name, metav1.DeleteOptions{}) })

	run := func(args ...string) string {
		t.Helper()
		out, err := exec.Command(bin, append([]string{"--kubeconfig", kc}, args...)...).CombinedOutput()
		if err != nil {
			t.Errorf("tabbyctl %s as the tabbyctl pod: %v\n%s", strings.Join(args, " "), err, out)
		}
		t.Logf("tabbyctl %s as the tabbyctl pod:\n%s", strings.Join(args, " "), out)
		return string(out)
	}
	if out := run("ipam", "show"); !strings.Contains(out, "198.18.240.0/24") {
		t.Errorf("tabbyctl ipam show does not list the pool 198.18.240.0/24:\n%s", out)
	}
	run("ipam", "check")
	// bgp graph reads the Nodes, the BGPConfiguration and the BGPPeers;
	// without pods/exec it draws the configured sessions only.
	if out := run("bgp", "graph", "--no-status"); !strings.Contains(out, "digraph") {
		t.Errorf("tabbyctl bgp graph --no-status prints no graph:\n%s", out)
	}

	// Read-only: a write and a Secret are Forbidden.
	cfg := rest.AnonymousClientConfig(clustertest.Config(t))
	cfg.BearerToken = token
	ds, err := datastore.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ds.IPPools.Create(ctx, &tabbyv1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: "tabbyctl-may-not"}, Spec: tabbyv1.IPPoolSpec{CIDR: "198.18.241.0/24"}}, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("creating an IPPool as tabbyctl: %v, want Forbidden", err)
	}
	if err := ds.IPPools.Delete(ctx, pool.Name, metav1.DeleteOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("deleting an IPPool as tabbyctl: %v, want Forbidden", err)
	}
	if _, err := tokenClient(t, token).CoreV1().Secrets(namespace).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("listing Secrets as tabbyctl: %v, want Forbidden", err)
	}
	release := [][2]string{{"update", "ipamblocks"}, {"update", "ipamhandles"}, {"delete", "ipamhandles"}}
	for _, r := range release {
		if allowed(t, ctx, token, r[0], r[1]) {
			t.Errorf("tabbyctl may %s %s without tabbyctl-release", r[0], r[1])
		}
	}

	// The grant of the file's comment, as an admin types it.
	mustKubectl(t, adminKubeconfig(t), nil, "create", "clusterrolebinding", "tabbyctl-release", "--clusterrole=tabbyctl-release", "--serviceaccount=tabby-system:tabbyctl")
	t.Cleanup(func() {
		_, _, _ = kubectl(t, adminKubeconfig(t), nil, "delete", "clusterrolebinding", "tabbyctl-release", "--ignore-not-found")
	})
	// The API server's RBAC cache learns of the binding a moment later.
	deadline := time.Now().Add(10 * time.Second)
	for _, r := range release {
		for !allowed(t, ctx, token, r[0], r[1]) {
			if time.Now().After(deadline) {
				t.Fatalf("tabbyctl may not %s %s with tabbyctl-release", r[0], r[1])
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	for _, r := range [][2]string{{"create", "ippools"}, {"update", "ippools"}, {"delete", "ipamblocks"}, {"create", "ipamhandles"}} {
		if allowed(t, ctx, token, r[0], r[1]) {
			t.Errorf("tabbyctl-release lets tabbyctl %s %s", r[0], r[1])
		}
	}
}
