// Command tabby-ipam is tabby's CNI IPAM plugin: it hands out addresses
// from tabby's IP pools (node-affine blocks in the Kubernetes API) under the
// handle "<network>.<containerID>", through tabbyd's CNI agent when it
// answers, else reaching the API server itself. The tabby plugin runs the
// same code; tabby-ipam serves other plugins such as ptp.
//
// It is also where the tabby plugin runs a command when tabbyd does not
// answer (plugin.EnvDirect=tabby): tabby itself carries no datastore client.
package main

import (
	"os"
	"runtime"

	"github.com/containernetworking/cni/pkg/skel"

	"github.com/tabbynet/tabby/plugin"
	"github.com/tabbynet/tabby/plugin/direct"
)

func init() {
	runtime.LockOSThread()
}

func main() {
	if os.Getenv(plugin.EnvDirect) == "tabby" {
		skel.PluginMainFuncs(plugin.TabbyFuncs(plugin.Deps{Direct: direct.New, NoAgent: true}), plugin.SupportedVersions, plugin.About("tabby"))
		return
	}
	skel.PluginMainFuncs(plugin.IPAMFuncs(plugin.Deps{Direct: direct.New}), plugin.SupportedVersions, plugin.About("tabby-ipam"))
}
