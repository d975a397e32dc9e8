package lab

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"strconv"
	"time"

	"github.com/vishvananda/netlink"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	tabbyv1 "github.com/tabbynet/tabby/api/v1"
	"github.com/tabbynet/tabby/internal/controlplane"
)

// tabby's namespace (deploy/base/namespace.yaml).
const tabbyNamespace = "tabby-system"

// apiServiceIP is the kubernetes Service's address, the first of
// controlplane.ServiceClusterIPRange.
const apiServiceIP = "10.96.0.1"

// controlPlane is the started control plane, for the rest of Up.
type controlPlane struct {
	c  *controlplane.Cluster
	cs kubernetes.Interface
}

// apiServerArgs are what a cluster of real nodes needs of kube-apiserver
// beyond internal/controlplane's defaults: the lab's CA for client certificates
// (kubelets), a client certificate of its own for the kubelets' API (exec,
// logs, port-forward) by their InternalIP (no DNS for node names here),
// NodeRestriction for the kubelets' writes, and the kubernetes Service's
// endpoints kept at its address (pods reach it through kube-proxy). A
// dual-stack lab's Services get an IPv6 range next to the IPv4 one (IPv4
// first: the primary family, of single-stack Services and of kubernetes
// itself); a later flag wins over internal/controlplane's.
func apiServerArgs(s *State, ca *labCA, kubeletClientCert, kubeletClientKey string) []string {
	var dual []string
	if s.DualStack {
		dual = []string{"--service-cluster-ip-range", controlplane.ServiceClusterIPRange + "," + ServiceCIDR6}
	}
	return append([]string{
		"--client-ca-file", ca.CertFile,
		"--kubelet-client-certificate", kubeletClientCert,
		"--kubelet-client-key", kubeletClientKey,
		"--kubelet-preferred-address-types", "InternalIP,Hostname",
		"--enable-admission-plugins", "NodeRestriction",
		"--endpoint-reconciler-type", "lease",
	}, dual...)
}

// startControlPlane makes the control-plane namespace on subnet 0, starts
// etcd and kube-apiserver in it and the host's forward to it, applies what
// users apply (deploy/tabby.yaml rendered with tabbyImage, kube-proxy and
// CoreDNS), then starts tabby-scheduler-extender, kube-scheduler (with
// SchedulerConfigFile, pointed at the extender) and kube-controller-manager
// (every controller) there. The extender starts before anything can be
// scheduled: the configuration hands it node affinity, which DaemonSet
// pods need.
func startControlPlane(ctx context.Context, s *State, l Layout, o *Options, ca *labCA, tabbyImage string) (*controlPlane, error) {
	nsName := l.ControlPlaneNS()
	if err := buildHost(s, l, nsName, "cp", 0, ControlPlaneAddr(), ControlPlaneAddr6()); err != nil {
		return nil, err
	}
	if err := routePodsFromControlPlane(s, nsName); err != nil {
		return nil, err
	}
	cert, key, err := ca.clientCert(filepath.Join(s.pkiDir(), "apiserver-kubelet-client"), "kube-apiserver-kubelet-client", "system:masters")
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(s.Dir, "cp")
	// The API server serves with a certificate that names every address
	// its clients dial, the host's loopback (the forward) included, so a
	// client that sets the server itself (e2e.test does, which drops the
	// kubeconfig's tls-server-name) still verifies it.
	if err := ca.servingCert(filepath.Join(dir, "pki", "apiserver"), "kube-apiserver",
		[]net.IP{ControlPlaneAddr().Addr().AsSlice(), net.ParseIP(apiServiceIP), net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		[]string{"kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc." + ClusterDomain, "localhost"}); err != nil {
		return nil, err
	}
	c, err := controlplane.Start(ctx, controlplane.Options{
		Dir:                dir,
		KeepDir:            true,
		BinDir:             o.ControlPlaneDir,
		RepoRoot:           o.RepoRoot,
		BuildOutput:        o.Log,
		NetNS:              NetNSPath(nsName),
		Address:            ControlPlaneAddr().Addr().String(),
		APIServerPort:      APIServerPort,
		Detach:             true,
		ExtraAPIServerArgs: apiServerArgs(s, ca, cert, key),
	})
	if err != nil {
		return nil, fmt.Errorf("starting the control plane: %w", err)
	}
	cp := &controlPlane{c: c}
	if err := recordControlPlane(s, c, nsName); err != nil {
		return nil, err
	}
	o.progress("control plane: etcd and kube-apiserver at %s (namespace %s)", c.Server, nsName)
	if err := c.WriteKubeconfig(s.ControlPlane.Kubeconfig, ""); err != nil {
		return nil, err
	}
	if cp.cs, err = kubernetes.NewForConfig(c.RESTConfig()); err != nil {
		return nil, err
	}
	if err := startForward(s, c, o.APIPort); err != nil {
		return nil, err
	}
	o.progress("forward: %s on the host's loopback -> %s (admin kubeconfig %s)", s.Forward.Address, s.ControlPlane.Server, s.Kubeconfig)
	if err := installTabby(ctx, s, tabbyImage, o.TabbydArgs); err != nil {
		return nil, err
	}
	encap := ""
	if s.Subnets > 1 && s.PodCIDR != "" {
		encap = ", the default pool VXLAN CrossSubnet, as the nodes are on 2 subnets"
	}
	o.progress("tabby: kubectl apply of deploy/tabby.yaml (rendered with image %s and pod CIDR %q%s)", tabbyImage, s.PodCIDR, encap)
	if err := installAddons(ctx, s); err != nil {
		return nil, err
	}
	o.progress("add-ons: kubectl apply of kube-proxy (DaemonSet) and CoreDNS (Deployment, Service kube-dns %s)", ClusterDNS)
	if err := waitTabbyAPI(ctx, cp.cs); err != nil {
		return nil, err
	}
	url, err := startExtender(ctx, s, c, s.Binaries.Extender)
	if err != nil {
		return nil, err
	}
	if err := s.update(func(s *State) { s.ControlPlane.Extender = url }); err != nil {
		return nil, err
	}
	schedConfig, err := schedulerConfig(c.RepoRoot, url)
	if err != nil {
		return nil, err
	}
	if _, err := c.StartScheduler(ctx, controlplane.SchedulerOptions{Config: schedConfig}); err != nil {
		return nil, err
	}
	if _, err := c.StartControllerManager(ctx, controlplane.ControllerManagerOptions{Controllers: "*"}); err != nil {
		return nil, err
	}
	if err := recordControlPlane(s, c, nsName); err != nil {
		return nil, err
	}
	o.progress("control plane: %s at %s, kube-scheduler with %s pointed at it, kube-controller-manager (every controller) running",
		ExtenderName, url, SchedulerConfigFile)
	return cp, nil
}

// routePodsFromControlPlane routes the default pools' addresses (IPv4,
// and IPv6 in a dual-stack lab) from the control-plane namespace through
// the nodes on its subnet (one multipath route per family; each node
// forwards to the pod's node by what BGP taught it), as the control plane
// of a cluster kubeadm made sits on the pod network: the API server dials
// pods for the proxy subresources of pods and Services (kubectl proxy, the
// e2e suites' DNS and Proxy specs). Pools added later are not routed so.
func routePodsFromControlPlane(s *State, nsName string) error {
	if s.PodCIDR == "" {
		return nil
	}
	if err := routePoolFromControlPlane(s, nsName, s.PodCIDR, (*Node).IP); err != nil {
		return err
	}
	if !s.DualStack || s.IPv6PodCIDR == "" {
		return nil
	}
	return routePoolFromControlPlane(s, nsName, s.IPv6PodCIDR, (*Node).IP6)
}

// routePoolFromControlPlane routes cidr from the control-plane namespace
// through the nodes on its subnet, at the addresses via gives.
func routePoolFromControlPlane(s *State, nsName, cidr string, via func(*Node) string) error {
	dst, err := netip.ParsePrefix(cidr)
	if err != nil {
		return fmt.Errorf("the pod CIDR %q: %w", cidr, err)
	}
	return withLinks(nsName, func(h *netlink.Handle) error {
		eth, err := h.LinkByName("eth0")
		if err != nil {
			return err
		}
		var hops []*netlink.NexthopInfo
		for i := range s.Nodes {
			if n := &s.Nodes[i]; n.Subnet == 0 {
				hops = append(hops, &netlink.NexthopInfo{LinkIndex: eth.Attrs().Index, Gw: net.ParseIP(via(n))})
			}
		}
		if len(hops) == 0 {
			return nil
		}
		if err := h.RouteAdd(&netlink.Route{Dst: prefixIPNet(dst.Masked()), MultiPath: hops}); err != nil {
			return fmt.Errorf("routing %s through the nodes in %s: %w", dst, nsName, err)
		}
		return nil
	})
}

// waitTabbyAPI waits until the API server serves every kind of tabby.io/v1
// that deploy/tabby.yaml defines (the extender lists them at start).
func waitTabbyAPI(ctx context.Context, cs kubernetes.Interface) error {
	want := []string{"ippools", "ipamblocks", "blockaffinities", "ipamhandles", "ipamconfigurations", "bgpconfigurations", "bgppeers", "bgpfilters"}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	return poll(wctx, 100*time.Millisecond, func() error {
		rl, err := cs.Discovery().ServerResourcesForGroupVersion(tabbyv1.SchemeGroupVersion.String())
		if err != nil {
			return err
		}
		have := map[string]bool{}
		for _, r := range rl.APIResources {
			have[r.Name] = true
		}
		for _, w := range want {
			if !have[w] {
				return fmt.Errorf("%s of %s is not served yet", w, tabbyv1.SchemeGroupVersion)
			}
		}
		return nil
	})
}

// recordControlPlane saves the control plane's address and processes.
func recordControlPlane(s *State, c *controlplane.Cluster, nsName string) error {
	var procs []Proc
	for _, p := range c.Processes() {
		if pr, err := procOf(p.Name, p.Pid()); err == nil {
			pr.Log = p.LogPath
			procs = append(procs, pr)
		}
	}
	return s.update(func(s *State) {
		ext := s.ControlPlane.Extender
		s.ControlPlane = ControlPlane{
			NetNS:      nsName,
			Address:    c.Address(),
			Server:     c.Server,
			Dir:        c.Dir,
			CAFile:     c.CAFile,
			Kubeconfig: filepath.Join(c.Dir, "admin.kubeconfig"),
			Extender:   ext,
			Procs:      procs,
		}
	})
}

// RESTConfig is an admin client configuration of the lab's API server for
// a program in the host's namespace: it dials from inside the
// control-plane namespace (no forward needed).
func (s *State) RESTConfig() (*rest.Config, error) {
	if s.ControlPlane.Kubeconfig == "" {
		return nil, fmt.Errorf("the lab in %s has no control plane yet", s.Dir)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", s.ControlPlane.Kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("loading the lab's admin kubeconfig: %w", err)
	}
	nsName := s.ControlPlane.NetNS
	cfg.Dial = func(ctx context.Context, network, address string) (net.Conn, error) {
		return dialInNetNS(ctx, nsName, network, address)
	}
	cfg.QPS, cfg.Burst = 100, 200
	cfg.UserAgent = "tabbyctl-lab"
	return cfg, nil
}

// apiTarget is host:port of the API server on the underlay.
func (s *State) apiTarget() string {
	return net.JoinHostPort(s.ControlPlane.Address, strconv.Itoa(APIServerPort))
}
