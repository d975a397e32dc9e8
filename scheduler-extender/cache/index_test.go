package cache

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
	"unique"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tabbynet/tabby/scheduler-extender/framework"
)

// indexOf is the label index worked out from scratch: per label, the
// nodes whose pods carry it, with how many (nodes without a Node too:
// their pods count once the Node comes back).
func indexOf(c *Cache) map[framework.Label]map[string]int32 {
	out := map[framework.Label]map[string]int32{}
	for name, ni := range c.nodes {
		for _, p := range ni.Pods {
			for _, l := range p.Labels {
				if out[l] == nil {
					out[l] = map[string]int32{}
				}
				out[l][name]++
			}
		}
	}
	return out
}

// TestLabelIndexRandom changes pods and nodes at random (pods created,
// relabelled, finished, deleted, assumed, forgotten; nodes deleted and
// added) and checks that the snapshot lists the nodes that have a Node,
// sorted, and after each change that
// the snapshot's incremental label index is the one worked out from
// scratch, and at the end that every earlier snapshot still has the index
// it was taken with (copy-on-write).
func TestLabelIndexRandom(t *testing.T) {
	for seed := range uint64(20) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			r := rand.New(rand.NewPCG(seed, 7))
			c := New()
			const nodes = 6
			for i := range nodes {
				c.SetNode(node(fmt.Sprintf("n%d", i)))
			}
			labelsOf := func() map[string]string {
				m := map[string]string{}
				for _, k := range []string{"app", "tier", "team"} {
					if r.IntN(3) > 0 {
						m[k] = fmt.Sprintf("v%d", r.IntN(3))
					}
				}
				return m
			}
			var uids []string
			type taken struct {
				snap framework.Snapshot
				want map[framework.Label]map[string]int32
			}
			var snaps []taken
			for step := range 300 {
				switch op := r.IntN(10); {
				case op < 4 || len(uids) == 0:
					uid := fmt.Sprintf("p%d", step)
					p := pod(uid, fmt.Sprintf("n%d", r.IntN(nodes)), v1.PodRunning, false)
					p.Labels = labelsOf()
					c.SetPod(p)
					uids = append(uids, uid)
				case op < 6:
					uid := uids[r.IntN(len(uids))]
					p := pod(uid, "", v1.PodRunning, false)
					if cur, ok := c.pods[types.UID(uid)]; ok {
						p.Spec.NodeName = cur.node
					} else {
						p.Spec.NodeName = fmt.Sprintf("n%d", r.IntN(nodes))
					}
					p.Labels = labelsOf()
					c.SetPod(p)
				case op < 7:
					uid := uids[r.IntN(len(uids))]
					c.SetPod(pod(uid, fmt.Sprintf("n%d", r.IntN(nodes)), v1.PodSucceeded, false))
				case op < 8:
					c.DeletePod(types.UID(uids[r.IntN(len(uids))]))
				case op < 9:
					uid := fmt.Sprintf("a%d", step)
					p := pod(uid, "", v1.PodPending, false)
					p.Labels = labelsOf()
					c.Placing(p, true)
					n := fmt.Sprintf("n%d", r.IntN(nodes))
					if _, err := c.AssumePod("ns", uid, p.UID, n); err != nil {
						t.Fatal(err)
					}
					if r.IntN(2) == 0 {
						c.ForgetPod(p.UID, n)
					}
				default:
					// A node goes (its pods stay), comes back, or a new
					// one comes.
					n := fmt.Sprintf("n%d", r.IntN(nodes))
					switch r.IntN(3) {
					case 0:
						c.DeleteNode(n)
					case 1:
						c.SetNode(node(n))
					default:
						c.SetNode(node(fmt.Sprintf("m%d", step)))
					}
				}
				if r.IntN(3) > 0 {
					continue // several changes between snapshots, too
				}
				s := c.Snapshot()
				checkList(t, fmt.Sprintf("step %d", step), c, s)
				want := indexOf(c)
				checkIndex(t, fmt.Sprintf("step %d", step), s, want)
				snaps = append(snaps, taken{s, want})
			}
			for i, s := range snaps {
				checkIndex(t, fmt.Sprintf("snapshot %d at the end", i), s.snap, s.want)
			}
		})
	}
}

func checkIndex(t *testing.T, when string, s framework.Snapshot, want map[framework.Label]map[string]int32) {
	t.Helper()
	is := s.(framework.IndexedSnapshot)
	for _, k := range []string{"app", "tier", "team"} {
		for v := range 3 {
			l := framework.Label{Key: unique.Make(k), Value: unique.Make(fmt.Sprintf("v%d", v))}
			got := is.NodesWithLabel(l)
			if len(got) == 0 && len(want[l]) == 0 {
				continue
			}
			if !maps.Equal(got, want[l]) {
				t.Fatalf("%s: nodes with %s=v%d: index %v, pods %v", when, k, v, got, want[l])
			}
		}
	}
}

// checkList: the snapshot lists every node with a Node, sorted by name.
func checkList(t *testing.T, when string, c *Cache, s framework.Snapshot) {
	t.Helper()
	var want, got []string
	for name, ni := range c.nodes {
		if ni.Node != nil {
			want = append(want, name)
		}
	}
	slices.Sort(want)
	for _, ni := range s.List() {
		got = append(got, ni.Node.Name)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("%s: snapshot lists %v, want %v", when, got, want)
	}
}
