package main

import (
	"bytes"
	"os"
	"strings"
	"testing"

	"github.com/tabbynet/tabby/deploy"
)

// TestTabbyYAMLIsCurrent fails while deploy/tabby.yaml differs from what
// its sources render.
func TestTabbyYAMLIsCurrent(t *testing.T) {
	want, err := deploy.Render("..", deploy.RenderOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile("../tabby.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("deploy/tabby.yaml is stale: run go generate ./deploy (it is built from deploy/base, deploy/crds and deploy/policies)")
	}
}

func TestManifestObjects(t *testing.T) {
	data, err := os.ReadFile("../tabby.yaml")
	if err != nil {
		t.Fatal(err)
	}
	objs, err := deploy.Objects(data)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	var order []string
	for _, o := range objs {
		id := o.GetKind() + "/" + o.GetNamespace() + "/" + o.GetName()
		if seen[id] {
			t.Errorf("%s appears twice", id)
		}
		seen[id] = true
		order = append(order, o.GetKind())
		if o.GetNamespace() != "" && o.GetNamespace() != "tabby-system" {
			t.Errorf("%s is outside tabby-system", id)
		}
	}
	for _, id := range []string{
		"Namespace//tabby-system", "CustomResourceDefinition//ippools.tabby.io",
		"ValidatingAdmissionPolicy//tabby-ippool-no-overlap", "IPPool//default-ipv4",
		"ServiceAccount/tabby-system/tabby-cni", "ServiceAccount/tabby-system/tabby-node",
		"Secret/tabby-system/tabby-cni-token", "DaemonSet/tabby-system/tabby-node",
	} {
		if !seen[id] {
			t.Errorf("tabby.yaml lacks %s", id)
		}
	}
	// kubectl applies in file order: what others depend on comes first.
	first := func(kind string) int {
		for i, k := range order {
			if k == kind {
				return i
			}
		}
		return -1
	}
	for _, dep := range [][2]string{
		{"Namespace", "ServiceAccount"}, {"CustomResourceDefinition", "ValidatingAdmissionPolicy"},
		{"CustomResourceDefinition", "IPPool"}, {"ServiceAccount", "Secret"}, {"ClusterRoleBinding", "DaemonSet"},
	} {
		if first(dep[0]) > first(dep[1]) {
			t.Errorf("%s comes after %s", dep[0], dep[1])
		}
	}
}

func TestRenderOptions(t *testing.T) {
	out, err := deploy.Render("..", deploy.RenderOptions{Image: "registry.example/tabby:v1.2.3", PodCIDR: "10.42.0.0/16"})
	if err != nil {
		t.Fatal(err)
	}
	s := string(out)
	if strings.Contains(s, deploy.DefaultImage) || strings.Count(s, "image: registry.example/tabby:v1.2.3") != 2 {
		t.Errorf("the image is not replaced in both containers")
	}
	if strings.Contains(s, "cidr: "+deploy.DefaultPodCIDR) || !strings.Contains(s, "cidr: 10.42.0.0/16") {
		t.Errorf("the pod CIDR is not replaced")
	}
	if _, err := deploy.Render("..", deploy.RenderOptions{PodCIDR: "10.42.1.0/16"}); err == nil || !strings.Contains(err.Error(), "CIDR notation") {
		t.Errorf("a CIDR with host bits: %v", err)
	}
}
