package bgp

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tabbynet/tabby/internal/testnet"
)

// BIRD 2 (Debian's bird2) as the top-of-rack router of the lab, node 254.

// The prefixes BIRD originates: birdOrigin6 only in a dual-stack lab.
const (
	birdOrigin  = "192.0.2.0/24"
	birdOrigin6 = "2001:db8:b12d::/48"
)

// bird is a BIRD process in a lab namespace.
type bird struct {
	t    *testing.T
	sock string
	logs *testnet.SyncBuffer
}

// startBird runs BIRD in node's namespace, peering with the lab nodes in
// peers from AS as; iBGP sessions get `direct` (BIRD treats iBGP as
// multihop otherwise). It originates birdOrigin.
func startBird(t *testing.T, node *labNode, as uint32, peers map[int]uint32) *bird {
	t.Helper()
	return startBirdRoutes(t, node, as, peers)
}

// startBirdRoutes is startBird with more prefixes BIRD originates (of
// either family). In a dual-stack lab BIRD also originates birdOrigin6
// and has an IPv6 session with each peer besides the IPv4 one, named
// node<i>v6, from its IPv6 address to the node's.
func startBirdRoutes(t *testing.T, node *labNode, as uint32, peers map[int]uint32, extra ...string) *bird {
	t.Helper()
	dir := t.TempDir()
	var conf strings.Builder
	fmt.Fprintf(&conf, "router id %s;\nlog stderr all;\nprotocol device {}\n", node.addr.Addr())
	dual := node.addr6.IsValid()
	origins := map[bool][]string{false: {birdOrigin}}
	if dual {
		origins[true] = []string{birdOrigin6}
	}
	for _, r := range extra {
		v6 := strings.Contains(r, ":")
		origins[v6] = append(origins[v6], r)
	}
	for _, v6 := range []bool{false, true} {
		if len(origins[v6]) == 0 {
			continue
		}
		fmt.Fprintf(&conf, "protocol static { %s; ", map[bool]string{false: "ipv4", true: "ipv6"}[v6])
		for _, r := range origins[v6] {
			fmt.Fprintf(&conf, "route %s blackhole; ", r)
		}
		fmt.Fprintf(&conf, "}\n")
	}
	for i := 1; i <= 9; i++ {
		peerAS, ok := peers[i]
		if !ok {
			continue
		}
		direct := ""
		if peerAS == as {
			direct = "direct;"
		}
		fmt.Fprintf(&conf, "protocol bgp node%d { local %s as %d; neighbor %s as %d; %s graceful restart on; debug { states, routes }; ipv4 { import all; export all; }; }\n",
			i, node.addr.Addr(), as, addrOf(i), peerAS, direct)
		if dual {
			fmt.Fprintf(&conf, "protocol bgp node%dv6 { local %s as %d; neighbor %s as %d; %s graceful restart on; debug { states, routes }; ipv6 { import all; export all; }; }\n",
				i, node.addr6.Addr(), as, addr6Of(i), peerAS, direct)
		}
	}
	confPath := filepath.Join(dir, "bird.conf")
	if err := os.WriteFile(confPath, []byte(conf.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	logs := &testnet.SyncBuffer{}
	b := &bird{t: t, sock: filepath.Join(dir, "bird.ctl"), logs: logs}
	cmd := node.ns.Command("bird", "-f", "-c", confPath, "-s", b.sock)
	cmd.Stdout, cmd.Stderr = logs, logs
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting bird: %v", err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("bird config:\n%s\nbird logs:\n%s", conf.String(), logs.String())
		}
	})
	eventually(t, 10*time.Second, "bird answers on its control socket", func() (bool, string) {
		out, err := b.birdc("show status")
		return err == nil, out
	})
	return b
}

func (b *bird) birdc(args ...string) (string, error) {
	out, err := exec.Command("birdc", append([]string{"-s", b.sock}, args...)...).CombinedOutput()
	return string(out), err
}

// routes returns BIRD's routes: prefix -> the next hops of all its routes
// to it, sorted, "blackhole" for its own.
func (b *bird) routes() map[string][]string {
	b.t.Helper()
	out, err := b.birdc("show", "route")
	if err != nil {
		b.t.Fatalf("birdc show route: %v: %s", err, out)
	}
	routes := map[string][]string{}
	var cur string
	for _, line := range strings.Split(out, "\n") {
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		if _, err := netip.ParsePrefix(fields[0]); err == nil {
			cur = fields[0]
			if strings.Contains(line, "blackhole") {
				routes[cur] = append(routes[cur], "blackhole")
			}
		}
		if i := strings.Index(line, "via "); i >= 0 && cur != "" {
			routes[cur] = append(routes[cur], strings.Fields(line[i+4:])[0])
		}
	}
	for _, hops := range routes {
		slices.Sort(hops)
	}
	return routes
}

// established says whether BIRD's session with lab node i is up (its
// IPv6 session with suffix "v6").
func (b *bird) established(i int, suffix ...string) bool {
	out, _ := b.birdc("show", "protocols", fmt.Sprintf("node%d%s", i, strings.Join(suffix, "")))
	return strings.Contains(out, "Established")
}

func (b *bird) waitRoute(prefix string, want string) {
	b.t.Helper()
	eventually(b.t, 30*time.Second, fmt.Sprintf("bird has %s via %s", prefix, want), func() (bool, string) {
		got := strings.Join(b.routes()[prefix], ",")
		return got == want, got
	})
}
