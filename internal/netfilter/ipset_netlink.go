package netfilter

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// The netlink path of IPSets.Apply. `ipset restore` spends most of its
// time finding each line's set by name in a list: in a full sync of 2,500
// sets and 34,000 members the program used as much CPU as the kernel.
// Here each run of adds (or dels) of one set is one request carrying all
// of them (IPSET_ATTR_ADT, as restore builds them too), and the requests
// go many to a write. The kernel answers a request only when it refuses
// it or is asked to acknowledge it, which the last request before each
// barrier (see ipsetRequest) and the last of all are.
const (
	// adtMaxBytes bounds a request's members: an attribute's length is
	// 16 bits.
	adtMaxBytes = 48 << 10
	// writeMaxBytes bounds one write of requests (the socket's send
	// buffer is about 200 KiB).
	writeMaxBytes = 128 << 10
	// ipsetTimeout bounds the wait for the kernel's answer.
	ipsetTimeout = 30 * time.Second
)

// errNotNetlink: a batch holds a command the netlink path does not send
// (a destroy, an option other than hashsize and maxelem, a member of a set
// of unknown type or one netlink does not carry); nothing was sent.
var errNotNetlink = errors.New("not a batch for netlink")

// ipsetRequest is one request of a batch, and what it does, for errors.
type ipsetRequest struct {
	req  *nl.NetlinkRequest
	what string
	del  bool
	// barrier: a run of deletions, sent only once everything before it
	// was applied, so that a member moving between sets is always in one
	// of them, as with restore, which stops at the first error.
	barrier bool
}

// applyNetlink applies b, an -exist batch, as ipset requests in the
// network namespace of the calling thread: errNotNetlink when b holds
// what only restore carries, an error naming the first request the kernel
// refused otherwise (the requests before it, and those of its run, may be
// applied).
func (s *IPSets) applyNetlink(ctx context.Context, b *SetBatch) error {
	reqs, err := s.ipsetRequests(b)
	if err != nil {
		return err
	}
	return sendIPSetRequests(ctx, reqs)
}

// ipsetRequests are b's commands as requests: a create each, and a
// request each run of adds (or of dels) of one set, split at adtMaxBytes.
func (s *IPSets) ipsetRequests(b *SetBatch) ([]ipsetRequest, error) {
	var out []ipsetRequest
	var adt *nl.RtAttr
	adtBytes := 0
	for i, l := range b.lines {
		switch l.verb {
		case "create":
			r, err := s.createRequest(l)
			if err != nil {
				return nil, err
			}
			out = append(out, r)
			adt = nil
			continue
		case "add", "del":
		default:
			return nil, errNotNetlink
		}
		e, ok := NetlinkEntry(b.types[l.set], l.member)
		if !ok {
			return nil, errNotNetlink
		}
		data := entryAttr(e, l.nomatch)
		n := alignAttr(data.Len())
		if prev := b.lines[max(i-1, 0)]; adt == nil || i == 0 || prev.verb != l.verb || prev.set != l.set || adtBytes+n > adtMaxBytes {
			cmd := nl.IPSET_CMD_ADD
			if l.verb == "del" {
				cmd = nl.IPSET_CMD_DEL
			}
			req := newIPSetRequest(cmd, familyOf(e.IP))
			req.AddData(nl.NewRtAttr(nl.IPSET_ATTR_SETNAME, nl.ZeroTerminated(l.set)))
			// The kernel takes several members only with a line number.
			req.AddData(nl.NewRtAttr(nl.IPSET_ATTR_LINENO, nl.Uint32Attr(0)))
			adt = nl.NewRtAttr(nl.IPSET_ATTR_ADT|int(nl.NLA_F_NESTED), nil)
			req.AddData(adt)
			del := l.verb == "del"
			barrier := del && len(out) > 0 && !out[len(out)-1].del
			out = append(out, ipsetRequest{req: req, what: l.verb + " " + l.member + " (and the members after it) in " + l.set, del: del, barrier: barrier})
			adtBytes = 0
		}
		adt.AddChild(data)
		adtBytes += n
	}
	return out, nil
}

// newIPSetRequest starts an ipset request of command cmd.
func newIPSetRequest(cmd int, family uint8) *nl.NetlinkRequest {
	// No NLM_F_EXCL: existing members, missing ones at del and a set
	// created again alike are not errors (-exist).
	req := nl.NewNetlinkRequest(unix.NFNL_SUBSYS_IPSET<<8|cmd, 0)
	req.AddData(&nl.Nfgenmsg{NfgenFamily: family, Version: nl.NFNETLINK_V0})
	req.AddData(nl.NewRtAttr(nl.IPSET_ATTR_PROTOCOL, nl.Uint8Attr(nl.IPSET_PROTOCOL)))
	return req
}

// createRequest creates l's set with the newest revision of its type the
// kernel has, as the ipset program does.
func (s *IPSets) createRequest(l setLine) (ipsetRequest, error) {
	fam, ok := map[string]uint8{"inet": unix.NFPROTO_IPV4, "inet6": unix.NFPROTO_IPV6}[l.family]
	if !ok || len(l.options)%2 != 0 {
		return ipsetRequest{}, errNotNetlink
	}
	data := nl.NewRtAttr(nl.IPSET_ATTR_DATA|int(nl.NLA_F_NESTED), nil)
	for i := 0; i < len(l.options); i += 2 {
		attr, ok := map[string]uint16{"hashsize": nl.IPSET_ATTR_HASHSIZE, "maxelem": nl.IPSET_ATTR_MAXELEM}[l.options[i]]
		v, err := strconv.ParseUint(l.options[i+1], 10, 32)
		if !ok || err != nil {
			return ipsetRequest{}, errNotNetlink
		}
		data.AddChild(&nl.Uint32Attribute{Type: attr | nl.NLA_F_NET_BYTEORDER, Value: uint32(v)})
	}
	rev, err := s.revision(l.typ, fam)
	if err != nil {
		return ipsetRequest{}, err
	}
	req := newIPSetRequest(nl.IPSET_CMD_CREATE, fam)
	req.AddData(nl.NewRtAttr(nl.IPSET_ATTR_SETNAME, nl.ZeroTerminated(l.set)))
	req.AddData(nl.NewRtAttr(nl.IPSET_ATTR_TYPENAME, nl.ZeroTerminated(l.typ)))
	req.AddData(nl.NewRtAttr(nl.IPSET_ATTR_REVISION, nl.Uint8Attr(rev)))
	req.AddData(nl.NewRtAttr(nl.IPSET_ATTR_FAMILY, nl.Uint8Attr(fam)))
	req.AddData(data)
	return ipsetRequest{req: req, what: "create " + l.set + " " + l.typ + " family " + l.family}, nil
}

// revision is the newest revision of set type typ the kernel has for
// family, asked once (IPSET_CMD_TYPE) and remembered: the kernel's types
// do not change under a running program.
func (s *IPSets) revision(typ string, family uint8) (uint8, error) {
	key := fmt.Sprint(typ, " ", family)
	if s.revs != nil {
		if v, ok := s.revs.Load(key); ok {
			return v.(uint8), nil
		}
	}
	req := newIPSetRequest(nl.IPSET_CMD_TYPE, family)
	req.AddData(nl.NewRtAttr(nl.IPSET_ATTR_TYPENAME, nl.ZeroTerminated(typ)))
	req.AddData(nl.NewRtAttr(nl.IPSET_ATTR_FAMILY, nl.Uint8Attr(family)))
	msgs, err := req.Execute(unix.NETLINK_NETFILTER, 0)
	if err != nil {
		return 0, fmt.Errorf("asking the kernel for the ipset type %s: %w", typ, err)
	}
	for _, m := range msgs {
		if len(m) < nl.SizeofNfgenmsg {
			continue
		}
		attrs, err := nl.ParseRouteAttr(m[nl.SizeofNfgenmsg:])
		if err != nil {
			return 0, fmt.Errorf("reading the kernel's ipset type %s: %w", typ, err)
		}
		for _, a := range attrs {
			if a.Attr.Type&nl.NLA_TYPE_MASK == nl.IPSET_ATTR_REVISION && len(a.Value) == 1 {
				if s.revs != nil {
					s.revs.Store(key, a.Value[0])
				}
				return a.Value[0], nil
			}
		}
	}
	return 0, fmt.Errorf("the kernel named no revision of the ipset type %s", typ)
}

// entryAttr is e as the data of an add or del.
func entryAttr(e netlink.IPSetEntry, nomatch bool) *nl.RtAttr {
	data := nl.NewRtAttr(nl.IPSET_ATTR_DATA|int(nl.NLA_F_NESTED), nil)
	ip := nl.NewRtAttr(nl.IPSET_ATTR_IP|int(nl.NLA_F_NESTED), nil)
	addr := nl.IPSET_ATTR_IPADDR_IPV4
	if len(e.IP) == net.IPv6len {
		addr = nl.IPSET_ATTR_IPADDR_IPV6
	}
	ip.AddRtAttr(addr|int(nl.NLA_F_NET_BYTEORDER), e.IP)
	data.AddChild(ip)
	if e.CIDR != 0 {
		data.AddRtAttr(nl.IPSET_ATTR_CIDR, nl.Uint8Attr(e.CIDR))
	}
	if e.Port != nil {
		data.AddRtAttr(nl.IPSET_ATTR_PROTO, nl.Uint8Attr(*e.Protocol))
		data.AddRtAttr(nl.IPSET_ATTR_PORT|int(nl.NLA_F_NET_BYTEORDER), nl.BEUint16Attr(*e.Port))
	}
	if e.IFace != "" {
		data.AddRtAttr(nl.IPSET_ATTR_IFACE, nl.ZeroTerminated(e.IFace))
	}
	if nomatch {
		data.AddChild(&nl.Uint32Attribute{Type: nl.IPSET_ATTR_CADT_FLAGS | nl.NLA_F_NET_BYTEORDER, Value: nl.IPSET_FLAG_NOMATCH})
	}
	return data
}

func familyOf(ip net.IP) uint8 {
	if len(ip) == net.IPv6len {
		return unix.NFPROTO_IPV6
	}
	return unix.NFPROTO_IPV4
}

func alignAttr(n int) int { return (n + unix.NLA_ALIGNTO - 1) &^ (unix.NLA_ALIGNTO - 1) }

// sendIPSetRequests sends reqs over one netlink socket of the calling
// thread's namespace, in writes of up to writeMaxBytes. Only the last
// request before a barrier and the last of all ask for an answer; the
// kernel answers every refused request too. A run is sent only once all
// before it were applied.
func sendIPSetRequests(ctx context.Context, reqs []ipsetRequest) error {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_NETFILTER)
	if err != nil {
		return fmt.Errorf("opening a netlink socket for ipset: %w", err)
	}
	defer unix.Close(fd)
	tv := unix.NsecToTimeval(ipsetTimeout.Nanoseconds())
	for _, err := range []error{
		unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}),
		// An error answer carries the request's header only, not its
		// thousands of members.
		unix.SetsockoptInt(fd, unix.SOL_NETLINK, unix.NETLINK_CAP_ACK, 1),
		unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv),
	} {
		if err != nil {
			return fmt.Errorf("setting up a netlink socket for ipset: %w", err)
		}
	}
	for start := 0; start < len(reqs); {
		end := start + 1
		for end < len(reqs) && !reqs[end].barrier {
			end++
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := sendRun(fd, reqs[start:end]); err != nil {
			return err
		}
		start = end
	}
	return nil
}

// sendRun sends run, its last request asking for an acknowledgement, and
// reads the answers up to that one.
func sendRun(fd int, run []ipsetRequest) error {
	last := run[len(run)-1].req
	last.Flags |= unix.NLM_F_ACK
	what := make(map[uint32]string, len(run))
	var buf []byte
	for i, r := range run {
		what[r.req.Seq] = r.what
		buf = append(buf, r.req.Serialize()...)
		if len(buf) >= writeMaxBytes || i == len(run)-1 {
			if err := unix.Sendto(fd, buf, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
				return fmt.Errorf("sending ipset requests: %w", err)
			}
			buf = buf[:0]
		}
	}
	var first error
	rb := make([]byte, 64<<10)
	for {
		n, _, err := unix.Recvfrom(fd, rb, 0)
		if err != nil {
			return fmt.Errorf("reading the kernel's answer to ipset requests: %w", err)
		}
		msgs, err := syscall.ParseNetlinkMessage(rb[:n])
		if err != nil {
			return fmt.Errorf("reading the kernel's answer to ipset requests: %w", err)
		}
		for _, m := range msgs {
			if m.Header.Type != unix.NLMSG_ERROR || len(m.Data) < 4 {
				continue
			}
			if errno := -int32(nl.NativeEndian().Uint32(m.Data[:4])); errno != 0 && first == nil {
				err := error(syscall.Errno(errno))
				if errno >= nl.IPSET_ERR_PRIVATE {
					err = nl.IPSetError(uintptr(errno))
				}
				first = fmt.Errorf("ipset %s over netlink: %w", what[m.Header.Seq], err)
			}
			if m.Header.Seq == last.Seq {
				return first
			}
		}
	}
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
