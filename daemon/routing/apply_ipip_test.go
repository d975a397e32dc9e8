package routing

import (
	"errors"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	v1 "github.com/tabbynet/tabby/api/v1"
	"github.com/tabbynet/tabby/internal/netnstest"
)

// ipipSupported says whether this kernel can create IPIP devices (what
// `ip link add type ipip` does), trying in a namespace of its own. Where
// the module is loaded, a device with tunl0's parameters "already exists".
func ipipSupported(t *testing.T) (bool, error) {
	t.Helper()
	var err error
	netnstest.New(t, "ipip-probe").Must(func() error {
		err = netlink.LinkAdd(&netlink.Iptun{LinkAttrs: netlink.LinkAttrs{Name: "tabby-probe"}})
		return nil
	})
	return err == nil || errors.Is(err, unix.EEXIST), err
}

// IPIP Always between two nodes: tunl0 carries the pods' IPv4 traffic.
// Where the kernel has no ipip module, Apply must say so clearly, and the
// data path test is skipped loudly.
func TestApplyIPIP(t *testing.T) {
	l := newLab(t, 1)
	n1, n2 := l.addNode(1, 1), l.addNode(2, 1)
	pools := []v1.IPPool{ippool("v4", "10.244.0.0/16", v1.EncapAlways, "", false)}

	ok, why := ipipSupported(t)
	if !ok {
		_, err := n1.tryApply(Desired(l.inputs(n1, pools...)))
		if !errors.Is(err, ErrNoIPIP) || !strings.Contains(err.Error(), "modprobe ipip") {
			t.Fatalf("Apply on a kernel without ipip: error %v, want one wrapping ErrNoIPIP (%q)", err, ErrNoIPIP)
		}
		t.Skipf("SKIPPING the IPIP data path: this kernel cannot create ipip devices (ip link add type ipip: %v); Apply reported it as: %v\n"+
			"make test-ipip runs it under qemu, in a kernel with ipip (test/qemutest TestRoutingInQEMU).", why, err)
	}

	p1, p2 := n1.addPod(t, 10), n2.addPod(t, 10)
	l.applyAll(pools...)
	for _, n := range l.nodes {
		out := n.ns.Exec("ip", "-d", "addr", "show", "dev", IPIPDevice)
		mustContain(t, n.name+"'s "+IPIPDevice, out, "UP", "mtu 1480", "inet "+n.info.IPIPAddress.String()+"/32", IPIPAddressLabel)
	}
	mustContain(t, "node1's tabby routes", ourRoutes(t, n1.ns), "10.244.2.0/26 via 192.168.1.12 dev tunl0 proto 81 onlink")
	var before uint64
	n1.ns.Must(func() error {
		l, err := netlink.LinkByName(IPIPDevice)
		if err == nil {
			before = l.Attrs().Statistics.TxPackets
		}
		return err
	})
	ping(t, p1, p2.v4)
	ping(t, p2, p1.v4)
	n1.ns.Must(func() error {
		l, err := netlink.LinkByName(IPIPDevice)
		if err == nil && l.Attrs().Statistics.TxPackets < before+2 {
			t.Errorf("%s sent %d packets during the pings, want at least 2", IPIPDevice, l.Attrs().Statistics.TxPackets-before)
		}
		return err
	})
	if st := n1.apply(t, Desired(l.inputs(n1, pools...))); st.Changed() != 0 {
		t.Errorf("second Apply changed %d things: %+v", st.Changed(), st)
	}

	// IPIP off: tabby's address leaves tunl0 (which the kernel keeps).
	n1.apply(t, Desired(l.inputs(n1, dualStackNever...)))
	mustNotContain(t, "node1's "+IPIPDevice, n1.ns.Exec("ip", "addr", "show", "dev", IPIPDevice), n1.info.IPIPAddress.String())
}
