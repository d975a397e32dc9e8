// Package iptbackend finds out which iptables backend a host uses, legacy
// (the x_tables kernel API) or nft (iptables-nft on nf_tables), and names
// the binaries of that backend, so that every part of tabby programs rules
// where the host's other users (kubelet, kube-proxy, Docker, the admin) put
// theirs. Rules in the other backend would still be evaluated by the
// kernel, but invisibly to everyone listing the host's rules, and mixing
// both is what kube-proxy's iptables-wrapper exists to prevent.
//
// The detection is the one of kubernetes-sigs/iptables-wrappers: a
// kubelet's mangle-table marker chains decide first; otherwise the backend
// holding more rules (iptables-save lines starting with "-") wins, and nft
// on a tie, which includes a host without any rules yet.
package iptbackend

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strings"
	"time"

	"github.com/coreos/go-iptables/iptables"
)

// Mode is an iptables backend.
type Mode string

// The two backends.
const (
	Legacy Mode = "legacy"
	NFT    Mode = "nft"
)

// ParseMode reads a backend from a flag or setting: "legacy", "nft", or ""
// or "auto" for detection (returned as "").
func ParseMode(s string) (Mode, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", "auto":
		return "", nil
	case "legacy":
		return Legacy, nil
	case "nft", "nf_tables", "nftables":
		return NFT, nil
	}
	return "", fmt.Errorf("unknown iptables backend %q: use legacy, nft or auto", s)
}

// Backend is the set of binaries of one backend, as absolute paths.
type Backend struct {
	Mode Mode

	IPTables, IPTablesSave, IPTablesRestore    string
	IP6Tables, IP6TablesSave, IP6TablesRestore string

	// Reason says how Mode was chosen, for the log.
	Reason string
}

// Command is iptables or ip6tables of the backend.
func (b Backend) Command(p iptables.Protocol) string {
	if p == iptables.ProtocolIPv6 {
		return b.IP6Tables
	}
	return b.IPTables
}

// Save is iptables-save or ip6tables-save of the backend.
func (b Backend) Save(p iptables.Protocol) string {
	if p == iptables.ProtocolIPv6 {
		return b.IP6TablesSave
	}
	return b.IPTablesSave
}

// Restore is iptables-restore or ip6tables-restore of the backend.
func (b Backend) Restore(p iptables.Protocol) string {
	if p == iptables.ProtocolIPv6 {
		return b.IP6TablesRestore
	}
	return b.IPTablesRestore
}

// Handle returns a go-iptables handle that runs this backend's iptables
// (or ip6tables) and waits up to lockWait seconds for the xtables lock
// (0: forever).
func (b Backend) Handle(p iptables.Protocol, lockWait int) (*iptables.IPTables, error) {
	cmd := b.Command(p)
	if cmd == "" {
		return nil, fmt.Errorf("no %s binary for the %s backend (install iptables)", protoName(p), b.Mode)
	}
	h, err := iptables.New(iptables.IPFamily(p), iptables.Path(cmd), iptables.Timeout(lockWait))
	if err != nil {
		return nil, fmt.Errorf("using %s: %w (install iptables)", cmd, err)
	}
	return h, nil
}

func (b Backend) String() string {
	return fmt.Sprintf("%s (%s, %s)", b.Mode, b.IPTables, b.Reason)
}

func protoName(p iptables.Protocol) string {
	if p == iptables.ProtocolIPv6 {
		return "ip6tables"
	}
	return "iptables"
}

// tools are the binaries of a backend; toolName gives the name with the
// backend in it: iptables-legacy, iptables-nft-save …
var tools = [...]string{"iptables", "iptables-save", "iptables-restore", "ip6tables", "ip6tables-save", "ip6tables-restore"}

func toolName(tool string, m Mode) string {
	base, rest, _ := strings.Cut(tool, "-")
	if rest == "" {
		return base + "-" + string(m)
	}
	return base + "-" + string(m) + "-" + rest
}

// Paths finds the binaries of mode m: iptables-legacy, iptables-legacy-save …
// (or the -nft ones); where those do not exist (an iptables built for one
// backend only, or a distribution without the suffixed names) the plain
// iptables, iptables-save … when `iptables -V` says they are of mode m.
func Paths(m Mode) (Backend, error) {
	if m != Legacy && m != NFT {
		return Backend{}, fmt.Errorf("unknown iptables backend %q: use legacy or nft", m)
	}
	b := Backend{Mode: m}
	dst := []*string{&b.IPTables, &b.IPTablesSave, &b.IPTablesRestore, &b.IP6Tables, &b.IP6TablesSave, &b.IP6TablesRestore}
	if _, err := exec.LookPath(toolName("iptables", m)); err == nil {
		for i, t := range tools {
			if p, err := exec.LookPath(toolName(t, m)); err == nil {
				*dst[i] = p
			}
		}
	} else {
		plain, err := exec.LookPath("iptables")
		if err != nil {
			return Backend{}, fmt.Errorf("neither %s nor iptables is installed (install iptables)", toolName("iptables", m))
		}
		if got := plainMode(plain); got != m {
			return Backend{}, fmt.Errorf("%s is not installed and %s is the %s backend, not %s (install the %s variant of iptables or choose the backend %s)", toolName("iptables", m), plain, got, m, m, got)
		}
		for i, t := range tools {
			if p, err := exec.LookPath(t); err == nil {
				*dst[i] = p
			}
		}
	}
	if b.IPTablesSave == "" || b.IPTablesRestore == "" {
		return Backend{}, fmt.Errorf("%s is installed without its -save and -restore commands (install the complete iptables package)", b.IPTables)
	}
	return b, nil
}

// plainMode is the backend of a plain iptables binary, from its version
// line ("iptables v1.8.9 (nf_tables)", "iptables v1.8.9 (legacy)", or an
// old "iptables v1.6.1", which is legacy).
func plainMode(path string) Mode {
	out, err := exec.Command(path, "-V").Output()
	if err != nil {
		return ""
	}
	if bytes.Contains(out, []byte("nf_tables")) {
		return NFT
	}
	return Legacy
}

// Options configure Detect.
type Options struct {
	// Mode, when set, is used without looking at the host (the user's
	// override, e.g. from a flag or setting parsed with ParseMode).
	Mode Mode
	// Timeout bounds each iptables-save run (iptables-nft can hang on a
	// broken nf_tables); 0 means 10 seconds.
	Timeout time.Duration
}

// Detect chooses the backend of the network namespace of the calling
// thread, as kube-proxy's iptables-wrapper does, and returns its binaries.
// It creates nothing in the kernel.
func Detect(ctx context.Context, opts Options) (Backend, error) {
	if opts.Mode != "" {
		b, err := Paths(opts.Mode)
		if err != nil {
			return Backend{}, err
		}
		b.Reason = "set by configuration"
		return b, nil
	}
	if opts.Timeout == 0 {
		opts.Timeout = 10 * time.Second
	}
	legacy, lerr := Paths(Legacy)
	nft, nerr := Paths(NFT)
	switch {
	case lerr != nil && nerr != nil:
		return Backend{}, fmt.Errorf("no iptables found: %w; %w", lerr, nerr)
	case lerr != nil:
		nft.Reason = "the only backend installed"
		return nft, nil
	case nerr != nil:
		legacy.Reason = "the only backend installed"
		return legacy, nil
	}
	var in Observed
	in.Legacy = save(ctx, opts.Timeout, legacy.IPTablesSave) + save(ctx, opts.Timeout, legacy.IP6TablesSave)
	in.NFT = save(ctx, opts.Timeout, nft.IPTablesSave) + save(ctx, opts.Timeout, nft.IP6TablesSave)
	m, why := Decide(in)
	b := nft
	if m == Legacy {
		b = legacy
	}
	b.Reason = why
	return b, nil
}

// save runs one iptables-save and returns what it printed; errors (a
// missing binary, a backend the kernel lacks) count as no rules.
func save(ctx context.Context, timeout time.Duration, path string) string {
	if path == "" {
		return ""
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	out, _ := exec.CommandContext(ctx, path).Output()
	return string(out)
}

// Observed is what iptables-save printed for each backend, IPv4 and IPv6
// together.
type Observed struct {
	Legacy, NFT string
}

// kubeletMarkers are the chains kubelet (1.17 and later) makes in the mangle
// table of the backend it uses.
var kubeletMarkers = []string{":KUBE-IPTABLES-HINT ", ":KUBE-KUBELET-CANARY "}

// Decide is the choice itself: kubelet's marker chains in nft, then in
// legacy; otherwise more rules in legacy than in nft means legacy, and
// anything else (a tie, no rules at all) nft. It returns the mode and why.
func Decide(o Observed) (Mode, string) {
	if hasMarker(o.NFT) {
		return NFT, "kubelet's marker chain is in nft"
	}
	if hasMarker(o.Legacy) {
		return Legacy, "kubelet's marker chain is in legacy"
	}
	l, n := countRules(o.Legacy), countRules(o.NFT)
	if l > n {
		return Legacy, fmt.Sprintf("legacy holds more rules (%d) than nft (%d)", l, n)
	}
	if n > l {
		return NFT, fmt.Sprintf("nft holds more rules (%d) than legacy (%d)", n, l)
	}
	return NFT, fmt.Sprintf("legacy and nft hold as many rules (%d): nft by default", n)
}

func hasMarker(save string) bool {
	for _, line := range strings.Split(save, "\n") {
		for _, m := range kubeletMarkers {
			if strings.HasPrefix(line, m) {
				return true
			}
		}
	}
	return false
}

// countRules counts the rule lines ("-A …") of iptables-save output.
func countRules(save string) int {
	n := 0
	for _, line := range strings.Split(save, "\n") {
		if strings.HasPrefix(line, "-") {
			n++
		}
	}
	return n
}
