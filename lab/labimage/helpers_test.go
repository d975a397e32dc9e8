package labimage

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/tabbynet/tabby/internal/tier"
)

// shared is a folder the package's tests share (the static test program),
// removed by TestMain.
var shared string

func TestMain(m *testing.M) {
	var err error
	if shared, err = os.MkdirTemp("", "labimage-test-"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(shared)
	os.Exit(code)
}

var (
	staticOnce sync.Once
	staticPath string
	staticErr  error
)

// staticProgram is a static Go program (CGO_ENABLED=0) that prints its
// first argument, or "hello from labimage"; built once per test binary.
func staticProgram(t *testing.T) string {
	t.Helper()
	staticOnce.Do(func() {
		dir := filepath.Join(shared, "prog")
		if staticErr = os.MkdirAll(dir, 0o755); staticErr != nil {
			return
		}
		src := "package main\n\nimport (\n\t\"fmt\"\n\t\"os\"\n)\n\nfunc main() {\n\tif len(os.Args) > 1 {\n\t\tfmt.Println(os.Args[1])\n\t\treturn\n\t}\n\tfmt.Println(\"hello from labimage\")\n}\n"
		if staticErr = os.WriteFile(filepath.Join(dir, "main.go"), []byte(src), 0o644); staticErr != nil {
			return
		}
		if staticErr = os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module labimagetest\n\ngo 1.22\n"), 0o644); staticErr != nil {
			return
		}
		staticPath = filepath.Join(shared, "hello")
		cmd := exec.Command(goTool(), "build", "-trimpath", "-o", staticPath, ".")
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=", "GOWORK=off")
		if out, err := cmd.CombinedOutput(); err != nil {
			staticErr = fmt.Errorf("go build: %v: %s", err, out)
		}
	})
	if staticErr != nil {
		t.Fatalf("building the static test program: %v", staticErr)
	}
	return staticPath
}

// goTool is the go command: the one on PATH, else the one of the
// toolchain that built this test.
func goTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return filepath.Join(runtime.GOROOT(), "bin", "go")
}

// binDir is a folder holding the static test program under each name.
func binDir(t *testing.T, names ...string) string {
	t.Helper()
	prog := staticProgram(t)
	dir := t.TempDir()
	data, err := os.ReadFile(prog)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if err := os.WriteFile(filepath.Join(dir, n), data, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// debCache is the real .deb cache (DefaultCacheDir): the files there are
// keyed by package, version and architecture and verified against apt's
// SHA256, every test binary and the lab itself share them safely, and a
// warm cache makes these tests take seconds instead of a download. It
// skips the test on a machine without apt and dpkg-deb.
func debCache(t *testing.T) *DebCache {
	t.Helper()
	for _, tool := range []string{"apt-get", "apt-cache", "dpkg-deb"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs Debian's apt and dpkg (%s not found) to fetch and unpack .deb files", tool)
		}
	}
	dir, err := DefaultCacheDir(os.Getenv)
	if err != nil {
		t.Fatal(err)
	}
	c := NewDebCache(DebCacheDir(dir))
	c.Log = slog.New(slog.NewTextHandler(testWriter{t}, nil))
	return c
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

func needRoot(t *testing.T, why string) {
	t.Helper()
	tier.Root(t, "to "+why)
}

// build builds spec into a temporary file and returns its path and image ID.
func build(t *testing.T, spec Spec, c *DebCache) (string, string) {
	t.Helper()
	out := filepath.Join(t.TempDir(), "image.tar")
	id, err := Build(context.Background(), spec, c, out)
	if err != nil {
		t.Fatalf("Build(%s): %v", spec.Ref, err)
	}
	return out, id
}

// load reads an image tarball back.
func load(t *testing.T, path, ref string) v1.Image {
	t.Helper()
	tag, err := name.NewTag(ref, name.StrictValidation)
	if err != nil {
		t.Fatal(err)
	}
	img, err := tarball.ImageFromPath(path, &tag)
	if err != nil {
		t.Fatalf("reading %s back as %s: %v", path, ref, err)
	}
	return img
}

func fileSum(t *testing.T, p string) string {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// flatEntry is one entry of an image's flattened filesystem.
type flatEntry struct {
	h    tar.Header
	data []byte
}

// flatten returns the image's filesystem as a container would see it.
func flatten(t *testing.T, img v1.Image) map[string]flatEntry {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	m := map[string]flatEntry{}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return m
		}
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		m[cleanPath(h.Name)] = flatEntry{*h, data}
	}
}

// extract writes the image's filesystem into dir (a root for chroot).
func extract(t *testing.T, img v1.Image, dir string) {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	var dirs []*tar.Header
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		rel := cleanPath(h.Name)
		if rel == "" {
			continue
		}
		p := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
			dirs = append(dirs, h)
		case tar.TypeReg:
			f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := io.Copy(f, tr); err != nil {
				t.Fatal(err)
			}
			f.Close()
			if err := syscall.Chmod(p, uint32(h.Mode)); err != nil {
				t.Fatal(err)
			}
		case tar.TypeSymlink:
			if err := os.Symlink(h.Linkname, p); err != nil {
				t.Fatal(err)
			}
		default:
			t.Fatalf("unexpected entry %s of type %c", h.Name, h.Typeflag)
		}
	}
	for _, h := range dirs {
		if err := syscall.Chmod(filepath.Join(dir, cleanPath(h.Name)), uint32(h.Mode)); err != nil {
			t.Fatal(err)
		}
	}
}
