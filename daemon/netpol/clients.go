package netpol

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	cnpv1 "github.com/tabbynet/tabby/api/cnp/v1beta1"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/datastore/events"
)

// Scheme knows the objects the controller reads and refers to in Events:
// the core types and NetworkPolicies. (The datastore's scheme leaves
// NetworkPolicies out: the CNI plugins never read them.)
var Scheme = runtime.NewScheme()

func init() {
	if err := corev1.AddToScheme(Scheme); err != nil {
		panic(err)
	}
	if err := networkingv1.AddToScheme(Scheme); err != nil {
		panic(err)
	}
}

// PolicyClient reaches the NetworkPolicies of one namespace, or lists and
// watches those of every namespace.
type PolicyClient = datastore.Resource[*networkingv1.NetworkPolicy, *networkingv1.NetworkPolicyList]

// NewPolicyClient is a client of the NetworkPolicies (networking.k8s.io/v1)
// of namespace (metav1.NamespaceAll: of every namespace) on the API server
// of rc.
func NewPolicyClient(rc *rest.Config, namespace string) (*PolicyClient, error) {
	cfg := rest.CopyConfig(rc)
	if cfg.UserAgent == "" {
		cfg.UserAgent = "tabbyd"
	}
	rcl, err := datastore.GroupREST(cfg, networkingv1.SchemeGroupVersion, Scheme)
	if err != nil {
		return nil, err
	}
	return datastore.NewResource[*networkingv1.NetworkPolicy, *networkingv1.NetworkPolicyList]("networkpolicies", rcl,
		runtime.NewParameterCodec(Scheme), namespace,
		func() *networkingv1.NetworkPolicy { return &networkingv1.NetworkPolicy{} },
		func() *networkingv1.NetworkPolicyList { return &networkingv1.NetworkPolicyList{} }), nil
}

// NewRecorder is an Event recorder writing to the datastore as component
// tabbyd on host node; stop ends its writer.
func NewRecorder(ds *datastore.Client, node string, log *slog.Logger) (rec *events.Writer, stop func()) {
	w := events.New(events.Options{DS: ds, Scheme: Scheme, Source: corev1.EventSource{Component: "tabbyd", Host: node}, Log: log})
	return w, w.Stop
}

// ClusterPolicyClient lists and watches the ClusterNetworkPolicies
// (policy.networking.k8s.io/v1beta1) as unstructured objects, which the
// controller decodes into tabby's mirror of the API (api/cnp/v1beta1): an
// object that does not decode is reported, not a stuck informer.
//
// Where the CRD is not installed, List answers an empty list and Watch a
// quiet watch that looks for the resource every crdRecheck and, once it
// is served, ends with 410 Expired, which makes the informer list again:
// a cluster without ClusterNetworkPolicy still gets its NetworkPolicies
// enforced, without a failed watch in the log every back-off, and one
// that installs the CRD later gets its policies without a restart of
// tabbyd.
type ClusterPolicyClient struct {
	ri dynamic.ResourceInterface
	// missing is set while the API server does not serve the resource.
	missing atomic.Bool
	// recheck is how often a quiet watch looks for the resource;
	// crdRecheck when 0.
	recheck time.Duration
}

// crdRecheck is how often tabbyd looks for the ClusterNetworkPolicy CRD
// while it is not installed.
const crdRecheck = 30 * time.Second

// NewClusterPolicyClient is a ClusterPolicyClient on the API server of rc.
func NewClusterPolicyClient(rc *rest.Config) (*ClusterPolicyClient, error) {
	cfg := rest.CopyConfig(rc)
	if cfg.UserAgent == "" {
		cfg.UserAgent = "tabbyd"
	}
	dc, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("building the policy.networking.k8s.io client: %w", err)
	}
	return &ClusterPolicyClient{ri: dc.Resource(cnpv1.GroupVersionResource)}, nil
}

// List lists every ClusterNetworkPolicy; none where the CRD is missing.
func (c *ClusterPolicyClient) List(ctx context.Context, opts metav1.ListOptions) (*unstructured.UnstructuredList, error) {
	l, err := c.ri.List(ctx, opts)
	if apierrors.IsNotFound(err) {
		c.missing.Store(true)
		return &unstructured.UnstructuredList{}, nil
	}
	if err == nil {
		c.missing.Store(false)
	}
	return l, err
}

// Watch watches the ClusterNetworkPolicies; while the CRD is missing, it
// waits for it quietly (missingWatch).
func (c *ClusterPolicyClient) Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	if c.missing.Load() {
		return c.missingWatch(ctx), nil
	}
	return c.ri.Watch(ctx, opts)
}

// missingWatch is a watch without events that looks for the resource
// every recheck and, when the API server serves it (or answers anything
// but NotFound), sends 410 Expired and ends: the informer then lists
// again, finds the CRD and watches it for real.
func (c *ClusterPolicyClient) missingWatch(ctx context.Context) watch.Interface {
	ch := make(chan watch.Event)
	w := watch.NewProxyWatcher(ch)
	every := c.recheck
	if every <= 0 {
		every = crdRecheck
	}
	go func() {
		defer close(ch)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-w.StopChan():
				return
			case <-t.C:
			}
			if _, err := c.ri.List(ctx, metav1.ListOptions{Limit: 1}); apierrors.IsNotFound(err) {
				continue
			}
			// The next watch is a real one, whichever way the
			// informer starts again (a list, or a watch-list).
			c.missing.Store(false)
			gone := apierrors.NewResourceExpired("the ClusterNetworkPolicy resource is served now: list again")
			select {
			case ch <- watch.Event{Type: watch.Error, Object: &gone.ErrStatus}:
			case <-w.StopChan():
			case <-ctx.Done():
			}
			return
		}
	}()
	return w
}

// Missing says whether the last list found the CRD not installed.
func (c *ClusterPolicyClient) Missing() bool { return c.missing.Load() }
