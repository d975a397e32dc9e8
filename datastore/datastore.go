// Package datastore is the one way tabby reaches its datastore, the
// Kubernetes API: tabby's own resources (CRDs of tabby.io/v1) and the core
// objects it reads (Pods, Namespaces, Nodes), through client-go.
//
// It deliberately avoids k8s.io/client-go/kubernetes: the CNI plugin is a
// short-lived process started for every pod, and registering every API group
// of the full clientset would cost it milliseconds per call. The typed
// clients here are Resources (typed.go) over a small scheme.
package datastore

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	tabbyv1 "github.com/tabbynet/tabby/api/v1"
)

// Scheme knows tabby's types and the core types tabby reads.
var Scheme = runtime.NewScheme()

// Codecs serialises objects of Scheme.
var Codecs = serializer.NewCodecFactory(Scheme)

// ParameterCodec encodes list/get options as query parameters.
var ParameterCodec = runtime.NewParameterCodec(Scheme)

func init() {
	if err := tabbyv1.AddToScheme(Scheme); err != nil {
		panic(err)
	}
	if err := corev1.AddToScheme(Scheme); err != nil {
		panic(err)
	}
}

// Typed client aliases for tabby's resources and the core objects tabby reads.
type (
	IPPoolClient            = Resource[*tabbyv1.IPPool, *tabbyv1.IPPoolList]
	IPAMBlockClient         = Resource[*tabbyv1.IPAMBlock, *tabbyv1.IPAMBlockList]
	BlockAffinityClient     = Resource[*tabbyv1.BlockAffinity, *tabbyv1.BlockAffinityList]
	IPAMHandleClient        = Resource[*tabbyv1.IPAMHandle, *tabbyv1.IPAMHandleList]
	IPAMConfigurationClient = Resource[*tabbyv1.IPAMConfiguration, *tabbyv1.IPAMConfigurationList]
	BGPConfigurationClient  = Resource[*tabbyv1.BGPConfiguration, *tabbyv1.BGPConfigurationList]
	BGPPeerClient           = Resource[*tabbyv1.BGPPeer, *tabbyv1.BGPPeerList]
	BGPFilterClient         = Resource[*tabbyv1.BGPFilter, *tabbyv1.BGPFilterList]
	PodClient               = Resource[*corev1.Pod, *corev1.PodList]
	NamespaceClient         = Resource[*corev1.Namespace, *corev1.NamespaceList]
	NodeClient              = Resource[*corev1.Node, *corev1.NodeList]
)

// Client reaches tabby's resources and the core objects through one API server.
type Client struct {
	IPPools            *IPPoolClient
	IPAMBlocks         *IPAMBlockClient
	BlockAffinities    *BlockAffinityClient
	IPAMHandles        *IPAMHandleClient
	IPAMConfigurations *IPAMConfigurationClient
	BGPConfigurations  *BGPConfigurationClient
	BGPPeers           *BGPPeerClient
	BGPFilters         *BGPFilterClient
	Namespaces         *NamespaceClient
	Nodes              *NodeClient

	tabby rest.Interface
	core  rest.Interface
	host  string
}

// Pods returns the Pod client of one namespace.
func (c *Client) Pods(namespace string) *PodClient {
	return NewResource[*corev1.Pod, *corev1.PodList]("pods", c.core, ParameterCodec, namespace,
		func() *corev1.Pod { return &corev1.Pod{} }, func() *corev1.PodList { return &corev1.PodList{} })
}

// CoreREST is the REST client of the core group (/api/v1), for what the typed
// clients do not cover.
func (c *Client) CoreREST() rest.Interface { return c.core }

// Host is the API server address this client talks to.
func (c *Client) Host() string { return c.host }

// LoadConfig finds the API server: the kubeconfig file named (the CNI config's
// "kubeconfig", a --kubeconfig flag), else the in-cluster service account,
// else $KUBECONFIG.
func LoadConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig != "" {
		cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("loading kubeconfig %s: %w (check that the file exists and names a reachable API server)", kubeconfig, err)
		}
		return cfg, nil
	}
	if cfg, err := rest.InClusterConfig(); err == nil {
		return cfg, nil
	}
	if env := os.Getenv("KUBECONFIG"); env != "" {
		cfg, err := clientcmd.BuildConfigFromFlags("", env)
		if err != nil {
			return nil, fmt.Errorf("loading kubeconfig from $KUBECONFIG (%s): %w", env, err)
		}
		return cfg, nil
	}
	return nil, errors.New("no kubeconfig given: pass --kubeconfig (or the CNI config key \"kubeconfig\"), run in a pod with a service account, or set $KUBECONFIG")
}

// New builds a Client from a rest.Config.
func New(cfg *rest.Config) (*Client, error) {
	base := rest.CopyConfig(cfg)
	if base.UserAgent == "" {
		base.UserAgent = "tabby"
	}
	if base.QPS == 0 {
		base.QPS = 100
		base.Burst = 200
	}
	tabbyCfg := rest.CopyConfig(base)
	tabbyCfg.GroupVersion = &tabbyv1.SchemeGroupVersion
	tabbyCfg.APIPath = "/apis"
	tabbyCfg.NegotiatedSerializer = Codecs.WithoutConversion()
	tabbyCfg.ContentType = runtime.ContentTypeJSON
	coreCfg := rest.CopyConfig(base)
	coreCfg.GroupVersion = &schema.GroupVersion{Version: "v1"}
	coreCfg.APIPath = "/api"
	coreCfg.NegotiatedSerializer = Codecs.WithoutConversion()
	coreCfg.ContentType = runtime.ContentTypeJSON
	// One HTTP client (one TLS connection pool) serves both groups, and the
	// first request opens the one connection the others then share.
	tabbyCfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return &firstDialGate{next: rt, ready: make(chan struct{})}
	})
	httpClient, err := rest.HTTPClientFor(tabbyCfg)
	if err != nil {
		return nil, fmt.Errorf("building the HTTP client: %w", err)
	}
	coreREST, err := rest.RESTClientForConfigAndClient(coreCfg, httpClient)
	if err != nil {
		return nil, fmt.Errorf("building the core client: %w", err)
	}
	tabbyREST, err := rest.RESTClientForConfigAndClient(tabbyCfg, httpClient)
	if err != nil {
		return nil, fmt.Errorf("building the tabby.io client: %w", err)
	}
	return newClient(tabbyREST, coreREST, cfg.Host), nil
}

// GroupREST is a REST client of one more API group (gv, under /apis) on
// the API server of cfg, decoding with s: for the groups tabbyd reads that
// the datastore's scheme leaves out (Leases), without client-go's typed
// clientset, whose scheme registers every API group of Kubernetes.
func GroupREST(cfg *rest.Config, gv schema.GroupVersion, s *runtime.Scheme) (rest.Interface, error) {
	c := rest.CopyConfig(cfg)
	if c.UserAgent == "" {
		c.UserAgent = "tabby"
	}
	c.GroupVersion = &gv
	c.APIPath = "/apis"
	c.NegotiatedSerializer = serializer.NewCodecFactory(s).WithoutConversion()
	c.ContentType = runtime.ContentTypeJSON
	rc, err := rest.RESTClientFor(c)
	if err != nil {
		return nil, fmt.Errorf("building the %s client: %w", gv, err)
	}
	return rc, nil
}

func newClient(tabbyREST, coreREST rest.Interface, host string) *Client {
	pc := ParameterCodec
	return &Client{
		IPPools: NewResource[*tabbyv1.IPPool, *tabbyv1.IPPoolList]("ippools", tabbyREST, pc, "",
			func() *tabbyv1.IPPool { return &tabbyv1.IPPool{} }, func() *tabbyv1.IPPoolList { return &tabbyv1.IPPoolList{} }),
		IPAMBlocks: NewResource[*tabbyv1.IPAMBlock, *tabbyv1.IPAMBlockList]("ipamblocks", tabbyREST, pc, "",
			func() *tabbyv1.IPAMBlock { return &tabbyv1.IPAMBlock{} }, func() *tabbyv1.IPAMBlockList { return &tabbyv1.IPAMBlockList{} }),
		BlockAffinities: NewResource[*tabbyv1.BlockAffinity, *tabbyv1.BlockAffinityList]("blockaffinities", tabbyREST, pc, "",
			func() *tabbyv1.BlockAffinity { return &tabbyv1.BlockAffinity{} }, func() *tabbyv1.BlockAffinityList { return &tabbyv1.BlockAffinityList{} }),
		IPAMHandles: NewResource[*tabbyv1.IPAMHandle, *tabbyv1.IPAMHandleList]("ipamhandles", tabbyREST, pc, "",
			func() *tabbyv1.IPAMHandle { return &tabbyv1.IPAMHandle{} }, func() *tabbyv1.IPAMHandleList { return &tabbyv1.IPAMHandleList{} }),
		IPAMConfigurations: NewResource[*tabbyv1.IPAMConfiguration, *tabbyv1.IPAMConfigurationList]("ipamconfigurations", tabbyREST, pc, "",
			func() *tabbyv1.IPAMConfiguration { return &tabbyv1.IPAMConfiguration{} }, func() *tabbyv1.IPAMConfigurationList { return &tabbyv1.IPAMConfigurationList{} }),
		BGPConfigurations: NewResource[*tabbyv1.BGPConfiguration, *tabbyv1.BGPConfigurationList]("bgpconfigurations", tabbyREST, pc, "",
			func() *tabbyv1.BGPConfiguration { return &tabbyv1.BGPConfiguration{} }, func() *tabbyv1.BGPConfigurationList { return &tabbyv1.BGPConfigurationList{} }),
		BGPPeers: NewResource[*tabbyv1.BGPPeer, *tabbyv1.BGPPeerList]("bgppeers", tabbyREST, pc, "",
			func() *tabbyv1.BGPPeer { return &tabbyv1.BGPPeer{} }, func() *tabbyv1.BGPPeerList { return &tabbyv1.BGPPeerList{} }),
		BGPFilters: NewResource[*tabbyv1.BGPFilter, *tabbyv1.BGPFilterList]("bgpfilters", tabbyREST, pc, "",
			func() *tabbyv1.BGPFilter { return &tabbyv1.BGPFilter{} }, func() *tabbyv1.BGPFilterList { return &tabbyv1.BGPFilterList{} }),
		Namespaces: NewResource[*corev1.Namespace, *corev1.NamespaceList]("namespaces", coreREST, pc, "",
			func() *corev1.Namespace { return &corev1.Namespace{} }, func() *corev1.NamespaceList { return &corev1.NamespaceList{} }),
		Nodes: NewResource[*corev1.Node, *corev1.NodeList]("nodes", coreREST, pc, "",
			func() *corev1.Node { return &corev1.Node{} }, func() *corev1.NodeList { return &corev1.NodeList{} }),
		tabby: tabbyREST,
		core:  coreREST,
		host:  host,
	}
}

// firstDialGate holds back requests made while the first one is in flight.
// A fresh client that sends several requests at once (the CNI plugin reads
// the pod, its namespace, the pools and the node's blocks concurrently)
// would otherwise open one TLS connection for each, paying a handshake for
// every one; once the first response arrives its HTTP/2 connection is pooled
// and carries the rest.
type firstDialGate struct {
	next    http.RoundTripper
	started atomic.Bool
	ready   chan struct{}
}

func (g *firstDialGate) RoundTrip(req *http.Request) (*http.Response, error) {
	if g.started.CompareAndSwap(false, true) {
		defer close(g.ready)
		return g.next.RoundTrip(req)
	}
	select {
	case <-g.ready:
	case <-req.Context().Done():
		return nil, req.Context().Err()
	}
	return g.next.RoundTrip(req)
}

// WrappedRoundTripper lets client-go's debugging wrappers see through the gate.
func (g *firstDialGate) WrappedRoundTripper() http.RoundTripper { return g.next }

// Ping checks that the API server answers and tabby's CRDs are installed,
// within the context's deadline.
func (c *Client) Ping(ctx context.Context) error {
	if err := c.core.Get().AbsPath("/readyz").Do(ctx).Error(); err != nil {
		return Unreachable(c.host, err)
	}
	return nil
}

// Unreachable wraps an error talking to the API server with what to check.
func Unreachable(host string, err error) error {
	return fmt.Errorf("the Kubernetes API server at %s cannot be reached: %w (check that it is running and that the kubeconfig points at it)", host, err)
}

// IsUnreachable tells errors of a datastore that is down (connection refused,
// timeouts, server unavailable) from answers such as NotFound or Conflict.
func IsUnreachable(err error) bool {
	if err == nil {
		return false
	}
	if apierrors.IsServiceUnavailable(err) || apierrors.IsTimeout(err) || apierrors.IsServerTimeout(err) || apierrors.IsTooManyRequests(err) {
		return true
	}
	var ne net.Error
	if errors.As(err, &ne) {
		return true
	}
	if errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	return strings.Contains(err.Error(), "connection refused")
}

// Timeout bounds one call to the datastore when the caller gave no deadline.
const Timeout = 10 * time.Second
