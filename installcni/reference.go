package installcni

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/containernetworking/cni/pkg/invoke"

	"github.com/tabbynet/tabby/internal/filehash"
)

// DefaultReferencePlugins are the reference CNI plugins
// (github.com/containernetworking/plugins) that the image ships and
// install-cni puts into the CNI bin dir when the node lacks them or has
// older ones: loopback, which the container runtime runs itself for every
// pod sandbox (containerd fails every pod with `failed to find plugin
// "loopback"` without it), and portmap, which the conflist chains for
// hostPort.
var DefaultReferencePlugins = []string{"loopback", "portmap"}

// loopbackCNIVersion is the CNI version containerd's CRI plugin runs
// loopback with (go-cni's loopback network config).
const loopbackCNIVersion = "0.3.1"

// probeTimeout bounds running a plugin binary to ask its version.
const probeTimeout = 10 * time.Second

// buildVersionRE finds the version a reference plugin prints when run
// without CNI_COMMAND: "CNI loopback plugin v1.9.1". A plugin built
// without it says "CNI portmap plugin version unknown" (Debian's do).
var buildVersionRE = regexp.MustCompile(`CNI (\S+) plugin (v?\d+\.\d+(?:\.\d+)?[^\s]*)`)

// probeBuildVersion runs a plugin binary without CNI_COMMAND and returns
// the version it says it is, or what it said instead (err != nil) when that
// holds no version.
func probeBuildVersion(path string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, path)
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	runErr := cmd.Run()
	if m := buildVersionRE.FindSubmatch(out.Bytes()); m != nil {
		return string(m[2]), nil
	}
	said := strings.TrimSpace(firstLine(out.String()))
	switch {
	case runErr != nil && said == "":
		return "", fmt.Errorf("running it: %v", runErr)
	case said == "":
		return "", errors.New("it prints nothing when run without CNI_COMMAND")
	default:
		return "", fmt.Errorf("it says %q", said)
	}
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	if len(s) > 120 {
		s = s[:120] + "…"
	}
	return s
}

// semverRE parses a plugin's build version: v1.9.1, 1.10.0, v1.4.0-rc.1,
// v1.2.0-dirty, v1.1.1+ds1.
var semverRE = regexp.MustCompile(`^v?(\d+)\.(\d+)(?:\.(\d+))?(?:-([0-9A-Za-z.-]+))?(?:\+[0-9A-Za-z.~-]*)?$`)

// CompareBuildVersions orders two plugin build versions as semantic
// versions (a pre-release before its release); ok is false when either
// does not parse.
func CompareBuildVersions(a, b string) (c int, ok bool) {
	ma, mb := semverRE.FindStringSubmatch(a), semverRE.FindStringSubmatch(b)
	if ma == nil || mb == nil {
		return 0, false
	}
	for i := 1; i <= 3; i++ {
		x, _ := strconv.Atoi(ma[i])
		y, _ := strconv.Atoi(mb[i])
		if x != y {
			if x < y {
				return -1, true
			}
			return 1, true
		}
	}
	pa, pb := ma[4], mb[4]
	switch {
	case pa == pb:
		return 0, true
	case pa == "":
		return 1, true
	case pb == "":
		return -1, true
	}
	return comparePreRelease(pa, pb), true
}

// comparePreRelease orders pre-release strings as semver does: field by
// field, numbers numerically and before words.
func comparePreRelease(a, b string) int {
	fa, fb := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; i < len(fa) && i < len(fb); i++ {
		na, ea := strconv.Atoi(fa[i])
		nb, eb := strconv.Atoi(fb[i])
		switch {
		case ea == nil && eb == nil && na != nb:
			if na < nb {
				return -1
			}
			return 1
		case ea == nil && eb != nil:
			return -1
		case ea != nil && eb == nil:
			return 1
		case ea != nil && eb != nil && fa[i] != fb[i]:
			return strings.Compare(fa[i], fb[i])
		}
	}
	switch {
	case len(fa) < len(fb):
		return -1
	case len(fa) > len(fb):
		return 1
	}
	return 0
}

// refPlan is what Install does with one reference plugin, decided before
// anything is written.
type refPlan struct {
	name string
	// hostPath is where it goes in the CNI bin dir.
	hostPath string
	// install is the image's binary when it goes in (nil: the node's stays).
	install *source
	// keptSum is the hash of the node's binary that stays ("" when it
	// cannot be read).
	keptSum string
	// version is the build version of the binary the node will run ("":
	// unknown), and what is the path to ask it which CNI versions it speaks
	// (the image's binary when it goes in; "" when there is none).
	version, what string
	// ours: what is the image's binary (a failure to run it is a broken
	// image, not a node's oddity).
	ours bool
	// note says what install-cni did and why.
	note string
}

// purpose says why the node needs a reference plugin.
func purpose(name string) string {
	switch name {
	case "loopback":
		return "the container runtime runs it for every pod"
	case "portmap":
		return "the conflist chains it for hostPort"
	}
	return "the node's other CNI configs may use it"
}

// needed reports whether the node needs a reference plugin: portmap only
// when the conflist chains it; the others always.
func (o Options) needed(name string) bool {
	if name == "portmap" {
		return o.Portmap
	}
	return true
}

func versionOrUnknown(v string) string {
	if v == "" {
		return "(version unknown)"
	}
	return v
}

// planReference decides, for each reference plugin the node needs, whether
// the image's binary goes in or the node's stays: the image's goes in when
// the node has none or an older one; the node's stays when it is as new or
// newer, or when its version cannot be read (it may be newer; it is checked
// afterwards). A plugin the node needs that neither has is an error.
func (o Options) planReference() ([]refPlan, error) {
	var plans []refPlan
	for _, name := range o.ReferencePlugins {
		if name == "" || name != filepath.Base(name) || strings.HasPrefix(name, ".") {
			return nil, fmt.Errorf("reference plugin name %q must be a plain file name", name)
		}
		for _, own := range o.Plugins {
			if own == name {
				return nil, fmt.Errorf("%s is both one of tabby's plugins and a reference plugin: name it once", name)
			}
		}
		if !o.needed(name) {
			continue
		}
		p := refPlan{name: name, hostPath: filepath.Join(o.CNIBinDir, name)}

		// The image's binary.
		imagePath := filepath.Join(o.BinSource, name)
		var img *source
		imageVersion := ""
		switch st, err := os.Stat(imagePath); {
		case errors.Is(err, fs.ErrNotExist):
		case err != nil:
			return nil, fmt.Errorf("reading the plugin binary %s: %w", imagePath, err)
		case !st.Mode().IsRegular():
			return nil, fmt.Errorf("the plugin binary %s is not a regular file", imagePath)
		default:
			sum, err := filehash.SHA256(imagePath)
			if err != nil {
				return nil, fmt.Errorf("reading the plugin binary %s: %w", imagePath, err)
			}
			img = &source{name: name, path: imagePath, mode: 0o755, sum: sum}
			imageVersion, _ = probeBuildVersion(imagePath)
		}

		// The node's.
		st, err := os.Lstat(p.hostPath)
		switch {
		case errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR):
			// (A file where the bin dir belongs is refused when the dir is prepared.)
			if img == nil {
				return nil, fmt.Errorf("%s is neither in the image (%s) nor in %s, and %s: no pod could start. Ship it in the image (hack/build-cni-plugins.sh builds it), or install the containernetworking plugins into %s on the node%s",
					name, o.BinSource, o.CNIBinDir, purpose(name), DefaultCNIBinDir, optOut(name))
			}
			p.install, p.version, p.what, p.ours = img, imageVersion, img.path, true
			p.note = fmt.Sprintf("installed %s %s into %s: %s", name, versionOrUnknown(imageVersion), o.CNIBinDir, purpose(name))
			plans = append(plans, p)
			continue
		case err != nil:
			return nil, fmt.Errorf("reading %s: %w", p.hostPath, err)
		case st.IsDir():
			return nil, fmt.Errorf("%s is a folder where a file belongs: remove it", p.hostPath)
		}
		hostSum, _ := filehash.SHA256(p.hostPath) // "" for a link that leads nowhere from here
		if img != nil && hostSum == img.sum {
			// Ours already (installBinary fixes the mode if need be).
			p.install, p.version, p.what, p.ours = img, imageVersion, img.path, true
			p.note = fmt.Sprintf("%s %s is in %s already (the image's)", name, versionOrUnknown(imageVersion), o.CNIBinDir)
			plans = append(plans, p)
			continue
		}
		hostVersion, whyUnknown := probeBuildVersion(p.hostPath)
		p.keptSum, p.version, p.what = hostSum, hostVersion, p.hostPath
		switch c, ok := CompareBuildVersions(hostVersion, imageVersion); {
		case img == nil:
			p.note = fmt.Sprintf("kept the node's %s %s in %s (the image has none)", name, versionOrUnknown(hostVersion), o.CNIBinDir)
		case whyUnknown != nil:
			p.note = fmt.Sprintf("kept the node's %s in %s: its version cannot be read (%v), so it is not replaced with the image's %s", name, o.CNIBinDir, whyUnknown, versionOrUnknown(imageVersion))
		case !ok:
			p.note = fmt.Sprintf("kept the node's %s %s in %s: it cannot be compared with the image's %s", name, hostVersion, o.CNIBinDir, versionOrUnknown(imageVersion))
		case c > 0:
			p.note = fmt.Sprintf("kept the node's %s %s, newer than the image's %s", name, hostVersion, imageVersion)
		case c == 0:
			p.note = fmt.Sprintf("kept the node's %s %s, the same version as the image's", name, hostVersion)
		default:
			p.install, p.keptSum, p.version, p.what, p.ours = img, "", imageVersion, img.path, true
			p.note = fmt.Sprintf("replaced the node's %s %s in %s with the image's %s, which is newer: %s", name, hostVersion, o.CNIBinDir, imageVersion, purpose(name))
		}
		plans = append(plans, p)
	}
	return plans, nil
}

func optOut(name string) string {
	if name == "portmap" {
		return ", or pass --portmap=false (hostPort will not work)"
	}
	return ", or leave it out of --reference-plugins if the container runtime does without it"
}

// cniVersions asks a plugin binary which CNI versions it speaks (CNI_COMMAND=VERSION).
func cniVersions(path string) ([]string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
	defer cancel()
	info, err := invoke.GetVersionInfo(ctx, path, nil)
	if err != nil {
		return nil, err
	}
	return info.SupportedVersions(), nil
}

// checkKept asks a node's plugin that stays which CNI versions it speaks.
// For loopback it warns when the runtime's call would fail; for a chained
// plugin it returns the versions (nil with a warning when it cannot tell:
// the conflist then assumes FallbackRuntimeCNIVersion).
func (p refPlan) checkKept() (supported []string, warning string) {
	vs, err := cniVersions(p.what)
	switch {
	case err != nil && p.name == "loopback":
		return nil, fmt.Sprintf("the node's loopback in %s does not answer CNI VERSION here (%v): if pods fail with `plugin type=\"loopback\" failed`, remove it and restart the tabby-node pod so install-cni installs the image's", filepath.Dir(p.hostPath), err)
	case err != nil:
		return nil, fmt.Sprintf("the node's %s in %s does not answer CNI VERSION here (%v): assuming it speaks CNI up to %s; if pods fail, remove it and restart the tabby-node pod so install-cni installs the image's", p.name, filepath.Dir(p.hostPath), err, FallbackRuntimeCNIVersion)
	case p.name == "loopback" && !contains(vs, loopbackCNIVersion):
		return vs, fmt.Sprintf("the node's loopback in %s speaks CNI %s but not %s, which containerd runs it with: remove it and restart the tabby-node pod so install-cni installs the image's", filepath.Dir(p.hostPath), strings.Join(vs, ", "), loopbackCNIVersion)
	}
	return vs, ""
}
