package datastore_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/internal/controlplane/clustertest"
)

// TestInformersOneCache: two components taking the namespaces from one set,
// each with its own handler and Run, share one cache without managed
// fields, and both hear of a new namespace.
func TestInformersOneCache(t *testing.T) {
	ds := clustertest.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s := datastore.NewInformers(ds)
	var heard [2]atomic.Int32
	infs := [2]cache.SharedIndexInformer{s.Namespaces(), s.Namespaces()}
	for i, inf := range infs {
		_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: func(o any) {
			if o.(*corev1.Namespace).Name == "shared-informers" {
				heard[i].Add(1)
			}
		}})
		s.Run(ctx, inf)
	}
	if !cache.WaitForCacheSync(ctx.Done(), infs[0].HasSynced) {
		t.Fatal("the namespaces did not sync")
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shared-informers"}}
	if _, err := ds.Namespaces.Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ds.Namespaces.Delete(context.Background(), ns.Name, metav1.DeleteOptions{}) })
	for {
		o, ok, _ := infs[1].GetStore().GetByKey(ns.Name)
		if ok && heard[0].Load() > 0 && heard[1].Load() > 0 {
			if m := o.(*corev1.Namespace).ManagedFields; len(m) != 0 {
				t.Errorf("the shared cache keeps managed fields: %v", m)
			}
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the new namespace reached the cache %v, the handlers %d and %d times", ok, heard[0].Load(), heard[1].Load())
		case <-time.After(10 * time.Millisecond):
		}
	}
}
