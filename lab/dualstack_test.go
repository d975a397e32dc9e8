package lab

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/tabbynet/tabby/deploy"
)

// TestDualStackOptions: what --dual-stack and --ipv6-pod-cidr accept, and
// what they say about the rest.
func TestDualStackOptions(t *testing.T) {
	for _, tc := range []struct {
		o    Options
		want string // "" for no error, else a part of it
		cidr string
	}{
		{o: Options{}, cidr: ""},
		{o: Options{DualStack: true, PodCIDR: DefaultPodCIDR}, cidr: DefaultIPv6PodCIDR},
		{o: Options{DualStack: true, PodCIDR: DefaultPodCIDR, IPv6PodCIDR: "fd12:3::/48"}, cidr: "fd12:3::/48"},
		{o: Options{IPv6PodCIDR: "fd12:3::/48"}, want: "add --dual-stack"},
		{o: Options{DualStack: true}, want: "needs its IPv4 pool too"},
		{o: Options{DualStack: true, PodCIDR: DefaultPodCIDR, IPv6PodCIDR: "10.0.0.0/8"}, want: "not an IPv6 network"},
		{o: Options{DualStack: true, PodCIDR: DefaultPodCIDR, IPv6PodCIDR: "fd12:3::1/48"}, want: "not an IPv6 network"},
		{o: Options{DualStack: true, PodCIDR: DefaultPodCIDR, IPv6PodCIDR: "::ffff:10.0.0.0/104"}, want: "not an IPv6 network"},
	} {
		o := tc.o
		err := o.dualStackDefaults()
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%+v: %v", tc.o, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%+v: error %v, want one saying %q", tc.o, err, tc.want)
		case tc.want == "" && o.IPv6PodCIDR != tc.cidr:
			t.Errorf("%+v: IPv6 pod CIDR %q, want %q", tc.o, o.IPv6PodCIDR, tc.cidr)
		}
	}
}

// TestWithContainerArgs: the repository's DaemonSet gets the lab's flags
// in the containers named, init containers too, and a name it lacks is an
// error.
func TestWithContainerArgs(t *testing.T) {
	m, err := deploy.Render(filepath.Join("..", "deploy"), deploy.RenderOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out, err := withContainerArgs(m, map[string][]string{"install-cni": {"--assign-ipv6"}, "tabbyd": {"--x=1"}})
	if err != nil {
		t.Fatal(err)
	}
	objs, err := deploy.Objects(out)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][]string{}
	for _, o := range objs {
		if o.GetKind() != "DaemonSet" {
			continue
		}
		for _, field := range []string{"initContainers", "containers"} {
			cs, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", field)
			for _, c := range cs {
				cm := c.(map[string]any)
				args, _ := cm["args"].([]any)
				if len(args) > 0 {
					got[cm["name"].(string)] = append(got[cm["name"].(string)], args[len(args)-1].(string))
				}
			}
		}
	}
	if !slices.Equal(got["install-cni"], []string{"--assign-ipv6"}) || !slices.Equal(got["tabbyd"], []string{"--x=1"}) {
		t.Errorf("the containers' last args: %v", got)
	}
	if _, err := withContainerArgs(m, map[string][]string{"calico-node": {"--x"}}); err == nil || !strings.Contains(err.Error(), "no container named calico-node") {
		t.Errorf("a container the DaemonSet lacks: %v", err)
	}
}
