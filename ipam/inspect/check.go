package inspect

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"sort"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"

	tabbyv1 "github.com/tabbynet/tabby/api/v1"
	"github.com/tabbynet/tabby/ipam"
)

// Kind names a kind of finding.
type Kind string

// The kinds of findings, in the order Check reports them.
const (
	// DoubleBooked: one address in the status of two live pods, or
	// allocated twice (by overlapping blocks).
	DoubleBooked Kind = "double-booked"
	// Misattributed: a live pod uses an address IPAM records for someone
	// else; releasing it would hand it to a second pod.
	Misattributed Kind = "misattributed"
	// UnallocatedInUse: a live pod uses an address of a pool that IPAM has
	// free, so IPAM may hand it to another pod.
	UnallocatedInUse Kind = "unallocated-in-use"
	// Leaked: an allocation whose pod does not exist, has finished, or has
	// other addresses now (or a tunnel address its node replaced).
	Leaked Kind = "leaked"
	// DeletedNode: an allocation or a block of a node that does not exist.
	DeletedNode Kind = "deleted-node"
	// HandleMismatch: an IPAMHandle records other addresses than the blocks
	// hold for it.
	HandleMismatch Kind = "handle-mismatch"
	// BlockWithoutAffinity: a block of a node without its BlockAffinity, or
	// a block of no node.
	BlockWithoutAffinity Kind = "block-without-affinity"
	// AffinityWithoutBlock: a BlockAffinity whose block does not exist.
	AffinityWithoutBlock Kind = "affinity-without-block"
	// AffinityMismatch: a BlockAffinity names another node than its block.
	AffinityMismatch Kind = "affinity-mismatch"
	// BlockOutsidePool: a block no pool contains, or whose size is not its
	// pool's blockSize.
	BlockOutsidePool Kind = "block-outside-pool"
	// OverlappingBlocks: two blocks share addresses.
	OverlappingBlocks Kind = "overlapping-blocks"
	// CorruptedBlock: a block whose arrays are inconsistent.
	CorruptedBlock Kind = "corrupted-block"
	// Pending: an allocation of a live pod that is not in the pod's status
	// yet (a CNI ADD in progress), or a claim in progress. A note.
	Pending Kind = "pending"
	// HandleMissing: addresses of a live holder that no IPAMHandle records.
	// CNI DEL still finds them in the node's blocks. A note.
	HandleMissing Kind = "handle-missing"
)

var kindOrder = []Kind{DoubleBooked, Misattributed, UnallocatedInUse, Leaked, DeletedNode, HandleMismatch,
	BlockWithoutAffinity, AffinityWithoutBlock, AffinityMismatch, BlockOutsidePool, OverlappingBlocks,
	CorruptedBlock, Pending, HandleMissing}

// Severity says whether a finding is wrong (a problem, check exits non-zero)
// or worth knowing (a note).
type Severity string

const (
	Problem Severity = "problem"
	Note    Severity = "note"
)

// Finding is one thing Check found.
type Finding struct {
	Kind     Kind     `json:"kind"`
	Severity Severity `json:"severity"`
	// IP is the address concerned, when one is.
	IP string `json:"ip,omitempty"`
	// Block is the CIDR of the block concerned, when one is.
	Block  string `json:"block,omitempty"`
	Node   string `json:"node,omitempty"`
	Handle string `json:"handle,omitempty"`
	// Pods are the pods concerned, as namespace/name.
	Pods []string `json:"pods,omitempty"`
	// Object is the object concerned, as resource/name (ipamhandle/x,
	// blockaffinity/x, ipamblock/x).
	Object string `json:"object,omitempty"`
	// Message says what is wrong.
	Message string `json:"message"`
	// Fix says what to do about it.
	Fix string `json:"fix,omitempty"`
	// Command is a shell command that fixes it, when one does (Fix then
	// includes it); empty for notes and for what needs repair by hand.
	Command string `json:"command,omitempty"`
}

// run sets the command that fixes a finding, and the fix: the command and
// why (when why is not empty).
func (f *Finding) run(command, why string) {
	f.Command, f.Fix = command, command
	if why != "" {
		f.Fix += " (" + why + ")"
	}
}

// none says that nothing needs doing.
func (f *Finding) none(fix string) { f.Command, f.Fix = "", fix }

// CheckReport is `tabbyctl ipam check`.
type CheckReport struct {
	// OK is true when there is no problem (notes may remain).
	OK       bool      `json:"ok"`
	Problems int       `json:"problems"`
	Notes    int       `json:"notes"`
	Findings []Finding `json:"findings"`
	Checked  Checked   `json:"checked"`
	// Revision is the resourceVersion of the snapshot ("" when the objects
	// were not read as one consistent cut).
	Revision string `json:"revision,omitempty"`
	// Transient counts problems only one of two looks (Confirm) found:
	// work in flight, such as a CNI DEL between freeing its addresses and
	// deleting its handle. They are not in Findings.
	Transient int `json:"transient,omitempty"`
}

// Confirm keeps the problems of later that earlier found too (the same
// kind about the same address or object): a problem seen once may be an
// ADD or DEL caught half way. later's notes are kept as they are.
func Confirm(earlier, later CheckReport) CheckReport {
	seen := map[string]bool{}
	for _, f := range earlier.Findings {
		if f.Severity == Problem {
			seen[f.key()] = true
		}
	}
	out := later
	out.Findings, out.Problems, out.Notes = []Finding{}, 0, 0
	out.Transient = later.Transient
	for _, f := range later.Findings {
		switch {
		case f.Severity != Problem:
			out.Notes++
		case seen[f.key()]:
			out.Problems++
		default:
			out.Transient++
			continue
		}
		out.Findings = append(out.Findings, f)
	}
	for k := range seen {
		found := false
		for _, f := range later.Findings {
			found = found || (f.Severity == Problem && f.key() == k)
		}
		if !found {
			out.Transient++
		}
	}
	out.OK = out.Problems == 0
	return out
}

func (f Finding) key() string {
	return strings.Join([]string{string(f.Kind), f.IP, f.Block, f.Object, f.Handle, strings.Join(f.Pods, ",")}, "|")
}

// Checked counts what was looked at.
type Checked struct {
	Pools       int `json:"pools"`
	Blocks      int `json:"blocks"`
	Allocations int `json:"allocations"`
	Handles     int `json:"handles"`
	Affinities  int `json:"affinities"`
	Pods        int `json:"pods"`
	Nodes       int `json:"nodes"`
}

// Check finds what is wrong with the IPAM state: every finding says what
// to do about it.
func Check(s *Snapshot, o Options) CheckReport {
	x := newIndex(s, o)
	var out []Finding
	out = append(out, x.checkAllocations()...)
	out = append(out, x.checkPodAddresses()...)
	out = append(out, x.checkHandles()...)
	out = append(out, x.checkBlocks()...)
	out = append(out, x.checkAffinities()...)
	sortFindings(out)
	rep := CheckReport{Findings: out, Revision: s.Revision, Checked: Checked{
		Pools: len(s.Pools), Blocks: len(s.Blocks), Allocations: len(x.allocs), Handles: len(s.Handles),
		Affinities: len(s.Affinities), Pods: len(s.Pods), Nodes: len(s.Nodes),
	}}
	if rep.Findings == nil {
		rep.Findings = []Finding{}
	}
	for _, f := range out {
		if f.Severity == Problem {
			rep.Problems++
		} else {
			rep.Notes++
		}
	}
	rep.OK = rep.Problems == 0
	return rep
}

func releaseFix(ip netip.Addr) string { return "tabbyctl ipam release --ip " + ip.String() }

func deletePodFix(pods []*corev1.Pod) string {
	var cmds []string
	for _, p := range pods {
		cmds = append(cmds, "kubectl delete pod -n "+p.Namespace+" "+p.Name)
	}
	return strings.Join(cmds, "; ")
}

func podNames(pods []*corev1.Pod) []string {
	var out []string
	for _, p := range pods {
		out = append(out, p.Namespace+"/"+p.Name)
	}
	return out
}

func allTerminating(pods []*corev1.Pod) bool {
	for _, p := range pods {
		if p.DeletionTimestamp == nil {
			return false
		}
	}
	return len(pods) > 0
}

// describe names an allocation's holder.
func describe(a *allocation) string {
	switch {
	case a.attr.Pod != "":
		return fmt.Sprintf("pod %s (handle %s)", a.podKey(), a.attr.HandleID)
	case a.attr.Use == tabbyv1.UseTunnel:
		return fmt.Sprintf("node %s's tunnel (handle %s)", a.attr.Node, a.attr.HandleID)
	case ipam.IsSpareHandle(a.attr.HandleID):
		return fmt.Sprintf("node %s's spare (handle %s)", a.attr.Node, a.attr.HandleID)
	}
	return "handle " + a.attr.HandleID
}

func where(a *allocation) string {
	if a.block.node != "" {
		return fmt.Sprintf("block %s (node %s)", a.block.cidr(), a.block.node)
	}
	return fmt.Sprintf("block %s", a.block.cidr())
}

// checkAllocations judges every allocation by what became of its holder.
func (x *index) checkAllocations() []Finding {
	var out []Finding
	for _, a := range x.allocs {
		users := x.users[a.ip]
		if len(users) > 1 || len(x.byIP[a.ip]) > 1 {
			continue // double-booked: checkPodAddresses reports it once per address
		}
		f := Finding{IP: a.ip.String(), Block: a.block.cidr(), Node: a.attr.Node, Handle: a.attr.HandleID}
		if a.attr.Pod != "" {
			f.Pods = []string{a.podKey()}
		}
		state, why := x.holderState(a)
		if len(users) == 1 {
			u := users[0]
			if x.holds(u, a) {
				continue
			}
			if ipam.IsSpareHandle(a.attr.HandleID) && u.Spec.NodeName == a.attr.Node && u.DeletionTimestamp == nil {
				// Handed to the pod by its node's tabbyd, which moves it to
				// the pod's handle a moment later (its spares journal).
				f.Kind, f.Severity, f.Pods = Pending, Note, []string{u.Namespace + "/" + u.Name}
				f.Message = fmt.Sprintf("pod %s/%s uses %s, which tabbyd on node %s handed it from %s; the block records it as the pod's once tabbyd writes the handover", u.Namespace, u.Name, a.ip, a.attr.Node, describe(a))
				f.none("none while tabbyd on node " + a.attr.Node + " runs; if it lasts, its log says why")
				out = append(out, f)
				continue
			}
			f.Kind, f.Severity, f.Pods = Misattributed, Problem, append([]string{u.Namespace + "/" + u.Name}, f.Pods...)
			f.Message = fmt.Sprintf("pod %s/%s uses %s (its status lists it), but IPAM records it for %s in %s: %s",
				u.Namespace, u.Name, a.ip, describe(a), where(a), why)
			f.run(deletePodFix(users), "it restarts with an address IPAM records for it; do not release "+a.ip.String()+" while the pod runs")
			if u.DeletionTimestamp != nil {
				f.Severity = Note
				f.Message += "; the pod is terminating"
				f.none("none: it clears when the pod is gone")
			}
			out = append(out, f)
			continue
		}
		switch state {
		case StatePending, StateRecent:
			f.Kind, f.Severity = Pending, Note
			f.Message = fmt.Sprintf("%s is allocated to %s in %s: %s", a.ip, describe(a), where(a), why)
			f.none("none while the pod starts; if it lasts, tabbyctl ipam show --ip " + a.ip.String())
		case StateOtherAddresses, StateFinished, StateReplaced:
			f.Kind, f.Severity = Leaked, Problem
			f.Message = fmt.Sprintf("%s is allocated to %s in %s, but %s", a.ip, describe(a), where(a), why)
			f.run(releaseFix(a.ip), "")
		case StateMissing, StateNodeGone:
			f.Kind, f.Severity = Leaked, Problem
			if _, ok := x.nodes[a.attr.Node]; !ok && a.attr.Node != "" {
				f.Kind = DeletedNode
				why += fmt.Sprintf(", and its node %s does not exist", a.attr.Node)
			}
			f.Message = fmt.Sprintf("%s is allocated to %s in %s, but %s", a.ip, describe(a), where(a), why)
			f.run(releaseFix(a.ip), "")
		default:
			continue
		}
		out = append(out, f)
	}
	return out
}

// checkPodAddresses looks at the addresses live pods use: two pods on one
// address, an address IPAM has free, an address allocated twice.
func (x *index) checkPodAddresses() []Finding {
	var out []Finding
	seen := map[netip.Addr]bool{}
	var ips []netip.Addr
	for ip := range x.users {
		ips = append(ips, ip)
	}
	for ip, as := range x.byIP {
		if len(as) > 1 && len(x.users[ip]) <= 1 {
			ips = append(ips, ip)
		}
	}
	sort.Slice(ips, func(i, j int) bool { return ips[i].Less(ips[j]) })
	for _, ip := range ips {
		if seen[ip] {
			continue
		}
		seen[ip] = true
		users, allocs := x.users[ip], x.byIP[ip]
		pool := x.poolOf(netip.PrefixFrom(ip, ip.BitLen()))
		if len(allocs) == 0 && pool == nil {
			continue // not tabby's address (another network, or a host address)
		}
		f := Finding{IP: ip.String(), Pods: podNames(users)}
		if len(allocs) > 0 {
			f.Block, f.Node, f.Handle = allocs[0].block.cidr(), allocs[0].attr.Node, allocs[0].attr.HandleID
		}
		switch {
		case len(users) > 1 || len(allocs) > 1:
			f.Kind, f.Severity = DoubleBooked, Problem
			var parts []string
			if len(users) > 1 {
				both := "all"
				if len(users) == 2 {
					both = "both"
				}
				parts = append(parts, fmt.Sprintf("live pods %s %s list %s in their status", joinList(f.Pods), both, ip))
			}
			var holders []string
			for _, a := range allocs {
				holders = append(holders, describe(a)+" in "+where(a))
			}
			switch {
			case len(allocs) > 1:
				parts = append(parts, fmt.Sprintf("%s is allocated %d times, by overlapping blocks: to %s", ip, len(allocs), strings.Join(holders, " and ")))
			case len(allocs) == 1:
				parts = append(parts, "IPAM records it for "+holders[0])
			default:
				parts = append(parts, "IPAM has it free")
			}
			f.Message = strings.Join(parts, "; ")
			var others []*corev1.Pod
			var holderRuns bool
			for _, u := range users {
				isHolder := false
				for _, a := range allocs {
					isHolder = isHolder || x.holds(u, a)
				}
				if isHolder {
					holderRuns = true
				} else {
					others = append(others, u)
				}
			}
			switch {
			case len(allocs) > 1:
				f.Fix = "repair by hand: delete the block that should not exist (see overlapping-blocks) once its pods are gone"
			case holderRuns && allTerminating(others):
				f.Severity = Note
				f.Message += "; the other pods are terminating, their status is stale"
				f.none("none: it clears when they are gone")
			default:
				f.run(deletePodFix(others), "each restarts with an address of its own")
			}
		case len(allocs) == 0 && len(users) == 1:
			u := users[0]
			f.Kind, f.Severity = UnallocatedInUse, Problem
			in := "pool " + pool.obj.Name
			for _, b := range x.blocks {
				if b.prefix.IsValid() && b.prefix.Contains(ip) {
					in = "block " + b.cidr()
					f.Block = b.cidr()
					break
				}
			}
			f.Message = fmt.Sprintf("pod %s/%s uses %s (its status lists it), but IPAM has it free in %s and may give it to another pod", u.Namespace, u.Name, ip, in)
			f.run(deletePodFix(users), "it restarts with an address IPAM records")
			if u.DeletionTimestamp != nil {
				f.Severity = Note
				f.Message += "; the pod is terminating and its address was released already"
				f.none("none: it clears when the pod is gone")
			}
		default:
			continue
		}
		out = append(out, f)
	}
	return out
}

// checkHandles compares every IPAMHandle with what the blocks hold for it.
func (x *index) checkHandles() []Finding {
	held := map[string]map[string]int{} // handle -> block CIDR -> addresses
	first := map[string]*allocation{}
	for _, a := range x.allocs {
		if held[a.attr.HandleID] == nil {
			held[a.attr.HandleID] = map[string]int{}
			first[a.attr.HandleID] = a
		}
		held[a.attr.HandleID][a.block.cidr()]++
	}
	var out []Finding
	for i := range x.s.Handles {
		h := &x.s.Handles[i]
		rec := map[string]int{}
		for c, n := range h.Spec.Block {
			if p, err := netip.ParsePrefix(c); err == nil {
				c = p.Masked().String()
			}
			if n > 0 {
				rec[c] += n
			}
		}
		have := held[h.Spec.HandleID]
		if equalCounts(rec, have) {
			continue
		}
		f := Finding{Kind: HandleMismatch, Severity: Problem, Handle: h.Spec.HandleID, Object: "ipamhandle/" + h.Name}
		if a := first[h.Spec.HandleID]; a != nil {
			f.Node = a.attr.Node
			if a.attr.Pod != "" {
				f.Pods = []string{a.podKey()}
			}
		}
		f.Message = fmt.Sprintf("IPAMHandle %s records %s for handle %s, but the blocks hold %s", h.Name, countsText(rec), h.Spec.HandleID, countsText(have))
		if len(have) == 0 {
			f.run("kubectl delete ipamhandle "+h.Name, "it holds nothing")
		} else {
			patch := map[string]any{}
			for c := range rec {
				patch[c] = nil
			}
			for c, n := range have {
				patch[c] = n
			}
			data, _ := json.Marshal(map[string]any{"spec": map[string]any{"block": patch}})
			f.run(fmt.Sprintf("kubectl patch ipamhandle %s --type=merge -p '%s'", h.Name, data), "")
		}
		out = append(out, f)
	}
	var ids []string
	for id := range held {
		if x.handles[id] == nil {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	for _, id := range ids {
		a := first[id]
		if state, _ := x.holderState(a); state != StateRunning && state != StateNode {
			continue // pending: recorded after the ADD answers; gone: reported as leaked
		}
		var ips []string
		for _, b := range x.allocs {
			if b.attr.HandleID == id {
				ips = append(ips, b.ip.String())
			}
		}
		out = append(out, Finding{
			Kind: HandleMissing, Severity: Note, IP: a.ip.String(), Block: a.block.cidr(), Node: a.attr.Node, Handle: id,
			Message: fmt.Sprintf("%s holds %s, but no IPAMHandle records handle %s; CNI DEL still finds the addresses in node %s's blocks",
				describe(a), strings.Join(ips, ", "), id, a.attr.Node),
		})
	}
	return out
}

func equalCounts(a, b map[string]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func countsText(m map[string]int) string {
	if len(m) == 0 {
		return "no address"
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		n := m[k]
		w := "addresses"
		if n == 1 {
			w = "address"
		}
		parts = append(parts, fmt.Sprintf("%d %s in %s", n, w, k))
	}
	return strings.Join(parts, ", ")
}

// checkBlocks looks at every block: its pool, node, affinity, arrays, and
// whether it overlaps another.
func (x *index) checkBlocks() []Finding {
	var out []Finding
	for i, b := range x.blocks {
		obj := "ipamblock/" + b.obj.Name
		base := Finding{Block: b.cidr(), Node: b.node, Object: obj}
		if len(b.corrupt) > 0 {
			f := base
			f.Kind, f.Severity = CorruptedBlock, Problem
			f.Message = fmt.Sprintf("block %s (IPAMBlock %s) is corrupted: %s; IPAM does not write to it", b.cidr(), b.obj.Name, strings.Join(b.corrupt, "; "))
			f.Fix = "repair it with kubectl edit ipamblock " + b.obj.Name + ", or delete it once no pod uses its addresses"
			out = append(out, f)
			continue
		}
		if len(b.lost) > 0 {
			f := base
			f.Kind, f.Severity = CorruptedBlock, Problem
			var ips, ords []string
			for _, o := range b.lost {
				ips = append(ips, addrAt(b.prefix, o).String())
				ords = append(ords, strconv.Itoa(o))
			}
			f.Message = fmt.Sprintf("block %s: %d free addresses (%s) are missing from spec.unallocated, so they are never handed out", b.cidr(), len(b.lost), abbreviate(ips, 5))
			f.Fix = fmt.Sprintf("kubectl edit ipamblock %s (the save is refused if the block changed meanwhile) and append %s to spec.unallocated", b.obj.Name, strings.Join(ords, ", "))
			out = append(out, f)
		}
		for _, c := range x.blocks[i+1:] {
			if c.prefix.IsValid() && b.prefix.Overlaps(c.prefix) {
				f := base
				f.Kind, f.Severity = OverlappingBlocks, Problem
				f.Message = fmt.Sprintf("blocks %s (IPAMBlock %s, %d in use) and %s (IPAMBlock %s, %d in use) overlap", b.cidr(), b.obj.Name, b.used, c.cidr(), c.obj.Name, c.used)
				f.Fix = "delete the one that does not fit its pool's blockSize once no pod uses its addresses: kubectl delete ipamblock NAME"
				out = append(out, f)
			}
		}
		empty := b.used == 0
		aff := ""
		if b.node != "" && len(x.affs[affKey{b.node, b.prefix}]) > 0 {
			aff = " blockaffinity/" + x.affs[affKey{b.node, b.prefix}][0].Name
		}
		removeFix := "kubectl delete ipamblock/" + b.obj.Name + aff
		switch {
		case b.pool == nil:
			f := base
			f.Kind, f.Severity = BlockOutsidePool, Problem
			f.Message = fmt.Sprintf("block %s lies in no IPPool (%s in use)", b.cidr(), plural(b.used, "address"))
			f.run(removeFix, "")
			if !empty {
				f.Command, f.Fix = "", "IPAM releases only addresses of its pools: recreate an IPPool containing "+b.cidr()+", or delete the pods using its addresses and then "+removeFix
			}
			out = append(out, f)
		case b.prefix.Bits() != b.pool.size:
			f := base
			f.Kind, f.Severity = BlockOutsidePool, Problem
			f.Message = fmt.Sprintf("block %s is a /%d, but its pool %s carves /%d blocks (%s in use)", b.cidr(), b.prefix.Bits(), b.pool.obj.Name, b.pool.size, plural(b.used, "address"))
			f.run(removeFix, "")
			if !empty {
				f.Command, f.Fix = "", "IPAM cannot release addresses of a block of another size: delete the pods using its addresses, then "+removeFix
			}
			out = append(out, f)
		}
		switch {
		case b.node != "" && x.nodes[b.node] == nil:
			f := base
			f.Kind, f.Severity = DeletedNode, Problem
			f.Message = fmt.Sprintf("block %s is affine to node %s, which does not exist (%s in use)", b.cidr(), b.node, plural(b.used, "address"))
			f.run(removeFix, "while it is still empty")
			if !empty {
				f.Command, f.Fix = "", "release its addresses (reported above), then "+removeFix
			}
			out = append(out, f)
		case b.node != "" && len(x.affs[affKey{b.node, b.prefix}]) == 0:
			f := base
			f.Kind, f.Severity = BlockWithoutAffinity, Problem
			name := affinityName(b.node, b.prefix)
			f.Message = fmt.Sprintf("block %s is node %s's (spec.affinity), but no BlockAffinity records the claim", b.cidr(), b.node)
			manifest, _ := json.Marshal(map[string]any{
				"apiVersion": tabbyv1.SchemeGroupVersion.String(), "kind": "BlockAffinity",
				"metadata": map[string]any{"name": name, "labels": blockAffinityLabels(b)},
				"spec":     map[string]any{"node": b.node, "cidr": b.cidr(), "state": tabbyv1.AffinityConfirmed},
			})
			f.run(fmt.Sprintf("echo '%s' | kubectl create -f -", manifest), "")
			out = append(out, f)
		case b.node == "":
			f := base
			f.Kind, f.Severity = BlockWithoutAffinity, Problem
			f.Message = fmt.Sprintf("block %s has no node (spec.affinity is empty); %s in use", b.cidr(), plural(b.used, "address"))
			f.run(removeFix, "while it is still empty")
			if !empty {
				f.Severity = Note
				f.Command, f.Fix = "", "once its addresses are released, "+removeFix
			}
			out = append(out, f)
		}
	}
	return out
}

func blockAffinityLabels(b *blockInfo) map[string]string {
	l := map[string]string{tabbyv1.LabelNode: ipam.NodeLabelValue(b.node)}
	if b.pool != nil {
		l[tabbyv1.LabelPool] = b.pool.obj.Name
	}
	return l
}

// checkAffinities looks for BlockAffinities without their block, or whose
// block names another node.
func (x *index) checkAffinities() []Finding {
	blocks := map[netip.Prefix]*blockInfo{}
	for _, b := range x.blocks {
		if b.prefix.IsValid() {
			blocks[b.prefix] = b
		}
	}
	var out []Finding
	for i := range x.s.Affinities {
		a := &x.s.Affinities[i]
		f := Finding{Block: a.Spec.CIDR, Node: a.Spec.Node, Object: "blockaffinity/" + a.Name}
		f.run("kubectl delete blockaffinity "+a.Name, "")
		pfx, err := netip.ParsePrefix(a.Spec.CIDR)
		if err != nil {
			f.Kind, f.Severity = AffinityWithoutBlock, Problem
			f.Message = fmt.Sprintf("BlockAffinity %s has a cidr %q that does not parse", a.Name, a.Spec.CIDR)
			out = append(out, f)
			continue
		}
		pfx = pfx.Masked()
		f.Block = pfx.String()
		b := blocks[pfx]
		switch {
		case b == nil:
			f.Kind, f.Severity = AffinityWithoutBlock, Problem
			f.Message = fmt.Sprintf("BlockAffinity %s claims block %s for node %s (%s), but the block does not exist", a.Name, pfx, a.Spec.Node, a.Spec.State)
			if x.nodes[a.Spec.Node] == nil {
				f.Message += fmt.Sprintf("; node %s does not exist either", a.Spec.Node)
			}
			if a.Spec.State == tabbyv1.AffinityPending && x.s.Now.Sub(a.CreationTimestamp.Time) < x.grace {
				f.Kind, f.Severity = Pending, Note
				f.Message += "; a claim is in progress"
				f.none("none: the claim creates the block or removes the affinity")
			}
		case b.node != a.Spec.Node:
			f.Kind, f.Severity = AffinityMismatch, Problem
			owner := "no node's"
			if b.node != "" {
				owner = "node " + b.node + "'s"
			}
			f.Message = fmt.Sprintf("BlockAffinity %s claims block %s for node %s, but the block is %s (its spec.affinity, which IPAM follows)", a.Name, pfx, a.Spec.Node, owner)
		default:
			continue
		}
		out = append(out, f)
	}
	return out
}

func sortFindings(fs []Finding) {
	rank := map[Kind]int{}
	for i, k := range kindOrder {
		rank[k] = i
	}
	sort.SliceStable(fs, func(i, j int) bool {
		a, b := fs[i], fs[j]
		if a.Severity != b.Severity {
			return a.Severity == Problem
		}
		if a.Kind != b.Kind {
			return rank[a.Kind] < rank[b.Kind]
		}
		if c := compareAddr(a.IP, b.IP); c != 0 {
			return c < 0
		}
		if a.Block != b.Block {
			return a.Block < b.Block
		}
		return a.Object < b.Object
	})
}

func compareAddr(a, b string) int {
	x, errX := netip.ParseAddr(a)
	y, errY := netip.ParseAddr(b)
	if errX != nil || errY != nil {
		return strings.Compare(a, b)
	}
	return x.Compare(y)
}

func abbreviate(s []string, n int) string {
	if len(s) <= n {
		return strings.Join(s, ", ")
	}
	return strings.Join(s[:n], ", ") + fmt.Sprintf(" and %d more", len(s)-n)
}

func joinList(s []string) string {
	switch len(s) {
	case 0:
		return ""
	case 1:
		return s[0]
	}
	return strings.Join(s[:len(s)-1], ", ") + " and " + s[len(s)-1]
}
