package labtest

import (
	"fmt"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"
)

// bgpGraph runs the host's `tabbyctl bgp graph` against the lab, as an
// admin runs it from their machine: the status of every node is read by
// exec in its tabby-node pod through the API server.
func bgpGraph(l *Lab, args ...string) (string, error) {
	cmd := exec.Command(Tabbyctl(), append([]string{"bgp", "graph", "--kubeconfig", l.Kubeconfig}, args...)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil || stderr.Len() > 0 {
		return string(out), fmt.Errorf("tabbyctl bgp graph %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return string(out), nil
}

// waitGraph runs bgpGraph until check accepts its output, and returns it.
func waitGraph(t *testing.T, l *Lab, d time.Duration, check func(string) error, args ...string) string {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		out, err := bgpGraph(l, args...)
		if err == nil {
			err = check(out)
		}
		if err == nil {
			return out
		}
		if time.Now().After(deadline) {
			t.Fatalf("%v (waited %v)\n%s", err, d, out)
		}
		time.Sleep(time.Second)
	}
}

// mermaidLinks are the links of a Mermaid graph: "node1 --- node2
// Established<br/>..." with the node IDs replaced by their names.
func mermaidLinks(out string) []string {
	names := map[string]string{}
	vertex := regexp.MustCompile(`^\s+(n\d+)[\[{(]+"([^"<]+)`)
	link := regexp.MustCompile(`^\s+(n\d+) (\S+)\|"([^"]*)"\| (n\d+)$`)
	var links []string
	for _, line := range strings.Split(out, "\n") {
		if m := vertex.FindStringSubmatch(line); m != nil {
			names[m[1]] = strings.Fields(m[2])[0]
		}
		if m := link.FindStringSubmatch(line); m != nil {
			links = append(links, fmt.Sprintf("%s %s %s %s", names[m[1]], m[2], names[m[4]], m[3]))
		}
	}
	return links
}

// expectLinks checks that the links are exactly want ("A form B" each),
// every one Established, and that the label of each has the routes each
// end accepted, as accepted(A, B) says.
func expectLinks(out string, want []string, accepted func(a, b string) string) error {
	links := mermaidLinks(out)
	if len(links) != len(want) {
		return fmt.Errorf("links %q, want %q", links, want)
	}
	for i, l := range links {
		f := strings.Fields(l)
		if strings.Join(f[:3], " ") != want[i] {
			return fmt.Errorf("link %d is %q, want %q", i, l, want[i])
		}
		label := strings.Join(f[3:], " ")
		if !strings.HasPrefix(label, "Established<br/>") {
			return fmt.Errorf("link %q is not Established", l)
		}
		if w := "accepted: " + accepted(f[0], f[2]); !strings.HasSuffix(label, w) {
			return fmt.Errorf("link %q: want %q", l, w)
		}
	}
	return nil
}

// TestBGPGraph draws a 3-node lab with a pod on each node (one block
// each): first the full mesh, every session Established, each end having
// accepted the other's block; then with node3 labelled a route reflector
// as the README says (kubectl label), the reflector's arrows to its two
// clients, each client having accepted the two other blocks over it. DOT
// says the same, and --no-status draws the sessions as configured.
func TestBGPGraph(t *testing.T) {
	l := Up(t, "--nodes", "3")
	waitMesh(t, l, 3, 30*time.Second)
	webs(t, l, 1, 2, 3)

	meshLinks := []string{"node1 --- node2", "node1 --- node3", "node2 --- node3"}
	meshOut := waitGraph(t, l, 60*time.Second, func(out string) error {
		if !strings.Contains(out, `title: "tabby BGP: full mesh, AS 64512"`) {
			return fmt.Errorf("no full mesh in the title")
		}
		return expectLinks(out, meshLinks, func(a, b string) string { return a + " 1, " + b + " 1" })
	}, "--format", "mermaid")
	t.Logf("tabbyctl bgp graph --format mermaid, full mesh:\n%s", meshOut)

	dot, err := bgpGraph(l)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"node1" -> "node2" [dir=none, label="Established`, `"node1" -> "node3" [dir=none`, `"node2" -> "node3" [dir=none`} {
		if !strings.Contains(dot, want) {
			t.Errorf("DOT lacks %s:\n%s", want, dot)
		}
	}
	configured, err := bgpGraph(l, "--no-status", "--format", "mermaid")
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(configured, `-.-|"configured"|`); n != 3 || strings.Contains(configured, "Established") {
		t.Errorf("--no-status: want 3 configured links:\n%s", configured)
	}

	if out, code := l.Kubectl("label", "node", "node3", "tabby.io/route-reflector=true"); code != 0 {
		t.Fatalf("kubectl label: %s", out)
	}
	rrLinks := []string{"node3 --> node1", "node3 --> node2"}
	rr := waitGraph(t, l, 120*time.Second, func(out string) error {
		if !strings.Contains(out, `title: "tabby BGP: route reflectors node3, AS 64512"`) {
			return fmt.Errorf("no route reflector in the title")
		}
		return expectLinks(out, rrLinks, func(a, b string) string { return a + " 1, " + b + " 2" })
	}, "--format", "mermaid")
	t.Logf("tabbyctl bgp graph --format mermaid, node3 a route reflector:\n%s", rr)
	dot, err = bgpGraph(l)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(dot, `"node3" -> "node1" [dir=forward, label="Established`) || strings.Contains(dot, `"node1" -> "node2"`) {
		t.Errorf("DOT with a reflector:\n%s", dot)
	}
	t.Logf("tabbyctl bgp graph (DOT), node3 a route reflector:\n%s", dot)
}
