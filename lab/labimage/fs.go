package labimage

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"path"
	"slices"
	"strings"
	"time"
)

// epoch is the modification time of every entry and the creation time of
// every image: fixed, so that the same inputs give the same digest.
var epoch = time.Unix(0, 0).UTC()

type kind uint8

const (
	kindDir kind = iota
	kindFile
	kindSymlink
)

// entry is one file, directory or symbolic link of an image's filesystem.
type entry struct {
	kind   kind
	mode   int64  // permission bits as chmod takes them (0o755, 0o1777)
	data   []byte // kindFile
	target string // kindSymlink
	origin string // where it came from, for error messages
	// xattrs are extended attributes (security.capability), written as
	// PAX records SCHILY.xattr.NAME, which containerd applies on unpack.
	xattrs map[string]string
}

// tree is one layer's filesystem: clean paths relative to the root
// ("usr/bin/ip") to entries. Every entry's parent directories are in the
// tree too, so a layer's tarball names them.
type tree map[string]*entry

// view is a stack of layers, the last one on top: what a container sees.
type view []tree

// get returns what is at the exact path p (no symlinks followed), from the
// topmost layer that has it.
func (v view) get(p string) *entry {
	for i := len(v) - 1; i >= 0; i-- {
		if e, ok := v[i][p]; ok {
			return e
		}
	}
	return nil
}

// maxHops bounds symlink resolution, as the kernel's 40.
const maxHops = 40

// resolve follows symbolic links in every component of p (and in the last
// one too when followLast), inside the image: absolute targets start at the
// image's root, and ".." never leaves it. It returns the canonical path and
// what is there (nil when nothing is, or on a loop).
func (v view) resolve(p string, followLast bool) (string, *entry) {
	parts := splitPath(p)
	cur := ""
	hops := 0
	for i := 0; i < len(parts); i++ {
		next := path.Join(cur, parts[i])
		e := v.get(next)
		last := i == len(parts)-1
		if e != nil && e.kind == kindSymlink && (!last || followLast) {
			if hops++; hops > maxHops {
				return next, nil
			}
			base := e.target
			if !path.IsAbs(base) {
				base = path.Join("/", cur, base)
			}
			parts = splitPath(path.Join(append([]string{base}, parts[i+1:]...)...))
			cur, i = "", -1
			continue
		}
		if e == nil && !last {
			return path.Join(append([]string{next}, parts[i+1:]...)...), nil
		}
		if e != nil && e.kind == kindFile && !last {
			return path.Join(append([]string{next}, parts[i+1:]...)...), nil
		}
		cur = next
	}
	return cur, v.get(cur)
}

// regular returns the regular file p resolves to, or nil.
func (v view) regular(p string) *entry {
	_, e := v.resolve(p, true)
	if e == nil || e.kind != kindFile {
		return nil
	}
	return e
}

// paths returns every path of the view, sorted.
func (v view) paths() []string {
	seen := map[string]bool{}
	var out []string
	for _, t := range v {
		for p := range t {
			if !seen[p] {
				seen[p] = true
				out = append(out, p)
			}
		}
	}
	slices.Sort(out)
	return out
}

// splitPath turns "/usr//bin/../sbin/ip" into ["usr" "sbin" "ip"]; the
// root is no components at all.
func splitPath(p string) []string {
	p = cleanPath(p)
	if p == "" {
		return nil
	}
	return strings.Split(p, "/")
}

// cleanPath is p relative to the image's root, cleaned: "/usr/bin/" →
// "usr/bin", "/" → "".
func cleanPath(p string) string {
	return strings.TrimPrefix(path.Clean("/"+p), "/")
}

// place puts e at the path p of the layer v[len(v)-1], resolving p's parent
// directories through the symlinks of every layer (a file put at /bin/sh
// lands in usr/bin/sh when /bin is a link to usr/bin), and creating the
// parents that are missing. It returns the canonical path.
func (v view) place(p string, e *entry) (string, error) {
	top := v[len(v)-1]
	p = cleanPath(p)
	if p == "" {
		if e.kind != kindDir {
			return "", fmt.Errorf("%s: cannot replace the image's root", e.origin)
		}
		return "", nil
	}
	parent, _ := v.resolve(path.Dir(p), true)
	if parent == "." {
		parent = ""
	}
	if err := v.mkdirAll(parent, e.origin); err != nil {
		return "", err
	}
	full := path.Join(parent, path.Base(p))
	if old := v.get(full); old != nil {
		switch {
		case old.kind == kindDir && e.kind == kindDir:
			if e.mode == 0 {
				e.mode = old.mode
			}
		case e.kind == kindDir && old.kind == kindSymlink:
			// dpkg follows a link to a directory as a directory.
			if dir, d := v.resolve(full, true); d != nil && d.kind == kindDir {
				return dir, nil
			}
			return "", fmt.Errorf("%s wants a directory at /%s, where %s has a link", e.origin, full, old.origin)
		case old.kind == kindDir:
			return "", fmt.Errorf("%s wants /%s, where %s has a directory", e.origin, full, old.origin)
		case e.kind == kindDir:
			return "", fmt.Errorf("%s wants a directory at /%s, where %s has a file or link", e.origin, full, old.origin)
		}
	}
	if e.kind == kindDir && e.mode == 0 {
		e.mode = 0o755
	}
	top[full] = e
	return full, nil
}

// mkdirAll makes sure the canonical directory p and its parents exist,
// adding the missing ones (and the ones only lower layers have, with their
// mode) to the top layer so that its tarball names every parent.
func (v view) mkdirAll(p, origin string) error {
	top := v[len(v)-1]
	cur := ""
	for _, part := range splitPath(p) {
		cur = path.Join(cur, part)
		if _, ok := top[cur]; ok {
			if top[cur].kind != kindDir {
				return fmt.Errorf("%s needs /%s to be a directory, but %s put a file or link there", origin, cur, top[cur].origin)
			}
			continue
		}
		switch e := v.get(cur); {
		case e == nil:
			top[cur] = &entry{kind: kindDir, mode: 0o755, origin: origin}
		case e.kind == kindDir:
			top[cur] = &entry{kind: kindDir, mode: e.mode, origin: e.origin}
		default:
			return fmt.Errorf("%s needs /%s to be a directory, but %s put a file or link there", origin, cur, e.origin)
		}
	}
	return nil
}

// writeTar writes the layer as a tarball: entries sorted by path (parents
// before children), owned by root, all dated 1970, so that the same tree
// always gives the same bytes.
func (t tree) writeTar(w io.Writer) error {
	tw := tar.NewWriter(w)
	keys := make([]string, 0, len(t))
	for p := range t {
		keys = append(keys, p)
	}
	slices.Sort(keys)
	for _, p := range keys {
		e := t[p]
		h := &tar.Header{Name: p, Mode: e.mode, ModTime: epoch, Format: tar.FormatPAX}
		for k, v := range e.xattrs {
			if h.PAXRecords == nil {
				h.PAXRecords = map[string]string{}
			}
			h.PAXRecords["SCHILY.xattr."+k] = v
		}
		switch e.kind {
		case kindDir:
			h.Typeflag, h.Name = tar.TypeDir, p+"/"
		case kindFile:
			h.Typeflag, h.Size = tar.TypeReg, int64(len(e.data))
		case kindSymlink:
			h.Typeflag, h.Linkname, h.Mode = tar.TypeSymlink, e.target, 0o777
		}
		if err := tw.WriteHeader(h); err != nil {
			return fmt.Errorf("writing /%s into a layer: %w", p, err)
		}
		if e.kind == kindFile {
			if _, err := tw.Write(e.data); err != nil {
				return fmt.Errorf("writing /%s into a layer: %w", p, err)
			}
		}
	}
	return tw.Close()
}

// tarBytes is writeTar into memory.
func (t tree) tarBytes() ([]byte, error) {
	var b bytes.Buffer
	if err := t.writeTar(&b); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// size is the sum of the layer's file sizes.
func (t tree) size() int64 {
	var n int64
	for _, e := range t {
		n += int64(len(e.data))
	}
	return n
}
