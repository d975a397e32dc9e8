package lab

import (
	"bytes"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

func TestFill(t *testing.T) {
	v := addonValues{"A": "one", "B": "two"}
	for _, tc := range []struct {
		name, in, want, err string
	}{
		{name: "values", in: "a: {{.A}}\nb: {{ .B }}/{{.A}}\n", want: "a: one\nb: two/one\n"},
		{name: "nothing to fill", in: "a: 1\n", want: "a: 1\n"},
		{name: "a value it lacks", in: "a: {{.A}}\nc: {{.C}}\nd: {{.D}}\n", err: "rendering m.yaml: no value for C, D"},
		{name: "not a placeholder", in: "a: {{.A}}\n{{- if .B}}\nb: 1\n{{- end}}\n", err: "rendering m.yaml: line 2 has a {{ that is not a {{.Name}} placeholder"},
		{name: "over two lines", in: "a: {{\n.A}}\n", err: "line 1 has a {{"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := fill("m.yaml", []byte(tc.in), v)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one with %q", err, tc.err)
				}
				return
			}
			if err != nil || string(got) != tc.want {
				t.Fatalf("got %q, %v; want %q", got, err, tc.want)
			}
		})
	}
	// A value is not read as a placeholder.
	got, err := fill("m.yaml", []byte("a: {{.A}}\n"), addonValues{"A": "{{.B}}"})
	if err != nil || string(got) != "a: {{.B}}\n" {
		t.Fatalf("got %q, %v", got, err)
	}
}

// TestRenderAddons renders the add-ons as a single-stack and a dual-stack
// lab does: every document parses, and kube-dns asks for the lab's
// families.
func TestRenderAddons(t *testing.T) {
	for _, policy := range []string{"SingleStack", "PreferDualStack"} {
		v := addonValues{"APIServer": "https://10.0.0.1:6443", "ClusterCIDR": DefaultPodCIDR, "ClusterDomain": ClusterDomain,
			"ClusterDNS": ClusterDNS, "IPFamilyPolicy": policy, "Image": CoreDNSImage}
		var services int
		for _, file := range []string{"kube-proxy.yaml", "coredns.yaml"} {
			out, err := renderAddon(file, v)
			if err != nil {
				t.Fatal(err)
			}
			for _, doc := range bytes.Split(out, []byte("\n---\n")) {
				var obj struct {
					Kind string
					Spec struct{ IPFamilyPolicy string }
				}
				if err := yaml.Unmarshal(doc, &obj); err != nil {
					t.Fatalf("%s: %v\n%s", file, err, doc)
				}
				if obj.Kind == "Service" {
					services++
					if obj.Spec.IPFamilyPolicy != policy {
						t.Errorf("%s: the Service asks for %q, want %q", file, obj.Spec.IPFamilyPolicy, policy)
					}
				}
			}
		}
		if services != 1 {
			t.Errorf("%d Services, want kube-dns", services)
		}
	}
}
