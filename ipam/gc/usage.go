package gc

import (
	"math"
	"sort"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// PoolUsage is how much of one IP pool is in use, as a pass saw it (the
// figures Calico's kube-controllers export as ipam_ippool_size,
// ipam_allocations_in_use and ipam_blocks).
type PoolUsage struct {
	Pool string
	// Size is the number of addresses in the pool's CIDR (a float: an IPv6
	// pool holds more than an int64 counts).
	Size float64
	// Allocatable is how many more addresses pods may get from the pool:
	// Size minus Allocated, or 0 for a disabled pool.
	Allocatable float64
	// Allocated is the number of addresses held in the pool's blocks;
	// Blocks the number of blocks carved out of the pool.
	Allocated, Blocks int
}

// PoolUsages is the usage of every pool of s, by pool name. A block that
// lies in no pool (its pool was deleted) counts for none.
func PoolUsages(s *Snapshot) []PoolUsage {
	pools := sortedPools(s.Pools)
	by := map[string]*PoolUsage{}
	disabled := map[string]bool{}
	for _, p := range s.Pools {
		disabled[p.Name] = p.Spec.Disabled
	}
	for _, p := range pools {
		by[p.name] = &PoolUsage{Pool: p.name, Size: math.Ldexp(1, p.prefix.Addr().BitLen()-p.prefix.Bits())}
	}
	for _, b := range s.Blocks {
		u := by[poolOf(b, pools)]
		if u == nil {
			continue
		}
		u.Blocks++
		u.Allocated += len(Allocations(b))
	}
	out := make([]PoolUsage, 0, len(by))
	for _, u := range by {
		if !disabled[u.Pool] {
			u.Allocatable = max(u.Size-float64(u.Allocated), 0)
		}
		out = append(out, *u)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Pool < out[j].Pool })
	return out
}

// poolGauges export the PoolUsages of the last pass. A collector rather
// than GaugeVecs so that a scrape sees one pass's figures whole, and a
// deleted pool's series go with it.
type poolGauges struct {
	size, allocatable, allocated, blocks *prometheus.Desc

	mu    sync.Mutex
	usage []PoolUsage
}

func newPoolGauges() *poolGauges {
	d := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(name, help+" Exported by the tabbyd that leads the IPAM garbage collection (tabby_ipam_gc_leader 1), from its last pass.", []string{"pool"}, nil)
	}
	return &poolGauges{
		size:        d("tabby_ipam_pool_size", "Addresses in the IP pool's CIDR."),
		allocatable: d("tabby_ipam_pool_allocatable", "Addresses pods may still get from the IP pool: its size less those allocated, 0 while the pool is disabled."),
		allocated:   d("tabby_ipam_pool_allocated", "Addresses allocated from the IP pool (pods' and tunnel addresses)."),
		blocks:      d("tabby_ipam_pool_blocks", "Blocks carved out of the IP pool (claimed by nodes or left unaffined)."),
	}
}

// set replaces the exported figures (nil: none, as on a tabbyd that does
// not lead).
func (p *poolGauges) set(u []PoolUsage) {
	p.mu.Lock()
	p.usage = u
	p.mu.Unlock()
}

func (p *poolGauges) Describe(ch chan<- *prometheus.Desc) {
	ch <- p.size
	ch <- p.allocatable
	ch <- p.allocated
	ch <- p.blocks
}

func (p *poolGauges) Collect(ch chan<- prometheus.Metric) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, u := range p.usage {
		ch <- prometheus.MustNewConstMetric(p.size, prometheus.GaugeValue, u.Size, u.Pool)
		ch <- prometheus.MustNewConstMetric(p.allocatable, prometheus.GaugeValue, u.Allocatable, u.Pool)
		ch <- prometheus.MustNewConstMetric(p.allocated, prometheus.GaugeValue, float64(u.Allocated), u.Pool)
		ch <- prometheus.MustNewConstMetric(p.blocks, prometheus.GaugeValue, float64(u.Blocks), u.Pool)
	}
}
