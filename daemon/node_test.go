package daemon

import (
	"net"
	"strings"
	"testing"

	"github.com/tabbynet/tabby/internal/netnstest"
)

// TestNodeAddress finds the node's address in a namespace of its own:
// --node-ip with its interface's prefix length, else the address of the
// default route's interface, else the source address towards the API
// server.
func TestNodeAddress(t *testing.T) {
	n := netnstest.New(t, "nodeaddr")
	// No dummy module in this kernel: veth pairs inside the namespace.
	n.IP("link add eth0 type veth peer name peer0")
	n.IP("link set peer0 up")
	n.IP("addr add 192.168.7.10/24 dev eth0")
	n.IP("link add eth1 type veth peer name peer1")
	n.IP("link set peer1 up")
	n.IP("addr add 172.16.5.9/20 dev eth1")
	n.IP("link set eth0 up")
	n.IP("link set eth1 up")

	check := func(configured net.IP, api, want, how string) {
		t.Helper()
		err := n.Run(func() error {
			p, gotHow, err := nodeAddress(configured, api)
			if err != nil {
				return err
			}
			if p.String() != want || !strings.Contains(gotHow, how) {
				t.Errorf("nodeAddress(%v, %s) = %s (%s), want %s (%s)", configured, api, p, gotHow, want, how)
			}
			return nil
		})
		if err != nil {
			t.Errorf("nodeAddress(%v, %s): %v", configured, api, err)
		}
	}
	check(net.ParseIP("172.16.5.9"), "", "172.16.5.9/20", "--node-ip")
	// No default route: the source address towards the API server.
	check(nil, "https://172.16.1.1:6443", "172.16.5.9/20", "towards the API server")
	check(nil, "https://192.168.7.1:6443", "192.168.7.10/24", "towards the API server")
	n.IP("route add default via 192.168.7.1")
	check(nil, "https://172.16.1.1:6443", "192.168.7.10/24", "eth0, which holds the default route")
	err := n.Run(func() error {
		_, _, err := nodeAddress(net.ParseIP("10.9.9.9"), "")
		if err == nil || !strings.Contains(err.Error(), "no interface of this node holds 10.9.9.9") {
			t.Errorf("--node-ip of another machine: %v", err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
