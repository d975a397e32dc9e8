package labimage

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tabbynet/tabby/internal/filehash"
)

// DebCache keeps Debian packages (.deb files) in a folder, one file per
// package version named as in Debian's archive (NAME_VERSION_ARCH.deb, the
// version without its epoch), and fetches the missing ones with apt-get.
// Files are verified against apt's SHA256 and renamed into place only when
// complete, so several processes can share one folder; a file, once there,
// never changes. Conventionally the folder is "debs" in DefaultCacheDir.
type DebCache struct {
	dir string
	// Log, when set, reports downloads and apt-get update runs.
	Log *slog.Logger

	mu sync.Mutex // one apt run at a time from this process
}

// NewDebCache returns the cache kept in dir (created when needed).
func NewDebCache(dir string) *DebCache { return &DebCache{dir: dir} }

// Dir is the cache's folder.
func (c *DebCache) Dir() string { return c.dir }

// Deb is a package in the cache.
type Deb struct {
	Name, Version, Arch string
	// Path is the .deb file.
	Path string
}

// debName is what Debian allows in a package name (and keeps a name from
// being taken for an option of apt).
var debName = regexp.MustCompile(`^[a-z0-9][a-z0-9+.-]+$`)

// Fetch returns the cached files of the named packages, at the version apt
// would install now (apt-cache policy's candidate), downloading the ones
// the cache lacks with apt-get download. It runs apt-get update (root
// only) once when apt knows no candidate for a package or the download
// fails, as happens with no package lists or stale ones. It does not
// resolve dependencies: names is the exact list.
func (c *DebCache) Fetch(ctx context.Context, names []string) ([]Deb, error) {
	for _, n := range names {
		if !debName.MatchString(n) {
			return nil, fmt.Errorf("%q is not a Debian package name", n)
		}
	}
	if len(names) == 0 {
		return nil, nil
	}
	if err := os.MkdirAll(c.dir, 0o755); err != nil {
		return nil, fmt.Errorf("Debian package cache: %w", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	debs, err := c.fetch(ctx, names)
	var stale *staleError
	if !errors.As(err, &stale) {
		return debs, err
	}
	c.logf("running apt-get update", "reason", stale.Error())
	if out, uerr := c.apt(ctx, "", "apt-get", "-q", "-o", "DPkg::Lock::Timeout=120", "update"); uerr != nil {
		return nil, fmt.Errorf("%w; apt-get update, run to cure that, failed too (it needs root): %v: %s", err, uerr, lastLines(out, 5))
	}
	debs, err = c.fetch(ctx, names)
	if errors.As(err, &stale) {
		return nil, fmt.Errorf("%w (after apt-get update)", err)
	}
	return debs, err
}

// staleError is a failure that fresh package lists may cure.
type staleError struct{ msg string }

func (e *staleError) Error() string { return e.msg }

// record is what apt knows of one package version.
type record struct {
	name, version, arch, filename, sha256 string
	size                                  int64
}

func (c *DebCache) fetch(ctx context.Context, names []string) ([]Deb, error) {
	recs, err := c.records(ctx, names)
	if err != nil {
		return nil, err
	}
	var missing []record
	for _, r := range recs {
		if st, err := os.Stat(c.file(r)); err != nil || st.Size() != r.size {
			missing = append(missing, r)
		}
	}
	if len(missing) > 0 {
		if err := c.download(ctx, missing); err != nil {
			return nil, err
		}
	}
	debs := make([]Deb, len(recs))
	for i, r := range recs {
		debs[i] = Deb{Name: r.name, Version: r.version, Arch: r.arch, Path: c.file(r)}
	}
	return debs, nil
}

// file is where the cache keeps r.
func (c *DebCache) file(r record) string {
	return filepath.Join(c.dir, path.Base(r.filename))
}

// records asks apt for each package's candidate version and its archive
// record (file name, size, SHA256), in the order of names.
func (c *DebCache) records(ctx context.Context, names []string) ([]record, error) {
	out, err := c.apt(ctx, "", "apt-cache", append([]string{"policy"}, names...)...)
	if err != nil {
		return nil, fmt.Errorf("apt-cache policy: %v: %s", err, lastLines(out, 5))
	}
	cand := parsePolicy(out)
	var none []string
	specs := make([]string, 0, len(names))
	for _, n := range names {
		v := cand[n]
		if v == "" || v == "(none)" {
			none = append(none, n)
			continue
		}
		specs = append(specs, n+"="+v)
	}
	if len(none) > 0 {
		return nil, &staleError{fmt.Sprintf("apt knows no installable version of %s (a virtual or misspelt package, or no package lists)", strings.Join(none, ", "))}
	}
	out, err = c.apt(ctx, "", "apt-cache", append([]string{"show", "--no-all-versions"}, specs...)...)
	if err != nil {
		return nil, &staleError{fmt.Sprintf("apt-cache show %s: %v: %s", strings.Join(specs, " "), err, lastLines(out, 5))}
	}
	byName := map[string]record{}
	for _, r := range parseRecords(out) {
		if _, dup := byName[r.name]; !dup && cand[r.name] == r.version {
			byName[r.name] = r
		}
	}
	recs := make([]record, 0, len(names))
	for _, n := range names {
		r, ok := byName[n]
		if !ok || r.filename == "" || r.sha256 == "" {
			return nil, &staleError{fmt.Sprintf("apt-cache show has no archive record of %s=%s", n, cand[n])}
		}
		recs = append(recs, r)
	}
	return recs, nil
}

// download fetches recs with apt-get download into a private folder inside
// the cache, checks each file's SHA256 and renames it into place.
func (c *DebCache) download(ctx context.Context, recs []record) error {
	c.removeStale()
	tmp, err := os.MkdirTemp(c.dir, ".download-")
	if err != nil {
		return fmt.Errorf("Debian package cache: %w", err)
	}
	defer os.RemoveAll(tmp)
	args := []string{"-q"}
	if os.Geteuid() == 0 {
		// apt's sandbox user cannot write into the private folder.
		args = append(args, "-o", "APT::Sandbox::User=root")
	}
	args = append(args, "download")
	want := map[string]record{}
	for _, r := range recs {
		args = append(args, r.name+"="+r.version)
		want[r.sha256] = r
	}
	c.logf("downloading Debian packages", "count", len(recs), "into", c.dir)
	if out, err := c.apt(ctx, tmp, "apt-get", args...); err != nil {
		return &staleError{fmt.Sprintf("apt-get download: %v: %s", err, lastLines(out, 5))}
	}
	ents, err := os.ReadDir(tmp)
	if err != nil {
		return err
	}
	for _, de := range ents {
		p := filepath.Join(tmp, de.Name())
		sum, err := filehash.SHA256(p)
		if err != nil {
			return err
		}
		r, ok := want[sum]
		if !ok {
			return fmt.Errorf("apt-get download wrote %s, whose SHA256 %s matches none of the packages asked for", de.Name(), sum)
		}
		if err := os.Rename(p, c.file(r)); err != nil {
			return fmt.Errorf("Debian package cache: %w", err)
		}
		delete(want, sum)
	}
	for _, r := range want {
		return fmt.Errorf("apt-get download did not deliver %s=%s (SHA256 %s)", r.name, r.version, r.sha256)
	}
	return nil
}

// removeStale removes the download folders of processes that died
// downloading (older than an hour: no download takes that long).
func (c *DebCache) removeStale() {
	ents, _ := os.ReadDir(c.dir)
	for _, e := range ents {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), ".download-") {
			continue
		}
		if info, err := e.Info(); err == nil && time.Since(info.ModTime()) > time.Hour {
			os.RemoveAll(filepath.Join(c.dir, e.Name()))
		}
	}
}

// apt runs an apt program in the C locale (its output is parsed) and
// returns its standard output, or its standard error on failure.
func (c *DebCache) apt(ctx context.Context, dir, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stderr.String() + stdout.String(), err
	}
	return stdout.String(), nil
}

func (c *DebCache) logf(msg string, args ...any) {
	if c.Log != nil {
		c.Log.Info(msg, args...)
	}
}

// parsePolicy reads apt-cache policy's output into package → candidate.
func parsePolicy(out string) map[string]string {
	cand := map[string]string{}
	cur := ""
	for _, line := range strings.Split(out, "\n") {
		switch {
		case line != "" && line[0] != ' ' && strings.HasSuffix(line, ":"):
			cur = strings.TrimSuffix(line, ":")
		case cur != "" && strings.HasPrefix(strings.TrimSpace(line), "Candidate:"):
			cand[cur] = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(line), "Candidate:"))
		}
	}
	return cand
}

// parseRecords reads apt-cache show's stanzas.
func parseRecords(out string) []record {
	var recs []record
	var r record
	flush := func() {
		if r.name != "" {
			recs = append(recs, r)
		}
		r = record{}
	}
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			flush()
			continue
		}
		k, v, ok := strings.Cut(line, ": ")
		if !ok || strings.HasPrefix(line, " ") {
			continue
		}
		switch k {
		case "Package":
			r.name = v
		case "Version":
			r.version = v
		case "Architecture":
			r.arch = v
		case "Filename":
			r.filename = v
		case "SHA256":
			r.sha256 = v
		case "Size":
			r.size, _ = strconv.ParseInt(v, 10, 64)
		}
	}
	flush()
	return recs
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// usrMerged are the top-level folders that Debian 12 (merged /usr) keeps
// as links into /usr; packages still ship files under them (libc6 its
// libraries in /lib, iproute2 /bin/ip), which land in /usr as dpkg on a
// merged system puts them.
var usrMerged = []string{"bin", "sbin", "lib", "lib64"}

// skipped are the folders of packages that an image does without: the
// documentation, and gconv, glibc's iconv modules (8 MB; UTF-8, ASCII and
// Latin-1 are built into libc, and no program of the lab converts others).
var skipped = []string{
	"usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/locale",
	"usr/share/lintian", "usr/share/bug",
	"usr/lib/" + gnuTriplet + "/gconv",
}

// mergedUsrPath maps a package's path to where it lands on a merged-/usr
// system: "lib/x86_64-linux-gnu/libc.so.6" → "usr/lib/x86_64-linux-gnu/libc.so.6".
func mergedUsrPath(p string) string {
	first, _, _ := strings.Cut(p, "/")
	if slices.Contains(usrMerged, first) || first == "lib32" || first == "libx32" {
		return path.Join("usr", p)
	}
	return p
}

func isSkipped(p string) bool {
	for _, s := range skipped {
		if p == s || strings.HasPrefix(p, s+"/") {
			return true
		}
	}
	return false
}

// unpack adds a package's files (its data archive, read from dpkg-deb
// --fsys-tarfile) to the top layer of v, at their merged-/usr places and
// without documentation. A path that an earlier package shipped with other
// contents is an error, as dpkg would refuse it.
func unpack(ctx context.Context, v view, d Deb) error {
	cmd := exec.CommandContext(ctx, "dpkg-deb", "--fsys-tarfile", d.Path)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("unpacking %s: %w (dpkg-deb comes with Debian's dpkg)", d.Path, err)
	}
	rerr := readDebTar(v, d, stdout)
	io.Copy(io.Discard, stdout)
	werr := cmd.Wait()
	if rerr != nil {
		return rerr
	}
	if werr != nil {
		return fmt.Errorf("dpkg-deb --fsys-tarfile %s: %v: %s", d.Path, werr, lastLines(stderr.String(), 3))
	}
	return nil
}

func readDebTar(v view, d Deb, r io.Reader) error {
	top := v[len(v)-1]
	origin := "package " + d.Name
	tr := tar.NewReader(r)
	placed := map[string]string{} // archive path → canonical path, for hard links
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("reading %s: %w", d.Path, err)
		}
		p := cleanPath(h.Name)
		if p == "" {
			continue
		}
		mp := mergedUsrPath(p)
		if isSkipped(mp) {
			continue
		}
		e := &entry{mode: h.Mode & 0o7777, origin: origin}
		switch h.Typeflag {
		case tar.TypeDir:
			e.kind = kindDir
		case tar.TypeReg:
			e.kind = kindFile
			if e.data, err = io.ReadAll(tr); err != nil {
				return fmt.Errorf("reading %s: %w", d.Path, err)
			}
		case tar.TypeLink:
			src, ok := placed[cleanPath(h.Linkname)]
			if !ok || top[src] == nil {
				return fmt.Errorf("%s: hard link %s to %s, which the package has not shipped before it", d.Path, h.Name, h.Linkname)
			}
			e.kind, e.data, e.mode = kindFile, top[src].data, top[src].mode
		case tar.TypeSymlink:
			e.kind, e.target = kindSymlink, h.Linkname
		default:
			continue // devices and fifos have no place in an image
		}
		if old := v.get(mp); old != nil && old.kind != kindDir && old.origin != origin && !sameEntry(old, e) {
			return fmt.Errorf("%s and %s both ship /%s: drop one of them from Spec.Debs", old.origin, origin, mp)
		}
		full, err := v.place(mp, e)
		if err != nil {
			return err
		}
		placed[p] = full
	}
}

func sameEntry(a, b *entry) bool {
	return a.kind == b.kind && a.target == b.target && bytes.Equal(a.data, b.data)
}
