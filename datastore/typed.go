package datastore

import (
	"context"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
)

// Object is what a Resource's objects are: API objects with a name.
type Object interface {
	runtime.Object
	GetName() string
}

// Resource is a typed client of one resource (in one namespace, or
// cluster-wide): the calls of client-go's generated clients, with their
// requests, over a REST client of the resource's group.
//
// It is not client-go's gentype, whose package also holds its fake
// clients and so links client-go/testing into every program using it:
// with that comes managed fields, structured-merge-diff, OpenAPI and the
// protobuf runtime, 66 packages whose init took 6 of tabby-ipam's 17 ms
// of package initialisation, paid on every CNI call.
type Resource[T Object, L runtime.Object] struct {
	client    rest.Interface
	resource  string
	namespace string
	params    runtime.ParameterCodec
	newObject func() T
	newList   func() L
}

// NewResource returns the client of resource (its plural name) over
// client, in namespace ("" for a cluster-scoped resource, or every
// namespace's objects when listing a namespaced one), encoding options as
// query parameters with params. newObject and newList make the empty
// objects answers are decoded into.
func NewResource[T Object, L runtime.Object](resource string, client rest.Interface, params runtime.ParameterCodec, namespace string, newObject func() T, newList func() L) *Resource[T, L] {
	return &Resource[T, L]{client: client, resource: resource, namespace: namespace, params: params, newObject: newObject, newList: newList}
}

// request starts a request of verb for the resource.
func (r *Resource[T, L]) request(verb string) *rest.Request {
	return r.client.Verb(verb).NamespaceIfScoped(r.namespace, r.namespace != "").Resource(r.resource)
}

// timeout is a list or watch's own time limit, when it sets one.
func timeout(opts metav1.ListOptions) time.Duration {
	if opts.TimeoutSeconds == nil {
		return 0
	}
	return time.Duration(*opts.TimeoutSeconds) * time.Second
}

// Get reads the object name.
func (r *Resource[T, L]) Get(ctx context.Context, name string, opts metav1.GetOptions) (T, error) {
	out := r.newObject()
	err := r.request("GET").Name(name).VersionedParams(&opts, r.params).Do(ctx).Into(out)
	return out, err
}

// List lists the objects that opts select.
func (r *Resource[T, L]) List(ctx context.Context, opts metav1.ListOptions) (L, error) {
	out := r.newList()
	err := r.request("GET").VersionedParams(&opts, r.params).Timeout(timeout(opts)).Do(ctx).Into(out)
	return out, err
}

// Watch watches the objects that opts select.
func (r *Resource[T, L]) Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	opts.Watch = true
	return r.request("GET").VersionedParams(&opts, r.params).Timeout(timeout(opts)).Watch(ctx)
}

// Create creates obj and returns it as stored.
func (r *Resource[T, L]) Create(ctx context.Context, obj T, opts metav1.CreateOptions) (T, error) {
	out := r.newObject()
	err := r.request("POST").VersionedParams(&opts, r.params).Body(obj).Do(ctx).Into(out)
	return out, err
}

// Update replaces obj (the object of its name) and returns it as stored.
func (r *Resource[T, L]) Update(ctx context.Context, obj T, opts metav1.UpdateOptions) (T, error) {
	out := r.newObject()
	err := r.request("PUT").Name(obj.GetName()).VersionedParams(&opts, r.params).Body(obj).Do(ctx).Into(out)
	return out, err
}

// UpdateStatus replaces obj's status subresource and returns the object
// as stored.
func (r *Resource[T, L]) UpdateStatus(ctx context.Context, obj T, opts metav1.UpdateOptions) (T, error) {
	out := r.newObject()
	err := r.request("PUT").Name(obj.GetName()).SubResource("status").VersionedParams(&opts, r.params).Body(obj).Do(ctx).Into(out)
	return out, err
}

// Delete deletes the object name.
func (r *Resource[T, L]) Delete(ctx context.Context, name string, opts metav1.DeleteOptions) error {
	return r.request("DELETE").Name(name).Body(&opts).Do(ctx).Error()
}

// DeleteCollection deletes the objects that listOpts select.
func (r *Resource[T, L]) DeleteCollection(ctx context.Context, opts metav1.DeleteOptions, listOpts metav1.ListOptions) error {
	return r.request("DELETE").VersionedParams(&listOpts, r.params).Timeout(timeout(listOpts)).Body(&opts).Do(ctx).Error()
}

// Patch patches the object name (or its subresource) with data, a patch
// of type pt, and returns the object as stored.
func (r *Resource[T, L]) Patch(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions, subresources ...string) (T, error) {
	out := r.newObject()
	err := r.client.Patch(pt).NamespaceIfScoped(r.namespace, r.namespace != "").Resource(r.resource).Name(name).
		SubResource(subresources...).VersionedParams(&opts, r.params).Body(data).Do(ctx).Into(out)
	return out, err
}
