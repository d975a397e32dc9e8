// Command gen writes deploy/tabby.yaml (go generate ./deploy), or prints a
// variant for a cluster unlike the default: another image or pod CIDR, the
// API server's address for clusters whose kube-proxy is not up before the
// pod network, the CNI version the nodes' container runtime speaks:
//
//	go run ./deploy/gen -dir deploy -image registry.example/tabby:v1 -pod-cidr 10.42.0.0/16 \
//	    -pod-cidr-v6 fd00:42::/56 -apiserver 192.0.2.10:6443 -runtime-cni-version 1.0.0 -o -
//
// With -extender it prints deploy/scheduler/extender.yaml instead, with
// -image and -apiserver applied:
//
//	go run ./deploy/gen -dir deploy -extender -image registry.example/tabby:v1 -o -
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/tabbynet/tabby/deploy"
)

func main() {
	dir := flag.String("dir", ".", "the deploy folder")
	out := flag.String("o", "", `where to write ("-": standard output; default DIR/tabby.yaml, or standard output with -extender)`)
	extender := flag.Bool("extender", false, "render "+deploy.ExtenderManifest+" (with -image and -apiserver) instead of tabby.yaml")
	var opts deploy.RenderOptions
	flag.StringVar(&opts.Image, "image", "", "image instead of "+deploy.DefaultImage)
	flag.StringVar(&opts.PodCIDR, "pod-cidr", "", "the default IPPool's cidr instead of "+deploy.DefaultPodCIDR)
	flag.StringVar(&opts.PodCIDRv6, "pod-cidr-v6", "", "the default IPv6 IPPool's cidr on a dual-stack cluster (default: no IPv6 pool)")
	flag.StringVar(&opts.APIServer, "apiserver", "", "the API server's HOST:PORT as nodes reach it directly (KUBERNETES_SERVICE_HOST and _PORT of tabby's containers; default: the kubernetes Service)")
	flag.StringVar(&opts.RuntimeCNIVersion, "runtime-cni-version", "", "the newest CNI version the nodes' container runtime speaks, e.g. 1.0.0 for containerd 1.6 and 1.7 (install-cni's CNI_RUNTIME_MAX_VERSION; default: read off each Node)")
	flag.Parse()
	if err := run(*dir, *out, *extender, opts); err != nil {
		fmt.Fprintln(os.Stderr, "gen:", err)
		os.Exit(1)
	}
}

func run(dir, out string, extender bool, opts deploy.RenderOptions) error {
	if flag.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q: every input is a flag (-h lists them)", flag.Args())
	}
	var data []byte
	var err error
	if extender {
		if opts.PodCIDR != "" || opts.PodCIDRv6 != "" || opts.RuntimeCNIVersion != "" {
			return errors.New("-pod-cidr, -pod-cidr-v6 and -runtime-cni-version apply to tabby.yaml, not to -extender")
		}
		data, err = deploy.RenderExtender(dir, opts)
		if out == "" {
			out = "-"
		}
	} else {
		data, err = deploy.Render(dir, opts)
	}
	if err != nil {
		return err
	}
	switch out {
	case "-":
		_, err = os.Stdout.Write(data)
	case "":
		err = os.WriteFile(filepath.Join(dir, "tabby.yaml"), data, 0o644)
	default:
		err = os.WriteFile(out, data, 0o644)
	}
	return err
}
