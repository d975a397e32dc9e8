package netpol

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/rest"

	cnpv1 "github.com/tabbynet/tabby/api/cnp/v1beta1"
	tabbyv1 "github.com/tabbynet/tabby/api/v1"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/policy"
)

// World is a snapshot of what every node's policy loop reads, from which a
// trace compiles each node's rules exactly as tabbyd does.
type World struct {
	Pods       []*corev1.Pod
	Namespaces []*corev1.Namespace
	Policies   []*networkingv1.NetworkPolicy
	Blocks     []*tabbyv1.IPAMBlock
	// ClusterPolicies and the Nodes their peers may select.
	ClusterPolicies []*cnpv1.ClusterNetworkPolicy
	Nodes           []*corev1.Node
	// DenyUnlisted is tabbyd's --policy-deny-unlisted (default true).
	DenyUnlisted bool

	endpoints []policy.Endpoint
	rules     map[string]*policy.Ruleset
}

// LoadWorld lists the pods, namespaces, NetworkPolicies,
// ClusterNetworkPolicies (none without their CRD), nodes and IPAM blocks
// through the API server, with tabbyd's default flags.
func LoadWorld(ctx context.Context, rc *rest.Config) (*World, error) {
	ds, err := datastore.New(rc)
	if err != nil {
		return nil, err
	}
	pc, err := NewPolicyClient(rc, "")
	if err != nil {
		return nil, err
	}
	w := &World{DenyUnlisted: true}
	pods, err := ds.Pods("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing pods: %w", err)
	}
	nss, err := ds.Namespaces.List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing namespaces: %w", err)
	}
	nps, err := pc.List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing NetworkPolicies: %w", err)
	}
	blocks, err := ds.IPAMBlocks.List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing IPAM blocks (is tabby installed?): %w", err)
	}
	if err := w.loadClusterPolicies(ctx, rc, ds); err != nil {
		return nil, err
	}
	w.Pods = pointers(pods.Items)
	w.Namespaces = pointers(nss.Items)
	w.Policies = pointers(nps.Items)
	w.Blocks = pointers(blocks.Items)
	return w, nil
}

// loadClusterPolicies lists the ClusterNetworkPolicies as tabbyd reads
// them (one that does not decode is left out, as tabbyd leaves it) and the
// nodes.
func (w *World) loadClusterPolicies(ctx context.Context, rc *rest.Config, ds *datastore.Client) error {
	cpc, err := NewClusterPolicyClient(rc)
	if err != nil {
		return err
	}
	cnps, err := cpc.List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("listing ClusterNetworkPolicies: %w", err)
	}
	w.ClusterPolicies, _ = DecodeClusterPolicies(pointers(cnps.Items))
	nodes, err := ds.Nodes.List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("listing nodes: %w", err)
	}
	w.Nodes = pointers(nodes.Items)
	return nil
}

func pointers[T any](xs []T) []*T {
	out := make([]*T, len(xs))
	for i := range xs {
		out[i] = &xs[i]
	}
	return out
}

// RulesFor compiles node's rules as tabbyd's policy loop does.
func (w *World) RulesFor(node string) *policy.Ruleset {
	if rs, ok := w.rules[node]; ok {
		return rs
	}
	in := BuildInput(node, w.Pods, w.Namespaces, w.Policies, w.Blocks)
	in.DenyUnlisted = w.DenyUnlisted
	in.ClusterPolicies, in.Nodes = w.ClusterPolicies, w.Nodes
	rs := policy.Compile(in)
	if w.rules == nil {
		w.rules = map[string]*policy.Ruleset{}
	}
	w.rules[node] = rs
	return rs
}

// TraceEnd is one end of a traced connection as the user named it.
type TraceEnd struct {
	// Ref is what the user gave: "namespace/name" or an address.
	Ref string `json:"ref"`
	// Pod is the pod ("namespace/name") at that end, "" for an address
	// that is no pod's; Node is the pod's node, HostNetwork whether it
	// shares its node's network (tabby does not police those).
	Pod         string       `json:"pod,omitempty"`
	Node        string       `json:"node,omitempty"`
	HostNetwork bool         `json:"hostNetwork,omitempty"`
	Addrs       []netip.Addr `json:"addresses"`

	pod *corev1.Pod
}

// Resolve finds an end: a pod by "namespace/name", or an address (a pod's
// when a pod has it).
func (w *World) Resolve(ref string) (TraceEnd, error) {
	if w.endpoints == nil {
		w.endpoints = BuildInput("", w.Pods, w.Namespaces, nil, w.Blocks).Endpoints
	}
	if ns, name, ok := strings.Cut(ref, "/"); ok {
		for _, p := range w.Pods {
			if p.Namespace == ns && p.Name == name {
				e := TraceEnd{Ref: ref, Pod: ref, Node: p.Spec.NodeName, HostNetwork: p.Spec.HostNetwork, pod: p}
				for _, ep := range w.endpoints {
					if ep.Pod == p {
						e.Addrs = ep.IPs
					}
				}
				if len(e.Addrs) == 0 {
					return TraceEnd{}, fmt.Errorf("pod %s has no address yet (phase %s): trace it once it is running", ref, p.Status.Phase)
				}
				return e, nil
			}
		}
		return TraceEnd{}, fmt.Errorf("no pod %s (give a pod as namespace/name, or an address)", ref)
	}
	a, err := netip.ParseAddr(ref)
	if err != nil {
		return TraceEnd{}, fmt.Errorf("%q is neither namespace/name of a pod nor an IP address", ref)
	}
	a = a.Unmap()
	for _, ep := range w.endpoints {
		if slices.Contains(ep.IPs, a) {
			return TraceEnd{Ref: ref, Pod: ep.Pod.Namespace + "/" + ep.Pod.Name, Node: ep.Pod.Spec.NodeName, Addrs: []netip.Addr{a}, pod: ep.Pod}, nil
		}
	}
	return TraceEnd{Ref: ref, Addrs: []netip.Addr{a}}, nil
}

// Addr is the end's address of a family (4 or 6), or the zero Addr.
func (e TraceEnd) Addr(family int) netip.Addr {
	for _, a := range e.Addrs {
		if a.Is4() == (family == 4) {
			return a
		}
	}
	return netip.Addr{}
}

// Family picks the family a trace between two ends uses: want when not 0,
// else IPv4 when both ends have it, else IPv6.
func Family(src, dst TraceEnd, want int) (int, error) {
	fams := []int{4, 6}
	if want != 0 {
		fams = []int{want}
	}
	for _, f := range fams {
		if src.Addr(f).IsValid() && dst.Addr(f).IsValid() {
			return f, nil
		}
	}
	if want != 0 {
		return 0, fmt.Errorf("%s (%v) and %s (%v) do not both have an IPv%d address", src.Ref, src.Addrs, dst.Ref, dst.Addrs, want)
	}
	return 0, fmt.Errorf("%s (%v) and %s (%v) share no address family", src.Ref, src.Addrs, dst.Ref, dst.Addrs)
}

// Trace traces a new connection from src to dst in family (4 or 6) through
// the rules tabbyd compiles on the source pod's node and on the
// destination pod's.
func (w *World) Trace(src, dst TraceEnd, family int, proto string, port int) (*policy.ConnectionTrace, error) {
	if src.Pod == "" && dst.Pod == "" {
		return nil, fmt.Errorf("neither %s nor %s is a pod: tabby's policies only apply to pods", src.Ref, dst.Ref)
	}
	return policy.TraceConnection(w.policyEnd(src, family), w.policyEnd(dst, family), proto, port)
}

// policyEnd is the end as the node's rules see it: a pod in its own
// network on a node is policed there through its veth; any other end is
// only an address.
func (w *World) policyEnd(e TraceEnd, family int) policy.TraceEnd {
	pe := policy.TraceEnd{Addr: e.Addr(family)}
	if e.pod == nil || e.HostNetwork || e.Node == "" {
		return pe
	}
	pe.Node, pe.Rules, pe.Iface = e.Node, w.RulesFor(e.Node), HostIface(e.pod)
	return pe
}

// PolicyMatch says whether one NetworkPolicy of a pod's namespace selects
// the pod, for which directions, and why not.
type PolicyMatch struct {
	Policy  string   `json:"policy"`
	Selects bool     `json:"selects"`
	Types   []string `json:"policyTypes,omitempty"`
	Why     string   `json:"why"`
}

// Explain lists the NetworkPolicies of the end's pod's namespace and
// whether each selects it (policies of other namespaces never do).
func (w *World) Explain(e TraceEnd) []PolicyMatch {
	if e.pod == nil {
		return nil
	}
	var out []PolicyMatch
	for _, np := range w.Policies {
		if np.Namespace != e.pod.Namespace {
			continue
		}
		m := PolicyMatch{Policy: np.Namespace + "/" + np.Name, Types: policyTypes(np)}
		sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
		switch {
		case err != nil:
			m.Why = "its podSelector is invalid (" + err.Error() + "): tabbyd skips the policy"
		case e.HostNetwork:
			m.Why = "the pod is in its node's network, which NetworkPolicy does not police"
		case sel.Matches(labels.Set(e.pod.Labels)):
			m.Selects = true
			m.Why = "podSelector " + selectorString(sel) + " matches the pod's labels"
		default:
			m.Why = "podSelector " + selectorString(sel) + " does not match the pod's labels " + labels.Set(e.pod.Labels).String()
		}
		out = append(out, m)
	}
	slices.SortFunc(out, func(a, b PolicyMatch) int { return strings.Compare(a.Policy, b.Policy) })
	return out
}

func selectorString(s labels.Selector) string {
	if s.Empty() {
		return "{} (every pod of the namespace)"
	}
	return "{" + s.String() + "}"
}

// policyTypes are the directions a NetworkPolicy isolates, as the
// compiler enforces them.
func policyTypes(np *networkingv1.NetworkPolicy) []string {
	ingress, egress, _ := policy.PolicyTypes(np)
	var out []string
	if ingress {
		out = append(out, string(networkingv1.PolicyTypeIngress))
	}
	if egress {
		out = append(out, string(networkingv1.PolicyTypeEgress))
	}
	return out
}
