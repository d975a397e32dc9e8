package policy

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// namedSets are a Ruleset's hash:ip,port sets of one family by kind
// letter ('l' ingress, local pods; 'q' egress, every pod).
func namedSets(t *testing.T, rs *Ruleset, fam int) map[byte][]Set {
	t.Helper()
	out := map[byte][]Set{}
	for _, s := range rs.SetsFor(families[fam]) {
		if s.Type != SetHashIPPort {
			continue
		}
		k := s.Name[len(SetPrefix)]
		if k != setKindLocal && k != setKindNamed {
			t.Fatalf("hash:ip,port set %s of kind %q", s.Name, k)
		}
		out[k] = append(out[k], s)
	}
	return out
}

// Named-port sets by direction: an ingress rule's destination is always a
// local pod, so the set it matches holds the local pods' ports of that
// name and no pod's elsewhere; an egress rule's holds every pod's. A port
// name only ingress rules use makes no cluster-wide set, one only egress
// rules use no local set. Either way the traffic is what the reference
// semantics say (on both nodes, as TestUpstreamTruthTables checks).
func TestNamedPortSetsByDirection(t *testing.T) {
	inWeb := pol("x", "in-web", all, ingress(nil, named("TCP", "serve-80-tcp")))
	outWeb := pol("y", "out-web", ml("pod", "a"), types(tEg), egress(nil, named("TCP", "serve-80-tcp")))
	for _, c := range []struct {
		name   string
		in, eg bool // the port name is used in ingress, in egress
	}{
		{"ingress-only", true, false},
		{"egress-only", false, true},
		{"both", true, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := newXYZ(2)
			if c.in {
				w.policies = append(w.policies, inWeb)
			}
			if c.eg {
				w.policies = append(w.policies, outWeb)
			}
			cl := w.compile(t)
			for node, rs := range cl.rs {
				for f := range families {
					var local, every []string
					for _, p := range w.pods {
						m := p.addr(f).String() + ",tcp:80"
						every = append(every, m)
						if p.node == node {
							local = append(local, m)
						}
					}
					slices.Sort(local)
					slices.Sort(every)
					sets := namedSets(t, rs, f)
					// in-web selects local pods on both nodes (x has pods
					// on each); out-web selects y/a, which is on n2 only.
					wantIn := c.in
					wantEg := c.eg && w.pod("y/a").node == node
					if got := len(sets[setKindLocal]); got != b2i(wantIn) {
						t.Errorf("node %s %s: %d ingress named-port sets, want %d", node, families[f], got, b2i(wantIn))
					}
					if got := len(sets[setKindNamed]); got != b2i(wantEg) {
						t.Errorf("node %s %s: %d cluster-wide named-port sets, want %d", node, families[f], got, b2i(wantEg))
					}
					if wantIn && len(sets[setKindLocal]) == 1 {
						if s := sets[setKindLocal][0]; !slices.Equal(s.Members, local) {
							t.Errorf("node %s %s: ingress set %s holds %v, want the local pods' %v", node, families[f], s.Name, s.Members, local)
						}
					}
					if wantEg && len(sets[setKindNamed]) == 1 {
						if s := sets[setKindNamed][0]; !slices.Equal(s.Members, every) {
							t.Errorf("node %s %s: egress set %s holds %v, want every pod's %v", node, families[f], s.Name, s.Members, every)
						}
					}
					// No pod elsewhere is in an ingress set.
					for _, s := range sets[setKindLocal] {
						for _, p := range w.pods {
							if p.node == node {
								continue
							}
							for _, m := range s.Members {
								if strings.HasPrefix(m, p.addr(f).String()+",") {
									t.Errorf("node %s: %s of %s (on %s) is in the ingress set %s", node, m, p.key(), p.node, s.Name)
								}
							}
						}
					}
				}
			}
			for _, proto := range []string{"tcp", "udp"} {
				for _, port := range []int{80, 81} {
					for fam := range 2 {
						if d := w.diff(w.expected(t, proto, port, fam), cl.observe(t, proto, port, fam)); d != "" {
							t.Errorf("%s/%d %s: %s", proto, port, families[fam], d)
						}
					}
				}
			}
		})
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// Pods elsewhere come, go and change their ports: the ingress named-port
// set (and every chain) stays as it is, while the egress one follows them.
func TestNamedPortSetsPodsElsewhere(t *testing.T) {
	w := newXYZ(2)
	w.policies = nps(
		pol("x", "in-web", all, ingress(nil, named("TCP", "serve-80-tcp"))),
		pol("x", "out-web", all, types(tEg), egress(nil, named("TCP", "serve-81-tcp"))))
	before := Compile(w.input("n1"))
	checkRuleset(t, before)
	for _, p := range w.pods {
		if p.node == "n2" {
			p.ports = []corev1.ContainerPort{{Name: "serve-80-tcp", ContainerPort: 8080}, {Name: "serve-81-tcp", ContainerPort: 8181}}
		}
	}
	w.pods = append(w.pods, &tpod{ns: "y", name: "new", labels: map[string]string{"pod": "new"}, node: "n2", ports: servePorts(),
		v4: netip.MustParseAddr("10.0.9.9"), v6: netip.MustParseAddr("fd00::9:9")})
	after := Compile(w.input("n1"))
	checkRuleset(t, after)
	for f := range families {
		b, a := namedSets(t, before, f), namedSets(t, after, f)
		if len(b[setKindLocal]) != 1 || len(b[setKindNamed]) != 1 {
			t.Fatalf("%s: named-port sets %+v, want one of each kind", families[f], b)
		}
		if !slices.Equal(b[setKindLocal][0].Members, a[setKindLocal][0].Members) {
			t.Errorf("%s: the ingress set changed with pods elsewhere: %v -> %v", families[f], b[setKindLocal][0].Members, a[setKindLocal][0].Members)
		}
		if slices.Equal(b[setKindNamed][0].Members, a[setKindNamed][0].Members) {
			t.Errorf("%s: the egress set did not follow the pods elsewhere: %v", families[f], a[setKindNamed][0].Members)
		}
		if !slices.Contains(a[setKindNamed][0].Members, w.pod("y/new").addr(f).String()+",tcp:81") {
			t.Errorf("%s: the new pod elsewhere is not in the egress set %v", families[f], a[setKindNamed][0].Members)
		}
	}
	if !slices.EqualFunc(before.Chains, after.Chains, func(a, b Chain) bool { return a.Name == b.Name && slices.EqualFunc(a.Rules, b.Rules, slices.Equal) }) {
		t.Errorf("chains changed with pods elsewhere")
	}
}

// A stale endpoint elsewhere that still has a local pod's address (its
// pod gone, the address reused) does not lend the local pod its ports: a
// named port in ingress resolves against the local pod, as Kubernetes
// resolves it against the destination pod.
func TestNamedPortIngressIgnoresAddressTwinElsewhere(t *testing.T) {
	w := newXYZ(2)
	xa := w.pod("x/a")
	if xa.node != "n1" {
		t.Fatal("x/a should be on n1")
	}
	w.policies = nps(pol("x", "in-web", ml("pod", "a"), ingress(nil, named("TCP", "web"))))
	xa.ports = []corev1.ContainerPort{{Name: "web", ContainerPort: 80}}
	in := w.input("n1")
	stale := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "z", Name: "stale"},
		Spec:       corev1.PodSpec{NodeName: "n2", Containers: []corev1.Container{{Name: "c", Ports: []corev1.ContainerPort{{Name: "web", ContainerPort: 81}}}}},
	}
	in.Endpoints = append(in.Endpoints, Endpoint{Pod: stale, IPs: []netip.Addr{xa.v4, xa.v6}})
	ms := machines(t, Compile(in))
	for f, m := range ms {
		for _, c := range []struct {
			port int
			want verdict
		}{{80, vAccept}, {81, vDrop}} {
			p := pkt{src: w.ext.addr(f), dst: xa.addr(f), in: underlay, out: xa.iface(), proto: "tcp", dport: c.port, ctstate: "NEW"}
			if v, _ := m.forward(p); v != c.want {
				t.Errorf("%s ext -> x/a tcp/%d: %v, want %v", families[f], c.port, v, c.want)
			}
		}
	}
}
