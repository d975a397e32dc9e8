package lab

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestNodeMounts: /run first (a tmpfs hides what is bound below it
// before), every bound source in the node's own folder, every path kubelet
// and containerd keep state at and every sysctl kubelet writes covered.
func TestNodeMounts(t *testing.T) {
	n := &Node{Name: "node1", Dir: "/labs/x/nodes/node1"}
	m := nodeMounts(n)
	if m[0].Kind != mountTmpfs || m[0].Target != "/run" {
		t.Fatalf("first mount %+v, want the tmpfs on /run", m[0])
	}
	targets := map[string]nodeMount{}
	for _, x := range m[1:] {
		if x.Kind == mountTmpfs || strings.HasPrefix(x.Target, "/run/") {
			t.Errorf("%+v after /run's tmpfs", x)
		}
		if x.Kind == mountBind && !strings.HasPrefix(x.Source, filepath.Join(n.Dir, "fs")+"/") {
			t.Errorf("%s is bound from %s, outside the node's folder", x.Target, x.Source)
		}
		targets[x.Target] = x
	}
	for _, p := range []string{"/var/lib/kubelet", "/var/lib/containerd", "/var/lib/cni", "/var/log/pods", "/var/log/containers",
		"/opt/cni/bin", "/etc/cni/net.d", "/etc/resolv.conf", "/proc/sys/vm/overcommit_memory", "/proc/sys/kernel/panic"} {
		if targets[p].Kind != mountBind {
			t.Errorf("%s is not the node's own", p)
		}
	}
	for p, x := range targets {
		if x.Shared != (p == "/var/lib/kubelet") {
			t.Errorf("%s shared %v: kubelet's root, and only it, must be a shared mount", p, x.Shared)
		}
	}
	if targets["/lib/modules"].Kind != mountExist {
		t.Errorf("/lib/modules is not made to exist")
	}
	sources := map[string]bool{}
	for _, x := range m {
		if x.Source != "" && sources[x.Source] {
			t.Errorf("%s is bound twice", x.Source)
		}
		sources[x.Source] = true
	}
}

func TestUnder(t *testing.T) {
	for _, c := range []struct {
		path, dir string
		want      bool
	}{
		{"/run/tabby-lab", "/run", true}, {"/run", "/run", true}, {"/running", "/run", false},
		{"/var/run/x", "/run", false}, {"/run/a/b", "/run/", true},
	} {
		if got := under(c.path, c.dir); got != c.want {
			t.Errorf("under(%q, %q) = %v", c.path, c.dir, got)
		}
	}
}
