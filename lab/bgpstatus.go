package lab

import (
	"context"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/tabbynet/tabby/daemon/nodestatus"
)

// TabbydClient is an HTTP client whose connections start inside node n's
// namespace, where its tabbyd serves on TabbydURL.
func TabbydClient(n *Node, timeout time.Duration) *http.Client {
	return tabbydClient(n.NetNS, timeout)
}

// TabbydURL is the URL of path on a node's tabbyd, seen from inside the
// node.
func TabbydURL(path string) string { return "http://" + tabbydEndpoint() + path }

// tabbydClient is an HTTP client whose connections start inside the
// named namespace (where a node's tabbyd serves on its loopback).
func tabbydClient(nsName string, timeout time.Duration) *http.Client {
	return nsHTTPClient(nsName, timeout)
}

// tabbydEndpoint is where a node's tabbyd serves health and status,
// seen from inside the node.
func tabbydEndpoint() string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(TabbydHealthPort))
}

// NodeBGP asks node n's tabbyd for its BGP sessions and routes (GET
// /status, from inside the node).
func NodeBGP(ctx context.Context, n *Node) (*nodestatus.Status, error) {
	return nodestatus.Fetch(ctx, tabbydClient(n.NetNS, 3*time.Second), tabbydEndpoint())
}
