package deploy

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/restmapper"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/tabbynet/tabby/internal/controlplane/clustertest"
)

// kustomize renders the kustomization in dir with the real kubectl's
// built-in kustomize (what `kubectl apply -k` applies) and parses it.
func kustomize(t *testing.T, dir string) []*unstructured.Unstructured {
	t.Helper()
	out := mustKubectl(t, adminKubeconfig(t), nil, "kustomize", dir)
	objs, err := Objects([]byte(out))
	if err != nil {
		t.Fatalf("kubectl kustomize %s: %v", dir, err)
	}
	return objs
}

func rendered(t *testing.T, opts RenderOptions) []*unstructured.Unstructured {
	t.Helper()
	data, err := Render(".", opts)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := Objects(data)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

// namespaced tells, from the real API server's discovery, whether objects
// of a kind live in a namespace.
func namespaced(t *testing.T) func(schema.GroupVersionKind) bool {
	t.Helper()
	dc, err := discovery.NewDiscoveryClientForConfig(clustertest.Config(t))
	if err != nil {
		t.Fatal(err)
	}
	groups, err := restmapper.GetAPIGroupResources(dc)
	if err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewDiscoveryRESTMapper(groups)
	return func(gvk schema.GroupVersionKind) bool {
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			t.Fatalf("%v is not served by the API server: %v", gvk, err)
		}
		return m.Scope.Name() == "namespace"
	}
}

// byKey indexes objects by kind, namespace and name, normalized as the API
// server stores them: a cluster-scoped object has no namespace (the server
// drops one; kubectl 1.35's kustomize, v5.7.1, adds one to
// ValidatingAdmissionPolicies and their bindings under namespace:, since it
// does not know they are cluster-scoped, kustomize issue 6051), and a
// container's env is in order of name (kustomize's strategic-merge patch
// moves the patched variable first; no value of tabby's env refers to
// another variable, where order would matter).
func byKey(t *testing.T, objs []*unstructured.Unstructured, isNamespaced func(schema.GroupVersionKind) bool) map[string]map[string]any {
	t.Helper()
	m := map[string]map[string]any{}
	for _, o := range objs {
		o = o.DeepCopy()
		if !isNamespaced(o.GroupVersionKind()) {
			o.SetNamespace("")
		}
		sortEnv(t, o)
		key := o.GetKind() + " " + o.GetNamespace() + "/" + o.GetName()
		if _, dup := m[key]; dup {
			t.Fatalf("%s twice", key)
		}
		m[key] = o.Object
	}
	return m
}

func sortEnv(t *testing.T, o *unstructured.Unstructured) {
	for _, list := range []string{"initContainers", "containers"} {
		cs, found, err := unstructured.NestedSlice(o.Object, "spec", "template", "spec", list)
		if err != nil || !found {
			continue
		}
		for _, c := range cs {
			env, _ := c.(map[string]any)["env"].([]any)
			for _, e := range env {
				if v, _ := e.(map[string]any)["value"].(string); strings.Contains(v, "$(") {
					t.Fatalf("%s: env %v refers to another variable: its order matters", o.GetName(), e)
				}
			}
			sort.SliceStable(env, func(i, j int) bool {
				return env[i].(map[string]any)["name"].(string) < env[j].(map[string]any)["name"].(string)
			})
		}
		if err := unstructured.SetNestedSlice(o.Object, cs, "spec", "template", "spec", list); err != nil {
			t.Fatal(err)
		}
	}
}

func compareObjects(t *testing.T, what string, want, got []*unstructured.Unstructured) {
	t.Helper()
	isNamespaced := namespaced(t)
	if d := cmp.Diff(byKey(t, want, isNamespaced), byKey(t, got, isNamespaced)); d != "" {
		t.Errorf("%s differs (-deploy/gen +kubectl kustomize):\n%s", what, d)
	}
}

// TestKustomizeIsGen: `kubectl apply -k deploy/` installs the objects of
// tabby.yaml, no more, no fewer, field for field.
func TestKustomizeIsGen(t *testing.T) {
	want := rendered(t, RenderOptions{})
	got := kustomize(t, ".")
	if len(got) != len(want) {
		t.Errorf("kubectl kustomize deploy/ has %d objects, tabby.yaml %d: keep the resources of kustomization.yaml in step with the parts of render.go", len(got), len(want))
	}
	compareObjects(t, "deploy/kustomization.yaml", want, got)
}

// overlay writes a kustomization of the user's own, in a folder outside
// deploy/ (kustomize refuses a base that contains its overlay), with the
// settings the kustomization's comment and the README give.
func overlay(t *testing.T, ns, image, tag, cidr string) string {
	t.Helper()
	dir := t.TempDir()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	base, err := filepath.Rel(dir, wd) // kustomize takes no absolute base
	if err != nil {
		t.Fatal(err)
	}
	k := `apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
- ` + base + `
namespace: ` + ns + `
images:
- name: ghcr.io/tabbynet/tabby
  newName: ` + image + `
  newTag: ` + tag + `
patches:
- patch: |
    apiVersion: apps/v1
    kind: DaemonSet
    metadata:
      name: tabby-node
      namespace: tabby-system
    spec:
      template:
        spec:
          containers:
          - name: tabbyd
            env:
            - name: DEFAULT_IPV4_POOL_CIDR
              value: ` + cidr + `
`
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// inNamespace is what a user of kustomize's namespace: expects of tabby in
// namespace ns, written out here independently of kustomize: every
// namespaced object in ns, the Namespace itself renamed, and RBAC subjects
// that named tabby-system naming ns.
func inNamespace(t *testing.T, objs []*unstructured.Unstructured, ns string) []*unstructured.Unstructured {
	t.Helper()
	var out []*unstructured.Unstructured
	for _, o := range objs {
		o = o.DeepCopy()
		switch {
		case o.GetKind() == "Namespace":
			o.SetName(ns)
		case o.GetNamespace() == namespace:
			o.SetNamespace(ns)
		}
		subjects, _, _ := unstructured.NestedSlice(o.Object, "subjects")
		for _, s := range subjects {
			if s := s.(map[string]any); s["namespace"] == namespace {
				s["namespace"] = ns
			}
		}
		if subjects != nil {
			if err := unstructured.SetNestedSlice(o.Object, subjects, "subjects"); err != nil {
				t.Fatal(err)
			}
		}
		out = append(out, o)
	}
	return out
}

// TestKustomizeOverlay: an overlay that changes the namespace, the image
// and the pod CIDR renders what deploy/gen renders with the same image and
// CIDR, moved to that namespace; nothing still names tabby-system (the
// pods take their namespace from the downward API, the admission policies
// match tabby-node of any namespace); and the API server accepts it all.
func TestKustomizeOverlay(t *testing.T) {
	const ns, image, tag, cidr = "tabby-net", "registry.example/tabby", "v1.2.3", "10.42.0.0/16"
	dir := overlay(t, ns, image, tag, cidr)
	got := kustomize(t, dir)
	want := inNamespace(t, rendered(t, RenderOptions{Image: image + ":" + tag, PodCIDR: cidr}), ns)
	compareObjects(t, "the overlay", want, got)
	for _, o := range got {
		data, err := o.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		// Any text that still named it (an argument, a CEL expression)
		// would not follow the overlay.
		if strings.Contains(string(data), namespace) {
			t.Errorf("%s %s still names %s under namespace: %s", o.GetKind(), o.GetName(), namespace, ns)
		}
	}

	// The API server takes the overlay as kubectl apply -k sends it (a
	// server-side dry run: the namespaced objects need their namespace to
	// exist, so it is made for real, and deleted after).
	mustKubectl(t, adminKubeconfig(t), nil, "create", "namespace", ns)
	t.Cleanup(func() { _, _, _ = kubectl(t, adminKubeconfig(t), nil, "delete", "namespace", ns, "--wait=false") })
	out := mustKubectl(t, adminKubeconfig(t), nil, "apply", "--server-side", forceConflicts, "--dry-run=server", "-k", dir, "-o", "yaml")
	// What the server would store: kustomize's namespace on the
	// cluster-scoped policies is dropped (the README says so).
	var list struct {
		Items []unstructured.Unstructured `json:"items"`
	}
	if err := yaml.Unmarshal([]byte(out), &list); err != nil {
		t.Fatal(err)
	}
	policies := 0
	for _, o := range list.Items {
		if strings.HasPrefix(o.GetKind(), "ValidatingAdmissionPolicy") {
			policies++
			if o.GetNamespace() != "" {
				t.Errorf("the API server keeps namespace %q on %s %s", o.GetNamespace(), o.GetKind(), o.GetName())
			}
		}
	}
	if policies != 8 {
		t.Errorf("the dry run returned %d admission policies and bindings, want 8", policies)
	}
}

// varRefRE is a $(NAME) reference kubelet expands in command and args.
var varRefRE = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

// TestArgsReferToEnv: every $(NAME) in a tabby-node container's command
// and args (the namespace and the pool CIDR come so) is an env variable of
// that container; kubelet leaves an undefined one as it is, and tabbyd
// would get the text "$(POD_NAMESPACE)" for a namespace.
func TestArgsReferToEnv(t *testing.T) {
	refs := 0
	for _, o := range rendered(t, RenderOptions{}) {
		if o.GetKind() != "DaemonSet" {
			continue
		}
		for _, list := range []string{"initContainers", "containers"} {
			cs, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", list)
			for _, c := range cs {
				c := c.(map[string]any)
				defined := map[string]bool{}
				env, _ := c["env"].([]any)
				for _, e := range env {
					defined[e.(map[string]any)["name"].(string)] = true
				}
				words := append(stringSlice(c["command"]), stringSlice(c["args"])...)
				for _, w := range words {
					for _, m := range varRefRE.FindAllStringSubmatch(w, -1) {
						refs++
						if !defined[m[1]] {
							t.Errorf("container %s: %q refers to $(%s), which is not in its env", c["name"], w, m[1])
						}
					}
				}
			}
		}
	}
	if refs < 3 {
		t.Errorf("found %d $(NAME) references, want the namespace in both containers and the pool CIDR", refs)
	}
}

func stringSlice(v any) []string {
	l, _ := v.([]any)
	out := make([]string, 0, len(l))
	for _, s := range l {
		out = append(out, fmt.Sprint(s))
	}
	return out
}

// TestNodePoliciesFollowNamespace: with tabby installed in another
// namespace (an overlay's namespace:), the admission policies still hold
// its tabby-node to its own Node: they match the service account tabby-node
// of any namespace, not only tabby-system's.
func TestNodePoliciesFollowNamespace(t *testing.T) {
	ensureApplied(t) // the policies, as tabby.yaml has them
	const ns = "tabby-moved"
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	admin := clientset(t)
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{}) })
	if _, err := admin.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "tabby-node"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The ClusterRoleBinding as the overlay renders it.
	crb := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "tabby-node-" + ns},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "tabby-node"},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: "tabby-node", Namespace: ns}}}
	if _, err := admin.RbacV1().ClusterRoleBindings().Create(ctx, crb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = admin.RbacV1().ClusterRoleBindings().Delete(context.Background(), crb.Name, metav1.DeleteOptions{})
	})
	for _, n := range []string{"moved-x", "moved-y"} {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n, Annotations: map[string]string{"tabby.io/ipv4-address": "192.0.2.1/24"}}}
		if _, err := admin.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = admin.CoreV1().Nodes().Delete(context.Background(), n, metav1.DeleteOptions{}) })
	}
	// The token kubelet mounts into a tabby-node pod of moved-x.
	pod, err := admin.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "tabby-node-moved-x"},
		Spec: corev1.PodSpec{NodeName: "moved-x", ServiceAccountName: "tabby-node", AutomountServiceAccountToken: ptr.To(false),
			Containers: []corev1.Container{{Name: "tabbyd", Image: "example.invalid/tabby"}}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tr, err := admin.CoreV1().ServiceAccounts(ns).CreateToken(ctx, "tabby-node", &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		ExpirationSeconds: ptr.To(int64(600)),
		BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
	}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	x := tokenClient(t, tr.Status.Token)
	annotate := func(node, addr string) error {
		patch := []byte(`{"metadata":{"annotations":{"tabby.io/ipv4-address":"` + addr + `"}}}`)
		_, err := x.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, patch, metav1.PatchOptions{}, "status")
		return err
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := annotate("moved-y", "192.0.2.66/24")
		if apierrors.IsForbidden(err) || apierrors.IsInvalid(err) {
			if !strings.Contains(err.Error(), "tabby-node on node moved-x may change only its own Node, not moved-y") {
				t.Errorf("refused with %v, want the policy's message", err)
			}
			break
		}
		if err == nil {
			t.Fatalf("tabby-node of %s on moved-x rewrote moved-y's BGP identity: the policy does not follow the namespace", ns)
		}
		if time.Now().After(deadline) {
			t.Fatalf("annotating moved-y: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err := annotate("moved-x", "192.0.2.10/24"); err != nil {
		t.Errorf("tabby-node of %s publishing its own node's identity: %v", ns, err)
	}
}
