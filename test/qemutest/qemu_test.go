package qemutest

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	tabbyv1 "github.com/tabbynet/tabby/api/v1"
	"github.com/tabbynet/tabby/internal/controlplane"
	"github.com/tabbynet/tabby/internal/controlplane/clustertest"
	"github.com/tabbynet/tabby/internal/testnet"
	"github.com/tabbynet/tabby/internal/tier"
)

// hostLoopback is the host's loopback as qemu's user network shows it to
// the guest.
const hostLoopback = "10.0.2.2"

// qemuPackage is the Debian package of qemu-system-x86_64.
const qemuPackage = "qemu-system-x86"

// TestIPIPInQEMU boots Debian's kernel under qemu (TCG) with three nodes
// running the real tabbyd and pods wired by the real plugin, against this
// package's control plane on the host: pods of an IPIP Always pool reach
// each other over tunl0 in the same subnet and across subnets; pods of an
// IPIP CrossSubnet pool only across subnets (tunl0's counters stay put in
// the same subnet).
func TestIPIPInQEMU(t *testing.T) {
	qemu := requireQEMU(t)
	start := time.Now()
	vm := vmImage(t)
	c := clustertest.Cluster(t)
	createPools(t)
	initrd := runArchive(t, c, vm)
	t.Logf("kernel, initramfs and binaries ready after %s", time.Since(start).Round(100*time.Millisecond))
	console := boot(t, qemu, vm, initrd)
	t.Logf("the VM ended %s after the test started", time.Since(start).Round(100*time.Millisecond))
	var want []string
	for _, ch := range checks {
		want = append(want, "CHECK "+ch.name()+": ok: ")
	}
	judge(t, console, want...)
}

var routingRun = flag.String("qemu.routing-run", "^TestApplyIPIP$", "the tests of daemon/routing TestRoutingInQEMU runs in the VM")

// TestRoutingInQEMU runs daemon/routing's real-kernel tests of IPIP, which
// skip on a kernel without ipip, inside the VM: the applier makes tunl0 and
// its routes, and pods on two nodes reach each other over it.
func TestRoutingInQEMU(t *testing.T) {
	qemu := requireQEMU(t)
	vm := vmImage(t)
	root := t.TempDir()
	buildGuestTest(t, "../../daemon/routing", filepath.Join(root, "guest.test"))
	if err := os.WriteFile(filepath.Join(root, "guest.args"), []byte("-test.run="+*routingRun+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	console := boot(t, qemu, vm, initramfs(t, vm, root))
	for _, l := range console {
		// In the VM the kernel has ipip: a skip there is a failure.
		if strings.HasPrefix(strings.TrimSpace(l), "--- SKIP") {
			t.Errorf("skipped in the VM: %s", l)
		}
	}
	want := []string{"--- PASS: "}
	if *routingRun == "^TestApplyIPIP$" {
		want = []string{"--- PASS: TestApplyIPIP ("}
	}
	judge(t, console, want...)
}

// requireQEMU skips t as non-root and returns qemu-system-x86_64's path.
// Where qemu is missing and apt cannot install it the test skips, loudly;
// where apt could, the machine was not set up (make deps) and the test
// fails, as it does without cpio.
func requireQEMU(t *testing.T) string {
	t.Helper()
	tier.Root(t, "to boot a VM whose nodes are network namespaces")
	if p, err := exec.LookPath("qemu-system-x86_64"); err == nil {
		tier.Root(t, "to boot a VM", "cpio")
		return p
	}
	out, err := exec.Command("apt-cache", "policy", qemuPackage).Output()
	if err != nil || !strings.Contains(string(out), "Candidate:") || strings.Contains(string(out), "Candidate: (none)") {
		t.Skipf("SKIPPING: qemu-system-x86_64 is not installed and apt cannot install %s here (%v): the IPIP test needs a kernel with ipip, which it boots under qemu", qemuPackage, err)
	}
	t.Fatalf("qemu-system-x86_64 is not installed: run make deps (or apt-get install %s busybox-static cpio)", qemuPackage)
	return ""
}

// vmImage runs build.sh (cached by content) and returns its folder.
func vmImage(t *testing.T) string {
	t.Helper()
	cmd := exec.Command("bash", "build.sh")
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("test/qemutest/build.sh: %v (run it by hand to see why)", err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return lines[len(lines)-1]
}

func createPools(t *testing.T) {
	t.Helper()
	ds := clustertest.Client(t)
	ctx := context.Background()
	for _, p := range pools {
		pool := &tabbyv1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: p.name},
			Spec: tabbyv1.IPPoolSpec{CIDR: p.cidr, IPIPMode: p.ipip, VXLANMode: tabbyv1.EncapNever}}
		if _, err := ds.IPPools.Create(ctx, pool, metav1.CreateOptions{}); err != nil {
			t.Fatalf("creating IPPool %s: %v", p.name, err)
		}
		t.Cleanup(func() { _ = ds.IPPools.Delete(context.Background(), p.name, metav1.DeleteOptions{}) })
	}
}

// runArchive lays out the guest's / for TestIPIPInQEMU: tabby's
// programs, this package's test binary as /guest.test and /guest.json.
func runArchive(t *testing.T, c *controlplane.Cluster, vm string) string {
	t.Helper()
	tmp := t.TempDir()
	root := filepath.Join(tmp, "root")
	binDir := "/tabby/bin"
	if err := os.MkdirAll(root+binDir, 0o755); err != nil {
		t.Fatal(err)
	}
	tabbyd, err := testnet.Binary(tmp, "tabbyd")
	if err != nil {
		t.Fatal(err)
	}
	plugins, err := testnet.PluginDir(tmp)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{tabbyd, filepath.Join(plugins, "tabby"), filepath.Join(plugins, "tabby-ipam")} {
		copyFile(t, f, filepath.Join(root, binDir, filepath.Base(f)))
	}
	buildGuestTest(t, ".", filepath.Join(root, "guest.test"))
	u, err := url.Parse(c.Server)
	if err != nil {
		t.Fatal(err)
	}
	cfg, _ := json.Marshal(guestConfig{Server: "https://" + hostLoopback + ":" + u.Port(), CA: string(c.CAData()), Token: c.Token, BinDir: binDir})
	if err := os.WriteFile(filepath.Join(root, "guest.json"), cfg, 0o600); err != nil {
		t.Fatal(err)
	}
	return initramfs(t, vm, root)
}

// buildGuestTest compiles the test binary of the package in dir to out,
// static (CGO_ENABLED=0: the guest has no libc for it) and stripped.
func buildGuestTest(t *testing.T, dir, out string) {
	t.Helper()
	build := exec.Command("go", "test", "-c", "-trimpath", "-ldflags=-s -w", "-o", out, ".")
	build.Dir = dir
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the guest's test binary of %s: %v\n%s", dir, err, b)
	}
}

// initramfs writes the run's initramfs: build.sh's base archive, then an
// archive of root (the run's own files; /init runs root's guest.test).
func initramfs(t *testing.T, vm, root string) string {
	t.Helper()
	initrd := filepath.Join(t.TempDir(), "initrd")
	copyFile(t, filepath.Join(vm, "base.cpio"), initrd)
	f, err := os.OpenFile(initrd, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// The kernel unpacks concatenated archives; uncompressed, this one is
	// copied, not inflated, under TCG.
	cpio := exec.Command("sh", "-c", "find . | cpio -o -H newc --quiet")
	var stderr strings.Builder
	cpio.Dir, cpio.Stdout, cpio.Stderr = root, f, &stderr
	if err := cpio.Run(); err != nil {
		t.Fatalf("cpio: %v\n%s", err, stderr.String())
	}
	return initrd
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	in, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	st, _ := in.Stat()
	out, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, st.Mode())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}

// bootTimeout bounds the whole VM: boot, the guest's nodes, pods and pings.
const bootTimeout = 10 * time.Minute

// boot runs the VM to its end and returns the console's lines. qemu is
// killed when the test ends, however it ends, and when this process dies.
func boot(t *testing.T, qemu, vm, initrd string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), bootTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, qemu,
		"-accel", "tcg", "-m", "2048", "-smp", "2",
		"-nodefaults", "-display", "none", "-serial", "stdio", "-monitor", "none", "-no-reboot",
		"-kernel", filepath.Join(vm, "vmlinux"), "-initrd", initrd,
		"-append", "console=ttyS0 quiet panic=-1 rdinit=/init",
		// The guest's one NIC: qemu's user network, on which it reaches
		// the host's loopback at 10.0.2.2 and has no default route.
		"-netdev", "user,id=n0,ipv6=off", "-device", "e1000,netdev=n0,romfile=")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting qemu: %v", err)
	}
	var lines []string
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimRight(sc.Text(), "\r")
		if strings.TrimSpace(line) == "" {
			continue
		}
		t.Log("vm: " + line)
		lines = append(lines, line)
	}
	err = cmd.Wait()
	if ctx.Err() != nil {
		t.Fatalf("the VM did not finish within %s: killed\n%s", bootTimeout, stderr.String())
	}
	if err != nil {
		t.Fatalf("qemu: %v\n%s", err, stderr.String())
	}
	if stderr.Len() > 0 {
		t.Logf("qemu's stderr:\n%s", stderr.String())
	}
	return lines
}

// judge requires the guest's status line to say 0 and a line starting
// with each of want.
func judge(t *testing.T, console []string, want ...string) {
	t.Helper()
	status := ""
	for _, l := range console {
		if s, ok := strings.CutPrefix(l, "RESULT rc="); ok {
			status = s
		}
	}
	if status == "" {
		t.Fatal("the VM ended without the guest's status line (RESULT rc=N): the kernel or /init failed, see the vm: lines above")
	}
	for _, w := range want {
		if !slices.ContainsFunc(console, func(l string) bool { return strings.HasPrefix(strings.TrimSpace(l), w) }) {
			t.Errorf("no line starting %q in the guest's output", w)
		}
	}
	if status != "0" {
		t.Errorf("the guest's tests exited with status %s", status)
	}
}
