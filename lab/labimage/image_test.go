package labimage

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// TestBuildBusyboxImage builds an image from a static Go program and
// Debian's busybox-static, reads it back and checks its tag, config, layers
// and filesystem, and that building it again gives the same image, byte for byte.
func TestBuildBusyboxImage(t *testing.T) {
	c := debCache(t)
	prog := staticProgram(t)
	spec := Spec{
		Ref:        "example.test/labimage/hello:1.0",
		Debs:       []string{"busybox-static"},
		Files:      []File{{Path: "/usr/local/bin/hello", Src: prog}, {Path: "/etc/hello.conf", Data: []byte("greeting=hi\n")}},
		Symlinks:   map[string]string{"/hello": "usr/local/bin/hello"},
		Dirs:       []Dir{{Path: "/tmp", Mode: 0o1777}, {Path: "/data", Mode: 0o700}},
		Busybox:    "/bin/busybox",
		Entrypoint: []string{"/usr/local/bin/hello"},
		Cmd:        []string{"hi"},
		Env:        []string{"GREETING=hi"},
		WorkingDir: "/data",
		User:       "1000:1000",
		Ports:      []string{"8080", "53/udp"},
	}
	out, id := build(t, spec, c)
	st, _ := os.Stat(out)
	t.Logf("%s: %s, %d bytes", spec.Ref, id, st.Size())

	m, err := tarball.LoadManifest(func() (io.ReadCloser, error) { return os.Open(out) })
	if err != nil {
		t.Fatal(err)
	}
	if len(m) != 1 || !slices.Equal(m[0].RepoTags, []string{spec.Ref}) {
		t.Fatalf("manifest.json: %+v, want one image tagged %s", m, spec.Ref)
	}
	img := load(t, out, spec.Ref)
	if got, err := img.ConfigName(); err != nil || got.String() != id {
		t.Errorf("image ID read back %v (%v), Build returned %s", got, err, id)
	}
	if m[0].Config != id {
		t.Errorf("manifest.json names the config %s, Build returned the ID %s", m[0].Config, id)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.OS != "linux" || cf.Architecture != runtime.GOARCH {
		t.Errorf("platform %s/%s, want linux/%s", cf.OS, cf.Architecture, runtime.GOARCH)
	}
	cfg := cf.Config
	if !slices.Equal(cfg.Entrypoint, spec.Entrypoint) || !slices.Equal(cfg.Cmd, spec.Cmd) {
		t.Errorf("entrypoint %q cmd %q, want %q %q", cfg.Entrypoint, cfg.Cmd, spec.Entrypoint, spec.Cmd)
	}
	if !slices.Equal(cfg.Env, []string{DefaultPath, "GREETING=hi"}) {
		t.Errorf("env %q, want the default PATH and GREETING", cfg.Env)
	}
	if cfg.WorkingDir != "/data" || cfg.User != "1000:1000" {
		t.Errorf("working dir %q user %q", cfg.WorkingDir, cfg.User)
	}
	if _, ok := cfg.ExposedPorts["8080/tcp"]; !ok || len(cfg.ExposedPorts) != 2 {
		t.Errorf("exposed ports %v, want 8080/tcp and 53/udp", cfg.ExposedPorts)
	}
	if cf.Created.Unix() != 0 {
		t.Errorf("created %v, want 1970", cf.Created)
	}
	layers, err := img.Layers()
	if err != nil || len(layers) != 2 {
		t.Fatalf("%d layers (%v), want 2: packages, files", len(layers), err)
	}

	fs := flatten(t, img)
	for p, e := range fs {
		if e.h.Uid != 0 || e.h.Gid != 0 || e.h.ModTime.Unix() != 0 {
			t.Errorf("/%s: owner %d:%d, time %v; want root and 1970", p, e.h.Uid, e.h.Gid, e.h.ModTime)
		}
		if strings.HasPrefix(p, "usr/share/doc") {
			t.Errorf("/%s: documentation is in the image", p)
		}
	}
	wantLink := map[string]string{
		"bin": "usr/bin", "sbin": "usr/sbin", "lib": "usr/lib", "lib64": "usr/lib64",
		"hello":        "usr/local/bin/hello",
		"usr/bin/sh":   "/usr/bin/busybox", // busybox's bin/sh, through the /bin link
		"usr/bin/wget": "/usr/bin/busybox",
		"usr/sbin/ip":  "/usr/bin/busybox",
	}
	for p, target := range wantLink {
		if e, ok := fs[p]; !ok || e.h.Typeflag != tar.TypeSymlink || e.h.Linkname != target {
			t.Errorf("/%s: %+v, want a link to %s", p, e.h, target)
		}
	}
	if e := fs["usr/bin/busybox"]; e.h.Typeflag != tar.TypeReg || e.h.Mode&0o111 == 0 {
		t.Errorf("/usr/bin/busybox: %+v, want an executable", e.h)
	}
	if e := fs["tmp"]; e.h.Typeflag != tar.TypeDir || e.h.Mode != 0o1777 {
		t.Errorf("/tmp: mode %o, want 1777", e.h.Mode)
	}
	if e := fs["usr/local/bin/hello"]; e.h.Mode != 0o755 {
		t.Errorf("/usr/local/bin/hello: mode %o, want the source's 755", e.h.Mode)
	}
	if e := fs["etc/hello.conf"]; string(e.data) != "greeting=hi\n" || e.h.Mode != 0o644 {
		t.Errorf("/etc/hello.conf: %q mode %o", e.data, e.h.Mode)
	}

	// The same inputs give the same image, byte for byte.
	out2, id2 := build(t, spec, c)
	if id2 != id || fileSum(t, out2) != fileSum(t, out) {
		t.Errorf("second build: id %s, first %s (files equal: %v)", id2, id, fileSum(t, out2) == fileSum(t, out))
	}

	// A new binary rewrites the files' layer only.
	other := filepath.Join(t.TempDir(), "hello")
	data, _ := os.ReadFile(prog)
	if err := os.WriteFile(other, append(data, 0), 0o755); err != nil {
		t.Fatal(err)
	}
	spec3 := spec
	spec3.Files = slices.Clone(spec.Files)
	spec3.Files[0].Src = other
	out3, id3 := build(t, spec3, c)
	layers3, err := load(t, out3, spec.Ref).Layers()
	if err != nil {
		t.Fatal(err)
	}
	d1, _ := layers[0].Digest()
	d3, _ := layers3[0].Digest()
	f1, _ := layers[1].Digest()
	f3, _ := layers3[1].Digest()
	if id3 == id || d1 != d3 || f1 == f3 {
		t.Errorf("after changing a binary: image %s (was %s), packages' layer %s (was %s), files' layer %s (was %s)", id3, id, d3, d1, f3, f1)
	}
}

// TestBuildStaticOnly builds the Pause and CoreDNS recipes, which need no
// Debian package (this runs anywhere).
func TestBuildStaticOnly(t *testing.T) {
	prog := staticProgram(t)
	for _, spec := range []Spec{Pause(prog, PauseRef), CoreDNS(prog, "registry.k8s.io/coredns/coredns:v1.12.1")} {
		out, id := build(t, spec, nil)
		img := load(t, out, spec.Ref)
		cf, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(cf.Config.Entrypoint, spec.Entrypoint) || cf.Config.User != spec.User {
			t.Errorf("%s: entrypoint %q user %q", spec.Ref, cf.Config.Entrypoint, cf.Config.User)
		}
		layers, _ := img.Layers()
		if len(layers) != 1 {
			t.Errorf("%s: %d layers, want only the files'", spec.Ref, len(layers))
		}
		fs := flatten(t, img)
		if _, ok := fs["bin"]; ok {
			t.Errorf("%s: has /bin, but no Debian package", spec.Ref)
		}
		if _, d2 := build(t, spec, nil); d2 != id {
			t.Errorf("%s: second build %s, first %s", spec.Ref, d2, id)
		}
	}
	if _, err := Build(context.Background(), Pause(prog, "pause:3.10.1"), nil, filepath.Join(t.TempDir(), "x.tar")); err == nil {
		t.Error("a reference without registry was accepted")
	}
	if _, err := Build(context.Background(), Spec{Ref: "example.test/x:1", Debs: []string{"libc6"}}, nil, filepath.Join(t.TempDir(), "x.tar")); err == nil {
		t.Error("Debian packages without a DebCache were accepted")
	}
}

// TestMissingLibraryHost puts a dynamically linked program of the host in
// an image without its libraries: Build fails naming the program, the
// interpreter and libc, and writes nothing.
func TestMissingLibraryHost(t *testing.T) {
	host := "/usr/bin/true"
	if data, err := os.ReadFile(host); err != nil || !bytes.Contains(data, []byte("ld-linux")) {
		t.Skipf("needs a dynamically linked %s on the host", host)
	}
	out := filepath.Join(t.TempDir(), "x.tar")
	_, err := Build(context.Background(), Spec{Ref: "example.test/broken:1", Files: []File{{Path: "/bin/true", Src: host}}}, nil, out)
	var me *MissingLibrariesError
	if !errors.As(err, &me) {
		t.Fatalf("Build: %v, want a MissingLibrariesError", err)
	}
	msg := err.Error()
	for _, want := range []string{"missing library libc.so.6", "missing ELF interpreter /lib64/ld-linux-x86-64.so.2", "needed by /bin/true", "Spec.Debs"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q does not say %q", msg, want)
		}
	}
	t.Log(msg)
	if _, serr := os.Stat(out); serr == nil {
		t.Error("the broken image was written")
	}
}

// TestMissingLibxtables builds iptables without libxtables12: Build names
// the missing library and the programs that need it.
func TestMissingLibxtables(t *testing.T) {
	c := debCache(t)
	debs := slices.DeleteFunc(closure([]string{"iptables"}, libc, iptablesLibs), func(p string) bool { return p == "libxtables12" })
	_, err := Build(context.Background(), Spec{Ref: "example.test/broken:1", Debs: debs}, c, filepath.Join(t.TempDir(), "x.tar"))
	if err == nil {
		t.Fatal("Build of iptables without libxtables12 succeeded")
	}
	msg := err.Error()
	for _, want := range []string{"missing library libxtables.so.12", "needed by /usr/sbin/xtables-legacy-multi, /usr/sbin/xtables-nft-multi, /usr/lib/"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error does not say %q:\n%s", want, msg)
		}
	}
	t.Log(msg)
}

// TestMissingXtablesModules puts the host's xtables-nft-multi with all its
// libraries but without the iptables package's modules into an image:
// Build names the module iptables would dlopen.
func TestMissingXtablesModules(t *testing.T) {
	const host = "/usr/sbin/xtables-nft-multi"
	if _, err := os.Stat(host); err != nil {
		t.Skipf("needs %s on the host (Debian's iptables)", host)
	}
	c := debCache(t)
	debs := closure(libc, iptablesLibs)
	_, err := Build(context.Background(), Spec{Ref: "example.test/broken:1", Debs: debs, Files: []File{{Path: "/usr/sbin/xtables-nft-multi", Src: host}}}, c, filepath.Join(t.TempDir(), "x.tar"))
	want := "missing plugin loaded by dlopen /usr/lib/" + gnuTriplet + "/xtables/libxt_standard.so (Debian package iptables), needed by /usr/sbin/xtables-nft-multi"
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("Build: %v\nwant an error saying %q", err, want)
	}
}

// TestFileCapabilities: CoreDNS's binary carries cap_net_bind_service=+ep
// as an extended attribute of its layer (revision 2 of vfs_cap_data), as
// setcap would have set it.
func TestFileCapabilities(t *testing.T) {
	spec := CoreDNS(staticProgram(t), "registry.k8s.io/coredns/coredns:v1.12.1")
	out, _ := build(t, spec, nil)
	layers, err := load(t, out, spec.Ref).Layers()
	if err != nil {
		t.Fatal(err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	want := string([]byte{1, 0, 0, 2, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0})
	for {
		h, err := tr.Next()
		if err != nil {
			t.Fatalf("no coredns in the layer: %v", err)
		}
		if h.Name != "coredns" {
			if h.PAXRecords["SCHILY.xattr.security.capability"] != "" {
				t.Errorf("%s has capabilities too", h.Name)
			}
			continue
		}
		if got := h.PAXRecords["SCHILY.xattr.security.capability"]; got != want {
			t.Errorf("coredns's security.capability is %x, want %x", got, want)
		}
		return
	}
}
