package datastore_test

import (
	"context"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"

	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/internal/controlplane/clustertest"
)

// TestResource makes every call of a Resource against the real API
// server, on Pods of two namespaces, and checks what each one did: the
// namespace scoping, selectors, the status subresource, patches, a watch
// and a collection delete that must spare what it does not select.
func TestResource(t *testing.T) {
	c := clustertest.Cluster(t)
	ds, err := datastore.New(c.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, ns := range []string{"typed-a", "typed-b"} {
		if _, err := ds.Namespaces.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = ds.Namespaces.Delete(context.Background(), ns, metav1.DeleteOptions{}) })
		// Admission wants the pods' service account (a bare API server
		// has no controller making it).
		sa := datastore.NewResource("serviceaccounts", ds.CoreREST(), datastore.ParameterCodec, ns,
			func() *corev1.ServiceAccount { return &corev1.ServiceAccount{} }, func() *corev1.ServiceAccountList { return &corev1.ServiceAccountList{} })
		if _, err := sa.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	pod := func(name string, lbl map[string]string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: lbl},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "pause"}}}}
	}
	a, b := ds.Pods("typed-a"), ds.Pods("typed-b")
	names := func(l *corev1.PodList) []string {
		var out []string
		for _, p := range l.Items {
			out = append(out, p.Namespace+"/"+p.Name)
		}
		slices.Sort(out)
		return out
	}

	// Create, in a namespace; Get; a missing object is NotFound.
	p1, err := a.Create(ctx, pod("p1", map[string]string{"app": "x"}), metav1.CreateOptions{})
	if err != nil || p1.Namespace != "typed-a" || p1.UID == "" {
		t.Fatalf("create: %v %+v", err, p1.ObjectMeta)
	}
	for _, p := range []struct {
		c    *datastore.PodClient
		name string
		lbl  map[string]string
	}{{a, "p2", map[string]string{"app": "y"}}, {b, "p3", map[string]string{"app": "x"}}} {
		if _, err := p.c.Create(ctx, pod(p.name, p.lbl), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := a.Get(ctx, "p1", metav1.GetOptions{}); err != nil || got.UID != p1.UID {
		t.Fatalf("get: %v", err)
	}
	if _, err := b.Get(ctx, "p1", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("get of another namespace's pod: %v, want NotFound", err)
	}

	// List: one namespace, a selector, every namespace.
	for _, l := range []struct {
		c    *datastore.PodClient
		opts metav1.ListOptions
		want []string
	}{
		{a, metav1.ListOptions{}, []string{"typed-a/p1", "typed-a/p2"}},
		{a, metav1.ListOptions{LabelSelector: "app=x"}, []string{"typed-a/p1"}},
		{ds.Pods(""), metav1.ListOptions{LabelSelector: "app=x", TimeoutSeconds: ptr.To[int64](10)}, []string{"typed-a/p1", "typed-b/p3"}},
	} {
		got, err := l.c.List(ctx, l.opts)
		if err != nil || !slices.Equal(names(got), l.want) {
			t.Errorf("list %+v: %v %v, want %v", l.opts, names(got), err, l.want)
		}
	}

	// A watch from p1's version sees the changes below, in order.
	w, err := a.Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=p1", ResourceVersion: p1.ResourceVersion, TimeoutSeconds: ptr.To[int64](60)})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()

	// Update the object; the status subresource; patch it; patch its status.
	p1.Labels["tier"] = "web"
	if p1, err = a.Update(ctx, p1, metav1.UpdateOptions{}); err != nil || p1.Labels["tier"] != "web" {
		t.Fatalf("update: %v", err)
	}
	p1.Status.Message = "status written"
	if p1, err = a.UpdateStatus(ctx, p1, metav1.UpdateOptions{}); err != nil || p1.Status.Message != "status written" {
		t.Fatalf("update status: %v %q", err, p1.Status.Message)
	}
	if p1, err = a.Patch(ctx, "p1", types.MergePatchType, []byte(`{"metadata":{"labels":{"patched":"yes"}}}`), metav1.PatchOptions{}); err != nil || p1.Labels["patched"] != "yes" || p1.Labels["tier"] != "web" {
		t.Fatalf("patch: %v %v", err, p1.Labels)
	}
	if p1, err = a.Patch(ctx, "p1", types.MergePatchType, []byte(`{"status":{"message":"patched"}}`), metav1.PatchOptions{}, "status"); err != nil || p1.Status.Message != "patched" {
		t.Fatalf("patch status: %v %q", err, p1.Status.Message)
	}
	var seen []string
	for len(seen) < 4 {
		select {
		case ev := <-w.ResultChan():
			p, ok := ev.Object.(*corev1.Pod)
			if ev.Type != watch.Modified || !ok {
				t.Fatalf("watch: %s %T", ev.Type, ev.Object)
			}
			seen = append(seen, p.Labels["patched"]+"|"+p.Status.Message)
		case <-time.After(30 * time.Second):
			t.Fatalf("watch saw %v of 4 changes in 30 s", seen)
		}
	}
	if want := []string{"|", "|status written", "yes|status written", "yes|patched"}; !slices.Equal(seen, want) {
		t.Errorf("watch saw %q, want %q", seen, want)
	}

	// DeleteCollection deletes what it selects, in its namespace only;
	// Delete deletes one.
	if err := a.DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}, metav1.ListOptions{LabelSelector: "app=x"}); err != nil {
		t.Fatal(err)
	}
	if err := a.Delete(ctx, "p2", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		t.Fatal(err)
	}
	// A bare API server has no kubelet to finish a pod's graceful
	// deletion: a pod that is still there must at least be marked.
	left, err := ds.Pods("").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range left.Items {
		gone := p.DeletionTimestamp != nil
		if want := p.Namespace == "typed-a"; gone != want {
			t.Errorf("%s/%s: deleted %v, want %v", p.Namespace, p.Name, gone, want)
		}
	}
	if got := names(left); !slices.Contains(got, "typed-b/p3") {
		t.Errorf("after deleting typed-a's pods, left: %v; typed-b/p3 must stay", got)
	}
	if err := b.Delete(ctx, "p3", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		t.Fatal(err)
	}
}
