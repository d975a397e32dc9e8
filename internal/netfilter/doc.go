// Package netfilter is tabby's one way to program iptables and ipsets: the
// kernel-facing half that NAT outgoing (daemon/routing) and NetworkPolicy
// (policy/apply) share, as Felix's iptables Table and ipsets manager are
// shared by Calico's features. Each caller keeps its own desired state and
// decides what to change; this package runs the changes and reads back
// what the kernel has.
//
//   - IPTables is one family (iptables or ip6tables) of the backend
//     internal/iptbackend chose: Tx transactions applied with one
//     `iptables-restore --noflush`, tables read with iptables-save, single
//     chains listed with `iptables -S`.
//   - IPSets drives the kernel's ipsets: batches applied over netlink, a
//     request per run of one set's members, or with one `ipset restore`
//     when netlink cannot carry them or the kernel refused them; sets read
//     with `ipset save`.
//   - A failed restore quotes the input line the program named, so an error
//     says which rule or member the kernel refused.
//   - Ownership is by name: a caller owns the chains and sets that carry
//     its prefix, and the rules of other chains whose target is one of
//     its chains (JumpsTo); nothing else is ever flushed, moved or deleted.
//
// Everything runs in the network namespace of the calling thread.
package netfilter
