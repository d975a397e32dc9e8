package qemutest

import (
	tabbyv1 "github.com/tabbynet/tabby/api/v1"
)

// What both sides agree on: the pools the host creates, the nodes the
// guest makes, and the checks the guest reports and the host requires.

// guestConfig is /guest.json: the API server as the guest reaches it and
// where the run's archive put tabby's programs.
type guestConfig struct {
	Server string `json:"server"` // https://10.0.2.2:PORT
	CA     string `json:"ca"`     // PEM of apiserver.crt
	Token  string `json:"token"`  // the admin's bearer token
	BinDir string `json:"binDir"` // tabbyd, tabby, tabby-ipam
}

type poolSpec struct {
	name, cidr string
	ipip       tabbyv1.EncapMode
}

// pools: one IPIP Always and one IPIP CrossSubnet pool; pods pick one with
// the tabby.io/ipv4pools annotation.
var pools = []poolSpec{
	{"qemu-ipip-always", "10.70.0.0/16", tabbyv1.EncapAlways},
	{"qemu-ipip-cross", "10.71.0.0/16", tabbyv1.EncapCrossSubnet},
}

type nodeSpec struct {
	name   string
	addr   string // eth0's address on its subnet
	subnet int    // index into subnets
}

// subnets are the router's addresses (the nodes' gateways) on the
// underlay's two bridges.
var subnets = []string{"10.80.1.1/24", "10.80.2.1/24"}

// underlayRoute is what every node routes via its gateway.
const underlayRoute = "10.80.0.0/16"

// nodes: two on one subnet, one on the other, so that one pair is in the
// same subnet and another is not.
var nodes = []nodeSpec{
	{"qemu-node1", "10.80.1.11/24", 0},
	{"qemu-node2", "10.80.1.12/24", 0},
	{"qemu-node3", "10.80.2.13/24", 1},
}

// check is one pod-to-pod ping from a pod of pool on nodes[from] to one on
// nodes[to], and whether it must cross tunl0.
type check struct {
	pool     string
	from, to int
	tunnel   bool
}

// checks: Always encapsulates every pair; CrossSubnet only the pair that
// crosses subnets.
var checks = []check{
	{"qemu-ipip-always", 0, 1, true},
	{"qemu-ipip-always", 0, 2, true},
	{"qemu-ipip-cross", 0, 1, false},
	{"qemu-ipip-cross", 0, 2, true},
}

// name is how the guest's CHECK line names c.
func (c check) name() string {
	where := "same subnet"
	if nodes[c.from].subnet != nodes[c.to].subnet {
		where = "across subnets"
	}
	return c.pool + " " + nodes[c.from].name + "->" + nodes[c.to].name + " (" + where + ")"
}
