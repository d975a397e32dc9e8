package netpol

import (
	"context"
	"net/netip"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	cnpv1 "github.com/tabbynet/tabby/api/cnp/v1beta1"
	"github.com/tabbynet/tabby/internal/controlplane/clustertest"
	"github.com/tabbynet/tabby/policy"
)

// cnp creates a ClusterNetworkPolicy from its YAML-ish JSON spec through
// the real API server (the CRD of deploy/crds validates it) and deletes
// it when the test ends.
func (w *world) cnp(t *testing.T, name string, spec map[string]any) {
	t.Helper()
	dc, err := dynamic.NewForConfig(clustertest.Config(t))
	if err != nil {
		t.Fatal(err)
	}
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": cnpv1.GroupName + "/" + cnpv1.Version, "kind": cnpv1.Kind,
		"metadata": map[string]any{"name": name}, "spec": spec,
	}}
	ri := dc.Resource(cnpv1.GroupVersionResource)
	if _, err := ri.Create(context.Background(), u, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating ClusterNetworkPolicy %s: %v", name, err)
	}
	t.Cleanup(func() { _ = ri.Delete(context.Background(), name, metav1.DeleteOptions{}) })
}

func deleteCNP(t *testing.T, name string) {
	t.Helper()
	dc, err := dynamic.NewForConfig(clustertest.Config(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := dc.Resource(cnpv1.GroupVersionResource).Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestControllerEnforcesClusterPolicies: ClusterNetworkPolicies created
// through the real API server reach the kernel of the node as chains of
// their tier in the pod's chain, a policy the compiler refuses in part
// becomes a Warning Event on it while its other rules and the other
// policies are enforced, and a deleted policy's chain goes.
func TestControllerEnforcesClusterPolicies(t *testing.T) {
	w := newWorld(t)
	server := w.pod(t, "server", w.node, map[string]string{"app": "server"})
	subject := map[string]any{"namespaces": map[string]any{"matchLabels": map[string]any{"kubernetes.io/metadata.name": w.ns}}}
	deny, base, odd := w.ns+"-deny", w.ns+"-base", w.ns+"-odd"
	w.cnp(t, deny, map[string]any{"tier": "Admin", "priority": 10, "subject": subject,
		"ingress": []any{map[string]any{"action": "Deny", "from": []any{map[string]any{"namespaces": map[string]any{"matchLabels": map[string]any{"team": "b"}}}},
			"protocols": []any{map[string]any{"tcp": map[string]any{"destinationPort": map[string]any{"number": 80}}}}}}})
	w.cnp(t, base, map[string]any{"tier": "Baseline", "priority": 1, "subject": subject,
		"egress": []any{map[string]any{"action": "Deny", "to": []any{map[string]any{"networks": []any{"192.0.2.0/24"}}}}}})
	// The API accepts an egress peer of domain names; tabby does not
	// enforce them, says so, and enforces the rest of the policy.
	w.cnp(t, odd, map[string]any{"tier": "Admin", "priority": 20, "subject": subject,
		"egress": []any{
			map[string]any{"action": "Accept", "to": []any{map[string]any{"domainNames": []any{"example.com"}}}},
			map[string]any{"action": "Deny", "to": []any{map[string]any{"networks": []any{"198.51.100.0/24"}}}}}})
	r := w.start(t, nil)
	ip := w.assign(t, server)
	if _, err := r.c.WaitProgrammed(waitCtx(t, 30*time.Second), w.ns, "server", "", []netip.Addr{ip}); err != nil {
		t.Fatal(err)
	}
	save := r.applier.Backend().IPTablesSave
	has := func(k string, names ...string) bool {
		for _, n := range names {
			if !strings.Contains(k, `--comment "cnp-admin:`+n+`" -j `+policy.PolicyChainPrefix) &&
				!strings.Contains(k, `--comment "cnp-baseline:`+n+`" -j `+policy.PolicyChainPrefix) {
				return false
			}
		}
		return true
	}
	eventually(t, "the chains of the three policies", func() bool { return has(w.kernel(t, save), deny, base, odd) })
	k := w.kernel(t, save)
	for _, want := range []string{"-j DROP", "--set-xmark 0x0/0x30000", " 192.0.2.0/24", " 198.51.100.0/24"} {
		if !strings.Contains(k, want) {
			t.Errorf("the kernel lacks %q:\n%s", want, k)
		}
	}
	eventually(t, "the Event on the policy with domain names", func() bool { return r.rec.count(ReasonNotEnforced+" /"+odd) == 1 })
	if n := r.rec.count(ReasonNotEnforced + " /" + deny); n != 0 {
		t.Errorf("%d Events on a policy without problems", n)
	}

	deleteCNP(t, deny)
	eventually(t, "the deleted policy's chain gone", func() bool {
		k := w.kernel(t, save)
		return !has(k, deny) && has(k, base, odd)
	})
}

// TestControllerWithoutTheCRD: where the API server does not serve
// ClusterNetworkPolicies, the controller still syncs and enforces
// NetworkPolicy, and the client says what is missing.
func TestControllerWithoutTheCRD(t *testing.T) {
	w := newWorld(t)
	dc, err := dynamic.NewForConfig(clustertest.Config(t))
	if err != nil {
		t.Fatal(err)
	}
	w.cnpClient = &ClusterPolicyClient{ri: dc.Resource(schema.GroupVersionResource{Group: "nothere.tabby.io", Version: "v1", Resource: "nothings"})}
	server := w.pod(t, "server", w.node, map[string]string{"app": "server"})
	r := w.start(t, nil)
	ip := w.assign(t, server)
	if _, err := r.c.WaitProgrammed(waitCtx(t, 30*time.Second), w.ns, "server", "", []netip.Addr{ip}); err != nil {
		t.Fatal(err)
	}
	if err := r.c.Ready(); err != nil {
		t.Errorf("not ready without the CRD: %v", err)
	}
	if !w.cnpClient.Missing() {
		t.Error("the client did not notice the missing resource")
	}
}

// TestClusterPolicyClientWaitsForTheCRD: a real informer over a
// ClusterPolicyClient whose resource is not served lists nothing and
// waits quietly (no failed watch every back-off); once the CRD is
// installed and an object created, the informer has it, without a
// restart. The resource is a CRD of the test's own group, removed at the
// end.
func TestClusterPolicyClientWaitsForTheCRD(t *testing.T) {
	cfg := clustertest.Config(t)
	dc, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	gvr := schema.GroupVersionResource{Group: "crdwait.tabby.io", Version: "v1", Resource: "waiters"}
	c := &ClusterPolicyClient{ri: dc.Resource(gvr), recheck: 200 * time.Millisecond}
	var watches atomic.Int32
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return c.List(ctx, o) },
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			watches.Add(1)
			return c.Watch(ctx, o)
		},
	}
	store, ctrl := cache.NewInformerWithOptions(cache.InformerOptions{ListerWatcher: lw, ObjectType: &unstructured.Unstructured{}, Handler: cache.ResourceEventHandlerFuncs{}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go ctrl.RunWithContext(ctx)
	eventually(t, "the informer's first list", ctrl.HasSynced)
	if !c.Missing() {
		t.Fatal("the client did not notice the missing resource")
	}
	// The informer may have tried a watch-list before its first list.
	before := watches.Load()
	time.Sleep(time.Second) // five rechecks
	if n := watches.Load() - before; n > 1 {
		t.Errorf("%d watches in a second while the resource is missing, want at most 1 quiet one", n)
	}

	ext, err := apiextclient.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	crd := &apiextv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: gvr.Resource + "." + gvr.Group},
		Spec: apiextv1.CustomResourceDefinitionSpec{
			Group: gvr.Group, Scope: apiextv1.ClusterScoped,
			Names: apiextv1.CustomResourceDefinitionNames{Plural: gvr.Resource, Kind: "Waiter", ListKind: "WaiterList", Singular: "waiter"},
			Versions: []apiextv1.CustomResourceDefinitionVersion{{Name: gvr.Version, Served: true, Storage: true,
				Schema: &apiextv1.CustomResourceValidation{OpenAPIV3Schema: &apiextv1.JSONSchemaProps{Type: "object", XPreserveUnknownFields: ptr.To(true)}}}},
		},
	}
	if _, err := ext.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, crd, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = ext.ApiextensionsV1().CustomResourceDefinitions().Delete(context.Background(), crd.Name, metav1.DeleteOptions{})
	})
	obj := &unstructured.Unstructured{Object: map[string]any{"apiVersion": gvr.GroupVersion().String(), "kind": "Waiter", "metadata": map[string]any{"name": "w1"}}}
	eventually(t, "the object created once the CRD is served", func() bool {
		_, err := c.ri.Create(ctx, obj, metav1.CreateOptions{})
		return err == nil
	})
	eventually(t, "the informer to hold the object, without a restart", func() bool {
		_, ok, _ := store.GetByKey("w1")
		return ok
	})
	if c.Missing() {
		t.Error("the client still says the resource is missing")
	}
}

// TestREADMEClusterPolicies: the README's ClusterNetworkPolicy examples
// are accepted by the API server with the CRD tabby installs, and
// compile without problems.
func TestREADMEClusterPolicies(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, sec, ok := strings.Cut(string(readme), "## ClusterNetworkPolicy (tabbyd)")
	_, block, ok2 := strings.Cut(sec, "```yaml\n")
	block, _, ok3 := strings.Cut(block, "```")
	if !ok || !ok2 || !ok3 {
		t.Fatal("no yaml block in the README's ClusterNetworkPolicy section")
	}
	dc, err := dynamic.NewForConfig(clustertest.Config(t))
	if err != nil {
		t.Fatal(err)
	}
	ri := dc.Resource(cnpv1.GroupVersionResource)
	var objs []*unstructured.Unstructured
	for _, doc := range strings.Split(block, "\n---\n") {
		u := &unstructured.Unstructured{}
		if err := yaml.Unmarshal([]byte(doc), &u.Object); err != nil {
			t.Fatalf("%v:\n%s", err, doc)
		}
		created, err := ri.Create(context.Background(), u, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("the API server refuses the README's %s: %v", u.GetName(), err)
		}
		t.Cleanup(func() { _ = ri.Delete(context.Background(), created.GetName(), metav1.DeleteOptions{}) })
		objs = append(objs, created)
	}
	ps, bad := DecodeClusterPolicies(objs)
	if len(ps) != 2 || len(bad) > 0 {
		t.Fatalf("decoded %d, problems %+v", len(ps), bad)
	}
	if rs := policy.Compile(&policy.Input{ClusterPolicies: ps}); len(rs.Problems) > 0 {
		t.Errorf("problems: %+v", rs.Problems)
	}
}
