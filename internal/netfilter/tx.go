package netfilter

import (
	"fmt"
	"strings"
)

// Tx is one iptables-restore --noflush transaction on one table: the
// kernel applies all of it or none of it, and what it does not name is
// left as it is.
type Tx struct {
	table string
	n     int
	b     strings.Builder
}

// NewTx starts a transaction on table (filter, nat …).
func NewTx(table string) *Tx { return &Tx{table: table} }

func (t *Tx) line(format string, args ...any) {
	fmt.Fprintf(&t.b, format, args...)
	t.b.WriteByte('\n')
	t.n++
}

// Declare creates chain, or flushes it when it exists: with --noflush,
// declaring a chain is how restore empties it.
func (t *Tx) Declare(chain string) { t.line(":%s - [0:0]", chain) }

// Append appends a rule to chain.
func (t *Tx) Append(chain string, rule []string) { t.line("-A %s %s", chain, RuleLine(rule)) }

// Insert inserts a rule at position pos (from 1) of chain.
func (t *Tx) Insert(chain string, pos int, rule []string) {
	t.line("-I %s %d %s", chain, pos, RuleLine(rule))
}

// Delete deletes a rule of chain by its text as iptables-save printed it
// (after "-A CHAIN ").
func (t *Tx) Delete(chain, printed string) { t.line("-D %s %s", chain, printed) }

// DeleteChain deletes chain, which must be empty (declared in this
// transaction) and not jumped to.
func (t *Tx) DeleteChain(chain string) { t.line("-X %s", chain) }

// Empty says the transaction changes nothing.
func (t *Tx) Empty() bool { return t.n == 0 }

// String is the restore input.
func (t *Tx) String() string { return "*" + t.table + "\n" + t.b.String() + "COMMIT\n" }
