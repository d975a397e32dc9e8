package graph

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	v1 "github.com/tabbynet/tabby/api/v1"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/internal/controlplane/clustertest"
)

func TestMain(m *testing.M) { clustertest.Main(m, nil) }

// TestLoadFromAPIServer: the objects a real API server holds (Nodes with
// tabbyd's annotations and the reflector label, the BGPConfiguration,
// BGPPeers) are read by Load and drawn by Build; reading the live status
// of a user who may not exec names the grant to ask for, and the
// topology is still drawn.
func TestLoadFromAPIServer(t *testing.T) {
	c := clustertest.Cluster(t)
	ds := clustertest.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	nodes := []corev1.Node{node("node1", "10.0.0.1"), node("node2", "10.0.0.2"), node("node3", "10.0.0.3"),
		node("rr", "10.0.0.9", v1.LabelRouteReflector, "true")}
	nodes[2].Annotations[v1.AnnotationASNumber] = "65200"
	for i := range nodes {
		if _, err := ds.Nodes.Create(ctx, &nodes[i], metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	as := uint32(65100)
	if _, err := ds.BGPConfigurations.Create(ctx, &v1.BGPConfiguration{ObjectMeta: metav1.ObjectMeta{Name: v1.BGPConfigurationName},
		Spec: v1.BGPConfigurationSpec{ASNumber: &as}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := ds.BGPPeers.Create(ctx, &v1.BGPPeer{ObjectMeta: metav1.ObjectMeta{Name: "tor"},
		Spec: v1.BGPPeerSpec{NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{v1.LabelRouteReflector: "true"}},
			PeerIP: "192.0.2.1", ASNumber: 65001}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	in, err := Load(ctx, ds)
	if err != nil {
		t.Fatal(err)
	}
	m := Build(in)
	// node3 has AS 65200 of its own: an eBGP session with the reflector,
	// which reflects for iBGP clients only.
	want := `node3-rr eBGP configured
rr->node1 route-reflector configured
rr->node2 route-reflector configured
rr-peer/192.0.2.1 bgppeer/tor configured`
	if got := sessions(m); got != want {
		t.Errorf("sessions:\n%s\nwant:\n%s", got, want)
	}
	if m.AS != 65100 || m.Title() != "tabby BGP: route reflectors rr, AS 65100" {
		t.Errorf("AS %d, title %q", m.AS, m.Title())
	}
	if n := m.Nodes[2]; n.Name != "node3" || n.AS != 65200 {
		t.Errorf("node3: %+v", n)
	}

	// A user who may read the topology but not exec in pods.
	cs, err := kubernetes.NewForConfig(c.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "graph-viewer"},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"nodes", "pods"}, Verbs: []string{"get", "list"}},
			{APIGroups: []string{v1.GroupName}, Resources: []string{"bgpconfigurations", "bgppeers", "ippools"}, Verbs: []string{"get", "list"}},
		}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "graph-viewer"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "graph-viewer"},
		Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "User", Name: "viewer"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// A running tabby-node pod on node1 only (no kubelet here: its status
	// is written as a kubelet would).
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "tabby-node-1", Namespace: "default", Labels: map[string]string{"app.kubernetes.io/name": "tabby-node"}},
		Spec: corev1.PodSpec{NodeName: "node1", Containers: []corev1.Container{{Name: "tabbyd", Image: "tabby"}}}}
	if pod, err = cs.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod.Status.Phase = corev1.PodRunning
	if _, err := cs.CoreV1().Pods("default").UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	viewerCfg := rest.CopyConfig(c.RESTConfig())
	viewerCfg.Impersonate = rest.ImpersonationConfig{UserName: "viewer"}
	viewer, err := datastore.New(viewerCfg)
	if err != nil {
		t.Fatal(err)
	}
	in, err = Load(ctx, viewer)
	if err != nil {
		t.Fatalf("the viewer may read the topology: %v", err)
	}
	src := DefaultStatusSource(viewerCfg)
	src.Namespace = "default"
	if err := Statuses(ctx, viewer, src, &in); err != nil {
		t.Fatal(err)
	}
	m = Build(in)
	problems := strings.Join(m.Problems, "\n")
	for _, want := range []string{
		"node node1: no live status: exec in pod default/tabby-node-1 is forbidden",
		"grant create on pods/exec in default, or use --no-status",
		"node node2: no live status: no running pod app.kubernetes.io/name=tabby-node in namespace default on it",
	} {
		if !strings.Contains(problems, want) {
			t.Errorf("problems lack %q:\n%s", want, problems)
		}
	}
	if got := sessions(m); got != want {
		t.Errorf("without status, sessions:\n%s\nwant:\n%s", got, want)
	}
}
