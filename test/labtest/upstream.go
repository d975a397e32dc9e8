package labtest

// Kubernetes' own network e2e suites (e2e.test v1.35.4, test/upstream)
// against a lab: the images they need beyond the lab's, the suites' focus
// and skip expressions, running e2e.test and reading its JUnit report.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/tabbynet/tabby/lab"
	"github.com/tabbynet/tabby/lab/labimage"
)

// EnvE2EDir names a folder holding e2e.test (what test/upstream/build.sh
// prints); without it the runner runs that script (cached; about 5 minutes
// cold).
const EnvE2EDir = "TABBY_E2E_DIR"

// UpstreamSkip is a group of specs a suite skips, with why.
type UpstreamSkip struct {
	// Regexp matches the specs' full names (--ginkgo.skip).
	Regexp string
	// Reason is printed with the table.
	Reason string
	// When says whether the skip applies on this machine (nil: always).
	When func() bool `json:"-"`
}

// UpstreamSuite is a selection of e2e.test's specs.
type UpstreamSuite struct {
	Name string
	// Focus is --ginkgo.focus: the suite's specs, all of which must pass
	// unless Skips names them.
	Focus string
	Skips []UpstreamSkip
	// Specs is how many specs Focus selects in e2e.test v1.35.4 (0: not
	// checked), so that a typo in it is not a smaller suite passing.
	Specs int
	// Timeout bounds the whole run (--ginkgo.timeout).
	Timeout time.Duration
}

// KernelLacksSCTP says this kernel cannot make SCTP sockets (socket(AF_INET,
// SOCK_STREAM, IPPROTO_SCTP) fails), so the SCTP connectivity specs
// cannot pass here whatever the network plugin does.
func KernelLacksSCTP() bool {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 132)
	if err != nil {
		return true
	}
	syscall.Close(fd)
	return false
}

// upstreamSCTPSkip skips the specs that send SCTP (agnhost connect
// --protocol=sctp between pods) on a kernel without SCTP.
var upstreamSCTPSkip = UpstreamSkip{
	Regexp: `\[Feature:SCTPConnectivity\]`,
	Reason: "no SCTP in this kernel: socket(AF_INET, SOCK_STREAM, IPPROTO_SCTP) fails with EPROTONOSUPPORT, so no pod can open an SCTP connection",
	When:   KernelLacksSCTP,
}

// The suites.
var (
	// NetworkPolicySuite is every NetworkPolicy spec (48) and the two
	// Netpol API specs: 50.
	NetworkPolicySuite = UpstreamSuite{
		Name:    "NetworkPolicy",
		Focus:   `\[Feature:NetworkPolicy\]|\[sig-network\] Netpol API`,
		Skips:   []UpstreamSkip{upstreamSCTPSkip},
		Specs:   50,
		Timeout: 3 * time.Hour,
	}
	// ConformanceSuite is sig-network's conformance specs: 47.
	ConformanceSuite = UpstreamSuite{
		Name:    "sig-network conformance",
		Focus:   `\[sig-network\].*\[Conformance\]`,
		Specs:   47,
		Timeout: 2 * time.Hour,
	}
	// CISuite is what make test runs: the Networking Granular Checks
	// (pod to pod and node to pod, HTTP and UDP), HostPort, and
	// NetworkPolicy specs that between them use every policy feature:
	// ipBlock with except, named ports (ingress and egress), egress,
	// namespace and pod selectors (together and with match expressions),
	// updates of pods, namespaces and policies, deletion, UDP.
	CISuite = UpstreamSuite{
		Name: "CI subset",
		Focus: `\[sig-network\] Networking Granular Checks: Pods should function for (intra|node)-pod communication: (http|udp) ` +
			`|\[sig-network\] HostPort ` +
			`|\[sig-network\] Netpol NetworkPolicy between server and client should (` +
			`enforce except clause while egress access to server in CIDR block` +
			`|allow ingress access on one named port` +
			`|allow egress access on one named port` +
			`|enforce policy to allow traffic only from a pod in a different namespace based on PodSelector and NamespaceSelector` +
			`|enforce policy based on NamespaceSelector with MatchExpressions` +
			`|allow ingress access from updated pod` +
			`|allow ingress access from updated namespace` +
			`|enforce updated policy` +
			`|stop enforcing policies after they are deleted` +
			`) \[Feature:NetworkPolicy\]` +
			`|\[sig-network\] Netpol \[LinuxOnly\] NetworkPolicy between server and client using UDP should enforce policy based on Ports`,
		Specs:   15,
		Timeout: time.Hour,
	}
)

// UpstreamSuites names the selections of -upstream.
var UpstreamSuites = map[string][]UpstreamSuite{
	"ci":          {CISuite},
	"netpol":      {NetworkPolicySuite},
	"conformance": {ConformanceSuite},
	"all":         {NetworkPolicySuite, ConformanceSuite},
}

// E2ETest is the path of e2e.test: in $TABBY_E2E_DIR, else in the folder
// test/upstream/build.sh prints (building it when the cache lacks it).
func E2ETest() (string, error) {
	dir, err := buildDir(Binaries.Repo, EnvE2EDir, "test/upstream/build.sh")
	if err != nil {
		return "", err
	}
	p := filepath.Join(dir, "e2e.test")
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("e2e.test: %w (run test/upstream/build.sh)", err)
	}
	return p, nil
}

// BuildE2EImages builds the images the suites need that the lab does not
// preload (labimage.E2EImages), or finds them in cacheDir's images
// folder, where a tarball's name holds a hash of its spec and the files it
// copies, as the lab caches its own. It returns the tarballs.
func BuildE2EImages(ctx context.Context, cacheDir, corednsPath string, log func(format string, args ...any)) ([]string, error) {
	dir := filepath.Join(cacheDir, "images")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	debs := labimage.NewDebCache(labimage.DebCacheDir(cacheDir))
	var out []string
	for _, spec := range labimage.E2EImages(corednsPath) {
		key, err := upstreamSpecKey(spec)
		if err != nil {
			return nil, err
		}
		tarball := filepath.Join(dir, strings.NewReplacer("/", "_", ":", "_").Replace(spec.Ref)+"-"+key[:16]+".tar")
		out = append(out, tarball)
		if _, err := os.Stat(tarball); err == nil {
			now := time.Now()
			_ = os.Chtimes(tarball, now, now)
			continue
		}
		start := time.Now()
		if _, err := labimage.Build(ctx, spec, debs, tarball); err != nil {
			return nil, fmt.Errorf("building %s: %w", spec.Ref, err)
		}
		log("image %s built in %.1fs", spec.Ref, time.Since(start).Seconds())
	}
	return out, nil
}

// upstreamSpecKey hashes an image's spec and the contents of the files it
// copies.
func upstreamSpecKey(spec labimage.Spec) (string, error) {
	h := sha256.New()
	if err := json.NewEncoder(h).Encode(spec); err != nil {
		return "", err
	}
	for _, f := range spec.Files {
		if f.Src == "" {
			continue
		}
		fh, err := os.Open(f.Src)
		if err != nil {
			return "", err
		}
		_, err = io.Copy(h, fh)
		fh.Close()
		if err != nil {
			return "", err
		}
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// UpstreamRun is one run of e2e.test.
type UpstreamRun struct {
	// E2ETest is the path of e2e.test; Kubeconfig and Kubectl what it
	// talks to the cluster with.
	E2ETest, Kubeconfig, Kubectl string
	// Dir receives the report (junit_01.xml), e2e.test's output
	// (e2e.log) and its other files.
	Dir string
	// Suite is what to run.
	Suite UpstreamSuite
	// Output, when set, also receives e2e.test's output as it runs.
	Output io.Writer
}

// UpstreamSpec is one spec's outcome.
type UpstreamSpec struct {
	Name string
	// State is passed, failed, skipped (by the suite's skips or by the
	// spec itself), "not run" (the run ended before it), or what else
	// ginkgo says (panicked, timedout, interrupted, aborted).
	State string
	// Message is the failure's or the skip's message; Reason, for a spec
	// the suite skips, the skip's reason.
	Message, Reason string
	Time            time.Duration
}

// UpstreamResult is a suite's outcome.
type UpstreamResult struct {
	Suite UpstreamSuite
	// Specs are the suite's specs (those its focus selects), in the
	// report's order.
	Specs []UpstreamSpec
	// Time is the run's wall time; ExitCode e2e.test's.
	Time     time.Duration
	ExitCode int
	// Log is e2e.test's output.
	Log string
}

// Count returns how many specs passed, failed (any state but passed and
// skipped) and were skipped.
func (r *UpstreamResult) Count() (passed, failed, skipped int) {
	for _, s := range r.Specs {
		switch s.State {
		case "passed":
			passed++
		case "skipped":
			skipped++
		default:
			failed++
		}
	}
	return
}

// Failed lists the specs that did not pass and were not skipped.
func (r *UpstreamResult) Failed() []UpstreamSpec {
	var out []UpstreamSpec
	for _, s := range r.Specs {
		if s.State != "passed" && s.State != "skipped" {
			out = append(out, s)
		}
	}
	return out
}

// Skipped lists the skipped specs.
func (r *UpstreamResult) Skipped() []UpstreamSpec {
	var out []UpstreamSpec
	for _, s := range r.Specs {
		if s.State == "skipped" {
			out = append(out, s)
		}
	}
	return out
}

// activeSkips are the suite's skips that apply on this machine.
func (s UpstreamSuite) activeSkips() []UpstreamSkip {
	var out []UpstreamSkip
	for _, sk := range s.Skips {
		if sk.When == nil || sk.When() {
			out = append(out, sk)
		}
	}
	return out
}

// args are e2e.test's flags for the run, dry or not: the lab is a
// provider-less cluster (skeleton, as kind's CI runs it) of Debian nodes
// with the cluster.local domain.
func (r *UpstreamRun) args(reportDir string, dry bool) []string {
	a := []string{
		"--kubeconfig=" + r.Kubeconfig,
		"--kubectl-path=" + r.Kubectl,
		"--provider=skeleton",
		"--dns-domain=" + lab.ClusterDomain,
		"--node-os-distro=debian",
		"--report-dir=" + reportDir,
		"--e2e-output-dir=" + reportDir,
		"--disable-log-dump",
		"--ginkgo.no-color",
		"--ginkgo.v",
		"--ginkgo.focus=" + r.Suite.Focus,
	}
	if !dry {
		var skips []string
		for _, sk := range r.Suite.activeSkips() {
			skips = append(skips, sk.Regexp)
		}
		if len(skips) > 0 {
			a = append(a, "--ginkgo.skip="+strings.Join(skips, "|"))
		}
		if r.Suite.Timeout > 0 {
			a = append(a, "--ginkgo.timeout="+r.Suite.Timeout.String())
		}
	} else {
		a = append(a, "--ginkgo.dry-run")
	}
	return a
}

// List returns the names of the suite's specs, as e2e.test's dry run
// (no cluster) selects them with the suite's focus and no skips.
func (r *UpstreamRun) List(ctx context.Context) ([]string, error) {
	dir, err := os.MkdirTemp("", "upstream-dry-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	cmd := exec.CommandContext(ctx, r.E2ETest, r.args(dir, true)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("e2e.test --ginkgo.dry-run: %w: %s", err, upstreamTail(string(out), 20))
	}
	cases, err := readUpstreamJUnit(filepath.Join(dir, "junit_01.xml"))
	if err != nil {
		return nil, err
	}
	var names []string
	for _, c := range cases {
		if c.Status == "passed" && strings.HasPrefix(c.Name, "[It] ") {
			names = append(names, strings.TrimPrefix(c.Name, "[It] "))
		}
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("the focus %q selects no spec of %s", r.Suite.Focus, r.E2ETest)
	}
	if r.Suite.Specs > 0 && len(names) != r.Suite.Specs {
		return nil, fmt.Errorf("the focus of %s selects %d specs, not %d:\n%s", r.Suite.Name, len(names), r.Suite.Specs, strings.Join(names, "\n"))
	}
	return names, nil
}

// Run lists the suite's specs, runs them, and reads the report. An error
// means the run could not happen or be read; failed specs are in the
// result.
func (r *UpstreamRun) Run(ctx context.Context) (*UpstreamResult, error) {
	names, err := r.List(ctx)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(r.Dir, 0o755); err != nil {
		return nil, err
	}
	res := &UpstreamResult{Suite: r.Suite, Log: filepath.Join(r.Dir, "e2e.log")}
	logf, err := os.Create(res.Log)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cmd := exec.CommandContext(ctx, r.E2ETest, r.args(r.Dir, false)...)
	cmd.Dir = r.Dir
	var w io.Writer = logf
	if r.Output != nil {
		w = io.MultiWriter(logf, r.Output)
	}
	cmd.Stdout, cmd.Stderr = w, w
	// Ginkgo ends its specs and writes its report on SIGINT.
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = 2 * time.Minute
	fmt.Fprintf(logf, "# %s %s\n", r.E2ETest, strings.Join(r.args(r.Dir, false), " "))
	start := time.Now()
	err = cmd.Run()
	res.Time = time.Since(start)
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		res.ExitCode = ee.ExitCode()
	case err != nil:
		return nil, fmt.Errorf("running e2e.test: %w", err)
	}
	cases, err := readUpstreamJUnit(filepath.Join(r.Dir, "junit_01.xml"))
	if err != nil {
		return res, fmt.Errorf("%w (e2e.test exited %d; its output: %s):\n%s", err, res.ExitCode, res.Log, upstreamTail(upstreamReadFile(res.Log), 30))
	}
	byName := map[string]upstreamJUnitCase{}
	for _, c := range cases {
		byName[strings.TrimPrefix(c.Name, "[It] ")] = c
	}
	skips := r.Suite.activeSkips()
	for _, n := range names {
		s := UpstreamSpec{Name: n, State: "missing", Message: "not in the report (e2e.test ended early?)"}
		if c, ok := byName[n]; ok {
			s.State, s.Time = c.Status, time.Duration(c.Time*float64(time.Second))
			switch {
			case c.Failure != nil:
				s.Message = c.Failure.text()
			case c.Skipped != nil:
				s.Message = strings.TrimSpace(c.Skipped.Message)
			default:
				s.Message = ""
			}
		}
		if s.State == "skipped" {
			for _, sk := range skips {
				if regexp.MustCompile(sk.Regexp).MatchString(n) {
					s.Reason = sk.Reason
				}
			}
			// A spec that skipped itself says why ("skipped - ..."); one
			// that did not run at all (the run ended early) says only
			// "skipped".
			if why, ok := strings.CutPrefix(s.Message, "skipped - "); s.Reason == "" && ok {
				s.Reason = why
			}
			if s.Reason == "" {
				s.State, s.Message = "not run", "the run ended before it (interrupted, timed out, or a failed set-up)"
			}
		}
		res.Specs = append(res.Specs, s)
	}
	// Failures outside the specs (the suite's set-up and tear-down) fail
	// the run too.
	for _, c := range cases {
		if !strings.HasPrefix(c.Name, "[It] ") && c.Failure != nil {
			res.Specs = append(res.Specs, UpstreamSpec{Name: c.Name, State: c.Status, Message: c.Failure.text()})
		}
	}
	return res, nil
}

// upstreamJUnitCase is a testcase of ginkgo's JUnit report.
type upstreamJUnitCase struct {
	Name    string                `xml:"name,attr"`
	Status  string                `xml:"status,attr"`
	Time    float64               `xml:"time,attr"`
	Failure *upstreamJUnitFailure `xml:"failure"`
	Skipped *struct {
		Message string `xml:"message,attr"`
	} `xml:"skipped"`
}

// upstreamJUnitFailure is a testcase's failure: ginkgo leaves the message
// attribute empty and writes the failure as the element's text.
type upstreamJUnitFailure struct {
	Message string `xml:"message,attr"`
	Type    string `xml:"type,attr"`
	Text    string `xml:",chardata"`
}

func (f *upstreamJUnitFailure) text() string {
	if m := strings.TrimSpace(f.Message); m != "" {
		return m
	}
	return strings.TrimSpace(f.Text)
}

// readUpstreamJUnit reads the testcases of a JUnit report.
func readUpstreamJUnit(path string) ([]upstreamJUnitCase, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("e2e.test's JUnit report: %w", err)
	}
	var doc struct {
		Suites []struct {
			Cases []upstreamJUnitCase `xml:"testcase"`
		} `xml:"testsuite"`
	}
	if err := xml.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	var out []upstreamJUnitCase
	for _, s := range doc.Suites {
		out = append(out, s.Cases...)
	}
	return out, nil
}

// UpstreamTable formats results as the table make e2e-upstream prints:
// suite, specs, passed, failed, skipped, time; then the skipped specs with
// their reasons and the failed ones with their messages.
func UpstreamTable(results []*UpstreamResult) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%-26s %6s %7s %7s %8s  %s\n", "suite", "specs", "passed", "failed", "skipped", "time")
	for _, r := range results {
		p, f, s := r.Count()
		note := ""
		if s > 0 {
			var reasons []string
			for _, sk := range r.Skipped() {
				short, _, _ := strings.Cut(sk.Reason, ":")
				if !slices.Contains(reasons, short) {
					reasons = append(reasons, short)
				}
			}
			note = "  (skipped: " + strings.Join(reasons, "; ") + ")"
		}
		fmt.Fprintf(&b, "%-26s %6d %7d %7d %8d  %s%s\n", r.Suite.Name, len(r.Specs), p, f, s, r.Time.Round(time.Second), note)
	}
	for _, r := range results {
		for _, sk := range r.Skipped() {
			fmt.Fprintf(&b, "skipped  [%s] %s\n         reason: %s\n", r.Suite.Name, sk.Name, sk.Reason)
		}
		for _, fl := range r.Failed() {
			fmt.Fprintf(&b, "%-8s [%s] %s\n         %s\n", strings.ToUpper(fl.State), r.Suite.Name, fl.Name, upstreamFirstLine(fl.Message))
		}
	}
	return b.String()
}

func upstreamFirstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	if len(line) > 300 {
		line = line[:300] + "…"
	}
	return line
}

func upstreamTail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func upstreamReadFile(p string) string {
	b, _ := os.ReadFile(p)
	return string(b)
}
