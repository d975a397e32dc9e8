package installcni

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/plugin"
)

// CNI versions the conflist's "cniVersion" is chosen between.
const (
	// NewestCNIVersion is the newest CNI version tabby's plugins speak
	// (plugin.SupportedVersions): the conflist says it when the container
	// runtime and every chained plugin speak it too.
	NewestCNIVersion = "1.1.0"
	// FallbackRuntimeCNIVersion is what install-cni assumes the container
	// runtime speaks when it cannot tell: every runtime released since 2021
	// (containerd 1.6, CRI-O 1.23 and later) speaks it.
	FallbackRuntimeCNIVersion = "1.0.0"
)

// DefaultAPITimeout bounds asking the API server for the node's container
// runtime, tries included. On a new node install-cni often starts next to
// kube-proxy, and until kube-proxy has programmed the kubernetes Service
// its address leads nowhere: it keeps asking for a while, then settles for
// FallbackRuntimeCNIVersion, which works everywhere.
const DefaultAPITimeout = time.Minute

// apiTry bounds one try of that read.
const apiTry = 5 * time.Second

// runtimeCNI is one row of what a container runtime's libcni speaks:
// from version since on (until the next row of the same runtime), CNI up to max.
type runtimeCNI struct {
	runtime string
	since   [3]int
	max     string
}

// runtimeCNITable is read off the runtimes' go.mod files
// (github.com/containernetworking/cni: v0.8 speaks CNI up to 0.4.0,
// v1.0 and v1.1 up to 1.0.0, v1.2 and later up to 1.1.0), oldest first per
// runtime:
//
//	containerd v1.5 (cni v0.8.x); v1.6.0 (v1.0.1), v1.6.20 (v1.1.1), v1.7.x (v1.1.2);
//	containerd v2.0.0-rc.0 (v1.1.2), v2.0.0-rc.1 (v1.2.0), v2.0.0 (v1.2.3), v2.1.0 (v1.3.0);
//	CRI-O v1.22 (cni v0.8.1), v1.23 (v1.0.1) ... v1.30 (v1.1.2), v1.31 (v1.2.3), v1.33 (v1.3.0).
//
// A pre-release counts as older than its release (containerd v2.0.0-rc.0
// still had cni v1.1.2).
var runtimeCNITable = []runtimeCNI{
	{"containerd", [3]int{0, 0, 0}, "0.4.0"},
	{"containerd", [3]int{1, 6, 0}, "1.0.0"},
	{"containerd", [3]int{2, 0, 0}, "1.1.0"},
	{"cri-o", [3]int{0, 0, 0}, "0.4.0"},
	{"cri-o", [3]int{1, 23, 0}, "1.0.0"},
	{"cri-o", [3]int{1, 31, 0}, "1.1.0"},
}

// runtimeVersionRE splits a Node's containerRuntimeVersion: the runtime's
// name, "://", its version (a leading "v", distribution suffixes such as
// "~ds1", "-0ubuntu2" or "-k3s2" allowed).
var runtimeVersionRE = regexp.MustCompile(`^([A-Za-z0-9._-]+)://v?(\d+)\.(\d+)(?:\.(\d+))?(.*)$`)

// preReleaseRE tells a pre-release suffix from a distribution's.
var preReleaseRE = regexp.MustCompile(`(?i)^[-.~]?(alpha|beta|rc)`)

// RuntimeMaxCNIVersion returns the newest CNI version a container runtime
// speaks, from its name and version as its Node reports them
// (status.nodeInfo.containerRuntimeVersion, such as "containerd://1.6.20"
// or "cri-o://1.31.2"). known is false for a runtime or version it cannot
// tell; max is then FallbackRuntimeCNIVersion.
func RuntimeMaxCNIVersion(runtime string) (max string, known bool) {
	m := runtimeVersionRE.FindStringSubmatch(strings.TrimSpace(runtime))
	if m == nil {
		return FallbackRuntimeCNIVersion, false
	}
	name := strings.ToLower(m[1])
	var v [3]int
	for i, s := range m[2:5] {
		if s == "" {
			continue
		}
		n, err := strconv.Atoi(s)
		if err != nil {
			return FallbackRuntimeCNIVersion, false
		}
		v[i] = n
	}
	pre := preReleaseRE.MatchString(m[5])
	max, known = "", false
	for _, row := range runtimeCNITable {
		if row.runtime != name {
			continue
		}
		c := compareTriples(v, row.since)
		if c > 0 || (c == 0 && !pre) {
			max, known = row.max, true
		}
	}
	if !known {
		return FallbackRuntimeCNIVersion, false
	}
	return max, true
}

func compareTriples(a, b [3]int) int {
	for i := range a {
		if a[i] != b[i] {
			if a[i] < b[i] {
				return -1
			}
			return 1
		}
	}
	return 0
}

// cniVersionRE is a CNI spec version such as 1.0.0.
var cniVersionRE = regexp.MustCompile(`^(\d+)\.(\d+)\.(\d+)$`)

// ParseCNIVersion checks that v is a CNI spec version such as 1.0.0.
func ParseCNIVersion(v string) error {
	if !cniVersionRE.MatchString(v) {
		return fmt.Errorf("CNI version %q is not a version such as 1.0.0", v)
	}
	if compareCNI(v, "0.3.0") < 0 {
		return fmt.Errorf("CNI version %s is older than any tabby speaks (%s)", v, strings.Join(tabbyVersions(), ", "))
	}
	return nil
}

// compareCNI orders CNI spec versions (both must parse).
func compareCNI(a, b string) int {
	pa, pb := cniVersionRE.FindStringSubmatch(a), cniVersionRE.FindStringSubmatch(b)
	var ta, tb [3]int
	for i := range 3 {
		if pa != nil {
			ta[i], _ = strconv.Atoi(pa[i+1])
		}
		if pb != nil {
			tb[i], _ = strconv.Atoi(pb[i+1])
		}
	}
	return compareTriples(ta, tb)
}

func tabbyVersions() []string { return plugin.SupportedVersions.SupportedVersions() }

// runtimeLimit is what the container runtime speaks, and why install-cni
// thinks so.
type runtimeLimit struct {
	max string
	// who names the runtime in the decision ("containerd://1.6.20", "the
	// container runtime (CNI_RUNTIME_MAX_VERSION)").
	who string
	// warning is set when the limit is a guess.
	warning string
}

// chainLimit is what one chained plugin speaks.
type chainLimit struct {
	// who names it ("portmap v1.9.1").
	who       string
	supported []string
}

// chooseCNIVersion is the newest version tabby speaks that the runtime
// speaks too (none newer than rt.max) and that every chained plugin
// supports. It also says why, in one line.
func chooseCNIVersion(tabby []string, rt runtimeLimit, chain []chainLimit) (string, string, error) {
	best := ""
	for _, v := range tabby {
		if compareCNI(v, rt.max) > 0 {
			continue
		}
		ok := true
		for _, c := range chain {
			ok = ok && contains(c.supported, v)
		}
		if ok && (best == "" || compareCNI(v, best) > 0) {
			best = v
		}
	}
	why := []string{fmt.Sprintf("%s speaks CNI up to %s", rt.who, rt.max)}
	for _, c := range chain {
		why = append(why, fmt.Sprintf("%s speaks up to %s", c.who, newestOf(c.supported)))
	}
	if best == "" {
		return "", "", fmt.Errorf("no CNI version that tabby (%s) speaks is spoken by all of: %s; install newer plugins, or set the runtime's version with --runtime-cni-version if it was misjudged",
			strings.Join(tabby, ", "), strings.Join(why, "; "))
	}
	return best, fmt.Sprintf("cniVersion %s: %s", best, strings.Join(why, "; ")), nil
}

func contains(list []string, v string) bool {
	for _, s := range list {
		if s == v {
			return true
		}
	}
	return false
}

// newestOf is the newest of CNI versions that parse ("none" when none does).
func newestOf(vs []string) string {
	best := ""
	for _, v := range vs {
		if cniVersionRE.MatchString(v) && (best == "" || compareCNI(v, best) > 0) {
			best = v
		}
	}
	if best == "" {
		return "none"
	}
	return best
}

// runtimeLimit decides what the container runtime speaks: the version
// given, else the one the runtime given implies, else the one the runtime
// on the Node object implies (asked with the CNI credentials), else
// FallbackRuntimeCNIVersion with a warning.
func (o Options) runtimeLimit(token, ca []byte) runtimeLimit {
	if o.RuntimeCNIVersion != "" {
		return runtimeLimit{max: o.RuntimeCNIVersion, who: "the container runtime (as configured: --runtime-cni-version or CNI_RUNTIME_MAX_VERSION)"}
	}
	how := "set --runtime-cni-version (CNI_RUNTIME_MAX_VERSION in the DaemonSet; deploy/gen -runtime-cni-version) to the newest CNI version the runtime speaks: 1.0.0 for containerd 1.6 and 1.7, 1.1.0 for containerd 2"
	runtime, from := o.ContainerRuntime, "given"
	if runtime == "" {
		ctx, cancel := context.WithTimeout(context.Background(), o.APITimeout)
		defer cancel()
		var err error
		for {
			runtime, err = nodeRuntime(ctx, o.APIServer, token, ca, o.NodeName, min(apiTry, o.APITimeout))
			// The API server's answers (no such Node, forbidden) stand;
			// no answer, or a server error, is tried again.
			var status apierrors.APIStatus
			if err == nil || ctx.Err() != nil || errors.As(err, &status) && status.Status().Code < 500 {
				break
			}
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
		if err != nil {
			return runtimeLimit{max: FallbackRuntimeCNIVersion, who: "the container runtime (unknown, assumed)",
				warning: fmt.Sprintf("cannot tell which CNI versions the container runtime speaks: %v; assuming %s, which every runtime since 2021 speaks (%s)", err, FallbackRuntimeCNIVersion, how)}
		}
		from = "the Node's status.nodeInfo.containerRuntimeVersion"
	}
	max, known := RuntimeMaxCNIVersion(runtime)
	if !known {
		return runtimeLimit{max: max, who: runtime + " (unknown, assumed)",
			warning: fmt.Sprintf("the container runtime %q (%s) is not one whose CNI versions install-cni knows; assuming %s (%s)", runtime, from, max, how)}
	}
	return runtimeLimit{max: max, who: runtime}
}

// nodeRuntime reads the node's container runtime and version from its Node
// object, as the CNI plugin's service account (which may get nodes).
func nodeRuntime(ctx context.Context, server string, token, ca []byte, node string, timeout time.Duration) (string, error) {
	ds, err := datastore.New(&rest.Config{
		Host:            server,
		BearerToken:     string(token),
		TLSClientConfig: rest.TLSClientConfig{CAData: ca},
		Timeout:         timeout,
		UserAgent:       "tabby-install-cni",
	})
	if err != nil {
		return "", err
	}
	n, err := ds.Nodes.Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("reading the Node %s from %s: %w", node, server, err)
	}
	rt := n.Status.NodeInfo.ContainerRuntimeVersion
	if rt == "" {
		return "", errors.New("the Node " + node + " reports no containerRuntimeVersion yet")
	}
	return rt, nil
}
