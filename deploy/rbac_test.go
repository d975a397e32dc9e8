package deploy

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"

	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/internal/controlplane/clustertest"
)

// tabbyNodeToken is the token kubelet mounts into a tabby-node pod on node:
// a TokenRequest of tabby-node bound to a pod of that service account
// running there, which gives the token the node's name
// (authentication.kubernetes.io/node-name).
func tabbyNodeToken(t *testing.T, cs *kubernetes.Clientset, node string) string {
	t.Helper()
	ctx := context.Background()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "tabby-node-" + node, Namespace: namespace},
		Spec: corev1.PodSpec{NodeName: node, ServiceAccountName: "tabby-node", AutomountServiceAccountToken: ptr.To(false),
			Containers: []corev1.Container{{Name: "tabbyd", Image: "example.invalid/tabby"}}},
	}
	got, err := cs.CoreV1().Pods(namespace).Create(ctx, pod, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		got, err = cs.CoreV1().Pods(namespace).Get(ctx, pod.Name, metav1.GetOptions{})
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cs.CoreV1().Pods(namespace).Delete(context.Background(), pod.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
	})
	tr, err := cs.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, "tabby-node", &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		ExpirationSeconds: ptr.To(int64(3600)),
		BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: got.Name, UID: got.UID},
	}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Status.Token
}

// tokenClient is a client of the shared control plane authenticated by token.
func tokenClient(t *testing.T, token string) *kubernetes.Clientset {
	t.Helper()
	cfg := rest.AnonymousClientConfig(clustertest.Config(t))
	cfg.BearerToken = token
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// whoami asks the API server who a client is.
func whoami(ctx context.Context, cs *kubernetes.Clientset) (authenticationv1.UserInfo, error) {
	r, err := cs.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		return authenticationv1.UserInfo{}, err
	}
	return r.Status.UserInfo, nil
}

// cniClient loads the CNI plugin's kubeconfig at path, checks that the API
// server takes it as tabby-cni and that its token lives lifetime, and
// returns a datastore client of it and its token.
func cniClient(t *testing.T, ctx context.Context, path string, lifetime time.Duration) (*datastore.Client, string) {
	t.Helper()
	rc, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	who, err := whoami(ctx, cs)
	if err != nil || who.Username != cniUser {
		t.Fatalf("the CNI kubeconfig authenticates as %q (%v), want %s", who.Username, err, cniUser)
	}
	// The token's own claims: issued and expiring lifetime apart.
	parts := strings.Split(rc.BearerToken, ".")
	var claims struct{ Iat, Exp int64 }
	if len(parts) != 3 {
		t.Fatalf("the CNI token is not a JWT")
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err == nil {
		err = json.Unmarshal(payload, &claims)
	}
	if err != nil {
		t.Fatalf("the CNI token's claims: %v", err)
	}
	if got := time.Duration(claims.Exp-claims.Iat) * time.Second; got != lifetime {
		t.Errorf("the CNI token lives %v, want %v", got, lifetime)
	}
	ds, err := datastore.New(rc)
	if err != nil {
		t.Fatal(err)
	}
	return ds, rc.BearerToken
}

// TestNodeWritesOnlyItsOwnNode plays a tabbyd whose token was stolen, or
// that went wrong, with real requests carrying the token kubelet mounts
// into the tabby-node pod on node x: the admission policies let it write
// only x's tabby.io/* annotations and NetworkUnavailable condition, and
// only its own Leases.
func TestNodeWritesOnlyItsOwnNode(t *testing.T) {
	ensureApplied(t)
	admin := clientset(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, n := range []string{"own-x", "own-y"} {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n,
			Labels:      map[string]string{"kubernetes.io/hostname": n},
			Annotations: map[string]string{"example.com/owner": "ops", "tabby.io/ipv4-address": "192.0.2.1/24"}}}
		if _, err := admin.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = admin.CoreV1().Nodes().Delete(context.Background(), n, metav1.DeleteOptions{}) })
	}
	x := tokenClient(t, tabbyNodeToken(t, admin, "own-x"))
	if who, err := whoami(ctx, x); err != nil || who.Username != nodeUser || strings.Join(who.Extra["authentication.kubernetes.io/node-name"], ",") != "own-x" {
		t.Fatalf("the pod-bound token is %+v (%v), want %s on node own-x", who, err, nodeUser)
	}

	annotate := func(cs *kubernetes.Clientset, node string, annotations map[string]any) error {
		patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": annotations}})
		_, err := cs.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, patch, metav1.PatchOptions{}, "status")
		return err
	}
	// The policies take effect a moment after they are created.
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := annotate(x, "own-y", map[string]any{"tabby.io/ipv4-address": "192.0.2.66/24"})
		if apierrors.IsForbidden(err) || apierrors.IsInvalid(err) {
			if !strings.Contains(err.Error(), "tabby-node on node own-x may change only its own Node, not own-y") {
				t.Errorf("refused with %v, want the policy's message", err)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("tabby-node of own-x rewrote own-y's BGP identity: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if y, _ := admin.CoreV1().Nodes().Get(ctx, "own-y", metav1.GetOptions{}); y.Annotations["tabby.io/ipv4-address"] != "192.0.2.1/24" {
		t.Errorf("own-y's identity is now %q", y.Annotations["tabby.io/ipv4-address"])
	}

	// What tabbyd does (daemon/node.go publish and setNetworkAvailable),
	// on its own node: allowed.
	if err := annotate(x, "own-x", map[string]any{"tabby.io/ipv4-address": "192.0.2.10/24", "tabby.io/vxlan-tunnel-mac": "02:00:00:00:00:01"}); err != nil {
		t.Errorf("publishing own-x's identity: %v", err)
	}
	now := metav1.Now()
	cond, _ := json.Marshal(map[string]any{"status": map[string]any{"conditions": []corev1.NodeCondition{{
		Type: corev1.NodeNetworkUnavailable, Status: corev1.ConditionFalse, Reason: "TabbyIsUp", LastTransitionTime: now, LastHeartbeatTime: now}}}})
	if _, err := x.CoreV1().Nodes().Patch(ctx, "own-x", types.StrategicMergePatchType, cond, metav1.PatchOptions{}, "status"); err != nil {
		t.Errorf("clearing own-x's NetworkUnavailable: %v", err)
	}
	if got, _ := admin.CoreV1().Nodes().Get(ctx, "own-x", metav1.GetOptions{}); got.Annotations["tabby.io/ipv4-address"] != "192.0.2.10/24" {
		t.Errorf("own-x's identity is %q after the publish", got.Annotations["tabby.io/ipv4-address"])
	}

	// Everything else, even on its own node: refused.
	ready, _ := json.Marshal(map[string]any{"status": map[string]any{"conditions": []corev1.NodeCondition{{
		Type: corev1.NodeReady, Status: corev1.ConditionFalse, Reason: "Hijack", LastTransitionTime: now, LastHeartbeatTime: now}}}})
	for _, c := range []struct {
		what, node, resource string
		pt                   types.PatchType
		patch                string
		sub                  []string
	}{
		{"taint own-x", "own-x", "nodes", types.MergePatchType, `{"spec":{"taints":[{"key":"k","effect":"NoSchedule"}]}}`, nil},
		{"cordon own-y", "own-y", "nodes", types.MergePatchType, `{"spec":{"unschedulable":true}}`, nil},
		{"annotate own-x through nodes", "own-x", "nodes", types.MergePatchType, `{"metadata":{"annotations":{"tabby.io/ipv4-address":"192.0.2.11/24"}}}`, nil},
		{"label own-x", "own-x", "nodes/status", types.MergePatchType, `{"metadata":{"labels":{"tabby.io/route-reflector":"true"}}}`, []string{"status"}},
		{"another annotation of own-x", "own-x", "nodes/status", types.MergePatchType, `{"metadata":{"annotations":{"example.com/owner":"me"}}}`, []string{"status"}},
		{"remove another annotation of own-x", "own-x", "nodes/status", types.MergePatchType, `{"metadata":{"annotations":{"example.com/owner":null}}}`, []string{"status"}},
		{"own-x NotReady", "own-x", "nodes/status", types.StrategicMergePatchType, string(ready), []string{"status"}},
		{"own-y's NetworkUnavailable", "own-y", "nodes/status", types.StrategicMergePatchType, string(cond), []string{"status"}},
	} {
		_, err := x.CoreV1().Nodes().Patch(ctx, c.node, c.pt, []byte(c.patch), metav1.PatchOptions{}, c.sub...)
		if !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err) {
			t.Errorf("%s: %v, want refused", c.what, err)
		} else {
			t.Logf("%s: refused: %v", c.what, err)
		}
	}

	// Leases: its own heartbeat and the IPAM collector's election only.
	leases := x.CoordinationV1().Leases(namespace)
	lease := func(name string) *coordinationv1.Lease {
		return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("own-x")}}
	}
	for _, name := range []string{"tabbyd-own-x", "tabby-ipam-gc"} {
		l, err := leases.Create(ctx, lease(name), metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			l, err = leases.Get(ctx, name, metav1.GetOptions{})
		}
		if err == nil {
			_, err = leases.Update(ctx, l, metav1.UpdateOptions{})
		}
		if err != nil {
			t.Errorf("tabby-node of own-x writing the Lease %s: %v", name, err)
		}
		t.Cleanup(func() {
			_ = admin.CoordinationV1().Leases(namespace).Delete(context.Background(), name, metav1.DeleteOptions{})
		})
	}
	if _, err := admin.CoordinationV1().Leases(namespace).Create(ctx, lease("tabbyd-own-y"), metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = admin.CoordinationV1().Leases(namespace).Delete(context.Background(), "tabbyd-own-y", metav1.DeleteOptions{})
	})
	for _, name := range []string{"tabbyd-own-y", "tabby-scheduler-extender"} {
		_, err := leases.Create(ctx, lease(name), metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			var l *coordinationv1.Lease
			if l, err = leases.Get(ctx, name, metav1.GetOptions{}); err == nil {
				_, err = leases.Update(ctx, l, metav1.UpdateOptions{})
			}
		}
		if !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err) {
			t.Errorf("tabby-node of own-x writing the Lease %s: %v, want refused", name, err)
		}
	}

	// A tabby-node token bound to no pod carries no node: refused.
	unbound, err := admin.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, "tabby-node",
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(600))}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	err = annotate(tokenClient(t, unbound.Status.Token), "own-x", map[string]any{"tabby.io/ipv4-address": "192.0.2.12/24"})
	if err == nil || !strings.Contains(err.Error(), "carries no node") {
		t.Errorf("a token without a node: %v, want refused", err)
	}
	// Nor may tabby-node mint itself one (of another node's pod).
	_, err = x.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, "tabby-node",
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(600))}}, metav1.CreateOptions{})
	if !apierrors.IsForbidden(err) {
		t.Errorf("tabby-node minting a tabby-node token: %v, want Forbidden", err)
	}
}

// TestBGPPasswordGrant: the README's two commands let tabby-node read the
// one Secret they name, and no other.
func TestBGPPasswordGrant(t *testing.T) {
	ensureApplied(t)
	admin := clientset(t)
	ctx := context.Background()
	for _, name := range []string{"bgp-passwords", "other-secret"} {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}, StringData: map[string]string{"peer": "pw"}}
		if _, err := admin.CoreV1().Secrets(namespace).Create(ctx, s, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = admin.CoreV1().Secrets(namespace).Delete(context.Background(), name, metav1.DeleteOptions{})
		})
	}
	x := tokenClient(t, tabbyNodeToken(t, admin, "pw-node"))
	if _, err := x.CoreV1().Secrets(namespace).Get(ctx, "bgp-passwords", metav1.GetOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("before the grant: %v, want Forbidden", err)
	}
	// As in the README ("BGP passwords").
	mustKubectl(t, adminKubeconfig(t), nil, "-n", namespace, "create", "role", "tabby-bgp-passwords", "--verb=get", "--resource=secrets", "--resource-name=bgp-passwords")
	mustKubectl(t, adminKubeconfig(t), nil, "-n", namespace, "create", "rolebinding", "tabby-bgp-passwords", "--role=tabby-bgp-passwords", "--serviceaccount=tabby-system:tabby-node")
	t.Cleanup(func() {
		_ = admin.RbacV1().RoleBindings(namespace).Delete(context.Background(), "tabby-bgp-passwords", metav1.DeleteOptions{})
		_ = admin.RbacV1().Roles(namespace).Delete(context.Background(), "tabby-bgp-passwords", metav1.DeleteOptions{})
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		s, err := x.CoreV1().Secrets(namespace).Get(ctx, "bgp-passwords", metav1.GetOptions{})
		if err == nil {
			if string(s.Data["peer"]) != "pw" {
				t.Errorf("read %q", s.Data["peer"])
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the grant: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if _, err := x.CoreV1().Secrets(namespace).Get(ctx, "other-secret", metav1.GetOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("another Secret after the grant: %v, want Forbidden", err)
	}
	if _, err := x.CoreV1().Secrets(namespace).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("listing Secrets after the grant: %v, want Forbidden", err)
	}
}
