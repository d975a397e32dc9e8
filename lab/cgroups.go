package lab

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Every node's kubelet runs its pods under a cgroup root of its own
// (kubelet's cgroupRoot, /tabby-<lab>-<node>), made by lab up in every
// mounted hierarchy before the kubelet starts and removed by lab down, with
// whatever the kubelet made under it, once every process in it is gone.

// cgroupRootName is node's cgroup root in the lab named lab.
func cgroupRootName(lab, node string) string { return "/tabby-" + lab + "-" + node }

// cgroupHierarchies lists the folders where cgroup hierarchies are mounted
// (each v1 hierarchy and the v2 one), from /proc/self/mountinfo.
func cgroupHierarchies() ([]string, error) {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	var out []string
	for _, line := range strings.Split(string(data), "\n") {
		pre, post, ok := strings.Cut(line, " - ")
		if !ok {
			continue
		}
		f, p := strings.Fields(pre), strings.Fields(post)
		if len(f) < 5 || len(p) < 1 || (p[0] != "cgroup" && p[0] != "cgroup2") {
			continue
		}
		// Only hierarchies mounted at their root.
		if f[3] != "/" {
			continue
		}
		out = append(out, unescapeMountPath(f[4]))
	}
	if len(out) == 0 {
		return nil, errors.New("no cgroup hierarchy is mounted (mount cgroup v1 hierarchies or cgroup2 under /sys/fs/cgroup)")
	}
	return out, nil
}

// makeCgroupRoot makes root in every hierarchy. In the cpuset hierarchy
// (v1) a new cgroup has no CPUs and memory nodes until given its parent's.
func makeCgroupRoot(root string) error {
	hs, err := cgroupHierarchies()
	if err != nil {
		return err
	}
	for _, h := range hs {
		dir := filepath.Join(h, root)
		if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("making the node's cgroup %s: %w", dir, err)
		}
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			parent, err := os.ReadFile(filepath.Join(h, f))
			if err != nil {
				continue // not the v1 cpuset hierarchy
			}
			if err := os.WriteFile(filepath.Join(dir, f), parent, 0o644); err != nil {
				return fmt.Errorf("copying %s into %s: %w", f, dir, err)
			}
		}
	}
	return nil
}

// cgroupProcs lists the processes in root or below it, in any hierarchy.
func cgroupProcs(root string) []Proc {
	hs, _ := cgroupHierarchies()
	seen := map[int]bool{}
	var out []Proc
	for _, h := range hs {
		_ = filepath.WalkDir(filepath.Join(h, root), func(path string, d fs.DirEntry, err error) error {
			if err != nil || !d.IsDir() {
				return nil
			}
			data, err := os.ReadFile(filepath.Join(path, "cgroup.procs"))
			if err != nil {
				return nil
			}
			for _, f := range strings.Fields(string(data)) {
				pid, err := strconv.Atoi(f)
				if err != nil || seen[pid] || pid == os.Getpid() {
					continue
				}
				seen[pid] = true
				if p, err := procOf(comm(pid), pid); err == nil {
					out = append(out, p)
				}
			}
			return nil
		})
	}
	return out
}

// removeCgroupRoot removes root and every cgroup below it, deepest first,
// in every hierarchy. Processes still in them are killed first (a frozen
// cgroup is thawed so that they can die).
func removeCgroupRoot(root string) error {
	if left := cgroupProcs(root); len(left) > 0 {
		thaw(root)
		for _, p := range left {
			p.signal(syscall.SIGKILL)
		}
		if still := waitGone(left, 5*time.Second); len(still) > 0 {
			return fmt.Errorf("processes in the cgroup %s do not die: %v", root, pids(still))
		}
	}
	hs, err := cgroupHierarchies()
	if err != nil {
		return err
	}
	var errs []error
	for _, h := range hs {
		top := filepath.Join(h, root)
		var dirs []string
		_ = filepath.WalkDir(top, func(path string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, path)
			}
			return nil
		})
		slices.SortFunc(dirs, func(a, b string) int { return strings.Count(b, "/") - strings.Count(a, "/") })
		for _, d := range dirs {
			var err error
			// A cgroup whose last process just died may be busy a moment.
			for range 50 {
				if err = syscall.Rmdir(d); err == nil || errors.Is(err, fs.ErrNotExist) || !errors.Is(err, syscall.EBUSY) {
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
			if err != nil && !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, fmt.Errorf("removing cgroup %s: %w", d, err))
			}
		}
	}
	return errors.Join(errs...)
}

// thaw writes THAWED into every freezer.state below root (v1 freezer).
func thaw(root string) {
	hs, _ := cgroupHierarchies()
	for _, h := range hs {
		_ = filepath.WalkDir(filepath.Join(h, root), func(path string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				_ = os.WriteFile(filepath.Join(path, "freezer.state"), []byte("THAWED"), 0o644)
			}
			return nil
		})
	}
}

// labCgroupRoots lists the cgroup roots of a lab's nodes that exist in any
// hierarchy (found by name, so that a lab without state is cleaned too).
func labCgroupRoots(lab string) []string {
	hs, _ := cgroupHierarchies()
	prefix := "tabby-" + lab + "-"
	seen := map[string]bool{}
	var out []string
	for _, h := range hs {
		entries, _ := os.ReadDir(h)
		for _, e := range entries {
			if e.IsDir() && strings.HasPrefix(e.Name(), prefix) && !seen[e.Name()] {
				seen[e.Name()] = true
				out = append(out, "/"+e.Name())
			}
		}
	}
	slices.Sort(out)
	return out
}

// CgroupPids lists the processes in the cgroup folder dir (of one
// hierarchy) and in those below it.
func CgroupPids(dir string) []int {
	var pids []int
	_ = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil
		}
		data, _ := os.ReadFile(filepath.Join(path, "cgroup.procs"))
		for _, f := range strings.Fields(string(data)) {
			if pid, err := strconv.Atoi(f); err == nil {
				pids = append(pids, pid)
			}
		}
		return nil
	})
	return pids
}
