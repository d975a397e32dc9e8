// Package nflog reads packets the kernel's NFLOG target sends to a group
// (iptables -j NFLOG --nflog-group N), over netfilter's netlink socket
// (nfnetlink_log), as libnetfilter_log does; github.com/mdlayher/netlink
// speaks the netlink. It decodes what tabby needs of a logged packet: its
// prefix, when, and the addresses, protocol and ports of its headers.
package nflog

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// nfnetlink_log's message types and attributes (linux/netfilter/nfnetlink_log.h).
const (
	subsysULOG   = 4 // NFNL_SUBSYS_ULOG
	msgPacket    = 0 // NFULNL_MSG_PACKET
	msgConfig    = 1 // NFULNL_MSG_CONFIG
	cfgCmd       = 1 // NFULA_CFG_CMD
	cfgMode      = 2 // NFULA_CFG_MODE
	cfgTimeout   = 4 // NFULA_CFG_TIMEOUT, in 1/100 s
	cfgQThresh   = 5 // NFULA_CFG_QTHRESH
	cmdBind      = 1 // NFULNL_CFG_CMD_BIND
	copyPacket   = 2 // NFULNL_COPY_PACKET
	attrHdr      = 1 // NFULA_PACKET_HDR
	attrTime     = 3 // NFULA_TIMESTAMP
	attrInDev    = 4 // NFULA_IFINDEX_INDEV
	attrOutDev   = 5 // NFULA_IFINDEX_OUTDEV
	attrPayload  = 9 // NFULA_PAYLOAD
	attrPrefix   = 10
	nfnlVersion0 = 0
)

// Config says which group to read and how the kernel batches.
type Config struct {
	Group uint16
	// CopyBytes is how much of each packet the kernel copies (the NFLOG
	// rule's --nflog-size bounds it too); 0 means 128.
	CopyBytes uint32
	// Batch and Flush: the kernel sends a batch of up to Batch packets, or
	// what it has after Flush; 0 means 32 and 50ms. Batching is what keeps
	// a flood cheap: one read per batch, not per packet.
	Batch int
	Flush time.Duration
	// NetNS is a file descriptor of the network namespace to read in; 0
	// is the caller's.
	NetNS int
}

// Packet is one logged packet.
type Packet struct {
	Prefix string
	// Time is the packet's timestamp when the kernel gave one, else when
	// it was read.
	Time time.Time
	// InDev and OutDev are interface indexes (0: none).
	InDev, OutDev uint32
	Src, Dst      netip.Addr
	// Proto is the IP protocol number (6 TCP, 17 UDP, 132 SCTP, 1 ICMP,
	// 58 ICMPv6); SrcPort and DstPort are set for TCP, UDP and SCTP.
	Proto            uint8
	SrcPort, DstPort uint16
}

// Conn is a socket bound to one NFLOG group.
type Conn struct {
	c      *netlink.Conn
	group  uint16
	closed atomic.Bool
}

// Open binds a socket to the group. Only one socket of a network namespace
// can have a group: the kernel refuses a second (EPERM, or EBUSY).
func Open(cfg Config) (*Conn, error) {
	if cfg.CopyBytes == 0 {
		cfg.CopyBytes = 128
	}
	if cfg.Batch <= 0 {
		cfg.Batch = 32
	}
	if cfg.Flush <= 0 {
		cfg.Flush = 50 * time.Millisecond
	}
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: cfg.NetNS})
	if err != nil {
		return nil, fmt.Errorf("opening a netfilter netlink socket: %w", err)
	}
	n := &Conn{c: c, group: cfg.Group}
	// Big enough for many batches: a reader behind by a burst loses
	// packets (ENOBUFS), not the kernel's time.
	_ = c.SetReadBuffer(4 << 20)
	mode := make([]byte, 6)
	binary.BigEndian.PutUint32(mode, cfg.CopyBytes)
	mode[4] = copyPacket
	u32 := func(v uint32) []byte { return binary.BigEndian.AppendUint32(nil, v) }
	for _, a := range []netlink.Attribute{
		{Type: cfgCmd, Data: []byte{cmdBind}},
		{Type: cfgMode, Data: mode},
		{Type: cfgQThresh, Data: u32(uint32(cfg.Batch))},
		{Type: cfgTimeout, Data: u32(uint32(cfg.Flush / (10 * time.Millisecond)))},
	} {
		if err := n.config(a); err != nil {
			_ = c.Close()
			if errors.Is(err, unix.EBUSY) || errors.Is(err, unix.EPERM) {
				return nil, fmt.Errorf("binding NFLOG group %d: another program reads it (pick another group): %w", cfg.Group, err)
			}
			return nil, fmt.Errorf("configuring NFLOG group %d: %w (does the kernel have nfnetlink_log?)", cfg.Group, err)
		}
	}
	return n, nil
}

// config sends one configuration attribute for the group and waits for
// the kernel's answer.
func (n *Conn) config(a netlink.Attribute) error {
	attrs, err := netlink.MarshalAttributes([]netlink.Attribute{a})
	if err != nil {
		return err
	}
	_, err = n.c.Execute(netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(subsysULOG<<8 | msgConfig), Flags: netlink.Request | netlink.Acknowledge},
		Data:   append(n.genHeader(unix.AF_UNSPEC), attrs...),
	})
	return err
}

// genHeader is struct nfgenmsg: family, version, and the group (big endian).
func (n *Conn) genHeader(family uint8) []byte {
	return binary.BigEndian.AppendUint16([]byte{family, nfnlVersion0}, n.group)
}

// Close unbinds the group.
func (n *Conn) Close() error {
	n.closed.Store(true)
	return n.c.Close()
}

// Read reads packets until the socket is closed, calling fn for each. A
// read that lost packets (the socket's buffer overran) calls lost, and
// goes on. It returns nil once Close was called.
func (n *Conn) Read(fn func(Packet), lost func()) error {
	for {
		msgs, err := n.c.Receive()
		if err != nil {
			if errors.Is(err, unix.ENOBUFS) {
				if lost != nil {
					lost()
				}
				continue
			}
			if n.closed.Load() {
				return nil
			}
			return fmt.Errorf("reading NFLOG group %d: %w", n.group, err)
		}
		now := time.Now()
		for _, m := range msgs {
			if m.Header.Type != netlink.HeaderType(subsysULOG<<8|msgPacket) || len(m.Data) < 4 {
				continue
			}
			if p, ok := decode(m.Data[4:], now); ok {
				fn(p)
			}
		}
	}
}
