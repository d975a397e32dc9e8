// Package bgp is tabby's BGP: who peers with whom, what this node
// advertises, and a speaker (GoBGP v3, embedded as a library) that converges
// to both and reports what it learned.
//
// It follows "compute, then apply". The pure half has no I/O:
//
//   - DesiredPeers: the sessions this node should have, from the cluster's
//     nodes (addresses, AS numbers, route-reflector labels), the
//     BGPConfiguration and the BGPPeers, with Calico's semantics: a full
//     mesh until the first node is labelled tabby.io/route-reflector=true,
//     then reflectors peer with everybody and ordinary nodes only with
//     reflectors; explicit BGPPeers on top.
//   - Transition: make-before-break. New sessions start at once; a session
//     that is no longer wanted goes only when the routes it brought arrive
//     over the sessions that stay (or after a timeout), so changing the
//     topology never leaves a node without a route.
//   - Advertisements: one route per block affine to this node, /32 (/128)
//     routes for addresses it borrowed from other nodes' blocks, and the
//     BGPConfiguration's service CIDRs, all with this node as next hop.
//
// The applier is Speaker: Start, then SetPeers and SetAdvertisements on
// every reconcile (both converge: they add what is missing and remove what
// is stale; held sessions are re-evaluated by the speaker itself), Learned
// and PeerStates to read back, Changes to hear when to read again, Stop
// when the node leaves (a restarting daemon just exits).
//
// Graceful restart is on for every session (long-lived graceful restart is
// off). What GoBGP v3.37 does, and what the speaker does about it:
//
//   - A speaker in GoBGP's restarting mode (LocalRestarting) holds back its
//     routes until every established graceful-restart peer has sent
//     End-of-RIB, or its DeferralTime (GoBGP's default: 360 s) after each
//     session came up: the six minutes of kube-router #1323 and #1486.
//     Speaker uses that mode only when asked (Config.Restarting), with a
//     deferral of seconds; by default routes go out as soon as a session is
//     up.
//   - A peer that receives a NOTIFICATION drops the sender's routes unless
//     both negotiated RFC 8538 and it is not a Hard Reset; GoBGP sends
//     removals and shutdowns as Hard Resets. Speaker negotiates RFC 8538 and
//     re-creates sessions whose settings change (a node becoming a
//     reflector) with an administrative reset, which the remote treats as a
//     restart, and keeps the routes of such sessions itself meanwhile.
//   - After a session drops, GoBGP idles 5 s before it accepts or makes a
//     new connection and retries every ConnectRetry (GoBGP's default:
//     120 s; Config.ConnectRetry, 3 s), so a restarted node is back within
//     about ten seconds.
//
// Programs that embed the speaker must build with
// //go:debug multipathtcp=0 in their main package (see ErrMPTCPListeners):
// since Go 1.24 listeners use Multipath TCP, which cannot carry TCP MD5.
package bgp
