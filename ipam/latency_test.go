package ipam_test

import (
	"fmt"
	"testing"

	"github.com/tabbynet/tabby/ipam"
)

// BenchmarkAssignRelease measures one address assigned from the node's block
// and released, against the real API server (the IPAM part of a CNI ADD+DEL).
func BenchmarkAssignRelease(b *testing.B) {
	ds := client(b)
	fresh(b, ds)
	c := ctx(b)
	mkPool(b, ds, "bench", "10.70.0.0/16", 26)
	m := ipam.New(ds)
	if _, err := m.Assign(c, v4("n.warm", "a")); err != nil { // claim the block first
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := range b.N {
		h := fmt.Sprintf("n.%d", i)
		if _, err := m.Assign(c, v4(h, "a")); err != nil {
			b.Fatal(err)
		}
		if err := m.ReleaseHandle(c, h, "a"); err != nil {
			b.Fatal(err)
		}
	}
}
