package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/client-go/tools/clientcmd"
)

// testCA is a self-signed certificate (no key kept) standing for a cluster CA.
const testCA = `-----BEGIN CERTIFICATE-----
MIIBjTCCATOgAwIBAgIUUTrirPfvA4AieT2wmTEK9UUV0NowCgYIKoZIzj0EAwIw
GzEZMBcGA1UEAwwQdGFiYnljdGwtdGVzdC1jYTAgFw0yNjExMjkxODU4MThaGA8y
MTI2MTEwNTE4NTgxOFowGzEZMBcGA1UEAwwQdGFiYnljdGwtdGVzdC1jYTBZMBMG
ByqGSM49AgEGCCqGSM49AwEHA0IABHcWF6UIXjVWfp7CEg0+TN/lwv7NjH5hsMUP
YyAQvULZ4/cYbds+ES7DJwINrFF8um8Op9R72++bZ3UINTJWh0ajUzBRMB0GA1Ud
DgQWBBQQ/BAKNDjBEPdqoaFe3xJUgyCp7TAfBgNVHSMEGDAWgBQQ/BAKNDjBEPdq
oaFe3xJUgyCp7TAPBgNVHRMBAf8EBTADAQH/MAoGCCqGSM49BAMCA0gAMEUCIDcd
WpDwgcEZ3ttLv6L7v2lLnpaozYbIXxhIE9m8mkzNAiEAzcuHJ95ur22AKPgNvG2Z
cN1rka0GofnmvL7RQDGIT4E=
-----END CERTIFICATE-----
`

// TestInstallCNICommand runs the command as the DaemonSet's init container
// does: node name and API server from the pod's environment.
func TestInstallCNICommand(t *testing.T) {
	dir := t.TempDir()
	src, host := filepath.Join(dir, "image"), filepath.Join(dir, "host")
	write := func(path, data string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(data), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, b := range []string{"tabby", "tabby-ipam"} {
		write(filepath.Join(src, b), "#!/bin/sh\n")
	}
	// The reference plugins say their version when run without CNI_COMMAND,
	// and answer CNI VERSION, which install-cni asks to pick the conflist's version.
	for _, b := range []string{"loopback", "portmap"} {
		write(filepath.Join(src, b), "#!/bin/sh\n"+
			"[ \"$CNI_COMMAND\" = VERSION ] && exec echo '{\"cniVersion\":\"1.1.0\",\"supportedVersions\":[\"0.3.1\",\"1.0.0\",\"1.1.0\"]}'\n"+
			"echo 'CNI "+b+" plugin v1.9.1' >&2\n")
	}
	write(filepath.Join(dir, "sa/token"), "sa-token\n")
	write(filepath.Join(dir, "sa/ca.crt"), testCA)
	t.Setenv("NODE_NAME", "worker-7")
	t.Setenv("KUBERNETES_SERVICE_HOST", "fd00:10:96::1")
	t.Setenv("KUBERNETES_SERVICE_PORT", "443")
	// Debian's containerd 1.6, as deploy/gen -runtime-cni-version sets it.
	t.Setenv("CNI_RUNTIME_MAX_VERSION", "1.0.0")

	run := func(args ...string) (string, error) {
		cmd := newInstallCNICommand()
		var out bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetErr(&out)
		cmd.SetArgs(append([]string{
			"--cni-bin-dir", filepath.Join(host, "opt/cni/bin"),
			"--cni-conf-dir", filepath.Join(host, "etc/cni/net.d"),
			"--token-file", filepath.Join(dir, "sa/token"),
			"--ca-file", filepath.Join(dir, "sa/ca.crt"),
			// No API server here: the pod's token is the plugin's own.
			// Minting the plugin's token with TokenRequest is tested
			// against a real API server in installcni and deploy.
			"--cni-service-account=",
		}, args...))
		cmd.SilenceUsage, cmd.SilenceErrors = true, true
		err := cmd.Execute()
		return out.String(), err
	}

	out, err := run("--bin-source", src, "--mtu", "1400")
	if err != nil {
		t.Fatalf("install-cni: %v\n%s", err, out)
	}
	for _, want := range []string{
		"opt/cni/bin/portmap: installed",
		"install-cni: installed loopback v1.9.1 into " + filepath.Join(host, "opt/cni/bin") + ": the container runtime runs it for every pod\n",
		"install-cni: installed portmap v1.9.1 into " + filepath.Join(host, "opt/cni/bin") + ": the conflist chains it for hostPort\n",
		"install-cni: cniVersion 1.0.0: the container runtime (as configured: --runtime-cni-version or CNI_RUNTIME_MAX_VERSION) speaks CNI up to 1.0.0; portmap v1.9.1 speaks up to 1.1.0\n",
		"6 of 6 files changed",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	conflist, _ := os.ReadFile(filepath.Join(host, "etc/cni/net.d/10-tabby.conflist"))
	for _, want := range []string{`"cniVersion": "1.0.0"`, `"nodename": "worker-7"`, `"mtu": 1400`, `"kubeconfig": "/etc/cni/net.d/tabby-kubeconfig"`, `"type": "portmap"`} {
		if !bytes.Contains(conflist, []byte(want)) {
			t.Errorf("conflist lacks %s:\n%s", want, conflist)
		}
	}
	kc, err := clientcmd.LoadFromFile(filepath.Join(host, "etc/cni/net.d/tabby-kubeconfig"))
	if err != nil {
		t.Fatal(err)
	}
	if s := kc.Clusters[kc.Contexts[kc.CurrentContext].Cluster].Server; s != "https://[fd00:10:96::1]:443" {
		t.Errorf("server %q from KUBERNETES_SERVICE_HOST/PORT", s)
	}

	out, err = run("--bin-source", src, "--mtu", "1400")
	if err != nil || !strings.Contains(out, "0 of 6 files changed") || !strings.Contains(out, "install-cni: loopback v1.9.1 is in ") {
		t.Errorf("second run: %v\n%s", err, out)
	}

	// The flag wins over the environment; the node's runtime read from
	// the flag too, here.
	out, err = run("--bin-source", src, "--mtu", "1400", "--runtime-cni-version", "1.1.0")
	if err != nil || !strings.Contains(out, "1 of 6 files changed") || !strings.Contains(out, "install-cni: cniVersion 1.1.0:") {
		t.Errorf("--runtime-cni-version 1.1.0: %v\n%s", err, out)
	}
	t.Setenv("CNI_RUNTIME_MAX_VERSION", "")
	out, err = run("--bin-source", src, "--mtu", "1400", "--container-runtime", "containerd://1.7.27")
	if err != nil || !strings.Contains(out, "install-cni: cniVersion 1.0.0: containerd://1.7.27 speaks CNI up to 1.0.0;") {
		t.Errorf("--container-runtime: %v\n%s", err, out)
	}
	out, err = run("--bin-source", src, "--runtime-cni-version", "1.0")
	if err == nil || !strings.Contains(err.Error(), "not a version such as 1.0.0") {
		t.Errorf("a bad --runtime-cni-version: %v\n%s", err, out)
	}

	// Without --bin-source the plugins are looked for next to the running
	// binary (here the test binary, which has none beside it).
	out, err = run()
	exe, _ := executableDir()
	if err == nil || !strings.Contains(err.Error(), "tabby is missing from "+exe) {
		t.Errorf("error %v, want tabby missing from %s\n%s", err, exe, out)
	}
}
