package apitest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	tabbyv1 "github.com/tabbynet/tabby/api/v1"
	"github.com/tabbynet/tabby/datastore"
	"github.com/tabbynet/tabby/internal/controlplane/clustertest"
	"github.com/tabbynet/tabby/ipam"
	"github.com/tabbynet/tabby/ipam/inspect"
)

// cli is the tabbyctl under test and what it runs against (its
// KubectlDir to run the fixes check suggests).
var cli clustertest.CLI

func TestMain(m *testing.M) { clustertest.Main(m, cli.Setup) }

const ns = "default"

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return c
}

// fresh removes every IPAM object, pool, node and pod of ns now and when
// the test ends.
func fresh(t *testing.T) *datastore.Client {
	t.Helper()
	ds := clustertest.Client(t)
	clustertest.Fresh(t, ds, ns)
	return ds
}

func mkPool(t *testing.T, ds *datastore.Client, name, cidr string, blockSize int) {
	t.Helper()
	_, err := ds.IPPools.Create(ctx(t), &tabbyv1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: tabbyv1.IPPoolSpec{CIDR: cidr, BlockSize: blockSize}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating pool %s: %v", name, err)
	}
}

func mkNode(t *testing.T, ds *datastore.Client, name string) {
	t.Helper()
	if _, err := ds.Nodes.Create(ctx(t), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating node %s: %v", name, err)
	}
}

// mkPod creates a pod bound to node, as the scheduler would leave it.
func mkPod(t *testing.T, ds *datastore.Client, name, node string) *corev1.Pod {
	t.Helper()
	p, err := ds.Pods(ns).Create(ctx(t), &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "registry.invalid/none"}},
			AutomountServiceAccountToken: new(bool)},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating pod %s: %v", name, err)
	}
	return p
}

// setPodIPs reports the pod running with ips, as the kubelet does after CNI ADD.
func setPodIPs(t *testing.T, ds *datastore.Client, name string, ips ...string) {
	t.Helper()
	c := ctx(t)
	p, err := ds.Pods(ns).Get(c, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p.Status.Phase = corev1.PodRunning
	p.Status.PodIPs = nil
	for _, ip := range ips {
		p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: ip})
	}
	p.Status.PodIP = ips[0]
	if _, err := ds.Pods(ns).UpdateStatus(c, p, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("reporting pod %s's addresses: %v", name, err)
	}
}

func deletePod(t *testing.T, ds *datastore.Client, name string) {
	t.Helper()
	zero := int64(0)
	if err := ds.Pods(ns).Delete(ctx(t), name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatalf("deleting pod %s: %v", name, err)
	}
}

func handleOf(pod string) string { return "k8s-pod-network." + pod + "-sandbox" }

// assign gives a pod an address with the real allocator, as CNI ADD does.
func assign(t *testing.T, m *ipam.IPAM, pod, node string) string {
	t.Helper()
	got, err := m.Assign(ctx(t), ipam.Request{HandleID: handleOf(pod), Node: node, Namespace: ns, Pod: pod, IPv4: true})
	if err != nil {
		t.Fatalf("assigning an address to %s: %v", pod, err)
	}
	return got[0].IP.String()
}

type result struct {
	stdout, stderr string
	code           int
}

func (r result) String() string {
	return fmt.Sprintf("exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
}

// env is the environment without anything that names an API server.
func env(extra ...string) []string {
	var out []string
	for _, e := range os.Environ() {
		k, _, _ := strings.Cut(e, "=")
		if k == "KUBECONFIG" || strings.HasPrefix(k, "KUBERNETES_SERVICE_") {
			continue
		}
		out = append(out, e)
	}
	return append(out, extra...)
}

func runWith(t *testing.T, environ []string, args ...string) result {
	t.Helper()
	cmd := exec.Command(cli.Tabbyctl, args...)
	cmd.Env = environ
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	r := result{stdout: out.String(), stderr: errb.String()}
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
	case err != nil:
		t.Fatalf("running tabbyctl %v: %v", args, err)
	}
	t.Logf("$ tabbyctl %s\n%s", strings.Join(args, " "), r)
	return r
}

// ctl runs tabbyctl --kubeconfig KUBECONFIG ARGS.
func ctl(t *testing.T, args ...string) result {
	t.Helper()
	return runWith(t, env(), append([]string{"--kubeconfig", cli.Kubeconfig}, args...)...)
}

func ctlJSON[T any](t *testing.T, wantCode int, args ...string) T {
	t.Helper()
	r := ctl(t, append(args, "-o", "json")...)
	if r.code != wantCode {
		t.Fatalf("exit status %d, want %d:\n%s", r.code, wantCode, r)
	}
	var v T
	if err := json.Unmarshal([]byte(r.stdout), &v); err != nil {
		t.Fatalf("stdout is not the documented JSON: %v\n%s", err, r.stdout)
	}
	return v
}

func findings(rep inspect.CheckReport, kind inspect.Kind) []inspect.Finding {
	var out []inspect.Finding
	for _, f := range rep.Findings {
		if f.Kind == kind {
			out = append(out, f)
		}
	}
	return out
}

// blockHolds reads what the block of ip holds for it ("" when free).
func blockHolds(t *testing.T, ds *datastore.Client, ip string) string {
	t.Helper()
	a := netip.MustParseAddr(ip)
	pfx, _ := a.Prefix(26)
	b, err := ds.IPAMBlocks.Get(ctx(t), ipam.BlockName(pfx), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ord := int(a.As4()[3] - pfx.Addr().As4()[3])
	if idx := b.Spec.Allocations[ord]; idx >= 0 {
		return b.Spec.Attributes[idx].HandleID
	}
	return ""
}

func handleExists(t *testing.T, ds *datastore.Client, handle string) bool {
	t.Helper()
	_, err := ds.IPAMHandles.Get(ctx(t), ipam.HandleObjectName(handle), metav1.GetOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	return err == nil
}

// TestShowCheckRelease: pods get addresses from the real allocator; check
// is clean; a leak, a double booking and a pod between ADD and its status
// update are made by hand; check reports them with what to do and exits 1;
// show --ip tells who holds what; release refuses a live pod's address
// (and a starting pod's) without --force, frees the leaked one and its
// handle with compare-and-swap, and check is clean again.
func TestShowCheckRelease(t *testing.T) {
	ds := fresh(t)
	mkPool(t, ds, "ctl", "10.61.0.0/16", 26)
	mkNode(t, ds, "node-a")
	mkNode(t, ds, "node-b")
	m := ipam.New(ds)
	ips := map[string]string{}
	for _, p := range []struct{ name, node string }{{"web-1", "node-a"}, {"web-2", "node-a"}, {"web-3", "node-b"}} {
		mkPod(t, ds, p.name, p.node)
		ips[p.name] = assign(t, m, p.name, p.node)
		setPodIPs(t, ds, p.name, ips[p.name])
	}

	r := ctl(t, "ipam", "check")
	if r.code != 0 || !strings.HasPrefix(r.stdout, "ipam check: no problems (checked 1 pool, 2 blocks, 3 allocations, 3 handles, 2 affinities, 3 pods, 2 nodes).") {
		t.Fatalf("a clean cluster:\n%s", r)
	}
	clean := ctlJSON[inspect.CheckReport](t, 0, "ipam", "check")
	if !clean.OK || len(clean.Findings) != 0 || clean.Revision == "" {
		t.Fatalf("clean check JSON (a consistent snapshot has a revision): %+v", clean)
	}

	r = ctl(t, "ipam", "show")
	for _, want := range []string{
		"POOL  CIDR          BLOCK SIZE  BLOCKS     USED  FREE IN BLOCKS  FREE\nctl   10.61.0.0/16  /26         2 of 1024  3     125             65533\n",
		"BLOCK             POOL  NODE    AFFINITY   USED  FREE  BORROWED  NOTES\n",
		"Total: 1 pool, 2 blocks, 3 addresses used, 125 free in the blocks.",
	} {
		if r.code != 0 || !strings.Contains(r.stdout, want) {
			t.Fatalf("show lacks %q:\n%s", want, r)
		}
	}
	show := ctlJSON[inspect.ShowReport](t, 0, "ipam", "show")
	if len(show.Pools) != 1 || show.Pools[0].Used != 3 || len(show.Pools[0].Blocks) != 2 || show.Totals.Used != 3 {
		t.Fatalf("show JSON: %+v", show)
	}
	nodes := map[string]inspect.BlockUsage{}
	for _, b := range show.Pools[0].Blocks {
		nodes[b.Node] = b
		if b.Affinity != string(tabbyv1.AffinityConfirmed) || b.Size != 64 || b.Used+b.Free != 64 {
			t.Errorf("block %+v", b)
		}
	}
	if nodes["node-a"].Used != 2 || nodes["node-b"].Used != 1 {
		t.Errorf("blocks by node: %+v", nodes)
	}

	// A leak: the pod went away and its CNI DEL never ran.
	mkPod(t, ds, "gone", "node-a")
	leak := assign(t, m, "gone", "node-a")
	setPodIPs(t, ds, "gone", leak)
	deletePod(t, ds, "gone")
	// A double booking made by hand: a pod whose status claims web-1's address.
	mkPod(t, ds, "dup", "node-b")
	setPodIPs(t, ds, "dup", ips["web-1"])
	// A pod between CNI ADD and its status update: pending, not leaked.
	mkPod(t, ds, "starting", "node-b")
	starting := assign(t, m, "starting", "node-b")

	r = ctl(t, "ipam", "check")
	if r.code != 1 || !strings.Contains(r.stderr, "tabbyctl: ipam check found 2 problems") {
		t.Fatalf("check with problems must exit 1:\n%s", r)
	}
	for _, want := range []string{
		"ipam check: 2 problems, 1 note",
		"problem   double-booked  " + ips["web-1"] + "  kubectl delete pod -n default dup (each restarts with an address of its own)",
		"problem   leaked         " + leak + "  tabbyctl ipam release --ip " + leak,
		"note      pending        " + starting,
		"pod default/gone does not exist",
		"pod default/starting is live and has no address in its status yet",
	} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("check output lacks %q", want)
		}
	}
	rep := ctlJSON[inspect.CheckReport](t, 1, "ipam", "check")
	if rep.OK || rep.Problems != 2 || rep.Notes != 1 {
		t.Fatalf("check JSON: %+v", rep)
	}
	if l := findings(rep, inspect.Leaked); len(l) != 1 || l[0].IP != leak || l[0].Command != "tabbyctl ipam release --ip "+leak ||
		l[0].Handle != handleOf("gone") || len(l[0].Pods) != 1 || l[0].Pods[0] != "default/gone" {
		t.Errorf("leaked: %+v", l)
	}
	if d := findings(rep, inspect.DoubleBooked); len(d) != 1 || d[0].IP != ips["web-1"] || d[0].Command != "kubectl delete pod -n default dup" {
		t.Errorf("double-booked: %+v", d)
	}
	if p := findings(rep, inspect.Pending); len(p) != 1 || p[0].IP != starting || p[0].Severity != inspect.Note {
		t.Errorf("pending: %+v", p)
	}

	// show --ip: who holds what.
	ipr := ctlJSON[inspect.IPReport](t, 0, "ipam", "show", "--ip", leak)
	if !ipr.Allocated || ipr.Pool != "ctl" || len(ipr.Holders) != 1 || ipr.Holders[0].State != inspect.StateMissing || ipr.Holders[0].InUse ||
		ipr.Holders[0].Pod != "gone" || ipr.Holders[0].Node != "node-a" || ipr.Holders[0].HandleObject == "" || len(ipr.Findings) != 1 {
		t.Errorf("show --ip of the leak: %+v", ipr)
	}
	ipr = ctlJSON[inspect.IPReport](t, 0, "ipam", "show", "--ip", ips["web-1"])
	if len(ipr.Holders) != 1 || ipr.Holders[0].State != inspect.StateRunning || !ipr.Holders[0].InUse || len(ipr.UsedBy) != 2 {
		t.Errorf("show --ip of the double-booked address: %+v", ipr)
	}
	r = ctl(t, "ipam", "show", "--ip", ips["web-3"])
	for _, want := range []string{"POD                 default/web-3", "STATE               running: pod default/web-3 is live and has this address",
		"LIVE PODS USING IT  default/web-3 on node-b"} {
		if r.code != 0 || !strings.Contains(r.stdout, want) {
			t.Errorf("show --ip lacks %q:\n%s", want, r)
		}
	}

	// release refuses what a live pod holds, and what a starting pod is about to have.
	for _, ip := range []string{ips["web-1"], starting} {
		r = ctl(t, "ipam", "release", "--ip", ip)
		if r.code != 1 || !strings.Contains(r.stderr, "refusing to release "+ip) || !strings.Contains(r.stderr, "pass --force") {
			t.Fatalf("release of a live pod's address must be refused:\n%s", r)
		}
	}
	if blockHolds(t, ds, ips["web-1"]) != handleOf("web-1") || blockHolds(t, ds, starting) != handleOf("starting") {
		t.Fatal("a refused release changed the block")
	}
	// It frees the leak, and the handle with it.
	r = ctl(t, "ipam", "release", "--ip", leak)
	leakBlock, _ := netip.MustParseAddr(leak).Prefix(26)
	if r.code != 0 || r.stdout != fmt.Sprintf("released %s (was pod default/gone, handle %s, block %s)\n", leak, handleOf("gone"), leakBlock) {
		t.Fatalf("release of the leak:\n%s", r)
	}
	if h := blockHolds(t, ds, leak); h != "" || handleExists(t, ds, handleOf("gone")) {
		t.Fatalf("after release the block holds %q for %s, handle exists: %v", h, leak, handleExists(t, ds, handleOf("gone")))
	}
	// Releasing it again is no error: it is free.
	if r = ctl(t, "ipam", "release", "--ip", leak); r.code != 0 || !strings.Contains(r.stdout, "is not allocated: nothing to release") {
		t.Fatalf("second release:\n%s", r)
	}

	// The double booking resolved and the pod started: clean again.
	deletePod(t, ds, "dup")
	setPodIPs(t, ds, "starting", starting)
	if r = ctl(t, "ipam", "check"); r.code != 0 {
		t.Fatalf("check after the repairs:\n%s", r)
	}

	// --force releases a live pod's address; then that pod uses an address
	// IPAM has free, which check reports.
	res := ctlJSON[[]inspect.ReleaseResult](t, 0, "ipam", "release", "--ip", ips["web-3"], "--force")
	if len(res) != 1 || !res[0].Released || !res[0].Forced || res[0].Holder == nil || res[0].Holder.Pod != "web-3" || !strings.Contains(res[0].Refusal, "web-3") {
		t.Fatalf("forced release: %+v", res)
	}
	if blockHolds(t, ds, ips["web-3"]) != "" || handleExists(t, ds, handleOf("web-3")) {
		t.Fatal("the forced release did not free the address and its handle")
	}
	rep = ctlJSON[inspect.CheckReport](t, 1, "ipam", "check")
	if u := findings(rep, inspect.UnallocatedInUse); rep.Problems != 1 || len(u) != 1 || u[0].IP != ips["web-3"] || u[0].Command != "kubectl delete pod -n default web-3" {
		t.Fatalf("after the forced release: %+v", rep)
	}
}

// TestBadInput: bad flags and addresses, no kubeconfig, an API server that
// does not answer: exit 2 (the command could not do its work) and an error
// that says what to fix; an address outside the pools: exit 1 (release
// looked and refused it).
func TestBadInput(t *testing.T) {
	ds := fresh(t)
	mkPool(t, ds, "ctl", "10.62.0.0/16", 26)
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"ipam", "show", "-o", "xml"}, 2, "invalid argument \"xml\" for \"-o, --output\" flag: must be one of table, wide, json, yaml"},
		{[]string{"ipam", "show", "--ip", "10.62.0.300"}, 2, "--ip \"10.62.0.300\" is not an IP address"},
		{[]string{"ipam", "release"}, 2, "name the address to release with --ip"},
		{[]string{"ipam", "release", "--ip", "192.0.2.1"}, 1, "192.0.2.1 is in no IPPool, so tabby did not allocate it"},
	} {
		r := ctl(t, tc.args...)
		if r.code != tc.code || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("tabbyctl %v: want exit %d and %q:\n%s", tc.args, tc.code, tc.want, r)
		}
	}
	// The API server comes from $KUBECONFIG when --kubeconfig is not given.
	if r := runWith(t, env("KUBECONFIG="+cli.Kubeconfig), "ipam", "show"); r.code != 0 || !strings.Contains(r.stdout, "10.62.0.0/16") {
		t.Errorf("with $KUBECONFIG:\n%s", r)
	}
	if r := runWith(t, env("HOME="+t.TempDir()), "ipam", "check"); r.code != 2 || !strings.Contains(r.stderr, "no kubeconfig given: pass --kubeconfig") {
		t.Errorf("without a kubeconfig:\n%s", r)
	}
	// An API server that does not answer.
	dead := filepath.Join(t.TempDir(), "dead.kubeconfig")
	if err := clustertest.Cluster(t).WriteKubeconfig(dead, "https://127.0.0.1:1"); err != nil {
		t.Fatal(err)
	}
	if r := runWith(t, env(), "--kubeconfig", dead, "ipam", "check", "--timeout", "5s"); r.code != 2 || !strings.Contains(r.stderr, "cannot be reached") {
		t.Errorf("with an API server that does not answer:\n%s", r)
	}
}

// TestFollowTheFixes: every kind of damage check knows about object by
// object (a leak, a node deleted with its pods, a handle that over-counts,
// a stale handle, a block without its BlockAffinity, an affinity without
// its block, a double booking) is made on the real API server; following
// the commands check prints, round after round, leaves check clean.
func TestFollowTheFixes(t *testing.T) {
	ds := fresh(t)
	c := ctx(t)
	mkPool(t, ds, "ctl", "10.63.0.0/16", 26)
	for _, n := range []string{"node-a", "node-b", "node-c"} {
		mkNode(t, ds, n)
	}
	m := ipam.New(ds)
	ips := map[string]string{}
	for _, p := range []struct{ name, node string }{{"a1", "node-a"}, {"a2", "node-a"}, {"b1", "node-b"}, {"c1", "node-c"}} {
		mkPod(t, ds, p.name, p.node)
		ips[p.name] = assign(t, m, p.name, p.node)
		setPodIPs(t, ds, p.name, ips[p.name])
	}
	if r := ctl(t, "ipam", "check"); r.code != 0 {
		t.Fatalf("clean to start with:\n%s", r)
	}
	// A leak.
	deletePod(t, ds, "a2")
	// Node b deleted with its pod; its block and allocation stay behind.
	deletePod(t, ds, "b1")
	if err := ds.Nodes.Delete(c, "node-b", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// a1's handle over-counts.
	h, err := ds.IPAMHandles.Get(c, ipam.HandleObjectName(handleOf("a1")), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for k := range h.Spec.Block {
		h.Spec.Block[k]++
	}
	if _, err := ds.IPAMHandles.Update(c, h, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// A handle recording addresses nobody holds.
	if _, err := ds.IPAMHandles.Create(c, &tabbyv1.IPAMHandle{ObjectMeta: metav1.ObjectMeta{Name: "k8s-pod-network.stale"},
		Spec: tabbyv1.IPAMHandleSpec{HandleID: "k8s-pod-network.stale", Block: map[string]int{"10.63.200.0/26": 1}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// node-c's block loses its BlockAffinity.
	affs, err := ds.BlockAffinities.List(c, metav1.ListOptions{LabelSelector: tabbyv1.LabelNode + "=node-c"})
	if err != nil || len(affs.Items) != 1 {
		t.Fatalf("node-c's affinities: %v %v", affs, err)
	}
	if err := ds.BlockAffinities.Delete(c, affs.Items[0].Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// An affinity whose block never came.
	if _, err := ds.BlockAffinities.Create(c, &tabbyv1.BlockAffinity{ObjectMeta: metav1.ObjectMeta{Name: "node-a-10-63-250-0-26"},
		Spec: tabbyv1.BlockAffinitySpec{Node: "node-a", CIDR: "10.63.250.0/26", State: tabbyv1.AffinityConfirmed}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// A double booking: c2 reports c1's address.
	mkPod(t, ds, "c2", "node-c")
	setPodIPs(t, ds, "c2", ips["c1"])

	rep := ctlJSON[inspect.CheckReport](t, 1, "ipam", "check")
	kinds := map[inspect.Kind]int{}
	for _, f := range rep.Findings {
		kinds[f.Kind]++
	}
	want := map[inspect.Kind]int{inspect.Leaked: 1, inspect.DeletedNode: 2, inspect.HandleMismatch: 2,
		inspect.BlockWithoutAffinity: 1, inspect.AffinityWithoutBlock: 1, inspect.DoubleBooked: 1}
	if fmt.Sprint(kinds) != fmt.Sprint(want) {
		t.Fatalf("findings by kind %v, want %v:\n%+v", kinds, want, rep.Findings)
	}

	// Follow the advice as a user would, with tabbyctl and kubectl on PATH.
	shellEnv := env("KUBECONFIG="+cli.Kubeconfig, "PATH="+filepath.Dir(cli.Tabbyctl)+":"+cli.KubectlDir+":"+os.Getenv("PATH"))
	for round := 1; ; round++ {
		r := ctl(t, "ipam", "check", "-o", "json")
		rep = inspect.CheckReport{}
		if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
			t.Fatalf("check JSON: %v\n%s", err, r)
		}
		if (r.code == 0) != rep.OK {
			t.Fatalf("exit status %d with ok=%v", r.code, rep.OK)
		}
		if rep.OK {
			break
		}
		if round > 3 {
			t.Fatalf("still not clean after %d rounds of fixes: %+v", round-1, rep.Findings)
		}
		ran := 0
		for _, f := range rep.Findings {
			if f.Severity != inspect.Problem || f.Command == "" {
				continue
			}
			command := f.Command
			if strings.HasPrefix(command, "kubectl delete pod ") {
				command += " --wait=false" // no kubelet here finishes the deletion
			}
			cmd := exec.Command("sh", "-c", command)
			cmd.Env = shellEnv
			out, err := cmd.CombinedOutput()
			t.Logf("round %d: $ %s\n%s", round, command, out)
			if err != nil {
				t.Fatalf("the fix for %s %s failed: %v\n%s", f.Kind, f.IP+f.Object, err, out)
			}
			ran++
		}
		if ran == 0 {
			t.Fatalf("problems left and no command to fix them: %+v", rep.Findings)
		}
	}
	// What is left are notes: c2 terminates, its stale status notwithstanding.
	if len(rep.Findings) != 1 || rep.Findings[0].Kind != inspect.DoubleBooked || rep.Findings[0].Severity != inspect.Note {
		t.Errorf("left after the fixes: %+v", rep.Findings)
	}
	// The repairs are real: the recreated affinity is the one IPAM would
	// make, the block of the deleted node is gone, the handles agree.
	if _, err := ds.BlockAffinities.Get(c, affs.Items[0].Name, metav1.GetOptions{}); err != nil {
		t.Errorf("node-c's BlockAffinity was not recreated under IPAM's name %s: %v", affs.Items[0].Name, err)
	}
	blocks, err := ds.IPAMBlocks.List(c, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range blocks.Items {
		if b.Spec.Affinity == "host:node-b" {
			t.Errorf("node-b's block %s is still there", b.Spec.CIDR)
		}
	}
	if got, err := m.HandleIPs(c, handleOf("a1")); err != nil || len(got) != 1 || got[0].String() != ips["a1"] {
		t.Errorf("a1's handle holds %v (%v)", got, err)
	}
	// And a new pod on node-a still gets an address.
	if _, err := m.Assign(c, ipam.Request{HandleID: "k8s-pod-network.after", Node: "node-a", IPv4: true}); err != nil {
		t.Errorf("assigning after the repairs: %v", err)
	}
}

// TestReleaseIsCompareAndSwap: a release planned on a snapshot in which
// the address was leaked does not free it once it was released and handed
// to a new pod meanwhile.
func TestReleaseIsCompareAndSwap(t *testing.T) {
	ds := fresh(t)
	c := ctx(t)
	mkPool(t, ds, "ctl", "10.64.0.0/16", 26)
	mkNode(t, ds, "node-a")
	m := ipam.New(ds)
	leak := assign(t, m, "old", "node-a") // the pod never existed: leaked
	s, err := inspect.Load(c, ds)
	if err != nil {
		t.Fatal(err)
	}
	if s.Revision == "" {
		t.Error("the snapshot was not one consistent cut")
	}
	plan, err := inspect.PlanRelease(s, netip.MustParseAddr(leak), inspect.Options{})
	if err != nil || !plan.Allocated || plan.Refusal != "" {
		t.Fatalf("plan %+v, %v", plan, err)
	}
	// Meanwhile: the old handle is released and the address given to a new pod.
	if err := m.ReleaseHandle(c, handleOf("old"), "node-a"); err != nil {
		t.Fatal(err)
	}
	mkPod(t, ds, "new", "node-a")
	if _, err := m.Assign(c, ipam.Request{HandleID: handleOf("new"), Node: "node-a", Namespace: ns, Pod: "new", IPs: []net.IP{net.ParseIP(leak)}}); err != nil {
		t.Fatal(err)
	}
	err = inspect.Release(c, ds, plan)
	if err == nil || !strings.Contains(err.Error(), "changed since it was read") {
		t.Fatalf("the stale release: %v", err)
	}
	if h := blockHolds(t, ds, leak); h != handleOf("new") || !handleExists(t, ds, handleOf("new")) {
		t.Fatalf("the stale release freed the new pod's address: block holds %q", h)
	}
	// The same address reused under the same handle (a new sequence number)
	// is not freed either.
	if err := m.ReleaseHandle(c, handleOf("new"), "node-a"); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Assign(c, ipam.Request{HandleID: handleOf("old"), Node: "node-a", IPs: []net.IP{net.ParseIP(leak)}}); err != nil {
		t.Fatal(err)
	}
	if err := inspect.Release(c, ds, plan); err == nil {
		t.Fatal("a release naming an old sequence number freed the address")
	}
	if h := blockHolds(t, ds, leak); h != handleOf("old") {
		t.Fatalf("block holds %q", h)
	}
}
