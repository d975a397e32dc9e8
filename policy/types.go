// Package policy compiles Kubernetes NetworkPolicies into what tabbyd
// programs into the kernel: ipsets and iptables chains in the filter table.
//
// The compiler (Compile) is a pure function: Pods, Namespaces and
// NetworkPolicies in, a Ruleset out. The applier (package policy/apply)
// makes the kernel match a Ruleset; it owns only sets named tabby-np-… and
// chains named TABBY-NP-…, and touches the built-in chains only through the
// Jumps of a Ruleset.
//
// Where policy applies: to forwarded traffic in from or out to a local
// pod's veth — pod to pod on one node (the source's egress and the
// destination's ingress both apply), a local pod to anywhere else (its
// egress), anywhere else to a local pod (its ingress; a remote source's own
// egress is its node's business). Traffic the node itself sends to its pods
// (kubelet probes) goes through OUTPUT and traffic pods send to their own
// node's addresses through INPUT: neither is touched, as Kubernetes
// expects ("traffic to and from the node where a Pod is running is always
// allowed"). Replies of accepted connections pass (conntrack).
package policy

import (
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"

	cnpv1 "github.com/tabbynet/tabby/api/cnp/v1beta1"
	"github.com/tabbynet/tabby/contract"
)

// Names every set and chain tabby owns starts with.
const (
	SetPrefix   = "tabby-np-"
	ChainPrefix = contract.ChainPrefix
	// PolicyChainPrefix starts the name of every chain a Ruleset holds
	// (it starts with ChainPrefix): the applier may delete any chain of the
	// filter table with this prefix that the Ruleset does not list, and must
	// leave other TABBY- chains (routing's) alone.
	PolicyChainPrefix = ChainPrefix + "NP-"
)

// DefaultHostVethPrefix starts the name of every host-side veth tabby's CNI
// plugin creates. Input.HostVethPrefix overrides it.
const DefaultHostVethPrefix = contract.HostVethPrefix

// DeviceIfacePrefix starts the names of tabby's own devices (tabby.vxlan),
// which also start with DefaultHostVethPrefix but are no pod's veth (a veth
// is "tab" and 11 hex digits, never "tabby…"): the rules treat them as
// any other non-pod interface, and no Endpoint may use such a HostIface.
const DeviceIfacePrefix = contract.DeviceIfacePrefix

// Address families, as ipset names them (Set.Family, Chain.Family).
const (
	FamilyIPv4 = "inet"
	FamilyIPv6 = "inet6"
)

// The packet mark bits the rules use: a policy chain sets MarkAllowed when
// one of its rules allows the packet (a ClusterNetworkPolicy's Accept), a
// ClusterNetworkPolicy chain sets MarkPass for a Pass, the per-pod chain
// tests them, and TABBY-NP-POD clears both again before accepting, so
// nothing else sees them. The rules only ever touch these bits (every
// --mark and --set-xmark mask is within MarkMask).
const (
	MarkAllowed = 0x10000
	MarkPass    = 0x20000
	// MarkMask holds every bit tabby's rules touch.
	MarkMask = MarkAllowed | MarkPass
)

// The fixed chains of a Ruleset (both families). Hashed chain names are
// PolicyChainPrefix + "E-", "I-", "PE-" or "PI-" and 14 base32 characters.
const (
	// ChainForward is the only chain jumped to from a built-in chain
	// (FORWARD). It sends traffic in from or out to a pod veth
	// (-i/-o HostVethPrefix+ but not DeviceIfacePrefix+) to ChainPod and
	// returns everything else.
	ChainForward = PolicyChainPrefix + "FORWARD"
	// ChainPod accepts RELATED,ESTABLISHED, drops INVALID, runs the
	// source pod's egress (ChainFromPod, when in from a pod veth) and the
	// destination pod's ingress (ChainToPod, when out to a pod veth), each
	// of which drops what its policies deny, then clears MarkAllowed and
	// ACCEPTs.
	ChainPod = PolicyChainPrefix + "POD"
	// ChainFromPod dispatches a packet in from a local pod's veth to the
	// chain of the egress policies selecting that pod, by set membership:
	// one rule per distinct combination of egress policies,
	// "-m set --match-set tabby-np-e4-<h> src,src -g TABBY-NP-E-<H>", whose
	// hash:net,iface set holds "<pod IP>,<veth>" of every local pod that
	// combination selects. A pod coming, going or changing labels changes
	// members; the rules change only when a combination gains its first
	// pod or loses its last. Past DispatchFlatMax combinations these
	// rules move to bucket chains (ChainFromPod + "-0" … "-f"), and
	// ChainFromPod tests each bucket's set instead (DispatchBuckets).
	ChainFromPod = PolicyChainPrefix + "FROM-POD"
	// ChainToPod is the same for ingress, on the destination address and
	// the output interface: "-m set --match-set tabby-np-i4-<h> dst,dst
	// -g TABBY-NP-I-<H>", in buckets as ChainFromPod's.
	ChainToPod = PolicyChainPrefix + "TO-POD"
)

// UnselectedSetName is the name of the hash:net,iface set of the local
// pods ("<pod IP>,<veth>") that no policy of a direction (egress or not:
// ingress) selects, in one family, which the dispatch chains return for
// with Input.DenyUnlisted: "tabby-np-u4-egress", "tabby-np-u6-ingress"…
// A pod is in exactly one set of each direction: that of the policies
// selecting it, or this one; a pod no set holds (not known yet) is
// dropped. So when a pod's policies change, the applier's order (members
// added, chains written, members removed) never lets its traffic through
// unpoliced.
func UnselectedSetName(family string, egress bool) string {
	d, dir := "4", "ingress"
	if family == FamilyIPv6 {
		d = "6"
	}
	if egress {
		dir = "egress"
	}
	return SetPrefix + "u" + d + "-" + dir
}

// Input is everything the compiler reads.
type Input struct {
	// Node is the name of the node being programmed: only its endpoints
	// (Endpoint.HostIface set) get chains.
	Node       string
	Namespaces []*corev1.Namespace
	// Endpoints are the pods of the whole cluster that have addresses,
	// local and remote: a policy's peers may be anywhere.
	Endpoints []Endpoint
	Policies  []*networkingv1.NetworkPolicy
	// ClusterPolicies are the ClusterNetworkPolicies: their Admin tier
	// runs before Policies, their Baseline tier where no NetworkPolicy
	// selects the pod in that direction.
	ClusterPolicies []*cnpv1.ClusterNetworkPolicy
	// Nodes give the addresses of ClusterNetworkPolicy egress peers that
	// select nodes (their InternalIP and ExternalIP addresses).
	Nodes []*corev1.Node

	// HostVethPrefix is the prefix of the host-side veth names of local
	// pods; "" means DefaultHostVethPrefix. Only traffic in from or out to
	// an interface with this prefix is looked at. A prefix that is not 1-14
	// of [A-Za-z0-9_.-] is replaced by DefaultHostVethPrefix.
	HostVethPrefix string
	// DenyUnlisted drops traffic in from or out to a host veth with the
	// prefix that is no local Endpoint's HostIface, or that is one but
	// with a pod address (the source in from it, the destination out to
	// it) that is not one of that Endpoint's IPs, so a pod the Ruleset
	// does not know yet is default-denied rather than open. Off, such
	// traffic is accepted as for a pod no policy selects.
	DenyUnlisted bool
	// Limits bound what one policy may expand to; zero fields take the
	// defaults.
	Limits Limits
	// DeniedLog, when set, logs what the per-pod chains drop (NFLOG,
	// rate-limited in the kernel); Ruleset.Denials say what each log
	// prefix stands for.
	DeniedLog *DeniedLog
	// Keep are combinations of policies (Ruleset.Signatures of earlier
	// compiles) whose TABBY-NP-E-/I- chain stays in the Ruleset while no
	// local pod has the combination: the chain, the policies' chains it
	// jumps to, its dispatch rule and its dispatch set, empty. An empty
	// set's rule matches nothing, so what is kept changes no verdict; what
	// it saves is chain changes, each an iptables-restore of the whole
	// filter table: a pod whose labels flip and flip back, or that is
	// replaced by a pod with the same labels, then moves between dispatch
	// sets only. An entry is left out when a policy it names is not in
	// the input (or no longer covers its direction), when its policies
	// are not a combination a pod could have (Policies in the order they
	// run: the ClusterNetworkPolicies', then the NetworkPolicies' sorted),
	// or when its family is not one of FamilyIPv4 and FamilyIPv6. The
	// caller decides how long to keep what (tabbyd: Retention).
	Keep []Signature
}

// Limits bound the ipsets and iptables rules one NetworkPolicy may make on
// a node, so that no policy (written by any tenant allowed to write one)
// can make the node's whole ruleset fail to load or take the node's time.
// A policy over a limit is reported (a Problem with Limit set) and
// enforced fail closed: it isolates the pods it selects in the directions
// it covers and allows them nothing, while the node's other policies,
// including those selecting the same pods, are enforced as written. Its
// sets are not made.
type Limits struct {
	// SetMembers bounds the members of each ipset a policy's rules name
	// (its ipBlocks, the pods of its selector peers, a named port's
	// addresses); DefaultMaxSetMembers when 0. tabbyd creates sets with
	// a maxelem of 1<<20, which it must stay below.
	SetMembers int
	// Sets bounds the distinct ipsets (both families together) a policy's
	// rules name; DefaultMaxPolicySets when 0.
	Sets int
	// Rules bounds the iptables rules of a policy's chains (ingress and
	// egress, in each family); DefaultMaxPolicyRules when 0.
	Rules int
}

// Default Limits: far above what real policies make (an ipBlock with
// excepts takes one member per CIDR, a rule at most three sets per family
// and one iptables rule per kind of peer and 15 ports), and far below what
// slows a sync down or what the kernel refuses.
const (
	DefaultMaxSetMembers  = 65536
	DefaultMaxPolicySets  = 1024
	DefaultMaxPolicyRules = 4096
)

// The tabbyd flags that set each limit, named in the Problems of policies
// over it so that the message says what to change.
const (
	FlagMaxSetMembers = "policy-max-set-members"
	FlagMaxPolicySets = "policy-max-sets"
	FlagMaxRules      = "policy-max-rules"
)

// withDefaults fills the zero (or negative) limits with the defaults.
func (l Limits) withDefaults() Limits {
	if l.SetMembers <= 0 {
		l.SetMembers = DefaultMaxSetMembers
	}
	if l.Sets <= 0 {
		l.Sets = DefaultMaxPolicySets
	}
	if l.Rules <= 0 {
		l.Rules = DefaultMaxPolicyRules
	}
	return l
}

// Endpoint is a pod with its addresses.
type Endpoint struct {
	// Pod gives namespace, labels and containerPorts (named ports).
	Pod *corev1.Pod
	// IPs of the pod: from IPAM as soon as they are allocated, or from
	// status.podIPs.
	IPs []netip.Addr
	// HostIface is the host side of the pod's veth when the pod runs on
	// Input.Node, "" for a pod elsewhere. It must start with the host veth
	// prefix and be a valid interface name, or the pod is reported in
	// Problems and not programmed.
	HostIface string
}

// Ruleset is the whole desired state of the filter table and the ipsets.
//
// Families: every chain is listed once per family (Chain.Family), with the
// same name in both; the rules differ only in the sets they name, which are
// per family (Set.Family; a set's name says its family). The applier loads
// ChainsFor(FamilyIPv4) with iptables-restore and ChainsFor(FamilyIPv6) with
// ip6tables-restore, creates SetsFor(family) in ipset, and puts the same
// Jumps in both tables. Rule content never depends on which pods carry
// which labels or which pods exist, only on the policies and on which
// distinct combinations of them select some local pod: pods coming, going
// or changing labels, here or elsewhere, change set members, and chains
// only when a combination of policies gains its first local pod or loses
// its last.
//
// Dispatch to a local pod's chains is by (address, veth): a packet in from
// a pod's veth is that pod's when its source address is one of the pod's
// (Endpoint.IPs), one out to its veth when its destination address is. A
// packet on a pod's veth with an address that is not the pod's (spoofed,
// or of a family the Endpoint has no address in) is treated as traffic of
// a veth no Endpoint claims: dropped with DenyUnlisted, accepted without.
//
// Layout (filter table, both families):
//
//	FORWARD          -m comment --comment tabby:network-policy -j TABBY-NP-FORWARD   (the one Jump)
//	TABBY-NP-FORWARD -i tabby+ -o tabby+ -j RETURN      (tabby's own devices, tabby.vxlan,
//	                 -i tabby+ -o tab+ -j TABBY-NP-POD  are not pod veths; these three and
//	                 -i tabby+ -j RETURN                the "-o tabby+ -j RETURN" are left out
//	                 -i tab+ -j TABBY-NP-POD            when the veth prefix is not "tab")
//	                 -o tabby+ -j RETURN
//	                 -o tab+ -j TABBY-NP-POD
//	                 (everything else returns to FORWARD untouched)
//	TABBY-NP-POD     -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
//	                 -m conntrack --ctstate INVALID -j DROP
//	                 -i tab+ -j TABBY-NP-FROM-POD     (drops what egress denies)
//	                 -o tab+ -j TABBY-NP-TO-POD       (drops what ingress denies)
//	                 -j MARK --set-xmark 0x0/0x10000
//	                 -j ACCEPT
//	TABBY-NP-FROM-POD -m set --match-set tabby-np-e4-<h> src,src -g TABBY-NP-E-<H>
//	                  one per distinct set of egress policies selecting some local pod,
//	                  sorted by chain name; the hash:net,iface set holds "<IP>,<veth>"
//	                  for each address of each local pod those policies select, and
//	                  <h> is <H> in lower case; only in the families some of those pods
//	                  have an address of (a set and rule that would be empty are left out)
//	                  (with DenyUnlisted, then:
//	                  "-m set --match-set tabby-np-u4-egress src,src -j RETURN" for
//	                  the local pods no egress policy selects (UnselectedSetName),
//	                  "-i tabby+ -j RETURN", "-j DROP")
//	TABBY-NP-TO-POD   -m set --match-set tabby-np-i4-<h> dst,dst -g TABBY-NP-I-<H>
//	                  the same for ingress, on the destination address and the
//	                  output interface (with DenyUnlisted, tabby-np-u4-ingress,
//	                  "-o tabby+ -j RETURN", "-j DROP")
//	TABBY-NP-E-<h>   one chain per distinct set of egress policies selecting a pod (pods share it),
//	                 in the families its dispatch set is (those of its pods' addresses):
//	                 -j MARK --set-xmark 0x0/0x30000
//	                 -m comment --comment cnp-admin:<name> -j TABBY-NP-CE-<h>   per Admin ClusterNetworkPolicy,
//	                 ...                                                  by priority then name
//	                 -m mark --mark 0x10000/0x10000 -j RETURN            (Admin accepted)
//	                 -j MARK --set-xmark 0x0/0x30000                     (Admin passed or did not match)
//	                 -m comment --comment <ns/policy> -j TABBY-NP-PE-<h>            per policy, sorted
//	                 -m mark --mark 0x10000/0x10000 -j RETURN
//	                 ...
//	                 (with Input.DeniedLog: -m hashlimit … -j NFLOG --nflog-prefix tabby:E-<H>; see DeniedLog)
//	                 -j DROP
//	                 (the Admin lines only with Admin policies; without NetworkPolicies,
//	                 instead of them and the DROP: a jump to each Baseline policy's
//	                 TABBY-NP-CE-<h>, and what falls off the end is allowed)
//	TABBY-NP-I-<h>   the same for ingress, jumping to TABBY-NP-PI-<h>
//	TABBY-NP-PE-<h>  one chain per policy with egress: every rule that allows a
//	                 packet is "<port match> <peer match> -j MARK --set-xmark 0x10000/0x10000"
//	TABBY-NP-PI-<h>  the same for ingress
//	TABBY-NP-CE-<h>  one chain per ClusterNetworkPolicy with egress rules selecting a local pod:
//	                 each rule, in order, is "-m mark --mark 0x0/0x30000 <port match> <peer match>"
//	                 and "-j MARK --set-xmark 0x10000/0x30000" (Accept), "... 0x20000/0x30000"
//	                 (Pass) or "-j DROP" (Deny): the first rule of the tier to match decides
//	TABBY-NP-CI-<h>  the same for ingress
//	                 (the TABBY-NP-P*- and C*- chains of a family are those a per-pod chain of
//	                 the family jumps to, and its sets those a rule of the family names: a
//	                 node whose pods are IPv4 only has no policy chain or peer set in IPv6)
//
// Peer matches are "-m set --match-set tabby-np-p4-<h> src|dst" (pod IPs of
// selector peers, hash:ip) and "-m set --match-set tabby-np-n4-<h> src|dst"
// (the rule's ipBlocks, hash:net: their cidrs, and their excepts as nomatch
// entries, exact under the kernel's longest-prefix match; see netMembers);
// a rule allowing
// several kinds of peer has one rule per kind. A rule's selector peers make
// at most two p sets: one of its podSelector-only peers (pods of the
// policy's namespace) and one of its namespaceSelector peers (with or
// without a podSelector). The p set's <h> hashes the selectors it holds
// (and, for the first kind, the namespace), so the namespaceSelector part
// of rules with the same selectors in any number of policies and
// namespaces is one set, not a copy of the wide part per namespace. Port
// matches are "-p tcp", "-p tcp -m tcp --dport 80[:90]",
// "-p tcp -m multiport --dports 80,81,90:95" and, for a
// named port, "-p tcp -m set --match-set tabby-np-q4-<h> dst,dst" in egress
// (hash:ip,port of every pod's IP and port of that name: the destination
// may be any pod) and "-p tcp -m set --match-set tabby-np-l4-<h> dst,dst" in
// ingress (the same of the local pods only: an ingress chain only sees
// packets to a local pod); each is there only when a rule of its direction
// names the port. Sets are "…4-…" for IPv4 and "…6-…" for IPv6.
type Ruleset struct {
	// Sets are every ipset tabby wants, names starting with SetPrefix and at
	// most 26 bytes long (the kernel allows 31, which leaves room for a
	// temporary name to swap with), sorted by name. Every set a rule names
	// is listed, possibly empty, and no other; a set's name depends only on what defines
	// its members (the peer group's selectors, the exact CIDRs, the port name,
	// the combination of policies of a dispatch set) and its family, so pod
	// churn only changes members. The applier must create sets and add
	// members before loading chains naming them, remove members only after
	// (so a pod moving to a dispatch set that only the new chains name is
	// never in none), and destroy a set only after no chain names it.
	Sets []Set
	// Chains are every chain tabby wants in the filter table, names starting
	// with PolicyChainPrefix and at most 26 bytes long (the kernel allows
	// 28), sorted by Family then Name.
	Chains []Chain
	// Jumps are the rules tabby keeps at the top of built-in chains of the
	// filter table, in order: today exactly one, at position 1 of FORWARD
	// (before kube-proxy's and Docker's rules),
	// "-m comment --comment tabby:network-policy -j TABBY-NP-FORWARD".
	Jumps []Jump
	// Problems are the policies the compiler could not accept; every other
	// policy is still compiled. Sorted by Namespace, Name, Kind, Message.
	Problems []Problem
	// Programmed lists, for each local endpoint ("namespace/name"), that
	// this Ruleset enforces everything that selects it: the applier reports
	// it programmed once the Ruleset is in the kernel. It is every local,
	// non-hostNetwork Endpoint with a usable HostIface, sorted.
	Programmed []string
	// Denials say, with Input.DeniedLog, what each NFLOG prefix of the
	// rules stands for (one per TABBY-NP-E-/I- chain), sorted by Prefix.
	Denials []Denial
	// Signatures are the TABBY-NP-E-/I- chains, one per combination of
	// policies selecting local pods in a direction and family, and those
	// kept (Input.Keep), sorted by Family and Chain.
	Signatures []Signature
}

// Signature is a TABBY-NP-E-/I- chain: one combination of policies that
// select local pods in one direction, in one family.
type Signature struct {
	Chain     string
	Family    string // FamilyIPv4 or FamilyIPv6
	Direction string // "ingress" or "egress"
	// Policies are the keys of the policies, in the order the chain runs
	// them: ClusterNetworkPolicies ("cnp:<name>"), then NetworkPolicies
	// ("<namespace>/<name>").
	Policies []string
	// Pods is how many addresses of local pods its dispatch set holds: 0
	// for a combination only Input.Keep holds.
	Pods int
}

// SetType is an ipset type.
type SetType string

// Set types tabby uses.
const (
	SetHashIP  SetType = "hash:ip"
	SetHashNet SetType = "hash:net"
	// SetHashIPPort members are "<ip>,<proto>:<port>", e.g. "10.0.0.1,tcp:80"
	// or "fd00::1,sctp:9000"; rules match it with "dst,dst".
	SetHashIPPort SetType = "hash:ip,port"
	// SetHashNetIface members are "<ip>,<iface>" (or "<cidr>,<iface>"),
	// e.g. "10.244.1.5,tab0123456789a"; rules match it with "src,src" (the
	// source address and the input interface) or "dst,dst" (the
	// destination address and the output interface). The kernel keeps at
	// most 64 interfaces per distinct address or CIDR, so tabby only puts
	// pod addresses in it, never a /0.
	SetHashNetIface SetType = "hash:net,iface"
)

// Set is one ipset.
type Set struct {
	Name string
	Type SetType
	// Family is "inet" or "inet6".
	Family string
	// Members are addresses (hash:ip), CIDRs (hash:net), address,port
	// pairs (hash:ip,port) or address,interface pairs (hash:net,iface),
	// sorted (as strings) and unique. With hash:net a member may end in
	// " nomatch" (an ipBlock's except): the kernel lets the longest prefix
	// holding an address decide, so "10.0.0.0/8" and "10.1.0.0/16 nomatch"
	// match 10.0.0.0/8 but not 10.1.0.0/16. A prefix is never listed both
	// ways, and never as a /0, which hash:net cannot hold.
	Members []string
}

// Chain is one chain tabby owns; Rules are iptables rule specs without the
// "-A CHAIN" part, e.g. {"-m", "set", "--match-set", "tabby-x", "src", "-j", "ACCEPT"}.
//
// Rule arguments never contain spaces or quotes, so joining them with " "
// gives a valid iptables-restore line.
type Chain struct {
	Name string
	// Family is FamilyIPv4 (iptables) or FamilyIPv6 (ip6tables). Every
	// chain appears once per family.
	Family string
	Rules  [][]string
}

// Jump is a rule tabby keeps in a built-in chain; the same in both families
// (iptables and ip6tables).
type Jump struct {
	Chain string // FORWARD, INPUT or OUTPUT
	Rule  []string
}

// Problem is a policy (or endpoint) the compiler refused, and why; the
// Message names the field (e.g. spec.ingress[0].from[1].ipBlock.except[0]),
// what is wrong with it, and what is enforced meanwhile.
//
// What is still enforced: a policy whose podSelector is invalid is skipped
// whole (the compiler cannot tell which pods it isolates). A policy over
// the Limits allows nothing but still isolates the pods it selects. Any
// other error drops only the ingress or egress rule it is in: that rule
// allows nothing, but the policy still isolates the pods it selects and
// its other rules still allow (failing closed, never open). An Endpoint
// problem (Kind "Pod": an unusable HostIface) leaves that pod
// unprogrammed.
type Problem struct {
	Namespace, Name string
	Message         string
	// Kind is "NetworkPolicy", "ClusterNetworkPolicy" (no Namespace) or
	// "Pod".
	Kind string
	// Limit is set when the policy is over one of the Limits: the flag
	// that raises it (FlagMaxSetMembers, FlagMaxPolicySets or
	// FlagMaxRules); "" for every other problem.
	Limit string
}

// Problem kinds.
const (
	KindNetworkPolicy = "NetworkPolicy"
	KindPod           = "Pod"
)

// ChainsFor returns the chains of one family (FamilyIPv4 or FamilyIPv6).
func (r *Ruleset) ChainsFor(family string) []Chain {
	var out []Chain
	for _, c := range r.Chains {
		if c.Family == family {
			out = append(out, c)
		}
	}
	return out
}

// SetsFor returns the sets of one family (FamilyIPv4 or FamilyIPv6).
func (r *Ruleset) SetsFor(family string) []Set {
	var out []Set
	for _, s := range r.Sets {
		if s.Family == family {
			out = append(out, s)
		}
	}
	return out
}
