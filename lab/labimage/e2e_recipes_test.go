package labimage

import (
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestE2ERecipesRun builds the images of Kubernetes' e2e suites that the
// lab does not preload (jessie-dnsutils, nginx, busybox), unpacks each and
// runs with chroot, in a network namespace of the test's own, what the
// suites run inside them: the DNS specs' shell loops and their tools,
// nginx serving port 80 (fetched over the namespace's loopback), and
// busybox's shell.
func TestE2ERecipesRun(t *testing.T) {
	needRoot(t, "chroot into the images and make a network namespace")
	c := debCache(t)
	bins := binDir(t, "coredns")

	t.Run("jessie-dnsutils", func(t *testing.T) {
		r := newRunner(t, c, JessieDnsutils(filepath.Join(bins, "coredns")))
		// As dns_common.go's probes run them (sh -c, $(...) and test -n).
		script := `set -e
echo "sum=$((40 + 2))"
for tool in sh bash dig nslookup host getent hostname awk seq test echo sleep grep sed find cat; do command -v $tool; done
check="$(seq 1 3 | awk '{s += $1} END {print "awk-sum=" s}')" && test -n "$check" && echo "$check"
for i in ` + "`seq 1 2`" + `; do echo "loop-$i"; sleep 0; done
hostname >/dev/null && echo hostname-ok
dig -v 2>&1
nslookup -version 2>&1 | head -n 1 || true
getent passwd www-data
echo probe | grep -c probe | sed 's/1/grep-sed-ok/'
find /etc -maxdepth 1 -name nsswitch.conf
readlink /bin/sh
bash -c 'echo "bash ${BASH_VERSINFO[0]}"'
/coredns
`
		out := r.run(t, "", "/bin/sh", "-c", script)
		for _, want := range []string{
			"sum=42", "/usr/bin/dig", "/usr/bin/getent", "/usr/bin/awk", "/usr/bin/seq", "awk-sum=6", "loop-1\nloop-2",
			"hostname-ok", "DiG 9.", "www-data:x:33:33", "grep-sed-ok", "/etc/nsswitch.conf", "dash\n", "bash 5",
			"hello from labimage",
		} {
			if !strings.Contains(out, want) {
				t.Errorf("jessie-dnsutils did not print %q:\n%s", want, out)
			}
		}
	})

	t.Run("nginx", func(t *testing.T) {
		spec := Nginx()
		if !slices.Equal(spec.Cmd, []string{"nginx", "-g", "daemon off;"}) {
			t.Errorf("Cmd %q, want upstream's", spec.Cmd)
		}
		r := newRunner(t, c, spec)
		if out, err := exec.Command("ip", "-n", r.netns, "link", "set", "lo", "up").CombinedOutput(); err != nil {
			t.Fatalf("ip link set lo up: %v: %s", err, out)
		}
		// The image's command, daemonized for the test (a later -g wins
		// nothing: daemon off must not be given twice), then a fetch
		// over loopback with busybox's wget and a graceful stop.
		script := `set -e
nginx -t 2>&1
nginx
i=0; until wget -q -O - http://127.0.0.1/ >/tmp/index.html 2>/dev/null; do i=$((i+1)); test $i -lt 50; sleep 0.1; done
grep -o 'Welcome to nginx' /tmp/index.html
wget -q -S -O /dev/null http://127.0.0.1/ 2>&1 | grep -o 'HTTP/1.1 200 OK'
ps -o user,args | grep -c '[n]ginx: worker' >/dev/null && ps -o user,args | grep '[n]ginx: worker' | awk '{print "worker-user=" $1}' | head -n 1
nginx -s quit
command -v sh cat ls
`
		out := r.run(t, "", "/bin/sh", "-c", script)
		for _, want := range []string{"syntax is ok", "test is successful", "Welcome to nginx", "HTTP/1.1 200 OK", "worker-user=nginx", "/bin/sh"} {
			if !strings.Contains(out, want) {
				t.Errorf("nginx did not print %q:\n%s", want, out)
			}
		}
	})

	t.Run("busybox", func(t *testing.T) {
		r := newRunner(t, c, Busybox())
		// A static busybox's shell runs its applets itself (command -v
		// names them without a path): check that the links exist too.
		out := r.run(t, "", "/bin/sh", "-c", `echo "sum=$((40 + 2))"; for t in sh cat sleep wget nc nslookup hostname ping ip; do test -e /bin/$t -o -e /sbin/$t && echo "have-$t"; done; id -u`)
		for _, want := range []string{"sum=42", "have-sh", "have-cat", "have-wget", "have-nc", "have-nslookup", "have-ip", "\n0\n"} {
			if !strings.Contains(out, want) {
				t.Errorf("busybox did not print %q:\n%s", want, out)
			}
		}
	})
}

// TestE2ERecipesSpecs checks what the suites rely on without building:
// the references e2e.test --list-images prints, and the package lists.
func TestE2ERecipesSpecs(t *testing.T) {
	want := map[string]bool{
		"registry.k8s.io/e2e-test-images/jessie-dnsutils:1.7": true,
		"registry.k8s.io/e2e-test-images/nginx:1.14-4":        true,
		"registry.k8s.io/e2e-test-images/busybox:1.37.0-1":    true,
	}
	specs := E2EImages("")
	if len(specs) != len(want) {
		t.Errorf("E2EImages has %d specs, want %d", len(specs), len(want))
	}
	for _, s := range specs {
		if !want[s.Ref] {
			t.Errorf("unexpected image %s", s.Ref)
		}
		if !slices.IsSorted(s.Debs) || len(slices.Compact(slices.Clone(s.Debs))) != len(s.Debs) {
			t.Errorf("%s: packages not sorted and unique: %v", s.Ref, s.Debs)
		}
	}
	if j := JessieDnsutils(""); slices.ContainsFunc(j.Files, func(f File) bool { return f.Path == "/coredns" }) {
		t.Error("JessieDnsutils(\"\") carries /coredns")
	}
	if j := JessieDnsutils("/x/coredns"); !slices.ContainsFunc(j.Files, func(f File) bool { return f.Path == "/coredns" && f.Src == "/x/coredns" }) {
		t.Error("JessieDnsutils(path) lacks /coredns")
	}
}
