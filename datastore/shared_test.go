package datastore

import (
	"testing"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	tabbyv1 "github.com/tabbynet/tabby/api/v1"
)

// TestInformersShared: a set hands out one informer per resource, and
// Run starts each of its informers once however many components ask,
// while an informer that is not the set's is started every time.
func TestInformersShared(t *testing.T) {
	ds, err := New(&rest.Config{Host: "https://127.0.0.1:1"}) // never dialled
	if err != nil {
		t.Fatal(err)
	}
	s := NewInformers(ds)
	get := map[string]func() cache.SharedIndexInformer{"nodes": s.Nodes, "namespaces": s.Namespaces, "ippools": s.IPPools, "ipamblocks": s.IPAMBlocks}
	seen := map[cache.SharedIndexInformer]string{}
	for name, f := range get {
		a, b := f(), f()
		if a != b {
			t.Errorf("%s: two informers", name)
		}
		if other, ok := seen[a]; ok {
			t.Errorf("%s and %s share an informer", name, other)
		}
		seen[a] = name
		if !s.claim(a) {
			t.Errorf("%s: the first Run does not start it", name)
		}
		if s.claim(b) {
			t.Errorf("%s: a second Run starts it again", name)
		}
	}
	own := NewInformer(&tabbyv1.IPPool{}, ds.IPPools, nil, nil)
	if !s.claim(own) || !s.claim(own) {
		t.Error("an informer not of the set is not started")
	}
}
