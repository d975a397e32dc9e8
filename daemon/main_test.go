package daemon

import (
	"testing"

	"github.com/tabbynet/tabby/internal/controlplane/clustertest"
)

// The package's control plane starts for the first test that asks for it
// (clustertest.Cluster/Client) and is shared by the rest.
func TestMain(m *testing.M) { clustertest.Main(m, nil) }
