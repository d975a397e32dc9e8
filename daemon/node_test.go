package daemon

import (
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/tabbynet/tabby/internal/netnstest"
)

// TestNodeAddresses finds the node's addresses of both families in a
// namespace of its own: --node-ip with its interface's prefix length, else
// the address of the family's default route's interface, else the source
// address towards the API server when it is of that family, else (IPv6)
// a usable global address of the IPv4 address's interface.
func TestNodeAddresses(t *testing.T) {
	n := netnstest.New(t, "nodeaddr")
	// No dummy module in this kernel: veth pairs inside the namespace.
	n.IP("link add eth0 type veth peer name peer0")
	n.IP("link set peer0 up")
	n.IP("addr add 192.168.7.10/24 dev eth0")
	n.IP("addr add 2001:db8:7::10/64 dev eth0")
	// Deprecated (preferred lifetime over), added last so the kernel
	// lists it first: never the node's address.
	n.IP("addr add 2001:db8:7::dead/64 dev eth0 preferred_lft 0")
	n.IP("link add eth1 type veth peer name peer1")
	n.IP("link set peer1 up")
	n.IP("addr add 172.16.5.9/20 dev eth1")
	n.IP("addr add fd00:5::9/64 dev eth1")
	n.IP("link set eth0 up")
	n.IP("link set eth1 up")

	check := func(configured, api, want4, how4, want6, how6 string) {
		t.Helper()
		conf, err := ParseNodeIPs(configured)
		if err != nil {
			t.Fatal(err)
		}
		err = n.Run(func() error {
			na, err := nodeAddresses(conf, api)
			if err != nil {
				return err
			}
			if prefixString(na.v4) != want4 || !strings.Contains(na.how4, how4) {
				t.Errorf("--node-ip %q, API server %s: IPv4 %s (%s%s), want %s (%s)", configured, api, na.v4, na.how4, na.problem4, want4, how4)
			}
			if prefixString(na.v6) != want6 || !strings.Contains(na.how6, how6) {
				t.Errorf("--node-ip %q, API server %s: IPv6 %s (%s%s), want %s (%s)", configured, api, na.v6, na.how6, na.problem6, want6, how6)
			}
			return nil
		})
		if err != nil {
			t.Errorf("--node-ip %q, API server %s: %v", configured, api, err)
		}
	}
	const sameLink = "which holds the node's IPv4 address"
	check("172.16.5.9", "", "172.16.5.9/20", "--node-ip", "fd00:5::9/64", "eth1, "+sameLink)
	check("2001:db8:7::10,172.16.5.9", "", "172.16.5.9/20", "--node-ip", "2001:db8:7::10/64", "--node-ip")
	// No default route: the source address towards the API server for
	// its family; IPv6 from the IPv4 address's interface.
	check("", "https://172.16.1.1:6443", "172.16.5.9/20", "towards the API server", "fd00:5::9/64", "eth1, "+sameLink)
	check("", "https://192.168.7.1:6443", "192.168.7.10/24", "towards the API server", "2001:db8:7::10/64", "eth0, "+sameLink)
	// An IPv6 API server: an IPv6-only node (no IPv4 default route).
	check("", "https://[2001:db8:7::1]:6443", "", "", "2001:db8:7::10/64", "towards the API server")
	n.IP("route add default via 192.168.7.1")
	check("", "https://172.16.1.1:6443", "192.168.7.10/24", "eth0, which holds the IPv4 default route", "2001:db8:7::10/64", "eth0, "+sameLink)
	n.IP("-6 route add default via fd00:5::1 dev eth1")
	check("", "https://172.16.1.1:6443", "192.168.7.10/24", "eth0, which holds the IPv4 default route", "fd00:5::9/64", "eth1, which holds the IPv6 default route")
	// --node-ip of one family; the other is still detected.
	check("2001:db8:7::10", "https://172.16.1.1:6443", "192.168.7.10/24", "IPv4 default route", "2001:db8:7::10/64", "--node-ip")

	err := n.Run(func() error {
		for c, want := range map[string]string{"10.9.9.9": "10.9.9.9", "10.9.9.9,fd00:5::9": "10.9.9.9", "172.16.5.9,2001:db8:99::1": "2001:db8:99::1"} {
			conf, _ := ParseNodeIPs(c)
			if _, err := nodeAddresses(conf, ""); err == nil || !strings.Contains(err.Error(), "no interface of this node holds "+want) {
				t.Errorf("--node-ip %s, of another machine: %v, want an error naming %s", c, err, want)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	// A node with no global address: the error says to pass --node-ip.
	bare := netnstest.New(t, "nodeaddr-bare")
	err = bare.Run(func() error {
		na, err := nodeAddresses(nil, "https://10.1.1.1:6443")
		if err == nil || !strings.Contains(err.Error(), "pass --node-ip") {
			t.Errorf("a node without addresses: %+v, %v; want an error saying to pass --node-ip", na, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestParseNodeIPs(t *testing.T) {
	for _, c := range []struct {
		in   string
		want []string
		err  string
	}{
		{in: ""},
		{in: "10.0.0.1", want: []string{"10.0.0.1"}},
		{in: "fd00::1", want: []string{"fd00::1"}},
		{in: "10.0.0.1,fd00::1", want: []string{"10.0.0.1", "fd00::1"}},
		{in: "fd00::1, 10.0.0.1", want: []string{"fd00::1", "10.0.0.1"}},
		{in: "::ffff:10.0.0.1", want: []string{"10.0.0.1"}},
		{in: "10.0.0.1,10.0.0.2", err: "two addresses of the same family"},
		{in: "fd00::1,fd00::2", err: "two addresses of the same family"},
		{in: "10.0.0.1,fd00::1,10.0.0.2", err: "give one address, or an IPv4 and an IPv6"},
		{in: "node1", err: `"node1" is not an IP address`},
		{in: "10.0.0.1,", err: `"" is not an IP address`},
		{in: "fe80::1", err: "not a global unicast address"},
		{in: "127.0.0.1", err: "not a global unicast address"},
		{in: "0.0.0.0", err: "not a global unicast address"},
	} {
		got, err := ParseNodeIPs(c.in)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("ParseNodeIPs(%q) = %v, %v; want an error naming %q", c.in, got, err, c.err)
			}
			continue
		}
		var gs []string
		for _, a := range got {
			gs = append(gs, a.String())
		}
		if err != nil || strings.Join(gs, " ") != strings.Join(c.want, " ") {
			t.Errorf("ParseNodeIPs(%q) = %v, %v; want %v", c.in, gs, err, c.want)
		}
	}
}

func TestUsableAddr(t *testing.T) {
	addr := func(s string, scope, flags int) netlink.Addr {
		p := netip.MustParsePrefix(s)
		return netlink.Addr{IPNet: &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}, Scope: scope, Flags: flags}
	}
	const v4, v6 = netlink.FAMILY_V4, netlink.FAMILY_V6
	for _, c := range []struct {
		a      netlink.Addr
		family int
		ok     bool
	}{
		{addr("192.168.1.10/24", unix.RT_SCOPE_UNIVERSE, 0), v4, true},
		{addr("192.168.1.10/24", unix.RT_SCOPE_UNIVERSE, 0), v6, false},
		{addr("127.0.0.1/8", unix.RT_SCOPE_HOST, 0), v4, false},
		{addr("169.254.1.1/16", unix.RT_SCOPE_LINK, 0), v4, false},
		{addr("2001:db8::10/64", unix.RT_SCOPE_UNIVERSE, 0), v6, true},
		{addr("2001:db8::10/64", unix.RT_SCOPE_UNIVERSE, 0), v4, false},
		{addr("fd00::10/64", unix.RT_SCOPE_UNIVERSE, unix.IFA_F_PERMANENT), v6, true},
		{addr("fe80::1/64", unix.RT_SCOPE_LINK, 0), v6, false},
		{addr("2001:db8::10/64", unix.RT_SCOPE_UNIVERSE, unix.IFA_F_DEPRECATED), v6, false},
		{addr("2001:db8::10/64", unix.RT_SCOPE_UNIVERSE, unix.IFA_F_TENTATIVE), v6, false},
		{addr("2001:db8::10/64", unix.RT_SCOPE_UNIVERSE, unix.IFA_F_DADFAILED), v6, false},
		{addr("2001:db8::10/64", unix.RT_SCOPE_UNIVERSE, unix.IFA_F_TEMPORARY), v6, false},
		{addr("::1/128", unix.RT_SCOPE_HOST, 0), v6, false},
	} {
		if _, ok := usableAddr(c.a, c.family); ok != c.ok {
			t.Errorf("usableAddr(%s scope %d flags %#x, family %d) = %v, want %v", c.a.IPNet, c.a.Scope, c.a.Flags, c.family, ok, c.ok)
		}
	}
}
