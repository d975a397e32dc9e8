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
