package lab

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// A lab node is a network namespace and a mount namespace of its own: its
// kubelet, containerd and every container they start see the host's files
// except where a real node keeps its own state. Those paths are the node's
// folders in the lab's folder, mounted over the host's paths inside the
// node's mount namespace only, so two nodes never share a socket, a pod log
// or a CNI config, and nothing of theirs lands on the host. The mount
// namespace is held by `tabbyctl lab node-root` (RunNodeRoot), started in a
// new private mount namespace (unshare --mount --propagation private) inside
// the node's network namespace; kubelet and containerd join it with nsenter.
// It vanishes with the last process in it, so nothing is left to unmount.

// mountKind says how a path of the node is made.
type mountKind int

const (
	// mountBind binds a folder (or file) of the node over the path.
	mountBind mountKind = iota
	// mountExist only makes sure the path exists as a folder (a node has
	// /lib/modules even when this machine's kernel has no modules).
	mountExist
	// mountTmpfs mounts an empty tmpfs over the path (/run: a node's
	// sockets, locks and pod namespaces are its own).
	mountTmpfs
)

// nodeMount is one path of a node's private filesystem view.
type nodeMount struct {
	Kind mountKind
	// Target is the path as the node's processes see it.
	Target string
	// Source is the node's own folder or file (mountBind).
	Source string
	// Shared makes the bind a shared mount (its own peer group, inside
	// the node's namespace only), as a real node's systemd leaves every
	// mount. kubelet needs its root folder shared: when it is not,
	// kubelet binds the folder over itself at start, while its other
	// goroutines already make sockets in it, and a rename that straddles
	// that bind fails (the pod-resources socket: "invalid cross-device
	// link", and kubelet exits).
	Shared bool
}

// sysctlsKubeletWrites are the host-global sysctls kubelet sets at start
// (vm.overcommit_memory and the others of its setupKernelTunables). Each
// node gets a file of its own over them, holding the host's value, so that
// the host's settings never change.
var sysctlsKubeletWrites = []string{
	"vm/overcommit_memory",
	"vm/panic_on_oom",
	"kernel/panic",
	"kernel/panic_on_oops",
	"kernel/keys/root_maxkeys",
	"kernel/keys/root_maxbytes",
}

// nodeMounts lists node n's private paths in the order they are made: /run
// first (a tmpfs, which hides every later bind below it), then the state
// kubelet, containerd and the CNI plugins keep at fixed paths, then the
// files.
func nodeMounts(n *Node) []nodeMount {
	fsDir := n.fsDir()
	m := []nodeMount{{Kind: mountTmpfs, Target: "/run"}}
	for _, p := range []string{
		"/var/lib/kubelet", "/var/lib/containerd", "/var/lib/cni",
		"/var/log/pods", "/var/log/containers",
		"/opt/cni/bin", "/etc/cni/net.d",
	} {
		m = append(m, nodeMount{Kind: mountBind, Target: p, Source: filepath.Join(fsDir, strings.ReplaceAll(strings.TrimPrefix(p, "/"), "/", "-")),
			Shared: p == "/var/lib/kubelet"})
	}
	m = append(m, nodeMount{Kind: mountExist, Target: "/lib/modules"})
	m = append(m, nodeMount{Kind: mountBind, Target: "/etc/resolv.conf", Source: filepath.Join(fsDir, "resolv.conf")})
	for _, s := range sysctlsKubeletWrites {
		m = append(m, nodeMount{Kind: mountBind, Target: filepath.Join("/proc/sys", s), Source: filepath.Join(fsDir, "sysctl", strings.ReplaceAll(s, "/", "."))})
	}
	return m
}

// fsDir holds the node's private folders and files.
func (n *Node) fsDir() string { return filepath.Join(n.Dir, "fs") }

// rootReadyFile appears once RunNodeRoot has made every mount.
func (n *Node) rootReadyFile() string { return filepath.Join(n.Dir, "root.ready") }

// prepareNodeFS makes the sources of node n's mounts on the host: empty
// folders, an empty resolv.conf (containerd then fails to resolve any
// registry at once, instead of sending queries nowhere) and the host's
// values of the sysctls kubelet writes.
func prepareNodeFS(n *Node) error {
	for _, m := range nodeMounts(n) {
		if m.Kind != mountBind {
			continue
		}
		if strings.HasPrefix(m.Target, "/proc/sys/") {
			v, err := os.ReadFile(m.Target)
			if err != nil {
				return fmt.Errorf("reading %s: %w", m.Target, err)
			}
			if err := os.MkdirAll(filepath.Dir(m.Source), 0o755); err != nil {
				return err
			}
			if err := os.WriteFile(m.Source, v, 0o644); err != nil {
				return err
			}
			continue
		}
		if filepath.Base(m.Target) == "resolv.conf" {
			if err := os.WriteFile(m.Source, []byte("# a tabby lab node: no DNS of the host (pods get the cluster's DNS from kubelet)\n"), 0o644); err != nil {
				return err
			}
			continue
		}
		if err := os.MkdirAll(m.Source, 0o755); err != nil {
			return err
		}
	}
	return nil
}

// RunNodeRoot makes node's private mounts in this process's mount namespace
// (which must be a new, private one: lab up starts it with unshare --mount
// --propagation private; hostMountNS is the file of the mount namespace it
// must not be, lab up's own), writes the node's ready file, and then holds
// the namespace until ctx ends. Paths under /run that the node's processes
// must still see (the lab's folder, the programs) are bound back over the
// new tmpfs.
func RunNodeRoot(ctx context.Context, s *State, node string, hostMountNS uint64) error {
	n, err := s.Node(node)
	if err != nil {
		return err
	}
	self, err := netnsInode("/proc/self/ns/mnt")
	if err != nil {
		return err
	}
	if hostMountNS == 0 || self == hostMountNS {
		return errors.New("lab node-root must run in a mount namespace of its own (unshare --mount --propagation private): refusing to mount over the host's paths")
	}
	keep := []string{s.Dir}
	for _, p := range []string{s.Binaries.Tabbyctl, s.Binaries.PluginDir, s.Binaries.ControlPlaneDir, s.Binaries.RuntimeDir} {
		if p != "" {
			keep = append(keep, p)
		}
	}
	if err := makeNodeMounts(nodeMounts(n), keep, filepath.Join(n.fsDir(), "overlay")); err != nil {
		return fmt.Errorf("node %s: %w", node, err)
	}
	if err := os.WriteFile(n.rootReadyFile(), []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
		return err
	}
	<-ctx.Done()
	return nil
}

// makeNodeMounts makes the mounts in order. Sources are opened before the
// first mount, so a source that a later mount hides (a lab folder under
// /run) is still bound from the real folder. A target that does not exist
// on the host is made inside an overlay of its nearest existing folder
// (upper layer in overlayDir), never on the host.
func makeNodeMounts(mounts []nodeMount, keep []string, overlayDir string) error {
	// Namespaces bound as files (ip netns) copied into this mount
	// namespace would stay alive as long as it does, even after their
	// owner deletes them: let go of every one.
	if err := detachNsfsMounts(); err != nil {
		return err
	}
	open := func(p string) (int, error) {
		fd, err := unix.Open(p, unix.O_PATH|unix.O_CLOEXEC, 0)
		if err != nil {
			return -1, fmt.Errorf("opening %s: %w", p, err)
		}
		return fd, nil
	}
	fds := map[string]int{}
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	for _, m := range mounts {
		if m.Kind == mountBind {
			fd, err := open(m.Source)
			if err != nil {
				return err
			}
			fds[m.Source] = fd
		}
	}
	var tmpfsKeep []string
	for i, k := range keep {
		// /var/run/tabby-lab is /run/tabby-lab.
		if real, err := filepath.EvalSymlinks(k); err == nil {
			keep[i] = real
		}
	}
	for _, m := range mounts {
		if m.Kind != mountTmpfs {
			continue
		}
		for _, k := range keep {
			if under(k, m.Target) {
				if _, ok := fds[k]; !ok {
					fd, err := open(k)
					if err != nil {
						return err
					}
					fds[k] = fd
				}
				tmpfsKeep = append(tmpfsKeep, k)
			}
		}
	}
	overlaid := map[string]bool{}
	for _, m := range mounts {
		switch m.Kind {
		case mountTmpfs:
			if err := unix.Mount("tmpfs", m.Target, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=755,size=1g"); err != nil {
				return fmt.Errorf("mounting a tmpfs on %s: %w", m.Target, err)
			}
			for _, k := range tmpfsKeep {
				if !under(k, m.Target) {
					continue
				}
				if err := bindFD(fds[k], k); err != nil {
					return err
				}
			}
		case mountExist:
			if err := ensurePath(m.Target, true, overlayDir, overlaid); err != nil {
				return err
			}
		case mountBind:
			var st unix.Stat_t
			if err := unix.Fstat(fds[m.Source], &st); err != nil {
				return fmt.Errorf("%s: %w", m.Source, err)
			}
			if err := ensurePath(m.Target, st.Mode&unix.S_IFMT == unix.S_IFDIR, overlayDir, overlaid); err != nil {
				return err
			}
			if err := unix.Mount(fdPath(fds[m.Source]), m.Target, "", unix.MS_BIND, ""); err != nil {
				return fmt.Errorf("binding %s over %s: %w", m.Source, m.Target, err)
			}
			if m.Shared {
				if err := unix.Mount("", m.Target, "", unix.MS_SHARED, ""); err != nil {
					return fmt.Errorf("making %s a shared mount: %w", m.Target, err)
				}
			}
		}
	}
	return nil
}

// under reports whether path is dir or inside it.
func under(path, dir string) bool {
	return path == dir || strings.HasPrefix(path, strings.TrimSuffix(dir, "/")+"/")
}

func fdPath(fd int) string { return "/proc/self/fd/" + strconv.Itoa(fd) }

// bindFD binds the opened folder or file over path, making path first (in
// a fresh tmpfs, where its parents do not exist yet).
func bindFD(fd int, path string) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		if err := os.MkdirAll(path, 0o755); err != nil {
			return err
		}
	} else {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(path, nil, 0o644); err != nil {
			return err
		}
	}
	if err := unix.Mount(fdPath(fd), path, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("binding %s back over the node's tmpfs: %w", path, err)
	}
	return nil
}

// ensurePath makes sure path exists (a folder, or a file when dir is
// false). When it does not, the nearest folder above it that exists is
// covered by an overlay whose upper layer is in overlayDir, and path is
// made there: the host's folder stays as it is.
func ensurePath(path string, dir bool, overlayDir string, overlaid map[string]bool) error {
	if _, err := os.Stat(path); err == nil {
		return nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	base := filepath.Dir(path)
	for {
		if st, err := os.Stat(base); err == nil && st.IsDir() {
			break
		}
		base = filepath.Dir(base)
	}
	// Symlinks such as /lib -> usr/lib: mount on what they name.
	real, err := filepath.EvalSymlinks(base)
	if err != nil {
		return err
	}
	if !overlaid[real] {
		if err := overlayOn(real, overlayDir); err != nil {
			return err
		}
		overlaid[real] = true
	}
	if dir {
		return os.MkdirAll(path, 0o755)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, nil, 0o644)
}

// overlayOn mounts an overlay over dir whose lower layer is dir itself.
func overlayOn(dir, overlayDir string) error {
	name := strings.ReplaceAll(strings.Trim(dir, "/"), "/", "-")
	if name == "" {
		return errors.New("refusing to overlay /")
	}
	upper, work := filepath.Join(overlayDir, name, "upper"), filepath.Join(overlayDir, name, "work")
	for _, d := range []string{upper, work} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	for _, p := range []string{dir, upper, work} {
		if strings.ContainsAny(p, ",:\\") {
			return fmt.Errorf("cannot overlay with the path %q (it holds , : or \\)", p)
		}
	}
	opts := "lowerdir=" + dir + ",upperdir=" + upper + ",workdir=" + work
	if err := unix.Mount("overlay", dir, "overlay", 0, opts); err != nil {
		return fmt.Errorf("mounting an overlay on %s (to make a path the host lacks): %w", dir, err)
	}
	return nil
}

// detachNsfsMounts detaches every namespace file bound in this mount
// namespace (ip netns's /run/netns/*), deepest first.
func detachNsfsMounts() error {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	var points []string
	for _, line := range strings.Split(string(data), "\n") {
		pre, post, ok := strings.Cut(line, " - ")
		if !ok {
			continue
		}
		f, p := strings.Fields(pre), strings.Fields(post)
		if len(f) >= 5 && len(p) >= 1 && p[0] == "nsfs" {
			points = append(points, unescapeMountPath(f[4]))
		}
	}
	slices.SortFunc(points, func(a, b string) int { return len(b) - len(a) })
	for _, p := range points {
		if err := unix.Unmount(p, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("detaching the namespace bound at %s: %w", p, err)
		}
	}
	return nil
}

// unescapeMountPath undoes mountinfo's octal escapes (\040 for a space).
func unescapeMountPath(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
