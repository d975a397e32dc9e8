package main

import (
	"bytes"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/tabbynet/tabby/contract"
	"github.com/tabbynet/tabby/deploy"
)

// TestTabbyYAMLIsCurrent fails while deploy/tabby.yaml differs from what
// its sources render.
func TestTabbyYAMLIsCurrent(t *testing.T) {
	want, err := deploy.Render("..", deploy.RenderOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile("../tabby.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("deploy/tabby.yaml is stale: run go generate ./deploy (it is built from deploy/base, deploy/crds and deploy/policies)")
	}
}

func TestManifestObjects(t *testing.T) {
	data, err := os.ReadFile("../tabby.yaml")
	if err != nil {
		t.Fatal(err)
	}
	objs, err := deploy.Objects(data)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	var order []string
	for _, o := range objs {
		id := o.GetKind() + "/" + o.GetNamespace() + "/" + o.GetName()
		if seen[id] {
			t.Errorf("%s appears twice", id)
		}
		seen[id] = true
		order = append(order, o.GetKind())
		// The programs' --namespace defaults are contract.DefaultNamespace.
		if o.GetNamespace() != "" && o.GetNamespace() != contract.DefaultNamespace {
			t.Errorf("%s is outside %s, the namespace tabby's programs default to", id, contract.DefaultNamespace)
		}
	}
	for _, id := range []string{
		"Namespace//tabby-system", "CustomResourceDefinition//ippools.tabby.io",
		"ValidatingAdmissionPolicy//tabby-ippool-no-overlap",
		"ServiceAccount/tabby-system/tabby-cni", "ServiceAccount/tabby-system/tabby-node",
		"ValidatingAdmissionPolicy//tabby-node-own-node", "ValidatingAdmissionPolicy//tabby-node-own-leases",
		"DaemonSet/tabby-system/tabby-node",
	} {
		if !seen[id] {
			t.Errorf("tabby.yaml lacks %s", id)
		}
	}
	// kubectl applies in file order: what others depend on comes first.
	first := func(kind string) int {
		for i, k := range order {
			if k == kind {
				return i
			}
		}
		return -1
	}
	for _, dep := range [][2]string{
		{"Namespace", "ServiceAccount"}, {"CustomResourceDefinition", "ValidatingAdmissionPolicy"},
		{"ServiceAccount", "DaemonSet"}, {"ClusterRoleBinding", "DaemonSet"}, {"ValidatingAdmissionPolicy", "DaemonSet"},
	} {
		if first(dep[0]) > first(dep[1]) {
			t.Errorf("%s comes after %s", dep[0], dep[1])
		}
	}
}

func TestRenderOptions(t *testing.T) {
	out, err := deploy.Render("..", deploy.RenderOptions{Image: "registry.example/tabby:v1.2.3", PodCIDR: "10.42.0.0/16"})
	if err != nil {
		t.Fatal(err)
	}
	s := string(out)
	if strings.Contains(s, deploy.DefaultImage) || strings.Count(s, "image: registry.example/tabby:v1.2.3") != 2 {
		t.Errorf("the image is not replaced in both containers")
	}
	// tabbyd's --default-ipv4-pool-cidr=$(DEFAULT_IPV4_POOL_CIDR).
	if strings.Contains(s, "value: "+deploy.DefaultPodCIDR) || !strings.Contains(s, "- name: DEFAULT_IPV4_POOL_CIDR\n          value: 10.42.0.0/16\n") {
		t.Errorf("the pod CIDR is not replaced")
	}
	if _, err := deploy.Render("..", deploy.RenderOptions{PodCIDR: "10.42.1.0/16"}); err == nil || !strings.Contains(err.Error(), "CIDR notation") {
		t.Errorf("a CIDR with host bits: %v", err)
	}
	// The IPv6 pool's: none by default, set by PodCIDRv6.
	if !strings.Contains(s, "- --default-ipv6-pool-cidr=$(DEFAULT_IPV6_POOL_CIDR)\n") || !strings.Contains(s, "- name: DEFAULT_IPV6_POOL_CIDR\n          value: \"\"\n") {
		t.Errorf("tabbyd's --default-ipv6-pool-cidr is not empty by default")
	}
	out, err = deploy.Render("..", deploy.RenderOptions{PodCIDRv6: "fd00:42::/56"})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(out), "- name: DEFAULT_IPV6_POOL_CIDR\n          value: fd00:42::/56\n") {
		t.Errorf("the IPv6 pod CIDR is not set")
	}
	for _, bad := range []deploy.RenderOptions{{PodCIDRv6: "10.42.0.0/16"}, {PodCIDR: "fd00:42::/56"}, {PodCIDRv6: "fd00:42::1/56"}} {
		if _, err := deploy.Render("..", bad); err == nil || !strings.Contains(err.Error(), "CIDR notation") {
			t.Errorf("%+v: %v, want an error", bad, err)
		}
	}
}

// workload finds the one object of kind and name in a manifest and
// converts it into obj.
func workload(t *testing.T, manifest []byte, kind, name string, obj any) {
	t.Helper()
	objs, err := deploy.Objects(manifest)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, obj); err != nil {
				t.Fatal(err)
			}
			return
		}
	}
	t.Fatalf("no %s %s in the manifest", kind, name)
}

func envOf(c corev1.Container) map[string]string {
	m := map[string]string{}
	for _, e := range c.Env {
		if e.ValueFrom == nil {
			m[e.Name] = e.Value
		} else {
			m[e.Name] = "(from " + e.ValueFrom.FieldRef.FieldPath + ")"
		}
	}
	return m
}

func daemonSet(t *testing.T, manifest []byte) *appsv1.DaemonSet {
	t.Helper()
	ds := &appsv1.DaemonSet{}
	workload(t, manifest, "DaemonSet", "tabby-node", ds)
	if len(ds.Spec.Template.Spec.InitContainers) != 1 || len(ds.Spec.Template.Spec.Containers) != 1 {
		t.Fatalf("containers: %d init, %d", len(ds.Spec.Template.Spec.InitContainers), len(ds.Spec.Template.Spec.Containers))
	}
	return ds
}

// TestRenderClusterOptions: the API server's address reaches both of
// tabby-node's containers as the variables their in-cluster config reads,
// the runtime's CNI version reaches install-cni, and the default manifest
// sets neither.
func TestRenderClusterOptions(t *testing.T) {
	def, err := deploy.Render("..", deploy.RenderOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ds := daemonSet(t, def)
	install, tabbyd := ds.Spec.Template.Spec.InitContainers[0], ds.Spec.Template.Spec.Containers[0]
	// Their node and namespace from the downward API, and tabbyd's pool.
	installEnv := map[string]string{"NODE_NAME": "(from spec.nodeName)", "POD_NAMESPACE": "(from metadata.namespace)"}
	tabbydEnv := map[string]string{"NODE_NAME": "(from spec.nodeName)", "POD_NAMESPACE": "(from metadata.namespace)", "DEFAULT_IPV4_POOL_CIDR": deploy.DefaultPodCIDR, "DEFAULT_IPV6_POOL_CIDR": "", "DENIED_LOG": "false"}
	if e := envOf(install); !equalMaps(e, installEnv) {
		t.Errorf("install-cni's env in the default manifest: %v, want %v", e, installEnv)
	}
	if e := envOf(tabbyd); !equalMaps(e, tabbydEnv) {
		t.Errorf("tabbyd's env in the default manifest: %v, want %v", e, tabbydEnv)
	}

	out, err := deploy.Render("..", deploy.RenderOptions{Image: "registry.example/tabby:v2", APIServer: "https://192.0.2.10:6443", RuntimeCNIVersion: "1.0.0"})
	if err != nil {
		t.Fatal(err)
	}
	ds = daemonSet(t, out)
	install, tabbyd = ds.Spec.Template.Spec.InitContainers[0], ds.Spec.Template.Spec.Containers[0]
	apiEnv := map[string]string{"KUBERNETES_SERVICE_HOST": "192.0.2.10", "KUBERNETES_SERVICE_PORT": "6443"}
	want := map[string]string{}
	maps.Copy(want, tabbydEnv)
	maps.Copy(want, apiEnv)
	if e := envOf(tabbyd); !equalMaps(e, want) {
		t.Errorf("tabbyd's env: %v, want %v", e, want)
	}
	want = map[string]string{"CNI_RUNTIME_MAX_VERSION": "1.0.0"}
	maps.Copy(want, installEnv)
	maps.Copy(want, apiEnv)
	if e := envOf(install); !equalMaps(e, want) {
		t.Errorf("install-cni's env: %v, want %v", e, want)
	}
	for _, c := range []corev1.Container{install, tabbyd} {
		if c.Image != "registry.example/tabby:v2" {
			t.Errorf("%s's image %s", c.Name, c.Image)
		}
	}
	// Everything else is as the default has it.
	rest := strings.NewReplacer("registry.example/tabby:v2", deploy.DefaultImage).Replace(string(out))
	rest = regexp.MustCompile(`(?m)^ *- name: (KUBERNETES_SERVICE_HOST|KUBERNETES_SERVICE_PORT|CNI_RUNTIME_MAX_VERSION)\n *value: .*\n`).ReplaceAllString(rest, "")
	if rest != string(def) {
		t.Errorf("rendering with options changed more than the image and the env")
	}

	// IPv6, and the runtime's version alone.
	out, err = deploy.Render("..", deploy.RenderOptions{APIServer: "[2001:db8::10]:443"})
	if err != nil {
		t.Fatal(err)
	}
	if e := envOf(daemonSet(t, out).Spec.Template.Spec.InitContainers[0]); e["KUBERNETES_SERVICE_HOST"] != "2001:db8::10" || e["KUBERNETES_SERVICE_PORT"] != "443" || e["CNI_RUNTIME_MAX_VERSION"] != "" {
		t.Errorf("install-cni's env: %v", e)
	}
	out, err = deploy.Render("..", deploy.RenderOptions{RuntimeCNIVersion: "1.1.0"})
	if err != nil {
		t.Fatal(err)
	}
	ds = daemonSet(t, out)
	if e := envOf(ds.Spec.Template.Spec.InitContainers[0]); len(e) != len(installEnv)+1 || e["CNI_RUNTIME_MAX_VERSION"] != "1.1.0" {
		t.Errorf("install-cni's env: %v", e)
	}
	if e := envOf(ds.Spec.Template.Spec.Containers[0]); !equalMaps(e, tabbydEnv) {
		t.Errorf("tabbyd's env: %v", e)
	}

	for _, bad := range []struct {
		opts deploy.RenderOptions
		want string
	}{
		{deploy.RenderOptions{APIServer: "192.0.2.10"}, "HOST:PORT"},
		{deploy.RenderOptions{APIServer: "192.0.2.10:0"}, "HOST:PORT"},
		{deploy.RenderOptions{APIServer: ":6443"}, "HOST:PORT"},
		{deploy.RenderOptions{APIServer: "https://192.0.2.10:6443/path"}, "HOST:PORT"},
		{deploy.RenderOptions{RuntimeCNIVersion: "1.0"}, "not a version such as 1.0.0"},
	} {
		if _, err := deploy.Render("..", bad.opts); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%+v: %v, want %q", bad.opts, err, bad.want)
		}
	}
}

func equalMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// TestRenderExtender: the extender's manifest takes the image and the API
// server's address; without options it is the file as users apply it.
func TestRenderExtender(t *testing.T) {
	def, err := deploy.RenderExtender("..", deploy.RenderOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if file, _ := os.ReadFile(filepath.Join("..", deploy.ExtenderManifest)); !bytes.Equal(def, file) {
		t.Error("RenderExtender without options differs from the file")
	}
	out, err := deploy.RenderExtender("..", deploy.RenderOptions{Image: "registry.example/tabby:v2", APIServer: "192.0.2.10:6443"})
	if err != nil {
		t.Fatal(err)
	}
	d := &appsv1.Deployment{}
	workload(t, out, "Deployment", "tabby-scheduler-extender", d)
	c := d.Spec.Template.Spec.Containers[0]
	if c.Image != "registry.example/tabby:v2" || !equalMaps(envOf(c), map[string]string{"KUBERNETES_SERVICE_HOST": "192.0.2.10", "KUBERNETES_SERVICE_PORT": "6443"}) {
		t.Errorf("extender: image %s, env %v", c.Image, envOf(c))
	}
	if _, err := deploy.RenderExtender("..", deploy.RenderOptions{PodCIDR: "10.42.0.0/16"}); err == nil {
		t.Error("a pod CIDR for the extender was taken")
	}
}

// TestGenExtender runs the command as the README says, into a file.
func TestGenExtender(t *testing.T) {
	out := filepath.Join(t.TempDir(), "extender.yaml")
	if err := run("..", out, true, deploy.RenderOptions{Image: "registry.example/tabby:v3"}); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(out); !bytes.Contains(b, []byte("image: registry.example/tabby:v3")) {
		t.Errorf("gen -extender wrote:\n%s", b)
	}
	if err := run("..", out, true, deploy.RenderOptions{RuntimeCNIVersion: "1.0.0"}); err == nil {
		t.Error("gen -extender -runtime-cni-version was taken")
	}
}

// TestProbes: tabby-node is Ready as soon as tabbyd is: a startup probe
// asks /readyz every second (kubelet then runs the readiness probe at
// once), for long enough that a slow API server does not restart it; the
// readiness probe keeps its period. Every probe asks 127.0.0.1, where
// tabbyd's --health-listen is (with hostNetwork the kubelet would dial the
// node's address otherwise).
func TestProbes(t *testing.T) {
	data, err := os.ReadFile("../tabby.yaml")
	if err != nil {
		t.Fatal(err)
	}
	c := daemonSet(t, data).Spec.Template.Spec.Containers[0]
	s, r, l := c.StartupProbe, c.ReadinessProbe, c.LivenessProbe
	if s == nil || r == nil || l == nil {
		t.Fatalf("probes: startup %v, readiness %v, liveness %v", s, r, l)
	}
	if s.HTTPGet == nil || s.HTTPGet.Path != "/readyz" || s.PeriodSeconds != 1 || s.InitialDelaySeconds != 0 ||
		s.PeriodSeconds*s.FailureThreshold < 300 {
		t.Errorf("startup probe %+v: want /readyz every second for at least 5 minutes", s)
	}
	if r.HTTPGet == nil || r.HTTPGet.Path != "/readyz" || r.PeriodSeconds < 10 || r.InitialDelaySeconds != 0 {
		t.Errorf("readiness probe %+v", r)
	}
	if l.HTTPGet == nil || l.HTTPGet.Path != "/healthz" {
		t.Errorf("liveness probe %+v", l)
	}
	listen := ""
	for _, a := range c.Args {
		if v, ok := strings.CutPrefix(a, "--health-listen="); ok {
			listen = v
		}
	}
	if listen != "127.0.0.1:9099" {
		t.Errorf("tabbyd --health-listen=%q, want 127.0.0.1:9099 (the loopback only)", listen)
	}
	for name, p := range map[string]*corev1.Probe{"startup": s, "readiness": r, "liveness": l} {
		if p.HTTPGet == nil || p.HTTPGet.Host+":"+p.HTTPGet.Port.String() != listen {
			t.Errorf("the %s probe asks %+v, not tabbyd's --health-listen %s", name, p.HTTPGet, listen)
		}
	}
}

// TestImage checks deploy/Dockerfile as far as it can be without Docker:
// it builds every program of cmd/ and the reference plugins (with the
// script that builds them), into the folder the manifests run them from,
// on a Go image new enough for go.mod, and installs its Debian packages
// from the one PACKAGES line, which parses.
func TestImage(t *testing.T) {
	df, err := os.ReadFile("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(df, deploy.Dockerfile) {
		t.Fatal("deploy.Dockerfile is not deploy/Dockerfile")
	}
	pkgs, err := deploy.ImagePackages()
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"iptables", "ipset", "iproute2", "kmod", "coreutils"}; !slices.Equal(pkgs, want) {
		t.Errorf("packages %v, want %v", pkgs, want)
	}
	text := string(df)
	for _, want := range []string{
		"apt-get install -y --no-install-recommends ${PACKAGES}",
		"COPY --from=build /out/ " + deploy.ImageBinDir + "/\n",
		"sh hack/build-cni-plugins.sh /out",
		"\nFROM debian:bookworm-slim\n",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("the Dockerfile lacks %q", want)
		}
	}
	if _, err := deploy.ParseImagePackages([]byte(text + "ARG PACKAGES=\"curl\"\n")); err == nil {
		t.Error("two PACKAGES lines parse")
	}

	// Every program of cmd/ is built, and is one of ImagePrograms.
	cmds, err := os.ReadDir("../../cmd")
	if err != nil {
		t.Fatal(err)
	}
	build := regexp.MustCompile(`(?s)go build .*?-o /out/ ([^\n]*)`).FindStringSubmatch(text)
	if build == nil {
		t.Fatal("no go build -o /out/ in the Dockerfile")
	}
	built := strings.Fields(strings.TrimSuffix(strings.TrimSpace(build[1]), "\\"))
	// With the Makefile's build tags (see BUILD_TAGS there).
	mk, err := os.ReadFile("../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	tags := regexp.MustCompile(`(?m)^BUILD_TAGS := (.*)$`).FindSubmatch(mk)
	if tags == nil {
		t.Fatal("the Makefile has no line BUILD_TAGS := ...")
	}
	if want := "go build -trimpath -tags " + string(tags[1]) + " "; !strings.Contains(text, want) {
		t.Errorf("the Dockerfile does not build with the Makefile's BUILD_TAGS: it lacks %q", want)
	}
	var names []string
	for _, c := range cmds {
		if !c.IsDir() {
			continue
		}
		names = append(names, c.Name())
		if !slices.Contains(built, "./cmd/"+c.Name()) {
			t.Errorf("the Dockerfile does not build ./cmd/%s (it builds %v)", c.Name(), built)
		}
	}
	if want := append(slices.Clone(names), "loopback", "portmap"); !sameSet(want, deploy.ImagePrograms) {
		t.Errorf("ImagePrograms %v, want %v", deploy.ImagePrograms, want)
	}

	// The Go image is new enough for go.mod.
	gomod, err := os.ReadFile("../../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	goVersion := regexp.MustCompile(`(?m)^go (\d+)\.(\d+)`).FindStringSubmatch(string(gomod))
	image := regexp.MustCompile(`(?m)^FROM golang:(\d+)\.(\d+)\S* AS build$`).FindStringSubmatch(text)
	if goVersion == nil || image == nil || atoi(image[1])*1000+atoi(image[2]) < atoi(goVersion[1])*1000+atoi(goVersion[2]) {
		t.Errorf("the build image %v is older than go.mod's go %v", image, goVersion)
	}

	// The manifests run programs the image has.
	tabby, _ := os.ReadFile("../tabby.yaml")
	ext, _ := os.ReadFile("../" + deploy.ExtenderManifest)
	ds := daemonSet(t, tabby)
	d := &appsv1.Deployment{}
	workload(t, ext, "Deployment", "tabby-scheduler-extender", d)
	for _, c := range append(append(ds.Spec.Template.Spec.InitContainers, ds.Spec.Template.Spec.Containers...), d.Spec.Template.Spec.Containers...) {
		dir, prog := filepath.Split(c.Command[0])
		if filepath.Clean(dir) != deploy.ImageBinDir || !slices.Contains(deploy.ImagePrograms, prog) {
			t.Errorf("%s runs %s, which the image does not have", c.Name, c.Command[0])
		}
	}
}

func sameSet(a, b []string) bool {
	return slices.Equal(slices.Sorted(slices.Values(a)), slices.Sorted(slices.Values(b)))
}

func atoi(s string) int {
	n := 0
	for _, r := range s {
		n = n*10 + int(r-'0')
	}
	return n
}

// TestBuildCNIPlugins runs hack/build-cni-plugins.sh as the Dockerfile
// does: it prints nothing, and builds static loopback and portmap that say
// go.mod's version of github.com/containernetworking/plugins.
func TestBuildCNIPlugins(t *testing.T) {
	out := t.TempDir()
	cmd := exec.Command("../../hack/build-cni-plugins.sh", filepath.Join(out, "bin"))
	b, err := cmd.CombinedOutput()
	if err != nil || len(b) != 0 {
		t.Fatalf("hack/build-cni-plugins.sh: %v, output:\n%s", err, b)
	}
	mod, err := exec.Command("go", "list", "-m", "-f", "{{.Version}}", "github.com/containernetworking/plugins").Output()
	if err != nil {
		t.Fatal(err)
	}
	version := strings.TrimSpace(string(mod))
	for _, name := range []string{"loopback", "portmap"} {
		var said bytes.Buffer
		c := exec.Command(filepath.Join(out, "bin", name))
		c.Env = []string{}
		c.Stdout, c.Stderr = &said, &said
		_ = c.Run()
		if want := "CNI " + name + " plugin " + version; !strings.Contains(said.String(), want) {
			t.Errorf("%s says %q, want %q", name, said.String(), want)
		}
		if elf, err := os.ReadFile(filepath.Join(out, "bin", name)); err != nil || bytes.Contains(elf, []byte("/lib64/ld-linux")) {
			t.Errorf("%s is not static (%v)", name, err)
		}
	}
	if err := exec.Command("../../hack/build-cni-plugins.sh").Run(); err == nil {
		t.Error("the script ran without OUTDIR")
	}
}
