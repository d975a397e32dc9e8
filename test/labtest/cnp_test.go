package labtest

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/tabbynet/tabby/internal/tier"
	"github.com/tabbynet/tabby/lab/labimage"
)

// EnvCNP selects TestCNPConformance's profile when -cnp is not given.
const EnvCNP = "TABBY_CNP"

var (
	cnpFlag = flag.String("cnp", "",
		"run the ClusterNetworkPolicy conformance suite (network-policy-api v0.3.0) in TestCNPConformance: "+
			"standard, experimental (standard plus the named-port and node-peer features), or off (default $"+EnvCNP+", else off)")
	cnpReportFlag = flag.String("cnp.report", "", "where TestCNPConformance writes the suite's report and output (default .cache/cnp-conformance in the repository)")
)

// cnpExperimental are the experimental features of the ClusterNetworkPolicy
// profile (suite.CNPConformanceProfile).
var cnpExperimental = []string{"ClusterNetworkPolicyNamedPorts", "ClusterNetworkPolicyEgressNodePeers"}

// cnpAgnhost is the image the suite's pods run (its base manifests name
// agnhost 2.45). The lab builds it from the agnhost it preloads (2.59, from
// Kubernetes v1.35.4): the suite runs only agnhost's serve-hostname,
// porter and connect, whose flags and answers are the same in both.
const cnpAgnhost = "registry.k8s.io/e2e-test-images/agnhost:2.45"

// TestCNPConformance runs sigs.k8s.io/network-policy-api's conformance
// suite, unmodified (test/cnpconformance/build.sh builds it), against a
// 2-node lab with the ClusterNetworkPolicy CRD installed, and prints a
// table of its tests and the report it writes. It fails when the profile
// does not pass. Off unless asked for (-cnp or $TABBY_CNP; make
// conformance-cnp).
func TestCNPConformance(t *testing.T) {
	mode := *cnpFlag
	if mode == "" {
		mode = os.Getenv(EnvCNP)
	}
	var features []string
	switch mode {
	case "", "off":
		t.Skipf("the ClusterNetworkPolicy conformance suite runs with -cnp=standard|experimental ($%s; make conformance-cnp)", EnvCNP)
	case "standard":
	case "experimental":
		features = cnpExperimental
	default:
		t.Fatalf("-cnp=%s: use standard, experimental or off", mode)
	}
	tier.Root(t, "the ClusterNetworkPolicy conformance suite runs against a lab")
	if KernelLacksSCTP() {
		// Tried: every base pod crash-loops in its two porter containers,
		// the suite waits for its StatefulSets and no test starts.
		t.Fatal("the suite cannot run on this kernel: its base pods serve SCTP (agnhost porter with SERVE_SCTP_PORT_9003 and _9005) " +
			"and this kernel has no SCTP (socket(AF_INET, SOCK_STREAM, IPPROTO_SCTP) fails), so they never become ready; " +
			"run it on a kernel with SCTP (modprobe sctp)")
	}
	suiteDir, err := buildDir(Binaries.Repo, "TABBY_CNP_DIR", "test/cnpconformance/build.sh")
	if err != nil {
		t.Fatal(err)
	}
	reportDir := *cnpReportFlag
	if reportDir == "" {
		reportDir = filepath.Join(Binaries.Repo, ".cache", "cnp-conformance")
	}
	if err := os.RemoveAll(reportDir); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(reportDir, 0o755); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	image, err := cnpImage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	l := Up(t, "--nodes", "2")
	if out, code := l.Tabbyctl("load", image); code != 0 {
		t.Fatalf("tabbyctl lab load: %s", out)
	}
	crd := filepath.Join(suiteDir, "clusternetworkpolicies.yaml")
	if out, code := l.Kubectl("apply", "--server-side", "-f", crd); code != 0 {
		t.Fatalf("installing the ClusterNetworkPolicy CRD: %s", out)
	}
	// kubectl wait fails outright while the new CRD has no conditions yet.
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(time.Second) {
		out, _ := l.Kubectl("get", "crd", "clusternetworkpolicies.policy.networking.k8s.io", "-o", `jsonpath={.status.conditions[?(@.type=="Established")].status}`)
		if strings.TrimSpace(out) == "True" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the ClusterNetworkPolicy CRD is not Established after a minute: %s", out)
		}
	}

	report := filepath.Join(reportDir, "report.yaml")
	args := []string{"-test.run", "^TestConformanceProfiles$", "-test.v", "-test.timeout", "2h",
		"-kubeconfig", l.Kubeconfig,
		"-conformance-profiles", "ClusterNetworkPolicy",
		"-organization", "tabbynet", "-project", "tabby", "-url", "https://github.com/tabbynet/tabby",
		"-version", cnpVersion(), "-contact", "https://github.com/tabbynet/tabby/issues",
		"-additional-info", "tabby's lab (make conformance-cnp)",
		"-report-output", report}
	if len(features) > 0 {
		args = append(args, "-supported-features", strings.Join(features, ","))
	}
	logPath := filepath.Join(reportDir, "conformance.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, filepath.Join(suiteDir, "cnp-conformance.test"), args...)
	cmd.Dir = reportDir
	cmd.Env = append(os.Environ(), "KUBECONFIG="+l.Kubeconfig)
	cmd.Stdout = io.MultiWriter(&out, logf)
	cmd.Stderr = cmd.Stdout
	t.Logf("running the ClusterNetworkPolicy conformance suite, profile %s (output in %s)", mode, logPath)
	start := time.Now()
	runErr := cmd.Run()
	t.Logf("the suite ran for %v (%v)", time.Since(start).Round(time.Second), runErr)
	t.Logf("\n%s", cnpTable(out.String()))
	raw, err := os.ReadFile(report)
	if err != nil {
		t.Fatalf("the suite wrote no report (%v); its output ends:\n%s", err, upstreamTail(out.String(), 40))
	}
	t.Logf("report (%s):\n%s", report, raw)
	var rep struct {
		Profiles []struct {
			Name         string
			Standard     *cnpResult `json:"standard"`
			Experimental *cnpResult `json:"experimental"`
		} `json:"profiles"`
	}
	if err := yaml.Unmarshal(raw, &rep); err != nil {
		t.Fatalf("reading the report %s: %v", report, err)
	}
	for _, p := range rep.Profiles {
		for name, r := range map[string]*cnpResult{"standard": p.Standard, "experimental": p.Experimental} {
			if r != nil && r.Result != "success" {
				t.Errorf("profile %s %s: %s (%d passed, %d failed, %d skipped)", p.Name, name, r.Result, r.Statistics.Passed, r.Statistics.Failed, r.Statistics.Skipped)
			}
		}
	}
	if runErr != nil && !t.Failed() {
		t.Errorf("the suite failed: %v; its output ends:\n%s", runErr, upstreamTail(out.String(), 40))
	}
}

type cnpResult struct {
	Result     string `json:"result"`
	Statistics struct {
		Passed  int `json:"Passed"`
		Failed  int `json:"Failed"`
		Skipped int `json:"Skipped"`
	} `json:"statistics"`
}

// cnpImage builds (or finds in the lab's cache) the agnhost image under
// the name the suite's manifests use, and returns its tarball.
func cnpImage(ctx context.Context) (string, error) {
	cacheDir, err := labimage.DefaultCacheDir(os.Getenv)
	if err != nil {
		return "", err
	}
	spec := labimage.Agnhost(filepath.Join(Binaries.ControlPlane, "agnhost"))
	spec.Ref = cnpAgnhost
	key, err := upstreamSpecKey(spec)
	if err != nil {
		return "", err
	}
	tarball := filepath.Join(cacheDir, "images", strings.NewReplacer("/", "_", ":", "_").Replace(spec.Ref)+"-"+key[:16]+".tar")
	if _, err := os.Stat(tarball); err == nil {
		return tarball, nil
	}
	if err := os.MkdirAll(filepath.Dir(tarball), 0o755); err != nil {
		return "", err
	}
	if _, err := labimage.Build(ctx, spec, labimage.NewDebCache(labimage.DebCacheDir(cacheDir)), tarball); err != nil {
		return "", fmt.Errorf("building %s: %w", spec.Ref, err)
	}
	return tarball, nil
}

var cnpTestLine = regexp.MustCompile(`--- (PASS|FAIL|SKIP): TestConformanceProfiles/(?:[^/\s]+/)?(CNP\w+) \(([\d.]+)s\)`)

// cnpTable is a table of the suite's tests from its -test.v output: name,
// result, time.
func cnpTable(out string) string {
	type row struct{ name, result, secs string }
	var rows []row
	count := map[string]int{}
	for _, m := range cnpTestLine.FindAllStringSubmatch(out, -1) {
		rows = append(rows, row{m[2], m[1], m[3]})
		count[m[1]]++
	}
	sort.Slice(rows, func(i, j int) bool { return rows[i].name < rows[j].name })
	var b strings.Builder
	fmt.Fprintf(&b, "%-40s %-6s %s\n", "TEST", "RESULT", "SECONDS")
	for _, r := range rows {
		fmt.Fprintf(&b, "%-40s %-6s %s\n", r.name, r.result, r.secs)
	}
	fmt.Fprintf(&b, "%d passed, %d failed, %d skipped\n", count["PASS"], count["FAIL"], count["SKIP"])
	return b.String()
}

// cnpVersion is the version the report names: the commit of this checkout.
func cnpVersion() string {
	out, err := exec.Command("git", "-C", Binaries.Repo, "describe", "--always", "--dirty").Output()
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(out))
}
