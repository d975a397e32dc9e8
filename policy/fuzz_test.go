package policy

import (
	"net/netip"
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func (c *chooser) str() string {
	n := c.n(17)
	if c.r != nil || len(c.b) < n {
		return "tab"
	}
	s := string(c.b[:n])
	c.b = c.b[n:]
	return s
}

// FuzzCompile: no input panics Compile; its output always keeps the name
// limits and prefixes, refers only to chains and sets it lists, in their
// own family, and is the same when compiled twice. When the first byte is
// even the input is valid and every connection is also checked against
// the reference semantics.
//
//	go test -fuzz FuzzCompile -fuzztime 60s ./policy
func FuzzCompile(f *testing.F) {
	f.Add([]byte{0})
	f.Add([]byte{1})
	f.Add([]byte{0, 3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4, 6, 2, 6, 4, 3, 3, 8, 3, 2, 7, 9, 5})
	f.Add([]byte{1, 2, 7, 1, 8, 2, 8, 1, 8, 2, 8, 4, 5, 9, 0, 4, 5, 2, 3, 5, 3, 6, 0, 2, 8, 7, 4, 7, 1, 3, 5, 2, 6, 6, 2, 4, 9, 7, 7, 5, 7})
	f.Add([]byte("\x01tab+ eth0 \x00\xff\xfe 10.0.0.0/33 except ::ffff:1.2.3.4 \"quoted\" name-with-dash"))
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) == 0 {
			return
		}
		valid := data[0]%2 == 0
		c := &chooser{b: data[1:]}
		g := &gen{c: c, valid: valid}
		w := g.world()
		if valid {
			compare(t, w)
			return
		}
		in := w.input(pick(c, "n1", "n2", ""))
		// Garbage the generator does not make: odd interface names and
		// prefixes, missing objects, addresses of no use.
		switch c.n(4) {
		case 0:
			in.HostVethPrefix = c.str()
		case 1:
			in.DenyUnlisted = true
		}
		for i := range in.Endpoints {
			switch c.n(8) {
			case 0:
				in.Endpoints[i].HostIface = c.str()
			case 1:
				in.Endpoints[i].IPs = append(in.Endpoints[i].IPs, netip.Addr{}, netip.MustParseAddr("::ffff:10.0.0.10"), netip.MustParseAddr("fe80::1%eth0"))
			case 2:
				in.Endpoints[i].Pod.Labels = map[string]string{c.str(): c.str()}
			case 3:
				in.Endpoints[i].Pod.Spec.InitContainers = []corev1.Container{{Ports: []corev1.ContainerPort{{Name: c.str(), ContainerPort: int32(c.n(70000)), Protocol: corev1.Protocol(c.str())}}}}
			}
		}
		switch c.n(5) {
		case 0:
			in.Policies = append(append(in.Policies, nil), in.Policies...) // nils and duplicates
		case 1:
			in.Namespaces = append(in.Namespaces, nil, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "x", Labels: map[string]string{c.str(): c.str()}}})
		case 2:
			in.Endpoints = append(in.Endpoints, Endpoint{}, Endpoint{Pod: &corev1.Pod{}, HostIface: c.str()})
		}
		rs := Compile(in)
		if err := rulesetInvariants(rs); err != nil {
			t.Fatalf("%v\ninput: %s", err, describe(w))
		}
		if again := Compile(in); !reflect.DeepEqual(rs, again) {
			t.Fatal("two compiles of one input differ")
		}
	})
}
