package labimage

import (
	"bytes"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestRecipesRun builds the Tabby, KubeProxy and Agnhost recipes (with the
// static test program standing in for the Go binaries), unpacks each image
// and runs the image's own programs with chroot in a network namespace of
// the test's own: iptables, ip6tables, ipset, iptables-restore and -save
// (so every library and xtables module they load is in the image),
// ip, ss, tc, modprobe, conntrack, and agnhost's shell and tools.
func TestRecipesRun(t *testing.T) {
	needRoot(t, "chroot into the images and make a network namespace")
	c := debCache(t)
	bins := binDir(t, append(slices.Clone(TabbyBinaries), "kube-proxy", "agnhost")...)

	iptablesChecks := func(t *testing.T, r runner) {
		if out := r.run(t, "", "/usr/sbin/iptables", "--version"); !strings.Contains(out, "nf_tables") {
			t.Errorf("iptables --version: %q, want the nf_tables backend", out)
		}
		if out := r.run(t, "", "/usr/sbin/ipset", "version"); !strings.Contains(out, "ipset v") {
			t.Errorf("ipset version: %q", out)
		}
		r.run(t, "", "/usr/sbin/ipset", "create", "tabbyimgtest", "hash:ip")
		r.run(t, "", "/usr/sbin/ipset", "add", "tabbyimgtest", "192.0.2.1")
		r.run(t, "", "/usr/sbin/iptables", "-t", "filter", "-N", "TEST-CHAIN")
		r.run(t, "", "/usr/sbin/iptables", "-A", "TEST-CHAIN", "-p", "tcp", "--dport", "80", "-m", "conntrack", "--ctstate", "NEW", "-m", "comment", "--comment", "labimage test", "-j", "ACCEPT")
		r.run(t, "", "/usr/sbin/iptables", "-A", "TEST-CHAIN", "-m", "set", "--match-set", "tabbyimgtest", "src", "-j", "DROP")
		r.run(t, "", "/usr/sbin/iptables", "-t", "nat", "-N", "TEST-NAT")
		r.run(t, "", "/usr/sbin/iptables", "-t", "nat", "-A", "TEST-NAT", "-p", "udp", "-j", "MASQUERADE")
		r.run(t, "", "/usr/sbin/ip6tables", "-N", "TEST6-CHAIN")
		r.run(t, "*filter\n:TEST-RESTORE - [0:0]\n-A TEST-RESTORE -s 198.51.100.0/24 -j RETURN\nCOMMIT\n", "/usr/sbin/iptables-restore", "--noflush")
		save := r.run(t, "", "/usr/sbin/iptables-nft-save")
		for _, want := range []string{
			":TEST-CHAIN - [0:0]",
			`-A TEST-CHAIN -p tcp -m tcp --dport 80 -m conntrack --ctstate NEW -m comment --comment "labimage test" -j ACCEPT`,
			"-A TEST-CHAIN -m set --match-set tabbyimgtest src -j DROP",
			"-A TEST-NAT -p udp -j MASQUERADE",
			"-A TEST-RESTORE -s 198.51.100.0/24 -j RETURN",
		} {
			if !strings.Contains(save, want) {
				t.Errorf("iptables-nft-save does not list %q:\n%s", want, save)
			}
		}
		if save6 := r.run(t, "", "/usr/sbin/ip6tables-save"); !strings.Contains(save6, ":TEST6-CHAIN") {
			t.Errorf("ip6tables-save does not list TEST6-CHAIN:\n%s", save6)
		}
		if out := r.run(t, "", "/usr/sbin/modprobe", "--version"); !strings.Contains(out, "kmod version") {
			t.Errorf("modprobe --version: %q", out)
		}
	}

	t.Run("tabby", func(t *testing.T) {
		r := newRunner(t, c, Tabby(bins, "test"))
		iptablesChecks(t, r)
		if out := r.run(t, "", "/usr/bin/ip", "link", "show", "lo"); !strings.Contains(out, "lo: <LOOPBACK>") {
			t.Errorf("ip link show lo: %q", out)
		}
		for _, cmd := range [][]string{{"/usr/bin/ip", "-V"}, {"/usr/bin/ss", "-V"}, {"/usr/sbin/tc", "-V"}, {"/usr/sbin/bridge", "-V"}} {
			if out := r.run(t, "", cmd...); !strings.Contains(out, "utility, ") {
				t.Errorf("%s: %q", strings.Join(cmd, " "), out)
			}
		}
		for _, b := range TabbyBinaries {
			if out := r.run(t, "", "/usr/local/bin/"+b); out != "hello from labimage\n" {
				t.Errorf("/usr/local/bin/%s: %q", b, out)
			}
		}
	})

	t.Run("kube-proxy", func(t *testing.T) {
		r := newRunner(t, c, KubeProxy(filepath.Join(bins, "kube-proxy")))
		iptablesChecks(t, r)
		if out := r.run(t, "", "/usr/sbin/conntrack", "--version"); !strings.Contains(out, "conntrack v") {
			t.Errorf("conntrack --version: %q", out)
		}
		r.run(t, "", "/usr/sbin/nft", "add", "table", "inet", "tabbyimgtest")
		r.run(t, "", "/usr/sbin/nft", "add", "chain", "inet", "tabbyimgtest", "services", "{ type nat hook prerouting priority -100 ; }")
		if out := r.run(t, "", "/usr/sbin/nft", "list", "ruleset"); !strings.Contains(out, "table inet tabbyimgtest") || !strings.Contains(out, "chain services") {
			t.Errorf("nft list ruleset:\n%s", out)
		}
		if out := r.run(t, "", "/usr/local/bin/kube-proxy"); out != "hello from labimage\n" {
			t.Errorf("kube-proxy: %q", out)
		}
	})

	t.Run("agnhost", func(t *testing.T) {
		r := newRunner(t, c, Agnhost(filepath.Join(bins, "agnhost")))
		if out := r.run(t, "", "/agnhost-2", "pause-stand-in"); out != "pause-stand-in\n" {
			t.Errorf("/agnhost-2: %q", out)
		}
		script := `set -e
echo "sum=$((40 + 2))"
hostname >/dev/null
command -v nc; command -v ip
grep -c group-defined-in-image /etc/group
sleep 0
nc -h 2>&1 | head -n 1
ip -V
ss -V
for tool in cat wget nslookup ping timeout sed awk seq; do command -v $tool; done
test -d /uploads && test -k /tmp && test -s /localhost.crt && test -s /localhost.key && echo dirs-ok
curl --version | head -n 1
dig -v 2>&1
getent passwd user-defined-in-image
`
		out := r.run(t, "", "/bin/sh", "-c", script)
		for _, want := range []string{
			"sum=42", "/usr/bin/nc\n/usr/sbin/ip\n", "OpenBSD netcat", "ip utility, iproute2", "ss utility, iproute2", "/usr/bin/wget", "/usr/bin/nslookup", "/bin/ping", "dirs-ok",
			"curl 7.", "DiG 9.", "user-defined-in-image:x:1000:1000",
		} {
			if !strings.Contains(out, want) {
				t.Errorf("agnhost's shell did not print %q:\n%s", want, out)
			}
		}
	})
}

// runner runs an image's programs with chroot in a network namespace of
// its own.
type runner struct {
	root, netns string
}

// newRunner builds spec, unpacks it and makes a network namespace, both
// removed when the test ends (also when it fails).
func newRunner(t *testing.T, c *DebCache, spec Spec) runner {
	t.Helper()
	start := time.Now()
	out, id := build(t, spec, c)
	st, err := os.Stat(out)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: %s, %.1f MB, built in %v", spec.Ref, id, float64(st.Size())/1e6, time.Since(start).Round(10*time.Millisecond))
	root := t.TempDir()
	extract(t, load(t, out, spec.Ref), root)
	for _, d := range []string{"proc", "dev"} { // as container runtimes make them
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	b := make([]byte, 4)
	rand.Read(b)
	ns := "tabbyimgtest-" + hex.EncodeToString(b)
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v: %s", ns, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "delete", ns).CombinedOutput(); err != nil {
			t.Errorf("ip netns delete %s: %v: %s", ns, err, out)
		}
	})
	return runner{root: root, netns: ns}
}

// run runs args inside the image with stdin and returns what it printed on
// standard output; a failure fails the test. As in a container, /proc and
// /dev are mounted (in a mount namespace of the command's own).
func (r runner) run(t *testing.T, stdin string, args ...string) string {
	t.Helper()
	const inside = `mount -t proc proc "$0/proc" && mount --rbind /dev "$0/dev" && exec chroot "$0" "$@"`
	cmd := exec.Command("ip", append([]string{"netns", "exec", r.netns, "unshare", "--mount", "--propagation", "private", "sh", "-c", inside, r.root}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	cmd.Env = []string{DefaultPath, "LC_ALL=C"}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s in the image: %v\nstdout: %s\nstderr: %s", strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return stdout.String()
}

// TestPorterCertificate checks the pair agnhost's porter serves TLS with.
func TestPorterCertificate(t *testing.T) {
	pair, err := tls.X509KeyPair(porterCert, porterKey)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := cert.VerifyHostname("127.0.0.1"); err != nil {
		t.Error(err)
	}
	if cert.NotAfter.Before(time.Now().AddDate(50, 0, 0)) {
		t.Errorf("the certificate expires on %v", cert.NotAfter)
	}
}

// TestRecipesPackages checks the recipes' package lists against the lists
// they are made of, and that the Tabby image's packages are TabbyPackages
// plus libraries only.
func TestRecipesPackages(t *testing.T) {
	tabby := Tabby("/bin", "v1")
	for _, p := range TabbyPackages {
		if !slices.Contains(tabby.Debs, p) {
			t.Errorf("Tabby lacks %s", p)
		}
	}
	for _, p := range tabby.Debs {
		if p == "debconf" || p == "perl-base" || p == "dpkg" || p == "gcc-12-base" || p == "libcap2-bin" {
			t.Errorf("Tabby carries %s, which only maintainer scripts or documentation need", p)
		}
	}
	if !slices.IsSorted(tabby.Debs) || len(slices.Compact(slices.Clone(tabby.Debs))) != len(tabby.Debs) {
		t.Errorf("Tabby's packages are not sorted and unique: %v", tabby.Debs)
	}
	if got := len(tabby.Files); got != len(TabbyBinaries) {
		t.Errorf("Tabby has %d files, want %d", got, len(TabbyBinaries))
	}
	for _, s := range []Spec{tabby, KubeProxy("/kp")} {
		if s.Symlinks["/usr/sbin/iptables"] != "xtables-nft-multi" || s.Symlinks["/usr/sbin/ip6tables-restore"] != "xtables-nft-multi" {
			t.Errorf("%s: iptables links %v", s.Ref, s.Symlinks)
		}
	}
}
