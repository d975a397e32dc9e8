package podtopologyspread

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/labels"

	"github.com/tabbynet/tabby/scheduler-extender/framework"
)

// Counting a selector's pods on every node reads every pod of the cluster
// (at 50,000 pods some 10 ms of memory-bound work). The counts only change
// with the NodeInfo, and NodeInfos are read-only once a Snapshot holds them
// (the extender's cache replaces a node's NodeInfo on every change), so the
// plugin keeps, per namespace and selector, the counts of the last snapshot
// it saw and recounts only the nodes whose NodeInfo is not the same object:
// the filter and prioritize calls of one pod, and the pods of one workload
// one after another, count the cluster once.

// A table holds on to the NodeInfos of the snapshot it was made for, and
// so to the pods of nodes that changed since: few tables, kept a short
// while, bound what that keeps alive.
const (
	// maxTables bounds the selectors remembered (least recently used go).
	maxTables = 16
	// tableTTL is how long an unused table is kept.
	tableTTL = time.Minute
)

// countTable is the matching pods of every node of a snapshot's List.
type countTable struct {
	list   []*framework.NodeInfo
	counts []int32
	used   time.Time
}

// countCache is the plugin's tables by namespace and selector.
type countCache struct {
	mu     sync.Mutex
	tables map[string]*countTable
	// recounted is how many node counts were worked out (for tests).
	recounted atomic.Int64
}

// expire drops the tables unused for tableTTL; with c.mu held.
func (c *countCache) expire(now time.Time) {
	for k, t := range c.tables {
		if now.Sub(t.used) > tableTTL {
			delete(c.tables, k)
		}
	}
}

func (c *countCache) get(key string) *countTable {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	c.expire(now)
	t := c.tables[key]
	if t != nil {
		t.used = now
	}
	return t
}

func (c *countCache) put(key string, t *countTable) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.tables == nil {
		c.tables = map[string]*countTable{}
	}
	if _, ok := c.tables[key]; !ok && len(c.tables) >= maxTables {
		var oldest string
		for k, o := range c.tables {
			if oldest == "" || o.used.Before(c.tables[oldest].used) {
				oldest = k
			}
		}
		delete(c.tables, oldest)
	}
	t.used = time.Now()
	c.tables[key] = t
}

// sameList says whether two lists are the same slice (a snapshot's List is
// read-only, so the same slice has the same NodeInfos).
func sameList(a, b []*framework.NodeInfo) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}

// podCounts gives, per distinct selector g of cnt, the matching pods of the
// nodes of list (index-aligned) where need[g] is true (and maybe others;
// -1 where not counted); nil for a selector that counts none.
func (pl *Plugin) podCounts(list []*framework.NodeInfo, cnt *counter, need [][]bool) [][]int32 {
	out := make([][]int32, len(cnt.sels))
	for g, sel := range cnt.sels {
		if sel != nil && need[g] != nil {
			out[g] = pl.selectorCounts(list, sel, cnt.ns, need[g])
		}
	}
	return out
}

func (pl *Plugin) selectorCounts(list []*framework.NodeInfo, sel labels.Selector, ns string, need []bool) []int32 {
	key := ns + "\x00" + sel.String()
	old := pl.counts.get(key)
	var counts []int32
	if old != nil && sameList(old.list, list) {
		complete := true
		for n, nd := range need {
			if nd && old.counts[n] < 0 {
				complete = false
				break
			}
		}
		if complete {
			return old.counts
		}
		// Published tables are read-only: fill a copy.
		counts = slices.Clone(old.counts)
	} else {
		counts = make([]int32, len(list))
		for n := range counts {
			counts[n] = -1
		}
		if old != nil {
			// Both lists are sorted by node name: walk them together,
			// keeping the counts of NodeInfos that are the same
			// objects.
			i := 0
			for n, ni := range list {
				for i < len(old.list) && old.list[i] != ni && old.list[i].Node.Name < ni.Node.Name {
					i++
				}
				if i < len(old.list) && old.list[i] == ni {
					counts[n] = old.counts[i]
					i++
				}
			}
		}
	}
	var todo []int32
	for n, nd := range need {
		if nd && counts[n] < 0 {
			todo = append(todo, int32(n))
		}
	}
	pl.counts.recounted.Add(int64(len(todo)))
	pl.parallelize(len(todo), func(lo, hi int) {
		for _, n := range todo[lo:hi] {
			counts[n] = int32(count(list[n].Pods, sel, ns))
		}
	})
	pl.counts.put(key, &countTable{list: list, counts: counts})
	return counts
}
