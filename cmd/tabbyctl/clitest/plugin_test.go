package clitest

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/tabbynet/tabby/ipam/inspect"
)

// TestKubectlPlugin runs `kubectl tabby ipam show` through the real
// kubectl, with kubectl-tabby (this tree's tabbyctl) on the PATH, against
// the real API server, from a kubeconfig whose current context points at
// a port nothing listens on: --context must select the right one.
func TestKubectlPlugin(t *testing.T) {
	fresh(t)
	bin := t.TempDir()
	if err := os.Symlink(cli.Tabbyctl, filepath.Join(bin, "kubectl-tabby")); err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.LoadFromFile(cli.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	good := cfg.Contexts[cfg.CurrentContext]
	wrong := *cfg.Clusters[good.Cluster]
	wrong.Server = "https://" + closedPort(t)
	cfg.Clusters["wrong"] = &wrong
	cfg.Contexts["wrong"] = &clientcmdapi.Context{Cluster: "wrong", AuthInfo: good.AuthInfo}
	cfg.Contexts["real"] = good
	cfg.CurrentContext = "wrong"
	two := filepath.Join(t.TempDir(), "two-contexts.kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, two); err != nil {
		t.Fatal(err)
	}
	environ := env(t, "PATH="+bin+":"+os.Getenv("PATH"))

	if r := run(t, environ, kubectl(), "plugin", "list"); !strings.Contains(r.stdout, filepath.Join(bin, "kubectl-tabby")) {
		t.Errorf("kubectl does not find the plugin:\n%s", r)
	}
	r := run(t, environ, kubectl(), "tabby", "ipam", "show", "--kubeconfig", two, "--context", "real")
	if r.code != 0 || !strings.Contains(r.stdout, "10.63.0.0/16") || !strings.Contains(r.stdout, "cli-node") {
		t.Errorf("kubectl tabby ipam show --context real:\n%s", r)
	}
	r = run(t, environ, kubectl(), "tabby", "ipam", "show", "-o", "json", "--kubeconfig", two, "--context", "real")
	var show inspect.ShowReport
	if err := json.Unmarshal([]byte(r.stdout), &show); err != nil || len(show.Pools) != 1 || show.Pools[0].CIDR != "10.63.0.0/16" {
		t.Errorf("kubectl tabby ipam show -o json: %v\n%s", err, r)
	}
	// Without --context the kubeconfig's current context is used, and it
	// does not answer; $KUBECONFIG is honoured as kubectl honours it.
	if r := run(t, environ, kubectl(), "tabby", "ipam", "show", "--kubeconfig", two, "--timeout", "5s"); r.code != 2 || !strings.Contains(r.stderr, "kubectl tabby: ") {
		t.Errorf("kubectl tabby with the wrong current context: want exit 2 and an error naming kubectl tabby:\n%s", r)
	}
	if r := run(t, append(environ, "KUBECONFIG="+two), kubectl(), "tabby", "ipam", "show", "--context", "real"); r.code != 0 || !strings.Contains(r.stdout, "10.63.0.0/16") {
		t.Errorf("kubectl tabby with $KUBECONFIG and --context:\n%s", r)
	}
	// Help and usage name the plugin as kubectl users type it.
	if r := run(t, environ, kubectl(), "tabby", "ipam", "show", "--help"); !strings.Contains(r.stdout, "kubectl tabby ipam show [--ip ADDRESS] [flags]") {
		t.Errorf("kubectl tabby ipam show --help does not say kubectl tabby:\n%s", r)
	}
}
