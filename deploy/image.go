package deploy

import (
	_ "embed"
	"fmt"
	"regexp"
	"strings"
)

// ImagePrograms are what tabby's image carries in /usr/local/bin, as
// deploy/Dockerfile builds them: tabby's five programs (cmd/), then the
// reference CNI plugins built from the pinned
// github.com/containernetworking/plugins by hack/build-cni-plugins.sh.
// install-cni copies the plugins from there; the manifests run the others.
var ImagePrograms = []string{
	"tabby", "tabby-ipam", "tabbyd", "tabbyctl", "tabby-scheduler-extender",
	"loopback", "portmap",
}

// ImageBinDir is where the image holds ImagePrograms.
const ImageBinDir = "/usr/local/bin"

// Dockerfile is deploy/Dockerfile, for builders of the same image without
// Docker (the lab) to read the Debian packages from (ImagePackages).
//
//go:embed Dockerfile
var Dockerfile []byte

// packagesRE is the Dockerfile's one line listing the Debian packages the
// image installs.
var packagesRE = regexp.MustCompile(`(?m)^ARG PACKAGES="([^"]*)"\s*$`)

// ImagePackages returns the Debian packages tabby's image installs (with
// apt-get install --no-install-recommends): deploy/Dockerfile's
// ARG PACKAGES line.
func ImagePackages() ([]string, error) { return ParseImagePackages(Dockerfile) }

// ParseImagePackages reads the Debian packages from a Dockerfile's one
// ARG PACKAGES="..." line.
func ParseImagePackages(dockerfile []byte) ([]string, error) {
	m := packagesRE.FindAllSubmatch(dockerfile, -1)
	if len(m) != 1 {
		return nil, fmt.Errorf("the Dockerfile has %d lines ARG PACKAGES=\"...\", want one (the lab reads the image's Debian packages from it)", len(m))
	}
	pkgs := strings.Fields(string(m[0][1]))
	if len(pkgs) == 0 {
		return nil, fmt.Errorf("the Dockerfile's ARG PACKAGES line lists no package")
	}
	return pkgs, nil
}
