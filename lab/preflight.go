package lab

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
)

// preflight checks, before lab up starts anything, that this machine has
// what a lab of real nodes needs, and says what is missing and how to get
// it.
func preflight(o *Options) error {
	var missing []string
	for _, c := range []struct{ cmd, pkg string }{
		{"nsenter", "util-linux"}, {"unshare", "util-linux"}, {"iptables", "iptables"},
		{"ip", "iproute2"}, {"ping", "iputils-ping"},
	} {
		if _, err := exec.LookPath(c.cmd); err != nil {
			missing = append(missing, fmt.Sprintf("the command %s (Debian package %s)", c.cmd, c.pkg))
		}
	}
	if _, err := os.Stat(runcPath); err != nil {
		missing = append(missing, fmt.Sprintf("runc at %s (Debian package runc)", runcPath))
	}
	if o.Runtime == RuntimeContainerd16 {
		for _, b := range []string{"containerd", "containerd-shim-runc-v2", "ctr"} {
			if _, err := os.Stat(filepath.Join(debianContainerdDir, b)); err != nil {
				missing = append(missing, fmt.Sprintf("%s in %s for --runtime %s (Debian package containerd)", b, debianContainerdDir, RuntimeContainerd16))
			}
		}
	}
	if fsys, err := os.ReadFile("/proc/filesystems"); err != nil || !bytes.Contains(fsys, []byte("\toverlay\n")) {
		missing = append(missing, "the overlay filesystem in the kernel (containerd's snapshots and the nodes' private paths need it: modprobe overlay)")
	}
	if why := cgroupsMissing(); why != "" {
		missing = append(missing, why)
	}
	if len(missing) > 0 {
		return fmt.Errorf("this machine lacks what the lab needs:\n  - %s\nhack/install-deps.sh (run by make lab and make test) installs the Debian packages", strings.Join(missing, "\n  - "))
	}
	if o.APIPort != 0 {
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(o.APIPort)))
		if err != nil {
			return fmt.Errorf("the API server forward's port 127.0.0.1:%d is taken: %w (pass another --api-port, or 0 for a free one)", o.APIPort, err)
		}
		ln.Close()
	}
	return nil
}

// cgroupsMissing says which cgroup controllers kubelet needs are not
// mounted ("" when all are).
func cgroupsMissing() string {
	hs, err := cgroupHierarchies()
	if err != nil {
		return err.Error()
	}
	have := map[string]bool{}
	for _, h := range hs {
		if data, err := os.ReadFile(filepath.Join(h, "cgroup.controllers")); err == nil {
			for _, c := range strings.Fields(string(data)) {
				have[c] = true
			}
			continue
		}
		for _, c := range strings.Split(filepath.Base(h), ",") {
			have[c] = true
		}
		// A v1 hierarchy's controllers are in its mount options; its
		// folder name is what they are mounted as here.
		for _, f := range []string{"cpu.shares", "cpuacct.usage", "cpuset.cpus", "memory.limit_in_bytes", "pids.max", "devices.list", "freezer.state"} {
			if _, err := os.Stat(filepath.Join(h, f)); err == nil {
				have[strings.SplitN(f, ".", 2)[0]] = true
			}
		}
	}
	var lack []string
	for _, c := range []string{"cpu", "cpuset", "memory", "pids"} {
		if !have[c] {
			lack = append(lack, c)
		}
	}
	if len(lack) == 0 {
		return ""
	}
	return fmt.Sprintf("the cgroup controllers %s (kubelet needs them; mount them under /sys/fs/cgroup)", strings.Join(lack, ", "))
}

// findBinaries finds, or builds with the repository's scripts, the
// programs the lab runs.
func findBinaries(ctx context.Context, o *Options) (Binaries, error) {
	b := Binaries{
		Tabbyctl:        o.Tabbyctl,
		Extender:        filepath.Join(o.BinDir, ExtenderName),
		PluginDir:       o.BinDir,
		ControlPlaneDir: o.ControlPlaneDir,
		RuntimeDir:      o.RuntimeDir,
		RepoRoot:        o.RepoRoot,
	}
	var err error
	if b.ControlPlaneDir == "" {
		o.progress("building the Kubernetes programs (test/controlplane/build.sh; minutes the first time, cached after)")
		if b.ControlPlaneDir, err = runBuildScript(ctx, o, "test/controlplane/build.sh"); err != nil {
			return b, err
		}
	}
	if b.RuntimeDir == "" {
		// CoreDNS comes from there whatever the nodes' runtime.
		o.progress("building containerd and CoreDNS (test/runtime/build.sh; minutes the first time, cached after)")
		if b.RuntimeDir, err = runBuildScript(ctx, o, "test/runtime/build.sh"); err != nil {
			return b, err
		}
	}
	for dir, names := range map[string][]string{
		b.ControlPlaneDir: {"kube-apiserver", "kubectl", "kubelet", "kube-proxy", "agnhost", "pause"},
		b.RuntimeDir:      {"containerd", "containerd-shim-runc-v2", "ctr", "coredns"},
	} {
		for _, n := range names {
			if st, err := os.Stat(filepath.Join(dir, n)); err != nil || st.Mode()&0o111 == 0 {
				return b, fmt.Errorf("%s is missing from %s: run test/controlplane/build.sh and test/runtime/build.sh (or fix --controlplane-dir, --runtime-dir)", n, dir)
			}
		}
	}
	return b, nil
}

// runBuildScript runs a build script of the repository (progress to the
// log) and returns the folder it prints.
func runBuildScript(ctx context.Context, o *Options, script string) (string, error) {
	cmd := exec.CommandContext(ctx, "bash", filepath.Join(o.RepoRoot, script))
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = o.Log
	if o.Log == nil {
		cmd.Stderr = os.Stderr
	}
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("%s: %w (run it by hand to see why; it needs the Go module proxy the first time)", script, err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	dir := strings.TrimSpace(lines[len(lines)-1])
	if dir == "" {
		return "", errors.New(script + " printed no folder")
	}
	return dir, nil
}
