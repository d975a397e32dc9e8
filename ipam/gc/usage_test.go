package gc

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	tabbyv1 "github.com/tabbynet/tabby/api/v1"
)

func TestPoolUsages(t *testing.T) {
	pod := func(ord int) held { return held{ord: ord, attr: podAttr("default", "p", "n1", &t0)} }
	// pool0 10.0.0.0/24 holds pool1 10.0.0.0/28 (most specific wins).
	nested := pools("10.0.0.0/24", "10.0.0.0/28")
	disabled := pools("10.1.0.0/16")
	disabled[0].Spec.Disabled = true
	for _, tc := range []struct {
		name string
		snap Snapshot
		want []PoolUsage
	}{
		{"no pools", Snapshot{Blocks: []*tabbyv1.IPAMBlock{mkBlock("10.9.0.0/30", "n1", pod(0))}}, []PoolUsage{}},
		{"empty pool", Snapshot{Pools: pools("10.0.0.0/16")},
			[]PoolUsage{{Pool: "pool0", Size: 65536, Allocatable: 65536}}},
		{"blocks and allocations, a block of a deleted pool counts for none", Snapshot{
			Pools: pools("10.0.0.0/16", "fd00::/56"),
			Blocks: []*tabbyv1.IPAMBlock{
				mkBlock("10.0.0.0/30", "n1", pod(0), pod(1)),
				mkBlock("10.0.0.4/30", "", pod(3)),
				mkBlock("10.0.0.8/30", "n2"),
				mkBlock("fd00::/126", "n1", pod(2)),
				mkBlock("10.9.0.0/30", "n1", pod(0)),
			}},
			[]PoolUsage{
				{Pool: "pool0", Size: 65536, Allocatable: 65533, Allocated: 3, Blocks: 3},
				{Pool: "pool1", Size: 1 << 72, Allocatable: 1<<72 - 1, Allocated: 1, Blocks: 1},
			}},
		{"nested pools", Snapshot{Pools: nested, Blocks: []*tabbyv1.IPAMBlock{
			mkBlock("10.0.0.0/30", "n1", pod(0)), mkBlock("10.0.0.16/30", "n1", pod(0), pod(1)),
		}}, []PoolUsage{
			{Pool: "pool0", Size: 256, Allocatable: 254, Allocated: 2, Blocks: 1},
			{Pool: "pool1", Size: 16, Allocatable: 15, Allocated: 1, Blocks: 1},
		}},
		{"a disabled pool allocates nothing more", Snapshot{Pools: disabled, Blocks: []*tabbyv1.IPAMBlock{mkBlock("10.1.0.0/30", "n1", pod(1))}},
			[]PoolUsage{{Pool: "pool0", Size: 65536, Allocated: 1, Blocks: 1}}},
		{"a corrupted block holds nothing countable", Snapshot{Pools: pools("10.0.0.0/16"), Blocks: []*tabbyv1.IPAMBlock{
			{Spec: tabbyv1.IPAMBlockSpec{CIDR: "10.0.0.0/30", Allocations: []int{0}}},
		}}, []PoolUsage{{Pool: "pool0", Size: 65536, Allocatable: 65536, Blocks: 1}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if d := cmp.Diff(tc.want, PoolUsages(&tc.snap)); d != "" {
				t.Errorf("PoolUsages (-want +got):\n%s", d)
			}
		})
	}
}
