package bgp

import (
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"
)

// gapWatch polls nodes' learned routes until stopped and records every
// moment a prefix they must always have was missing (a stale route still
// forwards, so it counts as present).
type gapWatch struct {
	stop chan struct{}
	done sync.WaitGroup
	mu   sync.Mutex
	gaps []string
	n    int
}

func watchGaps(c *cluster, prefixes map[int][]netip.Prefix) *gapWatch {
	w := &gapWatch{stop: make(chan struct{})}
	w.done.Add(1)
	go func() {
		defer w.done.Done()
		for {
			select {
			case <-w.stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			for i, want := range prefixes {
				resp, err := c.nodes[i].p.call(helperRequest{Op: "learned"})
				if err != nil {
					continue // the process is being restarted
				}
				have := map[netip.Prefix]bool{}
				for _, r := range resp.Learned {
					have[r.Prefix] = true
				}
				w.mu.Lock()
				w.n++
				for _, p := range want {
					if !have[p] {
						w.gaps = append(w.gaps, fmt.Sprintf("%s node%d had no route to %s", time.Now().Format("15:04:05.000"), i, p))
					}
				}
				w.mu.Unlock()
			}
		}
	}()
	return w
}

// finish stops the watch and fails the test if a prefix was ever missing.
func (w *gapWatch) finish(t *testing.T) {
	t.Helper()
	close(w.stop)
	w.done.Wait()
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.gaps) > 0 {
		t.Errorf("routes went missing (%d of %d polls):\n%s", len(w.gaps), w.n, strings.Join(w.gaps, "\n"))
	}
	t.Logf("%d polls, no route ever missing", w.n)
}

// TestLabGracefulRestart kills node2's speaker and starts it again: the
// other nodes keep its route (stale) meanwhile and get it back fresh within
// seconds, not minutes (kube-router #1323). node2 also peers with a mute
// peer (node4) that never sends End-of-RIB. In plain mode that does not
// matter; in restarting mode GoBGP holds node2's routes back until the
// deferral time (GoBGP's default 360 s; Config.DeferralTime, 5 s) expires.
func TestLabGracefulRestart(t *testing.T) {
	needRoot(t)
	for _, tc := range []struct {
		name string
		cfg  Config
	}{
		{name: "plain", cfg: Config{}},
		{name: "restarting mode", cfg: Config{Restarting: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(t, 3, Config{})
			mute := startProc(t, "mute", c.lab.node(4))
			mute.must(helperRequest{Op: "mute", Config: Config{AS: 64512, RouterID: addrOf(4)}})
			c.extra[2] = []Peer{{Address: addrOf(4), Port: 179, AS: 64512, LocalAddress: addrOf(2), RestartTime: time.Minute, Kind: KindMesh}}
			c.reconcile()
			c.waitFor(1, 20*time.Second, expectRoutes(0, 2, 3))
			c.waitFor(3, 20*time.Second, expectRoutes(0, 1, 2))
			w := watchGaps(c, map[int][]netip.Prefix{1: {blockOf(2), blockOf(3)}, 3: {blockOf(1), blockOf(2)}})
			defer w.finish(t)

			c.nodes[2].p.kill()
			stale := expectRoutes(0, 2) + "(stale) " + expectRoutes(0, 3)
			c.waitFor(1, 10*time.Second, stale)
			time.Sleep(time.Second)

			c.nodes[2].p.spawn()
			restarted := time.Now()
			c.start(2, tc.cfg)
			c.nodes[2].p.must(helperRequest{Op: "peers", Peers: c.desired(2)})
			// When did node1 and node3 get node2's route fresh, and how long
			// after their session with node2 came up?
			fresh, delay := map[int]time.Duration{}, map[int]time.Duration{}
			want := map[int]string{1: expectRoutes(0, 2, 3), 3: expectRoutes(0, 1, 2)}
			eventually(t, 30*time.Second, "node1 and node3 get node2's route fresh", func() (bool, string) {
				for _, i := range []int{1, 3} {
					if _, ok := fresh[i]; ok || routesOf(c.nodes[i].p.learned()) != want[i] {
						continue
					}
					now := time.Now()
					fresh[i] = now.Sub(restarted)
					for _, st := range c.nodes[i].p.states() {
						if st.Address == addrOf(2) {
							delay[i] = now.Sub(st.Since)
						}
					}
				}
				return len(fresh) == 2, fmt.Sprint(fresh)
			})
			for _, i := range []int{1, 3} {
				t.Logf("node%d: node2's route fresh %s after the restart, %s after their session came up",
					i, fresh[i].Round(time.Millisecond), delay[i].Round(time.Millisecond))
				// Generous (the bug took minutes): reconnecting takes up to
				// ~9 s (GoBGP idles 5 s after a session drops, then retries
				// every ConnectRetry), restarting mode adds the deferral.
				bound := 15 * time.Second
				if tc.cfg.Restarting {
					bound += DefaultDeferralTime
				}
				if fresh[i] > bound {
					t.Errorf("node%d: re-advertising took %s, want under %s", i, fresh[i], bound)
				}
				// Uptimes are whole seconds: allow one second either way.
				if tc.cfg.Restarting && delay[i] < DefaultDeferralTime-time.Second {
					t.Errorf("node%d: routes came %s after the session, before the deferral time, though the mute peer never sent End-of-RIB", i, delay[i])
				}
				if !tc.cfg.Restarting && delay[i] > 2*time.Second {
					t.Errorf("node%d: routes came %s after the session; without restarting mode they go out at once", i, delay[i])
				}
			}
			c.waitFor(2, 10*time.Second, expectRoutes(0, 1, 3))
		})
	}
}
