package labtest

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/tabbynet/tabby/internal/tier"
	"github.com/tabbynet/tabby/lab"
	"github.com/tabbynet/tabby/lab/labimage"
)

// EnvUpstream names the environment variable that sets -upstream's
// default when the flag is not given (make e2e-upstream passes
// -upstream=all).
const EnvUpstream = "TABBY_UPSTREAM"

var (
	upstreamFlag = flag.String("upstream", "",
		"Kubernetes' e2e suites to run against a 3-node lab in TestUpstreamE2E: ci (the default, what make test runs), netpol, conformance, all, off, "+
			"or focus=REGEXP for any selection (default $"+EnvUpstream+", else ci)")
	upstreamLabFlag = flag.String("upstream.lab", "",
		"run TestUpstreamE2E against the running lab in this folder (tabbyctl lab up --dir) instead of bringing one up and down")
	upstreamReportFlag = flag.String("upstream.report-dir", "",
		"where e2e.test writes its reports and output, a folder per suite (default .cache/e2e-upstream/<selection> in the repository, emptied first)")
	upstreamVerboseFlag = flag.Bool("upstream.v", false, "print e2e.test's output as it runs")
)

// TestUpstreamE2E runs Kubernetes' own network e2e suites (e2e.test
// v1.35.4) against a 3-node lab: by default the CI subset (Networking
// Granular Checks, HostPort and NetworkPolicy specs covering every policy
// feature); -upstream=all the NetworkPolicy suite and sig-network's
// conformance specs. It builds and loads the images the suites need
// beyond the lab's, prints the table of every suite (suite, passed,
// failed, skipped, time) with the skipped specs' reasons, fails for any
// spec that neither passed nor was skipped by the suite, and then checks
// that the lab is healthy: the suites' namespaces gone, tabbyctl ipam
// check clean, and no policy chain or set of tabby's left on any node.
func TestUpstreamE2E(t *testing.T) {
	mode := *upstreamFlag
	if mode == "" {
		mode = os.Getenv(EnvUpstream)
	}
	if mode == "" {
		mode = "ci"
	}
	var suites []UpstreamSuite
	switch {
	case mode == "off":
		t.Skipf("-upstream=off (or $%s=off)", EnvUpstream)
	case strings.HasPrefix(mode, "focus="):
		focus := strings.TrimPrefix(mode, "focus=")
		if _, err := regexp.Compile(focus); err != nil {
			t.Fatalf("-upstream=%s: %v", mode, err)
		}
		suites = []UpstreamSuite{{Name: "focus", Focus: focus, Skips: NetworkPolicySuite.Skips, Timeout: 3 * time.Hour}}
	default:
		var ok bool
		if suites, ok = UpstreamSuites[mode]; !ok {
			t.Fatalf("-upstream=%s: use ci, netpol, conformance, all, off or focus=REGEXP", mode)
		}
	}
	tier.Root(t, "Kubernetes' e2e suites run against a lab")
	ctx := context.Background()
	e2e, err := E2ETest()
	if err != nil {
		t.Fatal(err)
	}
	cacheDir, err := labimage.DefaultCacheDir(os.Getenv)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	images, err := BuildE2EImages(ctx, cacheDir, filepath.Join(Binaries.Runtime, "coredns"), t.Logf)
	if err != nil {
		t.Fatal(err)
	}

	var l *Lab
	if dir := *upstreamLabFlag; dir != "" {
		l = existingLab(t, dir)
	} else {
		l = Up(t, "--nodes", "3")
	}
	if out, code := l.Tabbyctl(append([]string{"load"}, images...)...); code != 0 {
		t.Fatalf("tabbyctl lab load: %s", out)
	}
	t.Logf("lab %s ready with the e2e images in %v", l.Name, time.Since(start).Round(time.Second))

	reportRoot := *upstreamReportFlag
	if reportRoot == "" {
		name := mode
		if strings.HasPrefix(mode, "focus=") {
			name = "focus"
		}
		reportRoot = filepath.Join(Binaries.Repo, ".cache", "e2e-upstream", name)
		if err := os.RemoveAll(reportRoot); err != nil {
			t.Fatal(err)
		}
	}
	var results []*UpstreamResult
	for _, s := range suites {
		run := &UpstreamRun{
			E2ETest:    e2e,
			Kubeconfig: l.Kubeconfig,
			Kubectl:    filepath.Join(Binaries.ControlPlane, "kubectl"),
			Dir:        filepath.Join(reportRoot, strings.NewReplacer(" ", "-", "/", "_").Replace(s.Name)),
			Suite:      s,
		}
		if *upstreamVerboseFlag {
			run.Output = os.Stdout
		}
		t.Logf("suite %s: running e2e.test (output in %s)", s.Name, filepath.Join(run.Dir, "e2e.log"))
		res, err := run.Run(ctx)
		if err != nil {
			t.Fatalf("suite %s: %v", s.Name, err)
		}
		p, f, sk := res.Count()
		t.Logf("suite %s: %d passed, %d failed, %d skipped in %v (e2e.test exited %d)", s.Name, p, f, sk, res.Time.Round(time.Second), res.ExitCode)
		results = append(results, res)
	}
	table := UpstreamTable(results)
	fmt.Println("\nKubernetes v1.35.4 e2e against tabby (" + fmt.Sprint(len(l.State.Nodes)) + "-node lab):\n" + table)
	if err := os.WriteFile(filepath.Join(reportRoot, "table.txt"), []byte(table), 0o644); err != nil {
		t.Error(err)
	}
	for _, r := range results {
		for _, fl := range r.Failed() {
			t.Errorf("suite %s: %s %s:\n%s", r.Suite.Name, strings.ToUpper(fl.State), fl.Name, fl.Message)
		}
		if _, f, _ := r.Count(); f == 0 && r.ExitCode != 0 {
			t.Errorf("suite %s: e2e.test exited %d with no failed spec; its output: %s", r.Suite.Name, r.ExitCode, r.Log)
		}
	}
	t.Logf("the suites took %v in all", time.Since(start).Round(time.Second))
	checkLabHealthyAfterSuites(t, l)
}

// existingLab is the running lab in dir, which the test neither brings up
// nor down.
func existingLab(t *testing.T, dir string) *Lab {
	t.Helper()
	st, err := lab.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !st.Ready {
		t.Fatalf("the lab in %s is not ready", dir)
	}
	l := &Lab{Name: st.Name, Dir: st.Dir, State: st, Kubeconfig: st.Kubeconfig}
	cfg, err := clientcmd.BuildConfigFromFlags("", l.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cfg.QPS, cfg.Burst = 50, 100
	if l.CS, err = kubernetes.NewForConfig(cfg); err != nil {
		t.Fatal(err)
	}
	return l
}

// upstreamSystemNamespaces are the namespaces a lab has before any test.
var upstreamSystemNamespaces = []string{"default", "kube-system", "kube-public", "kube-node-lease", "tabby-system"}

// policyChain matches the chains tabby makes for policies (the fixed
// dispatch chains stay).
var policyChain = regexp.MustCompile(`(?m)^:(TABBY-NP-(?:E|I|PE|PI)-\S+)`)

// checkLabHealthyAfterSuites waits until the suites' namespaces are gone,
// then checks that IPAM is consistent (tabbyctl ipam check), that no
// address is still allocated to a pod that is gone, and that no node keeps
// a policy chain or a policy's ipset.
func checkLabHealthyAfterSuites(t *testing.T, l *Lab) {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(5 * time.Minute)
	for {
		nss, err := l.CS.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var left []string
		for _, ns := range nss.Items {
			if !slices.Contains(upstreamSystemNamespaces, ns.Name) {
				left = append(left, ns.Name+" ("+string(ns.Status.Phase)+")")
			}
		}
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the suites' namespaces are still there after 5 minutes: %v", left)
		}
		time.Sleep(2 * time.Second)
	}
	nps, err := l.CS.NetworkingV1().NetworkPolicies("").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(nps.Items) > 0 {
		t.Errorf("%d NetworkPolicies are left", len(nps.Items))
	}
	// IPAM: the pods of the suites are gone, so must their addresses be
	// (a sandbox's CNI DEL may still be under way when its pod object is
	// gone: a problem must last).
	for try := 1; ; try++ {
		out, code := run(nil, Tabbyctl(), "ipam", "check", "--kubeconfig", l.Kubeconfig, "--confirm", "5s")
		if code == 0 {
			t.Logf("tabbyctl ipam check after the suites: %s", strings.TrimSpace(out))
			break
		}
		if try == 3 {
			t.Errorf("tabbyctl ipam check after the suites:\n%s", out)
			break
		}
		time.Sleep(10 * time.Second)
	}
	// The kernel: no chain or set of a policy that no longer exists.
	deadline = time.Now().Add(time.Minute)
	for _, n := range l.State.Nodes {
		for {
			save, code := l.NodeExec(t, n.Name, "iptables-save", "-t", "filter")
			if code != 0 {
				t.Fatalf("iptables-save on %s: %s", n.Name, save)
			}
			sets, code := l.NodeExec(t, n.Name, "ipset", "list", "-n")
			if code != 0 {
				t.Fatalf("ipset list on %s: %s", n.Name, sets)
			}
			var stale []string
			for _, m := range policyChain.FindAllStringSubmatch(save, -1) {
				stale = append(stale, "chain "+m[1])
			}
			for _, s := range strings.Fields(sets) {
				if strings.HasPrefix(s, "tabby-np-") && !strings.HasPrefix(s, "tabby-np-u") {
					stale = append(stale, "set "+s)
				}
			}
			if len(stale) == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("node %s keeps what no policy needs any more: %v", n.Name, stale)
				break
			}
			time.Sleep(time.Second)
		}
	}
}
