package e2e

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	tabbyv1 "github.com/tabbynet/tabby/api/v1"
	"github.com/tabbynet/tabby/contract"
	"github.com/tabbynet/tabby/internal/controlplane/clustertest"
	"github.com/tabbynet/tabby/internal/testnet"
	"github.com/tabbynet/tabby/ipam"
	"github.com/tabbynet/tabby/plugin"
)

const (
	networkName = testnet.NetworkName
	uplinkMTU   = 1500
	// e2eNodeLabel ties a test's pools to its node, so tests do not see
	// each other's pools.
	e2eNodeLabel = "tabby.io/e2e-node"
)

var counter atomic.Int32

// testNode is a testnet node with tabby's IPAM beside it and the pools a
// test made for it.
type testNode struct {
	*testnet.Node
	ipam  *ipam.IPAM
	pools []string
}

// newNode makes a node namespace and a Node object labelled for its pools;
// the test's cleanup removes them.
func newNode(t *testing.T) *testNode {
	t.Helper()
	return newNodeWith(t, testnet.NodeOptions{})
}

// newNodeWith is newNode with opts: the name, labels and uplink addresses
// it gives are kept (unnamed: e2e-node-N, unlabelled: labelled for its
// pools), the rest is filled in.
func newNodeWith(t *testing.T, opts testnet.NodeOptions) *testNode {
	t.Helper()
	if opts.Name == "" {
		opts.Name = fmt.Sprintf("e2e-node-%d", counter.Add(1))
	}
	if opts.Labels == nil {
		opts.Labels = map[string]string{e2eNodeLabel: opts.Name}
	}
	opts.Cluster = clustertest.Cluster(t) // first: its setup sets cniBinDir and tabbydBin
	opts.Dir = t.TempDir()
	opts.PluginDirs = []string{cniBinDir, testnet.ReferencePluginDir}
	n, err := testnet.NewNode(ctxT(t), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := n.Close(); err != nil {
			t.Errorf("removing node %s: %v", opts.Name, err)
		}
	})
	return &testNode{Node: n, ipam: ipam.New(n.DS)}
}

// addPool creates an IPPool only this node may use. family is 4 or 6.
func (n *testNode) addPool(t *testing.T, family int, mutate func(*tabbyv1.IPPool)) *tabbyv1.IPPool {
	t.Helper()
	i := counter.Add(1)
	cidr := fmt.Sprintf("10.%d.%d.0/22", 100+i/64, (i%64)*4)
	if family == 6 {
		cidr = fmt.Sprintf("fd00:e2e:0:%x::/112", i)
	}
	p := &tabbyv1.IPPool{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("e2e-pool-%d", i)},
		Spec: tabbyv1.IPPoolSpec{
			CIDR:         cidr,
			NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{e2eNodeLabel: n.Name}},
		},
	}
	if mutate != nil {
		mutate(p)
	}
	var created *tabbyv1.IPPool
	var err error
	for deadline := time.Now().Add(30 * time.Second); ; {
		created, err = n.DS.IPPools.Create(context.Background(), p, metav1.CreateOptions{})
		// Right after kube-apiserver restarts (TestCNIStatus stops it), the
		// admission policies on IPPools deny everything until their
		// parameter informers have synced.
		if err == nil || !strings.Contains(err.Error(), "failed to configure policy") || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("creating IPPool %s (%s): %v", p.Name, cidr, err)
	}
	t.Cleanup(func() { _ = n.DS.IPPools.Delete(context.Background(), created.Name, metav1.DeleteOptions{}) })
	n.pools = append(n.pools, created.Name)
	return created
}

// conflist builds a network config list of the given plugins.
func conflist(t *testing.T, version string, plugins ...map[string]any) *libcni.NetworkConfigList {
	t.Helper()
	list, err := testnet.ConfList(version, plugins...)
	if err != nil {
		t.Fatal(err)
	}
	return list
}

// newPod makes a pod namespace. With a name, the runtime passes the pod
// identity (K8S_POD_NAMESPACE/K8S_POD_NAME) and a Pod object is created.
func newPod(t *testing.T, n *testNode, name string, annotations map[string]string) *testnet.Pod {
	t.Helper()
	namespace := ""
	if name != "" {
		namespace = "default"
	}
	p, err := testnet.NewPod(namespace, name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	if name != "" {
		if err := n.CreatePodObject(ctxT(t), p, annotations); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = n.DeletePodObject(context.Background(), p) })
	}
	return p
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func (n *testNode) mustAdd(t *testing.T, list *libcni.NetworkConfigList, p *testnet.Pod) *current.Result {
	t.Helper()
	res, err := n.Add(ctxT(t), list, p, nil)
	if err != nil {
		t.Fatalf("ADD %s: %v", p.ContainerID[:12], err)
	}
	return res
}

// heldIPs is what IPAM holds for a pod.
func (n *testNode) heldIPs(t *testing.T, p *testnet.Pod) []string {
	t.Helper()
	ips, err := n.ipam.HandleIPs(context.Background(), p.HandleID())
	if err != nil {
		t.Fatalf("HandleIPs: %v", err)
	}
	var out []string
	for _, ip := range ips {
		out = append(out, ip.String())
	}
	return out
}

// nodeHandles are this node's handles of the test network.
func (n *testNode) nodeHandles(t *testing.T) []string {
	t.Helper()
	hs, err := n.ipam.NodeHandles(context.Background(), n.Name)
	if err != nil {
		t.Fatalf("NodeHandles: %v", err)
	}
	var out []string
	for _, h := range hs {
		if strings.HasPrefix(h, networkName+".") {
			out = append(out, h)
		}
	}
	return out
}

// hostVeths lists the tab* links in the node's namespace.
func (n *testNode) hostVeths(t *testing.T) map[string]netlink.Link {
	t.Helper()
	out := map[string]netlink.Link{}
	err := n.Do(func() error {
		links, err := netlink.LinkList()
		if err != nil {
			return err
		}
		for _, l := range links {
			if strings.HasPrefix(l.Attrs().Name, contract.HostVethPrefix) {
				out[l.Attrs().Name] = l
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// tabbyRoutes lists the node's routes of tabby's protocol, by destination.
func (n *testNode) tabbyRoutes(t *testing.T) map[string]netlink.Route {
	t.Helper()
	out := map[string]netlink.Route{}
	err := n.Do(func() error {
		routes, err := netlink.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Protocol: plugin.RouteProtocol}, netlink.RT_FILTER_PROTOCOL)
		if err != nil {
			return err
		}
		for _, r := range routes {
			if r.Dst != nil {
				out[r.Dst.String()] = r
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// cniError unwraps the CNI error a plugin returned.
func cniError(t *testing.T, err error) *types.Error {
	t.Helper()
	var e *types.Error
	if !errors.As(err, &e) {
		t.Fatalf("want a CNI error (*types.Error), got %T: %v", err, err)
	}
	return e
}

// ipamRequest asks tabby's IPAM directly for one IPv4 address for p.
func ipamRequest(n *testNode, p *testnet.Pod) ipam.Request {
	return ipam.Request{HandleID: p.HandleID(), Node: n.Name, IPv4: true, Use: tabbyv1.UseWorkload}
}
