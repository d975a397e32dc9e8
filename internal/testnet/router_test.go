package testnet_test

import (
	"context"
	"net"
	"strings"
	"testing"

	"github.com/tabbynet/tabby/internal/testnet"
	"github.com/tabbynet/tabby/internal/tier"
)

// TestRouter: nodes on two subnets reach each other through the router,
// and only through it.
func TestRouter(t *testing.T) {
	tier.Root(t, "to create network namespaces")
	if _, err := testnet.NewRouter("10.80.1.1"); err == nil || !strings.Contains(err.Error(), "prefix length") {
		t.Errorf("NewRouter of an address without prefix length: %v, want an error saying how to write it", err)
	}
	r, err := testnet.NewRouter("10.80.1.1/24", "10.80.2.1/24")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := r.Close(); err != nil {
			t.Errorf("removing the router: %v", err)
		}
	})
	ctx := context.Background()
	var nodes []*testnet.Node
	for i, addr := range []string{"10.80.1.11/24", "10.80.2.12/24"} {
		n, err := testnet.NewNode(ctx, testnet.NodeOptions{Name: "rt-node" + string(rune('1'+i)), UplinkAddrs: []string{"10.254.0.1/24"}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = n.Close() })
		if err := r.Plug(n, i, addr, "10.80.0.0/16"); err != nil {
			t.Fatal(err)
		}
		nodes = append(nodes, n)
	}
	if err := testnet.Ping(nodes[0].NS, net.ParseIP("10.80.2.12")); err != nil {
		t.Errorf("node1 to node2 across the router: %v", err)
	}
	if err := testnet.Ping(nodes[1].NS, net.ParseIP("10.80.1.1")); err != nil {
		t.Errorf("node2 to the router's other side: %v", err)
	}
	if err := r.Plug(nodes[0], 2, "10.80.3.11/24"); err == nil || !strings.Contains(err.Error(), "no subnet 2") {
		t.Errorf("Plug into a subnet the router lacks: %v", err)
	}
}
