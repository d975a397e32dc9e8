package inspect

import (
	"bytes"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// table is a tabwriter whose lines lose their trailing padding.
type table struct {
	*tabwriter.Writer
	buf bytes.Buffer
	out io.Writer
}

func newTable(w io.Writer) *table {
	t := &table{out: w}
	t.Writer = tabwriter.NewWriter(&t.buf, 0, 4, 2, ' ', 0)
	return t
}

// Flush writes the table.
func (t *table) Flush() error {
	if err := t.Writer.Flush(); err != nil {
		return err
	}
	lines := strings.SplitAfter(t.buf.String(), "\n")
	t.buf.Reset()
	var b strings.Builder
	for _, l := range lines {
		if strings.HasSuffix(l, "\n") {
			b.WriteString(strings.TrimRight(l, " "+"\n") + "\n")
		} else {
			b.WriteString(l)
		}
	}
	_, err := io.WriteString(t.out, b.String())
	return err
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// WriteTable prints the pools, then their blocks, then the totals.
func (r ShowReport) WriteTable(w io.Writer) error { return r.Write(w, false) }

// Write is WriteTable, with wide the columns it leaves out: each pool's
// size, each block's IPAMBlock object and size, and why a block is
// corrupted.
func (r ShowReport) Write(w io.Writer, wide bool) error {
	if len(r.Pools) == 0 && len(r.BlocksOutsidePools) == 0 {
		_, err := fmt.Fprintln(w, "No IP pools and no blocks: create an IPPool (see the README's Resources section).")
		return err
	}
	t := newTable(w)
	fmt.Fprint(t, "POOL\tCIDR\tBLOCK SIZE\tBLOCKS\tUSED\tFREE IN BLOCKS\tFREE")
	if wide {
		fmt.Fprint(t, "\tSIZE")
	}
	fmt.Fprintln(t)
	for _, p := range r.Pools {
		name := p.Name
		if p.Disabled {
			name += " (disabled)"
		}
		fmt.Fprintf(t, "%s\t%s\t/%d\t%d of %s\t%d\t%d\t%s", name, p.CIDR, p.BlockSize, p.BlocksClaimed, p.BlockCapacity, p.Used, p.FreeInBlocks, p.Free)
		if wide {
			fmt.Fprintf(t, "\t%s", p.Size)
		}
		fmt.Fprintln(t)
	}
	if err := t.Flush(); err != nil {
		return err
	}
	var blocks []BlockUsage
	for _, p := range r.Pools {
		blocks = append(blocks, p.Blocks...)
	}
	blocks = append(blocks, r.BlocksOutsidePools...)
	if len(blocks) > 0 {
		fmt.Fprintln(w)
		t = newTable(w)
		fmt.Fprint(t, "BLOCK\tPOOL\tNODE\tAFFINITY\tUSED\tFREE\tBORROWED")
		if wide {
			fmt.Fprint(t, "\tSIZE\tIPAMBLOCK")
		}
		fmt.Fprintln(t, "\tNOTES")
		for _, b := range blocks {
			var notes []string
			if b.Pool == "" {
				notes = append(notes, "in no pool")
			}
			if b.NodeMissing {
				notes = append(notes, "node does not exist")
			}
			if b.Deleted {
				notes = append(notes, "being deleted")
			}
			switch {
			case len(b.Corrupted) > 0 && wide:
				notes = append(notes, "corrupted: "+strings.Join(b.Corrupted, "; "))
			case len(b.Corrupted) > 0:
				notes = append(notes, "corrupted")
			}
			fmt.Fprintf(t, "%s\t%s\t%s\t%s\t%d\t%d\t%d", b.CIDR, dash(b.Pool), dash(b.Node), b.Affinity, b.Used, b.Free, b.Borrowed)
			if wide {
				fmt.Fprintf(t, "\t%d\t%s", b.Size, dash(b.Name))
			}
			fmt.Fprintf(t, "\t%s\n", strings.Join(notes, ", "))
		}
		if err := t.Flush(); err != nil {
			return err
		}
	}
	_, err := fmt.Fprintf(w, "\nTotal: %s, %s, %s used, %d free in the blocks.\n",
		plural(r.Totals.Pools, "pool"), plural(r.Totals.Blocks, "block"), plural(r.Totals.Used, "address"), r.Totals.FreeInBlocks)
	return err
}

func plural(n int, what string) string {
	if n == 1 {
		return fmt.Sprintf("1 %s", what)
	}
	if y, ok := strings.CutSuffix(what, "y"); ok {
		return fmt.Sprintf("%d %sies", n, y)
	}
	if strings.HasSuffix(what, "s") {
		return fmt.Sprintf("%d %ses", n, what)
	}
	return fmt.Sprintf("%d %ss", n, what)
}

// WriteTable prints who holds the address.
func (r IPReport) WriteTable(w io.Writer) error { return r.Write(w, false) }

// Write is WriteTable, with wide the findings' columns it leaves out (the
// record itself has every field already).
func (r IPReport) Write(w io.Writer, wide bool) error {
	t := newTable(w)
	fmt.Fprintf(t, "ADDRESS\t%s\n", r.IP)
	fmt.Fprintf(t, "POOL\t%s\n", dash(r.Pool))
	block := dash(r.Block)
	if r.BlockNode != "" {
		block += " (node " + r.BlockNode + ")"
	}
	fmt.Fprintf(t, "BLOCK\t%s\n", block)
	switch {
	case r.Allocated:
		fmt.Fprintf(t, "ALLOCATED\tyes\n")
	case r.Pool == "":
		fmt.Fprintf(t, "ALLOCATED\tno (not a pool address)\n")
	default:
		fmt.Fprintf(t, "ALLOCATED\tno (free)\n")
	}
	for _, h := range r.Holders {
		if len(r.Holders) > 1 {
			fmt.Fprintf(t, "\n")
			fmt.Fprintf(t, "IN BLOCK\t%s\n", h.Block)
		}
		handle := h.Handle
		if h.HandleObject != "" {
			handle += " (IPAMHandle " + h.HandleObject + ")"
		} else {
			handle += " (no IPAMHandle records it)"
		}
		fmt.Fprintf(t, "HANDLE\t%s\n", handle)
		if h.Pod != "" {
			fmt.Fprintf(t, "POD\t%s/%s\n", h.Namespace, h.Pod)
		}
		fmt.Fprintf(t, "NODE\t%s\n", dash(h.Node))
		fmt.Fprintf(t, "USE\t%s\n", dash(h.Use))
		if h.Since != nil {
			fmt.Fprintf(t, "SINCE\t%s\n", h.Since.UTC().Format(time.RFC3339))
		}
		if h.Sequence != nil {
			fmt.Fprintf(t, "SEQUENCE\t%d\n", *h.Sequence)
		}
		fmt.Fprintf(t, "STATE\t%s: %s\n", h.State, h.Reason)
		if len(h.PodIPs) > 0 {
			fmt.Fprintf(t, "POD IPS\t%s\n", strings.Join(h.PodIPs, ", "))
		}
		inUse := "no: tabbyctl ipam release frees it"
		if h.InUse {
			inUse = "yes: tabbyctl ipam release refuses it without --force"
		}
		fmt.Fprintf(t, "IN USE\t%s\n", inUse)
	}
	var users []string
	for _, u := range r.UsedBy {
		s := u.Namespace + "/" + u.Name
		if u.Node != "" {
			s += " on " + u.Node
		}
		if u.Terminating {
			s += " (terminating)"
		}
		users = append(users, s)
	}
	if len(users) > 0 {
		fmt.Fprintf(t, "LIVE PODS USING IT\t%s\n", strings.Join(users, ", "))
	} else {
		fmt.Fprintf(t, "LIVE PODS USING IT\tnone\n")
	}
	if err := t.Flush(); err != nil {
		return err
	}
	if len(r.Findings) > 0 {
		fmt.Fprintln(w)
		return writeFindings(w, r.Findings, wide)
	}
	return nil
}

// WriteTable prints a summary line, a table of findings with what to do,
// and each finding's details.
func (r CheckReport) WriteTable(w io.Writer) error { return r.Write(w, false) }

// Write is WriteTable, with wide the findings' columns it leaves out.
func (r CheckReport) Write(w io.Writer, wide bool) error {
	c := r.Checked
	what := fmt.Sprintf("checked %s, %s, %s, %s, %s, %s, %s",
		plural(c.Pools, "pool"), plural(c.Blocks, "block"), plural(c.Allocations, "allocation"), plural(c.Handles, "handle"),
		plural(c.Affinities, "affinity"), plural(c.Pods, "pod"), plural(c.Nodes, "node"))
	if r.Transient > 0 {
		what += fmt.Sprintf("; left out %s only one of two looks found, work in flight", plural(r.Transient, "problem"))
	}
	switch {
	case r.Problems == 0 && r.Notes == 0:
		_, err := fmt.Fprintf(w, "ipam check: no problems (%s).\n", what)
		return err
	case r.Problems == 0:
		fmt.Fprintf(w, "ipam check: no problems, %s (%s).\n\n", plural(r.Notes, "note"), what)
	default:
		fmt.Fprintf(w, "ipam check: %s, %s (%s).\n\n", plural(r.Problems, "problem"), plural(r.Notes, "note"), what)
	}
	return writeFindings(w, r.Findings, wide)
}

func subject(f Finding) string {
	switch {
	case f.IP != "":
		return f.IP
	case f.Object != "":
		return f.Object
	}
	return f.Block
}

// writeFindings prints the table of findings (wide: with the block, node,
// handle, object and pods each concerns) and their details.
func writeFindings(w io.Writer, fs []Finding, wide bool) error {
	t := newTable(w)
	fmt.Fprint(t, "SEVERITY\tKIND\tSUBJECT")
	if wide {
		fmt.Fprint(t, "\tBLOCK\tNODE\tHANDLE\tOBJECT\tPODS")
	}
	fmt.Fprintln(t, "\tWHAT TO DO")
	for _, f := range fs {
		fmt.Fprintf(t, "%s\t%s\t%s", f.Severity, f.Kind, subject(f))
		if wide {
			fmt.Fprintf(t, "\t%s\t%s\t%s\t%s\t%s", dash(f.Block), dash(f.Node), dash(f.Handle), dash(f.Object), dash(strings.Join(f.Pods, ",")))
		}
		fmt.Fprintf(t, "\t%s\n", dash(f.Fix))
	}
	if err := t.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w, "\nDetails:")
	for _, f := range fs {
		if _, err := fmt.Fprintf(w, "  %s (%s): %s\n", subject(f), f.Kind, f.Message); err != nil {
			return err
		}
	}
	return nil
}
