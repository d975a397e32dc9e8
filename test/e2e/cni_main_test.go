// Package e2e holds tabby's end-to-end suites. They need root, network
// namespaces and a real control plane (internal/controlplane): as non-root
// they skip saying so; as root they fail with the reason when they cannot
// have them.
//
// The CNI suites (cni*_test.go) build the plugins, then drive them through
// libcni as a container runtime would: the runtime runs on a thread inside
// a network namespace that stands for the node (so exec'd plugins run
// there), pods are namespaces the tests create, and the API server is
// reached through a forwarder on the node's loopback.
package e2e

import (
	"path/filepath"
	"testing"

	"github.com/tabbynet/tabby/internal/controlplane"
	"github.com/tabbynet/tabby/internal/controlplane/clustertest"
	"github.com/tabbynet/tabby/internal/testnet"
)

// cniBinDir holds the tabby and tabby-ipam binaries under test, and
// tabbydBin is tabbyd: from $TABBY_BIN_DIR, else TestMain builds them into
// the control plane's folder.
var cniBinDir, tabbydBin string

func TestMain(m *testing.M) {
	clustertest.Main(m, func(c *controlplane.Cluster) (err error) {
		if cniBinDir, err = testnet.PluginDir(filepath.Join(c.Dir, "cni-bin")); err != nil {
			return err
		}
		tabbydBin, err = testnet.Binary(filepath.Join(c.Dir, "cni-bin"), "tabbyd")
		return err
	})
}
