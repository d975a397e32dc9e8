package policy

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// This file is a small model of the kernel's filter table and ipsets: it
// runs a packet through the chains and sets of a Ruleset, so tests check
// what the rules do, not how they are spelled, and Trace shows a user what
// the rules tabbyd programs do with one packet. It knows exactly the
// matches and targets the compiler may emit and rejects anything else.

type verdict int

const (
	vReturn verdict = iota // fell off the end of FORWARD: untouched by tabby
	vAccept
	vDrop
)

func (v verdict) String() string {
	return [...]string{"RETURN", "ACCEPT", "DROP"}[v]
}

// pkt is one packet as the FORWARD hook of a node sees it.
type pkt struct {
	src, dst netip.Addr
	proto    string // tcp, udp, sctp, icmp
	dport    int
	in, out  string // interfaces
	ctstate  string // NEW, ESTABLISHED, RELATED, INVALID
	mark     uint32
}

type evalSet struct {
	typ     SetType
	family  string
	ips     map[netip.Addr]bool
	nets    []netip.Prefix
	nomatch []bool
	ipPorts map[string]bool // "ip,proto:port"
	ifaces  []netIface
}

// netIface is a hash:net,iface member.
type netIface struct {
	net   netip.Prefix
	iface string
}

// machine is one family's filter table of one node.
type machine struct {
	family string
	chains map[string][][]string
	sets   map[string]*evalSet
	jumps  [][]string
	parsed map[string][]*rule // "FORWARD" holds the jumps
	// rulesRun counts the rules a packet was matched against.
	rulesRun int
	// trace, when not nil, collects every rule a packet matched (Trace).
	trace *[]TraceStep
}

// newMachine loads a family of a Ruleset; it returns an error for anything
// the kernel would refuse or the model does not know: a missing chain or
// set, a set of the other family, a name over the limits, an unknown match.
func newMachine(rs *Ruleset, family string) (*machine, error) {
	m := &machine{family: family, chains: map[string][][]string{}, sets: map[string]*evalSet{}, parsed: map[string][]*rule{}}
	for _, s := range rs.Sets {
		if s.Family != family {
			continue
		}
		if _, dup := m.sets[s.Name]; dup {
			return nil, fmt.Errorf("set %s listed twice", s.Name)
		}
		es := &evalSet{typ: s.Type, family: s.Family, ips: map[netip.Addr]bool{}, ipPorts: map[string]bool{}}
		for _, mem := range s.Members {
			switch s.Type {
			case SetHashIP:
				a, err := netip.ParseAddr(mem)
				if err != nil || a.Is4() != (family == FamilyIPv4) {
					return nil, fmt.Errorf("set %s: bad member %q", s.Name, mem)
				}
				es.ips[a] = true
			case SetHashNet:
				v, nm := strings.CutSuffix(mem, " nomatch")
				p, err := netip.ParsePrefix(v)
				if err != nil || p.Addr().Is4() != (family == FamilyIPv4) || p.Bits() == 0 || p.Masked() != p {
					return nil, fmt.Errorf("set %s: bad member %q", s.Name, mem)
				}
				es.nets = append(es.nets, p)
				es.nomatch = append(es.nomatch, nm)
			case SetHashIPPort:
				ip, pp, ok := strings.Cut(mem, ",")
				proto, port, ok2 := strings.Cut(pp, ":")
				a, err := netip.ParseAddr(ip)
				n, err2 := strconv.Atoi(port)
				if !ok || !ok2 || err != nil || err2 != nil || a.Is4() != (family == FamilyIPv4) || n < 1 || n > 65535 ||
					(proto != "tcp" && proto != "udp" && proto != "sctp") {
					return nil, fmt.Errorf("set %s: bad member %q", s.Name, mem)
				}
				es.ipPorts[a.String()+","+proto+":"+strconv.Itoa(n)] = true
			case SetHashNetIface:
				// "ip[/bits],iface": the kernel also takes "physdev:" and
				// nomatch, which the compiler never emits.
				v, iface, ok := strings.Cut(mem, ",")
				if !strings.Contains(v, "/") {
					v += "/128"
					if strings.Contains(v, ".") {
						v = strings.TrimSuffix(v, "/128") + "/32"
					}
				}
				p, err := netip.ParsePrefix(v)
				if !ok || err != nil || p.Addr().Is4() != (family == FamilyIPv4) || p.Masked() != p ||
					iface == "" || len(iface) > 15 || strings.ContainsAny(iface, ",/: \t") {
					return nil, fmt.Errorf("set %s: bad member %q", s.Name, mem)
				}
				es.ifaces = append(es.ifaces, netIface{p, iface})
			default:
				return nil, fmt.Errorf("set %s: unknown type %q", s.Name, s.Type)
			}
		}
		// The kernel hashes a hash:net,iface member by its network alone
		// and keeps at most 64 interfaces per network ("Hash is full").
		perNet := map[netip.Prefix]int{}
		for _, x := range es.ifaces {
			if perNet[x.net]++; perNet[x.net] > 64 {
				return nil, fmt.Errorf("set %s: more than 64 interfaces with %s, which the kernel refuses", s.Name, x.net)
			}
		}
		m.sets[s.Name] = es
	}
	for _, c := range rs.Chains {
		if c.Family != family {
			continue
		}
		if _, dup := m.chains[c.Name]; dup {
			return nil, fmt.Errorf("chain %s listed twice in %s", c.Name, family)
		}
		m.chains[c.Name] = c.Rules
	}
	for _, j := range rs.Jumps {
		if j.Chain == "FORWARD" {
			m.jumps = append(m.jumps, j.Rule)
		} else if j.Chain != "INPUT" && j.Chain != "OUTPUT" {
			return nil, fmt.Errorf("jump from unknown chain %s", j.Chain)
		}
	}
	// Every rule must parse and refer to what exists.
	all := map[string][][]string{"FORWARD": m.jumps}
	for n, r := range m.chains {
		if n == "FORWARD" {
			return nil, fmt.Errorf("a Ruleset chain is named FORWARD")
		}
		all[n] = r
	}
	for n, rules := range all {
		for _, r := range rules {
			pr, err := parseRule(r)
			if err != nil {
				return nil, fmt.Errorf("chain %s rule %q: %v", n, r, err)
			}
			m.parsed[n] = append(m.parsed[n], pr)
			for _, sm := range pr.sets {
				if m.sets[sm.name] == nil {
					return nil, fmt.Errorf("chain %s rule %q: set %s is not in the %s sets", n, r, sm.name, family)
				}
				if !setFlags[m.sets[sm.name].typ][sm.flags] {
					return nil, fmt.Errorf("chain %s rule %q: flags %s do not fit set type %s", n, r, sm.flags, m.sets[sm.name].typ)
				}
			}
			switch pr.target {
			case "ACCEPT", "DROP", "RETURN", "MARK", "NFLOG":
			default:
				if _, ok := m.chains[pr.target]; !ok {
					return nil, fmt.Errorf("chain %s rule %q: target chain %s does not exist", n, r, pr.target)
				}
			}
		}
	}
	return m, nil
}

type setMatch struct{ name, flags string }

// setFlags are the flags the compiler may match each set type with: as
// many as the type has dimensions (with fewer the kernel never matches;
// the second flag of hash:net,iface picks the input or output interface).
var setFlags = map[SetType]map[string]bool{
	SetHashIP:       {"src": true, "dst": true},
	SetHashNet:      {"src": true, "dst": true},
	SetHashIPPort:   {"dst,dst": true},
	SetHashNetIface: {"src,src": true, "dst,dst": true},
}

type rule struct {
	args         []string // as the Ruleset spells it
	in, out      string
	proto        string
	ctstates     []string
	markV, markM uint32
	hasMark      bool
	sets         []setMatch
	dports       [][2]int // any of these ranges
	target       string
	goTo         bool
	setV, setM   uint32
}

func parseMarkPair(s string) (uint32, uint32, error) {
	v, m, ok := strings.Cut(s, "/")
	if !ok {
		return 0, 0, fmt.Errorf("mark %q without mask", s)
	}
	a, err := strconv.ParseUint(v, 0, 32)
	if err != nil {
		return 0, 0, err
	}
	b, err := strconv.ParseUint(m, 0, 32)
	if err != nil {
		return 0, 0, err
	}
	if b == 0 || b&^MarkMask != 0 || a&^b != 0 {
		return 0, 0, fmt.Errorf("mark %q leaves tabby's bits %#x", s, MarkMask)
	}
	return uint32(a), uint32(b), nil
}

func parsePorts(s string) ([][2]int, error) {
	var out [][2]int
	for _, p := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(p, ":")
		a, err := strconv.Atoi(lo)
		if err != nil || a < 1 || a > 65535 {
			return nil, fmt.Errorf("bad port %q", p)
		}
		b := a
		if isRange {
			b, err = strconv.Atoi(hi)
			if err != nil || b < a || b > 65535 {
				return nil, fmt.Errorf("bad port range %q", p)
			}
		}
		out = append(out, [2]int{a, b})
	}
	return out, nil
}

func parseRule(args []string) (*rule, error) {
	r := &rule{args: args}
	next := func(i *int) (string, error) {
		*i++
		if *i >= len(args) {
			return "", fmt.Errorf("missing value after %s", args[*i-1])
		}
		if strings.ContainsAny(args[*i], " \t\n\"'") || args[*i] == "" {
			return "", fmt.Errorf("argument %q needs quoting", args[*i])
		}
		return args[*i], nil
	}
	module := ""
	for i := 0; i < len(args); i++ {
		a := args[i]
		var v string
		var err error
		switch a {
		case "-i", "-o", "-p", "-m", "-j", "-g", "--ctstate", "--mark", "--match-set", "--comment", "--dport", "--dports", "--set-xmark":
			if v, err = next(&i); err != nil {
				return nil, err
			}
		case "--hashlimit-upto", "--hashlimit-burst", "--hashlimit-mode", "--hashlimit-name", "--hashlimit-htable-max",
			"--nflog-group", "--nflog-prefix", "--nflog-size":
			// The denied log's (DeniedLog): the rate limit is taken as
			// not reached, and NFLOG decides nothing.
			if !logOption(module, r.target, a) {
				return nil, fmt.Errorf("%s outside -m hashlimit or -j NFLOG", a)
			}
			if _, err = next(&i); err != nil {
				return nil, err
			}
			continue
		default:
			return nil, fmt.Errorf("unknown argument %q", a)
		}
		switch a {
		case "-i":
			r.in = v
		case "-o":
			r.out = v
		case "-p":
			if v != "tcp" && v != "udp" && v != "sctp" {
				return nil, fmt.Errorf("protocol %q", v)
			}
			r.proto = v
		case "-m":
			switch v {
			case "conntrack", "mark", "set", "comment", "multiport", "hashlimit":
			case "tcp", "udp", "sctp":
				if r.proto != v {
					return nil, fmt.Errorf("-m %s without -p %s", v, v)
				}
			default:
				return nil, fmt.Errorf("unknown module %q", v)
			}
			module = v
		case "--ctstate":
			if module != "conntrack" {
				return nil, fmt.Errorf("--ctstate outside -m conntrack")
			}
			r.ctstates = strings.Split(v, ",")
		case "--mark":
			if module != "mark" {
				return nil, fmt.Errorf("--mark outside -m mark")
			}
			r.markV, r.markM, err = parseMarkPair(v)
			r.hasMark = true
		case "--match-set":
			if module != "set" {
				return nil, fmt.Errorf("--match-set outside -m set")
			}
			flags, e := next(&i)
			if e != nil {
				return nil, e
			}
			if flags != "src" && flags != "dst" && flags != "dst,dst" && flags != "src,src" {
				return nil, fmt.Errorf("set flags %q", flags)
			}
			r.sets = append(r.sets, setMatch{v, flags})
		case "--comment":
			if module != "comment" || len(v) > 255 {
				return nil, fmt.Errorf("bad comment")
			}
		case "--dport":
			if module != r.proto || r.proto == "" {
				return nil, fmt.Errorf("--dport outside -m %s", r.proto)
			}
			r.dports, err = parsePorts(v)
			if err == nil && len(r.dports) != 1 {
				err = fmt.Errorf("--dport with a list")
			}
		case "--dports":
			if module != "multiport" || r.proto == "" {
				return nil, fmt.Errorf("--dports outside -m multiport with -p")
			}
			r.dports, err = parsePorts(v)
			slots := 0
			for _, d := range r.dports {
				slots++
				if d[0] != d[1] {
					slots++
				}
			}
			if err == nil && slots > 15 {
				err = fmt.Errorf("multiport with %d ports", slots)
			}
		case "-j", "-g":
			if r.target != "" {
				return nil, fmt.Errorf("two targets")
			}
			r.target, r.goTo = v, a == "-g"
			if v == "MARK" && a == "-g" {
				return nil, fmt.Errorf("-g MARK")
			}
		case "--set-xmark":
			if r.target != "MARK" {
				return nil, fmt.Errorf("--set-xmark without -j MARK")
			}
			r.setV, r.setM, err = parseMarkPair(v)
		}
		if err != nil {
			return nil, err
		}
	}
	if r.target == "" {
		return nil, fmt.Errorf("no target")
	}
	if r.target == "MARK" && r.setM == 0 {
		return nil, fmt.Errorf("-j MARK without --set-xmark")
	}
	if i := len(args) - 2; args[i] != "-j" && args[i] != "-g" && r.target != "MARK" && r.target != "NFLOG" {
		return nil, fmt.Errorf("target not last")
	}
	return r, nil
}

// logOption says whether a hashlimit or NFLOG option is where it
// belongs.
func logOption(module, target, opt string) bool {
	if strings.HasPrefix(opt, "--nflog-") {
		return target == "NFLOG"
	}
	return module == "hashlimit" && target == ""
}

func ifaceMatch(pattern, iface string) bool {
	if p, ok := strings.CutSuffix(pattern, "+"); ok {
		return strings.HasPrefix(iface, p)
	}
	return pattern == iface
}

func (s *evalSet) has(p *pkt, flags string) bool {
	a, iface := p.src, p.in
	if !strings.HasPrefix(flags, "src") {
		a, iface = p.dst, p.out
	}
	switch s.typ {
	case SetHashIP:
		return s.ips[a]
	case SetHashNet:
		best, nm := -1, false
		for i, n := range s.nets {
			if n.Contains(a) && n.Bits() > best {
				best, nm = n.Bits(), s.nomatch[i]
			}
		}
		return best >= 0 && !nm
	case SetHashIPPort:
		return s.ipPorts[a.String()+","+p.proto+":"+strconv.Itoa(p.dport)]
	case SetHashNetIface:
		// The interface is matched by name, exactly (the compiler never
		// sets the wildcard flag); a packet without one never matches.
		if iface == "" || !a.IsValid() {
			return false
		}
		for _, x := range s.ifaces {
			if x.iface == iface && x.net.Contains(a) {
				return true
			}
		}
		return false
	}
	return false
}

func (m *machine) matches(r *rule, p *pkt) bool {
	if r.in != "" && !ifaceMatch(r.in, p.in) {
		return false
	}
	if r.out != "" && !ifaceMatch(r.out, p.out) {
		return false
	}
	if r.proto != "" && r.proto != p.proto {
		return false
	}
	if r.ctstates != nil {
		ok := false
		for _, s := range r.ctstates {
			ok = ok || s == p.ctstate
		}
		if !ok {
			return false
		}
	}
	if r.hasMark && p.mark&r.markM != r.markV {
		return false
	}
	if r.dports != nil {
		ok := false
		for _, d := range r.dports {
			ok = ok || (p.dport >= d[0] && p.dport <= d[1])
		}
		if !ok {
			return false
		}
	}
	for _, s := range r.sets {
		if !m.sets[s.name].has(p, s.flags) {
			return false
		}
	}
	return true
}

// run runs a chain; terminal says ACCEPT or DROP was reached.
func (m *machine) run(name string, p *pkt, depth int) (v verdict, terminal bool) {
	if depth > 16 {
		panic("chain loop through " + name)
	}
	for i, r := range m.parsed[name] {
		m.rulesRun++
		if !m.matches(r, p) {
			continue
		}
		if m.trace != nil {
			*m.trace = append(*m.trace, TraceStep{Chain: name, Rule: i + 1, Args: r.args, Depth: depth})
		}
		switch r.target {
		case "ACCEPT":
			return vAccept, true
		case "DROP":
			return vDrop, true
		case "RETURN":
			return vReturn, false
		case "MARK":
			p.mark = (p.mark &^ r.setM) ^ r.setV
			continue
		case "NFLOG":
			continue
		}
		v, term := m.run(r.target, p, depth+1)
		if term {
			return v, true
		}
		if r.goTo {
			return vReturn, false
		}
	}
	return vReturn, false
}

// forward runs a packet through FORWARD, where tabby's jumps come first.
func (m *machine) forward(p pkt) (verdict, uint32) {
	v, _ := m.run("FORWARD", &p, 0)
	return v, p.mark
}
