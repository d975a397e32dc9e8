package netpol

import (
	"testing"

	"github.com/tabbynet/tabby/internal/controlplane/clustertest"
)

func TestMain(m *testing.M) { clustertest.Main(m, nil) }
