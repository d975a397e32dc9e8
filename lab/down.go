package lab

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
)

// DownOptions configure Down.
type DownOptions struct {
	// Dir is the lab's folder (default DefaultDir).
	Dir string
	// Name is the lab's name, needed only when its state file is gone
	// (default: DefaultName for DefaultDir); a state file's name wins.
	Name string
	// Log receives what was removed (nil: nothing).
	Log io.Writer
}

// Down removes the lab in Dir: every process it started (recorded pids,
// and any process whose network namespace is one of the lab's, found by a
// scan of /proc), every namespace named tabby-<name>-* (with every link,
// route and rule in them), the plugin's IPAM lock files and the lab's
// folder. It works after a crash of the lab too (kill -9 of everything, a
// half-made lab), and does nothing, successfully, when there is no lab.
func Down(ctx context.Context, o DownOptions) error {
	if os.Geteuid() != 0 {
		return errors.New("removing the lab needs root: run it with sudo")
	}
	if o.Dir == "" {
		o.Dir = DefaultDir
	}
	dir, err := filepath.Abs(o.Dir)
	if err != nil {
		return err
	}
	log := o.Log
	if log == nil {
		log = io.Discard
	}
	st, err := Load(dir)
	name := o.Name
	switch {
	case err == nil:
		name = st.Name
	case !errors.Is(err, fs.ErrNotExist):
		if name == "" {
			return fmt.Errorf("%w (pass --name to remove the lab by its namespaces' names anyway)", err)
		}
	case name == "" && dir == DefaultDir:
		name = DefaultName
	case name == "":
		return fmt.Errorf("no lab state in %s: pass --name to remove a lab's leftovers by its namespaces' names", dir)
	}
	if err := CheckName(name); err != nil {
		return err
	}
	if _, err := os.Stat(dir); err == nil {
		unlock, err := lockDir(dir)
		if err != nil {
			return err
		}
		defer unlock()
	}
	return down(ctx, st, name, dir, log)
}

// down removes what the lab named name in dir made; st may be nil.
func down(ctx context.Context, st *State, name, dir string, log io.Writer) error {
	prefix := Prefix(name)
	var errs []error

	// Processes first, so that nothing makes new namespaces or files
	// while they go: the nodes' and pods' processes get SIGTERM and a
	// moment to end (tabbyd may say goodbye to its peers, the API server
	// still answers), the control plane then SIGKILL (its data goes with
	// the lab, and kube-apiserver's graceful shutdown takes seconds). A
	// kubelet stopped in the middle may have started one more pod: scan
	// again.
	for round := range 3 {
		procs, cp := labProcs(st, prefix, dir)
		if len(procs)+len(cp) == 0 {
			break
		}
		grace := 3 * time.Second
		if round > 0 {
			grace = time.Second
		}
		left := stopProcs(procs, grace, false)
		for _, p := range cp {
			p.signal(syscall.SIGKILL)
		}
		left = append(left, waitGone(cp, 5*time.Second)...)
		fmt.Fprintf(log, "stopped %d processes\n", len(procs)+len(cp)-len(left))
		if round == 2 && len(left) > 0 {
			errs = append(errs, fmt.Errorf("processes that do not stop: %v", pids(left)))
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}

	// Namespaces: deleting one deletes every link in it (veth pairs go
	// with either end), and with them routes and rules.
	names := listNetNS(prefix)
	if st != nil {
		for _, n := range st.Namespaces {
			if !slices.Contains(names, n) {
				if _, err := os.Lstat(NetNSPath(n)); err == nil {
					names = append(names, n)
				}
			}
		}
	}
	for _, n := range names {
		if err := delNetNS(n); err != nil {
			errs = append(errs, err)
		}
	}
	if len(names) > 0 {
		fmt.Fprintf(log, "removed %d network namespaces\n", len(names))
	}

	// The nodes' cgroups, with whatever their kubelets made below them
	// (a process still in one is killed first).
	roots := labCgroupRoots(name)
	for _, r := range roots {
		if err := removeCgroupRoot(r); err != nil {
			errs = append(errs, err)
		}
	}
	if len(roots) > 0 {
		fmt.Fprintf(log, "removed the cgroups of %d nodes\n", len(roots))
	}

	_, statErr := os.Stat(dir)
	if err := removeFiles(st, dir); err != nil {
		errs = append(errs, err)
	} else if statErr == nil {
		fmt.Fprintf(log, "removed %s\n", dir)
	}
	if st == nil && len(names) == 0 && statErr != nil {
		fmt.Fprintf(log, "nothing to remove: no lab named %s, no folder %s\n", name, dir)
	}
	return errors.Join(errs...)
}

// labProcs finds the lab's processes: those recorded in its state, every
// process inside one of its namespaces, and its forward (the one process in
// the host's namespace) by its arguments. The control plane's (recorded,
// or in its namespace) come apart.
func labProcs(st *State, prefix, dir string) (procs, cp []Proc) {
	seen := map[int]bool{}
	add := func(to *[]Proc, p Proc) {
		if p.Pid > 0 && !seen[p.Pid] && p.Alive() {
			seen[p.Pid] = true
			*to = append(*to, p)
		}
	}
	cpNS := prefix + "cp"
	if st != nil {
		if st.ControlPlane.NetNS != "" {
			cpNS = st.ControlPlane.NetNS
		}
		for _, p := range st.ControlPlane.Procs {
			add(&cp, p)
		}
	}
	if ino, err := netnsInode(NetNSPath(cpNS)); err == nil {
		for _, p := range procsInNetNS(map[uint64]bool{ino: true}) {
			add(&cp, p)
		}
	}
	if st != nil {
		add(&procs, st.Forward.Proc)
		for _, n := range st.Nodes {
			add(&procs, n.Kubelet)
			add(&procs, n.Containerd)
			add(&procs, n.Root)
		}
	}
	// Pods' processes live in namespaces of their own, below the nodes'
	// cgroup roots.
	for _, r := range labCgroupRoots(strings.TrimSuffix(strings.TrimPrefix(prefix, "tabby-"), "-")) {
		for _, p := range cgroupProcs(r) {
			add(&procs, p)
		}
	}
	inodes := map[uint64]bool{}
	for _, n := range listNetNS(prefix) {
		if ino, err := netnsInode(NetNSPath(n)); err == nil {
			inodes[ino] = true
		}
	}
	for _, p := range procsInNetNS(inodes) {
		add(&procs, p)
	}
	for _, p := range procsByArgs(func(args []string) bool { return isLabCommand(args, dir) }) {
		add(&procs, p)
	}
	return procs, cp
}

// isLabCommand reports whether args are those of a `tabbyctl lab forward`
// or `lab node-root` of the lab in dir.
func isLabCommand(args []string, dir string) bool {
	if len(args) < 4 || args[0] != "lab" || (args[1] != "forward" && args[1] != "node-root") {
		return false
	}
	for i := 2; i+1 < len(args); i++ {
		if args[i] == "--dir" && args[i+1] == dir {
			return true
		}
	}
	return false
}

func pids(procs []Proc) []int {
	var out []int
	for _, p := range procs {
		out = append(out, p.Pid)
	}
	return out
}

// labEntries are what the lab writes into its folder.
var labEntries = []string{StateFile, "cp", "nodes", "pki", "manifests", "forward.log", "admin.kubeconfig"}

// removeFiles removes the lab's folder when the lab made it, else what is
// in it (it was empty before). Without a state only what the lab writes is
// removed, and the folder when that leaves it empty.
func removeFiles(st *State, dir string) error {
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if st != nil && st.CreatedDir {
		return os.RemoveAll(dir)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		if st == nil && !slices.Contains(labEntries, e.Name()) {
			continue
		}
		errs = append(errs, os.RemoveAll(filepath.Join(dir, e.Name())))
	}
	if st == nil {
		_ = os.Remove(dir) // only when empty
	}
	return errors.Join(errs...)
}
