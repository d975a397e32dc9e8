// Package labimage builds container images without a Docker engine, from
// Go binaries on the host and Debian packages, for the lab's nodes to
// import with `ctr -n k8s.io images import`.
//
// An image is at most two layers: the Debian packages (unpacked as dpkg
// would on Debian 12's merged /usr, without documentation and without
// running maintainer scripts), then the caller's files, links and folders,
// so that a new binary does not rewrite the packages' layer. Everything is
// owned by root and dated 1970, and entries are sorted: the same inputs
// give the same image digest. Before writing, Build checks that every ELF
// program and library in the image finds its interpreter and libraries in
// the image, so an image that could not run its programs is never written.
//
// The images the lab runs are recipes in this package: Tabby, Agnhost,
// Pause, KubeProxy and CoreDNS.
package labimage

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// DefaultPath is the PATH of an image whose Spec.Env sets none.
const DefaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Spec describes an image.
type Spec struct {
	// Ref is the image's name with registry and tag, as kubelet will ask
	// for it: "registry.k8s.io/e2e-test-images/agnhost:2.59".
	Ref string
	// Debs are the Debian packages whose files the image holds: the exact
	// list, dependencies included (Build does not resolve them; it fails
	// when a program lacks a library). With any, the image gets Debian's
	// merged-/usr links /bin, /sbin, /lib and /lib64 into /usr.
	Debs []string
	// Files are copied from the host (or given as contents).
	Files []File
	// Symlinks are links to make: path in the image → target. Debian's
	// alternatives (iptables → xtables-nft-multi) are links given here, as
	// maintainer scripts do not run.
	Symlinks map[string]string
	// Dirs are folders to make (or to give another mode), e.g. /tmp 01777.
	Dirs []Dir
	// Busybox, when set, is the path in the image of a busybox binary (from
	// Debs or Files): Build adds a link to it for each applet that
	// `busybox --list-full` names, unless a program of that name is already
	// in one of the image's bin folders. It runs that busybox on the host
	// to ask, so the host must be able to run it: a static busybox, or
	// Debian's busybox (whose one library is libc) on a Debian host.
	Busybox string

	Entrypoint, Cmd []string
	// Env is the environment, "KEY=value"; DefaultPath is added when it
	// sets no PATH.
	Env        []string
	WorkingDir string
	// User is "UID[:GID]" or a name from the image's /etc/passwd.
	User string
	// Ports are the exposed ports, "53/udp", "8080/tcp" (or "8080").
	Ports []string
}

// File is a regular file of an image.
type File struct {
	// Path is where it goes in the image.
	Path string
	// Src is the host file to copy; Data the contents when Src is empty.
	Src  string
	Data []byte
	// Mode is the permission bits as chmod takes them (0o755); 0 means
	// Src's own, or 0o644 for Data.
	Mode int64
	// Capabilities are file capabilities the program gets, permitted and
	// effective, as setcap CAP=+ep gives them (the security.capability
	// extended attribute): a program run by a user other than root keeps
	// them, as upstream's CoreDNS image does for CAP_NET_BIND_SERVICE.
	Capabilities []Capability
}

// Capability is a Linux capability's number.
type Capability uint

// CapNetBindService lets a program bind ports below 1024.
const CapNetBindService Capability = 10

// fileCapabilities is the security.capability extended attribute (struct
// vfs_cap_data, revision 2) giving caps as permitted and effective.
func fileCapabilities(caps []Capability) []byte {
	const revision2, effective = 0x02000000, 0x000001
	var permitted [2]uint32
	for _, c := range caps {
		permitted[c/32] |= 1 << (c % 32)
	}
	out := make([]byte, 20)
	binary.LittleEndian.PutUint32(out[0:], revision2|effective)
	binary.LittleEndian.PutUint32(out[4:], permitted[0]) // inheritable stays 0
	binary.LittleEndian.PutUint32(out[12:], permitted[1])
	return out
}

// Dir is a folder of an image.
type Dir struct {
	Path string
	// Mode is the permission bits as chmod takes them (0o1777 for /tmp); 0
	// means 0o755.
	Mode int64
}

// Build assembles the image that spec describes, with its packages from
// debs (nil when spec has none), and writes it to out as a docker-archive
// tarball (as `docker save` writes, spec.Ref its tag) that `ctr images
// import` and `docker load` accept. out is written under a temporary name
// and renamed, so it is whole or absent.
//
// It returns the image's ID, "sha256:" and the digest of its config: what
// crictl and kubelet show, and what stays the same through ctr import
// (which writes a manifest of its own, so the manifest digest does not).
func Build(ctx context.Context, spec Spec, debs *DebCache, out string) (id string, err error) {
	tag, err := name.NewTag(spec.Ref, name.StrictValidation)
	if err != nil {
		return "", fmt.Errorf("image reference %q: %w (give registry, repository and tag)", spec.Ref, err)
	}
	pkgs, files, err := assemble(ctx, spec, debs)
	if err != nil {
		return "", fmt.Errorf("image %s: %w", spec.Ref, err)
	}
	if err := checkELF(ctx, view{pkgs, files}, spec.Ref); err != nil {
		return "", err
	}

	cfg := &v1.ConfigFile{
		Architecture: runtime.GOARCH,
		OS:           "linux",
		Created:      v1.Time{Time: epoch},
		RootFS:       v1.RootFS{Type: "layers"},
		Config: v1.Config{
			Entrypoint: spec.Entrypoint,
			Cmd:        spec.Cmd,
			Env:        env(spec.Env),
			WorkingDir: spec.WorkingDir,
			User:       spec.User,
		},
	}
	if len(spec.Ports) > 0 {
		cfg.Config.ExposedPorts = map[string]struct{}{}
		for _, p := range spec.Ports {
			if !strings.Contains(p, "/") {
				p += "/tcp"
			}
			cfg.Config.ExposedPorts[p] = struct{}{}
		}
	}
	img, err := mutate.ConfigFile(empty.Image, cfg)
	if err != nil {
		return "", err
	}
	var adds []mutate.Addendum
	for _, l := range []struct {
		t  tree
		by string
	}{
		{pkgs, "labimage: Debian packages " + strings.Join(sortedCopy(spec.Debs), " ")},
		{files, "labimage: files"},
	} {
		if len(l.t) == 0 {
			continue
		}
		b, err := l.t.tarBytes()
		if err != nil {
			return "", err
		}
		layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
			return io.NopCloser(bytes.NewReader(b)), nil
		}, tarball.WithCompressedCaching)
		if err != nil {
			return "", err
		}
		adds = append(adds, mutate.Addendum{Layer: layer, History: v1.History{Created: v1.Time{Time: epoch}, CreatedBy: l.by}})
	}
	if img, err = mutate.Append(img, adds...); err != nil {
		return "", err
	}
	cfgName, err := img.ConfigName()
	if err != nil {
		return "", fmt.Errorf("image %s: %w", spec.Ref, err)
	}
	if err := writeAtomic(out, tag, img); err != nil {
		return "", fmt.Errorf("image %s: %w", spec.Ref, err)
	}
	return cfgName.String(), nil
}

// writeAtomic writes img to a temporary file beside out and renames it.
func writeAtomic(out string, tag name.Tag, img v1.Image) error {
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(out), "."+filepath.Base(out)+".tmp-")
	if err != nil {
		return err
	}
	tmp := f.Name()
	f.Close()
	defer os.Remove(tmp)
	if err := tarball.WriteToFile(tmp, tag, img); err != nil {
		return fmt.Errorf("writing %s: %w", out, err)
	}
	if err := os.Chmod(tmp, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, out)
}

func env(e []string) []string {
	for _, kv := range e {
		if strings.HasPrefix(kv, "PATH=") {
			return e
		}
	}
	return append([]string{DefaultPath}, e...)
}

func sortedCopy(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

// assemble builds the two layers' filesystems: the packages, then the
// caller's files.
func assemble(ctx context.Context, spec Spec, cache *DebCache) (pkgs, files tree, err error) {
	pkgs, files = tree{}, tree{}
	if len(spec.Debs) > 0 {
		if cache == nil {
			return nil, nil, errors.New("the spec names Debian packages, but Build got no DebCache")
		}
		debs, err := cache.Fetch(ctx, sortedCopy(spec.Debs))
		if err != nil {
			return nil, nil, err
		}
		v := view{pkgs}
		for _, d := range debs {
			if err := unpack(ctx, v, d); err != nil {
				return nil, nil, err
			}
		}
		for _, dir := range usrMerged {
			if err := v.mkdirAll("usr/"+dir, "merged /usr"); err != nil {
				return nil, nil, err
			}
			if e := pkgs[dir]; e != nil {
				return nil, nil, fmt.Errorf("%s ships /%s, which merged /usr keeps as a link", e.origin, dir)
			}
			pkgs[dir] = &entry{kind: kindSymlink, target: "usr/" + dir, origin: "merged /usr"}
		}
	}

	v := view{pkgs, files}
	for _, d := range spec.Dirs {
		mode := d.Mode
		if mode == 0 {
			mode = 0o755
		}
		if _, err := v.place(d.Path, &entry{kind: kindDir, mode: mode, origin: "Spec.Dirs " + d.Path}); err != nil {
			return nil, nil, err
		}
	}
	for _, f := range spec.Files {
		e := &entry{kind: kindFile, data: f.Data, mode: f.Mode, origin: "Spec.Files " + f.Path}
		for _, c := range f.Capabilities {
			if c > 63 {
				return nil, nil, fmt.Errorf("Spec.Files %s: capability %d does not exist", f.Path, c)
			}
		}
		if len(f.Capabilities) > 0 {
			e.xattrs = map[string]string{"security.capability": string(fileCapabilities(f.Capabilities))}
		}
		if f.Src != "" {
			st, err := os.Stat(f.Src)
			if err != nil {
				return nil, nil, fmt.Errorf("Spec.Files %s: %w", f.Path, err)
			}
			if !st.Mode().IsRegular() {
				return nil, nil, fmt.Errorf("Spec.Files %s: %s is not a regular file", f.Path, f.Src)
			}
			if e.data, err = os.ReadFile(f.Src); err != nil {
				return nil, nil, fmt.Errorf("Spec.Files %s: %w", f.Path, err)
			}
			if e.mode == 0 {
				e.mode = int64(st.Mode().Perm())
			}
		}
		if e.mode == 0 {
			e.mode = 0o644
		}
		if _, err := v.place(f.Path, e); err != nil {
			return nil, nil, err
		}
	}
	links := make([]string, 0, len(spec.Symlinks))
	for p := range spec.Symlinks {
		links = append(links, p)
	}
	slices.Sort(links)
	for _, p := range links {
		if _, err := v.place(p, &entry{kind: kindSymlink, target: spec.Symlinks[p], origin: "Spec.Symlinks " + p}); err != nil {
			return nil, nil, err
		}
	}
	if spec.Busybox != "" {
		if err := busyboxLinks(ctx, v, spec.Busybox); err != nil {
			return nil, nil, err
		}
	}
	return pkgs, files, nil
}

// binDirs are where a shell finds programs (DefaultPath's folders).
var binDirs = []string{"usr/local/sbin", "usr/local/bin", "usr/sbin", "usr/bin", "sbin", "bin"}

// busyboxLinks adds to the top layer a link to the busybox at bb for each
// of its applets that no program in binDirs already provides.
func busyboxLinks(ctx context.Context, v view, bb string) error {
	canon, e := v.resolve(bb, true)
	if e == nil || e.kind != kindFile {
		return fmt.Errorf("Spec.Busybox: the image has no file %s", bb)
	}
	// Named busybox: a busybox called otherwise takes its name for an applet's.
	tmp, err := os.MkdirTemp("", "labimage-busybox-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	exe := filepath.Join(tmp, "busybox")
	if err := os.WriteFile(exe, e.data, 0o755); err != nil {
		return err
	}
	out, err := exec.CommandContext(ctx, exe, "--list-full").Output()
	if err != nil {
		return fmt.Errorf("Spec.Busybox: running %s --list-full: %w (it must be a static busybox for this machine)", bb, err)
	}
	for _, applet := range strings.Fields(string(out)) {
		if !strings.Contains(applet, "/") {
			continue // linuxrc and the like, at the root
		}
		base := path.Base(applet)
		provided := false
		for _, d := range binDirs {
			if _, e := v.resolve(path.Join(d, base), true); e != nil {
				provided = true
				break
			}
		}
		if provided {
			continue
		}
		if _, err := v.place(applet, &entry{kind: kindSymlink, target: "/" + canon, origin: "busybox applet " + base}); err != nil {
			return err
		}
	}
	return nil
}
