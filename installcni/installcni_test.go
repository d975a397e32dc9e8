package installcni

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"golang.org/x/sys/unix"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/tabbynet/tabby/plugin"
)

// env is a temporary host root, an image folder with the plugin binaries
// and a mounted service-account folder.
type env struct {
	t                     *testing.T
	root, src, sa         string
	binDir, confDir       string
	conflist, kubeconfigF string
}

func newEnv(t *testing.T) *env {
	t.Helper()
	base := t.TempDir()
	e := &env{t: t, root: filepath.Join(base, "host"), src: filepath.Join(base, "image"), sa: filepath.Join(base, "sa")}
	e.binDir = filepath.Join(e.root, "opt/cni/bin")
	e.confDir = filepath.Join(e.root, "etc/cni/net.d")
	e.conflist = filepath.Join(e.confDir, DefaultConfName)
	e.kubeconfigF = filepath.Join(e.confDir, DefaultKubeconfigName)
	for _, d := range []string{e.src, e.sa} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	e.writeSource("tabby", []byte("#!/bin/sh\necho tabby v1\n"))
	e.writeSource("tabby-ipam", []byte("#!/bin/sh\necho tabby-ipam v1\n"))
	e.writeSource("loopback", fakePlugin("loopback", "v1.9.1", "1.1.0"))
	e.writeSource("portmap", fakePlugin("portmap", "v1.9.1", "1.0.0"))
	e.write(filepath.Join(e.sa, "token"), []byte("token-one\n"), 0o400)
	e.write(filepath.Join(e.sa, "ca.crt"), testCA(t), 0o400)
	return e
}

func (e *env) write(path string, data []byte, mode os.FileMode) {
	e.t.Helper()
	// A read-only file (the token, the CA) is replaced, as kubelet
	// replaces a projected volume's files: without root it cannot be
	// opened for writing.
	if fi, err := os.Stat(path); err == nil && fi.Mode().Perm()&0o200 == 0 {
		if err := os.Remove(path); err != nil {
			e.t.Fatal(err)
		}
	}
	if err := os.WriteFile(path, data, mode); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) writeSource(name string, data []byte) { e.write(filepath.Join(e.src, name), data, 0o755) }

func (e *env) opts() Options {
	return Options{
		BinSource:        e.src,
		HostRoot:         e.root,
		NodeName:         "node-1",
		Portmap:          true,
		ContainerRuntime: "containerd://2.1.0",
		APIServer:        "https://10.96.0.1:443",
		TokenFile:        filepath.Join(e.sa, "token"),
		CAFile:           filepath.Join(e.sa, "ca.crt"),
	}
}

func (e *env) install(o Options) *Result {
	e.t.Helper()
	res, err := Install(o)
	if err != nil {
		e.t.Fatalf("Install: %v", err)
	}
	return res
}

// fileID is what tells a file that was rewritten from one left alone.
type fileID struct {
	ino   uint64
	mtime time.Time
	mode  os.FileMode
}

// snapshot records every file under the host root.
func (e *env) snapshot() map[string]fileID {
	e.t.Helper()
	out := map[string]fileID{}
	err := filepath.WalkDir(e.root, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		out[path] = fileID{ino: info.Sys().(*syscall.Stat_t).Ino, mtime: info.ModTime(), mode: info.Mode()}
		return nil
	})
	if err != nil {
		e.t.Fatal(err)
	}
	return out
}

func changedPaths(r *Result) []string {
	var out []string
	for _, f := range r.Changed() {
		out = append(out, f.Path)
	}
	return out
}

func testCA(t *testing.T) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test-ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

func sum(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func TestFreshInstall(t *testing.T) {
	e := newEnv(t)
	o := e.opts()
	o.MTU = 1450
	res := e.install(o)

	want := map[string]os.FileMode{
		filepath.Join(e.binDir, "tabby"):      0o755,
		filepath.Join(e.binDir, "tabby-ipam"): 0o755,
		filepath.Join(e.binDir, "loopback"):   0o755,
		filepath.Join(e.binDir, "portmap"):    0o755,
		e.kubeconfigF:                         0o600,
		e.conflist:                            0o600,
	}
	if len(res.Files) != len(want) || len(res.Changed()) != len(want) {
		t.Fatalf("files %v, changed %v; want %d installed", res.Files, changedPaths(res), len(want))
	}
	for _, f := range res.Files {
		if f.OldSHA256 != "" || !strings.Contains(f.String(), "installed") {
			t.Errorf("%s: %q, want a fresh install", f.Path, f)
		}
	}
	// The conflist is written last: when it appears, what it names is there.
	if last := res.Files[len(res.Files)-1]; last.Kind != KindConflist {
		t.Errorf("the last file written is %s, want the conflist", last.Path)
	}
	for path, mode := range want {
		st, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != mode {
			t.Errorf("%s: mode %v, want %v", path, st.Mode().Perm(), mode)
		}
	}
	for _, name := range []string{"tabby", "tabby-ipam", "loopback", "portmap"} {
		got, _ := os.ReadFile(filepath.Join(e.binDir, name))
		src, _ := os.ReadFile(filepath.Join(e.src, name))
		if !bytes.Equal(got, src) {
			t.Errorf("%s differs from the image's", name)
		}
	}
	if res.Warnings != nil {
		t.Errorf("warnings on a clean host: %v", res.Warnings)
	}
	wantNotes := []string{
		"installed loopback v1.9.1 into " + e.binDir + ": the container runtime runs it for every pod",
		"installed portmap v1.9.1 into " + e.binDir + ": the conflist chains it for hostPort",
		"cniVersion 1.0.0: containerd://2.1.0 speaks CNI up to 1.1.0; portmap v1.9.1 speaks up to 1.0.0",
	}
	if strings.Join(res.Notes, "\n") != strings.Join(wantNotes, "\n") {
		t.Errorf("notes:\n%s\nwant:\n%s", strings.Join(res.Notes, "\n"), strings.Join(wantNotes, "\n"))
	}
	if res.CNIVersion != "1.0.0" {
		t.Errorf("Result.CNIVersion %q", res.CNIVersion)
	}

	// The conflist is what the README shows, readable by libcni and by the
	// plugin itself, and names the kubeconfig by its path on the host.
	raw, err := os.ReadFile(e.conflist)
	if err != nil {
		t.Fatal(err)
	}
	list, err := libcni.ConfListFromBytes(raw)
	if err != nil {
		t.Fatalf("libcni cannot read the conflist: %v\n%s", err, raw)
	}
	if list.Name != NetworkName || list.CNIVersion != "1.0.0" || len(list.Plugins) != 2 || // the fake portmap stops at 1.0.0
		list.Plugins[0].Network.Type != "tabby" || list.Plugins[1].Network.Type != "portmap" ||
		!list.Plugins[1].Network.Capabilities["portMappings"] {
		t.Errorf("conflist: %s", raw)
	}
	var conf map[string]any
	if err := json.Unmarshal(list.Plugins[0].Bytes, &conf); err != nil {
		t.Fatal(err)
	}
	conf["name"], conf["cniVersion"] = list.Name, list.CNIVersion // as libcni passes it
	one, _ := json.Marshal(conf)
	pc, err := plugin.LoadConfig(one)
	if err != nil {
		t.Fatalf("the tabby plugin refuses its config: %v\n%s", err, one)
	}
	if pc.Kubeconfig != "/etc/cni/net.d/tabby-kubeconfig" || pc.NodeName != "node-1" || pc.MTU != 1450 || !pc.TabbyIPAM() {
		t.Errorf("plugin config: kubeconfig %q, node %q, mtu %d, ipam %q", pc.Kubeconfig, pc.NodeName, pc.MTU, pc.IPAMType)
	}

	// The kubeconfig carries the token (without its newline), the CA and the server.
	kc, err := clientcmd.LoadFromFile(e.kubeconfigF)
	if err != nil {
		t.Fatalf("the kubeconfig does not load: %v", err)
	}
	rc, err := clientcmd.NewDefaultClientConfig(*kc, nil).ClientConfig()
	if err != nil {
		t.Fatalf("the kubeconfig gives no client config: %v", err)
	}
	ca, _ := os.ReadFile(o.CAFile)
	if rc.Host != "https://10.96.0.1:443" || rc.BearerToken != "token-one" || !bytes.Equal(rc.CAData, ca) {
		t.Errorf("client config: host %q, token %q, %d bytes of CA", rc.Host, rc.BearerToken, len(rc.CAData))
	}
}

// TestAssignIPv6: the dual-stack setting reaches the plugin, which then
// assigns both families; without it the plugin assigns IPv4 only.
func TestAssignIPv6(t *testing.T) {
	for _, v6 := range []bool{false, true} {
		e := newEnv(t)
		o := e.opts()
		o.AssignIPv6 = v6
		e.install(o)
		raw, err := os.ReadFile(e.conflist)
		if err != nil {
			t.Fatal(err)
		}
		list, err := libcni.ConfListFromBytes(raw)
		if err != nil {
			t.Fatal(err)
		}
		var conf map[string]any
		if err := json.Unmarshal(list.Plugins[0].Bytes, &conf); err != nil {
			t.Fatal(err)
		}
		conf["name"], conf["cniVersion"] = list.Name, list.CNIVersion
		one, _ := json.Marshal(conf)
		pc, err := plugin.LoadConfig(one)
		if err != nil {
			t.Fatalf("the tabby plugin refuses its config: %v\n%s", err, one)
		}
		if !pc.IPv4 || pc.IPv6 != v6 {
			t.Errorf("AssignIPv6 %v: the plugin assigns IPv4 %v, IPv6 %v:\n%s", v6, pc.IPv4, pc.IPv6, raw)
		}
	}
}

func TestSecondRunChangesNothing(t *testing.T) {
	e := newEnv(t)
	e.install(e.opts())
	before := e.snapshot()
	time.Sleep(10 * time.Millisecond) // a rewrite would show in the mtime
	res := e.install(e.opts())
	if c := res.Changed(); len(c) != 0 {
		t.Errorf("the second run changed %v", changedPaths(res))
	}
	for _, f := range res.Files {
		if f.OldSHA256 != f.NewSHA256 || !strings.Contains(f.String(), "unchanged") {
			t.Errorf("%s: %q", f.Path, f)
		}
	}
	if after := e.snapshot(); !equalSnapshots(before, after) {
		t.Errorf("files changed on disk:\nbefore %v\nafter  %v", before, after)
	}
}

func equalSnapshots(a, b map[string]fileID) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || !w.mtime.Equal(v.mtime) || w.ino != v.ino || w.mode != v.mode {
			return false
		}
	}
	return true
}

func TestChangedTokenRewritesOnlyKubeconfig(t *testing.T) {
	e := newEnv(t)
	e.install(e.opts())
	before := e.snapshot()
	old, _ := os.ReadFile(e.kubeconfigF)
	e.write(filepath.Join(e.sa, "token"), []byte("token-two"), 0o400)

	res := e.install(e.opts())
	if got := changedPaths(res); len(got) != 1 || got[0] != e.kubeconfigF {
		t.Fatalf("changed %v, want only %s", got, e.kubeconfigF)
	}
	f := res.Changed()[0]
	if f.OldSHA256 != sum(old) || !strings.Contains(f.String(), "updated") {
		t.Errorf("report %q: the old hash should be the old kubeconfig's %s", f, short(sum(old)))
	}
	kc, err := clientcmd.LoadFromFile(e.kubeconfigF)
	if err != nil || kc.AuthInfos["tabby-cni"] == nil || kc.AuthInfos["tabby-cni"].Token != "token-two" {
		t.Errorf("the kubeconfig does not carry the new token (%v)", err)
	}
	after := e.snapshot()
	for path, id := range before {
		if path == e.kubeconfigF {
			if after[path].ino == id.ino {
				t.Errorf("the kubeconfig was rewritten in place, not replaced")
			}
			continue
		}
		if after[path] != id {
			t.Errorf("%s changed on disk", path)
		}
	}
}

func TestChangedBinaryOrModeRewritesOnlyThatFile(t *testing.T) {
	e := newEnv(t)
	e.install(e.opts())
	ipam := filepath.Join(e.binDir, "tabby-ipam")
	e.writeSource("tabby-ipam", []byte("#!/bin/sh\necho tabby-ipam v2\n"))
	res := e.install(e.opts())
	if got := changedPaths(res); len(got) != 1 || got[0] != ipam {
		t.Fatalf("changed %v, want only %s", got, ipam)
	}
	if b, _ := os.ReadFile(ipam); !bytes.Contains(b, []byte("v2")) {
		t.Errorf("tabby-ipam was not updated: %q", b)
	}

	// Someone made the conflist world-readable (CIS wants 0600): the mode is put back.
	if err := os.Chmod(e.conflist, 0o666); err != nil {
		t.Fatal(err)
	}
	res = e.install(e.opts())
	if got := changedPaths(res); len(got) != 1 || got[0] != e.conflist || !strings.Contains(res.Changed()[0].String(), "mode fixed") {
		t.Fatalf("changed %v (%v), want only the conflist's mode", got, res.Changed())
	}
	if st, _ := os.Stat(e.conflist); st.Mode().Perm() != 0o600 {
		t.Errorf("conflist mode %v", st.Mode().Perm())
	}

	// A node name change rewrites the conflist only.
	o := e.opts()
	o.NodeName = "node-2"
	res = e.install(o)
	if got := changedPaths(res); len(got) != 1 || got[0] != e.conflist {
		t.Fatalf("changed %v, want only the conflist", got)
	}
}

// TestBinaryReplacedAtomically: readers opening the installed binary while
// it is being replaced, again and again, see the old or the new content,
// never a part; and a binary that is running can be replaced (an in-place
// write would fail with "text file busy").
func TestBinaryReplacedAtomically(t *testing.T) {
	e := newEnv(t)
	versions := [][]byte{bytes.Repeat([]byte("A"), 4<<20), bytes.Repeat([]byte("B"), 4<<20+1)}
	valid := map[string]bool{sum(versions[0]): true, sum(versions[1]): true}
	e.writeSource("tabby", versions[0])
	e.install(e.opts())
	dst := filepath.Join(e.binDir, "tabby")

	var stop atomic.Bool
	var reads, bad atomic.Int64
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				b, err := os.ReadFile(dst)
				if err != nil {
					bad.Add(1)
					t.Errorf("reading %s during the replacement: %v", dst, err)
					return
				}
				reads.Add(1)
				if !valid[sum(b)] {
					bad.Add(1)
					t.Errorf("a reader saw %d bytes that are neither version", len(b))
					return
				}
			}
		}()
	}
	const rounds = 20
	for i := 1; i <= rounds; i++ {
		e.writeSource("tabby", versions[i%2])
		if res := e.install(e.opts()); len(res.Changed()) != 1 {
			t.Fatalf("round %d changed %v", i, changedPaths(res))
		}
	}
	stop.Store(true)
	wg.Wait()
	if reads.Load() == 0 {
		t.Fatal("no read happened during the replacements")
	}
	t.Logf("%d reads during %d replacements, %d bad", reads.Load(), rounds, bad.Load())

	// Replace a binary while it runs.
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Skipf("no sleep binary to run: %v", err)
	}
	data, err := os.ReadFile(sleep)
	if err != nil {
		t.Fatal(err)
	}
	e.writeSource("tabby", data)
	e.install(e.opts())
	run := exec.Command(dst, "30")
	if err := run.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = run.Process.Kill(); _ = run.Wait() }()
	e.writeSource("tabby", versions[0])
	res, err := Install(e.opts())
	if err != nil {
		t.Fatalf("replacing a running binary: %v", err)
	}
	if len(res.Changed()) != 1 {
		t.Errorf("changed %v", changedPaths(res))
	}
	if b, _ := os.ReadFile(dst); !bytes.Equal(b, versions[0]) {
		t.Errorf("the running binary was not replaced")
	}
}

func TestBadInputsWriteNothing(t *testing.T) {
	cases := []struct {
		name   string
		change func(e *env, o *Options)
		want   string
	}{
		{"missing binary", func(e *env, o *Options) { os.Remove(filepath.Join(e.src, "tabby-ipam")) }, "tabby-ipam is missing from"},
		{"missing source folder", func(e *env, o *Options) { o.BinSource = filepath.Join(e.src, "nope") }, "--bin-source"},
		{"no source folder", func(e *env, o *Options) { o.BinSource = "" }, "--bin-source"},
		{"source is a folder", func(e *env, o *Options) {
			os.Remove(filepath.Join(e.src, "tabby"))
			os.Mkdir(filepath.Join(e.src, "tabby"), 0o755)
		}, "not a regular file"},
		{"no node name", func(e *env, o *Options) { o.NodeName = "" }, "NODE_NAME"},
		{"bad mtu", func(e *env, o *Options) { o.MTU = -1 }, "mtu -1"},
		{"bad log level", func(e *env, o *Options) { o.CNILogLevel = "loud" }, "log level"},
		{"bad log format", func(e *env, o *Options) { o.CNILogFormat = "xml" }, `CNI log format "xml" is not known: use text or json`},
		{"bad conf name", func(e *env, o *Options) { o.ConfName = "10-tabby.conf" }, ".conflist"},
		{"no token", func(e *env, o *Options) { os.Remove(o.TokenFile) }, "service-account token"},
		{"empty token", func(e *env, o *Options) { e.write(o.TokenFile, []byte("\n"), 0o400) }, "is empty"},
		{"bad CA", func(e *env, o *Options) { e.write(o.CAFile, []byte("not a cert"), 0o400) }, "no PEM certificate"},
		{"no apiserver", func(e *env, o *Options) { o.APIServer = "" }, "KUBERNETES_SERVICE_HOST"},
		{"plain http apiserver", func(e *env, o *Options) { o.APIServer = "http://10.96.0.1:80" }, "not an https URL"},
		{"no loopback anywhere", func(e *env, o *Options) { os.Remove(filepath.Join(e.src, "loopback")) },
			"loopback is neither in the image"},
		{"no portmap anywhere", func(e *env, o *Options) { os.Remove(filepath.Join(e.src, "portmap")) }, "--portmap=false"},
		{"bad reference plugin name", func(e *env, o *Options) { o.ReferencePlugins = []string{"../loopback"} }, "plain file name"},
		{"reference plugin is ours", func(e *env, o *Options) { o.ReferencePlugins = []string{"tabby"} }, "name it once"},
		{"bad runtime CNI version", func(e *env, o *Options) { o.RuntimeCNIVersion = "1.0" }, "not a version such as 1.0.0"},
		{"ancient runtime CNI version", func(e *env, o *Options) { o.RuntimeCNIVersion = "0.2.0" }, "older than any tabby speaks"},
		{"image portmap mute", func(e *env, o *Options) { e.writeSource("portmap", []byte("#!/bin/sh\nexit 3\n")) },
			"asking the image's portmap"},
		{"no common version", func(e *env, o *Options) {
			e.writeSource("portmap", []byte("#!/bin/sh\necho '{\"cniVersion\":\"0.2.0\",\"supportedVersions\":[\"0.1.0\",\"0.2.0\"]}'\n"))
		}, "no CNI version that tabby"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t)
			o := e.opts()
			c.change(e, &o)
			res, err := Install(o)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want one saying %q", err, c.want)
			}
			if res != nil {
				t.Errorf("a result %v with an error on bad input", res)
			}
			if _, err := os.Stat(e.root); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("bad input touched the host root (%v)", err)
			}
		})
	}
}

func TestUnwritableTargets(t *testing.T) {
	t.Run("file where the bin dir belongs", func(t *testing.T) {
		e := newEnv(t)
		os.MkdirAll(filepath.Dir(e.binDir), 0o755)
		e.write(e.binDir, []byte("x"), 0o644)
		_, err := Install(e.opts())
		if err == nil || !strings.Contains(err.Error(), e.binDir) || !strings.Contains(err.Error(), "mounted") {
			t.Fatalf("error %v, want one naming %s", err, e.binDir)
		}
	})
	t.Run("folder where the conflist belongs", func(t *testing.T) {
		e := newEnv(t)
		os.MkdirAll(e.conflist, 0o755)
		_, err := Install(e.opts())
		if err == nil || !strings.Contains(err.Error(), "is a folder where a file belongs") {
			t.Fatalf("error %v", err)
		}
	})
	t.Run("read-only bin dir", func(t *testing.T) {
		e := newEnv(t)
		if err := os.MkdirAll(e.binDir, 0o755); err != nil {
			t.Fatal(err)
		}
		if os.Geteuid() == 0 {
			// Root ignores permission bits: make the folder a read-only mount,
			// as a hostPath mounted readOnly would be.
			if err := unix.Mount("tmpfs", e.binDir, "tmpfs", unix.MS_RDONLY, "size=1m"); err != nil {
				t.Skipf("cannot mount a read-only tmpfs to test with: %v", err)
			}
			t.Cleanup(func() { _ = unix.Unmount(e.binDir, 0) })
		} else if err := os.Chmod(e.binDir, 0o555); err != nil {
			t.Fatal(err)
		}
		res, err := Install(e.opts())
		if err == nil || !strings.Contains(err.Error(), "writing into "+e.binDir) || !strings.Contains(err.Error(), "read-write") {
			t.Fatalf("error %v, want one saying %s is not writable", err, e.binDir)
		}
		if res == nil || len(res.Files) != 0 {
			t.Errorf("result %v", res)
		}
		if _, err := os.Stat(e.conflist); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the conflist was written although the binaries were not installed")
		}
	})
}

func TestWarnings(t *testing.T) {
	e := newEnv(t)
	os.MkdirAll(e.confDir, 0o755)
	e.write(filepath.Join(e.confDir, "05-other.conflist"), []byte("{}"), 0o644)
	e.write(filepath.Join(e.confDir, "99-later.conf"), []byte("{}"), 0o644)
	// The node's reference plugins are left to the node, which has none.
	o := e.opts()
	o.ReferencePlugins = []string{}
	res := e.install(o)
	if len(res.Warnings) != 3 ||
		!strings.Contains(res.Warnings[0], "05-other.conflist") || strings.Contains(res.Warnings[0], "99-later") ||
		!strings.Contains(res.Warnings[1], "no loopback binary") || !strings.Contains(res.Warnings[1], "runs it for every pod") ||
		!strings.Contains(res.Warnings[2], "no portmap binary") {
		t.Errorf("warnings %q", res.Warnings)
	}
	if _, err := os.Stat(filepath.Join(e.binDir, "loopback")); err == nil {
		t.Errorf("loopback was installed although no reference plugin was asked for")
	}
	o.Portmap = false
	os.Remove(filepath.Join(e.confDir, "05-other.conflist"))
	o.ReferencePlugins = nil
	if res := e.install(o); len(res.Warnings) != 0 {
		t.Errorf("warnings without portmap and other configs: %q", res.Warnings)
	}
	if b, _ := os.ReadFile(e.conflist); bytes.Contains(b, []byte("portmap")) {
		t.Errorf("the conflist chains portmap although --portmap=false: %s", b)
	}
	if _, err := os.Stat(filepath.Join(e.binDir, "loopback")); err != nil {
		t.Errorf("loopback was not installed: %v", err)
	}
	if _, err := os.Stat(filepath.Join(e.binDir, "portmap")); err == nil {
		t.Errorf("portmap was installed although the conflist does not chain it")
	}
}

func TestLeftoverTempFilesRemoved(t *testing.T) {
	e := newEnv(t)
	os.MkdirAll(e.binDir, 0o755)
	old := filepath.Join(e.binDir, tmpPrefix+"tabby-123")
	young := filepath.Join(e.binDir, tmpPrefix+"tabby-456")
	e.write(old, []byte("half"), 0o600)
	e.write(young, []byte("half"), 0o600)
	past := time.Now().Add(-time.Hour)
	if err := os.Chtimes(old, past, past); err != nil {
		t.Fatal(err)
	}
	e.install(e.opts())
	if _, err := os.Stat(old); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a temporary file left by a dead run is still there")
	}
	if _, err := os.Stat(young); err != nil {
		t.Errorf("a temporary file that may belong to a running install was removed")
	}
}

func TestHostPathsAreNotLocalPaths(t *testing.T) {
	// In the DaemonSet the files are written under /host but the conflist
	// names the kubeconfig as the runtime sees it.
	e := newEnv(t)
	o := e.opts()
	o.HostRoot = ""
	o.CNIBinDir = e.binDir
	o.CNIConfDir = e.confDir
	o.HostCNIConfDir = "/var/lib/rancher/k3s/agent/etc/cni/net.d"
	e.install(o)
	b, _ := os.ReadFile(e.conflist)
	if !bytes.Contains(b, []byte(`"kubeconfig": "/var/lib/rancher/k3s/agent/etc/cni/net.d/tabby-kubeconfig"`)) {
		t.Errorf("conflist: %s", b)
	}
}

// fakePlugin is a reference plugin that says it is version build when run
// without CNI_COMMAND ("" says "version unknown", as Debian's do), and
// answers CNI VERSION with the versions from 0.3.0 up to newest.
func fakePlugin(name, build, newest string) []byte {
	all := []string{"0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"}
	var vs []string
	for _, v := range all {
		vs = append(vs, `"`+v+`"`)
		if v == newest {
			break
		}
	}
	if build == "" {
		build = "version unknown"
	}
	return []byte(fmt.Sprintf(`#!/bin/sh
if [ "$CNI_COMMAND" = VERSION ]; then
	echo '{"cniVersion":"%s","supportedVersions":[%s]}'
	exit 0
fi
echo 'CNI %s plugin %s' >&2
echo 'CNI protocol versions supported: ...' >&2
`, newest, strings.Join(vs, ","), name, build))
}

// conflistVersion is the cniVersion of the conflist written.
func (e *env) conflistVersion() string {
	e.t.Helper()
	var l struct {
		CNIVersion string `json:"cniVersion"`
	}
	if err := json.Unmarshal(mustRead(e.t, e.conflist), &l); err != nil {
		e.t.Fatal(err)
	}
	return l.CNIVersion
}

// TestConflistVersionFitsPortmapAndRuntime: the conflist speaks the newest
// CNI version that tabby, the container runtime and every chained plugin
// speak; a runtime refuses a list one of whose plugins cannot speak its
// version, and containerd 1.6/1.7 refuse every result newer than 1.0.0.
func TestConflistVersionFitsPortmapAndRuntime(t *testing.T) {
	cases := []struct {
		name     string
		runtime  string // ContainerRuntime
		limit    string // RuntimeCNIVersion
		portmap  string // newest version the image's portmap speaks; "": not chained
		want     string
		wantNote string
	}{
		{"containerd 2, old portmap", "containerd://2.1.0", "", "1.0.0", "1.0.0", "portmap v1.9.1 speaks up to 1.0.0"},
		{"containerd 2, new portmap", "containerd://2.1.0", "", "1.1.0", "1.1.0", "containerd://2.1.0 speaks CNI up to 1.1.0; portmap v1.9.1 speaks up to 1.1.0"},
		{"containerd 1.6, new portmap", "containerd://1.6.20", "", "1.1.0", "1.0.0", "cniVersion 1.0.0: containerd://1.6.20 speaks CNI up to 1.0.0; portmap v1.9.1 speaks up to 1.1.0"},
		{"containerd 1.7 without portmap", "containerd://1.7.27", "", "", "1.0.0", "cniVersion 1.0.0: containerd://1.7.27 speaks CNI up to 1.0.0"},
		{"containerd 2 without portmap", "containerd://2.0.0", "", "", "1.1.0", "cniVersion 1.1.0: containerd://2.0.0 speaks CNI up to 1.1.0"},
		{"cri-o 1.30", "cri-o://1.30.4", "", "1.1.0", "1.0.0", "cri-o://1.30.4 speaks CNI up to 1.0.0"},
		{"set by hand wins", "containerd://2.1.0", "0.4.0", "1.1.0", "0.4.0", "the container runtime (as configured"},
		{"a newer runtime than tabby", "", "1.2.0", "", "1.1.0", "cniVersion 1.1.0"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t)
			o := e.opts()
			o.ContainerRuntime, o.RuntimeCNIVersion = c.runtime, c.limit
			if c.portmap == "" {
				o.Portmap = false
			} else {
				e.writeSource("portmap", fakePlugin("portmap", "v1.9.1", c.portmap))
			}
			res := e.install(o)
			if v := e.conflistVersion(); v != c.want || res.CNIVersion != v {
				t.Errorf("cniVersion %s (Result %s), want %s", v, res.CNIVersion, c.want)
			}
			if !strings.Contains(strings.Join(res.Notes, "\n"), c.wantNote) {
				t.Errorf("notes lack %q:\n%s", c.wantNote, strings.Join(res.Notes, "\n"))
			}
			if len(res.Warnings) != 0 {
				t.Errorf("warnings: %q", res.Warnings)
			}
			if got := bytes.Contains(mustRead(t, e.conflist), []byte(`"type": "portmap"`)); got != (c.portmap != "") {
				t.Errorf("portmap chained: %v, want %v", got, c.portmap != "")
			}
		})
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestAgentSocket: --agent-socket lands in the conflist for the plugin, and
// a relative path is refused before anything is written.
func TestAgentSocket(t *testing.T) {
	e := newEnv(t)
	o := e.opts()
	o.AgentSocket = "/run/tabby-lab/node1/cni.sock"
	e.install(o)
	if b := mustRead(t, e.conflist); !bytes.Contains(b, []byte(`"agentSocket": "/run/tabby-lab/node1/cni.sock"`)) {
		t.Errorf("conflist lacks the agent socket:\n%s", b)
	}
	o.AgentSocket = "cni.sock"
	if _, err := Install(o); err == nil || !strings.Contains(err.Error(), "must be an absolute path") {
		t.Errorf("relative socket: %v", err)
	}
	o.AgentSocket = ""
	e.install(o)
	if b := mustRead(t, e.conflist); bytes.Contains(b, []byte("agentSocket")) {
		t.Errorf("without --agent-socket the plugin's default should apply:\n%s", b)
	}
}
