package policy

import (
	"fmt"
	"math/rand"
	"net/netip"
	"reflect"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	cnpv1 "github.com/tabbynet/tabby/api/cnp/v1beta1"
)

// TestIncrementalEqualsCompile: on random sequences of changes to random
// worlds (pods added, removed, relabelled, moved between nodes, given
// other ports; namespaces relabelled; NetworkPolicies and
// ClusterNetworkPolicies added, changed and deleted; invalid ones too,
// and limits small enough to be hit), an Incremental fed every step gives
// exactly (deeply equal) the Ruleset Compile makes of the same Input. As
// informers do, a change replaces an object and never modifies one.
func TestIncrementalEqualsCompile(t *testing.T) {
	seeds, steps := 300, 40
	if testing.Short() {
		seeds = 50
	}
	kept, reused := 0, 0
	for seed := range seeds {
		r := rand.New(rand.NewSource(int64(seed)))
		g := &gen{c: &chooser{r: r}, valid: seed%3 != 0}
		s := newSeqWorld(g, r)
		inc := NewIncremental()
		// Half the seeds keep combinations as tabbyd does (Retention),
		// on a clock that moves a random 0 to 3 minutes a step.
		var ret *Retention
		if seed%2 == 1 {
			ret = &Retention{Max: 1 + r.Intn(4)}
		}
		now := time.Unix(0, 0)
		for step := range steps {
			in := s.input()
			if ret != nil {
				in.Keep = ret.Keep(now)
			}
			got, want := inc.Compile(in), Compile(in)
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("seed %d step %d (after %s): the incremental Ruleset differs from Compile's: %s", seed, step, s.last, rulesetDiff(got, want))
			}
			checkRuleset(t, got)
			if len(inc.pods) > len(in.Endpoints) {
				t.Fatalf("seed %d step %d (after %s): the Incremental remembers %d Pods of an Input of %d endpoints", seed, step, s.last, len(inc.pods), len(in.Endpoints))
			}
			if ret != nil {
				ret.Observe(want, now)
				for _, sg := range want.Signatures {
					if sg.Pods == 0 {
						kept++
					}
				}
				now = now.Add(time.Duration(r.Intn(180)) * time.Second)
			}
			s.change()
		}
		reused += inc.reused
	}
	if kept == 0 {
		t.Error("no Ruleset kept a combination without pods: Input.Keep went untested")
	}
	if reused == 0 {
		t.Error("no compile took its endpoints from memory: reuseEndpoints went untested")
	}
	t.Logf("%d of %d compiles took their endpoints from memory", reused, seeds*steps)
}

// seqWorld is a cluster held as objects, changed one step at a time.
type seqWorld struct {
	g          *gen
	r          *rand.Rand
	w          *world // for the generators' pods and policies
	namespaces []*corev1.Namespace
	endpoints  []Endpoint
	policies   []*networkingv1.NetworkPolicy
	cnps       []*cnpv1.ClusterNetworkPolicy
	limits     Limits
	deny       bool
	log        *DeniedLog
	next       int
	last       string
}

func newSeqWorld(g *gen, r *rand.Rand) *seqWorld {
	w := g.world()
	s := &seqWorld{g: g, r: r, w: w, policies: w.policies, cnps: w.cnps, deny: r.Intn(2) == 0, next: 100}
	if r.Intn(4) == 0 {
		s.limits = Limits{SetMembers: 1 + r.Intn(4), Sets: 1 + r.Intn(6), Rules: 1 + r.Intn(12)}
	}
	in := w.input("n1")
	s.namespaces, s.endpoints = in.Namespaces, in.Endpoints
	return s
}

func (s *seqWorld) input() *Input {
	return &Input{Node: "n1", Namespaces: slices.Clone(s.namespaces), Endpoints: slices.Clone(s.endpoints),
		Policies: slices.Clone(s.policies), ClusterPolicies: slices.Clone(s.cnps), Nodes: s.w.nodeObjs,
		Limits: s.limits, DenyUnlisted: s.deny, DeniedLog: s.log}
}

// change makes one random change, recorded in s.last.
func (s *seqWorld) change() {
	g, r := s.g, s.r
	s.next++
	switch k := r.Intn(13); {
	case k < 3 && len(s.endpoints) > 0: // relabel pods, or give one host networking
		s.last = "relabelling pod"
		for range 1 + r.Intn(2) {
			i := r.Intn(len(s.endpoints))
			p := s.endpoints[i].Pod.DeepCopy()
			switch r.Intn(8) {
			case 0:
				p.Spec.HostNetwork = !p.Spec.HostNetwork
				s.last += " (host network)"
			case 1:
				p.Annotations = map[string]string{"a": fmt.Sprint(s.next)} // the same labels
			default:
				p.Labels = g.labelMap(podKeys, podVals)
			}
			s.endpoints[i].Pod = p
			s.last += " " + p.Namespace + "/" + p.Name
		}
	case k == 3: // add a pod
		ns := pick(g.c, nsNames...)
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("q%d", s.next), Labels: g.labelMap(podKeys, podVals)},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Ports: s.ports()}}}}
		e := Endpoint{Pod: p, IPs: s.addrs()}
		if r.Intn(2) == 0 {
			e.HostIface = fmt.Sprintf("tabq%d", s.next)
		}
		s.endpoints = append(s.endpoints, e)
		s.last = "adding pod " + ns + "/" + p.Name
	case k == 4 && len(s.endpoints) > 0: // remove a pod
		i := r.Intn(len(s.endpoints))
		s.last = "removing pod " + s.endpoints[i].Pod.Name
		s.endpoints = slices.Delete(s.endpoints, i, i+1)
	case k == 5 && len(s.endpoints) > 0: // move a pod, change its ports or addresses
		i := r.Intn(len(s.endpoints))
		e := &s.endpoints[i]
		switch r.Intn(3) {
		case 0:
			if e.HostIface == "" {
				e.HostIface = fmt.Sprintf("tabm%d", s.next)
			} else {
				e.HostIface = ""
			}
		case 1:
			p := e.Pod.DeepCopy()
			p.Spec.Containers[0].Ports = s.ports()
			e.Pod = p
		default:
			e.IPs = s.addrs()
		}
		s.last = "moving or re-porting pod " + e.Pod.Name
	case k == 6 && len(s.namespaces) > 0: // relabel a namespace, or lose it with its pods left
		i := r.Intn(len(s.namespaces))
		if r.Intn(4) == 0 {
			s.last = "deleting namespace " + s.namespaces[i].Name
			s.namespaces = slices.Delete(s.namespaces, i, i+1)
			break
		}
		ns := s.namespaces[i].DeepCopy()
		ns.Labels = g.labelMap(nsKeys[:2], nsVals)
		s.namespaces[i] = ns
		s.last = "relabelling namespace " + ns.Name
	case k == 7: // add a policy
		s.policies = append(s.policies, g.policy(s.next))
		s.last = "adding a policy"
	case k == 8 && len(s.policies) > 0: // change a policy
		i := r.Intn(len(s.policies))
		p := g.policy(s.next)
		p.Name, p.Namespace = s.policies[i].Name, s.policies[i].Namespace
		s.policies[i] = p
		s.last = "changing policy " + p.Namespace + "/" + p.Name
	case k == 9 && len(s.policies) > 0: // delete a policy
		i := r.Intn(len(s.policies))
		s.last = "deleting policy " + s.policies[i].Name
		s.policies = slices.Delete(s.policies, i, i+1)
	case k == 10: // add or change a ClusterNetworkPolicy
		p := g.cnp(s.next)
		if len(s.cnps) > 0 && r.Intn(2) == 0 {
			i := r.Intn(len(s.cnps))
			p.Name = s.cnps[i].Name
			s.cnps[i] = p
		} else {
			s.cnps = append(s.cnps, p)
		}
		s.last = "adding or changing ClusterNetworkPolicy " + p.Name
	case k == 11 && len(s.cnps) > 0:
		i := r.Intn(len(s.cnps))
		s.last = "deleting ClusterNetworkPolicy " + s.cnps[i].Name
		s.cnps = slices.Delete(s.cnps, i, i+1)
	case k == 12: // log what is denied, or not, or at another rate
		s.log = nil
		if r.Intn(3) > 0 {
			s.log = &DeniedLog{Group: uint16(r.Intn(3)), PerSource: r.Intn(3)}
		}
		s.last = fmt.Sprintf("denied log %+v", s.log)
	default:
		s.last = "nothing"
	}
}

func (s *seqWorld) ports() []corev1.ContainerPort {
	var out []corev1.ContainerPort
	for _, p := range []corev1.ContainerPort{
		{Name: "web", ContainerPort: int32(pick(s.g.c, 80, 81)), Protocol: corev1.ProtocolTCP},
		{Name: "dns", ContainerPort: 80, Protocol: corev1.ProtocolUDP},
		{Name: "web", ContainerPort: 82, Protocol: corev1.ProtocolTCP},
	} {
		if s.r.Intn(2) == 0 {
			out = append(out, p)
		}
	}
	return out
}

// addrs are one or two fresh addresses, one in use (a stale IP), or
// none.
func (s *seqWorld) addrs() []netip.Addr {
	n := s.next
	if s.r.Intn(10) == 0 {
		return nil
	}
	if s.r.Intn(8) == 0 && len(s.endpoints) > 0 {
		return slices.Clone(s.endpoints[s.r.Intn(len(s.endpoints))].IPs)
	}
	out := []netip.Addr{netip.MustParseAddr(fmt.Sprintf("10.1.%d.%d", n/250, n%250))}
	if s.r.Intn(2) == 0 {
		out = append(out, netip.MustParseAddr(fmt.Sprintf("fd00:1::%x", n)))
	}
	return out
}

// rulesetDiff says where two Rulesets first differ.
func rulesetDiff(got, want *Ruleset) string {
	gv, wv := reflect.ValueOf(*got), reflect.ValueOf(*want)
	for i := range gv.NumField() {
		if !reflect.DeepEqual(gv.Field(i).Interface(), wv.Field(i).Interface()) {
			return fmt.Sprintf("%s:\n got %+v\nwant %+v", gv.Type().Field(i).Name, gv.Field(i).Interface(), wv.Field(i).Interface())
		}
	}
	return "(no field differs)"
}
