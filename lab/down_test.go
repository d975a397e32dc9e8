package lab

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
)

// leftovers makes what a lab that crashed half-way leaves: a state naming
// a namespace with links in it, a pod namespace it never recorded, a
// recorded process and an unrecorded one inside the namespaces, a node's
// cgroup root with a pod's cgroup below it and a process in it (found
// only by the cgroup: its namespace is the host's). It returns the state
// and the processes.
func leftovers(t *testing.T) (*State, []Proc) {
	t.Helper()
	requireRoot(t)
	name := "dt" + randHex(3)
	dir := filepath.Join(t.TempDir(), "lab")
	t.Cleanup(func() {
		for _, n := range listNetNS(Prefix(name)) {
			_ = delNetNS(n)
		}
	})
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	root := cgroupRootName(name, "node1")
	t.Cleanup(func() { _ = removeCgroupRoot(root) })
	if err := makeCgroupRoot(root); err != nil {
		t.Fatal(err)
	}
	st := &State{Version: stateVersion, Name: name, Dir: dir, CreatedDir: true}
	if err := st.update(func(*State) {}); err != nil {
		t.Fatal(err)
	}
	node, pod := Prefix(name)+"node1", Prefix(name)+"pod-0123456789ab"
	if err := st.addNamespace(node); err != nil {
		t.Fatal(err)
	}
	if err := addNetNS(pod); err != nil {
		t.Fatal(err)
	}
	err := withLinks(node, func(h *netlink.Handle) error {
		return h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "tab0"}, PeerName: "tab0-peer"})
	})
	if err != nil {
		t.Fatal(err)
	}
	var procs []Proc
	for _, ns := range []string{node, pod} {
		p, _, err := startDetached(procSpec{name: "sleep", netns: NetNSPath(ns), path: "/bin/sleep", args: []string{"600"}, log: filepath.Join(dir, "nodes", "node1", "sleep.log")})
		if err != nil {
			t.Fatal(err)
		}
		procs = append(procs, p)
		waitInNetNS(t, p.Pid, NetNSPath(ns))
	}
	// A pod's process: in a cgroup below the node's root, nowhere else.
	p, _, err := startDetached(procSpec{name: "sleep", path: "/bin/sleep", args: []string{"600"}, log: filepath.Join(dir, "nodes", "node1", "pod.log")})
	if err != nil {
		t.Fatal(err)
	}
	procs = append(procs, p)
	hs, err := cgroupHierarchies()
	if err != nil {
		t.Fatal(err)
	}
	podCgroup := filepath.Join(hs[0], root, "kubepods", "podtest")
	if err := os.MkdirAll(podCgroup, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(podCgroup, "cgroup.procs"), []byte(fmt.Sprint(p.Pid)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := st.update(func(s *State) {
		s.Nodes = []Node{{Name: "node1", NetNS: node, Kubelet: procs[0], CgroupRoot: root}}
	}); err != nil {
		t.Fatal(err)
	}
	return st, procs
}

// waitInNetNS waits until the process runs in the namespace: nsenter
// enters it a moment after it starts (under load, long enough for a scan
// of /proc to miss it, as CI once saw).
func waitInNetNS(t *testing.T, pid int, nsPath string) {
	t.Helper()
	want, err := os.Stat(nsPath)
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		got, err := os.Stat(fmt.Sprintf("/proc/%d/ns/net", pid))
		if err == nil && os.SameFile(got, want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("process %d is not in %s after 10s", pid, nsPath)
		}
	}
}

// checkGone fails unless the lab's namespaces, processes, cgroups and
// folder are gone.
func checkGone(t *testing.T, st *State, procs []Proc) {
	t.Helper()
	if left := listNetNS(st.Prefix()); len(left) > 0 {
		t.Errorf("namespaces left: %v", left)
	}
	if left := waitGone(procs, 2*time.Second); len(left) > 0 {
		t.Errorf("processes left: %v", pids(left))
	}
	gone := []string{st.Dir}
	hs, _ := cgroupHierarchies()
	for _, h := range hs {
		gone = append(gone, filepath.Join(h, cgroupRootName(st.Name, "node1")))
	}
	for _, path := range gone {
		if _, err := os.Stat(path); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s is still there: %v", path, err)
		}
	}
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	if strings.Contains(string(mounts), st.Prefix()) {
		t.Errorf("mounts of the lab's namespaces are left")
	}
}

func TestDownRemovesACrashedLab(t *testing.T) {
	st, procs := leftovers(t)
	if err := Down(context.Background(), DownOptions{Dir: st.Dir}); err != nil {
		t.Fatal(err)
	}
	checkGone(t, st, procs)
	// Again: nothing to do, no error.
	if err := Down(context.Background(), DownOptions{Dir: st.Dir, Name: st.Name}); err != nil {
		t.Errorf("a second down: %v", err)
	}
}

func TestDownWithoutState(t *testing.T) {
	st, procs := leftovers(t)
	if err := os.Remove(filepath.Join(st.Dir, StateFile)); err != nil {
		t.Fatal(err)
	}
	// Without the state the lab's name must be given.
	if err := Down(context.Background(), DownOptions{Dir: st.Dir}); err == nil {
		t.Fatal("down without a state or a name went ahead")
	}
	if err := Down(context.Background(), DownOptions{Dir: st.Dir, Name: st.Name}); err != nil {
		t.Fatal(err)
	}
	// Found by the namespaces' names and a scan of /proc alone.
	checkGone(t, st, procs)
}
