package datastore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
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
//
// Its list and watch keep trying, every RetryUnreachable, while the API
// server does not answer, instead of returning the error to client-go's
// reflector: the reflector backs off exponentially on errors (up to 30 s,
// and twice that with its jitter), so after an outage of 20 s an informer
// could go on missing every change for up to a minute once the API server
// was back (pods created then could not start: tabbyd's policy loop did
// not see them). Answers of the API server (410 Gone, 403, 429) still go
// to the reflector, which knows what to do with them.
func NewInformer[L runtime.Object](example runtime.Object, c ListWatcher[L], restrict func(*metav1.ListOptions), idx cache.Indexers) cache.SharedIndexInformer {
	if restrict == nil {
		restrict = func(*metav1.ListOptions) {}
	}
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			restrict(&o)
			return patiently(ctx, func() (runtime.Object, error) { return c.List(ctx, o) })
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			restrict(&o)
			return patiently(ctx, func() (watch.Interface, error) { return c.Watch(ctx, o) })
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

// RetryUnreachable is how often an informer's list or watch is tried
// again while the API server does not answer.
const RetryUnreachable = time.Second

// patiently calls call until it succeeds, fails with an answer of the API
// server, or ctx ends, waiting RetryUnreachable between tries.
func patiently[T any](ctx context.Context, call func() (T, error)) (T, error) {
	for {
		v, err := call()
		if err == nil || !retryable(err) || ctx.Err() != nil {
			return v, err
		}
		select {
		case <-ctx.Done():
			return v, err
		case <-time.After(RetryUnreachable):
		}
	}
}

// retryable says whether an informer's list or watch should be tried
// again at once rather than handed to the reflector: the API server did not
// answer (IsUnreachable), except when it said it is too busy (429), for
// which the reflector's back-off is right.
func retryable(err error) bool {
	if apierrors.IsTooManyRequests(err) {
		return false
	}
	return IsUnreachable(err) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}
