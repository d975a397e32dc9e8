// Package testnet builds the network namespaces tabby's tests, benchmarks
// and demo run in: a node (a namespace with an uplink that leads nowhere, a
// forwarder to the API server on its loopback, a kubeconfig naming it, a
// Node object and a libcni runtime) and pods (namespaces the node's CNI
// plugins wire). It drives libcni as a container runtime on that node
// would: from a thread inside the node's namespace, so exec'd plugins run
// there. Nothing is ever wired into the host's own namespace.
//
// Everything is released by Close methods, which also undo a half-made
// node or pod: callers defer them (or hand them to t.Cleanup).
package testnet

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/internal/controlplane"
)

// ReferencePluginDir holds Debian's containernetworking-plugins.
const ReferencePluginDir = "/usr/lib/cni"

// Uplink is the name of a node's uplink: one end of a veth pair whose other
// end (Uplink+"-peer") stays in the node too, a NIC that leads nowhere (the
// kernel here has no dummy driver). The default routes point at it, so a
// packet to an unknown address dies there and never leaves the machine.
const Uplink = "uplink0"

// DefaultUplinkAddrs are a node's uplink addresses unless NodeOptions says.
var DefaultUplinkAddrs = []string{"10.254.0.1/24", "fd00:254::1/64"}

// NodeOptions configure NewNode.
type NodeOptions struct {
	// Name of the node (and of its Node object); required.
	Name string
	// Dir holds the node's files (kubeconfig, IPAM lock, CNI cache). Empty:
	// a new temporary folder that Close removes.
	Dir string
	// UplinkAddrs in CIDR notation; nil means DefaultUplinkAddrs. A default
	// route via the uplink is added for each family present.
	UplinkAddrs []string
	// UplinkMTU; 0 means 1500.
	UplinkMTU int
	// Sysctls to set in the node, e.g. {"net/ipv4/ip_forward": "1"}.
	Sysctls map[string]string
	// PluginDirs is libcni's search path for plugin binaries.
	PluginDirs []string
	// Cluster, when set, gives the node a forwarder to its API server, a
	// kubeconfig (Node.Kubeconfig) and a Node object with Labels.
	Cluster *controlplane.Cluster
	Labels  map[string]string
}

// Node is a network namespace standing for a Kubernetes node.
type Node struct {
	Name string
	NS   ns.NetNS
	// Dir holds Kubeconfig, LockFile, AgentSocket and the CNI cache.
	Dir        string
	Kubeconfig string // "" without NodeOptions.Cluster
	LockFile   string
	// AgentSocket is where the node's tabbyd serves its CNI agent
	// (StartTabbyd) and where TabbyConf's plugins look for it.
	AgentSocket string
	// IPv4 and IPv6 are the uplink's first address of each family (nil
	// when it has none).
	IPv4, IPv6 net.IP
	// CNI is the node's libcni runtime; use it only through Do.
	CNI *libcni.CNIConfig
	// DS is an admin client of the cluster, from the host (nil without
	// NodeOptions.Cluster).
	DS *datastore.Client

	closers []func() error

	// The forwarder to the API server: its address in the node, the API
	// server's, and how to stop it.
	apiListen, apiTarget string
	stopForward          func()
}

// NewNode makes a node namespace: lo up, the uplink with its addresses and
// default routes, the sysctls, and with a cluster the forwarder, kubeconfig
// and Node object. On error nothing it made is left.
func NewNode(ctx context.Context, opts NodeOptions) (_ *Node, err error) {
	if opts.Name == "" {
		return nil, errors.New("testnet: a node needs a name")
	}
	n := &Node{Name: opts.Name, Dir: opts.Dir}
	defer func() {
		if err != nil {
			_ = n.Close()
		}
	}()
	if n.Dir == "" {
		if n.Dir, err = os.MkdirTemp("", "tabby-node-"); err != nil {
			return nil, err
		}
		dir := n.Dir
		n.onClose(func() error { return os.RemoveAll(dir) })
	}
	n.LockFile = filepath.Join(n.Dir, "ipam-"+n.Name+".lock")
	n.AgentSocket = filepath.Join(n.Dir, "cni.sock")
	n.CNI = libcni.NewCNIConfigWithCacheDir(opts.PluginDirs, filepath.Join(n.Dir, "cni-cache"), nil)

	if n.NS, err = testutils.NewNS(); err != nil {
		return nil, fmt.Errorf("creating the namespace of node %s: %w", n.Name, err)
	}
	// Deleting the namespace deletes every host veth in it, and with them
	// the pod ends.
	n.onClose(func() error { return closeNS(n.NS) })
	if err := n.Do(func() error { return setupNode(n, opts) }); err != nil {
		return nil, fmt.Errorf("setting up the namespace of node %s: %w", n.Name, err)
	}
	if opts.Cluster != nil {
		if err := n.connect(ctx, opts.Cluster, opts.Labels); err != nil {
			return nil, err
		}
	}
	return n, nil
}

func (n *Node) onClose(f func() error) { n.closers = append(n.closers, f) }

// Close undoes what NewNode made, last first: the Node object, the
// forwarder, the namespace (with every veth in it) and the folder.
func (n *Node) Close() error {
	var errs []error
	for i := len(n.closers) - 1; i >= 0; i-- {
		errs = append(errs, n.closers[i]())
	}
	n.closers = nil
	return errors.Join(errs...)
}

// setupNode runs inside the node's namespace.
func setupNode(n *Node, opts NodeOptions) error {
	if err := linkUp("lo"); err != nil {
		return err
	}
	mtu := opts.UplinkMTU
	if mtu == 0 {
		mtu = 1500
	}
	up := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: Uplink, MTU: mtu}, PeerName: Uplink + "-peer"}
	if err := netlink.LinkAdd(up); err != nil {
		return fmt.Errorf("adding %s: %w", Uplink, err)
	}
	for _, name := range []string{Uplink + "-peer", Uplink} {
		if err := linkUp(name); err != nil {
			return err
		}
	}
	l, err := netlink.LinkByName(Uplink)
	if err != nil {
		return err
	}
	addrs := opts.UplinkAddrs
	if addrs == nil {
		addrs = DefaultUplinkAddrs
	}
	for _, s := range addrs {
		a, err := netlink.ParseAddr(s)
		if err != nil {
			return fmt.Errorf("uplink address %q: %w", s, err)
		}
		dst := &net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}
		if a.IP.To4() == nil {
			a.Flags |= 0x02 // IFA_F_NODAD: usable at once
			dst = &net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}
		}
		if err := netlink.AddrAdd(l, a); err != nil {
			return fmt.Errorf("adding %s to %s: %w", s, Uplink, err)
		}
		first := &n.IPv6
		if a.IP.To4() != nil {
			first = &n.IPv4
		}
		if *first != nil {
			continue
		}
		*first = a.IP
		if err := netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Dst: dst}); err != nil {
			return fmt.Errorf("adding the default route via %s: %w", Uplink, err)
		}
	}
	for name, value := range opts.Sysctls {
		if err := os.WriteFile("/proc/sys/"+name, []byte(value), 0o644); err != nil {
			return fmt.Errorf("setting %s: %w", name, err)
		}
	}
	return nil
}

func linkUp(name string) error {
	l, err := netlink.LinkByName(name)
	if err == nil {
		err = netlink.LinkSetUp(l)
	}
	if err != nil {
		return fmt.Errorf("bringing %s up: %w", name, err)
	}
	return nil
}

// connect gives the node its forwarder, kubeconfig and Node object.
func (n *Node) connect(ctx context.Context, c *controlplane.Cluster, labels map[string]string) error {
	u, err := url.Parse(c.Server)
	if err != nil {
		return err
	}
	listen, stop, err := controlplane.ForwardIntoNetNS(n.NS.Path(), u.Host)
	if err != nil {
		return fmt.Errorf("forwarding the API server into node %s: %w", n.Name, err)
	}
	n.apiListen, n.apiTarget, n.stopForward = listen, u.Host, stop
	n.onClose(func() error { n.stopForward(); return nil })
	n.Kubeconfig = filepath.Join(n.Dir, "tabby-kubeconfig")
	if err := c.WriteKubeconfig(n.Kubeconfig, "https://"+listen); err != nil {
		return err
	}
	if n.DS, err = datastore.New(c.RESTConfig()); err != nil {
		return err
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.Name, Labels: labels}}
	if _, err := n.DS.Nodes.Create(ctx, node, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating Node %s: %w", n.Name, err)
	}
	n.onClose(func() error {
		err := n.DS.Nodes.Delete(context.Background(), n.Name, metav1.DeleteOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return err
	})
	return nil
}

// CutAPIServer makes the API server unreachable from inside the node (and
// only from there): the forwarder stops, closing every connection through
// it, and connections to its address are refused. restore brings it back
// on the same address.
func (n *Node) CutAPIServer() (restore func() error) {
	n.stopForward()
	return func() error {
		var ln net.Listener
		err := n.Do(func() (err error) {
			ln, err = net.Listen("tcp", n.apiListen)
			return err
		})
		if err != nil {
			return fmt.Errorf("listening for the API server in node %s again: %w", n.Name, err)
		}
		n.stopForward = controlplane.Forward(ln, func(ctx context.Context) (net.Conn, error) {
			return (&net.Dialer{Timeout: 5 * time.Second}).DialContext(ctx, "tcp", n.apiTarget)
		})
		return nil
	}
}

// Do runs f on a thread inside the node's namespace; programs f starts run
// there too.
func (n *Node) Do(f func() error) error {
	return n.NS.Do(func(ns.NetNS) error { return f() })
}

// Add runs ADD of the list for p, as the runtime on this node would.
func (n *Node) Add(ctx context.Context, list *libcni.NetworkConfigList, p *Pod, caps map[string]any) (*current.Result, error) {
	var r types.Result
	err := n.Do(func() (err error) {
		r, err = n.CNI.AddNetworkList(ctx, list, p.RuntimeConf(caps))
		return err
	})
	if err != nil {
		return nil, err
	}
	res, err := current.NewResultFromResult(r)
	if err != nil {
		return nil, fmt.Errorf("converting the ADD result: %w", err)
	}
	return res, nil
}

// Check runs CHECK of the list for p.
func (n *Node) Check(ctx context.Context, list *libcni.NetworkConfigList, p *Pod, caps map[string]any) error {
	return n.Do(func() error { return n.CNI.CheckNetworkList(ctx, list, p.RuntimeConf(caps)) })
}

// Del runs DEL of the list for p.
func (n *Node) Del(ctx context.Context, list *libcni.NetworkConfigList, p *Pod, caps map[string]any) error {
	return n.Do(func() error { return n.CNI.DelNetworkList(ctx, list, p.RuntimeConf(caps)) })
}

// Status runs STATUS of the list.
func (n *Node) Status(ctx context.Context, list *libcni.NetworkConfigList) error {
	return n.Do(func() error { return n.CNI.GetStatusNetworkList(ctx, list) })
}

// GC runs GC of the list keeping the attachments of valid, as a runtime
// that lost its cache would: only the plugins' own GC decides what goes.
func (n *Node) GC(ctx context.Context, list *libcni.NetworkConfigList, valid ...*Pod) error {
	cache, err := os.MkdirTemp(n.Dir, "gc-cache-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(cache)
	fresh := libcni.NewCNIConfigWithCacheDir(n.CNI.Path, cache, nil)
	args := &libcni.GCArgs{}
	for _, p := range valid {
		args.ValidAttachments = append(args.ValidAttachments, types.GCAttachment{ContainerID: p.ContainerID, IfName: p.IfName})
	}
	return n.Do(func() error { return fresh.GCNetworkList(ctx, list, args) })
}

// CreatePodObject creates p's Pod object, bound to this node (one that
// already exists is kept, as for a new sandbox of the same pod).
func (n *Node) CreatePodObject(ctx context.Context, p *Pod, annotations map[string]string) error {
	_, err := n.DS.Pods(p.Namespace).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace, Annotations: annotations},
		Spec:       corev1.PodSpec{NodeName: n.Name, Containers: []corev1.Container{{Name: "c", Image: "registry.invalid/pause"}}},
	}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating Pod %s/%s: %w", p.Namespace, p.Name, err)
	}
	return nil
}

// DeletePodObject deletes p's Pod object at once; a missing one is fine.
func (n *Node) DeletePodObject(ctx context.Context, p *Pod) error {
	zero := int64(0)
	err := n.DS.Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting Pod %s/%s: %w", p.Namespace, p.Name, err)
	}
	return nil
}

// ReadSysctl reads /proc/sys/NAME inside a namespace.
func ReadSysctl(in ns.NetNS, name string) (string, error) {
	var v string
	err := in.Do(func(ns.NetNS) error {
		b, err := os.ReadFile("/proc/sys/" + name)
		v = strings.TrimSpace(string(b))
		return err
	})
	return v, err
}

func closeNS(n ns.NetNS) error {
	return errors.Join(n.Close(), testutils.UnmountNS(n))
}
