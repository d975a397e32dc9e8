package policy

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	cnpv1 "github.com/tabbynet/tabby/api/cnp/v1beta1"
)

// ---- the reference semantics of ClusterNetworkPolicy, from the API docs ----

// tiered decides one direction of a connection (egress: from's, else
// to's): the Admin tier's first matching rule (Accept or Deny is final,
// Pass goes on), then the NetworkPolicies when any isolates the pod, then
// the Baseline tier's first matching rule (Deny denies), else allowed.
func (w *world) tiered(t testing.TB, egress bool, from, to *tpod, proto string, port, fam int, npIsolated, npOK bool) bool {
	subject, peer := to, from
	if egress {
		subject, peer = from, to
	}
	if subject.ext {
		return true
	}
	switch a, _ := w.tierAction(t, true, egress, subject, peer, to, proto, port, fam); a {
	case cnpv1.ActionAccept:
		return true
	case cnpv1.ActionDeny:
		return false
	}
	if npIsolated {
		return npOK
	}
	a, _ := w.tierAction(t, false, egress, subject, peer, to, proto, port, fam)
	return a != cnpv1.ActionDeny
}

// tierAction is the action of the first rule of the tier's policies (by
// priority, then name) selecting subject that matches, and the policy's
// name; "" for none.
func (w *world) tierAction(t testing.TB, admin, egress bool, subject, peer, target *tpod, proto string, port, fam int) (cnpv1.ClusterNetworkPolicyRuleAction, string) {
	var pols []*cnpv1.ClusterNetworkPolicy
	for _, p := range w.cnps {
		if (p.Spec.Tier == cnpv1.AdminTier) == admin && w.cnpSelects(t, p, subject) {
			pols = append(pols, p)
		}
	}
	slices.SortFunc(pols, func(a, b *cnpv1.ClusterNetworkPolicy) int {
		return cmp.Or(cmp.Compare(a.Spec.Priority, b.Spec.Priority), strings.Compare(a.Name, b.Name))
	})
	for _, p := range pols {
		if egress {
			for _, r := range p.Spec.Egress {
				if w.cnpPeersMatch(t, r.To, peer, fam) && cnpProtocolsMatch(r.Protocols, target, proto, port) {
					return r.Action, p.Name
				}
			}
			continue
		}
		for _, r := range p.Spec.Ingress {
			peers := make([]cnpv1.ClusterNetworkPolicyEgressPeer, len(r.From))
			for i, f := range r.From {
				peers[i] = cnpv1.ClusterNetworkPolicyEgressPeer{Namespaces: f.Namespaces, Pods: f.Pods}
			}
			if w.cnpPeersMatch(t, peers, peer, fam) && cnpProtocolsMatch(r.Protocols, target, proto, port) {
				return r.Action, p.Name
			}
		}
	}
	return "", ""
}

func (w *world) cnpSelects(t testing.TB, p *cnpv1.ClusterNetworkPolicy, pod *tpod) bool {
	if pod.ext {
		return false
	}
	if s := p.Spec.Subject.Namespaces; s != nil {
		return mustSelector(t, s).Matches(w.nsLabelsOf(pod.ns))
	}
	s := p.Spec.Subject.Pods
	return mustSelector(t, &s.NamespaceSelector).Matches(w.nsLabelsOf(pod.ns)) && mustSelector(t, &s.PodSelector).Matches(labels.Set(pod.labels))
}

func (w *world) cnpPeersMatch(t testing.TB, peers []cnpv1.ClusterNetworkPolicyEgressPeer, other *tpod, fam int) bool {
	a := other.addr(fam)
	for _, p := range peers {
		switch {
		case p.Namespaces != nil:
			if !other.ext && mustSelector(t, p.Namespaces).Matches(w.nsLabelsOf(other.ns)) {
				return true
			}
		case p.Pods != nil:
			if !other.ext && mustSelector(t, &p.Pods.NamespaceSelector).Matches(w.nsLabelsOf(other.ns)) &&
				mustSelector(t, &p.Pods.PodSelector).Matches(labels.Set(other.labels)) {
				return true
			}
		case p.Nodes != nil:
			for _, n := range w.nodeObjs {
				if !mustSelector(t, p.Nodes).Matches(labels.Set(n.Labels)) {
					continue
				}
				for _, na := range n.Status.Addresses {
					if a.IsValid() && na.Address == a.String() {
						return true
					}
				}
			}
		default:
			for _, n := range p.Networks {
				if netip.MustParsePrefix(string(n)).Contains(a) {
					return true
				}
			}
		}
	}
	return false
}

func cnpProtocolsMatch(protos []cnpv1.ClusterNetworkPolicyProtocol, target *tpod, proto string, port int) bool {
	if len(protos) == 0 {
		return true
	}
	inPort := func(p *cnpv1.Port) bool {
		switch {
		case p == nil:
			return true
		case p.Range != nil:
			return port >= int(p.Range.Start) && port <= int(p.Range.End)
		}
		return port == int(p.Number)
	}
	for _, p := range protos {
		switch {
		case p.TCP != nil:
			if proto == "tcp" && inPort(p.TCP.DestinationPort) {
				return true
			}
		case p.UDP != nil:
			if proto == "udp" && inPort(p.UDP.DestinationPort) {
				return true
			}
		case p.SCTP != nil:
			if proto == "sctp" && inPort(p.SCTP.DestinationPort) {
				return true
			}
		default:
			if !target.ext && namedPortIs(target, p.DestinationNamedPort, proto, port) {
				return true
			}
		}
	}
	return false
}

// namedPortIs: the pod's first port of that name and protocol is port.
func namedPortIs(pod *tpod, name, proto string, port int) bool {
	for _, cp := range pod.ports {
		p := cp.Protocol
		if p == "" {
			p = corev1.ProtocolTCP
		}
		if cp.Name == name && strings.ToLower(string(p)) == proto {
			return int(cp.ContainerPort) == port
		}
	}
	return false
}

// ---- random ClusterNetworkPolicies ----

var (
	nodeKeys = []string{"zone", "role"}
	nodeVals = []string{"a", "b", "edge"}
)

// nodes adds the Nodes of a generated world: n1 and n2 with addresses no
// pod has, and "gw", whose address is the outside endpoint's, so a nodes
// peer can select (or miss) a destination.
func (g *gen) nodes(w *world) {
	addrs := map[string][2]string{"n1": {"172.16.0.1", "fd01::1"}, "n2": {"172.16.0.2", "fd01::2"}, "gw": {w.ext.v4.String(), w.ext.v6.String()}}
	for _, n := range []string{"gw", "n1", "n2"} {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n, Labels: g.labelMap(nodeKeys, nodeVals)}}
		node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: addrs[n][0]}, {Type: corev1.NodeExternalIP, Address: addrs[n][1]}, {Type: corev1.NodeHostName, Address: n}}
		w.nodeObjs = append(w.nodeObjs, node)
	}
}

func (g *gen) cnp(i int) *cnpv1.ClusterNetworkPolicy {
	p := &cnpv1.ClusterNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("c%d", i)}}
	p.Spec.Tier = pick(g.c, cnpv1.AdminTier, cnpv1.BaselineTier)
	p.Spec.Priority = int32(pick(g.c, 0, 10, 10, 20, 1000))
	if !g.valid && g.c.n(8) == 0 {
		p.Spec.Tier = pick[cnpv1.Tier](g.c, "", "Middle", "admin")
	}
	if !g.valid && g.c.n(8) == 0 {
		p.Spec.Priority = int32(pick(g.c, -1, 1001, 1<<30))
	}
	if g.c.n(2) == 0 {
		p.Spec.Subject.Namespaces = g.selector(nsKeys, nsVals)
	} else {
		p.Spec.Subject.Pods = g.namespacedPod()
	}
	if !g.valid && g.c.n(8) == 0 {
		p.Spec.Subject = pick(g.c, cnpv1.ClusterNetworkPolicySubject{}, cnpv1.ClusterNetworkPolicySubject{Namespaces: &metav1.LabelSelector{}, Pods: g.namespacedPod()})
	}
	for j := g.c.n(4); j > 0; j-- {
		var from []cnpv1.ClusterNetworkPolicyIngressPeer
		for _, peer := range g.cnpPeers(false) {
			from = append(from, cnpv1.ClusterNetworkPolicyIngressPeer{Namespaces: peer.Namespaces, Pods: peer.Pods})
		}
		p.Spec.Ingress = append(p.Spec.Ingress, cnpv1.ClusterNetworkPolicyIngressRule{Action: g.action(), From: from, Protocols: g.protocols()})
	}
	for j := g.c.n(4); j > 0; j-- {
		p.Spec.Egress = append(p.Spec.Egress, cnpv1.ClusterNetworkPolicyEgressRule{Action: g.action(), To: g.cnpPeers(true), Protocols: g.protocols()})
	}
	return p
}

func (g *gen) namespacedPod() *cnpv1.NamespacedPod {
	return &cnpv1.NamespacedPod{NamespaceSelector: *g.selector(nsKeys, nsVals), PodSelector: *g.selector(podKeys, podVals)}
}

func (g *gen) action() cnpv1.ClusterNetworkPolicyRuleAction {
	if !g.valid && g.c.n(10) == 0 {
		return pick[cnpv1.ClusterNetworkPolicyRuleAction](g.c, "", "Allow", "deny")
	}
	return pick(g.c, cnpv1.ActionAccept, cnpv1.ActionDeny, cnpv1.ActionPass)
}

func (g *gen) cnpPeers(egress bool) []cnpv1.ClusterNetworkPolicyEgressPeer {
	var out []cnpv1.ClusterNetworkPolicyEgressPeer
	for i := g.c.n(3); i >= 0; i-- {
		var p cnpv1.ClusterNetworkPolicyEgressPeer
		kinds := 2
		if egress {
			kinds = 4
		}
		switch g.c.n(kinds) {
		case 0:
			p.Namespaces = g.selector(nsKeys, nsVals)
		case 1:
			p.Pods = g.namespacedPod()
		case 2:
			p.Nodes = g.selector(nodeKeys, nodeVals)
		default:
			for j := g.c.n(2); j >= 0; j-- {
				cidr := pick(g.c, validCIDRs...)
				if !g.valid && g.c.n(4) == 0 {
					cidr = pick(g.c, badCIDRs...)
				}
				if !slices.Contains(p.Networks, cnpv1.CIDR(cidr)) {
					p.Networks = append(p.Networks, cnpv1.CIDR(cidr))
				}
			}
		}
		if !g.valid && g.c.n(8) == 0 {
			p = pick(g.c, cnpv1.ClusterNetworkPolicyEgressPeer{}, cnpv1.ClusterNetworkPolicyEgressPeer{Namespaces: &metav1.LabelSelector{}, Networks: []cnpv1.CIDR{"10.0.0.0/8"}},
				cnpv1.ClusterNetworkPolicyEgressPeer{DomainNames: []cnpv1.DomainName{"example.com"}})
		}
		out = append(out, p)
	}
	if !g.valid && g.c.n(10) == 0 {
		return nil
	}
	return out
}

func (g *gen) protocols() []cnpv1.ClusterNetworkPolicyProtocol {
	var out []cnpv1.ClusterNetworkPolicyProtocol
	for i := g.c.n(3); i > 0; i-- {
		var port *cnpv1.Port
		switch g.c.n(3) {
		case 1:
			port = &cnpv1.Port{Number: int32(pick(g.c, 79, 80, 81))}
		case 2:
			lo := int32(pick(g.c, 79, 80))
			port = &cnpv1.Port{Range: &cnpv1.PortRange{Start: lo, End: lo + 1 + int32(g.c.n(2))}}
		}
		if !g.valid && g.c.n(6) == 0 {
			port = pick(g.c, &cnpv1.Port{}, &cnpv1.Port{Number: 70000}, &cnpv1.Port{Number: -1}, &cnpv1.Port{Range: &cnpv1.PortRange{Start: 81, End: 80}},
				&cnpv1.Port{Number: 80, Range: &cnpv1.PortRange{Start: 1, End: 2}})
		}
		var p cnpv1.ClusterNetworkPolicyProtocol
		switch g.c.n(4) {
		case 0:
			p.TCP = &cnpv1.ClusterNetworkPolicyProtocolTCP{DestinationPort: port}
		case 1:
			p.UDP = &cnpv1.ClusterNetworkPolicyProtocolUDP{DestinationPort: port}
		case 2:
			p.SCTP = &cnpv1.ClusterNetworkPolicyProtocolSCTP{DestinationPort: port}
		default:
			p.DestinationNamedPort = pick(g.c, portNames...)
			if !g.valid && g.c.n(3) == 0 {
				p.DestinationNamedPort = pick(g.c, "Bad_Name", "a-very-long-port-name")
			}
		}
		if !g.valid && g.c.n(8) == 0 {
			p = pick(g.c, cnpv1.ClusterNetworkPolicyProtocol{}, cnpv1.ClusterNetworkPolicyProtocol{DestinationNamedPort: "web", TCP: &cnpv1.ClusterNetworkPolicyProtocolTCP{}})
		}
		out = append(out, p)
	}
	return out
}

// TestRandomTieredWorldsAgainstReference compiles random valid worlds of
// all three tiers (every one has ClusterNetworkPolicies, most also
// NetworkPolicies) and checks every connection against the reference.
func TestRandomTieredWorldsAgainstReference(t *testing.T) {
	n := 400
	if testing.Short() {
		n = 50
	}
	kept := 0
	for seed := 0; seed < n; seed++ {
		g := &gen{c: &chooser{r: newRand(1_000_000 + seed)}, valid: true}
		w := g.world()
		for len(w.cnps) == 0 {
			g.addCNPs(w)
		}
		if seed%2 == 1 {
			kept += w.keepOthers(newRand(seed))
		}
		t.Run(fmt.Sprint(seed), func(t *testing.T) { compare(t, w) })
	}
	if kept == 0 {
		t.Error("no world kept a combination no local pod has: the test of Input.Keep tests nothing")
	}
}
