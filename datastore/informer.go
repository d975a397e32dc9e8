package datastore

import (
	"context"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
)

// ListWatcher is what the typed clients offer an informer.
type ListWatcher[L runtime.Object] interface {
	List(ctx context.Context, opts metav1.ListOptions) (L, error)
	Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
}

// NewInformer makes an informer of the objects c lists (example is one of
// them), restricted by restrict (nil: all of them), with the indexers idx.
func NewInformer[L runtime.Object](example runtime.Object, c ListWatcher[L], restrict func(*metav1.ListOptions), idx cache.Indexers) cache.SharedIndexInformer {
	if restrict == nil {
		restrict = func(*metav1.ListOptions) {}
	}
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			restrict(&o)
			return c.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			restrict(&o)
			return c.Watch(ctx, o)
		},
	}
	if idx == nil {
		idx = cache.Indexers{}
	}
	return cache.NewSharedIndexInformerWithOptions(lw, example, cache.SharedIndexInformerOptions{
		Indexers:          idx,
		ObjectDescription: fmt.Sprintf("%T", example),
	})
}

// OnChange calls onChange on every add and delete of inf's objects, and on
// the updates changed (nil: all) calls a change: the "something changed,
// sync again" of a level-triggered loop.
func OnChange(inf cache.SharedIndexInformer, onChange func(), changed func(old, new any) bool) {
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { onChange() },
		UpdateFunc: func(old, new any) {
			if changed == nil || changed(old, new) {
				onChange()
			}
		},
		DeleteFunc: func(any) { onChange() },
	})
}

// StripManagedFields is an informer transform that drops the managed
// fields, which nothing reads, from the cache.
func StripManagedFields(o any) (any, error) {
	if m, ok := o.(metav1.Object); ok {
		m.SetManagedFields(nil)
	}
	return o, nil
}

// StoreList lists an informer's objects of type T (the cache's own:
// read-only).
func StoreList[T any](inf cache.SharedIndexInformer) []*T {
	objs := inf.GetStore().List()
	out := make([]*T, 0, len(objs))
	for _, o := range objs {
		if v, ok := o.(*T); ok {
			out = append(out, v)
		}
	}
	return out
}
