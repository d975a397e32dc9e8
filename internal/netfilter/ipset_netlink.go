package netfilter

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"

	"github.com/vishvananda/netlink"
)

// NetlinkMax is the most member changes a batch may hold to be sent over
// netlink rather than with `ipset restore`: a netlink request per member
// costs a few microseconds where starting ipset costs milliseconds, and
// past a few hundred members one restore is as fast.
const NetlinkMax = 256

// memberOp is one add or del of a batch, kept to be sent over netlink.
type memberOp struct {
	del         bool
	set, member string
}

// applyNetlink sends a batch of member changes only (no create or
// destroy, no nomatch) over netlink, in order; false when the batch is
// not such a batch, and nothing was sent. With exist, adding a member
// that is there and deleting one that is not are not errors, as with
// `ipset -exist restore`.
func (s *IPSets) applyNetlink(ctx context.Context, b *SetBatch, exist bool) (bool, error) {
	if b.other || len(b.ops) != b.n || len(b.ops) > NetlinkMax {
		return false, nil
	}
	entries := make([]netlink.IPSetEntry, len(b.ops))
	for i, op := range b.ops {
		e, ok := NetlinkEntry(b.types[op.set], op.member)
		if !ok {
			return false, nil
		}
		e.Replace = exist
		entries[i] = e
	}
	for i, op := range b.ops {
		if err := ctx.Err(); err != nil {
			return true, err
		}
		verb, f := "add", netlink.IpsetAdd
		if op.del {
			verb, f = "del", netlink.IpsetDel
		}
		if err := f(op.set, &entries[i]); err != nil {
			return true, fmt.Errorf("ipset %s %s %s over netlink: %w", verb, op.set, op.member, err)
		}
	}
	return true, nil
}

// NetlinkEntry is a member, as `ipset save` prints it, of a set of type
// typ as netlink takes it; false for what it does not carry (interfaces
// of bridge ports, types other than tabby's).
func NetlinkEntry(typ, member string) (netlink.IPSetEntry, bool) {
	var e netlink.IPSetEntry
	addr, rest, _ := strings.Cut(member, ",")
	ip, cidr := addr, -1
	if a, c, ok := strings.Cut(addr, "/"); ok {
		n, err := strconv.Atoi(c)
		if err != nil {
			return e, false
		}
		ip, cidr = a, n
	}
	e.IP = net.ParseIP(ip)
	if e.IP == nil {
		return e, false
	}
	if v4 := e.IP.To4(); v4 != nil {
		e.IP = v4
	}
	if cidr < 0 {
		cidr = 8 * len(e.IP)
	}
	switch typ {
	case "hash:ip":
		return e, rest == "" && cidr == 8*len(e.IP)
	case "hash:net":
		e.CIDR = uint8(cidr)
		return e, rest == "" && cidr > 0
	case "hash:net,iface":
		e.CIDR = uint8(cidr)
		e.IFace = rest
		return e, rest != "" && !strings.Contains(rest, ":") && cidr > 0
	case "hash:ip,port":
		proto, port, ok := strings.Cut(rest, ":")
		p, err := strconv.ParseUint(port, 10, 16)
		pn := protoNumbers[proto]
		if !ok || err != nil || pn == 0 || cidr != 8*len(e.IP) {
			return e, false
		}
		p16 := uint16(p)
		e.Port, e.Protocol = &p16, &pn
		return e, true
	}
	return e, false
}
