package apply

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/tabbynet/tabby/internal/netfilter"
	"github.com/tabbynet/tabby/policy"
)

// The two families: index 0 is IPv4 (iptables, ipset family inet), 1 is
// IPv6 (ip6tables, inet6).
const (
	v4 = 0
	v6 = 1
)

var familyNames = [2]string{policy.FamilyIPv4, policy.FamilyIPv6}

// builtins are the filter-table chains Jumps may go into, and the only
// built-in chains the applier ever reads or changes.
var builtins = []string{"INPUT", "FORWARD", "OUTPUT"}

// Kernel limits on names (without the terminating NUL).
const (
	maxSetName   = 31
	maxChainName = 28
)

// desired is a validated Ruleset, in the form the applier compares with
// the kernel: members normalized as `ipset save` prints them.
type desired struct {
	sets     map[string]*wantSet
	setNames []string // sorted
	fams     [2]wantFamily
}

type wantSet struct {
	name   string
	typ    policy.SetType
	family string
	// members maps a member, as `ipset save` prints it, to its nomatch flag.
	members map[string]bool
	// src are the members as the Ruleset listed them: a set listed the
	// same in the next Ruleset is this wantSet again, not parsed anew.
	src []string
}

type wantFamily struct {
	chains map[string][][]string
	order  []string // chain names, in Ruleset order
	// jumps holds, per built-in chain, the rules wanted at its top, in order.
	jumps map[string][][]string
}

// validate checks a Ruleset against what the kernel and this applier
// accept and returns it as a desired state. Families not programmed
// (skip[f]) are left out. Every problem is reported, not just the first:
// a Ruleset that fails here is a compiler bug, and nothing of it is applied.
//
// prev (may be nil) is the previous desired state: a set listed exactly as
// there is taken over (the same *wantSet) rather than parsed again, which
// is what makes a Ruleset that changed a few members cheap to check.
func validate(rs *policy.Ruleset, skip [2]bool, prev *desired) (*desired, error) {
	if rs == nil {
		return nil, errors.New("no Ruleset (nil)")
	}
	v := &validator{d: &desired{sets: map[string]*wantSet{}}, skip: skip, infos: make(map[string]setInfo, len(rs.Sets))}
	if prev != nil {
		v.prev = prev.sets
	}
	for _, s := range rs.Sets {
		v.set(s)
	}
	slices.Sort(v.d.setNames)
	for f := range v.d.fams {
		v.d.fams[f] = wantFamily{chains: map[string][][]string{}, jumps: map[string][][]string{}}
	}
	for _, c := range rs.Chains {
		v.chain(c)
	}
	// Rules once every chain is known: they may jump to any of them.
	for _, c := range rs.Chains {
		v.rules(c)
	}
	for _, j := range rs.Jumps {
		v.jump(j)
	}
	if len(v.errs) > 0 {
		return nil, fmt.Errorf("the Ruleset is invalid, nothing was applied (a compiler bug): %w", errors.Join(v.errs...))
	}
	return v.d, nil
}

// validator is validate's state: the desired state so far, the family and
// type of every set listed (valid or not, so that rules naming a bad set
// are not reported twice as naming a missing one), and the problems.
type validator struct {
	d     *desired
	skip  [2]bool
	infos map[string]setInfo
	errs  []error
	prev  map[string]*wantSet
}

func (v *validator) bad(format string, args ...any) {
	v.errs = append(v.errs, fmt.Errorf(format, args...))
}

// setInfo is what checkRule knows of a set; fam -1: not in the Ruleset.
func (v *validator) setInfo(name string) setInfo {
	if i, ok := v.infos[name]; ok {
		return i
	}
	return setInfo{fam: -1}
}

// named checks the name and family of a set or chain (what) and returns
// the family's index; false when either is bad, which it reports.
func (v *validator) named(what, name, family, prefix string, max int) (int, bool) {
	if err := checkName(name, prefix, max); err != nil {
		v.bad("%s %q: %v", what, name, err)
		return 0, false
	}
	fam := familyIndex(family)
	if fam < 0 {
		v.bad("%s %s: family %q is neither %s nor %s", what, name, family, policy.FamilyIPv4, policy.FamilyIPv6)
		return 0, false
	}
	return fam, true
}

// set checks one set and its members and adds it to the desired state.
func (v *validator) set(s policy.Set) {
	v.infos[s.Name] = setInfo{fam: familyIndex(s.Family), typ: s.Type}
	fam, ok := v.named("set", s.Name, s.Family, policy.SetPrefix, maxSetName)
	if !ok {
		return
	}
	if _, ok := setDims[s.Type]; !ok {
		v.bad("set %s: type %q is not one of %s, %s, %s, %s", s.Name, s.Type, policy.SetHashIP, policy.SetHashNet, policy.SetHashIPPort, policy.SetHashNetIface)
		return
	}
	if v.d.sets[s.Name] != nil {
		v.bad("set %s is listed twice", s.Name)
		return
	}
	if w := v.prev[s.Name]; w != nil && w.typ == s.Type && w.family == s.Family && slices.Equal(w.src, s.Members) {
		if !v.skip[fam] {
			v.d.sets[s.Name] = w
			v.d.setNames = append(v.d.setNames, s.Name)
		}
		return
	}
	w := &wantSet{name: s.Name, typ: s.Type, family: s.Family, members: make(map[string]bool, len(s.Members)), src: s.Members}
	for _, m := range s.Members {
		keys, nomatch, err := normalizeMember(s.Type, fam, m)
		if err != nil {
			v.bad("set %s: member %q: %v", s.Name, m, err)
			continue
		}
		for _, k := range keys {
			w.members[k] = nomatch
		}
	}
	if v.skip[fam] {
		return
	}
	v.d.sets[s.Name] = w
	v.d.setNames = append(v.d.setNames, s.Name)
}

// chain checks a chain's name and family and adds it, rules unchecked.
func (v *validator) chain(c policy.Chain) {
	fam, ok := v.named("chain", c.Name, c.Family, policy.PolicyChainPrefix, maxChainName)
	if !ok || v.skip[fam] {
		return
	}
	wf := &v.d.fams[fam]
	if _, dup := wf.chains[c.Name]; dup {
		v.bad("chain %s (%s) is listed twice", c.Name, c.Family)
		return
	}
	wf.chains[c.Name] = c.Rules
	wf.order = append(wf.order, c.Name)
}

// rules checks a chain's rules: arguments the restore format can carry,
// sets and chains that exist in the same family.
func (v *validator) rules(c policy.Chain) {
	fam := familyIndex(c.Family)
	if fam < 0 || v.skip[fam] {
		return
	}
	for i, r := range c.Rules {
		if err := checkRule(r, fam, v.d.fams[fam].chains, v.setInfo); err != nil {
			v.bad("chain %s (%s) rule %d %q: %v", c.Name, c.Family, i+1, strings.Join(r, " "), err)
		}
	}
}

// jump checks a jump from a built-in chain, which goes into every family
// programmed, and adds it to each.
func (v *validator) jump(j policy.Jump) {
	rule := strings.Join(j.Rule, " ")
	if !slices.Contains(builtins, j.Chain) {
		v.bad("jump %q: chain %q is not one of %s", rule, j.Chain, strings.Join(builtins, ", "))
		return
	}
	if t := netfilter.Target(j.Rule); !strings.HasPrefix(t, policy.PolicyChainPrefix) {
		v.bad("jump %q in %s: its target %q is not a chain starting with %s (only such jumps are tabby's to keep and remove)", rule, j.Chain, t, policy.PolicyChainPrefix)
		return
	}
	ok := true
	for f := range v.d.fams {
		if v.skip[f] {
			continue
		}
		if err := checkRule(j.Rule, f, v.d.fams[f].chains, v.setInfo); err != nil {
			v.bad("jump %q in %s (%s): %v", rule, j.Chain, familyNames[f], err)
			ok = false
		}
	}
	for f := range v.d.fams {
		if ok && !v.skip[f] {
			v.d.fams[f].jumps[j.Chain] = append(v.d.fams[f].jumps[j.Chain], j.Rule)
		}
	}
}

func familyIndex(f string) int {
	switch f {
	case policy.FamilyIPv4:
		return v4
	case policy.FamilyIPv6:
		return v6
	}
	return -1
}

// checkName checks a set or chain name: our prefix, the kernel's length
// limit, and nothing that the restore formats would split.
func checkName(name, prefix string, max int) error {
	if !strings.HasPrefix(name, prefix) {
		return fmt.Errorf("does not start with %s", prefix)
	}
	if len(name) > max {
		return fmt.Errorf("is %d bytes long, more than the kernel's %d", len(name), max)
	}
	if i := strings.IndexFunc(name, func(r rune) bool { return r <= ' ' || r == '"' || r == '\'' || r == '\\' || r > '~' }); i >= 0 {
		return fmt.Errorf("contains %q", name[i])
	}
	return nil
}

// setInfo is what checkRule needs to know of a set: family (-1: not in
// the Ruleset) and type.
type setInfo struct {
	fam int
	typ policy.SetType
}

// setDims are the set types the applier accepts, with their number of
// dimensions: a --match-set with fewer src/dst flags than that never
// matches (the kernel does not complain), so the applier refuses it.
var setDims = map[policy.SetType]int{
	policy.SetHashIP:       1,
	policy.SetHashNet:      1,
	policy.SetHashIPPort:   2,
	policy.SetHashNetIface: 2,
}

// checkRule checks one rule of family fam: arguments that iptables-restore
// can read, every set it matches (ours) is in the Ruleset with the rule's
// family and is given a flag (src or dst) for each of its dimensions, and
// every tabby chain it jumps or goes to is a chain of the family.
func checkRule(rule []string, fam int, chains map[string][][]string, setFamily func(string) setInfo) error {
	if len(rule) == 0 {
		return errors.New("empty rule")
	}
	for i, a := range rule {
		if a == "" {
			return fmt.Errorf("argument %d is empty", i+1)
		}
		for j := 0; j < len(a); j++ {
			if c := a[j]; c == '\n' || c == '\r' || c == 0 {
				return fmt.Errorf("argument %d %q contains a line break or NUL", i+1, a)
			}
		}
		if a[0] != '-' {
			continue
		}
		switch a {
		case "-4", "--ipv4", "-6", "--ipv6":
			return fmt.Errorf("argument %q: families are given by Chain.Family, not in rules", a)
		}
		if (a == "--match-set" || a == "--set") && i+1 < len(rule) {
			name := rule[i+1]
			if !strings.HasPrefix(name, policy.SetPrefix) {
				continue // somebody else's set: the kernel will say if it is missing
			}
			si := setFamily(name)
			switch {
			case si.fam < 0:
				return fmt.Errorf("matches the set %s, which the Ruleset does not list", name)
			case si.fam != fam:
				return fmt.Errorf("matches the set %s of family %s in a %s rule", name, familyNames[si.fam], familyNames[fam])
			}
			if a == "--match-set" {
				var flags []string
				if i+2 < len(rule) {
					flags = strings.Split(rule[i+2], ",")
				}
				for _, f := range flags {
					if f != "src" && f != "dst" {
						return fmt.Errorf("matches the set %s with flags %q: want src or dst for each of its dimensions, comma-separated", name, strings.Join(flags, ","))
					}
				}
				if n := setDims[si.typ]; len(flags) < n {
					return fmt.Errorf("matches the %s set %s with %d flag(s) %q: it has %d dimensions and would never match (e.g. %s)",
						si.typ, name, len(flags), strings.Join(flags, ","), n, strings.TrimSuffix(strings.Repeat("src,", n), ","))
				}
			}
		}
	}
	if t := netfilter.Target(rule); strings.HasPrefix(t, policy.ChainPrefix) {
		if !strings.HasPrefix(t, policy.PolicyChainPrefix) {
			return fmt.Errorf("jumps to %s, which is not a policy chain (%s…)", t, policy.PolicyChainPrefix)
		}
		if _, ok := chains[t]; !ok {
			return fmt.Errorf("jumps to %s, which is not a %s chain of the Ruleset", t, familyNames[fam])
		}
	}
	return nil
}

// normalizeMember returns a set member as `ipset save` prints it (the
// kernel's canonical form), and whether it is a nomatch entry. A hash:net
// /0, which the kernel cannot hold, becomes its two halves.
func normalizeMember(typ policy.SetType, fam int, m string) (keys []string, nomatch bool, err error) {
	fields := strings.Fields(m)
	switch {
	case len(fields) == 2 && fields[1] == "nomatch" && (typ == policy.SetHashNet || typ == policy.SetHashNetIface):
		nomatch = true
	case len(fields) != 1:
		return nil, false, errors.New(`want one address (hash:ip), CIDR (hash:net, optionally followed by " nomatch"), address,proto:port (hash:ip,port) ` +
			`or address,interface (hash:net,iface, optionally followed by " nomatch")`)
	}
	v := fields[0]
	addr := func(s string) (netip.Addr, error) {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return a, fmt.Errorf("not an IP address: %w", err)
		}
		if a.Zone() != "" {
			return a, errors.New("an address with a zone cannot be a set member")
		}
		if fam == v4 {
			a = a.Unmap()
		}
		if a.Is4() != (fam == v4) {
			return a, fmt.Errorf("not an %s address", familyNames[fam])
		}
		return a, nil
	}
	switch typ {
	case policy.SetHashIP:
		if p, err := netip.ParsePrefix(v); err == nil && p.Bits() == p.Addr().BitLen() {
			v = p.Addr().String()
		}
		a, err := addr(v)
		if err != nil {
			return nil, false, err
		}
		return []string{a.String()}, false, nil
	case policy.SetHashNet:
		p, err := prefix(v, addr)
		if err != nil {
			return nil, false, err
		}
		if p.Bits() == 0 {
			if nomatch {
				return nil, false, errors.New("a /0 cannot be nomatch")
			}
			hi := netip.AddrFrom4([4]byte{128})
			if fam == v6 {
				hi = netip.AddrFrom16([16]byte{0x80})
			}
			return []string{netip.PrefixFrom(p.Addr(), 1).String(), netip.PrefixFrom(hi, 1).String()}, false, nil
		}
		if p.Bits() == p.Addr().BitLen() {
			return []string{p.Addr().String()}, nomatch, nil
		}
		return []string{p.String()}, nomatch, nil
	case policy.SetHashIPPort:
		a, pp, ok := strings.Cut(v, ",")
		proto, port, ok2 := strings.Cut(pp, ":")
		if !ok || !ok2 {
			return nil, false, errors.New("want address,proto:port, e.g. 10.0.0.1,tcp:80")
		}
		ad, err := addr(a)
		if err != nil {
			return nil, false, err
		}
		proto = strings.ToLower(proto)
		if proto != "tcp" && proto != "udp" && proto != "sctp" {
			return nil, false, fmt.Errorf("protocol %q is not tcp, udp or sctp", proto)
		}
		n, err := strconv.Atoi(port)
		if err != nil || n < 0 || n > 65535 {
			return nil, false, fmt.Errorf("port %q is not a number 0-65535 (ranges are not accepted)", port)
		}
		return []string{ad.String() + "," + proto + ":" + strconv.Itoa(n)}, false, nil
	case policy.SetHashNetIface:
		// As `ipset save` prints it: a host address without its /32 or
		// /128, a network masked; the interface as given ("physdev:" for a
		// bridge port). A /0 is kept: the kernel holds it, if with at most
		// 64 interfaces.
		a, iface, ok := strings.Cut(v, ",")
		if !ok {
			return nil, false, errors.New("want address[/prefix],interface, e.g. 10.244.1.5,tab0123456789a")
		}
		if err := checkIface(strings.TrimPrefix(iface, "physdev:")); err != nil {
			return nil, false, err
		}
		p, err := prefix(a, addr)
		if err != nil {
			return nil, false, err
		}
		if p.Bits() == p.Addr().BitLen() {
			return []string{p.Addr().String() + "," + iface}, nomatch, nil
		}
		return []string{p.String() + "," + iface}, nomatch, nil
	}
	return nil, false, fmt.Errorf("unknown set type %q", typ)
}

// prefix parses an address or CIDR of the family addr accepts, masked; an
// address is a host prefix.
func prefix(v string, addr func(string) (netip.Addr, error)) (netip.Prefix, error) {
	a, bits, isNet := strings.Cut(v, "/")
	ad, err := addr(a)
	if err != nil {
		return netip.Prefix{}, err
	}
	if !isNet {
		return netip.PrefixFrom(ad, ad.BitLen()), nil
	}
	n, err := strconv.Atoi(bits)
	if err != nil || n < 0 || n > ad.BitLen() {
		return netip.Prefix{}, fmt.Errorf("prefix length %q is not 0-%d", bits, ad.BitLen())
	}
	return netip.PrefixFrom(ad, n).Masked(), nil
}

// checkIface checks an interface name as Linux accepts it: 1-15 bytes,
// not "." or "..", no "/", ":" or whitespace (and no "," here, which
// would split the member).
func checkIface(name string) error {
	if name == "" || len(name) > 15 || name == "." || name == ".." {
		return fmt.Errorf("interface %q is not a name of 1-15 bytes", name)
	}
	if i := strings.IndexFunc(name, func(r rune) bool { return r <= ' ' || r == '/' || r == ':' || r == ',' || r > '~' }); i >= 0 {
		return fmt.Errorf("interface %q contains %q", name, name[i])
	}
	return nil
}

func equalRules(a, b [][]string) bool {
	return slices.EqualFunc(a, b, slices.Equal[[]string])
}
