package netfilter

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strconv"
	"strings"

	"github.com/coreos/go-iptables/iptables"

	"github.com/tabbynet/tabby/internal/iptbackend"
)

// IPTables is one family of one backend: iptables (IPv4) or ip6tables
// (IPv6), legacy or nft, as internal/iptbackend found them.
type IPTables struct {
	// Name is IPv4 or IPv6, for messages.
	Name          string
	proto         iptables.Protocol
	h             *iptables.IPTables
	cmd           string
	save, restore string
	wait          string
}

// NewIPTables returns the family p of backend b. Every command waits up to
// lockWait seconds for the xtables lock (0: 10).
func NewIPTables(b iptbackend.Backend, p iptables.Protocol, lockWait int) (*IPTables, error) {
	if lockWait == 0 {
		lockWait = 10
	}
	h, err := b.Handle(p, lockWait)
	if err != nil {
		return nil, err
	}
	t := &IPTables{Name: "IPv4", proto: p, h: h, cmd: b.Command(p), save: b.Save(p), restore: b.Restore(p), wait: strconv.Itoa(lockWait)}
	if p == iptables.ProtocolIPv6 {
		t.Name = "IPv6"
	}
	if t.save == "" || t.restore == "" {
		return nil, fmt.Errorf("the %s backend has no %s-save or -restore (install iptables)", b.Mode, b.Command(p))
	}
	return t, nil
}

// Protocol is the family's go-iptables protocol.
func (t *IPTables) Protocol() iptables.Protocol { return t.proto }

// Apply runs tx with one `iptables-restore --noflush`; an empty tx runs
// nothing. An error quotes the line restore refused.
func (t *IPTables) Apply(ctx context.Context, tx *Tx) error {
	if tx.Empty() {
		return nil
	}
	_, err := run(ctx, tx.String(), t.restore, "--noflush", "--wait", t.wait)
	return err
}

// Start starts tx's `iptables-restore --noflush` as Apply does, from the
// calling thread (so in its network namespace), and returns at once: wait
// returns what Apply would. The two families of the nft backend can be
// written at once this way; those of the legacy backend cannot usefully
// (both take the xtables lock, which the second polls for once a second).
func (t *IPTables) Start(ctx context.Context, tx *Tx) (wait func() error) {
	if tx.Empty() {
		return func() error { return nil }
	}
	w := start(ctx, tx.String(), t.restore, "--noflush", "--wait", t.wait)
	return func() error {
		_, err := w()
		return err
	}
}

// StartHeld is Start, but the restore gets its COMMIT only when commit
// is called with true: it reads and checks every rule meanwhile (most of
// a large restore's time), while the kernel runs the old rules. So the
// caller can fill the sets the new rules name in the meantime.
// commit(false), or the end of ctx, ends the input without COMMIT: the
// restore changes nothing, and wait returns its complaint. Call commit
// (once) before wait, and soon: iptables-legacy-restore holds the xtables
// lock from its start, and stops reading its input (then fails, changing
// nothing) once its --wait seconds have passed, as measured here (1.8.9).
func (t *IPTables) StartHeld(ctx context.Context, tx *Tx) (commit func(bool), wait func() error) {
	if tx.Empty() {
		return func(bool) {}, func() error { return nil }
	}
	text := tx.String()
	go_ := make(chan bool, 1)
	feed := func(w io.Writer) error {
		if _, err := io.WriteString(w, strings.TrimSuffix(text, "COMMIT\n")); err != nil {
			return err
		}
		select {
		case ok := <-go_:
			if !ok {
				return errNotCommitted
			}
		case <-ctx.Done():
			return errNotCommitted
		}
		_, err := io.WriteString(w, "COMMIT\n")
		return err
	}
	w := startFed(ctx, text, feed, t.restore, "--noflush", "--wait", t.wait)
	return func(ok bool) { go_ <- ok }, func() error {
		_, err := w()
		return err
	}
}

// errNotCommitted: a held restore's input ended without COMMIT.
var errNotCommitted = errors.New("its input ended before COMMIT, as asked: nothing was committed")

// Save reads one table with iptables-save.
func (t *IPTables) Save(ctx context.Context, table string) (Table, error) {
	return t.StartSave(ctx, table)()
}

// StartSave starts Save's iptables-save from the calling thread (so in its
// network namespace) and returns at once: wait returns what Save would.
// Both families' tables can be read at once this way.
func (t *IPTables) StartSave(ctx context.Context, table string) (wait func() (Table, error)) {
	w := start(ctx, "", t.save, "-t", table)
	return func() (Table, error) {
		out, err := w()
		if err != nil {
			return nil, fmt.Errorf("reading the %s %s table: %w", t.Name, table, err)
		}
		return ParseSave(out, table), nil
	}
}

// StartList starts List's `iptables -S` from the calling thread (so in
// its network namespace) and returns at once: wait returns what List
// would. Many chains can be listed at once this way.
func (t *IPTables) StartList(ctx context.Context, table, chain string) (wait func() (rules []string, exists bool, err error)) {
	w := start(ctx, "", t.cmd, "-w", t.wait, "-t", table, "-S", chain)
	return func() ([]string, bool, error) {
		out, err := w()
		var xerr *exec.ExitError
		if errors.As(err, &xerr) && xerr.ExitCode() == 1 {
			return nil, false, nil
		}
		if err != nil {
			return nil, false, fmt.Errorf("listing %s %s %s: %w", t.Name, table, chain, err)
		}
		return chainRules(chain, strings.Split(out, "\n")), true, nil
	}
}

// List lists one chain's rules with `iptables -S`, as printed after
// "-A CHAIN " (as iptables-save prints them); an empty chain gives an
// empty, non-nil slice. exists is false, without an error, when there is
// no such chain: when iptables exits with status 1, as go-iptables'
// ChainExists decides too (iptables-nft 1.8.9 says a missing chain is
// "incompatible", which no message match would catch).
func (t *IPTables) List(table, chain string) (rules []string, exists bool, err error) {
	out, err := t.h.List(table, chain)
	var ierr *iptables.Error
	if errors.As(err, &ierr) && ierr.ExitStatus() == 1 {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("listing %s %s %s: %w", t.Name, table, chain, err)
	}
	return chainRules(chain, out), true, nil
}

// chainRules are the rules of `iptables -S chain`'s lines, as printed
// after "-A CHAIN "; never nil.
func chainRules(chain string, lines []string) []string {
	rules := []string{}
	for _, l := range lines {
		if rest, ok := strings.CutPrefix(l, "-A "+chain+" "); ok {
			rules = append(rules, rest)
		}
	}
	return rules
}
