package netpol

import (
	"context"
	"fmt"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tabbynet/tabby/daemon/deniedlog"
	"github.com/tabbynet/tabby/daemon/nflog"
	"github.com/tabbynet/tabby/policy"
)

func deniedWorld(t *testing.T, buffer int) (*Denied, *Metrics) {
	t.Helper()
	met, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	d := NewDenied(DeniedConfig{Node: "n1", Buffer: buffer, Metrics: met})
	ep := func(name, ip string) policy.Endpoint {
		return policy.Endpoint{Pod: &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: name}}, IPs: []netip.Addr{netip.MustParseAddr(ip)}}
	}
	d.Update(&policy.Input{Endpoints: []policy.Endpoint{ep("web", "10.0.0.1"), ep("db", "10.0.0.2")}}, &policy.Ruleset{Denials: []policy.Denial{
		{Prefix: "tabby:I-AAAA", Chain: "TABBY-NP-I-AAAA", Direction: "ingress", Policies: []string{"shop/deny"}},
	}}, false)
	return d, met
}

func packet(src, dst string, dport uint16) nflog.Packet {
	return nflog.Packet{Prefix: "tabby:I-AAAA", Time: time.Now(), Src: netip.MustParseAddr(src), Dst: netip.MustParseAddr(dst),
		Proto: nflog.ProtoTCP, SrcPort: 40000, DstPort: dport}
}

// TestDeniedRing: the buffer keeps the last records, oldest first, filters
// by pod, and a follower gets new ones as they come; other programs'
// prefixes are ignored; bad queries are refused with what to fix.
func TestDeniedRing(t *testing.T) {
	d, met := deniedWorld(t, 3)
	srv := httptest.NewServer(d)
	defer srv.Close()
	ep := strings.TrimPrefix(srv.URL, "http://")
	for i := range 5 {
		d.Packet(packet("10.0.0.1", "10.0.0.2", uint16(i)))
	}
	d.Packet(nflog.Packet{Prefix: "other-program"})
	d.Packet(packet("192.0.2.9", "10.0.0.9", 99)) // neither a known pod
	read := func(pod string) []deniedlog.Record {
		var out []deniedlog.Record
		if err := deniedlog.Read(context.Background(), nil, ep, pod, false, func(r deniedlog.Record) error { out = append(out, r); return nil }); err != nil {
			t.Fatal(err)
		}
		return out
	}
	all := read("")
	var ports []string
	for _, r := range all {
		ports = append(ports, fmt.Sprint(r.Dst.Port))
	}
	if strings.Join(ports, ",") != "3,4,99" {
		t.Errorf("buffer of 3 holds ports %v, want 3,4,99", ports)
	}
	if r := all[0]; r.Src.Pod != "shop/web" || r.Dst.Pod != "shop/db" || r.Reason != "default deny of policy shop/deny (no rule of it allows this ingress)" {
		t.Errorf("record %+v", r)
	}
	if got := read("shop/web"); len(got) != 2 {
		t.Errorf("--pod shop/web: %d records, want 2", len(got))
	}
	if got := counterValue(t, met.denied.packets.WithLabelValues("shop", "deny", "ingress")); got != 5 {
		t.Errorf("counter of shop/deny = %v, want 5", got)
	}
	for _, bad := range []string{"?pod=web", "?follow=maybe"} {
		resp, err := srv.Client().Get(srv.URL + deniedlog.Path + bad)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 400 {
			t.Errorf("GET %s: %s, want 400", bad, resp.Status)
		}
	}

	// Following: the buffer, then each new record of the pod.
	ctx, cancel := context.WithCancel(context.Background())
	got := make(chan deniedlog.Record, 10)
	done := make(chan error, 1)
	go func() {
		done <- deniedlog.Read(ctx, nil, ep, "shop/db", true, func(r deniedlog.Record) error { got <- r; return nil })
	}()
	for range 2 { // the buffer's two of shop/db
		<-got
	}
	time.Sleep(50 * time.Millisecond)
	d.Packet(packet("10.0.0.1", "10.0.0.2", 7))
	select {
	case r := <-got:
		if r.Dst.Port != 7 {
			t.Errorf("followed %+v, want port 7", r)
		}
	case <-time.After(2 * time.Second):
		t.Error("the follower got nothing new")
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Read after cancel: %v", err)
	}
}

// TestDeniedSeriesBound: the counter's label sets stop growing at
// maxDeniedSeries; the rest count as "_other".
func TestDeniedSeriesBound(t *testing.T) {
	d, met := deniedWorld(t, 10)
	var denials []policy.Denial
	for i := range maxDeniedSeries + 10 {
		denials = append(denials, policy.Denial{Prefix: fmt.Sprintf("tabby:I-%d", i), Direction: "ingress", Policies: []string{fmt.Sprintf("shop/p%d", i)}})
	}
	d.Update(&policy.Input{Endpoints: []policy.Endpoint{{Pod: &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "db"}},
		IPs: []netip.Addr{netip.MustParseAddr("10.0.0.2")}}}}, &policy.Ruleset{Denials: denials}, false)
	for i := range denials {
		p := packet("10.0.0.1", "10.0.0.2", 80)
		p.Prefix = denials[i].Prefix
		d.Packet(p)
	}
	if n := seriesCount(met.denied.packets); n != maxDeniedSeries+1 {
		t.Errorf("%d series, want %d and _other", n, maxDeniedSeries)
	}
	if got := counterValue(t, met.denied.packets.WithLabelValues("shop", "_other", "ingress")); got != 10 {
		t.Errorf("_other = %v, want 10", got)
	}
}

func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

func seriesCount(c prometheus.Collector) int {
	ch := make(chan prometheus.Metric, 1024)
	go func() { c.Collect(ch); close(ch) }()
	n := 0
	for range ch {
		n++
	}
	return n
}

// TestDeniedFollowOutlivesWriteTimeout: tabbyd's server bounds every
// answer's write time; a follower's answer is exempt, so it still gets
// records after that time.
func TestDeniedFollowOutlivesWriteTimeout(t *testing.T) {
	d, _ := deniedWorld(t, 3)
	srv := httptest.NewUnstartedServer(d)
	srv.Config.WriteTimeout = 300 * time.Millisecond
	srv.Start()
	defer srv.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	got := make(chan deniedlog.Record, 1)
	done := make(chan error, 1)
	go func() {
		done <- deniedlog.Read(ctx, nil, strings.TrimPrefix(srv.URL, "http://"), "", true, func(r deniedlog.Record) error { got <- r; return nil })
	}()
	time.Sleep(time.Second)
	d.Packet(packet("10.0.0.1", "10.0.0.2", 8080))
	select {
	case r := <-got:
		if r.Dst.Port != 8080 {
			t.Errorf("followed %+v", r)
		}
	case err := <-done:
		t.Fatalf("the follow ended after the server's write timeout: %v", err)
	case <-time.After(3 * time.Second):
		t.Fatal("nothing followed past the server's write timeout")
	}
}
