package ipam

import (
	"fmt"
	"net/netip"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	tabbyv1 "github.com/tabbynet/tabby/api/v1"
)

// pool is an IPPool with its parsed CIDR and carving.
type pool struct {
	obj    *tabbyv1.IPPool
	prefix netip.Prefix
	blocks poolBlocks
}

func (p *pool) family() int {
	if p.prefix.Addr().Is4() {
		return 4
	}
	return 6
}

func (p *pool) describe() string {
	return fmt.Sprintf("%s (%s)", p.obj.Name, p.obj.Spec.CIDR)
}

// parsePool accepts a pool IPAM can use: valid by the same rules the API
// server applies (api/v1 Validate), guarding against anything that got past it.
func parsePool(o *tabbyv1.IPPool) (*pool, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	pfx, err := o.Prefix()
	if err != nil {
		return nil, err
	}
	return &pool{obj: o, prefix: pfx.Masked(), blocks: carve(pfx, o.EffectiveBlockSize())}, nil
}

// selectorMatches reports whether a pool's nodeSelector admits the node, and
// the selector as text for messages.
func selectorMatches(o *tabbyv1.IPPool, node *corev1.Node) (bool, string, error) {
	if o.Spec.NodeSelector == nil {
		return true, "", nil
	}
	sel, err := metav1.LabelSelectorAsSelector(o.Spec.NodeSelector)
	if err != nil {
		return false, "", fmt.Errorf("pool %s has an invalid nodeSelector: %w", o.Name, err)
	}
	if sel.Empty() {
		return true, "", nil
	}
	var l labels.Set
	if node != nil {
		l = node.Labels
	}
	return sel.Matches(l), sel.String(), nil
}

// poolSet is every pool, parsed, with the reasons some cannot be used.
type poolSet struct {
	all     []*pool
	invalid map[string]error // by name
}

func newPoolSet(list []tabbyv1.IPPool) *poolSet {
	s := &poolSet{invalid: map[string]error{}}
	// Oldest first, so that when two pools overlap (the admission policy
	// refuses that, but two writes at the same instant can slip past it) the
	// older one is used and the newer one skipped.
	sorted := make([]*tabbyv1.IPPool, len(list))
	for i := range list {
		sorted[i] = &list[i]
	}
	sort.SliceStable(sorted, func(i, j int) bool {
		a, b := sorted[i].CreationTimestamp, sorted[j].CreationTimestamp
		if !a.Equal(&b) {
			return a.Before(&b)
		}
		return sorted[i].Name < sorted[j].Name
	})
	for _, o := range sorted {
		p, err := parsePool(o)
		if err != nil {
			s.invalid[o.Name] = err
			continue
		}
		if other := s.overlapping(o); other != nil {
			s.invalid[o.Name] = fmt.Errorf("pool %s (%s) overlaps the older pool %s: delete one of them", o.Name, o.Spec.CIDR, other.describe())
			continue
		}
		s.all = append(s.all, p)
	}
	// Most specific pool first, so containment lookups find the right one.
	sort.SliceStable(s.all, func(i, j int) bool { return s.all[i].prefix.Bits() > s.all[j].prefix.Bits() })
	return s
}

func (s *poolSet) overlapping(o *tabbyv1.IPPool) *pool {
	for _, p := range s.all {
		if p.obj.Overlaps(o) {
			return p
		}
	}
	return nil
}

func (s *poolSet) byName(name string) *pool {
	for _, p := range s.all {
		if p.obj.Name == name {
			return p
		}
	}
	return nil
}

// containing returns the pool an address or block lies in.
func (s *poolSet) containing(a netip.Addr) *pool {
	for _, p := range s.all {
		if p.prefix.Contains(a) {
			return p
		}
	}
	return nil
}

// candidates picks the pools of one family a request may use on a node,
// with a human explanation for every pool it leaves out.
func (s *poolSet) candidates(family int, names []string, use tabbyv1.IPPoolAllowedUse, node *corev1.Node, nodeName string) ([]*pool, []string, error) {
	var out []*pool
	var excluded []string
	check := func(p *pool) (bool, string, error) {
		if p.family() != family {
			return false, fmt.Sprintf("pool %s is IPv%d, not IPv%d", p.describe(), p.family(), family), nil
		}
		if p.obj.Spec.Disabled {
			return false, fmt.Sprintf("pool %s is disabled", p.describe()), nil
		}
		if !p.obj.AllowsUse(use) {
			return false, fmt.Sprintf("pool %s does not allow use %s (allowedUses)", p.describe(), use), nil
		}
		ok, sel, err := selectorMatches(p.obj, node)
		if err != nil {
			return false, "", err
		}
		if !ok {
			return false, fmt.Sprintf("pool %s: its nodeSelector %q does not match node %s", p.describe(), sel, nodeName), nil
		}
		return true, "", nil
	}
	if len(names) > 0 {
		for _, n := range names {
			p := s.byName(n)
			if p == nil {
				if err, bad := s.invalid[n]; bad {
					return nil, nil, fmt.Errorf("requested pool %q is invalid: %w", n, err)
				}
				return nil, nil, poolMissingError{fmt.Errorf("requested pool %q does not exist: create it or fix the %s annotation", n, poolAnnotation(family))}
			}
			ok, why, err := check(p)
			if err != nil {
				return nil, nil, err
			}
			if !ok {
				return nil, nil, fmt.Errorf("requested %s", why)
			}
			out = append(out, p)
		}
		return out, nil, nil
	}
	for _, p := range s.all {
		ok, why, err := check(p)
		if err != nil {
			excluded = append(excluded, err.Error())
			continue
		}
		if ok {
			out = append(out, p)
		} else if p.family() == family {
			excluded = append(excluded, why)
		}
	}
	for _, err := range s.invalid {
		excluded = append(excluded, err.Error())
	}
	sort.Strings(excluded)
	// Widest pools last: try specific pools first, as the sort already did.
	return out, excluded, nil
}

func poolAnnotation(family int) string {
	if family == 6 {
		return tabbyv1.AnnotationIPv6Pools
	}
	return tabbyv1.AnnotationIPv4Pools
}

func needsNode(list []tabbyv1.IPPool) bool {
	for i := range list {
		if list[i].Spec.NodeSelector != nil {
			return true
		}
	}
	return false
}

func joinReasons(r []string) string {
	if len(r) == 0 {
		return ""
	}
	return "; " + strings.Join(r, "; ")
}
