package labimage

import (
	"context"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestResolve checks symlink resolution inside an image: absolute and
// relative targets, links in the middle of a path, ".." that stops at the
// root, and loops.
func TestResolve(t *testing.T) {
	lower := tree{
		"usr":               {kind: kindDir, mode: 0o755},
		"usr/bin":           {kind: kindDir, mode: 0o755},
		"usr/bin/busybox":   {kind: kindFile, mode: 0o755, data: []byte("bb")},
		"usr/lib":           {kind: kindDir, mode: 0o755},
		"usr/lib/libc.so.6": {kind: kindFile, mode: 0o755, data: []byte("libc")},
		"bin":               {kind: kindSymlink, target: "usr/bin"},
		"lib":               {kind: kindSymlink, target: "/usr/lib"},
		"usr/bin/sh":        {kind: kindSymlink, target: "busybox"},
		"usr/bin/up":        {kind: kindSymlink, target: "../../../../usr/lib/libc.so.6"},
		"loop1":             {kind: kindSymlink, target: "loop2"},
		"loop2":             {kind: kindSymlink, target: "/loop1"},
	}
	upper := tree{
		"usr/bin/busybox": {kind: kindFile, mode: 0o755, data: []byte("newer")},
	}
	v := view{lower, upper}
	for _, c := range []struct {
		path, want string
		follow     bool
		data       string
	}{
		{"/bin/sh", "usr/bin/busybox", true, "newer"},
		{"/bin/sh", "usr/bin/sh", false, ""},
		{"lib/libc.so.6", "usr/lib/libc.so.6", true, "libc"},
		{"/bin/up", "usr/lib/libc.so.6", true, "libc"},
		{"/bin/../lib/libc.so.6", "usr/lib/libc.so.6", true, "libc"},
		{"/bin/missing/x", "usr/bin/missing/x", true, ""},
	} {
		got, e := v.resolve(c.path, c.follow)
		if got != c.want {
			t.Errorf("resolve(%q, %v) = %q, want %q", c.path, c.follow, got, c.want)
		}
		if c.data != "" && (e == nil || string(e.data) != c.data) {
			t.Errorf("resolve(%q): entry %+v, want the file %q", c.path, e, c.data)
		}
	}
	if _, e := v.resolve("/loop1", true); e != nil {
		t.Errorf("a link loop resolved to %+v", e)
	}
}

// TestPlace checks that the top layer gets its files at their canonical
// places, with every parent folder, and refuses what a runtime could not
// apply.
func TestPlace(t *testing.T) {
	lower := tree{
		"usr":      {kind: kindDir, mode: 0o755},
		"usr/bin":  {kind: kindDir, mode: 0o700},
		"bin":      {kind: kindSymlink, target: "usr/bin"},
		"etc":      {kind: kindDir, mode: 0o755},
		"etc/motd": {kind: kindFile, mode: 0o644},
	}
	upper := tree{}
	v := view{lower, upper}
	if got, err := v.place("/bin/tool", &entry{kind: kindFile, mode: 0o755, origin: "test"}); err != nil || got != "usr/bin/tool" {
		t.Fatalf("place(/bin/tool) = %q, %v; want usr/bin/tool", got, err)
	}
	if _, err := v.place("/opt/x/y", &entry{kind: kindFile, mode: 0o644, origin: "test"}); err != nil {
		t.Fatal(err)
	}
	want := map[string]int64{"usr": 0o755, "usr/bin": 0o700, "usr/bin/tool": 0o755, "opt": 0o755, "opt/x": 0o755, "opt/x/y": 0o644}
	got := map[string]int64{}
	for p, e := range upper {
		got[p] = e.mode
	}
	if !maps.Equal(got, want) {
		t.Errorf("top layer %v, want %v", got, want)
	}
	if _, err := v.place("/etc", &entry{kind: kindFile, mode: 0o644, origin: "test"}); err == nil || !strings.Contains(err.Error(), "directory") {
		t.Errorf("a file over a folder: %v", err)
	}
	if _, err := v.place("/etc/motd/x", &entry{kind: kindFile, mode: 0o644, origin: "test"}); err == nil {
		t.Error("a file under a file was placed")
	}
	if got, err := v.place("/bin", &entry{kind: kindDir, origin: "test"}); err != nil || got != "usr/bin" {
		t.Errorf("a folder at a link to a folder: %q, %v; want the folder itself", got, err)
	}
}

func TestMergedUsrPath(t *testing.T) {
	for in, want := range map[string]string{
		"lib/x86_64-linux-gnu/libc.so.6": "usr/lib/x86_64-linux-gnu/libc.so.6",
		"lib64/ld-linux-x86-64.so.2":     "usr/lib64/ld-linux-x86-64.so.2",
		"bin/ip":                         "usr/bin/ip",
		"sbin":                           "usr/sbin",
		"usr/bin/curl":                   "usr/bin/curl",
		"etc/iproute2/rt_tables":         "etc/iproute2/rt_tables",
		"library/x":                      "library/x",
	} {
		if got := mergedUsrPath(in); got != want {
			t.Errorf("mergedUsrPath(%q) = %q, want %q", in, got, want)
		}
	}
	for p, want := range map[string]bool{"usr/share/doc/libc6/copyright": true, "usr/share/man": true, "usr/share/docs": false, "usr/share/zoneinfo/UTC": false} {
		if isSkipped(p) != want {
			t.Errorf("isSkipped(%q) = %v", p, !want)
		}
	}
}

func TestParseApt(t *testing.T) {
	policy := `iptables:
  Installed: 1.8.9-2
  Candidate: 1.8.9-2
  Version table:
 *** 1.8.9-2 500
        500 http://deb.debian.org/debian bookworm/main amd64 Packages
busybox-static:
  Installed: (none)
  Candidate: 1:1.35.0-4+deb12u1+b1
  Version table:
ghost:
  Installed: (none)
  Candidate: (none)
  Version table:
`
	got := parsePolicy(policy)
	want := map[string]string{"iptables": "1.8.9-2", "busybox-static": "1:1.35.0-4+deb12u1+b1", "ghost": "(none)"}
	if !maps.Equal(got, want) {
		t.Errorf("parsePolicy: %v, want %v", got, want)
	}
	show := `Package: busybox-static
Version: 1:1.35.0-4+deb12u1+b1
Architecture: amd64
Description: Standalone rescue shell
 with tons of builtin utilities
Filename: pool/main/b/busybox/busybox-static_1.35.0-4+deb12u1+b1_amd64.deb
Size: 1030236
SHA256: 0123abcd

Package: netbase
Version: 6.4
Architecture: all
Filename: pool/main/n/netbase/netbase_6.4_all.deb
Size: 12784
SHA256: 4567ef
`
	recs := parseRecords(show)
	if len(recs) != 2 {
		t.Fatalf("parseRecords: %+v", recs)
	}
	if r := recs[0]; r.name != "busybox-static" || r.version != "1:1.35.0-4+deb12u1+b1" || r.arch != "amd64" || r.size != 1030236 || r.sha256 != "0123abcd" {
		t.Errorf("first record %+v", r)
	}
	c := NewDebCache("/cache")
	if got := c.file(recs[1]); got != "/cache/netbase_6.4_all.deb" {
		t.Errorf("cache file %q", got)
	}
}

func TestDefaultCacheDir(t *testing.T) {
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	for _, c := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{EnvCacheDir: "/c", "XDG_CACHE_HOME": "/x", "HOME": "/h"}, "/c"},
		{map[string]string{"XDG_CACHE_HOME": "/x", "HOME": "/h"}, "/x/tabby"},
		{map[string]string{"HOME": "/h"}, "/h/.cache/tabby"},
	} {
		if got, err := DefaultCacheDir(env(c.env)); err != nil || got != c.want {
			t.Errorf("DefaultCacheDir(%v) = %q, %v; want %q", c.env, got, err, c.want)
		}
	}
	if _, err := DefaultCacheDir(env(nil)); err == nil {
		t.Error("no HOME: no error")
	}
	if got := DebCacheDir("/c"); got != "/c/debs" {
		t.Errorf("DebCacheDir = %q", got)
	}
}

// TestDebCacheConcurrent fetches the same packages into one fresh cache
// folder from several caches at once, as test binaries running side by side
// do: each gets whole files with apt's SHA256, nothing is left half
// written, and a later fetch downloads nothing.
func TestDebCacheConcurrent(t *testing.T) {
	debCache(t) // skips without apt
	dir := t.TempDir()
	names := []string{"netbase", "libmnl0"}
	errs := make(chan error, 3)
	results := make(chan []Deb, 3)
	for range 3 {
		go func() {
			debs, err := NewDebCache(dir).Fetch(context.Background(), names)
			errs <- err
			results <- debs
		}()
	}
	var debs []Deb
	for range 3 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
		debs = <-results
	}
	ents, _ := os.ReadDir(dir)
	var files []string
	for _, e := range ents {
		files = append(files, e.Name())
	}
	if len(files) != 2 {
		t.Errorf("cache folder holds %v, want the two .deb files only", files)
	}
	for _, d := range debs {
		if !strings.HasPrefix(filepath.Base(d.Path), d.Name+"_") || !strings.HasSuffix(d.Path, "_"+d.Arch+".deb") {
			t.Errorf("%s cached as %s", d.Name, d.Path)
		}
		if out, err := exec.Command("dpkg-deb", "--field", d.Path, "Package").Output(); err != nil || strings.TrimSpace(string(out)) != d.Name {
			t.Errorf("%s: dpkg-deb --field Package: %q %v", d.Path, out, err)
		}
	}
	st, _ := os.Stat(debs[0].Path)
	var logged strings.Builder
	c := NewDebCache(dir)
	c.Log = slog.New(slog.NewTextHandler(&logged, nil))
	if _, err := c.Fetch(context.Background(), names); err != nil {
		t.Fatal(err)
	}
	st2, _ := os.Stat(debs[0].Path)
	if logged.Len() > 0 || !st2.ModTime().Equal(st.ModTime()) {
		t.Errorf("a warm fetch downloaded again: %s", logged.String())
	}
	if _, err := c.Fetch(context.Background(), []string{"--option"}); err == nil {
		t.Error("a name that is an option was passed to apt")
	}
}
