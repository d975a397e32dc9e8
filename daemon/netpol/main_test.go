package netpol

import (
	"testing"

	"github.com/tabbynet/tabby/test/cluster/clustertest"
)

func TestMain(m *testing.M) { clustertest.Main(m, nil) }
