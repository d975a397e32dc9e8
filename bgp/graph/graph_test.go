package graph

import (
	"fmt"
	"os/exec"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/tabbynet/tabby/api/v1"
	"github.com/tabbynet/tabby/daemon/nodestatus"
)

// node is a Node as tabbyd publishes it: address annotation, labels.
func node(name, addr string, labels ...string) corev1.Node {
	n := corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{},
		Annotations: map[string]string{v1.AnnotationNodeIPv4Address: addr + "/24"}}}
	for i := 0; i+1 < len(labels); i += 2 {
		n.Labels[labels[i]] = labels[i+1]
	}
	return n
}

func reflector(name, addr string) corev1.Node {
	return node(name, addr, v1.LabelRouteReflector, "true")
}

var three = []corev1.Node{node("node1", "10.0.0.1"), node("node2", "10.0.0.2"), node("node3", "10.0.0.3")}

// sessions is the model's sessions in a line each: "A-B type" for
// sessions of equals, "A->B type" where A reflects for B, "A<->B" where
// both do, then the state.
func sessions(m Model) string {
	var out []string
	for _, s := range m.Sessions {
		link := "-"
		switch {
		case s.BothReflect:
			link = "<->"
		case s.Reflects:
			link = "->"
		}
		out = append(out, fmt.Sprintf("%s%s%s %s %s", s.A, link, s.B, s.Type, s.State()))
	}
	return strings.Join(out, "\n")
}

func TestBuild(t *testing.T) {
	tor := v1.BGPPeer{ObjectMeta: metav1.ObjectMeta{Name: "tor"}, Spec: v1.BGPPeerSpec{PeerIP: "192.0.2.1", ASNumber: 65001}}
	torOf1 := v1.BGPPeer{ObjectMeta: metav1.ObjectMeta{Name: "tor-1"}, Spec: v1.BGPPeerSpec{Node: "node1", PeerIP: "192.0.2.9:1179", ASNumber: 65002}}
	off := false
	for _, tc := range []struct {
		name  string
		in    Inputs
		want  string
		title string
	}{{
		name:  "mesh of 3",
		in:    Inputs{Nodes: three},
		title: "tabby BGP: full mesh, AS 64512",
		want: `node1-node2 node-mesh configured
node1-node3 node-mesh configured
node2-node3 node-mesh configured`,
	}, {
		name:  "1 reflector and 2 clients",
		in:    Inputs{Nodes: []corev1.Node{node("node1", "10.0.0.1"), node("node2", "10.0.0.2"), reflector("rr", "10.0.0.9")}},
		title: "tabby BGP: route reflectors rr, AS 64512",
		want: `rr->node1 route-reflector configured
rr->node2 route-reflector configured`,
	}, {
		name: "2 reflectors of one cluster",
		in:   Inputs{Nodes: []corev1.Node{node("node1", "10.0.0.1"), reflector("rr1", "10.0.0.8"), reflector("rr2", "10.0.0.9")}},
		want: `rr1->node1 route-reflector configured
rr1-rr2 reflectors configured
rr2->node1 route-reflector configured`,
	}, {
		name: "2 reflectors of different clusters reflect for each other",
		in: Inputs{Nodes: []corev1.Node{node("node1", "10.0.0.1"),
			node("rr1", "10.0.0.8", v1.LabelRouteReflector, "true", v1.LabelRouteReflectorClusterID, "244.0.0.8"),
			node("rr2", "10.0.0.9", v1.LabelRouteReflector, "true", v1.LabelRouteReflectorClusterID, "244.0.0.9")}},
		want: `rr1->node1 route-reflector configured
rr1<->rr2 route-reflector configured
rr2->node1 route-reflector configured`,
	}, {
		name: "external peers, every node's and one node's",
		in:   Inputs{Nodes: three[:2], BGPPeers: []v1.BGPPeer{tor, torOf1}},
		want: `node1-node2 node-mesh configured
node1-peer/192.0.2.1 bgppeer/tor configured
node1-peer/192.0.2.9 bgppeer/tor-1 configured
node2-peer/192.0.2.1 bgppeer/tor configured`,
	}, {
		name:  "no mesh, peers by selector",
		title: "tabby BGP: node-to-node mesh off, AS 64512",
		in: Inputs{Nodes: []corev1.Node{node("a", "10.0.0.1", "rack", "1"), node("b", "10.0.0.2", "rack", "2"), node("c", "10.0.0.3", "rack", "2")},
			Config: v1.BGPConfigurationSpec{NodeToNodeMeshEnabled: &off},
			BGPPeers: []v1.BGPPeer{{ObjectMeta: metav1.ObjectMeta{Name: "racks"}, Spec: v1.BGPPeerSpec{
				NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"rack": "1"}},
				PeerSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"rack": "2"}}}}}},
		want: `a-b bgppeer/racks configured
a-c bgppeer/racks configured`,
	}, {
		name: "states from both ends",
		in: Inputs{Nodes: three, Status: map[string]*nodestatus.Status{
			"node1": {Node: "node1", Ready: true, Peers: []nodestatus.Peer{
				{Address: "10.0.0.2", Node: "node2", Type: "node-mesh", State: "Established", Accepted: 1},
				{Address: "10.0.0.3", Node: "node3", Type: "node-mesh", State: "Active"}}},
			"node2": {Node: "node2", Ready: true, Peers: []nodestatus.Peer{
				{Address: "10.0.0.1", Node: "node1", Type: "node-mesh", State: "Established", Accepted: 1},
				{Address: "10.0.0.3", Node: "node3", Type: "node-mesh", State: "Established", Accepted: 1}}},
			// node3 thinks its session with node1 is up; node1 does not.
			"node3": {Node: "node3", Ready: true, Peers: []nodestatus.Peer{
				{Address: "10.0.0.1", Node: "node1", Type: "node-mesh", State: "Established"}}},
		}},
		want: `node1-node2 node-mesh Established
node1-node3 node-mesh Active
node2-node3 node-mesh Established`,
	}, {
		name: "a session only the status knows, being replaced",
		in: Inputs{Nodes: []corev1.Node{node("node1", "10.0.0.1"), node("node2", "10.0.0.2"), reflector("rr", "10.0.0.9")},
			Status: map[string]*nodestatus.Status{"node1": {Node: "node1", Peers: []nodestatus.Peer{
				{Address: "10.0.0.2", Node: "node2", Type: "node-mesh", State: "Established"},
				{Address: "10.0.0.9", Node: "rr", Type: "route-reflector", State: "Established"}}}}},
		want: `node1-node2 node-mesh Established
rr->node1 route-reflector Established
rr->node2 route-reflector configured`,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			m := Build(tc.in)
			if got := sessions(m); got != tc.want {
				t.Errorf("sessions:\n%s\nwant:\n%s", got, tc.want)
			}
			if tc.title != "" && m.Title() != tc.title {
				t.Errorf("title %q, want %q", m.Title(), tc.title)
			}
			if len(m.Problems) > 0 {
				t.Errorf("problems: %q", m.Problems)
			}
		})
	}
}

// TestBuildProblems: what tabbyd would complain of is reported, and the
// nodes whose status could not be read are named.
func TestBuildProblems(t *testing.T) {
	bad := node("node2", "10.0.0.2")
	bad.Annotations[v1.AnnotationASNumber] = "x"
	m := Build(Inputs{Nodes: []corev1.Node{node("node1", "10.0.0.1"), bad},
		BGPPeers:     []v1.BGPPeer{{ObjectMeta: metav1.ObjectMeta{Name: "p"}, Spec: v1.BGPPeerSpec{PeerIP: "nope"}}},
		StatusErrors: map[string]string{"node1": "exec forbidden"}})
	got := strings.Join(m.Problems, "\n")
	for _, want := range []string{`annotation tabby.io/as-number="x"`, `BGPPeer p: peerIP "nope"`, "node node1: no live status: exec forbidden"} {
		if !strings.Contains(got, want) {
			t.Errorf("problems lack %q:\n%s", want, got)
		}
	}
}

// TestRender: the whole DOT and Mermaid text of a reflector, a client
// and an external peer, with live states.
func TestRender(t *testing.T) {
	in := Inputs{Nodes: []corev1.Node{node("node1", "10.0.0.1"), reflector("rr", "10.0.0.9")},
		BGPPeers: []v1.BGPPeer{{ObjectMeta: metav1.ObjectMeta{Name: "tor"}, Spec: v1.BGPPeerSpec{Node: "rr", PeerIP: "192.0.2.1", ASNumber: 65001}}},
		Status: map[string]*nodestatus.Status{
			"rr": {Node: "rr", Ready: true, Routes: nodestatus.Routes{Learned: 3, Advertised: 1}, Peers: []nodestatus.Peer{
				{Address: "10.0.0.1", Node: "node1", Type: "route-reflector-client", State: "Established", Accepted: 1},
				{Address: "192.0.2.1", Type: "bgppeer/tor", State: "Active"}}},
			"node1": {Node: "node1", Ready: true, Routes: nodestatus.Routes{Learned: 1, Advertised: 1}, Peers: []nodestatus.Peer{
				{Address: "10.0.0.9", Node: "rr", Type: "route-reflector", State: "Established", Accepted: 2, Rejected: 1}}},
		}}
	m := Build(in)
	wantDOT := `digraph "tabby-bgp" {
	label="tabby BGP: route reflectors rr, AS 64512";
	labelloc=t;
	node [shape=box, style=rounded, fontname="Helvetica"];
	edge [fontname="Helvetica", fontsize=10];
	"node1" [label="node1\n10.0.0.1 · AS 64512\nroutes: 1 learned, 1 advertised"];
	"rr" [label="rr (route reflector 244.0.0.1)\n10.0.0.9 · AS 64512\nroutes: 3 learned, 1 advertised", style="rounded,filled,bold", fillcolor="#fff2cc"];
	"peer/192.0.2.1" [label="bgppeer/tor\n192.0.2.1 · AS 65001", shape=ellipse];
	"rr" -> "node1" [dir=forward, label="Established\naccepted: rr 1, node1 2 (1 rejected)", color="#2e7d32", fontcolor="#2e7d32"];
	"rr" -> "peer/192.0.2.1" [dir=none, label="Active · bgppeer/tor\naccepted: rr 0", color="#c62828", fontcolor="#c62828"];
}
`
	if got := DOT(m); got != wantDOT {
		t.Errorf("DOT:\n%s\nwant:\n%s", got, wantDOT)
	}
	wantMermaid := `---
title: "tabby BGP: route reflectors rr, AS 64512"
---
flowchart LR
    n0["node1<br/>10.0.0.1 · AS 64512<br/>routes: 1 learned, 1 advertised"]
    n1{{"rr (route reflector 244.0.0.1)<br/>10.0.0.9 · AS 64512<br/>routes: 3 learned, 1 advertised"}}
    n2(["bgppeer/tor<br/>192.0.2.1 · AS 65001"])
    n1 -->|"Established<br/>accepted: rr 1, node1 2 (1 rejected)"| n0
    n1 ---|"Active · bgppeer/tor<br/>accepted: rr 0"| n2
    style n1 fill:#fff2cc
    linkStyle 0 stroke:#2e7d32,color:#2e7d32
    linkStyle 1 stroke:#c62828,color:#c62828
`
	if got := Mermaid(m); got != wantMermaid {
		t.Errorf("Mermaid:\n%s\nwant:\n%s", got, wantMermaid)
	}

	// Without status every session is dashed (DOT) or dotted (Mermaid).
	in.Status = nil
	m = Build(in)
	if got := DOT(m); strings.Count(got, "style=dashed") != 2 || strings.Contains(got, "routes:") {
		t.Errorf("DOT without status:\n%s", got)
	}
	if got := Mermaid(m); !strings.Contains(got, `n1 -.->|"configured"| n0`) || !strings.Contains(got, `n1 -.-|"configured · bgppeer/tor"| n2`) {
		t.Errorf("Mermaid without status:\n%s", got)
	}
}

// TestEscaping: names that would end or change a label are escaped.
func TestEscaping(t *testing.T) {
	for _, tc := range []struct{ in, dot, mermaid string }{
		{`plain`, `"plain"`, `plain`},
		{`say "hi"`, `"say \"hi\""`, `say #quot;hi#quot;`},
		{`back\slash`, `"back\\slash"`, `back\slash`},
		{"two\nlines", `"two\nlines"`, `two lines`},
		{`<b>x</b>`, `"<b>x</b>"`, `#lt;b#gt;x#lt;/b#gt;`},
		{`a|b #1 ` + "`c`", `"a|b #1 ` + "`c`" + `"`, `a#124;b #35;1 #96;c#96;`},
	} {
		if got := dotQuote(tc.in); got != tc.dot {
			t.Errorf("dotQuote(%q) = %s, want %s", tc.in, got, tc.dot)
		}
		if got := mermaidLabel([]string{tc.in}); got != tc.mermaid {
			t.Errorf("mermaidLabel(%q) = %s, want %s", tc.in, got, tc.mermaid)
		}
	}
	// An external peer's odd BGPPeer name reaches both outputs escaped.
	m := Model{AS: 1, Mesh: true, Externals: []External{{ID: `peer/"x"`, Address: "192.0.2.1", AS: 2, BGPPeers: []string{`a"b`}}}}
	if got := DOT(m); !strings.Contains(got, `"peer/\"x\"" [label="bgppeer/a\"b\n192.0.2.1 · AS 2", shape=ellipse]`) {
		t.Errorf("DOT:\n%s", got)
	}
	if got := Mermaid(m); !strings.Contains(got, `n0(["bgppeer/a#quot;b<br/>192.0.2.1 · AS 2"])`) {
		t.Errorf("Mermaid:\n%s", got)
	}
}

// TestDOTIsGraphviz: Graphviz itself reads every model's DOT, odd names
// included, and draws each node and session.
func TestDOTIsGraphviz(t *testing.T) {
	dot, err := exec.LookPath("dot")
	if err != nil {
		t.Skip("SKIPPING: Graphviz's dot is not installed (hack/install-deps.sh installs the Debian package graphviz)")
	}
	odd := node(`we"ird\name`, "10.0.0.7")
	m := Build(Inputs{Nodes: []corev1.Node{node("node1", "10.0.0.1"), reflector("rr", "10.0.0.9"), odd},
		BGPPeers: []v1.BGPPeer{{ObjectMeta: metav1.ObjectMeta{Name: "tor"}, Spec: v1.BGPPeerSpec{PeerIP: "[2001:db8::1]:1179", ASNumber: 65001}}}})
	cmd := exec.Command(dot, "-Tsvg")
	cmd.Stdin = strings.NewReader(DOT(m))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	svg, err := cmd.Output()
	if err != nil || stderr.Len() > 0 {
		t.Fatalf("dot -Tsvg: %v\n%s\n%s", err, stderr.String(), DOT(m))
	}
	// Graphviz titles each node with its ID and each edge A->B; labels
	// read DOT's escapes (IDs keep a backslash doubled).
	for _, want := range []string{"<title>node1</title>", "<title>rr&#45;&gt;node1</title>", `<title>we&quot;ird\\name</title>`, `>we&quot;ird\name</text>`} {
		if !strings.Contains(string(svg), want) {
			t.Errorf("the SVG lacks %s", want)
		}
	}
	if n := strings.Count(string(svg), `class="edge"`); n != len(m.Sessions) || n != 2 {
		t.Errorf("the SVG has %d edges, the model %d sessions (want 2)", n, len(m.Sessions))
	}
}
