package netnstest_test

import (
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/tabbynet/tabby/internal/netnstest"
	"github.com/tabbynet/tabby/internal/testnet"
	"github.com/tabbynet/tabby/internal/tier"
)

// listed says whether `ip netns` has name (its file under RunDir; `ip
// netns list` itself trips over other namespaces being removed meanwhile).
func listed(t *testing.T, name string) bool {
	t.Helper()
	_, err := os.Stat(filepath.Join(netnstest.RunDir, name))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	return err == nil
}

// TestNetNodesReachEachOther: two nodes on a bridge of the underlay reach
// each other over IPv4 and IPv6 at once (no DAD wait); a third on
// another bridge does not; code run with Run, Thread and Exec sees the
// node's links; and every namespace is gone when the test that made it
// ends, also when it failed.
func TestNetNodesReachEachOther(t *testing.T) {
	tier.Root(t, "to create network namespaces")
	var names []string
	t.Run("net", func(t *testing.T) {
		u := netnstest.NewNet(t, "br1", "br2")
		a := u.Node("a", "pa", "br1", "192.168.5.1/24", "fd00:5::1/64")
		b := u.Node("b", "pb", "br1", "192.168.5.2/24", "fd00:5::2/64")
		c := u.Node("c", "pc", "br2", "192.168.5.3/24")
		names = []string{u.Underlay.Name, a.Name, b.Name, c.Name}
		for _, n := range names {
			if !listed(t, n) {
				t.Errorf("ip netns list lacks %s", n)
			}
		}
		for _, dst := range []string{"192.168.5.2", "fd00:5::2"} {
			if err := testnet.Ping(a, net.ParseIP(dst)); err != nil {
				t.Errorf("a -> %s: %v", dst, err)
			}
		}
		if err := testnet.Ping(a, net.ParseIP("192.168.5.3")); err == nil {
			t.Error("a reached c, which is on another bridge")
		}
		if out := b.Exec("ip", "-br", "addr", "show", "eth0"); !strings.Contains(out, "192.168.5.2/24") {
			t.Errorf("ip addr in b: %s", out)
		}
		err := c.Thread(func() error {
			_, err := netlink.LinkByName("eth0")
			return err
		})
		if err != nil {
			t.Errorf("eth0 from a thread in c: %v", err)
		}
		a.Must(func() error {
			if _, err := netlink.LinkByName("pa"); err == nil {
				return errors.New("the underlay's port pa is in the node")
			}
			return nil
		})
	})
	for _, n := range names {
		if listed(t, n) {
			t.Errorf("namespace %s is still there after its test ended", n)
		}
	}
}

// TestCleanupAfterFailure: a test that fails halfway leaves no namespace.
// The failing test runs in a child process (a failed subtest would fail
// this test too).
func TestCleanupAfterFailure(t *testing.T) {
	if os.Getenv("NETNSTEST_CHILD") != "" {
		n := netnstest.New(t, "doomed")
		if err := os.WriteFile(os.Getenv("NETNSTEST_CHILD"), []byte(n.Name), 0o644); err != nil {
			t.Fatal(err)
		}
		n.IP("link add thisisfartoolongforalinkname type bridge")
		t.Error("ip accepted a link name over 15 characters")
		return
	}
	tier.Root(t, "to create network namespaces")
	file := t.TempDir() + "/name"
	cmd := exec.Command(os.Args[0], "-test.run=^TestCleanupAfterFailure$", "-test.count=1")
	cmd.Env = append(os.Environ(), "NETNSTEST_CHILD="+file)
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "ip -n") {
		t.Fatalf("the child should fail on the bad ip command: %v\n%s", err, out)
	}
	name, rerr := os.ReadFile(file)
	if rerr != nil || len(name) == 0 {
		t.Fatalf("the child did not say its namespace: %v\n%s", rerr, out)
	}
	if listed(t, string(name)) {
		t.Errorf("namespace %s outlived the failed test:\n%s", name, out)
	}
}

// TestPlugSaysWhatIsWrong: bad names and addresses are refused with the
// fix, before anything is made.
func TestPlugSaysWhatIsWrong(t *testing.T) {
	u := netnstest.NewNet(t, "br0")
	n := netnstest.New(t, "n")
	for _, c := range []struct{ dev, port, addr, want string }{
		{"eth0", "averyveryverylongport", "10.0.0.1/24", "longer than the kernel's 15"},
		{"eth0", "p0", "10.0.0.1", "CIDR notation"},
		{"eth0", "p0", "10.0.0.1/24", ""},
	} {
		err := u.Plug(n, c.dev, c.port, "br0", c.addr)
		if c.want == "" && err != nil || c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)) {
			t.Errorf("Plug(%s, %s, %s): %v, want %q", c.dev, c.port, c.addr, err, c.want)
		}
	}
	if err := u.Plug(n, "eth1", "p1", "nosuchbridge"); err == nil || !strings.Contains(err.Error(), "nosuchbridge") {
		t.Errorf("Plug onto a missing bridge: %v", err)
	}
}

// TestServe: Serve's function runs in the namespace until the test ends
// and sees its context cancelled then.
func TestServe(t *testing.T) {
	tier.Root(t, "to create network namespaces")
	stopped := make(chan struct{})
	t.Run("serving", func(t *testing.T) {
		n := netnstest.New(t, "serve")
		n.IP("link add probe0 type bridge")
		n.Serve("the probe", func() error {
			_, err := netlink.LinkByName("probe0")
			return err
		}, func(ctx context.Context) error {
			<-ctx.Done()
			close(stopped)
			return nil
		})
	})
	select {
	case <-stopped:
	default:
		t.Error("Serve's cleanup returned before serve did")
	}
}

// TestRemove: Remove takes the namespace away at once, and the cleanup
// after it neither fails nor removes anything twice.
func TestRemove(t *testing.T) {
	n := netnstest.New(t, "early")
	if !listed(t, n.Name) {
		t.Fatalf("ip netns list lacks %s", n.Name)
	}
	n.Remove()
	n.Remove()
	if listed(t, n.Name) {
		t.Errorf("%s is still there after Remove", n.Name)
	}
}

// TestBadLabelSaysWhatToUse: a label ip netns cannot take fails the test
// (in a child process) saying which characters to use.
func TestBadLabelSaysWhatToUse(t *testing.T) {
	if label := os.Getenv("NETNSTEST_LABEL"); label != "" {
		netnstest.New(t, label)
		return
	}
	tier.Root(t, "to create network namespaces")
	cmd := exec.Command(os.Args[0], "-test.run=^TestBadLabelSaysWhatToUse$", "-test.count=1")
	cmd.Env = append(os.Environ(), "NETNSTEST_LABEL=pod a/b")
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), `namespace label "pod a/b": use letters, digits`) {
		t.Fatalf("want the child to fail naming the label and what to use: %v\n%s", err, out)
	}
}
