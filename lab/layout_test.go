package lab

import (
	"strings"
	"testing"
)

func TestLayout(t *testing.T) {
	l := Layout{Name: "lab", Nodes: 5, Subnets: 2}
	if err := l.Check(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ got, want string }{
		{l.UnderlayNS(), "tabby-lab-underlay"},
		{l.RouterNS(), "tabby-lab-router"},
		{l.ControlPlaneNS(), "tabby-lab-cp"},
		{l.NodeNS(3), "tabby-lab-node3"},
		{l.PodNSPrefix(), "tabby-lab-pod-"},
		{NetNSPath(l.NodeNS(1)), "/run/netns/tabby-lab-node1"},
		{Subnet(0).String(), "10.77.0.0/24"},
		{Subnet(1).String(), "10.78.0.0/24"},
		{Gateway(1).String(), "10.78.0.1/24"},
		{ControlPlaneAddr().String(), "10.77.0.2/24"},
		// Nodes alternate between the subnets; the last byte is 10+i.
		{l.NodeAddr(1).String(), "10.77.0.11/24"},
		{l.NodeAddr(2).String(), "10.78.0.12/24"},
		{l.NodeAddr(3).String(), "10.77.0.13/24"},
		{Layout{Name: "x", Nodes: 200, Subnets: 1}.NodeAddr(200).String(), "10.77.0.210/24"},
		// Dual-stack: the IPv6 address spells the IPv4 one.
		{Subnet6(1).String(), "fd00:10:78::/64"},
		{Gateway6(1).String(), "fd00:10:78::1/64"},
		{ControlPlaneAddr6().String(), "fd00:10:77::2/64"},
		{l.NodeAddr6(2).String(), "fd00:10:78::12/64"},
		{Layout{Name: "x", Nodes: 200, Subnets: 1}.NodeAddr6(200).String(), "fd00:10:77::210/64"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %s, want %s", tc.got, tc.want)
		}
	}
	for i := 1; i <= l.Nodes; i++ {
		if !Subnet(l.NodeSubnet(i)).Contains(l.NodeAddr(i).Addr()) {
			t.Errorf("node %d: %s is not in its subnet %s", i, l.NodeAddr(i), Subnet(l.NodeSubnet(i)))
		}
		if !Subnet6(l.NodeSubnet(i)).Contains(l.NodeAddr6(i).Addr()) {
			t.Errorf("node %d: %s is not in its subnet %s", i, l.NodeAddr6(i), Subnet6(l.NodeSubnet(i)))
		}
		if l.NodeAddr(i).Addr() == Gateway(l.NodeSubnet(i)).Addr() || l.NodeAddr(i).Addr() == ControlPlaneAddr().Addr() {
			t.Errorf("node %d's address %s is taken", i, l.NodeAddr(i))
		}
	}
}

func TestLayoutCheck(t *testing.T) {
	for _, bad := range []Layout{
		{Name: "", Nodes: 1, Subnets: 1},
		{Name: "has-dash", Nodes: 1, Subnets: 1},
		{Name: "UPPER", Nodes: 1, Subnets: 1},
		{Name: "waytoolongname", Nodes: 1, Subnets: 1},
		{Name: "lab", Nodes: 0, Subnets: 1},
		{Name: "lab", Nodes: MaxNodes + 1, Subnets: 1},
		{Name: "lab", Nodes: 1, Subnets: 3},
	} {
		if err := bad.Check(); err == nil {
			t.Errorf("%+v was accepted", bad)
		}
	}
	// No lab's prefix starts another lab's names.
	if strings.HasPrefix(Prefix("lab2")+"node1", Prefix("lab")) {
		t.Errorf("prefix %s matches lab2's names", Prefix("lab"))
	}
}

func TestParsePodRef(t *testing.T) {
	for ref, want := range map[string][2]string{"web": {"default", "web"}, "kube-system/dns": {"kube-system", "dns"}} {
		ns, name, err := ParsePodRef(ref)
		if err != nil || ns != want[0] || name != want[1] {
			t.Errorf("%s: %s %s %v", ref, ns, name, err)
		}
	}
	for _, bad := range []string{"", "/x", "x/", "a/b/c"} {
		if _, _, err := ParsePodRef(bad); err == nil {
			t.Errorf("%q was accepted", bad)
		}
	}
}

func TestIsLabCommand(t *testing.T) {
	dir := "/var/run/tabby-lab"
	for _, tc := range []struct {
		args []string
		want bool
	}{
		{[]string{"lab", "forward", "--dir", dir}, true},
		{[]string{"lab", "node-root", "--dir", dir, "--node", "node1"}, true},
		{[]string{"lab", "kubelet", "--dir", dir, "--node", "node1"}, false},
		{[]string{"lab", "forward", "--dir", dir + "2"}, false},
		{[]string{"lab", "up", "--dir", dir}, false},
		{[]string{"lab", "forward"}, false},
	} {
		if got := isLabCommand(tc.args, dir); got != tc.want {
			t.Errorf("%q: %v, want %v", tc.args, got, tc.want)
		}
	}
}
