// Package qemutest runs tabby where this machine's kernel cannot: inside a
// qemu VM (TCG) booting Debian's kernel, which has the ipip module.
//
//	go test -count=1 -v -run TestIPIPInQEMU ./test/qemutest/   # make test-ipip
//
// The host side (TestIPIPInQEMU) starts the real control plane on its
// loopback, creates the IP pools, and boots a VM from build.sh's kernel and
// initramfs plus an archive of its own: tabbyd, the tabby CNI plugins, this
// test binary (built again with CGO_ENABLED=0) and /guest.json, which says
// where the API server is as the guest sees it (qemu's user network maps
// 10.0.2.2 to the host's loopback). In the guest, /init runs this binary
// with $TABBY_QEMU_GUEST set, and TestMain runs the guest's part instead
// of the tests: nodes as network namespaces with the real tabbyd, pods
// wired by the real plugin, pings between them, and a line per check on
// the serial console, which the host reads.
package qemutest

import (
	"os"
	"testing"

	"github.com/tabbynet/tabby/internal/controlplane/clustertest"
)

// envGuest names the guest's configuration file; /init sets it.
const envGuest = "TABBY_QEMU_GUEST"

func TestMain(m *testing.M) {
	if path := os.Getenv(envGuest); path != "" {
		os.Exit(guestMain(path))
	}
	clustertest.Main(m, nil)
}
