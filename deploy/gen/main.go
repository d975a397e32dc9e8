// Command gen writes deploy/tabby.yaml (go generate ./deploy), or prints a
// variant with another image or pod CIDR:
//
//	go run ./deploy/gen -dir deploy -image registry.example/tabby:v1 -pod-cidr 10.42.0.0/16 -o -
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/tabbynet/tabby/deploy"
)

func main() {
	dir := flag.String("dir", ".", "the deploy folder")
	out := flag.String("o", "", `where to write ("-": standard output; default DIR/tabby.yaml)`)
	var opts deploy.RenderOptions
	flag.StringVar(&opts.Image, "image", "", "image instead of "+deploy.DefaultImage)
	flag.StringVar(&opts.PodCIDR, "pod-cidr", "", "the default IPPool's cidr instead of "+deploy.DefaultPodCIDR)
	flag.Parse()
	data, err := deploy.Render(*dir, opts)
	if err == nil {
		switch *out {
		case "-":
			_, err = os.Stdout.Write(data)
		case "":
			err = os.WriteFile(filepath.Join(*dir, "tabby.yaml"), data, 0o644)
		default:
			err = os.WriteFile(*out, data, 0o644)
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "gen:", err)
		os.Exit(1)
	}
}
