package installcni

import (
	"bytes"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tabbynet/tabby/plugin"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if built.dir != "" {
		os.RemoveAll(built.dir)
	}
	os.Exit(code)
}

func TestRuntimeMaxCNIVersion(t *testing.T) {
	cases := []struct {
		runtime string
		max     string
		known   bool
	}{
		// containerd: libcni v0.8 (1.5), v1.0/v1.1 (1.6, 1.7), v1.2+ (2.x).
		{"containerd://1.5.18", "0.4.0", true},
		{"containerd://1.6.0-beta.3", "0.4.0", true},
		{"containerd://1.6.0", "1.0.0", true},
		{"containerd://1.6.20", "1.0.0", true},
		{"containerd://1.6.20~ds1", "1.0.0", true},
		{"containerd://1.7.12-0ubuntu2~22.04.1", "1.0.0", true},
		{"containerd://v1.7.27", "1.0.0", true},
		{"containerd://1.7.23-k3s2", "1.0.0", true},
		{"containerd://2.0.0-rc.0", "1.0.0", true},
		{"containerd://2.0.0", "1.1.0", true},
		{"containerd://2.0.4-k3s2", "1.1.0", true},
		{"containerd://2.1.0", "1.1.0", true},
		{"containerd://2.4.2", "1.1.0", true},
		{"containerd://3.0.0", "1.1.0", true},
		// CRI-O: libcni v0.8 (1.22), v1.0/v1.1 (1.23 to 1.30), v1.2+ (1.31 on).
		{"cri-o://1.22.5", "0.4.0", true},
		{"cri-o://1.23.0", "1.0.0", true},
		{"cri-o://1.30.4", "1.0.0", true},
		{"cri-o://1.31.0-rc.1", "1.0.0", true},
		{"cri-o://1.31.0", "1.1.0", true},
		{"cri-o://1.35.0", "1.1.0", true},
		// Unknown: the fallback.
		{"docker://24.0.5", FallbackRuntimeCNIVersion, false},
		{"remote://1.0", FallbackRuntimeCNIVersion, false},
		{"tabby-lab://1", FallbackRuntimeCNIVersion, false},
		{"containerd://", FallbackRuntimeCNIVersion, false},
		{"containerd", FallbackRuntimeCNIVersion, false},
		{"", FallbackRuntimeCNIVersion, false},
	}
	for _, c := range cases {
		max, known := RuntimeMaxCNIVersion(c.runtime)
		if max != c.max || known != c.known {
			t.Errorf("RuntimeMaxCNIVersion(%q) = %s, %v; want %s, %v", c.runtime, max, known, c.max, c.known)
		}
	}
}

func TestCompareBuildVersions(t *testing.T) {
	cases := []struct {
		a, b string
		want int
		ok   bool
	}{
		{"v1.9.1", "v1.9.1", 0, true},
		{"v1.10.0", "v1.9.1", 1, true},
		{"v1.9.1", "v1.10.0", -1, true},
		{"1.9.1", "v1.9.1", 0, true},
		{"v2.0", "v1.99.99", 1, true},
		{"v1.4.0-rc.1", "v1.4.0", -1, true},
		{"v1.4.0-rc.2", "v1.4.0-rc.10", -1, true},
		{"v1.4.0-rc.1", "v1.4.0-beta.3", 1, true},
		{"v1.4.0-1", "v1.4.0-rc", -1, true},
		{"v1.1.1+ds1", "v1.1.1", 0, true},
		{"v1.2.0-dirty", "v1.1.9", 1, true},
		{"version unknown", "v1.9.1", 0, false},
		{"", "v1.9.1", 0, false},
		{"v1.9.1", "", 0, false},
	}
	for _, c := range cases {
		got, ok := CompareBuildVersions(c.a, c.b)
		if got != c.want || ok != c.ok {
			t.Errorf("CompareBuildVersions(%q, %q) = %d, %v; want %d, %v", c.a, c.b, got, ok, c.want, c.ok)
		}
	}
}

func TestChooseCNIVersion(t *testing.T) {
	tabby := []string{"0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"}
	all := []string{"0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"}
	upto100 := all[:6]
	cases := []struct {
		name    string
		rt      runtimeLimit
		chain   []chainLimit
		want    string
		wantWhy string
		wantErr string
	}{
		{"all speak 1.1.0", runtimeLimit{max: "1.1.0", who: "containerd://2.1.0"}, []chainLimit{{"portmap v1.9.1", all}},
			"1.1.0", "cniVersion 1.1.0: containerd://2.1.0 speaks CNI up to 1.1.0; portmap v1.9.1 speaks up to 1.1.0", ""},
		{"the runtime limits", runtimeLimit{max: "1.0.0", who: "containerd://1.6.20"}, []chainLimit{{"portmap v1.9.1", all}},
			"1.0.0", "cniVersion 1.0.0: containerd://1.6.20 speaks CNI up to 1.0.0; portmap v1.9.1 speaks up to 1.1.0", ""},
		{"portmap limits", runtimeLimit{max: "1.1.0", who: "containerd://2.1.0"}, []chainLimit{{"the node's portmap (version unknown)", upto100}},
			"1.0.0", "cniVersion 1.0.0: containerd://2.1.0 speaks CNI up to 1.1.0; the node's portmap (version unknown) speaks up to 1.0.0", ""},
		{"no chain", runtimeLimit{max: "1.0.0", who: "cri-o://1.30.0"}, nil, "1.0.0", "cniVersion 1.0.0: cri-o://1.30.0 speaks CNI up to 1.0.0", ""},
		{"a runtime newer than tabby", runtimeLimit{max: "1.3.0", who: "r"}, nil, "1.1.0", "cniVersion 1.1.0: r speaks CNI up to 1.3.0", ""},
		{"an old runtime", runtimeLimit{max: "0.4.0", who: "containerd://1.5.0"}, []chainLimit{{"portmap v1.9.1", all}}, "0.4.0", "", ""},
		{"a gap", runtimeLimit{max: "1.1.0", who: "r"}, []chainLimit{{"a", []string{"0.3.1", "1.1.0"}}, {"b", []string{"0.3.1", "1.0.0"}}}, "0.3.1", "", ""},
		{"nothing in common", runtimeLimit{max: "1.1.0", who: "r"}, []chainLimit{{"portmap v0.1", []string{"0.1.0", "0.2.0"}}},
			"", "", "no CNI version that tabby (0.3.0, 0.3.1, 0.4.0, 1.0.0, 1.1.0) speaks is spoken by all of: r speaks CNI up to 1.1.0; portmap v0.1 speaks up to 0.2.0"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, why, err := chooseCNIVersion(tabby, c.rt, c.chain)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("error %v, want %q", err, c.wantErr)
				}
				return
			}
			if err != nil || got != c.want || (c.wantWhy != "" && why != c.wantWhy) {
				t.Errorf("got %q, %q, %v; want %q, %q", got, why, err, c.want, c.wantWhy)
			}
		})
	}
}

func TestNewestCNIVersionIsTabbys(t *testing.T) {
	if got := newestOf(plugin.SupportedVersions.SupportedVersions()); got != NewestCNIVersion {
		t.Errorf("the plugins speak up to %s, NewestCNIVersion says %s", got, NewestCNIVersion)
	}
	if err := ParseCNIVersion(FallbackRuntimeCNIVersion); err != nil || !contains(plugin.SupportedVersions.SupportedVersions(), FallbackRuntimeCNIVersion) {
		t.Errorf("the fallback %s is not a version tabby speaks (%v)", FallbackRuntimeCNIVersion, err)
	}
}

// built holds the reference plugins built from the pinned module by
// hack/build-cni-plugins.sh, once per test binary.
var built struct {
	once    sync.Once
	dir     string
	version string
	err     error
}

// realPlugins builds loopback and portmap as the image does and returns
// their folder and the version they say they are.
func realPlugins(t *testing.T) (dir, version string) {
	t.Helper()
	built.once.Do(func() {
		built.dir, built.err = os.MkdirTemp("", "tabby-cni-plugins-")
		if built.err != nil {
			return
		}
		start := time.Now()
		out, err := exec.Command("../hack/build-cni-plugins.sh", built.dir).CombinedOutput()
		if err != nil {
			built.err = fmt.Errorf("hack/build-cni-plugins.sh: %v\n%s", err, out)
			return
		}
		if len(out) != 0 {
			built.err = fmt.Errorf("hack/build-cni-plugins.sh printed more than errors:\n%s", out)
			return
		}
		mod, err := exec.Command("go", "list", "-m", "-f", "{{.Version}}", "github.com/containernetworking/plugins").Output()
		if err != nil {
			built.err = fmt.Errorf("go list -m: %v", err)
			return
		}
		built.version = strings.TrimSpace(string(mod))
		t.Logf("built loopback and portmap %s in %v", built.version, time.Since(start).Round(time.Millisecond))
	})
	if built.err != nil {
		t.Fatal(built.err)
	}
	return built.dir, built.version
}

// realEnv is an env whose image holds the real reference plugins.
func realEnv(t *testing.T) (*env, string) {
	t.Helper()
	dir, version := realPlugins(t)
	e := newEnv(t)
	for _, name := range DefaultReferencePlugins {
		e.writeSource(name, mustRead(t, filepath.Join(dir, name)))
	}
	return e, version
}

func (e *env) writeHost(name string, data []byte) {
	e.t.Helper()
	if err := os.MkdirAll(e.binDir, 0o755); err != nil {
		e.t.Fatal(err)
	}
	e.write(filepath.Join(e.binDir, name), data, 0o755)
}

func notes(r *Result) string { return strings.Join(r.Notes, "\n") }

func fileOf(t *testing.T, r *Result, path string) File {
	t.Helper()
	for _, f := range r.Files {
		if f.Path == path {
			return f
		}
	}
	t.Fatalf("no %s among %v", path, r.Files)
	return File{}
}

// newer is a build version newer than v (its next major).
func newer(t *testing.T, v string) string {
	t.Helper()
	major, _, _ := strings.Cut(strings.TrimPrefix(v, "v"), ".")
	n, err := strconv.Atoi(major)
	if err != nil {
		t.Fatalf("version %q", v)
	}
	return fmt.Sprintf("v%d.0.0", n+1)
}

// TestReferencePluginsOnAnEmptyNode: the plugins built from the pinned
// module go in, say their version, answer the real CNI VERSION, and the
// conflist follows the runtime.
func TestReferencePluginsOnAnEmptyNode(t *testing.T) {
	e, version := realEnv(t)
	o := e.opts()
	o.ContainerRuntime = "containerd://1.6.20"
	res := e.install(o)
	want := []string{
		"installed loopback " + version + " into " + e.binDir + ": the container runtime runs it for every pod",
		"installed portmap " + version + " into " + e.binDir + ": the conflist chains it for hostPort",
		"cniVersion 1.0.0: containerd://1.6.20 speaks CNI up to 1.0.0; portmap " + version + " speaks up to 1.1.0",
	}
	if notes(res) != strings.Join(want, "\n") {
		t.Errorf("notes:\n%s\nwant:\n%s", notes(res), strings.Join(want, "\n"))
	}
	if len(res.Warnings) != 0 {
		t.Errorf("warnings: %q", res.Warnings)
	}
	for _, name := range DefaultReferencePlugins {
		path := filepath.Join(e.binDir, name)
		if f := fileOf(t, res, path); !f.Changed || f.Kept || !strings.Contains(f.String(), "installed") {
			t.Errorf("%s: %s", name, f)
		}
		if got, err := probeBuildVersion(path); err != nil || got != version {
			t.Errorf("the installed %s says %q (%v), want %s", name, got, err, version)
		}
		vs, err := cniVersions(path)
		if err != nil || !contains(vs, "1.1.0") || !contains(vs, loopbackCNIVersion) {
			t.Errorf("the installed %s speaks %v (%v)", name, vs, err)
		}
	}
	if v := e.conflistVersion(); v != "1.0.0" {
		t.Errorf("conflist cniVersion %s on containerd 1.6", v)
	}

	// The node moves to containerd 2: only the conflist changes.
	o.ContainerRuntime = "containerd://2.1.0"
	res = e.install(o)
	if c := changedPaths(res); len(c) != 1 || c[0] != e.conflist {
		t.Errorf("changed %v, want only the conflist", c)
	}
	if v := e.conflistVersion(); v != "1.1.0" {
		t.Errorf("conflist cniVersion %s on containerd 2", v)
	}
	if !strings.Contains(notes(res), "loopback "+version+" is in "+e.binDir+" already (the image's)") {
		t.Errorf("notes:\n%s", notes(res))
	}
}

// TestReferencePluginsNodeHasItsOwn: a node's newer or same-version plugin
// stays, an older one is replaced, one whose version cannot be read stays
// and is checked.
func TestReferencePluginsNodeHasItsOwn(t *testing.T) {
	t.Run("newer stays", func(t *testing.T) {
		e, version := realEnv(t)
		next := newer(t, version)
		node := fakePlugin("portmap", next, "1.1.0")
		e.writeHost("portmap", node)
		res := e.install(e.opts())
		path := filepath.Join(e.binDir, "portmap")
		if !bytes.Equal(mustRead(t, path), node) {
			t.Error("the node's newer portmap was overwritten")
		}
		if f := fileOf(t, res, path); !f.Kept || f.Changed || f.NewSHA256 != sum(node) || !strings.Contains(f.String(), "kept") {
			t.Errorf("file: %s %+v", f, f)
		}
		for _, want := range []string{
			"kept the node's portmap " + next + ", newer than the image's " + version,
			"cniVersion 1.1.0: containerd://2.1.0 speaks CNI up to 1.1.0; the node's portmap " + next + " speaks up to 1.1.0",
		} {
			if !strings.Contains(notes(res), want) {
				t.Errorf("notes lack %q:\n%s", want, notes(res))
			}
		}
		if len(res.Warnings) != 0 {
			t.Errorf("warnings: %q", res.Warnings)
		}
		// A second run leaves it too, and changes nothing.
		if res := e.install(e.opts()); len(res.Changed()) != 0 {
			t.Errorf("second run changed %v", changedPaths(res))
		}
	})
	t.Run("same version stays", func(t *testing.T) {
		e, version := realEnv(t)
		node := fakePlugin("loopback", version, "1.1.0")
		e.writeHost("loopback", node)
		res := e.install(e.opts())
		if !bytes.Equal(mustRead(t, filepath.Join(e.binDir, "loopback")), node) {
			t.Error("the node's loopback of the same version was overwritten")
		}
		if want := "kept the node's loopback " + version + ", the same version as the image's"; !strings.Contains(notes(res), want) {
			t.Errorf("notes lack %q:\n%s", want, notes(res))
		}
	})
	t.Run("older is replaced", func(t *testing.T) {
		e, version := realEnv(t)
		e.writeHost("portmap", fakePlugin("portmap", "v1.0.0", "1.0.0"))
		res := e.install(e.opts())
		path := filepath.Join(e.binDir, "portmap")
		if !bytes.Equal(mustRead(t, path), mustRead(t, filepath.Join(e.src, "portmap"))) {
			t.Error("the node's older portmap was not replaced")
		}
		if f := fileOf(t, res, path); !f.Changed || !strings.Contains(f.String(), "updated") {
			t.Errorf("file: %s", f)
		}
		if want := "replaced the node's portmap v1.0.0 in " + e.binDir + " with the image's " + version + ", which is newer"; !strings.Contains(notes(res), want) {
			t.Errorf("notes lack %q:\n%s", want, notes(res))
		}
		if v := e.conflistVersion(); v != "1.1.0" {
			t.Errorf("cniVersion %s: the old portmap's limit outlived it", v)
		}
	})
	t.Run("unreadable version stays and holds the version down", func(t *testing.T) {
		e, version := realEnv(t)
		// Debian's plugins say "version unknown" and stop at CNI 1.0.0.
		node := fakePlugin("portmap", "", "1.0.0")
		if debian, err := os.ReadFile("/usr/lib/cni/portmap"); err == nil {
			node = debian
		}
		e.writeHost("portmap", node)
		res := e.install(e.opts())
		if !bytes.Equal(mustRead(t, filepath.Join(e.binDir, "portmap")), node) {
			t.Error("the node's portmap of unknown version was overwritten")
		}
		if want := "kept the node's portmap in " + e.binDir + ": its version cannot be read (it says \"CNI portmap plugin version unknown\"), so it is not replaced with the image's " + version; !strings.Contains(notes(res), want) {
			t.Errorf("notes lack %q:\n%s", want, notes(res))
		}
		if v := e.conflistVersion(); v != "1.0.0" {
			t.Errorf("cniVersion %s, but the node's portmap stops at 1.0.0", v)
		}
		if len(res.Warnings) != 1 || !strings.Contains(res.Warnings[0], "keeps the conflist at cniVersion 1.0.0 although tabby and the container runtime speak 1.1.0") {
			t.Errorf("warnings: %q", res.Warnings)
		}
	})
	t.Run("a link that leads nowhere from here stays, with a warning", func(t *testing.T) {
		e, _ := realEnv(t)
		if err := os.MkdirAll(e.binDir, 0o755); err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(e.binDir, "loopback")
		// On the host it may lead to /usr/lib/cni; in the container it does not.
		if err := os.Symlink("/nonexistent/usr/lib/cni/loopback", path); err != nil {
			t.Fatal(err)
		}
		res := e.install(e.opts())
		if target, err := os.Readlink(path); err != nil || target != "/nonexistent/usr/lib/cni/loopback" {
			t.Errorf("the node's link was replaced (%q, %v)", target, err)
		}
		if f := fileOf(t, res, path); !f.Kept || f.String() != path+": the node's own, kept (not readable from here)" {
			t.Errorf("file: %s", f)
		}
		if len(res.Warnings) != 1 || !strings.Contains(res.Warnings[0], "the node's loopback in "+e.binDir+" does not answer CNI VERSION here") {
			t.Errorf("warnings: %q", res.Warnings)
		}
	})
	t.Run("mute portmap stays, assumed 1.0.0", func(t *testing.T) {
		e, _ := realEnv(t)
		e.writeHost("portmap", []byte("#!/bin/sh\nexit 1\n"))
		res := e.install(e.opts())
		if v := e.conflistVersion(); v != "1.0.0" {
			t.Errorf("cniVersion %s", v)
		}
		if len(res.Warnings) != 2 || !strings.Contains(res.Warnings[0], "assuming it speaks CNI up to 1.0.0") {
			t.Errorf("warnings: %q", res.Warnings)
		}
		if !strings.Contains(notes(res), "the node's portmap (version unknown) (assumed) speaks up to 1.0.0") {
			t.Errorf("notes:\n%s", notes(res))
		}
	})
}

// TestRuntimeFromTheNode: without a runtime given, install-cni reads it
// from its Node with the CNI credentials it writes into the kubeconfig.
func TestRuntimeFromTheNode(t *testing.T) {
	var mu sync.Mutex
	runtimeVersion := "containerd://1.7.27"
	var asked []string
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		asked = append(asked, r.Method+" "+r.URL.Path+" "+r.Header.Get("Authorization"))
		if r.URL.Path != "/api/v1/nodes/node-1" || r.Header.Get("Authorization") != "Bearer token-one" {
			http.Error(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404}`, http.StatusNotFound)
			return
		}
		n := corev1.Node{TypeMeta: metav1.TypeMeta{Kind: "Node", APIVersion: "v1"}, ObjectMeta: metav1.ObjectMeta{Name: "node-1"}}
		n.Status.NodeInfo.ContainerRuntimeVersion = runtimeVersion
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(n)
	}))
	defer srv.Close()
	e := newEnv(t)
	e.write(filepath.Join(e.sa, "ca.crt"), pemCert(srv.Certificate().Raw), 0o400)
	o := e.opts()
	o.ContainerRuntime, o.APIServer = "", srv.URL
	e.writeSource("portmap", fakePlugin("portmap", "v1.9.1", "1.1.0"))
	res := e.install(o)
	if v := e.conflistVersion(); v != "1.0.0" || len(res.Warnings) != 0 ||
		!strings.Contains(notes(res), "cniVersion 1.0.0: containerd://1.7.27 speaks CNI up to 1.0.0; portmap v1.9.1 speaks up to 1.1.0") {
		t.Errorf("cniVersion %s, warnings %q, notes:\n%s", v, res.Warnings, notes(res))
	}
	mu.Lock()
	if len(asked) != 1 || asked[0] != "GET /api/v1/nodes/node-1 Bearer token-one" {
		t.Errorf("requests: %q", asked)
	}
	runtimeVersion = "containerd://2.0.0"
	mu.Unlock()
	if e.install(o); e.conflistVersion() != "1.1.0" {
		t.Errorf("on containerd 2 the conflist says %s", e.conflistVersion())
	}

	// A runtime install-cni does not know: the fallback, and a warning.
	mu.Lock()
	runtimeVersion = "docker://24.0.5"
	mu.Unlock()
	res = e.install(o)
	if e.conflistVersion() != FallbackRuntimeCNIVersion || len(res.Warnings) != 1 ||
		!strings.Contains(res.Warnings[0], `the container runtime "docker://24.0.5"`) || !strings.Contains(res.Warnings[0], "CNI_RUNTIME_MAX_VERSION") {
		t.Errorf("cniVersion %s, warnings %q", e.conflistVersion(), res.Warnings)
	}

	// The Node is not there.
	o.NodeName = "node-2"
	res = e.install(o)
	if e.conflistVersion() != FallbackRuntimeCNIVersion || len(res.Warnings) != 1 || !strings.Contains(res.Warnings[0], "reading the Node node-2") {
		t.Errorf("cniVersion %s, warnings %q", e.conflistVersion(), res.Warnings)
	}
}

// TestRuntimeUnreachable: when the API server cannot be asked, the
// conflist says 1.0.0, and a warning says how to set the version, soon.
func TestRuntimeUnreachable(t *testing.T) {
	e := newEnv(t)
	o := e.opts()
	e.writeSource("portmap", fakePlugin("portmap", "v1.9.1", "1.1.0"))
	o.ContainerRuntime, o.APIServer, o.APITimeout = "", "https://127.0.0.1:1", 2*time.Second
	start := time.Now()
	res := e.install(o)
	if took := time.Since(start); took > 4*time.Second {
		t.Errorf("install took %v with the API server down", took)
	}
	if v := e.conflistVersion(); v != "1.0.0" {
		t.Errorf("cniVersion %s with the runtime unknown", v)
	}
	if len(res.Warnings) != 1 || !strings.Contains(res.Warnings[0], "cannot tell which CNI versions the container runtime speaks") ||
		!strings.Contains(res.Warnings[0], "--runtime-cni-version (CNI_RUNTIME_MAX_VERSION") {
		t.Errorf("warnings: %q", res.Warnings)
	}
	if !strings.Contains(notes(res), "cniVersion 1.0.0: the container runtime (unknown, assumed) speaks CNI up to 1.0.0") {
		t.Errorf("notes:\n%s", notes(res))
	}
	// Set by hand, the API server is not asked.
	o.RuntimeCNIVersion = "1.1.0"
	start = time.Now()
	if res := e.install(o); len(res.Warnings) != 0 || e.conflistVersion() != "1.1.0" {
		t.Errorf("warnings %q, cniVersion %s", res.Warnings, e.conflistVersion())
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("install took %v although the runtime's version was given", took)
	}
}

func pemCert(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}
