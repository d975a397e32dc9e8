// Command tabby is tabby's CNI network plugin: it gives a pod a veth pair,
// /32 (and /128) addresses from tabby's IP pools and link-local gateway
// routes. A container runtime runs it with the CNI protocol (CNI_COMMAND and
// the network config on stdin); run without CNI_COMMAND it prints what it is.
//
// It asks tabbyd's CNI agent for addresses and carries no datastore client,
// so it starts fast; when tabbyd does not answer, it hands the command to
// tabby-ipam, which reaches the API server itself (plugin.ReexecDirect).
package main

import (
	"runtime"

	"github.com/containernetworking/cni/pkg/skel"

	"github.com/tabbynet/tabby/plugin"
)

func init() {
	// Namespace switches are per thread: keep main on the main thread.
	runtime.LockOSThread()
}

func main() {
	skel.PluginMainFuncs(plugin.TabbyFuncs(plugin.Deps{}), plugin.SupportedVersions, plugin.About("tabby"))
}
