package policy

import (
	"fmt"
	"math/rand"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func machines(t *testing.T, rs *Ruleset) [2]*machine {
	t.Helper()
	checkRuleset(t, rs)
	var ms [2]*machine
	for f, fam := range families {
		m, err := newMachine(rs, fam)
		if err != nil {
			t.Fatal(err)
		}
		ms[f] = m
	}
	return ms
}

// Traffic that is neither from nor to a pod veth is none of tabby's
// business: it goes back to FORWARD, mark untouched, whatever the policies.
func TestOtherTrafficReturnsUntouched(t *testing.T) {
	w := newXYZ(1)
	w.policies = nps(pol("x", "deny", all, types(tIn, tEg)))
	rs := Compile(w.input("n1"))
	ms := machines(t, rs)
	for f, m := range ms {
		xa := w.pod("x/a")
		for _, p := range []pkt{
			{src: w.ext.addr(f), dst: xa.addr(f), in: "eth0", out: "eth1", proto: "tcp", dport: 80, ctstate: "NEW", mark: 0x4000},
			{src: w.ext.addr(f), dst: xa.addr(f), in: "docker0", out: "eth0", proto: "udp", dport: 53, ctstate: "NEW", mark: 0x10000},
			{src: w.ext.addr(f), dst: xa.addr(f), in: "eth0", out: "tabby.vxlan", proto: "tcp", dport: 80, ctstate: "INVALID"},
			{src: w.ext.addr(f), dst: xa.addr(f), in: "ta", out: "eth0", proto: "tcp", dport: 80, ctstate: "NEW"},
		} {
			v, mark := m.forward(p)
			if v != vReturn || mark != p.mark {
				t.Errorf("%s %s->%s: %v mark %#x, want RETURN with mark %#x", families[f], p.in, p.out, v, mark, p.mark)
			}
		}
	}
}

// Replies of allowed connections pass whatever the policies say; INVALID
// packets of pods are dropped; a new connection is judged by policy.
func TestConntrack(t *testing.T) {
	w := newXYZ(1)
	w.policies = nps(pol("x", "deny", all, types(tIn, tEg)))
	ms := machines(t, Compile(w.input("n1")))
	xa, yb := w.pod("x/a"), w.pod("y/b")
	for f, m := range ms {
		for _, c := range []struct {
			state string
			want  verdict
		}{{"ESTABLISHED", vAccept}, {"RELATED", vAccept}, {"INVALID", vDrop}, {"NEW", vDrop}, {"UNTRACKED", vDrop}} {
			for _, dir := range [][2]*tpod{{xa, yb}, {yb, xa}} {
				p := pkt{src: dir[0].addr(f), dst: dir[1].addr(f), in: dir[0].iface(), out: dir[1].iface(), proto: "tcp", dport: 80, ctstate: c.state}
				if v, _ := m.forward(p); v != c.want {
					t.Errorf("%s %s %s->%s: %v, want %v", families[f], c.state, dir[0].key(), dir[1].key(), v, c.want)
				}
			}
		}
		// Pods no policy selects are accepted (FORWARD may be DROP, as
		// with Docker) and the mark bit is left clear.
		yc := w.pod("y/c")
		p := pkt{src: yb.addr(f), dst: yc.addr(f), in: yb.iface(), out: yc.iface(), proto: "udp", dport: 5353, ctstate: "NEW", mark: 0x4000}
		if v, mark := m.forward(p); v != vAccept || mark != 0x4000 {
			t.Errorf("%s y/b -> y/c: %v mark %#x, want ACCEPT mark 0x4000", families[f], v, mark)
		}
	}
}

// The rule layout the applier and the controller rely on.
func TestLayout(t *testing.T) {
	w := newXYZ(1)
	w.policies = nps(pol("x", "deny", all, types(tIn)), pol("x", "a-out", ml("pod", "a"), types(tEg), egress(nil, num("TCP", 53))))
	rs := Compile(w.input("n1"))
	if want := []Jump{{Chain: "FORWARD", Rule: []string{"-m", "comment", "--comment", "tabby:network-policy", "-j", "TABBY-NP-FORWARD"}}}; !reflect.DeepEqual(rs.Jumps, want) {
		t.Errorf("jumps %v", rs.Jumps)
	}
	chains := map[string]Chain{}
	for _, c := range rs.ChainsFor(FamilyIPv4) {
		chains[c.Name] = c
	}
	if got := chains[ChainForward].Rules; !reflect.DeepEqual(got, [][]string{
		{"-i", "tabby+", "-o", "tabby+", "-j", "RETURN"},
		{"-i", "tabby+", "-o", "tab+", "-j", ChainPod},
		{"-i", "tabby+", "-j", "RETURN"},
		{"-i", "tab+", "-j", ChainPod},
		{"-o", "tabby+", "-j", "RETURN"},
		{"-o", "tab+", "-j", ChainPod},
	}) {
		t.Errorf("%s: %q", ChainForward, got)
	}
	// One dispatch rule per combination of policies: x/a's egress; the
	// ingress of x/a, x/b and x/c, which share a chain and a set. The
	// set's name repeats the chain's hash.
	sets := map[string]Set{}
	for _, s := range rs.Sets {
		sets[s.Name] = s
	}
	for _, c := range []struct {
		chain, flags, kind string
		members            [2][]string
	}{
		{ChainFromPod, "src,src", "e", [2][]string{{"10.0.0.10,tabxa"}, {"fd00::10,tabxa"}}},
		{ChainToPod, "dst,dst", "i", [2][]string{{"10.0.0.10,tabxa", "10.0.0.11,tabxb", "10.0.0.12,tabxc"}, {"fd00::10,tabxa", "fd00::11,tabxb", "fd00::12,tabxc"}}},
	} {
		for f, fam := range families {
			var rules [][]string
			for _, ch := range rs.ChainsFor(fam) {
				if ch.Name == c.chain {
					rules = ch.Rules
				}
			}
			if len(rules) != 1 || len(rules[0]) != 7 {
				t.Fatalf("%s %s: %q, want one rule", fam, c.chain, rules)
			}
			target := rules[0][6]
			set := SetPrefix + c.kind + famDigit[f] + "-" + strings.ToLower(strings.TrimPrefix(target, PolicyChainPrefix+strings.ToUpper(c.kind)+"-"))
			if want := []string{"-m", "set", "--match-set", set, c.flags, "-g", target}; !slices.Equal(rules[0], want) {
				t.Errorf("%s %s: %q, want %q", fam, c.chain, rules[0], want)
			}
			if s := sets[set]; s.Type != SetHashNetIface || s.Family != fam || !slices.Equal(s.Members, c.members[f]) {
				t.Errorf("%s set %s: %+v, want hash:net,iface %v", fam, set, s, c.members[f])
			}
		}
	}
	if _, ok := sets[UnselectedSetName(FamilyIPv4, true)]; ok {
		t.Errorf("a set of unselected pods without DenyUnlisted")
	}
	if n4, n6 := len(rs.ChainsFor(FamilyIPv4)), len(rs.ChainsFor(FamilyIPv6)); n4 != n6 || n4 != 8 {
		t.Errorf("%d IPv4 and %d IPv6 chains, want 8 each", n4, n6)
	}
	if !slices.Equal(rs.Programmed, []string{"x/a", "x/b", "x/c", "y/a", "y/b", "y/c", "z/a", "z/b", "z/c"}) {
		t.Errorf("programmed %v", rs.Programmed)
	}
}

// A label change of a pod elsewhere changes set members, never chains; a
// pod that comes or goes elsewhere too.
func TestPodChurnElsewhereOnlyChangesSets(t *testing.T) {
	w := newXYZ(2)
	w.policies = nps(
		pol("x", "p", ml("pod", "a"), ingress(peers{selPeer(mlp("role", "client"))}, named("TCP", "serve-80-tcp"))),
		pol("x", "q", all, types(tEg), egress(peers{nsPeer(mlp("team", "blue"))})))
	before := Compile(w.input("n1"))
	w.pod("x/b").labels["role"] = "client" // x/b is on n2
	w.nsLabels["z"]["team"] = "blue"
	w.pods = append(w.pods, &tpod{ns: "y", name: "new", labels: map[string]string{"role": "client"}, v4: netip.MustParseAddr("10.0.9.9"), node: "n2", ports: servePorts()})
	after := Compile(w.input("n1"))
	if w.pod("x/b").node == "n1" {
		t.Fatal("x/b should be on n2")
	}
	if !reflect.DeepEqual(before.Chains, after.Chains) {
		t.Errorf("chains changed")
	}
	if reflect.DeepEqual(before.Sets, after.Sets) {
		t.Errorf("sets did not change")
	}
	if !slices.Equal(setNames(before), setNames(after)) {
		t.Errorf("set names changed: %v -> %v", setNames(before), setNames(after))
	}
}

// A local pod coming, going or changing labels changes set members only,
// as long as the policies selecting it select another local pod too: the
// chains (what iptables-restore would write) stay as they are. Only a
// combination of policies gaining its first local pod, or losing its last,
// changes chains. The new pods are enforced all the same.
func TestLocalPodChurnOnlyChangesSets(t *testing.T) {
	w := newXYZ(1)
	w.policies = nps(
		pol("x", "p", ml("pod", "a"), ingress(peers{selPeer(mlp("pod", "b"))})),
		pol("x", "q", all, types(tEg), egress(peers{nsPeer(mlp("ns", "z"))})),
		pol("x", "r", ml("pod", "special"), ingress(nil, num("TCP", 81))))
	compile := func() *Ruleset {
		in := w.input("n1")
		in.DenyUnlisted = true
		rs := Compile(in)
		checkRuleset(t, rs)
		return rs
	}
	newPod := func(ns, name, label string, i byte) *tpod {
		p := &tpod{ns: ns, name: name, labels: map[string]string{"pod": label}, node: "n1", ports: servePorts(),
			v4: netip.AddrFrom4([4]byte{10, 0, 5, i}), v6: netip.MustParseAddr(fmt.Sprintf("fd00::5:%d", i))}
		w.pods = append(w.pods, p)
		return p
	}
	prev := compile()
	for _, c := range []struct {
		name      string
		change    func()
		newChains bool
	}{
		{"a pod the same policies select", func() { newPod("x", "d", "a", 1) }, false},
		{"a pod no policy selects", func() { newPod("y", "d", "nobody", 2) }, false},
		{"a pod relabelled into another existing combination", func() { w.pod("x/b").labels["pod"] = "a" }, false},
		{"a pod gone, others of its combination left", func() {
			w.pods = slices.DeleteFunc(w.pods, func(p *tpod) bool { return p.key() == "x/c" })
		}, false},
		{"a pod of a combination no local pod had", func() { newPod("x", "s", "special", 3) }, true},
	} {
		c.change()
		rs := compile()
		if changed := !reflect.DeepEqual(prev.Chains, rs.Chains); changed != c.newChains {
			t.Errorf("%s: chains changed %v, want %v", c.name, changed, c.newChains)
		}
		if !c.newChains && !slices.Equal(setNames(prev), setNames(rs)) {
			t.Errorf("%s: set names changed: %v -> %v", c.name, setNames(prev), setNames(rs))
		}
		if reflect.DeepEqual(prev.Sets, rs.Sets) {
			t.Errorf("%s: no set changed", c.name)
		}
		prev = rs
	}
	// Every pod gets what its policies say: x/d and x/b (now pod=a) take
	// ingress only from pod=b pods (none left), x/s only port 81; all of
	// x egress only to z.
	ms := machines(t, prev)
	for f, m := range ms {
		send := func(from, to string, port int) bool {
			a, b := w.pod(from), w.pod(to)
			v, _ := m.forward(pkt{src: a.addr(f), dst: b.addr(f), in: a.iface(), out: b.iface(), proto: "tcp", dport: port, ctstate: "NEW"})
			return v == vAccept
		}
		for _, c := range []struct {
			from, to string
			port     int
			want     bool
		}{
			{"y/a", "x/d", 80, false}, {"y/a", "x/b", 80, false}, {"y/a", "x/a", 80, false},
			{"y/a", "x/s", 80, false}, {"y/a", "x/s", 81, true}, {"y/d", "y/a", 80, true},
			{"x/d", "z/a", 80, true}, {"x/d", "y/a", 80, false}, {"x/s", "y/d", 80, false},
		} {
			if got := send(c.from, c.to, c.port); got != c.want {
				t.Errorf("%s %s -> %s:%d: %v, want %v", families[f], c.from, c.to, c.port, got, c.want)
			}
		}
	}
}

// Compile gives the same Ruleset whatever the order of its input.
func TestDeterministic(t *testing.T) {
	w := newXYZ(2)
	for _, sc := range scenarios() {
		for _, st := range sc.steps {
			st.mutate(w)
		}
	}
	w.policies = nil
	for _, sc := range scenarios() {
		for si, st := range sc.steps {
			w2 := newXYZ(2)
			st.mutate(w2)
			for _, p := range w2.policies {
				q := p.DeepCopy()
				q.Name = fmt.Sprintf("%s-%d-%s", sc.name, si, q.Name)
				w.policies = append(w.policies, q)
			}
		}
	}
	in := w.input("n1")
	want := Compile(in)
	checkRuleset(t, want)
	r := rand.New(rand.NewSource(1))
	for i := 0; i < 20; i++ {
		r.Shuffle(len(in.Policies), func(i, j int) { in.Policies[i], in.Policies[j] = in.Policies[j], in.Policies[i] })
		r.Shuffle(len(in.Endpoints), func(i, j int) { in.Endpoints[i], in.Endpoints[j] = in.Endpoints[j], in.Endpoints[i] })
		r.Shuffle(len(in.Namespaces), func(i, j int) { in.Namespaces[i], in.Namespaces[j] = in.Namespaces[j], in.Namespaces[i] })
		if got := Compile(in); !reflect.DeepEqual(got, want) {
			t.Fatalf("shuffle %d changed the Ruleset", i)
		}
	}
}

func TestHostNetworkAndRemotePods(t *testing.T) {
	w := newXYZ(2)
	w.policies = nps(pol("x", "p", all, ingress(peers{nsPeer(&all)})))
	in := w.input("n1")
	hn := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: "hostnet"}, Spec: corev1.PodSpec{HostNetwork: true}}
	in.Endpoints = append(in.Endpoints, Endpoint{Pod: hn, IPs: []netip.Addr{netip.MustParseAddr("192.168.0.1")}, HostIface: "tabhost"})
	in.Endpoints = append(in.Endpoints, Endpoint{}) // no pod at all
	rs := Compile(in)
	checkRuleset(t, rs)
	for _, s := range rs.Sets {
		if slices.Contains(s.Members, "192.168.0.1") {
			t.Errorf("a hostNetwork pod's address is in %s", s.Name)
		}
	}
	if slices.Contains(rs.Programmed, "x/hostnet") || len(rs.Problems) != 0 {
		t.Errorf("programmed %v problems %v", rs.Programmed, rs.Problems)
	}
	for _, k := range rs.Programmed {
		if w.pod(k).node != "n1" {
			t.Errorf("remote pod %s programmed", k)
		}
	}
}

func TestBadHostIface(t *testing.T) {
	w := newXYZ(1)
	w.policies = nps(pol("x", "deny", all, types(tIn)))
	in := w.input("n1")
	in.Endpoints[0].HostIface = "eth0"              // x/a: not a tabby veth
	in.Endpoints[1].HostIface = "tab+"              // x/b: a wildcard
	in.Endpoints[2].HostIface = "tabya"             // x/c: y/a's
	in.Endpoints[4].HostIface = "tabvery-long-name" // y/b: over 15 bytes
	in.Endpoints[5].HostIface = "tabby.vxlan"       // y/c: tabby's own device
	rs := Compile(in)
	checkRuleset(t, rs)
	// Endpoints are taken in namespace/name order: x/c claims tabya
	// before y/a does.
	want := []string{"x/c", "z/a", "z/b", "z/c"}
	if !slices.Equal(rs.Programmed, want) {
		t.Errorf("programmed %v, want %v", rs.Programmed, want)
	}
	if len(rs.Problems) != 5 {
		t.Fatalf("problems %+v", rs.Problems)
	}
	for _, p := range rs.Problems {
		if p.Kind != KindPod {
			t.Errorf("problem %+v is not of a pod", p)
		}
	}
	if !strings.Contains(rs.Problems[2].Message, "also the interface of pod x/c") {
		t.Errorf("duplicate iface problem: %+v", rs.Problems[2])
	}
}

// DenyUnlisted: a veth no endpoint claims is dropped both ways; listed pods
// behave as without it.
func TestDenyUnlisted(t *testing.T) {
	w := newXYZ(1)
	w.policies = nps(pol("x", "p", ml("pod", "a"), ingress(peers{selPeer(mlp("pod", "b"))})))
	in := w.input("n1")
	in.DenyUnlisted = true
	rs := Compile(in)
	ms := machines(t, rs)
	xa, xb, yb := w.pod("x/a"), w.pod("x/b"), w.pod("y/b")
	for f, m := range ms {
		for _, c := range []struct {
			in, out string
			src     *tpod
			want    verdict
		}{
			{xb.iface(), xa.iface(), xb, vAccept},
			{yb.iface(), xa.iface(), yb, vDrop},
			{yb.iface(), xb.iface(), yb, vAccept},
			{"tabnew", xb.iface(), yb, vDrop},
			{xb.iface(), "tabnew", xb, vDrop},
			{"eth0", "tabnew", w.ext, vDrop},
			{"tabnew", "eth0", xb, vDrop},
			{yb.iface(), "eth0", yb, vAccept},
			{yb.iface(), "tabby.vxlan", yb, vAccept},
			{"tabby.vxlan", xb.iface(), w.ext, vAccept},
			{"tabby.vxlan", xa.iface(), w.ext, vDrop},
			{"tabby.vxlan", "eth0", w.ext, vReturn},
			// An address on a veth that is not its pod's: x/b's veth
			// with y/b's source (spoofed), y/b's with x/b's.
			{xb.iface(), "eth0", yb, vDrop},
			{yb.iface(), xb.iface(), xb, vDrop},
		} {
			dst := xa // the destination address is that of the pod behind c.out
			if c.out == xb.iface() {
				dst = xb
			}
			p := pkt{src: c.src.addr(f), dst: dst.addr(f), in: c.in, out: c.out, proto: "tcp", dport: 80, ctstate: "NEW"}
			if v, _ := m.forward(p); v != c.want {
				t.Errorf("%s %s -> %s: %v, want %v", families[f], c.in, c.out, v, c.want)
			}
		}
	}
	// Packets to a pod's veth with another destination, from both a
	// listed pod and the outside.
	for f, m := range ms {
		for _, p := range []pkt{
			{src: xb.addr(f), dst: yb.addr(f), in: xb.iface(), out: xa.iface()},
			{src: w.ext.addr(f), dst: xb.addr(f), in: "eth0", out: yb.iface()},
		} {
			p.proto, p.dport, p.ctstate = "tcp", 80, "NEW"
			if v, _ := m.forward(p); v != vDrop {
				t.Errorf("%s %s -> %s to %s: %v, want DROP", families[f], p.in, p.out, p.dst, v)
			}
		}
	}
	// The dispatch chains end in the set of the pods no policy of their
	// direction selects, then drop. x/a is selected for ingress only.
	for f, fam := range families {
		eg, in := UnselectedSetName(fam, true), UnselectedSetName(fam, false)
		for _, c := range rs.ChainsFor(fam) {
			var want [][]string
			switch c.Name {
			case ChainFromPod:
				want = [][]string{{"-m", "set", "--match-set", eg, "src,src", "-j", "RETURN"}, {"-i", "tabby+", "-j", "RETURN"}, {"-j", "DROP"}}
			case ChainToPod:
				want = [][]string{{"-m", "set", "--match-set", in, "dst,dst", "-j", "RETURN"}, {"-o", "tabby+", "-j", "RETURN"}, {"-j", "DROP"}}
			default:
				continue
			}
			if got := c.Rules[len(c.Rules)-3:]; !reflect.DeepEqual(got, want) {
				t.Errorf("%s %s ends %q, want %q", fam, c.Name, got, want)
			}
		}
		xaMember := xa.addr(f).String() + "," + xa.iface()
		for _, s := range rs.Sets {
			switch {
			case s.Name == eg && (len(s.Members) != 9 || s.Members[0] != xaMember):
				t.Errorf("%s: %+v, want the 9 local pods", eg, s)
			case s.Name == in && (len(s.Members) != 8 || slices.Contains(s.Members, xaMember)):
				t.Errorf("%s: %+v, want the 8 local pods but x/a", in, s)
			}
		}
	}

	// Without it an unknown veth is open.
	in.DenyUnlisted = false
	ms = machines(t, Compile(in))
	if v, _ := ms[0].forward(pkt{src: yb.v4, dst: xb.v4, in: "tabnew", out: xb.iface(), proto: "tcp", dport: 80, ctstate: "NEW"}); v != vAccept {
		t.Errorf("unlisted veth without DenyUnlisted: %v", v)
	}
	// So is an address on a listed veth that is not its pod's (dispatch is
	// by address and veth): what DenyUnlisted closes, as Ruleset says.
	if v, _ := ms[0].forward(pkt{src: yb.v4, dst: xb.v4, in: yb.iface(), out: xa.iface(), proto: "tcp", dport: 80, ctstate: "NEW"}); v != vAccept {
		t.Errorf("a foreign address on a listed veth without DenyUnlisted: %v", v)
	}
	if v, _ := ms[0].forward(pkt{src: yb.v4, dst: xa.v4, in: yb.iface(), out: xa.iface(), proto: "tcp", dport: 80, ctstate: "NEW"}); v != vDrop {
		t.Errorf("y/b -> x/a without DenyUnlisted: %v, want DROP", v)
	}
}

func TestHostVethPrefix(t *testing.T) {
	w := newXYZ(1)
	w.policies = nps(pol("x", "deny", all, types(tIn)))
	in := w.input("n1")
	in.HostVethPrefix = "tabx"
	rs := Compile(in)
	checkRuleset(t, rs)
	if got := rs.ChainsFor(FamilyIPv4)[0]; got.Name != ChainForward || got.Rules[0][1] != "tabx+" {
		t.Errorf("first chain %+v", got)
	}
	// Only x's veths (tabxa, tabxb, tabxc) have the prefix.
	if !slices.Equal(rs.Programmed, []string{"x/a", "x/b", "x/c"}) || len(rs.Problems) != 6 {
		t.Errorf("programmed %v, %d problems", rs.Programmed, len(rs.Problems))
	}
	in.HostVethPrefix = "bad prefix+"
	if rs := Compile(in); rs.Chains[0].Rules[3][1] != "tab+" {
		t.Errorf("a bad prefix is not replaced by the default: %q", rs.Chains[0].Rules[0])
	}
}

// Problems: what a user is told, and that the rest still holds, failing
// closed: a broken rule allows nothing, its policy still isolates.
func TestProblems(t *testing.T) {
	good := pol("x", "good", ml("pod", "b"), ingress(peers{selPeer(mlp("pod", "c"))}))
	bad := func(name string, opts ...specOpt) *networkingv1.NetworkPolicy {
		return pol("x", name, ml("pod", "a"), append(opts, ingress(peers{nsPeer(mlp("ns", "y"))}))...)
	}
	u16 := func(n int32) *int32 { return &n }
	cases := []struct {
		p        *networkingv1.NetworkPolicy
		msg      string
		isolates bool // x/a is still ingress-isolated (z -> x/a blocked, y -> x/a open)
	}{
		{pol("x", "sel", metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "pod", Operator: "Like"}}}, types(tIn)),
			"spec.podSelector", false},
		{bad("cidr", ingress(peers{ipPeer("10.0.0.0/33")})), `spec.ingress[0].from[0].ipBlock.cidr: "10.0.0.0/33" is not a CIDR`, true},
		{bad("except", ingress(peers{ipPeer("10.1.0.0/16", "10.2.0.0/24")})), `except[0]: "10.2.0.0/24" must be a strict subset of cidr "10.1.0.0/16"`, true},
		{bad("except-same", ingress(peers{ipPeer("10.1.0.0/16", "10.1.0.0/16")})), "strict subset", true},
		{bad("except-family", ingress(peers{ipPeer("10.1.0.0/16", "fd00::/64")})), "strict subset", true},
		{bad("both", ingress(peers{{IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.0/8"}, PodSelector: &all}})), "may not specify both ipBlock and another peer", true},
		{bad("empty-peer", ingress(peers{{}})), "must specify a peer", true},
		{bad("port-name", ingress(nil, named("TCP", "Not_A_Name"))), `"Not_A_Name" is not a port number or a valid port name`, true},
		{bad("port-zero", ingress(nil, num("TCP", 0))), "spec.ingress[0].ports[0].port: 0", true},
		{bad("proto", ingress(nil, num("ICMP", 80))), `"ICMP" is not TCP, UDP or SCTP`, true},
		{bad("endport-lt", ingress(nil, rng("TCP", 90, 80))), "must be greater than or equal to port 90", true},
		{bad("endport-named", ingress(nil, port{Port: named("TCP", "web").Port, EndPort: u16(90)})), "may not be specified when port is a name", true},
		{bad("endport-noport", ingress(nil, port{EndPort: u16(90)})), "may not be specified when port is not specified", true},
		{bad("endport-big", ingress(nil, rng("TCP", 80, 70000))), "spec.ingress[0].ports[0].endPort: 70000", true},
		{bad("nssel", ingress(peers{nsPeer(&metav1.LabelSelector{MatchLabels: map[string]string{"bad key!": "v"}})})), "spec.ingress[0].from[0].namespaceSelector", true},
		{bad("types", types("Sideways", tIn), ingress(peers{nsPeer(mlp("ns", "z"))}, num("TCP", 80), named("TCP", "bad_name"))), `"Sideways" is not Ingress or Egress`, true},
		{pol("", "nons", all, types(tIn)), "metadata.namespace is empty", false},
	}
	for _, c := range cases {
		t.Run(c.p.Name, func(t *testing.T) {
			w := newXYZ(1)
			w.policies = nps(good, c.p)
			rs := Compile(w.input("n1"))
			ms := machines(t, rs)
			if len(rs.Problems) == 0 {
				t.Fatal("no problem reported")
			}
			var msgs []string
			for _, p := range rs.Problems {
				if p.Kind != KindNetworkPolicy || p.Name != c.p.Name || p.Namespace != c.p.Namespace {
					t.Errorf("problem %+v is not about %s/%s", p, c.p.Namespace, c.p.Name)
				}
				msgs = append(msgs, p.Message)
			}
			if all := strings.Join(msgs, "\n"); !strings.Contains(all, c.msg) {
				t.Errorf("problems %q do not say %q", all, c.msg)
			}
			xa, xb, xc, ya, za := w.pod("x/a"), w.pod("x/b"), w.pod("x/c"), w.pod("y/a"), w.pod("z/a")
			for f, m := range ms {
				send := func(from, to *tpod) bool {
					v, _ := m.forward(pkt{src: from.addr(f), dst: to.addr(f), in: from.iface(), out: to.iface(), proto: "tcp", dport: 80, ctstate: "NEW"})
					return v == vAccept
				}
				// The good policy is enforced.
				if !send(xc, xb) || send(xa, xb) {
					t.Errorf("%s: the good policy is not enforced", families[f])
				}
				if got := !send(za, xa); got != c.isolates {
					t.Errorf("%s: z/a -> x/a blocked %v, want %v", families[f], got, c.isolates)
				}
				if c.isolates && !send(ya, xa) {
					t.Errorf("%s: the policy's valid rule is not enforced", families[f])
				}
			}
		})
	}
}
