// Package plugin holds the CNI plugins of tabby: "tabby", the network plugin
// that wires a pod with a veth pair and routes, and "tabby-ipam", the IPAM
// plugin that hands out addresses from tabby's IP pools (tabby runs it
// in-process when the config's ipam.type is "tabby-ipam").
//
// A pod gets /32 (and /128) addresses on CNI_IFNAME and routes through
// link-local gateways: "169.254.1.1 dev eth0 scope link", "default via
// 169.254.1.1 dev eth0 onlink" and "default via fe80::1 dev eth0". The host
// end of the veth, "tab" + 11 hex digits of a hash of the pod identity, is
// created directly in the node's namespace; it answers ARP by proxy, holds
// fe80::1 for IPv6, carries a route to each pod address (protocol
// RouteProtocol) and an alias naming the attachment, by which DEL and GC
// find it.
//
// IPAM is done by tabbyd's CNI agent when its socket (agentSocket) accepts
// a connection, else from this process against the API server (Deps.Direct,
// package plugin/direct); this package itself carries no Kubernetes client,
// so that cmd/tabby, which only speaks to the agent, starts fast and hands
// a command to tabby-ipam when tabbyd is not there (ReexecDirect).
//
// Once a pod is wired, ADD waits (policyWaitTimeout) until tabbyd's agent
// reports the pod's NetworkPolicy programmed (policywait.go), so no pod
// runs before its policies are enforced.
//
// The commands are functions of a parsed Config and Deps, so tests can run
// them in-process; cmd/tabby and cmd/tabby-ipam wrap them with skel.
package plugin

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/tabbynet/tabby/contract"
	"github.com/tabbynet/tabby/contract/agentapi"
)

// SupportedVersions are the CNI spec versions the plugins speak (VERSION).
var SupportedVersions = version.PluginSupports("0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0")

// Version is tabby's version, set at build time with
// -ldflags "-X github.com/tabbynet/tabby/plugin.Version=...".
var Version = "dev"

// About is what a plugin prints (to stderr) when run without CNI_COMMAND.
func About(name string) string {
	return fmt.Sprintf(`CNI plugin %s (tabby %s)

A container runtime runs it with CNI_COMMAND=ADD|DEL|CHECK|GC|STATUS|VERSION,
CNI_CONTAINERID, CNI_NETNS, CNI_IFNAME, CNI_ARGS (K8S_POD_NAMESPACE,
K8S_POD_NAME) and CNI_PATH set, and the network config on stdin, e.g.

  {"cniVersion":"1.0.0","name":"k8s-pod-network","plugins":[{"type":"tabby",
   "kubeconfig":"/etc/cni/net.d/tabby-kubeconfig","nodename":"node1","mtu":0,
   "ipam":{"type":"tabby-ipam"}}]}

It speaks CNI 0.3.0 to 1.1.0; a conflist may ask only for what the runtime
speaks too (containerd 1.6 and 1.7: up to 1.0.0; containerd 2: 1.1.0), as
the one tabbyctl install-cni writes does.

Config keys (top level, or in "ipam" for tabby-ipam under another plugin):
  kubeconfig   the datastore's kubeconfig (default: in-cluster, then $KUBECONFIG)
  nodename     this node's name (default: the host name)
  mtu          pod MTU; 0 detects it (default-route interface less VXLAN 50 / IPIP 20)
  logLevel     debug|info|warn|error: log to logFile (default: no logging)
  logFormat    text|json: key=value lines or one JSON object a line (default text)
  logFile      the log (default /var/log/tabby/cni.log, rotated; "" stderr)
  logFileMaxSize / logFileMaxBackups / logFileMaxAge   rotation: MiB per
               file (100), files kept (5), days kept (30)
  timeout      bound on datastore work per command (default 30s)
  lockFile     per-node IPAM lock (default /var/run/tabby/ipam-<nodename>.lock)
  agentSocket  tabbyd's CNI agent (default /var/run/tabby/cni.sock; "" never
               asks tabbyd); when it accepts a connection, IPAM is done there
  policyWaitTimeout   how long ADD waits for tabbyd to program the pod's
                      NetworkPolicy (default 10s; "0s" does not wait); ADD
                      fails when it runs out
  policyWaitRequired  true: ADD fails when tabbyd cannot be asked (default
                      false: without tabbyd the pod starts without waiting)
  ipam.type    tabby-ipam (served in-process by tabby) or any IPAM plugin
  ipam.assignIPv4 / ipam.assignIPv6   families (default true / false)
  ipam.ipv4Pools / ipam.ipv6Pools     IPPool names (pod and namespace
                                      annotations tabby.io/ipv4pools etc. win)`, name, Version)
}

// TabbyFuncs are the commands of the tabby network plugin for skel.
func TabbyFuncs(d Deps) skel.CNIFuncs {
	ipamOnly := (*Config).TabbyIPAM
	return skel.CNIFuncs{
		// ADD also reads the pools to work out the MTU.
		Add:    run(d, "tabby", agentapi.CommandAdd, CmdAdd, func(c *Config) bool { return c.TabbyIPAM() || c.MTU == 0 }),
		Check:  run(d, "tabby", "", CmdCheck, ipamOnly),
		Del:    run(d, "tabby", agentapi.CommandDel, CmdDel, ipamOnly),
		GC:     run(d, "tabby", "", CmdGC, ipamOnly),
		Status: run(d, "tabby", "", CmdStatus, ipamOnly),
	}
}

// Command is one CNI command of a plugin.
type Command func(ctx context.Context, args *skel.CmdArgs, c *Config, d Deps, log *slog.Logger) (types.Result, error)

// run parses the config, bounds the command by the config's timeout and
// prints its result in the version the config asks for. When the command
// needs IPAM (needsIPAM), the allocator is chosen first, before the command
// changes anything: tabbyd's agent if its socket accepts a connection, else
// the datastore directly, in this process or, in a binary without a
// datastore client, by handing the whole command to tabby-ipam. A command
// with a report name tells tabbyd how long it took (Deps.reports).
func run(d Deps, name, report string, cmd Command, needsIPAM func(*Config) bool) func(*skel.CmdArgs) error {
	return func(args *skel.CmdArgs) (err error) {
		start := time.Now()
		c, err := LoadConfig(args.StdinData)
		if err != nil {
			return err
		}
		// The report goes over the connection IPAM used, when it was
		// the agent's.
		var agent *agentapi.Client
		if report != "" && d.reports(c) {
			defer func() { reportCommand(agent, c.AgentSocket, report, start, err) }()
		}
		log := d.Logger
		if log == nil {
			log = c.Logger(name)
		}
		ctx, cancel := context.WithTimeout(context.Background(), c.Timeout)
		defer cancel()
		log.Debug("command", "container", args.ContainerID, "netns", args.Netns, "ifname", args.IfName, "args", args.Args)
		if needsIPAM(c) && d.NewAllocator == nil {
			alloc, aerr := d.resolve(ctx, c, log)
			if errors.Is(aerr, errDirectNeeded) {
				log.Debug("handing the command to tabby-ipam, which reaches the API server directly")
				return ReexecDirect(args, name)
			}
			agent, _ = alloc.(*agentapi.Client)
			if f, ok := alloc.(Flusher); ok {
				defer f.Flush(ctx)
			}
			d.NewAllocator = func(context.Context, *Config, *slog.Logger) (Allocator, error) { return alloc, aerr }
		}
		res, err := cmd(ctx, args, c, d, log)
		if err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) {
			err = outOfTime(err, name, c)
		}
		if err != nil {
			log.Error("command failed", "container", args.ContainerID, "error", err)
			return err
		}
		if res != nil {
			return types.PrintResult(res, c.CNIVersion)
		}
		return nil
	}
}

// attachment names what one ADD wires.
func attachment(c *Config, args *skel.CmdArgs) (contract.PodID, string, Attachment, error) {
	pod, err := ParseArgs(args.Args)
	if err != nil {
		return pod, "", Attachment{}, err
	}
	return pod, contract.HostVethName(pod, args.ContainerID, args.IfName), Attachment{Network: c.Name, ContainerID: args.ContainerID, IfName: args.IfName}, nil
}

// CmdAdd wires a pod: addresses from IPAM, a veth pair, routes on both
// sides. A failure at any step undoes the earlier ones: the addresses are
// released and the veth (with its routes) deleted.
func CmdAdd(ctx context.Context, args *skel.CmdArgs, c *Config, d Deps, log *slog.Logger) (_ types.Result, err error) {
	pod, hostVeth, att, err := attachment(c, args)
	if err != nil {
		return nil, err
	}
	podNS, err := ns.GetNS(args.Netns)
	if err != nil {
		return nil, types.NewError(types.ErrInvalidNetNS, fmt.Sprintf("tabby: opening the pod's network namespace %q: %v", args.Netns, err), "")
	}
	defer podNS.Close()
	alloc, err := addAllocator(ctx, c, d, log)
	if err != nil {
		return nil, err
	}

	// IPAM runs while the MTU is worked out and the veth made, which
	// need no address.
	ipamc := make(chan ipamResult, 1)
	go func() {
		var r ipamResult
		r.ips, r.release, r.err = addIPAM(ctx, c, args.ContainerID, pod, alloc, log)
		ipamc <- r
	}()
	w := &Wiring{HostVeth: hostVeth, IfName: args.IfName, Alias: VethAlias(att)}
	v, err := prewire(ctx, c, alloc, podNS, w, log)
	r := <-ipamc
	if r.err == nil {
		defer func() {
			if err != nil {
				r.release()
			}
		}()
	}
	if err != nil {
		// When the command ran out of time, the wiring's error is the
		// symptom and IPAM's, when it failed too (the API server out of
		// reach), the cause.
		if ctx.Err() != nil && r.err != nil {
			return nil, r.err
		}
		return nil, err
	}
	defer v.Close()
	defer func() {
		if err != nil {
			unwire(hostVeth, log)
		}
	}()
	if r.err != nil {
		return nil, r.err
	}
	ips := r.ips
	w.IPs = addresses(ips)
	// tabbyd programs the pod's NetworkPolicy from its addresses alone
	// (the host veth's name is derived from the pod): the wait runs while
	// the addresses and routes are written, and ADD answers once both are
	// done. A failed wiring ends the wait.
	wctx, endWait := context.WithCancel(ctx)
	defer endWait()
	policyc := make(chan error, 1)
	go func() { policyc <- waitPolicy(wctx, c, alloc, pod, args.ContainerID, w.IPs, log) }()
	hostIf, podIf, err := finishWiring(v, w)
	if err != nil {
		return nil, fmt.Errorf("tabby: %w", err)
	}
	if err = <-policyc; err != nil {
		return nil, err
	}
	log.Info("added", "container", args.ContainerID, "pod", pod.String(), "veth", hostVeth, "mtu", w.MTU)
	return addResult(c, ips, hostIf, podIf), nil
}

// outOfTime says that a command's error came with the end of its time:
// the step that was under way when the timeout struck is in err, the
// bound and where to change it are said here. A CNI error keeps its code.
func outOfTime(err error, name string, c *Config) error {
	what := fmt.Sprintf("%s: the command did not finish within its timeout of %v (\"timeout\" in the CNI config of network %q)", name, c.Timeout, c.Name)
	var te *types.Error
	if errors.As(err, &te) {
		return types.NewError(te.Code, what+": "+te.Msg, te.Details)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// addAllocator is the allocator of an ADD: tabby's IPAM needs it, and MTU
// detection reads the pools' encapsulation through it. Under another IPAM
// plugin, a datastore out of reach only leaves the encapsulation out.
func addAllocator(ctx context.Context, c *Config, d Deps, log *slog.Logger) (Allocator, error) {
	if !c.TabbyIPAM() && c.MTU != 0 {
		return nil, nil
	}
	alloc, err := d.allocator(ctx, c, log)
	if err != nil && !c.TabbyIPAM() {
		log.Warn("no datastore for MTU detection; ignoring pool encapsulation", "error", err)
		return nil, nil
	}
	return alloc, err
}

// addIPAM assigns the pod's addresses, from tabby's pools or through the
// IPAM plugin the config names, and returns how to release them when a
// later step of ADD fails.
func addIPAM(ctx context.Context, c *Config, containerID string, pod contract.PodID, alloc Allocator, log *slog.Logger) ([]*current.IPConfig, func(), error) {
	if !c.TabbyIPAM() {
		return delegateAdd(c, log)
	}
	ips, err := ipamAdd(ctx, c, containerID, pod, alloc, log)
	if err != nil {
		return nil, nil, err
	}
	return ips, func() {
		cctx, cancel := cleanupContext(ctx, c)
		defer cancel()
		if rerr := ipamRelease(cctx, c, c.HandleID(containerID), alloc); rerr != nil {
			log.Error("releasing addresses after a failed ADD", "error", rerr)
		}
	}, nil
}

// delegateAdd runs the IPAM plugin the config names and takes each of its
// addresses as a host prefix behind tabby's link-local gateway.
func delegateAdd(c *Config, log *slog.Logger) ([]*current.IPConfig, func(), error) {
	release := func() {
		if rerr := invoke.DelegateDel(context.TODO(), c.IPAMType, c.Raw, nil); rerr != nil {
			log.Error("releasing addresses after a failed ADD", "ipam", c.IPAMType, "error", rerr)
		}
	}
	ips, err := delegatedAddresses(c)
	if err != nil {
		// The delegate may have allocated before failing.
		release()
		return nil, nil, err
	}
	return ips, release, nil
}

func delegatedAddresses(c *Config) ([]*current.IPConfig, error) {
	r, err := invoke.DelegateAdd(context.TODO(), c.IPAMType, c.Raw, nil)
	if err != nil {
		return nil, err
	}
	res, err := current.NewResultFromResult(r)
	if err != nil {
		return nil, err
	}
	var ips []*current.IPConfig
	for _, ipc := range res.IPs {
		ips = append(ips, &current.IPConfig{Address: hostPrefix(ipc.Address.IP), Gateway: gatewayFor(ipc.Address.IP)})
	}
	if len(ips) == 0 {
		return nil, fmt.Errorf("tabby: IPAM plugin %s returned no address", c.IPAMType)
	}
	return ips, nil
}

type ipamResult struct {
	ips     []*current.IPConfig
	release func()
	err     error
}

// prewire works out the MTU and makes the veth with its alias: all of the
// wiring that needs no address. A failure deletes what it made.
func prewire(ctx context.Context, c *Config, alloc Allocator, podNS ns.NetNS, w *Wiring, log *slog.Logger) (*vethPair, error) {
	m := detectMTU(ctx, c, alloc, log)
	if m.err != nil {
		return nil, m.err
	}
	w.MTU = m.mtu
	v, err := newVeth(podNS, w)
	if err == nil {
		err = setAlias(v.host, w)
		if err != nil {
			v.Close()
		}
	}
	if err != nil {
		unwire(w.HostVeth, log)
		return nil, fmt.Errorf("tabby: %w", err)
	}
	return v, nil
}

// finishWiring writes what needs the pod's addresses (w.IPs), after
// forwarding is on: the pod end's addresses and routes, the host end's
// sysctls and routes.
func finishWiring(v *vethPair, w *Wiring) (hostIf, podIf *current.Interface, err error) {
	if err := EnableForwarding(families(w.IPs)); err != nil {
		return nil, nil, err
	}
	if hostIf, podIf, err = v.setupPod(w); err != nil {
		return nil, nil, err
	}
	if err = setupHost(v.host, w); err != nil {
		return nil, nil, err
	}
	return hostIf, podIf, nil
}

// unwire deletes the veth of a failed ADD. Whatever link has the name now
// is this ADD's: deleting the host end deletes the pod end and the routes
// through it.
func unwire(hostVeth string, log *slog.Logger) {
	if _, err := RemoveStaleHostVeth(hostVeth); err != nil {
		log.Error("deleting the veth after a failed ADD", "veth", hostVeth, "error", err)
	}
}

// addResult is ADD's result: both ends of the veth, the addresses on the
// pod end (interface 1) and the routes podRoutes reports.
func addResult(c *Config, ips []*current.IPConfig, hostIf, podIf *current.Interface) *current.Result {
	result := &current.Result{CNIVersion: current.ImplementedSpecVersion, Interfaces: []*current.Interface{hostIf, podIf}}
	for _, ipc := range ips {
		ipc.Interface = current.Int(1)
		result.IPs = append(result.IPs, ipc)
	}
	result.Routes = podRoutes(0, 0, addresses(ips)).result()
	if dnsSet(c.DNS) {
		result.DNS = c.DNS
	}
	return result
}

// addresses are the addresses of ips.
func addresses(ips []*current.IPConfig) []net.IPNet {
	out := make([]net.IPNet, 0, len(ips))
	for _, ipc := range ips {
		out = append(out, ipc.Address)
	}
	return out
}

type mtuResult struct {
	mtu int
	err error
}

// detectMTU runs in the node's namespace (any thread not locked elsewhere).
func detectMTU(ctx context.Context, c *Config, alloc Allocator, log *slog.Logger) mtuResult {
	if c.MTU > 0 {
		return mtuResult{mtu: c.MTU}
	}
	link, err := DefaultRouteMTU()
	if err != nil {
		return mtuResult{err: fmt.Errorf("tabby: detecting the MTU: %w (set \"mtu\" in the CNI config to skip detection)", err)}
	}
	if alloc == nil {
		return mtuResult{mtu: ComputeMTU(0, link, nil)}
	}
	ps, err := alloc.UsablePools(ctx, c.NodeName)
	if err != nil {
		if c.TabbyIPAM() {
			return mtuResult{err: datastoreError(fmt.Errorf("tabby: listing the pools of node %s to work out the MTU: %w", c.NodeName, err))}
		}
		log.Warn("cannot list pools for MTU detection; ignoring encapsulation", "error", err)
	}
	return mtuResult{mtu: ComputeMTU(0, link, ps)}
}

func dnsSet(d types.DNS) bool {
	return len(d.Nameservers) > 0 || d.Domain != "" || len(d.Search) > 0 || len(d.Options) > 0
}

// CmdDel unwires a pod and frees its addresses. The namespace, the veth and
// the allocation may each be gone already; DEL then succeeds. The veth of a
// newer sandbox of the same pod (same name, other alias) is left alone.
func CmdDel(ctx context.Context, args *skel.CmdArgs, c *Config, d Deps, log *slog.Logger) (types.Result, error) {
	pod, err := ParseArgs(args.Args)
	if err != nil {
		log.Warn("ignoring malformed CNI_ARGS on DEL", "error", err)
	}
	hostVeth := contract.HostVethName(pod, args.ContainerID, args.IfName)
	att := Attachment{Network: c.Name, ContainerID: args.ContainerID, IfName: args.IfName}
	// The veth and the addresses are freed at once: deleting a veth
	// waits for the kernel to retire the device (about 10 ms), the
	// release for the API server. The runtime calls DEL once the pod's
	// containers have stopped, so no packet leaves the old pod meanwhile
	// (Calico, too, releases the address before it deletes the veth).
	type unwired struct {
		deleted bool
		err     error
	}
	vethc := make(chan unwired, 1)
	go func() {
		deleted, err := unwireDel(hostVeth, att, args)
		vethc <- unwired{deleted, err}
	}()
	var ipamErr error
	if c.TabbyIPAM() {
		_, ipamErr = IPAMDel(ctx, args, c, d, log)
	} else {
		ipamErr = invoke.DelegateDel(ctx, c.IPAMType, c.Raw, nil)
	}
	u := <-vethc
	if u.err != nil {
		return nil, u.err
	}
	if ipamErr != nil {
		return nil, ipamErr
	}
	deleted := u.deleted
	log.Info("deleted", "container", args.ContainerID, "pod", pod.String(), "veth", hostVeth, "vethFound", deleted)
	return nil, nil
}

// unwireDel deletes the veth of an attachment: the host end, else the pod
// end.
func unwireDel(hostVeth string, att Attachment, args *skel.CmdArgs) (bool, error) {
	deleted, err := DeleteHostVeth(hostVeth, att)
	if err != nil {
		return false, fmt.Errorf("tabby: %w", err)
	}
	if !deleted {
		if err := DeletePodLink(args.Netns, args.IfName); err != nil {
			return false, fmt.Errorf("tabby: deleting %s in the pod: %w", args.IfName, err)
		}
	}
	return deleted, nil
}

// CmdCheck verifies an attachment against its ADD result: the pod's
// interface, addresses and routes, the host veth and route, and that IPAM
// still holds the addresses.
func CmdCheck(ctx context.Context, args *skel.CmdArgs, c *Config, d Deps, log *slog.Logger) (types.Result, error) {
	if c.PrevResult == nil {
		return nil, types.NewError(types.ErrInvalidNetworkConfig, "tabby: CHECK needs the ADD result (prevResult) in the config", "the runtime passes it; with cnitool, run ADD first")
	}
	prev, err := current.NewResultFromResult(c.PrevResult)
	if err != nil {
		return nil, fmt.Errorf("tabby: reading prevResult: %w", err)
	}
	pod, hostVeth, att, err := attachment(c, args)
	if err != nil {
		return nil, err
	}
	w, err := prevWiring(prev, args)
	if err != nil {
		return nil, err
	}
	w.HostVeth, w.Alias = hostVeth, VethAlias(att)
	podNS, err := ns.GetNS(args.Netns)
	if err != nil {
		return nil, fmt.Errorf("tabby: opening the pod's network namespace %q: %w", args.Netns, err)
	}
	defer podNS.Close()
	if err := CheckPod(podNS, w); err != nil {
		return nil, fmt.Errorf("tabby: %s: %w", describe(pod, args.ContainerID), err)
	}
	if err := CheckHost(w); err != nil {
		return nil, fmt.Errorf("tabby: %s: %w", describe(pod, args.ContainerID), err)
	}
	if c.TabbyIPAM() {
		alloc, err := d.allocator(ctx, c, log)
		if err != nil {
			return nil, err
		}
		if err := ipamCheck(ctx, c, c.HandleID(args.ContainerID), addrIPs(w.IPs), alloc); err != nil {
			return nil, err
		}
	} else if err := invoke.DelegateCheck(ctx, c.IPAMType, c.Raw, nil); err != nil {
		return nil, err
	}
	return nil, nil
}

// prevWiring is the pod end that ADD's result (prev) reports for the
// interface CHECK names: its MTU and addresses.
func prevWiring(prev *current.Result, args *skel.CmdArgs) (*Wiring, error) {
	podIdx := -1
	for i, intf := range prev.Interfaces {
		if intf.Name == args.IfName && intf.Sandbox != "" {
			podIdx = i
		}
	}
	if podIdx < 0 {
		return nil, fmt.Errorf("tabby: prevResult has no interface %s in a sandbox", args.IfName)
	}
	if prev.Interfaces[podIdx].Sandbox != args.Netns {
		return nil, fmt.Errorf("tabby: prevResult puts %s in %s, but CHECK names %s", args.IfName, prev.Interfaces[podIdx].Sandbox, args.Netns)
	}
	w := &Wiring{IfName: args.IfName, MTU: prev.Interfaces[podIdx].Mtu}
	for _, ipc := range prev.IPs {
		if ipc.Interface == nil || *ipc.Interface == podIdx {
			w.IPs = append(w.IPs, hostPrefix(ipc.Address.IP))
		}
	}
	if len(w.IPs) == 0 {
		return nil, fmt.Errorf("tabby: prevResult has no address for %s", args.IfName)
	}
	return w, nil
}

// addrIPs are the IPs of addrs.
func addrIPs(addrs []net.IPNet) []net.IP {
	out := make([]net.IP, 0, len(addrs))
	for _, a := range addrs {
		out = append(out, a.IP)
	}
	return out
}

// CmdGC deletes the host veths of this network whose attachment is not in
// cni.dev/valid-attachments and releases this node's handles of this
// network whose container is not listed.
func CmdGC(ctx context.Context, args *skel.CmdArgs, c *Config, d Deps, log *slog.Logger) (types.Result, error) {
	valid := map[Attachment]bool{}
	for _, a := range c.ValidAttachments {
		valid[Attachment{Network: c.Name, ContainerID: a.ContainerID, IfName: a.IfName}] = true
	}
	veths, err := HostVeths(c.Name)
	if err != nil {
		return nil, fmt.Errorf("tabby: %w", err)
	}
	var errs []error
	for att, link := range veths {
		if valid[att] {
			continue
		}
		log.Info("gc: deleting host veth", "veth", link.Attrs().Name, "container", att.ContainerID, "ifname", att.IfName)
		if _, err := DeleteHostVeth(link.Attrs().Name, att); err != nil {
			errs = append(errs, err)
		}
	}
	if c.TabbyIPAM() {
		alloc, err := d.allocator(ctx, c, log)
		if err != nil {
			return nil, err
		}
		if err := ipamGC(ctx, c, alloc, log); err != nil {
			errs = append(errs, err)
		}
	} else if err := invoke.DelegateGC(ctx, c.IPAMType, c.Raw, nil); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("tabby: gc: %w", err)
	}
	return nil, nil
}

// CmdStatus reports whether the plugin can serve ADD: the datastore answers
// and a usable pool exists for this node.
func CmdStatus(ctx context.Context, args *skel.CmdArgs, c *Config, d Deps, log *slog.Logger) (types.Result, error) {
	if !c.TabbyIPAM() {
		return nil, invoke.DelegateStatus(ctx, c.IPAMType, c.Raw, nil)
	}
	return IPAMStatus(ctx, args, c, d, log)
}
