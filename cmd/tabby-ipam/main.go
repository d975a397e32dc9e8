// Command tabby-ipam is tabby's CNI IPAM plugin: it hands out addresses
// from tabby's IP pools (node-affine blocks in the Kubernetes API) under the
// handle "<network>.<containerID>". The tabby plugin runs the same code
// in-process; tabby-ipam serves other plugins such as ptp.
package main

import (
	"runtime"

	"github.com/containernetworking/cni/pkg/skel"

	"github.com/tabbynet/tabby/plugin"
)

func init() {
	runtime.LockOSThread()
}

func main() {
	skel.PluginMainFuncs(plugin.IPAMFuncs(plugin.Deps{}), plugin.SupportedVersions, plugin.About("tabby-ipam"))
}
