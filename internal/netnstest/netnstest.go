// Package netnstest is the network-namespace harness of tabby's tests and
// benchmarks: named namespaces standing for nodes, routers, peers and pods;
// an underlay (bridges in a namespace of their own) that nodes are plugged
// into by veths with addresses; and ways to run code and programs inside a
// namespace. Every namespace is removed on the test's Cleanup, also when
// the test fails, and with it every link in it. Nothing is wired into the
// host's own namespace.
//
// It imports testing, so only tests use it: the lab (lab/, for `tabbyctl
// lab`) and the demo's nodes (internal/testnet) are product code and keep
// their own builders.
package netnstest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/tabbynet/tabby/internal/tier"
)

// RunDir is where `ip netns` keeps its named namespaces.
const RunDir = "/var/run/netns"

// maxIfName is the kernel's limit on a link's name (IFNAMSIZ - 1).
const maxIfName = 15

var seq atomic.Int32

var validLabel = regexp.MustCompile(`^[A-Za-z0-9._-]+$`)

// NS is a named network namespace a test made (`ip netns` lists it as
// Name). It is an ns.NetNS, so it goes wherever one does.
type NS struct {
	ns.NetNS
	// Name is the namespace's name under RunDir: `ip -n Name`,
	// `nsenter --net=` + Path().
	Name   string
	tb     testing.TB
	remove sync.Once
}

// New makes a namespace for tb, removed when tb ends: lo up and IPv6
// duplicate address detection off (addresses are usable at once and do
// not change state behind a test's back). label (letters, digits, dashes)
// ends its name, which starts with tt<pid>-<n>- so a leaked one says whose
// it was. As non-root New skips tb (tier.Root).
func New(tb testing.TB, label string) *NS {
	tb.Helper()
	tier.Root(tb, "to create network namespaces", "ip", "nsenter")
	if !validLabel.MatchString(label) {
		tb.Fatalf("namespace label %q: use letters, digits, dots, dashes and underscores only", label)
	}
	name := fmt.Sprintf("tt%d-%d-%s", os.Getpid(), seq.Add(1), label)
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		tb.Fatalf("ip netns add %s: %v: %s", name, err, out)
	}
	h, err := ns.GetNS(filepath.Join(RunDir, name))
	if err != nil {
		_ = exec.Command("ip", "netns", "del", name).Run()
		tb.Fatalf("opening namespace %s: %v", name, err)
	}
	n := &NS{NetNS: h, Name: name, tb: tb}
	tb.Cleanup(n.Remove)
	n.Sysctl("net/ipv6/conf/all/accept_dad", "0", "net/ipv6/conf/default/accept_dad", "0")
	n.IP("link set lo up")
	return n
}

// Remove removes n now rather than when the test ends (a benchmark that
// makes a namespace per iteration frees them as it goes); it runs once.
func (n *NS) Remove() {
	n.remove.Do(func() {
		err := n.Close()
		if out, derr := exec.Command("ip", "netns", "del", n.Name).CombinedOutput(); derr != nil {
			err = errors.Join(err, fmt.Errorf("%v: %s", derr, out))
		}
		if err != nil {
			n.tb.Errorf("removing namespace %s: %v", n.Name, err)
		}
	})
}

// Run runs f on a thread inside n (ns.NetNS.Do); programs f starts run
// there too. Goroutines f starts do not.
func (n *NS) Run(f func() error) error {
	return n.Do(func(ns.NetNS) error { return f() })
}

// Must is Run failing the test on error.
func (n *NS) Must(f func() error) {
	n.tb.Helper()
	if err := n.Run(f); err != nil {
		n.tb.Fatalf("in namespace %s: %v", n.Name, err)
	}
}

// Thread runs f on a new thread inside netns and waits for it. The thread
// is never handed back to the runtime (it ends with its goroutine), so no
// other goroutine ever runs in netns by accident: for code that lives
// long or starts goroutines of its own there, such as appliers and
// controllers.
func Thread(netns ns.NetNS, f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := netns.Set(); err != nil {
			errc <- fmt.Errorf("entering %s: %w", netns.Path(), err)
			return
		}
		errc <- f()
	}()
	return <-errc
}

// Thread is Thread(n, f).
func (n *NS) Thread(f func() error) error { return Thread(n, f) }

// Serve runs start and then serve on a thread of their own inside n
// (Thread) until the test ends: an error of start fails the test at once;
// when the test ends serve's context is cancelled, Serve's cleanup waits
// for serve to return, and an error from it fails the test, named what.
func (n *NS) Serve(what string, start func() error, serve func(context.Context) error) {
	n.tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	started, done := make(chan error, 1), make(chan error, 1)
	go func() {
		done <- n.Thread(func() error {
			err := start()
			started <- err
			if err != nil {
				return nil
			}
			return serve(ctx)
		})
	}()
	select {
	case err := <-started:
		if err != nil {
			cancel()
			<-done
			n.tb.Fatalf("starting %s in namespace %s: %v", what, n.Name, err)
		}
	case err := <-done:
		cancel()
		n.tb.Fatalf("starting %s: %v", what, err)
	}
	n.tb.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			n.tb.Errorf("%s: %v", what, err)
		}
	})
}

// IP runs `ip -n NAME ARGS` (args split on spaces after formatting) and
// returns its output, failing the test on error.
func (n *NS) IP(format string, args ...any) string {
	n.tb.Helper()
	argv := append([]string{"-n", n.Name}, strings.Fields(fmt.Sprintf(format, args...))...)
	out, err := exec.Command("ip", argv...).CombinedOutput()
	if err != nil {
		n.tb.Fatalf("ip %s: %v\n%s", strings.Join(argv, " "), err, out)
	}
	return string(out)
}

// Exec runs a program inside n and returns its combined output, failing
// the test on error.
func (n *NS) Exec(name string, args ...string) string {
	n.tb.Helper()
	out, err := n.Command(name, args...).CombinedOutput()
	if err != nil {
		n.tb.Fatalf("in namespace %s: %s %s: %v\n%s", n.Name, name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// Command is a command that runs name inside n (through nsenter), for
// programs that outlive a call or whose output streams.
//
// nsenter gets the program's path as exec.Command finds it on PATH, not its
// bare name: busybox's nsenter (the qemu guest's, test/qemutest) runs a
// bare name as its own applet when it has one, and busybox's ip shows
// none of what the tests read.
func (n *NS) Command(name string, args ...string) *exec.Cmd {
	if p, err := exec.LookPath(name); err == nil {
		name = p
	}
	return exec.Command("nsenter", append([]string{"--net=" + n.Path(), name}, args...)...)
}

// Sysctl sets name/value pairs of /proc/sys inside n.
func (n *NS) Sysctl(kv ...string) {
	n.tb.Helper()
	n.Must(func() error {
		for i := 0; i+1 < len(kv); i += 2 {
			if err := os.WriteFile("/proc/sys/"+kv[i], []byte(kv[i+1]), 0o644); err != nil {
				return fmt.Errorf("setting %s: %w", kv[i], err)
			}
		}
		return nil
	})
}

// Net is an underlay: bridges in a namespace of their own that nodes'
// links are ports of. Nothing leads out of it.
type Net struct {
	Underlay *NS
	tb       testing.TB
}

// NewNet makes an underlay with the named bridges, up.
func NewNet(tb testing.TB, bridges ...string) *Net {
	tb.Helper()
	u := &Net{Underlay: New(tb, "underlay"), tb: tb}
	for _, br := range bridges {
		u.Underlay.IP("link add %s up type bridge", br)
	}
	return u
}

// Node makes a namespace (label as for New) whose eth0 is a port named
// port of bridge, holding addrs (CIDR notation).
func (u *Net) Node(label, port, bridge string, addrs ...string) *NS {
	u.tb.Helper()
	n := New(u.tb, label)
	if err := u.Plug(n, "eth0", port, bridge, addrs...); err != nil {
		u.tb.Fatal(err)
	}
	return n
}

// Plug makes a veth pair whose end dev is in the namespace n, up with
// addrs (CIDR notation, IPv6 without duplicate address detection), and
// whose other end, port, is a port of bridge. It fails nothing itself,
// so it may run on any goroutine.
func (u *Net) Plug(n ns.NetNS, dev, port, bridge string, addrs ...string) error {
	for _, name := range []string{dev, port} {
		if len(name) > maxIfName {
			return fmt.Errorf("link name %q is longer than the kernel's %d characters: choose a shorter one", name, maxIfName)
		}
	}
	prefixes := make([]netip.Prefix, len(addrs))
	for i, a := range addrs {
		p, err := netip.ParsePrefix(a)
		if err != nil {
			return fmt.Errorf("address of %s: %w (want CIDR notation, such as 10.0.0.1/24)", dev, err)
		}
		prefixes[i] = p
	}
	err := withHandle(u.Underlay, func(h *netlink.Handle) error {
		br, err := h.LinkByName(bridge)
		if err != nil {
			return fmt.Errorf("bridge %s of the underlay: %w", bridge, err)
		}
		// The port comes up as it is made; dev once it has its addresses.
		veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: port, MasterIndex: br.Attrs().Index, Flags: net.FlagUp},
			PeerName: dev, PeerNamespace: netlink.NsFd(int(n.Fd()))}
		if err := h.LinkAdd(veth); err != nil {
			return fmt.Errorf("adding the veth %s (port %s of %s): %w", dev, port, bridge, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	return withHandle(n, func(h *netlink.Handle) error {
		l, err := h.LinkByName(dev)
		if err != nil {
			return err
		}
		for _, p := range prefixes {
			a := &netlink.Addr{IPNet: netlinkPrefix(p)}
			if p.Addr().Is6() {
				a.Flags = 0x02 // IFA_F_NODAD: usable at once
			}
			if err := h.AddrAdd(l, a); err != nil {
				return fmt.Errorf("adding %s to %s: %w", p, dev, err)
			}
		}
		return h.LinkSetUp(l)
	})
}

// withHandle runs f with a netlink handle inside the namespace n (no
// thread switches namespace).
func withHandle(n ns.NetNS, f func(*netlink.Handle) error) error {
	h, err := netlink.NewHandleAt(netns.NsHandle(int(n.Fd())))
	if err != nil {
		return fmt.Errorf("netlink in %s: %w", n.Path(), err)
	}
	defer h.Close()
	return f(h)
}

func netlinkPrefix(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}
